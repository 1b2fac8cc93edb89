//! The verbs client library for C (`include/ferroce.h`, `libferroce.so`): the `verbs` crate's
//! [`verbs::client`] behind a C ABI, for programs written against ferroce directly. Every
//! handle is a box the program holds; every call checks its pointers and arguments and
//! answers 0 or a negative errno value (NULL for a constructor), with the reason kept for
//! `ferroce_last_error`. Nothing here panics across the boundary: a panic is caught and
//! reported as -EIO.

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int};
use verbs::abi::{self, RecvWqe, SendWqe, UdTarget, WrOpcode, send_flags};
use verbs::client::{ClientError, Context, Cq, Memory, Qp};
use verbs::proto::{ModifyMsg, QpCapsMsg};

const EINVAL: c_int = 22;
const ENOMEM: c_int = 12;
const EIO: c_int = 5;
const ENOENT: c_int = 2;

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: impl std::fmt::Display) {
    let c = CString::new(msg.to_string().replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = c);
}

/// Runs `f`, turning its error (and any panic) into a negative errno value and a message.
fn guard(f: impl FnOnce() -> Result<(), (c_int, String)>) -> c_int {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err((code, msg))) => {
            set_error(msg);
            -code
        }
        Err(_) => {
            set_error("ferroce: internal error (a panic, caught)");
            -EIO
        }
    }
}

/// [`guard`] for a constructor: the box, or NULL.
fn make<T>(f: impl FnOnce() -> Result<T, (c_int, String)>) -> *mut T {
    let mut out = None;
    let r = guard(|| {
        out = Some(f()?);
        Ok(())
    });
    match (r, out) {
        (0, Some(v)) => Box::into_raw(Box::new(v)),
        _ => std::ptr::null_mut(),
    }
}

fn client(e: ClientError) -> (c_int, String) {
    let code = match &e {
        ClientError::Refused { .. } | ClientError::Abi(_) | ClientError::OutOfRange { .. } => {
            EINVAL
        }
        _ => EIO,
    };
    (code, e.to_string())
}

fn invalid(what: &str) -> (c_int, String) {
    (EINVAL, what.to_string())
}

/// `p` as a reference, or EINVAL naming it.
///
/// # Safety
/// `p` is NULL or points to a live `T`.
unsafe fn get<'a, T>(p: *const T, what: &str) -> Result<&'a T, (c_int, String)> {
    // SAFETY: the caller's.
    unsafe { p.as_ref() }.ok_or_else(|| invalid(&format!("{what} is NULL")))
}

/// # Safety
/// As [`get`], and not aliased for the call.
unsafe fn get_mut<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T, (c_int, String)> {
    // SAFETY: the caller's.
    unsafe { p.as_mut() }.ok_or_else(|| invalid(&format!("{what} is NULL")))
}

/// The box behind a handle the program gives back, or EINVAL naming it.
///
/// # Safety
/// `p` is NULL or a handle of ours, given back once and not used after.
unsafe fn take<T>(p: *mut T, what: &str) -> Result<Box<T>, (c_int, String)> {
    if p.is_null() {
        return Err(invalid(&format!("{what} is NULL")));
    }
    // SAFETY: the caller's: ours, given back once.
    Ok(unsafe { Box::from_raw(p) })
}

/// An attachment.
#[derive(Debug)]
pub struct FerroceCtx {
    ctx: Context,
    name: CString,
}

/// Why this thread's last failed call failed.
#[unsafe(no_mangle)]
pub extern "C" fn ferroce_last_error() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

/// Attaches to roced at `socket` (NULL: `$FERROCE_SOCKET`).
///
/// # Safety
/// `socket` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_attach(socket: *const c_char) -> *mut FerroceCtx {
    make(|| {
        let path = if socket.is_null() {
            std::env::var("FERROCE_SOCKET").map_err(|_| {
                (
                    ENOENT,
                    "no socket given and FERROCE_SOCKET is not set".to_string(),
                )
            })?
        } else {
            // SAFETY: the caller's.
            unsafe { CStr::from_ptr(socket) }
                .to_str()
                .map_err(|_| invalid("socket is not UTF-8"))?
                .to_string()
        };
        let ctx = Context::attach(path.as_ref()).map_err(client)?;
        let name = CString::new(ctx.device.clone()).unwrap_or_default();
        Ok(FerroceCtx { ctx, name })
    })
}

/// Detaches (roced destroys what the attachment holds).
///
/// # Safety
/// `ctx` is NULL or from [`ferroce_attach`], not used after.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_detach(ctx: *mut FerroceCtx) {
    if !ctx.is_null() {
        // SAFETY: the caller's: ours, given back once.
        drop(unsafe { Box::from_raw(ctx) });
    }
}

/// The device's name.
///
/// # Safety
/// `ctx` is from [`ferroce_attach`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_device_name(ctx: *const FerroceCtx) -> *const c_char {
    // SAFETY: the caller's.
    match unsafe { ctx.as_ref() } {
        Some(c) => c.name.as_ptr(),
        None => c"".as_ptr(),
    }
}

/// Port 0's path MTU in bytes.
///
/// # Safety
/// `ctx` is from [`ferroce_attach`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_port_mtu(ctx: *const FerroceCtx) -> u32 {
    // SAFETY: the caller's.
    unsafe { ctx.as_ref() }.map_or(0, |c| c.ctx.mtu)
}

/// How many GIDs port 0 has.
///
/// # Safety
/// `ctx` is from [`ferroce_attach`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_gid_count(ctx: *const FerroceCtx) -> c_int {
    // SAFETY: the caller's.
    unsafe { ctx.as_ref() }.map_or(0, |c| c.ctx.gids.len() as c_int)
}

/// GID `index` as text into `buf` (`len` bytes, NUL-terminated).
///
/// # Safety
/// `ctx` is from [`ferroce_attach`]; `buf` holds `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_gid(
    ctx: *const FerroceCtx,
    index: c_int,
    buf: *mut c_char,
    len: usize,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's.
        let c = unsafe { get(ctx, "ctx") }?;
        let g = usize::try_from(index)
            .ok()
            .and_then(|i| c.ctx.gids.get(i))
            .ok_or_else(|| invalid(&format!("no GID {index}")))?;
        if buf.is_null() || len <= g.len() {
            return Err(invalid(&format!("{len} bytes do not hold GID {g:?}")));
        }
        // SAFETY: `buf` holds `len` > g.len() bytes (the caller's).
        unsafe {
            std::ptr::copy_nonoverlapping(g.as_ptr(), buf.cast::<u8>(), g.len());
            *buf.add(g.len()) = 0;
        }
        Ok(())
    })
}

/// `ibv_alloc_pd`.
///
/// # Safety
/// `ctx` is from [`ferroce_attach`]; `pd` points to a u32.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_alloc_pd(ctx: *mut FerroceCtx, pd: *mut u32) -> c_int {
    guard(|| {
        // SAFETY: the caller's.
        let (c, out) = unsafe { (get(ctx, "ctx")?, get_mut(pd, "pd")?) };
        *out = c.ctx.alloc_pd().map_err(client)?;
        Ok(())
    })
}

/// `ibv_dealloc_pd`.
///
/// # Safety
/// `ctx` is from [`ferroce_attach`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_dealloc_pd(ctx: *mut FerroceCtx, pd: u32) -> c_int {
    guard(|| {
        // SAFETY: the caller's.
        unsafe { get(ctx, "ctx") }?
            .ctx
            .dealloc_pd(pd)
            .map_err(client)
    })
}

/// Shared memory to register.
#[derive(Debug)]
pub struct FerroceMem(Memory);

/// `len` zeroed bytes.
#[unsafe(no_mangle)]
pub extern "C" fn ferroce_mem_alloc(len: usize) -> *mut FerroceMem {
    make(|| {
        if len == 0 {
            return Err(invalid("memory of 0 bytes"));
        }
        Memory::new(len)
            .map(FerroceMem)
            .map_err(|e| (ENOMEM, e.to_string()))
    })
}

/// Its first byte (NULL for NULL).
///
/// # Safety
/// `mem` is NULL or from [`ferroce_mem_alloc`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_mem_addr(mem: *const FerroceMem) -> *mut u8 {
    // SAFETY: the caller's.
    unsafe { mem.as_ref() }.map_or(std::ptr::null_mut(), |m| m.0.addr() as *mut u8)
}

/// Its length.
///
/// # Safety
/// `mem` is NULL or from [`ferroce_mem_alloc`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_mem_len(mem: *const FerroceMem) -> usize {
    // SAFETY: the caller's.
    unsafe { mem.as_ref() }.map_or(0, |m| m.0.len())
}

/// Frees it.
///
/// # Safety
/// `mem` is NULL or from [`ferroce_mem_alloc`], not used after.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_mem_free(mem: *mut FerroceMem) {
    if !mem.is_null() {
        // SAFETY: the caller's: ours, given back once.
        drop(unsafe { Box::from_raw(mem) });
    }
}

/// `ibv_reg_mr` of the whole of `mem`.
///
/// # Safety
/// `ctx` from [`ferroce_attach`], `mem` from [`ferroce_mem_alloc`]; `lkey` and `rkey` point to
/// u32s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_reg_mr(
    ctx: *mut FerroceCtx,
    pd: u32,
    mem: *const FerroceMem,
    access: u32,
    lkey: *mut u32,
    rkey: *mut u32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's.
        let (c, m) = unsafe { (get(ctx, "ctx")?, get(mem, "mem")?) };
        // SAFETY: the caller's.
        let (l, r) = unsafe { (get_mut(lkey, "lkey")?, get_mut(rkey, "rkey")?) };
        (*l, *r) = c.ctx.reg_mr(pd, &m.0, access).map_err(client)?;
        Ok(())
    })
}

/// `ibv_dereg_mr`.
///
/// # Safety
/// `ctx` is from [`ferroce_attach`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_dereg_mr(ctx: *mut FerroceCtx, lkey: u32) -> c_int {
    guard(|| {
        // SAFETY: the caller's.
        unsafe { get(ctx, "ctx") }?
            .ctx
            .dereg_mr(lkey)
            .map_err(client)
    })
}

/// A completion queue.
#[derive(Debug)]
pub struct FerroceCq(Cq);

/// `ibv_create_cq` of `cqe` entries.
///
/// # Safety
/// `ctx` is from [`ferroce_attach`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_create_cq(ctx: *mut FerroceCtx, cqe: u32) -> *mut FerroceCq {
    make(|| {
        // SAFETY: the caller's.
        let c = unsafe { get(ctx, "ctx") }?;
        c.ctx.create_cq(cqe).map(FerroceCq).map_err(client)
    })
}

/// `ibv_destroy_cq`.
///
/// # Safety
/// `ctx` from [`ferroce_attach`], `cq` from [`ferroce_create_cq`] on it; `cq` is not used
/// after, whatever the answer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_destroy_cq(ctx: *mut FerroceCtx, cq: *mut FerroceCq) -> c_int {
    guard(|| {
        // SAFETY: the caller's.
        let (c, cq) = unsafe { (get(ctx, "ctx")?, take(cq, "cq")?) };
        c.ctx.destroy_cq(cq.0).map_err(client)
    })
}

/// `ibv_poll_cq`: up to `max` completions into `wc`; how many.
///
/// # Safety
/// `cq` from [`ferroce_create_cq`]; `wc` holds `max` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_poll_cq(
    cq: *mut FerroceCq,
    max: c_int,
    wc: *mut FerroceWc,
) -> c_int {
    let mut n = 0;
    let r = guard(|| {
        // SAFETY: the caller's.
        let c = unsafe { get_mut(cq, "cq") }?;
        let max = usize::try_from(max).map_err(|_| invalid("max is negative"))?;
        if max > 0 && wc.is_null() {
            return Err(invalid("wc is NULL"));
        }
        while (n as usize) < max {
            let Some(e) = c.0.poll_one().map_err(client)? else {
                break;
            };
            // SAFETY: n < max, which `wc` holds (the caller's).
            unsafe {
                wc.add(n as usize).write(FerroceWc {
                    wr_id: e.wr_id,
                    status: e.status.into(),
                    opcode: e.opcode.into(),
                    byte_len: e.byte_len,
                    imm_data: e.imm,
                    qp_num: e.qp_num,
                    src_qp: e.src_qp,
                    wc_flags: e.flags.into(),
                })
            };
            n += 1;
        }
        Ok(())
    });
    if r < 0 { r } else { n }
}

/// `struct ferroce_wc`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FerroceWc {
    wr_id: u64,
    status: u32,
    opcode: u32,
    byte_len: u32,
    imm_data: u32,
    qp_num: u32,
    src_qp: u32,
    wc_flags: u32,
}

/// `struct ferroce_sge`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FerroceSge {
    addr: u64,
    length: u32,
    lkey: u32,
}

/// `struct ferroce_send_wr`.
#[repr(C)]
#[derive(Debug)]
pub struct FerroceSendWr {
    wr_id: u64,
    opcode: u32,
    send_flags: u32,
    imm_data: u32,
    num_sge: u32,
    sg_list: *const FerroceSge,
    remote_addr: u64,
    rkey: u32,
    reserved: u32,
    compare_add: u64,
    swap: u64,
}

/// `struct ferroce_recv_wr`.
#[repr(C)]
#[derive(Debug)]
pub struct FerroceRecvWr {
    wr_id: u64,
    num_sge: u32,
    sg_list: *const FerroceSge,
}

/// `struct ferroce_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FerroceQpCap {
    max_send_wr: u32,
    max_recv_wr: u32,
    max_send_sge: u32,
    max_recv_sge: u32,
    max_inline_data: u32,
}

/// `struct ferroce_qp_attr`.
#[repr(C)]
#[derive(Debug)]
pub struct FerroceQpAttr {
    state: u32,
    access_flags: u32,
    path_mtu: u32,
    dest_qp_num: u32,
    rq_psn: u32,
    sq_psn: u32,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    min_rnr_timer: u8,
    max_rd_atomic: u8,
    max_dest_rd_atomic: u8,
    reserved: [u8; 2],
    remote_gid: *const c_char,
}

/// The scatter/gather list a work request names, checked.
///
/// # Safety
/// `sg` is NULL or holds `n` entries.
unsafe fn sg_list(
    sg: *const FerroceSge,
    n: u32,
) -> Result<arrayvec::ArrayVec<abi::Sge, { abi::MAX_SGE }>, (c_int, String)> {
    if n as usize > abi::MAX_SGE {
        return Err(invalid(&format!(
            "{n} scatter/gather entries (at most {})",
            abi::MAX_SGE
        )));
    }
    if n > 0 && sg.is_null() {
        return Err(invalid("sg_list is NULL"));
    }
    let s = if n == 0 {
        &[][..]
    } else {
        // SAFETY: the caller's: `n` entries.
        unsafe { std::slice::from_raw_parts(sg, n as usize) }
    };
    Ok(s.iter()
        .map(|e| abi::Sge {
            addr: e.addr,
            length: e.length,
            lkey: e.lkey,
        })
        .collect())
}

/// A queue pair.
#[derive(Debug)]
pub struct FerroceQp(Qp);

/// `ibv_create_qp` (RC).
///
/// # Safety
/// `ctx` from [`ferroce_attach`]; the CQs from [`ferroce_create_cq`] on it; `cap` NULL or a
/// `struct ferroce_qp_cap`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_create_qp(
    ctx: *mut FerroceCtx,
    pd: u32,
    send_cq: *mut FerroceCq,
    recv_cq: *mut FerroceCq,
    cap: *const FerroceQpCap,
) -> *mut FerroceQp {
    make(|| {
        // SAFETY: the caller's.
        let c = unsafe { get(ctx, "ctx") }?;
        // SAFETY: the caller's.
        let (s, r) = unsafe { (get(send_cq, "send_cq")?, get(recv_cq, "recv_cq")?) };
        // SAFETY: the caller's.
        let caps = match unsafe { cap.as_ref() } {
            Some(k) => QpCapsMsg {
                max_send_wr: k.max_send_wr,
                max_recv_wr: k.max_recv_wr,
                max_send_sge: k.max_send_sge,
                max_recv_sge: k.max_recv_sge,
                max_inline_data: k.max_inline_data,
            },
            None => QpCapsMsg {
                max_send_wr: 128,
                max_recv_wr: 128,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 64,
            },
        };
        c.ctx
            .create_qp(pd, &s.0, &r.0, caps)
            .map(FerroceQp)
            .map_err(client)
    })
}

/// Its number.
///
/// # Safety
/// `qp` is NULL or from [`ferroce_create_qp`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_qp_num(qp: *const FerroceQp) -> u32 {
    // SAFETY: the caller's.
    unsafe { qp.as_ref() }.map_or(0, |q| q.0.qpn)
}

/// The PSN it starts sending with.
///
/// # Safety
/// `qp` is NULL or from [`ferroce_create_qp`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_qp_sq_psn(qp: *const FerroceQp) -> u32 {
    // SAFETY: the caller's.
    unsafe { qp.as_ref() }.map_or(0, |q| q.0.sq_psn)
}

// ibv_qp_attr_mask's bits, as ferroce.h names them.
const QP_ACCESS_FLAGS: u32 = 1 << 3;
const QP_AV: u32 = 1 << 7;
const QP_PATH_MTU: u32 = 1 << 8;
const QP_TIMEOUT: u32 = 1 << 9;
const QP_RETRY_CNT: u32 = 1 << 10;
const QP_RNR_RETRY: u32 = 1 << 11;
const QP_RQ_PSN: u32 = 1 << 12;
const QP_MAX_QP_RD_ATOMIC: u32 = 1 << 13;
const QP_MIN_RNR_TIMER: u32 = 1 << 15;
const QP_SQ_PSN: u32 = 1 << 16;
const QP_MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
const QP_DEST_QPN: u32 = 1 << 20;

/// The modify a `struct ferroce_qp_attr` and its mask ask for.
///
/// # Safety
/// `a.remote_gid` is NULL or a NUL-terminated string.
unsafe fn modify_msg(a: &FerroceQpAttr, mask: u32) -> Result<ModifyMsg, (c_int, String)> {
    let state = match a.state {
        0 => "RESET",
        1 => "INIT",
        2 => "RTR",
        3 => "RTS",
        4 => "SQD",
        6 => "ERR",
        s => return Err(invalid(&format!("QP state {s} (0 to 4, or 6)"))),
    };
    let on = |bit: u32| mask & bit != 0;
    let remote_gid = if on(QP_AV) {
        if a.remote_gid.is_null() {
            return Err(invalid("FERROCE_QP_AV without remote_gid"));
        }
        // SAFETY: the caller's.
        let g = unsafe { CStr::from_ptr(a.remote_gid) }
            .to_str()
            .map_err(|_| invalid("remote_gid is not UTF-8"))?;
        Some(g.to_string())
    } else {
        None
    };
    Ok(ModifyMsg {
        state: state.into(),
        access: on(QP_ACCESS_FLAGS).then_some(a.access_flags),
        mtu: on(QP_PATH_MTU).then_some(a.path_mtu),
        dest_qp: on(QP_DEST_QPN).then_some(a.dest_qp_num),
        remote_gid,
        dscp: None,
        rq_psn: on(QP_RQ_PSN).then_some(a.rq_psn),
        sq_psn: on(QP_SQ_PSN).then_some(a.sq_psn),
        timeout: on(QP_TIMEOUT).then_some(a.timeout),
        retry_cnt: on(QP_RETRY_CNT).then_some(a.retry_cnt),
        rnr_retry: on(QP_RNR_RETRY).then_some(a.rnr_retry),
        min_rnr_timer: on(QP_MIN_RNR_TIMER).then_some(a.min_rnr_timer),
        max_rd_atomic: on(QP_MAX_QP_RD_ATOMIC).then_some(a.max_rd_atomic),
        max_dest_rd_atomic: on(QP_MAX_DEST_RD_ATOMIC).then_some(a.max_dest_rd_atomic),
        qkey: None,
    })
}

/// `ibv_modify_qp`.
///
/// # Safety
/// `ctx` from [`ferroce_attach`], `qp` from [`ferroce_create_qp`] on it, `attr` a `struct
/// ferroce_qp_attr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_modify_qp(
    ctx: *mut FerroceCtx,
    qp: *mut FerroceQp,
    attr: *const FerroceQpAttr,
    mask: u32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's.
        let (c, q, a) = unsafe { (get(ctx, "ctx")?, get(qp, "qp")?, get(attr, "attr")?) };
        // SAFETY: the caller's.
        let m = unsafe { modify_msg(a, mask) }?;
        c.ctx.modify_qp(&q.0, m).map_err(client)
    })
}

/// `ibv_destroy_qp`.
///
/// # Safety
/// `ctx` from [`ferroce_attach`], `qp` from [`ferroce_create_qp`] on it, not used after.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_destroy_qp(ctx: *mut FerroceCtx, qp: *mut FerroceQp) -> c_int {
    guard(|| {
        // SAFETY: the caller's.
        let (c, q) = unsafe { (get(ctx, "ctx")?, take(qp, "qp")?) };
        c.ctx.destroy_qp(q.0).map_err(client)
    })
}

/// `ibv_post_send` of one work request.
///
/// # Safety
/// `qp` from [`ferroce_create_qp`]; `wr` a `struct ferroce_send_wr` whose `sg_list` holds
/// `num_sge` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_post_send(qp: *mut FerroceQp, wr: *const FerroceSendWr) -> c_int {
    guard(|| {
        // SAFETY: the caller's.
        let (q, w) = unsafe { (get_mut(qp, "qp")?, get(wr, "wr")?) };
        let opcode = u8::try_from(w.opcode)
            .ok()
            .and_then(WrOpcode::from_u8)
            .ok_or_else(|| invalid(&format!("opcode {}", w.opcode)))?;
        let flags = u8::try_from(w.send_flags)
            .ok()
            .filter(|f| f & !send_flags::ALL == 0)
            .ok_or_else(|| invalid(&format!("send flags {:#x}", w.send_flags)))?;
        // SAFETY: the caller's.
        let sg = unsafe { sg_list(w.sg_list, w.num_sge) }?;
        // Inline: the bytes the list names, gathered now (they are free again on return).
        let mut bytes = Vec::new();
        if flags & send_flags::INLINE != 0 {
            for s in &sg {
                // SAFETY: the caller's: the list names its own readable memory.
                let b =
                    unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.length as usize) };
                bytes.extend_from_slice(b);
            }
        }
        let inline = flags & send_flags::INLINE != 0;
        let e = SendWqe {
            wr_id: w.wr_id,
            opcode,
            flags,
            imm: w.imm_data,
            remote_addr: w.remote_addr,
            rkey: w.rkey,
            compare_add: w.compare_add,
            swap: w.swap,
            ud: UdTarget::default(),
            sg: if inline { Default::default() } else { sg },
            inline: &bytes,
        };
        match q.0.post_send(&e).map_err(client)? {
            true => Ok(()),
            false => Err((ENOMEM, "the send queue is full".into())),
        }
    })
}

/// `ibv_post_recv` of one work request.
///
/// # Safety
/// `qp` from [`ferroce_create_qp`]; `wr` a `struct ferroce_recv_wr` whose `sg_list` holds
/// `num_sge` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferroce_post_recv(qp: *mut FerroceQp, wr: *const FerroceRecvWr) -> c_int {
    guard(|| {
        // SAFETY: the caller's.
        let (q, w) = unsafe { (get_mut(qp, "qp")?, get(wr, "wr")?) };
        // SAFETY: the caller's.
        let sg = unsafe { sg_list(w.sg_list, w.num_sge) }?;
        let r = RecvWqe { wr_id: w.wr_id, sg };
        match q.0.post_recv(&r).map_err(client)? {
            true => Ok(()),
            false => Err((ENOMEM, "the receive queue is full".into())),
        }
    })
}
