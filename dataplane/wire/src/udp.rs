//! UDP header (8 bytes). RoCEv2 uses destination port 4791; the source port is per QP, for
//! ECMP entropy; on IPv4 the checksum is 0.

use super::Result;

/// Header length.
pub const HEADER_LEN: usize = 8;
/// The RoCEv2 destination port.
pub const ROCEV2_PORT: u16 = 4791;

super::header_view!(Header, HEADER_LEN, "A zero-copy view of a UDP header.");

impl<T: AsRef<[u8]>> Header<T> {
    #[inline]
    /// Source port.
    pub fn src_port(&self) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_be_bytes([b[0], b[1]])
    }
    #[inline]
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_be_bytes([b[2], b[3]])
    }
    #[inline]
    /// Length of header and payload.
    pub fn length(&self) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_be_bytes([b[4], b[5]])
    }
    #[inline]
    /// Checksum.
    pub fn checksum(&self) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_be_bytes([b[6], b[7]])
    }
}

/// A parsed UDP header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Repr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Checksum as carried (0 on IPv4 RoCE).
    pub checksum: u16,
}

impl Repr {
    #[inline]
    /// Parses the header (the length is checked by the packet parser).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(h: &Header<&T>) -> Result<Repr> {
        Ok(Repr {
            src_port: h.src_port(),
            dst_port: h.dst_port(),
            checksum: h.checksum(),
        })
    }
    #[inline]
    /// Header length.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    #[inline]
    /// Writes the header with `len` as its length field.
    pub fn emit(&self, b: &mut [u8], len: u16) {
        b[0..2].copy_from_slice(&self.src_port.to_be_bytes());
        b[2..4].copy_from_slice(&self.dst_port.to_be_bytes());
        b[4..6].copy_from_slice(&len.to_be_bytes());
        b[6..8].copy_from_slice(&self.checksum.to_be_bytes());
    }
}

#[inline]
/// The UDP checksum over IPv6 (RFC 8200: mandatory there) of a datagram `udp` (header with a
/// zero checksum field, and payload) from `src` to `dst`. Zero comes out as 0xFFFF.
pub fn checksum_v6(src: &core::net::Ipv6Addr, dst: &core::net::Ipv6Addr, udp: &[u8]) -> u16 {
    use super::ipv4::{fold, ones_sum};
    let mut s = ones_sum(0, &src.octets());
    s = ones_sum(s, &dst.octets());
    s += udp.len() as u64 + super::ipv4::PROTO_UDP as u64;
    match fold(ones_sum(s, udp)) {
        0 => 0xffff,
        c => c,
    }
}

#[inline]
/// The UDP source port Linux (rxe) uses for a QP pair without a flow label: the flow label
/// derived from the two QP numbers (`rdma_calc_flow_label`), folded into 14 bits above 0xC000
/// (`rdma_flow_label_to_udp_sport`).
pub fn source_port_for_qp(lqpn: u32, rqpn: u32) -> u16 {
    // rdma_calc_flow_label: fold the product of the two QPNs into 20 bits.
    let mut v = (lqpn as u64) * (rqpn as u64);
    v ^= v >> 20;
    v ^= v >> 40;
    let fl = (v & 0x000f_ffff) as u32;
    // rdma_flow_label_to_udp_sport: fold 20 bits into 14.
    let fl_low = fl & 0x03fff;
    let fl_high = fl & 0xfc000;
    let p = fl_low ^ (fl_high >> 14);
    0xc000 | p as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let r = Repr {
            src_port: 0xc0de,
            dst_port: ROCEV2_PORT,
            checksum: 0,
        };
        let mut b = [0u8; 8];
        r.emit(&mut b, 60);
        let h = Header::new_checked(&b[..]).unwrap();
        assert_eq!(h.length(), 60);
        assert_eq!(Repr::parse(&h).unwrap(), r);
        // rxe's ACKs from QP 0x2c to QP 0xff7e35 in hostpeer_probe_rnr.pcap leave from 62340.
        assert_eq!(source_port_for_qp(0x2c, 0xff7e35), 62340);
        assert_eq!(source_port_for_qp(0xff7e35, 0x2c), 62340);
    }
}
