//! What a roced lcore runs: the RDMA transport ([`RdmaHost`]) beside the appliance's IP
//! presence ([`NetStack`]) on the same ports.
//!
//! Each received burst is split once: RoCEv2 frames (UDP to port 4791, addressed to the port's
//! MAC) go to the transport, everything else (ARP, neighbour discovery, ICMP, other UDP) to the
//! stack. Both share the lcore's ports, counters and clock; commands for either arrive on the
//! lcore's one channel as an [`ApplianceCommand`].

use crate::PacketBuf;
use crate::host::{RdmaCommand, RdmaHost};
use crate::lcore::{Handler, Io};
use crate::net::{NetCommand, NetStack};
use crate::port::{Burst, PortQueue};
use crate::wire::{eth, ipv4, ipv6, udp};

/// A command for one of the lcore's two handlers.
#[derive(Debug)]
pub enum ApplianceCommand {
    /// For the IP stack.
    Net(NetCommand),
    /// For the RDMA transport.
    Rdma(RdmaCommand),
}

/// The IP stack and the RDMA transport of one lcore.
#[derive(Debug)]
pub struct Appliance<B> {
    /// ARP, ND, ICMP.
    pub net: NetStack<B>,
    /// The RC transport.
    pub rdma: RdmaHost<B>,
    roce: Burst<B>,
    other: Burst<B>,
}

impl<B: PacketBuf> Appliance<B> {
    /// Both halves.
    pub fn new(net: NetStack<B>, rdma: RdmaHost<B>) -> Self {
        Appliance {
            net,
            rdma,
            roce: Burst::new(),
            other: Burst::new(),
        }
    }
}

/// True for a RoCEv2 frame to `mac`: Ethernet (optionally 802.1Q) / IPv4 or IPv6 / UDP to
/// port 4791. Only looks; the transport's parse checks everything else.
pub fn is_roce_frame(d: &[u8], mac: &[u8; 6]) -> bool {
    const L2: usize = eth::HEADER_LEN;
    if d.len() < L2 || d[0..6] != mac[..] {
        return false;
    }
    let (mut ethertype, mut l3) = (u16::from_be_bytes([d[12], d[13]]), L2);
    if ethertype == eth::ETHERTYPE_VLAN {
        if d.len() < L2 + eth::VLAN_TAG_LEN {
            return false;
        }
        ethertype = u16::from_be_bytes([d[16], d[17]]);
        l3 = L2 + eth::VLAN_TAG_LEN;
    }
    // The IPv4 protocol (byte 9) and the IPv6 next header (byte 6) name UDP alike.
    let l4 = match ethertype {
        eth::ETHERTYPE_IPV4 => {
            let Some(&vihl) = d.get(l3) else { return false };
            if d.get(l3 + 9) != Some(&ipv4::PROTO_UDP) {
                return false;
            }
            l3 + (vihl as usize & 0xf) * 4
        }
        eth::ETHERTYPE_IPV6 => {
            if d.get(l3 + 6) != Some(&ipv4::PROTO_UDP) {
                return false;
            }
            l3 + ipv6::HEADER_LEN
        }
        _ => return false,
    };
    d.get(l4 + 2..l4 + 4)
        .is_some_and(|p| u16::from_be_bytes([p[0], p[1]]) == udp::ROCEV2_PORT)
}

impl<Q: PortQueue> Handler<Q> for Appliance<Q::Buf> {
    type Command = ApplianceCommand;

    fn on_burst(&mut self, port: usize, burst: &mut Burst<Q::Buf>, io: &mut Io<'_, Q>) {
        let mac = io.info(port).mac.0;
        for buf in burst.drain(..) {
            if is_roce_frame(buf.data(), &mac) {
                self.roce.push(buf);
            } else {
                self.other.push(buf);
            }
        }
        if !self.roce.is_empty() {
            <RdmaHost<Q::Buf> as Handler<Q>>::on_burst(&mut self.rdma, port, &mut self.roce, io);
        }
        if !self.other.is_empty() {
            <NetStack<Q::Buf> as Handler<Q>>::on_burst(&mut self.net, port, &mut self.other, io);
        }
    }

    fn on_poll(&mut self, io: &mut Io<'_, Q>) {
        <NetStack<Q::Buf> as Handler<Q>>::on_poll(&mut self.net, io);
        <RdmaHost<Q::Buf> as Handler<Q>>::on_poll(&mut self.rdma, io);
    }

    fn on_command(&mut self, cmd: ApplianceCommand, io: &mut Io<'_, Q>) {
        match cmd {
            ApplianceCommand::Net(c) => {
                <NetStack<Q::Buf> as Handler<Q>>::on_command(&mut self.net, c, io)
            }
            ApplianceCommand::Rdma(c) => {
                <RdmaHost<Q::Buf> as Handler<Q>>::on_command(&mut self.rdma, c, io)
            }
        }
    }

    fn shutdown(&mut self) {
        self.roce.clear();
        self.other.clear();
        <NetStack<Q::Buf> as Handler<Q>>::shutdown(&mut self.net);
        <RdmaHost<Q::Buf> as Handler<Q>>::shutdown(&mut self.rdma);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(vlan: bool, v6: bool, dport: u16) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2];
        if vlan {
            f.extend([0x81, 0x00, 0x00, 0x05]);
        }
        if v6 {
            f.extend([0x86, 0xdd]);
            let mut ip = vec![0u8; 40];
            ip[0] = 0x60;
            ip[6] = 17;
            f.extend(ip);
        } else {
            f.extend([0x08, 0x00]);
            let mut ip = vec![0u8; 20];
            ip[0] = 0x45;
            ip[9] = 17;
            f.extend(ip);
        }
        f.extend([0xc0, 0x00]);
        f.extend(dport.to_be_bytes());
        f.extend([0u8; 16]);
        f
    }

    #[test]
    fn roce_frames_are_told_from_the_rest() {
        let mac = [2, 0, 0, 0, 0, 1];
        for vlan in [false, true] {
            for v6 in [false, true] {
                assert!(is_roce_frame(&frame(vlan, v6, 4791), &mac));
                assert!(!is_roce_frame(&frame(vlan, v6, 53), &mac));
                assert!(!is_roce_frame(&frame(vlan, v6, 4791), &[2, 0, 0, 0, 0, 9]));
            }
        }
        let mut tcp = frame(false, false, 4791);
        tcp[14 + 9] = 6;
        assert!(!is_roce_frame(&tcp, &mac));
        // Short frames of every length are looked at without panicking.
        let f = frame(true, true, 4791);
        for n in 0..f.len() {
            let _ = is_roce_frame(&f[..n], &mac);
        }
    }
}
