//! `loch demo`: boots a whole cluster on this host with the emu backend —
//! memory nodes as shared mappings, compute cores as pinned threads — and
//! runs a short mixed verb workload on it, printing progress each second
//! and a summary. It checks its own results: every FAA on the shared
//! counter is accounted for, and every READ of a task's private words
//! returns what that task last wrote there.
//!
//! The workload grows with Loch: later capabilities (the B+tree, the hash
//! table, transactions) join it.

use crate::cluster::{EmuCluster, EmuClusterConfig};
use crate::stats::{latency_histogram, CoreStats, RunStats};
use mempool::{ChunkConfig, RemoteAllocator, SUPERBLOCK_BYTES};
use nicdrv::emu::EmuConfig;
use nicdrv::rng::Rng;
use nicdrv::{ExecutorConfig, GlobalAddr};
use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Options of `loch demo`.
#[derive(Clone, Debug)]
pub struct DemoConfig {
    pub memory_nodes: usize,
    pub cores: usize,
    pub tasks_per_core: usize,
    pub seconds: f64,
    pub seed: u64,
    pub latency_ns: u64,
    pub pin: bool,
}

impl Default for DemoConfig {
    fn default() -> Self {
        DemoConfig {
            memory_nodes: 2,
            cores: 2,
            tasks_per_core: 8,
            seconds: 3.0,
            seed: 1,
            latency_ns: 0,
            pin: true,
        }
    }
}

/// Words each task owns and checks (64 bytes apart, one per cache line).
const TASK_WORDS: u64 = 512;
const HOST_BYTES: u64 = 64 << 20;
const CHUNK_BYTES: u64 = 1 << 20;
/// The shared FAA counter and CAS word live in node 0's superblock spare
/// space (mempool reserves the first 4 KiB; words past 1 KiB are unused).
const SHARED_FAA: GlobalAddr = GlobalAddr::host(0, 2048);
const SHARED_CAS: GlobalAddr = GlobalAddr::host(0, 2112);

/// What the demo found.
pub struct DemoReport {
    pub stats: RunStats,
    pub faa_issued: u64,
    pub faa_counter: u64,
    pub mismatches: u64,
    pub failures: u64,
    pub text: String,
}

impl DemoReport {
    pub fn ok(&self) -> bool {
        self.faa_issued == self.faa_counter && self.mismatches == 0 && self.failures == 0
    }
}

#[derive(Default)]
struct TaskTally {
    faa: u64,
    mismatches: u64,
    failures: u64,
}

/// Runs the demo, printing progress to stderr; returns the report.
pub fn run(cfg: &DemoConfig) -> Result<DemoReport, String> {
    if cfg.memory_nodes == 0 || cfg.cores == 0 || cfg.tasks_per_core == 0 {
        return Err("memory nodes, cores and tasks per core must all be at least 1".into());
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

    let progress_ops = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let printer = {
        let (ops, done) = (progress_ops.clone(), done.clone());
        std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut last = 0;
            let mut tick = 1;
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
                if t0.elapsed() >= Duration::from_secs(tick) {
                    let now = ops.load(Ordering::Relaxed);
                    eprintln!(
                        "loch demo: t={tick}s  {:>10} ops  {:>8.2} Mops/s",
                        now,
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
    let chunk_cfg = ChunkConfig {
        chunk_bytes: CHUNK_BYTES,
        ..ChunkConfig::new(HOST_BYTES)
    };
    let duration_ns = (cfg.seconds * 1e9) as u64;
    let started = Instant::now();
    let results = cluster
        .run_cores(cfg.cores, exec_cfg, cfg.pin, |core, ex| {
            let hist = Rc::new(RefCell::new(latency_histogram()));
            let ops = Rc::new(Cell::new(0u64));
            let tally = Rc::new(RefCell::new(TaskTally::default()));
            let mut seeds = Rng::new(cfg.seed ^ (core as u64).wrapping_mul(0x9E37_79B9));
            for _ in 0..cfg.tasks_per_core {
                let (hist, ops, tally, progress) = (
                    hist.clone(),
                    ops.clone(),
                    tally.clone(),
                    progress_ops.clone(),
                );
                let mut rng = seeds.fork();
                let alloc = RemoteAllocator::new(chunk_cfg.clone()).expect("valid chunk config");
                ex.spawn(move |ctx| async move {
                    let area = match alloc.alloc(&ctx, TASK_WORDS * 64, 64).await {
                        Ok(a) => a,
                        Err(e) => {
                            log::error!("allocation failed: {e}");
                            tally.borrow_mut().failures += 1;
                            return;
                        }
                    };
                    let mut shadow = vec![0u64; TASK_WORDS as usize];
                    let deadline = nicdrv::Nic::now_ns(ctx.nic()) + duration_ns;
                    let mut local_ops = 0u64;
                    while ctx.now_ns() < deadline {
                        let t0 = ctx.now_ns();
                        let w = rng.below(TASK_WORDS);
                        let addr = area.add(w * 64);
                        let r = match rng.below(100) {
                            0..=29 => ctx.read(addr, 64).await.map(|b| {
                                if b.u64_at(0) != shadow[w as usize] {
                                    tally.borrow_mut().mismatches += 1;
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
                                .map(|_| tally.borrow_mut().faa += 1),
                            70..=84 => {
                                // A contended CAS increment, retried until it wins.
                                let mut cur = 0;
                                loop {
                                    match ctx.cas(SHARED_CAS, cur, cur + 1).await {
                                        Ok(old) if old == cur => break Ok(()),
                                        Ok(old) => cur = old,
                                        Err(e) => break Err(e),
                                    }
                                }
                            }
                            _ => {
                                // One doorbell per node, one round trip: read one
                                // of our words and bump the shared counter.
                                let mut b = ctx.batch();
                                let rd = b.read_new(addr, 64);
                                b.faa(SHARED_FAA, 1);
                                b.submit().await.map(|d| {
                                    let mut t = tally.borrow_mut();
                                    t.faa += 1;
                                    if d.word(rd) != shadow[w as usize] {
                                        t.mismatches += 1;
                                    }
                                })
                            }
                        };
                        if let Err(e) = r {
                            log::error!("demo operation failed: {e}");
                            tally.borrow_mut().failures += 1;
                            return;
                        }
                        let _ = hist.borrow_mut().record((ctx.now_ns() - t0).max(1));
                        ops.set(ops.get() + 1);
                        local_ops += 1;
                        if local_ops.is_multiple_of(1024) {
                            progress.fetch_add(1024, Ordering::Relaxed);
                        }
                    }
                    progress.fetch_add(local_ops % 1024, Ordering::Relaxed);
                })
                .expect("one slot per task");
            }
            ex.run();
            let latency_ns = hist.borrow().clone();
            let t = std::mem::take(&mut *tally.borrow_mut());
            (
                CoreStats {
                    ops: ops.get(),
                    latency_ns,
                    counters: ex.counters(),
                },
                t,
            )
        })
        .map_err(|e| e.to_string())?;
    let elapsed_ns = started.elapsed().as_nanos() as u64;
    done.store(true, Ordering::Relaxed);
    let _ = printer.join();

    let mut tally = TaskTally::default();
    let mut cores = Vec::new();
    for (c, t) in results {
        cores.push(c);
        tally.faa += t.faa;
        tally.mismatches += t.mismatches;
        tally.failures += t.failures;
    }
    let stats = RunStats::merge(cores, elapsed_ns);
    let faa_counter = cluster.node(0).host().load_u64(SHARED_FAA.offset());
    let mut text = String::new();
    let c = &stats.counters;
    let _ = writeln!(
        text,
        "loch demo summary (emu backend, {} memory nodes, {} cores × {} tasks)",
        cfg.memory_nodes, cfg.cores, cfg.tasks_per_core
    );
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
    let _ = writeln!(
        text,
        "  check: shared FAA counter {} = FAAs issued {}: {}",
        faa_counter,
        tally.faa,
        verdict(faa_counter == tally.faa)
    );
    let _ = writeln!(
        text,
        "  check: reads of own words matching last write: {} mismatches: {}",
        tally.mismatches,
        verdict(tally.mismatches == 0)
    );
    let _ = writeln!(
        text,
        "  check: failed operations: {}: {}",
        tally.failures,
        verdict(tally.failures == 0)
    );
    Ok(DemoReport {
        stats,
        faa_issued: tally.faa,
        faa_counter,
        mismatches: tally.mismatches,
        failures: tally.failures,
        text,
    })
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "FAILED"
    }
}
