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
//! Memory comes from DPDK's hugepage heap on lcores ([`crate::dpdk::HugepageHeap`]), from the
//! process heap in tests, or from an application ([`SharedMem::application`]: its registered
//! memory, mapped from the sealed memfd it sent, read and written in place).

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
    /// Memory mbufs can carry as external buffers: DPDK's `rte_zmalloc`, or an application's
    /// memory registered with DPDK ([`ExtInfo::owner`] says which and how it is freed).
    Dpdk(NonNull<ExtInfo>),
    /// Nothing (an empty block).
    None,
    /// Memory an application shares with roced (a mapping of the sealed memfd it sent), kept
    /// mapped while the block lives, that DPDK does not know (copied into frames).
    App(#[allow(dead_code)] Arc<verbs::shm::SharedMem>),
}

/// DPDK's shared-info block for mbufs attached to a hugepage block (its reference count counts
/// the block itself, [`BLOCK_REFS`], plus every attached mbuf), and what freeing the memory
/// needs. Boxed
/// apart from the block: when the last handle goes while mbufs still point into the memory
/// (frames waiting in a transmit queue), the memory and this stay until the last of those
/// mbufs is freed, whose free callback then frees both.
#[repr(C)]
pub(crate) struct ExtInfo {
    pub(crate) shinfo: dpdk_sys::rte_mbuf_ext_shared_info,
    pub(crate) base: *mut u8,
    /// The IO address of each 2 MiB-aligned chunk of virtual address space the block covers
    /// (the first one holds the block's start), as if the chunk were whole; empty when the
    /// memory has none. A device reads an attached segment at its IO address, which is the
    /// virtual one with IOVA as VA but, with physical addresses, jumps wherever the hugepages
    /// behind the block do not lie in order: segments that would straddle such a jump copy.
    pub(crate) chunk_iova: Box<[u64]>,
    /// Whose memory it is, freed when this goes.
    pub(crate) owner: ExtOwner,
}

/// Who owns the memory behind an [`ExtInfo`].
pub(crate) enum ExtOwner {
    /// DPDK's heap: `rte_free` of `base`.
    Rte,
    /// An application's mapping, registered with DPDK: unregistered, then unmapped (the
    /// fields drop in this order).
    App(
        crate::dpdk::extmem::Registered,
        #[allow(dead_code)] Arc<verbs::shm::SharedMem>,
    ),
}

impl Drop for ExtInfo {
    fn drop(&mut self) {
        if let ExtOwner::Rte = self.owner {
            // SAFETY: `base` is the rte_zmalloc'd block this describes, freed once (the info
            // is dropped once, by the block or by the last attached mbuf's callback).
            unsafe { dpdk_sys::rte_free(self.base.cast()) };
        }
    }
}

/// The chunk size of [`ExtInfo::chunk_iova`]: hugepages are 2 MiB or 1 GiB, so IO addresses can
/// only jump at 2 MiB boundaries.
const IOVA_CHUNK: usize = 2 << 20;

/// The IO address of each 2 MiB chunk of `base..base + len` (see [`ExtInfo::chunk_iova`]).
///
/// # Safety
/// `base..base + len` must be live DPDK heap memory.
unsafe fn chunk_iovas(base: *mut u8, len: usize) -> Box<[u64]> {
    if len == 0 {
        return Box::new([]);
    }
    let first = base as usize & !(IOVA_CHUNK - 1);
    let chunks = (base as usize + len - 1 - first) / IOVA_CHUNK + 1;
    let mut v = Vec::with_capacity(chunks);
    for k in 0..chunks {
        let start = first + k * IOVA_CHUNK;
        let at = start.max(base as usize);
        // SAFETY: `at` is inside the block; rte_mem_virt2iova looks any address of DPDK
        // memory up in its memory segments.
        let iova = unsafe { dpdk_sys::rte_mem_virt2iova(at as *const core::ffi::c_void) };
        if iova == u64::MAX {
            return Box::new([]);
        }
        v.push(iova - (at - start) as u64);
    }
    v.into_boxed_slice()
}

/// The block's own share of its shared info's reference count. Two, not one: DPDK's
/// `rte_mbuf_ext_refcnt_update` takes a non-atomic shortcut when it reads 1 (it assumes the
/// caller holds the only reference), which would lose an update when two lcores attach from
/// one region at once. With the block holding two, the count reads 1 only once the block is
/// gone and a single mbuf is left, where the shortcut is right.
pub(crate) const BLOCK_REFS: u16 = 2;

/// Most mbufs attached to one block at once (the count is 16 bits).
pub(crate) const MAX_ATTACHED: u16 = 60000;

/// DPDK's callback when the last attached mbuf of a block whose handles are gone is freed.
unsafe extern "C" fn ext_free(_addr: *mut core::ffi::c_void, opaque: *mut core::ffi::c_void) {
    // SAFETY: `opaque` is the ExtInfo box of a block whose handles are all gone (Block::drop
    // left it to us); nothing references it or its memory any more. Dropping it frees the
    // memory (an application's: unregistered and unmapped, here on the lcore that freed the
    // frame, which happens only when a region goes while a frame of it waits to be sent).
    drop(unsafe { Box::from_raw(opaque.cast::<ExtInfo>()) });
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
            Origin::Dpdk(info) => {
                // SAFETY: `info` is our live box. Dropping the block's own reference: if no
                // mbuf is attached the memory is ours to free now (dropping the info frees it,
                // once), otherwise the last attached mbuf's free callback does.
                unsafe {
                    let sh = &raw mut (*info.as_ptr()).shinfo;
                    if dpdk_sys::rte_mbuf_ext_refcnt_update(sh, -(BLOCK_REFS as i16)) == 0 {
                        drop(Box::from_raw(info.as_ptr()));
                    }
                }
            }
            Origin::None | Origin::App(_) => {}
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
            .field("hugepage", &self.is_hugepage())
            .field("attachable", &self.is_attachable())
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

    /// `len` bytes at `off` of memory an application shares with roced (the memory it
    /// registered, mapped from the sealed memfd it sent): every lcore reads and writes it in
    /// place, as an RNIC does the host's memory, and the mapping stays while a handle does.
    /// None if the range is outside the mapping.
    ///
    /// Where this process has DPDK ports whose devices can read it (see
    /// [`crate::dpdk::extmem`]), the mapping is registered with DPDK so that frames carry its
    /// bytes attached, as they do those of hugepage regions; otherwise (or if registration
    /// fails: DPDK has room for some hundred such areas) they are copied into frames.
    pub fn application(m: Arc<verbs::shm::SharedMem>, off: usize, len: usize) -> Option<Self> {
        if off.checked_add(len)? > m.len() {
            return None;
        }
        if len == 0 {
            return Some(Self::empty());
        }
        // SAFETY: `off + len <= m.len()` (checked), so the range is inside the mapping, which
        // the block keeps alive through its Arc.
        let ptr = NonNull::new(unsafe { m.as_ptr().add(off) })?;
        // Only memory that frames could carry attached is worth a registration.
        let whole = m.len().next_multiple_of(verbs::shm::page_size());
        let reg = if len >= crate::transport::rc::ATTACH_MIN {
            crate::dpdk::extmem::register(m.as_ptr(), whole)
                .inspect_err(|e| {
                    if *e != crate::dpdk::extmem::NotRegistered::NoPorts {
                        tracing::debug!(bytes = len, "application memory copied into frames: {e}");
                    }
                })
                .ok()
        } else {
            None
        };
        let Some(reg) = reg else {
            return Some(SharedMem {
                block: Arc::new(Block {
                    ptr,
                    len,
                    origin: Origin::App(m),
                }),
            });
        };
        Some(Self::ext_block(
            ptr,
            len,
            Box::new([]),
            ExtOwner::App(reg, m),
        ))
    }

    /// A block of memory mbufs can carry: its shared info starts with the block's own
    /// references, and dropping it frees what `owner` owns.
    fn ext_block(ptr: NonNull<u8>, len: usize, chunk_iova: Box<[u64]>, owner: ExtOwner) -> Self {
        let info = Box::new(ExtInfo {
            shinfo: dpdk_sys::rte_mbuf_ext_shared_info {
                free_cb: Some(ext_free),
                fcb_opaque: core::ptr::null_mut(),
                refcnt: BLOCK_REFS,
            },
            base: ptr.as_ptr(),
            chunk_iova,
            owner,
        });
        let info = NonNull::from(Box::leak(info));
        // SAFETY: our fresh box; the callback gets it back.
        unsafe { (*info.as_ptr()).shinfo.fcb_opaque = info.as_ptr().cast() };
        SharedMem {
            block: Arc::new(Block {
                ptr,
                len,
                origin: Origin::Dpdk(info),
            }),
        }
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
        // SAFETY: the live rte_zmalloc block.
        let chunk_iova = unsafe { chunk_iovas(ptr.as_ptr(), len) };
        Self::ext_block(ptr, len, chunk_iova, ExtOwner::Rte)
    }

    /// For attaching `len` bytes at `off` to an mbuf as an external buffer: their address, IO
    /// address and the block's shared info. `None` for heap memory, hugepage memory without
    /// an IO address, application memory DPDK does not know, or a range outside the block.
    pub(crate) fn ext_range(
        &self,
        off: usize,
        len: usize,
    ) -> Option<(*mut u8, u64, NonNull<dpdk_sys::rte_mbuf_ext_shared_info>)> {
        let Origin::Dpdk(info) = self.block.origin else {
            return None;
        };
        if off.checked_add(len)? > self.block.len {
            return None;
        }
        // SAFETY: the box lives as long as the block (and past it while mbufs hold it).
        let i = unsafe { info.as_ref() };
        // SAFETY: an atomic read of the live shared info.
        let attached = unsafe { dpdk_sys::rte_mbuf_ext_refcnt_read(&i.shinfo) };
        if attached > MAX_ATTACHED || len == 0 {
            return None;
        }
        let sh = NonNull::new(&raw const i.shinfo as *mut dpdk_sys::rte_mbuf_ext_shared_info)?;
        if let ExtOwner::App(reg, _) = &i.owner {
            // SAFETY: in bounds (checked).
            let p = unsafe { self.block.ptr.as_ptr().add(off) };
            return Some((p, reg.iova(p), sh));
        }
        if i.chunk_iova.is_empty() {
            return None;
        }
        let first = self.block.ptr.as_ptr() as usize & !(IOVA_CHUNK - 1);
        let a = self.block.ptr.as_ptr() as usize + off - first;
        let (k0, k1) = (a / IOVA_CHUNK, (a + len - 1) / IOVA_CHUNK);
        let t = &i.chunk_iova;
        if (k0..k1).any(|k| t[k + 1] != t[k] + IOVA_CHUNK as u64) {
            return None; // the bytes straddle a jump in IO addresses
        }
        // SAFETY: in bounds (checked).
        let p = unsafe { self.block.ptr.as_ptr().add(off) };
        Some((p, t[k0] + (a % IOVA_CHUNK) as u64, sh))
    }

    /// Mbufs whose frames carry bytes of this memory attached now (0 for heap memory).
    pub fn attached(&self) -> usize {
        match self.block.origin {
            Origin::Dpdk(info) => {
                // SAFETY: an atomic read of the block's live shared info.
                let n = unsafe { dpdk_sys::rte_mbuf_ext_refcnt_read(&(*info.as_ptr()).shinfo) };
                n.saturating_sub(BLOCK_REFS) as usize
            }
            _ => 0,
        }
    }

    /// Continues the CRC-32 `crc` (a finished value, as `crc32fast::Hasher::new_with_initial`
    /// takes) over the `len` bytes at `off`, read in place.
    pub fn crc32(&self, crc: u32, off: usize, len: usize) -> u32 {
        self.check(off, len);
        // SAFETY: in bounds (checked); u8 has no invalid values. Concurrent writes by another
        // lcore (a remote WRITE into a buffer being sent from) are the application's race, as
        // the module documentation says; the CRC then covers some mix, as the payload does.
        let s = unsafe { core::slice::from_raw_parts(self.block.ptr.as_ptr().add(off), len) };
        let mut h = crc32fast::Hasher::new_with_initial(crc);
        h.update(s);
        h.finalize()
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
        match self.block.origin {
            // SAFETY: the block's live info.
            Origin::Dpdk(info) => matches!(unsafe { &info.as_ref().owner }, ExtOwner::Rte),
            _ => false,
        }
    }

    /// True if frames can carry the memory's bytes attached rather than copied (DPDK memory
    /// with an IO address, or an application's memory registered with DPDK).
    pub fn is_attachable(&self) -> bool {
        match self.block.origin {
            Origin::Dpdk(info) => {
                // SAFETY: the block's live info.
                let i = unsafe { info.as_ref() };
                matches!(i.owner, ExtOwner::App(..)) || !i.chunk_iova.is_empty()
            }
            _ => false,
        }
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

impl crate::buf::PayloadMem for SharedMem {
    fn len(&self) -> usize {
        SharedMem::len(self)
    }
    fn crc32(&self, crc: u32, off: usize, len: usize) -> u32 {
        SharedMem::crc32(self, crc, off, len)
    }
}

impl MrMemory for SharedMem {
    fn len(&self) -> usize {
        self.block.len
    }

    fn attachable(&self) -> Option<&dyn crate::buf::PayloadMem> {
        Some(self)
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
