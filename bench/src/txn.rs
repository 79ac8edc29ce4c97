//! `loch-bench txn`: FaRM transactions (txn) on a cluster of machines,
//! each core a coordinator thread and a server thread: committed
//! transactions per second, begin-to-commit latency, aborts by reason,
//! and per committed transaction the one-sided WRITEs and READs, ring
//! messages and log bytes, from the task counters.

use crate::args::{ArgError, Backend};
use crate::outfile::check_file_target;
use cluster::stats::latency_histogram;
use nicdrv::sim::SimModel;
use serde_json::json;
use std::path::PathBuf;
use txn::harness::{run_sim_with, run_threads, Report, RunOptions};
use txn::lease::LeaseConfig;
use txn::workload::{merged_history, Mix, WorkClient, WorkOut};
use txn::{Abort, Geometry};

mod fault;

#[derive(clap::ValueEnum, Copy, Clone, Debug, PartialEq, Eq)]
pub enum TxnWorkload {
    /// TATP's seven transactions in their standard mix
    Tatp,
    /// SmallBank's six transactions
    Smallbank,
    /// A YCSB-style mix: --ops keys a transaction, --writes of them
    /// read-modify-written
    #[value(name = "ycsb-t")]
    YcsbT,
    /// 1–4 reads or appends of unique values over --keys lists (the
    /// workload --history records)
    Append,
    /// Transfers and audits over --keys accounts; the total is checked
    Bank,
}

/// `loch-bench txn`: transactions on sim or emu.
#[derive(clap::Args, Debug)]
#[command(after_help = TXN_AFTER_HELP)]
pub struct TxnArgs {
    /// sim: a simulated cluster, virtual time; emu: machines on this host,
    /// one OS thread per core, wall clock; mlx5: as emu, through this
    /// host's RDMA device in loopback (a --features mlx5 build)
    #[arg(long, value_enum, ignore_case = true, default_value_t = Backend::Sim)]
    backend: Backend,
    #[command(flatten)]
    device: crate::args::DeviceArgs,
    #[arg(long, value_enum, default_value_t = TxnWorkload::Tatp)]
    workload: TxnWorkload,
    /// Machines (default sim 16, emu and mlx5 3)
    #[arg(long)]
    machines: Option<u16>,
    /// Cores per machine, each a coordinator and a server thread
    #[arg(long, default_value_t = 1)]
    threads: u16,
    /// Replicas of every region (f + 1; FaRM's 3-way is 3)
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Transactions each coordinator runs (default sim 400, emu and mlx5 4000)
    #[arg(long)]
    txs: Option<u64>,
    /// Subscribers (tatp), customers (smallbank), keys (ycsb-t, append) or
    /// accounts (bank); default tatp 20000, smallbank 10000, ycsb-t 100000,
    /// append 8, bank 16
    #[arg(long)]
    keys: Option<u64>,
    /// ycsb-t: keys a transaction touches
    #[arg(long, default_value_t = YCSB_T_OPS)]
    ops: u32,
    /// ycsb-t: of those, how many it read-modify-writes
    #[arg(long, default_value_t = YCSB_T_WRITES)]
    writes: u32,
    /// Bytes of each log ring (coordinator to machine)
    #[arg(long, value_parser = crate::args::size_value, default_value_t = LOG_BYTES)]
    log_bytes: usize,
    /// The simulation's seed (and the workload's)
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the run's history (Elle list-append JSON lines) to FILE
    /// (--workload append)
    #[arg(long, value_name = "FILE")]
    history: Option<PathBuf>,
    /// Failure detection by leases of MS milliseconds (renewed every
    /// fifth), on a core of their own on every machine: the run reports
    /// grants, suspicions and the longest gap between two renewals the CM
    /// saw (FaRM: 10 ms leases, no false suspicion under load)
    #[arg(long, value_name = "MS")]
    lease_ms: Option<f64>,
    /// A simulator fault (repeatable), `KIND@TIME[:TARGET]`, TIME from the
    /// start: machine-crash@TIME:MACHINE, partition@TIME:M+M+...[/DURATION]
    /// (those machines cut off from the rest),
    /// link-cut@TIME:FROM-TO[/DURATION], link-heal@TIME:FROM-TO,
    /// queue-full@TIME:FROM-TO/DURATION
    /// (machine FROM's posts to TO refused), latency-spike@TIME:EXTRA/DURATION,
    /// thread-stall@TIME:THREAD/DURATION (memory-crash and compute-crash
    /// take the whole machine out); times take ns, us, ms or s. The
    /// workload runs with FaRM's whole failure handling (leases,
    /// reconfiguration, transaction-state recovery, re-replication) over
    /// --seeds seeds, reporting throughput in 1 ms buckets around the
    /// first fault and the time from it to the first suspicion, to the new
    /// configuration stored and committed, to every region active, to 80%
    /// of the throughput before, and to every new backup copied (the
    /// first fault at 10 ms + --lease-ms or later: 20 ms at the default
    /// lease; any time with --detection-only). The machines crashed must leave a
    /// majority of them for the workload to resume; fewer than --replicas
    /// left run on with fewer replicas of each region (nothing to copy).
    /// A thread-stall's THREAD: core t of machine m is thread m ×
    /// --threads + t, then each machine's lease core, then its recovery
    /// core (--detection-only: the lease cores, then the reconfiguration
    /// cores)
    #[arg(long, value_name = "SPEC")]
    fault: Vec<String>,
    /// With --fault: runs (seeds from --seed on) [default: 40]
    #[arg(long)]
    seeds: Option<u64>,
    /// With --fault: failure detection and reconfiguration alone, no
    /// workload (many seeds quickly)
    #[arg(long)]
    detection_only: bool,
    /// With --fault: the first run's throughput timeline as an SVG chart
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// One JSON document on stdout
    #[arg(long)]
    json: bool,
}

const TXN_AFTER_HELP: &str = "\
Columns: committed transactions per second (all machines, and per machine), begin-to-commit
latency p50/p99 in microseconds (committed ones), abort rate (aborted / attempted), then per
committed transaction: one-sided WRITEs, READs, ring messages (records and replies) and log
bytes, summed over every core's task counters. A committed read-write transaction costs
Pw(f+3) WRITEs and one READ per object validated (FaRM §4).
Exit codes: 0 done; 1 the benchmark failed (a task's error, a bank total changed); 2 bad
input (one line naming it; nothing run); 130 stopped by SIGINT or SIGTERM (what ran is
reported; with --fault, the seeds whose runs ended).";

/// `--ops`, `--writes` and `--log-bytes` unless given.
const YCSB_T_OPS: u32 = 4;
const YCSB_T_WRITES: u32 = 2;
const LOG_BYTES: usize = 64 << 10;

/// The flags among `flags` (name, and whether it was set to other than
/// its default) that a run would ignore, refused as `why`: what a run
/// does not do is not silently skipped.
fn refuse_ignored(flags: &[(&str, bool)], why: &str) -> Result<(), ArgError> {
    match flags.iter().find(|(_, set)| *set) {
        Some((flag, _)) => Err(ArgError(format!("{flag} does not apply {why}"))),
        None => Ok(()),
    }
}

fn mix(a: &TxnArgs) -> Result<Mix, ArgError> {
    if a.workload != TxnWorkload::YcsbT {
        refuse_ignored(
            &[
                ("--ops", a.ops != YCSB_T_OPS),
                ("--writes", a.writes != YCSB_T_WRITES),
            ],
            "but to --workload ycsb-t",
        )?;
    }
    let keys = |d: u64| a.keys.unwrap_or(d);
    let m = match a.workload {
        TxnWorkload::Tatp => Mix::Tatp {
            subscribers: keys(20_000),
        },
        TxnWorkload::Smallbank => Mix::SmallBank {
            accounts: keys(10_000),
        },
        TxnWorkload::YcsbT => Mix::YcsbT {
            keys: keys(100_000),
            ops: a.ops,
            writes: a.writes,
        },
        TxnWorkload::Append => Mix::Append { keys: keys(8) },
        TxnWorkload::Bank => Mix::Bank { accounts: keys(16) },
    };
    let n = keys(2);
    if n < 2 {
        return Err(ArgError(format!("--keys {n}: at least 2")));
    }
    // Far past the 8 GiB a machine may hold (refused below with its
    // size), and low enough that the regions' sizes cannot wrap (they once
    // did, and the run failed on an object past its region's end).
    if n > 1 << 32 {
        return Err(ArgError(format!("--keys {n}: at most {}", 1u64 << 32)));
    }
    if let Mix::YcsbT { keys, ops, writes } = m {
        if ops == 0 || ops as u64 > keys || writes > ops {
            return Err(ArgError(format!(
                "--ops {ops} and --writes {writes} need 1 ≤ ops ≤ keys ({keys}) and writes ≤ ops"
            )));
        }
    }
    Ok(m)
}

pub fn run(a: TxnArgs) -> Result<crate::run::Outcome, ArgError> {
    a.device.check(a.backend)?;
    if !a.fault.is_empty() {
        return run_faults(&a);
    }
    for (given, flag) in [
        (a.seeds.is_some(), "--seeds"),
        (a.detection_only, "--detection-only"),
        (a.plot.is_some(), "--plot"),
    ] {
        if given {
            return Err(ArgError(format!("{flag} applies with --fault only")));
        }
    }
    let sim = a.backend == Backend::Sim;
    let machines = a.machines.unwrap_or(if sim { 16 } else { 3 });
    if sim {
        check_sim_machines(machines, a.threads)?;
    }
    let m = mix(&a)?;
    if a.replicas < 2 || a.replicas > machines as usize {
        return Err(ArgError(format!(
            "--replicas {} must be 2 ..= machines ({machines})",
            a.replicas
        )));
    }
    if a.history.is_some() && a.workload != TxnWorkload::Append {
        return Err(ArgError(
            "--history records list appends: use it with --workload append".into(),
        ));
    }
    if let Some(p) = &a.history {
        check_file_target("--history", p).map_err(ArgError)?;
    }
    let txs = a.txs.unwrap_or(if sim { 400 } else { 4000 });
    // A coordinator numbers its appended values in 32 bits (beside its
    // process number), at most four a transaction: past 2^30 transactions
    // two values would be the same, which a list-append history forbids.
    if a.workload == TxnWorkload::Append && txs > txn::workload::APPEND_TXS_MAX {
        return Err(ArgError(format!(
            "--txs {txs}: at most {} with --workload append (its values are numbered in 32 bits)",
            txn::workload::APPEND_TXS_MAX
        )));
    }
    let leases = a.lease_ms.map(lease_of).transpose()?;
    let opts = RunOptions {
        leases,
        ..Default::default()
    };
    let regions_per_machine = 1;
    let geo = Geometry {
        machines,
        threads: a.threads,
        f: a.replicas - 1,
        regions_per_machine,
        spare_regions_per_machine: 0,
        region_bytes: m.region_bytes(regions_per_machine * machines as u32),
        static_bytes: m.region_bytes(regions_per_machine * machines as u32),
        block_bytes: txn::alloc::BLOCK_BYTES,
        log_bytes: a.log_bytes as u64,
        reply_bytes: 4096,
    };
    geo.check().map_err(|e| ArgError(e.to_string()))?;
    if geo.host_bytes().is_none_or(|b| b > 8 << 30) {
        return Err(ArgError(format!(
            "{} machines × {} threads with {} keys need more than 8 GiB a machine",
            machines,
            a.threads,
            a.keys.unwrap_or(0)
        )));
    }
    // Each is an OS thread on emu and mlx5 (a spawn the OS refuses would
    // end the run without a clear error): the bound `run --threads` has.
    let pinned = machines as usize * a.threads as usize;
    if !sim && pinned > 1024 {
        return Err(ArgError(format!(
            "--machines {machines} × --threads {}: {pinned} threads, more than the 1024 \
             --backend {} runs (one OS thread each)",
            a.threads,
            a.backend.name()
        )));
    }
    if !sim {
        cmdline::warn_if_oversubscribed(
            "loch-bench txn",
            "cores (machines × threads)",
            machines as usize * a.threads as usize,
        );
    }
    let seed = a.seed;
    let clients = |mc: u16, t: u16| WorkClient {
        geo,
        mix: m,
        seed: seed.wrapping_mul(1_000_003) ^ ((mc as u64) << 16 | t as u64),
        txs,
        process: (mc as u64) * a.threads as u64 + t as u64,
        // SIGINT/SIGTERM: each coordinator ends its transaction in flight
        // and starts no more; what ran is reported (exit 130).
        stop: Some(cmdline::signals::stop_requested),
    };
    let (report, sim_info) = if sim {
        match run_sim_with(geo, seed, SimModel::default(), &opts, clients) {
            Ok((r, w)) => (r, Some((w.events(), w.now_ns()))),
            Err(e) => return Ok(crate::run::Outcome::Failed(e.to_string())),
        }
    } else {
        match run_on_threads(&a, geo, &opts, clients) {
            Ok(r) => (r, None),
            Err(e) => return Ok(crate::run::Outcome::Failed(e)),
        }
    };
    if let Some(e) = report.first_error() {
        return Ok(crate::run::Outcome::Failed(format!("a task failed: {e}")));
    }
    let mut out = WorkOut::default();
    for c in &report.clients {
        out.merge(c.out.as_ref().expect("no errors"));
    }
    if let Mix::Bank { accounts } = m {
        let total = accounts as i64 * txn::workload::BANK_START;
        if let Some(bad) = out.audits.iter().find(|&&t| t != total) {
            return Ok(crate::run::Outcome::Failed(format!(
                "an audit saw a total of {bad}, not {total}"
            )));
        }
    }
    if let Some(p) = &a.history {
        let outs = report.clients.iter().map(|c| {
            let o = c.out.as_ref().expect("no errors");
            ((c.machine as u64) * a.threads as u64 + c.thread as u64, o)
        });
        let h = merged_history(outs);
        if let Err(e) = std::fs::write(p, h.to_json_lines()) {
            return Ok(crate::run::Outcome::Failed(format!(
                "--history {}: {e}",
                p.display()
            )));
        }
    }
    print(&a, geo, &report, &out, sim_info, leases);
    Ok(crate::run::Outcome::finished())
}

/// The run with one OS thread per core: machines on this host (emu), or
/// on its RDMA device in loopback (mlx5).
fn run_on_threads(
    a: &TxnArgs,
    geo: Geometry,
    opts: &RunOptions,
    clients: impl FnMut(u16, u16) -> WorkClient,
) -> Result<Report<WorkOut>, String> {
    let host = geo.host_bytes().expect("checked");
    #[cfg(feature = "mlx5")]
    if a.backend == Backend::Mlx5 {
        let n = geo.machines as usize;
        let cluster = cluster::mlx5::Mlx5Cluster::boot(&a.device.config(), n, host, 4096, n)?;
        return run_threads(
            geo,
            opts,
            |m: u16, cfg| cluster.executor(Some(usize::from(m)), cfg),
            |_| Vec::new(),
            clients,
        )
        .map_err(|e| e.to_string());
    }
    let _ = a;
    let cluster =
        cluster::EmuCluster::machines(geo.machines as usize, host).map_err(|e| e.to_string())?;
    run_threads(
        geo,
        opts,
        cluster.machine_executors(),
        // The bench checks no memory afterwards.
        |_| Vec::new(),
        clients,
    )
    .map_err(|e| e.to_string())
}

/// `--lease-ms MS` as a lease.
fn lease_of(ms: f64) -> Result<LeaseConfig, ArgError> {
    LeaseConfig::from_ms(ms).map_err(|e| ArgError(format!("--lease-ms {ms}: {e}")))
}

fn print(
    a: &TxnArgs,
    geo: Geometry,
    r: &Report<WorkOut>,
    out: &WorkOut,
    sim: Option<(u64, u64)>,
    timing: Option<LeaseConfig>,
) {
    let elapsed_ns = r
        .clients
        .iter()
        .map(|c| c.elapsed_ns)
        .max()
        .unwrap_or(0)
        .max(1);
    let rate = out.committed as f64 * 1e9 / elapsed_ns as f64;
    let per_machine = rate / geo.machines as f64;
    let mut h = latency_histogram();
    for &l in &out.latencies_ns {
        let _ = h.record(l.max(1));
    }
    let q = |p: f64| h.value_at_quantile(p) as f64 / 1e3;
    let aborted: u64 = out.aborted.iter().sum();
    let attempted = out.committed + aborted;
    let abort_rate = aborted as f64 / attempted.max(1) as f64;
    let c = r.counters();
    let cs = r.coord_stats();
    let ss = r.server_stats().unwrap_or_default();
    let messages = cs.record_writes() + ss.replies;
    let per = |x: u64| x as f64 / out.committed.max(1) as f64;
    let backend = a.backend.name();
    let workload = txn::workload::Mix::name(&mix(a).expect("checked"));
    let leases = timing.map(|l| (l, r.lease_stats().unwrap_or_default()));
    if a.json {
        let aborts: serde_json::Map<String, serde_json::Value> = Abort::ALL
            .iter()
            .map(|x| (x.name().to_string(), json!(out.aborted[x.index()])))
            .collect();
        let by_type: serde_json::Map<String, serde_json::Value> = out
            .by_type
            .iter()
            .map(|(k, v)| (k.to_string(), json!({"committed": v.0, "aborted": v.1})))
            .collect();
        let doc = json!([{
            "schema_version": 1,
            "bench": "txn",
            "backend": backend,
            "workload": workload,
            "machines": geo.machines,
            "threads_per_machine": geo.threads,
            "replicas": geo.f + 1,
            "seed": a.seed,
            "attempted": attempted,
            "committed": out.committed,
            "given_up": out.given_up,
            "elapsed_ns": elapsed_ns,
            "committed_per_sec": rate,
            "committed_per_sec_per_machine": per_machine,
            "latency_us": {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": h.max() as f64 / 1e3},
            "abort_rate": abort_rate,
            "aborts": aborts,
            "by_type": by_type,
            "per_committed": {
                "writes": per(c.writes), "reads": per(c.reads),
                "messages": per(messages), "log_bytes": per(cs.log_bytes),
            },
            "head_reports": ss.head_reports,
            "truncate_records": cs.truncate_records,
            "sim": sim.map(|(events, virtual_ns)| json!({"events": events, "virtual_ns": virtual_ns})),
            "leases": leases.map(|(l, st)| json!({
                "lease_ns": l.lease_ns, "renew_ns": l.renew_ns,
                "grants": st.grants, "suspicions": st.suspicions,
                "suspected": r.suspicions.iter().map(|s| json!({"by": s.by, "machine": s.machine, "at_ns": s.at_ns})).collect::<Vec<_>>(),
                "refused": st.refused, "max_renew_gap_ns": st.max_renew_gap_ns,
            })),
        }]);
        cmdline::outln!("{doc}");
        return;
    }
    cmdline::outln!(
        "{:<7} {:<10} {:>4} {:>3} {:>10} {:>11} {:>9} {:>9} {:>7} {:>8} {:>7} {:>7} {:>8}",
        "backend",
        "workload",
        "mach",
        "thr",
        "committed",
        "tx/s",
        "tx/s/mach",
        "p50 us",
        "p99 us",
        "abort%",
        "WR/tx",
        "RD/tx",
        "logB/tx"
    );
    cmdline::outln!(
        "{:<7} {:<10} {:>4} {:>3} {:>10} {:>11.0} {:>9.0} {:>9.2} {:>7.2} {:>8.2} {:>7.2} {:>7.2} {:>8.1}",
        backend,
        workload,
        geo.machines,
        geo.threads,
        out.committed,
        rate,
        per_machine,
        q(0.5),
        q(0.99),
        abort_rate * 100.0,
        per(c.writes),
        per(c.reads),
        per(cs.log_bytes)
    );
    let reasons: Vec<String> = Abort::ALL
        .iter()
        .map(|x| format!("{} {}", x.name(), out.aborted[x.index()]))
        .collect();
    cmdline::outln!(
        "aborts: {}; given up by the workload: {}; messages/tx {:.2}",
        reasons.join(", "),
        out.given_up,
        per(messages)
    );
    if let Some((l, st)) = leases {
        cmdline::outln!(
            "leases: {} ms renewed every {} ms over {:.1} ms: {} grants, {} suspicions, longest renewal gap at the CM {:.1} us",
            l.lease_ns as f64 / 1e6,
            l.renew_ns as f64 / 1e6,
            elapsed_ns as f64 / 1e6,
            st.grants,
            st.suspicions,
            st.max_renew_gap_ns as f64 / 1e3
        );
    }
}

/// One fault run's times from the first fault (ns), where they happened.
#[derive(Default)]
struct FaultTimes {
    suspected: Option<u64>,
    stored: Option<u64>,
    committed: Option<u64>,
    config: Option<txn::config::Configuration>,
}

/// A step of the failure handling, by name, as a run of `R` records it
/// (ns from the run's first fault, none if it never came).
type Step<'a, R> = (&'a str, &'a dyn Fn(&R) -> Option<u64>);

/// Over the runs that reached a step: how many, the median, the maximum.
fn step_stats<R>(runs: &[R], f: &dyn Fn(&R) -> Option<u64>) -> (usize, Option<u64>, Option<u64>) {
    let mut v: Vec<u64> = runs.iter().filter_map(f).collect();
    v.sort_unstable();
    (v.len(), v.get(v.len() / 2).copied(), v.last().copied())
}

/// A time in ns as ms for JSON.
fn ms_of(x: Option<u64>) -> Option<f64> {
    x.map(|v| v as f64 / 1e6)
}

/// A time in ns as ms for a table ("-" if none).
fn ms_cell(x: Option<u64>) -> String {
    x.map_or("-".to_string(), |v| format!("{:.3}", v as f64 / 1e6))
}

/// The `summary` object of a `txn-fault` document: per step, the runs
/// that reached it, the median and the maximum.
fn summary_json<R>(runs: &[R], steps: &[Step<'_, R>]) -> serde_json::Value {
    let sum: serde_json::Map<String, serde_json::Value> = steps
        .iter()
        .map(|(name, f)| {
            let (n, med, max) = step_stats(runs, *f);
            (
                name.to_string(),
                json!({"runs": n, "median_ms": ms_of(med), "max_ms": ms_of(max)}),
            )
        })
        .collect();
    serde_json::Value::Object(sum)
}

/// The same as lines of text.
fn print_summary<R>(runs: &[R], steps: &[Step<'_, R>]) {
    for (name, f) in steps {
        let (n, med, max) = step_stats(runs, *f);
        cmdline::outln!(
            "{name}: {n} of {} runs, median {} ms, max {} ms",
            runs.len(),
            ms_cell(med),
            ms_cell(max)
        );
    }
}

/// Refuses a simulated cluster of `machines` with `threads` cores each
/// past what one host holds: each core (a coordinator and a server task)
/// and each machine's lease core has a queue pair to every machine.
fn check_sim_machines(machines: u16, threads: u16) -> Result<(), ArgError> {
    let (m, t) = (machines as u64, threads as u64);
    crate::args::check_sim_size("--machines × --threads", m * (t + 1), m, m * (2 * t + 1))
}

/// `--fault`'s runs without `--seeds`.
const SEEDS: u64 = 40;

/// `--seeds` seeds from `--seed` on, wrapping past `u64::MAX` (a range
/// `seed..seed + seeds` would be empty or overflow there).
fn seeds(a: &TxnArgs) -> impl Iterator<Item = u64> {
    let first = a.seed;
    (0..a.seeds.unwrap_or(SEEDS)).map(move |i| first.wrapping_add(i))
}

/// The faults' targets exist among `machines` (each a memory node and a
/// compute node) and the run's `threads` simulator threads (`layout` says
/// how they are numbered), and their times lie within a run's virtual time
/// limit (a run stops there, and a fault past it only made the run long,
/// then fail).
fn check_faults(
    faults: &[nicdrv::sim::Fault],
    machines: u16,
    threads: usize,
    layout: &str,
) -> Result<(), String> {
    let m = usize::from(machines);
    for f in faults {
        f.check_machines(m, m, m)?;
        f.check_threads(threads)
            .map_err(|e| format!("{e} (0 ..= {}): {layout}", threads - 1))?;
        if f.at_ns > txn::harness::SIM_LIMIT_NS {
            return Err(format!(
                "at most {} s into the run",
                txn::harness::SIM_LIMIT_NS / 1_000_000_000
            ));
        }
    }
    Ok(())
}

/// `--fault`: detection and reconfiguration over seeds.
fn run_faults(a: &TxnArgs) -> Result<crate::run::Outcome, ArgError> {
    use txn::harness::{lease_sim_threads, run_leases_sim, sim_threads, LeaseSim};
    use txn::reconfig::Event;
    if a.backend != Backend::Sim {
        return Err(ArgError("--fault runs on --backend sim".into()));
    }
    let machines = a.machines.unwrap_or(16);
    check_sim_machines(machines, a.threads)?;
    if a.replicas < 2 || a.replicas > machines as usize {
        return Err(ArgError(format!(
            "--replicas {} must be 2 ..= machines ({machines})",
            a.replicas
        )));
    }
    let n = a.seeds.unwrap_or(SEEDS);
    if n == 0 || n > 100_000 {
        return Err(ArgError(format!("--seeds {n}: 1 ..= 100000")));
    }
    refuse_ignored(
        &[("--txs", a.txs.is_some()), ("--history", a.history.is_some())],
        "with --fault (its runs last until the fault's effects are measured, and record no history)",
    )?;
    if a.detection_only {
        refuse_ignored(
            &[
                ("--workload", a.workload != TxnWorkload::Tatp),
                ("--keys", a.keys.is_some()),
                ("--threads", a.threads != 1),
                ("--log-bytes", a.log_bytes != LOG_BYTES),
                ("--ops", a.ops != YCSB_T_OPS),
                ("--writes", a.writes != YCSB_T_WRITES),
            ],
            "with --detection-only (it runs no workload)",
        )?;
    }
    if a.detection_only && a.plot.is_some() {
        return Err(ArgError(
            "--plot draws the workload's throughput, which --detection-only does not run".into(),
        ));
    }
    let ms = a.lease_ms.unwrap_or(10.0);
    let timing = lease_of(ms)?;
    // The threads a stall may name, as the harness makes them.
    let (threads, layout) = if a.detection_only {
        (
            lease_sim_threads(machines, false, true),
            format!(
                "machine m's lease core is thread m, its reconfiguration core thread {} + m",
                lease_sim_threads(machines, false, false)
            ),
        )
    } else {
        (
            sim_threads(machines, a.threads, true, true),
            format!(
                "core t of machine m is thread m × {} + t, machine m's lease core thread {} + m, \
                 its recovery core thread {} + m",
                a.threads,
                sim_threads(machines, a.threads, false, false),
                sim_threads(machines, a.threads, true, false),
            ),
        )
    };
    let mut faults = Vec::new();
    for f in &a.fault {
        let parsed = nicdrv::sim::parse_fault(f).map_err(|e| ArgError(format!("--fault {e}")))?;
        check_faults(&parsed, machines, threads, &layout)
            .map_err(|why| ArgError(format!("--fault {f}: {why}")))?;
        faults.extend(parsed);
    }
    let first = faults.iter().map(|f| f.at_ns).min().expect("at least one");
    if let Some(p) = &a.plot {
        check_file_target("--plot", p).map_err(ArgError)?;
    }
    if !a.detection_only {
        return fault::run(a, faults, timing);
    }
    let geo = Geometry {
        machines,
        threads: 1,
        f: a.replicas - 1,
        regions_per_machine: 1,
        spare_regions_per_machine: 0,
        region_bytes: 4096,
        static_bytes: 4096,
        block_bytes: 4096,
        log_bytes: 4096,
        reply_bytes: 4096,
    };
    geo.check().map_err(|e| ArgError(e.to_string()))?;
    // Long enough for a lease, the takeover turns of every backup CM, the
    // probes' timeouts and the acknowledgements' lease, twice over.
    let until = first + timing.renew_ns + 10 * timing.lease_ns + machines as u64 * 2_000_000;
    let mut runs = Vec::new();
    for seed in seeds(a) {
        if cmdline::signals::stop_requested() {
            break;
        }
        // Each run's faults come at a point of the renewal cycle of its
        // seed's choosing, as a crash would (times are from there).
        let shift = nicdrv::rng::Rng::new(seed).below(timing.renew_ns);
        let first = first + shift;
        let faults: Vec<nicdrv::sim::Fault> = faults
            .iter()
            .map(|f| nicdrv::sim::Fault {
                at_ns: f.at_ns + shift,
                ..*f
            })
            .collect();
        let store = std::sync::Arc::new(txn::config::EmbeddedStore::new());
        let r = match run_leases_sim(
            geo,
            seed,
            SimModel::default(),
            &LeaseSim {
                faults,
                store: Some(store.clone()),
                ..LeaseSim {
                    timing,
                    ..LeaseSim::of(timing.lease_ns, until)
                }
            },
        ) {
            Ok(r) => r,
            Err(e) => return Ok(crate::run::Outcome::Failed(format!("seed {seed}: {e}"))),
        };
        let mut t = FaultTimes {
            suspected: r
                .suspicions
                .iter()
                .map(|s| s.at_ns)
                .min()
                .map(|x| x.saturating_sub(first)),
            ..Default::default()
        };
        for (_, ev) in &r.reconfig {
            let ev = match ev {
                Ok(ev) => ev,
                Err(e) => return Ok(crate::run::Outcome::Failed(format!("seed {seed}: {e}"))),
            };
            for e in ev {
                match e {
                    Event::Stored { at_ns, config, .. } if t.stored.is_none() => {
                        t.stored = Some(at_ns.saturating_sub(first));
                        t.config = Some(config.clone());
                    }
                    Event::Committed { at_ns, .. } if t.committed.is_none() => {
                        t.committed = Some(at_ns.saturating_sub(first))
                    }
                    _ => {}
                }
            }
        }
        runs.push((seed, t));
    }
    if runs.is_empty() {
        // Stopped before the first seed's run ended: nothing to report.
        return Ok(crate::run::Outcome::Interrupted);
    }
    let rows: [Step<'_, (u64, FaultTimes)>; 3] = [
        ("suspected", &|r| r.1.suspected),
        ("configuration stored", &|r| r.1.stored),
        ("NEW-CONFIG-COMMIT", &|r| r.1.committed),
    ];
    if a.json {
        let per: Vec<serde_json::Value> = runs
            .iter()
            .map(|(seed, t)| {
                json!({
                    "seed": seed,
                    "suspected_ms": ms_of(t.suspected),
                    "stored_ms": ms_of(t.stored),
                    "committed_ms": ms_of(t.committed),
                    "configuration": t.config.as_ref().map(|c| json!({
                        "id": c.id, "cm": c.cm,
                        "machines": c.machines.iter().map(|m| m.0).collect::<Vec<_>>(),
                    })),
                })
            })
            .collect();
        let doc = json!([{
            "schema_version": 1,
            "bench": "txn-fault",
            "backend": "sim",
            "machines": machines,
            "replicas": a.replicas,
            "lease_ns": timing.lease_ns,
            "renew_ns": timing.renew_ns,
            "faults": a.fault,
            "workload": null,
            "runs": per,
            "summary": summary_json(&runs, &rows),
        }]);
        cmdline::outln!("{doc}");
        return Ok(crate::run::Outcome::finished());
    }
    cmdline::outln!(
        "sim, {machines} machines, {}-way replication, {ms} ms leases renewed every {} ms; faults {}, each run's shifted by up to a renewal; no workload (leases and reconfiguration only)",
        a.replicas,
        timing.renew_ns as f64 / 1e6,
        a.fault.join(" ")
    );
    cmdline::outln!(
        "{:>6} {:>14} {:>14} {:>14}  configuration",
        "seed",
        "suspected ms",
        "stored ms",
        "commit ms"
    );
    for (seed, t) in &runs {
        let c = t.config.as_ref().map_or("none".to_string(), |c| {
            format!("{} cm {} of {}", c.id, c.cm, c.machines.len())
        });
        cmdline::outln!(
            "{seed:>6} {:>14} {:>14} {:>14}  {c}",
            ms_cell(t.suspected),
            ms_cell(t.stored),
            ms_cell(t.committed)
        );
    }
    print_summary(&runs, &rows);
    Ok(crate::run::Outcome::finished())
}
