//! roced on a net_af_packet port attached to a veth in a namespace: a Linux host in another
//! namespace pings it over IPv4 and IPv6, learns its MAC, and the appliance resolves the host's
//! MAC on its own.

mod common;
use common::*;
use std::time::{Duration, Instant};

fn link_mac(ns: &Netns, dev: &str) -> String {
    let out = ns.exec(&format!("cat /sys/class/net/{dev}/address"));
    out.trim().to_string()
}

#[test]
fn linux_host_pings_appliance_and_both_resolve_each_other() {
    require_root();
    let id = std::process::id() % 100000;
    let host = Netns::new(&format!("fe-h{id}"));
    let dut = Netns::new(&format!("fe-d{id}"));
    sh(&format!(
        "ip -n {} link add vh type veth peer name vd netns {}",
        host.0, dut.0
    ));
    host.exec("ip addr add 10.99.0.1/24 dev vh");
    host.exec("ip -6 addr add fd99::1/64 dev vh nodad");
    host.exec("ip link set vh up");
    // The DUT side carries no kernel addresses: only the appliance answers on it.
    dut.exec("sysctl -qw net.ipv6.conf.vd.disable_ipv6=1");
    dut.exec("ip link set vd up");
    let host_mac = link_mac(&host, "vh");
    let dut_mac = link_mac(&dut, "vd");

    let dir = tmpdir("veth");
    let prefix = format!("ferroce-t-v-{id}");
    let cfg = format!(
        r#"[eal]
file_prefix = "{prefix}"
[dataplane]
lcores = [1]
mbufs = 4095
[[ports]]
device = "net_af_packet0,iface=vd"
addresses = ["10.99.0.2/24", "fd99::2/64"]
probes = ["10.99.0.1", "fd99::1"]
"#
    );
    let mut roced = Roced::start(&dir, "dut", &cfg, Some(&dut.0), &[]);
    assert!(
        roced.wait_log("lcores running", Duration::from_secs(20)),
        "roced did not start:\n{}",
        roced.log_text()
    );
    // The appliance resolves the host by itself (its probes), before the host says anything.
    assert!(
        roced.wait_log(
            "neighbor resolved port=0 ip=10.99.0.1",
            Duration::from_secs(10)
        ) && roced.wait_log(
            "neighbor resolved port=0 ip=fd99::1",
            Duration::from_secs(10)
        ),
        "appliance did not resolve the host:\n{}",
        roced.log_text()
    );

    // The host learnt the appliance from its solicitations; forget it, so the host has to ask
    // (and the appliance has to answer ARP and neighbour solicitations).
    host.exec("ip neigh flush dev vh");
    host.exec("ip -6 neigh flush dev vh");

    let ping = |cmd: &str| {
        let t0 = Instant::now();
        loop {
            let out = host.exec_out(cmd);
            if out.status.success() {
                return String::from_utf8_lossy(&out.stdout).into_owned();
            }
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "`{cmd}` failed: {}",
                String::from_utf8_lossy(&out.stdout)
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    };
    let v4 = ping("ping -c 3 -i 0.2 -W 2 10.99.0.2");
    assert!(v4.contains("3 received"), "{v4}");
    let v6 = ping("ping -6 -c 3 -i 0.2 -W 2 fd99::2");
    assert!(v6.contains("3 received"), "{v6}");
    // A large echo (near the MTU) comes back whole.
    let big = ping("ping -c 1 -s 1400 -W 2 10.99.0.2");
    assert!(big.contains("1 received"), "{big}");

    let neigh4 = host.exec("ip neigh show 10.99.0.2 dev vh");
    assert!(
        neigh4.contains(&dut_mac),
        "host's ARP entry {neigh4:?} lacks the appliance MAC {dut_mac}"
    );
    let neigh6 = host.exec("ip -6 neigh show fd99::2 dev vh");
    assert!(
        neigh6.contains(&dut_mac),
        "host's ND entry {neigh6:?} lacks the appliance MAC {dut_mac}"
    );

    let (code, report, log) = roced.terminate();
    assert_eq!(code, 0, "roced exit\n{log}");
    let mac_dash = host_mac.replace(':', "-");
    let has = |ip: &str| {
        report["neighbors"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["ip"] == ip && n["mac"] == mac_dash.as_str())
    };
    assert!(
        has("10.99.0.1") && has("fd99::1"),
        "appliance neighbours lack host MAC {mac_dash}: {report}"
    );
    assert!(counter(&report, "arp_requests_sent") >= 1, "{report}");
    assert!(counter(&report, "nd_solicits_sent") >= 1, "{report}");
    assert!(counter(&report, "echo_replies_sent") >= 7, "{report}");
    assert!(counter(&report, "arp_replies_sent") >= 1, "{report}");
    assert!(counter(&report, "nd_adverts_sent") >= 1, "{report}");
    assert_eq!(report["mbufs_in_use_at_exit"], 0);
    assert_no_dpdk_files(&prefix);
    let _ = std::fs::remove_dir_all(&dir);
}
