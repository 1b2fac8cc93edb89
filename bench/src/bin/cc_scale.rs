//! Per-packet cost of DCQCN and pacing on one simulated lcore as the number of rate-limited
//! QPs grows: every QP has DCQCN state and waits in the pacing wheel; the lcore takes the QP
//! whose send time has come, runs its due DCQCN timers, counts the bytes, computes its next send
//! time from its rate and puts it back; every 64th packet a CNP arrives for a random QP. The
//! aggregate rate is the line rate (each QP gets line/N), so every step sends about one packet.
//! Rounds for 1, 1k, 10k and 100k QPs are interleaved with the same loop run with fixed rates
//! and no DCQCN (what pacing and touching per-QP state cost anyway); medians, the ratio to 1 QP
//! and DCQCN's share (the difference) are printed, and the cost of one DCQCN timer event (a
//! rate increase) taken over N QPs in random order. Nothing scans QPs, so what grows with N is
//! cache misses on per-QP state, which the pacing-only loop pays as well.
//!
//! `cargo run --release -p bench --bin cc_scale -- [--packets 2000000] [--rounds 5]`

use clap::Parser;
use dataplane::cc::wheel::PacingWheel;
use dataplane::cc::{Dcqcn, DcqcnParams};
use dataplane::hint::prefetch;
use dataplane::sim::SplitMix64;
use dataplane::time::Instant;
use std::hint::black_box;

#[derive(Debug, Parser)]
#[command(about = "DCQCN + pacing cost per packet against the number of QPs")]
struct Args {
    /// Packets per measurement.
    #[arg(long, default_value_t = 2_000_000)]
    packets: u64,
    /// Interleaved rounds.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
}

const LINE: f64 = 100e9;
const FRAME: u64 = 1086; // a 1024-byte RDMA WRITE Middle on the wire, with preamble and gap

/// Stands in for per-QP state without congestion control: as big as `Dcqcn`, holding a fixed
/// rate, so the baseline pays the same cache misses.
#[derive(Clone, Copy)]
struct Fixed {
    rate: f64,
    _pad: [u8; core::mem::size_of::<Dcqcn>() - 8],
}

/// The lcore's pacing loop over `qps`, started at random offsets within one gap of a QP at
/// line/N: time advances one line-rate packet per step; every QP whose send time has come is
/// served by `serve` (which returns its next send time); `every_64` runs after each 64th
/// packet. Returns ns of wall time per packet.
fn pace<T>(
    qps: &mut [T],
    packets: u64,
    seed: u64,
    mut serve: impl FnMut(&mut T, Instant) -> Instant,
    mut every_64: impl FnMut(&mut [T], Instant, &mut SplitMix64),
) -> f64 {
    let n = qps.len();
    let mut rng = SplitMix64::new(seed);
    // 2^17 slots of 128 ns: one turn is 16.8 ms, longer than the 8.7 ms gap of a 1 Mb/s QP.
    let mut wheel = PacingWheel::new(n, 1 << 17, 128, Instant(0));
    let gap = (FRAME * 8) as f64 * 1e9 / (LINE / n as f64);
    for k in 0..n {
        wheel.insert(k as u32, Instant(rng.below(gap as u64 + 1)));
    }
    let step = (FRAME * 8) as f64 * 1e9 / LINE;
    let mut now = 0f64;
    let mut sent = 0u64;
    let t = std::time::Instant::now();
    while sent < packets {
        now += step;
        let at = Instant(now as u64);
        while let Some(k) = wheel.pop_expired(at) {
            if let Some(nk) = wheel.peek() {
                prefetch(&qps[nk as usize] as *const T);
            }
            let next = serve(&mut qps[k as usize], at);
            wheel.insert(k, next);
            sent += 1;
            if sent.is_multiple_of(64) {
                every_64(qps, at, &mut rng);
            }
        }
    }
    black_box(&qps);
    t.elapsed().as_nanos() as f64 / sent as f64
}

fn after(at: Instant, rate: f64) -> Instant {
    Instant(at.0 + ((FRAME * 8) as f64 * 1e9 / rate) as u64)
}

/// The loop with fixed per-QP rates and no DCQCN: what pacing alone costs.
fn run_fixed(n: usize, packets: u64, seed: u64) -> f64 {
    let mut qps = vec![
        Fixed {
            rate: LINE / n as f64,
            _pad: [0; core::mem::size_of::<Dcqcn>() - 8],
        };
        n
    ];
    pace(
        &mut qps,
        packets,
        seed,
        |q, at| {
            q._pad[0] = q._pad[0].wrapping_add(1);
            after(at, q.rate)
        },
        |_, _, _| {},
    )
}

/// The loop with DCQCN: due timers, the byte counter, the rate; a CNP for a random QP every
/// 64 packets.
fn run(n: usize, packets: u64, seed: u64) -> f64 {
    // Rates held at line/N for the measurement (no increases, cuts by alpha 0), so every
    // step sends one packet; timer events are measured on their own (`timer_events`).
    let p = DcqcnParams {
        rate_to_set_on_first_cnp: ((LINE / n as f64 / 1e6) as u32).max(1),
        rate_reduce_monitor_period: 0,
        initial_alpha_value: 0,
        dce_tcp_g: 1024,
        rpg_time_reset: 10_000_000,
        rpg_byte_reset: 0,
        ..DcqcnParams::nvidia()
    };
    let mut qps: Vec<Dcqcn> = (0..n).map(|_| Dcqcn::new(LINE)).collect();
    for d in qps.iter_mut() {
        d.on_cnp(Instant(0), &p);
    }
    pace(
        &mut qps,
        packets,
        seed,
        |d, at| {
            if d.next_timeout().is_some_and(|t| t <= at) {
                d.handle_timeout(at, &p);
            }
            d.on_sent(FRAME, &p);
            after(at, d.rate())
        },
        |qps, at, rng| {
            let r = rng.below(qps.len() as u64) as usize;
            qps[r].on_cnp(at, &p);
        },
    )
}

/// ns per DCQCN timer event (a rate increase) over N rate-limited QPs taken in random order.
fn timer_events(n: usize, events: u64, seed: u64) -> f64 {
    let p = DcqcnParams {
        rpg_byte_reset: 0,
        rate_reduce_monitor_period: 0,
        ..DcqcnParams::nvidia()
    };
    let mut rng = SplitMix64::new(seed);
    let mut qps: Vec<Dcqcn> = (0..n).map(|_| Dcqcn::new(LINE)).collect();
    let mut now = Instant(0);
    let mut done = 0u64;
    let mut ns = 0u128;
    while done < events {
        // Every QP cut (so its increase timer runs), then its timers fire in random order.
        for d in qps.iter_mut() {
            d.on_cnp(now, &p);
        }
        now = Instant(now.0 + 300_000);
        let order: Vec<u32> = {
            let mut v: Vec<u32> = (0..n as u32).collect();
            for i in (1..v.len()).rev() {
                v.swap(i, rng.below(i as u64 + 1) as usize);
            }
            v
        };
        let t = std::time::Instant::now();
        for k in &order {
            let d = &mut qps[*k as usize];
            if d.next_timeout().is_some_and(|t| t <= now) {
                d.handle_timeout(now, &p);
                done += 1;
            }
        }
        ns += t.elapsed().as_nanos();
    }
    black_box(&qps);
    ns as f64 / done as f64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let a = Args::parse();
    let sizes = [1usize, 1_000, 10_000, 100_000];
    let mut cc: Vec<Vec<f64>> = vec![Vec::new(); sizes.len()];
    let mut fixed: Vec<Vec<f64>> = vec![Vec::new(); sizes.len()];
    for r in 0..a.rounds {
        for (i, n) in sizes.iter().enumerate() {
            cc[i].push(run(*n, a.packets, r as u64 + 1));
            fixed[i].push(run_fixed(*n, a.packets, r as u64 + 1));
        }
    }
    let mut tev: Vec<Vec<f64>> = vec![Vec::new(); sizes.len()];
    for r in 0..a.rounds {
        for (i, n) in sizes.iter().enumerate() {
            tev[i].push(timer_events(*n, a.packets / 4, r as u64 + 1));
        }
    }
    println!(
        "per-QP DCQCN state: {} bytes; medians of {} interleaved rounds of {} packets",
        core::mem::size_of::<Dcqcn>(),
        a.rounds,
        a.packets
    );
    println!(
        "    QPs  pacing+DCQCN ns/pkt  ratio to 1 QP  pacing only ns/pkt  DCQCN's share ns/pkt  timer event ns"
    );
    let c0 = median(&mut cc[0].clone());
    for (i, n) in sizes.iter().enumerate() {
        let (c, f) = (median(&mut cc[i]), median(&mut fixed[i]));
        println!(
            "{n:>7}  {c:>19.1}  {:>13.2}  {f:>18.1}  {:>20.1}  {:>14.1}",
            c / c0,
            c - f,
            median(&mut tev[i])
        );
    }
}
