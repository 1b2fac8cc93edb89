//! Single-producer/single-consumer rings in shared memory: a QP's send and receive queues (the
//! application produces work queue entries, the lcore consumes them) and a CQ (the lcore
//! produces completion entries, the application consumes them).
//!
//! A ring is a header of two cache lines, the producer's index in the first and the consumer's
//! in the second (so that neither side's stores invalidate the line the other side writes), then
//! `slots` entries of `slot_size` bytes. Indices run freely (u32, wrapping); entry `i` lives in
//! slot `i % slots`. Each side keeps its own index in its own memory and only publishes it, and
//! reads the other side's with acquire ordering: the producer copies an entry into its slot and
//! then stores its index with release ordering, the consumer loads that index, copies the entry
//! out, then releases the slot by storing its own.
//!
//! Nothing the other side writes is trusted. An index that claims more entries than the ring
//! holds (a producer running ahead, a consumer releasing slots it was never given) is reported
//! as [`RingError::Corrupt`], with nothing read or written; an entry is copied out whole before
//! anyone looks at it, so rewriting a slot while it is read changes only that copy. No call
//! allocates, locks or makes a system call: the lcore polls rings on its packet path.

use crate::shm::SharedMem;
use core::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Bytes before the first slot: the producer's and the consumer's index, a cache line each.
pub const HEADER: usize = 128;
const PROD: usize = 0;
const CONS: usize = 64;
/// The consumer's request to be told of the next entry (a CQ armed by `ibv_req_notify_cq`),
/// beside its index: written by the consumer, taken (cleared) by the producer.
const ARM: usize = CONS + 4;

/// How a ring is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    /// Entries it holds: a power of two, 2 to 2^16.
    pub slots: u32,
    /// Bytes of each: a multiple of 8, 8 to 4096.
    pub slot_size: u32,
}

impl RingLayout {
    /// A layout, checked.
    pub fn new(slots: u32, slot_size: u32) -> Result<RingLayout, RingError> {
        if !slots.is_power_of_two() || !(2..=1 << 16).contains(&slots) {
            return Err(RingError::Layout(
                "slots must be a power of two from 2 to 65536",
            ));
        }
        if !slot_size.is_multiple_of(8) || !(8..=4096).contains(&slot_size) {
            return Err(RingError::Layout(
                "slot_size must be a multiple of 8 from 8 to 4096",
            ));
        }
        Ok(RingLayout { slots, slot_size })
    }

    /// Bytes the ring takes in shared memory, header included.
    pub fn bytes(&self) -> usize {
        HEADER + self.slots as usize * self.slot_size as usize
    }
}

/// Why a ring refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// The layout is out of range.
    #[error("ring layout: {0}")]
    Layout(&'static str),
    /// The ring does not fit its memory where it was placed (or is misaligned).
    #[error(
        "a ring of {bytes} bytes at offset {offset} does not fit {len} bytes of memory 64-aligned"
    )]
    Placement {
        /// Where it was placed.
        offset: usize,
        /// Its size.
        bytes: usize,
        /// The memory's length.
        len: usize,
    },
    /// The other side's index is impossible: the ring is broken and must be abandoned.
    #[error("ring corrupt: producer at {produced}, consumer at {consumed}, {slots} slots")]
    Corrupt {
        /// The producer's index as seen.
        produced: u32,
        /// The consumer's index as seen.
        consumed: u32,
        /// Slots in the ring.
        slots: u32,
    },
    /// An entry longer than a slot.
    #[error("an entry of {0} bytes does not fit a slot")]
    TooLong(usize),
}

/// What producer and consumer share: the memory, where the ring starts in it, its layout.
#[derive(Debug)]
struct Shared {
    mem: Arc<SharedMem>,
    base: *mut u8,
    layout: RingLayout,
}

// SAFETY: `base` points into `mem`, which the `Arc` keeps mapped; the ring's protocol (one
// producer, one consumer, indices with acquire/release) is what synchronises the bytes.
unsafe impl Send for Shared {}

impl Shared {
    fn new(mem: Arc<SharedMem>, offset: usize, layout: RingLayout) -> Result<Shared, RingError> {
        let bytes = layout.bytes();
        if !offset.is_multiple_of(64) || offset.checked_add(bytes).is_none_or(|end| end > mem.len())
        {
            return Err(RingError::Placement {
                offset,
                bytes,
                len: mem.len(),
            });
        }
        // SAFETY: `offset + bytes <= mem.len()` (checked above), so the ring lies inside the
        // mapping.
        let base = unsafe { mem.as_ptr().add(offset) };
        Ok(Shared { mem, base, layout })
    }

    fn index(&self, at: usize) -> &AtomicU32 {
        // SAFETY: `at` is PROD or CONS, inside the header, 4-aligned (the ring is 64-aligned
        // in a page-aligned mapping); an AtomicU32 has u32's layout, and both processes only
        // ever access these words atomically.
        unsafe { &*(self.base.add(at) as *const AtomicU32) }
    }

    fn slot(&self, i: u32) -> *mut u8 {
        let at = HEADER + (i & (self.layout.slots - 1)) as usize * self.layout.slot_size as usize;
        // SAFETY: the slot index is below `slots`, so the slot lies inside the ring.
        unsafe { self.base.add(at) }
    }

    fn corrupt(&self, produced: u32, consumed: u32) -> RingError {
        RingError::Corrupt {
            produced,
            consumed,
            slots: self.layout.slots,
        }
    }
}

/// The producing end of a ring.
#[derive(Debug)]
pub struct Producer {
    ring: Shared,
    /// Entries produced (published in the header).
    head: u32,
    /// The consumer's index when last read.
    tail: u32,
    /// Entries written after `head` but not yet published ([`Producer::stage`]).
    staged: u32,
}

impl Producer {
    /// The producing end of the ring at `offset` in `mem` (64-aligned), starting where the
    /// header's indices stand (both 0 in new memory).
    pub fn new(mem: Arc<SharedMem>, offset: usize, layout: RingLayout) -> Result<Self, RingError> {
        let ring = Shared::new(mem, offset, layout)?;
        let head = ring.index(PROD).load(Ordering::Relaxed);
        let tail = ring.index(CONS).load(Ordering::Acquire);
        if head.wrapping_sub(tail) > layout.slots {
            return Err(ring.corrupt(head, tail));
        }
        Ok(Producer {
            ring,
            head,
            tail,
            staged: 0,
        })
    }

    /// Its layout.
    pub fn layout(&self) -> RingLayout {
        self.ring.layout
    }

    /// Free slots (staged entries take theirs), reading the consumer's index again if the last
    /// one read left none.
    pub fn free(&mut self) -> Result<u32, RingError> {
        let slots = self.ring.layout.slots;
        if self.head.wrapping_add(self.staged).wrapping_sub(self.tail) == slots {
            let t = self.ring.index(CONS).load(Ordering::Acquire);
            // The consumer may only have moved forward, and never past what was produced.
            if t.wrapping_sub(self.tail) > slots || self.head.wrapping_sub(t) > slots {
                return Err(self.ring.corrupt(self.head, t));
            }
            self.tail = t;
        }
        Ok(slots - self.head.wrapping_add(self.staged).wrapping_sub(self.tail))
    }

    /// Copies `entry` into the next slot (the slot's remaining bytes are left as they were) and
    /// publishes it, after any staged before it; `Ok(false)` if the ring is full.
    pub fn push(&mut self, entry: &[u8]) -> Result<bool, RingError> {
        // SAFETY: `produce` hands a slot of at least `entry.len()` bytes that is ours until
        // published; the source is a local slice.
        self.produce::<true>(entry.len(), |dst| unsafe {
            core::ptr::copy_nonoverlapping(entry.as_ptr(), dst, entry.len())
        })
    }

    /// Copies `entry` into the next slot without publishing it: the consumer sees it only at
    /// the next [`Producer::publish`] (or push), and never if [`Producer::discard`] comes first.
    /// This is how a batch of work requests is posted all or nothing (`ibv_wr_start` ...
    /// `ibv_wr_complete`). `Ok(false)` if the ring is full.
    pub fn stage(&mut self, entry: &[u8]) -> Result<bool, RingError> {
        // SAFETY: as in `push`.
        self.produce::<false>(entry.len(), |dst| unsafe {
            core::ptr::copy_nonoverlapping(entry.as_ptr(), dst, entry.len())
        })
    }

    /// Publishes the staged entries.
    pub fn publish(&mut self) {
        if self.staged > 0 {
            self.head = self.head.wrapping_add(self.staged);
            self.staged = 0;
            self.ring.index(PROD).store(self.head, Ordering::Release);
        }
    }

    /// Forgets the staged entries (their slots are free again).
    pub fn discard(&mut self) {
        self.staged = 0;
    }

    /// Entries staged and not yet published.
    pub fn staged(&self) -> u32 {
        self.staged
    }

    /// [`Producer::push_array`] that stages the entry (published at the next
    /// [`Producer::publish`]): a batch of entries costs one store of the index.
    #[inline]
    pub fn stage_array<const N: usize>(&mut self, entry: &[u8; N]) -> Result<bool, RingError> {
        self.stage_fixed(|slot| *slot = *entry)
    }

    /// [`Producer::stage_array`] of an entry `fill` writes where it goes (its first `N`
    /// bytes, as the last entry there left them): no copy of a local array.
    #[inline]
    pub fn stage_fixed<const N: usize>(
        &mut self,
        fill: impl FnOnce(&mut [u8; N]),
    ) -> Result<bool, RingError> {
        // SAFETY: as in `push`, a slot of at least N bytes, the producer's until published.
        self.produce::<false>(N, |dst| fill(unsafe { &mut *dst.cast::<[u8; N]>() }))
    }

    /// Lets `fill` write the next entry in its slot (`slot_size` bytes, as the last entry
    /// there left them) and publishes it, after any staged before it, if `fill` returns true;
    /// `Ok(false)` if the ring is full or `fill` refused. An entry encoded where it goes costs
    /// no copy.
    #[inline]
    pub fn push_with(&mut self, fill: impl FnOnce(&mut [u8]) -> bool) -> Result<bool, RingError> {
        self.fill_with::<true>(fill)
    }

    /// [`Producer::push_with`] that stages the entry instead (see [`Producer::stage`]).
    #[inline]
    pub fn stage_with(&mut self, fill: impl FnOnce(&mut [u8]) -> bool) -> Result<bool, RingError> {
        self.fill_with::<false>(fill)
    }

    #[inline]
    fn fill_with<const PUBLISH: bool>(
        &mut self,
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> Result<bool, RingError> {
        if self.free()? == 0 {
            return Ok(false);
        }
        let at = self.head.wrapping_add(self.staged);
        let size = self.ring.layout.slot_size as usize;
        // SAFETY: the slot is `size` bytes inside the ring, and the producer's alone until
        // published (the consumer reads only slots below the producer's index).
        let slot = unsafe { core::slice::from_raw_parts_mut(self.ring.slot(at), size) };
        if !fill(slot) {
            return Ok(false);
        }
        if PUBLISH {
            self.head = at.wrapping_add(1);
            self.staged = 0;
            self.ring.index(PROD).store(self.head, Ordering::Release);
        } else {
            self.staged += 1;
        }
        Ok(true)
    }

    /// [`Producer::push`] of an entry whose size is known when compiling (a completion entry):
    /// the copy is a few moves, not a call.
    #[inline]
    pub fn push_array<const N: usize>(&mut self, entry: &[u8; N]) -> Result<bool, RingError> {
        // SAFETY: as in `push`, a slot of at least N bytes.
        self.produce::<true>(N, |dst| unsafe {
            dst.cast::<[u8; N]>().write_unaligned(*entry)
        })
    }

    /// An entry of `len` bytes in: checked to fit a slot, then `copy` fills the slot (at
    /// least `len` bytes, the producer's alone until published), which is published
    /// (`PUBLISH`, with what was staged before it) or staged.
    #[inline]
    fn produce<const PUBLISH: bool>(
        &mut self,
        len: usize,
        copy: impl FnOnce(*mut u8),
    ) -> Result<bool, RingError> {
        if len > self.ring.layout.slot_size as usize {
            return Err(RingError::TooLong(len));
        }
        self.fill_with::<PUBLISH>(|slot| {
            copy(slot.as_mut_ptr());
            true
        })
    }

    /// True, once, if the consumer armed the ring ([`Consumer::arm`]) since it was last
    /// taken: call it after publishing entries; true means the consumer may be asleep and
    /// must be told. (The fence pairs with the consumer's: either it sees the entries
    /// published before it armed, or this sees it armed.)
    pub fn take_arm(&self) -> bool {
        core::sync::atomic::fence(Ordering::SeqCst);
        let a = self.ring.index(ARM);
        a.load(Ordering::Relaxed) != 0 && a.swap(0, Ordering::AcqRel) != 0
    }

    /// Entries produced so far.
    pub fn produced(&self) -> u32 {
        self.head
    }

    /// The memory the ring lives in.
    pub fn memory(&self) -> &Arc<SharedMem> {
        &self.ring.mem
    }
}

/// The consuming end of a ring.
#[derive(Debug)]
pub struct Consumer {
    ring: Shared,
    /// Entries consumed (published in the header).
    tail: u32,
    /// The producer's index when last read.
    head: u32,
}

impl Consumer {
    /// The consuming end of the ring at `offset` in `mem` (64-aligned), starting where the
    /// header's indices stand (both 0 in new memory).
    pub fn new(mem: Arc<SharedMem>, offset: usize, layout: RingLayout) -> Result<Self, RingError> {
        let ring = Shared::new(mem, offset, layout)?;
        let tail = ring.index(CONS).load(Ordering::Relaxed);
        let head = ring.index(PROD).load(Ordering::Acquire);
        if head.wrapping_sub(tail) > layout.slots {
            return Err(ring.corrupt(head, tail));
        }
        Ok(Consumer { ring, tail, head })
    }

    /// Its layout.
    pub fn layout(&self) -> RingLayout {
        self.ring.layout
    }

    /// Entries ready, reading the producer's index again if the last one read left none.
    pub fn ready(&mut self) -> Result<u32, RingError> {
        if self.head == self.tail {
            let h = self.ring.index(PROD).load(Ordering::Acquire);
            if h.wrapping_sub(self.tail) > self.ring.layout.slots {
                return Err(self.ring.corrupt(h, self.tail));
            }
            self.head = h;
        }
        Ok(self.head.wrapping_sub(self.tail))
    }

    /// Copies the next entry into `out` (its first `slot_size` bytes at most) and releases its
    /// slot; `Ok(false)` if the ring is empty.
    pub fn pop(&mut self, out: &mut [u8]) -> Result<bool, RingError> {
        let n = out.len().min(self.ring.layout.slot_size as usize);
        // SAFETY: `consume` hands a published slot of `slot_size` >= n bytes; the copy goes to
        // local memory, and only the copy is ever looked at.
        self.consume(|src| unsafe { core::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), n) })
    }

    /// [`Consumer::pop`] of the first `N` bytes of the next entry, `N` known when compiling.
    #[inline]
    pub fn pop_array<const N: usize>(&mut self, out: &mut [u8; N]) -> Result<bool, RingError> {
        if N > self.ring.layout.slot_size as usize {
            return Err(RingError::TooLong(N));
        }
        // SAFETY: as in `pop`, a slot of at least N bytes (checked).
        self.consume(|src| *out = unsafe { src.cast::<[u8; N]>().read_unaligned() })
    }

    /// Copies the next entry out in two parts, reading each byte of it once: its first `H`
    /// bytes into `head`, then as many of the bytes after them as `body(head)` says (at most
    /// what the slot holds past them and what `rest` takes, rounded up to 8) into `rest`; then
    /// releases the slot. How many body bytes `body` asked for, clamped (None: the ring is
    /// empty). For entries whose header says how long they are: a 64-byte send entry with one
    /// scatter/gather entry copies 80 bytes in a few moves, not a whole slot by `memcpy`.
    #[inline]
    pub fn pop_split<const H: usize>(
        &mut self,
        head: &mut [u8; H],
        rest: &mut [u8],
        body: impl FnOnce(&[u8; H]) -> usize,
    ) -> Result<Option<usize>, RingError> {
        let size = self.ring.layout.slot_size as usize;
        if H > size || !H.is_multiple_of(8) {
            return Err(RingError::TooLong(H));
        }
        // The slot's size and H are multiples of 8, so is `cap`: whole words fit.
        let cap = (size - H).min(rest.len() & !7);
        let mut n = 0;
        // SAFETY: `consume` hands a published slot of `size` bytes: H are read into `head`,
        // then n rounded up to 8 <= cap bytes after them (cap is a multiple of 8 and n <= cap),
        // with cap <= size - H, into `rest` (cap <= its length).
        let got = self.consume(|src| unsafe {
            *head = src.cast::<[u8; H]>().read_unaligned();
            n = body(head).min(cap);
            let (from, to) = (src.add(H), rest.as_mut_ptr());
            // One or two scatter/gather entries as one fixed-size move each: LLVM turns a loop
            // of word moves back into a call of memcpy.
            match n.div_ceil(8) * 8 {
                16 => to
                    .cast::<[u8; 16]>()
                    .write_unaligned(from.cast::<[u8; 16]>().read_unaligned()),
                32 => to
                    .cast::<[u8; 32]>()
                    .write_unaligned(from.cast::<[u8; 32]>().read_unaligned()),
                w => core::ptr::copy_nonoverlapping(from, to, w),
            }
        })?;
        Ok(got.then_some(n))
    }

    /// The one way an entry comes out: if one is ready, lets `copy` read its slot (published
    /// by the producer's release store that `ready` acquired, the consumer's until `tail` is
    /// published), then releases the slot.
    #[inline]
    fn consume(&mut self, copy: impl FnOnce(*const u8)) -> Result<bool, RingError> {
        if self.ready()? == 0 {
            return Ok(false);
        }
        copy(self.ring.slot(self.tail));
        self.tail = self.tail.wrapping_add(1);
        self.ring.index(CONS).store(self.tail, Ordering::Release);
        Ok(true)
    }

    /// Asks the producer to tell the next entry it publishes (see [`Producer::take_arm`]);
    /// poll once more after this, for the entries published before it.
    pub fn arm(&self) {
        self.ring.index(ARM).store(1, Ordering::Relaxed);
        core::sync::atomic::fence(Ordering::SeqCst);
    }

    /// True while armed and not yet taken by the producer.
    pub fn armed(&self) -> bool {
        self.ring.index(ARM).load(Ordering::Acquire) != 0
    }

    /// Entries consumed so far.
    pub fn consumed(&self) -> u32 {
        self.tail
    }

    /// The memory the ring lives in.
    pub fn memory(&self) -> &Arc<SharedMem> {
        &self.ring.mem
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(slots: u32, slot_size: u32) -> (Producer, Consumer) {
        let l = RingLayout::new(slots, slot_size).unwrap();
        let mem = Arc::new(SharedMem::create("ferroce-ring-test", l.bytes()).unwrap());
        (
            Producer::new(mem.clone(), 0, l).unwrap(),
            Consumer::new(mem, 0, l).unwrap(),
        )
    }

    #[test]
    fn an_entry_split_out_reads_its_header_and_only_the_body_it_names() {
        let (mut p, mut c) = ring(4, 128);
        let mut e = [0u8; 128];
        for (i, b) in e.iter_mut().enumerate() {
            *b = i as u8;
        }
        e[0] = 24; // the header's length field: 24 body bytes
        for _ in 0..3 {
            assert!(p.push(&e).unwrap());
        }
        let (mut h, mut rest) = ([0u8; 16], [0xffu8; 200]);
        let n = c.pop_split(&mut h, &mut rest, |h| h[0] as usize).unwrap();
        assert_eq!(n, Some(24));
        assert_eq!(&h[..], &e[..16]);
        assert_eq!(&rest[..24], &e[16..40]);
        assert_eq!(rest[24], 0xff, "nothing past the words the body needs");
        // A body longer than the slot (or than `rest`) is clamped to it.
        let n = c.pop_split(&mut h, &mut rest, |_| 10_000).unwrap();
        assert_eq!(n, Some(112));
        assert_eq!(&rest[..112], &e[16..]);
        let mut short = [0u8; 20];
        let n = c.pop_split(&mut h, &mut short, |_| 10_000).unwrap();
        assert_eq!(n, Some(16));
        assert_eq!(c.pop_split(&mut h, &mut rest, |_| 0).unwrap(), None);
        assert!(matches!(
            c.pop_split(&mut [0u8; 136], &mut rest, |_| 0),
            Err(RingError::TooLong(136))
        ));
    }

    #[test]
    fn entries_come_out_in_order_and_a_full_ring_refuses_more() {
        let (mut p, mut c) = ring(4, 16);
        let mut out = [0u8; 16];
        assert!(!c.pop(&mut out).unwrap());
        for i in 0..4u8 {
            assert!(p.push(&[i; 16]).unwrap());
        }
        assert!(!p.push(&[9; 16]).unwrap(), "full");
        assert_eq!(p.free().unwrap(), 0);
        for i in 0..4u8 {
            assert!(c.pop(&mut out).unwrap());
            assert_eq!(out, [i; 16]);
        }
        assert!(!c.pop(&mut out).unwrap());
        assert_eq!(p.free().unwrap(), 4);
        assert_eq!(p.push(&[0; 17]), Err(RingError::TooLong(17)));
    }

    #[test]
    fn staged_entries_are_seen_only_when_published_and_never_when_discarded() {
        let (mut p, mut c) = ring(4, 8);
        let mut out = [0u8; 8];
        assert!(p.stage(&[1; 8]).unwrap());
        assert!(p.stage(&[2; 8]).unwrap());
        assert_eq!(p.free().unwrap(), 2, "staged entries hold their slots");
        assert!(!c.pop(&mut out).unwrap(), "nothing published yet");
        p.discard();
        assert_eq!(p.free().unwrap(), 4);
        assert!(!c.pop(&mut out).unwrap());
        assert!(p.stage(&[3; 8]).unwrap());
        assert!(p.stage(&[4; 8]).unwrap());
        assert!(p.stage(&[5; 8]).unwrap());
        assert!(p.stage(&[6; 8]).unwrap());
        assert!(!p.stage(&[7; 8]).unwrap(), "full");
        p.publish();
        for i in 3..7u8 {
            assert!(c.pop(&mut out).unwrap());
            assert_eq!(out, [i; 8]);
        }
        // A push publishes what was staged before it, in order.
        assert!(p.stage(&[8; 8]).unwrap());
        assert!(p.push(&[9; 8]).unwrap());
        assert_eq!(p.staged(), 0);
        assert!(c.pop(&mut out).unwrap());
        assert_eq!(out, [8; 8]);
        assert!(c.pop(&mut out).unwrap());
        assert_eq!(out, [9; 8]);
    }

    #[test]
    fn an_armed_ring_is_taken_once() {
        let (mut p, c) = ring(4, 8);
        assert!(!p.take_arm(), "not armed");
        c.arm();
        assert!(c.armed());
        assert!(p.push(&[1; 8]).unwrap());
        assert!(p.take_arm());
        assert!(!c.armed(), "taken");
        assert!(!p.take_arm(), "once");
    }

    #[test]
    fn fixed_size_entries_go_through_the_same_slots() {
        let (mut p, mut c) = ring(4, 32);
        assert!(p.push_array(&[7u8; 32]).unwrap());
        assert!(p.push(&[8u8; 32]).unwrap());
        let mut a = [0u8; 32];
        assert!(c.pop(&mut a).unwrap());
        assert_eq!(a, [7; 32]);
        assert!(c.pop_array(&mut a).unwrap());
        assert_eq!(a, [8; 32]);
        assert!(!c.pop_array(&mut a).unwrap());
        assert_eq!(p.push_array(&[0u8; 40]), Err(RingError::TooLong(40)));
        assert_eq!(c.pop_array(&mut [0u8; 40]), Err(RingError::TooLong(40)));
    }

    #[test]
    fn indices_wrap_past_u32() {
        let l = RingLayout::new(8, 8).unwrap();
        let mem = Arc::new(SharedMem::create("ferroce-ring-test", l.bytes()).unwrap());
        // Both indices just below the wrap, as after four billion entries.
        let start = u32::MAX - 3;
        // SAFETY: the header words of a fresh mapping no ring end holds yet.
        unsafe {
            (mem.as_ptr().add(PROD) as *mut u32).write(start);
            (mem.as_ptr().add(CONS) as *mut u32).write(start);
        }
        let mut p = Producer::new(mem.clone(), 0, l).unwrap();
        let mut c = Consumer::new(mem, 0, l).unwrap();
        let mut out = [0u8; 8];
        for i in 0..20u64 {
            assert!(p.push(&i.to_le_bytes()).unwrap());
            assert!(c.pop(&mut out).unwrap());
            assert_eq!(u64::from_le_bytes(out), i);
        }
        assert_eq!(c.consumed(), start.wrapping_add(20));
    }

    #[test]
    fn a_producer_index_past_the_ring_is_corrupt_and_nothing_is_read() {
        let (mut p, mut c) = ring(4, 8);
        p.push(&[1; 8]).unwrap();
        assert_eq!(c.ready().unwrap(), 1);
        // A hostile producer then claims 100 entries.
        c.ring.index(PROD).store(100, Ordering::Release);
        let mut out = [0u8; 8];
        assert!(
            c.pop(&mut out).unwrap(),
            "the entry already seen is still read"
        );
        assert_eq!(
            c.pop(&mut out),
            Err(RingError::Corrupt {
                produced: 100,
                consumed: 1,
                slots: 4
            })
        );
        assert_eq!(c.consumed(), 1, "nothing more consumed");
        // And a consumer index running ahead of what was produced.
        let (mut p, c) = ring(2, 8);
        p.push(&[1; 8]).unwrap();
        p.push(&[2; 8]).unwrap();
        c.ring.index(CONS).store(7, Ordering::Release);
        assert!(matches!(p.push(&[3; 8]), Err(RingError::Corrupt { .. })));
    }

    #[test]
    fn layouts_and_placements_are_checked() {
        assert!(RingLayout::new(3, 8).is_err());
        assert!(RingLayout::new(1, 8).is_err());
        assert!(RingLayout::new(4, 12).is_err());
        assert!(RingLayout::new(4, 8192).is_err());
        let l = RingLayout::new(4, 64).unwrap();
        assert_eq!(l.bytes(), 128 + 256);
        let mem = Arc::new(SharedMem::create("ferroce-ring-test", 4096).unwrap());
        assert!(matches!(
            Producer::new(mem.clone(), 8, l),
            Err(RingError::Placement { .. })
        ));
        assert!(matches!(
            Consumer::new(mem.clone(), 4096 - 64, l),
            Err(RingError::Placement { .. })
        ));
        assert!(Consumer::new(mem, 4096 - l.bytes() / 64 * 64 - 64, l).is_ok());
    }

    #[test]
    fn a_million_entries_cross_threads_in_order() {
        let (mut p, mut c) = ring(256, 64);
        const N: u64 = 1_000_000;
        let t = std::thread::spawn(move || {
            let mut i = 0u64;
            while i < N {
                let mut e = [0u8; 64];
                e[..8].copy_from_slice(&i.to_le_bytes());
                e[56..].copy_from_slice(&(!i).to_le_bytes());
                if p.push(&e).unwrap() {
                    i += 1;
                } else {
                    std::hint::spin_loop();
                }
            }
        });
        let mut next = 0u64;
        let mut out = [0u8; 64];
        while next < N {
            if c.pop(&mut out).unwrap() {
                let a = u64::from_le_bytes(out[..8].try_into().unwrap());
                let b = u64::from_le_bytes(out[56..].try_into().unwrap());
                assert_eq!((a, b), (next, !next), "entry {next} whole and in order");
                next += 1;
            } else {
                std::hint::spin_loop();
            }
        }
        t.join().unwrap();
    }

    const CHILD_FD: &str = "FERROCE_RING_TEST_FD";
    const CHILD_N: u64 = 100_000;

    /// Another process produces into a ring whose memory it received as a descriptor.
    #[test]
    fn entries_cross_processes() {
        let l = RingLayout::new(64, 16).unwrap();
        let mem = Arc::new(SharedMem::create("ferroce-ring-test", l.bytes()).unwrap());
        let mut c = Consumer::new(mem.clone(), 0, l).unwrap();
        // dup clears close-on-exec, so the child inherits this descriptor.
        let fd = rustix::io::dup(mem.fd()).unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "ring::tests::child_produces", "--ignored"])
            .env(CHILD_FD, rustix::fd::AsRawFd::as_raw_fd(&fd).to_string())
            // Its own test summary would read as this run's; a panic still shows on stderr.
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        drop(fd);
        let mut next = 0u64;
        let mut out = [0u8; 16];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while next < CHILD_N && std::time::Instant::now() < deadline {
            if c.pop(&mut out).unwrap() {
                assert_eq!(u64::from_le_bytes(out[..8].try_into().unwrap()), next);
                assert_eq!(&out[8..], b"ferroce!");
                next += 1;
            } else {
                std::thread::yield_now();
            }
        }
        assert!(child.wait().unwrap().success());
        assert_eq!(next, CHILD_N);
    }

    #[test]
    #[ignore = "the producer process of entries_cross_processes, which runs it"]
    fn child_produces() {
        let fd: i32 = std::env::var(CHILD_FD)
            .expect("run by entries_cross_processes")
            .parse()
            .unwrap();
        // SAFETY: the descriptor the parent passed down, owned by nobody else in this process.
        let fd = unsafe { <rustix::fd::OwnedFd as rustix::fd::FromRawFd>::from_raw_fd(fd) };
        let l = RingLayout::new(64, 16).unwrap();
        let mem = Arc::new(SharedMem::map(fd, l.bytes()).unwrap());
        let mut p = Producer::new(mem, 0, l).unwrap();
        let mut i = 0u64;
        while i < CHILD_N {
            let mut e = [0u8; 16];
            e[..8].copy_from_slice(&i.to_le_bytes());
            e[8..].copy_from_slice(b"ferroce!");
            if p.push(&e).unwrap() {
                i += 1;
            } else {
                std::thread::yield_now();
            }
        }
    }
}
