//! RDMA CM connections driven through roced's API for rocectl's librdmacm-style tools: a
//! connect or an accept on QP1 (`/v1/cm/*`), a QP's completions waited for by kind, and
//! perftest's `-R` exchange channel, a stream of SENDs over a CM-connected RC QP.
//!
//! perftest with `-R` sends no TCP at all: its first CM connection carries the same messages
//! as its TCP exchange, each as one SEND (the keys as the binary `struct pingpong_dest`), in
//! lockstep, with one receive posted at a time on each side (rxe's
//! `tests/data/rxe/write_bw_cm.pcap`). [`CmStream`] gives that connection to
//! [`crate::perftest::Oob`] as a byte stream: a write is one SEND, a read takes the bytes of
//! the next message received.

use crate::ctl::{Client, Fail};
use crate::perftest::{OobStream, Role};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// The longest one connect or accept call waits (roced's limit is 30 s).
const CALL_WAIT_MS: u64 = 10_000;
/// Times perftest's client tries a connect again after a REJ, and the pause between tries
/// (10 times, 100 ms apart: its server listens for the test QPs only after a barrier).
pub(crate) const PERFTEST_REJ_RETRIES: u32 = 10;
const REJ_PAUSE: Duration = Duration::from_millis(100);

/// One QP's completions, each kind waited for in turn (the other kind kept).
pub(crate) struct Wcs<'a> {
    c: &'a Client,
    qpn: u32,
    send: VecDeque<Value>,
    recv: VecDeque<Value>,
    /// The longest one wait lasts.
    pub(crate) wait: Duration,
}

impl<'a> Wcs<'a> {
    pub(crate) fn new(c: &'a Client, qpn: u32, wait: Duration) -> Self {
        Wcs {
            c,
            qpn,
            send: VecDeque::new(),
            recv: VecDeque::new(),
            wait,
        }
    }

    /// The next successful completion of a receive (`recv`) or of a send; a failed one, or
    /// none within the wait, is an error naming `what`.
    pub(crate) fn next(&mut self, recv: bool, what: &str) -> Result<Value, Fail> {
        let end = Instant::now() + self.wait;
        loop {
            let q = if recv { &mut self.recv } else { &mut self.send };
            if let Some(w) = q.pop_front() {
                if w["status"] != "success" {
                    return Err(Fail(1, format!("{what}: completion {}", w["status"])));
                }
                return Ok(w);
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Fail(1, format!("{what}: nothing in {:?}", self.wait)));
            }
            let v = self.c.call(
                "GET",
                &format!(
                    "/v1/qps/{}/completions?max=16&wait_ms={}",
                    self.qpn,
                    left.as_millis().clamp(1, 1000)
                ),
                None,
            )?;
            for (k, q) in [("send", &mut self.send), ("recv", &mut self.recv)] {
                q.extend(v[k].as_array().into_iter().flatten().cloned());
            }
        }
    }
}

/// Connects RC QP `qpn` (in RESET) to `peer`:`port` through the CM (`POST /v1/cm/connect`),
/// trying again `rej_retries` times while the peer rejects it (it may not listen yet), for up
/// to `timeout` in all. Returns the connection.
pub(crate) fn connect(
    c: &Client,
    qpn: u32,
    (peer, port): (IpAddr, u16),
    rej_retries: u32,
    timeout: Duration,
) -> Result<Value, Fail> {
    let deadline = Instant::now() + timeout;
    let mut tries = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let r = c.call(
            "POST",
            "/v1/cm/connect",
            Some(json!({"qpn": qpn, "peer": peer.to_string(), "port": port,
                        "timeout_ms": (left.as_millis() as u64).clamp(1, CALL_WAIT_MS)})),
        );
        match r {
            Err(Fail(_, m)) if m.starts_with("cm_rejected") && tries < rej_retries => {
                tries += 1;
                std::thread::sleep(REJ_PAUSE);
            }
            Err(Fail(_, m)) if m.starts_with("timed_out") && Instant::now() < deadline => {}
            r => return r,
        }
    }
}

/// Takes the next connection request on `port` (listened on already) for RC QP `qpn`,
/// waiting up to `timeout` for one (`POST /v1/cm/accept`). Returns the connection.
pub(crate) fn accept(c: &Client, port: u16, qpn: u32, timeout: Duration) -> Result<Value, Fail> {
    accept_in(c, port, "tcp", qpn, timeout)
}

/// [`accept`] in rdma_cm's port space `space` ("tcp", or "udp": a SIDR_REQ answered with
/// UD QP `qpn`).
pub(crate) fn accept_in(
    c: &Client,
    port: u16,
    space: &str,
    qpn: u32,
    timeout: Duration,
) -> Result<Value, Fail> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match c.call(
            "POST",
            "/v1/cm/accept",
            Some(json!({"port": port, "qpn": qpn, "space": space,
                        "timeout_ms": (left.as_millis() as u64).clamp(1, CALL_WAIT_MS)})),
        ) {
            Err(Fail(_, m)) if m.contains("timed_out") && Instant::now() < deadline => {}
            r => return r,
        }
    }
}

/// Asks whoever listens on `peer`:`port` of rdma_cm's UDP port space for its UD QP (SIDR,
/// `POST /v1/cm/resolve`), for up to `timeout`: the answer has `remote_qpn` and `remote_qkey`.
pub(crate) fn resolve(
    c: &Client,
    qpn: u32,
    (peer, port): (IpAddr, u16),
    timeout: Duration,
) -> Result<Value, Fail> {
    c.call(
        "POST",
        "/v1/cm/resolve",
        Some(json!({"qpn": qpn, "peer": peer.to_string(), "port": port,
                    "timeout_ms": (timeout.as_millis() as u64).clamp(1, CALL_WAIT_MS * 3)})),
    )
}

/// Bytes of one message slot in the exchange's region; perftest's messages are 56 at most.
const SLOT: u64 = 256;
/// Receives kept posted (perftest keeps one; more costs nothing and spares an RNR NAK).
const RECVS: u64 = 4;
/// The send slot follows the receive slots.
const SEND_AT: u64 = RECVS * SLOT;

/// perftest's `-R` exchange channel: an RC QP and a small region of our own, connected
/// through the CM to the peer's exchange QP. Dropping it disconnects and frees both.
pub(crate) struct CmStream<'a> {
    c: &'a Client,
    qpn: u32,
    key: u32,
    base: u64,
    conn: Option<u64>,
    listening: Option<u16>,
    wcs: Wcs<'a>,
    /// The message being read, and how much of it has been.
    msg: Vec<u8>,
    at: usize,
}

impl<'a> CmStream<'a> {
    /// As the client (a `peer`), connects to it on `port`; as the server, listens on `port`
    /// for the exchange and `more` connections after it (the test QPs) and accepts the first.
    /// Waits up to `timeout` for the peer; each later message may take `timeout` plus the
    /// length of a test run.
    pub(crate) fn open(
        c: &'a Client,
        peer: Option<IpAddr>,
        port: u16,
        more: usize,
        timeout: Duration,
    ) -> Result<(Self, Role), Fail> {
        let mr = c.call(
            "POST",
            "/v1/mrs",
            Some(json!({"length": SEND_AT + SLOT, "access": ["local-write"]})),
        )?;
        let key = mr["lkey"].as_u64().unwrap_or(0) as u32;
        let mut s = CmStream {
            c,
            qpn: 0,
            key,
            base: mr["addr"].as_u64().unwrap_or(0),
            conn: None,
            listening: None,
            wcs: Wcs::new(c, 0, timeout + Duration::from_secs(600)),
            msg: Vec::new(),
            at: 0,
        };
        let qp = c.call(
            "POST",
            "/v1/qps",
            Some(json!({"max_send_wr": 4, "max_recv_wr": RECVS})),
        )?;
        s.qpn = qp["qpn"].as_u64().unwrap_or(0) as u32;
        s.wcs.qpn = s.qpn;
        let (conn, role) = match peer {
            Some(peer) => (
                connect(c, s.qpn, (peer, port), PERFTEST_REJ_RETRIES, timeout)?,
                Role::Client,
            ),
            None => {
                c.call(
                    "POST",
                    "/v1/cm/listeners",
                    Some(json!({"port": port, "backlog": more + 1})),
                )?;
                s.listening = Some(port);
                (accept(c, port, s.qpn, timeout)?, Role::Server)
            }
        };
        s.conn = conn["id"].as_u64();
        // A QP takes receives from INIT on, which the CM's moves pass: now. The client SENDs
        // first; a SEND that beats the server's receives is NAKed RNR and sent again.
        for slot in 0..RECVS {
            s.post_recv(slot)?;
        }
        Ok((s, role))
    }

    fn post_recv(&self, slot: u64) -> Result<(), Fail> {
        self.c
            .call(
                "POST",
                &format!("/v1/qps/{}/recv", self.qpn),
                Some(
                    json!({"wr_id": slot, "sge": [{"addr": self.base + slot * SLOT,
                                                     "length": SLOT, "lkey": self.key}]}),
                ),
            )
            .map(drop)
    }

    /// The next message the peer sent, its receive posted again.
    fn next_msg(&mut self) -> Result<Vec<u8>, Fail> {
        let w = self
            .wcs
            .next(true, "perftest's exchange: the peer's next message")?;
        let slot = w["wr_id"]
            .as_u64()
            .filter(|&s| s < RECVS)
            .ok_or_else(|| Fail(1, format!("perftest's exchange: a receive of no slot: {w}")))?;
        let len = w["byte_len"].as_u64().unwrap_or(0).min(SLOT);
        let m = self.c.read_bytes(self.key, self.base + slot * SLOT, len)?;
        self.post_recv(slot)?;
        Ok(m)
    }
}

fn io_err(e: Fail) -> std::io::Error {
    std::io::Error::other(e.1)
}

impl Read for CmStream<'_> {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        if b.is_empty() {
            return Ok(0);
        }
        while self.at == self.msg.len() {
            self.msg = self.next_msg().map_err(io_err)?;
            self.at = 0;
        }
        let n = b.len().min(self.msg.len() - self.at);
        b[..n].copy_from_slice(&self.msg[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

impl Write for CmStream<'_> {
    /// One SEND of up to a slot's bytes, waited for.
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let n = b.len().min(SLOT as usize);
        self.c
            .write_bytes(self.key, self.base + SEND_AT, &b[..n])
            .map_err(io_err)?;
        self.c
            .call(
                "POST",
                &format!("/v1/qps/{}/send", self.qpn),
                Some(
                    json!({"opcode": "send", "sge": [{"addr": self.base + SEND_AT,
                                                        "length": n, "lkey": self.key}]}),
                ),
            )
            .map_err(io_err)?;
        self.wcs
            .next(false, "perftest's exchange: our SEND")
            .map_err(io_err)?;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl OobStream for CmStream<'_> {}

impl Drop for CmStream<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.conn {
            let _ = self
                .c
                .call("DELETE", &format!("/v1/cm/connections/{id}"), None);
        }
        if let Some(port) = self.listening {
            let _ = self
                .c
                .call("DELETE", &format!("/v1/cm/listeners/{port}"), None);
        }
        if self.qpn != 0 {
            let _ = self
                .c
                .call("DELETE", &format!("/v1/qps/{}", self.qpn), None);
        }
        let _ = self
            .c
            .call("DELETE", &format!("/v1/mrs/{}", self.key), None);
    }
}

/// Waits up to `wait` for each of connections `ids` to be no longer established (the peer
/// disconnected it, or it is gone); true when all are.
pub(crate) fn wait_closed(c: &Client, ids: &[u64], wait: Duration) -> bool {
    let end = Instant::now() + wait;
    ids.iter().all(|id| {
        loop {
            match c.call("GET", &format!("/v1/cm/connections/{id}"), None) {
                Ok(v) if v["state"] == "established" => {}
                _ => break true,
            }
            if Instant::now() >= end {
                break false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
}

impl CmStream<'_> {
    /// The exchange connection's ID.
    pub(crate) fn conn(&self) -> Option<u64> {
        self.conn
    }
}
