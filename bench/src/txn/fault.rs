//! `loch-bench txn --fault …` under a workload: FaRM's failure handling
//! on sim while the workload runs — leases, reconfiguration, transaction
//! state recovery, allocator recovery and re-replication — over seeds,
//! each seed's faults shifted by up to a renewal. Per run: the surviving
//! coordinators' commits in 1 ms buckets of virtual time around the first
//! fault, and the time from it to the first suspicion, to the new
//! configuration stored and committed, to every region active (every
//! machine drained and recovered its locks), to every new backup copied,
//! and to the end of the last bucket under 80% of the throughput before
//! it.

use super::{mix, ms_cell, ms_of, print_summary, summary_json, Step, TxnArgs};
use crate::args::ArgError;
use nicdrv::sim::{Fault, SimModel};
use serde_json::json;
use txn::harness::{run_sim_with, RunOptions};
use txn::lease::LeaseConfig;
use txn::recovery::Work;
use txn::workload::{Mix, Timed, WorkClient, WorkOut};
use txn::Geometry;

/// Buckets of throughput before the first fault (its mean is the
/// baseline) and the run's length after it.
const BEFORE_MS: u64 = 10;
const AFTER_MS: u64 = 60;
const BUCKET_NS: u64 = 1_000_000;

/// One run's figures, times in ns from its first fault.
struct RunFigures {
    seed: u64,
    suspected: Option<u64>,
    stored: Option<u64>,
    committed: Option<u64>,
    active: Option<u64>,
    copied: Option<u64>,
    to_80: Option<u64>,
    /// Committed a bucket before the fault (mean), and during the copies.
    before: f64,
    during_copy: Option<f64>,
    recovered: (u64, u64),
    /// Commits per bucket from BEFORE_MS before the fault.
    buckets: Vec<u64>,
}

/// Whether the machines the faults crash leave a cluster FaRM can recover
/// in: a new configuration needs a majority of the machines to answer the
/// new configuration manager's probes (FaRM §5.2), certain from the plan
/// alone. Without one the workload could never resume and the run would
/// stall until its time limit; said here instead, before any run. (Fewer
/// survivors than replicas are fine: regions run on with the replicas
/// left, and the run reports no re-replication.) Partitions are the
/// experiment's to judge: one that heals before a lease expires removes
/// nobody.
fn survivable(faults: &[Fault], machines: u16) -> Result<(), String> {
    use nicdrv::sim::FaultKind as K;
    // On sim a machine is its memory node and its compute node: either
    // crashing takes the machine out of the configuration.
    let lost: std::collections::BTreeSet<u16> = faults
        .iter()
        .filter_map(|f| match f.kind {
            K::CrashMachine { machine } => Some(machine),
            K::CrashMemoryNode { node } | K::CrashComputeNode { node } => Some(node),
            _ => None,
        })
        .collect();
    let left = machines as usize - lost.len();
    if 2 * left > machines as usize {
        return Ok(());
    }
    Err(format!(
        "--fault: the plan crashes {} of {machines} machines, leaving {left}: no majority of \
         the {machines} machines is left to answer the new configuration manager's probes \
         (FaRM §5.2); the workload could never resume (--detection-only measures detection \
         alone)",
        lost.len()
    ))
}

pub(super) fn run(
    a: &TxnArgs,
    faults: Vec<Fault>,
    timing: LeaseConfig,
) -> Result<crate::run::Outcome, ArgError> {
    let machines = a.machines.unwrap_or(16);
    survivable(&faults, machines).map_err(ArgError)?;
    let m = mix(a)?;
    let first = faults.iter().map(|f| f.at_ns).min().expect("at least one");
    if first < BEFORE_MS * BUCKET_NS + timing.lease_ns {
        return Err(ArgError(format!(
            "--fault: the first fault must come after {} ms (leases, then {BEFORE_MS} ms of throughput before it)",
            (BEFORE_MS * BUCKET_NS + timing.lease_ns) / 1_000_000
        )));
    }
    let regions = machines as u32;
    let geo = Geometry {
        machines,
        threads: a.threads,
        f: a.replicas - 1,
        regions_per_machine: 1,
        // Room for the new backups a failure needs.
        spare_regions_per_machine: 1,
        region_bytes: m.region_bytes(regions),
        static_bytes: m.region_bytes(regions),
        block_bytes: txn::alloc::BLOCK_BYTES,
        log_bytes: a.log_bytes as u64,
        reply_bytes: 4096,
    };
    geo.check().map_err(|e| ArgError(e.to_string()))?;
    if geo.host_bytes().is_none_or(|b| b > 8 << 30) {
        return Err(ArgError(format!(
            "{machines} machines × {} threads need more than 8 GiB a machine",
            a.threads
        )));
    }
    let mut runs = Vec::new();
    // SIGINT/SIGTERM: the seed in progress finishes (a run is a bounded
    // stretch of virtual time), the rest are not run, and what ran is
    // reported (exit 130).
    for seed in super::seeds(a) {
        if cmdline::signals::stop_requested() {
            break;
        }
        let shift = nicdrv::rng::Rng::new(seed).below(timing.renew_ns);
        let first = first + shift;
        let faults: Vec<Fault> = faults
            .iter()
            .map(|f| Fault {
                at_ns: f.at_ns + shift,
                ..*f
            })
            .collect();
        let until_ns = first + AFTER_MS * BUCKET_NS;
        let store = std::sync::Arc::new(txn::config::EmbeddedStore::new());
        let opts = RunOptions {
            faults,
            leases: Some(timing),
            recovery: Some(store.clone()),
            ..Default::default()
        };
        let clients = |mc: u16, t: u16| Timed {
            work: WorkClient {
                geo,
                mix: m,
                seed: seed.wrapping_mul(1_000_003) ^ ((mc as u64) << 16 | t as u64),
                txs: 0,
                process: mc as u64 * a.threads as u64 + t as u64,
                stop: None,
            },
            until_ns,
            batch: 16,
        };
        let r = match run_sim_with(geo, seed, SimModel::default(), &opts, clients) {
            Ok((r, _)) => r,
            Err(e) => return Ok(crate::run::Outcome::Failed(format!("seed {seed}: {e}"))),
        };
        // The machines of the configuration the run ended in: one removed
        // alive (one end of a link cut for good) ends its tasks with
        // errors, and its commits are not the survivors'.
        let last = match txn::config::ConfigStore::read(&*store) {
            Ok(Some(s)) => s.config,
            other => {
                return Ok(crate::run::Outcome::Failed(format!(
                    "seed {seed}: no configuration at the end: {other:?}"
                )))
            }
        };
        if let Some(e) = r.first_error_on(|m| last.contains(m)) {
            return Ok(crate::run::Outcome::Failed(format!(
                "seed {seed}: a task failed: {e}"
            )));
        }
        let mut out = WorkOut::default();
        for c in r.clients.iter().filter(|c| last.contains(c.machine)) {
            out.merge(c.out.as_ref().expect("no errors"));
        }
        if let Mix::Bank { accounts } = m {
            let total = accounts as i64 * txn::workload::BANK_START;
            if let Some(bad) = out.audits.iter().find(|&&t| t != total) {
                return Ok(crate::run::Outcome::Failed(format!(
                    "seed {seed}: an audit saw a total of {bad}, not {total}"
                )));
            }
        }
        runs.push(figures(seed, first, &r, &out));
    }
    if runs.is_empty() {
        // Stopped before the first seed's run ended: nothing to report.
        return Ok(crate::run::Outcome::Interrupted);
    }
    Ok(match report(a, machines, timing, &runs)? {
        crate::run::Outcome::Done => crate::run::Outcome::finished(),
        other => other,
    })
}

fn figures(seed: u64, first: u64, r: &txn::harness::Report<WorkOut>, out: &WorkOut) -> RunFigures {
    use txn::reconfig::Event;
    let from = |t: u64| t.saturating_sub(first);
    let start = first - BEFORE_MS * BUCKET_NS;
    let n = (BEFORE_MS + AFTER_MS) as usize;
    let mut buckets = vec![0u64; n];
    for &t in &out.commits_ns {
        if t >= start {
            if let Some(b) = buckets.get_mut(((t - start) / BUCKET_NS) as usize) {
                *b += 1;
            }
        }
    }
    let before = buckets[..BEFORE_MS as usize].iter().sum::<u64>() as f64 / BEFORE_MS as f64;
    let after = &buckets[BEFORE_MS as usize..];
    let to_80 = after
        .iter()
        .rposition(|&c| (c as f64) < 0.8 * before)
        .map(|i| (i as u64 + 1) * BUCKET_NS);
    let mut f = RunFigures {
        seed,
        suspected: r.suspicions.iter().map(|s| from(s.at_ns)).min(),
        stored: None,
        committed: None,
        active: None,
        copied: None,
        to_80: to_80.or(Some(0)),
        before,
        during_copy: None,
        recovered: {
            let c = r.coord_stats();
            (c.recovered_commits, c.recovered_aborts)
        },
        buckets,
    };
    let mut copy_start = None;
    for mr in &r.machines {
        if let Some(Ok(ev)) = &mr.events {
            for e in ev {
                match e {
                    Event::Stored { at_ns, .. } => {
                        f.stored = Some(f.stored.map_or(from(*at_ns), |s| s.min(from(*at_ns))))
                    }
                    Event::Committed { at_ns, .. } => {
                        f.committed =
                            Some(f.committed.map_or(from(*at_ns), |s| s.min(from(*at_ns))))
                    }
                    _ => {}
                }
            }
        }
        if mr.removed || mr.config < 2 {
            continue;
        }
        if let Some(&(_, at)) = mr.recovered_at.iter().find(|x| x.0 > 1) {
            f.active = Some(f.active.unwrap_or(0).max(from(at)));
        }
        for w in &mr.work {
            if let Work::Copied {
                started_ns, at_ns, ..
            } = w
            {
                f.copied = Some(f.copied.unwrap_or(0).max(from(*at_ns)));
                copy_start = Some(copy_start.unwrap_or(u64::MAX).min(from(*started_ns)));
            }
        }
    }
    if let (Some(s), Some(e)) = (copy_start, f.copied) {
        // Whole buckets the copies spanned.
        let (b0, b1) = (s / BUCKET_NS + 1, e / BUCKET_NS);
        let span: Vec<u64> = (b0..b1)
            .filter_map(|b| f.buckets.get((BEFORE_MS + b) as usize).copied())
            .collect();
        if !span.is_empty() {
            f.during_copy = Some(span.iter().sum::<u64>() as f64 / span.len() as f64);
        }
    }
    f
}

fn report(
    a: &TxnArgs,
    machines: u16,
    timing: LeaseConfig,
    runs: &[RunFigures],
) -> Result<crate::run::Outcome, ArgError> {
    let rows: [Step<'_, RunFigures>; 6] = [
        ("suspected", &|r| r.suspected),
        ("configuration stored", &|r| r.stored),
        ("NEW-CONFIG-COMMIT", &|r| r.committed),
        ("regions active", &|r| r.active),
        ("80% of throughput", &|r| r.to_80),
        ("re-replicated", &|r| r.copied),
    ];
    let cost = |r: &RunFigures| r.during_copy.map(|d| 1.0 - d / r.before.max(1.0));
    let workload = format!("{:?}", a.workload).to_lowercase();
    if let Some(p) = &a.plot {
        if let Err(e) = std::fs::write(p, plot(&runs[0], timing)) {
            return Ok(crate::run::Outcome::Failed(format!(
                "--plot {}: {e}",
                p.display()
            )));
        }
    }
    if a.json {
        let per: Vec<serde_json::Value> = runs
            .iter()
            .map(|r| {
                json!({
                    "seed": r.seed,
                    "suspected_ms": ms_of(r.suspected),
                    "stored_ms": ms_of(r.stored),
                    "committed_ms": ms_of(r.committed),
                    "active_ms": ms_of(r.active),
                    "to_80_ms": ms_of(r.to_80),
                    "rereplicated_ms": ms_of(r.copied),
                    "committed_per_ms_before": r.before,
                    "rereplication_cost": cost(r),
                    "recovered": {"committed": r.recovered.0, "aborted": r.recovered.1},
                    "timeline": {
                        "from_ms": -(BEFORE_MS as i64),
                        "bucket_ms": 1,
                        "committed": r.buckets,
                    },
                })
            })
            .collect();
        let doc = json!([{
            "schema_version": 1,
            "bench": "txn-fault",
            "backend": "sim",
            "machines": machines,
            "threads": a.threads,
            "replicas": a.replicas,
            "lease_ns": timing.lease_ns,
            "renew_ns": timing.renew_ns,
            "faults": a.fault,
            "workload": workload,
            "runs": per,
            "summary": summary_json(runs, &rows),
        }]);
        cmdline::outln!("{doc}");
        return Ok(crate::run::Outcome::Done);
    }
    cmdline::outln!(
        "sim, {machines} machines × {} threads, {}-way replication, {workload}, {} ms leases renewed every {} ms; faults {}, each run's shifted by up to a renewal; times in ms from the first fault; throughput of the surviving machines' coordinators",
        a.threads,
        a.replicas,
        timing.lease_ns as f64 / 1e6,
        timing.renew_ns as f64 / 1e6,
        a.fault.join(" ")
    );
    cmdline::outln!(
        "{:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9} {:>12}",
        "seed",
        "suspect",
        "stored",
        "commit",
        "active",
        "to 80%",
        "copied",
        "tx/ms pre",
        "copy cost",
        "recovered"
    );
    for r in runs {
        cmdline::outln!(
            "{:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10.0} {:>9} {:>12}",
            r.seed,
            ms_cell(r.suspected),
            ms_cell(r.stored),
            ms_cell(r.committed),
            ms_cell(r.active),
            ms_cell(r.to_80),
            ms_cell(r.copied),
            r.before,
            cost(r).map_or("-".to_string(), |c| format!("{:.1}%", c * 100.0)),
            format!("{}+{}", r.recovered.0, r.recovered.1)
        );
    }
    print_summary(runs, &rows);
    let r = &runs[0];
    cmdline::outln!(
        "seed {}: committed per 1 ms bucket, from {BEFORE_MS} ms before the fault:",
        r.seed
    );
    for (i, row) in r.buckets.chunks(10).enumerate() {
        let from = i as i64 * 10 - BEFORE_MS as i64;
        let cells: Vec<String> = row.iter().map(|c| format!("{c:>6}")).collect();
        cmdline::outln!("{from:>5} ms {}", cells.join(""));
    }
    Ok(crate::run::Outcome::Done)
}

/// The first run's timeline as an SVG line chart: commits per 1 ms bucket
/// against ms from the fault, with the fault and the recovery's moments
/// marked.
fn plot(r: &RunFigures, timing: LeaseConfig) -> String {
    let (w, h, pad) = (720.0, 320.0, 48.0);
    let n = r.buckets.len() as f64;
    let top = r.buckets.iter().copied().max().unwrap_or(1).max(1) as f64 * 1.1;
    let x = |ms: f64| pad + (ms + BEFORE_MS as f64) / n * (w - 2.0 * pad);
    let y = |c: f64| h - pad - c / top * (h - 2.0 * pad);
    let points: Vec<String> = r
        .buckets
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            format!(
                "{:.1},{:.1}",
                x(i as f64 + 0.5 - BEFORE_MS as f64),
                y(c as f64)
            )
        })
        .collect();
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <line x1=\"{pad}\" y1=\"{b}\" x2=\"{r0}\" y2=\"{b}\" stroke=\"black\"/>\n\
         <line x1=\"{pad}\" y1=\"{pad}\" x2=\"{pad}\" y2=\"{b}\" stroke=\"black\"/>\n\
         <text x=\"{cx}\" y=\"{ly}\" text-anchor=\"middle\">ms from the fault (seed {seed}, {lease} ms leases)</text>\n\
         <text x=\"12\" y=\"{pad}\" transform=\"rotate(-90 12 {pad})\" text-anchor=\"end\">committed per ms</text>\n",
        b = h - pad,
        r0 = w - pad,
        cx = w / 2.0,
        ly = h - 12.0,
        seed = r.seed,
        lease = timing.lease_ns as f64 / 1e6,
    );
    for t in (-(BEFORE_MS as i64)..=AFTER_MS as i64).step_by(10) {
        s += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{t}</text>\n",
            x(t as f64),
            h - pad + 14.0
        );
    }
    s += &format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{:.0}</text>\n",
        pad - 4.0,
        y(top / 1.1) + 4.0,
        top / 1.1
    );
    let marks = [
        (Some(0), "fault", "red"),
        (r.suspected, "suspected", "orange"),
        (r.committed, "committed", "green"),
        (r.active, "active", "blue"),
    ];
    for (i, (t, name, color)) in marks.iter().enumerate() {
        if let Some(t) = t {
            let xm = x(*t as f64 / 1e6);
            s += &format!(
                "<line x1=\"{xm:.1}\" y1=\"{pad}\" x2=\"{xm:.1}\" y2=\"{:.1}\" stroke=\"{color}\" stroke-dasharray=\"4 3\"/>\n\
                 <text x=\"{:.1}\" y=\"{:.1}\" fill=\"{color}\">{name}</text>\n",
                h - pad,
                xm + 3.0,
                pad + 12.0 * (i as f64 + 1.0)
            );
        }
    }
    s += &format!(
        "<polyline fill=\"none\" stroke=\"black\" stroke-width=\"1.5\" points=\"{}\"/>\n</svg>\n",
        points.join(" ")
    );
    s
}
