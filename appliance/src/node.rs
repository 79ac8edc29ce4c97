//! `loch node --config F --id N`: boots one node of a cluster file, and
//! `loch check`, its preflight. Checks the flags and the layout for every
//! backend, boots the emu backend here and hands the mlx5 backend to
//! [`crate::node_mlx5`].
//!
//! Memory role (emu): create the node's memory as an emu node file,
//! register it, publish its regions over the control channel, then stay
//! out of the data path until SIGINT/SIGTERM, and remove the file. The
//! memory nodes outlive compute runs: after the cluster's first run, the
//! coordinator (the lowest id, when it is a memory-only node) serves any
//! number of later ones — each a rendezvous of the coordinator and the
//! compute nodes, to which it relays every memory-only node's regions (a
//! node that also computes joins each run and publishes its memory
//! afresh) — while the other memory nodes sleep (a 50 ms loop). A run's loader clears the
//! previous run's index from the memory nodes before loading its own, and
//! each verb task zeroes its own words before checking them. (On mlx5
//! every memory node pairs queue pairs with each run's cores, so there
//! each later run is a rendezvous of the whole cluster; see
//! [`crate::node_mlx5`]. Both loop in [`serve_runs`].) Compute role (emu): wait for the
//! memory nodes (the exchange and the "memory-ready" barrier), attach to
//! every memory node
//! by path, and run the `--workload` with [`crate::node_compute`], the
//! compute role of every backend: the verb mix of [`crate::node_work`], or
//! an index ([`crate::node_index`]: the lowest-id compute node creates and
//! loads it, then every node meets at the "index-ready" barrier, then each
//! compute node opens it), with a stats line per second and a final JSON
//! line that `loch demo --processes` parses.
//!
//! Every node takes part in both barriers, so the control channel stays
//! open until "index-ready"; SIGINT/SIGTERM cancels any wait on it within
//! ~100 ms ([`bootstrap::channel::Cancel`]). Where a node both holds
//! memory and computes, the channel stays open to a third barrier,
//! "compute-done", that every node passes once every compute run has
//! ended: such a node lets its memory go only then ([`shared_nodes`]).
//!
//! Where a memory node's file lives is a function of the cluster file alone
//! ([`emu_node_path`]), so the wire format carries no path: compute nodes
//! derive it, attach, and check the attached node's registered regions
//! against the Region records the node published.

use crate::index_work::{index_args, IndexKind, IndexLoad, Sizes};
use crate::node_compute::{self, Compute, CoreSource};
use crate::node_index;
use crate::node_leases::{store_flags, StoreFlags};
use crate::node_work::{self, Layout};
use bootstrap::channel::{Cancel, ChannelError, WaitReport};
use bootstrap::config::{Backend, NodeConfig};
use bootstrap::preflight::{self, Host, PreflightOptions};
use bootstrap::wire::{Region, Space as WireSpace};
use bootstrap::{ChannelOptions, ClusterConfig, Directory, Rendezvous};
use cluster::EmuCluster;
use cmdline::signals;
use nicdrv::emu::{Backing, EmuConfig, EmuEndpoint, EmuNic, EmuNode, EmuNodeConfig};
use nicdrv::{Executor, ExecutorConfig, Nic, NodeId};
use std::ffi::OsString;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Task slots reserved per core in the memory layout, whatever `--tasks`
/// says, so every compute node computes the same areas.
pub const TASKS_PER_CORE_MAX: usize = 64;
/// How long a node waits for the whole cluster to join.
const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a node that will not start tries to tell the others why
/// ([`tell_refusal`]). The nodes of a cluster are started together, so
/// one not there by then was likely not started at all; the whole join
/// timeout would hold a mistyped command that long.
pub const REFUSAL_WINDOW: Duration = Duration::from_secs(5);

/// Set once this process begins to join its cluster ([`join_keeping`]).
/// [`run`] failing before then refused to start, and tells the others
/// ([`tell_refusal`]); after it, the others see the node fail or leave on
/// the channel. One `loch node` runs one node a process.
static JOIN_BEGUN: AtomicBool = AtomicBool::new(false);
/// The barrier after which every memory node's memory is reachable.
pub const MEMORY_READY: &str = "memory-ready";
/// The barrier after which every compute node opens the index.
pub const INDEX_READY: &str = "index-ready";
/// The barrier every node of a run passes once every compute node's run
/// has ended, where a node both holds memory and computes
/// ([`shared_nodes`]): its memory outlives its own run until then.
pub const COMPUTE_DONE: &str = "compute-done";
/// How long after the first compute run of a cluster ended the
/// coordinator waits at "compute-done" before it names the nodes it still
/// waits for (compute runs of one cluster end within a second of each
/// other; one that does not may hang).
pub const COMPUTE_DONE_QUIET: Duration = Duration::from_secs(3);
/// The first gap between two such lines naming the same nodes; each next
/// one doubles, up to [`COMPUTE_DONE_GAP_MAX`].
const COMPUTE_DONE_GAP: Duration = Duration::from_secs(30);
const COMPUTE_DONE_GAP_MAX: Duration = Duration::from_secs(600);
/// Most records `--records` may ask for (a hash-table load of this many
/// puts stays well inside the 60 s "index-ready" barrier timeout).
pub const RECORDS_MAX: u64 = 10_000_000;

/// What a compute node runs (`--workload`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Workload {
    /// READ/WRITE/FAA of words ([`crate::node_work`]).
    Verbs,
    /// The Sherman B+tree ([`crate::node_index`]).
    Tree,
    /// The Nessie hash table ([`crate::node_index`]).
    Hash,
    /// FaRM transactions: every node a machine ([`crate::node_txn`]).
    Txn,
    /// FaRM's failure detection and reconfiguration alone: every node a
    /// machine holding leases, the configuration in etcd
    /// ([`crate::node_leases`]).
    Leases,
}

impl Workload {
    pub fn parse(s: &str) -> Option<Workload> {
        match s {
            "verbs" => Some(Workload::Verbs),
            "tree" => Some(Workload::Tree),
            "hash" => Some(Workload::Hash),
            "txn" => Some(Workload::Txn),
            "leases" => Some(Workload::Leases),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Workload::Verbs => "verbs",
            Workload::Tree => "tree",
            Workload::Hash => "hash",
            Workload::Txn => "txn",
            Workload::Leases => "leases",
        }
    }

    /// Whether every node runs it as a machine (memory and compute):
    /// `txn` and `leases`.
    pub fn machines(self) -> bool {
        matches!(self, Workload::Txn | Workload::Leases)
    }

    pub fn index(self) -> Option<IndexKind> {
        match self {
            Workload::Verbs | Workload::Txn | Workload::Leases => None,
            Workload::Tree => Some(IndexKind::Tree),
            Workload::Hash => Some(IndexKind::Hash),
        }
    }
}

/// Why `loch node` or `loch check` stopped: bad input (exit 2) or a failure
/// at run time (exit 1).
#[derive(Debug)]
pub enum NodeError {
    Usage(String),
    Failed(String),
}

impl NodeError {
    pub fn exit_code(&self) -> u8 {
        match self {
            NodeError::Usage(_) => 2,
            NodeError::Failed(_) => 1,
        }
    }
}

impl std::fmt::Display for NodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeError::Usage(s) | NodeError::Failed(s) => write!(f, "{s}"),
        }
    }
}

/// Writes one progress line to stderr in one `write(2)`, so the lines of
/// several node processes sharing a terminal or pipe never interleave.
pub fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut s = line.to_string();
    s.push('\n');
    let _ = std::io::stderr().write_all(s.as_bytes());
}

pub(crate) fn failed(e: impl std::fmt::Display) -> NodeError {
    NodeError::Failed(e.to_string())
}

/// Flags of `loch node`.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    pub config: PathBuf,
    pub id: u32,
    /// Compute role: stop after this many seconds (else at SIGINT/SIGTERM).
    pub seconds: Option<f64>,
    pub tasks_per_core: usize,
    pub pin: bool,
    pub seed: u64,
    /// Compute role: what to run. Every compute node of a cluster must run
    /// the same index workload (the lowest-id one loads the index).
    pub workload: Workload,
    /// Index workloads: records the loader loads (every compute node must
    /// be given the same number).
    pub records: u64,
    /// Index workloads: the records' key and value sizes (every compute
    /// node must be given the same).
    pub sizes: Sizes,
    /// `--workload tree`: the tree, by [`index::tree::TreeConfig::named`]
    /// name (every compute node must be given the same).
    pub tree: String,
    /// Compute role: write the raw latency histogram here (JSON) besides
    /// the summary line.
    pub histogram: Option<PathBuf>,
    /// `--workload txn`: transactions each core coordinates.
    pub txs: u64,
    /// `--workload leases` (or `txn` with failure handling): the etcd
    /// endpoint holding the configuration.
    pub etcd: Option<String>,
    /// `--workload leases`: the lease, in milliseconds.
    pub lease_ms: f64,
}

/// `loch check`: prints the preflight report of node `o.id`, then whether
/// the memory nodes can hold the workload `loch node` would run with the
/// same flags; Ok(every check passed).
pub fn check(o: &NodeOptions) -> Result<bool, NodeError> {
    let cfg = ClusterConfig::load(&o.config).map_err(|e| NodeError::Usage(e.to_string()))?;
    let node = node_in(&cfg, &o.config, o.id)?;
    // What `loch node` would refuse is not ok here either.
    check_flags(o)?;
    crate::node_mlx5::supported(&cfg)?;
    let report = preflight::run(&cfg, o.id, &Host::current(), PreflightOptions::default());
    cmdline::out!("{report}");
    let fits = if o.workload.machines() {
        crate::node_txn::geometry(o, &cfg).map(|_| ())
    } else {
        workload_fits(o, &cfg, node).map(|_| ())
    };
    let what = workload_flags(o);
    match &fits {
        Ok(_) => cmdline::outln!(
            "node {} ok   {:<10} the memory nodes hold {what}",
            o.id,
            "workload"
        ),
        Err(e) => cmdline::outln!("node {} FAIL {:<10} {e} ({what})", o.id, "workload"),
    }
    Ok(report.passed() && fits.is_ok())
}

/// Node `id` of the cluster file, or the usage error (exit 2) naming the
/// ids the file has.
fn node_in<'a>(cfg: &'a ClusterConfig, path: &Path, id: u32) -> Result<&'a NodeConfig, NodeError> {
    cfg.node(id).ok_or_else(|| {
        let ids: Vec<String> = cfg.nodes.iter().map(|n| n.id.to_string()).collect();
        NodeError::Usage(format!(
            "node {id} is not in {} (its nodes: {})",
            path.display(),
            ids.join(", ")
        ))
    })
}

/// The emu node file of memory node `id`: named from this user, the
/// coordinator's control port (unique among live clusters on one host)
/// and the node id.
pub fn emu_node_path(cfg: &ClusterConfig, id: u32) -> PathBuf {
    let port = cfg
        .coordinator()
        .address
        .rsplit_once(':')
        .map_or("0", |(_, p)| p);
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(format!("/dev/shm/loch-u{uid}-p{port}-node{id}"))
}

fn resolve(address: &str) -> Result<SocketAddr, NodeError> {
    address
        .to_socket_addrs()
        .map_err(|e| failed(format!("cannot resolve {address}: {e}")))?
        .next()
        .ok_or_else(|| failed(format!("{address} resolves to no address")))
}

fn memory_id(n: &NodeConfig) -> Result<NodeId, NodeError> {
    NodeId::try_from(n.id).map_err(|_| {
        NodeError::Usage(format!(
            "memory node {} has an id above {} (the emu backend's limit)",
            n.id,
            NodeId::MAX
        ))
    })
}

/// Figures of the control channel, for the final report.
pub(crate) struct Boot {
    pub(crate) join_ns: u64,
    pub(crate) exchange_ns: u64,
    pub(crate) directory: Directory,
}

/// What went wrong on the control channel; a cancelled wait says why.
pub fn channel_problem(e: ChannelError) -> String {
    match e {
        ChannelError::Cancelled => {
            "stopped by SIGINT/SIGTERM while waiting for the other nodes".into()
        }
        e => e.to_string(),
    }
}

/// A failed step of the control channel.
fn channel_failed(what: &str, e: ChannelError) -> NodeError {
    failed(format!("{what}: {}", channel_problem(e)))
}

/// The channel options of node `id`: the cluster secret, and waits that a
/// signal ends within their 100 ms poll; quiet while waiting (a serving
/// memory node may wait for hours between runs).
pub fn channel_options(cfg: &ClusterConfig, id: u32) -> Result<ChannelOptions, NodeError> {
    let secret = cfg.secret().map_err(|e| NodeError::Usage(e.to_string()))?;
    let mut opts = ChannelOptions::new(id, secret);
    opts.cancel = Some(Cancel::new(signals::stop_requested));
    Ok(opts)
}

/// Joins the cluster's rendezvous (as coordinator or member); returns it
/// and how long joining took. A signal ends any wait on the channel, now
/// and later, within its 100 ms poll.
pub fn join(cfg: &ClusterConfig, id: u32) -> Result<(Rendezvous, u64), NodeError> {
    join_keeping(cfg, id).map(|(rv, ns, _)| (rv, ns))
}

/// [`join`], also returning the coordinator's listener (`None` for a
/// member), for a memory node that goes on serving compute runs.
pub fn join_keeping(
    cfg: &ClusterConfig,
    id: u32,
) -> Result<(Rendezvous, u64, Option<TcpListener>), NodeError> {
    // Relaxed: a flag for `run`, on this process's threads, guarding no
    // data; `run` reads it after the thread that joins has returned.
    JOIN_BEGUN.store(true, Ordering::Relaxed);
    let mut opts = channel_options(cfg, id)?;
    // Once a second while waiting: whom, and where to look for them.
    let where_: Vec<(u32, String)> = cfg
        .nodes
        .iter()
        .map(|n| (n.id, n.address.clone()))
        .collect();
    opts.on_wait = Some(WaitReport::new(move |ids, refused| {
        let list: Vec<String> = ids
            .iter()
            .map(|i| match where_.iter().find(|(n, _)| n == i) {
                Some((_, a)) => format!("{i} ({a})"),
                None => i.to_string(),
            })
            .collect();
        let refused = match refused {
            Some(e) => format!("; refused a connection meanwhile: {e}"),
            None => String::new(),
        };
        say(format_args!(
            "loch node {id}: waiting for node{} {} to join the rendezvous{refused}",
            if ids.len() == 1 { "" } else { "s" },
            list.join(", ")
        ));
    }));
    let coord = cfg.coordinator();
    let addr = resolve(&coord.address)?;
    let ids: Vec<u32> = cfg.nodes.iter().map(|n| n.id).collect();
    let t0 = Instant::now();
    let (rv, listener) = if coord.id == id {
        let listener =
            TcpListener::bind(addr).map_err(|e| failed(format!("cannot listen on {addr}: {e}")))?;
        let rv = Rendezvous::coordinate(&listener, &ids, &opts, RENDEZVOUS_TIMEOUT);
        (rv, Some(listener))
    } else {
        (
            Rendezvous::join(addr, coord.id, &opts, RENDEZVOUS_TIMEOUT),
            None,
        )
    };
    let rv = rv.map_err(|e| channel_failed("rendezvous", e))?;
    Ok((rv, t0.elapsed().as_nanos() as u64, listener))
}

/// What every compute node of a run must agree on: the workload and, for
/// an index, the records loaded; `None` for a node without the compute
/// role (it runs no workload).
pub fn workload_agreement(o: &NodeOptions, node: &NodeConfig) -> Option<String> {
    node.roles.compute.then(|| workload_flags(o))
}

/// The flags that say what a compute node runs: the workload and, for an
/// index, the records loaded.
fn workload_flags(o: &NodeOptions) -> String {
    if o.workload == Workload::Txn && o.etcd.is_some() {
        return format!("--workload txn --etcd --lease-ms {}", o.lease_ms);
    }
    if o.workload == Workload::Txn {
        return format!("--workload txn --txs {}", o.txs);
    }
    if o.workload == Workload::Leases {
        return format!("--workload leases --lease-ms {}", o.lease_ms);
    }
    match o.workload.index() {
        Some(kind) => {
            let mut flags = format!("--workload {} --records {}", o.workload.name(), o.records);
            for a in index_args(kind, o.sizes, &o.tree) {
                flags.push(' ');
                flags.push_str(&a);
            }
            flags
        }
        None => format!("--workload {}", o.workload.name()),
    }
}

/// Waits at "memory-ready" (every node does, once the backend's exchange
/// made every memory node reachable), agreeing there on `workload`
/// ([`workload_agreement`]): compute nodes given different workloads are
/// refused here, each with one line naming who was given what, before any
/// of them loads or runs anything.
pub fn memory_ready(rv: &mut Rendezvous, workload: Option<String>) -> Result<(), NodeError> {
    match rv.agree(MEMORY_READY, workload.as_deref()) {
        Ok(_) => Ok(()),
        Err(ChannelError::Disagreed(why)) => Err(NodeError::Usage(format!(
            "the compute nodes were given different workloads ({why}); give every compute node the same values of the flags shown"
        ))),
        Err(ChannelError::Limit(why)) => Err(NodeError::Usage(why)),
        Err(e) => Err(channel_failed("barrier memory-ready", e)),
    }
}

/// Joins the cluster, exchanges regions and passes "memory-ready"; the
/// rendezvous stays open for the "index-ready" barrier.
pub(crate) fn rendezvous(
    cfg: &ClusterConfig,
    id: u32,
    regions: Vec<Region>,
    workload: Option<String>,
) -> Result<(Boot, Rendezvous, Option<TcpListener>), NodeError> {
    let (mut rv, join_ns, listener) = join_keeping(cfg, id)?;
    let t1 = Instant::now();
    let directory = rv
        .exchange(&Directory {
            endpoints: Vec::new(),
            regions,
        })
        .map_err(|e| channel_failed("exchange", e))?;
    memory_ready(&mut rv, workload)?;
    let exchange_ns = t1.elapsed().as_nanos() as u64;
    Ok((
        Boot {
            join_ns,
            exchange_ns,
            directory,
        },
        rv,
        listener,
    ))
}

/// Waits at "index-ready" (every node does, whatever its role or
/// workload), then says goodbye on the control channel.
pub fn index_ready(mut rv: Rendezvous) -> Result<(), NodeError> {
    index_ready_keeping(&mut rv)?;
    rv.close();
    Ok(())
}

/// Waits at "index-ready", keeping the control channel for
/// [`compute_done`].
pub fn index_ready_keeping(rv: &mut Rendezvous) -> Result<(), NodeError> {
    rv.barrier(INDEX_READY)
        .map_err(|e| channel_failed("barrier index-ready", e))
}

/// Whether a node of `cfg` both holds memory and computes. Its memory
/// serves the other compute nodes too, so it must outlive every compute
/// node's run, not only its own: every node of a run then keeps the
/// control channel past "index-ready" and meets at "compute-done"
/// ([`compute_done`]) before any node that holds memory lets it go.
/// Without such a node nothing waits: memory-only nodes serve until
/// SIGINT/SIGTERM anyway.
pub fn shared_nodes(cfg: &ClusterConfig) -> bool {
    cfg.nodes.iter().any(|n| n.roles.memory && n.roles.compute)
}

/// This node's part in "compute-done" ([`shared_nodes`]), once its own
/// part in the run is over, then goodbye. A node that holds memory waits
/// there for as long as the longest compute run takes (its memory serves
/// them), and so does the coordinator, through which the others meet; a
/// compute-only member just leaves, which counts as its arrival
/// ([`Rendezvous::final_barrier`]): it holds nothing anyone needs. A
/// compute node that leaves early (its run ended, or its process died)
/// does not end the others' wait; the coordinator leaving does (said),
/// as does a stop request. Neither is this node's failure: its own part
/// is done either way. The coordinator names the nodes it still waits
/// for once [`COMPUTE_DONE_QUIET`] has passed since the first of the
/// `computing` nodes (the cluster's compute nodes; this one among them
/// where it computes, its run over by now) ended its run ([`DoneWatch`]):
/// a compute node that hangs holds the wait, and is named.
pub fn compute_done(mut rv: Rendezvous, me: &str, holds_memory: bool, computing: &[u32]) {
    if !holds_memory && !rv.is_coordinator() {
        rv.close();
        return;
    }
    if !holds_memory {
        say(format_args!(
            "{me}: compute run done; staying until every compute node is done (this node \
             coordinates the control channel, through which the nodes holding memory learn it)"
        ));
    }
    let mut watch = DoneWatch::new(computing, computing.contains(&rv.node_id()));
    let waiting = |ids: &[u32], waited: Duration| {
        if let Some(line) = watch.seen(ids, waited) {
            say(format_args!("{me}: {line}"));
        }
    };
    match rv.final_barrier_telling(COMPUTE_DONE, Duration::from_secs(1), waiting) {
        Ok(_) | Err(ChannelError::Cancelled) => {}
        Err(e) if rv.is_coordinator() => say(format_args!(
            "{me}: compute-done failed: {}",
            channel_problem(e)
        )),
        Err(e) => say(format_args!(
            "{me}: the coordinator left before every compute run was done ({}); not waiting \
             for the others",
            channel_problem(e)
        )),
    }
    rv.close();
}

/// What the coordinator says while it waits at "compute-done", given
/// whom it waits for and how long it has ([`Rendezvous::final_barrier_telling`]):
/// nothing until [`COMPUTE_DONE_QUIET`] after the first compute run ended
/// (its own, where it computes; else the first compute node to arrive or
/// leave), so that a memory node serving runs says nothing while they
/// run; then the nodes still awaited, again whenever they change, and
/// otherwise at gaps doubling from 30 s to 10 minutes, so that a node
/// that hangs is named.
pub struct DoneWatch {
    computing: Vec<u32>,
    first_done: Option<Duration>,
    said: Option<Vec<u32>>,
    gap: Duration,
    next: Duration,
}

impl DoneWatch {
    /// For a cluster whose compute nodes are `computing`, at a
    /// coordinator that `computes` (its own run is over by now) or not.
    pub fn new(computing: &[u32], computes: bool) -> DoneWatch {
        DoneWatch {
            computing: computing.to_vec(),
            first_done: computes.then_some(Duration::ZERO),
            said: None,
            gap: COMPUTE_DONE_GAP,
            next: Duration::ZERO,
        }
    }

    /// The line to say, if any, now that `waiting` are still awaited
    /// after `waited`.
    pub fn seen(&mut self, waiting: &[u32], waited: Duration) -> Option<String> {
        let first = match self.first_done {
            Some(f) => f,
            None if self.computing.iter().any(|c| !waiting.contains(c)) => {
                *self.first_done.insert(waited)
            }
            None => return None,
        };
        let since = waited.saturating_sub(first);
        let same = self.said.as_deref() == Some(waiting);
        if since < COMPUTE_DONE_QUIET || (same && waited < self.next) {
            return None;
        }
        let list: Vec<String> = waiting.iter().map(u32::to_string).collect();
        self.said = Some(waiting.to_vec());
        self.next = waited + self.gap;
        self.gap = (self.gap * 2).min(COMPUTE_DONE_GAP_MAX);
        Some(format!(
            "compute-done: {} s after the first compute run ended, still waiting for node{} {} \
             (SIGINT/SIGTERM ends the wait)",
            since.as_secs(),
            if waiting.len() == 1 { "" } else { "s" },
            list.join(", ")
        ))
    }
}

/// The ids of `cfg`'s compute nodes where its nodes meet at
/// "compute-done" ([`shared_nodes`]), for [`compute_done`].
pub fn compute_done_of(cfg: &ClusterConfig) -> Option<Vec<u32>> {
    shared_nodes(cfg).then(|| {
        cfg.nodes
            .iter()
            .filter(|n| n.roles.compute)
            .map(|n| n.id)
            .collect()
    })
}

/// A memory-only node's part in a run from "index-ready" on: pass it,
/// and where a node both holds memory and computes, stay on the control
/// channel until "compute-done" ([`shared_nodes`]).
pub fn memory_run_done(mut rv: Rendezvous, cfg: &ClusterConfig, me: &str) -> Result<(), NodeError> {
    let Some(computing) = compute_done_of(cfg) else {
        return index_ready(rv);
    };
    index_ready_keeping(&mut rv)?;
    compute_done(rv, me, true, &computing);
    Ok(())
}

/// The memory role once booted: pass "index-ready" with the others (and
/// "compute-done": [`memory_run_done`]), then stay out of the data path
/// (the NIC, or on emu the attachers, does the work) until SIGINT/SIGTERM.
pub fn serve_memory(rv: Rendezvous, cfg: &ClusterConfig, me: &str) -> Result<(), NodeError> {
    memory_run_done(rv, cfg, me)?;
    while !signals::stop_requested() {
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Where a memory node that goes on serving compute runs sits in each
/// later run's rendezvous.
pub enum Seat {
    /// The coordinator: it listens, and a run is `members` joined.
    Coordinator {
        listener: TcpListener,
        members: Vec<u32>,
    },
    /// Another memory node: it dials the coordinator for every run.
    Member { addr: SocketAddr, coordinator: u32 },
}

/// Why a served run did not start. `started`: its first exchange had
/// completed. Before that, a member's failure is most often the
/// coordinator giving up a wait for compute nodes (every 30 s while the
/// cluster is idle), and is not said.
#[derive(Debug)]
pub struct RunFailed {
    pub started: bool,
    pub why: String,
}

/// How long a served run's rendezvous waits for all its nodes before it
/// starts over: a node that joined and died is then forgotten, so its
/// restart can join the next try.
const SERVED_RUN_WAIT: Duration = RENDEZVOUS_TIMEOUT;

/// The memory role after the cluster's first run, on every backend: from
/// `seat`, one rendezvous after another, each handed to `run` (the
/// backend's part of one compute run, through "index-ready"), until `stop`
/// (SIGINT/SIGTERM; `opts.cancel` ends any wait on the channel). With
/// `until_done` (the cluster's compute nodes, [`compute_done_of`]) each
/// run's rendezvous is held until "compute-done" before the next one is
/// joined. A run
/// that fails to start is said and the node waits for the next; it never
/// ends the service. Returns the runs served.
pub fn serve_runs(
    opts: &ChannelOptions,
    seat: &Seat,
    me: &str,
    stop: &dyn Fn() -> bool,
    until_done: Option<&[u32]>,
    run: &mut dyn FnMut(&mut Rendezvous) -> Result<(), RunFailed>,
) -> u64 {
    let mut served = 0u64;
    // Quiet while idle, but a handshake refused meanwhile (a node of
    // another build or secret) is said: the node it came from is likely
    // waiting on this one.
    let mut opts = opts.clone();
    let who = me.to_string();
    opts.on_wait = Some(WaitReport::new(move |_, refused| {
        if let Some(e) = refused {
            say(format_args!("{who}: refused a connection: {e}"));
        }
    }));
    let opts = &opts;
    while !stop() {
        let joined = match seat {
            Seat::Coordinator { listener, members } => {
                Rendezvous::coordinate(listener, members, opts, SERVED_RUN_WAIT)
            }
            Seat::Member { addr, coordinator } => {
                Rendezvous::join(*addr, *coordinator, opts, SERVED_RUN_WAIT)
            }
        };
        let mut rv = match joined {
            Ok(rv) => rv,
            Err(ChannelError::Cancelled) => break,
            // No run yet (or the coordinator between tries): wait on.
            Err(ChannelError::Timeout(_)) => continue,
            Err(e) => {
                if matches!(seat, Seat::Coordinator { .. }) {
                    say(format_args!(
                        "{me}: a compute run could not join: {}",
                        channel_problem(e)
                    ));
                } else {
                    // The coordinator is up but busy, or going down.
                    log::debug!("{me}: joining a compute run: {}", channel_problem(e));
                }
                // Either way not at once again (an error that persists,
                // such as a full descriptor table, would flood the log).
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        match run(&mut rv) {
            Ok(()) => {
                served += 1;
                say(format_args!(
                    "{me}: compute run {} joined and started",
                    served + 1
                ));
                if let Some(computing) = until_done {
                    compute_done(rv, me, true, computing);
                } else {
                    rv.close();
                }
            }
            Err(_) if stop() => break,
            Err(f) if f.started || matches!(seat, Seat::Coordinator { .. }) => say(format_args!(
                "{me}: a compute run failed to start: {}",
                f.why
            )),
            Err(f) => log::debug!("{me}: an idle rendezvous ended: {}", f.why),
        }
    }
    served
}

/// The memory role of the coordinator on emu, once the cluster's first run
/// has booted: it goes on serving compute runs until SIGINT/SIGTERM. Each
/// later run is a rendezvous of the coordinator and the compute nodes (the
/// other memory nodes stay up and out of it: compute nodes attach to them
/// by path): the coordinator relays every memory-only node's regions from
/// the first exchange, and passes the barriers with them ("compute-done"
/// too where a node both holds memory and computes). Returns the runs
/// served after the first.
fn serve_compute_runs(
    rv: Rendezvous,
    cfg: &ClusterConfig,
    id: u32,
    listener: TcpListener,
    first: &Directory,
    me: &str,
) -> Result<u64, NodeError> {
    memory_run_done(rv, cfg, me)?;
    let mut members: Vec<u32> = cfg
        .nodes
        .iter()
        .filter(|n| n.roles.compute)
        .map(|n| n.id)
        .collect();
    // Only memory nodes publish regions: ours, and the others' to relay,
    // those of memory-only nodes (they stay out of later runs). A node
    // that also computes is in every run and publishes its memory afresh:
    // relaying its first run's records too gave its attachers two
    // records of one node, the old one naming memory it no longer has.
    let (own, others): (Vec<Region>, Vec<Region>) = first
        .regions
        .iter()
        .filter(|r| !members.contains(&r.node_id))
        .cloned()
        .partition(|r| r.node_id == id);
    members.push(id);
    let mine = Directory {
        endpoints: Vec::new(),
        regions: own,
    };
    let relayed = Directory {
        endpoints: Vec::new(),
        regions: others,
    };
    // Quiet while idle: a memory node may wait for hours between runs.
    let opts = channel_options(cfg, id)?;
    say(format_args!(
        "{me}: serving compute runs until SIGINT/SIGTERM"
    ));
    let seat = Seat::Coordinator { listener, members };
    Ok(serve_runs(
        &opts,
        &seat,
        me,
        &signals::stop_requested,
        compute_done_of(cfg).as_deref(),
        &mut |rv| {
            rv.exchange_relaying(&mine, &relayed)
                .map_err(|e| RunFailed {
                    started: false,
                    why: channel_problem(e),
                })?;
            rv.agree(MEMORY_READY, None)
                .map(drop)
                .and_then(|_| rv.barrier(INDEX_READY))
                .map_err(|e| RunFailed {
                    started: true,
                    why: channel_problem(e),
                })
        },
    ))
}

/// A memory node's seat in later runs, when the cluster's memory
/// nodes outlive compute runs: the coordinator must be a memory-only node
/// (a compute coordinator leaves with its run). `listener` is the
/// coordinator's, kept from the first run. `Ok(None)`: serve one run.
pub fn memory_seat(
    cfg: &ClusterConfig,
    listener: Option<TcpListener>,
) -> Result<Option<Seat>, NodeError> {
    let coord = cfg.coordinator();
    if coord.roles.compute {
        return Ok(None);
    }
    Ok(Some(match listener {
        Some(listener) => Seat::Coordinator {
            listener,
            members: cfg.nodes.iter().map(|n| n.id).collect(),
        },
        None => Seat::Member {
            addr: resolve(&coord.address)?,
            coordinator: coord.id,
        },
    }))
}

/// Runs `loch node`; returns the exit code (0: clean, 1: a failure seen).
/// A node that refuses to start (its flags, its preflight, its memory)
/// returns the error before joining its cluster:
/// [`tell_refusal_if_unjoined`] then tells the others why.
pub fn run(o: &NodeOptions) -> Result<u8, NodeError> {
    let cfg = ClusterConfig::load(&o.config).map_err(|e| NodeError::Usage(e.to_string()))?;
    let node = node_in(&cfg, &o.config, o.id)?.clone();
    run_node(o, &cfg, &node)
}

/// After [`run`] failed with `why`: where it failed before it began to
/// join the cluster, tells the other nodes ([`tell_refusal_by_file`]).
pub fn tell_refusal_if_unjoined(config: &Path, id: u32, why: &str) {
    // Relaxed: see JOIN_BEGUN; every join of this node ran on threads
    // that returned before `run` did.
    if !JOIN_BEGUN.load(Ordering::Relaxed) {
        tell_refusal_by_file(config, id, why);
    }
}

/// [`tell_refusal`] by the cluster file's path: nothing is told where the
/// file or the node in it is the problem (the node's error says so).
pub fn tell_refusal_by_file(config: &Path, id: u32, why: &str) {
    if let Ok(cfg) = ClusterConfig::load(config) {
        if cfg.node(id).is_some() {
            tell_refusal(&cfg, id, why);
        }
    }
}

/// The cluster file and node id a `loch node` command line names
/// (`args`, the program's name first), read without clap: for a command
/// line clap refused, so that the node can still tell the others why
/// ([`tell_refusal_by_file`]). `None` where it is not `loch node`, or
/// either flag is missing, given twice or, for the id, not a number.
pub fn node_named_by(args: &[OsString]) -> Option<(PathBuf, u32)> {
    if args.get(1)?.to_str()? != "node" {
        return None;
    }
    let (mut config, mut id) = (Vec::new(), Vec::new());
    let mut rest = args[2..].iter();
    while let Some(a) = rest.next() {
        let Some(flag) = a.to_str() else { continue };
        if flag == "--" {
            break;
        }
        match flag.split_once('=') {
            Some(("--config", v)) => config.push(OsString::from(v)),
            Some(("--id", v)) => id.push(OsString::from(v)),
            _ if flag == "--config" => config.extend(rest.next().cloned()),
            _ if flag == "--id" => id.extend(rest.next().cloned()),
            _ => {}
        }
    }
    match (&config[..], &id[..]) {
        ([c], [i]) => Some((PathBuf::from(c), i.to_str()?.parse().ok()?)),
        _ => None,
    }
}

/// Tells the other nodes of `cfg` that node `id` will not start, for
/// `why`, once the node has said its error: each of them then fails at
/// its first meeting naming it (`node N withdrew from the run: WHY`)
/// rather than waiting out the 30 s join timeout. A member tells the
/// coordinator, which passes it on, as soon as the coordinator listens,
/// within [`REFUSAL_WINDOW`] (nodes started together may start the
/// coordinator a moment after this one refused; saying so where it does
/// not listen yet). The coordinator tells each member that joins within
/// that window, and says so first. Nothing is told where the cluster
/// secret cannot be read: no peer would believe it.
pub fn tell_refusal(cfg: &ClusterConfig, id: u32, why: &str) {
    let me = format!("loch node {id}");
    let Ok(opts) = channel_options(cfg, id) else {
        return;
    };
    let coord = cfg.coordinator();
    let Ok(addr) = resolve(&coord.address) else {
        return;
    };
    if coord.id != id {
        // A refused connection comes only from the join: nobody listens.
        let unheard = |e: &ChannelError| matches!(e, ChannelError::Io(e) if e.kind() == std::io::ErrorKind::ConnectionRefused);
        let mut joined = Rendezvous::join(addr, coord.id, &opts, Duration::ZERO);
        if joined.as_ref().err().is_some_and(unheard) {
            say(format_args!(
                "{me}: the coordinator, node {}, is not listening yet; telling it why once it \
                 is, for up to {} s (a signal ends it)",
                coord.id,
                REFUSAL_WINDOW.as_secs()
            ));
            joined = Rendezvous::join(addr, coord.id, &opts, REFUSAL_WINDOW);
        }
        match joined.and_then(|rv| rv.withdraw(why)) {
            Ok(()) => say(format_args!(
                "{me}: told the coordinator, node {}, why; it tells the other nodes",
                coord.id
            )),
            Err(e) if unheard(&e) => say(format_args!(
                "{me}: the coordinator, node {}, did not listen within {} s; not told",
                coord.id,
                REFUSAL_WINDOW.as_secs()
            )),
            Err(e) => say(format_args!(
                "{me}: could not tell the coordinator why: {}",
                channel_problem(e)
            )),
        }
        return;
    }
    say(format_args!(
        "{me}: telling the other nodes why as they join, for up to {} s (a signal ends it)",
        REFUSAL_WINDOW.as_secs()
    ));
    let ids: Vec<u32> = cfg.nodes.iter().map(|n| n.id).collect();
    let told = TcpListener::bind(addr)
        .map_err(ChannelError::Io)
        .and_then(|l| Rendezvous::turn_away(&l, &ids, &opts, REFUSAL_WINDOW, why));
    match told {
        Ok(()) => say(format_args!("{me}: told every other node")),
        Err(e) => say(format_args!("{me}: not told: {}", channel_problem(e))),
    }
}

fn run_node(o: &NodeOptions, cfg: &ClusterConfig, node: &NodeConfig) -> Result<u8, NodeError> {
    crate::node_mlx5::supported(cfg)?;
    let store = check_flags(o)?;
    if o.workload == Workload::Txn {
        return crate::node_txn::run(o, cfg, node, store);
    }
    if o.workload == Workload::Leases {
        let flags = store.expect("check_flags gives --workload leases its store flags");
        return crate::node_leases::run(o, cfg, node, flags);
    }
    let layout = check_run(o, cfg, node)?;
    let memory: Vec<&NodeConfig> = cfg.nodes.iter().filter(|n| n.roles.memory).collect();
    signals::install();
    if matches!(cfg.backend, Backend::Mlx5 { .. }) {
        return crate::node_mlx5::run(o, cfg, node, layout);
    }
    let me = format!("loch node {}", o.id);

    let (own, regions) = memory_role(o, cfg, node, &me)?;
    let (boot, rv, listener) = rendezvous(cfg, o.id, regions, workload_agreement(o, node))?;
    say(format_args!(
        "{me}: control channel: joined in {:.1} ms, exchange + barrier in {:.1} ms",
        boot.join_ns as f64 / 1e6,
        boot.exchange_ns as f64 / 1e6
    ));

    let code = if node.roles.compute {
        compute(o, cfg, node, &memory, own.as_ref(), &boot, rv, layout, &me)?
    } else if let Some(listener) = listener {
        // The coordinator: memory nodes outlive compute runs.
        serve_compute_runs(rv, cfg, o.id, listener, &boot.directory, &me)?;
        0
    } else {
        serve_memory(rv, cfg, &me)?;
        0
    };
    if own.is_some() {
        say(format_args!(
            "{me}: stopping; removing the memory node file"
        ));
    }
    drop(own);
    Ok(code)
}

/// Node `id`'s preflight, said in full when it fails.
pub(crate) fn preflight_passes(cfg: &ClusterConfig, id: u32) -> Result<(), NodeError> {
    let report = preflight::run(cfg, id, &Host::current(), PreflightOptions::default());
    if !report.passed() {
        say(format_args!("{}", report.to_string().trim_end()));
        return Err(failed(format!("node {id} failed its preflight")));
    }
    Ok(())
}

/// The checks before anything starts: the flags, the preflight, and
/// whether the memory nodes can hold the workload; the layout of their
/// memory.
fn check_run(o: &NodeOptions, cfg: &ClusterConfig, node: &NodeConfig) -> Result<Layout, NodeError> {
    preflight_passes(cfg, o.id)?;
    workload_fits(o, cfg, node)
}

/// The flags, as `loch node` and `loch check` both check them before
/// anything starts: `--seconds` for every workload (the machine workloads
/// run for it too); `--etcd` and `--lease-ms` for the machine workloads
/// that use them, whose checked store flags it returns (`--workload
/// leases` always has them, `txn` with `--etcd`); the tasks, the records
/// and the histogram's file for the verb and index workloads.
fn check_flags(o: &NodeOptions) -> Result<Option<StoreFlags>, NodeError> {
    if let Some(s) = o.seconds {
        if !(s > 0.0 && s <= 86_400.0) {
            return Err(NodeError::Usage(format!(
                "--seconds must be in (0, 86400], got {s}"
            )));
        }
    }
    if o.workload.machines() {
        // The failure-handling flags: the store's URL, the lease, and
        // what the machines agree on at "memory-ready".
        return match o.workload {
            Workload::Leases => store_flags(o, "leases").map(Some),
            _ if o.etcd.is_some() => store_flags(o, "txn").map(Some),
            _ => Ok(None),
        };
    }
    if o.tasks_per_core == 0 || o.tasks_per_core > TASKS_PER_CORE_MAX {
        return Err(NodeError::Usage(format!(
            "--tasks must be 1..={TASKS_PER_CORE_MAX}"
        )));
    }
    if o.records == 0 || o.records > RECORDS_MAX {
        return Err(NodeError::Usage(format!(
            "--records must be 1..={RECORDS_MAX}"
        )));
    }
    // Written after the run: a path that cannot become a file fails now.
    if let Some(p) = &o.histogram {
        cmdline::check_file_target("--histogram", p).map_err(NodeError::Usage)?;
    }
    Ok(None)
}

/// Whether the memory nodes can hold the verb areas of every core of the
/// cluster and, for an index workload on a compute node, the index's
/// chunks; the layout of their memory.
fn workload_fits(
    o: &NodeOptions,
    cfg: &ClusterConfig,
    node: &NodeConfig,
) -> Result<Layout, NodeError> {
    let memory: Vec<&NodeConfig> = cfg.nodes.iter().filter(|n| n.roles.memory).collect();
    let cores_total: usize = cfg.nodes.iter().map(|n| n.cores.len()).sum();
    let tasks_total = (cores_total * TASKS_PER_CORE_MAX) as u64;
    let need = node_work::host_bytes_needed(tasks_total);
    for m in &memory {
        memory_id(m)?;
        if m.memory_bytes < need {
            return Err(NodeError::Usage(format!(
                "node {} exports {} bytes; the workload of {cores_total} cores needs {need}",
                m.id, m.memory_bytes
            )));
        }
    }
    let min_memory = memory.iter().map(|m| m.memory_bytes).min().unwrap_or(0);
    let layout = Layout::new(min_memory, tasks_total).ok_or_else(|| {
        NodeError::Usage(format!(
            "the memory nodes need at least {need} bytes each for {cores_total} cores"
        ))
    })?;
    if let (true, Some(kind)) = (node.roles.compute, o.workload.index()) {
        let chunks = node_index::chunk_config(layout.index_bytes).chunks_on(0);
        if chunks < 4 {
            return Err(NodeError::Usage(format!(
                "the memory nodes leave {} bytes below the verb areas, {chunks} chunks of {} for the index; give them more memory",
                layout.index_bytes,
                node_index::CHUNK_BYTES
            )));
        }
        // Records that cannot fit are refused now, not by a load that
        // runs out of chunks part way. Tasks as this node runs them on
        // every core of the cluster (the hash table's clients each carve
        // a chunk on every memory node).
        let least = IndexLoad {
            sizes: o.sizes,
            records: o.records,
            tasks: (cores_total * o.tasks_per_core) as u64,
            memory_nodes: memory.len() as u64,
            chunk_bytes: node_index::CHUNK_BYTES,
        }
        .least(kind);
        if least > layout.index_bytes {
            return Err(NodeError::Usage(format!(
                "{} records of {}-byte keys and {}-byte values need at least {} MiB of each of the {} memory nodes for the index, and they leave {} MiB below the verb areas; give them more memory, load fewer records or run fewer --tasks",
                o.records,
                o.sizes.key_bytes(),
                o.sizes.value_bytes(),
                least.div_ceil(1 << 20),
                memory.len(),
                layout.index_bytes >> 20
            )));
        }
        if !memory.iter().any(|m| m.id == 0) {
            return Err(NodeError::Usage(
                "the index workloads need a memory node with id 0 (its superblock holds the index root)"
                    .into(),
            ));
        }
    }
    Ok(layout)
}

/// The emu memory role, when the node has it: its memory node created and
/// registered before the rendezvous (so the exchange's release means every
/// memory node is attachable), and the regions it publishes.
pub(crate) fn memory_role(
    o: &NodeOptions,
    cfg: &ClusterConfig,
    node: &NodeConfig,
    me: &str,
) -> Result<(Option<EmuNode>, Vec<Region>), NodeError> {
    let mut own = None;
    let mut regions = Vec::new();
    if node.roles.memory {
        let path = emu_node_path(cfg, o.id);
        let emu = EmuNode::create(&EmuNodeConfig {
            id: memory_id(node)?,
            host_bytes: node.memory_bytes,
            dm_bytes: cfg.lock_table_words.saturating_mul(8),
            backing: Backing::File(path.clone()),
        })
        .map_err(failed)?;
        // All of it now: a /dev/shm too small for it would otherwise kill
        // the loader with SIGBUS once the file outgrew it (the node's
        // drop removes the file).
        emu.reserve().map_err(|e| {
            NodeError::Usage(format!(
                "node {}: {e}: {} cannot hold the {} MiB this node exports (its `memory` \
                 and the lock table); lower them or grow that file system",
                o.id,
                cmdline::parent_dir(&path).display(),
                (node.memory_bytes + cfg.lock_table_words.saturating_mul(8)) >> 20
            ))
        })?;
        let (host, dm) = emu.register_all().map_err(failed)?;
        regions.push(Region {
            node_id: o.id,
            space: WireSpace::Host,
            base: 0,
            len: node.memory_bytes,
            rkey: host.0,
        });
        if let Some(dm) = dm {
            regions.push(Region {
                node_id: o.id,
                space: WireSpace::Device,
                base: 0,
                len: cfg.lock_table_words.saturating_mul(8),
                rkey: dm.0,
            });
        }
        say(format_args!(
            "{me}: memory role: {} MiB registered at {}",
            node.memory_bytes >> 20,
            path.display()
        ));
        own = Some(emu);
    }
    Ok((own, regions))
}

pub(crate) fn attach_all(
    cfg: &ClusterConfig,
    memory: &[&NodeConfig],
    own: Option<&EmuNode>,
    dir: &Directory,
) -> Result<Vec<EmuEndpoint>, NodeError> {
    let mut eps = Vec::with_capacity(memory.len());
    for m in memory {
        let ep = match own {
            Some(n) if n.id() as u32 == m.id => n.endpoint(),
            _ => EmuEndpoint::attach(emu_node_path(cfg, m.id)).map_err(failed)?,
        };
        // The published key must be the one the attached node holds: a
        // mismatch means we attached to some other cluster's file.
        let mut hosts = dir
            .regions
            .iter()
            .filter(|r| r.node_id == m.id && r.space == WireSpace::Host);
        let published = hosts
            .next()
            .ok_or_else(|| failed(format!("memory node {} published no region", m.id)))?;
        // A node's memory is one region: two records for it (one stale)
        // would have us check whichever came first.
        if hosts.next().is_some() {
            return Err(failed(format!(
                "memory node {} has more than one host region in the exchange",
                m.id
            )));
        }
        let held = ep.regions();
        if !held
            .iter()
            .any(|r| r.rkey.0 == published.rkey && r.len == published.len)
        {
            return Err(failed(format!(
                "memory node {}: the file at {} does not hold the region the node published (rkey {:#x})",
                m.id,
                emu_node_path(cfg, m.id).display(),
                published.rkey
            )));
        }
        eps.push(ep);
    }
    Ok(eps)
}

/// The compute role on emu: attach to every memory node by path, then run
/// [`node_compute::run`] over executors of the attached cluster.
#[allow(clippy::too_many_arguments)]
fn compute(
    o: &NodeOptions,
    cfg: &ClusterConfig,
    node: &NodeConfig,
    memory: &[&NodeConfig],
    own: Option<&EmuNode>,
    boot: &Boot,
    rv: Rendezvous,
    layout: Layout,
    me: &str,
) -> Result<u8, NodeError> {
    let eps = attach_all(cfg, memory, own, &boot.directory)?;
    let mem_ids: Vec<NodeId> = eps.iter().map(|e| e.node()).collect();
    let cluster = EmuCluster::attach(eps, EmuConfig::default());
    let c = Compute {
        o,
        cfg,
        node,
        layout,
        mem_ids,
        dm_bytes: cfg.lock_table_words.saturating_mul(8),
        backend: "emu",
        join_ns: boot.join_ns,
        exchange_ns: boot.exchange_ns,
        me,
    };
    node_compute::run(&c, &cluster, rv)
}

impl CoreSource<EmuNic> for EmuCluster {
    fn now_ns(&self) -> u64 {
        self.nic().now_ns()
    }

    fn executor(&self, _i: usize, cfg: ExecutorConfig) -> Result<Executor<EmuNic>, String> {
        EmuCluster::executor(self, cfg).map_err(|e| e.to_string())
    }

    fn liveness(&self) -> Box<dyn Fn(usize) -> bool> {
        // A dead node's owner process is gone: its endpoint says so.
        let eps = self.endpoints().to_vec();
        Box::new(move |i| eps[i].is_alive())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(args: &[&str]) -> Option<(PathBuf, u32)> {
        let argv: Vec<OsString> = std::iter::once("loch")
            .chain(args.iter().copied())
            .map(Into::into)
            .collect();
        node_named_by(&argv)
    }

    /// A coordinator that computed names the nodes it waits for from
    /// 3 s on, again when they change and at doubling gaps; one that did
    /// not counts from the first compute node done, and says nothing while
    /// every compute node still runs (only memory nodes arrived).
    #[test]
    fn compute_done_names_stragglers_only_after_the_first_run_ended() {
        let s = Duration::from_secs;
        let mut w = DoneWatch::new(&[0, 2, 3], true);
        let said: Vec<(u64, Option<String>)> = [
            (&[2, 3][..], 0),
            (&[2, 3], 2),
            (&[2, 3], 3),
            (&[2, 3], 4),
            (&[2], 5),
            (&[2], 64),
            (&[2], 65),
            (&[2], 184),
            (&[2], 185),
        ]
        .into_iter()
        .map(|(ids, t)| (t, w.seen(ids, s(t))))
        .collect();
        let spoke: Vec<u64> = said.iter().filter(|x| x.1.is_some()).map(|x| x.0).collect();
        // Each gap doubles from 30 s: 60 s after the change at 5 s, then
        // 120 s.
        assert_eq!(spoke, [3, 5, 65, 185], "{said:?}");
        assert_eq!(
            said[2].1.as_deref(),
            Some(
                "compute-done: 3 s after the first compute run ended, still waiting for nodes \
                 2, 3 (SIGINT/SIGTERM ends the wait)"
            )
        );
        assert!(said[4].1.as_deref().unwrap().contains("for node 2 ("));

        // A memory-only coordinator serving a run of compute nodes 2 and
        // 3 beside memory node 1: quiet while both run, however long.
        let mut w = DoneWatch::new(&[2, 3], false);
        assert_eq!(w.seen(&[1, 2, 3], s(0)), None);
        assert_eq!(w.seen(&[2, 3], s(0)), None);
        assert_eq!(w.seen(&[2, 3], s(600)), None);
        // Node 3 done at 600 s: node 2 is named 3 s later.
        assert_eq!(w.seen(&[2], s(600)), None);
        assert_eq!(w.seen(&[2], s(602)), None);
        let line = w.seen(&[2], s(603)).unwrap();
        assert!(line.starts_with("compute-done: 3 s after"), "{line}");
    }

    #[test]
    fn a_refused_command_line_names_its_node_where_it_can() {
        let at = |c: &str, id| Some((PathBuf::from(c), id));
        for (args, want) in [
            (
                &["node", "--config", "c.toml", "--id", "3", "--tasks", "x"][..],
                at("c.toml", 3),
            ),
            (
                &["node", "--tasks=x", "--id=7", "--config=a=b.toml"],
                at("a=b.toml", 7),
            ),
            (
                &["node", "--nope", "--id", "0", "--config", "c.toml"],
                at("c.toml", 0),
            ),
            // Not `loch node`, or no single node named.
            (&["check", "--config", "c.toml", "--id", "3"], None),
            (&["demo", "--id", "3"], None),
            (&["--config", "c.toml", "node", "--id", "3"], None),
            (&["node", "--config", "c.toml"], None),
            (&["node", "--id", "3", "--config"], None),
            (&["node", "--config", "c.toml", "--id", "three"], None),
            (&["node", "--config", "c.toml", "--id", "-1"], None),
            (
                &["node", "--config", "c.toml", "--id", "1", "--id", "2"],
                None,
            ),
            (
                &["node", "--config", "a", "--config", "b", "--id", "2"],
                None,
            ),
            (&["node", "--", "--config", "c.toml", "--id", "3"], None),
            (&["node"], None),
            (&[], None),
        ] {
            assert_eq!(named(args), want, "{args:?}");
        }
    }
}
