//! `loch-bench hash-grow`: YCSB-A on the hash table while it doubles.
//! Clients on several compute nodes get and update preloaded keys
//! (zipfian) throughout; after a quiet stretch one more client inserts
//! fresh keys until the table, preloaded nearly full, finds no room and
//! grows (`index::cuckoo::grow`). Reported: YCSB-A throughput before the
//! growth and while it runs (from the insert that started it to the one
//! that ended it), their ratio, and the longest and 99th-percentile
//! latency of the YCSB-A operations that ran during it.

use crate::args::ArgError;
use crate::workload::KeyDist;
use index::cuckoo::{Cuckoo, CuckooConfig, CuckooError};
use nicdrv::rng::Rng;
use nicdrv::sim::{RunEnd, SimConfig, World};
use nicdrv::ExecutorConfig;
use serde_json::json;
use std::cell::RefCell;
use std::rc::Rc;

/// `loch-bench hash-grow`: YCSB-A throughput and latency while the table
/// doubles.
#[derive(clap::Args, Debug)]
#[command(after_help = HASH_GROW_AFTER_HELP)]
pub struct HashGrowArgs {
    /// Keys the table is made for, 1024 ..= 4194304 (it may grow to twice
    /// that)
    #[arg(long, value_name = "N", default_value_t = 32_768)]
    capacity: u64,
    /// Keys preloaded, as a share of the slots, 0.1 ..= 0.99
    #[arg(long, value_name = "F", default_value_t = 0.97)]
    fill: f64,
    /// Memory nodes (1 ..= 64)
    #[arg(long, value_name = "N", default_value_t = 8)]
    memory_nodes: usize,
    /// Compute nodes running YCSB-A (1 ..= 64)
    #[arg(long, value_name = "N", default_value_t = 4)]
    compute_nodes: usize,
    /// YCSB-A clients per compute node, one per thread (1 ..= 64)
    #[arg(long, value_name = "N", default_value_t = 8)]
    threads: usize,
    /// Key skew of the gets and updates
    #[arg(long, value_name = "THETA", default_value_t = 0.99)]
    zipf: f64,
    /// Virtual milliseconds of YCSB-A before the inserts start, and after
    /// the growth ends (1 ..= 1000)
    #[arg(long, value_name = "MS", default_value_t = 5)]
    quiet_ms: u64,
    /// The simulation's seed
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// One JSON object on stdout
    #[arg(long)]
    json: bool,
}

const HASH_GROW_AFTER_HELP: &str = "\
On the simulator (the Sherman paper's network model), 8-byte keys and values, the table's
default time bounds (W 2 ms, G 20 ms, R 1 ms: phases 23 ms apart). The growth's window runs
from the start of the insert that found no room to the end of the insert that saw the table
stable at its new size. Exit codes: 0 done; 1 the benchmark failed; 2 bad input (one line
naming it; nothing run); 130 stopped by SIGINT or SIGTERM.";

/// One YCSB-A operation: when it started and ended (virtual ns).
#[derive(Copy, Clone)]
struct Done {
    start: u64,
    end: u64,
}

/// What the run saw.
#[derive(Default)]
struct Seen {
    ops: Vec<Done>,
    /// From the start of the insert that began the growth to the end of
    /// the one after which the table was stable at its new size.
    growth: Option<(u64, u64)>,
    /// When YCSB-A measuring began and the inserts began.
    measure_from: u64,
    inserts_from: u64,
    inserts: u64,
    slots_before: u64,
    slots_after: u64,
    failure: Option<String>,
}

pub fn run(a: HashGrowArgs) -> Result<crate::run::Outcome, ArgError> {
    if a.capacity < 1024 || a.capacity > 1 << 22 {
        return Err(ArgError(format!(
            "--capacity must be in 1024..={} (got {})",
            1u64 << 22,
            a.capacity
        )));
    }
    if !(0.1..=0.99).contains(&a.fill) {
        return Err(ArgError(format!(
            "--fill must be in 0.1..=0.99 (got {})",
            a.fill
        )));
    }
    for (name, v, max) in [
        ("--memory-nodes", a.memory_nodes, 64),
        ("--compute-nodes", a.compute_nodes, 64),
        ("--threads", a.threads, 64),
    ] {
        if v == 0 || v > max {
            return Err(ArgError(format!("{name} must be in 1..={max} (got {v})")));
        }
    }
    if !(a.zipf == 0.0 || crate::ycsb::zipf_constant_ok(a.zipf)) {
        return Err(ArgError(format!(
            "--zipf must be 0 (uniform) or in (0,1) or (1,5], got {}",
            a.zipf
        )));
    }
    if a.quiet_ms == 0 || a.quiet_ms > 1000 {
        return Err(ArgError(format!(
            "--quiet-ms must be in 1..=1000 (got {})",
            a.quiet_ms
        )));
    }
    let cfg = table_config(&a);
    cfg.check()
        .map_err(|e| ArgError(format!("the table: {e}")))?;
    let seen = measure(&a, cfg);
    if cmdline::signals::stop_requested() {
        // Nothing is reported before the growth was measured whole.
        cmdline::errln!("loch-bench hash-grow: {STOPPED}");
        return Ok(crate::run::Outcome::Interrupted);
    }
    let seen = match seen {
        Ok(s) => s,
        Err(e) => {
            return Ok(crate::run::Outcome::Failed(format!(
                "benchmark failed: {e}"
            )))
        }
    };
    if let Some(why) = &seen.failure {
        return Ok(crate::run::Outcome::Failed(why.clone()));
    }
    let Some((g0, g1)) = seen.growth else {
        return Ok(crate::run::Outcome::Failed(
            "the table did not grow (raise --fill)".into(),
        ));
    };
    let before = rate(&seen.ops, seen.measure_from, seen.inserts_from);
    let during = rate(&seen.ops, g0, g1);
    let mut lat: Vec<u64> = seen
        .ops
        .iter()
        .filter(|o| o.end > g0 && o.start < g1)
        .map(|o| o.end - o.start)
        .collect();
    lat.sort_unstable();
    let p99 = lat
        .get(((lat.len() * 99).div_ceil(100)).max(1) - 1)
        .copied()
        .unwrap_or(0);
    let max = lat.last().copied().unwrap_or(0);
    let ratio = during / before.max(1e-9);
    if a.json {
        cmdline::outln!(
            "{}",
            json!({
                "capacity": a.capacity,
                "fill": a.fill,
                "memory_nodes": a.memory_nodes,
                "compute_nodes": a.compute_nodes,
                "threads": a.threads,
                "zipf": a.zipf,
                "seed": a.seed,
                "slots_before": seen.slots_before,
                "slots_after": seen.slots_after,
                "inserts": seen.inserts,
                "growth_virtual_ns": g1 - g0,
                "ycsb_a_ops_per_sec_before": before,
                "ycsb_a_ops_per_sec_during": during,
                "during_over_before": ratio,
                "ops_during": lat.len(),
                "latency_p99_ns_during": p99,
                "latency_max_ns_during": max,
            })
        );
    } else {
        cmdline::outln!(
            "Nessie on sim: YCSB-A (zipf {}) while the table doubles; {} compute nodes x {} clients, \
             {} memory nodes, seed {}",
            a.zipf,
            a.compute_nodes,
            a.threads,
            a.memory_nodes,
            a.seed
        );
        cmdline::outln!(
            "table: {} -> {} slots, preloaded to {:.0}%; {} inserts by one more client; the growth took {:.2} ms virtual",
            seen.slots_before,
            seen.slots_after,
            a.fill * 100.0,
            seen.inserts,
            (g1 - g0) as f64 / 1e6
        );
        cmdline::outln!(
            "YCSB-A: {:.2} Mops/s before, {:.2} Mops/s during ({:.2}x); during it {} operations, p99 {:.1} us, longest {:.1} us",
            before / 1e6,
            during / 1e6,
            ratio,
            lat.len(),
            p99 as f64 / 1e3,
            max as f64 / 1e3
        );
    }
    Ok(crate::run::Outcome::finished())
}

/// Operations per second of those that ended within `[from, to)`.
fn rate(ops: &[Done], from: u64, to: u64) -> f64 {
    if to <= from {
        return 0.0;
    }
    let n = ops.iter().filter(|o| o.end >= from && o.end < to).count();
    n as f64 * 1e9 / (to - from) as f64
}

fn table_config(a: &HashGrowArgs) -> CuckooConfig {
    // Entries: a key's first, its updates (reused after G), its moves.
    let per_node =
        (a.capacity * 2 * 64 * 16 / a.memory_nodes as u64 + (64 << 20)).next_multiple_of(1 << 20);
    let mut cfg = CuckooConfig::new(a.capacity, 8, 8, per_node);
    cfg.max_capacity = cfg.slots() * 2;
    cfg
}

fn measure(a: &HashGrowArgs, cfg: CuckooConfig) -> Result<Seen, String> {
    measure_keeping(a, cfg, None)
}

/// [`measure`], keeping at most `kept_max` YCSB-A operations (`None`: as
/// many as half the memory left after the preload holds).
fn measure_keeping(
    a: &HashGrowArgs,
    cfg: CuckooConfig,
    kept_max: Option<u64>,
) -> Result<Seen, String> {
    let mut w = World::new(SimConfig {
        seed: a.seed,
        memory_nodes: a.memory_nodes,
        compute_nodes: a.compute_nodes,
        host_bytes: cfg.chunk.node_bytes,
        dm_bytes: 64 << 10,
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    let slots = cfg.slots();
    let records = (slots as f64 * a.fill) as u64;
    let tables: Vec<_> = (0..a.compute_nodes)
        .map(|_| Cuckoo::new(cfg.clone()))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let exec = ExecutorConfig {
        slots: 1,
        scratch_bytes_per_slot: 256 << 10,
        poll_batch: 32,
    };
    let seen = Rc::new(RefCell::new(Seen {
        slots_before: slots,
        ..Seen::default()
    }));
    // The first failure is the run's; every loader, client and the
    // inserter stops at its next step once there is one.
    let fail = |s: &Rc<RefCell<Seen>>, e: String| {
        s.borrow_mut().failure.get_or_insert(e);
    };
    let failed = |s: &Rc<RefCell<Seen>>| s.borrow().failure.is_some();
    // Create, then preload in parallel: one loader per compute node.
    let th = w.add_thread(0, exec).map_err(|e| e.to_string())?;
    let (t, s) = (tables[0].clone(), seen.clone());
    w.spawn(th, move |ctx| async move {
        let r = async { t.client()?.create(&ctx).await }.await;
        if let Err(e) = r {
            fail(&s, format!("create: {e}"));
        }
    })
    .map_err(|e| e.to_string())?;
    run_all(&mut w)?;
    let loaders = a.compute_nodes as u64;
    for (cn, table) in tables.iter().enumerate() {
        let th = w.add_thread(cn as u16, exec).map_err(|e| e.to_string())?;
        let (t, s) = (table.clone(), seen.clone());
        w.spawn(th, move |ctx| async move {
            let mut c = match t.client() {
                Ok(c) => c,
                Err(e) => return fail(&s, e.to_string()),
            };
            let mut k = cn as u64;
            // SIGINT/SIGTERM, or another loader's failure: the preload
            // ends, and with it the run.
            while k < records && !cmdline::signals::stop_requested() && !failed(&s) {
                if let Err(e) = c.put(&ctx, &k.to_le_bytes(), &k.to_le_bytes()).await {
                    return fail(&s, format!("preload of key {k}: {e}"));
                }
                k += loaders;
            }
        })
        .map_err(|e| e.to_string())?;
    }
    run_all(&mut w)?;
    if let Some(e) = seen.borrow().failure.clone() {
        return Err(e);
    }
    // YCSB-A clients, and the inserter.
    let start = w.now_ns();
    let quiet = a.quiet_ms * 1_000_000;
    let stop = Rc::new(std::cell::Cell::new(u64::MAX));
    // Every YCSB-A operation is kept until the table grew (for the rates
    // and latencies around the growth): at most half of what this
    // machine's memory holds once the table is preloaded, and a run that
    // reaches it fails there rather than being killed for memory (a low
    // --fill with many clients recorded billions).
    let kept_max = kept_max.unwrap_or_else(|| {
        crate::args::half_memory_holds(
            crate::args::available_bytes(),
            0,
            std::mem::size_of::<Done>() as u64,
        )
    });
    {
        let mut s = seen.borrow_mut();
        s.measure_from = start + quiet / 5;
        s.inserts_from = start + quiet;
    }
    for (cn, table) in tables.iter().enumerate() {
        for i in 0..a.threads {
            let th = w.add_thread(cn as u16, exec).map_err(|e| e.to_string())?;
            let (t, s, stop) = (table.clone(), seen.clone(), stop.clone());
            let dist = KeyDist::new(records, a.zipf);
            let seed = a.seed ^ ((cn * 1000 + i) as u64) << 20;
            w.spawn(th, move |ctx| async move {
                let mut c = match t.client() {
                    Ok(c) => c,
                    Err(e) => return fail(&s, e.to_string()),
                };
                let mut rng = Rng::new(seed);
                let mut v = seed;
                // Until a quiet period after the growth, a signal, or a
                // failure anywhere.
                while ctx.now_ns() < stop.get()
                    && !cmdline::signals::stop_requested()
                    && !failed(&s)
                {
                    let k = dist.next(&mut rng);
                    let t0 = ctx.now_ns();
                    let r = if rng.below(2) == 0 {
                        c.get(&ctx, &k.to_le_bytes()).await.map(drop)
                    } else {
                        v += 1;
                        c.put(&ctx, &k.to_le_bytes(), &v.to_le_bytes()).await
                    };
                    if let Err(e) = r {
                        return fail(&s, format!("YCSB-A on key {k}: {e}"));
                    }
                    let mut sn = s.borrow_mut();
                    if sn.ops.len() as u64 >= kept_max {
                        drop(sn);
                        return fail(
                            &s,
                            format!(
                                "{kept_max} operations recorded before the table grew, half of what \
                                 this machine's available memory holds: fewer --compute-nodes × \
                                 --threads, or a --fill nearer growth"
                            ),
                        );
                    }
                    sn.ops.push(Done {
                        start: t0,
                        end: ctx.now_ns(),
                    });
                }
            })
            .map_err(|e| e.to_string())?;
        }
    }
    let th = w.add_thread(0, exec).map_err(|e| e.to_string())?;
    let (t, s, stop2) = (tables[0].clone(), seen.clone(), stop.clone());
    w.spawn(th, move |ctx| async move {
        let r = async {
            let mut c = t.client().map_err(|e| e.to_string())?;
            let from = s.borrow().inserts_from;
            if let Ok(sl) = ctx.sleep_until(from) {
                sl.await;
            }
            let mut k = 1u64 << 40;
            loop {
                if cmdline::signals::stop_requested() {
                    return Err(STOPPED.to_string());
                }
                if failed(&s) {
                    // A client's failure failed the run: no more inserts.
                    return Ok(());
                }
                let t0 = ctx.now_ns();
                let steps = c.stats.growth_steps;
                match c.put(&ctx, &k.to_le_bytes(), &k.to_le_bytes()).await {
                    Ok(()) => {}
                    Err(CuckooError::TableFull) => return Err("the table never grew".into()),
                    Err(e) => return Err(format!("insert: {e}")),
                }
                s.borrow_mut().inserts += 1;
                k += 1;
                if c.stats.growth_steps > steps {
                    let shape = c.shape().ok_or("no view")?;
                    let mut sn = s.borrow_mut();
                    sn.growth = Some((t0, ctx.now_ns()));
                    sn.slots_after = shape.slots;
                    return Ok(());
                }
                // The table holds at most its slots: more inserts than
                // that without a growth is the table's failure. (Once a
                // time limit, 100 quiet periods, which a low --fill with a
                // short --quiet-ms outran while still filling the table.)
                let n = s.borrow().inserts;
                if n > slots {
                    return Err(format!(
                        "no growth after {n} inserts, more keys than the table's {slots} slots"
                    ));
                }
            }
        }
        .await;
        if let Err(e) = r {
            fail(&s, e);
        }
        // The YCSB-A clients stop one quiet period after this.
        stop2.set(ctx.now_ns() + quiet);
    })
    .map_err(|e| e.to_string())?;
    run_all(&mut w)?;
    let mut s = seen.borrow_mut();
    Ok(std::mem::take(&mut *s))
}

/// Why a run that a signal stopped reports nothing.
const STOPPED: &str = "stopped by SIGINT/SIGTERM before the growth was measured";

fn run_all(w: &mut World) -> Result<(), String> {
    match w.run() {
        RunEnd::Done => Ok(()),
        other => Err(format!("the simulation ended early: {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// A run whose clients fail (here: they keep more operations than it
    /// may) stops there: the inserter never starts the growth, and no
    /// client goes on past the failure.
    #[test]
    fn a_failed_run_stops_its_clients_and_its_inserts() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            a: HashGrowArgs,
        }
        let argv = ["hash-grow", "--capacity", "2048", "--compute-nodes", "2"];
        let a = Cli::try_parse_from(argv.iter().chain(&["--threads", "2"]))
            .unwrap()
            .a;
        let seen = measure_keeping(&a, table_config(&a), Some(500)).unwrap();
        let why = seen.failure.as_deref().unwrap_or("none");
        assert!(why.contains("500 operations recorded"), "{why}");
        assert_eq!(seen.ops.len(), 500);
        assert_eq!(seen.inserts, 0, "inserts after the run failed");
        assert!(seen.growth.is_none());

        // Without the bound the same run grows the table.
        let seen = measure_keeping(&a, table_config(&a), None).unwrap();
        assert!(seen.failure.is_none(), "{:?}", seen.failure);
        assert!(seen.growth.is_some() && seen.inserts > 0);
    }
}
