//! A small throughput driver on sim: YCSB-C (100% get) and YCSB-A (50% get,
//! 50% update) over preloaded keys, uniform and zipfian 0.99 (YCSB's
//! scrambled generator), with several compute nodes of many clients.
//! Prints throughput in virtual time, latency percentiles, and round trips
//! and retries per operation; asserts only what must hold (every get
//! hits; uniform read-only gets take two round trips, one when the
//! location cache answers, three when it turns its line down).
//!
//! `cargo test --release -p index --test cuckoo_throughput -- --nocapture`

mod common;
mod cuckoo_util;

use common::exec_cfg;
use cuckoo_util::*;
use index::cuckoo::{Cuckoo, CuckooStats};
use nicdrv::rng::Rng;
use nicdrv::sim::{RunEnd, SimConfig, World};
use std::cell::RefCell;
use std::rc::Rc;

/// YCSB's ZipfianGenerator (Gray et al., "Quickly generating billion-record
/// synthetic databases", SIGMOD 1994): ranks 0..n, rank 0 hottest.
struct Zipf {
    n: u64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
}

impl Zipf {
    fn new(n: u64, theta: f64) -> Zipf {
        let zeta = |m: u64| (1..=m).map(|i| 1.0 / (i as f64).powf(theta)).sum::<f64>();
        let zetan = zeta(n);
        let zeta2 = zeta(2);
        Zipf {
            n,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            eta: (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan),
        }
    }

    fn next(&self, rng: &mut Rng) -> u64 {
        let u = rng.unit();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1;
        }
        ((self.n as f64) * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64 % self.n
    }
}

/// YCSB scrambles ranks with FNV-1a so hot keys spread over the table.
fn scramble(rank: u64, n: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in rank.to_le_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h % n
}

#[derive(Default)]
struct Report {
    ops: u64,
    lat_ns: Vec<u64>,
    stats: CuckooStats,
    misses: u64,
}

const KEYS: u64 = 50_000;
const MEMORY_NODES: usize = 4;
const COMPUTE_NODES: usize = 4;
const THREADS_PER_CN: usize = 4;
const TASKS_PER_THREAD: usize = 4;
const MEASURE_NS: u64 = 1_000_000;

/// Runs one workload for `MEASURE_NS` of virtual time after a warm-up.
fn run(zipf: bool, get_pct: u64, seed: u64) -> (Report, u64) {
    let mut w = World::new(SimConfig {
        seed,
        memory_nodes: MEMORY_NODES,
        compute_nodes: COMPUTE_NODES,
        host_bytes: 64 << 20,
        dm_bytes: 64 << 10,
        ..Default::default()
    })
    .unwrap();
    let mut c = cfg(KEYS * 10 / 8, 8, 8);
    c.chunk.node_bytes = 64 << 20;
    let tables: Vec<_> = (0..COMPUTE_NODES)
        .map(|_| Cuckoo::new(c.clone()).unwrap())
        .collect();
    sim_create_table(&mut w, &tables[0]);
    // Preload in parallel, 16 loaders.
    for l in 0..16u64 {
        let t = w
            .add_thread((l % COMPUTE_NODES as u64) as u16, exec_cfg(1))
            .unwrap();
        let table = tables[(l % COMPUTE_NODES as u64) as usize].clone();
        w.spawn(t, move |ctx| async move {
            let mut c = table.client().unwrap();
            for k in (l..KEYS).step_by(16) {
                put_u64(&mut c, &ctx, k, k).await.unwrap();
            }
        })
        .unwrap();
    }
    assert_eq!(w.run(), RunEnd::Done);
    let start = w.now_ns() + 200_000;
    let end = start + MEASURE_NS;
    let report = Rc::new(RefCell::new(Report::default()));
    let zipf_gen = Rc::new(Zipf::new(KEYS, 0.99));
    let mut id = 0u64;
    for (cn, table) in tables.iter().enumerate() {
        for _ in 0..THREADS_PER_CN {
            let t = w.add_thread(cn as u16, exec_cfg(TASKS_PER_THREAD)).unwrap();
            for _ in 0..TASKS_PER_THREAD {
                let (table, rep, z) = (table.clone(), report.clone(), zipf_gen.clone());
                id += 1;
                let me = id;
                w.spawn(t, move |ctx| async move {
                    let mut c = table.client().unwrap();
                    let mut rng = Rng::stream(seed, nicdrv::rng::Domain::Client, me);
                    let mut lat = Vec::new();
                    let (mut ops, mut misses) = (0u64, 0u64);
                    let mut base = CuckooStats::default();
                    loop {
                        let now = ctx.now_ns();
                        if now >= end {
                            break;
                        }
                        if now < start {
                            base = c.stats;
                        }
                        let k = if zipf {
                            scramble(z.next(&mut rng), KEYS)
                        } else {
                            rng.below(KEYS)
                        };
                        if rng.below(100) < get_pct {
                            if get_u64(&mut c, &ctx, k).await.unwrap().is_none() {
                                misses += 1;
                            }
                        } else {
                            put_u64(&mut c, &ctx, k, rng.next_u64() >> 8).await.unwrap();
                        }
                        if now >= start {
                            ops += 1;
                            lat.push(ctx.now_ns() - now);
                        }
                    }
                    let mut r = rep.borrow_mut();
                    r.ops += ops;
                    r.misses += misses;
                    r.lat_ns.extend(lat);
                    let mut d = c.stats;
                    // Only the measured part.
                    d.gets -= base.gets;
                    d.puts -= base.puts;
                    d.get_round_trips -= base.get_round_trips;
                    d.put_round_trips -= base.put_round_trips;
                    d.retries -= base.retries;
                    d.snapshot_retries -= base.snapshot_retries;
                    d.cas_failures -= base.cas_failures;
                    d.eliminated -= base.eliminated;
                    d.cached_gets -= base.cached_gets;
                    d.cache_hits -= base.cache_hits;
                    r.stats += d;
                })
                .unwrap();
            }
        }
    }
    assert_eq!(w.run(), RunEnd::Done);
    let r = report.take();
    (r, w.events())
}

#[test]
fn ycsb_c_and_a_throughput_on_sim() {
    let wall = std::time::Instant::now();
    let clients = COMPUTE_NODES * THREADS_PER_CN * TASKS_PER_THREAD;
    eprintln!(
        "sim: {MEMORY_NODES} memory nodes, {COMPUTE_NODES} compute nodes x {THREADS_PER_CN} threads x \
         {TASKS_PER_THREAD} clients = {clients}; {KEYS} keys (8 B keys and values) in {} slots; \
         {} ms measured",
        KEYS * 10 / 8,
        MEASURE_NS / 1_000_000
    );
    eprintln!(
        "{:<8} {:<8} {:>8} {:>9} {:>9} {:>8} {:>8} {:>10} {:>9}",
        "workload", "keys", "Mops", "p50 us", "p99 us", "RT/get", "RT/put", "retry/op", "elim/put"
    );
    for (name, get_pct) in [("YCSB-C", 100u64), ("YCSB-A", 50)] {
        for zipf in [false, true] {
            let (mut r, _) = run(zipf, get_pct, 1);
            r.lat_ns.sort_unstable();
            let pct = |p: f64| r.lat_ns[((r.lat_ns.len() - 1) as f64 * p) as usize] as f64 / 1e3;
            let s = r.stats;
            let per = |a: u64, b: u64| a as f64 / b.max(1) as f64;
            eprintln!(
                "{:<8} {:<8} {:>8.2} {:>9.2} {:>9.2} {:>8.2} {:>8.2} {:>10.4} {:>9.4}",
                name,
                if zipf { "zipf.99" } else { "uniform" },
                r.ops as f64 / (MEASURE_NS as f64 / 1e9) / 1e6,
                pct(0.5),
                pct(0.99),
                per(s.get_round_trips, s.gets),
                per(s.put_round_trips, s.puts),
                per(s.retries, s.gets + s.puts),
                per(s.eliminated, s.puts),
            );
            assert_eq!(r.misses, 0, "{name}: a preloaded key was missed");
            assert!(r.ops > 1000);
            if !zipf && get_pct == 100 {
                // Read-only: 1 round trip from the location cache, 2 the
                // other way, 3 for a cached try turned down.
                let want = 2 * s.gets + s.cached_gets - 2 * s.cache_hits;
                assert!(
                    (per(s.get_round_trips, s.gets) - per(want, s.gets)).abs() < 0.01,
                    "{s:?}"
                );
            }
            eprintln!(
                "         gets answered from the location cache: {:.1}%",
                100.0 * per(s.cache_hits, s.gets)
            );
        }
    }
    eprintln!("wall time {:.1} s", wall.elapsed().as_secs_f64());
}
