//! Protection domains and memory regions. A region is the program's own memory, made
//! shareable in place ([`verbs::adopt`]) and registered with roced, whose lcores then read and
//! write it directly.

use crate::device::{Ctx, ctx};
use crate::sys::*;
use crate::{Fail, Res, int_call, ptr_call};
use std::ffi::{c_int, c_void};

/// A protection domain.
#[repr(C)]
pub(crate) struct Pd {
    pub(crate) pd: ibv_pd,
}

pub(crate) fn pd<'a>(p: *mut ibv_pd) -> Res<(&'a Pd, &'a Ctx)> {
    // SAFETY: every ibv_pd handed out begins a live Pd.
    let p = unsafe { (p as *const Pd).as_ref() }.ok_or_else(|| Fail::inval("no PD"))?;
    Ok((p, ctx(p.pd.context)?))
}

/// `ibv_alloc_pd`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_alloc_pd(c: *mut ibv_context) -> *mut ibv_pd {
    ptr_call("ibv_alloc_pd", || {
        let x = ctx(c)?;
        let n = x.with(|c| c.alloc_pd())?;
        let p = Box::leak(Box::new(Pd {
            pd: ibv_pd {
                context: x.ibv(),
                handle: n,
            },
        }));
        Ok(&mut p.pd as *mut ibv_pd)
    })
}

/// `ibv_dealloc_pd`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_dealloc_pd(p: *mut ibv_pd) -> c_int {
    int_call("ibv_dealloc_pd", || {
        let (pd, x) = pd(p)?;
        x.with(|c| c.dealloc_pd(pd.pd.handle))?;
        // SAFETY: the Pd ibv_alloc_pd leaked, given back once.
        drop(unsafe { Box::from_raw(p as *mut Pd) });
        Ok(())
    })
}

/// A memory region.
#[repr(C)]
struct Mr {
    mr: ibv_mr,
}

/// The `IBV_ACCESS_*` bits roced takes; the optional ones (relaxed ordering, ...) a device may
/// ignore, and MW_BIND, ON_DEMAND and HUGETLB change nothing here.
const ACCESS_KNOWN: u32 = 0xf;
const ACCESS_IGNORED: u32 = ibv_access_flags::IBV_ACCESS_MW_BIND
    | ibv_access_flags::IBV_ACCESS_ON_DEMAND
    | ibv_access_flags::IBV_ACCESS_HUGETLB
    | ACCESS_OPTIONAL_RANGE;
/// `IBV_ACCESS_OPTIONAL_RANGE` (a macro bindgen does not evaluate): bits 20 to 29.
const ACCESS_OPTIONAL_RANGE: u32 = 0x3ff0_0000;

fn reg(
    p: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> Res<*mut ibv_mr> {
    let (pd, x) = pd(p)?;
    let access = access as u32;
    let unknown = access & !(ACCESS_KNOWN | ACCESS_IGNORED);
    if unknown != 0 {
        return Err(Fail::inval(format!(
            "access flags {unknown:#x} are not offered"
        )));
    }
    // SAFETY: the program registers its own memory; verbs' contract is that it stays mapped
    // while registered (adopt checks it is mapped and readable now).
    let (lkey, rkey) = x.with(|c| unsafe {
        c.reg_mr_at_iova(
            pd.pd.handle,
            addr as usize,
            len,
            iova,
            access & ACCESS_KNOWN,
        )
    })?;
    let m = Box::leak(Box::new(Mr {
        mr: ibv_mr {
            context: x.ibv(),
            pd: p,
            addr,
            length: len,
            handle: lkey,
            lkey,
            rkey,
        },
    }));
    Ok(&mut m.mr as *mut ibv_mr)
}

/// `ibv_reg_mr`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_reg_mr(
    p: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    ptr_call("ibv_reg_mr", || reg(p, addr, len, addr as u64, access))
}

/// `ibv_reg_mr_iova2`: work requests name the region by `iova`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_reg_mr_iova2(
    p: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    ptr_call("ibv_reg_mr", || reg(p, addr, len, iova, access as c_int))
}

/// `ibv_reg_mr_iova`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_reg_mr_iova(
    p: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    ptr_call("ibv_reg_mr", || reg(p, addr, len, iova, access))
}

/// `ibv_dereg_mr`. The pages stay shared (see [`verbs::adopt`]).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_dereg_mr(m: *mut ibv_mr) -> c_int {
    int_call("ibv_dereg_mr", || {
        // SAFETY: every ibv_mr handed out begins a live Mr.
        let mr = unsafe { (m as *const Mr).as_ref() }.ok_or_else(|| Fail::inval("no MR"))?;
        let x = ctx(mr.mr.context)?;
        x.with(|c| c.dereg_mr(mr.mr.lkey))?;
        // SAFETY: the Mr reg leaked, given back once.
        drop(unsafe { Box::from_raw(m as *mut Mr) });
        Ok(())
    })
}
