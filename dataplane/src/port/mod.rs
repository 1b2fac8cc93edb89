//! Ports as the lcore loop sees them: a queue pair it owns, with bursts in fixed arrays.
//!
//! [`PortQueue`] is the one trait; [`crate::dpdk::DpdkQueue`] (real NICs and DPDK vdevs) and
//! [`mem::MemQueue`] (in-memory links for tests and the simulator) implement it.

pub mod impair;
pub mod mem;
pub mod rss;

use crate::buf::PacketBuf;
use arrayvec::ArrayVec;
use core::fmt;

/// Frames per burst, as DPDK applications conventionally use.
pub const BURST_SIZE: usize = 32;

/// A burst of frames in a fixed array: receiving and transmitting never allocate.
pub type Burst<B> = ArrayVec<B, BURST_SIZE>;

/// Index of a port in the appliance's configuration (also its DPDK port id for DPDK ports).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PortId(pub u16);

/// Index of a queue on a port; lcore `i` owns queue `i` of every port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct QueueId(pub u16);

impl fmt::Display for PortId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "port{}", self.0)
    }
}

/// A MAC address.
pub use smoltcp::wire::EthernetAddress as MacAddr;

/// What a port can do, as negotiated at start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCaps {
    /// The port fills in IPv4 header checksums on transmit.
    pub tx_ipv4_cksum: bool,
    /// The port fills in UDP checksums on transmit.
    pub tx_udp_cksum: bool,
    /// The port transmits frames of several chained segments.
    pub tx_multi_seg: bool,
    /// The port checks IPv4 header checksums on receive and flags the result.
    pub rx_ipv4_cksum: bool,
    /// The port spreads received flows over its queues by RSS.
    pub rss: bool,
    /// Its RSS runs with ferroce's key and redirection table, so a ferroce peer's QPs steer
    /// their packets to the owning lcore's queue (see [`rss`]).
    pub rss_steering: bool,
}

/// What the loop needs to know about a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// The port's index.
    pub id: PortId,
    /// Its MAC address.
    pub mac: MacAddr,
    /// Its MTU (the IP packet size it carries).
    pub mtu: u16,
    /// Negotiated offloads.
    pub caps: PortCaps,
}

impl PortInfo {
    /// A virtual port: index `i`, MAC 02:00:00:00:00:`i`, the given MTU, no offloads (the
    /// in-memory backend and tests).
    pub fn virtual_port(i: u16, mtu: u16) -> PortInfo {
        PortInfo {
            id: PortId(i),
            mac: MacAddr([2, 0, 0, 0, 0, i as u8]),
            mtu,
            caps: PortCaps::default(),
        }
    }
}

/// One rx/tx queue pair of a port, owned by one lcore.
pub trait PortQueue: Send {
    /// The frame buffer type of this backend.
    type Buf: PacketBuf;

    /// Receives up to the burst's free space; returns how many frames were appended.
    fn rx_burst(&mut self, burst: &mut Burst<Self::Buf>) -> usize;

    /// Transmits frames from the front of `burst`; returns how many the port took. The ones it
    /// did not take stay in `burst`, in order.
    fn tx_burst(&mut self, burst: &mut Burst<Self::Buf>) -> usize;

    /// A fresh empty buffer for a frame this lcore originates, or `None` if the pool is empty.
    fn alloc(&mut self) -> Option<Self::Buf>;

    /// The port this queue belongs to.
    fn info(&self) -> &PortInfo;
}
