//! The RDMA transport, sans-IO: verbs objects and the reliable-connection requester, responder
//! and completer.
//!
//! Nothing here reads a clock or touches a port: time is passed in, packets and completions come
//! out, so the same code runs on lcores and in the simulator (STYLE.md: quinn-proto, rxe).
//! The objects: protection domains, memory regions with keys, access flags and bounds checks
//! ([`mr`]), completion queues that go to error on overflow as hardware does ([`cq`]), the QP
//! state machine with the attributes each transition needs ([`qp`]), work requests and their
//! segmentation ([`wr`]), the responder's check chain ([`resp_check`]), per-QP deadlines
//! ([`timers`]). The engine: [`rc::RcQp`]; its congestion control: [`cc`] (DCQCN).
//! [`ops`]: arbitrary operation sequences against two QPs (the engine's fuzz target);
//! [`testkit`]: the two-QP harness the tests, the simulator runs and the benchmarks share.
//!
//! This crate depends on `wire` alone (and small pure crates): the compiler keeps DPDK, ports,
//! lcores and clocks out (ARCHITECTURE.md). On an lcore, `dataplane::host::RdmaHost` runs a
//! shard of QPs as a handler of the poll loop; the soak and incast runs drive it through the
//! simulator (`netsim`).
#![forbid(unsafe_code)]

pub mod cc;
pub mod cm;
pub mod cq;
pub mod device;
pub mod gsi;
pub mod mr;
pub mod ops;
pub mod perftest;
pub mod qp;
pub mod rc;
pub mod resp_check;
pub mod testkit;
pub mod timers;
pub mod wr;
