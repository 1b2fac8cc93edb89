//! RDMA WRITE through DPDK in one process: two RdmaHost lcores (threads) on a memif server and
//! client joined by one socket, one RC QP pair between them, the lcore keeping a stream of
//! WRITEs posted itself. Prints message rate and bandwidth per size (median of the rounds).
//! A first look at the transport on real mbufs; the two-process benchmark against
//! dpdk-testpmd is issue 6's.
//!
//! `cargo run --release -p bench --bin rdma_memif -- [--rounds 5] [--mtu 4096]`

use clap::Parser;
use dataplane::cc::CcKind;
use dataplane::counters::LcoreCounters;
use dataplane::dpdk::{DpdkPort, Eal, EalArgs, Mempool, PortSetup, TscSource};
use dataplane::lcore::{Command, LcoreId, Worker};
use dataplane::port::{PortId, QueueId};
use dataplane::transport::host::{PAIR_VA, RdmaCommand, RdmaHost, connect_pair};
use dataplane::transport::qp::Mtu;
use dataplane::transport::wr::{SendOp, SendWr, Sge};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(about = "RDMA WRITE rate and bandwidth between two lcores over memif, in one process")]
struct Args {
    /// Rounds per size (the median is printed).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Path MTU.
    #[arg(long, default_value_t = 4096)]
    mtu: u32,
    /// Congestion control on the QPs (dcqcn or none).
    #[arg(long, default_value = "none")]
    cc: String,
}

fn main() {
    let a = Args::parse();
    let Some(mtu) = Mtu::from_bytes(a.mtu) else {
        eprintln!("rdma_memif: --mtu must be 256, 512, 1024, 2048 or 4096");
        std::process::exit(2);
    };
    let Ok(cc) = a.cc.parse::<CcKind>() else {
        eprintln!("rdma_memif: --cc must be dcqcn or none");
        std::process::exit(2);
    };
    let dir = std::env::temp_dir().join(format!("ferroce-bench-rdma-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let sock = dir.join("m.sock");
    let sock = sock.to_str().expect("utf-8 path");
    let eal = Eal::init(&EalArgs {
        vdevs: vec![
            format!("net_memif0,role=server,socket={sock}"),
            format!("net_memif1,role=client,socket={sock}"),
        ],
        pci: vec![],
        file_prefix: Some(format!("ferroce-bench-rdma-{}", std::process::id())),
        in_memory: false,
        hugepages: true,
        memory_mb: 0,
        worker_cpus: vec![],
        main_cpus: vec![],
        log_level: "error".into(),
    })
    .expect("EAL (root and hugepages: scripts/setup.sh)");
    let pool = Arc::new(Mempool::new("rdma_b", 32767, 256, 9216, -1).expect("mempool"));
    let ports: Vec<DpdkPort> = ["net_memif0", "net_memif1"]
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let setup = PortSetup {
                device: d.to_string(),
                index: PortId(i as u16),
                queues: 1,
                mtu: 9000,
                rx_desc: 1024,
                tx_desc: 1024,
            };
            DpdkPort::start(&setup, pool.clone()).expect("port")
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
        let w = Worker::new(
            LcoreId(i as u16),
            vec![p.queue(QueueId(0))],
            RdmaHost::new(i as u32, 0, 100e9),
            clock,
            Arc::new(LcoreCounters::default()),
            rx,
        );
        threads.push(std::thread::spawn(move || w.run()));
        ctls.push(tx);
    }
    let pair = connect_pair(&ctls[0], &ctls[1], mtu, cc).expect("connect");
    println!(
        "RDMA WRITE, memif in one process, path MTU {}, cc {}, two lcores on 2 CPUs",
        a.mtu, a.cc
    );
    println!(
        "{:>8} {:>10} {:>12} {:>10}",
        "#bytes", "#iters", "BW Gb/s", "Mpps"
    );
    for (size, count, depth) in [
        (64u32, 2_000_000u64, 64usize),
        (1024, 1_000_000, 64),
        (4096, 500_000, 32),
        (65536, 30_000, 16),
    ] {
        let mut runs: Vec<(f64, f64)> = Vec::new();
        for _ in 0..a.rounds {
            let mut sg = arrayvec::ArrayVec::new();
            sg.push(Sge {
                addr: PAIR_VA,
                length: size,
                lkey: pair.ka,
            });
            let wr = SendWr {
                wr_id: 0,
                op: SendOp::Write {
                    remote_addr: PAIR_VA,
                    rkey: pair.kb,
                },
                sg,
                signaled: true,
                solicited: false,
                fence: false,
            };
            let (tx, rx) = crossbeam_channel::unbounded();
            ctls[0]
                .send(Command::Handler(RdmaCommand::Stream {
                    qpn: pair.qpa,
                    wr: Box::new(wr),
                    count,
                    depth,
                    reply: tx,
                }))
                .expect("lcore");
            let r = rx
                .recv_timeout(Duration::from_secs(120))
                .expect("stream done");
            assert_eq!(r.errors, 0, "stream errors");
            let secs = r.elapsed_ns as f64 / 1e9;
            runs.push((
                r.completed as f64 * size as f64 * 8.0 / secs / 1e9,
                r.completed as f64 / secs / 1e6,
            ));
        }
        runs.sort_by(|x, y| x.0.total_cmp(&y.0));
        let (bw, mpps) = runs[runs.len() / 2];
        println!("{size:>8} {count:>10} {bw:>12.2} {mpps:>10.3}");
    }
    for c in &ctls {
        let _ = c.send(Command::Stop);
    }
    for t in threads {
        drop(t.join());
    }
    drop(ports);
    drop(pool);
    drop(eal);
    std::fs::remove_dir_all(&dir).ok();
}
