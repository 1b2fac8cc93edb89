//! `rocectl decode`: one line per RoCEv2 packet of a pcap or pcapng file, as tshark shows the
//! protocol, with the ICRC checked, and a summary.

use pcap_file::pcap::PcapReader;
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;
use pcap_file::pcapng::{Block, PcapNgReader};
use serde_json::json;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;
use wire::aeth::{NakCode, Syndrome};
use wire::cm::{CmaHeader, Message, MsgKind, split_service_id};
use wire::mad::{GSI_QPN, MadError};
use wire::packet::{Checks, PacketInfo, parse};
use wire::{Error as WireError, icrc, ipv4::Ecn};

/// What can go wrong reading a capture.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The file could not be opened or read.
    #[error("{path}: {err}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        err: std::io::Error,
    },
    /// Not a pcap or pcapng file, or a damaged one.
    #[error("{path}: not a readable pcap or pcapng file: {msg}")]
    Format {
        /// The file.
        path: String,
        /// The reader's message.
        msg: String,
    },
}

/// Totals over a capture.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Frames in the file.
    pub frames: u64,
    /// RoCEv2 packets.
    pub roce: u64,
    /// Of those, with a bad ICRC.
    pub bad_icrc: u64,
    /// UDP-4791 frames that failed to parse, by reason.
    pub malformed: BTreeMap<&'static str, u64>,
    /// Frames that are not RoCEv2 (ARP, TCP, ...).
    pub other: u64,
    /// Frames of a link type other than Ethernet (skipped).
    pub not_ethernet: u64,
    /// RoCEv2 packets by opcode name.
    pub by_opcode: BTreeMap<&'static str, u64>,
    /// CE-marked RoCEv2 packets.
    pub ce_marked: u64,
    /// Connection manager MADs (UD SENDs to QP1) by message, or "MAD error" for one that is not.
    pub by_cm: BTreeMap<&'static str, u64>,
}

fn reason(e: WireError) -> &'static str {
    match e {
        WireError::Truncated => "truncated",
        WireError::BadVersion => "bad version",
        WireError::BadLength => "bad length",
        WireError::NotRoce => "not RoCEv2",
        WireError::BadChecksum => "bad IPv4 checksum",
        WireError::Fragment => "IP fragment",
        WireError::UnknownOpcode => "unknown opcode",
        WireError::PadMismatch => "pad mismatch",
        WireError::BadIcrc => "bad ICRC",
    }
}

fn syndrome_text(s: Syndrome) -> String {
    match s {
        Syndrome::Ack { credits } => format!("ACK credits={credits}"),
        Syndrome::RnrNak { timer } => format!(
            "RNR NAK timer={timer} ({:.2} ms)",
            wire::aeth::rnr_duration(timer).as_secs_f64() * 1e3
        ),
        Syndrome::Nak(c) => format!(
            "NAK {}",
            match c {
                NakCode::PsnSequenceError => "PSN sequence error".to_string(),
                NakCode::InvalidRequest => "invalid request".to_string(),
                NakCode::RemoteAccessError => "remote access error".to_string(),
                NakCode::RemoteOperationalError => "remote operational error".to_string(),
                NakCode::InvalidRdRequest => "invalid RD request".to_string(),
                NakCode::Reserved(x) => format!("reserved code {x}"),
            }
        ),
        Syndrome::Reserved(b) => format!("reserved syndrome {b:#04x}"),
    }
}

fn ecn_text(e: Ecn) -> &'static str {
    match e {
        Ecn::NotEct => "Not-ECT",
        Ecn::Ect0 => "ECT(0)",
        Ecn::Ect1 => "ECT(1)",
        Ecn::Ce => "CE",
    }
}

/// The MAD a UD SEND Only to QP1 carries, parsed as a CM message.
fn cm_mad(p: &PacketInfo, frame: &[u8]) -> Option<Result<(u64, Message), MadError>> {
    (p.dest_qp == GSI_QPN && p.opcode == wire::opcode::op::UD_SEND_ONLY)
        .then(|| Message::parse(p.payload(frame)).map(|(h, m)| (h.tid, m)))
}

fn service_text(sid: u64) -> String {
    match split_service_id(sid) {
        Some((ps, port)) => format!("{sid:#018x} ({} port {port})", ps.name()),
        None => format!("{sid:#018x}"),
    }
}

fn msg_kind(k: MsgKind) -> &'static str {
    match k {
        MsgKind::Req => "REQ",
        MsgKind::Rep => "REP",
        MsgKind::Other => "other",
        MsgKind::Reserved => "reserved",
    }
}

/// The rdma_cm header of a REQ's or SIDR_REQ's private data, if it holds one.
fn cma_text(private_data: &[u8]) -> String {
    match CmaHeader::parse(private_data) {
        Ok(h) => format!(
            " rdma_cm {} -> {}",
            std::net::SocketAddr::new(h.src, h.src_port),
            h.dst
        ),
        Err(_) => String::new(),
    }
}

/// A CM message's fields, as text.
fn cm_text(tid: u64, m: &Message) -> String {
    let (local, remote) = m.comm_ids();
    let mut s = format!(" CM {} TID={tid:#x}", m.name());
    match m {
        Message::Req(r) => {
            let _ = write!(
                s,
                " localCommID={local:#010x} serviceID={} QPN={:#08x} PSN={:#08x} MTU={} \
                 RespRes={} InitDepth={} retry={} rnr={} timeouts={}/{} GID {} -> {} TC={} HL={}{}",
                service_text(r.service_id),
                r.local_qpn,
                r.starting_psn,
                wire::cm::path_mtu_bytes(r.path_mtu).map_or("?".into(), |b| b.to_string()),
                r.responder_resources,
                r.initiator_depth,
                r.retry_count,
                r.rnr_retry_count,
                r.local_cm_response_timeout,
                r.remote_cm_response_timeout,
                r.primary.local_gid,
                r.primary.remote_gid,
                r.primary.traffic_class,
                r.primary.hop_limit,
                cma_text(&r.private_data)
            );
        }
        Message::Rep(r) => {
            let _ = write!(
                s,
                " localCommID={local:#010x} remoteCommID={remote:#010x} QPN={:#08x} PSN={:#08x} \
                 RespRes={} InitDepth={} rnr={}",
                r.local_qpn,
                r.starting_psn,
                r.responder_resources,
                r.initiator_depth,
                r.rnr_retry_count
            );
        }
        Message::Rtu(_) | Message::Drep(_) => {
            let _ = write!(s, " localCommID={local:#010x} remoteCommID={remote:#010x}");
        }
        Message::Dreq(d) => {
            let _ = write!(
                s,
                " localCommID={local:#010x} remoteCommID={remote:#010x} remoteQPN={:#08x}",
                d.remote_qpn
            );
        }
        Message::Rej(r) => {
            let _ = write!(
                s,
                " localCommID={local:#010x} remoteCommID={remote:#010x} rejected={} reason={} ({})",
                msg_kind(r.message_rejected),
                r.reason.code(),
                r.reason.name()
            );
        }
        Message::Mra(r) => {
            let _ = write!(
                s,
                " localCommID={local:#010x} remoteCommID={remote:#010x} MRAed={} serviceTimeout={}",
                msg_kind(r.message_mraed),
                r.service_timeout
            );
        }
        Message::SidrReq(r) => {
            let _ = write!(
                s,
                " requestID={local:#010x} serviceID={}{}",
                service_text(r.service_id),
                cma_text(&r.private_data)
            );
        }
        Message::SidrRep(r) => {
            let _ = write!(
                s,
                " requestID={local:#010x} status={} QPN={:#08x} qkey={:#010x} serviceID={}",
                r.status.code(),
                r.qpn,
                r.qkey,
                service_text(r.service_id)
            );
        }
    }
    s
}

/// A CM message's fields, as JSON.
fn cm_json(tid: u64, m: &Message) -> serde_json::Value {
    let (local, remote) = m.comm_ids();
    let mut v = json!({"attr": m.name(), "attr_id": m.attr_id(), "tid": tid});
    let cma = |pd: &[u8]| {
        CmaHeader::parse(pd).ok().map(
            |h| json!({"src": h.src.to_string(), "src_port": h.src_port, "dst": h.dst.to_string()}),
        )
    };
    let ps = |sid: u64| {
        split_service_id(sid).map(|(ps, port)| json!({"port_space": ps.name(), "port": port}))
    };
    match m {
        Message::Req(r) => {
            v["local_comm_id"] = json!(local);
            v["service_id"] = json!(r.service_id);
            v["rdma_cm_service"] = json!(ps(r.service_id));
            v["qpn"] = json!(r.local_qpn);
            v["starting_psn"] = json!(r.starting_psn);
            v["path_mtu"] = json!(r.path_mtu);
            v["responder_resources"] = json!(r.responder_resources);
            v["initiator_depth"] = json!(r.initiator_depth);
            v["retry_count"] = json!(r.retry_count);
            v["rnr_retry_count"] = json!(r.rnr_retry_count);
            v["local_gid"] = json!(r.primary.local_gid.to_string());
            v["remote_gid"] = json!(r.primary.remote_gid.to_string());
            v["traffic_class"] = json!(r.primary.traffic_class);
            v["hop_limit"] = json!(r.primary.hop_limit);
            v["rdma_cm"] = json!(cma(&r.private_data));
        }
        Message::Rep(r) => {
            v["local_comm_id"] = json!(local);
            v["remote_comm_id"] = json!(remote);
            v["qpn"] = json!(r.local_qpn);
            v["starting_psn"] = json!(r.starting_psn);
            v["responder_resources"] = json!(r.responder_resources);
            v["initiator_depth"] = json!(r.initiator_depth);
            v["rnr_retry_count"] = json!(r.rnr_retry_count);
        }
        Message::Rtu(_)
        | Message::Drep(_)
        | Message::Dreq(_)
        | Message::Rej(_)
        | Message::Mra(_) => {
            v["local_comm_id"] = json!(local);
            v["remote_comm_id"] = json!(remote);
            match m {
                Message::Dreq(d) => v["remote_qpn"] = json!(d.remote_qpn),
                Message::Rej(r) => {
                    v["rejected"] = json!(msg_kind(r.message_rejected));
                    v["reason"] = json!(r.reason.code());
                    v["reason_text"] = json!(r.reason.name());
                }
                Message::Mra(r) => {
                    v["mraed"] = json!(msg_kind(r.message_mraed));
                    v["service_timeout"] = json!(r.service_timeout);
                }
                _ => {}
            }
        }
        Message::SidrReq(r) => {
            v["request_id"] = json!(local);
            v["service_id"] = json!(r.service_id);
            v["rdma_cm_service"] = json!(ps(r.service_id));
            v["rdma_cm"] = json!(cma(&r.private_data));
        }
        Message::SidrRep(r) => {
            v["request_id"] = json!(local);
            v["status"] = json!(r.status.code());
            v["qpn"] = json!(r.qpn);
            v["qkey"] = json!(r.qkey);
            v["service_id"] = json!(r.service_id);
        }
    }
    v
}

/// One packet as a line of text.
fn text_line(no: u64, t: Duration, p: &PacketInfo, frame: &[u8], icrc_ok: bool) -> String {
    let mut s = format!(
        "{no:>6} {:>12.6} {} -> {} sport {} {} QP={:#08x} PSN={} AckReq={}",
        t.as_secs_f64(),
        p.src_ip,
        p.dst_ip,
        p.udp_src,
        p.op.name,
        p.dest_qp,
        p.psn,
        p.ack_req as u8
    );
    if p.se {
        s.push_str(" SE=1");
    }
    if p.becn {
        s.push_str(" BECN=1");
    }
    if let Some(v) = p.vlan {
        let _ = write!(s, " VLAN={} PCP={}", v.vid, v.pcp);
    }
    if let Some(d) = p.ext.deth() {
        let _ = write!(s, " DETH qkey={:#010x} srcQP={:#08x}", d.qkey, d.src_qp);
    }
    if let Some(r) = p.ext.reth() {
        let _ = write!(
            s,
            " RETH va={:#x} rkey={:#x} len={}",
            r.va, r.rkey, r.dma_len
        );
    }
    if let Some(a) = p.ext.atomic_eth() {
        let _ = write!(
            s,
            " AtomicETH va={:#x} rkey={:#x} swap_add={:#x} compare={:#x}",
            a.va, a.rkey, a.swap_add, a.compare
        );
    }
    if let Some(a) = p.ext.aeth() {
        let _ = write!(s, " AETH {} MSN={}", syndrome_text(a.syndrome), a.msn);
    }
    if let Some(a) = p.ext.atomic_ack() {
        let _ = write!(s, " AtomicAckETH orig={:#x}", a.orig);
    }
    if let Some(i) = p.ext.immdt() {
        let _ = write!(s, " ImmDt={i:#010x}");
    }
    if let Some(r) = p.ext.ieth() {
        let _ = write!(s, " IETH rkey={r:#x}");
    }
    if p.op.has(wire::opcode::mask::PAYLOAD) {
        let _ = write!(s, " payload={}", p.payload_len);
    }
    match cm_mad(p, frame) {
        Some(Ok((tid, m))) => s.push_str(&cm_text(tid, &m)),
        Some(Err(e)) => {
            let _ = write!(s, " MAD not CM: {e}");
        }
        None => {}
    }
    let _ = write!(
        s,
        " ECN={} ICRC={}",
        ecn_text(p.ecn),
        if icrc_ok { "good" } else { "BAD" }
    );
    s
}

fn json_line(
    no: u64,
    t: Duration,
    p: &PacketInfo,
    frame: &[u8],
    icrc_ok: bool,
) -> serde_json::Value {
    let mut v = json!({
        "frame": no, "time": t.as_secs_f64(), "src": p.src_ip.to_string(), "dst": p.dst_ip.to_string(),
        "udp_sport": p.udp_src, "opcode": p.opcode, "opcode_name": p.op.name, "dest_qp": p.dest_qp,
        "psn": p.psn.value(), "ack_req": p.ack_req, "se": p.se, "becn": p.becn, "pkey": p.pkey,
        "pad": p.pad, "payload_len": p.payload_len, "ecn": ecn_text(p.ecn), "dscp": p.dscp,
        "icrc": format!("{:#010x}", p.icrc), "icrc_ok": icrc_ok,
    });
    if let Some(t) = p.vlan {
        v["vlan"] = json!({"vid": t.vid, "pcp": t.pcp});
    }
    if let Some(r) = p.ext.reth() {
        v["reth"] = json!({"va": r.va, "rkey": r.rkey, "dma_len": r.dma_len});
    }
    if let Some(a) = p.ext.aeth() {
        v["aeth"] = json!({"syndrome": a.syndrome.to_byte(), "text": syndrome_text(a.syndrome), "msn": a.msn});
    }
    if let Some(a) = p.ext.atomic_eth() {
        v["atomic_eth"] =
            json!({"va": a.va, "rkey": a.rkey, "swap_add": a.swap_add, "compare": a.compare});
    }
    if let Some(a) = p.ext.atomic_ack() {
        v["atomic_ack"] = json!({"orig": a.orig});
    }
    if let Some(d) = p.ext.deth() {
        v["deth"] = json!({"qkey": d.qkey, "src_qp": d.src_qp});
    }
    if let Some(i) = p.ext.immdt() {
        v["immdt"] = json!(i);
    }
    if let Some(r) = p.ext.ieth() {
        v["ieth"] = json!(r);
    }
    match cm_mad(p, frame) {
        Some(Ok((tid, m))) => v["cm"] = cm_json(tid, &m),
        Some(Err(e)) => v["mad_error"] = json!(e.to_string()),
        None => {}
    }
    v
}

/// A packet from either file format: timestamp, link type (1 = Ethernet), bytes.
type Visit<'a> = dyn FnMut(Duration, u32, &[u8]) + 'a;

fn read_packets(
    path: &Path,
    mut visit: impl FnMut(Duration, u32, &[u8]),
) -> Result<(), DecodeError> {
    let p = path.display().to_string();
    let mut file = std::fs::File::open(path).map_err(|err| DecodeError::Io {
        path: p.clone(),
        err,
    })?;
    let mut magic = [0u8; 4];
    file.read_exact(&mut magic).map_err(|err| DecodeError::Io {
        path: p.clone(),
        err,
    })?;
    let file = std::fs::File::open(path).map_err(|err| DecodeError::Io {
        path: p.clone(),
        err,
    })?;
    let fmt = |e: pcap_file::PcapError| DecodeError::Format {
        path: p.clone(),
        msg: e.to_string(),
    };
    let visit: &mut Visit<'_> = &mut visit;
    if magic == [0x0a, 0x0d, 0x0d, 0x0a] {
        let mut r = PcapNgReader::new(file).map_err(fmt)?;
        // Per interface: link type and timestamp ticks per second (if_tsresol, default 10^6).
        let mut ifaces: Vec<(u32, u128)> = Vec::new();
        while let Some(b) = r.next_block() {
            match b.map_err(fmt)? {
                Block::InterfaceDescription(i) => {
                    let mut tps: u128 = 1_000_000;
                    for o in &i.options {
                        if let InterfaceDescriptionOption::IfTsResol(r) = o {
                            let e = (r & 0x7f) as u32;
                            tps = if r & 0x80 != 0 {
                                1u128.checked_shl(e).unwrap_or(1)
                            } else {
                                10u128.saturating_pow(e)
                            };
                        }
                    }
                    ifaces.push((u32::from(i.linktype), tps.max(1)));
                }
                Block::EnhancedPacket(e) => {
                    let (lt, tps) = ifaces
                        .get(e.interface_id as usize)
                        .copied()
                        .unwrap_or((1, 1_000_000));
                    // pcap-file hands over the raw 64-bit tick count as nanoseconds.
                    let ticks = e.timestamp.as_nanos();
                    let ns = ticks.saturating_mul(1_000_000_000) / tps;
                    visit(
                        Duration::from_nanos(ns.min(u64::MAX as u128) as u64),
                        lt,
                        &e.data,
                    );
                }
                Block::SimplePacket(s) => {
                    visit(Duration::ZERO, ifaces.first().map_or(1, |i| i.0), &s.data)
                }
                _ => {}
            }
        }
    } else {
        let mut r = PcapReader::new(file).map_err(fmt)?;
        let lt = u32::from(r.header().datalink);
        while let Some(pkt) = r.next_packet() {
            let pkt = pkt.map_err(fmt)?;
            visit(pkt.timestamp, lt, &pkt.data);
        }
    }
    Ok(())
}

/// Decodes a capture, writing lines to `out`; returns the summary.
pub fn decode(path: &Path, json_out: bool, out: &mut dyn Write) -> Result<Summary, DecodeError> {
    let mut sum = Summary::default();
    let mut t0: Option<Duration> = None;
    let mut werr: Option<std::io::Error> = None;
    read_packets(path, |ts, linktype, frame| {
        sum.frames += 1;
        if linktype != 1 {
            sum.not_ethernet += 1;
            return;
        }
        let t = ts.saturating_sub(*t0.get_or_insert(ts));
        let info = match parse(frame, Checks::NONE) {
            Ok(i) => i,
            Err(WireError::NotRoce) => {
                sum.other += 1;
                return;
            }
            Err(e) => {
                *sum.malformed.entry(reason(e)).or_default() += 1;
                let line = if json_out {
                    json!({"frame": sum.frames, "time": t.as_secs_f64(), "malformed": reason(e)})
                        .to_string()
                } else {
                    format!(
                        "{:>6} {:>12.6} malformed RoCEv2 packet: {}",
                        sum.frames,
                        t.as_secs_f64(),
                        reason(e)
                    )
                };
                if let Err(e) = writeln!(out, "{line}") {
                    werr.get_or_insert(e);
                }
                return;
            }
        };
        let l3 = &frame[info.l3_off as usize
            ..info.payload_off as usize
                + info.payload_len as usize
                + info.pad as usize
                + icrc::LEN];
        let icrc_ok = icrc::verify(l3, info.src_ip.is_ipv6()).is_ok();
        sum.roce += 1;
        if !icrc_ok {
            sum.bad_icrc += 1;
        }
        if info.ecn == Ecn::Ce {
            sum.ce_marked += 1;
        }
        *sum.by_opcode.entry(info.op.name).or_default() += 1;
        match cm_mad(&info, frame) {
            Some(Ok((_, m))) => *sum.by_cm.entry(m.name()).or_default() += 1,
            Some(Err(_)) => *sum.by_cm.entry("MAD error").or_default() += 1,
            None => {}
        }
        let line = if json_out {
            json_line(sum.frames, t, &info, frame, icrc_ok).to_string()
        } else {
            text_line(sum.frames, t, &info, frame, icrc_ok)
        };
        if let Err(e) = writeln!(out, "{line}") {
            werr.get_or_insert(e);
        }
    })?;
    if let Some(err) = werr {
        return Err(DecodeError::Io {
            path: "stdout".into(),
            err,
        });
    }
    Ok(sum)
}

/// The summary as text.
pub fn summary_text(s: &Summary) -> String {
    let mut t = format!(
        "{} frames: {} RoCEv2 ({} with bad ICRC, {} CE-marked), {} malformed, {} other{}\n",
        s.frames,
        s.roce,
        s.bad_icrc,
        s.ce_marked,
        s.malformed.values().sum::<u64>(),
        s.other,
        if s.not_ethernet > 0 {
            format!(", {} not Ethernet", s.not_ethernet)
        } else {
            String::new()
        }
    );
    for (op, n) in &s.by_opcode {
        let _ = writeln!(t, "  {n:>8}  {op}");
    }
    for (m, n) in &s.by_cm {
        let _ = writeln!(t, "  {n:>8}  CM {m}");
    }
    for (r, n) in &s.malformed {
        let _ = writeln!(t, "  {n:>8}  malformed: {r}");
    }
    t
}

/// The summary as JSON.
pub fn summary_json(s: &Summary) -> serde_json::Value {
    json!({"summary": {"frames": s.frames, "roce": s.roce, "bad_icrc": s.bad_icrc, "ce_marked": s.ce_marked,
        "malformed": s.malformed, "other": s.other, "not_ethernet": s.not_ethernet, "by_opcode": s.by_opcode, "by_cm": s.by_cm}})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capture(name: &str) -> std::path::PathBuf {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data/rxe")
            .join(name)
    }

    #[test]
    fn decodes_a_capture_line_per_packet() {
        let mut out = Vec::new();
        let s = decode(&capture("atomic_cs.pcap"), false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count() as u64, s.roce);
        assert_eq!(s.bad_icrc, 0);
        assert!(s.other > 0, "the TCP exchange is in the file");
        assert!(
            text.contains("RC CmpSwap") && text.contains("AtomicETH va="),
            "{text}"
        );
        assert!(text.contains("RC Atomic Acknowledge") && text.contains("AtomicAckETH orig="));
        assert!(text.lines().all(|l| l.ends_with("ICRC=good")));
    }

    #[test]
    fn json_lines_parse_and_name_naks() {
        let mut out = Vec::new();
        let s = decode(&capture("hostpeer_probe_rnr.pcap"), true, &mut out).unwrap();
        let lines: Vec<serde_json::Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len() as u64, s.roce);
        assert!(lines.iter().any(|l| l["aeth"]["syndrome"] == 0x2c
            && l["aeth"]["text"].as_str().unwrap().starts_with("RNR NAK")));
    }

    #[test]
    fn connection_manager_mads_show_their_fields() {
        let mut out = Vec::new();
        let s = decode(&capture("write_bw_cm.pcap"), false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        for m in ["REQ", "REP", "RTU", "DREQ", "DREP"] {
            assert_eq!(s.by_cm.get(m), Some(&2), "{m}: {:?}", s.by_cm);
        }
        let req = text.lines().find(|l| l.contains(" CM REQ ")).unwrap();
        for f in [
            "localCommID=0x4a2d60bb",
            "serviceID=0x0000000001064853 (RDMA_PS_TCP port 18515)",
            "QPN=0x00001a PSN=0x1c9b73 MTU=1024",
            "rdma_cm 10.233.0.10:58899 -> 10.233.0.11",
        ] {
            assert!(req.contains(f), "{f} in {req}");
        }
        assert!(text.contains(
            "CM REP TID=0x2bb602d4a localCommID=0x95a48a9e remoteCommID=0x4a2d60bb QPN=0x00001a PSN=0xfb57f7"
        ));
        assert!(text.contains("CM DREQ TID=0x2bb602d4b localCommID=0x4b2d60bb remoteCommID=0x97a48a9e remoteQPN=0x00001b"));
        assert!(summary_text(&s).contains("2  CM DREP"));
        let mut out = Vec::new();
        decode(&capture("rping_cm_v6.pcap"), false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("rdma_cm [fd00:234::11]:51870 -> fd00:234::12"),
            "{text}"
        );
        let mut out = Vec::new();
        decode(&capture("write_bw_cm.pcap"), true, &mut out).unwrap();
        let first: serde_json::Value =
            serde_json::from_str(String::from_utf8(out).unwrap().lines().next().unwrap()).unwrap();
        assert_eq!(first["cm"]["attr"], "REQ");
        assert_eq!(first["cm"]["rdma_cm"]["src_port"], 58899);
        assert_eq!(first["cm"]["rdma_cm_service"]["port"], 18515);
        assert_eq!(first["cm"]["starting_psn"], 0x1c9b73);
    }

    #[test]
    fn a_mad_that_is_not_cm_is_named_not_dropped() {
        let mut bytes = std::fs::read(capture("write_bw_cm.pcap")).unwrap();
        // The first record's MAD starts after the file (24) and record (16) headers and the
        // frame's 62 bytes of Ethernet, IPv4, UDP, BTH and DETH; its class byte is the second.
        bytes[24 + 16 + 62 + 1] = 0x04;
        let dir = std::env::temp_dir().join(format!("rocectl-decode-mad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("mad.pcap");
        std::fs::write(&p, &bytes).unwrap();
        let mut out = Vec::new();
        let s = decode(&p, false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.lines()
                .next()
                .unwrap()
                .contains("MAD not CM: management class 0x04"),
            "{text}"
        );
        assert_eq!(
            (s.by_cm.get("MAD error"), s.by_cm.get("REQ")),
            (Some(&1), Some(&1))
        );
        assert_eq!(s.bad_icrc, 1, "the flipped byte is under the ICRC");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_corrupted_capture_shows_bad_icrc() {
        let src = std::fs::read(capture("rc_pingpong_small.pcap")).unwrap();
        let mut bytes = src.clone();
        // Flip the last byte of the file: the last packet's ICRC (an ACK).
        let n = bytes.len();
        bytes[n - 1] ^= 0xff;
        let dir = std::env::temp_dir().join(format!("rocectl-decode-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("bad.pcap");
        std::fs::write(&p, &bytes).unwrap();
        let mut out = Vec::new();
        let s = decode(&p, false, &mut out).unwrap();
        assert_eq!(s.bad_icrc, 1, "{}", String::from_utf8_lossy(&out));
        assert!(String::from_utf8(out).unwrap().contains("ICRC=BAD"));
        std::fs::write(&p, b"not a capture at all").unwrap();
        assert!(matches!(
            decode(&p, false, &mut Vec::new()),
            Err(DecodeError::Format { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
