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
use crate::setup::GRH;
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

/// Where a test's SENDs go: the connected peer (RC), or a UD destination (the peer's
/// address, QPN and Q_Key).
#[derive(Clone, Copy, Debug)]
pub(crate) enum To {
    Connected,
    Ud(IpAddr, u32, u32),
}

/// librdmacm's example tests' side (ucmatose's, udaddy's): an RC or UD QP and its region,
/// `count` receive slots of `size` bytes (after a GRH for UD) and the message sent after
/// them; SENDs carry our QPN as immediate data where a test names it. Freed when dropped.
pub(crate) struct Msgs<'a> {
    c: &'a Client,
    pub(crate) qpn: u32,
    key: u32,
    base: u64,
    slot: u64,
    count: u64,
    size: u64,
    ud: bool,
}

impl<'a> Msgs<'a> {
    pub(crate) fn new(c: &'a Client, count: u64, size: u64, ud: bool) -> Result<Self, Fail> {
        let slot = (size + if ud { GRH } else { 0 }).next_multiple_of(64);
        let mr = c.call(
            "POST",
            "/v1/mrs",
            Some(json!({"length": slot * (count + 1), "access": ["local-write"]})),
        )?;
        let mut s = Msgs {
            c,
            qpn: 0,
            key: mr["lkey"].as_u64().unwrap_or(0) as u32,
            base: mr["addr"].as_u64().unwrap_or(0),
            slot,
            count,
            size,
            ud,
        };
        let qp = c.call(
            "POST",
            "/v1/qps",
            Some(
                json!({"type": if ud {"UD"} else {"RC"}, "max_send_wr": count,
                        "max_recv_wr": count}),
            ),
        )?;
        s.qpn = qp["qpn"].as_u64().unwrap_or(0) as u32;
        Ok(s)
    }

    /// Every receive posted (the QP must be past RESET).
    pub(crate) fn post_recvs(&self) -> Result<(), Fail> {
        for i in 0..self.count {
            self.c.call(
                "POST",
                &format!("/v1/qps/{}/recv", self.qpn),
                Some(
                    json!({"wr_id": i, "sge": [{"addr": self.base + i * self.slot,
                                                  "length": self.slot, "lkey": self.key}]}),
                ),
            )?;
        }
        Ok(())
    }

    /// `count` SENDs of `size` bytes to `to` (with our QPN as immediate data when `imm`),
    /// each completion waited for.
    pub(crate) fn send_all(&self, wcs: &mut Wcs<'_>, to: To, imm: bool) -> Result<(), Fail> {
        let at = self.base + self.count * self.slot;
        let msg: Vec<u8> = (0..self.size).map(|i| (i % 251) as u8).collect();
        self.c.write_bytes(self.key, at, &msg)?;
        for i in 0..self.count {
            let mut wr = json!({"opcode": if imm {"send-imm"} else {"send"}, "wr_id": i,
                                "sge": [{"addr": at, "length": self.size, "lkey": self.key}]});
            if imm {
                wr["imm"] = json!(self.qpn);
            }
            if let To::Ud(peer, qpn, qkey) = to {
                wr["ud"] = json!({"remote_gid": peer.to_string(), "remote_qpn": qpn,
                                  "remote_qkey": qkey});
            }
            self.c
                .call("POST", &format!("/v1/qps/{}/send", self.qpn), Some(wr))?;
            wcs.next(false, "our SEND")?;
        }
        Ok(())
    }

    /// Waits for `count` messages of `size` bytes (and a GRH for UD); the immediate data of
    /// the first that has one.
    pub(crate) fn receive_all(&self, wcs: &mut Wcs<'_>) -> Result<Option<u32>, Fail> {
        let want = self.size + if self.ud { GRH } else { 0 };
        let mut imm = None;
        for n in 0..self.count {
            let w = wcs.next(true, "the peer's messages")?;
            if w["byte_len"].as_u64() != Some(want) {
                return Err(Fail(
                    1,
                    format!("message {n} is {} bytes, not {want}", w["byte_len"]),
                ));
            }
            imm = imm.or(w["imm_data"].as_u64().map(|i| i as u32));
        }
        Ok(imm)
    }
}

impl Drop for Msgs<'_> {
    fn drop(&mut self) {
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
