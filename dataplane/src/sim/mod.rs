//! The simulator and what runs through it: `netsim`'s network (re-exported whole) and the runs
//! that drive the transport's QPs across it: [`soak`] (randomized operations on lossy links
//! against a reference model) and [`incast`] (DCQCN with many senders into one switch port).

pub use netsim::*;

pub mod incast;
pub mod soak;
