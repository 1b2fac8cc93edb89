use super::*;
use crate::lcore::ManualClock;
use crate::port::mem::{MemQueue, link};

fn info(i: u16) -> PortInfo {
    PortInfo::virtual_port(i, 9000)
}

/// An ECN-capable IPv4/UDP frame of `len` bytes whose byte 50 holds `tag`.
fn frame(tag: u8, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    f[15] = 0x02; // ECT(0)
    f[16..18].copy_from_slice(&((len - 14) as u16).to_be_bytes());
    f[23] = 17;
    f[50] = tag;
    f
}

fn setup() -> (
    Impaired<MemQueue, ManualClock>,
    ImpairHandle,
    MemQueue,
    ManualClock,
) {
    let (a, b) = link(info(1), info(2), 16384);
    let clock = ManualClock::default();
    let (imp, h) = Impaired::new(a, clock.clone(), 7);
    (imp, h, b, clock)
}

fn send(q: &mut Impaired<MemQueue, ManualClock>, frames: impl IntoIterator<Item = Vec<u8>>) {
    let mut burst: Burst<_> = Burst::new();
    for f in frames {
        if burst.is_full() {
            q.tx_burst(&mut burst);
        }
        burst.push(crate::buf::HeapBuf::from_slice(&f));
    }
    q.tx_burst(&mut burst);
    assert!(burst.is_empty());
}

fn drain(peer: &mut MemQueue) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    while let Some(f) = peer.recv_frame() {
        got.push(f);
    }
    got
}

#[test]
fn off_by_default_frames_pass_unchanged() {
    let (mut q, h, mut peer, _) = setup();
    send(&mut q, (0..100).map(|i| frame(i, 200)));
    let got = drain(&mut peer);
    assert_eq!(got.len(), 100);
    assert!(
        got.iter()
            .enumerate()
            .all(|(i, f)| *f == frame(i as u8, 200))
    );
    assert_eq!(h.stats.tx.lost.get(), 0);
}

#[test]
fn loss_duplication_and_corruption_happen_at_their_rates() {
    let (mut q, h, mut peer, _) = setup();
    h.set(
        Direction::Tx,
        Impairments {
            loss: 0.1,
            duplicate: 0.05,
            ..Default::default()
        },
    )
    .unwrap();
    send(&mut q, (0..10_000).map(|i| frame(i as u8, 200)));
    let got = drain(&mut peer);
    let s = &h.stats.tx;
    let (lost, dup) = (s.lost.get(), s.duplicated.get());
    assert!((800..1200).contains(&lost), "{lost}");
    assert!((300..700).contains(&dup), "{dup}");
    assert_eq!(got.len() as u64, 10_000 - lost + dup);
    assert!(got.iter().all(|f| *f == frame(f[50], 200)));
    // Corruption alone: every corrupted frame differs from what was sent, in one bit.
    h.set(
        Direction::Tx,
        Impairments {
            corrupt: 0.02,
            ..Default::default()
        },
    )
    .unwrap();
    send(&mut q, (0..10_000).map(|i| frame(i as u8, 200)));
    let got = drain(&mut peer);
    assert_eq!(got.len(), 10_000);
    let changed = got
        .iter()
        .enumerate()
        .filter(|(i, f)| f[..] != frame(*i as u8, 200)[..])
        .count() as u64;
    let bad = s.corrupted.get();
    assert!((100..300).contains(&bad), "{bad}");
    assert_eq!(changed, bad);
}

#[test]
fn reordered_frames_come_after_later_ones() {
    let (mut q, h, mut peer, clock) = setup();
    h.set(
        Direction::Tx,
        Impairments {
            reorder: 1.0,
            reorder_delay: Duration::from_micros(5),
            ..Default::default()
        },
    )
    .unwrap();
    send(&mut q, [frame(1, 100)]);
    h.set(Direction::Tx, Impairments::default()).unwrap();
    assert!(drain(&mut peer).is_empty(), "held back");
    // Off again: the next frame passes at once; the held one is released when due.
    send(&mut q, [frame(2, 100)]);
    clock.advance(Duration::from_micros(6));
    let mut rx: Burst<_> = Burst::new();
    q.rx_burst(&mut rx); // any call releases what is due
    let got: Vec<u8> = drain(&mut peer).iter().map(|f| f[50]).collect();
    assert_eq!(got, [2, 1]);
    assert_eq!(h.stats.tx.reordered.get(), 1);
}

#[test]
fn the_congestion_point_drains_at_its_rate_marks_and_tail_drops() {
    let (mut q, h, mut peer, clock) = setup();
    // 1 Gb/s: a 1000-byte frame takes 8.192 us with its 24 bytes of overhead.
    h.set(
        Direction::Tx,
        Impairments {
            congestion: Some(CongestionPoint {
                rate_bps: 1_000_000_000,
                buffer_bytes: 50_000,
                red: Some(Red {
                    kmin: 10_000,
                    kmax: 20_000,
                    pmax: 0.5,
                }),
            }),
            ..Default::default()
        },
    )
    .unwrap();
    send(&mut q, (0..100).map(|i| frame(i, 1000)));
    // The frames come in bursts of 32; the first leaves at once, so 51 fit in the 50 KB buffer
    // and 49 are dropped.
    assert_eq!(h.stats.tx.cp_dropped.get(), 49);
    assert_eq!(h.stats.tx.cp_max_bytes.get(), 50_000);
    let first = drain(&mut peer);
    assert_eq!(first.len(), 1);
    // After 100 us, 100/8.192 = 12 more have gone (one per 8.192 us).
    clock.advance(Duration::from_micros(100));
    let mut rx: Burst<_> = Burst::new();
    q.rx_burst(&mut rx);
    let mid = drain(&mut peer);
    assert_eq!(mid.len(), 12);
    // Those left with 36-48 KB behind them, above Kmax: all marked CE.
    assert!(mid.iter().all(|f| f[15] & 3 == 3));
    clock.advance(Duration::from_millis(1));
    q.rx_burst(&mut rx);
    let rest = drain(&mut peer);
    assert_eq!(rest.len(), 38);
    // The last ones left an almost empty queue: not marked.
    assert!(rest[rest.len() - 10..].iter().all(|f| f[15] & 3 == 2));
    assert_eq!(h.stats.tx.cp_queue_bytes.get(), 0);
    let all = first.iter().chain(&mid).chain(&rest);
    let marked = all.filter(|f| f[15] & 3 == 3).count() as u64;
    assert_eq!(marked, h.stats.tx.ce_marked.get());
}

#[test]
fn rx_impairments_and_bad_settings() {
    let (mut q, h, mut peer, _) = setup();
    h.set(
        Direction::Rx,
        Impairments {
            loss: 1.0,
            ..Default::default()
        },
    )
    .unwrap();
    for i in 0..10 {
        assert!(peer.send_frame(&frame(i, 100)));
    }
    let mut rx: Burst<_> = Burst::new();
    assert_eq!(q.rx_burst(&mut rx), 0);
    assert_eq!(h.stats.rx.lost.get(), 10);
    let bad = Impairments {
        loss: 1.5,
        ..Default::default()
    };
    assert_eq!(h.set(Direction::Rx, bad), Err("loss"));
    let bad = Impairments {
        congestion: Some(CongestionPoint {
            rate_bps: 0,
            buffer_bytes: 1,
            red: None,
        }),
        ..Default::default()
    };
    assert_eq!(h.set(Direction::Tx, bad), Err("congestion"));
}
