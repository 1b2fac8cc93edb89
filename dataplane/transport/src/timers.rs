//! Deadlines for many QPs without scanning them: a binary heap of (deadline, generation, key)
//! with lazy cancellation. Setting a key's timer again or cancelling it only bumps its
//! generation; stale heap entries are skipped when they surface, and the heap is rebuilt when
//! they outnumber the live ones. One lcore holds 100k QPs with a few timers each: every
//! operation is O(log n), and `next_deadline` is what the lcore sleeps (polls) until.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::Hash;
use wire::time::Instant;

/// Timers keyed by `K` (for example (QP number, timer kind)); one deadline per key.
#[derive(Debug)]
pub struct TimerQueue<K: Copy + Eq + Hash + Ord> {
    heap: BinaryHeap<Reverse<(Instant, u64, K)>>,
    live: HashMap<K, (Instant, u64)>,
    next_gen: u64,
}

impl<K: Copy + Eq + Hash + Ord> Default for TimerQueue<K> {
    fn default() -> Self {
        Self::with_capacity(0)
    }
}

impl<K: Copy + Eq + Hash + Ord> TimerQueue<K> {
    /// Room for `n` timers before growing.
    pub fn with_capacity(n: usize) -> Self {
        TimerQueue {
            heap: BinaryHeap::with_capacity(n),
            live: HashMap::with_capacity(n),
            next_gen: 0,
        }
    }

    /// Sets (or moves) `key`'s deadline. Setting the deadline it has already changes nothing
    /// (a QP's transmit sets its timer after every burst, mostly to the same time: each of
    /// those used to leave one more stale entry in the heap).
    pub fn set(&mut self, key: K, at: Instant) {
        if self.live.get(&key).is_some_and(|(t, _)| *t == at) {
            return;
        }
        self.next_gen += 1;
        self.live.insert(key, (at, self.next_gen));
        self.heap.push(Reverse((at, self.next_gen, key)));
        self.maybe_compact();
    }

    /// Cancels `key`'s timer; true if it was set.
    pub fn cancel(&mut self, key: K) -> bool {
        let was = self.live.remove(&key).is_some();
        self.maybe_compact();
        was
    }

    /// `key`'s deadline, if set.
    pub fn deadline(&self, key: K) -> Option<Instant> {
        self.live.get(&key).map(|(t, _)| *t)
    }

    /// The earliest deadline.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        self.skip_stale();
        self.heap.peek().map(|Reverse((t, _, _))| *t)
    }

    /// Takes one key whose deadline is at or before `now`, earliest first.
    pub fn pop_expired(&mut self, now: Instant) -> Option<K> {
        self.skip_stale();
        match self.heap.peek() {
            Some(Reverse((t, _, _))) if *t <= now => {
                let Reverse((_, _, k)) = self.heap.pop()?;
                self.live.remove(&k);
                Some(k)
            }
            _ => None,
        }
    }

    /// Live timers.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// True when no timer is set.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    fn is_live(&self, e: &(Instant, u64, K)) -> bool {
        self.live.get(&e.2).is_some_and(|(_, g)| *g == e.1)
    }

    fn skip_stale(&mut self) {
        while let Some(Reverse(top)) = self.heap.peek() {
            if self.is_live(top) {
                return;
            }
            self.heap.pop();
        }
    }

    fn maybe_compact(&mut self) {
        if self.heap.len() > 64 && self.heap.len() > 2 * self.live.len() {
            let live = &self.live;
            self.heap
                .retain(|Reverse(e)| live.get(&e.2).is_some_and(|(_, g)| *g == e.1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expire_in_order_with_moves_and_cancels() {
        let mut q = TimerQueue::default();
        q.set(1u32, Instant(30));
        q.set(2, Instant(10));
        q.set(3, Instant(20));
        q.set(2, Instant(40)); // moved later
        assert!(q.cancel(3));
        assert!(!q.cancel(3));
        assert_eq!(q.next_deadline(), Some(Instant(30)));
        assert_eq!(q.pop_expired(Instant(29)), None);
        assert_eq!(q.pop_expired(Instant(100)), Some(1));
        assert_eq!(q.pop_expired(Instant(100)), Some(2));
        assert_eq!(q.pop_expired(Instant(100)), None);
        assert!(q.is_empty());
    }

    #[test]
    fn setting_the_same_deadline_again_adds_nothing() {
        let mut q = TimerQueue::default();
        for _ in 0..1000 {
            q.set(7u32, Instant(50));
        }
        assert_eq!((q.len(), q.heap.len()), (1, 1));
        assert_eq!(q.pop_expired(Instant(50)), Some(7));
        assert!(q.is_empty());
    }

    #[test]
    fn many_rearms_stay_bounded() {
        let mut q = TimerQueue::with_capacity(16);
        for round in 0..10_000u64 {
            for k in 0..10u32 {
                q.set(k, Instant(round * 10 + k as u64));
            }
        }
        assert_eq!(q.len(), 10);
        assert!(
            q.heap.len() <= 200,
            "stale entries compacted: {}",
            q.heap.len()
        );
        let mut order = Vec::new();
        while let Some(k) = q.pop_expired(Instant(u64::MAX)) {
            order.push(k);
        }
        assert_eq!(order, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn hundred_thousand_qps_pop_in_deadline_order() {
        let mut q = TimerQueue::with_capacity(100_000);
        // A scrambled order of deadlines.
        for i in 0..100_000u64 {
            q.set(i as u32, Instant((i * 7919) % 100_003));
        }
        let mut last = Instant(0);
        let mut n = 0;
        while let Some(t) = q.next_deadline() {
            let k = q.pop_expired(t).unwrap();
            assert!(t >= last);
            assert_eq!(Instant((k as u64 * 7919) % 100_003), t);
            last = t;
            n += 1;
        }
        assert_eq!(n, 100_000);
    }
}
