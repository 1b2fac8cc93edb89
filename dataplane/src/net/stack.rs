//! The per-lcore IP stack: a [`Handler`] that answers ARP, neighbour solicitations and echo
//! requests, resolves neighbours itself, and routes what it sends.
//!
//! Frames are handled in place: a received frame's Ethernet header (and 802.1Q tag) is stripped,
//! the L3 handler rewrites the packet into its answer, and the send path prepends the L2 header
//! for the port it leaves by, after routing and neighbour resolution. The IPv4 header checksum
//! is left to the port when it offers the offload. Nothing allocates: answers reuse the received
//! buffer, and frames the appliance originates come from the port's pool.
//!
//! Each lcore has its own neighbour caches. What one lcore learns is reported as a
//! [`NetEvent::Resolved`]; the control thread passes it to the others as
//! [`NetCommand::Neighbor`], so the packet path never shares mutable state.

use super::neighbor::{NeighborCache, Resolve, Solicit, State};
use crate::PacketBuf;
use crate::buf::{RxChecksum, TxOffload};
use crate::counters::DropReason;
use crate::lcore::{Handler, Io};
use crate::port::{Burst, MacAddr, PortQueue};
use crate::time::Instant;
use arrayvec::ArrayVec;
use core::time::Duration;
use crossbeam_channel::Sender;
use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, Icmpv4Message, Icmpv4Packet, Icmpv6Message, Icmpv6Packet,
    Icmpv6Repr, IpCidr, IpProtocol, Ipv4Address, Ipv4Cidr, Ipv4Packet, Ipv4Repr, Ipv6Address,
    Ipv6Cidr, Ipv6Packet, Ipv6Repr, NdiscNeighborFlags, NdiscRepr, RawHardwareAddress,
};
use std::net::IpAddr;

use wire::eth::{ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETHERTYPE_VLAN};
use wire::udp::ROCEV2_PORT as ROCEV2_UDP_PORT;
/// How often configured neighbours are checked and re-resolved.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// ICMP echo header length (type, code, checksum, ident, sequence).
const ECHO_HDR: usize = 8;

/// One port's addresses and neighbours to keep resolved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortNetConfig {
    /// 802.1Q VLAN id; frames without this tag are dropped, frames sent carry it.
    pub vlan: Option<u16>,
    /// 802.1Q priority (PCP) of frames sent when `vlan` is set.
    pub pcp: u8,
    /// IPv4 addresses with their prefixes.
    pub ipv4: Vec<Ipv4Cidr>,
    /// IPv6 addresses with their prefixes (a link-local address from the MAC is added).
    pub ipv6: Vec<Ipv6Cidr>,
    /// Neighbours to resolve at start and keep resolved (gateways, peers).
    pub probes: Vec<IpAddr>,
}

/// A static route: `dest` is reached through the neighbour `via`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// Destination prefix.
    pub dest: IpCidr,
    /// Next hop; must be on-link on one of the ports.
    pub via: IpAddr,
}

/// The stack's configuration (the same on every lcore).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetConfig {
    /// Per port, in port order.
    pub ports: Vec<PortNetConfig>,
    /// Static routes.
    pub routes: Vec<Route>,
    /// Neighbours per port per lcore.
    pub neighbor_capacity: usize,
}

/// Commands from the control thread.
#[derive(Debug)]
pub enum NetCommand {
    /// Another lcore learnt a neighbour.
    Neighbor {
        /// Port index.
        port: usize,
        /// Its address.
        ip: IpAddr,
        /// Its MAC.
        mac: MacAddr,
    },
    /// Send one ICMP or ICMPv6 echo request.
    Ping {
        /// Destination.
        dst: IpAddr,
        /// Echo identifier.
        ident: u16,
        /// Echo sequence number.
        seq: u16,
        /// Payload bytes after the 8-byte timestamp.
        size: usize,
    },
    /// Report the neighbour caches.
    Neighbors(Sender<Vec<(usize, IpAddr, State)>>),
    /// Resolve the next hop towards `dst` (a [`NetEvent::Resolved`] follows when it
    /// answers, or at once if it is already known).
    Resolve {
        /// The destination.
        dst: IpAddr,
    },
    /// A port's link came up: solicit again for what is unresolved.
    LinkUp {
        /// Port index.
        port: usize,
    },
}

/// Events for the control thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetEvent {
    /// A neighbour became reachable or changed its MAC.
    Resolved {
        /// Port index.
        port: usize,
        /// Its address.
        ip: IpAddr,
        /// Its MAC.
        mac: MacAddr,
    },
    /// An echo reply to one of our pings.
    EchoReply {
        /// Who answered.
        from: IpAddr,
        /// Echo identifier.
        ident: u16,
        /// Echo sequence number.
        seq: u16,
        /// Round-trip time.
        rtt: Duration,
    },
    /// A ping could not be sent.
    PingFailed {
        /// Destination.
        dst: IpAddr,
        /// Why.
        reason: DropReason,
    },
}

#[derive(Debug)]
struct PortState<B> {
    vlan: Option<u16>,
    pcp: u8,
    ipv4: Vec<Ipv4Cidr>,
    ipv6: Vec<Ipv6Cidr>,
    /// MACs of the solicited-node groups of our IPv6 addresses, and all-nodes.
    mcast: Vec<MacAddr>,
    probes: Vec<IpAddr>,
    neigh: NeighborCache<B>,
}

impl<B> PortState<B> {
    fn has_v4(&self, a: Ipv4Address) -> bool {
        self.ipv4.iter().any(|c| c.address() == a)
    }
    fn has_v6(&self, a: Ipv6Address) -> bool {
        self.ipv6.iter().any(|c| c.address() == a)
    }
    fn on_link(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(a) => self.ipv4.iter().any(|c| c.contains_addr(&a)),
            IpAddr::V6(a) => self.ipv6.iter().any(|c| c.contains_addr(&a)),
        }
    }
    /// Our address to send from towards `dst` on this port.
    fn src_v4(&self, dst: Ipv4Address) -> Option<Ipv4Address> {
        self.ipv4
            .iter()
            .find(|c| c.contains_addr(&dst))
            .or(self.ipv4.first())
            .map(|c| c.address())
    }
    fn src_v6(&self, dst: Ipv6Address) -> Option<Ipv6Address> {
        // The link-local address is first; prefer an address whose prefix holds `dst`.
        self.ipv6
            .iter()
            .rev()
            .find(|c| c.contains_addr(&dst))
            .or(self.ipv6.first())
            .map(|c| c.address())
    }
    fn l2_len(&self) -> usize {
        if self.vlan.is_some() { 18 } else { 14 }
    }
}

/// The link-local address derived from a MAC (modified EUI-64).
pub fn link_local(mac: MacAddr) -> Ipv6Address {
    let m = mac.0;
    Ipv6Address::new(
        0xfe80,
        0,
        0,
        0,
        u16::from_be_bytes([m[0] ^ 2, m[1]]),
        u16::from_be_bytes([m[2], 0xff]),
        u16::from_be_bytes([0xfe, m[3]]),
        u16::from_be_bytes([m[4], m[5]]),
    )
}

/// The solicited-node multicast group of an address.
pub fn solicited_node(a: Ipv6Address) -> Ipv6Address {
    let o = a.octets();
    Ipv6Address::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | o[13] as u16,
        u16::from_be_bytes([o[14], o[15]]),
    )
}

/// The Ethernet multicast MAC of an IPv6 multicast group.
pub fn multicast_mac(group: Ipv6Address) -> MacAddr {
    let o = group.octets();
    MacAddr([0x33, 0x33, o[12], o[13], o[14], o[15]])
}

/// The stack of one lcore.
#[derive(Debug)]
pub struct NetStack<B> {
    ports: Vec<PortState<B>>,
    routes: Vec<Route>,
    events: Option<Sender<NetEvent>>,
    next_probe: Instant,
    solicits: ArrayVec<Solicit, 16>,
}

impl<B: PacketBuf> NetStack<B> {
    /// A stack for ports with these MACs (in port order). `events`, if given, receives
    /// [`NetEvent`]s; it is only ever `try_send`ed to.
    pub fn new(cfg: &NetConfig, macs: &[MacAddr], events: Option<Sender<NetEvent>>) -> Self {
        let cap = cfg.neighbor_capacity.max(16);
        let ports = cfg
            .ports
            .iter()
            .zip(macs)
            .map(|(p, mac)| {
                let mut ipv6 = vec![Ipv6Cidr::new(link_local(*mac), 64)];
                ipv6.extend(p.ipv6.iter().copied());
                let mut mcast = vec![multicast_mac(smoltcp::wire::IPV6_LINK_LOCAL_ALL_NODES)];
                mcast.extend(
                    ipv6.iter()
                        .map(|c| multicast_mac(solicited_node(c.address()))),
                );
                PortState {
                    vlan: p.vlan,
                    pcp: p.pcp,
                    ipv4: p.ipv4.clone(),
                    ipv6,
                    mcast,
                    probes: p.probes.clone(),
                    neigh: NeighborCache::new(cap),
                }
            })
            .collect();
        NetStack {
            ports,
            routes: cfg.routes.clone(),
            events,
            next_probe: Instant::ZERO,
            solicits: ArrayVec::new(),
        }
    }

    fn event(&self, e: NetEvent) {
        if let Some(tx) = &self.events {
            let _ = tx.try_send(e);
        }
    }

    /// Output port and next hop for `dst`; link-local IPv6 stays on `in_port`.
    pub fn route(&self, dst: IpAddr, in_port: Option<usize>) -> Option<(usize, IpAddr)> {
        if let (IpAddr::V6(a), Some(p)) = (dst, in_port)
            && a.is_unicast_link_local()
        {
            return Some((p, dst));
        }
        if let Some(p) = self.ports.iter().position(|p| p.on_link(dst)) {
            return Some((p, dst));
        }
        let best = self
            .routes
            .iter()
            .filter(|r| r.dest.contains_addr(&dst.into()))
            .max_by_key(|r| r.dest.prefix_len())?;
        let port = self.ports.iter().position(|p| p.on_link(best.via))?;
        Some((port, best.via))
    }

    /// Our address on `port` to send from towards `dst` (same family), if the port has one.
    pub fn source_ip(&self, port: usize, dst: IpAddr) -> Option<IpAddr> {
        let p = self.ports.get(port)?;
        match dst {
            IpAddr::V4(d) => p.src_v4(d).map(IpAddr::V4),
            IpAddr::V6(d) => p.src_v6(d).map(IpAddr::V6),
        }
    }

    /// The VLAN id and priority frames on `port` carry, if tagged.
    pub fn vlan(&self, port: usize) -> Option<(u16, u8)> {
        let p = self.ports.get(port)?;
        p.vlan.map(|v| (v, p.pcp))
    }

    fn handle_frame<Q: PortQueue<Buf = B>>(&mut self, port: usize, mut buf: B, io: &mut Io<'_, Q>) {
        let our_mac = io.info(port).mac;
        let d = buf.data();
        if d.len() < 14 {
            return io.drop_frame(DropReason::Malformed, buf);
        }
        let dst = MacAddr::from_bytes(&d[0..6]);
        let src = MacAddr::from_bytes(&d[6..12]);
        let mut ethertype = u16::from_be_bytes([d[12], d[13]]);
        let mut l2 = 14;
        let ps = &self.ports[port];
        if ethertype == ETHERTYPE_VLAN {
            if d.len() < 18 {
                return io.drop_frame(DropReason::Malformed, buf);
            }
            let vid = u16::from_be_bytes([d[14], d[15]]) & 0x0fff;
            ethertype = u16::from_be_bytes([d[16], d[17]]);
            l2 = 18;
            if ps.vlan != Some(vid) {
                return io.drop_frame(DropReason::VlanMismatch, buf);
            }
        } else if ps.vlan.is_some() {
            return io.drop_frame(DropReason::VlanMismatch, buf);
        }
        if dst != our_mac && !dst.is_broadcast() && !ps.mcast.contains(&dst) {
            return io.drop_frame(DropReason::NotForUs, buf);
        }
        buf.adj(l2);
        match ethertype {
            ETHERTYPE_ARP => self.handle_arp(port, buf, io),
            ETHERTYPE_IPV4 => self.handle_ipv4(port, buf, io),
            ETHERTYPE_IPV6 => self.handle_ipv6(port, src, buf, io),
            _ => io.drop_frame(DropReason::UnsupportedProtocol, buf),
        }
    }

    fn handle_arp<Q: PortQueue<Buf = B>>(&mut self, port: usize, mut buf: B, io: &mut Io<'_, Q>) {
        let repr = ArpPacket::new_checked(buf.data()).and_then(|p| ArpRepr::parse(&p));
        let Ok(ArpRepr::EthernetIpv4 {
            operation,
            source_hardware_addr: sha,
            source_protocol_addr: spa,
            target_protocol_addr: tpa,
            ..
        }) = repr
        else {
            return io.drop_frame(DropReason::Malformed, buf);
        };
        let for_us = self.ports[port].has_v4(tpa);
        if !spa.is_unspecified() && sha.is_unicast() {
            self.learn(port, IpAddr::V4(spa), sha, for_us, io);
        }
        if !for_us {
            return io.drop_frame(DropReason::NotForUs, buf);
        }
        if operation != ArpOperation::Request {
            return; // an answer, consumed by learn()
        }
        let reply = ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Reply,
            source_hardware_addr: io.info(port).mac,
            source_protocol_addr: tpa,
            target_hardware_addr: sha,
            target_protocol_addr: spa,
        };
        buf.set_len(reply.buffer_len());
        reply.emit(&mut ArpPacket::new_unchecked(buf.data_mut()));
        io.counters.arp_replies_sent.inc();
        self.push_l2(port, buf, sha, ETHERTYPE_ARP, io);
    }

    /// Records a neighbour, reports it, and sends the frames that waited for it.
    fn learn<Q: PortQueue<Buf = B>>(
        &mut self,
        port: usize,
        ip: IpAddr,
        mac: MacAddr,
        create: bool,
        io: &mut Io<'_, Q>,
    ) {
        let learned = self.ports[port].neigh.learn(ip, mac, io.now, create);
        if learned.changed {
            self.event(NetEvent::Resolved { port, ip, mac });
        }
        for b in learned.held {
            self.push_ip(port, b, mac, io);
        }
    }

    fn handle_ipv4<Q: PortQueue<Buf = B>>(&mut self, port: usize, mut buf: B, io: &mut Io<'_, Q>) {
        let Ok(ip) = Ipv4Packet::new_checked(buf.data()) else {
            return io.drop_frame(DropReason::Malformed, buf);
        };
        if ip.version() != 4 {
            return io.drop_frame(DropReason::Malformed, buf);
        }
        let cksum_ok = match buf.rx_ip_checksum() {
            RxChecksum::Good => true,
            RxChecksum::Bad => false,
            RxChecksum::Unknown => ip.verify_checksum(),
        };
        if !cksum_ok {
            return io.drop_frame(DropReason::BadChecksum, buf);
        }
        let (dst, src, proto) = (ip.dst_addr(), ip.src_addr(), ip.next_header());
        let (hl, total) = (ip.header_len() as usize, ip.total_len() as usize);
        let frag = ip.more_frags() || ip.frag_offset() != 0;
        if !self.ports[port].has_v4(dst) {
            return io.drop_frame(DropReason::NotForUs, buf);
        }
        if frag {
            return io.drop_frame(DropReason::Fragment, buf);
        }
        buf.set_len(total);
        match proto {
            IpProtocol::Icmp => self.handle_icmpv4(port, buf, hl, src, dst, io),
            IpProtocol::Udp if is_roce(&buf.data()[hl..]) => {
                io.counters.roce_rx_packets.inc();
                io.drop_frame(DropReason::UnsupportedProtocol, buf)
            }
            _ => io.drop_frame(DropReason::UnsupportedProtocol, buf),
        }
    }

    fn handle_icmpv4<Q: PortQueue<Buf = B>>(
        &mut self,
        port: usize,
        mut buf: B,
        hl: usize,
        src: Ipv4Address,
        dst: Ipv4Address,
        io: &mut Io<'_, Q>,
    ) {
        let Ok(icmp) = Icmpv4Packet::new_checked(&buf.data()[hl..]) else {
            return io.drop_frame(DropReason::Malformed, buf);
        };
        if !icmp.verify_checksum() {
            return io.drop_frame(DropReason::BadChecksum, buf);
        }
        match icmp.msg_type() {
            Icmpv4Message::EchoRequest => {
                let d = buf.data_mut();
                let mut ip = Ipv4Packet::new_unchecked(&mut d[..]);
                ip.set_src_addr(dst);
                ip.set_dst_addr(src);
                ip.set_hop_limit(64);
                let mut icmp = Icmpv4Packet::new_unchecked(&mut d[hl..]);
                icmp.set_msg_type(Icmpv4Message::EchoReply);
                icmp.fill_checksum();
                io.counters.echo_replies_sent.inc();
                self.route_and_send(IpAddr::V4(src), Some(port), buf, io);
            }
            Icmpv4Message::EchoReply => {
                let (ident, seq) = (icmp.echo_ident(), icmp.echo_seq_no());
                let rtt = echo_rtt(icmp.data(), io.now);
                io.counters.echo_replies_received.inc();
                self.event(NetEvent::EchoReply {
                    from: IpAddr::V4(src),
                    ident,
                    seq,
                    rtt,
                });
            }
            _ => io.drop_frame(DropReason::UnsupportedProtocol, buf),
        }
    }

    fn handle_ipv6<Q: PortQueue<Buf = B>>(
        &mut self,
        port: usize,
        eth_src: MacAddr,
        mut buf: B,
        io: &mut Io<'_, Q>,
    ) {
        let Ok(ip) = Ipv6Packet::new_checked(buf.data()) else {
            return io.drop_frame(DropReason::Malformed, buf);
        };
        if ip.version() != 6 {
            return io.drop_frame(DropReason::Malformed, buf);
        }
        let (src, dst, nh, hop) = (
            ip.src_addr(),
            ip.dst_addr(),
            ip.next_header(),
            ip.hop_limit(),
        );
        let total = 40 + ip.payload_len() as usize;
        let ps = &self.ports[port];
        let for_us = ps.has_v6(dst)
            || dst == smoltcp::wire::IPV6_LINK_LOCAL_ALL_NODES
            || ps.ipv6.iter().any(|c| solicited_node(c.address()) == dst);
        if !for_us {
            return io.drop_frame(DropReason::NotForUs, buf);
        }
        buf.set_len(total);
        match nh {
            IpProtocol::Icmpv6 => {}
            IpProtocol::Udp if is_roce(&buf.data()[40..]) => {
                io.counters.roce_rx_packets.inc();
                return io.drop_frame(DropReason::UnsupportedProtocol, buf);
            }
            _ => return io.drop_frame(DropReason::UnsupportedProtocol, buf),
        }
        let caps = ChecksumCapabilities::default();
        let icmp = Icmpv6Packet::new_checked(&buf.data()[40..]);
        let repr = match icmp
            .as_ref()
            .map(|p| Icmpv6Repr::parse(&src, &dst, p, &caps))
        {
            Ok(Ok(r)) => r,
            Ok(Err(_)) if icmp.as_ref().is_ok_and(|p| !p.verify_checksum(&src, &dst)) => {
                return io.drop_frame(DropReason::BadChecksum, buf);
            }
            _ => return io.drop_frame(DropReason::Malformed, buf),
        };
        match repr {
            Icmpv6Repr::Ndisc(NdiscRepr::NeighborSolicit {
                target_addr,
                lladdr,
            }) => {
                if hop != 255 {
                    return io.drop_frame(DropReason::Malformed, buf);
                }
                if !self.ports[port].has_v6(target_addr) {
                    return io.drop_frame(DropReason::NotForUs, buf);
                }
                let peer_mac = lladdr.and_then(|l| l.parse(smoltcp::phy::Medium::Ethernet).ok());
                let peer_mac = match peer_mac {
                    Some(smoltcp::wire::HardwareAddress::Ethernet(m)) => m,
                    _ => eth_src,
                };
                if !src.is_unspecified() {
                    self.learn(port, IpAddr::V6(src), peer_mac, true, io);
                }
                let (reply_dst, flags) = if src.is_unspecified() {
                    (
                        smoltcp::wire::IPV6_LINK_LOCAL_ALL_NODES,
                        NdiscNeighborFlags::OVERRIDE,
                    )
                } else {
                    (
                        src,
                        NdiscNeighborFlags::SOLICITED | NdiscNeighborFlags::OVERRIDE,
                    )
                };
                let na = Icmpv6Repr::Ndisc(NdiscRepr::NeighborAdvert {
                    flags,
                    target_addr,
                    lladdr: Some(RawHardwareAddress::from(io.info(port).mac)),
                });
                let dst_mac = if src.is_unspecified() {
                    multicast_mac(reply_dst)
                } else {
                    peer_mac
                };
                emit_icmpv6(&mut buf, target_addr, reply_dst, 255, &na);
                io.counters.nd_adverts_sent.inc();
                self.push_ip(port, buf, dst_mac, io);
            }
            Icmpv6Repr::Ndisc(NdiscRepr::NeighborAdvert {
                target_addr,
                lladdr,
                ..
            }) => {
                let mac = match lladdr.and_then(|l| l.parse(smoltcp::phy::Medium::Ethernet).ok()) {
                    Some(smoltcp::wire::HardwareAddress::Ethernet(m)) => m,
                    _ => eth_src,
                };
                self.learn(port, IpAddr::V6(target_addr), mac, false, io);
            }
            Icmpv6Repr::EchoRequest { .. } => {
                if dst.is_multicast() {
                    return io.drop_frame(DropReason::UnsupportedProtocol, buf);
                }
                let d = buf.data_mut();
                let mut ip = Ipv6Packet::new_unchecked(&mut d[..]);
                ip.set_src_addr(dst);
                ip.set_dst_addr(src);
                ip.set_hop_limit(64);
                let mut icmp = Icmpv6Packet::new_unchecked(&mut d[40..]);
                icmp.set_msg_type(Icmpv6Message::EchoReply);
                icmp.fill_checksum(&dst, &src);
                io.counters.echo_replies_sent.inc();
                self.route_and_send(IpAddr::V6(src), Some(port), buf, io);
            }
            Icmpv6Repr::EchoReply {
                ident,
                seq_no,
                data,
            } => {
                let rtt = echo_rtt(data, io.now);
                io.counters.echo_replies_received.inc();
                self.event(NetEvent::EchoReply {
                    from: IpAddr::V6(src),
                    ident,
                    seq: seq_no,
                    rtt,
                });
            }
            _ => io.drop_frame(DropReason::UnsupportedProtocol, buf),
        }
    }

    /// Routes an IP packet (no L2 header yet), resolving the next hop if needed.
    fn route_and_send<Q: PortQueue<Buf = B>>(
        &mut self,
        dst: IpAddr,
        in_port: Option<usize>,
        buf: B,
        io: &mut Io<'_, Q>,
    ) {
        let Some((port, nh)) = self.route(dst, in_port) else {
            return io.drop_frame(DropReason::NoRoute, buf);
        };
        match self.ports[port].neigh.lookup_or_hold(nh, buf, io.now) {
            Resolve::Send(b, mac) => self.push_ip(port, b, mac, io),
            Resolve::Held { solicit } => {
                if solicit {
                    self.solicit(
                        port,
                        Solicit {
                            ip: nh,
                            unicast: None,
                        },
                        io,
                    );
                }
            }
            Resolve::Full(b) => io.drop_frame(DropReason::HoldQueueFull, b),
        }
    }

    /// Sends an IP packet to `mac`, finishing the IPv4 checksum (or leaving it to the port).
    fn push_ip<Q: PortQueue<Buf = B>>(
        &mut self,
        port: usize,
        mut buf: B,
        mac: MacAddr,
        io: &mut Io<'_, Q>,
    ) {
        let v4 = buf.data().first().is_some_and(|b| b >> 4 == 4);
        let offload = v4 && io.info(port).caps.tx_ipv4_cksum;
        let mut l3_len = 40;
        if v4 {
            let mut ip = Ipv4Packet::new_unchecked(buf.data_mut());
            l3_len = ip.header_len() as u16;
            if offload {
                ip.set_checksum(0);
            } else {
                ip.fill_checksum();
            }
        }
        let ethertype = if v4 { ETHERTYPE_IPV4 } else { ETHERTYPE_IPV6 };
        let l2_len = self.ports[port].l2_len() as u16;
        if offload {
            buf.request_tx_offload(TxOffload {
                l2_len,
                l3_len,
                ipv4_cksum: true,
                ..Default::default()
            });
        }
        self.push_l2(port, buf, mac, ethertype, io);
    }

    /// Prepends the Ethernet header (with the port's VLAN tag) and queues the frame.
    fn push_l2<Q: PortQueue<Buf = B>>(
        &mut self,
        port: usize,
        mut buf: B,
        dst: MacAddr,
        ethertype: u16,
        io: &mut Io<'_, Q>,
    ) {
        let ps = &self.ports[port];
        let src = io.info(port).mac;
        let Some(h) = buf.prepend(ps.l2_len()) else {
            return io.drop_frame(DropReason::NoBuffer, buf);
        };
        h[0..6].copy_from_slice(dst.as_bytes());
        h[6..12].copy_from_slice(src.as_bytes());
        if let Some(vid) = ps.vlan {
            h[12..14].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
            h[14..16].copy_from_slice(&(((ps.pcp as u16) << 13) | vid).to_be_bytes());
            h[16..18].copy_from_slice(&ethertype.to_be_bytes());
        } else {
            h[12..14].copy_from_slice(&ethertype.to_be_bytes());
        }
        // Ethernet's minimum frame is 60 bytes before the FCS.
        if buf.len() < 60 {
            let short = buf.len();
            if let Some(pad) = buf.append(60 - short) {
                pad.fill(0);
            }
        }
        io.send(port, buf);
    }

    /// Sends an ARP request or a neighbour solicitation.
    fn solicit<Q: PortQueue<Buf = B>>(&mut self, port: usize, s: Solicit, io: &mut Io<'_, Q>) {
        let Some(mut buf) = io.alloc(port) else {
            return;
        };
        let mac = io.info(port).mac;
        match s.ip {
            IpAddr::V4(tpa) => {
                let Some(spa) = self.ports[port].src_v4(tpa) else {
                    return io.drop_frame(DropReason::NoRoute, buf);
                };
                let req = ArpRepr::EthernetIpv4 {
                    operation: ArpOperation::Request,
                    source_hardware_addr: mac,
                    source_protocol_addr: spa,
                    target_hardware_addr: MacAddr([0; 6]),
                    target_protocol_addr: tpa,
                };
                buf.set_len(req.buffer_len());
                req.emit(&mut ArpPacket::new_unchecked(buf.data_mut()));
                io.counters.arp_requests_sent.inc();
                self.push_l2(
                    port,
                    buf,
                    s.unicast.unwrap_or(MacAddr::BROADCAST),
                    ETHERTYPE_ARP,
                    io,
                );
            }
            IpAddr::V6(target) => {
                let Some(src) = self.ports[port].src_v6(target) else {
                    return io.drop_frame(DropReason::NoRoute, buf);
                };
                let (dst, dst_mac) = match s.unicast {
                    Some(m) => (target, m),
                    None => (
                        solicited_node(target),
                        multicast_mac(solicited_node(target)),
                    ),
                };
                let ns = Icmpv6Repr::Ndisc(NdiscRepr::NeighborSolicit {
                    target_addr: target,
                    lladdr: Some(RawHardwareAddress::from(mac)),
                });
                emit_icmpv6(&mut buf, src, dst, 255, &ns);
                io.counters.nd_solicits_sent.inc();
                self.push_ip(port, buf, dst_mac, io);
            }
        }
    }

    fn ping<Q: PortQueue<Buf = B>>(
        &mut self,
        dst: IpAddr,
        ident: u16,
        seq: u16,
        size: usize,
        io: &mut Io<'_, Q>,
    ) {
        let fail = |me: &Self, reason| me.event(NetEvent::PingFailed { dst, reason });
        let Some((port, _)) = self.route(dst, None) else {
            return fail(self, DropReason::NoRoute);
        };
        let payload = 8 + size;
        let ip_len = match dst {
            IpAddr::V4(_) => 20,
            IpAddr::V6(_) => 40,
        };
        if ip_len + ECHO_HDR + payload > io.info(port).mtu as usize {
            return fail(self, DropReason::Malformed);
        }
        let Some(mut buf) = io.alloc(port) else {
            return fail(self, DropReason::NoBuffer);
        };
        buf.set_len(ip_len + ECHO_HDR + payload);
        let now = io.now;
        let d = buf.data_mut();
        {
            let e = &mut d[ip_len..];
            e[0] = 0;
            e[1] = 0;
            e[2..4].fill(0);
            e[4..6].copy_from_slice(&ident.to_be_bytes());
            e[6..8].copy_from_slice(&seq.to_be_bytes());
            e[8..16].copy_from_slice(&now.as_nanos().to_le_bytes());
            for (i, b) in e[16..].iter_mut().enumerate() {
                *b = i as u8;
            }
        }
        match dst {
            IpAddr::V4(a) => {
                let Some(src) = self.ports[port].src_v4(a) else {
                    return fail(self, DropReason::NoRoute);
                };
                let repr = Ipv4Repr {
                    src_addr: src,
                    dst_addr: a,
                    next_header: IpProtocol::Icmp,
                    payload_len: ECHO_HDR + payload,
                    hop_limit: 64,
                };
                repr.emit(
                    &mut Ipv4Packet::new_unchecked(&mut d[..]),
                    &ChecksumCapabilities::ignored(),
                );
                let mut icmp = Icmpv4Packet::new_unchecked(&mut d[20..]);
                icmp.set_msg_type(Icmpv4Message::EchoRequest);
                icmp.fill_checksum();
            }
            IpAddr::V6(a) => {
                let Some(src) = self.ports[port].src_v6(a) else {
                    return fail(self, DropReason::NoRoute);
                };
                let repr = Ipv6Repr {
                    src_addr: src,
                    dst_addr: a,
                    next_header: IpProtocol::Icmpv6,
                    payload_len: ECHO_HDR + payload,
                    hop_limit: 64,
                };
                repr.emit(&mut Ipv6Packet::new_unchecked(&mut d[..]));
                let mut icmp = Icmpv6Packet::new_unchecked(&mut d[40..]);
                icmp.set_msg_type(Icmpv6Message::EchoRequest);
                icmp.fill_checksum(&src, &a);
            }
        }
        io.counters.echo_requests_sent.inc();
        self.route_and_send(dst, None, buf, io);
    }
}

/// Writes an IPv6 header and an ICMPv6 message into `buf`, which becomes exactly that packet.
fn emit_icmpv6<B: PacketBuf>(
    buf: &mut B,
    src: Ipv6Address,
    dst: Ipv6Address,
    hop: u8,
    repr: &Icmpv6Repr<'_>,
) {
    let len = repr.buffer_len();
    buf.set_len(40 + len);
    let d = buf.data_mut();
    Ipv6Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: IpProtocol::Icmpv6,
        payload_len: len,
        hop_limit: hop,
    }
    .emit(&mut Ipv6Packet::new_unchecked(&mut d[..]));
    repr.emit(
        &src,
        &dst,
        &mut Icmpv6Packet::new_unchecked(&mut d[40..]),
        &ChecksumCapabilities::default(),
    );
}

/// True for a UDP datagram to the RoCEv2 port.
fn is_roce(udp: &[u8]) -> bool {
    udp.len() >= 8 && u16::from_be_bytes([udp[2], udp[3]]) == ROCEV2_UDP_PORT
}

/// Round-trip time from the send timestamp our pings carry.
fn echo_rtt(data: &[u8], now: Instant) -> Duration {
    match data.get(0..8) {
        Some(t) => now.saturating_since(Instant(u64::from_le_bytes(
            t.try_into().unwrap_or_default(),
        ))),
        None => Duration::ZERO,
    }
}

impl<Q: PortQueue> Handler<Q> for NetStack<Q::Buf> {
    type Command = NetCommand;

    fn on_burst(&mut self, port: usize, burst: &mut Burst<Q::Buf>, io: &mut Io<'_, Q>) {
        for buf in burst.drain(..) {
            self.handle_frame(port, buf, io);
        }
    }

    fn on_poll(&mut self, io: &mut Io<'_, Q>) {
        let now = io.now;
        if now >= self.next_probe {
            self.next_probe = now + PROBE_INTERVAL;
            for port in 0..self.ports.len() {
                for i in 0..self.ports[port].probes.len() {
                    let ip = self.ports[port].probes[i];
                    if self.ports[port].neigh.ensure(ip, now) {
                        self.solicit(port, Solicit { ip, unicast: None }, io);
                    }
                }
            }
        }
        for port in 0..self.ports.len() {
            // Nearly always nothing is due: skip moving the solicit buffer around (it showed as
            // 15 % of a busy lcore as a memcpy).
            if !self.ports[port].neigh.due(now) {
                continue;
            }
            let mut solicits = core::mem::take(&mut self.solicits);
            let dropped = self.ports[port].neigh.poll(now, &mut solicits);
            io.counters
                .count_drop(DropReason::NeighborUnreachable, dropped as u64);
            for s in solicits.drain(..) {
                self.solicit(port, s, io);
            }
            self.solicits = solicits;
        }
    }

    fn on_command(&mut self, cmd: NetCommand, io: &mut Io<'_, Q>) {
        match cmd {
            NetCommand::Neighbor { port, ip, mac } => {
                if port < self.ports.len() {
                    for b in self.ports[port].neigh.install(ip, mac, io.now) {
                        self.push_ip(port, b, mac, io);
                    }
                }
            }
            NetCommand::Ping {
                dst,
                ident,
                seq,
                size,
            } => self.ping(dst, ident, seq, size, io),
            NetCommand::Resolve { dst } => {
                if let Some((port, hop)) = self.route(dst, None) {
                    let known = self.ports[port]
                        .neigh
                        .entries()
                        .find_map(|(ip, st)| match st {
                            State::Reachable { mac, .. } | State::Probe { mac, .. }
                                if ip == hop =>
                            {
                                Some(mac)
                            }
                            _ => None,
                        });
                    match known {
                        Some(mac) => self.event(NetEvent::Resolved { port, ip: hop, mac }),
                        None => {
                            if self.ports[port].neigh.ensure(hop, io.now) {
                                self.solicit(
                                    port,
                                    Solicit {
                                        ip: hop,
                                        unicast: None,
                                    },
                                    io,
                                );
                            }
                        }
                    }
                }
            }
            NetCommand::LinkUp { port } => {
                if let Some(p) = self.ports.get_mut(port) {
                    p.neigh.link_up(io.now);
                }
            }

            NetCommand::Neighbors(reply) => {
                let v = self
                    .ports
                    .iter()
                    .enumerate()
                    .flat_map(|(i, p)| p.neigh.entries().map(move |(ip, s)| (i, ip, s)))
                    .collect();
                let _ = reply.send(v);
            }
        }
    }

    fn shutdown(&mut self) {
        for p in &mut self.ports {
            p.neigh.clear();
        }
    }
}
