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

use crate::cluster::{EmuCluster, EmuClusterConfig};
use crate::stats::{latency_histogram, CoreStats, RunStats};
use hdrhistogram::Histogram;
use mempool::{ChunkConfig, RemoteAllocator, SUPERBLOCK_BYTES};
use nicdrv::emu::EmuConfig;
use nicdrv::rng::{Domain, Rng};
use nicdrv::sim::{RunEnd, SimConfig, SimModel, World};
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
        }
    }
}

/// Words each task owns and checks (64 bytes apart, one per cache line).
const TASK_WORDS: u64 = 512;
const HOST_BYTES: u64 = 64 << 20;
const CHUNK_BYTES: u64 = 256 << 10;
/// The shared FAA counter lives in node 0's superblock spare space
/// (mempool reserves the first 4 KiB; words past 1 KiB are unused).
const SHARED_FAA: GlobalAddr = GlobalAddr::host(0, 2048);

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
    pub tree: Option<Vec<crate::demo_tree::TreePhase>>,
    pub text: String,
}

impl DemoReport {
    pub fn ok(&self) -> bool {
        self.faa_issued == self.faa_counter
            && self.mismatches == 0
            && self.failures == 0
            && self
                .tree
                .iter()
                .flatten()
                .all(|t| t.mismatches == 0 && t.failures == 0)
    }
}

/// What the tasks of one core (emu) or one world (sim) share.
struct Shared {
    hist: RefCell<Histogram<u64>>,
    ops: Cell<u64>,
    faa: Cell<u64>,
    cas_incs: Cell<u64>,
    mismatches: Cell<u64>,
    failures: Cell<u64>,
    progress: Arc<AtomicU64>,
}

impl Shared {
    fn new(progress: Arc<AtomicU64>) -> Rc<Shared> {
        Rc::new(Shared {
            hist: RefCell::new(latency_histogram()),
            ops: Cell::new(0),
            faa: Cell::new(0),
            cas_incs: Cell::new(0),
            mismatches: Cell::new(0),
            failures: Cell::new(0),
            progress,
        })
    }

    fn fail(&self, what: &str, e: impl std::fmt::Display) {
        log::error!("demo {what} failed: {e}");
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
    sh: Rc<Shared>,
) {
    let area = match alloc.alloc(&ctx, TASK_WORDS * 64, 64).await {
        Ok(a) => a,
        Err(e) => return sh.fail("allocation", e),
    };
    let mut shadow = vec![0u64; TASK_WORDS as usize];
    let deadline = ctx.nic().now_ns() + duration_ns;
    let mut local_ops = 0u64;
    while ctx.now_ns() < deadline {
        let t0 = ctx.now_ns();
        let w = rng.below(TASK_WORDS);
        let addr = area.add(w * 64);
        let r = match rng.below(100) {
            0..=29 => ctx.read(addr, 64).await.map(|b| {
                if b.u64_at(0) != shadow[w as usize] {
                    sh.mismatches.set(sh.mismatches.get() + 1);
                }
            }),
            30..=49 => {
                let v = rng.next_u64();
                let mut line = [0u8; 64];
                line[..8].copy_from_slice(&v.to_le_bytes());
                let r = ctx.write(addr, &line).await;
                if r.is_ok() {
                    shadow[w as usize] = v;
                }
                r
            }
            50..=69 => ctx
                .faa(SHARED_FAA, 1)
                .await
                .map(|_| sh.faa.set(sh.faa.get() + 1)),
            70..=84 => {
                // A contended CAS increment, retried until it wins.
                let mut cur = 0;
                loop {
                    match ctx.cas(cas_word, cur, cur + 1).await {
                        Ok(old) if old == cur => {
                            sh.cas_incs.set(sh.cas_incs.get() + 1);
                            break Ok(());
                        }
                        Ok(old) => cur = old,
                        Err(e) => break Err(e),
                    }
                }
            }
            _ => {
                // One doorbell per node, one round trip: read one of our
                // words and bump the shared counter.
                let mut b = ctx.batch();
                let rd = b.read_new(addr, 64);
                b.faa(SHARED_FAA, 1);
                b.submit().await.map(|d| {
                    sh.faa.set(sh.faa.get() + 1);
                    if d.word(rd) != shadow[w as usize] {
                        sh.mismatches.set(sh.mismatches.get() + 1);
                    }
                })
            }
        };
        if let Err(e) = r {
            return sh.fail("operation", e);
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

fn chunk_config() -> ChunkConfig {
    ChunkConfig {
        chunk_bytes: CHUNK_BYTES,
        ..ChunkConfig::new(HOST_BYTES)
    }
}

/// Runs the demo, printing progress to stderr; returns the report.
pub fn run(cfg: &DemoConfig) -> Result<DemoReport, String> {
    if cfg.memory_nodes == 0 || cfg.cores == 0 || cfg.tasks_per_core == 0 || cfg.compute_nodes == 0
    {
        return Err(
            "memory nodes, compute nodes, cores and tasks per core must all be at least 1".into(),
        );
    }
    if cfg.memory_nodes > 64 || cfg.cores > 1024 || cfg.tasks_per_core > 1024 {
        return Err("at most 64 memory nodes, 1024 cores and 1024 tasks per core".into());
    }
    if !(cfg.seconds > 0.0 && cfg.seconds <= 60.0) {
        return Err(format!("seconds must be in (0, 60], got {}", cfg.seconds));
    }
    let tasks = cfg.cores * cfg.tasks_per_core;
    let chunks_per_node = (HOST_BYTES - SUPERBLOCK_BYTES) / CHUNK_BYTES;
    if tasks as u64 > chunks_per_node * cfg.memory_nodes as u64 {
        return Err(format!(
            "{tasks} tasks need more than the {} chunks the memory nodes hold",
            chunks_per_node * cfg.memory_nodes as u64
        ));
    }
    let (stats, tally, counters, header, tree) = match cfg.backend {
        DemoBackend::Emu => run_emu(cfg)?,
        DemoBackend::Sim => run_sim(cfg)?,
    };
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
    let (faa, cas, mism, fail) = tally;
    let (faa_counter, cas_total) = counters;
    let _ = writeln!(
        text,
        "  check: shared FAA counter {faa_counter} = FAAs issued {faa}: {}",
        verdict(faa_counter == faa)
    );
    let _ = writeln!(
        text,
        "  check: per-core CAS counters sum {cas_total} = CAS increments won {cas}: {}",
        verdict(cas_total == cas)
    );
    let _ = writeln!(
        text,
        "  check: reads of own words matching last write: {mism} mismatches: {}",
        verdict(mism == 0)
    );
    let _ = writeln!(
        text,
        "  check: failed operations: {fail}: {}",
        verdict(fail == 0)
    );
    let failures = fail + u64::from(cas_total != cas);
    if let Some(t) = &tree {
        for p in t {
            text.push_str(&crate::demo_tree::summary(p));
        }
    }
    Ok(DemoReport {
        stats,
        faa_issued: faa,
        faa_counter,
        mismatches: mism,
        failures,
        tree,
        text,
    })
}

/// Stats, (FAAs, CAS increments, mismatches, failures) as the tasks counted
/// them, (FAA counter, sum of CAS words) as memory holds them, header.
type Outcome = (
    RunStats,
    (u64, u64, u64, u64),
    (u64, u64),
    String,
    Option<Vec<crate::demo_tree::TreePhase>>,
);

fn tally_of(sh: &Shared) -> (u64, u64, u64, u64) {
    (
        sh.faa.get(),
        sh.cas_incs.get(),
        sh.mismatches.get(),
        sh.failures.get(),
    )
}

fn run_emu(cfg: &DemoConfig) -> Result<Outcome, String> {
    eprintln!(
        "loch demo: booting an emu cluster on this host: {} memory nodes × {} MiB host + 256 KiB device memory, {} compute cores × {} tasks",
        cfg.memory_nodes,
        HOST_BYTES >> 20,
        cfg.cores,
        cfg.tasks_per_core
    );
    let boot = Instant::now();
    let cluster = EmuCluster::boot(&EmuClusterConfig {
        memory_nodes: cfg.memory_nodes,
        host_bytes: HOST_BYTES,
        dm_bytes: 256 << 10,
        emu: EmuConfig {
            latency_ns_one_way: cfg.latency_ns,
            ..Default::default()
        },
    })
    .map_err(|e| e.to_string())?;
    eprintln!(
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
                    eprintln!(
                        "loch demo: t={tick}s  {now:>10} ops  {:>8.2} Mops/s",
                        (now - last) as f64 / 1e6
                    );
                    last = now;
                    tick += 1;
                }
            }
        })
    };
    let exec_cfg = ExecutorConfig {
        slots: cfg.tasks_per_core,
        scratch_bytes_per_slot: 16 * 1024,
        poll_batch: 32,
    };
    let duration_ns = (cfg.seconds * 1e9) as u64;
    let started = Instant::now();
    let results = cluster
        .run_cores(cfg.cores, exec_cfg, cfg.pin, |core, ex| {
            let sh = Shared::new(progress.clone());
            let mut seeds = Rng::stream(cfg.seed, Domain::Core, core as u64);
            for _ in 0..cfg.tasks_per_core {
                let (rng, sh2) = (seeds.fork(), sh.clone());
                let alloc = RemoteAllocator::new(chunk_config()).expect("valid chunk config");
                let cw = cas_word(core, cfg.memory_nodes);
                ex.spawn(move |ctx| demo_task(ctx, rng, alloc, cw, duration_ns, sh2))
                    .expect("one slot per task");
            }
            ex.run();
            let latency_ns = sh.hist.borrow().clone();
            (
                CoreStats {
                    ops: sh.ops.get(),
                    latency_ns,
                    counters: ex.counters(),
                },
                tally_of(&sh),
            )
        })
        .map_err(|e| e.to_string())?;
    let elapsed_ns = started.elapsed().as_nanos() as u64;
    done.store(true, Ordering::Relaxed);
    let _ = printer.join();
    let mut tally = (0, 0, 0, 0);
    let mut cores = Vec::new();
    for (c, t) in results {
        cores.push(c);
        tally = (tally.0 + t.0, tally.1 + t.1, tally.2 + t.2, tally.3 + t.3);
    }
    let faa_counter = cluster.node(0).host().load_u64(SHARED_FAA.offset());
    let cas_total = (0..cfg.cores)
        .map(|c| {
            let a = cas_word(c, cfg.memory_nodes);
            cluster
                .node(a.node() as usize)
                .device()
                .load_u64(a.offset())
        })
        .sum();
    let header = format!(
        "loch demo summary (emu backend, {} memory nodes, {} cores × {} tasks)",
        cfg.memory_nodes, cfg.cores, cfg.tasks_per_core
    );
    let tree = crate::demo_tree::run_phases(cfg, HOST_BYTES, &chunk_config(), |tcfg, kind| {
        crate::demo_tree::run_emu(&cluster, tcfg, cfg, kind)
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
    let mut model = SimModel::default();
    if cfg.latency_ns != 0 {
        model.link_latency_ns_one_way = cfg.latency_ns;
    }
    eprintln!(
        "loch demo: simulating a cluster (seed {}): {} memory nodes × {} MiB, {} compute nodes, {} threads × {} tasks, {} virtual ms",
        cfg.seed,
        cfg.memory_nodes,
        HOST_BYTES >> 20,
        cfg.compute_nodes,
        cfg.cores,
        cfg.tasks_per_core,
        cfg.seconds * 1e3
    );
    let mut w = World::new(SimConfig {
        seed: cfg.seed,
        memory_nodes: cfg.memory_nodes,
        host_bytes: HOST_BYTES,
        dm_bytes: 256 << 10,
        compute_nodes: cfg.compute_nodes,
        model,
        faults: Vec::new(),
    })
    .map_err(|e| e.to_string())?;
    let sh = Shared::new(Arc::new(AtomicU64::new(0)));
    let exec_cfg = ExecutorConfig {
        slots: cfg.tasks_per_core,
        scratch_bytes_per_slot: 16 * 1024,
        poll_batch: 32,
    };
    let duration_ns = (cfg.seconds * 1e9) as u64;
    for c in 0..cfg.cores {
        let mut seeds = Rng::stream(cfg.seed, Domain::Core, c as u64);
        let t = w
            .add_thread((c % cfg.compute_nodes) as u16, exec_cfg)
            .map_err(|e| e.to_string())?;
        for _ in 0..cfg.tasks_per_core {
            let (rng, sh2) = (seeds.fork(), sh.clone());
            let alloc = RemoteAllocator::new(chunk_config()).expect("valid chunk config");
            let cw = cas_word(c, cfg.memory_nodes);
            w.spawn(t, move |ctx| {
                demo_task(ctx, rng, alloc, cw, duration_ns, sh2)
            })
            .map_err(|e| e.to_string())?;
        }
    }
    let wall = Instant::now();
    let steps = 5;
    let mut last = 0;
    let mut end = RunEnd::Limit;
    for i in 1..=steps {
        let until = duration_ns * i / steps;
        end = w.run_until(until);
        let now = sh.ops.get();
        eprintln!(
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
        end = w.run();
    }
    if end != RunEnd::Done {
        return Err(format!(
            "the simulation ended {end:?} with tasks unfinished"
        ));
    }
    let wall_s = wall.elapsed().as_secs_f64();
    let mut counters = VerbCounters::default();
    for t in 0..w.threads() as u32 {
        counters += w.executor(t).map(|e| e.counters()).unwrap_or_default();
    }
    let latency_ns = sh.hist.borrow().clone();
    let mut stats = RunStats::merge(
        vec![CoreStats {
            ops: sh.ops.get(),
            latency_ns,
            counters,
        }],
        w.now_ns(),
    );
    stats.threads = cfg.cores;
    let faa_counter = w
        .read_u64(0, Space::Host, SHARED_FAA.offset())
        .unwrap_or(u64::MAX);
    let cas_total = (0..cfg.cores)
        .map(|c| {
            let a = cas_word(c, cfg.memory_nodes);
            w.read_u64(a.node(), Space::Device, a.offset())
                .unwrap_or(u64::MAX)
        })
        .sum();
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
    let tree = crate::demo_tree::run_phases(cfg, HOST_BYTES, &chunk_config(), |tcfg, kind| {
        crate::demo_tree::run_sim(&mut w, tcfg, cfg, kind)
    })?;
    Ok((stats, tally_of(&sh), (faa_counter, cas_total), header, tree))
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "FAILED"
    }
}
