//! The perftest report, in one run on this machine: dpdk-testpmd's limit on memif; ferroce
//! node to node over memif with `rocectl perf` (perftest's tests and exchange) for WRITE,
//! READ and SEND bandwidth from 64 B to 1 MiB, latency, and the atomic rate; the kernel's TCP
//! and UDP on loopback and across a veth (UDP ping-pong, TCP stream, UDP datagram rate). It
//! writes a markdown report with every figure, the ratios to testpmd and to the kernel, and
//! PNG plots (bandwidth against size, latency CDF). Progress goes to stderr.
//!
//!     cargo run --release -p bench --bin perf_report -- --report bench/results/DATE.md
//!
//! CPUs: the sending side (testpmd txonly, the client node, the kernel client) on `--tx-cpu`,
//! the receiving side on `--rx-cpu`.

use bench::kernel::{Server, pin_thread};
use bench::{MemifPair, median, memif_testpmd_rate};
use clap::Parser;
use serde_json::Value;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(about = "perftest-style report: ferroce on memif vs dpdk-testpmd and the kernel")]
struct Args {
    /// The roced binary.
    #[arg(long, default_value = "target/release/roced")]
    roced: PathBuf,
    /// Write the markdown report here (plots beside it, same name with suffixes).
    #[arg(long)]
    report: Option<PathBuf>,
    /// testpmd measurement window, seconds.
    #[arg(long, default_value_t = 3)]
    seconds: u64,
    /// Seconds of each kernel stream.
    #[arg(long, default_value_t = 2.0)]
    kernel_seconds: f64,
    /// Fewer sizes and iterations (a smoke run).
    #[arg(long)]
    quick: bool,
    /// CPU of the sending side.
    #[arg(long, default_value_t = 1)]
    tx_cpu: usize,
    /// CPU of the receiving side.
    #[arg(long, default_value_t = 0)]
    rx_cpu: usize,
    /// The receiving node's (a's) lcores, one per CPU listed (default: --rx-cpu): the CPU
    /// layout of a larger machine; on this 2-CPU one the report runs one lcore a node.
    #[arg(long, value_delimiter = ',')]
    rx_lcores: Option<Vec<usize>>,
    /// The sending node's (b's) lcores (default: --tx-cpu).
    #[arg(long, value_delimiter = ',')]
    tx_lcores: Option<Vec<usize>>,
    /// CPUs of the applications run through the compatibility library: the server's (beside
    /// the receiving node), then the client's (default: the nodes' own CPUs, shared with
    /// their lcores, as on a 2-CPU machine they must be).
    #[arg(long, value_delimiter = ',', num_args = 2)]
    app_cpus: Option<Vec<usize>>,
    #[command(subcommand)]
    cmd: Option<Sub>,
}

#[derive(Debug, clap::Subcommand)]
enum Sub {
    /// (internal) the kernel baselines' server, on IP.
    Serve { ip: String },
    /// Only the QP scaling rows (these counts) and the idle-QP step (this many; 0 skips it).
    Scale {
        #[arg(long, value_delimiter = ',', default_values_t = QP_COUNTS)]
        qps: Vec<usize>,
        #[arg(long, default_value_t = 1_000_000)]
        idle: usize,
    },
    /// Only the report's per-byte costs (the ICRCs, the libraries, the copy, the CPU's
    /// folding ceiling), timed as the report times them, on the receiving node's CPU.
    Costs,
}

/// What one `rocectl perf` run gave (the client's JSON).
type Run = Value;

struct Progress {
    step: usize,
    total: usize,
    t0: Instant,
}

impl Progress {
    fn say(&mut self, what: &str) {
        self.step += 1;
        eprintln!(
            "[{:>3}/{}] {:>6.1}s  {what}",
            self.step,
            self.total,
            self.t0.elapsed().as_secs_f64()
        );
    }
}

/// Runs `rocectl perf ARGS` with node `server` serving and node `client` connecting, through
/// perftest's exchange on TCP `port`; the client's and the server's JSON.
fn perf(server: &str, client: &str, args: &[&str], port: u16) -> Result<(Run, Run), String> {
    let p = port.to_string();
    let mut sargs: Vec<String> = ["rocectl", "--api", server, "--json", "perf"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    sargs.extend(args.iter().map(|s| s.to_string()));
    sargs.extend(["--server", "-p", &p, "--timeout", "60"].map(String::from));
    let srv = std::thread::spawn(move || {
        let (mut o, mut e) = (Vec::new(), Vec::new());
        let code = cli::ctl::run(sargs, &mut o, &mut e);
        (
            code,
            String::from_utf8_lossy(&o).into_owned(),
            String::from_utf8_lossy(&e).into_owned(),
        )
    });
    let mut cargs = vec!["rocectl", "--api", client, "--json", "perf"];
    cargs.extend_from_slice(args);
    cargs.extend(["127.0.0.1", "-p", &p, "--timeout", "60"]);
    let (mut o, mut e) = (Vec::new(), Vec::new());
    let code = cli::ctl::run(cargs, &mut o, &mut e);
    let (scode, sout, serr) = srv.join().map_err(|_| "server thread panicked")?;
    if code != 0 || scode != 0 {
        return Err(format!(
            "perf {args:?}: client exit {code}: {} / server exit {scode}: {serr}",
            String::from_utf8_lossy(&e)
        ));
    }
    let parse = |s: &str| serde_json::from_str::<Value>(s.trim()).map_err(|e| format!("{e}: {s}"));
    Ok((parse(&String::from_utf8_lossy(&o))?, parse(&sout)?))
}

/// Where the library's server and client applications run.
fn app_cpus(a: &Args) -> (usize, usize) {
    match a.app_cpus.as_deref() {
        Some([s, c]) => (*s, *c),
        _ => (a.rx_cpu, a.tx_cpu),
    }
}

/// One run of an unmodified perftest tool on both nodes through libferroce_ibverbs.so (issue
/// 21): the server on node A's attach socket, the client on node B's, each pinned where
/// [`app_cpus`] says. The figures of the client's result line (perftest's own columns).
fn lib_perf(a: &Args, tool: &str, args: &[&str], port: u16) -> Result<Vec<f64>, String> {
    use std::process::{Command, Stdio};
    let lib = a
        .roced
        .parent()
        .unwrap_or(Path::new("."))
        .join("libferroce_ibverbs.so");
    if !lib.exists() {
        return Err(format!("{} is not built", lib.display()));
    }
    let p = port.to_string();
    let (scpu, ccpu) = app_cpus(a);
    let spawn = |sock: &str, cpu: usize, peer: Option<&str>| {
        let mut c = Command::new("taskset");
        c.args(["-c", &cpu.to_string(), tool])
            .args(args)
            .args([
                "-d",
                "ferroce0",
                "-x",
                "1",
                "-F",
                "--report_gbits",
                "-p",
                &p,
            ])
            .args(peer)
            .env("LD_PRELOAD", &lib)
            .env("FERROCE_SOCKET", sock)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c.spawn().map_err(|e| format!("{tool}: {e}"))
    };
    let server = spawn("/run/ferroce/ferroce-report-a.sock", scpu, None)?;
    // Listening when its port shows in /proc/net/tcp in state LISTEN (0A).
    let hex = format!(":{port:04X} ");
    let t = Instant::now();
    while !std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains(&hex) && l.split_whitespace().nth(3) == Some("0A"))
    {
        if t.elapsed() > Duration::from_secs(20) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let client = spawn(
        "/run/ferroce/ferroce-report-b.sock",
        ccpu,
        Some("127.0.0.1"),
    )?;
    let wait = |c: std::process::Child| {
        let pid = c.id();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(c.wait_with_output());
        });
        match rx.recv_timeout(Duration::from_secs(180)) {
            Ok(Ok(o)) => Ok(o),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
                Err(format!("{tool} did not finish in 180 s"))
            }
        }
    };
    let (c, s) = (wait(client), wait(server));
    let (c, s) = (c?, s?);
    let text = |o: &std::process::Output| {
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
    };
    if !c.status.success() || !s.status.success() {
        return Err(format!(
            "{tool} {args:?}: client {}, server {}: {}",
            c.status,
            s.status,
            text(&c).lines().last().unwrap_or("")
        ));
    }
    let out = text(&c);
    let lines: Vec<&str> = out.lines().collect();
    lines
        .iter()
        .position(|l| l.contains("#bytes"))
        .and_then(|i| lines.get(i + 1))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect()
        })
        .ok_or_else(|| format!("{tool}: no result line in:\n{out}"))
}

/// `bash scripts/stream-cost.sh`'s two figures: instructions per 64 B WRITE of the built-in
/// stream and of the same stream through an application's rings.
/// Instructions per 64 B WRITE, both ends (`scripts/stream-cost.sh`): the built-in stream and
/// the same through an application's rings, each with every request signalled and with one in
/// 100 (perftest's --cq-mod).
#[derive(Clone, Copy, Debug)]
struct Counted {
    builtin: u64,
    builtin_q100: u64,
    app: u64,
    app_q100: u64,
}

fn stream_costs() -> Result<Counted, String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new("bash")
        .arg("scripts/stream-cost.sh")
        .current_dir(&root)
        .output()
        .map_err(|e| format!("bash scripts/stream-cost.sh: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!("scripts/stream-cost.sh failed: {}", err.trim()));
    }
    // "stream_cost (built-in) --cq-mod 1: N instructions per 64 B WRITE", and so on.
    let figure = |tag: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{tag}:")))
            .and_then(|l| l.split(": ").nth(1)?.split(' ').next()?.parse::<u64>().ok())
            .ok_or_else(|| format!("no '{tag}' figure in: {}", text.trim()))
    };
    Ok(Counted {
        builtin: figure("stream_cost (built-in) --cq-mod 1")?,
        builtin_q100: figure("stream_cost (built-in) --cq-mod 100")?,
        app: figure("stream_cost --app --cq-mod 1")?,
        app_q100: figure("stream_cost --app --cq-mod 100")?,
    })
}

/// One library run: the tool, the message size, perftest's figures or why there are none.
type AppRun<'a> = (&'a str, u64, Result<Vec<f64>, String>);

/// The section on applications: the library's figures beside the built-in engine's.
fn app_section(
    a: &Args,
    apps: &[AppRun<'_>],
    bw: &[(&str, u64, Run)],
    lat: &[(&str, u64, Run)],
    counted: &Result<Counted, String>,
) -> String {
    let (scpu, ccpu) = app_cpus(a);
    let mut md = String::new();
    let _ = writeln!(md, "\n## Applications through libferroce_ibverbs.so\n");
    let shared = |cpu: usize, node: usize| {
        if cpu == node {
            format!("CPU {cpu}, shared with that node's lcore")
        } else {
            format!("CPU {cpu}")
        }
    };
    let _ = writeln!(
        md,
        "Unmodified perftest 4.5 from Debian (`ib_write_bw`, `ib_write_lat`, `-m 4096 -x 1 \
         --report_gbits`) with `LD_PRELOAD=libferroce_ibverbs.so`, attached to the two nodes \
         above, beside `rocectl perf` (the engine's own perftest) from the same run. The \
         server tool runs on {}, the client on {} (`--app-cpus`). On a 2-CPU machine each \
         application shares its CPU with an lcore that busy-polls, so the library's figures \
         here are the scheduler's as much as ferroce's; rerun with `--app-cpus` on a larger \
         machine.\n",
        shared(scpu, a.rx_cpu),
        shared(ccpu, a.tx_cpu)
    );
    // What the CPU layout cannot blur: instructions, counted.
    match counted {
        Ok(c) => {
            let _ = writeln!(
                md,
                "Instructions per 64 B WRITE, both ends, counted by callgrind in this run \
                 (`bash scripts/stream-cost.sh`: `stream_cost`, one build of the `cost` \
                 profile), every request signalled: the built-in stream {}, the same stream \
                 through an application's rings with the application's post and poll {}: \
                 {:+}; one in 100 signalled (perftest's --cq-mod): {} and {}.\n",
                c.builtin,
                c.app,
                c.app as i64 - c.builtin as i64,
                c.builtin_q100,
                c.app_q100
            );
        }
        Err(e) => {
            let _ = writeln!(
                md,
                "Instructions per message through the rings: not counted ({e}).\n"
            );
        }
    }
    let _ = writeln!(
        md,
        "| test | through the library | rocectl perf | library / built-in |"
    );
    let _ = writeln!(md, "|---|---|---|---|");
    for (tool, size, r) in apps {
        let lat_test = tool.ends_with("_lat");
        // perftest's columns: bw: bytes, iterations, peak, average (Gb/s), Mpps; lat: bytes,
        // iterations, t_min, t_max, t_typical, ...
        let (mine, unit) = match r {
            Ok(v) if lat_test => (v.get(4).copied(), "us typical"),
            Ok(v) if *size == 64 => (v.get(4).copied(), "Mpps"),
            Ok(v) => (v.get(3).copied(), "Gbit/s"),
            Err(_) => (None, ""),
        };
        let builtin = if lat_test {
            lat.iter()
                .find(|x| x.0 == "write" && x.1 == *size)
                .and_then(|x| x.2["latency_us"]["typical"].as_f64())
        } else {
            let k = if *size == 64 {
                "msg_rate_mpps"
            } else {
                "gbit_s"
            };
            bw.iter()
                .find(|x| x.0 == "write" && x.1 == *size)
                .map(|x| f(&x.2, k))
        };
        let name = format!("{tool} -s {size}");
        match (mine, r) {
            (Some(m), _) => {
                let b = builtin.unwrap_or(f64::NAN);
                let _ = writeln!(
                    md,
                    "| {name} | {m:.3} {unit} | {b:.3} {unit} | {:.3} |",
                    m / b
                );
            }
            (None, Err(e)) => {
                let _ = writeln!(md, "| {name} | failed: {} | | |", e.replace('|', "/"));
            }
            (None, Ok(v)) => {
                let _ = writeln!(md, "| {name} | no figures: {v:?} | | |");
            }
        }
    }
    md.push('\n');
    md
}

/// The report's two nodes: the server (memif server side) on the receiving CPU, the client
/// on the sending one.
fn start_nodes(a: &Args, dir: &Path) -> Result<MemifPair, String> {
    let (rx, tx) = lcores(a);
    MemifPair::start_on(&a.roced, "report", 94, (&rx, &tx), (7620, 7621), dir)
}

/// The nodes' lcore CPUs: the receiving node's, the sending node's.
fn lcores(a: &Args) -> (Vec<usize>, Vec<usize>) {
    (
        a.rx_lcores.clone().unwrap_or_else(|| vec![a.rx_cpu]),
        a.tx_lcores.clone().unwrap_or_else(|| vec![a.tx_cpu]),
    )
}

/// What idle RC QPs cost one node: `qps` created in bulk on its lcore (in RESET, as
/// `rocectl perf -t 2` makes them: 2 send and 1 receive work requests), the node's resident
/// memory and the machine's hugepages in use before and after, and how long creating took.
#[derive(Clone, Copy, Debug)]
struct IdleQps {
    qps: u64,
    rss_bytes: i64,
    huge_bytes: i64,
    create_s: f64,
}

/// A node's resident memory (VmRSS) and the machine's hugepages in use, bytes.
fn memory(pid: u32) -> (i64, i64) {
    let kib = |text: &str, key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<i64>().ok())
            .unwrap_or(0)
    };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let pages = kib(&info, "HugePages_Total:") - kib(&info, "HugePages_Free:");
    (
        kib(&status, "VmRSS:") * 1024,
        pages * kib(&info, "Hugepagesize:") * 1024,
    )
}

/// Creates `total` idle RC QPs on `node` (bulk requests of 200,000, the API's most), measures
/// [`IdleQps`], and destroys them again.
fn idle_qps(node: &bench::Node, total: usize) -> Result<IdleQps, String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(600)))
        .build()
        .into();
    let post = |path: &str, body: Value| -> Result<Value, String> {
        let mut r = agent
            .post(&format!("http://{}{path}", node.api))
            .send_json(&body)
            .map_err(|e| format!("POST {path}: {e}"))?;
        let text = r.body_mut().read_to_string().map_err(|e| e.to_string())?;
        serde_json::from_str(&text).map_err(|e| format!("POST {path}: {e}: {text}"))
    };
    let (rss0, huge0) = memory(node.pid());
    let t = Instant::now();
    let mut qpns: Vec<Value> = Vec::with_capacity(total);
    let mut result = Ok(());
    while qpns.len() < total {
        let n = (total - qpns.len()).min(200_000);
        match post(
            "/v1/qps/bulk",
            serde_json::json!({"count": n, "max_send_wr": 2, "max_recv_wr": 1}),
        ) {
            Ok(v) => match v["qpns"].as_array() {
                Some(q) if q.len() == n => qpns.extend(q.iter().cloned()),
                _ => {
                    result = Err(format!("bulk create of {n}: {v}"));
                    break;
                }
            },
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let create_s = t.elapsed().as_secs_f64();
    // Settle: the lcore's allocator has handed back what the requests' JSON took.
    std::thread::sleep(Duration::from_millis(500));
    let (rss1, huge1) = memory(node.pid());
    for chunk in qpns.chunks(200_000) {
        let _ = post("/v1/qps/bulk/destroy", serde_json::json!({ "qpns": chunk }));
    }
    result?;
    Ok(IdleQps {
        qps: qpns.len() as u64,
        rss_bytes: rss1 - rss0,
        huge_bytes: huge1 - huge0,
        create_s,
    })
}

/// The perftest exchange's TCP ports, a new one per run (from 18801).
fn ports() -> impl FnMut() -> u16 {
    let mut port = 18800u16;
    move || {
        port += 1;
        port
    }
}

/// QP scaling: 64 B WRITEs on each count of QPs, 2 outstanding per QP, about 400k messages in
/// all (at least 4 per QP); a failure is a result here, recorded with its reason.
fn qp_scaling(
    s: &str,
    c: &str,
    counts: &[usize],
    quick: bool,
    next_port: &mut dyn FnMut() -> u16,
    p: &mut Progress,
) -> Vec<(usize, Result<Run, String>)> {
    let mut scale = Vec::new();
    for &q in counts {
        let n = ((400_000 / q as u64).max(4) / if quick { 10 } else { 1 }).max(4);
        p.say(&format!("write bw 64 B on {q} QPs x {n}"));
        let (qs, it) = (q.to_string(), n.to_string());
        let r = perf(
            s,
            c,
            &["write", "bw", "-s", "64", "-n", &it, "-q", &qs, "-t", "2"],
            next_port(),
        )
        .map(|x| x.0);
        scale.push((q, r));
    }
    scale
}

/// `perf_report scale`: the QP scaling rows and the idle-QP step alone, on fresh nodes
/// (for working on them; the report's own figures come from its one full run).
fn scale_only(a: &Args, counts: &[usize], idle: usize) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("ferroce-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut p = Progress {
        step: 0,
        total: counts.len() + 1,
        t0: Instant::now(),
    };
    let nodes = start_nodes(a, &dir)?;
    let (s, c) = (nodes.a.api.clone(), nodes.b.api.clone());
    let mut next_port = ports();
    // The idle step first, on nodes no QPs have grown yet (as the report does).
    p.say(&format!("{idle} idle RC QPs on one lcore"));
    let idle = (idle > 0).then(|| idle_qps(&nodes.a, idle));
    let scale = qp_scaling(&s, &c, counts, a.quick, &mut next_port, &mut p);
    nodes.stop();
    let one = scale
        .iter()
        .find_map(|(q, r)| (*q == 1).then_some(r.as_ref().ok()).flatten())
        .map(|r| f(r, "msg_rate_mpps"));
    for (q, r) in &scale {
        match r {
            Ok(r) => {
                let m = f(r, "msg_rate_mpps");
                let vs = one.map_or(String::new(), |o| format!(" ({:.3} of 1 QP)", m / o));
                println!(
                    "{q} QPs: {m:.3} M msgs/s{vs}, {} iterations",
                    r["iterations"]
                );
            }
            Err(e) => println!("{q} QPs: failed: {e}"),
        }
    }
    match idle {
        Some(Ok(i)) => println!(
            "{} idle QPs: {:.0} B RSS + {:.0} B hugepages per QP, created in {:.1} s",
            i.qps,
            i.rss_bytes as f64 / i.qps as f64,
            i.huge_bytes as f64 / i.qps as f64,
            i.create_s
        ),
        Some(Err(e)) => println!("idle QPs: failed: {e}"),
        None => {}
    }
    Ok(())
}

/// Iterations for a bandwidth run of `size` bytes: about 512 MiB, 2,000 to 200,000 messages.
fn bw_iters(size: u64, quick: bool) -> u64 {
    let n = ((512u64 << 20) / size).clamp(2000, 200_000);
    if quick { n / 10 } else { n }
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(f64::NAN)
}

/// The kernel baselines through one server: UDP ping-pong (8 B), TCP stream, UDP 64 B rate.
struct Kernel {
    pingpong_us: Vec<f64>,
    tcp_gbps: f64,
    udp_mpps: f64,
}

fn kernel(
    a: &Args,
    prefix: &[&str],
    ip: &str,
    p: &mut Progress,
    what: &str,
) -> Result<Kernel, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let rx = a.rx_cpu.to_string();
    let mut pre: Vec<&str> = prefix.to_vec();
    pre.extend(["taskset", "-c", &rx]);
    let mut s = Server::start(&pre, &exe.to_string_lossy(), ip)?;
    pin_thread(a.tx_cpu);
    let iters = if a.quick { 2000 } else { 20_000 };
    p.say(&format!("kernel UDP ping-pong 8 B, {what}"));
    let pingpong_us = s.udp_pingpong(8, iters);
    p.say(&format!("kernel TCP stream, {what}"));
    let tcp = s.tcp_stream(a.kernel_seconds);
    p.say(&format!("kernel UDP 64 B datagram rate, {what}"));
    let udp = s.udp_stream(64, a.kernel_seconds);
    s.stop();
    Ok(Kernel {
        pingpong_us: pingpong_us?,
        tcp_gbps: tcp?,
        udp_mpps: udp? / 1e6,
    })
}

/// A network namespace holding one end of a veth whose other end is here.
struct Veth;

impl Veth {
    const NS: &'static str = "ferroce-report";

    fn up() -> Result<Veth, String> {
        let sh = |c: &str| -> Result<(), String> {
            let ok = std::process::Command::new("sh")
                .args(["-c", c])
                .status()
                .map_err(|e| e.to_string())?
                .success();
            if ok {
                Ok(())
            } else {
                Err(format!("{c}: failed"))
            }
        };
        let _ = sh(&format!("ip netns del {} 2>/dev/null", Self::NS));
        let _ = sh("ip link del frpt0 2>/dev/null");
        sh(&format!("ip netns add {}", Self::NS))?;
        sh(&format!(
            "ip link add frpt0 type veth peer name frpt1 netns {}",
            Self::NS
        ))?;
        sh("ip addr add 10.96.0.1/24 dev frpt0 && ip link set frpt0 up")?;
        sh(&format!(
            "ip netns exec {ns} ip addr add 10.96.0.2/24 dev frpt1 && ip netns exec {ns} ip link set frpt1 up && ip netns exec {ns} ip link set lo up",
            ns = Self::NS
        ))?;
        std::thread::sleep(Duration::from_millis(500));
        Ok(Veth)
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = std::process::Command::new("sh")
            .args([
                "-c",
                &format!("ip netns del {}; ip link del frpt0 2>/dev/null", Self::NS),
            ])
            .status();
    }
}

fn main() -> std::process::ExitCode {
    let a = Args::parse();
    if let Some(Sub::Serve { ip }) = &a.cmd {
        return match bench::kernel::serve(ip) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("serve: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    let r = match &a.cmd {
        Some(Sub::Scale { qps, idle }) => scale_only(&a, qps, *idle),
        Some(Sub::Costs) => {
            let c = byte_costs(a.rx_cpu);
            println!(
                "{c:?}\n4136 B ICRC: {:.1} ns, the CPU's folding floor for it {:.1} ns ({:.2}x)",
                c.icrc_ns,
                4136.0 * c.fold_ns_per_byte,
                c.icrc_ns / (4136.0 * c.fold_ns_per_byte)
            );
            Ok(())
        }
        _ => run(&a),
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("perf_report: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

const SIZES: [u64; 11] = [
    64,
    256,
    1024,
    4096,
    8192,
    16384,
    32768,
    65536,
    131072,
    262144,
    1 << 20,
];
const LAT_SIZES: [u64; 4] = [8, 64, 4096, 65536];
const QP_COUNTS: [usize; 6] = [1, 16, 1000, 10_000, 100_000, 1_000_000];

fn run(a: &Args) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("ferroce-report-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let sizes: Vec<u64> = if a.quick {
        vec![64, 4096, 65536, 1 << 20]
    } else {
        SIZES.to_vec()
    };
    let mut p = Progress {
        step: 0,
        total: 4 + sizes.len() * 3 + 1 + LAT_SIZES.len() * 3 + 1 + QP_COUNTS.len() + 1 + 3 + 6,
        t0: Instant::now(),
    };
    // 1. The vdev's limit.
    p.say("dpdk-testpmd txonly -> rxonly on memif, 64 B frames");
    let tp64 = memif_testpmd_rate(64, a.tx_cpu, a.rx_cpu, a.seconds, &dir, "64")?;
    let frame4k = 14 + 20 + 8 + 12 + 4096 + 4;
    p.say("dpdk-testpmd, frames of a 4096-byte path MTU");
    let tp4k = memif_testpmd_rate(frame4k, a.tx_cpu, a.rx_cpu, a.seconds, &dir, "4k")?;
    let costs = byte_costs(a.rx_cpu);
    // 2. ferroce node to node.
    let nodes = start_nodes(a, &dir)?;
    let (s, c) = (nodes.a.api.clone(), nodes.b.api.clone());
    let mut next_port = ports();
    let result = (|| -> Result<_, String> {
        let mut bw: Vec<(&str, u64, Run)> = Vec::new();
        for op in ["write", "read", "send"] {
            for &size in &sizes {
                let n = bw_iters(size, a.quick);
                p.say(&format!("{op} bw {size} B x {n}"));
                let (sz, it) = (size.to_string(), n.to_string());
                let (r, _) = perf(
                    &s,
                    &c,
                    &[op, "bw", "-s", &sz, "-n", &it, "-m", "4096"],
                    next_port(),
                )?;
                bw.push((op, size, r));
            }
        }
        p.say("atomic bw (fetch-add)");
        let n = if a.quick { "20000" } else { "200000" };
        let (atomic, _) = perf(&s, &c, &["atomic", "bw", "-n", n], next_port())?;
        let mut lat: Vec<(&str, u64, Run)> = Vec::new();
        for op in ["write", "read", "send"] {
            for &size in &LAT_SIZES {
                let n = if a.quick { 2000 } else { 20_000 }.min(((256u64 << 20) / size).max(1000));
                p.say(&format!("{op} lat {size} B x {n}"));
                let (sz, it) = (size.to_string(), n.to_string());
                let (r, _) = perf(
                    &s,
                    &c,
                    &[op, "lat", "-s", &sz, "-n", &it, "-m", "4096"],
                    next_port(),
                )?;
                lat.push((op, size, r));
            }
        }
        p.say("atomic lat (fetch-add)");
        let n = if a.quick { "2000" } else { "20000" };
        let (alat, _) = perf(&s, &c, &["atomic", "lat", "-n", n], next_port())?;
        // What an idle QP costs: a million on node a's lcore, before the scaling rows, whose
        // up to a million QPs a node would leave its memory grown by (measured after them, a
        // million QPs read as 24 B each: the lcore reused what the rows had left).
        p.say("1,000,000 idle RC QPs on one lcore: memory per QP");
        let idle = idle_qps(&nodes.a, 1_000_000);
        let scale = qp_scaling(&s, &c, &QP_COUNTS, a.quick, &mut next_port, &mut p);
        // Unmodified perftest through the compatibility library, on the same nodes.
        let mut apps = Vec::new();
        for (tool, size) in [
            ("ib_write_bw", 64u64),
            ("ib_write_bw", 65536),
            ("ib_write_lat", 8),
        ] {
            // Fewer latency iterations than the built-in's: on a CPU shared with a busy lcore a
            // ping-pong waits for the scheduler at each hop (milliseconds; 20,000 took > 180 s).
            let n = if tool.ends_with("_lat") {
                if a.quick { 200 } else { 1000 }
            } else {
                bw_iters(size, a.quick)
            };
            p.say(&format!(
                "{tool} -s {size} x {n} through libferroce_ibverbs.so"
            ));
            let (sz, it) = (size.to_string(), n.to_string());
            let args = ["-s", sz.as_str(), "-n", it.as_str(), "-m", "4096"];
            apps.push((tool, size, lib_perf(a, tool, &args, next_port())));
        }
        Ok((bw, atomic, lat, alat, scale, apps, idle))
    })();
    nodes.stop();
    let (bw, atomic, lat, alat, scale, apps, idle) = result?;
    // 1 again. This machine's speed drifts within minutes (testpmd's 64 B rate has moved 3x
    // between two runs of this report): the vdev's limit once more after ferroce's runs, and
    // the ratios take the higher of the two (the harder baseline).
    p.say("dpdk-testpmd again, 64 B frames");
    let tp64 = [
        tp64,
        memif_testpmd_rate(64, a.tx_cpu, a.rx_cpu, a.seconds, &dir, "64-after")?,
    ];
    p.say("dpdk-testpmd again, frames of a 4096-byte path MTU");
    let tp4k = [
        tp4k,
        memif_testpmd_rate(frame4k, a.tx_cpu, a.rx_cpu, a.seconds, &dir, "4k-after")?,
    ];
    // 3. The kernel.
    let lo = kernel(a, &[], "127.0.0.1", &mut p, "loopback")?;
    let veth = Veth::up()?;
    let ve = kernel(
        a,
        &["ip", "netns", "exec", Veth::NS],
        "10.96.0.2",
        &mut p,
        "veth",
    );
    drop(veth);
    let ve = ve?;
    // 3b. Instructions a message through an application's rings, counted (callgrind), after
    // every timed run so that it takes no CPU from them.
    p.say("instructions per 64 B WRITE, built-in and through the rings (callgrind)");
    let counted = stream_costs();
    // 4. The report.
    let md = report(
        a, tp64, tp4k, costs, &bw, &atomic, &lat, &alat, &scale, &lo, &ve, &apps, &counted, &idle,
    )?;
    print!("{md}");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// What one 4 KiB frame costs an lcore beyond what testpmd does with it, medians in ns.
#[derive(Clone, Copy, Debug)]
struct ByteCosts {
    /// ferroce's ICRC over a frame with a 4096-byte payload (the sender computes it, the
    /// receiver checks it).
    icrc_ns: f64,
    /// Copying 4096 bytes into a 64 KiB region (the receiver's placement), cache-warm.
    copy_ns: f64,
    /// ferroce's ICRC over the 120 bytes it covers in a 64-byte WRITE ONLY (IPv4, UDP, BTH,
    /// RETH, payload).
    icrc64_ns: f64,
    /// The fastest CRC-32 library's one unmasked pass over the same 4136 and 120 bytes
    /// (crc32fast and crc-fast timed, the faster median kept), and its name.
    lib_ns: f64,
    lib64_ns: f64,
    lib: &'static str,
    /// The CPU's ceiling for carry-less folding, ns per byte ([`bench::fold_ns_per_byte`];
    /// NaN without VPCLMULQDQ): no CRC of 4136 bytes built on it takes less than 4136 times it.
    fold_ns_per_byte: f64,
}

/// Times [`ByteCosts`] on `cpu` (on a thread of its own, so the caller's affinity stays).
fn byte_costs(cpu: usize) -> ByteCosts {
    std::thread::spawn(move || {
        pin_thread(cpu);
        let mut frame = vec![0u8; 40 + 4096];
        frame[0] = 0x45;
        frame[9] = 17;
        for (i, b) in frame.iter_mut().enumerate().skip(40) {
            *b = i as u8;
        }
        let mut region = vec![0u8; 65536];
        let iters = 100_000u32;
        let (mut icrc, mut copy, mut icrc64) = (Vec::new(), Vec::new(), Vec::new());
        let mut fold = Vec::new();
        let small = &frame[..20 + 8 + 12 + 16 + 64];
        // The libraries, in the same rounds: [crc32fast, crc-fast] x [4136 B, 120 B].
        let mut libs: [[Vec<f64>; 2]; 2] = Default::default();
        let time = |f: &dyn Fn() -> u32| {
            let t = Instant::now();
            let mut acc = 0u32;
            for _ in 0..iters {
                acc ^= f();
            }
            std::hint::black_box(acc);
            t.elapsed().as_nanos() as f64 / iters as f64
        };
        for _ in 0..15 {
            for (j, bytes) in [&frame[..], small].into_iter().enumerate() {
                libs[0][j].push(time(&|| crc32fast::hash(std::hint::black_box(bytes))));
                libs[1][j].push(time(&|| {
                    crc_fast::crc32_iso_hdlc(std::hint::black_box(bytes))
                }));
            }
            let t = Instant::now();
            let mut acc = 0u32;
            for _ in 0..iters {
                acc ^=
                    dataplane::wire::icrc::compute(std::hint::black_box(small), false).unwrap_or(0);
            }
            std::hint::black_box(acc);
            icrc64.push(t.elapsed().as_nanos() as f64 / iters as f64);
            let t = Instant::now();
            let mut acc = 0u32;
            for _ in 0..iters {
                acc ^= dataplane::wire::icrc::compute(std::hint::black_box(&frame), false)
                    .unwrap_or(0);
            }
            std::hint::black_box(acc);
            icrc.push(t.elapsed().as_nanos() as f64 / iters as f64);
            let t = Instant::now();
            for i in 0..iters as usize {
                let at = (i % 16) * 4096;
                region[at..at + 4096].copy_from_slice(std::hint::black_box(&frame[40..]));
                std::hint::black_box(&region);
            }
            copy.push(t.elapsed().as_nanos() as f64 / iters as f64);
            fold.extend(bench::fold_ns_per_byte());
        }
        let (fast, crcf) = (median(&libs[0][0]), median(&libs[1][0]));
        let (lib, k) = if fast <= crcf {
            ("crc32fast", 0)
        } else {
            ("crc-fast", 1)
        };
        ByteCosts {
            icrc_ns: median(&icrc),
            copy_ns: median(&copy),
            icrc64_ns: median(&icrc64),
            lib_ns: median(&libs[k][0]),
            lib64_ns: median(&libs[0][1]).min(median(&libs[1][1])),
            lib,
            fold_ns_per_byte: if fold.is_empty() {
                f64::NAN
            } else {
                median(&fold)
            },
        }
    })
    .join()
    .unwrap_or(ByteCosts {
        icrc_ns: f64::NAN,
        copy_ns: f64::NAN,
        icrc64_ns: f64::NAN,
        lib_ns: f64::NAN,
        lib64_ns: f64::NAN,
        lib: "none",
        fold_ns_per_byte: f64::NAN,
    })
}

fn samples_us(r: &Run) -> Vec<f64> {
    r["samples_ns"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter_map(Value::as_f64)
                .map(|x| x / 1000.0)
                .collect()
        })
        .unwrap_or_default()
}

#[allow(clippy::too_many_arguments)]
fn report(
    a: &Args,
    tp64_runs: [f64; 2],
    tp4k_runs: [f64; 2],
    costs: ByteCosts,
    bw: &[(&str, u64, Run)],
    atomic: &Run,
    lat: &[(&str, u64, Run)],
    alat: &Run,
    scale: &[(usize, Result<Run, String>)],
    lo: &Kernel,
    ve: &Kernel,
    apps: &[AppRun<'_>],
    counted: &Result<Counted, String>,
    idle: &Result<IdleQps, String>,
) -> Result<String, String> {
    // The harder baseline of testpmd's two measurements (before and after ferroce's runs).
    let tp64 = tp64_runs[0].max(tp64_runs[1]);
    let tp4k = tp4k_runs[0].max(tp4k_runs[1]);
    let mut md = String::new();
    let date = std::process::Command::new("date")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let get = |op: &str, size: u64| bw.iter().find(|x| x.0 == op && x.1 == size).map(|x| &x.2);
    let w64 = get("write", 64).map_or(f64::NAN, |r| f(r, "msg_rate_mpps") * 1e6);
    let w64k = get("write", 65536).map_or(f64::NAN, |r| f(r, "gbit_s"));
    let tp4k_gbps = tp4k * (14 + 20 + 8 + 12 + 4096 + 4) as f64 * 8.0 / 1e9;
    let w8 = lat
        .iter()
        .find(|x| x.0 == "write" && x.1 == 8)
        .map_or(f64::NAN, |x| {
            x.2["latency_us"]["typical"].as_f64().unwrap_or(f64::NAN)
        });
    let k_lo = median(&lo.pingpong_us);
    let k_ve = median(&ve.pingpong_us);
    let _ = writeln!(md, "# ferroce perftest report, {date}\n");
    let _ = writeln!(
        md,
        "One run of `cargo run --release -p bench --bin perf_report` on this machine (2 CPUs, no NIC): \
         dpdk-testpmd and the two roced nodes on net_memif, sender on CPU {}, receiver on CPU {}; \
         ferroce through `rocectl perf` (perftest's tests and connection exchange, the QP's lcore \
         posting the work requests), path MTU 4096, one QP, DCQCN on at line rate; the kernel \
         between this process and a child on loopback and across a veth into a network namespace. \
         Lcores: the receiving node on CPUs {:?}, the sending node on CPUs {:?} (`--rx-lcores`, \
         `--tx-lcores`).\n",
        a.tx_cpu,
        a.rx_cpu,
        lcores(a).0,
        lcores(a).1
    );
    // What copy-mode memif leaves room for (written out below the table).
    let t_frame = 1e9 / tp4k;
    let ceiling_tx = t_frame / (t_frame + costs.icrc_ns);
    let ceiling_rx = t_frame / (t_frame + costs.icrc_ns + costs.copy_ns);
    let t64 = 1e9 / tp64;
    let ceiling64 = t64 / (t64 + costs.icrc64_ns);
    let r64 = w64 / tp64;
    let r64k = w64k / tp4k_gbps;
    let rate = |q: usize| {
        scale
            .iter()
            .find(|x| x.0 == q)
            .and_then(|x| x.1.as_ref().ok())
            .map(|r| f(r, "msg_rate_mpps"))
    };
    let _ = writeln!(md, "## The issue's goals (issue 23)\n");
    let _ = writeln!(
        md,
        "| figure | ferroce | baseline | ratio | ceiling | ratio / ceiling | goal | met |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    let yes = |m: bool| if m { "yes" } else { "no" };
    let _ = writeln!(
        md,
        "| 64 B WRITE message rate / testpmd 64 B packet rate | {:.2} M/s | {:.2} Mpps | {r64:.3} | {ceiling64:.2} | {:.2} | ratio >= 0.25 | {} |",
        w64 / 1e6,
        tp64 / 1e6,
        r64 / ceiling64,
        yes(r64 >= 0.25)
    );
    let _ = writeln!(
        md,
        "| 64 KiB WRITE bandwidth / testpmd at 4 KiB-MTU frames | {w64k:.1} Gb/s | {tp4k_gbps:.1} Gb/s | {r64k:.3} | {ceiling_tx:.2} | {:.2} | >= 0.9 of the ceiling | {} |",
        r64k / ceiling_tx,
        yes(r64k >= 0.9 * ceiling_tx)
    );
    let ri = costs.icrc_ns / costs.lib_ns;
    // The least any carry-less-multiply CRC of the 4136 bytes takes on this CPU.
    let fold4k = 4136.0 * costs.fold_ns_per_byte;
    let _ = writeln!(
        md,
        "| ICRC over a 4 KiB-MTU frame (4136 B) / the fastest CRC-32 library's one pass ({}) | {:.1} ns | {:.1} ns | {ri:.2} | >= {fold4k:.1} ns (the CPU's floor) | {:.2}x the floor | <= 45 ns and <= 1.1x | {}{} |",
        costs.lib,
        costs.icrc_ns,
        costs.lib_ns,
        costs.icrc_ns / fold4k,
        yes(costs.icrc_ns <= 45.0 && ri <= 1.1),
        if fold4k > 45.0 {
            " (45 ns is past this CPU: its ceiling is the column before)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        md,
        "| ICRC over a 64 B WRITE's 120 bytes / the fastest library | {:.1} ns | {:.1} ns | {:.2} | | | <= 8 ns | {} |",
        costs.icrc64_ns,
        costs.lib64_ns,
        costs.icrc64_ns / costs.lib64_ns,
        yes(costs.icrc64_ns <= 8.0)
    );
    match counted {
        Ok(c) => {
            let _ = writeln!(
                md,
                "| instructions per 64 B WRITE, both ends (callgrind; every request signalled / one in 100) | {} / {} | 3,756 (the issue's start) | {:.2} / {:.2} | | | <= 1,200 | {} |",
                c.builtin,
                c.builtin_q100,
                c.builtin as f64 / 3756.0,
                c.builtin_q100 as f64 / 3756.0,
                yes(c.builtin <= 1200)
            );
        }
        Err(e) => {
            let _ = writeln!(
                md,
                "| instructions per 64 B WRITE | not counted: {} | | | | | <= 1,200 | no |",
                e.replace('|', "/").replace('\n', " ")
            );
        }
    }
    let biggest = scale
        .iter()
        .filter(|x| x.1.is_ok())
        .map(|x| x.0)
        .max()
        .unwrap_or(1);
    match (rate(biggest), rate(1)) {
        (Some(big), Some(one)) => {
            let _ = writeln!(
                md,
                "| 64 B WRITE rate on {biggest} QPs / on 1 QP (2 outstanding per QP) | {big:.3} M/s | {one:.3} M/s | {:.3} | | | >= 0.9 at 1M QPs | {} |",
                big / one,
                yes(biggest >= 1_000_000 && big / one >= 0.9)
            );
        }
        _ => {
            let _ = writeln!(
                md,
                "| 64 B WRITE rate on many QPs / on 1 QP | failed | | | | | >= 0.9 at 1M QPs | no |"
            );
        }
    }
    match idle {
        Ok(i) => {
            let per = (i.rss_bytes + i.huge_bytes) as f64 / i.qps as f64;
            let _ = writeln!(
                md,
                "| memory per idle RC QP ({} QPs on one lcore, created in {:.1} s: resident {:+.0} MB, hugepages {:+.0} MB) | {per:.0} B | | | | | reported | yes |",
                i.qps,
                i.create_s,
                i.rss_bytes as f64 / 1e6,
                i.huge_bytes as f64 / 1e6
            );
        }
        Err(e) => {
            let _ = writeln!(
                md,
                "| memory per idle RC QP | failed: {} | | | | | reported | no |",
                e.replace('|', "/").replace('\n', " ")
            );
        }
    }
    let _ = writeln!(
        md,
        "| 8 B WRITE half round trip, median | {w8:.2} us | 0.61-0.64 us (before) | | | | no worse | {} |",
        yes(w8 <= 0.64)
    );
    let _ = writeln!(
        md,
        "\nThe kernel, for scale: 8 B WRITE half round trip / kernel UDP ping-pong medians, {:.3} on loopback ({k_lo:.2} us), {:.3} across a veth ({k_ve:.2} us).",
        w8 / k_lo,
        w8 / k_ve
    );
    let _ = writeln!(
        md,
        "\n**The 64 KiB ceiling on copy-mode memif.** testpmd spends {t_frame:.0} ns \
         per 4 KiB-MTU frame (1 / its rate), its memif copy included. A RoCEv2 lcore does that \
         much per frame and more: the sender computes the frame's ICRC ({:.0} ns here, median, \
         this run), the receiver checks it and places the payload in the memory region (a \
         4 KiB copy, {:.0} ns cache-warm). So whatever the rest of ferroce costs, its rate is \
         at most T/(T + ICRC) = {ceiling_tx:.2} of testpmd's ({ceiling_rx:.2} if testpmd's own \
         receiver is what limits testpmd): the ceiling column. (ferroce now: {r64k:.3}, {:.2} \
         of the ceiling.)",
        costs.icrc_ns,
        costs.copy_ns,
        r64k / ceiling_tx
    );
    let _ = writeln!(
        md,
        "\n**The ICRC's ceiling.** Any CRC-32 built on carry-less multiplies (ours, crc32fast, \
         crc-fast) folds every 64 bytes with two of them. This CPU's multiplier, timed alone in \
         the same rounds (eight independent 512-bit folds, no loads: `bench::fold_ns_per_byte`), \
         folds {:.4} ns a byte, so 4136 bytes take at least {fold4k:.1} ns on it; ours took \
         {:.1} ns, {:.2}x that floor.",
        costs.fold_ns_per_byte,
        costs.icrc_ns,
        costs.icrc_ns / fold4k
    );
    let _ = writeln!(
        md,
        "\n**The 64 B ceiling.** testpmd spends {t64:.1} ns per 64 B frame. A \
         RoCEv2 sender does that much per message and, before anything else (posting the work \
         request, building the headers, taking the ACK, completing), computes the frame's ICRC \
         over 120 bytes: {:.1} ns here (median, this run). So its rate is at most \
         {ceiling64:.2} of testpmd's on this machine. (ferroce now: {r64:.3}.)",
        costs.icrc64_ns
    );
    let _ = writeln!(md);
    let _ = writeln!(
        md,
        "## QP scaling (64 B WRITE, 2 outstanding per QP, one lcore per node)\n"
    );
    let _ = writeln!(md, "| QPs | iterations (all QPs) | M msgs/s | vs 1 QP |");
    let _ = writeln!(md, "|---:|---:|---:|---:|");
    let one = rate(1).unwrap_or(f64::NAN);
    for (q, r) in scale {
        match r {
            Ok(r) => {
                let m = f(r, "msg_rate_mpps");
                let _ = writeln!(
                    md,
                    "| {q} | {} | {m:.3} | {:.2} |",
                    r["iterations"],
                    m / one
                );
            }
            Err(e) => {
                let _ = writeln!(
                    md,
                    "| {q} | | failed: {} | |",
                    e.replace('|', "/").replace('\n', " ")
                );
            }
        }
    }
    let _ = writeln!(md);
    let _ = writeln!(
        md,
        "## Bandwidth by message size (one QP, {} outstanding)\n",
        128
    );
    let _ = writeln!(
        md,
        "| bytes | WRITE MB/s | WRITE Gb/s | WRITE Mmsg/s | READ MB/s | READ Mmsg/s | SEND MB/s | SEND Mmsg/s |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|---:|");
    let sizes: Vec<u64> = bw.iter().filter(|x| x.0 == "write").map(|x| x.1).collect();
    for &size in &sizes {
        let cell = |op: &str, k: &str, d: usize| {
            get(op, size).map_or("-".into(), |r| format!("{:.*}", d, f(r, k)))
        };
        let _ = writeln!(
            md,
            "| {size} | {} | {} | {} | {} | {} | {} | {} |",
            cell("write", "bw_avg_mb_s", 1),
            cell("write", "gbit_s", 2),
            cell("write", "msg_rate_mpps", 3),
            cell("read", "bw_avg_mb_s", 1),
            cell("read", "msg_rate_mpps", 3),
            cell("send", "bw_avg_mb_s", 1),
            cell("send", "msg_rate_mpps", 3)
        );
    }
    let _ = writeln!(
        md,
        "\nAtomic (fetch-add) rate: **{:.3} M ops/s** ({} iterations).\n",
        f(atomic, "msg_rate_mpps"),
        atomic["iterations"]
    );
    let _ = writeln!(
        md,
        "dpdk-testpmd on the same memif and CPUs: **{:.2} Mpps** at 64 B frames, **{:.2} Mpps = {tp4k_gbps:.1} Gb/s** at {}-byte frames (what a 4096-byte path MTU sends): the higher of two measurements, before ferroce's runs ({:.2} and {:.2} Mpps) and after them ({:.2} and {:.2} Mpps).\n",
        tp64 / 1e6,
        tp4k / 1e6,
        14 + 20 + 8 + 12 + 4096 + 4,
        tp64_runs[0] / 1e6,
        tp4k_runs[0] / 1e6,
        tp64_runs[1] / 1e6,
        tp4k_runs[1] / 1e6
    );
    let _ = writeln!(
        md,
        "## Latency (one message at a time; WRITE and SEND: half round trip of the ping-pong, READ and atomic: round trip), microseconds\n"
    );
    let _ = writeln!(
        md,
        "| test | bytes | iterations | t_min | t_typical | t_avg | t_stdev | 99% | 99.9% | t_max |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut lat_rows: Vec<(&str, u64, &Run)> = lat.iter().map(|x| (x.0, x.1, &x.2)).collect();
    lat_rows.push(("atomic", 8, alat));
    for (op, size, r) in &lat_rows {
        let l = &r["latency_us"];
        let g = |k: &str| l[k].as_f64().map_or("-".into(), |x| format!("{x:.2}"));
        let _ = writeln!(
            md,
            "| {op} | {size} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r["iterations"],
            g("min"),
            g("typical"),
            g("avg"),
            g("stdev"),
            g("p99"),
            g("p99_9"),
            g("max")
        );
    }
    let _ = writeln!(md, "\n## The kernel, same machine\n");
    let _ = writeln!(
        md,
        "| path | UDP ping-pong 8 B half round trip, median (us) | 99% (us) | TCP stream (Gb/s) | UDP 64 B datagrams (M/s) |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|");
    for (name, k) in [("loopback", lo), ("veth (netns)", ve)] {
        let mut v = k.pingpong_us.clone();
        v.sort_by(f64::total_cmp);
        let p99 = v
            .get((v.len() as f64 * 0.99) as usize)
            .copied()
            .unwrap_or(f64::NAN);
        let _ = writeln!(
            md,
            "| {name} | {:.2} | {p99:.2} | {:.2} | {:.3} |",
            median(&k.pingpong_us),
            k.tcp_gbps,
            k.udp_mpps
        );
    }
    let wr64k_ratio_kernel = w64k / lo.tcp_gbps;
    let _ = writeln!(
        md,
        "\nferroce 64 KiB WRITE / kernel TCP on loopback: {wr64k_ratio_kernel:.2}; ferroce 64 B WRITE rate / kernel UDP 64 B datagram rate on loopback: {:.2}.\n",
        w64 / 1e6 / lo.udp_mpps
    );
    md.push_str(&app_section(a, apps, bw, lat, counted));
    // Plots.
    if let Some(path) = &a.report {
        let stem = path.with_extension("");
        let bw_png = PathBuf::from(format!("{}-bandwidth.png", stem.display()));
        let cdf_png = PathBuf::from(format!("{}-latency-cdf.png", stem.display()));
        let series: Vec<(&str, Vec<(f64, f64)>)> = ["write", "read", "send"]
            .iter()
            .map(|op| {
                (
                    *op,
                    bw.iter()
                        .filter(|x| x.0 == *op)
                        .map(|x| (x.1 as f64, f(&x.2, "gbit_s")))
                        .collect(),
                )
            })
            .collect();
        let named: Vec<(&str, Vec<(f64, f64)>)> = series
            .into_iter()
            .map(|(op, v)| {
                (
                    match op {
                        "write" => "ferroce WRITE",
                        "read" => "ferroce READ",
                        _ => "ferroce SEND",
                    },
                    v,
                )
            })
            .collect();
        bench::plot::bandwidth_vs_size(
            &bw_png,
            "ferroce over memif, one QP: bandwidth by message size",
            &named,
            &[
                ("dpdk-testpmd limit (4 KiB-MTU frames)", tp4k_gbps),
                ("kernel TCP, loopback", lo.tcp_gbps),
            ],
        )
        .map_err(|e| e.to_string())?;
        let w8s = lat
            .iter()
            .find(|x| x.0 == "write" && x.1 == 8)
            .map(|x| samples_us(&x.2))
            .unwrap_or_default();
        let s8s = lat
            .iter()
            .find(|x| x.0 == "send" && x.1 == 8)
            .map(|x| samples_us(&x.2))
            .unwrap_or_default();
        bench::plot::latency_cdf(
            &cdf_png,
            "8 B half round trips: ferroce over memif vs kernel UDP ping-pong",
            &[
                ("ferroce WRITE ping-pong", w8s),
                ("ferroce SEND ping-pong", s8s),
                ("kernel UDP, loopback", lo.pingpong_us.clone()),
                ("kernel UDP, veth", ve.pingpong_us.clone()),
            ],
        )
        .map_err(|e| e.to_string())?;
        let name = |p: &Path| {
            p.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        let _ = writeln!(
            md,
            "## Plots\n\n![bandwidth]({})\n\n![latency CDF]({})\n",
            name(&bw_png),
            name(&cdf_png)
        );
        std::fs::write(path, &md).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(md)
}
