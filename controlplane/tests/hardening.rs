//! Defects found by probing roced from outside as an attacker or a fault would (concurrent
//! control calls, a peer that dies mid-stream), each driven here the way it was found.
//!
//! The nodes' lcores share this machine's two CPUs, so the tests run one at a time.

mod common;
use common::rdma::*;
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
    let node = lone_node("race", 7620);
    let addr = "127.0.0.1:7620";
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

/// An unlabelled gauge's value in a node's /metrics.
fn gauge(api: &Api, name: &str) -> f64 {
    let (_, m) = api.get_bytes("/metrics");
    String::from_utf8(m)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// The first of a node's QP's counters named `name`.
fn qp_counter(api: &Api, qpn: u32, name: &str) -> u64 {
    let (_, v) = api.get(&format!("/v1/qps/{qpn}"));
    v["counters"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("{v}"))
}

/// Has A's lcore stream 64 KiB WRITEs on `qa` to B's region, 16 at a time, far longer than a
/// test lasts, and waits (20 s at most) until `sent` packets have left; the stream's answer.
fn write_stream(
    n: &Cluster,
    qa: u32,
    ra: (u32, u64),
    rb: (u32, u64),
    timeout_ms: u64,
    sent: u64,
) -> std::thread::JoinHandle<(u16, Value)> {
    let a = n.api[0].base.trim_start_matches("http://").to_string();
    let body = json!({"opcode": "write", "sge": sge(ra.1, 65536, ra.0), "remote_addr": rb.1,
                      "rkey": rb.0, "count": 100_000_000u64, "depth": 16, "timeout_ms": timeout_ms});
    let stream =
        std::thread::spawn(move || Api::new(&a).post(&format!("/v1/qps/{qa}/stream"), body));
    let t0 = std::time::Instant::now();
    while qp_counter(&n.api[0], qa, "sent_pkts") < sent && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    stream
}

#[test]
fn a_qp_whose_port_stops_taking_frames_fails_within_its_retries() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = memif_nodes("stall", 7622);
    let ra = reg(&n.api[0], 4 << 20);
    let rb = reg(&n.api[1], 4 << 20);
    let (qa, _) = pair(&n, Some(0), Some(0), 1024, false);
    // A's lcore streams 64 KiB WRITEs to B, 16 at a time, far longer than the test lasts.
    let stream = write_stream(&n, qa, ra, rb, 60_000, 10_000);
    assert!(
        qp_counter(&n.api[0], qa, "sent_pkts") >= 10_000,
        "the stream runs"
    );
    // B stops polling (SIGSTOP): its memif rings fill and A's port takes no more frames. A's
    // QP must time out retry_cnt + 1 times (7 + 1 at 67 ms) and fail, as an RNIC's does when
    // its link goes down, not sit in RTS while the port is full.
    let b_pid = n.nodes[1].as_ref().unwrap().child.id() as i32;
    // SAFETY: kill(2) on the PID of a child this test started and has not reaped.
    unsafe { libc::kill(b_pid, libc::SIGSTOP) };
    let stopped = std::time::Instant::now();
    let mut state = String::new();
    while stopped.elapsed() < Duration::from_secs(30) {
        let (_, v) = n.api[0].get(&format!("/v1/qps/{qa}"));
        state = v["state"].as_str().unwrap_or_default().to_string();
        if state == "ERR" {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = stopped.elapsed();
    // The frames A's port would not take wait in its lcore's transmit burst: mbufs in use,
    // which the live gauge shows (memif itself holds none between bursts).
    let used = gauge(&n.api[0], "ferroce_mbufs_in_use");
    // SAFETY: as above.
    unsafe { libc::kill(b_pid, libc::SIGCONT) };
    assert_eq!(
        state, "ERR",
        "A's QP after 30 s of a port that takes nothing"
    );
    assert!(
        used > 0.0 && used < gauge(&n.api[0], "ferroce_mbufs"),
        "{used}"
    );
    assert_eq!(
        qp_counter(&n.api[0], qa, "req_transport_retries_exceeded"),
        1
    );
    assert!(qp_counter(&n.api[0], qa, "local_ack_timeout_err") >= 8);
    let (s, r) = stream.join().unwrap();
    assert!(
        s < 500,
        "the stream ends with an answer, not a server error: {s} {r}"
    );
    assert!(
        r.to_string().contains("RETRY_EXC_ERR") || r["errors"].as_u64().is_some_and(|e| e > 0),
        "the stream says it failed: {s} {r}"
    );
    eprintln!("A's QP reached ERR {took:?} after B stopped taking frames");
    n.stop();
}

#[test]
fn starting_psns_and_region_keys_are_drawn_at_random() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let node = lone_node("guess", 7624);
    let api = Api::new("127.0.0.1:7624");
    // Eight QPs: their starting PSNs (24 bits at random) all differ, none is 0, and each QP
    // shows the one its creation answered with.
    let mut psns = BTreeSet::new();
    for _ in 0..8 {
        let v = api.ok(api.post("/v1/qps", json!({})));
        let (q, p) = (v["qpn"].as_u64().unwrap(), v["sq-psn"].as_u64().unwrap());
        assert!(p <= 0xff_ffff, "{v}");
        assert_eq!(api.ok(api.get(&format!("/v1/qps/{q}")))["sq-psn"], p);
        psns.insert(p);
    }
    assert_eq!(psns.len(), 8, "{psns:?}");
    assert!(!psns.contains(&0), "{psns:?}");
    // Eight regions: keys are slot << 8 | a variant drawn at random, not 0x1, 0x101, ...
    let keys: Vec<u64> = (0..8)
        .map(|_| {
            api.ok(api.post("/v1/mrs", json!({"length": 4096})))["lkey"]
                .as_u64()
                .unwrap()
        })
        .collect();
    let variants: BTreeSet<u64> = keys.iter().map(|k| k & 0xff).collect();
    assert!(variants.len() > 1, "keys {keys:x?}");
    assert!(!variants.contains(&0), "keys {keys:x?}");
    // The pool's size and the mbufs in use (none: the memif port has no peer to fill its
    // rings for), live.
    assert_eq!(gauge(&api, "ferroce_mbufs"), 8191.0);
    assert_eq!(gauge(&api, "ferroce_mbufs_in_use"), 0.0);
    // A method an endpoint does not take is a 405 with the JSON error, like every refusal.
    let (s, v) = api.delete("/v1/ports");
    assert_eq!(
        (s, v["code"].as_str()),
        (405, Some("method_not_allowed")),
        "{v}"
    );
    // A body that is not a JSON object is refused, not read as an empty one.
    let (s, v) = api.post_text("/v1/qps", "[]");
    assert_eq!((s, v["code"].as_str()), (400, Some("bad_body")), "{v}");
    let (rc, _, log) = node.terminate();
    assert_eq!(rc, 0, "{log}");
}

#[test]
fn a_stop_ends_a_running_stream_at_once_and_answers_its_caller() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = memif_nodes("stop", 7626);
    let ra = reg(&n.api[0], 4 << 20);
    let rb = reg(&n.api[1], 4 << 20);
    // A's QP waits 4.3 s for an ACK (timeout 20) before it retries: when B stops first, A's
    // stream would only fail after 8 of those, so the stop must end it itself.
    let (qa, qb) = (create_qp(&n.api[0], Some(0)), create_qp(&n.api[1], Some(0)));
    n.api[0].ok(n.api[0].post(
        &format!("/v1/qps/{qa}/connect"),
        json!({"remote_qpn": qb, "remote_gid": "10.89.0.2", "remote_psn": psn_of(&n.api[1], qb),
               "mtu": 1024, "timeout": 20}),
    ));
    connect(&n.api[1], qb, (&n.api[0], qa), "10.89.0.1", 1024);
    // perftest's -D 60 through REST: a minute of 4 KiB WRITEs.
    let a = n.api[0].base.trim_start_matches("http://").to_string();
    let body = json!({"opcode": "write", "sge": sge(ra.1, 4096, ra.0), "remote_addr": rb.1,
                      "rkey": rb.0, "count": 1_000_000_000u64, "depth": 16,
                      "duration_ms": 60000, "timeout_ms": 120000});
    let stream =
        std::thread::spawn(move || Api::new(&a).post(&format!("/v1/qps/{qa}/stream"), body));
    let t0 = std::time::Instant::now();
    while qp_counter(&n.api[0], qa, "sent_pkts") < 1000 && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        qp_counter(&n.api[0], qa, "sent_pkts") >= 1000,
        "the stream runs"
    );
    // SIGTERM to both nodes (a memif pair stops together): they exit in seconds, not when the
    // minute is up, and the stream's caller gets its answer.
    let stopping = std::time::Instant::now();
    let reports = n.stop();
    let took = stopping.elapsed();
    let (s, r) = stream.join().expect("the stream's caller got an answer");
    assert!(s < 500, "{s} {r}");
    assert!(
        took < Duration::from_secs(15),
        "the nodes took {took:?} to stop"
    );
    // It ends as a run whose QP failed: what was in flight is flushed, counted as errors.
    assert!(r["errors"].as_u64() > Some(0), "{s} {r}");
    let _ = reports;
    eprintln!("stopped in {took:?}; the stream answered {s} {r}");
}

/// Port 0 of a node as /v1/ports shows it.
fn port0(api: &Api) -> Value {
    let (_, v) = api.get("/v1/ports");
    v.as_array()
        .and_then(|a| a.first().cloned())
        .or_else(|| v["ports"].as_array().and_then(|a| a.first().cloned()))
        .unwrap_or_else(|| panic!("no port 0 in {v}"))
}

/// Waits up to `secs` for port 0's link to be `up`; how long it took.
fn wait_link(api: &Api, up: bool, secs: u64) -> Option<Duration> {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        if api.get("/v1/health").0 == 200 && port0(api)["link_up"] == up {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

#[test]
fn a_memif_client_connects_again_by_itself_when_its_server_restarts() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tag = "recon";
    let mut n = memif_nodes(tag, 7628);
    let first = {
        let ra = reg(&n.api[0], 1 << 20);
        let rb = reg(&n.api[1], 1 << 20);
        let (qa, qb) = pair(&n, None, None, 1024, false);
        write_every_pair(&n, &[(0, qa, qb)], ra, rb);
        // The API shows ports as read every 250 ms: wait for a reading with the traffic.
        let t0 = std::time::Instant::now();
        while port0(&n.api[1])["ipackets"].as_u64() < Some(3)
            && t0.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        port0(&n.api[1])
    };
    // A, the memif server, dies as a crash would (kill -9) and comes back as a supervisor
    // would start it again: the same configuration, the same socket.
    let mut a = n.nodes[0].take().unwrap();
    let a_mac = port0(&n.api[0])["mac"].clone();
    // SAFETY: kill(2) on the PID of a child this test started and has not reaped.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGKILL) };
    let _ = a.child.wait();
    assert!(
        wait_link(&n.api[1], false, 10).is_some(),
        "B's link goes down when A dies: {}",
        port0(&n.api[1])
    );
    // Down for a while (B tries and fails to connect meanwhile); its port's counts hold
    // (memif itself reads 0 while down).
    std::thread::sleep(Duration::from_secs(3));
    let down = port0(&n.api[1]);
    for k in ["ipackets", "opackets", "ibytes", "obytes"] {
        assert!(
            down[k].as_u64() >= first[k].as_u64() && down[k].as_u64() > Some(0),
            "{k} while the link is down: {} then {}",
            first[k],
            down[k]
        );
    }
    let sock = n.dir.join("memif.sock");
    let cfg = memif_node_config(
        &format!("ferroce-r{tag}-a-{}", std::process::id()),
        "server",
        sock.to_str().unwrap(),
        1,
        2,
        7628,
    );
    let back = std::time::Instant::now();
    let mut a = Roced::start(&n.dir, "a2", &cfg, None, &[]);
    assert!(
        a.wait_log("lcores running", Duration::from_secs(30)),
        "A did not start again:\n{}",
        a.log_text()
    );
    n.nodes[0] = Some(a);
    // B connects again by itself, within its retry interval (4 s at most) and the handshake.
    let b_up = wait_link(&n.api[1], true, 15);
    let a_up = wait_link(&n.api[0], true, 5);
    let log_b = n.nodes[1].as_ref().unwrap().log_text();
    assert!(
        b_up.is_some() && a_up.is_some(),
        "links after A came back: A {} B {}\nB's log:\n{log_b}",
        port0(&n.api[0]),
        port0(&n.api[1])
    );
    eprintln!("B's link up {:?} after A started again", back.elapsed());
    assert!(log_b.contains("memif client connecting again"), "{log_b}");
    // A has a new MAC (memif draws one at random); B's neighbour entry follows it and RDMA
    // works again both ways on new QPs (WRITEs from B to A go to the MAC B resolved).
    let new_mac = port0(&n.api[0])["mac"].clone();
    assert_ne!(new_mac, a_mac, "memif gave A a new MAC");
    let ra = reg(&n.api[0], 1 << 20);
    let rb = reg(&n.api[1], 1 << 20);
    let (qa, qb) = pair(&n, None, None, 1024, false);
    write_every_pair(&n, &[(0, qa, qb)], ra, rb);
    let swapped = Cluster {
        nodes: Vec::new(),
        api: vec![Api::new("127.0.0.1:7629"), Api::new("127.0.0.1:7628")],
        gids: vec![n.gids[1].clone(), n.gids[0].clone()],
        netns: Vec::new(),
        dir: n.dir.clone(),
    };
    write_every_pair(&swapped, &[(1, qb, qa)], rb, ra);
    // B's port counts on from where it was.
    let now = port0(&n.api[1]);
    for k in ["ipackets", "opackets"] {
        assert!(
            now[k].as_u64() > first[k].as_u64(),
            "{k}: {} then {}",
            first[k],
            now[k]
        );
    }
    let reports = n.stop();
    let neigh = &reports[1]["neighbors"];
    assert!(
        neigh
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["ip"] == "10.89.0.1" && e["mac"] == new_mac),
        "B's neighbour 10.89.0.1 is at A's new MAC {new_mac}: {neigh}"
    );
}

#[test]
fn a_memif_client_started_before_its_server_connects_once_the_server_is_there() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    require_root();
    let tag = "early";
    let dir = tmpdir(tag);
    let sock = dir.join("memif.sock");
    let sock = sock.to_str().unwrap();
    let pid = std::process::id();
    let cfg = |side: &str, role: &str, me: u8, peer: u8, api: u16| {
        memif_node_config(
            &format!("ferroce-r{tag}-{side}-{pid}"),
            role,
            sock,
            me,
            peer,
            api,
        )
    };
    // B, the client, first: it runs, its port stopped, and says why.
    let mut b = Roced::start(&dir, "b", &cfg("b", "client", 2, 1, 7631), None, &[]);
    assert!(
        b.wait_log("memif server not there yet", Duration::from_secs(30)),
        "{}",
        b.log_text()
    );
    let api_b = Api::new("127.0.0.1:7631");
    assert!(api_b.wait_up(Duration::from_secs(10)));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(port0(&api_b)["link_up"], false);
    // Then A, the server: B connects by itself and RDMA works.
    let a = Roced::start(&dir, "a", &cfg("a", "server", 1, 2, 7630), None, &[]);
    let n = Cluster::new(
        vec![a, b],
        vec!["127.0.0.1:7630".into(), "127.0.0.1:7631".into()],
        vec![
            ("10.89.0.1".into(), "fd89::1".into()),
            ("10.89.0.2".into(), "fd89::2".into()),
        ],
        Vec::new(),
        dir.clone(),
    );
    assert!(
        wait_link(&n.api[1], true, 15).is_some(),
        "{}",
        port0(&n.api[1])
    );
    let ra = reg(&n.api[0], 1 << 20);
    let rb = reg(&n.api[1], 1 << 20);
    let (qa, qb) = pair(&n, None, None, 1024, false);
    write_every_pair(&n, &[(0, qa, qb)], ra, rb);
    n.stop();
}

#[test]
fn frames_in_flight_to_a_destroyed_qp_never_reach_the_qp_that_comes_next() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = memif_nodes("stale", 7632);
    let ra = reg(&n.api[0], 4 << 20);
    let rb = reg(&n.api[1], 4 << 20);
    let (qa, qb) = pair(&n, Some(0), Some(0), 1024, false);
    // A streams 64 KiB WRITEs to B's QP, 16 at a time.
    let stream = write_stream(&n, qa, ra, rb, 30_000, 2000);
    // B's application goes away under the stream: its QP is destroyed while A's goes on
    // sending and then retransmitting (8 x 67 ms) to its number. At once a new pair is
    // connected between the same nodes on the same lcores, as the next run would.
    n.api[1].ok(n.api[1].delete(&format!("/v1/qps/{qb}")));
    let (qa2, qb2) = pair(&n, Some(0), Some(0), 1024, false);
    std::thread::sleep(Duration::from_secs(1));
    let got: Vec<u64> = ["rcvd_pkts", "out_of_sequence", "duplicate_request"]
        .iter()
        .map(|c| qp_counter(&n.api[1], qb2, c))
        .collect();
    let seq = qp_counter(&n.api[0], qa2, "packet_seq_err");
    eprintln!(
        "B's old QP {qb:#x}, new {qb2:#x}: new QP's rcvd/oos/dup {got:?}, A's new QP's packet_seq_err {seq}"
    );
    assert_eq!(
        (got, seq),
        (vec![0, 0, 0], 0),
        "the old QP's frames reached the new pair (old QPN {qb:#x}, new {qb2:#x})"
    );
    assert_ne!(qb2, qb);
    let (s, r) = stream.join().unwrap();
    assert!(s < 500, "{s} {r}");
    n.stop();
}
