//! Two roced processes joined by net_memif exchange frames through their lcore loops (ARP,
//! neighbour discovery, IPv4 and IPv6 echo), and both stop cleanly on SIGTERM leaving no DPDK
//! files behind.

mod common;
use common::*;
use std::time::Duration;

fn node(prefix: &str, role: &str, sock: &str, cpu: usize, me: u8, peer: u8) -> String {
    node_vlan(prefix, role, sock, cpu, me, peer, None)
}

fn node_vlan(
    prefix: &str,
    role: &str,
    sock: &str,
    cpu: usize,
    me: u8,
    peer: u8,
    vlan: Option<u16>,
) -> String {
    let vlan = vlan
        .map(|v| format!("vlan = {v}\npcp = 3\n"))
        .unwrap_or_default();
    format!(
        r#"[eal]
file_prefix = "{prefix}"
[dataplane]
lcores = [{cpu}]
mbufs = 4095
[[ports]]
device = "net_memif0,role={role},socket={sock}"
{vlan}addresses = ["10.88.0.{me}/24", "fd88::{me}/64"]
probes = ["10.88.0.{peer}", "fd88::{peer}"]
"#
    )
}

#[test]
fn two_nodes_over_memif_exchange_frames_and_stop_cleanly() {
    require_root();
    let dir = tmpdir("memif");
    let sock = dir.join("memif.sock");
    let sock = sock.to_str().unwrap();
    let pa = format!("ferroce-t-a-{}", std::process::id());
    let pb = format!("ferroce-t-b-{}", std::process::id());
    let mut a = Roced::start(
        &dir,
        "a",
        &node(&pa, "server", sock, 1, 1, 2),
        None,
        &[
            "--ping",
            "10.88.0.2,fd88::2",
            "--ping-count",
            "5",
            "--ping-interval-ms",
            "100",
        ],
    );
    assert!(
        a.wait_log("lcores running", Duration::from_secs(20)),
        "node A did not start:\n{}",
        a.log_text()
    );
    let mut b = Roced::start(&dir, "b", &node(&pb, "client", sock, 0, 2, 1), None, &[]);
    assert!(
        b.wait_log("lcores running", Duration::from_secs(20)),
        "node B did not start:\n{}",
        b.log_text()
    );
    // Both ends resolve each other, then A's ten echo requests come back.
    assert!(
        a.wait_log("echo reply from=fd88::2 seq=4", Duration::from_secs(20))
            && a.wait_log("echo reply from=10.88.0.2 seq=4", Duration::from_secs(5)),
        "pings did not complete:\n{}",
        a.log_text()
    );
    a.signal_stop();
    b.signal_stop();
    let (code_b, rb, log_b) = b.terminate();
    let (code_a, ra, log_a) = a.terminate();
    assert_eq!(code_a, 0, "node A exit\n{log_a}");
    assert_eq!(code_b, 0, "node B exit\n{log_b}");
    for p in ra["pings"].as_array().unwrap() {
        assert_eq!(p["sent"], 5, "{p}");
        assert_eq!(p["received"], 5, "{p}");
    }
    // Frames crossed both lcore loops.
    assert!(counter(&ra, "tx_packets") >= 12, "{ra}");
    assert!(counter(&rb, "rx_packets") >= 12, "{rb}");
    assert_eq!(counter(&rb, "echo_replies_sent"), 10, "{rb}");
    // Whichever side asked first got an answer (the other learnt from the question itself).
    assert!(
        counter(&ra, "arp_replies_sent") + counter(&rb, "arp_replies_sent") >= 1,
        "{ra}\n{rb}"
    );
    assert!(
        counter(&ra, "nd_adverts_sent") + counter(&rb, "nd_adverts_sent") >= 1,
        "{ra}\n{rb}"
    );
    // Each learnt the other's MAC.
    let mac_a = ra["ports"][0]["mac"].as_str().unwrap().to_string();
    let mac_b = rb["ports"][0]["mac"].as_str().unwrap().to_string();
    let has = |r: &serde_json::Value, ip: &str, mac: &str| {
        r["neighbors"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["ip"] == ip && n["mac"] == mac && n["state"] == "reachable")
    };
    assert!(
        has(&ra, "10.88.0.2", &mac_b) && has(&ra, "fd88::2", &mac_b),
        "{ra}"
    );
    assert!(
        has(&rb, "10.88.0.1", &mac_a) && has(&rb, "fd88::1", &mac_a),
        "{rb}"
    );
    // Every mbuf came back, and DPDK left no files.
    assert_eq!(ra["mbufs_in_use_at_exit"], 0);
    assert_eq!(rb["mbufs_in_use_at_exit"], 0);
    assert_no_dpdk_files(&pa);
    assert_no_dpdk_files(&pb);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_nodes_talk_on_their_vlan_and_not_across_vlans() {
    require_root();
    for (vlan_b, works) in [(100, true), (200, false)] {
        let dir = tmpdir(&format!("memif-vlan{vlan_b}"));
        let sock = dir.join("memif.sock");
        let sock = sock.to_str().unwrap();
        let pa = format!("ferroce-t-va-{}", std::process::id());
        let pb = format!("ferroce-t-vb-{}", std::process::id());
        let mut a = Roced::start(
            &dir,
            "a",
            &node_vlan(&pa, "server", sock, 1, 1, 2, Some(100)),
            None,
            &[
                "--ping",
                "10.88.0.2",
                "--ping-count",
                "3",
                "--ping-interval-ms",
                "100",
            ],
        );
        assert!(
            a.wait_log("lcores running", Duration::from_secs(20)),
            "{}",
            a.log_text()
        );
        let mut b = Roced::start(
            &dir,
            "b",
            &node_vlan(&pb, "client", sock, 0, 2, 1, Some(vlan_b)),
            None,
            &[],
        );
        assert!(
            b.wait_log("lcores running", Duration::from_secs(20)),
            "{}",
            b.log_text()
        );
        let replied = a.wait_log(
            "echo reply from=10.88.0.2 seq=2",
            Duration::from_secs(if works { 20 } else { 4 }),
        );
        a.signal_stop();
        b.signal_stop();
        let (_, rb, _) = b.terminate();
        let (code, ra, log) = a.terminate();
        assert_eq!(code, 0, "{log}");
        assert_eq!(replied, works, "VLAN {vlan_b}: {log}");
        if works {
            assert_eq!(ra["pings"][0]["received"], 3, "{ra}");
        } else {
            assert_eq!(ra["pings"][0]["received"], 0, "{ra}");
            assert!(counter(&rb, "vlan_mismatch") >= 1, "{rb}");
        }
        assert_no_dpdk_files(&pa);
        assert_no_dpdk_files(&pb);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
