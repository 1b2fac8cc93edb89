//! The cost of one message of an lcore stream, counted instead of timed: two `RdmaHost`s on
//! lcore `Worker`s joined by an in-memory link, driven in turn from one thread with a clock
//! that does not move, so that a run is the same instruction for instruction every time.
//! Under callgrind, the difference between two runs' counts over the difference of their
//! message counts is the instructions per message, both ends together (the requester posting,
//! building and sending; the responder checking, placing and ACKing; the completer): a figure
//! that this noisy 2-CPU machine cannot blur, for comparing two builds of the engine.
//!
//! `bash scripts/stream-cost.sh` does it all: it builds the `cost` profile (release with one
//! codegen unit: with release's four, unrelated changes moved the figure by about 95
//! instructions, as the units' split changed how the engine's generic code was inlined) and
//! prints both modes' figures. By hand:
//!
//! ```sh
//! cargo build --profile cost -p bench --bin stream_cost
//! for n in 20000 40000; do valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$n \
//!     target/cost/stream_cost -n $n >/dev/null 2>&1
//!   callgrind_annotate /tmp/cg.$n | grep -E 'PROGRAM TOTALS|__memset'; done
//! ```
//!
//! The link is crossbeam channels of heap buffers, not memif. Each buffer it allocates is a
//! zeroed 9 KiB (`HeapBuf::new`), which callgrind counts as ~9,000 instructions a frame: leave
//! `__memset` out of the totals. What remains covers the engine and the lcore loop, plus the
//! link's own small cost (malloc, channel), the same for both builds; compare builds with the
//! same version of this program. With it as first committed (265cbff), a 64 B WRITE took 4,136
//! instructions at 799f164 and 3,795 at 40bba18 (the stream posting by reference, the Copy SG
//! list, completions counted off the CQ, no inline gather for requests that are not inline).
//!
//! `--app` runs the same stream as an application would through its shared-memory rings
//! (issue 21): this thread encodes and pushes the WRITE entries and reads the completions, the
//! lcore decodes, posts and writes completion entries; the same commands count it. Each post
//! rings the QP's doorbell, as the library does. At 7c05374 (no doorbells, every QP polled)
//! --app took 4,177 against 3,671 built-in (+506); with doorbells and the entry encoded in its
//! slot, split out of it by its header, the SG list filled in place and the inline gather off
//! the post path, 4,147 against 3,680 (+467); with the work request decoded into a kept one
//! (no SG list zeroed a post), completions handed over in one pass, completion values as the
//! transport's own and the encoder inlined, 4,079 (+399); with a QP's run of posts through
//! one held send queue (`Device::send_queue`: one lookup, clock update and ready mark a
//! visit), entries and completions encoded where they go, and lists of one scatter/gather
//! entry moved without a loop, 3,958 against 3,682 (+276). The request this program posts is
//! hidden from the compiler (`black_box`), as the program's ibv_send_wr is from the library:
//! with it visible, the inlined encoder folded to 60 instructions fewer than it costs.

use clap::Parser;
use crossbeam_channel::{Receiver, Sender, unbounded};
use dataplane::Burst;
use dataplane::cc::CcKind;
use dataplane::counters::LcoreCounters;
use dataplane::host::{Asker, PAIR_VA, RdmaCommand, RdmaHost, connect_pair_with};
use dataplane::lcore::{Command, LcoreId, ManualClock, Worker};
use dataplane::port::PortInfo;
use dataplane::port::mem::{MemQueue, link};
use dataplane::transport::qp::Mtu;
use dataplane::transport::wr::{SendOp, SendWr, Sge};
use std::sync::Arc;

#[derive(Debug, Parser)]
#[command(about = "Messages of an lcore WRITE stream between two in-memory hosts, deterministic")]
struct Args {
    /// Messages.
    #[arg(short = 'n', default_value_t = 100_000)]
    count: u64,
    /// Message size in bytes.
    #[arg(short = 's', default_value_t = 64)]
    size: u32,
    /// Outstanding at most.
    #[arg(short = 't', default_value_t = 128)]
    depth: usize,
    /// Congestion control on the QPs (none or dcqcn, which roced's QPs have by default).
    #[arg(long, default_value = "none")]
    cc: String,
    /// One request in this many signalled (perftest's --cq-mod, 100 in its bandwidth tests),
    /// and the last.
    #[arg(long, default_value_t = 1)]
    cq_mod: u32,
    /// QP pairs the stream runs on, each posting `n / qps` WRITEs (`depth` outstanding on
    /// each), as perftest's `-q` does. Run under cachegrind (`--cache-sim=yes`), the cache
    /// misses per message at many QPs are as deterministic as the instruction counts.
    #[arg(long, default_value_t = 1)]
    qps: u32,
    /// Post and poll as an application does, through shared-memory rings (issue 21), instead
    /// of the built-in stream: the application's encode, push and poll count too.
    #[arg(long)]
    app: bool,
}

type Host = Worker<MemQueue, RdmaHost<dataplane::buf::HeapBuf>, ManualClock>;

struct Two {
    w: Vec<Host>,
    ctl: Vec<Sender<Command<RdmaCommand>>>,
    rx: Burst<dataplane::buf::HeapBuf>,
}

impl Two {
    /// One turn of each worker: the one place the measured loop runs the lcores, whichever
    /// side (the built-in stream or an application) drives them. Not inlined, so that its
    /// callers cannot change how the lcore loop inside it is compiled.
    #[inline(never)]
    fn turn(&mut self) {
        for w in &mut self.w {
            w.poll_once(&mut self.rx);
        }
    }
}

impl Asker for Two {
    /// Runs both workers in turn until the answer is there.
    fn ask<T>(
        &mut self,
        i: usize,
        make: impl FnOnce(Sender<T>) -> RdmaCommand,
    ) -> Result<T, String> {
        let (tx, rx): (Sender<T>, Receiver<T>) = unbounded();
        self.ctl[i]
            .send(Command::Handler(make(tx)))
            .map_err(|_| "the worker is gone".to_string())?;
        loop {
            self.turn();
            if let Ok(v) = rx.try_recv() {
                return Ok(v);
            }
        }
    }
}

fn main() {
    let a = Args::parse();
    let Ok(cc) = a.cc.parse::<CcKind>() else {
        eprintln!("stream_cost: --cc must be dcqcn or none");
        std::process::exit(2);
    };
    let info = |i: u16| PortInfo::virtual_port(i, 9000);
    let (qa, qb) = link(info(1), info(2), 8192);
    let clock = ManualClock::default();
    let mut ctl = Vec::new();
    let mut w = Vec::new();
    for (i, q) in [qa, qb].into_iter().enumerate() {
        let (tx, rx) = unbounded();
        ctl.push(tx);
        w.push(Worker::new(
            LcoreId(i as u16),
            vec![q],
            RdmaHost::new(i as u32, 0, 100e9),
            clock.clone(),
            Arc::new(LcoreCounters::default()),
            rx,
        ));
    }
    let mut two = Two {
        w,
        ctl,
        rx: Burst::new(),
    };
    let pair = connect_pair_with(&mut two, Mtu::M4096, cc).expect("connect");
    let wr = SendWr::new(
        1,
        SendOp::Write {
            remote_addr: PAIR_VA,
            rkey: pair.kb,
        },
        Sge::list(PAIR_VA, a.size, pair.ka),
    );
    if a.app {
        return app_stream(&mut two, &a, pair);
    }
    if a.qps > 1 {
        return streams(&mut two, &a, pair, cc, wr);
    }
    let shape = shape(&a, a.count);
    let t = std::time::Instant::now();
    let r = two
        .ask(0, |reply| {
            RdmaCommand::test(reply, move |h, now, r| {
                h.tests.stream(&mut h.dev, now, pair.qpa, wr, shape, r)
            })
        })
        .expect("the worker answers")
        .expect("stream");
    let ns = t.elapsed().as_nanos() as f64 / a.count as f64;
    assert_eq!((r.completed, r.errors), (a.count, 0), "{r:?}");
    println!(
        "{} WRITEs of {} B, {} outstanding: all completed ({ns:.0} ns each, wall clock, both ends on one CPU)",
        a.count, a.size, a.depth
    );
}

/// `count` WRITEs on each QP, as the arguments shape them.
fn shape(a: &Args, count: u64) -> dataplane::transport::perftest::Shape {
    dataplane::transport::perftest::Shape {
        count,
        depth: a.depth,
        duration: None,
        cq_mod: a.cq_mod,
    }
}

/// The stream on `a.qps` QP pairs: the pair's and `qps - 1` more, created and connected on
/// the same path, all WRITEing into B's one region.
fn streams(two: &mut Two, a: &Args, pair: dataplane::host::Pair, cc: CcKind, wr: SendWr) {
    use dataplane::transport::cc::DcqcnParams;
    use dataplane::transport::qp::{Path, QpAttr};
    use dataplane::transport::rc::QpCaps;
    let more = a.qps as usize - 1;
    // What rocectl perf asks for: a send queue of the stream's depth, one receive, one
    // scatter/gather entry.
    let depth = a.depth as u32;
    let mut qpns = [vec![pair.qpa], vec![pair.qpb]];
    for (i, q) in qpns.iter_mut().enumerate() {
        let created = two
            .call(i, move |h, _| {
                let caps = QpCaps {
                    max_send_wr: depth,
                    max_recv_wr: 1,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 256,
                    ..QpCaps::default()
                };
                (0..more)
                    .map(|_| {
                        let p = DcqcnParams::nvidia();
                        h.dev.create_qp(caps, None, [None; 2], cc, p)
                    })
                    .collect::<Result<Vec<u32>, _>>()
            })
            .expect("the worker answers")
            .expect("create QPs");
        q.extend(created);
    }
    for (i, me, other) in [(0, 1, 2), (1, 2, 1)] {
        let (mine, theirs) = (qpns[i].clone(), qpns[1 - i].clone());
        two.call(i, move |h, _| {
            for (&q, &d) in mine.iter().zip(&theirs).skip(1) {
                let conn = QpAttr::connect(Path::sim(me, other, 0xc000), Mtu::M4096, d);
                h.dev.connect(q, &conn, 0)?;
            }
            Ok::<(), dataplane::transport::device::DeviceError>(())
        })
        .expect("the worker answers")
        .expect("connect");
    }
    let per_qp = a.count / a.qps as u64;
    let qps: Vec<(u32, SendWr)> = qpns[0].iter().map(|&q| (q, wr)).collect();
    let shape = shape(a, per_qp);
    let t = std::time::Instant::now();
    let r = two
        .ask(0, |reply| {
            RdmaCommand::test(reply, move |h, now, r| {
                h.tests.streams(&mut h.dev, now, qps, shape, r)
            })
        })
        .expect("the worker answers")
        .expect("streams");
    assert_eq!((r.completed, r.errors), (per_qp * a.qps as u64, 0), "{r:?}");
    let ns = t.elapsed().as_nanos() as f64 / r.completed as f64;
    println!(
        "{} WRITEs of {} B on {} QPs, {} outstanding on each: all completed ({ns:.0} ns each, \
         wall clock, both ends on one CPU)",
        r.completed, a.size, a.qps, a.depth
    );
}

/// The same stream through an application's rings: this thread is the application, posting
/// WRITE entries into the QP's send ring while fewer than `depth` are outstanding and reading
/// completions off its completion ring, between turns of the two workers.
fn app_stream(two: &mut Two, a: &Args, pair: dataplane::host::Pair) {
    use dataplane::host::AppQueues;
    use verbs::abi::{self, Cqe, SendWqe, UdTarget, WrOpcode, send_flags};
    use verbs::bell::{BELL_BYTES, Bell, Bells};
    use verbs::ring::{Consumer, Producer, RingLayout};
    use verbs::shm::SharedMem;
    let slots = (a.depth as u32).next_power_of_two().max(2);
    // A slot of one scatter/gather entry, as a QP of max_send_sge 1 has (perftest's).
    // A slot of one scatter/gather entry, as a QP of max_send_sge 1 has (perftest's).
    let sq = RingLayout::new(slots, (abi::SEND_HEADER + abi::SGE_BYTES) as u32).expect("send ring");
    let rq = RingLayout::new(2, 64).expect("receive ring");
    let cq = RingLayout::new(slots, abi::CQE_BYTES as u32).expect("completion ring");
    let at = [
        0,
        sq.bytes(),
        sq.bytes() + rq.bytes(),
        sq.bytes() + rq.bytes() + cq.bytes(),
    ];
    let bell_at = (at[3] + cq.bytes()).next_multiple_of(64);
    let mem = Arc::new(SharedMem::create("stream_cost", bell_at + BELL_BYTES).expect("memory"));
    let bell = Bell::new(mem.clone(), bell_at).expect("doorbell");
    let bells = Bells::new(mem.clone(), bell_at).expect("doorbell");
    let mut post = Producer::new(mem.clone(), at[0], sq).expect("ring");
    let mut done = Consumer::new(mem.clone(), at[2], cq).expect("ring");
    let q = AppQueues {
        qpn: pair.qpa,
        sq: Consumer::new(mem.clone(), at[0], sq).expect("ring"),
        rq: Consumer::new(mem.clone(), at[1], rq).expect("ring"),
        send_cq: 0,
        recv_cq: 0,
        pd: 0,
        bells: 0,
        fault: Default::default(),
    };
    let scq = Producer::new(mem.clone(), at[2], cq).expect("ring");
    let rcq = Producer::new(mem, at[3], cq).expect("ring");
    let bit = two
        .call(0, move |h, _| {
            let send_cq = h.apps.add_cq(scq, None, Default::default());
            let recv_cq = h.apps.add_cq(rcq, None, Default::default());
            let bells = h.apps.add_bells(bells);
            h.apps.attach(
                &mut h.dev,
                AppQueues {
                    send_cq,
                    recv_cq,
                    bells,
                    ..q
                },
            )
        })
        .expect("the worker answers")
        .expect("attach");
    let mut sg = arrayvec::ArrayVec::new();
    sg.push(abi::Sge {
        addr: PAIR_VA,
        length: a.size,
        lkey: pair.ka,
    });
    let mut wqe = SendWqe {
        wr_id: 0,
        opcode: WrOpcode::Write,
        flags: send_flags::SIGNALED,
        imm: 0,
        remote_addr: PAIR_VA,
        rkey: pair.kb,
        compare_add: 0,
        swap: 0,
        ud: UdTarget::default(),
        sg,
        inline: &[],
    };
    let (mut posted, mut completed) = (0u64, 0u64);
    let mut c = [0u8; abi::CQE_BYTES];
    let t = std::time::Instant::now();
    while completed < a.count {
        while posted < a.count && posted - completed < a.depth as u64 {
            wqe.wr_id = posted;
            // Signalled: every cq_mod-th and the last (cq_mod held to the depth).
            let m = (a.cq_mod as u64).clamp(1, a.depth as u64);
            let signal = (posted + 1) % m == 0 || posted + 1 == a.count;
            wqe.flags = if signal { send_flags::SIGNALED } else { 0 };
            // As the library's Qp::post_send: encoded where it goes, from a request the
            // compiler knows nothing of (as the library knows nothing of the program's
            // ibv_send_wr): nothing of it folds into the encoder.
            let w = std::hint::black_box(&wqe);
            if !post.push_with(|slot| w.encode(slot).is_ok()).expect("ring") {
                break;
            }
            // One ibv_post_send of one work request: its doorbell.
            bell.ring(bit);
            posted += 1;
        }
        two.turn();
        while done.pop_array(&mut c).expect("ring") {
            let e = Cqe::decode(&c);
            assert!(e.status == 0 && e.wr_id >= completed, "{e:?}");
            // It stands for every request up to it.
            completed = e.wr_id + 1;
        }
    }
    let ns = t.elapsed().as_nanos() as f64 / a.count as f64;
    println!(
        "{} WRITEs of {} B, {} outstanding, through an application's rings: all completed ({ns:.0} ns each, wall clock, both ends and the application on one CPU)",
        a.count, a.size, a.depth
    );
}
