//! roced on net_af_packet ports, the path a kernel-attached deployment takes: three nodes, each
//! in a namespace of its own with a veth into a Linux bridge (a namespace standing in for the
//! switch), and each reachable for its REST API over a management veth from the test. RDMA
//! between two of them moves every opcode and size; then an ECN incast: two senders into one
//! receiver whose ingress runs the congestion point, with CNPs flowing back and the senders'
//! DCQCN rates falling.

mod common;
use common::rdma::*;
use common::*;
use serde_json::{Value, json};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// `n` nodes on a bridge: node k is 10.90.0.(k+1) / fd90::(k+1), its API at 10.201.k.2:7470.
fn bridge_nodes(tag: &str, n: usize) -> Cluster {
    require_root();
    let id = std::process::id() % 100000;
    let sw = Netns::new(&format!("fr{tag}sw{id}"));
    sw.exec("sysctl -qw net.ipv6.conf.all.disable_ipv6=1");
    // Frames cross the bridge without netfilter, whatever firewall and br_netfilter state the
    // host is in (a Docker engine's, say): the switch under test is the bridge alone.
    sw.exec(
        "ip link add br0 type bridge nf_call_iptables 0 nf_call_ip6tables 0 nf_call_arptables 0",
    );
    sw.exec("ip link set br0 up");
    let dir = tmpdir(&format!("veth-{tag}"));
    let mut nets = Vec::new();
    let mut nodes = Vec::new();
    let mut apis = Vec::new();
    let mut gids = Vec::new();
    for k in 0..n {
        let ns = Netns::new(&format!("fr{tag}n{k}{id}"));
        sh(&format!(
            "ip -n {} link add s{k} type veth peer name d{k} netns {}",
            sw.0, ns.0
        ));
        sw.exec(&format!("ip link set s{k} master br0"));
        sw.exec(&format!("ip link set s{k} up"));
        // The node's side carries no kernel addresses: only roced answers on it.
        ns.exec(&format!("sysctl -qw net.ipv6.conf.d{k}.disable_ipv6=1"));
        ns.exec(&format!("ip link set d{k} up"));
        ns.exec("ip link set lo up");
        // Management: a veth from this (the test's) namespace to the node's, for its API.
        let m = format!("frm{k}{id}");
        sh(&format!(
            "ip link add {m} type veth peer name a{k} netns {}",
            ns.0
        ));
        sh(&format!("ip addr add 10.201.{k}.1/30 dev {m}"));
        sh(&format!("ip link set {m} up"));
        ns.exec(&format!("ip addr add 10.201.{k}.2/30 dev a{k}"));
        ns.exec(&format!("ip link set a{k} up"));
        let me = k + 1;
        let probes: Vec<String> = (1..=n)
            .filter(|p| *p != me)
            .map(|p| format!("\"10.90.0.{p}\""))
            .collect();
        let cfg = format!(
            r#"[eal]
file_prefix = "ferroce-v{tag}{k}-{id}"
[dataplane]
lcores = [{cpu}]
mbufs = 8191
idle_sleep_us = 20
[[ports]]
device = "net_af_packet{k},iface=d{k}"
addresses = ["10.90.0.{me}/24", "fd90::{me}/64"]
probes = [{probes}]
[api]
listen = "10.201.{k}.2:7470"
"#,
            cpu = k % 2,
            probes = probes.join(", ")
        );
        let r = Roced::start(&dir, &format!("n{k}"), &cfg, Some(&ns.0), &[]);
        nodes.push(r);
        apis.push(format!("10.201.{k}.2:7470"));
        gids.push((format!("10.90.0.{me}"), format!("fd90::{me}")));
        nets.push(ns);
    }
    nets.push(sw);
    Cluster::new(nodes, apis, gids, nets, dir)
}

#[test]
fn rdma_over_af_packet_on_veths_moves_every_opcode_and_size() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = bridge_nodes("o", 2);
    let ra = reg(&n.api[0], 4 << 20);
    let rb = reg(&n.api[1], 4 << 20);
    for (k, v6) in [false, true].into_iter().enumerate() {
        let (qa, qb) = pair(&n, None, None, 1024, v6);
        every_opcode(&n, qa, qb, ra, rb, &SIZES, 300 + k as u32 * 1000);
    }
    let r = n.stop();
    for x in &r {
        assert_eq!(sum(x, "req_transport_retries_exceeded"), 0);
    }
    assert!(sum(&r[1], "rx_write_requests") > 0);
    // The frames really went through the kernel: the ports are af_packet.
    assert_eq!(
        r[0]["ports"][0]["driver"], "net_af_packet",
        "{}",
        r[0]["ports"]
    );
}

/// One sample of the incast.
struct Sample {
    t_ms: f64,
    rates_gbps: Vec<f64>,
    queue_kb: f64,
}

#[test]
fn ecn_incast_two_senders_cnps_slow_them_and_the_queue_stays_bounded() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = bridge_nodes("e", 3);
    let rx = 2;
    let profile = std::env::var("INCAST_PROFILE").unwrap_or_else(|_| "paper".into());
    // DCQCN's timers scaled to this path: the paper's (and NVIDIA's) assume microsecond round
    // trips, but here feedback crosses the kernel's af_packet and a bridge and queues at a
    // 1 Gb/s bottleneck, milliseconds in all, so increase events every 60 us would undo each
    // cut before the next mark could arrive. Explore others with INCAST_PROFILE, INCAST_KNOBS
    // and INCAST_CP (JSON).
    let knobs: Value = std::env::var("INCAST_KNOBS")
        .ok()
        .and_then(|v| serde_json::from_str(&v).ok())
        .unwrap_or(
            json!({"rpg_time_reset": 3000, "rpg_byte_reset": 3_000_000, "dce_tcp_rtt": 2000,
                          "min_time_between_cnps": 500, "rpg_ai_rate": 5, "rpg_hai_rate": 25}),
        );
    let cp: Value = std::env::var("INCAST_CP")
        .ok()
        .and_then(|v| serde_json::from_str(&v).ok())
        .unwrap_or(json!({"rate_gbps": 1.0, "buffer_kb": BUFFER_KB, "kmin_kb": 10, "kmax_kb": 100, "pmax": 0.1}));
    // The receiver's ingress: a 1 Gb/s bottleneck, RED marking from 10 KB to 100 KB (up to
    // 10 %), tail drop beyond 400 KB.
    const BUFFER_KB: u64 = 400;
    n.api[rx].ok(n.api[rx].put(
        "/v1/ports/0/impair",
        json!({"direction": "rx", "congestion": cp}),
    ));
    let rr = reg(&n.api[rx], 8 << 20);
    let mut flows = Vec::new(); // (sender, its QPN, its region)
    for s in 0..2 {
        let rs = reg(&n.api[s], 1 << 20);
        for _ in 0..2 {
            let mk = |k: usize| {
                n.api[k].ok(n.api[k].post("/v1/qps", json!({"cc_profile": profile, "dcqcn": knobs})))["qpn"]
                    .as_u64()
                    .unwrap() as u32
            };
            let (qs, qr) = (mk(s), mk(rx));
            connect(&n.api[s], qs, (&n.api[rx], qr), &n.gids[rx].0, 1024);
            connect(&n.api[rx], qr, (&n.api[s], qs), &n.gids[s].0, 1024);
            flows.push((s, qs, rs));
        }
    }
    let line = n.api[0].ok(n.api[0].get(&format!("/v1/qps/{}", flows[0].1)))["cc"]["rate_bps"]
        .as_f64()
        .unwrap();
    const MSG: usize = 64 << 10;
    const COUNT: u64 = 150;
    let streams: Vec<_> = flows
        .iter()
        .enumerate()
        .map(|(i, &(s, qs, rs))| {
            let base = n.api[s].base.clone();
            std::thread::spawn(move || {
                let api = Api::new(base.trim_start_matches("http://"));
                api.ok(api.post(
                    &format!("/v1/qps/{qs}/stream"),
                    json!({"opcode": "write", "sge": sge(rs.1, MSG, rs.0),
                           "remote_addr": rr.1 + (i * MSG) as u64, "rkey": rr.0,
                           "count": COUNT, "depth": 4, "timeout_ms": 180000}),
                ))
            })
        })
        .collect();
    let t0 = Instant::now();
    let mut samples = Vec::new();
    while !streams.iter().all(|s| s.is_finished()) && t0.elapsed() < Duration::from_secs(180) {
        let rates = flows
            .iter()
            .map(|&(s, qs, _)| {
                n.api[s].get(&format!("/v1/qps/{qs}")).1["cc"]["rate_bps"]
                    .as_f64()
                    .unwrap_or(f64::NAN)
                    / 1e9
            })
            .collect();
        let imp = n.api[rx].get("/v1/ports/0/impair").1;
        samples.push(Sample {
            t_ms: t0.elapsed().as_secs_f64() * 1e3,
            rates_gbps: rates,
            queue_kb: imp["rx"]["counters"]["cp_queue_bytes"]
                .as_f64()
                .unwrap_or(0.0)
                / 1e3,
        });
        std::thread::sleep(Duration::from_millis(25));
    }
    let elapsed = t0.elapsed();
    for s in streams {
        let r = s.join().unwrap();
        assert_eq!(r["completed"], COUNT, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
    }
    let imp = n.api[rx].ok(n.api[rx].get("/v1/ports/0/impair"))["rx"]["counters"].clone();
    let stats: Vec<Value> = n.api.iter().map(|a| a.ok(a.get("/v1/stats"))).collect();
    let reports = n.stop();

    // What happened, for the record.
    eprintln!(
        "incast: 4 flows (2 senders x 2 QPs) of {COUNT} x 64 KiB WRITEs into the congestion \
         point {cp}, DCQCN {profile} with {knobs}, line rate {:.1} Gb/s: {:.2} s, goodput {:.3} Gb/s",
        line / 1e9,
        elapsed.as_secs_f64(),
        (4 * COUNT * MSG as u64 * 8) as f64 / elapsed.as_secs_f64() / 1e9
    );
    eprintln!("   t_ms  rates_gbps (flow 0..3)          queue_kb");
    let step = (samples.len() / 20).max(1);
    for s in samples.iter().step_by(step) {
        let r: Vec<String> = s.rates_gbps.iter().map(|r| format!("{r:6.3}")).collect();
        eprintln!("{:7.0}  {}  {:8.1}", s.t_ms, r.join(" "), s.queue_kb);
    }
    eprintln!("receiver congestion point: {imp}");
    let cnp_sent = sum(&reports[rx], "np_cnp_sent");
    let ecn_seen = sum(&reports[rx], "np_ecn_marked_roce_packets");
    let cnp_rcvd = sum(&reports[0], "rp_cnp_received") + sum(&reports[1], "rp_cnp_received");
    let rcvd = sum(&reports[rx], "rcvd_pkts");
    eprintln!(
        "receiver: rcvd_pkts {rcvd} np_ecn_marked_roce_packets {ecn_seen} np_cnp_sent {cnp_sent}; \
         senders: rp_cnp_received {cnp_rcvd}; senders' stats {} / {}",
        stats[0]["lcores"][0]["counters"]["rp_cnp_received"],
        stats[1]["lcores"][0]["counters"]["rp_cnp_received"]
    );

    assert!(
        imp["ce_marked"].as_u64().unwrap() > 0,
        "the queue marked CE: {imp}"
    );
    assert!(
        ecn_seen > 0 && cnp_sent > 0,
        "the receiver answered marks with CNPs"
    );
    assert!(cnp_rcvd > 0, "CNPs reached the senders");
    let min_rate = samples
        .iter()
        .flat_map(|s| s.rates_gbps.iter().copied())
        .fold(f64::INFINITY, f64::min);
    assert!(
        min_rate < 0.5 * line / 1e9,
        "DCQCN cut the senders' rates below half the line rate (lowest {min_rate:.3} Gb/s)"
    );
    let max_q = imp["cp_max_bytes"].as_u64().unwrap();
    assert!(
        max_q <= BUFFER_KB * 1000,
        "the queue never exceeds its buffer: {max_q}"
    );
    // Drops are bounded by what the senders put in flight before any feedback could arrive:
    // every flow's first window (depth x 64 KiB, in 1 KiB frames), sent at line rate into a
    // 1 Gb/s queue; after the first CNPs the cut rates keep the queue inside its buffer.
    let dropped = imp["cp_dropped"].as_u64().unwrap();
    let first_windows = 4 * 4 * (MSG as u64 / 1024);
    assert!(
        dropped <= first_windows,
        "drops stay bounded (at most the first windows, {first_windows} frames): {dropped} of {rcvd}"
    );
}
