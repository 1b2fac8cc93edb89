//! `rocectl perf`: perftest's bandwidth and latency tests on a ferroce node, with perftest's
//! connection exchange ([`crate::perftest`]) so that the peer can be another ferroce node or an
//! unmodified `ib_write_bw`, `ib_read_bw`, `ib_atomic_bw`, `ib_write_lat`, `ib_read_lat`,
//! `ib_send_lat` or `ib_atomic_lat`.
//!
//! rocectl does what perftest's process does, through roced's API: it registers a buffer,
//! creates a QP, trades keys with the peer over TCP, connects the QP, and (as the client) has
//! the QP's lcore post the work requests itself (`/v1/qps/N/stream`: no API round trip per
//! message). The figures are perftest's: MB/sec is 2^20 bytes per second, MsgRate millions of
//! messages per second, from the first post to the last completion as the lcore clocks them.
//! Latency tests run perftest's loops on the lcore (`/v1/qps/N/latency`), which reports when
//! each iteration was posted; the differences are the round trips (halved for the WRITE and
//! SEND ping-pongs, as perftest does), summarised through an HdrHistogram.

use crate::cmstream::{self, CmStream, PERFTEST_REJ_RETRIES};
use crate::ctl::{Client, Fail};
use crate::perftest::{BwReport, Dest, Oob, OobError, Role, Test};
use crate::setup::{Buf, Resources, connect_oob, connect_qp, local_gid, post_receives, random_psn};
use clap::{Args, ValueEnum};
use serde_json::{Value, json};
use std::io::Write;
use std::net::{IpAddr, Ipv6Addr};

/// Which operation to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PerfOp {
    /// RDMA WRITE (ib_write_bw).
    Write,
    /// RDMA READ (ib_read_bw).
    Read,
    /// 8-byte atomics (ib_atomic_bw).
    Atomic,
    /// SEND into posted receives (ib_send_lat).
    Send,
}

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PerfKind {
    /// Bandwidth and message rate, `--tx-depth` outstanding.
    Bw,
    /// Latency: one message at a time (ping-pong for WRITE and SEND).
    Lat,
}

/// The atomic operation of an atomic test (perftest's `-A`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AtomicOp {
    /// FETCH_AND_ADD.
    FetchAdd,
    /// CMP_AND_SWAP.
    CmpSwap,
}

/// `rocectl perf OP KIND [--server | PEER]`.
#[derive(Debug, Args)]
pub struct PerfArgs {
    /// The operation.
    pub op: PerfOp,
    /// The measurement.
    pub kind: PerfKind,
    /// The server's host (run as the client); without it, --server.
    #[arg(required_unless_present = "server", conflicts_with = "server")]
    pub peer: Option<String>,
    /// Wait for a client (perftest's default role without a host).
    #[arg(long)]
    pub server: bool,
    /// Message size in bytes (K, M suffixes); atomics are always 8. Default: 65536 for
    /// bandwidth, 2 for latency (perftest's).
    #[arg(long, short = 's', value_parser = crate::ctl::parse_size)]
    pub size: Option<u64>,
    /// Messages to send. Default: 5000 for bandwidth, 1000 for latency.
    #[arg(long, short = 'n')]
    pub iters: Option<u64>,
    /// Run for this many seconds instead of -n messages (perftest's -D). A SEND bandwidth
    /// server counts what arrives within that long of the first message; a latency test
    /// counts the iterations between a margin of a quarter of the seconds at each end and
    /// reports their average (perftest's `t_avg`).
    #[arg(long, short = 'D', value_parser = clap::value_parser!(u64).range(1..=600))]
    pub duration: Option<u64>,
    /// Send messages of up to this many bytes inline (perftest's -I, IBV_SEND_INLINE: the
    /// bytes are copied at post time): WRITE and SEND, 0 to 512.
    #[arg(long, short = 'I', default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=512))]
    pub inline_size: u32,
    /// Work requests outstanding at once (per QP).
    #[arg(long, short = 't', default_value_t = 128)]
    pub tx_depth: u32,
    /// Bandwidth tests: signal one work request in this many, and the last (perftest's -Q,
    /// 100 as there; held to the tx depth): the rest complete without a completion entry.
    #[arg(long = "cq-mod", short = 'Q', default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=16384))]
    pub cq_mod: u32,
    /// QPs (bandwidth tests): each runs the test, `-n` messages,
    /// all on one lcore of each node.
    #[arg(long, short = 'q', default_value_t = 1)]
    pub qps: usize,
    /// TCP port of the connection exchange.
    #[arg(long, short = 'p', default_value_t = crate::perftest::PORT)]
    pub oob_port: u16,
    /// Path MTU to offer (the smaller of the two sides' is used).
    #[arg(long, short = 'm', default_value_t = 1024)]
    pub mtu: u32,
    /// The QP's ACK timeout code (perftest's -u): 4.096 us * 2^N before a resend, 0 to 31.
    #[arg(long = "qp-timeout", short = 'u', default_value_t = 14,
          value_parser = clap::value_parser!(u8).range(0..=31))]
    pub qp_timeout: u8,
    /// The node's port to use.
    #[arg(long, default_value_t = 0)]
    pub port: usize,
    /// GID index in the port's table (`rocectl port show --json` lists it; 1 is the first
    /// IPv4 address, as on rxe).
    #[arg(long, short = 'x', default_value_t = 1)]
    pub gid_index: usize,
    /// Atomic tests: which operation.
    #[arg(long, short = 'A', default_value = "fetch-add")]
    pub atomic: AtomicOp,
    /// Seconds to wait for the peer's connection exchange.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Connect through the RDMA CM, as perftest's -R does (bandwidth tests): no TCP, the
    /// exchange runs over a CM connection on --oob-port and each test QP connects through
    /// the CM on the same port. PEER must then be an IP address.
    #[arg(long = "rdma-cm", short = 'R')]
    pub rdma_cm: bool,
}

impl From<OobError> for Fail {
    fn from(e: OobError) -> Fail {
        Fail(1, e.to_string())
    }
}

impl PerfArgs {
    fn test(&self) -> Test {
        match self.op {
            PerfOp::Write => Test::Write,
            PerfOp::Read => Test::Read,
            PerfOp::Atomic => Test::Atomic,
            PerfOp::Send => Test::Send,
        }
    }

    fn size(&self) -> u64 {
        match (self.op, self.kind) {
            (PerfOp::Atomic, _) => 8,
            (_, PerfKind::Bw) => self.size.unwrap_or(65536),
            (_, PerfKind::Lat) => self.size.unwrap_or(2),
        }
    }

    fn iters(&self) -> u64 {
        self.iters.unwrap_or(match self.kind {
            PerfKind::Bw => 5000,
            PerfKind::Lat => 1000,
        })
    }

    fn title(&self) -> String {
        let op = match self.op {
            PerfOp::Write => "RDMA_Write",
            PerfOp::Read => "RDMA_Read",
            PerfOp::Atomic => "Atomic",
            PerfOp::Send => "Send",
        };
        let kind = match self.kind {
            PerfKind::Bw => "BW",
            PerfKind::Lat => "Latency",
        };
        format!("{op} {kind} Test")
    }
}

/// Runs one perf test; prints perftest's header and results (or JSON).
pub(crate) fn perf(c: &Client, a: &PerfArgs, json: bool, out: &mut dyn Write) -> Result<u8, Fail> {
    if crate::perftest::mtu_enum(a.mtu).is_none() {
        return Err(Fail(2, "--mtu is 256, 512, 1024, 2048 or 4096".into()));
    }
    if a.iters() == 0 || a.tx_depth == 0 || a.size() == 0 {
        return Err(Fail(
            2,
            "--size, --iters and --tx-depth must be above 0".into(),
        ));
    }
    if a.duration.is_some() && a.iters.is_some() {
        return Err(Fail(2, "-D and -n: give one of them".into()));
    }
    if a.qps != 1 && (a.kind == PerfKind::Lat || a.qps == 0) {
        return Err(Fail(2, "-q runs bandwidth tests on 1 or more QPs".into()));
    }
    if a.rdma_cm && a.kind == PerfKind::Lat {
        return Err(Fail(2, "-R (rdma_cm) runs bandwidth tests only".into()));
    }
    let gid = local_gid(c, a.port, a.gid_index)?;
    if a.kind == PerfKind::Bw {
        return bandwidth(c, a, gid, json, out);
    }
    let size = a.size();
    let rx_depth = match a.duration {
        Some(_) => RX_DEPTH,
        None => a.iters().min(RX_DEPTH),
    };
    let (_made, buf, qpn) = Resources::create(c, size, a.tx_depth, rx_depth, a.inline_size)?;
    let half = buf.half;
    let test = a.test();
    let mine = Dest {
        lid: 0,
        out_reads: test.out_reads(),
        qpn,
        psn: random_psn(),
        rkey: if test == Test::Send { 0 } else { buf.lkey },
        vaddr: buf.addr + half,
        gid,
        srqn: 0,
    };
    let (stream, role) = connect_oob(a.peer.as_deref(), a.oob_port, a.timeout)?;
    let mut oob = Oob::new(stream, role);
    let connect = |mtu, remote: &Dest| {
        let how = (mine.psn, mtu, remote.out_reads, a.qp_timeout);
        connect_qp(c, qpn, remote, how)
    };
    let o = crate::perftest::lat_exchange(
        &mut oob,
        test,
        a.mtu,
        &mine,
        connect,
        || send_receives(c, a, qpn, &buf, rx_depth),
        |remote| run_latency(c, a, qpn, &buf, remote, role, rx_depth),
    )?;
    print_latency(a, role, &mine, &o, json, out)
}

/// A bandwidth test on `a.qps` QPs (perftest's `-q`): one buffer, the QPs created and
/// connected in bulk, their lcore posting for all of them.
fn bandwidth(
    c: &Client,
    a: &PerfArgs,
    gid: Ipv6Addr,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, Fail> {
    let size = a.size();
    let rx_depth = a.iters().min(SEND_BW_RX_DEPTH);
    let (mut made, buf) = Resources::buffer(c, size)?;
    // All on one lcore (the first request's), as one request would put them; each chunk is
    // in `made` as soon as it exists, so a failure destroys what was created.
    let mut lcore: Option<u64> = None;
    while made.qps.len() < a.qps {
        let n = (a.qps - made.qps.len()).min(BULK);
        let q = c.call(
            "POST",
            "/v1/qps/bulk",
            // Receive queues only where SENDs arrive (their CQs are allocated up front).
            Some(
                json!({"count": n, "max_send_wr": a.tx_depth, "max_inline_data": a.inline_size,
                        "max_recv_wr": if a.op == PerfOp::Send { rx_depth } else { 1 },
                        "lcore": lcore}),
            ),
        )?;
        lcore = q["lcore"].as_u64();
        let part: Vec<u32> = q["qpns"]
            .as_array()
            .map(|v| {
                v.iter()
                    .filter_map(Value::as_u64)
                    .map(|x| x as u32)
                    .collect()
            })
            .unwrap_or_default();
        made.qps.extend_from_slice(&part);
        if part.len() != n {
            return Err(Fail(1, format!("roced created {} of {n} QPs", part.len())));
        }
    }
    let qpns = made.qps.clone();
    let test = a.test();
    let mine: Vec<Dest> = qpns
        .iter()
        .map(|&qpn| Dest {
            lid: 0,
            out_reads: test.out_reads(),
            qpn,
            psn: random_psn() ^ (qpn & 0xffff),
            rkey: if test == Test::Send { 0 } else { buf.lkey },
            vaddr: buf.addr + buf.half,
            gid,
            srqn: 0,
        })
        .collect();
    if a.rdma_cm {
        return bandwidth_cm(c, a, &qpns, &buf, &mine, rx_depth, json, out);
    }
    let (stream, role) = connect_oob(a.peer.as_deref(), a.oob_port, a.timeout)?;
    let mut oob = Oob::new(stream, role);
    let connect = |mtu, remote: &[Dest]| {
        let first = remote
            .first()
            .ok_or_else(|| Fail(1, "the peer sent no keys".into()))?;
        let qps: Vec<Value> = mine
            .iter()
            .zip(remote)
            .map(|(m, r)| {
                json!({"qpn": m.qpn, "remote_qpn": r.qpn, "remote_psn": r.psn,
                                 "local_psn": m.psn})
            })
            .collect();
        let rgid = IpAddr::V6(first.gid).to_canonical();
        let attr = json!({"remote_gid": rgid.to_string(), "mtu": mtu,
                "max_rd_atomic": first.out_reads.clamp(1, 16), "min_rnr_timer": 12,
                "timeout": a.qp_timeout, "retry_cnt": 7, "rnr_retry": 7,
                "access": ["remote-write", "remote-read", "remote-atomic"]});
        qps.chunks(BULK).try_for_each(|part| {
            c.call(
                "POST",
                "/v1/qps/bulk/connect",
                Some(json!({"qps": part, "attr": attr})),
            )
            .map(drop)
        })
    };
    let o = exchange(&mut oob, c, a, (&qpns, &buf, &mine, rx_depth), connect)?;
    print_bandwidth(a, role, &mine[0], &o, json, out)
}

/// perftest's exchange around a bandwidth test on `qpns`, whatever carries it; `connect`
/// connects the QPs (see [`crate::perftest::bw_exchange`]).
fn exchange<S: crate::perftest::OobStream>(
    oob: &mut Oob<S>,
    c: &Client,
    a: &PerfArgs,
    (qpns, buf, mine, rx_depth): (&[u32], &Buf, &[Dest], u64),
    connect: impl FnOnce(u32, &[Dest]) -> Result<(), Fail>,
) -> Result<crate::perftest::BwOutcome, Fail> {
    let role = oob.role();
    crate::perftest::bw_exchange(
        oob,
        a.test(),
        a.mtu,
        mine,
        connect,
        || {
            qpns.iter()
                .try_for_each(|&q| send_receives(c, a, q, buf, rx_depth))
        },
        |remote| match role {
            Role::Client => run_bandwidth(c, a, qpns, buf, remote),
            Role::Server => receive_bandwidth(c, a, qpns, buf, rx_depth),
        },
    )
}

/// A bandwidth test connected as perftest's `-R` does: the exchange over a CM connection
/// ([`CmStream`]), then one CM connection per test QP on the same port. At the end the
/// client disconnects the test QPs and the server the exchange, each after the other side
/// is done with them (perftest's order in rxe's capture).
#[allow(clippy::too_many_arguments)]
fn bandwidth_cm(
    c: &Client,
    a: &PerfArgs,
    qpns: &[u32],
    buf: &Buf,
    mine: &[Dest],
    rx_depth: u64,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, Fail> {
    let peer = match a.peer.as_deref() {
        None => None,
        Some(p) => Some(
            p.parse::<IpAddr>()
                .map_err(|_| Fail(2, format!("-R connects to an IP address; {p:?} is not one")))?,
        ),
    };
    let wait = std::time::Duration::from_secs(a.timeout);
    let (stream, role) = CmStream::open(c, peer, a.oob_port, qpns.len(), wait)?;
    let port = a.oob_port;
    let exchange_conn = stream.conn();
    let mut oob = Oob::over_cm(stream, role, a.gid_index as u32);
    let mut conns: Vec<u64> = Vec::new();
    let connect = |_mtu, _: &[Dest]| {
        for &qpn in qpns {
            let conn = match peer {
                Some(p) => cmstream::connect(c, qpn, (p, port), PERFTEST_REJ_RETRIES, wait)?,
                None => cmstream::accept(c, port, qpn, wait)?,
            };
            conns.extend(conn["id"].as_u64());
        }
        Ok(())
    };
    let r = exchange(&mut oob, c, a, (qpns, buf, mine, rx_depth), connect);
    let linger = std::time::Duration::from_secs(5);
    match role {
        Role::Client => {
            for id in &conns {
                let _ = c.call("DELETE", &format!("/v1/cm/connections/{id}"), None);
            }
            if r.is_ok() {
                cmstream::wait_closed(c, exchange_conn.as_slice(), linger);
            }
        }
        Role::Server => {
            if r.is_ok() {
                cmstream::wait_closed(c, &conns, linger);
            }
            for id in &conns {
                let _ = c.call("DELETE", &format!("/v1/cm/connections/{id}"), None);
            }
        }
    }
    drop(oob);
    print_bandwidth(a, role, &mine[0], &r?, json, out)
}

/// QPs one bulk request creates or connects at most: a million-QP run takes several, each
/// answer well inside the HTTP client's body limit and its minute.
pub(crate) const BULK: usize = 200_000;

/// Receives kept posted by a SEND latency test.
const RX_DEPTH: u64 = 128;

/// Receives kept posted by a SEND bandwidth server (perftest's default rx_depth).
const SEND_BW_RX_DEPTH: u64 = 512;

/// The request a test posts, towards the peer's buffer.
fn request(a: &PerfArgs, b: &Buf, remote: &Dest) -> Value {
    let mut r = json!({"wr_id": 1, "sge": b.sge(b.addr), "remote_addr": remote.vaddr,
                       "rkey": remote.rkey});
    match (a.op, a.atomic) {
        (PerfOp::Write, _) => r["opcode"] = json!("write"),
        (PerfOp::Read, _) => r["opcode"] = json!("read"),
        (PerfOp::Send, _) => r = json!({"wr_id": 1, "opcode": "send", "sge": b.sge(b.addr)}),
        (PerfOp::Atomic, AtomicOp::FetchAdd) => {
            r["opcode"] = json!("fetch-add");
            r["add"] = json!(1);
        }
        (PerfOp::Atomic, AtomicOp::CmpSwap) => {
            r["opcode"] = json!("cmp-swap");
            r["compare"] = json!(0);
            r["swap"] = json!(0);
        }
    }
    if matches!(a.op, PerfOp::Write | PerfOp::Send) && a.size() <= a.inline_size as u64 {
        r["inline"] = json!(true);
    }
    r
}

/// The bandwidth client: the QPs' lcore posts the requests, `tx_depth` outstanding on each,
/// each QP towards its peer's buffer.
fn run_bandwidth(
    c: &Client,
    a: &PerfArgs,
    qpns: &[u32],
    buf: &Buf,
    remote: &[Dest],
) -> Result<BwReport, Fail> {
    let first = remote
        .first()
        .ok_or_else(|| Fail(1, "the peer sent no keys".into()))?;
    let targets: Vec<Value> = qpns
        .iter()
        .zip(remote)
        .map(|(q, r)| json!({"qpn": q, "remote_addr": r.vaddr, "rkey": r.rkey}))
        .collect();
    let mut b = json!({"qps": targets, "wr": request(a, buf, first),
                       "depth": a.tx_depth.min(16384), "cq_mod": a.cq_mod,
                       "timeout_ms": 600_000});
    match a.duration {
        Some(secs) => b["duration_ms"] = json!(secs * 1000),
        None => b["count"] = json!(a.iters()),
    }
    let r = c.call("POST", "/v1/streams", Some(b))?;
    report(a, &r, qpns.len() as u64)
}

/// The SEND bandwidth server: the QPs' lcore takes the messages and reposts receives; its
/// figures run from the first arrival (on any QP) to the last, or with -D over the window
/// of that length from the first arrival (perftest's server starts its clock there too).
fn receive_bandwidth(
    c: &Client,
    a: &PerfArgs,
    qpns: &[u32],
    b: &Buf,
    posted: u64,
) -> Result<BwReport, Fail> {
    let mut body = json!({"wr_id": 2_000_000, "sge": b.sge(b.addr + b.half),
                          "posted": posted, "timeout_ms": 600_000});
    match a.duration {
        Some(secs) => body["duration_ms"] = json!(secs * 1000),
        None => body["count"] = json!(a.iters()),
    }
    let r = match qpns {
        [qpn] => c.call("POST", &format!("/v1/qps/{qpn}/recv-stream"), Some(body))?,
        _ => {
            body["qpns"] = json!(qpns);
            c.call("POST", "/v1/recv-streams", Some(body))?
        }
    };
    report(a, &r, qpns.len() as u64)
}

/// perftest's bandwidth figures from a stream's result over `qps` QPs (iterations, bandwidth
/// and rate are the sum over the QPs, as perftest prints them: `-n 200 -q 4` shows 800).
fn report(a: &PerfArgs, r: &Value, qps: u64) -> Result<BwReport, Fail> {
    let size = a.size();
    let done = r["completed"].as_u64().unwrap_or(0);
    let errors = r["errors"].as_u64().unwrap_or(0);
    let secs = r["elapsed_ns"].as_u64().unwrap_or(0) as f64 / 1e9;
    let complete = match a.duration {
        Some(_) => done > 0,
        None => done == a.iters() * qps,
    };
    if errors > 0 || !complete || secs <= 0.0 {
        let want = match a.duration {
            Some(d) => format!("{d} s of"),
            None => (a.iters() * qps).to_string(),
        };
        return Err(Fail(
            1,
            format!("the test failed: {done} of {want} messages completed, {errors} in error"),
        ));
    }
    let bw = size as f64 * done as f64 / secs / 1048576.0;
    let best = r["best_ns_per_wr"]
        .as_f64()
        .unwrap_or(secs * 1e9 / done as f64);
    Ok(BwReport {
        size,
        iters: done,
        // perftest keeps no peak in duration mode and prints 0.00.
        bw_peak: if a.duration.is_some() {
            0.0
        } else {
            size as f64 / (best / 1e9) / 1048576.0
        },
        bw_avg: bw,
        msg_rate: done as f64 / secs / 1e6,
    })
}

/// A SEND test's receives, posted before the last barrier ahead of traffic (other tests
/// need none).
fn send_receives(c: &Client, a: &PerfArgs, qpn: u32, b: &Buf, n: u64) -> Result<(), Fail> {
    if a.op == PerfOp::Send {
        post_receives(c, qpn, b, n)
    } else {
        Ok(())
    }
}

/// What this side's latency test measured.
#[derive(Debug, Clone, PartialEq)]
enum LatRun {
    /// When each of `-n` iterations was posted (ns from the first).
    Posted(Vec<u64>),
    /// A timed test (`-D`): the iterations that completed in the sample window, and the
    /// window's length in ns.
    Timed { iters: u64, window_ns: u64 },
}

/// This side's latency test on the QP's lcore.
fn run_latency(
    c: &Client,
    a: &PerfArgs,
    qpn: u32,
    b: &Buf,
    remote: &Dest,
    role: Role,
    rx_depth: u64,
) -> Result<LatRun, Fail> {
    let mut body = json!({"wr": request(a, b, remote),
                          "server": role == Role::Server, "timeout_ms": 600_000});
    match a.duration {
        Some(secs) => body["duration_ms"] = json!(secs * 1000),
        None => body["iters"] = json!(a.iters()),
    }
    match a.op {
        PerfOp::Read | PerfOp::Atomic => body["test"] = json!("request"),
        PerfOp::Write => {
            body["test"] = json!("write");
            body["poll"] = json!({"lkey": b.lkey, "addr": b.addr + b.half + b.size - 1});
            body["mark"] = json!({"lkey": b.lkey, "addr": b.addr + b.size - 1});
        }
        PerfOp::Send => {
            body["test"] = json!("send");
            body["recv"] = b.sge(b.addr + b.half);
            body["rx_depth"] = json!(rx_depth);
        }
    }
    let r = c.call("POST", &format!("/v1/qps/{qpn}/latency"), Some(body))?;
    let posted: Vec<u64> = r["posted_ns"]
        .as_array()
        .map(|v| v.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let errors = r["errors"].as_u64().unwrap_or(0);
    let why = || {
        r["failure"]
            .as_str()
            .unwrap_or("no reason given")
            .to_string()
    };
    if a.duration.is_some() {
        let (iters, window_ns) = (
            r["sample"]["iters"].as_u64().unwrap_or(0),
            r["sample"]["window_ns"].as_u64().unwrap_or(0),
        );
        if errors > 0 {
            return Err(Fail(
                1,
                format!("the test failed: {errors} in error ({})", why()),
            ));
        }
        if iters == 0 || window_ns == 0 {
            return Err(Fail(
                1,
                "the test failed: no iteration completed in the sample window (is the peer running the same test?)".into(),
            ));
        }
        return Ok(LatRun::Timed { iters, window_ns });
    }
    if errors > 0 || posted.len() as u64 != a.iters() {
        return Err(Fail(
            1,
            format!(
                "the test failed: {} of {} iterations posted, {errors} in error ({})",
                posted.len(),
                a.iters(),
                why()
            ),
        ));
    }
    Ok(LatRun::Posted(posted))
}

/// A timed test's average latency in us (perftest's `t_avg` with -D): the window over the
/// iterations, halved for ping-pongs.
fn timed_avg_us(iters: u64, window_ns: u64, halve: bool) -> f64 {
    let rtt = window_ns as f64 / iters.max(1) as f64 / 1000.0;
    if halve { rtt / 2.0 } else { rtt }
}

/// Latency figures in microseconds, as perftest prints them.
#[derive(Debug, Clone, Copy, PartialEq)]
struct LatStats {
    min: f64,
    max: f64,
    typical: f64,
    avg: f64,
    stdev: f64,
    p99: f64,
    p999: f64,
}

/// The latencies a run measured: the differences between consecutive posts, halved for
/// ping-pongs (perftest's), in ns.
fn samples(posted_ns: &[u64], halve: bool) -> Vec<u64> {
    posted_ns
        .windows(2)
        .map(|w| {
            let d = w[1].saturating_sub(w[0]);
            if halve { d / 2 } else { d }
        })
        .collect()
}

/// perftest's summary of a latency run ([`samples`]) through an HdrHistogram (ns, 3
/// significant digits).
fn lat_stats(posted_ns: &[u64], halve: bool) -> Option<LatStats> {
    let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).ok()?;
    for d in samples(posted_ns, halve) {
        h.saturating_record(d.max(1));
    }
    if h.is_empty() {
        return None;
    }
    let us = |ns: u64| ns as f64 / 1000.0;
    Some(LatStats {
        min: us(h.min()),
        max: us(h.max()),
        typical: us(h.value_at_quantile(0.5)),
        avg: h.mean() / 1000.0,
        stdev: h.stdev() / 1000.0,
        p99: us(h.value_at_quantile(0.99)),
        p999: us(h.value_at_quantile(0.999)),
    })
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::Client => "client",
        Role::Server => "server",
    }
}

fn io(e: std::io::Error) -> Fail {
    Fail(2, e.to_string())
}

fn print_bandwidth(
    a: &PerfArgs,
    role: Role,
    mine: &Dest,
    o: &crate::perftest::BwOutcome,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, Fail> {
    let r = o.report.unwrap_or(BwReport {
        size: a.size(),
        iters: 0,
        bw_peak: 0.0,
        bw_avg: 0.0,
        msg_rate: 0.0,
    });
    if json {
        let v = json!({"test": a.title(), "role": role_name(role),
            "mtu": o.mtu, "qps": o.remote.len(), "local": dest_json(mine),
            "remote": o.remote.first().map(dest_json),
            "bytes": r.size, "iterations": r.iters, "bw_peak_mb_s": r.bw_peak,
            "bw_avg_mb_s": r.bw_avg, "msg_rate_mpps": r.msg_rate,
            "gbit_s": r.bw_avg * 1048576.0 * 8.0 / 1e9});
        writeln!(out, "{v}").map_err(io)?;
        return Ok(0);
    }
    let remote = o.remote.first().unwrap_or(mine);
    header(a, role, o.mtu, mine, remote, out).map_err(io)?;
    writeln!(
        out,
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
    )
    .map_err(io)?;
    writeln!(
        out,
        " {:<10} {:<10}       {:>10.2}         {:>10.2}   \t\t   {:.6}",
        r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate
    )
    .map_err(io)?;
    writeln!(out, "{}", "-".repeat(87)).map_err(io)?;
    Ok(0)
}

fn print_latency(
    a: &PerfArgs,
    role: Role,
    mine: &Dest,
    o: &crate::perftest::LatOutcome<LatRun>,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, Fail> {
    let halve = matches!(a.op, PerfOp::Write | PerfOp::Send);
    let posted = match &o.result {
        Some(LatRun::Posted(p)) => Some(p.as_slice()),
        _ => None,
    };
    if let Some(LatRun::Timed { iters, window_ns }) = o.result {
        let avg = timed_avg_us(iters, window_ns, halve);
        // perftest's "tps average": iterations per second of the window.
        let tps = iters as f64 * 1e9 / window_ns as f64;
        if json {
            let v = json!({"test": a.title(), "role": role_name(role), "mtu": o.mtu,
                "local": dest_json(mine), "remote": dest_json(&o.remote), "bytes": a.size(),
                "duration_s": a.duration, "iterations": iters, "window_ns": window_ns,
                "half_round_trip": halve, "latency_us": {"avg": avg}, "tps": tps});
            writeln!(out, "{v}").map_err(io)?;
            return Ok(0);
        }
        header(a, role, o.mtu, mine, &o.remote, out).map_err(io)?;
        writeln!(
            out,
            " #bytes        #iterations       t_avg[usec]    tps average"
        )
        .map_err(io)?;
        writeln!(
            out,
            " {:<7}       {:<10}    {:<7.2}        {:<7.2}",
            a.size(),
            iters,
            avg,
            tps
        )
        .map_err(io)?;
        writeln!(out, "{}", "-".repeat(87)).map_err(io)?;
        return Ok(0);
    }
    let st = posted.and_then(|p| lat_stats(p, halve));
    if json {
        let v = json!({"test": a.title(), "role": role_name(role), "mtu": o.mtu,
            "local": dest_json(mine), "remote": dest_json(&o.remote), "bytes": a.size(),
            "iterations": a.iters(), "half_round_trip": halve,
            "latency_us": st.map(|s| json!({"min": s.min, "max": s.max, "typical": s.typical,
                "avg": s.avg, "stdev": s.stdev, "p99": s.p99, "p99_9": s.p999})),
            "samples_ns": posted.map(|p| samples(p, halve))});
        writeln!(out, "{v}").map_err(io)?;
        return Ok(0);
    }
    header(a, role, o.mtu, mine, &o.remote, out).map_err(io)?;
    match st {
        Some(s) => {
            writeln!(
                out,
                " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
            )
            .map_err(io)?;
            writeln!(
                out,
                " {:<7} {:<10}  {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
                a.size(),
                a.iters(),
                s.min,
                s.max,
                s.typical,
                s.avg,
                s.stdev,
                s.p99,
                s.p999
            )
            .map_err(io)?;
        }
        None => writeln!(out, " (the client measures this test)").map_err(io)?,
    }
    writeln!(out, "{}", "-".repeat(87)).map_err(io)?;
    Ok(0)
}

/// The lines perftest prints before its results.
fn header(
    a: &PerfArgs,
    role: Role,
    mtu: u32,
    mine: &Dest,
    remote: &Dest,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let line = "-".repeat(87);
    writeln!(out, "{line}")?;
    writeln!(out, "{:>36}", a.title())?;
    let qps = if a.kind == PerfKind::Bw { a.qps } else { 1 };
    writeln!(
        out,
        " Number of qps   : {qps}\t\tTransport type : IB (RoCEv2, ferroce)"
    )?;
    writeln!(out, " Connection type : RC\t\tUsing SRQ      : OFF")?;
    if role == Role::Client && a.kind == PerfKind::Bw {
        writeln!(out, " TX depth        : {}", a.tx_depth)?;
    }
    writeln!(out, " Mtu             : {mtu}[B]")?;
    writeln!(out, " Link type       : Ethernet")?;
    writeln!(out, " GID index       : {}", a.gid_index)?;
    writeln!(out, " Max inline data : {}[B]", a.inline_size)?;
    if a.op == PerfOp::Atomic {
        writeln!(out, " Atomic op       : {:?}", a.atomic)?;
    }
    writeln!(out, " Data ex. method : Ethernet")?;
    writeln!(out, "{line}")?;
    for (what, d) in [("local", mine), ("remote", remote)] {
        writeln!(
            out,
            " {what} address: LID {:04x} QPN {:#06x} PSN {:#x} RKey {:#08x} VAddr {:#016x}",
            d.lid, d.qpn, d.psn, d.rkey, d.vaddr
        )?;
        writeln!(out, " GID: {}", gid_text(&d.gid))?;
    }
    writeln!(out, "{line}")
}

/// A GID as perftest prints it: the 16 bytes in decimal, at least two digits each.
fn gid_text(g: &Ipv6Addr) -> String {
    g.octets()
        .iter()
        .map(|b| format!("{b:02}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn dest_json(d: &Dest) -> Value {
    json!({"qpn": d.qpn, "psn": d.psn, "rkey": d.rkey, "vaddr": d.vaddr,
           "gid": d.gid.to_string(), "out_reads": d.out_reads})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_figures_follow_perftest() {
        // Posts 10 us apart: a ping-pong's half round trip is 5 us, a READ's round trip 10.
        let posted: Vec<u64> = (0..101).map(|i| i * 10_000).collect();
        let s = lat_stats(&posted, true).unwrap();
        assert!(
            (s.typical - 5.0).abs() < 0.01 && (s.min - 5.0).abs() < 0.01,
            "{s:?}"
        );
        assert!(s.stdev < 0.01);
        let s = lat_stats(&posted, false).unwrap();
        assert!((s.avg - 10.0).abs() < 0.01, "{s:?}");
        // One slow iteration shows in the maximum and the tail, not in the median.
        let mut p = posted.clone();
        for x in p.iter_mut().skip(50) {
            *x += 1_000_000;
        }
        let s = lat_stats(&p, false).unwrap();
        assert!(
            (s.max - 1010.0).abs() < 1.0 && (s.typical - 10.0).abs() < 0.01,
            "{s:?}"
        );
        assert!(s.p999 > 1000.0 && s.p99 < 11.0, "{s:?}");
        assert_eq!(lat_stats(&[5], true), None, "one post has no round trip");
    }

    #[test]
    fn timed_latency_is_the_window_over_the_iterations() {
        // 1 s window, 100,000 round trips: 10 us each, 5 us half round trip.
        assert!((timed_avg_us(100_000, 1_000_000_000, false) - 10.0).abs() < 1e-9);
        assert!((timed_avg_us(100_000, 1_000_000_000, true) - 5.0).abs() < 1e-9);
    }
}
