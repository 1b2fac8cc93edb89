//! roced: the ferroce RoCEv2 appliance daemon.

use clap::Parser;
use controlplane::config::{Config, DEFAULT_CONFIG, Lcores, Mode};
use controlplane::node::{self, RunOptions};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// The ferroce RoCEv2 appliance daemon: DPDK poll-mode ports, one worker per lcore.
///
/// With no --config it runs the embedded default (node A of a two-node memif pair, needing no
/// NIC); `--print-default-config` shows it. Stop it with SIGINT or SIGTERM.
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Args {
    /// TOML configuration file.
    #[arg(short, long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print the embedded default configuration and exit.
    #[arg(long)]
    print_default_config: bool,
    /// Check the configuration and exit (0 if it is good).
    #[arg(long)]
    check: bool,
    /// Worker lcore CPUs, overriding `dataplane.lcores` (like 1 or 0,1).
    #[arg(long, value_delimiter = ',', value_name = "CPUS")]
    lcores: Option<Vec<usize>>,
    /// EAL file prefix, overriding `eal.file_prefix`.
    #[arg(long)]
    file_prefix: Option<String>,
    /// Run without hugepages (slower), overriding `eal.hugepages`.
    #[arg(long)]
    no_huge: bool,
    /// Worker mode, overriding `dataplane.mode`.
    #[arg(long, value_parser = ["stack", "macswap"])]
    mode: Option<String>,
    /// Where the REST API listens (ADDR:PORT, or "off"), overriding `api.listen`.
    #[arg(long, value_name = "ADDR:PORT")]
    api: Option<String>,
    /// Stop by itself after this many seconds.
    #[arg(long, value_name = "SECONDS")]
    duration: Option<f64>,
    /// Ping these addresses from the appliance (repeat or comma-separate).
    #[arg(long, value_delimiter = ',', value_name = "ADDR")]
    ping: Vec<IpAddr>,
    /// Echo requests per pinged address.
    #[arg(long, default_value_t = 5)]
    ping_count: u16,
    /// Milliseconds between echo requests.
    #[arg(long, default_value_t = 200)]
    ping_interval_ms: u64,
    /// Write the final report (counters, port stats, neighbours, pings) as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Log filter (tracing's syntax: info, debug, roced=debug, ...). RUST_LOG also works.
    #[arg(long, default_value = "info")]
    log: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.print_default_config {
        print!("{DEFAULT_CONFIG}");
        return ExitCode::SUCCESS;
    }
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| args.log.clone());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    let cfg = match &args.config {
        Some(p) => Config::load(p),
        None => Ok(Config::embedded()),
    };
    let mut cfg = match cfg {
        Ok(c) => c,
        Err(e) => return fail(2, &e.to_string()),
    };
    if let Some(l) = &args.lcores {
        cfg.dataplane.lcores = Lcores::Cpus(l.clone());
    }
    if let Some(p) = &args.file_prefix {
        cfg.eal.file_prefix = Some(p.clone());
    }
    if let Some(a) = &args.api {
        cfg.api.listen = a.clone();
    }
    if args.no_huge {
        cfg.eal.hugepages = false;
    }
    if let Some(m) = &args.mode {
        cfg.dataplane.mode = if m == "macswap" {
            Mode::Macswap
        } else {
            Mode::Stack
        };
    }
    if let Some(d) = args.duration
        && !(d > 0.0 && d.is_finite())
    {
        return fail(2, "--duration must be a positive number of seconds");
    }
    let plan = match cfg.plan() {
        Ok(p) => p,
        Err(e) => return fail(2, &e.to_string()),
    };
    if args.check {
        println!(
            "configuration is good: {} port(s), {} worker lcore(s)",
            plan.ports.len(),
            plan.eal.worker_cpus.len()
        );
        return ExitCode::SUCCESS;
    }
    // memif sockets conventionally live in /run/ferroce; make sure the directory exists.
    let _ = std::fs::create_dir_all("/run/ferroce");

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            return fail(1, &format!("cannot install signal handler: {e}"));
        }
    }
    let opts = RunOptions {
        duration: args.duration.map(Duration::from_secs_f64),
        ping: args.ping.clone(),
        ping_count: args.ping_count,
        ping_interval: Duration::from_millis(args.ping_interval_ms),
        report: args.report.clone(),
    };
    tracing::info!(dpdk = dataplane::dpdk::DPDK_VERSION, eal = %plan.eal.argv()[1..].join(" "), "starting");
    match node::run(&plan, &opts, stop) {
        Ok(report) => {
            print_summary(&report);
            if report["mbufs_in_use_at_exit"].as_u64().unwrap_or(0) != 0 {
                return fail(1, "stopped, but mbufs were not all returned");
            }
            tracing::info!("stopped cleanly");
            ExitCode::SUCCESS
        }
        Err(e) => fail(1, &e.to_string()),
    }
}

fn fail(code: u8, msg: &str) -> ExitCode {
    eprintln!("roced: {msg}");
    ExitCode::from(code)
}

fn print_summary(r: &serde_json::Value) {
    println!("roced ran {:.1} s", r["uptime_s"].as_f64().unwrap_or(0.0));
    if let Some(ports) = r["ports"].as_array() {
        for (i, p) in ports.iter().enumerate() {
            println!(
                "  port{i} {} ({}, {}): rx {} frames / {} B, tx {} frames / {} B, missed {}",
                p["device"].as_str().unwrap_or(""),
                p["driver"].as_str().unwrap_or(""),
                p["mac"].as_str().unwrap_or(""),
                p["ipackets"],
                p["ibytes"],
                p["opackets"],
                p["obytes"],
                p["imissed"]
            );
        }
    }
    for (key, label) in [("lcores", "lcore"), ("rdma", "rdma lcore")] {
        for l in r[key].as_array().into_iter().flatten() {
            let nonzero: Vec<String> = l["counters"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .filter(|(_, v)| v.as_u64().unwrap_or(0) != 0)
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect()
                })
                .unwrap_or_default();
            if !nonzero.is_empty() || key == "lcores" {
                println!("  {label}{}: {}", l["lcore"], nonzero.join(" "));
            }
        }
    }
    if let Some(ns) = r["neighbors"].as_array() {
        for n in ns {
            println!(
                "  neighbor {} on port{} (lcore{}): {} {}",
                n["ip"].as_str().unwrap_or(""),
                n["port"],
                n["lcore"],
                n["state"].as_str().unwrap_or(""),
                n["mac"].as_str().unwrap_or("")
            );
        }
    }
    if let Some(ps) = r["pings"].as_array() {
        for p in ps {
            println!(
                "  ping {}: {} sent, {} received, rtt min/avg/max {:.1}/{:.1}/{:.1} us",
                p["dst"].as_str().unwrap_or(""),
                p["sent"],
                p["received"],
                p["rtt_min_us"].as_f64().unwrap_or(0.0),
                p["rtt_avg_us"].as_f64().unwrap_or(0.0),
                p["rtt_max_us"].as_f64().unwrap_or(0.0)
            );
        }
    }
}
