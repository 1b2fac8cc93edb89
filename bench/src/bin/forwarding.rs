//! Forwarding through the lcore loop, against dpdk-testpmd, on memif, in one run.
//!
//! A generator (dpdk-testpmd, `io` forwarding, primed with `start tx_first N`) and a forwarder
//! (the DUT) are two processes joined by net_memif, each with one forwarding lcore on its own
//! CPU. Frames circulate: the generator sends them, the DUT swaps MACs and sends them back, and
//! the generator returns whatever it receives. The generator's Rx-pps over the measurement window
//! is the loop's rate. The DUT is either dpdk-testpmd in `macswap` mode or roced in `macswap`
//! mode (rx burst, swap MACs, tx burst through roced's lcore loop); rounds alternate between the
//! two so that both see the same machine, and the report gives medians and their ratio.

use bench::{Testpmd, last_rx_pps, median, remove_runtime_dir, wait_or_kill};
use clap::Parser;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(about = "roced's lcore loop against dpdk-testpmd macswap on memif")]
struct Args {
    /// The roced binary.
    #[arg(long, default_value = "target/release/roced")]
    roced: PathBuf,
    /// Rounds (each measures testpmd, then roced).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Bursts of 32 frames the generator puts in flight.
    #[arg(long, default_value_t = 16)]
    bursts: u32,
    /// Measurement window, seconds.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Frame length in bytes (without FCS).
    #[arg(long, default_value_t = 64)]
    frame: u32,
    /// CPU of the generator's forwarding lcore.
    #[arg(long, default_value_t = 0)]
    gen_cpu: usize,
    /// CPU of the DUT's forwarding lcore.
    #[arg(long, default_value_t = 1)]
    dut_cpu: usize,
    /// Write the markdown report here too.
    #[arg(long)]
    report: Option<PathBuf>,
}

const SOCK: &str = "/run/ferroce/bench-fwd.sock";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dut {
    Testpmd,
    Roced,
}

fn eal(cpu: usize, vdev: &str) -> Vec<String> {
    vec![
        "--no-pci".into(),
        "--huge-unlink".into(),
        "--log-level=warning".into(),
        format!(
            "--lcores=0@(0-{}),1@{cpu}",
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
                - 1
        ),
        format!("--vdev={vdev}"),
    ]
}

fn measure(a: &Args, dut: Dut, dir: &std::path::Path, round: usize) -> Result<f64, String> {
    let _ = std::fs::remove_file(SOCK);
    let tag = format!("{dut:?}-{round}").to_lowercase();
    let mut generator = Testpmd::start(
        "ferroce-bench-gen",
        &eal(a.gen_cpu, &format!("net_memif0,role=server,socket={SOCK}")),
        &[
            "--forward-mode=io".into(),
            "--total-num-mbufs=32768".into(),
            format!("--txpkts={}", a.frame.saturating_sub(4).max(60)),
        ],
        &dir.join(format!("gen-{tag}.log")),
    )
    .map_err(|e| format!("dpdk-testpmd: {e}"))?;
    std::thread::sleep(Duration::from_millis(1500));
    let run_for = a.seconds + 8;
    let dut_child = match dut {
        Dut::Testpmd => {
            let mut t = Testpmd::start(
                "ferroce-bench-dut",
                &eal(a.dut_cpu, &format!("net_memif0,role=client,socket={SOCK}")),
                &[
                    "--forward-mode=macswap".into(),
                    "--auto-start".into(),
                    "--total-num-mbufs=16384".into(),
                ],
                &dir.join(format!("dut-{tag}.log")),
            )
            .map_err(|e| format!("dpdk-testpmd: {e}"))?;
            t.cmd("");
            Err(t)
        }
        Dut::Roced => {
            let cfg = dir.join("roced-dut.toml");
            std::fs::write(
                &cfg,
                format!(
                    "[eal]\nfile_prefix = \"ferroce-bench-dut\"\n[dataplane]\nlcores = [{}]\nmode = \"macswap\"\nmbufs = 16383\n\
                     [[ports]]\ndevice = \"net_memif0,role=client,socket={SOCK}\"\n",
                    a.dut_cpu
                ),
            )
            .map_err(|e| e.to_string())?;
            let log = std::fs::File::create(dir.join(format!("dut-{tag}.log")))
                .map_err(|e| e.to_string())?;
            let child = Command::new(&a.roced)
                .arg("--config")
                .arg(&cfg)
                .arg("--duration")
                .arg(run_for.to_string())
                .stdout(log.try_clone().map_err(|e| e.to_string())?)
                .stderr(log)
                .stdin(Stdio::null())
                .spawn()
                .map_err(|e| format!("{}: {e}", a.roced.display()))?;
            Ok(child)
        }
    };
    std::thread::sleep(Duration::from_secs(3));
    generator.cmd(&format!("start tx_first {}", a.bursts));
    std::thread::sleep(Duration::from_secs(2));
    generator.cmd("show port stats 0");
    std::thread::sleep(Duration::from_secs(a.seconds));
    generator.cmd("show port stats 0");
    std::thread::sleep(Duration::from_millis(300));
    generator.cmd("stop");
    let out = generator.quit(Duration::from_secs(10));
    match dut_child {
        Ok(mut child) => {
            // SAFETY: kill(2) on a child we started and have not reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            wait_or_kill(&mut child, Duration::from_secs(10));
        }
        Err(t) => {
            t.quit(Duration::from_secs(10));
        }
    }
    remove_runtime_dir("ferroce-bench-gen");
    let _ = std::fs::remove_file(SOCK);
    last_rx_pps(&out)
        .filter(|r| *r > 0.0)
        .ok_or_else(|| format!("no Rx-pps from the generator ({dut:?}, round {round})"))
}

fn main() {
    let a = Args::parse();
    let dir = std::env::temp_dir().join(format!("ferroce-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let _ = std::fs::create_dir_all("/run/ferroce");
    let mut tp = Vec::new();
    let mut rd = Vec::new();
    for r in 0..a.rounds {
        for dut in [Dut::Testpmd, Dut::Roced] {
            eprint!("round {}/{}: {:?} forwarding ... ", r + 1, a.rounds, dut);
            match measure(&a, dut, &dir, r) {
                Ok(pps) => {
                    eprintln!("{:.2} Mpps", pps / 1e6);
                    if dut == Dut::Testpmd {
                        tp.push(pps)
                    } else {
                        rd.push(pps)
                    }
                }
                Err(e) => {
                    eprintln!("failed: {e} (logs in {})", dir.display());
                    std::process::exit(1);
                }
            }
        }
    }
    let (mt, mr) = (median(&tp), median(&rd));
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{:.2}", x / 1e6))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let report = format!(
        "# Forwarding through the lcore loop vs dpdk-testpmd macswap (net_memif, {} B frames)\n\n\
         Generator: dpdk-testpmd io forwarding, primed with {} bursts of 32, on CPU {}; DUT on CPU {}.\n\
         Rate = generator Rx-pps over {} s, {} rounds alternating DUTs.\n\n\
         | DUT | median Mpps | rounds (Mpps) |\n|---|---|---|\n\
         | dpdk-testpmd macswap | {:.2} | {} |\n| roced macswap (lcore loop) | {:.2} | {} |\n\n\
         **ratio roced / testpmd: {:.3}** (goal >= 0.9)\n",
        a.frame,
        a.bursts,
        a.gen_cpu,
        a.dut_cpu,
        a.seconds,
        a.rounds,
        mt / 1e6,
        fmt(&tp),
        mr / 1e6,
        fmt(&rd),
        mr / mt
    );
    println!("{report}");
    if let Some(p) = &a.report {
        std::fs::write(p, &report).expect("writing report");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
