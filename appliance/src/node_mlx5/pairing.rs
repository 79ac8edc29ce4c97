//! The pairing protocol, pure: which queue pairs a cluster needs, the
//! records that name them on the control channel, and the checks that
//! turn every malformed, duplicate, missing or foreign record into a
//! [`PairError`]. No device here; tested without one.

use crate::node::{channel_problem, RunFailed};
use bootstrap::config::ClusterConfig;
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

    /// The same cluster with `lanes(id, cores)` lanes on each compute node
    /// `id` of `cores` configured cores, in place of one a core: lanes for
    /// work beside the cores', or instead of them, which every node must
    /// count alike. Checked again (a count past the limits is an error).
    pub fn with_lanes(self, lanes: &dyn Fn(u32, u32) -> u32) -> Result<Topology, String> {
        let compute = self
            .compute
            .into_iter()
            .map(|(c, cores)| (c, lanes(c, cores)))
            .collect();
        Topology::new(self.memory, compute).map_err(|e| e.to_string())
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
    /// Memory role, once exchange 1 of a run came back (every node of the
    /// run has joined, so the compute nodes of the runs before have left):
    /// destroys the responders of the runs before; returns how many.
    fn retire(&mut self) -> usize;
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
        // Exchange 1 came back: every node of this run has joined, so the
        // compute nodes of the runs before (the same ids) have left, and
        // their responders go. Not sooner: a memory node rejoins the
        // coordinator as soon as a run has started, while that run's
        // compute nodes still use their responders.
        let retired = fabric.retire();
        if retired > 0 {
            log::debug!("memory node {me}: {retired} responders of earlier runs retired");
        }
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

/// The control plane of a served run, counting the exchanges that
/// completed (a run whose first exchange completed has started).
struct Counted<'a> {
    rv: &'a mut dyn ControlPlane,
    exchanges: usize,
}

impl ControlPlane for Counted<'_> {
    fn exchange(&mut self, mine: &Directory) -> Result<Directory, String> {
        let d = self.rv.exchange(mine)?;
        self.exchanges += 1;
        Ok(d)
    }
    fn barrier(&mut self, name: &str) -> Result<(), String> {
        self.rv.barrier(name)
    }
}

/// A memory node's part in a later compute run, on a rendezvous of every
/// node of the cluster ([`crate::node::serve_runs`]): pair with this run's
/// compute cores ([`connect_cluster`], publishing `regions` again, and
/// retiring the earlier runs' responders once everyone has joined), then
/// "memory-ready" and "index-ready" with the others. The memory and what it holds stay as
/// they are; the run's loader clears the index it finds.
pub fn serve_memory_run(
    rv: &mut Rendezvous,
    fabric: &mut dyn Fabric,
    top: &Topology,
    me: u32,
    regions: &[Region],
) -> Result<(), RunFailed> {
    let mut cp = Counted { rv, exchanges: 0 };
    let paired = connect_cluster(&mut cp, fabric, top, me, regions.to_vec());
    let started = cp.exchanges > 0;
    paired.map_err(|e| RunFailed {
        started,
        why: e.to_string(),
    })?;
    rv.agree(crate::node::MEMORY_READY, None)
        .map(drop)
        .and_then(|_| rv.barrier(crate::node::INDEX_READY))
        .map_err(|e| RunFailed {
            started: true,
            why: channel_problem(e),
        })
}
