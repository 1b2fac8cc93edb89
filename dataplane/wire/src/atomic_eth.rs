//! Atomic Extended Transport Header (28 bytes): VA, R_Key, swap-or-add data, compare data.
//! Follows the BTH of CmpSwap and FetchAdd.

use super::Result;

/// Header length.
pub const HEADER_LEN: usize = 28;

super::header_view!(Header, HEADER_LEN, "A zero-copy view of an AtomicETH.");

impl<T: AsRef<[u8]>> Header<T> {
    #[inline]
    /// Remote virtual address (8-byte aligned).
    pub fn va(&self) -> u64 {
        super::be_u64(self.buffer.as_ref(), 0)
    }
    #[inline]
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        super::be_u32(self.buffer.as_ref(), 8)
    }
    #[inline]
    /// Swap value (CmpSwap) or addend (FetchAdd).
    pub fn swap_add(&self) -> u64 {
        super::be_u64(self.buffer.as_ref(), 12)
    }
    #[inline]
    /// Compare value (CmpSwap).
    pub fn compare(&self) -> u64 {
        super::be_u64(self.buffer.as_ref(), 20)
    }
}

/// A parsed AtomicETH.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Repr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap value or addend.
    pub swap_add: u64,
    /// Compare value.
    pub compare: u64,
}

impl Repr {
    #[inline]
    /// Parses an AtomicETH.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(h: &Header<&T>) -> Result<Repr> {
        Ok(Repr {
            va: h.va(),
            rkey: h.rkey(),
            swap_add: h.swap_add(),
            compare: h.compare(),
        })
    }
    #[inline]
    /// Header length.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    #[inline]
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, h: &mut Header<&mut T>) {
        let b = h.buffer.as_mut();
        b[0..8].copy_from_slice(&self.va.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..20].copy_from_slice(&self.swap_add.to_be_bytes());
        b[20..28].copy_from_slice(&self.compare.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let r = Repr {
            va: 0x1000,
            rkey: 0xabcd,
            swap_add: 7,
            compare: u64::MAX,
        };
        let mut b = [0u8; 28];
        r.emit(&mut Header::new_unchecked(&mut b[..]));
        assert_eq!(&b[8..12], &[0, 0, 0xab, 0xcd]);
        assert_eq!(
            Repr::parse(&Header::new_checked(&b[..]).unwrap()).unwrap(),
            r
        );
        assert!(Header::new_checked(&b[..27]).is_err());
    }
}
