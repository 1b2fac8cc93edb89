//! Frames that carry region bytes attached instead of copied (`PacketBuf::attach_payload` on
//! mbufs): the bytes are the region's, the region outlives its handles while frames still
//! point into it, and attachments from two threads at once keep the count right. Needs root
//! and hugepages (scripts/setup.sh), as `make test` has.

use dataplane::PacketBuf;
use dataplane::dpdk::{Eal, EalArgs, HugepageHeap, Mempool};
use dataplane::transport::mr::MrMemory;
use std::sync::Arc;

#[test]
fn attached_payloads_read_the_region_and_keep_it_alive() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "DPDK needs root and hugepages");
    let eal = Eal::init(&EalArgs {
        in_memory: true,
        hugepages: true,
        ..Default::default()
    })
    .expect("EAL");
    let pool = Arc::new(Mempool::new("extbuf-t", 4095, 0, 9000, -1).expect("pool"));
    let heap = HugepageHeap::new(&eal);
    let mut mem = heap.alloc(1 << 16).expect("hugepage memory");
    let pattern: Vec<u8> = (0..1u32 << 16).map(|i| (i * 7 + i / 253) as u8).collect();
    mem.write(0, &pattern);

    // Headers, then 4000 bytes of the region attached, then an 8-byte tail.
    let mut m = pool.alloc().unwrap();
    m.append(10).unwrap().fill(0xee);
    let t = m.attach_payload(&mem, 100, 4000, 8).expect("attach");
    t.fill(0xdd);
    assert_eq!((m.segments(), m.frame_len(), m.len()), (3, 4018, 10));
    assert_eq!(mem.attached(), 1);
    // Out of range or over a chained frame: refused, the frame unchanged.
    let mut other = pool.alloc().unwrap();
    assert!(other.attach_payload(&mem, 65000, 4000, 4).is_none());
    assert!(m.attach_payload(&mem, 0, 10, 4).is_none());
    assert_eq!((other.frame_len(), m.segments()), (0, 3));
    drop(other);

    // The last handle goes while the frame still points into the memory: the bytes stay (DPDK
    // clears memory it frees, so a premature free would show as zeroes).
    drop(mem);
    assert!(m.linearize(), "the chain fits the first segment's room");
    assert_eq!(m.segments(), 1);
    let d = m.data();
    assert_eq!(d.len(), 4018);
    assert!(d[..10].iter().all(|&b| b == 0xee) && d[4010..].iter().all(|&b| b == 0xdd));
    assert_eq!(&d[10..4010], &pattern[100..4100]);
    drop(m);

    // Two threads attaching from one region at once: the count ends where it started.
    let mem = heap.alloc(1 << 16).expect("hugepage memory");
    let workers: Vec<_> = (0..2)
        .map(|k| {
            let (mem, pool) = (mem.clone(), pool.clone());
            std::thread::spawn(move || {
                for i in 0..50_000usize {
                    let mut frames = Vec::new();
                    for j in 0..4 {
                        let mut f = pool.alloc().expect("mbuf");
                        f.attach_payload(&mem, (i + j + k) % 60000, 4096, 4)
                            .expect("attach");
                        frames.push(f);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(mem.attached(), 0, "every attachment released exactly once");
    drop(mem);
    assert_eq!(pool.in_use(), 0, "every mbuf back in the pool");
}
