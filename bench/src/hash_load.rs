//! `loch-bench hash-load`: Nessie's round trips against the load factor —
//! the curve of the Nessie slides (slide 51, "expected number of round
//! trips for a write operation", drawn without numbers). One client on the
//! simulator inserts distinct keys into an empty table until an insert
//! finds no room within the displacement search bound; after each insert
//! it updates present keys. Every operation is filed under the table's
//! load factor when it began. Reported per load-factor bucket: the mean
//! and 99th-percentile round trips of an insert and of an update, and the
//! moves of the inserts' displacement paths; and the load factor the
//! table reached.

use crate::args::ArgError;
use crate::outfile::check_file_target;
use crate::plot::{self, Chart, Scale, Series};
use index::cuckoo::{Cuckoo, CuckooConfig, CuckooError};
use nicdrv::rng::Rng;
use nicdrv::sim::{RunEnd, SimConfig, World};
use nicdrv::ExecutorConfig;
use serde_json::json;
use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;

/// `loch-bench hash-load`: round trips of inserts and updates against
/// the load factor.
#[derive(clap::Args, Debug)]
#[command(after_help = HASH_LOAD_AFTER_HELP)]
pub struct HashLoadArgs {
    /// Keys the table is sized for, 16 ..= 16777216: ceil(N / 8) buckets
    /// of 8 slots (rounded up to an even count)
    #[arg(long, value_name = "N", default_value_t = 65_536)]
    capacity: u64,
    /// Let the table grow online up to N keys, --capacity ..= 16777216 (it
    /// doubles when an insert finds no room); the load factor is then that of the size new keys
    /// go to, and the inserts that grew the table are reported apart
    #[arg(long, value_name = "N")]
    max_capacity: Option<u64>,
    /// Updates of present keys (drawn uniformly) after each insert, at
    /// most 64
    #[arg(long, value_name = "N", default_value_t = 1)]
    updates: u64,
    /// Buckets a displacement search may read before an insert gives up
    /// (the table's `max_search_buckets`), 2 ..= 65536
    #[arg(long, value_name = "N", default_value_t = 512)]
    max_search_buckets: usize,
    /// Memory nodes the table and its entries spread over, 1 ..= 64
    #[arg(long, value_name = "N", default_value_t = 8)]
    memory_nodes: usize,
    /// Width of a load-factor bucket, 0.001 ..= 0.5
    #[arg(long, value_name = "W", default_value_t = 0.05)]
    bucket: f64,
    /// The simulation's seed (also the keys drawn)
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// One JSON object on stdout
    #[arg(long)]
    json: bool,
    /// Write the curve as an SVG chart to FILE
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
}

const HASH_LOAD_AFTER_HELP: &str = "\
One client on the simulator (8-byte keys and values, the Sherman paper's network model),
inserting distinct keys into an empty table until an insert answers TableFull; after each
insert, --updates updates of present keys. Columns: load-factor bucket, inserts, their mean
and p99 round trips, updates, their mean and p99 round trips, the mean and longest
displacement path (moves) of the inserts. Then the load factor the table reached.
Exit codes: 0 done; 1 the benchmark failed (an operation other than the last insert failed);
2 bad input (one line naming it; nothing run); 130 stopped by SIGINT or SIGTERM.";

/// One operation: the load factor when it began, round trips, moves.
#[derive(Copy, Clone)]
struct Op {
    load: f64,
    insert: bool,
    round_trips: u64,
    moves: u64,
}

/// An insert that grew the table.
#[derive(Copy, Clone)]
struct Growth {
    /// Load factor of the old size when it began.
    load: f64,
    round_trips: u64,
    /// Virtual time it took, ns.
    ns: u64,
    /// Slots after.
    slots: u64,
}

/// What the client saw.
struct Measured {
    ops: Vec<Op>,
    growths: Vec<Growth>,
    keys: u64,
    slots: u64,
    /// Why the last insert failed: `None` when it was the table filling up.
    failure: Option<String>,
}

pub fn run(a: HashLoadArgs) -> Result<crate::run::Outcome, ArgError> {
    if a.capacity < 16 || a.capacity > 1 << 24 {
        return Err(ArgError(format!(
            "--capacity must be in 16..={} (got {})",
            1u64 << 24,
            a.capacity
        )));
    }
    // At least 0.001: the table has a row a bucket, and each row scans
    // every insert (a width of 1e-9 passed and then ran for days).
    if !(0.001..=0.5).contains(&a.bucket) {
        return Err(ArgError(format!(
            "--bucket must be in [0.001, 0.5] (got {})",
            a.bucket
        )));
    }
    // A displacement search reads up to this many buckets and compares
    // each with those before: past 65536 one insert can take hours.
    if !(2..=65_536).contains(&a.max_search_buckets) {
        return Err(ArgError(format!(
            "--max-search-buckets must be in 2..=65536 (got {})",
            a.max_search_buckets
        )));
    }
    if a.memory_nodes == 0 || a.memory_nodes > 64 {
        return Err(ArgError(format!(
            "--memory-nodes must be in 1..=64 (got {})",
            a.memory_nodes
        )));
    }
    if let Some(m) = a.max_capacity {
        if m < a.capacity || m > 1 << 24 {
            return Err(ArgError(format!(
                "--max-capacity must be in {}..={} (got {m})",
                a.capacity,
                1u64 << 24
            )));
        }
    }
    if a.updates > 64 {
        return Err(ArgError(format!(
            "--updates must be at most 64 (got {})",
            a.updates
        )));
    }
    // Every insert and update is kept until the table is full (for its
    // rows): about a key a slot of the largest size, each updated
    // `--updates` times.
    let ops = a
        .max_capacity
        .unwrap_or(a.capacity)
        .saturating_mul(1 + a.updates);
    crate::args::check_memory(
        || format!("the {ops} inserts and updates kept for the table's rows"),
        ops.saturating_mul(std::mem::size_of::<Op>() as u64),
    )?;
    if let Some(p) = &a.plot {
        check_file_target("--plot", p).map_err(ArgError)?;
    }
    let cfg = table_config(&a);
    cfg.check()
        .map_err(|e| ArgError(format!("the table: {e}")))?;
    let created = cfg.slots();
    let m = match measure(&a, cfg) {
        Ok(m) => m,
        Err(e) => {
            return Ok(crate::run::Outcome::Failed(format!(
                "benchmark failed: {e}"
            )))
        }
    };
    if cmdline::signals::stop_requested() {
        // As its help says: 130, nothing reported from a table not filled.
        cmdline::errln!(
            "loch-bench hash-load: stopped by SIGINT/SIGTERM before the table was full"
        );
        return Ok(crate::run::Outcome::Interrupted);
    }
    if let Some(why) = &m.failure {
        return Ok(crate::run::Outcome::Failed(format!(
            "an operation failed after {} inserts: {why}",
            m.keys
        )));
    }
    let rows = buckets(&m, a.bucket);
    let full = m.keys as f64 / m.slots as f64;
    if let Some(p) = &a.plot {
        let series = curve(&rows);
        let svg = plot::svg(&Chart {
            title: "Nessie: round trips of a write against the load factor",
            x_label: "load factor when the operation began",
            y_label: "round trips",
            x_scale: Scale::Linear,
            y_range: None,
            markers: true,
            series: &series,
        });
        if let Err(e) = crate::outfile::write_atomic(p, svg.as_bytes()) {
            return Ok(crate::run::Outcome::Failed(format!(
                "--plot {}: {e}",
                p.display()
            )));
        }
    }
    if a.json {
        cmdline::outln!(
            "{}",
            json!({
                "capacity": a.capacity,
                "slots": m.slots,
                "memory_nodes": a.memory_nodes,
                "max_search_buckets": a.max_search_buckets,
                "updates_per_insert": a.updates,
                "seed": a.seed,
                "max_capacity": a.max_capacity,
                "keys": m.keys,
                "full_at_load": full,
                "buckets": rows.iter().map(Row::json).collect::<Vec<_>>(),
                "growths": m.growths.iter().map(|g| json!({
                    "at_load": g.load,
                    "round_trips": g.round_trips,
                    "virtual_ns": g.ns,
                    "slots_after": g.slots,
                })).collect::<Vec<_>>(),
            })
        );
    } else {
        cmdline::outln!(
            "Nessie on sim: round trips against the load factor; 1 client, {} slots{} on {} memory nodes, \
             search bound {} buckets, {} update(s) per insert, seed {}",
            m.slots,
            if m.growths.is_empty() { String::new() } else { format!(" (grown from {created})") },
            a.memory_nodes,
            a.max_search_buckets,
            a.updates,
            a.seed
        );
        cmdline::outln!(
            "{:<11} {:>8} {:>8} {:>7} {:>8} {:>8} {:>7} {:>9} {:>8}",
            "load",
            "inserts",
            "ins mean",
            "ins p99",
            "updates",
            "upd mean",
            "upd p99",
            "disp mean",
            "disp max"
        );
        for r in &rows {
            cmdline::outln!("{}", r.line());
        }
        for g in &m.growths {
            cmdline::outln!(
                "grew to {} slots: the insert that found no room at load {:.4} took {} round trips, \
                 {:.2} ms virtual (not in the rows above)",
                g.slots,
                g.load,
                g.round_trips,
                g.ns as f64 / 1e6
            );
        }
        cmdline::outln!(
            "full: an insert found no room at load {full:.4} ({} keys in {} slots)",
            m.keys,
            m.slots
        );
    }
    Ok(crate::run::Outcome::finished())
}

/// The table: 8-byte keys and values, the bound from the flags.
fn table_config(a: &HashLoadArgs) -> CuckooConfig {
    let mut cfg = CuckooConfig::new(a.capacity, 8, 8, host_bytes(a));
    cfg.max_search_buckets = a.max_search_buckets;
    cfg.max_capacity = a.max_capacity.unwrap_or(a.capacity);
    // Every update is of a key the client found before: the location cache
    // plays no part in inserts and updates.
    cfg.location_cache_lines = 0;
    cfg
}

/// Host memory per memory node: the buckets, and an entry block (64
/// bytes) for each insert, each update and each move, spread over the
/// nodes, doubled for the allocator's chunking, plus 16 MiB.
fn host_bytes(a: &HashLoadArgs) -> u64 {
    let cap = a.max_capacity.unwrap_or(a.capacity).max(a.capacity);
    // Growing moves about half the keys at each doubling: two more
    // entries per key covers every move.
    let entries = cap * (4 + a.updates) * 64;
    let total = 2 * (cap * 8 + entries);
    (total / a.memory_nodes as u64 + (16 << 20)).next_multiple_of(1 << 20)
}

fn measure(a: &HashLoadArgs, cfg: CuckooConfig) -> Result<Measured, String> {
    let mut w = World::new(SimConfig {
        seed: a.seed,
        memory_nodes: a.memory_nodes,
        compute_nodes: 1,
        host_bytes: cfg.chunk.node_bytes,
        dm_bytes: 64 << 10,
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    let slots = cfg.slots();
    let table = Cuckoo::new(cfg).map_err(|e| e.to_string())?;
    let exec = ExecutorConfig {
        slots: 1,
        scratch_bytes_per_slot: 64 << 10,
        poll_batch: 32,
    };
    let th = w.add_thread(0, exec).map_err(|e| e.to_string())?;
    let out: Rc<RefCell<Option<Measured>>> = Rc::new(RefCell::new(None));
    let (o, seed, updates) = (out.clone(), a.seed, a.updates);
    w.spawn(th, move |ctx| async move {
        let mut m = Measured {
            ops: Vec::new(),
            growths: Vec::new(),
            keys: 0,
            slots,
            failure: None,
        };
        let mut c = match table.client() {
            Ok(c) => c,
            Err(e) => {
                m.failure = Some(e.to_string());
                *o.borrow_mut() = Some(m);
                return;
            }
        };
        if let Err(e) = c.create(&ctx).await {
            m.failure = Some(e.to_string());
            *o.borrow_mut() = Some(m);
            return;
        }
        let mut rng = Rng::new(seed ^ 0x6861_7368_6c6f_6164);
        let mut present: Vec<u64> = Vec::new();
        let mut value = 0u64;
        loop {
            if cmdline::signals::stop_requested() {
                m.failure = Some("stopped by a signal".into());
                break;
            }
            // Distinct keys: a fresh draw, its rank in the low bits.
            let k = (rng.next_u64() << 24) | present.len() as u64;
            // The load of the size new keys go to (`m.slots`: it grows).
            let load = present.len() as f64 / m.slots as f64;
            let (r0, m0, g0) = (
                ctx.counters().round_trips,
                c.stats.moves,
                c.stats.growth_steps,
            );
            let t0 = ctx.now_ns();
            value += 1;
            match c.put(&ctx, &k.to_le_bytes(), &value.to_le_bytes()).await {
                Ok(()) => {}
                Err(CuckooError::TableFull) => break,
                Err(e) => {
                    m.failure = Some(e.to_string());
                    break;
                }
            }
            let round_trips = ctx.counters().round_trips - r0;
            m.slots = c.shape().map_or(slots, |s| s.slots);
            if c.stats.growth_steps > g0 {
                m.growths.push(Growth {
                    load,
                    round_trips,
                    ns: ctx.now_ns() - t0,
                    slots: m.slots,
                });
            } else {
                m.ops.push(Op {
                    load,
                    insert: true,
                    round_trips,
                    moves: c.stats.moves - m0,
                });
            }
            present.push(k);
            let load = present.len() as f64 / m.slots as f64;
            for _ in 0..updates {
                let k = present[rng.below(present.len() as u64) as usize];
                let r0 = ctx.counters().round_trips;
                value += 1;
                if let Err(e) = c.put(&ctx, &k.to_le_bytes(), &value.to_le_bytes()).await {
                    m.failure = Some(e.to_string());
                    break;
                }
                m.ops.push(Op {
                    load,
                    insert: false,
                    round_trips: ctx.counters().round_trips - r0,
                    moves: 0,
                });
            }
            if m.failure.is_some() {
                break;
            }
        }
        m.keys = present.len() as u64;
        *o.borrow_mut() = Some(m);
    })
    .map_err(|e| e.to_string())?;
    match w.run() {
        RunEnd::Done => {}
        other => return Err(format!("the simulation ended early: {other:?}")),
    }
    let got = out.borrow_mut().take();
    got.ok_or_else(|| "the client did not finish".into())
}

/// One load-factor bucket's figures.
struct Row {
    from: f64,
    to: f64,
    inserts: Figures,
    updates: Figures,
    moves_mean: Option<f64>,
    moves_max: Option<u64>,
}

/// Round trips of one kind of operation in a bucket.
struct Figures {
    count: usize,
    mean: Option<f64>,
    p99: Option<u64>,
}

impl Figures {
    fn of(mut rts: Vec<u64>) -> Figures {
        rts.sort_unstable();
        let count = rts.len();
        if count == 0 {
            return Figures {
                count,
                mean: None,
                p99: None,
            };
        }
        // The nearest-rank 99th percentile.
        let rank = (count * 99).div_ceil(100).max(1);
        Figures {
            count,
            mean: Some(rts.iter().sum::<u64>() as f64 / count as f64),
            p99: Some(rts[rank - 1]),
        }
    }
}

/// The operations filed by the load factor they began at, in buckets of
/// `width`, the empty ones left out. One pass over the operations (a
/// pass a row took rows × operations: hours for a large table in fine
/// buckets).
fn buckets(m: &Measured, width: f64) -> Vec<Row> {
    let n = (1.0 / width).ceil() as usize;
    let from = |i: usize| i as f64 * width;
    // Per bucket: its inserts and its updates, in the order they ran.
    let mut by: Vec<(Vec<Op>, Vec<Op>)> = (0..n).map(|_| (Vec::new(), Vec::new())).collect();
    for o in &m.ops {
        // Bucket i holds loads in [from(i), from(i + 1)), the last one
        // every load from its start up: the quotient's guess, then moved
        // to where those bounds, computed as they are, put it.
        let mut i = ((o.load / width) as usize).min(n - 1);
        while i > 0 && o.load < from(i) {
            i -= 1;
        }
        while i + 1 < n && o.load >= from(i + 1) {
            i += 1;
        }
        let (ins, upd) = &mut by[i];
        if o.insert { ins } else { upd }.push(*o);
    }
    by.into_iter()
        .enumerate()
        .filter(|(_, (ins, upd))| !ins.is_empty() || !upd.is_empty())
        .map(|(i, (ins, upd))| {
            let moves: Vec<u64> = ins.iter().map(|o| o.moves).collect();
            Row {
                from: from(i),
                to: from(i + 1).min(1.0),
                moves_mean: (!moves.is_empty())
                    .then(|| moves.iter().sum::<u64>() as f64 / moves.len() as f64),
                moves_max: moves.iter().copied().max(),
                inserts: Figures::of(ins.iter().map(|o| o.round_trips).collect()),
                updates: Figures::of(upd.iter().map(|o| o.round_trips).collect()),
            }
        })
        .collect()
}

impl Row {
    fn json(&self) -> serde_json::Value {
        json!({
            "from": self.from,
            "to": self.to,
            "inserts": self.inserts.count,
            "insert_round_trips_mean": self.inserts.mean,
            "insert_round_trips_p99": self.inserts.p99,
            "updates": self.updates.count,
            "update_round_trips_mean": self.updates.mean,
            "update_round_trips_p99": self.updates.p99,
            "displacement_moves_mean": self.moves_mean,
            "displacement_moves_max": self.moves_max,
        })
    }

    fn line(&self) -> String {
        let f =
            |v: Option<f64>, w: usize| v.map_or(format!("{:>w$}", "-"), |x| format!("{x:>w$.2}"));
        let u = |v: Option<u64>, w: usize| v.map_or(format!("{:>w$}", "-"), |x| format!("{x:>w$}"));
        format!(
            "{:<11} {:>8} {} {} {:>8} {} {} {} {}",
            format!("{:.2}-{:.2}", self.from, self.to),
            self.inserts.count,
            f(self.inserts.mean, 8),
            u(self.inserts.p99, 7),
            self.updates.count,
            f(self.updates.mean, 8),
            u(self.updates.p99, 7),
            f(self.moves_mean, 9),
            u(self.moves_max, 8),
        )
    }
}

/// The curve: round trips against the load factor (each bucket at its
/// middle), mean and p99 of inserts and updates.
fn curve(rows: &[Row]) -> Vec<Series> {
    let mid = |r: &Row| (r.from + r.to) / 2.0;
    let line = |name: &str, get: &dyn Fn(&Row) -> Option<f64>| Series {
        name: name.into(),
        points: rows
            .iter()
            .filter_map(|r| get(r).map(|y| (mid(r), y)))
            .collect(),
    };
    vec![
        line("insert, mean", &|r| r.inserts.mean),
        line("insert, p99", &|r| r.inserts.p99.map(|x| x as f64)),
        line("update, mean", &|r| r.updates.mean),
        line("update, p99", &|r| r.updates.p99.map(|x| x as f64)),
    ]
}
