//! Helpers for roced's integration tests: they run the real binary, as root, with real DPDK
//! vdevs, network namespaces and veths that the tests create and remove themselves.
#![allow(dead_code)]

pub mod rdma;
pub mod tools;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const ROCED: &str = env!("CARGO_BIN_EXE_roced");

/// Fails (never skips) when the machine cannot run the test, saying what to do.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "these tests create namespaces and use DPDK: run them as root (make test)"
    );
}

/// Runs a command, panicking with its output if it fails.
pub fn sh(cmd: &str) -> String {
    let out = Command::new("sh").arg("-c").arg(cmd).output().expect("sh");
    assert!(
        out.status.success(),
        "`{cmd}` failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a command and returns its output whatever its status.
pub fn sh_out(cmd: &str) -> Output {
    Command::new("sh").arg("-c").arg(cmd).output().expect("sh")
}

/// A network namespace, deleted (with its veths) on drop.
pub struct Netns(pub String);

impl Netns {
    pub fn new(name: &str) -> Netns {
        let _ = sh_out(&format!("ip netns del {name} 2>/dev/null"));
        sh(&format!("ip netns add {name}"));
        sh(&format!("ip -n {name} link set lo up"));
        // A new namespace takes IPv4 forwarding from the host's (a Docker engine sets it to 1):
        // a forwarding kernel beside ferroce's veth routes ferroce's own frames back onto the
        // link, TTL by TTL. The tests' hosts do not route.
        sh(&format!(
            "ip netns exec {name} sysctl -qw net.ipv4.ip_forward=0 net.ipv6.conf.all.forwarding=0"
        ));
        Netns(name.to_string())
    }
    pub fn exec(&self, cmd: &str) -> String {
        sh(&format!("ip netns exec {} {cmd}", self.0))
    }
    pub fn exec_out(&self, cmd: &str) -> Output {
        sh_out(&format!("ip netns exec {} {cmd}", self.0))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = sh_out(&format!("ip netns del {}", self.0));
    }
}

/// A running roced, terminated on drop if still running.
pub struct Roced {
    pub child: Child,
    pub report: PathBuf,
    pub log: PathBuf,
    pub prefix: String,
}

pub fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ferroce-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

impl Roced {
    /// Starts roced with `config` text (written to `dir`), optionally inside a namespace.
    pub fn start(
        dir: &Path,
        name: &str,
        config: &str,
        netns: Option<&str>,
        extra: &[&str],
    ) -> Roced {
        let cfg = dir.join(format!("{name}.toml"));
        std::fs::write(&cfg, config).unwrap();
        let report = dir.join(format!("{name}.json"));
        let log = dir.join(format!("{name}.log"));
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, ROCED]);
                c
            }
            None => Command::new(ROCED),
        };
        cmd.arg("--config")
            .arg(&cfg)
            .arg("--report")
            .arg(&report)
            .args(extra);
        // Nodes listen for the API only when the test asks (two nodes would share the default).
        if !config.contains("[api]") && !extra.contains(&"--api") {
            cmd.args(["--api", "off"]);
        }
        cmd.stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .stdin(Stdio::null());
        cmd.env("NO_COLOR", "1");
        let child = cmd.spawn().expect("spawn roced");
        let prefix = config
            .lines()
            .find_map(|l| l.trim().strip_prefix("file_prefix = "))
            .map(|s| s.trim_matches('"').to_string())
            .unwrap_or_default();
        Roced {
            child,
            report,
            log,
            prefix,
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `needle`.
    pub fn wait_log(&mut self, needle: &str, timeout: Duration) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < timeout {
            if self.log_text().contains(needle) {
                return true;
            }
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Sends SIGTERM without waiting. Nodes joined by memif are stopped together (signal all,
    /// then `terminate` each): roced orders the two closes of a memif link between nodes that
    /// stop together (DPDK's memif driver is not safe against a disconnect under a polling
    /// lcore), not between a node that stops and one that goes on.
    pub fn signal_stop(&self) {
        // SAFETY: kill(2) on the PID of a child we started and have not reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
    }

    /// Sends SIGTERM and waits for the exit; returns the exit code and the report.
    pub fn terminate(mut self) -> (i32, serde_json::Value, String) {
        // SAFETY: kill(2) on the PID of a child we started and have not reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let code = wait_timeout(&mut self.child, Duration::from_secs(20));
        let report = std::fs::read(&self.report)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(serde_json::Value::Null);
        (code, report, self.log_text())
    }
}

impl Drop for Roced {
    /// A test that failed midway still stops its roced gently, so it cleans up after itself;
    /// only one that hangs is killed (and its runtime directory removed for it).
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: as in terminate().
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            if wait_timeout(&mut self.child, Duration::from_secs(10)) == -1
                && !self.prefix.is_empty()
            {
                let _ = std::fs::remove_dir_all(Path::new("/var/run/dpdk").join(&self.prefix));
            }
        }
    }
}

/// Waits for a child, killing it after `timeout`; its exit code (-1 if killed or signalled).
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> i32 {
    let t0 = Instant::now();
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return st.code().unwrap_or(-1);
        }
        if t0.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return -1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The sum of one counter over every lcore in a report.
pub fn counter(report: &serde_json::Value, name: &str) -> u64 {
    counter_in(report, "lcores", name)
}

/// The sum of one counter over the per-lcore entries under `section` ("lcores" for the
/// loop's counters, "rdma" for the transport's).
pub fn counter_in(report: &serde_json::Value, section: &str, name: &str) -> u64 {
    report[section]
        .as_array()
        .map(|v| {
            v.iter()
                .map(|l| l["counters"][name].as_u64().unwrap_or(0))
                .sum()
        })
        .unwrap_or(0)
}

/// Asserts that a DPDK process with this file prefix left nothing behind.
pub fn assert_no_dpdk_files(prefix: &str) {
    assert!(!prefix.is_empty());
    let run = Path::new("/var/run/dpdk").join(prefix);
    assert!(!run.exists(), "{} left behind", run.display());
    let huge: Vec<String> = std::fs::read_dir("/dev/hugepages")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        !huge.iter().any(|f| f.starts_with(prefix)),
        "hugepage files left behind: {huge:?}"
    );
}

/// A blocking client of a node's REST API.
pub struct Api {
    pub base: String,
    agent: ureq::Agent,
}

impl Api {
    pub fn new(addr: &str) -> Api {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .into();
        Api {
            base: format!("http://{addr}"),
            agent,
        }
    }

    fn finish(r: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> (u16, Vec<u8>) {
        let mut r = r.expect("HTTP request");
        let status = r.status().as_u16();
        let body = r
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_vec()
            .expect("HTTP body");
        (status, body)
    }

    fn json(status: u16, b: Vec<u8>) -> (u16, serde_json::Value) {
        let v = if b.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_slice(&b).unwrap_or_else(|e| {
                panic!(
                    "status {status}: body is not JSON ({e}): {}",
                    String::from_utf8_lossy(&b)
                )
            })
        };
        (status, v)
    }

    /// GET, JSON back.
    pub fn get(&self, path: &str) -> (u16, serde_json::Value) {
        let (s, b) = Self::finish(self.agent.get(format!("{}{path}", self.base)).call());
        Self::json(s, b)
    }

    /// GET, bytes back.
    pub fn get_bytes(&self, path: &str) -> (u16, Vec<u8>) {
        Self::finish(self.agent.get(format!("{}{path}", self.base)).call())
    }

    /// The value of one Prometheus series (name and labels exactly) in `/metrics`.
    pub fn metric(&self, series: &str) -> Option<f64> {
        let (s, m) = self.get_bytes("/metrics");
        assert_eq!(s, 200);
        String::from_utf8(m).unwrap().lines().find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse::<f64>()
                .ok()
        })
    }

    /// GET with this Authorization header, bytes back.
    pub fn get_auth(&self, path: &str, authorization: &str) -> (u16, Vec<u8>) {
        Self::finish(
            self.agent
                .get(format!("{}{path}", self.base))
                .header("authorization", authorization)
                .call(),
        )
    }

    /// POST a JSON body (raw text, so tests can send broken JSON too).
    pub fn post_text(&self, path: &str, body: &str) -> (u16, serde_json::Value) {
        let (s, b) = Self::finish(
            self.agent
                .post(format!("{}{path}", self.base))
                .header("content-type", "application/json")
                .send(body),
        );
        Self::json(s, b)
    }

    /// POST JSON.
    pub fn post(&self, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        self.post_text(path, &body.to_string())
    }

    /// PUT JSON.
    pub fn put(&self, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        let (s, b) = Self::finish(
            self.agent
                .put(format!("{}{path}", self.base))
                .header("content-type", "application/json")
                .send(body.to_string()),
        );
        Self::json(s, b)
    }

    /// PUT raw bytes.
    pub fn put_bytes(&self, path: &str, data: &[u8]) -> (u16, serde_json::Value) {
        let (s, b) = Self::finish(
            self.agent
                .put(format!("{}{path}", self.base))
                .header("content-type", "application/octet-stream")
                .send(data),
        );
        Self::json(s, b)
    }

    /// DELETE.
    pub fn delete(&self, path: &str) -> (u16, serde_json::Value) {
        let (s, b) = Self::finish(self.agent.delete(format!("{}{path}", self.base)).call());
        Self::json(s, b)
    }

    /// Asserts a 2xx status and returns the JSON.
    pub fn ok(&self, r: (u16, serde_json::Value)) -> serde_json::Value {
        assert!((200..300).contains(&r.0), "API error {}: {}", r.0, r.1);
        r.1
    }

    /// Waits until the API answers /v1/health.
    pub fn wait_up(&self, timeout: Duration) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < timeout {
            if let Ok(mut r) = self.agent.get(format!("{}/v1/health", self.base)).call()
                && r.status() == 200
            {
                let _ = r.body_mut().read_to_vec();
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}
