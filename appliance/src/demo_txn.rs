//! The demo's transactions phase: FaRM transactions (txn) on machines that
//! poll their own memory — a bank of transfers and audits, every region
//! replicated — and its checks: every committed audit saw the bank's
//! total, the final balances add up to it with none negative, and every
//! backup copy equals its primary once truncated.

use crate::demo::{DemoBackend, DemoConfig};
use cluster::stats::latency_histogram;
use nicdrv::sim::SimModel;
use std::fmt::Write as _;
use txn::harness::{run_sim, run_threads, Report};
use txn::object::{decode, object_bytes};
use txn::workload::{BankTally, Mix, WorkClient, WorkOut, BANK_START};
use txn::Geometry;

/// Accounts of the demo's bank.
pub const ACCOUNTS: u64 = 24;

/// What the phase found.
#[derive(Clone, Debug)]
pub struct TxnPhase {
    pub committed: u64,
    pub aborted: u64,
    pub audits: u64,
    /// Audits that saw another total than the bank's.
    pub bad_audits: u64,
    /// The final balances' sum equals the bank's total, none negative.
    pub total_ok: bool,
    /// Objects whose backup copy differs from the primary's.
    pub backups_differ: u64,
    pub text: String,
}

impl TxnPhase {
    pub fn ok(&self) -> bool {
        // A phase a signal cut short may have committed nothing yet.
        self.bad_audits == 0
            && self.total_ok
            && self.backups_differ == 0
            && (self.committed > 0 || cmdline::signals::stop_requested())
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "FAILED"
    }
}

/// The phase's cluster: on sim 4 machines × 2 cores, 3-way replication;
/// on emu as many machines as memory nodes (at least 2), one core each,
/// 2-way when there are two.
fn geometry(cfg: &DemoConfig) -> Geometry {
    let (machines, threads, replicas) = match cfg.backend {
        DemoBackend::Sim => (4, 2, 3),
        DemoBackend::Emu => {
            let m = cfg.memory_nodes.clamp(2, 4) as u16;
            (m, 1, if m >= 3 { 3 } else { 2 })
        }
    };
    let mix = Mix::Bank { accounts: ACCOUNTS };
    Geometry {
        machines,
        threads,
        f: replicas - 1,
        regions_per_machine: 1,
        spare_regions_per_machine: 0,
        region_bytes: mix.region_bytes(machines as u32),
        static_bytes: mix.region_bytes(machines as u32),
        block_bytes: txn::alloc::BLOCK_BYTES,
        log_bytes: 64 << 10,
        reply_bytes: 4096,
    }
}

/// Runs the bank: `txs` transactions on every coordinator.
pub fn run(cfg: &DemoConfig, txs: u64) -> Result<TxnPhase, String> {
    let geo = geometry(cfg);
    let mix = Mix::Bank { accounts: ACCOUNTS };
    let clients = |m: u16, t: u16| WorkClient {
        geo,
        mix,
        seed: cfg.seed.wrapping_mul(7919) ^ ((m as u64) << 8 | t as u64),
        txs,
        process: (m * geo.threads + t) as u64,
        stop: Some(cmdline::signals::stop_requested),
    };
    let report = match cfg.backend {
        DemoBackend::Sim => {
            run_sim(geo, cfg.seed, SimModel::default(), clients)
                .map_err(|e| e.to_string())?
                .0
        }
        DemoBackend::Emu => {
            let host = geo.host_bytes().ok_or("the phase's layout overflows")?;
            let cluster = cluster::EmuCluster::machines(geo.machines as usize, host)
                .map_err(|e| e.to_string())?;
            run_threads(
                geo,
                &Default::default(),
                cluster.machine_executors(),
                |m| cluster.host_copy(m as usize),
                clients,
            )
            .map_err(|e| e.to_string())?
        }
    };
    if let Some(e) = report.first_error() {
        return Err(format!("transactions phase: a task failed: {e}"));
    }
    Ok(check(geo, mix, &report))
}

fn check(geo: Geometry, mix: Mix, r: &Report<WorkOut>) -> TxnPhase {
    let mut out = WorkOut::default();
    for c in &r.clients {
        out.merge(c.out.as_ref().expect("no task failed"));
    }
    let total = ACCOUNTS as i64 * BANK_START;
    let bad_audits = out.audits.iter().filter(|&&t| t != total).count() as u64;
    let map = geo.region_map().expect("a checked geometry");
    let mut tally = BankTally::default();
    let mut backups_differ = 0;
    for (at, len) in mix.objects(&geo) {
        let n = object_bytes(len);
        let p = map
            .on_primary(at, n as u64)
            .expect("the workload's objects");
        let copy = &r.memory[p.node() as usize][p.offset() as usize..][..n];
        let mut v = vec![0u8; len];
        match decode(copy, &mut v) {
            Ok(Ok(_)) => tally.add(Some(i64::from_le_bytes(
                v[..8].try_into().expect("8 bytes"),
            ))),
            _ => tally.add(None),
        }
        for b in map
            .on_backups(at, n as u64)
            .expect("the workload's objects")
        {
            let bc = &r.memory[b.node() as usize][b.offset() as usize..][..n];
            backups_differ += u64::from(bc != copy);
        }
    }
    let total_ok = tally.holds(total);
    let aborted: u64 = out.aborted.iter().sum();
    let elapsed = r
        .clients
        .iter()
        .map(|c| c.elapsed_ns)
        .max()
        .unwrap_or(1)
        .max(1);
    let mut h = latency_histogram();
    for &l in &out.latencies_ns {
        let _ = h.record(l.max(1));
    }
    let c = r.counters();
    let mut text = String::new();
    let _ = writeln!(
        text,
        "transactions: a bank of {ACCOUNTS} accounts on {} machines × {} core{}, {}-way replicated",
        geo.machines,
        geo.threads,
        if geo.threads == 1 { "" } else { "s" },
        geo.f + 1
    );
    let _ = writeln!(
        text,
        "  {} committed ({:.0}/s), {} aborted ({}), {} given up; begin-to-commit p50 {:.2} us, p99 {:.2} us; {:.2} WRITEs and {:.2} READs a commit",
        out.committed,
        out.committed as f64 * 1e9 / elapsed as f64,
        aborted,
        txn::Abort::ALL
            .iter()
            .map(|a| format!("{} {}", a.name(), out.aborted[a.index()]))
            .collect::<Vec<_>>()
            .join(", "),
        out.given_up,
        h.value_at_quantile(0.5) as f64 / 1e3,
        h.value_at_quantile(0.99) as f64 / 1e3,
        c.writes as f64 / out.committed.max(1) as f64,
        c.reads as f64 / out.committed.max(1) as f64,
    );
    let _ = writeln!(
        text,
        "  check: {} committed audits saw the total {total}: {}",
        out.audits.len(),
        verdict(bad_audits == 0)
    );
    let _ = writeln!(
        text,
        "  check: final balances sum to {} (want {total}), {} negative, {} unreadable: {}",
        tally.sum,
        tally.negative,
        tally.unreadable,
        verdict(total_ok)
    );
    let _ = writeln!(
        text,
        "  check: backup copies equal to their primaries: {backups_differ} differ: {}",
        verdict(backups_differ == 0)
    );
    TxnPhase {
        committed: out.committed,
        aborted,
        audits: out.audits.len() as u64,
        bad_audits,
        total_ok,
        backups_differ,
        text,
    }
}
