//! What a node's REST API and its metrics serve from: the RDMA objects, the ports' views, the
//! impairment stages and the lcores' counters. Shared by `api` and `metrics` (neither depends on
//! the other for it).

use crate::rdma::Rdma;
use dataplane::port::impair::ImpairHandle;
use serde_json::Value;
use std::sync::{Arc, Mutex};

/// What the API serves from besides the RDMA objects.
#[derive(Debug)]
pub struct ApiState {
    /// The node's RDMA objects.
    pub rdma: Rdma,
    /// Per port: its description and statistics, refreshed by the control loop.
    pub ports: Mutex<Vec<Value>>,
    /// Per port, one handle per lcore queue: the impairment stages.
    pub impair: Vec<Vec<ImpairHandle>>,
    /// Per lcore: the poll loop's counters (frames, drops by reason, ARP/ND, ...).
    pub lcore_counters: Vec<Arc<dataplane::counters::LcoreCounters>>,
    /// Per port: the impairments last set, per direction.
    pub impair_cfg: Mutex<Vec<[Value; 2]>>,
    /// The bearer token requests must carry, if one is set (`[api] token`).
    pub token: Option<String>,
    /// The applications attached to the attach socket, by session: what each made (kept by
    /// its session, for `GET /v1/apps` and the per-process series of `/metrics`).
    pub apps: Mutex<std::collections::BTreeMap<u64, AppListing>>,
    /// Mbufs of the node's pool handed out (in ports' rings, lcores, frames in flight) and
    /// its size, refreshed by the control loop.
    pub mbufs: [std::sync::atomic::AtomicU64; 2],
}

/// One attached application as its session keeps it for the API.
#[derive(Clone, Debug)]
pub struct AppListing {
    /// What `GET /v1/apps` shows (id, pid, command, what it made).
    pub listing: Value,
    /// Its doorbell regions: (lcore, region number there), whose counters are its own.
    pub regions: Vec<(usize, u32)>,
}

impl ApiState {
    /// The attached applications' listings, each with what its QPs did (asked of the lcores:
    /// call it off the async runtime).
    pub fn app_listings(
        &self,
    ) -> Result<Vec<(Value, dataplane::host::AppCounters)>, crate::rdma::RdmaError> {
        let apps: Vec<_> = self
            .apps
            .lock()
            .expect("applications")
            .values()
            .cloned()
            .collect();
        self.rdma.app_listings(&apps)
    }
}
