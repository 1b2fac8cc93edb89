//! Time as the data plane sees it: nanoseconds since an arbitrary origin, passed in by the caller.
//!
//! The lcore loop converts the TSC; tests and the simulator make up their own. Nothing that takes
//! an `Instant` ever reads a clock, which keeps protocol code deterministic and testable.

use core::ops::{Add, Sub};
use core::time::Duration;

/// A point in time, in nanoseconds from an origin chosen by whoever drives the code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(pub u64);

impl Instant {
    /// The origin.
    pub const ZERO: Instant = Instant(0);

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(d.as_nanos() as u64))
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_since(rhs)
    }
}

/// Converts a cycle counter (the TSC) into [`Instant`]s without division on the hot path.
#[derive(Clone, Copy, Debug)]
pub struct TscClock {
    origin: u64,
    /// Nanoseconds per cycle as a 32.32 fixed-point number.
    ns_per_cycle_fp: u64,
}

impl TscClock {
    /// A clock for a counter running at `hz`, with `origin` as time zero.
    pub fn new(hz: u64, origin: u64) -> Self {
        assert!(hz > 0, "TSC frequency must be known");
        let ns_per_cycle_fp = ((1_000_000_000u128 << 32) / hz as u128) as u64;
        TscClock {
            origin,
            ns_per_cycle_fp,
        }
    }

    /// The instant at counter value `cycles`.
    #[inline]
    pub fn instant(&self, cycles: u64) -> Instant {
        let d = cycles.wrapping_sub(self.origin) as u128;
        Instant(((d * self.ns_per_cycle_fp as u128) >> 32) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tsc_conversion_is_exact_enough() {
        let c = TscClock::new(2_500_000_000, 1000);
        assert_eq!(c.instant(1000), Instant(0));
        // One second of cycles is one second, to within a nanosecond per second.
        let one_s = c.instant(1000 + 2_500_000_000).as_nanos();
        assert!((999_999_999..=1_000_000_001).contains(&one_s), "{one_s}");
        // An hour later it is still within a microsecond.
        let hour = c.instant(1000 + 2_500_000_000 * 3600).as_nanos();
        assert!(hour.abs_diff(3_600_000_000_000) < 1_000, "{hour}");
    }

    #[test]
    fn instant_arithmetic_saturates() {
        let a = Instant(10);
        assert_eq!(a - Instant(20), Duration::ZERO);
        assert_eq!(a + Duration::from_nanos(5), Instant(15));
    }
}
