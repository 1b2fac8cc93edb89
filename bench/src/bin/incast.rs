//! DCQCN scenarios in the simulator: N senders stream RDMA WRITEs through a switch (RED ECN
//! marking, shared buffer) to one receiver, every endpoint the real RC engine with its
//! congestion control. Prints a table and, on its last line, Jain's index, utilisation, queue
//! (mean, p99, max), drops and CNPs. Exits 1 on a transport error.
//!
//! `cargo run --release -p bench --bin incast -- --senders 8 --cc dcqcn --link-gbps 100
//! --duration-ms 50 --seed 1 [--plot out.png] [--csv prefix]`

use clap::{Parser, ValueEnum};
use dataplane::cc::{CcKind, DcqcnParams};
use dataplane::sim::Red;
use dataplane::sim::incast::{IncastConfig, IncastReport, Topology, run};
use dataplane::transport::qp::Mtu;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Profile {
    /// The HPCC ns-3 simulator's DCQCN (CC_MODE 1), the published reference.
    HpccNs3,
    /// NVIDIA ConnectX firmware defaults.
    Nvidia,
    /// The DCQCN paper's parameters.
    Paper,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Cc {
    Dcqcn,
    None,
}

#[derive(Debug, Parser)]
#[command(about = "DCQCN incast and parking-lot scenarios in the simulator")]
struct Args {
    /// Senders.
    #[arg(long, default_value_t = 2)]
    senders: usize,
    /// Congestion control.
    #[arg(long, value_enum, default_value_t = Cc::Dcqcn)]
    cc: Cc,
    /// DCQCN parameter set.
    #[arg(long, value_enum, default_value_t = Profile::HpccNs3)]
    profile: Profile,
    /// Rate of every link, Gb/s.
    #[arg(long, default_value_t = 100)]
    link_gbps: u64,
    /// Link delay, microseconds.
    #[arg(long, default_value_t = 1)]
    delay_us: u64,
    /// Simulated time, ms.
    #[arg(long, default_value_t = 50)]
    duration_ms: u64,
    /// Seed of RED's marking draws.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// RED Kmin, KB (1000 B).
    #[arg(long, default_value_t = 400)]
    kmin_kb: u64,
    /// RED Kmax, KB.
    #[arg(long, default_value_t = 1600)]
    kmax_kb: u64,
    /// RED Pmax.
    #[arg(long, default_value_t = 0.2)]
    pmax: f64,
    /// Switch buffer, KB.
    #[arg(long, default_value_t = 32 * 1024 * 1024 / 1000)]
    buffer_kb: u64,
    /// PFC at the switch: pause the senders before the buffer overflows (lossless).
    #[arg(long)]
    pfc: bool,
    /// Path MTU (256, 512, 1024, 2048, 4096).
    #[arg(long, default_value_t = 1024)]
    mtu: u32,
    /// Parking lot with this many switches instead of incast.
    #[arg(long)]
    parking_lot: Option<u8>,
    /// Write a PNG: rate per flow and queue over time.
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
    /// Write <prefix>_throughput.csv (per 100 us bin) and <prefix>_queue.csv (10 us).
    #[arg(long)]
    csv: Option<String>,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let Some(mtu) = Mtu::from_bytes(a.mtu) else {
        eprintln!("incast: --mtu must be 256, 512, 1024, 2048 or 4096");
        return ExitCode::from(2);
    };
    if a.senders == 0 || a.senders > 200 || a.link_gbps == 0 || a.duration_ms == 0 {
        eprintln!("incast: --senders 1-200, --link-gbps and --duration-ms above 0");
        return ExitCode::from(2);
    }
    if !(0.0..=1.0).contains(&a.pmax) || a.kmin_kb > a.kmax_kb {
        eprintln!("incast: --pmax is a probability and --kmin-kb at most --kmax-kb");
        return ExitCode::from(2);
    }
    let params = match a.profile {
        Profile::HpccNs3 => DcqcnParams::hpcc_ns3(),
        Profile::Nvidia => DcqcnParams::nvidia(),
        Profile::Paper => DcqcnParams::paper(),
    };
    let cfg = IncastConfig {
        senders: a.senders,
        cc: match a.cc {
            Cc::Dcqcn => CcKind::Dcqcn,
            Cc::None => CcKind::None,
        },
        params,
        link_bps: a.link_gbps * 1_000_000_000,
        latency: Duration::from_micros(a.delay_us),
        duration: Duration::from_millis(a.duration_ms),
        seed: a.seed,
        red: Red {
            kmin: a.kmin_kb * 1000,
            kmax: a.kmax_kb * 1000,
            pmax: a.pmax,
        },
        buffer_bytes: a.buffer_kb * 1000,
        pfc: a.pfc,
        mtu,
        topology: match a.parking_lot {
            Some(h) => Topology::ParkingLot { hops: h },
            None => Topology::Incast,
        },
        ..IncastConfig::reference(a.senders)
    };
    let wall = std::time::Instant::now();
    let r = run(&cfg);
    let wall = wall.elapsed();
    print_report(&a, &r, wall);
    if let Some(p) = &a.csv
        && let Err(e) = write_csv(p, &r)
    {
        eprintln!("incast: writing CSV: {e}");
        return ExitCode::from(2);
    }
    if let Some(p) = &a.plot
        && let Err(e) = bench::plot::incast(p, &r, &format!("{a:?}"))
    {
        eprintln!("incast: plotting: {e}");
        return ExitCode::from(2);
    }
    if r.errors > 0 {
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

fn print_report(a: &Args, r: &IncastReport, wall: Duration) {
    let rates = r.second_half_rates();
    println!(
        "{}:1 {} ({:?}), {} Gb/s links, {} us delay, {} ms simulated in {:.1} s",
        a.senders,
        match a.cc {
            Cc::Dcqcn => "dcqcn",
            Cc::None => "none",
        },
        a.profile,
        a.link_gbps,
        a.delay_us,
        a.duration_ms,
        wall.as_secs_f64()
    );
    println!(
        "goodput (RDMA payload) {:.2} Gb/s; per flow, wire Gb/s at the receiver:",
        r.payload as f64 * 8.0 / r.duration_ns as f64
    );
    println!("flow  2nd-half Gb/s");
    for (i, x) in rates.iter().enumerate() {
        println!("{i:>4}  {:>12.2}", x / 1e9);
    }
    let (m2, p2, x2) = r.queue_second_half();
    println!(
        "queue 2nd half (10 us samples): mean {:.1} KB, p99 {:.1} KB, max {:.1} KB; above Kmax {:.4} of the run",
        m2 / 1e3,
        p2 as f64 / 1e3,
        x2 as f64 / 1e3,
        r.fraction_above(a.kmax_kb * 1000)
    );
    let settle = |w| match r.settle_ns(w) {
        Some(ns) => format!("{:.1} ms", ns as f64 / 1e6),
        None => "not settled".into(),
    };
    println!(
        "settled within 10% of fair share: {} (100 us bins), {} (1 ms bins); ECN marks {}; PFC pauses {}",
        settle(1),
        settle(10),
        r.marked,
        r.pauses
    );
    println!(
        "jain {:.4} utilisation {:.4} queue mean {:.1} KB p99 {:.1} KB max {:.1} KB drops {} cnps {}",
        r.jain_second_half(),
        r.utilisation(),
        r.port.mean_bytes() / 1e3,
        r.port.quantile_bytes(0.99) as f64 / 1e3,
        r.port.max_bytes as f64 / 1e3,
        r.drops,
        r.cnps
    );
}

fn write_csv(prefix: &str, r: &IncastReport) -> std::io::Result<()> {
    let mut f = std::fs::File::create(format!("{prefix}_throughput.csv"))?;
    let n = r.bins.first().map_or(0, |b| b.len());
    write!(f, "time_us")?;
    for i in 0..n {
        write!(f, ",flow{i}_gbps")?;
    }
    writeln!(f)?;
    for (k, b) in r.bins.iter().enumerate() {
        write!(f, "{}", (k as u64 + 1) * r.bin_ns / 1000)?;
        for x in b {
            write!(f, ",{:.3}", *x as f64 * 8.0 / r.bin_ns as f64)?;
        }
        writeln!(f)?;
    }
    let mut f = std::fs::File::create(format!("{prefix}_queue.csv"))?;
    writeln!(f, "time_us,queue_kb")?;
    for (k, q) in r.queue.iter().enumerate() {
        writeln!(
            f,
            "{},{:.3}",
            k as u64 * r.sample_ns / 1000,
            *q as f64 / 1e3
        )?;
    }
    Ok(())
}
