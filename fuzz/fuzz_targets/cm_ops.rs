//! The connection manager as a whole: two CMs driven by the operations these bytes encode
//! (commands on any connection ID, MADs delivered, dropped, duplicated, reordered or forged,
//! time passing). `dataplane::transport::cm::ops` checks no panic, bounded state, no
//! connection established twice or after it is gone, and that every timer ends once the wire
//! is lossless.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    dataplane::transport::cm::ops::apply(data);
});
