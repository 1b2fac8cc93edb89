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
    /// 512-bit VPCLMULQDQ folding (AVX-512), for inputs of 256 bytes or more; shorter ones
    /// take the 128-bit path.
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

/// `k` is one this CPU runs.
#[inline(always)]
fn run(k: Kernel, crc: u32, data: &[u8], masks: &Masks) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if k == Kernel::Vpclmul512 && data.len() >= 256 {
            // SAFETY: the CPU has every feature the kernel is compiled for (kernel()).
            return unsafe { x86::crc32_masked_512(crc, data, masks) };
        }
        if k != Kernel::Scalar && data.len() >= 16 {
            // SAFETY: as above, for the 128-bit kernel's features.
            return unsafe { x86::crc32_masked(crc, data, masks) };
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

    #[inline(always)]
    unsafe fn fold(acc: a::__m128i, next: a::__m128i, k: a::__m128i) -> a::__m128i {
        // SAFETY: pure register arithmetic; the caller enabled pclmulqdq.
        unsafe {
            let lo = a::_mm_clmulepi64_si128(acc, k, 0x00);
            let hi = a::_mm_clmulepi64_si128(acc, k, 0x11);
            a::_mm_xor_si128(a::_mm_xor_si128(next, lo), hi)
        }
    }

    /// Block `i` of `d` (16 bytes from `16 * i`), ORed with its mask if it has one.
    #[inline(always)]
    unsafe fn block(d: &[u8], i: usize, masks: &Masks) -> a::__m128i {
        let bytes = &d[16 * i..16 * i + 16];
        // SAFETY: `bytes` is 16 readable bytes (the slice above checked it); unaligned load.
        let v = unsafe { a::_mm_loadu_si128(bytes.as_ptr() as *const a::__m128i) };
        if i < 4 {
            let m = masks[i];
            // SAFETY: register arithmetic (SSE2 is baseline on x86_64).
            unsafe { a::_mm_or_si128(v, a::_mm_set_epi64x((m >> 64) as i64, m as i64)) }
        } else {
            v
        }
    }

    /// Up to 15 bytes as a zero-padded little-endian 128-bit value, without a trip through
    /// memory (which would stall store forwarding).
    #[inline(always)]
    fn partial(d: &[u8]) -> (u64, u64) {
        fn upto8(r: &[u8]) -> u64 {
            let n = r.len();
            match n {
                0 => 0,
                1..=3 => r.iter().rev().fold(0u64, |v, b| v << 8 | *b as u64),
                _ => {
                    let lo = u32::from_le_bytes(r[..4].try_into().expect("4")) as u64;
                    let hi = u32::from_le_bytes(r[n - 4..n].try_into().expect("4")) as u64;
                    lo | hi << ((n - 4) * 8)
                }
            }
        }
        if d.len() > 8 {
            (upto8(&d[..8]), upto8(&d[8..]))
        } else {
            (upto8(d), 0)
        }
    }

    #[target_feature(
        enable = "pclmulqdq",
        enable = "sse2",
        enable = "sse4.1",
        enable = "ssse3"
    )]
    pub(super) unsafe fn crc32_masked(crc: u32, d: &[u8], masks: &Masks) -> u32 {
        // SAFETY: loads go through `block`, which bounds-checks its slice; the rest is
        // register arithmetic with the features this function is compiled for.
        unsafe {
            let n = d.len();
            let init = a::_mm_cvtsi32_si128(!crc as i32);
            let k3k4 = a::_mm_set_epi64x(K4, K3);
            let mut x;
            let mut i; // next block index
            if n >= 64 {
                let mut x3 = a::_mm_xor_si128(block(d, 0, masks), init);
                let mut x2 = block(d, 1, masks);
                let mut x1 = block(d, 2, masks);
                let mut x0 = block(d, 3, masks);
                let k1k2 = a::_mm_set_epi64x(K2, K1);
                i = 4;
                while n - 16 * i >= 64 {
                    x3 = fold(x3, block(d, i, masks), k1k2);
                    x2 = fold(x2, block(d, i + 1, masks), k1k2);
                    x1 = fold(x1, block(d, i + 2, masks), k1k2);
                    x0 = fold(x0, block(d, i + 3, masks), k1k2);
                    i += 4;
                }
                x = fold(x3, x2, k3k4);
                x = fold(x, x1, k3k4);
                x = fold(x, x0, k3k4);
            } else {
                x = a::_mm_xor_si128(block(d, 0, masks), init);
                i = 1;
            }
            tail(x, d, i, masks)
        }
    }

    /// The 128-bit kernel from accumulator `x` (the CRC state of `d[..16 * i]`, folded) to the
    /// end: whole blocks, the partial one, and the reduction to 32 bits.
    #[inline]
    #[target_feature(
        enable = "pclmulqdq",
        enable = "sse2",
        enable = "sse4.1",
        enable = "ssse3"
    )]
    unsafe fn tail(mut x: a::__m128i, d: &[u8], mut i: usize, masks: &Masks) -> u32 {
        // SAFETY: as crc32_masked's.
        unsafe {
            let n = d.len();
            let k3k4 = a::_mm_set_epi64x(K4, K3);
            while n - 16 * i >= 16 {
                x = fold(x, block(d, i, masks), k3k4);
                i += 1;
            }
            // A final partial block of r bytes: shift the accumulator down by r bytes, bring the
            // new bytes in at the top, and fold the r bytes shifted out back in.
            let r = n - 16 * i;
            if r > 0 {
                let tail = &d[16 * i..];
                let (mut lo, mut hi) = partial(tail);
                // Masks reach here only for inputs under 64 bytes.
                if i < 4 {
                    let m = masks[i];
                    let keep = if r >= 16 {
                        u128::MAX
                    } else {
                        (1u128 << (8 * r)) - 1
                    };
                    let m = m & keep;
                    lo |= m as u64;
                    hi |= (m >> 64) as u64;
                }
                let seq = a::_mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
                let shl = a::_mm_add_epi8(seq, a::_mm_set1_epi8(r as i8 - 16));
                let shr = a::_mm_xor_si128(shl, a::_mm_set1_epi8(-128));
                let overflow = a::_mm_shuffle_epi8(x, shl);
                x = a::_mm_shuffle_epi8(x, shr);
                let part = a::_mm_set_epi64x(hi as i64, lo as i64);
                x = a::_mm_xor_si128(x, a::_mm_shuffle_epi8(part, shl));
                x = fold(overflow, x, k3k4);
            }
            // 128 -> 64 bits, then Barrett reduction to 32.
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
        // SAFETY: loads go through block512/block, which bounds-check their slices; the rest
        // is register arithmetic with the features this function is compiled for.
        unsafe {
            let n = d.len();
            debug_assert!(n >= 256);
            let m = a::_mm512_set_epi64(
                (masks[3] >> 64) as i64,
                masks[3] as i64,
                (masks[2] >> 64) as i64,
                masks[2] as i64,
                (masks[1] >> 64) as i64,
                masks[1] as i64,
                (masks[0] >> 64) as i64,
                masks[0] as i64,
            );
            let init = a::_mm512_castsi128_si512(a::_mm_cvtsi32_si128(!crc as i32));
            // (block 0 | masks) ^ init
            let mut z0 = a::_mm512_ternarylogic_epi64(block512(d, 0), m, init, 0x56);
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
            tail(x, d, 4 * i, masks)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_512_bit_kernel_covers_every_length_and_the_cpu_has_it_where_expected() {
        // Every length from 256 to 1200 (each number of 256-byte rounds, single 64-byte blocks
        // and 16-byte and partial tails), masked and not.
        let data: Vec<u8> = (0..1200u32).map(|i| (i * 31 + 7) as u8).collect();
        let masks = [u128::MAX, 0xff << 40, 0, 1 << 127];
        for n in 256..data.len() {
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
