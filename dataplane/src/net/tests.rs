//! The IP stack driven through a real worker loop over an in-memory link, with a manual clock:
//! a test plays the Linux host on the other end of the cable.

use super::*;
use crate::buf::HeapBuf;
use crate::counters::{DropReason, LcoreCounters};
use crate::lcore::{Command, LcoreId, ManualClock, Worker};
use crate::port::mem::{MemQueue, link};
use crate::port::{Burst, MacAddr, PortCaps, PortId, PortInfo};
use crossbeam_channel::{Receiver, Sender, unbounded};
use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

const DUT_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
const HOST_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 9]);
const DUT_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const HOST_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 9);
const DUT_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1);
const HOST_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 9);

struct Harness {
    w: Worker<MemQueue, NetStack<HeapBuf>, ManualClock>,
    host: MemQueue,
    clock: ManualClock,
    counters: Arc<LcoreCounters>,
    cmd: Sender<Command<NetCommand>>,
    events: Receiver<NetEvent>,
    rx: Burst<HeapBuf>,
}

fn port_cfg() -> PortNetConfig {
    PortNetConfig {
        ipv4: vec![Ipv4Cidr::new(DUT_V4, 24)],
        ipv6: vec![Ipv6Cidr::new(DUT_V6, 64)],
        ..Default::default()
    }
}

impl Harness {
    fn new(port: PortNetConfig, routes: Vec<Route>, caps: PortCaps) -> Self {
        let dut = PortInfo {
            id: PortId(0),
            mac: DUT_MAC,
            mtu: 1500,
            caps,
        };
        let host = PortInfo {
            id: PortId(1),
            mac: HOST_MAC,
            mtu: 1500,
            caps: PortCaps::default(),
        };
        let (dq, hq) = link(dut, host, 256);
        let (ev_tx, events) = unbounded();
        let cfg = NetConfig {
            ports: vec![port],
            routes,
            neighbor_capacity: 64,
        };
        let stack = NetStack::new(&cfg, &[DUT_MAC], Some(ev_tx));
        let clock = ManualClock::default();
        clock.set(crate::Instant(1_000_000_000));
        let counters = Arc::new(LcoreCounters::default());
        let (cmd, cmd_rx) = unbounded();
        let w = Worker::new(
            LcoreId(0),
            vec![dq],
            stack,
            clock.clone(),
            counters.clone(),
            cmd_rx,
        );
        Harness {
            w,
            host: hq,
            clock,
            counters,
            cmd,
            events,
            rx: Burst::new(),
        }
    }

    fn std() -> Self {
        Self::new(port_cfg(), vec![], PortCaps::default())
    }

    fn step(&mut self) {
        assert!(self.w.poll_once(&mut self.rx));
    }

    /// Delivers a frame to the appliance and returns what it sent back.
    fn exchange(&mut self, frame: &[u8]) -> Vec<Vec<u8>> {
        assert!(self.host.send_frame(frame));
        self.step();
        self.drain()
    }

    fn drain(&mut self) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        while let Some(f) = self.host.recv_frame() {
            v.push(f);
        }
        v
    }

    fn command(&mut self, c: NetCommand) {
        self.cmd.send(Command::Handler(c)).unwrap();
        // The loop looks at its commands every COMMAND_POLL_INTERVAL iterations.
        for _ in 0..crate::lcore::COMMAND_POLL_INTERVAL {
            self.step();
        }
    }
}

fn eth(dst: MacAddr, src: MacAddr, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(dst.as_bytes());
    f.extend_from_slice(src.as_bytes());
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    while f.len() < 60 {
        f.push(0);
    }
    f
}

fn vlan_tag(frame: &[u8], vid: u16) -> Vec<u8> {
    let mut f = frame[..12].to_vec();
    f.extend_from_slice(&0x8100u16.to_be_bytes());
    f.extend_from_slice(&vid.to_be_bytes());
    f.extend_from_slice(&frame[12..]);
    f
}

fn arp(op: ArpOperation, sha: MacAddr, spa: Ipv4Addr, tha: MacAddr, tpa: Ipv4Addr) -> Vec<u8> {
    let r = ArpRepr::EthernetIpv4 {
        operation: op,
        source_hardware_addr: sha,
        source_protocol_addr: spa,
        target_hardware_addr: tha,
        target_protocol_addr: tpa,
    };
    let mut b = vec![0u8; r.buffer_len()];
    r.emit(&mut ArpPacket::new_unchecked(&mut b[..]));
    b
}

fn echo4(src: Ipv4Addr, dst: Ipv4Addr, seq: u16, data: &[u8]) -> Vec<u8> {
    let icmp = Icmpv4Repr::EchoRequest {
        ident: 0x1234,
        seq_no: seq,
        data,
    };
    let ip = Ipv4Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: IpProtocol::Icmp,
        payload_len: icmp.buffer_len(),
        hop_limit: 64,
    };
    let mut b = vec![0u8; ip.buffer_len() + icmp.buffer_len()];
    let caps = ChecksumCapabilities::default();
    ip.emit(&mut Ipv4Packet::new_unchecked(&mut b[..]), &caps);
    icmp.emit(&mut Icmpv4Packet::new_unchecked(&mut b[20..]), &caps);
    b
}

fn icmp6(src: Ipv6Addr, dst: Ipv6Addr, hop: u8, repr: &Icmpv6Repr<'_>) -> Vec<u8> {
    let ip = Ipv6Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: IpProtocol::Icmpv6,
        payload_len: repr.buffer_len(),
        hop_limit: hop,
    };
    let mut b = vec![0u8; 40 + repr.buffer_len()];
    ip.emit(&mut Ipv6Packet::new_unchecked(&mut b[..]));
    repr.emit(
        &src,
        &dst,
        &mut Icmpv6Packet::new_unchecked(&mut b[40..]),
        &ChecksumCapabilities::default(),
    );
    b
}

fn parse_arp(f: &[u8]) -> ArpRepr {
    let e = EthernetFrame::new_checked(f).unwrap();
    assert_eq!(e.ethertype(), EthernetProtocol::Arp);
    ArpRepr::parse(&ArpPacket::new_checked(e.payload()).unwrap()).unwrap()
}

#[test]
fn answers_arp_for_its_address_only() {
    let mut h = Harness::std();
    let req = eth(
        MacAddr::BROADCAST,
        HOST_MAC,
        0x0806,
        &arp(
            ArpOperation::Request,
            HOST_MAC,
            HOST_V4,
            MacAddr([0; 6]),
            DUT_V4,
        ),
    );
    let out = h.exchange(&req);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].len(), 60, "padded to the Ethernet minimum");
    let e = EthernetFrame::new_checked(&out[0][..]).unwrap();
    assert_eq!((e.dst_addr(), e.src_addr()), (HOST_MAC, DUT_MAC));
    assert_eq!(
        parse_arp(&out[0]),
        ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Reply,
            source_hardware_addr: DUT_MAC,
            source_protocol_addr: DUT_V4,
            target_hardware_addr: HOST_MAC,
            target_protocol_addr: HOST_V4,
        }
    );
    // It learnt the asker (as Linux does for requests addressed to it).
    assert!(matches!(
        h.events.try_recv(),
        Ok(NetEvent::Resolved { mac: HOST_MAC, .. })
    ));

    let other = eth(
        MacAddr::BROADCAST,
        HOST_MAC,
        0x0806,
        &arp(
            ArpOperation::Request,
            HOST_MAC,
            HOST_V4,
            MacAddr([0; 6]),
            Ipv4Addr::new(10, 0, 0, 77),
        ),
    );
    assert!(h.exchange(&other).is_empty());
    assert_eq!(h.counters.drops(DropReason::NotForUs), 1);
    assert_eq!(h.counters.arp_replies_sent.get(), 1);
}

#[test]
fn echo_reply_waits_for_resolution_then_is_correct() {
    let mut h = Harness::std();
    let payload: Vec<u8> = (0..200u16).map(|i| i as u8).collect();
    let req = eth(
        DUT_MAC,
        HOST_MAC,
        0x0800,
        &echo4(HOST_V4, DUT_V4, 7, &payload),
    );
    // The appliance does not know the host yet: it holds the reply and asks.
    let out = h.exchange(&req);
    assert_eq!(out.len(), 1);
    let ask = parse_arp(&out[0]);
    assert!(
        matches!(ask, ArpRepr::EthernetIpv4 { operation: ArpOperation::Request, target_protocol_addr, .. } if target_protocol_addr == HOST_V4)
    );
    assert_eq!(
        EthernetFrame::new_checked(&out[0][..]).unwrap().dst_addr(),
        MacAddr::BROADCAST
    );
    // The host answers; the held reply goes out.
    let ans = eth(
        DUT_MAC,
        HOST_MAC,
        0x0806,
        &arp(ArpOperation::Reply, HOST_MAC, HOST_V4, DUT_MAC, DUT_V4),
    );
    let out = h.exchange(&ans);
    assert_eq!(out.len(), 1);
    let e = EthernetFrame::new_checked(&out[0][..]).unwrap();
    assert_eq!(
        (e.dst_addr(), e.src_addr(), e.ethertype()),
        (HOST_MAC, DUT_MAC, EthernetProtocol::Ipv4)
    );
    let ip = Ipv4Packet::new_checked(e.payload()).unwrap();
    assert!(
        ip.verify_checksum(),
        "software IPv4 checksum on a port without offload"
    );
    let caps = ChecksumCapabilities::default();
    let ipr = Ipv4Repr::parse(&ip, &caps).unwrap();
    assert_eq!((ipr.src_addr, ipr.dst_addr), (DUT_V4, HOST_V4));
    let icmp = Icmpv4Repr::parse(&Icmpv4Packet::new_checked(ip.payload()).unwrap(), &caps).unwrap();
    assert_eq!(
        icmp,
        Icmpv4Repr::EchoReply {
            ident: 0x1234,
            seq_no: 7,
            data: &payload
        }
    );
    assert_eq!(h.counters.echo_replies_sent.get(), 1);
}

#[test]
fn ipv4_checksum_is_left_to_a_port_with_the_offload() {
    let caps = PortCaps {
        tx_ipv4_cksum: true,
        ..Default::default()
    };
    let mut h = Harness::new(port_cfg(), vec![], caps);
    h.command(NetCommand::Neighbor {
        port: 0,
        ip: IpAddr::V4(HOST_V4),
        mac: HOST_MAC,
    });
    let out = h.exchange(&eth(
        DUT_MAC,
        HOST_MAC,
        0x0800,
        &echo4(HOST_V4, DUT_V4, 1, b"x"),
    ));
    assert_eq!(out.len(), 1);
    let ip = Ipv4Packet::new_checked(&out[0][14..]).unwrap();
    assert_eq!(ip.checksum(), 0, "zero for the port to fill");
}

#[test]
fn bad_checksums_and_foreign_frames_are_dropped_and_counted() {
    let mut h = Harness::std();
    let mut pkt = echo4(HOST_V4, DUT_V4, 1, b"hello");
    pkt[10] ^= 0xff;
    assert!(h.exchange(&eth(DUT_MAC, HOST_MAC, 0x0800, &pkt)).is_empty());
    assert_eq!(h.counters.drops(DropReason::BadChecksum), 1);
    let other_mac = MacAddr([2, 0, 0, 0, 0, 0x55]);
    assert!(
        h.exchange(&eth(
            other_mac,
            HOST_MAC,
            0x0800,
            &echo4(HOST_V4, DUT_V4, 1, b"x")
        ))
        .is_empty()
    );
    assert_eq!(h.counters.drops(DropReason::NotForUs), 1);
    assert!(h.exchange(&[0u8; 10]).is_empty());
    assert_eq!(h.counters.drops(DropReason::Malformed), 1);
    // A short frame (vdevs deliver them unpadded) whose IPv4 header is cut off.
    let truncated =
        eth(DUT_MAC, HOST_MAC, 0x0800, &echo4(HOST_V4, DUT_V4, 1, b"x"))[..14 + 12].to_vec();
    assert!(h.exchange(&truncated).is_empty());
    assert_eq!(h.counters.drops(DropReason::Malformed), 2);
    assert!(
        h.exchange(&eth(DUT_MAC, HOST_MAC, 0x88cc, &[0; 46]))
            .is_empty()
    );
    assert_eq!(h.counters.drops(DropReason::UnsupportedProtocol), 1);
}

#[test]
fn neighbor_solicitation_gets_an_advertisement_and_ipv6_echo_works() {
    let mut h = Harness::std();
    let ns = Icmpv6Repr::Ndisc(NdiscRepr::NeighborSolicit {
        target_addr: DUT_V6,
        lladdr: Some(RawHardwareAddress::from(HOST_MAC)),
    });
    let group = stack::solicited_node(DUT_V6);
    let f = eth(
        stack::multicast_mac(group),
        HOST_MAC,
        0x86dd,
        &icmp6(HOST_V6, group, 255, &ns),
    );
    let out = h.exchange(&f);
    assert_eq!(out.len(), 1);
    let e = EthernetFrame::new_checked(&out[0][..]).unwrap();
    assert_eq!((e.dst_addr(), e.src_addr()), (HOST_MAC, DUT_MAC));
    let ip = Ipv6Packet::new_checked(e.payload()).unwrap();
    assert_eq!(
        (ip.src_addr(), ip.dst_addr(), ip.hop_limit()),
        (DUT_V6, HOST_V6, 255)
    );
    let na = Icmpv6Repr::parse(
        &DUT_V6,
        &HOST_V6,
        &Icmpv6Packet::new_checked(ip.payload()).unwrap(),
        &ChecksumCapabilities::default(),
    )
    .unwrap();
    assert_eq!(
        na,
        Icmpv6Repr::Ndisc(NdiscRepr::NeighborAdvert {
            flags: NdiscNeighborFlags::SOLICITED | NdiscNeighborFlags::OVERRIDE,
            target_addr: DUT_V6,
            lladdr: Some(RawHardwareAddress::from(DUT_MAC)),
        })
    );
    // The host is now known (from the solicitation's link-layer option): echo goes straight back.
    let echo = Icmpv6Repr::EchoRequest {
        ident: 9,
        seq_no: 3,
        data: b"ping6",
    };
    let out = h.exchange(&eth(
        DUT_MAC,
        HOST_MAC,
        0x86dd,
        &icmp6(HOST_V6, DUT_V6, 64, &echo),
    ));
    assert_eq!(out.len(), 1);
    let ip = Ipv6Packet::new_checked(&out[0][14..]).unwrap();
    let rep = Icmpv6Repr::parse(
        &DUT_V6,
        &HOST_V6,
        &Icmpv6Packet::new_checked(ip.payload()).unwrap(),
        &ChecksumCapabilities::default(),
    )
    .unwrap();
    assert_eq!(
        rep,
        Icmpv6Repr::EchoReply {
            ident: 9,
            seq_no: 3,
            data: b"ping6"
        }
    );
    // A solicitation with the wrong hop limit is not trusted.
    let bad = eth(
        stack::multicast_mac(group),
        HOST_MAC,
        0x86dd,
        &icmp6(HOST_V6, group, 64, &ns),
    );
    assert!(h.exchange(&bad).is_empty());
}

#[test]
fn vlan_port_takes_only_its_tag_and_tags_what_it_sends() {
    let cfg = PortNetConfig {
        vlan: Some(100),
        pcp: 3,
        ..port_cfg()
    };
    let mut h = Harness::new(cfg, vec![], PortCaps::default());
    let req = eth(
        MacAddr::BROADCAST,
        HOST_MAC,
        0x0806,
        &arp(
            ArpOperation::Request,
            HOST_MAC,
            HOST_V4,
            MacAddr([0; 6]),
            DUT_V4,
        ),
    );
    assert!(h.exchange(&req).is_empty(), "untagged frame on a VLAN port");
    assert!(h.exchange(&vlan_tag(&req, 200)).is_empty(), "another VLAN");
    assert_eq!(h.counters.drops(DropReason::VlanMismatch), 2);
    let out = h.exchange(&vlan_tag(&req, 100));
    assert_eq!(out.len(), 1);
    assert_eq!(&out[0][12..14], &[0x81, 0x00]);
    let tci = u16::from_be_bytes([out[0][14], out[0][15]]);
    assert_eq!((tci & 0xfff, tci >> 13), (100, 3));
    assert_eq!(&out[0][16..18], &[0x08, 0x06]);
    let mut untagged = out[0][..12].to_vec();
    untagged.extend_from_slice(&out[0][16..]);
    assert!(matches!(
        parse_arp(&untagged),
        ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Reply,
            ..
        }
    ));
}

#[test]
fn ping_routes_through_the_gateway_and_reports_the_reply() {
    let gw = Ipv4Addr::new(10, 0, 0, 254);
    let far = Ipv4Addr::new(192, 0, 2, 7);
    let route = Route {
        dest: IpCidr::Ipv4(Ipv4Cidr::new(Ipv4Addr::new(192, 0, 2, 0), 24)),
        via: IpAddr::V4(gw),
    };
    let mut h = Harness::new(port_cfg(), vec![route], PortCaps::default());
    h.command(NetCommand::Ping {
        dst: IpAddr::V4(far),
        ident: 5,
        seq: 1,
        size: 16,
    });
    let out = h.drain();
    assert_eq!(out.len(), 1);
    assert!(
        matches!(parse_arp(&out[0]), ArpRepr::EthernetIpv4 { target_protocol_addr, .. } if target_protocol_addr == gw)
    );
    let gw_mac = MacAddr([2, 0, 0, 0, 0, 0xfe]);
    let out = h.exchange(&eth(
        DUT_MAC,
        gw_mac,
        0x0806,
        &arp(ArpOperation::Reply, gw_mac, gw, DUT_MAC, DUT_V4),
    ));
    assert_eq!(out.len(), 1);
    let e = EthernetFrame::new_checked(&out[0][..]).unwrap();
    assert_eq!(e.dst_addr(), gw_mac, "sent to the gateway's MAC");
    let ip = Ipv4Packet::new_checked(e.payload()).unwrap();
    assert_eq!(ip.dst_addr(), far);
    let caps = ChecksumCapabilities::default();
    let req = Icmpv4Repr::parse(&Icmpv4Packet::new_checked(ip.payload()).unwrap(), &caps).unwrap();
    let Icmpv4Repr::EchoRequest {
        ident: 5,
        seq_no: 1,
        data,
    } = req
    else {
        panic!("{req:?}")
    };
    // The far host answers through the gateway; the appliance reports the round trip.
    let data = data.to_vec();
    h.clock.advance(Duration::from_micros(250));
    let reply = Icmpv4Repr::EchoReply {
        ident: 5,
        seq_no: 1,
        data: &data,
    };
    let ipr = Ipv4Repr {
        src_addr: far,
        dst_addr: DUT_V4,
        next_header: IpProtocol::Icmp,
        payload_len: reply.buffer_len(),
        hop_limit: 60,
    };
    let mut b = vec![0u8; 20 + reply.buffer_len()];
    ipr.emit(&mut Ipv4Packet::new_unchecked(&mut b[..]), &caps);
    reply.emit(&mut Icmpv4Packet::new_unchecked(&mut b[20..]), &caps);
    assert!(h.exchange(&eth(DUT_MAC, gw_mac, 0x0800, &b)).is_empty());
    let evs: Vec<NetEvent> = h.events.try_iter().collect();
    assert!(
        evs.contains(&NetEvent::EchoReply {
            from: IpAddr::V4(far),
            ident: 5,
            seq: 1,
            rtt: Duration::from_micros(250)
        }),
        "{evs:?}"
    );
    // No route: reported, nothing sent.
    h.command(NetCommand::Ping {
        dst: IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1)),
        ident: 5,
        seq: 2,
        size: 0,
    });
    assert!(h.drain().is_empty());
    assert!(h.events.try_iter().any(|e| matches!(
        e,
        NetEvent::PingFailed {
            reason: DropReason::NoRoute,
            ..
        }
    )));
}

#[test]
fn unanswered_resolution_retries_then_drops_what_it_held() {
    let mut h = Harness::std();
    let out = h.exchange(&eth(
        DUT_MAC,
        HOST_MAC,
        0x0800,
        &echo4(HOST_V4, DUT_V4, 1, b"x"),
    ));
    assert_eq!(out.len(), 1, "first ARP request");
    for i in 0..2 {
        h.clock.advance(neighbor::RETRANS);
        h.step();
        assert_eq!(h.drain().len(), 1, "retry {i}");
    }
    h.clock.advance(neighbor::RETRANS);
    h.step();
    assert!(h.drain().is_empty());
    assert_eq!(h.counters.drops(DropReason::NeighborUnreachable), 1);
    assert_eq!(h.counters.arp_requests_sent.get(), 3);
}

#[test]
fn probes_resolve_configured_neighbors_by_themselves() {
    let cfg = PortNetConfig {
        probes: vec![IpAddr::V4(HOST_V4), IpAddr::V6(HOST_V6)],
        ..port_cfg()
    };
    let mut h = Harness::new(cfg, vec![], PortCaps::default());
    h.step();
    let out = h.drain();
    assert_eq!(out.len(), 2, "an ARP request and a neighbour solicitation");
    assert!(
        matches!(parse_arp(&out[0]), ArpRepr::EthernetIpv4 { target_protocol_addr, .. } if target_protocol_addr == HOST_V4)
    );
    let e = EthernetFrame::new_checked(&out[1][..]).unwrap();
    assert_eq!(
        e.dst_addr(),
        stack::multicast_mac(stack::solicited_node(HOST_V6))
    );
    let ip = Ipv6Packet::new_checked(e.payload()).unwrap();
    let ns = Icmpv6Repr::parse(
        &ip.src_addr(),
        &ip.dst_addr(),
        &Icmpv6Packet::new_checked(ip.payload()).unwrap(),
        &ChecksumCapabilities::default(),
    )
    .unwrap();
    assert_eq!(
        ns,
        Icmpv6Repr::Ndisc(NdiscRepr::NeighborSolicit {
            target_addr: HOST_V6,
            lladdr: Some(RawHardwareAddress::from(DUT_MAC))
        })
    );
    assert_eq!(
        ip.src_addr(),
        DUT_V6,
        "sourced from the address in the target's prefix"
    );
}
