//! The receive parse on arbitrary bytes: it must never panic, and whatever it accepts must
//! survive a trip through RoceRepr: parse(emit(parse(frame))) gives the same packet. Also a
//! differential check of the SIMD masked CRC kernel against its table-driven reference.
#![no_main]

use dataplane::wire::packet::{Checks, RoceRepr, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|frame: &[u8]| {
    let masks = [0xff00_0000_ffff_00ff_u128, 0xffff << 80, 0xff, 0x0f << 120];
    assert_eq!(
        dataplane::crc::crc32_masked(0x1234_5678, frame, &masks),
        dataplane::crc::crc32_masked_scalar(0x1234_5678, frame, &masks)
    );
    // Structure only, then everything: both paths must be panic-free.
    let _ = parse(frame, Checks::ALL);
    let Ok(info) = parse(frame, Checks::NONE) else { return };
    let _ = info.ext.reth();
    let _ = info.ext.aeth();
    let _ = info.ext.atomic_eth();
    let _ = info.ext.atomic_ack();
    let _ = info.ext.deth();
    let _ = info.ext.immdt();
    let _ = info.ext.ieth();
    let Ok(repr) = RoceRepr::parse(frame, &info) else { return };
    let plen = info.payload_len as usize;
    let mut out = vec![0u8; repr.frame_len(plen)];
    let h = repr.header_len();
    out[h..h + plen].copy_from_slice(info.payload(frame));
    repr.emit(&mut out, plen, false).expect("a parsed packet re-emits");
    let again = parse(&out, Checks::ALL).expect("a re-emitted packet parses with a good ICRC");
    assert_eq!(again.opcode, info.opcode);
    assert_eq!(again.dest_qp, info.dest_qp);
    assert_eq!(again.psn, info.psn);
    assert_eq!(again.payload(&out), info.payload(frame));
    assert_eq!(RoceRepr::parse(&out, &again).expect("reparse").ext, repr.ext);
});
