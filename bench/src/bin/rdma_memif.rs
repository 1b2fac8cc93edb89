//! RDMA WRITE through DPDK in one process: two RdmaHost lcores (threads) on a memif server and
//! client joined by one socket, one RC QP pair between them, the lcore keeping a stream of
//! WRITEs posted itself. Prints message rate and bandwidth per size (median of the rounds).
//! A first look at the transport on real mbufs; the two-process benchmark against
//! dpdk-testpmd is issue 6's.
//!
//! `cargo run --release -p bench --bin rdma_memif -- [--rounds 5] [--mtu 4096]`

use clap::Parser;
use dataplane::cc::CcKind;
use dataplane::dpdk::MemifCable;
use dataplane::host::{PAIR_VA, RdmaCommand, RdmaHost, connect_pair};
use dataplane::lcore::Command;
use dataplane::transport::qp::Mtu;
use dataplane::transport::wr::{SendOp, SendWr, Sge};
use std::time::Duration;

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
    let cable = MemifCable::new("ferroce-bench-rdma", 32767, "error")
        .expect("EAL and memif (root and hugepages: scripts/setup.sh)");
    assert!(cable.up(), "memif links up");
    let (ctls, threads) = cable.spawn(|i| RdmaHost::new(i as u32, 0, 100e9));
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
            let wr = SendWr::new(
                0,
                SendOp::Write {
                    remote_addr: PAIR_VA,
                    rkey: pair.kb,
                },
                Sge::list(PAIR_VA, size, pair.ka),
            );
            let (tx, rx) = crossbeam_channel::unbounded();
            ctls[0]
                .send(Command::Handler(RdmaCommand::test(
                    tx,
                    move |h, now, reply| {
                        let shape = (count, depth, None);
                        h.tests.stream(&mut h.dev, now, pair.qpa, wr, shape, reply)
                    },
                )))
                .expect("lcore");
            let r = rx
                .recv_timeout(Duration::from_secs(120))
                .expect("stream done")
                .expect("stream started");
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
    drop(cable);
}
