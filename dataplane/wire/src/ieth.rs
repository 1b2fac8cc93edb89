//! Invalidate Extended Transport Header (4 bytes), after SEND Last/Only with Invalidate.

use super::Result;

/// Header length.
pub const HEADER_LEN: usize = 4;

super::header_view!(Header, HEADER_LEN, "A zero-copy view of an IETH.");

impl<T: AsRef<[u8]>> Header<T> {
    #[inline]
    /// R_Key to invalidate.
    pub fn rkey(&self) -> u32 {
        super::be_u32(self.buffer.as_ref(), 0)
    }
}

/// A parsed IETH.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Repr {
    /// R_Key to invalidate.
    pub rkey: u32,
}

impl Repr {
    #[inline]
    /// Parses an IETH.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(h: &Header<&T>) -> Result<Repr> {
        Ok(Repr { rkey: h.rkey() })
    }
    #[inline]
    /// Header length.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    #[inline]
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, h: &mut Header<&mut T>) {
        h.buffer.as_mut()[0..4].copy_from_slice(&self.rkey.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let b = [0xde, 0xad, 0xbe, 0xef];
        let r = Repr::parse(&Header::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.rkey, 0xdead_beef);
        let mut out = [0u8; 4];
        r.emit(&mut Header::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
        assert!(Header::new_checked(&b[..3]).is_err());
    }
}
