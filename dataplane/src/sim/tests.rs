use super::*;
use crate::PacketBuf;
use crate::buf::HeapBuf;
use crate::wire::packet::{Checks, ExtRepr, IpRepr, RoceRepr, build, parse};
use crate::wire::{Psn, bth, eth, ipv4::Ecn, opcode::op, udp};

const A: NodeId = NodeId(0);
const B: NodeId = NodeId(1);

fn frame(psn: u32) -> Vec<u8> {
    let r = RoceRepr {
        eth: eth::Repr {
            dst: [2, 0, 0, 0, 0, 2],
            src: [2, 0, 0, 0, 0, 1],
            vlan: None,
            ethertype: 0,
        },
        ip: IpRepr::V4(ipv4::Repr {
            dscp: 26,
            ecn: Ecn::Ect0,
            ident: 0,
            flags_frag: 0x4000,
            ttl: 64,
            protocol: ipv4::PROTO_UDP,
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
        }),
        udp: udp::Repr {
            src_port: 0xc000,
            dst_port: udp::ROCEV2_PORT,
            checksum: 0,
        },
        bth: bth::Repr {
            opcode: op::RC_SEND_ONLY,
            pkey: 0xffff,
            dest_qp: 0x11,
            psn: Psn::new(psn),
            ..Default::default()
        },
        ext: ExtRepr::default(),
    };
    let mut b = HeapBuf::from_slice(&[7u8; 200]);
    build(&mut b, &r, false).unwrap();
    b.data().to_vec()
}

fn link(faults: Faults) -> LinkConfig {
    LinkConfig {
        latency: Duration::from_micros(2),
        bandwidth_bps: 100_000_000_000,
        faults,
    }
}

fn run(seed: u64, faults: Faults, n: u32) -> (Vec<(u64, Vec<u8>)>, LinkStats) {
    let mut net = SimNet::new(seed);
    net.connect(A, B, link(faults));
    for i in 0..n {
        assert!(net.send(Instant(i as u64 * 100), A, B, frame(i)));
    }
    let mut got = Vec::new();
    while let Some(t) = net.next_delivery() {
        let (_, to, f) = net.deliver(t).unwrap();
        assert_eq!(to, B);
        got.push((t.as_nanos(), f));
    }
    (got, net.stats(A, B).unwrap())
}

#[test]
fn clean_link_delivers_in_order_after_latency_and_serialisation() {
    let (got, s) = run(1, Faults::default(), 10);
    assert_eq!(got.len(), 10);
    // 258-byte frame + 24 bytes of preamble/IFG at 100 Gb/s = 22.56 ns, then 2 us.
    assert_eq!(got[0].0, 22 + 2000);
    for (i, (_, f)) in got.iter().enumerate() {
        assert_eq!(parse(f, Checks::ALL).unwrap().psn, Psn::new(i as u32));
    }
    assert_eq!((s.sent, s.delivered, s.lost), (10, 10, 0));
}

#[test]
fn bandwidth_queues_back_to_back_frames() {
    let mut net = SimNet::new(1);
    net.link(
        A,
        B,
        LinkConfig {
            latency: Duration::ZERO,
            bandwidth_bps: 1_000_000_000,
            faults: Faults::default(),
        },
    );
    for i in 0..3 {
        net.send(Instant(0), A, B, frame(i));
    }
    let times: Vec<u64> = std::iter::from_fn(|| {
        let t = net.next_delivery()?;
        net.deliver(t)?;
        Some(t.as_nanos())
    })
    .collect();
    // (258 + 24) bytes at 1 Gb/s = 2256 ns each, one after the other.
    assert_eq!(times, vec![2256, 4512, 6768]);
}

#[test]
fn same_seed_same_trace_and_faults_happen_at_their_rates() {
    let f = Faults {
        loss: 0.05,
        reorder: 0.05,
        reorder_delay: Duration::from_micros(5),
        duplicate: 0.05,
        corrupt: 0.05,
        ce_mark: 0.1,
        burst: None,
    };
    let (a, sa) = run(42, f, 10_000);
    let (b, sb) = run(42, f, 10_000);
    assert_eq!(a, b, "same seed, same trace");
    assert_eq!(sa, sb);
    let (c, _) = run(43, f, 10_000);
    assert_ne!(a, c);
    for (name, v) in [
        ("lost", sa.lost),
        ("reordered", sa.reordered),
        ("duplicated", sa.duplicated),
        ("corrupted", sa.corrupted),
    ] {
        assert!((400..600).contains(&v), "{name} {v} of 10000 at 5 %");
    }
    assert!((800..1200).contains(&sa.ce_marked), "ce {}", sa.ce_marked);
    // Corrupted data is never accepted: a frame that passes the receive checks carries the
    // original payload (only unprotected bits, like the BTH's FECN/BECN byte or the UDP
    // checksum on IPv4, can change unseen). CE-marked frames still verify.
    let mut rejected = 0u64;
    let mut ce = 0u64;
    for (_, f) in &a {
        match parse(f, Checks::ALL) {
            Ok(p) => {
                assert_eq!(p.payload(f), &[7u8; 200][..]);
                assert!(p.psn.value() < 10_000);
                if p.ecn == Ecn::Ce {
                    ce += 1;
                }
            }
            Err(_) => rejected += 1,
        }
    }
    assert!(
        rejected * 10 >= sa.corrupted * 9,
        "{rejected} rejected of {} corrupted",
        sa.corrupted
    );
    assert!(ce + sa.corrupted >= sa.ce_marked, "{ce} CE delivered");
    // Reordering really reorders.
    let psns: Vec<u32> = a
        .iter()
        .filter_map(|(_, f)| parse(f, Checks::ALL).ok())
        .map(|p| p.psn.value())
        .collect();
    assert!(psns.windows(2).any(|w| w[1] < w[0]));
}

#[test]
fn burst_loss_comes_in_runs() {
    let f = Faults {
        burst: Some((0.01, 0.2)),
        ..Default::default()
    };
    let (got, s) = run(7, f, 20_000);
    assert!(s.lost > 200, "{s:?}");
    let psns: Vec<u32> = got
        .iter()
        .map(|(_, f)| parse(f, Checks::ALL).unwrap().psn.value())
        .collect();
    let gaps: Vec<u32> = psns
        .windows(2)
        .map(|w| w[1] - w[0] - 1)
        .filter(|g| *g > 0)
        .collect();
    let mean = gaps.iter().sum::<u32>() as f64 / gaps.len() as f64;
    assert!(mean > 3.0, "losses come in bursts (mean run {mean:.1})");
}
