//! `loch demo --processes`: the whole cluster on this host as one `loch
//! node` process per node, over the authenticated control channel.
//!
//! Writes a temporary cluster file and secret (a 0700 directory, 0600
//! files) for 2 memory nodes and 2 compute nodes on 127.0.0.1 with free
//! ports and starts the memory nodes once. Then for each workload (as
//! `loch demo`: the verb mix, then the B+tree, then the hash table;
//! `--workload` picks one) it starts the compute nodes (`loch node
//! --workload W`) against the same memory nodes, which serve one run after
//! another, waits for them (bounded), and for the verb mix reads each
//! memory node's shared FAA counter by attaching to it. At the end it stops
//! the memory nodes with SIGTERM and prints a summary with checks. Every
//! path out kills what it started and removes its files.

use crate::index_work::{check_tree, index_args, tree_title, IndexLoad, Sizes, DEFAULT_TREE};
use crate::node::{emu_node_path, Workload, TASKS_PER_CORE_MAX};
use crate::node_work::FAA_OFFSET;
use bootstrap::ClusterConfig;
use cluster::processes::{free_ports, PrivateDir, Processes};
use cluster::stats::latency_histogram;
use cluster::EmuCluster;
use hdrhistogram::Histogram;
use mempool::NULL_WORD_OFF;
use nicdrv::clock::unix_ns;
use nicdrv::emu::{EmuConfig, EmuEndpoint};
use nicdrv::{ExecutorConfig, GlobalAddr};
use serde_json::Value;
use std::cell::Cell;
use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Options of `loch demo --processes`.
#[derive(Clone, Debug)]
pub struct ProcessesConfig {
    pub memory_nodes: usize,
    pub compute_nodes: usize,
    pub cores_per_compute: usize,
    pub tasks_per_core: usize,
    pub seconds: f64,
    pub pin: bool,
    /// One cluster per workload, in order.
    pub workloads: Vec<Workload>,
    /// Records loaded into each index.
    pub records: u64,
    /// Their key and value sizes.
    pub sizes: Sizes,
    /// The tree workload's tree, by name.
    pub tree: String,
}

impl Default for ProcessesConfig {
    fn default() -> Self {
        ProcessesConfig {
            memory_nodes: 2,
            compute_nodes: 2,
            cores_per_compute: 1,
            tasks_per_core: 8,
            seconds: 3.0,
            pin: true,
            workloads: vec![Workload::Verbs, Workload::Tree, Workload::Hash],
            records: 100_000,
            sizes: Sizes::default(),
            tree: DEFAULT_TREE.into(),
        }
    }
}

/// The summary and whether its checks passed.
pub struct ProcessesReport {
    pub text: String,
    pub ok: bool,
}

/// Processes and files to clean up on every path out: the node processes
/// are killed and reaped first, then the memory nodes' files and the
/// directory are removed.
struct Launch {
    nodes: Processes,
    node_files: Vec<PathBuf>,
    /// Held for its drop, which removes the directory last.
    _dir: PrivateDir,
}

impl Drop for Launch {
    fn drop(&mut self) {
        self.nodes = Processes::new();
        for f in &self.node_files {
            let _ = std::fs::remove_file(f);
        }
    }
}

impl ProcessesConfig {
    /// The settings a run refuses as bad input, checked before any of
    /// them is used (the memory nodes' size multiplies them).
    pub fn check(&self) -> Result<(), String> {
        if self.memory_nodes == 0
            || self.memory_nodes > 64
            || self.compute_nodes == 0
            || self.compute_nodes > 64
        {
            return Err("1..=64 memory nodes and 1..=64 compute nodes".into());
        }
        if !(self.seconds > 0.0 && self.seconds <= 600.0) {
            return Err(format!("seconds must be in (0, 600], got {}", self.seconds));
        }
        if self.workloads.is_empty() {
            return Err("no workload to run".into());
        }
        if self.records == 0 || self.records > crate::node::RECORDS_MAX {
            return Err(format!(
                "--tree-records must be 1..={}",
                crate::node::RECORDS_MAX
            ));
        }
        if self.tasks_per_core == 0 || self.tasks_per_core > TASKS_PER_CORE_MAX {
            return Err(format!("--tasks must be 1..={TASKS_PER_CORE_MAX}"));
        }
        check_tree(&self.tree)?;
        let cpus = host_cpus().len();
        if self.cores_per_compute == 0 || self.cores_per_compute > cpus {
            return Err(format!(
                "--cores must be 1..={cpus} (this host's CPUs; each compute node pins them), got {}",
                self.cores_per_compute
            ));
        }
        Ok(())
    }
}

/// The CPUs of this host the compute nodes pin their cores to.
fn host_cpus() -> Vec<usize> {
    let cpus: Vec<usize> = core_affinity::get_core_ids()
        .map(|v| v.into_iter().map(|c| c.id).collect())
        .unwrap_or_default();
    if cpus.is_empty() {
        vec![0]
    } else {
        cpus
    }
}

/// Memory of each memory node: 64 MiB, or more when the index workloads
/// need it: the verb areas of every task slot `loch node` reserves, and
/// the index below them ([`IndexLoad::needed`]).
pub fn memory_bytes(cfg: &ProcessesConfig) -> u64 {
    let cores = (cfg.compute_nodes * cfg.cores_per_compute) as u64;
    let areas = crate::node_work::host_bytes_needed(cores * TASKS_PER_CORE_MAX as u64);
    let tasks = cores * cfg.tasks_per_core as u64;
    let index = IndexLoad {
        sizes: cfg.sizes,
        records: cfg.records,
        tasks,
        memory_nodes: cfg.memory_nodes as u64,
        chunk_bytes: crate::node_index::CHUNK_BYTES,
    };
    (areas + index.needed())
        .next_multiple_of(1 << 20)
        .max(64 << 20)
}

fn secret_bytes() -> Result<[u8; 32], String> {
    let mut b = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| format!("cannot read /dev/urandom: {e}"))?;
    Ok(b)
}

/// Writes the cluster file (and its secret) into a fresh private directory;
/// returns the directory and the cluster file's path. `cfg` passed its
/// [`ProcessesConfig::check`].
fn write_cluster(cfg: &ProcessesConfig) -> Result<(PrivateDir, PathBuf), String> {
    let dir = PrivateDir::new("demo")?;
    dir.write("secret", &secret_bytes()?)?;
    let cpus = host_cpus();
    let ports = free_ports(cfg.memory_nodes + cfg.compute_nodes)?;
    let mut toml = String::from(
        "# written by `loch demo --processes`\nsecret_file = \"secret\"\nlock_table_words = 32768\nhuge_pages = false\n\n[backend]\nkind = \"emu\"\n",
    );
    for (id, port) in ports.iter().enumerate() {
        let memory = id < cfg.memory_nodes;
        let _ = write!(
            toml,
            "\n[[nodes]]\nid = {id}\naddress = \"127.0.0.1:{port}\"\n"
        );
        if memory {
            let _ = write!(
                toml,
                "roles = [\"memory\"]\nmemory = \"{}MiB\"\n",
                memory_bytes(cfg) >> 20
            );
        } else {
            // Spread compute cores over the CPUs, distinct within a node.
            let k = id - cfg.memory_nodes;
            let cores: Vec<String> = (0..cfg.cores_per_compute)
                .map(|j| cpus[(k * cfg.cores_per_compute + j) % cpus.len()].to_string())
                .collect();
            let _ = write!(
                toml,
                "roles = [\"compute\"]\ncores = [{}]\n",
                cores.join(", ")
            );
        }
    }
    let file = dir.write("cluster.toml", toml.as_bytes())?;
    Ok((dir, file))
}

/// Reads the shared FAA counter of every memory node (attached by path),
/// and its word at offset 0 (node 0's null address): (counter, offset 0)
/// per node.
fn read_faa_counters(eps: Vec<EmuEndpoint>) -> Result<Vec<(u64, u64)>, String> {
    let ids: Vec<u16> = eps.iter().map(|e| e.node()).collect();
    let cluster = EmuCluster::attach(eps, EmuConfig::default());
    let mut ex = cluster
        .executor(ExecutorConfig {
            slots: 1,
            scratch_bytes_per_slot: 4096,
            poll_batch: 8,
        })
        .map_err(|e| e.to_string())?;
    type Words = Vec<Cell<Option<(u64, u64)>>>;
    let out: Rc<Words> = Rc::new(ids.iter().map(|_| Cell::new(None)).collect());
    let o = out.clone();
    ex.spawn(move |ctx| async move {
        for (i, &n) in ids.iter().enumerate() {
            let counter = ctx.read(GlobalAddr::host(n, FAA_OFFSET), 8).await;
            let null = ctx.read(GlobalAddr::host(n, NULL_WORD_OFF), 8).await;
            if let (Ok(c), Ok(z)) = (counter, null) {
                o[i].set(Some((c.u64_at(0), z.u64_at(0))));
            }
        }
    })
    .map_err(|e| e.to_string())?;
    ex.run();
    out.iter()
        .enumerate()
        .map(|(i, c)| {
            c.get()
                .ok_or(format!("cannot read memory node {i}'s counter"))
        })
        .collect()
}

fn field(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

fn ratio(num: u64, den: u64) -> f64 {
    if den == 0 {
        0.0
    } else {
        num as f64 / den as f64
    }
}

/// Runs the multi-process demo, progress on stderr; the summary is returned.
pub fn run(cfg: &ProcessesConfig) -> Result<ProcessesReport, String> {
    cfg.check()?;
    // Ctrl-C reaches the whole process group, and a signal to this process
    // alone is passed on: the nodes stop cleanly, and this process survives
    // it to reap them, print what ran and remove its files.
    cmdline::signals::install();
    let t0 = Instant::now();
    let mut text = String::new();
    let _ = writeln!(
        text,
        "loch demo summary (emu backend, {} processes: {} memory nodes serving a run of {} compute nodes × {} cores × {} tasks per workload)",
        cfg.memory_nodes + cfg.compute_nodes,
        cfg.memory_nodes,
        cfg.compute_nodes,
        cfg.cores_per_compute,
        cfg.tasks_per_core
    );
    let (dir, file) = write_cluster(cfg)?;
    let cluster = ClusterConfig::load(&file).map_err(|e| e.to_string())?;
    let mut launch = Launch {
        nodes: Processes::new(),
        node_files: cluster
            .nodes
            .iter()
            .filter(|n| n.roles.memory)
            .map(|n| emu_node_path(&cluster, n.id))
            .collect(),
        _dir: dir,
    };
    start_nodes(cfg, None, &cluster, &file, &mut launch)?;
    let mut ok = true;
    for &w in &cfg.workloads {
        if cmdline::signals::stop_requested() {
            // SIGINT/SIGTERM: the summary covers the runs that ran.
            break;
        }
        let (section, pass) = run_workload(cfg, w, &cluster, &file, &mut launch)?;
        text.push_str(&section);
        ok &= pass;
    }
    let memory_clean = stop_memory_nodes(&cluster, &mut launch.nodes);
    let files_removed = launch.node_files.iter().all(|f| !Path::new(f).exists());
    let pass = memory_clean && files_removed;
    ok &= pass;
    let _ = writeln!(
        text,
        "  check: memory nodes served every run, stopped on SIGTERM and removed their files: {}",
        if pass { "ok" } else { "FAILED" }
    );
    let _ = writeln!(
        text,
        "  wall time           {:.2} s",
        t0.elapsed().as_secs_f64()
    );
    Ok(ProcessesReport { text, ok })
}

/// One compute run of workload `w` against the running memory nodes: its
/// summary section and whether its checks passed.
fn run_workload(
    cfg: &ProcessesConfig,
    w: Workload,
    cluster: &ClusterConfig,
    file: &Path,
    launch: &mut Launch,
) -> Result<(String, bool), String> {
    let start_unix_ns = unix_ns();
    start_nodes(cfg, Some(w), cluster, file, launch)?;
    // Compute nodes: each ends after --seconds; allow the rendezvous, the
    // index load and teardown on top, then give up (Launch's Drop kills
    // everything).
    let by = Instant::now() + Duration::from_secs_f64(cfg.seconds) + Duration::from_secs(90);
    let (results, exit_ok) = compute_results(cluster, &mut launch.nodes, by)?;
    let counters = if w == Workload::Verbs {
        let eps: Result<Vec<EmuEndpoint>, String> = launch
            .node_files
            .iter()
            .map(|p| EmuEndpoint::attach(p).map_err(|e| e.to_string()))
            .collect();
        read_faa_counters(eps?)?
    } else {
        Vec::new()
    };
    let t = Totals::of(&results, cfg.memory_nodes, start_unix_ns);
    let mut text = section_stats(cfg, w, &t);
    let mut ok = true;
    let ind = if w == Workload::Verbs { "  " } else { "    " };
    let mut check = |what: String, pass: bool| {
        ok &= pass;
        let _ = writeln!(
            text,
            "{ind}check: {what}: {}",
            if pass { "ok" } else { "FAILED" }
        );
    };
    for (k, (&(c, null), &f)) in counters.iter().zip(&t.faa).enumerate() {
        check(
            format!("memory node {k} FAA counter {c} = FAAs issued {f}"),
            c == f,
        );
        // Nothing is kept at offset 0 (node 0's null address): a verb that
        // landed there wrote through an address it should not have.
        check(
            format!("memory node {k} word at offset 0 is {null}"),
            null == 0,
        );
    }
    let mism = t.mismatches;
    if w == Workload::Verbs {
        check(
            format!("reads of own words matching last write: {mism} mismatches"),
            mism == 0,
        );
    } else {
        check(
            format!("lookups and deletes agree with the loaded data and each task's shadow: {mism} mismatches"),
            mism == 0,
        );
    }
    check(
        format!("failed operations: {}", t.failures),
        t.failures == 0,
    );
    check(
        format!(
            "every compute node ran and exited 0 ({} results)",
            results.len()
        ),
        exit_ok && results.len() == cfg.compute_nodes && t.ops > 0,
    );
    Ok((text, ok))
}

/// Starts one `loch node` process per node of `cluster` into `launch`:
/// the memory nodes (`w` is `None`), or the compute nodes of a run of
/// workload `w` (with its flags, their stdout piped).
fn start_nodes(
    cfg: &ProcessesConfig,
    w: Option<Workload>,
    cluster: &ClusterConfig,
    file: &Path,
    launch: &mut Launch,
) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the loch binary: {e}"))?;
    match w {
        None => cmdline::errln!(
            "loch demo: starting {} memory node processes, cluster file {}",
            cfg.memory_nodes,
            file.display()
        ),
        Some(w) => cmdline::errln!(
            "loch demo: {} workload: starting {} compute node processes ({} cores × {} tasks each)",
            w.name(),
            cfg.compute_nodes,
            cfg.cores_per_compute,
            cfg.tasks_per_core,
        ),
    }
    for n in cluster
        .nodes
        .iter()
        .filter(|n| n.roles.compute == w.is_some())
    {
        let mut cmd = Command::new(&exe);
        cmd.arg("node")
            .arg("--config")
            .arg(file)
            .args(["--id", &n.id.to_string()]);
        if let Some(w) = w {
            cmd.args(["--seconds", &cfg.seconds.to_string()])
                .args(["--tasks", &cfg.tasks_per_core.to_string()])
                .args(["--workload", w.name()])
                .args(["--records", &cfg.records.to_string()])
                // The index's flags (`loch node` refuses them with a
                // workload that has no index).
                .args(
                    w.index()
                        .map(|k| index_args(k, cfg.sizes, &cfg.tree))
                        .unwrap_or_default(),
                )
                .arg("--histogram")
                .arg(file.with_file_name(format!("latency-{}.json", n.id)))
                .stdout(Stdio::piped());
            if !cfg.pin {
                cmd.arg("--no-pin");
            }
        } else {
            cmd.stdout(Stdio::null());
        }
        launch.nodes.spawn(n.id, &mut cmd)?;
    }
    Ok(())
}

/// Waits (until `by`) for every compute node and takes its result line;
/// the results, and whether every compute node exited 0.
fn compute_results(
    cluster: &ClusterConfig,
    nodes: &mut Processes,
    by: Instant,
) -> Result<(Vec<Value>, bool), String> {
    let mut results = Vec::new();
    let mut exit_ok = true;
    let compute: Vec<u32> = cluster
        .nodes
        .iter()
        .filter(|n| n.roles.compute)
        .map(|n| n.id)
        .collect();
    let mut forwarded = false;
    for &id in &compute {
        // A stop request reaches every compute node (a signal sent to this
        // process alone would leave them running); the memory nodes stay
        // up until their counters are read.
        let status = nodes
            .wait_watching(id, by, |ps| {
                if !forwarded && cmdline::signals::stop_requested() {
                    for &c in &compute {
                        ps.signal(c, libc::SIGINT);
                    }
                    forwarded = true;
                }
            })
            .ok_or_else(|| format!("compute node {id} did not finish in time"))?;
        let (out, _) = nodes.output(id);
        exit_ok &= status.success();
        let json = out
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str::<Value>(l).ok())
            .ok_or_else(|| format!("compute node {id} ({status}) printed no result line"))?;
        // The raw histogram, from the file the result line names, for an
        // exact merge of the nodes' latencies.
        let mut json = json;
        if let Some(path) = json["histogram_file"].as_str() {
            let raw = std::fs::read_to_string(path)
                .map_err(|e| format!("compute node {id}'s histogram {path}: {e}"))?;
            json["latency_hist"] = serde_json::from_str(&raw)
                .map_err(|e| format!("compute node {id}'s histogram {path}: {e}"))?;
        }
        results.push(json);
    }
    Ok((results, exit_ok))
}

/// Stops the memory nodes: SIGTERM, then a bounded wait; whether each
/// exited 0.
fn stop_memory_nodes(cluster: &ClusterConfig, nodes: &mut Processes) -> bool {
    let stop_by = Instant::now() + Duration::from_secs(5);
    // Every memory node is stopped, whatever the others did.
    let mut clean = true;
    for n in cluster.nodes.iter().filter(|n| !n.roles.compute) {
        clean &= nodes.terminate(n.id, stop_by).is_some_and(|s| s.success());
    }
    clean
}

/// The compute nodes' result lines, summed (maxima for times).
struct Totals {
    hist: Histogram<u64>,
    ops: u64,
    round_trips: u64,
    mismatches: u64,
    failures: u64,
    elapsed_ns: u64,
    bytes_read: u64,
    bytes_written: u64,
    hits: u64,
    misses: u64,
    splits: u64,
    handovers: u64,
    retries: u64,
    load_ns: u64,
    /// FAAs issued per memory node.
    faa: Vec<u64>,
    /// From the start of the launch to the first operation of any node
    /// (NaN when none ran).
    first_op_ms: f64,
    join_max_ns: u64,
    exchange_max_ns: u64,
}

impl Totals {
    fn of(results: &[Value], memory_nodes: usize, start_unix_ns: u64) -> Totals {
        let mut t = Totals {
            hist: latency_histogram(),
            ops: 0,
            round_trips: 0,
            mismatches: 0,
            failures: 0,
            elapsed_ns: 0,
            bytes_read: 0,
            bytes_written: 0,
            hits: 0,
            misses: 0,
            splits: 0,
            handovers: 0,
            retries: 0,
            load_ns: 0,
            faa: vec![0; memory_nodes],
            first_op_ms: f64::NAN,
            join_max_ns: 0,
            exchange_max_ns: 0,
        };
        let mut first_op = u64::MAX;
        for r in results {
            t.ops += field(r, "ops");
            t.round_trips += field(r, "round_trips");
            t.bytes_read += field(r, "bytes_read");
            t.bytes_written += field(r, "bytes_written");
            t.hits += field(r, "cache_hits");
            t.misses += field(r, "cache_misses");
            t.splits += field(r, "splits");
            t.handovers += field(r, "handovers");
            t.retries += field(r, "read_retries");
            t.load_ns = t.load_ns.max(field(r, "index_load_ns"));
            t.mismatches += field(r, "mismatches");
            t.failures += field(r, "failures");
            t.elapsed_ns = t.elapsed_ns.max(field(r, "elapsed_ns"));
            t.join_max_ns = t.join_max_ns.max(field(r, "join_ns"));
            t.exchange_max_ns = t.exchange_max_ns.max(field(r, "exchange_ns"));
            let f = field(r, "first_op_unix_ns");
            if f != 0 {
                first_op = first_op.min(f);
            }
            for n in r["per_node"].as_array().into_iter().flatten() {
                let k = field(n, "node") as usize;
                if k < t.faa.len() {
                    t.faa[k] += field(n, "faa");
                }
            }
            for pair in r["latency_hist"].as_array().into_iter().flatten() {
                if let (Some(v), Some(c)) = (pair[0].as_u64(), pair[1].as_u64()) {
                    let _ = t.hist.record_n(v.max(1), c);
                }
            }
        }
        if first_op != u64::MAX {
            t.first_op_ms = first_op.saturating_sub(start_unix_ns) as f64 / 1e6;
        }
        t
    }
}

/// The section's figures: verbs at the top level as in `loch demo`, each
/// index as an indented block under its name.
fn section_stats(cfg: &ProcessesConfig, w: Workload, t: &Totals) -> String {
    let mut text = String::new();
    let per_op = |v: u64| ratio(v, t.ops);
    let ops_s = if t.elapsed_ns == 0 {
        0.0
    } else {
        t.ops as f64 * 1e9 / t.elapsed_ns as f64
    };
    let ind = if w == Workload::Verbs {
        "  "
    } else {
        let _ = writeln!(
            text,
            "  {} ({} records loaded ({}-byte keys, {}-byte values) by one compute node in {:.1} ms, then 40% lookup / 25% put / 10% delete / 15% own lookup / 10% scan{})",
            if w == Workload::Tree {
                tree_title(&cfg.tree)
            } else {
                "hash table (Nessie, puts)".into()
            },
            cfg.records,
            cfg.sizes.key_bytes(),
            cfg.sizes.value_bytes(),
            t.load_ns as f64 / 1e6,
            if w == Workload::Hash {
                "; no scans in a hash table: skipped"
            } else {
                ""
            }
        );
        "    "
    };
    let mut line = |name: &str, v: String| {
        let _ = writeln!(text, "{ind}{name:<20}{v}");
    };
    line("operations", t.ops.to_string());
    line("operations/s", format!("{ops_s:.0}"));
    line("round trips/op", format!("{:.3}", per_op(t.round_trips)));
    if w != Workload::Verbs {
        line("bytes read/op", format!("{:.1}", per_op(t.bytes_read)));
        line(
            "bytes written/op",
            format!("{:.1}", per_op(t.bytes_written)),
        );
    }
    line(
        "latency p50",
        format!("{} ns", t.hist.value_at_quantile(0.5)),
    );
    line(
        "latency p99",
        format!("{} ns", t.hist.value_at_quantile(0.99)),
    );
    if w != Workload::Verbs {
        line(
            "cache hit ratio",
            if w == Workload::Tree {
                format!("{:.4}", ratio(t.hits, t.hits + t.misses))
            } else {
                "n/a (the hash table has no index cache)".into()
            },
        );
        line("lock handovers/op", format!("{:.4}", per_op(t.handovers)));
        line("read retries/op", format!("{:.5}", per_op(t.retries)));
        line("splits", t.splits.to_string());
    }
    line("time to first op", format!("{:.1} ms", t.first_op_ms));
    line(
        "control channel",
        format!(
            "join ≤ {:.1} ms, exchange + barrier ≤ {:.1} ms",
            t.join_max_ns as f64 / 1e6,
            t.exchange_max_ns as f64 / 1e6
        ),
    );
    text
}
