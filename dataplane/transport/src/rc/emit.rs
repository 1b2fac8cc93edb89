//! Building frames: the headers of this QP's path in front of a payload gathered from memory
//! (or attached by reference), in place in the caller's buffer.

use super::*;

/// How a frame's headers are made: copied from the path's template, or emitted from a repr.
enum Headers<'a> {
    Template(&'a Template),
    Repr(RoceRepr),
}

impl RcQp {
    pub(super) fn repr(&self, bth: &bth::Repr, ext: &ExtRepr) -> Option<RoceRepr> {
        self.repr_on(self.cfg.path?, bth, ext)
    }

    /// The headers of a frame to `p` (a UD send names its own path).
    pub(super) fn repr_on(&self, mut p: Path, bth: &bth::Repr, ext: &ExtRepr) -> Option<RoceRepr> {
        if bth.opcode == op::CNP {
            // CNPs go in their own class: cnp_dscp, not ECN-capable, cnp_802p_prio.
            p.dscp = self.cc_params.cnp_dscp;
            p.ecn = 0;
            p.vlan = p.vlan.map(|(vid, _)| (vid, self.cc_params.cnp_802p_prio));
        }
        let ip = match (p.local_ip, p.remote_ip) {
            (core::net::IpAddr::V4(s), core::net::IpAddr::V4(d)) => IpRepr::V4(ipv4::Repr {
                dscp: p.dscp,
                ecn: Ecn::from_bits(p.ecn),
                ident: 0,
                flags_frag: 0x4000,
                ttl: 64,
                protocol: ipv4::PROTO_UDP,
                src: s,
                dst: d,
            }),
            (core::net::IpAddr::V6(s), core::net::IpAddr::V6(d)) => IpRepr::V6(ipv6::Repr {
                traffic_class: p.dscp << 2 | p.ecn,
                flow_label: 0,
                next_header: ipv4::PROTO_UDP,
                hop_limit: 64,
                src: s,
                dst: d,
            }),
            _ => return None,
        };
        Some(RoceRepr {
            eth: eth::Repr {
                dst: p.remote_mac,
                src: p.local_mac,
                vlan: p.vlan.map(|(vid, pcp)| eth::VlanTag {
                    pcp,
                    dei: false,
                    vid,
                }),
                ethertype: 0,
            },
            ip,
            udp: udp::Repr {
                src_port: p.udp_sport,
                dst_port: udp::ROCEV2_PORT,
                checksum: 0,
            },
            bth: *bth,
            ext: *ext,
        })
    }

    /// Builds a frame with `payload_len` bytes filled by `fill` in `out` (emptied first): the
    /// payload is written once, straight into the buffer, and the headers go in front of it
    /// (into an mbuf's headroom).
    pub(super) fn emit<B: PacketBuf>(
        &self,
        out: &mut B,
        bth: &bth::Repr,
        ext: &ExtRepr,
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), MrError>,
    ) -> Option<Result<(), MrError>> {
        self.emit_on(self.cfg.path.as_ref()?, out, bth, ext, payload_len, fill)
    }

    /// [`RcQp::emit`] to `path` (by reference: a copy of it a frame cost about 10
    /// instructions).
    pub(super) fn emit_on<B: PacketBuf>(
        &self,
        path: &Path,
        out: &mut B,
        bth: &bth::Repr,
        ext: &ExtRepr,
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), MrError>,
    ) -> Option<Result<(), MrError>> {
        // The path's template where it has one (CNPs go in a class of their own). A frame to
        // `cfg.path` itself (every RC frame) takes it without comparing the paths: the
        // template is rebuilt whenever `cfg.path` changes (`refresh_template`).
        let ours = self
            .cfg
            .path
            .as_ref()
            .is_some_and(|c| std::ptr::eq(c, path));
        let headers = match &self.tmpl {
            Some((p, t)) if bth.opcode != op::CNP && (ours || p == path) => {
                debug_assert!(
                    p == path,
                    "the template is stale: cfg.path changed without refresh_template"
                );
                Headers::Template(t)
            }
            _ => Headers::Repr(self.repr_on(*path, bth, ext)?),
        };
        if !out.reset() {
            return None;
        }
        let dst = out.append(payload_len)?;
        if let Err(e) = fill(dst) {
            out.reset();
            return Some(Err(e));
        }
        let built = match &headers {
            Headers::Template(t) => build_templated(out, t, bth, ext, self.tx_offload),
            Headers::Repr(r) => build(out, r, self.tx_offload),
        };
        if built.is_err() {
            out.reset();
            return None;
        }
        Some(Ok(()))
    }

    /// Builds a frame whose `len` payload bytes, at `offset` of the message `sg` describes,
    /// go out attached from their region instead of copied ([`build_attached`]), where this
    /// QP attaches (its port transmits chains, `copy_tx` is off) and `len` is at least
    /// [`ATTACH_MIN`]. False when it did not (those, the bytes spanning SG entries, a region
    /// that is not hugepage memory, an IPv6 path, ...): the caller copies, which also reports
    /// any key or bounds error.
    /// The cheap tests are inlined into the caller, so that a small payload (most of them)
    /// does not pay for a call with seven arguments.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn emit_attached<B: PacketBuf>(
        &self,
        out: &mut B,
        bth: &bth::Repr,
        ext: &ExtRepr,
        mrs: &MrTable,
        sg: &[Sge],
        offset: u64,
        len: usize,
    ) -> bool {
        self.tx_attach
            && !self.caps.copy_tx
            && len >= ATTACH_MIN
            && self.attach(out, bth, ext, mrs, sg, offset, len)
    }

    /// [`RcQp::emit_attached`] past its cheap tests.
    #[allow(clippy::too_many_arguments)]
    fn attach<B: PacketBuf>(
        &self,
        out: &mut B,
        bth: &bth::Repr,
        ext: &ExtRepr,
        mrs: &MrTable,
        sg: &[Sge],
        offset: u64,
        len: usize,
    ) -> bool {
        let Some((lkey, va)) = locate(sg, offset, len as u64) else {
            return false;
        };
        let Some((mem, off)) = mrs
            .local(lkey, self.pd)
            .ok()
            .and_then(|m| m.attachable_range(va, len as u64))
        else {
            return false;
        };
        self.repr(bth, ext)
            .is_some_and(|r| build_attached(out, &r, mem, off, len, self.tx_offload) == Ok(true))
    }

    /// Builds a frame with no payload (ACK, atomic ACK, CNP); false if it could not be built.
    pub(super) fn emit_headers<B: PacketBuf>(
        &self,
        out: &mut B,
        bth: &bth::Repr,
        ext: &ExtRepr,
    ) -> bool {
        matches!(self.emit(out, bth, ext, 0, |_| Ok(())), Some(Ok(())))
    }

    pub(super) fn bth(&self, opcode: u8, psn: Psn, ack_req: bool, se: bool) -> bth::Repr {
        bth::Repr {
            opcode,
            se,
            pkey: bth::DEFAULT_PKEY,
            dest_qp: self.cfg.dest_qp,
            ack_req,
            psn,
            ..Default::default()
        }
    }
}
