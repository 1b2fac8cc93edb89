//! The fault models, one place for the simulator's links and switches and for the data plane's
//! impairment stage (`dataplane::port::impair`): what can go wrong on a link ([`Faults`]), RED
//! marking on queue depth ([`Red`]), CE marking in place ([`mark_ce`]), and the seeded generator
//! that draws them ([`SplitMix64`]: Steele, Lea and Flood; the seeding generator of xoshiro):
//! tiny, fast, and fixed forever, so a seed replays the same trace whatever version of any
//! crate is in use. That stability is the point here; statistical quality is ample for fault
//! injection.

use core::time::Duration;
use wire::{eth, ipv4};

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

/// RED marking thresholds of a switch port, in bytes of queue.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Red {
    /// No marking at or below this queue.
    pub kmin: u64,
    /// Marking probability reaches `pmax` here; above it every frame is marked.
    pub kmax: u64,
    /// Marking probability at Kmax.
    pub pmax: f64,
}

impl Red {
    /// The probability of marking a frame that leaves with `q` bytes queued behind it.
    pub fn probability(&self, q: u64) -> f64 {
        if q <= self.kmin {
            0.0
        } else if q >= self.kmax {
            1.0
        } else {
            self.pmax * (q - self.kmin) as f64 / (self.kmax - self.kmin).max(1) as f64
        }
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

/// The generator.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p` (never draws for p <= 0, so a fault-free link consumes no
    /// randomness and adding a fault elsewhere does not change its trace).
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }

    /// Uniform in [0, n) (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}
