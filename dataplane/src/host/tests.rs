//! The host on lcores over in-memory links: QPN rotation, traffic, tests, handoffs.

use super::*;
use crate::cc::{CcKind, DcqcnParams};
use crate::counters::LcoreCounters;
use crate::lcore::{Command, LcoreId, StdClock, Worker};
use crate::port::PortInfo;
use crate::port::mem::link;
use crossbeam_channel::unbounded;
use std::sync::Arc;
use transport::device::DeviceError;
use transport::perftest::LatKind;
use transport::qp::Mtu;
use transport::rc::QpCaps;
use transport::wr::SendOp;
use transport::wr::SendWr;

/// How long a test may take.
const WAIT: std::time::Duration = std::time::Duration::from_secs(20);

fn info(i: u16) -> PortInfo {
    PortInfo::virtual_port(i, 9000)
}

/// Runs `host` on queue `q` in a thread, as an lcore would.
fn spawn<Q: PortQueue + 'static>(
    i: usize,
    q: Q,
    host: RdmaHost<Q::Buf>,
) -> (HostControl, std::thread::JoinHandle<Vec<Q>>) {
    let (tx, rx) = unbounded();
    let w = Worker::new(
        LcoreId(i as u16),
        vec![q],
        host,
        StdClock::new(),
        Arc::new(LcoreCounters::default()),
        rx,
    );
    (tx, std::thread::spawn(move || w.run()))
}

/// A QP with the default caps and no congestion control, unconnected.
fn plain_qp(ctl: &HostControl) -> u32 {
    ask(ctl, |h, _| {
        let p = DcqcnParams::nvidia();
        h.dev
            .create_qp(QpCaps::default(), None, [None; 2], CcKind::None, p)
    })
    .unwrap()
    .unwrap()
}

/// Stops the workers and waits for them.
fn stop_all<'a, T>(
    ctls: impl IntoIterator<Item = &'a HostControl>,
    threads: Vec<std::thread::JoinHandle<T>>,
) {
    for c in ctls {
        c.send(Command::Stop).unwrap();
    }
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn a_destroyed_qps_number_waits_behind_a_thousand_others_before_it_is_given_again() {
    let (qa, _qb) = link(info(1), info(2), 64);
    let (a, t) = spawn(0, qa, RdmaHost::new(0, 0, 100e9));
    let create = || plain_qp(&a);
    let destroy = |qpn| assert!(ask(&a, move |h, _| h.dev.destroy_qp(qpn)).unwrap());
    // Create and destroy one QP at a time, as short perftest runs do: no number comes
    // back while fewer than QPN_QUARANTINE others are free.
    let mut seen = std::collections::HashSet::new();
    for _ in 0..=QPN_QUARANTINE {
        let q = create();
        assert!(seen.insert(q), "QPN {q:#x} given again too soon");
        destroy(q);
    }
    // Then the oldest freed number, first of them all, comes back.
    let first = *seen.iter().min().unwrap();
    assert_eq!(create(), first);
    stop_all([&a], vec![t]);
}

#[test]
fn frames_to_a_destroyed_qp_do_not_land_on_the_next_qp_connected_to_the_same_node() {
    let (qa, qb) = link(info(1), info(2), 8192);
    let (a, ta) = spawn(0, qa, RdmaHost::new(0, 0, 100e9));
    let (b, tb) = spawn(1, qb, RdmaHost::new(1, 0, 100e9));
    // B's end of a first pair goes away (its application exited), A's goes on sending:
    // WRITEs, retransmitted every ACK timeout, to B's old QP number.
    let old = connect_pair(&a, &b, Mtu::M1024, CcKind::None).unwrap();
    assert!(ask(&b, move |h, _| h.dev.destroy_qp(old.qpb)).unwrap());
    for id in 0..4 {
        let wr = SendWr::new(
            id,
            SendOp::Write {
                remote_addr: PAIR_VA,
                rkey: old.kb,
            },
            transport::wr::Sge::list(PAIR_VA, 4096, old.ka),
        );
        ask(&a, move |h, now| h.dev.post_send(old.qpa, &wr, None, now))
            .unwrap()
            .unwrap();
    }
    // A new pair between the same two nodes, while those retransmissions go on.
    let new = connect_pair(&a, &b, Mtu::M1024, CcKind::None).unwrap();
    std::thread::sleep(core::time::Duration::from_millis(400));
    let q = ask(&b, move |h, now| h.dev.query(new.qpb, now))
        .unwrap()
        .unwrap();
    assert_eq!(
        (q.counters.rcvd_pkts, q.counters.out_of_sequence),
        (0, 0),
        "the old QP's frames reached the new one: {:?}",
        q.counters
    );
    let qa = ask(&a, move |h, now| h.dev.query(new.qpa, now))
        .unwrap()
        .unwrap();
    assert_eq!(qa.counters.rcvd_pkts, 0, "{:?}", qa.counters);
    assert_ne!(new.qpb, old.qpb, "B's old QP number given again at once");
    stop_all([&a, &b], vec![ta, tb]);
}

#[test]
fn two_lcores_move_rdma_traffic_over_an_in_memory_link() {
    let (qa, qb) = link(info(1), info(2), 8192);
    let mut ctls = Vec::new();
    let mut threads = Vec::new();
    for (i, q) in [qa, qb].into_iter().enumerate() {
        let (tx, t) = spawn(i, q, RdmaHost::new(i as u32, 0, 100e9));
        threads.push(t);
        ctls.push(tx);
    }
    let (a, b) = (&ctls[0], &ctls[1]);
    for mtu in [Mtu::M1024, Mtu::M4096, Mtu::M256] {
        pair_check(a, b, mtu).unwrap();
    }
    // The lcores' counters, destroyed QPs included: 1 MiB WRITE at three MTUs, three READs
    // and three fetch-and-adds, and every frame one side sent the other received.
    let ca = ask(a, |h, now| h.counters(now)).unwrap().dev.qp;
    let cb = ask(b, |h, now| h.counters(now)).unwrap().dev.qp;
    assert_eq!(cb.rx_write_requests, 1024 + 256 + 4096);
    assert_eq!((cb.rx_atomic_requests, ca.rx_read_requests), (3, 3));
    assert_eq!((ca.sent_pkts, cb.sent_pkts), (cb.rcvd_pkts, ca.rcvd_pkts));
    assert_eq!(
        ca.packet_seq_err + ca.local_ack_timeout_err,
        0,
        "a clean link"
    );
    // A stream the lcore keeps posted itself: 2000 WRITEs of 4 KiB, 16 outstanding.
    let pair = connect_pair(a, b, Mtu::M4096, CcKind::Dcqcn).unwrap();
    let wr = SendWr::new(
        0,
        SendOp::Write {
            remote_addr: PAIR_VA,
            rkey: pair.kb,
        },
        transport::wr::Sge::list(PAIR_VA, 4096, pair.ka),
    );
    let r_wr = wr;
    let r = ask_test(a, WAIT, move |h, now, reply| {
        h.tests
            .stream(&mut h.dev, now, pair.qpa, wr, (2000, 16, None), reply)
    })
    .unwrap()
    .unwrap();
    assert_eq!((r.completed, r.errors), (2000, 0));
    // Selective signalling (perftest's --cq-mod): 1003 WRITEs, one in 7 signalled and the
    // last, 16 outstanding: every one counted, from 144 completions (the histogram of WRITE
    // completion latency counts them).
    let writes = |h: &mut crate::host::Shard| h.dev.latencies().by_opcode[1].len();
    let before = ask(a, move |h, _| writes(h)).unwrap();
    let r = ask_test(a, WAIT, move |h, now, reply| {
        let shape = transport::perftest::Shape {
            count: 1003,
            depth: 16,
            duration: None,
            cq_mod: 7,
        };
        h.tests.stream(&mut h.dev, now, pair.qpa, wr, shape, reply)
    })
    .unwrap()
    .unwrap();
    assert_eq!((r.completed, r.errors), (1003, 0));
    let after = ask(a, move |h, _| writes(h)).unwrap();
    assert_eq!(
        after - before,
        1003 / 7 + 1,
        "completions only for signalled requests"
    );
    // Duration mode (perftest's -D): a count it could never reach, stopped by the clock;
    // what was out completes, and none of the count left over is an error.
    let d = Some(core::time::Duration::from_millis(100));
    let r = ask_test(a, WAIT, move |h, now, reply| {
        let shape = (u64::MAX, 16, d);
        h.tests
            .stream(&mut h.dev, now, pair.qpa, r_wr, shape, reply)
    })
    .unwrap()
    .unwrap();
    assert!(r.completed > 0 && r.errors == 0, "{r:?}");
    assert!(r.elapsed_ns >= 100_000_000, "{r:?}");
    // A timed READ latency test (perftest's -D): no margin under a second, so the window
    // is the whole 100 ms; the iterations are those that completed in it.
    let read = SendWr::new(
        0,
        SendOp::Read {
            remote_addr: PAIR_VA,
            rkey: pair.kb,
        },
        transport::wr::Sge::list(PAIR_VA, 8, pair.ka),
    );
    let r = ask_test(a, WAIT, move |h, now, reply| {
        let test = (LatKind::Request, read, false);
        h.tests
            .latency(&mut h.dev, now, pair.qpa, test, 0, d, reply)
    })
    .unwrap()
    .unwrap();
    let sample = r.sample.expect("a timed test's sample");
    assert!(r.errors == 0 && r.posted_ns.is_empty(), "{r:?}");
    assert!(sample.iters > 0 && r.elapsed_ns >= 100_000_000, "{r:?}");
    // The window closes at the first completion past the deadline: how long after it is the
    // scheduler's on a shared CPU (this bound was once 110 ms and failed under load), so
    // only its bounds are asserted here; its exact length is checked on simulated time
    // (`perftest::latency` tests).
    assert!(
        sample.window_ns >= 100_000_000 && sample.window_ns <= r.elapsed_ns,
        "{r:?}"
    );
    // A QP that is not connected cannot stream.
    let q = plain_qp(a);
    let refused = ask_test(a, WAIT, move |h, now, reply| {
        h.tests
            .stream(&mut h.dev, now, q, r_wr, (1, 1, None), reply)
    })
    .unwrap();
    assert_eq!(refused.unwrap_err(), TestError::NotRts(q));
    assert!(r.elapsed_ns > 0);
    // QPNs carry their owner.
    let q = plain_qp(b);
    assert_eq!(shard_of(q), 1);
    // Wrong input gets an answer, not a panic.
    let wr = SendWr::new(9, SendOp::Send, transport::wr::SgList::new());
    let r = ask(a, move |h, now| h.dev.post_send(0x77, &wr, None, now)).unwrap();
    assert_eq!(r.unwrap_err(), DeviceError::NoQp(0x77));
    assert!(!ask(a, |h, _| h.dev.destroy_qp(0x77)).unwrap());
    stop_all(&ctls, threads);
}

#[test]
fn two_lcores_over_impaired_links_recover_everything() {
    use crate::port::impair::{Direction, Impaired, Impairments};
    let (qa, qb) = link(info(1), info(2), 8192);
    let mut ctls = Vec::new();
    let mut handles = Vec::new();
    let mut threads = Vec::new();
    for (i, q) in [qa, qb].into_iter().enumerate() {
        let (q, h) = Impaired::new(q, StdClock::new(), 11 + i as u64);
        h.set(
            Direction::Tx,
            crate::port::impair::Impairments {
                loss: 0.01,
                reorder: 0.01,
                reorder_delay: std::time::Duration::from_micros(20),
                duplicate: 0.01,
                ..Impairments::default()
            },
        )
        .unwrap();
        let (tx, t) = spawn(i, q, RdmaHost::new(i as u32, 0, 100e9));
        threads.push(t);
        ctls.push(tx);
        handles.push(h);
    }
    let (a, b) = (&ctls[0], &ctls[1]);
    for mtu in [Mtu::M1024, Mtu::M4096] {
        pair_check(a, b, mtu).unwrap();
    }
    let ca = ask(a, |h, now| h.counters(now)).unwrap().dev.qp;
    let cb = ask(b, |h, now| h.counters(now)).unwrap().dev.qp;
    let st = &handles[0].stats.tx;
    assert!(st.lost.get() > 0 && st.duplicated.get() > 0 && st.reordered.get() > 0);
    // The losses were repaired by retransmission, and duplicates were recognised.
    assert!(
        ca.packet_seq_err + ca.implied_nak_seq_err + ca.local_ack_timeout_err > 0,
        "{ca:?}"
    );
    assert!(cb.duplicate_request + cb.out_of_sequence > 0, "{cb:?}");
    stop_all(&ctls, threads);
}

#[test]
fn frames_on_another_lcores_queue_are_handed_to_the_owner() {
    // Two nodes of two lcores, queue i of one joined to queue i of the other (a port with
    // two queues and no RSS). A's QP lives on its lcore 0, B's on its lcore 1: A's frames
    // arrive on B's lcore 0 and B's answers on A's lcore 1, and both must be handed over.
    let (a0, b0) = link(info(1), info(2), 8192);
    let (a1, b1) = link(info(1), info(2), 8192);
    let mut ctls: Vec<Vec<HostControl>> = vec![Vec::new(), Vec::new()];
    let mut threads = Vec::new();
    for (node, queues) in [(0, [a0, a1]), (1, [b0, b1])] {
        let hosts = RdmaHost::sharded(2, 0, 100e9);
        for (i, (q, h)) in queues.into_iter().zip(hosts).enumerate() {
            let (tx, t) = spawn(i, q, h);
            threads.push(t);
            ctls[node].push(tx);
        }
    }
    pair_check(&ctls[0][0], &ctls[1][1], Mtu::M1024).unwrap();
    let handed = |c: &HostControl| ask(c, |h, now| h.counters(now)).unwrap();
    let (b_lcore0, a_lcore1) = (handed(&ctls[1][0]), handed(&ctls[0][1]));
    assert!(b_lcore0.handoffs >= 1024, "{b_lcore0:?}");
    assert!(a_lcore1.handoffs > 0, "{a_lcore1:?}");
    assert_eq!(b_lcore0.handoff_drops + a_lcore1.handoff_drops, 0);
    stop_all(ctls.iter().flatten(), threads);
}

/// An application's side of one QP's rings, and roced's, in one piece of shared memory.
mod app_rings {
    use super::*;
    use verbs::abi::{self, Cqe, SendWqe, WrOpcode, send_flags};
    use verbs::bell::{BELL_BYTES, Bell, Bells};
    use verbs::ring::{Consumer, Producer, RingLayout};
    use verbs::shm::SharedMem;

    pub(super) struct App {
        pub sq: Producer,
        pub scq: Consumer,
        pub mem: Arc<SharedMem>,
        /// Its doorbell, and the bit that rings its QP.
        pub bell: Bell,
        pub bit: u32,
        /// What the lcore sets when it abandons the QP's queues.
        pub fault: crate::host::Fault,
    }

    /// Rings for QP `qpn` of `host`: the application's ends, and the lcore's attached (one
    /// completion ring for both of its queues, as a QP created with one CQ has).
    pub(super) fn attach(host: &HostControl, qpn: u32) -> App {
        let (mut app, q, cq) = rings(qpn);
        let bells = Bells::new(app.mem.clone(), app.mem.len() - BELL_BYTES).unwrap();
        app.bit = ask(host, move |h, _| {
            let n = h.apps.add_cq(cq, None, Default::default());
            let bells = h.apps.add_bells(bells);
            h.apps.attach(
                &mut h.dev,
                AppQueues {
                    send_cq: n,
                    recv_cq: n,
                    bells,
                    ..q
                },
            )
        })
        .unwrap()
        .unwrap();
        app
    }

    /// Rings for QP `qpn`: the application's ends, the lcore's queues and its completion ring.
    pub(super) fn rings(qpn: u32) -> (App, AppQueues, Producer) {
        let sq = RingLayout::new(16, 128).unwrap();
        let rq = RingLayout::new(16, 64).unwrap();
        let cq = RingLayout::new(64, 32).unwrap();
        let at = [
            0,
            sq.bytes(),
            sq.bytes() + rq.bytes(),
            sq.bytes() + rq.bytes() + cq.bytes(),
        ];
        let bell_at = (at[3] + cq.bytes()).next_multiple_of(64);
        let mem = Arc::new(SharedMem::create("ferroce-app-test", bell_at + BELL_BYTES).unwrap());
        let app = App {
            sq: Producer::new(mem.clone(), at[0], sq).unwrap(),
            scq: Consumer::new(mem.clone(), at[2], cq).unwrap(),
            mem: mem.clone(),
            bell: Bell::new(mem.clone(), bell_at).unwrap(),
            bit: 0,
            fault: Default::default(),
        };
        let lcore = AppQueues {
            qpn,
            sq: Consumer::new(mem.clone(), at[0], sq).unwrap(),
            rq: Consumer::new(mem.clone(), at[1], rq).unwrap(),
            send_cq: 0,
            recv_cq: 0,
            pd: 0,
            bells: 0,
            fault: app.fault.clone(),
        };
        (app, lcore, Producer::new(mem, at[2], cq).unwrap())
    }

    pub(super) fn write(id: u64, lkey: u32, rkey: u32, off: u64, len: u32) -> SendWqe<'static> {
        let mut sg = arrayvec::ArrayVec::new();
        sg.push(abi::Sge {
            addr: PAIR_VA + off,
            length: len,
            lkey,
        });
        SendWqe {
            wr_id: id,
            opcode: WrOpcode::Write,
            flags: send_flags::SIGNALED,
            imm: 0,
            remote_addr: PAIR_VA + off,
            rkey,
            compare_add: 0,
            swap: 0,
            ud: abi::UdTarget::default(),
            sg,
            inline: &[],
        }
    }

    impl App {
        pub fn post(&mut self, w: &SendWqe<'_>) {
            let mut slot = [0u8; 128];
            let n = w.encode(&mut slot).unwrap();
            assert!(self.sq.push(&slot[..n]).unwrap(), "send queue full");
            self.bell.ring(self.bit);
        }

        /// The next completion, waiting up to 20 s.
        pub fn completion(&mut self) -> Cqe {
            let t = std::time::Instant::now();
            let mut b = [0u8; abi::CQE_BYTES];
            while t.elapsed() < WAIT {
                if self.scq.pop(&mut b).unwrap() {
                    return Cqe::decode(&b);
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            panic!("no completion in {WAIT:?}");
        }
    }
}

#[test]
fn an_application_posts_through_its_rings_and_bad_entries_stay_with_their_qp() {
    use app_rings::{attach, write};
    use verbs::abi::{SendWqe, WrOpcode, send_flags};
    let (qa, qb) = link(info(1), info(2), 8192);
    let (a, ta) = spawn(0, qa, RdmaHost::new(0, 0, 100e9));
    let (b, tb) = spawn(1, qb, RdmaHost::new(1, 0, 100e9));
    let one = connect_pair(&a, &b, Mtu::M1024, CcKind::None).unwrap();
    let two = connect_pair(&a, &b, Mtu::M1024, CcKind::None).unwrap();
    let mut app1 = attach(&a, one.qpa);
    let mut app2 = attach(&a, two.qpa);
    let pattern: Vec<u8> = (0..8192u32).map(|i| (i * 13 + 5) as u8).collect();
    let p = pattern.clone();
    let ka = one.ka;
    ask(&a, move |h, _| h.dev.write_mr(ka, PAIR_VA, &p))
        .unwrap()
        .unwrap();

    // A WRITE and an inline WRITE from the application's ring land, byte for byte.
    app1.post(&write(1, one.ka, one.kb, 0, 8192));
    let c = app1.completion();
    assert_eq!((c.wr_id, c.status, c.opcode, c.qp_num), (1, 0, 1, one.qpa));
    let kb = one.kb;
    let got = ask(&b, move |h, _| h.dev.read_mr(kb, PAIR_VA, 8192))
        .unwrap()
        .unwrap();
    assert_eq!(got, pattern);
    let words = b"written inline from an application's ring";
    app1.post(&SendWqe {
        flags: send_flags::SIGNALED | send_flags::INLINE,
        sg: arrayvec::ArrayVec::new(),
        inline: words,
        ..write(2, 0, one.kb, 0x10000, 0)
    });
    assert_eq!(app1.completion().status, 0);
    let n = words.len();
    let got = ask(&b, move |h, _| h.dev.read_mr(kb, PAIR_VA + 0x10000, n))
        .unwrap()
        .unwrap();
    assert_eq!(&got[..], &words[..]);

    // An entry that does not decode completes in error under its wr_id and takes its QP to
    // ERR; what follows it completes flushed.
    let mut bad = [0u8; 128];
    write(3, one.ka, one.kb, 0, 64).encode(&mut bad).unwrap();
    bad[8] = 7; // IBV_WR_LOCAL_INV: not offered
    assert!(app1.sq.push(&bad).unwrap());
    app1.bell.ring(app1.bit);
    let c = app1.completion();
    assert_eq!((c.wr_id, c.status), (3, 2), "IBV_WC_LOC_QP_OP_ERR");
    app1.post(&write(4, one.ka, one.kb, 0, 64));
    let c = app1.completion();
    assert_eq!((c.wr_id, c.status), (4, 5), "IBV_WC_WR_FLUSH_ERR");
    let q = one.qpa;
    let st = ask(&a, move |h, now| h.dev.query(q, now)).unwrap().unwrap();
    assert_eq!(st.cfg.state, transport::qp::QpState::Err);

    // The other application QP on the lcore does not notice, nor after its neighbour's ring
    // is corrupted (a producer index far past the ring).
    // SAFETY: the send ring's producer index, at the start of the shared memory.
    unsafe { (app1.mem.as_ptr() as *mut u32).write_volatile(1000) };
    app1.bell.ring(app1.bit);
    let p2 = pattern.clone();
    let ka2 = two.ka;
    ask(&a, move |h, _| h.dev.write_mr(ka2, PAIR_VA, &p2))
        .unwrap()
        .unwrap();
    for id in 10..20 {
        app2.post(&SendWqe {
            opcode: WrOpcode::Write,
            ..write(id, two.ka, two.kb, 0, 8192)
        });
        let c = app2.completion();
        assert_eq!((c.wr_id, c.status), (id, 0));
    }
    let kb2 = two.kb;
    let got = ask(&b, move |h, _| h.dev.read_mr(kb2, PAIR_VA, 8192))
        .unwrap()
        .unwrap();
    assert_eq!(got, pattern);
    let counters = ask(&a, |h, _| h.apps.counters()).unwrap();
    assert_eq!(counters.broken_rings, 1, "{counters:?}");
    // The corrupt ring is the control plane's to report (an asynchronous event); the entry
    // that did not decode was reported by its completion.
    let faulted = |a: &app_rings::App| a.fault.load(std::sync::atomic::Ordering::Acquire);
    assert!(faulted(&app1) && !faulted(&app2));
    // A completion ring is not taken back while a QP completes into it.
    let r = ask(&a, |h, _| h.apps.remove_cq(&h.dev, 0).map(|_| ())).unwrap();
    assert!(matches!(r, Err(AppError::CqInUse(0))), "{r:?}");
    assert_eq!(counters.refused, 1, "{counters:?}");
    // Posted: two WRITEs on the first QP, ten on the second; the refused entry and the one
    // flushed behind it are not.
    assert_eq!(counters.sends, 12, "{counters:?}");
    assert_eq!(counters.completions, 14, "{counters:?}");
    stop_all([&a, &b], vec![ta, tb]);
}

#[test]
fn the_lcore_visits_only_qps_whose_doorbell_rang_or_that_the_device_named() {
    use app_rings::{attach, write};
    let (qa, qb) = link(info(1), info(2), 8192);
    let (a, ta) = spawn(0, qa, RdmaHost::new(0, 0, 100e9));
    let (b, tb) = spawn(1, qb, RdmaHost::new(1, 0, 100e9));
    let p = connect_pair(&a, &b, Mtu::M1024, CcKind::None).unwrap();
    let mut app = attach(&a, p.qpa);
    let visits = || ask(&a, |h, _| h.apps.counters().visits).unwrap();
    // Each ask is a turn of the lcore's loop at least: an idle QP is not visited in any.
    let idle = visits();
    for _ in 0..200 {
        assert_eq!(visits(), idle, "an idle QP was visited");
    }
    // An entry published without its doorbell is not read...
    let mut slot = [0u8; 128];
    let n = write(1, p.ka, p.kb, 0, 64).encode(&mut slot).unwrap();
    assert!(app.sq.push(&slot[..n]).unwrap());
    for _ in 0..200 {
        assert_eq!(visits(), idle, "a QP was visited without its doorbell");
    }
    assert_eq!(ask(&a, |h, _| h.apps.counters().sends).unwrap(), 0);
    // ...and is, once rung; its completion (from the peer's ACK: the device names the QP)
    // comes in a few more visits.
    app.bell.ring(app.bit);
    let c = app.completion();
    assert_eq!((c.wr_id, c.status), (1, 0));
    let busy = visits();
    assert!(busy > idle && busy <= idle + 4, "{idle} then {busy} visits");
    for _ in 0..200 {
        assert_eq!(visits(), busy, "an idle QP was visited");
    }
    stop_all([&a, &b], vec![ta, tb]);
}

#[test]
fn a_test_on_another_qp_leaves_an_applications_qp_to_the_application() {
    use app_rings::{attach, write};
    let (qa, qb) = link(info(1), info(2), 8192);
    let (a, ta) = spawn(0, qa, RdmaHost::new(0, 0, 100e9));
    let (b, tb) = spawn(1, qb, RdmaHost::new(1, 0, 100e9));
    // The application's QP in a lower slot than the test's: the tests' table reaches past it.
    let one = connect_pair(&a, &b, Mtu::M1024, CcKind::None).unwrap();
    let two = connect_pair(&a, &b, Mtu::M1024, CcKind::None).unwrap();
    let wr = SendWr::new(
        1,
        SendOp::Write {
            remote_addr: PAIR_VA,
            rkey: two.kb,
        },
        transport::wr::Sge::list(PAIR_VA, 64, two.ka),
    );
    let q = two.qpa;
    let r = ask_test(&a, WAIT, move |h, now, reply| {
        h.tests.stream(&mut h.dev, now, q, wr, (20, 4, None), reply)
    })
    .unwrap()
    .unwrap();
    assert_eq!(r.completed, 20);
    // The application's completions keep coming to it (the device names its QP, the tests
    // find no test there and leave its claim alone).
    let mut app = attach(&a, one.qpa);
    for id in 0..5 {
        app.post(&write(id, one.ka, one.kb, 0, 64));
        let c = app.completion();
        assert_eq!((c.wr_id, c.status), (id, 0));
    }
    stop_all([&a, &b], vec![ta, tb]);
}

#[test]
fn a_completion_ring_with_an_impossible_consumer_index_is_abandoned_alone() {
    use app_rings::{attach, write};
    use verbs::ring::RingLayout;
    let (qa, qb) = link(info(1), info(2), 8192);
    let (a, ta) = spawn(0, qa, RdmaHost::new(0, 0, 100e9));
    let (b, tb) = spawn(1, qb, RdmaHost::new(1, 0, 100e9));
    let one = connect_pair(&a, &b, Mtu::M1024, CcKind::None).unwrap();
    let two = connect_pair(&a, &b, Mtu::M1024, CcKind::None).unwrap();
    let mut app1 = attach(&a, one.qpa);
    let mut app2 = attach(&a, two.qpa);
    // The application writes its completion ring's consumer index far past what it was given
    // (the ring follows the send and receive rings; its consumer index is its second line).
    let cq_at =
        RingLayout::new(16, 128).unwrap().bytes() + RingLayout::new(16, 64).unwrap().bytes();
    // SAFETY: the completion ring's consumer index, inside the shared memory.
    unsafe { (app1.mem.as_ptr().add(cq_at + 64) as *mut u32).write_volatile(5000) };
    // The lcore reads it when the ring looks full to it: after 64 completions (the ring's
    // size, none of them read), the 65th finds it impossible and the ring is abandoned.
    let t = std::time::Instant::now();
    let mut slot = [0u8; 128];
    for id in 0..80 {
        let n = write(id, one.ka, one.kb, 0, 64).encode(&mut slot).unwrap();
        while !app1.sq.push(&slot[..n]).unwrap() {
            assert!(t.elapsed() < WAIT, "the send ring stayed full");
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        app1.bell.ring(app1.bit);
    }
    let c = loop {
        let c = ask(&a, |h, _| h.apps.counters()).unwrap();
        if c.completions + c.dropped == 80 {
            break c;
        }
        assert!(
            t.elapsed() < WAIT,
            "completions neither written nor dropped: {c:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    assert_eq!(
        (c.completions, c.dropped, c.broken_rings),
        (64, 16, 1),
        "{c:?}"
    );
    // The other application's QP on the lcore carries on.
    for id in 10..15 {
        app2.post(&write(id, two.ka, two.kb, 0, 4096));
        let c = app2.completion();
        assert_eq!((c.wr_id, c.status), (id, 0));
    }
    stop_all([&a, &b], vec![ta, tb]);
}

#[test]
fn an_applications_own_memory_is_read_and_written_in_place() {
    use app_rings::{attach, write};
    use transport::mr::Access;
    use verbs::abi::{SendWqe, WrOpcode};
    use verbs::shm::SharedMem as AppMem;
    let (qa, qb) = link(info(1), info(2), 8192);
    let (a, ta) = spawn(0, qa, RdmaHost::new(0, 0, 100e9));
    let (b, tb) = spawn(1, qb, RdmaHost::new(1, 0, 100e9));
    let p = connect_pair(&a, &b, Mtu::M1024, CcKind::None).unwrap();
    // The application's memory, and roced's mapping of the memfd it sent (another mapping of
    // the same pages, as in another process).
    const LEN: usize = 64 << 10;
    const VA: u64 = 0x7f00_0000_0000;
    let mine = AppMem::create("ferroce-app-memory", LEN).unwrap();
    let theirs = Arc::new(AppMem::map(mine.fd().try_clone_to_owned().unwrap(), LEN).unwrap());
    let pattern: Vec<u8> = (0..LEN as u32).map(|i| (i * 31 + 7) as u8).collect();
    // SAFETY: the application's own mapping, LEN bytes; nothing else touches it yet.
    unsafe { core::ptr::copy_nonoverlapping(pattern.as_ptr(), mine.as_ptr(), LEN) };
    let key = 0x00ab_c000;
    let pd = ask(&a, move |h, _| {
        h.dev.query(p.qpa, Instant::ZERO).map(|q| q.pd)
    })
    .unwrap()
    .unwrap();
    ask(&a, move |h, _| {
        let mem = crate::mem::SharedMem::application(theirs, 0, LEN).unwrap();
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        h.dev.reg_shared(key, pd, VA, all, Box::new(mem))
    })
    .unwrap()
    .unwrap();
    let mut app = attach(&a, p.qpa);

    // A WRITE straight from the application's memory...
    let mut w = write(1, key, p.kb, 0, 16 << 10);
    w.sg[0].addr = VA;
    app.post(&w);
    assert_eq!(app.completion().status, 0);
    let kb = p.kb;
    let got = ask(&b, move |h, _| h.dev.read_mr(kb, PAIR_VA, 16 << 10))
        .unwrap()
        .unwrap();
    assert_eq!(&got[..], &pattern[..16 << 10]);
    // ...and a READ landing in it, seen through the application's own mapping.
    let theirs_bytes: Vec<u8> = (0..4096u32).map(|i| (i ^ 0x5a) as u8).collect();
    let tb_bytes = theirs_bytes.clone();
    ask(&b, move |h, _| {
        h.dev.write_mr(kb, PAIR_VA + 0x8000, &tb_bytes)
    })
    .unwrap()
    .unwrap();
    let mut r = SendWqe {
        opcode: WrOpcode::Read,
        ..write(2, key, p.kb, 0x8000, 4096)
    };
    r.sg[0].addr = VA + 0x4000;
    app.post(&r);
    let c = app.completion();
    assert_eq!((c.wr_id, c.status, c.opcode), (2, 0, 2));
    let mut seen = vec![0u8; 4096];
    // SAFETY: the application's mapping, read after the completion said the READ landed.
    unsafe { core::ptr::copy_nonoverlapping(mine.as_ptr().add(0x4000), seen.as_mut_ptr(), 4096) };
    assert_eq!(seen, theirs_bytes);

    // Another application's memory (a region of another protection domain) cannot be named
    // by this QP: the WRITE completes with a local protection error and nothing leaves.
    let secret = vec![0xeeu8; 4096];
    let other_key = 0x00ab_d000;
    let s2 = secret.clone();
    ask(&a, move |h, _| {
        h.dev.alloc_pd(0x77);
        let mut mem = crate::mem::SharedMem::heap(4096).unwrap();
        transport::mr::MrMemory::write(&mut mem, 0, &s2);
        h.dev.reg_shared(
            other_key,
            0x77,
            0x5000_0000,
            Access::LOCAL_WRITE,
            Box::new(mem),
        )
    })
    .unwrap()
    .unwrap();
    let mut steal = write(3, other_key, p.kb, 0x2_0000, 4096);
    steal.sg[0].addr = 0x5000_0000;
    app.post(&steal);
    let c = app.completion();
    assert_eq!((c.wr_id, c.status), (3, 4), "IBV_WC_LOC_PROT_ERR");
    let got = ask(&b, move |h, _| h.dev.read_mr(kb, PAIR_VA + 0x2_0000, 4096))
        .unwrap()
        .unwrap();
    assert_ne!(got, secret, "another PD's bytes reached the peer");
    stop_all([&a, &b], vec![ta, tb]);
}

/// Waits (polling the lcore) until `f` gives something.
fn until<T: Send + 'static>(
    ctl: &HostControl,
    f: impl Fn(&mut Shard) -> Option<T> + Send + Clone + 'static,
) -> T {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let g = f.clone();
        if let Some(v) = ask(ctl, move |h, _| g(h)).unwrap() {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "nothing in {WAIT:?}");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

fn cm_event(h: &mut Shard) -> Option<transport::cm::Event> {
    h.gsi.as_mut().and_then(|g| g.cm.poll_event())
}

#[test]
fn qp1_on_two_lcores_connects_through_the_cm_and_refuses_an_unlistened_service() {
    use std::net::IpAddr;
    use transport::cm::{AcceptParams, ConnectParams, Event, State, gid_of, service_id_of};
    use transport::gsi::PeerPath;
    use wire::cm::{Path, RejReason};
    let (qa, qb) = link(info(1), info(2), 64);
    let (a, ta) = spawn(0, qa, RdmaHost::new(0, 0, 100e9));
    let (b, tb) = spawn(1, qb, RdmaHost::new(0, 0, 100e9));
    let (ip_a, ip_b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
    let connect = move |h: &mut Shard, now: Instant, port: u16| {
        let g = h.gsi.as_mut().expect("shard 0 has QP1");
        g.learn(PeerPath {
            peer: ip_b,
            local: ip_a,
            peer_mac: [2, 0, 0, 0, 0, 2],
            local_mac: [2, 0, 0, 0, 0, 1],
            vlan: None,
        });
        let path = Path {
            local_gid: gid_of(ip_a),
            remote_gid: gid_of(ip_b),
            hop_limit: 64,
            ..Path::default()
        };
        let c = g.cm.connect(
            now,
            &ConnectParams {
                path_mtu: 5,
                ..ConnectParams::new(service_id_of(port), ip_b, path, 0x11, 1)
            },
        );
        g.rearm();
        c.unwrap()
    };
    // Nobody listens on B: the REQ crosses the link, B's QP1 answers with a REJ.
    let c1 = ask(&a, move |h, now| connect(h, now, 7999)).unwrap();
    let e = until(&a, cm_event);
    assert_eq!(
        e,
        Event::Rejected {
            conn: c1,
            reason: RejReason::InvalidServiceId
        }
    );
    // B listens: REQ, REP, RTU.
    ask(&b, |h, _| {
        h.gsi.as_mut().unwrap().cm.listen(service_id_of(7471))
    })
    .unwrap()
    .unwrap();
    let ca = ask(&a, move |h, now| connect(h, now, 7471)).unwrap();
    let Event::Request {
        conn: cb,
        peer,
        req,
    } = until(&b, cm_event)
    else {
        panic!("B was not asked")
    };
    assert_eq!((peer, req.local_qpn, req.path_mtu), (ip_a, 0x11, 5));
    ask(&b, move |h, now| {
        let g = h.gsi.as_mut().unwrap();
        let r = g.cm.accept(now, cb, &AcceptParams::new(0x22, 2));
        g.rearm();
        r
    })
    .unwrap()
    .unwrap();
    let Event::Reply { conn, rep } = until(&a, cm_event) else {
        panic!("A had no reply")
    };
    assert_eq!((conn, rep.local_qpn, rep.starting_psn), (ca, 0x22, 2));
    ask(&a, move |h, _| h.gsi.as_mut().unwrap().cm.establish(ca))
        .unwrap()
        .unwrap();
    assert_eq!(until(&b, cm_event), Event::Established { conn: cb });
    let st = ask(&b, move |h, _| h.gsi.as_ref().unwrap().cm.state(cb)).unwrap();
    assert_eq!(st, Some(State::Established));
    let counters = ask(&b, |h, now| h.counters(now)).unwrap();
    assert_eq!(
        (counters.cm.rx, counters.cm.tx_rej, counters.gsi.tx_frames),
        (3, 1, 2)
    );
    assert_eq!(counters.cm.established, 1);
    stop_all([&a, &b], vec![ta, tb]);
}
