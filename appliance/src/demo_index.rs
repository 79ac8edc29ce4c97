//! The index phases of `loch demo` (the index workload of
//! [`crate::index_work`]): load an index — the Sherman B+tree
//! (bulk load) or the Nessie hash table (puts) — then run a mixed workload
//! of lookups, inserts, updates, deletes (and, on the tree, scans) from
//! every task, on the same cluster (emu or sim) the verb phase used. It
//! checks itself: loaded records are never written, so every lookup of one
//! must return its value; each task owns a set of extra keys and keeps a
//! shadow of them, so its lookups and deletes of those must agree with the
//! shadow; every scan must be in order.

use crate::demo::DemoConfig;
use crate::index_work::{
    clear_index_memory, index_handle, load, mixed_op, tree_config, tree_title, Chunks, IndexKind,
    OwnKeys, Sizes,
};
use cluster::sim::{self as simrun, Flow, Placement};
use cluster::stats::{latency_histogram, CoreStats, RunStats};
use cluster::{EmuCluster, Place, Spawn, Workload};
use hdrhistogram::Histogram;
use index::any::{AnyClient, AnyIndex};
use index::tree::{TreeConfig, TreeStats};
use mempool::ChunkConfig;
use nicdrv::rng::{Domain, Rng};
use nicdrv::sim::World;
use nicdrv::{Ctx, ExecutorConfig, Nic, NodeId, VerbCounters};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// The demo's index for a phase.
fn demo_index(
    kind: IndexKind,
    tree_cfg: &TreeConfig,
    cfg: &DemoConfig,
) -> Result<AnyIndex, String> {
    let tasks = (cfg.cores * cfg.tasks_per_core) as u64;
    index_handle(kind, tree_cfg, cfg.sizes, cfg.tree_records, tasks, DM_BYTES)
}

/// The device memory of each of the demo's memory nodes, all of it the
/// tree's lock table. The verb phase before the index phases counts its
/// CAS successes in words of it ([`crate::demo`]'s `cas_word`), so the
/// tree phase's loader clears it first.
pub const DM_BYTES: u64 = 256 << 10;

/// What an index phase measured and checked.
pub struct IndexPhase {
    pub kind: IndexKind,
    /// The tree's name (the tree phase's; the hash phase has none).
    pub tree_name: String,
    pub stats: RunStats,
    pub tree: TreeStats,
    pub records: u64,
    /// The records' key and value sizes.
    pub sizes: Sizes,
    pub mismatches: u64,
    pub failures: u64,
    /// Faults were injected: failed operations are allowed.
    pub faulty: bool,
    /// Why the phase did not run its workload (its load failed under faults).
    pub skipped: Option<String>,
    /// Tasks that did not finish (stuck under faults).
    pub unfinished: u64,
}

/// How long, in virtual time, a phase under faults waits past its deadline
/// for tasks to finish before it leaves the rest as stuck (behind a lock a
/// crashed compute node held, or on a crashed node).
pub const FAULT_QUIET_NS: u64 = 20_000_000;

/// What the tasks of an index phase count: one core's (emu), or the
/// world's (sim).
struct IndexPhaseTally {
    hist: RefCell<Histogram<u64>>,
    ops: Cell<u64>,
    mismatches: Cell<u64>,
    failures: Cell<u64>,
    tree: RefCell<TreeStats>,
    /// Tasks that ran to their end.
    finished: Cell<u64>,
    /// Faults were injected: failures are expected, and logged quietly.
    faulty: bool,
}

fn shared(faulty: bool) -> Rc<IndexPhaseTally> {
    Rc::new(IndexPhaseTally {
        hist: RefCell::new(latency_histogram()),
        ops: Cell::new(0),
        mismatches: Cell::new(0),
        failures: Cell::new(0),
        tree: RefCell::new(TreeStats::default()),
        finished: Cell::new(0),
        faulty,
    })
}

async fn tree_task<N: Nic>(
    ctx: Ctx<N>,
    mut c: AnyClient,
    me: u64,
    seed: u64,
    records: u64,
    duration_ns: u64,
    sh: Rc<IndexPhaseTally>,
) {
    let mut rng = Rng::stream(seed, Domain::Client, me);
    let mut own = OwnKeys::new(records, me);
    let deadline = ctx.nic().now_ns() + duration_ns;
    // SIGINT/SIGTERM ends the phase early (never set in a normal run, so a
    // seed's trace is unchanged).
    while ctx.now_ns() < deadline && !cmdline::signals::stop_requested() {
        let t0 = ctx.now_ns();
        match mixed_op(&ctx, &mut c, &mut rng, records, &mut own).await {
            Ok(bad) => sh.mismatches.set(sh.mismatches.get() + bad as u64),
            Err(e) => {
                if sh.faulty {
                    log::debug!("demo index operation failed (faults injected): {e}");
                } else {
                    log::error!("demo index operation failed: {e}");
                }
                sh.failures.set(sh.failures.get() + 1);
                break;
            }
        }
        let _ = sh.hist.borrow_mut().record((ctx.now_ns() - t0).max(1));
        sh.ops.set(sh.ops.get() + 1);
    }
    *sh.tree.borrow_mut() += c.tree_stats();
    sh.finished.set(sh.finished.get() + 1);
}

/// The load of an index phase: one task clears what the phase before
/// left on every memory node (`memory_nodes` of them: the chunks it took,
/// the roots, the device memory, [`DM_BYTES`]; see
/// [`clear_index_memory`]), then creates the index and loads it. Not
/// cleared, the verb phase's counters in device memory read as locks
/// some client holds (a writer waited on one until its lock wait ran
/// out, and the phase did not finish), and the hash table ran in what
/// the tree left of host memory: with 1 KiB keys and values its puts ran
/// out of chunks.
struct LoadTask<'a> {
    index: &'a AnyIndex,
    records: u64,
    memory_nodes: usize,
    /// How the memory nodes are cut into chunks (every phase the same).
    chunk: ChunkConfig,
}

impl Workload for LoadTask<'_> {
    /// The load's error, and whether it has ended.
    type Group = (Rc<RefCell<Option<String>>>, Rc<Cell<bool>>);
    type Out = Option<String>;

    fn group(&self, _: usize, _: usize) -> Self::Group {
        (Rc::new(RefCell::new(None)), Rc::new(Cell::new(false)))
    }

    fn spawn<N: Nic, S: Spawn<N>>(
        &self,
        _: Place,
        (err, loaded): &Self::Group,
        on: &mut S,
    ) -> Result<(), String> {
        let (t, e, l, records) = (
            self.index.clone(),
            err.clone(),
            loaded.clone(),
            self.records,
        );
        let memory = (0..self.memory_nodes)
            .map(|m| NodeId::try_from(m).map_err(|_| format!("memory node {m}: id too large")))
            .collect::<Result<Vec<NodeId>, String>>()?;
        let chunks = Chunks::Counted(self.chunk.clone());
        on.spawn_task(move |ctx| async move {
            if let Err(why) = clear_index_memory(&ctx, &memory, &chunks, DM_BYTES).await {
                *e.borrow_mut() = Some(why);
            } else {
                load(ctx, t, records, e).await;
            }
            l.set(true);
        })
    }

    fn finish(&self, (err, _): Self::Group, _: VerbCounters) -> Option<String> {
        err.borrow_mut().take()
    }
}

/// The workload of an index phase: `tasks_per_core` tasks on every core,
/// each a client of its compute node's index handle.
struct PhaseTasks<'a> {
    cfg: &'a DemoConfig,
    /// One handle per compute node.
    indexes: &'a [AnyIndex],
    faulty: bool,
}

/// What a group of phase tasks measured: stats, tree counters,
/// mismatches, failures, tasks that ran to their end.
type PhaseOut = (CoreStats, TreeStats, u64, u64, u64);

impl Workload for PhaseTasks<'_> {
    type Group = Rc<IndexPhaseTally>;
    type Out = PhaseOut;

    fn group(&self, _: usize, _: usize) -> Rc<IndexPhaseTally> {
        shared(self.faulty)
    }

    fn spawn<N: Nic, S: Spawn<N>>(
        &self,
        place: Place,
        sh: &Rc<IndexPhaseTally>,
        on: &mut S,
    ) -> Result<(), String> {
        let cfg = self.cfg;
        let (tasks, seed, records) = (cfg.tasks_per_core, cfg.seed, cfg.tree_records);
        let duration_ns = (cfg.seconds * 1e9) as u64;
        for t in 0..tasks {
            let me = (place.core * tasks + t) as u64 + 1;
            let c = self.indexes[place.compute_node]
                .client(me)
                .map_err(|e| e.to_string())?;
            let s = sh.clone();
            on.spawn_task(move |ctx| tree_task(ctx, c, me, seed, records, duration_ns, s))?;
        }
        Ok(())
    }

    fn finish(&self, sh: Rc<IndexPhaseTally>, counters: VerbCounters) -> PhaseOut {
        let latency_ns = sh.hist.borrow().clone();
        let core = CoreStats {
            ops: sh.ops.get(),
            latency_ns,
            counters,
        };
        let tree = *sh.tree.borrow();
        (
            core,
            tree,
            sh.mismatches.get(),
            sh.failures.get(),
            sh.finished.get(),
        )
    }
}

fn phase_exec_config(cfg: &DemoConfig) -> ExecutorConfig {
    ExecutorConfig {
        slots: cfg.tasks_per_core,
        scratch_bytes_per_slot: cfg.sizes.scratch_bytes_per_slot(),
        poll_batch: 32,
    }
}

/// The phase on the emu cluster: one compute node (this process), its
/// cores sharing one tree handle.
pub fn run_emu(
    cluster: &EmuCluster,
    tree_cfg: TreeConfig,
    cfg: &DemoConfig,
    kind: IndexKind,
) -> Result<IndexPhase, String> {
    let records = cfg.tree_records;
    let index = demo_index(kind, &tree_cfg, cfg)?;
    let exec = phase_exec_config(cfg);
    let load = LoadTask {
        index: &index,
        records,
        memory_nodes: cfg.memory_nodes,
        chunk: tree_cfg.chunk.clone(),
    };
    let loaded = cluster
        .run(&load, 1, ExecutorConfig { slots: 1, ..exec }, false)
        .map_err(|e| e.to_string())?;
    if let Some(Some(e)) = loaded.into_iter().next() {
        return Err(format!("loading failed: {e}"));
    }
    let work = PhaseTasks {
        cfg,
        indexes: std::slice::from_ref(&index),
        faulty: false,
    };
    let started = std::time::Instant::now();
    let results = cluster
        .run(&work, cfg.cores, exec, cfg.pin)
        .map_err(|e| e.to_string())?;
    let elapsed = started.elapsed().as_nanos() as u64;
    let (mut cores_stats, mut ts, mut mism, mut fail) = (Vec::new(), TreeStats::default(), 0, 0);
    for (c, t, m, f, _) in results {
        cores_stats.push(c);
        ts += t;
        mism += m;
        fail += f;
    }
    Ok(IndexPhase {
        kind,
        tree_name: cfg.tree.clone(),
        stats: RunStats::merge(cores_stats, elapsed),
        tree: ts,
        records,
        sizes: cfg.sizes,
        mismatches: mism,
        failures: fail,
        faulty: false,
        skipped: None,
        unfinished: 0,
    })
}

/// The phase on a simulated world: one tree handle per compute node.
pub fn run_sim(
    w: &mut World,
    tree_cfg: TreeConfig,
    cfg: &DemoConfig,
    kind: IndexKind,
) -> Result<IndexPhase, String> {
    let (cores, tasks, records) = (cfg.cores, cfg.tasks_per_core, cfg.tree_records);
    let indexes: Vec<AnyIndex> = (0..w.compute_nodes())
        .map(|_| demo_index(kind, &tree_cfg, cfg))
        .collect::<Result<_, _>>()?;
    let exec = phase_exec_config(cfg);
    let load = LoadTask {
        index: &indexes[0],
        records,
        memory_nodes: cfg.memory_nodes,
        chunk: tree_cfg.chunk.clone(),
    };
    let loader = simrun::spawn(
        w,
        &load,
        1,
        ExecutorConfig { slots: 1, ..exec },
        Placement::Node(0),
    )?;
    let faulty = !cfg.faults.is_empty();
    let skip = |why: String| IndexPhase {
        kind,
        tree_name: cfg.tree.clone(),
        stats: RunStats::merge(Vec::new(), 0),
        tree: TreeStats::default(),
        records,
        sizes: cfg.sizes,
        mismatches: 0,
        failures: 0,
        faulty,
        skipped: Some(why),
        unfinished: 0,
    };
    // Under faults the loader may wait forever (its node crashed), and
    // tasks stuck in an earlier phase may still spin: run in slices, until
    // this phase's own tasks are done.
    let slice = 1_000_000;
    let loaded = loader.group.1.clone();
    let load_limit = w.now_ns() + 10_000_000_000;
    simrun::run_slices(w, slice, |_, until| {
        if loaded.get() || until > load_limit {
            Flow::Stop
        } else {
            Flow::Go
        }
    });
    if !loaded.get() {
        if faulty {
            loader.halt(w);
            return Ok(skip("the load did not finish".into()));
        }
        return Err("bulk load did not finish".into());
    }
    if let Some(e) = loader.finish(w, &load) {
        if faulty {
            return Ok(skip(format!("the load failed: {e}")));
        }
        return Err(format!("bulk load failed: {e}"));
    }
    let work = PhaseTasks {
        cfg,
        indexes: &indexes,
        faulty,
    };
    let spawned = simrun::spawn(w, &work, cores, exec, Placement::RoundRobin)?;
    let start = spawned.start_ns;
    let spawned_tasks = (cores * tasks) as u64;
    let deadline = start + (cfg.seconds * 1e9) as u64 + FAULT_QUIET_NS;
    let sh = spawned.group.clone();
    simrun::run_slices(w, slice, |_, until| {
        if sh.finished.get() == spawned_tasks || until > deadline {
            Flow::Stop
        } else {
            Flow::Go
        }
    });
    if sh.finished.get() < spawned_tasks {
        if !faulty {
            return Err(format!(
                "the {} phase did not finish: {} of its {spawned_tasks} tasks still ran {} ms of virtual time past its end",
                if kind == IndexKind::Hash { "hash table" } else { "tree" },
                spawned_tasks - sh.finished.get(),
                FAULT_QUIET_NS / 1_000_000
            ));
        }
        // Tasks stuck for ever (behind a lock a crashed node held) must
        // not spin on through the phases after this one.
        spawned.halt(w);
    }
    let (core, tree, mismatches, failures, finished) = spawned.finish(w, &work);
    let mut stats = RunStats::merge(vec![core], w.now_ns() - start);
    stats.threads = cores;
    Ok(IndexPhase {
        kind,
        tree_name: cfg.tree.clone(),
        stats,
        tree,
        records,
        sizes: cfg.sizes,
        mismatches,
        failures,
        faulty,
        skipped: None,
        unfinished: spawned_tasks - finished,
    })
}

/// Runs the tree phase, then the hash-table phase, through `run` (one
/// backend's phase runner); `None` when `cfg.tree_records` is 0.
pub fn run_phases(
    cfg: &DemoConfig,
    host_bytes: u64,
    chunk: &ChunkConfig,
    mut run: impl FnMut(TreeConfig, IndexKind) -> Result<IndexPhase, String>,
) -> Result<Option<Vec<IndexPhase>>, String> {
    if cfg.tree_records == 0 || cmdline::signals::stop_requested() {
        return Ok(None);
    }
    cmdline::errln!(
        "loch demo: index phases: a B+tree and a hash table of {} records each ({}-byte keys, {}-byte values), then a mixed workload",
        cfg.tree_records,
        cfg.sizes.key_bytes(),
        cfg.sizes.value_bytes()
    );
    let tcfg = tree_config(&cfg.tree, host_bytes, chunk)?;
    let mut phases = Vec::new();
    for kind in [IndexKind::Tree, IndexKind::Hash] {
        if cmdline::signals::stop_requested() {
            break; // SIGINT/SIGTERM: report the phases that ran
        }
        phases.push(run(tcfg.clone(), kind)?);
    }
    Ok(Some(phases))
}

/// The summary lines of the phase.
pub fn summary(p: &IndexPhase) -> String {
    let name = match p.kind {
        IndexKind::Tree => tree_title(&p.tree_name),
        IndexKind::Hash => "hash table (Nessie, puts)".into(),
    };
    let name = name.as_str();
    if let Some(why) = &p.skipped {
        return format!("  {name}: skipped under faults: {why}\n");
    }
    // Failed operations are a check without faults, and a count with them.
    let failed = if p.faulty {
        format!(
            "failed index operations: {} (faults injected: each failing task stopped); {} tasks unfinished",
            p.failures, p.unfinished
        )
    } else {
        format!(
            "check: failed index operations: {}: {}",
            p.failures,
            if p.failures == 0 { "ok" } else { "FAILED" }
        )
    };
    summary_ran(p, name, &failed)
}

fn summary_ran(p: &IndexPhase, name: &str, failed: &str) -> String {
    let s = &p.stats;
    let c = &s.counters;
    let t = &p.tree;
    let hits = t.cache_hits + t.cache_misses;
    let ok = |b: bool| if b { "ok" } else { "FAILED" };
    format!(
        "  {} ({} records loaded ({}-byte keys, {}-byte values), then 40% lookup / 25% put / 10% delete / 15% own lookup / 10% scan{})\n\
         \x20   operations          {}\n\
         \x20   operations/s        {:.0}\n\
         \x20   round trips/op      {:.3}\n\
         \x20   bytes read/op       {:.1}\n\
         \x20   bytes written/op    {:.1}\n\
         \x20   latency p50         {} ns\n\
         \x20   latency p99         {} ns\n\
         \x20   cache hit ratio     {:.4}\n\
         \x20   lock handovers/op   {:.4}\n\
         \x20   read retries/op     {:.5}\n\
         \x20   splits              {}\n\
         \x20   check: lookups and deletes agree with the loaded data and each task's shadow: {} mismatches: {}\n\
         \x20   {failed}\n",
        name,
        p.records,
        p.sizes.key_bytes(),
        p.sizes.value_bytes(),
        if p.kind == IndexKind::Hash { "; no scans in a hash table: skipped" } else { "" },
        s.ops,
        s.ops_per_sec(),
        s.per_op(c.round_trips),
        s.per_op(c.bytes_read),
        s.per_op(c.bytes_written),
        s.latency_ns.value_at_quantile(0.5),
        s.latency_ns.value_at_quantile(0.99),
        if hits == 0 { 0.0 } else { t.cache_hits as f64 / hits as f64 },
        s.per_op(t.handovers),
        s.per_op(t.read_retries),
        t.splits,
        p.mismatches,
        ok(p.mismatches == 0),
    )
}
