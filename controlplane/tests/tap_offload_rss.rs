//! roced with two worker lcores on a net_tap port: the one vdev here that advertises IPv4/UDP
//! checksum offload and RSS. The IPv4 header checksum of every reply is left to the port, so the
//! Linux end accepting the replies proves the offload request is right; RSS spreads queues over
//! both lcores, and what one lcore learns about neighbours reaches the other.

mod common;
use common::*;
use std::time::Duration;

#[test]
fn tap_port_with_offload_and_two_lcores_answers_linux() {
    require_root();
    let id = std::process::id() % 100000;
    let ns = Netns::new(&format!("fe-t{id}"));
    let dir = tmpdir("tap");
    let prefix = format!("ferroce-t-tap-{id}");
    let cfg = format!(
        r#"[eal]
file_prefix = "{prefix}"
[dataplane]
lcores = [0, 1]
mbufs = 4095
[[ports]]
device = "net_tap0,iface=ftap{id}"
addresses = ["10.98.0.2/24", "fd98::2/64"]
"#
    );
    let mut roced = Roced::start(&dir, "tap", &cfg, Some(&ns.0), &[]);
    assert!(
        roced.wait_log("lcores running workers=2", Duration::from_secs(20)),
        "{}",
        roced.log_text()
    );
    let log = roced.log_text();
    assert!(
        log.contains("tx_ipv4_cksum_offload=true") && log.contains("rss=true"),
        "net_tap should negotiate checksum offload and RSS:\n{log}"
    );
    ns.exec(&format!("ip addr add 10.98.0.1/24 dev ftap{id}"));
    ns.exec(&format!("ip -6 addr add fd98::1/64 dev ftap{id} nodad"));
    ns.exec(&format!("ip link set ftap{id} up"));
    let v4 = ns.exec("ping -c 5 -i 0.2 -W 2 10.98.0.2");
    assert!(v4.contains("5 received"), "{v4}");
    let big = ns.exec("ping -c 2 -i 0.2 -s 1400 -W 2 10.98.0.2");
    assert!(big.contains("2 received"), "{big}");
    let v6 = ns.exec("ping -6 -c 3 -i 0.2 -W 2 fd98::2");
    assert!(v6.contains("3 received"), "{v6}");

    let (code, report, log) = roced.terminate();
    assert_eq!(code, 0, "{log}");
    assert_eq!(report["lcores"].as_array().unwrap().len(), 2);
    assert!(counter(&report, "echo_replies_sent") >= 10, "{report}");
    assert_eq!(counter(&report, "bad_checksum"), 0, "{report}");
    // Both lcores know both neighbours, whichever learnt them.
    for lcore in 0..2 {
        for ip in ["10.98.0.1", "fd98::1"] {
            assert!(
                report["neighbors"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|n| n["lcore"] == lcore && n["ip"] == ip),
                "lcore {lcore} lacks {ip}: {report}"
            );
        }
    }
    assert_eq!(report["mbufs_in_use_at_exit"], 0);
    assert_no_dpdk_files(&prefix);
    let _ = std::fs::remove_dir_all(&dir);
}
