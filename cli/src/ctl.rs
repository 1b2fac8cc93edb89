//! rocectl's commands over roced's REST API, in the style of iproute2's `rdma`: a noun, a verb,
//! tables for people and `--json` for scripts. [`run`] is the whole program minus the process
//! (arguments in, text out, an exit status back), so tests drive it in-process.
//!
//! Exit status: 0 on success; 1 when roced refused the request (the API's code and message are
//! printed); 2 for usage errors and when roced cannot be reached.

use clap::{Args, Parser, Subcommand};
use serde_json::{Value, json};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// Manage and inspect ferroce, the software RoCEv2 NIC, through roced's REST API.
///
/// Examples:
///   rocectl port show
///   rocectl pd create
///   rocectl mr reg --size 1M --access local-write,remote-write,remote-read
///   rocectl cq create --cqe 256
///   rocectl qp create --cq 1 --pd 1
///   rocectl qp connect 1 --remote-qpn 1048577 --remote-gid 10.77.0.2 --remote-psn 7003117 --mtu 4096
///   rocectl post write 1 --lkey 1 --addr 0x7f.. --length 4096 --rkey 1 --remote-addr 0x7f..
///   rocectl cq poll 1 --wait-ms 1000       (a created CQ; `--qp N` for a QP's own CQs)
///   rocectl --api 127.0.0.1:7471 qp show
#[derive(Debug, Parser)]
#[command(name = "rocectl", version, about, verbatim_doc_comment)]
pub struct Cli {
    /// roced's API address (host:port); ROCECTL_API overrides the default.
    #[arg(
        long,
        global = true,
        env = "ROCECTL_API",
        default_value = "127.0.0.1:7470"
    )]
    pub api: String,
    /// JSON instead of tables (the API's own objects).
    #[arg(long, global = true)]
    pub json: bool,
    /// The node's API token ([api] token), sent as a bearer token; ROCECTL_TOKEN sets it too.
    #[arg(long, global = true, env = "ROCECTL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    #[command(subcommand)]
    pub cmd: Cmd,
}

/// What to act on.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Ports: link, MAC, MTU, counters.
    Port {
        #[command(subcommand)]
        verb: PortVerb,
    },
    /// Protection domains: regions and QPs of one PD only work together (PD 0 is the default).
    Pd {
        #[command(subcommand)]
        verb: PdVerb,
    },
    /// Memory regions: register hugepage memory for RDMA, inspect it, deregister it.
    Mr {
        #[command(subcommand)]
        verb: MrVerb,
    },
    /// Queue pairs (RC): create, connect (RESET -> RTS), show, destroy.
    Qp {
        #[command(subcommand)]
        verb: QpVerb,
    },
    /// Post a work request on a QP (the slow path for operators and tests).
    Post {
        #[command(subcommand)]
        verb: PostVerb,
    },
    /// Completion queues: create one for several QPs (they are placed on its lcore), poll it;
    /// a QP created without CQs has its own, polled with `cq poll --qp QPN`.
    Cq {
        #[command(subcommand)]
        verb: CqVerb,
    },
    /// Per-lcore counters under the rxe/mlx5 names (sent_pkts, out_of_sequence, np_cnp_sent, ...).
    Stats,
    /// Congestion control: the DCQCN state of a QP and the profiles QPs can be created with.
    Cc {
        #[command(subcommand)]
        verb: CcVerb,
    },
    /// Print one line per RoCEv2 packet of a pcap or pcapng capture, as tshark shows the
    /// protocol (opcode, QP, PSN, extension headers, ECN), with the ICRC checked, then a summary.
    ///
    /// Exit status: 0; 1 with --verify-icrc when any ICRC is bad; 2 when the file cannot be read.
    Decode {
        /// The capture (pcap or pcapng, Ethernet).
        file: PathBuf,
        /// Exit non-zero if any RoCEv2 packet has a bad ICRC.
        #[arg(long)]
        verify_icrc: bool,
    },
    /// perftest's bandwidth tests on this node, against another `rocectl perf` or an unmodified
    /// ib_write_bw / ib_read_bw / ib_atomic_bw, through perftest's TCP connection exchange.
    ///
    /// Examples:
    ///   rocectl perf write bw --server                  (then, on the other node:)
    ///   rocectl --api 127.0.0.1:7471 perf write bw 127.0.0.1 -s 4096 -n 20000
    ///   rocectl perf read bw 10.233.0.11 -x 1           (an ib_read_bw server on a Linux host)
    #[command(verbatim_doc_comment)]
    Perf(crate::perf::PerfArgs),
    /// ibv_rc_pingpong's test on this node, against an unmodified ibv_rc_pingpong or another
    /// `rocectl pingpong`, through its TCP connection exchange: SENDs of -s bytes, -n times
    /// each way.
    ///
    /// Examples:
    ///   rocectl pingpong --server
    ///   rocectl pingpong 10.233.0.11 -g 1 -s 4096 -n 1000
    #[command(verbatim_doc_comment)]
    Pingpong(crate::pingpong::PingpongArgs),
    /// Print shell completions for rocectl (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
pub enum PortVerb {
    /// Every port, or one.
    Show {
        /// The port's index.
        port: Option<u32>,
    },
}

#[derive(Debug, Subcommand)]
pub enum PdVerb {
    /// Allocate a protection domain.
    Create,
    /// One PD, or every PD, with how many regions and QPs are in it.
    Show {
        /// Its number.
        pdn: Option<u32>,
    },
    /// Free a PD (refused while regions or QPs are in it).
    Destroy {
        /// Its number.
        pdn: u32,
    },
}

#[derive(Debug, Subcommand)]
pub enum MrVerb {
    /// Register a region of zeroed hugepage memory, shared by every lcore.
    Reg {
        /// Size: bytes, or with K, M or G (binary units).
        #[arg(long, value_parser = parse_size)]
        size: u64,
        /// Access rights, comma-separated: local-write, remote-write, remote-read, remote-atomic.
        #[arg(long, value_delimiter = ',', default_value = "local-write")]
        access: Vec<String>,
        /// Protection domain (default: PD 0).
        #[arg(long)]
        pd: Option<u32>,
    },
    /// One region, or every region.
    Show {
        /// Its key (lkey = rkey).
        key: Option<u32>,
    },
    /// Deregister a region.
    Dereg {
        /// Its key.
        key: u32,
    },
    /// Print bytes of a region as hex.
    Read {
        /// Its key.
        key: u32,
        /// Address (defaults to the region's start).
        #[arg(long, value_parser = parse_u64)]
        addr: Option<u64>,
        /// Bytes.
        #[arg(long, value_parser = parse_size, default_value = "64")]
        length: u64,
    },
    /// Write bytes (given as hex) into a region.
    Write {
        /// Its key.
        key: u32,
        /// Address (defaults to the region's start).
        #[arg(long, value_parser = parse_u64)]
        addr: Option<u64>,
        /// The bytes, as hex digits (spaces allowed).
        #[arg(long)]
        hex: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum QpVerb {
    /// Create an RC or UD QP (in RESET) on the least-loaded lcore or the one given.
    Create {
        /// RC (reliable connection) or UD (unreliable datagram).
        #[arg(long = "type", value_parser = ["RC", "UD"], default_value = "RC")]
        qp_type: String,
        /// The lcore (worker index) to own it (with CQs: theirs).
        #[arg(long)]
        lcore: Option<usize>,
        /// Protection domain (default: PD 0).
        #[arg(long)]
        pd: Option<u32>,
        /// The created CQ for both its send and receive completions.
        #[arg(long, conflicts_with_all = ["send_cq", "recv_cq"])]
        cq: Option<u32>,
        /// The created CQ for its send completions (default: one of its own).
        #[arg(long)]
        send_cq: Option<u32>,
        /// The created CQ for its receive completions (default: one of its own).
        #[arg(long)]
        recv_cq: Option<u32>,
        /// Congestion control: dcqcn or none.
        #[arg(long)]
        cc: Option<String>,
        /// DCQCN profile: nvidia, paper or hpcc-ns3.
        #[arg(long)]
        cc_profile: Option<String>,
        /// Send work requests outstanding at most.
        #[arg(long)]
        max_send_wr: Option<u32>,
        /// Receive work requests outstanding at most.
        #[arg(long)]
        max_recv_wr: Option<u32>,
    },
    /// Take a QP from RESET to RTS towards its peer.
    Connect {
        /// The local QP.
        qpn: u32,
        /// The peer's QP number.
        #[arg(long)]
        remote_qpn: u32,
        /// The peer's GID: an IPv4 or IPv6 address.
        #[arg(long)]
        remote_gid: String,
        /// The PSN the peer starts sending with: its sq-psn (`rocectl qp show` on its node).
        #[arg(long)]
        remote_psn: u32,
        /// The PSN this QP starts sending with (default: the random one it was created with).
        #[arg(long)]
        local_psn: Option<u32>,
        /// Path MTU: 256, 512, 1024, 2048 or 4096.
        #[arg(long)]
        mtu: Option<u32>,
        /// Remote access the peer gets, comma-separated (remote-write, remote-read, remote-atomic).
        #[arg(long, value_delimiter = ',')]
        access: Option<Vec<String>>,
    },
    /// One verbs transition: INIT, RTR (needs --remote-qpn and --remote-gid), RTS, SQD, ERR
    /// or RESET, with the attributes that transition takes.
    Modify {
        /// The local QP.
        qpn: u32,
        /// The target state.
        #[arg(long, value_parser = ["INIT", "RTR", "RTS", "SQD", "ERR", "RESET"])]
        state: String,
        /// RTR: the peer's QP number.
        #[arg(long)]
        remote_qpn: Option<u32>,
        /// RTR: the peer's GID (IPv4 or IPv6 address).
        #[arg(long)]
        remote_gid: Option<String>,
        /// RTR: the PSN the peer starts sending with.
        #[arg(long)]
        remote_psn: Option<u32>,
        /// RTS: the PSN this QP starts sending with.
        #[arg(long)]
        local_psn: Option<u32>,
        /// RTR: path MTU.
        #[arg(long)]
        mtu: Option<u32>,
        /// INIT: remote access the peer gets, comma-separated.
        #[arg(long, value_delimiter = ',')]
        access: Option<Vec<String>>,
        /// INIT of a UD QP: its Q_Key.
        #[arg(long, value_parser = parse_u32)]
        qkey: Option<u32>,
        /// INIT of a UD QP: the port it sends by (default 0).
        #[arg(long)]
        port: Option<usize>,
    },
    /// One QP (with `rdma resource show qp`'s fields), or every QP.
    Show {
        /// The QP.
        qpn: Option<u32>,
    },
    /// Destroy a QP.
    Destroy {
        /// The QP.
        qpn: u32,
    },
}

/// Where a work request's local bytes are.
#[derive(Debug, Args)]
pub struct Local {
    /// The local region's key.
    #[arg(long)]
    lkey: u32,
    /// The local address.
    #[arg(long, value_parser = parse_u64)]
    addr: u64,
    /// Bytes.
    #[arg(long, value_parser = parse_size)]
    length: u64,
    /// Work request id (shows in its completion).
    #[arg(long, default_value_t = 1)]
    wr_id: u64,
}

/// Where a work request's remote bytes are.
#[derive(Debug, Args)]
pub struct Remote {
    /// The remote region's key.
    #[arg(long)]
    rkey: u32,
    /// The remote address.
    #[arg(long, value_parser = parse_u64)]
    remote_addr: u64,
}

#[derive(Debug, Subcommand)]
pub enum PostVerb {
    /// RDMA WRITE local bytes into the peer's region.
    Write {
        /// The QP.
        qpn: u32,
        #[command(flatten)]
        local: Local,
        #[command(flatten)]
        remote: Remote,
        /// Immediate data (WRITE with immediate: consumes a receive at the peer).
        #[arg(long, value_parser = parse_u32)]
        imm: Option<u32>,
    },
    /// RDMA READ the peer's bytes into a local region.
    Read {
        /// The QP.
        qpn: u32,
        #[command(flatten)]
        local: Local,
        #[command(flatten)]
        remote: Remote,
    },
    /// SEND local bytes into a receive the peer posted (on a UD QP: to --ud-gid, --ud-qpn,
    /// --ud-qkey; the receive there gets the 40-byte GRH first).
    Send {
        /// The QP.
        qpn: u32,
        #[command(flatten)]
        local: Local,
        /// Immediate data.
        #[arg(long, value_parser = parse_u32)]
        imm: Option<u32>,
        /// UD: the destination's GID (IPv4 or IPv6 address).
        #[arg(long, requires_all = ["ud_qpn", "ud_qkey"])]
        ud_gid: Option<String>,
        /// UD: the destination QP.
        #[arg(long, requires = "ud_gid")]
        ud_qpn: Option<u32>,
        /// UD: the Q_Key the datagram carries.
        #[arg(long, value_parser = parse_u32, requires = "ud_gid")]
        ud_qkey: Option<u32>,
    },
    /// Post a receive for the peer's SENDs.
    Recv {
        /// The QP.
        qpn: u32,
        #[command(flatten)]
        local: Local,
    },
    /// Atomic fetch-and-add on the peer's 8-byte word; the old value lands locally.
    FetchAdd {
        /// The QP.
        qpn: u32,
        #[command(flatten)]
        local: Local,
        #[command(flatten)]
        remote: Remote,
        /// What to add.
        #[arg(long, value_parser = parse_u64)]
        add: u64,
    },
    /// Atomic compare-and-swap on the peer's 8-byte word; the old value lands locally.
    CmpSwap {
        /// The QP.
        qpn: u32,
        #[command(flatten)]
        local: Local,
        #[command(flatten)]
        remote: Remote,
        /// The value expected.
        #[arg(long, value_parser = parse_u64)]
        compare: u64,
        /// The value to store if it matches.
        #[arg(long, value_parser = parse_u64)]
        swap: u64,
    },
}

#[derive(Debug, Subcommand)]
pub enum CqVerb {
    /// Create a CQ for `--cqe` completions (it overflows into an error state beyond that).
    Create {
        /// Capacity (1 to 65536).
        #[arg(long)]
        cqe: u64,
        /// The lcore it lives on (default: the least loaded).
        #[arg(long)]
        lcore: Option<usize>,
    },
    /// One created CQ, or every one: capacity, completions waiting, users, overflow.
    Show {
        /// Its number.
        cqn: Option<u32>,
    },
    /// Destroy a CQ (refused while a QP uses it).
    Destroy {
        /// Its number.
        cqn: u32,
    },
    /// Take completions of a created CQ, or of a QP's own send and receive CQs.
    Poll {
        /// The CQ.
        #[arg(required_unless_present = "qp", conflicts_with = "qp")]
        cqn: Option<u32>,
        /// A QP created without CQs: poll its own.
        #[arg(long)]
        qp: Option<u32>,
        /// At most this many.
        #[arg(long, default_value_t = 16)]
        max: usize,
        /// Wait up to this long for the first one.
        #[arg(long, default_value_t = 0)]
        wait_ms: u64,
    },
}

#[derive(Debug, Subcommand)]
pub enum CcVerb {
    /// A QP's congestion control: kind, rate, DCQCN's target rate and alpha, and its settings.
    Show {
        /// The QP.
        qpn: u32,
    },
    /// Change a QP's congestion control while it runs.
    ///
    /// Example: rocectl cc set 2 --knob rpg_ai_rate=10 --knob rpg_time_reset=600
    #[command(verbatim_doc_comment)]
    Set {
        /// The QP.
        qpn: u32,
        /// dcqcn or none (a different kind starts again at the line rate).
        #[arg(long)]
        cc: Option<String>,
        /// Start from a profile (nvidia, paper, hpcc-ns3) instead of the QP's current settings.
        #[arg(long)]
        profile: Option<String>,
        /// A DCQCN knob by NVIDIA's name, NAME=VALUE; repeat for several.
        #[arg(long = "knob", value_parser = parse_knob)]
        knobs: Vec<(String, Value)>,
    },
}

/// `NAME=VALUE`, the value an integer where it is one (most knobs are) or else a number.
fn parse_knob(s: &str) -> Result<(String, Value), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: a knob is NAME=VALUE"))?;
    let v = v.trim();
    let v = match v.parse::<u64>() {
        Ok(i) => json!(i),
        Err(_) => json!(
            v.parse::<f64>()
                .map_err(|_| format!("{s:?}: the value is not a number"))?
        ),
    };
    Ok((k.trim().to_string(), v))
}

fn parse_u64(s: &str) -> Result<u64, String> {
    let t = s.trim().replace('_', "");
    let r = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => t.parse(),
    };
    r.map_err(|_| format!("{s:?} is not a number (decimal or 0x-hex)"))
}

fn parse_u32(s: &str) -> Result<u32, String> {
    let v = parse_u64(s)?;
    u32::try_from(v).map_err(|_| format!("{s:?} does not fit 32 bits"))
}

/// `4096`, `64K`, `1M`, `2G` (binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mul) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1u64 << 10),
        Some((i, 'm' | 'M')) => (&t[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    parse_u64(num)?
        .checked_mul(mul)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// A failure: what to print and the exit status.
pub(crate) struct Fail(pub(crate) u8, pub(crate) String);

/// The API over HTTP.
pub(crate) struct Client {
    base: String,
    agent: ureq::Agent,
    /// `Bearer <token>`, when a token is given.
    auth: Option<String>,
}

impl Client {
    fn with<B>(&self, r: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.auth {
            Some(a) => r.header("authorization", a),
            None => r,
        }
    }

    fn new(addr: &str, token: Option<&str>) -> Client {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        Client {
            base: format!("http://{addr}"),
            agent,
            auth: token.map(|t| format!("Bearer {t}")),
        }
    }

    pub(crate) fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, Fail> {
        let url = format!("{}{path}", self.base);
        let r = match (method, body) {
            ("GET", _) => self.with(self.agent.get(&url)).call(),
            ("DELETE", _) => self.with(self.agent.delete(&url)).call(),
            ("PUT", Some(b)) => self
                .with(self.agent.put(&url))
                .header("content-type", "application/json")
                .send(b.to_string()),
            (_, Some(b)) => self
                .with(self.agent.post(&url))
                .header("content-type", "application/json")
                .send(b.to_string()),
            (_, None) => self.with(self.agent.post(&url)).send(""),
        };
        let mut r = r.map_err(|e| {
            Fail(
                2,
                format!(
                    "cannot reach roced at {} ({e}); is it running, and is --api right?",
                    self.base
                ),
            )
        })?;
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().unwrap_or_default();
        let v: Value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if (200..300).contains(&status) {
            Ok(v)
        } else {
            let code = v["code"].as_str().unwrap_or("error");
            let msg = v["message"]
                .as_str()
                .map_or_else(|| v.to_string(), String::from);
            Err(Fail(1, format!("{code}: {msg} (HTTP {status})")))
        }
    }
}

/// Runs rocectl with `args` (program name first), writing to `out` and `err`; the exit status.
pub fn run<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = if code == 0 {
                write!(out, "{e}")
            } else {
                write!(err, "{e}")
            };
            return code;
        }
    };
    match execute(&cli, out) {
        Ok(code) => code,
        Err(Fail(code, msg)) => {
            let _ = writeln!(err, "rocectl: {msg}");
            code
        }
    }
}

fn execute(cli: &Cli, out: &mut dyn Write) -> Result<u8, Fail> {
    let c = Client::new(&cli.api, cli.token.as_deref());
    let io = |e: std::io::Error| Fail(2, e.to_string());
    let v = match &cli.cmd {
        Cmd::Decode { file, verify_icrc } => return decode(file, *verify_icrc, cli.json, out),
        Cmd::Perf(a) => return crate::perf::perf(&c, a, cli.json, out),
        Cmd::Pingpong(a) => return crate::pingpong::pingpong(&c, a, cli.json, out),
        Cmd::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(*shell, &mut cmd, "rocectl", out);
            return Ok(0);
        }
        Cmd::Port {
            verb: PortVerb::Show { port },
        } => {
            let v = match port {
                Some(p) => Value::Array(vec![c.call("GET", &format!("/v1/ports/{p}"), None)?]),
                None => c.call("GET", "/v1/ports", None)?,
            };
            if !cli.json {
                table(
                    out,
                    &[
                        "port", "device", "driver", "mac", "mtu", "link", "rx pkts", "tx pkts",
                    ],
                    v.as_array().into_iter().flatten().map(|p| {
                        vec![
                            p["port"].to_string(),
                            s(&p["device"]),
                            s(&p["driver"]),
                            s(&p["mac"]),
                            p["mtu"].to_string(),
                            if p["link_up"] == true { "up" } else { "down" }.into(),
                            p["ipackets"].to_string(),
                            p["opackets"].to_string(),
                        ]
                    }),
                )
                .map_err(io)?;
                return Ok(0);
            }
            v
        }
        Cmd::Pd { verb } => {
            let v = match verb {
                PdVerb::Create => c.call("POST", "/v1/pds", Some(json!({})))?,
                PdVerb::Show { pdn } => one_or_all(&c, "/v1/pds", *pdn)?,
                PdVerb::Destroy { pdn } => c.call("DELETE", &format!("/v1/pds/{pdn}"), None)?,
            };
            if as_table(&v, cli.json, out, pd_table)? {
                return Ok(0);
            }
            v
        }
        Cmd::Mr { verb } => match verb {
            MrVerb::Reg { size, access, pd } => {
                let v = c.call(
                    "POST",
                    "/v1/mrs",
                    Some(object(&[
                        ("length", json!(size)),
                        ("access", json!(access)),
                        ("pd", json!(pd)),
                    ])),
                )?;
                if as_table(&v, cli.json, out, mr_table)? {
                    return Ok(0);
                }
                v
            }
            MrVerb::Show { key } => {
                let v = one_or_all(&c, "/v1/mrs", *key)?;
                if as_table(&v, cli.json, out, mr_table)? {
                    return Ok(0);
                }
                v
            }
            MrVerb::Dereg { key } => c.call("DELETE", &format!("/v1/mrs/{key}"), None)?,
            MrVerb::Read { key, addr, length } => {
                let addr = match addr {
                    Some(a) => *a,
                    None => c.call("GET", &format!("/v1/mrs/{key}"), None)?["addr"]
                        .as_u64()
                        .unwrap_or(0),
                };
                let bytes = c.read_bytes(*key, addr, *length)?;
                if cli.json {
                    json!({"key": key, "addr": addr, "hex": hex(&bytes)})
                } else {
                    for (i, line) in bytes.chunks(16).enumerate() {
                        writeln!(out, "{:#018x}  {}", addr + i as u64 * 16, hex_spaced(line))
                            .map_err(io)?;
                    }
                    return Ok(0);
                }
            }
            MrVerb::Write { key, addr, hex } => {
                let bytes = unhex(hex).map_err(|e| Fail(2, e))?;
                let addr = match addr {
                    Some(a) => *a,
                    None => c.call("GET", &format!("/v1/mrs/{key}"), None)?["addr"]
                        .as_u64()
                        .unwrap_or(0),
                };
                c.write_bytes(*key, addr, &bytes)?;
                json!({"key": key, "addr": addr, "written": bytes.len()})
            }
        },
        Cmd::Qp { verb } => match verb {
            QpVerb::Create {
                qp_type,
                lcore,
                pd,
                cq,
                send_cq,
                recv_cq,
                cc,
                cc_profile,
                max_send_wr,
                max_recv_wr,
            } => {
                let b = object(&[
                    ("type", json!(qp_type)),
                    ("lcore", json!(lcore)),
                    ("pd", json!(pd)),
                    ("send_cq", json!(cq.or(*send_cq))),
                    ("recv_cq", json!(cq.or(*recv_cq))),
                    ("cc", json!(cc)),
                    ("cc_profile", json!(cc_profile)),
                    ("max_send_wr", json!(max_send_wr)),
                    ("max_recv_wr", json!(max_recv_wr)),
                ]);
                c.call("POST", "/v1/qps", Some(b))?
            }
            QpVerb::Connect {
                qpn,
                remote_qpn,
                remote_gid,
                remote_psn,
                local_psn,
                mtu,
                access,
            } => {
                let b = object(&[
                    ("remote_qpn", json!(remote_qpn)),
                    ("remote_gid", json!(remote_gid)),
                    ("remote_psn", json!(remote_psn)),
                    ("local_psn", json!(local_psn)),
                    ("mtu", json!(mtu)),
                    ("access", json!(access)),
                ]);
                c.call("POST", &format!("/v1/qps/{qpn}/connect"), Some(b))?;
                c.call("GET", &format!("/v1/qps/{qpn}"), None)?
            }
            QpVerb::Modify {
                qpn,
                state,
                remote_qpn,
                remote_gid,
                remote_psn,
                local_psn,
                mtu,
                access,
                qkey,
                port,
            } => {
                let b = object(&[
                    ("state", json!(state)),
                    ("qkey", json!(qkey)),
                    ("port", json!(port)),
                    ("remote_qpn", json!(remote_qpn)),
                    ("remote_gid", json!(remote_gid)),
                    ("remote_psn", json!(remote_psn)),
                    ("local_psn", json!(local_psn)),
                    ("mtu", json!(mtu)),
                    ("access", json!(access)),
                ]);
                c.call("POST", &format!("/v1/qps/{qpn}/modify"), Some(b))?
            }
            QpVerb::Show { qpn } => {
                let list = match qpn {
                    Some(q) => vec![c.call("GET", &format!("/v1/qps/{q}"), None)?],
                    None => c
                        .call("GET", "/v1/qps", None)?
                        .as_array()
                        .cloned()
                        .unwrap_or_default(),
                };
                if cli.json {
                    Value::Array(list)
                } else {
                    qp_table(out, &list).map_err(io)?;
                    return Ok(0);
                }
            }
            QpVerb::Destroy { qpn } => c.call("DELETE", &format!("/v1/qps/{qpn}"), None)?,
        },
        Cmd::Post { verb } => {
            let (qpn, path, b) = post_body(verb);
            c.call("POST", &format!("/v1/qps/{qpn}/{path}"), Some(b))?
        }
        Cmd::Cq { verb } => match verb {
            CqVerb::Create { cqe, lcore } => {
                let v = c.call(
                    "POST",
                    "/v1/cqs",
                    Some(object(&[("cqe", json!(cqe)), ("lcore", json!(lcore))])),
                )?;
                if as_table(&v, cli.json, out, cq_table)? {
                    return Ok(0);
                }
                v
            }
            CqVerb::Show { cqn } => {
                let v = one_or_all(&c, "/v1/cqs", *cqn)?;
                if as_table(&v, cli.json, out, cq_table)? {
                    return Ok(0);
                }
                v
            }
            CqVerb::Destroy { cqn } => c.call("DELETE", &format!("/v1/cqs/{cqn}"), None)?,
            CqVerb::Poll {
                cqn,
                qp,
                max,
                wait_ms,
            } => {
                let q = format!("completions?max={max}&wait_ms={wait_ms}");
                let (v, sides) = match (cqn, qp) {
                    (_, Some(qpn)) => (
                        c.call("GET", &format!("/v1/qps/{qpn}/{q}"), None)?,
                        vec!["send", "recv"],
                    ),
                    (Some(cqn), None) => (
                        c.call("GET", &format!("/v1/cqs/{cqn}/{q}"), None)?,
                        vec!["completions"],
                    ),
                    (None, None) => return Err(Fail(2, "cq poll needs a CQN or --qp".into())),
                };
                if !cli.json {
                    let rows = sides.into_iter().flat_map(|side| {
                        v[side]
                            .as_array()
                            .cloned()
                            .unwrap_or_default()
                            .into_iter()
                            .map(move |w| {
                                vec![
                                    if side == "completions" { "-" } else { side }.to_string(),
                                    w["qp_num"].to_string(),
                                    w["wr_id"].to_string(),
                                    s(&w["opcode"]),
                                    s(&w["status"]),
                                    w["byte_len"].to_string(),
                                    w.get("imm_data")
                                        .filter(|x| !x.is_null())
                                        .map_or("-".into(), |x| x.to_string()),
                                    w.get("src_qp")
                                        .filter(|x| !x.is_null())
                                        .map_or("-".into(), |x| x.to_string()),
                                ]
                            })
                    });
                    table(
                        out,
                        &[
                            "side", "qpn", "wr_id", "opcode", "status", "bytes", "imm", "src_qp",
                        ],
                        rows,
                    )
                    .map_err(io)?;
                    if v["cq"]["in_error"] == true {
                        writeln!(
                            out,
                            "CQ {} overflowed: completions were lost",
                            s(&v["cq"]["cqn"])
                        )
                        .map_err(io)?;
                    }
                    return Ok(0);
                }
                v
            }
        },
        Cmd::Stats => {
            let v = c.call("GET", "/v1/stats", None)?;
            if !cli.json {
                for l in v["lcores"].as_array().into_iter().flatten() {
                    writeln!(out, "lcore {}:", l["lcore"]).map_err(io)?;
                    for (k, x) in l["counters"].as_object().into_iter().flatten() {
                        if x.as_u64() != Some(0) {
                            writeln!(out, "  {k:<32} {x}").map_err(io)?;
                        }
                    }
                }
                return Ok(0);
            }
            v
        }
        Cmd::Cc {
            verb:
                CcVerb::Set {
                    qpn,
                    cc,
                    profile,
                    knobs,
                },
        } => {
            let mut b = json!({});
            if let Some(k) = cc {
                b["cc"] = json!(k);
            }
            if let Some(p) = profile {
                b["cc_profile"] = json!(p);
            }
            if !knobs.is_empty() {
                let m: serde_json::Map<String, Value> =
                    knobs.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                b["dcqcn"] = Value::Object(m);
            }
            let q = c.call("PUT", &format!("/v1/qps/{qpn}/cc"), Some(b))?;
            json!({"qpn": qpn, "cc": q["cc"]})
        }
        Cmd::Cc {
            verb: CcVerb::Show { qpn },
        } => {
            let q = c.call("GET", &format!("/v1/qps/{qpn}"), None)?;
            let v = json!({"qpn": qpn, "cc": q["cc"]});
            if !cli.json {
                let cc = &q["cc"];
                let gbps = |x: &Value| x.as_f64().map_or("-".into(), |b| format!("{:.3}", b / 1e9));
                writeln!(
                    out,
                    "qp {qpn}: cc {}  rate {} Gb/s  target {} Gb/s  alpha {}",
                    s(&cc["kind"]),
                    gbps(&cc["rate_bps"]),
                    gbps(&cc["target_bps"]),
                    cc["alpha"]
                        .as_f64()
                        .map_or("-".into(), |a| format!("{a:.4}"))
                )
                .map_err(io)?;
                if let Some(k) = cc["dcqcn"].as_object() {
                    for (name, x) in k {
                        writeln!(out, "  {name:<32} {x}").map_err(io)?;
                    }
                }
                return Ok(0);
            }
            v
        }
    };
    let text = if cli.json {
        v.to_string()
    } else {
        serde_json::to_string_pretty(&v).unwrap_or_default()
    };
    writeln!(out, "{text}").map_err(io)?;
    Ok(0)
}

impl Client {
    fn read_bytes(&self, key: u32, addr: u64, len: u64) -> Result<Vec<u8>, Fail> {
        let url = format!("{}/v1/mrs/{key}/data?addr={addr}&length={len}", self.base);
        let mut r = self
            .with(self.agent.get(&url))
            .call()
            .map_err(|e| Fail(2, format!("cannot reach roced at {} ({e})", self.base)))?;
        let status = r.status().as_u16();
        let body = r
            .body_mut()
            .with_config()
            .limit(1 << 30)
            .read_to_vec()
            .map_err(|e| Fail(2, e.to_string()))?;
        if (200..300).contains(&status) {
            Ok(body)
        } else {
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            Err(Fail(
                1,
                format!("{}: {} (HTTP {status})", s(&v["code"]), s(&v["message"])),
            ))
        }
    }

    fn write_bytes(&self, key: u32, addr: u64, data: &[u8]) -> Result<(), Fail> {
        let url = format!("{}/v1/mrs/{key}/data?addr={addr}", self.base);
        let mut r = self
            .with(self.agent.put(&url))
            .header("content-type", "application/octet-stream")
            .send(data)
            .map_err(|e| Fail(2, format!("cannot reach roced at {} ({e})", self.base)))?;
        let status = r.status().as_u16();
        if (200..300).contains(&status) {
            Ok(())
        } else {
            let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap_or_default())
                .unwrap_or(Value::Null);
            Err(Fail(
                1,
                format!("{}: {} (HTTP {status})", s(&v["code"]), s(&v["message"])),
            ))
        }
    }
}

fn post_body(verb: &PostVerb) -> (u32, &'static str, Value) {
    let sge = |l: &Local| json!([{"addr": l.addr, "length": l.length, "lkey": l.lkey}]);
    let remote = |b: &mut Value, r: &Remote| {
        b["rkey"] = json!(r.rkey);
        b["remote_addr"] = json!(r.remote_addr);
    };
    match verb {
        PostVerb::Write {
            qpn,
            local,
            remote: r,
            imm,
        } => {
            let op = if imm.is_some() { "write-imm" } else { "write" };
            let mut b = json!({"opcode": op, "wr_id": local.wr_id, "sge": sge(local)});
            remote(&mut b, r);
            if let Some(i) = imm {
                b["imm"] = json!(i);
            }
            (*qpn, "send", b)
        }
        PostVerb::Read {
            qpn,
            local,
            remote: r,
        } => {
            let mut b = json!({"opcode": "read", "wr_id": local.wr_id, "sge": sge(local)});
            remote(&mut b, r);
            (*qpn, "send", b)
        }
        PostVerb::Send {
            qpn,
            local,
            imm,
            ud_gid,
            ud_qpn,
            ud_qkey,
        } => {
            let op = if imm.is_some() { "send-imm" } else { "send" };
            let mut b = json!({"opcode": op, "wr_id": local.wr_id, "sge": sge(local)});
            if let Some(i) = imm {
                b["imm"] = json!(i);
            }
            if let (Some(g), Some(q), Some(k)) = (ud_gid, ud_qpn, ud_qkey) {
                b["ud"] = json!({"remote_gid": g, "remote_qpn": q, "remote_qkey": k});
            }
            (*qpn, "send", b)
        }
        PostVerb::Recv { qpn, local } => (
            *qpn,
            "recv",
            json!({"wr_id": local.wr_id, "sge": sge(local)}),
        ),
        PostVerb::FetchAdd {
            qpn,
            local,
            remote: r,
            add,
        } => {
            let mut b = json!({"opcode": "fetch-add", "wr_id": local.wr_id, "sge": sge(local),
                               "add": add});
            remote(&mut b, r);
            (*qpn, "send", b)
        }
        PostVerb::CmpSwap {
            qpn,
            local,
            remote: r,
            compare,
            swap,
        } => {
            let mut b = json!({"opcode": "cmp-swap", "wr_id": local.wr_id, "sge": sge(local),
                               "compare": compare, "swap": swap});
            remote(&mut b, r);
            (*qpn, "send", b)
        }
    }
}

fn decode(
    file: &std::path::Path,
    verify: bool,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, Fail> {
    let mut w = std::io::BufWriter::new(out);
    let s =
        crate::decode::decode(file, json, &mut w).map_err(|e| Fail(2, format!("decode: {e}")))?;
    let io = |e: std::io::Error| Fail(2, e.to_string());
    if json {
        writeln!(w, "{}", crate::decode::summary_json(&s)).map_err(io)?;
    } else {
        write!(w, "{}", crate::decode::summary_text(&s)).map_err(io)?;
    }
    w.flush().map_err(io)?;
    if verify && s.bad_icrc > 0 {
        return Err(Fail(
            1,
            format!("decode: {} RoCEv2 packet(s) with a bad ICRC", s.bad_icrc),
        ));
    }
    Ok(0)
}

/// `base/id`, or every object at `base` when no id is given.
fn one_or_all(c: &Client, base: &str, id: Option<u32>) -> Result<Value, Fail> {
    match id {
        Some(k) => c.call("GET", &format!("{base}/{k}"), None),
        None => c.call("GET", base, None),
    }
}

/// Prints `v` (one object or a list) with `table` unless --json; whether it printed.
fn as_table(
    v: &Value,
    json: bool,
    out: &mut dyn Write,
    table: fn(&mut dyn Write, &[Value]) -> std::io::Result<()>,
) -> Result<bool, Fail> {
    if json || v.is_null() {
        return Ok(false);
    }
    let list = v.as_array().cloned().unwrap_or_else(|| vec![v.clone()]);
    table(out, &list).map_err(|e| Fail(2, e.to_string()))?;
    Ok(true)
}

/// A JSON object of the fields that are set (options left out rather than sent as null).
fn object(fields: &[(&str, Value)]) -> Value {
    Value::Object(
        fields
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    )
}

fn s(v: &Value) -> String {
    match v {
        Value::String(x) => x.clone(),
        Value::Null => "-".into(),
        x => x.to_string(),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn hex_spaced(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn unhex(s: &str) -> Result<Vec<u8>, String> {
    let d: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if !d.len().is_multiple_of(2) {
        return Err("--hex needs an even number of hex digits".into());
    }
    d.chunks(2)
        .map(|p| {
            let t = std::str::from_utf8(p).unwrap_or("zz");
            u8::from_str_radix(t, 16).map_err(|_| format!("{t:?} in --hex is not hex"))
        })
        .collect()
}

fn table(
    out: &mut dyn Write,
    head: &[&str],
    rows: impl IntoIterator<Item = Vec<String>>,
) -> std::io::Result<()> {
    let rows: Vec<Vec<String>> = rows.into_iter().collect();
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = w[i]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    writeln!(out, "{}", line(head.to_vec()))?;
    for r in &rows {
        writeln!(out, "{}", line(r.iter().map(String::as_str).collect()))?;
    }
    Ok(())
}

fn mr_table(out: &mut dyn Write, list: &[Value]) -> std::io::Result<()> {
    table(
        out,
        &["key", "pdn", "addr", "length", "access"],
        list.iter().map(|m| {
            vec![
                m["lkey"].to_string(),
                s(&m["pdn"]),
                m["addr"].as_u64().map_or("-".into(), |a| format!("{a:#x}")),
                m["length"].to_string(),
                m["access"]
                    .as_array()
                    .map(|a| a.iter().map(s).collect::<Vec<_>>().join(","))
                    .unwrap_or_default(),
            ]
        }),
    )
}

fn pd_table(out: &mut dyn Write, list: &[Value]) -> std::io::Result<()> {
    table(
        out,
        &["pdn", "mrs", "qps"],
        list.iter()
            .map(|p| vec![s(&p["pdn"]), s(&p["mrs"]), s(&p["qps"])]),
    )
}

fn cq_table(out: &mut dyn Write, list: &[Value]) -> std::io::Result<()> {
    table(
        out,
        &["cqn", "lcore", "cqe", "waiting", "users", "state"],
        list.iter().map(|q| {
            vec![
                s(&q["cqn"]),
                s(&q["lcore"]),
                s(&q["cqe"]),
                s(&q["waiting"]),
                s(&q["users"]),
                if q["in_error"] == true {
                    "overflowed"
                } else {
                    "ok"
                }
                .into(),
            ]
        }),
    )
}

fn qp_table(out: &mut dyn Write, list: &[Value]) -> std::io::Result<()> {
    table(
        out,
        &[
            "lqpn", "rqpn", "type", "state", "sq-psn", "rq-psn", "pdn", "lcore", "path-mtu", "cc",
        ],
        list.iter().map(|q| {
            vec![
                q["lqpn"].to_string(),
                s(&q["rqpn"]),
                s(&q["type"]),
                s(&q["state"]),
                s(&q["sq-psn"]),
                s(&q["rq-psn"]),
                s(&q["pdn"]),
                s(&q["lcore"]),
                s(&q["path-mtu"]),
                s(&q["cc"]["kind"]),
            ]
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_str(args: &[&str]) -> (u8, String, String) {
        let (mut o, mut e) = (Vec::new(), Vec::new());
        let code = run(
            std::iter::once("rocectl").chain(args.iter().copied()),
            &mut o,
            &mut e,
        );
        (
            code,
            String::from_utf8(o).unwrap(),
            String::from_utf8(e).unwrap(),
        )
    }

    #[test]
    fn sizes_and_numbers_parse_as_people_write_them() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert!(parse_size("1T").is_err() && parse_size("").is_err());
        assert_eq!(parse_u64("0x10"), Ok(16));
        assert!(parse_u32("0x1_0000_0000").is_err());
        assert_eq!(unhex("de ad be ef"), Ok(vec![0xde, 0xad, 0xbe, 0xef]));
        assert!(unhex("abc").is_err() && unhex("zz").is_err());
    }

    #[test]
    fn usage_errors_exit_2_and_say_what_is_wrong() {
        let (code, _, err) = run_str(&["mr", "reg", "--size", "lots"]);
        assert_eq!(code, 2);
        assert!(err.contains("\"lots\""), "{err}");
        let (code, _, err) = run_str(&["qp", "connect", "1"]);
        assert_eq!(code, 2);
        assert!(err.contains("--remote-qpn"), "{err}");
        let (code, out, _) = run_str(&["--help"]);
        assert_eq!(code, 0);
        assert!(out.contains("Examples"), "{out}");
    }

    #[test]
    fn an_unreachable_roced_is_said_plainly() {
        let (code, _, err) = run_str(&["--api", "127.0.0.1:1", "port", "show"]);
        assert_eq!(code, 2);
        assert!(
            err.contains("cannot reach roced at http://127.0.0.1:1"),
            "{err}"
        );
    }

    #[test]
    fn completions_are_printed_for_bash() {
        let (code, out, _) = run_str(&["completions", "bash"]);
        assert_eq!(code, 0);
        assert!(out.contains("rocectl") && out.contains("connect"));
    }
}
