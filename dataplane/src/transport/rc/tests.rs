//! Two RC QPs joined by the simulator, on a clean network: every opcode, data checked.

use super::*;
use crate::sim::{Faults, LinkConfig, NodeId, SimNet};
use crate::time::Instant;
use crate::transport::mr::Access;
use crate::transport::qp::{Mtu, Path, QpAttr};
use crate::transport::wr::Sge;
use arrayvec::ArrayVec;
use core::time::Duration;

struct Node {
    qp: RcQp,
    mrs: MrTable,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    key: u32,
}

const BASE: u64 = 0x10_0000;
const LEN: usize = 2 << 20;

fn node(qpn: u32, peer: u32, me: u8, other: u8, mtu: Mtu, sq_psn: u32, rq_psn: u32) -> Node {
    let mut mrs = MrTable::new();
    let pd = mrs.alloc_pd();
    let all =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mem: Vec<u8> = (0..LEN)
        .map(|i| (i as u32).wrapping_mul(2654435761).wrapping_add(me as u32) as u8)
        .collect();
    let key = mrs.register(pd, BASE, Box::new(mem), all).unwrap();
    let mut qp = RcQp::new(qpn, pd, 64, 64);
    qp.modify(&QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(0),
        access: Some(all),
        ..Default::default()
    })
    .unwrap();
    let path = Path {
        local_ip: format!("10.0.0.{me}").parse().unwrap(),
        remote_ip: format!("10.0.0.{other}").parse().unwrap(),
        local_mac: [2, 0, 0, 0, 0, me],
        remote_mac: [2, 0, 0, 0, 0, other],
        udp_sport: 0xc000 | qpn as u16,
        dscp: 26,
        ecn: 2,
        vlan: None,
    };
    qp.modify(&QpAttr {
        state: Some(QpState::Rtr),
        path: Some(path),
        path_mtu: Some(mtu),
        dest_qp: Some(peer),
        rq_psn: Some(rq_psn),
        max_dest_rd_atomic: Some(4),
        min_rnr_timer: Some(1),
        ..Default::default()
    })
    .unwrap();
    qp.modify(&QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(sq_psn),
        timeout: Some(14),
        retry_cnt: Some(7),
        rnr_retry: Some(7),
        max_rd_atomic: Some(4),
        ..Default::default()
    })
    .unwrap();
    Node {
        qp,
        mrs,
        scq: CompletionQueue::new(256),
        rcq: CompletionQueue::new(256),
        key,
    }
}

fn pair(mtu: Mtu, psn_a: u32, psn_b: u32) -> (Node, Node) {
    (
        node(0x11, 0x22, 1, 2, mtu, psn_a, psn_b),
        node(0x22, 0x11, 2, 1, mtu, psn_b, psn_a),
    )
}

/// Moves frames both ways through the simulator until both are idle.
fn pump(a: &mut Node, b: &mut Node) -> usize {
    let mut net = SimNet::new(1);
    let l = LinkConfig {
        latency: Duration::from_micros(1),
        bandwidth_bps: 100_000_000_000,
        faults: Faults::default(),
    };
    net.connect(NodeId(0), NodeId(1), l);
    let mut now = Instant(0);
    let mut frames = 0;
    let mut buf = Vec::new();
    loop {
        let mut moved = false;
        while a.qp.poll_transmit(&a.mrs, &mut a.scq, &mut buf) {
            net.send(now, NodeId(0), NodeId(1), buf.clone());
            moved = true;
        }
        while b.qp.poll_transmit(&b.mrs, &mut b.scq, &mut buf) {
            net.send(now, NodeId(1), NodeId(0), buf.clone());
            moved = true;
        }
        while let Some(t) = net.next_delivery() {
            now = now.max(t);
            let (_, to, f) = net.deliver(t).unwrap();
            frames += 1;
            let n = if to == NodeId(1) { &mut *b } else { &mut *a };
            n.qp.handle_frame(&f, &mut n.mrs, &mut n.scq, &mut n.rcq);
            moved = true;
        }
        if !moved {
            return frames;
        }
    }
}

fn sg(key: u32, addr: u64, len: u32) -> ArrayVec<Sge, 8> {
    let mut v = ArrayVec::new();
    v.push(Sge {
        addr,
        length: len,
        lkey: key,
    });
    v
}

fn bytes(n: &Node, va: u64, len: usize) -> Vec<u8> {
    n.mrs.get(n.key).unwrap().slice(va, len).unwrap().to_vec()
}

fn polled(cq: &mut CompletionQueue) -> Vec<WorkCompletion> {
    let mut v = Vec::new();
    cq.poll(1000, &mut v);
    v
}

#[test]
fn write_of_every_size_lands_byte_for_byte() {
    for mtu in [Mtu::M256, Mtu::M1024, Mtu::M4096] {
        for len in [0u32, 1, 255, 256, 257, 4096, 4097, 65536, 1 << 20] {
            let (mut a, mut b) = pair(mtu, 0xff_fff0, 7);
            let wr = SendWr {
                wr_id: len as u64,
                op: SendOp::Write {
                    remote_addr: BASE + 3,
                    rkey: b.key,
                },
                sg: sg(a.key, BASE + 100, len),
                signaled: true,
                solicited: false,
            };
            a.qp.post_send(wr).unwrap();
            pump(&mut a, &mut b);
            assert_eq!(
                bytes(&b, BASE + 3, len as usize),
                bytes(&a, BASE + 100, len as usize),
                "{len} B at {mtu:?}"
            );
            let c = polled(&mut a.scq);
            assert_eq!(c.len(), 1, "{len} B: {c:?}");
            assert_eq!(
                (c[0].status, c[0].opcode, c[0].wr_id),
                (WcStatus::Success, WcOpcode::RdmaWrite, len as u64)
            );
            assert_eq!(a.qp.outstanding(), 0);
        }
    }
}

#[test]
fn send_with_immediate_and_invalidate_into_receive_buffers() {
    let (mut a, mut b) = pair(Mtu::M1024, 0, 0);
    for i in 0..3u64 {
        b.qp.post_recv(RecvWr {
            wr_id: 100 + i,
            sg: sg(b.key, BASE + i * 8192, 8192),
        })
        .unwrap();
    }
    let ops = [
        SendOp::Send,
        SendOp::SendWithImm(0xabcd),
        SendOp::SendWithInv(0x77),
    ];
    for (i, opv) in ops.iter().enumerate() {
        let len = [3000u32, 1024, 0][i];
        a.qp.post_send(SendWr {
            wr_id: i as u64,
            op: *opv,
            sg: sg(a.key, BASE + 50, len),
            signaled: true,
            solicited: false,
        })
        .unwrap();
    }
    pump(&mut a, &mut b);
    let r = polled(&mut b.rcq);
    assert_eq!(r.len(), 3);
    assert_eq!(
        (r[0].wr_id, r[0].byte_len, r[0].imm_data),
        (100, 3000, None)
    );
    assert_eq!(
        (r[1].wr_id, r[1].byte_len, r[1].imm_data),
        (101, 1024, Some(0xabcd))
    );
    assert_eq!(
        (r[2].wr_id, r[2].byte_len, r[2].invalidated_rkey),
        (102, 0, Some(0x77))
    );
    assert_eq!(bytes(&b, BASE, 3000), bytes(&a, BASE + 50, 3000));
    let s = polled(&mut a.scq);
    assert_eq!(
        s.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![
            (0, WcStatus::Success),
            (1, WcStatus::Success),
            (2, WcStatus::Success)
        ]
    );
}

#[test]
fn read_and_atomics_return_remote_data() {
    let (mut a, mut b) = pair(Mtu::M1024, 0xff_fffe, 0x100);
    let remote = bytes(&b, BASE + 7, 5000);
    a.qp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Read {
            remote_addr: BASE + 7,
            rkey: b.key,
        },
        sg: sg(a.key, BASE + 64, 5000),
        signaled: true,
        solicited: false,
    })
    .unwrap();
    // Put a known value at an aligned remote word, then fetch-add and compare-swap it.
    let target = BASE + 0x8_0000;
    b.mrs
        .get_mut(b.key)
        .unwrap()
        .slice_mut(target, 8)
        .unwrap()
        .copy_from_slice(&41u64.to_le_bytes());
    a.qp.post_send(SendWr {
        wr_id: 2,
        op: SendOp::FetchAdd {
            remote_addr: target,
            rkey: b.key,
            add: 1,
        },
        sg: sg(a.key, BASE + 0x9_0000, 8),
        signaled: true,
        solicited: false,
    })
    .unwrap();
    a.qp.post_send(SendWr {
        wr_id: 3,
        op: SendOp::CmpSwap {
            remote_addr: target,
            rkey: b.key,
            compare: 42,
            swap: 7,
        },
        sg: sg(a.key, BASE + 0x9_0008, 8),
        signaled: true,
        solicited: false,
    })
    .unwrap();
    pump(&mut a, &mut b);
    assert_eq!(bytes(&a, BASE + 64, 5000), remote, "READ data");
    assert_eq!(
        bytes(&a, BASE + 0x9_0000, 8),
        41u64.to_le_bytes(),
        "fetch-add returns the original"
    );
    assert_eq!(
        bytes(&a, BASE + 0x9_0008, 8),
        42u64.to_le_bytes(),
        "compare-swap sees the added value"
    );
    assert_eq!(bytes(&b, target, 8), 7u64.to_le_bytes(), "and swaps it");
    let c = polled(&mut a.scq);
    assert_eq!(
        c.iter()
            .map(|c| (c.wr_id, c.status, c.opcode))
            .collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success, WcOpcode::RdmaRead),
            (2, WcStatus::Success, WcOpcode::FetchAdd),
            (3, WcStatus::Success, WcOpcode::CompSwap)
        ]
    );
}

#[test]
fn rkey_violation_naks_errors_and_flushes() {
    let (mut a, mut b) = pair(Mtu::M1024, 0, 0);
    for (i, rkey) in [(1u64, b.key ^ 2), (2, b.key), (3, b.key)] {
        a.qp.post_send(SendWr {
            wr_id: i,
            op: SendOp::Write {
                remote_addr: BASE,
                rkey,
            },
            sg: sg(a.key, BASE, 64),
            signaled: true,
            solicited: false,
        })
        .unwrap();
    }
    pump(&mut a, &mut b);
    let c = polled(&mut a.scq);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![
            (1, WcStatus::RemAccessErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(a.qp.cfg.state, QpState::Err);
    assert_eq!(
        b.qp.cfg.state,
        QpState::Err,
        "the responder's QP goes to error too"
    );
}
