//! RDMA helpers for the multi-node tests: a cluster of roced nodes driven through their REST
//! APIs, and the checks that move data between them.
#![allow(dead_code)]

use super::*;
use serde_json::{Value, json};

/// Every access right, as the API names them.
pub const ALL: [&str; 4] = [
    "local-write",
    "remote-write",
    "remote-read",
    "remote-atomic",
];

/// Running nodes, their API clients and their GIDs (IPv4, IPv6); namespaces (if any) last, so
/// they go after the nodes.
pub struct Cluster {
    pub nodes: Vec<Option<Roced>>,
    pub api: Vec<Api>,
    pub gids: Vec<(String, String)>,
    pub netns: Vec<Netns>,
    pub dir: std::path::PathBuf,
}

impl Cluster {
    /// Waits for every node's link and API.
    pub fn new(
        nodes: Vec<Roced>,
        apis: Vec<String>,
        gids: Vec<(String, String)>,
        netns: Vec<Netns>,
        dir: std::path::PathBuf,
    ) -> Cluster {
        let mut c = Cluster {
            nodes: nodes.into_iter().map(Some).collect(),
            api: apis.iter().map(|a| Api::new(a)).collect(),
            gids,
            netns,
            dir,
        };
        for (i, r) in c.nodes.iter_mut().enumerate() {
            let r = r.as_mut().unwrap();
            assert!(
                r.wait_log("link up", Duration::from_secs(30)),
                "node {i} did not come up:\n{}",
                r.log_text()
            );
        }
        for api in &c.api {
            assert!(
                api.wait_up(Duration::from_secs(10)),
                "API of {} down",
                api.base
            );
        }
        c
    }

    /// Stops every node; each must exit 0 with every mbuf back. Their reports, in order.
    pub fn stop(mut self) -> Vec<Value> {
        let mut out = Vec::new();
        for r in self.nodes.iter().flatten() {
            r.signal_stop();
        }
        for r in self.nodes.iter_mut() {
            let (code, report, log) = r.take().unwrap().terminate();
            assert_eq!(code, 0, "roced exited {code}:\n{log}");
            assert_eq!(report["mbufs_in_use_at_exit"], 0, "{log}");
            out.push(report);
        }
        out
    }
}

/// A region of `len` bytes with every access right; returns (key, addr).
pub fn reg(api: &Api, len: u64) -> (u32, u64) {
    let v = api.ok(api.post("/v1/mrs", json!({"length": len, "access": ALL})));
    (
        v["lkey"].as_u64().unwrap() as u32,
        v["addr"].as_u64().unwrap(),
    )
}

pub fn create_qp(api: &Api, lcore: Option<usize>) -> u32 {
    let body = match lcore {
        Some(l) => json!({"lcore": l}),
        None => json!({}),
    };
    api.ok(api.post("/v1/qps", body))["qpn"].as_u64().unwrap() as u32
}

/// The PSN a QP starts sending with (random at creation; its sq-psn).
pub fn psn_of(api: &Api, qpn: u32) -> u32 {
    let v = api.ok(api.get(&format!("/v1/qps/{qpn}")));
    v["sq-psn"].as_u64().unwrap_or_else(|| panic!("{v}")) as u32
}

/// Connects `qpn` to the peer QP `remote_qpn` of node `remote` (whose starting PSN it reads
/// there, as verbs programs exchange theirs) at `gid`.
pub fn connect(api: &Api, qpn: u32, (remote, remote_qpn): (&Api, u32), gid: &str, mtu: u32) {
    let psn = psn_of(remote, remote_qpn);
    let v = api.ok(api.post(
        &format!("/v1/qps/{qpn}/connect"),
        json!({"remote_qpn": remote_qpn, "remote_gid": gid, "remote_psn": psn, "mtu": mtu}),
    ));
    assert_eq!(v["state"], "RTS", "{v}");
}

/// A connected QP pair: (A's QPN, B's QPN).
pub fn pair(n: &Cluster, la: Option<usize>, lb: Option<usize>, mtu: u32, v6: bool) -> (u32, u32) {
    pair_between(n, 0, 1, la, lb, mtu, v6)
}

/// A connected QP pair between nodes `a` and `b`: (a's QPN, b's QPN).
pub fn pair_between(
    n: &Cluster,
    a: usize,
    b: usize,
    la: Option<usize>,
    lb: Option<usize>,
    mtu: u32,
    v6: bool,
) -> (u32, u32) {
    let qa = create_qp(&n.api[a], la);
    let qb = create_qp(&n.api[b], lb);
    let gid = |i: usize| {
        if v6 {
            n.gids[i].1.clone()
        } else {
            n.gids[i].0.clone()
        }
    };
    connect(&n.api[a], qa, (&n.api[b], qb), &gid(b), mtu);
    connect(&n.api[b], qb, (&n.api[a], qa), &gid(a), mtu);
    (qa, qb)
}

pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
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

pub fn put(api: &Api, key: u32, addr: u64, data: &[u8]) {
    api.ok(api.put_bytes(&format!("/v1/mrs/{key}/data?addr={addr}"), data));
}

pub fn get(api: &Api, key: u32, addr: u64, len: usize) -> Vec<u8> {
    let (s, b) = api.get_bytes(&format!("/v1/mrs/{key}/data?addr={addr}&length={len}"));
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&b));
    b
}

/// Waits for one completion of the kind asked; panics with the QP's state if none comes.
pub fn completion(api: &Api, qpn: u32, recv: bool) -> Value {
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
pub fn stats(n: &Cluster) -> String {
    n.api
        .iter()
        .enumerate()
        .map(|(i, a)| format!("node {i}: {}\n", a.get("/v1/stats").1))
        .collect()
}

/// Asserts two byte strings are equal, naming the first difference.
pub fn same(n: &Cluster, got: &[u8], want: &[u8], what: &str) {
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

pub fn post(api: &Api, qpn: u32, wr: Value) {
    api.ok(api.post(&format!("/v1/qps/{qpn}/send"), wr));
}

pub fn sge(addr: u64, len: usize, key: u32) -> Value {
    json!([{"addr": addr, "length": len, "lkey": key}])
}

/// Every opcode at every size on one QP pair; every byte read back and compared.
#[allow(clippy::too_many_arguments)]
pub fn every_opcode(
    n: &Cluster,
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

/// Message sizes every opcode is tried at: around each MTU and up to 1 MiB.
pub const SIZES: [usize; 11] = [1, 3, 64, 1023, 1024, 1025, 4095, 4096, 4097, 65536, 1 << 20];

/// The sum of one RDMA counter over a report's lcores.
pub fn sum(report: &Value, name: &str) -> u64 {
    counter_in(report, "rdma", name)
}

/// Posts a 4 KiB WRITE from A's slot `i` to B's slot `i` on every pair, then waits for every
/// completion, then checks B's slots all at once.
pub fn write_every_pair(n: &Cluster, pairs: &[(usize, u32, u32)], ra: (u32, u64), rb: (u32, u64)) {
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

/// The configuration of one of [`memif_nodes`]: two lcores, a memif port of MTU 9000 with
/// 10.89.0.`me`/24 and fd89::`me`/64, its API on 127.0.0.1:`api`.
pub fn memif_node_config(
    prefix: &str,
    role: &str,
    sock: &str,
    me: u8,
    peer: u8,
    api: u16,
) -> String {
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

/// Two nodes, A (10.89.0.1, fd89::1) and B (.2), joined by memif.
pub fn memif_nodes(tag: &str, api_base: u16) -> Cluster {
    require_root();
    let dir = tmpdir(tag);
    let sock = dir.join("memif.sock");
    let sock = sock.to_str().unwrap();
    let pid = std::process::id();
    let mut a = Roced::start(
        &dir,
        "a",
        &memif_node_config(
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
        &memif_node_config(
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
    Cluster::new(
        vec![a, b],
        vec![
            format!("127.0.0.1:{api_base}"),
            format!("127.0.0.1:{}", api_base + 1),
        ],
        vec![
            ("10.89.0.1".into(), "fd89::1".into()),
            ("10.89.0.2".into(), "fd89::2".into()),
        ],
        Vec::new(),
        dir,
    )
}

/// rocectl (in-process: `cli::ctl::run`) against node `api`: exit status, stdout, stderr.
pub fn rocectl(api: &str, args: &[&str]) -> (u8, String, String) {
    let (mut o, mut e) = (Vec::new(), Vec::new());
    let argv = ["rocectl", "--api", api]
        .into_iter()
        .chain(args.iter().copied());
    let code = cli::ctl::run(argv, &mut o, &mut e);
    (
        code,
        String::from_utf8(o).unwrap(),
        String::from_utf8(e).unwrap(),
    )
}

/// rocectl --json, which must succeed; its JSON.
pub fn rocectl_json(api: &str, args: &[&str]) -> Value {
    let mut a = vec!["--json"];
    a.extend_from_slice(args);
    let (code, out, err) = rocectl(api, &a);
    assert_eq!(code, 0, "rocectl {args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("rocectl {args:?}: {e}: {out}"))
}
