//! # appliance — the `loch` binary's library
//!
//! Owns node roles and the single-host emu cluster ([`cluster`]) that
//! `loch demo` and the benchmarks boot, and the demo workload itself
//! ([`demo`]). Later issues add `loch node` (one process per node, over
//! bootstrap's control channel) and `loch check`.

pub mod cluster;
pub mod demo;
pub mod demo_tree;
pub mod stats;
