//! Two roced processes joined by net_memif, two worker lcores each, move RDMA traffic that
//! the tests drive only through the REST API: every opcode at sizes from 1 B to 1 MiB and path
//! MTUs 1024 and 4096 with every byte checked; a thousand QPs per node spread over both lcores;
//! QPs created and destroyed while others carry traffic; and the same over links that lose,
//! reorder and duplicate frames.
//!
//! The nodes' four lcores share this machine's two CPUs, so the tests run one at a time.

mod common;
use common::*;
use serde_json::{Value, json};
use std::sync::Mutex;
use std::time::Duration;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const ALL: [&str; 4] = [
    "local-write",
    "remote-write",
    "remote-read",
    "remote-atomic",
];

fn node(prefix: &str, role: &str, sock: &str, me: u8, peer: u8, api: u16) -> String {
    format!(
        r#"[eal]
file_prefix = "{prefix}"
[dataplane]
lcores = [0, 1]
mbufs = 16383
idle_sleep_us = 20
[[ports]]
device = "net_memif0,role={role},socket={sock}"
mtu = 9000
addresses = ["10.89.0.{me}/24", "fd89::{me}/64"]
probes = ["10.89.0.{peer}"]
[api]
listen = "127.0.0.1:{api}"
"#
    )
}

/// Two nodes, A (10.89.0.1, fd89::1) and B (.2), and their API clients.
struct Nodes {
    a: Option<Roced>,
    b: Option<Roced>,
    api: [Api; 2],
    _dir: std::path::PathBuf,
}

impl Nodes {
    fn start(tag: &str, api_base: u16) -> Nodes {
        require_root();
        let dir = tmpdir(tag);
        let sock = dir.join("memif.sock");
        let sock = sock.to_str().unwrap();
        let pid = std::process::id();
        let mut a = Roced::start(
            &dir,
            "a",
            &node(
                &format!("ferroce-r{tag}-a-{pid}"),
                "server",
                sock,
                1,
                2,
                api_base,
            ),
            None,
            &[],
        );
        // The memif server's socket must exist before the client starts.
        assert!(
            a.wait_log("lcores running", Duration::from_secs(30)),
            "node A did not start:\n{}",
            a.log_text()
        );
        let b = Roced::start(
            &dir,
            "b",
            &node(
                &format!("ferroce-r{tag}-b-{pid}"),
                "client",
                sock,
                2,
                1,
                api_base + 1,
            ),
            None,
            &[],
        );
        let api = [
            Api::new(&format!("127.0.0.1:{api_base}")),
            Api::new(&format!("127.0.0.1:{}", api_base + 1)),
        ];
        let mut n = Nodes {
            a: Some(a),
            b: Some(b),
            api,
            _dir: dir,
        };
        for (i, r) in [n.a.as_mut().unwrap(), n.b.as_mut().unwrap()]
            .into_iter()
            .enumerate()
        {
            assert!(
                r.wait_log("link up", Duration::from_secs(30)),
                "node {i} did not come up:\n{}",
                r.log_text()
            );
        }
        for api in &n.api {
            assert!(
                api.wait_up(Duration::from_secs(10)),
                "API of {} down",
                api.base
            );
        }
        n
    }

    /// Stops both nodes; both must exit 0 with every mbuf back.
    fn stop(mut self) -> [Value; 2] {
        let mut out = Vec::new();
        for r in [self.a.take().unwrap(), self.b.take().unwrap()] {
            let (code, report, log) = r.terminate();
            assert_eq!(code, 0, "roced exited {code}:\n{log}");
            assert_eq!(report["mbufs_in_use_at_exit"], 0, "{log}");
            out.push(report);
        }
        [out.remove(0), out.remove(0)]
    }
}

/// A region of `len` bytes with every access right; returns (key, addr).
fn reg(api: &Api, len: u64) -> (u32, u64) {
    let v = api.ok(api.post("/v1/mrs", json!({"length": len, "access": ALL})));
    (
        v["lkey"].as_u64().unwrap() as u32,
        v["addr"].as_u64().unwrap(),
    )
}

fn create_qp(api: &Api, lcore: Option<usize>) -> u32 {
    let body = match lcore {
        Some(l) => json!({"lcore": l}),
        None => json!({}),
    };
    api.ok(api.post("/v1/qps", body))["qpn"].as_u64().unwrap() as u32
}

fn connect(api: &Api, qpn: u32, remote_qpn: u32, gid: &str, mtu: u32) {
    let v = api.ok(api.post(
        &format!("/v1/qps/{qpn}/connect"),
        json!({"remote_qpn": remote_qpn, "remote_gid": gid, "mtu": mtu}),
    ));
    assert_eq!(v["state"], "RTS", "{v}");
}

/// A connected QP pair: (A's QPN, B's QPN).
fn pair(n: &Nodes, la: Option<usize>, lb: Option<usize>, mtu: u32, v6: bool) -> (u32, u32) {
    let qa = create_qp(&n.api[0], la);
    let qb = create_qp(&n.api[1], lb);
    let (ga, gb) = if v6 {
        ("fd89::1", "fd89::2")
    } else {
        ("10.89.0.1", "10.89.0.2")
    };
    connect(&n.api[0], qa, qb, gb, mtu);
    connect(&n.api[1], qb, qa, ga, mtu);
    (qa, qb)
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn put(api: &Api, key: u32, addr: u64, data: &[u8]) {
    api.ok(api.put_bytes(&format!("/v1/mrs/{key}/data?addr={addr}"), data));
}

fn get(api: &Api, key: u32, addr: u64, len: usize) -> Vec<u8> {
    let (s, b) = api.get_bytes(&format!("/v1/mrs/{key}/data?addr={addr}&length={len}"));
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&b));
    b
}

/// Waits for one completion of the kind asked; panics with the QP's state if none comes.
fn completion(api: &Api, qpn: u32, recv: bool) -> Value {
    for _ in 0..60 {
        let v = api.ok(api.get(&format!("/v1/qps/{qpn}/completions?max=1&wait_ms=1000")));
        let list = &v[if recv { "recv" } else { "send" }];
        if let Some(c) = list.as_array().and_then(|a| a.first()) {
            return c.clone();
        }
        assert!(
            v[if recv { "send" } else { "recv" }]
                .as_array()
                .is_some_and(|a| a.is_empty()),
            "unexpected completion {v}"
        );
    }
    panic!(
        "no completion on QP {qpn} in 60 s: {}",
        api.get(&format!("/v1/qps/{qpn}")).1
    );
}

/// Both nodes' statistics, for failure messages.
fn stats(n: &Nodes) -> String {
    format!(
        "A: {}\nB: {}",
        n.api[0].get("/v1/stats").1,
        n.api[1].get("/v1/stats").1
    )
}

/// Asserts two byte strings are equal, naming the first difference.
fn same(n: &Nodes, got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b);
        panic!(
            "{what}: {} bytes read back, {} expected, first difference at {at:?}\n{}",
            got.len(),
            want.len(),
            stats(n)
        );
    }
}

fn post(api: &Api, qpn: u32, wr: Value) {
    api.ok(api.post(&format!("/v1/qps/{qpn}/send"), wr));
}

fn sge(addr: u64, len: usize, key: u32) -> Value {
    json!([{"addr": addr, "length": len, "lkey": key}])
}

/// Every opcode at every size on one QP pair; every byte read back and compared.
#[allow(clippy::too_many_arguments)]
fn every_opcode(
    n: &Nodes,
    qa: u32,
    qb: u32,
    (ka, aa): (u32, u64),
    (kb, ab): (u32, u64),
    sizes: &[usize],
    seed: u32,
) {
    let (a, b) = (&n.api[0], &n.api[1]);
    for (i, &len) in sizes.iter().enumerate() {
        let s = seed.wrapping_add(i as u32 * 16);
        // WRITE: A's bytes land in B's region.
        let d = pattern(len, s);
        put(a, ka, aa, &d);
        post(
            a,
            qa,
            json!({"opcode": "write", "wr_id": 1, "sge": sge(aa, len, ka),
                            "remote_addr": ab, "rkey": kb}),
        );
        let c = completion(a, qa, false);
        assert_eq!(c["status"], "success", "WRITE {len}: {c}\n{}", stats(n));
        assert_eq!(c["opcode"], "rdma-write");
        same(n, &get(b, kb, ab, len), &d, &format!("WRITE of {len} B"));

        // WRITE with immediate: consumes a receive on B, which completes with the immediate.
        let d = pattern(len, s + 1);
        put(a, ka, aa, &d);
        b.ok(b.post(
            &format!("/v1/qps/{qb}/recv"),
            json!({"wr_id": 77, "sge": []}),
        ));
        post(
            a,
            qa,
            json!({"opcode": "write-imm", "wr_id": 2, "sge": sge(aa, len, ka),
                            "remote_addr": ab + 8, "rkey": kb, "imm": 0xabc0_0000u32 + i as u32}),
        );
        assert_eq!(completion(a, qa, false)["status"], "success");
        let r = completion(b, qb, true);
        assert_eq!(r["opcode"], "recv-rdma-with-imm", "{r}");
        assert_eq!(r["imm_data"], 0xabc0_0000u32 + i as u32);
        assert_eq!(r["byte_len"], len);
        same(
            n,
            &get(b, kb, ab + 8, len),
            &d,
            &format!("WRITE-imm of {len} B"),
        );

        // READ: B's bytes land in A's region.
        let d = pattern(len, s + 2);
        put(b, kb, ab, &d);
        post(
            a,
            qa,
            json!({"opcode": "read", "wr_id": 3, "sge": sge(aa + 16, len, ka),
                            "remote_addr": ab, "rkey": kb}),
        );
        let c = completion(a, qa, false);
        assert_eq!(c["status"], "success", "READ {len}: {c}\n{}", stats(n));
        assert_eq!(c["opcode"], "rdma-read");
        same(
            n,
            &get(a, ka, aa + 16, len),
            &d,
            &format!("READ of {len} B"),
        );

        // SEND and SEND with immediate, B to A, into receives A posted.
        for (k, op) in ["send", "send-imm"].into_iter().enumerate() {
            let d = pattern(len, s + 3 + k as u32);
            put(b, kb, ab, &d);
            let dst = aa + 24 + k as u64 * 8;
            a.ok(a.post(
                &format!("/v1/qps/{qa}/recv"),
                json!({"wr_id": 10 + k, "sge": sge(dst, len, ka)}),
            ));
            post(
                b,
                qb,
                json!({"opcode": op, "wr_id": 4, "sge": sge(ab, len, kb), "imm": 5}),
            );
            let c = completion(b, qb, false);
            assert_eq!(c["status"], "success", "{op} {len}: {c}\n{}", stats(n));
            let r = completion(a, qa, true);
            assert_eq!(r["status"], "success", "{op} {len}: {r}");
            assert_eq!(r["wr_id"], 10 + k);
            assert_eq!(r["byte_len"], len);
            assert_eq!(r["imm_data"], if k == 1 { json!(5) } else { Value::Null });
            same(n, &get(a, ka, dst, len), &d, &format!("{op} of {len} B"));
        }
    }
    // Atomics on a word of B's region; the original values come back into A's.
    let word = ab + 4096;
    put(b, kb, word, &40u64.to_le_bytes());
    post(
        a,
        qa,
        json!({"opcode": "fetch-add", "wr_id": 5, "sge": sge(aa, 8, ka),
                        "remote_addr": word, "rkey": kb, "add": 2}),
    );
    assert_eq!(completion(a, qa, false)["opcode"], "fetch-add");
    assert_eq!(get(a, ka, aa, 8), 40u64.to_le_bytes());
    post(
        a,
        qa,
        json!({"opcode": "cmp-swap", "wr_id": 6, "sge": sge(aa + 8, 8, ka),
                        "remote_addr": word, "rkey": kb, "compare": 42, "swap": 7}),
    );
    assert_eq!(completion(a, qa, false)["opcode"], "cmp-swap");
    assert_eq!(get(a, ka, aa + 8, 8), 42u64.to_le_bytes());
    post(
        a,
        qa,
        json!({"opcode": "cmp-swap", "wr_id": 7, "sge": sge(aa + 16, 8, ka),
                        "remote_addr": word, "rkey": kb, "compare": 42, "swap": 9}),
    );
    assert_eq!(completion(a, qa, false)["status"], "success");
    assert_eq!(
        get(a, ka, aa + 16, 8),
        7u64.to_le_bytes(),
        "a failed compare returns the word"
    );
    assert_eq!(get(b, kb, word, 8), 7u64.to_le_bytes(), "and leaves it");
}

const SIZES: [usize; 11] = [1, 3, 64, 1023, 1024, 1025, 4095, 4096, 4097, 65536, 1 << 20];

fn sum(report: &Value, name: &str) -> u64 {
    report["rdma"]
        .as_array()
        .map(|v| {
            v.iter()
                .map(|l| l["counters"][name].as_u64().unwrap_or(0))
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn every_opcode_and_size_at_mtu_1024_and_4096_over_ipv4_and_ipv6() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = Nodes::start("ops", 7500);
    let ra = reg(&n.api[0], 4 << 20);
    let rb = reg(&n.api[1], 4 << 20);
    // QPs on both lcores of each node, crossed, so frames are handed between lcores too.
    for (k, (mtu, la, lb, v6)) in [(1024, 0, 1, false), (4096, 1, 0, true), (4096, 0, 0, false)]
        .into_iter()
        .enumerate()
    {
        let (qa, qb) = pair(&n, Some(la), Some(lb), mtu, v6);
        let q = n.api[0].ok(n.api[0].get(&format!("/v1/qps/{qa}")));
        assert_eq!(q["path-mtu"], mtu);
        assert_eq!(q["lcore"], la);
        every_opcode(&n, qa, qb, ra, rb, &SIZES, k as u32 * 1000);
        n.api[0].ok(n.api[0].delete(&format!("/v1/qps/{qa}")));
        n.api[1].ok(n.api[1].delete(&format!("/v1/qps/{qb}")));
    }
    let stats = n.api[1].ok(n.api[1].get("/v1/stats"));
    let handoffs: u64 = stats["lcores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["counters"]["handoffs"].as_u64().unwrap())
        .sum();
    assert!(
        handoffs > 0,
        "QPs on crossed lcores hand frames over: {stats}"
    );
    let [a, b] = n.stop();
    for r in [&a, &b] {
        assert_eq!(
            sum(r, "local_ack_timeout_err"),
            0,
            "a clean link times nothing out"
        );
        assert_eq!(sum(r, "handoff_drops"), 0);
    }
    assert!(sum(&b, "rx_write_requests") > 0 && sum(&b, "rx_read_requests") > 0);
    assert_eq!(sum(&b, "rx_atomic_requests"), 3 * 3);
}

/// Posts a 4 KiB WRITE from A's slot `i` to B's slot `i` on every pair, then waits for every
/// completion, then checks B's slots all at once.
fn write_every_pair(n: &Nodes, pairs: &[(usize, u32, u32)], ra: (u32, u64), rb: (u32, u64)) {
    const SLOT: u64 = 4096;
    let (a, b) = (&n.api[0], &n.api[1]);
    for &(i, qa, _) in pairs {
        let d = pattern(SLOT as usize, 7 + i as u32);
        put(a, ra.0, ra.1 + i as u64 * SLOT, &d);
        post(
            a,
            qa,
            json!({"opcode": "write", "wr_id": i, "sge": sge(ra.1 + i as u64 * SLOT, SLOT as usize, ra.0),
                           "remote_addr": rb.1 + i as u64 * SLOT, "rkey": rb.0}),
        );
    }
    for &(i, qa, _) in pairs {
        let c = completion(a, qa, false);
        assert_eq!(c["status"], "success", "QP {qa}: {c}\n{}", stats(n));
        assert_eq!(c["wr_id"], i);
    }
    for &(i, _, _) in pairs {
        same(
            n,
            &get(b, rb.0, rb.1 + i as u64 * SLOT, SLOT as usize),
            &pattern(SLOT as usize, 7 + i as u32),
            &format!("slot {i}"),
        );
    }
}

#[test]
fn a_thousand_qps_over_two_lcores_and_qps_come_and_go_under_traffic() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = Nodes::start("many", 7510);
    const QPS: usize = 1000;
    let ra = reg(&n.api[0], (QPS as u64 + 300) * 4096);
    let rb = reg(&n.api[1], (QPS as u64 + 300) * 4096);
    let t0 = std::time::Instant::now();
    let mut pairs: Vec<(usize, u32, u32)> = (0..QPS)
        .map(|i| {
            let (qa, qb) = pair(&n, None, None, 1024, false);
            (i, qa, qb)
        })
        .collect();
    let setup = t0.elapsed();
    eprintln!(
        "{QPS} QP pairs created and connected through REST in {:.2} s ({:.0} QPs per second per node)",
        setup.as_secs_f64(),
        QPS as f64 / setup.as_secs_f64()
    );
    for api in &n.api {
        let list = api.ok(api.get("/v1/qps"));
        let list = list.as_array().unwrap();
        assert_eq!(list.len(), QPS);
        let on0 = list.iter().filter(|q| q["lcore"] == 0).count();
        assert_eq!(on0, QPS / 2, "QPs are spread evenly over the two lcores");
        assert!(list.iter().all(|q| q["state"] == "RTS"));
    }
    write_every_pair(&n, &pairs, ra, rb);

    // Streams on a few QPs keep traffic flowing while half of the others are destroyed and new
    // ones are created, connected and used.
    let streams: Vec<_> = pairs[..4]
        .iter()
        .map(|&(i, qa, _)| {
            let base = n.api[0].base.clone();
            std::thread::spawn(move || {
                let api = Api::new(base.trim_start_matches("http://"));
                api.ok(api.post(
                    &format!("/v1/qps/{qa}/stream"),
                    json!({"opcode": "write", "wr_id": 1_000_000, "sge": sge(ra.1 + i as u64 * 4096, 4096, ra.0),
                           "remote_addr": rb.1 + i as u64 * 4096, "rkey": rb.0,
                           "count": 20000, "depth": 16, "timeout_ms": 120000}),
                ))
            })
        })
        .collect();
    let gone: Vec<(usize, u32, u32)> = pairs.drain(QPS / 2..).collect();
    for &(_, qa, qb) in &gone {
        n.api[0].ok(n.api[0].delete(&format!("/v1/qps/{qa}")));
        n.api[1].ok(n.api[1].delete(&format!("/v1/qps/{qb}")));
    }
    let fresh: Vec<(usize, u32, u32)> = (QPS..QPS + 200)
        .map(|i| {
            let (qa, qb) = pair(&n, None, None, 4096, true);
            (i, qa, qb)
        })
        .collect();
    write_every_pair(&n, &fresh, ra, rb);
    for s in streams {
        let r = s.join().unwrap();
        assert_eq!(r["completed"], 20000, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
    }
    // A destroyed QP is gone for good; the survivors still work.
    let (_, qa, _) = gone[0];
    assert_eq!(n.api[0].get(&format!("/v1/qps/{qa}")).0, 404);
    write_every_pair(&n, &pairs[4..64], ra, rb);
    for api in &n.api {
        assert_eq!(
            api.ok(api.get("/v1/qps")).as_array().unwrap().len(),
            QPS / 2 + 200
        );
    }
    let [a, b] = n.stop();
    for r in [&a, &b] {
        assert_eq!(sum(r, "local_ack_timeout_err"), 0);
        assert_eq!(sum(r, "handoff_drops"), 0);
    }
    assert!(sum(&b, "rx_write_requests") >= 4 * 20000);
}

#[test]
fn transfers_complete_over_links_that_lose_reorder_and_duplicate() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = Nodes::start("lossy", 7520);
    // Both directions of the link: each node's transmit side loses 1 %, reorders 1 % (held
    // back 20 us) and duplicates 1 % of its frames.
    for api in &n.api {
        let v = api.ok(api.put(
            "/v1/ports/0/impair",
            json!({"direction": "tx", "loss": 0.01, "reorder": 0.01, "duplicate": 0.01}),
        ));
        assert_eq!(v["loss"], 0.01);
    }
    // Bad settings are refused whole, naming the field, and change nothing.
    let (s, e) = n.api[0].put(
        "/v1/ports/0/impair",
        json!({"direction": "tx", "loss": 1.5}),
    );
    assert_eq!((s, e["code"].as_str()), (400, Some("bad_body")), "{e}");
    assert!(e["message"].as_str().unwrap().contains("loss"), "{e}");
    let (s, _) = n.api[0].put("/v1/ports/0/impair", json!({"direction": "sideways"}));
    assert_eq!(s, 400);
    assert_eq!(
        n.api[0]
            .put("/v1/ports/7/impair", json!({"direction": "tx"}))
            .0,
        404
    );
    let shown = n.api[0].ok(n.api[0].get("/v1/ports/0/impair"));
    assert_eq!(shown["tx"]["settings"]["loss"], 0.01, "{shown}");

    let ra = reg(&n.api[0], 4 << 20);
    let rb = reg(&n.api[1], 4 << 20);
    for (k, (mtu, la, lb)) in [(1024, 0, 1), (4096, 1, 1)].into_iter().enumerate() {
        let (qa, qb) = pair(&n, Some(la), Some(lb), mtu, k == 1);
        every_opcode(&n, qa, qb, ra, rb, &SIZES, 50 + k as u32 * 1000);
    }
    // A stream of 4 KiB WRITEs, 16 outstanding, on a pair of its own.
    let (qa, _) = pair(&n, None, None, 1024, false);
    let r = n.api[0].ok(n.api[0].post(
        &format!("/v1/qps/{qa}/stream"),
        json!({"opcode": "write", "sge": sge(ra.1, 4096, ra.0), "remote_addr": rb.1,
               "rkey": rb.0, "count": 3000, "depth": 16, "timeout_ms": 120000}),
    ));
    assert_eq!(
        (r["completed"].as_u64(), r["errors"].as_u64()),
        (Some(3000), Some(0)),
        "{r}"
    );
    same(
        &n,
        &get(&n.api[1], rb.0, rb.1, 4096),
        &get(&n.api[0], ra.0, ra.1, 4096),
        "stream",
    );

    let imp: Vec<Value> = n
        .api
        .iter()
        .map(|a| a.ok(a.get("/v1/ports/0/impair")))
        .collect();
    for i in &imp {
        for c in ["lost", "duplicated", "reordered"] {
            assert!(i["tx"]["counters"][c].as_u64().unwrap() > 0, "{c}: {i}");
        }
    }
    eprintln!(
        "impairment counters: A {}\nB {}",
        imp[0]["tx"]["counters"], imp[1]["tx"]["counters"]
    );
    let [a, b] = n.stop();
    let c = |name: &str| sum(&a, name) + sum(&b, name);
    eprintln!(
        "retransmission and duplicate counters: duplicate_request {} out_of_sequence {} packet_seq_err {} local_ack_timeout_err {} implied_nak_seq_err {}",
        c("duplicate_request"),
        c("out_of_sequence"),
        c("packet_seq_err"),
        c("local_ack_timeout_err"),
        c("implied_nak_seq_err")
    );
    assert!(
        c("duplicate_request") > 0,
        "duplicates reach the responders"
    );
    assert!(c("out_of_sequence") > 0, "losses open PSN gaps");
    assert!(
        c("packet_seq_err") + c("local_ack_timeout_err") > 0,
        "requesters retransmit after NAKs or timeouts"
    );
    assert_eq!(c("req_transport_retries_exceeded"), 0);
}
