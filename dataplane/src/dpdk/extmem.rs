//! An application's registered memory made known to DPDK, so that frames can carry its bytes
//! attached (zero-copy transmit) as they carry the hugepage memory of roced's own regions.
//!
//! An mbuf attached to external memory needs an IO address for it, and the devices that read
//! it need it mapped: DPDK's way is `rte_extmem_register` (the memory becomes a memseg list,
//! which drivers look addresses up in) and `rte_dev_dma_map` for each device (its IOMMU
//! mapping, through VFIO). What the IO address is depends on the EAL's IOVA mode:
//!
//! - IOVA as VA: the virtual address, mapped for every port's device. A device that needs no
//!   mapping (a virtual device) says ENOTSUP, which is fine.
//! - IOVA as PA: an application's pages are ordinary pages the kernel may move, so they have no
//!   physical address a device could keep using. Only drivers that read a segment by its
//!   virtual address (virtual devices: memif, af_packet, af_xdp in copy mode, ring, tap) can
//!   carry them; if every port is one, the memory is registered with no IO address
//!   (`RTE_BAD_IOVA`), otherwise it is not registered and its bytes are copied into frames.
//!
//! All of this runs on the control plane, when a region is registered and when its memory
//! goes; never on an lcore's packet path, except in the rare case where the last frame
//! carrying a region's bytes is freed after the region was deregistered (see `mem::ExtInfo`).

use dpdk_sys as sys;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Areas registered now, their bytes, and registrations refused (the memory then copied into
/// frames) since the process started: control-plane counters, written where memory is
/// registered and unregistered, never on an lcore's packet path.
static AREAS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// What [`stats`] reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZeroCopyStats {
    /// Application memory areas registered with DPDK now (frames may carry their bytes).
    pub areas: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Registrations refused with ports open (IOVA as PA with a physical device, DPDK out of
    /// memseg lists, a failed DMA mapping): those regions' bytes are copied into frames.
    pub refused: u64,
}

/// The process's zero-copy registrations of application memory.
pub fn stats() -> ZeroCopyStats {
    ZeroCopyStats {
        areas: AREAS.load(Relaxed),
        bytes: BYTES.load(Relaxed),
        refused: REFUSED.load(Relaxed),
    }
}

/// DPDK's `RTE_BAD_IOVA` (a macro, so bindgen does not carry it).
pub(crate) const BAD_IOVA: u64 = u64::MAX;

/// A started port's device, as extmem registration needs it.
#[derive(Clone, Copy)]
struct PortDevice {
    port: u16,
    /// `rte_device *`, kept as an address: it lives as long as the port is open.
    device: usize,
    /// On the vdev bus: its driver reads segments at their virtual address.
    virtual_dev: bool,
}

/// The open ports (added when a port is configured, removed when it is closed).
static PORTS: Mutex<Vec<PortDevice>> = Mutex::new(Vec::new());

/// Records port `port` of device `device` (from its `rte_eth_dev_info`).
pub(crate) fn port_opened(port: u16, device: *mut sys::rte_device) {
    let virtual_dev = !device.is_null() && {
        // SAFETY: the port's live device; rte_dev_bus and rte_bus_name return pointers into
        // it and its bus, with a static NUL-terminated name.
        unsafe {
            let bus = sys::rte_dev_bus(device);
            !bus.is_null() && std::ffi::CStr::from_ptr(sys::rte_bus_name(bus)).to_bytes() == b"vdev"
        }
    };
    let mut p = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    p.retain(|d| d.port != port);
    p.push(PortDevice {
        port,
        device: device as usize,
        virtual_dev,
    });
}

/// Forgets port `port` (closed).
pub(crate) fn port_closed(port: u16) {
    let mut p = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    p.retain(|d| d.port != port);
}

/// Memory registered with DPDK (and mapped for the ports' devices that need it); unmapped and
/// unregistered on drop, which must come before the memory itself goes.
#[derive(Debug)]
pub(crate) struct Registered {
    va: usize,
    len: usize,
    /// The devices it was mapped for (addresses of `rte_device`).
    mapped: Vec<usize>,
    /// The IO address is the virtual address (IOVA as VA); otherwise it has none.
    iova_is_va: bool,
}

// SAFETY: the addresses are only handed back to DPDK's thread-safe (locked) extmem and DMA
// calls.
unsafe impl Send for Registered {}
// SAFETY: as above; nothing is read through them.
unsafe impl Sync for Registered {}

impl Registered {
    /// The IO address of the byte at `addr` (inside the memory).
    pub(crate) fn iova(&self, addr: *const u8) -> u64 {
        if self.iova_is_va {
            addr as u64
        } else {
            BAD_IOVA
        }
    }
}

/// Why memory was not registered (it is then copied into frames, not attached).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotRegistered {
    /// No port is open (no EAL, or a process without ports).
    #[error("no DPDK port is open")]
    NoPorts,
    /// IOVA as PA with a port whose device reads physical addresses.
    #[error("IOVA as PA and port {0} is a physical device: application pages have no IO address")]
    NeedsPhysical(u16),
    /// Address or length not whole pages.
    #[error("the memory is not whole pages")]
    Misaligned,
    /// A DPDK call failed.
    #[error("{call}: {reason}")]
    Dpdk {
        /// Which.
        call: &'static str,
        /// rte_strerror of rte_errno.
        reason: String,
    },
}

/// Registers `len` bytes at `va` (page-aligned memory that stays mapped until the result is
/// dropped) so that mbufs may carry them attached.
pub(crate) fn register(va: *mut u8, len: usize) -> Result<Registered, NotRegistered> {
    let r = try_register(va, len);
    if !matches!(r, Ok(_) | Err(NotRegistered::NoPorts)) {
        REFUSED.fetch_add(1, Relaxed);
    }
    r
}

fn try_register(va: *mut u8, len: usize) -> Result<Registered, NotRegistered> {
    let ports: Vec<PortDevice> = PORTS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if ports.is_empty() {
        return Err(NotRegistered::NoPorts);
    }
    let page = verbs::shm::page_size();
    if len == 0 || !(va as usize).is_multiple_of(page) || !len.is_multiple_of(page) {
        return Err(NotRegistered::Misaligned);
    }
    // SAFETY: a plain query of the initialised EAL (ports are open, so it is up).
    let iova_is_va = unsafe { sys::rte_eal_iova_mode() } == sys::RTE_IOVA_VA;
    if !iova_is_va && let Some(p) = ports.iter().find(|p| !p.virtual_dev) {
        return Err(NotRegistered::NeedsPhysical(p.port));
    }
    let dpdk = |call| NotRegistered::Dpdk {
        call,
        reason: super::last_error(),
    };
    let mut iovas: Vec<u64> = if iova_is_va {
        (0..len / page)
            .map(|k| (va as usize + k * page) as u64)
            .collect()
    } else {
        Vec::new()
    };
    let (arr, n) = if iovas.is_empty() {
        (core::ptr::null_mut(), 0)
    } else {
        (iovas.as_mut_ptr(), iovas.len() as u32)
    };
    // SAFETY: `va..va + len` is whole pages of live memory (the caller's promise); `arr` holds
    // `n` addresses, one a page, or is null.
    if unsafe { sys::rte_extmem_register(va.cast(), len, arr, n, page) } != 0 {
        return Err(dpdk("rte_extmem_register"));
    }
    AREAS.fetch_add(1, Relaxed); // undone by the drop of `reg`, on every path
    BYTES.fetch_add(len as u64, Relaxed);
    let mut reg = Registered {
        va: va as usize,
        len,
        mapped: Vec::new(),
        iova_is_va,
    };
    if iova_is_va {
        for p in ports.iter().filter(|p| !p.virtual_dev && p.device != 0) {
            // SAFETY: the port's live device and the memory just registered, mapped at its
            // virtual address.
            let rc = unsafe { sys::rte_dev_dma_map(p.device as *mut _, va.cast(), va as u64, len) };
            // SAFETY: reads the calling thread's rte_errno.
            if rc != 0 && unsafe { sys::ferroce_rte_errno() } != libc::ENOTSUP {
                return Err(dpdk("rte_dev_dma_map")); // `reg` unregisters what was done
            }
            if rc == 0 {
                reg.mapped.push(p.device);
            }
        }
    }
    Ok(reg)
}

impl Drop for Registered {
    fn drop(&mut self) {
        // A device closed since took its mappings with it (and may be gone): only the open
        // ones are unmapped.
        let open: Vec<usize> = PORTS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|p| p.device)
            .collect();
        // SAFETY: undoes `register` on the same range, while the memory is still mapped, for
        // devices that are still open.
        unsafe {
            for &d in self.mapped.iter().filter(|d| open.contains(d)) {
                sys::rte_dev_dma_unmap(d as *mut _, self.va as *mut _, self.va as u64, self.len);
            }
            sys::rte_extmem_unregister(self.va as *mut _, self.len);
        }
        AREAS.fetch_sub(1, Relaxed);
        BYTES.fetch_sub(self.len as u64, Relaxed);
    }
}
