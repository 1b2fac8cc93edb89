//! The impairment stage: a [`PortQueue`] wrapper that does to real traffic what the simulator
//! does to simulated traffic, per direction and changeable at run time. Users testing RoCE
//! fabrics need loss, reordering and congestion on demand, and this machine's kernel has no
//! netem or RED.
//!
//! Each direction applies, in order: random and Gilbert-Elliott burst loss, bit corruption past
//! the Ethernet header, duplication, reordering (a frame held back `reorder_delay` while later
//! ones pass), and a congestion point: a FIFO drained at `rate_bps` whose frames are marked CE
//! with RED's probability on the bytes queued behind them as they leave, tail-dropped when
//! the buffer is full. Everything is counted ([`ImpairStats`]). Off by default: with nothing
//! configured and nothing held, bursts pass straight through.
//!
//! Time comes from the lcore's clock. Held and queued frames are released on every rx and tx
//! call, so a port that only receives still drains its transmit stage. The queues are sized at
//! creation and never grow; when one is full, reordering degrades to passing frames through
//! and the congestion point drops.

use super::{BURST_SIZE, Burst, PortInfo, PortQueue};
use crate::PacketBuf;
use crate::counters::Counter;
use crate::lcore::Clock;
use crate::sim::{Red, SplitMix64, mark_ce};
use crate::time::Instant;
use crate::wire::eth;
use core::time::Duration;
use crossbeam_channel::{Receiver, Sender};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Frames the reorder and congestion queues hold at most, per direction.
pub const QUEUE_FRAMES: usize = 8192;

/// A congestion point: a queue drained at a set rate, RED marking, tail drop.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CongestionPoint {
    /// Drain rate, bits per second (wire bytes: frame + 24).
    pub rate_bps: u64,
    /// Queue limit, bytes; a frame that does not fit is dropped.
    pub buffer_bytes: u64,
    /// CE marking (ECN-capable frames only); None: never marks.
    pub red: Option<Red>,
}

/// What one direction does to frames. All zero / None is off.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Impairments {
    /// Independent loss probability.
    pub loss: f64,
    /// Burst loss: (P(good -> bad), P(bad -> good)) per frame; every frame is lost while bad.
    pub burst: Option<(f64, f64)>,
    /// Probability of flipping one bit past the Ethernet header.
    pub corrupt: f64,
    /// Probability of sending a frame twice.
    pub duplicate: f64,
    /// Probability of holding a frame back by `reorder_delay`.
    pub reorder: f64,
    /// How long a reordered frame is held.
    pub reorder_delay: Duration,
    /// The congestion point, if any.
    pub congestion: Option<CongestionPoint>,
}

impl Impairments {
    fn is_off(&self) -> bool {
        self.loss == 0.0
            && self.burst.is_none()
            && self.corrupt == 0.0
            && self.duplicate == 0.0
            && self.reorder == 0.0
            && self.congestion.is_none()
    }

    /// Checks probabilities and the congestion point; the error names the field.
    pub fn validate(&self) -> Result<(), &'static str> {
        let p = |x: f64| (0.0..=1.0).contains(&x);
        let fields = [
            (p(self.loss), "loss"),
            (self.burst.is_none_or(|(a, b)| p(a) && p(b)), "burst"),
            (p(self.corrupt), "corrupt"),
            (p(self.duplicate), "duplicate"),
            (p(self.reorder), "reorder"),
            (
                self.congestion.is_none_or(|c| {
                    c.rate_bps > 0
                        && c.red
                            .is_none_or(|r| r.kmin <= r.kmax && (0.0..=1.0).contains(&r.pmax))
                }),
                "congestion",
            ),
        ];
        match fields.iter().find(|(ok, _)| !ok) {
            Some((_, name)) => Err(name),
            None => Ok(()),
        }
    }
}

/// Which way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Frames the port receives.
    Rx,
    /// Frames the port transmits.
    Tx,
}

/// What one direction did (single writer: the lcore that owns the queue).
#[derive(Debug, Default)]
pub struct DirectionStats {
    /// Frames lost (random or burst).
    pub lost: Counter,
    /// Frames with a flipped bit.
    pub corrupted: Counter,
    /// Extra copies sent.
    pub duplicated: Counter,
    /// Frames held back.
    pub reordered: Counter,
    /// Frames marked CE by the congestion point.
    pub ce_marked: Counter,
    /// Frames the congestion point dropped (buffer full).
    pub cp_dropped: Counter,
    /// Bytes in the congestion point's queue now.
    pub cp_queue_bytes: Counter,
    /// Most bytes it has held.
    pub cp_max_bytes: Counter,
    /// Multi-segment frames that could not be made contiguous for the stages (no room in
    /// their first segment), dropped.
    pub dropped_unlinearizable: Counter,
}

/// Both directions' counters.
#[derive(Debug, Default)]
pub struct ImpairStats {
    /// Receive direction.
    pub rx: DirectionStats,
    /// Transmit direction.
    pub tx: DirectionStats,
}

/// The control side of an impaired queue: change its settings at run time, read its counters.
#[derive(Debug, Clone)]
pub struct ImpairHandle {
    updates: Sender<(Direction, Impairments)>,
    /// Settings sent so far: the queue looks at its channel only when this moved.
    sent: Arc<AtomicU64>,
    /// Its counters.
    pub stats: Arc<ImpairStats>,
}

impl ImpairHandle {
    /// Replaces one direction's impairments (taken at the queue's next rx or tx call).
    pub fn set(&self, dir: Direction, imp: Impairments) -> Result<(), &'static str> {
        imp.validate()?;
        self.updates
            .send((dir, imp))
            .map_err(|_| "the queue is gone")?;
        self.sent.fetch_add(1, Ordering::Release);
        Ok(())
    }
}

struct Stage<B> {
    cfg: Impairments,
    /// `cfg.is_off()`, kept so the pass-through check is one load.
    off: bool,
    bad: bool,
    /// Frames held back for reordering, with their release time.
    held: VecDeque<(Instant, B)>,
    /// The congestion point's queue.
    cp: VecDeque<B>,
    cp_bytes: u64,
    /// When the congestion point's line is free.
    busy_until: Instant,
    /// Frames that have passed every impairment and wait to go on.
    out: VecDeque<B>,
}

impl<B: PacketBuf> Stage<B> {
    fn new() -> Self {
        Stage {
            cfg: Impairments::default(),
            off: true,
            bad: false,
            held: VecDeque::with_capacity(QUEUE_FRAMES),
            cp: VecDeque::with_capacity(QUEUE_FRAMES),
            cp_bytes: 0,
            busy_until: Instant::ZERO,
            out: VecDeque::with_capacity(QUEUE_FRAMES),
        }
    }

    #[inline]
    fn idle(&self) -> bool {
        self.off && self.held.is_empty() && self.cp.is_empty() && self.out.is_empty()
    }

    fn set(&mut self, cfg: Impairments) {
        self.cfg = cfg;
        self.off = cfg.is_off();
    }

    /// Runs one frame through loss, corruption, duplication and reordering.
    fn admit(
        &mut self,
        mut b: B,
        now: Instant,
        rng: &mut SplitMix64,
        st: &DirectionStats,
        alloc: &mut dyn FnMut() -> Option<B>,
    ) {
        let c = self.cfg;
        if let Some((to_bad, to_good)) = c.burst
            && rng.chance(if self.bad { to_good } else { to_bad })
        {
            self.bad = !self.bad;
        }
        if self.bad || rng.chance(c.loss) {
            st.lost.inc();
            return;
        }
        if rng.chance(c.corrupt) {
            let l2 = eth::Frame::new_checked(b.data())
                .map(|f| f.header_len())
                .unwrap_or(0);
            let len = b.len();
            if len > l2 {
                let bit = l2 as u64 * 8 + rng.below((len - l2) as u64 * 8);
                b.data_mut()[(bit / 8) as usize] ^= 1 << (bit % 8);
                st.corrupted.inc();
            }
        }
        if rng.chance(c.duplicate)
            && let Some(mut copy) = alloc()
            && let Some(d) = copy.append(b.len())
        {
            d.copy_from_slice(b.data());
            st.duplicated.inc();
            self.enqueue(copy, now, st);
        }
        if rng.chance(c.reorder) && self.held.len() < QUEUE_FRAMES {
            st.reordered.inc();
            self.held.push_back((now + c.reorder_delay, b));
            return;
        }
        self.enqueue(b, now, st);
    }

    /// Into the congestion point's queue (or straight on without one).
    fn enqueue(&mut self, b: B, now: Instant, st: &DirectionStats) {
        match self.cfg.congestion {
            Some(cp) => {
                let len = b.len() as u64;
                if self.cp_bytes + len > cp.buffer_bytes || self.cp.len() >= QUEUE_FRAMES {
                    st.cp_dropped.inc();
                    return;
                }
                if self.cp.is_empty() {
                    // An idle line starts sending when the frame arrives.
                    self.busy_until = self.busy_until.max(now);
                }
                self.cp_bytes += len;
                st.cp_queue_bytes.set(self.cp_bytes);
                if self.cp_bytes > st.cp_max_bytes.get() {
                    st.cp_max_bytes.set(self.cp_bytes);
                }
                self.cp.push_back(b);
            }
            None => self.out.push_back(b),
        }
    }

    /// Releases held frames that are due and drains the congestion point up to `now`.
    fn tick(&mut self, now: Instant, rng: &mut SplitMix64, st: &DirectionStats) {
        while self.held.front().is_some_and(|(t, _)| *t <= now) {
            let (_, b) = self.held.pop_front().expect("front exists");
            self.enqueue(b, now, st);
        }
        // Without a congestion point (it may have been turned off), what is queued goes on.
        let Some(cp) = self.cfg.congestion else {
            while let Some(b) = self.cp.pop_front() {
                self.out.push_back(b);
            }
            self.cp_bytes = 0;
            st.cp_queue_bytes.set(0);
            return;
        };
        while !self.cp.is_empty() && self.busy_until <= now && self.out.len() < QUEUE_FRAMES {
            let mut b = self.cp.pop_front().expect("not empty");
            self.cp_bytes -= b.len() as u64;
            if let Some(red) = cp.red
                && rng.chance(red.probability(self.cp_bytes))
                && mark_ce(b.data_mut())
            {
                st.ce_marked.inc();
            }
            let ns = (b.len() as u128 + 24) * 8 * 1_000_000_000 / cp.rate_bps as u128;
            // Back to back while the queue is backlogged, however late we look.
            self.busy_until = self.busy_until + Duration::from_nanos(ns as u64);
            self.out.push_back(b);
        }
        st.cp_queue_bytes.set(self.cp_bytes);
    }
}

/// A port queue with an impairment stage on each direction.
pub struct Impaired<Q: PortQueue, K: Clock> {
    inner: Q,
    clock: K,
    rng: SplitMix64,
    rx: Stage<Q::Buf>,
    tx: Stage<Q::Buf>,
    updates: Receiver<(Direction, Impairments)>,
    /// The handle's count of settings sent, and how many this queue took.
    sent: Arc<AtomicU64>,
    taken: u64,
    stats: Arc<ImpairStats>,
    scratch: Burst<Q::Buf>,
}

impl<Q: PortQueue, K: Clock> core::fmt::Debug for Impaired<Q, K> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Impaired")
            .field("rx", &self.rx.cfg)
            .field("tx", &self.tx.cfg)
            .finish()
    }
}

impl<Q: PortQueue, K: Clock> Impaired<Q, K> {
    /// Wraps `inner`; impairments start off. `seed` seeds the fault draws.
    pub fn new(inner: Q, clock: K, seed: u64) -> (Self, ImpairHandle) {
        let (tx, rx) = crossbeam_channel::unbounded();
        let stats = Arc::new(ImpairStats::default());
        let sent = Arc::new(AtomicU64::new(0));
        (
            Impaired {
                inner,
                clock,
                rng: SplitMix64::new(seed),
                rx: Stage::new(),
                tx: Stage::new(),
                updates: rx,
                sent: sent.clone(),
                taken: 0,
                stats: stats.clone(),
                scratch: Burst::new(),
            },
            ImpairHandle {
                updates: tx,
                sent,
                stats,
            },
        )
    }

    /// Takes new settings, if the handle sent any: one relaxed-cost load per call otherwise (a
    /// channel poll on every rx and tx call showed as 15 % of a busy lcore).
    #[inline]
    fn take_updates(&mut self) {
        let sent = self.sent.load(Ordering::Acquire);
        if sent == self.taken {
            return;
        }
        self.taken = sent;
        while let Ok((dir, imp)) = self.updates.try_recv() {
            match dir {
                Direction::Rx => self.rx.set(imp),
                Direction::Tx => self.tx.set(imp),
            }
        }
    }

    /// Moves what the transmit stage has released onto the wire.
    fn push_tx(&mut self, now: Instant) {
        self.tx.tick(now, &mut self.rng, &self.stats.tx);
        while !self.tx.out.is_empty() {
            while self.scratch.len() < BURST_SIZE
                && let Some(b) = self.tx.out.pop_front()
            {
                self.scratch.push(b);
            }
            self.inner.tx_burst(&mut self.scratch);
            if !self.scratch.is_empty() {
                // The ring is full: keep the rest, in order, for the next call.
                while let Some(b) = self.scratch.pop() {
                    self.tx.out.push_front(b);
                }
                return;
            }
        }
    }
}

impl<Q: PortQueue, K: Clock> PortQueue for Impaired<Q, K> {
    type Buf = Q::Buf;

    fn rx_burst(&mut self, burst: &mut Burst<Q::Buf>) -> usize {
        self.take_updates();
        if self.rx.idle() && self.tx.idle() {
            return self.inner.rx_burst(burst);
        }
        let now = self.clock.now();
        if !self.tx.idle() {
            self.push_tx(now);
        }
        if self.rx.idle() {
            return self.inner.rx_burst(burst);
        }
        self.inner.rx_burst(&mut self.scratch);
        for b in self.scratch.drain(..) {
            let inner = &mut self.inner;
            self.rx
                .admit(b, now, &mut self.rng, &self.stats.rx, &mut || inner.alloc());
        }
        self.rx.tick(now, &mut self.rng, &self.stats.rx);
        let before = burst.len();
        while !burst.is_full()
            && let Some(b) = self.rx.out.pop_front()
        {
            burst.push(b);
        }
        burst.len() - before
    }

    fn tx_burst(&mut self, burst: &mut Burst<Q::Buf>) -> usize {
        self.take_updates();
        if self.tx.idle() {
            return self.inner.tx_burst(burst);
        }
        let now = self.clock.now();
        let n = burst.len();
        for mut b in burst.drain(..) {
            // The stages see one contiguous frame: a frame built with its payload attached
            // is copied together first (only while impairment is on).
            if !b.linearize() {
                self.stats.tx.dropped_unlinearizable.inc();
                continue;
            }
            let inner = &mut self.inner;
            self.tx
                .admit(b, now, &mut self.rng, &self.stats.tx, &mut || inner.alloc());
        }
        self.push_tx(now);
        n
    }

    fn alloc(&mut self) -> Option<Q::Buf> {
        self.inner.alloc()
    }

    fn info(&self) -> &PortInfo {
        self.inner.info()
    }
}

#[cfg(test)]
mod tests;
