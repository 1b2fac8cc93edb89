//! The safe layer over DPDK: EAL, mempools, mbufs, ethdev ports and their queues, lcore launch.
//!
//! All of the project's `unsafe` DPDK calls live here and in `dpdk-sys`. The rest of the data
//! plane sees [`Mbuf`] (a [`crate::PacketBuf`] that frees itself on drop) and [`DpdkQueue`] (a
//! [`crate::PortQueue`]).

mod cable;
mod eal;
mod ethdev;
pub(crate) mod extmem;
pub use extmem::{ZeroCopyStats, stats as zero_copy_stats};
mod mbuf;

pub use cable::MemifCable;
pub use eal::{Eal, EalArgs, TscSource, allowed_cpus, launch, wait_all};
pub use ethdev::{DpdkPort, DpdkQueue, LinkStatus, PortSetup, PortStats};
pub use mbuf::{Mbuf, Mempool};

use std::ffi::CStr;

/// What the control plane needs of DPDK's own constants: its version, where its PMDs are,
/// and "any NUMA socket" (so that nothing above dataplane names dpdk-sys).
pub use dpdk_sys::{DPDK_VERSION, PMD_DIR, SOCKET_ID_ANY};

/// Ports DPDK can have (`RTE_MAX_ETHPORTS` in Debian's build: 32).
pub const MAX_PORTS: usize = dpdk_sys::RTE_MAX_ETHPORTS as usize;
// Every port fits a worker's mask of detached ports.
const _: () = assert!(MAX_PORTS <= crate::lcore::MAX_PORTS);

/// A DPDK failure, with the operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// EAL initialisation failed.
    #[error("DPDK EAL init failed: {reason} (EAL arguments: {args})")]
    Eal {
        /// rte_strerror of rte_errno.
        reason: String,
        /// The arguments passed.
        args: String,
    },
    /// The EAL was already initialised in this process.
    #[error("the DPDK EAL can be initialised only once per process")]
    EalTwice,
    /// No port of that name.
    #[error(
        "no DPDK port named {0:?} (is the vdev or PCI device right, and its driver installed?)"
    )]
    NoSuchPort(String),
    /// An ethdev call failed.
    #[error("{op} on port {port} failed: {reason}")]
    Port {
        /// Port name.
        port: String,
        /// The call.
        op: &'static str,
        /// rte_strerror of the return code.
        reason: String,
    },
    /// A port cannot have as many queues as lcores.
    #[error("port {port} supports {max} queues but {want} worker lcores need one each")]
    TooFewQueues {
        /// Port name.
        port: String,
        /// What the port supports.
        max: u16,
        /// What we need.
        want: u16,
    },
    /// Mempool creation failed.
    #[error("creating mempool {name} failed: {reason} (are hugepages reserved and mounted?)")]
    Mempool {
        /// Pool name.
        name: String,
        /// rte_strerror of rte_errno.
        reason: String,
    },
    /// The hugepage heap could not give region memory.
    #[error("cannot allocate {0} bytes of hugepage memory (are enough hugepages reserved?)")]
    NoMemory(usize),
    /// Launching a worker on an lcore failed.
    #[error("launching a worker on lcore {lcore} failed: {reason}")]
    Launch {
        /// EAL lcore id.
        lcore: u32,
        /// Why.
        reason: String,
    },
}

/// DPDK's hugepage heap, for memory-region memory: a token that the EAL was initialised, so it
/// can be handed to control threads. Every [`crate::mem::SharedMem`] it gave must be dropped
/// before the EAL is cleaned up.
#[derive(Clone, Copy, Debug)]
pub struct HugepageHeap(());

impl HugepageHeap {
    /// The heap of an initialised EAL.
    pub fn new(_eal: &Eal) -> Self {
        HugepageHeap(())
    }

    /// `len` zeroed bytes, cache-line aligned, shared by every holder of a handle.
    pub fn alloc(&self, len: usize) -> Result<crate::mem::SharedMem, Error> {
        if len == 0 {
            return crate::mem::SharedMem::heap(0).map_err(|_| Error::NoMemory(0));
        }
        // SAFETY: the EAL is initialised (the token); rte_zmalloc returns null or a block of
        // `len` zeroed bytes aligned to ALIGN, and is thread-safe.
        let p = unsafe { dpdk_sys::rte_zmalloc(core::ptr::null(), len, crate::mem::ALIGN as u32) };
        let p = core::ptr::NonNull::new(p.cast::<u8>()).ok_or(Error::NoMemory(len))?;
        // SAFETY: from rte_zmalloc with that size and alignment; SharedMem frees it once.
        Ok(unsafe { crate::mem::SharedMem::from_rte(p, len) })
    }
}

/// DPDK's text for an error number (positive or negative).
pub fn strerror(errnum: i32) -> String {
    // SAFETY: rte_strerror returns a pointer to a static or thread-local NUL-terminated string.
    unsafe { CStr::from_ptr(dpdk_sys::rte_strerror(errnum.abs())) }
        .to_string_lossy()
        .into_owned()
}

/// The calling thread's rte_errno as text.
pub fn last_error() -> String {
    // SAFETY: reads the calling thread's rte_errno.
    strerror(unsafe { dpdk_sys::ferroce_rte_errno() })
}
