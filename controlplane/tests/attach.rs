//! An application attached to roced through its socket uses it as its RDMA device (issue 21):
//! its own memory registered in place, a CQ and an RC QP whose rings it writes and reads,
//! connected to a QP that node B's REST API made; a WRITE from its memory and a READ into it,
//! every byte checked; another application cannot touch its QP; and when it goes, its QP,
//! CQ, region and PD go too.

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
