//! The communication manager's MADs (management class 0x07, class version 2; IBTA Vol. 1
//! chapter 12.6), and the header librdmacm puts in front of a REQ's (or SIDR_REQ's) private data.
//!
//! A connection is a three-way handshake, REQ -> REP -> RTU, between an active side and a passive
//! side listening on a service ID; MRA says "I need longer", REJ refuses (with a reason), and
//! DREQ/DREP tear the connection down. SIDR_REQ/SIDR_REP resolve a service ID to a UD QP and
//! its Q_Key. Each side names the connection by a 32-bit communication ID of its own; a message
//! carries the sender's ("local") and, once known, the receiver's ("remote").
//!
//! Every message is a Send with a fixed layout in the 232 bytes after the MAD header, and ends
//! in private data the consumer owns. Fields are big-endian and pack into bytes MSB first (a
//! 24-bit QPN sits in the top three bytes of a 32-bit word whose low byte is another field; a
//! 5-bit timeout is a byte's top five bits): [`Message::parse`] reads them, [`Message::emit`]
//! writes them with every reserved bit zero, so `parse(emit(m)) == m` for any message and
//! `emit(parse(b)) == b` for bytes whose reserved bits are zero (as Linux's are).
//!
//! The layouts are the IBTA's tables 106-120 (Linux names the same offsets in
//! `include/rdma/ibta_vol1_c12.h`). LAP and APR (alternate paths) are not taken: RoCE has one path.
//!
//! rdma_cm's service IDs live in port spaces: `0x0000_0000_01PP_pppp` for port space PP (TCP
//! 0x06, UDP 0x11, IB 0x3F, IPoIB 0x02 with its own prefix) and port pppp; [`service_id`] and
//! [`split_service_id`] go between the two. Its private data header ([`CmaHeader`]) carries the
//! IP addresses the connection was made between (so the passive side knows the client's address
//! and port as a socket would) in its first 36 bytes.

use crate::mad::{self, DATA_LEN, Mad, MadError, Result};
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Attribute IDs (IBTA table 104).
pub mod attr {
    /// ClassPortInfo.
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// ConnectRequest.
    pub const REQ: u16 = 0x0010;
    /// MsgRcptAck.
    pub const MRA: u16 = 0x0011;
    /// ConnectReject.
    pub const REJ: u16 = 0x0012;
    /// ConnectReply.
    pub const REP: u16 = 0x0013;
    /// ReadyToUse.
    pub const RTU: u16 = 0x0014;
    /// DisconnectRequest.
    pub const DREQ: u16 = 0x0015;
    /// DisconnectReply.
    pub const DREP: u16 = 0x0016;
    /// ServiceIDResReq.
    pub const SIDR_REQ: u16 = 0x0017;
    /// ServiceIDResReqResp.
    pub const SIDR_REP: u16 = 0x0018;
    /// LoadAlternatePath.
    pub const LAP: u16 = 0x0019;
    /// AlternatePathResponse.
    pub const APR: u16 = 0x001a;
}

/// The CM's class version.
pub const CLASS_VERSION: u8 = 2;

/// Private data lengths (bytes), per message.
pub mod private_len {
    /// REQ.
    pub const REQ: usize = 92;
    /// MRA.
    pub const MRA: usize = 222;
    /// REJ.
    pub const REJ: usize = 148;
    /// REP.
    pub const REP: usize = 196;
    /// RTU and DREP.
    pub const RTU: usize = 224;
    /// DREQ.
    pub const DREQ: usize = 220;
    /// SIDR_REQ.
    pub const SIDR_REQ: usize = 216;
    /// SIDR_REP.
    pub const SIDR_REP: usize = 136;
}

/// The length of a REJ's additional rejection information and a SIDR_REP's additional
/// information.
pub const ARI_LEN: usize = 72;

// Big-endian fields of the 232-byte data, at constant offsets (out-of-range constants do not
// compile), and sub-byte fields counted from the byte's most significant bit, as IBTA draws them.
type Data = [u8; DATA_LEN];

fn g16(d: &Data, at: usize) -> u16 {
    u16::from_be_bytes([d[at], d[at + 1]])
}
fn g24(d: &Data, at: usize) -> u32 {
    u32::from_be_bytes([0, d[at], d[at + 1], d[at + 2]])
}
fn g32(d: &Data, at: usize) -> u32 {
    u32::from_be_bytes([d[at], d[at + 1], d[at + 2], d[at + 3]])
}
fn g64(d: &Data, at: usize) -> u64 {
    (g32(d, at) as u64) << 32 | g32(d, at + 4) as u64
}
/// `width` bits of byte `at`, starting `off` bits below its most significant bit.
fn gbits(d: &Data, at: usize, off: u32, width: u32) -> u8 {
    (d[at] >> (8 - off - width)) & ((1u16 << width) - 1) as u8
}
fn gbit(d: &Data, at: usize, off: u32) -> bool {
    gbits(d, at, off, 1) == 1
}
fn gbytes<const N: usize>(d: &Data, at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&d[at..at + N]);
    a
}
fn ggid(d: &Data, at: usize) -> Ipv6Addr {
    Ipv6Addr::from(gbytes::<16>(d, at))
}
fn p16(d: &mut Data, at: usize, v: u16) {
    d[at..at + 2].copy_from_slice(&v.to_be_bytes());
}
fn p24(d: &mut Data, at: usize, v: u32) {
    d[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}
fn p32(d: &mut Data, at: usize, v: u32) {
    d[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
fn p64(d: &mut Data, at: usize, v: u64) {
    d[at..at + 8].copy_from_slice(&v.to_be_bytes());
}
/// ORs `v` (masked to `width` bits) into byte `at`, `off` bits below its top.
fn pbits(d: &mut Data, at: usize, off: u32, width: u32, v: u8) {
    d[at] |= (v & ((1u16 << width) - 1) as u8) << (8 - off - width);
}
fn pbytes(d: &mut Data, at: usize, v: &[u8]) {
    d[at..at + v.len()].copy_from_slice(v);
}

/// One path of a REQ (IBTA 12.6.5: 44 bytes, the primary at 52 and the alternate at 96).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Path {
    /// The sender's port LID (0xFFFF on RoCE: "permissive").
    pub local_lid: u16,
    /// The receiver's port LID.
    pub remote_lid: u16,
    /// The sender's GID.
    pub local_gid: Ipv6Addr,
    /// The receiver's GID.
    pub remote_gid: Ipv6Addr,
    /// The GRH flow label (20 bits).
    pub flow_label: u32,
    /// The packet rate (6 bits, IBTA's rate encoding).
    pub packet_rate: u8,
    /// The GRH traffic class (on RoCEv2, the IP TOS byte).
    pub traffic_class: u8,
    /// The GRH hop limit (on RoCEv2, the IP TTL).
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Both ends on one subnet.
    pub subnet_local: bool,
    /// The local ACK timeout: 4.096 us * 2^n (5 bits).
    pub local_ack_timeout: u8,
}

impl Default for Path {
    fn default() -> Self {
        Path {
            local_lid: 0,
            remote_lid: 0,
            local_gid: Ipv6Addr::UNSPECIFIED,
            remote_gid: Ipv6Addr::UNSPECIFIED,
            flow_label: 0,
            packet_rate: 0,
            traffic_class: 0,
            hop_limit: 0,
            sl: 0,
            subnet_local: false,
            local_ack_timeout: 0,
        }
    }
}

impl Path {
    fn parse(d: &Data, at: usize) -> Path {
        Path {
            local_lid: g16(d, at),
            remote_lid: g16(d, at + 2),
            local_gid: ggid(d, at + 4),
            remote_gid: ggid(d, at + 20),
            flow_label: g32(d, at + 36) >> 12,
            packet_rate: gbits(d, at + 39, 2, 6),
            traffic_class: d[at + 40],
            hop_limit: d[at + 41],
            sl: gbits(d, at + 42, 0, 4),
            subnet_local: gbit(d, at + 42, 4),
            local_ack_timeout: gbits(d, at + 43, 0, 5),
        }
    }
    fn emit(&self, d: &mut Data, at: usize) {
        p16(d, at, self.local_lid);
        p16(d, at + 2, self.remote_lid);
        pbytes(d, at + 4, &self.local_gid.octets());
        pbytes(d, at + 20, &self.remote_gid.octets());
        p32(d, at + 36, (self.flow_label & 0xf_ffff) << 12);
        pbits(d, at + 39, 2, 6, self.packet_rate);
        d[at + 40] = self.traffic_class;
        d[at + 41] = self.hop_limit;
        pbits(d, at + 42, 0, 4, self.sl);
        pbits(d, at + 42, 4, 1, self.subnet_local as u8);
        pbits(d, at + 43, 0, 5, self.local_ack_timeout);
    }
}

/// ConnectRequest (IBTA table 106).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Req {
    /// The active side's communication ID.
    pub local_comm_id: u32,
    /// The sender's vendor ID (24 bits).
    pub vendor_id: u32,
    /// The service the active side connects to.
    pub service_id: u64,
    /// The active side's CA GUID.
    pub local_ca_guid: u64,
    /// The active side's Q_Key (RD only).
    pub local_qkey: u32,
    /// The active side's QPN (24 bits).
    pub local_qpn: u32,
    /// The READs and atomics the active side accepts at once (its max_dest_rd_atomic).
    pub responder_resources: u8,
    /// The active side's EE context (RD only, 24 bits).
    pub local_eecn: u32,
    /// The READs and atomics the active side issues at once (its max_rd_atomic).
    pub initiator_depth: u8,
    /// The passive side's EE context (RD only, 24 bits).
    pub remote_eecn: u32,
    /// How long the passive side may take to answer: 4.096 us * 2^n (5 bits).
    pub remote_cm_response_timeout: u8,
    /// Transport service type: 0 RC, 1 UC, 2 RD (2 bits; XRC is extended type 1 over 3).
    pub transport: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// The PSN the active side starts sending with (24 bits): the passive side's rq_psn.
    pub starting_psn: u32,
    /// How long the active side takes to answer: 4.096 us * 2^n (5 bits).
    pub local_cm_response_timeout: u8,
    /// Transport retries (3 bits).
    pub retry_count: u8,
    /// P_Key.
    pub pkey: u16,
    /// Path MTU (4 bits, IBTA's encoding: 1 = 256 ... 5 = 4096).
    pub path_mtu: u8,
    /// RD only.
    pub rdc_exists: bool,
    /// RNR retries (3 bits; 7 = infinite).
    pub rnr_retry_count: u8,
    /// How many times the CM resends this REQ (4 bits).
    pub max_cm_retries: u8,
    /// The active side's QP takes receives from an SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits; 1 = XRC).
    pub extended_transport: u8,
    /// The primary path.
    pub primary: Path,
    /// The alternate path (zero on RoCE).
    pub alternate: Path,
    /// Service access point supported.
    pub sap_supported: bool,
    /// The consumer's private data (rdma_cm: a [`CmaHeader`] and the application's bytes).
    pub private_data: [u8; private_len::REQ],
}

impl Req {
    fn parse(d: &Data) -> Req {
        Req {
            local_comm_id: g32(d, 0),
            vendor_id: g24(d, 5),
            service_id: g64(d, 8),
            local_ca_guid: g64(d, 16),
            local_qkey: g32(d, 28),
            local_qpn: g24(d, 32),
            responder_resources: d[35],
            local_eecn: g24(d, 36),
            initiator_depth: d[39],
            remote_eecn: g24(d, 40),
            remote_cm_response_timeout: gbits(d, 43, 0, 5),
            transport: gbits(d, 43, 5, 2),
            end_to_end_flow_control: gbit(d, 43, 7),
            starting_psn: g24(d, 44),
            local_cm_response_timeout: gbits(d, 47, 0, 5),
            retry_count: gbits(d, 47, 5, 3),
            pkey: g16(d, 48),
            path_mtu: gbits(d, 50, 0, 4),
            rdc_exists: gbit(d, 50, 4),
            rnr_retry_count: gbits(d, 50, 5, 3),
            max_cm_retries: gbits(d, 51, 0, 4),
            srq: gbit(d, 51, 4),
            extended_transport: gbits(d, 51, 5, 3),
            primary: Path::parse(d, 52),
            alternate: Path::parse(d, 96),
            sap_supported: gbit(d, 139, 5),
            private_data: gbytes(d, 140),
        }
    }
    fn emit(&self, d: &mut Data) {
        p32(d, 0, self.local_comm_id);
        p24(d, 5, self.vendor_id);
        p64(d, 8, self.service_id);
        p64(d, 16, self.local_ca_guid);
        p32(d, 28, self.local_qkey);
        p24(d, 32, self.local_qpn);
        d[35] = self.responder_resources;
        p24(d, 36, self.local_eecn);
        d[39] = self.initiator_depth;
        p24(d, 40, self.remote_eecn);
        pbits(d, 43, 0, 5, self.remote_cm_response_timeout);
        pbits(d, 43, 5, 2, self.transport);
        pbits(d, 43, 7, 1, self.end_to_end_flow_control as u8);
        p24(d, 44, self.starting_psn);
        pbits(d, 47, 0, 5, self.local_cm_response_timeout);
        pbits(d, 47, 5, 3, self.retry_count);
        p16(d, 48, self.pkey);
        pbits(d, 50, 0, 4, self.path_mtu);
        pbits(d, 50, 4, 1, self.rdc_exists as u8);
        pbits(d, 50, 5, 3, self.rnr_retry_count);
        pbits(d, 51, 0, 4, self.max_cm_retries);
        pbits(d, 51, 4, 1, self.srq as u8);
        pbits(d, 51, 5, 3, self.extended_transport);
        self.primary.emit(d, 52);
        self.alternate.emit(d, 96);
        pbits(d, 139, 5, 1, self.sap_supported as u8);
        pbytes(d, 140, &self.private_data);
    }
}

/// Which message an MRA or a REJ answers (2 bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsgKind {
    /// A REQ.
    Req,
    /// A REP.
    Rep,
    /// A LAP (MRA) or anything else (REJ).
    Other,
    /// The reserved code 3.
    Reserved,
}

impl MsgKind {
    fn from_bits(b: u8) -> MsgKind {
        match b {
            0 => MsgKind::Req,
            1 => MsgKind::Rep,
            2 => MsgKind::Other,
            _ => MsgKind::Reserved,
        }
    }
    fn bits(self) -> u8 {
        match self {
            MsgKind::Req => 0,
            MsgKind::Rep => 1,
            MsgKind::Other => 2,
            MsgKind::Reserved => 3,
        }
    }
}

/// MsgRcptAck (IBTA table 107): "got it, but I need this long to answer".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mra {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's.
    pub remote_comm_id: u32,
    /// The message being acknowledged.
    pub message_mraed: MsgKind,
    /// How long the sender needs: 4.096 us * 2^n (5 bits), added to the other side's timeout.
    pub service_timeout: u8,
    /// Private data.
    pub private_data: [u8; private_len::MRA],
}

impl Mra {
    fn parse(d: &Data) -> Mra {
        Mra {
            local_comm_id: g32(d, 0),
            remote_comm_id: g32(d, 4),
            message_mraed: MsgKind::from_bits(gbits(d, 8, 0, 2)),
            service_timeout: gbits(d, 9, 0, 5),
            private_data: gbytes(d, 10),
        }
    }
    fn emit(&self, d: &mut Data) {
        p32(d, 0, self.local_comm_id);
        p32(d, 4, self.remote_comm_id);
        pbits(d, 8, 0, 2, self.message_mraed.bits());
        pbits(d, 9, 0, 5, self.service_timeout);
        pbytes(d, 10, &self.private_data);
    }
}

/// Why a connection was refused (IBTA table 109).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejReason {
    /// 1: no QP available.
    NoQp,
    /// 2: no EE context available.
    NoEec,
    /// 3: no resources.
    NoResources,
    /// 4: the sender timed out waiting for the other side.
    Timeout,
    /// 5: unsupported request.
    UnsupportedReq,
    /// 6: invalid communication ID.
    InvalidCommId,
    /// 7: invalid communication instance.
    InvalidCommInstance,
    /// 8: no one listens on the service ID.
    InvalidServiceId,
    /// 9: invalid transport service type.
    InvalidTransportType,
    /// 10: stale connection (the QP is still in use by an old connection).
    StaleConn,
    /// 11: RDC does not exist.
    RdcNotExist,
    /// 12: invalid GID.
    InvalidGid,
    /// 13: invalid LID.
    InvalidLid,
    /// 14: invalid SL.
    InvalidSl,
    /// 15: invalid traffic class.
    InvalidTrafficClass,
    /// 16: invalid hop limit.
    InvalidHopLimit,
    /// 17: invalid packet rate.
    InvalidPacketRate,
    /// 26: invalid MTU.
    InvalidMtu,
    /// 27: insufficient responder resources.
    InsufficientRespResources,
    /// 28: the consumer (the application) refused: rdma_reject.
    ConsumerReject,
    /// 29: invalid RNR retry count.
    InvalidRnrRetry,
    /// 30: duplicate local communication ID.
    DuplicateLocalCommId,
    /// 31: unsupported class version.
    InvalidClassVersion,
    /// 32: invalid flow label.
    InvalidFlowLabel,
    /// Any other code (the alternate-path and redirect codes 18-25, 33 and up).
    Other(u16),
}

impl RejReason {
    const NAMED: [(u16, RejReason, &'static str); 24] = [
        (1, RejReason::NoQp, "no QP"),
        (2, RejReason::NoEec, "no EEC"),
        (3, RejReason::NoResources, "no resources"),
        (4, RejReason::Timeout, "timeout"),
        (5, RejReason::UnsupportedReq, "unsupported request"),
        (6, RejReason::InvalidCommId, "invalid comm ID"),
        (7, RejReason::InvalidCommInstance, "invalid comm instance"),
        (8, RejReason::InvalidServiceId, "invalid service ID"),
        (9, RejReason::InvalidTransportType, "invalid transport type"),
        (10, RejReason::StaleConn, "stale connection"),
        (11, RejReason::RdcNotExist, "RDC does not exist"),
        (12, RejReason::InvalidGid, "invalid GID"),
        (13, RejReason::InvalidLid, "invalid LID"),
        (14, RejReason::InvalidSl, "invalid SL"),
        (15, RejReason::InvalidTrafficClass, "invalid traffic class"),
        (16, RejReason::InvalidHopLimit, "invalid hop limit"),
        (17, RejReason::InvalidPacketRate, "invalid packet rate"),
        (26, RejReason::InvalidMtu, "invalid MTU"),
        (
            27,
            RejReason::InsufficientRespResources,
            "insufficient responder resources",
        ),
        (28, RejReason::ConsumerReject, "consumer reject"),
        (29, RejReason::InvalidRnrRetry, "invalid RNR retry count"),
        (
            30,
            RejReason::DuplicateLocalCommId,
            "duplicate local comm ID",
        ),
        (31, RejReason::InvalidClassVersion, "invalid class version"),
        (32, RejReason::InvalidFlowLabel, "invalid flow label"),
    ];
    /// The reason of a code.
    pub fn from_code(c: u16) -> RejReason {
        Self::NAMED
            .iter()
            .find(|e| e.0 == c)
            .map_or(RejReason::Other(c), |e| e.1)
    }
    /// The reason's code.
    pub fn code(self) -> u16 {
        match self {
            RejReason::Other(c) => c,
            r => Self::NAMED.iter().find(|e| e.1 == r).map_or(0, |e| e.0),
        }
    }
    /// The reason in words.
    pub fn name(self) -> &'static str {
        Self::NAMED
            .iter()
            .find(|e| e.1 == self)
            .map_or("other", |e| e.2)
    }
}

/// ConnectReject (IBTA table 108).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rej {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's (0 if the sender never learned it).
    pub remote_comm_id: u32,
    /// The message refused.
    pub message_rejected: MsgKind,
    /// How many bytes of `ari` count (7 bits).
    pub ari_len: u8,
    /// Why.
    pub reason: RejReason,
    /// Additional rejection information (its meaning depends on the reason).
    pub ari: [u8; ARI_LEN],
    /// Private data (rdma_reject's).
    pub private_data: [u8; private_len::REJ],
}

impl Rej {
    fn parse(d: &Data) -> Rej {
        Rej {
            local_comm_id: g32(d, 0),
            remote_comm_id: g32(d, 4),
            message_rejected: MsgKind::from_bits(gbits(d, 8, 0, 2)),
            ari_len: gbits(d, 9, 0, 7),
            reason: RejReason::from_code(g16(d, 10)),
            ari: gbytes(d, 12),
            private_data: gbytes(d, 84),
        }
    }
    fn emit(&self, d: &mut Data) {
        p32(d, 0, self.local_comm_id);
        p32(d, 4, self.remote_comm_id);
        pbits(d, 8, 0, 2, self.message_rejected.bits());
        pbits(d, 9, 0, 7, self.ari_len);
        p16(d, 10, self.reason.code());
        pbytes(d, 12, &self.ari);
        pbytes(d, 84, &self.private_data);
    }
}

/// ConnectReply (IBTA table 110).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rep {
    /// The passive side's communication ID.
    pub local_comm_id: u32,
    /// The active side's (the REQ's local).
    pub remote_comm_id: u32,
    /// The passive side's Q_Key (RD only).
    pub local_qkey: u32,
    /// The passive side's QPN (24 bits).
    pub local_qpn: u32,
    /// The passive side's EE context (RD only, 24 bits).
    pub local_eecn: u32,
    /// The PSN the passive side starts sending with (24 bits): the active side's rq_psn.
    pub starting_psn: u32,
    /// The sender's vendor ID (24 bits, split over three bytes on the wire).
    pub vendor_id: u32,
    /// The READs and atomics the passive side accepts at once.
    pub responder_resources: u8,
    /// The READs and atomics the passive side issues at once.
    pub initiator_depth: u8,
    /// The passive side's ACK delay: 4.096 us * 2^n (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits: 0 accepted, 1 not supported, 2 rejected).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retries the active side may use (3 bits).
    pub rnr_retry_count: u8,
    /// The passive side's QP takes receives from an SRQ.
    pub srq: bool,
    /// The passive side's CA GUID.
    pub local_ca_guid: u64,
    /// Private data (rdma_accept's).
    pub private_data: [u8; private_len::REP],
}

impl Rep {
    fn parse(d: &Data) -> Rep {
        Rep {
            local_comm_id: g32(d, 0),
            remote_comm_id: g32(d, 4),
            local_qkey: g32(d, 8),
            local_qpn: g24(d, 12),
            local_eecn: g24(d, 16),
            starting_psn: g24(d, 20),
            vendor_id: (d[15] as u32) << 16 | (d[19] as u32) << 8 | d[23] as u32,
            responder_resources: d[24],
            initiator_depth: d[25],
            target_ack_delay: gbits(d, 26, 0, 5),
            failover_accepted: gbits(d, 26, 5, 2),
            end_to_end_flow_control: gbit(d, 26, 7),
            rnr_retry_count: gbits(d, 27, 0, 3),
            srq: gbit(d, 27, 3),
            local_ca_guid: g64(d, 28),
            private_data: gbytes(d, 36),
        }
    }
    fn emit(&self, d: &mut Data) {
        p32(d, 0, self.local_comm_id);
        p32(d, 4, self.remote_comm_id);
        p32(d, 8, self.local_qkey);
        p24(d, 12, self.local_qpn);
        d[15] = (self.vendor_id >> 16) as u8;
        p24(d, 16, self.local_eecn);
        d[19] = (self.vendor_id >> 8) as u8;
        p24(d, 20, self.starting_psn);
        d[23] = self.vendor_id as u8;
        d[24] = self.responder_resources;
        d[25] = self.initiator_depth;
        pbits(d, 26, 0, 5, self.target_ack_delay);
        pbits(d, 26, 5, 2, self.failover_accepted);
        pbits(d, 26, 7, 1, self.end_to_end_flow_control as u8);
        pbits(d, 27, 0, 3, self.rnr_retry_count);
        pbits(d, 27, 3, 1, self.srq as u8);
        p64(d, 28, self.local_ca_guid);
        pbytes(d, 36, &self.private_data);
    }
}

/// The two IDs and private data: ReadyToUse (IBTA table 111) and DisconnectReply (table 113).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ids {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; private_len::RTU],
}

impl Ids {
    fn parse(d: &Data) -> Ids {
        Ids {
            local_comm_id: g32(d, 0),
            remote_comm_id: g32(d, 4),
            private_data: gbytes(d, 8),
        }
    }
    fn emit(&self, d: &mut Data) {
        p32(d, 0, self.local_comm_id);
        p32(d, 4, self.remote_comm_id);
        pbytes(d, 8, &self.private_data);
    }
}

/// DisconnectRequest (IBTA table 112).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dreq {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's.
    pub remote_comm_id: u32,
    /// The receiver's QPN (24 bits): a check that the DREQ is for the QP it names.
    pub remote_qpn: u32,
    /// Private data.
    pub private_data: [u8; private_len::DREQ],
}

impl Dreq {
    fn parse(d: &Data) -> Dreq {
        Dreq {
            local_comm_id: g32(d, 0),
            remote_comm_id: g32(d, 4),
            remote_qpn: g24(d, 8),
            private_data: gbytes(d, 12),
        }
    }
    fn emit(&self, d: &mut Data) {
        p32(d, 0, self.local_comm_id);
        p32(d, 4, self.remote_comm_id);
        p24(d, 8, self.remote_qpn);
        pbytes(d, 12, &self.private_data);
    }
}

/// ServiceIDResReq (IBTA table 119): which UD QP serves this service ID?
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SidrReq {
    /// The requester's ID for this request.
    pub request_id: u32,
    /// P_Key.
    pub pkey: u16,
    /// The service asked for.
    pub service_id: u64,
    /// Private data (rdma_cm: a [`CmaHeader`] first).
    pub private_data: [u8; private_len::SIDR_REQ],
}

impl SidrReq {
    fn parse(d: &Data) -> SidrReq {
        SidrReq {
            request_id: g32(d, 0),
            pkey: g16(d, 4),
            service_id: g64(d, 8),
            private_data: gbytes(d, 16),
        }
    }
    fn emit(&self, d: &mut Data) {
        p32(d, 0, self.request_id);
        p16(d, 4, self.pkey);
        p64(d, 8, self.service_id);
        pbytes(d, 16, &self.private_data);
    }
}

/// A SIDR_REP's status (IBTA table 121).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SidrStatus {
    /// 0: the QPN and Q_Key are valid.
    Ok,
    /// 1: no one serves the service ID.
    NoServiceId,
    /// 2: the consumer refused.
    Rejected,
    /// 3: no QP available.
    NoQp,
    /// 4: redirected (the additional information says where).
    Redirect,
    /// 5: unsupported class version.
    UnsupportedVersion,
    /// Another code.
    Other(u8),
}

impl SidrStatus {
    fn from_code(c: u8) -> SidrStatus {
        match c {
            0 => SidrStatus::Ok,
            1 => SidrStatus::NoServiceId,
            2 => SidrStatus::Rejected,
            3 => SidrStatus::NoQp,
            4 => SidrStatus::Redirect,
            5 => SidrStatus::UnsupportedVersion,
            c => SidrStatus::Other(c),
        }
    }
    /// The status's code.
    pub fn code(self) -> u8 {
        match self {
            SidrStatus::Ok => 0,
            SidrStatus::NoServiceId => 1,
            SidrStatus::Rejected => 2,
            SidrStatus::NoQp => 3,
            SidrStatus::Redirect => 4,
            SidrStatus::UnsupportedVersion => 5,
            SidrStatus::Other(c) => c,
        }
    }
}

/// ServiceIDResReqResp (IBTA table 120).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SidrRep {
    /// The SIDR_REQ's request ID.
    pub request_id: u32,
    /// The answer.
    pub status: SidrStatus,
    /// How many bytes of `additional_info` count.
    pub additional_info_len: u8,
    /// The sender's vendor ID (24 bits, split on the wire).
    pub vendor_id: u32,
    /// The QP serving the service (24 bits).
    pub qpn: u32,
    /// The service ID.
    pub service_id: u64,
    /// The QP's Q_Key.
    pub qkey: u32,
    /// Additional information (a redirect's ClassPortInfo).
    pub additional_info: [u8; ARI_LEN],
    /// Private data.
    pub private_data: [u8; private_len::SIDR_REP],
}

impl SidrRep {
    fn parse(d: &Data) -> SidrRep {
        SidrRep {
            request_id: g32(d, 0),
            status: SidrStatus::from_code(d[4]),
            additional_info_len: d[5],
            vendor_id: (g16(d, 6) as u32) << 8 | d[11] as u32,
            qpn: g24(d, 8),
            service_id: g64(d, 12),
            qkey: g32(d, 20),
            additional_info: gbytes(d, 24),
            private_data: gbytes(d, 96),
        }
    }
    fn emit(&self, d: &mut Data) {
        p32(d, 0, self.request_id);
        d[4] = self.status.code();
        d[5] = self.additional_info_len;
        p16(d, 6, (self.vendor_id >> 8) as u16);
        p24(d, 8, self.qpn);
        d[11] = self.vendor_id as u8;
        p64(d, 12, self.service_id);
        p32(d, 20, self.qkey);
        pbytes(d, 24, &self.additional_info);
        pbytes(d, 96, &self.private_data);
    }
}

/// A CM message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message {
    /// REQ.
    Req(Req),
    /// MRA.
    Mra(Mra),
    /// REJ.
    Rej(Rej),
    /// REP.
    Rep(Rep),
    /// RTU.
    Rtu(Ids),
    /// DREQ.
    Dreq(Dreq),
    /// DREP.
    Drep(Ids),
    /// SIDR_REQ.
    SidrReq(SidrReq),
    /// SIDR_REP.
    SidrRep(SidrRep),
}

impl Message {
    /// Parses a CM MAD: base version 1, class CM, class version 2, method Send, one of the nine
    /// attributes. Returns the common header beside the message (its TID pairs a reply with its
    /// request and a retransmission with the first copy).
    pub fn parse(bytes: &[u8]) -> Result<(mad::Repr, Message)> {
        let m = Mad::new_checked(bytes)?;
        let hdr = mad::Repr::parse(&m)?;
        if hdr.mgmt_class != mad::class::CM {
            return Err(MadError::WrongClass(hdr.mgmt_class));
        }
        if hdr.class_version != CLASS_VERSION {
            return Err(MadError::BadClassVersion(hdr.class_version));
        }
        if hdr.method != mad::method::SEND {
            return Err(MadError::BadMethod(hdr.method));
        }
        let d = m.data();
        let msg = match hdr.attr_id {
            attr::REQ => Message::Req(Req::parse(d)),
            attr::MRA => Message::Mra(Mra::parse(d)),
            attr::REJ => Message::Rej(Rej::parse(d)),
            attr::REP => Message::Rep(Rep::parse(d)),
            attr::RTU => Message::Rtu(Ids::parse(d)),
            attr::DREQ => Message::Dreq(Dreq::parse(d)),
            attr::DREP => Message::Drep(Ids::parse(d)),
            attr::SIDR_REQ => Message::SidrReq(SidrReq::parse(d)),
            attr::SIDR_REP => Message::SidrRep(SidrRep::parse(d)),
            a => return Err(MadError::UnknownAttribute(a)),
        };
        Ok((hdr, msg))
    }

    /// Writes the message as a whole MAD into the first 256 bytes of `out`: a CM Send with
    /// transaction ID `tid`, every reserved bit zero.
    pub fn emit(&self, tid: u64, out: &mut [u8]) -> Result<()> {
        let mut m = Mad::new_checked(out)?;
        mad::Repr {
            mgmt_class: mad::class::CM,
            class_version: CLASS_VERSION,
            method: mad::method::SEND,
            tid,
            attr_id: self.attr_id(),
            ..mad::Repr::default()
        }
        .emit(&mut m);
        let d = m.data_mut();
        d.fill(0);
        match self {
            Message::Req(r) => r.emit(d),
            Message::Mra(r) => r.emit(d),
            Message::Rej(r) => r.emit(d),
            Message::Rep(r) => r.emit(d),
            Message::Rtu(r) | Message::Drep(r) => r.emit(d),
            Message::Dreq(r) => r.emit(d),
            Message::SidrReq(r) => r.emit(d),
            Message::SidrRep(r) => r.emit(d),
        }
        Ok(())
    }

    /// The attribute ID.
    pub fn attr_id(&self) -> u16 {
        match self {
            Message::Req(_) => attr::REQ,
            Message::Mra(_) => attr::MRA,
            Message::Rej(_) => attr::REJ,
            Message::Rep(_) => attr::REP,
            Message::Rtu(_) => attr::RTU,
            Message::Dreq(_) => attr::DREQ,
            Message::Drep(_) => attr::DREP,
            Message::SidrReq(_) => attr::SIDR_REQ,
            Message::SidrRep(_) => attr::SIDR_REP,
        }
    }

    /// The message's name as the IBTA and tshark abbreviate it.
    pub fn name(&self) -> &'static str {
        attr_name(self.attr_id())
    }

    /// The communication IDs (sender's, receiver's); a SIDR message's request ID as both.
    pub fn comm_ids(&self) -> (u32, u32) {
        match self {
            Message::Req(r) => (r.local_comm_id, 0),
            Message::Mra(r) => (r.local_comm_id, r.remote_comm_id),
            Message::Rej(r) => (r.local_comm_id, r.remote_comm_id),
            Message::Rep(r) => (r.local_comm_id, r.remote_comm_id),
            Message::Rtu(r) | Message::Drep(r) => (r.local_comm_id, r.remote_comm_id),
            Message::Dreq(r) => (r.local_comm_id, r.remote_comm_id),
            Message::SidrReq(r) => (r.request_id, r.request_id),
            Message::SidrRep(r) => (r.request_id, r.request_id),
        }
    }

    /// The private data.
    pub fn private_data(&self) -> &[u8] {
        match self {
            Message::Req(r) => &r.private_data,
            Message::Mra(r) => &r.private_data,
            Message::Rej(r) => &r.private_data,
            Message::Rep(r) => &r.private_data,
            Message::Rtu(r) | Message::Drep(r) => &r.private_data,
            Message::Dreq(r) => &r.private_data,
            Message::SidrReq(r) => &r.private_data,
            Message::SidrRep(r) => &r.private_data,
        }
    }
}

/// The name of a CM attribute ID ("attr" for one the CM does not define).
pub fn attr_name(id: u16) -> &'static str {
    match id {
        attr::CLASS_PORT_INFO => "ClassPortInfo",
        attr::REQ => "REQ",
        attr::MRA => "MRA",
        attr::REJ => "REJ",
        attr::REP => "REP",
        attr::RTU => "RTU",
        attr::DREQ => "DREQ",
        attr::DREP => "DREP",
        attr::SIDR_REQ => "SIDR_REQ",
        attr::SIDR_REP => "SIDR_REP",
        attr::LAP => "LAP",
        attr::APR => "APR",
        _ => "attr",
    }
}

/// The bytes of an IBTA path MTU code (1 = 256 ... 5 = 4096), as a REQ carries it.
pub fn path_mtu_bytes(code: u8) -> Option<u32> {
    (1..=5).contains(&code).then(|| 128u32 << code)
}

/// The IBTA code of a path MTU in bytes (256, 512, 1024, 2048 or 4096).
pub fn path_mtu_code(bytes: u32) -> Option<u8> {
    (1..=5u8).find(|&c| 128u32 << c == bytes)
}

/// rdma_cm's port spaces (`enum rdma_ucm_port_space`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// RDMA_PS_TCP: RC connections (rping, perftest -R, NVMe-oF, iSER, SMB Direct).
    Tcp,
    /// RDMA_PS_UDP: UD with SIDR (udaddy).
    Udp,
    /// RDMA_PS_IB: any QP type.
    Ib,
    /// RDMA_PS_IPOIB.
    IpoIb,
}

impl PortSpace {
    /// The port space's number, bits 16-31 of the service ID.
    pub fn number(self) -> u16 {
        match self {
            PortSpace::Tcp => 0x0106,
            PortSpace::Udp => 0x0111,
            PortSpace::Ib => 0x013f,
            PortSpace::IpoIb => 0x0002,
        }
    }
    /// The name librdmacm gives it.
    pub fn name(self) -> &'static str {
        match self {
            PortSpace::Tcp => "RDMA_PS_TCP",
            PortSpace::Udp => "RDMA_PS_UDP",
            PortSpace::Ib => "RDMA_PS_IB",
            PortSpace::IpoIb => "RDMA_PS_IPOIB",
        }
    }
}

/// The Q_Key rdma_cm gives the UD QPs of its UDP port space (`RDMA_UDP_QKEY`), which a
/// SIDR_REP names.
pub const UDP_QKEY: u32 = 0x0123_4567;

/// rdma_cm's service ID of a port in a port space.
pub fn service_id(ps: PortSpace, port: u16) -> u64 {
    (ps.number() as u64) << 16 | port as u64
}

/// The port space and port of an rdma_cm service ID, or `None` for a service ID outside them.
pub fn split_service_id(sid: u64) -> Option<(PortSpace, u16)> {
    let ps = match sid >> 16 {
        0x0106 => PortSpace::Tcp,
        0x0111 => PortSpace::Udp,
        0x013f => PortSpace::Ib,
        0x0002 => PortSpace::IpoIb,
        _ => return None,
    };
    Some((ps, sid as u16))
}

/// librdmacm's (the kernel rdma_cm's) header at the start of a REQ's or SIDR_REQ's private data:
/// `struct cma_hdr`, 36 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmaHeader {
    /// The connecting side's port (its "socket's" source port).
    pub src_port: u16,
    /// The connecting side's address.
    pub src: IpAddr,
    /// The address it connects to.
    pub dst: IpAddr,
}

/// The length of [`CmaHeader`] on the wire.
pub const CMA_HEADER_LEN: usize = 36;
/// The version rdma_cm writes (and the only one it reads).
pub const CMA_VERSION: u8 = 0x00;

impl CmaHeader {
    /// Parses the header from private data: version 0, IP version 4 or 6 in the top nibble; an
    /// IPv4 address is the last 4 bytes of its 16.
    pub fn parse(private_data: &[u8]) -> Result<CmaHeader> {
        let b: &[u8; CMA_HEADER_LEN] = private_data
            .get(..CMA_HEADER_LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or(MadError::Truncated)?;
        if b[0] != CMA_VERSION {
            return Err(MadError::BadField("rdma_cm header version"));
        }
        let addr = |at: usize| -> Result<IpAddr> {
            let mut a = [0u8; 16];
            a.copy_from_slice(&b[at..at + 16]);
            match b[1] >> 4 {
                4 => Ok(IpAddr::V4(Ipv4Addr::new(a[12], a[13], a[14], a[15]))),
                6 => Ok(IpAddr::V6(Ipv6Addr::from(a))),
                _ => Err(MadError::BadField("rdma_cm header IP version")),
            }
        };
        Ok(CmaHeader {
            src_port: u16::from_be_bytes([b[2], b[3]]),
            src: addr(4)?,
            dst: addr(20)?,
        })
    }

    /// Writes the header into the first 36 bytes of private data. Both addresses must be of one
    /// family.
    pub fn emit(&self, private_data: &mut [u8]) -> Result<()> {
        let b = private_data
            .get_mut(..CMA_HEADER_LEN)
            .ok_or(MadError::Truncated)?;
        let (ipv, src, dst) = match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => (4u8, v4_in_16(s), v4_in_16(d)),
            (IpAddr::V6(s), IpAddr::V6(d)) => (6u8, s.octets(), d.octets()),
            _ => return Err(MadError::BadField("rdma_cm header address families")),
        };
        b[0] = CMA_VERSION;
        b[1] = ipv << 4;
        b[2..4].copy_from_slice(&self.src_port.to_be_bytes());
        b[4..20].copy_from_slice(&src);
        b[20..36].copy_from_slice(&dst);
        Ok(())
    }
}

fn v4_in_16(a: Ipv4Addr) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[12..].copy_from_slice(&a.octets());
    b
}

#[cfg(test)]
mod tests;
