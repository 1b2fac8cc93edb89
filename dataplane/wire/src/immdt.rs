//! Immediate data (4 bytes), after SEND or RDMA WRITE Last/Only with Immediate.

use super::Result;

/// Header length.
pub const HEADER_LEN: usize = 4;

super::header_view!(Header, HEADER_LEN, "A zero-copy view of an ImmDt.");

impl<T: AsRef<[u8]>> Header<T> {
    #[inline]
    /// Immediate data, opaque to the transport.
    pub fn imm(&self) -> u32 {
        super::be_u32(self.buffer.as_ref(), 0)
    }
}

/// A parsed ImmDt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Repr {
    /// Immediate data, opaque to the transport.
    pub imm: u32,
}

impl Repr {
    #[inline]
    /// Parses an ImmDt.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(h: &Header<&T>) -> Result<Repr> {
        Ok(Repr { imm: h.imm() })
    }
    #[inline]
    /// Header length.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    #[inline]
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, h: &mut Header<&mut T>) {
        h.buffer.as_mut()[0..4].copy_from_slice(&self.imm.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let b = [0xde, 0xad, 0xbe, 0xef];
        let r = Repr::parse(&Header::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.imm, 0xdead_beef);
        let mut out = [0u8; 4];
        r.emit(&mut Header::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
        assert!(Header::new_checked(&b[..3]).is_err());
    }
}
