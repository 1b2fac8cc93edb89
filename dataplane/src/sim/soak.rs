//! The randomized soak: RC QP pairs between two endpoints, random work requests of every
//! opcode and size, through the simulator with a fault mix, checked against a reference model.
//!
//! Each QP pair has its own areas in both endpoints' memory region, so its effects can be
//! modelled alone: a target area the peer writes, reads and updates atomically; an immutable
//! source area; a sink ring for READ results and atomic originals; a receive ring. Requests on
//! one QP execute in PSN order at the responder, so the model applies each work request when it
//! is posted, and every result is checked when its completion is polled: status, order (FIFO
//! per QP, exactly once), READ data, atomic originals (linearizable in PSN order), received
//! bytes and immediates; at the end every target area must equal the model byte for byte.
//!
//! A READ that is retried is executed again and returns memory as it is then: IB lets a later
//! WRITE or atomic on the same QP land before a READ's data is returned, which is what the
//! fence flag is for. So a WRITE or atomic to memory that an outstanding READ on the same QP
//! reads is posted with the fence flag, and the model holds only if fences work.
//!
//! `SOAK_TRACE=1` prints every work request posted and every frame delivered (to stderr).

use crate::sim::{Faults, LinkConfig, NodeId, SimNet, SplitMix64};
use crate::time::Instant;
use crate::wire::packet::{Checks, parse};
use core::time::Duration;
use std::collections::VecDeque;
use transport::cq::{WcOpcode, WcStatus};
use transport::qp::{Mtu, QpAttr, QpState};
use transport::rc::{QpCaps, RcQp};
use transport::testkit::{Node, NodeConfig, sim_attr};
use transport::wr::{RecvWr, SendOp, SendWr, SgList, Sge};

/// What to run.
#[derive(Clone, Copy, Debug)]
pub struct SoakConfig {
    /// Seed of everything random (work requests and faults).
    pub seed: u64,
    /// QP pairs (2-8).
    pub qps: usize,
    /// Work requests in all.
    pub ops: usize,
    /// Largest message.
    pub max_size: u32,
    /// Faults on both directions.
    pub faults: Faults,
    /// Work requests outstanding per QP at most.
    pub depth: usize,
}

/// What happened.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SoakReport {
    /// Work requests completed.
    pub completed: usize,
    /// Bytes moved by SEND/WRITE/READ.
    pub bytes: u64,
    /// Frames the network carried.
    pub frames: u64,
    /// Frames it lost, duplicated, reordered, corrupted.
    pub lost: u64,
    /// Duplicated.
    pub duplicated: u64,
    /// Reordered.
    pub reordered: u64,
    /// Corrupted.
    pub corrupted: u64,
    /// Simulated time, ns.
    pub sim_ns: u64,
    /// Work requests that ended in RETRY_EXC_ERR: go-back-N gave up after retry_cnt tries
    /// (possible under heavy loss). Each kills its QP pair: both QPs are moved to ERR.
    pub retry_exceeded: usize,
    /// Send work requests flushed (WR_FLUSH_ERR) by a QP pair's death.
    pub flushed: usize,
    /// Receives flushed by a QP pair's death.
    pub recv_flushed: usize,
    /// Work requests never posted because every QP pair had died.
    pub abandoned: usize,
    /// The first violation, if any.
    pub violation: Option<String>,
}

const AREA: u64 = 2 << 20;
const T_OFF: u64 = 0; // target area, written by the peer
const S_OFF: u64 = AREA; // source, immutable
const K_OFF: u64 = 2 * AREA; // sinks of READs and atomics
const R_OFF: u64 = 3 * AREA; // receive buffers
const PER_QP: u64 = 4 * AREA;
const BASE: u64 = 0x1000_0000;
/// SENDs and WRITEs up to this size are posted inline a third of the time.
const INLINE: u32 = 256;

/// One host of the soak: the harness's node and a model of each QP's target area.
struct Side {
    node: Node,
    /// Model of each QP's target area.
    model: Vec<Vec<u8>>,
}

#[derive(Debug)]
enum Expect {
    Done(WcOpcode),
    Read {
        at: u64,
        data: Vec<u8>,
    },
    Atomic {
        at: u64,
        orig: u64,
        opcode: WcOpcode,
    },
}

#[derive(Debug)]
struct Posted {
    wr_id: u64,
    expect: Expect,
    /// The peer's target bytes it changes (WRITE, atomic): `(start, len)` in the area.
    target: Option<(u64, u64)>,
}

#[derive(Debug)]
struct RecvExpect {
    wr_id: u64,
    at: u64,
    data: Vec<u8>,
    imm: Option<u32>,
    opcode: WcOpcode,
}

fn side(n: usize, me: u8, seed: u64) -> Side {
    let mut rng = SplitMix64::new(seed);
    let mut mem = vec![0u8; PER_QP as usize * n];
    for b in mem.iter_mut() {
        *b = rng.next_u64() as u8;
    }
    let model = (0..n)
        .map(|i| mem[(i as u64 * PER_QP + T_OFF) as usize..][..AREA as usize].to_vec())
        .collect();
    let qpns: Vec<u32> = (0..n).map(|i| 0x100 * me as u32 + i as u32).collect();
    let cfg = NodeConfig {
        caps: QpCaps {
            max_inline_data: INLINE,
            ..QpCaps::default()
        },
        ..NodeConfig::new(BASE, mem)
    };
    Side {
        node: Node::new(cfg, &qpns),
        model,
    }
}

fn connect(qp: &mut RcQp, peer: u32, me: u8, other: u8, mtu: Mtu) {
    // QpAttr::connect's timeout is 67 ms, as RoCE deployments commonly set it: with 8 QPs of
    // 1 MiB messages queued on one link and go-back-N under 10 % loss, a shorter timer fires
    // while data is still queued and its spurious retransmissions feed the queue.
    let c = QpAttr {
        sq_psn: Some(0xff_ff00),
        rq_psn: Some(0xff_ff00),
        ..sim_attr(qp.qpn, me, other, peer, mtu)
    };
    qp.connect(&c).expect("connect");
}

/// A ring allocator over one area: hands out non-overlapping ranges, freed in order.
#[derive(Debug, Default)]
struct Ring {
    head: u64,
    used: VecDeque<(u64, u64)>,
}

impl Ring {
    fn alloc(&mut self, len: u64) -> Option<u64> {
        let len = len.max(8).next_multiple_of(8);
        if len > AREA {
            return None;
        }
        let start = if self.head + len > AREA { 0 } else { self.head };
        for (s, l) in &self.used {
            if start < s + l && *s < start + len {
                return None;
            }
        }
        self.head = start + len;
        self.used.push_back((start, len));
        Some(start)
    }
    fn free_oldest(&mut self) {
        self.used.pop_front();
    }
}

fn sge(key: u32, qp: usize, area: u64, at: u64, len: u32) -> SgList {
    let mut v = SgList::new();
    v.push(Sge {
        addr: BASE + qp as u64 * PER_QP + area + at,
        length: len,
        lkey: key,
    });
    v
}

/// Whether QP pair `q` has died: a send queue of either side has failed.
fn pair_dead(failed: &[Vec<bool>; 2], q: usize) -> bool {
    failed[0][q] || failed[1][q]
}

/// Whether an area's bytes equal the model's, but for the `(start, len)` ranges whose bytes
/// are undefined.
fn matches_model(got: &[u8], model: &[u8], undefined: &[(u64, u64)]) -> bool {
    let mut defined = vec![true; model.len()];
    for &(at, len) in undefined {
        defined[at as usize..(at + len) as usize].fill(false);
    }
    got.len() == model.len()
        && got
            .iter()
            .zip(model)
            .zip(&defined)
            .all(|((g, m), d)| !d || g == m)
}

/// Runs the soak.
pub fn run(cfg: &SoakConfig) -> SoakReport {
    let n = cfg.qps.clamp(1, 8);
    let mut rng = SplitMix64::new(cfg.seed);
    let mut sides = [side(n, 1, cfg.seed ^ 0xa), side(n, 2, cfg.seed ^ 0xb)];
    let mtus = [Mtu::M256, Mtu::M512, Mtu::M1024, Mtu::M2048, Mtu::M4096];
    for i in 0..n {
        let mtu = mtus[rng.below(5) as usize];
        let (a, b) = sides.split_at_mut(1);
        let (qa, qb) = (a[0].node.qps[i].qpn, b[0].node.qps[i].qpn);
        connect(&mut a[0].node.qps[i], qb, 1, 2, mtu);
        connect(&mut b[0].node.qps[i], qa, 2, 1, mtu);
    }
    let mut net = SimNet::new(cfg.seed ^ 0x5eed);
    let l = LinkConfig {
        latency: Duration::from_micros(2),
        bandwidth_bps: 100_000_000_000,
        faults: cfg.faults,
    };
    net.connect(NodeId(0), NodeId(1), l);
    // Per side, per QP: what its send CQ and its receive CQ should show next.
    let mut posted: [Vec<VecDeque<Posted>>; 2] = [
        (0..n).map(|_| VecDeque::new()).collect(),
        (0..n).map(|_| VecDeque::new()).collect(),
    ];
    let mut recvs: [Vec<VecDeque<RecvExpect>>; 2] = [
        (0..n).map(|_| VecDeque::new()).collect(),
        (0..n).map(|_| VecDeque::new()).collect(),
    ];
    let mut sinks: [Vec<Ring>; 2] = [
        (0..n).map(|_| Ring::default()).collect(),
        (0..n).map(|_| Ring::default()).collect(),
    ];
    // Target ranges of outstanding READs, per requester side and QP: (wr_id, start, len).
    let mut reading: [Vec<Vec<(u64, u64, u64)>>; 2] = [
        (0..n).map(|_| Vec::new()).collect(),
        (0..n).map(|_| Vec::new()).collect(),
    ];
    let mut rrings: [Vec<Ring>; 2] = [
        (0..n).map(|_| Ring::default()).collect(),
        (0..n).map(|_| Ring::default()).collect(),
    ];
    // Per side and QP, whether its send queue has failed (a pair is dead once either side's
    // has: `pair_dead`); per side and QP, target ranges whose bytes are undefined: changed by
    // a WRITE or atomic that did not complete successfully (it may have landed before the
    // pair died, or not).
    let mut failed = [vec![false; n], vec![false; n]];
    let mut undefined: [Vec<Vec<(u64, u64)>>; 2] = [vec![Vec::new(); n], vec![Vec::new(); n]];
    let mut report = SoakReport::default();
    let mut issued = 0usize;
    let mut now = Instant(0);
    let mut buf = Vec::new();
    let mut next_id = 1u64;
    let fail = |r: &mut SoakReport, msg: String| {
        if r.violation.is_none() {
            r.violation = Some(format!("seed {}: {msg}", cfg.seed));
        }
    };
    let mut idle_rounds = 0;
    while report.violation.is_none() {
        // Post new work while there is some left and room for it.
        for _ in 0..4 {
            if issued >= cfg.ops {
                break;
            }
            if (0..n).all(|q| pair_dead(&failed, q)) {
                report.abandoned = cfg.ops - issued;
                issued = cfg.ops;
                break;
            }
            let s = rng.below(2) as usize;
            let q = rng.below(n as u64) as usize;
            if posted[s][q].len() >= cfg.depth || pair_dead(&failed, q) {
                continue;
            }
            let size = if rng.chance(0.7) {
                rng.below(4097) as u32
            } else {
                (1u64 << rng.below(21)).min(cfg.max_size as u64) as u32
            }
            .min(cfg.max_size);
            let kind = rng.below(7);
            let (me, peer) = if s == 0 { (0, 1) } else { (1, 0) };
            let (mine, theirs) = if me == 0 {
                let (a, b) = sides.split_at_mut(1);
                (&mut a[0], &mut b[0])
            } else {
                let (a, b) = sides.split_at_mut(1);
                (&mut b[0], &mut a[0])
            };
            let src = rng.below(AREA - size as u64 + 1);
            let dst = rng.below(AREA - size as u64 + 1);
            let src_bytes = mine
                .node
                .mrs
                .get(mine.node.key)
                .expect("key")
                .to_vec(BASE + q as u64 * PER_QP + S_OFF + src, size as usize)
                .expect("src");
            let remote = BASE + q as u64 * PER_QP + T_OFF + dst;
            let id = next_id;
            let overlaps_read = |start: u64, len: u64| {
                reading[me][q]
                    .iter()
                    .any(|(_, s, l)| start < s + l && *s < start + len.max(1))
            };
            let mut fence = false;
            let mut target = None;
            let (op, sg, expect) = match kind {
                0 | 1 => {
                    // SEND (with immediate half the time) into a receive posted just before.
                    let Some(at) = rrings[peer][q].alloc(size as u64) else {
                        continue;
                    };
                    let imm = rng.chance(0.5).then(|| rng.next_u64() as u32);
                    let rwr = RecvWr {
                        wr_id: id,
                        sg: sge(theirs.node.key, q, R_OFF, at, size),
                    };
                    if theirs.node.qps[q].post_recv(rwr).is_err() {
                        continue;
                    }
                    recvs[peer][q].push_back(RecvExpect {
                        wr_id: id,
                        at,
                        data: src_bytes.clone(),
                        imm,
                        opcode: WcOpcode::Recv,
                    });
                    let op = imm.map_or(SendOp::Send, SendOp::SendWithImm);
                    (
                        op,
                        sge(mine.node.key, q, S_OFF, src, size),
                        Expect::Done(WcOpcode::Send),
                    )
                }
                2 | 3 => {
                    // A write to memory an outstanding READ reads waits for it (fence).
                    fence = overlaps_read(dst, size as u64);
                    let imm = (kind == 3).then(|| rng.next_u64() as u32);
                    if let Some(imm) = imm {
                        let Some(at) = rrings[peer][q].alloc(0) else {
                            continue;
                        };
                        let rwr = RecvWr {
                            wr_id: id,
                            sg: sge(theirs.node.key, q, R_OFF, at, 0),
                        };
                        if theirs.node.qps[q].post_recv(rwr).is_err() {
                            continue;
                        }
                        recvs[peer][q].push_back(RecvExpect {
                            wr_id: id,
                            at,
                            data: vec![],
                            imm: Some(imm),
                            opcode: WcOpcode::RecvRdmaWithImm,
                        });
                    }
                    theirs.model[q][dst as usize..][..size as usize].copy_from_slice(&src_bytes);
                    target = Some((dst, size as u64));
                    let op = match imm {
                        Some(imm) => SendOp::WriteWithImm {
                            remote_addr: remote,
                            rkey: theirs.node.key,
                            imm,
                        },
                        None => SendOp::Write {
                            remote_addr: remote,
                            rkey: theirs.node.key,
                        },
                    };
                    (
                        op,
                        sge(mine.node.key, q, S_OFF, src, size),
                        Expect::Done(WcOpcode::RdmaWrite),
                    )
                }
                4 => {
                    let Some(at) = sinks[me][q].alloc(size as u64) else {
                        continue;
                    };
                    let data = theirs.model[q][dst as usize..][..size as usize].to_vec();
                    reading[me][q].push((id, dst, size as u64));
                    (
                        SendOp::Read {
                            remote_addr: remote,
                            rkey: theirs.node.key,
                        },
                        sge(mine.node.key, q, K_OFF, at, size),
                        Expect::Read { at, data },
                    )
                }
                _ => {
                    let Some(at) = sinks[me][q].alloc(8) else {
                        continue;
                    };
                    let word = rng.below(AREA / 8) * 8;
                    fence = overlaps_read(word, 8);
                    let cur = u64::from_le_bytes(
                        theirs.model[q][word as usize..][..8].try_into().expect("8"),
                    );
                    let remote = BASE + q as u64 * PER_QP + T_OFF + word;
                    let (op, new, opcode) = if kind == 5 {
                        let add = rng.next_u64() >> 40;
                        (
                            SendOp::FetchAdd {
                                remote_addr: remote,
                                rkey: theirs.node.key,
                                add,
                            },
                            cur.wrapping_add(add),
                            WcOpcode::FetchAdd,
                        )
                    } else {
                        let compare = if rng.chance(0.5) { cur } else { cur ^ 1 };
                        let swap = rng.next_u64();
                        let new = if compare == cur { swap } else { cur };
                        (
                            SendOp::CmpSwap {
                                remote_addr: remote,
                                rkey: theirs.node.key,
                                compare,
                                swap,
                            },
                            new,
                            WcOpcode::CompSwap,
                        )
                    };
                    theirs.model[q][word as usize..][..8].copy_from_slice(&new.to_le_bytes());
                    target = Some((word, 8));
                    (
                        op,
                        sge(mine.node.key, q, K_OFF, at, 8),
                        Expect::Atomic {
                            at,
                            orig: cur,
                            opcode,
                        },
                    )
                }
            };
            let wr = SendWr {
                wr_id: id,
                op,
                sg,
                signaled: true,
                solicited: false,
                fence,
                inline: false,
                ud: None,
            };
            if std::env::var_os("SOAK_TRACE").is_some() {
                eprintln!("post side {me} qp {q} wr {id} {op:?} len {size}");
            }
            let posted_wr = if !op.is_read_or_atomic() && size <= INLINE && rng.chance(0.33) {
                let wr = SendWr {
                    sg: SgList::new(),
                    ..wr
                };
                mine.node.qps[q].post_send(&wr, wr.wr_id, Some(&src_bytes))
            } else {
                mine.node.qps[q].post_send(&wr, wr.wr_id, None)
            };
            if let Err(e) = posted_wr {
                fail(&mut report, format!("post_send refused: {e}"));
                break;
            }
            posted[me][q].push_back(Posted {
                wr_id: id,
                expect,
                target,
            });
            report.bytes += size as u64;
            next_id += 1;
            issued += 1;
        }
        // Transmit, deliver, run timers.
        let mut moved = false;
        for (si, s) in sides.iter_mut().enumerate() {
            for q in 0..n {
                while s.node.transmit(q, now, &mut buf) {
                    if std::env::var_os("SOAK_TRACE_TX").is_some()
                        && let Ok(p) = parse(&buf, Checks::NONE)
                    {
                        eprintln!(
                            "{:>10} tx{} qp {:#x} {} psn {}",
                            now.as_nanos(),
                            si,
                            p.dest_qp,
                            p.op.name,
                            p.psn.value()
                        );
                    }
                    net.send(now, NodeId(si as u16), NodeId(1 - si as u16), buf.clone());
                    moved = true;
                }
            }
        }
        let next = [
            net.next_delivery(),
            sides[0].node.poll_timeout(),
            sides[1].node.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min();
        if let Some(t) = next {
            now = now.max(t);
            while let Some((_, to, f)) = net.deliver(now) {
                report.frames += 1;
                if std::env::var_os("SOAK_TRACE").is_some()
                    && let Err(e) = parse(&f, Checks::NONE)
                {
                    eprintln!(
                        "{:>10} ->{} UNPARSEABLE {e:?} len {}",
                        now.as_nanos(),
                        to.0,
                        f.len()
                    );
                }
                if std::env::var_os("SOAK_TRACE").is_some()
                    && let Ok(p) = parse(&f, Checks::NONE)
                {
                    eprintln!(
                        "{:>10} ->{} qp {:#x} {:<34} psn {:>8} {:?} {:?}",
                        now.as_nanos(),
                        to.0,
                        p.dest_qp,
                        p.op.name,
                        p.psn.value(),
                        p.ext.aeth().map(|a| a.syndrome),
                        p.ext.reth().map(|r| (r.va, r.dma_len))
                    );
                }
                sides[to.0 as usize].node.receive(now, &f);
            }
            for s in sides.iter_mut() {
                s.node.handle_timeouts(now);
            }
            moved = true;
        }
        // Check completions.
        let mut wcs = Vec::new();
        let mut kill = Vec::new();
        for si in 0..2 {
            for q in 0..n {
                wcs.clear();
                sides[si].node.scq[q].poll(usize::MAX, &mut wcs);
                for c in &wcs {
                    let Some(p) = posted[si][q].pop_front() else {
                        fail(
                            &mut report,
                            format!("side {si} QP {q}: completion {} never posted", c.wr_id),
                        );
                        break;
                    };
                    if c.wr_id != p.wr_id {
                        fail(
                            &mut report,
                            format!("side {si} QP {q}: got {:?}, wanted wr {}", c, p.wr_id),
                        );
                        break;
                    }
                    if c.status != WcStatus::Success {
                        // Go-back-N may give up under heavy loss (RETRY_EXC_ERR, once, first);
                        // the pair then dies and everything after it is flushed. Nothing else.
                        match c.status {
                            WcStatus::RetryExcErr if !failed[si][q] => report.retry_exceeded += 1,
                            WcStatus::WrFlushErr if pair_dead(&failed, q) => report.flushed += 1,
                            _ => {
                                fail(
                                    &mut report,
                                    format!(
                                        "side {si} QP {q}: got {:?}, wanted wr {} success",
                                        c, p.wr_id
                                    ),
                                );
                                break;
                            }
                        }
                        if !pair_dead(&failed, q) {
                            kill.push(q);
                        }
                        failed[si][q] = true;
                        if let Some(t) = p.target {
                            undefined[1 - si][q].push(t);
                        }
                        if matches!(p.expect, Expect::Read { .. } | Expect::Atomic { .. }) {
                            sinks[si][q].free_oldest();
                            reading[si][q].retain(|(id, _, _)| *id != c.wr_id);
                        }
                        continue;
                    }
                    if failed[si][q] {
                        fail(
                            &mut report,
                            format!("side {si} QP {q}: wr {} succeeded after an error", c.wr_id),
                        );
                        break;
                    }
                    let mem = sides[si].node.mrs.get(sides[si].node.key).expect("key");
                    let k = BASE + q as u64 * PER_QP + K_OFF;
                    match &p.expect {
                        Expect::Done(op) if *op != c.opcode => {
                            fail(&mut report, format!("opcode {:?} for {:?}", c.opcode, op))
                        }
                        Expect::Done(_) => {}
                        Expect::Read { at, data } => {
                            if mem.to_vec(k + at, data.len()).expect("sink") != data[..] {
                                fail(
                                    &mut report,
                                    format!(
                                        "side {si} QP {q}: READ {} returned wrong bytes",
                                        c.wr_id
                                    ),
                                );
                            }
                            sinks[si][q].free_oldest();
                            reading[si][q].retain(|(id, _, _)| *id != c.wr_id);
                        }
                        Expect::Atomic { at, orig, opcode } => {
                            let got = u64::from_le_bytes(
                                mem.to_vec(k + at, 8).expect("sink").try_into().expect("8"),
                            );
                            if got != *orig || c.opcode != *opcode {
                                fail(
                                    &mut report,
                                    format!(
                                        "side {si} QP {q}: atomic {} returned {got:#x}, model {orig:#x}",
                                        c.wr_id
                                    ),
                                );
                            }
                            sinks[si][q].free_oldest();
                        }
                    }
                    report.completed += 1;
                }
                wcs.clear();
                sides[si].node.rcq[q].poll(usize::MAX, &mut wcs);
                for c in &wcs {
                    let Some(r) = recvs[si][q].pop_front() else {
                        fail(
                            &mut report,
                            format!(
                                "side {si} QP {q}: receive completion {} unexpected",
                                c.wr_id
                            ),
                        );
                        break;
                    };
                    if c.wr_id == r.wr_id
                        && c.status == WcStatus::WrFlushErr
                        && pair_dead(&failed, q)
                    {
                        report.recv_flushed += 1;
                        rrings[si][q].free_oldest();
                        continue;
                    }
                    let mem = sides[si].node.mrs.get(sides[si].node.key).expect("key");
                    let at = BASE + q as u64 * PER_QP + R_OFF + r.at;
                    let ok = c.wr_id == r.wr_id
                        && c.status == WcStatus::Success
                        && c.opcode == r.opcode
                        && c.imm_data == r.imm
                        && (r.opcode != WcOpcode::Recv
                            || (c.byte_len as usize == r.data.len()
                                && mem.to_vec(at, r.data.len()).expect("recv") == r.data[..]));
                    if !ok {
                        fail(
                            &mut report,
                            format!(
                                "side {si} QP {q}: receive {:?}, wanted {} {:?}",
                                c, r.wr_id, r.opcode
                            ),
                        );
                    }
                    rrings[si][q].free_oldest();
                }
            }
        }
        // A dead pair's QPs both go to ERR, as an application would take them down.
        for q in kill {
            for s in sides.iter_mut() {
                if s.node.qps[q].cfg.state == QpState::Err {
                    continue;
                }
                let err = QpAttr {
                    state: Some(QpState::Err),
                    ..Default::default()
                };
                if s.node.qps[q].modify(&err).is_ok() {
                    s.node.qps[q].flush(&mut s.node.scq[q]);
                    s.node.qps[q].flush_recv(&mut s.node.rcq[q]);
                }
            }
        }
        let outstanding: usize = posted.iter().flatten().map(|q| q.len()).sum();
        if issued >= cfg.ops && outstanding == 0 {
            break;
        }
        if moved {
            idle_rounds = 0;
        } else {
            idle_rounds += 1;
            if idle_rounds > 1000 {
                fail(
                    &mut report,
                    format!("stalled with {outstanding} work requests outstanding"),
                );
            }
        }
    }
    // Every target area equals the model, but for the bytes a failed WRITE or atomic changed.
    for (si, s) in sides.iter().enumerate() {
        let mem = s.node.mrs.get(s.node.key).expect("key");
        for (q, undefined) in undefined[si].iter().enumerate() {
            let got = mem
                .to_vec(BASE + q as u64 * PER_QP + T_OFF, AREA as usize)
                .expect("area");
            if !matches_model(&got, &s.model[q], undefined) {
                fail(
                    &mut report,
                    format!("side {si} QP {q}: memory differs from the model"),
                );
            }
        }
    }
    let st = net.stats(NodeId(0), NodeId(1)).unwrap_or_default();
    let st2 = net.stats(NodeId(1), NodeId(0)).unwrap_or_default();
    report.lost = st.lost + st2.lost;
    report.duplicated = st.duplicated + st2.duplicated;
    report.reordered = st.reordered + st2.reordered;
    report.corrupted = st.corrupted + st2.corrupted;
    report.sim_ns = now.as_nanos();
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mix(loss: f64) -> Faults {
        Faults {
            loss,
            reorder: loss / 2.0,
            reorder_delay: Duration::from_micros(3),
            duplicate: loss / 2.0,
            corrupt: loss / 10.0,
            ..Default::default()
        }
    }

    #[test]
    fn soak_every_opcode_under_every_loss_rate() {
        for (seed, loss) in [(1u64, 0.0), (2, 0.001), (3, 0.01), (4, 0.1)] {
            let cfg = SoakConfig {
                seed,
                qps: 4,
                ops: 1500,
                max_size: 65536,
                faults: mix(loss),
                depth: 16,
            };
            let r = run(&cfg);
            assert_eq!(r.violation, None, "loss {loss}: {r:?}");
            assert_eq!(r.completed, 1500, "loss {loss}: {r:?}");
            assert_eq!(r.retry_exceeded + r.flushed + r.abandoned, 0, "{r:?}");
            if loss > 0.0 {
                assert!(r.lost > 0, "faults happened: {r:?}");
            }
        }
    }

    #[test]
    fn at_a_fifth_lost_go_back_n_may_give_up_but_never_twice_nor_with_wrong_data() {
        // retry_cnt 7 (QpAttr::connect): at 20 % loss some runs of eight timeouts lose a frame
        // each time. Such a request ends in RETRY_EXC_ERR, its pair dies (both QPs to ERR),
        // everything after it is flushed, and the soak checks that every request still
        // completes exactly once, in order, that nothing succeeds after an error, and that
        // every byte but those a failed WRITE or atomic touched equals the model.
        let mut gave_up = 0;
        for seed in 1..=4u64 {
            let cfg = SoakConfig {
                seed,
                qps: 4,
                ops: 1500,
                max_size: 65536,
                faults: mix(0.2),
                depth: 16,
            };
            let r = run(&cfg);
            assert_eq!(r.violation, None, "{r:?}");
            assert_eq!(
                r.completed + r.retry_exceeded + r.flushed + r.abandoned,
                1500,
                "every request ends once: {r:?}"
            );
            // At most one per side of each pair: the first error of a QP kills the pair.
            assert!(r.retry_exceeded <= 2 * cfg.qps, "{r:?}");
            assert!(r.lost > 0, "{r:?}");
            gave_up += r.retry_exceeded;
        }
        // The runs are deterministic: these seeds do give up (so the path above is exercised).
        assert!(gave_up > 0, "no run gave up");
    }

    #[test]
    fn the_model_check_skips_only_undefined_bytes() {
        let model = vec![7u8; 64];
        let mut got = model.clone();
        assert!(matches_model(&got, &model, &[]));
        got[20] = 8;
        assert!(!matches_model(&got, &model, &[]));
        assert!(matches_model(&got, &model, &[(16, 8)]));
        assert!(!matches_model(&got, &model, &[(21, 8)]));
        assert!(!matches_model(&got, &model, &[(12, 8)]));
        assert!(!matches_model(&got[..63], &model, &[(16, 8)]));
    }
}
