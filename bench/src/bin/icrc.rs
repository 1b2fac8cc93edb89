//! ICRC timing with interleaved rounds, so that the machine's drift hits every variant alike:
//! ferroce's ICRC, the naive three crc32fast updates, and the two fastest CRC-32 libraries we
//! know (crc32fast, and crc-fast with its AVX-512 VPCLMULQDQ kernels) over the same bytes in
//! one pass without masks: the floor for a CRC built on one pass, which the issue holds ours to
//! (within 1.1x of the fastest). Reports the median and the minimum over rounds of the mean ns
//! per call, and the ratio of ours to the fastest library's median; then the ICRC on each CRC
//! kernel this CPU has (128-bit PCLMULQDQ, 512-bit VPCLMULQDQ), same rounds. The sizes are
//! what the ICRC covers (IP header to pad) of a 64 B WRITE Only (with its RETH: 120 bytes), a
//! 1 KiB one, and a 4 KiB-MTU WRITE Middle (4136 bytes). Last, the CPU's own ceiling for any
//! CRC that folds with carry-less multiplies: eight independent 512-bit folds (two VPCLMULQDQ
//! and one XOR each, no loads) timed in a loop, as ns per byte folded, and what that makes a
//! 4 KiB frame's 4136 bytes at the least.
//! `cargo run --release -p bench --bin icrc`

use dataplane::wire::crc::{self, Kernel};
use std::hint::black_box;
use std::time::Instant;

/// IPv4 (20) + UDP (8) + BTH (12) + `ext` bytes of extension headers + payload: the bytes the
/// ICRC covers.
fn packet(ext: usize, payload: usize) -> Vec<u8> {
    let mut v = vec![0u8; 40 + ext + payload];
    v[0] = 0x45;
    v[9] = 17;
    for (i, b) in v.iter_mut().enumerate().skip(40) {
        *b = i as u8;
    }
    v
}

fn time(iters: u32, mut f: impl FnMut() -> u32) -> f64 {
    let t = Instant::now();
    let mut acc = 0u32;
    for _ in 0..iters {
        acc ^= f();
    }
    black_box(acc);
    t.elapsed().as_nanos() as f64 / iters as f64
}

fn main() {
    let rounds = 31;
    let iters = 200_000;
    println!(
        "| packet | bytes covered | ours median (min) ns | naive 3 updates median ns | crc32fast 1 pass median (min) ns | crc-fast 1 pass median (min) ns | ours / fastest |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (name, ext, size) in [
        ("64 B WRITE Only", 16, 64usize),
        ("1 KiB WRITE Only", 16, 1024),
        ("4 KiB WRITE Middle", 0, 4096),
    ] {
        let p = packet(ext, size);
        let (mut a, mut b, mut c, mut d) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            a.push(time(iters, || {
                dataplane::wire::icrc::compute(black_box(&p), false).unwrap()
            }));
            b.push(time(iters, || bench::icrc_naive(black_box(&p))));
            c.push(time(iters, || crc32fast::hash(black_box(&p))));
            d.push(time(iters, || crc_fast::crc32_iso_hdlc(black_box(&p))));
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(|x, y| x.total_cmp(y));
            (v[v.len() / 2], v[0])
        };
        let ((am, amin), (bm, _)) = (med(&mut a), med(&mut b));
        let ((cm, cmin), (dm, dmin)) = (med(&mut c), med(&mut d));
        println!(
            "| {name} | {} | {am:.1} ({amin:.1}) | {bm:.1} | {cm:.1} ({cmin:.1}) | {dm:.1} ({dmin:.1}) | {:.2} |",
            p.len(),
            am / cm.min(dm)
        );
    }
    println!();
    println!("ICRC kernel in use: {:?}", crc::kernel());
    println!(
        "| bytes the ICRC covers | 128-bit PCLMULQDQ median (min) ns | 512-bit VPCLMULQDQ median (min) ns | 128 / 512 |"
    );
    println!("|---|---|---|---|");
    let masks = [u128::MAX, 0, 1 << 127, 0xff];
    for size in [120usize, 1064, 4136] {
        let p = packet(0, size - 40);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            a.push(time(iters, || {
                crc::crc32_masked_with(Kernel::Pclmul, 0, black_box(&p), &masks)
            }));
            b.push(time(iters, || {
                crc::crc32_masked_with(Kernel::Vpclmul512, 0, black_box(&p), &masks)
            }));
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(|x, y| x.total_cmp(y));
            (v[v.len() / 2], v[0])
        };
        let ((am, amin), (bm, bmin)) = (med(&mut a), med(&mut b));
        println!(
            "| {size} B | {am:.1} ({amin:.1}) | {bm:.1} ({bmin:.1}) | {:.2} |",
            am / bm
        );
    }
    fold_ceiling(rounds);
}

/// The folding ceiling (see the header): ns per byte, median and minimum over `rounds`.
fn fold_ceiling(rounds: usize) {
    let mut v: Vec<f64> = (0..rounds)
        .filter_map(|_| bench::fold_ns_per_byte())
        .collect();
    println!();
    if v.is_empty() {
        println!("512-bit carry-less folding: this CPU has no VPCLMULQDQ/AVX-512");
        return;
    }
    v.sort_by(|x, y| x.total_cmp(y));
    let (m, min) = (v[v.len() / 2], v[0]);
    println!(
        "512-bit carry-less folding on this CPU, 8 independent lanes: {m:.4} ns per byte (min {min:.4}); 4136 bytes at least {:.1} ns (min {:.1})",
        4136.0 * m,
        4136.0 * min
    );
}
