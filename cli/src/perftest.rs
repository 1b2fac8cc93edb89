//! perftest's out-of-band connection exchange (TCP, port 18515), so that `rocectl perf` and an
//! unmodified `ib_write_bw` (and its siblings) can set up a test with each other.
//!
//! perftest (4.5, which reports version "6.06") runs the exchange in lockstep: for every message
//! the client writes first and the server reads first, and both sides send the same message
//! kinds in the same order:
//!
//! 1. the version, 16 bytes, NUL-padded;
//! 2. (remote version >= 5.32) the cycle buffer (page size) and the cache-line size, 4-byte
//!    big-endian ints;
//! 3. (>= 5.31) the MTU as the `ibv_mtu` enum in decimal, 2 bytes (`"3\0"` is 1024); both use
//!    the smaller;
//! 4. the QP's keys, 108 bytes of text ([`Dest`]), once per QP and then again as a barrier: a
//!    WRITE, READ or ATOMIC bandwidth test sends them 3 times before traffic, once after it and
//!    once on closing; SEND bandwidth and every latency test 4 times before traffic and once
//!    on closing, except WRITE latency, which closes without a word;
//! 5. (WRITE, READ and ATOMIC bandwidth tests) the client's results, 8-byte big-endian fields
//!    (size, iterations, peak, average, message rate), which the server prints as its own;
//! 6. `done\0` each way.
//!
//! The byte sequences are those of `tests/data/perftest/*.pcap` (captures of perftest between
//! two Linux Soft-RoCE hosts); the tests replay them.

use std::io::{Read, Write};
use std::net::Ipv6Addr;

/// The version ferroce announces: perftest 4.5's.
pub const VERSION: &str = "6.06";
/// perftest's default port.
pub const PORT: u16 = 18515;
/// Bytes of a key message with a GID (KEY_MSG_SIZE_GID).
pub const KEY_MSG: usize = 108;
/// Bytes of a key message over an RDMA CM connection (`-R`): `struct pingpong_dest` itself.
pub const CM_KEY_MSG: usize = 56;
/// Keys a client sends ahead of the server's answers (256 x 108 B = 27 KiB in flight).
pub const KEYS_AHEAD: usize = 256;

/// What went wrong in the exchange.
#[derive(Debug, thiserror::Error)]
pub enum OobError {
    /// The socket failed or closed early.
    #[error("out-of-band connection: {0}")]
    Io(#[from] std::io::Error),
    /// The peer sent something that is not perftest's.
    #[error("the peer's {what} is not perftest's: {got:?}")]
    Malformed {
        /// Which message.
        what: &'static str,
        /// What came, as text.
        got: String,
    },
}

/// Which side of the exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Connects, and writes first.
    Client,
    /// Listens, and reads first.
    Server,
}

/// One QP's keys as perftest exchanges them (`struct pingpong_dest`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// READs/atomics the QP lets the peer have outstanding (max_dest_rd_atomic it will set).
    pub out_reads: u16,
    /// QP number.
    pub qpn: u32,
    /// First PSN it sends.
    pub psn: u32,
    /// The remote key of its buffer (0 for SEND tests).
    pub rkey: u32,
    /// Its buffer's address.
    pub vaddr: u64,
    /// Its GID.
    pub gid: Ipv6Addr,
    /// SRQ number (0 without SRQ).
    pub srqn: u32,
}

impl Dest {
    /// The 108-byte message: `lid:out_reads:qpn:psn:rkey:vaddr:` in hex, the 16 GID bytes as
    /// `%02x:`, the SRQN, then a NUL.
    pub fn to_wire(&self) -> [u8; KEY_MSG] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff,
            self.rkey,
            self.vaddr
        );
        for b in self.gid.octets() {
            s.push_str(&format!("{b:02x}:"));
        }
        s.push_str(&format!("{:08x}:", self.srqn));
        let mut m = [0u8; KEY_MSG];
        m[..s.len()].copy_from_slice(s.as_bytes());
        m
    }

    /// The 56-byte message of perftest's `-R` exchange: `struct pingpong_dest` in big-endian
    /// (lid, out_reads, qpn, psn, rkey as u32s, 4 bytes of padding, vaddr u64, the GID, srqn
    /// and gid_index u32s), as `rdma_write_keys` SENDs it.
    pub fn to_cm_wire(&self, gid_index: u32) -> [u8; CM_KEY_MSG] {
        let mut m = [0u8; CM_KEY_MSG];
        m[0..4].copy_from_slice(&u32::from(self.lid).to_be_bytes());
        m[4..8].copy_from_slice(&u32::from(self.out_reads).to_be_bytes());
        m[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        m[12..16].copy_from_slice(&self.psn.to_be_bytes());
        m[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        m[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        m[32..48].copy_from_slice(&self.gid.octets());
        m[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        m[52..56].copy_from_slice(&gid_index.to_be_bytes());
        m
    }

    /// Parses a `-R` key message ([`Dest::to_cm_wire`]); the padding and gid_index are not
    /// kept (perftest's `rdma_read_keys` drops them too).
    pub fn parse_cm(m: &[u8]) -> Result<Dest, OobError> {
        let m: &[u8; CM_KEY_MSG] = m.try_into().map_err(|_| OobError::Malformed {
            what: "key message",
            got: format!("{} bytes where perftest sends {CM_KEY_MSG}", m.len()),
        })?;
        let u32_at = |i: usize| u32::from_be_bytes([m[i], m[i + 1], m[i + 2], m[i + 3]]);
        let bad = |what: &str, v: u32| OobError::Malformed {
            what: "key message",
            got: format!("{what} {v:#x} does not fit perftest's 16 bits"),
        };
        let mut vaddr = [0u8; 8];
        vaddr.copy_from_slice(&m[24..32]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&m[32..48]);
        Ok(Dest {
            lid: u16::try_from(u32_at(0)).map_err(|_| bad("lid", u32_at(0)))?,
            out_reads: u16::try_from(u32_at(4)).map_err(|_| bad("out_reads", u32_at(4)))?,
            qpn: u32_at(8) & 0xff_ffff,
            psn: u32_at(12) & 0xff_ffff,
            rkey: u32_at(16),
            vaddr: u64::from_be_bytes(vaddr),
            gid: Ipv6Addr::from(gid),
            srqn: u32_at(48),
        })
    }

    /// Parses a key message (with or without the GID part).
    pub fn parse(m: &[u8]) -> Result<Dest, OobError> {
        let text = m.split(|&b| b == 0).next().unwrap_or_default();
        let bad = || OobError::Malformed {
            what: "key message",
            got: String::from_utf8_lossy(m).into_owned(),
        };
        let text = std::str::from_utf8(text).map_err(|_| bad())?;
        let f: Vec<&str> = text.split(':').collect();
        // Six fields, 16 GID bytes, the SRQN, and the empty piece after the last ':'.
        if f.len() != 24 || !f[23].is_empty() {
            return Err(bad());
        }
        let hex = |s: &str, max_len: usize| -> Result<u64, OobError> {
            if s.is_empty() || s.len() > max_len {
                return Err(bad());
            }
            u64::from_str_radix(s, 16).map_err(|_| bad())
        };
        let mut gid = [0u8; 16];
        for (g, s) in gid.iter_mut().zip(&f[6..22]) {
            *g = hex(s, 2)? as u8;
        }
        Ok(Dest {
            lid: hex(f[0], 4)? as u16,
            out_reads: hex(f[1], 4)? as u16,
            qpn: hex(f[2], 6)? as u32,
            psn: hex(f[3], 6)? as u32,
            rkey: hex(f[4], 8)? as u32,
            vaddr: hex(f[5], 16)?,
            gid: Ipv6Addr::from(gid),
            srqn: hex(f[22], 8)? as u32,
        })
    }
}

/// A bandwidth test's results as the client sends them to the server (`struct bw_report_data`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BwReport {
    /// Message size, bytes.
    pub size: u64,
    /// Iterations.
    pub iters: u64,
    /// Peak bandwidth, MB/s.
    pub bw_peak: f64,
    /// Average bandwidth, MB/s.
    pub bw_avg: f64,
    /// Message rate, Mpps.
    pub msg_rate: f64,
}

/// The `ibv_mtu` enum value of a path MTU in bytes (1 = 256 ... 5 = 4096).
pub fn mtu_enum(bytes: u32) -> Option<u8> {
    match bytes {
        256 => Some(1),
        512 => Some(2),
        1024 => Some(3),
        2048 => Some(4),
        4096 => Some(5),
        _ => None,
    }
}

/// The path MTU in bytes of an `ibv_mtu` enum value.
pub fn mtu_bytes(e: u8) -> Option<u32> {
    (1..=5).contains(&e).then(|| 128u32 << e)
}

/// A stream perftest's exchange runs on. TCP also bounds the wait for the peer's last
/// message (see [`Oob::done`]); other streams (captures in tests) need not.
pub trait OobStream: Read + Write {
    /// Wait at most `d` for each later read.
    fn wait_at_most(&mut self, _d: std::time::Duration) {}
}

impl OobStream for std::net::TcpStream {
    fn wait_at_most(&mut self, d: std::time::Duration) {
        let _ = self.set_read_timeout(Some(d));
    }
}

/// How long [`Oob::done`] waits for the peer's `done`.
pub const CLOSING_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The exchange over one connected stream.
#[derive(Debug)]
pub struct Oob<S> {
    s: S,
    role: Role,
    /// Over an RDMA CM connection (`-R`): binary keys with this GID index, every message in
    /// lockstep, no closing `done`.
    cm: Option<u32>,
    /// The peer's version, once exchanged.
    pub remote_version: f64,
}

impl<S: OobStream> Oob<S> {
    /// The exchange over `s`, as `role`.
    pub fn new(s: S, role: Role) -> Self {
        Oob {
            s,
            role,
            cm: None,
            remote_version: 0.0,
        }
    }

    /// The exchange of perftest's `-R` over `s`, a stream of SENDs on an RDMA CM connection
    /// (see [`Dest::to_cm_wire`]); `gid_index` is the one our keys name.
    pub fn over_cm(s: S, role: Role, gid_index: u32) -> Self {
        Oob {
            cm: Some(gid_index),
            ..Oob::new(s, role)
        }
    }

    /// Which side we are.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Whether the exchange runs over an RDMA CM connection.
    pub fn is_cm(&self) -> bool {
        self.cm.is_some()
    }

    /// One message each way, in perftest's order (the client writes first); the peer's must
    /// be `theirs.len()` bytes.
    fn xchg(&mut self, mine: &[u8], theirs: &mut [u8]) -> Result<(), OobError> {
        match self.role {
            Role::Client => {
                self.s.write_all(mine)?;
                self.s.flush()?;
                self.s.read_exact(theirs)?;
            }
            Role::Server => {
                self.s.read_exact(theirs)?;
                self.s.write_all(mine)?;
                self.s.flush()?;
            }
        }
        Ok(())
    }

    /// Steps 1-3: versions, buffer sizes and MTU; returns the MTU both use, in bytes.
    pub fn setup(&mut self, mtu: u32) -> Result<u32, OobError> {
        let mut v = [0u8; 16];
        v[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
        let mut theirs = [0u8; 16];
        self.xchg(&v, &mut theirs)?;
        let text = String::from_utf8_lossy(theirs.split(|&b| b == 0).next().unwrap_or_default())
            .into_owned();
        self.remote_version = text.trim().parse().map_err(|_| OobError::Malformed {
            what: "version",
            got: text.clone(),
        })?;
        if self.remote_version >= 5.32 {
            let mut x = [0u8; 4];
            self.xchg(&4096u32.to_be_bytes(), &mut x)?;
            self.xchg(&64u32.to_be_bytes(), &mut x)?;
        }
        let mut agreed = mtu;
        if self.remote_version >= 5.31 {
            let mine = mtu_enum(mtu).unwrap_or(3);
            let mut theirs = [0u8; 2];
            self.xchg(&[b'0' + mine, 0], &mut theirs)?;
            let e = theirs[0].wrapping_sub(b'0');
            let remote =
                mtu_bytes(e)
                    .filter(|_| theirs[1] == 0)
                    .ok_or_else(|| OobError::Malformed {
                        what: "MTU",
                        got: String::from_utf8_lossy(&theirs).into_owned(),
                    })?;
            agreed = agreed.min(remote);
        }
        Ok(agreed)
    }

    /// Step 4: our keys for theirs (also the barrier perftest repeats).
    pub fn keys(&mut self, mine: &Dest) -> Result<Dest, OobError> {
        if let Some(gid_index) = self.cm {
            let mut theirs = [0u8; CM_KEY_MSG];
            self.xchg(&mine.to_cm_wire(gid_index), &mut theirs)?;
            return Dest::parse_cm(&theirs);
        }
        let mut theirs = [0u8; KEY_MSG];
        self.xchg(&mine.to_wire(), &mut theirs)?;
        Dest::parse(&theirs)
    }

    /// `-R`'s barrier before the QPs have keys: perftest's all-zero `struct pingpong_dest`
    /// each way (what comes back is not looked at, as perftest does not).
    pub fn zero_barrier(&mut self) -> Result<(), OobError> {
        let mut theirs = [0u8; CM_KEY_MSG];
        self.xchg(&[0u8; CM_KEY_MSG], &mut theirs)
    }

    /// Step 4 for many QPs: one key each way per QP, in perftest's order. The client keeps up
    /// to [`KEYS_AHEAD`] keys in flight instead of waiting a round trip for each (the server
    /// still reads one, then writes one), so 100k QPs exchange in one stream's time; the
    /// window stays well inside the sockets' buffers, so neither side can block the other.
    pub fn keys_many(&mut self, mine: &[Dest]) -> Result<Vec<Dest>, OobError> {
        let mut theirs = Vec::with_capacity(mine.len());
        let mut msg = [0u8; KEY_MSG];
        // A CM connection's peer keeps one receive posted: one key each way at a time.
        match (self.role, self.cm) {
            (Role::Server, _) | (_, Some(_)) => {
                for d in mine {
                    theirs.push(self.keys(d)?);
                }
            }
            (Role::Client, None) => {
                let mut sent = 0;
                for i in 0..mine.len() {
                    while sent < mine.len() && sent < i + KEYS_AHEAD {
                        self.s.write_all(&mine[sent].to_wire())?;
                        sent += 1;
                    }
                    self.s.flush()?;
                    self.s.read_exact(&mut msg)?;
                    theirs.push(Dest::parse(&msg)?);
                }
            }
        }
        Ok(theirs)
    }

    /// Step 5: the client's results for the server's (the server's are meaningless in a
    /// half-duplex test; perftest's server sends whatever its report holds).
    pub fn reports(&mut self, mine: &BwReport) -> Result<BwReport, OobError> {
        let mut x = [0u8; 8];
        let mut next = |me: &mut Self, v: u64| -> Result<u64, OobError> {
            me.xchg(&v.to_be_bytes(), &mut x)?;
            Ok(u64::from_be_bytes(x))
        };
        let size = next(self, mine.size)?;
        let iters = if self.remote_version >= 5.33 {
            next(self, mine.iters)?
        } else {
            0
        };
        let bw_peak = f64::from_bits(next(self, mine.bw_peak.to_bits())?);
        let bw_avg = f64::from_bits(next(self, mine.bw_avg.to_bits())?);
        let msg_rate = f64::from_bits(next(self, mine.msg_rate.to_bits())?);
        Ok(BwReport {
            size,
            iters,
            bw_peak,
            bw_avg,
            msg_rate,
        })
    }

    /// Step 6: `done\0` each way (both write first: perftest's two sides do not agree on an
    /// order here).
    pub fn done(&mut self) -> Result<(), OobError> {
        self.s.write_all(b"done\0")?;
        self.s.flush()?;
        self.s.wait_at_most(CLOSING_WAIT);
        let mut d = [0u8; 5];
        match self.s.read_exact(&mut d) {
            Ok(()) => {}
            // perftest's server writes its "done" and closes without waiting for ours; when
            // its segment was lost, ours reaches a closed socket and the reset (or the end of
            // the stream) can arrive before the retransmitted "done". A peer that closes with
            // our "done" unread resets instead of sending its own, and a lost reset is never
            // sent again: then nothing comes at all (the interop suite's ECN case, which drops
            // a fifth of the peer's TCP segments, hung here once). Everything the test needs
            // was exchanged before this message, so a close, or [`CLOSING_WAIT`] of silence,
            // is the end of it.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::UnexpectedEof
                        | std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
        if &d != b"done\0" {
            return Err(OobError::Malformed {
                what: "closing message",
                got: String::from_utf8_lossy(&d).into_owned(),
            });
        }
        Ok(())
    }
}

/// Which perftest test the exchange brackets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Test {
    /// ib_write_bw.
    Write,
    /// ib_read_bw.
    Read,
    /// ib_send_bw.
    Send,
    /// ib_atomic_bw.
    Atomic,
}

impl Test {
    /// perftest's `out_reads` for it: READs and atomics let the peer have 16 (our
    /// max_dest_rd_atomic) outstanding, WRITE and SEND 1.
    pub fn out_reads(self) -> u16 {
        match self {
            Test::Read | Test::Atomic => 16,
            Test::Write | Test::Send => 1,
        }
    }
}

/// What a bandwidth test's exchange gave.
#[derive(Clone, Debug, PartialEq)]
pub struct BwOutcome {
    /// The path MTU both use.
    pub mtu: u32,
    /// The peer's keys, one per QP.
    pub remote: Vec<Dest>,
    /// The client's results (the client's own, or on a server of a WRITE, READ or ATOMIC test
    /// the ones it was sent; None on a SEND server, which measures for itself).
    pub report: Option<BwReport>,
}

/// What a latency test's exchange gave.
#[derive(Clone, Debug, PartialEq)]
pub struct LatOutcome<R> {
    /// The path MTU both use.
    pub mtu: u32,
    /// The peer's keys.
    pub remote: Dest,
    /// Our run's result (None on a READ or ATOMIC server, which only answers).
    pub result: Option<R>,
}

/// Runs perftest's exchange around one latency test on one QP: `connect(mtu, remote)` once
/// the keys are known, `ready()` on both sides before the last barrier ahead of traffic (SEND
/// posts its receives there), `run(remote)` the test (both sides of WRITE and SEND
/// ping-pongs; the client of READ and ATOMIC).
pub fn lat_exchange<S: OobStream, E: From<OobError>, R>(
    oob: &mut Oob<S>,
    test: Test,
    mtu: u32,
    mine: &Dest,
    connect: impl FnOnce(u32, &Dest) -> Result<(), E>,
    ready: impl FnOnce() -> Result<(), E>,
    run: impl FnOnce(&Dest) -> Result<R, E>,
) -> Result<LatOutcome<R>, E> {
    let mtu = oob.setup(mtu)?;
    let remote = oob.keys(mine)?;
    connect(mtu, &remote)?;
    oob.keys(mine)?;
    oob.keys(mine)?;
    ready()?;
    oob.keys(mine)?;
    let both = matches!(test, Test::Write | Test::Send);
    let result = if both || oob.role == Role::Client {
        Some(run(&remote)?)
    } else {
        None
    };
    if test != Test::Write {
        oob.keys(mine)?;
        oob.done()?;
    }
    Ok(LatOutcome {
        mtu,
        remote,
        result,
    })
}

/// Runs perftest's exchange around one bandwidth test on one QP: `connect(mtu, remote)` moves
/// our QP to RTS once the keys are known, `ready()` runs on the server just before the last
/// barrier ahead of traffic (a SEND server posts its receives there), and `run()` is the test
/// itself (the client's, and a SEND server's) towards the peer's keys, giving our results.
///
/// With several QPs (`mine` has one `Dest` each) the keys go per QP, in order, twice: once
/// before the QPs connect and once after (perftest prints, and uses, the second round's),
/// with one barrier on the first QP's keys between the rounds for SEND; the barriers after
/// use the first QP's keys. That is perftest 4.5's `-q` on the wire (a capture of two
/// Soft-RoCE hosts running `ib_write_bw -q 2` and `ib_send_bw -q 2`); with one QP it is the
/// three exchanges before traffic (four for SEND) that every perftest test makes.
///
/// Over an RDMA CM connection (perftest's `-R`, [`Oob::over_cm`]) the test QPs connect
/// through the CM instead, before any keys: `connect(mtu, &[])` runs between two barriers of
/// all-zero keys (perftest's `create_rdma_cm_connection` syncs before and after connecting),
/// the keys that follow are only printed and checked, and there is no closing `done` (rxe's
/// `tests/data/rxe/write_bw_cm.pcap`).
pub fn bw_exchange<S: OobStream, E: From<OobError>>(
    oob: &mut Oob<S>,
    test: Test,
    mtu: u32,
    all: &[Dest],
    connect: impl FnOnce(u32, &[Dest]) -> Result<(), E>,
    ready: impl FnOnce() -> Result<(), E>,
    run: impl FnOnce(&[Dest]) -> Result<BwReport, E>,
) -> Result<BwOutcome, E> {
    let mine = all.first().ok_or_else(|| {
        E::from(OobError::Malformed {
            what: "local keys",
            got: "no QP".into(),
        })
    })?;
    let mtu = oob.setup(mtu)?;
    let remote = if oob.is_cm() {
        oob.zero_barrier()?;
        connect(mtu, &[])?;
        oob.zero_barrier()?;
        oob.keys_many(all)?
    } else {
        let remote = oob.keys_many(all)?;
        connect(mtu, &remote)?;
        remote
    };
    if test == Test::Send {
        oob.keys(mine)?;
    }
    let again = oob.keys_many(all)?;
    if again != remote {
        return Err(E::from(OobError::Malformed {
            what: "second round of keys",
            got: format!("{} keys that differ from the first round's", again.len()),
        }));
    }
    if oob.role == Role::Server {
        ready()?;
    }
    oob.keys(mine)?;
    let report = match (oob.role, test) {
        (Role::Client, Test::Send) => Some(run(&remote)?),
        (Role::Client, _) => {
            let r = run(&remote)?;
            oob.keys(mine)?;
            oob.reports(&r)?;
            Some(r)
        }
        (Role::Server, Test::Send) => Some(run(&remote)?),
        (Role::Server, _) => {
            // perftest's server waits in this barrier while the client runs.
            oob.keys(mine)?;
            Some(oob.reports(&BwReport {
                size: 0,
                iters: 0,
                bw_peak: 0.0,
                bw_avg: 0.0,
                msg_rate: 0.0,
            })?)
        }
    };
    oob.keys(mine)?;
    if !oob.is_cm() {
        oob.done()?;
    }
    Ok(BwOutcome {
        mtu,
        remote,
        report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// A stream that reads what one side of a capture sent and keeps what we write.
    struct Replay {
        input: Cursor<Vec<u8>>,
        output: Vec<u8>,
    }

    impl OobStream for Replay {}

    impl Read for Replay {
        fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
            self.input.read(b)
        }
    }

    impl Write for Replay {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.output.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The TCP payload bytes of a capture (a name in tests/data/rxe, or a path), client to
    /// server (to port 18515) and back.
    fn tcp_streams(name: &str) -> (Vec<u8>, Vec<u8>) {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data/rxe")
            .join(name);
        let mut r = pcap_file::pcap::PcapReader::new(std::fs::File::open(path).unwrap()).unwrap();
        let (mut to_server, mut to_client) = (Vec::new(), Vec::new());
        while let Some(p) = r.next_packet() {
            let f = p.unwrap().data.into_owned();
            // Ethernet, IPv4 (no options in these captures) carrying TCP.
            if f.len() < 34 || f[12..14] != [0x08, 0x00] || f[23] != 6 {
                continue;
            }
            let ihl = (f[14] & 0xf) as usize * 4;
            let tcp = &f[14 + ihl..];
            let total = u16::from_be_bytes([f[16], f[17]]) as usize;
            let off = (tcp[12] >> 4) as usize * 4;
            let payload = &tcp[off..total - ihl];
            let dport = u16::from_be_bytes([tcp[2], tcp[3]]);
            if dport == PORT {
                to_server.extend_from_slice(payload);
            } else {
                to_client.extend_from_slice(payload);
            }
        }
        (to_server, to_client)
    }

    fn dest(qpn: u32) -> Dest {
        Dest {
            lid: 0,
            out_reads: 1,
            qpn,
            psn: 0x123456,
            rkey: 0x99,
            vaddr: 0x7f00_0000_0000,
            gid: "::ffff:10.233.0.1".parse().unwrap(),
            srqn: 0,
        }
    }

    /// Plays one role against the other role's bytes from a capture: everything the peer sent
    /// is consumed, and we sent exactly as many bytes as the peer's counterpart did.
    fn replay(name: &str, test: Test, role: Role) -> (BwOutcome, bool) {
        let (out, ran, _) = replay_qps(name, test, role, 1);
        (out, ran)
    }

    /// [`replay`] with `qps` QPs (0x77, 0x78, ...); also gives the QPNs of the keys we sent, in
    /// order, and checks that the peer's counterpart sent its QPs' keys in the same order.
    fn replay_qps(name: &str, test: Test, role: Role, qps: u32) -> (BwOutcome, bool, Vec<u32>) {
        let (to_server, to_client) = tcp_streams(name);
        let (input, theirs_out) = match role {
            Role::Server => (to_server, to_client),
            Role::Client => (to_client, to_server),
        };
        let mut oob = Oob::new(
            Replay {
                input: Cursor::new(input.clone()),
                output: Vec::new(),
            },
            role,
        );
        let mut ran = false;
        let out = bw_exchange::<_, OobError>(
            &mut oob,
            test,
            4096,
            &(0..qps).map(|i| dest(0x77 + i)).collect::<Vec<_>>(),
            |mtu, _| {
                let want = if name.starts_with("mtu4k") {
                    4096
                } else {
                    1024
                };
                assert_eq!(mtu, want, "{name}: the MTU the peer asked for");
                Ok(())
            },
            || Ok(()),
            |_| {
                ran = true;
                Ok(BwReport {
                    size: 4096,
                    iters: 20,
                    bw_peak: 1.0,
                    bw_avg: 1.0,
                    msg_rate: 0.5,
                })
            },
        )
        .unwrap_or_else(|e| panic!("{name} as {role:?}: {e}"));
        assert_eq!(
            oob.s.input.position() as usize,
            input.len(),
            "{name} as {role:?}: all the peer sent was read"
        );
        assert_eq!(
            oob.s.output.len(),
            theirs_out.len(),
            "{name} as {role:?}: we sent what the peer's counterpart sent"
        );
        // The keys in each direction, as QP indices (0 for the lowest QPN, ...).
        let order = |bytes: &[u8]| -> Vec<u32> {
            let (mut qpns, mut i) = (Vec::new(), 0);
            while i + KEY_MSG <= bytes.len() {
                match Dest::parse(&bytes[i..i + KEY_MSG]) {
                    Ok(d) => {
                        qpns.push(d.qpn);
                        i += KEY_MSG;
                    }
                    Err(_) => i += 1,
                }
            }
            let low = qpns.iter().copied().min().unwrap_or(0);
            qpns.iter().map(|q| q - low).collect()
        };
        let ours = order(&oob.s.output);
        assert_eq!(
            ours,
            order(&theirs_out),
            "{name} as {role:?}: our keys went in the order the peer's counterpart sent its own"
        );
        (out, ran, ours)
    }

    /// perftest's `-q 2` between two Soft-RoCE hosts: the keys go twice per QP (and for SEND
    /// a barrier between the rounds), and each side uses the second round's.
    #[test]
    fn several_qps_exchange_as_perftest_does() {
        for (name, test, want) in [
            (
                &perftest_capture("write_bw_q2.pcap"),
                Test::Write,
                &[0, 1, 0, 1, 0, 0, 0][..],
            ),
            (
                &perftest_capture("send_bw_q2.pcap"),
                Test::Send,
                &[0, 1, 0, 0, 1, 0, 0][..],
            ),
        ] {
            for role in [Role::Server, Role::Client] {
                let (out, _, ours) = replay_qps(name, test, role, 2);
                assert_eq!(ours, want, "{name} as {role:?}");
                let remote: Vec<u32> = out.remote.iter().map(|d| d.qpn).collect();
                assert_eq!(remote.len(), 2, "{name} as {role:?}: one key per QP");
                assert_eq!(remote[1], remote[0] + 1, "{name} as {role:?}: {remote:x?}");
            }
        }
        // A peer whose second round names other QPs is refused, not half-connected.
        let mut input = tcp_streams(&perftest_capture("write_bw_q2.pcap")).1;
        let second = 16 + 4 + 4 + 2 + 2 * KEY_MSG;
        input.copy_within(second + KEY_MSG..second + 2 * KEY_MSG, second);
        let mut oob = Oob::new(
            Replay {
                input: Cursor::new(input),
                output: Vec::new(),
            },
            Role::Client,
        );
        let e = bw_exchange::<_, OobError>(
            &mut oob,
            Test::Write,
            1024,
            &[dest(0x77), dest(0x78)],
            |_, _| Ok(()),
            || Ok(()),
            |_| unreachable!("no traffic after a bad exchange"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("second round"), "{e}");
    }

    #[test]
    fn bandwidth_exchanges_replay_against_perftest_captures() {
        for (name, test) in [
            ("write_bw.pcap", Test::Write),
            ("read_bw.pcap", Test::Read),
            ("atomic_fa.pcap", Test::Atomic),
            ("atomic_cs.pcap", Test::Atomic),
            ("mtu4k_write_bw.pcap", Test::Write),
        ] {
            let (out, ran) = replay(name, test, Role::Server);
            assert!(!ran, "a {test:?} server does not run traffic");
            let r = out.report.unwrap();
            assert_eq!(r.iters, 20, "{name}: the client's iterations reached us");
            assert!(r.bw_avg > 0.0 && r.msg_rate > 0.0, "{name}: {r:?}");
            assert_eq!(
                out.remote[0].gid,
                "::ffff:10.233.0.10".parse::<Ipv6Addr>().unwrap()
            );
            let (out, ran) = replay(name, test, Role::Client);
            assert!(ran);
            assert_eq!(
                out.remote[0].gid,
                "::ffff:10.233.0.11".parse::<Ipv6Addr>().unwrap()
            );
        }
        let (out, _) = replay("write_bw.pcap", Test::Write, Role::Server);
        assert_eq!(out.report.unwrap().size, 4096);
        assert_eq!((out.remote[0].qpn, out.remote[0].rkey), (0x14, 0x53e));
        let (out, _) = replay("mtu4k_write_bw.pcap", Test::Write, Role::Server);
        assert_eq!(out.report.unwrap().size, 65536);
        for role in [Role::Server, Role::Client] {
            let (out, ran) = replay("send_bw.pcap", Test::Send, role);
            assert!(ran, "both sides of a SEND test run");
            assert_eq!(out.remote[0].rkey, 0, "SEND tests send no rkey");
        }
    }

    fn perftest_capture(name: &str) -> String {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data/perftest")
            .join(name)
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn latency_exchanges_replay_against_perftest_captures() {
        for (name, test) in [
            ("write_lat.pcap", Test::Write),
            ("read_lat.pcap", Test::Read),
            ("send_lat.pcap", Test::Send),
            ("atomic_lat.pcap", Test::Atomic),
        ] {
            let (to_server, to_client) = tcp_streams(&perftest_capture(name));
            for role in [Role::Server, Role::Client] {
                let (input, theirs_out) = match role {
                    Role::Server => (to_server.clone(), to_client.clone()),
                    Role::Client => (to_client.clone(), to_server.clone()),
                };
                let mut oob = Oob::new(
                    Replay {
                        input: Cursor::new(input.clone()),
                        output: Vec::new(),
                    },
                    role,
                );
                let (mut readied, mut ran) = (false, false);
                let out = lat_exchange::<_, OobError, u8>(
                    &mut oob,
                    test,
                    1024,
                    &dest(0x77),
                    |_, _| Ok(()),
                    || {
                        readied = true;
                        Ok(())
                    },
                    |_| {
                        ran = true;
                        Ok(7)
                    },
                )
                .unwrap_or_else(|e| panic!("{name} as {role:?}: {e}"));
                assert_eq!(
                    oob.s.input.position() as usize,
                    input.len(),
                    "{name} {role:?}"
                );
                assert_eq!(oob.s.output.len(), theirs_out.len(), "{name} {role:?}");
                assert!(readied);
                let runs = role == Role::Client || matches!(test, Test::Write | Test::Send);
                assert_eq!((ran, out.result.is_some()), (runs, runs), "{name} {role:?}");
                assert_eq!(
                    out.remote.gid.octets()[12..],
                    [10, 234, 0, if role == Role::Server { 11 } else { 12 }]
                );
            }
        }
    }

    #[test]
    fn a_peer_that_is_not_perftest_is_refused() {
        let mut oob = Oob::new(
            Replay {
                input: Cursor::new(b"HTTP/1.1 200 OK\r\n\r\n".to_vec()),
                output: Vec::new(),
            },
            Role::Client,
        );
        assert!(matches!(
            oob.setup(1024),
            Err(OobError::Malformed {
                what: "version",
                ..
            })
        ));
        let mut oob = Oob::new(
            Replay {
                input: Cursor::new(b"6.06".to_vec()),
                output: Vec::new(),
            },
            Role::Client,
        );
        assert!(matches!(oob.setup(1024), Err(OobError::Io(_))), "cut short");
    }

    /// The client's keys from `write_bw.pcap`, as sent.
    const CLIENT_KEYS: &[u8] = b"0000:0001:000014:30abb8:0000053e:000055ef3d363000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:e9:00:0a:00000000:\0";

    #[test]
    fn key_messages_parse_and_print_as_perftest_does() {
        assert_eq!(CLIENT_KEYS.len(), KEY_MSG);
        let d = Dest::parse(CLIENT_KEYS).unwrap();
        assert_eq!(
            d,
            Dest {
                lid: 0,
                out_reads: 1,
                qpn: 0x14,
                psn: 0x30abb8,
                rkey: 0x53e,
                vaddr: 0x55ef3d363000,
                gid: "::ffff:10.233.0.10".parse().unwrap(),
                srqn: 0,
            }
        );
        assert_eq!(&d.to_wire()[..], CLIENT_KEYS);
        for bad in [
            &b"0000:0001:000014"[..],
            b"zzzz:0001:000014:30abb8:0000053e:000055ef3d363000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:e9:00:0a:00000000:\0",
            b"0000:0001:000014:30abb8:0000053e:000055ef3d363000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:e9:00:0a:00000000\0",
            b"0000:0001:1000014:30abb8:0000053e:000055ef3d363000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:e9:00:0a:00000000:\0",
        ] {
            assert!(Dest::parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    /// 20,000 QPs' keys over a real TCP connection (more than both sockets' buffers hold):
    /// every key arrives once, in order, on both sides, and neither side blocks the other.
    #[test]
    fn many_qps_keys_stream_both_ways_in_order() {
        const N: u32 = 20_000;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let side = |base: u32| (0..N).map(|i| dest(base + i)).collect::<Vec<_>>();
        let server = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            Oob::new(s, Role::Server)
                .keys_many(&side(0x10_0000))
                .unwrap()
        });
        let s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(60)))
            .unwrap();
        let got_by_client = Oob::new(s, Role::Client)
            .keys_many(&side(0x20_0000))
            .unwrap();
        let got_by_server = server.join().unwrap();
        assert_eq!(got_by_client, side(0x10_0000));
        assert_eq!(got_by_server, side(0x20_0000));
    }

    /// A peer that closes (or resets) instead of sending its "done" ends the exchange
    /// cleanly; a peer that sends something else is an error.
    #[test]
    fn the_closing_message_may_be_lost_to_the_peers_close() {
        struct Reset;
        impl OobStream for Reset {}
        impl Read for Reset {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::ConnectionReset.into())
            }
        }
        impl Write for Reset {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        Oob::new(Reset, Role::Client).done().unwrap();
        // A peer that goes silent (its reset lost): the read times out, which ends it too.
        struct Silent(Option<std::time::Duration>);
        impl OobStream for Silent {
            fn wait_at_most(&mut self, d: std::time::Duration) {
                self.0 = Some(d);
            }
        }
        impl Read for Silent {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                assert_eq!(self.0, Some(CLOSING_WAIT), "the wait is bounded first");
                Err(std::io::ErrorKind::WouldBlock.into())
            }
        }
        impl Write for Silent {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        Oob::new(Silent(None), Role::Server).done().unwrap();
        let replay = |input: &[u8]| Replay {
            input: Cursor::new(input.to_vec()),
            output: Vec::new(),
        };
        let mut eof = Oob::new(replay(b""), Role::Client);
        eof.done().unwrap();
        assert_eq!(eof.s.output, b"done\0");
        assert!(Oob::new(replay(b"done\0"), Role::Server).done().is_ok());
        assert!(Oob::new(replay(b"nope\0"), Role::Client).done().is_err());
    }

    #[test]
    fn mtu_enums_match_ibv_mtu() {
        for (b, e) in [(256, 1), (512, 2), (1024, 3), (2048, 4), (4096, 5)] {
            assert_eq!(mtu_enum(b), Some(e));
            assert_eq!(mtu_bytes(e), Some(b));
        }
        assert_eq!(mtu_enum(1500), None);
        assert_eq!(mtu_bytes(0), None);
        assert_eq!(mtu_bytes(6), None);
    }

    /// The RC SEND payloads on QP `qpn` of a capture in tests/data/rxe, each message apart:
    /// those from `from` (an IPv4 address) and those to it.
    fn rc_sends(name: &str, qpn: u32, from: [u8; 4]) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data/rxe")
            .join(name);
        let mut r = pcap_file::pcap::PcapReader::new(std::fs::File::open(path).unwrap()).unwrap();
        let (mut mine, mut theirs) = (Vec::new(), Vec::new());
        while let Some(p) = r.next_packet() {
            let f = p.unwrap().data.into_owned();
            // Ethernet, IPv4 (20 bytes), UDP to 4791, BTH; SEND Only is opcode 0x04.
            if f.len() < 58 || f[12..14] != [0x08, 0x00] || f[23] != 17 || f[42] != 0x04 {
                continue;
            }
            if u32::from_be_bytes([0, f[47], f[48], f[49]]) != qpn {
                continue;
            }
            let pad = usize::from((f[43] >> 4) & 3);
            let m = f[54..f.len() - 4 - pad].to_vec();
            if f[26..30] == from {
                mine.push(m);
            } else {
                theirs.push(m);
            }
        }
        (mine, theirs)
    }

    /// Replays messages: reads what one side sent, records each of our writes apart.
    struct Messages {
        input: Cursor<Vec<u8>>,
        sent: Vec<Vec<u8>>,
    }

    impl OobStream for Messages {}

    impl Read for Messages {
        fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
            self.input.read(b)
        }
    }

    impl Write for Messages {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.sent.push(b.to_vec());
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn cm_key_messages_are_perftests_struct_in_big_endian() {
        // The client's keys in rxe's ib_write_bw -R capture (frame 31).
        let (client, server) = rc_sends("write_bw_cm.pcap", 0x1a, [10, 233, 0, 10]);
        let m = &client[7];
        assert_eq!(m.len(), CM_KEY_MSG);
        let d = Dest::parse_cm(m).unwrap();
        assert_eq!(
            d,
            Dest {
                lid: 0,
                out_reads: 1,
                qpn: 0x1b,
                psn: 0x994806,
                rkey: 0xcc4,
                vaddr: 0x563d_bb98_6000,
                gid: "::ffff:10.233.0.10".parse().unwrap(),
                srqn: 0,
            }
        );
        // Ours are the same bytes but for perftest's uninitialised padding.
        let mut want = m.clone();
        want[20..24].fill(0);
        assert_eq!(&d.to_cm_wire(1)[..], &want[..]);
        assert_eq!(Dest::parse_cm(&server[7]).unwrap().rkey, 0xc77);
        // The barriers before any keys are all zeros.
        assert_eq!(client[4], [0u8; CM_KEY_MSG]);
        assert_eq!(Dest::parse_cm(&client[4]).unwrap().qpn, 0);
        // A message of another size, or a LID past 16 bits, is not perftest's.
        assert!(Dest::parse_cm(&m[..55]).is_err());
        let mut big = m.clone();
        big[1] = 1;
        assert!(Dest::parse_cm(&big).is_err());
    }

    /// ib_write_bw -R between two rxe hosts, each role replayed against the other's SENDs:
    /// the same messages in the same order and of the same sizes, the test QPs connected
    /// (through the CM) between the two all-zero barriers, and no closing `done`.
    #[test]
    fn cm_exchange_replays_against_perftest_minus_r() {
        let (client, server) = rc_sends("write_bw_cm.pcap", 0x1a, [10, 233, 0, 10]);
        assert_eq!((client.len(), server.len()), (16, 16));
        for role in [Role::Client, Role::Server] {
            let (input, counterpart) = match role {
                Role::Client => (&server, &client),
                Role::Server => (&client, &server),
            };
            let mut oob = Oob::over_cm(
                Messages {
                    input: Cursor::new(input.concat()),
                    sent: Vec::new(),
                },
                role,
                1,
            );
            let (mut connected, mut ran) = (0, false);
            let out = bw_exchange::<_, OobError>(
                &mut oob,
                Test::Write,
                1024,
                &[dest(0x1b)],
                |mtu, remote| {
                    assert_eq!((mtu, remote.len()), (1024, 0));
                    connected += 1;
                    Ok(())
                },
                || Ok(()),
                |_| {
                    ran = true;
                    Ok(BwReport {
                        size: 4096,
                        iters: 20,
                        bw_peak: 1.0,
                        bw_avg: 1.0,
                        msg_rate: 0.5,
                    })
                },
            )
            .unwrap_or_else(|e| panic!("as {role:?}: {e}"));
            assert_eq!(connected, 1, "as {role:?}");
            assert_eq!(ran, role == Role::Client, "as {role:?}");
            assert_eq!(oob.s.input.position() as usize, input.concat().len());
            let sizes = |v: &[Vec<u8>]| v.iter().map(Vec::len).collect::<Vec<_>>();
            assert_eq!(sizes(&oob.s.sent), sizes(counterpart), "as {role:?}");
            // Both zero barriers are zeros; the keys after them are ours.
            assert_eq!(oob.s.sent[4], [0u8; CM_KEY_MSG]);
            assert_eq!(oob.s.sent[5], [0u8; CM_KEY_MSG]);
            assert_eq!(Dest::parse_cm(&oob.s.sent[6]).unwrap(), dest(0x1b));
            let peer = &out.remote[0];
            let want_rkey = if role == Role::Client { 0xc77 } else { 0xcc4 };
            assert_eq!((peer.qpn, peer.rkey), (0x1b, want_rkey), "as {role:?}");
            if role == Role::Server {
                // The client's results, as its report messages carried them.
                assert_eq!(out.report.map(|r| (r.size, r.iters)), Some((4096, 20)));
            }
        }
    }
}
