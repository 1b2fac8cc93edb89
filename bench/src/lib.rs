//! Helpers shared by ferroce's benchmarks: running dpdk-testpmd and roced as child processes,
//! reading their figures, and summarising repeated measurements.

pub mod kernel;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// The ICRC the naive way, for comparison with ferroce's: three crc32fast updates over the
/// eight 0xff bytes standing in for the LRH, a masked copy of the IPv4, UDP and BTH headers
/// (`l3`'s first 40 bytes: TOS, TTL, checksum, UDP checksum and BTH resv8 set to ones), and
/// the rest.
pub fn icrc_naive(l3: &[u8]) -> u32 {
    let mut hdr = [0u8; 40];
    hdr.copy_from_slice(&l3[..40]);
    for at in [1, 8, 10, 11, 26, 27, 32] {
        hdr[at] = 0xff;
    }
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xff; 8]);
    h.update(&hdr);
    h.update(&l3[40..]);
    h.finalize()
}

/// A dpdk-testpmd in interactive mode whose prompt we type into.
#[derive(Debug)]
pub struct Testpmd {
    child: Child,
    stdin: Option<ChildStdin>,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
    prefix: String,
}

impl Testpmd {
    /// Starts `dpdk-testpmd` with EAL arguments `eal` and testpmd arguments `app` (`-i` is added).
    pub fn start(
        prefix: &str,
        eal: &[String],
        app: &[String],
        log: &Path,
    ) -> std::io::Result<Testpmd> {
        let out = std::fs::File::create(log)?;
        // Line-buffered through stdbuf (coreutils): testpmd's stdout to a file is otherwise
        // block-buffered, and a testpmd killed for hanging at quit (seen after a memif run:
        // 2 report runs in 8 this morning) took its `show port stats` output with it.
        let mut child = Command::new("stdbuf")
            .args(["-oL", "-eL", "dpdk-testpmd"])
            .args(eal)
            .arg(format!("--file-prefix={prefix}"))
            .arg("--")
            .arg("-i")
            .args(app)
            .stdin(Stdio::piped())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()?;
        let stdin = child.stdin.take();
        Ok(Testpmd {
            child,
            stdin,
            log: log.to_path_buf(),
            prefix: prefix.into(),
        })
    }

    /// Types a command at the prompt.
    pub fn cmd(&mut self, line: &str) {
        if let Some(s) = &mut self.stdin {
            let _ = writeln!(s, "{line}");
            let _ = s.flush();
        }
    }

    /// Everything it printed so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Quits and waits (killing it after `timeout`, which its output then says).
    pub fn quit(mut self, timeout: Duration) -> String {
        self.cmd("quit");
        self.stdin = None;
        let exited = wait_or_kill(&mut self.child, timeout);
        remove_runtime_dir(&self.prefix);
        let mut out = self.output();
        if !exited {
            out.push_str(&format!(
                "\n(killed: dpdk-testpmd had not quit {} s after `quit`)\n",
                timeout.as_secs()
            ));
        }
        out
    }
}

impl Drop for Testpmd {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Waits for a child, killing it after `timeout`; true if it exited by itself.
pub fn wait_or_kill(child: &mut Child, timeout: Duration) -> bool {
    let t0 = Instant::now();
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        if t0.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// dpdk-testpmd leaves /var/run/dpdk/<prefix> behind even after a clean exit, and its hugepage
/// files too when it ran without --huge-unlink.
pub fn remove_runtime_dir(prefix: &str) {
    let _ = std::fs::remove_dir_all(Path::new("/var/run/dpdk").join(prefix));
    if let Ok(rd) = std::fs::read_dir("/dev/hugepages") {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with(prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// The last `Rx-pps:` figure of testpmd's `show port stats` (the rate since the previous show).
pub fn last_rx_pps(testpmd_output: &str) -> Option<f64> {
    testpmd_output
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Rx-pps:"))
        .filter_map(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
        .next_back()
}

/// EAL arguments for a dpdk-testpmd with one forwarding lcore on `cpu` and the vdev `vdev`
/// (the main lcore may use every CPU; no PCI; hugepage files unlinked).
pub fn testpmd_eal(cpu: usize, vdev: &str) -> Vec<String> {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    vec![
        "--no-pci".into(),
        "--huge-unlink".into(),
        "--log-level=warning".into(),
        format!("--lcores=0@(0-{}),1@{cpu}", cpus - 1),
        format!("--vdev={vdev}"),
    ]
}

/// The median of a sample (the mean of the middle two for an even count).
pub fn median(xs: &[f64]) -> f64 {
    assert!(!xs.is_empty(), "median of nothing");
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_rx_pps_parse() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let out = "  Rx-pps:            0          Rx-bps:            0\n  Rx-pps:     15433102          Rx-bps:   7901748528\n";
        assert_eq!(last_rx_pps(out), Some(15433102.0));
        assert_eq!(last_rx_pps("nothing"), None);
    }
}

/// The CPU's own ceiling for a CRC that folds with carry-less multiplies, as ns per byte
/// folded: eight independent 512-bit folds (two VPCLMULQDQ and one XOR each, 64 bytes' worth,
/// no loads) timed over 200,000 rounds. `None` on a CPU without VPCLMULQDQ and AVX-512.
pub fn fold_ns_per_byte() -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("vpclmulqdq") && std::is_x86_feature_detected!("avx512f") {
        let iters = 200_000u32;
        let t = Instant::now();
        // SAFETY: the CPU has the features the function is compiled for (checked above).
        std::hint::black_box(unsafe { folds512(std::hint::black_box(iters)) });
        return Some(t.elapsed().as_nanos() as f64 / (iters as f64 * 8.0 * 64.0));
    }
    None
}

/// `iters` rounds of eight independent 512-bit folds, each 64 bytes' worth: the throughput
/// bound of the CRC kernels' inner loop without its loads (sixteen lanes measured the same
/// here: the multiplier's throughput, not its latency, is what binds).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f", enable = "vpclmulqdq")]
unsafe fn folds512(iters: u32) -> u64 {
    use core::arch::x86_64 as a;
    let k = a::_mm512_set1_epi64(0x1_5444_2bd4);
    let d = a::_mm512_set1_epi64(std::hint::black_box(0x0123_4567_89ab_cdef));
    let mut z = [a::_mm512_set1_epi64(1); 8];
    for (i, x) in z.iter_mut().enumerate() {
        *x = a::_mm512_add_epi64(*x, a::_mm512_set1_epi64(i as i64));
    }
    for _ in 0..iters {
        for x in z.iter_mut() {
            let lo = a::_mm512_clmulepi64_epi128(*x, k, 0x00);
            let hi = a::_mm512_clmulepi64_epi128(*x, k, 0x11);
            *x = a::_mm512_ternarylogic_epi64(d, lo, hi, 0x96);
        }
    }
    let mut acc = z[0];
    for x in &z[1..] {
        acc = a::_mm512_xor_si512(acc, *x);
    }
    a::_mm_cvtsi128_si64(a::_mm512_castsi512_si128(acc)) as u64
}

pub mod plot;

/// The memif socket the RDMA benchmarks' nodes (and testpmd) share.
pub const MEMIF_SOCK: &str = "/run/ferroce/bench-rdma.sock";
/// memif buffers that hold a whole frame (roced sizes its own the same way for MTU 9000).
pub const BSIZE: u32 = 9088;

/// dpdk-testpmd's one-way packet rate on net_memif at `frame` bytes: `txonly` on CPU
/// `tx_cpu` into `rxonly` on `rx_cpu`, the receiver's Rx-pps after `seconds`; logs in `dir`.
pub fn memif_testpmd_rate(
    frame: u32,
    tx_cpu: usize,
    rx_cpu: usize,
    seconds: u64,
    dir: &Path,
    tag: &str,
) -> Result<f64, String> {
    let _ = std::fs::create_dir_all("/run/ferroce");
    let _ = std::fs::remove_file(MEMIF_SOCK);
    let vdev = |role: &str| format!("net_memif0,role={role},socket={MEMIF_SOCK},bsize={BSIZE}");
    let common = |mode: &str| {
        vec![
            format!("--forward-mode={mode}"),
            "--total-num-mbufs=32768".into(),
            "--mbuf-size=9216".into(),
            format!("--txpkts={}", frame.saturating_sub(4).max(60)),
        ]
    };
    let mut rx = Testpmd::start(
        "ferroce-bench-rx",
        &testpmd_eal(rx_cpu, &vdev("server")),
        &common("rxonly"),
        &dir.join(format!("tp-rx-{tag}.log")),
    )
    .map_err(|e| format!("dpdk-testpmd: {e}"))?;
    std::thread::sleep(Duration::from_millis(1500));
    let mut tx = Testpmd::start(
        "ferroce-bench-tx",
        &testpmd_eal(tx_cpu, &vdev("client")),
        &common("txonly"),
        &dir.join(format!("tp-tx-{tag}.log")),
    )
    .map_err(|e| format!("dpdk-testpmd: {e}"))?;
    std::thread::sleep(Duration::from_secs(3));
    rx.cmd("start");
    tx.cmd("start");
    std::thread::sleep(Duration::from_secs(1));
    rx.cmd("show port stats 0");
    std::thread::sleep(Duration::from_secs(seconds));
    rx.cmd("show port stats 0");
    std::thread::sleep(Duration::from_millis(300));
    tx.cmd("stop");
    rx.cmd("stop");
    tx.quit(Duration::from_secs(10));
    let out = rx.quit(Duration::from_secs(10));
    remove_runtime_dir("ferroce-bench-tx");
    remove_runtime_dir("ferroce-bench-rx");
    last_rx_pps(&out).filter(|r| *r > 0.0).ok_or_else(|| {
        let tail: Vec<&str> = out.lines().rev().take(6).collect();
        format!(
            "no Rx-pps from testpmd at {frame} B ({tag}); the receiver's last lines: {}",
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        )
    })
}

/// A roced child process with its API address.
#[derive(Debug)]
pub struct Node {
    child: Child,
    /// host:port of its REST API.
    pub api: String,
}

impl Node {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts `roced` with configuration `cfg` (written to `dir/NAME.toml`, its log beside).
    pub fn start(roced: &Path, name: &str, cfg: &str, dir: &Path) -> Result<Node, String> {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, cfg).map_err(|e| e.to_string())?;
        let log =
            std::fs::File::create(dir.join(format!("{name}.log"))).map_err(|e| e.to_string())?;
        let child = Command::new(roced)
            .arg("--config")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("{}: {e}", roced.display()))?;
        let api = cfg
            .lines()
            .find_map(|l| l.strip_prefix("listen = "))
            .map(|s| s.trim_matches('"').to_string())
            .unwrap_or_default();
        Ok(Node { child, api })
    }

    /// Sends SIGTERM without waiting (to stop several nodes together).
    pub fn signal_stop(&self) {
        // SAFETY: kill(2) on a child we started and have not reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
    }

    /// Stops it (SIGTERM, then SIGKILL after 20 s) and waits.
    pub fn stop(mut self) {
        self.signal_stop();
        wait_or_kill(&mut self.child, Duration::from_secs(20));
    }
}

/// Two roced nodes joined by net_memif on [`MEMIF_SOCK`], one lcore each: the memif server
/// side ("a", 10.NET.0.1) and the client side ("b", .2), their APIs on `ports`; returned
/// once both links are up. `tag` names their DPDK file prefixes (`ferroce-TAG-a`/`-b`).
#[derive(Debug)]
pub struct MemifPair {
    /// The memif server side.
    pub a: Node,
    /// The memif client side.
    pub b: Node,
    tag: String,
}

impl MemifPair {
    /// Starts the pair (a on `cpus.0`, b on `cpus.1`) and waits up to 30 s for both links.
    pub fn start(
        roced: &Path,
        tag: &str,
        net: u8,
        cpus: (usize, usize),
        ports: (u16, u16),
        dir: &Path,
    ) -> Result<MemifPair, String> {
        Self::start_on(roced, tag, net, (&[cpus.0], &[cpus.1]), ports, dir)
    }

    /// [`MemifPair::start`] with an lcore on each of `lcores.0`'s CPUs for a and `lcores.1`'s
    /// for b (a larger machine's layout; on 2 CPUs, one each).
    pub fn start_on(
        roced: &Path,
        tag: &str,
        net: u8,
        lcores: (&[usize], &[usize]),
        ports: (u16, u16),
        dir: &Path,
    ) -> Result<MemifPair, String> {
        let list = |c: &[usize]| {
            c.iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let cpus = (list(lcores.0), list(lcores.1));
        let _ = std::fs::create_dir_all("/run/ferroce");
        let _ = std::fs::remove_file(MEMIF_SOCK);
        let cfg = |name: &str, role: &str, cpu: &str, me: u8, peer: u8, port: u16| {
            format!(
                "[eal]\nfile_prefix = \"ferroce-{tag}-{name}\"\n[dataplane]\nlcores = [{cpu}]\nmbufs = 32767\n\
                 [[ports]]\ndevice = \"net_memif0,role={role},socket={MEMIF_SOCK},bsize={BSIZE}\"\nmtu = 9000\n\
                 addresses = [\"10.{net}.0.{me}/24\"]\nprobes = [\"10.{net}.0.{peer}\"]\n[api]\nlisten = \"127.0.0.1:{port}\"\n"
            )
        };
        let a = Node::start(roced, "a", &cfg("a", "server", &cpus.0, 1, 2, ports.0), dir)?;
        // The memif server's socket must exist before the client starts.
        std::thread::sleep(Duration::from_millis(1500));
        let b = Node::start(roced, "b", &cfg("b", "client", &cpus.1, 2, 1, ports.1), dir)?;
        let pair = MemifPair {
            a,
            b,
            tag: tag.to_string(),
        };
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(5)))
            .build()
            .into();
        let up = |n: &Node| {
            agent
                .get(&format!("http://{}/v1/ports", n.api))
                .call()
                .ok()
                .and_then(|mut r| r.body_mut().read_to_string().ok())
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .is_some_and(|p| p[0]["link_up"] == true)
        };
        let t0 = Instant::now();
        while !(up(&pair.a) && up(&pair.b)) {
            if t0.elapsed() > Duration::from_secs(30) {
                pair.stop();
                return Err("roced nodes did not come up (see their logs)".into());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(pair)
    }

    /// Stops both together (roced orders the closes of a memif link between nodes stopped
    /// together) and removes what DPDK and memif left behind.
    pub fn stop(self) {
        self.a.signal_stop();
        self.b.signal_stop();
        self.a.stop();
        self.b.stop();
        remove_runtime_dir(&format!("ferroce-{}-a", self.tag));
        remove_runtime_dir(&format!("ferroce-{}-b", self.tag));
        let _ = std::fs::remove_file(MEMIF_SOCK);
    }
}
