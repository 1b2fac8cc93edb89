//! IPv6 header, as RoCEv2 uses it: traffic class (DSCP and ECN), flow label, next header UDP.

use super::ipv4::Ecn;
use super::{Error, Result};
use core::net::Ipv6Addr;

/// Header length.
pub const HEADER_LEN: usize = 40;

super::header_view!(Header, HEADER_LEN, "A zero-copy view of an IPv6 header.");

impl<T: AsRef<[u8]>> Header<T> {
    #[inline]
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    #[inline]
    /// Version (6).
    pub fn version(&self) -> u8 {
        self.b()[0] >> 4
    }
    #[inline]
    /// Traffic class.
    pub fn traffic_class(&self) -> u8 {
        (self.b()[0] << 4) | (self.b()[1] >> 4)
    }
    #[inline]
    /// ECN.
    pub fn ecn(&self) -> Ecn {
        Ecn::from_bits(self.traffic_class())
    }
    #[inline]
    /// Flow label.
    pub fn flow_label(&self) -> u32 {
        let b = self.b();
        u32::from_be_bytes([0, b[1] & 0x0f, b[2], b[3]])
    }
    #[inline]
    /// Payload length.
    pub fn payload_len(&self) -> u16 {
        u16::from_be_bytes([self.b()[4], self.b()[5]])
    }
    #[inline]
    /// Next header.
    pub fn next_header(&self) -> u8 {
        self.b()[6]
    }
    #[inline]
    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.b()[7]
    }
    #[inline]
    /// Source.
    pub fn src(&self) -> Ipv6Addr {
        Ipv6Addr::from(<[u8; 16]>::try_from(&self.b()[8..24]).expect("16 bytes"))
    }
    #[inline]
    /// Destination.
    pub fn dst(&self) -> Ipv6Addr {
        Ipv6Addr::from(<[u8; 16]>::try_from(&self.b()[24..40]).expect("16 bytes"))
    }
}

/// A parsed IPv6 header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    /// Traffic class (DSCP << 2 | ECN).
    pub traffic_class: u8,
    /// Flow label.
    pub flow_label: u32,
    /// Next header.
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Source.
    pub src: Ipv6Addr,
    /// Destination.
    pub dst: Ipv6Addr,
}

impl Repr {
    #[inline]
    /// Parses the header.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(h: &Header<&T>) -> Result<Repr> {
        if h.version() != 6 {
            return Err(Error::BadVersion);
        }
        Ok(Repr {
            traffic_class: h.traffic_class(),
            flow_label: h.flow_label(),
            next_header: h.next_header(),
            hop_limit: h.hop_limit(),
            src: h.src(),
            dst: h.dst(),
        })
    }
    #[inline]
    /// Header length.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    #[inline]
    /// Writes the header for `payload_len` bytes of payload.
    pub fn emit(&self, b: &mut [u8], payload_len: usize) {
        let w = 6u32 << 28 | (self.traffic_class as u32) << 20 | (self.flow_label & 0x000f_ffff);
        b[0..4].copy_from_slice(&w.to_be_bytes());
        b[4..6].copy_from_slice(&(payload_len as u16).to_be_bytes());
        b[6] = self.next_header;
        b[7] = self.hop_limit;
        b[8..24].copy_from_slice(&self.src.octets());
        b[24..40].copy_from_slice(&self.dst.octets());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let r = Repr {
            traffic_class: 0x6a,
            flow_label: 0xabcde,
            next_header: 17,
            hop_limit: 64,
            src: "fd00:233::10".parse().unwrap(),
            dst: "fd00:233::11".parse().unwrap(),
        };
        let mut b = [0u8; 40];
        r.emit(&mut b, 1234);
        let h = Header::new_checked(&b[..]).unwrap();
        assert_eq!(h.payload_len(), 1234);
        assert_eq!(h.ecn(), Ecn::Ect0);
        assert_eq!(Repr::parse(&h).unwrap(), r);
    }
}
