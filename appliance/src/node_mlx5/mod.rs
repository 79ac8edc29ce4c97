//! `loch node` on the mlx5 backend (cluster file `[backend] kind =
//! "mlx5"`): opens the configured device and port, registers a memory
//! node's memory and lock table, connects every compute core to every
//! memory node over reliable-connected queue pairs, and runs the compute
//! role of [`crate::node_compute`] — `--workload verbs|tree|hash`, as on
//! emu — on executors over those queue pairs.
//!
//! # The connection protocol
//! Everything travels over bootstrap's control channel (the rendezvous's
//! exchanges and barriers); no node opens a socket to another.
//!
//! 0. Before the rendezvous each node opens its device; a memory node
//!    registers `memory_bytes` of host memory (huge pages where reserved)
//!    with remote READ/WRITE/atomic rights, and the lock table
//!    (`lock_table_words` × 8 bytes) in the NIC's device memory, or in
//!    host memory with a warning where the NIC has none. A machine with no
//!    RDMA device stops here with one "no RDMA device" error.
//! 1. Exchange 1: memory nodes publish one [`Region`](bootstrap::wire::Region) per space (host, and
//!    device for the lock table: base address, length, rkey). Compute nodes
//!    make, per core, one completion queue and one queue pair in INIT per
//!    memory node, and publish one [`Endpoint`](bootstrap::wire::Endpoint) per queue pair:
//!    `node_id` = the compute node, `peer_id` = [`pack_peer`]`(memory node,
//!    core index)`.
//! 2. Each memory node checks the whole set ([`requests_for`]), makes one
//!    responder queue pair per endpoint addressed to it, moves it to RTR
//!    and RTS towards the compute queue pair, and publishes in exchange 2
//!    its own endpoint: `node_id` = the memory node, `peer_id` =
//!    `pack_peer(compute node, core index)`.
//! 3. Compute nodes check exchange 2 ([`replies_for`]) and move each queue
//!    pair to RTR and RTS towards its responder, with the regions of
//!    exchange 1 ([`regions_by_node`]); then every node meets at the barrier
//!    `qps-ready`.
//! 4. From here on as on emu ([`crate::node_compute`]): every node meets at
//!    "memory-ready"; for an index workload the lowest-id compute node
//!    creates and loads the index (on its core 0's queue pairs); every node
//!    meets at "index-ready" and closes the channel (or keeps it for
//!    "compute-done" where a node both holds memory and computes); compute
//!    nodes run, and memory nodes serve until SIGINT/SIGTERM.
//! 5. Later runs, where the coordinator is a memory-only node: every
//!    memory-only node stays up and meets each later run at a rendezvous of
//!    the whole cluster (the coordinator keeps its listener; the others dial
//!    it again after each run). There it destroys the responders of the
//!    runs before — all compute nodes rejoined, so theirs have left — and
//!    runs steps 1–4 with the new run's cores, its memory and lock table
//!    registered as before ([`serve_memory_run`]). A run that fails to start
//!    (mismatched workloads, a node that died while joining) is said and
//!    the node waits for the next. The index's global locks use
//!    the smallest lock table a memory node published
//!    ([`lock_table_bytes`]), as a NIC may offer less device memory than
//!    `lock_table_words` asks for.
//!
//! 6. Every node a machine (both roles), [`run_machine`]: `--workload txn`,
//!    `txn --etcd` and `leases` ([`MachineWork`]). The same steps 0–3,
//!    with each machine's lanes connecting to every machine, its own
//!    memory in loopback, and lanes beyond the cores for the work beside
//!    them ([`Topology::with_lanes`], which every node applies
//!    alike): node 0's bank check; each machine's lease, recovery and
//!    replica-check cores; for leases alone, the lease and
//!    reconfiguration cores in place of the cores' lanes. Every
//!    lane's queue pairs are deep enough for the deepest executor the
//!    machine makes ([`MachineWork::deepest`]). Then the same code as on
//!    emu, each executor seeing its machine's registered memory as local
//!    memory.
//!
//! Every wait on the control channel ends within 100 ms of SIGINT/SIGTERM
//! ([`crate::node::join`] sets the channel's cancel hook).
//!
//! # Why the core index rides in `peer_id`
//! The rendezvous sorts records, so their order says nothing. Node ids of
//! the mlx5 backend fit 16 bits (a global address holds 16 bits of node),
//! so `peer_id` keeps the peer's id in its low 16 bits and the core index
//! (the "lane") in its high 16 bits: one record names one (compute node,
//! core, memory node) link unambiguously, with no change to the wire
//! format. Pure functions below build and check these records; every
//! malformed, duplicate, missing or foreign record is a [`PairError`].
//!
//! The device code needs the cargo feature `mlx5`; without it, [`run`]
//! says how to build it.

mod pairing;
pub use pairing::*;

#[cfg(feature = "mlx5")]
mod device;
#[cfg(feature = "mlx5")]
pub use device::*;

#[cfg(test)]
mod tests;

use crate::node::NodeError;
use bootstrap::config::{Backend, ClusterConfig};
use nicdrv::ExecutorConfig;

/// `loch node` on the mlx5 backend: see the module docs. Exit codes as
/// [`crate::node::run`]'s; in this build (no `mlx5` feature) always the
/// usage error [`NO_FEATURE`].
#[cfg(not(feature = "mlx5"))]
pub fn run(
    _o: &crate::node::NodeOptions,
    _cfg: &ClusterConfig,
    _node: &bootstrap::config::NodeConfig,
    _layout: crate::node_work::Layout,
) -> Result<u8, NodeError> {
    Err(NodeError::Usage(NO_FEATURE.into()))
}

/// What an mlx5 machine runs, every node of the cluster a machine.
#[derive(Copy, Clone)]
pub enum MachineWork<'a> {
    /// `--workload txn`: [`crate::node_txn::run_bank`].
    Bank,
    /// `--workload txn --etcd`: [`crate::node_txn::run_bank_recovering`].
    Recovering(&'a crate::node_leases::StoreFlags),
    /// `--workload leases`: [`crate::node_leases::run_leases`].
    Leases(&'a crate::node_leases::StoreFlags),
}

impl MachineWork<'_> {
    /// The config of the deepest executor a machine makes for this work
    /// ([`deepest`]): each core's (server and coordinator), the lease
    /// core's (a lease a peer), the recovery core's (reconfiguration and
    /// re-replication), the reconfiguration core's.
    pub fn deepest(self, geo: txn::Geometry) -> ExecutorConfig {
        use txn::harness::{core_config, lease_core_config};
        let leases = lease_core_config(usize::from(geo.machines.saturating_sub(1)));
        match self {
            MachineWork::Bank => core_config(),
            MachineWork::Recovering(_) => deepest(&[core_config(), leases, lease_core_config(2)]),
            MachineWork::Leases(_) => deepest(&[leases, lease_core_config(1)]),
        }
    }
}

/// `loch node` on an mlx5 machine; in this build (no `mlx5` feature)
/// always the usage error [`NO_FEATURE`].
#[cfg(not(feature = "mlx5"))]
pub fn run_machine(
    _o: &crate::node::NodeOptions,
    _cfg: &ClusterConfig,
    _node: &bootstrap::config::NodeConfig,
    _geo: txn::Geometry,
    _work: MachineWork,
) -> Result<u8, NodeError> {
    Err(NodeError::Usage(NO_FEATURE.into()))
}

/// An executor config with the most task slots of `configs`: queue pairs
/// made for it are deep enough for an executor of any of them.
pub fn deepest(configs: &[ExecutorConfig]) -> ExecutorConfig {
    let slots = configs.iter().map(|c| c.slots).max().unwrap_or(1);
    ExecutorConfig {
        slots,
        ..txn::harness::core_config()
    }
}

/// Whether this build can run the backend `cfg` names: an error (exit 2)
/// for `kind = "mlx5"` in a build without the `mlx5` feature.
pub fn supported(cfg: &ClusterConfig) -> Result<(), NodeError> {
    match cfg.backend {
        Backend::Mlx5 { .. } if !cfg!(feature = "mlx5") => Err(NodeError::Usage(NO_FEATURE.into())),
        _ => Ok(()),
    }
}
