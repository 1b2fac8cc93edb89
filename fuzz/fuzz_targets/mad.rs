//! The connection manager's MAD parser on arbitrary bytes: it must never panic, and whatever it
//! accepts re-emits to bytes that parse to the same message, emitting only clearing bits (the
//! reserved ones), never setting one. The rdma_cm private-data header likewise.
#![no_main]

use dataplane::wire::cm::{CMA_HEADER_LEN, CmaHeader, Message};
use dataplane::wire::mad::{HEADER_LEN, MAD_LEN, Mad, Repr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|b: &[u8]| {
    if let Ok(m) = Mad::new_checked(b) {
        let _ = Repr::parse(&m);
    }
    if let Ok(h) = CmaHeader::parse(b) {
        let mut out = [0u8; CMA_HEADER_LEN];
        h.emit(&mut out).expect("a parsed header re-emits");
        assert_eq!(CmaHeader::parse(&out), Ok(h));
    }
    let Ok((hdr, msg)) = Message::parse(b) else { return };
    let _ = CmaHeader::parse(msg.private_data());
    let mut out = [0u8; MAD_LEN];
    msg.emit(hdr.tid, &mut out).expect("a parsed message re-emits");
    let (again_hdr, again) = Message::parse(&out).expect("a re-emitted message parses");
    assert_eq!(again, msg);
    assert_eq!(again_hdr.tid, hdr.tid);
    for (o, i) in out[HEADER_LEN..].iter().zip(&b[HEADER_LEN..MAD_LEN]) {
        assert_eq!(o & !i, 0, "emit set a bit the input did not have");
    }
});
