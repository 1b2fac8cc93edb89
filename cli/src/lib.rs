//! rocectl's commands as a library, so they can be tested without a process.
pub mod cmstream;
pub mod ctl;
pub mod decode;
pub mod perf;
pub mod perftest;
pub mod pingpong;
pub mod rping;
pub mod setup;
pub mod ucmatose;
pub mod udaddy;
