//! What attached applications ask of the node (issue 21): their memory registered in place,
//! the completion rings of their CQs and the rings of their QPs handed to the QPs' lcores.

use super::*;
use dataplane::host::{AppCounters, AppError, AppQueues};
use verbs::bell::Bells;
use verbs::ring::Producer;

impl Rdma {
    /// Registers memory an application shares (`mem`: its mapping of the memfd it sent) at
    /// the address it uses, `addr`, in `pd`, on every lcore: the lcores read and write it in
    /// place.
    pub fn reg_app_mr(
        &self,
        mem: SharedMem,
        addr: u64,
        access: Access,
        pd: u32,
    ) -> Result<MrInfo, RdmaError> {
        let pd = PdHandle(self.pd_or_default(Some(pd))?);
        let length = mem.len();
        if length == 0 || length > MAX_MR_BYTES {
            return Err(RdmaError::bad(
                "bad_length",
                format!("length must be 1 to {MAX_MR_BYTES} bytes, not {length}"),
            ));
        }
        self.register(pd, addr, length, mem, access)
    }

    /// Hands a CQ's completion ring to an lcore (`lcore`, or the one with fewest QPs), with
    /// the eventfd of its completion channel if it has one and the flag the lcore sets if it
    /// abandons the ring: the lcore and the ring's number there.
    pub fn add_app_cq(
        &self,
        lcore: Option<usize>,
        ring: Producer,
        event: Option<std::os::fd::OwnedFd>,
        fault: dataplane::host::Fault,
    ) -> Result<(usize, u32), RdmaError> {
        let l = {
            let qps = self.qps.lock().expect("qp table");
            self.pick_lcore(lcore, &qps)?
        };
        let n = self.ask(l, move |h, _| h.apps.add_cq(ring, event, fault))?;
        Ok((l, n))
    }

    /// Makes an address handle toward `gid` for UD sends of QPs in `pd`, installed on every
    /// lcore under one number (never 0): the number.
    pub fn add_app_ah(&self, pd: u32, gid: IpAddr) -> Result<u32, RdmaError> {
        let (port, local, mac, vlan) = self.resolve(gid)?;
        let path = Path {
            local_ip: local,
            remote_ip: gid,
            local_mac: self.macs[port].0,
            remote_mac: mac.0,
            // Chosen per send, for the destination QP (see `host::app`).
            udp_sport: 0,
            dscp: 0,
            ecn: 0,
            vlan,
        };
        let ah = {
            let mut ahs = self.app_ahs.lock().expect("address handles");
            match ahs.iter().position(|&used| !used) {
                Some(i) => {
                    ahs[i] = true;
                    i as u32 + 1
                }
                None => {
                    ahs.push(true);
                    ahs.len() as u32
                }
            }
        };
        for l in 0..self.lcores.len() {
            if let Err(e) = self.ask(l, move |h, _| h.apps.set_ah(ah, pd, path)) {
                self.remove_app_ah(ah);
                return Err(e);
            }
        }
        Ok(ah)
    }

    /// Removes address handle `ah` from every lcore and frees its number.
    pub fn remove_app_ah(&self, ah: u32) {
        for l in 0..self.lcores.len() {
            let _ = self.ask(l, move |h, _| h.apps.remove_ah(ah));
        }
        if let Some(u) = self
            .app_ahs
            .lock()
            .expect("address handles")
            .get_mut((ah as usize).wrapping_sub(1))
        {
            *u = false;
        }
    }

    /// Takes completion ring `n` back from lcore `lcore` (refused while a QP completes into it).
    pub fn remove_app_cq(&self, lcore: usize, n: u32) -> Result<(), RdmaError> {
        if lcore >= self.lcores.len() {
            return Err(RdmaError::not_found(format!("no lcore {lcore}")));
        }
        self.ask(lcore, move |h, _| h.apps.remove_cq(&h.dev, n).map(drop))?
            .map_err(app_error)
    }

    /// Has QP `q.qpn`'s lcore drive it from the application's rings: the bit the application
    /// rings for it in its doorbell region there.
    pub fn attach_app_qp(&self, q: AppQueues) -> Result<u32, RdmaError> {
        let l = self.lcore_of(q.qpn)?;
        self.ask(l, move |h, _| h.apps.attach(&mut h.dev, q))?
            .map_err(app_error)
    }

    /// Hands an application's doorbell region to lcore `lcore`: its number there.
    pub fn add_app_bells(&self, lcore: usize, bells: Bells) -> Result<u32, RdmaError> {
        if lcore >= self.lcores.len() {
            return Err(RdmaError::not_found(format!("no lcore {lcore}")));
        }
        self.ask(lcore, move |h, _| h.apps.add_bells(bells))
    }

    /// By lcore: what each attached application's QPs there did, by doorbell region.
    pub fn app_counters(&self) -> Result<Vec<Vec<(u32, AppCounters)>>, RdmaError> {
        (0..self.lcores.len())
            .map(|l| self.ask(l, |h, _| h.apps.region_counters()))
            .collect()
    }

    /// The listings of the attached applications `apps`, each with what its QPs did (summed
    /// over its lcores: `counters` in `GET /v1/apps`, the `ferroce_app_*` series).
    pub fn app_listings(
        &self,
        apps: &[crate::state::AppListing],
    ) -> Result<Vec<(serde_json::Value, AppCounters)>, RdmaError> {
        let by_lcore = self.app_counters()?;
        Ok(apps
            .iter()
            .map(|a| {
                let mut c = AppCounters::default();
                for (l, n) in &a.regions {
                    if let Some((_, r)) = by_lcore
                        .get(*l)
                        .and_then(|rs| rs.iter().find(|(m, _)| m == n))
                    {
                        c.add(r);
                    }
                }
                let mut v = a.listing.clone();
                v["counters"] = serde_json::json!({
                    "sends": c.sends,
                    "recvs": c.recvs,
                    "completions": c.completions,
                    "refused": c.refused,
                    "broken_rings": c.broken_rings,
                });
                (v, c)
            })
            .collect())
    }

    /// Takes doorbell region `n` back from lcore `lcore`.
    pub fn remove_app_bells(&self, lcore: usize, n: u32) {
        if lcore < self.lcores.len() {
            let _ = self.ask(lcore, move |h, _| h.apps.remove_bells(n).map(drop));
        }
    }
}

fn app_error(e: AppError) -> RdmaError {
    match e {
        AppError::NoCq(n) => RdmaError::not_found(format!("no completion ring {n}")),
        AppError::CqInUse(n) => RdmaError::conflict(
            "cq_busy",
            format!("QPs still complete into completion ring {n}: destroy them first"),
        ),
        AppError::NoBells(n) => RdmaError::not_found(format!("no doorbell region {n}")),
        AppError::BellsFull(n) => RdmaError::conflict(
            "too_many_qps",
            format!(
                "doorbell region {n} rings {} QPs already",
                verbs::bell::BELL_QPS
            ),
        ),
        AppError::Device(d) => d.into(),
    }
}
