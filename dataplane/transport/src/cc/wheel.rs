//! A hashed timing wheel for pacing many QPs on one lcore: each QP waiting to send sits in the
//! slot of its next send time; the lcore takes the QPs whose time has come in O(1) per QP,
//! whatever the number of QPs. Idle QPs are not in the wheel and cost nothing.
//!
//! Slots are `granularity` wide and there are `slots` of them (a power of two); a deadline
//! beyond one turn of the wheel goes into the slot it hashes to and is left there until the
//! turn that reaches it (a turn is ~1 ms at the defaults, far longer than a paced QP's gap
//! except at the lowest rates). Entries are kept in intrusive doubly-linked lists in arrays
//! indexed by key (a dense QP index), so insert, cancel and expiry allocate nothing.

use wire::time::Instant;

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Entry {
    at: u64,
    next: u32,
    prev: u32,
    /// Slot the key is in, or NIL.
    slot: u32,
}

/// The wheel. Keys are dense indices below the capacity given at creation.
#[derive(Debug)]
pub struct PacingWheel {
    gran: u64,
    mask: u64,
    head: Vec<u32>,
    /// Per key, in one cache line's worth so an insert or expiry touches one line.
    e: Vec<Entry>,
    /// Start of the slot the cursor is at, in granules.
    cursor: u64,
    len: usize,
}

impl PacingWheel {
    /// A wheel for keys `0..capacity`, `slots` slots (rounded up to a power of two) of
    /// `granularity_ns`, starting at `now`.
    pub fn new(capacity: usize, slots: usize, granularity_ns: u64, now: Instant) -> Self {
        let slots = slots.next_power_of_two().max(2);
        let gran = granularity_ns.max(1);
        PacingWheel {
            gran,
            mask: slots as u64 - 1,
            head: vec![NIL; slots],
            e: vec![
                Entry {
                    at: 0,
                    next: NIL,
                    prev: NIL,
                    slot: NIL,
                };
                capacity
            ],
            cursor: now.0 / gran,
            len: 0,
        }
    }

    /// Keys in the wheel.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if no key is waiting.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The key [`PacingWheel::pop_expired`] will look at first next time (the head of the
    /// cursor's slot), for the caller to prefetch its per-QP state.
    pub fn peek(&self) -> Option<u32> {
        let h = self.head[(self.cursor & self.mask) as usize];
        (h != NIL).then_some(h)
    }

    /// The deadline of `key`, if it is in the wheel.
    pub fn deadline(&self, key: u32) -> Option<Instant> {
        let e = self.e.get(key as usize)?;
        (e.slot != NIL).then_some(Instant(e.at))
    }

    /// Puts `key` in the wheel at `at` (moving it if it is there already). A deadline before
    /// the cursor counts as due at the next [`PacingWheel::pop_expired`].
    pub fn insert(&mut self, key: u32, at: Instant) {
        self.cancel(key);
        let g = (at.0 / self.gran).max(self.cursor);
        let s = (g & self.mask) as usize;
        let h = self.head[s];
        self.e[key as usize] = Entry {
            at: at.0,
            next: h,
            prev: NIL,
            slot: s as u32,
        };
        if h != NIL {
            self.e[h as usize].prev = key;
        }
        self.head[s] = key;
        self.len += 1;
    }

    /// Takes `key` out of the wheel; false if it was not there.
    pub fn cancel(&mut self, key: u32) -> bool {
        let Entry {
            slot, next, prev, ..
        } = self.e[key as usize];
        if slot == NIL {
            return false;
        }
        if prev == NIL {
            self.head[slot as usize] = next;
        } else {
            self.e[prev as usize].next = next;
        }
        if next != NIL {
            self.e[next as usize].prev = prev;
        }
        self.e[key as usize].slot = NIL;
        self.len -= 1;
        true
    }

    /// Takes one key whose deadline is at or before `now`, advancing the cursor over empty
    /// slots; None when no key is due.
    pub fn pop_expired(&mut self, now: Instant) -> Option<u32> {
        let end = now.0 / self.gran;
        if self.len == 0 {
            // Nothing waits: jump, so a long idle spell is not walked slot by slot later.
            self.cursor = self.cursor.max(end);
            return None;
        }
        loop {
            let s = (self.cursor & self.mask) as usize;
            let mut k = self.head[s];
            while k != NIL {
                let Entry { at, next: nk, .. } = self.e[k as usize];
                if at <= now.0 {
                    self.cancel(k);
                    if nk != NIL {
                        // The next pop looks at it: start loading it now.
                        wire::hint::prefetch(&self.e[nk as usize]);
                    }
                    return Some(k);
                }
                k = nk;
            }
            if self.cursor >= end || self.len == 0 {
                return None;
            }
            self.cursor += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netsim::SplitMix64;

    #[test]
    fn keys_come_out_when_due_and_not_before() {
        let mut w = PacingWheel::new(8, 16, 100, Instant(0));
        w.insert(1, Instant(250));
        w.insert(2, Instant(120));
        w.insert(3, Instant(5_000)); // beyond one turn (1600 ns)
        assert_eq!(w.pop_expired(Instant(100)), None);
        assert_eq!(w.pop_expired(Instant(130)), Some(2));
        assert_eq!(
            w.pop_expired(Instant(240)),
            None,
            "slot reached, deadline not"
        );
        assert_eq!(w.pop_expired(Instant(250)), Some(1));
        assert_eq!(w.pop_expired(Instant(3_300)), None, "a later turn");
        assert_eq!(w.deadline(3), Some(Instant(5_000)));
        assert_eq!(w.pop_expired(Instant(5_000)), Some(3));
        assert!(w.is_empty());
    }

    #[test]
    fn cancel_and_move() {
        let mut w = PacingWheel::new(8, 16, 100, Instant(0));
        for k in 0..5 {
            w.insert(k, Instant(300));
        }
        assert!(w.cancel(2));
        assert!(!w.cancel(2));
        w.insert(4, Instant(900));
        let mut got = Vec::new();
        while let Some(k) = w.pop_expired(Instant(300)) {
            got.push(k);
        }
        got.sort();
        assert_eq!(got, [0, 1, 3]);
        assert_eq!(w.pop_expired(Instant(900)), Some(4));
        assert_eq!(w.len(), 0);
    }

    #[test]
    fn matches_a_sorted_reference_under_random_use() {
        let mut rng = SplitMix64::new(9);
        let mut w = PacingWheel::new(1000, 64, 50, Instant(0));
        let mut model: Vec<Option<u64>> = vec![None; 1000];
        let mut now = 0u64;
        for _ in 0..20_000 {
            match rng.below(3) {
                0 | 1 => {
                    let k = rng.below(1000) as u32;
                    let at = now + rng.below(10_000);
                    w.insert(k, Instant(at));
                    model[k as usize] = Some(at);
                }
                _ => {
                    now += rng.below(400);
                    while let Some(k) = w.pop_expired(Instant(now)) {
                        let at = model[k as usize].take().expect("was in the wheel");
                        assert!(at <= now);
                    }
                    // Nothing due is left behind.
                    assert!(model.iter().flatten().all(|at| *at > now));
                }
            }
        }
        assert_eq!(w.len(), model.iter().flatten().count());
    }
}
