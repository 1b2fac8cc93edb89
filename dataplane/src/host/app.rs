//! Applications' queues on the lcore: the send and receive queues an attached application
//! writes work queue entries into, and the completion rings it reads, as one more input and
//! output of the shard's device (issue 21; the attach socket that sets them up comes next).
//!
//! The lcore visits only QPs that have something to do. An application rings its doorbell
//! ([`verbs::bell`]: one region per application on each lcore, a bit per QP) after
//! publishing entries; the device raises an event when a QP's completions change. Each loop
//! iteration, [`Apps::poll`] looks at each region's summary word (one load for an application
//! with nothing new), and visits the QPs rung, the QPs the device named, and the QPs it could
//! not finish last time. A visit takes what the QP's rings hold (a bounded number of entries
//! per ring), decodes each entry from its private copy ([`verbs::ring::Consumer::pop`]), turns
//! it into the transport's work request and posts it on the device; then it moves the QP's
//! completions, which the device keeps in the QP's own queues for it ([`Device::claim_qp`]),
//! into the application's completion rings, as many as they have room for (the rest wait,
//! first in line, and the QP is visited again). Nothing here allocates, locks or makes a
//! system call.
//!
//! Bad input stays with its QP. An entry that does not decode, or that the QP refuses, completes
//! in error (`IBV_WC_LOC_QP_OP_ERR`, or the local protection error the post names) and moves
//! the QP to ERR, as a provider that finds a bad WQE does; its other work completes flushed. A
//! ring whose indices are impossible is abandoned: its QP goes to ERR and the ring is read no
//! more. No other QP, and nothing of the lcore, notices.

use crate::time::Instant;
use transport::cq::{WcOpcode, WcStatus, WorkCompletion};
use transport::device::{Claim, Device, DeviceError, Event, SendQueue};
use transport::qp::{Path, QpAttr, QpState};
use transport::rc::PostError;
use transport::wr::{RecvWr, SendOp, SendWr, SgList, Sge, WrError};
use verbs::abi::{self, Cqe, RecvWqe, SendView, WrOpcode, send_flags};
use verbs::bell::{BELL_QPS, Bells};
use verbs::ring::{Consumer, Producer};

// The rings' scatter/gather lists fit the transport's.
const _: () = assert!(abi::MAX_SGE == transport::wr::MAX_SGE);
const _: () = assert!(abi::MAX_RD_ATOMIC == transport::qp::MAX_RD_ATOMIC);

/// Entries taken from one ring per loop iteration, so that a busy application cannot hold the
/// lcore away from its frames and its other QPs.
pub const ENTRIES_PER_POLL: usize = 32;
/// The largest slot a ring may have (what [`verbs::ring::RingLayout`] allows).
const MAX_SLOT: usize = 4096;

/// Set by the lcore when it abandons an application's rings (a QP's queues or a CQ's
/// completion ring), read by the control plane, which tells the application (an asynchronous
/// event): one store, on the lcore's error path.
pub type Fault = std::sync::Arc<std::sync::atomic::AtomicBool>;

/// The rings of one application QP.
#[derive(Debug)]
pub struct AppQueues {
    /// The device QP they drive.
    pub qpn: u32,
    /// Send work queue entries, from the application.
    pub sq: Consumer,
    /// Receive work queue entries, from the application.
    pub rq: Consumer,
    /// The completion ring its send completions go to ([`Apps::add_cq`]).
    pub send_cq: u32,
    /// The completion ring its receive completions go to (may be the same).
    pub recv_cq: u32,
    /// Its protection domain (a UD send may name only address handles of it).
    pub pd: u32,
    /// The doorbell region its application rings it in ([`Apps::add_bells`]).
    pub bells: u32,
    /// Set when the lcore puts the QP in error for its queues' fault.
    pub fault: Fault,
}

/// Why rings were refused.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// No completion ring of that number on this lcore.
    #[error("no completion ring {0} on this lcore")]
    NoCq(u32),
    /// QPs still complete into the ring.
    #[error("QPs still complete into ring {0}")]
    CqInUse(u32),
    /// No doorbell region of that number on this lcore.
    #[error("no doorbell region {0} on this lcore")]
    NoBells(u32),
    /// Every bit of the doorbell region rings a QP already.
    #[error("doorbell region {0} rings {BELL_QPS} QPs already")]
    BellsFull(u32),
    /// The device refused.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// What application queues did: one application's on one lcore (its doorbell region's), or
/// all of a shard's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AppCounters {
    /// Send entries posted.
    pub sends: u64,
    /// Receive entries posted.
    pub recvs: u64,
    /// Completions written to the applications' rings.
    pub completions: u64,
    /// Entries refused (they did not decode, or the QP refused them).
    pub refused: u64,
    /// Rings abandoned because their indices were impossible.
    pub broken_rings: u64,
    /// Visits to QPs (rung, named by the device, or left unfinished): an idle QP costs none.
    pub visits: u64,
    /// Completions dropped because their completion ring was abandoned as corrupt.
    pub dropped: u64,
}

impl AppCounters {
    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &AppCounters) {
        self.sends += o.sends;
        self.recvs += o.recvs;
        self.completions += o.completions;
        self.refused += o.refused;
        self.broken_rings += o.broken_rings;
        self.visits += o.visits;
        self.dropped += o.dropped;
    }
}

#[derive(Debug)]
struct AppQp {
    q: AppQueues,
    /// A ring of it was corrupt: the QP is in ERR and its rings are read no more.
    broken: bool,
    /// Its slot on the device.
    slot: u32,
    /// Its bit in its doorbell region.
    bit: u32,
    /// It is on the list of QPs to visit.
    queued: bool,
}

/// One application's doorbell region on this lcore, and which QP each bit rings.
#[derive(Debug)]
struct BellRegion {
    bells: Bells,
    /// By bit: the QP's index in [`Apps::qps`] + 1 (0: none).
    qps: Vec<u32>,
    /// What its application's QPs on this lcore did.
    counters: AppCounters,
}

/// What decoding an entry works in, kept between entries: a private copy of the slot, and the
/// work request it becomes.
#[derive(Debug)]
struct Scratch {
    slot: [u8; MAX_SLOT],
    wr: SendWr,
}

/// A completion ring, and the eventfd of its completion channel.
#[derive(Debug)]
struct AppCq {
    ring: Producer,
    event: Option<std::os::fd::OwnedFd>,
    /// Its consumer index was impossible: it is written no more, and what would go to it is
    /// dropped (counted), as a CQ in error loses its completions.
    broken: bool,
    /// Set with `broken`, for the control plane.
    fault: Fault,
}

/// The shard's application QPs and the completion rings they complete into. A CQ's ring has one
/// producer, this lcore: every QP completing into it lives here (as the node places QPs on
/// the lcore of their CQs).
#[derive(Debug)]
pub struct Apps {
    /// By index (None: a free index).
    qps: Vec<Option<AppQp>>,
    /// By device slot: the QP's index + 1 (0: not an application's QP).
    by_slot: Vec<u32>,
    /// Doorbell regions by number (None: a freed number).
    bells: Vec<Option<BellRegion>>,
    /// QPs to visit on the next poll, and the list being visited (capacity for every QP, so
    /// that queueing never allocates).
    work: Vec<u32>,
    visiting: Vec<u32>,
    /// QPs attached.
    live: usize,
    /// Completion rings by number (None: a freed number).
    cqs: Vec<Option<AppCq>>,
    /// Address handles by number - 1, with their protection domain (None: a freed number).
    ahs: Vec<Option<(u32, Path)>>,
    /// A private copy of the slot being decoded.
    scratch: Box<Scratch>,
    /// What they did.
    /// What QPs whose region is gone did, and regions removed.
    retired: AppCounters,
}

impl Default for Apps {
    fn default() -> Self {
        Apps {
            qps: Vec::new(),
            by_slot: Vec::new(),
            bells: Vec::new(),
            work: Vec::new(),
            visiting: Vec::new(),
            live: 0,
            cqs: Vec::new(),
            ahs: Vec::new(),
            scratch: Box::new(Scratch {
                slot: [0; MAX_SLOT],
                wr: SendWr {
                    wr_id: 0,
                    op: SendOp::Send,
                    sg: SgList::new(),
                    signaled: false,
                    solicited: false,
                    fence: false,
                    inline: false,
                    ud: None,
                },
            }),
            retired: AppCounters::default(),
        }
    }
}

impl Apps {
    /// Takes a completion ring the application reads, and the eventfd of its completion
    /// channel (written when a completion arrives while the application has armed the ring);
    /// its number for [`AppQueues`].
    pub fn add_cq(
        &mut self,
        ring: Producer,
        event: Option<std::os::fd::OwnedFd>,
        fault: Fault,
    ) -> u32 {
        let cq = AppCq {
            ring,
            event,
            broken: false,
            fault,
        };
        match self.cqs.iter().position(Option::is_none) {
            Some(i) => {
                self.cqs[i] = Some(cq);
                i as u32
            }
            None => {
                self.cqs.push(Some(cq));
                self.cqs.len() as u32 - 1
            }
        }
    }

    /// Takes an application's doorbell region on this lcore: its number for [`AppQueues`].
    pub fn add_bells(&mut self, bells: Bells) -> u32 {
        let r = Some(BellRegion {
            bells,
            qps: Vec::new(),
            counters: AppCounters::default(),
        });
        match self.bells.iter().position(Option::is_none) {
            Some(i) => {
                self.bells[i] = r;
                i as u32
            }
            None => {
                self.bells.push(r);
                self.bells.len() as u32 - 1
            }
        }
    }

    /// Gives doorbell region `n` back (its QPs, if any are left, are no longer rung: they
    /// move only when the device names them).
    pub fn remove_bells(&mut self, n: u32) -> Option<Bells> {
        let r = self.bells.get_mut(n as usize)?.take()?;
        self.retired.add(&r.counters);
        Some(r.bells)
    }

    /// What the shard's application queues did, all told.
    pub fn counters(&self) -> AppCounters {
        let mut c = self.retired;
        for r in self.bells.iter().flatten() {
            c.add(&r.counters);
        }
        c
    }

    /// What each doorbell region's application did on this lcore, by region number.
    pub fn region_counters(&self) -> Vec<(u32, AppCounters)> {
        self.bells
            .iter()
            .enumerate()
            .filter_map(|(n, r)| r.as_ref().map(|r| (n as u32, r.counters)))
            .collect()
    }

    /// Gives completion ring `cq` back, refused while a QP of `dev` completes into it (QPs
    /// destroyed already no longer count).
    pub fn remove_cq(&mut self, dev: &Device, cq: u32) -> Result<Producer, AppError> {
        if self
            .qps
            .iter()
            .flatten()
            .filter(|a| dev.index(a.q.qpn).is_some())
            .any(|a| a.q.send_cq == cq || a.q.recv_cq == cq)
        {
            return Err(AppError::CqInUse(cq));
        }
        self.cqs
            .get_mut(cq as usize)
            .and_then(Option::take)
            .map(|c| c.ring)
            .ok_or(AppError::NoCq(cq))
    }

    /// Installs address handle `ah` (not 0) of protection domain `pd`: where UD sends naming
    /// it go (the node installs each on every lcore under one number).
    pub fn set_ah(&mut self, ah: u32, pd: u32, path: Path) {
        let Some(i) = (ah as usize).checked_sub(1) else {
            return;
        };
        if self.ahs.len() <= i {
            self.ahs.resize(i + 1, None);
        }
        self.ahs[i] = Some((pd, path));
    }

    /// Removes address handle `ah`.
    pub fn remove_ah(&mut self, ah: u32) {
        if let Some(a) = (ah as usize)
            .checked_sub(1)
            .and_then(|i| self.ahs.get_mut(i))
        {
            *a = None;
        }
    }

    /// Drives QP `q.qpn` of `dev` from these rings from now on (its completions go to its
    /// completion rings): the bit its application rings in its doorbell region.
    pub fn attach(&mut self, dev: &mut Device, q: AppQueues) -> Result<u32, AppError> {
        for cq in [q.send_cq, q.recv_cq] {
            if !matches!(self.cqs.get(cq as usize), Some(Some(_))) {
                return Err(AppError::NoCq(cq));
            }
        }
        let region = self
            .bells
            .get(q.bells as usize)
            .and_then(Option::as_ref)
            .ok_or(AppError::NoBells(q.bells))?;
        let bit = match region.qps.iter().position(|&i| i == 0) {
            Some(b) => b as u32,
            None if region.qps.len() < BELL_QPS as usize => region.qps.len() as u32,
            None => return Err(AppError::BellsFull(q.bells)),
        };
        let slot = dev.index(q.qpn).ok_or(DeviceError::NoQp(q.qpn))?;
        dev.claim_qp(
            q.qpn,
            Claim {
                send: true,
                recv: true,
            },
        )?;
        self.detach(q.qpn);
        let i = match self.qps.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.qps.push(None);
                self.qps.len() - 1
            }
        };
        let region = self.bells[q.bells as usize]
            .as_mut()
            .expect("looked up above");
        if region.qps.len() <= bit as usize {
            region.qps.resize(bit as usize + 1, 0);
        }
        region.qps[bit as usize] = i as u32 + 1;
        if self.by_slot.len() <= slot {
            self.by_slot.resize(slot + 1, 0);
        }
        self.by_slot[slot] = i as u32 + 1;
        // Room to queue every QP, each once, without allocating on the lcore's path.
        let n = self.qps.len();
        self.work.reserve(n.saturating_sub(self.work.len()));
        self.visiting.reserve(n.saturating_sub(self.visiting.len()));
        self.qps[i] = Some(AppQp {
            q,
            broken: false,
            slot: slot as u32,
            bit,
            // Visited once now, for entries published before it was attached.
            queued: true,
        });
        self.work.push(i as u32);
        self.live += 1;
        Ok(bit)
    }

    /// Stops reading QP `qpn`'s rings and gives them back (the QP itself is the device's).
    pub fn detach(&mut self, qpn: u32) -> Option<AppQueues> {
        let i = self
            .qps
            .iter()
            .position(|a| a.as_ref().is_some_and(|a| a.q.qpn == qpn))?;
        let a = self.qps[i].take()?;
        if let Some(Some(r)) = self.bells.get_mut(a.q.bells as usize)
            && let Some(b) = r.qps.get_mut(a.bit as usize)
            && *b == i as u32 + 1
        {
            *b = 0;
        }
        if let Some(s) = self.by_slot.get_mut(a.slot as usize)
            && *s == i as u32 + 1
        {
            *s = 0;
        }
        self.work.retain(|&w| w as usize != i);
        self.live -= 1;
        Some(a.q)
    }

    /// QPs driven by rings.
    pub fn len(&self) -> usize {
        self.live
    }

    /// True when no QP is driven by rings.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// What the device said of one of its QPs: an application's QP with news (completions,
    /// a state change) is visited on the next poll; a destroyed one is read no more.
    #[inline]
    pub fn on_event(&mut self, e: &Event) {
        match *e {
            Event::Activity { slot } => {
                if let Some(&i) = self.by_slot.get(slot as usize)
                    && i != 0
                {
                    queue(&mut self.qps, &mut self.work, i - 1);
                }
            }
            Event::Destroyed { slot, qpn } => {
                if let Some(&i) = self.by_slot.get(slot as usize)
                    && i != 0
                {
                    self.detach(qpn);
                }
            }
        }
    }

    /// Visits the QPs rung, named by the device, or left unfinished: takes what their rings
    /// hold, posts it, and writes what completed (see the module doc).
    // Not inlined into the loop's poll: a shard without application QPs never calls it.
    #[inline(never)]
    pub fn poll(&mut self, dev: &mut Device, now: Instant) {
        for r in self.bells.iter().flatten() {
            let (qps, work) = (&mut self.qps, &mut self.work);
            r.bells.take(|bit| {
                if let Some(&i) = r.qps.get(bit as usize)
                    && i != 0
                {
                    queue(qps, work, i - 1);
                }
            });
        }
        if self.work.is_empty() {
            return;
        }
        core::mem::swap(&mut self.work, &mut self.visiting);
        let scratch = &mut *self.scratch;
        let cqs = &mut self.cqs[..];
        let ahs = &self.ahs[..];
        for &i in &self.visiting {
            let Some(Some(a)) = self.qps.get_mut(i as usize) else {
                continue;
            };
            a.queued = false;
            // Counted for its application (single writer: this lcore).
            let c = match self.bells.get_mut(a.q.bells as usize) {
                Some(Some(r)) => &mut r.counters,
                _ => &mut self.retired,
            };
            c.visits += 1;
            if dev.index(a.q.qpn) != Some(a.slot as usize) {
                // Destroyed (the device's event detaches it).
                continue;
            }
            // Its completions (the flushes, for a broken QP) still reach the application.
            let mut more = false;
            if !a.broken {
                more |= take_sends(dev, a, scratch, cqs, ahs, c, now);
                if !a.broken {
                    more |= take_recvs(dev, a, scratch, cqs, c);
                }
            }
            more |= complete(dev, a, cqs, c);
            if more {
                a.queued = true;
                self.work.push(i);
            }
        }
        self.visiting.clear();
    }
}

/// Puts QP `i` on the list of QPs to visit, once.
#[inline]
fn queue(qps: &mut [Option<AppQp>], work: &mut Vec<u32>, i: u32) {
    if let Some(Some(a)) = qps.get_mut(i as usize)
        && !a.queued
    {
        a.queued = true;
        work.push(i);
    }
}

/// Takes up to [`ENTRIES_PER_POLL`] entries from the QP's send ring and posts them, through
/// its send queue held for the run ([`Device::send_queue`]: one lookup, one clock update, one
/// ready mark for the lot); stops at an empty ring, a refused entry or a corrupt ring. True if
/// it stopped at the bound, with entries perhaps left for the next visit. (A refused entry's
/// completion is built only when one is refused: a completion built for every entry cost
/// 28 instructions a message in stream_cost --app, this 4.)
fn take_sends(
    dev: &mut Device,
    a: &mut AppQp,
    scratch: &mut Scratch,
    cqs: &mut [Option<AppCq>],
    ahs: &[Option<(u32, Path)>],
    c: &mut AppCounters,
    now: Instant,
) -> bool {
    let Scratch { slot, wr } = scratch;
    let mut left = ENTRIES_PER_POLL;
    loop {
        // Posts until the ring is empty, the bound, or an entry the QP does not take.
        let (refused, in_err) = {
            let Some(mut sq) = dev.send_queue(a.slot as usize, now) else {
                return false;
            };
            loop {
                if left == 0 {
                    return true;
                }
                left -= 1;
                let len = match pop_entry::<true>(a, slot) {
                    Ok(Some(n)) => n,
                    Ok(None) => return false,
                    Err(_) => {
                        drop(sq);
                        broken(dev, a, c);
                        return false;
                    }
                };
                match post_send_entry(&mut sq, &a.q, &slot[..len], wr, ahs) {
                    Ok(()) => c.sends += 1,
                    Err(status) => break (status, sq.state() == QpState::Err),
                }
            }
        };
        let entry = &slot[..];
        let done = Done {
            wr_id: entry_id(entry),
            opcode: entry_opcode(entry),
            send: true,
        };
        if in_err {
            // A send posted to a QP in ERR: flushed, as verbs completes such work, and the QP
            // stays as it is.
            complete_now(dev, a, cqs, c, &done, WcStatus::WrFlushErr);
            continue;
        }
        // An entry the QP cannot take: its error completion, and the QP to ERR (its other
        // work completes flushed).
        c.refused += 1;
        complete_now(dev, a, cqs, c, &done, refused);
        to_err(dev, a.q.qpn);
        return false;
    }
}

/// [`take_sends`] of the receive ring, through [`Device::post_recv`] (receives in ERR are
/// taken, and flushed, by the QP itself).
fn take_recvs(
    dev: &mut Device,
    a: &mut AppQp,
    scratch: &mut Scratch,
    cqs: &mut [Option<AppCq>],
    c: &mut AppCounters,
) -> bool {
    let slot = &mut scratch.slot;
    for _ in 0..ENTRIES_PER_POLL {
        let len = match pop_entry::<false>(a, slot) {
            Ok(Some(n)) => n,
            Ok(None) => return false,
            Err(_) => {
                broken(dev, a, c);
                return false;
            }
        };
        let entry = &slot[..len];
        let r = match RecvWqe::decode(entry) {
            Ok(w) => dev
                .post_recv(a.q.qpn, recv_wr(&w))
                .map_err(|e| status_of(&e)),
            Err(_) => Err(WcStatus::LocQpOpErr),
        };
        match r {
            Ok(()) => c.recvs += 1,
            Err(status) => {
                let done = Done {
                    wr_id: entry_id(entry),
                    opcode: WcOpcode::Recv,
                    send: false,
                };
                c.refused += 1;
                complete_now(dev, a, cqs, c, &done, status);
                to_err(dev, a.q.qpn);
                return false;
            }
        }
    }
    true
}

/// Copies the next entry of the send (`SEND`) or receive ring into `slot`: its header, then
/// the scatter/gather entries or inline bytes the header names (at most the slot's worth:
/// decoding checks the rest). The entry's length in `slot`, None if the ring is empty.
#[inline(always)]
fn pop_entry<const SEND: bool>(
    a: &mut AppQp,
    slot: &mut [u8],
) -> Result<Option<usize>, verbs::ring::RingError> {
    if SEND {
        let (h, rest) = slot
            .split_first_chunk_mut::<{ abi::SEND_HEADER }>()
            .expect("a slot buffer holds a header");
        let n = a.q.sq.pop_split(h, rest, SendView::body_len)?;
        Ok(n.map(|n| abi::SEND_HEADER + n))
    } else {
        let (h, rest) = slot
            .split_first_chunk_mut::<{ abi::RECV_HEADER }>()
            .expect("a slot buffer holds a header");
        let n = a.q.rq.pop_split(h, rest, RecvWqe::body_len)?;
        Ok(n.map(|n| abi::RECV_HEADER + n))
    }
}

/// Decodes a send entry in place and posts it.
#[inline(always)]
fn post_send_entry(
    sq: &mut SendQueue<'_>,
    q: &AppQueues,
    entry: &[u8],
    wr: &mut SendWr,
    ahs: &[Option<(u32, Path)>],
) -> Result<(), WcStatus> {
    let qpn = q.qpn;
    let w = SendView::new_checked(entry).map_err(|_| WcStatus::LocQpOpErr)?;
    send_wr(&w, wr);
    let t = w.ud();
    if t != abi::UdTarget::default() {
        // A UD send: its address handle must be one of the QP's protection domain (another
        // application's is refused like an unknown one).
        let Some(Some((pd, path))) = (t.ah as usize).checked_sub(1).and_then(|i| ahs.get(i)) else {
            return Err(WcStatus::LocQpOpErr);
        };
        if *pd != q.pd || t.remote_qpn > 0xff_ffff {
            return Err(WcStatus::LocQpOpErr);
        }
        let mut path = *path;
        path.udp_sport = crate::port::rss::steer_sport(
            path.local_ip,
            path.remote_ip,
            crate::wire::udp::source_port_for_qp(qpn, t.remote_qpn),
            transport::device::shard_of(t.remote_qpn) as u16,
        );
        wr.ud = Some(transport::wr::UdDest {
            path,
            dest_qp: t.remote_qpn,
            qkey: t.qkey,
        });
    }
    let inline = (w.flags() & send_flags::INLINE != 0).then(|| w.inline());
    sq.post(wr, inline).map_err(|e| status_of(&e))
}

/// What an entry that completes at once (without reaching the QP) completes as.
struct Done {
    wr_id: u64,
    opcode: WcOpcode,
    send: bool,
}

/// Writes the completion of an entry that did not reach the QP, after what the QP completed
/// before it.
fn complete_now(
    dev: &mut Device,
    a: &mut AppQp,
    cqs: &mut [Option<AppCq>],
    c: &mut AppCounters,
    d: &Done,
    status: WcStatus,
) {
    complete(dev, a, cqs, c);
    let wc = WorkCompletion {
        wr_id: d.wr_id,
        status,
        opcode: d.opcode,
        byte_len: 0,
        imm_data: None,
        invalidated_rkey: None,
        qp_num: a.q.qpn,
        src_qp: None,
    };
    let cq = if d.send { a.q.send_cq } else { a.q.recv_cq };
    if push(cqs, cq, &wc) {
        c.completions += 1;
        notify(cqs, cq);
    }
}

/// The wr_id of an entry that may not decode (its first eight bytes, as the layout puts it).
fn entry_id(entry: &[u8]) -> u64 {
    entry
        .get(..8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

fn entry_opcode(entry: &[u8]) -> WcOpcode {
    match entry.get(8).copied() {
        Some(0 | 1) => WcOpcode::RdmaWrite,
        Some(4) => WcOpcode::RdmaRead,
        Some(5) => WcOpcode::CompSwap,
        Some(6) => WcOpcode::FetchAdd,
        _ => WcOpcode::Send,
    }
}

fn broken(dev: &mut Device, a: &mut AppQp, c: &mut AppCounters) {
    c.broken_rings += 1;
    a.broken = true;
    a.q.fault.store(true, std::sync::atomic::Ordering::Release);
    to_err(dev, a.q.qpn);
}

fn to_err(dev: &mut Device, qpn: u32) {
    let err = QpAttr {
        state: Some(QpState::Err),
        ..Default::default()
    };
    let _ = dev.modify(qpn, &err, 0);
}

/// Writes `wc` into completion ring `cq`; false if it is full (or gone, or broken).
fn push(cqs: &mut [Option<AppCq>], cq: u32, wc: &WorkCompletion) -> bool {
    match cqs.get_mut(cq as usize) {
        Some(Some(c)) if !c.broken => matches!(c.ring.push_array(&cqe(wc).encode()), Ok(true)),
        _ => false,
    }
}

/// Moves the QP's completions into its completion rings while they have room; true if some
/// are left (a ring was full).
fn complete(
    dev: &mut Device,
    a: &mut AppQp,
    cqs: &mut [Option<AppCq>],
    c: &mut AppCounters,
) -> bool {
    let mut full = false;
    for (send, cq) in [(true, a.q.send_cq), (false, a.q.recv_cq)] {
        // A ring gone (the CQ destroyed under its QPs) takes nothing: they wait.
        let Some(Some(ring)) = cqs.get_mut(cq as usize) else {
            continue;
        };
        if ring.broken {
            // Its completions are dropped, not kept for a ring that cannot take them.
            let n = dev.take_completions(a.q.qpn, send, |_| true).unwrap_or(0);
            c.dropped += n as u64;
            continue;
        }
        let mut corrupt = false;
        let n = dev
            .take_completions(a.q.qpn, send, |wc| {
                match ring.ring.stage_fixed(|slot| cqe(wc).encode_into(slot)) {
                    Ok(true) => true,
                    Ok(false) => {
                        full = true;
                        false
                    }
                    Err(_) => {
                        corrupt = true;
                        false
                    }
                }
            })
            .unwrap_or(0);
        // The batch, seen by the application at once.
        ring.ring.publish();
        if corrupt {
            // The application wrote an impossible consumer index into its completion ring:
            // abandoned, as a corrupt work queue is (the QP is untouched: its completions are
            // dropped from now on; other processes notice nothing).
            ring.broken = true;
            ring.fault.store(true, std::sync::atomic::Ordering::Release);
            c.broken_rings += 1;
            full = true;
        }
        if n > 0 {
            c.completions += n as u64;
            notify_one(ring);
        }
    }
    full
}

/// Tells the application of new completions on ring `cq` if it armed the ring and gave a
/// channel: one write of its eventfd. This is the one system call of the lcore's path, made
/// only for an application that asked to sleep until its next completion (as a NIC raises an
/// interrupt only for an armed CQ); a polling application never arms.
#[cold]
fn notify_armed(c: &AppCq) {
    if let Some(fd) = &c.event {
        // An eventfd write adds to its counter; it would block only past 2^64 - 2 events.
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a local array to a descriptor we own.
        let _ = unsafe { libc::write(std::os::fd::AsRawFd::as_raw_fd(fd), one.as_ptr().cast(), 8) };
    }
}

fn notify(cqs: &[Option<AppCq>], cq: u32) {
    if let Some(Some(c)) = cqs.get(cq as usize) {
        notify_one(c);
    }
}

#[inline]
fn notify_one(c: &AppCq) {
    if c.event.is_some() && c.ring.take_arm() {
        notify_armed(c);
    }
}

/// Makes `wr` the transport's work request for a ring entry (its UD destination, if any, is
/// the caller's to fill). In place: a fresh request would zero its whole SG list each post.
fn send_wr(w: &SendView<'_>, wr: &mut SendWr) {
    let (remote_addr, rkey) = (w.remote_addr(), w.rkey());
    wr.op = match w.opcode() {
        WrOpcode::Write => SendOp::Write { remote_addr, rkey },
        WrOpcode::WriteWithImm => SendOp::WriteWithImm {
            remote_addr,
            rkey,
            imm: w.imm(),
        },
        WrOpcode::Send => SendOp::Send,
        WrOpcode::SendWithImm => SendOp::SendWithImm(w.imm()),
        WrOpcode::SendWithInv => SendOp::SendWithInv(w.imm()),
        WrOpcode::Read => SendOp::Read { remote_addr, rkey },
        WrOpcode::CmpSwap => SendOp::CmpSwap {
            remote_addr,
            rkey,
            compare: w.compare_add(),
            swap: w.swap(),
        },
        WrOpcode::FetchAdd => SendOp::FetchAdd {
            remote_addr,
            rkey,
            add: w.compare_add(),
        },
    };
    let flags = w.flags();
    wr.wr_id = w.wr_id();
    wr.signaled = flags & send_flags::SIGNALED != 0;
    wr.solicited = flags & send_flags::SOLICITED != 0;
    wr.fence = flags & send_flags::FENCE != 0;
    wr.inline = flags & send_flags::INLINE != 0;
    wr.ud = None;
    wr.sg.set_from(w.sge_bytes(), |b| {
        let s = abi::Sge::from_bytes(b);
        Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        }
    });
}

fn recv_wr(w: &RecvWqe) -> RecvWr {
    RecvWr {
        wr_id: w.wr_id,
        sg: sg_list(&w.sg),
    }
}

fn sg_list(sg: &[abi::Sge]) -> SgList {
    sg.iter()
        .map(|s| Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        })
        .collect()
}

/// The completion status of a refused post.
fn status_of(e: &DeviceError) -> WcStatus {
    match e {
        DeviceError::Post(PostError::Wr(WrError::BadInlineSge)) => WcStatus::LocProtErr,
        DeviceError::Post(PostError::Wr(WrError::TooLong)) => WcStatus::LocLenErr,
        _ => WcStatus::LocQpOpErr,
    }
}

/// A completion as the ring carries it (libibverbs' values).
fn cqe(wc: &WorkCompletion) -> Cqe {
    // The transport's enums take libibverbs' values.
    let (status, opcode) = (wc.status as u8, wc.opcode as u8);
    let (imm, mut flags) = match (wc.imm_data, wc.invalidated_rkey) {
        (Some(i), _) => (i, 2),
        (None, Some(k)) => (k, 4),
        (None, None) => (0, 0),
    };
    // A UD receive: its buffer starts with the 40-byte GRH area (IBV_WC_GRH).
    if wc.src_qp.is_some() {
        flags |= 1;
    }
    Cqe {
        wr_id: wc.wr_id,
        byte_len: wc.byte_len,
        imm,
        qp_num: wc.qp_num,
        src_qp: wc.src_qp.unwrap_or(0),
        status,
        opcode,
        flags,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_carry_libibverbs_values() {
        // enum ibv_wc_status and enum ibv_wc_opcode, as <infiniband/verbs.h> numbers them.
        let status = [
            (WcStatus::Success, 0),
            (WcStatus::LocLenErr, 1),
            (WcStatus::LocQpOpErr, 2),
            (WcStatus::LocProtErr, 4),
            (WcStatus::WrFlushErr, 5),
            (WcStatus::BadRespErr, 7),
            (WcStatus::RemInvReqErr, 9),
            (WcStatus::RemAccessErr, 10),
            (WcStatus::RemOpErr, 11),
            (WcStatus::RetryExcErr, 12),
            (WcStatus::RnrRetryExcErr, 13),
            (WcStatus::GeneralErr, 21),
        ];
        let opcode = [
            (WcOpcode::Send, 0),
            (WcOpcode::RdmaWrite, 1),
            (WcOpcode::RdmaRead, 2),
            (WcOpcode::CompSwap, 3),
            (WcOpcode::FetchAdd, 4),
            (WcOpcode::Recv, 128),
            (WcOpcode::RecvRdmaWithImm, 129),
        ];
        for (s, v) in status {
            for (o, w) in opcode {
                let wc = WorkCompletion {
                    wr_id: 7,
                    status: s,
                    opcode: o,
                    byte_len: 3,
                    imm_data: Some(9),
                    invalidated_rkey: None,
                    qp_num: 0x11,
                    src_qp: Some(0x22),
                };
                let c = Cqe::decode(&cqe(&wc).encode());
                assert_eq!((c.status, c.opcode), (v, w), "{s:?} {o:?}");
                assert_eq!((c.wr_id, c.byte_len, c.imm, c.flags), (7, 3, 9, 2 | 1));
                assert_eq!((c.qp_num, c.src_qp), (0x11, 0x22));
            }
        }
    }
}
