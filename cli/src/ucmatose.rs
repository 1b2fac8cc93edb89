//! `rocectl ucmatose`: librdmacm's `ucmatose` (cmatose.c) on a ferroce node, so that the
//! peer can be an unmodified `ucmatose` (or another `rocectl ucmatose`), connected by the
//! RDMA CM on QP1 (rdma_cm's TCP port space, port 7471 by default).
//!
//! The test, on one RC connection: both sides post `-C` receives of `-S` bytes; once the
//! connection is up the server SENDs `-C` messages, the client takes them all and SENDs as
//! many back, the server takes those and disconnects (DREQ), and the client, told of it,
//! disconnects too.

use crate::cmstream::{self, Wcs};
use crate::ctl::{Client, Fail};
use clap::Args;
use serde_json::json;
use std::io::Write;
use std::net::IpAddr;
use std::time::Duration;

/// ucmatose's default port.
pub const PORT: u16 = 7471;

/// `rocectl ucmatose [-s SERVER]`.
#[derive(Debug, Args)]
pub struct UcmatoseArgs {
    /// The server's address: be its client (without it, serve).
    #[arg(short = 's', long)]
    pub server: Option<IpAddr>,
    /// The port (rdma_cm's TCP port space).
    #[arg(short = 'p', long, default_value_t = PORT)]
    pub port: u16,
    /// Messages each way.
    #[arg(short = 'C', long, default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub count: u64,
    /// Bytes per message.
    #[arg(short = 'S', long, default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub size: u64,
    /// Milliseconds to wait for the peer at each step.
    #[arg(long, default_value_t = 30000)]
    pub timeout_ms: u64,
}

fn io(e: std::io::Error) -> Fail {
    Fail(2, e.to_string())
}

/// An RC QP and its region (receive slots, then the message sent), freed when dropped.
struct Side<'a> {
    c: &'a Client,
    qpn: u32,
    key: u32,
    base: u64,
    slot: u64,
    count: u64,
    size: u64,
}

impl<'a> Side<'a> {
    fn new(c: &'a Client, a: &UcmatoseArgs) -> Result<Self, Fail> {
        let slot = a.size.next_multiple_of(64);
        let mr = c.call(
            "POST",
            "/v1/mrs",
            Some(json!({"length": slot * (a.count + 1), "access": ["local-write"]})),
        )?;
        let mut s = Side {
            c,
            qpn: 0,
            key: mr["lkey"].as_u64().unwrap_or(0) as u32,
            base: mr["addr"].as_u64().unwrap_or(0),
            slot,
            count: a.count,
            size: a.size,
        };
        let qp = c.call(
            "POST",
            "/v1/qps",
            Some(json!({"max_send_wr": a.count, "max_recv_wr": a.count})),
        )?;
        s.qpn = qp["qpn"].as_u64().unwrap_or(0) as u32;
        Ok(s)
    }

    /// Every receive posted (a QP takes them once the CM has moved it past RESET).
    fn post_recvs(&self) -> Result<(), Fail> {
        for i in 0..self.count {
            self.c.call(
                "POST",
                &format!("/v1/qps/{}/recv", self.qpn),
                Some(
                    json!({"wr_id": i, "sge": [{"addr": self.base + i * self.slot,
                                                  "length": self.size, "lkey": self.key}]}),
                ),
            )?;
        }
        Ok(())
    }

    /// `count` SENDs, each completion waited for.
    fn send_all(&self, wcs: &mut Wcs<'_>) -> Result<(), Fail> {
        let at = self.base + self.count * self.slot;
        let msg: Vec<u8> = (0..self.size).map(|i| (i % 251) as u8).collect();
        self.c.write_bytes(self.key, at, &msg)?;
        for i in 0..self.count {
            self.c.call(
                "POST",
                &format!("/v1/qps/{}/send", self.qpn),
                Some(json!({"opcode": "send", "wr_id": i,
                            "sge": [{"addr": at, "length": self.size, "lkey": self.key}]})),
            )?;
            wcs.next(false, "ucmatose: our SEND")?;
        }
        Ok(())
    }

    /// Waits for `count` messages of `size` bytes.
    fn receive_all(&self, wcs: &mut Wcs<'_>) -> Result<(), Fail> {
        for n in 0..self.count {
            let w = wcs.next(true, "ucmatose: the peer's messages")?;
            if w["byte_len"].as_u64() != Some(self.size) {
                return Err(Fail(
                    1,
                    format!(
                        "ucmatose: message {n} is {} bytes, not {}",
                        w["byte_len"], self.size
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl Drop for Side<'_> {
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

pub(crate) fn ucmatose(
    c: &Client,
    a: &UcmatoseArgs,
    json_out: bool,
    out: &mut dyn Write,
) -> Result<u8, Fail> {
    let wait = Duration::from_millis(a.timeout_ms);
    let mut say = |line: &str| -> Result<(), Fail> {
        if !json_out {
            writeln!(out, "{line}").map_err(io)?;
        }
        Ok(())
    };
    let side = Side::new(c, a)?;
    let mut wcs = Wcs::new(c, side.qpn, wait);
    let conn = match a.server {
        Some(server) => {
            say("cmatose: starting client")?;
            say("cmatose: connecting")?;
            let conn = cmstream::connect(c, side.qpn, (server, a.port), 0, wait)?;
            let id = conn["id"].as_u64().unwrap_or(0);
            let mut run = || -> Result<(), Fail> {
                side.post_recvs()?;
                say("receiving data transfers")?;
                side.receive_all(&mut wcs)?;
                say("sending replies")?;
                side.send_all(&mut wcs)?;
                say("data transfers complete")?;
                // The server disconnects once it has our replies; then so do we.
                if !cmstream::wait_closed(c, &[id], wait) {
                    return Err(Fail(1, "ucmatose: the server never disconnected".into()));
                }
                Ok(())
            };
            let r = run();
            let _ = c.call("DELETE", &format!("/v1/cm/connections/{id}"), None);
            r?;
            conn
        }
        None => {
            say("cmatose: starting server")?;
            c.call(
                "POST",
                "/v1/cm/listeners",
                Some(json!({"port": a.port, "backlog": 1})),
            )?;
            let accepted = cmstream::accept(c, a.port, side.qpn, wait);
            let _ = c.call("DELETE", &format!("/v1/cm/listeners/{}", a.port), None);
            let conn = accepted?;
            let id = conn["id"].as_u64().unwrap_or(0);
            let mut run = || -> Result<(), Fail> {
                side.post_recvs()?;
                say("initiating data transfers")?;
                side.send_all(&mut wcs)?;
                say("receiving data transfers")?;
                side.receive_all(&mut wcs)?;
                say("data transfers complete")?;
                Ok(())
            };
            let r = run();
            say("cmatose: disconnecting")?;
            let _ = c.call("DELETE", &format!("/v1/cm/connections/{id}"), None);
            r?;
            say("disconnected")?;
            conn
        }
    };
    say("test complete")?;
    say("return status 0")?;
    if json_out {
        writeln!(
            out,
            "{}",
            json!({"role": if a.server.is_some() {"client"} else {"server"},
                   "messages": a.count, "size": a.size, "qpn": side.qpn,
                   "connection": conn})
        )
        .map_err(io)?;
    }
    Ok(0)
}
