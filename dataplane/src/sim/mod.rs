//! A deterministic network simulator: nodes joined by one-way links with latency, bandwidth and
//! fault rules, driven by a seeded RNG and simulated time.
//!
//! Frames cross it as bytes, so endpoints go through the real wire emit and parse code: a
//! corrupted bit must be caught by the ICRC (or an IP checksum), and a CE mark is written into
//! the IP header as a switch would (fixing the IPv4 header checksum; the ICRC masks the field).
//! Same seed and same inputs give the same trace. Reused by the transport soak and by DCQCN
//! (whose switch model, with a shared buffer and RED marking, comes with that work).

mod rng;

pub use rng::SplitMix64;

use crate::time::Instant;
use crate::wire::{eth, ipv4};
use core::time::Duration;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// A node of the simulated network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u16);

/// What can go wrong on a link, per frame.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Faults {
    /// Independent loss probability.
    pub loss: f64,
    /// Burst loss as a Gilbert-Elliott chain: (P(good -> bad), P(bad -> good)); every frame is
    /// lost while the chain is bad.
    pub burst: Option<(f64, f64)>,
    /// Probability that a frame is held back by `reorder_delay` (so later ones overtake it).
    pub reorder: f64,
    /// How long a reordered frame is held back.
    pub reorder_delay: Duration,
    /// Probability that a frame is delivered twice.
    pub duplicate: f64,
    /// Probability that one random bit of a frame is flipped.
    pub corrupt: f64,
    /// Probability that an ECN-capable frame is marked CE.
    pub ce_mark: f64,
}

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
    stats: LinkStats,
}

/// The network.
#[derive(Debug)]
pub struct SimNet {
    links: HashMap<(NodeId, NodeId), Link>,
    queue: BinaryHeap<Reverse<(Instant, u64, NodeId, NodeId)>>,
    frames: HashMap<u64, Vec<u8>>,
    seq: u64,
    rng: SplitMix64,
}

impl SimNet {
    /// An empty network whose faults draw from `seed`.
    pub fn new(seed: u64) -> Self {
        SimNet {
            links: HashMap::new(),
            queue: BinaryHeap::new(),
            frames: HashMap::new(),
            seq: 0,
            rng: SplitMix64::new(seed),
        }
    }

    /// Adds (or replaces) the one-way link `from -> to`.
    pub fn link(&mut self, from: NodeId, to: NodeId, cfg: LinkConfig) {
        self.links.insert(
            (from, to),
            Link {
                cfg,
                busy_until: Instant::ZERO,
                bad: false,
                stats: LinkStats::default(),
            },
        );
    }

    /// Adds links both ways.
    pub fn connect(&mut self, a: NodeId, b: NodeId, cfg: LinkConfig) {
        self.link(a, b, cfg);
        self.link(b, a, cfg);
    }

    /// A link's counters.
    pub fn stats(&self, from: NodeId, to: NodeId) -> Option<LinkStats> {
        self.links.get(&(from, to)).map(|l| l.stats)
    }

    /// Sends a frame at `now`; false if there is no such link.
    pub fn send(&mut self, now: Instant, from: NodeId, to: NodeId, mut frame: Vec<u8>) -> bool {
        let Some(l) = self.links.get_mut(&(from, to)) else {
            return false;
        };
        let f = l.cfg.faults;
        l.stats.sent += 1;
        // Serialisation at the link's rate, queued behind what it is still sending.
        let start = now.max(l.busy_until);
        let tx = if l.cfg.bandwidth_bps == 0 {
            Duration::ZERO
        } else {
            Duration::from_nanos(
                ((frame.len() as u128 + 24) * 8 * 1_000_000_000 / l.cfg.bandwidth_bps as u128)
                    as u64,
            )
        };
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
        for _ in 0..copies {
            self.seq += 1;
            self.frames.insert(self.seq, frame.clone());
            self.queue.push(Reverse((at, self.seq, from, to)));
        }
        true
    }

    /// When the next frame arrives.
    pub fn next_delivery(&self) -> Option<Instant> {
        self.queue.peek().map(|Reverse((t, ..))| *t)
    }

    /// Takes the next frame due at or before `now`: (from, to, bytes).
    pub fn deliver(&mut self, now: Instant) -> Option<(NodeId, NodeId, Vec<u8>)> {
        match self.queue.peek() {
            Some(Reverse((t, ..))) if *t <= now => {
                let Reverse((_, seq, from, to)) = self.queue.pop()?;
                if let Some(l) = self.links.get_mut(&(from, to)) {
                    l.stats.delivered += 1;
                }
                self.frames.remove(&seq).map(|b| (from, to, b))
            }
            _ => None,
        }
    }

    /// Frames in flight.
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }
}

/// Marks an ECN-capable IPv4 or IPv6 frame CE in place (fixing the IPv4 header checksum);
/// false if it is not ECN-capable or not IP.
pub fn mark_ce(frame: &mut [u8]) -> bool {
    let Ok(f) = eth::Frame::new_checked(&frame[..]) else {
        return false;
    };
    let (l3, ty) = (f.header_len(), f.ethertype());
    match ty {
        eth::ETHERTYPE_IPV4 if frame.len() >= l3 + ipv4::HEADER_LEN => {
            let tos = frame[l3 + 1];
            if tos & 3 == 0 || tos & 3 == 3 {
                return false;
            }
            frame[l3 + 1] = tos | 3;
            let ihl = ((frame[l3] & 0x0f) as usize * 4).max(ipv4::HEADER_LEN);
            if frame.len() < l3 + ihl {
                return false;
            }
            frame[l3 + 10..l3 + 12].fill(0);
            let c = ipv4::checksum(&frame[l3..l3 + ihl]);
            frame[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
            true
        }
        eth::ETHERTYPE_IPV6 if frame.len() >= l3 + 40 => {
            // Traffic class straddles bytes 0 and 1: ECN is bits 4-5 of byte 1.
            let ecn = (frame[l3 + 1] >> 4) & 3;
            if ecn == 0 || ecn == 3 {
                return false;
            }
            frame[l3 + 1] |= 0x30;
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests;
