//! A whole cluster on one RDMA device, in loopback (cargo feature `mlx5`):
//! memory nodes registered by this process, and compute cores as threads,
//! each running one executor with a reliable-connected queue pair to every
//! memory node through the device. Every verb crosses the NIC (its
//! processing, its DMA, its completions) but not a wire: what a core
//! spends per verb on a real NIC, and what the NIC sustains, on one host.

use crate::work::Workload;
use mempool::CorePool;
use nicdrv::mlx5::{DeviceConfig, LoopbackRearm, Mlx5MemoryNode, Mlx5Nic};
use nicdrv::{Executor, ExecutorConfig, Nic, NodeId, Space};
use std::sync::Arc;

/// Memory nodes on this host's RDMA device, and cores that reach them
/// through it.
pub struct Mlx5Cluster {
    nic: Mlx5Nic,
    nodes: Vec<Arc<Mlx5MemoryNode>>,
    /// Core `c` runs on machine `c mod machines` (0: none).
    machines: usize,
}

impl Mlx5Cluster {
    /// Opens `device` and registers `memory_nodes` memory nodes (ids
    /// 0..n) of `host_bytes` each and up to `dm_bytes` of device memory
    /// (host memory, with a warning, where the NIC offers none). With
    /// `machines` > 0, memory nodes 0..machines are machines: their cores
    /// see their memory as local memory. "no RDMA device" where there is
    /// none.
    pub fn boot(
        device: &DeviceConfig,
        memory_nodes: usize,
        host_bytes: u64,
        dm_bytes: u64,
        machines: usize,
    ) -> Result<Mlx5Cluster, String> {
        if memory_nodes == 0 || memory_nodes > usize::from(NodeId::MAX) {
            return Err(format!(
                "invalid cluster configuration: {memory_nodes} memory nodes"
            ));
        }
        if machines > memory_nodes {
            return Err(format!(
                "invalid cluster configuration: {machines} machines but {memory_nodes} memory nodes"
            ));
        }
        let bytes = usize::try_from(host_bytes)
            .map_err(|_| format!("memory nodes of {host_bytes} bytes"))?;
        let nic = Mlx5Nic::open(device).map_err(|e| e.to_string())?;
        let nodes = (0..memory_nodes)
            .map(|id| {
                Mlx5MemoryNode::new(&nic, id as NodeId, bytes, dm_bytes)
                    .map(Arc::new)
                    .map_err(|e| format!("memory node {id}: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Mlx5Cluster {
            nic,
            nodes,
            machines,
        })
    }

    /// The device memory every memory node has: the least any got, which
    /// may be less than was asked (a NIC offers what it has).
    pub fn dm_bytes(&self) -> u64 {
        self.nodes.iter().map(|n| n.dm_bytes()).min().unwrap_or(0)
    }

    /// The machine core `core` runs on, if the cluster has machines.
    pub fn machine_of(&self, core: usize) -> Option<usize> {
        (self.machines > 0).then(|| core % self.machines)
    }

    /// An executor of `cfg` with a queue pair to every memory node, on
    /// `machine`'s local view when given; made on the thread that runs it.
    pub fn executor(
        &self,
        machine: Option<usize>,
        cfg: ExecutorConfig,
    ) -> Result<Executor<Mlx5Nic>, String> {
        let nic = match machine {
            Some(m) => {
                let node = self.nodes.get(m).ok_or_else(|| format!("no machine {m}"))?;
                self.nic.on_machine(node)
            }
            None => self.nic.clone(),
        };
        // Checked before its queue depth is used (Executor::new checks it
        // too, after).
        cfg.check().map_err(|e| e.to_string())?;
        let depth = cfg.qp_depth();
        let cq = nic
            .create_cq(depth.saturating_mul(self.nodes.len() as u32))
            .map_err(|e| format!("completion queue: {e}"))?;
        let qps = self
            .nodes
            .iter()
            .enumerate()
            .map(|(id, n)| {
                let prepared = nic
                    .create_qp(&cq, depth)
                    .map_err(|e| format!("queue pair: {e}"))?;
                let ep = n
                    .accept(&prepared.endpoint())
                    .map_err(|e| format!("memory node {id}: accepting: {e}"))?;
                let mut qp = prepared
                    .connect(&ep)
                    .map_err(|e| format!("memory node {id}: connecting: {e}"))?;
                // The memory node is in this process: a queue pair in
                // error (a remote access error, a flush after one, a link
                // that came back) recovers by re-arming its responder
                // directly, as emu's recover does; without it the first
                // such error left the node dead to this core for the run.
                qp.set_rearm(Box::new(LoopbackRearm {
                    node: n.clone(),
                    responder_qpn: ep.qp.qpn,
                }));
                Ok(qp)
            })
            .collect::<Result<Vec<_>, String>>()?;
        let scratch = CorePool::new(&nic, &cfg)
            .map_err(|e| format!("scratch: {e}"))?
            .into_scratch();
        Executor::new(nic, cq, qps, scratch, cfg).map_err(|e| format!("executor: {e}"))
    }

    /// Runs `work` on `cores` cores (module docs of [`crate::work`]): one
    /// group per core, each core a thread (pinned to CPU `i mod cpus` when
    /// `pin`) with its own executor; what each core's group reported, in
    /// core order.
    pub fn run<W: Workload>(
        &self,
        work: &W,
        cores: usize,
        cfg: ExecutorConfig,
        pin: bool,
    ) -> Result<Vec<W::Out>, String> {
        crate::cores::run_workload(
            work,
            cores,
            pin,
            |c| self.machine_of(c),
            |m| self.executor(m, cfg),
        )
    }

    /// The 8-byte word at `offset` of memory node `node`'s host memory, as
    /// its owner sees it; `None` when there is no such word, or for device
    /// memory (the host cannot load it; a verb reads it).
    pub fn read_u64(&self, node: NodeId, space: Space, offset: u64) -> Option<u64> {
        let n = self.nodes.get(usize::from(node))?;
        if space != Space::Host {
            return None;
        }
        self.nic.on_machine(n).local_load(offset).ok()
    }
}
