//! A reliable-connection QP, sans-IO: requester, responder and completer over the objects in
//! this module's siblings.
//!
//! Requests are planned on demand from the posted work requests, so go-back-N regenerates any
//! packet from its PSN. The responder runs the chain of checks and executes; duplicates are
//! re-ACKed, duplicate READs re-executed from the PSN they ask for, and duplicate atomics
//! answered from a replay cache of original values (never executed twice). The completer
//! matches ACKs, READ responses and atomic ACKs to work requests and completes them in order;
//! a PSN sequence NAK acknowledges everything before it and goes back to it; an RNR NAK waits
//! the timer it names (rnr_retry tries, 7 = forever); the local ACK timeout (4.096 us *
//! 2^timeout) goes back to the oldest unacknowledged PSN (retry_cnt tries); other NAKs complete
//! the request in error, move the QP to ERR and flush the rest. Acknowledgements for PSNs never
//! sent are ignored. Time is passed in: [`RcQp::poll_timeout`] says when
//! [`RcQp::handle_timeout`] is due.
//!
//! The caller owns the memory regions and the CQs and passes them in; frames come in and go
//! out as bytes through the wire code.

use super::cq::{CompletionQueue, WcOpcode, WcStatus, WorkCompletion};
use super::mr::{AtomicOp, MrError, MrTable, PdHandle};
use super::qp::{Path, QpConfig, QpState, QpType};
use super::resp_check::{InMessage, Request, ResponderState, Verdict, check};
use super::wr::{
    ACK_EVERY, MAX_INLINE_DATA, MAX_SGE, Plan, RecvWr, SendOp, SendWr, SgList, Sge, WrError,
    ext_headers, gather, locate, plan,
};
use crate::cc::{Cc, CcKind, DcqcnParams};
use arrayvec::ArrayVec;
use std::collections::VecDeque;
use wire::PacketBuf;
use wire::aeth::{self, NakCode, Syndrome};
use wire::ipv4::{self, Ecn};
use wire::opcode::{mask, op};
use wire::packet::{Checks, ExtRepr, IpRepr, PacketInfo, RoceRepr, build, build_attached, parse};
use wire::time::Instant;
use wire::{Psn, atomic_ack_eth, bth, cnp, deth, eth, ipv6, udp};

/// Why a post was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// The QP is not in a state that takes this post.
    #[error("QP state does not allow this post")]
    BadState,
    /// The queue is full.
    #[error("queue full")]
    Full,
    /// The work request itself is invalid.
    #[error(transparent)]
    Wr(#[from] WrError),
}

#[derive(Debug)]
struct SendWqe {
    wr: SendWr,
    plan: Plan,
    first_psn: Psn,
    /// Message length.
    len: u64,
    /// Where its inline data sits in the QP's inline buffer, if it was posted inline.
    inline_at: Option<usize>,
    /// When it was posted (the QP's latest time then; see [`RcQp::observe`]).
    posted_at: Instant,
}

/// Bytes at the start of every UD receive buffer that hold the datagram's GRH (verbs'
/// `struct ibv_grh`; on RoCEv2 the IPv6 header, or the IPv4 header in the last 20 bytes).
pub const UD_GRH_LEN: usize = 40;

/// Completion latencies a QP holds until its host takes them ([`RcQp::take_latencies`]).
const LATENCY_LOG: usize = 256;

/// What a QP is created with; checked against the device limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Send work requests outstanding at most.
    pub max_send_wr: u32,
    /// Receive work requests outstanding at most.
    pub max_recv_wr: u32,
    /// SG entries per send work request.
    pub max_send_sge: u32,
    /// SG entries per receive work request.
    pub max_recv_sge: u32,
    /// Bytes a send work request may carry inline (copied at post time).
    pub max_inline_data: u32,
    /// Copy payloads into frames even where they could go attached from their region (see
    /// [`ATTACH_MIN`]): for comparisons and for ports that mishandle chained frames.
    pub copy_tx: bool,
    /// RC or UD.
    pub qp_type: QpType,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: MAX_SGE as u32,
            max_recv_sge: MAX_SGE as u32,
            max_inline_data: 0,
            copy_tx: false,
            qp_type: QpType::Rc,
        }
    }
}

/// Most work requests a queue may hold (the device limit).
pub const MAX_QP_WR: u32 = 16384;

/// Why a QP could not be created with the caps asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CapsError {
    /// A cap is zero or above the device limit; names it.
    #[error(
        "{0} is out of range (max_send_wr/max_recv_wr 1-16384, SGEs 1-8, max_inline_data 0-512)"
    )]
    OutOfRange(&'static str),
}

impl QpCaps {
    /// Checks every cap against the device limits.
    pub fn validate(&self) -> Result<(), CapsError> {
        let r = |ok: bool, name| {
            if ok {
                Ok(())
            } else {
                Err(CapsError::OutOfRange(name))
            }
        };
        r((1..=MAX_QP_WR).contains(&self.max_send_wr), "max_send_wr")?;
        r((1..=MAX_QP_WR).contains(&self.max_recv_wr), "max_recv_wr")?;
        r(
            (1..=MAX_SGE as u32).contains(&self.max_send_sge),
            "max_send_sge",
        )?;
        r(
            (1..=MAX_SGE as u32).contains(&self.max_recv_sge),
            "max_recv_sge",
        )?;
        r(self.max_inline_data <= MAX_INLINE_DATA, "max_inline_data")
    }
}

impl SendWqe {
    fn last_psn(&self) -> Psn {
        self.first_psn.add(self.plan.psns - 1)
    }
}

#[derive(Clone, Copy, Debug)]
enum Response {
    Ack {
        psn: Psn,
        syndrome: Syndrome,
        msn: u32,
    },
    Read {
        psn: Psn,
        rkey: u32,
        va: u64,
        len: u32,
        next: u32,
        count: u32,
        msn: u32,
        /// A new READ, counted against max_dest_rd_atomic (a duplicate's stream is not).
        counted: bool,
    },
    Atomic {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
    /// A CNP to the peer QP (we received CE-marked traffic from it).
    Cnp,
}

/// Counters of one QP, under the names mlx5 and rxe report (`rdma statistic`, ethtool):
/// written only by the lcore that owns the QP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCounters {
    /// Frames sent (requests, responses, ACKs, CNPs, retransmissions).
    pub sent_pkts: u64,
    /// Frames received for this QP that parsed and passed their checks.
    pub rcvd_pkts: u64,
    /// RDMA WRITE request packets executed.
    pub rx_write_requests: u64,
    /// RDMA READ requests executed (first asks and re-asks).
    pub rx_read_requests: u64,
    /// Atomic requests executed.
    pub rx_atomic_requests: u64,
    /// Requests answered with RNR NAK for want of a receive WQE.
    pub out_of_buffer: u64,
    /// Requests that arrived out of sequence (NAKed once, then dropped until the gap fills).
    pub out_of_sequence: u64,
    /// Duplicate requests (re-ACKed, READs re-executed, atomics answered from the cache).
    pub duplicate_request: u64,
    /// PSN sequence error NAKs received.
    pub packet_seq_err: u64,
    /// Go-back-N started by an implied NAK (a response past an unanswered READ/atomic).
    pub implied_nak_seq_err: u64,
    /// Local ACK timeouts that started a retry.
    pub local_ack_timeout_err: u64,
    /// RNR NAKs received.
    pub rnr_nak_retry_err: u64,
    /// Work requests failed with RETRY_EXC_ERR.
    pub req_transport_retries_exceeded: u64,
    /// Work requests failed with RNR_RETRY_EXC_ERR.
    pub req_rnr_retries_exceeded: u64,
    /// RoCE packets that arrived CE-marked.
    pub np_ecn_marked_roce_packets: u64,
    /// CNPs sent.
    pub np_cnp_sent: u64,
    /// CNPs received.
    pub rp_cnp_received: u64,
    /// Frames sent with their payload attached from the region instead of copied (ferroce's
    /// own; see [`ATTACH_MIN`]).
    pub tx_attached_pkts: u64,
    /// Datagrams a UD QP dropped for a Q_Key other than its own (IBA's Q_Key violations).
    pub qkey_violations: u64,
    /// Frames for a connected QP dropped for coming from an address other than its remote
    /// GID, or to an address other than its own (spoofed or misrouted; rxe drops them too).
    pub rx_wrong_source: u64,
}

impl QpCounters {
    /// Adds `o` into `self` (for per-lcore and per-port totals).
    pub fn add(&mut self, o: &QpCounters) {
        let QpCounters {
            sent_pkts,
            rcvd_pkts,
            rx_write_requests,
            rx_read_requests,
            rx_atomic_requests,
            out_of_buffer,
            out_of_sequence,
            duplicate_request,
            packet_seq_err,
            implied_nak_seq_err,
            local_ack_timeout_err,
            rnr_nak_retry_err,
            req_transport_retries_exceeded,
            req_rnr_retries_exceeded,
            np_ecn_marked_roce_packets,
            np_cnp_sent,
            rp_cnp_received,
            tx_attached_pkts,
            qkey_violations,
            rx_wrong_source,
        } = *o;
        self.sent_pkts += sent_pkts;
        self.rcvd_pkts += rcvd_pkts;
        self.rx_write_requests += rx_write_requests;
        self.rx_read_requests += rx_read_requests;
        self.rx_atomic_requests += rx_atomic_requests;
        self.out_of_buffer += out_of_buffer;
        self.out_of_sequence += out_of_sequence;
        self.duplicate_request += duplicate_request;
        self.packet_seq_err += packet_seq_err;
        self.implied_nak_seq_err += implied_nak_seq_err;
        self.local_ack_timeout_err += local_ack_timeout_err;
        self.rnr_nak_retry_err += rnr_nak_retry_err;
        self.req_transport_retries_exceeded += req_transport_retries_exceeded;
        self.req_rnr_retries_exceeded += req_rnr_retries_exceeded;
        self.np_ecn_marked_roce_packets += np_ecn_marked_roce_packets;
        self.np_cnp_sent += np_cnp_sent;
        self.rp_cnp_received += rp_cnp_received;
        self.tx_attached_pkts += tx_attached_pkts;
        self.qkey_violations += qkey_violations;
        self.rx_wrong_source += rx_wrong_source;
    }

    /// (name, value) pairs, in the order above.
    pub fn named(&self) -> [(&'static str, u64); 20] {
        [
            ("sent_pkts", self.sent_pkts),
            ("rcvd_pkts", self.rcvd_pkts),
            ("rx_write_requests", self.rx_write_requests),
            ("rx_read_requests", self.rx_read_requests),
            ("rx_atomic_requests", self.rx_atomic_requests),
            ("out_of_buffer", self.out_of_buffer),
            ("out_of_sequence", self.out_of_sequence),
            ("duplicate_request", self.duplicate_request),
            ("packet_seq_err", self.packet_seq_err),
            ("implied_nak_seq_err", self.implied_nak_seq_err),
            ("local_ack_timeout_err", self.local_ack_timeout_err),
            ("rnr_nak_retry_err", self.rnr_nak_retry_err),
            (
                "req_transport_retries_exceeded",
                self.req_transport_retries_exceeded,
            ),
            ("req_rnr_retries_exceeded", self.req_rnr_retries_exceeded),
            (
                "np_ecn_marked_roce_packets",
                self.np_ecn_marked_roce_packets,
            ),
            ("np_cnp_sent", self.np_cnp_sent),
            ("rp_cnp_received", self.rp_cnp_received),
            ("tx_attached_pkts", self.tx_attached_pkts),
            ("qkey_violations", self.qkey_violations),
            ("rx_wrong_source", self.rx_wrong_source),
        ]
    }
}

/// How far past the oldest missing PSN READ responses are placed on arrival.
pub const READ_WINDOW: u32 = 256;

/// Payloads of at least this many bytes go out attached to the frame from their region
/// (hugepage memory, IPv4, a port with multi-segment transmit) instead of copied into it.
/// `bench --bin extbuf_memif` on memif: attaching costs two more mbufs per frame and wins at
/// 4 KiB (1.20x the frame rate of copying), loses at 1 KiB (0.82x) and 64 B (0.53x).
pub const ATTACH_MIN: usize = 2048;

/// Which READ response PSNs at or after `una` have been placed in the local buffer: a ring of
/// [`READ_WINDOW`] bits indexed by PSN. Responses that arrive after a lost one are kept, so a
/// READ asked again only needs its holes filled (out-of-order placement, as RNICs built for
/// adaptive routing do); without it every lost response costs the whole rest of the READ.
#[derive(Clone, Copy, Debug, Default)]
struct ReadWindow([u64; (READ_WINDOW / 64) as usize]);

impl ReadWindow {
    fn bit(psn: Psn) -> (usize, u64) {
        let i = psn.value() % READ_WINDOW;
        ((i / 64) as usize, 1 << (i % 64))
    }
    fn has(&self, psn: Psn) -> bool {
        let (w, b) = Self::bit(psn);
        self.0[w] & b != 0
    }
    fn set(&mut self, psn: Psn) {
        let (w, b) = Self::bit(psn);
        self.0[w] |= b;
    }
    /// From `una`, clears the placed run and returns the new oldest missing PSN.
    fn advance(&mut self, mut una: Psn) -> Psn {
        while self.has(una) {
            let (w, b) = Self::bit(una);
            self.0[w] &= !b;
            una = una.add(1);
        }
        una
    }
    fn clear(&mut self) {
        self.0 = [0; (READ_WINDOW / 64) as usize];
    }
}

/// Everything an RC QP needs to go RESET -> INIT -> RTR -> RTS in one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Connect {
    /// Remote access the QP allows.
    pub access: super::mr::Access,
    /// Where the remote end is.
    pub path: super::qp::Path,
    /// Path MTU.
    pub mtu: super::qp::Mtu,
    /// The remote QP.
    pub dest_qp: u32,
    /// First PSN we send.
    pub sq_psn: u32,
    /// First PSN we expect.
    pub rq_psn: u32,
    /// ACK timeout code (4.096 us * 2^timeout).
    pub timeout: u8,
    /// Retries after timeouts and sequence NAKs.
    pub retry_cnt: u8,
    /// RNR retries (7 = forever).
    pub rnr_retry: u8,
    /// RNR timer code we send.
    pub min_rnr_timer: u8,
    /// READs/atomics we may have outstanding.
    pub max_rd_atomic: u8,
    /// READs/atomics we accept outstanding.
    pub max_dest_rd_atomic: u8,
}

impl Connect {
    /// A connection to `dest_qp` over `path` at `mtu` with the settings RoCE deployments
    /// commonly use: PSNs from 0, ACK timeout code 14 (67 ms), retry_cnt 7, rnr_retry 7
    /// (forever), min_rnr_timer 1 (0.01 ms), 16 READs/atomics each way, remote write, read
    /// and atomic allowed. Change fields with struct update syntax.
    pub fn new(path: super::qp::Path, mtu: super::qp::Mtu, dest_qp: u32) -> Self {
        use super::mr::Access;
        Connect {
            access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            path,
            mtu,
            dest_qp,
            sq_psn: 0,
            rq_psn: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
        }
    }
}

/// One RC queue pair.
#[derive(Debug)]
pub struct RcQp {
    /// Our QP number.
    pub qpn: u32,
    /// Its protection domain.
    pub pd: PdHandle,
    /// Attributes and state.
    pub cfg: QpConfig,
    caps: QpCaps,
    /// Inline data of posted work requests: one slot of max_inline_data bytes per send queue
    /// entry, used in posting order (the send queue completes in order, so slots never clash).
    inline_buf: Vec<u8>,
    /// Send work requests ever posted (picks the inline slot).
    posted: u64,
    // Requester and completer.
    sq: VecDeque<SendWqe>,
    send_idx: usize,
    send_pkt: u32,
    next_psn: Psn,
    rd_atomic_inflight: u8,
    /// Oldest PSN not yet acknowledged.
    una: Psn,
    /// READ responses placed past `una` (for the READ at the front).
    read_win: ReadWindow,
    /// One past the highest PSN ever sent (a rewind does not lower it).
    sent_hw: Psn,
    retries_left: u8,
    rnr_left: u8,
    /// A go-back-N is under way and nothing has been acknowledged since: acknowledgements
    /// still in flight from before it must not start another (rxe's `started_retry`).
    retrying: bool,
    ack_deadline: Option<Instant>,
    rnr_until: Option<Instant>,
    now: Instant,
    /// Completion latencies (opcode, ns) not yet taken by the host.
    latencies: ArrayVec<(WcOpcode, u64), LATENCY_LOG>,
    // Congestion control.
    cc: Cc,
    cc_params: DcqcnParams,
    /// Earliest time the next request packet may leave (pacing while rate limited).
    next_send: Instant,
    /// When we last queued a CNP.
    last_cnp: Option<Instant>,
    /// What happened on this QP.
    pub counters: QpCounters,
    /// The port computes IPv4 header checksums on transmit.
    tx_offload: bool,
    tx_attach: bool,
    // Responder.
    rq: VecDeque<RecvWr>,
    recv_cur: Option<(RecvWr, u64)>,
    write_cur: Option<(u32, u64)>,
    write_len: u32,
    /// Bytes of the WRITE in progress not yet received (its DMA length less what came).
    write_left: u32,
    in_message: InMessage,
    nak_sent: bool,
    /// Packets executed since the last ACK we queued.
    unacked: u32,
    msn: u32,
    rd_atomic_outstanding: u8,
    responses: VecDeque<Response>,
    /// Original values of recent atomics, by PSN, to answer duplicates without re-executing.
    replay: ArrayVec<(Psn, u64), 16>,
    /// Receives were posted while in ERR: they complete (flushed) in the next
    /// `handle_timeout`, which `poll_timeout` asks for at once (kept off the per-packet calls).
    flush_due: bool,
}

impl RcQp {
    /// A QP in RESET with these caps (refused if one is out of the device's range).
    pub fn new(qpn: u32, pd: PdHandle, caps: QpCaps) -> Result<Self, CapsError> {
        caps.validate()?;
        Ok(RcQp {
            qpn,
            pd,
            cfg: QpConfig {
                qp_type: caps.qp_type,
                ..QpConfig::default()
            },
            caps,
            inline_buf: vec![0; caps.max_send_wr as usize * caps.max_inline_data as usize],
            posted: 0,
            sq: VecDeque::with_capacity(caps.max_send_wr as usize),
            send_idx: 0,
            send_pkt: 0,
            next_psn: Psn::new(0),
            rd_atomic_inflight: 0,
            una: Psn::new(0),
            read_win: ReadWindow::default(),
            sent_hw: Psn::new(0),
            retries_left: 0,
            rnr_left: 0,
            retrying: false,
            ack_deadline: None,
            rnr_until: None,
            now: Instant::ZERO,
            latencies: ArrayVec::new(),
            cc: Cc::new(CcKind::None, 0.0),
            cc_params: DcqcnParams::nvidia(),
            next_send: Instant::ZERO,
            last_cnp: None,
            counters: QpCounters::default(),
            tx_offload: false,
            tx_attach: false,
            rq: VecDeque::with_capacity(caps.max_recv_wr as usize),
            recv_cur: None,
            write_cur: None,
            write_len: 0,
            write_left: 0,
            in_message: InMessage::None,
            nak_sent: false,
            unacked: 0,
            msn: 0,
            rd_atomic_outstanding: 0,
            responses: VecDeque::new(),
            replay: ArrayVec::new(),
            flush_due: false,
        })
    }

    /// The caps it was created with.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// What the QP's port does for its frames: IPv4 header checksums (`ipv4_cksum`), and
    /// frames of several segments (`multi_seg`), which lets payloads of at least
    /// [`ATTACH_MIN`] bytes in hugepage regions go out attached instead of copied.
    pub fn set_tx_features(&mut self, ipv4_cksum: bool, multi_seg: bool) {
        self.tx_offload = ipv4_cksum;
        self.tx_attach = multi_seg;
    }

    /// Chooses congestion control for this QP on a port of `line_bps` (starts at that rate).
    pub fn set_congestion_control(&mut self, kind: CcKind, line_bps: f64, params: DcqcnParams) {
        self.cc = Cc::new(kind, line_bps);
        self.cc_params = params;
    }

    /// Changes the DCQCN settings of this QP; its rates and alpha carry on.
    pub fn set_cc_params(&mut self, params: DcqcnParams) {
        self.cc_params = params;
    }

    /// Tells the QP the time, so work posted next is stamped with it (the host calls it
    /// before posting; the QP otherwise knows the time of its latest event).
    pub fn observe(&mut self, now: Instant) {
        self.now = self.now.max(now);
    }

    /// Hands each completion latency recorded since the last call (signalled send work
    /// requests completed successfully: opcode, nanoseconds from post) to `f`. A QP keeps at
    /// most 256 between calls (the host takes them after every frame it hands the QP); beyond
    /// that, more are not kept.
    pub fn take_latencies(&mut self, mut f: impl FnMut(WcOpcode, u64)) {
        for (op, ns) in self.latencies.drain(..) {
            f(op, ns);
        }
    }

    /// The QP's congestion controller (rate, target, alpha, CNP counts).
    pub fn cc(&self) -> &Cc {
        &self.cc
    }

    /// Its DCQCN settings.
    pub fn cc_params(&self) -> &DcqcnParams {
        &self.cc_params
    }

    /// True while the controller holds this QP below line rate (its packets are paced).
    fn paced(&self) -> bool {
        matches!(&self.cc, Cc::Dcqcn(d) if d.is_limited())
    }

    /// Applies a modify (see [`QpConfig::modify`]) and takes the new PSNs.
    pub fn modify(&mut self, a: &super::qp::QpAttr) -> Result<(), super::qp::ModifyError> {
        self.cfg.modify(a)?;
        if let Some(p) = self.cfg.path.as_mut() {
            // IPv4-mapped GIDs as the IPv4 addresses the wire carries, so that the receive
            // path compares addresses as they are (see `handle_parsed`).
            p.local_ip = p.local_ip.to_canonical();
            p.remote_ip = p.remote_ip.to_canonical();
        }
        if a.sq_psn.is_some() {
            self.next_psn = self.cfg.sq_psn;
            self.una = self.cfg.sq_psn;
            self.sent_hw = self.cfg.sq_psn;
        }
        self.retries_left = self.cfg.retry_cnt;
        self.rnr_left = self.cfg.rnr_retry;
        Ok(())
    }

    /// Takes a QP in RESET through INIT and RTR to RTS; stops at the first refused step.
    pub fn connect(&mut self, c: &Connect) -> Result<(), super::qp::ModifyError> {
        use super::qp::QpAttr;
        if self.cfg.qp_type == QpType::Ud {
            return Err(super::qp::ModifyError::Datagram);
        }
        self.modify(&QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            access: Some(c.access),
            ..Default::default()
        })?;
        self.modify(&QpAttr {
            state: Some(QpState::Rtr),
            path: Some(c.path),
            path_mtu: Some(c.mtu),
            dest_qp: Some(c.dest_qp),
            rq_psn: Some(c.rq_psn),
            max_dest_rd_atomic: Some(c.max_dest_rd_atomic),
            min_rnr_timer: Some(c.min_rnr_timer),
            ..Default::default()
        })?;
        self.modify(&QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(c.sq_psn),
            timeout: Some(c.timeout),
            retry_cnt: Some(c.retry_cnt),
            rnr_retry: Some(c.rnr_retry),
            max_rd_atomic: Some(c.max_rd_atomic),
            ..Default::default()
        })
    }

    /// Takes a UD QP in RESET through INIT (its Q_Key, and the MTU its datagrams may fill)
    /// and RTR to RTS, first PSN `sq_psn`: UD's counterpart of [`RcQp::connect`].
    pub fn activate_ud(
        &mut self,
        qkey: u32,
        mtu: super::qp::Mtu,
        sq_psn: u32,
    ) -> Result<(), super::qp::ModifyError> {
        use super::qp::QpAttr;
        for a in [
            QpAttr {
                state: Some(QpState::Init),
                pkey_index: Some(0),
                qkey: Some(qkey),
                path_mtu: Some(mtu),
                ..Default::default()
            },
            QpAttr {
                state: Some(QpState::Rtr),
                ..Default::default()
            },
            QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(sq_psn),
                ..Default::default()
            },
        ] {
            self.modify(&a)?;
        }
        Ok(())
    }

    /// Posts a send work request.
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        if wr.inline && !wr.sg.is_empty() {
            // Its bytes must be gathered first (`wr::take_inline`); the QP has no regions.
            return Err(WrError::BadInline.into());
        }
        self.post(wr, None)
    }

    /// Posts `wr` with the inline bytes [`super::wr::take_inline`] gathered for it, if any.
    pub fn post_send_gathered(
        &mut self,
        wr: SendWr,
        inline: Option<&[u8]>,
    ) -> Result<(), PostError> {
        match inline {
            Some(d) => self.post_send_inline(wr, d),
            None => self.post_send(wr),
        }
    }

    /// Posts a SEND or WRITE whose payload is `data`, copied now (verbs' IBV_SEND_INLINE: the
    /// caller's buffer is free again as soon as this returns, and no local key is involved).
    /// The work request's SG list must be empty; `data` may be up to max_inline_data bytes.
    pub fn post_send_inline(&mut self, wr: SendWr, data: &[u8]) -> Result<(), PostError> {
        if !wr.sg.is_empty()
            || data.len() > self.caps.max_inline_data as usize
            || wr.op.is_read_or_atomic()
        {
            return Err(WrError::BadInline.into());
        }
        self.post(wr, Some(data))
    }

    fn post(&mut self, wr: SendWr, inline: Option<&[u8]>) -> Result<(), PostError> {
        let (p, len) = self.admit(&wr, inline)?;
        let inline_at = self.take_inline_bytes(inline);
        let first_psn = self.advance(&p);
        self.sq.push_back(SendWqe {
            wr,
            plan: p,
            first_psn,
            len,
            inline_at,
            posted_at: self.now,
        });
        self.arm_ack_timer();
        Ok(())
    }

    /// Posts a copy of `wr` under `wr_id`, with `inline` (its bytes, gathered by the caller
    /// as for [`Self::post_send_gathered`]) in place of its SG list if given: what a stream
    /// of identical requests posts. The request is copied once, into the send queue.
    pub fn post_send_copy(
        &mut self,
        wr: &SendWr,
        wr_id: u64,
        inline: Option<&[u8]>,
    ) -> Result<(), PostError> {
        let bad_inline = match inline {
            Some(d) => d.len() > self.caps.max_inline_data as usize || wr.op.is_read_or_atomic(),
            // Its bytes must be gathered first; the QP has no regions.
            None => wr.inline && !wr.sg.is_empty(),
        };
        if bad_inline {
            return Err(WrError::BadInline.into());
        }
        let (p, len) = self.admit(wr, inline)?;
        let inline_at = self.take_inline_bytes(inline);
        let first_psn = self.advance(&p);
        let sg = match inline {
            Some(_) => SgList::new(),
            None => wr.sg,
        };
        // Built in place, as `post` builds its own: handing the request to `post` by value
        // costs 20 to 80 more instructions a message (stream_cost under callgrind).
        self.sq.push_back(SendWqe {
            wr: SendWr { wr_id, sg, ..*wr },
            plan: p,
            first_psn,
            len,
            inline_at,
            posted_at: self.now,
        });
        self.arm_ack_timer();
        Ok(())
    }

    /// Whether `wr` (with `inline` bytes in place of its SG list, if given) may be posted
    /// now: its plan and message length, or why not.
    fn admit(&self, wr: &SendWr, inline: Option<&[u8]>) -> Result<(Plan, u64), PostError> {
        if !matches!(self.cfg.state, QpState::Rts | QpState::Sqd) {
            return Err(PostError::BadState);
        }
        if self.sq.len() >= self.caps.max_send_wr as usize {
            return Err(PostError::Full);
        }
        if inline.is_none() && wr.sg.len() > self.caps.max_send_sge as usize {
            return Err(WrError::TooManySge.into());
        }
        let ud = self.cfg.qp_type == QpType::Ud;
        if ud != wr.ud.is_some() || wr.ud.is_some_and(|d| !d.path.is_valid()) {
            return Err(WrError::UdDest.into());
        }
        let mtu = self.cfg.path_mtu.ok_or(PostError::BadState)?;
        let len = inline.map_or_else(|| wr.length(), |d| d.len() as u64);
        if ud {
            if !matches!(wr.op, SendOp::Send | SendOp::SendWithImm(_)) {
                return Err(WrError::UdOp.into());
            }
            if len > mtu.bytes() as u64 {
                return Err(WrError::UdTooLong.into());
            }
        }
        Ok((plan(wr.op, len, mtu, self.next_psn)?, len))
    }

    /// Copies a request's inline bytes into its slot of the QP's inline buffer.
    fn take_inline_bytes(&mut self, inline: Option<&[u8]>) -> Option<usize> {
        inline.map(|d| {
            let slot = (self.posted % self.caps.max_send_wr as u64) as usize;
            let at = slot * self.caps.max_inline_data as usize;
            self.inline_buf[at..at + d.len()].copy_from_slice(d);
            at
        })
    }

    /// Counts a posted request and takes its PSNs: the first.
    fn advance(&mut self, p: &Plan) -> Psn {
        self.posted += 1;
        let first_psn = self.next_psn;
        self.next_psn = self.next_psn.add(p.psns);
        first_psn
    }

    /// Posts a receive work request.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.cfg.state == QpState::Reset {
            return Err(PostError::BadState);
        }
        if self.rq.len() >= self.caps.max_recv_wr as usize {
            return Err(PostError::Full);
        }
        if wr.sg.len() > self.caps.max_recv_sge as usize {
            return Err(WrError::TooManySge.into());
        }
        self.rq.push_back(wr);
        // Posted to a QP in ERR: taken, and completed with WR_FLUSH_ERR (as verbs and rxe
        // do) by the timeout `poll_timeout` then asks for at once.
        self.flush_due |= self.cfg.state == QpState::Err;
        Ok(())
    }

    /// Work requests posted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.sq.len()
    }

    fn repr(&self, bth: bth::Repr, ext: ExtRepr) -> Option<RoceRepr> {
        self.repr_on(self.cfg.path?, bth, ext)
    }

    /// The headers of a frame to `p` (a UD send names its own path).
    fn repr_on(&self, mut p: Path, bth: bth::Repr, ext: ExtRepr) -> Option<RoceRepr> {
        if bth.opcode == op::CNP {
            // CNPs go in their own class: cnp_dscp, not ECN-capable, cnp_802p_prio.
            p.dscp = self.cc_params.cnp_dscp;
            p.ecn = 0;
            p.vlan = p.vlan.map(|(vid, _)| (vid, self.cc_params.cnp_802p_prio));
        }
        let ip = match (p.local_ip, p.remote_ip) {
            (core::net::IpAddr::V4(s), core::net::IpAddr::V4(d)) => IpRepr::V4(ipv4::Repr {
                dscp: p.dscp,
                ecn: Ecn::from_bits(p.ecn),
                ident: 0,
                flags_frag: 0x4000,
                ttl: 64,
                protocol: ipv4::PROTO_UDP,
                src: s,
                dst: d,
            }),
            (core::net::IpAddr::V6(s), core::net::IpAddr::V6(d)) => IpRepr::V6(ipv6::Repr {
                traffic_class: p.dscp << 2 | p.ecn,
                flow_label: 0,
                next_header: ipv4::PROTO_UDP,
                hop_limit: 64,
                src: s,
                dst: d,
            }),
            _ => return None,
        };
        Some(RoceRepr {
            eth: eth::Repr {
                dst: p.remote_mac,
                src: p.local_mac,
                vlan: p.vlan.map(|(vid, pcp)| eth::VlanTag {
                    pcp,
                    dei: false,
                    vid,
                }),
                ethertype: 0,
            },
            ip,
            udp: udp::Repr {
                src_port: p.udp_sport,
                dst_port: udp::ROCEV2_PORT,
                checksum: 0,
            },
            bth,
            ext,
        })
    }

    /// Builds a frame with `payload_len` bytes filled by `fill` in `out` (emptied first): the
    /// payload is written once, straight into the buffer, and the headers go in front of it
    /// (into an mbuf's headroom).
    fn emit<B: PacketBuf>(
        &self,
        out: &mut B,
        bth: bth::Repr,
        ext: ExtRepr,
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), MrError>,
    ) -> Option<Result<(), MrError>> {
        self.emit_on(self.cfg.path?, out, bth, ext, payload_len, fill)
    }

    /// [`RcQp::emit`] to `path`.
    fn emit_on<B: PacketBuf>(
        &self,
        path: Path,
        out: &mut B,
        bth: bth::Repr,
        ext: ExtRepr,
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), MrError>,
    ) -> Option<Result<(), MrError>> {
        let r = self.repr_on(path, bth, ext)?;
        if !out.reset() {
            return None;
        }
        let dst = out.append(payload_len)?;
        if let Err(e) = fill(dst) {
            out.reset();
            return Some(Err(e));
        }
        if build(out, &r, self.tx_offload).is_err() {
            out.reset();
            return None;
        }
        Some(Ok(()))
    }

    /// Builds a frame whose `len` payload bytes, at `offset` of the message `sg` describes,
    /// go out attached from their region instead of copied ([`build_attached`]), where this
    /// QP attaches (its port transmits chains, `copy_tx` is off) and `len` is at least
    /// [`ATTACH_MIN`]. False when it did not (those, the bytes spanning SG entries, a region
    /// that is not hugepage memory, an IPv6 path, ...): the caller copies, which also reports
    /// any key or bounds error.
    #[allow(clippy::too_many_arguments)]
    fn emit_attached<B: PacketBuf>(
        &self,
        out: &mut B,
        bth: bth::Repr,
        ext: ExtRepr,
        mrs: &MrTable,
        sg: &[Sge],
        offset: u64,
        len: usize,
    ) -> bool {
        if !self.tx_attach || self.caps.copy_tx || len < ATTACH_MIN {
            return false;
        }
        let Some((lkey, va)) = locate(sg, offset, len as u64) else {
            return false;
        };
        let Some((mem, off)) = mrs
            .get(lkey)
            .ok()
            .and_then(|m| m.attachable_range(va, len as u64))
        else {
            return false;
        };
        self.repr(bth, ext)
            .is_some_and(|r| build_attached(out, &r, mem, off, len, self.tx_offload) == Ok(true))
    }

    /// Builds a frame with no payload (ACK, atomic ACK, CNP); false if it could not be built.
    fn emit_headers<B: PacketBuf>(&self, out: &mut B, bth: bth::Repr, ext: ExtRepr) -> bool {
        matches!(self.emit(out, bth, ext, 0, |_| Ok(())), Some(Ok(())))
    }

    fn bth(&self, opcode: u8, psn: Psn, ack_req: bool, se: bool) -> bth::Repr {
        bth::Repr {
            opcode,
            se,
            pkey: bth::DEFAULT_PKEY,
            dest_qp: self.cfg.dest_qp,
            ack_req,
            psn,
            ..Default::default()
        }
    }

    /// Writes the next frame to send into `out`; false if there is nothing to send. Responses
    /// go before new requests.
    pub fn poll_transmit<B: PacketBuf>(
        &mut self,
        now: Instant,
        mrs: &MrTable,
        scq: &mut CompletionQueue,
        rcq: &mut CompletionQueue,
        out: &mut B,
    ) -> bool {
        let sent = self.next_frame(now, mrs, scq, rcq, out);
        self.counters.sent_pkts += sent as u64;
        sent
    }

    fn next_frame<B: PacketBuf>(
        &mut self,
        now: Instant,
        mrs: &MrTable,
        scq: &mut CompletionQueue,
        rcq: &mut CompletionQueue,
        out: &mut B,
    ) -> bool {
        self.now = self.now.max(now);
        if self.cfg.qp_type == QpType::Ud {
            return self.next_datagram(mrs, scq, rcq, out);
        }
        if self.cfg.path.is_none() {
            return false;
        }
        if let Some(r) = self.responses.pop_front() {
            return self.send_response(r, mrs, out);
        }
        let drains = self.cfg.state == QpState::Sqd
            && self
                .sq
                .get(self.send_idx)
                .is_some_and(|w| w.first_psn.diff(self.sent_hw) < 0);
        if !(self.cfg.state == QpState::Rts || drains)
            || self.send_idx >= self.sq.len()
            || self.rnr_until.is_some()
            || self.paced() && self.now < self.next_send
        {
            // In SQD only messages already begun go on (and are resent): the send queue
            // drains without starting new work.
            return false;
        }
        let w = &self.sq[self.send_idx];
        if self.send_pkt == 0
            && (w.wr.op.is_read_or_atomic() && self.rd_atomic_inflight >= self.cfg.max_rd_atomic
                || w.wr.fence && self.rd_atomic_inflight > 0)
        {
            return false;
        }
        let mut pk = w.plan.packet(self.send_pkt);
        let opv = w.wr.op;
        let mut ext = ext_headers(opv, &pk, w.len);
        // A READ resent after some of its responses arrived asks only for the rest, from the
        // oldest PSN still missing (as rxe does): a long READ over a lossy path would otherwise
        // never finish.
        if let (SendOp::Read { .. }, Some(r)) = (opv, ext.reth.as_mut())
            && self.una.diff(w.first_psn) > 0
            && self.una.diff(w.last_psn()) <= 0
        {
            let skip =
                self.una.diff(w.first_psn) as u32 * self.cfg.path_mtu.map_or(1024, |m| m.bytes());
            r.va += skip as u64;
            r.dma_len = r.dma_len.saturating_sub(skip);
            pk.psn = self.una;
        }
        let b = self.bth(pk.opcode, pk.psn, pk.ack_req, w.wr.solicited && pk.last);
        let sg = &w.wr.sg; // borrowed, not copied: emit() only reads self
        let inline = w
            .inline_at
            .map(|at| &self.inline_buf[at..at + w.len as usize]);
        let payload = if matches!(
            opv,
            SendOp::Read { .. } | SendOp::CmpSwap { .. } | SendOp::FetchAdd { .. }
        ) {
            0
        } else {
            pk.len as usize
        };
        let attached =
            inline.is_none() && self.emit_attached(out, b, ext, mrs, sg, pk.offset as u64, payload);
        let built = if attached {
            self.counters.tx_attached_pkts += 1;
            Some(Ok(()))
        } else {
            self.emit(out, b, ext, payload, |dst| match inline {
                Some(d) => {
                    dst.copy_from_slice(&d[pk.offset as usize..][..dst.len()]);
                    Ok(())
                }
                None => gather(mrs, sg, pk.offset as u64, dst),
            })
        };
        match built {
            Some(Ok(())) => {}
            Some(Err(_)) => {
                // The local SG list is bad: complete in error and stop the QP.
                self.fail_front(self.send_idx, WcStatus::LocProtErr, scq, rcq);
                return false;
            }
            None => return false,
        }
        if self.ack_deadline.is_none() {
            self.ack_deadline = self.cfg.ack_timeout().map(|t| self.now + t);
        }
        self.cc.on_sent(out.frame_len() as u64, &self.cc_params);
        self.next_send = if self.paced() {
            // Wire bytes (with preamble, FCS and gap) at the QP's current rate.
            let ns = (out.frame_len() + 24) as f64 * 8e9 / self.cc.rate();
            self.next_send.max(self.now) + core::time::Duration::from_nanos(ns as u64)
        } else {
            self.now
        };
        let w = &self.sq[self.send_idx];
        let end = if opv.is_read_or_atomic() {
            w.first_psn.add(w.plan.psns)
        } else {
            pk.psn.add(1)
        };
        if end.diff(self.sent_hw) > 0 {
            self.sent_hw = end;
        }
        if pk.last {
            if opv.is_read_or_atomic() {
                self.rd_atomic_inflight += 1;
            }
            self.send_idx += 1;
            self.send_pkt = 0;
        } else {
            self.send_pkt += 1;
        }
        true
    }

    /// A UD QP's next datagram: the oldest send, as one UD SEND (with immediate) to the
    /// destination it names, with a DETH carrying its Q_Key and our QPN, no AckReq. Nothing
    /// acknowledges it, so it completes once it is on its way (as on rxe).
    fn next_datagram<B: PacketBuf>(
        &mut self,
        mrs: &MrTable,
        scq: &mut CompletionQueue,
        rcq: &mut CompletionQueue,
        out: &mut B,
    ) -> bool {
        if self.cfg.state != QpState::Rts {
            return false;
        }
        let Some(w) = self.sq.front() else {
            return false;
        };
        let Some(d) = w.wr.ud else {
            return false; // post() refuses these
        };
        let imm = match w.wr.op {
            SendOp::SendWithImm(i) => Some(i),
            _ => None,
        };
        let b = bth::Repr {
            opcode: if imm.is_some() {
                op::UD_SEND_ONLY_IMM
            } else {
                op::UD_SEND_ONLY
            },
            se: w.wr.solicited,
            pkey: bth::DEFAULT_PKEY,
            dest_qp: d.dest_qp,
            ack_req: false,
            psn: w.first_psn,
            ..Default::default()
        };
        let ext = ExtRepr {
            deth: Some(deth::Repr {
                qkey: d.qkey,
                resv8: 0,
                src_qp: self.qpn,
            }),
            immdt: imm,
            ..Default::default()
        };
        let inline = w
            .inline_at
            .map(|at| &self.inline_buf[at..at + w.len as usize]);
        let sg = &w.wr.sg;
        let built = self.emit_on(d.path, out, b, ext, w.len as usize, |dst| match inline {
            Some(x) => {
                dst.copy_from_slice(x);
                Ok(())
            }
            None => gather(mrs, sg, 0, dst),
        });
        match built {
            Some(Ok(())) => {
                self.complete_upto(1, scq);
                true
            }
            Some(Err(_)) => {
                self.fail_front(0, WcStatus::LocProtErr, scq, rcq);
                false
            }
            None => false,
        }
    }

    /// A datagram for this UD QP: dropped unless the QP receives, it is a UD SEND and its
    /// Q_Key is ours (counted as a Q_Key violation) and a receive is posted (counted as
    /// out_of_buffer: UD has no RNR). The receive gets the 40-byte GRH area first (for IPv4,
    /// the IP header in its last 20 bytes, as rxe writes it), then the payload; its completion
    /// carries the sender's QPN and GRH + payload bytes. A receive too small for both completes
    /// with LOC_LEN_ERR and the QP goes to ERR.
    fn receive_datagram(
        &mut self,
        info: &PacketInfo,
        frame: &[u8],
        mrs: &mut MrTable,
        send_cq: &mut CompletionQueue,
        recv_cq: &mut CompletionQueue,
    ) {
        if !matches!(
            self.cfg.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) || !info.op.has(mask::UD)
        {
            return;
        }
        let Some(d) = info.deth(frame) else {
            return;
        };
        if d.qkey != self.cfg.qkey {
            self.counters.qkey_violations += 1;
            return;
        }
        let Some(wr) = self.rq.pop_front() else {
            self.counters.out_of_buffer += 1;
            return;
        };
        let payload = info.payload(frame);
        let mut grh = [0u8; UD_GRH_LEN];
        let ip = &frame[info.l3_off as usize..];
        if info.src_ip.is_ipv4() {
            grh[20..].copy_from_slice(&ip[..20]);
        } else {
            grh.copy_from_slice(&ip[..UD_GRH_LEN]);
        }
        let placed = scatter(mrs, &wr.sg, 0, &grh)
            .and_then(|()| scatter(mrs, &wr.sg, UD_GRH_LEN as u64, payload));
        if placed.is_err() {
            let _ = recv_cq.push(wc(
                wr.wr_id,
                WcStatus::LocLenErr,
                WcOpcode::Recv,
                0,
                self.qpn,
            ));
            self.enter_err(send_cq, recv_cq);
            return;
        }
        let mut c = wc(
            wr.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            (UD_GRH_LEN + payload.len()) as u32,
            self.qpn,
        );
        c.imm_data = info.immdt(frame);
        c.src_qp = Some(d.src_qp);
        let _ = recv_cq.push(c);
    }

    fn send_response<B: PacketBuf>(&mut self, r: Response, mrs: &MrTable, out: &mut B) -> bool {
        match r {
            Response::Ack { psn, syndrome, msn } => {
                let ext = ExtRepr {
                    aeth: Some(aeth::Repr { syndrome, msn }),
                    ..Default::default()
                };
                self.emit_headers(out, self.bth(op::RC_ACK, psn, false, false), ext)
            }
            Response::Cnp => {
                self.counters.np_cnp_sent += 1;
                let b = cnp::bth(self.cfg.dest_qp, bth::DEFAULT_PKEY);
                self.emit_headers(out, b, ExtRepr::default())
            }
            Response::Atomic { psn, orig, msn } => {
                let ext = ExtRepr {
                    aeth: Some(aeth::Repr {
                        syndrome: Syndrome::Ack { credits: 31 },
                        msn,
                    }),
                    atomic_ack: Some(atomic_ack_eth::Repr { orig }),
                    ..Default::default()
                };
                self.emit_headers(out, self.bth(op::RC_ATOMIC_ACK, psn, false, false), ext)
            }
            Response::Read {
                psn,
                rkey,
                va,
                len,
                next,
                count,
                msn,
                counted,
            } => {
                let mtu = self.cfg.path_mtu.map_or(1024, |m| m.bytes());
                let (first, last) = (next == 0, next + 1 == count);
                let opcode = match (first, last) {
                    (true, true) => op::RC_READ_RESPONSE_ONLY,
                    (true, false) => op::RC_READ_RESPONSE_FIRST,
                    (false, false) => op::RC_READ_RESPONSE_MIDDLE,
                    (false, true) => op::RC_READ_RESPONSE_LAST,
                };
                let off = next * mtu;
                let n = (len - off).min(mtu) as usize;
                let ext = if first || last {
                    ExtRepr {
                        aeth: Some(aeth::Repr {
                            syndrome: Syndrome::Ack { credits: 31 },
                            msn,
                        }),
                        ..Default::default()
                    }
                } else {
                    ExtRepr::default()
                };
                let b = self.bth(opcode, psn.add(next), false, false);
                let at = va + off as u64;
                let sg = [Sge {
                    addr: at,
                    length: n as u32,
                    lkey: rkey,
                }];
                let attached = self.emit_attached(out, b, ext, mrs, &sg, 0, n);
                self.counters.tx_attached_pkts += attached as u64;
                let ok = attached
                    || matches!(
                        self.emit(out, b, ext, n, |dst| mrs.get(rkey)?.read(at, dst)),
                        Some(Ok(()))
                    );
                if !last {
                    self.responses.push_front(Response::Read {
                        psn,
                        rkey,
                        va,
                        len,
                        next: next + 1,
                        count,
                        msn,
                        counted,
                    });
                } else if counted {
                    self.rd_atomic_outstanding = self.rd_atomic_outstanding.saturating_sub(1);
                }
                ok
            }
        }
    }

    /// Handles a received frame addressed to this QP.
    pub fn handle_frame(
        &mut self,
        now: Instant,
        frame: &[u8],
        mrs: &mut MrTable,
        send_cq: &mut CompletionQueue,
        recv_cq: &mut CompletionQueue,
    ) {
        let Ok(info) = parse(frame, Checks::ALL) else {
            return;
        };
        self.handle_parsed(now, &info, frame, mrs, send_cq, recv_cq);
    }

    /// [`RcQp::handle_frame`] for a frame the caller has already parsed with
    /// [`Checks::ALL`] (checksums and ICRC verified), so the receive path parses it once.
    pub fn handle_parsed(
        &mut self,
        now: Instant,
        info: &PacketInfo,
        frame: &[u8],
        mrs: &mut MrTable,
        send_cq: &mut CompletionQueue,
        recv_cq: &mut CompletionQueue,
    ) {
        self.now = self.now.max(now);
        let info = *info;
        if info.dest_qp != self.qpn {
            return;
        }
        // A connected QP takes frames only from its remote GID to its own (rxe's check_addr):
        // anything else is spoofed or misrouted, whatever its QPN and PSN say.
        if self.cfg.qp_type == QpType::Rc
            && let Some(p) = &self.cfg.path
            && (info.src_ip != p.remote_ip || info.dst_ip != p.local_ip)
        {
            self.counters.rx_wrong_source += 1;
            return;
        }
        self.counters.rcvd_pkts += 1;
        if self.cfg.qp_type == QpType::Ud {
            self.receive_datagram(&info, frame, mrs, send_cq, recv_cq);
            return;
        }
        if info.opcode == op::CNP {
            self.counters.rp_cnp_received += 1;
            self.cc.on_cnp(self.now, &self.cc_params);
            return;
        }
        if info.ecn == Ecn::Ce {
            self.on_ce();
        }
        if info.op.has(mask::REQ) {
            if matches!(
                self.cfg.state,
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            ) {
                self.respond(&info, frame, mrs, send_cq, recv_cq);
            }
        } else if info.op.has(mask::ACK) {
            self.complete(&info, frame, mrs, send_cq, recv_cq);
        }
    }

    /// Notification point: a CE-marked packet from the peer QP arrived; answer with a CNP,
    /// at most one per min_time_between_cnps, never two waiting at once.
    fn on_ce(&mut self) {
        self.counters.np_ecn_marked_roce_packets += 1;
        let gap = core::time::Duration::from_micros(self.cc_params.min_time_between_cnps as u64);
        if self.last_cnp.is_some_and(|t| self.now < t + gap)
            || self.responses.iter().any(|r| matches!(r, Response::Cnp))
        {
            return;
        }
        self.last_cnp = Some(self.now);
        // Ahead of data: a CNP is worth most when it arrives soon.
        self.responses.push_front(Response::Cnp);
    }

    fn push_ack(&mut self, psn: Psn, syndrome: Syndrome) {
        self.unacked = 0;
        let msn = self.msn;
        if let (
            true,
            Some(Response::Ack {
                psn: p,
                syndrome: s,
                msn: m,
            }),
        ) = (syndrome.is_ack(), self.responses.back_mut())
            && s.is_ack()
        {
            // Coalesce: one ACK covers every PSN up to it.
            *p = psn;
            *m = msn;
            return;
        }
        self.responses
            .push_back(Response::Ack { psn, syndrome, msn });
    }

    fn respond(
        &mut self,
        info: &PacketInfo,
        frame: &[u8],
        mrs: &mut MrTable,
        send_cq: &mut CompletionQueue,
        recv_cq: &mut CompletionQueue,
    ) {
        let req = Request {
            opcode: info.opcode,
            psn: info.psn,
            payload_len: info.payload_len as u32,
            reth: info.reth(frame),
            atomic: info.atomic_eth(frame),
        };
        let st = ResponderState {
            expected: self.cfg.rq_psn,
            nak_sent: self.nak_sent,
            in_message: self.in_message,
            access: self.cfg.access,
            pd: self.pd,
            mtu: match self.cfg.path_mtu {
                Some(m) => m,
                None => return,
            },
            rd_atomic_outstanding: self.rd_atomic_outstanding,
            max_dest_rd_atomic: self.cfg.max_dest_rd_atomic,
            min_rnr_timer: self.cfg.min_rnr_timer,
            recv_available: !self.rq.is_empty(),
            write_left: self.write_left,
        };
        let off = match check(&st, &req, mrs) {
            Verdict::Execute { mr_offset } => mr_offset,
            Verdict::Duplicate => {
                self.counters.duplicate_request += 1;
                if let (true, Some(r)) = (info.op.has(mask::READ), req.reth) {
                    // Re-execute a duplicate READ from the PSN it asks for. A response stream
                    // still queued for the same READ (one whose PSNs reach the asked PSN) is
                    // superseded, so repeated asks never pile up streams or exhaust
                    // max_dest_rd_atomic.
                    let mut superseded = 0;
                    self.responses.retain(|x| match x {
                        Response::Read {
                            psn,
                            next,
                            count,
                            counted,
                            ..
                        } => {
                            let (from, to) = (psn.add(*next), psn.add(count - 1));
                            let same = info.psn.diff(from) >= 0 && info.psn.diff(to) <= 0
                                || from.diff(info.psn) >= 0 && psn.diff(info.psn) <= 0;
                            superseded += (same && *counted) as u8;
                            !same
                        }
                        _ => true,
                    });
                    self.rd_atomic_outstanding =
                        self.rd_atomic_outstanding.saturating_sub(superseded);
                    let count = r.dma_len.div_ceil(st.mtu.bytes()).max(1);
                    // The duplicate's stream replays a READ already admitted: it does not count
                    // against max_dest_rd_atomic, so re-asks can never crowd out new READs.
                    self.responses.push_back(r_read(
                        info.psn, r.rkey, r.va, r.dma_len, count, self.msn, false,
                    ));
                } else if info.op.has(mask::ATOMIC) {
                    // Answer a duplicate atomic from the replay cache; never execute it twice.
                    if let Some((_, orig)) = self.replay.iter().find(|(p, _)| *p == info.psn) {
                        let orig = *orig;
                        self.responses.push_back(Response::Atomic {
                            psn: info.psn,
                            orig,
                            msn: self.msn,
                        });
                    }
                } else {
                    self.push_ack(self.cfg.rq_psn.sub(1), Syndrome::Ack { credits: 31 });
                }
                return;
            }
            Verdict::Drop => {
                self.counters.out_of_sequence += 1;
                return;
            }
            Verdict::Nak(code) => {
                if code == NakCode::PsnSequenceError {
                    self.counters.out_of_sequence += 1;
                    self.nak_sent = true;
                }
                self.push_ack(self.cfg.rq_psn, Syndrome::Nak(code));
                if code != NakCode::PsnSequenceError {
                    self.enter_err(send_cq, recv_cq);
                }
                return;
            }
            Verdict::RnrNak(t) => {
                self.counters.out_of_buffer += 1;
                self.push_ack(self.cfg.rq_psn, Syndrome::RnrNak { timer: t });
                return;
            }
        };
        self.nak_sent = false;
        let o = info.op;
        let payload = info.payload(frame);
        if o.has(mask::SEND) {
            if o.has(mask::FIRST) {
                self.recv_cur = self.rq.pop_front().map(|w| (w, 0));
            }
            let Some((wr, at)) = self.recv_cur.as_mut() else {
                return;
            };
            // A SEND longer than its receive is a length error before anything is placed
            // (rxe checks the receive's room first too).
            let room: u64 = wr.sg.iter().map(|s| s.length as u64).sum();
            if *at + payload.len() as u64 > room || scatter(mrs, &wr.sg, *at, payload).is_err() {
                let wr_id = wr.wr_id;
                let _ = recv_cq.push(wc(wr_id, WcStatus::LocLenErr, WcOpcode::Recv, 0, self.qpn));
                self.recv_cur = None;
                self.push_ack(info.psn, Syndrome::Nak(NakCode::InvalidRequest));
                self.enter_err(send_cq, recv_cq);
                return;
            }
            *at += payload.len() as u64;
            self.in_message = if o.has(mask::LAST) {
                InMessage::None
            } else {
                InMessage::Send
            };
            if o.has(mask::LAST) {
                let (wr, len) = self.recv_cur.take().expect("receive in progress");
                let mut c = wc(
                    wr.wr_id,
                    WcStatus::Success,
                    WcOpcode::Recv,
                    len as u32,
                    self.qpn,
                );
                c.imm_data = info.immdt(frame);
                c.invalidated_rkey = info.ieth(frame);
                let _ = recv_cq.push(c);
                self.msn = self.msn.wrapping_add(1) & 0x00ff_ffff;
            }
        } else if o.has(mask::WRITE) {
            self.counters.rx_write_requests += 1;
            if let Some(r) = req.reth {
                self.write_cur = Some((r.rkey, r.va));
                self.write_len = r.dma_len;
                self.write_left = r.dma_len;
                debug_assert!(mrs.get(r.rkey).is_ok_and(|m| m.offset(r.va, 0) == Ok(off)));
            }
            let Some((rkey, va)) = self.write_cur else {
                return;
            };
            match mrs.get_mut(rkey).and_then(|m| m.write(va, payload)) {
                Ok(()) => {}
                Err(_) => {
                    self.push_ack(info.psn, Syndrome::Nak(NakCode::RemoteAccessError));
                    self.enter_err(send_cq, recv_cq);
                    return;
                }
            }
            self.write_cur = Some((rkey, va + payload.len() as u64));
            self.write_left -= payload.len() as u32; // the checks held it to write_left
            self.in_message = if o.has(mask::LAST) {
                InMessage::None
            } else {
                InMessage::Write
            };
            if o.has(mask::LAST) {
                self.write_cur = None;
                if let Some(imm) = info.immdt(frame)
                    && let Some(w) = self.rq.pop_front()
                {
                    let mut c = wc(
                        w.wr_id,
                        WcStatus::Success,
                        WcOpcode::RecvRdmaWithImm,
                        self.write_len,
                        self.qpn,
                    );
                    c.imm_data = Some(imm);
                    let _ = recv_cq.push(c);
                }
                self.msn = self.msn.wrapping_add(1) & 0x00ff_ffff;
            }
        } else if o.has(mask::READ) {
            self.counters.rx_read_requests += 1;
            let r = req.reth.expect("checked");
            let mtu = st.mtu.bytes();
            let count = r.dma_len.div_ceil(mtu).max(1);
            self.msn = self.msn.wrapping_add(1) & 0x00ff_ffff;
            self.rd_atomic_outstanding += 1;
            self.responses.push_back(r_read(
                info.psn, r.rkey, r.va, r.dma_len, count, self.msn, true,
            ));
            self.cfg.rq_psn = self.cfg.rq_psn.add(count);
            return;
        } else if o.has(mask::ATOMIC) {
            self.counters.rx_atomic_requests += 1;
            let a = req.atomic.expect("checked");
            let aop = if info.opcode == op::RC_CMP_SWAP {
                AtomicOp::CompareSwap {
                    compare: a.compare,
                    swap: a.swap_add,
                }
            } else {
                AtomicOp::FetchAdd(a.swap_add)
            };
            let Ok(orig) = mrs.get_mut(a.rkey).and_then(|m| m.atomic(a.va, aop)) else {
                return;
            };
            if self.replay.is_full() {
                self.replay.remove(0);
            }
            self.replay.push((info.psn, orig));
            self.msn = self.msn.wrapping_add(1) & 0x00ff_ffff;
            self.responses.push_back(Response::Atomic {
                psn: info.psn,
                orig,
                msn: self.msn,
            });
            self.cfg.rq_psn = self.cfg.rq_psn.add(1);
            return;
        }
        self.cfg.rq_psn = self.cfg.rq_psn.add(1);
        // ACK when asked, at the end of a message, or after ACK_EVERY packets without one
        // (a peer that rarely sets AckReq still hears from us); queued ACKs coalesce.
        self.unacked += 1;
        if info.ack_req || o.has(mask::LAST) || self.unacked >= ACK_EVERY {
            self.push_ack(info.psn, Syndrome::Ack { credits: 31 });
        }
    }

    /// Something was acknowledged: retries start over and the ACK timer restarts.
    fn progress(&mut self) {
        self.retrying = false;
        self.retries_left = self.cfg.retry_cnt;
        self.rnr_left = self.cfg.rnr_retry;
        self.ack_deadline = None;
        self.arm_ack_timer();
    }

    /// Whether the QP is owed an answer: requests in flight, or (in RTS) requests waiting to
    /// be sent. While it is, the ACK timer runs.
    fn owes_progress(&self) -> bool {
        self.cfg.qp_type == QpType::Rc
            && !self.sq.is_empty()
            && match self.cfg.state {
                QpState::Rts => true,
                // A draining QP starts nothing new: only what is in flight is owed.
                QpState::Sqd => self.sent_hw.diff(self.una) > 0,
                _ => false,
            }
    }

    /// Starts the ACK timer if it is not running and the QP is owed an answer (and is not
    /// waiting out an RNR NAK). It runs whatever the port does: a QP whose frames cannot
    /// leave (its link down, its peer gone) still times out, retries and fails with
    /// RETRY_EXC_ERR after retry_cnt tries, as an RNIC's does.
    fn arm_ack_timer(&mut self) {
        if self.ack_deadline.is_none() && self.rnr_until.is_none() && self.owes_progress() {
            self.ack_deadline = self.cfg.ack_timeout().map(|t| self.now + t);
        }
    }

    /// Retries from `psn` (go back N), or completes the front request with RETRY_EXC_ERR when
    /// retry_cnt tries have gone without progress. Until something new is acknowledged,
    /// acknowledgements still in flight from before start no other retry.
    fn retry(&mut self, psn: Psn, scq: &mut CompletionQueue, rcq: &mut CompletionQueue) {
        self.retrying = true;
        if self.retries_left == 0 {
            self.fail_front(0, WcStatus::RetryExcErr, scq, rcq);
            return;
        }
        self.retries_left -= 1;
        self.rewind(psn);
        // The timer runs again from now, whether or not the resend can leave.
        self.arm_ack_timer();
    }

    /// Go back N: send again from `psn`.
    fn rewind(&mut self, psn: Psn) {
        let i = self
            .sq
            .iter()
            .position(|w| psn.diff(w.first_psn) >= 0 && psn.diff(w.last_psn()) <= 0)
            .unwrap_or(0);
        self.send_idx = i;
        self.send_pkt = match self.sq.get(i) {
            Some(w) if !w.wr.op.is_read_or_atomic() => psn.diff(w.first_psn).max(0) as u32,
            _ => 0,
        };
        self.rd_atomic_inflight = self
            .sq
            .iter()
            .take(i)
            .filter(|w| w.wr.op.is_read_or_atomic())
            .count() as u8;
        self.ack_deadline = None;
    }

    /// Completes the SEND/WRITE requests that were sent whole and end at or before `psn`.
    fn ack_upto(&mut self, psn: Psn, cq: &mut CompletionQueue) -> usize {
        let mut n = 0;
        for (k, w) in self.sq.iter().enumerate() {
            let sent_whole = w.last_psn().diff(self.sent_hw) < 0;
            if !sent_whole || w.last_psn().diff(psn) > 0 || w.wr.op.is_read_or_atomic() {
                break;
            }
            n = k + 1;
        }
        self.complete_upto(n, cq);
        // The oldest unacknowledged PSN moves past `psn`, but never past a READ or atomic
        // still waiting for its response (an ACK does not answer those).
        let mut una = psn.add(1);
        if let Some(w) = self.sq.iter().find(|w| w.wr.op.is_read_or_atomic())
            && una.diff(w.first_psn) > 0
        {
            una = w.first_psn;
        }
        if una.diff(self.una) > 0 {
            self.una = una;
        }
        n
    }

    fn complete(
        &mut self,
        info: &PacketInfo,
        frame: &[u8],
        mrs: &mut MrTable,
        cq: &mut CompletionQueue,
        rcq: &mut CompletionQueue,
    ) {
        let psn = info.psn;
        // An acknowledgement for a PSN never sent (or long acknowledged) is ignored.
        if psn.diff(self.sent_hw) >= 0 || psn.diff(self.una) < -(1 << 22) {
            return;
        }
        // Implied NAK: responses come back in order, so an acknowledgement of any kind for a
        // PSN past an unanswered READ or atomic at the front means its responses were lost.
        // Go back to the oldest unacknowledged PSN (inside that request).
        if let Some(front) = self.sq.front()
            && front.wr.op.is_read_or_atomic()
            && psn.diff(front.last_psn()) > 0
        {
            if !self.retrying {
                self.counters.implied_nak_seq_err += 1;
                self.retry(self.una, cq, rcq);
            }
            return;
        }
        let syndrome = info.aeth(frame).map(|a| a.syndrome);
        match syndrome {
            Some(Syndrome::Nak(NakCode::PsnSequenceError)) => {
                self.counters.packet_seq_err += 1;
                // Everything before `psn` arrived (implied ACK); go back to `psn`. If that moved
                // the oldest unacknowledged PSN, it is progress and the retry count starts over.
                let before = self.una;
                if self.ack_upto(psn.sub(1), cq) > 0 || self.una.diff(before) > 0 {
                    self.progress();
                }
                // A NAK for a retry already under way (a duplicate, or one that crossed our
                // resend) starts nothing new.
                if !self.retrying {
                    self.retry(psn, cq, rcq);
                }
                return;
            }
            Some(Syndrome::Nak(code)) => {
                self.ack_upto(psn.sub(1), cq);
                let status = match code {
                    NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                    NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                    _ => WcStatus::RemInvReqErr,
                };
                self.fail_front(0, status, cq, rcq);
                return;
            }
            Some(Syndrome::RnrNak { timer }) => {
                self.counters.rnr_nak_retry_err += 1;
                self.ack_upto(psn.sub(1), cq);
                if self.cfg.rnr_retry != 7 {
                    if self.rnr_left == 0 {
                        self.fail_front(0, WcStatus::RnrRetryExcErr, cq, rcq);
                        return;
                    }
                    self.rnr_left -= 1;
                }
                self.rewind(psn);
                self.rnr_until = Some(self.now + aeth::rnr_duration(timer));
                return;
            }
            _ => {}
        }
        // READ responses and atomic ACKs carry data for the request they answer.
        if let Some(i) = self
            .sq
            .iter()
            .position(|w| psn.diff(w.first_psn) >= 0 && psn.diff(w.last_psn()) <= 0)
            && self.sq[i].wr.op.is_read_or_atomic()
        {
            // Everything before this request has been acknowledged by implication.
            self.ack_upto(self.sq[i].first_psn.sub(1), cq);
            let i = self
                .sq
                .iter()
                .position(|w| psn.diff(w.first_psn) >= 0 && psn.diff(w.last_psn()) <= 0);
            let Some(i) = i else { return };
            if i != 0 {
                return; // an earlier READ/atomic is still unanswered: wait (or retransmit)
            }
            let w = &self.sq[0];
            let mtu = self.cfg.path_mtu.map_or(1024, |m| m.bytes()) as u64;
            if info.op.has(mask::READ) {
                let ahead = psn.diff(self.una);
                if ahead < 0 || ahead as u32 >= READ_WINDOW {
                    // Already placed, or too far past a hole to keep: asked again later.
                    return;
                }
                if !self.read_win.has(psn) {
                    let at = psn.diff(w.first_psn) as u64 * mtu;
                    // Each response carries one MTU of the READ, the last what is left: a
                    // response longer or shorter than that is a length error (rxe's
                    // check_length), never placed.
                    let payload = info.payload(frame);
                    if payload.len() as u64 != w.len.saturating_sub(at).min(mtu) {
                        self.fail_front(0, WcStatus::LocLenErr, cq, rcq);
                        return;
                    }
                    if scatter(mrs, &w.wr.sg, at, payload).is_err() {
                        self.fail_front(0, WcStatus::LocProtErr, cq, rcq);
                        return;
                    }
                    self.read_win.set(psn);
                    self.una = self.read_win.advance(self.una);
                    if self.una.diff(self.sq[0].last_psn()) > 0 {
                        self.complete_upto(1, cq);
                        self.progress();
                        return;
                    }
                    // New data placed: progress, even if it sits past a hole.
                    self.progress();
                }
                if info.op.has(mask::LAST) && !self.retrying {
                    // The stream ended with holes: ask again from the oldest now rather than
                    // wait for the ACK timer (rxe retries at once on a READ response gap).
                    self.counters.implied_nak_seq_err += 1;
                    self.retry(self.una, cq, rcq);
                }
                return;
            }
            if let Some(a) = info.atomic_ack(frame) {
                if scatter(mrs, &w.wr.sg, 0, &a.orig.to_le_bytes()).is_err() {
                    self.fail_front(0, WcStatus::LocProtErr, cq, rcq);
                    return;
                }
                self.una = psn.add(1);
                self.complete_upto(1, cq);
                self.progress();
            }
            return;
        }
        // A plain ACK covers every SEND/WRITE up to `psn` that was sent whole; it is progress
        // if it completed something or moved the oldest unacknowledged PSN.
        let before = self.una;
        if self.ack_upto(psn, cq) > 0 || self.una.diff(before) > 0 {
            self.progress();
        }
    }

    /// When this QP next needs [`RcQp::handle_timeout`].
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.flush_due {
            return Some(self.now);
        }
        let pacing = (self.paced()
            && self.next_send > self.now
            && self.send_idx < self.sq.len()
            && self.cfg.state == QpState::Rts)
            .then_some(self.next_send);
        [
            self.ack_deadline,
            self.rnr_until,
            self.cc.next_timeout(),
            pacing,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Runs the timers due at `now`: the end of an RNR wait, or the local ACK timeout (go back
    /// to the oldest unacknowledged PSN, or fail with RETRY_EXC_ERR after retry_cnt tries).
    pub fn handle_timeout(
        &mut self,
        now: Instant,
        scq: &mut CompletionQueue,
        rcq: &mut CompletionQueue,
    ) {
        self.now = self.now.max(now);
        self.flush_if_due(scq, rcq);
        self.cc.handle_timeout(now, &self.cc_params);
        if self.rnr_until.is_some_and(|t| t <= now) {
            self.rnr_until = None;
            self.arm_ack_timer();
        }
        if self.ack_deadline.is_some_and(|t| t <= now) {
            self.ack_deadline = None;
            if !self.owes_progress() {
                return;
            }
            self.counters.local_ack_timeout_err += 1;
            self.retry(self.una, scq, rcq);
        }
    }

    /// Completes the first `n` work requests successfully.
    fn complete_upto(&mut self, n: usize, cq: &mut CompletionQueue) {
        if n > 0 {
            self.read_win.clear();
        }
        for _ in 0..n {
            let w = self.sq.pop_front().expect("n <= len");
            if self.send_idx > 0 {
                self.send_idx -= 1;
            } else {
                self.send_pkt = 0; // the cursor was inside it (after a rewind): move past it
            }
            if w.wr.op.is_read_or_atomic() {
                self.rd_atomic_inflight = self.rd_atomic_inflight.saturating_sub(1);
            }
            if w.wr.signaled {
                let ns = self.now.saturating_since(w.posted_at).as_nanos() as u64;
                let _ = self.latencies.try_push((w.wr.op.wc_opcode(), ns));
                let len = w.len as u32;
                let _ = cq.push(wc(
                    w.wr.wr_id,
                    WcStatus::Success,
                    w.wr.op.wc_opcode(),
                    len,
                    self.qpn,
                ));
            }
        }
    }

    /// Completes work request `i` (and, by moving the QP to ERR, flushes all after it and
    /// the receive queue).
    fn fail_front(
        &mut self,
        i: usize,
        status: WcStatus,
        cq: &mut CompletionQueue,
        rcq: &mut CompletionQueue,
    ) {
        match status {
            WcStatus::RetryExcErr => self.counters.req_transport_retries_exceeded += 1,
            WcStatus::RnrRetryExcErr => self.counters.req_rnr_retries_exceeded += 1,
            _ => {}
        }
        self.complete_upto(i, cq);
        self.read_win.clear();
        if let Some(w) = self.sq.pop_front() {
            let _ = cq.push(wc(w.wr.wr_id, status, w.wr.op.wc_opcode(), 0, self.qpn));
        }
        self.enter_err(cq, rcq);
    }

    /// Moves the QP to ERR by itself (a NAK it sent or took, retries run out, a bad local
    /// SG list, a receive too small): its timers stop and both queues are flushed, as a
    /// modify to ERR does.
    fn enter_err(&mut self, scq: &mut CompletionQueue, rcq: &mut CompletionQueue) {
        self.cfg.state = QpState::Err;
        self.ack_deadline = None;
        self.rnr_until = None;
        self.read_win.clear();
        self.flush(scq);
        self.flush_recv(rcq);
    }

    /// Completes what was posted in ERR (see `flush_due`).
    #[inline]
    fn flush_if_due(&mut self, scq: &mut CompletionQueue, rcq: &mut CompletionQueue) {
        if self.flush_due {
            self.flush_due = false;
            self.flush(scq);
            self.flush_recv(rcq);
        }
    }

    /// Flushes every outstanding work request with WR_FLUSH_ERR (the QP is in ERR).
    pub fn flush(&mut self, cq: &mut CompletionQueue) {
        while let Some(w) = self.sq.pop_front() {
            let _ = cq.push(wc(
                w.wr.wr_id,
                WcStatus::WrFlushErr,
                w.wr.op.wc_opcode(),
                0,
                self.qpn,
            ));
        }
        self.send_idx = 0;
        self.send_pkt = 0;
    }

    /// Flushes the receive queue with WR_FLUSH_ERR, the receive a multi-packet SEND was
    /// filling first.
    pub fn flush_recv(&mut self, cq: &mut CompletionQueue) {
        self.in_message = InMessage::None;
        let qpn = self.qpn;
        let cur = self.recv_cur.take().map(|(w, _)| w);
        for w in cur.into_iter().chain(self.rq.drain(..)) {
            let _ = cq.push(wc(w.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0, qpn));
        }
    }
}

fn r_read(psn: Psn, rkey: u32, va: u64, len: u32, count: u32, msn: u32, counted: bool) -> Response {
    Response::Read {
        counted,
        psn,
        rkey,
        va,
        len,
        next: 0,
        count,
        msn,
    }
}

fn wc(
    wr_id: u64,
    status: WcStatus,
    opcode: WcOpcode,
    byte_len: u32,
    qp_num: u32,
) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status,
        opcode,
        byte_len,
        imm_data: None,
        invalidated_rkey: None,
        qp_num,
        src_qp: None,
    }
}

/// Copies `data` into the SG list at message offset `at`, checking keys, bounds and local write.
fn scatter(
    mrs: &mut MrTable,
    sg: &[super::wr::Sge],
    mut at: u64,
    mut data: &[u8],
) -> Result<(), MrError> {
    for s in sg {
        if data.is_empty() {
            break;
        }
        if at >= s.length as u64 {
            at -= s.length as u64;
            continue;
        }
        let n = ((s.length as u64 - at) as usize).min(data.len());
        let r = mrs.get_mut(s.lkey)?;
        if !r.access.contains(super::mr::Access::LOCAL_WRITE) {
            return Err(MrError::AccessDenied);
        }
        r.write(s.addr + at, &data[..n])?;
        data = &data[n..];
        at = 0;
    }
    if data.is_empty() {
        Ok(())
    } else {
        Err(MrError::OutOfBounds)
    }
}

#[cfg(test)]
mod tests;
