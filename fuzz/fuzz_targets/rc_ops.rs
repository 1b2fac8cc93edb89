//! The RC engine as a whole: two QPs driven by the operations these bytes encode (posts,
//! receives, frames delivered, dropped, duplicated, reordered or forged with any opcode, PSN,
//! length and key, modifies to ERR, time passing). `dataplane::transport::ops` checks, as it
//! runs and at the end: no panic, no byte changed in a region no request may touch, every work
//! request completed at most once and every send exactly once, a QP in ERR holding no work.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    dataplane::transport::ops::Run::apply(data);
});
