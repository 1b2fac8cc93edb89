//! The control verbs an attached application sends roced, and roced's answers, as the attach
//! socket carries them ([`crate::attach`]). Each request gets one reply; the descriptors that go
//! with a message are named in its documentation.

use serde::{Deserialize, Serialize};

/// What the attach protocol is at (a client of another version is refused at `Hello`).
/// (2: the lcore reads a QP's rings when its doorbell rings, `Welcome` carries the doorbell
/// memory and `Qp` the QP's bit in it; 3: `Welcome` carries the asynchronous event socket.)
pub const VERSION: u32 = 3;

/// Where a ring lies in the memory a reply's descriptor maps, and its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingPlace {
    /// Offset of its header in the memory.
    pub offset: usize,
    /// Its slots.
    pub slots: u32,
    /// Bytes of each slot.
    pub slot_size: u32,
}

/// A run of pages in one of a message's memfds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PieceMsg {
    /// Where it starts in its file (whole pages).
    pub offset: u64,
    /// Its bytes (whole pages).
    pub len: usize,
}

/// A QP's capacities, as `ibv_qp_cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpCapsMsg {
    /// Send queue entries.
    pub max_send_wr: u32,
    /// Receive queue entries.
    pub max_recv_wr: u32,
    /// Scatter/gather entries of a send.
    pub max_send_sge: u32,
    /// Scatter/gather entries of a receive.
    pub max_recv_sge: u32,
    /// Inline bytes of a send.
    pub max_inline_data: u32,
}

/// A modify, as `ibv_qp_attr` with its mask: each field given or not.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModifyMsg {
    /// "INIT", "RTR", "RTS", "SQD", "ERR" or "RESET".
    pub state: String,
    /// Remote access (`IBV_ACCESS_*` bits: REMOTE_WRITE 2, REMOTE_READ 4, REMOTE_ATOMIC 8).
    pub access: Option<u32>,
    /// Path MTU in bytes (256 to 4096).
    pub mtu: Option<u32>,
    /// The remote QP.
    pub dest_qp: Option<u32>,
    /// The remote GID (IPv4, IPv4-mapped or IPv6 address).
    pub remote_gid: Option<String>,
    /// DSCP of the QP's packets.
    pub dscp: Option<u8>,
    /// The peer's first PSN.
    pub rq_psn: Option<u32>,
    /// Our first PSN.
    pub sq_psn: Option<u32>,
    /// Local ACK timeout code.
    pub timeout: Option<u8>,
    /// Retries.
    pub retry_cnt: Option<u8>,
    /// RNR retries.
    pub rnr_retry: Option<u8>,
    /// RNR NAK timer code.
    pub min_rnr_timer: Option<u8>,
    /// READs/atomics outstanding as requester.
    pub max_rd_atomic: Option<u8>,
    /// READs/atomics accepted as responder.
    pub max_dest_rd_atomic: Option<u8>,
    /// UD: the Q_Key datagrams to the QP must carry.
    #[serde(default)]
    pub qkey: Option<u32>,
}

/// An application's control verb.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// The first message: the client's protocol version and process.
    Hello {
        /// [`VERSION`].
        version: u32,
        /// Its process id (for operators' listings).
        pid: u32,
        /// Its command (ditto).
        command: String,
    },
    /// `ibv_alloc_pd`.
    AllocPd,
    /// `ibv_dealloc_pd`.
    DeallocPd {
        /// The PD.
        pd: u32,
    },
    /// `ibv_reg_mr` of `length` bytes the application has at `addr`, at `offset` in the memfd
    /// sent with this message, sealed against shrinking.
    RegMr {
        /// Its PD.
        pd: u32,
        /// The address the application uses for it (what its work requests name).
        addr: u64,
        /// Bytes.
        length: usize,
        /// Where its first byte is in the memory.
        #[serde(default)]
        offset: usize,
        /// The memory as runs of pages in several memfds, sent in this order, mapped one after
        /// the other (an application's own memory adopted at different times); empty: one
        /// memfd, from its start.
        #[serde(default)]
        pieces: Vec<PieceMsg>,
        /// `IBV_ACCESS_*` bits: LOCAL_WRITE 1, REMOTE_WRITE 2, REMOTE_READ 4, REMOTE_ATOMIC 8.
        access: u32,
    },
    /// `ibv_dereg_mr`.
    DeregMr {
        /// Its local key.
        lkey: u32,
    },
    /// `ibv_create_cq` of at least `cqe` entries: the reply carries the ring's memory. With a
    /// completion channel, its eventfd comes with this message: roced writes it when a
    /// completion arrives on the armed CQ.
    CreateCq {
        /// Entries.
        cqe: u32,
        /// An eventfd comes with the message.
        #[serde(default)]
        channel: bool,
    },
    /// `ibv_destroy_cq`.
    DestroyCq {
        /// The CQ.
        cq: u32,
    },
    /// `ibv_create_qp` (RC, or UD): the reply carries the send and receive rings' memory.
    CreateQp {
        /// Its PD.
        pd: u32,
        /// The CQ its send completions go to.
        send_cq: u32,
        /// The CQ its receive completions go to.
        recv_cq: u32,
        /// Its capacities.
        caps: QpCapsMsg,
        /// A UD QP (else RC).
        #[serde(default)]
        ud: bool,
    },
    /// `ibv_create_ah`: an address handle toward `gid`, for UD sends of QPs in `pd`.
    CreateAh {
        /// Its PD.
        pd: u32,
        /// The destination's GID (IPv4, IPv4-mapped or IPv6 address).
        gid: String,
    },
    /// `ibv_destroy_ah`.
    DestroyAh {
        /// The address handle.
        ah: u32,
    },
    /// `ibv_modify_qp`.
    ModifyQp {
        /// The QP.
        qpn: u32,
        /// The attributes given.
        attr: ModifyMsg,
    },
    /// `ibv_query_qp`: its state and PSNs.
    QueryQp {
        /// The QP.
        qpn: u32,
    },
    /// `ibv_destroy_qp`.
    DestroyQp {
        /// The QP.
        qpn: u32,
    },
}

/// roced's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// Done; nothing to say.
    Done,
    /// Attached: the device's name and its first port's GIDs. Its descriptors: the doorbell
    /// memory, then the application's end of the asynchronous event socket ([`crate::event`]).
    Welcome {
        /// "ferroce0".
        device: String,
        /// The GIDs of port 0, in GID table order.
        gids: Vec<String>,
        /// Port 0's MTU (the IP packets it carries), which bounds a QP's path MTU.
        #[serde(default)]
        mtu: u32,
        /// Port 0's MAC address (the device's GUID is made from it, as rxe's).
        #[serde(default)]
        mac: [u8; 6],
        /// Bytes of the doorbell memory that comes with it: a region of
        /// [`crate::bell::BELL_BYTES`] for each lcore, one after the other.
        bells: usize,
    },
    /// A protection domain.
    Pd {
        /// Its number.
        pd: u32,
    },
    /// A registered region.
    Mr {
        /// Local key.
        lkey: u32,
        /// Remote key.
        rkey: u32,
    },
    /// A CQ; its ring is in the memory sent with this reply.
    Cq {
        /// Its number.
        cq: u32,
        /// Bytes of the memory.
        bytes: usize,
        /// The completion ring.
        ring: RingPlace,
    },
    /// A QP; its rings are in the memory sent with this reply.
    Qp {
        /// Its number.
        qpn: u32,
        /// Bytes of the memory.
        bytes: usize,
        /// The send ring (the application produces).
        sq: RingPlace,
        /// The receive ring (the application produces).
        rq: RingPlace,
        /// The PSN it will start sending with unless a modify to RTS names another.
        sq_psn: u32,
        /// Its doorbell: region `bell / BELL_QPS` of the doorbell memory, bit `bell % BELL_QPS`
        /// (see [`crate::bell`]), rung after publishing entries in either ring.
        bell: u32,
    },
    /// An address handle (never 0: a send entry naming address handle 0 is an RC one).
    Ah {
        /// Its number.
        ah: u32,
    },
    /// A QP's state.
    QpState {
        /// "RESET", "INIT", "RTR", "RTS", "SQD", "SQE" or "ERR".
        state: String,
        /// Its send PSN.
        sq_psn: u32,
        /// Its expected receive PSN.
        rq_psn: u32,
    },
    /// Refused.
    Error {
        /// A stable code (as the REST API's).
        code: String,
        /// What went wrong, for people.
        message: String,
    },
}
