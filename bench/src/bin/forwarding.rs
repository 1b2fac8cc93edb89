//! Forwarding through the lcore loop, against dpdk-testpmd, on memif, in one run.
//!
//! A generator (dpdk-testpmd, `io` forwarding, primed with `start tx_first N`) and a forwarder
//! (the DUT) are two processes joined by net_memif, each with one forwarding lcore on its own
//! CPU. Frames circulate: the generator sends them, the DUT swaps MACs and sends them back, and
//! the generator returns whatever it receives. The generator's Rx-pps over the measurement window
//! is the loop's rate. The DUT is either dpdk-testpmd in `macswap` mode or roced in `macswap`
//! mode (rx burst, swap MACs, tx burst through roced's lcore loop); rounds alternate between the
//! two so that both see the same machine, and the report gives medians and their ratio.
//!
//! Two topologies, both measured:
//! - `zc` (the headline): the generator is the memif client with `zero-copy=yes`, so it copies
//!   nothing and the DUT (server) does the copying for both directions: the DUT's share of the
//!   loop is as large as memif allows.
//! - `copy`: both sides copy (generator server, DUT client), as two ordinary memif processes.

use bench::{Testpmd, last_rx_pps, median, remove_runtime_dir, testpmd_eal, wait_or_kill};
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
    /// Rounds per topology (each measures testpmd, then roced). The machine is noisy: single
    /// rounds vary by 10-20%, so the report gives medians.
    #[arg(long, default_value_t = 5)]
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
    /// Topologies to measure: zc, copy (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [String::from("zc"), String::from("copy")])]
    topology: Vec<String>,
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

/// A running DUT: dpdk-testpmd or roced.
enum DutProc {
    Testpmd(Testpmd),
    Roced(std::process::Child),
}

impl DutProc {
    fn stop(self) {
        match self {
            DutProc::Roced(mut child) => {
                // SAFETY: kill(2) on a child we started and have not reaped.
                unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
                wait_or_kill(&mut child, Duration::from_secs(10));
            }
            DutProc::Testpmd(t) => {
                t.quit(Duration::from_secs(10));
            }
        }
    }
}

fn start_dut(
    a: &Args,
    dut: Dut,
    role: &str,
    dir: &std::path::Path,
    tag: &str,
) -> Result<DutProc, String> {
    let vdev = format!("net_memif0,role={role},socket={SOCK}");
    let log = dir.join(format!("dut-{tag}.log"));
    match dut {
        Dut::Testpmd => {
            let mut t = Testpmd::start(
                "ferroce-bench-dut",
                &testpmd_eal(a.dut_cpu, &vdev),
                &[
                    "--forward-mode=macswap".into(),
                    "--auto-start".into(),
                    "--total-num-mbufs=16384".into(),
                ],
                &log,
            )
            .map_err(|e| format!("dpdk-testpmd: {e}"))?;
            t.cmd("");
            Ok(DutProc::Testpmd(t))
        }
        Dut::Roced => {
            let cfg = dir.join("roced-dut.toml");
            std::fs::write(
                &cfg,
                format!(
                    "[eal]\nfile_prefix = \"ferroce-bench-dut\"\n[dataplane]\nlcores = [{}]\nmode = \"macswap\"\n\
                     mbufs = 16383\n[[ports]]\ndevice = \"{vdev}\"\n",
                    a.dut_cpu
                ),
            )
            .map_err(|e| e.to_string())?;
            let out = std::fs::File::create(&log).map_err(|e| e.to_string())?;
            let child = Command::new(&a.roced)
                .arg("--config")
                .arg(&cfg)
                .stdout(out.try_clone().map_err(|e| e.to_string())?)
                .stderr(out)
                .stdin(Stdio::null())
                .spawn()
                .map_err(|e| format!("{}: {e}", a.roced.display()))?;
            Ok(DutProc::Roced(child))
        }
    }
}

fn measure(
    a: &Args,
    topo: &str,
    dut: Dut,
    dir: &std::path::Path,
    round: usize,
) -> Result<f64, String> {
    let _ = std::fs::remove_file(SOCK);
    let tag = format!("{topo}-{dut:?}-{round}").to_lowercase();
    let zc = topo == "zc";
    // The memif server must listen before the client connects.
    let mut dut_proc = None;
    if zc {
        dut_proc = Some(start_dut(a, dut, "server", dir, &tag)?);
        std::thread::sleep(Duration::from_millis(1500));
    }
    let mut gen_eal = testpmd_eal(
        a.gen_cpu,
        &format!(
            "net_memif0,role={},socket={SOCK}{}",
            if zc { "client" } else { "server" },
            if zc { ",zero-copy=yes" } else { "" }
        ),
    );
    if zc {
        // A zero-copy client shares its own memory with the server: one file per segment list.
        // (--huge-unlink cannot go with it, so its hugepage files are removed afterwards.)
        gen_eal.retain(|x| x != "--huge-unlink");
        gen_eal.push("--single-file-segments".into());
    }
    let generator = Testpmd::start(
        "ferroce-bench-gen",
        &gen_eal,
        &[
            "--forward-mode=io".into(),
            "--total-num-mbufs=32768".into(),
            format!("--txpkts={}", a.frame.saturating_sub(4).max(60)),
        ],
        &dir.join(format!("gen-{tag}.log")),
    );
    let mut generator = match generator {
        Ok(g) => g,
        Err(e) => {
            if let Some(d) = dut_proc {
                d.stop();
            }
            return Err(format!("dpdk-testpmd: {e}"));
        }
    };
    if !zc {
        std::thread::sleep(Duration::from_millis(1500));
        dut_proc = Some(start_dut(a, dut, "client", dir, &tag)?);
    }
    std::thread::sleep(Duration::from_secs(3));
    generator.cmd(&format!("start tx_first {}", a.bursts));
    std::thread::sleep(Duration::from_secs(2));
    generator.cmd("show port stats 0");
    std::thread::sleep(Duration::from_secs(a.seconds));
    generator.cmd("show port stats 0");
    std::thread::sleep(Duration::from_millis(300));
    generator.cmd("stop");
    let out = generator.quit(Duration::from_secs(10));
    if let Some(d) = dut_proc {
        d.stop();
    }
    remove_runtime_dir("ferroce-bench-gen");
    let _ = std::fs::remove_file(SOCK);
    last_rx_pps(&out)
        .filter(|r| *r > 0.0)
        .ok_or_else(|| format!("no Rx-pps from the generator ({topo}, {dut:?}, round {round})"))
}

fn main() {
    let a = Args::parse();
    let dir = std::env::temp_dir().join(format!("ferroce-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let _ = std::fs::create_dir_all("/run/ferroce");
    let mut report = format!(
        "# Forwarding through the lcore loop vs dpdk-testpmd macswap (net_memif, {} B frames)\n\n\
         Generator: dpdk-testpmd io forwarding, primed with {} bursts of 32, on CPU {}; DUT on CPU {}.\n\
         Rate = generator Rx-pps over {} s; {} rounds per topology, alternating testpmd and roced as the DUT.\n\
         Command: `make bench` (target/release/forwarding).\n",
        a.frame, a.bursts, a.gen_cpu, a.dut_cpu, a.seconds, a.rounds
    );
    for topo in &a.topology {
        if topo != "zc" && topo != "copy" {
            eprintln!("unknown topology {topo:?}: zc or copy");
            std::process::exit(2);
        }
        let mut tp = Vec::new();
        let mut rd = Vec::new();
        for r in 0..a.rounds {
            for dut in [Dut::Testpmd, Dut::Roced] {
                eprint!(
                    "{topo} round {}/{}: {:?} forwarding ... ",
                    r + 1,
                    a.rounds,
                    dut
                );
                match measure(&a, topo, dut, &dir, r) {
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
        let what = if topo == "zc" {
            "generator = memif client with zero-copy, DUT = server (copies both ways)"
        } else {
            "generator = memif server, DUT = client, both copy"
        };
        report += &format!(
            "\n## Topology `{topo}`: {what}\n\n| DUT | median Mpps | rounds (Mpps) |\n|---|---|---|\n\
             | dpdk-testpmd macswap | {:.2} | {} |\n| roced macswap (lcore loop) | {:.2} | {} |\n\n\
             **ratio roced / testpmd: {:.3}** (goal >= 0.9)\n",
            mt / 1e6,
            fmt(&tp),
            mr / 1e6,
            fmt(&rd),
            mr / mt
        );
    }
    println!("{report}");
    if let Some(p) = &a.report {
        std::fs::write(p, &report).expect("writing report");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
