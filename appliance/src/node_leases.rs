//! `loch node --workload leases`: every node of the cluster a machine
//! running FaRM's failure detection and reconfiguration alone — a lease
//! core and a reconfiguration core each, the configuration in etcd — for
//! `--seconds`. Kill a machine (SIGKILL) meanwhile and the others suspect
//! it, the CM (or, when the CM died, its first live backup) stores the
//! next configuration in etcd by compare-and-swap and installs it on
//! every machine. Each node prints one JSON line: the configuration it
//! ended in, its suspicions and its reconfiguration events with their
//! wall-clock times. `--workload txn --etcd` runs the bank beside it.

use crate::node::{failed, preflight_passes, say, NodeError, NodeOptions};
use crate::node_mlx5::MachineWork;
use bootstrap::config::{Backend, ClusterConfig, NodeConfig};
use bootstrap::etcd::{EtcdStore, DEFAULT_KEY};
use bootstrap::Rendezvous;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use txn::config::establish;
use txn::harness::{first_stored, run_machine_leases, ExecutorFactory};
use txn::lease::LeaseConfig;

/// The failure-handling flags of a `--workload`, checked.
pub struct StoreFlags {
    /// The workload they are given with (`txn` or `leases`).
    pub workload: &'static str,
    /// The configuration store at `--etcd`.
    pub store: Arc<EtcdStore>,
    pub url: String,
    pub timing: LeaseConfig,
    /// How long the run lasts (`--seconds`, 5 when not given).
    pub seconds: f64,
}

/// The failure-handling flags of `--workload NAME`: the etcd store at
/// `--etcd`, the lease, the run's seconds.
pub(crate) fn store_flags(o: &NodeOptions, name: &'static str) -> Result<StoreFlags, NodeError> {
    let usage = |s: String| NodeError::Usage(format!("--workload {name}: {s}"));
    let url = o
        .etcd
        .as_deref()
        .ok_or_else(|| usage("needs --etcd http://HOST:PORT (the configuration store)".into()))?;
    let ms = o.lease_ms;
    let timing = LeaseConfig::from_ms(ms).map_err(|e| usage(format!("--lease-ms {ms}: {e}")))?;
    let store = EtcdStore::new(url, DEFAULT_KEY, Duration::from_secs(2))
        .map_err(|e| usage(e.to_string()))?;
    let flags = StoreFlags {
        workload: name,
        store: Arc::new(store),
        url: url.to_string(),
        timing,
        seconds: o.seconds.unwrap_or(5.0),
    };
    // Every machine sends them at "memory-ready": flags too long for the
    // control channel are refused now, not there.
    if let Some(agreed) = flags.agreement(o) {
        bootstrap::channel::agreement_fits(crate::node::MEMORY_READY, &agreed)
            .map_err(|e| usage(format!("--etcd, --lease-ms and --seconds as given: {e}")))?;
    }
    Ok(flags)
}

/// Configuration 1 of `geo` in `store` (every machine stores it, one of
/// them first), or why the store holds another run's.
pub(crate) fn first_configuration(
    store: &EtcdStore,
    geo: txn::Geometry,
    url: &str,
    name: &str,
) -> Result<txn::config::Stored, NodeError> {
    let first = first_stored(geo).config;
    let current = establish(store, &first).map_err(failed)?;
    if current.config != first {
        return Err(NodeError::Usage(format!(
            "--workload {name}: etcd at {url} holds configuration {} (CM {}, {} machines) of another run under {DEFAULT_KEY}: delete the key to start a new cluster",
            current.config.id,
            current.config.cm,
            current.config.machines.len()
        )));
    }
    Ok(current)
}

/// `--workload leases` on this machine, its store flags checked
/// (`store_flags`).
pub fn run(
    o: &NodeOptions,
    cfg: &ClusterConfig,
    node: &NodeConfig,
    flags: StoreFlags,
) -> Result<u8, NodeError> {
    let geo = crate::node_txn::geometry(o, cfg)?;
    preflight_passes(cfg, o.id)?;
    cmdline::signals::install();
    if matches!(cfg.backend, Backend::Mlx5 { .. }) {
        return crate::node_mlx5::run_machine(o, cfg, node, geo, MachineWork::Leases(&flags));
    }
    let me = format!("loch node {}", o.id);
    let (machine, rv, _boot) =
        crate::node_txn::EmuMachine::boot(o, cfg, node, &me, flags.agreement(o))?;
    run_leases(o, geo, &me, &flags, rv, machine.cluster.machine_executors())
}

/// Said as a run with leases starts: why SIGINT/SIGTERM do not end it.
pub const SIGNALS_WAIT: &str = "SIGINT/SIGTERM do not cut it short: the other machines' leases \
     would take a machine that stopped early for a failed one";

impl StoreFlags {
    /// What every machine of a run with these flags (leases, or the bank
    /// with failure handling) must agree on at "memory-ready".
    pub fn agreement(&self, o: &NodeOptions) -> Option<String> {
        Some(format!(
            "--workload {} --lease-ms {} --seconds {} --etcd {}",
            self.workload, o.lease_ms, self.seconds, self.url
        ))
    }
}

/// Leases and reconfiguration on this machine, on any backend, once the
/// cluster is booted and connected (`rv` past "memory-ready"):
/// `executors` makes the lease core's and the reconfiguration core's
/// executors. Prints the JSON line; returns the exit code.
pub fn run_leases<N: nicdrv::Nic>(
    o: &NodeOptions,
    geo: txn::Geometry,
    me: &str,
    flags: &StoreFlags,
    mut rv: Rendezvous,
    executors: impl ExecutorFactory<N>,
) -> Result<u8, NodeError> {
    let (url, ms, timing, seconds) = (&flags.url, o.lease_ms, flags.timing, flags.seconds);
    let current = first_configuration(&flags.store, geo, url, "leases")?;
    rv.barrier("leases-configured").map_err(failed)?;
    say(format_args!(
        "{me}: machine role: leases of {ms} ms on {} machines, configuration {} in etcd at {url}, for {seconds} s ({SIGNALS_WAIT})",
        geo.machines, current.config.id
    ));
    let unix0 = nicdrv::clock::unix_ns();
    let m = o.id as u16;
    let r = run_machine_leases(
        geo,
        m,
        timing,
        flags.store.clone(),
        current,
        executors,
        (seconds * 1e9) as u64,
    )
    .map_err(failed)?;
    let rel = |at: u64| (at.saturating_sub(r.start_ns)) as f64 / 1e6;
    let unix = |at: u64| (unix0 + at.saturating_sub(r.start_ns)) as f64 / 1e6;
    let mut ok = true;
    let events: Vec<serde_json::Value> = match &r.events {
        Ok(ev) => ev
            .iter()
            .map(|e| json!({"event": e.name(), "at_ms": rel(e.at_ns()), "unix_ms": unix(e.at_ns()), "detail": format!("{e:?}")}))
            .collect(),
        Err(e) => {
            ok = false;
            vec![json!({"event": "error", "detail": e.to_string()})]
        }
    };
    let mut grants = 0;
    let mut refused = 0;
    for l in &r.leases {
        match &l.stats {
            Ok(s) => {
                grants += s.grants;
                refused += s.refused;
            }
            Err(_) => ok = false,
        }
    }
    let line = json!({
        "workload": "leases",
        "machine": m,
        "lease_ns": timing.lease_ns,
        "config": r.config.config.id,
        "cm": r.config.config.cm,
        "machines": r.config.config.machines.iter().map(|x| x.0).collect::<Vec<_>>(),
        "removed": r.removed,
        "suspicions": r.suspicions.iter().map(|s| json!({"machine": s.machine, "config": s.config, "at_ms": rel(s.at_ns), "unix_ms": unix(s.at_ns)})).collect::<Vec<_>>(),
        "events": events,
        "grants": grants,
        "refused": refused,
        "ok": ok,
    });
    cmdline::outln!("{line}");
    Ok(if ok { 0 } else { 1 })
}
