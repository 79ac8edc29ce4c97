//! `loch-bench verbs`: a perftest-style microbenchmark of single verbs
//! (like ib_read_lat, ib_write_bw, ib_atomic_bw) through the executor, the
//! path every Loch data structure takes, on the emu backend (wall clock) or
//! the sim backend (virtual time, paper scale).
//!
//! Each compute thread runs one executor with `depth` tasks; each task
//! keeps one doorbell of `batch` verbs in flight (perftest's post list), so
//! `depth × batch` verbs are in flight per thread; `--batch 1` (the
//! default) is one verb per doorbell. Tasks reuse their registered buffers,
//! so nothing is allocated or zeroed per verb. Every verb targets its own
//! 64-byte-aligned slot on a memory node (round robin over nodes) unless
//! `--contended` puts them all on one word, or `--span` sends each to a
//! random slot of a larger area, so that on emu its target is not in the
//! CPU's caches (what a Sherman lookup's leaf READ meets). Latency is per
//! doorbell, measured with the executor's per-turn clock.

pub use crate::args::Backend;
use crate::args::{size_value, ArgError, DeviceArgs};
use cluster::stats::{latency_histogram, CoreStats, RunStats};
use cluster::{Cluster, ClusterSpec, Place, Spawn, Workload};
use hdrhistogram::Histogram;
use nicdrv::rng::{Domain, Rng};
use nicdrv::{Buf, Ctx, ExecutorConfig, GlobalAddr, Nic, Opcode, VerbCounters};
use serde_json::json;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Instant;

/// One benchmark point.
#[derive(Clone, Debug)]
pub struct VerbSpec {
    pub backend: Backend,
    pub verb: Opcode,
    pub size: usize,
    pub depth: usize,
    pub batch: usize,
    /// Client threads in all (emu: pinned cores; sim: simulated threads
    /// spread over the compute nodes).
    pub threads: usize,
    /// Wall-clock (emu) or virtual (sim) duration.
    pub duration_ns: u64,
    pub max_ops: u64,
    pub memory_nodes: usize,
    pub compute_nodes: usize,
    pub latency_ns: u64,
    pub contended: bool,
    /// Bytes per memory node that the verbs' targets are drawn from,
    /// uniformly over its stride-aligned slots, one draw per verb; None:
    /// a slot per verb of the batch, the same every round.
    pub span: Option<u64>,
    /// The RDMA device of `--backend mlx5`.
    pub device: DeviceArgs,
    pub pin: bool,
    pub seed: u64,
}

/// A verb by name, in any case (`READ`, `Read`, `read`).
fn verb_value(s: &str) -> Result<Opcode, String> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "read" => Opcode::Read,
        "write" => Opcode::Write,
        "cas" => Opcode::Cas,
        "faa" => Opcode::Faa,
        "masked-cas" | "masked_cas" => Opcode::MaskedCas,
        _ => {
            return Err(format!(
                "unknown verb `{s}` (read, write, cas, faa, masked-cas)"
            ))
        }
    })
}

/// The sizes `-a` sweeps, as perftest's `-a`: 2 B to 8 MiB in powers of
/// two.
pub const SWEEP_SIZES: std::ops::RangeInclusive<u32> = 1..=23;

/// `loch-bench verbs`: a perftest-style microbenchmark of single verbs
/// (ib_read_lat, ib_write_bw, ib_atomic_bw) through the executor.
#[derive(clap::Args, Debug)]
#[command(after_help = VERBS_AFTER_HELP, allow_negative_numbers = true)]
pub struct VerbsArgs {
    /// emu: this host, wall clock, 1 memory node; sim: virtual time, the
    /// Sherman paper's setup (8 memory nodes, 8 compute nodes, 176 threads);
    /// mlx5: this host's RDMA device in loopback, wall clock, 1 memory node
    /// (a --features mlx5 build)
    #[arg(long, value_enum, ignore_case = true, default_value_t = Backend::Emu)]
    backend: Backend,
    #[command(flatten)]
    device: DeviceArgs,
    /// The verb: read, write, cas, faa or masked-cas (any case)
    #[arg(long, value_parser = verb_value, default_value = "read")]
    verb: Opcode,
    /// Bytes per verb: READ and WRITE 1 B ..= 16 MiB (64, 4k, 1MiB); atomics 8
    #[arg(short = 's', long, value_parser = size_value, default_value = "8")]
    size: usize,
    /// Sweep sizes 2 B ..= 8 MiB in powers of two, a row each (perftest's
    /// -a); READ and WRITE only
    #[arg(short = 'a', long = "all-sizes", conflicts_with_all = ["size", "matrix"])]
    all_sizes: bool,
    /// Tasks per thread, each keeping one doorbell in flight (1 ..= 1024)
    #[arg(long, default_value_t = 1)]
    depth: usize,
    /// Verbs per doorbell, perftest's post list (latency is per doorbell;
    /// 1 ..= 16)
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Client threads: emu and mlx5 pinned cores (default 1, at most 256);
    /// sim simulated threads over --compute-nodes (default 176, at most
    /// 100,000)
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Seconds to measure, at most 3600: emu and mlx5 wall (default 2);
    /// sim virtual (default 0.01)
    #[arg(short = 'D', long, value_name = "SECS")]
    duration: Option<f64>,
    /// Stop after about N verbs in all, perftest's -n (on emu and mlx5
    /// each core stops once its share, N / --threads rounded up, is
    /// posted; a doorbell per task may go past it); with --duration too,
    /// whichever comes first; 0: run for --duration
    #[arg(
        short = 'n',
        long,
        visible_alias = "iters",
        value_name = "N",
        default_value_t = 0
    )]
    ops: u64,
    /// Memory nodes, 1 ..= 1024 (default emu and mlx5 1, sim 8)
    #[arg(long, value_name = "N")]
    memory_nodes: Option<usize>,
    /// Compute nodes the sim threads spread over, 1 ..= 1024 (default 8)
    #[arg(long, value_name = "N")]
    compute_nodes: Option<usize>,
    /// The simulation's seed (sim), and the seed of `--span`'s draws
    /// [default: 1]
    #[arg(long)]
    seed: Option<u64>,
    /// Extra one-way link latency (emu), or the link latency itself (sim:
    /// 0 keeps the model's); none on mlx5
    #[arg(long, value_name = "NS", default_value_t = 0)]
    latency_ns: u64,
    /// Every verb on one word instead of a slot of its own (a word of
    /// memory node 0, whatever --memory-nodes)
    #[arg(long)]
    contended: bool,
    /// Every verb to a random slot (the size rounded up to 64 bytes) of
    /// this many bytes per memory node instead of a slot of its own, a new
    /// draw each time (1m, 5632k): on emu, past the CPU's caches, a READ
    /// pays for memory as a Sherman leaf READ does (its leaves take about
    /// 5.4 MiB at 200,000 records: 36 to a 1 KiB leaf). At most 16 GiB, allocated on the
    /// memory nodes and faulted in as the verbs first touch it
    #[arg(long, value_parser = size_value, value_name = "BYTES", conflicts_with = "contended")]
    span: Option<usize>,
    /// Do not pin the emu threads to cores
    #[arg(long)]
    no_pin: bool,
    /// One JSON document on stdout (an array for several points)
    #[arg(long)]
    json: bool,
    /// The standard set: 8 B READ, 1 KiB READ, 8 B WRITE, CAS and FAA at
    /// depth 1 and 16
    #[arg(long, conflicts_with_all = ["verb", "size", "depth"])]
    matrix: bool,
    /// Bandwidth in Gb/s instead of GB/s (perftest's --report_gbits)
    #[arg(long = "report_gbits", visible_alias = "report-gbits")]
    report_gbits: bool,
}

const VERBS_AFTER_HELP: &str = "\
Columns: verb, bytes per verb, depth (tasks per thread), batch (verbs per doorbell), threads,
ops (verbs completed), Mops/s, cpu ns/op (CPU time per verb), p50/p99/p999 ns (latency per
doorbell), GB/s (Gb/s with --report_gbits), rt/op (network round trips per verb); on sim also
the simulator's wall seconds and simulated verbs per wall second.
Exit codes: 0 done; 1 the benchmark failed (a verb failed, the cluster did not boot; the
message on stderr); 2 bad input (one line naming it; nothing run); 130 stopped by SIGINT or
SIGTERM (the points measured until then are printed).";

pub fn run(args: VerbsArgs) -> Result<crate::run::Outcome, ArgError> {
    let (base, json, gbits) = (args.spec()?, args.json, args.report_gbits);
    let sim = base.backend == Backend::Sim;
    let base_threads = base.threads;
    let specs: Vec<VerbSpec> = if args.matrix {
        let mut v = Vec::new();
        for (verb, size) in [
            (Opcode::Read, 8),
            (Opcode::Read, MATRIX_LARGEST),
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
    } else if args.all_sizes {
        SWEEP_SIZES
            .map(|p| VerbSpec {
                size: 1 << p,
                ..base.clone()
            })
            .collect()
    } else {
        vec![base]
    };
    if !sim {
        cmdline::warn_if_oversubscribed("loch-bench verbs", "threads", base_threads);
    }
    if !json {
        print_header(sim, gbits);
    }
    let mut docs = Vec::new();
    for spec in &specs {
        if cmdline::signals::stop_requested() {
            break;
        }
        let r = match measure(spec) {
            Ok(r) => r,
            Err(e) => {
                return Ok(crate::run::Outcome::Failed(format!(
                    "benchmark failed: {e}"
                )))
            }
        };
        if json {
            docs.push(report_json(spec, &r));
        } else {
            print_row(spec, &r, gbits);
        }
    }
    if json {
        // Always an array, one object per point, as `loch-bench run` prints.
        cmdline::outln!("{}", serde_json::Value::Array(docs));
    } else if sim {
        cmdline::outln!("(sim: throughput and latency in virtual time; the last columns are the simulator's own wall-clock speed)");
    }
    Ok(crate::run::Outcome::finished())
}

impl VerbsArgs {
    /// The point the flags name (the size `-a` sweeps is checked at its
    /// largest), its defaults filled in for the backend.
    fn spec(&self) -> Result<VerbSpec, ArgError> {
        let backend = self.backend;
        let sim = backend == Backend::Sim;
        let verb = self.verb;
        let size = if self.all_sizes {
            if verb.is_atomic() {
                return Err(ArgError(
                    "-a/--all-sizes sweeps READ and WRITE sizes; atomics are 8 bytes".into(),
                ));
            }
            1 << SWEEP_SIZES.end()
        } else {
            self.size
        };
        let (depth, batch) = (self.depth, self.batch);
        let threads = self.threads.unwrap_or(if sim { 176 } else { 1 });
        let duration = self.duration.unwrap_or(if sim { 0.01 } else { 2.0 });
        let memory_nodes = self.memory_nodes.unwrap_or(if sim { 8 } else { 1 });
        let compute_nodes = self.compute_nodes.unwrap_or(if sim { 8 } else { 1 });
        if depth == 0 || depth > 1024 {
            return Err(ArgError(format!("--depth must be 1..=1024, got {depth}")));
        }
        if batch == 0 || batch > nicdrv::exec::MAX_BATCH {
            return Err(ArgError(format!(
                "--batch must be 1..={}, got {batch}",
                nicdrv::exec::MAX_BATCH
            )));
        }
        let max_threads = if sim { 100_000 } else { 256 };
        if threads == 0 || threads > max_threads {
            return Err(ArgError(format!(
                "--threads must be 1..={max_threads}, got {threads}"
            )));
        }
        if memory_nodes == 0 || memory_nodes > 1024 {
            return Err(ArgError(format!(
                "--memory-nodes must be 1..=1024, got {memory_nodes}"
            )));
        }
        if compute_nodes == 0 || compute_nodes > 1024 {
            return Err(ArgError(format!(
                "--compute-nodes must be 1..=1024, got {compute_nodes}"
            )));
        }
        backend.check_one_compute_node(self.compute_nodes.is_some())?;
        // The deepest point this runs (--matrix's go to 16).
        let deepest = depth.max(if self.matrix { 16 } else { 1 });
        // Each task has a slot of its own on every memory node: a
        // simulated million of them is past any figure's need, and past
        // this host's memory long before the flags' own bounds.
        let tasks = threads * deepest;
        if sim {
            crate::args::check_sim_size(
                "--threads × --memory-nodes, --threads × --depth",
                threads as u64,
                memory_nodes as u64,
                tasks as u64,
            )?;
            if self.no_pin {
                return Err(ArgError(
                    "--no-pin applies to emu and mlx5 (sim pins nothing)".into(),
                ));
            }
        }
        // At least a nanosecond: a shorter one ran nothing and reported a
        // row of zeros.
        if !(1e-9..=3600.0).contains(&duration) {
            return Err(ArgError(format!(
                "--duration must be in [1e-9, 3600] seconds, got {duration}"
            )));
        }
        // An emu core's completion queue serves a queue pair to every
        // memory node, each as deep as its tasks' doorbells can fill
        // (it once failed the boot, exit 1).
        if backend == Backend::Emu {
            crate::args::check_emu_cq(
                &format!("--depth {deepest} with --memory-nodes {memory_nodes}"),
                deepest,
                memory_nodes,
            )?;
        }
        if verb.is_atomic() {
            if size != 8 {
                return Err(ArgError("--size: atomics are 8 bytes".into()));
            }
        } else if size == 0 || size > 16 << 20 {
            return Err(ArgError(format!("--size must be 1 B..16 MiB, got {size}")));
        }
        // Each task's scratch holds a doorbell's batch of its verbs, which
        // READs fill as they complete.
        // The largest verb of the points this runs (--matrix's are its own).
        let largest = if self.matrix { MATRIX_LARGEST } else { size };
        let per_task = (largest.next_multiple_of(8) * batch).max(4096) as u64;
        // And the memory nodes' memory, which the verbs touch.
        let nodes = (memory_nodes as u64).saturating_mul(node_bytes(
            largest,
            (tasks * batch) as u64,
            memory_nodes,
            self.span.map(|b| b as u64),
        ));
        crate::args::check_memory(
            || {
                format!("--threads {threads} × --depth {deepest} tasks with --batch {batch} of --size {largest} B in scratch each, and {memory_nodes} memory nodes of {} MiB", (nodes / memory_nodes as u64) >> 20)
            },
            (tasks as u64)
                .saturating_mul(per_task)
                .saturating_add(nodes),
        )?;
        nicdrv::emu::check_latency(self.latency_ns)
            .map_err(|e| ArgError(format!("--latency-ns {e}")))?;
        self.device.check(backend)?;
        if backend == Backend::Mlx5 && self.latency_ns != 0 {
            return Err(ArgError(
                "--latency-ns: a latency cannot be injected on a real NIC (emu and sim only)"
                    .into(),
            ));
        }
        // Off sim, only `--span` draws anything (it was accepted and
        // unused, as if it changed the run).
        if backend != Backend::Sim && self.span.is_none() && self.seed.is_some() {
            return Err(ArgError(
                "--seed applies to sim, and to --span's draws on emu and mlx5".into(),
            ));
        }
        if let Some(span) = self.span {
            // The largest verb of the points this runs must fit a slot.
            let least = (largest as u64).next_multiple_of(64);
            if (span as u64) < least || span as u64 > MAX_SPAN {
                return Err(ArgError(format!(
                    "--span must be {least} B (the verb's size, in whole lines) ..= 16 GiB, got {span}"
                )));
            }
        }
        let base = VerbSpec {
            backend,
            verb,
            size,
            depth,
            batch,
            threads,
            // --ops alone runs until its verbs are done (perftest's -n);
            // with --duration, whichever comes first.
            duration_ns: match (self.duration, self.ops) {
                (None, 1..) => u64::MAX,
                _ => (duration * 1e9) as u64,
            },
            max_ops: self.ops,
            memory_nodes,
            compute_nodes,
            latency_ns: self.latency_ns,
            contended: self.contended,
            span: self.span.map(|b| b as u64),
            device: self.device.clone(),
            pin: !self.no_pin,
            seed: self.seed.unwrap_or(1),
        };
        Ok(base)
    }
}

/// A measured point: the run's statistics and, on sim, the simulator's
/// own speed.
pub struct Measured {
    pub stats: RunStats,
    pub sim_wall_sec: f64,
    pub sim_verbs: u64,
}

pub fn measure(spec: &VerbSpec) -> Result<Measured, String> {
    let backend = spec
        .backend
        .cluster(spec.pin, spec.seed, spec.compute_nodes, &spec.device)?;
    let mut c = Cluster::boot(&ClusterSpec {
        machines: 0,
        memory_nodes: spec.memory_nodes,
        host_bytes: host_bytes(spec),
        dm_bytes: 64 << 10,
        latency_ns: spec.latency_ns,
        backend,
    })?;
    // --ops is the whole run's: each emu core (its own group) takes its
    // share, the simulated world (one group) all of it.
    let budget = match spec.max_ops {
        0 => u64::MAX,
        n if c.on_threads() => n.div_ceil(spec.threads as u64),
        n => n,
    };
    let wall = Instant::now();
    let groups = c
        .run(&VerbWork { spec, budget }, spec.threads, exec_config(spec))?
        .into_iter()
        .collect::<Result<Vec<_>, String>>()?;
    Ok(match &c {
        Cluster::Sim(w) => {
            let sim_wall_sec = wall.elapsed().as_secs_f64();
            let mut stats = RunStats::merge(groups.into_iter().map(|c| c.0).collect(), w.now_ns());
            stats.threads = spec.threads;
            Measured {
                stats,
                sim_wall_sec,
                sim_verbs: w.verbs(),
            }
        }
        // emu and mlx5: each core's wall clock.
        _ => {
            let elapsed = groups.iter().map(|c| c.1).max().unwrap_or(0);
            Measured {
                stats: RunStats::merge(groups.into_iter().map(|c| c.0).collect(), elapsed),
                sim_wall_sec: 0.0,
                sim_verbs: 0,
            }
        }
    })
}

/// The largest verb `--matrix` measures (bytes).
const MATRIX_LARGEST: usize = 1024;

/// The largest `--span`: memory the emu nodes map, so bounded well below
/// what a machine running this has.
pub const MAX_SPAN: u64 = 16 << 30;

fn stride(spec: &VerbSpec) -> u64 {
    slot_bytes(spec.size)
}

/// A verb's slot: its size in whole 64-byte lines.
fn slot_bytes(size: usize) -> u64 {
    size.next_multiple_of(64).max(64) as u64
}

fn host_bytes(spec: &VerbSpec) -> u64 {
    let slots_total = (spec.threads * spec.depth * spec.batch) as u64;
    node_bytes(spec.size, slots_total, spec.memory_nodes, spec.span)
}

/// Host memory of each memory node for `slots` verbs of `size` bytes in
/// flight over `memory_nodes` nodes, a slot each (or `span` bytes, if
/// more): the superblock and the slots, in whole MiB.
fn node_bytes(size: usize, slots: u64, memory_nodes: usize, span: Option<u64>) -> u64 {
    let per_node = slots
        .div_ceil(memory_nodes as u64)
        .saturating_mul(slot_bytes(size));
    let area = per_node.max(span.unwrap_or(0));
    mempool::SUPERBLOCK_BYTES
        .saturating_add(area)
        .next_multiple_of(1 << 20)
}

/// Where verb `k` of the run (the task's first plus its place in the
/// batch) goes: its node round robin; within the node its own slot, or
/// under `--span` a slot drawn from `rng`.
fn target(spec: &VerbSpec, k: u64, rng: &mut Rng) -> GlobalAddr {
    let nodes = spec.memory_nodes as u64;
    let stride = stride(spec);
    if spec.contended {
        return GlobalAddr::host(0, mempool::SUPERBLOCK_BYTES);
    }
    let slot = match spec.span {
        Some(span) => rng.below(span / stride),
        None => k / nodes,
    };
    GlobalAddr::host(
        (k % nodes) as u16,
        mempool::SUPERBLOCK_BYTES + slot * stride,
    )
}

fn exec_config(spec: &VerbSpec) -> ExecutorConfig {
    ExecutorConfig {
        slots: spec.depth,
        scratch_bytes_per_slot: (spec.size.next_multiple_of(8) * spec.batch).max(4096),
        poll_batch: 32,
    }
}

/// What the tasks of one executor (emu) or one world (sim) share.
struct Tally {
    hist: RefCell<Histogram<u64>>,
    ops: Cell<u64>,
    budget: u64,
    failure: RefCell<Option<String>>,
    /// When the last core's tasks were spawned (emu: the core's run
    /// starts).
    began: Cell<Option<Instant>>,
}

/// The verb tasks of every core: `depth` per core, each on its own slots.
struct VerbWork<'a> {
    spec: &'a VerbSpec,
    budget: u64,
}

impl Workload for VerbWork<'_> {
    type Group = Rc<Tally>;
    /// What the group measured, and for how long (wall ns; emu only).
    type Out = Result<(CoreStats, u64), String>;

    fn group(&self, _: usize, _: usize) -> Rc<Tally> {
        Rc::new(Tally {
            hist: RefCell::new(latency_histogram()),
            ops: Cell::new(0),
            budget: self.budget,
            failure: RefCell::new(None),
            began: Cell::new(None),
        })
    }

    fn spawn<N: Nic, S: Spawn<N>>(
        &self,
        place: Place,
        tally: &Rc<Tally>,
        on: &mut S,
    ) -> Result<(), String> {
        let spec = self.spec;
        for slot in 0..spec.depth {
            let first = ((place.core * spec.depth + slot) * spec.batch) as u64;
            let (s, t) = (spec.clone(), tally.clone());
            on.spawn_task(move |ctx| verb_task(ctx, s, first, t))?;
        }
        tally.began.set(Some(Instant::now()));
        Ok(())
    }

    fn finish(&self, tally: Rc<Tally>, counters: VerbCounters) -> Self::Out {
        let elapsed = tally
            .began
            .get()
            .map_or(0, |b| b.elapsed().as_nanos() as u64);
        if let Some(e) = tally.failure.borrow_mut().take() {
            return Err(format!("a verb failed: {e}"));
        }
        let latency_ns = tally.hist.borrow().clone();
        let core = CoreStats {
            ops: tally.ops.get(),
            latency_ns,
            counters,
        };
        Ok((core, elapsed))
    }
}

/// One task: `batch` verbs per doorbell until the deadline or the budget.
/// Generic over the backend: the same code runs on emu and sim.
async fn verb_task<N: Nic>(ctx: Ctx<N>, spec: VerbSpec, first: u64, tally: Rc<Tally>) {
    let mut rng = Rng::stream(spec.seed, Domain::Client, first);
    // Without `--span` the addresses are the same every round: worked out
    // once, so the measured loop costs what the executor and the NIC do.
    let mut addrs: Vec<GlobalAddr> = (0..spec.batch)
        .map(|i| target(&spec, first + i as u64, &mut rng))
        .collect();
    let deadline = ctx.nic().now_ns().saturating_add(spec.duration_ns);
    let mut bufs: Vec<Option<Buf>> = Vec::with_capacity(spec.batch);
    for _ in 0..spec.batch {
        match ctx.alloc(spec.size) {
            Ok(b) => bufs.push(Some(b)),
            Err(e) => {
                *tally.failure.borrow_mut() = Some(e.to_string());
                return;
            }
        }
    }
    let mut ids = [None; nicdrv::exec::MAX_BATCH];
    // SIGINT/SIGTERM ends the point with what it measured.
    while ctx.now_ns() < deadline
        && tally.ops.get() < tally.budget
        && !cmdline::signals::stop_requested()
    {
        if spec.span.is_some() {
            for (i, a) in addrs.iter_mut().enumerate() {
                *a = target(&spec, first + i as u64, &mut rng);
            }
        }
        let t = ctx.now_ns();
        let mut b = ctx.batch();
        for (i, buf) in bufs.iter_mut().enumerate() {
            let addr = addrs[i];
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
                *tally.failure.borrow_mut() = Some(e.to_string());
                return;
            }
        };
        if !spec.verb.is_atomic() {
            for (buf, id) in bufs.iter_mut().zip(ids) {
                *buf = Some(done.take_buf(id.expect("posted")));
            }
        }
        let _ = tally.hist.borrow_mut().record((ctx.now_ns() - t).max(1));
        tally.ops.set(tally.ops.get() + spec.batch as u64);
    }
}

fn print_header(sim: bool, gbits: bool) {
    cmdline::out!(
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
        if gbits { "Gb/s" } else { "GB/s" },
        "rt/op"
    );
    if sim {
        cmdline::out!(" {:>8} {:>12}", "wall s", "sim verbs/s");
    }
    cmdline::outln!();
}

fn print_row(s: &VerbSpec, m: &Measured, gbits: bool) {
    let r = &m.stats;
    let gbs = r.ops_per_sec() * s.size as f64 / 1e9 * if gbits { 8.0 } else { 1.0 };
    cmdline::out!(
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
    if s.backend == Backend::Sim {
        cmdline::out!(
            " {:>8.2} {:>12.0}",
            m.sim_wall_sec,
            m.sim_verbs as f64 / m.sim_wall_sec.max(1e-9)
        );
    }
    cmdline::outln!();
}

pub fn report_json(s: &VerbSpec, m: &Measured) -> serde_json::Value {
    let r = &m.stats;
    let mut v = json!({
        "schema_version": crate::run::SCHEMA_VERSION,
        "backend": s.backend.name(),
        "simulated": s.backend == Backend::Sim,
        "verb": s.verb.name(),
        "size": s.size,
        "depth": s.depth,
        "batch": s.batch,
        "threads": s.threads,
        "memory_nodes": s.memory_nodes,
        "injected_latency_ns_one_way": s.latency_ns,
        "contended": s.contended,
        "span": s.span,
        "ops": r.ops,
        "elapsed_ns": r.elapsed_ns,
        "ops_per_sec": r.ops_per_sec(),
        "ns_per_op": r.cpu_ns_per_op(),
        "bytes_per_op": s.size,
        "gbytes_per_sec": r.ops_per_sec() * s.size as f64 / 1e9,
        "gbits_per_sec": r.ops_per_sec() * s.size as f64 * 8.0 / 1e9,
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
    });
    if s.backend == Backend::Sim {
        v["seed"] = json!(s.seed);
        v["compute_nodes"] = json!(s.compute_nodes);
        v["sim_wall_sec"] = json!(m.sim_wall_sec);
        v["sim_verbs_per_wall_sec"] = json!(m.sim_verbs as f64 / m.sim_wall_sec.max(1e-9));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(size: usize, memory_nodes: usize, span: Option<u64>) -> VerbSpec {
        VerbSpec {
            backend: Backend::Emu,
            verb: Opcode::Read,
            size,
            depth: 1,
            batch: 1,
            threads: 1,
            duration_ns: 1,
            max_ops: 0,
            memory_nodes,
            compute_nodes: 1,
            latency_ns: 0,
            contended: false,
            span,
            pin: false,
            seed: 1,
            device: DeviceArgs::default(),
        }
    }

    #[test]
    fn a_span_spreads_verbs_over_its_aligned_slots_and_stays_inside() {
        let (span, size) = (64 << 10, 1000);
        let s = spec(size, 2, Some(span));
        let mut rng = Rng::new(7);
        let mut seen = std::collections::HashSet::new();
        for k in 0..4000u64 {
            let a = target(&s, k, &mut rng);
            assert_eq!(a.node() as u64, k % 2, "nodes round robin");
            let off = a.offset() - mempool::SUPERBLOCK_BYTES;
            assert_eq!(off % 1024, 0, "whole slots: the size in lines");
            assert!(off + 1024 <= span, "inside the span: {off}");
            seen.insert((a.node(), off));
        }
        // 64 slots a node, 4000 draws: every slot is hit.
        assert_eq!(seen.len(), 2 * 64);
        assert!(host_bytes(&s) >= mempool::SUPERBLOCK_BYTES + span);
    }

    #[test]
    fn without_a_span_each_verb_keeps_its_own_slot() {
        let s = spec(8, 2, None);
        let mut rng = Rng::new(7);
        let a: Vec<GlobalAddr> = (0..6).map(|k| target(&s, k, &mut rng)).collect();
        let b: Vec<GlobalAddr> = (0..6).map(|k| target(&s, k, &mut rng)).collect();
        assert_eq!(a, b, "the same every round");
        let distinct: std::collections::HashSet<_> = a.iter().collect();
        assert_eq!(distinct.len(), 6);
    }
}
