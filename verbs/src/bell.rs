//! Doorbells: how an application tells an lcore which of its QPs have new work, so that the
//! lcore reads only those QPs' rings instead of every ring of every process on every loop.
//!
//! A doorbell region is [`BELL_BYTES`] of shared memory per (application, lcore): a summary
//! word in a cache line of its own, then [`WORDS`] words of one bit per QP ([`BELL_QPS`] QPs).
//! After publishing entries in a QP's send or receive ring, the application sets the QP's bit
//! and, if that bit was clear, the summary bit of its word ([`Bell::ring`]): two atomic ORs, no
//! system call. The lcore loads the summary once per loop (one load for an idle application),
//! and only when it is not zero swaps it and the words it names to zero and visits the QPs
//! whose bits were set ([`Bells::take`]). A QP the lcore could not finish (a full ring of work,
//! more than it takes in one visit) stays on the lcore's own list; a QP with nothing new costs
//! nothing.
//!
//! Why no wake-up is lost: a bit is set after the entries it announces are published, and the
//! lcore reads a QP's rings after taking its bit (the ORs and swaps are acquire-release). A bit
//! found already set means its setter has yet to set the summary bit, or the lcore has yet to
//! take the word: either way the lcore visits the QP after the new entries are visible.
//!
//! Nothing the application writes here is trusted: a garbage bit names one of that
//! application's own QPs or none, and a visit to a QP with no work reads two indices.

use crate::shm::SharedMem;
use core::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Words of QP bits in a region.
pub const WORDS: usize = 64;
/// QPs one region rings for (one application's QPs on one lcore).
pub const BELL_QPS: u32 = (WORDS * 64) as u32;
/// Bytes of a region: the summary's cache line, then the words.
pub const BELL_BYTES: usize = 64 + WORDS * 8;

/// A region placed in shared memory.
#[derive(Debug)]
struct Region {
    mem: Arc<SharedMem>,
    base: *const AtomicU64,
}

// SAFETY: `base` points into `mem`, which the `Arc` keeps mapped; every access is atomic.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    fn new(mem: Arc<SharedMem>, offset: usize) -> Option<Region> {
        if !offset.is_multiple_of(64) || offset.checked_add(BELL_BYTES)? > mem.len() {
            return None;
        }
        // SAFETY: the region lies inside the mapping (checked), 64-aligned in a page-aligned
        // mapping, so each of its words is an aligned u64; both processes access them only
        // atomically, and AtomicU64 has u64's layout.
        let base = unsafe { mem.as_ptr().add(offset) } as *const AtomicU64;
        Some(Region { mem, base })
    }

    fn summary(&self) -> &AtomicU64 {
        // SAFETY: word 0 of the region (see `new`).
        unsafe { &*self.base }
    }

    fn word(&self, w: usize) -> &AtomicU64 {
        debug_assert!(w < WORDS);
        // SAFETY: w < WORDS, so the word lies in the region, after the summary's line.
        unsafe { &*self.base.add(8 + (w & (WORDS - 1))) }
    }
}

/// The application's end: rings for its QPs on one lcore.
#[derive(Debug)]
pub struct Bell {
    region: Region,
}

impl Bell {
    /// The region at `offset` in `mem` (64-aligned, [`BELL_BYTES`] long); None if it does
    /// not fit.
    pub fn new(mem: Arc<SharedMem>, offset: usize) -> Option<Bell> {
        Region::new(mem, offset).map(|region| Bell { region })
    }

    /// Tells the lcore that QP `bit` (below [`BELL_QPS`]) has new entries: call it after
    /// publishing them. Safe from several threads at once.
    #[inline]
    pub fn ring(&self, bit: u32) {
        let w = (bit as usize / 64) & (WORDS - 1);
        let mask = 1u64 << (bit % 64);
        if self.region.word(w).fetch_or(mask, Ordering::AcqRel) & mask == 0 {
            self.region.summary().fetch_or(1 << w, Ordering::Release);
        }
    }

    /// The memory the region lives in.
    pub fn memory(&self) -> &Arc<SharedMem> {
        &self.region.mem
    }
}

/// The lcore's end of one application's region.
#[derive(Debug)]
pub struct Bells {
    region: Region,
}

impl Bells {
    /// The region at `offset` in `mem`; None if it does not fit.
    pub fn new(mem: Arc<SharedMem>, offset: usize) -> Option<Bells> {
        Region::new(mem, offset).map(|region| Bells { region })
    }

    /// Hands `f` each QP bit rung since the last call (each once, in no promised order):
    /// one load when none was. Allocates nothing.
    #[inline]
    pub fn take(&self, mut f: impl FnMut(u32)) {
        let s = self.region.summary();
        if s.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut words = s.swap(0, Ordering::Acquire);
        while words != 0 {
            let w = words.trailing_zeros() as usize;
            words &= words - 1;
            let mut bits = self.region.word(w).swap(0, Ordering::AcqRel);
            while bits != 0 {
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                f(w as u32 * 64 + b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Bell, Bells) {
        let mem = Arc::new(SharedMem::create("ferroce-bell-test", 2 * BELL_BYTES).unwrap());
        (
            Bell::new(mem.clone(), BELL_BYTES).unwrap(),
            Bells::new(mem, BELL_BYTES).unwrap(),
        )
    }

    fn taken(b: &Bells) -> Vec<u32> {
        let mut v = Vec::new();
        b.take(|i| v.push(i));
        v.sort();
        v
    }

    #[test]
    fn each_rung_qp_is_taken_once() {
        let (bell, bells) = pair();
        assert!(taken(&bells).is_empty());
        for b in [0, 63, 64, 1000, BELL_QPS - 1, 1000] {
            bell.ring(b);
        }
        assert_eq!(taken(&bells), vec![0, 63, 64, 1000, BELL_QPS - 1]);
        assert!(taken(&bells).is_empty());
        bell.ring(7);
        assert_eq!(taken(&bells), vec![7]);
    }

    #[test]
    fn a_region_must_fit_its_memory_aligned() {
        let mem = Arc::new(SharedMem::create("ferroce-bell-test", BELL_BYTES).unwrap());
        assert!(Bells::new(mem.clone(), 0).is_some());
        assert!(Bells::new(mem.clone(), 64).is_none());
        assert!(Bell::new(mem.clone(), 8).is_none());
        assert!(Bell::new(mem, usize::MAX - 8).is_none());
    }

    #[test]
    fn garbage_in_the_region_names_only_bits_of_it() {
        let (bell, bells) = pair();
        // The application writes every bit of its region, summary included.
        for w in 0..=WORDS {
            // SAFETY: inside the region, atomically, as the application could.
            unsafe { &*bell.region.base.add(if w == 0 { 0 } else { 7 + w }) }
                .store(u64::MAX, Ordering::Relaxed);
        }
        let t = taken(&bells);
        assert_eq!(t.len(), BELL_QPS as usize);
        assert!(t.iter().all(|&b| b < BELL_QPS));
    }

    #[test]
    fn no_ring_is_lost_between_threads() {
        let (bell, bells) = pair();
        let bell = Arc::new(bell);
        let rung = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..2)
            .map(|t| {
                let (bell, rung) = (bell.clone(), rung.clone());
                std::thread::spawn(move || {
                    for i in 0..20_000u32 {
                        // Each "entry" is counted before its QP's bit is rung.
                        rung.fetch_add(1, Ordering::Release);
                        bell.ring(t * 100 + i % 3);
                    }
                })
            })
            .collect();
        let mut seen = 0u64;
        let mut done = false;
        loop {
            let finished = threads.iter().all(|t| t.is_finished());
            let mut visited = false;
            bells.take(|_| visited = true);
            if visited {
                // Every entry counted before a bit taken is visible now.
                seen = rung.load(Ordering::Acquire);
            }
            if done {
                break;
            }
            done = finished;
        }
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(seen, 40_000, "the last entries were announced and seen");
    }
}
