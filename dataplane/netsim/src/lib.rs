//! A deterministic network simulator: nodes joined by one-way links with latency, bandwidth and
//! fault rules, driven by a seeded RNG and simulated time.
//!
//! Frames cross it as bytes, so endpoints go through the real wire emit and parse code: a
//! corrupted bit must be caught by the ICRC (or an IP checksum), and a CE mark is written into
//! the IP header as a switch would (fixing the IPv4 header checksum; the ICRC masks the field).
//! Same seed and same inputs give the same trace. Reused by the transport soak and by DCQCN.
//!
//! Switches ([`SimNet::add_switch`], [`SwitchConfig`]) are congestion points: frames routed
//! through one ([`SimNet::route`]) wait in the FIFO of the egress port toward their next hop,
//! which drains at the port's rate; all ports share the switch's buffer, and a frame that does
//! not fit is dropped (tail drop). On leaving the queue a frame is marked CE with RED's
//! probability on the bytes still queued behind it (0 up to Kmin, rising linearly to Pmax at
//! Kmax, 1 above), as switches that mark at dequeue do. Each port keeps time-weighted queue
//! statistics ([`PortStats`]).

pub mod fault;

pub use fault::{Faults, Red, SplitMix64, mark_ce};

use arrayvec::ArrayVec;
use core::time::Duration;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use wire::eth;
use wire::time::Instant;

/// A node of the simulated network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u16);

/// A one-way link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkConfig {
    /// Propagation delay.
    pub latency: Duration,
    /// Bits per second (0: infinitely fast).
    pub bandwidth_bps: u64,
    /// Faults.
    pub faults: Faults,
}

/// What a link did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames offered.
    pub sent: u64,
    /// Frames lost (random or burst).
    pub lost: u64,
    /// Frames held back to be reordered.
    pub reordered: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Frames with a flipped bit.
    pub corrupted: u64,
    /// Frames marked CE.
    pub ce_marked: u64,
    /// Frames delivered (copies included).
    pub delivered: u64,
}

#[derive(Debug)]
struct Link {
    cfg: LinkConfig,
    busy_until: Instant,
    bad: bool,
    /// Held by a PFC pause from the switch it feeds.
    paused: bool,
    stats: LinkStats,
}

/// A switch: every egress port drains at `port_bps` after `latency`; the ports share
/// `buffer_bytes`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SwitchConfig {
    /// Shared packet buffer.
    pub buffer_bytes: u64,
    /// ECN marking (None: never marks).
    pub red: Option<Red>,
    /// Egress port rate, bits per second.
    pub port_bps: u64,
    /// Propagation delay of the egress links.
    pub latency: Duration,
    /// Priority flow control: pause every link into the switch when its buffer holds more
    /// than `xoff` bytes, resume below `xon` (None: no PFC, a full buffer drops).
    pub pfc: Option<Pfc>,
}

/// PFC thresholds of a switch's shared buffer (one priority; the pause reaches the sender
/// after the link's delay, so `buffer - xoff` must cover what is in flight meanwhile).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pfc {
    /// Pause above this many bytes used.
    pub xoff: u64,
    /// Resume below this many.
    pub xon: u64,
}

/// What one egress port of a switch saw. Queue figures are time-weighted from the first
/// frame to the last change (or the time passed to [`SimNet::port_stats`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PortStats {
    /// Frames that entered the queue.
    pub enqueued: u64,
    /// Frames dropped for want of buffer.
    pub dropped: u64,
    /// Frames marked CE on leaving.
    pub marked: u64,
    /// Bytes sent.
    pub bytes_out: u64,
    /// Largest queue, bytes.
    pub max_bytes: u64,
    /// Bytes queued now.
    pub bytes: u64,
    /// Integral of the queue over time, byte-nanoseconds.
    pub integral: u128,
    /// Time at each queue depth, nanoseconds per KiB bin.
    pub hist: Vec<u64>,
    /// Since when the figures run.
    pub start: Option<Instant>,
    /// Time of the last change.
    pub since: Instant,
}

impl PortStats {
    fn account(&mut self, now: Instant) {
        self.start.get_or_insert(now);
        let dt = now.0.saturating_sub(self.since.0);
        if dt > 0 {
            self.integral += self.bytes as u128 * dt as u128;
            let bin = (self.bytes / 1024) as usize;
            if self.hist.len() <= bin {
                self.hist.resize(bin + 1, 0);
            }
            self.hist[bin] += dt;
        }
        self.since = now;
    }

    /// Time-weighted mean queue, bytes.
    pub fn mean_bytes(&self) -> f64 {
        let span = self.since.0.saturating_sub(self.start.map_or(0, |s| s.0));
        if span == 0 {
            0.0
        } else {
            self.integral as f64 / span as f64
        }
    }

    /// Time-weighted quantile of the queue (upper edge of its KiB bin), bytes.
    pub fn quantile_bytes(&self, q: f64) -> u64 {
        let total: u64 = self.hist.iter().sum();
        let want = (total as f64 * q).ceil() as u64;
        let mut acc = 0;
        for (i, t) in self.hist.iter().enumerate() {
            acc += t;
            if acc >= want && *t > 0 {
                return (i as u64 + 1) * 1024;
            }
        }
        0
    }
}

#[derive(Debug)]
struct Port {
    cfg: SwitchConfig,
    queue: VecDeque<u64>,
    busy: bool,
    stats: PortStats,
}

#[derive(Debug)]
struct Switch {
    cfg: SwitchConfig,
    used: u64,
    /// Its ingress links are paused.
    pausing: bool,
    /// PAUSE (XOFF) episodes it started.
    pauses: u64,
}

/// A frame in flight, and where on its route it is.
#[derive(Debug)]
struct Flight {
    bytes: Vec<u8>,
    from: NodeId,
    to: NodeId,
    /// Index of the switch on the route it is at or heading to.
    hop: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// The frame reaches its destination.
    Deliver(u64),
    /// The frame reaches the switch at its `hop`.
    AtSwitch(u64),
    /// An egress port (switch, next hop) finished sending a frame.
    PortFree(NodeId, NodeId),
    /// A PFC pause (true) or resume reaches the sending end of link (from, to).
    Pause(NodeId, NodeId, bool),
}

/// The network.
#[derive(Debug)]
pub struct SimNet {
    links: HashMap<(NodeId, NodeId), Link>,
    switches: HashMap<NodeId, Switch>,
    ports: HashMap<(NodeId, NodeId), Port>,
    routes: HashMap<(NodeId, NodeId), ArrayVec<NodeId, 4>>,
    queue: BinaryHeap<Reverse<(Instant, u64, Ev)>>,
    frames: HashMap<u64, Flight>,
    seq: u64,
    rng: SplitMix64,
}

impl SimNet {
    /// An empty network whose faults draw from `seed`.
    pub fn new(seed: u64) -> Self {
        SimNet {
            links: HashMap::new(),
            switches: HashMap::new(),
            ports: HashMap::new(),
            routes: HashMap::new(),
            queue: BinaryHeap::new(),
            frames: HashMap::new(),
            seq: 0,
            rng: SplitMix64::new(seed),
        }
    }

    /// Adds a one-way link.
    pub fn link(&mut self, from: NodeId, to: NodeId, cfg: LinkConfig) {
        self.links.insert(
            (from, to),
            Link {
                cfg,
                busy_until: Instant::ZERO,
                bad: false,
                paused: false,
                stats: LinkStats::default(),
            },
        );
    }

    /// Adds links both ways.
    pub fn connect(&mut self, a: NodeId, b: NodeId, cfg: LinkConfig) {
        self.link(a, b, cfg);
        self.link(b, a, cfg);
    }

    /// Makes `id` a switch.
    pub fn add_switch(&mut self, id: NodeId, cfg: SwitchConfig) {
        self.switches.insert(
            id,
            Switch {
                cfg,
                used: 0,
                pausing: false,
                pauses: 0,
            },
        );
    }

    /// Frames from `from` to `to` go over the link from `from` to `via[0]`, then through the
    /// switches in `via` in order (each forwarding on its egress port toward the next).
    pub fn route(&mut self, from: NodeId, to: NodeId, via: &[NodeId]) {
        let mut v = ArrayVec::new();
        for s in via.iter().take(4) {
            v.push(*s);
        }
        self.routes.insert((from, to), v);
    }

    /// When the first link on the way from `from` to `to` has finished sending what it was
    /// given (a NIC's transmit queue: a sender that waits for it sends at most at line rate).
    pub fn busy_until(&self, from: NodeId, to: NodeId) -> Instant {
        let first = self
            .routes
            .get(&(from, to))
            .and_then(|r| r.first().copied())
            .unwrap_or(to);
        match self.links.get(&(from, first)) {
            Some(l) if l.paused => Instant(u64::MAX),
            Some(l) => l.busy_until,
            None => Instant::ZERO,
        }
    }

    /// PFC pause episodes `switch` started.
    pub fn pauses(&self, switch: NodeId) -> u64 {
        self.switches.get(&switch).map_or(0, |s| s.pauses)
    }

    /// Sends PFC pause or resume to every link into `sw`, arriving after each link's delay.
    fn pfc(&mut self, now: Instant, sw: NodeId, pause: bool) {
        let into: Vec<(NodeId, Duration)> = self
            .links
            .iter()
            .filter(|((_, to), _)| *to == sw)
            .map(|((from, _), l)| (*from, l.cfg.latency))
            .collect();
        for (from, lat) in into {
            self.push(now + lat, Ev::Pause(from, sw, pause));
        }
    }

    /// What a link did.
    pub fn stats(&self, from: NodeId, to: NodeId) -> Option<LinkStats> {
        self.links.get(&(from, to)).map(|l| l.stats)
    }

    /// What the egress port of `switch` toward `next` did, with its queue accounted up to
    /// `now`.
    pub fn port_stats(&self, switch: NodeId, next: NodeId, now: Instant) -> Option<PortStats> {
        self.ports.get(&(switch, next)).map(|p| {
            let mut s = p.stats.clone();
            s.account(now.max(s.since));
            s
        })
    }

    /// Every switch port: ((switch, next hop), what it did so far).
    pub fn ports(&self) -> impl Iterator<Item = ((NodeId, NodeId), &PortStats)> {
        self.ports.iter().map(|(k, p)| (*k, &p.stats))
    }

    /// Bytes queued now at the egress port of `switch` toward `next`.
    pub fn queue_bytes(&self, switch: NodeId, next: NodeId) -> u64 {
        self.ports.get(&(switch, next)).map_or(0, |p| p.stats.bytes)
    }

    fn push(&mut self, at: Instant, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq, ev)));
    }

    /// Sends a frame at `now`; false if there is no link toward its first hop.
    pub fn send(&mut self, now: Instant, from: NodeId, to: NodeId, mut frame: Vec<u8>) -> bool {
        let first = self
            .routes
            .get(&(from, to))
            .and_then(|r| r.first().copied())
            .unwrap_or(to);
        let Some(l) = self.links.get_mut(&(from, first)) else {
            return false;
        };
        let f = l.cfg.faults;
        l.stats.sent += 1;
        // Serialisation at the link's rate, queued behind what it is still sending.
        let start = now.max(l.busy_until);
        let tx = tx_time(frame.len(), l.cfg.bandwidth_bps);
        l.busy_until = start + tx;
        if let Some((to_bad, to_good)) = f.burst {
            let p = if l.bad { to_good } else { to_bad };
            if self.rng.chance(p) {
                l.bad = !l.bad;
            }
        }
        if l.bad || self.rng.chance(f.loss) {
            l.stats.lost += 1;
            return true;
        }
        // Corruption past the Ethernet header: a bad FCS would drop a frame whose L2 header
        // was hit before anything looked at it; what the ICRC is for is damage the FCS does
        // not see (a switch rewriting or storing the frame).
        let l2 = eth::Frame::new_checked(&frame[..])
            .map(|f| f.header_len())
            .unwrap_or(0);
        if self.rng.chance(f.corrupt) && frame.len() > l2 {
            let bit = l2 as u64 * 8 + self.rng.below((frame.len() - l2) as u64 * 8);
            frame[(bit / 8) as usize] ^= 1 << (bit % 8);
            l.stats.corrupted += 1;
        }
        if self.rng.chance(f.ce_mark) && mark_ce(&mut frame) {
            l.stats.ce_marked += 1;
        }
        let mut at = l.busy_until + l.cfg.latency;
        if self.rng.chance(f.reorder) {
            at = at + f.reorder_delay;
            l.stats.reordered += 1;
        }
        let copies = if self.rng.chance(f.duplicate) {
            l.stats.duplicated += 1;
            2
        } else {
            1
        };
        let via_switch = first != to;
        for _ in 0..copies {
            self.seq += 1;
            let id = self.seq;
            self.frames.insert(
                id,
                Flight {
                    bytes: frame.clone(),
                    from,
                    to,
                    hop: 0,
                },
            );
            let ev = if via_switch {
                Ev::AtSwitch(id)
            } else {
                Ev::Deliver(id)
            };
            self.push(at, ev);
        }
        true
    }

    /// When the next event (a delivery, or a step inside a switch) is due.
    pub fn next_delivery(&self) -> Option<Instant> {
        self.queue.peek().map(|Reverse((t, ..))| *t)
    }

    /// Runs the network up to `now` and takes the next frame due at or before it:
    /// (from, to, bytes).
    pub fn deliver(&mut self, now: Instant) -> Option<(NodeId, NodeId, Vec<u8>)> {
        loop {
            match self.queue.peek() {
                Some(Reverse((t, ..))) if *t <= now => {}
                _ => return None,
            }
            let Reverse((t, _, ev)) = self.queue.pop()?;
            match ev {
                Ev::Deliver(id) => {
                    let Some(fl) = self.frames.remove(&id) else {
                        continue;
                    };
                    if let Some(l) = self.links.get_mut(&(fl.from, fl.to)) {
                        l.stats.delivered += 1;
                    }
                    return Some((fl.from, fl.to, fl.bytes));
                }
                Ev::AtSwitch(id) => self.at_switch(t, id),
                Ev::PortFree(sw, next) => {
                    if let Some(p) = self.ports.get_mut(&(sw, next)) {
                        p.busy = false;
                    }
                    self.dequeue(t, sw, next);
                }
                Ev::Pause(from, to, on) => {
                    if let Some(l) = self.links.get_mut(&(from, to)) {
                        l.paused = on;
                        // Frames already handed to the link wait out the pause.
                        l.busy_until = l.busy_until.max(t);
                    }
                }
            }
        }
    }

    fn at_switch(&mut self, now: Instant, id: u64) {
        let Some(fl) = self.frames.get(&id) else {
            return;
        };
        let route = self
            .routes
            .get(&(fl.from, fl.to))
            .cloned()
            .unwrap_or_default();
        let hop = fl.hop as usize;
        let (Some(&sw), len) = (route.get(hop), fl.bytes.len() as u64) else {
            return;
        };
        let next = route.get(hop + 1).copied().unwrap_or(fl.to);
        let Some(s) = self.switches.get_mut(&sw) else {
            self.frames.remove(&id);
            return;
        };
        let cfg = s.cfg;
        let port = self.ports.entry((sw, next)).or_insert_with(|| Port {
            cfg,
            queue: VecDeque::new(),
            busy: false,
            stats: PortStats::default(),
        });
        port.stats.account(now);
        if s.used + len > cfg.buffer_bytes {
            port.stats.dropped += 1;
            self.frames.remove(&id);
            return;
        }
        s.used += len;
        let pause = matches!(cfg.pfc, Some(p) if s.used > p.xoff) && !s.pausing;
        if pause {
            s.pausing = true;
            s.pauses += 1;
        }
        port.stats.enqueued += 1;
        port.stats.bytes += len;
        port.stats.max_bytes = port.stats.max_bytes.max(port.stats.bytes);
        port.queue.push_back(id);
        let busy = port.busy;
        if pause {
            self.pfc(now, sw, true);
        }
        if !busy {
            self.dequeue(now, sw, next);
        }
    }

    fn dequeue(&mut self, now: Instant, sw: NodeId, next: NodeId) {
        let Some(p) = self.ports.get_mut(&(sw, next)) else {
            return;
        };
        let Some(id) = p.queue.pop_front() else {
            return;
        };
        let Some(fl) = self.frames.get_mut(&id) else {
            return;
        };
        let len = fl.bytes.len() as u64;
        p.stats.account(now);
        p.stats.bytes -= len;
        p.stats.bytes_out += len;
        let mut resume = false;
        if let Some(s) = self.switches.get_mut(&sw) {
            s.used -= len;
            if s.pausing && matches!(s.cfg.pfc, Some(p) if s.used < p.xon) {
                s.pausing = false;
                resume = true;
            }
        }
        if let Some(red) = p.cfg.red
            && self.rng.chance(red.probability(p.stats.bytes))
            && mark_ce(&mut fl.bytes)
        {
            p.stats.marked += 1;
        }
        let tx = tx_time(len as usize, p.cfg.port_bps);
        p.busy = true;
        let arrive = now + tx + p.cfg.latency;
        fl.hop += 1;
        let ev = if next == fl.to {
            Ev::Deliver(id)
        } else {
            Ev::AtSwitch(id)
        };
        self.push(now + tx, Ev::PortFree(sw, next));
        self.push(arrive, ev);
        if resume {
            self.pfc(now, sw, false);
        }
    }

    /// Frames in flight.
    pub fn in_flight(&self) -> usize {
        self.frames.len()
    }
}

/// Time to put `len` bytes (plus preamble, FCS and inter-frame gap) on a wire of `bps`.
fn tx_time(len: usize, bps: u64) -> Duration {
    if bps == 0 {
        Duration::ZERO
    } else {
        Duration::from_nanos(((len as u128 + 24) * 8 * 1_000_000_000 / bps as u128) as u64)
    }
}

#[cfg(test)]
mod tests;
