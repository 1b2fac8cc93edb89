//! Region memory shared by a node's lcores: what a memory region of the appliance is backed by.
//!
//! An RNIC's registered memory is one buffer that all of its engines (and the host) reach; in
//! ferroce a region registered through the control plane is likewise reachable from every
//! lcore, since any lcore's QPs may name it. [`SharedMem`] is that buffer: one allocation,
//! reference counted, each lcore's region table holding a handle. Access goes through copies
//! ([`MrMemory`]), never through slices that outlive one copy, and RDMA atomics are real
//! atomic instructions on the word, so two lcores executing atomics on the same word see each
//! other's results, as atomics on one RNIC do.
//!
//! What it does not do is order plain copies: two lcores writing the same bytes at once (two
//! remote peers WRITEing one buffer, say) leave some mix of both, which is what verbs promises
//! for conflicting RDMA accesses as well. The copies run on raw pointers so that no two
//! `&mut [u8]` to the memory ever coexist.
//!
//! Memory comes from DPDK's hugepage heap on lcores ([`crate::dpdk::HugepageHeap`]) or from the
//! process heap in tests.

use crate::transport::mr::{AtomicOp, MrMemory};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};
use std::alloc::Layout;
use std::sync::Arc;

/// Alignment of every block (a cache line).
pub const ALIGN: usize = 64;

/// How a block was allocated, so it is freed the same way.
pub(crate) enum Origin {
    /// `std::alloc` with this layout.
    Heap(Layout),
    /// DPDK's `rte_zmalloc`.
    Dpdk,
    /// Nothing (an empty block).
    None,
}

pub(crate) struct Block {
    ptr: NonNull<u8>,
    len: usize,
    origin: Origin,
}

// SAFETY: the block is plain memory with no thread affinity; every access goes through the
// copy and atomic methods below.
unsafe impl Send for Block {}
// SAFETY: as above; shared access is by raw-pointer copies and atomics, never by references
// that another thread could invalidate.
unsafe impl Sync for Block {}

impl Drop for Block {
    fn drop(&mut self) {
        match self.origin {
            // SAFETY: allocated by `alloc_zeroed` with this layout, freed once (last Arc).
            Origin::Heap(layout) => unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) },
            // SAFETY: allocated by rte_zmalloc, freed once.
            Origin::Dpdk => unsafe { dpdk_sys::rte_free(self.ptr.as_ptr().cast()) },
            Origin::None => {}
        }
    }
}

/// Zeroed memory shared by handles; see the module documentation.
#[derive(Clone)]
pub struct SharedMem {
    block: Arc<Block>,
}

impl core::fmt::Debug for SharedMem {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SharedMem")
            .field("len", &self.block.len)
            .field("hugepage", &matches!(self.block.origin, Origin::Dpdk))
            .finish()
    }
}

/// The process heap could not give the memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot allocate {0} bytes")]
pub struct AllocError(pub usize);

impl SharedMem {
    /// `len` zeroed bytes from the process heap.
    pub fn heap(len: usize) -> Result<Self, AllocError> {
        if len == 0 {
            return Ok(Self::empty());
        }
        let layout = Layout::from_size_align(len, ALIGN).map_err(|_| AllocError(len))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or(AllocError(len))?;
        Ok(SharedMem {
            block: Arc::new(Block {
                ptr,
                len,
                origin: Origin::Heap(layout),
            }),
        })
    }

    fn empty() -> Self {
        SharedMem {
            block: Arc::new(Block {
                ptr: NonNull::dangling(),
                len: 0,
                origin: Origin::None,
            }),
        }
    }

    /// Wraps `len` zeroed bytes that `rte_zmalloc` returned.
    ///
    /// # Safety
    /// `ptr` must come from `rte_zmalloc` with at least `len` bytes and [`ALIGN`] alignment,
    /// and nothing else may free it.
    pub(crate) unsafe fn from_rte(ptr: NonNull<u8>, len: usize) -> Self {
        SharedMem {
            block: Arc::new(Block {
                ptr,
                len,
                origin: Origin::Dpdk,
            }),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.block.len
    }

    /// The memory's address in this process (unique among live blocks; what a region
    /// registered without an address of its own answers to, as `ibv_reg_mr` uses the buffer's
    /// address).
    pub fn addr(&self) -> u64 {
        self.block.ptr.as_ptr() as u64
    }

    /// True for an empty block.
    pub fn is_empty(&self) -> bool {
        self.block.len == 0
    }

    /// True if the memory is DPDK hugepage memory.
    pub fn is_hugepage(&self) -> bool {
        matches!(self.block.origin, Origin::Dpdk)
    }

    /// Handles to this memory (including this one).
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.block)
    }

    fn check(&self, off: usize, n: usize) {
        assert!(
            off.checked_add(n).is_some_and(|e| e <= self.block.len),
            "SharedMem access {off}+{n} outside {} bytes",
            self.block.len
        );
    }
}

impl MrMemory for SharedMem {
    fn len(&self) -> usize {
        self.block.len
    }

    fn read(&self, off: usize, dst: &mut [u8]) {
        self.check(off, dst.len());
        // SAFETY: in bounds (checked); `dst` is a distinct Rust buffer, so no overlap.
        unsafe {
            core::ptr::copy_nonoverlapping(
                self.block.ptr.as_ptr().add(off),
                dst.as_mut_ptr(),
                dst.len(),
            )
        }
    }

    fn write(&mut self, off: usize, src: &[u8]) {
        self.check(off, src.len());
        // SAFETY: in bounds (checked); `src` is a distinct Rust buffer, so no overlap.
        unsafe {
            core::ptr::copy_nonoverlapping(
                src.as_ptr(),
                self.block.ptr.as_ptr().add(off),
                src.len(),
            )
        }
    }

    fn atomic(&mut self, off: usize, op: AtomicOp) -> u64 {
        self.check(off, 8);
        // SAFETY: in bounds (checked).
        let p = unsafe { self.block.ptr.as_ptr().add(off) };
        if !(p as usize).is_multiple_of(8) {
            // A region registered at a virtual address of another alignment than its
            // memory: the word straddles, so no atomic instruction applies. Read-modify-write
            // it (atomic only on this lcore).
            let mut w = [0u8; 8];
            self.read(off, &mut w);
            let orig = u64::from_le_bytes(w);
            self.write(off, &op.apply(orig).to_le_bytes());
            return orig;
        }
        // SAFETY: aligned, in bounds, and only ever accessed atomically or by plain copies
        // whose races the module documentation describes.
        let a = unsafe { AtomicU64::from_ptr(p.cast::<u64>()) };
        let le = |v: u64| v.to_le();
        match op {
            AtomicOp::FetchAdd(add) => {
                // Little-endian words: on a little-endian host the add is native.
                if cfg!(target_endian = "little") {
                    a.fetch_add(add, Ordering::AcqRel)
                } else {
                    let mut cur = a.load(Ordering::Acquire);
                    loop {
                        let new = le(u64::from_le(cur).wrapping_add(add));
                        match a.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire)
                        {
                            Ok(_) => break u64::from_le(cur),
                            Err(c) => cur = c,
                        }
                    }
                }
            }
            AtomicOp::CompareSwap { compare, swap } => {
                match a.compare_exchange(le(compare), le(swap), Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(v) | Err(v) => u64::from_le(v),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_share_bytes_and_atomics() {
        let mut a = SharedMem::heap(4096).unwrap();
        let mut b = a.clone();
        assert_eq!(a.handles(), 2);
        a.write(100, b"hello");
        let mut got = [0u8; 5];
        b.read(100, &mut got);
        assert_eq!(&got, b"hello");
        assert_eq!(b.atomic(8, AtomicOp::FetchAdd(5)), 0);
        assert_eq!(a.atomic(8, AtomicOp::FetchAdd(2)), 5);
        assert_eq!(
            a.atomic(
                8,
                AtomicOp::CompareSwap {
                    compare: 6,
                    swap: 1
                }
            ),
            7,
            "a failed compare returns the word and leaves it"
        );
        assert_eq!(
            b.atomic(
                8,
                AtomicOp::CompareSwap {
                    compare: 7,
                    swap: 1
                }
            ),
            7
        );
        let mut w = [0u8; 8];
        a.read(8, &mut w);
        assert_eq!(u64::from_le_bytes(w), 1);
        // A word at an odd address still gets the operation.
        assert_eq!(
            a.atomic(101, AtomicOp::FetchAdd(1)),
            u64::from_le_bytes(*b"ello\0\0\0\0")
        );
    }

    #[test]
    fn atomics_from_two_threads_do_not_lose_updates() {
        let m = SharedMem::heap(64).unwrap();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let mut h = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..100_000 {
                        h.atomic(0, AtomicOp::FetchAdd(1));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut w = [0u8; 8];
        m.read(0, &mut w);
        assert_eq!(u64::from_le_bytes(w), 200_000);
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn out_of_bounds_copies_panic_instead_of_touching_memory() {
        let m = SharedMem::heap(16).unwrap();
        let mut d = [0u8; 8];
        m.read(12, &mut d);
    }

    #[test]
    fn empty_memory_is_fine() {
        let m = SharedMem::heap(0).unwrap();
        assert!(m.is_empty());
        m.read(0, &mut []);
    }
}
