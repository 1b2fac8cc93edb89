//! `rocectl pingpong`: ibv_rc_pingpong's test on a ferroce node, with its connection exchange,
//! so that the peer can be an unmodified `ibv_rc_pingpong` (or another `rocectl pingpong`);
//! with `--ud`, ibv_ud_pingpong's (UD QPs, Q_Key 0x11111111, the same exchange).
//!
//! The exchange (rdma-core's `libibverbs/examples/rc_pingpong.c`, TCP 18515): the client
//! writes `"%04x:%06x:%06x:%s"` (LID, QPN, PSN, the GID as 32 hex digits) and a NUL, 52 bytes;
//! the server reads it, connects its QP, answers with its own; the client connects and writes
//! `done\0`. Then the client SENDs first and each side SENDs when the other's message has
//! arrived, `-n` times: the SEND ping-pong of `rocectl perf send lat`, run by the QP's lcore.

use crate::ctl::{Client, Fail};
use crate::perftest::{Dest, OobError, Role};
use crate::setup::{GRH, Resources, connect_oob, connect_qp, local_gid, post_receives, random_psn};
use clap::Args;
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv6Addr};

/// Bytes of the address message, its NUL included.
pub const MSG: usize = 52;

/// `rocectl pingpong [--server | PEER]`.
#[derive(Debug, Args)]
pub struct PingpongArgs {
    /// The server's host (run as the client); without it, --server.
    #[arg(required_unless_present = "server", conflicts_with = "server")]
    pub peer: Option<String>,
    /// Wait for a client.
    #[arg(long)]
    pub server: bool,
    /// TCP port of the connection exchange.
    #[arg(long, short = 'p', default_value_t = crate::perftest::PORT)]
    pub oob_port: u16,
    /// Message size in bytes (K, M suffixes).
    #[arg(long, short = 's', value_parser = crate::ctl::parse_size, default_value = "4096")]
    pub size: u64,
    /// Exchanges.
    #[arg(long, short = 'n', default_value_t = 1000)]
    pub iters: u64,
    /// Receives kept posted.
    #[arg(long, short = 'r', default_value_t = 500)]
    pub rx_depth: u64,
    /// Path MTU: 256, 512, 1024, 2048 or 4096 (both sides must ask for the same).
    #[arg(long, short = 'm', default_value_t = 1024)]
    pub mtu: u32,
    /// The node's port to use.
    #[arg(long, default_value_t = 0)]
    pub port: usize,
    /// GID index in the port's table (1: the first IPv4 address, as on rxe).
    #[arg(long, short = 'g', default_value_t = 1)]
    pub gid_index: usize,
    /// Seconds to wait for the peer's connection exchange.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// ibv_ud_pingpong's test: UD QPs, messages of at most the port's MTU (--mtu does not
    /// apply), each received after the 40-byte GRH.
    #[arg(long)]
    pub ud: bool,
}

/// ibv_ud_pingpong's Q_Key.
pub const UD_QKEY: u32 = 0x1111_1111;

/// One side's address message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addr {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// First PSN it sends.
    pub psn: u32,
    /// Its GID.
    pub gid: Ipv6Addr,
}

impl Addr {
    /// The 52-byte message.
    pub fn to_wire(&self) -> [u8; MSG] {
        let gid: String = self
            .gid
            .octets()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let s = format!(
            "{:04x}:{:06x}:{:06x}:{gid}",
            self.lid,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff
        );
        let mut m = [0u8; MSG];
        m[..s.len()].copy_from_slice(s.as_bytes());
        m
    }

    /// Parses the peer's message.
    pub fn parse(m: &[u8]) -> Result<Addr, OobError> {
        let bad = || OobError::Malformed {
            what: "address message",
            got: String::from_utf8_lossy(m).into_owned(),
        };
        let text = m.split(|&b| b == 0).next().unwrap_or_default();
        let text = std::str::from_utf8(text).map_err(|_| bad())?;
        let f: Vec<&str> = text.split(':').collect();
        let widths = [4, 6, 6, 32];
        if f.len() != 4 || f.iter().zip(widths).any(|(x, w)| x.len() != w) {
            return Err(bad());
        }
        let hex = |s: &str| u32::from_str_radix(s, 16).map_err(|_| bad());
        let g = u128::from_str_radix(f[3], 16).map_err(|_| bad())?;
        Ok(Addr {
            lid: hex(f[0])? as u16,
            qpn: hex(f[1])?,
            psn: hex(f[2])?,
            gid: Ipv6Addr::from(g),
        })
    }
}

/// rc_pingpong's exchange over `s`: `connect(remote)` takes our QP to RTS (the server does so
/// before answering, as rc_pingpong does); the peer's address.
pub fn exchange<S: Read + Write, E: From<OobError>>(
    s: &mut S,
    role: Role,
    mine: &Addr,
    connect: impl FnOnce(&Addr) -> Result<(), E>,
) -> Result<Addr, E> {
    let mut theirs = [0u8; MSG];
    let io = |e: std::io::Error| E::from(OobError::Io(e));
    match role {
        Role::Client => {
            s.write_all(&mine.to_wire()).map_err(io)?;
            s.flush().map_err(io)?;
            s.read_exact(&mut theirs).map_err(io)?;
            let remote = Addr::parse(&theirs)?;
            connect(&remote)?;
            s.write_all(b"done\0").map_err(io)?;
            s.flush().map_err(io)?;
            Ok(remote)
        }
        Role::Server => {
            s.read_exact(&mut theirs).map_err(io)?;
            let remote = Addr::parse(&theirs)?;
            connect(&remote)?;
            s.write_all(&mine.to_wire()).map_err(io)?;
            s.flush().map_err(io)?;
            let mut done = [0u8; 5];
            s.read_exact(&mut done).map_err(io)?;
            if &done != b"done\0" {
                return Err(E::from(OobError::Malformed {
                    what: "closing message",
                    got: String::from_utf8_lossy(&done).into_owned(),
                }));
            }
            Ok(remote)
        }
    }
}

/// Runs the ping-pong; prints rc_pingpong's lines (or JSON).
pub(crate) fn pingpong(
    c: &Client,
    a: &PingpongArgs,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, Fail> {
    if crate::perftest::mtu_enum(a.mtu).is_none() {
        return Err(Fail(2, "--mtu is 256, 512, 1024, 2048 or 4096".into()));
    }
    if a.iters == 0 || a.size == 0 || a.rx_depth == 0 {
        return Err(Fail(
            2,
            "--size, --iters and --rx-depth must be above 0".into(),
        ));
    }
    let gid = local_gid(c, a.port, a.gid_index)?;
    let rx_depth = a.rx_depth.min(a.iters);
    if a.ud {
        return ud_pingpong(c, a, gid, rx_depth, json, out);
    }
    let (_made, buf, qpn) = Resources::create(c, a.size, 16, rx_depth, 0)?;
    let mine = Addr {
        lid: 0,
        qpn,
        psn: random_psn(),
        gid,
    };
    let (mut stream, role) = connect_oob(a.peer.as_deref(), a.oob_port, a.timeout)?;
    let remote = exchange(&mut stream, role, &mine, |r: &Addr| {
        let d = Dest {
            lid: r.lid,
            out_reads: 1,
            qpn: r.qpn,
            psn: r.psn,
            rkey: 0,
            vaddr: 0,
            gid: r.gid,
            srqn: 0,
        };
        // rc_pingpong's: one READ/atomic, ACK timeout code 14.
        connect_qp(c, qpn, &d, (mine.psn, a.mtu, 1, 14))?;
        post_receives(c, qpn, &buf, rx_depth)
    })?;
    let wr = json!({"wr_id": 1, "opcode": "send", "sge": buf.sge(buf.addr)});
    let recv = buf.sge(buf.addr + buf.half);
    let (posted, elapsed_ns) = run(c, a, qpn, wr, recv, role, rx_depth)?;
    report(a, role, &mine, &remote, posted, elapsed_ns, json, out)
}

/// ibv_ud_pingpong: a UD QP taken to RTS (Q_Key [`UD_QKEY`]) with its receives posted before
/// the exchange, which is rc_pingpong's; each message goes to the peer's QPN and GID.
fn ud_pingpong(
    c: &Client,
    a: &PingpongArgs,
    gid: Ipv6Addr,
    rx_depth: u64,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, Fail> {
    let (_made, buf, qpn) = Resources::create_ud(c, a.size + GRH, 16, rx_depth)?;
    let psn = random_psn();
    let modify = |body: Value| c.call("POST", &format!("/v1/qps/{qpn}/modify"), Some(body));
    let q = modify(json!({"state": "INIT", "qkey": UD_QKEY, "port": a.port}))?;
    let mtu = q["path-mtu"].as_u64().unwrap_or(0);
    if a.size > mtu {
        return Err(Fail(
            2,
            format!(
                "--size {} is more than a UD message may carry on port {} ({mtu} bytes, the MTU)",
                a.size, a.port
            ),
        ));
    }
    modify(json!({"state": "RTR"}))?;
    modify(json!({"state": "RTS", "local_psn": psn}))?;
    let recv = json!([{"addr": buf.addr + buf.half, "length": a.size + GRH, "lkey": buf.lkey}]);
    for i in 0..rx_depth {
        c.call(
            "POST",
            &format!("/v1/qps/{qpn}/recv"),
            Some(json!({"wr_id": 1_000_000 + i, "sge": recv})),
        )?;
    }
    let mine = Addr {
        lid: 0,
        qpn,
        psn,
        gid,
    };
    let (mut stream, role) = connect_oob(a.peer.as_deref(), a.oob_port, a.timeout)?;
    let remote = exchange(&mut stream, role, &mine, |_: &Addr| Ok::<(), Fail>(()))?;
    let rgid = IpAddr::V6(remote.gid).to_canonical();
    let wr = json!({"wr_id": 1, "opcode": "send",
        "sge": [{"addr": buf.addr, "length": a.size, "lkey": buf.lkey}],
        "ud": {"remote_gid": rgid.to_string(), "remote_qpn": remote.qpn, "remote_qkey": UD_QKEY}});
    let (posted, elapsed_ns) = run(c, a, qpn, wr, recv, role, rx_depth)?;
    report(a, role, &mine, &remote, posted, elapsed_ns, json, out)
}

/// Prints rc_pingpong's (and ud_pingpong's) lines, or JSON.
#[allow(clippy::too_many_arguments)]
fn report(
    a: &PingpongArgs,
    role: Role,
    mine: &Addr,
    remote: &Addr,
    posted: usize,
    elapsed_ns: u64,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, Fail> {
    let io = |e: std::io::Error| Fail(2, e.to_string());
    let secs = elapsed_ns as f64 / 1e9;
    let usec = elapsed_ns as f64 / 1e3;
    let bytes = a.size * a.iters * 2;
    if json {
        let v = json!({"role": match role { Role::Client => "client", Role::Server => "server" },
            "type": if a.ud { "UD" } else { "RC" },
            "local": addr_json(mine), "remote": addr_json(remote), "bytes": bytes,
            "iterations": a.iters, "seconds": secs, "mbit_s": bytes as f64 * 8.0 / usec,
            "usec_per_iter": usec / a.iters as f64, "posted": posted});
        writeln!(out, "{v}").map_err(io)?;
        return Ok(0);
    }
    for (what, x) in [("local address: ", mine), ("remote address:", remote)] {
        writeln!(
            out,
            "  {what} LID {:#06x}, QPN {:#08x}, PSN {:#08x}, GID {}",
            x.lid,
            x.qpn,
            x.psn,
            IpAddr::V6(x.gid)
        )
        .map_err(io)?;
    }
    writeln!(
        out,
        "{bytes} bytes in {secs:.2} seconds = {:.2} Mbit/sec",
        bytes as f64 * 8.0 / usec
    )
    .map_err(io)?;
    writeln!(
        out,
        "{} iters in {secs:.2} seconds = {:.2} usec/iter",
        a.iters,
        usec / a.iters as f64
    )
    .map_err(io)?;
    Ok(0)
}

fn addr_json(a: &Addr) -> Value {
    json!({"lid": a.lid, "qpn": a.qpn, "psn": a.psn, "gid": a.gid.to_string()})
}

/// The SEND ping-pong on the QP's lcore (`wr` each turn, receives of `recv` kept posted):
/// iterations posted, and its duration in ns.
fn run(
    c: &Client,
    a: &PingpongArgs,
    qpn: u32,
    wr: Value,
    recv: Value,
    role: Role,
    rx_depth: u64,
) -> Result<(usize, u64), Fail> {
    let body = json!({"test": "send", "iters": a.iters, "server": role == Role::Server,
        "wr": wr, "recv": recv, "rx_depth": rx_depth, "timeout_ms": 600_000});
    let r = c.call("POST", &format!("/v1/qps/{qpn}/latency"), Some(body))?;
    let posted = r["posted_ns"].as_array().map_or(0, Vec::len);
    let errors = r["errors"].as_u64().unwrap_or(0);
    if errors > 0 || posted as u64 != a.iters {
        return Err(Fail(
            1,
            format!(
                "the ping-pong failed after {posted} of {} sends: {}",
                a.iters,
                r["failure"].as_str().unwrap_or("no reason given")
            ),
        ));
    }
    Ok((posted, r["elapsed_ns"].as_u64().unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_messages_are_rc_pingpongs() {
        // The client's message in tests/data/rxe/rc_pingpong.pcap.
        let seen = b"0000:000011:de8ea3:00000000000000000000ffff0ae9000a\0";
        assert_eq!(seen.len(), MSG);
        let a = Addr::parse(seen).unwrap();
        assert_eq!(
            a,
            Addr {
                lid: 0,
                qpn: 0x11,
                psn: 0xde8ea3,
                gid: "::ffff:10.233.0.10".parse().unwrap()
            }
        );
        assert_eq!(&a.to_wire()[..], &seen[..]);
        for bad in [
            &b"0000:000011:de8ea3\0"[..],
            b"0000:000011:de8ea3:00000000000000000000ffff0ae9000\0",
            b"000g:000011:de8ea3:00000000000000000000ffff0ae9000a\0",
        ] {
            assert!(Addr::parse(bad).is_err());
        }
    }

    /// Plays each role against the other side's bytes of the capture.
    #[test]
    fn exchange_replays_against_rc_pingpong() {
        let client = b"0000:000011:de8ea3:00000000000000000000ffff0ae9000a\0".to_vec();
        let server = b"0000:000011:2342dd:00000000000000000000ffff0ae9000b\0".to_vec();
        let mine = Addr {
            lid: 0,
            qpn: 0x99,
            psn: 1,
            gid: "::ffff:10.233.0.1".parse().unwrap(),
        };
        struct S(std::io::Cursor<Vec<u8>>, Vec<u8>);
        impl Read for S {
            fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
                self.0.read(b)
            }
        }
        impl Write for S {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.1.extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut input = client.clone();
        input.extend_from_slice(b"done\0");
        let mut s = S(std::io::Cursor::new(input), Vec::new());
        let mut connected = None;
        let r = exchange::<_, OobError>(&mut s, Role::Server, &mine, |r| {
            connected = Some(*r);
            Ok(())
        })
        .unwrap();
        assert_eq!(r.psn, 0xde8ea3);
        assert_eq!(connected, Some(r), "the server connects before it answers");
        assert_eq!(s.1.len(), MSG);
        let mut s = S(std::io::Cursor::new(server), Vec::new());
        let r = exchange::<_, OobError>(&mut s, Role::Client, &mine, |_| Ok(())).unwrap();
        assert_eq!(r.gid, "::ffff:10.233.0.11".parse::<Ipv6Addr>().unwrap());
        assert_eq!(s.1.len(), MSG + 5);
        assert_eq!(&s.1[MSG..], b"done\0");
    }
}
