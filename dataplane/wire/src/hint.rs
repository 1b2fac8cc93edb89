//! CPU hints for the packet path.

/// Asks the CPU to start loading the cache line holding `p` (x86-64 `prefetcht0`; nothing
/// elsewhere). The next packet's headers, the next QP's state: anything about to be touched
/// whose address is known a little ahead.
#[inline(always)]
pub fn prefetch<T: ?Sized>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch is a hint; it never faults, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch(p as *const i8, core::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
