use super::*;
use wire::PacketBuf;
use wire::Psn;
use wire::buf::HeapBuf;
use wire::ipv4::Ecn;
use wire::opcode::op;
use wire::packet::{Checks, RoceRepr, build, parse};

const A: NodeId = NodeId(0);
const B: NodeId = NodeId(1);

fn frame(psn: u32) -> Vec<u8> {
    let r = RoceRepr::example(op::RC_SEND_ONLY, 0x11, psn);
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

const S: NodeId = NodeId(100);
const C: NodeId = NodeId(2);

/// A and C send to B through switch S; every link and port at 100 Gb/s, 1 us.
fn incast(seed: u64, sw: SwitchConfig) -> SimNet {
    let mut net = SimNet::new(seed);
    net.add_switch(S, sw);
    for n in [A, B, C] {
        net.connect(n, S, link(Faults::default()));
    }
    net.route(A, B, &[S]);
    net.route(C, B, &[S]);
    net
}

fn switch(buffer: u64, red: Option<Red>) -> SwitchConfig {
    SwitchConfig {
        buffer_bytes: buffer,
        red,
        port_bps: 100_000_000_000,
        latency: Duration::from_micros(1),
        pfc: None,
    }
}

fn drain(net: &mut SimNet) -> Vec<(Instant, Vec<u8>)> {
    let mut got = Vec::new();
    while let Some(t) = net.next_delivery() {
        while let Some((_, to, f)) = net.deliver(t) {
            assert_eq!(to, B);
            got.push((t, f));
        }
    }
    got
}

#[test]
fn red_probability_is_zero_then_linear_then_one() {
    let r = Red {
        kmin: 1000,
        kmax: 5000,
        pmax: 0.2,
    };
    assert_eq!(r.probability(0), 0.0);
    assert_eq!(r.probability(1000), 0.0);
    assert!((r.probability(3000) - 0.1).abs() < 1e-12);
    assert!((r.probability(4999) - 0.2 * 3999.0 / 4000.0).abs() < 1e-12);
    assert_eq!(r.probability(5000), 1.0);
    assert_eq!(r.probability(1 << 30), 1.0);
}

#[test]
fn two_line_rate_senders_build_a_queue_that_drains_at_the_port_rate() {
    let mut net = incast(1, switch(1 << 20, None));
    let len = frame(0).len() as u64;
    // Both send 100 frames back to back at line rate: the egress port gets 200 Gb/s for the
    // time it takes to send 100 frames, so about 100 frames queue, then drain at 100 Gb/s.
    for i in 0..100 {
        assert!(net.send(Instant::ZERO, A, B, frame(i)));
        assert!(net.send(Instant::ZERO, C, B, frame(1000 + i)));
    }
    let got = drain(&mut net);
    assert_eq!(got.len(), 200);
    let tx = tx_time(len as usize, 100_000_000_000).as_nanos() as u64;
    // Deliveries are one port-serialisation apart, after the first arrives.
    for w in got.windows(2) {
        assert_eq!(w[1].0.0 - w[0].0.0, tx);
    }
    let st = net.port_stats(S, B, got.last().unwrap().0).unwrap();
    assert_eq!(
        (st.enqueued, st.dropped, st.bytes, st.bytes_out),
        (200, 0, 0, 200 * len)
    );
    // Peak: arrivals at 2 frames per tx time, departures at 1: about 100 frames.
    assert!(
        (99 * len..=101 * len).contains(&st.max_bytes),
        "{} vs {}",
        st.max_bytes,
        100 * len
    );
    // A triangle: the time-weighted mean over the busy period is about half the peak.
    let mean = st.mean_bytes();
    assert!((0.4..0.6).contains(&(mean / st.max_bytes as f64)), "{mean}");
    assert!(st.quantile_bytes(0.99) >= st.max_bytes - 1024);
}

#[test]
fn a_full_shared_buffer_tail_drops() {
    let len = frame(0).len() as u64;
    let mut net = incast(1, switch(20 * len, None));
    for i in 0..100 {
        net.send(Instant::ZERO, A, B, frame(i));
        net.send(Instant::ZERO, C, B, frame(1000 + i));
    }
    let got = drain(&mut net);
    let st = net.port_stats(S, B, Instant(u64::MAX / 2)).unwrap();
    assert!(st.dropped > 50, "{st:?}");
    assert_eq!(st.enqueued as usize, got.len());
    assert_eq!(st.enqueued + st.dropped, 200);
    assert!(st.max_bytes <= 20 * len);
}

#[test]
fn red_marks_ce_above_kmax_and_never_below_kmin() {
    let len = frame(0).len() as u64;
    // Every frame leaving with more than 10 frames behind it is marked; none with fewer than 5.
    let red = Red {
        kmin: 5 * len,
        kmax: 10 * len,
        pmax: 0.5,
    };
    let mut net = incast(3, switch(1 << 20, Some(red)));
    for i in 0..100 {
        net.send(Instant::ZERO, A, B, frame(i));
        net.send(Instant::ZERO, C, B, frame(1000 + i));
    }
    let got = drain(&mut net);
    let ce: Vec<bool> = got
        .iter()
        .map(|(_, f)| {
            let p = parse(f, Checks::ALL).expect("a CE mark keeps the frame valid (ICRC masks it)");
            p.ecn == Ecn::Ce
        })
        .collect();
    let st = net.port_stats(S, B, got.last().unwrap().0).unwrap();
    assert_eq!(st.marked as usize, ce.iter().filter(|c| **c).count());
    // The queue drains at the end: the last frames leave with nothing behind them.
    assert!(ce[got.len() - 5..].iter().all(|c| !c), "none below Kmin");
    // In the middle the queue is far above Kmax: all marked.
    assert!(ce[60..120].iter().all(|c| *c), "all above Kmax");
}
