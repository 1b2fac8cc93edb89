//! Running Debian's unmodified RDMA programs on roced through libferroce_ibverbs.so
//! (`ibverbs_tools.rs`, `rdmacm_tools.rs`).

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The compatibility library, built beside the test as a dependency.
pub fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for d in [deps, deps.parent().unwrap()] {
        let p = d.join("libferroce_ibverbs.so");
        if p.exists() {
            return p;
        }
    }
    panic!("libferroce_ibverbs.so not found beside {}", exe.display());
}

/// `name args` on the device at `socket`, through the library, its output captured.
pub fn tool(name: &str, socket: &str, args: &[&str]) -> Command {
    let mut c = Command::new(name);
    c.args(args)
        .env("LD_PRELOAD", library())
        .env("FERROCE_SOCKET", socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// A finished program's stdout and stderr.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Waits up to `limit` for `c` to end (killed and failed past it).
pub fn wait_output(c: Child, limit: Duration, what: &str) -> Output {
    wait_output_or(c, limit, what, "")
}

/// [`wait_output`], with `also` (the other end's output) in the failure.
pub fn wait_output_or(mut c: Child, limit: Duration, what: &str, also: &str) -> Output {
    let t = Instant::now();
    loop {
        if c.try_wait().unwrap().is_some() {
            return c.wait_with_output().unwrap();
        }
        if t.elapsed() > limit {
            let _ = c.kill();
            let o = c.wait_with_output().unwrap();
            panic!(
                "{what} did not finish in {limit:?}:\n{}\n-- the other end:\n{also}",
                text(&o)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The outputs of a client and server that must both have exited 0 (a failure shows both).
pub fn both_succeeded(what: &str, c: &Output, s: &Output) -> (String, String) {
    let (ct, st) = (text(c), text(s));
    assert!(
        c.status.success() && s.status.success(),
        "{what}: client {:?}, server {:?}\n-- client:\n{ct}\n-- server:\n{st}",
        c.status,
        s.status
    );
    (ct, st)
}
