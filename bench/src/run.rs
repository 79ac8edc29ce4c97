//! `loch-bench run`: index workloads (the Sherman paper's mixes and YCSB's
//! core workloads, as property files: see `ycsb.rs`) on the emu backend
//! (wall clock) or the sim backend (virtual time, the paper's scale by
//! default), several systems side by side, with per-operation round trips,
//! bytes, retries and cache hits.
//!
//! A run: boot the cluster, create the tree, bulk-load `--records`
//! (sorted, one client), warm up (`--warmup` operations per client, not
//! measured), then measure `--ops` operations per client, or until
//! `--seconds` after the first measured operation. A `--threads` list runs
//! the whole thing once per point.
//!
//! With `--history` or `--check-history`, every operation (warm-up too,
//! since the checker starts from the bulk-loaded records) is recorded into
//! a `history::map::History` per executor, stamped with the virtual
//! clock on sim and `nicdrv::clock::now_ns()` on emu (the executor's
//! per-turn clock is read before the turn polls completions, so it could
//! stamp a completion before the verb took effect). Without them, the hot
//! path pays one `Option` test per operation.

use crate::args::{ArgError, Args, Flags};
use crate::outfile;
use crate::plot;
use crate::progress::Progress;
use crate::workload::{key_of, KeyDist, Zipfian};
use crate::ycsb::{self, RequestDist, ScanLengthDist, WorkloadFile};
use cluster::sim::{self as simrun, Flow, Placement};
use cluster::stats::latency_histogram;
use cluster::{EmuCluster, EmuClusterConfig, Place, Spawn, Workload};
use hdrhistogram::Histogram;
use history::map::{History, Op, OpId, Ret, Verdict};
use index::any::{AnyClient as Client, AnyIndex as IndexHandle};
use index::cuckoo::{Cuckoo, CuckooConfig};
use index::tree::{Tree, TreeConfig, TreeStats, VersionScheme};
use nicdrv::emu::EmuConfig;
use nicdrv::rng::{Domain, Rng};
use nicdrv::sim::{parse_fault, Fault, FaultKind, RunEnd, SimConfig, SimModel, World};
use nicdrv::{Ctx, ExecutorConfig, Nic, VerbCounters};
use serde_json::json;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    Emu,
    Sim,
}

/// Operation kinds, in report order (and in `ycsb::PROPORTION_KEYS` order).
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

/// How scan lengths are drawn, over `1..=max_scan`.
#[derive(Clone, Debug)]
pub enum ScanLen {
    Uniform,
    /// YCSB's `ZipfianGenerator(1, maxscanlength)`: unscrambled, constant 0.99.
    Zipfian(Zipfian),
}

/// Proportions of each kind (sum 1) and the scan lengths.
#[derive(Clone, Debug)]
pub struct Mix {
    pub name: String,
    pub props: [f64; 5],
    pub max_scan: u64,
    pub scan_len: ScanLen,
    /// How records are chosen, after `--zipf`: YCSB-D's `Latest` favours
    /// recently inserted records.
    pub request: RequestDist,
    /// Carried into the report only.
    pub field_count: u64,
    pub field_length: u64,
}

impl Mix {
    /// The file's mix, with the request distribution `zipf` (the file's or
    /// `--zipf`) makes of it: 0 is uniform, except that "latest" stays.
    pub fn from_file(name: &str, w: &WorkloadFile, zipf: f64) -> Mix {
        Mix {
            name: name.to_string(),
            props: w.proportions,
            max_scan: w.max_scan_length,
            scan_len: match w.scan_length_dist {
                ScanLengthDist::Uniform => ScanLen::Uniform,
                // The parser guarantees max_scan_length >= 1.
                ScanLengthDist::Zipfian => ScanLen::Zipfian(Zipfian::new(w.max_scan_length, 0.99)),
            },
            request: match w.request_dist {
                RequestDist::Latest => RequestDist::Latest,
                _ if zipf == 0.0 => RequestDist::Uniform,
                _ => RequestDist::Zipfian,
            },
            field_count: w.field_count,
            field_length: w.field_length,
        }
    }

    fn scan_len(&self, rng: &mut Rng) -> usize {
        let n = match &self.scan_len {
            ScanLen::Uniform => 1 + rng.below(self.max_scan),
            ScanLen::Zipfian(z) => 1 + z.next(rng),
        };
        n as usize
    }
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
        // The hash table: the tree configuration only lends its chunk size.
        "cuckoo" => TreeConfig::sherman(host_bytes),
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
    "sherman, sherman-paper-versions, fg, fg+comb, fg+comb+onchip, fg+comb+onchip+hier, cuckoo";

/// How long clients measure.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Length {
    /// Operations per client.
    Ops(u64),
    /// Until this long after the first measured operation began (virtual
    /// ns on sim, wall ns on emu).
    Nanos(u64),
}

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
    pub length: Length,
    pub warmup: u64,
    pub seed: u64,
    pub host_bytes: u64,
    pub cache_bytes: usize,
    /// Record every operation into a history.
    pub record_history: bool,
    /// Run the Nessie hash table instead of a tree (`--systems cuckoo`).
    pub cuckoo: bool,
    /// The simulator's model (`--sim-model`).
    pub model: SimModel,
    /// Faults to inject (sim only), `at_ns` counted from the start of the
    /// workload (after the load). With any, failed operations are counted
    /// rather than failing the run.
    pub faults: Vec<Fault>,
}

impl RunSpec {
    /// The injected faults as text, for the report, the table and the
    /// history header.
    fn fault_names(&self) -> Vec<String> {
        self.faults.iter().map(|f| f.to_string()).collect()
    }

    fn clients(&self) -> u64 {
        (self.compute_nodes * self.threads * self.coroutines) as u64
    }

    /// Operations per client, for sizing the hash table (a guess for
    /// timed runs: inserts beyond it can fill the table).
    fn ops_hint(&self) -> u64 {
        match self.length {
            Length::Ops(n) => n + self.warmup,
            Length::Nanos(_) => 10_000 + self.warmup,
        }
    }
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
    /// Operations that failed (only a run with faults goes on after one),
    /// warm-up included.
    pub failed: u64,
}

/// A history and which of its events were measured (not warm-up).
#[derive(Default)]
pub struct HistLog {
    pub history: History,
    pub measured: Vec<bool>,
}

impl HistLog {
    fn invoke(&mut self, client: u32, op: Op, now_ns: u64, measured: bool) -> OpId {
        self.measured.push(measured);
        self.history.invoke(client, op, now_ns)
    }

    fn append(&mut self, other: HistLog) {
        for e in other.history.events() {
            self.history.push(e.clone());
        }
        self.measured.extend(other.measured);
    }

    /// The history file (see `docs/history-format.md`): `header`, then one
    /// `initial` line per bulk-loaded record, then every operation, warm-up
    /// included, in invocation order (emu merges per-core histories, so the
    /// file sorts them), each marked `measured` or not.
    pub fn file_lines(&self, header: &serde_json::Value, initial: &[(u64, u64)]) -> String {
        let mut events: Vec<_> = self.history.events().iter().zip(&self.measured).collect();
        events.sort_by_key(|(e, _)| e.invoke_ns);
        let mut out = String::with_capacity(96 * (events.len() + initial.len()) + 512);
        out.push_str(&header.to_string());
        out.push('\n');
        for (k, v) in initial {
            // Writing into a String cannot fail.
            let _ = writeln!(out, "{{\"type\":\"initial\",\"key\":{k},\"value\":{v}}}");
        }
        for (e, &m) in &events {
            e.write_json(
                &mut out,
                if m {
                    "\"type\":\"op\",\"measured\":true,"
                } else {
                    "\"type\":\"op\",\"measured\":false,"
                },
            );
            out.push('\n');
        }
        out
    }
}

pub struct Report {
    pub kinds: Vec<KindStats>,
    pub all_latency: Histogram<u64>,
    pub elapsed_ns: u64,
    pub tree: TreeStats,
    pub ops: u64,
    pub wall_sec: f64,
    pub sim_events: u64,
    pub history: Option<HistLog>,
    /// Clients that did not run to their end: a run with faults stops once
    /// the clients that can have finished (those left were stuck or on a
    /// crashed compute node).
    pub unfinished_clients: u64,
}

struct ClientTally {
    kinds: RefCell<Vec<KindStats>>,
    all: RefCell<Histogram<u64>>,
    tree: RefCell<TreeStats>,
    /// When the first measured operation began, over every client (and
    /// every core on emu): the start of the measured interval.
    measuring_from: Arc<AtomicU64>,
    failure: RefCell<Option<String>>,
    /// Inserts by this executor's clients. The n-th is record
    /// `records + n * insert_stride + insert_offset`: on sim one executor
    /// holds every client (stride 1), on emu each core numbers its own.
    inserted: Cell<u64>,
    insert_stride: u64,
    insert_offset: u64,
    history: Option<RefCell<HistLog>>,
    /// Clients that ran to their end (a run with faults may stop others).
    finished: Cell<u64>,
    /// When the last measured operation ended (completed or failed); kept
    /// only under faults, where the run's end is not the last event.
    last_done_ns: Cell<u64>,
}

impl ClientTally {
    fn new(
        spec: &RunSpec,
        measuring_from: Arc<AtomicU64>,
        insert_stride: u64,
        insert_offset: u64,
    ) -> Rc<ClientTally> {
        Rc::new(ClientTally {
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
                        failed: 0,
                    })
                    .collect(),
            ),
            all: RefCell::new(latency_histogram()),
            tree: RefCell::new(TreeStats::default()),
            measuring_from,
            failure: RefCell::new(None),
            inserted: Cell::new(0),
            insert_stride,
            insert_offset,
            history: spec
                .record_history
                .then(|| RefCell::new(HistLog::default())),
            finished: Cell::new(0),
            last_done_ns: Cell::new(0),
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
    // Rounding left u just above the last proportion: the last kind in use.
    KINDS
        .into_iter()
        .rev()
        .find(|k| mix.props[k.ix()] > 0.0)
        .unwrap_or(Kind::Read)
}

/// Scans run from their start key to the end of the key space.
const SCAN_HIGH: u64 = u64::MAX - 1;

/// One index handle per compute node.
fn handles(spec: &RunSpec) -> Result<Vec<IndexHandle>, String> {
    (0..spec.compute_nodes)
        .map(|_| {
            if spec.cuckoo {
                let expected = spec.records + spec.clients() * spec.ops_hint();
                let mut cfg = CuckooConfig::new(expected + expected / 4, 8, 8, spec.host_bytes);
                cfg.chunk = spec.tree.chunk.clone();
                Cuckoo::new(cfg)
                    .map(IndexHandle::Hash)
                    .map_err(|e| e.to_string())
            } else {
                Tree::new(
                    TreeConfig {
                        cache_bytes: spec.cache_bytes,
                        ..spec.tree.clone()
                    },
                    256 << 10,
                )
                .map(IndexHandle::Tree)
                .map_err(|e| e.to_string())
            }
        })
        .collect()
}

/// Loaders that fill the hash table in parallel (it has no bulk load).
const CUCKOO_LOADERS: usize = 32;

/// Creates the index and loads the records: the tree by one client's bulk
/// load (`part` 0 of 1), the hash table by `CUCKOO_LOADERS` clients each
/// putting its share of the records.
async fn load_part<N: Nic>(
    ctx: Ctx<N>,
    h: IndexHandle,
    records: u64,
    part: usize,
    parts: usize,
    err: Rc<RefCell<Option<String>>>,
    loaded: Arc<AtomicU64>,
) {
    let r = async {
        match &h {
            IndexHandle::Tree(t) => {
                let mut c = t.client(u64::MAX - 1).map_err(|e| e.to_string())?;
                c.report_loaded(loaded);
                c.create(&ctx).await.map_err(|e| e.to_string())?;
                c.bulk_load(&ctx, records_sorted(records), 36)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            IndexHandle::Hash(_) => {
                let mut c = h
                    .client(u64::MAX - 1 - part as u64)
                    .map_err(|e| e.to_string())?;
                if parts == 1 {
                    c.create(&ctx).await.map_err(|e| e.to_string())?;
                } else {
                    for i in (part as u64..records).step_by(parts) {
                        c.put(&ctx, key_of(i), i).await.map_err(|e| e.to_string())?;
                        // Relaxed: a progress figure for the display only.
                        loaded.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        Ok::<(), String>(())
    };
    if let Err(e) = r.await {
        *err.borrow_mut() = Some(e);
    }
}

/// Records one operation into the executor's history, when there is one.
struct Log<'a, N: Nic> {
    log: Option<&'a RefCell<HistLog>>,
    ctx: &'a Ctx<N>,
    emu: bool,
    client: u32,
    measured: bool,
}

impl<N: Nic> Log<'_, N> {
    fn now(&self) -> u64 {
        if self.emu {
            nicdrv::clock::now_ns()
        } else {
            self.ctx.now_ns()
        }
    }

    fn invoke(&self, op: impl FnOnce() -> Op) -> Option<OpId> {
        let log = self.log?;
        let now = self.now();
        Some(
            log.borrow_mut()
                .invoke(self.client, op(), now, self.measured),
        )
    }

    /// `ret` is asked for only when recording. A failed operation is left
    /// pending (invoked, never completed): its effect is unknown, and it
    /// may take effect at any later time or never.
    fn complete<T, E>(&self, id: Option<OpId>, r: &Result<T, E>, ret: impl FnOnce(&T) -> Ret) {
        if let (Some(log), Some(id), Ok(v)) = (self.log, id, r) {
            let now = self.now();
            log.borrow_mut().history.complete(id, ret(v), now);
        }
    }
}

/// The values one client writes: `client << 32 | n` for its `n`-th put, so
/// every value written in a run is unique and differs from every
/// bulk-loaded value (a record's index, below 2³²): a stale read is always
/// told from a fresh one.
struct Values {
    client: u64,
    puts: u64,
}

impl Values {
    fn new(client: u64) -> Values {
        debug_assert!(client > 0 && client < 1 << 31);
        Values { client, puts: 0 }
    }

    fn next(&mut self) -> u64 {
        let v = self.client << 32 | self.puts;
        self.puts += 1;
        v
    }
}

/// One operation of `kind` on record `key`.
async fn one_op<N: Nic>(
    c: &mut Client,
    kind: Kind,
    key: u64,
    spec: &RunSpec,
    sh: &ClientTally,
    (rng, values): (&mut Rng, &mut Values),
    log: &Log<'_, N>,
) -> Result<(), index::any::AnyError> {
    let ctx = log.ctx;
    match kind {
        Kind::Read => {
            let id = log.invoke(|| Op::Get(key));
            let r = c.get(ctx, key).await;
            log.complete(id, &r, |v| Ret::Get(*v));
            r.map(drop)
        }
        Kind::Update | Kind::Insert => {
            let key = if kind == Kind::Insert {
                let n = sh.inserted.get();
                sh.inserted.set(n + 1);
                key_of(spec.records + n * sh.insert_stride + sh.insert_offset)
            } else {
                key
            };
            let v = values.next();
            let id = log.invoke(|| Op::Put(key, v));
            let r = c.put(ctx, key, v).await;
            log.complete(id, &r, |_| Ret::Put);
            r
        }
        Kind::Scan => {
            let len = spec.mix.scan_len(rng);
            let id = log.invoke(|| Op::Scan {
                low: key,
                high: SCAN_HIGH,
                limit: len,
            });
            let r = c.scan(ctx, key, SCAN_HIGH, len).await;
            log.complete(id, &r, |v| Ret::Scan(v.clone()));
            r.map(drop)
        }
        Kind::ReadModifyWrite => {
            // YCSB's read-modify-write: read the record, write a new value.
            // The history holds its two steps as a get and a put.
            let id = log.invoke(|| Op::Get(key));
            let r = c.get(ctx, key).await;
            log.complete(id, &r, |v| Ret::Get(*v));
            r?;
            let v = values.next();
            let id = log.invoke(|| Op::Put(key, v));
            let r = c.put(ctx, key, v).await;
            log.complete(id, &r, |_| Ret::Put);
            r
        }
    }
}

/// One client: warm-up, then measured operations. Generic over the backend.
async fn client_task<N: Nic>(
    ctx: Ctx<N>,
    mut c: Client,
    spec: Rc<RunSpec>,
    dist: Rc<KeyDist>,
    me: u64,
    sh: Rc<ClientTally>,
) {
    let mut rng = Rng::stream(spec.seed, Domain::Client, me);
    let mut values = Values::new(me);
    let emu = spec.backend == Backend::Emu;
    let faulty = !spec.faults.is_empty();
    for i in 0.. {
        let measured = i >= spec.warmup;
        let t0 = ctx.now_ns();
        if i == spec.warmup {
            // Relaxed: a time stamp, read for the deadline and the report.
            sh.measuring_from.fetch_min(t0, Ordering::Relaxed);
            c.reset_stats();
        }
        match spec.length {
            Length::Ops(n) if i >= spec.warmup + n => break,
            Length::Nanos(d)
                if measured
                    && t0 >= sh.measuring_from.load(Ordering::Relaxed).saturating_add(d) =>
            {
                break
            }
            _ => {}
        }
        let kind = pick(&spec.mix, &mut rng);
        let rec = if spec.mix.request == RequestDist::Latest {
            // YCSB's "latest": rank r counts back from the newest record.
            let top = spec.records + sh.inserted.get() * sh.insert_stride;
            top - 1 - dist.rank(&mut rng) % top
        } else {
            dist.next(&mut rng)
        };
        let key = key_of(rec);
        let before = ctx.counters();
        let splits0 = c.splits();
        let log = Log {
            log: sh.history.as_ref(),
            ctx: &ctx,
            emu,
            client: me as u32,
            measured,
        };
        let draws = (&mut rng, &mut values);
        let r = one_op(&mut c, kind, key, &spec, &sh, draws, &log).await;
        if measured && faulty {
            sh.last_done_ns.set(sh.last_done_ns.get().max(ctx.now_ns()));
        }
        if let Err(e) = r {
            if !faulty {
                *sh.failure.borrow_mut() = Some(format!("{} of key {key}: {e}", kind.name()));
                *sh.tree.borrow_mut() += c.tree_stats();
                return;
            }
            // Under faults the client goes on; the failure is counted and
            // its operation stays pending in the history.
            sh.kinds.borrow_mut()[kind.ix()].failed += 1;
            continue;
        }
        if !measured {
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
        if kind.is_write() && c.splits() == splits0 {
            s.nosplit += 1;
            s.nosplit_bytes += d.bytes_written;
        }
        let _ = sh.all.borrow_mut().record(lat);
    }
    *sh.tree.borrow_mut() += c.tree_stats();
    sh.finished.set(sh.finished.get() + 1);
}

pub fn records_sorted(n: u64) -> Vec<(u64, u64)> {
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

fn finish(
    sh: &ClientTally,
    clients: u64,
    elapsed_ns: u64,
    wall_sec: f64,
    sim_events: u64,
) -> Result<Report, String> {
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
        history: sh
            .history
            .as_ref()
            .map(|h| std::mem::take(&mut *h.borrow_mut())),
        unfinished_clients: clients.saturating_sub(sh.finished.get()),
    })
}

/// The loaders of one load phase: `parts` of them, `per_core` to a core.
struct LoadWork {
    index: IndexHandle,
    records: u64,
    parts: usize,
    per_core: usize,
    loaded: Arc<AtomicU64>,
}

impl Workload for LoadWork {
    /// The first loader's error.
    type Group = Rc<RefCell<Option<String>>>;
    type Out = Option<String>;

    fn group(&self, _: usize, _: usize) -> Self::Group {
        Rc::new(RefCell::new(None))
    }

    fn spawn<N: Nic, S: Spawn<N>>(
        &self,
        place: Place,
        err: &Self::Group,
        on: &mut S,
    ) -> Result<(), String> {
        let first = place.core * self.per_core;
        for part in first..(first + self.per_core).min(self.parts) {
            let (h, e, n, parts) = (self.index.clone(), err.clone(), self.records, self.parts);
            let l = self.loaded.clone();
            on.spawn_task(move |ctx| load_part(ctx, h, n, part, parts, e, l))?;
        }
        Ok(())
    }

    fn finish(&self, err: Self::Group, _: VerbCounters) -> Option<String> {
        err.borrow_mut().take()
    }
}

/// The load phases of an index: the tree is created and bulk-loaded by one
/// client; the hash table is created by one, then filled by
/// `CUCKOO_LOADERS` in parallel.
fn load_phases(spec: &RunSpec) -> Vec<usize> {
    if spec.cuckoo {
        vec![1, CUCKOO_LOADERS]
    } else {
        vec![1]
    }
}

/// The measured clients: `coroutines` per core, numbered from 1 across
/// the run; core `c` runs on compute node `c / threads` with that node's
/// index handle.
struct ClientWork<'a> {
    spec: &'a RunSpec,
    /// One handle per compute node.
    indexes: &'a [IndexHandle],
    dist: &'a KeyDist,
    /// The start of the measured interval, over every group.
    from: Arc<AtomicU64>,
}

impl Workload for ClientWork<'_> {
    type Group = (Rc<ClientTally>, Rc<RunSpec>, Rc<KeyDist>);
    type Out = Result<Report, String>;

    fn group(&self, index: usize, groups: usize) -> Self::Group {
        let sh = ClientTally::new(self.spec, self.from.clone(), groups as u64, index as u64);
        (sh, Rc::new(self.spec.clone()), Rc::new(self.dist.clone()))
    }

    fn spawn<N: Nic, S: Spawn<N>>(
        &self,
        place: Place,
        (sh, spec, dist): &Self::Group,
        on: &mut S,
    ) -> Result<(), String> {
        let index = &self.indexes[place.compute_node];
        for co in 0..spec.coroutines {
            let id = 1 + (place.core * spec.coroutines + co) as u64;
            let c = index.client(id).map_err(|e| e.to_string())?;
            let (s, d, h) = (spec.clone(), dist.clone(), sh.clone());
            on.spawn_task(move |ctx| client_task(ctx, c, s, d, id, h))?;
        }
        Ok(())
    }

    /// An emu core's report (sim reports from the whole world instead).
    fn finish(&self, (sh, ..): Self::Group, _: VerbCounters) -> Self::Out {
        // The executor's clock on emu is nicdrv::clock, as is this.
        let end = nicdrv::clock::now_ns();
        finish(&sh, self.spec.coroutines as u64, end, 0.0, 0)
    }
}

fn measure_sim(spec: &RunSpec) -> Result<Report, String> {
    let mut w = World::new(SimConfig {
        seed: spec.seed,
        memory_nodes: spec.memory_nodes,
        compute_nodes: spec.compute_nodes,
        host_bytes: spec.host_bytes,
        dm_bytes: 256 << 10,
        model: spec.model.clone(),
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    let trees = handles(spec)?;
    let mut progress = Progress::new(format!("records loaded ({})", spec.system), spec.records);
    for parts in load_phases(spec) {
        // Up to 8 loaders to a simulated thread, all on compute node 0.
        let per_core = if parts == 1 { 1 } else { 8 };
        let load = LoadWork {
            index: trees[0].clone(),
            records: spec.records,
            parts,
            per_core,
            loaded: progress.counter(),
        };
        let cfg = ExecutorConfig {
            slots: per_core,
            ..exec_cfg(spec)
        };
        let cores = parts.div_ceil(per_core);
        let spawned = simrun::spawn(&mut w, &load, cores, cfg, Placement::Node(0))?;
        let end = simrun::run_slices(&mut w, 1_000_000, |_, _| {
            progress.tick();
            Flow::Go
        });
        if end != RunEnd::Done {
            return Err("loading did not finish".into());
        }
        if let Some(e) = spawned.finish(&w, &load) {
            return Err(format!("loading failed: {e}"));
        }
    }
    progress.finish();
    // Fault times count from here, the start of the workload.
    let start = w.now_ns();
    let dist = KeyDist::new(spec.records, spec.zipf);
    let clients = ClientWork {
        spec,
        indexes: &trees,
        dist: &dist,
        from: Arc::new(AtomicU64::new(u64::MAX)),
    };
    let cores = spec.threads * trees.len();
    let spawned = simrun::spawn(
        &mut w,
        &clients,
        cores,
        exec_cfg(spec),
        Placement::Blocks(spec.threads),
    )?;
    let sh = &spawned.group.0;
    // Client threads are numbered after the loaders' in the world.
    let first_client_thread = spawned.threads.start;
    let faults: Vec<Fault> = spec
        .faults
        .iter()
        .map(|f| Fault {
            at_ns: start.saturating_add(f.at_ns),
            kind: match f.kind {
                FaultKind::StallThread {
                    thread,
                    duration_ns,
                } => FaultKind::StallThread {
                    thread: first_client_thread + thread,
                    duration_ns,
                },
                k => k,
            },
        })
        .collect();
    w.add_faults(&faults).map_err(|e| e.to_string())?;
    let wall = std::time::Instant::now();
    let mut last_print = 0.0;
    // Under faults some clients may never finish (stuck behind a lock a
    // crashed node held, or on a crashed node): the run ends once no
    // operation has ended for FAULT_QUIET_NS of virtual time.
    let mut quiet_since = (w.now_ns(), sh.last_done_ns.get());
    let last_fault_ns = faults.iter().map(|f| f.at_ns).max().unwrap_or(0);
    // Slices of virtual time, so a long run can report progress.
    let end = simrun::run_slices(&mut w, 1_000_000, |w, until| {
        if !faults.is_empty() {
            let last = sh.last_done_ns.get();
            if last != quiet_since.1 || last_fault_ns > until {
                quiet_since = (until, last);
            } else if until - quiet_since.0 >= FAULT_QUIET_NS {
                return Flow::Stop;
            }
        }
        let t = wall.elapsed().as_secs_f64();
        if t - last_print >= 2.0 {
            last_print = t;
            let done: u64 = sh.kinds.borrow().iter().map(|k| k.count).sum();
            let target = match spec.length {
                Length::Ops(n) => format!("~{} measured ops", (spec.warmup + n) * spec.clients()),
                Length::Nanos(d) => format!("{:.1} measured virtual ms", d as f64 / 1e6),
            };
            eprintln!(
                "loch-bench run: {} at {:.1} virtual ms, {} measured ops (of {}), {:.0} s wall",
                spec.system,
                w.now_ns() as f64 / 1e6,
                done,
                target,
                t
            );
        }
        Flow::Go
    });
    let wall_sec = wall.elapsed().as_secs_f64();
    if end != RunEnd::Done && sh.failure.borrow().is_none() && faults.is_empty() {
        return Err(format!(
            "the simulation ended {end:?} with clients unfinished"
        ));
    }
    // Under faults the measured interval ends with the last operation that
    // ended, not with the quiet time the run waited out.
    let now = if faults.is_empty() {
        w.now_ns()
    } else {
        sh.last_done_ns.get()
    };
    let elapsed = now.saturating_sub(clients.from.load(Ordering::Relaxed).min(now));
    let events = w.events();
    finish(sh, spec.clients(), elapsed, wall_sec, events)
}

/// How long a run with faults waits, in virtual time, with no operation
/// ending and no fault still to come, before it stops the clients left.
const FAULT_QUIET_NS: u64 = 20_000_000;

fn measure_emu(spec: &RunSpec) -> Result<Report, String> {
    let cluster = EmuCluster::boot(&EmuClusterConfig {
        memory_nodes: spec.memory_nodes,
        host_bytes: spec.host_bytes,
        dm_bytes: 256 << 10,
        emu: EmuConfig::default(),
    })
    .map_err(|e| e.to_string())?;
    // One compute node: this process; its cores share one index handle.
    let trees = handles(spec)?;
    let mut progress = Progress::new(format!("records loaded ({})", spec.system), spec.records);
    for parts in load_phases(spec) {
        // Every loader on one core.
        let load = LoadWork {
            index: trees[0].clone(),
            records: spec.records,
            parts,
            per_core: parts,
            loaded: progress.counter(),
        };
        let cfg = ExecutorConfig {
            slots: parts,
            ..exec_cfg(spec)
        };
        let loading = AtomicBool::new(true);
        let loaded = std::thread::scope(|scope| {
            // Draws the bar while the cores load; no thread when nothing is
            // drawn, so the loaders have the machine to themselves.
            if progress.shown() {
                scope.spawn(|| {
                    // Relaxed: a stop flag for the display thread only.
                    while loading.load(Ordering::Relaxed) {
                        progress.tick();
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                });
            }
            let r = cluster.run(&load, 1, cfg, false);
            loading.store(false, Ordering::Relaxed);
            r
        });
        let loaded = loaded.map_err(|e| e.to_string())?;
        if let Some(Some(e)) = loaded.into_iter().next() {
            return Err(format!("loading failed: {e}"));
        }
    }
    progress.finish();
    let wall = std::time::Instant::now();
    let dist = KeyDist::new(spec.records, spec.zipf);
    // ClientTally by the cores: the measured interval starts at the first
    // measured operation of any core, and --seconds counts from there.
    let clients = ClientWork {
        spec,
        indexes: &trees,
        dist: &dist,
        from: Arc::new(AtomicU64::new(u64::MAX)),
    };
    let reports = cluster
        .run(&clients, spec.threads, exec_cfg(spec), true)
        .map_err(|e| e.to_string())?;
    let wall_sec = wall.elapsed().as_secs_f64();
    let mut merged: Option<Report> = None;
    for r in reports {
        let r = r?;
        merged = Some(match merged {
            None => r,
            Some(mut m) => {
                m.absorb(r);
                m
            }
        });
    }
    let mut m = merged.ok_or("no cores ran")?;
    let start = clients.from.load(Ordering::Relaxed);
    m.elapsed_ns = m.elapsed_ns.saturating_sub(start.min(m.elapsed_ns));
    m.wall_sec = wall_sec;
    Ok(m)
}

impl Report {
    /// Adds another core's report to this one.
    fn absorb(&mut self, r: Report) {
        for (a, b) in self.kinds.iter_mut().zip(r.kinds) {
            a.count += b.count;
            a.latency.add(&b.latency).expect("same bounds");
            for (x, y) in a.rtt.iter_mut().zip(b.rtt) {
                *x += y;
            }
            a.bytes_written += b.bytes_written;
            a.bytes_read += b.bytes_read;
            a.nosplit += b.nosplit;
            a.nosplit_bytes += b.nosplit_bytes;
            a.failed += b.failed;
        }
        self.unfinished_clients += r.unfinished_clients;
        self.all_latency.add(&r.all_latency).expect("same bounds");
        self.tree += r.tree;
        self.ops += r.ops;
        // Each core returned its end time; the run ends with the last.
        self.elapsed_ns = self.elapsed_ns.max(r.elapsed_ns);
        if let (Some(a), Some(b)) = (self.history.as_mut(), r.history) {
            a.append(b);
        }
    }
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
    let mut failed_ops = serde_json::Map::new();
    failed_ops.insert(
        "total".into(),
        json!(r.kinds.iter().map(|k| k.failed).sum::<u64>()),
    );
    for k in KINDS {
        failed_ops.insert(k.name().into(), json!(r.kinds[k.ix()].failed));
    }
    let bw: u64 = r.kinds.iter().map(|k| k.bytes_written).sum();
    let br: u64 = r.kinds.iter().map(|k| k.bytes_read).sum();
    let mut doc = json!({
        "system": spec.system,
        "backend": if spec.backend == Backend::Sim { "sim" } else { "emu" },
        "simulated": spec.backend == Backend::Sim,
        "workload": spec.mix.name,
        "zipf": spec.zipf,
        "request_distribution": spec.mix.request.name(),
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
            "ops_per_client": match spec.length { Length::Ops(n) => json!(n), Length::Nanos(_) => json!(null) },
            "seconds": match spec.length { Length::Ops(_) => json!(null), Length::Nanos(d) => json!(d as f64 / 1e9) },
            "max_scan_length": spec.mix.max_scan,
            "ycsb_fieldcount": spec.mix.field_count,
            "ycsb_fieldlength": spec.mix.field_length,
            "warmup_per_client": spec.warmup,
            "sim_model_overrides": spec.model.overrides(),
            "seed": spec.seed,
            "cache_bytes": spec.cache_bytes,
            "tree": format!("{:?}", spec.tree),
        },
    });
    doc["failed_ops"] = failed_ops.into();
    doc["unfinished_clients"] = json!(r.unfinished_clients);
    doc["faults"] = json!(spec.fault_names());
    doc
}

pub const USAGE: &str = "loch-bench run [flags]
  --backend sim|emu       sim: virtual time, the Sherman paper's scale by default; emu: this
                          host, wall clock (default sim)
  --workload NAME         a shipped workload, bench/workloads/NAME (default write-intensive):
                          read-intensive, write-intensive, write-only, insert-only, ycsb-a .. ycsb-f
  --workload-file FILE    a YCSB core-workload property file instead: recordcount, operationcount,
                          read/update/insert/scan/readmodifywriteproportion, requestdistribution
                          (uniform|zipfian|latest), zipfianconstant, maxscanlength,
                          scanlengthdistribution (uniform|zipfian), fieldcount, fieldlength;
                          other keys are warned about and ignored
  --zipf THETA            key skew: 0 is uniform, else in (0,1) or (1,5]; overrides the file's
                          requestdistribution (latest stays latest) and zipfianconstant
                          (default: the file's; 0.99 in every shipped workload)
  --systems a,b,...       systems side by side (default sherman,fg): sherman,
                          sherman-paper-versions, fg, fg+comb, fg+comb+onchip, fg+comb+onchip+hier,
                          cuckoo (the Nessie hash table; no scans)
  --memory-nodes N        (default sim 8, emu 2)
  --compute-nodes N       (default sim 8; emu runs one: this process)
  --threads N[,N,...]     client threads per compute node (default sim 22, emu 2); a list, such
                          as 4,8,16,22, runs every system at each point
  --coroutines N          clients per thread (default 1)
  --records N             records bulk-loaded first; overrides the file's recordcount
                          (default sim 1000000, emu 200000)
  --ops N                 measured operations per client; overrides the file's operationcount,
                          which is otherwise split over all clients, rounded up
                          (default sim 200, emu 20000)
  --seconds S             measure for S seconds instead of a count (virtual on sim, wall on
                          emu), from the first measured operation; excludes --ops
  --warmup N              unmeasured operations per client first (default sim 50, emu 2000)
  --cache-mb N            index cache per compute node (default 64)
  --seed N                (default 1)
  --sim-model K=V,...     override simulator parameters (nicdrv/src/sim/model.rs field names,
                          e.g. atomic_window=0,link_latency_ns_one_way=500); sim only
  --json                  one JSON array on stdout, an object per system and thread count
  --history FILE          write the run's history as JSON lines: a header, the bulk-loaded records
                          (type initial), then every operation, warm-up included (type op:
                          client, op, key, value, ret, invoke_ns, complete_ns, measured); a failed
                          operation is pending (complete_ns null); every put writes a unique
                          value. Format: docs/history-format.md. With several systems or thread
                          counts, one file per run: FILE with .SYSTEM and/or .tN before its
                          extension
  --check-history         check every operation (warm-up included) against the bulk-loaded
                          records with history::map (linearizable point operations, Sherman's
                          scan promise); exit code 1 on a violation
  --fault KIND@TIME[:TARGET]
                          inject a fault (sim only; repeatable), TIME from the start of the
                          workload: memory-crash@TIME:NODE, compute-crash@TIME:NODE,
                          link-cut@TIME:COMPUTE-MEMORY[/DURATION], link-heal@TIME:COMPUTE-MEMORY,
                          latency-spike@TIME:EXTRA/DURATION, thread-stall@TIME:THREAD/DURATION
                          (client threads numbered from 0 across compute nodes); times take
                          ns, us, ms or s. With faults the run goes on with the clients that
                          can: failed operations are counted (failed_ops, by kind) instead of
                          failing the run, and it ends 20 virtual ms after the last operation
                          ended once no fault is left to come (unfinished_clients)
  --fault-seed N          add six faults drawn from N (crashes included) within the first
                          virtual ms of the workload, or within --seconds (sim only)
  --plot DIR              write SVG charts into DIR: latency-cdf.svg, one line per system
                          (latency-cdf-tN.svg per point of a --threads list), and for a list
                          throughput.svg, ops/s against client threads in all
  Exit codes: 0 done; 1 the system under test failed: a history violation, a failed operation
  where none may fail (no faults injected), task scratch exhausted, clients left stuck (the
  message on stderr); 2 bad input (one line naming it; nothing run, nothing written).
  Files are written only after every run succeeded, each whole (written aside, then renamed).";

/// How `run` ended, when it ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// `--check-history` found a violation (exit code 1).
    HistoryViolation,
    /// The system under test failed: an operation failed where none may
    /// (no faults were injected), task scratch ran out, or the simulation
    /// ended with clients stuck (exit code 1). Nothing is written.
    Failed(String),
}

/// The workload named on the command line, parsed; warnings for stderr.
fn load_workload(
    name: Option<String>,
    file: Option<String>,
) -> Result<(String, WorkloadFile, Vec<String>), ArgError> {
    let (label, source, text) = match (name, file) {
        (Some(_), Some(_)) => {
            return Err(ArgError(
                "--workload and --workload-file exclude each other".into(),
            ))
        }
        (None, Some(path)) => {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| ArgError(format!("--workload-file: cannot read `{path}`: {e}")))?;
            (path.clone(), path, text)
        }
        (name, None) => {
            let name = name.unwrap_or_else(|| "write-intensive".into());
            let text = ycsb::builtin(&name).ok_or_else(|| {
                ArgError(format!(
                    "--workload: unknown workload `{name}` (shipped: {}; or --workload-file FILE)",
                    ycsb::builtin_names()
                ))
            })?;
            (
                name.clone(),
                format!("bench/workloads/{name}"),
                text.to_string(),
            )
        }
    };
    let (w, warnings) = ycsb::parse(&source, &text).map_err(|e| ArgError(e.to_string()))?;
    Ok((label, w, warnings))
}

fn parse_threads(s: &str) -> Result<Vec<usize>, ArgError> {
    let mut v = Vec::new();
    for part in s.split(',').map(str::trim) {
        let n: usize = part.parse().map_err(|_| {
            ArgError(format!(
                "--threads: `{part}` is not a whole number (give N or a list N,N,...)"
            ))
        })?;
        if n == 0 || n > 1024 {
            return Err(ArgError(format!(
                "--threads: {n} is out of range; each count must be 1..=1024"
            )));
        }
        if v.contains(&n) {
            return Err(ArgError(format!("--threads: {n} is given twice")));
        }
        v.push(n);
    }
    Ok(v)
}

/// The first line of a history file: what ran, and how to read the rest.
fn history_header(spec: &RunSpec) -> serde_json::Value {
    json!({
        "type": "header",
        "format": "loch-history",
        "version": 1,
        "system": spec.system,
        "index": if spec.cuckoo { "hash" } else { "tree" },
        "backend": if spec.backend == Backend::Sim { "sim" } else { "emu" },
        "time": if spec.backend == Backend::Sim { "virtual ns" } else { "wall ns (CLOCK_MONOTONIC)" },
        "workload": spec.mix.name,
        "seed": spec.seed,
        "clients": spec.clients(),
        "initial_records": spec.records,
        "warmup_per_client": spec.warmup,
        "faults": spec.fault_names(),
        "values": "a put writes client << 32 | n for its client's n-th put (unique in the run); initial values are record numbers, below 2^32",
    })
}

/// Faults drawn by `--fault-seed`, and the window they fall in when the run
/// is counted in operations.
const SEEDED_FAULTS: usize = 6;
const SEEDED_FAULT_WINDOW_NS: u64 = 1_000_000;

/// The run's faults: those of `--fault` and, with `--fault-seed`, a plan
/// drawn from it (crashes included) over the measured window, each checked
/// against the cluster. Thread numbers count client threads across compute
/// nodes from 0.
fn fault_plan_for(
    given: &[Fault],
    seed: Option<u64>,
    length: Length,
    memory_nodes: usize,
    compute_nodes: usize,
    threads: usize,
) -> Result<Vec<Fault>, ArgError> {
    let client_threads = compute_nodes * threads;
    let mut v = given.to_vec();
    if let Some(s) = seed {
        let horizon = match length {
            Length::Nanos(d) => d,
            Length::Ops(_) => SEEDED_FAULT_WINDOW_NS,
        };
        v.extend(Fault::random_plan_with_crashes(
            s,
            SEEDED_FAULTS,
            horizon,
            (
                memory_nodes as u16,
                compute_nodes as u16,
                client_threads as u32,
            ),
        ));
    }
    for f in &v {
        f.check_with_threads(memory_nodes, compute_nodes, client_threads)
            .map_err(|e| {
                ArgError(format!(
                    "--fault: {e} (client threads: {compute_nodes} compute nodes × {threads})"
                ))
            })?;
    }
    v.sort_by_key(|f| f.at_ns);
    Ok(v)
}

/// One finished run, kept until every run is done.
struct SystemRun {
    spec: RunSpec,
    report: Report,
    doc: serde_json::Value,
    /// Measured events as JSON lines, for --history.
    history_lines: Option<String>,
    verdict: Option<Verdict>,
}

pub fn run(raw: &[String]) -> Result<Outcome, ArgError> {
    let mut a = Args::parse(
        raw,
        &Flags {
            switches: &["json", "check-history"],
            valued: &[
                "backend",
                "workload",
                "workload-file",
                "zipf",
                "systems",
                "memory-nodes",
                "compute-nodes",
                "threads",
                "coroutines",
                "records",
                "ops",
                "seconds",
                "warmup",
                "cache-mb",
                "seed",
                "history",
                "plot",
                "sim-model",
                "fault",
                "fault-seed",
            ],
            repeatable: &["fault"],
        },
    )?;
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
    let (wname, wfile, warnings) = load_workload(a.string("workload"), a.string("workload-file"))?;
    let zipf: f64 = a.get("zipf", wfile.zipf())?;
    if !(zipf == 0.0 || ycsb::zipf_constant_ok(zipf)) {
        return Err(ArgError(format!(
            "--zipf must be 0 (uniform) or in (0,1) or (1,5], got {zipf}"
        )));
    }
    let mix = Mix::from_file(&wname, &wfile, zipf);
    let systems = a.string("systems").unwrap_or_else(|| "sherman,fg".into());
    let memory_nodes: usize = a.get("memory-nodes", if sim { 8 } else { 2 })?;
    let compute_nodes: usize = a.get("compute-nodes", if sim { 8 } else { 1 })?;
    let thread_list = match a.string("threads") {
        Some(s) => parse_threads(&s)?,
        None => vec![if sim { 22 } else { 2 }],
    };
    let coroutines: usize = a.get("coroutines", 1)?;
    let records: u64 = match a.get_opt("records")? {
        Some(n) => n,
        None => wfile
            .record_count
            .unwrap_or(if sim { 1_000_000 } else { 200_000 }),
    };
    let ops: Option<u64> = a.get_opt("ops")?;
    let seconds: Option<f64> = a.get_opt("seconds")?;
    let warmup: u64 = a.get("warmup", if sim { 50 } else { 2_000 })?;
    let cache_mb: f64 = a.get("cache-mb", 64.0)?;
    let seed: u64 = a.get("seed", 1)?;
    let json = a.switch("json");
    let check_history = a.switch("check-history");
    let history_path = a.string("history").map(PathBuf::from);
    let plot_dir = a.string("plot").map(PathBuf::from);
    let mut model = SimModel::default();
    if let Some(list) = a.string("sim-model") {
        if !sim {
            return Err(ArgError("--sim-model applies to --backend sim only".into()));
        }
        for item in list.split(',') {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| ArgError(format!("--sim-model: `{item}` is not NAME=VALUE")))?;
            model
                .set(k.trim(), v.trim())
                .map_err(|e| ArgError(format!("--sim-model: {e}")))?;
        }
        model
            .check()
            .map_err(|e| ArgError(format!("--sim-model: {e}")))?;
    }
    let mut fault_plan: Vec<Fault> = Vec::new();
    for f in a.strings("fault") {
        fault_plan.extend(parse_fault(&f).map_err(|e| ArgError(format!("--fault {e}")))?);
    }
    let fault_seed: Option<u64> = a.get_opt("fault-seed")?;
    a.finish()?;
    if !sim && (!fault_plan.is_empty() || fault_seed.is_some()) {
        return Err(ArgError(
            "--fault and --fault-seed apply to --backend sim only".into(),
        ));
    }
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
    if coroutines == 0 || coroutines > 64 {
        return Err(ArgError(format!(
            "--coroutines must be 1..=64, got {coroutines}"
        )));
    }
    if records == 0 || records > 100_000_000 {
        return Err(ArgError(format!(
            "--records must be 1..=100000000, got {records}"
        )));
    }
    let length = match (ops, seconds) {
        (Some(_), Some(_)) => {
            return Err(ArgError("--ops and --seconds exclude each other".into()))
        }
        (Some(0), None) => return Err(ArgError("--ops must be positive".into())),
        (Some(n), None) => Some(Length::Ops(n)),
        (None, Some(s)) => {
            if !(s > 0.0 && s <= 86_400.0) {
                return Err(ArgError(format!(
                    "--seconds must be in (0, 86400], got {s}"
                )));
            }
            Some(Length::Nanos(((s * 1e9) as u64).max(1)))
        }
        // Per thread count, from the file's operationcount or the default.
        (None, None) => None,
    };
    if cache_mb.is_nan() || cache_mb < 0.0 {
        return Err(ArgError("--cache-mb must be non-negative".into()));
    }
    if let Some(p) = &history_path {
        outfile::check_file_target("--history", p).map_err(ArgError)?;
    }
    if let Some(d) = &plot_dir {
        outfile::check_dir_target("--plot", d).map_err(ArgError)?;
    }
    let names: Vec<&str> = systems
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if names.is_empty() {
        return Err(ArgError("--systems names no system".into()));
    }
    let mut specs = Vec::new();
    for &threads in &thread_list {
        let clients = (compute_nodes * threads * coroutines) as u64;
        let host_bytes = (records * 1024 / 20 / memory_nodes as u64
            + clients * (2 << 20) / memory_nodes as u64
            + (64 << 20))
            .next_multiple_of(1 << 20);
        let length = length.unwrap_or(match wfile.operation_count {
            Some(total) => Length::Ops(total.div_ceil(clients)),
            None => Length::Ops(if sim { 200 } else { 20_000 }),
        });
        let faults = fault_plan_for(
            &fault_plan,
            fault_seed,
            length,
            memory_nodes,
            compute_nodes,
            threads,
        )?;
        for &name in &names {
            let tree = system_named(name, host_bytes).ok_or_else(|| {
                ArgError(format!(
                    "--systems: unknown system `{name}` (known: {SYSTEMS})"
                ))
            })?;
            let cuckoo = name == "cuckoo";
            if cuckoo && mix.props[Kind::Scan.ix()] > 0.0 {
                return Err(ArgError(format!(
                    "--systems: the hash table `cuckoo` has no scans, and workload `{}` scans",
                    mix.name
                )));
            }
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
                length,
                warmup,
                seed,
                host_bytes,
                cache_bytes: (cache_mb * (1 << 20) as f64) as usize,
                record_history: history_path.is_some() || check_history,
                cuckoo,
                model: model.clone(),
                faults: faults.clone(),
            });
        }
    }
    // Everything is valid: from here on, only a failed run is an error.
    for w in &warnings {
        eprintln!("loch-bench: warning: {w}");
    }
    let sweep = thread_list.len() > 1;
    // The bulk-loaded records, for the history file and for the checker:
    // made once for every run.
    let initial_records: Vec<(u64, u64)> = if check_history || history_path.is_some() {
        records_sorted(records)
    } else {
        Vec::new()
    };
    let initial: Option<BTreeMap<u64, u64>> =
        check_history.then(|| initial_records.iter().copied().collect());
    let mut done: Vec<SystemRun> = Vec::new();
    for spec in specs {
        let mut report = match measure(&spec) {
            Ok(r) => r,
            Err(e) => {
                return Ok(Outcome::Failed(format!(
                    "{} at {} threads: {e}",
                    spec.system, spec.threads
                )))
            }
        };
        let mut doc = report_json(&spec, &report);
        let (mut history_lines, mut verdict) = (None, None);
        if let Some(log) = report.history.take() {
            let measured = log.measured.iter().filter(|&&m| m).count();
            doc["history"] = json!({"events": log.history.len(), "measured_events": measured, "events_checked": null, "check": null});
            if let Some(initial) = &initial {
                let v = log.history.check(initial);
                doc["history"]["events_checked"] = json!(log.history.len());
                doc["history"]["check"] = json!(match &v {
                    Verdict::Ok => "ok",
                    Verdict::Violation(_) => "violation",
                    Verdict::Undecided(_) => "undecided",
                });
                verdict = Some(v);
            }
            history_lines = history_path
                .is_some()
                .then(|| log.file_lines(&history_header(&spec), &initial_records));
        }
        if !json {
            eprintln!(
                "loch-bench run: {} at {} threads done ({} ops, {:.1} s wall)",
                spec.system, spec.threads, report.ops, report.wall_sec
            );
        }
        done.push(SystemRun {
            spec,
            report,
            doc,
            history_lines,
            verdict,
        });
    }
    if backend == Backend::Emu {
        // A reference measured in the same run: the same records and key
        // distribution, looked up in a local BTreeMap on one thread.
        let rate = btreemap_lookup_rate(records, zipf, seed);
        for d in done.iter_mut() {
            d.doc["btreemap_lookups_per_sec"] = json!(rate);
        }
    }
    // Files, each whole, before anything is printed: a failure to write
    // them is the one error after the runs.
    if let Some(path) = &history_path {
        let runs = done.len();
        for d in done.iter_mut() {
            let file = if runs == 1 {
                path.clone()
            } else {
                let mut tag = Vec::new();
                if names.len() > 1 {
                    tag.push(d.spec.system.clone());
                }
                if sweep {
                    tag.push(format!("t{}", d.spec.threads));
                }
                outfile::tagged(path, &tag.join("."))
            };
            let lines = d.history_lines.take().unwrap_or_default();
            outfile::write_atomic(&file, lines.as_bytes()).map_err(ArgError)?;
            d.doc["history"]["file"] = json!(file.display().to_string());
        }
    }
    if let Some(dir) = &plot_dir {
        write_plots(dir, &done, &thread_list).map_err(ArgError)?;
    }
    let mut violation = false;
    for d in &done {
        match &d.verdict {
            Some(Verdict::Violation(why)) => {
                violation = true;
                eprintln!(
                    "loch-bench run: {} at {} threads: history check: violation\n{why}",
                    d.spec.system, d.spec.threads
                );
            }
            Some(Verdict::Undecided(why)) => eprintln!(
                "loch-bench run: {} at {} threads: history check undecided (no violation found)\n{why}",
                d.spec.system, d.spec.threads
            ),
            _ => {}
        }
    }
    if json {
        let docs: Vec<serde_json::Value> = done.iter().map(|d| d.doc.clone()).collect();
        println!("{}", serde_json::Value::Array(docs));
    } else {
        for &t in &thread_list {
            let rows: Vec<&SystemRun> = done.iter().filter(|d| d.spec.threads == t).collect();
            let docs: Vec<serde_json::Value> = rows.iter().map(|d| d.doc.clone()).collect();
            print_table(&rows[0].spec, &docs);
            for d in rows {
                if let Some(v) = &d.verdict {
                    let word = match v {
                        Verdict::Ok => "ok",
                        Verdict::Violation(_) => "VIOLATION (details on stderr)",
                        Verdict::Undecided(_) => "undecided (details on stderr)",
                    };
                    println!("history check, {}: {word}", d.spec.system);
                }
            }
        }
        if let Some(rate) = done[0].doc["btreemap_lookups_per_sec"].as_f64() {
            println!("reference: BTreeMap lookups on one local thread, same records and keys: {:.3} Mops/s", rate / 1e6);
        }
    }
    Ok(if violation {
        Outcome::HistoryViolation
    } else {
        Outcome::Done
    })
}

/// The charts of `--plot`: a latency CDF per thread count, and throughput
/// against client threads for a sweep.
fn write_plots(dir: &Path, done: &[SystemRun], thread_list: &[usize]) -> Result<(), String> {
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("--plot: cannot create `{}`: {e}", dir.display()))?;
    let first = &done[0].spec;
    let what = format!(
        "{}, {} on {}",
        first.mix.name,
        if first.zipf == 0.0 {
            "uniform".to_string()
        } else {
            format!("zipf {}", first.zipf)
        },
        if first.backend == Backend::Sim {
            "sim (virtual time)"
        } else {
            "emu (wall clock)"
        }
    );
    // parse_threads rejects repeats, so each point is one run per system.
    let points = thread_list;
    for &t in points {
        let runs: Vec<&SystemRun> = done.iter().filter(|d| d.spec.threads == t).collect();
        let series: Vec<(String, &Histogram<u64>)> = runs
            .iter()
            .map(|d| (d.spec.system.clone(), &d.report.all_latency))
            .collect();
        let title = format!(
            "Latency CDF: {what}, {} x {t} client threads",
            first.compute_nodes
        );
        let name = if points.len() == 1 {
            "latency-cdf.svg".to_string()
        } else {
            format!("latency-cdf-t{t}.svg")
        };
        outfile::write_atomic(
            &dir.join(name),
            plot::latency_cdf_svg(&title, &series).as_bytes(),
        )?;
    }
    if points.len() > 1 {
        let mut series: Vec<plot::Series> = Vec::new();
        for d in done {
            let p = (
                (d.spec.compute_nodes * d.spec.threads) as f64,
                d.report.ops_per_sec(),
            );
            match series.iter_mut().find(|s| s.name == d.spec.system) {
                Some(s) => s.points.push(p),
                None => series.push(plot::Series {
                    name: d.spec.system.clone(),
                    points: vec![p],
                }),
            }
        }
        for s in &mut series {
            s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        let title = format!("Throughput: {what}");
        outfile::write_atomic(
            &dir.join("throughput.svg"),
            plot::throughput_svg(&title, &series).as_bytes(),
        )?;
    }
    Ok(())
}

/// Lookups per second of a local `BTreeMap` holding the same records, with
/// keys from the same distribution.
pub fn btreemap_lookup_rate(records: u64, zipf: f64, seed: u64) -> f64 {
    let map: std::collections::BTreeMap<u64, u64> = records_sorted(records).into_iter().collect();
    let dist = KeyDist::new(records, zipf);
    let mut rng = Rng::new(seed);
    let keys: Vec<u64> = (0..1_000_000)
        .map(|_| key_of(dist.next(&mut rng)))
        .collect();
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
    if !spec.faults.is_empty() {
        println!(
            "faults (from the start of the workload): {}",
            spec.fault_names().join("; ")
        );
        for j in rows {
            let f = &j["failed_ops"];
            let by: Vec<String> = KINDS
                .iter()
                .filter_map(|k| {
                    let n = f[k.name()].as_u64().unwrap_or(0);
                    (n > 0).then(|| format!("{} {n}", k.name()))
                })
                .collect();
            println!(
                "{}: {} failed operations{}, {} clients unfinished",
                j["system"].as_str().unwrap_or("?"),
                f["total"].as_u64().unwrap_or(0),
                if by.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", by.join(", "))
                },
                j["unfinished_clients"].as_u64().unwrap_or(0)
            );
        }
    }
}
