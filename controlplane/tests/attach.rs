//! An application attached to roced through its socket uses it as its RDMA device (issue 21):
//! its own memory registered in place, a CQ and an RC QP whose rings it writes and reads,
//! connected to a QP that node B's REST API made; a WRITE from its memory and a READ into it,
//! every byte checked; another application cannot touch its QP; and when it goes, its QP,
//! CQ, region and PD go too. Two applications, one on each node, move known patterns with
//! WRITE, READ, SEND with immediate data and both atomics over a link losing 1 % each way.
//! A program that writes garbage into its own rings, completion ring and doorbells, posts
//! requests naming other programs' keys and sends control messages that are no messages or
//! name others' objects hurts only itself: another program's stream beside it lands byte
//! for byte, its memory on both nodes unchanged, its counters clean, roced unpanicked.
//! At MTU 4096 application memory leaves in frames attached (zero copy: WRITE, SEND and READ
//! responses, every byte checked); regions past DPDK's room for external memory are copied
//! instead, counted; registrations go with their regions and their applications.

mod common;
use common::rdma::*;
use std::time::{Duration, Instant};
use verbs::abi::{self, Cqe, SendWqe, UdTarget, WrOpcode, send_flags};
use verbs::client::{ClientError, Context, Cq, Memory};
use verbs::proto::{ModifyMsg, QpCapsMsg};

/// 16 send and receive WRs of one SGE each, no inline data.
const CAPS16: QpCapsMsg = QpCapsMsg {
    max_send_wr: 16,
    max_recv_wr: 16,
    max_send_sge: 1,
    max_recv_sge: 1,
    max_inline_data: 0,
};

fn wait_one(cq: &mut Cq) -> Cqe {
    let t = Instant::now();
    let mut v = Vec::new();
    while t.elapsed() < Duration::from_secs(10) {
        if cq.poll(1, &mut v).unwrap() == 1 {
            return v[0];
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    panic!("no completion in 10 s");
}

fn wqe(
    id: u64,
    opcode: WrOpcode,
    lkey: u32,
    addr: u64,
    len: u32,
    raddr: u64,
    rkey: u32,
) -> SendWqe<'static> {
    let mut sg = arrayvec::ArrayVec::new();
    sg.push(abi::Sge {
        addr,
        length: len,
        lkey,
    });
    SendWqe {
        wr_id: id,
        opcode,
        flags: send_flags::SIGNALED,
        imm: 0,
        remote_addr: raddr,
        rkey,
        compare_add: 0,
        swap: 0,
        ud: UdTarget::default(),
        sg,
        inline: &[],
    }
}

#[test]
fn an_attached_application_moves_data_from_and_into_its_own_memory() {
    let n = memif_nodes("attach", 7640);
    let sock = format!("/run/ferroce/ferroce-rattach-a-{}.sock", std::process::id());
    let ctx = Context::attach(sock.as_ref()).expect("attach");
    assert_eq!(ctx.device, "ferroce0");
    let pd = ctx.alloc_pd().unwrap();
    let mem = Memory::new(64 << 10).unwrap();
    let data = pattern(16 << 10, 7);
    mem.write(0, &data).unwrap();
    assert!(
        mem.write(64 << 10, &[1]).is_err(),
        "a write past the memory is refused"
    );
    let (lkey, _) = ctx.reg_mr(pd, &mem, 0xf).unwrap();
    // A completion channel must be an eventfd (the lcore writes it; a pipe could block it).
    let (r, _w) = rustix::pipe::pipe().unwrap();
    match ctx.create_cq_with(8, Some(rustix::fd::AsFd::as_fd(&r))) {
        Err(ClientError::Refused { code, .. }) => assert_eq!(code, "bad_channel"),
        other => panic!("a pipe as a channel: {other:?}"),
    }
    let mut cq = ctx.create_cq(64).unwrap();
    let caps = QpCapsMsg {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let mut qp = ctx.create_qp(pd, &cq, &cq, caps).unwrap();

    // B's side through REST; the application connects as a verbs program does.
    let (kb, vb) = reg(&n.api[1], 1 << 20);
    let qb = create_qp(&n.api[1], None);
    let base = ModifyMsg::default;
    ctx.modify_qp(
        &qp,
        ModifyMsg {
            state: "INIT".into(),
            access: Some(0xe),
            ..base()
        },
    )
    .unwrap();
    ctx.modify_qp(
        &qp,
        ModifyMsg {
            state: "RTR".into(),
            mtu: Some(1024),
            dest_qp: Some(qb),
            remote_gid: Some(n.gids[1].0.clone()),
            rq_psn: Some(psn_of(&n.api[1], qb)),
            max_dest_rd_atomic: Some(16),
            min_rnr_timer: Some(12),
            ..base()
        },
    )
    .unwrap();
    ctx.modify_qp(
        &qp,
        ModifyMsg {
            state: "RTS".into(),
            sq_psn: Some(qp.sq_psn),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(16),
            ..base()
        },
    )
    .unwrap();
    assert_eq!(ctx.query_qp(qp.qpn).unwrap().0, "RTS");
    connect(&n.api[1], qb, (&n.api[0], qp.qpn), &n.gids[0].0, 1024);

    // A WRITE straight from the application's memory...
    let w = wqe(1, WrOpcode::Write, lkey, mem.addr(), 16 << 10, vb, kb);
    assert!(qp.post_send(&w).unwrap());
    let c = wait_one(&mut cq);
    assert_eq!((c.wr_id, c.status, c.opcode), (1, 0, 1), "{c:?}");
    same(
        &n,
        &get(&n.api[1], kb, vb, 16 << 10),
        &data,
        "WRITE from the application",
    );
    // ...and a READ into it, seen in its own mapping.
    let theirs = pattern(8 << 10, 9);
    put(&n.api[1], kb, vb + 0x4_0000, &theirs);
    let r = wqe(
        2,
        WrOpcode::Read,
        lkey,
        mem.addr() + 0x8000,
        8 << 10,
        vb + 0x4_0000,
        kb,
    );
    assert!(qp.post_send(&r).unwrap());
    let c = wait_one(&mut cq);
    assert_eq!(
        (c.wr_id, c.status, c.opcode, c.byte_len),
        (2, 0, 2, 8 << 10),
        "{c:?}"
    );
    same(
        &n,
        &mem.read(0x8000, 8 << 10).unwrap(),
        &theirs,
        "READ into the application",
    );

    // Another application cannot reach this one's QP.
    let other = Context::attach(sock.as_ref()).unwrap();
    match other.query_qp(qp.qpn) {
        Err(ClientError::Refused { code, .. }) => assert_eq!(code, "not_found"),
        r => panic!("another application's QP answered: {r:?}"),
    }

    // A UD QP may send only through address handles of its own PD: another application's
    // handle (a number valid on the lcore) gives an error completion, and nothing is sent.
    let other_pd = other.alloc_pd().unwrap();
    let theirs_ah = other.create_ah(other_pd, &n.gids[1].0).unwrap();
    let mut ucq = ctx.create_cq(8).unwrap();
    let mut ud = ctx.create_qp_in(pd, ucq.cq, ucq.cq, caps, true).unwrap();
    for (state, qkey, sq_psn) in [
        ("INIT", Some(0x1111), None),
        ("RTR", None, None),
        ("RTS", None, Some(1)),
    ] {
        let m = ModifyMsg {
            state: state.into(),
            qkey,
            sq_psn,
            ..base()
        };
        ctx.modify_qp(&ud, m).unwrap();
    }
    let mut w = wqe(30, WrOpcode::Send, lkey, mem.addr(), 64, 0, 0);
    w.ud = UdTarget {
        remote_qpn: 2,
        qkey: 0x1111,
        ah: theirs_ah,
    };
    assert!(ud.post_send(&w).unwrap());
    let c = wait_one(&mut ucq);
    assert_eq!(
        (c.wr_id, c.status),
        (30, 2),
        "another PD's address handle: {c:?}"
    );
    assert!(
        ctx.create_ah(pd, "192.0.2.77").is_err(),
        "an address handle toward a GID with no route is refused"
    );

    // When the application goes, what it made goes within a second.
    let qpa = qp.qpn;
    drop((qp, ud, ucq, cq, ctx));
    let t = Instant::now();
    loop {
        let (status, _) = n.api[0].get(&format!("/v1/qps/{qpa}"));
        if status == 404 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "QP {qpa} outlived its application"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(other);
    n.stop();
}

/// Moves `qp` of `ctx` to RTS toward `remote` (QPN, PSN) at `gid`.
fn connect_app(ctx: &Context, qp: &verbs::client::Qp, remote: (u32, u32), gid: &str, mtu: u32) {
    let steps = [
        ModifyMsg {
            state: "INIT".into(),
            access: Some(0xe),
            ..ModifyMsg::default()
        },
        ModifyMsg {
            state: "RTR".into(),
            mtu: Some(mtu),
            dest_qp: Some(remote.0),
            remote_gid: Some(gid.into()),
            rq_psn: Some(remote.1),
            max_dest_rd_atomic: Some(16),
            min_rnr_timer: Some(1),
            ..ModifyMsg::default()
        },
        ModifyMsg {
            state: "RTS".into(),
            sq_psn: Some(qp.sq_psn),
            timeout: Some(10),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(16),
            ..ModifyMsg::default()
        },
    ];
    for m in steps {
        ctx.modify_qp(qp, m).unwrap();
    }
}

/// Two applications, one on each node of `n` (whose sockets are tagged `tag`), each with
/// `len` bytes of heap memory registered where it lies, a CQ and an RC QP, connected to each
/// other at path MTU `mtu`. Fields drop in order: QPs, CQs, contexts, then the memory.
struct HeapPair {
    qa: verbs::client::Qp,
    qb: verbs::client::Qp,
    qa_cq: Cq,
    qb_cq: Cq,
    ca: Context,
    /// B's attachment, kept while its QP and region are used.
    _cb: Context,
    ma: Vec<u8>,
    mb: Vec<u8>,
    pa: u32,
    la: u32,
    lb: u32,
    rb: u32,
}

fn heap_pair(n: &Cluster, tag: &str, len: usize, mtu: u32) -> HeapPair {
    let pid = std::process::id();
    let attach = |node: &str| {
        let sock = format!("/run/ferroce/ferroce-r{tag}-{node}-{pid}.sock");
        Context::attach(sock.as_ref()).unwrap()
    };
    let (ca, cb) = (attach("a"), attach("b"));
    let mut ma = vec![0u8; len];
    let mut mb = vec![0u8; len];
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    // SAFETY: the pair's own buffers, which outlive the regions (they drop last) and which
    // no other thread touches.
    let (la, _) = unsafe { ca.reg_mr_at(pa, ma.as_mut_ptr() as usize, len, 0xf) }.unwrap();
    // SAFETY: as above.
    let (lb, rb) = unsafe { cb.reg_mr_at(pb, mb.as_mut_ptr() as usize, len, 0xf) }.unwrap();
    let (qa_cq, qb_cq) = (ca.create_cq(64).unwrap(), cb.create_cq(64).unwrap());
    let caps = CAPS16;
    let qa = ca.create_qp(pa, &qa_cq, &qa_cq, caps).unwrap();
    let qb = cb.create_qp(pb, &qb_cq, &qb_cq, caps).unwrap();
    connect_app(&ca, &qa, (qb.qpn, qb.sq_psn), &n.gids[1].0, mtu);
    connect_app(&cb, &qb, (qa.qpn, qa.sq_psn), &n.gids[0].0, mtu);
    HeapPair {
        qa,
        qb,
        qa_cq,
        qb_cq,
        ca,
        _cb: cb,
        ma,
        mb,
        pa,
        la,
        lb,
        rb,
    }
}

impl HeapPair {
    /// A WRITE of `want` from A's `lkey` at `addr` into B's memory at `at`: completed, and
    /// checked byte for byte on B.
    fn write_from(
        &mut self,
        n: &Cluster,
        id: u64,
        (lkey, addr): (u32, u64),
        at: usize,
        want: &[u8],
        what: &str,
    ) {
        let ab = self.mb.as_ptr() as u64 + at as u64;
        let w = wqe(
            id,
            WrOpcode::Write,
            lkey,
            addr,
            want.len() as u32,
            ab,
            self.rb,
        );
        assert!(self.qa.post_send(&w).unwrap());
        ok(wait_one(&mut self.qa_cq), id, what);
        same(
            n,
            &read(self.mb.as_ptr().wrapping_add(at), want.len()),
            want,
            what,
        );
    }

    /// A WRITE of `len` bytes of pattern `seed` from A's memory at `at` into B's at `at`.
    fn write_checked(
        &mut self,
        n: &Cluster,
        id: u64,
        at: usize,
        len: usize,
        seed: u32,
        what: &str,
    ) {
        let d = pattern(len, seed);
        self.ma[at..at + len].copy_from_slice(&d);
        let from = (self.la, self.ma.as_ptr() as u64 + at as u64);
        self.write_from(n, id, from, at, &d, what);
    }

    /// A READ of `len` bytes of pattern `seed` from B's memory at `at` into A's at `at`:
    /// completed, and checked byte for byte on A.
    fn read_checked(&mut self, n: &Cluster, id: u64, at: usize, len: usize, seed: u32, what: &str) {
        let d = pattern(len, seed);
        self.mb[at..at + len].copy_from_slice(&d);
        let (aa, ab) = (self.ma.as_ptr() as u64, self.mb.as_ptr() as u64);
        let r = wqe(
            id,
            WrOpcode::Read,
            self.la,
            aa + at as u64,
            len as u32,
            ab + at as u64,
            self.rb,
        );
        assert!(self.qa.post_send(&r).unwrap());
        ok(wait_one(&mut self.qa_cq), id, what);
        same(n, &read(self.ma.as_ptr().wrapping_add(at), len), &d, what);
    }

    /// A SEND (with immediate data `imm`, if given) of `len` bytes of pattern `seed` from A's
    /// memory at `at` into a receive `recv_id` B posted at its `at`: both completed, the bytes
    /// checked on B; the receive's completion.
    #[allow(clippy::too_many_arguments)]
    fn send_checked(
        &mut self,
        n: &Cluster,
        (id, recv_id): (u64, u64),
        at: usize,
        len: usize,
        seed: u32,
        imm: Option<u32>,
        what: &str,
    ) -> Cqe {
        let d = pattern(len, seed);
        self.ma[at..at + len].copy_from_slice(&d);
        let (aa, ab) = (self.ma.as_ptr() as u64, self.mb.as_ptr() as u64);
        let recv = abi::RecvWqe {
            wr_id: recv_id,
            sg: [abi::Sge {
                addr: ab + at as u64,
                length: len as u32,
                lkey: self.lb,
            }]
            .into_iter()
            .collect(),
        };
        assert!(self.qb.post_recv(&recv).unwrap());
        let op = if imm.is_some() {
            WrOpcode::SendWithImm
        } else {
            WrOpcode::Send
        };
        let mut w = wqe(id, op, self.la, aa + at as u64, len as u32, 0, 0);
        w.imm = imm.unwrap_or(0);
        assert!(self.qa.post_send(&w).unwrap());
        ok(wait_one(&mut self.qa_cq), id, what);
        let c = wait_one(&mut self.qb_cq);
        ok(c, recv_id, "receive");
        same(n, &read(self.mb.as_ptr().wrapping_add(at), len), &d, what);
        c
    }
}

/// Checks that `c` is the successful completion of `id`.
fn ok(c: Cqe, id: u64, what: &str) {
    assert_eq!((c.wr_id, c.status), (id, 0), "{what}: {c:?}");
}

/// `len` bytes at `p`, read through volatile loads: the lcores wrote them behind Rust's back.
fn read(p: *const u8, len: usize) -> Vec<u8> {
    // SAFETY: the callers' pointers are inside their registered buffers, `len` bytes on.
    (0..len)
        .map(|i| unsafe { p.add(i).read_volatile() })
        .collect()
}

#[test]
fn two_applications_move_known_patterns_over_a_lossy_link_every_byte_checked() {
    let n = memif_nodes("attachloss", 7654);
    // Each node's transmit side loses 1 % of its frames: requests, responses and ACKs.
    for api in &n.api {
        let v = api.ok(api.put(
            "/v1/ports/0/impair",
            serde_json::json!({"direction": "tx", "loss": 0.01}),
        ));
        assert_eq!(v["loss"], 0.01);
    }
    // Ordinary heap memory on both sides, registered where it lies.
    const LEN: usize = 512 << 10;
    let mut p = heap_pair(&n, "attachloss", LEN, 1024);
    let (aa, ab) = (p.ma.as_ptr() as u64, p.mb.as_ptr() as u64);

    // WRITE: 256 KiB of a pattern from A into B (256 packets at MTU 1024).
    p.write_checked(&n, 1, 0, 256 << 10, 3, "WRITE over 1 % loss");
    // READ: 128 KiB of another pattern from B back into A.
    p.read_checked(&n, 2, 300 << 10, 128 << 10, 11, "READ over 1 % loss");
    // SEND with immediate data: 64 KiB into a receive B posted.
    let imm = Some(0xfeed_beef);
    let c = p.send_checked(
        &n,
        (3, 7),
        448 << 10,
        64 << 10,
        17,
        imm,
        "SEND over 1 % loss",
    );
    assert_eq!(
        (c.byte_len, c.imm, c.flags & 2),
        (64 << 10, 0xfeed_beef, 2),
        "{c:?}"
    );

    // Atomics on a word of B, results into A: fetch-and-add, then a compare-and-swap that
    // matches and one that does not.
    let word = ab + (510 << 10);
    p.mb[510 << 10..(510 << 10) + 8].copy_from_slice(&100u64.to_le_bytes());
    let res = aa + (509 << 10);
    let u64_at = |p: *const u8| {
        let b: [u8; 8] = read(p, 8).try_into().unwrap();
        u64::from_le_bytes(b)
    };
    let mut fa = wqe(4, WrOpcode::FetchAdd, p.la, res, 8, word, p.rb);
    fa.compare_add = 23;
    assert!(p.qa.post_send(&fa).unwrap());
    ok(wait_one(&mut p.qa_cq), 4, "fetch-and-add");
    let (rp, wp) = (
        p.ma.as_ptr().wrapping_add(509 << 10),
        p.mb.as_ptr().wrapping_add(510 << 10),
    );
    assert_eq!((u64_at(rp), u64_at(wp)), (100, 123), "fetch-and-add");
    for (id, compare, old, now) in [(5, 123, 123, 7), (6, 123, 7, 7)] {
        let mut cs = wqe(id, WrOpcode::CmpSwap, p.la, res, 8, word, p.rb);
        cs.compare_add = compare;
        cs.swap = 7;
        assert!(p.qa.post_send(&cs).unwrap());
        ok(wait_one(&mut p.qa_cq), id, "compare-and-swap");
        assert_eq!(
            (u64_at(rp), u64_at(wp)),
            (old, now),
            "compare-and-swap {id}"
        );
    }
    // The loss happened: retransmissions on A's QP (requests or READ responses lost).
    let (_, q) = n.api[0].get(&format!("/v1/qps/{}", p.qa.qpn));
    let c = &q["counters"];
    let recovered = [
        "packet_seq_err",
        "local_ack_timeout_err",
        "implied_nak_seq_err",
    ]
    .iter()
    .map(|k| c[k].as_u64().unwrap_or(0))
    .sum::<u64>();
    assert!(recovered > 0, "no loss was recovered from: {c}");
    drop(p);
}

/// xorshift64*: the fuzz's one source of randomness, seeded so that a failure repeats
/// (`FERROCE_FUZZ_SEED` picks another seed; the test prints the one it used).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn fill(&mut self, b: &mut [u8]) {
        for c in b.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }

    /// One of `v`.
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize]
    }
}

/// Writes `bytes` at `at` of `mem` (the fuzzer's own shared memory), volatile: roced's lcore
/// reads it concurrently, as it would a hostile program's.
fn scribble(mem: &verbs::shm::SharedMem, at: usize, bytes: &[u8]) {
    let n = bytes.len().min(mem.len().saturating_sub(at));
    for (i, b) in bytes[..n].iter().enumerate() {
        // SAFETY: inside the mapping (clamped above); plain bytes.
        unsafe { mem.as_ptr().add(at + i).write_volatile(*b) };
    }
}

fn word_at(mem: &verbs::shm::SharedMem, at: usize) -> u32 {
    // SAFETY: a ring header's index word, inside the mapping, 4-aligned.
    unsafe { (mem.as_ptr().add(at) as *const u32).read_volatile() }
}

/// One round of garbage from the fuzzing program into its own rings, completion ring and
/// doorbells, and well-formed requests naming other programs' keys: `ops` operations.
fn fuzz_rings(
    rng: &mut Rng,
    f: &Context,
    qp: &mut verbs::client::Qp,
    cq: &mut Cq,
    keys: &[u32],
    addrs: &[u64],
    ops: usize,
) {
    use verbs::ring::HEADER;
    let mut junk = [0u8; 4096];
    let mut got = Vec::new();
    for _ in 0..ops {
        let (mem, sq, rq) = qp.raw_rings();
        let mem = mem.clone();
        // Mostly entries (each decoded, and most refused), now and then a ring broken outright.
        match rng.pick(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 2, 3, 5, 6, 7, 7]) {
            // A random entry published in the send or the receive ring.
            0 => {
                let r = if rng.below(2) == 0 { sq } else { rq };
                let prod = word_at(&mem, r.offset);
                let slot =
                    r.offset + HEADER + (prod & (r.slots - 1)) as usize * r.slot_size as usize;
                rng.fill(&mut junk[..r.slot_size as usize]);
                if rng.below(2) == 0 {
                    // Mostly a known opcode, so that decoding gets past its first check.
                    junk[8] = rng.pick(&[0, 1, 2, 3, 4, 5, 6, 9, 7, 255]);
                    junk[9] &= 0x0f;
                    junk[10] %= 10;
                }
                scribble(&mem, slot, &junk[..r.slot_size as usize]);
                scribble(&mem, r.offset, &prod.wrapping_add(1).to_le_bytes());
                qp.ring_doorbell();
            }
            // A producer index anywhere.
            2 => {
                let r = if rng.below(2) == 0 { sq } else { rq };
                let v = rng.next() as u32;
                scribble(&mem, r.offset, &v.to_le_bytes());
                qp.ring_doorbell();
            }
            // Random bytes anywhere in the rings' memory, headers included.
            3 => {
                let at = rng.below(mem.len() as u64) as usize;
                let n = 1 + rng.below(256) as usize;
                rng.fill(&mut junk[..n]);
                scribble(&mem, at, &junk[..n]);
                qp.ring_doorbell();
            }
            // A well-formed request through the library naming keys and addresses of its own
            // and of other programs (the other program's lkey on this node, its rkey on the
            // peer): refused by protection domain, never served.
            4 => {
                let op = rng.pick(&[
                    WrOpcode::Write,
                    WrOpcode::Read,
                    WrOpcode::Send,
                    WrOpcode::FetchAdd,
                    WrOpcode::CmpSwap,
                    WrOpcode::WriteWithImm,
                ]);
                let len = rng.pick(&[0, 8, 64, 4096, 1 << 20, u32::MAX]);
                let w = wqe(
                    rng.next(),
                    op,
                    rng.pick(keys),
                    rng.pick(addrs) + rng.below(8192),
                    len,
                    rng.pick(addrs) + rng.below(8192),
                    rng.pick(keys),
                );
                let _ = qp.post_send(&w);
            }
            // Garbage in its doorbell memory (every region: other lcores' too).
            5 => {
                if let Some(bells) = f.doorbell_memory() {
                    let at = rng.below(bells.len() as u64) as usize & !7;
                    rng.fill(&mut junk[..64]);
                    scribble(bells, at, &junk[..64]);
                }
            }
            // Garbage in its completion ring, its consumer index included.
            6 => {
                let (cmem, place) = cq.raw_ring();
                let at = place.offset + rng.below((HEADER + 256) as u64) as usize;
                rng.fill(&mut junk[..8]);
                scribble(cmem, at, &junk[..8]);
            }
            // Reads its completions (they may be garbage: its own).
            _ => {
                let _ = cq.poll(64, &mut got);
                got.clear();
            }
        }
    }
}

/// Control messages no program should send, on a connection of their own: bytes that are not
/// messages, messages of no known verb, and verbs naming other programs' objects or carrying
/// impossible values. Each is refused (or ends that connection); roced carries on.
fn fuzz_control(rng: &mut Rng, sock: &str, victim: (u32, u32, u32), ops: usize) {
    use serde_json::json;
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use verbs::proto::{Reply, Request};
    let (qpn, lkey, pd) = victim;
    let hello = |s: &UnixStream| {
        let h = Request::Hello {
            version: verbs::proto::VERSION,
            pid: 1,
            command: "fuzz".into(),
        };
        verbs::attach::send(s, &h, &[]).unwrap();
        let (r, _) = verbs::attach::recv::<Reply>(s).unwrap();
        assert!(matches!(r, Reply::Welcome { .. }), "{r:?}");
    };
    let connect = || {
        let s = UnixStream::connect(sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    };
    let mut s = connect();
    hello(&s);
    let mut junk = [0u8; 512];
    for _ in 0..ops {
        let big = rng.pick(&[0u64, 1, 0xffff_ffff, u64::MAX, 1 << 40]);
        let msg = match rng.below(12) {
            0 => json!({"DestroyQp": {"qpn": qpn}}),
            1 => json!({"ModifyQp": {"qpn": qpn, "attr": {"state": "ERR"}}}),
            2 => json!({"DeregMr": {"lkey": lkey}}),
            3 => json!({"DeallocPd": {"pd": pd}}),
            4 => json!({"RegMr": {"pd": pd, "addr": big, "length": big, "offset": big,
                "pieces": [{"offset": big, "len": big}], "access": rng.next() as u32}}),
            5 => json!({"CreateQp": {"pd": pd, "send_cq": rng.next() as u32,
                "recv_cq": 0, "caps": {"max_send_wr": big, "max_recv_wr": 1,
                "max_send_sge": rng.next() as u32, "max_recv_sge": 1, "max_inline_data": big}}}),
            6 => json!({"CreateCq": {"cqe": big, "channel": true}}),
            7 => json!({"CreateAh": {"pd": pd, "gid": "not an address"}}),
            8 => json!({"QueryQp": {"qpn": rng.next() as u32}}),
            9 => json!({"Frobnicate": {"x": 1}}),
            10 => json!([1, "two", {"three": null}]),
            _ => {
                // Bytes that are not a message: the session ends; a new one starts.
                let n = rng.below(junk.len() as u64) as usize;
                rng.fill(&mut junk[..n]);
                let len = rng.pick(&[n as u32, u32::MAX, 0]);
                let _ = s.write_all(&len.to_le_bytes());
                let _ = s.write_all(&junk[..n]);
                s = connect();
                hello(&s);
                continue;
            }
        };
        verbs::attach::send(&s, &msg, &[]).unwrap();
        match verbs::attach::recv::<Reply>(&s) {
            // Refused, or done on an object of its own making.
            Ok((r, _)) => assert!(
                !matches!(r, Reply::Done) || !msg.to_string().contains(&qpn.to_string()),
                "{msg} was done: {r:?}"
            ),
            // A message of no known verb ends the session.
            Err(_) => {
                s = connect();
                hello(&s);
            }
        }
    }
}

#[test]
fn a_program_writing_garbage_into_its_rings_and_control_messages_hurts_only_itself() {
    let n = memif_nodes("attachfuzz", 7656);
    let pid = std::process::id();
    let sock = |node: &str| format!("/run/ferroce/ferroce-rattachfuzz-{node}-{pid}.sock");
    let attach = |node: &str| Context::attach(sock(node).as_ref()).unwrap();
    let seed = std::env::var("FERROCE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_f00d_u64);
    eprintln!("fuzz seed {seed:#x} (FERROCE_FUZZ_SEED to repeat another)");
    let mut rng = Rng(seed | 1);
    let caps = QpCapsMsg {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    };
    // The victim: a program on node A streaming to one on node B, their buffers filled with a
    // pattern that only their own operations may change.
    let (ca, cb) = (attach("a"), attach("b"));
    const LEN: usize = 128 << 10;
    let (mut ma, mut mb) = (pattern(LEN, 1), pattern(LEN, 2));
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    // SAFETY: our own buffers, which outlive the regions and no other thread touches.
    let (la, ra) = unsafe { ca.reg_mr_at(pa, ma.as_mut_ptr() as usize, LEN, 0xf) }.unwrap();
    // SAFETY: as above.
    let (lb, rb) = unsafe { cb.reg_mr_at(pb, mb.as_mut_ptr() as usize, LEN, 0xf) }.unwrap();
    let (aa, ab) = (ma.as_ptr() as u64, mb.as_ptr() as u64);
    let (mut qa_cq, qb_cq) = (ca.create_cq(64).unwrap(), cb.create_cq(64).unwrap());
    let mut qa = ca.create_qp(pa, &qa_cq, &qa_cq, caps).unwrap();
    let qb = cb.create_qp(pb, &qb_cq, &qb_cq, caps).unwrap();
    connect_app(&ca, &qa, (qb.qpn, qb.sq_psn), &n.gids[1].0, 1024);
    connect_app(&cb, &qb, (qa.qpn, qa.sq_psn), &n.gids[0].0, 1024);
    let (mut want_a, mut want_b) = (ma.clone(), mb.clone());

    // The fuzzer: another program on node A, in its own PD, its QP connected to one of node
    // B's program in another PD (so that even a guessed rkey of the victim's finds nothing).
    let cf = attach("a");
    let pf = cf.alloc_pd().unwrap();
    let mut mf = vec![0u8; 64 << 10];
    // SAFETY: as above.
    let (lf, rf) = unsafe { cf.reg_mr_at(pf, mf.as_mut_ptr() as usize, mf.len(), 0xf) }.unwrap();
    let pbf = cb.alloc_pd().unwrap();
    let keys = [la, ra, lb, rb, lf, rf, 0, 1, 0x100, u32::MAX];
    let addrs = [aa, ab, mf.as_ptr() as u64, 0, 1 << 47];
    let rounds = 12;
    for round in 0..rounds {
        // Fresh QPs and CQs for the fuzzer (the last ones are in ERR or abandoned by now),
        // each connected to a fresh QP of node B's program.
        for _ in 0..4 {
            let mut fcq = cf.create_cq(32).unwrap();
            let mut fq = cf.create_qp(pf, &fcq, &fcq, caps).unwrap();
            let bcq = cb.create_cq(32).unwrap();
            let bq = cb.create_qp(pbf, &bcq, &bcq, caps).unwrap();
            connect_app(&cf, &fq, (bq.qpn, bq.sq_psn), &n.gids[1].0, 1024);
            connect_app(&cb, &bq, (fq.qpn, fq.sq_psn), &n.gids[0].0, 1024);
            fuzz_rings(&mut rng, &cf, &mut fq, &mut fcq, &keys, &addrs, 60);
            // Time for the lcore to read what it was given before the QP goes.
            std::thread::sleep(Duration::from_millis(5));
            cf.destroy_qp(fq).unwrap();
            cb.destroy_qp(bq).unwrap();
            cf.destroy_cq(fcq).ok();
            cb.destroy_cq(bcq).ok();
        }
        fuzz_control(&mut rng, &sock("a"), (qa.qpn, la, pa), 25);
        // Meanwhile the victim's WRITE and READ land byte for byte, and nothing else of its
        // memory on either node changed.
        let (off, len) = (
            // The READ lands at LEN / 2 + off: both ranges inside the buffers.
            rng.below((LEN / 2 - (16 << 10)) as u64) as usize,
            1 + rng.below(16 << 10) as usize,
        );
        let pat = pattern(len, 100 + round);
        want_a[off..off + len].copy_from_slice(&pat);
        // SAFETY: inside our buffer; the lcores read it only when the WRITE is posted.
        unsafe { core::ptr::copy_nonoverlapping(pat.as_ptr(), ma.as_mut_ptr().add(off), len) };
        let w = wqe(
            1,
            WrOpcode::Write,
            la,
            aa + off as u64,
            len as u32,
            ab + off as u64,
            rb,
        );
        assert!(qa.post_send(&w).unwrap());
        let c = wait_one(&mut qa_cq);
        assert_eq!((c.wr_id, c.status), (1, 0), "round {round}: {c:?}");
        want_b[off..off + len].copy_from_slice(&pat);
        let back = LEN / 2 + off;
        let r = wqe(
            2,
            WrOpcode::Read,
            la,
            aa + back as u64,
            len as u32,
            ab + off as u64,
            rb,
        );
        assert!(qa.post_send(&r).unwrap());
        let c = wait_one(&mut qa_cq);
        assert_eq!((c.wr_id, c.status), (2, 0), "round {round}: {c:?}");
        want_a[back..back + len].copy_from_slice(&pat);
        same(
            &n,
            &read(ma.as_ptr(), LEN),
            &want_a,
            "the victim's memory on node A",
        );
        same(
            &n,
            &read(mb.as_ptr(), LEN),
            &want_b,
            "the victim's memory on node B",
        );
    }
    // roced carries on; the victim's QP is as it was and counted no error; the fuzzer's
    // errors were counted for it alone.
    let (s, _) = n.api[0].get("/v1/health");
    assert_eq!(s, 200);
    for node in n.nodes.iter().flatten() {
        let log = node.log_text();
        assert!(!log.contains("panicked"), "roced panicked:\n{log}");
    }
    let (st, _, _) = ca.query_qp(qa.qpn).unwrap();
    assert_eq!(st, "RTS");
    let (_, apps) = n.api[0].get("/v1/apps");
    let of = |qpn: u32| {
        apps.as_array()
            .and_then(|l| {
                l.iter()
                    .find(|a| a["qps"].as_array().is_some_and(|q| q.contains(&qpn.into())))
            })
            .unwrap_or_else(|| panic!("no program has QP {qpn}: {apps}"))
    };
    let v = &of(qa.qpn)["counters"];
    assert_eq!(
        (v["refused"].as_u64(), v["broken_rings"].as_u64()),
        (Some(0), Some(0)),
        "{v}"
    );
    let fuzzer = apps
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["mrs"].as_array().is_some_and(|m| m.contains(&lf.into())))
        .unwrap_or_else(|| panic!("the fuzzer is not listed: {apps}"));
    let e = &fuzzer["counters"];
    eprintln!("the fuzzer's counters: {e}");
    // (Not one a round: garbage in its own doorbell memory can clear the bit that would have
    // had its ring read, which hurts only it.)
    assert!(
        e["refused"].as_u64().unwrap_or(0) + e["broken_rings"].as_u64().unwrap_or(0) > 0,
        "{fuzzer}"
    );
    // When it goes, what it made goes.
    drop(cf);
    let t = Instant::now();
    loop {
        let (_, apps) = n.api[0].get("/v1/apps");
        if !apps.to_string().contains(&format!("{lf}")) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(2), "{apps}");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop((qa, qb, qa_cq, qb_cq, ca, cb));
    drop((ma, mb, mf));
    n.stop();
}

/// The mappings of process `pid`: start, end, path, and the size of their pages in KiB
/// (`/proc/PID/smaps`).
fn mappings(pid: u32) -> Vec<(usize, usize, String, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut out: Vec<(usize, usize, String, u64)> = Vec::new();
    for l in text.lines() {
        if let Some(kb) = l.strip_prefix("KernelPageSize:") {
            if let (Some(m), Some(Ok(k))) =
                (out.last_mut(), kb.split_whitespace().next().map(str::parse))
            {
                m.3 = k;
            }
            continue;
        }
        let f: Vec<&str> = l.split_whitespace().collect();
        if let Some((a, b)) = f.first().and_then(|r| r.split_once('-'))
            && let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
        {
            out.push((a, b, f.get(5..).map(|p| p.join(" ")).unwrap_or_default(), 4));
        }
    }
    out
}

/// The sum of family `family`'s series in the `/metrics` of node `api`.
fn metric(api: &common::Api, family: &str) -> u64 {
    let (status, body) = api.get_bytes("/metrics");
    assert_eq!(status, 200);
    String::from_utf8(body)
        .unwrap()
        .lines()
        .filter(|l| {
            l.strip_prefix(family)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Waits (2 s at most: counters reach the API with the control loop's refresh) until
/// `family` on `api` satisfies `ok`; its last value.
fn metric_until(api: &common::Api, family: &str, ok: impl Fn(u64) -> bool) -> u64 {
    let t = Instant::now();
    loop {
        let v = metric(api, family);
        if ok(v) || t.elapsed() > Duration::from_secs(2) {
            return v;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn application_memory_leaves_in_frames_attached_and_regions_past_dpdks_room_are_copied() {
    let n = memif_nodes("attachzc", 7662);
    const LEN: usize = 1 << 20;
    // Heap memory on both sides, registered where it lies; at MTU 4096 its full segments are
    // large enough to leave attached.
    let mut p = heap_pair(&n, "attachzc", LEN, 4096);
    for api in &n.api {
        assert_eq!(
            metric(api, "ferroce_app_zero_copy_areas"),
            1,
            "the region is registered with DPDK"
        );
        assert!(metric(api, "ferroce_app_zero_copy_bytes") >= LEN as u64);
    }
    let attached = |api: &common::Api| metric(api, "ferroce_tx_attached_pkts_total");
    let (a0, b0) = (attached(&n.api[0]), attached(&n.api[1]));

    // WRITE of 64 KiB from A's memory into B's: 16 frames, each carrying its 4 KiB attached.
    p.write_checked(&n, 1, 0, 64 << 10, 5, "WRITE of 64 KiB");
    // SEND of 64 KiB into a receive B posted.
    let c = p.send_checked(&n, (2, 9), 128 << 10, 64 << 10, 6, None, "SEND of 64 KiB");
    assert_eq!(c.byte_len, 64 << 10, "{c:?}");
    // READ of 64 KiB: B's responses carry B's memory attached.
    p.read_checked(&n, 3, 256 << 10, 64 << 10, 7, "READ of 64 KiB");
    let a1 = metric_until(&n.api[0], "ferroce_tx_attached_pkts_total", |v| {
        v >= a0 + 32
    });
    let b1 = metric_until(&n.api[1], "ferroce_tx_attached_pkts_total", |v| {
        v >= b0 + 16
    });
    assert!(
        a1 >= a0 + 32 && b1 >= b0 + 16,
        "frames attached: A {a0} -> {a1} (WRITE and SEND, 32 full segments), \
         B {b0} -> {b1} (READ responses, 16)"
    );

    // More regions than DPDK has memseg lists (128, some taken by its own hugepages): the
    // registrations past its room are refused and counted, and those regions still work,
    // their bytes copied into frames.
    let refused0 = metric(&n.api[0], "ferroce_app_zero_copy_refused_total");
    let extra: Vec<Memory> = (0..140).map(|_| Memory::new(8 << 10).unwrap()).collect();
    let keys: Vec<u32> = extra
        .iter()
        .enumerate()
        .map(|(i, m)| {
            m.write(0, &pattern(8 << 10, 100 + i as u32)).unwrap();
            p.ca.reg_mr(p.pa, m, 0xf).unwrap().0
        })
        .collect();
    let areas = metric(&n.api[0], "ferroce_app_zero_copy_areas");
    let refused = metric(&n.api[0], "ferroce_app_zero_copy_refused_total") - refused0;
    println!("141 regions: {areas} registered with DPDK, {refused} refused (copied)");
    assert!(
        refused > 0 && areas < 141 && areas + refused == 141,
        "141 regions: {areas} registered, {refused} refused"
    );
    // From the first of them (registered) and the last (copied), every byte checked.
    for (id, i) in [(10, 0), (11, extra.len() - 1)] {
        let want = pattern(8 << 10, 100 + i as u32);
        let what = format!("WRITE from extra region {i}");
        p.write_from(&n, id, (keys[i], extra[i].addr()), 512 << 10, &want, &what);
    }
    // Huge pages (MAP_HUGETLB) registered where they lie stay huge pages, in this process
    // and in roced, and a WRITE from them lands byte for byte.
    const HUGE: usize = 2 << 20;
    // SAFETY: a fresh private hugetlb mapping of ours (scripts/setup.sh reserves the pool).
    let hp = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            HUGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB,
            -1,
            0,
        )
    };
    assert_ne!(hp, libc::MAP_FAILED, "a free huge page");
    let hp = hp as *mut u8;
    let hpat = pattern(64 << 10, 77);
    // SAFETY: inside the mapping, ours alone.
    unsafe { core::ptr::copy_nonoverlapping(hpat.as_ptr(), hp.add(4096), hpat.len()) };
    // SAFETY: our mapping, which outlives the region (deregistered below).
    let (hk, _) = unsafe { p.ca.reg_mr_at(p.pa, hp as usize + 4096, hpat.len(), 0xf) }.unwrap();
    let here = mappings(std::process::id());
    let mine = here
        .iter()
        .find(|m| m.0 <= hp as usize && (hp as usize) < m.1);
    assert_eq!(
        mine.map(|m| m.3),
        Some(2048),
        "kB pages under the region: {mine:?}"
    );
    let roced = mappings(n.nodes[0].as_ref().unwrap().child.id());
    assert!(
        roced
            .iter()
            .any(|m| m.2.contains("ferroce-mr") && m.3 == 2048),
        "roced maps the region's huge pages"
    );
    let from = (hk, hp as u64 + 4096);
    p.write_from(&n, 12, from, 640 << 10, &hpat, "WRITE from huge pages");
    p.ca.dereg_mr(hk).unwrap();
    // SAFETY: our mapping, unmapped once; its region is gone.
    unsafe { libc::munmap(hp.cast(), HUGE) };

    // Deregistered, they leave DPDK's lists; the first region stays.
    for k in keys {
        p.ca.dereg_mr(k).unwrap();
    }
    let left = metric_until(&n.api[0], "ferroce_app_zero_copy_areas", |v| v == 1);
    assert_eq!(left, 1, "deregistered regions stayed registered with DPDK");

    // When the applications go, so do their registrations.
    drop(p);
    for api in &n.api {
        let left = metric_until(api, "ferroce_app_zero_copy_areas", |v| v == 0);
        assert_eq!(left, 0, "a detached application's memory stayed registered");
        assert_eq!(metric(api, "ferroce_app_zero_copy_bytes"), 0);
    }
    n.stop();
}

/// The next asynchronous event within `wait`.
fn next_event(ctx: &Context, wait: Duration) -> Option<verbs::event::Event> {
    ctx.async_event(Some(wait)).unwrap()
}

#[test]
fn asynchronous_events_tell_an_application_of_corrupt_rings_its_port_and_roced_going() {
    use verbs::event::{Event, EventKind};
    let mut n = memif_nodes("attachev", 7664);
    let pid = std::process::id();
    let sock = format!("/run/ferroce/ferroce-rattachev-a-{pid}.sock");
    let ctx = Context::attach(sock.as_ref()).unwrap();
    let bystander = Context::attach(sock.as_ref()).unwrap();
    assert!(ctx.async_fd().is_some(), "the context has an async_fd");
    let pd = ctx.alloc_pd().unwrap();
    let mem = Memory::new(64 << 10).unwrap();
    let (lkey, _) = ctx.reg_mr(pd, &mem, 0xf).unwrap();
    let (kb, vb) = reg(&n.api[1], 1 << 20);
    let caps = CAPS16;
    // Two QPs to B, each with a CQ of its own.
    let mut qps = Vec::new();
    for _ in 0..2 {
        let cq = ctx.create_cq(16).unwrap();
        let qp = ctx.create_qp(pd, &cq, &cq, caps).unwrap();
        let qb = create_qp(&n.api[1], None);
        connect_app(&ctx, &qp, (qb, psn_of(&n.api[1], qb)), &n.gids[1].0, 1024);
        connect(&n.api[1], qb, (&n.api[0], qp.qpn), &n.gids[0].0, 1024);
        qps.push((qp, cq));
    }
    let ((mut q1, mut c1), (mut q2, c2)) = {
        let mut it = qps.into_iter();
        (it.next().unwrap(), it.next().unwrap())
    };
    let w = |id| wqe(id, WrOpcode::Write, lkey, mem.addr(), 64, vb, kb);
    assert!(q1.post_send(&w(1)).unwrap());
    assert_eq!(wait_one(&mut c1).status, 0);
    assert_eq!(
        next_event(&ctx, Duration::from_millis(300)),
        None,
        "nothing happened"
    );

    // A producer index far past its send ring: the lcore abandons the QP's queues and puts
    // it in error, which no completion can report: IBV_EVENT_QP_FATAL names it.
    let (m, sq, _) = q1.raw_rings();
    scribble(m, sq.offset, &(word_at(m, sq.offset) + 1000).to_le_bytes());
    q1.ring_doorbell();
    assert_eq!(
        next_event(&ctx, Duration::from_secs(2)),
        Some(Event {
            kind: EventKind::QpFatal,
            element: q1.qpn
        })
    );
    assert_eq!(ctx.query_qp(q1.qpn).unwrap().0, "ERR");
    // A consumer index its completion ring never gave: the ring is abandoned once the lcore
    // next reads it (when the ring looks full to it: 16 completions on), and
    // IBV_EVENT_CQ_ERR names the CQ.
    let (cm, place) = c2.raw_ring();
    let consumed = word_at(cm, place.offset + 64);
    scribble(cm, place.offset + 64, &(consumed + 1000).to_le_bytes());
    let t = Instant::now();
    for id in 0..32 {
        while !q2.post_send(&w(100 + id)).unwrap() {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the send queue stayed full"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    assert_eq!(
        next_event(&ctx, Duration::from_secs(2)),
        Some(Event {
            kind: EventKind::CqErr,
            element: c2.cq
        })
    );
    // Each told once; nothing told to another application of the same node.
    assert_eq!(next_event(&ctx, Duration::from_millis(300)), None);
    assert_eq!(next_event(&bystander, Duration::from_millis(10)), None);

    // B goes: A's link goes down, IBV_EVENT_PORT_ERR on port 1 for every application.
    let (code, _, log) = n.nodes[1].take().unwrap().terminate();
    assert_eq!(code, 0, "{log}");
    let port_err = Some(Event {
        kind: EventKind::PortErr,
        element: 1,
    });
    assert_eq!(next_event(&ctx, Duration::from_secs(10)), port_err);
    assert_eq!(next_event(&bystander, Duration::from_secs(1)), port_err);

    // A stops with the applications attached: it exits cleanly, everything back, and they
    // learn the device is lost.
    let (code, report, log) = n.nodes[0].take().unwrap().terminate();
    assert_eq!(code, 0, "{log}");
    assert_eq!(report["mbufs_in_use_at_exit"], 0, "{log}");
    for c in [&ctx, &bystander] {
        assert_eq!(
            next_event(c, Duration::from_secs(2)).map(|e| e.kind),
            Some(EventKind::DeviceFatal)
        );
    }
    drop((q1, q2, c1, c2));
}
