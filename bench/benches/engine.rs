//! The RC engine alone, per 64 B and 4 KiB RDMA WRITE (one packet each at MTU 4096): the
//! requester building the request, the responder checking and executing it and building its
//! ACK, and the completer taking the ACK and completing the work request. Each stage is timed
//! by itself (criterion's iter_custom) inside the same full round trip.
//! `cargo bench -p bench --bench engine`

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use dataplane::PacketBuf;
use dataplane::buf::HeapBuf;
use dataplane::time::Instant as SimInstant;
use dataplane::transport::mr::Access;
use dataplane::transport::qp::{Mtu, QpAttr};
use dataplane::transport::rc::QpCaps;
use dataplane::transport::testkit::{Node, NodeConfig, sim_attr};
use dataplane::transport::wr::{SendOp, SendWr, SgList, Sge};
use std::time::{Duration, Instant};

fn node(qpn: u32, peer: u32, me: u8, other: u8) -> Node {
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mut n = Node::new(
        NodeConfig {
            access: all,
            caps: QpCaps {
                max_send_wr: 1024,
                max_recv_wr: 1024,
                ..Default::default()
            },
            cq_depth: 1 << 16,
            ..NodeConfig::new(0x10000, vec![7u8; 1 << 20])
        },
        &[qpn],
    );
    n.qps[0]
        .connect(&QpAttr {
            access: Some(all),
            max_rd_atomic: Some(4),
            max_dest_rd_atomic: Some(4),
            ..sim_attr(qpn, me, other, peer, Mtu::M4096)
        })
        .unwrap();
    n
}

/// Runs `iters` WRITEs of `len` bytes and returns the time spent in (requester, responder,
/// completer).
fn rounds(a: &mut Node, b: &mut Node, len: u32, iters: u64) -> [Duration; 3] {
    let mut t = [Duration::ZERO; 3];
    // Frames are built in HeapBufs (headroom in front, as in an mbuf): payload written once,
    // headers prepended.
    let mut frame = HeapBuf::new();
    let mut ack = HeapBuf::new();
    let mut wcs = Vec::with_capacity(16);
    let now = SimInstant(0);
    for _ in 0..iters {
        let mut sg = SgList::new();
        sg.push(Sge {
            addr: 0x10000,
            length: len,
            lkey: a.key,
        });
        let wr = SendWr {
            wr_id: 1,
            op: SendOp::Write {
                remote_addr: 0x20000,
                rkey: b.key,
            },
            sg,
            signaled: true,
            solicited: false,
            fence: false,
            inline: false,
            ud: None,
        };
        let s = Instant::now();
        a.qps[0].post_send(&wr, wr.wr_id, None).unwrap();
        assert!(a.transmit(0, now, &mut frame));
        t[0] += s.elapsed();
        let s = Instant::now();
        b.receive_on(0, now, frame.data());
        assert!(b.transmit(0, now, &mut ack));
        t[1] += s.elapsed();
        let s = Instant::now();
        a.receive_on(0, now, ack.data());
        wcs.clear();
        a.scq[0].poll(16, &mut wcs);
        t[2] += s.elapsed();
        assert_eq!(wcs.len(), 1);
    }
    t
}

fn benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine_write");
    for len in [64u32, 4096] {
        for (stage, name) in ["requester_build", "responder_execute_and_ack", "completer"]
            .iter()
            .enumerate()
        {
            g.bench_with_input(BenchmarkId::new(*name, len), &len, |bch, &len| {
                let mut a = node(0x11, 0x22, 1, 2);
                let mut b = node(0x22, 0x11, 2, 1);
                bch.iter_custom(|iters| rounds(&mut a, &mut b, len, iters)[stage]);
            });
        }
    }
    g.finish();
}

criterion_group! {
    name = engine;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = benches
}
criterion_main!(engine);
