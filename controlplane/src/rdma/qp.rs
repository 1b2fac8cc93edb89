//! Queue pairs: placement, creation (one or in bulk), connecting (paths resolved to next hops),
//! modifying, congestion control, queries and destruction.

use super::*;

impl Rdma {
    /// `lcore` if it exists, else the lcore with fewest QPs.
    pub(super) fn pick_lcore(
        &self,
        lcore: Option<usize>,
        qps: &BTreeMap<u32, QpMeta>,
    ) -> Result<usize, RdmaError> {
        Ok(match lcore {
            Some(l) if l >= self.lcores.len() => {
                return Err(RdmaError::bad(
                    "bad_lcore",
                    format!(
                        "lcore {l} does not exist: this node has 0 to {}",
                        self.lcores.len() - 1
                    ),
                ));
            }
            Some(l) => l,
            None => {
                let mut count = vec![0usize; self.lcores.len()];
                for m in qps.values() {
                    count[m.lcore] += 1;
                }
                (0..count.len()).min_by_key(|&l| count[l]).unwrap_or(0)
            }
        })
    }

    /// Creates an RC QP in RESET in protection domain `opts.pd` (None: the default), its
    /// completions going to the created CQs `opts.cqs` (None: CQs of its own), on `lcore`
    /// (or the lcore of its CQs, or the lcore with fewest QPs): its QPN, lcore and the random
    /// PSN it will start sending with.
    pub fn create_qp(
        &self,
        lcore: Option<usize>,
        caps: QpCaps,
        opts: QpPlacement,
        cc: CcKind,
        params: DcqcnParams,
    ) -> Result<(u32, usize, u32), RdmaError> {
        params
            .validate()
            .map_err(|e| RdmaError::bad("bad_cc", e.to_string()))?;
        let pd = self.pd_or_default(opts.pd)?;
        // A QP lives on the lcore of its CQs (completions are never handed between lcores).
        let mut cq_lcore = None;
        for cqn in opts.cqs.into_iter().flatten() {
            let l = self.cq_lcore(cqn).map_err(|_| {
                RdmaError::bad(
                    "no_cq",
                    format!("no CQ {cqn}: create one with POST /v1/cqs"),
                )
            })?;
            match (cq_lcore, lcore) {
                (Some(o), _) if o != l => {
                    return Err(RdmaError::bad(
                        "bad_cq",
                        "a QP's send and receive CQs must live on the same lcore",
                    ));
                }
                (_, Some(want)) if want != l => {
                    return Err(RdmaError::bad(
                        "bad_cq",
                        format!(
                            "CQ {cqn} lives on lcore {l}, not on lcore {want}: a QP lives with its CQs"
                        ),
                    ));
                }
                _ => cq_lcore = Some(l),
            }
        }
        let mut qps = self.qps.lock().expect("qp table");
        if qps.len() >= MAX_QPS {
            return Err(RdmaError::conflict(
                "too_many",
                format!("the node holds {MAX_QPS} QPs already"),
            ));
        }
        let bytes = self.qp_room(1, &caps)?;
        let lcore = match cq_lcore {
            Some(l) => l,
            None => self.pick_lcore(lcore, &qps)?,
        };
        let qpn = self
            .ask(lcore, move |h, _| {
                h.dev.create_qp(caps, Some(pd), opts.cqs, cc, params)
            })?
            .map_err(RdmaError::from)?;
        let psn = random_psn();
        qps.insert(
            qpn,
            QpMeta {
                lcore,
                pd,
                cqs: opts.cqs,
                psn,
                bytes,
            },
        );
        self.qp_bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok((qpn, lcore, psn))
    }

    /// Creates `count` RC QPs in RESET on one lcore (`lcore`, or the least loaded), all or
    /// none: a perftest run with several QPs.
    pub fn create_qps(
        &self,
        lcore: Option<usize>,
        count: usize,
        caps: QpCaps,
        cc: CcKind,
        params: DcqcnParams,
    ) -> Result<(Vec<u32>, usize), RdmaError> {
        params
            .validate()
            .map_err(|e| RdmaError::bad("bad_cc", e.to_string()))?;
        // The region table's lock before the QP table's, never after (list_pds takes both
        // in that order).
        let pd = self.pd_or_default(None)?;
        let mut qps = self.qps.lock().expect("qp table");
        if qps.len() + count > MAX_QPS {
            return Err(RdmaError::conflict(
                "too_many",
                format!(
                    "the node holds {} QPs of {MAX_QPS}: {count} more do not fit",
                    qps.len()
                ),
            ));
        }
        self.qp_room(count, &caps)?;
        let each = dataplane::transport::device::qp_footprint(&caps);
        let lcore = self.pick_lcore(lcore, &qps)?;
        // In chunks, so the lcore never stops polling its queues for long.
        let mut made: Vec<u32> = Vec::with_capacity(count);
        while made.len() < count {
            let n = (count - made.len()).min(BULK_CHUNK);
            let r = self
                .ask(lcore, move |h, _| h.dev.create_qps(n, caps, cc, params))
                .and_then(|r| r.map_err(RdmaError::from));
            match r {
                Ok(q) => made.extend(q),
                Err(e) => {
                    // Undone in the same chunks (not one round trip per QP: a million-QP
                    // create that fails near its end must answer in seconds).
                    for chunk in made.chunks(BULK_CHUNK) {
                        let qs = chunk.to_vec();
                        let _ = self.ask(lcore, move |h, _| h.dev.destroy_qps(&qs));
                    }
                    return Err(e);
                }
            }
        }
        for &qpn in &made {
            qps.insert(
                qpn,
                QpMeta {
                    lcore,
                    pd,
                    cqs: [None; 2],
                    psn: random_psn(),
                    bytes: each,
                },
            );
        }
        self.qp_bytes
            .fetch_add(each * made.len(), Ordering::Relaxed);
        Ok((made, lcore))
    }

    /// Connects several QPs (each `(qpn, request)`) towards one remote GID, all or none: the
    /// path is resolved once, and each lcore takes its QPs in chunks.
    pub fn connect_qps(&self, list: &[(u32, QpAttr)]) -> Result<(), RdmaError> {
        let Some((q0, a0)) = list.first() else {
            return Ok(());
        };
        let gid = |a: &QpAttr| a.path.map(|p| p.remote_ip);
        if list.iter().any(|(_, a)| gid(a) != gid(a0)) {
            return Err(RdmaError::bad(
                "bad_attr",
                "a bulk connect goes to one remote GID",
            ));
        }
        let (path, port) = self.path_for(*q0, a0)?;
        let mut by_lcore: BTreeMap<usize, Vec<(u32, QpAttr)>> = BTreeMap::new();
        for (qpn, a) in list {
            check_24bit(a)?;
            let l = self.lcore_of(*qpn)?;
            let p = Path {
                udp_sport: udp_sport(*qpn, path.local_ip, path.remote_ip, a.dest_qp.unwrap_or(0)),
                ..path
            };
            by_lcore
                .entry(l)
                .or_default()
                .push((*qpn, self.settled(*qpn, a, p)?));
        }
        let mut done: Vec<(usize, Vec<u32>)> = Vec::new();
        for (l, all) in by_lcore {
            for chunk in all.chunks(BULK_CHUNK) {
                let qpns: Vec<u32> = chunk.iter().map(|c| c.0).collect();
                let r = self
                    .ask(l, {
                        let list = chunk.to_vec();
                        move |h, _| h.dev.connect_many(&list, port)
                    })
                    .and_then(|r| r.map_err(RdmaError::from));
                if let Err(e) = r {
                    for (l, qs) in &done {
                        for q in qs {
                            let reset = QpAttr {
                                state: Some(QpState::Reset),
                                ..Default::default()
                            };
                            let q = *q;
                            let _ = self.ask(*l, move |h, _| h.dev.modify(q, &reset, port));
                        }
                    }
                    return Err(e);
                }
                done.push((l, qpns));
            }
        }
        Ok(())
    }

    /// Destroys several QPs: none if one of them does not exist.
    pub fn destroy_qps(&self, qpns: &[u32]) -> Result<(), RdmaError> {
        // Locked throughout, as in `destroy_qp`.
        let mut t = self.qps.lock().expect("qp table");
        let mut by_lcore: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
        for &q in qpns {
            by_lcore.entry(meta(&t, q)?.lcore).or_default().push(q);
        }
        for (l, all) in by_lcore {
            for chunk in all.chunks(BULK_CHUNK) {
                let qs = chunk.to_vec();
                self.ask(l, move |h, _| h.dev.destroy_qps(&qs))?;
                for q in chunk {
                    if let Some(m) = t.remove(q) {
                        self.qp_bytes.fetch_sub(m.bytes, Ordering::Relaxed);
                    }
                }
            }
        }
        Ok(())
    }

    /// Streams on several QPs of one lcore at once (see `Tests::streams`).
    pub fn streams(
        &self,
        qps: Vec<(u32, SendWr)>,
        shape: Shape,
        wait: Duration,
    ) -> Result<StreamResult, RdmaError> {
        let qpns = qps.iter().map(|q| q.0).collect();
        self.run_test(qpns, &work::STREAM, wait, move |h, now, reply| {
            h.tests.streams(&mut h.dev, now, qps, shape, reply)
        })
    }

    /// The lcore of `qpns`, which must all live on it (a several-QP `what` runs there).
    pub(super) fn one_lcore(
        &self,
        mut qpns: impl Iterator<Item = u32>,
        what: &str,
    ) -> Result<usize, RdmaError> {
        let first = qpns
            .next()
            .ok_or_else(|| RdmaError::bad("bad_wr", "no QPs"))?;
        let l = self.lcore_of(first)?;
        for q in qpns {
            if self.lcore_of(q)? != l {
                return Err(RdmaError::bad(
                    "bad_wr",
                    format!("a several-QP {what} runs on one lcore: its QPs must share it"),
                ));
            }
        }
        Ok(l)
    }

    pub(super) fn lcore_of(&self, qpn: u32) -> Result<usize, RdmaError> {
        Ok(meta(&self.qps.lock().expect("qp table"), qpn)?.lcore)
    }

    /// Every QP's number.
    pub fn qpns(&self) -> Vec<u32> {
        self.qps.lock().expect("qp table").keys().copied().collect()
    }

    /// Changes a QP's congestion control (see `Device::set_cc`).
    pub fn set_cc(
        &self,
        qpn: u32,
        kind: Option<CcKind>,
        params: DcqcnParams,
    ) -> Result<(), RdmaError> {
        let l = self.lcore_of(qpn)?;
        self.ask(l, move |h, _| h.dev.set_cc(qpn, kind, params))?
            .map_err(RdmaError::from)
    }

    /// A QP's attributes and counters.
    pub fn query_qp(&self, qpn: u32) -> Result<(usize, QpQuery), RdmaError> {
        let l = self.lcore_of(qpn)?;
        let mut q = self
            .ask(l, move |h, now| h.dev.query(qpn, now))?
            .ok_or_else(|| RdmaError::not_found(format!("no QP {qpn}")))?;
        starts_at(&mut q, self.local_psn(qpn, None)?);
        Ok((l, q))
    }

    /// Every QP's lcore, attributes and counters, in QPN order: one round trip per lcore
    /// (not per QP: a node holds up to [`MAX_QPS`]).
    pub fn list_qps(&self) -> Result<Vec<(u32, usize, QpQuery)>, RdmaError> {
        let mut all = Vec::new();
        for l in 0..self.lcores.len() {
            let qs = self.ask(l, |h, now| h.dev.query_all(now))?;
            all.extend(qs.into_iter().map(|(qpn, q)| (qpn, l, q)));
        }
        let t = self.qps.lock().expect("qp table");
        // Only QPs the node knows (one being created is not listed until it is).
        all.retain(|(qpn, _, _)| t.contains_key(qpn));
        for (qpn, _, q) in all.iter_mut() {
            starts_at(q, t[qpn].psn);
        }
        all.sort_by_key(|(qpn, _, _)| *qpn);
        Ok(all)
    }

    /// Destroys a QP.
    pub fn destroy_qp(&self, qpn: u32) -> Result<(), RdmaError> {
        // As for CQs: the table is locked from the look-up until the entry is gone, so a
        // create that reuses the freed number is never unlinked.
        let mut qps = self.qps.lock().expect("qp table");
        let l = meta(&qps, qpn)?.lcore;
        self.ask(l, move |h, _| h.dev.destroy_qp(qpn))?;
        if let Some(m) = qps.remove(&qpn) {
            self.qp_bytes.fetch_sub(m.bytes, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Port, source address, next hop's MAC and VLAN towards `gid`, resolving the next hop
    /// if needed.
    pub(super) fn resolve(&self, gid: IpAddr) -> Result<Resolved, RdmaError> {
        let (port, hop, local, vlan) = {
            let r = self.routes.lock().expect("routes");
            let (port, hop) = r.route(gid, None).ok_or_else(|| {
                RdmaError::bad(
                    "no_route",
                    format!(
                        "no port or route reaches {gid}: check the ports' addresses and [[routes]]"
                    ),
                )
            })?;
            let local = r.source_ip(port, gid).ok_or_else(|| {
                RdmaError::bad(
                    "no_source",
                    format!(
                        "port {port} has no {} address",
                        if gid.is_ipv4() { "IPv4" } else { "IPv6" }
                    ),
                )
            })?;
            (port, hop, local, r.vlan(port))
        };
        let deadline = Instant::now() + RESOLVE_TIMEOUT;
        let mut asked = false;
        let mut n = self.neigh.lock().expect("neighbour table");
        loop {
            if let Some(mac) = n.get(&(port, hop)) {
                return Ok((port, local, *mac, vlan));
            }
            if !asked {
                asked = true;
                let _ = self.lcores[0].send(Command::Handler(ApplianceCommand::Net(
                    dataplane::net::NetCommand::Resolve { dst: gid },
                )));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(RdmaError::conflict(
                    "unresolved",
                    format!(
                        "{hop} (next hop to {gid}) did not answer ARP/ND in {RESOLVE_TIMEOUT:?}"
                    ),
                ));
            }
            n = self
                .resolved
                .wait_timeout(n, deadline - now)
                .expect("neighbour table")
                .0;
        }
    }

    /// Sets the ports' MTUs (IP packet bytes), which bound the path MTU a QP may connect with.
    pub fn with_port_mtus(mut self, mtus: Vec<u16>) -> Self {
        self.mtus = mtus;
        self
    }

    /// The path of QP `qpn` to the peer `a.path` names (its GID and DSCP; see [`Path::toward`]):
    /// checks the 24-bit numbers, resolves the GID to a port and next hop, checks the path
    /// MTU fits the port, picks the UDP source port.
    pub(super) fn path_for(&self, qpn: u32, a: &QpAttr) -> Result<(Path, usize), RdmaError> {
        check_24bit(a)?;
        let Some(toward) = a.path else {
            return Err(RdmaError::bad("bad_attr", "remote_gid is required here"));
        };
        let gid = toward.remote_ip;
        let mtu = a.path_mtu.unwrap_or(Mtu::M1024);
        let (port, local, mac, vlan) = self.resolve(gid)?;
        if let Some(&port_mtu) = self.mtus.get(port) {
            // The largest packet of the path MTU: IP and UDP headers, BTH, the longest
            // extension headers a full segment carries (RETH + ImmDt), payload, ICRC.
            let ip = if gid.is_ipv4() { 20 } else { 40 };
            let need = |m: u32| ip + 8 + 12 + 20 + m + 4;
            if need(mtu.bytes()) > port_mtu as u32 {
                let fits = [4096u32, 2048, 1024, 512, 256]
                    .into_iter()
                    .find(|m| need(*m) <= port_mtu as u32);
                return Err(RdmaError::bad(
                    "bad_mtu",
                    format!(
                        "path MTU {} does not fit port {port}'s MTU {port_mtu} ({} byte packets); {}",
                        mtu.bytes(),
                        need(mtu.bytes()),
                        match fits {
                            Some(m) => format!("use {m} or less, or raise the port's mtu"),
                            None => "raise the port's mtu".into(),
                        }
                    ),
                ));
            }
        }
        let path = Path {
            local_ip: local,
            remote_ip: gid,
            local_mac: self.macs[port].0,
            remote_mac: mac.0,
            udp_sport: udp_sport(qpn, local, gid, a.dest_qp.unwrap_or(0)),
            dscp: toward.dscp,
            ecn: 2,
            vlan,
        };
        Ok((path, port))
    }

    /// A connect's attributes as QP `qpn` takes them: on the resolved `path`, starting at the
    /// PSN it was created with unless `a` names one, the peer's first PSN required.
    fn settled(&self, qpn: u32, a: &QpAttr, path: Path) -> Result<QpAttr, RdmaError> {
        Ok(QpAttr {
            path: Some(path),
            sq_psn: Some(self.local_psn(qpn, a.sq_psn)?),
            rq_psn: Some(remote_psn(a)?),
            ..*a
        })
    }

    /// The PSN QP `qpn` starts sending with: the request's, or the one it was created with.
    pub(super) fn local_psn(&self, qpn: u32, given: Option<u32>) -> Result<u32, RdmaError> {
        match given {
            Some(p) => Ok(p),
            None => Ok(meta(&self.qps.lock().expect("qp table"), qpn)?.psn),
        }
    }

    /// Takes a QP from RESET to RTS towards the peer `a.path` names, with the attributes of
    /// `a` (every one [`QpAttr::rc_steps`] takes).
    pub fn connect_qp(&self, qpn: u32, a: &QpAttr) -> Result<(), RdmaError> {
        let l = self.lcore_of(qpn)?;
        if self.qp_type(qpn)? == QpType::Ud {
            return Err(RdmaError::conflict(
                "bad_state",
                dataplane::transport::qp::ModifyError::Datagram.to_string(),
            ));
        }
        let (path, port) = self.path_for(qpn, a)?;
        let c = self.settled(qpn, a, path)?;
        self.ask(l, move |h, _| h.dev.connect(qpn, &c, port))?
            .map_err(RdmaError::from)
    }

    /// A QP's type (RC or UD).
    pub fn qp_type(&self, qpn: u32) -> Result<QpType, RdmaError> {
        Ok(self.query_qp(qpn)?.1.cfg.qp_type)
    }

    /// The largest IB MTU whose UD datagrams (IPv6, UDP, BTH, DETH, ImmDt, payload, ICRC) fit
    /// `port`'s MTU: what a UD QP on it may send at most (verbs' active_mtu).
    pub fn ud_mtu(&self, port: usize) -> Mtu {
        let port_mtu = self.mtus.get(port).map_or(1500, |&m| m as u32);
        [Mtu::M4096, Mtu::M2048, Mtu::M1024, Mtu::M512]
            .into_iter()
            .find(|m| 40 + 8 + 12 + 8 + 4 + m.bytes() + 4 <= port_mtu)
            .unwrap_or(Mtu::M256)
    }

    /// Where a UD send from `qpn` to `remote_qpn` at `gid` goes: the GID resolved (ARP/ND) to
    /// a next hop of the QP's port, the UDP source port chosen as for RC; Not-ECT, DSCP 0 (no
    /// congestion control for datagrams), as rxe sends them.
    pub fn ud_dest(
        &self,
        qpn: u32,
        gid: IpAddr,
        remote_qpn: u32,
        qkey: u32,
    ) -> Result<UdDest, RdmaError> {
        let (_, q) = self.query_qp(qpn)?;
        if q.cfg.qp_type != QpType::Ud {
            return Err(RdmaError::bad(
                "bad_wr",
                format!("QP {qpn} is RC: its sends go to its connected peer and take no ud"),
            ));
        }
        if remote_qpn > 0xff_ffff {
            return Err(RdmaError::bad("bad_wr", "remote_qpn is 24-bit"));
        }
        let (port, local, mac, vlan) = self.resolve(gid)?;
        if port != q.port {
            return Err(RdmaError::bad(
                "bad_wr",
                format!(
                    "{gid} is reached by port {port}, and QP {qpn} sends by port {}",
                    q.port
                ),
            ));
        }
        Ok(UdDest {
            path: Path {
                local_ip: local,
                remote_ip: gid,
                local_mac: self.macs[port].0,
                remote_mac: mac.0,
                udp_sport: udp_sport(qpn, local, gid, remote_qpn),
                dscp: 0,
                ecn: 0,
                vlan,
            },
            dest_qp: remote_qpn,
            qkey,
        })
    }

    /// One verbs transition of QP `qpn` to `a.state`, with the attributes of `a` that
    /// transition takes (an RC QP's: [`QpAttr::rc_steps`]; RTR resolves the path `a.path`
    /// names and needs the peer's first PSN; RTS starts at the PSN the QP was created with
    /// unless `a` names one). A UD QP takes its Q_Key, port `ud_port` and that port's MTU at
    /// INIT, nothing at RTR, our PSN at RTS.
    pub fn modify_qp(&self, qpn: u32, a: &QpAttr, ud_port: usize) -> Result<(), RdmaError> {
        let l = self.lcore_of(qpn)?;
        let state = a
            .state
            .ok_or_else(|| RdmaError::bad("bad_attr", "state is required"))?;
        let mut attr = QpAttr {
            state: Some(state),
            ..Default::default()
        };
        let mut port = 0;
        let steps = a.rc_steps();
        match (self.qp_type(qpn)?, state) {
            (QpType::Ud, QpState::Init) => {
                if ud_port >= self.macs.len() {
                    return Err(RdmaError::bad(
                        "bad_attr",
                        format!("port {ud_port} does not exist"),
                    ));
                }
                port = ud_port;
                attr.pkey_index = Some(0);
                attr.qkey =
                    Some(a.qkey.ok_or_else(|| {
                        RdmaError::bad("bad_attr", "a UD QP's INIT needs its qkey")
                    })?);
                attr.path_mtu = Some(self.ud_mtu(port));
            }
            (QpType::Ud, QpState::Rts) => attr.sq_psn = Some(self.local_psn(qpn, a.sq_psn)?),
            (QpType::Ud, _) => {}
            (QpType::Rc, QpState::Init) => attr = steps[0],
            (QpType::Rc, QpState::Rtr) => {
                let (path, p) = self.path_for(qpn, a)?;
                port = p;
                attr = QpAttr {
                    path: Some(path),
                    rq_psn: Some(remote_psn(a)?),
                    ..steps[1]
                };
            }
            (QpType::Rc, QpState::Rts) => {
                attr = QpAttr {
                    sq_psn: Some(self.local_psn(qpn, a.sq_psn)?),
                    ..steps[2]
                };
            }
            (QpType::Rc, _) => {}
        }
        self.ask(l, move |h, _| h.dev.modify(qpn, &attr, port))?
            .map_err(RdmaError::from)
    }
}

/// Before RTS a QP's send PSN, as queried, is `psn`: the one it will start with unless told
/// another.
fn starts_at(q: &mut QpQuery, psn: u32) {
    if matches!(q.cfg.state, QpState::Reset | QpState::Init | QpState::Rtr) {
        q.cfg.sq_psn = Psn::new(psn);
    }
}
