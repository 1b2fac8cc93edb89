//! Packet sequence numbers: 24 bits that wrap, ordered by their difference.
//!
//! Two PSNs are compared as rxe does, `((a - b) << 8) as i32`: the sign of the 24-bit
//! difference. That is an order only within half the space (2^23), which is all a QP ever has
//! in flight, so `Psn` has no `Ord`: use [`Psn::diff`], [`Psn::before`] and [`Psn::after`].

use core::fmt;

/// A 24-bit packet sequence number.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Psn(u32);

impl Psn {
    /// The mask of the 24 bits.
    pub const MASK: u32 = 0x00ff_ffff;

    /// A PSN from the low 24 bits of `v`.
    #[inline]
    pub const fn new(v: u32) -> Psn {
        Psn(v & Self::MASK)
    }

    /// Its value.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n`, wrapping in 24 bits.
    #[inline]
    pub const fn add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & Self::MASK)
    }

    /// `self - n`, wrapping in 24 bits.
    #[inline]
    pub const fn sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & Self::MASK)
    }

    /// The signed distance from `other` to `self` (positive if `self` is later).
    #[inline]
    pub const fn diff(self, other: Psn) -> i32 {
        ((self.0.wrapping_sub(other.0)) << 8) as i32 >> 8
    }

    /// True if `self` comes before `other`.
    #[inline]
    pub const fn before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }

    /// True if `self` comes after `other`.
    #[inline]
    pub const fn after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraps_at_24_bits() {
        let p = Psn::new(0xff_fffe);
        assert_eq!(p.add(3), Psn::new(1));
        assert_eq!(Psn::new(1).sub(3), Psn::new(0xff_fffe));
        assert_eq!(Psn::new(0x1ff_ffff), Psn::new(0xff_ffff));
        assert!(p.before(Psn::new(1)));
        assert!(Psn::new(1).after(p));
        assert_eq!(Psn::new(1).diff(p), 3);
        assert_eq!(p.diff(Psn::new(1)), -3);
    }

    proptest! {
        #[test]
        fn order_holds_across_wraparound(a in 0u32..(1 << 24), d in 1u32..(1 << 23)) {
            let p = Psn::new(a);
            let q = p.add(d);
            prop_assert!(p.before(q));
            prop_assert!(q.after(p));
            prop_assert_eq!(q.diff(p), d as i32);
            prop_assert_eq!(p.diff(q), -(d as i32));
            prop_assert_eq!(q.sub(d), p);
        }
    }
}
