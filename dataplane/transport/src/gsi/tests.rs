//! Two ports' QP1s exchanging real frames: a REQ from one is refused by the other (no
//! listener) with a REJ addressed back to it; a connection made through frames; what is no MAD
//! is dropped.

use super::*;
use crate::cm::{self, ConnectParams, Event, State};
use wire::buf::HeapBuf;
use wire::cm::{Message, Path, RejReason};
use wire::packet::{Checks, parse};

/// A sink that keeps the frames.
#[derive(Default)]
struct Sink {
    frames: Vec<Vec<u8>>,
    refuse: bool,
}

impl Transmit<HeapBuf> for Sink {
    fn tx_features(&self, _port: usize) -> (bool, bool) {
        (false, false)
    }
    fn can_send(&mut self, _port: usize) -> bool {
        !self.refuse
    }
    fn alloc(&mut self, _port: usize) -> Option<HeapBuf> {
        Some(HeapBuf::new())
    }
    fn send(&mut self, _port: usize, buf: HeapBuf) {
        self.frames.push(buf.data().to_vec());
    }
    fn unused(&mut self, _buf: HeapBuf) {}
}

const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];

fn addrs(v6: bool) -> (IpAddr, IpAddr) {
    if v6 {
        ("fd00::a".parse().unwrap(), "fd00::b".parse().unwrap())
    } else {
        ("10.0.0.10".parse().unwrap(), "10.0.0.11".parse().unwrap())
    }
}

fn pair(v6: bool) -> (Gsi, Gsi) {
    let (a_ip, b_ip) = addrs(v6);
    let mut a = Gsi::new(0, Config::default());
    a.learn(PeerPath {
        peer: b_ip,
        local: a_ip,
        peer_mac: MAC_B,
        local_mac: MAC_A,
        vlan: None,
    });
    let b = Gsi::new(
        0,
        Config {
            seed: 2,
            ..Config::default()
        },
    );
    (a, b)
}

fn params(peer: IpAddr, local: IpAddr) -> ConnectParams {
    let path = Path {
        local_gid: cm::gid_of(local),
        remote_gid: cm::gid_of(peer),
        hop_limit: 64,
        ..Path::default()
    };
    ConnectParams::new(cm::service_id_of(7471), peer, path, 0x100011, 5)
}

/// Moves `from`'s frames into `to`; returns them.
fn deliver(from: &mut Gsi, to: &mut Gsi, now: Instant) -> Vec<Vec<u8>> {
    let mut sink = Sink::default();
    from.transmit(&mut sink);
    for f in &sink.frames {
        let info = parse(f, Checks::ALL).expect("QP1's frames parse with a good ICRC");
        to.receive(now, &info, f);
    }
    sink.frames
}

#[test]
fn a_req_is_refused_by_a_port_with_no_listener_over_the_wire() {
    for v6 in [false, true] {
        let (a_ip, b_ip) = addrs(v6);
        let (mut a, mut b) = pair(v6);
        let now = Instant(1);
        let ca = a.cm.connect(now, &params(b_ip, a_ip)).unwrap();
        a.rearm();
        let sent = deliver(&mut a, &mut b, now);
        assert_eq!(sent.len(), 1);
        let info = parse(&sent[0], Checks::ALL).unwrap();
        assert_eq!((info.opcode, info.dest_qp), (op::UD_SEND_ONLY, GSI_QPN));
        assert_eq!((info.src_mac, info.dst_mac), (MAC_A, MAC_B));
        assert_eq!(
            (info.src_ip, info.dst_ip, info.udp_src),
            (a_ip, b_ip, GSI_UDP_SPORT)
        );
        let d = info.ext.deth().unwrap();
        assert_eq!((d.qkey, d.src_qp, info.pkey), (GSI_QKEY, GSI_QPN, 0xffff));
        // B learned A's path from the REQ and answers there.
        let back = deliver(&mut b, &mut a, now);
        assert_eq!(back.len(), 1);
        let info = parse(&back[0], Checks::ALL).unwrap();
        assert_eq!((info.src_mac, info.dst_mac), (MAC_B, MAC_A));
        assert_eq!((info.src_ip, info.dst_ip), (b_ip, a_ip));
        let Message::Rej(rej) = Message::parse(info.payload(&back[0])).unwrap().1 else {
            panic!()
        };
        assert_eq!(rej.reason, RejReason::InvalidServiceId);
        assert_eq!(
            a.cm.poll_event(),
            Some(Event::Rejected {
                conn: ca,
                reason: RejReason::InvalidServiceId
            })
        );
        assert_eq!(a.counters().tx_frames, 1);
        assert_eq!(b.counters().tx_frames, 1);
    }
}

#[test]
fn a_connection_through_frames_and_a_timer_through_poll() {
    let (a_ip, b_ip) = addrs(false);
    let (mut a, mut b) = pair(false);
    b.cm.listen(cm::service_id_of(7471)).unwrap();
    let t0 = Instant(1_000);
    let ca = a.cm.connect(t0, &params(b_ip, a_ip)).unwrap();
    a.rearm();
    // The REQ is lost; A's timer, polled, sends it again.
    let mut sink = Sink::default();
    a.transmit(&mut sink);
    assert_eq!(sink.frames.len(), 1);
    let wait = cm::timeout_of(20) + 2 * Config::default().packet_life;
    a.poll(t0 + (wait - std::time::Duration::from_nanos(1)));
    assert!(!a.has_tx());
    a.poll(t0 + wait);
    assert!(a.has_tx());
    let now = t0 + wait;
    deliver(&mut a, &mut b, now);
    let Some(Event::Request { conn: cb, req, .. }) = b.cm.poll_event() else {
        panic!()
    };
    assert_eq!((req.local_qpn, req.starting_psn), (0x100011, 5));
    b.cm.accept(now, cb, &cm::AcceptParams::new(0x22, 9))
        .unwrap();
    b.rearm();
    deliver(&mut b, &mut a, now);
    assert!(matches!(a.cm.poll_event(), Some(Event::Reply { conn, .. }) if conn == ca));
    a.cm.establish(ca).unwrap();
    deliver(&mut a, &mut b, now);
    assert_eq!(b.cm.state(cb), Some(State::Established));
    assert_eq!(a.cm.state(ca), Some(State::Established));
}

#[test]
fn what_is_no_mad_is_dropped_and_a_peer_without_a_path_counted() {
    let (a_ip, b_ip) = addrs(false);
    let (mut a, mut b) = pair(false);
    a.cm.connect(Instant(1), &params(b_ip, a_ip)).unwrap();
    let mut sink = Sink::default();
    a.transmit(&mut sink);
    let mut f = sink.frames.pop().unwrap();
    // A wrong Q_Key: dropped before the CM.
    let info = parse(&f, Checks::NONE).unwrap();
    let q = info.bth_off as usize + 12;
    f[q] ^= 1;
    let info = parse(&f, Checks::NONE).unwrap();
    b.receive(Instant(1), &info, &f);
    assert_eq!(b.counters().rx_not_mad, 1);
    assert_eq!(b.cm.counters().rx, 0);
    // B was never told where 10.0.0.99 is: its MAD there is dropped and counted.
    b.cm.connect(Instant(1), &params("10.0.0.99".parse().unwrap(), b_ip))
        .unwrap();
    let mut sink = Sink::default();
    b.transmit(&mut sink);
    assert!(sink.frames.is_empty());
    assert_eq!(b.counters().tx_no_path, 1);
    // A port that takes nothing now: the MAD waits.
    a.cm.connect(Instant(1), &params(b_ip, a_ip)).unwrap();
    let mut busy = Sink {
        refuse: true,
        ..Sink::default()
    };
    a.transmit(&mut busy);
    assert!(a.has_tx());
}

#[test]
fn the_peer_table_is_bounded() {
    let mut g = Gsi::new(0, Config::default());
    for i in 0..(PEERS + 10) as u32 {
        g.learn(PeerPath {
            peer: IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i)),
            local: "10.255.0.1".parse().unwrap(),
            peer_mac: MAC_A,
            local_mac: MAC_B,
            vlan: None,
        });
    }
    assert_eq!(g.peers.len(), PEERS);
    assert!(
        g.path("10.0.0.0".parse().unwrap()).is_none(),
        "the oldest went"
    );
    assert!(
        g.path(IpAddr::V4(std::net::Ipv4Addr::from(
            0x0a00_0000 + PEERS as u32 + 9
        )))
        .is_some()
    );
}
