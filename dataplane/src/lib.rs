//! ferroce's data plane.
//!
//! - [`port`]: one [`port::PortQueue`] trait for a port's rx/tx queue pair, with two backends:
//!   [`dpdk`] (real NICs and DPDK virtual devices) and [`port::mem`] (in-memory links, so protocol
//!   tests run without DPDK).
//! - [`lcore`]: the poll loop each worker lcore runs: receive a burst, dispatch it to a
//!   [`lcore::Handler`], transmit, poll timers and the control thread's command channel.
//! - [`host`]: the RDMA handler of that loop: a shard of the [`transport`]'s QPs on one lcore.
//! - [`net`]: what makes the appliance a good citizen on its ports: ARP, IPv6 neighbour discovery,
//!   ICMP and ICMPv6 echo, static routes, 802.1Q.
//! - [`sim`]: the simulator (`netsim`) and the runs that drive the transport through it (the
//!   soak, incast).
//!
//! Below it, as their own crates (ARCHITECTURE.md): [`wire`] (formats, the ICRC, packet buffers,
//! [`time`]) and [`transport`] (the sans-IO RDMA engine and [`cc`]), neither of which can reach
//! DPDK. The packet path allocates nothing and never blocks: bursts are fixed arrays, counters are
//! single-writer per lcore, and errors on that path are values, not strings.

pub mod appliance;
pub mod counters;
pub mod dpdk;
pub mod host;
pub mod lcore;
pub mod mem;
pub mod net;
pub mod port;
pub mod sim;

/// The sans-IO RDMA transport: the `transport` crate (ARCHITECTURE.md).
pub use transport;
pub use transport::cc;
/// RoCEv2 on the wire: the `wire` crate, dataplane's bottom floor (ARCHITECTURE.md).
pub use wire;
pub use wire::{buf, crc, hint, time};

pub use buf::PacketBuf;
pub use port::{BURST_SIZE, Burst, PortQueue};
pub use time::Instant;
