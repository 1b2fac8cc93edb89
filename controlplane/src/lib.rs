//! The ferroce control plane: roced's configuration and its run loop.
//!
//! roced brings up the EAL, one mempool and the configured ports, starts one worker per lcore
//! (each owning queue `i` of every port), and runs the control loop on the main lcore: link
//! state, neighbour events passed between lcores, diagnostics, and an orderly stop on SIGINT or
//! SIGTERM.

// The OpenAPI document is one json! literal, deeper than serde_json's default limit allows.
#![recursion_limit = "256"]

pub mod api;
pub mod attach;
pub mod config;
pub mod metrics;
pub mod node;
pub mod openapi;
pub mod rdma;
pub mod state;
