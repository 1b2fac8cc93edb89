//! Unmodified RDMA programs on ferroce (issue 21): Debian's own `ibv_devices`, `ibv_devinfo`,
//! `ibv_rc_pingpong`, `ibv_ud_pingpong` and perftest binaries, with libferroce_ibverbs.so on LD_PRELOAD, each on
//! node A against the same tool on node B (two roced nodes joined by memif); and a C program
//! built here against <infiniband/verbs.h> that drives the extended work-request API and
//! `ibv_post_send` with every byte checked.
//!
//! On a 2-CPU machine the tools share the CPUs with the two nodes' lcores, all of them polling:
//! the latencies they print are the scheduler's (milliseconds), not ferroce's. What is asserted
//! is that each tool runs to the end, exits 0 and prints its figures.

mod common;
use common::rdma::*;
use common::tools::*;
use common::{Api, tmpdir};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// True once something listens on TCP `port` (read from /proc, so that no probe connection
/// reaches the server, which would take it for its client).
fn listening(port: u16) -> bool {
    let hex = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 3 && f[1].ends_with(hex.trim_end()) && f[3] == "0A"
            })
        })
    })
}

/// Waits (20 s at most) for the server of `what` to listen on `port`.
fn wait_listening(port: u16, what: &str) {
    let t = Instant::now();
    while !listening(port) {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{what}: the server never listened on {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `name args` as server on B and as client on A (connecting to 127.0.0.1 on `port`):
/// both outputs, after checking both exited 0.
fn pair(socks: &[String; 2], name: &str, args: &[&str], port: u16) -> (String, String) {
    let p = port.to_string();
    let mut a: Vec<&str> = args.to_vec();
    a.extend(["-p", &p]);
    let server = tool(name, &socks[1], &a).spawn().unwrap();
    wait_listening(port, &format!("{name} {args:?}"));
    let mut ca = a.clone();
    ca.push("127.0.0.1");
    let client = tool(name, &socks[0], &ca).spawn().unwrap();
    let what = format!("{name} {args:?}");
    let c = wait_output(client, Duration::from_secs(120), &what);
    let s = wait_output(server, Duration::from_secs(30), &what);
    both_succeeded(&what, &c, &s)
}

/// perftest's result line for `size`: the numbers after it.
fn figures(out: &str, size: u32) -> Vec<f64> {
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.first() == Some(&size.to_string().as_str()) && f.len() > 3)
        .unwrap_or_else(|| panic!("no result line for {size} B in:\n{out}"))
        .iter()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect()
}

#[test]
fn unmodified_rdma_tools_run_on_ferroce_through_the_compatibility_library() {
    for t in ["ibv_devinfo", "ibv_rc_pingpong", "ib_write_bw"] {
        assert!(
            Command::new("sh")
                .args(["-c", &format!("command -v {t} >/dev/null")])
                .status()
                .unwrap()
                .success(),
            "{t} is not installed (scripts/setup.sh installs ibverbs-utils and perftest)"
        );
    }
    let n = memif_nodes("ibvtools", 7650);
    let pid = std::process::id();
    let socks = [
        format!("/run/ferroce/ferroce-ribvtools-a-{pid}.sock"),
        format!("/run/ferroce/ferroce-ribvtools-b-{pid}.sock"),
    ];

    // The devices, as rxe shows them: one port, active, Ethernet, the GID table with the
    // link-local GID, the IPv4-mapped one and the IPv6 one, all RoCE v2.
    let both = format!("{}:{}", socks[0], socks[1]);
    let o = tool("ibv_devices", &both, &[]).output().unwrap();
    let t = text(&o);
    assert!(
        o.status.success() && t.contains("ferroce0") && t.contains("ferroce1"),
        "{t}"
    );
    let o = tool("ibv_devinfo", &socks[0], &["-v"]).output().unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for want in [
        "hca_id:\tferroce0",
        "PORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "active_mtu:",
        "GID[  1]:\t\t::ffff:10.89.0.1, RoCE v2",
        "GID[  2]:\t\tfd89::1, RoCE v2",
    ] {
        assert!(t.contains(want), "ibv_devinfo -v lacks {want:?}:\n{t}");
    }
    assert!(t.contains("GID[  0]:\t\tfe80::"), "{t}");

    // The C program: the extended work-request API and ibv_post_send, every byte checked.
    let dir = tmpdir("ibvtools-c");
    let exe = dir.join("wr_api");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ibverbs/tests/c/wr_api.c");
    let cc = Command::new("gcc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-libverbs")
        .output()
        .unwrap();
    assert!(cc.status.success(), "gcc: {}", text(&cc));
    let o = tool(exe.to_str().unwrap(), &both, &[]).output().unwrap();
    assert!(
        o.status.success() && text(&o).contains("ok"),
        "wr_api: {}",
        text(&o)
    );

    // ibv_rc_pingpong, data checked (-c), over the IPv4 GID and the IPv6 one, polling and
    // sleeping on completion events (-e).
    for (gid, size, events) in [
        ("1", "4096", false),
        ("2", "65536", false),
        ("1", "4096", true),
    ] {
        let mut args = vec!["-g", gid, "-c", "-n", "50", "-s", size];
        if events {
            args.push("-e");
        }
        let (c, s) = pair(&socks, "ibv_rc_pingpong", &args, 19811);
        for out in [&c, &s] {
            assert!(out.contains("50 iters in"), "{out}");
        }
    }

    // ibv_ud_pingpong: UD QPs and address handles, over IPv4 and, with events, IPv6.
    for (gid, events) in [("1", false), ("2", true)] {
        let mut args = vec!["-g", gid, "-n", "50"];
        if events {
            args.push("-e");
        }
        let (c, s) = pair(&socks, "ibv_ud_pingpong", &args, 19812);
        for out in [&c, &s] {
            assert!(out.contains("50 iters in"), "{out}");
        }
    }

    // perftest, with its default options but the GID index (RoCE needs one), 64 B and 1 MiB.
    let mut port = 19820;
    for (name, sizes, iters) in [
        ("ib_write_bw", &[64u32, 1 << 20][..], "200"),
        ("ib_read_bw", &[64, 1 << 20], "200"),
        ("ib_send_bw", &[64, 1 << 20], "200"),
        ("ib_atomic_bw", &[8], "200"),
        ("ib_write_lat", &[8, 65536], "100"),
        ("ib_read_lat", &[8, 65536], "100"),
        ("ib_send_lat", &[8, 65536], "100"),
        // With completion events (perftest offers -e for SEND and READ only).
        ("ib_send_bw -e", &[64, 1 << 20], "200"),
        ("ib_read_bw -e", &[64], "200"),
        ("ib_send_lat -e", &[8], "100"),
        // Over UD (ping-pong: a receive is always posted; ib_send_bw -c UD outruns the
        // receiver's reposting here, and perftest waits forever for a dropped datagram).
        ("ib_send_lat -cUD", &[8], "100"),
    ] {
        for &size in sizes {
            port += 1;
            let s = size.to_string();
            let (name, events) = name.split_once(' ').unwrap_or((name, ""));
            let mut args = vec!["-x", "1", "-n", iters];
            if name != "ib_atomic_bw" {
                args.extend(["-s", &s]);
            }
            if !events.is_empty() {
                args.push(events);
            }
            let (c, _) = pair(&socks, name, &args, port);
            let f = figures(&c, size);
            assert!(
                f.len() >= 3 && f[1] > 0.0 && f[2] > 0.0,
                "{name} -s {size}: {f:?}\n{c}"
            );
        }
    }
    drop(n);
}

/// QPs node `api` has.
fn qps(api: &Api) -> usize {
    let (s, v) = api.get("/v1/qps");
    assert_eq!(s, 200, "{v}");
    v.as_array().map_or(0, Vec::len)
}

/// Waits until node `api` has no QP, at most a second after `since`.
fn no_qps_within_a_second(api: &Api, since: Instant, what: &str) {
    while qps(api) > 0 {
        assert!(since.elapsed() < Duration::from_secs(1), "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A 30-second `ib_write_bw` stream from A to B on TCP `port`: (server on B, client on A).
fn write_stream(socks: &[String; 2], port: u16) -> (Child, Child) {
    let p = port.to_string();
    let args = ["-x", "1", "-D", "30", "-p", &p];
    let server = tool("ib_write_bw", &socks[1], &args).spawn().unwrap();
    wait_listening(port, "ib_write_bw -D 30");
    let mut to = args.to_vec();
    to.push("127.0.0.1");
    let client = tool("ib_write_bw", &socks[0], &to).spawn().unwrap();
    (server, client)
}

#[test]
fn a_tool_killed_mid_stream_loses_its_resources_and_no_one_else_notices() {
    let mut n = memif_nodes("ibvkill", 7652);
    let pid = std::process::id();
    let socks = [
        format!("/run/ferroce/ferroce-ribvkill-a-{pid}.sock"),
        format!("/run/ferroce/ferroce-ribvkill-b-{pid}.sock"),
    ];
    // A WRITE stream from A for longer than the test waits.
    let (server, mut client) = write_stream(&socks, 19901);
    let t = Instant::now();
    while qps(&n.api[0]) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the stream never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    // Meanwhile another program on the same nodes runs to the end, its data checked.
    let (c, _) = pair(
        &socks,
        "ibv_rc_pingpong",
        &["-g", "1", "-c", "-n", "20"],
        19902,
    );
    assert!(c.contains("20 iters in"), "{c}");
    assert_eq!(qps(&n.api[0]), 1, "the stream's QP is still there");
    // Operators see the attached program and what it made (GET /v1/apps, rocectl apps).
    let victim = client.id();
    let (_, apps) = n.api[0].get("/v1/apps");
    let me = apps
        .as_array()
        .and_then(|l| l.iter().find(|a| a["pid"] == victim))
        .unwrap_or_else(|| panic!("pid {victim} is not listed: {apps}"));
    assert!(
        me["command"]
            .as_str()
            .is_some_and(|c| c.ends_with("ib_write_bw"))
            && me["qps"].as_array().is_some_and(|q| q.len() == 1)
            && me["mrs"].as_array().is_some_and(|m| !m.is_empty()),
        "{me}"
    );
    // What it posted and completed, counted for it: in the listing and as its own series
    // in /metrics.
    let c = &me["counters"];
    assert!(
        c["sends"].as_u64() > Some(0)
            && c["completions"].as_u64() > Some(0)
            && c["refused"] == 0
            && c["broken_rings"] == 0,
        "{me}"
    );
    let metrics = |api: &Api| {
        let (s, b) = api.get_bytes("/metrics");
        assert_eq!(s, 200);
        String::from_utf8(b).unwrap()
    };
    let m = metrics(&n.api[0]);
    let series = |family: &str| {
        m.lines()
            .find(|l| l.starts_with(family) && l.contains(&format!("pid=\"{victim}\"")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    assert!(series("ferroce_app_sends_total{") > Some(0), "{m}");
    assert!(series("ferroce_app_completions_total{") > Some(0), "{m}");
    assert_eq!(series("ferroce_app_errors_total{"), Some(0), "{m}");
    let (mut o, mut e) = (Vec::new(), Vec::new());
    let code = cli::ctl::run(
        ["rocectl", "--api", "127.0.0.1:7652", "apps"],
        &mut o,
        &mut e,
    );
    let t = String::from_utf8_lossy(&o);
    assert!(
        code == 0 && t.contains("ib_write_bw") && t.contains(&victim.to_string()),
        "rocectl apps: {t}{}",
        String::from_utf8_lossy(&e)
    );
    // Its 64 KiB messages leave A at MTU 4096 with their payload attached from its memory,
    // registered with DPDK.
    assert!(
        m.lines()
            .filter(|l| l.starts_with("ferroce_tx_attached_pkts_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum::<u64>()
            > 0,
        "no frame left attached: {m}"
    );
    let gauge = |api: &Api, name: &str| {
        metrics(api)
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<u64>().ok())
    };
    assert!(gauge(&n.api[0], "ferroce_app_zero_copy_areas") > Some(0));
    // kill -9 of the streaming process: roced destroys what it made within a second.
    client.kill().unwrap();
    let killed = Instant::now();
    let _ = client.wait();
    no_qps_within_a_second(
        &n.api[0],
        killed,
        "the killed process's QP outlived it by a second",
    );
    while gauge(&n.api[0], "ferroce_app_zero_copy_areas") != Some(0) {
        assert!(
            killed.elapsed() < Duration::from_secs(1),
            "the killed process's memory stayed registered with DPDK"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (_, apps) = n.api[0].get("/v1/apps");
    assert!(
        !apps.to_string().contains(&format!("\"pid\":{victim}")),
        "{apps}"
    );
    let m = metrics(&n.api[0]);
    assert!(!m.contains(&format!("pid=\"{victim}\"")), "{m}");
    let a = n.nodes[0].as_mut().unwrap();
    assert!(
        a.wait_log(&format!("pid={victim}"), Duration::from_secs(2))
            && a.log_text().contains("application detached"),
        "{}",
        a.log_text()
    );
    // Its peer, left alone, ends (its exchange socket closed), and its QP goes with it.
    let s = wait_output(
        server,
        Duration::from_secs(60),
        "the peer of the killed stream",
    );
    assert!(!s.status.success(), "the peer did not notice: {}", text(&s));
    no_qps_within_a_second(&n.api[1], Instant::now(), "the peer's QP stayed");
    // Now the receiving end dies mid-stream (the server on B): B destroys its QP within a
    // second, and the sender on A, whose WRITEs reach no QP any more, has its QP in error
    // within perftest's retry window (timeout 14, 67 ms, times 1 + 7 retries: about 0.5 s)
    // and exits with the completion's error.
    let (mut server, sender) = write_stream(&socks, 19904);
    let t = Instant::now();
    while qps(&n.api[0]) == 0 || qps(&n.api[1]) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the second stream never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    server.kill().unwrap();
    let killed = Instant::now();
    let _ = server.wait();
    no_qps_within_a_second(
        &n.api[1],
        killed,
        "the killed receiver's QP outlived it by a second",
    );
    let s = wait_output(
        sender,
        Duration::from_secs(10),
        "the sender to a killed receiver",
    );
    let noticed = killed.elapsed();
    let out = text(&s);
    assert!(
        !s.status.success() && out.contains("Failed status 12"),
        "the sender's WRITE should fail with IBV_WC_RETRY_EXC_ERR (12):\n{out}"
    );
    println!("sender to a killed receiver: in error and gone {noticed:?} after the kill");
    assert!(noticed < Duration::from_secs(3), "{noticed:?}:\n{out}");

    // And the nodes serve the next program as before.
    let (c, _) = pair(
        &socks,
        "ibv_rc_pingpong",
        &["-g", "1", "-c", "-n", "10"],
        19903,
    );
    assert!(c.contains("10 iters in"), "{c}");
}
