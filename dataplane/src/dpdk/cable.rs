//! Two memif ports in one process, a server and a client on one socket, joined like a cable:
//! the transport's DPDK tests and benchmarks run on it without a second process.

use super::{DpdkPort, DpdkQueue, Eal, EalArgs, Error, Mempool, PortSetup, TscSource};
use crate::counters::LcoreCounters;
use crate::lcore::{Command, Handler, LcoreId, Worker};
use crate::port::PortId;
use crate::port::QueueId;
use crossbeam_channel::Sender;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The cable: EAL, an mbuf pool with 9 KiB of data room (path MTU 4096 fits one mbuf), and the
/// two ports, links up. Dropping it stops the ports, frees the pool, cleans EAL up and removes
/// the socket's directory.
pub struct MemifCable {
    /// The two ports (server, client).
    pub ports: Vec<DpdkPort>,
    pool: Option<Arc<Mempool>>,
    eal: Option<Eal>,
    dir: PathBuf,
}

impl core::fmt::Debug for MemifCable {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MemifCable")
            .field("dir", &self.dir)
            .finish()
    }
}

impl MemifCable {
    /// Starts EAL (file prefix `name`-pid), a pool of `mbufs`, and both ports; waits up to 10 s
    /// for their links. Needs root and hugepages.
    pub fn new(name: &str, mbufs: u32, log_level: &str) -> Result<Self, Error> {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| Error::Eal {
            reason: format!("{}: {e}", dir.display()),
            args: String::new(),
        })?;
        let sock = dir.join("memif.sock");
        let sock = sock.to_string_lossy();
        let eal = Eal::init(&EalArgs {
            vdevs: vec![
                format!("net_memif0,role=server,socket={sock}"),
                format!("net_memif1,role=client,socket={sock}"),
            ],
            pci: vec![],
            file_prefix: Some(format!("{name}-{}", std::process::id())),
            in_memory: false,
            hugepages: true,
            memory_mb: 0,
            worker_cpus: vec![],
            main_cpus: vec![],
            log_level: log_level.into(),
        })?;
        let pool = Arc::new(Mempool::new(name, mbufs, 256, 9216, -1)?);
        let mut ports = Vec::new();
        for (i, d) in ["net_memif0", "net_memif1"].iter().enumerate() {
            let setup = PortSetup {
                device: d.to_string(),
                index: PortId(i as u16),
                queues: 1,
                mtu: 9000,
                rx_desc: 1024,
                tx_desc: 1024,
            };
            ports.push(DpdkPort::start(&setup, pool.clone())?);
        }
        let t = Instant::now();
        while !ports.iter().all(|p| p.link().up) && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(MemifCable {
            ports,
            pool: Some(pool),
            eal: Some(eal),
            dir,
        })
    }

    /// The EAL (for the TSC clock).
    pub fn eal(&self) -> &Eal {
        self.eal.as_ref().expect("present until drop")
    }

    /// Runs `make(i)` as a worker on port `i`'s queue 0, one thread per port (TSC clock);
    /// returns their command channels and threads. Send `Command::Stop` and join them (their
    /// queues hold pool buffers) before [`MemifCable::finish`].
    #[allow(clippy::type_complexity)]
    pub fn spawn<H>(
        &self,
        make: impl Fn(usize) -> H,
    ) -> (
        Vec<Sender<Command<H::Command>>>,
        Vec<std::thread::JoinHandle<Vec<DpdkQueue>>>,
    )
    where
        H: Handler<DpdkQueue> + 'static,
        H::Command: core::fmt::Debug,
    {
        let clock = TscSource::new(self.eal());
        let mut ctls = Vec::new();
        let mut threads = Vec::new();
        for (i, p) in self.ports.iter().enumerate() {
            let (tx, rx) = crossbeam_channel::unbounded();
            let w = Worker::new(
                LcoreId(i as u16),
                vec![p.queue(QueueId(0))],
                make(i),
                clock,
                std::sync::Arc::new(LcoreCounters::default()),
                rx,
            );
            threads.push(std::thread::spawn(move || w.run()));
            ctls.push(tx);
        }
        (ctls, threads)
    }

    /// True when both links are up.
    pub fn up(&self) -> bool {
        self.ports.iter().all(|p| p.link().up)
    }

    /// Stops the ports and returns how many mbufs are still out of the pool (0 when nothing
    /// leaked), then cleans everything up.
    pub fn finish(mut self) -> u32 {
        self.ports.clear();
        self.pool.as_ref().map_or(0, |p| p.in_use())
    }
}

impl Drop for MemifCable {
    fn drop(&mut self) {
        // Ports before their pool, the pool before EAL's cleanup.
        self.ports.clear();
        drop(self.pool.take());
        drop(self.eal.take());
        std::fs::remove_dir_all(&self.dir).ok();
    }
}
