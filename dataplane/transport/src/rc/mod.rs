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
use super::qp::{Path, QpAttr, QpConfig, QpState, QpType};
use super::resp_check::{InMessage, Request, ResponderState, Verdict, check};
use super::wr::{
    ACK_EVERY, MAX_INLINE_DATA, MAX_SGE, Plan, RecvWr, SendOp, SendWr, Sge, UdDest, WrError,
    ext_headers, gather, locate, plan,
};
use crate::cc::{Cc, CcKind, DcqcnParams};
use arrayvec::ArrayVec;
use std::collections::VecDeque;
use wire::PacketBuf;
use wire::aeth::{self, NakCode, Syndrome};
use wire::hint::prefetch;
use wire::ipv4::{self, Ecn};
use wire::opcode::{mask, op};
use wire::packet::{
    Checks, ExtRepr, IpRepr, PacketInfo, RoceRepr, Template, build, build_attached,
    build_templated, parse,
};
use wire::time::Instant;
use wire::{Psn, atomic_ack_eth, bth, cnp, deth, eth, ipv6, udp};

mod completer;
mod emit;
mod post;
mod requester;
mod responder;
mod ud;

use completer::Completer;
use requester::Requester;
use responder::Responder;

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

/// A posted send request as the send queue holds it: the request's own fields, with its SG
/// list and UD destination kept at its slot in the requester's side tables
/// ([`RcQp::wqe_sg`]) rather than in the entry, so that an entry is 2 cache lines instead of
/// 5 (a [`SendWr`] carries 8 SG entries and a UD destination, 248 bytes, where most requests
/// use one entry and RC none): posting copies, and a QP's queue holds, what it uses.
#[derive(Clone, Copy, Debug)]
struct QueuedWr {
    wr_id: u64,
    op: SendOp,
    signaled: bool,
    solicited: bool,
    fence: bool,
    /// Entries of its SG list (at its slot of the requester's SG table).
    sg_len: u8,
}

#[derive(Debug)]
struct SendWqe {
    wr: QueuedWr,
    /// Its slot in the requester's side tables (SG list, UD destination, inline bytes): the
    /// post count modulo max_send_wr, free again by the time it comes round (the send queue
    /// retires in order and holds at most max_send_wr).
    slot: u32,
    /// Where its SG list starts in the requester's SG table (`slot * max_send_sge`).
    sge_at: u32,
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

    /// Heap bytes a QP with these caps holds from its creation: the send and receive queues
    /// at their full depth and the send queue's inline slots (what a device sizes its QP
    /// context by; the lcore's slot and the QP's CQs are the device's, see
    /// [`crate::device::qp_footprint`]).
    pub fn queue_bytes(&self) -> usize {
        let (s, r) = (self.max_send_wr as usize, self.max_recv_wr as usize);
        // A send WQE, its SG entries, its inline bytes and its completion latency (the
        // completer's log); a UD QP's also its destination.
        let ud = if self.qp_type == QpType::Ud {
            std::mem::size_of::<UdDest>()
        } else {
            0
        };
        s * (std::mem::size_of::<SendWqe>()
            + self.max_send_sge as usize * std::mem::size_of::<Sge>()
            + ud
            + self.max_inline_data as usize
            + std::mem::size_of::<(WcOpcode, u64)>())
            + r * std::mem::size_of::<RecvWr>()
    }
}

impl SendWqe {
    fn last_psn(&self) -> Psn {
        self.first_psn.add(self.plan.psns - 1)
    }
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
    sq: VecDeque<SendWqe>,
    /// READs and atomics in `sq` (every ACK looks for the first of them only when there is
    /// one: searching the whole queue for none cost each ACK a walk of it).
    sq_rd_atomic: usize,
    now: Instant,
    // Congestion control.
    cc: Cc,
    cc_params: DcqcnParams,
    /// What happened on this QP.
    pub counters: QpCounters,
    /// The port computes IPv4 header checksums on transmit.
    tx_offload: bool,
    tx_attach: bool,
    /// Receives were posted while in ERR: they complete (flushed) in the next
    /// `handle_timeout`, which `poll_timeout` asks for at once (kept off the per-packet calls).
    flush_due: bool,
    /// The requester's state (requester.rs).
    req: Requester,
    /// The completer's state (completer.rs).
    comp: Completer,
    /// The responder's state (responder.rs).
    resp: Responder,
    /// The path's Ethernet, IPv4 and UDP headers as bytes, and the path they were made for
    /// (emit.rs): frames to it are copies patched per packet. Remade by `modify`; a frame to
    /// any other path (a UD destination, a path changed behind it) is emitted field by field.
    tmpl: Option<(Path, Template)>,
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
            sq: VecDeque::with_capacity(caps.max_send_wr as usize),
            sq_rd_atomic: 0,
            now: Instant::ZERO,
            cc: Cc::new(CcKind::None, 0.0),
            cc_params: DcqcnParams::nvidia(),
            counters: QpCounters::default(),
            tx_offload: false,
            tx_attach: false,
            flush_due: false,

            req: Requester::new(caps),
            comp: Completer::new(caps),
            resp: Responder::new(caps),
            tmpl: None,
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
    /// most a send queue's worth (`max_send_wr`) between calls (the host takes them after
    /// every frame it hands the QP, and a frame completes at most the whole queue); beyond
    /// that, more are not kept.
    pub fn take_latencies(&mut self, mut f: impl FnMut(WcOpcode, u64)) {
        for (op, ns) in self.comp.latencies.drain(..) {
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
    pub fn modify(&mut self, a: &QpAttr) -> Result<(), super::qp::ModifyError> {
        self.cfg.modify(a)?;
        if let Some(p) = self.cfg.path.as_mut() {
            // IPv4-mapped GIDs as the IPv4 addresses the wire carries, so that the receive
            // path compares addresses as they are (see `handle_parsed`).
            p.local_ip = p.local_ip.to_canonical();
            p.remote_ip = p.remote_ip.to_canonical();
        }
        self.refresh_template();
        if a.sq_psn.is_some() {
            self.req.next_psn = self.cfg.sq_psn;
            self.comp.una = self.cfg.sq_psn;
            self.req.sent_hw = self.cfg.sq_psn;
        }
        self.comp.retries_left = self.cfg.retry_cnt;
        self.comp.rnr_left = self.cfg.rnr_retry;
        Ok(())
    }

    /// Builds the header template from `cfg.path` again: whatever changes `cfg.path` calls it,
    /// since a frame to `cfg.path` takes the template without comparing the paths
    /// ([`RcQp::emit_on`]).
    pub(crate) fn refresh_template(&mut self) {
        self.tmpl = self.cfg.path.and_then(|p| {
            let r = self.repr_on(
                p,
                &self.bth(op::RC_SEND_ONLY, Psn::new(0), false, false),
                &ExtRepr::default(),
            )?;
            Some((p, Template::new(&r)?))
        });
    }

    /// Takes a QP in RESET through INIT and RTR to RTS with the attributes of `a`
    /// ([`QpAttr::rc_steps`]; [`QpAttr::connect`] gives them all); stops at the first
    /// refused step.
    pub fn connect(&mut self, a: &QpAttr) -> Result<(), super::qp::ModifyError> {
        if self.cfg.qp_type == QpType::Ud {
            return Err(super::qp::ModifyError::Datagram);
        }
        for step in a.rc_steps() {
            self.modify(&step)?;
        }
        Ok(())
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

    /// Starts loading the state a turn at sending touches first (configuration, send queue,
    /// the three engines, counters, congestion control, the path's template), for a QP whose
    /// turn comes soon ([`crate::device::Device::transmit`] asks two QPs ahead): among many
    /// QPs it has left the cache since its last turn, and loads started together overlap
    /// instead of each waiting its turn.
    #[inline]
    pub fn prefetch(&self) {
        prefetch(&self.cfg);
        prefetch(&self.sq);
        prefetch(&self.req);
        prefetch(&self.comp.una);
        prefetch(&self.resp);
        prefetch(&self.counters);
        prefetch(&self.cc);
        prefetch(&self.tmpl);
    }

    /// Starts loading the request at the send cursor (where the next frame comes from); for a
    /// QP whose state [`RcQp::prefetch`] asked for a little earlier, as reading the cursor
    /// waits for that state.
    #[inline]
    pub fn prefetch_next_wqe(&self) {
        if let Some(w) = self.sq.get(self.req.send_idx) {
            let p: *const u8 = (w as *const SendWqe).cast();
            for off in (0..size_of::<SendWqe>()).step_by(64) {
                prefetch(p.wrapping_add(off));
            }
            // And its SG list, at its slot of the side table.
            if let Some(s) = self.req.sge.get(w.sge_at as usize) {
                prefetch(s);
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
            self.receive_datagram(info, frame, mrs, send_cq, recv_cq);
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
                self.respond(info, frame, mrs, send_cq, recv_cq);
            }
        } else if info.op.has(mask::ACK) {
            self.complete(info, frame, mrs, send_cq, recv_cq);
        }
    }

    /// When this QP next needs [`RcQp::handle_timeout`].
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.flush_due {
            return Some(self.now);
        }
        let pacing = (self.paced()
            && self.req.next_send > self.now
            && self.req.send_idx < self.sq.len()
            && self.cfg.state == QpState::Rts)
            .then_some(self.req.next_send);
        [
            self.comp.ack_deadline,
            self.comp.rnr_until,
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
        if self.comp.rnr_until.is_some_and(|t| t <= now) {
            self.comp.rnr_until = None;
            self.arm_ack_timer();
        }
        if self.comp.ack_deadline.is_some_and(|t| t <= now) {
            self.comp.ack_deadline = None;
            if !self.owes_progress() {
                return;
            }
            self.counters.local_ack_timeout_err += 1;
            self.retry(self.comp.una, scq, rcq);
        }
    }

    /// Moves the QP to ERR by itself (a NAK it sent or took, retries run out, a bad local
    /// SG list, a receive too small): its timers stop and both queues are flushed, as a
    /// modify to ERR does.
    fn enter_err(&mut self, scq: &mut CompletionQueue, rcq: &mut CompletionQueue) {
        self.cfg.state = QpState::Err;
        self.comp.stop();
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
        self.sq_rd_atomic = 0;
        while let Some(w) = self.sq.pop_front() {
            let _ = cq.push(wc(
                w.wr.wr_id,
                WcStatus::WrFlushErr,
                w.wr.op.wc_opcode(),
                0,
                self.qpn,
            ));
        }
        self.req.send_idx = 0;
        self.req.send_pkt = 0;
    }

    /// Flushes the receive queue with WR_FLUSH_ERR, the receive a multi-packet SEND was
    /// filling first.
    pub fn flush_recv(&mut self, cq: &mut CompletionQueue) {
        self.resp.in_message = InMessage::None;
        let qpn = self.qpn;
        let cur = self.resp.recv_cur.take().map(|(w, _)| w);
        for w in cur.into_iter().chain(self.resp.rq.drain(..)) {
            let _ = cq.push(wc(w.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0, qpn));
        }
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

/// Copies `data` into the SG list at message offset `at`, checking keys (of the QP's PD),
/// bounds and local write.
fn scatter(
    mrs: &mut MrTable,
    pd: PdHandle,
    sg: &[crate::wr::Sge],
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
        let r = mrs.local_mut(s.lkey, pd)?;
        if !r.access.contains(crate::mr::Access::LOCAL_WRITE) {
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
