//! An application attached to roced through its socket uses it as its RDMA device (issue 21):
//! its own memory registered in place, a CQ and an RC QP whose rings it writes and reads,
//! connected to a QP that node B's REST API made; a WRITE from its memory and a READ into it,
//! every byte checked; another application cannot touch its QP; and when it goes, its QP,
//! CQ, region and PD go too. Two applications, one on each node, move known patterns with
//! WRITE, READ, SEND with immediate data and both atomics over a link losing 1 % each way.

mod common;
use common::rdma::*;
use std::time::{Duration, Instant};
use verbs::abi::{self, Cqe, SendWqe, UdTarget, WrOpcode, send_flags};
use verbs::client::{ClientError, Context, Cq, Memory};
use verbs::proto::{ModifyMsg, QpCapsMsg};

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
fn connect_app(ctx: &Context, qp: &verbs::client::Qp, remote: (u32, u32), gid: &str) {
    let steps = [
        ModifyMsg {
            state: "INIT".into(),
            access: Some(0xe),
            ..ModifyMsg::default()
        },
        ModifyMsg {
            state: "RTR".into(),
            mtu: Some(1024),
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
    let pid = std::process::id();
    let attach = |node: &str| {
        let sock = format!("/run/ferroce/ferroce-rattachloss-{node}-{pid}.sock");
        Context::attach(sock.as_ref()).unwrap()
    };
    let (ca, cb) = (attach("a"), attach("b"));
    const LEN: usize = 512 << 10;
    // Ordinary heap memory on both sides, registered where it lies.
    let mut ma = vec![0u8; LEN];
    let mut mb = vec![0u8; LEN];
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    // SAFETY: our own buffers, which outlive the regions and no other thread touches.
    let (la, _ra) = unsafe { ca.reg_mr_at(pa, ma.as_mut_ptr() as usize, LEN, 0xf) }.unwrap();
    // SAFETY: as above.
    let (lb, rb) = unsafe { cb.reg_mr_at(pb, mb.as_mut_ptr() as usize, LEN, 0xf) }.unwrap();
    let (aa, ab) = (ma.as_ptr() as u64, mb.as_ptr() as u64);
    let (mut qa_cq, mut qb_cq) = (ca.create_cq(64).unwrap(), cb.create_cq(64).unwrap());
    let caps = QpCapsMsg {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut qa = ca.create_qp(pa, &qa_cq, &qa_cq, caps).unwrap();
    let mut qb = cb.create_qp(pb, &qb_cq, &qb_cq, caps).unwrap();
    connect_app(&ca, &qa, (qb.qpn, qb.sq_psn), &n.gids[1].0);
    connect_app(&cb, &qb, (qa.qpn, qa.sq_psn), &n.gids[0].0);
    let ok = |c: Cqe, id: u64, what: &str| {
        assert_eq!((c.wr_id, c.status), (id, 0), "{what}: {c:?}");
    };
    // The bytes are read through volatile loads: the lcores wrote them behind Rust's back.
    let read = |p: *const u8, len: usize| -> Vec<u8> {
        // SAFETY: inside the registered buffer.
        (0..len)
            .map(|i| unsafe { p.add(i).read_volatile() })
            .collect()
    };

    // WRITE: 256 KiB of a pattern from A into B (256 packets at MTU 1024).
    let pat = pattern(256 << 10, 3);
    ma[..pat.len()].copy_from_slice(&pat);
    let w = wqe(1, WrOpcode::Write, la, aa, pat.len() as u32, ab, rb);
    assert!(qa.post_send(&w).unwrap());
    ok(wait_one(&mut qa_cq), 1, "WRITE");
    same(
        &n,
        &read(mb.as_ptr(), pat.len()),
        &pat,
        "WRITE over 1 % loss",
    );

    // READ: 128 KiB of another pattern from B back into A.
    let pat2 = pattern(128 << 10, 11);
    mb[300 << 10..(300 << 10) + pat2.len()].copy_from_slice(&pat2);
    let r = wqe(
        2,
        WrOpcode::Read,
        la,
        aa + (300 << 10),
        pat2.len() as u32,
        ab + (300 << 10),
        rb,
    );
    assert!(qa.post_send(&r).unwrap());
    ok(wait_one(&mut qa_cq), 2, "READ");
    same(
        &n,
        &read(ma.as_ptr().wrapping_add(300 << 10), pat2.len()),
        &pat2,
        "READ over 1 % loss",
    );

    // SEND with immediate data: 64 KiB into a receive B posted.
    let pat3 = pattern(64 << 10, 17);
    ma[448 << 10..(448 << 10) + pat3.len()].copy_from_slice(&pat3);
    let recv = abi::RecvWqe {
        wr_id: 7,
        sg: [abi::Sge {
            addr: ab + (448 << 10),
            length: 64 << 10,
            lkey: lb,
        }]
        .into_iter()
        .collect(),
    };
    assert!(qb.post_recv(&recv).unwrap());
    let mut s = wqe(
        3,
        WrOpcode::SendWithImm,
        la,
        aa + (448 << 10),
        pat3.len() as u32,
        0,
        0,
    );
    s.imm = 0xfeed_beef;
    assert!(qa.post_send(&s).unwrap());
    ok(wait_one(&mut qa_cq), 3, "SEND");
    let c = wait_one(&mut qb_cq);
    ok(c, 7, "receive");
    assert_eq!(
        (c.byte_len, c.imm, c.flags & 2),
        (64 << 10, 0xfeed_beef, 2),
        "{c:?}"
    );
    same(
        &n,
        &read(mb.as_ptr().wrapping_add(448 << 10), pat3.len()),
        &pat3,
        "SEND over 1 % loss",
    );

    // Atomics on a word of B, results into A: fetch-and-add, then a compare-and-swap that
    // matches and one that does not.
    let word = ab + (510 << 10);
    mb[510 << 10..(510 << 10) + 8].copy_from_slice(&100u64.to_le_bytes());
    let res = aa + (509 << 10);
    let u64_at = |p: *const u8| {
        let b: [u8; 8] = read(p, 8).try_into().unwrap();
        u64::from_le_bytes(b)
    };
    let mut fa = wqe(4, WrOpcode::FetchAdd, la, res, 8, word, rb);
    fa.compare_add = 23;
    assert!(qa.post_send(&fa).unwrap());
    ok(wait_one(&mut qa_cq), 4, "fetch-and-add");
    let (rp, wp) = (
        ma.as_ptr().wrapping_add(509 << 10),
        mb.as_ptr().wrapping_add(510 << 10),
    );
    assert_eq!((u64_at(rp), u64_at(wp)), (100, 123), "fetch-and-add");
    for (id, compare, old, now) in [(5, 123, 123, 7), (6, 123, 7, 7)] {
        let mut cs = wqe(id, WrOpcode::CmpSwap, la, res, 8, word, rb);
        cs.compare_add = compare;
        cs.swap = 7;
        assert!(qa.post_send(&cs).unwrap());
        ok(wait_one(&mut qa_cq), id, "compare-and-swap");
        assert_eq!(
            (u64_at(rp), u64_at(wp)),
            (old, now),
            "compare-and-swap {id}"
        );
    }
    // The loss happened: retransmissions on A's QP (requests or READ responses lost).
    let (_, q) = n.api[0].get(&format!("/v1/qps/{}", qa.qpn));
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
    drop((qa, qb, qa_cq, qb_cq, ca, cb));
    drop((ma, mb));
}
