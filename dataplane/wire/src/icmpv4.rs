//! ICMP for IPv4, from smoltcp's `wire` (zero-copy `Packet` view and `Repr` with checksum).
//! The IP stack answers echo requests and sends its own pings with these.
pub use smoltcp::wire::{Icmpv4Message as Message, Icmpv4Packet as Packet, Icmpv4Repr as Repr};
