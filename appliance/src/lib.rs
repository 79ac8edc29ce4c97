//! # appliance — the `loch` binary's library
//!
//! Owns `loch demo` ([`demo`]: its verb phase; [`demo_index`]: its index
//! phases, on clusters the `cluster` crate boots; [`demo_txn`]: its
//! transactions phase, on machines of its own), the index workload the
//! demo and `loch node` share ([`index_work`]), `loch node` and `loch
//! check` ([`node`], one process per node over bootstrap's control channel;
//! [`node_mlx5`] on real NICs), the compute role on any backend
//! ([`node_compute`]) and its workloads ([`node_work`]: verbs;
//! [`node_index`]: the B+tree and the hash table; [`node_txn`]: every
//! node a machine running transactions; [`node_leases`]: every node a
//! machine holding leases, reconfigured through etcd), and `loch demo
//! --processes` ([`processes`]). SIGINT and SIGTERM come from `cmdline`.

pub mod demo;
pub mod demo_index;
pub mod demo_txn;
pub mod index_work;
pub mod node;
pub mod node_compute;
pub mod node_index;
pub mod node_leases;
pub mod node_mlx5;
pub mod node_txn;
pub mod node_work;
pub mod processes;
pub mod stats;
pub mod verb_mix;
