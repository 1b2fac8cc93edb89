//! The RC transport on DPDK: two RdmaHost workers, each on its own memif port of one process
//! (a server and a client on one socket, joined like a cable), move RDMA WRITE, READ, SEND and
//! fetch-and-add between them through real mbufs: payload gathered from the MR into the tx mbuf,
//! headers prepended into its headroom, frames parsed in place from the rx mbuf. Needs root and
//! hugepages (scripts/setup.sh), as `make test` has.

use dataplane::counters::LcoreCounters;
use dataplane::dpdk::{DpdkPort, Eal, EalArgs, Mempool, PortSetup, TscSource};
use dataplane::lcore::{Command, LcoreId, Worker};
use dataplane::port::{PortId, QueueId};
use dataplane::transport::host::{RdmaHost, pair_check};
use dataplane::transport::qp::Mtu;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn rdma_between_two_memif_ports_through_mbufs() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "DPDK needs root and hugepages: run it as root after scripts/setup.sh (make test)"
    );
    let dir = std::env::temp_dir().join(format!("ferroce-rdma-memif-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("m.sock");
    let sock = sock.to_str().unwrap();
    let eal = Eal::init(&EalArgs {
        vdevs: vec![
            format!("net_memif0,role=server,socket={sock}"),
            format!("net_memif1,role=client,socket={sock}"),
        ],
        pci: vec![],
        file_prefix: Some(format!("ferroce-rdma-{}", std::process::id())),
        in_memory: false,
        hugepages: true,
        memory_mb: 0,
        worker_cpus: vec![],
        main_cpus: vec![],
        log_level: "warning".into(),
    })
    .expect("EAL");
    // 9 KiB of data room: frames of path MTU 4096 fit in one mbuf.
    let pool = Arc::new(Mempool::new("rdma_t", 16383, 256, 9216, -1).expect("mempool"));
    let ports: Vec<DpdkPort> = ["net_memif0", "net_memif1"]
        .iter()
        .enumerate()
        .map(|(i, d)| {
            DpdkPort::start(
                &PortSetup {
                    device: d.to_string(),
                    index: PortId(i as u16),
                    queues: 1,
                    mtu: 9000,
                    rx_desc: 1024,
                    tx_desc: 1024,
                },
                pool.clone(),
            )
            .expect("port")
        })
        .collect();
    let t = Instant::now();
    while !ports.iter().all(|p| p.link().up) {
        assert!(t.elapsed() < Duration::from_secs(10), "memif link up");
        std::thread::sleep(Duration::from_millis(10));
    }
    let clock = TscSource::new(&eal);
    let mut ctls = Vec::new();
    let mut threads = Vec::new();
    for (i, p) in ports.iter().enumerate() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let counters = Arc::new(LcoreCounters::default());
        let w = Worker::new(
            LcoreId(i as u16),
            vec![p.queue(QueueId(0))],
            RdmaHost::new(i as u32, 0, 100e9),
            clock,
            counters,
            rx,
        );
        threads.push(std::thread::spawn(move || w.run()));
        ctls.push(tx);
    }
    let result = [Mtu::M1024, Mtu::M4096].into_iter().try_for_each(|mtu| {
        pair_check(&ctls[0], &ctls[1], mtu).map_err(|e| format!("{mtu:?}: {e}"))
    });
    for c in &ctls {
        c.send(Command::Stop).unwrap();
    }
    for t in threads {
        drop(t.join().unwrap());
    }
    drop(ports);
    let leaked = pool.in_use();
    drop(pool);
    drop(eal);
    std::fs::remove_dir_all(&dir).ok();
    result.unwrap();
    assert_eq!(leaked, 0, "every mbuf back in the pool");
}
