//! RDMA CM between two roced processes joined by net_memif, driven only through the REST API:
//! B listens and accepts while A connects (REQ, REP, RTU on QP1), both QPs reach RTS with the
//! peer's QPN and PSN and carry a WRITE; a disconnect moves both QPs to ERR; a connect nobody
//! listens for is rejected, an accept nobody asks for times out, and a REQ past a listener's
//! backlog is refused.
//!
//! The nodes' four lcores share this machine's two CPUs, so the tests run one at a time.

mod common;
use common::rdma::*;
use common::*;
use serde_json::{Value, json};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Polls `path` on `api` until `done` holds of it, for up to `secs`; returns the last answer.
fn until(api: &Api, path: &str, secs: u64, done: impl Fn(&Value) -> bool) -> Value {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        let v = api.ok(api.get(path));
        if done(&v) || Instant::now() > end {
            return v;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// B accepts on `port` with QP `qb` while A connects QP `qa` to `peer:port`; both answers.
fn connect_accept(n: &Cluster, qa: u32, qb: u32, peer: &str, port: u16) -> (Value, Value) {
    std::thread::scope(|s| {
        let b = s.spawn(|| {
            n.api[1].post(
                "/v1/cm/accept",
                json!({"port": port, "qpn": qb, "timeout_ms": 20000}),
            )
        });
        let a = n.api[0].post(
            "/v1/cm/connect",
            json!({"qpn": qa, "peer": peer, "port": port, "timeout_ms": 20000}),
        );
        (
            n.api[0].ok(a),
            n.api[1].ok(b.join().expect("accept thread")),
        )
    })
}

/// `rocectl --json ARGS` as a server on `server` and as its client on `client` at once: the
/// client tries again, for up to 5 s, while it is refused with `refused` in its error (the
/// server does not listen yet). Both answers.
fn server_and_client(
    (server, server_args): (&str, &[&str]),
    (client, client_args): (&str, &[&str]),
    refused: &str,
) -> (Value, Value) {
    std::thread::scope(|s| {
        let srv = s.spawn(|| rocectl_json(server, server_args));
        let mut args = vec!["--json"];
        args.extend_from_slice(client_args);
        let mut cli = Value::Null;
        for _ in 0..100 {
            let (code, out, err) = rocectl(client, &args);
            if code == 0 {
                cli = serde_json::from_str(&out).unwrap();
                break;
            }
            assert!(err.contains(refused), "{client_args:?}: {err}");
            std::thread::sleep(Duration::from_millis(50));
        }
        (srv.join().expect("the server"), cli)
    })
}

/// A WRITE from A's `qa` lands in a region of B's.
fn write_lands(n: &Cluster, qa: u32, seed: u32) {
    let (ka, aa) = reg(&n.api[0], 4096);
    let (kb, ab) = reg(&n.api[1], 4096);
    let data = pattern(3000, seed);
    put(&n.api[0], ka, aa, &data);
    post(
        &n.api[0],
        qa,
        json!({"opcode": "write", "sge": sge(aa, data.len(), ka), "remote_addr": ab, "rkey": kb}),
    );
    assert_eq!(completion(&n.api[0], qa, false)["status"], "success");
    same(
        n,
        &get(&n.api[1], kb, ab, data.len()),
        &data,
        "WRITE over a CM connection",
    );
}

#[test]
fn connect_accept_write_and_disconnect_over_ipv4_and_ipv6() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = memif_nodes("cm", 7670);
    let l = n.api[1].ok(n.api[1].post("/v1/cm/listeners", json!({"port": 7471})));
    assert_eq!(l["service_id"], "0x0000000001061d2f", "{l}");
    assert_eq!(l["backlog"], 128, "{l}");
    // A second listen on the port is refused; the listing shows the one.
    let (s, e) = n.api[1].post("/v1/cm/listeners", json!({"port": 7471}));
    assert_eq!((s, e["code"].as_str()), (409, Some("listening")), "{e}");
    let ls = n.api[1].ok(n.api[1].get("/v1/cm/listeners"));
    assert_eq!(ls.as_array().map(Vec::len), Some(1), "{ls}");

    for (peer, seed) in [("10.89.0.2", 1), ("fd89::2", 2)] {
        let qa = create_qp(&n.api[0], Some(seed as usize % 2));
        let qb = create_qp(&n.api[1], Some(1 - seed as usize % 2));
        let (psn_a, psn_b) = (psn_of(&n.api[0], qa), psn_of(&n.api[1], qb));
        let (ca, cb) = connect_accept(&n, qa, qb, peer, 7471);
        for (c, role, q, rq) in [(&ca, "active", qa, qb), (&cb, "passive", qb, qa)] {
            assert_eq!(c["state"], "established", "{c}");
            assert_eq!(c["role"], role, "{c}");
            assert_eq!(c["qpn"], q, "{c}");
            assert_eq!(c["remote_qpn"], rq, "{c}");
        }
        assert_eq!(cb["port"], 7471);
        assert!(
            cb["peer_port"].as_u64().is_some(),
            "the REQ's rdma_cm header: {cb}"
        );
        // The QPs took each other's QPN from the REQ and REP, and their PSNs as Linux does
        // (rxe's rping capture): each side's REQ or REP names the PSN it expects to receive,
        // the other sends from it.
        let a = n.api[0].ok(n.api[0].get(&format!("/v1/qps/{qa}")));
        let b = n.api[1].ok(n.api[1].get(&format!("/v1/qps/{qb}")));
        for (q, rq, own, other) in [(&a, qb, psn_a, psn_b), (&b, qa, psn_b, psn_a)] {
            assert_eq!(q["state"], "RTS", "{q}");
            assert_eq!(q["rqpn"], rq, "{q}");
            assert_eq!(
                (&q["rq-psn"], &q["sq-psn"]),
                (&json!(own), &json!(other)),
                "{q}"
            );
        }
        write_lands(&n, qa, seed);

        // A disconnects: its QP goes to ERR, and B hears the DREQ and moves its QP to ERR.
        let id_a = ca["id"].as_u64().unwrap();
        let id_b = cb["id"].as_u64().unwrap();
        let (s, d) = n.api[0].delete(&format!("/v1/cm/connections/{id_a}"));
        assert_eq!(s, 200, "{d}");
        // Answered at once, as rdma_disconnect: disconnecting until the DREP (unless it is in).
        assert!(
            d["state"] == "disconnecting" || d["state"] == "disconnected",
            "{d}"
        );
        let cb = until(&n.api[1], &format!("/v1/cm/connections/{id_b}"), 10, |c| {
            c["state"] != "established"
        });
        assert_eq!(cb["state"], "disconnected", "{cb}");
        for (api, q) in [(&n.api[0], qa), (&n.api[1], qb)] {
            let v = until(api, &format!("/v1/qps/{q}"), 5, |v| v["state"] == "ERR");
            assert_eq!(v["state"], "ERR", "{v}");
        }
        let ca = until(&n.api[0], &format!("/v1/cm/connections/{id_a}"), 10, |c| {
            c["state"] != "established" && c["state"] != "disconnecting"
        });
        assert_eq!(ca["state"], "disconnected", "{ca}");
    }
    let cs = n.api[1].ok(n.api[1].get("/v1/cm/connections"));
    assert_eq!(cs.as_array().map(Vec::len), Some(2), "{cs}");

    // The same through rocectl, with QPs it creates.
    let (api_a, api_b) = ("127.0.0.1:7670", "127.0.0.1:7671");
    let (code, out, err) = rocectl(api_b, &["cm", "listen", "7475", "--backlog", "4"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("0x0000000001061d33"), "{out}");
    let (cb, ca) = std::thread::scope(|s| {
        let b = s.spawn(|| rocectl_json(api_b, &["cm", "accept", "7475", "--timeout-ms", "20000"]));
        let a = rocectl_json(
            api_a,
            &["cm", "connect", "10.89.0.2:7475", "--timeout-ms", "20000"],
        );
        (b.join().expect("rocectl cm accept"), a)
    });
    assert_eq!(
        (&ca["state"], &cb["state"]),
        (&json!("established"), &json!("established"))
    );
    assert_eq!(ca["remote_qpn"], cb["qpn"], "{ca} {cb}");
    write_lands(&n, ca["qpn"].as_u64().unwrap() as u32, 3);
    let (code, out, err) = rocectl(api_b, &["cm", "show"]);
    assert_eq!(code, 0, "{err}");
    let row = out
        .lines()
        .find(|l| l.starts_with(&format!("{} ", cb["id"])))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        row.contains("passive") && row.contains("established") && row.contains("10.89.0.1:"),
        "{out}"
    );
    let id = cb["id"].to_string();
    let (code, _, err) = rocectl(api_b, &["cm", "disconnect", &id]);
    assert_eq!(code, 0, "{err}");
    let ca = until(
        &n.api[0],
        &format!("/v1/cm/connections/{}", ca["id"]),
        10,
        |c| c["state"] != "established",
    );
    assert_eq!(ca["state"], "disconnected", "{ca}");
    let (code, _, err) = rocectl(api_b, &["cm", "disconnect", "999999"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("404") || err.contains("no CM connection"),
        "{err}"
    );
    let (code, out, err) = rocectl(api_b, &["cm", "unlisten", "7475"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("7471") && !out.contains("7475"), "{out}");
    let (code, _, err) = rocectl(
        api_a,
        &["cm", "connect", "10.89.0.2", "--timeout-ms", "100"],
    );
    assert_eq!(code, 2, "an address without a port: {err}");

    // Each node's CM counted the three connections, and its book missed no event.
    for api in &n.api {
        let value = |series: &str| api.metric(series);
        assert_eq!(
            value(r#"ferroce_cm_established_total{lcore="0"}"#),
            Some(3.0)
        );
        assert_eq!(
            value(r#"ferroce_gsi_events_lost_total{lcore="0"}"#),
            Some(0.0)
        );
    }
    n.stop();
}

#[test]
fn refused_timed_out_and_past_the_backlog() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = memif_nodes("cmbad", 7672);
    // Nobody listens on B's port 9999: B's CM answers the REQ with REJ (invalid service ID).
    let qa = create_qp(&n.api[0], None);
    let (s, e) = n.api[0].post(
        "/v1/cm/connect",
        json!({"qpn": qa, "peer": "10.89.0.2", "port": 9999, "timeout_ms": 10000}),
    );
    assert_eq!((s, e["code"].as_str()), (409, Some("cm_rejected")), "{e}");
    // The QP is left in RESET, for another try.
    let v = n.api[0].ok(n.api[0].get(&format!("/v1/qps/{qa}")));
    assert_eq!(v["state"], "RESET", "{v}");

    // An accept with no REQ waits out its timeout.
    n.api[1].ok(n.api[1].post("/v1/cm/listeners", json!({"port": 7472, "backlog": 1})));
    let qb = create_qp(&n.api[1], None);
    let t = Instant::now();
    let (s, e) = n.api[1].post(
        "/v1/cm/accept",
        json!({"port": 7472, "qpn": qb, "timeout_ms": 300}),
    );
    assert_eq!((s, e["code"].as_str()), (408, Some("timed_out")), "{e}");
    assert!(t.elapsed() >= Duration::from_millis(300));
    // An accept on a port nobody listens on, and bad bodies.
    let (s, e) = n.api[1].post("/v1/cm/accept", json!({"port": 7473, "qpn": qb}));
    assert_eq!(s, 404, "{e}");
    for bad in [
        json!({"port": 7472, "backlog": 0}),
        json!({"port": 7472, "backlog": 100000}),
        json!({"port": 70000}),
        json!({"port": 7474, "extra": 1}),
    ] {
        let (s, e) = n.api[1].post("/v1/cm/listeners", bad.clone());
        assert_eq!(s, 400, "{bad}: {e}");
    }
    let (s, e) = n.api[0].post(
        "/v1/cm/connect",
        json!({"qpn": qa, "peer": "10.89.0.2", "port": 7472, "timeout_ms": 40000}),
    );
    assert_eq!(s, 400, "{e}");
    let (s, e) = n.api[0].post(
        "/v1/cm/connect",
        json!({"qpn": qa, "peer": "not-an-address", "port": 7472}),
    );
    assert_eq!(s, 400, "{e}");

    // Backlog 1: the first REQ waits for an accept, the second is refused at once
    // (no resources), and the first's connect gives up when nobody accepts it.
    let qa2 = create_qp(&n.api[0], None);
    std::thread::scope(|s| {
        let first = s.spawn(|| {
            n.api[0].post(
                "/v1/cm/connect",
                json!({"qpn": qa, "peer": "10.89.0.2", "port": 7472, "timeout_ms": 3000}),
            )
        });
        let l = until(&n.api[1], "/v1/cm/listeners", 5, |l| l[0]["waiting"] == 1);
        assert_eq!(l[0]["waiting"], 1, "{l}");
        let (s2, e2) = n.api[0].post(
            "/v1/cm/connect",
            json!({"qpn": qa2, "peer": "10.89.0.2", "port": 7472, "timeout_ms": 5000}),
        );
        assert_eq!(
            (s2, e2["code"].as_str()),
            (409, Some("cm_rejected")),
            "{e2}"
        );
        assert!(
            e2["message"].as_str().unwrap().contains("no_resources")
                || e2["message"].as_str().unwrap().contains("resources"),
            "{e2}"
        );
        let (s1, e1) = first.join().expect("first connect");
        assert_eq!((s1, e1["code"].as_str()), (408, Some("timed_out")), "{e1}");
    });
    // The withdrawn REQ left B's backlog; B's book says why.
    let l = until(&n.api[1], "/v1/cm/listeners", 5, |l| l[0]["waiting"] == 0);
    assert_eq!(l[0]["waiting"], 0, "{l}");
    let cs = n.api[1].ok(n.api[1].get("/v1/cm/connections"));
    assert!(
        cs.as_array()
            .unwrap()
            .iter()
            .all(|c| c["state"] == "rejected"),
        "{cs}"
    );
    // Unlisten, and the port is free again.
    let (s, _) = n.api[1].delete("/v1/cm/listeners/7472");
    assert_eq!(s, 204);
    let (s, _) = n.api[1].delete("/v1/cm/listeners/7472");
    assert_eq!(s, 404);
    n.api[1].ok(n.api[1].post("/v1/cm/listeners", json!({"port": 7472})));

    // A REQ that comes just before its listener waits for it (an application's listen is a
    // round trip to roced): B listens 100 ms after A's REQ went, and the connection is made.
    let qa2 = create_qp(&n.api[0], None);
    let qb2 = create_qp(&n.api[1], None);
    std::thread::scope(|sc| {
        let c = sc.spawn(|| {
            n.api[0].post(
                "/v1/cm/connect",
                json!({"qpn": qa2, "peer": "10.89.0.2", "port": 9998, "timeout_ms": 10000}),
            )
        });
        std::thread::sleep(Duration::from_millis(100));
        n.api[1].ok(n.api[1].post("/v1/cm/listeners", json!({"port": 9998, "backlog": 1})));
        let (s, e) = n.api[1].post(
            "/v1/cm/accept",
            json!({"port": 9998, "qpn": qb2, "timeout_ms": 5000}),
        );
        assert!((200..300).contains(&s), "{e}");
        let (s, e) = c.join().unwrap();
        assert!((200..300).contains(&s), "{e}");
        assert_eq!(e["state"], "established", "{e}");
    });
    n.api[1].ok(n.api[1].delete("/v1/cm/listeners/9998"));
    n.stop();
}

#[test]
fn rocectl_rping_client_and_server_check_a_hundred_pings() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = memif_nodes("cmrping", 7676);
    for (server_addr, size) in [("10.89.0.2", "64"), ("fd89::2", "1000")] {
        let (srv, cli) = server_and_client(
            (
                "127.0.0.1:7677",
                &["rping", "-s", "-p", "7174", "-C", "100", "-S", size],
            ),
            (
                "127.0.0.1:7676",
                &[
                    "rping",
                    "-c",
                    "-a",
                    server_addr,
                    "-C",
                    "100",
                    "-V",
                    "-S",
                    size,
                ],
            ),
            "cm_rejected",
        );
        assert_eq!(cli["pings"], 100, "{cli}");
        assert_eq!(cli["error"], Value::Null, "{cli}");
        assert_eq!(srv["pings"], 100, "{srv}");
        assert_eq!(cli["connection"]["remote_qpn"], srv["connection"]["qpn"]);
    }
    // Every QP and region the runs made is gone again.
    for api in &n.api {
        let qps = api.ok(api.get("/v1/qps"));
        assert_eq!(qps.as_array().map(Vec::len), Some(0), "{qps}");
        let mrs = api.ok(api.get("/v1/mrs"));
        assert_eq!(mrs.as_array().map(Vec::len), Some(0), "{mrs}");
    }
    n.stop();
}

#[test]
fn rocectl_perf_connects_through_the_cm_as_perftest_minus_r_does() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = memif_nodes("cmperf", 7678);
    for (op, server_addr, qps) in [
        ("write", "10.89.0.2", "1"),
        ("read", "fd89::2", "1"),
        ("send", "10.89.0.2", "2"),
    ] {
        let common = ["-R", "-n", "300", "-s", "4096", "-q", qps];
        let mut server_args = vec!["perf", op, "bw", "--server"];
        server_args.extend(common);
        let mut client_args = vec!["perf", op, "bw", server_addr];
        client_args.extend(common);
        let (srv, cli) = server_and_client(
            ("127.0.0.1:7679", &server_args),
            ("127.0.0.1:7678", &client_args),
            "cm_rejected",
        );
        // Both ends ran the whole test: the client's figures, and the server's (from the
        // report exchange, or its own count of the SENDs it took).
        // (-q QPs run -n each, and perftest counts them all.)
        let q: u64 = qps.parse().unwrap();
        assert_eq!(cli["iterations"], 300 * q, "{op}: {cli}");
        assert!(cli["bw_avg_mb_s"].as_f64().unwrap() > 0.0, "{op}: {cli}");
        assert_eq!(cli["qps"], q, "{op}: {cli}");
        assert!(srv["bw_avg_mb_s"].as_f64().unwrap() > 0.0, "{op}: {srv}");
        // The keys each side printed are the other's.
        assert_eq!(cli["remote"]["qpn"], srv["local"]["qpn"], "{op}");
        assert_eq!(srv["remote"]["qpn"], cli["local"]["qpn"], "{op}");
        // Every connection (the exchange's and one per test QP) ended disconnected.
        for api in &n.api {
            let conns = api.ok(api.get("/v1/cm/connections"));
            let live: Vec<&Value> = conns
                .as_array()
                .unwrap()
                .iter()
                .filter(|c| c["state"] == "established")
                .collect();
            assert!(live.is_empty(), "{op}: {live:?}");
        }
    }
    // Every QP and region the runs made is gone again, and so is the listener.
    for api in &n.api {
        let qps = api.ok(api.get("/v1/qps"));
        assert_eq!(qps.as_array().map(Vec::len), Some(0), "{qps}");
        let mrs = api.ok(api.get("/v1/mrs"));
        assert_eq!(mrs.as_array().map(Vec::len), Some(0), "{mrs}");
        let ls = api.ok(api.get("/v1/cm/listeners"));
        assert_eq!(ls.as_array().map(Vec::len), Some(0), "{ls}");
    }
    n.stop();
}

#[test]
fn rocectl_ucmatose_sends_both_ways_and_the_server_disconnects() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = memif_nodes("cmatose", 7682);
    for (server_addr, count, size) in [("10.89.0.2", "10", "100"), ("fd89::2", "30", "5000")] {
        let (srv, cli) = server_and_client(
            ("127.0.0.1:7683", &["ucmatose", "-C", count, "-S", size]),
            (
                "127.0.0.1:7682",
                &["ucmatose", "-s", server_addr, "-C", count, "-S", size],
            ),
            "cm_rejected",
        );
        assert_eq!(
            cli["messages"].as_u64().map(|m| m.to_string()),
            Some(count.into()),
            "{cli}"
        );
        assert_eq!(cli["connection"]["remote_qpn"], srv["qpn"], "{cli} {srv}");
        assert_eq!(srv["connection"]["remote_qpn"], cli["qpn"], "{cli} {srv}");
        // Both ends of the connection are down: the server's DREQ, answered.
        for (api, c) in [(&n.api[0], &cli), (&n.api[1], &srv)] {
            let id = c["connection"]["id"].as_u64().unwrap();
            let v = until(api, &format!("/v1/cm/connections/{id}"), 5, |v| {
                v["state"] != "established"
            });
            assert_ne!(v["state"], "established", "{v}");
        }
    }
    for api in &n.api {
        let qps = api.ok(api.get("/v1/qps"));
        assert_eq!(qps.as_array().map(Vec::len), Some(0), "{qps}");
    }
    n.stop();
}

#[test]
fn sidr_resolves_udp_services_and_rocectl_udaddy_runs_both_ways() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = memif_nodes("cmsidr", 7680);
    // Nobody listens on UDP 7999: the SIDR_REP says so (status 1), and the call is refused.
    let ud = n.api[0].ok(n.api[0].post("/v1/qps", json!({"type": "UD"})));
    let ud = ud["qpn"].as_u64().unwrap() as u32;
    let (s, e) = n.api[0].post(
        "/v1/cm/resolve",
        json!({"qpn": ud, "peer": "10.89.0.2", "port": 7999, "timeout_ms": 5000}),
    );
    assert_eq!((s, e["code"].as_str()), (409, Some("cm_rejected")), "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("SIDR status 1"),
        "{e}"
    );
    // The QP was brought to RTS with rdma_cm's UDP Q_Key on the way.
    let q = n.api[0].ok(n.api[0].get(&format!("/v1/qps/{ud}")));
    assert_eq!(
        (q["state"].as_str(), q["qkey"].as_u64()),
        (Some("RTS"), Some(0x0123_4567)),
        "{q}"
    );
    // An RC QP cannot serve SIDR; a TCP listener is not a UDP one.
    let rc = create_qp(&n.api[0], None);
    let (s, e) = n.api[0].post(
        "/v1/cm/resolve",
        json!({"qpn": rc, "peer": "10.89.0.2", "port": 7999}),
    );
    assert_eq!((s, e["code"].as_str()), (400, Some("bad_qp")), "{e}");
    let l = n.api[1].ok(n.api[1].post("/v1/cm/listeners", json!({"port": 7998, "space": "udp"})));
    assert_eq!(
        (l["space"].as_str(), l["service_id"].as_str()),
        (Some("udp"), Some("0x0000000001111f3e")),
        "{l}"
    );
    let (s, _) = n.api[1].post(
        "/v1/cm/accept",
        json!({"port": 7998, "qpn": 1, "timeout_ms": 10}),
    );
    assert_eq!(s, 404, "no TCP listener on 7998");
    // A resolve that an accept answers: the peer's QPN and Q_Key come back.
    let udb = n.api[1].ok(n.api[1].post("/v1/qps", json!({"type": "UD"})));
    let udb = udb["qpn"].as_u64().unwrap() as u32;
    let (a, b) = std::thread::scope(|s| {
        let b = s.spawn(|| {
            n.api[1].post(
                "/v1/cm/accept",
                json!({"port": 7998, "space": "udp", "qpn": udb, "timeout_ms": 20000}),
            )
        });
        let a = n.api[0].post(
            "/v1/cm/resolve",
            json!({"qpn": ud, "peer": "fd89::2", "port": 7998, "timeout_ms": 20000}),
        );
        (n.api[0].ok(a), n.api[1].ok(b.join().unwrap()))
    });
    assert_eq!(
        (a["state"].as_str(), a["space"].as_str()),
        (Some("resolved"), Some("udp")),
        "{a}"
    );
    assert_eq!(a["remote_qpn"], udb, "{a}");
    assert_eq!(a["remote_qkey"], 0x0123_4567, "{a}");
    assert_eq!(
        (b["state"].as_str(), b["qpn"].as_u64()),
        (Some("resolved"), Some(u64::from(udb))),
        "{b}"
    );
    n.api[1].ok(n.api[1].delete("/v1/cm/listeners/7998?space=udp"));
    for (api, q) in [(&n.api[0], ud), (&n.api[0], rc), (&n.api[1], udb)] {
        api.ok(api.delete(&format!("/v1/qps/{q}")));
    }
    // rocectl udaddy, client and server, over IPv4 and IPv6.
    for (server_addr, count, size) in [("10.89.0.2", "10", "100"), ("fd89::2", "50", "1000")] {
        // (Until the server listens, SIDR says status 1.)
        let (srv, cli) = server_and_client(
            ("127.0.0.1:7681", &["udaddy", "-C", count, "-S", size]),
            (
                "127.0.0.1:7680",
                &["udaddy", "-s", server_addr, "-C", count, "-S", size],
            ),
            "SIDR status 1",
        );
        assert_eq!(
            cli["messages"].as_u64().map(|m| m.to_string()),
            Some(count.into()),
            "{cli}"
        );
        // Each side's messages named its QP, and the other side heard it.
        assert_eq!(cli["peer_qpn"], srv["qpn"], "{cli} {srv}");
        assert_eq!(srv["peer_qpn"], cli["qpn"], "{cli} {srv}");
        assert_eq!(cli["connection"]["remote_qpn"], srv["qpn"], "{cli}");
    }
    for api in &n.api {
        let qps = api.ok(api.get("/v1/qps"));
        assert_eq!(qps.as_array().map(Vec::len), Some(0), "{qps}");
        let ls = api.ok(api.get("/v1/cm/listeners"));
        assert_eq!(ls.as_array().map(Vec::len), Some(0), "{ls}");
    }
    n.stop();
}

#[test]
fn an_accept_may_name_which_waiting_request_it_takes() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = memif_nodes("cmpick", 7684);
    n.api[1].ok(n.api[1].post("/v1/cm/listeners", json!({"port": 7476, "backlog": 4})));
    let (a1, a2) = (create_qp(&n.api[0], None), create_qp(&n.api[0], None));
    let (b1, b2) = (create_qp(&n.api[1], None), create_qp(&n.api[1], None));
    std::thread::scope(|s| {
        let connects: Vec<_> = [a1, a2]
            .into_iter()
            .map(|qa| {
                let api = &n.api[0];
                s.spawn(move || {
                    api.post(
                        "/v1/cm/connect",
                        json!({"qpn": qa, "peer": "10.89.0.2", "port": 7476,
                               "timeout_ms": 20000}),
                    )
                })
            })
            .collect();
        // Both REQs wait on B, each under its connection ID with the peer's QPN.
        let waiting = until(&n.api[1], "/v1/cm/connections", 10, |v| {
            v.as_array()
                .unwrap()
                .iter()
                .filter(|c| c["state"] == "requested")
                .count()
                == 2
        });
        let waiting: Vec<Value> = waiting
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["state"] == "requested")
            .cloned()
            .collect();
        assert_eq!(waiting.len(), 2, "{waiting:?}");
        // Take the one from a2 first, by its ID, though a1's may be older.
        let pick = waiting
            .iter()
            .find(|c| c["remote_qpn"] == a2)
            .expect("a2's REQ waits");
        let id = pick["id"].as_u64().unwrap();
        let got = n.api[1].ok(n.api[1].post(
            "/v1/cm/accept",
            json!({"port": 7476, "qpn": b2, "id": id, "timeout_ms": 20000}),
        ));
        assert_eq!(
            (got["id"].as_u64(), got["state"].as_str()),
            (Some(id), Some("established")),
            "{got}"
        );
        assert_eq!(got["remote_qpn"], a2, "{got}");
        // It is no longer waiting: naming it again is refused; an unknown ID is not found.
        let (st, e) = n.api[1].post(
            "/v1/cm/accept",
            json!({"port": 7476, "qpn": b1, "id": id, "timeout_ms": 100}),
        );
        assert_eq!((st, e["code"].as_str()), (409, Some("bad_state")), "{e}");
        let (st, _) = n.api[1].post(
            "/v1/cm/accept",
            json!({"port": 7476, "qpn": b1, "id": 123_456_789, "timeout_ms": 100}),
        );
        assert_eq!(st, 404);
        // The other, the oldest one left, without an ID.
        let other = n.api[1].ok(n.api[1].post(
            "/v1/cm/accept",
            json!({"port": 7476, "qpn": b1, "timeout_ms": 20000}),
        ));
        assert_eq!(other["remote_qpn"], a1, "{other}");
        for c in connects {
            let (st, v) = c.join().unwrap();
            assert_eq!(st, 201, "{v}");
            assert_eq!(v["state"], "established", "{v}");
        }
    });
    n.stop();
}
