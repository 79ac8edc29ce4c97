//! `loch demo`: boots a whole cluster and runs a short mixed verb workload
//! on it, printing progress and a summary. On the emu backend the cluster
//! is real on this host — memory nodes as shared mappings, compute cores as
//! pinned threads — and time is the wall clock; on the sim backend it is a
//! simulated cluster in virtual time, from a seed. The demo checks its own
//! results: every FAA on the shared counter is accounted for, and every READ
//! of a task's private words returns what that task last wrote there.
//!
//! The workload grows with Loch: later capabilities (the B+tree, the hash
//! table, transactions) join it.

use crate::index_work::{check_tree, IndexLoad, Sizes, DEFAULT_TREE};
use crate::verb_mix::{self, Mix, Target, Verb};
use cluster::sim::{self as simrun, Placement};
use cluster::stats::{latency_histogram, CoreStats, RunStats};
use cluster::{EmuCluster, EmuClusterConfig, Place, Spawn, Workload};
use hdrhistogram::Histogram;
use mempool::{ChunkConfig, RemoteAllocator, SUPERBLOCK_BYTES};
use nicdrv::emu::EmuConfig;
use nicdrv::rng::{Domain, Rng};
use nicdrv::sim::{Fault, RunEnd, SimConfig, SimModel, World};
use nicdrv::{Ctx, ExecutorConfig, GlobalAddr, Nic, Space, VerbCounters};
use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which backend the demo runs on.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum DemoBackend {
    Emu,
    Sim,
}

/// Options of `loch demo`.
#[derive(Clone, Debug)]
pub struct DemoConfig {
    pub backend: DemoBackend,
    pub memory_nodes: usize,
    /// Compute cores (emu: pinned threads; sim: simulated threads, spread
    /// over `compute_nodes`).
    pub cores: usize,
    pub compute_nodes: usize,
    pub tasks_per_core: usize,
    /// Wall seconds on emu, virtual seconds on sim.
    pub seconds: f64,
    pub seed: u64,
    pub latency_ns: u64,
    pub pin: bool,
    /// Records bulk-loaded into the tree phase's B+tree (0 skips the phase).
    pub tree_records: u64,
    /// The index phases' key and value sizes.
    pub sizes: Sizes,
    /// The tree phase's tree, by [`index::tree::TreeConfig::named`] name.
    pub tree: String,
    /// Transactions each coordinator of the transactions phase runs (0
    /// skips the phase).
    pub txn_txs: u64,
    /// Faults to inject (sim only), `at_ns` counted from the start of the
    /// simulation; the phases follow one another in virtual time. With any,
    /// a task stops at its first failed operation while the others go on,
    /// and the checks allow for operations whose effect is unknown.
    pub faults: Vec<Fault>,
}

impl Default for DemoConfig {
    fn default() -> Self {
        DemoConfig {
            backend: DemoBackend::Emu,
            memory_nodes: 2,
            cores: 2,
            compute_nodes: 1,
            tasks_per_core: 8,
            seconds: 3.0,
            seed: 1,
            latency_ns: 0,
            pin: true,
            tree_records: 100_000,
            sizes: Sizes::default(),
            tree: DEFAULT_TREE.into(),
            txn_txs: 2000,
            faults: Vec::new(),
        }
    }
}

/// Words each task owns and checks (64 bytes apart, one per cache line).
const TASK_WORDS: u64 = 512;
/// Host memory of each memory node, unless the index phases need more
/// ([`host_bytes`]).
const HOST_BYTES: u64 = 64 << 20;
const CHUNK_BYTES: u64 = 256 << 10;
/// The shared FAA counter: node 0's superblock word kept for it.
const SHARED_FAA: GlobalAddr = GlobalAddr::host(0, mempool::VERB_COUNTER_OFF);

/// The word the tasks of one core CAS-increment: in device memory (where
/// NIC atomics are cheapest, as HOCL's locks are), one per core, so a core's
/// tasks contend with each other as they would for a hot lock.
fn cas_word(core: usize, memory_nodes: usize) -> GlobalAddr {
    GlobalAddr::device(
        (core % memory_nodes) as u16,
        64 * (core / memory_nodes) as u64,
    )
}

/// What the demo found.
pub struct DemoReport {
    pub stats: RunStats,
    pub faa_issued: u64,
    pub faa_counter: u64,
    pub mismatches: u64,
    pub failures: u64,
    pub tree: Option<Vec<crate::demo_index::IndexPhase>>,
    pub txn: Option<crate::demo_txn::TxnPhase>,
    pub text: String,
}

impl DemoReport {
    /// Every check passed. Under faults, failed operations are allowed and
    /// the counter checks allow for them (`failures` then counts only
    /// failed checks).
    pub fn ok(&self) -> bool {
        self.mismatches == 0
            && self.failures == 0
            && self
                .tree
                .iter()
                .flatten()
                .all(|t| t.mismatches == 0 && (t.faulty || t.failures == 0))
            && self.txn.as_ref().is_none_or(|t| t.ok())
    }
}

/// What the verb phase's tasks counted.
#[derive(Copy, Clone, Debug, Default)]
struct Tally {
    faa: u64,
    cas: u64,
    mismatches: u64,
    failures: u64,
    /// FAAs and CASes that failed or never completed (a crashed node's):
    /// each may or may not have taken effect.
    failed_faa: u64,
    failed_cas: u64,
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, o: Tally) {
        self.faa += o.faa;
        self.cas += o.cas;
        self.mismatches += o.mismatches;
        self.failures += o.failures;
        self.failed_faa += o.failed_faa;
        self.failed_cas += o.failed_cas;
    }
}

/// What the tasks of one core (emu) or one world (sim) share.
struct VerbPhaseTally {
    hist: RefCell<Histogram<u64>>,
    ops: Cell<u64>,
    faa: Cell<u64>,
    cas_incs: Cell<u64>,
    mismatches: Cell<u64>,
    failures: Cell<u64>,
    /// FAAs and CASes that failed or are still in flight.
    failed_faa: Cell<u64>,
    failed_cas: Cell<u64>,
    /// Faults were injected: failures are expected, and logged quietly.
    faulty: bool,
    progress: Arc<AtomicU64>,
}

impl VerbPhaseTally {
    fn new(progress: Arc<AtomicU64>, faulty: bool) -> Rc<VerbPhaseTally> {
        Rc::new(VerbPhaseTally {
            hist: RefCell::new(latency_histogram()),
            ops: Cell::new(0),
            faa: Cell::new(0),
            cas_incs: Cell::new(0),
            mismatches: Cell::new(0),
            failures: Cell::new(0),
            failed_faa: Cell::new(0),
            failed_cas: Cell::new(0),
            faulty,
            progress,
        })
    }

    fn fail(&self, what: &str, e: impl std::fmt::Display) {
        if self.faulty {
            log::debug!("demo {what} failed (faults injected): {e}");
        } else {
            log::error!("demo {what} failed: {e}");
        }
        self.failures.set(self.failures.get() + 1);
    }
}

/// One demo task, the same on every backend: allocate a private area with
/// the chunk allocator, then a random mix until the deadline.
async fn demo_task<N: Nic>(
    ctx: Ctx<N>,
    mut rng: Rng,
    alloc: RemoteAllocator,
    cas_word: GlobalAddr,
    duration_ns: u64,
    sh: Rc<VerbPhaseTally>,
) {
    let area = match alloc.alloc(&ctx, TASK_WORDS * 64, 64).await {
        Ok(a) => a,
        Err(e) => return sh.fail("allocation", e),
    };
    let mut shadow = vec![0u64; TASK_WORDS as usize];
    let deadline = ctx.nic().now_ns() + duration_ns;
    let mut local_ops = 0u64;
    // SIGINT/SIGTERM ends the phase early (never set in a normal run, so a
    // seed's trace is unchanged).
    while ctx.now_ns() < deadline && !cmdline::signals::stop_requested() {
        let t0 = ctx.now_ns();
        let w = rng.below(TASK_WORDS);
        let target = Target {
            word: area.add(w * 64),
            counter: SHARED_FAA,
            cas_word,
        };
        let verb = Mix::DEMO.pick(&mut rng);
        // FAAs and CASes in flight: if the task never hears back (its node
        // crashed), the memory node may still have applied them.
        let counted = match verb {
            v if v.bumps_counter() => Some(&sh.failed_faa),
            Verb::CasIncrement => Some(&sh.failed_cas),
            _ => None,
        };
        if let Some(c) = counted {
            c.set(c.get() + 1);
        }
        let r = verb_mix::step(&ctx, verb, &mut rng, target, &mut shadow[w as usize])
            .await
            .map(|found| {
                if found.mismatch {
                    sh.mismatches.set(sh.mismatches.get() + 1);
                }
                if verb.bumps_counter() {
                    sh.faa.set(sh.faa.get() + 1);
                }
                if found.cas_increment {
                    sh.cas_incs.set(sh.cas_incs.get() + 1);
                }
            });
        if let Err(e) = r {
            // A failed FAA or CAS may still have taken effect (its answer
            // was lost): it stays counted, and the counter checks allow
            // for each.
            return sh.fail("operation", e);
        }
        if let Some(c) = counted {
            c.set(c.get() - 1);
        }
        let _ = sh.hist.borrow_mut().record((ctx.now_ns() - t0).max(1));
        sh.ops.set(sh.ops.get() + 1);
        local_ops += 1;
        if local_ops.is_multiple_of(1024) {
            sh.progress.fetch_add(1024, Ordering::Relaxed);
        }
    }
    sh.progress.fetch_add(local_ops % 1024, Ordering::Relaxed);
}

/// Host memory of each memory node: 64 MiB, or what the index
/// phases take ([`IndexLoad::needed`]) when that is more. Emu maps it
/// lazily and the simulator's is calloc'd, so only what the records
/// touch is used.
pub fn host_bytes(cfg: &DemoConfig) -> u64 {
    let load = IndexLoad {
        sizes: cfg.sizes,
        records: cfg.tree_records,
        tasks: (cfg.cores * cfg.tasks_per_core) as u64,
        memory_nodes: cfg.memory_nodes as u64,
        chunk_bytes: CHUNK_BYTES,
    };
    load.needed().max(HOST_BYTES)
}

fn chunk_config(host_bytes: u64) -> ChunkConfig {
    ChunkConfig {
        chunk_bytes: CHUNK_BYTES,
        ..ChunkConfig::new(host_bytes)
    }
}

/// Refuses memory nodes of `want` bytes in all, for `records` records of
/// `sizes` and the tasks' chunks, when this host has less memory than
/// that: the records would not fit once loaded.
pub fn fits_this_host(want: u64, sizes: Sizes, records: u64) -> Result<(), String> {
    match physical_memory() {
        Some(have) if want > have => Err(format!(
            "{records} records of {}-byte keys and {}-byte values need about {} MiB of memory nodes, more than this host's {} MiB; lower --tree-records, or --cores and --tasks (each task takes a chunk of memory of its own)",
            sizes.key_bytes(),
            sizes.value_bytes(),
            want >> 20,
            have >> 20
        )),
        _ => Ok(()),
    }
}

/// This host's memory, in bytes (`sysconf`); `None` where it says none.
fn physical_memory() -> Option<u64> {
    // SAFETY: sysconf only reads system configuration values.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages > 0 && page > 0).then(|| pages as u64 * page as u64)
}

/// Checks the demo's options (bad input: `loch demo` exits 2 on an error).
pub fn validate(cfg: &DemoConfig) -> Result<(), String> {
    if cfg.memory_nodes == 0 || cfg.cores == 0 || cfg.tasks_per_core == 0 || cfg.compute_nodes == 0
    {
        return Err(
            "memory nodes, compute nodes, cores and tasks per core must all be at least 1".into(),
        );
    }
    if cfg.memory_nodes > 64 || cfg.cores > 1024 || cfg.tasks_per_core > 1024 {
        return Err("at most 64 memory nodes, 1024 cores and 1024 tasks per core".into());
    }
    // The cores spread over the compute nodes: one with none runs nothing.
    if cfg.compute_nodes > cfg.cores {
        return Err(format!(
            "{} compute nodes need at least as many cores, got {}",
            cfg.compute_nodes, cfg.cores
        ));
    }
    if !(cfg.seconds > 0.0 && cfg.seconds <= 60.0) {
        return Err(format!("seconds must be in (0, 60], got {}", cfg.seconds));
    }
    nicdrv::emu::check_latency(cfg.latency_ns).map_err(|e| format!("--latency-ns {e}"))?;
    if cfg.tree_records > crate::node::RECORDS_MAX {
        // `loch node --records`' bound; far more than the demo's memory
        // nodes hold, which the load then says.
        return Err(format!(
            "--tree-records must be at most {}, got {}",
            crate::node::RECORDS_MAX,
            cfg.tree_records
        ));
    }
    check_tree(&cfg.tree)?;
    let host = host_bytes(cfg);
    if cfg.tree_records > 0 {
        fits_this_host(
            host.saturating_mul(cfg.memory_nodes as u64),
            cfg.sizes,
            cfg.tree_records,
        )?;
    }
    let tasks = cfg.cores * cfg.tasks_per_core;
    let chunks_per_node = (host - SUPERBLOCK_BYTES) / CHUNK_BYTES;
    if tasks as u64 > chunks_per_node * cfg.memory_nodes as u64 {
        return Err(format!(
            "{tasks} tasks need more than the {} chunks the memory nodes hold",
            chunks_per_node * cfg.memory_nodes as u64
        ));
    }
    if !cfg.faults.is_empty() && cfg.backend != DemoBackend::Sim {
        return Err("--fault and --fault-seed apply to --backend sim only".into());
    }
    for f in &cfg.faults {
        // The verb phase's threads are the world's first `cores`.
        f.check_with_threads(cfg.memory_nodes, cfg.compute_nodes, cfg.cores)?;
    }
    Ok(())
}

/// The summary's header and the verb phase's figures.
fn stats_text(header: &str, stats: &RunStats) -> String {
    let mut text = String::new();
    let c = &stats.counters;
    let _ = writeln!(text, "{header}");
    let _ = writeln!(text, "  operations          {}", stats.ops);
    let _ = writeln!(text, "  operations/s        {:.0}", stats.ops_per_sec());
    let _ = writeln!(
        text,
        "  round trips/op      {:.3}",
        stats.per_op(c.round_trips)
    );
    let _ = writeln!(
        text,
        "  verbs/op            {:.3}  (read {}, write {}, cas {}, faa {})",
        stats.per_op(c.verbs()),
        c.reads,
        c.writes,
        c.cas,
        c.faa
    );
    let _ = writeln!(
        text,
        "  bytes read/op       {:.1}",
        stats.per_op(c.bytes_read)
    );
    let _ = writeln!(
        text,
        "  bytes written/op    {:.1}",
        stats.per_op(c.bytes_written)
    );
    let _ = writeln!(
        text,
        "  latency p50         {} ns",
        stats.latency_ns.value_at_quantile(0.5)
    );
    let _ = writeln!(
        text,
        "  latency p99         {} ns",
        stats.latency_ns.value_at_quantile(0.99)
    );
    text
}

/// Runs the demo, printing progress to stderr; returns the report.
pub fn run(cfg: &DemoConfig) -> Result<DemoReport, String> {
    validate(cfg)?;
    let faulty = !cfg.faults.is_empty();
    let (stats, tally, counters, header, tree) = match cfg.backend {
        DemoBackend::Emu => run_emu(cfg)?,
        DemoBackend::Sim => run_sim(cfg)?,
    };
    let mut text = stats_text(&header, &stats);
    let Tally {
        faa,
        cas,
        mismatches: mism,
        failures: fail,
        failed_faa,
        failed_cas,
    } = tally;
    let (faa_counter, cas_total) = counters;
    let mut failed_checks = 0;
    // A counter equals what the tasks saw succeed, plus at most the
    // operations on it that failed (their effect is unknown). An unreadable
    // counter (its memory node crashed) cannot be checked.
    let mut counter_check = |what: &str, memory: Option<u64>, seen: u64, unknown: u64| {
        let line = match memory {
            None => "cannot be read (its memory node crashed): skipped".to_string(),
            Some(m) if unknown == 0 => {
                failed_checks += u64::from(m != seen);
                format!("{m} = {seen}: {}", verdict(m == seen))
            }
            Some(m) => {
                let ok = (seen..=seen + unknown).contains(&m);
                failed_checks += u64::from(!ok);
                format!(
                    "{m} within {seen}..={} ({unknown} failed or unanswered): {}",
                    seen + unknown,
                    verdict(ok)
                )
            }
        };
        let _ = writeln!(text, "  check: {what} {line}");
    };
    counter_check(
        "shared FAA counter vs FAAs issued:",
        faa_counter,
        faa,
        failed_faa,
    );
    counter_check(
        "per-core CAS counters sum vs CAS increments won:",
        cas_total,
        cas,
        failed_cas,
    );
    let _ = writeln!(
        text,
        "  check: reads of own words matching last write: {mism} mismatches: {}",
        verdict(mism == 0)
    );
    if faulty {
        let _ = writeln!(
            text,
            "  failed operations: {fail} (faults injected: each failing task stopped, the others went on)"
        );
    } else {
        failed_checks += fail;
        let _ = writeln!(
            text,
            "  check: failed operations: {fail}: {}",
            verdict(fail == 0)
        );
    }
    let failures = failed_checks;
    if let Some(t) = &tree {
        for p in t {
            text.push_str(&crate::demo_index::summary(p));
        }
    }
    // Transactions run on machines of their own, which the demo's faults
    // (memory and compute nodes of the other phases) do not name: with
    // faults the phase is skipped. A stop request skips it too.
    let txn = if cfg.txn_txs > 0 && !faulty && !cmdline::signals::stop_requested() {
        let t = crate::demo_txn::run(cfg, cfg.txn_txs)?;
        text.push_str(&t.text);
        Some(t)
    } else {
        None
    };
    Ok(DemoReport {
        stats,
        faa_issued: faa,
        faa_counter: faa_counter.unwrap_or(u64::MAX),
        mismatches: mism,
        failures,
        tree,
        txn,
        text,
    })
}

/// Stats, what the tasks counted, (FAA counter, sum of CAS words) as
/// memory holds them (`None`: unreadable), header.
type Outcome = (
    RunStats,
    Tally,
    (Option<u64>, Option<u64>),
    String,
    Option<Vec<crate::demo_index::IndexPhase>>,
);

fn tally_of(sh: &VerbPhaseTally) -> Tally {
    Tally {
        faa: sh.faa.get(),
        cas: sh.cas_incs.get(),
        mismatches: sh.mismatches.get(),
        failures: sh.failures.get(),
        failed_faa: sh.failed_faa.get(),
        failed_cas: sh.failed_cas.get(),
    }
}

/// The verb phase: `tasks_per_core` demo tasks on every core.
struct VerbPhase<'a> {
    cfg: &'a DemoConfig,
    /// How every user of the memory nodes cuts them into chunks.
    chunk: ChunkConfig,
    duration_ns: u64,
    /// Operations so far, over every core (the emu progress line).
    progress: Arc<AtomicU64>,
}

impl Workload for VerbPhase<'_> {
    type Group = Rc<VerbPhaseTally>;
    type Out = (CoreStats, Tally);

    fn group(&self, _: usize, _: usize) -> Rc<VerbPhaseTally> {
        VerbPhaseTally::new(self.progress.clone(), !self.cfg.faults.is_empty())
    }

    fn spawn<N: Nic, S: Spawn<N>>(
        &self,
        place: Place,
        sh: &Rc<VerbPhaseTally>,
        on: &mut S,
    ) -> Result<(), String> {
        let mut seeds = Rng::stream(self.cfg.seed, Domain::Core, place.core as u64);
        for _ in 0..self.cfg.tasks_per_core {
            let (rng, sh2, duration_ns) = (seeds.fork(), sh.clone(), self.duration_ns);
            let alloc = RemoteAllocator::new(self.chunk.clone()).map_err(|e| e.to_string())?;
            let cw = cas_word(place.core, self.cfg.memory_nodes);
            on.spawn_task(move |ctx| demo_task(ctx, rng, alloc, cw, duration_ns, sh2))?;
        }
        Ok(())
    }

    fn finish(&self, sh: Rc<VerbPhaseTally>, counters: VerbCounters) -> (CoreStats, Tally) {
        let latency_ns = sh.hist.borrow().clone();
        let core = CoreStats {
            ops: sh.ops.get(),
            latency_ns,
            counters,
        };
        (core, tally_of(&sh))
    }
}

fn exec_config(cfg: &DemoConfig) -> ExecutorConfig {
    ExecutorConfig {
        slots: cfg.tasks_per_core,
        scratch_bytes_per_slot: 16 * 1024,
        poll_batch: 32,
    }
}

fn run_emu(cfg: &DemoConfig) -> Result<Outcome, String> {
    let host = host_bytes(cfg);
    cmdline::errln!(
        "loch demo: booting an emu cluster on this host: {} memory nodes × {} MiB host + 256 KiB device memory, {} compute cores × {} tasks",
        cfg.memory_nodes,
        host >> 20,
        cfg.cores,
        cfg.tasks_per_core
    );
    let boot = Instant::now();
    let cluster = EmuCluster::boot(&EmuClusterConfig {
        memory_nodes: cfg.memory_nodes,
        host_bytes: host,
        dm_bytes: crate::demo_index::DM_BYTES,
        emu: EmuConfig {
            latency_ns_one_way: cfg.latency_ns,
            ..Default::default()
        },
    })
    .map_err(|e| e.to_string())?;
    cmdline::errln!(
        "loch demo: memory nodes up in {:.1} ms",
        boot.elapsed().as_secs_f64() * 1e3
    );

    let progress = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let printer = {
        let (ops, done) = (progress.clone(), done.clone());
        std::thread::spawn(move || {
            let t0 = Instant::now();
            let (mut last, mut tick) = (0, 1);
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
                if t0.elapsed() >= Duration::from_secs(tick) {
                    let now = ops.load(Ordering::Relaxed);
                    cmdline::errln!(
                        "loch demo: t={tick}s  {now:>10} ops  {:>8.2} Mops/s",
                        (now - last) as f64 / 1e6
                    );
                    last = now;
                    tick += 1;
                }
            }
        })
    };
    let work = VerbPhase {
        cfg,
        chunk: chunk_config(host),
        duration_ns: (cfg.seconds * 1e9) as u64,
        progress,
    };
    let started = Instant::now();
    let results = cluster
        .run(&work, cfg.cores, exec_config(cfg), cfg.pin)
        .map_err(|e| e.to_string())?;
    let elapsed_ns = started.elapsed().as_nanos() as u64;
    done.store(true, Ordering::Relaxed);
    let _ = printer.join();
    let mut tally = Tally::default();
    let mut cores = Vec::new();
    for (c, t) in results {
        cores.push(c);
        tally += t;
    }
    let faa_counter = cluster
        .node(0)
        .map(|n| n.host().load_u64(SHARED_FAA.offset()));
    let cas_total = (0..cfg.cores)
        .map(|c| {
            let a = cas_word(c, cfg.memory_nodes);
            cluster
                .node(a.node() as usize)
                .map(|n| n.device().load_u64(a.offset()))
        })
        .sum();
    let header = format!(
        "loch demo summary (emu backend, {} memory nodes, {} cores × {} tasks)",
        cfg.memory_nodes, cfg.cores, cfg.tasks_per_core
    );
    let tree = crate::demo_index::run_phases(cfg, host, &work.chunk, |tcfg, kind| {
        crate::demo_index::run_emu(&cluster, tcfg, cfg, kind)
    })?;
    Ok((
        RunStats::merge(cores, elapsed_ns),
        tally,
        (faa_counter, cas_total),
        header,
        tree,
    ))
}

fn run_sim(cfg: &DemoConfig) -> Result<Outcome, String> {
    let host = host_bytes(cfg);
    let mut model = SimModel::default();
    if cfg.latency_ns != 0 {
        model.link_latency_ns_one_way = cfg.latency_ns;
    }
    cmdline::errln!(
        "loch demo: simulating a cluster (seed {}): {} memory nodes × {} MiB, {} compute nodes, {} threads × {} tasks, {} virtual ms",
        cfg.seed,
        cfg.memory_nodes,
        host >> 20,
        cfg.compute_nodes,
        cfg.cores,
        cfg.tasks_per_core,
        cfg.seconds * 1e3
    );
    let mut w = World::new(SimConfig {
        seed: cfg.seed,
        memory_nodes: cfg.memory_nodes,
        host_bytes: host,
        dm_bytes: crate::demo_index::DM_BYTES,
        compute_nodes: cfg.compute_nodes,
        machines: 0,
        model,
        faults: cfg.faults.clone(),
    })
    .map_err(|e| e.to_string())?;
    let duration_ns = (cfg.seconds * 1e9) as u64;
    let work = VerbPhase {
        cfg,
        chunk: chunk_config(host),
        duration_ns,
        progress: Arc::new(AtomicU64::new(0)),
    };
    let spawned = simrun::spawn(
        &mut w,
        &work,
        cfg.cores,
        exec_config(cfg),
        Placement::RoundRobin,
    )?;
    let sh = spawned.group.clone();
    let wall = Instant::now();
    let end = run_verb_phase(&mut w, cfg, &sh, duration_ns);
    let stuck = w.live_tasks();
    if end != RunEnd::Done && cfg.faults.is_empty() {
        return Err(format!(
            "the simulation ended {end:?} with tasks unfinished"
        ));
    }
    if stuck > 0 {
        cmdline::errln!("loch demo: {stuck} verb tasks did not finish (faults injected)");
        // They must not run on into the index phases.
        spawned.halt(&mut w);
    }
    let wall_s = wall.elapsed().as_secs_f64();
    let (core, tally) = spawned.finish(&w, &work);
    let mut stats = RunStats::merge(vec![core], w.now_ns());
    stats.threads = cfg.cores;
    let faa_counter = w.read_u64(0, Space::Host, SHARED_FAA.offset());
    let cas_total = (0..cfg.cores)
        .map(|c| {
            let a = cas_word(c, cfg.memory_nodes);
            w.read_u64(a.node(), Space::Device, a.offset())
        })
        .sum::<Option<u64>>();
    let header = format!(
        "loch demo summary (sim backend, seed {}, SIMULATED time: {} memory nodes, {} compute nodes, {} threads × {} tasks; {} events, {:.2} M simulated verbs/wall s, trace {:016x})",
        cfg.seed,
        cfg.memory_nodes,
        cfg.compute_nodes,
        cfg.cores,
        cfg.tasks_per_core,
        w.events(),
        w.verbs() as f64 / wall_s.max(1e-9) / 1e6,
        w.trace_hash()
    );
    let tree = crate::demo_index::run_phases(cfg, host, &work.chunk, |tcfg, kind| {
        crate::demo_index::run_sim(&mut w, tcfg, cfg, kind)
    })?;
    Ok((stats, tally, (faa_counter, cas_total), header, tree))
}

/// Runs the verb phase on `w` in five steps to its deadline, a progress
/// line each, then to its end: every task (no faults), or `FAULT_QUIET_NS`
/// past the deadline (a task can wait forever on a crashed node).
fn run_verb_phase(
    w: &mut World,
    cfg: &DemoConfig,
    sh: &VerbPhaseTally,
    duration_ns: u64,
) -> RunEnd {
    let steps = 5;
    let mut last = 0;
    let mut end = RunEnd::Limit;
    for i in 1..=steps {
        let until = duration_ns * i / steps;
        end = w.run_until(until);
        let now = sh.ops.get();
        cmdline::errln!(
            "loch demo: t={:.2} virtual ms  {now:>10} ops  {:>8.2} Mops/s simulated",
            w.now_ns() as f64 / 1e6,
            (now - last) as f64 / (duration_ns / steps) as f64 * 1e3
        );
        last = now;
        if end == RunEnd::Done {
            break;
        }
    }
    if end != RunEnd::Done {
        end = if cfg.faults.is_empty() {
            w.run()
        } else {
            w.run_until(duration_ns + crate::demo_index::FAULT_QUIET_NS)
        };
    }
    end
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "FAILED"
    }
}
