//! rocectl's command line: the clap tree (nouns, verbs, their flags) and the parsers of its
//! values.

use super::*;

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
    /// Is roced up: `GET /v1/health` (no token needed); exit status 0 when it answers "ok", for
    /// container healthchecks and readiness probes.
    Health,
    /// Per-lcore counters under the rxe/mlx5 names (sent_pkts, out_of_sequence, np_cnp_sent, ...).
    Stats,
    /// Applications attached to roced's attach socket (programs on libferroce_ibverbs or the
    /// verbs library): pid, command, and what each made, as `rdma resource show` lists them.
    Apps,
    /// RDMA CM (rdma_cm's TCP port space over QP1): listen on a port, connect an RC QP to
    /// IP:port, accept a connection request, list connections, disconnect.
    ///
    /// Examples:
    ///   rocectl cm listen 7471                  (then accept, with a new RC QP:)
    ///   rocectl cm accept 7471
    ///   rocectl --api 127.0.0.1:7471 cm connect 10.89.0.2:7471
    ///   rocectl cm connect [fd89::2]:7471 --qp 3
    ///   rocectl cm show
    ///   rocectl cm disconnect 17
    #[command(verbatim_doc_comment)]
    Cm {
        #[command(subcommand)]
        verb: CmVerb,
    },
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
    /// librdmacm's rping on this node, against an unmodified `rping` or another `rocectl
    /// rping`, connected by the RDMA CM: the client's buffer READ by the server and WRITTEN
    /// back, -C times, checked with -V.
    ///
    /// Examples:
    ///   rocectl rping -s -p 7174
    ///   rocectl rping -c -a 10.233.0.11 -C 100 -V -v
    #[command(verbatim_doc_comment)]
    Rping(crate::rping::RpingArgs),
    /// librdmacm's udaddy on this node, against an unmodified `udaddy` or another `rocectl
    /// udaddy`: the server's UD QP found by SIDR (rdma_cm's UDP port space), then -C
    /// datagrams of -S bytes each way.
    ///
    /// Examples:
    ///   rocectl udaddy                      # serve on port 7174
    ///   rocectl udaddy -s 10.233.0.11 -C 10 -S 100
    #[command(verbatim_doc_comment)]
    Udaddy(crate::udaddy::UdaddyArgs),
    /// librdmacm's ucmatose on this node, against an unmodified `ucmatose` or another
    /// `rocectl ucmatose`: one RC connection by the RDMA CM, -C SENDs of -S bytes each way,
    /// then the server's disconnect.
    ///
    /// Examples:
    ///   rocectl ucmatose                      # serve on port 7471
    ///   rocectl ucmatose -s 10.233.0.11 -C 10 -S 100
    #[command(verbatim_doc_comment)]
    Ucmatose(crate::ucmatose::UcmatoseArgs),
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
    pub(super) lkey: u32,
    /// The local address.
    #[arg(long, value_parser = parse_u64)]
    pub(super) addr: u64,
    /// Bytes.
    #[arg(long, value_parser = parse_size)]
    pub(super) length: u64,
    /// Work request id (shows in its completion).
    #[arg(long, default_value_t = 1)]
    pub(super) wr_id: u64,
}

/// Where a work request's remote bytes are.
#[derive(Debug, Args)]
pub struct Remote {
    /// The remote region's key.
    #[arg(long)]
    pub(super) rkey: u32,
    /// The remote address.
    #[arg(long, value_parser = parse_u64)]
    pub(super) remote_addr: u64,
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
pub enum CmVerb {
    /// Listen on a port (rdma_listen): requests wait, up to the backlog, for `cm accept`.
    Listen {
        /// The port (rdma_cm's TCP port space; with --udp its UDP one).
        port: u16,
        /// Requests held unaccepted at most (1 to 1024; past it they are rejected).
        #[arg(long)]
        backlog: Option<usize>,
        /// Listen in rdma_cm's UDP port space: SIDR_REQs for a UD service (udaddy's).
        #[arg(long)]
        udp: bool,
    },
    /// Stop listening on a port; requests still waiting are rejected.
    Unlisten {
        /// The port.
        port: u16,
        /// The port of rdma_cm's UDP port space.
        #[arg(long)]
        udp: bool,
    },
    /// The ports listened on, with the requests waiting on each.
    Listeners,
    /// Connect an RC QP to whoever listens on IP:port (rdma_resolve_addr, rdma_resolve_route,
    /// rdma_connect); waits until the connection is established.
    Connect {
        /// The peer: IPv4:port, or [IPv6]:port.
        peer: std::net::SocketAddr,
        /// The RC QP to connect, in RESET (default: a new one).
        #[arg(long)]
        qp: Option<u32>,
        /// Give up after this long (at most 30000).
        #[arg(long, default_value_t = 10000)]
        timeout_ms: u64,
    },
    /// Accept the oldest request waiting on a listened port (waiting for one) with an RC QP,
    /// as rdma_get_cm_event and rdma_accept do; waits until it is established.
    Accept {
        /// The port listened on.
        port: u16,
        /// The RC QP to take it, in RESET (default: a new one).
        #[arg(long)]
        qp: Option<u32>,
        /// Give up after this long (at most 30000).
        #[arg(long, default_value_t = 10000)]
        timeout_ms: u64,
    },
    /// One connection, or every one the node remembers, with its state.
    Show {
        /// Its communication ID.
        id: Option<u32>,
    },
    /// Disconnect (rdma_disconnect): a DREQ to the peer, and the QP to ERR.
    Disconnect {
        /// Its communication ID.
        id: u32,
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
pub(super) fn parse_knob(s: &str) -> Result<(String, Value), String> {
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

pub(super) fn parse_u64(s: &str) -> Result<u64, String> {
    let t = s.trim().replace('_', "");
    let r = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => t.parse(),
    };
    r.map_err(|_| format!("{s:?} is not a number (decimal or 0x-hex)"))
}

pub(super) fn parse_u32(s: &str) -> Result<u32, String> {
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
