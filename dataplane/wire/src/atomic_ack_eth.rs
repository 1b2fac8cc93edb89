//! Atomic Acknowledge Extended Transport Header (8 bytes): the original remote value.

use super::Result;

/// Header length.
pub const HEADER_LEN: usize = 8;

super::header_view!(Header, HEADER_LEN, "A zero-copy view of an AtomicAckETH.");

impl<T: AsRef<[u8]>> Header<T> {
    #[inline]
    /// The value at the remote address before the atomic operation.
    pub fn orig(&self) -> u64 {
        super::be_u64(self.buffer.as_ref(), 0)
    }
}

/// A parsed AtomicAckETH.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Repr {
    /// Original remote value.
    pub orig: u64,
}

impl Repr {
    #[inline]
    /// Parses an AtomicAckETH.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(h: &Header<&T>) -> Result<Repr> {
        Ok(Repr { orig: h.orig() })
    }
    #[inline]
    /// Header length.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    #[inline]
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, h: &mut Header<&mut T>) {
        h.buffer.as_mut()[0..8].copy_from_slice(&self.orig.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let b = [0, 0, 0, 0, 0, 0, 0x01, 0x02];
        let r = Repr::parse(&Header::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.orig, 0x102);
        let mut out = [0u8; 8];
        r.emit(&mut Header::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
    }
}
