//! Datagram Extended Transport Header (8 bytes): Q_Key and source QP. Follows the BTH of UD
//! packets (and of the connection manager's MADs to QP1).

use super::Result;

/// Header length.
pub const HEADER_LEN: usize = 8;

super::header_view!(Header, HEADER_LEN, "A zero-copy view of a DETH.");

impl<T: AsRef<[u8]>> Header<T> {
    #[inline]
    /// Queue key.
    pub fn qkey(&self) -> u32 {
        super::be_u32(self.buffer.as_ref(), 0)
    }
    #[inline]
    /// The reserved byte before the source QP.
    pub fn resv8(&self) -> u8 {
        self.buffer.as_ref()[4]
    }
    #[inline]
    /// Source QP number (24 bits).
    pub fn src_qp(&self) -> u32 {
        super::be_u32(self.buffer.as_ref(), 4) & 0x00ff_ffff
    }
}

/// A parsed DETH.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Repr {
    /// Queue key.
    pub qkey: u32,
    /// Reserved byte (kept so that re-emitting is exact).
    pub resv8: u8,
    /// Source QP.
    pub src_qp: u32,
}

impl Repr {
    #[inline]
    /// Parses a DETH.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(h: &Header<&T>) -> Result<Repr> {
        Ok(Repr {
            qkey: h.qkey(),
            resv8: h.resv8(),
            src_qp: h.src_qp(),
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
        b[0..4].copy_from_slice(&self.qkey.to_be_bytes());
        b[4..8].copy_from_slice(
            &((self.resv8 as u32) << 24 | (self.src_qp & 0x00ff_ffff)).to_be_bytes(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_qp1_mad() {
        // Q_Key 0x80010000 as rdma_cm's MADs to QP1 carry, source QP 1.
        let b = [0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01];
        let r = Repr::parse(&Header::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!((r.qkey, r.src_qp), (0x8001_0000, 1));
        let mut out = [0u8; 8];
        r.emit(&mut Header::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
    }
}
