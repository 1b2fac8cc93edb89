//! ferroce's data plane.
//!
//! - [`port`]: one [`port::PortQueue`] trait for a port's rx/tx queue pair, with two backends:
//!   [`dpdk`] (real NICs and DPDK virtual devices) and [`port::mem`] (in-memory links, so protocol
//!   tests run without DPDK).
//! - [`lcore`]: the poll loop each worker lcore runs: receive a burst, dispatch it to a
//!   [`lcore::Handler`], transmit, poll timers and the control thread's command channel.
//! - [`net`]: what makes the appliance a good citizen on its ports: ARP, IPv6 neighbour discovery,
//!   ICMP and ICMPv6 echo, static routes, 802.1Q.
//! - [`time`]: the project's `Instant`, in nanoseconds; the loop derives it from the TSC and tests
//!   construct it, so nothing below the loop reads a clock.
//!
//! The packet path allocates nothing and never blocks: bursts are fixed arrays, counters are
//! single-writer per lcore, and errors on that path are values, not strings.

pub mod appliance;
pub use wire::buf;
pub mod cc;
pub mod counters;
pub use wire::crc;
pub mod dpdk;
pub mod hint;
pub mod lcore;
pub mod mem;
pub mod net;
pub mod port;
pub mod sim;
pub mod time;
pub mod transport;
/// RoCEv2 on the wire: the `wire` crate, dataplane's bottom floor (ARCHITECTURE.md).
pub use wire;

pub use buf::PacketBuf;
pub use port::{BURST_SIZE, Burst, PortQueue};
pub use time::Instant;
