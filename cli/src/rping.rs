//! `rocectl rping`: librdmacm's `rping` on a ferroce node, so that the peer can be an
//! unmodified `rping` (or another `rocectl rping`), connected by the RDMA CM on QP1.
//!
//! The test (rdma-core's `librdmacm/examples/rping.c`), per ping: the client fills its start
//! buffer with `"rdma-ping-%d: "` and a run of letters, and SENDs its address, rkey and length
//! (16 bytes: u64, u32, u32, big-endian); the server RDMA READs the buffer, SENDs a go-ahead,
//! gets the client's second buffer the same way and RDMA WRITEs what it read into it, then
//! SENDs again; the client checks (`-V`) that the two buffers agree. Each step waits for the
//! one before, as rping's semaphores do; every message is 16 bytes, as rping checks.

use crate::cmstream::{self, Wcs};
use crate::ctl::{Client, Fail};
use clap::Args;
use serde_json::{Value, json};
use std::io::Write;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// rping's default port.
pub const PORT: u16 = 7174;
/// Bytes of every SEND between the two: address, rkey, length.
pub const INFO: usize = 16;
/// The smallest and largest buffer rping takes.
const MIN_SIZE: u64 = 16;
const MAX_SIZE: u64 = 65536;
/// Where the receive and send messages lie in the region; the buffers follow.
const RECV_AT: u64 = 0;
const SEND_AT: u64 = 64;
const BUFS_AT: u64 = 4096;

/// `rocectl rping -s | -c -a ADDR`.
#[derive(Debug, Args)]
pub struct RpingArgs {
    /// Serve: listen on --port and answer one client.
    #[arg(short = 's', long, conflicts_with = "client")]
    pub server: bool,
    /// Be the client of the server at -a.
    #[arg(short = 'c', long, requires = "addr")]
    pub client: bool,
    /// The server's address (the client's peer).
    #[arg(short = 'a', long)]
    pub addr: Option<IpAddr>,
    /// The port (rdma_cm's TCP port space).
    #[arg(short = 'p', long, default_value_t = PORT)]
    pub port: u16,
    /// Pings (0: until the peer goes).
    #[arg(short = 'C', long, default_value_t = 0)]
    pub count: u64,
    /// Buffer size in bytes (16 to 65536).
    #[arg(short = 'S', long, default_value_t = 64)]
    pub size: u64,
    /// Print each ping's data.
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Check each ping's data (client).
    #[arg(short = 'V', long)]
    pub validate: bool,
    /// Milliseconds to wait for the peer at each step.
    #[arg(long, default_value_t = 30000)]
    pub timeout_ms: u64,
}

/// The client's start buffer of ping `ping`: rping's text, then letters from `start`.
pub fn start_text(ping: u64, start: u8, size: usize) -> Vec<u8> {
    let mut b = format!("rdma-ping-{ping}: ").into_bytes();
    b.truncate(size);
    let mut c = start;
    while b.len() < size {
        b.push(c);
        c = if c >= 122 { 65 } else { c + 1 };
    }
    b[size - 1] = 0;
    b
}

/// A buffer's address, rkey and length as rping SENDs them.
pub fn info(addr: u64, rkey: u32, len: u32) -> [u8; INFO] {
    let mut m = [0u8; INFO];
    m[..8].copy_from_slice(&addr.to_be_bytes());
    m[8..12].copy_from_slice(&rkey.to_be_bytes());
    m[12..].copy_from_slice(&len.to_be_bytes());
    m
}

/// The address, rkey and length in a peer's message.
pub fn parse_info(m: &[u8]) -> Option<(u64, u32, u32)> {
    let m: &[u8; INFO] = m.get(..INFO)?.try_into().ok()?;
    Some((
        u64::from_be_bytes(m[..8].try_into().ok()?),
        u32::from_be_bytes(m[8..12].try_into().ok()?),
        u32::from_be_bytes(m[12..].try_into().ok()?),
    ))
}

/// The QP, its region, and what a step needs of them.
struct Side<'a> {
    c: &'a Client,
    qpn: u32,
    key: u32,
    base: u64,
    size: u64,
    wcs: Wcs<'a>,
}

impl Side<'_> {
    fn start_buf(&self) -> u64 {
        self.base + BUFS_AT
    }
    fn rdma_buf(&self) -> u64 {
        self.base + BUFS_AT + self.size.next_multiple_of(64)
    }

    fn post_recv(&self) -> Result<(), Fail> {
        self.c
            .call(
                "POST",
                &format!("/v1/qps/{}/recv", self.qpn),
                Some(
                    json!({"wr_id": 1, "sge": [{"addr": self.base + RECV_AT, "length": INFO,
                                                 "lkey": self.key}]}),
                ),
            )
            .map(drop)
    }

    /// Waits for the peer's 16-byte message; reposts the receive.
    fn recv_info(&mut self, what: &str) -> Result<(u64, u32, u32), Fail> {
        let w = self.wcs.next(true, what)?;
        if w["byte_len"].as_u64() != Some(INFO as u64) {
            return Err(Fail(
                1,
                format!("{what}: received bogus data, size {}", w["byte_len"]),
            ));
        }
        let m = self
            .c
            .read_bytes(self.key, self.base + RECV_AT, INFO as u64)?;
        self.post_recv()?;
        parse_info(&m).ok_or_else(|| Fail(1, format!("{what}: short message")))
    }

    /// SENDs `m` (16 bytes) and waits for its completion.
    fn send_info(&mut self, m: &[u8; INFO], what: &str) -> Result<(), Fail> {
        self.c.write_bytes(self.key, self.base + SEND_AT, m)?;
        self.post(
            json!({"opcode": "send", "sge": [{"addr": self.base + SEND_AT, "length": INFO,
                                              "lkey": self.key}]}),
            what,
        )
    }

    fn post(&mut self, wr: Value, what: &str) -> Result<(), Fail> {
        self.c
            .call("POST", &format!("/v1/qps/{}/send", self.qpn), Some(wr))?;
        self.wcs.next(false, what).map(drop)
    }
}

/// What a failed write to the output is.
fn io(e: std::io::Error) -> Fail {
    Fail(2, e.to_string())
}

fn text(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

pub(crate) fn rping(
    c: &Client,
    a: &RpingArgs,
    json_out: bool,
    out: &mut dyn Write,
) -> Result<u8, Fail> {
    if !(MIN_SIZE..=MAX_SIZE).contains(&a.size) {
        return Err(Fail(
            2,
            format!("-S must be {MIN_SIZE} to {MAX_SIZE} bytes"),
        ));
    }
    if a.server == a.client {
        return Err(Fail(2, "one of -s (server) and -c (client)".into()));
    }
    let len = BUFS_AT + 2 * a.size.next_multiple_of(64);
    let mr = c.call(
        "POST",
        "/v1/mrs",
        Some(json!({"length": len, "access": ["local-write", "remote-write", "remote-read"]})),
    )?;
    let key = mr["lkey"].as_u64().unwrap_or(0) as u32;
    let base = mr["addr"].as_u64().unwrap_or(0);
    let qpn = match c.call("POST", "/v1/qps", Some(json!({}))) {
        Ok(q) => q["qpn"].as_u64().unwrap_or(0) as u32,
        Err(e) => {
            let _ = c.call("DELETE", &format!("/v1/mrs/{key}"), None);
            return Err(e);
        }
    };
    let r = run(c, a, json_out, out, key, base, qpn);
    let _ = c.call("DELETE", &format!("/v1/qps/{qpn}"), None);
    let _ = c.call("DELETE", &format!("/v1/mrs/{key}"), None);
    r
}

/// Connects QP `qpn` (in RESET) and pings over it; the caller frees the QP and the region.
fn run(
    c: &Client,
    a: &RpingArgs,
    json_out: bool,
    out: &mut dyn Write,
    key: u32,
    base: u64,
    qpn: u32,
) -> Result<u8, Fail> {
    let wait = Duration::from_millis(a.timeout_ms);
    let conn = if a.server {
        c.call(
            "POST",
            "/v1/cm/listeners",
            Some(json!({"port": a.port, "backlog": 1})),
        )?;
        let r = cmstream::accept(c, a.port, qpn, wait);
        let _ = c.call("DELETE", &format!("/v1/cm/listeners/{}", a.port), None);
        r?
    } else {
        let peer = a
            .addr
            .ok_or_else(|| Fail(2, "-c needs the server's address (-a)".into()))?;
        cmstream::connect(c, qpn, (peer, a.port), 0, wait)?
    };
    let id = conn["id"].as_u64().unwrap_or(0);
    let mut s = Side {
        c,
        qpn,
        key,
        base,
        size: a.size,
        wcs: Wcs::new(c, qpn, wait),
    };
    let t0 = Instant::now();
    let mut pings = 0u64;
    let result = s.post_recv().and_then(|_| {
        if a.client {
            client(&mut s, a, &mut pings, out)
        } else {
            server(&mut s, a, &mut pings, out)
        }
    });
    let secs = t0.elapsed().as_secs_f64();
    if a.server && result.is_ok() {
        // rping's server never disconnects first: its client does, after its last ping. A
        // DREQ of ours could beat our last SEND's completion at the client, whose CM event
        // then finds it mid-ping (rping then stops "wait for RDMA_WRITE_COMPLETE" and hangs).
        cmstream::wait_closed(c, &[id], Duration::from_millis(a.timeout_ms));
    }
    let _ = c.call("DELETE", &format!("/v1/cm/connections/{id}"), None);
    // A server's run ends when its client goes: its last wait fails, and that is the end.
    let failed = match result {
        Err(e) if a.client || pings == 0 || a.count > 0 && pings < a.count => Some(e),
        _ => None,
    };
    if json_out {
        writeln!(
            out,
            "{}",
            json!({"role": if a.client {"client"} else {"server"}, "pings": pings,
                   "seconds": secs, "connection": conn,
                   "error": failed.as_ref().map(|e| e.1.clone())})
        )
        .map_err(io)?;
    } else if a.verbose || failed.is_none() {
        writeln!(out, "{pings} pings in {secs:.3} s").map_err(io)?;
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(0),
    }
}

fn client(
    s: &mut Side<'_>,
    a: &RpingArgs,
    pings: &mut u64,
    out: &mut dyn Write,
) -> Result<(), Fail> {
    let mut start = 65u8;
    let size = a.size as usize;
    while a.count == 0 || *pings < a.count {
        let data = start_text(*pings, start, size);
        start = if start >= 122 { 65 } else { start + 1 };
        s.c.write_bytes(s.key, s.start_buf(), &data)?;
        s.c.write_bytes(s.key, s.rdma_buf(), &vec![0u8; size])?;
        s.send_info(
            &info(s.start_buf(), s.key, size as u32),
            "client: start buffer",
        )?;
        s.recv_info("client: the server's go-ahead after its READ")?;
        s.send_info(
            &info(s.rdma_buf(), s.key, size as u32),
            "client: rdma buffer",
        )?;
        s.recv_info("client: the server's word that its WRITE is done")?;
        let got = s.c.read_bytes(s.key, s.rdma_buf(), size as u64)?;
        if a.validate && got != data {
            return Err(Fail(1, format!("ping {}: data mismatch!", *pings)));
        }
        if a.verbose {
            writeln!(out, "ping data: {}", text(&got)).map_err(io)?;
        }
        *pings += 1;
    }
    Ok(())
}

fn server(
    s: &mut Side<'_>,
    a: &RpingArgs,
    pings: &mut u64,
    out: &mut dyn Write,
) -> Result<(), Fail> {
    while a.count == 0 || *pings < a.count {
        let (addr, rkey, len) = s.recv_info("server: the client's start buffer")?;
        let len = u64::from(len).min(s.size);
        s.post(
            json!({"opcode": "read", "sge": [{"addr": s.rdma_buf(), "length": len, "lkey": s.key}],
                   "remote_addr": addr, "rkey": rkey}),
            "server: RDMA READ",
        )?;
        let got = s.c.read_bytes(s.key, s.rdma_buf(), len)?;
        if a.verbose {
            writeln!(out, "server ping data: {}", text(&got)).map_err(io)?;
        }
        s.send_info(&[0; INFO], "server: go-ahead")?;
        let (addr, rkey, _) = s.recv_info("server: the client's rdma buffer")?;
        // rping writes the text and its NUL.
        let n = got
            .iter()
            .position(|&c| c == 0)
            .map_or(got.len(), |p| p + 1);
        s.post(
            json!({"opcode": "write", "sge": [{"addr": s.rdma_buf(), "length": n, "lkey": s.key}],
                   "remote_addr": addr, "rkey": rkey}),
            "server: RDMA WRITE",
        )?;
        s.send_info(&[0; INFO], "server: write done")?;
        *pings += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_buffers_are_rpings() {
        let b = start_text(0, 65, 32);
        assert_eq!(&b[..], b"rdma-ping-0: ABCDEFGHIJKLMNOPQR\0");
        // The letters run A..z and wrap to A.
        let b = start_text(7, 121, 20);
        assert_eq!(&b[..], b"rdma-ping-7: yzABCD\0");
        assert_eq!(start_text(123_456_789, 65, 16).len(), 16);
    }

    #[test]
    fn messages_are_big_endian_address_rkey_length() {
        let m = info(0x0102_0304_0506_0708, 0x0a0b_0c0d, 64);
        assert_eq!(m, [1, 2, 3, 4, 5, 6, 7, 8, 0xa, 0xb, 0xc, 0xd, 0, 0, 0, 64]);
        assert_eq!(
            parse_info(&m),
            Some((0x0102_0304_0506_0708, 0x0a0b_0c0d, 64))
        );
        assert_eq!(parse_info(&m[..15]), None);
    }
}
