//! The RC transport on an lcore: an [`RdmaHost`] owns this lcore's memory regions and QPs and
//! runs them as a [`Handler`] of the poll loop.
//!
//! Received RoCEv2 frames go to the QP their BTH names (found by index, no search); a QP that
//! may have something to send (after a frame, a post or a timer) goes on a ready list and is
//! polled into freshly allocated buffers, the payload gathered straight from the MR into the
//! buffer (one copy), headers in front. Each QP's next deadline (ACK timeout, RNR wait, DCQCN
//! timer, pacing) sits in a timer queue, so idle QPs cost nothing and nothing scans all QPs.
//! The control thread (and applications in the process) drive it with [`RdmaCommand`]s over the
//! loop's command channel; replies come back on the channel each command carries.
//!
//! QP numbers encode their owner: bits 20-23 are the lcore's shard, bits 0-19 the index in
//! its table, so any lcore can tell whose a QP is from the BTH alone. A frame that arrives on
//! another lcore's queue (ports without RSS, or flows hashed elsewhere) is handed to its owner
//! through a lock-free single-producer single-consumer ring ([`RdmaHost::sharded`]), counted as
//! a handoff; memory regions belong to the lcore they were registered on.

use crate::PacketBuf;
use crate::cc::{CcKind, DcqcnParams};
use crate::counters::DropReason;
use crate::lcore::{Handler, Io};
use crate::port::{Burst, PortQueue};
use crate::wire::packet::{Checks, parse};
use crossbeam_channel::Sender;
use std::collections::VecDeque;
use transport::cq::{CompletionQueue, LatencyHistograms, WorkCompletion};
use transport::mr::{Access, MrError, MrTable, PdHandle};
use transport::qp::QpAttr;
use transport::rc::{CapsError, Connect, PostError, QpCaps, QpCounters, RcQp};
use transport::timers::TimerQueue;
use transport::wr::{RecvWr, SendWr};

/// Bits of a QPN below the owner's shard.
pub const QPN_SHARD_SHIFT: u32 = 20;
/// Packets one QP may send per loop iteration before the others get a turn.
const QP_BUDGET: usize = 32;
/// Frames all QPs together may queue per loop iteration: about what the loop receives per
/// iteration ([`crate::lcore::RX_BURSTS_PER_POLL`] bursts), so ACKs keep pace with the data
/// they acknowledge however many QPs send.
const TX_PER_POLL: usize = crate::lcore::RX_BURSTS_PER_POLL * crate::BURST_SIZE;
/// A destroyed QP's number is given out again only once this many others are free: frames
/// still in flight to the old QP (its peer's retransmissions, a READ response, an ACK) must
/// not land on a new QP that took its number and is connected to the same node, which would
/// NAK them (out_of_sequence) and send its own peer a stray NAK (packet_seq_err). RNICs and
/// rxe (`xa_alloc_cyclic`) rotate QP numbers for the same reason. It costs this many unused
/// slots per lcore at most.
pub const QPN_QUARANTINE: usize = 1024;
/// Frames each handoff ring holds.
pub const HANDOFF_RING: usize = 4096;

/// The shard (owning lcore) of a QP number.
pub fn shard_of(qpn: u32) -> u32 {
    (qpn >> QPN_SHARD_SHIFT) & 0xf
}

/// What the control side asks of the host. Replies go back on the channel given.
#[derive(Debug)]
pub enum RdmaCommand {
    /// Registers `len` zeroed bytes at virtual address `va` with `access`; replies the key
    /// (lkey = rkey).
    RegMr {
        /// Virtual address the region answers to.
        va: u64,
        /// Bytes.
        len: usize,
        /// Rights.
        access: Access,
        /// The key.
        reply: Sender<Result<u32, MrError>>,
    },
    /// Installs a region the control plane registered node-wide: the same key, address and
    /// memory on every lcore, so any lcore's QPs can use it.
    RegShared {
        /// The key the node allocated (lkey = rkey).
        key: u32,
        /// Its protection domain.
        pd: u32,
        /// Virtual address the region answers to.
        va: u64,
        /// Rights.
        access: Access,
        /// The memory, shared with the other lcores (a handle to it: dataplane's hugepage
        /// `SharedMem` on a node).
        mem: Box<dyn transport::mr::MrMemory>,
        /// Done, or why not.
        reply: Sender<Result<(), MrError>>,
    },
    /// Makes `pd` a protection domain on this lcore (the control plane numbers them).
    AllocPd {
        /// The number.
        pd: u32,
        /// Done.
        reply: Sender<()>,
    },
    /// Frees a protection domain; refused while a region or QP of this lcore is in it.
    DeallocPd {
        /// The number.
        pd: u32,
        /// Done, or why not.
        reply: Sender<Result<(), String>>,
    },
    /// Creates a completion queue for `cqe` completions on this lcore; replies its number
    /// (bits 20-23 name this lcore, as in QPNs).
    CreateCq {
        /// Capacity.
        cqe: usize,
        /// The CQ number, or why not.
        reply: Sender<Result<u32, String>>,
    },
    /// Destroys a CQ; refused while a QP uses it.
    DestroyCq {
        /// The CQ.
        cqn: u32,
        /// Done, or why not.
        reply: Sender<Result<(), String>>,
    },
    /// Takes up to `max` completions from a CQ (0: only its state).
    PollCqn {
        /// The CQ.
        cqn: u32,
        /// At most.
        max: usize,
        /// The completions and the CQ's state, or None if there is no such CQ.
        reply: Sender<Option<(Vec<WorkCompletion>, CqState)>>,
    },
    /// Removes a region; its key stops working on this lcore at once.
    DeregMr {
        /// The key.
        key: u32,
        /// Done, or why not.
        reply: Sender<Result<(), MrError>>,
    },
    /// Copies `data` into a region at `va` (an operator's or test's slow path).
    WriteMr {
        /// The region's key.
        key: u32,
        /// Where.
        va: u64,
        /// What.
        data: Vec<u8>,
        /// Done.
        reply: Sender<Result<(), MrError>>,
    },
    /// Reads `len` bytes of a region at `va`.
    ReadMr {
        /// The region's key.
        key: u32,
        /// Where.
        va: u64,
        /// How many.
        len: usize,
        /// The bytes.
        reply: Sender<Result<Vec<u8>, MrError>>,
    },
    /// Creates a QP in RESET; replies its QPN.
    CreateQp {
        /// Caps.
        caps: QpCaps,
        /// Its protection domain (None: the default, 0).
        pd: Option<u32>,
        /// The CQs its send and receive completions go to (None: a CQ of its own, polled
        /// with [`RdmaCommand::PollCq`]).
        cqs: [Option<u32>; 2],
        /// Congestion control.
        cc: CcKind,
        /// DCQCN settings.
        params: DcqcnParams,
        /// The QPN, or why not.
        reply: Sender<Result<u32, String>>,
    },
    /// Changes a QP's congestion control: `kind` (a different kind starts a fresh controller
    /// at the line rate) and the DCQCN settings (a DCQCN QP's rate and alpha carry on).
    SetCc {
        /// The QP.
        qpn: u32,
        /// The kind, if it changes.
        kind: Option<CcKind>,
        /// The DCQCN settings.
        params: DcqcnParams,
        /// Done, or why not.
        reply: Sender<Result<(), String>>,
    },
    /// Creates `count` QPs in RESET (default PD, CQs of their own), all or none.
    CreateQps {
        /// How many.
        count: usize,
        /// Caps of each.
        caps: QpCaps,
        /// Congestion control.
        cc: CcKind,
        /// DCQCN settings.
        params: DcqcnParams,
        /// Their QPNs, or why not.
        reply: Sender<Result<Vec<u32>, String>>,
    },
    /// Streams on several QPs at once (a perftest run with several QPs): each QP posts `count`
    /// copies of its own request, `depth` outstanding; replies once all are done, with their
    /// sum and the time from the start to the last completion.
    Streams {
        /// Each QP and the request it repeats.
        qps: Vec<(u32, SendWr)>,
        /// Requests per QP.
        count: u64,
        /// Outstanding per QP.
        depth: usize,
        /// Stop posting after this long, as for `Stream`.
        duration: Option<core::time::Duration>,
        /// The result, or why it could not start.
        reply: Sender<Result<StreamResult, String>>,
    },
    /// Takes a QP to RTS, its packets leaving by `port`.
    Connect {
        /// The QP.
        qpn: u32,
        /// How.
        c: Box<Connect>,
        /// The port for its path.
        port: usize,
        /// Done, or why not.
        reply: Sender<Result<(), String>>,
    },
    /// Takes several QPs to RTS, their packets leaving by `port`; all or none.
    ConnectMany {
        /// Each QP and how.
        list: Vec<(u32, Connect)>,
        /// The port for their paths.
        port: usize,
        /// Done, or the first refusal.
        reply: Sender<Result<(), String>>,
    },
    /// Modifies a QP (ibv_modify_qp); `port` is the port its packets leave by, when the
    /// attributes give a path.
    Modify {
        /// The QP.
        qpn: u32,
        /// What to change.
        attr: Box<QpAttr>,
        /// Port for the path.
        port: usize,
        /// Done, or why not.
        reply: Sender<Result<(), String>>,
    },
    /// A QP's attributes and counters.
    Query {
        /// The QP.
        qpn: u32,
        /// What it is, or None if there is no such QP.
        reply: Sender<Option<QpQuery>>,
    },
    /// Posts a send work request.
    PostSend {
        /// The QP.
        qpn: u32,
        /// The request.
        wr: Box<SendWr>,
        /// Taken, or why not.
        reply: Sender<Result<(), String>>,
    },
    /// Posts a receive work request.
    PostRecv {
        /// The QP.
        qpn: u32,
        /// The request.
        wr: Box<RecvWr>,
        /// Taken, or why not.
        reply: Sender<Result<(), String>>,
    },
    /// Takes up to `max` completions from a QP's own send and receive CQs (a side bound to a
    /// created CQ has none: poll that CQ).
    PollCq {
        /// The QP.
        qpn: u32,
        /// At most.
        max: usize,
        /// Send completions, then receive completions.
        reply: Sender<(Vec<WorkCompletion>, Vec<WorkCompletion>)>,
    },
    /// Ends every stream, receive stream and latency test on this lcore now (the node is
    /// stopping): their QPs go to ERR, their work is flushed, and each test answers its
    /// caller with what it had done; replies how many QPs it stopped.
    CancelTests {
        /// How many.
        reply: Sender<usize>,
    },
    /// This lcore's counters: the sum over its QPs, destroyed ones included, and handoffs.
    Counters {
        /// The totals.
        reply: Sender<HostCounters>,
    },
    /// A copy of this lcore's completion-latency histograms (since it started).
    Latencies {
        /// The copy.
        reply: Sender<LatencyHistograms>,
    },
    /// Posts `count` copies of `wr` (wr_id counting down from its own + count), keeping
    /// `depth` outstanding, on the lcore itself; replies when all have completed. The QP's
    /// send completions go to the stream meanwhile.
    Stream {
        /// The QP.
        qpn: u32,
        /// The request to repeat.
        wr: Box<SendWr>,
        /// How many.
        count: u64,
        /// Outstanding at most.
        depth: usize,
        /// Stop posting after this long (perftest's -D), whatever is left of `count`.
        duration: Option<core::time::Duration>,
        /// The result when done, or why it could not start.
        reply: Sender<Result<StreamResult, String>>,
    },
    /// Receives `count` messages on the lcore itself (perftest's SEND bandwidth server):
    /// `posted` receives of `recv` are already posted, and each completed one is reposted
    /// while more are needed; replies when all have arrived. The QP's receive completions go
    /// to the stream meanwhile. With a `duration` (perftest's -D) `count` is ignored and the
    /// stream keeps time as perftest's SEND server does: from the first arrival it waits a
    /// margin (a quarter of the whole seconds of `duration`), counts what arrives for
    /// `duration`, keeps reposting for the margin and [`RECV_DRAIN`] more (so the sender's
    /// last messages find receives), then replies.
    RecvStream {
        /// The QP.
        qpn: u32,
        /// The receive to repost.
        recv: Box<RecvWr>,
        /// Messages to receive.
        count: u64,
        /// Receives posted before.
        posted: u64,
        /// Count arrivals for this long instead.
        duration: Option<core::time::Duration>,
        /// The result (elapsed from the first arrival to the last), or why it could not start.
        reply: Sender<Result<StreamResult, String>>,
    },
    /// `RecvStream` on several QPs of this lcore at once (a SEND bandwidth server with
    /// several QPs): `count` messages and `posted` receives each; one reply, the sum, from
    /// the first arrival on any of them to the last.
    RecvStreams {
        /// The QPs.
        qpns: Vec<u32>,
        /// The receive to repost.
        recv: Box<RecvWr>,
        /// Messages to receive on each.
        count: u64,
        /// Receives posted before on each.
        posted: u64,
        /// Count arrivals for this long instead (from the first arrival on each QP).
        duration: Option<core::time::Duration>,
        /// The result, or why it could not start.
        reply: Sender<Result<StreamResult, String>>,
    },
    /// Runs one of perftest's latency tests on a connected QP, on the lcore itself; replies
    /// when it is done. The QP's send (and, for SEND, receive) completions go to the test
    /// meanwhile. With a `duration` (perftest's -D) `iters` is ignored: the test runs that
    /// long and keeps time as perftest does ([`LatSample`]).
    Latency {
        /// The QP.
        qpn: u32,
        /// Which test.
        kind: Box<LatKind>,
        /// The request each iteration posts.
        wr: Box<SendWr>,
        /// Iterations.
        iters: u64,
        /// Run this long instead of `iters` iterations.
        duration: Option<core::time::Duration>,
        /// This side is perftest's server (it matters for who goes first).
        server: bool,
        /// When each iteration was posted, or why the test could not run.
        reply: Sender<Result<LatResult, String>>,
    },
    /// Destroys a QP (its outstanding work is dropped with it).
    DestroyQp {
        /// The QP.
        qpn: u32,
        /// Done, or no such QP.
        reply: Sender<bool>,
    },
    /// Destroys several QPs in one command (a round trip each would take minutes for 100k).
    DestroyMany {
        /// The QPs.
        qpns: Vec<u32>,
        /// How many of them existed and are gone.
        reply: Sender<usize>,
    },
}

/// What an lcore's host reports.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostCounters {
    /// Its QPs' counters summed (destroyed QPs included).
    pub qp: QpCounters,
    /// Frames it handed to the lcore owning their QP.
    pub handoffs: u64,
    /// Frames dropped because a handoff ring was full.
    pub handoff_drops: u64,
    /// Its QPs now, by state (indexed as [`QpState::ALL`](transport::qp::QpState::ALL)).
    pub qp_states: [u32; 7],
    /// Its QPs under DCQCN now.
    pub dcqcn: DcqcnSummary,
}

/// DCQCN over one lcore's QPs at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DcqcnSummary {
    /// QPs whose congestion control is DCQCN.
    pub qps: u32,
    /// Of those, QPs sending below the line rate (cut by CNPs and not yet recovered).
    pub limited: u32,
    /// The lowest current rate among them, bits per second (0 without any).
    pub min_rate_bps: f64,
    /// Their current rates summed, bits per second.
    pub sum_rate_bps: f64,
    /// The highest alpha (DCQCN's congestion estimate, 0 to 1) among them.
    pub max_alpha: f64,
}

/// perftest's latency tests, as the lcore runs them.
#[derive(Clone, Debug)]
pub enum LatKind {
    /// READ or atomic (`run_iter_lat`): one request at a time, the next posted as the last
    /// completes.
    Request,
    /// WRITE ping-pong (`run_iter_lat_write`): each WRITE sets the message's last byte to the
    /// iteration number; a side posts its next WRITE once the peer's has set the byte at
    /// `poll` (key, address) to the count it expects. `mark` (key, address) is that byte in
    /// our source. The server posts first.
    Write {
        /// The byte the peer's WRITEs land on.
        poll: (u32, u64),
        /// The last byte of our source.
        mark: (u32, u64),
    },
    /// SEND ping-pong (`run_iter_lat_send`): each side sends when the peer's message has
    /// arrived; `rx_depth` receives of `recv` are already posted and are reposted as they
    /// complete. The client posts first.
    Send {
        /// The receive to repost.
        recv: RecvWr,
        /// Receives posted before the test.
        rx_depth: u64,
    },
}

/// What a latency test measured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatResult {
    /// When each iteration's request was posted, nanoseconds of lcore time from the first
    /// (perftest's `tposted`): their differences are the round trips. Empty for a timed test.
    pub posted_ns: Vec<u64>,
    /// A timed test's sample (None for a test of so many iterations).
    pub sample: Option<LatSample>,
    /// Requests that completed in error (the test stops at the first).
    pub errors: u64,
    /// Why it stopped early: the first error completion's status and opcode, or what failed.
    pub failure: Option<String>,
    /// From the start to the end of the test, nanoseconds of lcore time.
    pub elapsed_ns: u64,
}

/// What a timed latency test (perftest's -D) counted. It keeps perftest's clock: a margin of
/// a quarter of the whole seconds, then the sample window (the duration less two margins),
/// then the margin again; completions within the window are the iterations, and the
/// window's length divided by them is the average round trip (perftest's `t_avg`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatSample {
    /// Requests that completed within the window.
    pub iters: u64,
    /// The window's length as the lcore clocked it, ns.
    pub window_ns: u64,
}

/// A timed latency test's clock (see [`LatSample`]), ns from its start.
#[derive(Clone, Copy, Debug)]
struct LatClock {
    margin_ns: u64,
    duration_ns: u64,
    opened: Option<crate::time::Instant>,
    closed: Option<crate::time::Instant>,
    iters: u64,
}

impl LatClock {
    fn new(d: core::time::Duration) -> Self {
        LatClock {
            // perftest: margin = duration / 4, in whole seconds.
            margin_ns: d.as_secs() / 4 * 1_000_000_000,
            duration_ns: d.as_nanos().min(u64::MAX as u128) as u64,
            opened: None,
            closed: None,
            iters: 0,
        }
    }

    /// Moves the window on to `since` ns after the start; true once the test is over.
    fn tick(&mut self, now: crate::time::Instant, since: u64) -> bool {
        if self.opened.is_none() && since >= self.margin_ns {
            self.opened = Some(now);
        }
        if self.closed.is_none() && since >= self.duration_ns.saturating_sub(self.margin_ns) {
            self.closed = Some(now);
        }
        since >= self.duration_ns
    }

    /// Counts `n` completions seen now.
    fn completed(&mut self, n: u64) {
        if self.opened.is_some() && self.closed.is_none() {
            self.iters += n;
        }
    }

    fn sample(&self) -> LatSample {
        let window_ns = match (self.opened, self.closed) {
            (Some(o), Some(c)) => c.0.saturating_sub(o.0),
            _ => 0,
        };
        LatSample {
            iters: self.iters,
            window_ns,
        }
    }
}

/// Where a latency test stands: perftest's loop (wait for the peer, post, count the
/// completion), each blocking point a return that the next poll resumes.
struct Lat {
    kind: LatKind,
    wr: SendWr,
    iters: u64,
    server: bool,
    scnt: u64,
    rcnt: u64,
    ccnt: u64,
    /// Completions and receives taken from the CQs and not yet consumed by the loop.
    sends_done: u64,
    recvs_done: u64,
    /// Receives reposted so far (SEND).
    reposted: u64,
    step: LatStep,
    started: crate::time::Instant,
    /// A timed test's clock (its `iters` is then unbounded).
    clock: Option<LatClock>,
    posted: Vec<u64>,
    errors: u64,
    failure: Option<String>,
    reply: Sender<Result<LatResult, String>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LatStep {
    Wait,
    Post,
    Complete,
}

/// A completion queue's state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CqState {
    /// Capacity.
    pub cqe: usize,
    /// Completions waiting.
    pub waiting: usize,
    /// QPs whose send or receive completions go to it.
    pub users: u32,
    /// It overflowed (completions were lost; its QPs' completions are refused from then on).
    pub in_error: bool,
}

/// What [`RdmaCommand::Query`] tells of a QP.
#[derive(Clone, Debug)]
pub struct QpQuery {
    /// Its protection domain.
    pub pd: u32,
    /// The created CQs its send and receive completions go to (None: its own).
    pub cqs: [Option<u32>; 2],
    /// Its attributes (state, PSNs, remote QP, path, ...).
    pub cfg: transport::qp::QpConfig,
    /// Its counters.
    pub counters: QpCounters,
    /// The port its packets leave by.
    pub port: usize,
    /// Its caps.
    pub caps: QpCaps,
    /// Its DCQCN settings (used when its congestion control is DCQCN).
    pub cc_params: DcqcnParams,
    /// Its congestion control: "dcqcn" or "none".
    pub cc_kind: &'static str,
    /// The rate it may send at now, bits per second.
    pub rate_bps: f64,
    /// DCQCN's target rate and alpha (None without DCQCN).
    pub dcqcn: Option<(f64, f64)>,
}

struct Slot {
    qp: RcQp,
    port: usize,
    /// Its own CQs; for a side bound to a created CQ, where completions wait until
    /// [`RdmaHost::settle`] moves them there.
    scq: CompletionQueue,
    rcq: CompletionQueue,
    /// Created CQs (indices in `RdmaHost::cqs`) its send and receive completions go to.
    bound: [Option<u32>; 2],
    ready: bool,
    stream: Option<Stream>,
    rstream: Option<RecvStream>,
    lat: Option<Lat>,
}

/// A stream of identical work requests the lcore keeps posted itself (the perf engine's core:
/// no control round trip per message).
struct Stream {
    wr: SendWr,
    depth: usize,
    to_post: u64,
    outstanding: usize,
    done: u64,
    errors: u64,
    started: crate::time::Instant,
    /// No more posts from this time on (duration mode).
    until: Option<crate::time::Instant>,
    /// The fewest nanoseconds per completed work request over any prefix of the run.
    best_ns_per_wr: f64,
    reply: StreamReply,
}

impl Stream {
    /// A stream starting `now`: `count` copies of `wr`, `depth` outstanding, posting for
    /// `duration` at most.
    fn new(
        wr: SendWr,
        (count, depth, duration): (u64, usize, Option<core::time::Duration>),
        now: crate::time::Instant,
        reply: StreamReply,
    ) -> Stream {
        Stream {
            wr,
            depth: depth.max(1),
            to_post: count,
            outstanding: 0,
            done: 0,
            errors: 0,
            started: now,
            until: duration.map(|d| now + d),
            best_ns_per_wr: f64::INFINITY,
            reply,
        }
    }

    /// Its errors, and, when it ends early, what it had not done (in duration mode what it
    /// had not posted is not owed: its count is only a bound).
    fn undone(&self) -> u64 {
        let unposted = if self.until.is_some() {
            0
        } else {
            self.to_post
        };
        self.errors
            .saturating_add(unposted)
            .saturating_add(self.outstanding as u64)
    }
}

/// Posts a copy of `wr` under `wr_id` (a stream's or a latency test's next request), its
/// inline bytes gathered first.
fn post_copy(qp: &mut RcQp, mrs: &MrTable, wr: &SendWr, wr_id: u64) -> Result<(), PostError> {
    if !wr.inline {
        // (Not through `inline_bytes`: its answer, 520 bytes, is copied even when empty.)
        return qp.post_send_copy(wr, wr_id, None);
    }
    let d = transport::wr::inline_bytes(mrs, wr)?;
    qp.post_send_copy(wr, wr_id, d.as_deref())
}

/// Where a finished stream reports.
enum StreamReply {
    /// Its own caller.
    One(Sender<Result<StreamResult, String>>),
    /// The group (index in `RdmaHost::groups`) of a several-QP run.
    Group(usize),
}

/// A several-QP run: its streams report here; the last one to finish replies.
struct StreamGroup {
    remaining: usize,
    completed: u64,
    errors: u64,
    started: crate::time::Instant,
    /// The first arrival on any member (receive streams), from which its time runs.
    first: Option<crate::time::Instant>,
    reply: Sender<Result<StreamResult, String>>,
}

/// A stream of receives the lcore keeps posted itself.
struct RecvStream {
    recv: RecvWr,
    count: u64,
    /// A timed stream's window in ns (perftest's -D): arrivals are counted within it, after
    /// a margin from the first one; `count` is unused.
    window_ns: Option<u64>,
    /// A timed stream's margin in ns before and after its window.
    margin_ns: u64,
    /// Arrivals outside a timed stream's window (received and reposted, not counted).
    uncounted: u64,
    /// Receives posted so far, before and during the stream.
    posted: u64,
    done: u64,
    errors: u64,
    first: Option<crate::time::Instant>,
    best_ns_per_wr: f64,
    reply: StreamReply,
}

/// How long a timed receive stream keeps reposting after its window: the sender's last
/// messages, posted up to its own deadline, must still find receives (a sender's run ends
/// when everything it posted has completed).
pub const RECV_DRAIN: core::time::Duration = core::time::Duration::from_secs(1);

impl RecvStream {
    fn new(
        recv: RecvWr,
        count: u64,
        posted: u64,
        duration: Option<core::time::Duration>,
        reply: StreamReply,
    ) -> Self {
        RecvStream {
            recv,
            count,
            window_ns: duration.map(|d| d.as_nanos().min(u64::MAX as u128) as u64),
            // perftest: margin = duration / 4, in whole seconds.
            margin_ns: duration.map_or(0, |d| d.as_secs() / 4 * 1_000_000_000),
            uncounted: 0,
            posted,
            done: 0,
            errors: 0,
            first: None,
            best_ns_per_wr: f64::INFINITY,
            reply,
        }
    }

    /// What it has not received, as errors: the rest of the count, or for a timed stream
    /// that was cut short, one.
    fn undone(&self) -> u64 {
        match self.window_ns {
            Some(_) => 1,
            None => self.count - self.done,
        }
    }

    /// Whether it wants another receive posted (besides room on the QP).
    fn wants_more(&self) -> bool {
        self.window_ns.is_some() || self.posted < self.count
    }

    /// Whether it is over at `now`.
    fn over(&self, now: crate::time::Instant) -> bool {
        match (self.window_ns, self.first) {
            (Some(w), Some(f)) => {
                let total = w
                    .saturating_add(2 * self.margin_ns)
                    .saturating_add(RECV_DRAIN.as_nanos() as u64);
                now.0.saturating_sub(f.0) >= total
            }
            (Some(_), None) => false,
            (None, _) => self.done + self.errors >= self.count,
        }
    }
}

/// What a stream did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StreamResult {
    /// Work requests completed successfully.
    pub completed: u64,
    /// Work requests completed in error or never posted.
    pub errors: u64,
    /// From the first post to the last completion, nanoseconds of lcore time.
    pub elapsed_ns: u64,
    /// The fewest nanoseconds per work request from the first post to any completion
    /// (perftest's peak: the best the run ever averaged since its start).
    pub best_ns_per_wr: f64,
}

/// This lcore's RDMA state.
pub struct RdmaHost<B> {
    shard: u32,
    port: usize,
    mrs: MrTable,
    pd: PdHandle,
    slots: Vec<Option<Slot>>,
    /// Indices of destroyed QPs, oldest first (see [`QPN_QUARANTINE`]).
    free: VecDeque<u32>,
    /// Created completion queues and how many QP sides use each (index 0 unused).
    cqs: Vec<Option<(CompletionQueue, u32)>>,
    cq_free: Vec<u32>,
    ready: VecDeque<u32>,
    timers: TimerQueue<u32>,
    /// A buffer allocated for a QP that then had nothing to send, kept for the next one.
    spare: Option<B>,
    line_bps: f64,
    /// Counters of QPs already destroyed.
    retired: QpCounters,
    /// Rings to the other shards (index = shard; None for this one).
    to: Vec<Option<rtrb::Producer<B>>>,
    /// Rings from the other shards.
    from: Vec<rtrb::Consumer<B>>,
    handoffs: u64,
    handoff_drops: u64,
    /// Scratch for polling completions (allocated once).
    wcs: Vec<WorkCompletion>,
    /// QPs running a latency test (their peer's WRITEs are seen by polling memory).
    lats: Vec<u32>,
    /// QPs running a timed receive stream (which ends by the clock, arrivals or not).
    timed_recv: Vec<u32>,
    /// Several-QP stream runs in progress.
    groups: Vec<Option<StreamGroup>>,
    /// Completion latency of its QPs' signalled send work, by opcode.
    latency: LatencyHistograms,
}

impl<B> core::fmt::Debug for RdmaHost<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RdmaHost")
            .field("shard", &self.shard)
            .field("qps", &(self.slots.len() - self.free.len()))
            .finish()
    }
}

impl<B: PacketBuf> RdmaHost<B> {
    /// A host for shard `shard` (0-15) sending on `port` of `line_bps`.
    pub fn new(shard: u32, port: usize, line_bps: f64) -> Self {
        let mut mrs = MrTable::new();
        let pd = mrs.alloc_pd();
        RdmaHost {
            shard: shard & 0xf,
            port,
            mrs,
            pd,
            slots: Vec::new(),
            free: VecDeque::new(),
            cqs: vec![None],
            cq_free: Vec::new(),
            ready: VecDeque::new(),
            timers: TimerQueue::with_capacity(1024),
            spare: None,
            line_bps,
            retired: QpCounters::default(),
            to: Vec::new(),
            from: Vec::new(),
            handoffs: 0,
            handoff_drops: 0,
            wcs: Vec::with_capacity(64),
            lats: Vec::new(),
            timed_recv: Vec::new(),
            groups: Vec::new(),
            latency: LatencyHistograms::default(),
        }
    }

    /// `n` hosts (shards 0..n, one per lcore) sending on `port`, joined by handoff rings in
    /// both directions between every pair.
    pub fn sharded(n: usize, port: usize, line_bps: f64) -> Vec<Self> {
        let mut hosts: Vec<Self> = (0..n)
            .map(|i| Self::new(i as u32, port, line_bps))
            .collect();
        for h in hosts.iter_mut() {
            h.to = (0..n).map(|_| None).collect();
        }
        for src in 0..n {
            for dst in 0..n {
                if src != dst {
                    let (p, c) = rtrb::RingBuffer::new(HANDOFF_RING);
                    hosts[src].to[dst] = Some(p);
                    hosts[dst].from.push(c);
                }
            }
        }
        hosts
    }

    fn qpn(&self, index: u32) -> u32 {
        self.shard << QPN_SHARD_SHIFT | index
    }

    fn cq_index(&self, cqn: u32) -> Option<usize> {
        if shard_of(cqn) != self.shard {
            return None;
        }
        let i = (cqn & ((1 << QPN_SHARD_SHIFT) - 1)) as usize;
        self.cqs.get(i)?.as_ref().map(|_| i)
    }

    /// Moves QP `i`'s completions to the created CQs its sides are bound to (a full CQ goes
    /// to error and the completion is lost, as on hardware). While it streams, its send
    /// completions stay for the stream.
    fn settle(&mut self, i: usize) {
        let Some(s) = self.slots[i].as_mut() else {
            return;
        };
        // A stream or latency test takes the completions it waits for itself.
        let own = s.lat.is_some() || s.rstream.is_some();
        let sides = [
            (
                s.bound[0].filter(|_| s.stream.is_none() && !own),
                &mut s.scq,
            ),
            (s.bound[1].filter(|_| !own), &mut s.rcq),
        ];
        for (to, own) in sides {
            if let Some(c) = to
                && let Some((cq, _)) = self.cqs[c as usize].as_mut()
            {
                while let Some(wc) = own.pop() {
                    let _ = cq.push(wc);
                }
            }
        }
    }

    fn index(&self, qpn: u32) -> Option<usize> {
        if shard_of(qpn) != self.shard {
            return None;
        }
        let i = (qpn & ((1 << QPN_SHARD_SHIFT) - 1)) as usize;
        self.slots.get(i)?.as_ref().map(|_| i)
    }

    /// Applies `f` to the QP `qpn` and, if `ready`, puts it on the ready list (what `f` did
    /// may let it send); the error names a QPN this lcore does not own.
    fn on_qp<T>(
        &mut self,
        qpn: u32,
        ready: bool,
        f: impl FnOnce(&mut Slot) -> Result<T, String>,
    ) -> Result<T, String> {
        let i = self
            .index(qpn)
            .ok_or_else(|| format!("no QP {qpn:#x} on this lcore"))?;
        let r = f(self.slots[i].as_mut().expect("index checked"));
        if ready {
            self.mark_ready(i);
        }
        r
    }

    fn mark_ready(&mut self, i: usize) {
        if let Some(s) = self.slots[i].as_mut()
            && !s.ready
        {
            s.ready = true;
            self.ready.push_back(i as u32);
        }
    }

    /// Takes a stream's completions and tops its send queue up; replies when it is done.
    fn feed(&mut self, i: usize, now: crate::time::Instant) {
        let mrs = &self.mrs;
        let Some(slot) = self.slots[i].as_mut() else {
            return;
        };
        let Some(st) = slot.stream.as_mut() else {
            return;
        };
        let before = st.done;
        slot.scq.drain_each(|c| {
            st.outstanding = st.outstanding.saturating_sub(1);
            if c.status == transport::cq::WcStatus::Success {
                st.done += 1;
            } else {
                st.errors += 1;
            }
        });
        if st.done > before {
            let per = now.0.saturating_sub(st.started.0) as f64 / st.done as f64;
            st.best_ns_per_wr = st.best_ns_per_wr.min(per);
        }
        let mut posted = false;
        slot.qp.observe(now);
        if st.until.is_some_and(|t| now >= t) {
            // Duration mode: the time is up; the run ends when what is out completes.
            st.to_post = 0;
        }
        while st.to_post > 0 && st.outstanding < st.depth {
            let id = st.wr.wr_id.wrapping_add(st.to_post);
            if post_copy(&mut slot.qp, mrs, &st.wr, id).is_err() {
                break;
            }
            st.to_post -= 1;
            st.outstanding += 1;
            posted = true;
        }
        let failed = slot.qp.cfg.state == transport::qp::QpState::Err;
        let mut finished = None;
        if st.to_post == 0 && st.outstanding == 0 || failed {
            let st = slot.stream.take().expect("stream present");
            let r = StreamResult {
                completed: st.done,
                errors: st.undone(),
                elapsed_ns: now.0.saturating_sub(st.started.0),
                best_ns_per_wr: st.best_ns_per_wr,
            };
            match st.reply {
                StreamReply::One(tx) => {
                    let _ = tx.send(Ok(r));
                }
                StreamReply::Group(g) => finished = Some((g, r)),
            }
        }
        if posted {
            self.mark_ready(i);
        }
        if let Some((g, r)) = finished {
            self.member_done(g, r, None, now);
        }
    }

    /// A member of several-QP run `g` finished with `r` (`first`: its first arrival, for
    /// receive streams); the last one replies for the group.
    fn member_done(
        &mut self,
        g: usize,
        r: StreamResult,
        first: Option<crate::time::Instant>,
        now: crate::time::Instant,
    ) {
        let Some(grp) = self.groups.get_mut(g).and_then(Option::as_mut) else {
            return;
        };
        grp.completed += r.completed;
        grp.errors = grp.errors.saturating_add(r.errors);
        grp.first = match (grp.first, first) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        grp.remaining -= 1;
        if grp.remaining == 0 {
            let grp = self.groups[g].take().expect("group present");
            let elapsed = now.0.saturating_sub(grp.first.unwrap_or(grp.started).0);
            let _ = grp.reply.send(Ok(StreamResult {
                completed: grp.completed,
                errors: grp.errors,
                elapsed_ns: elapsed,
                // The group keeps no per-completion times: its average.
                best_ns_per_wr: elapsed as f64 / grp.completed.max(1) as f64,
            }));
        }
    }

    /// A new several-QP run of `members` QPs; its index.
    fn new_group(
        &mut self,
        members: usize,
        now: crate::time::Instant,
        reply: Sender<Result<StreamResult, String>>,
    ) -> usize {
        let g = match self.groups.iter().position(Option::is_none) {
            Some(g) => g,
            None => {
                self.groups.push(None);
                self.groups.len() - 1
            }
        };
        self.groups[g] = Some(StreamGroup {
            remaining: members,
            completed: 0,
            errors: 0,
            started: now,
            first: None,
            reply,
        });
        g
    }

    /// Takes a receive stream's completions and reposts receives; replies when it is done.
    fn feed_recv(&mut self, i: usize, now: crate::time::Instant) {
        let wcs = &mut self.wcs;
        let Some(slot) = self.slots[i].as_mut() else {
            return;
        };
        let Some(st) = slot.rstream.as_mut() else {
            return;
        };
        wcs.clear();
        slot.rcq.poll(usize::MAX, wcs);
        for c in wcs.iter() {
            if c.status == transport::cq::WcStatus::Success {
                let first = *st.first.get_or_insert(now);
                let since = now.0.saturating_sub(first.0);
                match st.window_ns {
                    Some(w) if since < st.margin_ns || since - st.margin_ns >= w => {
                        st.uncounted += 1
                    }
                    _ => st.done += 1,
                }
            } else {
                st.errors += 1;
            }
        }
        if let Some(first) = st.first {
            // Per message over the time from the first arrival, as the average is counted
            // (so the best prefix is never below the whole run's average).
            let per = now.0.saturating_sub(first.0) as f64 / st.done.max(1) as f64;
            if per > 0.0 {
                st.best_ns_per_wr = st.best_ns_per_wr.min(per);
            }
        }
        while st.wants_more()
            && st.posted.saturating_sub(st.done + st.uncounted + st.errors)
                < slot.qp.caps().max_recv_wr as u64
        {
            let mut r = st.recv;
            r.wr_id = st.recv.wr_id.wrapping_add(st.posted);
            if slot.qp.post_recv(r).is_err() {
                break;
            }
            st.posted += 1;
        }
        let failed = slot.qp.cfg.state == transport::qp::QpState::Err || st.errors > 0;
        if st.over(now) || failed {
            let st = slot.rstream.take().expect("receive stream present");
            let (errors, elapsed_ns) = match st.window_ns {
                // A timed stream: its errors (at least one if the QP failed), over its window.
                Some(w) => (st.errors.max(u64::from(failed)), w),
                None => (
                    st.count - st.done,
                    now.0.saturating_sub(st.first.unwrap_or(now).0),
                ),
            };
            let best_ns_per_wr = match st.window_ns {
                // perftest's duration mode has no peak apart from the average.
                Some(w) => w as f64 / st.done.max(1) as f64,
                None => st.best_ns_per_wr,
            };
            let r = StreamResult {
                completed: st.done,
                errors,
                elapsed_ns,
                best_ns_per_wr,
            };
            if st.window_ns.is_some() {
                self.timed_recv.retain(|&x| x as usize != i);
            }
            match st.reply {
                StreamReply::One(tx) => {
                    let _ = tx.send(Ok(r));
                }
                StreamReply::Group(g) => {
                    // A timed member's run ends with its window, not with the drain after it.
                    let (start, end) = match (st.window_ns, st.first) {
                        (Some(w), Some(f)) => {
                            let start = f.0.saturating_add(st.margin_ns);
                            (
                                Some(crate::time::Instant(start)),
                                crate::time::Instant(start.saturating_add(w)),
                            )
                        }
                        _ => (st.first, now),
                    };
                    self.member_done(g, r, start, end)
                }
            }
        }
    }

    /// Advances QP `i`'s latency test as far as it can go now; replies when it is done.
    fn drive_lat(&mut self, i: usize, now: crate::time::Instant) {
        let wcs = &mut self.wcs;
        let mrs = &mut self.mrs;
        let Some(slot) = self.slots[i].as_mut() else {
            return;
        };
        let Some(t) = slot.lat.as_mut() else {
            return;
        };
        wcs.clear();
        slot.scq.poll(usize::MAX, wcs);
        slot.rcq.poll(usize::MAX, wcs);
        for c in wcs.iter() {
            if c.status != transport::cq::WcStatus::Success {
                t.errors += 1;
                if t.failure.is_none() {
                    t.failure = Some(format!(
                        "{:?} completion of {:?} (wr_id {})",
                        c.status, c.opcode, c.wr_id
                    ));
                }
            } else if c.opcode == transport::cq::WcOpcode::Recv {
                t.recvs_done += 1;
            } else {
                t.sends_done += 1;
            }
        }
        let mut posted = false;
        let since = now.0.saturating_sub(t.started.0);
        let timed_out = t.clock.as_mut().is_some_and(|c| c.tick(now, since));
        let failed = loop {
            if timed_out {
                break false;
            }
            if t.errors > 0 || slot.qp.cfg.state == transport::qp::QpState::Err {
                if t.failure.is_none() {
                    t.failure = Some(format!("the QP is in {:?}", slot.qp.cfg.state));
                }
                break true;
            }
            if t.scnt >= t.iters && t.rcnt >= t.iters && t.ccnt >= t.iters {
                break false;
            }
            match t.step {
                LatStep::Wait => {
                    match &t.kind {
                        LatKind::Request => t.rcnt = t.scnt.min(t.iters),
                        LatKind::Write { poll, .. } => {
                            // The server posts first: it waits only once it has posted.
                            if t.rcnt < t.iters && (!t.server || t.scnt > 0) {
                                let mut b = [0u8; 1];
                                let seen = mrs.get(poll.0).and_then(|m| m.read(poll.1, &mut b));
                                if let Err(e) = seen {
                                    t.errors += 1;
                                    t.failure = Some(format!("reading the polled byte: {e}"));
                                    continue;
                                }
                                if b[0] != (t.rcnt + 1) as u8 {
                                    break false;
                                }
                                t.rcnt += 1;
                            }
                        }
                        LatKind::Send { recv, rx_depth } => {
                            // The client posts first.
                            if t.rcnt < t.iters && (t.server || t.scnt > 0) {
                                if t.recvs_done == 0 {
                                    break false;
                                }
                                t.recvs_done -= 1;
                                t.rcnt += 1;
                                if t.rcnt + rx_depth <= t.iters {
                                    let mut r = *recv;
                                    r.wr_id = recv.wr_id.wrapping_add(t.reposted);
                                    if let Err(e) = slot.qp.post_recv(r) {
                                        t.errors += 1;
                                        t.failure = Some(format!("reposting a receive: {e}"));
                                        continue;
                                    }
                                    t.reposted += 1;
                                }
                            }
                        }
                    }
                    t.step = LatStep::Post;
                }
                LatStep::Post => {
                    if t.scnt < t.iters {
                        if let LatKind::Write { mark, .. } = &t.kind {
                            let b = [(t.scnt + 1) as u8];
                            if let Err(e) = mrs.get_mut(mark.0).and_then(|m| m.write(mark.1, &b)) {
                                t.errors += 1;
                                t.failure = Some(format!("setting the marked byte: {e}"));
                                continue;
                            }
                        }
                        if t.clock.is_none() {
                            t.posted.push(since);
                        }
                        let id = t.wr.wr_id.wrapping_add(t.scnt);
                        slot.qp.observe(now);
                        if let Err(e) = post_copy(&mut slot.qp, mrs, &t.wr, id) {
                            t.errors += 1;
                            t.failure = Some(format!("posting request {}: {e}", t.scnt + 1));
                            continue;
                        }
                        t.scnt += 1;
                        posted = true;
                    }
                    t.step = LatStep::Complete;
                }
                LatStep::Complete => {
                    // READ, atomics and WRITE wait for each completion; SEND counts its
                    // completions as they come (its turn is the peer's message), and waits
                    // only for the last ones, when nothing else is left.
                    let blocking = matches!(t.kind, LatKind::Request | LatKind::Write { .. })
                        || (t.scnt >= t.iters && t.rcnt >= t.iters);
                    if t.ccnt < t.scnt {
                        if t.sends_done == 0 && blocking {
                            break false;
                        }
                        let n = t.sends_done.min(t.scnt - t.ccnt);
                        t.ccnt += n;
                        t.sends_done -= n;
                        if let Some(c) = t.clock.as_mut() {
                            c.completed(n);
                        }
                    }
                    t.step = LatStep::Wait;
                }
            }
        };
        let done = timed_out || (t.scnt >= t.iters && t.rcnt >= t.iters && t.ccnt >= t.iters);
        if failed || done {
            let t = slot.lat.take().expect("latency test present");
            let _ = t.reply.send(Ok(LatResult {
                posted_ns: t.posted,
                sample: t.clock.map(|c| c.sample()),
                errors: t.errors.max(u64::from(failed && !done)),
                failure: t.failure,
                elapsed_ns: now.0.saturating_sub(t.started.0),
            }));
            self.lats.retain(|&x| x as usize != i);
        }
        if posted {
            self.mark_ready(i);
        }
    }

    /// Starts a group run on `qpns` when every one is here and `can_start` (all of them or
    /// none): their slots and the group's index. Otherwise `reply` hears why (the first QP
    /// that cannot, or no QPs at all) and nothing starts.
    fn start_group(
        &mut self,
        qpns: impl ExactSizeIterator<Item = u32>,
        can_start: impl Fn(&Slot) -> bool,
        why: &str,
        now: crate::time::Instant,
        reply: Sender<Result<StreamResult, String>>,
    ) -> Option<(Vec<usize>, usize)> {
        let mut slots = Vec::with_capacity(qpns.len());
        for qpn in qpns {
            let ok = self
                .index(qpn)
                .filter(|&i| self.slots[i].as_ref().is_some_and(&can_start));
            match ok {
                Some(i) => slots.push(i),
                None => {
                    let _ = reply.send(Err(format!("QP {qpn} is not here, {why}")));
                    return None;
                }
            }
        }
        if slots.is_empty() {
            let _ = reply.send(Err("no QPs".into()));
            return None;
        }
        let g = self.new_group(slots.len(), now, reply);
        Some((slots, g))
    }

    /// Gives a received frame to the QP it names on this shard.
    fn deliver<Q: PortQueue<Buf = B>>(
        &mut self,
        now: crate::time::Instant,
        info: &crate::wire::packet::PacketInfo,
        buf: B,
        io: &mut Io<'_, Q>,
    ) {
        let Some(i) = self.index(info.dest_qp) else {
            io.drop_frame(DropReason::NotForUs, buf);
            return;
        };
        let s = self.slots[i].as_mut().expect("index checked");
        s.qp.handle_parsed(now, info, buf.data(), &mut self.mrs, &mut s.scq, &mut s.rcq);
        let lat = &mut self.latency;
        s.qp.take_latencies(|op, ns| lat.record(op, ns));
        self.mark_ready(i);
        self.drive_tests(i, now);
    }

    /// Lets the stream, receive stream or latency test slot `i` runs see what its QP did
    /// (post more, count, answer when done), then moves completions to the created CQs.
    /// Inlined: it is on every received frame's path (a call cost 21 instructions a 64 B
    /// WRITE in stream_cost).
    #[inline(always)]
    fn drive_tests(&mut self, i: usize, now: crate::time::Instant) {
        let Some(s) = self.slots[i].as_ref() else {
            return;
        };
        let (streaming, receiving, timing) =
            (s.stream.is_some(), s.rstream.is_some(), s.lat.is_some());
        if streaming {
            self.feed(i, now);
        }
        if receiving {
            self.feed_recv(i, now);
        }
        if timing {
            self.drive_lat(i, now);
        }
        self.settle(i);
    }

    /// Sends what the ready QPs have, then re-arms their timers.
    fn transmit<Q: PortQueue<Buf = B>>(&mut self, io: &mut Io<'_, Q>) {
        let now = io.now;
        let mut budget = TX_PER_POLL;
        for _ in 0..self.ready.len() {
            if budget == 0 {
                break;
            }
            let Some(i) = self.ready.pop_front() else {
                break;
            };
            let Some(s) = self.slots[i as usize].as_mut() else {
                continue;
            };
            s.ready = false;
            let caps = io.info(s.port).caps;
            s.qp.set_tx_features(caps.tx_ipv4_cksum, caps.tx_multi_seg);
            let mut sent = 0;
            let mut blocked = false;
            while sent < QP_BUDGET.min(budget) {
                // A busy port holds the QP back (its frames wait in the queue, not dropped
                // to be retransmitted): it is polled again next iteration.
                if !io.can_send(s.port) {
                    blocked = true;
                    break;
                }
                let mut buf = match self.spare.take() {
                    Some(b) => b,
                    None => match io.alloc(s.port) {
                        Some(b) => b,
                        None => break,
                    },
                };
                if s.qp
                    .poll_transmit(now, &self.mrs, &mut s.scq, &mut s.rcq, &mut buf)
                {
                    io.send(s.port, buf);
                    sent += 1;
                } else {
                    self.spare = Some(buf);
                    break;
                }
            }
            match s.qp.poll_timeout() {
                Some(t) => self.timers.set(i, t),
                None => {
                    self.timers.cancel(i);
                }
            }
            if blocked {
                // The port is busy: this QP goes first next time, and the rest wait where
                // they are (scanning them all again on every loop while the port drains
                // would cost O(QPs) per iteration and starve the receive side).
                s.ready = true;
                self.ready.push_front(i);
                self.settle(i as usize);
                break;
            }
            budget -= sent;
            if sent == QP_BUDGET {
                s.ready = true;
                self.ready.push_back(i);
            } else if budget == 0 && !blocked {
                // The iteration's budget ran out inside this QP: it goes on first next time.
                s.ready = true;
                self.ready.push_front(i);
            }
            self.settle(i as usize);
        }
    }

    /// Creates a QP in RESET; its QPN, or why not.
    fn create_qp(
        &mut self,
        caps: QpCaps,
        pd: Option<u32>,
        cqs: [Option<u32>; 2],
        cc: CcKind,
        params: DcqcnParams,
    ) -> Result<u32, String> {
        let pd = PdHandle(pd.unwrap_or(self.pd.0));
        if !self.mrs.has_pd(pd) {
            return Err(format!("no PD {}", pd.0));
        }
        let mut bound = [None; 2];
        for (b, c) in bound.iter_mut().zip(cqs) {
            if let Some(cqn) = c {
                match self.cq_index(cqn) {
                    Some(i) => *b = Some(i as u32),
                    None => return Err(format!("no CQ {cqn} on this lcore")),
                }
            }
        }
        let reuse = if self.free.len() > QPN_QUARANTINE {
            self.free.pop_front()
        } else {
            None
        };
        let i = match reuse {
            Some(i) => i,
            None if self.slots.len() < 1 << QPN_SHARD_SHIFT => {
                // QPNs 0 and 1 are the special QPs: shard 0 never hands them out.
                if self.slots.is_empty() && self.shard == 0 {
                    self.slots.push(None);
                    self.slots.push(None);
                }
                self.slots.push(None);
                self.slots.len() as u32 - 1
            }
            // Every number is taken: the oldest freed one, if any.
            None => match self.free.pop_front() {
                Some(i) => i,
                None => return Err(CapsError::OutOfRange("QPs on this lcore").to_string()),
            },
        };
        let r = RcQp::new(self.qpn(i), pd, caps).map(|mut qp| {
            qp.set_congestion_control(cc, self.line_bps, params);
            let qpn = qp.qpn;
            self.slots[i as usize] = Some(Slot {
                qp,
                port: self.port,
                scq: CompletionQueue::new(caps.max_send_wr as usize * 2),
                rcq: CompletionQueue::new(caps.max_recv_wr as usize * 2),
                bound,
                ready: false,
                stream: None,
                rstream: None,
                lat: None,
            });
            qpn
        });
        match r {
            Ok(_) => {
                for c in bound.into_iter().flatten() {
                    if let Some((_, users)) = self.cqs[c as usize].as_mut() {
                        *users += 1;
                    }
                }
            }
            Err(_) => self.free.push_front(i),
        }
        r.map_err(|e| e.to_string())
    }

    /// Destroys a QP; false if there is no such QP here.
    fn destroy_qp(&mut self, qpn: u32) -> bool {
        let Some(i) = self.index(qpn) else {
            return false;
        };
        if let Some(s) = self.slots[i].take() {
            self.retired.add(&s.qp.counters);
            for c in s.bound.into_iter().flatten() {
                if let Some((_, users)) = self.cqs[c as usize].as_mut() {
                    *users -= 1;
                }
            }
            // A several-QP run loses this member: what it had not done counts as errors,
            // and the run ends when the others do.
            let lost = match (s.stream, s.rstream) {
                (Some(st), _) => match st.reply {
                    StreamReply::Group(g) => Some((g, st.done, st.undone())),
                    StreamReply::One(_) => None,
                },
                (None, Some(rs)) => match rs.reply {
                    StreamReply::Group(g) => Some((g, rs.done, rs.undone())),
                    StreamReply::One(_) => None,
                },
                (None, None) => None,
            };
            if let Some((g, done, undone)) = lost
                && let Some(grp) = self.groups.get_mut(g).and_then(Option::as_mut)
            {
                grp.completed += done;
                grp.errors = grp.errors.saturating_add(undone);
                grp.remaining -= 1;
                if grp.remaining == 0 {
                    let grp = self.groups[g].take().expect("group present");
                    let _ = grp.reply.send(Err(format!(
                        "QP {qpn} was destroyed during the run ({} completed)",
                        grp.completed
                    )));
                }
            }
        }
        self.timers.cancel(i as u32);
        self.free.push_back(i as u32);
        true
    }

    fn command(&mut self, cmd: RdmaCommand, now: crate::time::Instant) {
        match cmd {
            RdmaCommand::RegMr {
                va,
                len,
                access,
                reply,
            } => {
                let r = self
                    .mrs
                    .register(self.pd, va, Box::new(vec![0u8; len]), access);
                let _ = reply.send(r);
            }
            RdmaCommand::RegShared {
                key,
                pd,
                va,
                access,
                mem,
                reply,
            } => {
                let r = self.mrs.register_at(PdHandle(pd), key, va, mem, access);
                let _ = reply.send(r);
            }
            RdmaCommand::AllocPd { pd, reply } => {
                self.mrs.ensure_pd(PdHandle(pd));
                let _ = reply.send(());
            }
            RdmaCommand::DeallocPd { pd, reply } => {
                let pd = PdHandle(pd);
                let r = if self.slots.iter().flatten().any(|s| s.qp.pd == pd) {
                    Err(format!("QPs of this lcore are in PD {}", pd.0))
                } else {
                    self.mrs.dealloc_pd(pd).map_err(|e| e.to_string())
                };
                let _ = reply.send(r);
            }
            RdmaCommand::CreateCq { cqe, reply } => {
                let r = match self.cq_free.pop() {
                    Some(i) => Ok(i),
                    None if self.cqs.len() < 1 << QPN_SHARD_SHIFT => {
                        self.cqs.push(None);
                        Ok(self.cqs.len() as u32 - 1)
                    }
                    None => Err("this lcore has no CQ numbers left".to_string()),
                }
                .map(|i| {
                    self.cqs[i as usize] = Some((CompletionQueue::new(cqe), 0));
                    self.qpn(i)
                });
                let _ = reply.send(r);
            }
            RdmaCommand::DestroyCq { cqn, reply } => {
                let r = match self.cq_index(cqn) {
                    None => Err(format!("no CQ {cqn} on this lcore")),
                    Some(i) => match self.cqs[i].as_ref() {
                        Some((_, users)) if *users > 0 => {
                            Err(format!("{users} QP send or receive queues use CQ {cqn}"))
                        }
                        _ => {
                            self.cqs[i] = None;
                            self.cq_free.push(i as u32);
                            Ok(())
                        }
                    },
                };
                let _ = reply.send(r);
            }
            RdmaCommand::PollCqn { cqn, max, reply } => {
                let r = self.cq_index(cqn).and_then(|i| {
                    let (cq, users) = self.cqs[i].as_mut()?;
                    let mut wcs = Vec::new();
                    cq.poll(max, &mut wcs);
                    let state = CqState {
                        cqe: cq.capacity(),
                        waiting: cq.len(),
                        users: *users,
                        in_error: cq.in_error(),
                    };
                    Some((wcs, state))
                });
                let _ = reply.send(r);
            }
            RdmaCommand::DeregMr { key, reply } => {
                let _ = reply.send(self.mrs.deregister(key).map(drop));
            }
            RdmaCommand::WriteMr {
                key,
                va,
                data,
                reply,
            } => {
                let r = self.mrs.get_mut(key).and_then(|m| m.write(va, &data));
                let _ = reply.send(r);
            }
            RdmaCommand::ReadMr {
                key,
                va,
                len,
                reply,
            } => {
                let r = self.mrs.get(key).and_then(|m| m.to_vec(va, len));
                let _ = reply.send(r);
            }
            RdmaCommand::CreateQp {
                caps,
                pd,
                cqs,
                cc,
                params,
                reply,
            } => {
                let _ = reply.send(self.create_qp(caps, pd, cqs, cc, params));
            }
            RdmaCommand::CreateQps {
                count,
                caps,
                cc,
                params,
                reply,
            } => {
                let mut made = Vec::with_capacity(count);
                for _ in 0..count {
                    match self.create_qp(caps, None, [None; 2], cc, params) {
                        Ok(q) => made.push(q),
                        Err(e) => {
                            // All or nothing.
                            for q in made.drain(..) {
                                self.destroy_qp(q);
                            }
                            let _ = reply.send(Err(e));
                            return;
                        }
                    }
                }
                let _ = reply.send(Ok(made));
            }
            RdmaCommand::Connect {
                qpn,
                c,
                port,
                reply,
            } => {
                let r = self.on_qp(qpn, false, |s| {
                    s.qp.connect(&c).map_err(|e| e.to_string())?;
                    s.port = port;
                    Ok(())
                });
                let _ = reply.send(r);
            }
            RdmaCommand::ConnectMany { list, port, reply } => {
                let mut done = 0;
                let mut r = Ok(());
                for (qpn, c) in list.iter() {
                    r = self.on_qp(*qpn, false, |s| {
                        s.qp.connect(c).map_err(|e| format!("QP {qpn}: {e}"))?;
                        s.port = port;
                        Ok(())
                    });
                    if r.is_err() {
                        break;
                    }
                    done += 1;
                }
                if r.is_err() {
                    // All or nothing: the ones connected go back to RESET.
                    let reset = transport::qp::QpAttr {
                        state: Some(transport::qp::QpState::Reset),
                        ..Default::default()
                    };
                    for (qpn, _) in &list[..done] {
                        let _ = self.on_qp(*qpn, false, |s| {
                            s.qp.modify(&reset).map_err(|e| e.to_string())
                        });
                    }
                }
                let _ = reply.send(r);
            }
            RdmaCommand::Modify {
                qpn,
                attr,
                port,
                reply,
            } => {
                let r = self.on_qp(qpn, true, |s| {
                    s.qp.modify(&attr).map_err(|e| e.to_string())?;
                    // An RC QP's port follows its path; a UD QP's is chosen at INIT (verbs'
                    // port_num), and its datagrams leave by it whatever their destination.
                    let ud_init = s.qp.cfg.qp_type == transport::qp::QpType::Ud
                        && attr.state == Some(transport::qp::QpState::Init);
                    if attr.path.is_some() || ud_init {
                        s.port = port;
                    }
                    if s.qp.cfg.state == transport::qp::QpState::Err {
                        // Moving to ERR flushes outstanding work (ibv_modify_qp).
                        s.qp.flush(&mut s.scq);
                        s.qp.flush_recv(&mut s.rcq);
                    }
                    Ok(())
                });
                if let Some(i) = self.index(qpn) {
                    if self.slots[i].as_ref().is_some_and(|s| s.stream.is_some()) {
                        self.feed(i, now);
                    }
                    self.settle(i);
                }
                let _ = reply.send(r);
            }
            RdmaCommand::SetCc {
                qpn,
                kind,
                params,
                reply,
            } => {
                let line = self.line_bps;
                let r = self.on_qp(qpn, true, |s| {
                    match kind {
                        Some(k) if k != s.qp.cc().kind() => {
                            s.qp.set_congestion_control(k, line, params)
                        }
                        _ => s.qp.set_cc_params(params),
                    }
                    Ok(())
                });
                let _ = reply.send(r);
            }
            RdmaCommand::Query { qpn, reply } => {
                let q = self.index(qpn).map(|i| {
                    let s = self.slots[i].as_ref().expect("index checked");
                    let cc = s.qp.cc();
                    QpQuery {
                        pd: s.qp.pd.0,
                        cqs: s.bound.map(|b| b.map(|c| self.qpn(c))),
                        cfg: s.qp.cfg,
                        counters: s.qp.counters,
                        port: s.port,
                        caps: s.qp.caps(),
                        cc_params: *s.qp.cc_params(),
                        cc_kind: cc.kind().name(),
                        rate_bps: cc.rate(),
                        dcqcn: match cc {
                            crate::cc::Cc::Dcqcn(d) => {
                                Some((d.target(), d.alpha(now, s.qp.cc_params())))
                            }
                            crate::cc::Cc::None { .. } => None,
                        },
                    }
                });
                let _ = reply.send(q);
            }
            RdmaCommand::PostSend { qpn, mut wr, reply } => {
                let r = match transport::wr::take_inline(&self.mrs, &mut wr) {
                    Ok(d) => self.on_qp(qpn, true, |s| {
                        s.qp.observe(now);
                        s.qp.post_send_gathered(*wr, d.as_deref())
                            .map_err(|e: PostError| e.to_string())
                    }),
                    Err(e) => Err(e.to_string()),
                };
                let _ = reply.send(r);
            }
            RdmaCommand::PostRecv { qpn, wr, reply } => {
                // Ready, so that a receive posted in ERR is flushed on the next poll.
                let r = self.on_qp(qpn, true, |s| {
                    s.qp.post_recv(*wr).map_err(|e| e.to_string())
                });
                let _ = reply.send(r);
            }
            RdmaCommand::PollCq { qpn, max, reply } => {
                let (mut s, mut r) = (Vec::new(), Vec::new());
                if let Some(i) = self.index(qpn) {
                    let slot = self.slots[i].as_mut().expect("index checked");
                    slot.scq.poll(max, &mut s);
                    slot.rcq.poll(max, &mut r);
                }
                let _ = reply.send((s, r));
            }
            RdmaCommand::Stream {
                qpn,
                wr,
                count,
                depth,
                duration,
                reply,
            } => {
                let Some(i) = self.index(qpn) else {
                    let _ = reply.send(Err(format!("no QP {qpn:#x} on this lcore")));
                    return;
                };
                let slot = self.slots[i].as_mut().expect("index checked");
                if slot.stream.is_some() {
                    let _ = reply.send(Err(format!("QP {qpn} is already streaming")));
                    return;
                }
                if slot.qp.cfg.state != transport::qp::QpState::Rts {
                    let _ = reply.send(Err(format!("QP {qpn} is not in RTS")));
                    return;
                }
                slot.stream = Some(Stream::new(
                    *wr,
                    (count, depth, duration),
                    now,
                    StreamReply::One(reply),
                ));
                self.feed(i, now);
            }
            RdmaCommand::Streams {
                qps,
                count,
                depth,
                duration,
                reply,
            } => {
                let Some((slots, g)) = self.start_group(
                    qps.iter().map(|q| q.0),
                    |s| s.stream.is_none() && s.qp.cfg.state == transport::qp::QpState::Rts,
                    "not in RTS or already streaming",
                    now,
                    reply,
                ) else {
                    return;
                };
                for (&i, (_, wr)) in slots.iter().zip(qps) {
                    if let Some(s) = self.slots[i].as_mut() {
                        s.stream = Some(Stream::new(
                            wr,
                            (count, depth, duration),
                            now,
                            StreamReply::Group(g),
                        ));
                    }
                }
                for i in slots {
                    self.feed(i, now);
                }
            }
            RdmaCommand::RecvStream {
                qpn,
                recv,
                count,
                posted,
                duration,
                reply,
            } => {
                let Some(i) = self.index(qpn) else {
                    let _ = reply.send(Err(format!("no QP {qpn:#x} on this lcore")));
                    return;
                };
                let slot = self.slots[i].as_mut().expect("index checked");
                if slot.rstream.is_some() || slot.lat.is_some() {
                    let _ = reply.send(Err(format!("QP {qpn} is already receiving a test")));
                    return;
                }
                if !matches!(
                    slot.qp.cfg.state,
                    transport::qp::QpState::Rtr | transport::qp::QpState::Rts
                ) {
                    let _ = reply.send(Err(format!("QP {qpn} is not connected")));
                    return;
                }
                slot.rstream = Some(RecvStream::new(
                    *recv,
                    count,
                    posted,
                    duration,
                    StreamReply::One(reply),
                ));
                if duration.is_some() {
                    self.timed_recv.push(i as u32);
                }
                self.feed_recv(i, now);
            }
            RdmaCommand::RecvStreams {
                qpns,
                recv,
                count,
                posted,
                duration,
                reply,
            } => {
                let Some((slots, g)) = self.start_group(
                    qpns.iter().copied(),
                    |s| {
                        let connected = matches!(
                            s.qp.cfg.state,
                            transport::qp::QpState::Rtr | transport::qp::QpState::Rts
                        );
                        s.rstream.is_none() && s.lat.is_none() && connected
                    },
                    "not connected or already receiving a test",
                    now,
                    reply,
                ) else {
                    return;
                };
                for &i in &slots {
                    if let Some(s) = self.slots[i].as_mut() {
                        s.rstream = Some(RecvStream::new(
                            *recv,
                            count,
                            posted,
                            duration,
                            StreamReply::Group(g),
                        ));
                        if duration.is_some() {
                            self.timed_recv.push(i as u32);
                        }
                    }
                }
                for i in slots {
                    self.feed_recv(i, now);
                }
            }
            RdmaCommand::Latency {
                qpn,
                kind,
                wr,
                iters,
                duration,
                server,
                reply,
            } => {
                let Some(i) = self.index(qpn) else {
                    let _ = reply.send(Err(format!("no QP {qpn:#x} on this lcore")));
                    return;
                };
                let slot = self.slots[i].as_mut().expect("index checked");
                if slot.stream.is_some() || slot.lat.is_some() || slot.rstream.is_some() {
                    let _ = reply.send(Err(format!("QP {qpn} is already running a test")));
                    return;
                }
                if slot.qp.cfg.state != transport::qp::QpState::Rts {
                    let _ = reply.send(Err(format!("QP {qpn} is not in RTS")));
                    return;
                }
                if duration.is_none() && (iters == 0 || iters > 1 << 24) {
                    let _ = reply.send(Err("iterations are 1 to 16777216".into()));
                    return;
                }
                if duration.is_some_and(|d| d.is_zero()) {
                    let _ = reply.send(Err("a timed test needs a duration above 0".into()));
                    return;
                }
                let clock = duration.map(LatClock::new);
                let iters = if clock.is_some() { u64::MAX } else { iters };
                slot.lat = Some(Lat {
                    kind: *kind,
                    wr: *wr,
                    iters,
                    server,
                    scnt: 0,
                    rcnt: 0,
                    ccnt: 0,
                    sends_done: 0,
                    recvs_done: 0,
                    reposted: 0,
                    step: LatStep::Wait,
                    started: now,
                    clock,
                    posted: Vec::with_capacity(if clock.is_some() { 0 } else { iters as usize }),
                    errors: 0,
                    failure: None,
                    reply,
                });
                self.lats.push(i as u32);
                self.drive_lat(i, now);
            }
            RdmaCommand::Latencies { reply } => {
                let _ = reply.send(self.latency.clone());
            }
            RdmaCommand::CancelTests { reply } => {
                let mut n = 0;
                for i in 0..self.slots.len() {
                    let Some(s) = self.slots[i].as_mut() else {
                        continue;
                    };
                    if s.stream.is_none() && s.rstream.is_none() && s.lat.is_none() {
                        continue;
                    }
                    let err = transport::qp::QpAttr {
                        state: Some(transport::qp::QpState::Err),
                        ..Default::default()
                    };
                    if s.qp.modify(&err).is_ok() {
                        s.qp.flush(&mut s.scq);
                        s.qp.flush_recv(&mut s.rcq);
                    }
                    n += 1;
                    // Each test sees its QP in ERR and its work flushed, and answers.
                    self.drive_tests(i, now);
                }
                let _ = reply.send(n);
            }
            RdmaCommand::Counters { reply } => {
                let mut c = self.retired;
                for s in self.slots.iter().flatten() {
                    c.add(&s.qp.counters);
                }
                let mut qp_states = [0u32; 7];
                let mut dcqcn = DcqcnSummary::default();
                for s in self.slots.iter().flatten() {
                    let st = s.qp.cfg.state;
                    if let Some(k) = transport::qp::QpState::ALL.iter().position(|x| *x == st) {
                        qp_states[k] += 1;
                    }
                    if let crate::cc::Cc::Dcqcn(d) = s.qp.cc() {
                        let r = d.rate();
                        dcqcn.min_rate_bps = if dcqcn.qps == 0 {
                            r
                        } else {
                            dcqcn.min_rate_bps.min(r)
                        };
                        dcqcn.qps += 1;
                        dcqcn.limited += (r < self.line_bps) as u32;
                        dcqcn.sum_rate_bps += r;
                        dcqcn.max_alpha = dcqcn.max_alpha.max(d.alpha(now, s.qp.cc_params()));
                    }
                }
                let _ = reply.send(HostCounters {
                    qp: c,
                    handoffs: self.handoffs,
                    handoff_drops: self.handoff_drops,
                    qp_states,
                    dcqcn,
                });
            }
            RdmaCommand::DestroyQp { qpn, reply } => {
                let ok = self.destroy_qp(qpn);
                let _ = reply.send(ok);
            }
            RdmaCommand::DestroyMany { qpns, reply } => {
                let n = qpns.iter().filter(|&&q| self.destroy_qp(q)).count();
                let _ = reply.send(n);
            }
        }
    }
}

impl<Q: PortQueue> Handler<Q> for RdmaHost<Q::Buf> {
    type Command = RdmaCommand;

    fn on_burst(&mut self, _port: usize, burst: &mut Burst<Q::Buf>, io: &mut Io<'_, Q>) {
        let now = io.now;
        for buf in burst.drain(..) {
            // Parsed once, with every check (checksums, ICRC), here; the QP takes the result.
            let info = match parse(buf.data(), Checks::ALL) {
                Ok(info) => info,
                Err(_) => {
                    io.drop_frame(DropReason::Malformed, buf);
                    continue;
                }
            };
            let owner = shard_of(info.dest_qp) as usize;
            if owner != self.shard as usize {
                match self.to.get_mut(owner).and_then(|p| p.as_mut()) {
                    Some(p) => match p.push(buf) {
                        Ok(()) => self.handoffs += 1,
                        Err(rtrb::PushError::Full(buf)) => {
                            self.handoff_drops += 1;
                            io.drop_frame(DropReason::TxFull, buf);
                        }
                    },
                    None => io.drop_frame(DropReason::NotForUs, buf),
                }
                continue;
            }
            self.deliver(now, &info, buf, io);
        }
    }

    fn on_poll(&mut self, io: &mut Io<'_, Q>) {
        let now = io.now;
        for r in 0..self.from.len() {
            for _ in 0..crate::BURST_SIZE {
                let Ok(buf) = self.from[r].pop() else { break };
                match parse(buf.data(), Checks::ALL) {
                    Ok(info) => self.deliver(now, &info, buf, io),
                    Err(_) => io.drop_frame(DropReason::Malformed, buf),
                }
            }
        }
        for k in (0..self.lats.len()).rev() {
            if let Some(&i) = self.lats.get(k) {
                self.drive_lat(i as usize, now);
            }
        }
        for k in (0..self.timed_recv.len()).rev() {
            if let Some(&i) = self.timed_recv.get(k) {
                let live = self.slots[i as usize]
                    .as_ref()
                    .is_some_and(|s| s.rstream.as_ref().is_some_and(|r| r.window_ns.is_some()));
                if live {
                    self.feed_recv(i as usize, now);
                } else {
                    // Its QP went (destroyed mid-stream).
                    self.timed_recv.swap_remove(k);
                }
            }
        }
        while let Some(i) = self.timers.pop_expired(now) {
            if let Some(s) = self.slots[i as usize].as_mut() {
                s.qp.handle_timeout(now, &mut s.scq, &mut s.rcq);
                let streaming = s.stream.is_some();
                self.mark_ready(i as usize);
                if streaming {
                    self.feed(i as usize, now);
                }
                self.settle(i as usize);
            }
        }
        if !self.ready.is_empty() {
            self.transmit(io);
        }
    }

    fn on_command(&mut self, cmd: RdmaCommand, io: &mut Io<'_, Q>) {
        self.command(cmd, io.now);
        if !self.ready.is_empty() {
            self.transmit(io);
        }
    }

    fn shutdown(&mut self) {
        self.spare = None;
        self.slots.clear();
        for r in self.from.iter_mut() {
            while r.pop().is_ok() {}
        }
    }
}

/// A host's command channel, as the control side holds it.
pub type HostControl = Sender<crate::lcore::Command<RdmaCommand>>;

fn ask<T>(ctl: &HostControl, make: impl FnOnce(Sender<T>) -> RdmaCommand) -> Result<T, String> {
    let (tx, rx) = crossbeam_channel::unbounded();
    ctl.send(crate::lcore::Command::Handler(make(tx)))
        .map_err(|_| "the lcore has stopped".to_string())?;
    rx.recv_timeout(std::time::Duration::from_secs(10))
        .map_err(|_| "the lcore did not answer in 10 s".to_string())
}

fn wait_for(ctl: &HostControl, qpn: u32, send: bool) -> Result<WorkCompletion, String> {
    let t = std::time::Instant::now();
    loop {
        let (s, r) = ask(ctl, |reply| RdmaCommand::PollCq { qpn, max: 1, reply })?;
        if let Some(c) = if send { s } else { r }.into_iter().next() {
            return Ok(c);
        }
        if t.elapsed() > std::time::Duration::from_secs(20) {
            return Err(format!("no completion on QP {qpn:#x} in 20 s"));
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The virtual address [`connect_pair`] registers its regions at.
pub const PAIR_VA: u64 = 0x1000_0000;

/// What [`connect_pair`] set up.
#[derive(Clone, Copy, Debug)]
pub struct Pair {
    /// A's region key.
    pub ka: u32,
    /// B's region key.
    pub kb: u32,
    /// A's QP.
    pub qpa: u32,
    /// B's QP.
    pub qpb: u32,
}

/// Hands host 0 or 1 of a pair a command and waits for its answer: through the command
/// channels of running lcores, or by a driver that runs both workers itself.
pub trait Asker {
    /// Sends host `i` the command `make` builds around a reply channel; the reply.
    fn ask<T>(
        &mut self,
        i: usize,
        make: impl FnOnce(Sender<T>) -> RdmaCommand,
    ) -> Result<T, String>;
}

impl Asker for [&HostControl; 2] {
    fn ask<T>(
        &mut self,
        i: usize,
        make: impl FnOnce(Sender<T>) -> RdmaCommand,
    ) -> Result<T, String> {
        ask(self[i], make)
    }
}

/// Registers a 4 MiB region at [`PAIR_VA`] on each host and connects an RC QP pair at `mtu`
/// with congestion control `cc` (A's address 1, B's 2, as [`Path::sim`] gives).
pub fn connect_pair(
    a: &HostControl,
    b: &HostControl,
    mtu: transport::qp::Mtu,
    cc: CcKind,
) -> Result<Pair, String> {
    connect_pair_with(&mut [a, b], mtu, cc)
}

/// [`connect_pair`] through any [`Asker`] (host 0 is A, host 1 is B).
pub fn connect_pair_with(
    x: &mut impl Asker,
    mtu: transport::qp::Mtu,
    cc: CcKind,
) -> Result<Pair, String> {
    use transport::qp::Path;
    let all =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mut keys = [0u32; 2];
    let mut qpns = [0u32; 2];
    for i in 0..2 {
        keys[i] = x
            .ask(i, |reply| RdmaCommand::RegMr {
                va: PAIR_VA,
                len: 4 << 20,
                access: all,
                reply,
            })?
            .map_err(|e| e.to_string())?;
        qpns[i] = x.ask(i, |reply| RdmaCommand::CreateQp {
            caps: QpCaps::default(),
            pd: None,
            cqs: [None; 2],
            cc,
            params: DcqcnParams::nvidia(),
            reply,
        })??;
    }
    for (i, me, other) in [(0, 1, 2), (1, 2, 1)] {
        let conn = Connect::new(Path::sim(me, other, 0xc000), mtu, qpns[1 - i]);
        x.ask(i, |reply| RdmaCommand::Connect {
            qpn: qpns[i],
            c: Box::new(conn),
            port: 0,
            reply,
        })??;
    }
    Ok(Pair {
        ka: keys[0],
        kb: keys[1],
        qpa: qpns[0],
        qpb: qpns[1],
    })
}

/// Checks two hosts whose ports are joined (A's `me` address 1, B's 2, as [`Path::sim`]
/// gives): registers a 4 MiB region on each, connects an RC QP pair at `mtu`, and moves a
/// 1 MiB WRITE, a 256 KiB READ, a SEND with immediate and a fetch-and-add, checking every
/// byte; then destroys the QPs. Err names the first thing that went wrong.
pub fn pair_check(a: &HostControl, b: &HostControl, mtu: transport::qp::Mtu) -> Result<(), String> {
    use transport::cq::{WcOpcode, WcStatus};
    use transport::wr::{SendOp, SgList, Sge};
    const VA: u64 = PAIR_VA;
    let Pair { ka, kb, qpa, qpb } = connect_pair(a, b, mtu, CcKind::Dcqcn)?;
    let pattern: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + i / 251) as u8).collect();
    ask(a, |reply| RdmaCommand::WriteMr {
        key: ka,
        va: VA,
        data: pattern.clone(),
        reply,
    })?
    .map_err(|e| e.to_string())?;
    let sg = |key: u32, va: u64, len: u32| Sge::list(va, len, key);
    let post = |c: &HostControl, q: u32, id: u64, op: SendOp, sg: SgList| {
        ask(c, |reply| RdmaCommand::PostSend {
            qpn: q,
            wr: Box::new(SendWr::new(id, op, sg)),
            reply,
        })?
    };
    let read = |c: &HostControl, key: u32, va: u64, len: usize| {
        ask(c, |reply| RdmaCommand::ReadMr {
            key,
            va,
            len,
            reply,
        })?
        .map_err(|e| e.to_string())
    };
    let ok = |c: WorkCompletion, id: u64, what: &str| {
        if c.wr_id == id && c.status == WcStatus::Success {
            Ok(c)
        } else {
            Err(format!("{what}: {c:?}"))
        }
    };
    // 1 MiB WRITE from A into B.
    let write = SendOp::Write {
        remote_addr: VA + (1 << 20),
        rkey: kb,
    };
    post(a, qpa, 1, write, sg(ka, VA, 1 << 20))?;
    ok(wait_for(a, qpa, true)?, 1, "WRITE")?;
    if read(b, kb, VA + (1 << 20), 1 << 20)? != pattern {
        return Err("the WRITE's bytes differ at B".into());
    }
    // B READs 256 KiB of A's region.
    let rd = SendOp::Read {
        remote_addr: VA + 4096,
        rkey: ka,
    };
    post(b, qpb, 2, rd, sg(kb, VA + (3 << 20), 256 << 10))?;
    let c = ok(wait_for(b, qpb, true)?, 2, "READ")?;
    if c.opcode != WcOpcode::RdmaRead
        || read(b, kb, VA + (3 << 20), 256 << 10)? != pattern[4096..4096 + (256 << 10)]
    {
        return Err("the READ returned the wrong bytes".into());
    }
    // A SEND with immediate into a posted receive.
    ask(b, |reply| RdmaCommand::PostRecv {
        qpn: qpb,
        wr: Box::new(RecvWr {
            wr_id: 3,
            sg: sg(kb, VA + (2 << 20), 5000),
        }),
        reply,
    })??;
    post(
        a,
        qpa,
        3,
        SendOp::SendWithImm(0xfeed),
        sg(ka, VA + 100, 5000),
    )?;
    let r = ok(wait_for(b, qpb, false)?, 3, "receive")?;
    if (r.byte_len, r.imm_data) != (5000, Some(0xfeed))
        || read(b, kb, VA + (2 << 20), 5000)? != pattern[100..5100]
    {
        return Err(format!("the SEND arrived wrong: {r:?}"));
    }
    ok(wait_for(a, qpa, true)?, 3, "SEND")?;
    // Fetch-and-add 5 on the first word A wrote into B.
    let fa = SendOp::FetchAdd {
        remote_addr: VA + (1 << 20),
        rkey: kb,
        add: 5,
    };
    post(a, qpa, 4, fa, sg(ka, VA + (2 << 20), 8))?;
    ok(wait_for(a, qpa, true)?, 4, "FetchAdd")?;
    let first = u64::from_le_bytes(pattern[..8].try_into().expect("8 bytes"));
    let orig = read(a, ka, VA + (2 << 20), 8)?;
    let now = read(b, kb, VA + (1 << 20), 8)?;
    if orig[..] != pattern[..8] || now[..] != first.wrapping_add(5).to_le_bytes() {
        return Err("the fetch-and-add returned or left the wrong value".into());
    }
    for (c, q) in [(a, qpa), (b, qpb)] {
        if !ask(c, |reply| RdmaCommand::DestroyQp { qpn: q, reply })? {
            return Err(format!("QP {q:#x} could not be destroyed"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::LcoreCounters;
    use crate::lcore::{Command, LcoreId, StdClock, Worker};
    use crate::port::PortInfo;
    use crate::port::mem::link;
    use crossbeam_channel::unbounded;
    use std::sync::Arc;
    use transport::qp::Mtu;
    use transport::wr::SendOp;

    fn info(i: u16) -> PortInfo {
        PortInfo::virtual_port(i, 9000)
    }

    /// Runs `host` on queue `q` in a thread, as an lcore would.
    fn spawn<Q: PortQueue + 'static>(
        i: usize,
        q: Q,
        host: RdmaHost<Q::Buf>,
    ) -> (HostControl, std::thread::JoinHandle<Vec<Q>>) {
        let (tx, rx) = unbounded();
        let w = Worker::new(
            LcoreId(i as u16),
            vec![q],
            host,
            StdClock::new(),
            Arc::new(LcoreCounters::default()),
            rx,
        );
        (tx, std::thread::spawn(move || w.run()))
    }

    /// A QP with the default caps and no congestion control, unconnected.
    fn plain_qp(ctl: &HostControl) -> u32 {
        ask(ctl, |reply| RdmaCommand::CreateQp {
            caps: QpCaps::default(),
            pd: None,
            cqs: [None; 2],
            cc: CcKind::None,
            params: DcqcnParams::nvidia(),
            reply,
        })
        .unwrap()
        .unwrap()
    }

    /// Stops the workers and waits for them.
    fn stop_all<'a, T>(
        ctls: impl IntoIterator<Item = &'a HostControl>,
        threads: Vec<std::thread::JoinHandle<T>>,
    ) {
        for c in ctls {
            c.send(Command::Stop).unwrap();
        }
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn a_destroyed_qps_number_waits_behind_a_thousand_others_before_it_is_given_again() {
        let (qa, _qb) = link(info(1), info(2), 64);
        let (a, t) = spawn(0, qa, RdmaHost::new(0, 0, 100e9));
        let create = || plain_qp(&a);
        let destroy =
            |qpn| assert!(ask(&a, |reply| RdmaCommand::DestroyQp { qpn, reply }).unwrap());
        // Create and destroy one QP at a time, as short perftest runs do: no number comes
        // back while fewer than QPN_QUARANTINE others are free.
        let mut seen = std::collections::HashSet::new();
        for _ in 0..=QPN_QUARANTINE {
            let q = create();
            assert!(seen.insert(q), "QPN {q:#x} given again too soon");
            destroy(q);
        }
        // Then the oldest freed number, first of them all, comes back.
        let first = *seen.iter().min().unwrap();
        assert_eq!(create(), first);
        stop_all([&a], vec![t]);
    }

    #[test]
    fn frames_to_a_destroyed_qp_do_not_land_on_the_next_qp_connected_to_the_same_node() {
        let (qa, qb) = link(info(1), info(2), 8192);
        let (a, ta) = spawn(0, qa, RdmaHost::new(0, 0, 100e9));
        let (b, tb) = spawn(1, qb, RdmaHost::new(1, 0, 100e9));
        // B's end of a first pair goes away (its application exited), A's goes on sending:
        // WRITEs, retransmitted every ACK timeout, to B's old QP number.
        let old = connect_pair(&a, &b, Mtu::M1024, CcKind::None).unwrap();
        assert!(
            ask(&b, |reply| RdmaCommand::DestroyQp {
                qpn: old.qpb,
                reply
            })
            .unwrap()
        );
        for id in 0..4 {
            let wr = SendWr::new(
                id,
                SendOp::Write {
                    remote_addr: PAIR_VA,
                    rkey: old.kb,
                },
                transport::wr::Sge::list(PAIR_VA, 4096, old.ka),
            );
            ask(&a, |reply| RdmaCommand::PostSend {
                qpn: old.qpa,
                wr: Box::new(wr),
                reply,
            })
            .unwrap()
            .unwrap();
        }
        // A new pair between the same two nodes, while those retransmissions go on.
        let new = connect_pair(&a, &b, Mtu::M1024, CcKind::None).unwrap();
        std::thread::sleep(core::time::Duration::from_millis(400));
        let q = ask(&b, |reply| RdmaCommand::Query {
            qpn: new.qpb,
            reply,
        })
        .unwrap()
        .unwrap();
        assert_eq!(
            (q.counters.rcvd_pkts, q.counters.out_of_sequence),
            (0, 0),
            "the old QP's frames reached the new one: {:?}",
            q.counters
        );
        let qa = ask(&a, |reply| RdmaCommand::Query {
            qpn: new.qpa,
            reply,
        })
        .unwrap()
        .unwrap();
        assert_eq!(qa.counters.rcvd_pkts, 0, "{:?}", qa.counters);
        assert_ne!(new.qpb, old.qpb, "B's old QP number given again at once");
        stop_all([&a, &b], vec![ta, tb]);
    }

    #[test]
    fn two_lcores_move_rdma_traffic_over_an_in_memory_link() {
        let (qa, qb) = link(info(1), info(2), 8192);
        let mut ctls = Vec::new();
        let mut threads = Vec::new();
        for (i, q) in [qa, qb].into_iter().enumerate() {
            let (tx, t) = spawn(i, q, RdmaHost::new(i as u32, 0, 100e9));
            threads.push(t);
            ctls.push(tx);
        }
        let (a, b) = (&ctls[0], &ctls[1]);
        for mtu in [Mtu::M1024, Mtu::M4096, Mtu::M256] {
            pair_check(a, b, mtu).unwrap();
        }
        // The lcores' counters, destroyed QPs included: 1 MiB WRITE at three MTUs, three READs
        // and three fetch-and-adds, and every frame one side sent the other received.
        let ca = ask(a, |reply| RdmaCommand::Counters { reply }).unwrap().qp;
        let cb = ask(b, |reply| RdmaCommand::Counters { reply }).unwrap().qp;
        assert_eq!(cb.rx_write_requests, 1024 + 256 + 4096);
        assert_eq!((cb.rx_atomic_requests, ca.rx_read_requests), (3, 3));
        assert_eq!((ca.sent_pkts, cb.sent_pkts), (cb.rcvd_pkts, ca.rcvd_pkts));
        assert_eq!(
            ca.packet_seq_err + ca.local_ack_timeout_err,
            0,
            "a clean link"
        );
        // A stream the lcore keeps posted itself: 2000 WRITEs of 4 KiB, 16 outstanding.
        let pair = connect_pair(a, b, Mtu::M4096, CcKind::Dcqcn).unwrap();
        let wr = SendWr::new(
            0,
            SendOp::Write {
                remote_addr: PAIR_VA,
                rkey: pair.kb,
            },
            transport::wr::Sge::list(PAIR_VA, 4096, pair.ka),
        );
        let r_wr = wr;
        let r = ask(a, |reply| RdmaCommand::Stream {
            qpn: pair.qpa,
            wr: Box::new(wr),
            count: 2000,
            depth: 16,
            duration: None,
            reply,
        })
        .unwrap()
        .unwrap();
        assert_eq!((r.completed, r.errors), (2000, 0));
        // Duration mode (perftest's -D): a count it could never reach, stopped by the clock;
        // what was out completes, and none of the count left over is an error.
        let r = ask(a, |reply| RdmaCommand::Stream {
            qpn: pair.qpa,
            wr: Box::new(r_wr),
            count: u64::MAX,
            depth: 16,
            duration: Some(core::time::Duration::from_millis(100)),
            reply,
        })
        .unwrap()
        .unwrap();
        assert!(r.completed > 0 && r.errors == 0, "{r:?}");
        assert!(r.elapsed_ns >= 100_000_000, "{r:?}");
        // A timed READ latency test (perftest's -D): no margin under a second, so the window
        // is the whole 100 ms; the iterations are those that completed in it.
        let read = SendWr::new(
            0,
            SendOp::Read {
                remote_addr: PAIR_VA,
                rkey: pair.kb,
            },
            transport::wr::Sge::list(PAIR_VA, 8, pair.ka),
        );
        let r = ask(a, |reply| RdmaCommand::Latency {
            qpn: pair.qpa,
            kind: Box::new(LatKind::Request),
            wr: Box::new(read),
            iters: 0,
            duration: Some(core::time::Duration::from_millis(100)),
            server: false,
            reply,
        })
        .unwrap()
        .unwrap();
        let sample = r.sample.expect("a timed test's sample");
        assert!(r.errors == 0 && r.posted_ns.is_empty(), "{r:?}");
        assert!(sample.iters > 0 && r.elapsed_ns >= 100_000_000, "{r:?}");
        assert!(
            (100_000_000..110_000_000).contains(&sample.window_ns),
            "{r:?}"
        );
        // A QP that is not connected cannot stream.
        let q = plain_qp(a);
        let refused = ask(a, |reply| RdmaCommand::Stream {
            qpn: q,
            wr: Box::new(r_wr),
            count: 1,
            depth: 1,
            duration: None,
            reply,
        })
        .unwrap();
        assert!(refused.is_err_and(|e| e.contains("RTS")));
        assert!(r.elapsed_ns > 0);
        // QPNs carry their owner.
        let q = plain_qp(b);
        assert_eq!(shard_of(q), 1);
        // Wrong input gets an answer, not a panic.
        let wr = SendWr::new(9, SendOp::Send, transport::wr::SgList::new());
        let r = ask(a, |reply| RdmaCommand::PostSend {
            qpn: 0x77,
            wr: Box::new(wr),
            reply,
        })
        .unwrap();
        assert!(r.unwrap_err().contains("no QP"));
        assert!(!ask(a, |reply| RdmaCommand::DestroyQp { qpn: 0x77, reply }).unwrap());
        stop_all(&ctls, threads);
    }

    #[test]
    fn a_timed_latency_test_keeps_perftests_clock() {
        let t = |ns: u64| crate::time::Instant(ns);
        const S: u64 = 1_000_000_000;
        // -D 4: a margin of 1 s, the window from 1 s to 3 s, the end at 4 s.
        let mut c = LatClock::new(core::time::Duration::from_secs(4));
        assert!(!c.tick(t(S / 2), S / 2));
        c.completed(5);
        assert!(!c.tick(t(S + 7), S + 7));
        c.completed(3);
        assert!(!c.tick(t(3 * S + 11), 3 * S + 11));
        c.completed(4);
        assert!(!c.tick(t(4 * S - 1), 4 * S - 1));
        assert!(c.tick(t(4 * S), 4 * S));
        assert_eq!(
            c.sample(),
            LatSample {
                iters: 3,
                window_ns: 2 * S + 4
            }
        );
        // -D 1 and -D 3: no margin (whole seconds over 4), the window is the whole test.
        for d in [1, 3] {
            let mut c = LatClock::new(core::time::Duration::from_secs(d));
            assert!(!c.tick(t(0), 0));
            c.completed(2);
            assert!(c.tick(t(d * S), d * S));
            c.completed(9);
            assert_eq!(c.sample().iters, 2);
            assert_eq!(c.sample().window_ns, d * S);
        }
    }

    #[test]
    fn two_lcores_over_impaired_links_recover_everything() {
        use crate::port::impair::{Direction, Impaired, Impairments};
        let (qa, qb) = link(info(1), info(2), 8192);
        let mut ctls = Vec::new();
        let mut handles = Vec::new();
        let mut threads = Vec::new();
        for (i, q) in [qa, qb].into_iter().enumerate() {
            let (q, h) = Impaired::new(q, StdClock::new(), 11 + i as u64);
            h.set(
                Direction::Tx,
                crate::port::impair::Impairments {
                    loss: 0.01,
                    reorder: 0.01,
                    reorder_delay: std::time::Duration::from_micros(20),
                    duplicate: 0.01,
                    ..Impairments::default()
                },
            )
            .unwrap();
            let (tx, t) = spawn(i, q, RdmaHost::new(i as u32, 0, 100e9));
            threads.push(t);
            ctls.push(tx);
            handles.push(h);
        }
        let (a, b) = (&ctls[0], &ctls[1]);
        for mtu in [Mtu::M1024, Mtu::M4096] {
            pair_check(a, b, mtu).unwrap();
        }
        let ca = ask(a, |reply| RdmaCommand::Counters { reply }).unwrap().qp;
        let cb = ask(b, |reply| RdmaCommand::Counters { reply }).unwrap().qp;
        let st = &handles[0].stats.tx;
        assert!(st.lost.get() > 0 && st.duplicated.get() > 0 && st.reordered.get() > 0);
        // The losses were repaired by retransmission, and duplicates were recognised.
        assert!(
            ca.packet_seq_err + ca.implied_nak_seq_err + ca.local_ack_timeout_err > 0,
            "{ca:?}"
        );
        assert!(cb.duplicate_request + cb.out_of_sequence > 0, "{cb:?}");
        stop_all(&ctls, threads);
    }

    #[test]
    fn frames_on_another_lcores_queue_are_handed_to_the_owner() {
        // Two nodes of two lcores, queue i of one joined to queue i of the other (a port with
        // two queues and no RSS). A's QP lives on its lcore 0, B's on its lcore 1: A's frames
        // arrive on B's lcore 0 and B's answers on A's lcore 1, and both must be handed over.
        let (a0, b0) = link(info(1), info(2), 8192);
        let (a1, b1) = link(info(1), info(2), 8192);
        let mut ctls: Vec<Vec<HostControl>> = vec![Vec::new(), Vec::new()];
        let mut threads = Vec::new();
        for (node, queues) in [(0, [a0, a1]), (1, [b0, b1])] {
            let hosts = RdmaHost::sharded(2, 0, 100e9);
            for (i, (q, h)) in queues.into_iter().zip(hosts).enumerate() {
                let (tx, t) = spawn(i, q, h);
                threads.push(t);
                ctls[node].push(tx);
            }
        }
        pair_check(&ctls[0][0], &ctls[1][1], Mtu::M1024).unwrap();
        let handed = |c: &HostControl| ask(c, |reply| RdmaCommand::Counters { reply }).unwrap();
        let (b_lcore0, a_lcore1) = (handed(&ctls[1][0]), handed(&ctls[0][1]));
        assert!(b_lcore0.handoffs >= 1024, "{b_lcore0:?}");
        assert!(a_lcore1.handoffs > 0, "{a_lcore1:?}");
        assert_eq!(b_lcore0.handoff_drops + a_lcore1.handoff_drops, 0);
        stop_all(ctls.iter().flatten(), threads);
    }
}
