//! The control verbs an attached application sends roced, and roced's answers, as the attach
//! socket carries them ([`crate::attach`]). Each request gets one reply; the descriptors that go
//! with a message are named in its documentation.

use serde::{Deserialize, Serialize};

/// What the attach protocol is at (a client of another version is refused at `Hello`).
/// (2: the lcore reads a QP's rings when its doorbell rings, `Welcome` carries the doorbell
/// memory and `Qp` the QP's bit in it; 3: `Welcome` carries the asynchronous event socket;
/// 4: the RDMA CM's verbs, with their events on sockets of their own, [`CmEventMsg`].)
pub const VERSION: u32 = 4;

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
    /// One of the RDMA CM's verbs.
    Cm(CmRequest),
}

/// The RDMA CM's verbs (`rdma_*`), as [`Request::Cm`] carries them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CmRequest {
    /// `rdma_create_event_channel`'s other end: the `SOCK_SEQPACKET` socket sent with this
    /// message is where roced writes the events ([`CmEventMsg`]) of the listeners and
    /// connections made on this channel. Answered with [`Reply::CmChannel`].
    Channel,
    /// `rdma_resolve_addr`: which of the device's addresses reaches `peer` (IPv4 or IPv6),
    /// through roced's routes and neighbour table. Answered with [`Reply::CmAddr`].
    ResolveAddr {
        /// The destination.
        peer: String,
    },
    /// `rdma_listen` on `port` of rdma_cm's TCP port space (RC), or its UDP one (UD, SIDR):
    /// each request that comes is told on `channel` as a `ConnectRequest` naming `id`.
    Listen {
        /// The channel ([`Reply::CmChannel`]).
        channel: u32,
        /// What the events name (the application's handle of the listening ID).
        id: u64,
        /// The UDP port space (else TCP).
        udp: bool,
        /// The port.
        port: u16,
        /// Requests held unaccepted at most.
        backlog: u32,
    },
    /// Stops listening (`rdma_destroy_id` of a listening ID).
    Unlisten {
        /// The UDP port space (else TCP).
        udp: bool,
        /// The port.
        port: u16,
    },
    /// `rdma_connect`: RC QP `qpn` (in RESET or INIT) connected to whoever listens on `port`
    /// at `peer` (a REQ; `Established`, `Rejected` or `Unreachable` on `channel` later); in
    /// the UDP space UD QP `qpn` resolves the peer's service (a SIDR_REQ; `Established`
    /// carries its QPN and Q_Key).
    Connect {
        /// The channel.
        channel: u32,
        /// What the events name.
        id: u64,
        /// The QP.
        qpn: u32,
        /// The UDP port space (else TCP).
        udp: bool,
        /// The peer's address.
        peer: String,
        /// The peer's port.
        port: u16,
        /// The application's private data (after rdma_cm's header in the REQ).
        #[serde(default)]
        private_data: Vec<u8>,
        /// READs and atomics the QP answers at once (0: as the device offers).
        #[serde(default)]
        responder_resources: u8,
        /// READs and atomics the QP has outstanding at once (0: as the device offers).
        #[serde(default)]
        initiator_depth: u8,
        /// Transport retries (7 at most).
        #[serde(default)]
        retry_count: u8,
        /// RNR retries (7: for ever).
        #[serde(default)]
        rnr_retry_count: u8,
    },
    /// `rdma_accept` of request `conn` (a `ConnectRequest`) with QP `qpn`: RC, a REP
    /// (`Established` on `channel` when the RTU comes); UDP, a SIDR_REP with UD QP `qpn`.
    Accept {
        /// The channel.
        channel: u32,
        /// What the events name (the application's handle of the new ID).
        id: u64,
        /// The request.
        conn: u32,
        /// The UDP port space (else TCP).
        udp: bool,
        /// The port it came to.
        port: u16,
        /// The QP.
        qpn: u32,
        /// The application's private data (the REP's).
        #[serde(default)]
        private_data: Vec<u8>,
        /// READs and atomics the QP answers at once (0: as the device offers).
        #[serde(default)]
        responder_resources: u8,
        /// READs and atomics the QP has outstanding at once (0: as the device offers).
        #[serde(default)]
        initiator_depth: u8,
    },
    /// `rdma_reject` of request `conn`.
    Reject {
        /// The request.
        conn: u32,
        /// The UDP port space (else TCP).
        udp: bool,
    },
    /// `rdma_disconnect`: a DREQ (`Disconnected` on the connection's channel when the DREP
    /// comes, or the CM gives up).
    Disconnect {
        /// The connection.
        conn: u32,
    },
    /// `rdma_destroy_id` of a connection's ID: no more events for it; a connection still up
    /// is disconnected.
    Release {
        /// The connection.
        conn: u32,
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
    /// An event channel.
    CmChannel {
        /// Its number in the session.
        channel: u32,
    },
    /// The device's address that reaches a peer.
    CmAddr {
        /// The source address (IPv4 or IPv6).
        local: String,
    },
    /// Refused.
    Error {
        /// A stable code (as the REST API's).
        code: String,
        /// What went wrong, for people.
        message: String,
    },
}

/// What happened to a CM ID, as `rdma_get_cm_event` reports it: one message on an event
/// channel's socket ([`CmRequest::Channel`]), JSON. The events of address and route
/// resolution are the library's own, written on the same socket.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmEventMsg {
    /// What happened.
    pub kind: CmEventKind,
    /// The application's handle of the ID it concerns (for `ConnectRequest`, the listener's).
    pub id: u64,
    /// The connection (its communication ID in roced).
    #[serde(default)]
    pub conn: u32,
    /// librdmacm's status: 0, a negative errno, or a REJ's reason code.
    #[serde(default)]
    pub status: i32,
    /// The peer's private data (a REQ's after rdma_cm's header, a REP's, a SIDR_REP's).
    #[serde(default)]
    pub private_data: Vec<u8>,
    /// The peer's address.
    #[serde(default)]
    pub peer: Option<String>,
    /// The peer's port.
    #[serde(default)]
    pub peer_port: u16,
    /// Our address the request came to.
    #[serde(default)]
    pub local: Option<String>,
    /// Our port it came to.
    #[serde(default)]
    pub local_port: u16,
    /// The peer's QP.
    #[serde(default)]
    pub remote_qpn: u32,
    /// The peer's UD QP's Q_Key.
    #[serde(default)]
    pub qkey: u32,
    /// The peer's responder resources.
    #[serde(default)]
    pub responder_resources: u8,
    /// The peer's initiator depth.
    #[serde(default)]
    pub initiator_depth: u8,
    /// The peer's retry count.
    #[serde(default)]
    pub retry_count: u8,
    /// The peer's RNR retry count.
    #[serde(default)]
    pub rnr_retry_count: u8,
}

/// The events, as `enum rdma_cm_event_type` names them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CmEventKind {
    /// RDMA_CM_EVENT_ADDR_RESOLVED.
    #[default]
    AddrResolved,
    /// RDMA_CM_EVENT_ADDR_ERROR.
    AddrError,
    /// RDMA_CM_EVENT_ROUTE_RESOLVED.
    RouteResolved,
    /// RDMA_CM_EVENT_CONNECT_REQUEST.
    ConnectRequest,
    /// RDMA_CM_EVENT_CONNECT_ERROR.
    ConnectError,
    /// RDMA_CM_EVENT_UNREACHABLE.
    Unreachable,
    /// RDMA_CM_EVENT_REJECTED.
    Rejected,
    /// RDMA_CM_EVENT_ESTABLISHED.
    Established,
    /// RDMA_CM_EVENT_DISCONNECTED.
    Disconnected,
}

impl CmEventMsg {
    /// Its message.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an event serializes")
    }

    /// The event a message carries; None for bytes that are not one.
    pub fn decode(b: &[u8]) -> Option<CmEventMsg> {
        serde_json::from_slice(b).ok()
    }
}

/// Sends `e` on an event channel's socket without waiting; false if it was not sent (the
/// application's end full or closed).
pub fn post_cm_event(fd: impl rustix::fd::AsFd, e: &CmEventMsg) -> bool {
    let b = e.encode();
    use rustix::net::{SendFlags, send};
    matches!(send(fd, &b, SendFlags::DONTWAIT | SendFlags::NOSIGNAL), Ok(n) if n == b.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cm_event_crosses_a_channel_socket_whole() {
        let (mine, theirs) = crate::event::pair().unwrap();
        let e = CmEventMsg {
            kind: CmEventKind::ConnectRequest,
            id: 0x7fff_1234_5678,
            conn: 9,
            private_data: vec![0xab; 56],
            peer: Some("10.0.0.2".into()),
            peer_port: 40000,
            ..Default::default()
        };
        assert!(post_cm_event(&mine, &e));
        let mut b = [0u8; 4096];
        let (n, _) = rustix::net::recv(&theirs, &mut b, rustix::net::RecvFlags::empty()).unwrap();
        assert_eq!(CmEventMsg::decode(&b[..n]), Some(e));
        assert_eq!(CmEventMsg::decode(b"{\"kind\":\"Nope\"}"), None);
    }
}
