//! Two roced processes joined by net_memif, two worker lcores each, move RDMA traffic that
//! the tests drive only through the REST API: every opcode at sizes from 1 B to 1 MiB and path
//! MTUs 1024 and 4096 with every byte checked; a thousand QPs per node spread over both lcores;
//! QPs created and destroyed while others carry traffic; and the same over links that lose,
//! reorder and duplicate frames.
//!
//! The nodes' four lcores share this machine's two CPUs, so the tests run one at a time.

mod common;
use common::rdma::*;
use common::*;
use serde_json::{Value, json};
use std::sync::Mutex;
use std::time::Duration;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[test]
fn every_opcode_and_size_at_mtu_1024_and_4096_over_ipv4_and_ipv6() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = memif_nodes("ops", 7500);
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
    let [a, b]: [Value; 2] = n.stop().try_into().unwrap();
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
    // Over IPv4 at MTU 4096, full segments leave attached from the regions (memif transmits
    // chains): WRITEs and SENDs from A, READ responses from B; the data checks above hold.
    for (r, who) in [(&a, "A"), (&b, "B")] {
        assert!(
            sum(r, "tx_attached_pkts") > 0,
            "{who} attached no payload: {r}"
        );
    }
}

#[test]
fn a_thousand_qps_over_two_lcores_and_qps_come_and_go_under_traffic() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = memif_nodes("many", 7510);
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
    // A QP streams one thing at a time: a second stream is refused, the first goes on.
    std::thread::sleep(Duration::from_millis(50));
    let (s2, e) = n.api[0].post(
        &format!("/v1/qps/{}/stream", pairs[0].1),
        json!({"opcode": "write", "sge": sge(ra.1, 64, ra.0), "remote_addr": rb.1,
               "rkey": rb.0, "count": 1}),
    );
    assert_eq!(
        (s2, e["code"].as_str()),
        (409, Some("stream_refused")),
        "{e}"
    );
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
    let [a, b]: [Value; 2] = n.stop().try_into().unwrap();
    for r in [&a, &b] {
        assert_eq!(sum(r, "local_ack_timeout_err"), 0);
        assert_eq!(sum(r, "handoff_drops"), 0);
    }
    assert!(sum(&b, "rx_write_requests") >= 4 * 20000);
}

#[test]
fn ten_thousand_qps_created_and_connected_through_rest() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = memif_nodes("tenk", 7560);
    const QPS: usize = 10_000;
    const CLIENTS: usize = 4;
    let ra = reg(&n.api[0], 101 * 4096);
    let rb = reg(&n.api[1], 101 * 4096);
    // Four clients at once, as an orchestrator would: each creates a QP on both nodes and
    // connects the two (four REST calls per pair).
    let t0 = std::time::Instant::now();
    let pairs: Vec<(u32, u32)> = std::thread::scope(|sc| {
        let workers: Vec<_> = (0..CLIENTS)
            .map(|_| {
                sc.spawn(|| {
                    (0..QPS / CLIENTS)
                        .map(|_| pair(&n, None, None, 1024, false))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "{QPS} QP pairs created and connected through REST by {CLIENTS} clients in {secs:.2} s: \
         {:.0} QPs per second per node ({:.0} REST calls per second in all)",
        QPS as f64 / secs,
        4.0 * QPS as f64 / secs
    );
    for api in &n.api {
        let m = String::from_utf8(api.get_bytes("/metrics").1).unwrap();
        let rts: f64 = ["0", "1"]
            .iter()
            .map(|l| series(&m, &format!(r#"ferroce_qps{{lcore="{l}",state="RTS"}}"#)).unwrap())
            .sum();
        assert_eq!(rts, QPS as f64, "every QP is in RTS");
    }
    // Every hundredth pair carries a verified WRITE.
    let sample: Vec<(usize, u32, u32)> = pairs
        .iter()
        .step_by(100)
        .enumerate()
        .map(|(i, &(qa, qb))| (i, qa, qb))
        .collect();
    write_every_pair(&n, &sample, ra, rb);
    n.stop();
}

#[test]
fn transfers_complete_over_links_that_lose_reorder_and_duplicate() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = memif_nodes("lossy", 7520);
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
    let [a, b]: [Value; 2] = n.stop().try_into().unwrap();
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

#[test]
fn wrong_input_at_each_step_gets_a_clear_error_and_changes_nothing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = memif_nodes("bad", 7530);
    let a = &n.api[0];
    let code = |r: (u16, Value)| (r.0, r.1["code"].as_str().unwrap_or("").to_string());
    // Regions.
    assert_eq!(
        code(a.post_text("/v1/mrs", "{not json")),
        (400, "bad_body".into())
    );
    assert_eq!(
        code(a.post("/v1/mrs", json!({"length": 0}))),
        (400, "bad_length".into())
    );
    assert_eq!(
        code(a.post("/v1/mrs", json!({"length": 8, "access": ["remote-write"]}))),
        (400, "bad_access".into())
    );
    assert_eq!(
        code(a.post("/v1/mrs", json!({"length": 8, "access": ["everything"]}))),
        (400, "bad_access".into())
    );
    assert_eq!(
        code(a.post("/v1/mrs", json!({"length": 8, "colour": "red"}))),
        (400, "bad_body".into())
    );
    assert_eq!(
        a.ok(a.get("/v1/mrs")).as_array().unwrap().len(),
        0,
        "no region was made"
    );
    let (key, addr) = reg(a, 4096);
    assert_eq!(
        code(a.put_bytes(
            &format!("/v1/mrs/{key}/data?addr={}", addr + 4090),
            &[0u8; 16]
        )),
        (400, "out_of_bounds".into())
    );
    assert_eq!(
        code(a.get(&format!("/v1/mrs/{}", key + 1))),
        (404, "not_found".into())
    );
    assert_eq!(code(a.delete("/v1/mrs/zzz")), (400, "bad_path".into()));
    assert_eq!(
        get(a, key, addr, 16),
        vec![0u8; 16],
        "the refused write changed nothing"
    );
    // QPs.
    assert_eq!(
        code(a.post("/v1/qps", json!({"lcore": 9}))),
        (400, "bad_lcore".into())
    );
    assert_eq!(
        code(a.post("/v1/qps", json!({"cc": "reno"}))),
        (400, "bad_cc".into())
    );
    assert_eq!(
        code(a.post("/v1/qps", json!({"dcqcn": {"rpg_time_reset": 0}}))),
        (400, "bad_cc".into())
    );
    assert_eq!(
        code(a.post("/v1/qps", json!({"dcqcn": {"no_such_knob": 1}}))),
        (400, "bad_cc".into())
    );
    assert_eq!(
        code(a.post("/v1/qps", json!({"max_send_wr": 1_000_000}))),
        (400, "bad_caps".into())
    );
    assert_eq!(
        a.ok(a.get("/v1/qps")).as_array().unwrap().len(),
        0,
        "no QP was made"
    );
    let q = create_qp(a, None);
    let connect = |body: Value| code(a.post(&format!("/v1/qps/{q}/connect"), body));
    assert_eq!(
        connect(json!({"remote_qpn": 2, "remote_gid": "10.89.0.2", "mtu": 1000})),
        (400, "bad_attr".into())
    );
    assert_eq!(
        connect(json!({"remote_qpn": 2, "remote_gid": "not-an-ip"})),
        (400, "bad_gid".into())
    );
    assert_eq!(
        connect(json!({"remote_qpn": 2, "remote_gid": "192.0.2.1"})),
        (400, "no_route".into())
    );
    assert_eq!(
        connect(json!({"remote_qpn": 1 << 24, "remote_gid": "10.89.0.2"})),
        (400, "bad_attr".into())
    );
    assert_eq!(
        connect(json!({"remote_qpn": 2, "remote_gid": "10.89.0.2", "retry_cnt": 8})),
        (400, "bad_attr".into())
    );
    // QPs start at random PSNs: a connect must say where the peer's starts.
    assert_eq!(
        connect(json!({"remote_qpn": 2, "remote_gid": "10.89.0.2"})),
        (400, "missing".into())
    );
    assert_eq!(
        a.ok(a.get(&format!("/v1/qps/{q}")))["state"],
        "RESET",
        "refused connects left it in RESET"
    );
    // Posting on a QP that is not connected is refused; so are bad work requests.
    let wr = json!({"opcode": "write", "sge": sge(addr, 8, key), "remote_addr": 0, "rkey": 1});
    assert_eq!(
        code(a.post(&format!("/v1/qps/{q}/send"), wr)),
        (409, "post_refused".into())
    );
    assert_eq!(
        code(a.post(&format!("/v1/qps/{q}/send"), json!({"opcode": "teleport"}))),
        (400, "bad_wr".into())
    );
    assert_eq!(
        code(a.post(
            &format!("/v1/qps/{q}/send"),
            json!({"opcode": "read", "sge": []})
        )),
        (400, "bad_wr".into())
    );
    assert_eq!(
        code(a.post("/v1/qps/77/send", json!({"opcode": "send"}))),
        (404, "not_found".into())
    );
    assert_eq!(
        code(a.post(
            &format!("/v1/qps/{q}/stream"),
            json!({"opcode": "send", "count": 1})
        )),
        (409, "stream_refused".into())
    );
    // A latency test runs iterations or a duration: both, neither, or a zero duration is a
    // bad request; a QP that is not connected refuses a good one.
    let lat = |extra: Value| {
        let mut b = json!({"test": "request", "wr": {"opcode": "read", "remote_addr": 0,
                                                     "rkey": 1, "sge": []}});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        code(a.post(&format!("/v1/qps/{q}/latency"), b))
    };
    for bad in [
        json!({}),
        json!({"iters": 10, "duration_ms": 1000}),
        json!({"duration_ms": 0}),
        json!({"iters": 0}),
    ] {
        assert_eq!(lat(bad.clone()), (400, "bad_test".into()), "{bad}");
    }
    assert_eq!(
        lat(json!({"duration_ms": 100})),
        (409, "test_refused".into())
    );
    // Groups start on all their QPs or on none: a QP in RESET refuses the group.
    assert_eq!(
        code(a.post(
            "/v1/streams",
            json!({"qps": [{"qpn": q}], "wr": {"opcode": "send"}, "count": 1})
        )),
        (409, "stream_refused".into())
    );
    assert_eq!(
        code(a.post("/v1/recv-streams", json!({"qpns": [q], "count": 1}))),
        (409, "stream_refused".into())
    );
    assert_eq!(code(a.get("/v2/qps")), (404, "not_found".into()));
    // Connected, then connected again: refused, and the QP still works.
    let qb = create_qp(&n.api[1], None);
    connect_pair_check(&n, q, qb, (key, addr));
    let again = code(a.post(
        &format!("/v1/qps/{q}/connect"),
        json!({"remote_qpn": qb, "remote_gid": "10.89.0.2", "remote_psn": psn_of(&n.api[1], qb)}),
    ));
    assert_eq!(again, (409, "bad_state".into()));
    assert_eq!(a.ok(a.get(&format!("/v1/qps/{q}")))["state"], "RTS");
    // An RC QP takes no UD destination or Q_Key.
    let ud = json!({"remote_gid": "10.89.0.2", "remote_qpn": 5, "remote_qkey": 7});
    let wr = json!({"opcode": "send", "sge": sge(addr, 8, key), "ud": ud});
    assert_eq!(
        code(a.post(&format!("/v1/qps/{q}/send"), wr)),
        (400, "bad_wr".into())
    );
    assert_eq!(
        code(a.post(
            &format!("/v1/qps/{q}/modify"),
            json!({"state": "RTS", "qkey": 1})
        )),
        (400, "bad_attr".into())
    );
    assert_eq!(
        code(a.post("/v1/qps", json!({"type": "XRC"}))),
        (400, "bad_type".into())
    );
    // UD QPs: no connect, a Q_Key at INIT, no RC attributes; a datagram each way.
    let b = &n.api[1];
    let ua = a.ok(a.post("/v1/qps", json!({"type": "UD"})))["qpn"]
        .as_u64()
        .unwrap() as u32;
    let ub = b.ok(b.post("/v1/qps", json!({"type": "UD"})))["qpn"]
        .as_u64()
        .unwrap() as u32;
    assert_eq!(
        code(a.post(
            &format!("/v1/qps/{ua}/connect"),
            json!({"remote_qpn": ub, "remote_gid": "10.89.0.2"})
        )),
        (409, "bad_state".into())
    );
    let init =
        |api: &Api, qp: u32, body: Value| code(api.post(&format!("/v1/qps/{qp}/modify"), body));
    assert_eq!(
        init(a, ua, json!({"state": "INIT"})),
        (400, "bad_attr".into())
    );
    assert_eq!(
        init(
            a,
            ua,
            json!({"state": "INIT", "qkey": 9, "access": ["remote-write"]})
        ),
        (400, "bad_attr".into())
    );
    for (api, qp) in [(a, ua), (b, ub)] {
        for body in [
            json!({"state": "INIT", "qkey": 0x1111_1111}),
            json!({"state": "RTR"}),
            json!({"state": "RTS", "local_psn": 100}),
        ] {
            let r = api.ok(api.post(&format!("/v1/qps/{qp}/modify"), body));
            assert_eq!(
                (r["type"].as_str(), r["qkey"].as_u64()),
                (Some("UD"), Some(0x1111_1111))
            );
        }
    }
    let (kb, ab) = reg(b, 4096);
    b.ok(b.post(
        &format!("/v1/qps/{ub}/recv"),
        json!({"wr_id": 3, "sge": sge(ab, 40 + 8, kb)}),
    ));
    put(a, key, addr, b"datagram");
    let ud = json!({"remote_gid": "10.89.0.2", "remote_qpn": ub, "remote_qkey": 0x1111_1111});
    post(
        a,
        ua,
        json!({"opcode": "send", "sge": sge(addr, 8, key), "ud": ud}),
    );
    assert_eq!(completion(a, ua, false)["status"], "success");
    let c = completion(b, ub, true);
    assert_eq!(
        (&c["status"], &c["byte_len"], &c["src_qp"]),
        (&json!("success"), &json!(48), &json!(ua))
    );
    assert_eq!(get(b, kb, ab + 40, 8), b"datagram");
    // 10.89.0.1's IPv4 header sits in the GRH's last 20 bytes.
    assert_eq!(get(b, kb, ab + 32, 4), [10, 89, 0, 1]);
    // A test that does not finish in its timeout_ms is stopped, as a killed perftest leaves
    // it (504 timeout, its QP in ERR), and the QP is usable again from RESET; the node
    // answers on.
    let body = json!({"count": 8_923_980, "timeout_ms": 0, "sge": [], "wr_id": 0});
    let r = b.post(&format!("/v1/qps/{qb}/recv-stream"), body);
    assert_eq!(code(r), (504, "timeout".into()));
    assert_eq!(b.ok(b.get(&format!("/v1/qps/{qb}")))["state"], "ERR");
    let r = b.ok(b.post(&format!("/v1/qps/{qb}/modify"), json!({"state": "RESET"})));
    assert_eq!(r["state"], "RESET");
    let again = json!({"qpns": [qb], "count": 1, "timeout_ms": 0});
    assert_eq!(
        code(b.post("/v1/recv-streams", again)),
        (409, "stream_refused".into()),
        "a QP in RESET refuses a test before any timeout"
    );
    let r = a.post(
        &format!("/v1/qps/{q}/stream"),
        json!({"opcode": "write", "sge": sge(addr, 8, key), "remote_addr": 0, "rkey": 1,
               "count": 100_000_000, "timeout_ms": 0}),
    );
    let (status, c) = code(r);
    assert!(
        status == 504 && c == "timeout" || status == 200,
        "{status} {c}: a stream stopped at its timeout, or one that ended on its first error"
    );
    assert_eq!(a.ok(a.get(&format!("/v1/qps/{q}")))["state"], "ERR");
    n.stop();
}

/// Connects `qa` (node 0) and `qb` (node 1) and moves one WRITE into a fresh region on B.
fn connect_pair_check(n: &Cluster, qa: u32, qb: u32, (ka, aa): (u32, u64)) {
    connect(&n.api[0], qa, (&n.api[1], qb), "10.89.0.2", 1024);
    connect(&n.api[1], qb, (&n.api[0], qa), "10.89.0.1", 1024);
    let (kb, ab) = reg(&n.api[1], 4096);
    put(&n.api[0], ka, aa, b"checked!");
    post(
        &n.api[0],
        qa,
        json!({"opcode": "write", "sge": sge(aa, 8, ka), "remote_addr": ab, "rkey": kb}),
    );
    assert_eq!(completion(&n.api[0], qa, false)["status"], "success");
    assert_eq!(get(&n.api[1], kb, ab, 8), b"checked!");
}

/// The value of the series `name{labels}` in Prometheus text, if it is there.
fn series(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn prometheus_scrapes_the_counters_of_both_nodes() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = memif_nodes("metrics", 7540);
    let ra = reg(&n.api[0], 1 << 20);
    let rb = reg(&n.api[1], 1 << 20);
    let (qa, qb) = pair(&n, Some(0), Some(1), 4096, false);
    every_opcode(&n, qa, qb, ra, rb, &[64, 8192], 7);
    let (_, _) = pair(&n, Some(1), Some(0), 1024, false); // a second pair, left idle in RTS

    // Port statistics reach the API with the control loop's refresh (every 250 ms).
    std::thread::sleep(Duration::from_millis(600));
    let scrape = |i: usize| {
        let (status, body) = n.api[i].get_bytes("/metrics");
        assert_eq!(status, 200);
        String::from_utf8(body).expect("UTF-8 exposition")
    };
    let (ta, tb) = (scrape(0), scrape(1));
    // The exposition carries what /v1/stats says, under the rxe names.
    let stats = n.api[0].ok(n.api[0].get("/v1/stats"));
    let sent0 = stats["lcores"][0]["counters"]["sent_pkts"]
        .as_f64()
        .unwrap();
    assert!(sent0 > 0.0);
    assert_eq!(
        series(&ta, r#"ferroce_sent_pkts_total{lcore="0"}"#),
        Some(sent0)
    );
    assert!(series(&tb, r#"ferroce_rx_write_requests_total{lcore="1"}"#).unwrap() > 0.0);
    assert!(series(&tb, r#"ferroce_rx_atomic_requests_total{lcore="1"}"#).unwrap() > 0.0);
    assert!(series(&ta, r#"ferroce_tx_attached_pkts_total{lcore="0"}"#).unwrap() > 0.0);
    for (t, l) in [(&ta, "0"), (&ta, "1"), (&tb, "0"), (&tb, "1")] {
        let q = format!(r#"ferroce_qps{{lcore="{l}",state="RTS"}}"#);
        assert_eq!(series(t, &q), Some(1.0), "{q} in\n{t}");
        let d = format!(r#"ferroce_dcqcn_qps{{lcore="{l}"}}"#);
        assert_eq!(series(t, &d), Some(1.0), "{d}");
    }
    assert!(
        series(
            &ta,
            r#"ferroce_port_tx_packets_total{device="net_memif0",port="0"}"#
        )
        .unwrap()
            > 0.0
    );
    assert_eq!(series(&ta, r#"ferroce_port_link_up{port="0"}"#), Some(1.0));
    let rx = |l: &str| {
        series(
            &ta,
            &format!(r#"ferroce_lcore_rx_packets_total{{lcore="{l}"}}"#),
        )
    };
    assert!(rx("0").unwrap() + rx("1").unwrap() > 0.0);
    assert!(ta.contains(r#"ferroce_impair_lost_total{direction="tx",port="0"} 0"#));
    // Completion latency: every opcode posted has its histogram (A WRITEs, READs and runs the
    // atomics; B SENDs), all under 10 s.
    for (t, op) in [
        (&ta, "rdma_write"),
        (&ta, "rdma_read"),
        (&tb, "send"),
        (&ta, "fetch_add"),
        (&ta, "comp_swap"),
    ] {
        let count = series(
            t,
            &format!(r#"ferroce_completion_latency_seconds_count{{opcode="{op}"}}"#),
        );
        assert!(count.unwrap() > 0.0, "{op}: {count:?}");
        let b = |le: &str| {
            series(
                t,
                &format!(r#"ferroce_completion_latency_seconds_bucket{{opcode="{op}",le="{le}"}}"#),
            )
        };
        assert_eq!(b("+Inf"), count);
        assert_eq!(b("10"), count);
        assert!(b("0.000001").unwrap() <= b("0.001").unwrap());
    }

    // promtool finds nothing to complain about.
    for t in [&ta, &tb] {
        let mut c = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("promtool (Debian's prometheus package; scripts/setup.sh installs it)");
        use std::io::Write;
        c.stdin.take().unwrap().write_all(t.as_bytes()).unwrap();
        let out = c.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && said.trim().is_empty(),
            "promtool: {said}"
        );
    }

    // A real Prometheus scrapes both nodes; its queries give the nodes' figures.
    let dir = tmpdir("prometheus");
    std::fs::write(
        dir.join("prometheus.yml"),
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: ferroce\n    static_configs:\n      \
         - targets: ['127.0.0.1:7540', '127.0.0.1:7541']\n",
    )
    .unwrap();
    /// The Prometheus server, stopped however the test ends.
    struct Server(std::process::Child);
    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let prom = std::process::Command::new("prometheus")
        .arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg("--web.listen-address=127.0.0.1:7549")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
        .spawn()
        .expect("prometheus (Debian's prometheus package; scripts/setup.sh installs it)");
    let prom = Server(prom);
    let q = Api::new("127.0.0.1:7549");
    let query = |expr: &str| -> Option<f64> {
        let enc: String = expr
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b == b'_' {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        let (s, v) = q.get(&format!("/api/v1/query?query={enc}"));
        if s != 200 {
            return None;
        }
        v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    };
    let want_writes = series(&tb, r#"ferroce_rx_write_requests_total{lcore="1"}"#).unwrap();
    let t0 = std::time::Instant::now();
    let mut got = (None, None);
    while t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(500));
        if std::net::TcpStream::connect("127.0.0.1:7549").is_err() {
            continue;
        }
        got = (
            query("sum(ferroce_rx_write_requests_total)"),
            query(r#"sum(ferroce_qps{state="RTS"})"#),
        );
        if got.0 == Some(want_writes) && got.1 == Some(4.0) {
            break;
        }
    }
    drop(prom);
    let log = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
    assert_eq!(
        got,
        (Some(want_writes), Some(4.0)),
        "Prometheus saw other figures; its log:\n{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    n.stop();
}

/// rocectl's arguments for a 16-byte WRITE on `qa` from `addr` (key `lkey`) to `remote` (`rkey`).
fn write16<'a>(
    qa: &'a str,
    lkey: &'a str,
    addr: &'a str,
    rkey: &'a str,
    remote: &'a str,
) -> Vec<&'a str> {
    vec![
        "post",
        "write",
        qa,
        "--lkey",
        lkey,
        "--addr",
        addr,
        "--length",
        "16",
        "--rkey",
        rkey,
        "--remote-addr",
        remote,
    ]
}

/// Polls created CQ `cqn` until `n` completions arrived (or 10 s passed); returns them.
fn poll_n(api: &str, cqn: &str, n: usize) -> Vec<Value> {
    let mut got = Vec::new();
    let t0 = std::time::Instant::now();
    while got.len() < n && t0.elapsed() < Duration::from_secs(10) {
        let c = rocectl_json(
            api,
            &["cq", "poll", cqn, "--max", "16", "--wait-ms", "1000"],
        );
        got.extend(c["completions"].as_array().unwrap().iter().cloned());
    }
    got
}

/// `rocectl ... --json` for a listing: its length.
fn count(api: &str, args: &[&str]) -> usize {
    rocectl_json(api, args).as_array().map_or(0, Vec::len)
}

#[test]
fn rocectl_protection_domains_and_shared_cqs_behave_as_verbs_objects() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = memif_nodes("objs", 7580);
    let (a, b) = ("127.0.0.1:7580", "127.0.0.1:7581");
    // One port, by index; a port that is not there is refused.
    let p = rocectl_json(a, &["port", "show", "0"]);
    assert_eq!(p[0]["device"], "net_memif0", "{p}");
    let (code, _, err) = rocectl(a, &["port", "show", "3"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("not_found") || err.contains("bad_port"),
        "{err}"
    );

    // A protection domain on each node; PD 0, the default, is there from the start.
    let pa = rocectl_json(a, &["pd", "create"])["pdn"].to_string();
    let pb = rocectl_json(b, &["pd", "create"])["pdn"].to_string();
    assert_ne!(pb, "0");
    let (code, out, _) = rocectl(b, &["pd", "show"]);
    assert_eq!(code, 0);
    assert!(out.contains("pdn") && out.lines().count() == 3, "{out}");
    let all = "local-write,remote-write,remote-read,remote-atomic";
    let ma = rocectl_json(
        a,
        &["mr", "reg", "--size", "64K", "--access", all, "--pd", &pa],
    );
    let (ka, aa) = (ma["lkey"].to_string(), ma["addr"].to_string());
    assert_eq!(ma["pdn"].to_string(), pa);
    let mb = rocectl_json(
        b,
        &["mr", "reg", "--size", "64K", "--access", all, "--pd", &pb],
    );
    let (kb, ab) = (mb["lkey"].to_string(), mb["addr"].as_u64().unwrap());
    // A region of B's default PD: B's QPs (in PD pb) must not reach it.
    let m0 = rocectl_json(b, &["mr", "reg", "--size", "4K", "--access", all]);
    let (k0, a0) = (m0["lkey"].to_string(), m0["addr"].to_string());
    assert_eq!(m0["pdn"], 0);

    // One CQ for two QPs on each node; the QPs are placed on the CQ's lcore.
    let ca = rocectl_json(a, &["cq", "create", "--cqe", "4", "--lcore", "1"]);
    assert_eq!(
        (ca["lcore"].as_u64(), ca["cqe"].as_u64()),
        (Some(1), Some(4))
    );
    let ca = ca["cqn"].to_string();
    let cb = rocectl_json(b, &["cq", "create", "--cqe", "64"])["cqn"].to_string();
    let mut qa = Vec::new();
    let mut qb = Vec::new();
    for _ in 0..2 {
        let q = rocectl_json(a, &["qp", "create", "--pd", &pa, "--cq", &ca]);
        assert_eq!(q["lcore"], 1, "{q}");
        qa.push(q["qpn"].to_string());
        let q = rocectl_json(b, &["qp", "create", "--pd", &pb, "--cq", &cb]);
        qb.push(q["qpn"].to_string());
    }
    let cq = rocectl_json(a, &["cq", "show", &ca]);
    assert_eq!(
        (cq["users"].as_u64(), cq["waiting"].as_u64()),
        (Some(4), Some(0))
    );
    let q = rocectl_json(a, &["qp", "show", &qa[0]]);
    assert_eq!(q[0]["pdn"].to_string(), pa);
    assert_eq!(q[0]["send-cq"].to_string(), ca);
    assert_eq!(q[0]["recv-cq"].to_string(), ca);
    for i in 0..2 {
        for (api, me, peer_api, peer, gid) in [
            (a, &qa[i], b, &qb[i], "10.89.0.2"),
            (b, &qb[i], a, &qa[i], "10.89.0.1"),
        ] {
            // The peer's starting PSN, as its node shows it.
            let psn = rocectl_json(peer_api, &["qp", "show", peer])[0]["sq-psn"].to_string();
            let q = rocectl_json(
                api,
                &[
                    "qp",
                    "connect",
                    me,
                    "--remote-qpn",
                    peer,
                    "--remote-gid",
                    gid,
                    "--remote-psn",
                    &psn,
                ],
            );
            assert_eq!(q["state"], "RTS", "{q}");
        }
    }

    // Wrong input at each step: a clear error, and nothing created or changed.
    let before = (
        count(a, &["pd", "show"]),
        count(a, &["cq", "show"]),
        count(a, &["qp", "show"]),
        count(a, &["mr", "show"]),
    );
    for (args, code_want) in [
        (vec!["qp", "create", "--cq", "999"], "no_cq"),
        (vec!["qp", "create", "--cq", &ca, "--lcore", "0"], "bad_cq"),
        (vec!["qp", "create", "--pd", "77"], "no_pd"),
        (vec!["mr", "reg", "--size", "4K", "--pd", "77"], "no_pd"),
        (vec!["cq", "create", "--cqe", "0"], "bad_cqe"),
        (vec!["cq", "create", "--cqe", "70000"], "bad_cqe"),
        (vec!["cq", "destroy", &ca], "cq_busy"),
        (vec!["pd", "destroy", &pa], "pd_busy"),
        (vec!["pd", "destroy", "0"], "default_pd"),
        (vec!["cq", "poll", "--qp", &qa[0]], "cq_bound"),
        (vec!["cq", "poll", "4242"], "not_found"),
    ] {
        let (code, _, err) = rocectl(a, &args);
        assert_eq!(code, 1, "{args:?}");
        assert!(err.contains(code_want), "{args:?}: {err}");
    }
    let after = (
        count(a, &["pd", "show"]),
        count(a, &["cq", "show"]),
        count(a, &["qp", "show"]),
        count(a, &["mr", "show"]),
    );
    assert_eq!(before, after, "refused requests left nothing behind");

    // WRITEs on both QPs complete into the one CQ, each naming its QP.
    rocectl_json(a, &["mr", "write", &ka, "--hex", "a1a2a3a4"]);
    let remote2 = (ab + 16).to_string();
    for (i, remote) in [ab.to_string(), remote2.clone()].iter().enumerate() {
        let mut w = write16(&qa[i], &ka, &aa, &kb, remote);
        w[8] = "4";
        w.extend(["--wr-id", if i == 0 { "100" } else { "200" }]);
        rocectl_json(a, &w);
    }
    let got = poll_n(a, &ca, 2);
    assert_eq!(got.len(), 2, "{got:?}");
    let mut seen: Vec<(String, u64)> = got
        .iter()
        .map(|c| {
            assert_eq!(c["status"], "success", "{c}");
            (c["qp_num"].to_string(), c["wr_id"].as_u64().unwrap())
        })
        .collect();
    seen.sort();
    let mut want = vec![(qa[0].clone(), 100), (qa[1].clone(), 200)];
    want.sort();
    assert_eq!(seen, want);
    for addr in [ab.to_string(), remote2] {
        let r = rocectl_json(b, &["mr", "read", &kb, "--addr", &addr, "--length", "4"]);
        assert_eq!(r["hex"], "a1a2a3a4");
    }

    // The PD fences regions: B's QP is in PD pb, the region with key k0 in PD 0, so a
    // WRITE with k0 is a remote access error (and the region stays untouched).
    let mut w = write16(&qa[0], &ka, &aa, &k0, &a0);
    w[8] = "4";
    rocectl_json(a, &w);
    let got = poll_n(a, &ca, 1);
    assert_eq!(got[0]["status"], "remote access error", "{got:?}");
    assert_eq!(
        rocectl_json(b, &["mr", "read", &k0, "--length", "4"])["hex"],
        "00000000"
    );

    // Receive completions go to B's CQ. B's first QP went to ERR by itself when it refused
    // that WRITE (a responder's access error), so a receive posted to it completes at once,
    // flushed, as verbs and rxe have it; the second QP's receive takes a SEND.
    assert_eq!(rocectl_json(b, &["qp", "show", &qb[0]])[0]["state"], "ERR");
    let rb = (ab + 1024).to_string();
    for q in &qb {
        rocectl_json(
            b,
            &[
                "post", "recv", q, "--lkey", &kb, "--addr", &rb, "--length", "64",
            ],
        );
    }
    rocectl_json(
        a,
        &[
            "post", "send", &qa[1], "--lkey", &ka, "--addr", &aa, "--length", "4",
        ],
    );
    let mut got: Vec<(String, String, String)> = poll_n(b, &cb, 2)
        .iter()
        .map(|c| {
            (
                c["qp_num"].to_string(),
                c["opcode"].as_str().unwrap_or_default().to_string(),
                c["status"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    got.sort();
    let mut want = vec![
        (
            qb[0].clone(),
            "recv".into(),
            "Work Request Flushed Error".into(),
        ),
        (qb[1].clone(), "recv".into(), "success".into()),
    ];
    want.sort();
    assert_eq!(got, want);
    assert_eq!(poll_n(a, &ca, 1)[0]["opcode"], "send");

    // A CQ that is not polled overflows into its error state, as on hardware: 4 entries
    // fit, the fifth is lost, and the CQ says so.
    let sb = ab.to_string();
    for i in 0..5 {
        let mut w = write16(&qa[1], &ka, &aa, &kb, &sb);
        w[8] = "4";
        let id = (300 + i).to_string();
        w.extend(["--wr-id", &id]);
        rocectl_json(a, &w);
    }
    let t0 = std::time::Instant::now();
    let cq = loop {
        let cq = rocectl_json(a, &["cq", "show", &ca]);
        if cq["in_error"] == true || t0.elapsed() > Duration::from_secs(10) {
            break cq;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        (cq["in_error"].as_bool(), cq["waiting"].as_u64()),
        (Some(true), Some(4)),
        "{cq}"
    );
    let (code, out, _) = rocectl(a, &["cq", "poll", &ca, "--max", "16"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("overflowed") && out.matches("success").count() == 4,
        "{out}"
    );

    // Teardown in verbs order: QPs, then CQs, regions and PDs, which are then free to go.
    for q in &qa {
        rocectl_json(a, &["qp", "destroy", q]);
    }
    for q in &qb {
        rocectl_json(b, &["qp", "destroy", q]);
    }
    rocectl_json(a, &["cq", "destroy", &ca]);
    rocectl_json(b, &["cq", "destroy", &cb]);
    rocectl_json(a, &["mr", "dereg", &ka]);
    let (code, _, err) = rocectl(b, &["pd", "destroy", &pb]);
    assert_eq!(code, 1, "B's region is still in the PD");
    assert!(err.contains("pd_busy"), "{err}");
    // The error names the call that failed (perf makes many).
    let call = format!("(HTTP 409 to DELETE /v1/pds/{pb})");
    assert!(err.contains(&call), "{err}");
    rocectl_json(b, &["mr", "dereg", &kb]);
    rocectl_json(a, &["pd", "destroy", &pa]);
    rocectl_json(b, &["pd", "destroy", &pb]);
    let (code, _, err) = rocectl(a, &["pd", "show", &pa]);
    assert_eq!(code, 1);
    assert!(err.contains("not_found"), "{err}");
    assert_eq!(count(a, &["cq", "show"]), 0);
    n.stop();
}

/// `rocectl perf TEST EXTRA` with node `a` serving and node `b` connecting through perftest's
/// exchange on TCP `port`; both must succeed. The client's and the server's output.
fn perf_pair(
    a: &'static str,
    b: &str,
    test: &[&str],
    extra: &[&str],
    port: u16,
) -> (String, String) {
    let port = port.to_string();
    let mut sargs: Vec<String> = ["perf"].iter().chain(test).map(|s| s.to_string()).collect();
    sargs.extend(["--server", "-p", &port, "--timeout", "30"].map(String::from));
    sargs.extend(extra.iter().map(|s| s.to_string()));
    let server = std::thread::spawn(move || {
        let v: Vec<&str> = sargs.iter().map(String::as_str).collect();
        rocectl(a, &v)
    });
    let mut cargs = vec!["perf"];
    cargs.extend_from_slice(test);
    cargs.extend(["127.0.0.1", "-p", &port, "--timeout", "30"]);
    cargs.extend_from_slice(extra);
    let (code, cout, err) = rocectl(b, &cargs);
    assert_eq!(code, 0, "client {test:?} {extra:?}: {err}");
    let (code, sout, err) = server.join().unwrap();
    assert_eq!(code, 0, "server {test:?} {extra:?}: {err}");
    (cout, sout)
}

/// `rocectl pingpong` with `extra` on node `a` as the server and `b` as the client (to
/// 127.0.0.1): both outputs, each side checked to exit 0.
fn pingpong_pair(a: &'static str, b: &str, extra: &[&str]) -> (String, String) {
    let mut sargs = vec!["pingpong".to_string(), "--server".into()];
    sargs.extend(extra.iter().map(|s| s.to_string()));
    let server = std::thread::spawn(move || {
        let v: Vec<&str> = sargs.iter().map(String::as_str).collect();
        rocectl(a, &v)
    });
    let mut cargs = vec!["pingpong", "127.0.0.1"];
    cargs.extend_from_slice(extra);
    let (code, cout, err) = rocectl(b, &cargs);
    assert_eq!(code, 0, "client {extra:?}: {err}");
    let (code, sout, err) = server.join().unwrap();
    assert_eq!(code, 0, "server {extra:?}: {err}");
    (cout, sout)
}

/// The result line of perftest's bandwidth table: the line after the column header.
fn result_line(out: &str) -> String {
    let mut lines = out.lines();
    lines.find(|l| l.contains("#bytes"));
    lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn rocectl_perf_runs_perftest_bandwidth_tests_against_itself_through_perftests_exchange() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = memif_nodes("perf", 7590);
    let (a, b) = ("127.0.0.1:7590", "127.0.0.1:7591");
    let mut oob = 18650;
    // Node A serves, node B is the client, as two perftest processes would be.
    for (op, extra) in [
        ("write", vec!["-s", "4096", "-n", "3000"]),
        ("read", vec!["-s", "4096", "-n", "3000"]),
        ("atomic", vec!["-n", "3000", "-A", "cmp-swap"]),
        ("atomic", vec!["-n", "3000"]),
        ("write", vec!["-s", "65536", "-n", "500", "-m", "4096"]),
        ("send", vec!["-s", "4096", "-n", "3000"]),
        ("send", vec!["-s", "65536", "-n", "500", "-m", "4096"]),
        (
            "write",
            vec!["-s", "4096", "-n", "300", "-q", "16", "-t", "4"],
        ),
        (
            "read",
            vec!["-s", "1024", "-n", "300", "-q", "40", "-t", "2"],
        ),
        (
            "send",
            vec!["-s", "4096", "-n", "300", "-q", "8", "-t", "4"],
        ),
    ] {
        oob += 1;
        let (cout, sout) = perf_pair(a, b, &[op, "bw"], &extra, oob);
        let line = result_line(&cout);
        let f: Vec<f64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
        // perftest prints the iterations of all QPs together (-n 300 -q 16: 4800).
        let qps: f64 = extra
            .iter()
            .position(|&x| x == "-q")
            .map_or(1.0, |i| extra[i + 1].parse().unwrap());
        let (size, iters) = if op == "atomic" {
            (8.0, 3000.0)
        } else {
            (
                extra[1].parse().unwrap(),
                extra[3].parse::<f64>().unwrap() * qps,
            )
        };
        assert_eq!((f[0], f[1]), (size, iters), "{cout}");
        assert!(
            f[2] >= f[3] * 0.999 && f[3] > 0.0 && f[4] > 0.0,
            "peak >= average > 0, message rate > 0: {cout}"
        );
        // (MB/sec is printed to 0.01: for 8-byte atomics at a slow rate that rounding alone
        // is more than 1%.)
        let rounding = 0.005 * 1048576.0 / size / 1e6;
        assert!(
            (f[3] * 1048576.0 / size / 1e6 - f[4]).abs() < 0.01 * f[4] + rounding,
            "average bandwidth and message rate agree: {cout}"
        );
        if op == "send" {
            // A SEND server measures what it received itself.
            let g: Vec<f64> = result_line(&sout)
                .split(' ')
                .map(|x| x.parse().unwrap())
                .collect();
            assert_eq!((g[0], g[1]), (size, iters), "{sout}");
            // Peak >= average (up to the last printed digit).
            assert!(g[3] > 0.0 && g[2] >= g[3] * 0.999, "{sout}");
        } else {
            assert_eq!(
                result_line(&sout),
                line,
                "the server prints the client's results, as perftest's does"
            );
        }
        assert!(
            cout.contains("RC") && cout.contains("remote address"),
            "{cout}"
        );
        if extra.contains(&"-m") {
            assert!(cout.contains("Mtu             : 4096[B]"), "{cout}");
        }
    }
    // Duration mode (-D): as many 4 KiB WRITEs as one second takes, on 2 QPs; both sides
    // print the same (non-zero) count, and -D where it does not apply is a usage error.
    oob += 1;
    let (cout, sout) = perf_pair(
        a,
        b,
        &["write", "bw"],
        &["-s", "4096", "-D", "1", "-q", "2"],
        oob,
    );
    let f: Vec<f64> = result_line(&cout)
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    assert!(f[0] == 4096.0 && f[1] > 100.0 && f[3] > 0.0, "{cout}");
    assert_eq!(result_line(&sout), result_line(&cout), "{sout}");
    // SEND with -D, on 1 and 2 QPs: the server counts what arrives within one second of the
    // first arrival on its own receive streams (perftest's SEND server prints its own
    // figures): some, and not more than the client completed.
    for qps in ["1", "2"] {
        oob += 1;
        let (cout, sout) = perf_pair(
            a,
            b,
            &["send", "bw"],
            &["-s", "4096", "-D", "1", "-q", qps],
            oob,
        );
        let field =
            |line: &str, k: usize| -> f64 { line.split(' ').nth(k).unwrap().parse().unwrap() };
        let (c, s) = (result_line(&cout), result_line(&sout));
        assert!(field(&c, 0) == 4096.0 && field(&c, 1) > 100.0, "{cout}");
        assert!(
            field(&s, 1) > 100.0 && field(&s, 1) <= field(&c, 1) && field(&s, 3) > 0.0,
            "-q {qps}: server {s}, client {c}"
        );
    }
    // Inline (-I): 64-byte WRITEs and SENDs go inline (the QPs are created with room for
    // them); both complete and the header says so.
    for op in ["write", "send"] {
        oob += 1;
        let (cout, sout) = perf_pair(
            a,
            b,
            &[op, "bw"],
            &["-s", "64", "-n", "2000", "-I", "64"],
            oob,
        );
        assert!(result_line(&cout).starts_with("64 2000 "), "{cout}");
        assert!(cout.contains("Max inline data : 64[B]"), "{cout}");
        assert!(result_line(&sout).starts_with("64 2000 "), "{sout}");
    }
    for bad in [
        &["perf", "write", "bw", "-I", "513", "127.0.0.1"][..],
        &["perf", "write", "lat", "-D", "1", "-n", "5", "127.0.0.1"],
        &["perf", "write", "bw", "-D", "1", "-n", "5", "127.0.0.1"],
        &["perf", "write", "bw", "-D", "0", "127.0.0.1"],
    ] {
        let (code, _, err) = rocectl(b, bad);
        assert_eq!(code, 2, "{bad:?}: {err}");
    }
    // The JSON form, and nothing left behind on either node.
    oob += 1;
    let port = oob.to_string();
    let server = std::thread::spawn(move || {
        rocectl(
            a,
            &[
                "perf",
                "write",
                "bw",
                "--server",
                "-p",
                &port,
                "--timeout",
                "30",
            ],
        )
    });
    let v = rocectl_json(
        b,
        &[
            "perf",
            "write",
            "bw",
            "127.0.0.1",
            "-p",
            &oob.to_string(),
            "-n",
            "1000",
        ],
    );
    assert_eq!(server.join().unwrap().0, 0);
    assert_eq!(
        (v["bytes"].as_u64(), v["iterations"].as_u64()),
        (Some(65536), Some(1000))
    );
    assert!(v["gbit_s"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(v["remote"]["gid"], "::ffff:10.89.0.1");
    for api in [a, b] {
        assert_eq!(count(api, &["qp", "show"]), 0);
        assert_eq!(count(api, &["mr", "show"]), 0);
    }
    // No server: the client says so and exits non-zero.
    let (code, _, err) = rocectl(
        b,
        &[
            "perf",
            "write",
            "bw",
            "127.0.0.1",
            "-p",
            "18649",
            "--timeout",
            "1",
        ],
    );
    assert_eq!(code, 1);
    assert!(err.contains("cannot reach the server"), "{err}");
    let [sa, _]: [Value; 2] = n.stop().try_into().unwrap();
    assert!(
        sum(&sa, "rx_write_requests") >= 3000 + 500 * 16 + 1000 * 64,
        "the server's lcores executed the WRITEs"
    );
    assert!(sum(&sa, "rx_read_requests") >= 3000);
    assert!(sum(&sa, "rx_atomic_requests") >= 6000);
}

/// The figures of perftest's latency table: the line after its column header.
fn latency_line(out: &str) -> Vec<f64> {
    let mut lines = out.lines();
    lines.find(|l| l.contains("t_typical"));
    lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect()
}

#[test]
fn rocectl_perf_latency_tests_run_against_itself() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = memif_nodes("lat", 7600);
    let (a, b) = ("127.0.0.1:7600", "127.0.0.1:7601");
    let mut typical = Vec::new();
    for (k, (op, extra)) in [
        ("write", vec!["-s", "8", "-n", "2000"]),
        ("send", vec!["-s", "8", "-n", "2000"]),
        ("read", vec!["-s", "8", "-n", "2000"]),
        ("atomic", vec!["-n", "2000"]),
        ("write", vec!["-s", "4096", "-n", "500"]),
    ]
    .into_iter()
    .enumerate()
    {
        let (cout, sout) = perf_pair(a, b, &[op, "lat"], &extra, 18700 + k as u16);
        let f = latency_line(&cout);
        assert_eq!(f.len(), 9, "{cout}");
        let arg = |flag: &str| -> f64 {
            let i = extra.iter().position(|x| *x == flag).unwrap();
            extra[i + 1].parse().unwrap()
        };
        let size = if op == "atomic" { 8.0 } else { arg("-s") };
        assert_eq!((f[0], f[1]), (size, arg("-n")), "{cout}");
        let (min, max, typ, avg, p99, p999) = (f[2], f[3], f[4], f[5], f[7], f[8]);
        assert!(
            0.0 < min && min <= typ && typ <= p99 && p99 <= p999 && p999 <= max && min <= avg,
            "ordered figures: {cout}"
        );
        if matches!(op, "write" | "send") {
            // Both sides of a ping-pong measure the same exchange.
            let g = latency_line(&sout);
            assert_eq!(g.len(), 9, "{sout}");
            assert!(
                (g[4] - typ).abs() <= 0.5 * typ.max(g[4]),
                "client and server see similar latencies: {cout} {sout}"
            );
        } else {
            assert!(sout.contains("the client measures this test"), "{sout}");
        }
        typical.push((op, size, typ));
    }
    eprintln!("typical latencies (us): {typical:?}");
    // perftest's -D for latency tests: each side counts the iterations that complete in its
    // window and prints their average and rate (#bytes #iterations t_avg tps).
    for (k, op) in ["write", "send", "read"].into_iter().enumerate() {
        let (cout, sout) = perf_pair(
            a,
            b,
            &[op, "lat"],
            &["-s", "8", "-D", "1"],
            18710 + k as u16,
        );
        let timed = |out: &str| -> Vec<f64> {
            let mut lines = out.lines();
            lines.find(|l| l.contains("t_avg"));
            let l = lines.next().unwrap_or_default();
            l.split_whitespace().map(|x| x.parse().unwrap()).collect()
        };
        let f = timed(&cout);
        assert_eq!(f.len(), 4, "{cout}");
        assert_eq!(f[0], 8.0, "{cout}");
        // -D 1 has no margin: the window is the second, so the rate is the count.
        assert!(
            (f[3] - f[1]).abs() <= 0.05 * f[1],
            "iterations per second of a 1 s window: {cout}"
        );
        let typ = typical.iter().find(|t| t.0 == op).unwrap().2;
        assert!(f[1] >= 100.0, "iterations in a 1 s window: {cout}");
        assert!(
            f[2] >= 0.5 * typ && f[2] <= 20.0 * typ,
            "the timed average ({}) is near the measured typical ({typ}): {cout}",
            f[2]
        );
        if op == "read" {
            assert!(sout.contains("the client measures this test"), "{sout}");
        } else {
            let g = timed(&sout);
            assert_eq!(g.len(), 4, "{sout}");
            assert!(
                g[1] >= 0.5 * f[1] && g[1] <= 1.5 * f[1],
                "both sides of a ping-pong count about as many round trips: {cout} {sout}"
            );
        }
    }
    // ibv_rc_pingpong's test and exchange, both roles on ferroce; then ibv_ud_pingpong's (UD
    // QPs, the same exchange); a UD message over the MTU is refused.
    for (extra, lines) in [
        (
            &["-p", "18720", "-s", "4096", "-n", "500"][..],
            ["4096000 bytes in", "500 iters in"],
        ),
        (
            &["--ud", "-p", "18721", "-s", "1024", "-n", "300"][..],
            ["614400 bytes in", "300 iters in"],
        ),
    ] {
        let (cout, sout) = pingpong_pair(a, b, extra);
        for out in [&cout, &sout] {
            assert!(
                lines.iter().all(|l| out.contains(l)),
                "rc/ud_pingpong's lines ({extra:?}): {out}"
            );
        }
    }
    let (code, _, err) = rocectl(
        b,
        &["pingpong", "--ud", "127.0.0.1", "-p", "18722", "-s", "9000"],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("more than a UD message may carry"), "{err}");
    for api in [a, b] {
        assert_eq!(count(api, &["qp", "show"]), 0);
        assert_eq!(count(api, &["mr", "show"]), 0);
    }
    let [sa, sb]: [Value; 2] = n.stop().try_into().unwrap();
    assert!(sum(&sa, "rx_write_requests") >= 2000 + 500);
    assert!(
        sum(&sb, "rx_write_requests") >= 2000 + 500,
        "ping-pong: both sides write"
    );
    assert!(sum(&sa, "rx_read_requests") >= 2000);
    assert!(sum(&sa, "rx_atomic_requests") >= 2000);
}

#[test]
fn rocectl_drives_two_nodes_from_regions_to_teardown() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = memif_nodes("ctl", 7550);
    let (a, b) = ("127.0.0.1:7550", "127.0.0.1:7551");
    // The memif link comes up once both nodes run (and the ports' view refreshes).
    let t0 = std::time::Instant::now();
    let out = loop {
        let (code, out, _) = rocectl(a, &["port", "show"]);
        assert_eq!(code, 0);
        if out.contains(" up ") || t0.elapsed() > Duration::from_secs(20) {
            break out;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        out.contains("net_memif0") && out.contains(" up ") && out.contains("9000"),
        "{out}"
    );

    let access = "local-write,remote-write,remote-read,remote-atomic";
    let ma = rocectl_json(a, &["mr", "reg", "--size", "64K", "--access", access]);
    let mb = rocectl_json(b, &["mr", "reg", "--size", "64K", "--access", access]);
    let (ka, aa) = (ma["lkey"].to_string(), ma["addr"].as_u64().unwrap());
    let (kb, ab) = (mb["lkey"].to_string(), mb["addr"].as_u64().unwrap());
    let (code, out, _) = rocectl(a, &["mr", "show"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("65536") && out.contains("remote-atomic"),
        "{out}"
    );

    // Each QP answers with the random PSN it starts at; the peers exchange them.
    let (qa, pa) = {
        let q = rocectl_json(a, &["qp", "create", "--lcore", "0"]);
        (q["qpn"].to_string(), q["sq-psn"].to_string())
    };
    let (qb, pb) = {
        let q = rocectl_json(b, &["qp", "create", "--lcore", "1"]);
        (q["qpn"].to_string(), q["sq-psn"].to_string())
    };
    let q = rocectl_json(
        a,
        &[
            "qp",
            "connect",
            &qa,
            "--remote-qpn",
            &qb,
            "--remote-gid",
            "10.89.0.2",
            "--remote-psn",
            &pb,
            "--mtu",
            "4096",
        ],
    );
    assert_eq!(q["state"], "RTS");
    assert_eq!(q["sq-psn"].to_string(), pa, "it starts where it said");
    assert_eq!(q["rq-psn"].to_string(), pb, "and expects the peer's");
    rocectl_json(
        b,
        &[
            "qp",
            "connect",
            &qb,
            "--remote-qpn",
            &qa,
            "--remote-gid",
            "10.89.0.1",
            "--remote-psn",
            &pa,
            "--mtu",
            "4096",
        ],
    );
    let (code, out, _) = rocectl(a, &["qp", "show", &qa]);
    assert_eq!(code, 0);
    assert!(
        out.contains("RTS") && out.contains("4096") && out.contains("dcqcn"),
        "{out}"
    );

    // WRITE: bytes written into A's region with rocectl arrive in B's.
    let hex = "00112233445566778899aabbccddeeff";
    rocectl_json(a, &["mr", "write", &ka, "--hex", hex]);
    let (sa, sb) = (aa.to_string(), ab.to_string());
    let mut w = write16(&qa, &ka, &sa, &kb, &sb);
    w.extend(["--wr-id", "7"]);
    rocectl_json(a, &w);
    let c = rocectl_json(a, &["cq", "poll", "--qp", &qa, "--wait-ms", "5000"]);
    assert_eq!(c["send"][0]["status"], "success", "{c}");
    assert_eq!(c["send"][0]["wr_id"], 7);
    let r = rocectl_json(b, &["mr", "read", &kb, "--length", "16"]);
    assert_eq!(r["hex"], hex);
    let (_, out, _) = rocectl(b, &["mr", "read", &kb, "--length", "16"]);
    assert!(out.contains("00 11 22 33"), "{out}");

    // SEND into a receive B posted.
    let sb16 = (ab + 1024).to_string();
    rocectl_json(
        b,
        &[
            "post", "recv", &qb, "--lkey", &kb, "--addr", &sb16, "--length", "64",
        ],
    );
    rocectl_json(
        a,
        &[
            "post", "send", &qa, "--lkey", &ka, "--addr", &sa, "--length", "16", "--imm", "0x55",
        ],
    );
    let (code, out, _) = rocectl(b, &["cq", "poll", "--qp", &qb, "--wait-ms", "5000"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("recv") && out.contains("success") && out.contains("85"),
        "{out}"
    );
    rocectl_json(a, &["cq", "poll", "--qp", &qa, "--wait-ms", "5000"]);

    // Fetch-and-add on B's first word (0x7766554433221100 after the WRITE), twice.
    let word = (aa + 64).to_string();
    for _ in 0..2 {
        rocectl_json(
            a,
            &[
                "post",
                "fetch-add",
                &qa,
                "--lkey",
                &ka,
                "--addr",
                &word,
                "--length",
                "8",
                "--rkey",
                &kb,
                "--remote-addr",
                &sb,
                "--add",
                "1",
            ],
        );
        let c = rocectl_json(a, &["cq", "poll", "--qp", &qa, "--wait-ms", "5000"]);
        assert_eq!(c["send"][0]["status"], "success", "{c}");
    }
    let r = rocectl_json(b, &["mr", "read", &kb, "--length", "8"]);
    assert_eq!(r["hex"], "02112233445566778899"[..16]);
    let r = rocectl_json(a, &["mr", "read", &ka, "--addr", &word, "--length", "8"]);
    assert_eq!(
        r["hex"], "0111223344556677",
        "the value before the second add"
    );

    // Wrong input gets its error and a non-zero exit, and changes nothing.
    let (code, _, err) = rocectl(
        a,
        &[
            "qp",
            "connect",
            "999999",
            "--remote-qpn",
            "1",
            "--remote-gid",
            "10.89.0.2",
            "--remote-psn",
            "0",
        ],
    );
    assert_eq!(code, 1);
    assert!(err.contains("not_found"), "{err}");
    let (code, _, err) = rocectl(
        a,
        &[
            "qp",
            "connect",
            &qa,
            "--remote-qpn",
            &qb,
            "--remote-gid",
            "nowhere",
            "--remote-psn",
            &pb,
        ],
    );
    assert_eq!(code, 1);
    assert!(err.contains("bad_gid"), "{err}");
    let (code, _, err) = rocectl(a, &["mr", "write", &ka, "--hex", "abc"]);
    assert_eq!(code, 2);
    assert!(err.contains("even number"), "{err}");
    let (code, _, err) = rocectl(a, &write16(&qa, &ka, &sa, &kb, "1"));
    assert_eq!(
        code, 0,
        "posting succeeds; the remote access error comes back as a completion: {err}"
    );
    let c = rocectl_json(a, &["cq", "poll", "--qp", &qa, "--wait-ms", "5000"]);
    assert_eq!(c["send"][0]["status"], "remote access error", "{c}");
    let q = rocectl_json(a, &["qp", "show", &qa]);
    assert_eq!(
        q[0]["state"], "ERR",
        "a remote access error moves the QP to ERR, as on an RNIC"
    );

    // A second pair moved one verbs state at a time carries data too; transitions verbs does
    // not allow are refused and leave the QP where it was.
    let qa2 = rocectl_json(a, &["qp", "create"])["qpn"].to_string();
    let qb2 = rocectl_json(b, &["qp", "create"])["qpn"].to_string();
    let (code, _, err) = rocectl(a, &["qp", "modify", &qa2, "--state", "RTS"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("bad_state"),
        "RESET -> RTS is no transition: {err}"
    );
    let (code, _, err) = rocectl(
        a,
        &[
            "qp",
            "modify",
            &qa2,
            "--state",
            "INIT",
            "--access",
            "remote-write",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = rocectl(a, &["qp", "modify", &qa2, "--state", "RTR"]);
    assert_eq!(code, 1);
    assert!(err.contains("remote_qpn is required"), "{err}");
    assert_eq!(rocectl_json(a, &["qp", "show", &qa2])[0]["state"], "INIT");
    for (api, me, peer, gid) in [(a, &qa2, &qb2, "10.89.0.2"), (b, &qb2, &qa2, "10.89.0.1")] {
        if api == b {
            rocectl_json(
                api,
                &[
                    "qp",
                    "modify",
                    me,
                    "--state",
                    "INIT",
                    "--access",
                    "remote-write",
                ],
            );
        }
        let q = rocectl_json(
            api,
            &[
                "qp",
                "modify",
                me,
                "--state",
                "RTR",
                "--remote-qpn",
                peer,
                "--remote-gid",
                gid,
                "--remote-psn",
                "100",
                "--mtu",
                "2048",
            ],
        );
        assert_eq!(
            (q["state"].as_str(), q["rq-psn"].as_u64()),
            (Some("RTR"), Some(100)),
            "{q}"
        );
        let q = rocectl_json(
            api,
            &["qp", "modify", me, "--state", "RTS", "--local-psn", "100"],
        );
        assert_eq!(
            (q["state"].as_str(), q["sq-psn"].as_u64()),
            (Some("RTS"), Some(100)),
            "{q}"
        );
    }
    let ka2 = rocectl_json(a, &["mr", "reg", "--size", "4K"])["lkey"].to_string();
    let kb2 = rocectl_json(
        b,
        &[
            "mr",
            "reg",
            "--size",
            "4K",
            "--access",
            "local-write,remote-write",
        ],
    );
    let (kb2, ab2) = (kb2["lkey"].to_string(), kb2["addr"].to_string());
    let aa2 = rocectl_json(a, &["mr", "show", &ka2])["addr"].to_string();
    rocectl_json(a, &["mr", "write", &ka2, "--hex", "cafef00d"]);
    let mut w = write16(&qa2, &ka2, &aa2, &kb2, &ab2);
    w[8] = "4";
    rocectl_json(a, &w);
    let c = rocectl_json(a, &["cq", "poll", "--qp", &qa2, "--wait-ms", "5000"]);
    assert_eq!(c["send"][0]["status"], "success", "{c}");
    assert_eq!(
        rocectl_json(b, &["mr", "read", &kb2, "--length", "4"])["hex"],
        "cafef00d"
    );

    // UD QPs with rocectl: created, modified with a Q_Key, a datagram to B's receive, which
    // gets the GRH first and names A's QP.
    let ua = rocectl_json(a, &["qp", "create", "--type", "UD"])["qpn"].to_string();
    let ub = rocectl_json(b, &["qp", "create", "--type", "UD"])["qpn"].to_string();
    for (api, me) in [(a, &ua), (b, &ub)] {
        let q = rocectl_json(
            api,
            &[
                "qp",
                "modify",
                me,
                "--state",
                "INIT",
                "--qkey",
                "0x11111111",
            ],
        );
        assert_eq!(
            (q["type"].as_str(), q["qkey"].as_u64()),
            (Some("UD"), Some(0x1111_1111))
        );
        rocectl_json(api, &["qp", "modify", me, "--state", "RTR"]);
        rocectl_json(
            api,
            &["qp", "modify", me, "--state", "RTS", "--local-psn", "5"],
        );
    }
    rocectl_json(
        b,
        &[
            "post", "recv", &ub, "--lkey", &kb2, "--addr", &ab2, "--length", "44",
        ],
    );
    let ud = [
        "post",
        "send",
        &ua,
        "--lkey",
        &ka2,
        "--addr",
        &aa2,
        "--length",
        "4",
        "--ud-gid",
        "10.89.0.2",
        "--ud-qpn",
        &ub,
        "--ud-qkey",
        "0x11111111",
    ];
    rocectl_json(a, &ud);
    let (code, out, _) = rocectl(b, &["cq", "poll", "--qp", &ub, "--wait-ms", "5000"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("success") && out.contains(" 44 ") && out.contains(&format!(" {ua}")),
        "a UD receive: GRH + 4 bytes, from A's QP: {out}"
    );
    let ab2_data = (ab2.parse::<u64>().unwrap() + 40).to_string();
    assert_eq!(
        rocectl_json(
            b,
            &["mr", "read", &kb2, "--addr", &ab2_data, "--length", "4"]
        )["hex"],
        "cafef00d"
    );
    let (code, _, err) = rocectl(a, &ud[..9]);
    assert_eq!(code, 1, "a UD send needs its destination: {err}");
    assert!(err.contains("destination"), "{err}");

    // Counters and congestion control.
    let (code, out, _) = rocectl(a, &["stats"]);
    assert_eq!(code, 0);
    assert!(out.contains("sent_pkts"), "{out}");
    let (code, out, _) = rocectl(b, &["cc", "show", &qb]);
    assert_eq!(code, 0);
    assert!(out.contains("cc dcqcn") && out.contains("alpha"), "{out}");
    assert!(
        out.contains("rpg_ai_rate"),
        "the settings are listed: {out}"
    );
    // Congestion control changed while the QP lives: knobs over its settings, a bad knob
    // refused whole, then another kind.
    let v = rocectl_json(
        b,
        &[
            "cc",
            "set",
            &qb,
            "--knob",
            "rpg_ai_rate=10",
            "--knob",
            "rpg_time_reset=600",
        ],
    );
    assert_eq!(v["cc"]["dcqcn"]["rpg_ai_rate"], 10, "{v}");
    assert_eq!(v["cc"]["dcqcn"]["rpg_time_reset"], 600, "{v}");
    let (code, _, err) = rocectl(
        b,
        &[
            "cc",
            "set",
            &qb,
            "--knob",
            "rpg_ai_rate=20",
            "--knob",
            "no_such_knob=1",
        ],
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("bad_cc") && err.contains("no_such_knob"),
        "{err}"
    );
    let v = rocectl_json(b, &["cc", "show", &qb]);
    assert_eq!(
        v["cc"]["dcqcn"]["rpg_ai_rate"], 10,
        "the refused change left nothing: {v}"
    );
    let v = rocectl_json(b, &["cc", "set", &qb, "--cc", "none"]);
    assert_eq!(v["cc"]["kind"], "none", "{v}");

    // Teardown: gone, and said so.
    rocectl_json(a, &["qp", "destroy", &qa]);
    rocectl_json(b, &["qp", "destroy", &qb]);
    rocectl_json(a, &["mr", "dereg", &ka]);
    let (code, _, err) = rocectl(a, &["qp", "show", &qa]);
    assert_eq!(code, 1);
    assert!(err.contains("not_found") && err.contains("404"), "{err}");
    let (code, _, _) = rocectl(a, &["mr", "show", &ka]);
    assert_eq!(code, 1);
    n.stop();
}

#[test]
fn schemathesis_finds_no_server_error_and_no_response_off_the_schema() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = memif_nodes("schema", 7570);
    let doc = n.api[0].ok(n.api[0].get("/v1/openapi.json"));
    assert_eq!(doc["openapi"], "3.0.3");
    assert!(doc["paths"]["/v1/qps/{qpn}/connect"]["post"].is_object());
    // Every check but the two that guess which requests the API should accept or refuse from
    // the schema alone (it cannot say that remote-write needs local-write, for one).
    let out = std::process::Command::new("schemathesis")
        .args([
            "run",
            "http://127.0.0.1:7570/v1/openapi.json",
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance,negative_data_rejection",
            "--max-examples",
            "10",
            "--max-time",
            "90",
            "--request-timeout",
            "40",
            // Polls may wait up to 30 s for a completion, as documented.
            "--max-response-time",
            "35",
            "--seed",
            "7",
            "--workers",
            "1",
        ])
        .output()
        .expect("schemathesis (PyPI; scripts/setup.sh installs it)");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "{}",
        text.lines()
            .rev()
            .take(12)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(out.status.success(), "schemathesis found problems:\n{text}");
    assert!(text.contains("passed"), "{text}");
    // The node is still whole: it answers and stops cleanly.
    assert_eq!(n.api[0].ok(n.api[0].get("/v1/health"))["status"], "ok");
    n.stop();
}

#[test]
fn a_token_guards_every_endpoint_but_health() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    require_root();
    let dir = tmpdir("token");
    let token = "s3cret-token-0123456789";
    let cfg = format!(
        "[eal]\nfile_prefix = \"ferroce-rtoken-{}\"\n[dataplane]\nlcores = [0]\nmbufs = 8191\nidle_sleep_us = 50\n\
         [[ports]]\ndevice = \"net_memif0,role=server,socket={}\"\nmtu = 1500\naddresses = [\"10.87.0.1/24\"]\n\
         [api]\nlisten = \"127.0.0.1:7580\"\ntoken = \"{token}\"\n",
        std::process::id(),
        dir.join("memif.sock").display()
    );
    let mut node = Roced::start(&dir, "t", &cfg, None, &[]);
    assert!(
        node.wait_log("REST API listening", Duration::from_secs(30)),
        "{}",
        node.log_text()
    );
    let api = Api::new("127.0.0.1:7580");
    assert_eq!(api.get("/v1/health").0, 200, "liveness needs no token");
    for path in ["/v1/ports", "/v1/mrs", "/metrics", "/v1/openapi.json"] {
        let (s, b) = api.get_bytes(path);
        assert_eq!(s, 401, "{path}");
        assert!(
            String::from_utf8_lossy(&b).contains("unauthorized"),
            "{path}"
        );
    }
    // Refused requests change nothing.
    let (s, _) = api.post("/v1/mrs", json!({"length": 4096}));
    assert_eq!(s, 401);
    let (code, _, err) = rocectl(
        "127.0.0.1:7580",
        &["--token", "not-the-token-at-all", "mr", "show"],
    );
    assert_eq!(code, 1);
    assert!(err.contains("unauthorized") && err.contains("401"), "{err}");
    let (code, out, err) = rocectl(
        "127.0.0.1:7580",
        &["--token", token, "--json", "mr", "show"],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "[]", "the refused registration made no region");
    // The scheme's case does not matter (RFC 7235); the token's does.
    for (auth, want) in [
        (format!("bearer {token}"), 200),
        (format!("BEARER  {token}"), 200),
        (format!("Bearer {}", token.to_uppercase()), 401),
    ] {
        assert_eq!(api.get_auth("/v1/ports", &auth).0, want, "{auth}");
    }
    let (code, out, err) = rocectl("127.0.0.1:7580", &["--token", token, "port", "show"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("net_memif0"), "{out}");
    let (rc, _, log) = node.terminate();
    assert_eq!(rc, 0, "{log}");
    // A token too short to be one is refused with the field named.
    let bad = cfg.replace(token, "short");
    std::fs::write(dir.join("bad.toml"), &bad).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_roced"))
        .args(["--check", "--config"])
        .arg(dir.join("bad.toml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("api.token"));
}

#[test]
fn qps_past_the_nodes_memory_are_refused_whole_and_leave_nothing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = memif_nodes("qpmem", 7620);
    let api = &n.api[0];
    let scrape = |name: &str| {
        let m = String::from_utf8(api.get_bytes("/metrics").1).unwrap();
        series(&m, name).unwrap_or_else(|| panic!("{name} missing:\n{m}")) as usize
    };
    let limit = scrape("ferroce_qp_memory_limit_bytes");
    let held0 = scrape("ferroce_qp_memory_bytes");
    assert!(limit > held0, "{limit} {held0}");
    let big = json!({"max_send_wr": 16384, "max_recv_wr": 16384, "max_inline_data": 512});
    // One QP with the deepest queues: what it reserves shows in the gauge.
    let mut one = big.clone();
    one["lcore"] = json!(0);
    let q = api.ok(api.post("/v1/qps", one))["qpn"].as_u64().unwrap();
    let each = scrape("ferroce_qp_memory_bytes") - held0;
    assert!(
        each > 16384 * 512,
        "queues and inline slots at full depth: {each}"
    );
    let listed = api.ok(api.get("/v1/qps")).as_array().unwrap().len();
    // One more of them than the rest of the memory holds: refused at once, whole.
    let fit = (limit - held0 - each) / each;
    for count in [fit + 1, 200_000] {
        let mut b = big.clone();
        b["count"] = json!(count);
        let t = std::time::Instant::now();
        let (status, v) = api.post("/v1/qps/bulk", b);
        assert_eq!(status, 409, "{count}: {v}");
        assert_eq!(v["code"], "out_of_resources", "{v}");
        let msg = v["message"].as_str().unwrap();
        assert!(
            msg.contains("MiB") && msg.contains(&count.to_string()),
            "{msg}"
        );
        eprintln!("{count} QPs refused in {:?}: {msg}", t.elapsed());
    }
    assert_eq!(api.ok(api.get("/v1/qps")).as_array().unwrap().len(), listed);
    assert_eq!(scrape("ferroce_qp_memory_bytes"), held0 + each);
    // Smaller caps still fit, and destroying gives the memory back.
    let (status, v) = api.post(
        "/v1/qps/bulk",
        json!({"count": 1000, "max_send_wr": 2, "max_recv_wr": 1}),
    );
    assert_eq!(status, 201, "{v}");
    let qpns = v["qpns"].clone();
    assert!(scrape("ferroce_qp_memory_bytes") > held0 + each);
    api.ok(api.post("/v1/qps/bulk/destroy", json!({"qpns": qpns})));
    api.ok(api.delete(&format!("/v1/qps/{q}")));
    assert_eq!(scrape("ferroce_qp_memory_bytes"), held0);
    n.stop();
}
