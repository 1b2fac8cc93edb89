//! RDMA Extended Transport Header (16 bytes): virtual address, R_Key, DMA length.
//! Follows the BTH of RDMA WRITE First/Only and RDMA READ Request.

use super::Result;

/// Header length.
pub const HEADER_LEN: usize = 16;

super::header_view!(Header, HEADER_LEN, "A zero-copy view of a RETH.");

impl<T: AsRef<[u8]>> Header<T> {
    #[inline]
    /// Remote virtual address.
    pub fn va(&self) -> u64 {
        super::be_u64(self.buffer.as_ref(), 0)
    }
    #[inline]
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        super::be_u32(self.buffer.as_ref(), 8)
    }
    #[inline]
    /// Length of the whole transfer.
    pub fn dma_len(&self) -> u32 {
        super::be_u32(self.buffer.as_ref(), 12)
    }
}

/// A parsed RETH.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Repr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length of the whole transfer.
    pub dma_len: u32,
}

impl Repr {
    #[inline]
    /// Parses a RETH.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(h: &Header<&T>) -> Result<Repr> {
        Ok(Repr {
            va: h.va(),
            rkey: h.rkey(),
            dma_len: h.dma_len(),
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
        b[12..16].copy_from_slice(&self.dma_len.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BYTES: [u8; 16] = [
        0, 0, 0x56, 0x1a, 0x2b, 0x3c, 0x40, 0, 0, 0, 0x12, 0x34, 0, 0, 0x10, 0,
    ];

    #[test]
    fn deconstruct_and_roundtrip() {
        let h = Header::new_checked(&BYTES[..]).unwrap();
        assert_eq!(
            (h.va(), h.rkey(), h.dma_len()),
            (0x561a_2b3c_4000, 0x1234, 4096)
        );
        let r = Repr::parse(&h).unwrap();
        let mut out = [0u8; 16];
        r.emit(&mut Header::new_unchecked(&mut out[..]));
        assert_eq!(out, BYTES);
        assert!(Header::new_checked(&BYTES[..15]).is_err());
    }
}
