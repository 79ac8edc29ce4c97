//! A whole cluster on one host with the emu backend: memory nodes as
//! shared mappings owned by this process, and compute cores as pinned
//! threads, each running one executor with a queue pair to every memory
//! node. Also the compute side of a cluster whose memory nodes other
//! processes own ([`EmuCluster::attach`]).

use crate::work::Workload;
use mempool::CorePool;
use nicdrv::emu::{Backing, EmuConfig, EmuEndpoint, EmuNic, EmuNode, EmuNodeConfig};
use nicdrv::{Executor, ExecutorConfig};
use std::fmt;

/// What an emu cluster is made of.
#[derive(Clone, Debug)]
pub struct EmuClusterConfig {
    pub memory_nodes: usize,
    /// Host memory per memory node.
    pub host_bytes: u64,
    /// Device memory per memory node (the HOCL lock table lives there).
    pub dm_bytes: u64,
    pub emu: EmuConfig,
}

impl Default for EmuClusterConfig {
    fn default() -> Self {
        EmuClusterConfig {
            memory_nodes: 2,
            host_bytes: 256 << 20,
            dm_bytes: 256 << 10,
            emu: EmuConfig::default(),
        }
    }
}

/// Why a cluster could not boot or a core could not start.
#[derive(Debug)]
pub enum ClusterError {
    Config(String),
    Node(nicdrv::emu::EmuError),
    Device(String),
    Memory(mempool::MemError),
    Executor(nicdrv::ExecError),
    /// A core thread could not start or make its executor, or its
    /// workload could not start its tasks.
    Core(String),
}

impl fmt::Display for ClusterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterError::Config(s) => write!(f, "invalid cluster configuration: {s}"),
            ClusterError::Node(e) => write!(f, "memory node: {e}"),
            ClusterError::Device(s) => write!(f, "device: {s}"),
            ClusterError::Memory(e) => write!(f, "memory: {e}"),
            ClusterError::Executor(e) => write!(f, "executor: {e}"),
            // The message names the core already.
            ClusterError::Core(s) => write!(f, "{s}"),
        }
    }
}

impl std::error::Error for ClusterError {}

/// A booted single-host cluster.
pub struct EmuCluster {
    nic: EmuNic,
    endpoints: Vec<EmuEndpoint>,
    /// Cores run on machines 0..machines in turn (0: on none).
    machines: usize,
    // Owners last: endpoints keep the mappings, owners keep the nodes alive.
    nodes: Vec<EmuNode>,
}

impl EmuCluster {
    /// Creates and registers the memory nodes (ids 0..n).
    pub fn boot(cfg: &EmuClusterConfig) -> Result<EmuCluster, ClusterError> {
        if cfg.memory_nodes == 0 || cfg.memory_nodes > u16::MAX as usize {
            return Err(ClusterError::Config(format!(
                "memory_nodes must be 1..=65535, got {}",
                cfg.memory_nodes
            )));
        }
        let mut nodes = Vec::with_capacity(cfg.memory_nodes);
        for id in 0..cfg.memory_nodes {
            let node = EmuNode::create(&EmuNodeConfig {
                id: id as u16,
                host_bytes: cfg.host_bytes,
                dm_bytes: cfg.dm_bytes,
                backing: Backing::Memfd,
            })
            .map_err(ClusterError::Node)?;
            node.register_all()
                .map_err(|e| ClusterError::Device(e.to_string()))?;
            nodes.push(node);
        }
        let endpoints = nodes.iter().map(EmuNode::endpoint).collect();
        Ok(EmuCluster {
            nic: EmuNic::new(cfg.emu),
            endpoints,
            machines: 0,
            nodes,
        })
    }

    /// The cluster with its first `machines` memory nodes each a machine's:
    /// core c of [`EmuCluster::run`] and [`EmuCluster::run_cores`] runs on
    /// machine c mod `machines`, its local view that node's memory.
    pub fn with_machines(mut self, machines: usize) -> Result<EmuCluster, ClusterError> {
        if machines > self.endpoints.len() {
            return Err(ClusterError::Config(format!(
                "machines ({machines}) must not exceed the memory nodes ({})",
                self.endpoints.len()
            )));
        }
        self.machines = machines;
        Ok(self)
    }

    /// `machines` memory nodes of `host_bytes` each (4 KiB of device
    /// memory), every one a machine: what a transaction cluster runs on.
    pub fn machines(machines: usize, host_bytes: u64) -> Result<EmuCluster, ClusterError> {
        EmuCluster::boot(&EmuClusterConfig {
            memory_nodes: machines,
            host_bytes,
            dm_bytes: 4096,
            emu: EmuConfig::default(),
        })?
        .with_machines(machines)
    }

    /// `machine_executor` as a function of the machine's number and the
    /// core's config, errors as text: what a transaction harness asks for
    /// each core.
    pub fn machine_executors(
        &self,
    ) -> impl Fn(u16, ExecutorConfig) -> Result<Executor<EmuNic>, String> + Sync + '_ {
        move |m, cfg| {
            self.machine_executor(m as usize, cfg)
                .map_err(|e| e.to_string())
        }
    }

    /// A copy of memory node `id`'s host memory as its owner sees it
    /// (empty for a node this cluster does not own).
    pub fn host_copy(&self, id: usize) -> Vec<u8> {
        self.node(id).map_or_else(Vec::new, |n| {
            let h = n.host();
            let mut b = vec![0u8; h.len()];
            h.read(0, &mut b);
            b
        })
    }

    /// The machine core `core` runs on, if the cluster has machines.
    pub fn machine_of(&self, core: usize) -> Option<usize> {
        (self.machines > 0).then(|| core % self.machines)
    }

    /// A cluster of memory nodes other processes own, attached by path
    /// (`loch node`'s compute role). It has no owner's view: [`node`]
    /// is for clusters made by [`boot`].
    ///
    /// [`node`]: EmuCluster::node
    /// [`boot`]: EmuCluster::boot
    pub fn attach(endpoints: Vec<EmuEndpoint>, emu: EmuConfig) -> EmuCluster {
        EmuCluster {
            nic: EmuNic::new(emu),
            endpoints,
            machines: 0,
            nodes: Vec::new(),
        }
    }

    pub fn nic(&self) -> &EmuNic {
        &self.nic
    }

    pub fn memory_nodes(&self) -> usize {
        self.endpoints.len()
    }

    pub fn endpoints(&self) -> &[EmuEndpoint] {
        &self.endpoints
    }

    /// The owner's view of node `id` (for checks after a run); `None` for
    /// an attached cluster, which owns no node, or an id it does not have.
    pub fn node(&self, id: usize) -> Option<&EmuNode> {
        self.nodes.get(id)
    }

    /// An executor on the calling thread with a queue pair to every node and
    /// registered scratch from mempool.
    pub fn executor(&self, cfg: ExecutorConfig) -> Result<Executor<EmuNic>, ClusterError> {
        self.executor_on(&self.nic, cfg)
    }

    /// As [`EmuCluster::executor`], for a core of the machine that owns
    /// memory node `machine`: its tasks' local view is that node's host
    /// memory ([`EmuNic::on_machine`]). Every node of a booted or attached
    /// cluster can be a machine's.
    pub fn machine_executor(
        &self,
        machine: usize,
        cfg: ExecutorConfig,
    ) -> Result<Executor<EmuNic>, ClusterError> {
        let ep = self.endpoints.get(machine).ok_or_else(|| {
            ClusterError::Config(format!(
                "no machine {machine}: the cluster has {} memory nodes",
                self.endpoints.len()
            ))
        })?;
        self.executor_on(&self.nic.on_machine(ep), cfg)
    }

    fn executor_on(
        &self,
        nic: &EmuNic,
        cfg: ExecutorConfig,
    ) -> Result<Executor<EmuNic>, ClusterError> {
        let dev = |e: nicdrv::nic::RegError| ClusterError::Device(e.to_string());
        // Checked before its queue depth is used (Executor::new checks it
        // too, after): slots past 65535 would overflow the sizes below.
        cfg.check()
            .map_err(|e| ClusterError::Device(e.to_string()))?;
        let entries = u32::try_from(self.endpoints.len())
            .ok()
            .and_then(|n| cfg.qp_depth().checked_mul(n))
            .ok_or_else(|| {
                ClusterError::Device(format!(
                    "a completion queue of {} entries for each of {} memory nodes is past 2^32",
                    cfg.qp_depth(),
                    self.endpoints.len()
                ))
            })?;
        let cq = nic.create_cq(entries).map_err(dev)?;
        let mut qps = Vec::with_capacity(self.endpoints.len());
        for ep in &self.endpoints {
            qps.push(nic.create_qp(&cq, cfg.qp_depth()).map_err(dev)?.connect(ep));
        }
        let scratch = CorePool::new(nic, &cfg)
            .map_err(ClusterError::Memory)?
            .into_scratch();
        Executor::new(nic.clone(), cq, qps, scratch, cfg).map_err(ClusterError::Executor)
    }

    /// Runs `cores` compute cores, each a thread (pinned to CPU `i mod
    /// cpus` when `pin`) with its own executor, and returns what each
    /// returned.
    pub fn run_cores<R: Send>(
        &self,
        cores: usize,
        cfg: ExecutorConfig,
        pin: bool,
        per_core: impl Fn(usize, &mut Executor<EmuNic>) -> R + Sync,
    ) -> Result<Vec<R>, ClusterError> {
        let pin = if pin {
            crate::cores::Pinning::RoundRobin
        } else {
            crate::cores::Pinning::None
        };
        crate::cores::run_threads(
            cores,
            pin,
            |core| {
                match self.machine_of(core) {
                    Some(m) => self.machine_executor(m, cfg),
                    None => self.executor(cfg),
                }
                .map_err(|e| e.to_string())
            },
            per_core,
        )
        .map_err(ClusterError::Core)
    }

    /// Runs `work` on `cores` cores (module docs of [`crate::work`]): one
    /// group per core, its tasks spawned, run to the end and finished on
    /// the core's own thread; what each core's group reported, in core
    /// order.
    pub fn run<W: Workload>(
        &self,
        work: &W,
        cores: usize,
        cfg: ExecutorConfig,
        pin: bool,
    ) -> Result<Vec<W::Out>, ClusterError> {
        crate::cores::run_workload(
            work,
            cores,
            pin,
            |c| self.machine_of(c),
            |machine| {
                match machine {
                    Some(m) => self.machine_executor(m, cfg),
                    None => self.executor(cfg),
                }
                .map_err(|e| e.to_string())
            },
        )
        .map_err(ClusterError::Core)
    }
}
