//! The application data path's shared pieces: what an application attached to roced and the
//! lcore that owns its QPs both see.
//!
//! - [`shm`]: shared memory (a memfd, mapped by both processes; its descriptor travels over the
//!   attach socket).
//! - [`ring`]: single-producer/single-consumer rings in that memory, the form of a QP's send and
//!   receive queues (the application produces, the lcore consumes) and of a CQ (the lcore
//!   produces, the application consumes). Neither side trusts the other's index: a consumer that
//!   sees more entries than the ring holds reports the ring corrupt instead of reading past it.
//! - [`adopt`]: the process's own memory (malloc, stack, data) made shareable in place, so that
//!   `ibv_reg_mr` on it gives roced's lcores the same bytes the program sees.
//! - [`bell`]: doorbells, a bit per QP in shared memory per application and lcore, so that an
//!   lcore reads only the rings of QPs that have new work.
//! - [`attach`]: the attach socket's framing: control verbs as length-prefixed JSON messages
//!   over a Unix stream socket, shared memory's descriptors passed with them (SCM_RIGHTS).
//! - [`proto`]: the control verbs on that socket and roced's replies.
//! - [`event`]: asynchronous events (a QP or CQ in error through no verb, a port's link), one
//!   message each on a socket pair of their own.
//! - [`client`]: the client library: attach, PDs, regions of the application's memory, CQs,
//!   QPs, posting and polling through the rings.
//! - [`abi`]: the entries, work queue entries and completion queue entries, as fixed little-endian
//!   byte layouts: decoded from a private copy, so an application rewriting a slot while the
//!   lcore reads it changes nothing but its own request, and refused field by field.
//!
//! This crate depends on no other crate of ferroce and never on DPDK: the client library and
//! roced's lcores build on it alike. Its `unsafe` is the mapping (`shm.rs`) and the ring's
//! accesses to memory another process writes (`ring.rs`), each block with its reason.

pub mod abi;
pub mod adopt;
pub mod attach;
pub mod bell;
pub mod client;
pub mod event;
pub mod proto;
pub mod ring;
pub mod shm;
