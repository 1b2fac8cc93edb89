//! Queue pairs: created, modified and queried over the attach socket; posted to through their
//! rings, both ways a program may post: `ibv_post_send` (a chain of `ibv_send_wr`) and the
//! extended work-request API of `ibv_qp_ex` (`ibv_wr_start`, `ibv_wr_rdma_write`,
//! `ibv_wr_set_sge`, ..., `ibv_wr_complete`), which perftest uses when the device offers it.
//! The extended API's batch is staged in the send ring and published whole at
//! `ibv_wr_complete`, or dropped at `ibv_wr_abort` or on an error, as verbs says.
//!
//! A QP is used by one thread at a time per queue in well-behaved programs, but verbs allows
//! any; a mutex per QP serialises them (uncontended, it costs two atomic operations), as
//! libibverbs providers take a spinlock per queue.

use crate::cq::cq;
use crate::device::{Ctx, ctx};
use crate::mr::pd;
use crate::sys::*;
use crate::{Fail, Res, int_call, ptr_call};
use arrayvec::ArrayVec;
use std::ffi::{c_int, c_void};
use std::net::Ipv6Addr;
use std::sync::{Mutex, MutexGuard};
use verbs::abi::{self, MAX_INLINE, MAX_SGE, RecvWqe, SendWqe, UdTarget, WrOpcode, send_flags};
use verbs::proto::{ModifyMsg, QpCapsMsg};

/// A queue pair. `ex.qp_base` is the `ibv_qp` the program holds; `ex` its `ibv_qp_ex`.
#[repr(C)]
pub(crate) struct Qp {
    ex: ibv_qp_ex,
    inner: Mutex<Inner>,
}

/// A send work request being put together (the extended API builds one call at a time).
#[derive(Clone, Debug)]
struct Building {
    wr_id: u64,
    opcode: WrOpcode,
    flags: u8,
    imm: u32,
    remote_addr: u64,
    rkey: u32,
    compare_add: u64,
    swap: u64,
    sg: ArrayVec<abi::Sge, MAX_SGE>,
    inline: ArrayVec<u8, MAX_INLINE>,
    ud: UdTarget,
}

impl Building {
    fn new(wr_id: u64, opcode: WrOpcode, flags: u8) -> Building {
        Building {
            wr_id,
            opcode,
            flags,
            imm: 0,
            remote_addr: 0,
            rkey: 0,
            compare_add: 0,
            swap: 0,
            sg: ArrayVec::new(),
            inline: ArrayVec::new(),
            ud: UdTarget::default(),
        }
    }

    fn wqe(&self) -> SendWqe<'_> {
        SendWqe {
            wr_id: self.wr_id,
            opcode: self.opcode,
            flags: self.flags,
            imm: self.imm,
            remote_addr: self.remote_addr,
            rkey: self.rkey,
            compare_add: self.compare_add,
            swap: self.swap,
            ud: self.ud,
            sg: self.sg.clone(),
            inline: &self.inline,
        }
    }

    /// Appends `len` bytes at `addr` of the program's memory to the inline payload.
    fn add_inline(&mut self, addr: u64, len: usize, max: u32) -> Res<()> {
        if self.inline.len() + len > max as usize {
            return Err(Fail::inval(format!(
                "{} inline bytes: the QP takes {max}",
                self.inline.len() + len
            )));
        }
        if len > 0 {
            // SAFETY: verbs' contract: an inline SGE names `len` readable bytes of the program.
            let src = unsafe { core::slice::from_raw_parts(addr as usize as *const u8, len) };
            self.inline
                .try_extend_from_slice(src)
                .map_err(|_| Fail::inval("inline payload too long"))?;
        }
        Ok(())
    }
}

struct Inner {
    qp: verbs::client::Qp,
    ud: bool,
    cap: ibv_qp_cap,
    sig_all: bool,
    /// The attributes applied so far (what `ibv_query_qp` shows, with roced's state and PSNs).
    attr: ibv_qp_attr,
    /// The extended API's request being built, and the first error of the batch.
    cur: Option<Building>,
    err: c_int,
}

fn qp<'a>(q: *mut ibv_qp) -> Res<&'a Qp> {
    // SAFETY: every ibv_qp handed out is the first field of a live Qp.
    unsafe { (q as *const Qp).as_ref() }.ok_or_else(|| Fail::inval("no QP"))
}

impl Qp {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ctx(&self) -> Res<&Ctx> {
        ctx(self.ex.qp_base.context)
    }

    fn num(&self) -> u32 {
        self.ex.qp_base.qp_num
    }
}

pub(crate) fn fill_ops(v: &mut verbs_context) {
    v.context.ops.post_send = Some(post_send);
    v.context.ops.post_recv = Some(post_recv);
    v.create_qp_ex = Some(create_qp_ex);
}

/// The extended operations offered (`IBV_QP_EX_WITH_*`).
const SEND_OPS: u64 = (ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE
    | ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND
    | ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND_WITH_IMM
    | ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_READ
    | ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND_WITH_INV) as u64;

#[allow(clippy::too_many_arguments)]
fn create(
    p: *mut ibv_pd,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    cap: &mut ibv_qp_cap,
    qp_type: ibv_qp_type::Type,
    sq_sig_all: c_int,
    qp_context: *mut c_void,
) -> Res<*mut ibv_qp> {
    let (_, x) = pd(p)?;
    // SAFETY: `p` was checked by `pd`.
    let pdn = unsafe { (*p).handle };
    let ud = match qp_type {
        ibv_qp_type::IBV_QPT_RC => false,
        ibv_qp_type::IBV_QPT_UD => true,
        t => return Err(Fail::unsupported(&format!("QP type {t} (RC and UD are)"))),
    };
    if !srq.is_null() {
        return Err(Fail::unsupported("a shared receive queue"));
    }
    if cap.max_send_sge as usize > MAX_SGE || cap.max_recv_sge as usize > MAX_SGE {
        return Err(Fail::inval(format!(
            "{} send / {} receive SGEs: at most {MAX_SGE}",
            cap.max_send_sge, cap.max_recv_sge
        )));
    }
    if cap.max_inline_data as usize > MAX_INLINE {
        return Err(Fail::inval(format!(
            "{} inline bytes: at most {MAX_INLINE}",
            cap.max_inline_data
        )));
    }
    let (s, r) = (cq(send_cq)?, cq(recv_cq)?);
    let caps = QpCapsMsg {
        max_send_wr: cap.max_send_wr.max(1),
        max_recv_wr: cap.max_recv_wr.max(1),
        max_send_sge: cap.max_send_sge.max(1),
        max_recv_sge: cap.max_recv_sge.max(1),
        max_inline_data: cap.max_inline_data,
    };
    let q = x.with(|c| c.create_qp_in(pdn, s.id(), r.id(), caps, ud))?;
    let (sd, rd) = q.depths();
    cap.max_send_wr = sd;
    cap.max_recv_wr = rd;
    cap.max_send_sge = caps.max_send_sge;
    cap.max_recv_sge = caps.max_recv_sge;
    // SAFETY: ibv_qp_ex and ibv_qp_attr are C data; all zeroes is valid.
    let mut ex: ibv_qp_ex = unsafe { core::mem::zeroed() };
    let b = &mut ex.qp_base;
    b.context = x.ibv();
    b.qp_context = qp_context;
    b.pd = p;
    b.send_cq = send_cq;
    b.recv_cq = recv_cq;
    b.handle = q.qpn;
    b.qp_num = q.qpn;
    b.state = ibv_qp_state::IBV_QPS_RESET;
    b.qp_type = qp_type;
    fill_wr_ops(&mut ex);
    // SAFETY: as above.
    let mut attr: ibv_qp_attr = unsafe { core::mem::zeroed() };
    attr.sq_psn = q.sq_psn;
    attr.cap = *cap;
    attr.port_num = 1;
    let boxed = Box::leak(Box::new(Qp {
        ex,
        inner: Mutex::new(Inner {
            qp: q,
            ud,
            cap: *cap,
            sig_all: sq_sig_all != 0,
            attr,
            cur: None,
            err: 0,
        }),
    }));
    let q = &mut boxed.ex.qp_base as *mut ibv_qp;
    x.objects().qps.insert(boxed.ex.qp_base.qp_num, q as usize);
    Ok(q)
}

/// `ibv_create_qp`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_create_qp(p: *mut ibv_pd, a: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    ptr_call("ibv_create_qp", || {
        // SAFETY: the caller's attributes.
        let a = unsafe { a.as_mut() }.ok_or_else(|| Fail::inval("no attributes"))?;
        create(
            p,
            a.send_cq,
            a.recv_cq,
            a.srq,
            &mut a.cap,
            a.qp_type,
            a.sq_sig_all,
            a.qp_context,
        )
    })
}

/// `ibv_create_qp_ex` (through the context).
unsafe extern "C" fn create_qp_ex(
    _c: *mut ibv_context,
    a: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    ptr_call("ibv_create_qp_ex", || {
        // SAFETY: the caller's attributes.
        let a = unsafe { a.as_mut() }.ok_or_else(|| Fail::inval("no attributes"))?;
        let known = ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD
            | ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        if a.comp_mask & ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD == 0 {
            return Err(Fail::inval(
                "ibv_create_qp_ex needs a PD (IBV_QP_INIT_ATTR_PD)",
            ));
        }
        if a.comp_mask & !known != 0 {
            return Err(Fail::unsupported(&format!(
                "QP creation attributes {:#x}",
                a.comp_mask & !known
            )));
        }
        if a.comp_mask & ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0
            && a.send_ops_flags & !SEND_OPS != 0
        {
            return Err(Fail::unsupported(&format!(
                "send operations {:#x}",
                a.send_ops_flags & !SEND_OPS
            )));
        }
        if a.create_flags != 0 {
            return Err(Fail::unsupported(&format!(
                "creation flags {:#x}",
                a.create_flags
            )));
        }
        create(
            a.pd,
            a.send_cq,
            a.recv_cq,
            a.srq,
            &mut a.cap,
            a.qp_type,
            a.sq_sig_all,
            a.qp_context,
        )
    })
}

/// `ibv_qp_to_qp_ex`: every QP here has the extended API.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_qp_to_qp_ex(q: *mut ibv_qp) -> *mut ibv_qp_ex {
    q.cast()
}

/// `ibv_destroy_qp`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_destroy_qp(q: *mut ibv_qp) -> c_int {
    int_call("ibv_destroy_qp", || {
        let p = qp(q)?;
        p.ctx()?.with(|c| c.destroy_qp_num(p.num()))?;
        p.ctx()?.objects().qps.remove(&p.num());
        // SAFETY: the Qp create leaked, given back once.
        drop(unsafe { Box::from_raw(q as *mut Qp) });
        Ok(())
    })
}

fn state_name(s: ibv_qp_state::Type) -> Res<&'static str> {
    use ibv_qp_state::*;
    Ok(match s {
        IBV_QPS_RESET => "RESET",
        IBV_QPS_INIT => "INIT",
        IBV_QPS_RTR => "RTR",
        IBV_QPS_RTS => "RTS",
        IBV_QPS_SQD => "SQD",
        IBV_QPS_ERR => "ERR",
        s => return Err(Fail::inval(format!("QP state {s} cannot be asked for"))),
    })
}

fn state_of(s: &str) -> ibv_qp_state::Type {
    use ibv_qp_state::*;
    match s {
        "RESET" => IBV_QPS_RESET,
        "INIT" => IBV_QPS_INIT,
        "RTR" => IBV_QPS_RTR,
        "RTS" => IBV_QPS_RTS,
        "SQD" => IBV_QPS_SQD,
        "SQE" => IBV_QPS_SQE,
        "ERR" => IBV_QPS_ERR,
        _ => IBV_QPS_UNKNOWN,
    }
}

fn mtu_bytes(m: ibv_mtu::Type) -> Res<u32> {
    match m {
        1..=5 => Ok(128 << m),
        m => Err(Fail::inval(format!("path MTU {m}"))),
    }
}

/// `ibv_modify_qp`: the attributes `mask` names, as one modify on roced.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_modify_qp(q: *mut ibv_qp, a: *mut ibv_qp_attr, mask: c_int) -> c_int {
    int_call("ibv_modify_qp", || {
        use ibv_qp_attr_mask::*;
        let p = qp(q)?;
        let x = p.ctx()?;
        // SAFETY: the caller's attributes.
        let a = unsafe { a.as_ref() }.ok_or_else(|| Fail::inval("no attributes"))?;
        let mask = mask as u32;
        let unsupported = IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE | IBV_QP_CAP | IBV_QP_RATE_LIMIT;
        if mask & unsupported != 0 {
            return Err(Fail::unsupported(&format!(
                "modifying QP attributes {:#x} (alternate path, migration, capacities, rate limit)",
                mask & unsupported
            )));
        }
        let has = |b: u32| mask & b != 0;
        if has(IBV_QP_PORT) && a.port_num != 1 {
            return Err(Fail::inval(format!(
                "port {}: the device has port 1",
                a.port_num
            )));
        }
        if has(IBV_QP_PKEY_INDEX) && a.pkey_index != 0 {
            return Err(Fail::inval(format!(
                "P_Key index {}: the table has 0",
                a.pkey_index
            )));
        }
        let mut g = p.lock();
        let state = if has(IBV_QP_STATE) {
            a.qp_state
        } else {
            g.attr.qp_state
        };
        let mut m = ModifyMsg {
            state: state_name(state)?.into(),
            ..ModifyMsg::default()
        };
        if has(IBV_QP_ACCESS_FLAGS) {
            m.access = Some(a.qp_access_flags & 0xe);
        }
        if has(IBV_QP_AV) {
            let ah = &a.ah_attr;
            if ah.is_global == 0 {
                return Err(Fail::inval(
                    "RoCE needs a GRH: the address vector must be global (is_global, a GID)",
                ));
            }
            if ah.grh.sgid_index as usize >= x.gids.len() {
                return Err(Fail::inval(format!(
                    "source GID index {}: the table has {}",
                    ah.grh.sgid_index,
                    x.gids.len()
                )));
            }
            // SAFETY: 16 bytes either way.
            let raw = unsafe { ah.grh.dgid.raw };
            m.remote_gid = Some(Ipv6Addr::from(raw).to_string());
            m.dscp = Some(ah.grh.traffic_class >> 2);
        }
        if has(IBV_QP_PATH_MTU) {
            m.mtu = Some(mtu_bytes(a.path_mtu)?);
        }
        let opt = |b: u32, v: u32| has(b).then_some(v);
        let opt8 = |b: u32, v: u8| has(b).then_some(v);
        m.dest_qp = opt(IBV_QP_DEST_QPN, a.dest_qp_num);
        m.rq_psn = opt(IBV_QP_RQ_PSN, a.rq_psn);
        m.sq_psn = opt(IBV_QP_SQ_PSN, a.sq_psn);
        m.timeout = opt8(IBV_QP_TIMEOUT, a.timeout);
        m.retry_cnt = opt8(IBV_QP_RETRY_CNT, a.retry_cnt);
        m.rnr_retry = opt8(IBV_QP_RNR_RETRY, a.rnr_retry);
        m.min_rnr_timer = opt8(IBV_QP_MIN_RNR_TIMER, a.min_rnr_timer);
        m.max_rd_atomic = opt8(IBV_QP_MAX_QP_RD_ATOMIC, a.max_rd_atomic);
        m.max_dest_rd_atomic = opt8(IBV_QP_MAX_DEST_RD_ATOMIC, a.max_dest_rd_atomic);
        m.qkey = opt(IBV_QP_QKEY, a.qkey);
        let num = p.num();
        x.with(|c| c.modify_qp_num(num, m))?;
        // Applied: remember what a query shows.
        let c = &mut g.attr;
        c.qp_state = state;
        macro_rules! keep {
            ($($bit:ident => $field:ident),* $(,)?) => {
                $(if has($bit) { c.$field = a.$field; })*
            };
        }
        keep!(
            IBV_QP_ACCESS_FLAGS => qp_access_flags,
            IBV_QP_AV => ah_attr,
            IBV_QP_PATH_MTU => path_mtu,
            IBV_QP_DEST_QPN => dest_qp_num,
            IBV_QP_QKEY => qkey,
            IBV_QP_TIMEOUT => timeout,
            IBV_QP_RETRY_CNT => retry_cnt,
            IBV_QP_RNR_RETRY => rnr_retry,
            IBV_QP_MIN_RNR_TIMER => min_rnr_timer,
            IBV_QP_MAX_QP_RD_ATOMIC => max_rd_atomic,
            IBV_QP_MAX_DEST_RD_ATOMIC => max_dest_rd_atomic,
        );
        drop(g);
        // SAFETY: the program's QP, whose state field libibverbs keeps current after a modify.
        unsafe { (*q).state = state };
        Ok(())
    })
}

/// `ibv_query_qp`: what was applied, with roced's state and PSNs.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_query_qp(
    q: *mut ibv_qp,
    a: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    int_call("ibv_query_qp", || {
        let p = qp(q)?;
        let (state, sq_psn, rq_psn) = p.ctx()?.with(|c| c.query_qp(p.num()))?;
        let g = p.lock();
        let mut v = g.attr;
        v.qp_state = state_of(&state);
        v.cur_qp_state = v.qp_state;
        v.sq_psn = sq_psn;
        v.rq_psn = rq_psn;
        v.cap = g.cap;
        // SAFETY: the caller's structures.
        if let Some(a) = unsafe { a.as_mut() } {
            *a = v;
        }
        // SAFETY: as above.
        if let Some(i) = unsafe { init.as_mut() } {
            let b = &p.ex.qp_base;
            i.qp_context = b.qp_context;
            i.send_cq = b.send_cq;
            i.recv_cq = b.recv_cq;
            i.srq = b.srq;
            i.cap = g.cap;
            i.qp_type = b.qp_type;
            i.sq_sig_all = g.sig_all.into();
        }
        Ok(())
    })
}

fn opcode_of(op: ibv_wr_opcode::Type) -> Res<WrOpcode> {
    use ibv_wr_opcode::*;
    Ok(match op {
        IBV_WR_RDMA_WRITE => WrOpcode::Write,
        IBV_WR_RDMA_WRITE_WITH_IMM => WrOpcode::WriteWithImm,
        IBV_WR_SEND => WrOpcode::Send,
        IBV_WR_SEND_WITH_IMM => WrOpcode::SendWithImm,
        IBV_WR_RDMA_READ => WrOpcode::Read,
        IBV_WR_ATOMIC_CMP_AND_SWP => WrOpcode::CmpSwap,
        IBV_WR_ATOMIC_FETCH_AND_ADD => WrOpcode::FetchAdd,
        IBV_WR_SEND_WITH_INV => WrOpcode::SendWithInv,
        op => return Err(Fail::unsupported(&format!("work request opcode {op}"))),
    })
}

fn flags_of(f: u32, sig_all: bool) -> Res<u8> {
    let known = send_flags::ALL as u32;
    if f & !known != 0 {
        return Err(Fail::unsupported(&format!("send flags {:#x}", f & !known)));
    }
    Ok(f as u8 | if sig_all { send_flags::SIGNALED } else { 0 })
}

/// One `ibv_send_wr` as a work request being built.
fn building_of(w: &ibv_send_wr, g: &Inner) -> Res<Building> {
    let mut b = Building::new(
        w.wr_id,
        opcode_of(w.opcode)?,
        flags_of(w.send_flags, g.sig_all)?,
    );
    // SAFETY: the unions are read as the opcode says they were written.
    unsafe {
        match b.opcode {
            WrOpcode::WriteWithImm | WrOpcode::SendWithImm => {
                b.imm = u32::from_be(w.__bindgen_anon_1.imm_data)
            }
            WrOpcode::SendWithInv => b.imm = w.__bindgen_anon_1.invalidate_rkey,
            _ => {}
        }
        match b.opcode {
            WrOpcode::Write | WrOpcode::WriteWithImm | WrOpcode::Read => {
                b.remote_addr = w.wr.rdma.remote_addr;
                b.rkey = w.wr.rdma.rkey;
            }
            WrOpcode::CmpSwap | WrOpcode::FetchAdd => {
                b.remote_addr = w.wr.atomic.remote_addr;
                b.rkey = w.wr.atomic.rkey;
                b.compare_add = w.wr.atomic.compare_add;
                b.swap = w.wr.atomic.swap;
            }
            _ => {}
        }
        if g.ud {
            let u = w.wr.ud;
            b.ud = UdTarget {
                remote_qpn: u.remote_qpn,
                qkey: u.remote_qkey,
                ah: ah(u.ah)?.ah.handle,
            };
        }
    }
    let sges = sge_list(w.sg_list, w.num_sge.max(0) as usize, g.cap.max_send_sge)?;
    if b.flags & send_flags::INLINE != 0 {
        for s in sges {
            b.add_inline(s.addr, s.length as usize, g.cap.max_inline_data)?;
        }
    } else {
        b.sg.extend(sges.iter().map(abi_sge));
    }
    Ok(b)
}

/// Posts each request of a chain in order (`one`); at the first that cannot go, `bad` points
/// at it and its errno is returned.
fn post_chain<W>(
    verb: &str,
    mut w: *mut W,
    bad: *mut *mut W,
    next: impl Fn(&W) -> *mut W,
    mut one: impl FnMut(&W) -> Res<()>,
) -> c_int {
    while !w.is_null() {
        // SAFETY: the caller's chain.
        let wr = unsafe { &*w };
        if let Err(e) = one(wr) {
            if e.errno != libc::ENOMEM {
                eprintln!("ferroce: {verb}: {}", e.msg);
            }
            if !bad.is_null() {
                // SAFETY: the caller's pointer.
                unsafe { *bad = w };
            }
            return e.errno;
        }
        w = next(wr);
    }
    0
}

/// A push into a ring: full is ENOMEM, as verbs says.
fn pushed(r: Result<bool, verbs::client::ClientError>, queue: &str) -> Res<()> {
    match r {
        Ok(true) => Ok(()),
        Ok(false) => Err(Fail::new(
            libc::ENOMEM,
            format!("the {queue} queue is full"),
        )),
        Err(e) => Err(e.into()),
    }
}

/// `ibv_post_send` (through the context).
unsafe extern "C" fn post_send(
    q: *mut ibv_qp,
    w: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    let Ok(p) = qp(q) else { return libc::EINVAL };
    let mut g = p.lock();
    post_chain(
        "ibv_post_send",
        w,
        bad,
        |wr| wr.next,
        |wr| {
            let b = building_of(wr, &g)?;
            pushed(g.qp.post_send(&b.wqe()), "send")
        },
    )
}

/// `ibv_post_recv` (through the context).
unsafe extern "C" fn post_recv(
    q: *mut ibv_qp,
    w: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    let Ok(p) = qp(q) else { return libc::EINVAL };
    let mut g = p.lock();
    post_chain(
        "ibv_post_recv",
        w,
        bad,
        |wr| wr.next,
        |wr| {
            let sges = sge_list(wr.sg_list, wr.num_sge.max(0) as usize, g.cap.max_recv_sge)?;
            let r = RecvWqe {
                wr_id: wr.wr_id,
                sg: sges.iter().map(abi_sge).collect(),
            };
            pushed(g.qp.post_recv(&r), "receive")
        },
    )
}

/// The program's list of `n` SGEs, refused past the QP's `max`.
fn sge_list<'a>(list: *const ibv_sge, n: usize, max: u32) -> Res<&'a [ibv_sge]> {
    if n > max as usize || (n > 0 && list.is_null()) {
        return Err(Fail::inval(format!("{n} SGEs: the QP takes {max}")));
    }
    if n == 0 {
        return Ok(&[]);
    }
    // SAFETY: verbs' contract: the list holds num_sge entries.
    Ok(unsafe { core::slice::from_raw_parts(list, n) })
}

fn abi_sge(s: &ibv_sge) -> abi::Sge {
    abi::Sge {
        addr: s.addr,
        length: s.length,
        lkey: s.lkey,
    }
}

// The extended work-request API. Each `ibv_wr_<op>` call starts a request (its wr_id and flags
// are what the program left in `ibv_qp_ex` before the call) after staging the one before it;
// the setters fill the current one; `ibv_wr_complete` stages the last and publishes the batch.

fn ex_qp<'a>(q: *mut ibv_qp_ex) -> Option<&'a Qp> {
    // SAFETY: every ibv_qp_ex handed out is the first field of a live Qp.
    unsafe { (q as *const Qp).as_ref() }
}

fn fail(g: &mut Inner, e: Fail) {
    if g.err == 0 {
        if e.errno != libc::ENOMEM {
            eprintln!("ferroce: ibv_wr_*: {}", e.msg);
        }
        g.err = e.errno;
    }
}

/// Stages the request being built, if any.
fn stage_current(g: &mut Inner) {
    if let Some(b) = g.cur.take() {
        if g.err != 0 {
            return;
        }
        match g.qp.stage_send(&b.wqe()) {
            Ok(true) => {}
            Ok(false) => fail(g, Fail::new(libc::ENOMEM, "the send queue is full")),
            Err(e) => fail(g, e.into()),
        }
    }
}

/// Starts a request of `opcode` and lets `f` fill its operation's fields.
fn begin(q: *mut ibv_qp_ex, opcode: WrOpcode, f: impl FnOnce(&mut Building)) {
    let Some(p) = ex_qp(q) else { return };
    // SAFETY: the program's ibv_qp_ex: it wrote wr_id and wr_flags before this call.
    let (wr_id, wr_flags) = unsafe { ((*q).wr_id, (*q).wr_flags) };
    let mut g = p.lock();
    stage_current(&mut g);
    match flags_of(wr_flags, g.sig_all) {
        Ok(flags) => {
            let mut b = Building::new(wr_id, opcode, flags);
            f(&mut b);
            g.cur = Some(b);
        }
        Err(e) => fail(&mut g, e),
    }
}

/// Lets `f` change the request being built.
fn with_current(q: *mut ibv_qp_ex, f: impl FnOnce(&mut Building, &ibv_qp_cap) -> Res<()>) {
    let Some(p) = ex_qp(q) else { return };
    let mut g = p.lock();
    let cap = g.cap;
    let r = match g.cur.as_mut() {
        Some(b) => f(b, &cap),
        None => Err(Fail::inval("a setter without an operation before it")),
    };
    if let Err(e) = r {
        fail(&mut g, e);
    }
}

unsafe extern "C" fn wr_start(q: *mut ibv_qp_ex) {
    if let Some(p) = ex_qp(q) {
        let mut g = p.lock();
        g.qp.discard_sends();
        g.cur = None;
        g.err = 0;
    }
}

unsafe extern "C" fn wr_complete(q: *mut ibv_qp_ex) -> c_int {
    let Some(p) = ex_qp(q) else {
        return libc::EINVAL;
    };
    let mut g = p.lock();
    stage_current(&mut g);
    let err = core::mem::take(&mut g.err);
    if err == 0 {
        g.qp.publish_sends();
    } else {
        g.qp.discard_sends();
    }
    err
}

unsafe extern "C" fn wr_abort(q: *mut ibv_qp_ex) {
    if let Some(p) = ex_qp(q) {
        let mut g = p.lock();
        g.qp.discard_sends();
        g.cur = None;
        g.err = 0;
    }
}

unsafe extern "C" fn wr_rdma_write(q: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    begin(q, WrOpcode::Write, |b| {
        (b.rkey, b.remote_addr) = (rkey, addr)
    });
}

unsafe extern "C" fn wr_rdma_write_imm(q: *mut ibv_qp_ex, rkey: u32, addr: u64, imm: u32) {
    begin(q, WrOpcode::WriteWithImm, |b| {
        (b.rkey, b.remote_addr, b.imm) = (rkey, addr, u32::from_be(imm))
    });
}

unsafe extern "C" fn wr_rdma_read(q: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    begin(q, WrOpcode::Read, |b| {
        (b.rkey, b.remote_addr) = (rkey, addr)
    });
}

unsafe extern "C" fn wr_send(q: *mut ibv_qp_ex) {
    begin(q, WrOpcode::Send, |_| {});
}

unsafe extern "C" fn wr_send_imm(q: *mut ibv_qp_ex, imm: u32) {
    begin(q, WrOpcode::SendWithImm, |b| b.imm = u32::from_be(imm));
}

unsafe extern "C" fn wr_send_inv(q: *mut ibv_qp_ex, rkey: u32) {
    begin(q, WrOpcode::SendWithInv, |b| b.imm = rkey);
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    q: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    compare: u64,
    swap: u64,
) {
    begin(q, WrOpcode::CmpSwap, |b| {
        (b.rkey, b.remote_addr, b.compare_add, b.swap) = (rkey, addr, compare, swap)
    });
}

unsafe extern "C" fn wr_atomic_fetch_add(q: *mut ibv_qp_ex, rkey: u32, addr: u64, add: u64) {
    begin(q, WrOpcode::FetchAdd, |b| {
        (b.rkey, b.remote_addr, b.compare_add) = (rkey, addr, add)
    });
}

unsafe extern "C" fn wr_set_sge(q: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    with_current(q, |b, _| {
        b.sg.clear();
        b.sg.push(abi::Sge { addr, length, lkey });
        Ok(())
    });
}

unsafe extern "C" fn wr_set_sge_list(q: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    with_current(q, |b, cap| {
        let sges = sge_list(list, n, cap.max_send_sge)?;
        b.sg.clear();
        b.sg.extend(sges.iter().map(abi_sge));
        Ok(())
    });
}

unsafe extern "C" fn wr_set_inline_data(q: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    with_current(q, |b, cap| {
        b.inline.clear();
        b.flags |= send_flags::INLINE;
        b.add_inline(addr as u64, length, cap.max_inline_data)
    });
}

unsafe extern "C" fn wr_set_inline_data_list(
    q: *mut ibv_qp_ex,
    n: usize,
    list: *const ibv_data_buf,
) {
    with_current(q, |b, cap| {
        b.inline.clear();
        b.flags |= send_flags::INLINE;
        if n > 0 && list.is_null() {
            return Err(Fail::inval("no inline buffers"));
        }
        for i in 0..n {
            // SAFETY: the caller's list of n entries.
            let d = unsafe { &*list.add(i) };
            b.add_inline(d.addr as u64, d.length, cap.max_inline_data)?;
        }
        Ok(())
    });
}

unsafe extern "C" fn wr_set_ud_addr(q: *mut ibv_qp_ex, a: *mut ibv_ah, qpn: u32, qkey: u32) {
    with_current(q, |b, _| {
        b.ud = UdTarget {
            remote_qpn: qpn,
            qkey,
            ah: ah(a)?.ah.handle,
        };
        Ok(())
    });
}

fn fill_wr_ops(ex: &mut ibv_qp_ex) {
    ex.wr_start = Some(wr_start);
    ex.wr_complete = Some(wr_complete);
    ex.wr_abort = Some(wr_abort);
    ex.wr_rdma_write = Some(wr_rdma_write);
    ex.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    ex.wr_rdma_read = Some(wr_rdma_read);
    ex.wr_send = Some(wr_send);
    ex.wr_send_imm = Some(wr_send_imm);
    ex.wr_send_inv = Some(wr_send_inv);
    ex.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    ex.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    ex.wr_set_sge = Some(wr_set_sge);
    ex.wr_set_sge_list = Some(wr_set_sge_list);
    ex.wr_set_inline_data = Some(wr_set_inline_data);
    ex.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    ex.wr_set_ud_addr = Some(wr_set_ud_addr);
}

// What the programs import and ferroce does not offer yet: a clear error, never a crash.

/// `ibv_create_srq`: not offered.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_create_srq(_p: *mut ibv_pd, _a: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    ptr_call("ibv_create_srq", || {
        Err(Fail::unsupported("a shared receive queue"))
    })
}

/// `ibv_destroy_srq`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_destroy_srq(_s: *mut ibv_srq) -> c_int {
    int_call("ibv_destroy_srq", || {
        Err(Fail::unsupported("a shared receive queue"))
    })
}

/// An address handle.
#[repr(C)]
struct Ah {
    ah: ibv_ah,
}

fn ah<'a>(a: *mut ibv_ah) -> Res<&'a Ah> {
    // SAFETY: every ibv_ah handed out begins a live Ah.
    unsafe { (a as *const Ah).as_ref() }.ok_or_else(|| Fail::inval("no address handle"))
}

/// `ibv_create_ah`: toward the GID of a global address vector (RoCE has no other).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_create_ah(p: *mut ibv_pd, a: *mut ibv_ah_attr) -> *mut ibv_ah {
    ptr_call("ibv_create_ah", || {
        pd(p)?;
        // SAFETY: the caller's attributes.
        let a = unsafe { a.as_ref() }.ok_or_else(|| Fail::inval("no attributes"))?;
        if a.is_global == 0 {
            return Err(Fail::inval(
                "RoCE needs a GRH: the address vector must be global (is_global, a GID)",
            ));
        }
        if a.port_num != 1 {
            return Err(Fail::inval(format!(
                "port {}: the device has port 1",
                a.port_num
            )));
        }
        // SAFETY: 16 bytes either way.
        let gid = Ipv6Addr::from(unsafe { a.grh.dgid.raw }).to_string();
        new_ah(p, &gid)
    })
}

/// An address handle in PD `p` toward `gid`, made by roced and handed out.
fn new_ah(p: *mut ibv_pd, gid: &str) -> Res<*mut ibv_ah> {
    let (_, x) = pd(p)?;
    // SAFETY: `p` was checked by `pd`.
    let pdn = unsafe { (*p).handle };
    let n = x.with(|c| c.create_ah(pdn, gid))?;
    let b = Box::leak(Box::new(Ah {
        ah: ibv_ah {
            context: x.ibv(),
            pd: p,
            handle: n,
        },
    }));
    Ok(&mut b.ah as *mut ibv_ah)
}

/// The sender's GID in the 40-byte GRH area a UD receive starts with, as RoCEv2 fills it
/// (and rxe): an IPv4 datagram's header in its last 20 bytes (source at 32..36), an IPv6
/// one's 40 bytes whole (source at 8..24).
fn sender_gid(grh: &[u8; 40]) -> Option<String> {
    if grh[20] >> 4 == 4 && grh[..20].iter().all(|&b| b == 0) {
        let a = std::net::Ipv4Addr::new(grh[32], grh[33], grh[34], grh[35]);
        return Some(a.to_ipv6_mapped().to_string());
    }
    if grh[0] >> 4 == 6 {
        let src: [u8; 16] = grh[8..24].try_into().expect("16 bytes");
        return Some(Ipv6Addr::from(src).to_string());
    }
    None
}

/// `ibv_create_ah_from_wc`: an address handle back to the sender of the UD receive `wc`, whose
/// buffer starts with the GRH area `grh` (`IBV_WC_GRH`).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_create_ah_from_wc(
    p: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port: u8,
) -> *mut ibv_ah {
    ptr_call("ibv_create_ah_from_wc", || {
        pd(p)?;
        // SAFETY: the caller's completion.
        let wc = unsafe { wc.as_ref() }.ok_or_else(|| Fail::inval("no work completion"))?;
        if wc.wc_flags & ibv_wc_flags::IBV_WC_GRH == 0 || grh.is_null() {
            return Err(Fail::inval(
                "RoCE needs the sender's GRH: the completion has no IBV_WC_GRH, or grh is NULL",
            ));
        }
        if port != 1 {
            return Err(Fail::inval(format!("port {port}: the device has port 1")));
        }
        // SAFETY: the caller's: the receive buffer's first 40 bytes, its GRH area.
        let area = unsafe { &*grh.cast::<[u8; 40]>() };
        let gid = sender_gid(area)
            .ok_or_else(|| Fail::inval("the GRH area holds no IPv4 or IPv6 header"))?;
        new_ah(p, &gid)
    })
}

/// `ibv_destroy_ah`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_destroy_ah(a: *mut ibv_ah) -> c_int {
    int_call("ibv_destroy_ah", || {
        let h = ah(a)?;
        ctx(h.ah.context)?.with(|c| c.destroy_ah(h.ah.handle))?;
        // SAFETY: the Ah ibv_create_ah leaked, given back once.
        drop(unsafe { Box::from_raw(a as *mut Ah) });
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::sender_gid;

    #[test]
    fn the_sender_gid_comes_from_the_grh_area_as_rocev2_fills_it() {
        // IPv4: zeros, then the datagram's 20-byte header (source 10.77.0.2).
        let mut v4 = [0u8; 40];
        v4[20] = 0x45;
        v4[32..36].copy_from_slice(&[10, 77, 0, 2]);
        assert_eq!(sender_gid(&v4).as_deref(), Some("::ffff:10.77.0.2"));
        // IPv6: the 40-byte header whole (source fd77::2).
        let mut v6 = [0u8; 40];
        v6[0] = 0x60;
        v6[8] = 0xfd;
        v6[9] = 0x77;
        v6[23] = 2;
        assert_eq!(sender_gid(&v6).as_deref(), Some("fd77::2"));
        // Neither: refused, not guessed.
        assert_eq!(sender_gid(&[0u8; 40]), None);
        let mut junk = v4;
        junk[3] = 1;
        assert_eq!(
            sender_gid(&junk),
            None,
            "an IPv4 header after bytes that are not zero"
        );
    }
}
