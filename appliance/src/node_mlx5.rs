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
//! 1. Exchange 1: memory nodes publish one [`Region`] per space (host, and
//!    device for the lock table: base address, length, rkey). Compute nodes
//!    make, per core, one completion queue and one queue pair in INIT per
//!    memory node, and publish one [`WireEndpoint`] per queue pair:
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
//!    meets at "index-ready" and closes the channel; compute nodes run, and
//!    memory nodes serve until SIGINT/SIGTERM. The index's global locks use
//!    the smallest lock table a memory node published
//!    ([`lock_table_bytes`]), as a NIC may offer less device memory than
//!    `lock_table_words` asks for.
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

use crate::node::{channel_problem, NodeError};
use bootstrap::config::{Backend, ClusterConfig};
use bootstrap::wire::{Endpoint as WireEndpoint, QpInfo, Region, Space as WireSpace};
use bootstrap::{Directory, Rendezvous};
use std::collections::BTreeMap;
use std::fmt;

/// Printed when `loch` was built without the mlx5 backend.
pub const NO_FEATURE: &str =
    "this loch was built without the mlx5 feature: cargo build --release --features mlx5";

/// Name of the barrier every node meets at once all queue pairs are RTS.
pub const QPS_READY: &str = "qps-ready";

/// Largest node id (and core count) the mlx5 backend addresses: node ids
/// are 16 bits in a global address and in a packed `peer_id`.
pub const ID_MAX: u32 = 0xFFFF;

/// Records one node may publish in one exchange (bootstrap's bound).
pub const RECORDS_MAX: usize = bootstrap::channel::RECORDS_PER_NODE_MAX;

/// `peer_id` of a link record: the peer's node id in the low 16 bits, the
/// core index ("lane") of the compute side in the high 16 bits.
pub fn pack_peer(peer: u32, lane: u32) -> Result<u32, PairError> {
    if peer > ID_MAX {
        return Err(PairError::IdTooLarge { node: peer });
    }
    if lane > ID_MAX {
        return Err(PairError::TooManyCores {
            node: peer,
            cores: lane as usize + 1,
        });
    }
    Ok(peer | (lane << 16))
}

/// The (peer, lane) a `peer_id` names; total: every `u32` unpacks.
pub fn unpack_peer(peer_id: u32) -> (u32, u32) {
    (peer_id & ID_MAX, peer_id >> 16)
}

/// Which exchange a record came from.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Round {
    /// Exchange 1: compute queue pairs asking memory nodes.
    Requests,
    /// Exchange 2: memory nodes' responders answering.
    Replies,
}

impl fmt::Display for Round {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Round::Requests => "exchange 1 (compute endpoints)",
            Round::Replies => "exchange 2 (memory endpoints)",
        })
    }
}

/// Compute node `compute`'s core `lane` to memory node `memory`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Link {
    pub compute: u32,
    pub lane: u32,
    pub memory: u32,
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "compute node {} core {} ↔ memory node {}",
            self.compute, self.lane, self.memory
        )
    }
}

/// Why the records of an exchange do not describe the cluster's links.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PairError {
    /// A node id above [`ID_MAX`].
    IdTooLarge {
        node: u32,
    },
    /// A compute node with more cores than a lane holds.
    TooManyCores {
        node: u32,
        cores: usize,
    },
    /// A node would publish more records than bootstrap accepts.
    TooManyRecords {
        node: u32,
        records: usize,
    },
    /// A record published by, or naming, a node not in the cluster file.
    UnknownNode {
        round: Round,
        node: u32,
    },
    /// A link whose compute side is not a compute node.
    NotCompute {
        round: Round,
        node: u32,
    },
    /// A link whose memory side is not a memory node.
    NotMemory {
        round: Round,
        node: u32,
    },
    /// A core index at or above the compute node's core count.
    LaneOutOfRange {
        round: Round,
        node: u32,
        lane: u32,
        cores: u32,
    },
    Duplicate {
        round: Round,
        link: Link,
    },
    Missing {
        round: Round,
        link: Link,
    },
    /// A region published by a node that is not a memory node.
    RegionNotMemory {
        node: u32,
    },
    DuplicateRegion {
        node: u32,
        space: WireSpace,
    },
    MissingRegion {
        node: u32,
    },
    EmptyRegion {
        node: u32,
        space: WireSpace,
    },
}

impl fmt::Display for PairError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use PairError::*;
        match self {
            IdTooLarge { node } => write!(
                f,
                "node id {node} is above {ID_MAX}: the mlx5 backend addresses nodes with 16 bits"
            ),
            TooManyCores { node, cores } => write!(
                f,
                "node {node} has {cores} cores; the mlx5 backend connects at most {} per node",
                ID_MAX + 1
            ),
            TooManyRecords { node, records } => write!(
                f,
                "node {node} would publish {records} records, above the control channel's {RECORDS_MAX}: use fewer cores or memory nodes"
            ),
            UnknownNode { round, node } => {
                write!(f, "{round}: a record names node {node}, which is not in the cluster file")
            }
            NotCompute { round, node } => {
                write!(f, "{round}: a link names node {node} as its compute side, but it has no compute role")
            }
            NotMemory { round, node } => {
                write!(f, "{round}: a link names node {node} as its memory side, but it has no memory role")
            }
            LaneOutOfRange {
                round,
                node,
                lane,
                cores,
            } => write!(
                f,
                "{round}: a link names core {lane} of compute node {node}, which has {cores} cores"
            ),
            Duplicate { round, link } => write!(f, "{round}: two records for {link}"),
            Missing { round, link } => write!(f, "{round}: no record for {link}"),
            RegionNotMemory { node } => {
                write!(f, "node {node} published a region but has no memory role")
            }
            DuplicateRegion { node, space } => {
                write!(f, "memory node {node} published two {space:?} regions")
            }
            MissingRegion { node } => write!(f, "memory node {node} published no host region"),
            EmptyRegion { node, space } => {
                write!(f, "memory node {node} published an empty {space:?} region")
            }
        }
    }
}

impl std::error::Error for PairError {}

/// Who is in the cluster, as the protocol needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    /// Memory node ids, ascending.
    pub memory: Vec<u32>,
    /// Compute node ids, ascending, with their core counts (lanes).
    pub compute: Vec<(u32, u32)>,
}

impl Topology {
    /// The topology of a cluster file, checked against the limits of the
    /// wire records: 16-bit ids and lanes, and bootstrap's records per node.
    pub fn from_config(cfg: &ClusterConfig) -> Result<Topology, PairError> {
        let mut memory = Vec::new();
        let mut compute = Vec::new();
        for n in &cfg.nodes {
            if n.id > ID_MAX {
                return Err(PairError::IdTooLarge { node: n.id });
            }
            if n.roles.memory {
                memory.push(n.id);
            }
            if n.roles.compute {
                if n.cores.len() > (ID_MAX + 1) as usize {
                    return Err(PairError::TooManyCores {
                        node: n.id,
                        cores: n.cores.len(),
                    });
                }
                compute.push((n.id, n.cores.len() as u32));
            }
        }
        Topology::new(memory, compute)
    }

    /// Checks and sorts a topology given by hand.
    pub fn new(mut memory: Vec<u32>, mut compute: Vec<(u32, u32)>) -> Result<Topology, PairError> {
        memory.sort_unstable();
        compute.sort_unstable();
        for &m in &memory {
            if m > ID_MAX {
                return Err(PairError::IdTooLarge { node: m });
            }
        }
        let lanes_total: usize = compute.iter().map(|&(_, c)| c as usize).sum();
        for &(c, cores) in &compute {
            if c > ID_MAX {
                return Err(PairError::IdTooLarge { node: c });
            }
            if cores > ID_MAX + 1 {
                return Err(PairError::TooManyCores {
                    node: c,
                    cores: cores as usize,
                });
            }
            let records = cores as usize * memory.len();
            if records > RECORDS_MAX {
                return Err(PairError::TooManyRecords { node: c, records });
            }
        }
        for &m in &memory {
            // Exchange 1: two regions; exchange 2: one endpoint per lane.
            if lanes_total > RECORDS_MAX {
                return Err(PairError::TooManyRecords {
                    node: m,
                    records: lanes_total,
                });
            }
        }
        Ok(Topology { memory, compute })
    }

    pub fn is_memory(&self, id: u32) -> bool {
        self.memory.binary_search(&id).is_ok()
    }

    /// The core count of compute node `id`; `None` if it is not one.
    pub fn cores_of(&self, id: u32) -> Option<u32> {
        self.compute
            .binary_search_by_key(&id, |&(c, _)| c)
            .ok()
            .map(|i| self.compute[i].1)
    }

    pub fn knows(&self, id: u32) -> bool {
        self.is_memory(id) || self.cores_of(id).is_some()
    }

    /// Every link, in (compute, lane, memory) order.
    pub fn links(&self) -> impl Iterator<Item = Link> + '_ {
        self.compute.iter().flat_map(move |&(compute, cores)| {
            (0..cores).flat_map(move |lane| {
                self.memory.iter().map(move |&memory| Link {
                    compute,
                    lane,
                    memory,
                })
            })
        })
    }
}

/// Checks that `records` of `round` name every link of the topology
/// exactly once and nothing else; returns each link's queue pair.
pub fn links_of(
    top: &Topology,
    records: &[WireEndpoint],
    round: Round,
) -> Result<BTreeMap<Link, QpInfo>, PairError> {
    let mut out = BTreeMap::new();
    for r in records {
        if !top.knows(r.node_id) {
            return Err(PairError::UnknownNode {
                round,
                node: r.node_id,
            });
        }
        let (peer, lane) = unpack_peer(r.peer_id);
        if !top.knows(peer) {
            return Err(PairError::UnknownNode { round, node: peer });
        }
        let (compute, memory) = match round {
            Round::Requests => (r.node_id, peer),
            Round::Replies => (peer, r.node_id),
        };
        let Some(cores) = top.cores_of(compute) else {
            return Err(PairError::NotCompute {
                round,
                node: compute,
            });
        };
        if !top.is_memory(memory) {
            return Err(PairError::NotMemory {
                round,
                node: memory,
            });
        }
        if lane >= cores {
            return Err(PairError::LaneOutOfRange {
                round,
                node: compute,
                lane,
                cores,
            });
        }
        let link = Link {
            compute,
            lane,
            memory,
        };
        if out.insert(link, r.qp).is_some() {
            return Err(PairError::Duplicate { round, link });
        }
    }
    if let Some(link) = top.links().find(|l| !out.contains_key(l)) {
        return Err(PairError::Missing { round, link });
    }
    Ok(out)
}

/// Exchange 1 as memory node `memory` reads it: the whole set checked, then
/// the compute queue pairs addressed to it, in (compute, lane) order.
pub fn requests_for(
    top: &Topology,
    round1: &[WireEndpoint],
    memory: u32,
) -> Result<Vec<(Link, QpInfo)>, PairError> {
    Ok(links_of(top, round1, Round::Requests)?
        .into_iter()
        .filter(|(l, _)| l.memory == memory)
        .collect())
}

/// Exchange 2 as compute node `compute` reads it: the whole set checked,
/// then per core (index = lane), the responder of each memory node in
/// ascending memory id.
pub fn replies_for(
    top: &Topology,
    round2: &[WireEndpoint],
    compute: u32,
) -> Result<Vec<Vec<(Link, QpInfo)>>, PairError> {
    let cores = top.cores_of(compute).ok_or(PairError::NotCompute {
        round: Round::Replies,
        node: compute,
    })?;
    let mut lanes: Vec<Vec<(Link, QpInfo)>> = (0..cores).map(|_| Vec::new()).collect();
    for (l, qp) in links_of(top, round2, Round::Replies)? {
        if l.compute == compute {
            lanes[l.lane as usize].push((l, qp));
        }
    }
    Ok(lanes)
}

/// The records of exchange 1 for compute node `me`: per lane, the queue
/// pair to each memory node.
pub fn request_records(
    me: u32,
    lanes: &[Vec<(u32, QpInfo)>],
) -> Result<Vec<WireEndpoint>, PairError> {
    let mut out = Vec::new();
    for (lane, qps) in lanes.iter().enumerate() {
        for &(memory, qp) in qps {
            out.push(WireEndpoint {
                node_id: me,
                peer_id: pack_peer(memory, lane as u32)?,
                qp,
            });
        }
    }
    Ok(out)
}

/// The records of exchange 2 for memory node `me`: each responder, named by
/// the link it answers.
pub fn reply_records(me: u32, accepted: &[(Link, QpInfo)]) -> Result<Vec<WireEndpoint>, PairError> {
    accepted
        .iter()
        .map(|(l, qp)| {
            Ok(WireEndpoint {
                node_id: me,
                peer_id: pack_peer(l.compute, l.lane)?,
                qp: *qp,
            })
        })
        .collect()
}

/// What one memory node exposes, as exchange 1 published it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct NodeRegions {
    pub node: nicdrv::NodeId,
    pub host: Region,
    /// The lock table (device memory, or its host fallback).
    pub device: Option<Region>,
}

/// Maps the regions of exchange 1 to memory nodes, in ascending id: each
/// memory node has exactly one non-empty host region and at most one
/// device region; a region of any other node is an error.
pub fn regions_by_node(top: &Topology, regions: &[Region]) -> Result<Vec<NodeRegions>, PairError> {
    let mut host: BTreeMap<u32, Region> = BTreeMap::new();
    let mut device: BTreeMap<u32, Region> = BTreeMap::new();
    for r in regions {
        if !top.is_memory(r.node_id) {
            return Err(PairError::RegionNotMemory { node: r.node_id });
        }
        if r.len == 0 {
            return Err(PairError::EmptyRegion {
                node: r.node_id,
                space: r.space,
            });
        }
        let map = match r.space {
            WireSpace::Host => &mut host,
            WireSpace::Device => &mut device,
        };
        if map.insert(r.node_id, *r).is_some() {
            return Err(PairError::DuplicateRegion {
                node: r.node_id,
                space: r.space,
            });
        }
    }
    top.memory
        .iter()
        .map(|&m| {
            Ok(NodeRegions {
                // from_config/new bounded every id by ID_MAX = u16::MAX.
                node: m as nicdrv::NodeId,
                host: *host.get(&m).ok_or(PairError::MissingRegion { node: m })?,
                device: device.get(&m).copied(),
            })
        })
        .collect()
}

/// Bytes of lock table the index may use on every memory node: the
/// smallest device region published (a NIC may offer less device memory
/// than `lock_table_words` asks for), 0 when some node published none.
pub fn lock_table_bytes(regions: &[NodeRegions]) -> u64 {
    regions
        .iter()
        .map(|r| r.device.map_or(0, |d| d.len))
        .min()
        .unwrap_or(0)
}

/// The rendezvous as the protocol uses it (a trait, so the protocol is
/// tested without sockets).
pub trait ControlPlane {
    /// Publishes `mine`; returns every node's records.
    fn exchange(&mut self, mine: &Directory) -> Result<Directory, String>;
    fn barrier(&mut self, name: &str) -> Result<(), String>;
}

impl ControlPlane for Rendezvous {
    fn exchange(&mut self, mine: &Directory) -> Result<Directory, String> {
        Rendezvous::exchange(self, mine).map_err(channel_problem)
    }
    fn barrier(&mut self, name: &str) -> Result<(), String> {
        Rendezvous::barrier(self, name).map_err(channel_problem)
    }
}

/// The queue-pair side of the protocol (a trait, so the protocol is tested
/// without a NIC; `DeviceFabric` (feature `mlx5`) is the verbs one).
pub trait Fabric {
    /// Compute role: per core, a queue pair in INIT to each of `memory`;
    /// returns per core (memory node, address).
    fn prepare_compute(&mut self, memory: &[u32]) -> Result<Vec<Vec<(u32, QpInfo)>>, String>;
    /// Memory role: a responder for `link`, RTS towards `peer`; returns
    /// its address.
    fn accept(&mut self, link: Link, peer: &QpInfo) -> Result<QpInfo, String>;
    /// Compute role: the queue pair of `link`, RTR/RTS towards `peer`.
    fn connect(&mut self, link: Link, peer: &QpInfo, regions: &NodeRegions) -> Result<(), String>;
}

/// Why connecting failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BootError {
    Pair(PairError),
    Control { step: &'static str, error: String },
    Fabric(String),
}

impl fmt::Display for BootError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BootError::Pair(e) => write!(f, "connecting queue pairs: {e}"),
            BootError::Control { step, error } => write!(f, "control channel, {step}: {error}"),
            BootError::Fabric(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for BootError {}

impl From<PairError> for BootError {
    fn from(e: PairError) -> Self {
        BootError::Pair(e)
    }
}

/// Runs the two-exchange protocol (module docs) as node `me`, publishing
/// `my_regions` (memory role) in exchange 1; returns every memory node's
/// regions once all queue pairs are RTS cluster-wide.
pub fn connect_cluster(
    cp: &mut dyn ControlPlane,
    fabric: &mut dyn Fabric,
    top: &Topology,
    me: u32,
    my_regions: Vec<Region>,
) -> Result<Vec<NodeRegions>, BootError> {
    let compute_lanes = top.cores_of(me);
    let mut mine = Directory {
        endpoints: Vec::new(),
        regions: my_regions,
    };
    if compute_lanes.is_some() {
        let lanes = fabric
            .prepare_compute(&top.memory)
            .map_err(BootError::Fabric)?;
        mine.endpoints = request_records(me, &lanes)?;
    }
    let round1 = cp.exchange(&mine).map_err(|error| BootError::Control {
        step: "exchange 1 (regions, compute endpoints)",
        error,
    })?;
    let regions = regions_by_node(top, &round1.regions)?;
    let mut replies = Vec::new();
    if top.is_memory(me) {
        for (link, qp) in requests_for(top, &round1.endpoints, me)? {
            let ours = fabric.accept(link, &qp).map_err(BootError::Fabric)?;
            replies.push((link, ours));
        }
    } else {
        // Every node checks the set, so a bad record fails everyone alike.
        links_of(top, &round1.endpoints, Round::Requests)?;
    }
    let mine = Directory {
        endpoints: reply_records(me, &replies)?,
        regions: Vec::new(),
    };
    let round2 = cp.exchange(&mine).map_err(|error| BootError::Control {
        step: "exchange 2 (memory endpoints)",
        error,
    })?;
    if compute_lanes.is_some() {
        for lane in replies_for(top, &round2.endpoints, me)? {
            for (link, qp) in lane {
                let r = regions
                    .iter()
                    .find(|r| r.node as u32 == link.memory)
                    .ok_or(PairError::MissingRegion { node: link.memory })?;
                fabric.connect(link, &qp, r).map_err(BootError::Fabric)?;
            }
        }
    } else {
        links_of(top, &round2.endpoints, Round::Replies)?;
    }
    cp.barrier(QPS_READY).map_err(|error| BootError::Control {
        step: "barrier qps-ready",
        error,
    })?;
    Ok(regions)
}

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

/// Whether this build can run the backend `cfg` names: an error (exit 2)
/// for `kind = "mlx5"` in a build without the `mlx5` feature.
pub fn supported(cfg: &ClusterConfig) -> Result<(), NodeError> {
    match cfg.backend {
        Backend::Mlx5 { .. } if !cfg!(feature = "mlx5") => Err(NodeError::Usage(NO_FEATURE.into())),
        _ => Ok(()),
    }
}

#[cfg(feature = "mlx5")]
pub use device::*;

/// The verbs side: device, memory node, per-core queue pairs, and the
/// `loch node` run over them.
#[cfg(feature = "mlx5")]
mod device {
    use super::*;
    use crate::node::{self, say, NodeOptions};
    use crate::node_compute::{self, Compute, CoreSource};
    use crate::node_work::Layout;
    use bootstrap::config::{HugePages, NodeConfig};
    use nicdrv::mlx5::{
        DeviceConfig, Endpoint as NicEndpoint, Mlx5CoreQps, Mlx5Error, Mlx5MemoryNode, Mlx5Nic,
        QpEndpoint, RegionInfo,
    };
    use nicdrv::{
        Access, Executor, ExecutorConfig, HeapMem, Nic, NodeId, RKey, RemoteRegion, Space,
    };
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

    /// Device, port and GID index of the cluster file's mlx5 backend.
    pub fn device_config(backend: &Backend) -> Result<DeviceConfig, NodeError> {
        let Backend::Mlx5 {
            device,
            port,
            gid_index,
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
        top: Topology,
        depth: u32,
        lanes: usize,
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
                lanes: if node.roles.compute {
                    node.cores.len()
                } else {
                    0
                },
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
                lanes: self.lanes,
                cores: Vec::new(),
            };
            let regions = connect_cluster(cp, &mut fabric, &self.top, self.id, self.regions())
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
            let mem = HeapMem::zeroed(bytes).ok_or_else(|| {
                NodeError::Failed(format!("cannot allocate {bytes} bytes of memory"))
            })?;
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

        fn connect(
            &mut self,
            link: Link,
            peer: &QpInfo,
            regions: &NodeRegions,
        ) -> Result<(), String> {
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
        let (cq, qps) = core.into_parts().map_err(|missing| {
            format!("queue pairs to memory nodes {missing:?} are not connected")
        })?;
        let scratch = HeapMem::zeroed(cfg.scratch_bytes())
            .ok_or_else(|| format!("cannot allocate {} bytes of scratch", cfg.scratch_bytes()))?;
        let mr = nic
            .register(scratch, Access::LOCAL_WRITE)
            .map_err(|e| format!("registering scratch: {e}"))?;
        Executor::new(nic.clone(), cq, qps, mr, cfg).map_err(|e| e.to_string())
    }

    /// Opens, joins and connects: the whole boot of an mlx5 node, through
    /// "memory-ready"; the rendezvous stays open for "index-ready".
    pub fn boot(
        cfg: &ClusterConfig,
        node: &NodeConfig,
        exec: &ExecutorConfig,
    ) -> Result<(Mlx5Booted, Rendezvous, BootTimes), NodeError> {
        let local = Mlx5Local::open(cfg, node, exec)?;
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
        let (mut rv, join_ns) = node::join(cfg, node.id)?;
        let t = Instant::now();
        let booted = local.connect(&mut rv)?;
        node::memory_ready(&mut rv)?;
        let exchange_ns = t.elapsed().as_nanos() as u64;
        say(format_args!(
            "{me}: control channel: joined in {:.1} ms; queue pairs: {} cores × {} memory nodes connected in {:.1} ms",
            join_ns as f64 / 1e6,
            booted.cores.len(),
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
        let (booted, rv, times) = boot(cfg, node, &exec)?;
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
            node::serve_memory(rv)?;
            0
        };
        say(format_args!("{me}: stopping"));
        drop(booted.memory);
        Ok(code)
    }

    /// The compute cores' connected queue pairs, each taken once by its
    /// core's thread.
    struct Mlx5Cores {
        nic: Mlx5Nic,
        cores: Mutex<Vec<Option<Mlx5CoreQps>>>,
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use bootstrap::config::{HugePages, NodeConfig, Roles};
    use std::sync::{Arc, Barrier, Mutex};
    use std::time::{Duration, Instant};

    fn qp(qpn: u32) -> QpInfo {
        QpInfo {
            qpn,
            lid: 1,
            gid: [0; 16],
            psn: qpn & 0xff_ffff,
            mtu: 5,
        }
    }

    /// Memory nodes 0 and 1; compute node 2 with 2 cores.
    fn small() -> Topology {
        Topology::new(vec![1, 0], vec![(2, 2)]).unwrap()
    }

    fn request(compute: u32, lane: u32, memory: u32, qpn: u32) -> WireEndpoint {
        WireEndpoint {
            node_id: compute,
            peer_id: pack_peer(memory, lane).unwrap(),
            qp: qp(qpn),
        }
    }

    fn reply(memory: u32, compute: u32, lane: u32, qpn: u32) -> WireEndpoint {
        WireEndpoint {
            node_id: memory,
            peer_id: pack_peer(compute, lane).unwrap(),
            qp: qp(qpn),
        }
    }

    fn all_requests() -> Vec<WireEndpoint> {
        let mut v = Vec::new();
        for lane in 0..2 {
            for m in 0..2 {
                v.push(request(2, lane, m, 100 + lane * 10 + m));
            }
        }
        v
    }

    fn all_replies() -> Vec<WireEndpoint> {
        let mut v = Vec::new();
        for lane in 0..2 {
            for m in 0..2 {
                v.push(reply(m, 2, lane, 500 + lane * 10 + m));
            }
        }
        v
    }

    #[test]
    fn peer_ids_pack_node_and_lane() {
        assert_eq!(pack_peer(3, 0), Ok(3));
        assert_eq!(pack_peer(3, 2), Ok(3 | 2 << 16));
        assert_eq!(pack_peer(ID_MAX, ID_MAX), Ok(u32::MAX));
        for (p, l) in [(0, 0), (7, 9), (ID_MAX, 1), (1, ID_MAX)] {
            assert_eq!(unpack_peer(pack_peer(p, l).unwrap()), (p, l));
        }
        assert_eq!(
            pack_peer(ID_MAX + 1, 0),
            Err(PairError::IdTooLarge { node: ID_MAX + 1 })
        );
        assert!(pack_peer(1, ID_MAX + 1).is_err());
    }

    #[test]
    fn topology_sorts_and_bounds_ids_and_records() {
        let t = small();
        assert_eq!(t.memory, vec![0, 1]);
        assert!(t.is_memory(1) && !t.is_memory(2));
        assert_eq!((t.cores_of(2), t.cores_of(0)), (Some(2), None));
        assert_eq!(t.links().count(), 4);
        assert_eq!(
            Topology::new(vec![70_000], vec![]),
            Err(PairError::IdTooLarge { node: 70_000 })
        );
        assert_eq!(
            Topology::new(vec![0], vec![(70_000, 1)]),
            Err(PairError::IdTooLarge { node: 70_000 })
        );
        // 64 cores × 65 memory nodes = 4160 endpoints from one node.
        let err = Topology::new((0..65).collect(), vec![(100, 64)]).unwrap_err();
        assert_eq!(
            err,
            PairError::TooManyRecords {
                node: 100,
                records: 4160
            }
        );
        assert!(err.to_string().contains("4096"), "{err}");
    }

    #[test]
    fn requests_pair_each_core_with_each_memory_node() {
        let t = small();
        let r0 = requests_for(&t, &all_requests(), 0).unwrap();
        let got: Vec<(u32, u32)> = r0.iter().map(|(l, q)| (l.lane, q.qpn)).collect();
        assert_eq!(got, vec![(0, 100), (1, 110)]);
        assert!(r0.iter().all(|(l, _)| l.compute == 2 && l.memory == 0));
        let r1 = requests_for(&t, &all_requests(), 1).unwrap();
        assert_eq!(
            r1.iter().map(|(_, q)| q.qpn).collect::<Vec<_>>(),
            [101, 111]
        );
        // Order of records does not matter (the rendezvous sorts them).
        let mut rev = all_requests();
        rev.reverse();
        assert_eq!(requests_for(&t, &rev, 1).unwrap(), r1);
    }

    #[test]
    fn replies_come_back_per_core_in_memory_order() {
        let t = small();
        let lanes = replies_for(&t, &all_replies(), 2).unwrap();
        assert_eq!(lanes.len(), 2);
        for (lane, v) in lanes.iter().enumerate() {
            let ids: Vec<(u32, u32)> = v.iter().map(|(l, q)| (l.memory, q.qpn)).collect();
            let lane = lane as u32;
            assert_eq!(ids, vec![(0, 500 + lane * 10), (1, 501 + lane * 10)]);
        }
        // A memory-only node asking for its replies is told it has none.
        assert_eq!(
            replies_for(&t, &all_replies(), 0),
            Err(PairError::NotCompute {
                round: Round::Replies,
                node: 0
            })
        );
    }

    #[test]
    fn records_round_trip_through_the_builders() {
        let t = small();
        let lanes: Vec<Vec<(u32, QpInfo)>> = (0..2)
            .map(|lane| (0..2).map(|m| (m, qp(100 + lane * 10 + m))).collect())
            .collect();
        let mut recs = request_records(2, &lanes).unwrap();
        recs.sort();
        let mut want = all_requests();
        want.sort();
        assert_eq!(recs, want);
        let accepted: Vec<(Link, QpInfo)> = requests_for(&t, &recs, 1)
            .unwrap()
            .into_iter()
            .map(|(l, q)| (l, qp(q.qpn + 400)))
            .collect();
        let out = reply_records(1, &accepted).unwrap();
        assert_eq!(out, vec![reply(1, 2, 0, 501), reply(1, 2, 1, 511)]);
    }

    #[test]
    fn bad_request_sets_are_clear_errors() {
        let t = small();
        let round = Round::Requests;
        let with = |extra: WireEndpoint| {
            let mut v = all_requests();
            v.push(extra);
            links_of(&t, &v, round).unwrap_err()
        };
        let link = Link {
            compute: 2,
            lane: 1,
            memory: 0,
        };
        assert_eq!(
            with(request(2, 1, 0, 999)),
            PairError::Duplicate { round, link }
        );
        assert_eq!(
            with(request(9, 0, 0, 1)),
            PairError::UnknownNode { round, node: 9 }
        );
        assert_eq!(
            with(request(2, 0, 9, 1)),
            PairError::UnknownNode { round, node: 9 }
        );
        // A memory node publishing a request, and a request to a compute node.
        assert_eq!(
            with(request(0, 0, 1, 1)),
            PairError::NotCompute { round, node: 0 }
        );
        assert_eq!(
            with(request(2, 0, 2, 1)),
            PairError::NotMemory { round, node: 2 }
        );
        assert_eq!(
            with(request(2, 2, 0, 1)),
            PairError::LaneOutOfRange {
                round,
                node: 2,
                lane: 2,
                cores: 2
            }
        );
        let mut short = all_requests();
        short.retain(|e| e.peer_id != pack_peer(0, 1).unwrap());
        let e = links_of(&t, &short, round).unwrap_err();
        assert_eq!(e, PairError::Missing { round, link });
        assert_eq!(
            e.to_string(),
            "exchange 1 (compute endpoints): no record for compute node 2 core 1 ↔ memory node 0"
        );
        assert!(matches!(
            links_of(&t, &[], round),
            Err(PairError::Missing { .. })
        ));
    }

    #[test]
    fn bad_reply_sets_are_clear_errors() {
        let t = small();
        let round = Round::Replies;
        let with = |extra: WireEndpoint| {
            let mut v = all_replies();
            v.push(extra);
            replies_for(&t, &v, 2).unwrap_err()
        };
        assert!(matches!(
            with(reply(1, 2, 0, 7)),
            PairError::Duplicate { .. }
        ));
        assert_eq!(
            with(reply(2, 2, 0, 7)),
            PairError::NotMemory { round, node: 2 }
        );
        assert_eq!(
            with(reply(0, 1, 0, 7)),
            PairError::NotCompute { round, node: 1 }
        );
        assert_eq!(
            with(reply(0, 40, 0, 7)),
            PairError::UnknownNode { round, node: 40 }
        );
        let mut short = all_replies();
        short.pop();
        assert!(matches!(
            replies_for(&t, &short, 2),
            Err(PairError::Missing { .. })
        ));
    }

    #[test]
    fn arbitrary_records_never_panic() {
        let t = small();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            let mut recs = Vec::new();
            for _ in 0..(x % 7) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                recs.push(WireEndpoint {
                    node_id: (x % 5) as u32,
                    peer_id: (x >> 8) as u32 & 0x3_0007,
                    qp: qp(x as u32 & 0xff_ffff),
                });
            }
            let _ = links_of(&t, &recs, Round::Requests);
            let _ = replies_for(&t, &recs, 2);
            let _ = requests_for(&t, &recs, 0);
        }
    }

    fn region(node: u32, space: WireSpace, len: u64) -> Region {
        Region {
            node_id: node,
            space,
            base: 0x7f00_0000_0000 + node as u64 * 0x1_0000_0000,
            len,
            rkey: 0x100 + node * 2 + space as u32,
        }
    }

    #[test]
    fn regions_map_to_memory_nodes() {
        let t = small();
        let regs = [
            region(1, WireSpace::Host, 1 << 20),
            region(0, WireSpace::Device, 4096),
            region(0, WireSpace::Host, 2 << 20),
        ];
        let m = regions_by_node(&t, &regs).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(
            (m[0].node, m[0].host, m[0].device),
            (0, regs[2], Some(regs[1]))
        );
        assert_eq!((m[1].node, m[1].host, m[1].device), (1, regs[0], None));
    }

    #[test]
    fn bad_regions_are_clear_errors() {
        let t = small();
        let host = |n| region(n, WireSpace::Host, 64);
        assert_eq!(
            regions_by_node(&t, &[host(0)]),
            Err(PairError::MissingRegion { node: 1 })
        );
        assert_eq!(
            regions_by_node(&t, &[host(0), host(1), host(2)]),
            Err(PairError::RegionNotMemory { node: 2 })
        );
        assert_eq!(
            regions_by_node(&t, &[host(0), host(1), host(7)]),
            Err(PairError::RegionNotMemory { node: 7 })
        );
        assert_eq!(
            regions_by_node(&t, &[host(0), host(1), host(1)]),
            Err(PairError::DuplicateRegion {
                node: 1,
                space: WireSpace::Host
            })
        );
        let dm = region(0, WireSpace::Device, 8);
        assert_eq!(
            regions_by_node(&t, &[host(0), host(1), dm, dm]),
            Err(PairError::DuplicateRegion {
                node: 0,
                space: WireSpace::Device
            })
        );
        assert_eq!(
            regions_by_node(&t, &[host(0), region(1, WireSpace::Host, 0)]),
            Err(PairError::EmptyRegion {
                node: 1,
                space: WireSpace::Host
            })
        );
    }

    #[test]
    fn the_index_locks_fit_the_smallest_lock_table() {
        let t = Topology::new(vec![0, 1, 2], vec![(3, 1)]).unwrap();
        let host = |n| region(n, WireSpace::Host, 1 << 20);
        let dm = |n, len| region(n, WireSpace::Device, len);
        let all = [
            host(0),
            host(1),
            host(2),
            dm(0, 4096),
            dm(1, 1024),
            dm(2, 8192),
        ];
        let m = regions_by_node(&t, &all).unwrap();
        assert_eq!(lock_table_bytes(&m), 1024);
        // A node without a lock table leaves the index none.
        let m = regions_by_node(&t, &all[..5]).unwrap();
        assert_eq!(lock_table_bytes(&m), 0);
        assert_eq!(lock_table_bytes(&[]), 0);
    }

    // ---- the protocol over an in-process control plane and fabric ----

    /// Every node's exchanges and barriers, in process: a rendezvous
    /// without sockets that, like bootstrap's, returns sorted records.
    struct Hub {
        barrier: Barrier,
        rounds: Mutex<Vec<Directory>>,
    }

    struct HubMember {
        hub: Arc<Hub>,
        me: u32,
        round: usize,
        barriers: Vec<String>,
    }

    impl ControlPlane for HubMember {
        fn exchange(&mut self, mine: &Directory) -> Result<Directory, String> {
            assert!(mine.endpoints.iter().all(|e| e.node_id == self.me));
            assert!(mine.regions.iter().all(|r| r.node_id == self.me));
            {
                let mut rounds = self.hub.rounds.lock().unwrap();
                if rounds.len() <= self.round {
                    rounds.resize_with(self.round + 1, Directory::default);
                }
                let d = &mut rounds[self.round];
                d.endpoints.extend_from_slice(&mine.endpoints);
                d.regions.extend_from_slice(&mine.regions);
            }
            self.hub.barrier.wait();
            let mut all = self.hub.rounds.lock().unwrap()[self.round].clone();
            all.endpoints.sort();
            all.regions.sort();
            self.round += 1;
            Ok(all)
        }
        fn barrier(&mut self, name: &str) -> Result<(), String> {
            self.barriers.push(name.to_string());
            self.hub.barrier.wait();
            Ok(())
        }
    }

    #[derive(Clone, Debug, PartialEq, Eq)]
    enum Event {
        Made { link: Link, qpn: u32 },
        Accepted { link: Link, peer: u32, qpn: u32 },
        Connected { link: Link, peer: u32, node: u16 },
    }

    /// Queue pairs as numbers: node `id`'s n-th queue pair is id·1000 + n.
    struct FakeFabric {
        id: u32,
        lanes: u32,
        next: u32,
        log: Arc<Mutex<Vec<Event>>>,
    }

    impl FakeFabric {
        fn qpn(&mut self) -> u32 {
            self.next += 1;
            self.id * 1000 + self.next
        }
    }

    impl Fabric for FakeFabric {
        fn prepare_compute(&mut self, memory: &[u32]) -> Result<Vec<Vec<(u32, QpInfo)>>, String> {
            let mut out = Vec::new();
            for lane in 0..self.lanes {
                let mut v = Vec::new();
                for &m in memory {
                    let n = self.qpn();
                    self.log.lock().unwrap().push(Event::Made {
                        link: Link {
                            compute: self.id,
                            lane,
                            memory: m,
                        },
                        qpn: n,
                    });
                    v.push((m, qp(n)));
                }
                out.push(v);
            }
            Ok(out)
        }
        fn accept(&mut self, link: Link, peer: &QpInfo) -> Result<QpInfo, String> {
            assert_eq!(link.memory, self.id);
            let n = self.qpn();
            self.log.lock().unwrap().push(Event::Accepted {
                link,
                peer: peer.qpn,
                qpn: n,
            });
            Ok(qp(n))
        }
        fn connect(
            &mut self,
            link: Link,
            peer: &QpInfo,
            regions: &NodeRegions,
        ) -> Result<(), String> {
            assert_eq!(link.compute, self.id);
            self.log.lock().unwrap().push(Event::Connected {
                link,
                peer: peer.qpn,
                node: regions.node,
            });
            Ok(())
        }
    }

    /// Memory nodes 0, 1; compute node 2 (2 cores); node 3 both (3 cores):
    /// every link's two queue pairs end up connected to each other, each
    /// compute queue pair with its memory node's regions.
    #[test]
    fn the_protocol_connects_every_link_once() {
        let top = Topology::new(vec![0, 1, 3], vec![(2, 2), (3, 3)]).unwrap();
        let ids = [0u32, 1, 2, 3];
        let hub = Arc::new(Hub {
            barrier: Barrier::new(ids.len()),
            rounds: Mutex::new(Vec::new()),
        });
        let log = Arc::new(Mutex::new(Vec::new()));
        let results: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = ids
                .iter()
                .map(|&id| {
                    let (top, hub, log) = (&top, hub.clone(), log.clone());
                    s.spawn(move || {
                        let mut cp = HubMember {
                            hub,
                            me: id,
                            round: 0,
                            barriers: Vec::new(),
                        };
                        let mut f = FakeFabric {
                            id,
                            lanes: top.cores_of(id).unwrap_or(0),
                            next: 0,
                            log,
                        };
                        let regions = if top.is_memory(id) {
                            vec![
                                region(id, WireSpace::Host, 1 << 20),
                                region(id, WireSpace::Device, 4096),
                            ]
                        } else {
                            Vec::new()
                        };
                        let r = connect_cluster(&mut cp, &mut f, top, id, regions);
                        (r, cp.barriers, cp.round)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (r, barriers, rounds) in results {
            let regions = r.unwrap();
            assert_eq!(
                regions.iter().map(|r| r.node).collect::<Vec<_>>(),
                [0, 1, 3]
            );
            assert!(regions.iter().all(|r| r.device.is_some()));
            assert_eq!((barriers, rounds), (vec![QPS_READY.to_string()], 2));
        }
        let log = log.lock().unwrap();
        let links: Vec<Link> = top.links().collect();
        assert_eq!(links.len(), 15);
        assert_eq!(log.len(), 3 * links.len());
        for l in links {
            let made = log
                .iter()
                .filter_map(|e| match e {
                    Event::Made { link, qpn } if *link == l => Some(*qpn),
                    _ => None,
                })
                .collect::<Vec<_>>();
            let acc = log
                .iter()
                .filter_map(|e| match e {
                    Event::Accepted { link, peer, qpn } if *link == l => Some((*peer, *qpn)),
                    _ => None,
                })
                .collect::<Vec<_>>();
            let con = log
                .iter()
                .filter_map(|e| match e {
                    Event::Connected { link, peer, node } if *link == l => Some((*peer, *node)),
                    _ => None,
                })
                .collect::<Vec<_>>();
            assert_eq!((made.len(), acc.len(), con.len()), (1, 1, 1), "{l}");
            assert_eq!(acc[0].0, made[0], "{l}: responder faces the compute QP");
            assert_eq!(con[0], (acc[0].1, l.memory as u16), "{l}");
            assert_eq!(acc[0].1 / 1000, l.memory, "{l}: made by the memory node");
            assert_eq!(made[0] / 1000, l.compute, "{l}: made by the compute node");
        }
    }

    /// Hands out canned directories; errors when the script runs out.
    struct Scripted(Vec<Directory>);

    impl ControlPlane for Scripted {
        fn exchange(&mut self, _mine: &Directory) -> Result<Directory, String> {
            if self.0.is_empty() {
                return Err("the peers left".into());
            }
            Ok(self.0.remove(0))
        }
        fn barrier(&mut self, _name: &str) -> Result<(), String> {
            Ok(())
        }
    }

    fn fake(id: u32, lanes: u32) -> FakeFabric {
        FakeFabric {
            id,
            lanes,
            next: 0,
            log: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn good_regions() -> Vec<Region> {
        vec![
            region(0, WireSpace::Host, 64),
            region(1, WireSpace::Host, 64),
        ]
    }

    #[test]
    fn a_bad_exchange_fails_the_node_with_the_reason() {
        let t = small();
        let mut dup = all_requests();
        dup.push(request(2, 0, 0, 5));
        let mut cp = Scripted(vec![Directory {
            endpoints: dup,
            regions: good_regions(),
        }]);
        let e = connect_cluster(&mut cp, &mut fake(0, 0), &t, 0, Vec::new()).unwrap_err();
        assert!(
            matches!(e, BootError::Pair(PairError::Duplicate { .. })),
            "{e}"
        );
        // A compute node checks the requests too, and then the replies.
        let mut cp = Scripted(vec![
            Directory {
                endpoints: all_requests(),
                regions: good_regions(),
            },
            Directory {
                endpoints: all_replies()[1..].to_vec(),
                regions: Vec::new(),
            },
        ]);
        let e = connect_cluster(&mut cp, &mut fake(2, 2), &t, 2, Vec::new()).unwrap_err();
        assert!(
            matches!(e, BootError::Pair(PairError::Missing { .. })),
            "{e}"
        );
        // Regions are checked before any queue pair is touched.
        let mut cp = Scripted(vec![Directory {
            endpoints: all_requests(),
            regions: good_regions()[..1].to_vec(),
        }]);
        let e = connect_cluster(&mut cp, &mut fake(0, 0), &t, 0, Vec::new()).unwrap_err();
        assert_eq!(e, BootError::Pair(PairError::MissingRegion { node: 1 }));
        // A control channel that fails says at which step.
        let mut cp = Scripted(vec![Directory {
            endpoints: all_requests(),
            regions: good_regions(),
        }]);
        let e = connect_cluster(&mut cp, &mut fake(0, 0), &t, 0, Vec::new()).unwrap_err();
        assert!(e.to_string().contains("exchange 2"), "{e}");
    }

    // ---- the cluster file and the no-device / no-feature paths ----

    fn mlx5_cluster() -> (ClusterConfig, crate::node::NodeOptions) {
        let node = |id: u32, memory: bool, cores: Vec<u32>| NodeConfig {
            id,
            roles: Roles {
                memory,
                compute: !memory,
            },
            address: format!("127.0.0.1:{}", 47_000 + id),
            cores,
            memory_bytes: if memory { 8 << 20 } else { 0 },
        };
        let cfg = ClusterConfig {
            file: "cluster.toml".into(),
            nodes: vec![node(0, true, vec![]), node(1, false, vec![0, 1])],
            backend: Backend::Mlx5 {
                device: "mlx5_0".into(),
                port: 1,
                gid_index: 3,
            },
            huge_pages: HugePages::Off,
            lock_table_words: 512,
            secret_file: "/nonexistent/secret".into(),
        };
        let o = crate::node::NodeOptions {
            config: "cluster.toml".into(),
            id: 0,
            seconds: Some(1.0),
            tasks_per_core: 4,
            pin: false,
            seed: 1,
            workload: crate::node::Workload::Verbs,
            records: 1000,
        };
        (cfg, o)
    }

    #[cfg(feature = "mlx5")]
    #[test]
    fn the_device_comes_from_the_cluster_file() {
        let (cfg, _) = mlx5_cluster();
        let d = device_config(&cfg.backend).unwrap();
        assert_eq!(
            (d.name.as_deref(), d.port, d.gid_index),
            (Some("mlx5_0"), 1, 3)
        );
        assert_eq!(device_config(&Backend::Emu).unwrap_err().exit_code(), 2);
    }

    #[test]
    fn topology_of_a_cluster_file() {
        let (cfg, _) = mlx5_cluster();
        let t = Topology::from_config(&cfg).unwrap();
        assert_eq!(t, Topology::new(vec![0], vec![(1, 2)]).unwrap());
    }

    /// Booting a memory node on a machine without an RDMA device (or a
    /// build without the feature) fails at once with one clear error.
    #[test]
    fn booting_without_a_device_fails_promptly_and_clearly() {
        if std::path::Path::new("/sys/class/infiniband").exists() {
            eprintln!("skipped: this machine has RDMA devices");
            return;
        }
        let (cfg, o) = mlx5_cluster();
        let t = Instant::now();
        let layout = crate::node_work::Layout::new(8 << 20, 128).unwrap();
        let e = run(&o, &cfg, &cfg.nodes[0].clone(), layout).unwrap_err();
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "took {:?}",
            t.elapsed()
        );
        let msg = e.to_string();
        if cfg!(feature = "mlx5") {
            assert!(msg.starts_with("no RDMA device"), "{msg}");
            assert_eq!(e.exit_code(), 1);
            assert!(supported(&cfg).is_ok());
        } else {
            assert_eq!(msg, NO_FEATURE);
            assert_eq!(e.exit_code(), 2);
            assert_eq!(supported(&cfg).unwrap_err().to_string(), NO_FEATURE);
        }
    }
}
