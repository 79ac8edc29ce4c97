//! `loch node --config F --id N`: boots one node of a cluster file on the
//! emu backend, and `loch check`, its preflight.
//!
//! Memory role: create the node's memory as an emu node file, register it,
//! publish its regions over the control channel, then stay out of the data
//! path (a 50 ms sleep loop) until SIGINT/SIGTERM, and remove the file.
//! Compute role: wait for the memory nodes (the exchange and the
//! "memory-ready" barrier), attach to every memory node by path, and run
//! one pinned executor per configured core with the `--workload`: the
//! verb mix of [`crate::node_work`], or an index ([`crate::node_index`]:
//! the lowest-id compute node creates and loads it, then every node meets
//! at the "index-ready" barrier, then each compute node opens it). Prints a
//! stats line per second (stderr: operations/s, p50/p99 latency, round
//! trips per operation and, for the tree, the index-cache hit ratio) and,
//! at the end, one JSON line (stdout) that `loch demo --processes` parses.
//!
//! Every node takes part in both barriers, so the control channel stays
//! open until "index-ready"; SIGINT/SIGTERM cancels any wait on it within
//! ~100 ms ([`bootstrap::channel::Cancel`]).
//!
//! Where a memory node's file lives is a function of the cluster file alone
//! ([`emu_node_path`]), so the wire format carries no path: compute nodes
//! derive it, attach, and check the attached node's registered regions
//! against the Region records the node published.

use crate::cluster::EmuCluster;
use crate::demo_tree::IndexKind;
use crate::node_index::{self, AnyIndex, IndexCoreState};
use crate::node_work::{self, unix_ns, CoreState, Layout, NodeTally, AREA_BYTES};
use crate::signals;
use crate::stats::latency_histogram;
use bootstrap::channel::{Cancel, ChannelError};
use bootstrap::config::{Backend, NodeConfig};
use bootstrap::preflight::{self, Host, PreflightOptions};
use bootstrap::wire::{Region, Space as WireSpace};
use bootstrap::{ChannelOptions, ClusterConfig, Directory, Rendezvous};
use hdrhistogram::Histogram;
use index::tree::TreeStats;
use nicdrv::emu::{Backing, EmuConfig, EmuEndpoint, EmuNode, EmuNodeConfig};
use nicdrv::rng::Rng;
use nicdrv::{ExecutorConfig, Nic, NodeId, VerbCounters};
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Task slots reserved per core in the memory layout, whatever `--tasks`
/// says, so every compute node computes the same areas.
pub const TASKS_PER_CORE_MAX: usize = 64;
/// How long a node waits for the whole cluster to join.
const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(30);
/// The barrier after which every compute node opens the index.
const INDEX_READY: &str = "index-ready";
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
}

impl Workload {
    pub fn parse(s: &str) -> Option<Workload> {
        match s {
            "verbs" => Some(Workload::Verbs),
            "tree" => Some(Workload::Tree),
            "hash" => Some(Workload::Hash),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Workload::Verbs => "verbs",
            Workload::Tree => "tree",
            Workload::Hash => "hash",
        }
    }

    fn index(self) -> Option<IndexKind> {
        match self {
            Workload::Verbs => None,
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

fn failed(e: impl std::fmt::Display) -> NodeError {
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
}

/// `loch check`: prints the preflight report of node `id`; Ok(passed).
pub fn check(config: &Path, id: u32) -> Result<bool, NodeError> {
    let cfg = ClusterConfig::load(config).map_err(|e| NodeError::Usage(e.to_string()))?;
    let report = preflight::run(&cfg, id, &Host::current(), PreflightOptions::default());
    print!("{report}");
    Ok(report.passed())
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
struct Boot {
    join_ns: u64,
    exchange_ns: u64,
    directory: Directory,
}

/// A failed step of the control channel; a cancelled wait says why.
fn channel_failed(what: &str, e: ChannelError) -> NodeError {
    match e {
        ChannelError::Cancelled => failed(format!(
            "{what}: stopped by SIGINT/SIGTERM while waiting for the other nodes"
        )),
        e => failed(format!("{what}: {e}")),
    }
}

/// Joins the cluster, exchanges regions and passes "memory-ready"; the
/// rendezvous stays open for the "index-ready" barrier.
fn rendezvous(
    cfg: &ClusterConfig,
    id: u32,
    regions: Vec<Region>,
) -> Result<(Boot, Rendezvous), NodeError> {
    let secret = cfg.secret().map_err(|e| NodeError::Usage(e.to_string()))?;
    let mut opts = ChannelOptions::new(id, secret);
    // A signal ends any wait on the channel (within its 100 ms poll).
    opts.cancel = Some(Cancel::new(signals::stop_requested));
    let coord = cfg.coordinator();
    let addr = resolve(&coord.address)?;
    let ids: Vec<u32> = cfg.nodes.iter().map(|n| n.id).collect();
    let t0 = Instant::now();
    let mut rv = if coord.id == id {
        let listener =
            TcpListener::bind(addr).map_err(|e| failed(format!("cannot listen on {addr}: {e}")))?;
        Rendezvous::coordinate(&listener, &ids, &opts, RENDEZVOUS_TIMEOUT)
    } else {
        Rendezvous::join(addr, coord.id, &opts, RENDEZVOUS_TIMEOUT)
    }
    .map_err(|e| channel_failed("rendezvous", e))?;
    let join_ns = t0.elapsed().as_nanos() as u64;
    let t1 = Instant::now();
    let directory = rv
        .exchange(&Directory {
            endpoints: Vec::new(),
            regions,
        })
        .map_err(|e| channel_failed("exchange", e))?;
    rv.barrier("memory-ready")
        .map_err(|e| channel_failed("barrier memory-ready", e))?;
    let exchange_ns = t1.elapsed().as_nanos() as u64;
    Ok((
        Boot {
            join_ns,
            exchange_ns,
            directory,
        },
        rv,
    ))
}

/// Waits at "index-ready" (every node does, whatever its role or
/// workload), then says goodbye on the control channel.
fn index_ready(mut rv: Rendezvous) -> Result<(), NodeError> {
    rv.barrier(INDEX_READY)
        .map_err(|e| channel_failed("barrier index-ready", e))?;
    rv.close();
    Ok(())
}

/// Runs `loch node`; returns the exit code (0: clean, 1: a failure seen).
pub fn run(o: &NodeOptions) -> Result<u8, NodeError> {
    let cfg = ClusterConfig::load(&o.config).map_err(|e| NodeError::Usage(e.to_string()))?;
    let Some(node) = cfg.node(o.id).cloned() else {
        return Err(NodeError::Usage(format!(
            "node {} is not in {}",
            o.id,
            o.config.display()
        )));
    };
    crate::node_mlx5::supported(&cfg)?;
    if o.tasks_per_core == 0 || o.tasks_per_core > TASKS_PER_CORE_MAX {
        return Err(NodeError::Usage(format!(
            "--tasks must be 1..={TASKS_PER_CORE_MAX}"
        )));
    }
    if let Some(s) = o.seconds {
        if !(s > 0.0 && s <= 86_400.0) {
            return Err(NodeError::Usage(format!(
                "--seconds must be in (0, 86400], got {s}"
            )));
        }
    }
    let report = preflight::run(&cfg, o.id, &Host::current(), PreflightOptions::default());
    if !report.passed() {
        say(format_args!("{}", report.to_string().trim_end()));
        return Err(failed(format!("node {} failed its preflight", o.id)));
    }
    if o.records == 0 || o.records > RECORDS_MAX {
        return Err(NodeError::Usage(format!(
            "--records must be 1..={RECORDS_MAX}"
        )));
    }
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
    if node.roles.compute && o.workload.index().is_some() {
        let chunks = node_index::chunk_config(layout.index_bytes).chunks_on(0);
        if chunks < 4 {
            return Err(NodeError::Usage(format!(
                "the memory nodes leave {} bytes below the verb areas, {chunks} chunks of {} for the index; give them more memory",
                layout.index_bytes,
                node_index::CHUNK_BYTES
            )));
        }
        if !memory.iter().any(|m| m.id == 0) {
            return Err(NodeError::Usage(
                "the index workloads need a memory node with id 0 (its superblock holds the index root)"
                    .into(),
            ));
        }
    }
    signals::install();
    if matches!(cfg.backend, Backend::Mlx5 { .. }) {
        return crate::node_mlx5::run(o, &cfg, &node, layout.areas_off);
    }
    let me = format!("loch node {}", o.id);

    // Memory role: create and register before the rendezvous, so the
    // exchange's release means every memory node is attachable.
    let mut own = None;
    let mut regions = Vec::new();
    if node.roles.memory {
        let path = emu_node_path(&cfg, o.id);
        let emu = EmuNode::create(&EmuNodeConfig {
            id: memory_id(&node)?,
            host_bytes: node.memory_bytes,
            dm_bytes: cfg.lock_table_words.saturating_mul(8),
            backing: Backing::File(path.clone()),
        })
        .map_err(failed)?;
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
    let (boot, rv) = rendezvous(&cfg, o.id, regions)?;
    say(format_args!(
        "{me}: control channel: joined in {:.1} ms, exchange + barrier in {:.1} ms",
        boot.join_ns as f64 / 1e6,
        boot.exchange_ns as f64 / 1e6
    ));

    let code = if node.roles.compute {
        compute(
            o,
            &cfg,
            &node,
            &memory,
            own.as_ref(),
            &boot,
            rv,
            layout,
            &me,
        )?
    } else {
        index_ready(rv)?;
        // Out of the data path: the NIC (here, the attachers) does the work.
        while !signals::stop_requested() {
            std::thread::sleep(Duration::from_millis(50));
        }
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

/// What one core returns.
struct CoreResult {
    hist: Histogram<u64>,
    ops: u64,
    mismatches: u64,
    first_op_unix_ns: u64,
    nodes: Vec<NodeTally>,
    counters: VerbCounters,
    /// Index workloads: failed operations, the first error, the counters.
    failures: u64,
    first_error: Option<String>,
    tree: TreeStats,
}

/// Published by the cores for the per-second line.
struct Live {
    ops: Vec<AtomicU64>,
    round_trips: Vec<AtomicU64>,
    cache_hits: Vec<AtomicU64>,
    cache_misses: Vec<AtomicU64>,
    interval: Mutex<Histogram<u64>>,
    finished: AtomicUsize,
}

fn attach_all(
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
        let published = dir
            .regions
            .iter()
            .find(|r| r.node_id == m.id && r.space == WireSpace::Host)
            .ok_or_else(|| failed(format!("memory node {} published no region", m.id)))?;
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

/// The lowest-id compute node creates the index and loads it, on one
/// executor of this thread; returns how long that took.
fn load_index(
    cluster: &EmuCluster,
    index: &AnyIndex,
    records: u64,
    me: &str,
) -> Result<u64, NodeError> {
    let t0 = Instant::now();
    let mut ex = cluster
        .executor(ExecutorConfig {
            slots: 1,
            scratch_bytes_per_slot: 64 << 10,
            poll_batch: 32,
        })
        .map_err(failed)?;
    let err = std::rc::Rc::new(std::cell::RefCell::new(None));
    let (ix, e) = (index.clone(), err.clone());
    ex.spawn(move |ctx| crate::demo_tree::load(ctx, ix, records, e))
        .map_err(failed)?;
    ex.run();
    if let Some(e) = err.borrow_mut().take() {
        return Err(failed(format!("loading the index failed: {e}")));
    }
    let ns = t0.elapsed().as_nanos() as u64;
    say(format_args!(
        "{me}: created the {} and loaded {records} records in {:.1} ms",
        if index.is_hash() {
            "hash table"
        } else {
            "B+tree"
        },
        ns as f64 / 1e6
    ));
    Ok(ns)
}

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
    // This node's first task slot in the layout: cores of lower ids first.
    let first_core: usize = cfg
        .nodes
        .iter()
        .take_while(|n| n.id != node.id)
        .map(|n| n.cores.len())
        .sum();
    let cores_total: usize = cfg.nodes.iter().map(|n| n.cores.len()).sum();
    // The index, when the workload has one: the lowest-id compute node
    // loads it before "index-ready"; the others open it after.
    let index = match o.workload.index() {
        Some(kind) => Some(
            node_index::handle(
                kind,
                layout.index_bytes,
                o.records,
                (cores_total * TASKS_PER_CORE_MAX) as u64,
                cfg.lock_table_words.saturating_mul(8),
            )
            .map_err(|e| NodeError::Usage(format!("index configuration: {e}")))?,
        ),
        None => None,
    };
    let loader = cfg.nodes.iter().find(|n| n.roles.compute).map(|n| n.id) == Some(node.id);
    let load_ns = match &index {
        Some(ix) if loader => load_index(&cluster, ix, o.records, me)?,
        _ => 0,
    };
    index_ready(rv)?;

    let exec_cfg = ExecutorConfig {
        slots: o.tasks_per_core,
        scratch_bytes_per_slot: if index.is_some() { 64 << 10 } else { 4096 },
        poll_batch: 32,
    };
    let cores = node.cores.len();
    let counters_of = || (0..cores).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
    let live = Live {
        ops: counters_of(),
        round_trips: counters_of(),
        cache_hits: counters_of(),
        cache_misses: counters_of(),
        interval: Mutex::new(latency_histogram()),
        finished: AtomicUsize::new(0),
    };
    let deadline_ns = match o.seconds {
        Some(s) => cluster.nic().now_ns() + (s * 1e9) as u64,
        None => u64::MAX,
    };
    let start_unix_ns = unix_ns();
    let started = Instant::now();
    say(format_args!(
        "{me}: compute role: {} workload, {cores} cores × {} tasks over memory nodes {mem_ids:?}",
        o.workload.name(),
        o.tasks_per_core
    ));

    let results: Vec<Result<CoreResult, String>> = std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(cores);
        for (i, &cpu) in node.cores.iter().enumerate() {
            let (cluster, live, mem_ids, index) = (&cluster, &live, &mem_ids, &index);
            let core = CoreArgs {
                i,
                cpu,
                first_slot: (first_core + i) * TASKS_PER_CORE_MAX,
                exec_cfg,
                deadline_ns,
            };
            let spawned = std::thread::Builder::new()
                .name(format!("loch-core-{cpu}"))
                .spawn_scoped(s, move || {
                    let r = match index {
                        Some(ix) => index_core_loop(cluster, live, &core, ix, o, me),
                        None => core_loop(cluster, live, &core, mem_ids, layout, o, me),
                    };
                    // Release: the core's last published counters are
                    // visible to the report loop that sees it finished.
                    live.finished.fetch_add(1, Ordering::Release);
                    r
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // Stop the cores already running, then report.
                    signals::request_stop();
                    live.finished.fetch_add(cores - i, Ordering::Release);
                    log::error!("cannot start core thread: {e}");
                    break;
                }
            }
        }
        report_loop(
            &live,
            cores,
            index.as_ref().is_some_and(|ix| !ix.is_hash()),
            me,
        );
        let spawned = handles.len();
        let mut out: Vec<Result<CoreResult, String>> = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a core thread panicked".into()))
            })
            .collect();
        if spawned < cores {
            out.push(Err("could not start every core thread".into()));
        }
        out
    });
    let elapsed_ns = started.elapsed().as_nanos() as u64;

    let mut hist = latency_histogram();
    let mut counters = VerbCounters::default();
    let mut tree = TreeStats::default();
    let (mut ops, mut mismatches, mut first_op) = (0u64, 0u64, u64::MAX);
    let mut index_failures = 0u64;
    let mut nodes: Vec<NodeTally> = mem_ids
        .iter()
        .map(|&node| NodeTally {
            node,
            ..Default::default()
        })
        .collect();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(c) => {
                let _ = hist.add(&c.hist);
                counters += c.counters;
                tree += c.tree;
                ops += c.ops;
                mismatches += c.mismatches;
                index_failures += c.failures;
                errors.extend(c.first_error);
                if c.first_op_unix_ns != 0 {
                    first_op = first_op.min(c.first_op_unix_ns);
                }
                for (acc, t) in nodes.iter_mut().zip(c.nodes) {
                    acc.ops += t.ops;
                    acc.faa += t.faa;
                    acc.failures += t.failures;
                    if t.first_failure_unix_ns != 0
                        && (acc.first_failure_unix_ns == 0
                            || t.first_failure_unix_ns < acc.first_failure_unix_ns)
                    {
                        acc.first_failure_unix_ns = t.first_failure_unix_ns;
                        acc.first_error = t.first_error;
                    }
                    acc.dead |= t.dead;
                }
            }
            Err(e) => errors.push(e),
        }
    }
    if index.is_some() {
        // The index spreads over the memory nodes: no per-node tally.
        nodes.clear();
    }
    let failures: u64 = nodes.iter().map(|n| n.failures).sum::<u64>() + index_failures;
    let per_op = |v: u64| if ops == 0 { 0.0 } else { v as f64 / ops as f64 };
    let lookups = tree.cache_hits + tree.cache_misses;
    let hit_ratio = if lookups == 0 {
        0.0
    } else {
        tree.cache_hits as f64 / lookups as f64
    };
    let json = serde_json::json!({
        "node": node.id,
        "workload": o.workload.name(),
        "records": if index.is_some() { o.records } else { 0 },
        "ops": ops,
        "elapsed_ns": elapsed_ns,
        "ops_per_sec": if elapsed_ns == 0 { 0.0 } else { ops as f64 * 1e9 / elapsed_ns as f64 },
        "p50_ns": hist.value_at_quantile(0.5),
        "p99_ns": hist.value_at_quantile(0.99),
        "round_trips": counters.round_trips,
        "round_trips_per_op": per_op(counters.round_trips),
        "bytes_read": counters.bytes_read,
        "bytes_written": counters.bytes_written,
        "verbs": counters.verbs(),
        "cache_hits": tree.cache_hits,
        "cache_misses": tree.cache_misses,
        "cache_hit_ratio": hit_ratio,
        "splits": tree.splits,
        "handovers": tree.handovers,
        "read_retries": tree.read_retries,
        "index_load_ns": load_ns,
        "mismatches": mismatches,
        "failures": failures,
        "errors": errors,
        "start_unix_ns": start_unix_ns,
        "first_op_unix_ns": if first_op == u64::MAX { 0 } else { first_op },
        "join_ns": boot.join_ns,
        "exchange_ns": boot.exchange_ns,
        "cores": cores,
        "per_node": nodes.iter().map(|n| serde_json::json!({
            "node": n.node,
            "ops": n.ops,
            "faa": n.faa,
            "failures": n.failures,
            "first_failure_unix_ns": n.first_failure_unix_ns,
            "error": n.first_error,
            "dead": n.dead,
        })).collect::<Vec<_>>(),
        "latency_ns": hist.iter_recorded().map(|v| [v.value_iterated_to(), v.count_at_value()]).collect::<Vec<_>>(),
    });
    println!("{json}");
    say(format_args!(
        "{me}: done: {ops} operations in {:.2} s, {failures} failed, {mismatches} mismatched reads",
        elapsed_ns as f64 / 1e9
    ));
    for e in &errors {
        say(format_args!("{me}: error: {e}"));
    }
    Ok(if failures == 0 && mismatches == 0 && errors.is_empty() {
        0
    } else {
        1
    })
}

/// What one core thread is told.
struct CoreArgs {
    /// Index among this node's cores.
    i: usize,
    cpu: u32,
    /// The cluster-wide slot of its first task.
    first_slot: usize,
    exec_cfg: ExecutorConfig,
    deadline_ns: u64,
}

fn core_loop(
    cluster: &EmuCluster,
    live: &Live,
    core: &CoreArgs,
    mem_ids: &[NodeId],
    layout: Layout,
    o: &NodeOptions,
    me: &str,
) -> Result<CoreResult, String> {
    let (i, first_slot, deadline_ns) = (core.i, core.first_slot, core.deadline_ns);
    pin(o, core);
    let mut ex = cluster.executor(core.exec_cfg).map_err(|e| e.to_string())?;
    let eps = cluster.endpoints().to_vec();
    let st = CoreState::new(
        mem_ids,
        Box::new(move |i| eps[i].is_alive()),
        me.to_string(),
    );
    let mut seeds =
        Rng::new(o.seed ^ ((first_slot as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    for t in 0..o.tasks_per_core {
        let area = layout.areas_off + (first_slot + t) as u64 * AREA_BYTES;
        let (nodes, rng, st2) = (mem_ids.to_vec(), seeds.fork(), st.clone());
        ex.spawn(move |ctx| {
            node_work::task(
                ctx,
                nodes,
                area,
                rng,
                deadline_ns,
                signals::stop_requested,
                st2,
            )
        })
        .map_err(|e| e.to_string())?;
    }
    let publish = |ex: &nicdrv::Executor<nicdrv::emu::EmuNic>| {
        // Relaxed: counters for display; the Mutex orders the histogram.
        live.ops[i].store(st.ops.get(), Ordering::Relaxed);
        live.round_trips[i].store(ex.counters().round_trips, Ordering::Relaxed);
        let mut iv = st.interval.borrow_mut();
        if let Ok(mut h) = live.interval.lock() {
            let _ = h.add(&*iv);
        }
        iv.reset();
    };
    let mut last = Instant::now();
    while ex.live_tasks() > 0 {
        ex.turn();
        if ex.turns().is_multiple_of(256) && last.elapsed() >= Duration::from_millis(100) {
            publish(&ex);
            last = Instant::now();
        }
    }
    publish(&ex);
    let hist = st.hist.borrow().clone();
    let nodes = st.nodes.borrow().clone();
    Ok(CoreResult {
        hist,
        ops: st.ops.get(),
        mismatches: st.mismatches.get(),
        first_op_unix_ns: st.first_op_unix_ns.get(),
        nodes,
        counters: ex.counters(),
        failures: 0,
        first_error: None,
        tree: TreeStats::default(),
    })
}

fn pin(o: &NodeOptions, core: &CoreArgs) {
    if o.pin && !nicdrv::exec::pin_current_thread(core.cpu as usize) {
        log::warn!("could not pin core thread {} to CPU {}", core.i, core.cpu);
    }
}

/// One core of an index workload: `tasks_per_core` clients of `index`.
fn index_core_loop(
    cluster: &EmuCluster,
    live: &Live,
    core: &CoreArgs,
    index: &AnyIndex,
    o: &NodeOptions,
    me: &str,
) -> Result<CoreResult, String> {
    let (i, first_slot) = (core.i, core.first_slot);
    pin(o, core);
    let mut ex = cluster.executor(core.exec_cfg).map_err(|e| e.to_string())?;
    let st = IndexCoreState::new();
    let mut seeds =
        Rng::new(o.seed ^ ((first_slot as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    for t in 0..o.tasks_per_core {
        // Cluster-wide, non-zero, unique: it marks the tree's locks and
        // picks the task's own keys.
        let id = (first_slot + t) as u64 + 1;
        let c = index
            .client(id)
            .map_err(|e| format!("{me}: index client: {e}"))?;
        let (rng, st2, records) = (seeds.fork(), st.clone(), o.records);
        let deadline_ns = core.deadline_ns;
        ex.spawn(move |ctx| {
            node_index::task(
                ctx,
                c,
                id,
                rng,
                records,
                deadline_ns,
                signals::stop_requested,
                st2,
            )
        })
        .map_err(|e| e.to_string())?;
    }
    let publish = |ex: &nicdrv::Executor<nicdrv::emu::EmuNic>| {
        // Relaxed: counters for display; the Mutex orders the histogram.
        live.ops[i].store(st.ops.get(), Ordering::Relaxed);
        live.round_trips[i].store(ex.counters().round_trips, Ordering::Relaxed);
        let t = st.tree.get();
        live.cache_hits[i].store(t.cache_hits, Ordering::Relaxed);
        live.cache_misses[i].store(t.cache_misses, Ordering::Relaxed);
        let mut iv = st.interval.borrow_mut();
        if let Ok(mut h) = live.interval.lock() {
            let _ = h.add(&*iv);
        }
        iv.reset();
    };
    let mut last = Instant::now();
    while ex.live_tasks() > 0 {
        ex.turn();
        if ex.turns().is_multiple_of(256) && last.elapsed() >= Duration::from_millis(100) {
            publish(&ex);
            last = Instant::now();
        }
    }
    publish(&ex);
    let hist = st.hist.borrow().clone();
    let first_error = st.first_error.borrow_mut().take();
    Ok(CoreResult {
        hist,
        ops: st.ops.get(),
        mismatches: st.mismatches.get(),
        first_op_unix_ns: st.first_op_unix_ns.get(),
        nodes: Vec::new(),
        counters: ex.counters(),
        failures: st.failures.get(),
        first_error,
        tree: st.tree.get(),
    })
}

/// Prints a stats line per second until every core finished; `cache`:
/// with the index cache's hit ratio over the second.
fn report_loop(live: &Live, cores: usize, cache: bool, me: &str) {
    let t0 = Instant::now();
    let (mut last_ops, mut last_rt, mut tick) = (0u64, 0u64, 1u64);
    let (mut last_hits, mut last_misses) = (0u64, 0u64);
    let sum = |v: &[AtomicU64]| v.iter().map(|a| a.load(Ordering::Relaxed)).sum::<u64>();
    while live.finished.load(Ordering::Acquire) < cores {
        std::thread::sleep(Duration::from_millis(20));
        if t0.elapsed() < Duration::from_secs(tick) {
            continue;
        }
        let ops: u64 = live.ops.iter().map(|a| a.load(Ordering::Relaxed)).sum();
        let rt: u64 = live
            .round_trips
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .sum();
        let (p50, p99) = match live.interval.lock() {
            Ok(mut h) => {
                let q = (h.value_at_quantile(0.5), h.value_at_quantile(0.99));
                h.reset();
                q
            }
            Err(_) => (0, 0),
        };
        let d_ops = ops.saturating_sub(last_ops);
        let rt_per_op = if d_ops == 0 {
            0.0
        } else {
            rt.saturating_sub(last_rt) as f64 / d_ops as f64
        };
        let cache_part = if cache {
            let (hits, misses) = (sum(&live.cache_hits), sum(&live.cache_misses));
            let (dh, dm) = (
                hits.saturating_sub(last_hits),
                misses.saturating_sub(last_misses),
            );
            (last_hits, last_misses) = (hits, misses);
            let ratio = if dh + dm == 0 {
                0.0
            } else {
                dh as f64 / (dh + dm) as f64
            };
            format!("  cache hit ratio {ratio:.4}")
        } else {
            String::new()
        };
        say(format_args!(
            "{me}: t={tick}s  {d_ops:>9} ops/s  p50 {p50} ns  p99 {p99} ns  {rt_per_op:.2} round trips/op{cache_part}"
        ));
        (last_ops, last_rt, tick) = (ops, rt, tick + 1);
    }
}
