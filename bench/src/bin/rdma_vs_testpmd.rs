//! RDMA WRITE between two roced nodes against dpdk-testpmd's packet rate, on the same memif
//! vdev, in one run.
//!
//! Baseline: two dpdk-testpmd processes joined by net_memif, one forwarding lcore each on its
//! own CPU: `txonly` on one side, `rxonly` on the other; the receiver's Rx-pps is the vdev's
//! one-way packet rate at a given frame size. ferroce: two roced processes on the same vdev
//! and CPUs, one lcore each, an RC QP pair connected through the REST API (congestion control
//! off), and a stream of WRITEs posted by the sender's lcore itself (`POST /v1/qps/N/stream`,
//! every WR signalled, `depth` outstanding); the rate is completions over the lcore's elapsed
//! time. Rounds alternate the two so both see the same machine; the report gives medians and
//! the ratios the issue asks for:
//! - 64 B WRITE message rate / testpmd packet rate at 64 B frames;
//! - 64 KiB WRITE payload bandwidth / testpmd frame bandwidth at the frames a 4096-byte path
//!   MTU makes (payload only for ferroce, whole frames for testpmd: the ratio is conservative).
//!
//! Then, on the same nodes, short 64 KiB streams alternate between that QP pair and a second
//! one created with `copy_tx` (payloads copied into frames instead of attached from the
//! region), pairing the two ways issue 6 asks to compare under the same machine conditions.

use bench::{MemifPair, Node, median, memif_testpmd_rate};
use clap::Parser;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(about = "RDMA WRITE between two roced nodes vs dpdk-testpmd on memif, in one run")]
struct Args {
    /// The roced binary.
    #[arg(long, default_value = "target/release/roced")]
    roced: PathBuf,
    /// Rounds (each measures testpmd and roced at both sizes).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// testpmd measurement window, seconds.
    #[arg(long, default_value_t = 3)]
    seconds: u64,
    /// 64 B WRITEs per roced round.
    #[arg(long, default_value_t = 1_000_000)]
    small_count: u64,
    /// 64 KiB WRITEs per roced round.
    #[arg(long, default_value_t = 20_000)]
    large_count: u64,
    /// WRITEs outstanding.
    #[arg(long, default_value_t = 128)]
    depth: usize,
    /// Paired 64 KiB streams per round comparing attached and copied payloads.
    #[arg(long, default_value_t = 4)]
    pairs: usize,
    /// CPU of the sender (testpmd txonly, roced node A).
    #[arg(long, default_value_t = 1)]
    tx_cpu: usize,
    /// CPU of the receiver.
    #[arg(long, default_value_t = 0)]
    rx_cpu: usize,
    /// Write the markdown report here too.
    #[arg(long)]
    report: Option<PathBuf>,
}

use bench::BSIZE;
/// The frame a full 4096-byte WRITE MIDDLE packet makes: Ethernet 14, IPv4 20, UDP 8, BTH 12,
/// payload 4096, ICRC 4.
const MTU4096_FRAME: u32 = 14 + 20 + 8 + 12 + 4096 + 4;

fn testpmd_rate(a: &Args, frame: u32, dir: &Path, tag: &str) -> Result<f64, String> {
    memif_testpmd_rate(frame, a.tx_cpu, a.rx_cpu, a.seconds, dir, tag)
}

struct Http(ureq::Agent);

impl Http {
    fn new() -> Self {
        Http(
            ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(600)))
                .build()
                .into(),
        )
    }

    fn call(&self, method: &str, url: &str, body: Option<Value>) -> Result<Value, String> {
        let r = match (method, body) {
            ("GET", _) => self.0.get(url).call(),
            (_, Some(b)) => self
                .0
                .post(url)
                .header("content-type", "application/json")
                .send(b.to_string()),
            (_, None) => self.0.post(url).send(""),
        };
        let mut r = r.map_err(|e| format!("{url}: {e}"))?;
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().map_err(|e| e.to_string())?;
        if !(200..300).contains(&status) {
            return Err(format!("{url}: {status} {text}"));
        }
        serde_json::from_str(&text).map_err(|e| format!("{url}: {e}: {text}"))
    }
}

/// Two roced nodes with a connected QP pair; WRITE streams on it.
struct Pair {
    nodes: MemifPair,
    http: Http,
    qa: u64,
    /// A QP pair like `qa`'s whose frames copy their payload (`copy_tx`).
    qa_copy: u64,
    mra: Value,
    mrb: Value,
}

impl Pair {
    fn start(a: &Args, dir: &Path) -> Result<Pair, String> {
        let nodes = MemifPair::start(
            &a.roced,
            "bench",
            93,
            (a.tx_cpu, a.rx_cpu),
            (7580, 7581),
            dir,
        )?;
        let http = Http::new();
        let (na, nb) = (&nodes.a, &nodes.b);
        let u = |n: &Node, p: &str| format!("http://{}{p}", n.api);
        let reg =
            json!({"length": 64 << 20, "access": ["local-write", "remote-write", "remote-read"]});
        let mra = http.call("POST", &u(na, "/v1/mrs"), Some(reg.clone()))?;
        let mrb = http.call("POST", &u(nb, "/v1/mrs"), Some(reg))?;
        // Two QP pairs: the second copies payloads into frames even where the first attaches
        // them, for the paired comparison of the two.
        let mut qas = Vec::new();
        for copy_tx in [false, true] {
            let qp = json!({"cc": "none", "max_send_wr": 1024, "copy_tx": copy_tx});
            // Each QP starts at the random PSN its creation answers with (sq-psn).
            let a = http.call("POST", &u(na, "/v1/qps"), Some(qp.clone()))?;
            let b = http.call("POST", &u(nb, "/v1/qps"), Some(qp))?;
            let (qa, pa) = (a["qpn"].as_u64().unwrap_or(0), &a["sq-psn"]);
            let (qb, pb) = (b["qpn"].as_u64().unwrap_or(0), &b["sq-psn"]);
            http.call(
                "POST",
                &u(na, &format!("/v1/qps/{qa}/connect")),
                Some(
                    json!({"remote_qpn": qb, "remote_gid": "10.93.0.2", "remote_psn": pb,
                            "mtu": 4096}),
                ),
            )?;
            http.call(
                "POST",
                &u(nb, &format!("/v1/qps/{qb}/connect")),
                Some(
                    json!({"remote_qpn": qa, "remote_gid": "10.93.0.1", "remote_psn": pa,
                            "mtu": 4096}),
                ),
            )?;
            qas.push(qa);
        }
        Ok(Pair {
            nodes,
            http,
            qa: qas[0],
            qa_copy: qas[1],
            mra,
            mrb,
        })
    }

    /// Idle loop iterations of a node's lcore so far.
    fn idle_loops(&self, n: &Node) -> f64 {
        self.http
            .call("GET", &format!("http://{}/v1/stats", n.api), None)
            .ok()
            .and_then(|s| s["lcores"][0]["counters"]["idle_loops"].as_f64())
            .unwrap_or(f64::NAN)
    }

    /// Streams `count` WRITEs of `size` bytes; messages per second. Prints each side's idle
    /// loop iterations per second meanwhile: the side that limits the rate hardly idles.
    fn stream(&self, size: usize, count: u64, depth: usize) -> Result<f64, String> {
        self.stream_on(self.qa, size, count, depth)
    }

    /// The same on the QP `qa` of node A.
    fn stream_on(&self, qa: u64, size: usize, count: u64, depth: usize) -> Result<f64, String> {
        let (ia, ib, t0) = (
            self.idle_loops(&self.nodes.a),
            self.idle_loops(&self.nodes.b),
            Instant::now(),
        );
        let r = self.http.call(
            "POST",
            &format!("http://{}/v1/qps/{qa}/stream", self.nodes.a.api),
            Some(json!({"opcode": "write",
                        "sge": [{"addr": self.mra["addr"], "length": size, "lkey": self.mra["lkey"]}],
                        "remote_addr": self.mrb["addr"], "rkey": self.mrb["rkey"],
                        "count": count, "depth": depth, "timeout_ms": 600_000})),
        )?;
        let secs = t0.elapsed().as_secs_f64();
        eprintln!(
            "  {size} B stream: idle iterations per second: sender {:.0}k, receiver {:.0}k",
            (self.idle_loops(&self.nodes.a) - ia) / secs / 1e3,
            (self.idle_loops(&self.nodes.b) - ib) / secs / 1e3
        );
        let done = r["completed"].as_u64().unwrap_or(0);
        if done != count || r["errors"].as_u64() != Some(0) {
            return Err(format!("stream of {size} B: {r}"));
        }
        Ok(done as f64 / (r["elapsed_ns"].as_f64().unwrap_or(f64::NAN) / 1e9))
    }

    fn stop(self) {
        self.nodes.stop();
    }
}

fn fmt_list(v: &[f64], scale: f64, digits: usize) -> String {
    v.iter()
        .map(|x| format!("{:.*}", digits, x / scale))
        .collect::<Vec<_>>()
        .join(", ")
}

fn main() -> std::process::ExitCode {
    let a = Args::parse();
    let dir = std::env::temp_dir().join(format!("ferroce-bench-rdma-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::create_dir_all("/run/ferroce");
    let (mut tp64, mut tp4k, mut w64, mut w64k) = (vec![], vec![], vec![], vec![]);
    let (mut zc_attach, mut zc_copy) = (vec![], vec![]);
    for round in 0..a.rounds {
        let r = (|| -> Result<(), String> {
            let p = testpmd_rate(&a, 64, &dir, &format!("64-{round}"))?;
            eprintln!("round {round}: testpmd 64 B: {:.2} Mpps", p / 1e6);
            tp64.push(p);
            let p = testpmd_rate(&a, MTU4096_FRAME, &dir, &format!("4k-{round}"))?;
            eprintln!(
                "round {round}: testpmd {MTU4096_FRAME} B: {:.2} Mpps = {:.1} Gb/s",
                p / 1e6,
                p * MTU4096_FRAME as f64 * 8.0 / 1e9
            );
            tp4k.push(p * MTU4096_FRAME as f64 * 8.0);
            let pair = Pair::start(&a, &dir)?;
            let r = (|| {
                let m = pair.stream(64, a.small_count, a.depth)?;
                eprintln!("round {round}: roced 64 B WRITE: {:.3} M msgs/s", m / 1e6);
                w64.push(m);
                let m = pair.stream(64 << 10, a.large_count, a.depth.min(64))?;
                eprintln!(
                    "round {round}: roced 64 KiB WRITE: {:.1} Gb/s",
                    m * 65536.0 * 8.0 / 1e9
                );
                w64k.push(m * 65536.0 * 8.0);
                // Attached vs copied payloads, paired: short streams alternating on the two
                // QP pairs of the same nodes, so drift on this machine hits both alike.
                for k in 0..a.pairs {
                    let order = if k % 2 == 0 {
                        [false, true]
                    } else {
                        [true, false]
                    };
                    for copy in order {
                        let q = if copy { pair.qa_copy } else { pair.qa };
                        let m = pair.stream_on(q, 64 << 10, a.large_count / 4, a.depth.min(64))?;
                        let g = m * 65536.0 * 8.0;
                        if copy {
                            zc_copy.push(g)
                        } else {
                            zc_attach.push(g)
                        }
                    }
                }
                Ok::<(), String>(())
            })();
            pair.stop();
            r
        })();
        if let Err(e) = r {
            eprintln!("rdma_vs_testpmd: {e} (logs in {})", dir.display());
            return std::process::ExitCode::FAILURE;
        }
    }
    let (m_tp64, m_tp4k, m_w64, m_w64k) =
        (median(&tp64), median(&tp4k), median(&w64), median(&w64k));
    let report = format!(
        "# RDMA WRITE between two roced nodes vs dpdk-testpmd (net_memif, one lcore per node)\n\n\
         Sender on CPU {}, receiver on CPU {}; memif bsize {BSIZE} on both kinds of run. \
         testpmd: txonly -> rxonly, the receiver's Rx-pps over {} s. roced: an RC QP pair \
         (path MTU 4096, congestion control off), `POST /v1/qps/N/stream` of signalled WRITEs, \
         {} outstanding ({} for 64 KiB), rate = completions / the lcore's elapsed time. \
         {} rounds, alternating; medians.\n\
         Command: `cargo run --release -p bench --bin rdma_vs_testpmd` (after `cargo build --release -p controlplane`).\n\n\
         | figure | median | rounds |\n|---|---|---|\n\
         | testpmd 64 B frames, Mpps | {:.2} | {} |\n\
         | roced 64 B WRITE, M msgs/s | {:.3} | {} |\n\
         | testpmd {MTU4096_FRAME} B frames, Gb/s (whole frames) | {:.1} | {} |\n\
         | roced 64 KiB WRITE, Gb/s (payload) | {:.1} | {} |\n\n\
         **64 B WRITE rate / testpmd packet rate: {:.3}** (goal >= 0.6)\n\n\
         **64 KiB WRITE bandwidth / testpmd bandwidth: {:.3}** (goal >= 0.9)\n\n\
         Payloads attached (external buffers, 4 KiB segments) vs copied into the frames, 64 KiB WRITEs, \
         {} paired streams of {} per round alternating on two QP pairs of the same nodes: \
         attached {:.1} Gb/s, copied {:.1} Gb/s (medians), **attached / copied {:.3}**; \
         median of the per-pair ratios {:.3}.\n",
        a.tx_cpu,
        a.rx_cpu,
        a.seconds,
        a.depth,
        a.depth.min(64),
        a.rounds,
        m_tp64 / 1e6,
        fmt_list(&tp64, 1e6, 2),
        m_w64 / 1e6,
        fmt_list(&w64, 1e6, 3),
        m_tp4k / 1e9,
        fmt_list(&tp4k, 1e9, 1),
        m_w64k / 1e9,
        fmt_list(&w64k, 1e9, 1),
        m_w64 / m_tp64,
        m_w64k / m_tp4k,
        a.pairs,
        a.large_count / 4,
        median(&zc_attach) / 1e9,
        median(&zc_copy) / 1e9,
        median(&zc_attach) / median(&zc_copy),
        median(
            &zc_attach
                .iter()
                .zip(&zc_copy)
                .map(|(x, y)| x / y)
                .collect::<Vec<_>>()
        ),
    );
    println!("{report}");
    if let Some(p) = &a.report
        && let Err(e) = std::fs::write(p, &report)
    {
        eprintln!("rdma_vs_testpmd: writing {}: {e}", p.display());
        return std::process::ExitCode::FAILURE;
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::process::ExitCode::SUCCESS
}
