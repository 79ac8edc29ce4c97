//! `loch-bench locks`: Sherman's lock techniques alone. Clients acquire
//! and release locks drawn zipfian (or uniformly) from a set of lock
//! words, through the tree's own lock code ([`index::tree::TreeClient::lock_node`]),
//! with the variants side by side, Sherman §5.7's steps: CAS on a word in
//! host memory (FG+), CAS on a word in the memory node's device memory
//! (on-chip), plus the local lock table (a compute node's threads take a
//! lock locally first, so one remote CAS spinner per lock and compute
//! node), plus wait queues (local waiters served FIFO, not whoever tries
//! first), plus handover (a releasing holder passes the lock to the next
//! local waiter without a remote release, up to 8 times in a row).
//! Reported: acquisitions per second, acquisition latency (from asking to
//! holding) percentiles, and remote CAS attempts per acquisition.

use crate::args::{ArgError, Backend, DeviceArgs};
use crate::run::DM_BYTES;
use crate::workload::Zipfian;
use cluster::stats::latency_histogram;
use cluster::{Cluster, ClusterSpec, Place, Spawn, Workload};
use hdrhistogram::Histogram;
use index::tree::{Tree, TreeConfig, TreeStats};
use nicdrv::rng::{Domain, Rng};
use nicdrv::{Ctx, ExecutorConfig, GlobalAddr, Nic, Space, VerbCounters};
use serde_json::json;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// `loch-bench locks`: lock acquisitions, the lock variants side by side.
#[derive(clap::Args, Debug)]
#[command(after_help = LOCKS_AFTER_HELP)]
pub struct LocksArgs {
    /// sim: a simulated cluster, virtual time; emu: memory nodes on this
    /// host, one compute node whose cores are threads, wall clock; mlx5:
    /// as emu, through this host's RDMA device in loopback (a --features
    /// mlx5 build)
    #[arg(long, value_enum, ignore_case = true, default_value_t = Backend::Sim)]
    backend: Backend,
    #[command(flatten)]
    device: DeviceArgs,
    /// Variants side by side: host, dm, dm+local, dm+local+queue,
    /// dm+local+queue+handover
    #[arg(
        long,
        value_name = "A,B,...",
        default_value = "host,dm,dm+local,dm+local+queue,dm+local+queue+handover"
    )]
    variants: String,
    /// Lock words, spread over the memory nodes (1 ..= 16777216)
    #[arg(long, default_value_t = 1000)]
    locks: u64,
    /// Skew of the lock drawn: 0 is uniform, else zipfian in (0,1) or
    /// (1,5]
    #[arg(long, value_name = "THETA", default_value_t = 0.99)]
    zipf: f64,
    /// Memory nodes, 1 ..= 1024 [default: sim 8, emu and mlx5 2]
    #[arg(long, value_name = "N")]
    memory_nodes: Option<usize>,
    /// Compute nodes (sim, 1 ..= 1024; emu and mlx5 are one) [default: 8]
    #[arg(long, value_name = "N")]
    compute_nodes: Option<usize>,
    /// Client threads per compute node, 1 ..= 1024 [default: sim 22, emu
    /// and mlx5 1]
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Clients per thread (coroutines), 1 ..= 1024
    #[arg(long, value_name = "N", default_value_t = 1)]
    coroutines: usize,
    /// Acquisitions per client [default: sim 2000, emu and mlx5 200000]
    #[arg(short = 'n', long, value_name = "N")]
    ops: Option<u64>,
    /// Nanoseconds each holder keeps the lock (a sleep; 0: release at once)
    #[arg(long, value_name = "NS", default_value_t = 0)]
    hold_ns: u64,
    /// The simulation's seed (also the clients' draws)
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Do not pin the emu threads to cores
    #[arg(long)]
    no_pin: bool,
    /// One JSON array on stdout, one object per variant
    #[arg(long)]
    json: bool,
}

const LOCKS_AFTER_HELP: &str = "\
Variants: host (CAS on the lock word in host memory, FG+), dm (CAS on a word in the memory
node's device memory), dm+local (plus the local lock table: a compute node's threads take a
lock locally first, so one of them spins remotely; locally, whoever tries first after a
release), dm+local+queue (plus wait queues: local waiters served FIFO),
dm+local+queue+handover (plus handover: Sherman's HOCL).
Columns: variant, acquisitions, Macq/s, acquisition latency p50/p99/p999 in microseconds
(asking to holding), remote CAS attempts per acquisition, share handed over.
Exit codes: 0 done; 1 the benchmark failed (a verb failed, the cluster did not boot); 2 bad
input (one line naming it; nothing run); 130 stopped by SIGINT or SIGTERM.";

/// The variants, by name, as tree configurations.
const VARIANTS: [&str; 5] = [
    "host",
    "dm",
    "dm+local",
    "dm+local+queue",
    "dm+local+queue+handover",
];

fn variant(name: &str, host_bytes: u64) -> Option<TreeConfig> {
    let base = TreeConfig::sherman(host_bytes);
    let (lock_in_dm, local_lock_table, local_wait_queue, handover) = match name {
        "host" => (false, false, false, false),
        "dm" => (true, false, false, false),
        "dm+local" => (true, true, false, false),
        "dm+local+queue" => (true, true, true, false),
        "dm+local+queue+handover" => (true, true, true, true),
        _ => return None,
    };
    Some(TreeConfig {
        lock_in_dm,
        local_lock_table,
        local_wait_queue,
        handover,
        ..base
    })
}

/// Where lock i's node lies: memory node i mod M, one node-sized slot
/// each past the superblock (its lock word, in host memory, at the
/// node's lock offset).
const BASE: u64 = 1 << 20;
const SLOT: u64 = 1024;

#[derive(Clone, Debug)]
struct LockSpec {
    backend: Backend,
    variant: String,
    locks: u64,
    zipf: f64,
    memory_nodes: usize,
    compute_nodes: usize,
    threads: usize,
    coroutines: usize,
    ops: u64,
    hold_ns: u64,
    seed: u64,
    pin: bool,
    device: DeviceArgs,
}

impl LockSpec {
    fn host_bytes(&self) -> u64 {
        let per_node = self.locks.div_ceil(self.memory_nodes as u64);
        (BASE + per_node * SLOT).next_multiple_of(1 << 20)
    }

    fn node_of(&self, lock: u64) -> GlobalAddr {
        let m = self.memory_nodes as u64;
        GlobalAddr::new((lock % m) as u16, Space::Host, BASE + lock / m * SLOT)
    }
}

pub fn run(args: LocksArgs) -> Result<crate::run::Outcome, ArgError> {
    let specs = args.specs()?;
    if specs[0].backend != Backend::Sim {
        cmdline::warn_if_oversubscribed("loch-bench locks", "threads", specs[0].threads);
    }
    if !args.json {
        print_header(&specs[0]);
    }
    let mut docs = Vec::new();
    for spec in &specs {
        if cmdline::signals::stop_requested() {
            break;
        }
        let m = match measure(spec) {
            Ok(Some(m)) => m,
            // SIGINT/SIGTERM stopped the simulated world before the
            // variant's clients ended: nothing of it to report.
            Ok(None) => break,
            Err(e) => {
                return Ok(crate::run::Outcome::Failed(format!(
                    "benchmark failed: {e}"
                )))
            }
        };
        let doc = report_json(spec, &m);
        if args.json {
            docs.push(doc);
        } else {
            print_row(&doc);
        }
    }
    if args.json {
        cmdline::outln!("{}", serde_json::Value::Array(docs));
    }
    Ok(crate::run::Outcome::finished())
}

impl LocksArgs {
    fn specs(&self) -> Result<Vec<LockSpec>, ArgError> {
        let sim = self.backend == Backend::Sim;
        self.device.check(self.backend)?;
        let names: Vec<String> = self
            .variants
            .split(',')
            .map(|s| s.trim().to_string())
            .collect();
        for n in &names {
            if !VARIANTS.contains(&n.as_str()) {
                return Err(ArgError(format!(
                    "unknown lock variant `{n}`; known: {}",
                    VARIANTS.join(", ")
                )));
            }
        }
        if self.locks == 0 || self.locks > 1 << 24 {
            return Err(ArgError(format!(
                "--locks must be in 1..={} (got {})",
                1u64 << 24,
                self.locks
            )));
        }
        if !(self.zipf == 0.0 || crate::ycsb::zipf_constant_ok(self.zipf)) {
            return Err(ArgError(format!(
                "--zipf must be 0 or in (0,1) or (1,5] (got {})",
                self.zipf
            )));
        }
        let memory_nodes = self.memory_nodes.unwrap_or(if sim { 8 } else { 2 });
        let threads = self.threads.unwrap_or(if sim { 22 } else { 1 });
        self.backend
            .check_one_compute_node(self.compute_nodes.is_some())?;
        let compute_nodes = if sim {
            self.compute_nodes.unwrap_or(8)
        } else {
            1
        };
        for (what, v) in [
            ("--memory-nodes", memory_nodes),
            ("--compute-nodes", compute_nodes),
            ("--threads", threads),
            ("--coroutines", self.coroutines),
        ] {
            if v == 0 || v > 1024 {
                return Err(ArgError(format!("{what} must be in 1..=1024 (got {v})")));
            }
        }
        if memory_nodes > u16::MAX as usize / 2 {
            return Err(ArgError("--memory-nodes is too large".into()));
        }
        let threads_all = (compute_nodes * threads) as u64;
        if sim {
            crate::args::check_sim_size(
                "--compute-nodes × --threads × --memory-nodes, × --coroutines",
                threads_all,
                memory_nodes as u64,
                threads_all * self.coroutines as u64,
            )?;
            if self.no_pin {
                return Err(ArgError(
                    "--no-pin applies to emu and mlx5 (sim pins nothing)".into(),
                ));
            }
        }
        if self.backend == Backend::Emu {
            crate::args::check_emu_cq(
                &format!(
                    "--coroutines {} with --memory-nodes {memory_nodes}",
                    self.coroutines
                ),
                self.coroutines,
                memory_nodes,
            )?;
        }
        // A sleep further ahead than the executor's timer horizon fails
        // every client at its first hold: bad input, refused before any run.
        let horizon = nicdrv::local::TIMER_HORIZON_NS;
        if self.hold_ns > horizon {
            return Err(ArgError(format!(
                "--hold-ns must be at most {horizon} (an hour; got {})",
                self.hold_ns
            )));
        }
        let ops = self.ops.unwrap_or(if sim { 2000 } else { 200_000 });
        if ops == 0 {
            // Nothing measured would make every rate 0 and every ratio
            // undefined.
            return Err(ArgError("--ops must be positive (got 0)".into()));
        }
        Ok(names
            .into_iter()
            .map(|variant| LockSpec {
                backend: self.backend,
                variant,
                locks: self.locks,
                zipf: self.zipf,
                memory_nodes,
                compute_nodes,
                threads,
                coroutines: self.coroutines,
                ops,
                hold_ns: self.hold_ns,
                seed: self.seed,
                pin: !self.no_pin,
                device: self.device.clone(),
            })
            .collect())
    }
}

/// What one variant's run measured.
struct Measured {
    acquisitions: u64,
    elapsed_ns: u64,
    latency_ns: Histogram<u64>,
    tree: TreeStats,
}

/// One variant's run; `None` when SIGINT/SIGTERM stopped a simulated one
/// before it ended.
fn measure(spec: &LockSpec) -> Result<Option<Measured>, String> {
    measure_halting(
        spec,
        Arc::new(AtomicBool::new(false)),
        &cmdline::signals::stop_requested,
    )
}

/// [`measure`], its clients stopping once `halted` is set, and a
/// simulated world stopped once `stop` says so. Each client also looks
/// at SIGINT/SIGTERM before each acquisition; on sim that is not enough:
/// with thousands of clients spinning on a hot lock, each took minutes of
/// wall time to end the acquisition it was in.
fn measure_halting(
    spec: &LockSpec,
    halted: Arc<AtomicBool>,
    stop: &dyn Fn() -> bool,
) -> Result<Option<Measured>, String> {
    let host_bytes = spec.host_bytes();
    let cfg = TreeConfig {
        // Every holder here is alive and may hold for up to an hour
        // (`--hold-ns`): the bound for dead holders has nothing to end.
        lock_wait_ns: u64::MAX,
        ..variant(&spec.variant, host_bytes).ok_or("unknown variant")?
    };
    let backend = spec
        .backend
        .cluster(spec.pin, spec.seed, spec.compute_nodes, &spec.device)?;
    let mut c = Cluster::boot(&ClusterSpec {
        machines: 0,
        memory_nodes: spec.memory_nodes,
        host_bytes,
        dm_bytes: DM_BYTES,
        latency_ns: 0,
        backend,
    })?;
    // One tree handle (its local lock table) per compute node.
    let trees = (0..spec.compute_nodes)
        .map(|_| Tree::new(cfg.clone(), c.dm_bytes(DM_BYTES)).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, String>>()?;
    let cores = spec.compute_nodes * spec.threads;
    let exec = ExecutorConfig {
        slots: spec.coroutines,
        scratch_bytes_per_slot: 4096,
        poll_batch: 32,
    };
    let work = LockWork {
        spec,
        trees,
        halted,
    };
    let Some(groups) = c.run_or_stop(&work, cores, exec, stop)? else {
        return Ok(None);
    };
    let groups = groups.into_iter().collect::<Result<Vec<_>, String>>()?;
    let elapsed_ns = match &c {
        Cluster::Sim(w) => w.now_ns(),
        // emu and mlx5: each core's wall clock.
        _ => groups.iter().map(|g| g.elapsed_ns).max().unwrap_or(0),
    };
    let mut latency_ns = latency_histogram();
    let mut tree = TreeStats::default();
    let mut acquisitions = 0;
    for g in groups {
        latency_ns
            .add(&g.latency_ns)
            .map_err(|e| format!("merging latencies: {e}"))?;
        tree += g.tree;
        acquisitions += g.acquisitions;
    }
    Ok(Some(Measured {
        acquisitions,
        elapsed_ns,
        latency_ns,
        tree,
    }))
}

/// What the clients of one group (an emu core; the whole simulated
/// world) share.
struct Tally {
    latency_ns: RefCell<Histogram<u64>>,
    acquisitions: Cell<u64>,
    tree: Cell<TreeStats>,
    failure: RefCell<Option<String>>,
    began: Cell<Option<Instant>>,
}

/// One group's totals.
struct GroupOut {
    acquisitions: u64,
    elapsed_ns: u64,
    latency_ns: Histogram<u64>,
    tree: TreeStats,
}

struct LockWork<'a> {
    spec: &'a LockSpec,
    trees: Vec<Arc<Tree>>,
    /// Set by the first client that fails: every client, on every core,
    /// stops before its next acquisition (the run has failed). Relaxed: a
    /// stop flag; the failure itself stays in its core's tally.
    halted: Arc<AtomicBool>,
}

impl Workload for LockWork<'_> {
    type Group = Rc<Tally>;
    type Out = Result<GroupOut, String>;

    fn group(&self, _: usize, _: usize) -> Rc<Tally> {
        Rc::new(Tally {
            latency_ns: RefCell::new(latency_histogram()),
            acquisitions: Cell::new(0),
            tree: Cell::new(TreeStats::default()),
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
        let tree = &self.trees[place.compute_node.min(self.trees.len() - 1)];
        for k in 0..self.spec.coroutines {
            // Client ids: non-zero and unique in the cluster.
            let id = 1 + (place.core * self.spec.coroutines + k) as u64;
            let client = tree.client(id).map_err(|e| e.to_string())?;
            let (spec, t, h) = (self.spec.clone(), tally.clone(), self.halted.clone());
            on.spawn_task(move |ctx| lock_task(ctx, spec, client, id, t, h))?;
        }
        tally.began.set(Some(Instant::now()));
        Ok(())
    }

    fn finish(&self, tally: Rc<Tally>, _: VerbCounters) -> Self::Out {
        if let Some(e) = tally.failure.borrow_mut().take() {
            return Err(e);
        }
        Ok(GroupOut {
            acquisitions: tally.acquisitions.get(),
            elapsed_ns: tally
                .began
                .get()
                .map_or(0, |b| b.elapsed().as_nanos() as u64),
            latency_ns: tally.latency_ns.borrow().clone(),
            tree: tally.tree.get(),
        })
    }
}

/// One client: `ops` acquisitions of locks drawn from the distribution,
/// each held `hold_ns` and released.
async fn lock_task<N: Nic>(
    ctx: Ctx<N>,
    spec: LockSpec,
    mut client: index::tree::TreeClient,
    id: u64,
    tally: Rc<Tally>,
    halted: Arc<AtomicBool>,
) {
    let mut rng = Rng::stream(spec.seed, Domain::Client, id);
    let zipf = (spec.zipf > 0.0).then(|| Zipfian::new(spec.locks, spec.zipf));
    let fail = |why: String| {
        // The core's first failure is the one reported, as in `run`.
        tally.failure.borrow_mut().get_or_insert(why);
        halted.store(true, Ordering::Relaxed);
    };
    for _ in 0..spec.ops {
        if cmdline::signals::stop_requested() || halted.load(Ordering::Relaxed) {
            break;
        }
        let lock = match &zipf {
            Some(z) => z.next(&mut rng),
            None => rng.below(spec.locks),
        };
        let t0 = ctx.nic().now_ns();
        let held = match client.lock_node(&ctx, spec.node_of(lock)).await {
            Ok(h) => h,
            Err(e) => {
                fail(format!("client {id}: lock {lock}: {e}"));
                break;
            }
        };
        let waited = ctx.nic().now_ns().saturating_sub(t0);
        if spec.hold_ns > 0 {
            match ctx.sleep(spec.hold_ns) {
                Ok(s) => s.await,
                Err(e) => {
                    fail(format!("client {id}: {e}"));
                    let _ = client.unlock_node(&ctx, held).await;
                    break;
                }
            }
        }
        if let Err(e) = client.unlock_node(&ctx, held).await {
            fail(format!("client {id}: unlock {lock}: {e}"));
            break;
        }
        let _ = tally.latency_ns.borrow_mut().record(waited.max(1));
        tally.acquisitions.set(tally.acquisitions.get() + 1);
    }
    let mut t = tally.tree.get();
    t += client.stats;
    tally.tree.set(t);
}

/// The variant's figures as one JSON object (also what the table prints).
fn report_json(s: &LockSpec, m: &Measured) -> serde_json::Value {
    let acq = m.acquisitions;
    let per = |v: u64| {
        if acq == 0 {
            serde_json::Value::Null
        } else {
            json!(v as f64 / acq as f64)
        }
    };
    // Every acquisition not handed over won one remote CAS; each lost
    // one counted a retry.
    let cas = m.tree.lock_retries + acq.saturating_sub(m.tree.handovers);
    json!({
        "schema_version": crate::run::SCHEMA_VERSION,
        "variant": s.variant,
        "backend": s.backend.name(),
        "simulated": s.backend == Backend::Sim,
        "locks": s.locks,
        "zipf": s.zipf,
        "memory_nodes": s.memory_nodes,
        "compute_nodes": s.compute_nodes,
        "threads_per_compute_node": s.threads,
        "coroutines_per_thread": s.coroutines,
        "hold_ns": s.hold_ns,
        "seed": s.seed,
        "acquisitions": acq,
        "elapsed_ns": m.elapsed_ns,
        "acquisitions_per_sec": if m.elapsed_ns == 0 { 0.0 } else { acq as f64 * 1e9 / m.elapsed_ns as f64 },
        "latency_ns": {
            "p50": m.latency_ns.value_at_quantile(0.5),
            "p99": m.latency_ns.value_at_quantile(0.99),
            "p999": m.latency_ns.value_at_quantile(0.999),
            "max": m.latency_ns.max(),
        },
        "remote_cas_per_acquisition": per(cas),
        "handed_over": per(m.tree.handovers),
    })
}

fn print_header(s: &LockSpec) {
    cmdline::outln!(
        "lock acquisitions on {} ({}): {} lock words, zipf {}, {} memory nodes, {} compute nodes x {} threads x {} clients, hold {} ns",
        s.backend.name(),
        s.backend.clock(),
        s.locks,
        s.zipf,
        s.memory_nodes,
        s.compute_nodes,
        s.threads,
        s.coroutines,
        s.hold_ns
    );
    cmdline::outln!(
        "{:<23} {:>12} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9}",
        "variant",
        "acquisitions",
        "Macq/s",
        "p50 us",
        "p99 us",
        "p999 us",
        "CAS/acq",
        "handed%"
    );
}

fn print_row(j: &serde_json::Value) {
    let f = |v: &serde_json::Value, scale: f64, width: usize, prec: usize| match v.as_f64() {
        Some(x) => format!("{:>width$.prec$}", x * scale),
        None => format!("{:>width$}", "n/a"),
    };
    cmdline::outln!(
        "{:<23} {:>12} {} {} {} {} {} {}",
        j["variant"].as_str().unwrap_or("?"),
        j["acquisitions"],
        f(&j["acquisitions_per_sec"], 1e-6, 9, 3),
        f(&j["latency_ns"]["p50"], 1e-3, 9, 2),
        f(&j["latency_ns"]["p99"], 1e-3, 9, 2),
        f(&j["latency_ns"]["p999"], 1e-3, 10, 2),
        f(&j["remote_cas_per_acquisition"], 1.0, 9, 3),
        f(&j["handed_over"], 100.0, 9, 2),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first spec of the `loch-bench locks` command line `argv`.
    fn spec_of(argv: &[&str]) -> LockSpec {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            locks: LocksArgs,
        }
        Cli::try_parse_from(argv)
            .unwrap()
            .locks
            .specs()
            .unwrap()
            .remove(0)
    }

    #[test]
    fn every_variant_names_a_valid_configuration_adding_one_technique() {
        let on = |c: &TreeConfig| {
            [
                c.lock_in_dm,
                c.local_lock_table,
                c.local_wait_queue,
                c.handover,
            ]
            .iter()
            .filter(|&&b| b)
            .count()
        };
        let counts: Vec<usize> = VARIANTS
            .iter()
            .map(|n| {
                let c = variant(n, 64 << 20).unwrap();
                c.check().unwrap();
                on(&c)
            })
            .collect();
        assert_eq!(counts, [0, 1, 2, 3, 4]);
        assert!(variant("nope", 1 << 20).is_none());
    }

    /// Once a client has failed, no client on any core starts another
    /// acquisition (the others ran their whole count first).
    #[test]
    fn a_halted_run_takes_no_more_locks() {
        for backend in ["sim", "emu"] {
            let mut argv = vec!["locks", "--backend", backend, "--variants", "dm"];
            argv.extend(["--threads", "2", "-n", "200"]);
            if backend == "emu" {
                // Other tests' cores may be pinned beside it.
                argv.push("--no-pin");
            }
            let spec = spec_of(&argv);
            let halted = Arc::new(AtomicBool::new(true));
            let never = || false;
            let m = measure_halting(&spec, halted, &never).unwrap().unwrap();
            assert_eq!(m.acquisitions, 0, "{backend}");
            let m = measure_halting(&spec, Arc::new(AtomicBool::new(false)), &never)
                .unwrap()
                .unwrap();
            assert_eq!(
                m.acquisitions,
                spec.ops * spec.threads as u64 * spec.compute_nodes as u64
            );
        }
    }

    /// A stop ends a simulated run at the world's next look, not when its
    /// clients next look (17,600 clients spinning on zipfian host-memory
    /// locks took half a minute of wall time to end the acquisitions they
    /// were in). Stopped at the first look, nothing is measured; never
    /// stopped, a small world runs to its end as before.
    #[test]
    fn a_stop_ends_a_simulated_run_at_once() {
        let big = spec_of(&["locks", "--variants", "host", "--coroutines", "100"]);
        let m = measure_halting(&big, Arc::new(AtomicBool::new(false)), &|| true).unwrap();
        assert!(m.is_none());
        let small = spec_of(&["locks", "--variants", "dm", "--threads", "2", "-n", "50"]);
        let m = measure_halting(&small, Arc::new(AtomicBool::new(false)), &|| false)
            .unwrap()
            .expect("a run never stopped ends");
        assert_eq!(m.acquisitions, 50 * 2 * 8);
    }

    /// Where several clients fail, the run reports the first failure, not
    /// whichever came last.
    #[test]
    fn a_failed_run_reports_its_first_failure() {
        let argv = ["locks", "--backend", "sim", "--variants", "dm"];
        let mut spec = spec_of(&[&argv[..], &["--coroutines", "4"]].concat());
        // Every client takes its first lock, then fails to sleep past the
        // timers' horizon.
        spec.hold_ns = nicdrv::local::TIMER_HORIZON_NS + 1;
        let e = measure(&spec).err().unwrap();
        // The simulated world is deterministic: client 1, which starts
        // first, fails first (the last of the hundreds to fail, before this
        // was mended, was client 173).
        assert!(e.starts_with("client 1: "), "{e}");
    }
}
