//! Protection domains, completion queues and memory regions, on every lcore or the one they
//! live on.

use super::*;

impl Rdma {
    /// Allocates a protection domain on every lcore.
    pub fn alloc_pd(&self) -> Result<PdInfo, RdmaError> {
        let mut mrs = self.mrs.lock().expect("mr table");
        if mrs.pds.len() >= MAX_PDS {
            return Err(RdmaError::conflict(
                "too_many",
                format!("the node holds {MAX_PDS} protection domains already"),
            ));
        }
        let pd = mrs.table.alloc_pd().0;
        for l in 0..self.lcores.len() {
            self.ask(l, move |h, _| h.dev.alloc_pd(pd))?;
        }
        mrs.pds.insert(pd);
        Ok(PdInfo {
            pdn: pd,
            mrs: 0,
            qps: 0,
        })
    }

    /// Every protection domain with what is in it.
    pub fn list_pds(&self) -> Vec<PdInfo> {
        let mrs = self.mrs.lock().expect("mr table");
        let qps = self.qps.lock().expect("qp table");
        mrs.pds
            .iter()
            .map(|&pdn| PdInfo {
                pdn,
                mrs: mrs.meta.values().filter(|e| e.info.pdn == pdn).count(),
                qps: qps.values().filter(|q| q.pd == pdn).count(),
            })
            .collect()
    }

    /// One protection domain.
    pub fn show_pd(&self, pdn: u32) -> Result<PdInfo, RdmaError> {
        self.list_pds()
            .into_iter()
            .find(|p| p.pdn == pdn)
            .ok_or_else(|| RdmaError::not_found(format!("no protection domain {pdn}")))
    }

    /// Frees a protection domain: refused for the default one and while regions or QPs are
    /// in it.
    pub fn dealloc_pd(&self, pdn: u32) -> Result<(), RdmaError> {
        let p = self.show_pd(pdn)?;
        let mut mrs = self.mrs.lock().expect("mr table");
        if pdn == mrs.pd.0 {
            return Err(RdmaError::conflict(
                "default_pd",
                format!("PD {pdn} is the node's default protection domain and stays"),
            ));
        }
        if p.mrs > 0 || p.qps > 0 {
            return Err(RdmaError::conflict(
                "pd_busy",
                format!(
                    "PD {pdn} still holds {} memory regions and {} QPs: deregister and destroy them first",
                    p.mrs, p.qps
                ),
            ));
        }
        mrs.table.dealloc_pd(PdHandle(pdn)).map_err(mr_error)?;
        mrs.pds.remove(&pdn);
        for l in 0..self.lcores.len() {
            // Nothing of this PD is left anywhere (checked above), so no lcore refuses.
            let _ = self.ask(l, move |h, _| h.dev.dealloc_pd(pdn))?;
        }
        Ok(())
    }

    /// The PD `pd` names (None: the default), if it exists.
    pub(super) fn pd_or_default(&self, pd: Option<u32>) -> Result<u32, RdmaError> {
        let mrs = self.mrs.lock().expect("mr table");
        let pd = pd.unwrap_or(mrs.pd.0);
        if mrs.pds.contains(&pd) {
            Ok(pd)
        } else {
            Err(RdmaError::bad(
                "no_pd",
                format!("no protection domain {pd}: create one with POST /v1/pds"),
            ))
        }
    }

    // ---- completion queues ----

    /// Creates a CQ for `cqe` completions on `lcore` (or the lcore with fewest QPs).
    pub fn create_cq(&self, cqe: usize, lcore: Option<usize>) -> Result<CqInfo, RdmaError> {
        if cqe == 0 || cqe > MAX_CQE {
            return Err(RdmaError::bad(
                "bad_cqe",
                format!("cqe must be 1 to {MAX_CQE}, not {cqe}"),
            ));
        }
        let lcore = self.pick_lcore(lcore, &self.qps.lock().expect("qp table"))?;
        let mut cqs = self.cqs.lock().expect("cq table");
        let total: usize = cqs.values().map(|c| c.1).sum();
        if total + cqe > MAX_CQE_TOTAL {
            return Err(RdmaError::conflict(
                "too_many",
                format!(
                    "the node's CQs hold {total} entries of {MAX_CQE_TOTAL}: {cqe} more do not fit"
                ),
            ));
        }
        let cqn = self
            .ask(lcore, move |h, _| h.dev.create_cq(cqe))?
            .map_err(RdmaError::from)?;
        cqs.insert(cqn, (lcore, cqe));
        Ok(CqInfo {
            cqn,
            lcore,
            cqe,
            waiting: 0,
            users: 0,
            in_error: false,
        })
    }

    pub(super) fn cq_lcore(&self, cqn: u32) -> Result<usize, RdmaError> {
        self.cqs
            .lock()
            .expect("cq table")
            .get(&cqn)
            .map(|c| c.0)
            .ok_or_else(|| RdmaError::not_found(format!("no CQ {cqn}")))
    }

    /// Every created CQ.
    pub fn list_cqs(&self) -> Result<Vec<CqInfo>, RdmaError> {
        let cqns: Vec<u32> = self.cqs.lock().expect("cq table").keys().copied().collect();
        let mut all = Vec::new();
        for cqn in cqns {
            match self.poll_cqn(cqn, 0, Duration::ZERO) {
                Ok((_, info)) => all.push(info),
                Err(e) if e.kind == Refusal::NotFound => {} // destroyed meanwhile
                Err(e) => return Err(e),
            }
        }
        Ok(all)
    }

    /// Takes up to `max` completions from a created CQ, waiting up to `wait` for the first;
    /// with the CQ's state after.
    pub fn poll_cqn(
        &self,
        cqn: u32,
        max: usize,
        wait: Duration,
    ) -> Result<(Vec<WorkCompletion>, CqInfo), RdmaError> {
        let l = self.cq_lcore(cqn)?;
        let deadline = Instant::now() + wait;
        loop {
            let (wcs, st): (Vec<WorkCompletion>, CqState) = self
                .ask(l, move |h, _| h.dev.poll_cqn(cqn, max))?
                .ok_or_else(|| RdmaError::not_found(format!("no CQ {cqn}")))?;
            if !wcs.is_empty() || max == 0 || Instant::now() >= deadline {
                let info = CqInfo {
                    cqn,
                    lcore: l,
                    cqe: st.cqe,
                    waiting: st.waiting,
                    users: st.users,
                    in_error: st.in_error,
                };
                return Ok((wcs, info));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Destroys a CQ; refused while a QP uses it.
    pub fn destroy_cq(&self, cqn: u32) -> Result<(), RdmaError> {
        // The table stays locked from the look-up until the entry is gone: the lcore frees
        // the number as it destroys the CQ, and a create that reuses it must not be unlinked
        // by this removal (nor a second destroy of this number reach the new CQ).
        let mut cqs = self.cqs.lock().expect("cq table");
        let l = cqs
            .get(&cqn)
            .map(|c| c.0)
            .ok_or_else(|| RdmaError::not_found(format!("no CQ {cqn}")))?;
        self.ask(l, move |h, _| h.dev.destroy_cq(cqn))?
            .map_err(RdmaError::from)?;
        cqs.remove(&cqn);
        Ok(())
    }

    // ---- memory regions ----

    /// Registers `length` zeroed bytes with `access`, at `addr` or at the memory's own
    /// address, in protection domain `pd` (None: the default), on every lcore.
    pub fn reg_mr(
        &self,
        length: usize,
        access: Access,
        addr: Option<u64>,
        pd: Option<u32>,
    ) -> Result<MrInfo, RdmaError> {
        let pd = PdHandle(self.pd_or_default(pd)?);
        if length == 0 || length > MAX_MR_BYTES {
            return Err(RdmaError::bad(
                "bad_length",
                format!("length must be 1 to {MAX_MR_BYTES} bytes, not {length}"),
            ));
        }
        let mem = (self.alloc)(length).map_err(|e| {
            RdmaError::conflict(
                "no_memory",
                format!("the node's hugepage memory cannot hold {length} more bytes now: {e}"),
            )
        })?;
        let va = addr.unwrap_or(mem.addr());
        self.register(pd, va, length, mem, access)
    }

    /// Registers `mem` (`length` bytes) at `va` in `pd` with `access`, on every lcore.
    pub(super) fn register(
        &self,
        pd: PdHandle,
        va: u64,
        length: usize,
        mem: SharedMem,
        access: Access,
    ) -> Result<MrInfo, RdmaError> {
        let mut mrs = self.mrs.lock().expect("mr table");
        let key = mrs
            .table
            .register(pd, va, Box::new(mem.clone()), access)
            .map_err(mr_error)?;
        let mut done = Vec::new();
        for l in 0..self.lcores.len() {
            let r = self
                .ask(l, {
                    let mem = Box::new(mem.clone());
                    move |h, _| h.dev.reg_shared(key, pd.0, va, access, mem)
                })
                .and_then(|r| r.map_err(mr_error));
            if let Err(err) = r {
                for d in done {
                    let _ = self.ask(d, move |h, _| h.dev.dereg_mr(key));
                }
                let _ = mrs.table.deregister(key);
                return Err(err);
            }
            done.push(l);
        }
        let info = MrInfo {
            lkey: key,
            rkey: key,
            addr: va,
            length,
            access: access_names(access),
            hugepage: mem.is_hugepage(),
            zero_copy: mem.is_attachable(),
            pdn: pd.0,
        };
        mrs.meta.insert(key, MrEntry { info: info.clone() });
        Ok(info)
    }

    /// Every region.
    pub fn list_mrs(&self) -> Vec<MrInfo> {
        let mrs = self.mrs.lock().expect("mr table");
        mrs.meta.values().map(|e| e.info.clone()).collect()
    }

    /// One region.
    pub fn show_mr(&self, key: u32) -> Result<MrInfo, RdmaError> {
        let mrs = self.mrs.lock().expect("mr table");
        mrs.meta
            .get(&key)
            .map(|e| e.info.clone())
            .ok_or_else(|| RdmaError::not_found(format!("no memory region with key {key:#x}")))
    }

    /// Deregisters a region on every lcore.
    pub fn dereg_mr(&self, key: u32) -> Result<(), RdmaError> {
        let mut mrs = self.mrs.lock().expect("mr table");
        if !mrs.meta.contains_key(&key) {
            return Err(RdmaError::not_found(format!(
                "no memory region with key {key:#x}"
            )));
        }
        for l in 0..self.lcores.len() {
            // An lcore that lost the region already is fine: the goal is that none has it.
            let _ = self.ask(l, move |h, _| h.dev.dereg_mr(key))?;
        }
        let _ = mrs.table.deregister(key);
        mrs.meta.remove(&key);
        Ok(())
    }

    /// Reads `len` bytes of a region at `addr` (its own address space).
    pub fn read_mr(&self, key: u32, addr: u64, len: usize) -> Result<Vec<u8>, RdmaError> {
        if len > MAX_MR_BYTES {
            return Err(RdmaError::bad("bad_length", "too many bytes at once"));
        }
        let mrs = self.mrs.lock().expect("mr table");
        mrs.table
            .get(key)
            .and_then(|m| m.to_vec(addr, len))
            .map_err(mr_error)
    }

    /// Writes bytes into a region at `addr`.
    pub fn write_mr(&self, key: u32, addr: u64, data: &[u8]) -> Result<(), RdmaError> {
        let mut mrs = self.mrs.lock().expect("mr table");
        mrs.table
            .get_mut(key)
            .and_then(|m| m.write(addr, data))
            .map_err(mr_error)
    }
}
