//! Mempools and mbufs.

use super::{Error, last_error};
use crate::buf::{PacketBuf, RxChecksum, TxOffload};
use core::ptr::NonNull;
use dpdk_sys as sys;
use std::ffi::CString;

/// A packet mempool. Freed on drop, which must come after every mbuf from it is back.
#[derive(Debug)]
pub struct Mempool {
    raw: NonNull<sys::rte_mempool>,
    size: u32,
}

// SAFETY: DPDK mempools are thread-safe (lock-free rings plus per-lcore caches).
unsafe impl Send for Mempool {}
// SAFETY: as above; all methods take &self and call thread-safe DPDK functions.
unsafe impl Sync for Mempool {}

impl Mempool {
    /// Creates a pool of `size` mbufs with room for `data_room` bytes after the headroom.
    pub fn new(
        name: &str,
        size: u32,
        cache: u32,
        data_room: u16,
        socket: i32,
    ) -> Result<Self, Error> {
        let cname = CString::new(name).expect("pool name has no NUL");
        let room = data_room + sys::RTE_PKTMBUF_HEADROOM as u16;
        // SAFETY: valid C string; DPDK copies the name.
        let raw =
            unsafe { sys::rte_pktmbuf_pool_create(cname.as_ptr(), size, cache, 0, room, socket) };
        NonNull::new(raw)
            .map(|raw| Mempool { raw, size })
            .ok_or_else(|| Error::Mempool {
                name: name.into(),
                reason: last_error(),
            })
    }

    /// The raw pointer, for ethdev queue setup.
    pub fn as_ptr(&self) -> *mut sys::rte_mempool {
        self.raw.as_ptr()
    }

    /// Mbufs free in the pool (including per-lcore caches).
    pub fn available(&self) -> u32 {
        // SAFETY: the pool is alive.
        unsafe { sys::rte_mempool_avail_count(self.raw.as_ptr()) }
    }

    /// Mbufs handed out and not yet returned.
    pub fn in_use(&self) -> u32 {
        // SAFETY: the pool is alive.
        unsafe { sys::rte_mempool_in_use_count(self.raw.as_ptr()) }
    }

    /// Total mbufs.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Allocates one mbuf.
    #[inline]
    pub fn alloc(&self) -> Option<Mbuf> {
        // SAFETY: the pool is alive; a returned mbuf is ours.
        NonNull::new(unsafe { sys::rte_pktmbuf_alloc(self.raw.as_ptr()) }).map(Mbuf)
    }
}

impl Drop for Mempool {
    fn drop(&mut self) {
        // SAFETY: we own the pool; callers return every mbuf before dropping it.
        unsafe { sys::rte_mempool_free(self.raw.as_ptr()) }
    }
}

/// One single-segment mbuf, freed on drop. `#[repr(transparent)]` over the raw pointer, so a
/// burst of `Mbuf`s is an array DPDK's burst functions can fill and drain directly.
#[repr(transparent)]
#[derive(Debug)]
pub struct Mbuf(NonNull<sys::rte_mbuf>);

// SAFETY: an mbuf is owned by exactly one Mbuf at a time and may move between threads.
unsafe impl Send for Mbuf {}

impl Mbuf {
    /// Takes ownership of a raw mbuf.
    ///
    /// # Safety
    /// `raw` must be a valid mbuf owned by nobody else.
    pub unsafe fn from_raw(raw: NonNull<sys::rte_mbuf>) -> Self {
        Mbuf(raw)
    }

    /// Gives up ownership (to transmit it, say).
    pub fn into_raw(self) -> NonNull<sys::rte_mbuf> {
        let p = self.0;
        core::mem::forget(self);
        p
    }

    #[inline(always)]
    fn m(&self) -> &sys::rte_mbuf {
        // SAFETY: we own a valid mbuf.
        unsafe { self.0.as_ref() }
    }

    #[inline(always)]
    fn m_mut(&mut self) -> &mut sys::rte_mbuf {
        // SAFETY: we own a valid mbuf exclusively.
        unsafe { self.0.as_mut() }
    }

    /// Number of segments (frames longer than one mbuf's room span several).
    pub fn segments(&self) -> u16 {
        self.m().nb_segs
    }
}

impl Drop for Mbuf {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: we own the mbuf; rte_pktmbuf_free returns it (and any chained segments).
        unsafe { sys::rte_pktmbuf_free(self.0.as_ptr()) }
    }
}

impl PacketBuf for Mbuf {
    #[inline]
    fn data(&self) -> &[u8] {
        let m = self.m();
        // SAFETY: buf_addr + data_off .. + data_len is inside the mbuf's buffer, which we own.
        unsafe {
            core::slice::from_raw_parts(
                (m.buf_addr as *const u8).add(m.data_off as usize),
                m.data_len as usize,
            )
        }
    }

    #[inline]
    fn data_mut(&mut self) -> &mut [u8] {
        let m = self.m_mut();
        // SAFETY: as in data(), and we hold the mbuf exclusively.
        unsafe {
            core::slice::from_raw_parts_mut(
                (m.buf_addr as *mut u8).add(m.data_off as usize),
                m.data_len as usize,
            )
        }
    }

    #[inline]
    fn prepend(&mut self, len: usize) -> Option<&mut [u8]> {
        let m = self.m_mut();
        if len > m.data_off as usize {
            return None;
        }
        m.data_off -= len as u16;
        m.data_len += len as u16;
        m.pkt_len += len as u32;
        Some(&mut self.data_mut()[..len])
    }

    #[inline]
    fn adj(&mut self, len: usize) -> bool {
        let m = self.m_mut();
        if len > m.data_len as usize {
            return false;
        }
        m.data_off += len as u16;
        m.data_len -= len as u16;
        m.pkt_len -= len as u32;
        true
    }

    #[inline]
    fn append(&mut self, len: usize) -> Option<&mut [u8]> {
        let m = self.m_mut();
        let end = m.data_off as usize + m.data_len as usize;
        if m.nb_segs != 1 || end + len > m.buf_len as usize {
            return None;
        }
        m.data_len += len as u16;
        m.pkt_len += len as u32;
        let d = self.data_mut();
        let n = d.len();
        Some(&mut d[n - len..])
    }

    #[inline]
    fn trim(&mut self, len: usize) -> bool {
        let m = self.m_mut();
        if m.nb_segs != 1 || len > m.data_len as usize {
            return false;
        }
        m.data_len -= len as u16;
        m.pkt_len -= len as u32;
        true
    }

    #[inline]
    fn reset(&mut self) -> bool {
        if self.m().nb_segs != 1 {
            return false;
        }
        // SAFETY: we own this single-segment mbuf; rte_pktmbuf_reset empties it, clears its
        // offload flags and restores the default headroom.
        unsafe { sys::rte_pktmbuf_reset(self.0.as_ptr()) };
        true
    }

    #[inline]
    fn rx_ip_checksum(&self) -> RxChecksum {
        let f = self.m().ol_flags & sys::RTE_MBUF_F_RX_IP_CKSUM_MASK as u64;
        if f == sys::RTE_MBUF_F_RX_IP_CKSUM_GOOD as u64 {
            RxChecksum::Good
        } else if f == sys::RTE_MBUF_F_RX_IP_CKSUM_BAD as u64 {
            RxChecksum::Bad
        } else {
            RxChecksum::Unknown
        }
    }

    #[inline]
    fn request_tx_offload(&mut self, req: TxOffload) {
        let mut flags = 0u64;
        if req.ipv6 {
            flags |= sys::RTE_MBUF_F_TX_IPV6;
        } else {
            flags |= sys::RTE_MBUF_F_TX_IPV4;
        }
        if req.ipv4_cksum {
            flags |= sys::RTE_MBUF_F_TX_IP_CKSUM;
        }
        if req.udp_cksum {
            flags |= sys::RTE_MBUF_F_TX_UDP_CKSUM;
        }
        // SAFETY: we own the mbuf; the shim sets its l2_len/l3_len bitfields and ORs ol_flags.
        unsafe { sys::ferroce_mbuf_set_tx_offload(self.0.as_ptr(), req.l2_len, req.l3_len, flags) }
    }
}

impl Mbuf {
    /// Appends `tail` (and its segments) to this mbuf's chain. Gives `tail` back when the chain
    /// would exceed DPDK's segment limit.
    pub fn chain(&mut self, tail: Mbuf) -> Result<(), Mbuf> {
        let t = tail.into_raw();
        // SAFETY: both are valid mbufs we own; on success DPDK links `t` after our last segment
        // (the head then frees it), on failure nothing changes and `t` is still ours.
        let rc = unsafe { sys::rte_pktmbuf_chain(self.0.as_ptr(), t.as_ptr()) };
        if rc == 0 {
            Ok(())
        } else {
            // SAFETY: the chain was refused, so we still own `t`.
            Err(unsafe { Mbuf::from_raw(t) })
        }
    }

    /// Total bytes over every segment.
    pub fn pkt_len(&self) -> u32 {
        self.m().pkt_len
    }
}

/// Hugepage memory that mbufs can carry as an external buffer (`rte_pktmbuf_attach_extbuf`)
/// instead of having its bytes copied into their own room: the zero-copy way to put a memory
/// region's payload on the wire.
///
/// It keeps one DPDK shared-info block for the whole memory. Every attached mbuf holds a
/// reference in it and drops it when the mbuf is freed (after the PMD transmitted it); the
/// memory itself is held by this value, whose drop waits for no mbuf: dropping it while mbufs
/// are still attached leaks the memory on purpose rather than letting them point at freed bytes.
pub struct ExtMem {
    mem: crate::mem::SharedMem,
    iova: u64,
    shinfo: Box<sys::rte_mbuf_ext_shared_info>,
}

// SAFETY: the shared-info block is only touched through DPDK's atomic reference-count calls, and
// the memory is a SharedMem (Send + Sync).
unsafe impl Send for ExtMem {}
// SAFETY: as above.
unsafe impl Sync for ExtMem {}

unsafe extern "C" fn ext_mem_free(_addr: *mut core::ffi::c_void, _opaque: *mut core::ffi::c_void) {
    // The memory belongs to the ExtMem; the last mbuf going away frees nothing.
}

impl core::fmt::Debug for ExtMem {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ExtMem")
            .field("mem", &self.mem)
            .field("attached", &self.attached())
            .finish()
    }
}

impl ExtMem {
    /// Wraps hugepage memory (from [`super::HugepageHeap`]); `None` for heap memory, which has
    /// no IO address a device could read.
    pub fn new(mem: crate::mem::SharedMem) -> Option<Self> {
        if !mem.is_hugepage() {
            return None;
        }
        // SAFETY: the address is the start of a live rte_zmalloc block.
        let iova = unsafe { sys::rte_malloc_virt2iova(mem.addr() as *const core::ffi::c_void) };
        if iova == u64::MAX {
            return None;
        }
        let shinfo = Box::new(sys::rte_mbuf_ext_shared_info {
            free_cb: Some(ext_mem_free),
            fcb_opaque: core::ptr::null_mut(),
            refcnt: 1,
        });
        Some(ExtMem { mem, iova, shinfo })
    }

    /// The memory.
    pub fn mem(&self) -> &crate::mem::SharedMem {
        &self.mem
    }

    /// Points the fresh mbuf `m` (single segment, empty, from any pool) at `len` bytes of the
    /// memory from `off`, without copying them. False (and `m` unchanged) when the range is
    /// outside the memory or `m` is not a fresh direct mbuf.
    #[inline]
    pub fn attach(&self, m: &mut Mbuf, off: usize, len: u16) -> bool {
        let end = off.checked_add(len as usize);
        if end.is_none_or(|e| e > self.mem.len()) || m.m().nb_segs != 1 || m.m().data_len != 0 {
            return false;
        }
        let sh = &*self.shinfo as *const sys::rte_mbuf_ext_shared_info as *mut _;
        // SAFETY: the range is inside the live block (checked); `sh` is our boxed shared info,
        // which outlives every attached mbuf (see the type's documentation); DPDK's refcount
        // update is atomic; attach sets buf_addr/iova/len and the EXTBUF flag on an mbuf we own.
        unsafe {
            sys::rte_mbuf_ext_refcnt_update(sh, 1);
            let addr = (self.mem.addr() as usize + off) as *mut core::ffi::c_void;
            sys::rte_pktmbuf_attach_extbuf(m.0.as_ptr(), addr, self.iova + off as u64, len, sh);
        }
        let mm = m.m_mut();
        mm.data_len = len;
        mm.pkt_len = len as u32;
        true
    }

    /// Mbufs attached now and not yet freed.
    pub fn attached(&self) -> u16 {
        // SAFETY: reads our shared info's atomic count.
        unsafe { sys::rte_mbuf_ext_refcnt_read(&*self.shinfo) - 1 }
    }

    /// The bytes `off..off + len`, for a reader that needs a slice (a CRC). The caller must
    /// know nobody writes them meanwhile (remote WRITEs into a region being sent from are the
    /// application's race, as on any RNIC).
    pub fn with_bytes<R>(&self, off: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        assert!(off.checked_add(len).is_some_and(|e| e <= self.mem.len()));
        // SAFETY: in bounds (checked); u8 has no invalid values; see the caller's contract.
        let s = unsafe {
            core::slice::from_raw_parts((self.mem.addr() as usize + off) as *const u8, len)
        };
        f(s)
    }
}

impl Drop for ExtMem {
    fn drop(&mut self) {
        if self.attached() != 0 {
            // Mbufs still point into the memory: keep it (and the shared info) alive forever.
            std::mem::forget(self.mem.clone());
            std::mem::forget(core::mem::replace(
                &mut self.shinfo,
                Box::new(sys::rte_mbuf_ext_shared_info::default()),
            ));
        }
    }
}
