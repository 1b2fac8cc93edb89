//! Micro-benchmarks of the per-packet wire work: ICRC alone, and parse + ICRC verify, for
//! RoCEv2 packets with 64 B, 1 KiB and 4 KiB payloads (RC SEND Only over IPv4), plus the naive
//! three-update ICRC for comparison. `cargo bench -p bench --bench wire`.

use criterion::{BenchmarkId, Criterion, Throughput, black_box, criterion_group, criterion_main};
use dataplane::PacketBuf;
use dataplane::buf::HeapBuf;
use dataplane::wire::packet::{Checks, RoceRepr, build, parse};
use dataplane::wire::{icrc, opcode::op, udp};

fn packet(payload: usize) -> Vec<u8> {
    let r = RoceRepr {
        udp: udp::Repr {
            src_port: 0xc001,
            ..RoceRepr::example(op::RC_SEND_ONLY, 0x11, 1).udp
        },
        ..RoceRepr::example(op::RC_SEND_ONLY, 0x11, 1)
    };
    let body: Vec<u8> = (0..payload).map(|i| i as u8).collect();
    let mut b = HeapBuf::from_slice(&body);
    build(&mut b, &r, false).unwrap();
    b.data().to_vec()
}

fn benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("icrc");
    for size in [64usize, 1024, 4096] {
        let f = packet(size);
        let l3 = &f[14..f.len() - 4];
        g.throughput(Throughput::Bytes(l3.len() as u64));
        g.bench_with_input(BenchmarkId::new("compute", size), &l3, |b, l3| {
            b.iter(|| icrc::compute(black_box(l3), false).unwrap())
        });
        g.bench_with_input(
            BenchmarkId::new("naive_three_updates", size),
            &l3,
            |b, l3| b.iter(|| bench::icrc_naive(black_box(l3))),
        );
        // Calibration: one crc32fast pass over the same bytes in place, no masking (the floor
        // for any approach built on crc32fast).
        g.bench_with_input(
            BenchmarkId::new("crc32fast_one_pass_unmasked", size),
            &l3,
            |b, l3| b.iter(|| crc32fast::hash(black_box(l3))),
        );
    }
    g.finish();
    let mut g = c.benchmark_group("parse_verify");
    for size in [64usize, 1024, 4096] {
        let f = packet(size);
        g.throughput(Throughput::Bytes(f.len() as u64));
        g.bench_with_input(BenchmarkId::new("parse_icrc", size), &f, |b, f| {
            b.iter(|| parse(black_box(f), Checks::ALL).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("parse_only", size), &f, |b, f| {
            b.iter(|| parse(black_box(f), Checks::NONE).unwrap())
        });
    }
    g.finish();
}

criterion_group! {
    name = wire;
    config = Criterion::default().warm_up_time(std::time::Duration::from_millis(500)).measurement_time(std::time::Duration::from_secs(2));
    targets = benches
}
criterion_main!(wire);
