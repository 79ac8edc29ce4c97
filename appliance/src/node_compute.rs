//! The compute role of `loch node`, on any NIC backend: one pinned
//! executor per configured core running the `--workload` (the verb mix of
//! [`crate::node_work`] or an index of [`crate::node_index`]), a stats line
//! per second (stderr) and the final JSON line (stdout). The backend boots
//! the node — emu in [`crate::node`], mlx5 in [`crate::node_mlx5`] — and
//! hands over a [`CoreSource`], which makes each core's executor on that
//! core's own thread, and the control channel, past "memory-ready".
//!
//! Order of events, the same on every backend, so every node of a cluster
//! meets the same barriers in the same order:
//! 1. each core thread pins itself and makes its executor;
//! 2. for an index workload on the lowest-id compute node, core 0 creates
//!    and loads the index on its own executor — on mlx5 a core's queue
//!    pairs are the node's only way to the memory nodes, so the loader
//!    borrows core 0's rather than making its own; its verbs are left out
//!    of the core's counters;
//! 3. the node meets the others at "index-ready" and closes the channel
//!    (where a node both holds memory and computes it keeps it, for
//!    "compute-done" after its run: [`crate::node::compute_done`]);
//! 4. the cores, held at a [`Gate`] until then, start their tasks with the
//!    deadline taken after the barrier.
//!
//! A failure before step 4 (a core without an executor, a failed load, a
//! barrier cut short by SIGINT/SIGTERM) shuts the gate: the cores end
//! without running a task and the node fails with the reason.

use crate::index_work::{clear_index_memory, Chunks};
use crate::node::{
    compute_done, index_ready, index_ready_keeping, say, shared_nodes, NodeError, NodeOptions,
    TASKS_PER_CORE_MAX,
};
use crate::node_index::{self, AnyIndex, IndexCoreState};
use crate::node_work::{self, CoreState, Layout, NodeTally, AREA_BYTES};
use crate::stats::OpTally;
use bootstrap::config::NodeConfig;
use bootstrap::{ClusterConfig, Rendezvous};
use cluster::cores::{run_threads_with, Ended, Pinning};
use cluster::stats::latency_histogram;
use cmdline::signals;
use hdrhistogram::Histogram;
use index::tree::TreeStats;
use nicdrv::clock::unix_ns;
use nicdrv::rng::{Domain, Rng};
use nicdrv::{Executor, ExecutorConfig, Nic, NodeId, VerbCounters};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A backend's compute side, as the core threads use it.
pub trait CoreSource<N: Nic>: Sync {
    /// The clock the executors read; the deadline is on it.
    fn now_ns(&self) -> u64;
    /// Called once per core, on core `i`'s own (pinned) thread: its
    /// executor, with one queue pair to each memory node.
    fn executor(&self, i: usize, cfg: ExecutorConfig) -> Result<Executor<N>, String>;
    /// Called on each core's thread: whether memory node `idx` (an index
    /// into [`Compute::mem_ids`]) still has a live owner, asked once an
    /// operation on it failed.
    fn liveness(&self) -> Box<dyn Fn(usize) -> bool>;
}

/// The executor of every compute core (core 0's also loads the index):
/// index workloads need more scratch per task than the verb mix.
pub fn exec_config(o: &NodeOptions) -> ExecutorConfig {
    ExecutorConfig {
        slots: o.tasks_per_core,
        scratch_bytes_per_slot: if o.workload.index().is_some() {
            o.sizes.scratch_bytes_per_slot()
        } else {
            4096
        },
        poll_batch: 32,
    }
}

/// What the compute role runs with: the flags, the cluster file, and what
/// the backend's boot found.
pub struct Compute<'a> {
    pub o: &'a NodeOptions,
    pub cfg: &'a ClusterConfig,
    pub node: &'a NodeConfig,
    pub layout: Layout,
    /// The memory nodes, in the order [`CoreSource::liveness`] counts them.
    pub mem_ids: Vec<NodeId>,
    /// Bytes of lock table (device memory) every memory node offers the
    /// index's global locks.
    pub dm_bytes: u64,
    /// The backend's name, for the JSON line.
    pub backend: &'static str,
    /// Time to join the cluster, and to exchange what the backend needs
    /// and pass "memory-ready".
    pub join_ns: u64,
    pub exchange_ns: u64,
    /// Prefix of every log line (`loch node N`).
    pub me: &'a str,
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
}

impl Live {
    fn new(cores: usize) -> Live {
        let counters = || (0..cores).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        Live {
            ops: counters(),
            round_trips: counters(),
            cache_hits: counters(),
            cache_misses: counters(),
            interval: Mutex::new(latency_histogram()),
        }
    }
}

/// Holds the cores between making their executors and starting their
/// tasks: opened once with the deadline, or shut; the first word counts.
pub struct Gate {
    /// `None` while closed; then `Some(Some(deadline_ns))` or `Some(None)`.
    state: Mutex<Option<Option<u64>>>,
    cv: Condvar,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            state: Mutex::new(None),
            cv: Condvar::new(),
        }
    }
}

impl Gate {
    fn lock(&self) -> MutexGuard<'_, Option<Option<u64>>> {
        // The state is one word: a panic elsewhere cannot leave it torn.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set(&self, v: Option<u64>) {
        let mut s = self.lock();
        if s.is_none() {
            *s = Some(v);
        }
        self.cv.notify_all();
    }

    /// Lets every core start, with this deadline (NIC clock).
    pub fn open(&self, deadline_ns: u64) {
        self.set(Some(deadline_ns));
    }

    /// Ends every core without a task.
    pub fn shut(&self) {
        self.set(None);
    }

    /// Blocks until the gate is opened (the deadline) or shut (`None`).
    pub fn wait(&self) -> Option<u64> {
        let mut s = self.lock();
        loop {
            if let Some(v) = *s {
                return v;
            }
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// What one core thread is told.
struct CoreArgs {
    /// Index among this node's cores.
    i: usize,
    /// The cluster-wide slot of its first task.
    first_slot: usize,
    exec_cfg: ExecutorConfig,
}

/// What the core threads returned, and the figures around them.
struct Run {
    results: Vec<Result<CoreResult, String>>,
    load_ns: u64,
    start_unix_ns: u64,
    elapsed_ns: u64,
}

/// This node's first core in the cluster's numbering (cores of nodes with
/// lower ids first; task slots follow it), and the cluster's core count.
fn core_offsets(cfg: &ClusterConfig, me: u32) -> (usize, usize) {
    let first = cfg
        .nodes
        .iter()
        .take_while(|n| n.id != me)
        .map(|n| n.cores.len())
        .sum();
    (first, cfg.nodes.iter().map(|n| n.cores.len()).sum())
}

/// Runs the compute role (module docs) over `src`; `rv` has passed
/// "memory-ready". Returns the exit code: 0 clean, 1 a failure seen.
pub fn run<N: Nic, S: CoreSource<N>>(
    c: &Compute<'_>,
    src: &S,
    rv: Rendezvous,
) -> Result<u8, NodeError> {
    let (o, cfg, node, me) = (c.o, c.cfg, c.node, c.me);
    let (first_core, cores_total) = core_offsets(cfg, node.id);
    // The index, when the workload has one: the lowest-id compute node
    // loads it before "index-ready"; the others open it after.
    let index = o
        .workload
        .index()
        .map(|kind| {
            node_index::handle(
                kind,
                &o.tree,
                c.layout.index_bytes,
                o.sizes,
                o.records,
                (cores_total * TASKS_PER_CORE_MAX) as u64,
                c.dm_bytes,
            )
            .map_err(|e| NodeError::Usage(format!("index configuration: {e}")))
        })
        .transpose()?;
    let loader = cfg.nodes.iter().find(|n| n.roles.compute).map(|n| n.id) == Some(node.id);
    let cores = node.cores.len();
    let live = Live::new(cores);
    let gate = Gate::default();
    let (load_tx, load_rx) = mpsc::channel();
    // Core 0 takes the sender when this node loads the index.
    let load_tx = Mutex::new((loader && index.is_some()).then_some(load_tx));
    let cpus: Vec<usize> = node.cores.iter().map(|&c| c as usize).collect();
    let pin = if o.pin {
        Pinning::Cpus(&cpus)
    } else {
        Pinning::None
    };
    let per_core = |i: usize| {
        let core = CoreArgs {
            i,
            first_slot: (first_core + i) * TASKS_PER_CORE_MAX,
            exec_cfg: exec_config(o),
        };
        let load = if i == 0 {
            load_tx.lock().ok().and_then(|mut tx| tx.take())
        } else {
            None
        };
        core_main(src, c, &live, &core, index.as_ref(), &gate, load)
    };
    // The cores wait at the gate until this has loaded the index (on core
    // 0) and met the other nodes; a failure shuts the gate. The control
    // channel is kept for "compute-done" where a node both holds memory
    // and computes.
    let keep = shared_nodes(cfg);
    let meanwhile = |started: Result<(), String>, ended: &Ended| -> Result<Started, NodeError> {
        let shut = |e: NodeError| {
            gate.shut();
            e
        };
        started.map_err(|e| shut(NodeError::Failed(e)))?;
        let load_ns = match &index {
            Some(ix) if loader => loaded(ix, &load_rx, o.records, me).map_err(shut)?,
            _ => 0,
        };
        let kept = if keep {
            let mut rv = rv;
            index_ready_keeping(&mut rv).map_err(shut)?;
            Some(rv)
        } else {
            index_ready(rv).map_err(shut)?;
            None
        };
        let deadline_ns = match o.seconds {
            Some(secs) => src.now_ns() + (secs * 1e9) as u64,
            None => u64::MAX,
        };
        let start_unix_ns = unix_ns();
        let started = Instant::now();
        say(format_args!(
            "{me}: compute role: {} workload, {cores} cores × {} tasks over memory nodes {:?}",
            o.workload.name(),
            o.tasks_per_core,
            c.mem_ids
        ));
        gate.open(deadline_ns);
        // Waits on the cores' end count, which counts a panicked core
        // too (its join, after, reports it).
        report_loop(
            &live,
            ended,
            cores,
            index.as_ref().is_some_and(|ix| !ix.is_hash()),
            me,
        );
        Ok((load_ns, start_unix_ns, started, kept))
    };
    let (ran, results) = run_threads_with(cores, pin, per_core, meanwhile);
    let (load_ns, start_unix_ns, started, kept) = ran?;
    let run = Run {
        results: results
            .into_iter()
            .map(|r| r.unwrap_or_else(|_| Err("a core thread panicked".into())))
            .collect(),
        load_ns,
        start_unix_ns,
        elapsed_ns: started.elapsed().as_nanos() as u64,
    };
    let code = report(c, index.is_some(), run);
    if let Some(rv) = kept {
        if node.roles.memory {
            say(format_args!(
                "{me}: compute run done; this node's memory stays until every compute node is done"
            ));
        }
        let computing = crate::node::compute_done_of(cfg).unwrap_or_default();
        compute_done(rv, me, node.roles.memory, &computing);
    }
    Ok(code)
}

/// What the compute role's main thread returns once the cores started:
/// the load's and the start's times, and the control channel where it is
/// kept for "compute-done".
type Started = (u64, u64, Instant, Option<Rendezvous>);

/// Core 0's answer to the load: how long it took, or why it failed.
fn loaded(
    ix: &AnyIndex,
    rx: &mpsc::Receiver<Result<u64, String>>,
    records: u64,
    me: &str,
) -> Result<u64, NodeError> {
    match rx.recv() {
        Ok(Ok(ns)) => {
            say(format_args!(
                "{me}: created the {} and loaded {records} records in {:.1} ms",
                if ix.is_hash() { "hash table" } else { "B+tree" },
                ns as f64 / 1e6
            ));
            Ok(ns)
        }
        Ok(Err(e)) => Err(NodeError::Failed(e)),
        Err(_) => Err(NodeError::Failed(
            "core 0 ended before loading the index".into(),
        )),
    }
}

/// One core's thread (pinned by then): make the executor, load the index if told to
/// (`load`), wait at the gate, run the workload.
fn core_main<N: Nic, S: CoreSource<N>>(
    src: &S,
    c: &Compute<'_>,
    live: &Live,
    core: &CoreArgs,
    index: Option<&AnyIndex>,
    gate: &Gate,
    load: Option<mpsc::Sender<Result<u64, String>>>,
) -> Result<CoreResult, String> {
    let o = c.o;
    let mut made = src
        .executor(core.i, core.exec_cfg)
        .map_err(|e| format!("core {}: {e}", core.i));
    if let Some(tx) = load {
        // The main thread waits for this answer before "index-ready".
        let answer = match (made.as_mut(), index) {
            (Err(e), _) => Err(e.clone()),
            (Ok(_), None) => Ok(0),
            (Ok(ex), Some(ix)) => load_index(
                ex,
                ix,
                o.records,
                &c.mem_ids,
                c.layout.index_bytes,
                c.dm_bytes,
            ),
        };
        let _ = tx.send(answer);
    }
    let mut ex = made?;
    let Some(deadline_ns) = gate.wait() else {
        return Err(format!("core {}: stopped before the workload", core.i));
    };
    // The load's verbs are not the workload's.
    let base = ex.counters();
    // Slots are numbered across the cluster, so the first one names the core.
    let mut seeds = Rng::stream(o.seed, Domain::Core, core.first_slot as u64);
    let spawn_err = |e: nicdrv::ExecError| format!("core {}: {e}", core.i);
    match index {
        None => {
            let st = CoreState::new(&c.mem_ids, src.liveness(), c.me.to_string());
            for t in 0..o.tasks_per_core {
                let area = c.layout.areas_off + (core.first_slot + t) as u64 * AREA_BYTES;
                let (nodes, rng, st2) = (c.mem_ids.clone(), seeds.fork(), st.clone());
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
                .map_err(spawn_err)?;
            }
            Ok(drive(&mut ex, &*st, live, core.i, base))
        }
        Some(ix) => {
            let st = IndexCoreState::new();
            for t in 0..o.tasks_per_core {
                // Cluster-wide, non-zero, unique: it marks the tree's
                // locks and picks the task's own keys.
                let id = (core.first_slot + t) as u64 + 1;
                let client = ix
                    .client(id)
                    .map_err(|e| format!("{}: index client: {e}", c.me))?;
                let (rng, st2, records) = (seeds.fork(), st.clone(), o.records);
                ex.spawn(move |ctx| {
                    node_index::task(
                        ctx,
                        client,
                        id,
                        rng,
                        records,
                        deadline_ns,
                        signals::stop_requested,
                        st2,
                    )
                })
                .map_err(spawn_err)?;
            }
            Ok(drive(&mut ex, &*st, live, core.i, base))
        }
    }
}

/// Creates the index and loads `records` records on `ex` (one task);
/// returns how long that took. `dm_bytes`: the lock table's bytes on
/// every memory node.
fn load_index<N: Nic>(
    ex: &mut Executor<N>,
    index: &AnyIndex,
    records: u64,
    memory: &[NodeId],
    index_bytes: u64,
    dm_bytes: u64,
) -> Result<u64, String> {
    let t0 = Instant::now();
    let err = Rc::new(RefCell::new(None));
    let (ix, e) = (index.clone(), err.clone());
    let memory = memory.to_vec();
    ex.spawn(move |ctx| async move {
        // Memory nodes outlive compute runs: an earlier run's index and
        // chunks are cleared before this one loads its own.
        let chunks = Chunks::Below(index_bytes);
        if let Err(why) = clear_index_memory(&ctx, &memory, &chunks, dm_bytes).await {
            *e.borrow_mut() = Some(why);
            return;
        }
        crate::index_work::load(ctx, ix, records, e).await
    })
    .map_err(|e| format!("loading the index: {e}"))?;
    ex.run();
    if let Some(e) = err.borrow_mut().take() {
        return Err(format!("loading the index failed: {e}"));
    }
    Ok(t0.elapsed().as_nanos() as u64)
}

/// What a core's tasks share, as the core loop publishes and returns it.
trait Tally {
    fn tally(&self) -> &OpTally;
    /// Index-cache hits and misses so far (zeros without a tree).
    fn cache(&self) -> (u64, u64);
    /// The core's result, given the executor's counters of the workload.
    fn result(&self, counters: VerbCounters) -> CoreResult;
}

/// The part of a core's result every workload has.
fn tally_result(t: &OpTally, counters: VerbCounters) -> CoreResult {
    CoreResult {
        hist: t.hist.borrow().clone(),
        ops: t.ops.get(),
        mismatches: t.mismatches.get(),
        first_op_unix_ns: t.first_op_unix_ns.get(),
        nodes: Vec::new(),
        counters,
        failures: 0,
        first_error: None,
        tree: TreeStats::default(),
    }
}

impl Tally for CoreState {
    fn tally(&self) -> &OpTally {
        &self.tally
    }
    fn cache(&self) -> (u64, u64) {
        (0, 0)
    }
    fn result(&self, counters: VerbCounters) -> CoreResult {
        CoreResult {
            nodes: self.nodes.borrow().clone(),
            ..tally_result(&self.tally, counters)
        }
    }
}

impl Tally for IndexCoreState {
    fn tally(&self) -> &OpTally {
        &self.tally
    }
    fn cache(&self) -> (u64, u64) {
        let t = self.tree.get();
        (t.cache_hits, t.cache_misses)
    }
    fn result(&self, counters: VerbCounters) -> CoreResult {
        CoreResult {
            failures: self.failures.get(),
            first_error: self.first_error.borrow_mut().take(),
            tree: self.tree.get(),
            ..tally_result(&self.tally, counters)
        }
    }
}

/// Turns `ex` until its tasks end, publishing `st` for the per-second line
/// about every 100 ms; counters are taken relative to `base`.
fn drive<N: Nic>(
    ex: &mut Executor<N>,
    st: &dyn Tally,
    live: &Live,
    i: usize,
    base: VerbCounters,
) -> CoreResult {
    let publish = |ex: &Executor<N>| {
        // Relaxed: counters for display; the Mutex orders the histogram.
        live.ops[i].store(st.tally().ops.get(), Ordering::Relaxed);
        live.round_trips[i].store((ex.counters() - base).round_trips, Ordering::Relaxed);
        let (hits, misses) = st.cache();
        live.cache_hits[i].store(hits, Ordering::Relaxed);
        live.cache_misses[i].store(misses, Ordering::Relaxed);
        let mut iv = st.tally().interval.borrow_mut();
        if let Ok(mut h) = live.interval.lock() {
            let _ = h.add(&*iv);
        }
        iv.reset();
    };
    let mut last = Instant::now();
    while ex.live_tasks() > 0 {
        ex.turn();
        if ex.turns().is_multiple_of(256) && last.elapsed() >= Duration::from_millis(100) {
            publish(ex);
            last = Instant::now();
        }
    }
    publish(ex);
    st.result(ex.counters() - base)
}

/// Writes `hist` to `path` as JSON, `[[value_ns, count], …]` over its
/// recorded buckets, whole ([`cmdline::write_atomic`]).
fn write_histogram(path: &std::path::Path, hist: &Histogram<u64>) -> Result<(), String> {
    let pairs: Vec<[u64; 2]> = hist
        .iter_recorded()
        .map(|v| [v.value_iterated_to(), v.count_at_value()])
        .collect();
    let text = serde_json::to_string(&pairs).map_err(|e| e.to_string())?;
    cmdline::write_atomic(path, text.as_bytes()).map_err(|e| format!("the latency histogram: {e}"))
}

/// Sums the cores' results, prints the JSON line and the summary; returns
/// the exit code.
fn report(c: &Compute<'_>, indexed: bool, run: Run) -> u8 {
    let (o, me) = (c.o, c.me);
    let mut hist = latency_histogram();
    let mut counters = VerbCounters::default();
    let mut tree = TreeStats::default();
    let (mut ops, mut mismatches, mut first_op) = (0u64, 0u64, u64::MAX);
    let mut index_failures = 0u64;
    let mut nodes: Vec<NodeTally> = c
        .mem_ids
        .iter()
        .map(|&node| NodeTally {
            node,
            ..Default::default()
        })
        .collect();
    let mut errors = Vec::new();
    for r in run.results {
        match r {
            Ok(r) => {
                let _ = hist.add(&r.hist);
                counters += r.counters;
                tree += r.tree;
                ops += r.ops;
                mismatches += r.mismatches;
                index_failures += r.failures;
                errors.extend(r.first_error);
                if r.first_op_unix_ns != 0 {
                    first_op = first_op.min(r.first_op_unix_ns);
                }
                for (acc, t) in nodes.iter_mut().zip(r.nodes) {
                    acc.absorb(t);
                }
            }
            Err(e) => errors.push(e),
        }
    }
    if indexed {
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
    let elapsed_ns = run.elapsed_ns;
    let json = serde_json::json!({
        "node": c.node.id,
        "backend": c.backend,
        "workload": o.workload.name(),
        "records": if indexed { o.records } else { 0 },
        "tree": (o.workload == crate::node::Workload::Tree).then_some(&o.tree),
        "key_bytes": if indexed { o.sizes.key_bytes() } else { 0 },
        "value_bytes": if indexed { o.sizes.value_bytes() } else { 0 },
        "ops": ops,
        "elapsed_ns": elapsed_ns,
        "ops_per_sec": if elapsed_ns == 0 { 0.0 } else { ops as f64 * 1e9 / elapsed_ns as f64 },
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
        "index_load_ns": run.load_ns,
        "mismatches": mismatches,
        "failures": failures,
        "errors": errors,
        "start_unix_ns": run.start_unix_ns,
        "first_op_unix_ns": if first_op == u64::MAX { 0 } else { first_op },
        "join_ns": c.join_ns,
        "exchange_ns": c.exchange_ns,
        "cores": c.node.cores.len(),
        "per_node": nodes.iter().map(|n| serde_json::json!({
            "node": n.node,
            "ops": n.ops,
            "faa": n.faa,
            "failures": n.failures,
            "first_failure_unix_ns": n.first_failure_unix_ns,
            "error": n.first_error,
            "dead": n.dead,
        })).collect::<Vec<_>>(),
        "latency_ns": {
            "count": hist.len(),
            "p50": hist.value_at_quantile(0.5),
            "p90": hist.value_at_quantile(0.9),
            "p99": hist.value_at_quantile(0.99),
            "p999": hist.value_at_quantile(0.999),
            "max": hist.max(),
        },
        "histogram_file": o.histogram.as_ref().map(|p| p.display().to_string()),
    });
    // The raw histogram, only when asked for, to its own file: the result
    // line stays a summary a script can read.
    let mut code = 0;
    if let Some(path) = &o.histogram {
        if let Err(e) = write_histogram(path, &hist) {
            say(format_args!("{me}: {e}"));
            code = 1;
        }
    }
    cmdline::outln!("{json}");
    say(format_args!(
        "{me}: done: {ops} operations in {:.2} s, {failures} failed, {mismatches} mismatched reads",
        elapsed_ns as f64 / 1e9
    ));
    for e in &errors {
        say(format_args!("{me}: error: {e}"));
    }
    code.max(u8::from(
        failures != 0 || mismatches != 0 || !errors.is_empty(),
    ))
}

/// Prints a stats line per second until every core ended; `cache`:
/// with the index cache's hit ratio over the second.
fn report_loop(live: &Live, ended: &Ended, cores: usize, cache: bool, me: &str) {
    let t0 = Instant::now();
    let (mut last_ops, mut last_rt, mut tick) = (0u64, 0u64, 1u64);
    let (mut last_hits, mut last_misses) = (0u64, 0u64);
    let sum = |v: &[AtomicU64]| v.iter().map(|a| a.load(Ordering::Relaxed)).sum::<u64>();
    while ended.count() < cores {
        std::thread::sleep(Duration::from_millis(20));
        if t0.elapsed() < Duration::from_secs(tick) {
            continue;
        }
        let (ops, rt) = (sum(&live.ops), sum(&live.round_trips));
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_gate_opens_once_for_every_waiter() {
        let gate = Arc::new(Gate::default());
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let g = gate.clone();
                std::thread::spawn(move || g.wait())
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        gate.open(42);
        // The first word counts: a later shut changes nothing.
        gate.shut();
        for w in waiters {
            assert_eq!(w.join().unwrap(), Some(42));
        }
        assert_eq!(gate.wait(), Some(42));
    }

    #[test]
    fn a_shut_gate_stays_shut() {
        let gate = Gate::default();
        gate.shut();
        gate.open(7);
        assert_eq!(gate.wait(), None);
    }

    #[test]
    fn index_workloads_get_more_scratch_per_task() {
        let mut o = NodeOptions {
            config: "c.toml".into(),
            id: 0,
            seconds: None,
            tasks_per_core: 5,
            pin: false,
            seed: 1,
            workload: crate::node::Workload::Verbs,
            records: 10,
            sizes: crate::index_work::Sizes::default(),
            tree: "sherman".into(),
            histogram: None,
            txs: 2000,
            etcd: None,
            lease_ms: 10.0,
        };
        let verbs = exec_config(&o);
        assert_eq!((verbs.slots, verbs.scratch_bytes_per_slot), (5, 4096));
        o.workload = crate::node::Workload::Hash;
        let hash = exec_config(&o);
        assert_eq!((hash.slots, hash.scratch_bytes_per_slot), (5, 64 << 10));
        assert!(hash.check().is_ok() && verbs.check().is_ok());
        // Wide records: a tree operation's six nodes, 32 KiB each for
        // 1 KiB keys and values, and the words beside them.
        o.workload = crate::node::Workload::Tree;
        o.sizes = crate::index_work::Sizes::new(1024, 1024).unwrap();
        let wide = exec_config(&o);
        assert_eq!(o.sizes.layout().node_bytes(), 32 << 10);
        let words = index::tree::layout::SMALL_SCRATCH;
        assert_eq!(wide.scratch_bytes_per_slot, 6 * (32 << 10) + words);
        assert!(wide.check().is_ok());
    }
}
