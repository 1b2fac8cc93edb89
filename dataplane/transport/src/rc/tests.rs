//! Two RC QPs joined by the simulator, on a clean network: every opcode, data checked.

use super::*;
use crate::mr::Access;
use crate::qp::{Mtu, Path, QpAttr};
use crate::testkit::{LinkPair, Node, NodeConfig, pump as link_pump, sim_attr};
use crate::wr::{SgList, Sge};
use netsim::Faults;
use wire::time::Instant;

/// The one post entry point, by value, as the tests post.
trait PostByValue {
    /// Posts `wr` under its own id.
    fn post(&mut self, wr: SendWr) -> Result<(), PostError>;
    /// Posts `wr` with `data` inline.
    fn post_inline(&mut self, wr: SendWr, data: &[u8]) -> Result<(), PostError>;
}

/// A harness node posts on its (one) QP.
impl PostByValue for Node {
    fn post(&mut self, wr: SendWr) -> Result<(), PostError> {
        self.qps[0].post(wr)
    }

    fn post_inline(&mut self, wr: SendWr, data: &[u8]) -> Result<(), PostError> {
        self.qps[0].post_inline(wr, data)
    }
}

impl PostByValue for RcQp {
    fn post(&mut self, wr: SendWr) -> Result<(), PostError> {
        self.post_send(&wr, wr.wr_id, None)
    }

    fn post_inline(&mut self, wr: SendWr, data: &[u8]) -> Result<(), PostError> {
        self.post_send(&wr, wr.wr_id, Some(data))
    }
}

const BASE: u64 = 0x10_0000;
const LEN: usize = 2 << 20;

fn node(qpn: u32, peer: u32, me: u8, other: u8, mtu: Mtu, sq_psn: u32, rq_psn: u32) -> Node {
    node_retries(qpn, peer, me, other, mtu, sq_psn, rq_psn, 7, 7)
}

#[allow(clippy::too_many_arguments)]
fn node_retries(
    qpn: u32,
    peer: u32,
    me: u8,
    other: u8,
    mtu: Mtu,
    sq_psn: u32,
    rq_psn: u32,
    retry_cnt: u8,
    rnr_retry: u8,
) -> Node {
    let all =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mem: Vec<u8> = (0..LEN)
        .map(|i| (i as u32).wrapping_mul(2654435761).wrapping_add(me as u32) as u8)
        .collect();
    let mut n = Node::new(
        NodeConfig {
            caps: QpCaps {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_inline_data: 400,
                ..Default::default()
            },
            cq_depth: 256,
            ..NodeConfig::new(BASE, mem)
        },
        &[qpn],
    );
    n.qps[0]
        .connect(&QpAttr {
            access: Some(all),
            sq_psn: Some(sq_psn),
            rq_psn: Some(rq_psn),
            retry_cnt: Some(retry_cnt),
            rnr_retry: Some(rnr_retry),
            max_rd_atomic: Some(4),
            max_dest_rd_atomic: Some(4),
            ..sim_attr(qpn, me, other, peer, mtu)
        })
        .unwrap();
    n
}

fn pair(mtu: Mtu, psn_a: u32, psn_b: u32) -> (Node, Node) {
    (
        node(0x11, 0x22, 1, 2, mtu, psn_a, psn_b),
        node(0x22, 0x11, 2, 1, mtu, psn_b, psn_a),
    )
}

/// Moves frames both ways through the simulator, running timers, until nothing is left to do
/// or `until`; `drop` sees every frame (from node 0 = a or 1 = b) and may discard it.
fn pump_with(
    a: &mut Node,
    b: &mut Node,
    until: Instant,
    drop: &mut dyn FnMut(u16, &[u8]) -> bool,
) -> Instant {
    pump_on(a, b, Faults::default(), until, &mut |from, f, _| {
        drop(from, f)
    })
}

/// [`pump_with`] with `ab` faults on the link from a to b (the harness's [`link_pump`]).
fn pump_on(
    a: &mut Node,
    b: &mut Node,
    ab: Faults,
    until: Instant,
    drop: &mut dyn FnMut(u16, &[u8], Instant) -> bool,
) -> Instant {
    link_pump(a, b, LinkPair::fast(ab), Instant(0), until, drop)
}

fn pump(a: &mut Node, b: &mut Node) -> Instant {
    pump_with(a, b, Instant(u64::MAX), &mut |_, _| false)
}

fn sg(key: u32, addr: u64, len: u32) -> SgList {
    let mut v = SgList::new();
    v.push(Sge {
        addr,
        length: len,
        lkey: key,
    });
    v
}

/// Stores `v` at `va` in the node's region.
fn set_word(n: &mut Node, va: u64, v: u64) {
    let key = n.key;
    let m = n.mrs.get_mut(key).unwrap();
    m.write(va, &v.to_le_bytes()).unwrap();
}

/// A signaled fetch-and-add of `add` at `target` in `b`, the original landing at `dst` in `a`.
fn fetch_add(a: &Node, b: &Node, id: u64, target: u64, add: u64, dst: u64) -> SendWr {
    SendWr {
        wr_id: id,
        op: SendOp::FetchAdd {
            remote_addr: target,
            rkey: b.key,
            add,
        },
        sg: sg(a.key, dst, 8),
        signaled: true,
        solicited: false,
        fence: false,
        inline: false,
        ud: None,
    }
}

fn bytes(n: &Node, va: u64, len: usize) -> Vec<u8> {
    n.mrs.get(n.key).unwrap().to_vec(va, len).unwrap()
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
                fence: false,
                inline: false,
                ud: None,
            };
            a.post(wr).unwrap();
            pump(&mut a, &mut b);
            assert_eq!(
                bytes(&b, BASE + 3, len as usize),
                bytes(&a, BASE + 100, len as usize),
                "{len} B at {mtu:?}"
            );
            let c = polled(&mut a.scq[0]);
            assert_eq!(c.len(), 1, "{len} B: {c:?}");
            assert_eq!(
                (c[0].status, c[0].opcode, c[0].wr_id),
                (WcStatus::Success, WcOpcode::RdmaWrite, len as u64)
            );
            assert_eq!(a.qps[0].outstanding(), 0);
        }
    }
}

#[test]
fn send_with_immediate_and_invalidate_into_receive_buffers() {
    let (mut a, mut b) = pair(Mtu::M1024, 0, 0);
    for i in 0..3u64 {
        b.qps[0]
            .post_recv(RecvWr {
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
        a.post(SendWr {
            wr_id: i as u64,
            op: *opv,
            sg: sg(a.key, BASE + 50, len),
            signaled: true,
            solicited: false,
            fence: false,
            inline: false,
            ud: None,
        })
        .unwrap();
    }
    pump(&mut a, &mut b);
    let r = polled(&mut b.rcq[0]);
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
    let s = polled(&mut a.scq[0]);
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
    a.post(SendWr {
        wr_id: 1,
        op: SendOp::Read {
            remote_addr: BASE + 7,
            rkey: b.key,
        },
        sg: sg(a.key, BASE + 64, 5000),
        signaled: true,
        solicited: false,
        fence: false,
        inline: false,
        ud: None,
    })
    .unwrap();
    // Put a known value at an aligned remote word, then fetch-add and compare-swap it.
    let target = BASE + 0x8_0000;
    set_word(&mut b, target, 41);
    a.post(fetch_add(&a, &b, 2, target, 1, BASE + 0x9_0000))
        .unwrap();
    a.post(SendWr {
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
        fence: false,
        inline: false,
        ud: None,
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
    let c = polled(&mut a.scq[0]);
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
    for n in [&mut a, &mut b] {
        let key = n.key;
        n.qps[0]
            .post_recv(RecvWr {
                wr_id: 70,
                sg: sg(key, BASE, 64),
            })
            .unwrap();
    }
    for (i, rkey) in [(1u64, b.key ^ 2), (2, b.key), (3, b.key)] {
        a.post(SendWr {
            wr_id: i,
            op: SendOp::Write {
                remote_addr: BASE,
                rkey,
            },
            sg: sg(a.key, BASE, 64),
            signaled: true,
            solicited: false,
            fence: false,
            inline: false,
            ud: None,
        })
        .unwrap();
    }
    pump(&mut a, &mut b);
    let c = polled(&mut a.scq[0]);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![
            (1, WcStatus::RemAccessErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(a.qps[0].cfg.state, QpState::Err);
    assert_eq!(
        b.qps[0].cfg.state,
        QpState::Err,
        "the responder's QP goes to error too"
    );
    // Both entered ERR by themselves (one took the NAK, one sent it): both receive queues
    // are flushed.
    for n in [&mut a, &mut b] {
        assert_eq!(
            polled(&mut n.rcq[0])
                .iter()
                .map(|c| (c.wr_id, c.status))
                .collect::<Vec<_>>(),
            vec![(70, WcStatus::WrFlushErr)]
        );
    }
}

fn syndrome_of(f: &[u8]) -> Option<u8> {
    let p = parse(f, Checks::ALL).ok()?;
    p.ext.aeth().map(|a| a.syndrome.to_byte())
}

fn opcode_of(f: &[u8]) -> Option<u8> {
    parse(f, Checks::ALL).ok().map(|p| p.opcode)
}

fn write_wr(a: &Node, b: &Node, id: u64, len: u32) -> SendWr {
    SendWr {
        wr_id: id,
        op: SendOp::Write {
            remote_addr: BASE,
            rkey: b.key,
        },
        sg: sg(a.key, BASE + 4096, len),
        signaled: true,
        solicited: false,
        fence: false,
        inline: false,
        ud: None,
    }
}

#[test]
fn rnr_is_retried_until_a_receive_is_posted() {
    let (mut a, mut b) = pair(Mtu::M1024, 0, 0);
    a.post(SendWr {
        wr_id: 9,
        op: SendOp::Send,
        sg: sg(a.key, BASE, 100),
        signaled: true,
        solicited: false,
        fence: false,
        inline: false,
        ud: None,
    })
    .unwrap();
    let mut rnr = 0;
    let t = pump_with(&mut a, &mut b, Instant(200_000), &mut |from, f| {
        if from == 1 && syndrome_of(f).is_some_and(|s| s >> 5 == 1) {
            rnr += 1;
        }
        false
    });
    assert!(
        rnr >= 5,
        "RNR NAKs every 10 us while no receive is posted: {rnr}"
    );
    assert!(polled(&mut a.scq[0]).is_empty());
    b.qps[0]
        .post_recv(RecvWr {
            wr_id: 1,
            sg: sg(b.key, BASE, 4096),
        })
        .unwrap();
    pump_with(
        &mut a,
        &mut b,
        Instant(t.as_nanos() + 1_000_000),
        &mut |_, _| false,
    );
    assert_eq!(
        polled(&mut a.scq[0])
            .iter()
            .map(|c| (c.wr_id, c.status))
            .collect::<Vec<_>>(),
        vec![(9, WcStatus::Success)]
    );
    assert_eq!(polled(&mut b.rcq[0])[0].byte_len, 100);
    assert_eq!(bytes(&b, BASE, 100), bytes(&a, BASE, 100));
}

#[test]
fn rnr_retries_run_out() {
    let mut a = node_retries(0x11, 0x22, 1, 2, Mtu::M1024, 0, 0, 7, 2);
    let mut b = node(0x22, 0x11, 2, 1, Mtu::M1024, 0, 0);
    a.post(SendWr {
        wr_id: 9,
        op: SendOp::Send,
        sg: sg(a.key, BASE, 100),
        signaled: true,
        solicited: false,
        fence: false,
        inline: false,
        ud: None,
    })
    .unwrap();
    a.post(write_wr(&a, &b, 10, 64)).unwrap();
    let mut sends = 0;
    pump_with(&mut a, &mut b, Instant(10_000_000), &mut |from, f| {
        if from == 0 && opcode_of(f) == Some(op::RC_SEND_ONLY) {
            sends += 1;
        }
        false
    });
    assert_eq!(sends, 3, "the first try and rnr_retry = 2 more");
    assert_eq!(b.qps[0].counters.out_of_buffer, 3);
    assert_eq!(a.qps[0].counters.rnr_nak_retry_err, 3);
    assert_eq!(a.qps[0].counters.req_rnr_retries_exceeded, 1);
    let c = polled(&mut a.scq[0]);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(9, WcStatus::RnrRetryExcErr), (10, WcStatus::WrFlushErr)]
    );
    assert_eq!(a.qps[0].cfg.state, QpState::Err);
}

#[test]
fn a_lost_packet_gets_one_sequence_nak_and_goes_back_n() {
    let (mut a, mut b) = pair(Mtu::M1024, 0xff_fffc, 0xff_fffc);
    a.post(write_wr(&a, &b, 1, 10 * 1024)).unwrap();
    let (mut seen, mut naks) = (0, 0);
    pump_with(&mut a, &mut b, Instant(u64::MAX), &mut |from, f| {
        if from == 1 && syndrome_of(f) == Some(0x60) {
            naks += 1;
        }
        if from == 0 {
            seen += 1;
            return seen == 3; // lose the third packet, once
        }
        false
    });
    assert_eq!(naks, 1, "one NAK per gap");
    assert_eq!(a.qps[0].counters.packet_seq_err, 1);
    // Packets 4.. arrived after the gap: the first was NAKed, the rest dropped.
    assert_eq!(b.qps[0].counters.out_of_sequence, 7);
    assert_eq!(b.qps[0].counters.rx_write_requests, 10);
    // Nothing lost but the one packet: every frame one side sent, the other received.
    assert_eq!(a.qps[0].counters.sent_pkts, b.qps[0].counters.rcvd_pkts + 1);
    assert_eq!(b.qps[0].counters.sent_pkts, a.qps[0].counters.rcvd_pkts);
    assert_eq!(
        bytes(&b, BASE, 10 * 1024),
        bytes(&a, BASE + 4096, 10 * 1024)
    );
    assert_eq!(polled(&mut a.scq[0])[0].status, WcStatus::Success);
}

#[test]
fn ack_timeout_retransmits_then_gives_up() {
    // One lost ACK: the timer resends, the responder re-ACKs the duplicate, done.
    let (mut a, mut b) = pair(Mtu::M1024, 0, 0);
    a.post(write_wr(&a, &b, 1, 100)).unwrap();
    let mut acks = 0;
    pump_with(&mut a, &mut b, Instant(u64::MAX), &mut |from, _| {
        if from == 1 {
            acks += 1;
            return acks == 1;
        }
        false
    });
    assert_eq!(polled(&mut a.scq[0])[0].status, WcStatus::Success);
    assert_eq!(acks, 2);
    // No ACK ever: retry_cnt = 3 resends, then RETRY_EXC_ERR and the rest flushed.
    let mut a = node_retries(0x11, 0x22, 1, 2, Mtu::M1024, 0, 0, 3, 7);
    let mut b = node(0x22, 0x11, 2, 1, Mtu::M1024, 0, 0);
    a.post(write_wr(&a, &b, 1, 100)).unwrap();
    a.post(write_wr(&a, &b, 2, 100)).unwrap();
    let mut sent = 0;
    let t = pump_with(&mut a, &mut b, Instant(u64::MAX), &mut |from, f| {
        if from == 0 && parse(f, Checks::ALL).is_ok_and(|p| p.psn == Psn::new(0)) {
            sent += 1;
        }
        from == 1
    });
    assert_eq!(sent, 4, "first try plus retry_cnt");
    assert_eq!(a.qps[0].counters.local_ack_timeout_err, 4);
    assert_eq!(a.qps[0].counters.req_transport_retries_exceeded, 1);
    assert_eq!(
        b.qps[0].counters.duplicate_request, 6,
        "the resends of both WRITEs"
    );
    let c = polled(&mut a.scq[0]);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    // timeout 14 = 67.1 ms; four of them.
    assert!(t.as_nanos() >= 4 * (4096u64 << 14), "{t:?}");
}

/// Runs only `n`'s timers from `from` on, as when its port takes no frame (link down, peer
/// gone): at most `limit` of them. The time of the last.
fn run_timers_alone(n: &mut Node, from: Instant, limit: usize) -> Instant {
    let mut now = from;
    for _ in 0..limit {
        let Some(t) = n.qps[0].poll_timeout() else {
            break;
        };
        now = now.max(t);
        n.qps[0].handle_timeout(now, &mut n.scq[0], &mut n.rcq[0]);
    }
    now
}

#[test]
fn a_qp_whose_port_cannot_send_still_times_out_and_fails() {
    // retry_cnt 3 at timeout 14 (67.1 ms): four timeouts, then RETRY_EXC_ERR, whether the
    // first frame left before the port stopped taking frames or never left at all.
    let timeout = 4096u64 << 14;
    for sent_before in [true, false] {
        let mut a = node_retries(0x11, 0x22, 1, 2, Mtu::M1024, 0, 0, 3, 7);
        let b = node(0x22, 0x11, 2, 1, Mtu::M1024, 0, 0);
        a.qps[0]
            .post_recv(RecvWr {
                wr_id: 50,
                sg: sg(a.key, BASE, 64),
            })
            .unwrap();
        a.post(write_wr(&a, &b, 1, 100)).unwrap();
        a.post(write_wr(&a, &b, 2, 100)).unwrap();
        if sent_before {
            let mut f = Vec::new();
            assert!(a.qps[0].poll_transmit(
                Instant(0),
                &a.mrs,
                &mut a.scq[0],
                &mut a.rcq[0],
                &mut f
            ));
        }
        let end = run_timers_alone(&mut a, Instant(0), 100);
        assert_eq!(
            a.qps[0].cfg.state,
            QpState::Err,
            "sent before: {sent_before}"
        );
        assert_eq!(a.qps[0].counters.local_ack_timeout_err, 4);
        assert_eq!(a.qps[0].counters.req_transport_retries_exceeded, 1);
        assert_eq!(
            end.as_nanos(),
            4 * timeout,
            "retry_cnt + 1 timeouts, no more"
        );
        assert_eq!(
            polled(&mut a.scq[0])
                .iter()
                .map(|c| (c.wr_id, c.status))
                .collect::<Vec<_>>(),
            vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
        );
        assert_eq!(
            polled(&mut a.rcq[0])
                .iter()
                .map(|c| (c.wr_id, c.status))
                .collect::<Vec<_>>(),
            vec![(50, WcStatus::WrFlushErr)],
            "entering ERR flushes the receive queue too"
        );
        assert_eq!(a.qps[0].poll_timeout(), None, "an errored QP has no timer");
    }
}

#[test]
fn an_idle_qp_or_one_that_waits_out_an_rnr_nak_does_not_time_out() {
    let (mut a, mut b) = pair(Mtu::M1024, 0, 0);
    assert_eq!(
        a.qps[0].poll_timeout(),
        None,
        "nothing posted, nothing owed"
    );
    // An RNR wait does not count against retry_cnt: the SEND waits for a receive, RNR NAK
    // after RNR NAK (rnr_retry 7: forever), far longer than the ACK timeout, then lands.
    a.post(SendWr {
        wr_id: 9,
        op: SendOp::Send,
        sg: sg(a.key, BASE, 100),
        signaled: true,
        solicited: false,
        fence: false,
        inline: false,
        ud: None,
    })
    .unwrap();
    let t = pump_with(&mut a, &mut b, Instant(300_000_000), &mut |_, _| false);
    assert_eq!(a.qps[0].cfg.state, QpState::Rts);
    assert_eq!(a.qps[0].counters.local_ack_timeout_err, 0);
    b.qps[0]
        .post_recv(RecvWr {
            wr_id: 1,
            sg: sg(b.key, BASE, 4096),
        })
        .unwrap();
    pump_with(
        &mut a,
        &mut b,
        Instant(t.as_nanos() + 20_000_000),
        &mut |_, _| false,
    );
    assert_eq!(polled(&mut a.scq[0])[0].status, WcStatus::Success);
    assert_eq!(
        a.qps[0].poll_timeout(),
        None,
        "all answered: the timer stops"
    );
}

/// A frame like `template` (a real one between the two nodes) with this opcode, PSN, RETH,
/// AETH and payload: what a peer, or someone forging its packets, could send.
fn forge(
    template: &[u8],
    opcode: u8,
    psn: u32,
    reth: Option<wire::reth::Repr>,
    aeth: Option<aeth::Repr>,
    payload: &[u8],
) -> Vec<u8> {
    let info = parse(template, Checks::ALL).unwrap();
    let mut repr = RoceRepr::parse(template, &info).unwrap();
    repr.bth.opcode = opcode;
    repr.bth.psn = Psn::new(psn);
    repr.bth.ack_req = true;
    repr.ext = ExtRepr {
        reth,
        aeth,
        ..Default::default()
    };
    let head = repr.header_len();
    let mut f = vec![0u8; repr.frame_len(payload.len())];
    f[head..head + payload.len()].copy_from_slice(payload);
    repr.emit(&mut f, payload.len(), false).unwrap();
    f
}

/// The first frame `n` sends for `wr`, taken off the wire (a template for forged ones).
fn first_frame(n: &mut Node, wr: SendWr) -> Vec<u8> {
    n.post(wr).unwrap();
    let mut f = Vec::new();
    assert!(n.qps[0].poll_transmit(Instant(0), &n.mrs, &mut n.scq[0], &mut n.rcq[0], &mut f));
    f
}

/// Hands `frames` to `n` and returns the AETH syndromes of everything it answers.
fn answers(n: &mut Node, frames: &[Vec<u8>]) -> Vec<u8> {
    for f in frames {
        n.qps[0].handle_frame(Instant(1), f, &mut n.mrs, &mut n.scq[0], &mut n.rcq[0]);
    }
    let mut out = Vec::new();
    let mut f = Vec::new();
    while n.qps[0].poll_transmit(Instant(1), &n.mrs, &mut n.scq[0], &mut n.rcq[0], &mut f) {
        out.extend(syndrome_of(&f));
    }
    out
}

/// Forged packets, as (opcode, payload bytes).
type Packets = &'static [(u8, usize)];

#[test]
fn a_request_from_another_source_than_the_qps_remote_is_dropped_and_counted() {
    use wire::reth;
    let (mut a, mut b) = pair(Mtu::M1024, 0, 0);
    let w = write_wr(&a, &b, 1, 64);
    let t = first_frame(&mut a, w);
    let before = bytes(&b, BASE, 64);
    let r = Some(reth::Repr {
        va: BASE,
        rkey: b.key,
        dma_len: 64,
    });
    let real = forge(&t, op::RC_WRITE_ONLY, 0, r, None, &[0x5a; 64]);
    // The same WRITE from 10.0.0.9, and one to an address B does not have: the QPN, PSN and
    // key are right, the addresses are not.
    let mut spoofed = Vec::new();
    for (src, dst) in [
        ([10, 0, 0, 9], [10, 0, 0, 2]),
        ([10, 0, 0, 1], [10, 0, 0, 7]),
    ] {
        let info = parse(&real, Checks::ALL).unwrap();
        let mut repr = RoceRepr::parse(&real, &info).unwrap();
        let IpRepr::V4(ip) = &mut repr.ip else {
            unreachable!()
        };
        (ip.src, ip.dst) = (src.into(), dst.into());
        let mut f = real.clone();
        repr.emit(&mut f, 64, false).unwrap();
        spoofed.push(f);
    }
    assert!(answers(&mut b, &spoofed).is_empty(), "no ACK, no NAK");
    assert_eq!(b.qps[0].counters.rx_wrong_source, 2);
    assert_eq!(b.qps[0].counters.rcvd_pkts, 0);
    assert_eq!(bytes(&b, BASE, 64), before, "nothing landed");
    assert_eq!(b.qps[0].cfg.rq_psn, Psn::new(0), "the PSN did not move");
    // The real one still lands.
    assert_eq!(answers(&mut b, &[real]), vec![0x1f]);
    assert_eq!(bytes(&b, BASE, 64), vec![0x5a; 64]);
}

#[test]
fn a_multi_packet_write_is_held_to_its_reth_length() {
    use wire::reth;
    const NAK_INVALID: u8 = 0x61;
    let k = |dma_len: u32, b: &Node| {
        Some(reth::Repr {
            va: BASE,
            rkey: b.key,
            dma_len,
        })
    };
    let mtu = vec![0xabu8; 1024];
    // (RETH DMA length, packets as (opcode, payload bytes)), and whether B takes the message.
    let cases: [(u32, Packets, bool); 6] = [
        // A FIRST for one MTU has nothing left for its MIDDLE and LAST: 3 KiB for 1 KiB.
        (
            1024,
            &[
                (op::RC_WRITE_FIRST, 1024),
                (op::RC_WRITE_MIDDLE, 1024),
                (op::RC_WRITE_LAST, 1024),
            ],
            false,
        ),
        // 2 KiB said, a MIDDLE and a LAST more sent.
        (
            2048,
            &[
                (op::RC_WRITE_FIRST, 1024),
                (op::RC_WRITE_MIDDLE, 1024),
                (op::RC_WRITE_LAST, 1024),
            ],
            false,
        ),
        // 2 KiB said, 1028 bytes sent.
        (
            2048,
            &[(op::RC_WRITE_FIRST, 1024), (op::RC_WRITE_LAST, 4)],
            false,
        ),
        // An ONLY shorter than its RETH.
        (100, &[(op::RC_WRITE_ONLY, 60)], false),
        // What the lengths say: 2 KiB and 2,052 bytes.
        (
            2048,
            &[(op::RC_WRITE_FIRST, 1024), (op::RC_WRITE_LAST, 1024)],
            true,
        ),
        (
            2052,
            &[
                (op::RC_WRITE_FIRST, 1024),
                (op::RC_WRITE_MIDDLE, 1024),
                (op::RC_WRITE_LAST, 4),
            ],
            true,
        ),
    ];
    for (i, (dma, pkts, good)) in cases.into_iter().enumerate() {
        let (mut a, mut b) = pair(Mtu::M1024, 0, 0);
        let before = bytes(&b, BASE, 8192);
        let w = write_wr(&a, &b, 1, 64);
        let t = first_frame(&mut a, w);
        let frames: Vec<Vec<u8>> = pkts
            .iter()
            .enumerate()
            .map(|(j, &(opc, len))| {
                let r = (j == 0).then(|| k(dma, &b)).flatten();
                forge(&t, opc, j as u32, r, None, &mtu[..len])
            })
            .collect();
        let got = answers(&mut b, &frames);
        let placed = bytes(&b, BASE, 8192);
        if good {
            assert_eq!(got.last(), Some(&0x1f), "case {i}: ACKed: {got:x?}");
            assert_eq!(b.qps[0].cfg.state, QpState::Rts, "case {i}");
            assert!(
                placed[..dma as usize].iter().all(|&x| x == 0xab),
                "case {i}"
            );
            assert_eq!(placed[dma as usize..], before[dma as usize..], "case {i}");
        } else {
            assert_eq!(got.last(), Some(&NAK_INVALID), "case {i}: {got:x?}");
            assert_eq!(b.qps[0].cfg.state, QpState::Err, "case {i}");
            let written = placed.iter().zip(&before).filter(|(x, y)| x != y).count();
            assert!(
                written <= dma as usize,
                "case {i}: {written} bytes written for {dma}"
            );
            assert_eq!(
                placed[dma as usize..],
                before[dma as usize..],
                "case {i}: past the RETH"
            );
        }
    }
}

#[test]
fn a_send_longer_than_its_receive_is_a_length_error_and_writes_nothing_past_it() {
    let (mut a, mut b) = pair(Mtu::M1024, 0, 0);
    b.qps[0]
        .post_recv(RecvWr {
            wr_id: 40,
            sg: sg(b.key, BASE, 1500),
        })
        .unwrap();
    let before = bytes(&b, BASE + 1024, 8192);
    a.post(SendWr {
        wr_id: 3,
        op: SendOp::Send,
        sg: sg(a.key, BASE + 4096, 3000),
        signaled: true,
        solicited: false,
        fence: false,
        inline: false,
        ud: None,
    })
    .unwrap();
    pump(&mut a, &mut b);
    let c = polled(&mut b.rcq[0]);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(40, WcStatus::LocLenErr)]
    );
    assert_eq!(polled(&mut a.scq[0])[0].status, WcStatus::RemInvReqErr);
    assert_eq!(b.qps[0].cfg.state, QpState::Err);
    // The first packet fit (1024 of 1500 bytes); the second did not and placed nothing.
    assert_eq!(bytes(&b, BASE + 1024, 8192), before);
}

#[test]
fn read_responses_are_held_to_the_reads_length() {
    use wire::opcode::op;
    let ack = Some(aeth::Repr {
        syndrome: Syndrome::Ack { credits: 31 },
        msn: 1,
    });
    // (READ length, responses as (opcode, payload bytes)).
    let cases: [(u32, Packets); 3] = [
        (100, &[(op::RC_READ_RESPONSE_ONLY, 50)]),
        (
            2048,
            &[
                (op::RC_READ_RESPONSE_FIRST, 1024),
                (op::RC_READ_RESPONSE_LAST, 4),
            ],
        ),
        (
            1500,
            &[
                (op::RC_READ_RESPONSE_FIRST, 1000),
                (op::RC_READ_RESPONSE_LAST, 500),
            ],
        ),
    ];
    for (i, (len, pkts)) in cases.into_iter().enumerate() {
        let (mut a, mut b) = pair(Mtu::M1024, 0, 0);
        let read = SendWr {
            wr_id: 5,
            op: SendOp::Read {
                remote_addr: BASE,
                rkey: b.key,
            },
            sg: sg(a.key, BASE + 8192, len),
            signaled: true,
            solicited: false,
            fence: false,
            inline: false,
            ud: None,
        };
        first_frame(&mut a, read);
        // B's frames carry B-to-A addressing: a template for its responses.
        let w = write_wr(&b, &a, 9, 64);
        let t = first_frame(&mut b, w);
        let before = bytes(&a, BASE + 8192, len as usize);
        let frames: Vec<Vec<u8>> = pkts
            .iter()
            .enumerate()
            .map(|(j, &(opc, n))| {
                let e = wire::opcode::lookup(opc)
                    .has(mask::AETH)
                    .then_some(ack)
                    .flatten();
                forge(&t, opc, j as u32, None, e, &vec![0xcd; n])
            })
            .collect();
        for f in &frames {
            a.qps[0].handle_frame(Instant(1), f, &mut a.mrs, &mut a.scq[0], &mut a.rcq[0]);
        }
        let c = polled(&mut a.scq[0]);
        assert_eq!(
            c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            vec![(5, WcStatus::LocLenErr)],
            "case {i}"
        );
        assert_eq!(a.qps[0].cfg.state, QpState::Err, "case {i}");
        let after = bytes(&a, BASE + 8192, len as usize);
        let bad_at = pkts
            .iter()
            .position(|&(_, n)| n != 1024.min(len as usize))
            .unwrap();
        assert!(
            after[bad_at * 1024..] == before[bad_at * 1024..],
            "case {i}: the bad response was not placed"
        );
    }
}

#[test]
fn an_ack_for_a_psn_never_sent_is_ignored() {
    let (mut a, mut b) = pair(Mtu::M1024, 0, 0);
    a.post(write_wr(&a, &b, 1, 100)).unwrap();
    let mut real_ack = None;
    pump_with(&mut a, &mut b, Instant(50_000), &mut |from, f| {
        if from == 1 {
            real_ack = Some(f.to_vec());
            return true; // hold it back
        }
        false
    });
    let ack = real_ack.expect("B acknowledged");
    // The same ACK, for PSN 1000.
    let info = parse(&ack, Checks::ALL).unwrap();
    let mut repr = RoceRepr::parse(&ack, &info).unwrap();
    repr.bth.psn = Psn::new(1000);
    let mut forged = vec![0u8; repr.frame_len(0)];
    repr.emit(&mut forged, 0, false).unwrap();
    a.qps[0].handle_frame(
        Instant(5),
        &forged,
        &mut a.mrs,
        &mut a.scq[0],
        &mut a.rcq[0],
    );
    assert!(
        polled(&mut a.scq[0]).is_empty(),
        "nothing completes on a PSN never sent"
    );
    assert_eq!(a.qps[0].outstanding(), 1);
    a.qps[0].handle_frame(Instant(6), &ack, &mut a.mrs, &mut a.scq[0], &mut a.rcq[0]);
    assert_eq!(
        polled(&mut a.scq[0])[0].status,
        WcStatus::Success,
        "the real one still works"
    );
}

#[test]
fn duplicate_read_is_re_executed() {
    let (mut a, mut b) = pair(Mtu::M1024, 0, 0);
    a.post(SendWr {
        wr_id: 1,
        op: SendOp::Read {
            remote_addr: BASE + 12,
            rkey: b.key,
        },
        sg: sg(a.key, BASE, 3000),
        signaled: true,
        solicited: false,
        fence: false,
        inline: false,
        ud: None,
    })
    .unwrap();
    let mut first = 0;
    pump_with(&mut a, &mut b, Instant(u64::MAX), &mut |from, f| {
        if from == 1 && opcode_of(f) == Some(op::RC_READ_RESPONSE_FIRST) {
            first += 1;
            return first == 1; // lose the first response packet once
        }
        false
    });
    assert_eq!(first, 2, "the READ was asked for and answered again");
    assert_eq!(bytes(&a, BASE, 3000), bytes(&b, BASE + 12, 3000));
    assert_eq!(polled(&mut a.scq[0])[0].status, WcStatus::Success);
}

#[test]
fn read_responses_past_a_hole_are_kept_and_the_read_asked_again_from_the_hole() {
    // A READ of 8 packets from a PSN that wraps; response 2 is lost once and response 5 twice.
    // The rest are placed as they arrive; the LAST response shows the holes, so the READ is
    // asked again at once (no ACK timeout) from the first hole, and then from the second.
    let (mut a, mut b) = pair(Mtu::M256, 0xff_fffd, 0);
    a.post(SendWr {
        wr_id: 1,
        op: SendOp::Read {
            remote_addr: BASE + 100,
            rkey: b.key,
        },
        sg: sg(a.key, BASE, 8 * 256),
        signaled: true,
        solicited: false,
        fence: false,
        inline: false,
        ud: None,
    })
    .unwrap();
    let mut requests = Vec::new();
    let mut lost = [0; 8];
    let end = pump_with(&mut a, &mut b, Instant(u64::MAX), &mut |from, f| {
        let info = parse(f, Checks::ALL).unwrap();
        if from == 0 {
            let r = info.ext.reth().unwrap();
            requests.push((info.psn.value(), r.dma_len));
            return false;
        }
        let k = info.psn.diff(Psn::new(0xff_fffd)) as usize;
        if (k == 2 && lost[k] < 1) || (k == 5 && lost[k] < 2) {
            lost[k] += 1;
            return true;
        }
        false
    });
    let first = Psn::new(0xff_fffd);
    assert_eq!(
        requests,
        vec![
            (first.value(), 8 * 256),
            (first.add(2).value(), 6 * 256),
            (first.add(5).value(), 3 * 256),
        ]
    );
    assert!(
        end < Instant(1_000_000),
        "no ACK timeout was needed: {end:?}"
    );
    assert_eq!(bytes(&a, BASE, 8 * 256), bytes(&b, BASE + 100, 8 * 256));
    let c = polled(&mut a.scq[0]);
    assert_eq!((c.len(), c[0].status), (1, WcStatus::Success));
}

#[test]
fn duplicate_atomic_is_answered_from_the_replay_cache() {
    let (mut a, mut b) = pair(Mtu::M1024, 0, 0);
    let target = BASE + 0x100;
    set_word(&mut b, target, 100);
    a.post(fetch_add(&a, &b, 1, target, 5, BASE)).unwrap();
    let mut acks = 0;
    pump_with(&mut a, &mut b, Instant(u64::MAX), &mut |from, f| {
        if from == 1 && opcode_of(f) == Some(op::RC_ATOMIC_ACK) {
            acks += 1;
            return acks == 1;
        }
        false
    });
    assert_eq!(acks, 2);
    assert_eq!(
        bytes(&b, target, 8),
        105u64.to_le_bytes(),
        "added once, not twice"
    );
    assert_eq!(
        bytes(&a, BASE, 8),
        100u64.to_le_bytes(),
        "the original value, both times"
    );
    assert_eq!(polled(&mut a.scq[0])[0].status, WcStatus::Success);
}

#[test]
fn completion_queue_overflow() {
    let (mut a, mut b) = pair(Mtu::M1024, 0, 0);
    a.scq[0] = CompletionQueue::new(1);
    a.post(write_wr(&a, &b, 1, 10)).unwrap();
    a.post(write_wr(&a, &b, 2, 10)).unwrap();
    pump(&mut a, &mut b);
    assert!(a.scq[0].in_error());
    assert_eq!(polled(&mut a.scq[0]).len(), 1);
}

#[test]
fn inline_sends_and_writes_carry_the_bytes_given_at_post_time() {
    let (mut a, mut b) = pair(Mtu::M256, 0xff_fff0, 0);
    let mut data: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
    let want = data.clone();
    let len_of = |id: u64| {
        if id.is_multiple_of(100) {
            300
        } else {
            (id % 300) as usize + 1
        }
    };
    // Three rounds of more work requests than the send queue holds, so inline slots are reused.
    for round in 0..3u64 {
        for i in 0..30u64 {
            let id = round * 100 + i;
            b.qps[0]
                .post_recv(RecvWr {
                    wr_id: id,
                    sg: sg(b.key, BASE + 8192, 300),
                })
                .unwrap();
            let len = len_of(id);
            let wr = |op| SendWr {
                wr_id: id,
                op,
                sg: SgList::new(),
                signaled: true,
                solicited: false,
                fence: false,
                inline: false,
                ud: None,
            };
            a.post_inline(wr(SendOp::Send), &data[..len]).unwrap();
            a.post_inline(
                wr(SendOp::Write {
                    remote_addr: BASE + 4096,
                    rkey: b.key,
                }),
                &data[..len],
            )
            .unwrap();
        }
        // The caller's buffer may change as soon as the posts return.
        data.iter_mut().for_each(|x| *x = 0xee);
        // Lose the second packet of the first 300-byte message once: go-back-N rebuilds
        // packets from the inline copy.
        let mut lost = false;
        pump_with(&mut a, &mut b, Instant(u64::MAX), &mut |from, f| {
            let p = parse(f, Checks::ALL).unwrap();
            if from == 0 && !lost && p.opcode == op::RC_SEND_LAST {
                lost = true;
                return true;
            }
            false
        });
        assert!(lost);
        let s = polled(&mut a.scq[0]);
        assert_eq!(s.len(), 60);
        assert!(s.iter().all(|c| c.status == WcStatus::Success), "{s:?}");
        let r = polled(&mut b.rcq[0]);
        assert_eq!(r.len(), 30);
        for c in &r {
            assert_eq!(c.status, WcStatus::Success);
            assert_eq!(c.byte_len as usize, len_of(c.wr_id));
        }
        assert_eq!(bytes(&b, BASE + 8192, 30), want[..30].to_vec());
        assert_eq!(bytes(&b, BASE + 4096, 30), want[..30].to_vec());
        data.copy_from_slice(&want);
    }
}

#[test]
fn copies_of_one_request_post_under_their_own_ids() {
    // A stream posts the same request again and again: by reference, each copy under its
    // own wr_id, either gathering from its SG list or with inline bytes in place of it.
    let (mut a, mut b) = pair(Mtu::M1024, 0, 0);
    let template = SendWr::new(
        7,
        SendOp::Write {
            remote_addr: BASE + 4096,
            rkey: b.key,
        },
        sg(a.key, BASE, 64),
    );
    let key = a.key;
    a.mrs
        .get_mut(key)
        .unwrap()
        .write(BASE, &[0x5a; 64])
        .unwrap();
    for id in 100..104 {
        a.qps[0].post_send(&template, id, None).unwrap();
    }
    // Inline bytes in place of a request's SG list: the request says so (its SG list is then
    // where the bytes were gathered from); an unflagged one with an SG list is ambiguous.
    let flagged = SendWr {
        inline: true,
        ..template
    };
    let bad = PostError::Wr(WrError::BadInline);
    assert_eq!(
        a.qps[0].post_send(&template, 104, Some(&[0xc3; 16])),
        Err(bad)
    );
    a.qps[0]
        .post_send(&flagged, 104, Some(&[0xc3; 16]))
        .unwrap();
    pump_with(&mut a, &mut b, Instant(u64::MAX), &mut |_, _| false);
    let s = polled(&mut a.scq[0]);
    let ids: Vec<u64> = s.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, vec![100, 101, 102, 103, 104], "{s:?}");
    assert!(s.iter().all(|c| c.status == WcStatus::Success), "{s:?}");
    // The last, inline copy wrote its own 16 bytes over the first 16 of the others' 64.
    let mut want = vec![0xc3; 16];
    want.extend([0x5a; 48]);
    assert_eq!(bytes(&b, BASE + 4096, 64), want);
    // The template is untouched, and bad inline copies are refused.
    assert_eq!((template.wr_id, template.sg.len()), (7, 1));
    let read = SendWr {
        op: SendOp::Read {
            remote_addr: BASE,
            rkey: b.key,
        },
        ..template
    };
    assert_eq!(a.qps[0].post_send(&read, 1, Some(&[1])), Err(bad));
    assert_eq!(a.qps[0].post_send(&flagged, 1, Some(&[0; 401])), Err(bad));
    let ungathered = SendWr {
        inline: true,
        ..template
    };
    assert_eq!(a.qps[0].post_send(&ungathered, 1, None), Err(bad));
}

#[test]
fn caps_are_checked_at_create_and_post() {
    let mut mrs = MrTable::new();
    let pd = mrs.alloc_pd();
    let bad = |c: QpCaps| RcQp::new(1, pd, c).unwrap_err();
    let d = QpCaps::default();
    assert_eq!(
        bad(QpCaps {
            max_send_wr: 0,
            ..d
        }),
        CapsError::OutOfRange("max_send_wr")
    );
    assert_eq!(
        bad(QpCaps {
            max_recv_wr: 20000,
            ..d
        }),
        CapsError::OutOfRange("max_recv_wr")
    );
    assert_eq!(
        bad(QpCaps {
            max_send_sge: 9,
            ..d
        }),
        CapsError::OutOfRange("max_send_sge")
    );
    assert_eq!(
        bad(QpCaps {
            max_recv_sge: 0,
            ..d
        }),
        CapsError::OutOfRange("max_recv_sge")
    );
    assert_eq!(
        bad(QpCaps {
            max_inline_data: 513,
            ..d
        }),
        CapsError::OutOfRange("max_inline_data")
    );

    let (mut a, _b) = pair(Mtu::M1024, 0, 0);
    let key = a.key;
    let wr = |op, n: usize| SendWr {
        wr_id: 9,
        op,
        sg: (0..n)
            .map(|i| Sge {
                addr: BASE + i as u64 * 8,
                length: 8,
                lkey: key,
            })
            .collect(),
        signaled: true,
        solicited: false,
        fence: false,
        inline: false,
        ud: None,
    };
    let write = SendOp::Write {
        remote_addr: BASE,
        rkey: 1,
    };
    let read = SendOp::Read {
        remote_addr: BASE,
        rkey: 1,
    };
    let too_long = vec![0u8; 401];
    let bad_post = PostError::Wr(WrError::BadInline);
    assert_eq!(a.post_inline(wr(write, 0), &too_long), Err(bad_post));
    assert_eq!(a.post_inline(wr(write, 1), &[1, 2]), Err(bad_post));
    assert_eq!(a.post_inline(wr(read, 0), &[1, 2]), Err(bad_post));
    // A QP with fewer SGEs than the device refuses longer lists.
    let mut small = RcQp::new(
        7,
        a.qps[0].pd,
        QpCaps {
            max_send_sge: 2,
            max_recv_sge: 1,
            ..d
        },
    )
    .unwrap();
    small
        .connect(&QpAttr::connect(Path::sim(1, 2, 0xc007), Mtu::M1024, 8))
        .unwrap();
    let too_many = PostError::Wr(WrError::TooManySge);
    assert_eq!(small.post(wr(write, 3)), Err(too_many));
    assert_eq!(small.post(wr(write, 2)), Ok(()));
    assert_eq!(
        small.post_recv(RecvWr {
            wr_id: 1,
            sg: wr(write, 2).sg
        }),
        Err(too_many)
    );
    assert_eq!(small.outstanding(), 1, "refused posts left nothing behind");
}

#[test]
fn a_fenced_write_waits_for_the_read_before_it() {
    for fence in [false, true] {
        let (mut a, mut b) = pair(Mtu::M1024, 0, 0);
        let old = bytes(&b, BASE + 64, 2000);
        a.post(SendWr {
            wr_id: 1,
            op: SendOp::Read {
                remote_addr: BASE + 64,
                rkey: b.key,
            },
            sg: sg(a.key, BASE, 2000),
            signaled: true,
            solicited: false,
            fence: false,
            inline: false,
            ud: None,
        })
        .unwrap();
        a.post(SendWr {
            wr_id: 2,
            op: SendOp::Write {
                remote_addr: BASE + 64,
                rkey: b.key,
            },
            sg: sg(a.key, BASE + 8192, 2000),
            signaled: true,
            solicited: false,
            fence,
            inline: false,
            ud: None,
        })
        .unwrap();
        // The order frames leave in: 'R' READ request, 'r' its last response, 'W' the WRITE.
        let mut order = String::new();
        pump_with(&mut a, &mut b, Instant(u64::MAX), &mut |_, f| {
            match opcode_of(f) {
                Some(op::RC_READ_REQUEST) => order.push('R'),
                Some(op::RC_READ_RESPONSE_LAST) => order.push('r'),
                Some(op::RC_WRITE_FIRST) => order.push('W'),
                _ => {}
            }
            false
        });
        let c = polled(&mut a.scq[0]);
        assert_eq!(c.len(), 2);
        assert!(c.iter().all(|c| c.status == WcStatus::Success));
        assert_eq!(order, if fence { "RrW" } else { "RWr" });
        assert_eq!(
            bytes(&a, BASE, 2000),
            old,
            "the READ saw memory before the WRITE"
        );
        assert_eq!(bytes(&b, BASE + 64, 2000), bytes(&a, BASE + 8192, 2000));
    }
}

#[test]
fn re_asked_reads_do_not_use_up_max_dest_rd_atomic() {
    // The responder admits 2 READs at a time. READ A is answered; then A is asked again three
    // times and, before the responder has sent anything (as when its responses are paced),
    // new READs B and C arrive. The replays must not count as new READs, or B would be
    // refused with NAK invalid request and the QP would fail.
    let (mut a, mut b) = pair(Mtu::M1024, 0, 0);
    b.qps[0].cfg.max_dest_rd_atomic = 2;
    let mut frames = Vec::new();
    for (i, off) in [0u64, 4096, 8192].into_iter().enumerate() {
        a.post(SendWr {
            wr_id: i as u64,
            op: SendOp::Read {
                remote_addr: BASE + off,
                rkey: b.key,
            },
            sg: sg(a.key, BASE + off, 2048),
            signaled: true,
            solicited: false,
            fence: false,
            inline: false,
            ud: None,
        })
        .unwrap();
        let mut f = Vec::new();
        assert!(a.qps[0].poll_transmit(Instant(0), &a.mrs, &mut a.scq[0], &mut a.rcq[0], &mut f));
        frames.push(f);
    }
    let mut deliver =
        |f: &[u8]| b.qps[0].handle_frame(Instant(0), f, &mut b.mrs, &mut b.scq[0], &mut b.rcq[0]);
    deliver(&frames[0]);
    let mut sent = Vec::new();
    let mut f = Vec::new();
    let mut drain = |b: &mut Node, sent: &mut Vec<u8>| {
        while b.qps[0].poll_transmit(Instant(0), &b.mrs, &mut b.scq[0], &mut b.rcq[0], &mut f) {
            sent.push(opcode_of(&f).unwrap());
            assert_ne!(syndrome_of(&f).map(|s| s >> 5), Some(3), "no NAK");
        }
    };
    drain(&mut b, &mut sent);
    for _ in 0..3 {
        b.qps[0].handle_frame(
            Instant(0),
            &frames[0],
            &mut b.mrs,
            &mut b.scq[0],
            &mut b.rcq[0],
        );
    }
    b.qps[0].handle_frame(
        Instant(0),
        &frames[1],
        &mut b.mrs,
        &mut b.scq[0],
        &mut b.rcq[0],
    );
    b.qps[0].handle_frame(
        Instant(0),
        &frames[2],
        &mut b.mrs,
        &mut b.scq[0],
        &mut b.rcq[0],
    );
    drain(&mut b, &mut sent);
    use op::{RC_READ_RESPONSE_FIRST as F, RC_READ_RESPONSE_LAST as L};
    // A, then A once more (the replays supersede each other), then B and C.
    assert_eq!(sent, [F, L, F, L, F, L, F, L]);
    assert_eq!(b.qps[0].cfg.state, QpState::Rts);
}

/// `f` with AckReq cleared (headers re-emitted, so the ICRC is right).
fn without_ack_req(f: &[u8]) -> Vec<u8> {
    let info = parse(f, Checks::ALL).unwrap();
    let mut repr = RoceRepr::parse(f, &info).unwrap();
    repr.bth.ack_req = false;
    let payload = info.payload(f);
    let mut out = vec![0u8; repr.frame_len(payload.len())];
    let h = repr.header_len();
    out[h..h + payload.len()].copy_from_slice(payload);
    repr.emit(&mut out, payload.len(), false).unwrap();
    out
}

#[test]
fn the_responder_acks_at_message_end_and_every_64_packets_without_ack_req() {
    let (mut a, mut b) = pair(Mtu::M256, 0, 0);
    // Three one-packet WRITEs and one of 100 packets, none asking for an ACK.
    for (id, len) in [(1, 10), (2, 20), (3, 30), (4, 100 * 256)] {
        a.post(write_wr(&a, &b, id, len)).unwrap();
    }
    let mut frames = Vec::new();
    let mut f = Vec::new();
    while a.qps[0].poll_transmit(Instant(0), &a.mrs, &mut a.scq[0], &mut a.rcq[0], &mut f) {
        frames.push(without_ack_req(&f));
    }
    assert_eq!(frames.len(), 103);
    let mut acks = Vec::new();
    let mut step = |b: &mut Node, fs: &[Vec<u8>]| {
        for f in fs {
            b.qps[0].handle_frame(Instant(0), f, &mut b.mrs, &mut b.scq[0], &mut b.rcq[0]);
        }
        while b.qps[0].poll_transmit(Instant(0), &b.mrs, &mut b.scq[0], &mut b.rcq[0], &mut f) {
            let p = parse(&f, Checks::ALL).unwrap();
            assert_eq!(p.opcode, op::RC_ACK);
            acks.push(p.psn.value());
        }
    };
    // The three small messages arrive together: their ACKs coalesce into one for the last.
    step(&mut b, &frames[..3]);
    // The long one: an ACK after 64 packets, and one at its end.
    step(&mut b, &frames[3..3 + 64]);
    step(&mut b, &frames[3 + 64..]);
    assert_eq!(acks, [2, 66, 102]);
}

#[test]
fn ce_marks_bring_cnps_that_cut_and_pace_the_sender() {
    use crate::cc::{Cc, CcKind, DcqcnParams};
    let mut finish = Vec::new();
    for kind in [CcKind::Dcqcn, CcKind::None] {
        let (mut a, mut b) = pair(Mtu::M1024, 0, 0);
        let p = DcqcnParams {
            min_time_between_cnps: 10,
            ..DcqcnParams::nvidia()
        };
        a.qps[0].set_congestion_control(kind, 100e9, p);
        b.qps[0].set_congestion_control(kind, 100e9, p);
        // B's frames carry VLAN 100 at PCP 3; its CNPs must go at cnp_802p_prio (6).
        if let Some(path) = b.qps[0].cfg.path.as_mut() {
            path.vlan = Some((100, 3));
        }
        b.qps[0].refresh_template();
        // 16 WRITEs of 64 KiB: 1024 packets, every one marked CE on the way to B.
        for id in 0..16 {
            a.post(write_wr(&a, &b, id, 64 << 10)).unwrap();
        }
        let ce = Faults {
            ce_mark: 1.0,
            ..Faults::default()
        };
        let mut cnps = Vec::new();
        let mut last_data = Instant::ZERO;
        let end = pump_on(
            &mut a,
            &mut b,
            ce,
            Instant(u64::MAX),
            &mut |from, f, now| {
                let p = parse(f, Checks::ALL).unwrap();
                if from == 1 && p.opcode == op::CNP {
                    cnps.push((
                        p.dest_qp,
                        p.dscp,
                        p.ecn,
                        p.becn,
                        p.vlan.map(|v| (v.vid, v.pcp)),
                    ));
                }
                if from == 1 && p.opcode == op::RC_ACK {
                    assert_eq!(p.vlan.map(|v| v.pcp), Some(3), "ACKs keep the path's PCP");
                }
                if from == 0 {
                    last_data = now;
                }
                false
            },
        );
        let c = polled(&mut a.scq[0]);
        assert_eq!(c.len(), 16);
        assert!(c.iter().all(|c| c.status == WcStatus::Success));
        assert_eq!(bytes(&b, BASE, 64 << 10), bytes(&a, BASE + 4096, 64 << 10));
        assert_eq!(b.qps[0].counters.np_ecn_marked_roce_packets, 1024);
        let sent = b.qps[0].counters.np_cnp_sent;
        assert_eq!(sent as usize, cnps.len());
        assert_eq!(a.qps[0].counters.rp_cnp_received, sent);
        // One CNP per 10 us at most.
        assert!(
            sent >= 1 && sent <= end.as_nanos() / 10_000 + 1,
            "{sent} CNPs in {end:?}"
        );
        for c in &cnps {
            assert_eq!(*c, (0x11, 48, Ecn::NotEct, true, Some((100, 6))));
        }
        match (kind, a.qps[0].cc()) {
            (CcKind::Dcqcn, Cc::Dcqcn(d)) => {
                let (handled, ignored) = d_counts(d);
                assert_eq!(handled + ignored, sent);
                // After the traffic the timers raise the rate back to line rate; then the QP
                // is no longer limited and has no timers.
                assert_eq!(d.rate(), 100e9);
                assert!(!d.is_limited() && a.qps[0].poll_timeout().is_none());
                assert!(end > last_data);
            }
            (CcKind::None, Cc::None { .. }) => {
                assert_eq!(a.qps[0].cc().rate(), 100e9);
                assert_eq!(a.qps[0].cc().cnp_counts(), (0, sent));
                // 1024 packets of ~1.1 KB at 100 Gb/s: about 92 us.
                assert!(last_data < Instant(100_000), "{last_data:?}");
            }
            _ => unreachable!(),
        }
        finish.push(last_data.as_nanos() as f64);
    }
    // Paced after the cuts, the same data takes clearly longer with DCQCN.
    assert!(finish[0] > 1.3 * finish[1], "{finish:?}");
}

fn d_counts(d: &crate::cc::Dcqcn) -> (u64, u64) {
    (d.cnp_handled, d.cnp_ignored)
}

#[test]
fn dcqcn_settings_change_at_run_time_per_qp() {
    use crate::cc::{Cc, CcKind, DcqcnParams};
    let (mut a, _b) = pair(Mtu::M1024, 0, 0);
    let p = DcqcnParams {
        rate_reduce_monitor_period: 0,
        initial_alpha_value: 1024,
        rpg_byte_reset: 0,
        ..DcqcnParams::nvidia()
    };
    a.qps[0].set_congestion_control(CcKind::Dcqcn, 100e9, p);
    // A CNP from the peer QP: rate halves (alpha 1).
    let mut cnp = Vec::new();
    let mut peer = node(0x22, 0x11, 2, 1, Mtu::M1024, 0, 0);
    peer.qps[0].set_congestion_control(CcKind::Dcqcn, 100e9, p);
    a.post(write_wr(&a, &peer, 1, 100)).unwrap();
    let mut f = Vec::new();
    assert!(a.qps[0].poll_transmit(Instant(0), &a.mrs, &mut a.scq[0], &mut a.rcq[0], &mut f));
    assert!(netsim::mark_ce(&mut f));
    peer.qps[0].handle_frame(
        Instant(1),
        &f,
        &mut peer.mrs,
        &mut peer.scq[0],
        &mut peer.rcq[0],
    );
    while peer.qps[0].poll_transmit(
        Instant(1),
        &peer.mrs,
        &mut peer.scq[0],
        &mut peer.rcq[0],
        &mut cnp,
    ) {
        if opcode_of(&cnp) == Some(op::CNP) {
            a.qps[0].handle_frame(Instant(2), &cnp, &mut a.mrs, &mut a.scq[0], &mut a.rcq[0]);
        }
    }
    let rate = |a: &Node| match a.qps[0].cc() {
        Cc::Dcqcn(d) => (d.rate(), d.target()),
        _ => unreachable!(),
    };
    assert_eq!(rate(&a), (50e9, 100e9));
    assert_eq!(a.qps[0].cc().cnp_counts(), (1, 0));
    assert_eq!(a.qps[0].counters.rp_cnp_received, 1);
    assert_eq!(peer.qps[0].counters.np_cnp_sent, 1);
    // Raise this QP's timer period to 1 ms at run time: no increase at 300 us, one at 1 ms.
    a.qps[0].set_cc_params(DcqcnParams {
        rpg_time_reset: 1000,
        ..p
    });
    assert_eq!(a.qps[0].cc_params().rpg_time_reset, 1000);
    a.qps[0].handle_timeout(Instant(2 + 300_000), &mut a.scq[0], &mut a.rcq[0]);
    assert_eq!(
        rate(&a).0,
        75e9,
        "the timer armed before the change fires once more"
    );
    a.qps[0].handle_timeout(Instant(2 + 600_000), &mut a.scq[0], &mut a.rcq[0]);
    assert_eq!(rate(&a).0, 75e9, "then it runs every 1 ms");
    a.qps[0].handle_timeout(Instant(2 + 1_300_000), &mut a.scq[0], &mut a.rcq[0]);
    assert_eq!(rate(&a).0, 87.5e9);
}

#[test]
fn sqd_finishes_begun_messages_and_starts_no_new_ones() {
    use crate::qp::QpAttr;
    let (mut a, mut b) = pair(Mtu::M1024, 0, 0);
    a.post(write_wr(&a, &b, 1, 3000)).unwrap();
    a.post(write_wr(&a, &b, 2, 100)).unwrap();
    // The first packet of WR 1 leaves, then the QP is asked to drain.
    let mut f = Vec::new();
    assert!(a.qps[0].poll_transmit(Instant(0), &a.mrs, &mut a.scq[0], &mut a.rcq[0], &mut f));
    b.qps[0].handle_frame(Instant(1), &f, &mut b.mrs, &mut b.scq[0], &mut b.rcq[0]);
    a.qps[0]
        .modify(&QpAttr {
            state: Some(QpState::Sqd),
            ..Default::default()
        })
        .unwrap();
    // Lose WR 1's last packet once: the drain still retransmits it.
    let mut lost = false;
    pump_with(&mut a, &mut b, Instant(u64::MAX), &mut |from, f| {
        if from == 0 && !lost && opcode_of(f) == Some(op::RC_WRITE_LAST) {
            lost = true;
            return true;
        }
        assert_ne!(
            opcode_of(f),
            Some(op::RC_WRITE_ONLY),
            "WR 2 must not start in SQD"
        );
        false
    });
    assert!(lost);
    let c = polled(&mut a.scq[0]);
    assert_eq!(c.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [1]);
    assert_eq!(a.qps[0].outstanding(), 1);
    // Back to RTS: WR 2 goes.
    a.qps[0]
        .modify(&QpAttr {
            state: Some(QpState::Rts),
            ..Default::default()
        })
        .unwrap();
    pump(&mut a, &mut b);
    assert_eq!(polled(&mut a.scq[0])[0].wr_id, 2);
}

#[test]
fn frames_build_the_same_in_a_vec_and_in_a_buffer_with_headroom() {
    use wire::buf::HeapBuf;
    let (mut a1, b) = pair(Mtu::M1024, 5, 0);
    let (mut a2, _) = pair(Mtu::M1024, 5, 0);
    for a in [&mut a1, &mut a2] {
        a.post(write_wr(a, &b, 1, 2500)).unwrap();
    }
    let mut v = Vec::new();
    let mut h = HeapBuf::new();
    for _ in 0..3 {
        assert!(a1.qps[0].poll_transmit(
            Instant(0),
            &a1.mrs,
            &mut a1.scq[0],
            &mut a1.rcq[0],
            &mut v
        ));
        assert!(a2.qps[0].poll_transmit(
            Instant(0),
            &a2.mrs,
            &mut a2.scq[0],
            &mut a2.rcq[0],
            &mut h
        ));
        assert_eq!(v, h.data());
        assert!(parse(h.data(), Checks::ALL).is_ok());
    }
    assert!(!a2.qps[0].poll_transmit(Instant(0), &a2.mrs, &mut a2.scq[0], &mut a2.rcq[0], &mut h));
    // A buffer too small for the MTU's payload gets no frame, and nothing is lost: the packet
    // is built later into one that fits.
    let (mut a3, _) = pair(Mtu::M4096, 0, 0);
    a3.post(write_wr(&a3, &b, 1, 4096)).unwrap();
    struct Small(HeapBuf);
    impl PacketBuf for Small {
        wire::buf::delegate_heap_buf!();
        fn append(&mut self, len: usize) -> Option<&mut [u8]> {
            // A 2 KiB data room, like a small mbuf.
            (self.0.len() + len <= 2048).then(|| self.0.append(len))?
        }
    }
    let mut small = Small(HeapBuf::new());
    assert!(!a3.qps[0].poll_transmit(
        Instant(0),
        &a3.mrs,
        &mut a3.scq[0],
        &mut a3.rcq[0],
        &mut small
    ));
    assert!(a3.qps[0].poll_transmit(Instant(0), &a3.mrs, &mut a3.scq[0], &mut a3.rcq[0], &mut h));
    assert_eq!(parse(h.data(), Checks::ALL).unwrap().payload_len, 4096);
}

const QKEY: u32 = 0x1111_1111;

/// A UD QP in RTS (Q_Key [`QKEY`], MTU 1024) with the same region as [`node`].
fn ud_node(qpn: u32, me: u8) -> Node {
    let mut n = Node::new(
        NodeConfig {
            access: Access::LOCAL_WRITE,
            caps: QpCaps {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_inline_data: 64,
                qp_type: QpType::Ud,
                ..Default::default()
            },
            cq_depth: 64,
            ..NodeConfig::new(BASE, vec![0u8; LEN])
        },
        &[qpn],
    );
    n.qps[0]
        .activate_ud(QKEY, Mtu::M1024, 0x100 * me as u32)
        .unwrap();
    n
}

fn ud_send(from: &Node, id: u64, at: u64, len: u32, dest_qp: u32, qkey: u32) -> SendWr {
    SendWr {
        ud: Some(crate::wr::UdDest {
            path: Path::sim(1, 2, 0xd078),
            dest_qp,
            qkey,
        }),
        ..SendWr::new(id, SendOp::Send, sg(from.key, at, len))
    }
}

#[test]
fn ud_datagrams_land_after_the_grh_and_name_their_sender() {
    let (mut a, mut b) = (ud_node(0x13, 1), ud_node(0x24, 2));
    for (i, w) in [0x10_0000u64, 0x10_1000].iter().enumerate() {
        b.qps[0]
            .post_recv(RecvWr {
                wr_id: 50 + i as u64,
                sg: sg(b.key, *w, 40 + 600),
            })
            .unwrap();
    }
    a.mrs
        .get_mut(a.key)
        .unwrap()
        .write(BASE + 0x8000, &[0xab; 600])
        .unwrap();
    a.post(ud_send(&a, 7, BASE + 0x8000, 600, 0x24, QKEY))
        .unwrap();
    let mut frames = Vec::new();
    pump_with(&mut a, &mut b, Instant(u64::MAX), &mut |_, f| {
        frames.push(f.to_vec());
        false
    });
    // One frame each way would be RC; UD sends one datagram and nothing answers it.
    assert_eq!(frames.len(), 1);
    let info = parse(&frames[0], Checks::ALL).unwrap();
    assert_eq!(info.opcode, op::UD_SEND_ONLY);
    assert!(!info.ack_req);
    assert_eq!((info.dest_qp, info.psn), (0x24, Psn::new(0x100)));
    let d = info.ext.deth().unwrap();
    assert_eq!((d.qkey, d.src_qp), (QKEY, 0x13));
    let sent = polled(&mut a.scq[0]);
    assert_eq!(
        (sent.len(), sent[0].wr_id, sent[0].status, sent[0].byte_len),
        (1, 7, WcStatus::Success, 600)
    );
    let got = polled(&mut b.rcq[0]);
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].wr_id, got[0].status, got[0].byte_len, got[0].src_qp),
        (50, WcStatus::Success, 640, Some(0x13))
    );
    // The GRH area: zeros, then the IPv4 header as it arrived; then the payload.
    let grh = bytes(&b, BASE, 40);
    assert_eq!(&grh[..20], &[0u8; 20][..]);
    assert_eq!(&grh[20..], &frames[0][14..34]);
    assert_eq!(bytes(&b, BASE + 40, 600), vec![0xab; 600]);
    // The next datagram takes the next PSN and, with immediate data, reports it.
    a.post(SendWr {
        op: SendOp::SendWithImm(0xfeed),
        ..ud_send(&a, 8, BASE + 0x8000, 10, 0x24, QKEY)
    })
    .unwrap();
    frames.clear();
    pump_with(&mut a, &mut b, Instant(u64::MAX), &mut |_, f| {
        frames.push(f.to_vec());
        false
    });
    let info = parse(&frames[0], Checks::ALL).unwrap();
    assert_eq!(
        (info.opcode, info.psn),
        (op::UD_SEND_ONLY_IMM, Psn::new(0x101))
    );
    let got = polled(&mut b.rcq[0]);
    assert_eq!(
        (got[0].wr_id, got[0].imm_data, got[0].byte_len),
        (51, Some(0xfeed), 50)
    );
}

#[test]
fn ud_drops_wrong_qkeys_and_datagrams_without_a_receive() {
    let (mut a, mut b) = (ud_node(0x13, 1), ud_node(0x24, 2));
    // No receive posted: dropped, counted as out_of_buffer, no RNR NAK, nothing resent.
    a.post(ud_send(&a, 1, BASE, 8, 0x24, QKEY)).unwrap();
    let mut n = 0;
    pump_with(&mut a, &mut b, Instant(u64::MAX), &mut |_, _| {
        n += 1;
        false
    });
    assert_eq!(n, 1);
    assert_eq!(b.qps[0].counters.out_of_buffer, 1);
    assert_eq!(polled(&mut a.scq[0])[0].status, WcStatus::Success);
    // A receive is there, but the Q_Key is wrong: dropped, and the receive stays.
    b.qps[0]
        .post_recv(RecvWr {
            wr_id: 9,
            sg: sg(b.key, BASE, 100),
        })
        .unwrap();
    a.post(ud_send(&a, 2, BASE, 8, 0x24, 0x2222)).unwrap();
    pump(&mut a, &mut b);
    assert_eq!(b.qps[0].counters.qkey_violations, 1);
    assert!(polled(&mut b.rcq[0]).is_empty());
    // A buffer too small for GRH + payload: LOC_LEN_ERR, and the QP stops.
    a.post(ud_send(&a, 3, BASE, 80, 0x24, QKEY)).unwrap();
    pump(&mut a, &mut b);
    let got = polled(&mut b.rcq[0]);
    assert_eq!((got[0].wr_id, got[0].status), (9, WcStatus::LocLenErr));
    assert_eq!(b.qps[0].cfg.state, QpState::Err);
}

#[test]
fn ud_posts_are_checked() {
    let mut a = ud_node(0x13, 1);
    let mut q = a.qps.remove(0);
    let e = |r: Result<(), PostError>| r.unwrap_err().to_string();
    let to_b = |wr: SendWr| SendWr {
        ud: Some(crate::wr::UdDest {
            path: Path::sim(1, 2, 0xd078),
            dest_qp: 0x24,
            qkey: QKEY,
        }),
        ..wr
    };
    let send = SendWr::new(1, SendOp::Send, sg(a.key, BASE, 8));
    assert!(e(q.post(send)).contains("destination"));
    let write = SendWr {
        op: SendOp::Write {
            remote_addr: BASE,
            rkey: 1,
        },
        ..to_b(send)
    };
    assert!(e(q.post(write)).contains("only SEND"));
    let long = SendWr {
        sg: sg(a.key, BASE, 1025),
        ..to_b(send)
    };
    assert!(e(q.post(long)).contains("one packet"));
    let mut mixed = to_b(send);
    if let Some(d) = mixed.ud.as_mut() {
        d.path.remote_ip = "fd00::2".parse().unwrap();
    }
    assert!(e(q.post(mixed)).contains("destination"));
    assert_eq!(q.outstanding(), 0, "refused posts leave nothing behind");
    q.post(to_b(send)).unwrap();
    // An RC QP takes no destination.
    let (mut rc, _) = pair(Mtu::M1024, 0, 0);
    assert!(e(rc.post(to_b(send))).contains("destination"));
}
