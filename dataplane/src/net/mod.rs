//! The appliance's own IP presence on its ports: ARP, IPv6 neighbour discovery, ICMP and ICMPv6
//! echo, static routes and 802.1Q, so that hosts and switches see a well-behaved endpoint.
pub mod neighbor;
pub mod stack;

pub use smoltcp::wire::{IpCidr, Ipv4Cidr, Ipv6Cidr};
pub use stack::{NetCommand, NetConfig, NetEvent, NetStack, PortNetConfig, Route};

#[cfg(test)]
mod tests;
