//! The neighbour cache of one port on one lcore: IP address to MAC, with expiry, retries, and
//! frames held while an address resolves.
//!
//! States follow Linux's in spirit: an unknown address becomes INCOMPLETE (broadcast or multicast
//! solicitations, [`MAX_SOLICITS`] of them [`RETRANS`] apart), then REACHABLE for
//! [`REACHABLE_TIME`]; once that runs out the entry is still used while it is PROBEd with
//! unicast solicitations, and deleted if none is answered. Frames waiting for an INCOMPLETE entry
//! are held, [`HOLD_PER_NEIGHBOR`] at most, and dropped if resolution fails.
//!
//! The map is sized at creation and never grows, so the packet path does not allocate.

use crate::port::MacAddr;
use crate::time::Instant;
use arrayvec::ArrayVec;
use core::time::Duration;
use std::collections::HashMap;
use std::net::IpAddr;

/// Frames held per unresolved neighbour.
pub const HOLD_PER_NEIGHBOR: usize = 16;
/// Solicitations sent before giving up.
pub const MAX_SOLICITS: u8 = 3;
/// Time between solicitations.
pub const RETRANS: Duration = Duration::from_secs(1);
/// How long an answer stays good.
pub const REACHABLE_TIME: Duration = Duration::from_secs(30);

/// Where an entry stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Being resolved; no MAC yet.
    Incomplete {
        /// Solicitations sent so far.
        tries: u8,
        /// When to send the next one.
        next: Instant,
    },
    /// Known and fresh.
    Reachable {
        /// The neighbour's MAC.
        mac: MacAddr,
        /// When it goes stale.
        expires: Instant,
    },
    /// Known but stale: still used while unicast probes confirm it.
    Probe {
        /// The MAC we keep using meanwhile.
        mac: MacAddr,
        /// Probes sent so far.
        tries: u8,
        /// When to send the next one.
        next: Instant,
    },
}

#[derive(Debug)]
struct Entry<B> {
    state: State,
    held: ArrayVec<B, HOLD_PER_NEIGHBOR>,
}

/// A solicitation the cache wants sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Solicit {
    /// Address to resolve.
    pub ip: IpAddr,
    /// `Some(mac)` for a unicast probe, `None` for broadcast (ARP) or multicast (ND).
    pub unicast: Option<MacAddr>,
}

/// What [`NeighborCache::lookup_or_hold`] did with a frame.
#[derive(Debug)]
pub enum Resolve<B> {
    /// The MAC is known: send the frame to it now.
    Send(B, MacAddr),
    /// Held; if `solicit` is set, send a solicitation now.
    Held {
        /// True when this frame started resolution.
        solicit: bool,
    },
    /// The hold queue is full or the cache is full: the frame comes back to be dropped.
    Full(B),
}

/// What learning an address did.
#[derive(Debug)]
pub struct Learned<B> {
    /// True when the address became reachable or its MAC changed.
    pub changed: bool,
    /// Frames that waited for it, now to be sent.
    pub held: ArrayVec<B, HOLD_PER_NEIGHBOR>,
}

/// The cache.
#[derive(Debug)]
pub struct NeighborCache<B> {
    map: HashMap<IpAddr, Entry<B>>,
    capacity: usize,
    next_deadline: Instant,
}

impl<B> NeighborCache<B> {
    /// A cache for up to `capacity` neighbours.
    pub fn new(capacity: usize) -> Self {
        NeighborCache {
            map: HashMap::with_capacity(capacity),
            capacity,
            next_deadline: Instant(u64::MAX),
        }
    }

    /// The state of `ip`'s entry.
    pub fn state(&self, ip: IpAddr) -> Option<State> {
        self.map.get(&ip).map(|e| e.state)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Every entry's address and state.
    pub fn entries(&self) -> impl Iterator<Item = (IpAddr, State)> + '_ {
        self.map.iter().map(|(ip, e)| (*ip, e.state))
    }

    fn wake_at(&mut self, t: Instant) {
        self.next_deadline = self.next_deadline.min(t);
    }

    /// The MAC for `ip`, or holds `frame` until it is known.
    pub fn lookup_or_hold(&mut self, ip: IpAddr, frame: B, now: Instant) -> Resolve<B> {
        if let Some(e) = self.map.get_mut(&ip) {
            return match e.state {
                State::Reachable { mac, expires } => {
                    if now >= expires {
                        e.state = State::Probe {
                            mac,
                            tries: 0,
                            next: now,
                        };
                        self.wake_at(now);
                    }
                    Resolve::Send(frame, mac)
                }
                State::Probe { mac, .. } => Resolve::Send(frame, mac),
                State::Incomplete { .. } => match e.held.try_push(frame) {
                    Ok(()) => Resolve::Held { solicit: false },
                    Err(err) => Resolve::Full(err.element()),
                },
            };
        }
        if !self.make_room() {
            return Resolve::Full(frame);
        }
        let mut held = ArrayVec::new();
        held.push(frame);
        self.start(ip, now, held);
        Resolve::Held { solicit: true }
    }

    /// A new INCOMPLETE entry whose first solicitation the caller sends now.
    fn start(&mut self, ip: IpAddr, now: Instant, held: ArrayVec<B, HOLD_PER_NEIGHBOR>) {
        let state = State::Incomplete {
            tries: 1,
            next: now + RETRANS,
        };
        self.map.insert(ip, Entry { state, held });
        self.wake_at(now + RETRANS);
    }

    /// Starts resolving `ip` unless it is known or already resolving; true if a solicitation must
    /// be sent now.
    pub fn ensure(&mut self, ip: IpAddr, now: Instant) -> bool {
        if self.map.contains_key(&ip) || !self.make_room() {
            return false;
        }
        self.start(ip, now, ArrayVec::new());
        true
    }

    /// Records that `ip` is at `mac`. Unknown addresses are added only if `create` (an answer to
    /// our own question, or a request addressed to us); known ones are always refreshed.
    pub fn learn(&mut self, ip: IpAddr, mac: MacAddr, now: Instant, create: bool) -> Learned<B> {
        let expires = now + REACHABLE_TIME;
        let mut out = Learned {
            changed: false,
            held: ArrayVec::new(),
        };
        if let Some(e) = self.map.get_mut(&ip) {
            out.changed = match e.state {
                State::Reachable { mac: old, .. } | State::Probe { mac: old, .. } => old != mac,
                State::Incomplete { .. } => true,
            };
            e.state = State::Reachable { mac, expires };
            out.held = core::mem::take(&mut e.held);
        } else if create && self.make_room() {
            self.map.insert(
                ip,
                Entry {
                    state: State::Reachable { mac, expires },
                    held: ArrayVec::new(),
                },
            );
            out.changed = true;
        } else {
            return out;
        }
        self.wake_at(expires);
        out
    }

    /// Installs an entry learnt elsewhere (another lcore), without solicitations of our own.
    pub fn install(
        &mut self,
        ip: IpAddr,
        mac: MacAddr,
        now: Instant,
    ) -> ArrayVec<B, HOLD_PER_NEIGHBOR> {
        self.learn(ip, mac, now, true).held
    }

    /// True when [`Self::poll`] has something to do at `now` (cheap: one comparison).
    #[inline]
    pub fn due(&self, now: Instant) -> bool {
        now >= self.next_deadline
    }

    /// Runs due timers: pushes solicitations to send into `solicits` (as many as fit; the rest
    /// wait for the next call) and returns how many held frames were dropped because their
    /// neighbour never answered.
    pub fn poll(&mut self, now: Instant, solicits: &mut ArrayVec<Solicit, 16>) -> usize {
        if now < self.next_deadline {
            return 0;
        }
        let mut dropped = 0;
        let mut next = Instant(u64::MAX);
        self.map.retain(|ip, e| {
            if solicits.is_full() {
                next = next.min(now);
                return true;
            }
            match &mut e.state {
                State::Incomplete { tries, next: t } => {
                    if now >= *t {
                        if *tries >= MAX_SOLICITS {
                            dropped += e.held.len();
                            return false;
                        }
                        *tries += 1;
                        *t = now + RETRANS;
                        solicits.push(Solicit {
                            ip: *ip,
                            unicast: None,
                        });
                    }
                    next = next.min(*t);
                }
                State::Reachable { mac, expires } => {
                    if now >= *expires {
                        let mac = *mac;
                        e.state = State::Probe {
                            mac,
                            tries: 1,
                            next: now + RETRANS,
                        };
                        solicits.push(Solicit {
                            ip: *ip,
                            unicast: Some(mac),
                        });
                        next = next.min(now + RETRANS);
                    } else {
                        next = next.min(*expires);
                    }
                }
                State::Probe {
                    mac,
                    tries,
                    next: t,
                } => {
                    if now >= *t {
                        if *tries >= MAX_SOLICITS {
                            return false;
                        }
                        *tries += 1;
                        *t = now + RETRANS;
                        solicits.push(Solicit {
                            ip: *ip,
                            unicast: Some(*mac),
                        });
                    }
                    next = next.min(*t);
                }
            }
            true
        });
        self.next_deadline = next;
        dropped
    }

    /// Makes room for one more entry, evicting an entry that is not reachable if full.
    fn make_room(&mut self) -> bool {
        if self.map.len() < self.capacity {
            return true;
        }
        let victim = self
            .map
            .iter()
            .find(|(_, e)| !matches!(e.state, State::Reachable { .. }))
            .map(|(ip, _)| *ip);
        match victim {
            Some(ip) => {
                self.map.remove(&ip);
                true
            }
            None => false,
        }
    }

    /// The link came up: solicitations sent while it was down went nowhere, and what is at
    /// the far end may have changed (a memif peer restarted with a new MAC), so every entry
    /// starts over and solicits by broadcast at the next poll, as Linux flushes a device's
    /// neighbours when its carrier goes. Frames for them are held meanwhile.
    pub fn link_up(&mut self, now: Instant) {
        for e in self.map.values_mut() {
            e.state = State::Incomplete {
                tries: 0,
                next: now,
            };
        }
        self.wake_at(now);
    }

    /// Drops every held frame and entry (at shutdown).
    pub fn clear(&mut self) {
        self.map.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    const MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);

    fn s(n: u64) -> Instant {
        Instant(n * 1_000_000_000)
    }

    #[test]
    fn holds_until_learned_then_releases_in_order() {
        let mut c: NeighborCache<u32> = NeighborCache::new(4);
        let n = HOLD_PER_NEIGHBOR as u32;
        let first = c.lookup_or_hold(IP, 1, s(0));
        assert!(matches!(first, Resolve::Held { solicit: true }));
        for i in 2..=n {
            let r = c.lookup_or_hold(IP, i, s(0));
            assert!(matches!(r, Resolve::Held { solicit: false }));
        }
        let over = c.lookup_or_hold(IP, n + 1, s(0));
        assert!(matches!(over, Resolve::Full(x) if x == n + 1));
        let l = c.learn(IP, MAC, s(0), false);
        assert!(l.changed);
        let want: Vec<u32> = (1..=n).collect();
        assert_eq!(l.held.as_slice(), want.as_slice());
        let after = c.lookup_or_hold(IP, 99, s(1));
        assert!(matches!(after, Resolve::Send(99, MAC)));
    }

    #[test]
    fn unanswered_resolution_retries_then_drops_held() {
        let mut c: NeighborCache<u32> = NeighborCache::new(4);
        let _ = c.lookup_or_hold(IP, 1, s(0));
        let mut sol = ArrayVec::new();
        assert_eq!(c.poll(s(0), &mut sol), 0);
        assert!(sol.is_empty(), "nothing due before RETRANS");
        assert_eq!(c.poll(s(1), &mut sol), 0);
        assert_eq!(
            sol.as_slice(),
            &[Solicit {
                ip: IP,
                unicast: None
            }]
        );
        sol.clear();
        assert_eq!(c.poll(s(2), &mut sol), 0);
        assert_eq!(sol.len(), 1);
        sol.clear();
        assert_eq!(
            c.poll(s(3), &mut sol),
            1,
            "held frame dropped after MAX_SOLICITS"
        );
        assert!(c.state(IP).is_none());
    }

    #[test]
    fn reachable_expires_into_unicast_probe_then_is_deleted() {
        let mut c: NeighborCache<u32> = NeighborCache::new(4);
        assert!(
            !c.learn(IP, MAC, s(0), false).changed,
            "unknown address not created unasked"
        );
        assert!(c.learn(IP, MAC, s(0), true).changed);
        let mut sol = ArrayVec::new();
        let t = s(0) + REACHABLE_TIME;
        c.poll(t, &mut sol);
        assert_eq!(
            sol.as_slice(),
            &[Solicit {
                ip: IP,
                unicast: Some(MAC)
            }]
        );
        // Still used while probing.
        assert!(matches!(c.lookup_or_hold(IP, 1, t), Resolve::Send(1, MAC)));
        for i in 1..=3 {
            sol.clear();
            c.poll(t + RETRANS * i, &mut sol);
        }
        assert!(c.state(IP).is_none(), "unanswered probes delete the entry");
    }

    #[test]
    fn link_up_restarts_resolution_at_once() {
        let mut c: NeighborCache<u32> = NeighborCache::new(4);
        let _ = c.lookup_or_hold(IP, 1, s(0));
        let mut sol = ArrayVec::new();
        c.poll(s(0), &mut sol);
        assert!(sol.is_empty());
        c.link_up(s(0));
        c.poll(s(0), &mut sol);
        assert_eq!(
            sol.as_slice(),
            &[Solicit {
                ip: IP,
                unicast: None
            }]
        );
        // And it gets its full count of tries again.
        for t in 1..MAX_SOLICITS as u64 {
            sol.clear();
            assert_eq!(c.poll(s(t), &mut sol), 0);
            assert_eq!(sol.len(), 1);
        }
        sol.clear();
        assert_eq!(c.poll(s(MAX_SOLICITS as u64), &mut sol), 1);
    }

    #[test]
    fn link_up_resolves_known_neighbours_again_by_broadcast() {
        let mut c: NeighborCache<u32> = NeighborCache::new(4);
        c.learn(IP, MAC, s(0), true);
        let mut sol = ArrayVec::new();
        c.link_up(s(1));
        c.poll(s(1), &mut sol);
        assert_eq!(
            sol.as_slice(),
            &[Solicit {
                ip: IP,
                unicast: None
            }]
        );
        // Frames wait for the answer, which may carry a new MAC.
        assert!(matches!(
            c.lookup_or_hold(IP, 7, s(1)),
            Resolve::Held { solicit: false }
        ));
        let new = MacAddr([2, 0, 0, 0, 0, 9]);
        let l = c.learn(IP, new, s(1), false);
        assert!(l.changed);
        assert_eq!(l.held.as_slice(), &[7]);
        assert!(matches!(c.lookup_or_hold(IP, 8, s(1)), Resolve::Send(8, m) if m == new));
    }

    #[test]
    fn full_cache_evicts_only_unresolved_entries() {
        let mut c: NeighborCache<u32> = NeighborCache::new(2);
        let a = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3));
        let b = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 4));
        c.learn(IP, MAC, s(0), true);
        c.learn(a, MAC, s(0), true);
        assert!(!c.ensure(b, s(0)), "no room: both reachable");
        let mut c: NeighborCache<u32> = NeighborCache::new(2);
        c.learn(IP, MAC, s(0), true);
        assert!(c.ensure(a, s(0)));
        assert!(c.ensure(b, s(0)), "evicts the incomplete one");
        assert!(c.state(IP).is_some());
    }
}
