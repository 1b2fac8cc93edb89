//! Prometheus exposition of a node (`GET /metrics`): its ports, lcores, RDMA transport,
//! impairment stages, QPs by state and DCQCN, under the `ferroce_` prefix.
//!
//! The counters live where they are counted (single-writer per lcore); a scrape reads them
//! (the RDMA ones through each lcore's command channel, as `/v1/stats` does) into a fresh
//! registry and encodes it, so nothing is kept between scrapes and the exposition always
//! shows the counters' own totals. RDMA counters keep the rxe/mlx5 names (`sent_pkts` is
//! `ferroce_sent_pkts_total`), per lcore: a QP lives on one lcore for its whole life, so the
//! per-lcore series are the device totals split by owner.

use crate::state::ApiState;
use dataplane::counters::DropReason;
use dataplane::host::{AppCounters, HostCounters};
use dataplane::transport::cq::{LatencyHistograms, WcOpcode};
use dataplane::transport::qp::QpState;
use prometheus::{Encoder, GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};

/// What the help line says for each RDMA counter name (rxe's and mlx5's meanings).
fn rdma_help(name: &str) -> &'static str {
    match name {
        "sent_pkts" => "RoCE frames sent (requests, responses, ACKs, CNPs, retransmissions)",
        "rcvd_pkts" => "RoCE frames received for a QP that passed their checks",
        "rx_write_requests" => "RDMA WRITE request packets executed",
        "rx_read_requests" => "RDMA READ requests executed",
        "rx_atomic_requests" => "atomic requests executed",
        "out_of_buffer" => {
            "SENDs that found no posted receive (RC: RNR NAKs sent; UD: datagrams dropped)"
        }
        "out_of_sequence" => "request packets received out of sequence",
        "duplicate_request" => "duplicate request packets received",
        "packet_seq_err" => "PSN sequence error NAKs received",
        "implied_nak_seq_err" => "READ or atomic responses that implied lost packets",
        "local_ack_timeout_err" => "ACK timeouts (retransmissions by timer)",
        "rnr_nak_retry_err" => "RNR NAKs received",
        "req_transport_retries_exceeded" => "QPs failed after retry_cnt retransmissions",
        "req_rnr_retries_exceeded" => "QPs failed after rnr_retry RNR retries",
        "np_ecn_marked_roce_packets" => "CE-marked RoCE packets received (notification point)",
        "np_cnp_sent" => "CNPs sent (notification point)",
        "rp_cnp_received" => "CNPs received (reaction point)",
        "tx_attached_pkts" => "frames sent with their payload attached from the region",
        "qkey_violations" => "datagrams a UD QP dropped for carrying another Q_Key",
        "rx_wrong_source" => {
            "frames a connected QP dropped for coming from another address than its remote"
        }
        _ => "RDMA transport counter",
    }
}

/// Families registered in one registry, for one scrape.
struct Families(Registry);

impl Families {
    fn counter(&self, name: &str, help: &str, labels: &[&str]) -> Result<IntCounterVec, String> {
        let c = IntCounterVec::new(Opts::new(name, help), labels).map_err(|e| e.to_string())?;
        self.0
            .register(Box::new(c.clone()))
            .map_err(|e| format!("{name}: {e}"))?;
        Ok(c)
    }

    fn gauge(&self, name: &str, help: &str, labels: &[&str]) -> Result<GaugeVec, String> {
        let g = GaugeVec::new(Opts::new(name, help), labels).map_err(|e| e.to_string())?;
        self.0
            .register(Box::new(g.clone()))
            .map_err(|e| format!("{name}: {e}"))?;
        Ok(g)
    }

    fn int_gauge(&self, name: &str, help: &str, labels: &[&str]) -> Result<IntGaugeVec, String> {
        let g = IntGaugeVec::new(Opts::new(name, help), labels).map_err(|e| e.to_string())?;
        self.0
            .register(Box::new(g.clone()))
            .map_err(|e| format!("{name}: {e}"))?;
        Ok(g)
    }
}

/// Upper bounds of the completion-latency histogram buckets, seconds.
const LATENCY_BUCKETS: [f64; 22] = [
    1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1,
    0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
];

/// The exposition text for the node `st`, whose lcores reported `hosts` and `latency`.
pub fn render(
    st: &ApiState,
    hosts: &[HostCounters],
    latency: &LatencyHistograms,
    apps: &[(serde_json::Value, AppCounters)],
) -> Result<String, String> {
    let f = Families(Registry::new());
    ports(&f, st)?;
    lcores(&f, st)?;
    rdma(&f, hosts)?;
    impairment(&f, st)?;
    applications(&f, apps)?;
    zero_copy(&f)?;
    qp_memory(&f, st)?;
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&f.0.gather(), &mut out)
        .map_err(|e| e.to_string())?;
    let mut text = String::from_utf8(out).map_err(|e| e.to_string())?;
    latency_text(&mut text, latency);
    Ok(text)
}

/// `ferroce_completion_latency_seconds`, a histogram per send opcode, written in the text
/// format directly: the client library's histograms take observations one by one, while these
/// come from HdrHistogram already counted (bucket counts are its counts at or below each
/// bound, to its two significant digits).
fn latency_text(out: &mut String, latency: &LatencyHistograms) {
    use std::fmt::Write;
    let name = "ferroce_completion_latency_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} post-to-completion latency of signalled send work requests, by opcode"
    );
    let _ = writeln!(out, "# TYPE {name} histogram");
    for (op, h) in WcOpcode::SEND_SIDE.iter().zip(&latency.by_opcode) {
        let op = op.name();
        for le in LATENCY_BUCKETS {
            let n = if h.is_empty() {
                0
            } else {
                h.count_between(0, (le * 1e9) as u64)
            };
            let _ = writeln!(out, "{name}_bucket{{opcode=\"{op}\",le=\"{le}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{opcode=\"{op}\",le=\"+Inf\"}} {}",
            h.len()
        );
        let sum = h.mean() * h.len() as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{{opcode=\"{op}\"}} {sum}");
        let _ = writeln!(out, "{name}_count{{opcode=\"{op}\"}} {}", h.len());
    }
}

/// Per attached process (`pid`, `command`): what its QPs posted and completed through their
/// rings, and the entries or rings refused. A process's series go when it detaches, as its
/// resources do.
fn applications(f: &Families, apps: &[(serde_json::Value, AppCounters)]) -> Result<(), String> {
    let l = ["pid", "command"];
    let families = [
        (
            "ferroce_app_sends_total",
            "send work requests an attached process posted",
        ),
        (
            "ferroce_app_recvs_total",
            "receive work requests an attached process posted",
        ),
        (
            "ferroce_app_completions_total",
            "completions written to an attached process's completion rings",
        ),
        (
            "ferroce_app_errors_total",
            "ring entries refused (bad opcode, key, length) and rings abandoned as corrupt",
        ),
    ];
    let vecs = families
        .iter()
        .map(|(n, h)| f.counter(n, h, &l))
        .collect::<Result<Vec<_>, _>>()?;
    for (v, c) in apps {
        let pid = v["pid"].as_u64().unwrap_or(0).to_string();
        let command = v["command"].as_str().unwrap_or("");
        let values = [c.sends, c.recvs, c.completions, c.refused + c.broken_rings];
        for (family, n) in vecs.iter().zip(values) {
            family.with_label_values(&[&pid, command]).inc_by(n);
        }
    }
    Ok(())
}

/// Application memory registered with DPDK so that frames carry its bytes attached, and the
/// registrations refused (DPDK's memseg lists all taken, IOVA as PA with a physical device):
/// those regions still work, their bytes copied into frames.
/// The node's QP memory: what its QPs' caps reserve and the most they may (creating past it
/// answers 409 `out_of_resources`).
fn qp_memory(f: &Families, st: &ApiState) -> Result<(), String> {
    let (held, budget) = st.rdma.qp_memory();
    let none: &[&str] = &[];
    f.int_gauge(
        "ferroce_qp_memory_bytes",
        "memory the node's QPs reserve by their caps (queues at full depth, inline slots, CQs)",
        &[],
    )?
    .with_label_values(none)
    .set(held as i64);
    f.int_gauge(
        "ferroce_qp_memory_limit_bytes",
        "the most memory the node's QPs may reserve (three quarters of the machine's)",
        &[],
    )?
    .with_label_values(none)
    .set(budget as i64);
    Ok(())
}

fn zero_copy(f: &Families) -> Result<(), String> {
    let z = dataplane::dpdk::zero_copy_stats();
    let none: &[&str] = &[];
    f.int_gauge(
        "ferroce_app_zero_copy_areas",
        "application memory areas registered with DPDK for zero-copy transmit",
        &[],
    )?
    .with_label_values(none)
    .set(z.areas as i64);
    f.int_gauge(
        "ferroce_app_zero_copy_bytes",
        "bytes of application memory registered with DPDK for zero-copy transmit",
        &[],
    )?
    .with_label_values(none)
    .set(z.bytes as i64);
    f.counter(
        "ferroce_app_zero_copy_refused_total",
        "application memory registrations DPDK refused: those regions' bytes are copied into frames",
        &[],
    )?
    .with_label_values(none)
    .inc_by(z.refused);
    Ok(())
}

fn ports(f: &Families, st: &ApiState) -> Result<(), String> {
    let [used, size] = &st.mbufs;
    f.int_gauge(
        "ferroce_mbufs_in_use",
        "mbufs of the node's pool handed out: in the ports' rings, on lcores, in flight",
        &[],
    )?
    .with_label_values(&[] as &[&str])
    .set(used.load(std::sync::atomic::Ordering::Relaxed) as i64);
    f.int_gauge("ferroce_mbufs", "mbufs in the node's pool", &[])?
        .with_label_values(&[] as &[&str])
        .set(size.load(std::sync::atomic::Ordering::Relaxed) as i64);
    let ports = st.ports.lock().expect("ports").clone();
    let counters = [
        (
            "ipackets",
            "ferroce_port_rx_packets_total",
            "frames the port received",
        ),
        (
            "opackets",
            "ferroce_port_tx_packets_total",
            "frames the port sent",
        ),
        (
            "ibytes",
            "ferroce_port_rx_bytes_total",
            "bytes the port received",
        ),
        (
            "obytes",
            "ferroce_port_tx_bytes_total",
            "bytes the port sent",
        ),
        (
            "imissed",
            "ferroce_port_rx_missed_total",
            "frames the port dropped for want of room in its receive queues",
        ),
        (
            "ierrors",
            "ferroce_port_rx_errors_total",
            "erroneous frames received",
        ),
        (
            "oerrors",
            "ferroce_port_tx_errors_total",
            "frames the port failed to send",
        ),
        (
            "rx_nombuf",
            "ferroce_port_rx_nombuf_total",
            "receive failures for want of mbufs",
        ),
    ];
    for (key, name, help) in counters {
        let c = f.counter(name, help, &["port", "device"])?;
        for p in &ports {
            let (i, dev) = (p["port"].to_string(), p["device"].as_str().unwrap_or(""));
            c.with_label_values(&[i.as_str(), dev])
                .inc_by(p[key].as_u64().unwrap_or(0));
        }
    }
    let up = f.int_gauge(
        "ferroce_port_link_up",
        "1 if the port's link is up",
        &["port"],
    )?;
    let mtu = f.int_gauge("ferroce_port_mtu_bytes", "the port's MTU", &["port"])?;
    for p in &ports {
        let i = p["port"].to_string();
        up.with_label_values(&[i.as_str()])
            .set(p["link_up"].as_bool().unwrap_or(false) as i64);
        mtu.with_label_values(&[i.as_str()])
            .set(p["mtu"].as_i64().unwrap_or(0));
    }
    Ok(())
}

fn lcores(f: &Families, st: &ApiState) -> Result<(), String> {
    let drops = f.counter(
        "ferroce_lcore_drops_total",
        "frames an lcore dropped, by reason",
        &["lcore", "reason"],
    )?;
    let reasons: Vec<&str> = DropReason::ALL.iter().map(|r| r.label()).collect();
    let mut families: Vec<(&str, IntCounterVec)> = Vec::new();
    for (i, lc) in st.lcore_counters.iter().enumerate() {
        let l = i.to_string();
        for (name, v) in lc.snapshot() {
            if reasons.contains(&name) {
                drops.with_label_values(&[l.as_str(), name]).inc_by(v);
                continue;
            }
            let c = match families.iter().find(|(n, _)| *n == name) {
                Some((_, c)) => c.clone(),
                None => {
                    let c = f.counter(
                        &format!("ferroce_lcore_{name}_total"),
                        &format!("the lcore poll loop's {name} (frames, loops, replies)"),
                        &["lcore"],
                    )?;
                    families.push((name, c.clone()));
                    c
                }
            };
            c.with_label_values(&[l.as_str()]).inc_by(v);
        }
    }
    Ok(())
}

fn rdma(f: &Families, hosts: &[HostCounters]) -> Result<(), String> {
    let mut families = Vec::new();
    for (name, _) in HostCounters::default().dev.qp.named() {
        families.push(f.counter(
            &format!("ferroce_{name}_total"),
            rdma_help(name),
            &["lcore"],
        )?);
    }
    for (i, h) in hosts.iter().enumerate() {
        let l = i.to_string();
        for (c, (_, v)) in families.iter().zip(h.dev.qp.named()) {
            c.with_label_values(&[l.as_str()]).inc_by(v);
        }
    }
    let handoffs = f.counter(
        "ferroce_handoffs_total",
        "frames an lcore passed to the lcore owning their QP",
        &["lcore"],
    )?;
    let handoff_drops = f.counter(
        "ferroce_handoff_drops_total",
        "frames dropped because a handoff ring was full",
        &["lcore"],
    )?;
    // QP1 and the connection manager (non-zero only on the lcore that owns QPN 1).
    let cm_help = |name: &str| match name {
        "rx_mads" => "MADs QP1's connection manager received",
        "tx_mads" => "MADs QP1's connection manager sent",
        "rx_malformed" => "MADs to QP1 that are no connection manager message, dropped",
        "rx_unknown_conn" => {
            "CM messages for no connection we know, dropped (or answered: REJ, DREP)"
        }
        "rx_unexpected" => "CM messages that do not fit their connection's state, dropped",
        "rx_duplicate" => "retransmitted CM messages received, answered again or ignored",
        "tx_rej" => "REJs sent (no listener, timeouts, refusals)",
        "retransmits" => "CM messages sent again after a timeout",
        "timeouts" => "connections given up after every CM retry",
        "evicted" => "half-open connections dropped to make room for a new REQ",
        "queue_full" => "CM MADs or events dropped because their queue was full",
        "established" => "connections the connection manager established",
        "rx_not_mad" => "frames to QP1 that are no MAD (opcode, Q_Key, length), dropped",
        "tx_no_path" => "MADs to a peer whose path QP1 does not know, dropped",
        "tx_no_buffer" => "MADs dropped for want of a buffer or a port that takes them",
        "events_lost" => "CM events the node's connection book missed (its queue was full)",
        _ => "frames QP1 sent",
    };
    let mut cm_families = Vec::new();
    for (name, _) in HostCounters::default().cm.named() {
        cm_families.push(f.counter(
            &format!("ferroce_cm_{name}_total"),
            cm_help(name),
            &["lcore"],
        )?);
    }
    let mut gsi_families = Vec::new();
    for (name, _) in HostCounters::default().gsi.named() {
        gsi_families.push(f.counter(
            &format!("ferroce_gsi_{name}_total"),
            cm_help(name),
            &["lcore"],
        )?);
    }
    for (i, h) in hosts.iter().enumerate() {
        let l = i.to_string();
        for (c, (_, v)) in cm_families.iter().zip(h.cm.named()) {
            c.with_label_values(&[l.as_str()]).inc_by(v);
        }
        for (c, (_, v)) in gsi_families.iter().zip(h.gsi.named()) {
            c.with_label_values(&[l.as_str()]).inc_by(v);
        }
    }
    let qps = f.int_gauge("ferroce_qps", "QPs by state", &["lcore", "state"])?;
    let dq = f.int_gauge(
        "ferroce_dcqcn_qps",
        "QPs whose congestion control is DCQCN",
        &["lcore"],
    )?;
    let dl = f.int_gauge(
        "ferroce_dcqcn_limited_qps",
        "DCQCN QPs sending below the line rate",
        &["lcore"],
    )?;
    let dmin = f.gauge(
        "ferroce_dcqcn_min_rate_bytes_per_second",
        "the lowest DCQCN rate among the lcore's QPs (absent without DCQCN QPs)",
        &["lcore"],
    )?;
    let dsum = f.gauge(
        "ferroce_dcqcn_rate_sum_bytes_per_second",
        "DCQCN rates of the lcore's QPs summed",
        &["lcore"],
    )?;
    let dalpha = f.gauge(
        "ferroce_dcqcn_max_alpha",
        "the highest DCQCN alpha (congestion estimate, 0 to 1) among the lcore's QPs",
        &["lcore"],
    )?;
    for (i, h) in hosts.iter().enumerate() {
        let l = i.to_string();
        let l = l.as_str();
        handoffs.with_label_values(&[l]).inc_by(h.handoffs);
        handoff_drops
            .with_label_values(&[l])
            .inc_by(h.handoff_drops);
        for (k, s) in QpState::ALL.iter().enumerate() {
            qps.with_label_values(&[l, s.name()])
                .set(h.dev.qp_states[k] as i64);
        }
        let d = &h.dev.dcqcn;
        dq.with_label_values(&[l]).set(d.qps as i64);
        dl.with_label_values(&[l]).set(d.limited as i64);
        dsum.with_label_values(&[l]).set(d.sum_rate_bps / 8.0);
        if d.qps > 0 {
            dmin.with_label_values(&[l]).set(d.min_rate_bps / 8.0);
            dalpha.with_label_values(&[l]).set(d.max_alpha);
        }
    }
    Ok(())
}

fn impairment(f: &Families, st: &ApiState) -> Result<(), String> {
    let labels = ["port", "direction"];
    let counters = [
        (
            "lost",
            "frames the impairment stage lost (random or burst loss)",
        ),
        ("corrupted", "frames the impairment stage corrupted"),
        ("duplicated", "extra copies the impairment stage sent"),
        ("reordered", "frames the impairment stage held back"),
        ("ce_marked", "frames the congestion point marked CE"),
        (
            "cp_dropped",
            "frames the congestion point dropped (buffer full)",
        ),
        (
            "dropped_unlinearizable",
            "multi-segment frames the stage could not make contiguous, dropped",
        ),
    ];
    let mut fams = Vec::new();
    for (n, help) in counters {
        fams.push(f.counter(&format!("ferroce_impair_{n}_total"), help, &labels)?);
    }
    let q = f.int_gauge(
        "ferroce_impair_cp_queue_bytes",
        "bytes in the congestion point's queue now",
        &labels,
    )?;
    let qmax = f.int_gauge(
        "ferroce_impair_cp_max_queue_bytes",
        "the most bytes the congestion point's queue has held",
        &labels,
    )?;
    for (p, handles) in st.impair.iter().enumerate() {
        let p = p.to_string();
        for (dir, pick) in [("rx", 0), ("tx", 1)] {
            let mut sums = [0u64; 7];
            let (mut qb, mut qm) = (0u64, 0u64);
            for h in handles {
                let s = if pick == 0 { &h.stats.rx } else { &h.stats.tx };
                let v = [
                    s.lost.get(),
                    s.corrupted.get(),
                    s.duplicated.get(),
                    s.reordered.get(),
                    s.ce_marked.get(),
                    s.cp_dropped.get(),
                    s.dropped_unlinearizable.get(),
                ];
                for (a, b) in sums.iter_mut().zip(v) {
                    *a += b;
                }
                qb += s.cp_queue_bytes.get();
                qm = qm.max(s.cp_max_bytes.get());
            }
            for (c, v) in fams.iter().zip(sums) {
                c.with_label_values(&[p.as_str(), dir]).inc_by(v);
            }
            q.with_label_values(&[p.as_str(), dir]).set(qb as i64);
            qmax.with_label_values(&[p.as_str(), dir]).set(qm as i64);
        }
    }
    Ok(())
}
