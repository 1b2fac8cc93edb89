//! Completion queues: a ring roced's lcore writes completions into and `ibv_poll_cq` reads,
//! with no system call.

use crate::device::ctx;
use crate::sys::*;
use crate::{Fail, Res, int_call, ptr_call};
use rustix::fd::BorrowedFd;
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use verbs::abi::Cqe;

/// A completion queue.
#[repr(C)]
pub(crate) struct Cq {
    pub(crate) cq: ibv_cq,
    ring: Mutex<verbs::client::Cq>,
    /// Armed by `ibv_req_notify_cq` and not yet reported by `ibv_get_cq_event`.
    armed: AtomicBool,
}

/// A completion channel: an eventfd roced writes when a completion arrives on one of its
/// armed CQs. The program may `poll()` its descriptor; `ibv_get_cq_event` reads it and finds
/// which CQs fired (armed here, no longer armed in their rings).
#[repr(C)]
pub(crate) struct Channel {
    ch: ibv_comp_channel,
    cqs: Mutex<Vec<usize>>,
    /// CQs that fired and are not reported yet (one eventfd read can cover several).
    fired: Mutex<VecDeque<usize>>,
}

fn channel<'a>(c: *mut ibv_comp_channel) -> Res<&'a Channel> {
    // SAFETY: every ibv_comp_channel handed out begins a live Channel.
    unsafe { (c as *const Channel).as_ref() }.ok_or_else(|| Fail::inval("no channel"))
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
        if cqe < 1 {
            return Err(Fail::inval(format!("{cqe} entries")));
        }
        let ch = if channel.is_null() {
            None
        } else {
            Some(self::channel(channel)?)
        };
        let ring = match ch {
            None => x.with(|c| c.create_cq(cqe as u32))?,
            Some(ch) => {
                // SAFETY: the channel's eventfd, open while the channel lives.
                let fd = unsafe { BorrowedFd::borrow_raw(ch.ch.fd) };
                x.with(|c| c.create_cq_with(cqe as u32, Some(fd)))?
            }
        };
        // SAFETY: ibv_cq is C data; all zeroes is valid (NULL, 0, unlocked mutex).
        let mut q: ibv_cq = unsafe { core::mem::zeroed() };
        q.context = c;
        q.channel = channel;
        q.cq_context = cq_context;
        q.handle = ring.cq;
        q.cqe = ring.capacity() as c_int;
        let b = Box::leak(Box::new(Cq {
            cq: q,
            ring: Mutex::new(ring),
            armed: AtomicBool::new(false),
        }));
        if let Some(ch) = ch {
            lock(&ch.cqs).push(b as *const Cq as usize);
        }
        x.objects()
            .cqs
            .insert(b.id(), &b.cq as *const ibv_cq as usize);
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
        x.objects().cqs.remove(&q.id());
        if let Ok(ch) = channel(q.cq.channel) {
            let me = q as *const Cq as usize;
            lock(&ch.cqs).retain(|&p| p != me);
            lock(&ch.fired).retain(|&p| p != me);
        }
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

/// `ibv_req_notify_cq` (through the context): arms the CQ; roced writes its channel at the
/// next completion (solicited-only is taken as any completion: more events than asked, never
/// fewer).
unsafe extern "C" fn req_notify_cq(c: *mut ibv_cq, _solicited: c_int) -> c_int {
    int_call("ibv_req_notify_cq", || {
        let q = cq(c)?;
        if q.cq.channel.is_null() {
            return Err(Fail::inval("the CQ has no completion channel"));
        }
        q.armed.store(true, Ordering::SeqCst);
        lock(&q.ring).arm();
        Ok(())
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `ibv_create_comp_channel`: an eventfd.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_create_comp_channel(c: *mut ibv_context) -> *mut ibv_comp_channel {
    ptr_call("ibv_create_comp_channel", || {
        ctx(c)?;
        // SAFETY: a plain system call.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Fail::new(
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO),
                "eventfd failed",
            ));
        }
        let b = Box::leak(Box::new(Channel {
            ch: ibv_comp_channel {
                context: c,
                fd,
                refcnt: 0,
            },
            cqs: Mutex::new(Vec::new()),
            fired: Mutex::new(VecDeque::new()),
        }));
        Ok(&mut b.ch as *mut ibv_comp_channel)
    })
}

/// `ibv_destroy_comp_channel`: refused while CQs use it (EBUSY), as libibverbs does.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_destroy_comp_channel(c: *mut ibv_comp_channel) -> c_int {
    int_call("ibv_destroy_comp_channel", || {
        let ch = channel(c)?;
        if !lock(&ch.cqs).is_empty() {
            return Err(Fail::new(libc::EBUSY, "CQs still use the channel"));
        }
        // SAFETY: our eventfd, closed once; then the Channel ibv_create_comp_channel leaked.
        unsafe {
            libc::close(ch.ch.fd);
            drop(Box::from_raw(c as *mut Channel));
        }
        Ok(())
    })
}

/// `ibv_get_cq_event`: waits for (or, if the program made the descriptor non-blocking, checks)
/// the next event, and names its CQ.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_cq_event(
    c: *mut ibv_comp_channel,
    out_cq: *mut *mut ibv_cq,
    out_ctx: *mut *mut c_void,
) -> c_int {
    crate::minus_one_call("ibv_get_cq_event", || {
        let ch = channel(c)?;
        loop {
            if let Some(p) = lock(&ch.fired).pop_front() {
                // SAFETY: a CQ of this channel, live (destroy takes it out of the lists).
                let q = unsafe { &*(p as *const Cq) };
                if !out_cq.is_null() {
                    // SAFETY: the caller's pointers.
                    unsafe { *out_cq = &q.cq as *const ibv_cq as *mut ibv_cq };
                }
                if !out_ctx.is_null() {
                    // SAFETY: as above.
                    unsafe { *out_ctx = q.cq.cq_context };
                }
                return Ok(());
            }
            let mut n = [0u8; 8];
            // SAFETY: reads 8 bytes into a local array.
            let r = unsafe { libc::read(ch.ch.fd, n.as_mut_ptr().cast(), 8) };
            if r != 8 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(Fail::new(e.raw_os_error().unwrap_or(libc::EIO), "no event"));
            }
            // Which CQs fired: armed here, taken by roced.
            let cqs = lock(&ch.cqs).clone();
            let mut f = lock(&ch.fired);
            for p in cqs {
                // SAFETY: as above.
                let q = unsafe { &*(p as *const Cq) };
                if q.armed.load(Ordering::SeqCst) && !lock(&q.ring).armed() {
                    q.armed.store(false, Ordering::SeqCst);
                    f.push_back(p);
                }
            }
        }
    })
}

/// `ibv_ack_cq_events`: counted, as libibverbs counts them.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_ack_cq_events(c: *mut ibv_cq, n: u32) {
    if !c.is_null() {
        // SAFETY: the program's CQ (ours); it acknowledges from one thread per CQ.
        unsafe {
            let p = core::ptr::addr_of_mut!((*c).comp_events_completed);
            *p = (*p).wrapping_add(n);
        }
    }
}
