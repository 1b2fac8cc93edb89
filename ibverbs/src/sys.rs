//! libibverbs' structures and constants as bindgen reads them from Debian's headers.
#![allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    missing_debug_implementations,
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    rust_2018_idioms
)]
include!(concat!(env!("OUT_DIR"), "/verbs.rs"));
