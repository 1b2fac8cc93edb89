//! The RC transport on DPDK: two RdmaHost workers, each on its own memif port of one process
//! (a server and a client on one socket, joined like a cable), move RDMA WRITE, READ, SEND and
//! fetch-and-add between them through real mbufs: payload gathered from the MR into the tx mbuf,
//! headers prepended into its headroom, frames parsed in place from the rx mbuf. Needs root and
//! hugepages (scripts/setup.sh), as `make test` has.

use dataplane::dpdk::MemifCable;
use dataplane::host::{RdmaHost, pair_check};
use dataplane::lcore::Command;
use dataplane::transport::qp::Mtu;

#[test]
fn rdma_between_two_memif_ports_through_mbufs() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "DPDK needs root and hugepages: run it as root after scripts/setup.sh (make test)"
    );
    let cable = MemifCable::new("ferroce-rdma-t", 16383, "warning").expect("EAL and memif");
    assert!(cable.up(), "memif links up");
    let (ctls, threads) = cable.spawn(|i| RdmaHost::new(i as u32, 0, 100e9));
    let result = [Mtu::M1024, Mtu::M4096].into_iter().try_for_each(|mtu| {
        pair_check(&ctls[0], &ctls[1], mtu).map_err(|e| format!("{mtu:?}: {e}"))
    });
    for c in &ctls {
        c.send(Command::Stop).unwrap();
    }
    for t in threads {
        drop(t.join().unwrap());
    }
    let leaked = cable.finish();
    result.unwrap();
    assert_eq!(leaked, 0, "every mbuf back in the pool");
}
