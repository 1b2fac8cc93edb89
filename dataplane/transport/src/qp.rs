//! Queue pair state machine and attributes (ibv_modify_qp for RC and UD QPs).
//!
//! RESET -> INIT -> RTR -> RTS is the connection path; SQD (send queue drained) and back; SQE
//! (send queue error) back to RTS; any state to RESET or ERR. Each transition requires some
//! attributes and allows others, as the IBTA tables (and rxe's `qp_state_table`) say; anything
//! else is an error, and a refused modify changes nothing. A UD QP has no remote end: it takes
//! a Q_Key (and the port's MTU) at INIT, nothing at RTR and its first PSN at RTS; every send
//! names its destination ([`super::wr::UdDest`]).

use super::mr::Access;
use core::net::IpAddr;
use wire::Psn;

/// QP states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum QpState {
    /// Just created, or reset.
    #[default]
    Reset,
    /// Initialised: may post receives.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained.
    Sqd,
    /// Send queue error.
    Sqe,
    /// Error: everything outstanding is flushed.
    Err,
}

impl QpState {
    /// Every state, in the order of the verbs enum.
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];

    /// The name `rdma resource show qp` prints.
    pub fn name(self) -> &'static str {
        match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        }
    }
}

/// The transport service of a QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum QpType {
    /// Reliable connection.
    #[default]
    Rc,
    /// Unreliable datagram.
    Ud,
}

impl QpType {
    /// The name verbs tools print ("RC", "UD").
    pub fn name(self) -> &'static str {
        match self {
            QpType::Rc => "RC",
            QpType::Ud => "UD",
        }
    }
}

/// Path MTU (payload bytes per packet).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mtu {
    /// 256 bytes.
    M256,
    /// 512 bytes.
    M512,
    /// 1024 bytes.
    M1024,
    /// 2048 bytes.
    M2048,
    /// 4096 bytes.
    M4096,
}

impl Mtu {
    /// From bytes; only the five IB sizes are valid.
    pub fn from_bytes(b: u32) -> Option<Mtu> {
        Some(match b {
            256 => Mtu::M256,
            512 => Mtu::M512,
            1024 => Mtu::M1024,
            2048 => Mtu::M2048,
            4096 => Mtu::M4096,
            _ => return None,
        })
    }
    /// In bytes.
    pub fn bytes(self) -> u32 {
        match self {
            Mtu::M256 => 256,
            Mtu::M512 => 512,
            Mtu::M1024 => 1024,
            Mtu::M2048 => 2048,
            Mtu::M4096 => 4096,
        }
    }
}

/// Where the remote end is (the address vector of RoCEv2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Path {
    /// Our GID (IPv4-mapped for IPv4).
    pub local_ip: IpAddr,
    /// The remote GID.
    pub remote_ip: IpAddr,
    /// Our port's MAC.
    pub local_mac: [u8; 6],
    /// The remote MAC (or the next hop's).
    pub remote_mac: [u8; 6],
    /// UDP source port for this QP's packets.
    pub udp_sport: u16,
    /// DSCP.
    pub dscp: u8,
    /// ECN codepoint to send with (ECT(0) or ECT(1) for DCQCN, Not-ECT otherwise).
    pub ecn: u8,
    /// 802.1Q VLAN id and priority, if tagged.
    pub vlan: Option<(u16, u8)>,
}

impl Path {
    /// DSCP, ECN and the VLAN tag in range, and both addresses of one IP version.
    pub fn is_valid(&self) -> bool {
        self.ecn <= 3
            && self.dscp < 64
            && self.local_ip.is_ipv4() == self.remote_ip.is_ipv4()
            && self.vlan.is_none_or(|(vid, pcp)| vid < 4095 && pcp < 8)
    }

    /// A path known by its far end only, as verbs' `ibv_ah_attr` names one (the remote GID and
    /// the traffic class): whoever owns the ports resolves our address, the next hop's MAC,
    /// the VLAN and the UDP source port before it reaches a QP.
    pub fn toward(remote_ip: IpAddr, dscp: u8) -> Path {
        Path {
            local_ip: IpAddr::V4(core::net::Ipv4Addr::UNSPECIFIED),
            remote_ip,
            local_mac: [0; 6],
            remote_mac: [0; 6],
            udp_sport: 0,
            dscp,
            ecn: 2,
            vlan: None,
        }
    }

    /// The addressing of simulated endpoints: node `me` is 10.0.0.`me` with MAC
    /// 02:00:00:00:00:`me`, talking to node `other`; DSCP 26, ECT(0), no VLAN.
    pub fn sim(me: u8, other: u8, udp_sport: u16) -> Path {
        Path {
            local_ip: core::net::IpAddr::V4(core::net::Ipv4Addr::new(10, 0, 0, me)),
            remote_ip: core::net::IpAddr::V4(core::net::Ipv4Addr::new(10, 0, 0, other)),
            local_mac: [2, 0, 0, 0, 0, me],
            remote_mac: [2, 0, 0, 0, 0, other],
            udp_sport,
            dscp: 26,
            ecn: 2,
            vlan: None,
        }
    }
}

/// Attributes for a modify; `None` means "not given".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpAttr {
    /// Target state.
    pub state: Option<QpState>,
    /// Remote access the QP allows (REMOTE_WRITE/READ/ATOMIC).
    pub access: Option<Access>,
    /// Partition key index.
    pub pkey_index: Option<u16>,
    /// Path MTU.
    pub path_mtu: Option<Mtu>,
    /// The remote QP number.
    pub dest_qp: Option<u32>,
    /// Expected PSN of the next request received.
    pub rq_psn: Option<u32>,
    /// PSN of the next request sent.
    pub sq_psn: Option<u32>,
    /// Local ACK timeout: 4.096 us * 2^timeout (0 = infinite).
    pub timeout: Option<u8>,
    /// Retransmissions before RETRY_EXC_ERR (0-7).
    pub retry_cnt: Option<u8>,
    /// RNR retries (0-6, 7 = forever).
    pub rnr_retry: Option<u8>,
    /// RNR NAK timer code we send (0-31).
    pub min_rnr_timer: Option<u8>,
    /// READs/atomics we may have outstanding as requester.
    pub max_rd_atomic: Option<u8>,
    /// READs/atomics we accept outstanding as responder.
    pub max_dest_rd_atomic: Option<u8>,
    /// Where the remote end is.
    pub path: Option<Path>,
    /// Q_Key (UD): datagrams carrying another are dropped.
    pub qkey: Option<u32>,
}

impl QpAttr {
    /// An RC connect to `dest_qp` over `path` at `mtu`, every attribute given, with the
    /// settings RoCE deployments commonly use: PSNs from 0, ACK timeout code 14 (67 ms),
    /// retry_cnt 7, rnr_retry 7 (forever), min_rnr_timer 1 (0.01 ms), 16 READs/atomics each
    /// way, remote write, read and atomic allowed; for [`crate::rc::RcQp::connect`]. Change
    /// fields with struct update syntax.
    pub fn connect(path: Path, mtu: Mtu, dest_qp: u32) -> Self {
        QpAttr {
            state: Some(QpState::Rts),
            access: Some(Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC),
            pkey_index: Some(0),
            path_mtu: Some(mtu),
            dest_qp: Some(dest_qp),
            rq_psn: Some(0),
            sq_psn: Some(0),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            min_rnr_timer: Some(1),
            max_rd_atomic: Some(DEFAULT_RD_ATOMIC),
            max_dest_rd_atomic: Some(DEFAULT_RD_ATOMIC),
            path: Some(path),
            qkey: None,
        }
    }

    /// These attributes as the three modifies RESET -> INIT -> RTR -> RTS of an RC QP, each
    /// with the attributes its transition takes (IBTA table 91's RC column); `state` and
    /// `qkey` are not taken. An attribute a transition requires and `self` lacks is refused
    /// by that modify.
    pub fn rc_steps(&self) -> [QpAttr; 3] {
        [
            QpAttr {
                state: Some(QpState::Init),
                pkey_index: Some(self.pkey_index.unwrap_or(0)),
                access: self.access,
                ..Default::default()
            },
            QpAttr {
                state: Some(QpState::Rtr),
                path: self.path,
                path_mtu: self.path_mtu,
                dest_qp: self.dest_qp,
                rq_psn: self.rq_psn,
                max_dest_rd_atomic: self.max_dest_rd_atomic,
                min_rnr_timer: self.min_rnr_timer,
                ..Default::default()
            },
            QpAttr {
                state: Some(QpState::Rts),
                sq_psn: self.sq_psn,
                timeout: self.timeout,
                retry_cnt: self.retry_cnt,
                rnr_retry: self.rnr_retry,
                max_rd_atomic: self.max_rd_atomic,
                ..Default::default()
            },
        ]
    }
}

/// Why a modify was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModifyError {
    /// That transition does not exist.
    #[error("cannot go from {from:?} to {to:?}")]
    BadTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// A required attribute is missing.
    #[error("the transition needs {0}")]
    Missing(&'static str),
    /// An attribute not allowed in this transition was given.
    #[error("{0} cannot be changed in this transition")]
    NotAllowed(&'static str),
    /// An attribute is out of range.
    #[error("{0} is out of range")]
    Invalid(&'static str),
    /// A UD QP asked to connect.
    #[error("a UD QP has no connection: modify it to INIT (with a Q_Key), RTR and RTS")]
    Datagram,
}

/// Maximum outstanding READ/atomic requests in either direction: 128, as Linux rxe offers
/// (`max_qp_rd_atom`). perftest sets a QP's `max_rd_atomic` to the *peer's* `out_reads`, its
/// device's maximum: a smaller figure here refused perftest's modify to RTS against rxe.
/// (Outstanding requests are counted, not given slots: a larger figure costs no memory.)
pub const MAX_RD_ATOMIC: u8 = 128;

/// Outstanding READ/atomic requests a QP connected by [`QpAttr::connect`] allows either way:
/// 16, what most RNICs offer (mlx5's `max_qp_rd_atom`), so that its requests never exceed a
/// hardware peer's responder resources.
pub const DEFAULT_RD_ATOMIC: u8 = 16;

/// The QP's settled attributes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpConfig {
    /// RC or UD (fixed at creation).
    pub qp_type: QpType,
    /// State.
    pub state: QpState,
    /// Remote access allowed.
    pub access: Access,
    /// Partition key index.
    pub pkey_index: u16,
    /// Path MTU.
    pub path_mtu: Option<Mtu>,
    /// Remote QP.
    pub dest_qp: u32,
    /// Next expected request PSN.
    pub rq_psn: Psn,
    /// Next request PSN to send.
    pub sq_psn: Psn,
    /// ACK timeout code.
    pub timeout: u8,
    /// Retry count.
    pub retry_cnt: u8,
    /// RNR retry count (7 = forever).
    pub rnr_retry: u8,
    /// RNR timer code we send.
    pub min_rnr_timer: u8,
    /// Requester's outstanding READ/atomic limit.
    pub max_rd_atomic: u8,
    /// Responder's outstanding READ/atomic limit.
    pub max_dest_rd_atomic: u8,
    /// Where the remote end is.
    pub path: Option<Path>,
    /// Q_Key (UD).
    pub qkey: u32,
}

#[derive(Clone, Copy)]
struct Rule {
    required: &'static [&'static str],
    optional: &'static [&'static str],
}

const NONE: &[&str] = &[];

/// A UD QP's transitions (IBTA table 91's UD column): no path, PSN checks or retries.
fn ud_rule(from: QpState, to: QpState) -> Option<Rule> {
    use QpState::*;
    const QKEY: &[&str] = &["qkey"];
    Some(match (from, to) {
        (_, Reset) | (_, Err) => Rule {
            required: NONE,
            optional: NONE,
        },
        (Reset, Init) => Rule {
            required: &["pkey_index", "qkey"],
            optional: &["path_mtu"],
        },
        (Init, Init) | (Init, Rtr) => Rule {
            required: NONE,
            optional: &["pkey_index", "qkey"],
        },
        (Rtr, Rts) => Rule {
            required: &["sq_psn"],
            optional: QKEY,
        },
        (Rts, Rts) | (Rts, Sqd) | (Sqd, Sqd) | (Sqd, Rts) | (Sqe, Rts) => Rule {
            required: NONE,
            optional: QKEY,
        },
        _ => return None,
    })
}

fn rule(ty: QpType, from: QpState, to: QpState) -> Option<Rule> {
    use QpState::*;
    if ty == QpType::Ud {
        return ud_rule(from, to);
    }
    Some(match (from, to) {
        (_, Reset) | (_, Err) => Rule {
            required: NONE,
            optional: NONE,
        },
        (Reset, Init) => Rule {
            required: &["pkey_index", "access"],
            optional: NONE,
        },
        (Init, Init) => Rule {
            required: NONE,
            optional: &["pkey_index", "access"],
        },
        (Init, Rtr) => Rule {
            required: &[
                "path",
                "path_mtu",
                "dest_qp",
                "rq_psn",
                "max_dest_rd_atomic",
                "min_rnr_timer",
            ],
            optional: &["pkey_index", "access"],
        },
        (Rtr, Rts) => Rule {
            required: &[
                "sq_psn",
                "timeout",
                "retry_cnt",
                "rnr_retry",
                "max_rd_atomic",
            ],
            optional: &["access", "min_rnr_timer"],
        },
        (Rts, Rts) => Rule {
            required: NONE,
            optional: &["access", "min_rnr_timer", "path"],
        },
        (Rts, Sqd) => Rule {
            required: NONE,
            optional: NONE,
        },
        (Sqd, Sqd) => Rule {
            required: NONE,
            optional: &[
                "access",
                "min_rnr_timer",
                "path",
                "timeout",
                "retry_cnt",
                "rnr_retry",
                "max_rd_atomic",
                "max_dest_rd_atomic",
            ],
        },
        (Sqd, Rts) | (Sqe, Rts) => Rule {
            required: NONE,
            optional: &["access", "min_rnr_timer"],
        },
        _ => return None,
    })
}

fn given(a: &QpAttr) -> impl Iterator<Item = &'static str> + '_ {
    [
        ("access", a.access.is_some()),
        ("pkey_index", a.pkey_index.is_some()),
        ("path_mtu", a.path_mtu.is_some()),
        ("dest_qp", a.dest_qp.is_some()),
        ("rq_psn", a.rq_psn.is_some()),
        ("sq_psn", a.sq_psn.is_some()),
        ("timeout", a.timeout.is_some()),
        ("retry_cnt", a.retry_cnt.is_some()),
        ("rnr_retry", a.rnr_retry.is_some()),
        ("min_rnr_timer", a.min_rnr_timer.is_some()),
        ("max_rd_atomic", a.max_rd_atomic.is_some()),
        ("max_dest_rd_atomic", a.max_dest_rd_atomic.is_some()),
        ("path", a.path.is_some()),
        ("qkey", a.qkey.is_some()),
    ]
    .into_iter()
    .filter_map(|(n, g)| g.then_some(n))
}

impl QpConfig {
    /// Applies a modify, whole or not at all. Without a target state the QP stays where it
    /// is (only that state's optional attributes may change).
    pub fn modify(&mut self, a: &QpAttr) -> Result<(), ModifyError> {
        let from = self.state;
        let to = a.state.unwrap_or(from);
        let r = rule(self.qp_type, from, to).ok_or(ModifyError::BadTransition { from, to })?;
        for req in r.required {
            if !given(a).any(|g| g == *req) {
                return Err(ModifyError::Missing(req));
            }
        }
        if let Some(extra) = given(a).find(|g| !r.required.contains(g) && !r.optional.contains(g)) {
            return Err(ModifyError::NotAllowed(extra));
        }
        let check = |ok: bool, name| {
            if ok {
                Ok(())
            } else {
                Err(ModifyError::Invalid(name))
            }
        };
        if let Some(v) = a.dest_qp {
            check(v <= Psn::MASK, "dest_qp")?;
        }
        if let Some(v) = a.rq_psn {
            check(v <= Psn::MASK, "rq_psn")?;
        }
        if let Some(v) = a.sq_psn {
            check(v <= Psn::MASK, "sq_psn")?;
        }
        if let Some(v) = a.timeout {
            check(v <= 31, "timeout")?;
        }
        if let Some(v) = a.retry_cnt {
            check(v <= 7, "retry_cnt")?;
        }
        if let Some(v) = a.rnr_retry {
            check(v <= 7, "rnr_retry")?;
        }
        if let Some(v) = a.min_rnr_timer {
            check(v <= 31, "min_rnr_timer")?;
        }
        if let Some(v) = a.max_rd_atomic {
            check(v <= MAX_RD_ATOMIC, "max_rd_atomic")?;
        }
        if let Some(v) = a.max_dest_rd_atomic {
            check(v <= MAX_RD_ATOMIC, "max_dest_rd_atomic")?;
        }
        if let Some(p) = a.path {
            check(p.is_valid(), "path")?;
        }
        if let Some(acc) = a.access {
            let allowed = Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC
                | Access::LOCAL_WRITE;
            check(acc.bits() & !allowed.bits() == 0, "access")?;
        }
        // Everything checked: apply.
        if to == QpState::Reset {
            *self = QpConfig {
                qp_type: self.qp_type,
                ..QpConfig::default()
            };
            return Ok(());
        }
        self.state = to;
        if let Some(v) = a.access {
            self.access = v;
        }
        if let Some(v) = a.pkey_index {
            self.pkey_index = v;
        }
        if let Some(v) = a.path_mtu {
            self.path_mtu = Some(v);
        }
        if let Some(v) = a.dest_qp {
            self.dest_qp = v;
        }
        if let Some(v) = a.rq_psn {
            self.rq_psn = Psn::new(v);
        }
        if let Some(v) = a.sq_psn {
            self.sq_psn = Psn::new(v);
        }
        if let Some(v) = a.timeout {
            self.timeout = v;
        }
        if let Some(v) = a.retry_cnt {
            self.retry_cnt = v;
        }
        if let Some(v) = a.rnr_retry {
            self.rnr_retry = v;
        }
        if let Some(v) = a.min_rnr_timer {
            self.min_rnr_timer = v;
        }
        if let Some(v) = a.max_rd_atomic {
            self.max_rd_atomic = v;
        }
        if let Some(v) = a.max_dest_rd_atomic {
            self.max_dest_rd_atomic = v;
        }
        if let Some(v) = a.path {
            self.path = Some(v);
        }
        if let Some(v) = a.qkey {
            self.qkey = v;
        }
        Ok(())
    }

    /// The local ACK timeout, 4.096 us * 2^timeout; `None` for 0 (wait forever).
    pub fn ack_timeout(&self) -> Option<core::time::Duration> {
        (self.timeout != 0).then(|| core::time::Duration::from_nanos(4096u64 << self.timeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path() -> Path {
        Path {
            local_ip: "10.0.0.1".parse().unwrap(),
            remote_ip: "10.0.0.2".parse().unwrap(),
            local_mac: [2, 0, 0, 0, 0, 1],
            remote_mac: [2, 0, 0, 0, 0, 2],
            udp_sport: 0xc000,
            dscp: 26,
            ecn: 2,
            vlan: None,
        }
    }

    fn to_init() -> QpAttr {
        QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            access: Some(Access::REMOTE_WRITE | Access::REMOTE_READ),
            ..Default::default()
        }
    }

    fn to_rtr() -> QpAttr {
        QpAttr {
            state: Some(QpState::Rtr),
            path: Some(path()),
            path_mtu: Some(Mtu::M1024),
            dest_qp: Some(0x12),
            rq_psn: Some(100),
            max_dest_rd_atomic: Some(4),
            min_rnr_timer: Some(12),
            ..Default::default()
        }
    }

    fn to_rts() -> QpAttr {
        QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(0xff_fff0),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(4),
            ..Default::default()
        }
    }

    #[test]
    fn connect_path_and_attributes() {
        let mut q = QpConfig::default();
        q.modify(&to_init()).unwrap();
        q.modify(&to_rtr()).unwrap();
        q.modify(&to_rts()).unwrap();
        assert_eq!(q.state, QpState::Rts);
        assert_eq!(
            (q.dest_qp, q.rq_psn, q.sq_psn),
            (0x12, Psn::new(100), Psn::new(0xff_fff0))
        );
        assert_eq!(q.path_mtu.unwrap().bytes(), 1024);
        assert_eq!(
            q.ack_timeout(),
            Some(core::time::Duration::from_nanos(4096 << 14))
        );
        // Drain and back, then error, then reset clears everything.
        q.modify(&QpAttr {
            state: Some(QpState::Sqd),
            ..Default::default()
        })
        .unwrap();
        q.modify(&QpAttr {
            state: Some(QpState::Rts),
            ..Default::default()
        })
        .unwrap();
        q.modify(&QpAttr {
            state: Some(QpState::Err),
            ..Default::default()
        })
        .unwrap();
        q.modify(&QpAttr {
            state: Some(QpState::Reset),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(q, QpConfig::default());
    }

    #[test]
    fn invalid_transitions_and_attributes_change_nothing() {
        let mut q = QpConfig::default();
        assert_eq!(
            q.modify(&to_rtr()),
            Err(ModifyError::BadTransition {
                from: QpState::Reset,
                to: QpState::Rtr
            })
        );
        q.modify(&to_init()).unwrap();
        let before = q;
        let mut a = to_rtr();
        a.dest_qp = None;
        assert_eq!(q.modify(&a), Err(ModifyError::Missing("dest_qp")));
        let mut a = to_rtr();
        a.sq_psn = Some(1);
        assert_eq!(q.modify(&a), Err(ModifyError::NotAllowed("sq_psn")));
        let mut a = to_rtr();
        a.rq_psn = Some(1 << 24);
        assert_eq!(q.modify(&a), Err(ModifyError::Invalid("rq_psn")));
        let mut a = to_rtr();
        a.min_rnr_timer = Some(32);
        assert_eq!(q.modify(&a), Err(ModifyError::Invalid("min_rnr_timer")));
        let mut a = to_rtr();
        let mut p = path();
        p.remote_ip = "fd00::2".parse().unwrap();
        a.path = Some(p);
        assert_eq!(q.modify(&a), Err(ModifyError::Invalid("path")));
        assert_eq!(q, before, "refused modifies change nothing");
        q.modify(&to_rtr()).unwrap();
        let mut a = to_rts();
        a.retry_cnt = Some(8);
        assert_eq!(q.modify(&a), Err(ModifyError::Invalid("retry_cnt")));
        assert_eq!(Mtu::from_bytes(1500), None);
        assert_eq!(Mtu::from_bytes(4096), Some(Mtu::M4096));
    }

    #[test]
    fn ud_qps_take_a_qkey_and_no_path() {
        let mut q = QpConfig {
            qp_type: QpType::Ud,
            ..Default::default()
        };
        // RC's attributes are refused, and a UD INIT needs its Q_Key.
        let mut a = to_init();
        a.qkey = Some(1);
        assert_eq!(q.modify(&a), Err(ModifyError::NotAllowed("access")));
        let init = QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            path_mtu: Some(Mtu::M4096),
            ..Default::default()
        };
        assert_eq!(q.modify(&init), Err(ModifyError::Missing("qkey")));
        q.modify(&QpAttr {
            qkey: Some(0x1111_1111),
            ..init
        })
        .unwrap();
        let rtr_with_path = QpAttr {
            state: Some(QpState::Rtr),
            path: Some(path()),
            ..Default::default()
        };
        assert_eq!(
            q.modify(&rtr_with_path),
            Err(ModifyError::NotAllowed("path"))
        );
        q.modify(&QpAttr {
            state: Some(QpState::Rtr),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(q.modify(&to_rts()), Err(ModifyError::NotAllowed("timeout")));
        q.modify(&QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(7),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            (q.state, q.qkey, q.sq_psn, q.path_mtu),
            (QpState::Rts, 0x1111_1111, Psn::new(7), Some(Mtu::M4096))
        );
        // An RC QP takes no Q_Key; a reset keeps the type.
        let mut rc = QpConfig::default();
        let mut a = to_init();
        a.qkey = Some(1);
        assert_eq!(rc.modify(&a), Err(ModifyError::NotAllowed("qkey")));
        q.modify(&QpAttr {
            state: Some(QpState::Reset),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(q.qp_type, QpType::Ud);
        assert_eq!(q.qkey, 0);
    }
}
