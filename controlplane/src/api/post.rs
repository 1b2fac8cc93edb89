//! Work requests: posting sends and receives, polling completions.

use super::*;

#[derive(Deserialize, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub(super) struct SgeBody {
    addr: u64,
    length: u32,
    lkey: u32,
}

pub(super) fn sg_list(v: &[SgeBody]) -> Result<SgList, ApiError> {
    if v.len() > MAX_SGE {
        return Err(ApiError::bad(
            "bad_wr",
            format!("at most {MAX_SGE} SG entries"),
        ));
    }
    Ok(v.iter()
        .map(|s| Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        })
        .collect())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SendBody {
    pub(super) opcode: String,
    #[serde(default)]
    pub(super) wr_id: u64,
    #[serde(default)]
    pub(super) sge: Vec<SgeBody>,
    #[serde(default)]
    pub(super) remote_addr: Option<u64>,
    #[serde(default)]
    pub(super) rkey: Option<u32>,
    #[serde(default)]
    pub(super) imm: Option<u32>,
    #[serde(default)]
    pub(super) compare: Option<u64>,
    #[serde(default)]
    pub(super) swap: Option<u64>,
    #[serde(default)]
    pub(super) add: Option<u64>,
    #[serde(default = "yes")]
    pub(super) signaled: bool,
    #[serde(default)]
    pub(super) solicited: bool,
    #[serde(default)]
    pub(super) fence: bool,
    /// IBV_SEND_INLINE: the SG list's bytes are copied at post time.
    #[serde(default)]
    pub(super) inline: bool,
    /// Where a UD QP's send goes.
    #[serde(default)]
    pub(super) ud: Option<UdBody>,
    // For the stream endpoint only.
    #[serde(default)]
    pub(super) count: Option<u64>,
    #[serde(default)]
    pub(super) depth: Option<usize>,
    #[serde(default)]
    pub(super) timeout_ms: Option<u64>,
    #[serde(default)]
    pub(super) duration_ms: Option<u64>,
    #[serde(default)]
    pub(super) cq_mod: Option<u32>,
}

/// A UD send's destination: verbs' address handle (a GID), remote QPN and Q_Key.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct UdBody {
    remote_gid: String,
    remote_qpn: u32,
    remote_qkey: u32,
}

/// The destination `b` names for a send on `qpn`, resolved (ARP/ND as for a connect); None
/// without one (RC sends, and UD sends the QP refuses as lacking it).
pub(super) fn ud_dest(s: &ApiState, qpn: u32, b: &SendBody) -> Result<Option<UdDest>, ApiError> {
    let Some(u) = &b.ud else {
        return Ok(None);
    };
    let gid = parse_gid(&u.remote_gid)?;
    Ok(Some(s.rdma.ud_dest(
        qpn,
        gid,
        u.remote_qpn,
        u.remote_qkey,
    )?))
}

pub(super) fn yes() -> bool {
    true
}

/// The opcodes a send work request may have, as the API spells them.
pub const OPCODES: [&str; 8] = [
    "send",
    "send-imm",
    "send-inv",
    "write",
    "write-imm",
    "read",
    "cmp-swap",
    "fetch-add",
];

pub(super) fn send_wr(b: &SendBody) -> Result<SendWr, ApiError> {
    let need = |name: &str, v: Option<u64>| {
        v.ok_or_else(|| ApiError::bad("bad_wr", format!("opcode {} needs {name}", b.opcode)))
    };
    let remote = || -> Result<(u64, u32), ApiError> {
        Ok((
            need("remote_addr", b.remote_addr)?,
            need("rkey", b.rkey.map(u64::from))? as u32,
        ))
    };
    let op = match b.opcode.as_str() {
        "send" => SendOp::Send,
        "send-imm" => SendOp::SendWithImm(need("imm", b.imm.map(u64::from))? as u32),
        "send-inv" => SendOp::SendWithInv(need("rkey", b.rkey.map(u64::from))? as u32),
        "write" => {
            let (remote_addr, rkey) = remote()?;
            SendOp::Write { remote_addr, rkey }
        }
        "write-imm" => {
            let (remote_addr, rkey) = remote()?;
            SendOp::WriteWithImm {
                remote_addr,
                rkey,
                imm: need("imm", b.imm.map(u64::from))? as u32,
            }
        }
        "read" => {
            let (remote_addr, rkey) = remote()?;
            SendOp::Read { remote_addr, rkey }
        }
        "cmp-swap" => {
            let (remote_addr, rkey) = remote()?;
            SendOp::CmpSwap {
                remote_addr,
                rkey,
                compare: need("compare", b.compare)?,
                swap: need("swap", b.swap)?,
            }
        }
        "fetch-add" => {
            let (remote_addr, rkey) = remote()?;
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add: need("add", b.add)?,
            }
        }
        o => {
            return Err(ApiError::bad(
                "bad_wr",
                format!("unknown opcode {o:?}: use one of {}", OPCODES.join(", ")),
            ));
        }
    };
    Ok(SendWr {
        wr_id: b.wr_id,
        op,
        sg: sg_list(&b.sge)?,
        signaled: b.signaled,
        solicited: b.solicited,
        fence: b.fence,
        inline: b.inline,
        ud: None,
    })
}

pub(super) async fn qp_send(
    State(s): State<Arc<ApiState>>,
    Path(q): Path<String>,
    b: Bytes,
) -> Reply {
    let qpn = id32("QPN", &q)?;
    let b: SendBody = body(&b)?;
    if b.count.is_some() || b.depth.is_some() || b.timeout_ms.is_some() || b.duration_ms.is_some() {
        return Err(ApiError::bad(
            "bad_wr",
            "count, depth, timeout_ms and duration_ms belong to /stream",
        ));
    }
    let mut wr = send_wr(&b)?;
    let wr_id = b.wr_id;
    blocking(move || {
        wr.ud = ud_dest(&s, qpn, &b)?;
        Ok::<_, ApiError>(s.rdma.post_send(qpn, wr)?)
    })
    .await?;
    ok(json!({"posted": true, "wr_id": wr_id}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RecvBody {
    #[serde(default)]
    wr_id: u64,
    #[serde(default)]
    sge: Vec<SgeBody>,
}

pub(super) async fn qp_recv(
    State(s): State<Arc<ApiState>>,
    Path(q): Path<String>,
    b: Bytes,
) -> Reply {
    let qpn = id32("QPN", &q)?;
    let b: RecvBody = body(&b)?;
    let wr = RecvWr {
        wr_id: b.wr_id,
        sg: sg_list(&b.sge)?,
    };
    blocking(move || s.rdma.post_recv(qpn, wr)).await?;
    ok(json!({"posted": true, "wr_id": b.wr_id}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PollQuery {
    #[serde(default)]
    max: Option<usize>,
    #[serde(default)]
    wait_ms: Option<u64>,
}

/// A poll's `max` (default 16) and wait, checked.
pub(super) fn poll_limits(p: PollQuery) -> Result<(usize, Duration), ApiError> {
    let max = p.max.unwrap_or(16);
    let wait_ms = p.wait_ms.unwrap_or(0);
    if !(1..=4096).contains(&max) || wait_ms > 30_000 {
        return Err(ApiError::bad(
            "bad_query",
            "max is 1 to 4096 and wait_ms at most 30000",
        ));
    }
    Ok((max, Duration::from_millis(wait_ms)))
}

pub(super) fn wc_json(c: &WorkCompletion) -> Value {
    json!({"wr_id": c.wr_id, "status": wc_status_name(c.status),
           "opcode": wc_opcode_name(c.opcode), "byte_len": c.byte_len,
           "imm_data": c.imm_data, "invalidated_rkey": c.invalidated_rkey, "qp_num": c.qp_num,
           "src_qp": c.src_qp})
}

pub(super) async fn qp_poll(
    State(s): State<Arc<ApiState>>,
    Path(q): Path<String>,
    p: Result<Query<PollQuery>, QueryRejection>,
) -> Reply {
    let qpn = id32("QPN", &q)?;
    let (max, wait) = poll_limits(query(p)?)?;
    let (sc, rc) = blocking(move || s.rdma.poll_cq(qpn, max, wait)).await?;
    ok(json!({"send": sc.iter().map(wc_json).collect::<Vec<_>>(),
              "recv": rc.iter().map(wc_json).collect::<Vec<_>>()}))
}
