//! Packet buffers: what a port hands to the loop and takes back to transmit.
//!
//! A buffer is one contiguous frame with headroom in front (for headers written ahead of a
//! payload) and tailroom behind. DPDK's `Mbuf` (dataplane's `dpdk` module) implements
//! [`PacketBuf`] over an rte_mbuf; [`HeapBuf`] is the in-memory backend's.
//!
//! Payloads can travel without a copy from memory that implements [`PayloadMem`] (a region's
//! bytes), where the buffer can point a segment into it ([`PacketBuf::attach_payload`]).

/// Checksum state a port reports for a received frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RxChecksum {
    /// The port did not check it: software must.
    #[default]
    Unknown,
    /// The port checked it and it is right.
    Good,
    /// The port checked it and it is wrong.
    Bad,
}

/// What a transmitted frame asks of the port's checksum offload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxOffload {
    /// Length of the Ethernet header including any VLAN tag.
    pub l2_len: u16,
    /// Length of the IP header.
    pub l3_len: u16,
    /// Fill in the IPv4 header checksum.
    pub ipv4_cksum: bool,
    /// Fill in the UDP checksum (needs the pseudo-header sum in the UDP checksum field).
    pub udp_cksum: bool,
    /// The frame is IPv6 (the offload must know the L3 type).
    pub ipv6: bool,
}

/// Memory a frame's payload can be carried from without a copy: a memory region's bytes.
/// The buffer that attaches it knows the concrete type it can point into (DPDK's mbufs,
/// dataplane's hugepage memory) and asks for it with `downcast_ref` on `&dyn Any`.
pub trait PayloadMem: core::any::Any {
    /// Length in bytes.
    fn len(&self) -> usize;
    /// True when empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// CRC-32 (the ICRC's polynomial) carried on from `crc` over `len` bytes at `off`.
    fn crc32(&self, crc: u32, off: usize, len: usize) -> u32;
}

/// One frame in a contiguous buffer with head- and tailroom.
pub trait PacketBuf: Send + 'static {
    /// The frame's bytes.
    fn data(&self) -> &[u8];
    /// The frame's bytes, writable.
    fn data_mut(&mut self) -> &mut [u8];
    /// Grows the frame by `len` bytes at the front (into headroom) and returns them.
    fn prepend(&mut self, len: usize) -> Option<&mut [u8]>;
    /// Drops `len` bytes from the front. False if the frame is shorter.
    fn adj(&mut self, len: usize) -> bool;
    /// Grows the frame by `len` bytes at the end (into tailroom) and returns them.
    fn append(&mut self, len: usize) -> Option<&mut [u8]>;
    /// Drops `len` bytes from the end. False if the frame is shorter.
    fn trim(&mut self, len: usize) -> bool;
    /// Empties the buffer and restores its standard headroom, ready to build a frame in.
    /// False if it cannot be (a chained multi-segment mbuf).
    fn reset(&mut self) -> bool;
    /// Frame length.
    fn len(&self) -> usize {
        self.data().len()
    }
    /// True for an empty frame.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Sets the frame length to `len`, growing into tailroom or trimming.
    fn set_len(&mut self, len: usize) -> bool {
        let cur = self.len();
        if len >= cur {
            self.append(len - cur).is_some()
        } else {
            self.trim(cur - len)
        }
    }
    /// The IPv4 header checksum state reported by the port on receive.
    fn rx_ip_checksum(&self) -> RxChecksum {
        RxChecksum::Unknown
    }
    /// Asks the port to compute checksums on transmit. Only call it on ports whose
    /// capabilities include the offload; the default ignores the request.
    fn request_tx_offload(&mut self, _req: TxOffload) {}
    /// Puts `len` bytes of `mem` from `off` after the frame without copying them (a segment
    /// that points into the memory, which stays alive until the port has sent it), then a
    /// fresh segment of `tail` bytes, which it returns to be filled. `None`, and the buffer
    /// unchanged, where the backend cannot (heap buffers; memory without an IO address). Only
    /// call it on ports whose capabilities include multi-segment transmit.
    fn attach_payload(
        &mut self,
        _mem: &dyn PayloadMem,
        _off: usize,
        _len: usize,
        _tail: usize,
    ) -> Option<&mut [u8]> {
        None
    }
    /// The whole frame's length over every segment ([`len`](Self::len) and
    /// [`data`](Self::data) see only the first).
    fn frame_len(&self) -> usize {
        self.len()
    }
    /// Moves a multi-segment frame's bytes into its first segment; false if they do not fit.
    fn linearize(&mut self) -> bool {
        true
    }
}

/// The in-memory backend's buffer: a fixed-size heap allocation reused through a pool.
#[derive(Clone)]
pub struct HeapBuf {
    storage: Box<[u8]>,
    start: usize,
    end: usize,
}

impl core::fmt::Debug for HeapBuf {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("HeapBuf")
            .field("headroom", &self.start)
            .field("len", &(self.end - self.start))
            .finish()
    }
}

impl HeapBuf {
    /// Headroom left in front of a fresh buffer, as DPDK's RTE_PKTMBUF_HEADROOM.
    pub const HEADROOM: usize = 128;
    /// Room for a 9000-byte jumbo frame with VLAN tag and headroom.
    pub const CAPACITY: usize = 9216 + Self::HEADROOM;

    /// An empty buffer with the standard headroom: the storage of one this thread dropped if
    /// there is one (its old bytes left in it, as a DPDK mbuf's are), else a new allocation.
    #[inline]
    pub fn new() -> Self {
        let storage = POOL
            .try_with(|p| p.borrow_mut().pop())
            .ok()
            .flatten()
            .unwrap_or_else(|| vec![0u8; Self::CAPACITY].into_boxed_slice());
        HeapBuf {
            storage,
            start: Self::HEADROOM,
            end: Self::HEADROOM,
        }
    }

    /// A buffer holding a copy of `frame`.
    pub fn from_slice(frame: &[u8]) -> Self {
        let mut b = Self::new();
        b.append(frame.len())
            .expect("frame larger than HeapBuf::CAPACITY")
            .copy_from_slice(frame);
        b
    }
}

/// Most buffers a thread keeps for reuse, as a mempool's per-lcore cache does.
const POOL_MAX: usize = 1024;

std::thread_local! {
    /// Storage of the buffers this thread dropped, for its next [`HeapBuf::new`]: an
    /// allocation (and a 9 KiB memset) a frame was most of what the in-memory link cost.
    static POOL: core::cell::RefCell<Vec<Box<[u8]>>> = const { core::cell::RefCell::new(Vec::new()) };
}

impl Drop for HeapBuf {
    #[inline]
    fn drop(&mut self) {
        let s = core::mem::take(&mut self.storage);
        if s.len() == Self::CAPACITY {
            // During thread exit the pool may be gone: the storage is then freed.
            let _ = POOL.try_with(|p| {
                let mut p = p.borrow_mut();
                if p.len() < POOL_MAX {
                    p.push(s);
                }
            });
        }
    }
}

impl Default for HeapBuf {
    fn default() -> Self {
        Self::new()
    }
}

impl PacketBuf for HeapBuf {
    #[inline]
    fn data(&self) -> &[u8] {
        &self.storage[self.start..self.end]
    }
    #[inline]
    fn data_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.end]
    }
    #[inline]
    fn prepend(&mut self, len: usize) -> Option<&mut [u8]> {
        if len > self.start {
            return None;
        }
        self.start -= len;
        Some(&mut self.storage[self.start..self.start + len])
    }
    #[inline]
    fn adj(&mut self, len: usize) -> bool {
        if len > self.end - self.start {
            return false;
        }
        self.start += len;
        true
    }
    #[inline]
    fn append(&mut self, len: usize) -> Option<&mut [u8]> {
        if self.end + len > self.storage.len() {
            return None;
        }
        let old = self.end;
        self.end += len;
        Some(&mut self.storage[old..self.end])
    }
    #[inline]
    fn trim(&mut self, len: usize) -> bool {
        if len > self.end - self.start {
            return false;
        }
        self.end -= len;
        true
    }
    #[inline]
    fn reset(&mut self) -> bool {
        self.start = Self::HEADROOM;
        self.end = Self::HEADROOM;
        true
    }
}

/// A plain vector as a buffer without headroom, for tests and tools: `prepend` moves the bytes
/// (the packet path uses mbufs or [`HeapBuf`], which have headroom).
impl PacketBuf for Vec<u8> {
    fn data(&self) -> &[u8] {
        self
    }
    fn data_mut(&mut self) -> &mut [u8] {
        self
    }
    fn prepend(&mut self, len: usize) -> Option<&mut [u8]> {
        self.splice(0..0, core::iter::repeat_n(0, len));
        Some(&mut self[..len])
    }
    fn adj(&mut self, len: usize) -> bool {
        if len > self.len() {
            return false;
        }
        self.drain(..len);
        true
    }
    fn append(&mut self, len: usize) -> Option<&mut [u8]> {
        let old = self.len();
        self.resize(old + len, 0);
        Some(&mut self[old..])
    }
    fn trim(&mut self, len: usize) -> bool {
        if len > self.len() {
            return false;
        }
        self.truncate(self.len() - len);
        true
    }
    fn reset(&mut self) -> bool {
        self.clear();
        true
    }
}

/// Test buffers that wrap a [`HeapBuf`] (field 0) to change one behaviour: this writes the
/// trait's other required methods as plain delegation, and the caller adds `append`.
#[doc(hidden)]
#[macro_export]
macro_rules! delegate_heap_buf {
    () => {
        fn data(&self) -> &[u8] {
            self.0.data()
        }
        fn data_mut(&mut self) -> &mut [u8] {
            self.0.data_mut()
        }
        fn prepend(&mut self, len: usize) -> Option<&mut [u8]> {
            self.0.prepend(len)
        }
        fn adj(&mut self, len: usize) -> bool {
            self.0.adj(len)
        }
        fn trim(&mut self, len: usize) -> bool {
            self.0.trim(len)
        }
        fn reset(&mut self) -> bool {
            self.0.reset()
        }
    };
}
pub use crate::delegate_heap_buf;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heapbuf_head_and_tail_room() {
        let mut b = HeapBuf::from_slice(&[1, 2, 3]);
        b.prepend(2).unwrap().copy_from_slice(&[9, 8]);
        assert_eq!(b.data(), &[9, 8, 1, 2, 3]);
        assert!(b.adj(1));
        assert!(b.trim(1));
        assert_eq!(b.data(), &[8, 1, 2]);
        assert!(b.prepend(HeapBuf::HEADROOM + 10).is_none());
        assert!(!b.trim(4));
        assert!(b.set_len(5));
        assert_eq!(b.len(), 5);
        assert!(b.append(HeapBuf::CAPACITY).is_none());
    }
}
