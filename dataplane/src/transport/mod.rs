//! The RDMA transport, sans-IO: verbs objects and (to come) the reliable-connection requester,
//! responder and completer.
//!
//! Nothing here reads a clock or touches a port: time is passed in, packets and completions come
//! out, so the same code runs on lcores and in the simulator (STYLE.md: quinn-proto, rxe).
//! This first part holds the objects the engines work on: protection domains, memory regions
//! with keys, access flags and bounds checks ([`mr`]), completion queues that go to error on
//! overflow as hardware does ([`cq`]), and the QP state machine with the attributes each
//! transition needs ([`qp`]).
#![forbid(unsafe_code)]

pub mod cq;
pub mod mr;
pub mod qp;
pub mod rc;
pub mod resp_check;
pub mod soak;
pub mod timers;
pub mod wr;
