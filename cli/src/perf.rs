//! `rocectl perf`: perftest's bandwidth tests on a ferroce node, with perftest's connection
//! exchange ([`crate::perftest`]) so that the peer can be another ferroce node or an unmodified
//! `ib_write_bw` / `ib_read_bw` / `ib_atomic_bw`.
//!
//! rocectl does what perftest's process does, through roced's API: it registers a buffer,
//! creates a QP, trades keys with the peer over TCP, connects the QP, and (as the client) has
//! the QP's lcore post the work requests itself (`/v1/qps/N/stream`: no API round trip per
//! message). The figures are perftest's: MB/sec is 2^20 bytes per second, MsgRate millions of
//! messages per second, from the first post to the last completion as the lcore clocks them.

use crate::ctl::{Client, Fail};
use crate::perftest::{BwReport, Dest, Oob, OobError, Role, Test};
use clap::{Args, ValueEnum};
use serde_json::{Value, json};
use std::io::Write;
use std::net::{IpAddr, Ipv6Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Which operation to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PerfOp {
    /// RDMA WRITE (ib_write_bw).
    Write,
    /// RDMA READ (ib_read_bw).
    Read,
    /// 8-byte atomics (ib_atomic_bw).
    Atomic,
}

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PerfKind {
    /// Bandwidth and message rate, `--tx-depth` outstanding.
    Bw,
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
    /// Message size in bytes (K, M suffixes); atomics are always 8.
    #[arg(long, short = 's', value_parser = crate::ctl::parse_size, default_value = "65536")]
    pub size: u64,
    /// Messages to send.
    #[arg(long, short = 'n', default_value_t = 5000)]
    pub iters: u64,
    /// Work requests outstanding at once.
    #[arg(long, short = 't', default_value_t = 128)]
    pub tx_depth: u32,
    /// TCP port of the connection exchange.
    #[arg(long, short = 'p', default_value_t = crate::perftest::PORT)]
    pub oob_port: u16,
    /// Path MTU to offer (the smaller of the two sides' is used).
    #[arg(long, short = 'm', default_value_t = 1024)]
    pub mtu: u32,
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
        }
    }

    fn size(&self) -> u64 {
        if self.op == PerfOp::Atomic {
            8
        } else {
            self.size
        }
    }

    fn title(&self) -> &'static str {
        match self.op {
            PerfOp::Write => "RDMA_Write BW Test",
            PerfOp::Read => "RDMA_Read BW Test",
            PerfOp::Atomic => "Atomic BW Test",
        }
    }
}

/// Objects a test created on the node, removed when it ends however it ends.
struct Created<'a> {
    c: &'a Client,
    mr: Option<u32>,
    qp: Option<u32>,
}

impl Drop for Created<'_> {
    fn drop(&mut self) {
        if let Some(q) = self.qp {
            let _ = self.c.call("DELETE", &format!("/v1/qps/{q}"), None);
        }
        if let Some(k) = self.mr {
            let _ = self.c.call("DELETE", &format!("/v1/mrs/{k}"), None);
        }
    }
}

/// A 24-bit starting PSN that differs from run to run (perftest uses lrand48).
fn random_psn() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let x = t ^ (u64::from(std::process::id()) << 32);
    (x.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as u32 & 0xff_ffff
}

fn connect_oob(a: &PerfArgs) -> Result<(TcpStream, Role), Fail> {
    let wait = Duration::from_secs(a.timeout);
    let s = match &a.peer {
        None => {
            let l = TcpListener::bind(("0.0.0.0", a.oob_port))
                .map_err(|e| Fail(2, format!("cannot listen on TCP port {}: {e}", a.oob_port)))?;
            l.set_nonblocking(true)
                .map_err(|e| Fail(2, e.to_string()))?;
            let t0 = Instant::now();
            loop {
                match l.accept() {
                    Ok((s, _)) => break (s, Role::Server),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if t0.elapsed() > wait {
                            return Err(Fail(1, format!("no client connected in {wait:?}")));
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => return Err(Fail(2, e.to_string())),
                }
            }
        }
        Some(host) => {
            // The server may not listen yet: retry until it does (or the timeout passes).
            let t0 = Instant::now();
            loop {
                match TcpStream::connect((host.as_str(), a.oob_port)) {
                    Ok(s) => break (s, Role::Client),
                    Err(e) if t0.elapsed() > wait => {
                        return Err(Fail(
                            1,
                            format!("cannot reach the server {host}:{}: {e}", a.oob_port),
                        ));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
    };
    let (s, role) = s;
    s.set_nonblocking(false)
        .map_err(|e| Fail(2, e.to_string()))?;
    s.set_nodelay(true).map_err(|e| Fail(2, e.to_string()))?;
    // The client's run happens inside the exchange: allow for it.
    s.set_read_timeout(Some(wait + Duration::from_secs(600)))
        .map_err(|e| Fail(2, e.to_string()))?;
    Ok((s, role))
}

/// Runs one perf test; prints perftest's header and result line (or JSON).
pub(crate) fn perf(c: &Client, a: &PerfArgs, json: bool, out: &mut dyn Write) -> Result<u8, Fail> {
    let io = |e: std::io::Error| Fail(2, e.to_string());
    if crate::perftest::mtu_enum(a.mtu).is_none() {
        return Err(Fail(2, "--mtu is 256, 512, 1024, 2048 or 4096".into()));
    }
    if a.iters == 0 || a.tx_depth == 0 || a.size() == 0 {
        return Err(Fail(
            2,
            "--size, --iters and --tx-depth must be above 0".into(),
        ));
    }
    let port = c.call("GET", &format!("/v1/ports/{}", a.port), None)?;
    let gids = port["gids"].as_array().cloned().unwrap_or_default();
    let gid: Ipv6Addr = gids
        .get(a.gid_index)
        .and_then(Value::as_str)
        .and_then(|g| g.parse().ok())
        .ok_or_else(|| {
            Fail(
                1,
                format!(
                    "port {} has no GID index {} (it has {}: {:?})",
                    a.port,
                    a.gid_index,
                    gids.len(),
                    gids
                ),
            )
        })?;
    let size = a.size();
    // perftest's buffer: twice the larger of the message and a page.
    let len = size.max(4096) * 2;
    let mut made = Created {
        c,
        mr: None,
        qp: None,
    };
    let mr = c.call(
        "POST",
        "/v1/mrs",
        Some(json!({"length": len,
            "access": ["local-write", "remote-write", "remote-read", "remote-atomic"]})),
    )?;
    let (lkey, addr) = (
        mr["lkey"].as_u64().unwrap_or(0) as u32,
        mr["addr"].as_u64().unwrap_or(0),
    );
    made.mr = Some(lkey);
    let qp = c.call(
        "POST",
        "/v1/qps",
        Some(json!({"max_send_wr": a.tx_depth, "max_recv_wr": 16})),
    )?;
    let qpn = qp["qpn"].as_u64().unwrap_or(0) as u32;
    made.qp = Some(qpn);
    let test = a.test();
    let mine = Dest {
        lid: 0,
        out_reads: test.out_reads(),
        qpn,
        psn: random_psn(),
        rkey: lkey,
        vaddr: addr,
        gid,
        srqn: 0,
    };
    let (stream, role) = connect_oob(a)?;
    let mut oob = Oob::new(stream, role);
    let outcome = crate::perftest::bw_exchange(
        &mut oob,
        test,
        a.mtu,
        &mine,
        |mtu, remote: &Dest| {
            let rgid = IpAddr::V6(remote.gid).to_canonical();
            c.call(
                "POST",
                &format!("/v1/qps/{qpn}/connect"),
                Some(
                    json!({"remote_qpn": remote.qpn, "remote_gid": rgid.to_string(),
                    "remote_psn": remote.psn, "local_psn": mine.psn, "mtu": mtu,
                    "max_rd_atomic": remote.out_reads.clamp(1, 16),
                    "timeout": 14, "retry_cnt": 7, "rnr_retry": 7,
                    "access": ["remote-write", "remote-read", "remote-atomic"]}),
                ),
            )
            .map(drop)
        },
        || Ok(()),
        |remote| run_client(c, a, qpn, lkey, addr, remote),
    )?;
    let r = outcome.report.unwrap_or(BwReport {
        size,
        iters: 0,
        bw_peak: 0.0,
        bw_avg: 0.0,
        msg_rate: 0.0,
    });
    if json {
        let v = json!({"test": a.title(), "role": if role == Role::Client { "client" } else { "server" },
            "mtu": outcome.mtu, "local": dest_json(&mine), "remote": dest_json(&outcome.remote),
            "bytes": r.size, "iterations": r.iters, "bw_peak_mb_s": r.bw_peak,
            "bw_avg_mb_s": r.bw_avg, "msg_rate_mpps": r.msg_rate,
            "gbit_s": r.bw_avg * 1048576.0 * 8.0 / 1e9});
        writeln!(out, "{v}").map_err(io)?;
        return Ok(0);
    }
    let line = "-".repeat(87);
    writeln!(out, "{line}").map_err(io)?;
    writeln!(out, "{:>32}", a.title()).map_err(io)?;
    writeln!(
        out,
        " Number of qps   : 1\t\tTransport type : IB (RoCEv2, ferroce)"
    )
    .map_err(io)?;
    writeln!(out, " Connection type : RC\t\tUsing SRQ      : OFF").map_err(io)?;
    if role == Role::Client {
        writeln!(out, " TX depth        : {}", a.tx_depth).map_err(io)?;
    }
    writeln!(out, " Mtu             : {}[B]", outcome.mtu).map_err(io)?;
    writeln!(out, " Link type       : Ethernet").map_err(io)?;
    writeln!(out, " GID index       : {}", a.gid_index).map_err(io)?;
    if a.op == PerfOp::Atomic {
        writeln!(out, " Atomic op       : {:?}", a.atomic).map_err(io)?;
    }
    writeln!(out, " Data ex. method : Ethernet").map_err(io)?;
    writeln!(out, "{line}").map_err(io)?;
    for (what, d) in [("local", &mine), ("remote", &outcome.remote)] {
        writeln!(
            out,
            " {what} address: LID {:04x} QPN {:#06x} PSN {:#x} RKey {:#08x} VAddr {:#016x}",
            d.lid, d.qpn, d.psn, d.rkey, d.vaddr
        )
        .map_err(io)?;
        writeln!(out, " GID: {}", gid_text(&d.gid)).map_err(io)?;
    }
    writeln!(out, "{line}").map_err(io)?;
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
    writeln!(out, "{line}").map_err(io)?;
    Ok(0)
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

/// The client's test: the QP's lcore posts `iters` work requests, `tx_depth` outstanding.
fn run_client(
    c: &Client,
    a: &PerfArgs,
    qpn: u32,
    lkey: u32,
    addr: u64,
    remote: &Dest,
) -> Result<BwReport, Fail> {
    let size = a.size();
    let mut b = json!({"wr_id": 1, "sge": [{"addr": addr, "length": size, "lkey": lkey}],
        "remote_addr": remote.vaddr, "rkey": remote.rkey, "count": a.iters,
        "depth": a.tx_depth.min(16384), "timeout_ms": 600_000});
    match (a.op, a.atomic) {
        (PerfOp::Write, _) => b["opcode"] = json!("write"),
        (PerfOp::Read, _) => b["opcode"] = json!("read"),
        (PerfOp::Atomic, AtomicOp::FetchAdd) => {
            b["opcode"] = json!("fetch-add");
            b["add"] = json!(1);
        }
        (PerfOp::Atomic, AtomicOp::CmpSwap) => {
            b["opcode"] = json!("cmp-swap");
            b["compare"] = json!(0);
            b["swap"] = json!(0);
        }
    }
    let r = c.call("POST", &format!("/v1/qps/{qpn}/stream"), Some(b))?;
    let done = r["completed"].as_u64().unwrap_or(0);
    let errors = r["errors"].as_u64().unwrap_or(0);
    let secs = r["elapsed_ns"].as_u64().unwrap_or(0) as f64 / 1e9;
    if errors > 0 || done != a.iters || secs <= 0.0 {
        return Err(Fail(
            1,
            format!(
                "the test failed: {done} of {} work requests completed, {errors} in error",
                a.iters
            ),
        ));
    }
    let bw = size as f64 * done as f64 / secs / 1048576.0;
    let best = r["best_ns_per_wr"]
        .as_f64()
        .unwrap_or(secs * 1e9 / done as f64);
    Ok(BwReport {
        size,
        iters: done,
        bw_peak: size as f64 / (best / 1e9) / 1048576.0,
        bw_avg: bw,
        msg_rate: done as f64 / secs / 1e6,
    })
}
