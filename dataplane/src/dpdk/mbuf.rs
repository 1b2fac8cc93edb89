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
        let m = self.m_mut();
        if m.nb_segs != 1 && !m.next.is_null() {
            // A frame built with attached segments: let them go (an attached one drops its
            // reference to the memory).
            let next = core::mem::replace(&mut m.next, core::ptr::null_mut());
            m.nb_segs = 1;
            // SAFETY: `next` heads the rest of the chain we own, now unlinked from us.
            unsafe { sys::rte_pktmbuf_free(next) };
        }
        // SAFETY: we own this (now) single-segment mbuf; rte_pktmbuf_reset empties it, clears
        // its offload flags and restores the default headroom.
        unsafe { sys::rte_pktmbuf_reset(self.0.as_ptr()) };
        true
    }

    fn attach_payload(
        &mut self,
        mem: &dyn crate::buf::PayloadMem,
        off: usize,
        len: usize,
        tail: usize,
    ) -> Option<&mut [u8]> {
        if self.m().nb_segs != 1 || len > u16::MAX as usize {
            return None;
        }
        // Only hugepage memory of ours has what an external buffer needs (its IO address and
        // shared info).
        let mem: &dyn core::any::Any = mem;
        let (addr, iova, sh) = mem
            .downcast_ref::<crate::mem::SharedMem>()?
            .ext_range(off, len)?;
        let pool = self.m().pool;
        // SAFETY: the mbufs come from our own pool and are owned here until chained.
        let (p, t) = unsafe { (sys::rte_pktmbuf_alloc(pool), sys::rte_pktmbuf_alloc(pool)) };
        let (Some(p), Some(t)) = (NonNull::new(p), NonNull::new(t)) else {
            // SAFETY: freeing what we allocated (free of null is a no-op).
            unsafe {
                sys::rte_pktmbuf_free(p);
                sys::rte_pktmbuf_free(t);
            }
            return None;
        };
        // SAFETY: `p` and `t` are fresh mbufs we own. The range is inside the block
        // (ext_range checked it) and `sh` is the block's shared info: taking a reference in it
        // keeps the memory alive until `p` is freed (see mem::ExtInfo). attach_extbuf points
        // `p` at the bytes; rte_pktmbuf_chain links p and t after us (the segment count is far
        // below the limit, so it cannot fail), after which freeing us frees them.
        unsafe {
            let (mut p, mut t) = (Mbuf(p), Mbuf(t));
            t.append(tail)?;
            sys::rte_mbuf_ext_refcnt_update(sh.as_ptr(), 1);
            sys::rte_pktmbuf_attach_extbuf(
                p.0.as_ptr(),
                addr.cast(),
                iova,
                len as u16,
                sh.as_ptr(),
            );
            let pm = p.m_mut();
            pm.data_len = len as u16;
            pm.pkt_len = len as u32;
            let t_raw = t.0;
            // p -> t first (two fresh mbufs: cannot fail), then the pair after us in one step.
            if p.chain(t).is_err() {
                return None;
            }
            let p = p.into_raw();
            if sys::rte_pktmbuf_chain(self.0.as_ptr(), p.as_ptr()) != 0 {
                sys::rte_pktmbuf_free(p.as_ptr());
                return None;
            }
            let tm = &*t_raw.as_ptr();
            Some(core::slice::from_raw_parts_mut(
                (tm.buf_addr as *mut u8).add(tm.data_off as usize),
                tail,
            ))
        }
    }

    #[inline]
    fn frame_len(&self) -> usize {
        self.m().pkt_len as usize
    }

    fn linearize(&mut self) -> bool {
        // SAFETY: we own the chain; DPDK copies the later segments into the first's tailroom
        // and frees them, or fails and leaves it as it was.
        self.m().nb_segs == 1 || unsafe { sys::rte_pktmbuf_linearize(self.0.as_ptr()) } == 0
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
