//! Unmodified rdma_cm programs on ferroce (issue 24): Debian's own `rping`, `ucmatose`,
//! `udaddy`, `rdma_server`/`rdma_client` and perftest's `-R`, with libferroce_ibverbs.so on
//! LD_PRELOAD (which answers librdmacm's calls too), server on node B against client on node A
//! (two roced nodes joined by memif), over IPv4 and IPv6.
//!
//! What is asserted is each tool's own verdict (rping -v checks every ping's data, the others
//! count their messages and fail on a lost one), that both ends exit 0, and that roced's CM
//! counted the connections.

mod common;
use common::rdma::*;
use common::tools::*;
use std::time::{Duration, Instant};

/// Node B's CM listeners (its REST API), to know when a server listens.
fn listens(api: &common::Api, port: u16) -> bool {
    api.get("/v1/cm/listeners")
        .1
        .as_array()
        .is_some_and(|a| a.iter().any(|l| l["port"].as_u64() == Some(port as u64)))
}

/// Runs `server` on B, waits for it to listen on `port`, then `client` on A: both outputs,
/// after checking both exited 0.
fn pair(
    n: &Cluster,
    socks: &[String; 2],
    (name, server, client): (&str, &[&str], &[&str]),
    port: u16,
) -> (String, String) {
    pair2(n, socks, ((name, server), (name, client)), port)
}

/// A program and its arguments.
type Run<'a> = (&'a str, &'a [&'a str]);

/// [`pair`] of two programs: (server, its arguments), (client, its arguments).
fn pair2(
    n: &Cluster,
    socks: &[String; 2],
    ((sname, server), (name, client)): (Run<'_>, Run<'_>),
    port: u16,
) -> (String, String) {
    let what = format!("{name} {client:?}");
    let s = tool(sname, &socks[1], server).spawn().unwrap();
    let t = Instant::now();
    while !listens(&n.api[1], port) {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{what}: the server never listened on {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let c = tool(name, &socks[0], client).spawn().unwrap();
    let c = wait_output(c, Duration::from_secs(120), &what);
    let s = wait_output_or(s, Duration::from_secs(30), &what, &text(&c));
    both_succeeded(&what, &c, &s)
}

#[test]
fn unmodified_rdma_cm_tools_run_on_ferroce_through_the_library() {
    let n = memif_nodes("cmtools", 7690);
    let pid = std::process::id();
    let socks = [
        format!("/run/ferroce/ferroce-rcmtools-a-{pid}.sock"),
        format!("/run/ferroce/ferroce-rcmtools-b-{pid}.sock"),
    ];
    for (b, port) in [("10.89.0.2", 7481u16), ("fd89::2", 7482)] {
        let p = port.to_string();
        // rping: 100 pings, each one's data checked by the client (-v prints them).
        let (ct, st) = pair(
            &n,
            &socks,
            (
                "rping",
                &["-s", "-a", b, "-p", &p, "-v"],
                &["-c", "-a", b, "-p", &p, "-C", "100", "-v"],
            ),
            port,
        );
        let pings = ct
            .lines()
            .filter(|l| l.starts_with("ping data: rdma-ping-"))
            .count();
        assert_eq!(
            pings, 100,
            "rping -c printed {pings} pings:\n{ct}\n-- server:\n{st}"
        );
        // ucmatose (RC, port 7471) and udaddy (UD through SIDR, port 7174): one connection,
        // 10 messages of 100 bytes each way; each end counts what it got.
        let done = |t: &str| t.contains("data transfers complete") && t.contains("return status 0");
        for (name, port) in [("ucmatose", 7471u16), ("udaddy", 7174)] {
            let (ct, st) = pair(
                &n,
                &socks,
                (
                    name,
                    &["-b", b, "-C", "10", "-S", "100"],
                    &["-s", b, "-C", "10", "-S", "100"],
                ),
                port,
            );
            assert!(done(&ct) && done(&st), "{name}:\n{ct}\n-- server:\n{st}");
        }
        // rdma_server/rdma_client: synchronous endpoints (rdma_create_ep, rdma_get_request),
        // one message each way.
        let (ct, st) = pair2(
            &n,
            &socks,
            (
                ("rdma_server", &["-s", b, "-p", "7490"]),
                ("rdma_client", &["-s", b, "-p", "7490"]),
            ),
            7490,
        );
        assert!(
            ct.contains("rdma_client: end 0") && st.contains("rdma_server: end 0"),
            "rdma_client:\n{ct}\n-- rdma_server:\n{st}"
        );
    }
    // perftest's -R (its IPv4 only: an IPv6 server is refused by its client): the keys
    // exchanged over the CM connection's SENDs, then the test, one CM connection per QP.
    for (t, extra, port) in [
        ("ib_write_bw", &["-q", "2"][..], 7491u16),
        ("ib_read_bw", &[][..], 7492),
        ("ib_send_bw", &[][..], 7493),
    ] {
        let p = port.to_string();
        let mut sa = vec![
            "-R", "-F", "-s", "4096", "-n", "200", "-m", "1024", "-p", &p,
        ];
        sa.extend(extra);
        let mut ca = sa.clone();
        ca.push("10.89.0.2");
        let (ct, st) = pair(&n, &socks, (t, &sa, &ca), port);
        let line = ct
            .lines()
            .find(|l| l.split_whitespace().next() == Some("4096"))
            .unwrap_or_else(|| panic!("{t} -R: no result line:\n{ct}\n-- server:\n{st}"));
        let mbs: Vec<f64> = line
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        assert!(
            mbs.len() >= 4 && mbs[3] > 0.0,
            "{t} -R: {line:?}\n{ct}\n-- server:\n{st}"
        );
    }
    // roced's CM on B established each RC connection once: rping, ucmatose and rdma_client
    // over IPv4 and IPv6 (6), perftest's key exchanges (3) and test QPs (2 + 1 + 1); its book
    // missed no event.
    let value = |series: &str| n.api[1].metric(series);
    assert_eq!(
        value(r#"ferroce_cm_established_total{lcore="0"}"#),
        Some(13.0)
    );
    assert_eq!(
        value(r#"ferroce_gsi_events_lost_total{lcore="0"}"#),
        Some(0.0)
    );
    n.stop();
}
