//! QP1, the general services QP of a port: the frames that carry MADs, in and out, around the
//! port's communication manager ([`crate::cm::Cm`]). Sans-IO like the rest: a parsed frame to
//! QP1 goes in ([`Gsi::receive`]), frames for a [`Transmit`] sink come out ([`Gsi::transmit`]).
//!
//! A MAD travels as a UD SEND Only to QP 1 with a DETH naming QP 1 and the GSI Q_Key
//! (0x80010000), P_Key 0xFFFF, a 256-byte payload. Anything else to QP 1 (another opcode, a
//! wrong Q_Key or payload length) is dropped and counted, as a hardware QP1 does.
//!
//! The CM names peers by IP address (a RoCEv2 GID); frames need more: the peer's MAC, the VLAN
//! and which of our addresses it talks to. Each MAD received teaches the table (bounded: the
//! oldest entry goes), and a connect to a peer not heard from yet is given its path by the
//! caller ([`Gsi::learn`]), from the port's neighbour table. A MAD for a peer the table does
//! not know is dropped and counted (the CM's retransmission tries again).

use crate::cm::{Cm, Config};
use crate::device::Transmit;
use std::net::IpAddr;
use wire::PacketBuf;
use wire::eth::{self, VlanTag};
use wire::ipv4::{self, Ecn};
use wire::mad::{GSI_QKEY, GSI_QPN, MAD_LEN};
use wire::opcode::op;
use wire::packet::{ExtRepr, IpRepr, PacketInfo, RoceRepr, build};
use wire::time::Instant;
use wire::{Psn, bth, deth, ipv6, udp};

/// The UDP source port of QP1's frames.
pub const GSI_UDP_SPORT: u16 = 0xc001;
/// Peers the table holds.
pub const PEERS: usize = 256;

/// Where a peer is, as the frames to it need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerPath {
    /// The peer's address.
    pub peer: IpAddr,
    /// Ours, that it talks to.
    pub local: IpAddr,
    /// The peer's MAC (or its next hop's).
    pub peer_mac: [u8; 6],
    /// Our port's MAC.
    pub local_mac: [u8; 6],
    /// The 802.1Q tag, if the peer is on a VLAN.
    pub vlan: Option<VlanTag>,
}

/// What QP1 counted besides the CM's own counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GsiCounters {
    /// Frames to QP 1 that are no MAD (not UD SEND Only, wrong Q_Key or length).
    pub rx_not_mad: u64,
    /// MADs the CM sent to a peer with no known path, dropped.
    pub tx_no_path: u64,
    /// MADs dropped for want of a buffer or a port that takes them.
    pub tx_no_buffer: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// CM events the consumer had no room for, lost (the peer's retries or timeouts follow).
    pub events_lost: u64,
}

impl GsiCounters {
    /// Each counter with its name (the metric is `ferroce_gsi_<name>_total`).
    pub fn named(&self) -> [(&'static str, u64); 5] {
        [
            ("rx_not_mad", self.rx_not_mad),
            ("tx_no_path", self.tx_no_path),
            ("tx_no_buffer", self.tx_no_buffer),
            ("tx_frames", self.tx_frames),
            ("events_lost", self.events_lost),
        ]
    }
}

/// QP1 of one port.
#[derive(Debug)]
pub struct Gsi {
    /// The port's CM.
    pub cm: Cm,
    port: usize,
    peers: Vec<PeerPath>,
    /// Where the next learned peer goes once the table is full.
    next_victim: usize,
    psn: u32,
    /// The CM's earliest deadline (kept, so that the poll loop does not scan the CM).
    deadline: Option<Instant>,
    counters: GsiCounters,
}

impl Gsi {
    /// QP1 for `port`, with a CM of `cfg`.
    pub fn new(port: usize, cfg: Config) -> Gsi {
        Gsi {
            cm: Cm::new(cfg),
            port,
            peers: Vec::with_capacity(PEERS),
            next_victim: 0,
            psn: 0,
            deadline: None,
            counters: GsiCounters::default(),
        }
    }

    /// What QP1 counted.
    pub fn counters(&self) -> &GsiCounters {
        &self.counters
    }

    /// The port.
    pub fn port(&self) -> usize {
        self.port
    }

    /// Records (or updates) where a peer is.
    pub fn learn(&mut self, p: PeerPath) {
        if let Some(e) = self.peers.iter_mut().find(|e| e.peer == p.peer) {
            *e = p;
        } else if self.peers.len() < PEERS {
            self.peers.push(p);
        } else {
            self.peers[self.next_victim] = p;
            self.next_victim = (self.next_victim + 1) % PEERS;
        }
    }

    /// A peer's path, if known.
    pub fn path(&self, peer: IpAddr) -> Option<&PeerPath> {
        self.peers.iter().find(|e| e.peer == peer)
    }

    /// A frame to QP 1 (parsed and checked by the receive path): its MAD to the CM.
    pub fn receive(&mut self, now: Instant, info: &PacketInfo, frame: &[u8]) {
        let is_mad = info.opcode == op::UD_SEND_ONLY
            && info.payload_len as usize == MAD_LEN
            && info.ext.deth().is_some_and(|d| d.qkey == GSI_QKEY);
        if !is_mad {
            self.counters.rx_not_mad += 1;
            return;
        }
        self.learn(PeerPath {
            peer: info.src_ip,
            local: info.dst_ip,
            peer_mac: info.src_mac,
            local_mac: info.dst_mac,
            vlan: info.vlan,
        });
        self.cm.handle_mad(now, info.src_ip, info.payload(frame));
        self.rearm();
    }

    /// Runs the CM's timers if one is due.
    pub fn poll(&mut self, now: Instant) {
        if self.deadline.is_some_and(|d| d <= now) {
            self.cm.handle_timeout(now);
            self.rearm();
        }
    }

    /// After a command on [`Gsi::cm`]: its deadline may have moved.
    pub fn rearm(&mut self) {
        self.deadline = self.cm.poll_timeout();
    }

    /// Hands each of the CM's events to `give`; one it refuses (its queue is full) is lost and
    /// counted.
    pub fn drain_events(&mut self, mut give: impl FnMut(crate::cm::Event) -> bool) {
        while let Some(e) = self.cm.poll_event() {
            if !give(e) {
                self.counters.events_lost += 1;
            }
        }
    }

    /// Whether the CM has MADs waiting to be sent.
    pub fn has_tx(&self) -> bool {
        self.cm.has_transmit()
    }

    /// Frames every MAD the CM has to send, into `tx`.
    pub fn transmit<B: PacketBuf>(&mut self, tx: &mut impl Transmit<B>) {
        while self.cm.has_transmit() {
            if !tx.can_send(self.port) {
                return;
            }
            let Some(t) = self.cm.poll_transmit() else {
                return;
            };
            let Some(path) = self.path(t.to).copied() else {
                self.counters.tx_no_path += 1;
                continue;
            };
            let Some(mut buf) = tx.alloc(self.port) else {
                self.counters.tx_no_buffer += 1;
                return;
            };
            let Some(payload) = buf.reset().then(|| buf.append(MAD_LEN)).flatten() else {
                self.counters.tx_no_buffer += 1;
                tx.unused(buf);
                continue;
            };
            payload.copy_from_slice(&t.mad);
            self.psn = (self.psn + 1) & 0xff_ffff;
            let repr = frame_repr(&path, Psn::new(self.psn));
            let (offload, _) = tx.tx_features(self.port);
            if build(&mut buf, &repr, offload).is_err() {
                self.counters.tx_no_buffer += 1;
                tx.unused(buf);
                continue;
            }
            self.counters.tx_frames += 1;
            tx.send(self.port, buf);
        }
    }
}

/// The headers of a MAD to `path`'s peer.
fn frame_repr(path: &PeerPath, psn: Psn) -> RoceRepr {
    let ip = match (path.local, path.peer) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => IpRepr::V4(ipv4::Repr {
            dscp: 0,
            ecn: Ecn::NotEct,
            ident: 0,
            flags_frag: 0x4000,
            ttl: 64,
            protocol: ipv4::PROTO_UDP,
            src,
            dst,
        }),
        (src, dst) => IpRepr::V6(ipv6::Repr {
            traffic_class: 0,
            flow_label: 0,
            next_header: ipv4::PROTO_UDP,
            hop_limit: 64,
            src: crate::cm::gid_of(src),
            dst: crate::cm::gid_of(dst),
        }),
    };
    RoceRepr {
        eth: eth::Repr {
            dst: path.peer_mac,
            src: path.local_mac,
            vlan: path.vlan,
            ethertype: 0,
        },
        ip,
        udp: udp::Repr {
            src_port: GSI_UDP_SPORT,
            dst_port: udp::ROCEV2_PORT,
            checksum: 0,
        },
        bth: bth::Repr {
            opcode: op::UD_SEND_ONLY,
            pkey: 0xffff,
            dest_qp: GSI_QPN,
            psn,
            ..Default::default()
        },
        ext: ExtRepr {
            deth: Some(deth::Repr {
                qkey: GSI_QKEY,
                resv8: 0,
                src_qp: GSI_QPN,
            }),
            ..ExtRepr::default()
        },
    }
}

#[cfg(test)]
mod tests;
