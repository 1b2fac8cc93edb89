//! An lcore's QP slots, kept in pages of [`PAGE`] so that adding slots never moves the ones
//! that exist: a plain vector of slots (several KB each) doubling past half a million QPs
//! copied gigabytes and held the lcore for seconds, longer than the control plane waits for
//! it. A slot's index still names it (QPN bits below the shard), and the packet path pays one
//! more load to reach it.

use super::Slot;

const PAGE_SHIFT: usize = 8;
/// Slots per page.
const PAGE: usize = 1 << PAGE_SHIFT;

/// Slots `0..len` exist; the rest of the last page is empty slots too, never handed out, so a
/// lookup checks only that its page exists (one bounds check, as a vector's) and the array's
/// fixed length takes the check within the page away.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    pages: Vec<Box<[Option<Slot>; PAGE]>>,
    len: usize,
}

impl Slots {
    /// Slots that exist (used or free).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds an empty slot at the end (a page more when the last is full).
    pub(crate) fn push_empty(&mut self) {
        if self.len == self.pages.len() << PAGE_SHIFT {
            // Built on the heap: a page is over a megabyte, too big for the stack.
            let page: Box<[Option<Slot>]> = (0..PAGE).map(|_| None).collect();
            self.pages
                .push(page.try_into().expect("a page holds PAGE slots"));
        }
        self.len += 1;
    }

    /// Slot `i`; `Some(&None)` past `len` in the last page (an empty slot all the same).
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<&Option<Slot>> {
        Some(&self.pages.get(i >> PAGE_SHIFT)?[i & (PAGE - 1)])
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut Option<Slot>> {
        Some(&mut self.pages.get_mut(i >> PAGE_SHIFT)?[i & (PAGE - 1)])
    }

    /// Every slot in index order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Option<Slot>> {
        self.pages.iter().flat_map(|p| p.iter()).take(self.len)
    }

    /// Drops every slot.
    pub(crate) fn clear(&mut self) {
        self.pages.clear();
        self.len = 0;
    }
}

impl std::ops::Index<usize> for Slots {
    type Output = Option<Slot>;
    #[inline]
    fn index(&self, i: usize) -> &Option<Slot> {
        self.get(i).expect("slot index in range")
    }
}

impl std::ops::IndexMut<usize> for Slots {
    #[inline]
    fn index_mut(&mut self, i: usize) -> &mut Option<Slot> {
        self.get_mut(i).expect("slot index in range")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_stay_where_they_are_as_pages_are_added() {
        let mut s = Slots::default();
        assert!(s.get(0).is_none());
        s.push_empty();
        let first: *const Option<Slot> = &s[0];
        for _ in 0..3 * PAGE {
            s.push_empty();
        }
        assert_eq!(s.len(), 3 * PAGE + 1);
        assert!(std::ptr::eq(first, &s[0]), "slot 0 moved");
        assert!(s.get(3 * PAGE).is_some_and(Option::is_none));
        // Past the last page: none; within it but past len: an empty slot.
        assert!(s.get(4 * PAGE).is_none());
        assert!(s.get(4 * PAGE - 1).is_some_and(Option::is_none));
        assert_eq!(s.iter().count(), 3 * PAGE + 1);
        s.clear();
        assert!(s.is_empty() && s.get(0).is_none());
    }
}
