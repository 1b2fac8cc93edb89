//! ICMPv6 with neighbour discovery, from smoltcp's `wire` (zero-copy `Packet` view, `Repr`
//! with the pseudo-header checksum, and NDP's solicitations, advertisements and options).
pub use smoltcp::wire::{
    Icmpv6Message as Message, Icmpv6Packet as Packet, Icmpv6Repr as Repr,
    NdiscNeighborFlags as NeighborFlags, NdiscRepr, RawHardwareAddress,
};
