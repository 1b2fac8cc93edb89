//! ARP, from smoltcp's `wire` (zero-copy `Packet` view and `Repr`, allocation-free, fuzzed
//! upstream). The appliance's IP stack (dataplane's `net`) answers and sends ARP with these.
pub use smoltcp::wire::{
    ArpHardware as Hardware, ArpOperation as Operation, ArpPacket as Packet, ArpRepr as Repr,
};
