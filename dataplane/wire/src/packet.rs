//! Whole RoCEv2 packets: the one-pass receive parse and the in-place transmit build.
//!
//! [`parse`] goes from frame bytes (802.1Q-tagged or not) to a [`PacketInfo`], like rxe's
//! `rxe_pkt_info`: the opcode and its table entry, the BTH fields the transport needs, the
//! addresses, ECN, and the offsets of every header and of the payload, or the reason the packet
//! is rejected. It allocates nothing and reads each byte at most once (twice with the ICRC).
//!
//! [`RoceRepr`] is the owned form of every header of a packet. [`RoceRepr::emit`] writes them
//! all in place in front of a payload that is already in the buffer, then the pad and the ICRC;
//! [`build`] does the same on a [`PacketBuf`] by growing it into its headroom and tailroom.

use super::ipv4::Ecn;
use super::opcode::{OpInfo, lookup, mask};
use super::{
    Error, Psn, Result, aeth, atomic_ack_eth, atomic_eth, bth, deth, eth, icrc, ieth, immdt, ipv4,
    ipv6, reth, udp,
};
use crate::buf::{PacketBuf, TxOffload};
use core::net::IpAddr;

/// What the receive path needs to know of a packet, found in one pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketInfo {
    /// The opcode's table entry.
    pub op: &'static OpInfo,
    /// Opcode.
    pub opcode: u8,
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// 802.1Q tag.
    pub vlan: Option<eth::VlanTag>,
    /// Source IP (the sender's GID).
    pub src_ip: IpAddr,
    /// Destination IP.
    pub dst_ip: IpAddr,
    /// DSCP.
    pub dscp: u8,
    /// ECN codepoint.
    pub ecn: Ecn,
    /// UDP source port.
    pub udp_src: u16,
    /// Destination QP.
    pub dest_qp: u32,
    /// PSN.
    pub psn: Psn,
    /// AckReq.
    pub ack_req: bool,
    /// Solicited event.
    pub se: bool,
    /// BECN (set in CNPs).
    pub becn: bool,
    /// Partition key.
    pub pkey: u16,
    /// Pad count.
    pub pad: u8,
    /// Offset of the IP header in the frame.
    pub l3_off: u16,
    /// Offset of the BTH in the frame.
    pub bth_off: u16,
    /// Offset of the payload in the frame.
    pub payload_off: u16,
    /// Payload length, without pad.
    pub payload_len: u16,
    /// The ICRC as carried.
    pub icrc: u32,
    /// The extension headers after the BTH, decoded (which are present follows from the
    /// opcode): each packet's headers are read once, here.
    pub ext: Ext,
}

/// What [`parse`] checks besides the structure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checks {
    /// Verify the ICRC.
    pub icrc: bool,
    /// Verify the IPv4 header checksum (off when the port already did).
    pub ipv4_checksum: bool,
}

impl Checks {
    /// Everything.
    pub const ALL: Checks = Checks {
        icrc: true,
        ipv4_checksum: true,
    };
    /// Structure only (for tools that report bad ICRCs rather than drop them).
    pub const NONE: Checks = Checks {
        icrc: false,
        ipv4_checksum: false,
    };
}

impl PacketInfo {
    #[inline]
    /// The payload.
    pub fn payload<'a>(&self, frame: &'a [u8]) -> &'a [u8] {
        &frame[self.payload_off as usize..self.payload_off as usize + self.payload_len as usize]
    }
}

/// A received packet's extension headers, decoded once by [`parse`]: the combinations rxe's
/// opcode table has (at most two headers), kept small (40 bytes) so that a [`PacketInfo`] still
/// moves in registers. A header whose contents do not decode (an AETH with a reserved
/// syndrome) reads as absent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Ext {
    /// None (SEND and WRITE FIRST/MIDDLE, READ response MIDDLE, CNP).
    #[default]
    None,
    /// RETH (WRITE FIRST/ONLY, READ request).
    Reth(reth::Repr),
    /// RETH and immediate data (WRITE ONLY with immediate).
    RethImm(reth::Repr, u32),
    /// Immediate data (SEND LAST/ONLY and WRITE LAST with immediate).
    Imm(u32),
    /// IETH, the R_Key to invalidate (SEND LAST/ONLY with invalidate).
    Ieth(u32),
    /// AETH (ACK, READ response FIRST/LAST/ONLY).
    Aeth(aeth::Repr),
    /// AETH and AtomicAckETH (atomic ACK).
    AethAtomicAck(aeth::Repr, atomic_ack_eth::Repr),
    /// AtomicETH (compare-and-swap, fetch-and-add).
    AtomicEth(atomic_eth::Repr),
    /// DETH (UD SEND ONLY).
    Deth(deth::Repr),
    /// DETH and immediate data (UD SEND ONLY with immediate).
    DethImm(deth::Repr, u32),
}

impl Ext {
    /// Decodes the extension headers the opcode `op` has, from `hdrs` (the bytes after the
    /// BTH, the opcode's header length, as `parse` has checked).
    // (`inline(always)` here costs 35 instructions a 64 B WRITE more in stream_cost.)
    #[inline]
    fn decode(op: &OpInfo, hdrs: &[u8]) -> Ext {
        let o = &op.offset;
        let at = |off: u8| &hdrs[off as usize - bth::HEADER_LEN..];
        let imm = |off: u8| immdt::Header::new_checked(at(off)).ok().map(|h| h.imm());
        if o.reth != 0 {
            let Some(r) = reth::Header::new_checked(at(o.reth))
                .ok()
                .and_then(|h| reth::Repr::parse(&h).ok())
            else {
                return Ext::None;
            };
            return match (o.immdt != 0).then(|| imm(o.immdt)).flatten() {
                Some(i) => Ext::RethImm(r, i),
                None => Ext::Reth(r),
            };
        }
        if o.aeth != 0 {
            let Some(a) = aeth::Header::new_checked(at(o.aeth))
                .ok()
                .and_then(|h| aeth::Repr::parse(&h).ok())
            else {
                return Ext::None;
            };
            if o.atmack != 0 {
                let ack = atomic_ack_eth::Header::new_checked(at(o.atmack))
                    .ok()
                    .and_then(|h| atomic_ack_eth::Repr::parse(&h).ok());
                if let Some(k) = ack {
                    return Ext::AethAtomicAck(a, k);
                }
            }
            return Ext::Aeth(a);
        }
        if o.atmeth != 0 {
            return atomic_eth::Header::new_checked(at(o.atmeth))
                .ok()
                .and_then(|h| atomic_eth::Repr::parse(&h).ok())
                .map_or(Ext::None, Ext::AtomicEth);
        }
        if o.deth != 0 {
            let Some(d) = deth::Header::new_checked(at(o.deth))
                .ok()
                .and_then(|h| deth::Repr::parse(&h).ok())
            else {
                return Ext::None;
            };
            return match (o.immdt != 0).then(|| imm(o.immdt)).flatten() {
                Some(i) => Ext::DethImm(d, i),
                None => Ext::Deth(d),
            };
        }
        if o.immdt != 0 {
            return imm(o.immdt).map_or(Ext::None, Ext::Imm);
        }
        if o.ieth != 0 {
            return ieth::Header::new_checked(at(o.ieth))
                .ok()
                .map_or(Ext::None, |h| Ext::Ieth(h.rkey()));
        }
        Ext::None
    }

    /// The RETH.
    #[inline]
    pub fn reth(&self) -> Option<reth::Repr> {
        match *self {
            Ext::Reth(r) | Ext::RethImm(r, _) => Some(r),
            _ => None,
        }
    }

    /// The AETH.
    #[inline]
    pub fn aeth(&self) -> Option<aeth::Repr> {
        match *self {
            Ext::Aeth(a) | Ext::AethAtomicAck(a, _) => Some(a),
            _ => None,
        }
    }

    /// The AtomicETH.
    #[inline]
    pub fn atomic_eth(&self) -> Option<atomic_eth::Repr> {
        match *self {
            Ext::AtomicEth(a) => Some(a),
            _ => None,
        }
    }

    /// The AtomicAckETH.
    #[inline]
    pub fn atomic_ack(&self) -> Option<atomic_ack_eth::Repr> {
        match *self {
            Ext::AethAtomicAck(_, k) => Some(k),
            _ => None,
        }
    }

    /// The DETH.
    #[inline]
    pub fn deth(&self) -> Option<deth::Repr> {
        match *self {
            Ext::Deth(d) | Ext::DethImm(d, _) => Some(d),
            _ => None,
        }
    }

    /// The immediate data.
    #[inline]
    pub fn immdt(&self) -> Option<u32> {
        match *self {
            Ext::RethImm(_, i) | Ext::Imm(i) | Ext::DethImm(_, i) => Some(i),
            _ => None,
        }
    }

    /// The IETH's R_Key to invalidate.
    #[inline]
    pub fn ieth(&self) -> Option<u32> {
        match *self {
            Ext::Ieth(k) => Some(k),
            _ => None,
        }
    }

    /// All of them, as the build side writes them.
    pub fn repr(&self) -> ExtRepr {
        ExtRepr {
            deth: self.deth(),
            reth: self.reth(),
            atomic_eth: self.atomic_eth(),
            aeth: self.aeth(),
            atomic_ack: self.atomic_ack(),
            immdt: self.immdt(),
            ieth: self.ieth(),
        }
    }
}

#[inline]
/// Parses a frame as a RoCEv2 packet.
pub fn parse(frame: &[u8], checks: Checks) -> Result<PacketInfo> {
    match parse_v4(frame, checks) {
        Some(info) => Ok(info),
        None => parse_general(frame, checks),
    }
}

/// [`parse`] of the frame nearly every RoCEv2 packet is: untagged IPv4 without options, so that
/// every header is at a fixed offset and one length check covers all of them. `None` for any
/// other frame, and for one that fails a check here: [`parse_general`] then gives the reason.
/// Where it answers, it answers as `parse_general` does (the `fast_v4_parse_*` property tests
/// hold it to that on valid frames and on frames with a byte changed); it exists because the
/// general parse's header-by-header checks and offsets cost about 100 instructions more per
/// frame (stream_cost).
#[inline(always)]
pub(crate) fn parse_v4(frame: &[u8], checks: Checks) -> Option<PacketInfo> {
    const L3: usize = eth::HEADER_LEN;
    const UDP: usize = L3 + ipv4::HEADER_LEN;
    const BTH: usize = UDP + udp::HEADER_LEN;
    const HEAD: usize = BTH + bth::HEADER_LEN;
    let h: &[u8; HEAD] = frame.get(..HEAD)?.try_into().ok()?;
    if h[12..14] != eth::ETHERTYPE_IPV4.to_be_bytes() || h[L3] != 0x45 {
        return None;
    }
    let ip = ipv4::Header::new_unchecked(&h[L3..UDP]);
    let total = ip.total_len() as usize;
    // IP, UDP, BTH and ICRC at least; all inside the frame; UDP, unfragmented.
    if total < HEAD - L3 + icrc::LEN
        || total > frame.len() - L3
        || ip.protocol() != ipv4::PROTO_UDP
        || ip.is_fragment()
        || checks.ipv4_checksum && !ip.verify_checksum()
    {
        return None;
    }
    let l4_len = total - ipv4::HEADER_LEN;
    let u = udp::Header::new_unchecked(&h[UDP..BTH]);
    let b = bth::Header::new_unchecked(&h[BTH..HEAD]);
    if u.dst_port() != udp::ROCEV2_PORT || u.length() as usize != l4_len || b.tver() != 0 {
        return None;
    }
    let op = lookup(b.opcode());
    let hdrs = op.length as usize;
    let transport_len = l4_len - udp::HEADER_LEN;
    if !op.is_valid() || transport_len < hdrs + icrc::LEN {
        return None;
    }
    let with_pad = transport_len - hdrs - icrc::LEN;
    let pad = b.pad_count();
    check_pad(op, with_pad, pad).ok()?;
    let l3 = &frame[L3..L3 + total];
    let carried = icrc::carried(l3)?;
    if checks.icrc && icrc::compute_v4(&l3[..total - icrc::LEN]) != carried {
        return None;
    }
    let f = eth::Frame::new_unchecked(&h[..L3]);
    let addrs = (
        IpAddr::V4(ip.src()),
        IpAddr::V4(ip.dst()),
        ip.dscp(),
        ip.ecn(),
    );
    Some(info(
        frame, &f, None, addrs, &u, &b, op, L3, BTH, with_pad, carried,
    ))
}

/// [`parse`] of any frame, header by header.
pub fn parse_general(frame: &[u8], checks: Checks) -> Result<PacketInfo> {
    let f = eth::Frame::new_checked(frame)?;
    let l3_off = f.header_len();
    let l3 = &frame[l3_off..];
    let (src_ip, dst_ip, dscp, ecn, l4_off, l4_len, ipv6) = match f.ethertype() {
        eth::ETHERTYPE_IPV4 => {
            let h = ipv4::Header::new_checked(l3)?;
            let total = h.total_len() as usize;
            let hl = h.header_len();
            if total < hl + udp::HEADER_LEN {
                return Err(Error::BadLength);
            }
            if total > l3.len() {
                return Err(Error::Truncated);
            }
            if h.protocol() != ipv4::PROTO_UDP {
                return Err(Error::NotRoce);
            }
            if h.is_fragment() {
                return Err(Error::Fragment);
            }
            if checks.ipv4_checksum && !h.verify_checksum() {
                return Err(Error::BadChecksum);
            }
            (
                IpAddr::V4(h.src()),
                IpAddr::V4(h.dst()),
                h.dscp(),
                h.ecn(),
                hl,
                total - hl,
                false,
            )
        }
        eth::ETHERTYPE_IPV6 => {
            let h = ipv6::Header::new_checked(l3)?;
            if h.version() != 6 {
                return Err(Error::BadVersion);
            }
            if h.next_header() != ipv4::PROTO_UDP {
                return Err(Error::NotRoce);
            }
            let plen = h.payload_len() as usize;
            if ipv6::HEADER_LEN + plen > l3.len() {
                return Err(Error::Truncated);
            }
            let tc = h.traffic_class();
            (
                IpAddr::V6(h.src()),
                IpAddr::V6(h.dst()),
                tc >> 2,
                h.ecn(),
                ipv6::HEADER_LEN,
                plen,
                true,
            )
        }
        _ => return Err(Error::NotRoce),
    };
    if l4_len < udp::HEADER_LEN {
        return Err(Error::BadLength);
    }
    let u = udp::Header::new_checked(&l3[l4_off..])?;
    if u.dst_port() != udp::ROCEV2_PORT {
        return Err(Error::NotRoce);
    }
    if u.length() as usize != l4_len {
        return Err(Error::BadLength);
    }
    if l4_len < udp::HEADER_LEN + bth::HEADER_LEN {
        return Err(Error::Truncated);
    }
    let bth_rel = l4_off + udp::HEADER_LEN;
    let b = bth::Header::new_checked(&l3[bth_rel..l4_off + l4_len])?;
    if b.tver() != 0 {
        return Err(Error::BadVersion);
    }
    let op = lookup(b.opcode());
    if !op.is_valid() {
        return Err(Error::UnknownOpcode);
    }
    let transport_len = l4_len - udp::HEADER_LEN;
    let hdrs = op.length as usize;
    if transport_len < hdrs + icrc::LEN {
        return Err(Error::Truncated);
    }
    let with_pad = transport_len - hdrs - icrc::LEN;
    let pad = b.pad_count();
    check_pad(op, with_pad, pad)?;
    let end = l4_off + l4_len;
    if checks.icrc {
        icrc::verify(&l3[..end], ipv6)?;
    }
    let icrc_val = icrc::carried(&l3[..end]).ok_or(Error::Truncated)?;
    let bth_off = l3_off + bth_rel;
    let addrs = (src_ip, dst_ip, dscp, ecn);
    Ok(info(
        frame,
        &f,
        f.vlan(),
        addrs,
        &u,
        &b,
        op,
        l3_off,
        bth_off,
        with_pad,
        icrc_val,
    ))
}

/// Whether the pad count fits the bytes between the headers and the ICRC (`with_pad`): a
/// payload's pad keeps it a multiple of 4, and a packet without payload has neither.
#[inline(always)]
fn check_pad(op: &OpInfo, with_pad: usize, pad: u8) -> Result<()> {
    if op.has(mask::PAYLOAD) {
        if !with_pad.is_multiple_of(4) || (pad as usize) > with_pad {
            return Err(Error::PadMismatch);
        }
    } else if with_pad != 0 || pad != 0 {
        return Err(if with_pad != 0 {
            Error::BadLength
        } else {
            Error::PadMismatch
        });
    }
    Ok(())
}

/// The [`PacketInfo`] of a frame both parses have checked: the MACs, the addresses
/// (source, destination, DSCP, ECN), the UDP and BTH fields, the offsets and the extension
/// headers (decoded here).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn info(
    frame: &[u8],
    f: &eth::Frame<&[u8]>,
    vlan: Option<eth::VlanTag>,
    (src_ip, dst_ip, dscp, ecn): (IpAddr, IpAddr, u8, Ecn),
    u: &udp::Header<&[u8]>,
    b: &bth::Header<&[u8]>,
    op: &'static OpInfo,
    l3_off: usize,
    bth_off: usize,
    with_pad: usize,
    icrc: u32,
) -> PacketInfo {
    let hdrs = op.length as usize;
    let pad = b.pad_count();
    PacketInfo {
        op,
        opcode: b.opcode(),
        dst_mac: f.dst(),
        src_mac: f.src(),
        vlan,
        src_ip,
        dst_ip,
        dscp,
        ecn,
        udp_src: u.src_port(),
        dest_qp: b.dest_qp(),
        psn: b.psn(),
        ack_req: b.ack_req(),
        se: b.se(),
        becn: b.becn(),
        pkey: b.pkey(),
        pad,
        l3_off: l3_off as u16,
        bth_off: bth_off as u16,
        payload_off: (bth_off + hdrs) as u16,
        payload_len: (with_pad - pad as usize) as u16,
        icrc,
        ext: Ext::decode(op, &frame[bth_off + bth::HEADER_LEN..bth_off + hdrs]),
    }
}

/// The IP header of a RoCE packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpRepr {
    /// IPv4.
    V4(ipv4::Repr),
    /// IPv6.
    V6(ipv6::Repr),
}

impl IpRepr {
    #[inline]
    fn len(&self) -> usize {
        match self {
            IpRepr::V4(_) => ipv4::HEADER_LEN,
            IpRepr::V6(_) => ipv6::HEADER_LEN,
        }
    }
}

/// The extension headers after the BTH; which are present follows from the opcode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExtRepr {
    /// DETH.
    pub deth: Option<deth::Repr>,
    /// RETH.
    pub reth: Option<reth::Repr>,
    /// AtomicETH.
    pub atomic_eth: Option<atomic_eth::Repr>,
    /// AETH.
    pub aeth: Option<aeth::Repr>,
    /// AtomicAckETH.
    pub atomic_ack: Option<atomic_ack_eth::Repr>,
    /// Immediate data.
    pub immdt: Option<u32>,
    /// R_Key to invalidate.
    pub ieth: Option<u32>,
}

/// Every header of a RoCEv2 packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoceRepr {
    /// Ethernet (and 802.1Q).
    pub eth: eth::Repr,
    /// IPv4 or IPv6.
    pub ip: IpRepr,
    /// UDP.
    pub udp: udp::Repr,
    /// BTH (its pad count is recomputed from the payload length on emit).
    pub bth: bth::Repr,
    /// Extension headers.
    pub ext: ExtRepr,
}

impl RoceRepr {
    /// An RC packet with no extension headers: opcode `opcode` to QP `dest_qp` at PSN `psn`,
    /// from 10.0.0.1 (02:00:00:00:00:01, UDP source port 0xc000) to 10.0.0.2
    /// (02:00:00:00:00:02), DSCP 26, ECT(0), P_Key 0xffff. The frame the wire tests, the
    /// simulator's tests and the wire benchmarks start from; change fields with struct update
    /// syntax.
    pub fn example(opcode: u8, dest_qp: u32, psn: u32) -> RoceRepr {
        RoceRepr {
            eth: eth::Repr {
                dst: [2, 0, 0, 0, 0, 2],
                src: [2, 0, 0, 0, 0, 1],
                vlan: None,
                ethertype: 0,
            },
            ip: IpRepr::V4(ipv4::Repr {
                dscp: 26,
                ecn: Ecn::Ect0,
                ident: 0,
                flags_frag: 0x4000,
                ttl: 64,
                protocol: ipv4::PROTO_UDP,
                src: core::net::Ipv4Addr::new(10, 0, 0, 1),
                dst: core::net::Ipv4Addr::new(10, 0, 0, 2),
            }),
            udp: udp::Repr {
                src_port: 0xc000,
                dst_port: udp::ROCEV2_PORT,
                checksum: 0,
            },
            bth: bth::Repr {
                opcode,
                pkey: 0xffff,
                dest_qp,
                psn: Psn::new(psn),
                ..Default::default()
            },
            ext: ExtRepr::default(),
        }
    }

    #[inline]
    /// Parses every header of a packet already checked by [`parse`].
    pub fn parse(frame: &[u8], info: &PacketInfo) -> Result<RoceRepr> {
        let f = eth::Frame::new_checked(frame)?;
        let l3 = &frame[info.l3_off as usize..];
        let ip = match info.src_ip {
            IpAddr::V4(_) => IpRepr::V4(ipv4::Repr::parse(&ipv4::Header::new_checked(l3)?)?),
            IpAddr::V6(_) => IpRepr::V6(ipv6::Repr::parse(&ipv6::Header::new_checked(l3)?)?),
        };
        let udp_at = info.bth_off as usize - udp::HEADER_LEN;
        let udp = udp::Repr::parse(&udp::Header::new_checked(&frame[udp_at..])?)?;
        let bth = bth::Repr::parse(&bth::Header::new_checked(&frame[info.bth_off as usize..])?)?;
        let ext = info.ext.repr();
        Ok(RoceRepr {
            eth: eth::Repr::parse(&f)?,
            ip,
            udp,
            bth,
            ext,
        })
    }

    #[inline]
    /// The opcode's table entry.
    pub fn op(&self) -> &'static OpInfo {
        lookup(self.bth.opcode)
    }

    #[inline]
    /// Bytes of headers in front of the payload.
    pub fn header_len(&self) -> usize {
        self.eth.buffer_len() + self.ip.len() + udp::HEADER_LEN + self.op().length as usize
    }

    #[inline]
    /// Bytes after the payload: pad and ICRC.
    pub fn trailer_len(payload_len: usize) -> usize {
        (4 - payload_len % 4) % 4 + icrc::LEN
    }

    #[inline]
    /// The whole frame's length for `payload_len` bytes of payload.
    pub fn frame_len(&self, payload_len: usize) -> usize {
        self.header_len() + payload_len + Self::trailer_len(payload_len)
    }

    #[inline]
    /// Writes the headers, pad and ICRC around a payload already at
    /// `frame[header_len()..header_len() + payload_len]`; `frame` must be exactly
    /// [`frame_len`](Self::frame_len) long. With `ipv4_cksum_offload` the IPv4 checksum is
    /// left 0 for the port to fill (the ICRC does not cover it).
    pub fn emit(
        &self,
        frame: &mut [u8],
        payload_len: usize,
        ipv4_cksum_offload: bool,
    ) -> Result<()> {
        if frame.len() != self.frame_len(payload_len) {
            return Err(Error::BadLength);
        }
        let head = self.header_len();
        self.emit_headers(&mut frame[..head], payload_len, ipv4_cksum_offload)?;
        let pad = (4 - payload_len % 4) % 4;
        let payload_end = head + payload_len;
        frame[payload_end..payload_end + pad].fill(0);
        let icrc_at = payload_end + pad;
        let l3_off = self.eth.buffer_len();
        let c = icrc::compute(&frame[l3_off..icrc_at], matches!(self.ip, IpRepr::V6(_)))?;
        frame[icrc_at..icrc_at + icrc::LEN].copy_from_slice(&c.to_le_bytes());
        Ok(())
    }

    #[inline]
    /// Writes the headers (Ethernet to the last extension header, [`header_len`](Self::header_len)
    /// bytes, all of `head`) of a packet that will carry `payload_len` bytes of payload.
    pub fn emit_headers(
        &self,
        head: &mut [u8],
        payload_len: usize,
        ipv4_cksum_offload: bool,
    ) -> Result<()> {
        let op = self.op();
        if !op.is_valid() {
            return Err(Error::UnknownOpcode);
        }
        if head.len() != self.header_len() {
            return Err(Error::BadLength);
        }
        let frame = head;
        let pad = (4 - payload_len % 4) % 4;
        let mut eth = self.eth;
        eth.ethertype = match self.ip {
            IpRepr::V4(_) => eth::ETHERTYPE_IPV4,
            IpRepr::V6(_) => eth::ETHERTYPE_IPV6,
        };
        eth.emit(frame);
        let l3_off = eth.buffer_len();
        let l4_len = udp::HEADER_LEN + op.length as usize + payload_len + pad + icrc::LEN;
        let l4_off = l3_off + self.ip.len();
        match &self.ip {
            IpRepr::V4(r) => r.emit(&mut frame[l3_off..], l4_len, ipv4_cksum_offload),
            IpRepr::V6(r) => r.emit(&mut frame[l3_off..], l4_len),
        }
        self.udp.emit(&mut frame[l4_off..], l4_len as u16);
        let bth_off = l4_off + udp::HEADER_LEN;
        let mut b = self.bth;
        b.pad_count = pad as u8;
        b.emit(&mut bth::Header::new_unchecked(
            &mut frame[bth_off..bth_off + bth::HEADER_LEN],
        ));
        emit_ext(op, &self.ext, frame, bth_off);
        Ok(())
    }
}

/// Writes the extension headers `op` has (those `ext` holds) after the BTH at `bth_off`.
#[inline(always)]
fn emit_ext(op: &OpInfo, ext: &ExtRepr, frame: &mut [u8], bth_off: usize) {
    // By the combinations the opcode table has (the `ext_combinations` test holds the table to
    // them): a first header, and at most one after it. Tested header by header, every opcode
    // paid eight mask-and-option tests (stream_cost).
    let o = op.offset;
    let at = |off: u8| bth_off + off as usize;
    #[inline(always)]
    fn imm(op: &OpInfo, ext: &ExtRepr, frame: &mut [u8], at: usize) {
        if let (true, Some(v)) = (op.has(mask::IMMDT), ext.immdt) {
            immdt::Repr { imm: v }.emit(&mut immdt::Header::new_unchecked(&mut frame[at..]));
        }
    }
    if op.has(mask::RETH) {
        if let Some(r) = ext.reth {
            r.emit(&mut reth::Header::new_unchecked(&mut frame[at(o.reth)..]));
        }
        return imm(op, ext, frame, at(o.immdt));
    }
    if op.has(mask::DETH) {
        if let Some(r) = ext.deth {
            r.emit(&mut deth::Header::new_unchecked(&mut frame[at(o.deth)..]));
        }
        return imm(op, ext, frame, at(o.immdt));
    }
    if op.has(mask::AETH) {
        if let Some(r) = ext.aeth {
            r.emit(&mut aeth::Header::new_unchecked(&mut frame[at(o.aeth)..]));
        }
        if let (true, Some(r)) = (op.has(mask::ATMACK), ext.atomic_ack) {
            r.emit(&mut atomic_ack_eth::Header::new_unchecked(
                &mut frame[at(o.atmack)..],
            ));
        }
        return;
    }
    if op.has(mask::ATMETH) {
        if let Some(r) = ext.atomic_eth {
            r.emit(&mut atomic_eth::Header::new_unchecked(
                &mut frame[at(o.atmeth)..],
            ));
        }
        return;
    }
    if op.has(mask::IETH) {
        if let Some(v) = ext.ieth {
            ieth::Repr { rkey: v }.emit(&mut ieth::Header::new_unchecked(&mut frame[at(o.ieth)..]));
        }
        return;
    }
    if op.has(mask::CNP) {
        frame[bth_off + bth::HEADER_LEN..bth_off + op.length as usize].fill(0);
        return;
    }
    imm(op, ext, frame, at(o.immdt))
}

/// The Ethernet, IPv4 and UDP headers of one path's frames as bytes, with what changes from
/// packet to packet (the IPv4 total length and checksum, the UDP length) left zero, and the
/// IPv4 header's one's complement sum without them. [`build_templated`] builds a frame to
/// that path by copying these bytes and patching the three fields, instead of emitting each
/// field of a [`RoceRepr`]: a QP keeps one for its path. IPv4 only: over IPv6 the UDP checksum
/// covers the payload, and [`build`] does that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Template {
    bytes: [u8; Template::MAX],
    /// Bytes used: Ethernet (with its VLAN tag, if any), IPv4, UDP.
    len: u8,
    /// Where the IPv4 header starts.
    l3: u8,
    /// [`ipv4::ones_sum`] of the IPv4 header with zero total length and checksum.
    sum: u64,
}

impl Template {
    const MAX: usize = eth::HEADER_LEN + eth::VLAN_TAG_LEN + ipv4::HEADER_LEN + udp::HEADER_LEN;

    /// The template of `repr`'s Ethernet, IP and UDP headers (its BTH and extension headers
    /// are not in it); `None` over IPv6.
    pub fn new(repr: &RoceRepr) -> Option<Template> {
        let IpRepr::V4(ip) = &repr.ip else {
            return None;
        };
        let mut e = repr.eth;
        e.ethertype = eth::ETHERTYPE_IPV4;
        let l3 = e.buffer_len();
        let mut bytes = [0u8; Self::MAX];
        e.emit(&mut bytes);
        ip.emit(&mut bytes[l3..l3 + ipv4::HEADER_LEN], 0, true);
        bytes[l3 + 2..l3 + 4].fill(0);
        let u = l3 + ipv4::HEADER_LEN;
        repr.udp.emit(&mut bytes[u..u + udp::HEADER_LEN], 0);
        Some(Template {
            bytes,
            len: (u + udp::HEADER_LEN) as u8,
            l3: l3 as u8,
            sum: ipv4::ones_sum(0, &bytes[l3..l3 + ipv4::HEADER_LEN]),
        })
    }
}

#[inline]
/// [`build`] for a frame whose Ethernet, IPv4 and UDP headers are `t`'s: the same bytes (the
/// tests hold the two to each other), from a copy of the template, three patched fields, the
/// BTH and the extension headers.
pub fn build_templated<B: PacketBuf>(
    buf: &mut B,
    t: &Template,
    bth: &bth::Repr,
    ext: &ExtRepr,
    offload: bool,
) -> Result<()> {
    let op = lookup(bth.opcode);
    if !op.is_valid() {
        return Err(Error::UnknownOpcode);
    }
    let payload_len = buf.len();
    let (fixed, l3) = (t.len as usize, t.l3 as usize);
    let head = fixed + op.length as usize;
    let pad = (4 - payload_len % 4) % 4;
    if buf.prepend(head).is_none() {
        return Err(Error::Truncated);
    }
    if buf.append(pad + icrc::LEN).is_none() {
        buf.adj(head);
        return Err(Error::Truncated);
    }
    let d = buf.data_mut();
    // All of the template's bytes, a fixed-size copy (no memcpy call): past `fixed` they are
    // zero and land in the BTH, written below. The headers are at least that long.
    const _: () = assert!(
        Template::MAX <= eth::HEADER_LEN + ipv4::HEADER_LEN + udp::HEADER_LEN + bth::HEADER_LEN
    );
    d[..Template::MAX].copy_from_slice(&t.bytes);
    let l4_len = udp::HEADER_LEN + op.length as usize + payload_len + pad + icrc::LEN;
    let total = ipv4::HEADER_LEN + l4_len;
    d[l3 + 2..l3 + 4].copy_from_slice(&(total as u16).to_be_bytes());
    if !offload {
        let c = ipv4::fold(t.sum + total as u64);
        d[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
    }
    let u = l3 + ipv4::HEADER_LEN;
    d[u + 4..u + 6].copy_from_slice(&(l4_len as u16).to_be_bytes());
    let bth_off = fixed;
    let mut b = *bth;
    b.pad_count = pad as u8;
    b.emit(&mut bth::Header::new_unchecked(
        &mut d[bth_off..bth_off + bth::HEADER_LEN],
    ));
    emit_ext(op, ext, d, bth_off);
    let payload_end = head + payload_len;
    for b in &mut d[payload_end..payload_end + pad] {
        *b = 0; // at most 3: a loop, not a memset call
    }
    let icrc_at = payload_end + pad;
    // A template's IP header is IPv4 without options (Template::new), and the BTH follows it.
    let c = icrc::compute_v4(&d[l3..icrc_at]);
    d[icrc_at..icrc_at + icrc::LEN].copy_from_slice(&c.to_le_bytes());
    if offload {
        buf.request_tx_offload(TxOffload {
            l2_len: l3 as u16,
            l3_len: ipv4::HEADER_LEN as u16,
            ipv4_cksum: true,
            ..Default::default()
        });
    }
    Ok(())
}

#[inline]
/// Builds a packet around the payload a buffer holds: grows it into its headroom for the
/// headers and its tailroom for the pad and ICRC, writes them all, and asks the port for the
/// IPv4 checksum when `offload` (the port has the capability).
///
/// Over IPv6 the UDP checksum is computed (RFC 8200 makes it mandatory there, Wireshark flags
/// a zero as an error, and any receiver accepts a correct one), whatever `repr.udp.checksum`
/// says; rxe sends zero. Over IPv4 it is `repr.udp.checksum`, normally zero as RoCEv2 sends it.
pub fn build<B: PacketBuf>(buf: &mut B, repr: &RoceRepr, offload: bool) -> Result<()> {
    let payload_len = buf.len();
    let head = repr.header_len();
    let tail = RoceRepr::trailer_len(payload_len);
    if buf.prepend(head).is_none() {
        return Err(Error::Truncated);
    }
    if buf.append(tail).is_none() {
        buf.adj(head);
        return Err(Error::Truncated);
    }
    let v4 = matches!(repr.ip, IpRepr::V4(_));
    repr.emit(buf.data_mut(), payload_len, offload && v4)?;
    if let IpRepr::V6(ip) = &repr.ip {
        let udp_at = repr.eth.buffer_len() + ipv6::HEADER_LEN;
        let d = buf.data_mut();
        d[udp_at + 6..udp_at + 8].fill(0);
        let c = udp::checksum_v6(&ip.src, &ip.dst, &d[udp_at..]);
        d[udp_at + 6..udp_at + 8].copy_from_slice(&c.to_be_bytes());
    }
    if offload && v4 {
        buf.request_tx_offload(TxOffload {
            l2_len: repr.eth.buffer_len() as u16,
            l3_len: ipv4::HEADER_LEN as u16,
            ipv4_cksum: true,
            ..Default::default()
        });
    }
    Ok(())
}

#[inline]
/// Builds an IPv4 packet whose payload is `len` bytes of `mem` at `off`, carried without a copy:
/// the headers in `buf` (emptied first), the payload attached after them as a segment of its
/// own, the pad and ICRC in a last small segment; the ICRC is computed over the payload where
/// it lies. `Ok(false)`, with `buf` empty, where it cannot be done so (IPv6, whose UDP checksum
/// would need the payload summed too; a buffer or memory that cannot attach): the caller
/// copies instead.
pub fn build_attached<B: PacketBuf>(
    buf: &mut B,
    repr: &RoceRepr,
    mem: &dyn crate::buf::PayloadMem,
    off: usize,
    len: usize,
    offload: bool,
) -> Result<bool> {
    let IpRepr::V4(_) = repr.ip else {
        return Ok(false);
    };
    if off.checked_add(len).is_none_or(|e| e > mem.len()) || !buf.reset() {
        return Ok(false);
    }
    let head = repr.header_len();
    let Some(h) = buf.append(head) else {
        return Err(Error::Truncated);
    };
    repr.emit_headers(h, len, offload)?;
    let l3 = repr.eth.buffer_len();
    let crc = icrc::compute(&buf.data()[l3..], false)?;
    let crc = mem.crc32(crc, off, len);
    let pad = (4 - len % 4) % 4;
    let crc = if pad > 0 {
        let mut h = crc32fast::Hasher::new_with_initial(crc);
        h.update(&[0u8; 3][..pad]);
        h.finalize()
    } else {
        crc
    };
    let Some(t) = buf.attach_payload(mem, off, len, pad + icrc::LEN) else {
        buf.reset();
        return Ok(false);
    };
    t[..pad].fill(0);
    t[pad..].copy_from_slice(&crc.to_le_bytes());
    if offload {
        buf.request_tx_offload(TxOffload {
            l2_len: repr.eth.buffer_len() as u16,
            l3_len: ipv4::HEADER_LEN as u16,
            ipv4_cksum: true,
            ..Default::default()
        });
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::HeapBuf;
    use crate::opcode::op;

    #[inline]
    fn repr(opcode: u8) -> RoceRepr {
        let r = RoceRepr::example(opcode, 0x11, 5);
        RoceRepr {
            ip: IpRepr::V4(ipv4::Repr {
                ident: 7,
                ..match r.ip {
                    IpRepr::V4(v4) => v4,
                    IpRepr::V6(_) => unreachable!("example is IPv4"),
                }
            }),
            udp: udp::Repr {
                src_port: 0xc123,
                ..r.udp
            },
            bth: bth::Repr {
                ack_req: true,
                ..r.bth
            },
            ext: ExtRepr {
                reth: Some(reth::Repr {
                    va: 0x1000,
                    rkey: 0x42,
                    dma_len: 7,
                }),
                immdt: Some(0xabcd),
                ..Default::default()
            },
            ..r
        }
    }

    /// A heap buffer that keeps what a frame asked of the offloads.
    struct Recording(HeapBuf, Option<TxOffload>);

    impl PacketBuf for Recording {
        crate::buf::delegate_heap_buf!();
        fn append(&mut self, len: usize) -> Option<&mut [u8]> {
            self.0.append(len)
        }
        fn request_tx_offload(&mut self, req: TxOffload) {
            self.1 = Some(req);
        }
    }

    #[test]
    fn a_templated_frame_is_the_built_one() {
        // Every opcode the table has, tagged and not, DSCP/ECN set, payloads of each pad
        // length and a long one, with and without the checksum offload.
        let payloads = [0usize, 1, 2, 3, 4, 61, 64, 1000];
        let mut checked = 0;
        for code in 0..=255u8 {
            if !lookup(code).is_valid() {
                continue;
            }
            for vlan in [
                None,
                Some(eth::VlanTag {
                    pcp: 3,
                    dei: false,
                    vid: 100,
                }),
            ] {
                let mut r = repr(code);
                r.eth.vlan = vlan;
                if let IpRepr::V4(ip) = &mut r.ip {
                    ip.dscp = 26;
                    ip.ecn = Ecn::from_bits(2);
                    ip.ident = 0;
                }
                r.ext.deth = Some(deth::Repr {
                    qkey: 0x1111_2222,
                    resv8: 0,
                    src_qp: 0x33,
                });
                r.ext.aeth = Some(aeth::Repr {
                    syndrome: aeth::Syndrome::Ack { credits: 31 },
                    msn: 9,
                });
                r.ext.atomic_eth = Some(atomic_eth::Repr {
                    va: 0x2000,
                    rkey: 0x55,
                    swap_add: 3,
                    compare: 4,
                });
                r.ext.atomic_ack = Some(atomic_ack_eth::Repr { orig: 0x99 });
                r.ext.ieth = Some(0x77);
                let t = Template::new(&r).expect("IPv4");
                for &len in &payloads {
                    for offload in [false, true] {
                        let body: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
                        let mut a = Recording(HeapBuf::new(), None);
                        a.append(len).unwrap().copy_from_slice(&body);
                        let mut b = Recording(HeapBuf::new(), None);
                        b.append(len).unwrap().copy_from_slice(&body);
                        let ra = build(&mut a, &r, offload);
                        let rb = build_templated(&mut b, &t, &r.bth, &r.ext, offload);
                        assert_eq!(ra, rb, "opcode {code:#x} len {len}");
                        assert_eq!(
                            a.data(),
                            b.data(),
                            "opcode {code:#x} len {len} offload {offload}"
                        );
                        assert_eq!(a.1, b.1, "opcode {code:#x}: the same offload request");
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 500, "{checked}");
        let mut v6 = repr(op::RC_SEND_ONLY);
        v6.ip = IpRepr::V6(ipv6::Repr {
            traffic_class: 0,
            flow_label: 0,
            next_header: ipv4::PROTO_UDP,
            hop_limit: 64,
            src: core::net::Ipv6Addr::LOCALHOST,
            dst: core::net::Ipv6Addr::LOCALHOST,
        });
        assert_eq!(
            Template::new(&v6),
            None,
            "over IPv6 the UDP checksum needs the payload"
        );
        let mut b = HeapBuf::new();
        let t = Template::new(&repr(op::RC_SEND_ONLY)).unwrap();
        let bad = bth::Repr {
            opcode: 0x1f,
            ..repr(op::RC_SEND_ONLY).bth
        };
        assert_eq!(
            build_templated(&mut b, &t, &bad, &ExtRepr::default(), false),
            Err(Error::UnknownOpcode)
        );
        assert_eq!(b.len(), 0, "a refused frame leaves the buffer as it was");
    }

    /// Plain bytes as attachable memory, for the test below.
    struct Bytes(Vec<u8>);

    impl crate::buf::PayloadMem for Bytes {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn crc32(&self, crc: u32, off: usize, len: usize) -> u32 {
            let mut h = crc32fast::Hasher::new_with_initial(crc);
            h.update(&self.0[off..off + len]);
            h.finalize()
        }
    }

    /// A heap buffer whose "attachment" copies the bytes after the frame: the frame it ends
    /// up with is the one a port sends from the chained segments.
    struct CopyAttach(HeapBuf);

    impl PacketBuf for CopyAttach {
        crate::buf::delegate_heap_buf!();
        fn append(&mut self, len: usize) -> Option<&mut [u8]> {
            self.0.append(len)
        }
        fn attach_payload(
            &mut self,
            mem: &dyn crate::buf::PayloadMem,
            off: usize,
            len: usize,
            tail: usize,
        ) -> Option<&mut [u8]> {
            let any: &dyn core::any::Any = mem;
            let bytes = any.downcast_ref::<Bytes>()?;
            self.0
                .append(len)?
                .copy_from_slice(&bytes.0[off..off + len]);
            self.0.append(tail)
        }
    }

    #[test]
    fn attached_payload_makes_the_same_frame_as_a_copied_one() {
        let pattern: Vec<u8> = (0..16384u32).map(|i| (i * 13 + i / 256) as u8).collect();
        let mem = Bytes(pattern.clone());
        for (opcode, len, off) in [
            (op::RC_WRITE_MIDDLE, 4096, 0),
            (op::RC_WRITE_ONLY_IMM, 2049, 77),
            (op::RC_WRITE_LAST, 2050, 4096),
            (op::RC_READ_RESPONSE_FIRST, 2051, 1),
            (op::RC_SEND_ONLY, 4096, 12288),
        ] {
            let mut r = repr(opcode);
            if opcode == op::RC_READ_RESPONSE_FIRST {
                r.ext.aeth = Some(aeth::Repr {
                    syndrome: aeth::Syndrome::Ack { credits: 31 },
                    msn: 3,
                });
            }
            let mut a = CopyAttach(HeapBuf::new());
            assert_eq!(build_attached(&mut a, &r, &mem, off, len, false), Ok(true));
            let mut c = HeapBuf::new();
            c.append(len)
                .unwrap()
                .copy_from_slice(&pattern[off..off + len]);
            build(&mut c, &r, false).unwrap();
            assert_eq!(a.data(), c.data(), "opcode {opcode:#x}, {len} B");
            let info = parse(a.data(), Checks::ALL).unwrap();
            assert_eq!(info.payload(a.data()), &pattern[off..off + len]);
        }
        // IPv6 is left to the copy (its UDP checksum covers the payload), and a buffer that
        // cannot attach says so and is left empty.
        let mut r6 = repr(op::RC_WRITE_MIDDLE);
        r6.ip = IpRepr::V6(ipv6::Repr {
            traffic_class: 0,
            flow_label: 0,
            next_header: 17,
            hop_limit: 64,
            src: "fd00::1".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
        });
        let mut a = CopyAttach(HeapBuf::new());
        assert_eq!(build_attached(&mut a, &r6, &mem, 0, 4096, false), Ok(false));
        let mut h = HeapBuf::new();
        assert_eq!(
            build_attached(&mut h, &repr(op::RC_WRITE_MIDDLE), &mem, 0, 4096, false),
            Ok(false)
        );
        assert!(h.is_empty());
        // A range outside the memory is refused before anything is read.
        let mut a = CopyAttach(HeapBuf::new());
        let r = build_attached(&mut a, &repr(op::RC_WRITE_MIDDLE), &mem, 16000, 4096, false);
        assert_eq!(r, Ok(false));
        assert!(a.is_empty());
    }

    #[test]
    fn build_then_parse_gives_back_every_field() {
        let r = repr(op::RC_WRITE_ONLY_IMM);
        let mut b = HeapBuf::from_slice(b"seven!!");
        build(&mut b, &r, false).unwrap();
        assert_eq!(b.len(), r.frame_len(7));
        let info = parse(b.data(), Checks::ALL).unwrap();
        assert_eq!(
            (info.opcode, info.dest_qp, info.psn, info.pad),
            (op::RC_WRITE_ONLY_IMM, 0x11, Psn::new(5), 1)
        );
        assert_eq!(info.payload(b.data()), b"seven!!");
        assert_eq!(info.ext.reth().unwrap().rkey, 0x42);
        assert_eq!(info.ext.immdt(), Some(0xabcd));
        assert_eq!(info.ecn, Ecn::Ect0);
        let back = RoceRepr::parse(b.data(), &info).unwrap();
        let mut want = r;
        want.eth.ethertype = eth::ETHERTYPE_IPV4;
        want.bth.pad_count = 1;
        want.ext = ExtRepr {
            reth: r.ext.reth,
            immdt: r.ext.immdt,
            ..Default::default()
        };
        assert_eq!(back, want);
    }

    #[test]
    fn rejects_say_why() {
        let r = repr(op::RC_SEND_ONLY);
        let mut b = HeapBuf::from_slice(&[1, 2, 3, 4]);
        build(&mut b, &r, false).unwrap();
        let good = b.data().to_vec();
        assert!(parse(&good, Checks::ALL).is_ok());
        let mut x = good.clone();
        let n = x.len();
        x[n - 1] ^= 1;
        assert_eq!(parse(&x, Checks::ALL), Err(Error::BadIcrc));
        assert!(parse(&x, Checks::NONE).is_ok());
        let mut x = good.clone();
        x[14 + 28] = 0x15; // an opcode nobody defined
        assert_eq!(parse(&x, Checks::NONE), Err(Error::UnknownOpcode));
        let mut x = good.clone();
        x[14 + 28 + 1] |= 0x01; // TVer 1
        assert_eq!(parse(&x, Checks::NONE), Err(Error::BadVersion));
        // A pad count on an opcode without payload.
        let mut ack = repr(op::RC_ACK);
        ack.ext.aeth = Some(aeth::Repr {
            syndrome: aeth::Syndrome::Ack { credits: 31 },
            msn: 1,
        });
        let mut a = HeapBuf::new();
        build(&mut a, &ack, false).unwrap();
        assert!(parse(a.data(), Checks::ALL).is_ok());
        let mut x = a.data().to_vec();
        x[14 + 28 + 1] |= 0x10;
        assert_eq!(parse(&x, Checks::NONE), Err(Error::PadMismatch));
        assert_eq!(
            parse(&good[..good.len() - 3], Checks::NONE),
            Err(Error::Truncated)
        );
        let mut x = good.clone();
        x[14 + 22] = 0x13; // UDP port 5047
        assert_eq!(parse(&x, Checks::NONE), Err(Error::NotRoce));
        let mut x = good.clone();
        x[14 + 10] ^= 0xff;
        assert_eq!(parse(&x, Checks::ALL), Err(Error::BadChecksum));
        for cut in 0..good.len() {
            let _ = parse(&good[..cut], Checks::ALL);
        }
    }

    #[test]
    fn ipv6_packets_carry_a_correct_udp_checksum() {
        let mut r = repr(op::RC_SEND_ONLY);
        let (src, dst) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        r.ip = IpRepr::V6(ipv6::Repr {
            traffic_class: 2,
            flow_label: 0,
            next_header: 17,
            hop_limit: 64,
            src,
            dst,
        });
        let mut b = HeapBuf::from_slice(&[7; 33]);
        build(&mut b, &r, false).unwrap();
        assert!(parse(b.data(), Checks::ALL).is_ok());
        let udp = &b.data()[14 + 40..];
        assert_ne!(u16::from_be_bytes([udp[6], udp[7]]), 0);
        // Summing the datagram with its checksum in place gives all ones.
        let mut s = ipv4::ones_sum(0, &src.octets());
        s = ipv4::ones_sum(s, &dst.octets());
        s += udp.len() as u64 + 17;
        assert_eq!(ipv4::fold(ipv4::ones_sum(s, udp)), 0);
    }

    #[test]
    fn offloaded_checksum_is_left_zero_and_icrc_still_verifies() {
        let r = repr(op::RC_SEND_ONLY);
        let mut b = HeapBuf::from_slice(&[9; 8]);
        build(&mut b, &r, true).unwrap();
        assert_eq!(&b.data()[24..26], &[0, 0]);
        assert!(
            parse(
                b.data(),
                Checks {
                    icrc: true,
                    ipv4_checksum: false
                }
            )
            .is_ok()
        );
    }
}
