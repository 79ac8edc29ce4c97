//! `loch-bench run`: index workloads (the Sherman paper's mixes and YCSB's
//! core workloads) on the emu backend (wall clock) or the sim backend
//! (virtual time, the paper's scale by default), several systems side by
//! side, with per-operation round trips, bytes, retries and cache hits.
//!
//! A run: boot the cluster, create the tree, bulk-load `--records`
//! (sorted, one client), warm up (`--warmup` operations per client, not
//! measured), then measure `--ops` operations per client (or `--seconds`).

use crate::args::{ArgError, Args};
use crate::workload::{key_of, KeyDist};
use appliance::cluster::{EmuCluster, EmuClusterConfig};
use appliance::stats::latency_histogram;
use hdrhistogram::Histogram;
use index::tree::{Tree, TreeClient, TreeConfig, TreeStats, VersionScheme};
use nicdrv::emu::EmuConfig;
use nicdrv::rng::Rng;
use nicdrv::sim::{RunEnd, SimConfig, World};
use nicdrv::{Ctx, ExecutorConfig, Nic};
use serde_json::json;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    Emu,
    Sim,
}

/// Operation kinds, in report order.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Read,
    Update,
    Insert,
    Scan,
    ReadModifyWrite,
}

pub const KINDS: [Kind; 5] = [
    Kind::Read,
    Kind::Update,
    Kind::Insert,
    Kind::Scan,
    Kind::ReadModifyWrite,
];

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Read => "read",
            Kind::Update => "update",
            Kind::Insert => "insert",
            Kind::Scan => "scan",
            Kind::ReadModifyWrite => "rmw",
        }
    }
    fn ix(self) -> usize {
        self as usize
    }
    fn is_write(self) -> bool {
        matches!(self, Kind::Update | Kind::Insert | Kind::ReadModifyWrite)
    }
}

/// Proportions of each kind (sum 1) and the scan length bound.
#[derive(Clone, Debug)]
pub struct Mix {
    pub name: String,
    pub props: [f64; 5],
    pub max_scan: u64,
    /// YCSB-D's "latest": reads favour recently inserted records.
    pub latest: bool,
}

pub fn mix_named(name: &str) -> Option<Mix> {
    let m = |p: [f64; 5]| Mix {
        name: name.to_string(),
        props: p,
        max_scan: 100,
        latest: false,
    };
    Some(match name {
        "read-intensive" => m([0.95, 0.05, 0.0, 0.0, 0.0]),
        "write-intensive" => m([0.5, 0.5, 0.0, 0.0, 0.0]),
        "write-only" => m([0.0, 1.0, 0.0, 0.0, 0.0]),
        "insert-only" => m([0.0, 0.0, 1.0, 0.0, 0.0]),
        "ycsb-a" => m([0.5, 0.5, 0.0, 0.0, 0.0]),
        "ycsb-b" => m([0.95, 0.05, 0.0, 0.0, 0.0]),
        "ycsb-c" => m([1.0, 0.0, 0.0, 0.0, 0.0]),
        "ycsb-d" => Mix {
            latest: true,
            ..m([0.95, 0.0, 0.05, 0.0, 0.0])
        },
        "ycsb-e" => m([0.0, 0.0, 0.05, 0.95, 0.0]),
        "ycsb-f" => m([0.5, 0.0, 0.0, 0.0, 0.5]),
        _ => return None,
    })
}

/// A system: a tree configuration under a name.
pub fn system_named(name: &str, host_bytes: u64) -> Option<TreeConfig> {
    let fg = TreeConfig::fg_plus(host_bytes);
    Some(match name {
        "sherman" => TreeConfig::sherman(host_bytes),
        "sherman-paper-versions" => TreeConfig {
            versions: VersionScheme::FrontRear,
            ..TreeConfig::sherman(host_bytes)
        },
        "fg" | "fg+" => fg,
        // Sherman §5.2.1's breakdown, one technique at a time.
        "fg+comb" => TreeConfig {
            combine: true,
            ..fg
        },
        "fg+comb+onchip" => TreeConfig {
            combine: true,
            lock_in_dm: true,
            ..fg
        },
        "fg+comb+onchip+hier" => TreeConfig {
            combine: true,
            lock_in_dm: true,
            local_lock_table: true,
            handover: true,
            ..fg
        },
        _ => return None,
    })
}

pub const SYSTEMS: &str =
    "sherman, sherman-paper-versions, fg, fg+comb, fg+comb+onchip, fg+comb+onchip+hier";

#[derive(Clone, Debug)]
pub struct RunSpec {
    pub backend: Backend,
    pub mix: Mix,
    pub zipf: f64,
    pub system: String,
    pub tree: TreeConfig,
    pub memory_nodes: usize,
    pub compute_nodes: usize,
    pub threads: usize,
    pub coroutines: usize,
    pub records: u64,
    pub ops: u64,
    pub warmup: u64,
    pub seed: u64,
    pub host_bytes: u64,
    pub cache_bytes: usize,
}

/// What the clients measured.
pub struct KindStats {
    pub count: u64,
    pub latency: Histogram<u64>,
    pub rtt: Vec<u64>,
    pub bytes_written: u64,
    pub bytes_read: u64,
    /// Writes that split nothing, and their bytes written.
    pub nosplit: u64,
    pub nosplit_bytes: u64,
}

pub struct Report {
    pub kinds: Vec<KindStats>,
    pub all_latency: Histogram<u64>,
    pub elapsed_ns: u64,
    pub tree: TreeStats,
    pub ops: u64,
    pub wall_sec: f64,
    pub sim_events: u64,
}

struct Shared {
    kinds: RefCell<Vec<KindStats>>,
    all: RefCell<Histogram<u64>>,
    tree: RefCell<TreeStats>,
    measuring_from: Cell<u64>,
    failure: RefCell<Option<String>>,
    inserted: Cell<u64>,
}

impl Shared {
    fn new() -> Rc<Shared> {
        Rc::new(Shared {
            kinds: RefCell::new(
                KINDS
                    .iter()
                    .map(|_| KindStats {
                        count: 0,
                        latency: latency_histogram(),
                        rtt: vec![0; 65],
                        bytes_written: 0,
                        bytes_read: 0,
                        nosplit: 0,
                        nosplit_bytes: 0,
                    })
                    .collect(),
            ),
            all: RefCell::new(latency_histogram()),
            tree: RefCell::new(TreeStats::default()),
            measuring_from: Cell::new(u64::MAX),
            failure: RefCell::new(None),
            inserted: Cell::new(0),
        })
    }
}

fn pick(mix: &Mix, rng: &mut Rng) -> Kind {
    let mut u = rng.unit();
    for k in KINDS {
        if u < mix.props[k.ix()] {
            return k;
        }
        u -= mix.props[k.ix()];
    }
    Kind::Read
}

/// One client: warm-up, then measured operations. Generic over the backend.
async fn client_task<N: Nic>(
    ctx: Ctx<N>,
    mut c: TreeClient,
    spec: Rc<RunSpec>,
    dist: Rc<KeyDist>,
    me: u64,
    sh: Rc<Shared>,
) {
    let mut rng = Rng::new(spec.seed ^ me.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let total = spec.warmup + spec.ops;
    for i in 0..total {
        let kind = pick(&spec.mix, &mut rng);
        let rec = if spec.mix.latest {
            let ins = sh.inserted.get();
            (spec.records + ins).saturating_sub(1 + dist.next(&mut rng) % (spec.records + ins))
        } else {
            dist.next(&mut rng)
        };
        let key = key_of(rec);
        let before = ctx.counters();
        let splits0 = c.stats.splits;
        let t0 = ctx.now_ns();
        let r = match kind {
            Kind::Read => c.get(&ctx, key).await.map(drop),
            Kind::Update => c.put(&ctx, key, rng.next_u64() >> 1).await,
            Kind::Insert => {
                let n = sh.inserted.get();
                sh.inserted.set(n + 1);
                // New records beyond the loaded ones, spread per client.
                c.put(
                    &ctx,
                    key_of(spec.records + n * 4096 + me),
                    rng.next_u64() >> 1,
                )
                .await
            }
            Kind::Scan => {
                let len = 1 + rng.below(spec.mix.max_scan);
                c.scan(&ctx, key, u64::MAX - 1, len as usize)
                    .await
                    .map(drop)
            }
            Kind::ReadModifyWrite => match c.get(&ctx, key).await {
                Ok(v) => c.put(&ctx, key, v.unwrap_or(0).wrapping_add(1) >> 1).await,
                Err(e) => Err(e),
            },
        };
        if let Err(e) = r {
            *sh.failure.borrow_mut() = Some(format!("{} of key {key}: {e}", kind.name()));
            return;
        }
        if i == spec.warmup {
            sh.measuring_from.set(sh.measuring_from.get().min(t0));
            c.stats = TreeStats::default();
        }
        if i < spec.warmup {
            continue;
        }
        let d = ctx.counters() - before;
        let lat = (ctx.now_ns() - t0).max(1);
        let mut ks = sh.kinds.borrow_mut();
        let s = &mut ks[kind.ix()];
        s.count += 1;
        let _ = s.latency.record(lat);
        s.rtt[(d.round_trips as usize).min(64)] += 1;
        s.bytes_written += d.bytes_written;
        s.bytes_read += d.bytes_read;
        if kind.is_write() && c.stats.splits == splits0 {
            s.nosplit += 1;
            s.nosplit_bytes += d.bytes_written;
        }
        let _ = sh.all.borrow_mut().record(lat);
    }
    *sh.tree.borrow_mut() += c.stats;
}

fn records_sorted(n: u64) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = (0..n).map(|i| (key_of(i), i)).collect();
    v.sort_unstable();
    v.dedup_by_key(|p| p.0);
    v
}

fn exec_cfg(spec: &RunSpec) -> ExecutorConfig {
    ExecutorConfig {
        slots: spec.coroutines,
        scratch_bytes_per_slot: 64 << 10,
        poll_batch: 32,
    }
}

pub fn measure(spec: &RunSpec) -> Result<Report, String> {
    match spec.backend {
        Backend::Sim => measure_sim(spec),
        Backend::Emu => measure_emu(spec),
    }
}

fn finish(sh: &Shared, elapsed_ns: u64, wall_sec: f64, sim_events: u64) -> Result<Report, String> {
    if let Some(e) = sh.failure.borrow_mut().take() {
        return Err(format!("an operation failed: {e}"));
    }
    let kinds = std::mem::take(&mut *sh.kinds.borrow_mut());
    let ops = kinds.iter().map(|k| k.count).sum();
    Ok(Report {
        kinds,
        all_latency: sh.all.borrow().clone(),
        elapsed_ns,
        tree: *sh.tree.borrow(),
        ops,
        wall_sec,
        sim_events,
    })
}

fn measure_sim(spec: &RunSpec) -> Result<Report, String> {
    let mut w = World::new(SimConfig {
        seed: spec.seed,
        memory_nodes: spec.memory_nodes,
        compute_nodes: spec.compute_nodes,
        host_bytes: spec.host_bytes,
        dm_bytes: 256 << 10,
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    let trees: Vec<Arc<Tree>> = (0..spec.compute_nodes)
        .map(|_| {
            Tree::new(
                TreeConfig {
                    cache_bytes: spec.cache_bytes,
                    ..spec.tree.clone()
                },
                256 << 10,
            )
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    // Create and bulk-load with one client.
    let loader = w
        .add_thread(
            0,
            ExecutorConfig {
                slots: 1,
                ..exec_cfg(spec)
            },
        )
        .map_err(|e| e.to_string())?;
    let err = Rc::new(RefCell::new(None));
    {
        let (tr, e, n) = (trees[0].clone(), err.clone(), spec.records);
        w.spawn(loader, move |ctx| async move {
            let r = async {
                let mut c = tr.client(u64::MAX - 1)?;
                c.create(&ctx).await?;
                c.bulk_load(&ctx, records_sorted(n), 36).await
            };
            if let Err(x) = r.await {
                *e.borrow_mut() = Some(x.to_string());
            }
        })
        .map_err(|e| e.to_string())?;
    }
    if w.run() != RunEnd::Done {
        return Err("bulk load did not finish".into());
    }
    if let Some(e) = err.borrow_mut().take() {
        return Err(format!("bulk load failed: {e}"));
    }
    let sh = Shared::new();
    let dist = Rc::new(KeyDist::new(spec.records, spec.zipf));
    let spec_rc = Rc::new(spec.clone());
    let mut id = 1;
    for (cn, tree) in trees.iter().enumerate() {
        for _ in 0..spec.threads {
            let t = w
                .add_thread(cn as u16, exec_cfg(spec))
                .map_err(|e| e.to_string())?;
            for _ in 0..spec.coroutines {
                let c = tree.client(id).map_err(|e| e.to_string())?;
                let (s, d, h) = (spec_rc.clone(), dist.clone(), sh.clone());
                let me = id;
                w.spawn(t, move |ctx| client_task(ctx, c, s, d, me, h))
                    .map_err(|e| e.to_string())?;
                id += 1;
            }
        }
    }
    let wall = std::time::Instant::now();
    let mut last_print = 0.0;
    let total_ops =
        (spec.warmup + spec.ops) * (spec.compute_nodes * spec.threads * spec.coroutines) as u64;
    let end = loop {
        // Slices of virtual time, so a long run can report progress.
        let end = w.run_until(w.now_ns() + 1_000_000);
        if end != RunEnd::Limit {
            break end;
        }
        let t = wall.elapsed().as_secs_f64();
        if t - last_print >= 2.0 {
            last_print = t;
            let done: u64 = sh.kinds.borrow().iter().map(|k| k.count).sum();
            eprintln!(
                "loch-bench run: {} at {:.1} virtual ms, {} of ~{} measured ops, {:.0} s wall",
                spec.system,
                w.now_ns() as f64 / 1e6,
                done,
                total_ops,
                t
            );
        }
    };
    let wall_sec = wall.elapsed().as_secs_f64();
    if end != RunEnd::Done && sh.failure.borrow().is_none() {
        return Err(format!(
            "the simulation ended {end:?} with clients unfinished"
        ));
    }
    let elapsed = w
        .now_ns()
        .saturating_sub(sh.measuring_from.get().min(w.now_ns()));
    let events = w.events();
    finish(&sh, elapsed, wall_sec, events)
}

fn measure_emu(spec: &RunSpec) -> Result<Report, String> {
    let cluster = EmuCluster::boot(&EmuClusterConfig {
        memory_nodes: spec.memory_nodes,
        host_bytes: spec.host_bytes,
        dm_bytes: 256 << 10,
        emu: EmuConfig::default(),
    })
    .map_err(|e| e.to_string())?;
    // One compute node: this process; its cores share one tree handle.
    let tree = Tree::new(
        TreeConfig {
            cache_bytes: spec.cache_bytes,
            ..spec.tree.clone()
        },
        256 << 10,
    )
    .map_err(|e| e.to_string())?;
    let n = spec.records;
    let tr = tree.clone();
    let loaded = cluster
        .run_cores(
            1,
            ExecutorConfig {
                slots: 1,
                ..exec_cfg(spec)
            },
            false,
            move |_, ex| {
                let e = Rc::new(RefCell::new(None));
                let (e2, tr) = (e.clone(), tr.clone());
                ex.spawn(move |ctx| async move {
                    let r = async {
                        let mut c = tr.client(u64::MAX - 1)?;
                        c.create(&ctx).await?;
                        c.bulk_load(&ctx, records_sorted(n), 36).await
                    };
                    if let Err(x) = r.await {
                        *e2.borrow_mut() = Some(x.to_string());
                    }
                })
                .expect("slot");
                ex.run();
                let r = e.borrow_mut().take();
                r
            },
        )
        .map_err(|e| e.to_string())?;
    if let Some(Some(e)) = loaded.into_iter().next() {
        return Err(format!("bulk load failed: {e}"));
    }
    let wall = std::time::Instant::now();
    let dist = Arc::new(KeyDist::new(spec.records, spec.zipf));
    let reports = cluster
        .run_cores(spec.threads, exec_cfg(spec), true, |core, ex| {
            let sh = Shared::new();
            let spec_rc = Rc::new(spec.clone());
            let dist = Rc::new((*dist).clone());
            for co in 0..spec.coroutines {
                let id = 1 + (core * spec.coroutines + co) as u64;
                let c = tree.client(id).expect("non-zero id");
                let (s, d, h) = (spec_rc.clone(), dist.clone(), sh.clone());
                ex.spawn(move |ctx| client_task(ctx, c, s, d, id, h))
                    .expect("slot per coroutine");
            }
            let t0 = std::time::Instant::now();
            ex.run();
            let elapsed = t0.elapsed().as_nanos() as u64;
            finish(&sh, elapsed, 0.0, 0)
        })
        .map_err(|e| e.to_string())?;
    let wall_sec = wall.elapsed().as_secs_f64();
    let mut merged: Option<Report> = None;
    for r in reports {
        let r = r?;
        merged = Some(match merged {
            None => r,
            Some(mut m) => {
                for (a, b) in m.kinds.iter_mut().zip(r.kinds) {
                    a.count += b.count;
                    a.latency.add(&b.latency).expect("same bounds");
                    for (x, y) in a.rtt.iter_mut().zip(b.rtt) {
                        *x += y;
                    }
                    a.bytes_written += b.bytes_written;
                    a.bytes_read += b.bytes_read;
                    a.nosplit += b.nosplit;
                    a.nosplit_bytes += b.nosplit_bytes;
                }
                m.all_latency.add(&r.all_latency).expect("same bounds");
                m.tree += r.tree;
                m.ops += r.ops;
                m.elapsed_ns = m.elapsed_ns.max(r.elapsed_ns);
                m
            }
        });
    }
    let mut m = merged.ok_or("no cores ran")?;
    m.wall_sec = wall_sec;
    Ok(m)
}

fn rtt_quantile(h: &[u64], q: f64) -> u64 {
    let total: u64 = h.iter().sum();
    if total == 0 {
        return 0;
    }
    let target = ((total as f64) * q).ceil() as u64;
    let mut acc = 0;
    for (i, &c) in h.iter().enumerate() {
        acc += c;
        if acc >= target {
            return i as u64;
        }
    }
    (h.len() - 1) as u64
}

fn rtt_mean(h: &[u64]) -> f64 {
    let total: u64 = h.iter().sum();
    if total == 0 {
        return 0.0;
    }
    h.iter()
        .enumerate()
        .map(|(i, &c)| i as u64 * c)
        .sum::<u64>() as f64
        / total as f64
}

impl Report {
    pub fn ops_per_sec(&self) -> f64 {
        if self.elapsed_ns == 0 {
            0.0
        } else {
            self.ops as f64 * 1e9 / self.elapsed_ns as f64
        }
    }

    /// Round-trip histogram over all writes.
    pub fn write_rtt(&self) -> Vec<u64> {
        let mut h = vec![0; 65];
        for k in KINDS.iter().filter(|k| k.is_write()) {
            for (x, y) in h.iter_mut().zip(&self.kinds[k.ix()].rtt) {
                *x += y;
            }
        }
        h
    }

    pub fn cache_hit_ratio(&self) -> f64 {
        let t = self.tree.cache_hits + self.tree.cache_misses;
        if t == 0 {
            0.0
        } else {
            self.tree.cache_hits as f64 / t as f64
        }
    }
}

pub fn report_json(spec: &RunSpec, r: &Report) -> serde_json::Value {
    let per = |v: u64| {
        if r.ops == 0 {
            0.0
        } else {
            v as f64 / r.ops as f64
        }
    };
    let mut rt = serde_json::Map::new();
    for k in KINDS {
        let s = &r.kinds[k.ix()];
        if s.count == 0 {
            continue;
        }
        let last = s.rtt.iter().rposition(|&c| c > 0).unwrap_or(0);
        rt.insert(
            k.name().into(),
            json!({
                "count": s.count,
                "mean": rtt_mean(&s.rtt),
                "p50": rtt_quantile(&s.rtt, 0.5),
                "p99": rtt_quantile(&s.rtt, 0.99),
                "hist": &s.rtt[..=last],
                "latency_ns": {"p50": s.latency.value_at_quantile(0.5), "p99": s.latency.value_at_quantile(0.99)},
            }),
        );
    }
    let w = r.write_rtt();
    let writes: u64 = w.iter().sum();
    let le3: u64 = w.iter().take(4).sum();
    let nosplit: u64 = KINDS.iter().map(|k| r.kinds[k.ix()].nosplit).sum();
    let nosplit_bytes: u64 = KINDS.iter().map(|k| r.kinds[k.ix()].nosplit_bytes).sum();
    let bw: u64 = r.kinds.iter().map(|k| k.bytes_written).sum();
    let br: u64 = r.kinds.iter().map(|k| k.bytes_read).sum();
    json!({
        "system": spec.system,
        "backend": if spec.backend == Backend::Sim { "sim" } else { "emu" },
        "simulated": spec.backend == Backend::Sim,
        "workload": spec.mix.name,
        "zipf": spec.zipf,
        "ops": r.ops,
        "elapsed_ns": r.elapsed_ns,
        "ops_per_sec": r.ops_per_sec(),
        "latency_ns": {
            "p50": r.all_latency.value_at_quantile(0.5),
            "p90": r.all_latency.value_at_quantile(0.9),
            "p99": r.all_latency.value_at_quantile(0.99),
            "p999": r.all_latency.value_at_quantile(0.999),
        },
        "round_trips": rt,
        "writes_within_3_round_trips": if writes == 0 { 0.0 } else { le3 as f64 / writes as f64 },
        "write_round_trips_p99": rtt_quantile(&w, 0.99),
        "bytes_written_per_op": per(bw),
        "bytes_read_per_op": per(br),
        "bytes_written_per_nonsplit_write": if nosplit == 0 { 0.0 } else { nosplit_bytes as f64 / nosplit as f64 },
        "retries_per_op": per(r.tree.read_retries),
        "lock_retries_per_op": per(r.tree.lock_retries),
        "handovers_per_op": per(r.tree.handovers),
        "clean_lookup_ratio": if r.tree.lookups == 0 { 0.0 } else { r.tree.clean_lookups as f64 / r.tree.lookups as f64 },
        "cache_hit_ratio": r.cache_hit_ratio(),
        "splits": r.tree.splits,
        "wall_sec": r.wall_sec,
        "sim_events": r.sim_events,
        "config": {
            "memory_nodes": spec.memory_nodes,
            "compute_nodes": spec.compute_nodes,
            "threads_per_compute_node": spec.threads,
            "coroutines_per_thread": spec.coroutines,
            "records": spec.records,
            "ops_per_client": spec.ops,
            "warmup_per_client": spec.warmup,
            "seed": spec.seed,
            "cache_bytes": spec.cache_bytes,
            "tree": format!("{:?}", spec.tree),
        },
    })
}

pub const USAGE: &str = "loch-bench run [--backend sim|emu] [--workload NAME] [--zipf THETA] [--systems a,b,...]
               [--memory-nodes N] [--compute-nodes N] [--threads N per compute node]
               [--coroutines N per thread] [--records N] [--ops N per client] [--warmup N per client]
               [--cache-mb N] [--seed N] [--json]
  workloads: read-intensive, write-intensive, write-only, insert-only, ycsb-a .. ycsb-f
  systems:   sherman, sherman-paper-versions, fg, fg+comb, fg+comb+onchip, fg+comb+onchip+hier
  sim defaults are the Sherman paper's setup: 8 memory nodes, 8 compute nodes x 22 threads,
  zipf 0.99, write-intensive; key space scaled to --records (default 1,000,000).";

pub fn run(raw: &[String]) -> Result<(), ArgError> {
    let mut a = Args::parse(raw, &["json"])?;
    let backend = match a.string("backend").as_deref().unwrap_or("sim") {
        "sim" => Backend::Sim,
        "emu" => Backend::Emu,
        other => {
            return Err(ArgError(format!(
                "--backend: `{other}` is not available (sim, emu)"
            )))
        }
    };
    let sim = backend == Backend::Sim;
    let wname = a
        .string("workload")
        .unwrap_or_else(|| "write-intensive".into());
    let mix = mix_named(&wname)
        .ok_or_else(|| ArgError(format!("--workload: unknown workload `{wname}`")))?;
    let zipf: f64 = a.get("zipf", 0.99)?;
    if !(zipf == 0.0 || (zipf > 0.0 && zipf < 1.0) || (zipf > 1.0 && zipf <= 5.0)) {
        return Err(ArgError(format!(
            "--zipf must be 0 (uniform) or in (0,1) or (1,5], got {zipf}"
        )));
    }
    let systems = a.string("systems").unwrap_or_else(|| "sherman,fg".into());
    let memory_nodes: usize = a.get("memory-nodes", if sim { 8 } else { 2 })?;
    let compute_nodes: usize = a.get("compute-nodes", if sim { 8 } else { 1 })?;
    let threads: usize = a.get("threads", if sim { 22 } else { 2 })?;
    let coroutines: usize = a.get("coroutines", 1)?;
    let records: u64 = a.get("records", if sim { 1_000_000 } else { 200_000 })?;
    let ops: u64 = a.get("ops", if sim { 200 } else { 20_000 })?;
    let warmup: u64 = a.get("warmup", if sim { 50 } else { 2_000 })?;
    let cache_mb: f64 = a.get("cache-mb", 64.0)?;
    let seed: u64 = a.get("seed", 1)?;
    let json = a.switch("json");
    a.finish()?;
    if memory_nodes == 0 || memory_nodes > 256 || compute_nodes == 0 || compute_nodes > 256 {
        return Err(ArgError(
            "--memory-nodes and --compute-nodes must be 1..=256".into(),
        ));
    }
    if !sim && compute_nodes != 1 {
        return Err(ArgError(
            "--compute-nodes: the emu backend runs one compute node (this process)".into(),
        ));
    }
    if threads == 0 || coroutines == 0 || threads > 1024 || coroutines > 64 {
        return Err(ArgError(
            "--threads must be 1..=1024 and --coroutines 1..=64".into(),
        ));
    }
    if records == 0 || records > 100_000_000 {
        return Err(ArgError(format!(
            "--records must be 1..=100000000, got {records}"
        )));
    }
    if ops == 0 {
        return Err(ArgError("--ops must be positive".into()));
    }
    if cache_mb.is_nan() || cache_mb < 0.0 {
        return Err(ArgError("--cache-mb must be non-negative".into()));
    }
    let host_bytes = (records * 1024 / 20 / memory_nodes as u64
        + (compute_nodes * threads * coroutines) as u64 * (2 << 20) / memory_nodes as u64
        + (64 << 20))
        .next_multiple_of(1 << 20);
    let mut specs = Vec::new();
    for name in systems.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let tree = system_named(name, host_bytes).ok_or_else(|| {
            ArgError(format!(
                "--systems: unknown system `{name}` (known: {SYSTEMS})"
            ))
        })?;
        specs.push(RunSpec {
            backend,
            mix: mix.clone(),
            zipf,
            system: name.to_string(),
            tree,
            memory_nodes,
            compute_nodes,
            threads,
            coroutines,
            records,
            ops,
            warmup,
            seed,
            host_bytes,
            cache_bytes: (cache_mb * (1 << 20) as f64) as usize,
        });
    }
    if specs.is_empty() {
        return Err(ArgError("--systems names no system".into()));
    }
    let mut docs = Vec::new();
    let mut rows = Vec::new();
    for spec in &specs {
        let r = measure(spec).map_err(|e| ArgError(format!("{}: {e}", spec.system)))?;
        let j = report_json(spec, &r);
        if !json {
            eprintln!(
                "loch-bench run: {} done ({} ops, {:.1} s wall)",
                spec.system, r.ops, r.wall_sec
            );
        }
        rows.push(j.clone());
        docs.push(j);
    }
    if backend == Backend::Emu {
        // A reference measured in the same run: the same records and key
        // distribution, looked up in a local BTreeMap on one thread.
        let rate = btreemap_lookup_rate(records, zipf, seed);
        for d in docs.iter_mut() {
            d["btreemap_lookups_per_sec"] = json!(rate);
        }
        if !json {
            print_table(&specs[0], &rows);
            println!("reference: BTreeMap lookups on one local thread, same records and keys: {:.3} Mops/s", rate / 1e6);
            return Ok(());
        }
    }
    if json {
        println!("{}", serde_json::Value::Array(docs));
    } else {
        print_table(&specs[0], &rows);
    }
    Ok(())
}

/// Lookups per second of a local `BTreeMap` holding the same records, with
/// keys from the same distribution.
pub fn btreemap_lookup_rate(records: u64, zipf: f64, seed: u64) -> f64 {
    let map: std::collections::BTreeMap<u64, u64> = records_sorted(records).into_iter().collect();
    let dist = KeyDist::new(records, zipf);
    let mut rng = Rng::new(seed);
    let keys: Vec<u64> = (0..1_000_000).map(|_| key_of(dist.next(&mut rng))).collect();
    let t0 = std::time::Instant::now();
    let mut found = 0u64;
    for _ in 0..3 {
        for k in &keys {
            found += map.get(k).copied().unwrap_or(0) & 1;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    std::hint::black_box(found);
    3.0 * keys.len() as f64 / secs
}

fn print_table(spec: &RunSpec, rows: &[serde_json::Value]) {
    println!(
        "{} on {} ({}): {} memory nodes, {} compute nodes x {} threads x {} coroutines, {} records, zipf {}",
        spec.mix.name,
        if spec.backend == Backend::Sim { "sim" } else { "emu" },
        if spec.backend == Backend::Sim { "virtual time" } else { "wall clock" },
        spec.memory_nodes,
        spec.compute_nodes,
        spec.threads,
        spec.coroutines,
        spec.records,
        spec.zipf
    );
    println!(
        "{:<22} {:>10} {:>9} {:>9} {:>10} {:>9} {:>9} {:>9} {:>9} {:>8}",
        "system",
        "Mops/s",
        "p50 us",
        "p99 us",
        "wr<=3rt %",
        "wr p99rt",
        "B/w nosp",
        "clean rd%",
        "retry/op",
        "cache%"
    );
    for j in rows {
        println!(
            "{:<22} {:>10.3} {:>9.1} {:>9.1} {:>10.2} {:>9} {:>9.1} {:>9.3} {:>9.4} {:>8.2}",
            j["system"].as_str().unwrap_or("?"),
            j["ops_per_sec"].as_f64().unwrap_or(0.0) / 1e6,
            j["latency_ns"]["p50"].as_u64().unwrap_or(0) as f64 / 1e3,
            j["latency_ns"]["p99"].as_u64().unwrap_or(0) as f64 / 1e3,
            j["writes_within_3_round_trips"].as_f64().unwrap_or(0.0) * 100.0,
            j["write_round_trips_p99"].as_u64().unwrap_or(0),
            j["bytes_written_per_nonsplit_write"]
                .as_f64()
                .unwrap_or(0.0),
            j["clean_lookup_ratio"].as_f64().unwrap_or(0.0) * 100.0,
            j["retries_per_op"].as_f64().unwrap_or(0.0),
            j["cache_hit_ratio"].as_f64().unwrap_or(0.0) * 100.0,
        );
    }
}
