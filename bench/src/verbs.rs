//! `loch-bench verbs`: a perftest-style microbenchmark of single verbs
//! (like ib_read_lat, ib_write_bw, ib_atomic_bw) through the executor, the
//! path every Loch data structure takes.
//!
//! Each compute thread runs one executor with `depth` tasks; each task
//! keeps one doorbell of `batch` verbs in flight (perftest's post list), so
//! `depth × batch` verbs are in flight per thread; `--batch 1` (the
//! default) is one verb per doorbell.
//! Tasks reuse one registered buffer each, so nothing is allocated or
//! zeroed per verb. Every task targets its own 64-byte-aligned slot on a
//! memory node (round robin over nodes) unless `--contended` puts them all
//! on one word. Latency is measured with the executor's per-turn clock.

use crate::args::{parse_size, ArgError, Args};
use appliance::cluster::{EmuCluster, EmuClusterConfig};
use appliance::stats::{latency_histogram, CoreStats, RunStats};
use nicdrv::emu::EmuConfig;
use nicdrv::{ExecutorConfig, GlobalAddr, Nic, Opcode};
use serde_json::json;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// One benchmark point.
#[derive(Clone, Debug)]
pub struct VerbSpec {
    pub verb: Opcode,
    pub size: usize,
    pub depth: usize,
    pub batch: usize,
    pub threads: usize,
    pub duration_ms: u64,
    pub max_ops: u64,
    pub memory_nodes: usize,
    pub latency_ns: u64,
    pub contended: bool,
    pub pin: bool,
}

fn parse_verb(s: &str) -> Result<Opcode, ArgError> {
    Ok(match s {
        "read" => Opcode::Read,
        "write" => Opcode::Write,
        "cas" => Opcode::Cas,
        "faa" => Opcode::Faa,
        "masked-cas" | "masked_cas" => Opcode::MaskedCas,
        _ => {
            return Err(ArgError(format!(
                "--verb: unknown verb `{s}` (read, write, cas, faa, masked-cas)"
            )))
        }
    })
}

/// Latency is per doorbell (all `batch` verbs of it complete together).
pub const USAGE: &str =
    "loch-bench verbs [--backend emu] [--verb read|write|cas|faa|masked-cas] [--size BYTES]
                  [--depth N] [--batch N] [--threads N] [--duration SECS] [--ops N] [--memory-nodes N]
                  [--latency-ns N] [--contended] [--no-pin] [--json] [--matrix]
  --matrix runs the foundation figures: 8 B READ, 1 KiB READ, 8 B WRITE, CAS and FAA at
  depth 1 and 16 (other flags still apply).";

pub fn run(raw: &[String]) -> Result<(), ArgError> {
    let mut a = Args::parse(raw, &["json", "contended", "no-pin", "matrix"])?;
    let backend = a.string("backend").unwrap_or_else(|| "emu".into());
    if backend != "emu" {
        return Err(ArgError(format!(
            "--backend: `{backend}` is not available (this build has: emu)"
        )));
    }
    let verb = parse_verb(&a.string("verb").unwrap_or_else(|| "read".into()))?;
    let size_s = a.string("size").unwrap_or_else(|| "8".into());
    let size =
        parse_size(&size_s).ok_or_else(|| ArgError(format!("--size: cannot parse `{size_s}`")))?;
    let depth: usize = a.get("depth", 1)?;
    let batch: usize = a.get("batch", 1)?;
    let threads: usize = a.get("threads", 1)?;
    let duration: f64 = a.get("duration", 2.0)?;
    let max_ops: u64 = a.get("ops", 0)?;
    let memory_nodes: usize = a.get("memory-nodes", 1)?;
    let latency_ns: u64 = a.get("latency-ns", 0)?;
    let contended = a.switch("contended");
    let pin = !a.switch("no-pin");
    let json = a.switch("json");
    let matrix = a.switch("matrix");
    a.finish()?;
    if depth == 0 || depth > 1024 {
        return Err(ArgError(format!("--depth must be 1..=1024, got {depth}")));
    }
    if batch == 0 || batch > nicdrv::exec::MAX_BATCH {
        return Err(ArgError(format!(
            "--batch must be 1..={}, got {batch}",
            nicdrv::exec::MAX_BATCH
        )));
    }
    if threads == 0 || threads > 256 {
        return Err(ArgError(format!(
            "--threads must be 1..=256, got {threads}"
        )));
    }
    if memory_nodes == 0 || memory_nodes > 64 {
        return Err(ArgError(format!(
            "--memory-nodes must be 1..=64, got {memory_nodes}"
        )));
    }
    if !(duration > 0.0 && duration <= 3600.0) {
        return Err(ArgError(format!(
            "--duration must be in (0, 3600] seconds, got {duration}"
        )));
    }
    if verb.is_atomic() {
        if size != 8 && size_s != "8" {
            return Err(ArgError("--size: atomics are 8 bytes".into()));
        }
    } else if size == 0 || size > 16 << 20 {
        return Err(ArgError(format!("--size must be 1 B..16 MiB, got {size}")));
    }
    let base = VerbSpec {
        verb,
        size: if verb.is_atomic() { 8 } else { size },
        depth,
        batch,
        threads,
        duration_ms: (duration * 1000.0) as u64,
        max_ops,
        memory_nodes,
        latency_ns,
        contended,
        pin,
    };
    let specs: Vec<VerbSpec> = if matrix {
        let mut v = Vec::new();
        for (verb, size) in [
            (Opcode::Read, 8),
            (Opcode::Read, 1024),
            (Opcode::Write, 8),
            (Opcode::Cas, 8),
            (Opcode::Faa, 8),
        ] {
            for depth in [1, 16] {
                v.push(VerbSpec {
                    verb,
                    size,
                    depth,
                    ..base.clone()
                });
            }
        }
        v
    } else {
        vec![base]
    };
    if !json {
        print_header();
    }
    let mut docs = Vec::new();
    for spec in &specs {
        let stats = measure(spec).map_err(|e| ArgError(format!("benchmark failed: {e}")))?;
        if json {
            docs.push(report_json(spec, &stats));
        } else {
            print_row(spec, &stats);
        }
    }
    if json {
        let out = if docs.len() == 1 {
            docs.pop().expect("one")
        } else {
            serde_json::Value::Array(docs)
        };
        println!("{out}");
    }
    Ok(())
}

/// Runs one point on a fresh emu cluster.
pub fn measure(spec: &VerbSpec) -> Result<RunStats, String> {
    let stride = spec.size.next_multiple_of(64).max(64) as u64;
    let slots_total = (spec.threads * spec.depth * spec.batch) as u64;
    let per_node = slots_total.div_ceil(spec.memory_nodes as u64);
    let host_bytes = (mempool::SUPERBLOCK_BYTES + per_node * stride).next_multiple_of(1 << 20);
    let cluster = EmuCluster::boot(&EmuClusterConfig {
        memory_nodes: spec.memory_nodes,
        host_bytes,
        dm_bytes: 64 << 10,
        emu: EmuConfig {
            latency_ns_one_way: spec.latency_ns,
            ..Default::default()
        },
    })
    .map_err(|e| e.to_string())?;
    let cfg = ExecutorConfig {
        slots: spec.depth,
        scratch_bytes_per_slot: (spec.size.next_multiple_of(8) * spec.batch).max(4096),
        poll_batch: 32,
    };
    let spec2 = spec.clone();
    let cores = cluster
        .run_cores(spec.threads, cfg, spec.pin, move |core, ex| {
            core_loop(&spec2, core, ex, stride)
        })
        .map_err(|e| e.to_string())?
        .into_iter()
        .collect::<Result<Vec<_>, String>>()?;
    let elapsed = cores.iter().map(|c| c.1).max().unwrap_or(0);
    Ok(RunStats::merge(
        cores.into_iter().map(|c| c.0).collect(),
        elapsed,
    ))
}

type CoreResult = Result<(CoreStats, u64), String>;

fn core_loop(
    spec: &VerbSpec,
    core: usize,
    ex: &mut nicdrv::Executor<nicdrv::emu::EmuNic>,
    stride: u64,
) -> CoreResult {
    let hist = Rc::new(RefCell::new(latency_histogram()));
    let ops = Rc::new(Cell::new(0u64));
    let failure: Rc<RefCell<Option<String>>> = Rc::new(RefCell::new(None));
    let budget = if spec.max_ops == 0 {
        u64::MAX
    } else {
        spec.max_ops.div_ceil(spec.threads as u64)
    };
    let nodes = spec.memory_nodes as u64;
    for slot in 0..spec.depth {
        let (hist, ops, spec, failure) = (hist.clone(), ops.clone(), spec.clone(), failure.clone());
        let addr_of = move |i: usize| {
            let k = ((core * spec.depth + slot) * spec.batch + i) as u64;
            if spec.contended {
                GlobalAddr::host(0, mempool::SUPERBLOCK_BYTES)
            } else {
                GlobalAddr::host(
                    (k % nodes) as u16,
                    mempool::SUPERBLOCK_BYTES + (k / nodes) * stride,
                )
            }
        };
        ex.spawn(move |ctx| async move {
            let deadline = ctx.nic().now_ns() + spec.duration_ms * 1_000_000;
            let mut bufs: Vec<Option<nicdrv::Buf>> = (0..spec.batch)
                .map(|_| Some(ctx.alloc(spec.size).expect("scratch sized for the verbs")))
                .collect();
            let mut ids = [None; nicdrv::exec::MAX_BATCH];
            while ctx.now_ns() < deadline && ops.get() < budget {
                let t = ctx.now_ns();
                let mut b = ctx.batch();
                for (i, buf) in bufs.iter_mut().enumerate() {
                    let addr = addr_of(i);
                    ids[i] = Some(match spec.verb {
                        Opcode::Read => b.read(addr, buf.take().expect("buffer")),
                        Opcode::Write => b.write(addr, buf.take().expect("buffer")),
                        Opcode::Cas => b.cas(addr, 0, 0),
                        Opcode::Faa => b.faa(addr, 1),
                        Opcode::MaskedCas => b.masked_cas(addr, 0, 0xff, 0, 0xff),
                    });
                }
                let mut done = match b.submit().await {
                    Ok(d) => d,
                    Err(e) => {
                        *failure.borrow_mut() = Some(e.to_string());
                        return;
                    }
                };
                if !spec.verb.is_atomic() {
                    for (buf, id) in bufs.iter_mut().zip(ids) {
                        *buf = Some(done.take_buf(id.expect("posted")));
                    }
                }
                let _ = hist.borrow_mut().record((ctx.now_ns() - t).max(1));
                ops.set(ops.get() + spec.batch as u64);
            }
        })
        .expect("slot per depth");
    }
    let begin = std::time::Instant::now();
    ex.run();
    let elapsed = begin.elapsed().as_nanos() as u64;
    let latency_ns = hist.borrow().clone();
    if let Some(e) = failure.borrow_mut().take() {
        return Err(format!("a verb failed: {e}"));
    }
    Ok((
        CoreStats {
            ops: ops.get(),
            latency_ns,
            counters: ex.counters(),
        },
        elapsed,
    ))
}

fn print_header() {
    println!(
        "{:<6} {:>6} {:>5} {:>5} {:>7} {:>11} {:>9} {:>10} {:>8} {:>8} {:>8} {:>8} {:>6}",
        "verb",
        "bytes",
        "depth",
        "batch",
        "threads",
        "ops",
        "Mops/s",
        "cpu ns/op",
        "p50 ns",
        "p99 ns",
        "p999 ns",
        "GB/s",
        "rt/op"
    );
}

fn print_row(s: &VerbSpec, r: &RunStats) {
    let gbs = r.ops_per_sec() * s.size as f64 / 1e9;
    println!(
        "{:<6} {:>6} {:>5} {:>5} {:>7} {:>11} {:>9.2} {:>10.1} {:>8} {:>8} {:>8} {:>8.2} {:>6.2}",
        s.verb.name(),
        s.size,
        s.depth,
        s.batch,
        s.threads,
        r.ops,
        r.ops_per_sec() / 1e6,
        r.cpu_ns_per_op(),
        r.latency_ns.value_at_quantile(0.5),
        r.latency_ns.value_at_quantile(0.99),
        r.latency_ns.value_at_quantile(0.999),
        gbs,
        r.per_op(r.counters.round_trips),
    );
}

pub fn report_json(s: &VerbSpec, r: &RunStats) -> serde_json::Value {
    json!({
        "backend": "emu",
        "verb": s.verb.name(),
        "size": s.size,
        "depth": s.depth,
        "batch": s.batch,
        "threads": s.threads,
        "memory_nodes": s.memory_nodes,
        "injected_latency_ns_one_way": s.latency_ns,
        "contended": s.contended,
        "ops": r.ops,
        "elapsed_ns": r.elapsed_ns,
        "ops_per_sec": r.ops_per_sec(),
        "ns_per_op": r.cpu_ns_per_op(),
        "bytes_per_op": s.size,
        "gbytes_per_sec": r.ops_per_sec() * s.size as f64 / 1e9,
        "latency_ns": {
            "p50": r.latency_ns.value_at_quantile(0.5),
            "p90": r.latency_ns.value_at_quantile(0.9),
            "p99": r.latency_ns.value_at_quantile(0.99),
            "p999": r.latency_ns.value_at_quantile(0.999),
            "max": r.latency_ns.max(),
            "mean": r.latency_ns.mean(),
        },
        "round_trips_per_op": r.per_op(r.counters.round_trips),
        "doorbells_per_op": r.per_op(r.counters.doorbells),
        "bytes_read_per_op": r.per_op(r.counters.bytes_read),
        "bytes_written_per_op": r.per_op(r.counters.bytes_written),
        "errors": r.counters.errors,
    })
}
