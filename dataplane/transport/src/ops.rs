//! Two RC QPs driven by an arbitrary sequence of operations, quinn-style: posts of every kind
//! (good and bad), receives, frames delivered, dropped, duplicated or reordered, frames crafted
//! as a peer or an attacker could send them (any opcode, PSN, RETH, AETH and length), modifies
//! to ERR, and time passing. The same sequence runs under libFuzzer (`fuzz/fuzz_targets/
//! rc_ops.rs`, from its bytes) and in the tests (from a seeded generator).
//!
//! What must hold whatever the sequence, checked as it runs and when it ends:
//! - nothing panics;
//! - no byte changes in a region no request may touch (each side has one, with local access
//!   only, next to the one the requests use);
//! - every work request completes at most once, and every send request exactly once once the
//!   network is drained and the timers have run out (retry and RNR counts are finite here);
//! - a QP in ERR holds no work: everything posted to it has completed (flushed if need be).

use super::cq::CompletionQueue;
use super::mr::Access;
use super::qp::{Mtu, QpAttr, QpState};
use super::rc::QpCaps;
use super::testkit::{Node, NodeConfig, sim_attr};
use super::wr::{RecvWr, SendOp, SendWr, SgList, Sge};
use std::collections::{HashMap, VecDeque};
use wire::aeth::{self, Syndrome};
use wire::packet::{Checks, ExtRepr, RoceRepr, parse};
use wire::time::Instant;
use wire::{atomic_eth, reth};

const BASE: u64 = 0x10_0000;
const LEN: usize = 64 << 10;
/// The region next to it that no request names (local access only).
const GUARD: u64 = 0x40_0000;
const GUARD_LEN: usize = 4096;

/// One side: the harness's node (one QP), a guard region, what completed.
#[derive(Debug)]
struct Side {
    node: Node,
    guard_key: u32,
    /// Times each posted work request completed, by wr_id (sends and receives apart).
    sends: HashMap<u64, u32>,
    recvs: HashMap<u64, u32>,
    /// A real frame this side sent (a template for forged ones from it).
    template: Option<Vec<u8>>,
}

fn side(qpn: u32, peer: u32, me: u8, other: u8) -> Side {
    let mut node = Node::new(
        NodeConfig {
            caps: QpCaps {
                max_send_wr: 32,
                max_recv_wr: 32,
                max_inline_data: 64,
                ..Default::default()
            },
            cq_depth: 1024,
            ..NodeConfig::new(BASE, vec![me; LEN])
        },
        &[qpn],
    );
    let guard_key = node
        .mrs
        .register(
            node.qps[0].pd,
            GUARD,
            Box::new(vec![0x5a; GUARD_LEN]),
            Access::LOCAL_WRITE,
        )
        .expect("guard region");
    let all =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    node.qps[0]
        .connect(&QpAttr {
            access: Some(all),
            sq_psn: Some(0xff_fff0),
            rq_psn: Some(0xff_fff0),
            retry_cnt: Some(3),
            rnr_retry: Some(3),
            timeout: Some(10),
            max_rd_atomic: Some(4),
            max_dest_rd_atomic: Some(4),
            ..sim_attr(qpn, me, other, peer, Mtu::M1024)
        })
        .expect("connect");
    Side {
        node,
        guard_key,
        sends: HashMap::new(),
        recvs: HashMap::new(),
        template: None,
    }
}

/// Reads operations off a byte string; past its end, zeros.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
}

/// The two sides, the frames in flight each way, the time.
#[derive(Debug)]
pub struct Run {
    s: [Side; 2],
    wire: [VecDeque<Vec<u8>>; 2],
    now: Instant,
    next_id: u64,
}

impl Default for Run {
    fn default() -> Self {
        Self::new()
    }
}

impl Run {
    /// A connected pair on a quiet network at time 0.
    pub fn new() -> Run {
        Run {
            s: [side(0x11, 0x22, 1, 2), side(0x22, 0x11, 2, 1)],
            wire: [VecDeque::new(), VecDeque::new()],
            now: Instant(0),
            next_id: 1,
        }
    }

    /// Applies the operations `data` encodes, then drains the network and the timers and
    /// checks the end state. Panics on any violation.
    pub fn apply(data: &[u8]) {
        let mut r = Run::new();
        let mut b = Bytes(data);
        for _ in 0..2000 {
            if b.0.is_empty() {
                break;
            }
            r.step(&mut b);
            r.collect();
        }
        r.drain();
        r.check_end();
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn step(&mut self, b: &mut Bytes<'_>) {
        let op = b.u8();
        let who = (op >> 7) as usize;
        match op & 0x0f {
            0..=3 => self.post(who, op & 0x0f, b),
            4 | 5 => {
                let id = self.id();
                let (len, at) = (b.u16() as u32 % 8192, b.u16() as u64 % LEN as u64);
                let s = &mut self.s[who];
                let key = if b.u8() < 250 {
                    s.node.key
                } else {
                    s.guard_key ^ 0x100
                };
                if s.node.qps[0]
                    .post_recv(RecvWr {
                        wr_id: id,
                        sg: sg(key, BASE + at, len),
                    })
                    .is_ok()
                {
                    s.recvs.insert(id, 0);
                }
            }
            6..=10 => {
                // Deliver the oldest frame (or drop it, or deliver it twice).
                let how = b.u8();
                if let Some(f) = self.wire[who].pop_front() {
                    match how % 8 {
                        0 => {}
                        1 => {
                            self.deliver(who, &f);
                            self.deliver(who, &f);
                        }
                        2 => self.wire[who].push_back(f), // reordered behind the rest
                        _ => self.deliver(who, &f),
                    }
                }
            }
            11 | 12 => {
                // Time passes; timers run.
                let dt = b.u16() as u64 * 1000;
                self.now = Instant(self.now.0 + dt);
                self.timers();
            }
            // A modify to ERR, now and then.
            13 if b.u8() < 16 => {
                let err = super::qp::QpAttr {
                    state: Some(QpState::Err),
                    ..Default::default()
                };
                let s = &mut self.s[who];
                if s.node.qps[0].modify(&err).is_ok() {
                    s.node.qps[0].flush(&mut s.node.scq[0]);
                    s.node.qps[0].flush_recv(&mut s.node.rcq[0]);
                }
            }
            14 | 15 => self.forge(who, b),
            _ => {}
        }
        self.transmit();
    }

    /// Side `who` posts a send request of kind `k` (WRITE, READ, SEND, atomic), good or bad.
    fn post(&mut self, who: usize, k: u8, b: &mut Bytes<'_>) {
        let id = self.id();
        let len = b.u16() as u32 % 9000;
        let span = (LEN - 9000) as u64;
        let (at, rat) = (b.u16() as u64 % span, b.u16() as u64 % span);
        let flags = b.u8();
        let peer_key = self.s[1 - who].node.key;
        let s = &mut self.s[who];
        // Mostly within the regions; sometimes a wrong key, or the guard region's.
        let rkey = match flags & 7 {
            0 => peer_key ^ 0x100,
            1 => s.guard_key,
            _ => peer_key,
        };
        let lkey = if flags & 0x38 == 0x38 {
            s.guard_key ^ 1
        } else {
            s.node.key
        };
        let op = match k {
            0 if flags & 0x20 != 0 => SendOp::WriteWithImm {
                remote_addr: BASE + rat,
                rkey,
                imm: id as u32,
            },
            0 => SendOp::Write {
                remote_addr: BASE + rat,
                rkey,
            },
            1 => SendOp::Read {
                remote_addr: BASE + rat,
                rkey,
            },
            2 => SendOp::Send,
            _ if flags & 0x20 != 0 => SendOp::CmpSwap {
                remote_addr: BASE + (rat & !7),
                rkey,
                compare: at,
                swap: rat,
            },
            _ => SendOp::FetchAdd {
                remote_addr: BASE + (rat & !7),
                rkey,
                add: 1,
            },
        };
        let len = if matches!(op, SendOp::CmpSwap { .. } | SendOp::FetchAdd { .. }) {
            8
        } else {
            len
        };
        let wr = SendWr {
            wr_id: id,
            op,
            sg: sg(lkey, BASE + at, len),
            signaled: true,
            solicited: false,
            fence: flags & 0x40 != 0,
            inline: false,
            ud: None,
        };
        if s.node.qps[0].post_send(&wr, wr.wr_id, None).is_ok() {
            s.sends.insert(id, 0);
        }
    }

    /// A frame to side `who` built from a real one: any opcode, a PSN near the expected one,
    /// any RETH, AETH and payload length.
    fn forge(&mut self, who: usize, b: &mut Bytes<'_>) {
        let Some(t) = self.s[1 - who].template.clone() else {
            return;
        };
        let Ok(info) = parse(&t, Checks::ALL) else {
            return;
        };
        let Ok(mut repr) = RoceRepr::parse(&t, &info) else {
            return;
        };
        let expected = self.s[who].node.qps[0].cfg.rq_psn;
        repr.bth.opcode = b.u8();
        repr.bth.psn = expected.add(b.u8() as u32).sub(128);
        repr.bth.ack_req = true;
        let key = match b.u8() % 4 {
            0 => b.u32(),
            _ => self.s[who].node.key,
        };
        repr.ext = ExtRepr {
            reth: Some(reth::Repr {
                va: BASE + b.u16() as u64 * 4,
                rkey: key,
                dma_len: b.u16() as u32,
            }),
            aeth: Some(aeth::Repr {
                syndrome: Syndrome::from_byte(b.u8()),
                msn: b.u8() as u32,
            }),
            atomic_eth: Some(atomic_eth::Repr {
                va: BASE + (b.u16() as u64 & !7),
                rkey: key,
                swap_add: 1,
                compare: 0,
            }),
            ..repr.ext
        };
        let n = b.u16() as usize % 4200;
        if !repr.op().is_valid() {
            return;
        }
        let head = repr.header_len();
        let mut f = vec![0u8; repr.frame_len(n)];
        f[head..head + n].fill(0xc3);
        if repr.emit(&mut f, n, false).is_ok() {
            self.deliver(who, &f);
        }
    }

    fn deliver(&mut self, to: usize, f: &[u8]) {
        let now = self.now;
        let s = &mut self.s[to];
        s.node.receive_on(0, now, f);
    }

    /// Each side sends what it has, onto the wire towards the other.
    fn transmit(&mut self) {
        for i in 0..2 {
            let mut guard = 0;
            loop {
                let now = self.now;
                let s = &mut self.s[i];
                let mut f = Vec::new();
                if guard > 4096 || !s.node.transmit(0, now, &mut f) {
                    break;
                }
                guard += 1;
                if s.template.is_none() {
                    s.template = Some(f.clone());
                }
                self.wire[1 - i].push_back(f);
            }
        }
    }

    fn timers(&mut self) {
        for s in &mut self.s {
            if s.node.qps[0].poll_timeout().is_some_and(|t| t <= self.now) {
                s.node.qps[0].handle_timeout(self.now, &mut s.node.scq[0], &mut s.node.rcq[0]);
            }
        }
    }

    /// Takes every completion, checking none completes twice.
    fn collect(&mut self) {
        for s in &mut self.s {
            count_once(&mut s.node.scq[0], &mut s.sends, "send");
            count_once(&mut s.node.rcq[0], &mut s.recvs, "receive");
            let guard = s
                .node
                .mrs
                .get(s.guard_key)
                .expect("guard")
                .to_vec(GUARD, GUARD_LEN)
                .unwrap();
            assert!(guard.iter().all(|&x| x == 0x5a), "the guard region changed");
        }
    }

    /// Delivers everything and runs the timers until nothing is left to do (bounded).
    fn drain(&mut self) {
        for _ in 0..100_000 {
            self.transmit();
            if let Some(f) = self.wire[0].pop_front() {
                self.deliver(0, &f);
            } else if let Some(f) = self.wire[1].pop_front() {
                self.deliver(1, &f);
            } else {
                let next = self
                    .s
                    .iter()
                    .filter_map(|s| s.node.qps[0].poll_timeout())
                    .min();
                match next {
                    Some(t) => {
                        self.now = self.now.max(t);
                        self.timers();
                    }
                    None => break,
                }
            }
            self.collect();
        }
        self.collect();
    }

    fn check_end(&self) {
        for (i, s) in self.s.iter().enumerate() {
            let open: Vec<_> = s.sends.iter().filter(|(_, n)| **n == 0).collect();
            assert!(
                open.is_empty(),
                "side {i} ({:?}): sends never completed: {open:?}",
                s.node.qps[0].cfg.state
            );
            assert_eq!(s.node.qps[0].outstanding(), 0, "side {i}");
            if s.node.qps[0].cfg.state == QpState::Err {
                let open: Vec<_> = s.recvs.iter().filter(|(_, n)| **n == 0).collect();
                assert!(open.is_empty(), "side {i} in ERR kept receives: {open:?}");
            }
        }
    }
}

/// Takes `cq`'s completions, counting each against the work request it names in `posted`:
/// an unknown one, or one completed twice, is a violation.
fn count_once(cq: &mut CompletionQueue, posted: &mut HashMap<u64, u32>, what: &str) {
    let mut wcs = Vec::new();
    cq.poll(usize::MAX, &mut wcs);
    for c in &wcs {
        let n = posted
            .get_mut(&c.wr_id)
            .unwrap_or_else(|| panic!("unknown {what} {c:?}"));
        *n += 1;
        assert_eq!(*n, 1, "{what} {} completed twice: {c:?}", c.wr_id);
    }
}

fn sg(key: u32, addr: u64, len: u32) -> SgList {
    [Sge {
        addr,
        length: len,
        lkey: key,
    }]
    .into_iter()
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte strings the tests feed: the simulator's seeded generator.
    fn bytes(seed: u64, n: usize) -> Vec<u8> {
        let mut r = netsim::SplitMix64::new(seed);
        (0..n).map(|_| r.next_u64() as u8).collect()
    }

    #[test]
    fn arbitrary_operation_sequences_keep_the_invariants() {
        for seed in 0..300 {
            Run::apply(&bytes(seed, 600));
        }
    }
}
