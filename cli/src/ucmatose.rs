//! `rocectl ucmatose`: librdmacm's `ucmatose` (cmatose.c) on a ferroce node, so that the
//! peer can be an unmodified `ucmatose` (or another `rocectl ucmatose`), connected by the
//! RDMA CM on QP1 (rdma_cm's TCP port space, port 7471 by default).
//!
//! The test, on one RC connection: both sides post `-C` receives of `-S` bytes; once the
//! connection is up the server SENDs `-C` messages, the client takes them all and SENDs as
//! many back, the server takes those and disconnects (DREQ), and the client, told of it,
//! disconnects too.

use crate::cmstream::{self, Msgs, To, Wcs};
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
    let side = Msgs::new(c, a.count, a.size, false)?;
    let tag = |Fail(c, e)| Fail(c, format!("ucmatose: {e}"));
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
                side.receive_all(&mut wcs).map_err(tag)?;
                say("sending replies")?;
                side.send_all(&mut wcs, To::Connected, false).map_err(tag)?;
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
                side.send_all(&mut wcs, To::Connected, false).map_err(tag)?;
                say("receiving data transfers")?;
                side.receive_all(&mut wcs).map_err(tag)?;
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
