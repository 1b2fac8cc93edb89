//! IPv4 header, as RoCEv2 uses it: DSCP and ECN in the TOS byte, DF set, TTL, protocol UDP.

use super::{Error, Result};
use core::net::Ipv4Addr;

/// Header length without options.
pub const HEADER_LEN: usize = 20;
/// IP protocol number of UDP.
pub const PROTO_UDP: u8 = 17;

/// ECN codepoints (the low two bits of TOS / traffic class).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Ecn {
    /// Not ECN-capable transport.
    #[default]
    NotEct,
    /// ECN-capable, ECT(1).
    Ect1,
    /// ECN-capable, ECT(0).
    Ect0,
    /// Congestion experienced.
    Ce,
}

impl Ecn {
    #[inline]
    /// From the two ECN bits.
    pub fn from_bits(b: u8) -> Ecn {
        match b & 3 {
            0 => Ecn::NotEct,
            1 => Ecn::Ect1,
            2 => Ecn::Ect0,
            _ => Ecn::Ce,
        }
    }
    #[inline]
    /// The two ECN bits.
    pub fn bits(self) -> u8 {
        match self {
            Ecn::NotEct => 0,
            Ecn::Ect1 => 1,
            Ecn::Ect0 => 2,
            Ecn::Ce => 3,
        }
    }
}

/// A zero-copy view of an IPv4 header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Header<T> {
    #[inline]
    /// Wraps without checking.
    pub const fn new_unchecked(buffer: T) -> Self {
        Header { buffer }
    }
    #[inline]
    /// Wraps, checking version, header length and that the whole header fits.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let h = Header { buffer };
        let b = h.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if b[0] >> 4 != 4 {
            return Err(Error::BadVersion);
        }
        if h.header_len() < HEADER_LEN {
            return Err(Error::BadLength);
        }
        if b.len() < h.header_len() {
            return Err(Error::Truncated);
        }
        Ok(h)
    }
    #[inline]
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    #[inline]
    /// Header length in bytes.
    pub fn header_len(&self) -> usize {
        ((self.b()[0] & 0x0f) as usize) * 4
    }
    #[inline]
    /// DSCP.
    pub fn dscp(&self) -> u8 {
        self.b()[1] >> 2
    }
    #[inline]
    /// ECN.
    pub fn ecn(&self) -> Ecn {
        Ecn::from_bits(self.b()[1])
    }
    #[inline]
    /// Total length.
    pub fn total_len(&self) -> u16 {
        u16::from_be_bytes([self.b()[2], self.b()[3]])
    }
    #[inline]
    /// Identification.
    pub fn ident(&self) -> u16 {
        u16::from_be_bytes([self.b()[4], self.b()[5]])
    }
    #[inline]
    /// Flags and fragment offset, as carried.
    pub fn flags_frag(&self) -> u16 {
        u16::from_be_bytes([self.b()[6], self.b()[7]])
    }
    #[inline]
    /// True for a fragment (MF set or a non-zero offset).
    pub fn is_fragment(&self) -> bool {
        self.flags_frag() & 0x3fff != 0
    }
    #[inline]
    /// TTL.
    pub fn ttl(&self) -> u8 {
        self.b()[8]
    }
    #[inline]
    /// Protocol.
    pub fn protocol(&self) -> u8 {
        self.b()[9]
    }
    #[inline]
    /// Header checksum.
    pub fn checksum(&self) -> u16 {
        u16::from_be_bytes([self.b()[10], self.b()[11]])
    }
    #[inline]
    /// Source address.
    pub fn src(&self) -> Ipv4Addr {
        let b = self.b();
        Ipv4Addr::new(b[12], b[13], b[14], b[15])
    }
    #[inline]
    /// Destination address.
    pub fn dst(&self) -> Ipv4Addr {
        let b = self.b();
        Ipv4Addr::new(b[16], b[17], b[18], b[19])
    }
    /// True if the header checksum is right. Inlined always: on every frame received, where
    /// LLVM left it a call (18 instructions a 64 B WRITE more in stream_cost).
    #[inline(always)]
    pub fn verify_checksum(&self) -> bool {
        let (b, hl) = (self.b(), self.header_len());
        match b.first_chunk::<HEADER_LEN>() {
            Some(h) if hl == HEADER_LEN => sums_to_ones(h),
            _ => checksum(&b[..hl]) == 0,
        }
    }
}

#[inline]
/// The one's complement sum of `data` as 16-bit big-endian words, added to `sum` (not folded).
pub fn ones_sum(mut sum: u64, data: &[u8]) -> u64 {
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        sum += u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as u64;
    }
    let rest = chunks.remainder();
    let mut words = rest.chunks_exact(2);
    for c in &mut words {
        sum += (u16::from_be_bytes([c[0], c[1]]) as u64) << 16;
    }
    if let [last] = words.remainder() {
        sum += (*last as u64) << 24;
    }
    sum
}

/// True if the one's complement sum of a 20-byte header is all ones (its checksum is right).
/// The sum is taken over native-endian 32-bit words, which gives the byte-swapped 16-bit sum
/// (RFC 1071's byte order independence), and all ones is its own swap: five loads and three
/// folds instead of ten big-endian words.
#[inline(always)]
fn sums_to_ones(h: &[u8; HEADER_LEN]) -> bool {
    let w = |i: usize| u32::from_ne_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]) as u64;
    let s = w(0) + w(4) + w(8) + w(12) + w(16);
    let s = (s & 0xffff_ffff) + (s >> 32);
    let s = (s & 0xffff) + (s >> 16);
    let s = (s & 0xffff) + (s >> 16);
    (s & 0xffff) + (s >> 16) == 0xffff
}

#[inline]
/// Folds a sum from [`ones_sum`] into the 16-bit one's complement checksum.
pub fn fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[inline]
/// The Internet checksum of `data` (the one's complement of the one's complement sum).
pub fn checksum(data: &[u8]) -> u16 {
    fold(ones_sum(0, data))
}

/// A parsed IPv4 header (without options).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    /// DSCP.
    pub dscp: u8,
    /// ECN.
    pub ecn: Ecn,
    /// Identification.
    pub ident: u16,
    /// Flags and fragment offset (0x4000: DF).
    pub flags_frag: u16,
    /// TTL.
    pub ttl: u8,
    /// Protocol.
    pub protocol: u8,
    /// Source.
    pub src: Ipv4Addr,
    /// Destination.
    pub dst: Ipv4Addr,
}

impl Repr {
    #[inline]
    /// Parses a header without options (RoCE never uses them).
    pub fn parse<T: AsRef<[u8]>>(h: &Header<T>) -> Result<Repr> {
        if h.header_len() != HEADER_LEN {
            return Err(Error::BadLength);
        }
        Ok(Repr {
            dscp: h.dscp(),
            ecn: h.ecn(),
            ident: h.ident(),
            flags_frag: h.flags_frag(),
            ttl: h.ttl(),
            protocol: h.protocol(),
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
    /// Writes the header for a packet of `payload_len` bytes after it. The checksum is filled
    /// in unless `offload` (then it is 0, for the port to fill).
    pub fn emit(&self, b: &mut [u8], payload_len: usize, offload: bool) {
        b[0] = 0x45;
        b[1] = self.dscp << 2 | self.ecn.bits();
        b[2..4].copy_from_slice(&((HEADER_LEN + payload_len) as u16).to_be_bytes());
        b[4..6].copy_from_slice(&self.ident.to_be_bytes());
        b[6..8].copy_from_slice(&self.flags_frag.to_be_bytes());
        b[8] = self.ttl;
        b[9] = self.protocol;
        b[10..12].fill(0);
        b[12..16].copy_from_slice(&self.src.octets());
        b[16..20].copy_from_slice(&self.dst.octets());
        if !offload {
            let c = checksum(&b[..HEADER_LEN]);
            b[10..12].copy_from_slice(&c.to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emit_parse_and_checksum() {
        let r = Repr {
            dscp: 26,
            ecn: Ecn::Ect0,
            ident: 0x1234,
            flags_frag: 0x4000,
            ttl: 64,
            protocol: PROTO_UDP,
            src: Ipv4Addr::new(10, 233, 0, 10),
            dst: Ipv4Addr::new(10, 233, 0, 11),
        };
        let mut b = [0u8; 20];
        r.emit(&mut b, 100, false);
        let h = Header::new_checked(&b[..]).unwrap();
        assert!(h.verify_checksum());
        assert_eq!(h.total_len(), 120);
        assert_eq!(Repr::parse(&h).unwrap(), r);
        assert!(!h.is_fragment());
        b[0] = 0x65;
        assert_eq!(Header::new_checked(&b[..]).err(), Some(Error::BadVersion));
        for e in [Ecn::NotEct, Ecn::Ect1, Ecn::Ect0, Ecn::Ce] {
            assert_eq!(Ecn::from_bits(e.bits()), e);
        }
    }

    proptest::proptest! {
        /// The 20-byte fast check agrees with the general checksum, on headers whose checksum
        /// was set right and on the same headers with one byte changed (or not).
        #[test]
        fn the_fast_check_agrees_with_the_checksum(
            mut h in proptest::array::uniform20(proptest::prelude::any::<u8>()),
            at in 0usize..20,
            flip in proptest::prelude::any::<u8>(),
        ) {
            h[0] = 0x45;
            h[10] = 0;
            h[11] = 0;
            let c = checksum(&h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            proptest::prop_assert!(Header::new_unchecked(&h[..]).verify_checksum());
            h[at] ^= flip;
            let want = checksum(&h) == 0;
            if h[0] == 0x45 {
                proptest::prop_assert_eq!(Header::new_unchecked(&h[..]).verify_checksum(), want);
                proptest::prop_assert_eq!(sums_to_ones(&h), want);
            }
        }
    }
}
