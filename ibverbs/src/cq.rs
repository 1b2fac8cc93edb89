//! Completion queues: a ring roced's lcore writes completions into and `ibv_poll_cq` reads,
//! with no system call.

use crate::device::ctx;
use crate::sys::*;
use crate::{Fail, Res, int_call, ptr_call};
use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use verbs::abi::Cqe;

/// A completion queue.
#[repr(C)]
pub(crate) struct Cq {
    pub(crate) cq: ibv_cq,
    ring: Mutex<verbs::client::Cq>,
}

pub(crate) fn cq<'a>(c: *mut ibv_cq) -> Res<&'a Cq> {
    // SAFETY: every ibv_cq handed out begins a live Cq.
    unsafe { (c as *const Cq).as_ref() }.ok_or_else(|| Fail::inval("no CQ"))
}

impl Cq {
    /// Its number in the attachment.
    pub(crate) fn id(&self) -> u32 {
        self.cq.handle
    }
}

pub(crate) fn fill_ops(v: &mut verbs_context) {
    v.context.ops.poll_cq = Some(poll_cq);
    v.context.ops.req_notify_cq = Some(req_notify_cq);
}

/// `ibv_create_cq` of at least `cqe` entries.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_create_cq(
    c: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    _comp_vector: c_int,
) -> *mut ibv_cq {
    ptr_call("ibv_create_cq", || {
        let x = ctx(c)?;
        if !channel.is_null() {
            return Err(Fail::unsupported("a completion channel"));
        }
        if cqe < 1 {
            return Err(Fail::inval(format!("{cqe} entries")));
        }
        let ring = x.with(|c| c.create_cq(cqe as u32))?;
        // SAFETY: ibv_cq is C data; all zeroes is valid (NULL, 0, unlocked mutex).
        let mut q: ibv_cq = unsafe { core::mem::zeroed() };
        q.context = c;
        q.cq_context = cq_context;
        q.handle = ring.cq;
        q.cqe = ring.capacity() as c_int;
        let b = Box::leak(Box::new(Cq {
            cq: q,
            ring: Mutex::new(ring),
        }));
        Ok(&mut b.cq as *mut ibv_cq)
    })
}

/// `ibv_destroy_cq`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_destroy_cq(c: *mut ibv_cq) -> c_int {
    int_call("ibv_destroy_cq", || {
        let q = cq(c)?;
        let x = ctx(q.cq.context)?;
        x.with(|s| s.destroy_cq_id(q.id()))?;
        // SAFETY: the Cq ibv_create_cq leaked, given back once.
        drop(unsafe { Box::from_raw(c as *mut Cq) });
        Ok(())
    })
}

fn wc_of(e: &Cqe) -> ibv_wc {
    // SAFETY: plain C data.
    let mut w: ibv_wc = unsafe { core::mem::zeroed() };
    w.wr_id = e.wr_id;
    w.status = e.status.into();
    w.opcode = e.opcode.into();
    w.byte_len = e.byte_len;
    w.qp_num = e.qp_num;
    w.src_qp = e.src_qp;
    w.wc_flags = e.flags.into();
    if e.flags & 2 != 0 {
        // Immediate data as the wire carried it (network order, as verbs gives it).
        w.__bindgen_anon_1.imm_data = e.imm.to_be();
    } else if e.flags & 4 != 0 {
        w.__bindgen_anon_1.invalidated_rkey = e.imm;
    }
    w
}

/// `ibv_poll_cq` (through the context): up to `n` completions into `wc`.
unsafe extern "C" fn poll_cq(c: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    let Ok(q) = cq(c) else { return -libc::EINVAL };
    if n <= 0 || wc.is_null() {
        return 0;
    }
    let mut ring = q.ring.lock().unwrap_or_else(|p| p.into_inner());
    let mut got = 0;
    while got < n {
        match ring.poll_one() {
            Ok(Some(e)) => {
                // SAFETY: the caller's array of `n` entries.
                unsafe { wc.add(got as usize).write(wc_of(&e)) };
                got += 1;
            }
            Ok(None) => break,
            Err(e) => {
                eprintln!("ferroce: ibv_poll_cq: {e}");
                return if got > 0 { got } else { -libc::EIO };
            }
        }
    }
    got
}

/// `ibv_req_notify_cq`: completion events need a completion channel, not offered yet.
unsafe extern "C" fn req_notify_cq(_c: *mut ibv_cq, _solicited: c_int) -> c_int {
    int_call("ibv_req_notify_cq", || {
        Err(Fail::unsupported("completion events"))
    })
}

/// `ibv_create_comp_channel`: not offered yet.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_create_comp_channel(_c: *mut ibv_context) -> *mut ibv_comp_channel {
    ptr_call("ibv_create_comp_channel", || {
        Err(Fail::unsupported("a completion channel"))
    })
}

/// `ibv_destroy_comp_channel`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_destroy_comp_channel(_ch: *mut ibv_comp_channel) -> c_int {
    int_call("ibv_destroy_comp_channel", || {
        Err(Fail::unsupported("a completion channel"))
    })
}

/// `ibv_get_cq_event`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_cq_event(
    _ch: *mut ibv_comp_channel,
    _cq: *mut *mut ibv_cq,
    _ctx: *mut *mut c_void,
) -> c_int {
    crate::minus_one_call("ibv_get_cq_event", || {
        Err(Fail::unsupported("completion events"))
    })
}

/// `ibv_ack_cq_events`: counts acknowledgements (none are raised yet).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_ack_cq_events(_cq: *mut ibv_cq, _n: u32) {}
