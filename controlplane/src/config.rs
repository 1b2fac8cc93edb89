//! roced's configuration: a TOML file (or the embedded default), overridden by flags, checked
//! whole before anything starts. Every error names the field it is about.

use cidr::{cidr_from, parse_cidr};
use dataplane::dpdk::EalArgs;
use dataplane::net::{NetConfig, PortNetConfig, Route};
use serde::Deserialize;
use std::net::IpAddr;
use std::path::Path;

/// The embedded default: node A of the two-node memif demo (config/node-a.toml).
pub const DEFAULT_CONFIG: &str = include_str!("../../config/node-a.toml");

/// Ports a node can have: DPDK's `RTE_MAX_ETHPORTS` in Debian's build.
pub const MAX_PORTS: usize = dataplane::dpdk::MAX_PORTS;

/// A configuration problem, naming the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {err}")]
    Read {
        /// The path.
        path: String,
        /// Why.
        err: std::io::Error,
    },
    /// TOML syntax or an unknown or mistyped field.
    #[error("config {origin}: {msg}")]
    Parse {
        /// File name or "embedded default".
        origin: String,
        /// The TOML parser's message (it names the field and line).
        msg: String,
    },
    /// A field whose value is wrong.
    #[error("config field `{field}`: {msg}")]
    Field {
        /// The field's path, like `ports[0].addresses[1]`.
        field: String,
        /// What is wrong and what would be right.
        msg: String,
    },
}

fn field(field: impl Into<String>, msg: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        field: field.into(),
        msg: msg.into(),
    }
}

/// `[eal]`
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct EalSection {
    /// Use hugepages (faster); without them, `memory_mb` of ordinary memory.
    pub hugepages: bool,
    /// Memory without hugepages, MiB.
    pub memory_mb: u32,
    /// `--file-prefix`; distinct per process. Default `ferroce-<pid>`.
    pub file_prefix: Option<String>,
    /// `--in-memory` (not with memif ports).
    pub in_memory: bool,
    /// EAL log level.
    pub log_level: String,
}

impl Default for EalSection {
    fn default() -> Self {
        EalSection {
            hugepages: true,
            memory_mb: 1024,
            file_prefix: None,
            in_memory: false,
            log_level: "warning".into(),
        }
    }
}

/// What the worker lcores run.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The appliance: ARP, ND, ICMP, routing (and the RoCE transport as it lands).
    #[default]
    Stack,
    /// Reflect every frame with MACs swapped (forwarding benchmark).
    Macswap,
}

/// `dataplane.lcores`: the worker lcores' CPUs, or "auto".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lcores {
    /// One worker per CPU listed.
    Cpus(Vec<usize>),
    /// The CPUs roced may run on (its affinity: a Kubernetes static CPU manager's or a
    /// container's cpuset): the first for the main lcore and the control plane, a worker on
    /// each of the others.
    Auto,
}

impl<'de> Deserialize<'de> for Lcores {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Lcores;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of CPUs like [1, 2], or \"auto\"")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Lcores, E> {
                match s {
                    "auto" => Ok(Lcores::Auto),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(s), &self)),
                }
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Lcores, A::Error> {
                let mut v = Vec::new();
                while let Some(c) = a.next_element()? {
                    v.push(c);
                }
                Ok(Lcores::Cpus(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// `[dataplane]`
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct DataplaneSection {
    /// CPUs of the worker lcores, one worker per entry, or "auto".
    pub lcores: Lcores,
    /// CPUs the control thread may use (default: all).
    pub control_cpus: Vec<usize>,
    /// Mbufs in the pool.
    pub mbufs: u32,
    /// Rx/tx descriptors per queue.
    pub descriptors: u16,
    /// What the workers run.
    pub mode: Mode,
    /// Neighbour cache entries per port per lcore.
    pub neighbor_capacity: usize,
    /// Microseconds an idle worker sleeps (0: spin, for dedicated cores). Set it when lcores
    /// share CPUs with other work, such as several nodes on one small machine.
    pub idle_sleep_us: u32,
}

impl Default for DataplaneSection {
    fn default() -> Self {
        DataplaneSection {
            lcores: Lcores::Cpus(vec![1]),
            control_cpus: vec![],
            mbufs: 16383,
            descriptors: 1024,
            mode: Mode::Stack,
            neighbor_capacity: 1024,
            idle_sleep_us: 0,
        }
    }
}

/// `[attach]`: the Unix socket applications attach to (issue 21).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct AttachSection {
    /// Its path; empty: `/run/ferroce/<eal.file_prefix or "ferroce">.sock`, so that nodes on
    /// one machine (each with its own prefix) each have their own; "off" for none.
    pub socket: String,
    /// Its permission bits (octal, as chmod takes them): 0600 by default, root only.
    pub mode: u32,
    /// The group that owns it (a name or a number; empty: roced's own): with a mode such as
    /// 0660, the members of that group may attach.
    pub group: String,
}

impl Default for AttachSection {
    fn default() -> Self {
        AttachSection {
            socket: String::new(),
            mode: 0o600,
            group: String::new(),
        }
    }
}

/// The number of group `g`: a number as it is, a name looked up (the system's group database).
fn group_id(g: &str) -> Result<u32, String> {
    if let Ok(n) = g.parse::<u32>() {
        return Ok(n);
    }
    match nix::unistd::Group::from_name(g) {
        Ok(Some(grp)) => Ok(grp.gid.as_raw()),
        Ok(None) => Err(format!("there is no group {g:?} on this machine")),
        Err(e) => Err(format!("looking up group {g:?}: {e}")),
    }
}

/// Where applications attach, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachPlan {
    /// The socket's path.
    pub path: std::path::PathBuf,
    /// Its permission bits.
    pub mode: u32,
    /// The group it is given (None: roced's own).
    pub group: Option<u32>,
}

/// `[api]`
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ApiSection {
    /// Address and port the REST API listens on ("off" for none). Loopback by default.
    pub listen: String,
    /// A bearer token every request but `/v1/health` must carry (`Authorization: Bearer
    /// TOKEN`); empty for none. Set one before listening beyond loopback.
    pub token: String,
    /// A file holding the token instead (a Kubernetes Secret or systemd credential mounted as a
    /// file; one trailing newline is dropped): keeps the token out of the config.
    pub token_file: String,
}

impl Default for ApiSection {
    fn default() -> Self {
        ApiSection {
            listen: "127.0.0.1:7470".into(),
            token: String::new(),
            token_file: String::new(),
        }
    }
}

/// `[[ports]]`
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PortSection {
    /// A DPDK vdev string (`net_memif0,role=server,socket=...`) or a PCI address.
    pub device: String,
    /// IP MTU.
    #[serde(default = "default_mtu")]
    pub mtu: u16,
    /// 802.1Q VLAN id.
    #[serde(default)]
    pub vlan: Option<u16>,
    /// 802.1Q priority of frames sent on the VLAN.
    #[serde(default)]
    pub pcp: u8,
    /// Addresses with prefix length: `10.0.0.1/24`, `fd00::1/64`.
    #[serde(default)]
    pub addresses: Vec<String>,
    /// Neighbours to resolve at start and keep resolved.
    #[serde(default)]
    pub probes: Vec<String>,
}

fn default_mtu() -> u16 {
    1500
}

/// `[[routes]]`
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RouteSection {
    /// Destination prefix.
    pub dest: String,
    /// Next hop, on-link on one of the ports.
    pub via: String,
}

/// The whole file.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `[eal]`
    pub eal: EalSection,
    /// `[dataplane]`
    pub dataplane: DataplaneSection,
    /// `[[ports]]`
    pub ports: Vec<PortSection>,
    /// `[[routes]]`
    pub routes: Vec<RouteSection>,
    /// `[api]`
    pub api: ApiSection,
    /// `[attach]`
    pub attach: AttachSection,
}

/// One port, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortPlan {
    /// DPDK device name (vdev name or PCI address).
    pub device_name: String,
    /// MTU.
    pub mtu: u16,
    /// A memif port, and which side of it this node is.
    pub memif: Option<MemifRole>,
}

/// Which side of a memif connection a port is (the vdev's `role`, server by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemifRole {
    /// Listens on the socket.
    Server,
    /// Connects to the server's socket.
    Client,
}

/// The memif role a device string gives, if it is a memif vdev.
fn memif_role(device: &str) -> Option<MemifRole> {
    let mut parts = device.split(',');
    if !parts.next()?.starts_with("net_memif") {
        return None;
    }
    let client = parts.any(|kv| matches!(kv.trim(), "role=client" | "role=slave"));
    Some(if client {
        MemifRole::Client
    } else {
        MemifRole::Server
    })
}

/// A configuration checked whole, ready to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// EAL arguments.
    pub eal: EalArgs,
    /// Ports in order.
    pub ports: Vec<PortPlan>,
    /// The IP stack's configuration.
    pub net: NetConfig,
    /// Worker mode.
    pub mode: Mode,
    /// Mbufs.
    pub mbufs: u32,
    /// Descriptors per queue.
    pub descriptors: u16,
    /// Where the REST API listens, if anywhere.
    pub api: Option<std::net::SocketAddr>,
    /// Where applications attach, if anywhere.
    pub attach: Option<AttachPlan>,
    /// The bearer token the API requires, if any.
    pub api_token: Option<String>,
    /// Idle workers sleep this long (None: they spin).
    pub idle_sleep: Option<std::time::Duration>,
}

/// The largest frame a port of `mtu` carries: MTU + Ethernet header + 802.1Q tag.
pub fn max_frame(mtu: u16) -> u32 {
    mtu as u32 + 18
}

/// A memif device string with a buffer size that holds a whole frame of `mtu`.
///
/// DPDK 22.11's memif splits frames longer than its buffers (2048 B by default) over several
/// ring slots, and its transmit path does not clear the chaining flag of a packet's first
/// slot: a short frame that later lands in a slot once used by a long one is glued to the
/// slot after it, and the receiver's ring index runs past the sender's, after which it
/// delivers stale slots forever (seen here as millions of phantom frames after the first
/// jumbo transfers). Buffers that hold a whole frame never chain, so roced sizes them unless
/// the device string sets `bsize` itself.
pub fn memif_buffers(device: &str, mtu: u16) -> String {
    if !device.starts_with("net_memif") || device.contains("bsize=") {
        return device.to_string();
    }
    let need = max_frame(mtu);
    if need <= 2048 {
        return device.to_string();
    }
    format!("{device},bsize={}", need.div_ceil(128) * 128)
}

mod cidr {
    use super::{ConfigError, field};
    use dataplane::net::IpCidr;
    use std::net::IpAddr;

    /// Parses `addr/len`.
    pub fn parse_cidr(name: &str, s: &str) -> Result<(IpAddr, u8), ConfigError> {
        let (a, l) = s.split_once('/').ok_or_else(|| {
            field(
                name,
                format!("{s:?} needs a prefix length, like 10.0.0.1/24 or fd00::1/64"),
            )
        })?;
        let addr: IpAddr = a
            .parse()
            .map_err(|_| field(name, format!("{a:?} is not an IPv4 or IPv6 address")))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len: u8 = l
            .parse()
            .ok()
            .filter(|l| *l <= max)
            .ok_or_else(|| field(name, format!("prefix length {l:?} must be 0 to {max}")))?;
        Ok((addr, len))
    }

    pub fn cidr_from(addr: IpAddr, len: u8) -> IpCidr {
        match addr {
            IpAddr::V4(a) => IpCidr::Ipv4(dataplane::net::Ipv4Cidr::new(a, len)),
            IpAddr::V6(a) => IpCidr::Ipv6(dataplane::net::Ipv6Cidr::new(a, len)),
        }
    }
}

impl Config {
    /// Parses TOML text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| {
            // One line: where, then what (toml's own rendering spans several lines).
            let at = e
                .span()
                .map(|s| {
                    let before = &text[..s.start.min(text.len())];
                    let line = before.matches('\n').count() + 1;
                    let col = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
                    format!("line {line}, column {col}: ")
                })
                .unwrap_or_default();
            let msg = e.message().trim().replace('\n', " ");
            ConfigError::Parse {
                origin: origin.into(),
                msg: format!("{at}TOML error: {msg}"),
            }
        })
    }

    /// Reads a file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|err| ConfigError::Read {
            path: path.display().to_string(),
            err,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// The embedded default.
    pub fn embedded() -> Config {
        Self::parse(DEFAULT_CONFIG, "embedded default").expect("the embedded default parses")
    }

    /// Checks everything that can be checked before starting, and builds the plan.
    pub fn plan(&self) -> Result<Plan, ConfigError> {
        let cpus = dataplane::dpdk::allowed_cpus();
        let dp = &self.dataplane;
        let (lcores, control_cpus) = match &dp.lcores {
            Lcores::Cpus(v) => (v.clone(), dp.control_cpus.clone()),
            Lcores::Auto if cpus.len() < 2 => {
                return Err(field(
                    "dataplane.lcores",
                    format!(
                        "\"auto\" needs two CPUs or more (the first for the control plane, a \
                         worker on each other one); roced may use CPUs {}",
                        cpu_list(&cpus)
                    ),
                ));
            }
            Lcores::Auto if dp.control_cpus.is_empty() => (cpus[1..].to_vec(), vec![cpus[0]]),
            Lcores::Auto => (
                cpus.iter()
                    .copied()
                    .filter(|c| !dp.control_cpus.contains(c))
                    .collect(),
                dp.control_cpus.clone(),
            ),
        };
        if lcores.is_empty() {
            return Err(field(
                "dataplane.lcores",
                "at least one worker CPU is needed, like [1]",
            ));
        }
        for (i, c) in lcores.iter().enumerate() {
            if !cpus.contains(c) {
                return Err(field(
                    format!("dataplane.lcores[{i}]"),
                    format!(
                        "CPU {c} is not one roced may run on: it may use CPUs {} (the machine's, \
                         less what a container's cpuset, taskset or CPUAffinity takes away)",
                        cpu_list(&cpus)
                    ),
                ));
            }
            if let Some(j) = lcores[..i].iter().position(|d| d == c) {
                return Err(field(
                    format!("dataplane.lcores[{i}]"),
                    format!("CPU {c} is already worker lcore {j}: worker lcores must not overlap"),
                ));
            }
        }
        for (i, c) in control_cpus.iter().enumerate() {
            if !cpus.contains(c) {
                return Err(field(
                    format!("dataplane.control_cpus[{i}]"),
                    format!(
                        "CPU {c} is not one roced may run on: it may use CPUs {}",
                        cpu_list(&cpus)
                    ),
                ));
            }
        }
        if dp.mbufs < 1024 {
            return Err(field("dataplane.mbufs", "at least 1024 mbufs are needed"));
        }
        if !dp.descriptors.is_power_of_two() || dp.descriptors < 64 {
            return Err(field(
                "dataplane.descriptors",
                "must be a power of two, at least 64",
            ));
        }
        let e = &self.eal;
        if let Some(p) = &e.file_prefix
            && (p.is_empty() || p.contains('/'))
        {
            return Err(field(
                "eal.file_prefix",
                "must be a non-empty name without '/'",
            ));
        }
        if e.hugepages {
            check_hugepages()?;
        } else if e.memory_mb < 256 {
            return Err(field(
                "eal.memory_mb",
                "at least 256 MiB are needed without hugepages",
            ));
        }
        const LEVELS: &[&str] = &[
            "emerg", "alert", "crit", "error", "err", "warning", "notice", "info", "debug",
        ];
        if !LEVELS.contains(&e.log_level.as_str()) {
            return Err(field(
                "eal.log_level",
                format!("{:?} is not one of {}", e.log_level, LEVELS.join(", ")),
            ));
        }

        if self.ports.is_empty() {
            return Err(field("ports", "at least one [[ports]] section is needed"));
        }
        if self.ports.len() > MAX_PORTS {
            return Err(field(
                "ports",
                format!("at most {MAX_PORTS} [[ports]] sections (DPDK's RTE_MAX_ETHPORTS here)"),
            ));
        }
        let mut vdevs = Vec::new();
        let mut pci = Vec::new();
        let mut ports = Vec::new();
        let mut net = NetConfig {
            neighbor_capacity: dp.neighbor_capacity,
            ..Default::default()
        };
        for (i, p) in self.ports.iter().enumerate() {
            let f = |s: &str| format!("ports[{i}].{s}");
            let device_name = check_device(&f("device"), &p.device)?;
            if ports
                .iter()
                .any(|q: &PortPlan| q.device_name == device_name)
            {
                return Err(field(
                    f("device"),
                    format!("device {device_name:?} is used by an earlier port"),
                ));
            }
            if device_name.starts_with("net_") {
                vdevs.push(memif_buffers(&p.device, p.mtu));
                if e.in_memory && device_name.starts_with("net_memif") {
                    return Err(field(
                        "eal.in_memory",
                        "memif ports need the multi-process channel: set in_memory = false",
                    ));
                }
            } else {
                pci.push(device_name.clone());
            }
            if !(68..=9000).contains(&p.mtu) {
                return Err(field(f("mtu"), format!("{} is outside 68 to 9000", p.mtu)));
            }
            if let Some(v) = p.vlan
                && !(1..=4094).contains(&v)
            {
                return Err(field(f("vlan"), format!("{v} is outside 1 to 4094")));
            }
            if p.pcp > 7 {
                return Err(field(f("pcp"), format!("{} is outside 0 to 7", p.pcp)));
            }
            let mut pn = PortNetConfig {
                vlan: p.vlan,
                pcp: p.pcp,
                ..Default::default()
            };
            for (j, a) in p.addresses.iter().enumerate() {
                let name = f(&format!("addresses[{j}]"));
                let (addr, len) = parse_cidr(&name, a)?;
                if addr.is_unspecified() || addr.is_multicast() || addr.is_loopback() {
                    return Err(field(
                        name,
                        format!("{addr} cannot be an interface address"),
                    ));
                }
                match addr {
                    IpAddr::V4(a) => pn.ipv4.push(dataplane::net::Ipv4Cidr::new(a, len)),
                    IpAddr::V6(a) => pn.ipv6.push(dataplane::net::Ipv6Cidr::new(a, len)),
                }
            }
            for (j, a) in p.probes.iter().enumerate() {
                let name = f(&format!("probes[{j}]"));
                let ip: IpAddr = a
                    .parse()
                    .map_err(|_| field(&name, format!("{a:?} is not an IP address")))?;
                let on_link = match ip {
                    IpAddr::V4(a) => pn.ipv4.iter().any(|c| c.contains_addr(&a)),
                    IpAddr::V6(a) => pn.ipv6.iter().any(|c| c.contains_addr(&a)),
                };
                if !on_link {
                    return Err(field(
                        name,
                        format!("{ip} is not in any of this port's address prefixes"),
                    ));
                }
                pn.probes.push(ip);
            }
            net.ports.push(pn);
            ports.push(PortPlan {
                device_name,
                mtu: p.mtu,
                memif: memif_role(&p.device),
            });
        }
        for (i, r) in self.routes.iter().enumerate() {
            let (addr, len) = parse_cidr(&format!("routes[{i}].dest"), &r.dest)?;
            let via: IpAddr = r.via.parse().map_err(|_| {
                field(
                    format!("routes[{i}].via"),
                    format!("{:?} is not an IP address", r.via),
                )
            })?;
            if via.is_ipv4() != addr.is_ipv4() {
                return Err(field(
                    format!("routes[{i}].via"),
                    "next hop and destination must be the same IP version",
                ));
            }
            let on_link = net.ports.iter().any(|p| match via {
                IpAddr::V4(a) => p.ipv4.iter().any(|c| c.contains_addr(&a)),
                IpAddr::V6(a) => p.ipv6.iter().any(|c| c.contains_addr(&a)),
            });
            if !on_link {
                return Err(field(
                    format!("routes[{i}].via"),
                    format!("next hop {via} is not on-link on any port"),
                ));
            }
            net.routes.push(Route {
                dest: cidr_from(addr, len),
                via,
            });
        }
        let eal = EalArgs {
            vdevs,
            pci,
            file_prefix: e.file_prefix.clone(),
            in_memory: e.in_memory,
            hugepages: e.hugepages,
            memory_mb: e.memory_mb,
            worker_cpus: lcores,
            main_cpus: control_cpus,
            log_level: e.log_level.clone(),
        };
        let api = match self.api.listen.as_str() {
            "off" | "" => None,
            a => Some(a.parse().map_err(|_| {
                field(
                    "api.listen",
                    format!("{a:?} is not an address and port like 127.0.0.1:7470 (or \"off\")"),
                )
            })?),
        };
        if self.attach.mode & !0o777 != 0 {
            return Err(field(
                "attach.mode",
                format!(
                    "{:o} is not permission bits like 0600 (at most 0777)",
                    self.attach.mode
                ),
            ));
        }
        let group = match self.attach.group.trim() {
            "" => None,
            g => Some(group_id(g).map_err(|m| field("attach.group", m))?),
        };
        let attach = match self.attach.socket.as_str() {
            "off" => None,
            "" => Some(AttachPlan {
                path: format!(
                    "/run/ferroce/{}.sock",
                    e.file_prefix.as_deref().unwrap_or("ferroce")
                )
                .into(),
                mode: self.attach.mode,
                group,
            }),
            s => Some(AttachPlan {
                path: s.into(),
                mode: self.attach.mode,
                group,
            }),
        };
        Ok(Plan {
            attach,
            eal,
            ports,
            net,
            mode: dp.mode,
            mbufs: dp.mbufs,
            descriptors: dp.descriptors,
            api,
            api_token: self.api_token()?,
            idle_sleep: match dp.idle_sleep_us {
                0 => None,
                us if us > 100_000 => {
                    return Err(field(
                        "dataplane.idle_sleep_us",
                        format!("{us} is more than 100000 (0.1 s): frames would wait that long"),
                    ));
                }
                us => Some(std::time::Duration::from_micros(us as u64)),
            },
        })
    }
}

impl Config {
    /// `[api] token` or the contents of `token_file`, checked.
    fn api_token(&self) -> Result<Option<String>, ConfigError> {
        let (name, t) = match (self.api.token.as_str(), self.api.token_file.as_str()) {
            ("", "") => return Ok(None),
            (t, "") => ("api.token", t.to_string()),
            ("", path) => {
                let t = std::fs::read_to_string(path)
                    .map_err(|e| field("api.token_file", format!("cannot read {path}: {e}")))?;
                let t = t.strip_suffix('\n').unwrap_or(&t);
                (
                    "api.token_file",
                    t.strip_suffix('\r').unwrap_or(t).to_string(),
                )
            }
            _ => {
                return Err(field(
                    "api.token_file",
                    "give api.token or api.token_file, not both",
                ));
            }
        };
        if t.len() < 16 || t.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(field(
                name,
                "a token is at least 16 characters, without spaces or control characters",
            ));
        }
        Ok(Some(t))
    }
}

/// Checks a device string and returns its DPDK device name.
fn check_device(name: &str, dev: &str) -> Result<String, ConfigError> {
    let dev_name = dev.split(',').next().unwrap_or("").trim();
    if dev_name.is_empty() {
        return Err(field(
            name,
            "empty device: give a vdev like net_memif0,role=server or a PCI address",
        ));
    }
    if let Some(rest) = dev_name.strip_prefix("net_") {
        let driver = format!(
            "net_{}",
            rest.trim_end_matches(|c: char| c.is_ascii_digit())
        );
        if driver == "net_" || driver.len() == dev_name.len() {
            return Err(field(
                name,
                format!(
                    "vdev name {dev_name:?} needs an instance number after the driver, like {driver}0"
                ),
            ));
        }
        if !dataplane::dpdk::PMD_DIR.is_empty() {
            // EAL loads `.so` (libdpdk-dev's links) and `.so.23` (the runtime packages').
            let lib = Path::new(dataplane::dpdk::PMD_DIR).join(format!("librte_{driver}.so"));
            if !lib.exists() && !installed_net_drivers().contains(&driver) {
                return Err(field(
                    name,
                    format!(
                        "unknown vdev driver {driver:?}: no {} (installed: {})",
                        lib.display(),
                        installed_net_drivers().join(", ")
                    ),
                ));
            }
        }
        return Ok(dev_name.to_string());
    }
    let pci_ok = {
        let parts: Vec<&str> = dev_name.split([':', '.']).collect();
        (parts.len() == 3 || parts.len() == 4)
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_hexdigit()))
    };
    if !pci_ok {
        return Err(field(
            name,
            format!(
                "{dev_name:?} is neither a vdev (net_<driver><n>,...) nor a PCI address (0000:03:00.0)"
            ),
        ));
    }
    Ok(dev_name.to_string())
}

fn installed_net_drivers() -> Vec<String> {
    net_drivers_in(Path::new(dataplane::dpdk::PMD_DIR))
}

/// The `net_*` drivers of a PMD directory, from either file name a package installs.
fn net_drivers_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    let (stem, _abi) = n.split_once(".so")?;
                    stem.strip_prefix("librte_net_").map(|s| format!("net_{s}"))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v.dedup();
    v
}

/// CPUs as `taskset -c` lists them: "0-3,6".
fn cpu_list(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// Hugepages must be reserved, free and mounted.
fn check_hugepages() -> Result<(), ConfigError> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let free = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    if free == 0 {
        return Err(field(
            "eal.hugepages",
            "no free hugepages (HugePages_Free is 0 in /proc/meminfo): reserve some with `make setup` \
             (echo 1024 > /proc/sys/vm/nr_hugepages), or set hugepages = false",
        ));
    }
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    if !mounts
        .lines()
        .any(|l| l.split_whitespace().nth(2) == Some("hugetlbfs"))
    {
        return Err(field(
            "eal.hugepages",
            "no hugetlbfs is mounted: `make setup` mounts one on /dev/hugepages, or set hugepages = false",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &str) -> String {
        format!(
            "[eal]\nhugepages = false\n[dataplane]\nlcores = [0]\n[[ports]]\ndevice = \"net_null0\"\naddresses = [\"10.0.0.1/24\"]\n{extra}"
        )
    }

    fn err(text: &str) -> String {
        match Config::parse(text, "t").and_then(|c| c.plan()) {
            Ok(_) => panic!("accepted: {text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn embedded_default_parses() {
        let c = Config::embedded();
        assert_eq!(c.ports.len(), 1);
        assert!(c.ports[0].device.starts_with("net_memif0"));
    }

    #[test]
    fn memif_buffers_hold_a_whole_frame() {
        let d = "net_memif0,role=server,socket=/run/x.sock";
        assert_eq!(memif_buffers(d, 1500), d, "standard frames fit the default");
        assert_eq!(memif_buffers(d, 9000), format!("{d},bsize=9088"));
        assert_eq!(memif_buffers(d, 4200), format!("{d},bsize=4224"));
        let own = format!("{d},bsize=16384");
        assert_eq!(memif_buffers(&own, 9000), own, "a bsize given is kept");
        assert_eq!(memif_buffers("net_ring0", 9000), "net_ring0");
    }

    #[test]
    fn memif_ports_know_their_side() {
        assert_eq!(memif_role("net_memif0"), Some(MemifRole::Server));
        assert_eq!(
            memif_role("net_memif0,role=server,socket=/run/x.sock"),
            Some(MemifRole::Server)
        );
        assert_eq!(
            memif_role("net_memif1,socket=/run/x.sock,role=client"),
            Some(MemifRole::Client)
        );
        assert_eq!(memif_role("net_memif0,role=slave"), Some(MemifRole::Client));
        assert_eq!(memif_role("net_ring0,role=client"), None);
        let plan = Config::embedded().plan().unwrap();
        assert_eq!(plan.ports[0].memif, Some(MemifRole::Server));
    }

    #[test]
    fn good_config_plans() {
        let p = Config::parse(
            &cfg("[[routes]]\ndest = \"10.9.0.0/16\"\nvia = \"10.0.0.254\"\n"),
            "t",
        )
        .unwrap()
        .plan()
        .unwrap();
        assert_eq!(p.ports[0].device_name, "net_null0");
        assert_eq!(p.eal.vdevs, vec!["net_null0".to_string()]);
        assert_eq!(p.net.routes.len(), 1);
        assert_eq!(
            p.api,
            Some("127.0.0.1:7470".parse().unwrap()),
            "the API's default"
        );
        assert_eq!(p.idle_sleep, None, "workers spin by default");
        let p = Config::parse(
            &cfg("[api]\nlisten = \"off\"\n")
                .replace("lcores = [0]", "lcores = [0]\nidle_sleep_us = 20"),
            "t",
        )
        .unwrap()
        .plan()
        .unwrap();
        assert_eq!(p.api, None);
        assert_eq!(p.idle_sleep, Some(std::time::Duration::from_micros(20)));
    }

    #[test]
    fn the_token_comes_from_the_config_or_a_file() {
        let d = std::env::temp_dir().join(format!("ferroce-token-{}", std::process::id()));
        std::fs::write(&d, "0123456789abcdef-token\n").unwrap();
        let with = |api: &str| {
            let c = cfg(&format!("[api]\nlisten = \"127.0.0.1:7470\"\n{api}\n"));
            Config::parse(&c, "t").unwrap().plan().map(|p| p.api_token)
        };
        let file = format!("token_file = {:?}", d.display().to_string());
        assert_eq!(
            with(&file).unwrap().as_deref(),
            Some("0123456789abcdef-token")
        );
        assert_eq!(
            with("token = \"0123456789abcdef-inline\"")
                .unwrap()
                .as_deref(),
            Some("0123456789abcdef-inline")
        );
        let both = with(&format!("{file}\ntoken = \"0123456789abcdef-inline\"")).unwrap_err();
        assert!(both.to_string().contains("not both"), "{both}");
        std::fs::write(&d, "short\n").unwrap();
        let short = with(&file).unwrap_err().to_string();
        assert!(
            short.contains("api.token_file") && short.contains("16 characters"),
            "{short}"
        );
        std::fs::remove_file(&d).unwrap();
        let gone = with(&file).unwrap_err().to_string();
        assert!(gone.contains("cannot read"), "{gone}");
        assert_eq!(with("").unwrap(), None);
    }

    #[test]
    fn drivers_count_from_runtime_packages_and_dev_links() {
        let d = std::env::temp_dir().join(format!("ferroce-pmds-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        for f in [
            "librte_net_memif.so.23",
            "librte_net_memif.so.23.0",
            "librte_net_null.so",
            "librte_bus_vdev.so.23",
        ] {
            std::fs::write(d.join(f), b"").unwrap();
        }
        let v = net_drivers_in(&d);
        std::fs::remove_dir_all(&d).unwrap();
        assert_eq!(v, ["net_memif", "net_null"]);
    }

    #[test]
    fn lcores_are_checked_against_the_cpus_the_process_may_use() {
        assert_eq!(cpu_list(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8-9");
        assert_eq!(cpu_list(&[1]), "1");
        // A container pinned to one CPU (cpuset), as this thread is here: the affinity mask
        // sched_getaffinity reads is the calling thread's.
        let all = dataplane::dpdk::allowed_cpus();
        let first = all[0];
        // SAFETY: cpu_set_t is plain bits; the calls change only this thread's affinity.
        let set = |cpus: &[usize]| unsafe {
            let mut s: libc::cpu_set_t = std::mem::zeroed();
            for &c in cpus {
                libc::CPU_SET(c, &mut s);
            }
            assert_eq!(libc::sched_setaffinity(0, std::mem::size_of_val(&s), &s), 0);
        };
        set(&[first]);
        assert_eq!(dataplane::dpdk::allowed_cpus(), vec![first]);
        let e = err(&cfg("").replace("lcores = [0]", &format!("lcores = [{}]", first + 1)));
        let ok = cfg("").replace("lcores = [0]", &format!("lcores = [{first}]"));
        let planned = Config::parse(&ok, "t").unwrap().plan();
        let auto = cfg("").replace("lcores = [0]", "lcores = \"auto\"");
        let auto_one = err(&auto);
        set(&all);
        let auto_all = Config::parse(&auto, "t").unwrap().plan();
        assert!(
            auto_one.contains("\"auto\" needs two CPUs or more")
                && auto_one.contains(&format!("roced may use CPUs {first}")),
            "{auto_one}"
        );
        if all.len() >= 2 {
            let eal = auto_all.unwrap().eal;
            assert_eq!(
                (eal.worker_cpus, eal.main_cpus),
                (all[1..].to_vec(), vec![first])
            );
        }
        let bad = Config::parse(&cfg("").replace("lcores = [0]", "lcores = \"some\""), "t")
            .unwrap_err()
            .to_string();
        assert!(
            bad.contains("a list of CPUs like [1, 2], or \"auto\""),
            "{bad}"
        );
        assert!(
            e.contains("dataplane.lcores[0]") && e.contains(&format!("it may use CPUs {first} ")),
            "{e}"
        );
        assert!(planned.is_ok(), "{planned:?}");
    }

    #[test]
    fn each_bad_field_is_named() {
        let e = err(&cfg("").replace("net_null0", "net_nosuchdrv0"));
        assert!(
            e.contains("ports[0].device") && e.contains("unknown vdev driver"),
            "{e}"
        );
        let e = err(&cfg("").replace("lcores = [0]", "lcores = [0, 0]"));
        assert!(
            e.contains("dataplane.lcores[1]") && e.contains("overlap"),
            "{e}"
        );
        let e = err(&cfg("").replace("lcores = [0]", "lcores = [999]"));
        assert!(
            e.contains("dataplane.lcores[0]") && e.contains("CPU 999 is not one roced may run on"),
            "{e}"
        );
        let e = err(&cfg("").replace("10.0.0.1/24", "10.0.0.300/24"));
        assert!(e.contains("ports[0].addresses[0]"), "{e}");
        let e = err(&cfg("[api]\nlisten = \"localhost\"\n"));
        assert!(e.contains("api.listen"), "{e}");
        let e = err(&cfg("").replace("lcores = [0]", "lcores = [0]\nidle_sleep_us = 500000"));
        assert!(e.contains("dataplane.idle_sleep_us"), "{e}");
        let e = err(&cfg("").replace("10.0.0.1/24", "10.0.0.1"));
        assert!(e.contains("prefix length"), "{e}");
        let e = err(&cfg("vlan = 5000\n"));
        assert!(e.contains("ports[0].vlan"), "{e}");
        let e = err(&cfg(
            "[[routes]]\ndest = \"10.9.0.0/16\"\nvia = \"192.168.1.1\"\n",
        ));
        assert!(e.contains("routes[0].via") && e.contains("on-link"), "{e}");
        let e = err(&cfg("colour = \"blue\"\n"));
        assert!(e.contains("colour"), "{e}");
        let e = err(&cfg("").replace("net_null0", "eth0"));
        assert!(e.contains("ports[0].device"), "{e}");
        let e = err(&cfg("").replace("net_null0", "net_null"));
        assert!(e.contains("instance number"), "{e}");
        let e = err(&cfg("[attach]\ngroup = \"no-such-group-here\"\n"));
        assert!(e.contains("attach.group") && e.contains("no group"), "{e}");
        let e = err(&cfg("[attach]\nmode = 0o1777\n"));
        assert!(e.contains("attach.mode"), "{e}");
    }

    #[test]
    fn the_attach_socket_takes_a_group_by_name_or_number() {
        let plan = |extra: &str| {
            Config::parse(&cfg(extra), "t")
                .unwrap()
                .plan()
                .unwrap()
                .attach
                .unwrap()
        };
        let p = plan("");
        assert_eq!((p.mode, p.group), (0o600, None), "root only by default");
        // Every Debian system has group root (0) and group daemon (1).
        let p = plan("[attach]\nmode = 0o660\ngroup = \"daemon\"\n");
        assert_eq!((p.mode, p.group), (0o660, Some(1)));
        assert_eq!(plan("[attach]\ngroup = \"1\"\n").group, Some(1));
    }
}
