//! A kit for driving two hosts whose ports are joined: connect an RC pair, check it end to
//! end. Used by the host tests, the memif tests and benchmarks.

use super::{HostControl, RdmaCommand, Shard, ask};
use crate::cc::{CcKind, DcqcnParams};
use crate::time::Instant;
use crossbeam_channel::Sender;
use transport::cq::WorkCompletion;
use transport::mr::Access;
use transport::qp::{Mtu, Path, QpAttr};
use transport::rc::QpCaps;
use transport::wr::{RecvWr, SendWr};

fn wait_for(ctl: &HostControl, qpn: u32, send: bool) -> Result<WorkCompletion, String> {
    let t = std::time::Instant::now();
    loop {
        let (s, r) = ask(ctl, move |h, _| h.dev.poll_cq(qpn, 1))?;
        if let Some(c) = if send { s } else { r }.into_iter().next() {
            return Ok(c);
        }
        if t.elapsed() > std::time::Duration::from_secs(20) {
            return Err(format!("no completion on QP {qpn:#x} in 20 s"));
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The virtual address [`connect_pair`] registers its regions at.
pub const PAIR_VA: u64 = 0x1000_0000;

/// What [`connect_pair`] set up.
#[derive(Clone, Copy, Debug)]
pub struct Pair {
    /// A's region key.
    pub ka: u32,
    /// B's region key.
    pub kb: u32,
    /// A's QP.
    pub qpa: u32,
    /// B's QP.
    pub qpb: u32,
}

/// Hands host 0 or 1 of a pair a command and waits for its answer: through the command
/// channels of running lcores, or by a driver that runs both workers itself.
pub trait Asker {
    /// Sends host `i` the command `make` builds around a reply channel; the reply.
    fn ask<T>(
        &mut self,
        i: usize,
        make: impl FnOnce(Sender<T>) -> RdmaCommand,
    ) -> Result<T, String>;

    /// Runs `f` on host `i`'s shard; what it answers.
    fn call<T: Send + 'static>(
        &mut self,
        i: usize,
        f: impl FnOnce(&mut Shard, Instant) -> T + Send + 'static,
    ) -> Result<T, String> {
        self.ask(i, |reply| RdmaCommand::call(reply, f))
    }
}

impl Asker for [&HostControl; 2] {
    fn ask<T>(
        &mut self,
        i: usize,
        make: impl FnOnce(Sender<T>) -> RdmaCommand,
    ) -> Result<T, String> {
        super::send_and_wait(self[i], make, super::LCORE_WAIT)
    }
}

/// Registers a 4 MiB region at [`PAIR_VA`] on each host and connects an RC QP pair at `mtu`
/// with congestion control `cc` (A's address 1, B's 2, as [`Path::sim`] gives).
pub fn connect_pair(
    a: &HostControl,
    b: &HostControl,
    mtu: Mtu,
    cc: CcKind,
) -> Result<Pair, String> {
    connect_pair_with(&mut [a, b], mtu, cc)
}

/// [`connect_pair`] through any [`Asker`] (host 0 is A, host 1 is B).
pub fn connect_pair_with(x: &mut impl Asker, mtu: Mtu, cc: CcKind) -> Result<Pair, String> {
    let all =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mut keys = [0u32; 2];
    let mut qpns = [0u32; 2];
    for i in 0..2 {
        keys[i] = x
            .call(i, move |h, _| h.dev.reg_mr(PAIR_VA, 4 << 20, all))?
            .map_err(|e| e.to_string())?;
        qpns[i] = x
            .call(i, move |h, _| {
                let p = DcqcnParams::nvidia();
                // Inline data up to 256 bytes, as perftest asks of a device by default.
                let caps = QpCaps {
                    max_inline_data: 256,
                    ..QpCaps::default()
                };
                h.dev.create_qp(caps, None, [None; 2], cc, p)
            })?
            .map_err(|e| e.to_string())?;
    }
    for (i, me, other) in [(0, 1, 2), (1, 2, 1)] {
        let conn = QpAttr::connect(Path::sim(me, other, 0xc000), mtu, qpns[1 - i]);
        let q = qpns[i];
        x.call(i, move |h, _| h.dev.connect(q, &conn, 0))?
            .map_err(|e| e.to_string())?;
    }
    Ok(Pair {
        ka: keys[0],
        kb: keys[1],
        qpa: qpns[0],
        qpb: qpns[1],
    })
}

/// Checks two hosts whose ports are joined (A's `me` address 1, B's 2, as [`Path::sim`]
/// gives): registers a 4 MiB region on each, connects an RC QP pair at `mtu`, and moves a
/// 1 MiB WRITE, a 256 KiB READ, a SEND with immediate and a fetch-and-add, checking every
/// byte; then destroys the QPs. Err names the first thing that went wrong.
pub fn pair_check(a: &HostControl, b: &HostControl, mtu: Mtu) -> Result<(), String> {
    use transport::cq::{WcOpcode, WcStatus};
    use transport::wr::{SendOp, SgList, Sge};
    const VA: u64 = PAIR_VA;
    let Pair { ka, kb, qpa, qpb } = connect_pair(a, b, mtu, CcKind::Dcqcn)?;
    let pattern: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + i / 251) as u8).collect();
    let p = pattern.clone();
    ask(a, move |h, _| h.dev.write_mr(ka, VA, &p))?.map_err(|e| e.to_string())?;
    let sg = |key: u32, va: u64, len: u32| Sge::list(va, len, key);
    let post = |c: &HostControl, q: u32, id: u64, op: SendOp, sg: SgList| {
        ask(c, move |h, now| {
            h.dev.post_send(q, &SendWr::new(id, op, sg), None, now)
        })?
        .map_err(|e| e.to_string())
    };
    let read = |c: &HostControl, key: u32, va: u64, len: usize| {
        ask(c, move |h, _| h.dev.read_mr(key, va, len))?.map_err(|e| e.to_string())
    };
    let ok = |c: WorkCompletion, id: u64, what: &str| {
        if c.wr_id == id && c.status == WcStatus::Success {
            Ok(c)
        } else {
            Err(format!("{what}: {c:?}"))
        }
    };
    // 1 MiB WRITE from A into B.
    let write = SendOp::Write {
        remote_addr: VA + (1 << 20),
        rkey: kb,
    };
    post(a, qpa, 1, write, sg(ka, VA, 1 << 20))?;
    ok(wait_for(a, qpa, true)?, 1, "WRITE")?;
    if read(b, kb, VA + (1 << 20), 1 << 20)? != pattern {
        return Err("the WRITE's bytes differ at B".into());
    }
    // B READs 256 KiB of A's region.
    let rd = SendOp::Read {
        remote_addr: VA + 4096,
        rkey: ka,
    };
    post(b, qpb, 2, rd, sg(kb, VA + (3 << 20), 256 << 10))?;
    let c = ok(wait_for(b, qpb, true)?, 2, "READ")?;
    if c.opcode != WcOpcode::RdmaRead
        || read(b, kb, VA + (3 << 20), 256 << 10)? != pattern[4096..4096 + (256 << 10)]
    {
        return Err("the READ returned the wrong bytes".into());
    }
    // A SEND with immediate into a posted receive.
    let recv = RecvWr {
        wr_id: 3,
        sg: sg(kb, VA + (2 << 20), 5000),
    };
    ask(b, move |h, _| h.dev.post_recv(qpb, recv))?.map_err(|e| e.to_string())?;
    post(
        a,
        qpa,
        3,
        SendOp::SendWithImm(0xfeed),
        sg(ka, VA + 100, 5000),
    )?;
    let r = ok(wait_for(b, qpb, false)?, 3, "receive")?;
    if (r.byte_len, r.imm_data) != (5000, Some(0xfeed))
        || read(b, kb, VA + (2 << 20), 5000)? != pattern[100..5100]
    {
        return Err(format!("the SEND arrived wrong: {r:?}"));
    }
    ok(wait_for(a, qpa, true)?, 3, "SEND")?;
    // Fetch-and-add 5 on the first word A wrote into B.
    let fa = SendOp::FetchAdd {
        remote_addr: VA + (1 << 20),
        rkey: kb,
        add: 5,
    };
    post(a, qpa, 4, fa, sg(ka, VA + (2 << 20), 8))?;
    ok(wait_for(a, qpa, true)?, 4, "FetchAdd")?;
    let first = u64::from_le_bytes(pattern[..8].try_into().expect("8 bytes"));
    let orig = read(a, ka, VA + (2 << 20), 8)?;
    let now = read(b, kb, VA + (1 << 20), 8)?;
    if orig[..] != pattern[..8] || now[..] != first.wrapping_add(5).to_le_bytes() {
        return Err("the fetch-and-add returned or left the wrong value".into());
    }
    for (c, q) in [(a, qpa), (b, qpb)] {
        if !ask(c, move |h, _| h.dev.destroy_qp(q))? {
            return Err(format!("QP {q:#x} could not be destroyed"));
        }
    }
    Ok(())
}
