//! # cluster — boots a Loch cluster and runs tasks on its cores
//!
//! One description ([`ClusterSpec`]) boots either backend ([`Cluster`]):
//! an emu cluster on this host ([`emu::EmuCluster`]: memory nodes as
//! shared mappings, compute cores as pinned threads) or a simulated world
//! (`nicdrv::sim::World`), or, with the `mlx5` feature, memory nodes and
//! cores on this host's RDMA device in loopback (`mlx5::Mlx5Cluster`). A [`work::Workload`] says once what runs on
//! each core; [`emu::EmuCluster::run`] and [`sim::spawn`]/[`sim::run`] run
//! it, and [`stats`] merges what the cores measured. [`cores::run_threads`]
//! runs cores as threads on any NIC backend; [`processes`] runs a cluster
//! as one process per node (their files, ports and lifetimes). The demo, the
//! benchmarks and the tests of every crate drive clusters through here.

pub mod cores;
pub mod emu;
#[cfg(feature = "mlx5")]
pub mod mlx5;
pub mod processes;
pub mod sim;
pub mod stats;
pub mod work;

use nicdrv::emu::EmuConfig;
use nicdrv::sim::{Fault, SimConfig, SimModel, World};
use nicdrv::{ExecutorConfig, NodeId, Space};

pub use emu::{ClusterError, EmuCluster, EmuClusterConfig};
pub use work::{Place, Spawn, Workload};

/// Which backend a [`ClusterSpec`] boots, with what only it has.
#[derive(Clone, Debug)]
pub enum Backend {
    /// Memory nodes in this process; one compute node (this process) whose
    /// cores are threads, pinned when `pin`.
    Emu { pin: bool },
    /// A simulated cluster in virtual time.
    Sim {
        seed: u64,
        compute_nodes: usize,
        model: SimModel,
        faults: Vec<Fault>,
    },
    /// Memory nodes registered on this host's RDMA device, and one compute
    /// node (this process) whose cores are threads (pinned when `pin`)
    /// reaching them through it in loopback.
    #[cfg(feature = "mlx5")]
    Mlx5 {
        device: nicdrv::mlx5::DeviceConfig,
        pin: bool,
    },
}

/// One cluster description for either backend.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    pub memory_nodes: usize,
    /// Host memory per memory node.
    pub host_bytes: u64,
    /// Device memory per memory node.
    pub dm_bytes: u64,
    /// One-way link latency in ns that replaces the backend's own (emu
    /// adds none, sim models one); 0 keeps the backend's.
    pub latency_ns: u64,
    /// Machines (nicdrv::local): memory nodes 0..machines are each one
    /// machine's. On sim compute node i < machines is machine i's; on emu
    /// core c runs on machine c mod machines (its `Place::compute_node`),
    /// its local view that node's memory. 0: none.
    pub machines: usize,
    pub backend: Backend,
}

/// A booted cluster.
pub enum Cluster {
    Emu {
        cluster: EmuCluster,
        pin: bool,
    },
    Sim(Box<World>),
    #[cfg(feature = "mlx5")]
    Mlx5 {
        cluster: mlx5::Mlx5Cluster,
        pin: bool,
    },
}

impl Cluster {
    /// Boots the memory nodes (ids 0..n) of `spec`.
    pub fn boot(spec: &ClusterSpec) -> Result<Cluster, String> {
        match &spec.backend {
            Backend::Emu { pin } => {
                let cluster = EmuCluster::boot(&EmuClusterConfig {
                    memory_nodes: spec.memory_nodes,
                    host_bytes: spec.host_bytes,
                    dm_bytes: spec.dm_bytes,
                    emu: EmuConfig {
                        latency_ns_one_way: spec.latency_ns,
                        ..Default::default()
                    },
                })
                .map_err(|e| e.to_string())?
                .with_machines(spec.machines)
                .map_err(|e| e.to_string())?;
                Ok(Cluster::Emu { cluster, pin: *pin })
            }
            Backend::Sim {
                seed,
                compute_nodes,
                model,
                faults,
            } => {
                let mut model = model.clone();
                if spec.latency_ns != 0 {
                    model.link_latency_ns_one_way = spec.latency_ns;
                }
                let w = World::new(SimConfig {
                    seed: *seed,
                    memory_nodes: spec.memory_nodes,
                    host_bytes: spec.host_bytes,
                    dm_bytes: spec.dm_bytes,
                    compute_nodes: *compute_nodes,
                    machines: spec.machines,
                    model,
                    faults: faults.clone(),
                })
                .map_err(|e| e.to_string())?;
                Ok(Cluster::Sim(Box::new(w)))
            }
            #[cfg(feature = "mlx5")]
            Backend::Mlx5 { device, pin } => {
                if spec.latency_ns != 0 {
                    return Err(
                        "a latency cannot be injected on a real NIC (emu and sim only)".into(),
                    );
                }
                let cluster = mlx5::Mlx5Cluster::boot(
                    device,
                    spec.memory_nodes,
                    spec.host_bytes,
                    spec.dm_bytes,
                    spec.machines,
                )?;
                Ok(Cluster::Mlx5 { cluster, pin: *pin })
            }
        }
    }

    /// The device memory each memory node has, of the `asked` it was
    /// booted with: all of it on emu and sim, the least any node got on
    /// mlx5 (a NIC gives what it has). What a tree sizes its lock table by.
    pub fn dm_bytes(&self, asked: u64) -> u64 {
        match self {
            Cluster::Emu { .. } | Cluster::Sim(_) => asked,
            #[cfg(feature = "mlx5")]
            Cluster::Mlx5 { cluster, .. } => cluster.dm_bytes().min(asked),
        }
    }

    /// Whether the run's cores are threads that each report their own
    /// group (emu, mlx5), not one simulated world (sim).
    pub fn on_threads(&self) -> bool {
        !matches!(self, Cluster::Sim(_))
    }

    /// Runs `work` on `cores` cores to the end: on emu one group per core
    /// (one `Out` each, in core order), on sim one group for all the cores,
    /// placed round robin over the compute nodes (one `Out`). On sim, a
    /// run that ended early leaves its unfinished tasks in the world: boot
    /// a new cluster for the next run ([`sim::run`]).
    pub fn run<W: Workload>(
        &mut self,
        work: &W,
        cores: usize,
        cfg: ExecutorConfig,
    ) -> Result<Vec<W::Out>, String> {
        let pin = match self {
            Cluster::Emu { pin, .. } => *pin,
            Cluster::Sim(_) => false,
            #[cfg(feature = "mlx5")]
            Cluster::Mlx5 { pin, .. } => *pin,
        };
        self.run_pinned(work, cores, cfg, pin)
    }

    /// As [`run`](Self::run), ending early once `stop` says so: `Ok(None)`
    /// on sim when it stopped the world before its tasks ended
    /// ([`sim::run_or_stop`]). On emu and mlx5 the tasks run on threads
    /// of their own and must look at the stop themselves: this is `run`.
    pub fn run_or_stop<W: Workload>(
        &mut self,
        work: &W,
        cores: usize,
        cfg: ExecutorConfig,
        stop: &dyn Fn() -> bool,
    ) -> Result<Option<Vec<W::Out>>, String> {
        match self {
            Cluster::Sim(w) => {
                sim::run_or_stop(w, work, cores, cfg, sim::Placement::RoundRobin, stop)
                    .map(|out| out.map(|o| vec![o]))
            }
            _ => self.run(work, cores, cfg).map(Some),
        }
    }

    /// As [`run`](Self::run), the cores' threads pinned or not as `pin`
    /// says rather than as the backend was booted with (a simulated world
    /// has no threads to pin).
    pub fn run_pinned<W: Workload>(
        &mut self,
        work: &W,
        cores: usize,
        cfg: ExecutorConfig,
        pin: bool,
    ) -> Result<Vec<W::Out>, String> {
        match self {
            Cluster::Emu { cluster, .. } => cluster
                .run(work, cores, cfg, pin)
                .map_err(|e| e.to_string()),
            Cluster::Sim(w) => {
                sim::run(w, work, cores, cfg, sim::Placement::RoundRobin).map(|out| vec![out])
            }
            #[cfg(feature = "mlx5")]
            Cluster::Mlx5 { cluster, .. } => cluster.run(work, cores, cfg, pin),
        }
    }

    /// The 8-byte word at `offset` of `space` on memory node `node`, read
    /// as the owner sees it (checks after a run); `None` when there is no
    /// such word, or the node crashed.
    pub fn read_u64(&self, node: NodeId, space: Space, offset: u64) -> Option<u64> {
        match self {
            Cluster::Emu { cluster, .. } => {
                let n = cluster.node(node as usize)?;
                let mem = match space {
                    Space::Host => n.host(),
                    Space::Device => n.device(),
                };
                // A word: 8-byte aligned (load_u64 asserts it), inside.
                (offset.is_multiple_of(8) && offset.checked_add(8)? <= mem.len() as u64)
                    .then(|| mem.load_u64(offset))
            }
            Cluster::Sim(w) => w.read_u64(node, space, offset),
            #[cfg(feature = "mlx5")]
            Cluster::Mlx5 { cluster, .. } => cluster.read_u64(node, space, offset),
        }
    }
}
