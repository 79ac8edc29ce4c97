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

use crate::args::ArgError;
use crate::outfile;
use crate::plot;
use crate::progress::Progress;
use crate::workload::{KeyDist, Zipfian};
use crate::ycsb::{self, RequestDist, ScanLengthDist, WorkloadFile};
use cluster::sim::{self as simrun, Flow, Placement};
use cluster::stats::latency_histogram;
use cluster::{Cluster, ClusterSpec, Place, Spawn, Workload};
use hdrhistogram::Histogram;
use history::map::{History, Op, OpId, Ret, Verdict};
use index::any::{AnyClient as Client, AnyIndex as IndexHandle};
use index::cuckoo::{Cuckoo, CuckooConfig};
use index::keys::{key_of, records_sorted};
use index::tree::layout::Layout;
use index::tree::{TreeConfig, TreeStats};
use nicdrv::rng::{Domain, Rng};
use nicdrv::sim::{parse_fault, Fault, FaultKind, RunEnd, SimConfig, SimModel, World};
use nicdrv::{Ctx, ExecutorConfig, Nic, VerbCounters};
use serde_json::json;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

mod client;
mod drive;
mod output;
mod report;
mod spec;

pub(crate) use client::*;
pub(crate) use drive::*;
pub(crate) use output::*;
pub(crate) use report::*;
pub(crate) use spec::*;

/// `loch-bench run`'s flags. Defaults that depend on the backend are
/// `None` until [`Cli::parse`] fills them in.
#[derive(clap::Args, Debug)]
#[command(after_help = RUN_AFTER_HELP, allow_negative_numbers = true)]
pub struct RunArgs {
    /// sim: virtual time, the Sherman paper's scale by default; emu: this
    /// host, wall clock; mlx5: this host's RDMA device in loopback, wall
    /// clock (a --features mlx5 build)
    #[arg(long, value_enum, ignore_case = true, default_value_t = Backend::Sim)]
    backend: Backend,
    #[command(flatten)]
    device: crate::args::DeviceArgs,
    /// A shipped workload, bench/workloads/NAME: read-intensive,
    /// write-intensive, write-only, insert-only, ycsb-a .. ycsb-f,
    /// range-100, range-1000 [default: write-intensive]
    #[arg(long, value_name = "NAME")]
    workload: Option<String>,
    /// A YCSB core-workload property file instead: recordcount,
    /// operationcount, read/update/insert/scan/readmodifywriteproportion,
    /// requestdistribution (uniform|zipfian|latest), zipfianconstant,
    /// maxscanlength, scanlengthdistribution (uniform|zipfian|constant), fieldcount,
    /// fieldlength; other keys are warned about and ignored. A pipe
    /// works too (`/dev/stdin`, a shell's `<(command)`)
    #[arg(long, value_name = "FILE")]
    workload_file: Option<String>,
    /// Every second client thread (the odd-numbered ones) runs this
    /// shipped workload instead, the others --workload or
    /// --workload-file: Sherman §5.3's range-write mix is half the
    /// threads inserting (insert-only) and half scanning. Its request
    /// distribution follows --zipf as the main one's does
    #[arg(long, value_name = "NAME")]
    half_workload: Option<String>,
    /// Key skew: 0 is uniform, else in (0,1) or (1,5]; overrides the
    /// file's requestdistribution (latest stays latest) and
    /// zipfianconstant [default: the file's; 0.99 in every shipped
    /// workload but range-100 and range-1000, which are uniform]
    #[arg(long, value_name = "THETA")]
    zipf: Option<f64>,
    /// Systems side by side: sherman, sherman-2rt (writes in 2 round
    /// trips, 1 when handed over), sherman-paper-versions, fg, fg+comb,
    /// fg+comb+onchip, fg+comb+onchip+hier, cuckoo (the Nessie hash table;
    /// no scans)
    #[arg(long, value_name = "A,B,...", default_value = "sherman,fg")]
    systems: String,
    /// Memory nodes, 1 ..= 256 [default: sim 8, emu and mlx5 2]
    #[arg(long, value_name = "N")]
    memory_nodes: Option<usize>,
    /// Compute nodes, 1 ..= 256 [default: sim 8; emu and mlx5 run one:
    /// this process]
    #[arg(long, value_name = "N")]
    compute_nodes: Option<usize>,
    /// Client threads per compute node, 1 ..= 1024; a list such as
    /// 4,8,16,22 (no count twice) runs every system at each point
    /// [default: sim 22, emu and mlx5 2]
    #[arg(long, value_name = "N[,N,...]")]
    threads: Option<String>,
    /// Clients per thread, 1 ..= 64
    #[arg(long, value_name = "N", default_value_t = 1)]
    coroutines: usize,
    /// Records bulk-loaded first, 1 ..= 100000000; overrides the file's
    /// recordcount
    /// [default: the file's recordcount, else sim 1000000, emu and mlx5
    /// 200000]
    #[arg(long, value_name = "N")]
    records: Option<u64>,
    /// Measured operations per client (perftest's -n); overrides the
    /// file's operationcount, which is otherwise split over all clients,
    /// rounded up [default: sim 200; emu measures for 1 s instead]
    #[arg(short = 'n', long, visible_alias = "iters", value_name = "N")]
    ops: Option<u64>,
    /// Measure for S seconds instead of a count (virtual on sim, wall on
    /// emu), from the first measured operation; excludes --ops (perftest's
    /// -D)
    #[arg(short = 'D', long, visible_alias = "duration", value_name = "S")]
    seconds: Option<f64>,
    /// Unmeasured operations per client first [default: sim 50, emu and mlx5 2000]
    #[arg(long, value_name = "N")]
    warmup: Option<u64>,
    /// Index cache per compute node, MiB, 0 ..= 65536 (the hash table's
    /// location cache too)
    #[arg(long, value_name = "MIB", default_value_t = 64.0)]
    cache_mb: f64,
    /// The hash table's grace period G before a freed entry is reused, in
    /// milliseconds (at least 8: four windows of 2 ms); a location cache
    /// line whose entry lies apart from its slot serves for G minus a
    /// window [default: 20]
    #[arg(long, value_name = "MS")]
    hash_grace_ms: Option<f64>,
    /// Bytes of a value, 8 to 1024 (a put stores its unique u64 repeated
    /// to fill them; a get returns the first 8). Tree nodes double from 1
    /// KiB until a leaf holds 8 entries: 16 KiB for 1024
    #[arg(long, value_name = "N", default_value_t = 8)]
    value_size: usize,
    /// Bytes of a tree key: 8, 16, 32, 64, 128, 256, 512 or 1024 (record
    /// key k becomes its 8 big-endian bytes repeated, so the order and the
    /// spread are those of the 8-byte keys). Tree nodes double from 1 KiB
    /// until a node holds 8 entries
    #[arg(long, value_name = "N", default_value_t = 8)]
    key_size: usize,
    /// The run's seed (sim: the whole run; emu: the clients' streams)
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Override simulator parameters (nicdrv/src/sim/model.rs field names,
    /// e.g. atomic_window=0,link_latency_ns_one_way=500); sim only
    #[arg(long, value_name = "K=V,...")]
    sim_model: Option<String>,
    /// One JSON array on stdout, an object per system and thread count
    #[arg(long)]
    json: bool,
    /// Write the run's history as JSON lines (docs/history-format.md): a
    /// header, the bulk-loaded records (type initial), then every
    /// operation, warm-up included; a failed operation is pending; every
    /// put writes a unique value. With several systems or thread counts,
    /// one file per run: FILE with .SYSTEM and/or .tN before its extension,
    /// written as that run ends (a run's history is in memory until then);
    /// a run that fails writes its history up to the failure too, and its
    /// header's failure says why
    #[arg(long, value_name = "FILE")]
    history: Option<PathBuf>,
    /// Check every operation (warm-up included) against the bulk-loaded
    /// records with history::map (linearizable point operations, Sherman's
    /// scan promise); exit code 1 on a violation
    #[arg(long)]
    check_history: bool,
    /// Inject a fault (sim only; repeatable), TIME from the start of the
    /// workload: memory-crash@TIME:NODE, compute-crash@TIME:NODE,
    /// link-cut@TIME:COMPUTE-MEMORY[/DURATION],
    /// link-heal@TIME:COMPUTE-MEMORY, latency-spike@TIME:EXTRA/DURATION,
    /// thread-stall@TIME:THREAD/DURATION (client threads numbered from 0
    /// across compute nodes), partition@TIME:NODE+NODE+...[/DURATION]
    /// (those node numbers cut off from the rest); times take ns, us, ms
    /// or s. With faults the
    /// run goes on with the clients that can: failed operations are counted
    /// (failed_ops, by kind) instead of failing the run, and it ends 20
    /// virtual ms after the last operation ended once no fault is left to
    /// come (unfinished_clients)
    #[arg(long, value_name = "KIND@TIME[:TARGET]")]
    fault: Vec<String>,
    /// Add six faults drawn from N (crashes included) within the first
    /// virtual ms of the workload, or within --seconds (sim only)
    #[arg(long, value_name = "N")]
    fault_seed: Option<u64>,
    /// Write charts into DIR, each as SVG and PNG: latency-cdf.svg/.png,
    /// one line per system (latency-cdf-tN per point of a --threads list),
    /// and for a list throughput.svg/.png, ops/s against client threads in
    /// all. PNG text needs a TrueType font: LOCH_PLOT_FONT=FILE, else
    /// DejaVu or Liberation Sans where the system keeps them (without one,
    /// SVG only and a warning)
    #[arg(long, value_name = "DIR")]
    plot: Option<PathBuf>,
}

const RUN_AFTER_HELP: &str = "\
Exit codes: 0 done; 1 the system under test failed: a history violation, a failed operation
where none may fail (no faults injected), task scratch exhausted, clients left stuck (the
message on stderr); 2 bad input (one line naming it; nothing run, nothing written), or a
history or plot file that could not be written once the runs ran; 130 stopped by SIGINT or
SIGTERM (the runs until then are reported and written; the one running ends early). History
files are written as each run ends (a failed run's up to its failure), plots after every run,
each file whole (written aside, then renamed).";

/// The measured window below which an emu figure is not to be trusted,
/// and the default length of an emu run.
const EMU_WINDOW_NS: u64 = 1_000_000_000;
/// Device memory per memory node, on every backend: the default 32 Ki
/// lock words.
pub(crate) const DM_BYTES: u64 = 256 << 10;
/// The most operations a client may be asked for, measured or warm-up
/// (`--ops`, `--warmup`, a workload file's `operationcount`): hours of
/// work for one client at any rate seen here, and far enough below 2^64
/// that both added and multiplied by the clients (at most
/// 256 × 1024 × 64 = 2^24) stay below 2^63.
const MAX_OPS: u64 = 100_000_000_000;

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
    /// SIGINT or SIGTERM stopped the run: what ran until then was
    /// reported (exit code 130).
    Interrupted,
}

impl Outcome {
    /// `Done`, or `Interrupted` if a signal cut the run short.
    pub fn finished() -> Outcome {
        if cmdline::signals::stop_requested() {
            Outcome::Interrupted
        } else {
            Outcome::Done
        }
    }
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
            let text = read_workload_file(&path)?;
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
/// `failure`: why the run failed, for a run that did.
fn history_header(spec: &RunSpec, failure: Option<&str>) -> serde_json::Value {
    json!({
        "type": "header",
        "format": "loch-history",
        "version": 2,
        "system": spec.system,
        "index": if spec.cuckoo { "hash" } else { "tree" },
        "backend": spec.backend.name(),
        "time": if spec.backend == Backend::Sim { "virtual ns" } else { "wall ns, monotonic, from the process's first clock read" },
        "workload": spec.mix.name,
        "half_workload": spec.half_mix.as_ref().map(|h| h.name.clone()),
        "seed": spec.seed,
        "clients": spec.clients(),
        "initial_records": spec.records,
        "warmup_per_client": spec.warmup,
        "faults": spec.fault_names(),
        "values": "a put writes client << 39 | n for its client's n-th put (unique in the run); initial values are record numbers, below 2^32",
        "key_bytes": spec.key_bytes,
        "value_bytes": spec.tree.value_bytes,
        "failure": failure,
    })
}

/// Writes `log` as the history file of `spec`'s run (one of `planned`)
/// where `--history` asks for one: the file, or why it could not be
/// written; `None` where none was asked for. `failure` as in
/// [`history_header`].
fn write_history(
    cli: &Cli,
    spec: &RunSpec,
    planned: usize,
    log: &HistLog,
    failure: Option<&str>,
    initial_records: &[(u64, u64)],
) -> Option<Result<PathBuf, String>> {
    let path = cli.history_path.as_ref()?;
    let file = history_file(cli, path, planned, spec);
    let header = history_header(spec, failure);
    Some(
        outfile::write_atomic_with(&file, |w| log.write_file(w, &header, initial_records))
            .map(|()| file),
    )
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
pub(crate) struct SystemRun {
    spec: RunSpec,
    report: Report,
    doc: serde_json::Value,
    verdict: Option<Verdict>,
}

/// The command line of `loch-bench run`, read and checked.
struct Cli {
    backend: Backend,
    device: crate::args::DeviceArgs,
    mix: Mix,
    /// The odd-numbered threads' mix (`--half-workload`).
    half_mix: Option<Mix>,
    zipf: f64,
    /// The workload file's operation count, when it has one.
    operation_count: Option<u64>,
    /// Warnings about the workload file, printed once everything is valid.
    warnings: Vec<String>,
    systems: Vec<String>,
    memory_nodes: usize,
    compute_nodes: usize,
    thread_list: Vec<usize>,
    coroutines: usize,
    records: u64,
    /// `None`: per thread count, from the file's operation count.
    length: Option<Length>,
    warmup: u64,
    cache_mb: f64,
    hash_grace_ms: Option<f64>,
    /// The trees' node layout (`--key-size`, `--value-size`).
    layout: Layout,
    seed: u64,
    json: bool,
    check_history: bool,
    history_path: Option<PathBuf>,
    plot_dir: Option<PathBuf>,
    model: SimModel,
    fault_plan: Vec<Fault>,
    fault_seed: Option<u64>,
}

impl Cli {
    /// Fills in the defaults that depend on the backend and reads the
    /// workload; [`Cli::check`] then checks the flags together.
    fn parse(a: RunArgs) -> Result<Cli, ArgError> {
        let backend = a.backend;
        let sim = backend == Backend::Sim;
        let (wname, wfile, warnings) = load_workload(a.workload, a.workload_file)?;
        let zipf: f64 = a.zipf.unwrap_or(wfile.zipf());
        if !(zipf == 0.0 || ycsb::zipf_constant_ok(zipf)) {
            return Err(ArgError(format!(
                "--zipf must be 0 (uniform) or in (0,1) or (1,5], got {zipf}"
            )));
        }
        let thread_list = match a.threads {
            Some(s) => parse_threads(&s)?,
            None => vec![if sim { 22 } else { 2 }],
        };
        let records = match a.records {
            Some(n) => n,
            None => wfile
                .record_count
                .unwrap_or(if sim { 1_000_000 } else { 200_000 }),
        };
        let length = run_length(a.ops, a.seconds)?;
        let layout = index::any::record_layout(a.key_size, a.value_size)
            .map_err(|e| ArgError(e.for_flags("--key-size", "--value-size")))?;
        let model = sim_model(a.sim_model, sim)?;
        let mut fault_plan: Vec<Fault> = Vec::new();
        for f in &a.fault {
            fault_plan.extend(parse_fault(f).map_err(|e| ArgError(format!("--fault {e}")))?);
        }
        let half_mix = match a.half_workload {
            None => None,
            Some(name) => {
                let (hname, hfile, _) = load_workload(Some(name), None)
                    .map_err(|e| ArgError(e.0.replace("--workload", "--half-workload")))?;
                Some(Mix::from_file(&hname, &hfile, zipf))
            }
        };
        let cli = Cli {
            backend,
            device: a.device,
            mix: Mix::from_file(&wname, &wfile, zipf),
            half_mix,
            zipf,
            operation_count: wfile.operation_count,
            warnings,
            systems: a
                .systems
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
            memory_nodes: a.memory_nodes.unwrap_or(if sim { 8 } else { 2 }),
            compute_nodes: a.compute_nodes.unwrap_or(if sim { 8 } else { 1 }),
            thread_list,
            coroutines: a.coroutines,
            records,
            length,
            warmup: a.warmup.unwrap_or(if sim { 50 } else { 2_000 }),
            cache_mb: a.cache_mb,
            hash_grace_ms: a.hash_grace_ms,
            layout,
            seed: a.seed,
            json: a.json,
            check_history: a.check_history,
            history_path: a.history,
            plot_dir: a.plot,
            model,
            fault_plan,
            fault_seed: a.fault_seed,
        };
        cli.check()?;
        Ok(cli)
    }

    /// The checks that look at several flags at once.
    fn check(&self) -> Result<(), ArgError> {
        self.device.check(self.backend)?;
        let sim = self.backend == Backend::Sim;
        if !sim && (!self.fault_plan.is_empty() || self.fault_seed.is_some()) {
            return Err(ArgError(
                "--fault and --fault-seed apply to --backend sim only".into(),
            ));
        }
        let (m, c) = (self.memory_nodes, self.compute_nodes);
        if m == 0 || m > 256 || c == 0 || c > 256 {
            return Err(ArgError(
                "--memory-nodes and --compute-nodes must be 1..=256".into(),
            ));
        }
        self.backend.check_one_compute_node(c != 1)?;
        if self.half_mix.is_some() && self.thread_list.iter().any(|&t| t * self.compute_nodes < 2) {
            return Err(ArgError(
                "--half-workload needs at least two client threads in all, one of each half".into(),
            ));
        }
        if self.coroutines == 0 || self.coroutines > 64 {
            return Err(ArgError(format!(
                "--coroutines must be 1..=64, got {}",
                self.coroutines
            )));
        }
        if self.records == 0 || self.records > 100_000_000 {
            return Err(ArgError(format!(
                "--records must be 1..=100000000, got {}",
                self.records
            )));
        }
        for (what, n) in [
            (
                "--ops",
                match self.length {
                    Some(Length::Ops(n)) => Some(n),
                    _ => None,
                },
            ),
            ("--warmup", Some(self.warmup)),
            ("the workload file's operationcount", self.operation_count),
        ] {
            if let Some(n) = n.filter(|&n| n > MAX_OPS) {
                return Err(ArgError(format!(
                    "{what} must be at most {MAX_OPS}, got {n}"
                )));
            }
        }
        // Each system's files are named for it: twice would write one
        // history over the other.
        if let Some(twice) =
            (1..self.systems.len()).find(|&i| self.systems[..i].contains(&self.systems[i]))
        {
            return Err(ArgError(format!(
                "--systems: `{}` is given twice",
                self.systems[twice]
            )));
        }
        // At most 64 GiB: the hash table's location cache is allocated
        // whole up front (`inf` once asked for 32 GiB a compute node).
        if !(0.0..=65_536.0).contains(&self.cache_mb) {
            return Err(ArgError(format!(
                "--cache-mb must be in [0, 65536], got {}",
                self.cache_mb
            )));
        }
        if let Some(g) = self.hash_grace_ms {
            if !(8.0..=60_000.0).contains(&g) {
                return Err(ArgError(format!(
                    "--hash-grace-ms must be in [8, 60000] (four 2 ms windows at least), got {g}"
                )));
            }
            if !self.systems.iter().any(|s| s == "cuckoo") {
                return Err(ArgError(
                    "--hash-grace-ms applies to the hash table: add cuckoo to --systems".into(),
                ));
            }
        }
        if let Some(p) = &self.history_path {
            outfile::check_file_target("--history", p).map_err(ArgError)?;
        }
        if let Some(d) = &self.plot_dir {
            outfile::check_dir_target("--plot", d).map_err(ArgError)?;
        }
        if self.systems.is_empty() {
            return Err(ArgError("--systems names no system".into()));
        }
        Ok(())
    }

    fn records_wanted(&self) -> bool {
        self.check_history || self.history_path.is_some()
    }

    /// One run per (thread count, system), in that order.
    fn specs(&self) -> Result<Vec<RunSpec>, ArgError> {
        let sim = self.backend == Backend::Sim;
        // The memory nodes live in this process (emu and sim: mappings
        // touched as the load writes them; mlx5: registered here too): a
        // load past this machine's memory was killed part-way.
        crate::args::check_memory(
            || {
                format!(
                    "--records {} of {}-byte keys and {}-byte values, loaded (as tree leaves)",
                    self.records,
                    self.layout.key_bytes(),
                    self.layout.value_bytes()
                )
            },
            self.layout.bytes_loaded(self.records),
        )?;
        let mut specs = Vec::new();
        for &threads in &self.thread_list {
            let clients = (self.compute_nodes * threads * self.coroutines) as u64;
            let mem = self.memory_nodes as u64;
            // The hash table's clients each keep a chunk being carved on
            // every memory node (entries lie beside their slots), not one
            // chunk in all; the memory is only touched as it is used.
            let per_node_chunks = if self.systems.iter().any(|s| s == "cuckoo") {
                clients * TreeConfig::sherman(0).chunk.chunk_bytes
            } else {
                0
            };
            let host_bytes = (self.layout.bytes_for_records(self.records) / mem
                + clients * (2 << 20) / mem
                + per_node_chunks
                + (64 << 20))
                .next_multiple_of(1 << 20);
            let length = self.length.unwrap_or(match self.operation_count {
                Some(total) => Length::Ops(total.div_ceil(clients)),
                // Emu: a measured second, the shortest window the wall
                // clock makes trustworthy.
                None if sim => Length::Ops(200),
                None => Length::Nanos(EMU_WINDOW_NS),
            });
            // The history is kept whole until the run ends (the checker
            // needs it; the file is written then): a run that counts its
            // operations says up front what it will hold, at least.
            if let (true, Length::Ops(n)) = (self.records_wanted(), length) {
                let events = history_events_at_least(
                    clients,
                    n.saturating_add(self.warmup),
                    std::iter::once(&self.mix).chain(&self.half_mix),
                );
                crate::args::check_memory(
                    || {
                        format!(
                            "--records {} loaded, and the history of {events} operations at {threads} threads (held until the run ends)",
                            self.records
                        )
                    },
                    self.layout
                        .bytes_loaded(self.records)
                        .saturating_add(events.saturating_mul(HISTORY_EVENT_BYTES)),
                )?;
            }
            let faults = fault_plan_for(
                &self.fault_plan,
                self.fault_seed,
                length,
                self.memory_nodes,
                self.compute_nodes,
                threads,
            )?;
            for name in &self.systems {
                let tree = system_named(name, host_bytes).ok_or_else(|| {
                    ArgError(format!(
                        "--systems: unknown system `{name}` (known: {})",
                        systems_known()
                    ))
                })?;
                let tree = TreeConfig {
                    value_bytes: self.layout.value_bytes(),
                    ..tree
                };
                let cuckoo = name == "cuckoo";
                for mix in std::iter::once(&self.mix).chain(&self.half_mix) {
                    if cuckoo && mix.props[Kind::Scan.ix()] > 0.0 {
                        return Err(ArgError(format!(
                            "--systems: the hash table `cuckoo` has no scans, and workload `{}` scans",
                            mix.name
                        )));
                    }
                }
                specs.push(RunSpec {
                    backend: self.backend,
                    device: self.device.clone(),
                    mix: self.mix.clone(),
                    half_mix: self.half_mix.clone(),
                    zipf: self.zipf,
                    system: name.clone(),
                    tree,
                    key_bytes: self.layout.key_bytes(),
                    memory_nodes: self.memory_nodes,
                    compute_nodes: self.compute_nodes,
                    threads,
                    coroutines: self.coroutines,
                    records: self.records,
                    length,
                    warmup: self.warmup,
                    seed: self.seed,
                    host_bytes,
                    cache_bytes: (self.cache_mb * (1 << 20) as f64) as usize,
                    hash_grace_ns: self.hash_grace_ms.map(|g| (g * 1e6) as u64),
                    record_history: self.records_wanted(),
                    // A counted run's history was checked above, whole.
                    history_cap: match length {
                        // Half of what is left beside the records: the
                        // end of the run needs room of its own (the cores'
                        // histories merged, checked and sorted).
                        Length::Nanos(_) => crate::args::half_memory_holds(
                            crate::args::available_bytes(),
                            self.layout.bytes_loaded(self.records),
                            history_event_bytes_at_most(
                                std::iter::once(&self.mix).chain(&self.half_mix),
                            ),
                        ),
                        Length::Ops(_) => u64::MAX,
                    },
                    cuckoo,
                    model: self.model.clone(),
                    faults: faults.clone(),
                });
            }
        }
        Ok(specs)
    }
}

/// Bytes a recorded operation takes at least: its event (a scan's result
/// comes on top) and its measured flag.
const HISTORY_EVENT_BYTES: u64 = std::mem::size_of::<history::map::Event>() as u64 + 1;

/// Bytes a recorded event takes at most on average under `mixes`: the
/// event and its measured flag, and in the share of operations that are
/// scans, a result of the longest scan (16 bytes a record).
fn history_event_bytes_at_most<'a>(mixes: impl Iterator<Item = &'a Mix>) -> u64 {
    mixes
        .map(|m| {
            let scan = m.props[Kind::Scan.ix()] * m.max_scan.saturating_mul(16) as f64;
            HISTORY_EVENT_BYTES.saturating_add(scan.ceil() as u64)
        })
        .fold(HISTORY_EVENT_BYTES, u64::max)
}

/// The events `clients` clients of `ops` operations each record at
/// least, under the mixes given (a read-modify-write records two).
fn history_events_at_least<'a>(
    clients: u64,
    ops: u64,
    mixes: impl Iterator<Item = &'a Mix>,
) -> u64 {
    // The least of the mixes' (half the threads may run the other); a
    // proportion is in [0, 1].
    let rmw = mixes
        .map(|m| m.props[Kind::ReadModifyWrite.ix()])
        .fold(1.0, f64::min);
    let per_client = ops.saturating_add((ops as f64 * rmw) as u64);
    clients.saturating_mul(per_client)
}

/// `--ops` or `--seconds` (not both); `None` when neither was given.
fn run_length(ops: Option<u64>, seconds: Option<f64>) -> Result<Option<Length>, ArgError> {
    match (ops, seconds) {
        (Some(_), Some(_)) => Err(ArgError("--ops and --seconds exclude each other".into())),
        (Some(0), None) => Err(ArgError("--ops must be positive".into())),
        (Some(n), None) => Ok(Some(Length::Ops(n))),
        (None, Some(s)) if !(s > 0.0 && s <= 86_400.0) => Err(ArgError(format!(
            "--seconds must be in (0, 86400], got {s}"
        ))),
        (None, Some(s)) => Ok(Some(Length::Nanos(((s * 1e9) as u64).max(1)))),
        (None, None) => Ok(None),
    }
}

/// The simulator's model with `--sim-model NAME=VALUE,...` applied.
fn sim_model(list: Option<String>, sim: bool) -> Result<SimModel, ArgError> {
    let mut model = SimModel::default();
    let Some(list) = list else {
        return Ok(model);
    };
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
    Ok(model)
}

pub fn run(args: RunArgs) -> Result<Outcome, ArgError> {
    let cli = Cli::parse(args)?;
    let specs = cli.specs()?;
    // Everything is valid: from here on, only a failed run is an error.
    for w in &cli.warnings {
        cmdline::errln!("loch-bench run: warning: {w}");
    }
    if cli.backend != Backend::Sim {
        let most = cli.thread_list.iter().copied().max().unwrap_or(1);
        cmdline::warn_if_oversubscribed("loch-bench run", "client threads", most);
    }
    let mut done = match measure_all(&cli, specs) {
        Ok(done) => done,
        Err(Stopped::Failed(why)) => return Ok(Outcome::Failed(why)),
        Err(Stopped::Unwritten(e)) => return Err(e),
    };
    for d in done.iter().filter(|d| d.spec.backend != Backend::Sim) {
        if d.report.elapsed_ns < EMU_WINDOW_NS {
            cmdline::errln!(
                "loch-bench run: warning: {} at {} threads measured for {:.3} s of wall clock, under \
                 a second: too short to trust (timer and scheduling noise); measure longer with \
                 --seconds or more --ops",
                d.spec.system,
                d.spec.threads,
                d.report.elapsed_ns as f64 / 1e9
            );
        }
    }
    if cli.backend != Backend::Sim {
        // A reference measured in the same run: the same records and key
        // distribution, looked up in a local BTreeMap on one thread.
        let rate = btreemap_lookup_rate(cli.records, cli.zipf, cli.seed);
        for d in done.iter_mut() {
            d.doc["btreemap_lookups_per_sec"] = json!(rate);
        }
    }
    // Files, each whole, before anything is printed: a failure to write
    // one is the one error after the runs (history files are written as
    // each run ends).
    // A run stopped before its first system ran has nothing to draw.
    if let (Some(dir), false) = (&cli.plot_dir, done.is_empty()) {
        write_plots(dir, &done, &cli.thread_list).map_err(ArgError)?;
    }
    Ok(if print_results(&cli, &done) {
        Outcome::HistoryViolation
    } else {
        Outcome::finished()
    })
}

/// Why [`measure_all`] stopped short.
enum Stopped {
    /// A run failed (exit 1).
    Failed(String),
    /// A history file could not be written.
    Unwritten(ArgError),
}

/// Runs every spec, checking its history when asked and writing its
/// history file as it ends (`--history`: one run's history is in memory
/// at a time, and the runs before a failed one keep their files); the
/// first failed run is the error.
fn measure_all(cli: &Cli, specs: Vec<RunSpec>) -> Result<Vec<SystemRun>, Stopped> {
    // The bulk-loaded records, for the history file and for the checker:
    // made once for every run.
    let initial_records: Vec<(u64, u64)> = if cli.records_wanted() {
        records_sorted(cli.records)
    } else {
        Vec::new()
    };
    let initial: Option<BTreeMap<u64, u64>> = cli
        .check_history
        .then(|| initial_records.iter().copied().collect());
    let mut done: Vec<SystemRun> = Vec::new();
    let planned = specs.len();
    for spec in specs {
        if cmdline::signals::stop_requested() {
            cmdline::errln!(
                "loch-bench run: stopped by SIGINT/SIGTERM after {} of {planned} runs",
                done.len()
            );
            break;
        }
        let mut report = match measure(&spec) {
            Ok(r) => r,
            Err(f) => {
                let at = format!("{} at {} threads", spec.system, spec.threads);
                let what = failed_history(cli, &spec, planned, &f, &initial, &initial_records);
                return Err(Stopped::Failed(format!("{at}: {}{what}", f.why)));
            }
        };
        let mut doc = report_json(&spec, &report);
        let mut verdict = None;
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
            if let Some(written) = write_history(cli, &spec, planned, &log, None, &initial_records)
            {
                let file = written.map_err(|e| Stopped::Unwritten(ArgError(e)))?;
                doc["history"]["file"] = json!(file.display().to_string());
            }
        }
        if !cli.json {
            cmdline::errln!(
                "loch-bench run: {} at {} threads done ({} ops, {:.1} s wall)",
                spec.system,
                spec.threads,
                report.ops,
                report.wall_sec
            );
        }
        done.push(SystemRun {
            spec,
            report,
            doc,
            verdict,
        });
    }
    Ok(done)
}

/// What becomes of a failed run's history: checked when `--check-history`
/// asks, written when `--history` does (its header's `failure` says why
/// the run failed; the operation that failed, and any a stuck client had
/// begun, are pending in it); said as words to add to the failure, or
/// nothing.
fn failed_history(
    cli: &Cli,
    spec: &RunSpec,
    planned: usize,
    failed: &Failed,
    initial: &Option<BTreeMap<u64, u64>>,
    initial_records: &[(u64, u64)],
) -> String {
    let (Some(log), why) = (&failed.history, &failed.why) else {
        return String::new();
    };
    let mut said = String::new();
    if let Some(initial) = initial {
        said += match log.history.check(initial) {
            Verdict::Ok => "; its history until then: check ok",
            Verdict::Violation(_) => "; its history until then: check found a violation",
            Verdict::Undecided(_) => "; its history until then: check undecided",
        };
    }
    match write_history(cli, spec, planned, log, Some(why), initial_records) {
        Some(Ok(file)) => said += &format!("; its history until then is in {}", file.display()),
        Some(Err(e)) => said += &format!("; its history could not be written: {e}"),
        None => {}
    }
    said
}

/// `--history`'s file for the run of `spec`, one of `planned`: tagged
/// with the system and thread count where several runs are planned.
fn history_file(cli: &Cli, path: &Path, planned: usize, spec: &RunSpec) -> PathBuf {
    if planned == 1 {
        return path.to_path_buf();
    }
    let mut tag = Vec::new();
    if cli.systems.len() > 1 {
        tag.push(spec.system.clone());
    }
    if cli.thread_list.len() > 1 {
        tag.push(format!("t{}", spec.threads));
    }
    outfile::tagged(path, &tag.join("."))
}

/// Prints the history verdicts (stderr) and the results (stdout: JSON or
/// tables); whether a history check found a violation.
fn print_results(cli: &Cli, done: &[SystemRun]) -> bool {
    let mut violation = false;
    for d in done {
        match &d.verdict {
            Some(Verdict::Violation(why)) => {
                violation = true;
                cmdline::errln!(
                    "loch-bench run: {} at {} threads: history check: violation\n{why}",
                    d.spec.system, d.spec.threads
                );
            }
            Some(Verdict::Undecided(why)) => cmdline::errln!(
                "loch-bench run: {} at {} threads: history check undecided (no violation found)\n{why}",
                d.spec.system, d.spec.threads
            ),
            _ => {}
        }
    }
    if cli.json {
        let docs: Vec<serde_json::Value> = done.iter().map(|d| d.doc.clone()).collect();
        cmdline::outln!("{}", serde_json::Value::Array(docs));
        return violation;
    }
    for &t in &cli.thread_list {
        let rows: Vec<&SystemRun> = done.iter().filter(|d| d.spec.threads == t).collect();
        if rows.is_empty() {
            continue; // not reached: a signal stopped the run
        }
        let docs: Vec<serde_json::Value> = rows.iter().map(|d| d.doc.clone()).collect();
        print_table(&rows[0].spec, &docs);
        for d in rows {
            if let Some(v) = &d.verdict {
                let word = match v {
                    Verdict::Ok => "ok",
                    Verdict::Violation(_) => "VIOLATION (details on stderr)",
                    Verdict::Undecided(_) => "undecided (details on stderr)",
                };
                cmdline::outln!("history check, {}: {word}", d.spec.system);
            }
        }
    }
    if let Some(rate) = done
        .first()
        .and_then(|d| d.doc["btreemap_lookups_per_sec"].as_f64())
    {
        cmdline::outln!(
            "reference: BTreeMap lookups on one local thread, same records and keys: {:.3} Mops/s",
            rate / 1e6
        );
    }
    violation
}

/// Lookups per second of a local `BTreeMap` holding the same records, with
/// keys from the same distribution: the median of [`REFERENCE_PASSES`]
/// timed passes over the same keys. One pass over all of them, timed as a
/// whole, swung from 4.0 to 8.9 Mops/s between three runs of the same
/// command on this project's 2-core VM (a neighbour's burst lands in the
/// one timing); the median of several passes does not take that burst.
pub fn btreemap_lookup_rate(records: u64, zipf: f64, seed: u64) -> f64 {
    let map: std::collections::BTreeMap<u64, u64> = records_sorted(records).into_iter().collect();
    let dist = KeyDist::new(records, zipf);
    let mut rng = Rng::new(seed);
    let keys: Vec<u64> = (0..REFERENCE_KEYS)
        .map(|_| key_of(dist.next(&mut rng)))
        .collect();
    let mut found = 0u64;
    let mut rates: Vec<f64> = (0..REFERENCE_PASSES)
        .map(|_| {
            let t0 = std::time::Instant::now();
            for k in &keys {
                found += map.get(k).copied().unwrap_or(0) & 1;
            }
            keys.len() as f64 / t0.elapsed().as_secs_f64().max(1e-9)
        })
        .collect();
    std::hint::black_box(found);
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

/// Timed passes of the `BTreeMap` reference, and keys looked up in each.
const REFERENCE_PASSES: usize = 7;
const REFERENCE_KEYS: usize = 500_000;

/// A `--workload-file`, read whole up to 1 MiB (a YCSB property file is a
/// few lines; `/dev/zero` is an error, not memory read without end). A
/// pipe is read to its end (`/dev/stdin`, `<(command)`); a FIFO nobody
/// writes is an error, not a wait without end.
fn read_workload_file(path: &str) -> Result<String, ArgError> {
    const MAX: u64 = 1 << 20;
    let cannot =
        |e: std::io::Error| ArgError(format!("--workload-file: cannot read `{path}`: {e}"));
    let bytes = bootstrap::config::read_input_at_most(path.as_ref(), MAX).map_err(cannot)?;
    if bytes.len() as u64 > MAX {
        return Err(ArgError(format!(
            "--workload-file: `{path}` is larger than 1 MiB: not a workload file"
        )));
    }
    String::from_utf8(bytes)
        .map_err(|e| ArgError(format!("--workload-file: `{path}` is not UTF-8 text: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Args {
        #[command(flatten)]
        run: RunArgs,
    }

    /// `loch-bench run` of Sherman on sim, one thread, its history
    /// checked, with `more` flags.
    fn sherman_on_sim(more: &[&str]) -> Cli {
        sherman_on("sim", "1", more)
    }

    /// `loch-bench run` of Sherman on `backend` with `threads`, its
    /// history checked, with `more` flags.
    fn sherman_on(backend: &str, threads: &str, more: &[&str]) -> Cli {
        let mut argv = vec!["run", "--backend", backend, "--systems", "sherman"];
        argv.extend(["--threads", threads, "--check-history"]);
        argv.extend(more);
        Cli::parse(Args::try_parse_from(argv).unwrap().run).unwrap()
    }

    /// A timed run whose history reaches what memory holds stops there
    /// and fails, its history up to then kept (it grew until the run
    /// ended, and could take more than the machine had).
    #[test]
    fn a_timed_run_stops_where_its_history_would_outgrow_memory() {
        use crate::args::half_memory_holds;
        assert_eq!(half_memory_holds(None, 1 << 30, 100), u64::MAX);
        assert_eq!(half_memory_holds(Some(1 << 20), 1 << 30, 100), 0);
        assert_eq!(
            half_memory_holds(Some((1 << 20) + 200 * 90), 1 << 20, 90),
            100
        );
        // A scan's result counts in its share of the operations.
        let range = sherman_on_sim(&["--workload", "range-100", "--seconds", "1"]);
        let scans = history_event_bytes_at_most(std::iter::once(&range.mix));
        assert_eq!(scans, HISTORY_EVENT_BYTES + 1600);
        // A counted run is bounded before it starts, not as it runs.
        let counted = sherman_on_sim(&["--records", "1000", "--ops", "10"]);
        assert_eq!(counted.specs().unwrap()[0].history_cap, u64::MAX);
        let cli = sherman_on_sim(&["--records", "1000", "--seconds", "1"]);
        let mut spec = cli.specs().unwrap().remove(0);
        assert!(spec.history_cap > 1_000_000, "this machine holds more");
        spec.history_cap = 500;
        let across = Arc::new(client::Across::new(&spec));
        let Err(failed) = drive::measure_across(&spec, across.clone()) else {
            panic!("the run went on past its history's room")
        };
        assert!(
            failed.why.contains("history reached its bound of 500"),
            "{}",
            failed.why
        );
        assert!(
            across.halted.load(Ordering::Relaxed),
            "the failure stops every client"
        );
        let log = failed.history.expect("kept");
        assert!(log.history.len() >= 500, "{}", log.history.len());
        // Each client stops at its next operation: one more each at most.
        assert!(log.history.len() <= 500 + spec.clients() as usize * 2);
        let initial: BTreeMap<u64, u64> = records_sorted(1000).into_iter().collect();
        assert!(matches!(log.history.check(&initial), Verdict::Ok));
        // On emu the cores share the bound: the first to find it spent
        // fails the run and stops the other, within an hour's run.
        let cli = sherman_on("emu", "2", &["--records", "1000", "--seconds", "3600"]);
        let mut spec = cli.specs().unwrap().remove(0);
        spec.history_cap = 400;
        let across = Arc::new(client::Across::new(&spec));
        let Err(failed) = drive::measure_across(&spec, across.clone()) else {
            panic!("the emu run went on past its history's room")
        };
        assert!(failed.why.contains("bound of 400"), "{}", failed.why);
        assert!(across.halted.load(Ordering::Relaxed));
        let held = failed.history.expect("kept").history;
        // All of it but what the other core claimed and did not fill (a
        // chunk, 400 / 2 / 16), and at most one operation a client more.
        let chunk = 400 / 2 / 16;
        assert!(held.len() >= 400 - chunk, "{}", held.len());
        assert!(
            held.len() <= 400 + spec.clients() as usize,
            "{}",
            held.len()
        );
        assert!(matches!(held.check(&initial), Verdict::Ok));
    }

    /// The cores of an emu run share one bound on their history, claimed
    /// as they record: a core may take what the others leave (an equal
    /// share each failed the run at the quicker core's half of it).
    #[test]
    fn the_cores_share_one_bound_on_their_history() {
        let cli = sherman_on_sim(&["--records", "1000", "--seconds", "1"]);
        let mut spec = cli.specs().unwrap().remove(0);
        spec.history_cap = 1000;
        let across = Arc::new(client::Across::new(&spec));
        let (quick, slow) = (
            client::ClientTally::new(&spec, across.clone(), 2, 0),
            client::ClientTally::new(&spec, across.clone(), 2, 1),
        );
        // A chunk: a 16th of an equal share.
        let chunk = 1000 / 2 / 16;
        assert!(slow.history_has_room(0));
        let mut held = 0;
        while quick.history_has_room(held) {
            held += 1;
        }
        assert_eq!(held, 1000 - chunk, "all but the slow core's chunk");
        // The slow core fills what it claimed, and no more.
        assert!(slow.history_has_room(chunk - 1));
        assert!(!slow.history_has_room(chunk));
        assert!(!quick.history_has_room(held));
        assert_eq!(across.history_left.load(Ordering::Relaxed), 0);
        // A counted run's bound does not end.
        let counted = sherman_on_sim(&["--records", "1000", "--ops", "10"]);
        let spec = counted.specs().unwrap().remove(0);
        let one = client::ClientTally::new(&spec, Arc::new(client::Across::new(&spec)), 1, 0);
        assert!(one.history_has_room(1 << 40));
    }

    /// Once a client's failure has failed the run, every client on every
    /// core stops before its next operation (they ran on to their end: a
    /// `--seconds` run's whole length, all of it waited for).
    #[test]
    fn a_halted_run_starts_no_more_operations() {
        for backend in ["sim", "emu"] {
            let cli = sherman_on(backend, "2", &["--records", "100", "--ops", "100000"]);
            let spec = cli.specs().unwrap().remove(0);
            let across = Arc::new(client::Across::new(&spec));
            across.halt();
            let report = match drive::measure_across(&spec, across) {
                Ok(r) => r,
                Err(f) => panic!("{backend}: {}", f.why),
            };
            assert_eq!(report.ops, 0, "{backend}");
            let log = report.history.expect("recorded");
            let initial = records_sorted(100).into_iter().collect();
            assert!(matches!(log.history.check(&initial), Verdict::Ok));
            assert_eq!(log.history.len(), 0, "{backend}: no operation was started");
        }
    }

    /// A run whose operation failed keeps what its clients recorded: the
    /// failure carries the history, the failed operation pending in it,
    /// and `--history` writes it with the failure in its header, checked
    /// where `--check-history` asks (it was dropped with the report).
    #[test]
    fn a_failed_runs_history_is_checked_and_written() {
        let dir = std::env::temp_dir().join(format!("loch-failed-run-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("h.jsonl");
        let cli = sherman_on_sim(&[
            "--records",
            "10",
            "--ops",
            "5",
            "--history",
            path.to_str().unwrap(),
        ]);
        let spec = cli.specs().unwrap().remove(0);
        let across = Arc::new(client::Across::new(&spec));
        let sh = client::ClientTally::new(&spec, across, 1, 0);
        let records = index::keys::records_sorted(10);
        let (key, value) = records[3];
        {
            let mut log = sh.history.as_ref().expect("recording").borrow_mut();
            let got = log.invoke(1, Op::Get(key), 10, true);
            log.history.complete(got, Ret::Get(Some(value)), 20);
            // Never completed: it is the one that failed.
            let _ = log.invoke(1, Op::Put(key, 1 << 40), 30, true);
        }
        *sh.failure.borrow_mut() = Some(format!("put of key {key}: memory node 0 is dead"));
        let Err(failed) = drive::finish(&sh, 1, 40, 0.0, 0) else {
            panic!("a failed operation fails the run")
        };
        assert!(
            failed.why.contains("memory node 0 is dead"),
            "{}",
            failed.why
        );
        let initial: BTreeMap<u64, u64> = records.iter().copied().collect();
        let said = failed_history(&cli, &spec, 1, &failed, &Some(initial), &records);
        assert!(said.contains("check ok"), "{said}");
        assert!(said.contains(path.to_str().unwrap()), "{said}");
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["failure"], json!(failed.why));
        assert_eq!(lines.len(), 1 + records.len() + 2, "{text}");
        let put = &lines[lines.len() - 1];
        assert_eq!(put["op"], "put");
        assert_eq!(put["ret"], "unknown", "{text}");
        assert!(put["complete_ns"].is_null(), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
