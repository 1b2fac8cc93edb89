//! `rocectl udaddy`: librdmacm's `udaddy` on a ferroce node, so that the peer can be an
//! unmodified `udaddy` (or another `rocectl udaddy`), its UD QP found by SIDR on QP1.
//!
//! The test (rdma-core's `librdmacm/examples/udaddy.c`), on rdma_cm's UDP port space (port
//! 7174 by default): the client resolves the server's service with a SIDR_REQ, whose SIDR_REP
//! names the server's UD QP and its Q_Key (0x01234567, rdma_cm's for the UDP space); the
//! client SENDs `-C` messages of `-S` bytes with immediate data (its own QPN); the server,
//! once it has them all, answers each with as many of its own towards the QPN the immediate
//! data named, and the client waits for them. Both post their receives before the peer can
//! send (UD drops what no receive takes).

use crate::cmstream::{self, Msgs, To, Wcs};
use crate::ctl::{Client, Fail};
use clap::Args;
use serde_json::{Value, json};
use std::io::Write;
use std::net::IpAddr;
use std::time::Duration;
use wire::cm::UDP_QKEY;

/// udaddy's default port.
pub const PORT: u16 = 7174;

/// `rocectl udaddy [-s SERVER]`.
#[derive(Debug, Args)]
pub struct UdaddyArgs {
    /// The server's address: be its client (without it, serve).
    #[arg(short = 's', long)]
    pub server: Option<IpAddr>,
    /// The port (rdma_cm's UDP port space).
    #[arg(short = 'p', long, default_value_t = PORT)]
    pub port: u16,
    /// Messages each way.
    #[arg(short = 'C', long, default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub count: u64,
    /// Bytes per message (at most the port's UD MTU).
    #[arg(short = 'S', long, default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub size: u64,
    /// Milliseconds to wait for the peer at each step.
    #[arg(long, default_value_t = 30000)]
    pub timeout_ms: u64,
}

fn io(e: std::io::Error) -> Fail {
    Fail(2, e.to_string())
}

/// Brings `m`'s UD QP to RTS with rdma_cm's UDP Q_Key (as rdma_create_qp does) and posts
/// every receive.
fn ready(c: &Client, m: &Msgs<'_>) -> Result<(), Fail> {
    let modify = |body: Value| c.call("POST", &format!("/v1/qps/{}/modify", m.qpn), Some(body));
    modify(json!({"state": "INIT", "qkey": UDP_QKEY}))?;
    modify(json!({"state": "RTR"}))?;
    modify(json!({"state": "RTS"}))?;
    m.post_recvs()
}

/// The immediate data of the peer's messages (udaddy's sender names its QP there).
fn receive_all(m: &Msgs<'_>, wcs: &mut Wcs<'_>) -> Result<u32, Fail> {
    m.receive_all(wcs)
        .map_err(|Fail(c, e)| Fail(c, format!("udaddy: {e}")))?
        .ok_or_else(|| {
            Fail(
                1,
                "udaddy: the peer's messages carry no immediate data".into(),
            )
        })
}

pub(crate) fn udaddy(
    c: &Client,
    a: &UdaddyArgs,
    json_out: bool,
    out: &mut dyn Write,
) -> Result<u8, Fail> {
    let wait = Duration::from_millis(a.timeout_ms);
    // udaddy's own lines, unless the answer is JSON.
    let mut say = |line: &str| -> Result<(), Fail> {
        if !json_out {
            writeln!(out, "{line}").map_err(io)?;
        }
        Ok(())
    };
    let (conn, role, peer_qpn, qpn) = run(c, a, wait, &mut say)?;
    say("data transfers complete")?;
    say("test complete")?;
    say("return status 0")?;
    if json_out {
        writeln!(
            out,
            "{}",
            json!({"role": role, "messages": a.count, "size": a.size, "qpn": qpn,
                   "peer_qpn": peer_qpn, "connection": conn})
        )
        .map_err(io)?;
    }
    Ok(0)
}

/// The test; the connection, our role, the peer's QPN (from its messages' immediate data)
/// and our QPN.
fn run(
    c: &Client,
    a: &UdaddyArgs,
    wait: Duration,
    say: &mut dyn FnMut(&str) -> Result<(), Fail>,
) -> Result<(Value, &'static str, u32, u32), Fail> {
    let side = Msgs::new(c, a.count, a.size, true)?;
    let mut wcs = Wcs::new(c, side.qpn, wait);
    ready(c, &side)?;
    let (conn, received_imm) = match a.server {
        Some(server) => {
            say("udaddy: starting client")?;
            say("udaddy: connecting")?;
            let conn = cmstream::resolve(c, side.qpn, (server, a.port), wait)?;
            let qpn = conn["remote_qpn"].as_u64().unwrap_or(0) as u32;
            let qkey = conn["remote_qkey"].as_u64().unwrap_or(0) as u32;
            say("initiating data transfers")?;
            side.send_all(&mut wcs, To::Ud(server, qpn, qkey), true)?;
            say("receiving data transfers")?;
            let imm = receive_all(&side, &mut wcs)?;
            if imm != qpn {
                return Err(Fail(
                    1,
                    format!("udaddy: replies name QP {imm}, and SIDR named {qpn}"),
                ));
            }
            (conn, imm)
        }
        None => {
            say("udaddy: starting server")?;
            c.call(
                "POST",
                "/v1/cm/listeners",
                Some(json!({"port": a.port, "space": "udp", "backlog": 1})),
            )?;
            let accepted = cmstream::accept_in(c, a.port, "udp", side.qpn, wait);
            let _ = c.call(
                "DELETE",
                &format!("/v1/cm/listeners/{}?space=udp", a.port),
                None,
            );
            let conn = accepted?;
            let peer: IpAddr = conn["peer"]
                .as_str()
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| Fail(1, format!("udaddy: the request names no peer: {conn}")))?;
            say("receiving data transfers")?;
            let imm = receive_all(&side, &mut wcs)?;
            say("sending replies")?;
            side.send_all(&mut wcs, To::Ud(peer, imm, UDP_QKEY), true)?;
            (conn, imm)
        }
    };
    Ok((
        conn,
        if a.server.is_some() {
            "client"
        } else {
            "server"
        },
        received_imm,
        side.qpn,
    ))
}
