//! Setting up verbs objects through roced's REST API for a perftest-style run, shared by
//! `rocectl perf` and `rocectl pingpong`: the out-of-band TCP connection, a random starting PSN,
//! the port's GID, a registered buffer with its QP (destroyed when dropped), connecting the QP
//! to the peer's destination, and posting receives.

use crate::ctl::{Client, Fail};
use crate::perftest::{Dest, Role};
use serde_json::{Value, json};
use std::net::{IpAddr, Ipv6Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// The GRH area at the start of every UD receive buffer.
pub(crate) const GRH: u64 = 40;

/// A 24-bit starting PSN that differs from run to run (perftest uses lrand48).
pub(crate) fn random_psn() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let x = t ^ (u64::from(std::process::id()) << 32);
    (x.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as u32 & 0xff_ffff
}

/// The out-of-band TCP connection: as the server (no `peer`) the first client on `port`
/// within `timeout`, as the client a connection to `peer`, retried until it listens.
pub(crate) fn connect_oob(
    peer: Option<&str>,
    port: u16,
    timeout: u64,
) -> Result<(TcpStream, Role), Fail> {
    let wait = Duration::from_secs(timeout);
    let s = match peer {
        None => {
            let l = TcpListener::bind(("0.0.0.0", port))
                .map_err(|e| Fail(2, format!("cannot listen on TCP port {}: {e}", port)))?;
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
                match TcpStream::connect((host, port)) {
                    Ok(s) => break (s, Role::Client),
                    Err(e) if t0.elapsed() > wait => {
                        return Err(Fail(
                            1,
                            format!("cannot reach the server {host}:{}: {e}", port),
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

/// GID `index` of the node's port `port` (its table: link-local, IPv4-mapped, IPv6).
pub(crate) fn local_gid(c: &Client, port: usize, index: usize) -> Result<Ipv6Addr, Fail> {
    let p = c.call("GET", &format!("/v1/ports/{port}"), None)?;
    let gids = p["gids"].as_array().cloned().unwrap_or_default();
    gids.get(index)
        .and_then(Value::as_str)
        .and_then(|g| g.parse().ok())
        .ok_or_else(|| {
            Fail(
                1,
                format!(
                    "port {port} has no GID index {index} (it has {}: {gids:?})",
                    gids.len()
                ),
            )
        })
}

/// A test's buffer and QP on the node, removed when dropped, however the test ends.
pub(crate) struct Resources<'a> {
    c: &'a Client,
    mr: Option<u32>,
    qp: Option<u32>,
    /// QPs created in bulk.
    pub(crate) qps: Vec<u32>,
}

impl<'a> Resources<'a> {
    /// Registers a buffer of two halves of at least a page and `size` each.
    pub(crate) fn buffer(c: &'a Client, size: u64) -> Result<(Self, Buf), Fail> {
        let half = size.max(4096);
        let mut made = Resources {
            c,
            mr: None,
            qp: None,
            qps: Vec::new(),
        };
        let mr = c.call(
            "POST",
            "/v1/mrs",
            Some(json!({"length": half * 2,
                "access": ["local-write", "remote-write", "remote-read", "remote-atomic"]})),
        )?;
        let buf = Buf {
            lkey: mr["lkey"].as_u64().unwrap_or(0) as u32,
            addr: mr["addr"].as_u64().unwrap_or(0),
            half,
            size,
        };
        made.mr = Some(buf.lkey);
        Ok((made, buf))
    }

    /// Registers a buffer of two halves of at least a page and `size` each, and creates a QP
    /// with room for `tx_depth` sends and `rx_depth` receives.
    pub(crate) fn create(
        c: &'a Client,
        size: u64,
        tx_depth: u32,
        rx_depth: u64,
        max_inline_data: u32,
    ) -> Result<(Self, Buf, u32), Fail> {
        Self::with_qp(
            c,
            size,
            json!({"max_send_wr": tx_depth, "max_recv_wr": rx_depth.max(1),
                    "max_inline_data": max_inline_data}),
        )
    }

    /// [`Resources::create`] with a UD QP.
    pub(crate) fn create_ud(
        c: &'a Client,
        size: u64,
        tx_depth: u32,
        rx_depth: u64,
    ) -> Result<(Self, Buf, u32), Fail> {
        Self::with_qp(
            c,
            size,
            json!({"type": "UD", "max_send_wr": tx_depth, "max_recv_wr": rx_depth.max(1)}),
        )
    }

    /// The buffer and a QP created with `qp` (a `POST /v1/qps` body).
    fn with_qp(c: &'a Client, size: u64, qp: Value) -> Result<(Self, Buf, u32), Fail> {
        let (mut made, buf) = Self::buffer(c, size)?;
        let qp = c.call("POST", "/v1/qps", Some(qp))?;
        let qpn = qp["qpn"].as_u64().unwrap_or(0) as u32;
        made.qp = Some(qpn);
        Ok((made, buf, qpn))
    }
}

impl Drop for Resources<'_> {
    fn drop(&mut self) {
        if let Some(q) = self.qp {
            let _ = self.c.call("DELETE", &format!("/v1/qps/{q}"), None);
        }
        for part in self.qps.chunks(crate::perf::BULK) {
            let _ = self.c.call(
                "POST",
                "/v1/qps/bulk/destroy",
                Some(json!({ "qpns": part })),
            );
        }
        if let Some(k) = self.mr {
            let _ = self.c.call("DELETE", &format!("/v1/mrs/{k}"), None);
        }
    }
}

/// Takes our QP to RTS towards `remote` with perftest's and rc_pingpong's attributes: `how`
/// is our first PSN, the path MTU, READs/atomics outstanding and the ACK timeout code.
pub(crate) fn connect_qp(
    c: &Client,
    qpn: u32,
    remote: &Dest,
    (local_psn, mtu, rd_atomic, timeout): (u32, u32, u16, u8),
) -> Result<(), Fail> {
    let rgid = IpAddr::V6(remote.gid).to_canonical();
    c.call(
        "POST",
        &format!("/v1/qps/{qpn}/connect"),
        Some(
            json!({"remote_qpn": remote.qpn, "remote_gid": rgid.to_string(),
            "remote_psn": remote.psn, "local_psn": local_psn, "mtu": mtu,
            "max_rd_atomic": rd_atomic.clamp(1, 16), "min_rnr_timer": 12,
            "timeout": timeout, "retry_cnt": 7, "rnr_retry": 7,
            "access": ["remote-write", "remote-read", "remote-atomic"]}),
        ),
    )
    .map(drop)
}

/// The test's buffer: messages go out from its first half and come into its second.
pub(crate) struct Buf {
    pub(crate) lkey: u32,
    pub(crate) addr: u64,
    pub(crate) half: u64,
    pub(crate) size: u64,
}

impl Buf {
    pub(crate) fn sge(&self, addr: u64) -> Value {
        json!([{"addr": addr, "length": self.size, "lkey": self.lkey}])
    }
}

/// The receives that must be there before the peer's first SEND (`n` of them).
pub(crate) fn post_receives(c: &Client, qpn: u32, b: &Buf, n: u64) -> Result<(), Fail> {
    for i in 0..n {
        c.call(
            "POST",
            &format!("/v1/qps/{qpn}/recv"),
            Some(json!({"wr_id": 1_000_000 + i, "sge": b.sge(b.addr + b.half)})),
        )?;
    }
    Ok(())
}
