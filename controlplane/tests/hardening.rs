//! Defects found by probing roced from outside as an attacker or a fault would (concurrent
//! control calls, a peer that dies mid-stream), each driven here the way it was found.
//!
//! The nodes' lcores share this machine's two CPUs, so the tests run one at a time.

mod common;
use common::*;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// One node with two lcores and a memif server port nobody joins (QPs and CQs need no peer).
fn lone_node(tag: &str, api: u16) -> Roced {
    require_root();
    let dir = tmpdir(tag);
    let cfg = format!(
        "[eal]\nfile_prefix = \"ferroce-h{tag}-{}\"\n[dataplane]\nlcores = [0, 1]\nmbufs = 8191\nidle_sleep_us = 50\n\
         [[ports]]\ndevice = \"net_memif0,role=server,socket={}\"\nmtu = 1500\naddresses = [\"10.86.0.1/24\"]\n\
         [api]\nlisten = \"127.0.0.1:{api}\"\n",
        std::process::id(),
        dir.join("memif.sock").display()
    );
    let mut node = Roced::start(&dir, "n", &cfg, None, &[]);
    assert!(
        node.wait_log("REST API listening", Duration::from_secs(30)),
        "{}",
        node.log_text()
    );
    node
}

/// The numbers a list endpoint answers with, under `field`.
fn listed(api: &Api, path: &str, field: &str) -> BTreeSet<u64> {
    let (s, v) = api.get(path);
    assert_eq!(s, 200, "{path}: {v}");
    v.as_array()
        .unwrap_or_else(|| panic!("{path}: {v}"))
        .iter()
        .map(|o| o[field].as_u64().unwrap_or_else(|| panic!("{path}: {o}")))
        .collect()
}

/// Runs `threads` clients at once, each creating `per_thread` objects with `create` (which
/// answers the new number) and destroying every one but each fourth at once after the next
/// create, so that destroys and creates of reused numbers interleave. Every call must succeed;
/// the numbers the clients kept, back.
fn churn(
    addr: &str,
    threads: usize,
    per_thread: usize,
    create: fn(&Api) -> (u16, Value),
    destroy: fn(&Api, u64) -> (u16, Value),
) -> BTreeSet<u64> {
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let addr = addr.to_string();
            std::thread::spawn(move || {
                let api = Api::new(&addr);
                let (mut kept, mut errors) = (Vec::new(), Vec::new());
                let mut last: Option<u64> = None;
                for i in 0..per_thread {
                    let (s, v) = create(&api);
                    if s != 200 && s != 201 {
                        errors.push(format!("create: {s} {v}"));
                        continue;
                    }
                    let n = v.as_u64().unwrap();
                    if let Some(prev) = last.take() {
                        let (s, v) = destroy(&api, prev);
                        if s != 204 {
                            errors.push(format!("destroy {prev}: {s} {v}"));
                        }
                    }
                    if i % 4 == 3 {
                        kept.push(n);
                    } else {
                        last = Some(n);
                    }
                }
                if let Some(prev) = last {
                    let (s, v) = destroy(&api, prev);
                    if s != 204 {
                        errors.push(format!("destroy {prev}: {s} {v}"));
                    }
                }
                (kept, errors)
            })
        })
        .collect();
    let mut kept = BTreeSet::new();
    let mut errors = Vec::new();
    for w in workers {
        let (k, e) = w.join().expect("client thread");
        kept.extend(k);
        errors.extend(e);
    }
    assert!(
        errors.is_empty(),
        "{} calls failed, e.g. {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    kept
}

/// The sum of a gauge's series in a /metrics text.
fn gauge_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn concurrent_creates_and_destroys_leave_the_tables_and_the_lcores_agreeing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let node = lone_node("race", 7590);
    let addr = "127.0.0.1:7590";
    let api = Api::new(addr);
    // 100 clients at once, 20 creates each, 15 of them destroyed again: 3,500 calls a kind.
    let qps = churn(
        addr,
        100,
        20,
        |api| {
            let (s, v) = api.post("/v1/qps", json!({}));
            (s, v["qpn"].clone())
        },
        |api, n| api.delete(&format!("/v1/qps/{n}")),
    );
    assert_eq!(qps.len(), 500);
    assert_eq!(
        listed(&api, "/v1/qps", "lqpn"),
        qps,
        "GET /v1/qps lists exactly the QPs the clients kept"
    );
    let (_, m) = api.get_bytes("/metrics");
    let m = String::from_utf8(m).unwrap();
    assert_eq!(
        gauge_sum(&m, "ferroce_qps"),
        500.0,
        "the lcores hold exactly those QPs"
    );
    let cqs = churn(
        addr,
        100,
        20,
        |api| {
            let (s, v) = api.post("/v1/cqs", json!({"cqe": 16}));
            (s, v["cqn"].clone())
        },
        |api, n| api.delete(&format!("/v1/cqs/{n}")),
    );
    assert_eq!(cqs.len(), 500);
    assert_eq!(
        listed(&api, "/v1/cqs", "cqn"),
        cqs,
        "GET /v1/cqs lists exactly the CQs the clients kept"
    );
    // Everything kept can be destroyed, and then nothing is left on the lcores.
    for q in &qps {
        assert_eq!(api.delete(&format!("/v1/qps/{q}")).0, 204);
    }
    for c in &cqs {
        assert_eq!(api.delete(&format!("/v1/cqs/{c}")).0, 204);
    }
    let (_, m) = api.get_bytes("/metrics");
    assert_eq!(
        gauge_sum(&String::from_utf8(m).unwrap(), "ferroce_qps"),
        0.0
    );
    assert!(listed(&api, "/v1/cqs", "cqn").is_empty());
    let (rc, _, log) = node.terminate();
    assert_eq!(rc, 0, "{log}");
}
