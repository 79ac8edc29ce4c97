//! `loch node --workload txn`: every node of the cluster a machine (a
//! memory node and cores in one process), running FaRM transactions
//! across processes — the demo's replicated bank. Each node creates its
//! memory node, meets the others at "memory-ready", attaches to their
//! memory, and runs its cores' server and coordinator threads until every
//! coordinator of the cluster said DONE; then, at "txn-done", node 0
//! checks the bank as memory holds it (the total, no negative balance,
//! every backup equal to its primary) while the others keep their memory
//! up until "txn-checked". On mlx5 the memory is registered and each core
//! reaches every machine over queue pairs ([`crate::node_mlx5::run_machine`]);
//! the bank itself
//! ([`run_bank`], [`run_bank_recovering`]) is the same code on both
//! backends.

use crate::demo_txn::ACCOUNTS;
use crate::node::{
    attach_all, failed, memory_role, preflight_passes, rendezvous, say, Boot, NodeError,
    NodeOptions,
};
use crate::node_leases::StoreFlags;
use crate::node_mlx5::MachineWork;
use bootstrap::config::{Backend, ClusterConfig, NodeConfig};
use bootstrap::etcd::EtcdStore;
use bootstrap::Rendezvous;
use cluster::emu::EmuCluster;
use cluster::stats::latency_histogram;
use nicdrv::emu::{EmuConfig, EmuNode};
use nicdrv::Executor;
use serde_json::json;
use std::cell::RefCell;
use std::rc::Rc;
use txn::harness::{core_config, run_machine, ExecutorFactory};
use txn::object::{self, object_bytes};
use txn::records::ObjAddr;
use txn::regions::RegionMap;
use txn::workload::{BankTally, Mix, WorkClient, WorkOut, BANK_START};
use txn::Geometry;

const MIX: Mix = Mix::Bank { accounts: ACCOUNTS };

/// The cluster's geometry for the bank, or why the cluster file cannot
/// run it: every node a machine (memory and compute), ids 0..n, the same
/// number of cores each, memory enough for the layout, emu.
pub fn geometry(o: &NodeOptions, cfg: &ClusterConfig) -> Result<Geometry, NodeError> {
    let name = if matches!(o.workload, crate::node::Workload::Leases) {
        "leases"
    } else {
        "txn"
    };
    let usage = |s: String| Err(NodeError::Usage(format!("--workload {name}: {s}")));
    let n = cfg.nodes.len();
    if n < 2 {
        return usage("a cluster of at least 2 machines".into());
    }
    let mut ids: Vec<u32> = cfg.nodes.iter().map(|n| n.id).collect();
    ids.sort_unstable();
    if ids != (0..n as u32).collect::<Vec<_>>() {
        return usage(format!("node ids must be 0..{n}, one each"));
    }
    if let Some(x) = cfg
        .nodes
        .iter()
        .find(|x| !(x.roles.memory && x.roles.compute))
    {
        return usage(format!(
            "node {} must have both roles: every node is a machine (memory and compute)",
            x.id
        ));
    }
    let threads = cfg.nodes[0].cores.len();
    if let Some(x) = cfg.nodes.iter().find(|x| x.cores.len() != threads) {
        return usage(format!(
            "node {} has {} cores, node {} {threads}: every machine needs the same",
            x.id,
            x.cores.len(),
            cfg.nodes[0].id
        ));
    }
    if threads == 0 || threads > 64 {
        return usage("1 ..= 64 cores a machine".into());
    }
    if o.txs == 0 && o.etcd.is_none() {
        return usage("--txs must be at least 1".into());
    }
    let replicas = n.min(3);
    let region = MIX.region_bytes(n as u32);
    let g = Geometry {
        machines: n as u16,
        threads: threads as u16,
        f: replicas - 1,
        regions_per_machine: 1,
        // With failure handling, room for the new backups a failure needs.
        spare_regions_per_machine: u32::from(o.etcd.is_some()),
        region_bytes: region,
        static_bytes: region,
        block_bytes: txn::alloc::BLOCK_BYTES,
        log_bytes: 64 << 10,
        reply_bytes: 4 << 10,
    };
    g.check().map_err(|e| NodeError::Usage(e.to_string()))?;
    let need = g.host_bytes().unwrap_or(u64::MAX);
    if let Some(x) = cfg.nodes.iter().find(|x| x.memory_bytes < need) {
        return usage(format!(
            "node {} exports {} bytes; {n} machines × {threads} cores need {need}",
            x.id, x.memory_bytes
        ));
    }
    Ok(g)
}

/// What losing a machine costs a cluster of `geo`, where it costs more
/// than a new backup per lost replica: with two machines or fewer no
/// majority survives a loss, so no configuration can follow and the
/// bank stops (FaRM §5.2); where every machine holds a replica of every
/// region (machines ≤ replicas), the remap (`txn::reconfig`) finds no
/// machine for the lost replicas' new backups, and the bank runs on with
/// one replica fewer of each region, for good.
fn loss_warning(geo: &Geometry) -> Option<String> {
    let n = geo.machines as usize;
    if n <= 2 {
        return Some(format!(
            "no majority of the {n} machines survives losing one, so the bank stops at a loss \
             (3 machines or more go on)"
        ));
    }
    (n <= geo.f + 1).then(|| {
        format!(
            "every one of the {n} machines holds a replica of every region, so after losing one \
             the bank runs on with {} replicas of each (no machine is left to take new backups; \
             4 machines or more re-replicate, 3-way with one to spare)",
            geo.f
        )
    })
}

/// What the bank holds at the end, as node 0 reads it.
struct BankState {
    tally: BankTally,
    backups_differ: u64,
}

/// `--workload txn` on this machine: with `store` (`--etcd`, its flags
/// checked by `node_leases::store_flags`) for `--seconds` with
/// failure handling, else `--txs` transactions a core.
pub fn run(
    o: &NodeOptions,
    cfg: &ClusterConfig,
    node: &NodeConfig,
    store: Option<StoreFlags>,
) -> Result<u8, NodeError> {
    let geo = geometry(o, cfg)?;
    if let Some(flags) = store {
        return run_recovering(o, cfg, node, geo, flags);
    }
    preflight_passes(cfg, o.id)?;
    cmdline::signals::install();
    if matches!(cfg.backend, Backend::Mlx5 { .. }) {
        return crate::node_mlx5::run_machine(o, cfg, node, geo, MachineWork::Bank);
    }
    let me = format!("loch node {}", o.id);
    let (machine, rv, boot) = EmuMachine::boot(o, cfg, node, &me, agreement(o))?;
    say(format_args!(
        "{me}: control channel: joined in {:.1} ms, exchange + barrier in {:.1} ms",
        boot.join_ns as f64 / 1e6,
        boot.exchange_ns as f64 / 1e6
    ));
    let cluster = &machine.cluster;
    run_bank(o, geo, &me, rv, cluster.machine_executors(), || {
        cluster
            .machine_executor(0, core_config())
            .map_err(|e| e.to_string())
    })
}

/// A machine on emu: its memory node, and every machine's memory
/// attached.
pub(crate) struct EmuMachine {
    /// Every machine's memory, this machine's the local view of its cores.
    pub(crate) cluster: EmuCluster,
    /// This machine's memory node: dropping it removes its file, once the
    /// run is over.
    _own: Option<EmuNode>,
}

impl EmuMachine {
    /// Creates machine `node`'s memory node, joins the cluster through
    /// "memory-ready" with `agreement`, and attaches every machine's
    /// memory; the machine, the rendezvous, and the control channel's
    /// figures.
    pub(crate) fn boot(
        o: &NodeOptions,
        cfg: &ClusterConfig,
        node: &NodeConfig,
        me: &str,
        agreement: Option<String>,
    ) -> Result<(EmuMachine, Rendezvous, Boot), NodeError> {
        let (own, regions) = memory_role(o, cfg, node, me)?;
        let (boot, rv, _listener) = rendezvous(cfg, o.id, regions, agreement)?;
        let mut machines: Vec<&NodeConfig> = cfg.nodes.iter().collect();
        machines.sort_by_key(|x| x.id);
        let eps = attach_all(cfg, &machines, own.as_ref(), &boot.directory)?;
        let cluster = EmuCluster::attach(eps, EmuConfig::default());
        Ok((EmuMachine { cluster, _own: own }, rv, boot))
    }
}

/// What every machine of a bank run must agree on at "memory-ready".
pub fn agreement(o: &NodeOptions) -> Option<String> {
    Some(format!("--workload txn --txs {}", o.txs))
}

/// The bank on this machine's cores, on any backend, once the cluster is
/// booted and connected (`rv` past "memory-ready"): `executors` makes each
/// core's executor on this machine; `checker` one more core of machine 0,
/// which node 0 alone asks for, after the run, to read the bank. Prints
/// the summary line and the JSON line; returns the exit code.
pub fn run_bank<N: nicdrv::Nic>(
    o: &NodeOptions,
    geo: Geometry,
    me: &str,
    mut rv: Rendezvous,
    executors: impl ExecutorFactory<N>,
    checker: impl FnOnce() -> Result<Executor<N>, String>,
) -> Result<u8, NodeError> {
    say(format_args!(
        "{me}: machine role: a bank of {ACCOUNTS} accounts on {} machines × {} cores, {}-way replicated, {} transactions a core",
        geo.machines,
        geo.threads,
        geo.f + 1,
        o.txs
    ));
    let m = o.id as u16;
    let seed = o.seed;
    let txs = o.txs;
    let report = run_machine(geo, m, &Default::default(), executors, |mc, t| WorkClient {
        geo,
        mix: MIX,
        seed: seed.wrapping_mul(7919) ^ ((mc as u64) << 8 | t as u64),
        txs,
        process: (mc * geo.threads + t) as u64,
        // SIGINT/SIGTERM: each core ends its transaction in flight and
        // starts no more; the checks below still run (exit 130).
        stop: Some(cmdline::signals::stop_requested),
    })
    .map_err(failed)?;
    if let Some(e) = report.first_error() {
        return Err(failed(format!("a core failed: {e}")));
    }
    let mut out = WorkOut::default();
    for c in &report.clients {
        out.merge(c.out.as_ref().expect("no errors"));
    }
    // A run a signal cut short is still checked: the machines meet, node 0
    // reads the bank, and they part (barriers a stop does not end, each
    // bounded by the barrier timeout).
    rv.barrier_past_stop("txn-done")
        .map_err(|e| failed(crate::node::channel_problem(e)))?;
    let bank = if o.id == 0 {
        Some(read_bank(checker().map_err(failed)?, geo)?)
    } else {
        None
    };
    rv.barrier_past_stop("txn-checked")
        .map_err(|e| failed(crate::node::channel_problem(e)))?;
    rv.close();
    let total = ACCOUNTS as i64 * BANK_START;
    let bad_audits = out.audits.iter().filter(|&&a| a != total).count();
    let mut h = latency_histogram();
    for &l in &out.latencies_ns {
        let _ = h.record(l.max(1));
    }
    let c = report.counters();
    let aborted: u64 = out.aborted.iter().sum();
    let bank_ok = bank
        .as_ref()
        .is_none_or(|b| b.tally.holds(total) && b.backups_differ == 0);
    let stopped = cmdline::signals::stop_requested();
    let ok = bad_audits == 0 && bank_ok && (out.committed > 0 || stopped);
    let line = json!({
        "workload": "txn",
        "machine": o.id,
        "machines": geo.machines,
        "cores": geo.threads,
        "replicas": geo.f + 1,
        "committed": out.committed,
        "aborted": aborted,
        "given_up": out.given_up,
        "audits": out.audits.len(),
        "bad_audits": bad_audits,
        "latency_us": {
            "p50": h.value_at_quantile(0.5) as f64 / 1e3,
            "p99": h.value_at_quantile(0.99) as f64 / 1e3,
        },
        // This machine's tasks' WRITEs and READs per commit of its own.
        "writes_per_commit": c.writes as f64 / out.committed.max(1) as f64,
        "reads_per_commit": c.reads as f64 / out.committed.max(1) as f64,
        "bank": bank.as_ref().map(|b| json!({
            "total": b.tally.sum, "want": total, "negative": b.tally.negative,
            "unreadable": b.tally.unreadable, "backups_differ": b.backups_differ,
        })),
        "ok": ok,
    });
    say(format_args!(
        "{me}: {} committed, {aborted} aborted, {} audits ({bad_audits} saw another total){}",
        out.committed,
        out.audits.len(),
        match (&bank, bank_ok) {
            (Some(b), true) => format!("; the bank holds {} in all: ok", b.tally.sum),
            (Some(b), false) => format!(
                "; the bank: total {} (want {total}), {} negative, {} backups differ: FAILED",
                b.tally.sum, b.tally.negative, b.backups_differ
            ),
            (None, _) => String::new(),
        }
    ));
    cmdline::outln!("{line}");
    Ok(if !ok {
        cmdline::EXIT_FAILED
    } else if stopped {
        cmdline::EXIT_INTERRUPTED
    } else {
        cmdline::EXIT_DONE
    })
}

/// `--workload txn --etcd URL`: the bank for `--seconds` with FaRM's
/// failure handling — leases, reconfiguration through etcd, transaction
/// state recovery, re-replication. Kill a machine (SIGKILL) meanwhile and
/// the others go on without it. No barrier follows the run (a machine may
/// be gone): each machine checks what it can alone — every audit it
/// committed saw the bank's total, and the accounts it is the primary of
/// in its last configuration have backups equal to its copy (read across
/// the processes) — and prints one JSON line with its configuration, its
/// recovery, its replicas and its commits in 10 ms wall-clock buckets.
fn run_recovering(
    o: &NodeOptions,
    cfg: &ClusterConfig,
    node: &NodeConfig,
    geo: Geometry,
    flags: StoreFlags,
) -> Result<u8, NodeError> {
    preflight_passes(cfg, o.id)?;
    cmdline::signals::install();
    if matches!(cfg.backend, Backend::Mlx5 { .. }) {
        return crate::node_mlx5::run_machine(o, cfg, node, geo, MachineWork::Recovering(&flags));
    }
    let me = format!("loch node {}", o.id);
    let (machine, rv, _boot) = EmuMachine::boot(o, cfg, node, &me, flags.agreement(o))?;
    let cluster = &machine.cluster;
    run_bank_recovering(o, geo, &me, &flags, rv, cluster.machine_executors(), || {
        cluster
            .machine_executor(o.id as usize, core_config())
            .map_err(|e| e.to_string())
    })
}

/// The bank with failure handling on this machine, on any backend, once
/// the cluster is booted and connected (`rv` past "memory-ready"):
/// `executors` makes each core's executor on this machine (and its lease
/// and recovery cores'); `checker` one more, asked for after the run to
/// compare this machine's accounts with their backups. Prints the
/// summary line and the JSON line; returns the exit code.
pub fn run_bank_recovering<N: nicdrv::Nic>(
    o: &NodeOptions,
    geo: Geometry,
    me: &str,
    flags: &StoreFlags,
    mut rv: Rendezvous,
    executors: impl ExecutorFactory<N>,
    checker: impl FnOnce() -> Result<Executor<N>, String>,
) -> Result<u8, NodeError> {
    let (store, timing, seconds) = (&flags.store, flags.timing, flags.seconds);
    let (url, ms) = (&flags.url, o.lease_ms);
    crate::node_leases::first_configuration(store.as_ref(), geo, url, "txn")?;
    rv.barrier("txn-configured").map_err(failed)?;
    say(format_args!(
        "{me}: machine role: a bank of {ACCOUNTS} accounts on {} machines × {} cores, {}-way replicated, {ms} ms leases, configuration in etcd at {url}, for {seconds} s ({})",
        geo.machines,
        geo.threads,
        geo.f + 1,
        crate::node_leases::SIGNALS_WAIT,
    ));
    if let Some(w) = loss_warning(&geo) {
        say(format_args!("{me}: warning: {w}"));
    }
    let m = o.id as u16;
    let seed = o.seed;
    let start_ns = nicdrv::clock::now_ns();
    let unix0 = nicdrv::clock::unix_ns();
    let until_ns = start_ns + (seconds * 1e9) as u64;
    let opts = txn::harness::RunOptions {
        leases: Some(timing),
        recovery: Some(store.clone()),
        // A machine whose peers failed for good (a failure the cluster
        // cannot take) ends rather than waits for their DONE.
        serve_until_ns: Some(until_ns + 10_000_000_000),
        ..Default::default()
    };
    let report = run_machine(geo, m, &opts, executors, |mc, t| {
        txn::workload::Timed {
            work: WorkClient {
                geo,
                mix: MIX,
                seed: seed.wrapping_mul(7919) ^ ((mc as u64) << 8 | t as u64),
                txs: 0,
                process: (mc * geo.threads + t) as u64,
                // Bounded by --seconds; a machine that stopped early
                // would look failed to the others' leases.
                stop: None,
            },
            until_ns,
            batch: 32,
        }
    })
    .map_err(failed)?;
    let mut out = WorkOut::default();
    let mut errors = Vec::new();
    for c in &report.clients {
        match &c.out {
            Ok(o) => out.merge(o),
            Err(e) => errors.push(e.to_string()),
        }
    }
    if let Some(e) = report.servers.iter().find_map(|s| s.stats.as_ref().err()) {
        errors.push(e.to_string());
    }
    let total = ACCOUNTS as i64 * BANK_START;
    let bad_audits = out.audits.iter().filter(|&&a| a != total).count();
    let mr = report.machines.first();
    let rel = |at: u64| at.saturating_sub(start_ns) as f64 / 1e6;
    const BUCKET_NS: u64 = 10_000_000;
    let mut buckets = vec![0u64; ((seconds * 1e9) as u64 / BUCKET_NS + 1) as usize];
    for &t in &out.commits_ns {
        if let Some(b) = buckets.get_mut((t.saturating_sub(start_ns) / BUCKET_NS) as usize) {
            *b += 1;
        }
    }
    let events: Vec<serde_json::Value> = match mr.and_then(|m| m.events.as_ref()) {
        Some(Ok(ev)) => ev
            .iter()
            .map(
                |e| json!({"event": e.name(), "at_ms": rel(e.at_ns()), "detail": format!("{e:?}")}),
            )
            .collect(),
        Some(Err(e)) => {
            errors.push(e.to_string());
            Vec::new()
        }
        None => Vec::new(),
    };
    let cs = report.coord_stats();
    let removed = mr.is_some_and(|m| m.removed);
    // Every account this survivor is the primary of, against its backups
    // on the other processes (those re-replicated after the failure too).
    let copies = match mr {
        Some(m) if !removed => {
            let r = checker()
                .map_err(failed)
                .and_then(|ex| compare_replicas(ex, geo, m.machine, &m.map));
            // Its memory stays up until the machines its check and theirs
            // read have checked too.
            if let Err(e) = meet_checked(store, m) {
                say(format_args!("{me}: {e}"));
            }
            match r {
                Ok(r) => Some(r),
                Err(e) => {
                    errors.push(e.to_string());
                    None
                }
            }
        }
        _ => None,
    };
    let copies_ok = copies.as_ref().is_some_and(|c| c.differ == 0);
    let ok = errors.is_empty() && bad_audits == 0 && out.committed > 0 && !removed && copies_ok;
    let line = json!({
        "workload": "txn",
        "machine": o.id,
        "machines": geo.machines,
        "cores": geo.threads,
        "replicas": geo.f + 1,
        "lease_ns": timing.lease_ns,
        "committed": out.committed,
        "aborted": out.aborted.iter().sum::<u64>(),
        "aborted_failure": out.aborted[txn::Abort::Failure.index()],
        "audits": out.audits.len(),
        "bad_audits": bad_audits,
        "config": mr.map(|m| m.config),
        "removed": removed,
        "members": mr.map(|m| m.map.iter().map(|r| r.primary.machine).collect::<std::collections::BTreeSet<_>>()),
        "short_of_backups": mr.map(|m| m.map.short_of_backups().map(|r| r.id).collect::<Vec<_>>()),
        "recovered": {"committed": cs.recovered_commits, "aborted": cs.recovered_aborts},
        "copies": copies.as_ref().map(|c| json!({"primaries": c.objects, "backups": c.copies, "differ": c.differ})),
        "suspicions": report.suspicions.iter().map(|s| json!({"machine": s.machine, "config": s.config, "at_ms": rel(s.at_ns)})).collect::<Vec<_>>(),
        "events": events,
        "active_ms": mr.and_then(|m| m.recovered_at.iter().find(|x| x.0 > 1).map(|x| rel(x.1))),
        "copied_ms": mr.and_then(|m| m.work.iter().filter_map(|w| match w {
            txn::recovery::Work::Copied { at_ns, .. } => Some(rel(*at_ns)),
            _ => None,
        }).reduce(f64::max)),
        "timeline": {"unix_ms": unix0 as f64 / 1e6, "bucket_ms": 10, "committed": buckets},
        "errors": errors,
        "ok": ok,
    });
    let agree = copies.as_ref().map_or(String::new(), |c| {
        format!(
            ", {} of the {} backup copies of its {} accounts differ",
            c.differ, c.copies, c.objects
        )
    });
    say(format_args!(
        "{me}: {} committed, {} audits ({bad_audits} saw another total), configuration {}{agree}{}",
        out.committed,
        out.audits.len(),
        mr.map_or(0, |m| m.config),
        if ok { ": ok" } else { ": FAILED" }
    ));
    cmdline::outln!("{line}");
    Ok(if ok { 0 } else { 1 })
}

/// Every account's primary copy, lock-free, and every backup copy beside
/// it, read with one-sided READs from a core of machine 0.
fn read_bank<N: nicdrv::Nic>(mut ex: Executor<N>, geo: Geometry) -> Result<BankState, NodeError> {
    let map = geo.region_map().map_err(failed)?;
    let objects = MIX.objects(&geo);
    run_task(&mut ex, move |ctx| async move {
        let mut st = BankState {
            tally: BankTally::default(),
            backups_differ: 0,
        };
        for (at, len) in objects {
            let n = object_bytes(len);
            let p = map.on_primary(at, n as u64).map_err(|e| e.to_string())?;
            let stored = object::read(&ctx, p, len, 64).await.ok();
            st.tally.add(
                stored.map(|r| i64::from_le_bytes(r.payload[..8].try_into().expect("8 bytes"))),
            );
            st.backups_differ += copies_differ(&ctx, &map, at, n).await?.1;
        }
        Ok(st)
    })
}

/// Runs `task` alone on `ex` until it ends, and returns what it returned.
fn run_task<N: nicdrv::Nic, T, F, Fut>(ex: &mut Executor<N>, task: F) -> Result<T, NodeError>
where
    T: 'static,
    F: FnOnce(nicdrv::Ctx<N>) -> Fut,
    Fut: std::future::Future<Output = Result<T, String>> + 'static,
{
    let result: Rc<RefCell<Option<Result<T, String>>>> = Rc::new(RefCell::new(None));
    let r2 = result.clone();
    ex.spawn(move |ctx| {
        let fut = task(ctx);
        async move {
            let got = fut.await;
            *r2.borrow_mut() = Some(got);
        }
    })
    .map_err(failed)?;
    ex.run();
    let got = result.borrow_mut().take();
    got.unwrap_or_else(|| Err("the task did not finish".into()))
        .map_err(failed)
}

/// How many backup copies of the object at `at` (`n` bytes with its
/// header) `map` names, and how many of them differ from its primary
/// copy byte for byte, read with one-sided READs.
async fn copies_differ<N: nicdrv::Nic>(
    ctx: &nicdrv::Ctx<N>,
    map: &RegionMap,
    at: ObjAddr,
    n: usize,
) -> Result<(u64, u64), String> {
    let p = map.on_primary(at, n as u64).map_err(|e| e.to_string())?;
    let primary = ctx.read(p, n).await.map_err(|e| e.to_string())?;
    let (mut copies, mut differ) = (0, 0);
    for b in map.on_backups(at, n as u64).map_err(|e| e.to_string())? {
        let copy = ctx.read(b, n).await.map_err(|e| e.to_string())?;
        copies += 1;
        differ += u64::from(copy.as_slice() != primary.as_slice());
    }
    Ok((copies, differ))
}

/// The replicas of one survivor's accounts after a run with failures.
struct Replicas {
    /// Accounts whose primary copy this machine holds in its last
    /// configuration.
    objects: u64,
    /// Their backup copies, and those that still differed from the
    /// primary when the check gave up.
    copies: u64,
    differ: u64,
}

/// How long a survivor waits for its backups to agree with it: the other
/// survivors may still be applying the last truncations the cluster's
/// coordinators sent before DONE (a backup applies a commit when it
/// learns it was truncated).
const AGREE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a survivor that checked its replicas waits for the others to
/// check theirs (they read its memory) before it lets its memory go.
const MEET_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// Marks in `store` that machine `m.machine` checked its replicas in its
/// last configuration, then waits (up to [`MEET_WAIT`]) until every
/// machine holding a replica in that configuration marked so too: the
/// survivors meet in the configuration store, since the bootstrap
/// channel's coordinator may be the machine that failed.
fn meet_checked(store: &EtcdStore, m: &txn::harness::MachineReport) -> Result<(), String> {
    let prefix = format!("checked/{}/", m.config);
    store
        .mark(&format!("{prefix}{}", m.machine))
        .map_err(|e| e.to_string())?;
    let holders: std::collections::BTreeSet<String> = m
        .map
        .iter()
        .flat_map(|r| std::iter::once(r.primary.machine).chain(r.backups.iter().map(|b| b.machine)))
        .map(|x| format!("{prefix}{x}"))
        .collect();
    let deadline = std::time::Instant::now() + MEET_WAIT;
    loop {
        let marked = store.marks(&prefix).map_err(|e| e.to_string())?;
        let missing: Vec<&String> = holders.iter().filter(|h| !marked.contains(h)).collect();
        if missing.is_empty() {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "gave up waiting for {missing:?} to check their replicas after {} s",
                MEET_WAIT.as_secs()
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// After a run with failures, with no barrier to meet at: every account
/// this machine is the primary of in its last configuration `map`,
/// compared with each of its backups' copies across the processes, read
/// again until all agree or [`AGREE_WAIT`] passed.
fn compare_replicas<N: nicdrv::Nic>(
    mut ex: Executor<N>,
    geo: Geometry,
    me: u16,
    map: &RegionMap,
) -> Result<Replicas, NodeError> {
    let deadline = std::time::Instant::now() + AGREE_WAIT;
    loop {
        let map = map.clone();
        let st = run_task(&mut ex, move |ctx| async move {
            let mut st = Replicas {
                objects: 0,
                copies: 0,
                differ: 0,
            };
            for (at, len) in MIX.objects(&geo) {
                let n = object_bytes(len);
                let p = map.on_primary(at, n as u64).map_err(|e| e.to_string())?;
                if p.node() != me {
                    continue;
                }
                let (copies, differ) = copies_differ(&ctx, &map, at, n).await?;
                st.objects += 1;
                st.copies += copies;
                st.differ += differ;
            }
            Ok(st)
        })?;
        if st.differ == 0 || std::time::Instant::now() >= deadline {
            return Ok(st);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo(machines: u16) -> Geometry {
        Geometry {
            machines,
            threads: 1,
            f: usize::from(machines.min(3)) - 1,
            regions_per_machine: 1,
            spare_regions_per_machine: 1,
            region_bytes: 4096,
            static_bytes: 4096,
            block_bytes: 4096,
            log_bytes: 4096,
            reply_bytes: 4096,
        }
    }

    #[test]
    fn clusters_of_three_machines_or_fewer_are_warned_what_a_loss_costs() {
        let w = loss_warning(&geo(2)).expect("warned");
        assert!(w.contains("no majority of the 2 machines"), "{w}");
        let w = loss_warning(&geo(3)).expect("warned");
        assert!(w.contains("runs on with 2 replicas"), "{w}");
        for n in [4, 5, 16] {
            assert_eq!(loss_warning(&geo(n)), None, "{n} machines");
        }
    }
}
