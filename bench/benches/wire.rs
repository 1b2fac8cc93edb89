//! Micro-benchmarks of the per-packet wire work: ICRC alone, and parse + ICRC verify, for
//! RoCEv2 packets with 64 B, 1 KiB and 4 KiB payloads (RC SEND Only over IPv4), plus the naive
//! three-update ICRC for comparison. `cargo bench -p bench --bench wire`.

use criterion::{BenchmarkId, Criterion, Throughput, black_box, criterion_group, criterion_main};
use dataplane::PacketBuf;
use dataplane::buf::HeapBuf;
use dataplane::wire::ipv4::{self, Ecn};
use dataplane::wire::packet::{Checks, ExtRepr, IpRepr, RoceRepr, build, parse};
use dataplane::wire::{Psn, bth, eth, icrc, opcode::op, udp};

fn packet(payload: usize) -> Vec<u8> {
    let r = RoceRepr {
        eth: eth::Repr {
            dst: [2, 0, 0, 0, 0, 2],
            src: [2, 0, 0, 0, 0, 1],
            vlan: None,
            ethertype: 0,
        },
        ip: IpRepr::V4(ipv4::Repr {
            dscp: 26,
            ecn: Ecn::Ect0,
            ident: 1,
            flags_frag: 0x4000,
            ttl: 64,
            protocol: ipv4::PROTO_UDP,
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
        }),
        udp: udp::Repr {
            src_port: 0xc001,
            dst_port: udp::ROCEV2_PORT,
            checksum: 0,
        },
        bth: bth::Repr {
            opcode: op::RC_SEND_ONLY,
            pkey: 0xffff,
            dest_qp: 0x11,
            psn: Psn::new(1),
            ..Default::default()
        },
        ext: ExtRepr::default(),
    };
    let body: Vec<u8> = (0..payload).map(|i| i as u8).collect();
    let mut b = HeapBuf::from_slice(&body);
    build(&mut b, &r, false).unwrap();
    b.data().to_vec()
}

/// The naive way: three incremental updates over prefix, a masked header copy and payload.
fn icrc_naive(l3: &[u8]) -> u32 {
    let mut hdr = [0u8; 40];
    hdr.copy_from_slice(&l3[..40]);
    for at in [1, 8, 10, 11, 26, 27, 32] {
        hdr[at] = 0xff;
    }
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xff; 8]);
    h.update(&hdr);
    h.update(&l3[40..]);
    h.finalize()
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
            |b, l3| b.iter(|| icrc_naive(black_box(l3))),
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
