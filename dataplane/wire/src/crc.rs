//! CRC-32 (Ethernet polynomial, reflected) over a buffer whose first 64 bytes are ORed with
//! masks on the way in: the kernel of the RoCEv2 ICRC ([`crate::icrc`]).
//!
//! The ICRC covers the headers with a few fields replaced by ones. Copying the headers to
//! apply the masks and hashing the copy and the payload separately costs two CRC reductions
//! (crc32fast: ~35 ns for a 64-byte payload here); so this folds the packet in place in one
//! pass with PCLMULQDQ (Intel's "Fast CRC Computation Using PCLMULQDQ"), ORing each mask into
//! its 16-byte block in a register as it is loaded. Where the CPU has AVX-512 and VPCLMULQDQ,
//! inputs of 256 bytes or more fold four 512-bit lanes at a time (3.7x the 128-bit kernel over
//! a 4 KiB frame here, and below crc32fast's one unmasked pass); shorter ones, whose cost is the
//! reduction, stay on 128 bits. Without PCLMULQDQ a table-driven loop does the same, byte by
//! byte. The kernel is chosen at run time (`kernel()`); the tests hold each one to the table.

/// Masks ORed into bytes 0..64 of the input, as four little-endian 16-byte blocks.
pub type Masks = [u128; 4];

const fn table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xedb8_8320
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}

static TABLE: [u32; 256] = table();

fn mask_byte(masks: &Masks, i: usize) -> u8 {
    if i < 64 {
        (masks[i / 16] >> ((i % 16) * 8)) as u8
    } else {
        0
    }
}

/// The table-driven reference: CRC-32 of `data` (bytes below 64 ORed with `masks`), continuing
/// from `crc` (the CRC of whatever came before; 0 for nothing).
pub fn crc32_masked_scalar(crc: u32, data: &[u8], masks: &Masks) -> u32 {
    let mut c = !crc;
    for (i, b) in data.iter().enumerate() {
        let b = b | mask_byte(masks, i);
        c = TABLE[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

/// Which kernel [`crc32_masked`] runs on this CPU, slowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kernel {
    /// The table, byte by byte.
    Scalar,
    /// 128-bit PCLMULQDQ folding.
    Pclmul,
    /// 512-bit VPCLMULQDQ folding (AVX-512 F, VL and BW): inputs of 256 bytes or more fold
    /// four 512-bit lanes a round; from 65 bytes, every 16-byte block folds straight to the
    /// end at once; 64 bytes or fewer take the 128-bit path.
    Vpclmul512,
}

/// [`kernel`]'s answer once known: 0 before, else the kernel's number plus one.
static KERNEL: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
const PCLMUL: u8 = Kernel::Pclmul as u8 + 1;
const VPCLMUL512: u8 = Kernel::Vpclmul512 as u8 + 1;

/// The fastest kernel this CPU runs, detected on first use and kept (one relaxed load after).
#[inline]
pub fn kernel() -> Kernel {
    use std::sync::atomic::Ordering;
    match KERNEL.load(Ordering::Relaxed) {
        1 => Kernel::Scalar,
        PCLMUL => Kernel::Pclmul,
        VPCLMUL512 => Kernel::Vpclmul512,
        _ => {
            let k = detect();
            KERNEL.store(k as u8 + 1, Ordering::Relaxed);
            k
        }
    }
}

#[cold]
fn detect() -> Kernel {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("pclmulqdq")
            && std::is_x86_feature_detected!("sse4.1")
            && std::is_x86_feature_detected!("ssse3")
        {
            if std::is_x86_feature_detected!("vpclmulqdq")
                && std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512vl")
                && std::is_x86_feature_detected!("avx512bw")
            {
                return Kernel::Vpclmul512;
            }
            return Kernel::Pclmul;
        }
    }
    Kernel::Scalar
}

/// CRC-32 of `data` with its first 64 bytes ORed with `masks`, continuing from `crc`.
#[inline]
pub fn crc32_masked(crc: u32, data: &[u8], masks: &Masks) -> u32 {
    run(kernel(), crc, data, masks)
}

/// [`crc32_masked`] on a given kernel (the tests and the benchmark compare them); a kernel
/// this CPU lacks falls back to the best one it has.
pub fn crc32_masked_with(k: Kernel, crc: u32, data: &[u8], masks: &Masks) -> u32 {
    run(k.min(kernel()), crc, data, masks)
}

/// [`crc32_masked`] on `k`, which must be [`kernel`]'s answer (or slower): for callers that
/// asked once and choose by it, as the ICRC does by length.
#[inline(always)]
pub(crate) fn crc32_masked_on(k: Kernel, crc: u32, data: &[u8], masks: &Masks) -> u32 {
    debug_assert!(k <= kernel());
    run(k, crc, data, masks)
}

/// `k` is one this CPU runs.
#[inline(always)]
fn run(k: Kernel, crc: u32, data: &[u8], masks: &Masks) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if k == Kernel::Vpclmul512 && data.len() > 64 {
            // SAFETY: the CPU has every feature the kernels are compiled for (kernel()).
            return unsafe {
                if data.len() >= 256 {
                    x86::crc32_masked_512(crc, data, masks)
                } else {
                    x86::crc32_masked_short512(crc, data, masks)
                }
            };
        }
        if k != Kernel::Scalar && data.len() >= 16 {
            // SAFETY: as above, for the 128-bit kernels' features.
            return unsafe {
                if (65..256).contains(&data.len()) {
                    x86::crc32_masked_short(crc, data, masks)
                } else {
                    x86::crc32_masked(crc, data, masks)
                }
            };
        }
    }
    let _ = k;
    crc32_masked_scalar(crc, data, masks)
}

/// The folding constant x^n mod P, bit-reflected and shifted left by one, as the reflected
/// PCLMULQDQ folds multiply by (Intel's "Fast CRC Computation Using PCLMULQDQ"): folding a
/// 128-bit lane forward by D bits multiplies its low half by k(D + 32), its high half by
/// k(D - 32).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const fn fold_constant(n: u32) -> i64 {
    let mut r: u64 = 1;
    let mut i = 0;
    while i < n {
        r <<= 1;
        if r & (1 << 32) != 0 {
            r ^= 0x1_04C1_1DB7;
        }
        i += 1;
    }
    ((r as u32).reverse_bits() as i64) << 1
}

/// [`fold_constant`] for any integer exponent: x is invertible mod P (P's constant term is 1,
/// so x * (P - 1)/x = 1), and a fold by fewer than 32 bits needs x to a negative power.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const fn fold_constant_signed(n: i32) -> i64 {
    if n >= 0 {
        return fold_constant(n as u32);
    }
    let mut r: u64 = 1;
    let mut i = 0;
    while i < -n {
        // r / x mod P: make r divisible by x (add P if it is odd), then shift.
        if r & 1 != 0 {
            r ^= 0x1_04C1_1DB7;
        }
        r >>= 1;
        i += 1;
    }
    ((r as u32).reverse_bits() as i64) << 1
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Masks;
    use core::arch::x86_64 as a;

    // Folding constants for the reflected CRC-32 polynomial 0x04C11DB7: x^(4*128+32),
    // x^(4*128-32) mod P for folding 4 blocks; x^(128+32), x^(128-32) for one; x^64 for the
    // 64-bit step; P and mu for the Barrett reduction (all bit-reflected, shifted left by one).
    const K1: i64 = 0x1_5444_2bd4;
    const K2: i64 = 0x1_c6e4_1596;
    const K3: i64 = 0x1_7519_97d0;
    const K4: i64 = 0x0_ccaa_009e;
    const K5: i64 = 0x1_63cd_6124;
    // The 512-bit kernel's: four zmm lanes 2048 bits apart, one zmm 512 bits on.
    const K2048: (i64, i64) = (
        super::fold_constant(2048 + 32),
        super::fold_constant(2048 - 32),
    );
    const K512: (i64, i64) = (
        super::fold_constant(512 + 32),
        super::fold_constant(512 - 32),
    );
    const _: () = assert!(K1 == K512.0 && K2 == K512.1);
    const _: () = assert!(K3 == super::fold_constant(160) && K4 == super::fold_constant(96));
    const P_X: i64 = 0x1_DB71_0641;
    const U_PRIME: i64 = 0x1_F701_1641;

    /// Constant pairs for folding a 128-bit lane forward by `j` 16-byte blocks, `j` = 0..=7
    /// (0 unused), as `_mm_load_si128` wants them: k(128j + 32) low, k(128j - 32) high.
    #[repr(align(16))]
    struct Ks([[i64; 2]; 8]);
    static KB: Ks = Ks({
        let mut t = [[0i64; 2]; 8];
        let mut j = 1;
        while j < 8 {
            t[j] = [
                super::fold_constant(128 * j as u32 + 32),
                super::fold_constant(128 * j as u32 - 32),
            ];
            j += 1;
        }
        t
    });
    const _: () = assert!(KB.0[1][0] == K3 && KB.0[1][1] == K4);
    const _: () = assert!(KB.0[4][0] == K1 && KB.0[4][1] == K2);

    /// Sixteen zero bytes, then sixteen of 0xff: the 16 bytes from `r` keep a block's top `r`.
    static SLIDE: [u8; 32] = {
        let mut t = [0u8; 32];
        let mut i = 16;
        while i < 32 {
            t[i] = 0xff;
            i += 1;
        }
        t
    };

    /// The constants for folding `j` blocks forward (`j` in 1..8).
    #[inline(always)]
    unsafe fn kb(j: usize) -> a::__m128i {
        debug_assert!((1..8).contains(&j));
        // SAFETY: KB is 16-byte aligned and `j` indexes it (bounds-checked).
        unsafe { a::_mm_load_si128(KB.0[j].as_ptr() as *const a::__m128i) }
    }

    /// `acc` moved forward by the distance `k` holds, without a next block: the two halves'
    /// carry-less products, XORed.
    #[inline(always)]
    unsafe fn shift(acc: a::__m128i, k: a::__m128i) -> a::__m128i {
        // SAFETY: pure register arithmetic; the caller enabled pclmulqdq.
        unsafe {
            a::_mm_xor_si128(
                a::_mm_clmulepi64_si128(acc, k, 0x00),
                a::_mm_clmulepi64_si128(acc, k, 0x11),
            )
        }
    }

    #[inline(always)]
    fn xor4(a0: a::__m128i, a1: a::__m128i, a2: a::__m128i, a3: a::__m128i) -> a::__m128i {
        // SAFETY: register arithmetic (SSE2 is baseline on x86_64).
        unsafe { a::_mm_xor_si128(a::_mm_xor_si128(a0, a1), a::_mm_xor_si128(a2, a3)) }
    }

    #[inline(always)]
    unsafe fn fold(acc: a::__m128i, next: a::__m128i, k: a::__m128i) -> a::__m128i {
        // SAFETY: as shift's.
        unsafe { a::_mm_xor_si128(next, shift(acc, k)) }
    }

    /// The 16 bytes of `d` from `at`, which the caller has checked are there; unaligned.
    #[inline(always)]
    unsafe fn load(d: &[u8], at: usize) -> a::__m128i {
        debug_assert!(at + 16 <= d.len());
        // SAFETY: the caller checked `at + 16 <= d.len()`.
        unsafe { a::_mm_loadu_si128(d.as_ptr().add(at) as *const a::__m128i) }
    }

    #[inline(always)]
    fn mask(m: u128) -> a::__m128i {
        // SAFETY: register arithmetic (SSE2 is baseline on x86_64).
        unsafe { a::_mm_set_epi64x((m >> 64) as i64, m as i64) }
    }

    /// The CRC of `d` (at least 16 bytes; bytes below 64 ORed with `masks`) continuing from
    /// `crc`. Inputs of 64 bytes or more fold four lanes a block each; whatever whole blocks
    /// are left after the last round of four, and the four lanes themselves, are then each
    /// folded straight to the last whole block with that distance's constants, independently,
    /// so that the chain is one fold and an XOR tree. The partial block and the reduction
    /// follow. (`run` gives 65 to 255 bytes, a small WRITE's 120 among them, to
    /// `crc32_masked_short`, which needs no partial-block step.)
    #[target_feature(
        enable = "pclmulqdq",
        enable = "sse2",
        enable = "sse4.1",
        enable = "ssse3"
    )]
    pub(super) unsafe fn crc32_masked(crc: u32, d: &[u8], masks: &Masks) -> u32 {
        // SAFETY: every load is of 16 bytes that the block counts below place inside `d`
        // (`16 * whole <= n`); the rest is register arithmetic with this function's features.
        unsafe {
            let n = d.len();
            debug_assert!(n >= 16);
            let whole = n / 16;
            let init = a::_mm_cvtsi32_si128(!crc as i32);
            let first = a::_mm_xor_si128(a::_mm_or_si128(load(d, 0), mask(masks[0])), init);
            if n < 64 {
                // One to three whole blocks, every one masked, and maybe a masked partial.
                let k1 = kb(1);
                let mut x = first;
                for (j, &m) in masks.iter().enumerate().take(whole).skip(1) {
                    x = fold(x, a::_mm_or_si128(load(d, 16 * j), mask(m)), k1);
                }
                let r = n % 16;
                let keep = (1u128 << (8 * r)) - 1; // r < 16
                let pm = if r > 0 {
                    (masks[whole] & keep) << (8 * (16 - r))
                } else {
                    0
                };
                return finish(x, d, pm);
            }
            let mut x3 = first;
            let mut x2 = a::_mm_or_si128(load(d, 16), mask(masks[1]));
            let mut x1 = a::_mm_or_si128(load(d, 32), mask(masks[2]));
            let mut x0 = a::_mm_or_si128(load(d, 48), mask(masks[3]));
            let k4 = kb(4);
            let mut i = 4; // next whole block
            while i + 4 <= whole {
                x3 = fold(x3, load(d, 16 * i), k4);
                x2 = fold(x2, load(d, 16 * i + 16), k4);
                x1 = fold(x1, load(d, 16 * i + 32), k4);
                x0 = fold(x0, load(d, 16 * i + 48), k4);
                i += 4;
            }
            // t (0..=3) whole blocks remain; everything moves to block whole - 1, each lane
            // and block by its own distance (constant indices: straight-line code per t).
            let b = |j: usize| load(d, 16 * (i + j));
            let x = match whole - i {
                0 => xor4(shift(x3, kb(3)), shift(x2, kb(2)), shift(x1, kb(1)), x0),
                1 => a::_mm_xor_si128(
                    xor4(
                        shift(x3, kb(4)),
                        shift(x2, kb(3)),
                        shift(x1, kb(2)),
                        shift(x0, kb(1)),
                    ),
                    b(0),
                ),
                2 => a::_mm_xor_si128(
                    xor4(
                        shift(x3, kb(5)),
                        shift(x2, kb(4)),
                        shift(x1, kb(3)),
                        shift(x0, kb(2)),
                    ),
                    a::_mm_xor_si128(shift(b(0), kb(1)), b(1)),
                ),
                _ => a::_mm_xor_si128(
                    xor4(
                        shift(x3, kb(6)),
                        shift(x2, kb(5)),
                        shift(x1, kb(4)),
                        shift(x0, kb(3)),
                    ),
                    xor4(
                        shift(b(0), kb(2)),
                        shift(b(1), kb(1)),
                        b(2),
                        a::_mm_setzero_si128(),
                    ),
                ),
            };
            finish(x, d, 0)
        }
    }

    /// From accumulator `x` (the CRC state of `d`'s whole 16-byte blocks, folded) to the end:
    /// the partial block, ORed with `pm` (its masks, already at the top of the block), and the
    /// reduction to 32 bits.
    #[inline]
    #[target_feature(
        enable = "pclmulqdq",
        enable = "sse2",
        enable = "sse4.1",
        enable = "ssse3"
    )]
    unsafe fn finish(mut x: a::__m128i, d: &[u8], pm: u128) -> u32 {
        // SAFETY: the one load is d's last 16 bytes (n >= 16); the rest as crc32_masked's.
        unsafe {
            let n = d.len();
            let k3k4 = kb(1);
            // A final partial block of r bytes: shift the accumulator down by r bytes, bring the
            // new bytes in at the top, and fold the r bytes shifted out back in. The new bytes
            // are the top r of the input's last 16, the others zeroed.
            let r = n % 16;
            if r > 0 {
                let keep = a::_mm_loadu_si128(SLIDE.as_ptr().add(r) as *const a::__m128i);
                let part = a::_mm_or_si128(a::_mm_and_si128(load(d, n - 16), keep), mask(pm));
                let seq = a::_mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
                let shl = a::_mm_add_epi8(seq, a::_mm_set1_epi8(r as i8 - 16));
                let shr = a::_mm_xor_si128(shl, a::_mm_set1_epi8(-128));
                let overflow = a::_mm_shuffle_epi8(x, shl);
                x = a::_mm_xor_si128(a::_mm_shuffle_epi8(x, shr), part);
                x = fold(overflow, x, k3k4);
            }
            reduce(x)
        }
    }

    /// The CRC of the 128-bit accumulator `x` that ends the input: 128 -> 64 bits, then the
    /// Barrett reduction to 32, inverted.
    #[inline]
    #[target_feature(
        enable = "pclmulqdq",
        enable = "sse2",
        enable = "sse4.1",
        enable = "ssse3"
    )]
    unsafe fn reduce(x: a::__m128i) -> u32 {
        // SAFETY: register arithmetic with this function's features.
        unsafe {
            let k3k4 = kb(1);
            let x = a::_mm_xor_si128(
                a::_mm_clmulepi64_si128(x, k3k4, 0x10),
                a::_mm_srli_si128(x, 8),
            );
            let low32 = a::_mm_set_epi32(0, 0, 0, !0);
            let x = a::_mm_xor_si128(
                a::_mm_clmulepi64_si128(a::_mm_and_si128(x, low32), a::_mm_set_epi64x(0, K5), 0x00),
                a::_mm_srli_si128(x, 4),
            );
            let pu = a::_mm_set_epi64x(U_PRIME, P_X);
            let t1 = a::_mm_clmulepi64_si128(a::_mm_and_si128(x, low32), pu, 0x10);
            let t2 = a::_mm_clmulepi64_si128(a::_mm_and_si128(t1, low32), pu, 0x00);
            !(a::_mm_extract_epi32(a::_mm_xor_si128(x, t2), 1) as u32)
        }
    }

    /// Constant pairs that fold a 16-byte block straight to the end of a short input (the
    /// short 512-bit kernel): entry 16(t - 1) + i moves a block whose end lies
    /// d = t + 16(15 - i) bytes before the input's end, t in 1..=16 and i in 0..16, as
    /// k(8d + 32) low and k(8d - 32) high (negative powers for d < 4). A block's pair sits
    /// next to its successor's, so one 64-byte load gives four lanes theirs; four spare
    /// entries keep the last row's loads inside the table (their lanes hold zeros).
    #[repr(align(64))]
    struct ToEnd([[i64; 2]; 16 * 16 + 4]);
    static TO_END: ToEnd = ToEnd({
        let mut e = [[0i64; 2]; 16 * 16 + 4];
        let mut t = 1;
        while t <= 16 {
            let mut i = 0;
            while i < 16 {
                let bits = 8 * (t + 16 * (15 - i)) as i32;
                e[16 * (t - 1) + i] = [
                    super::fold_constant_signed(bits + 32),
                    super::fold_constant_signed(bits - 32),
                ];
                i += 1;
            }
            t += 1;
        }
        e
    });

    /// The same CRC as `crc32_masked`, for 65 to 255 bytes, as the short 512-bit kernel
    /// computes it but one 16-byte block at a time: each whole block but the last (the first
    /// four ORed with the masks) is multiplied straight to the input's end by its own
    /// distance's pair in TO_END, and the products, independent of each other, are XORed
    /// with the last 1 to 16 bytes before the one reduction.
    #[target_feature(
        enable = "pclmulqdq",
        enable = "sse2",
        enable = "sse4.1",
        enable = "ssse3"
    )]
    pub(super) unsafe fn crc32_masked_short(crc: u32, d: &[u8], masks: &Masks) -> u32 {
        // SAFETY: every load of `d` is of 16 bytes inside it (blocks below `16 * f < n`, and
        // the last 16 with n > 64); the constants' loads are of aligned entries of TO_END
        // below its last row's end; the rest is register arithmetic.
        unsafe {
            let n = d.len();
            debug_assert!((65..256).contains(&n));
            let f = (n - 1) / 16; // blocks multiplied to the end: 4..=15
            let t = n - 16 * f; // bytes after them: 1..=16
            let row = TO_END.0.as_ptr().add(16 * (t - 1) + 16 - f);
            let ks = |b: usize| a::_mm_load_si128(row.add(b) as *const a::__m128i);
            let init = a::_mm_cvtsi32_si128(!crc as i32);
            let head = |b: usize| a::_mm_or_si128(load(d, 16 * b), mask(masks[b]));
            let mut x = xor4(
                shift(a::_mm_xor_si128(head(0), init), ks(0)),
                shift(head(1), ks(1)),
                shift(head(2), ks(2)),
                shift(head(3), ks(3)),
            );
            for b in 4..f {
                x = a::_mm_xor_si128(x, shift(load(d, 16 * b), ks(b)));
            }
            let keep = a::_mm_loadu_si128(SLIDE.as_ptr().add(t) as *const a::__m128i);
            reduce(a::_mm_xor_si128(x, a::_mm_and_si128(load(d, n - 16), keep)))
        }
    }

    /// The same CRC as `crc32_masked`, for 65 to 255 bytes: every whole 16-byte block but
    /// the last (with the masks and the initial state in the first four) is multiplied
    /// straight to the input's end by its own distance's constants, four blocks to a 512-bit
    /// VPCLMULQDQ, and the products are XORed together with the last 1 to 16 bytes (a masked
    /// load): no chain of folds, no shuffles for a partial block, one reduction. A 64 B
    /// WRITE's 120 bytes are two loads, four multiplies and the reduction.
    #[target_feature(
        enable = "avx512f",
        enable = "avx512bw",
        enable = "avx512vl",
        enable = "vpclmulqdq",
        enable = "pclmulqdq",
        enable = "sse2",
        enable = "sse4.1",
        enable = "ssse3"
    )]
    pub(super) unsafe fn crc32_masked_short512(crc: u32, d: &[u8], masks: &Masks) -> u32 {
        // SAFETY: the unmasked loads are of d's first 64 bytes and last 16 (n > 64); the
        // masked loads start inside `d` and read no byte at or past `folded <= n`; the
        // constants' loads stay inside TO_END (see there); the rest is register arithmetic
        // with the features this function is compiled for.
        unsafe {
            let n = d.len();
            debug_assert!((65..256).contains(&n));
            let f = (n - 1) / 16; // blocks multiplied to the end: 4..=15
            let t = n - 16 * f; // bytes after them: 1..=16
            let folded = 16 * f;
            // Block b's pair is entry row + b.
            let row = TO_END.0.as_ptr().add(16 * (t - 1) + 16 - f);
            let ks = |b: usize| a::_mm512_loadu_si512(row.add(b) as *const _);
            let z = first512(crc, d, masks);
            let k = ks(0);
            let mut acc = a::_mm512_xor_si512(
                a::_mm512_clmulepi64_epi128(z, k, 0x00),
                a::_mm512_clmulepi64_epi128(z, k, 0x11),
            );
            let mut at = 64;
            while at < folded {
                let left = folded - at;
                let keep = if left >= 64 {
                    !0u64
                } else {
                    (1u64 << left) - 1
                };
                let z = a::_mm512_maskz_loadu_epi8(keep, d.as_ptr().add(at) as *const i8);
                let k = ks(at / 16);
                acc = a::_mm512_ternarylogic_epi64(
                    acc,
                    a::_mm512_clmulepi64_epi128(z, k, 0x00),
                    a::_mm512_clmulepi64_epi128(z, k, 0x11),
                    0x96,
                );
                at += 64;
            }
            // Every lane now ends where the input does: XOR them and the last t bytes.
            let y = a::_mm256_xor_si256(
                a::_mm512_castsi512_si256(acc),
                a::_mm512_extracti64x4_epi64(acc, 1),
            );
            let x = a::_mm_xor_si128(
                a::_mm256_castsi256_si128(y),
                a::_mm256_extracti128_si256(y, 1),
            );
            let last = a::_mm_maskz_loadu_epi8(
                (0xffffu32 << (16 - t)) as u16,
                d.as_ptr().add(n - 16) as *const i8,
            );
            reduce(a::_mm_xor_si128(x, last))
        }
    }

    #[inline(always)]
    unsafe fn fold512(acc: a::__m512i, next: a::__m512i, k: a::__m512i) -> a::__m512i {
        // SAFETY: pure register arithmetic; the caller enabled avx512f and vpclmulqdq.
        unsafe {
            let lo = a::_mm512_clmulepi64_epi128(acc, k, 0x00);
            let hi = a::_mm512_clmulepi64_epi128(acc, k, 0x11);
            a::_mm512_ternarylogic_epi64(next, lo, hi, 0x96) // next ^ lo ^ hi
        }
    }

    /// 64-byte block `i` of `d`.
    #[inline(always)]
    unsafe fn block512(d: &[u8], i: usize) -> a::__m512i {
        let bytes = &d[64 * i..64 * i + 64];
        // SAFETY: `bytes` is 64 readable bytes (checked by the slice); unaligned load.
        unsafe { a::_mm512_loadu_si512(bytes.as_ptr() as *const _) }
    }

    /// The first 64-byte block of `d` with the masks ORed in and the state `crc` XORed into
    /// its first 4 bytes: where both 512-bit kernels start.
    #[inline(always)]
    unsafe fn first512(crc: u32, d: &[u8], masks: &Masks) -> a::__m512i {
        // SAFETY: the masks are 64 readable bytes (four little-endian u128s, the masks in byte
        // order: one load); block512 checks its slice; register arithmetic with the caller's
        // features (avx512f).
        unsafe {
            let m = a::_mm512_loadu_si512(masks.as_ptr() as *const _);
            let init = a::_mm512_castsi128_si512(a::_mm_cvtsi32_si128(!crc as i32));
            a::_mm512_ternarylogic_epi64(block512(d, 0), m, init, 0x56) // (block | m) ^ init
        }
    }

    /// The same CRC as `crc32_masked`, folding four 512-bit lanes (256 bytes) at a time with
    /// VPCLMULQDQ; `d` is at least 256 bytes. The masks apply to the first 64-byte block.
    #[target_feature(
        enable = "avx512f",
        enable = "avx512vl",
        enable = "vpclmulqdq",
        enable = "pclmulqdq",
        enable = "sse2",
        enable = "sse4.1",
        enable = "ssse3"
    )]
    pub(super) unsafe fn crc32_masked_512(crc: u32, d: &[u8], masks: &Masks) -> u32 {
        // SAFETY: loads go through block512 (which bounds-checks its slice) or `load` of 16
        // bytes the loop bound keeps inside `d`; the rest
        // is register arithmetic with the features this function is compiled for.
        unsafe {
            let n = d.len();
            debug_assert!(n >= 256);
            let mut z0 = first512(crc, d, masks);
            let mut z1 = block512(d, 1);
            let mut z2 = block512(d, 2);
            let mut z3 = block512(d, 3);
            let k4 = a::_mm512_broadcast_i32x4(a::_mm_set_epi64x(K2048.1, K2048.0));
            let mut i = 4; // next 64-byte block
            while n - 64 * i >= 256 {
                z0 = fold512(z0, block512(d, i), k4);
                z1 = fold512(z1, block512(d, i + 1), k4);
                z2 = fold512(z2, block512(d, i + 2), k4);
                z3 = fold512(z3, block512(d, i + 3), k4);
                i += 4;
            }
            let k1 = a::_mm512_broadcast_i32x4(a::_mm_set_epi64x(K512.1, K512.0));
            let mut z = fold512(z0, z1, k1);
            z = fold512(z, z2, k1);
            z = fold512(z, z3, k1);
            while n - 64 * i >= 64 {
                z = fold512(z, block512(d, i), k1);
                i += 1;
            }
            // Four 128-bit lanes, lowest first, into one.
            let k3k4 = a::_mm_set_epi64x(K4, K3);
            let mut x = a::_mm512_extracti32x4_epi32(z, 0);
            x = fold(x, a::_mm512_extracti32x4_epi32(z, 1), k3k4);
            x = fold(x, a::_mm512_extracti32x4_epi32(z, 2), k3k4);
            x = fold(x, a::_mm512_extracti32x4_epi32(z, 3), k3k4);
            // Up to three whole 16-byte blocks are left, then the partial one.
            let mut j = 64 * i;
            while j + 16 <= n {
                x = fold(x, load(d, j), k3k4);
                j += 16;
            }
            finish(x, d, 0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_512_bit_kernel_covers_every_length_and_the_cpu_has_it_where_expected() {
        // Every length below 1200: the short kernel's (65 to 255: each count of blocks and
        // each tail length), then each number of 256-byte rounds, single 64-byte blocks and
        // 16-byte and partial tails; masked and not.
        let data: Vec<u8> = (0..1200u32).map(|i| (i * 31 + 7) as u8).collect();
        let masks = [u128::MAX, 0xff << 40, 0, 1 << 127];
        for n in 0..data.len() {
            for m in [[0; 4], masks] {
                assert_eq!(
                    crc32_masked_with(Kernel::Vpclmul512, 0x1234_5678, &data[..n], &m),
                    crc32_masked_scalar(0x1234_5678, &data[..n], &m),
                    "len {n}"
                );
            }
        }
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("vpclmulqdq") && std::is_x86_feature_detected!("avx512f") {
            assert_eq!(kernel(), Kernel::Vpclmul512);
        }
    }

    #[test]
    fn the_128_bit_kernel_covers_every_length() {
        // Every length below 700: each count of four-block rounds with zero to three whole
        // blocks after it, each partial length, masks reaching into the partial block.
        let data: Vec<u8> = (0..700u32).map(|i| (i * 13 + 5) as u8).collect();
        let masks = [u128::MAX, 0xff << 40 | 0xf0, 0x0f << 96, 1 << 127 | 0xff];
        for n in 0..data.len() {
            for m in [[0; 4], masks] {
                assert_eq!(
                    crc32_masked_with(Kernel::Pclmul, 0x8765_4321, &data[..n], &m),
                    crc32_masked_scalar(0x8765_4321, &data[..n], &m),
                    "len {n}"
                );
            }
        }
    }

    #[test]
    fn unmasked_matches_crc32fast() {
        let data: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        for n in 0..data.len() {
            assert_eq!(
                crc32_masked(0, &data[..n], &[0; 4]),
                crc32fast::hash(&data[..n]),
                "len {n}"
            );
        }
    }

    proptest! {
        #[test]
        fn every_kernel_matches_scalar(
            data in proptest::collection::vec(any::<u8>(), 240..1400),
            masks in any::<[u128; 4]>(),
            init in any::<u32>()
        ) {
            let want = crc32_masked_scalar(init, &data, &masks);
            for k in [Kernel::Pclmul, Kernel::Vpclmul512] {
                prop_assert_eq!(crc32_masked_with(k, init, &data, &masks), want, "{:?}", k);
            }
        }

        #[test]
        fn simd_matches_scalar(
            data in proptest::collection::vec(any::<u8>(), 0..400),
            masks in any::<[u128; 4]>(),
            init in any::<u32>()
        ) {
            prop_assert_eq!(crc32_masked(init, &data, &masks), crc32_masked_scalar(init, &data, &masks));
        }
    }
}
