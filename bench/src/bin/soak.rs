//! The transport soak from the command line: random work requests of every opcode between RC
//! QP pairs, through the simulator with the fault mix you give, checked against a reference
//! model. Prints one line; exits 1 on any violation (the line names the seed).
//!
//! `cargo run --release -p bench --bin soak -- --seed 7 --qps 8 --ops 100000 --loss 0.01
//! --reorder 0.01 --dup 0.01 --corrupt 0.001`

use clap::Parser;
use dataplane::sim::Faults;
use dataplane::sim::soak::{SoakConfig, run};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(about = "RC transport soak in the simulator, checked against a reference model")]
struct Args {
    /// Seed of the work requests and of the faults.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// QP pairs (1-8).
    #[arg(long, default_value_t = 4)]
    qps: usize,
    /// Work requests in all.
    #[arg(long, default_value_t = 10_000)]
    ops: usize,
    /// Largest message, bytes (at most 1 MiB).
    #[arg(long, default_value_t = 1 << 20)]
    max_size: u32,
    /// Work requests outstanding per QP.
    #[arg(long, default_value_t = 16)]
    depth: usize,
    /// Loss probability per frame.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Reordering probability per frame (held back 3 us).
    #[arg(long, default_value_t = 0.0)]
    reorder: f64,
    /// Duplication probability per frame.
    #[arg(long, default_value_t = 0.0)]
    dup: f64,
    /// Bit-corruption probability per frame.
    #[arg(long, default_value_t = 0.0)]
    corrupt: f64,
    /// CE-marking probability per ECN-capable frame.
    #[arg(long, default_value_t = 0.0)]
    ce: f64,
}

fn main() -> ExitCode {
    let a = Args::parse();
    for (name, p) in [
        ("loss", a.loss),
        ("reorder", a.reorder),
        ("dup", a.dup),
        ("corrupt", a.corrupt),
        ("ce", a.ce),
    ] {
        if !(0.0..=1.0).contains(&p) {
            eprintln!("soak: --{name} must be a probability between 0 and 1");
            return ExitCode::from(2);
        }
    }
    if a.max_size > 1 << 20 || !(1..=8).contains(&a.qps) || a.depth == 0 {
        eprintln!("soak: --max-size at most 1048576, --qps 1 to 8, --depth at least 1");
        return ExitCode::from(2);
    }
    let cfg = SoakConfig {
        seed: a.seed,
        qps: a.qps,
        ops: a.ops,
        max_size: a.max_size,
        depth: a.depth,
        faults: Faults {
            loss: a.loss,
            reorder: a.reorder,
            reorder_delay: Duration::from_micros(3),
            duplicate: a.dup,
            corrupt: a.corrupt,
            ce_mark: a.ce,
            burst: None,
        },
    };
    let t = Instant::now();
    let r = run(&cfg);
    println!(
        "soak seed {} qps {} ops {}: {} completed, {:.1} MB moved, {} frames ({} lost, {} duplicated, {} reordered, {} corrupted), {} gave up (RETRY_EXC_ERR), {} flushed, {} receives flushed, {} never posted (every pair dead), {:.1} ms simulated, {:.1} s wall: {}",
        a.seed,
        a.qps,
        a.ops,
        r.completed,
        r.bytes as f64 / 1e6,
        r.frames,
        r.lost,
        r.duplicated,
        r.reordered,
        r.corrupted,
        r.retry_exceeded,
        r.flushed,
        r.recv_flushed,
        r.abandoned,
        r.sim_ns as f64 / 1e6,
        t.elapsed().as_secs_f64(),
        r.violation.as_deref().unwrap_or("OK")
    );
    if r.violation.is_some() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
