//! Copy or attach? The two ways issue 6 allows to put a memory region's payload into a
//! transmitted frame, measured on net_memif in one run.
//!
//! - copy: one mbuf per frame; headers written, the payload copied from the region into the
//!   mbuf, the ICRC computed over the frame and appended (what roced's transport does).
//! - extbuf: three mbufs per frame (`PacketBuf::attach_payload`, what roced's transport uses for
//!   long payloads): headers; the payload attached as an external buffer that points into the
//!   region (`rte_pktmbuf_attach_extbuf`, no copy); a 4-byte segment for the ICRC, which the
//!   region cannot hold. The ICRC is computed over the region's bytes in place.
//!
//! The region is hugepage memory (rte_zmalloc, as roced's regions are). This process sends on a
//! memif client port from one CPU; dpdk-testpmd (rxonly, memif server) receives on the other.
//! memif never drops on transmit (a full ring refuses the burst), so the frames tx_burst
//! accepted per second are the frames delivered. The two modes alternate in rounds at each
//! size, and the sender's own cycles per frame (building, without the transmit call) are
//! reported beside the rate.

use bench::{Testpmd, median, remove_runtime_dir, testpmd_eal};
use clap::Parser;
use dataplane::dpdk::{DpdkPort, Eal, EalArgs, HugepageHeap, Mbuf, Mempool, PortSetup, TscSource};
use dataplane::lcore::Clock;
use dataplane::port::PortId;
use dataplane::transport::mr::MrMemory;
use dataplane::{BURST_SIZE, Burst, PacketBuf, PortQueue};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(about = "Payload into frames by copy or as an external buffer, on memif, in one run")]
struct Args {
    /// Payload sizes per frame.
    #[arg(long, value_delimiter = ',', default_value = "64,1024,4096")]
    sizes: Vec<usize>,
    /// Rounds (each runs both modes at every size).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// CPU of the sender (this process).
    #[arg(long, default_value_t = 1)]
    tx_cpu: usize,
    /// CPU of the receiver (dpdk-testpmd rxonly).
    #[arg(long, default_value_t = 0)]
    rx_cpu: usize,
    /// Bytes of the region the payloads are taken from, in turn.
    #[arg(long, default_value_t = 1 << 20)]
    region: usize,
    /// Write the markdown report here too.
    #[arg(long)]
    report: Option<std::path::PathBuf>,
}

/// A payload size, a mode, and its rounds of (frames/s, payload Gb/s, build ns per frame).
type Row = (usize, Mode, Vec<(f64, f64, u64)>);

const SOCK: &str = "/run/ferroce/bench-extbuf.sock";
const BSIZE: u32 = 9088;
/// Ethernet 14, IPv4 20, UDP 8, BTH 12: an RDMA WRITE MIDDLE packet's headers.
const HDR: usize = 54;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Copy,
    Ext,
}

struct Sender {
    q: dataplane::dpdk::DpdkQueue,
    pool: Arc<Mempool>,
    mem: dataplane::mem::SharedMem,
    tsc: TscSource,
    hdr: [u8; HDR],
}

struct Run {
    frames: u64,
    secs: f64,
    build_ns: u64,
}

impl Sender {
    fn copy_frame(&self, off: usize, len: usize) -> Option<Mbuf> {
        let mut m = self.pool.alloc()?;
        let d = m.append(HDR + len + 4)?;
        d[..HDR].copy_from_slice(&self.hdr);
        self.mem.read(off, &mut d[HDR..HDR + len]);
        let c = crc32fast::hash(&d[14..HDR + len]);
        d[HDR + len..].copy_from_slice(&c.to_le_bytes());
        Some(m)
    }

    fn ext_frame(&self, off: usize, len: usize) -> Option<Mbuf> {
        let mut h = self.pool.alloc()?;
        h.append(HDR)?.copy_from_slice(&self.hdr);
        let crc = crc32fast::hash(&h.data()[14..]);
        let crc = self.mem.crc32(crc, off, len);
        let t = h.attach_payload(&self.mem, off, len, 4)?;
        t.copy_from_slice(&crc.to_le_bytes());
        Some(h)
    }

    fn run(&mut self, mode: Mode, len: usize, secs: f64) -> Result<Run, String> {
        let region = self.mem.len();
        let mut off = 0usize;
        let mut burst: Burst<Mbuf> = Burst::new();
        let (mut frames, mut build_ns) = (0u64, 0u64);
        let t0 = Instant::now();
        let end = t0 + Duration::from_secs_f64(secs);
        let mut check = 0u32;
        loop {
            check += 1;
            if check.is_multiple_of(64) && Instant::now() >= end {
                break;
            }
            let c0 = self.tsc.now().0;
            while burst.len() < BURST_SIZE {
                if off + len > region {
                    off = 0;
                }
                let m = match mode {
                    Mode::Copy => self.copy_frame(off, len),
                    Mode::Ext => self.ext_frame(off, len),
                };
                let Some(m) = m else {
                    return Err(format!("{mode:?}: could not build a {len}-byte frame"));
                };
                off += len;
                burst.push(m);
            }
            build_ns += self.tsc.now().0 - c0;
            frames += self.q.tx_burst(&mut burst) as u64;
        }
        let secs = t0.elapsed().as_secs_f64();
        // Drain what is left so the next run starts empty.
        let t1 = Instant::now();
        while !burst.is_empty() && t1.elapsed() < Duration::from_secs(1) {
            frames += self.q.tx_burst(&mut burst) as u64;
        }
        // Frames still in the burst were built but not sent: their build time is not counted.
        let unsent = burst.len() as u64;
        drop(burst);
        let per = build_ns / (frames + unsent).max(1);
        Ok(Run {
            frames,
            secs,
            build_ns: per,
        })
    }
}

fn main() {
    let a = Args::parse();
    if let Err(e) = run(&a) {
        eprintln!("extbuf_memif: {e}");
        std::process::exit(1);
    }
}

fn run(a: &Args) -> Result<(), String> {
    std::fs::create_dir_all("/run/ferroce").map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(SOCK);
    let dir = std::env::temp_dir().join(format!("ferroce-extbuf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut rx = Testpmd::start(
        "ferroce-extbuf-rx",
        &testpmd_eal(
            a.rx_cpu,
            &format!("net_memif0,role=server,socket={SOCK},bsize={BSIZE}"),
        ),
        &[
            "--forward-mode=rxonly".into(),
            "--total-num-mbufs=32768".into(),
            "--mbuf-size=9216".into(),
        ],
        &dir.join("testpmd-rx.log"),
    )
    .map_err(|e| format!("dpdk-testpmd: {e}"))?;
    std::thread::sleep(Duration::from_millis(1500));
    rx.cmd("start");

    let eal = Eal::init(&EalArgs {
        vdevs: vec![format!(
            "net_memif0,role=client,socket={SOCK},bsize={BSIZE}"
        )],
        file_prefix: Some("ferroce-extbuf-tx".into()),
        hugepages: true,
        main_cpus: vec![a.tx_cpu],
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    let pool = Arc::new(Mempool::new("extbuf", 16383, 256, 9088, -1).map_err(|e| e.to_string())?);
    let port = DpdkPort::start(
        &PortSetup {
            device: "net_memif0".into(),
            index: PortId(0),
            queues: 1,
            mtu: 9000,
            rx_desc: 1024,
            tx_desc: 1024,
        },
        pool.clone(),
    )
    .map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    while !port.link().up {
        if t0.elapsed() > Duration::from_secs(10) {
            return Err("memif link did not come up".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mem = HugepageHeap::new(&eal)
        .alloc(a.region)
        .map_err(|e| e.to_string())?;
    let mut fill = mem.clone();
    for (i, b) in (0..a.region).step_by(4096).enumerate() {
        let n = 4096.min(a.region - b);
        fill.write(b, &vec![i as u8; n]);
    }
    let mut hdr = [0u8; HDR];
    hdr[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    hdr[14] = 0x45;
    hdr[36..38].copy_from_slice(&4791u16.to_be_bytes());
    let mut s = Sender {
        q: port.queue(dataplane::port::QueueId(0)),
        pool: pool.clone(),
        mem,
        tsc: TscSource::new(&eal),
        hdr,
    };

    let mut rows: Vec<Row> = Vec::new();
    for &len in &a.sizes {
        for mode in [Mode::Copy, Mode::Ext] {
            rows.push((len, mode, Vec::new()));
        }
    }
    // A warm-up pass, not recorded.
    s.run(Mode::Copy, 1024, 0.5)?;
    for round in 0..a.rounds {
        for &len in &a.sizes {
            let modes = if round % 2 == 0 {
                [Mode::Copy, Mode::Ext]
            } else {
                [Mode::Ext, Mode::Copy]
            };
            for mode in modes {
                let r = s.run(mode, len, a.seconds)?;
                let pps = r.frames as f64 / r.secs;
                let gbps = pps * len as f64 * 8.0 / 1e9;
                eprintln!(
                    "round {round}: {len:>5} B {mode:?}: {:.2} Mpps, {gbps:.1} Gb/s payload, {} ns/frame to build",
                    pps / 1e6,
                    r.build_ns
                );
                let row = rows
                    .iter_mut()
                    .find(|(l, m, _)| *l == len && *m == mode)
                    .expect("row");
                row.2.push((pps, gbps, r.build_ns));
            }
        }
    }
    drop(s);
    rx.cmd("stop");
    rx.quit(Duration::from_secs(10));
    remove_runtime_dir("ferroce-extbuf-rx");
    drop(port);
    let left = pool.in_use();

    let mut md = format!(
        "# Payload by copy or as an external buffer, net_memif (one sender lcore on CPU {}, testpmd rxonly on CPU {})\n\n\
         Frames are RDMA WRITE MIDDLE packets (54 B of headers, payload, 4 B ICRC) from a {} KiB hugepage region, \
         {} s per measurement, {} rounds alternating the modes; medians. Build ns: the sender's time per frame \
         to allocate and fill it (copy: one mbuf, payload copied, ICRC; extbuf: three mbufs, payload attached, ICRC over the region).\n\
         Command: `cargo run --release -p bench --bin extbuf_memif`.\n\n\
         | payload | copy Mpps | extbuf Mpps | extbuf / copy | copy Gb/s | extbuf Gb/s | copy ns/frame | extbuf ns/frame |\n\
         |---|---|---|---|---|---|---|---|\n",
        a.tx_cpu,
        a.rx_cpu,
        a.region >> 10,
        a.seconds,
        a.rounds
    );
    for &len in &a.sizes {
        let get = |mode: Mode| {
            let r = &rows
                .iter()
                .find(|(l, m, _)| *l == len && *m == mode)
                .expect("row")
                .2;
            let pps = median(&r.iter().map(|x| x.0).collect::<Vec<_>>());
            let gb = median(&r.iter().map(|x| x.1).collect::<Vec<_>>());
            let cy = median(&r.iter().map(|x| x.2 as f64).collect::<Vec<_>>());
            (pps, gb, cy)
        };
        let (cp, cg, cc) = get(Mode::Copy);
        let (ep, eg, ec) = get(Mode::Ext);
        md += &format!(
            "| {len} B | {:.2} | {:.2} | {:.2} | {cg:.1} | {eg:.1} | {cc:.0} | {ec:.0} |\n",
            cp / 1e6,
            ep / 1e6,
            ep / cp
        );
    }
    md += &format!("\nAfter the run: {left} mbufs of the pool in use.\n");
    println!("{md}");
    if let Some(p) = &a.report {
        std::fs::write(p, &md).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
