//! # appliance — the `loch` binary's library
//!
//! Owns node roles and the demo workload itself ([`demo`], on a cluster
//! the `cluster` crate boots), `loch node` and `loch check` ([`node`], one process per node
//! over bootstrap's control channel; [`node_mlx5`] on real NICs), its
//! compute role on any backend ([`node_compute`]), its workloads
//! ([`node_work`]: verbs; [`node_index`]: the B+tree and the hash table), and
//! `loch demo --processes` ([`processes`]).

pub mod demo;
pub mod demo_tree;
pub mod node;
pub mod node_compute;
pub mod node_index;
pub mod node_mlx5;
pub mod node_work;
pub mod processes;
pub mod signals;
pub mod stats;
