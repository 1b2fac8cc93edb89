//! A sans-IO RDMA device: one shard of an RNIC's QPs (quinn-proto's `Endpoint` to
//! [`RcQp`]'s `Connection`).
//!
//! It owns the QP slots and their numbers, the completion queues, the memory regions and
//! protection domains, the ready list and the timer queue. What goes in and what comes out:
//!
//! - **in**: received frames, parsed once with every check ([`Device::handle_frame`]); verbs
//!   calls ([`verbs`]: one method each, typed [`DeviceError`]s); the time, passed into every
//!   call ([`Device::handle_timeouts`] runs what is due).
//! - **out**: frames ([`Device::transmit`] fills buffers through a [`Transmit`] sink that the
//!   caller implements over its port), the next deadline ([`Device::poll_timeout`]),
//!   completions on the CQs, and [`Event`]s for whoever claimed a QP's completions
//!   ([`crate::perftest`]: the perftest engines).
//!
//! The polling order, each loop iteration: every received frame to [`Device::handle_frame`]
//! (frames for another shard go to their owner first: [`shard_of`]), then the [`Event`]s to
//! their consumers ([`Device::poll_event`]), then [`Device::handle_timeouts`], then
//! [`Device::transmit`]; verbs calls between iterations, each followed by the events and a
//! transmit. A QP that may have something to send (after a frame, a post or a timer) goes on
//! the ready list; [`Device::transmit`] polls only those, and each QP's next deadline sits in
//! the timer queue, so idle QPs cost nothing and nothing scans all QPs.
//!
//! QP numbers encode their owner: bits 20-23 are the shard, bits 0-19 the index in its table,
//! so any shard can tell whose a QP is from the BTH alone.

mod slots;
pub mod verbs;

pub use verbs::{CqState, DcqcnSummary, DeviceCounters, QpQuery, SendQueue};

use crate::cc::{CcKind, DcqcnParams};
use crate::cq::{CompletionQueue, LatencyHistograms};
use crate::mr::{MrError, MrTable, PdHandle};
use crate::qp::ModifyError;
use crate::rc::{CapsError, PostError, QpCaps, QpCounters, RcQp};
use crate::timers::TimerQueue;
use crate::wr::WrError;
use std::collections::VecDeque;
use wire::PacketBuf;
use wire::hint::prefetch;
use wire::packet::PacketInfo;
use wire::time::Instant;

/// Bits of a QPN below the owner's shard.
pub const QPN_SHARD_SHIFT: u32 = 20;
/// Packets one QP may send per [`Device::transmit`] before the others get a turn.
const QP_BUDGET: usize = 32;
/// A destroyed QP's number is given out again only once this many others are free: frames
/// still in flight to the old QP (its peer's retransmissions, a READ response, an ACK) must
/// not land on a new QP that took its number and is connected to the same node, which would
/// NAK them (out_of_sequence) and send its own peer a stray NAK (packet_seq_err). RNICs and
/// rxe (`xa_alloc_cyclic`) rotate QP numbers for the same reason. It costs this many unused
/// slots per shard at most.
pub const QPN_QUARANTINE: usize = 1024;

/// The shard (owning lcore) of a QP or CQ number.
pub fn shard_of(qpn: u32) -> u32 {
    (qpn >> QPN_SHARD_SHIFT) & 0xf
}

/// Why a verbs call was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// No such QP on this shard.
    #[error("no QP {0:#x} on this lcore")]
    NoQp(u32),
    /// No such CQ on this shard.
    #[error("no CQ {0} on this lcore")]
    NoCq(u32),
    /// No such protection domain.
    #[error("no PD {0}")]
    NoPd(u32),
    /// QPs of this shard are in the protection domain.
    #[error("QPs of this lcore are in PD {0}")]
    PdInUse(u32),
    /// QP send or receive queues use the CQ.
    #[error("{users} QP send or receive queues use CQ {cqn}")]
    CqInUse {
        /// The CQ.
        cqn: u32,
        /// How many queues use it.
        users: u32,
    },
    /// Every CQ number of this shard is taken.
    #[error("this lcore has no CQ numbers left")]
    NoCqNumbers,
    /// Every QP number of this shard is taken (its 2^20, less the special QPs on shard 0).
    #[error("this lcore holds all the QPs it can (2^20 numbers, none free)")]
    NoQpNumbers,
    /// A memory region refused.
    #[error(transparent)]
    Mr(#[from] MrError),
    /// The caps are out of range (or every QP number is taken).
    #[error(transparent)]
    Caps(#[from] CapsError),
    /// The QP refused the transition.
    #[error(transparent)]
    Modify(#[from] ModifyError),
    /// The QP refused the post.
    #[error(transparent)]
    Post(#[from] PostError),
    /// One QP of several refused.
    #[error("QP {qpn}: {source}")]
    Member {
        /// The QP.
        qpn: u32,
        /// What it refused.
        source: Box<DeviceError>,
    },
}

impl From<WrError> for DeviceError {
    fn from(e: WrError) -> Self {
        DeviceError::Post(PostError::Wr(e))
    }
}

/// Which of a QP's completions someone other than its CQs takes (a perftest engine): they
/// stay in the QP's own queues, and each change to the QP raises an [`Event::Activity`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Claim {
    /// Send completions.
    pub send: bool,
    /// Receive completions.
    pub recv: bool,
}

impl Claim {
    /// Neither side.
    pub const NONE: Claim = Claim {
        send: false,
        recv: false,
    };

    /// Whether either side is claimed.
    pub fn any(self) -> bool {
        self.send || self.recv
    }
}

/// What the device tells the consumers of claimed QPs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Something happened on the claimed QP in slot `slot` (a frame, a timer, a verbs call).
    Activity {
        /// Its slot.
        slot: u32,
    },
    /// The QP `qpn` in slot `slot` was destroyed.
    Destroyed {
        /// Its slot.
        slot: u32,
        /// Its number.
        qpn: u32,
    },
}

/// Where [`Device::transmit`] puts frames: the caller's port queues (an lcore's ports, a
/// simulator's links, a test's vectors), in the manner of smoltcp's `phy::Device`.
pub trait Transmit<B> {
    /// The offloads of `port`: IPv4 header checksum, multi-segment (chained) buffers.
    fn tx_features(&self, port: usize) -> (bool, bool);
    /// Whether `port` takes another frame now (a busy port holds its QPs back).
    fn can_send(&mut self, port: usize) -> bool;
    /// A buffer to build a frame for `port` in.
    fn alloc(&mut self, port: usize) -> Option<B>;
    /// Sends a built frame on `port`.
    fn send(&mut self, port: usize, buf: B);
    /// Takes back a buffer that was not needed (kept for the next frame).
    fn unused(&mut self, buf: B);
}

/// A QP in its slot.
#[derive(Debug)]
pub struct Slot {
    pub(crate) qp: RcQp,
    pub(crate) port: usize,
    /// Its own CQs; for a side bound to a created CQ, where completions wait until
    /// [`Device::settle`] moves them there.
    pub(crate) scq: CompletionQueue,
    pub(crate) rcq: CompletionQueue,
    /// Created CQs (indices in `Device::cqs`) its send and receive completions go to.
    bound: [Option<u32>; 2],
    ready: bool,
    claim: Claim,
    /// An [`Event::Activity`] for it is queued.
    event: bool,
}

/// Bytes of memory a QP with `caps` takes on its lcore from the moment it is created: its
/// slot, its queues at full depth with their inline slots, and its own two CQs (twice each
/// queue's depth). A node budgets its QPs by this, as a device sizes QP contexts by their
/// caps, so that creating QPs fails with a clear error rather than exhausting memory.
pub fn qp_footprint(caps: &QpCaps) -> usize {
    let cqes = 2 * (caps.max_send_wr as usize + caps.max_recv_wr as usize);
    std::mem::size_of::<Option<Slot>>()
        + caps.queue_bytes()
        + cqes * std::mem::size_of::<crate::cq::WorkCompletion>()
}

/// One shard of an RNIC: its QPs, CQs, memory regions, ready list and timers.
pub struct Device {
    shard: u32,
    /// The port new QPs send on until a path says otherwise.
    port: usize,
    pub(crate) mrs: MrTable,
    pd: PdHandle,
    slots: slots::Slots,
    /// Indices of destroyed QPs, oldest first (see [`QPN_QUARANTINE`]).
    free: VecDeque<u32>,
    /// Created completion queues and how many QP sides use each (index 0 unused).
    cqs: Vec<Option<(CompletionQueue, u32)>>,
    cq_free: Vec<u32>,
    ready: VecDeque<u32>,
    timers: TimerQueue<u32>,
    events: VecDeque<Event>,
    line_bps: f64,
    /// Counters of QPs already destroyed.
    retired: QpCounters,
    /// Completion latency of its QPs' signalled send work, by opcode.
    latency: LatencyHistograms,
}

impl core::fmt::Debug for Device {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Device")
            .field("shard", &self.shard)
            .field("qps", &(self.slots.len() - self.free.len()))
            .finish()
    }
}

impl Device {
    /// Shard `shard` (0-15) of a device whose QPs send on `port` of `line_bps`.
    pub fn new(shard: u32, port: usize, line_bps: f64) -> Self {
        let mut mrs = MrTable::new();
        let pd = mrs.alloc_pd();
        Device {
            shard: shard & 0xf,
            port,
            mrs,
            pd,
            slots: slots::Slots::default(),
            free: VecDeque::new(),
            cqs: vec![None],
            cq_free: Vec::new(),
            ready: VecDeque::new(),
            timers: TimerQueue::with_capacity(1024),
            events: VecDeque::with_capacity(256),
            line_bps,
            retired: QpCounters::default(),
            latency: LatencyHistograms::default(),
        }
    }

    /// Its shard.
    pub fn shard(&self) -> u32 {
        self.shard
    }

    fn qpn(&self, index: u32) -> u32 {
        self.shard << QPN_SHARD_SHIFT | index
    }

    /// The table index a QP or CQ number of this shard names (None: another shard's).
    fn local(&self, n: u32) -> Option<usize> {
        (shard_of(n) == self.shard).then_some((n & ((1 << QPN_SHARD_SHIFT) - 1)) as usize)
    }

    fn cq_index(&self, cqn: u32) -> Option<usize> {
        let i = self.local(cqn)?;
        self.cqs.get(i)?.as_ref().map(|_| i)
    }

    /// The slot of QP `qpn`, if it is here.
    pub fn index(&self, qpn: u32) -> Option<usize> {
        let i = self.local(qpn)?;
        self.slots.get(i)?.as_ref().map(|_| i)
    }

    /// The QP in slot `i` and the memory regions (for a consumer of its claimed completions).
    pub(crate) fn slot_mut(&mut self, i: usize) -> Option<(&mut Slot, &mut MrTable)> {
        let s = self.slots.get_mut(i)?.as_mut()?;
        Some((s, &mut self.mrs))
    }

    /// The slot of QP `qpn` or why not.
    fn slot_of(&mut self, qpn: u32) -> Result<(usize, &mut Slot), DeviceError> {
        let i = self.index(qpn).ok_or(DeviceError::NoQp(qpn))?;
        Ok((i, self.slots[i].as_mut().expect("index checked")))
    }

    /// Sets which of slot `i`'s completions are taken by its claimant rather than its CQs.
    pub(crate) fn claim(&mut self, i: usize, c: Claim) {
        if let Some(s) = self.slots.get_mut(i).and_then(Option::as_mut) {
            s.claim = c;
        }
    }

    /// Puts slot `i` on the ready list (it may have something to send).
    pub(crate) fn mark_ready(&mut self, i: usize) {
        if let Some(s) = self.slots[i].as_mut()
            && !s.ready
        {
            s.ready = true;
            self.ready.push_back(i as u32);
        }
    }

    /// Moves slot `i`'s unclaimed completions to the created CQs its sides are bound to (a
    /// full CQ goes to error and the completion is lost, as on hardware).
    #[inline]
    pub(crate) fn settle(&mut self, i: usize) {
        let Some(s) = self.slots[i].as_mut() else {
            return;
        };
        // Most calls (a frame in, a request posted) find nothing to move.
        if s.scq.is_empty() && s.rcq.is_empty() {
            return;
        }
        let sides = [
            (s.bound[0].filter(|_| !s.claim.send), &mut s.scq),
            (s.bound[1].filter(|_| !s.claim.recv), &mut s.rcq),
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

    /// Something happened to slot `i`: its completions move on, and its claimant hears.
    #[inline]
    fn touched(&mut self, i: usize) {
        self.settle(i);
        if let Some(s) = self.slots[i].as_mut()
            && s.claim.any()
            && !s.event
        {
            s.event = true;
            self.events.push_back(Event::Activity { slot: i as u32 });
        }
    }

    /// The next event for the consumers of claimed QPs.
    pub fn poll_event(&mut self) -> Option<Event> {
        let e = self.events.pop_front()?;
        if let Event::Activity { slot } = e
            && let Some(s) = self.slots[slot as usize].as_mut()
        {
            s.event = false;
        }
        Some(e)
    }

    /// Gives a received frame (parsed once with every check: `info`) to the QP it names;
    /// Err if that QP is not here (the caller counts the drop).
    #[inline]
    pub fn handle_frame(
        &mut self,
        now: Instant,
        info: &PacketInfo,
        frame: &[u8],
    ) -> Result<(), DeviceError> {
        let Some(i) = self.index(info.dest_qp) else {
            return Err(DeviceError::NoQp(info.dest_qp));
        };
        let s = self.slots[i].as_mut().expect("index checked");
        s.qp.handle_parsed(now, info, frame, &mut self.mrs, &mut s.scq, &mut s.rcq);
        let lat = &mut self.latency;
        s.qp.take_latencies(|op, ns| lat.record(op, ns));
        self.mark_ready(i);
        self.touched(i);
        Ok(())
    }

    /// The earliest deadline of any QP.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        self.timers.next_deadline()
    }

    /// Runs every QP deadline due by `now` (ACK timeouts, RNR waits, DCQCN timers, pacing).
    pub fn handle_timeouts(&mut self, now: Instant) {
        while let Some(i) = self.timers.pop_expired(now) {
            if let Some(s) = self.slots[i as usize].as_mut() {
                s.qp.handle_timeout(now, &mut s.scq, &mut s.rcq);
                self.mark_ready(i as usize);
                self.touched(i as usize);
            }
        }
    }

    /// Whether any QP may have something to send.
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Sends what the ready QPs have, `budget` frames at most, into `tx`; then re-arms their
    /// timers.
    pub fn transmit<B: PacketBuf>(
        &mut self,
        now: Instant,
        mut budget: usize,
        tx: &mut impl Transmit<B>,
    ) {
        for _ in 0..self.ready.len() {
            if budget == 0 {
                break;
            }
            let Some(i) = self.ready.pop_front() else {
                break;
            };
            // Two QPs ahead, their state; one ahead (its state asked for a turn ago), the
            // request it sends next: among many QPs neither is in the cache any more.
            if let Some(&n) = self.ready.get(1)
                && let Some(Some(s)) = self.slots.get(n as usize)
            {
                prefetch(s);
                s.qp.prefetch();
            }
            if let Some(&n) = self.ready.front()
                && let Some(Some(s)) = self.slots.get(n as usize)
            {
                s.qp.prefetch_next_wqe();
            }
            let Some(s) = self.slots[i as usize].as_mut() else {
                continue;
            };
            s.ready = false;
            let (cksum, multi_seg) = tx.tx_features(s.port);
            s.qp.set_tx_features(cksum, multi_seg);
            let mut sent = 0;
            let mut blocked = false;
            while sent < QP_BUDGET.min(budget) {
                // A busy port holds the QP back (its frames wait in the queue, not dropped
                // to be retransmitted): it is polled again next iteration.
                if !tx.can_send(s.port) {
                    blocked = true;
                    break;
                }
                let Some(mut buf) = tx.alloc(s.port) else {
                    break;
                };
                if s.qp
                    .poll_transmit(now, &self.mrs, &mut s.scq, &mut s.rcq, &mut buf)
                {
                    tx.send(s.port, buf);
                    sent += 1;
                } else {
                    tx.unused(buf);
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
                self.touched(i as usize);
                break;
            }
            budget -= sent;
            if sent == QP_BUDGET {
                s.ready = true;
                self.ready.push_back(i);
            } else if budget == 0 {
                // The budget ran out inside this QP: it goes on first next time.
                s.ready = true;
                self.ready.push_front(i);
            }
            self.touched(i as usize);
        }
    }

    /// Creates a QP in RESET; its QPN.
    pub fn create_qp(
        &mut self,
        caps: QpCaps,
        pd: Option<u32>,
        cqs: [Option<u32>; 2],
        cc: CcKind,
        params: DcqcnParams,
    ) -> Result<u32, DeviceError> {
        let pd = PdHandle(pd.unwrap_or(self.pd.0));
        if !self.mrs.has_pd(pd) {
            return Err(DeviceError::NoPd(pd.0));
        }
        let mut bound = [None; 2];
        for (b, c) in bound.iter_mut().zip(cqs) {
            if let Some(cqn) = c {
                let i = self.cq_index(cqn).ok_or(DeviceError::NoCq(cqn))?;
                *b = Some(i as u32);
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
                    self.slots.push_empty();
                    self.slots.push_empty();
                }
                self.slots.push_empty();
                self.slots.len() as u32 - 1
            }
            // Every number is taken: the oldest freed one, if any.
            None => match self.free.pop_front() {
                Some(i) => i,
                None => return Err(DeviceError::NoQpNumbers),
            },
        };
        let mut qp = match RcQp::new(self.qpn(i), pd, caps) {
            Ok(qp) => qp,
            Err(e) => {
                self.free.push_front(i);
                return Err(e.into());
            }
        };
        qp.set_congestion_control(cc, self.line_bps, params);
        let qpn = qp.qpn;
        self.slots[i as usize] = Some(Slot {
            qp,
            port: self.port,
            scq: CompletionQueue::new(caps.max_send_wr as usize * 2),
            rcq: CompletionQueue::new(caps.max_recv_wr as usize * 2),
            bound,
            ready: false,
            claim: Claim::NONE,
            event: false,
        });
        for c in bound.into_iter().flatten() {
            if let Some((_, users)) = self.cqs[c as usize].as_mut() {
                *users += 1;
            }
        }
        Ok(qpn)
    }

    /// Destroys a QP (its outstanding work goes with it); false if there is no such QP here.
    /// A claimed QP's claimant hears [`Event::Destroyed`].
    pub fn destroy_qp(&mut self, qpn: u32) -> bool {
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
            if s.claim.any() {
                self.events.push_back(Event::Destroyed {
                    slot: i as u32,
                    qpn,
                });
            }
        }
        self.timers.cancel(i as u32);
        self.free.push_back(i as u32);
        true
    }

    /// Every QP slot in use, with its index.
    pub(crate) fn slots(&self) -> impl Iterator<Item = (usize, &Slot)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (i, s)))
    }

    /// The state of the QP in slot `i`.
    pub fn state(&self, i: usize) -> Option<crate::qp::QpState> {
        Some(self.slots.get(i)?.as_ref()?.qp.cfg.state)
    }

    /// Takes the QP in slot `i` to ERR and flushes its work (a test cancelled).
    pub(crate) fn fail(&mut self, i: usize) {
        let Some(s) = self.slots.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        let err = crate::qp::QpAttr {
            state: Some(crate::qp::QpState::Err),
            ..Default::default()
        };
        if s.qp.modify(&err).is_ok() {
            s.qp.flush(&mut s.scq);
            s.qp.flush_recv(&mut s.rcq);
        }
    }

    /// Drops every QP (the lcore is stopping).
    pub fn clear(&mut self) {
        self.slots.clear();
        self.ready.clear();
        self.events.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_qps_footprint_grows_with_its_queues_and_inline_slots() {
        let d = QpCaps::default();
        let base = qp_footprint(&d);
        println!("default caps: {base} B");
        let deeper = qp_footprint(&QpCaps {
            max_send_wr: 2 * d.max_send_wr,
            ..d
        });
        let inline = qp_footprint(&QpCaps {
            max_inline_data: 64,
            ..d
        });
        let small = qp_footprint(&QpCaps {
            max_send_wr: 1,
            max_recv_wr: 1,
            ..d
        });
        println!("send queue twice as deep: {deeper} B, 64 B inline: {inline} B, 1/1: {small} B");
        assert!(deeper > base && inline == base + 64 * d.max_send_wr as usize);
        assert!(small < base / 10 && small >= std::mem::size_of::<Option<Slot>>());
    }
}
