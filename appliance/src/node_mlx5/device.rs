//! The verbs side: device, memory node, per-core queue pairs, and the
//! `loch node` run over them (cargo feature `mlx5`).

use super::*;
use crate::node::NodeError;
use crate::node::{self, say, NodeOptions};
use crate::node_compute::{self, Compute, CoreSource};
use crate::node_work::Layout;
use bootstrap::config::{Backend, ClusterConfig};
use bootstrap::config::{HugePages, NodeConfig};
use bootstrap::wire::{QpInfo, Region, Space as WireSpace};
use bootstrap::Rendezvous;
use cmdline::signals;
use nicdrv::mlx5::{
    DeviceConfig, Endpoint as NicEndpoint, Mlx5CoreQps, Mlx5Error, Mlx5MemoryNode, Mlx5Nic,
    QpEndpoint, RegionInfo,
};
use nicdrv::{Access, Executor, ExecutorConfig, HeapMem, Nic, NodeId, RKey, RemoteRegion, Space};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A queue pair's address as the wire carries it.
pub fn qp_info(e: &QpEndpoint) -> QpInfo {
    QpInfo {
        qpn: e.qpn,
        lid: e.lid,
        gid: e.gid,
        psn: e.psn,
        mtu: e.mtu,
        rd_atom: e.rd_atom,
    }
}

/// The wire's queue-pair address as the verbs code takes it.
pub fn qp_endpoint(q: &QpInfo) -> QpEndpoint {
    QpEndpoint {
        qpn: q.qpn,
        psn: q.psn,
        lid: q.lid,
        gid: q.gid,
        mtu: q.mtu,
        rd_atom: q.rd_atom,
    }
}

fn wire_space(s: Space) -> WireSpace {
    match s {
        Space::Host => WireSpace::Host,
        Space::Device => WireSpace::Device,
    }
}

/// A memory node's regions as its [`Mlx5MemoryNode::regions`] names
/// them, as Region records of node `id`.
pub fn wire_regions(id: u32, regions: &[RegionInfo]) -> Vec<Region> {
    regions
        .iter()
        .map(|r| Region {
            node_id: id,
            space: wire_space(r.region.space),
            base: r.base,
            len: r.region.len,
            rkey: r.region.rkey.0,
        })
        .collect()
}

/// The regions exchange 1 published for one memory node, as a queue
/// pair's peer endpoint carries them: offset 0 of each space at the
/// published base, with every remote right (what memory nodes grant).
pub fn region_infos(r: &NodeRegions) -> Vec<RegionInfo> {
    std::iter::once(r.host)
        .chain(r.device)
        .map(|g| RegionInfo {
            region: RemoteRegion {
                space: match g.space {
                    WireSpace::Host => Space::Host,
                    WireSpace::Device => Space::Device,
                },
                offset: 0,
                len: g.len,
                rkey: RKey(g.rkey),
                access: Access::REMOTE_ALL,
            },
            base: g.base,
        })
        .collect()
}

/// Device, port, GID index and traffic class of the cluster file's mlx5
/// backend.
pub fn device_config(backend: &Backend) -> Result<DeviceConfig, NodeError> {
    let Backend::Mlx5 {
        device,
        port,
        gid_index,
        traffic_class,
    } = backend
    else {
        return Err(NodeError::Usage(
            "the mlx5 node code runs only with [backend] kind = \"mlx5\"".into(),
        ));
    };
    Ok(DeviceConfig {
        name: Some(device.clone()),
        port: *port,
        gid_index: *gid_index,
        traffic_class: *traffic_class,
    })
}

fn device_error(e: Mlx5Error) -> NodeError {
    NodeError::Failed(e.to_string())
}

/// This node's device, and its memory node when it has the memory
/// role: what exists before the rendezvous.
pub struct Mlx5Local {
    pub nic: Mlx5Nic,
    pub id: u32,
    pub memory: Option<Arc<Mlx5MemoryNode>>,
    /// The cluster, with the lanes each compute node connects.
    top: Topology,
    depth: u32,
}

impl Mlx5Local {
    /// Opens the device (one "no RDMA device" error where there is
    /// none) and, for the memory role, registers the host memory and
    /// the lock table. Compute queue pairs get `exec`'s depth.
    pub fn open(
        cfg: &ClusterConfig,
        node: &NodeConfig,
        exec: &ExecutorConfig,
    ) -> Result<Mlx5Local, NodeError> {
        let top = Topology::from_config(cfg).map_err(|e| NodeError::Usage(e.to_string()))?;
        exec.check().map_err(|e| NodeError::Usage(e.to_string()))?;
        let nic = Mlx5Nic::open(&device_config(&cfg.backend)?).map_err(device_error)?;
        let memory = if node.roles.memory {
            Some(Arc::new(memory_node(cfg, node, &nic)?))
        } else {
            None
        };
        Ok(Mlx5Local {
            nic,
            id: node.id,
            memory,
            top,
            depth: exec.qp_depth(),
        })
    }

    /// The Region records of exchange 1 (none without the memory role).
    pub fn regions(&self) -> Vec<Region> {
        self.memory
            .as_ref()
            .map_or_else(Vec::new, |m| wire_regions(self.id, &m.regions()))
    }

    /// Runs the connection protocol over `cp`; the compute role gets
    /// one connected [`Mlx5CoreQps`] per configured core.
    pub fn connect(self, cp: &mut dyn ControlPlane) -> Result<Mlx5Booted, NodeError> {
        let mut fabric = DeviceFabric {
            nic: self.nic.clone(),
            memory: self.memory.clone(),
            depth: self.depth,
            // This node's lanes as the topology counts them (none without
            // the compute role).
            lanes: self.top.cores_of(self.id).unwrap_or(0) as usize,
            cores: Vec::new(),
        };
        let own = self.regions();
        let regions = connect_cluster(cp, &mut fabric, &self.top, self.id, own.clone())
            .map_err(|e| NodeError::Failed(e.to_string()))?;
        if let Some(i) = fabric.cores.iter().position(|c| !c.is_connected()) {
            return Err(NodeError::Failed(format!(
                "core {i} of node {} has unconnected queue pairs after {QPS_READY}",
                self.id
            )));
        }
        Ok(Mlx5Booted {
            nic: self.nic,
            memory: self.memory,
            cores: fabric.cores,
            regions,
            listener: None,
            top: self.top,
            depth: self.depth,
            own_regions: own,
        })
    }
}

fn memory_node(
    cfg: &ClusterConfig,
    node: &NodeConfig,
    nic: &Mlx5Nic,
) -> Result<Mlx5MemoryNode, NodeError> {
    let id = NodeId::try_from(node.id)
        .map_err(|_| NodeError::Usage(PairError::IdTooLarge { node: node.id }.to_string()))?;
    let bytes = usize::try_from(node.memory_bytes)
        .map_err(|_| NodeError::Usage(format!("memory of {} bytes", node.memory_bytes)))?;
    let want_dm = cfg.lock_table_words.saturating_mul(8);
    let m = if cfg.huge_pages == HugePages::Off {
        let mem = HeapMem::zeroed(bytes)
            .ok_or_else(|| NodeError::Failed(format!("cannot allocate {bytes} bytes of memory")))?;
        Mlx5MemoryNode::with_memory(nic, id, mem, want_dm)
    } else {
        // Huge pages where reserved; mempool falls back and says so.
        let mem = mempool::HugeMem::alloc(bytes)
            .map_err(|e| NodeError::Failed(format!("allocating node memory: {e}")))?;
        Mlx5MemoryNode::with_memory(nic, id, mem, want_dm)
    }
    .map_err(device_error)?;
    if m.dm_bytes() < want_dm {
        log::warn!(
            "{} offers {} bytes of device memory: the lock table holds {} words, not the {} of lock_table_words",
            nic.name(),
            m.dm_bytes(),
            m.dm_bytes() / 8,
            cfg.lock_table_words
        );
    }
    Ok(m)
}

/// The verbs [`Fabric`]: compute queue pairs made per core in one
/// [`Mlx5CoreQps`] each, responders made by the memory node.
pub struct DeviceFabric {
    nic: Mlx5Nic,
    memory: Option<Arc<Mlx5MemoryNode>>,
    depth: u32,
    /// This node's compute cores (0 without the compute role).
    lanes: usize,
    cores: Vec<Mlx5CoreQps>,
}

impl Fabric for DeviceFabric {
    fn prepare_compute(&mut self, memory: &[u32]) -> Result<Vec<Vec<(u32, QpInfo)>>, String> {
        let peers: Vec<NodeId> = memory.iter().map(|&m| m as NodeId).collect();
        self.cores.clear();
        for lane in 0..self.lanes {
            let c = Mlx5CoreQps::prepare(&self.nic, &peers, self.depth)
                .map_err(|e| format!("core {lane}: making queue pairs: {e}"))?;
            self.cores.push(c);
        }
        Ok(self
            .cores
            .iter()
            .map(|c| {
                c.endpoints()
                    .iter()
                    .map(|(n, e)| (*n as u32, qp_info(e)))
                    .collect()
            })
            .collect())
    }

    fn accept(&mut self, link: Link, peer: &QpInfo) -> Result<QpInfo, String> {
        let m = self
            .memory
            .as_ref()
            .ok_or_else(|| format!("{link}: this node has no memory role"))?;
        m.accept(&qp_endpoint(peer))
            .map(|ep| qp_info(&ep.qp))
            .map_err(|e| format!("{link}: accepting: {e}"))
    }

    fn connect(&mut self, link: Link, peer: &QpInfo, regions: &NodeRegions) -> Result<(), String> {
        let lanes = self.cores.len();
        let core = self
            .cores
            .get_mut(link.lane as usize)
            .ok_or_else(|| format!("{link}: this node made {lanes} cores"))?;
        let ep = NicEndpoint {
            node: regions.node,
            qp: qp_endpoint(peer),
            regions: region_infos(regions),
        };
        core.connect(&ep)
            .map_err(|e| format!("{link}: connecting: {e}"))
    }

    fn retire(&mut self) -> usize {
        self.memory.as_ref().map_or(0, |m| m.retire_responders())
    }
}

/// A booted node: its device, its memory node, and per core the
/// connected queue pairs to every memory node.
pub struct Mlx5Booted {
    pub nic: Mlx5Nic,
    pub memory: Option<Arc<Mlx5MemoryNode>>,
    /// One per configured core, in `cores` order; each moves to its
    /// core's thread and becomes an executor there ([`core_executor`]).
    pub cores: Vec<Mlx5CoreQps>,
    /// Every memory node's regions, by ascending id.
    pub regions: Vec<NodeRegions>,
    /// The coordinator's listener, kept for later runs.
    listener: Option<std::net::TcpListener>,
    top: Topology,
    depth: u32,
    /// What this node published in exchange 1 (its memory's regions).
    own_regions: Vec<Region>,
}

impl Mlx5Booted {
    /// The memory node ids, as the executor's queue pairs name them.
    pub fn memory_ids(&self) -> Vec<NodeId> {
        self.regions.iter().map(|r| r.node).collect()
    }
}

/// On the core's own thread: an executor over `core`'s queue pairs,
/// with registered scratch of the size `cfg` needs.
pub fn core_executor(
    nic: &Mlx5Nic,
    core: Mlx5CoreQps,
    cfg: ExecutorConfig,
) -> Result<Executor<Mlx5Nic>, String> {
    let (cq, qps) = core
        .into_parts()
        .map_err(|missing| format!("queue pairs to memory nodes {missing:?} are not connected"))?;
    let scratch = HeapMem::zeroed(cfg.scratch_bytes())
        .ok_or_else(|| format!("cannot allocate {} bytes of scratch", cfg.scratch_bytes()))?;
    let mr = nic
        .register(scratch, Access::LOCAL_WRITE)
        .map_err(|e| format!("registering scratch: {e}"))?;
    Executor::new(nic.clone(), cq, qps, mr, cfg).map_err(|e| e.to_string())
}

/// Opens, joins and connects: the whole boot of an mlx5 node, through
/// "memory-ready"; the rendezvous stays open for "index-ready".
/// `lanes(id, cores)`: how many sets of queue pairs compute node `id`, of
/// `cores` configured cores, connects: one a core, and more for work beside
/// the cores' (a machine's lease cores, the bank's check), or fewer where
/// the work runs beside no core's; every node must count alike.
pub fn boot(
    cfg: &ClusterConfig,
    node: &NodeConfig,
    exec: &ExecutorConfig,
    workload: Option<String>,
    lanes: &dyn Fn(u32, u32) -> u32,
) -> Result<(Mlx5Booted, Rendezvous, BootTimes), NodeError> {
    let mut local = Mlx5Local::open(cfg, node, exec)?;
    local.top = local.top.with_lanes(lanes).map_err(NodeError::Usage)?;
    let me = format!("loch node {}", node.id);
    let p = local.nic.port();
    say(format_args!(
        "{me}: mlx5: {} port {} ({}, MTU code {}, GID index {}), {} bytes of device memory per node at most",
        local.nic.name(),
        p.port,
        if p.roce { "RoCE" } else { "InfiniBand" },
        p.mtu,
        p.gid_index,
        local.nic.attrs().max_dm_size
    ));
    if let Some(m) = &local.memory {
        say(format_args!(
            "{me}: memory role: {} MiB registered, lock table {} bytes in {}",
            m.host_bytes() >> 20,
            m.dm_bytes(),
            if m.dm_on_device() {
                "device memory"
            } else {
                "host memory (no device memory)"
            }
        ));
    }
    let (mut rv, join_ns, listener) = node::join_keeping(cfg, node.id)?;
    let t = Instant::now();
    let mut booted = local.connect(&mut rv)?;
    booted.listener = listener;
    node::memory_ready(&mut rv, workload)?;
    let exchange_ns = t.elapsed().as_nanos() as u64;
    // A lane a core, unless the work runs lanes of its own.
    let lanes = match (booted.cores.len(), node.cores.len()) {
        (l, c) if l == c => format!("{l} cores"),
        (l, c) => format!("{l} lanes ({c} cores configured)"),
    };
    say(format_args!(
        "{me}: control channel: joined in {:.1} ms; queue pairs: {lanes} × {} memory nodes connected in {:.1} ms",
        join_ns as f64 / 1e6,
        booted.regions.len(),
        exchange_ns as f64 / 1e6
    ));
    Ok((
        booted,
        rv,
        BootTimes {
            join_ns,
            exchange_ns,
        },
    ))
}

/// How long [`boot`] spent joining, and connecting through
/// "memory-ready".
#[derive(Copy, Clone, Debug)]
pub struct BootTimes {
    pub join_ns: u64,
    pub exchange_ns: u64,
}

/// `loch node` on the mlx5 backend (module docs): a memory node serves
/// until SIGINT/SIGTERM; a compute node runs the `--workload` with
/// [`crate::node_compute`], each core's executor made from its
/// connected queue pairs. The caller (node.rs) has checked the flags,
/// the workload's memory needs and preflight, computed the `layout`,
/// and installed the signal handlers.
pub fn run(
    o: &NodeOptions,
    cfg: &ClusterConfig,
    node: &NodeConfig,
    layout: Layout,
) -> Result<u8, NodeError> {
    let exec = node_compute::exec_config(o);
    let (booted, rv, times) = boot(
        cfg,
        node,
        &exec,
        node::workload_agreement(o, node),
        &|_, cores| cores,
    )?;
    let me = format!("loch node {}", node.id);
    let code = if node.roles.compute {
        let c = Compute {
            o,
            cfg,
            node,
            layout,
            mem_ids: booted.memory_ids(),
            dm_bytes: lock_table_bytes(&booted.regions),
            backend: "mlx5",
            join_ns: times.join_ns,
            exchange_ns: times.exchange_ns,
            me: &me,
        };
        let cores = Mlx5Cores {
            nic: booted.nic.clone(),
            cores: Mutex::new(booted.cores.into_iter().map(Some).collect()),
        };
        node_compute::run(&c, &cores, rv)?
    } else {
        serve_later_runs(cfg, node.id, booted, rv, &me)?;
        0
    };
    say(format_args!("{me}: stopping"));
    Ok(code)
}

/// A memory-only node after the first run: where the coordinator is a
/// memory-only node too, every memory node goes on serving compute runs
/// until SIGINT/SIGTERM, each later run a rendezvous of the whole cluster
/// in which this node retires the earlier runs' responders and pairs new
/// ones with the run's cores ([`serve_memory_run`]); its memory stays
/// registered throughout. Otherwise it serves the one run.
fn serve_later_runs(
    cfg: &ClusterConfig,
    id: u32,
    mut booted: Mlx5Booted,
    rv: Rendezvous,
    me: &str,
) -> Result<(), NodeError> {
    let Some(seat) = node::memory_seat(cfg, booted.listener.take())? else {
        return node::serve_memory(rv, cfg, me);
    };
    node::memory_run_done(rv, cfg, me)?;
    let opts = node::channel_options(cfg, id)?;
    say(format_args!(
        "{me}: serving compute runs until SIGINT/SIGTERM"
    ));
    let mut fabric = DeviceFabric {
        nic: booted.nic.clone(),
        memory: booted.memory.clone(),
        depth: booted.depth,
        lanes: 0,
        cores: Vec::new(),
    };
    let (top, regions) = (&booted.top, &booted.own_regions);
    let until_done = node::compute_done_of(cfg);
    let served = node::serve_runs(
        &opts,
        &seat,
        me,
        &signals::stop_requested,
        until_done.as_deref(),
        &mut |rv| serve_memory_run(rv, &mut fabric, top, id, regions),
    );
    log::debug!("{me}: served {served} compute runs after the first");
    Ok(())
}

/// The compute cores' connected queue pairs, each taken once by its
/// core's thread.
struct Mlx5Cores {
    nic: Mlx5Nic,
    cores: Mutex<Vec<Option<Mlx5CoreQps>>>,
}

impl Mlx5Cores {
    /// An executor over the first core's queue pairs no thread took yet.
    fn next_executor(&self, cfg: ExecutorConfig) -> Result<Executor<Mlx5Nic>, String> {
        let core = self
            .cores
            .lock()
            .map_err(|_| "a core thread panicked while taking its queue pairs".to_string())?
            .iter_mut()
            .find_map(Option::take)
            .ok_or("every core's queue pairs are taken")?;
        core_executor(&self.nic, core, cfg)
    }
}

impl CoreSource<Mlx5Nic> for Mlx5Cores {
    fn now_ns(&self) -> u64 {
        self.nic.now_ns()
    }

    fn executor(&self, i: usize, cfg: ExecutorConfig) -> Result<Executor<Mlx5Nic>, String> {
        let core = self
            .cores
            .lock()
            .map_err(|_| "a core thread panicked while taking its queue pairs".to_string())?
            .get_mut(i)
            .and_then(Option::take)
            .ok_or_else(|| format!("core {i} has no queue pairs"))?;
        core_executor(&self.nic, core, cfg)
    }

    fn liveness(&self) -> Box<dyn Fn(usize) -> bool> {
        // A dead memory node shows as RetryExceeded on its queue pair;
        // nothing else says so sooner.
        Box::new(|_| true)
    }
}

/// A machine on mlx5 (a node with both roles, in a cluster of them): its
/// registered memory, and its lanes of queue pairs connected to every
/// machine (its own in loopback), each lane taken once by an executor
/// that sees the machine's registered memory as local memory.
pub struct Mlx5Machine {
    id: u32,
    lanes: Mlx5Cores,
    /// Kept registered while the machine runs (the lanes' device holds
    /// it too).
    _memory: Arc<Mlx5MemoryNode>,
}

impl Mlx5Machine {
    /// Boots machine `node`: the device, its memory registered, the
    /// control channel through "memory-ready" with `agreement`, and
    /// `lanes(id, cores)` lanes (every node counts alike, [`boot`]), each
    /// queue pair deep enough for an executor of `exec`'s slots.
    pub fn boot(
        cfg: &ClusterConfig,
        node: &NodeConfig,
        exec: &ExecutorConfig,
        agreement: Option<String>,
        lanes: &dyn Fn(u32, u32) -> u32,
    ) -> Result<(Mlx5Machine, Rendezvous), NodeError> {
        let (booted, rv, _times) = boot(cfg, node, exec, agreement, lanes)?;
        let memory = booted.memory.clone().ok_or_else(|| {
            NodeError::Usage(format!("node {}: a machine needs the memory role", node.id))
        })?;
        // The cores see their machine's registered memory as local memory.
        let nic = booted.nic.on_machine(&memory);
        let lanes = Mlx5Cores {
            nic,
            cores: Mutex::new(booted.cores.into_iter().map(Some).collect()),
        };
        Ok((
            Mlx5Machine {
                id: node.id,
                lanes,
                _memory: memory,
            },
            rv,
        ))
    }

    /// An executor of `cfg` on the next lane no executor took yet.
    pub fn executor(&self, cfg: ExecutorConfig) -> Result<Executor<Mlx5Nic>, String> {
        self.lanes.next_executor(cfg)
    }

    /// The txn harness's executors: this machine's only.
    pub fn executors(&self) -> impl txn::harness::ExecutorFactory<Mlx5Nic> + '_ {
        move |machine: u16, cfg: ExecutorConfig| {
            if u32::from(machine) != self.id {
                return Err(format!(
                    "machine {machine} runs elsewhere: this is machine {}",
                    self.id
                ));
            }
            self.executor(cfg)
        }
    }
}

/// `loch node` on an mlx5 machine ([`MachineWork`]): boots it with the
/// lanes and queue-pair depth the work needs, then runs the work's
/// backend-independent half. The caller has checked the geometry and
/// preflight and installed the signal handlers.
pub fn run_machine(
    o: &NodeOptions,
    cfg: &ClusterConfig,
    node: &NodeConfig,
    geo: txn::Geometry,
    work: MachineWork,
) -> Result<u8, NodeError> {
    use crate::{node_leases, node_txn};
    let exec = work.deepest(geo);
    let (agreement, lanes): (_, &dyn Fn(u32, u32) -> u32) = match work {
        // Node 0's core that reads the bank after the run.
        MachineWork::Bank => (node_txn::agreement(o), &|id, cores| {
            cores.saturating_add(u32::from(id == 0))
        }),
        // The lease, recovery and replica-check cores.
        MachineWork::Recovering(f) => (f.agreement(o), &|_, cores| cores.saturating_add(3)),
        // The lease and reconfiguration cores alone.
        MachineWork::Leases(f) => (f.agreement(o), &|_, _| 2),
    };
    let (machine, rv) = Mlx5Machine::boot(cfg, node, &exec, agreement, lanes)?;
    let me = format!("loch node {}", node.id);
    let check = || machine.executor(txn::harness::core_config());
    let code = match work {
        MachineWork::Bank => node_txn::run_bank(o, geo, &me, rv, machine.executors(), check),
        MachineWork::Recovering(f) => {
            node_txn::run_bank_recovering(o, geo, &me, f, rv, machine.executors(), check)
        }
        MachineWork::Leases(f) => node_leases::run_leases(o, geo, &me, f, rv, machine.executors()),
    }?;
    say(format_args!("{me}: stopping"));
    Ok(code)
}
