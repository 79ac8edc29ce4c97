//! Concurrent histories of the cuckoo table, checked for per-key
//! linearizability by `history::map`: on sim across seeds (several
//! compute nodes, each with its own table handle; READs land line by line
//! in random order, so collects tear), and on emu threads. Tables are kept
//! nearly full so displacement runs all the time, and one test races
//! displacement against gets and puts of the keys being moved. Every run
//! ends with an audit of the table's memory: no key committed twice.

mod common;
mod cuckoo_util;

use common::*;
use cuckoo_util::*;
use history::map::{History, Recorder};
use index::cuckoo::{Cuckoo, CuckooConfig, CuckooStats};
use nicdrv::sim::{for_each_seed, Fault, FaultKind, RunEnd, SimConfig, World};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

/// A short window and grace period, so that entries are reused many times
/// within a run of a few virtual milliseconds.
fn fast_reuse(mut c: CuckooConfig) -> CuckooConfig {
    c.window_ns = 50_000;
    c.reuse_grace_ns = 200_000;
    c.stale_ns = 100_000;
    c
}

/// Loads `items` with one client.
fn sim_preload(w: &mut World, t: &Arc<Cuckoo>, items: Vec<(u64, u64)>) {
    let t = t.clone();
    sim_task(w, move |ctx| async move {
        let mut c = t.client().unwrap();
        for (k, v) in items {
            put_u64(&mut c, &ctx, k, v).await.unwrap();
        }
    });
}

/// `cns` compute nodes × `threads` threads × 2 tasks, client `i` running
/// `wl(i)`; returns the history, the summed statistics and the world.
fn sim_history(
    seed: u64,
    cfg: &CuckooConfig,
    cns: usize,
    threads: usize,
    preload: &BTreeMap<u64, u64>,
    faults: Vec<Fault>,
    wl: impl Fn(u32) -> Workload,
) -> (History, CuckooStats, World) {
    let sim = SimConfig {
        seed,
        memory_nodes: 3,
        compute_nodes: cns,
        host_bytes: HOST,
        dm_bytes: DM,
        faults,
        ..Default::default()
    };
    sim_history_in(sim, cfg, threads, preload, wl)
}

/// As [`sim_history`], on the cluster `sim` describes.
fn sim_history_in(
    sim: SimConfig,
    cfg: &CuckooConfig,
    threads: usize,
    preload: &BTreeMap<u64, u64>,
    wl: impl Fn(u32) -> Workload,
) -> (History, CuckooStats, World) {
    let (seed, cns) = (sim.seed, sim.compute_nodes);
    let mut w = World::new(sim).unwrap();
    let tables: Vec<Arc<Cuckoo>> = (0..cns)
        .map(|_| Cuckoo::new(cfg.clone()).unwrap())
        .collect();
    sim_create_table(&mut w, &tables[0]);
    sim_preload(
        &mut w,
        &tables[0],
        preload.iter().map(|(&k, &v)| (k, v)).collect(),
    );
    let h = Rc::new(RefCell::new(History::new()));
    let sink: StatsSink = Arc::new(Mutex::new(CuckooStats::default()));
    let mut me = 1u32;
    for (cn, table) in tables.iter().enumerate() {
        for _ in 0..threads {
            let t = w.add_thread(cn as u16, exec_cfg(2)).unwrap();
            for _ in 0..2 {
                let c = table.client().unwrap();
                let (rec, sink, wl, id) = (Rec::Local(h.clone()), sink.clone(), wl(me), me);
                w.spawn(t, move |ctx| {
                    random_client(ctx, c, rec, id, seed, wl, turn_clock, sink)
                })
                .unwrap();
                me += 1;
            }
        }
    }
    assert_eq!(w.run(), RunEnd::Done, "seed {seed}: clients did not finish");
    let hist = h.borrow().clone();
    let stats = *sink.lock().unwrap();
    (hist, stats, w)
}

/// Random gets, puts and deletes on 120 keys in a 96-slot table (about 80
/// keys present: 83% full, displacing constantly, now and then full), 12
/// clients on 3 compute nodes.
#[test]
fn cuckoo_histories_are_linearizable_on_sim() {
    let total = RefCell::new(CuckooStats::default());
    for_each_seed("cuckoo_histories_are_linearizable_on_sim", 8, |seed| {
        let cfg = fast_reuse(cfg(96, 8, 120));
        let keys = Arc::new((0..120u64).collect::<Vec<_>>());
        let (h, stats, w) = sim_history(seed, &cfg, 3, 2, &BTreeMap::new(), vec![], |_| Workload {
            put: 5,
            get: 3,
            keys: keys.clone(),
            ops: 150,
            leave: false,
            verb_errors: None,
        });
        let v = h.check(&BTreeMap::new());
        assert!(v.is_ok(), "seed {seed}: {v:?}");
        audit_sim(&w, 8);
        *total.borrow_mut() += stats;
    });
    let total = total.into_inner();
    eprintln!("{total:?}");
    assert!(total.moves > 0, "no displacement happened");
    assert!(total.entries_reused > 0, "no entry was reused");
    // Gets went through the location cache under concurrent updates,
    // deletes and moves of their keys, and were turned down by it too.
    assert!(total.cache_hits > 0, "{total:?}");
    assert!(total.cached_gets > total.cache_hits, "{total:?}");
}

/// The histories of the test above with links cut now and then: each of
/// compute nodes 1 and 2 loses its link to one of the three memory nodes
/// four times, at seed-drawn instants in the first 2 ms, for 20 to 300 µs
/// each (a request lost in a cut fails after the 1 ms transport timeout,
/// and every one behind it on its queue pair with it). Their clients'
/// operations that fail with a verb error are recorded as pending (a put
/// may have claimed or committed its slot, a delete may have cleared
/// it), and they go on once the link carries packets again; node 0's,
/// whose links stay up, never fail. Every history is per-key
/// linearizable and the table's memory audits clean (no key committed
/// twice), whatever the cut clients left behind.
#[test]
fn cuckoo_histories_through_cut_links_on_sim() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let errors = Arc::new(AtomicU64::new(0));
    let total = RefCell::new(CuckooStats::default());
    for_each_seed("cuckoo_histories_through_cut_links_on_sim", 8, |seed| {
        let cfg = fast_reuse(cfg(96, 8, 120));
        let keys = Arc::new((0..120u64).collect::<Vec<_>>());
        let faults = cut_links(seed, &[1, 2], 3, 4, 100_000..2_000_000, 20_000..300_000);
        let (h, stats, w) =
            sim_history(seed, &cfg, 3, 2, &BTreeMap::new(), faults, |me| Workload {
                put: 5,
                get: 3,
                keys: keys.clone(),
                ops: 300,
                leave: false,
                verb_errors: (me > 4).then(|| errors.clone()),
            });
        let v = h.check(&BTreeMap::new());
        assert!(v.is_ok(), "seed {seed}: {v:?}");
        audit_sim(&w, 8);
        // Relaxed: read between runs, on this thread (the simulated
        // cluster runs on it too).
        let failed = errors.load(Ordering::Relaxed);
        eprintln!("seed {seed}: operations failed by cuts so far {failed}");
        *total.borrow_mut() += stats;
    });
    let total = total.into_inner();
    // Relaxed: read after every run, on the thread that ran them.
    assert!(
        errors.load(Ordering::Relaxed) > 0,
        "no cut hit an operation"
    );
    assert!(total.moves > 0, "no displacement happened: {total:?}");
}

/// The table and cluster of the tests that run memory out: one memory
/// node of 48 chunks of 4 KiB, three compute nodes, W = 200 µs and
/// G = 2 ms.
fn short_of_memory(seed: u64) -> (CuckooConfig, SimConfig) {
    let (mut cfg, node_bytes) = on_chunks(cfg(128, 8, 200), 48);
    cfg.window_ns = 200_000;
    cfg.reuse_grace_ns = 2_000_000;
    cfg.stale_ns = 400_000;
    let sim = SimConfig {
        seed,
        memory_nodes: 1,
        compute_nodes: 3,
        host_bytes: node_bytes,
        dm_bytes: DM,
        ..Default::default()
    };
    (cfg, sim)
}

/// A memory node filled to its last chunk by what puts hold back: 12
/// clients on 3 compute nodes put, get and delete 96 keys on one memory
/// node of 48 chunks of 4 KiB, and every entry a put or delete unlinks
/// waits out G = 2 ms before its client reuses it. The records take a
/// tenth of the node; the retired entries outgrow it, and puts then wait
/// for their own retired blocks rather than fail (an allocation error
/// fails the test). Every history is per-key linearizable.
#[test]
fn cuckoo_puts_wait_for_retired_entries_when_memory_runs_out_on_sim() {
    let total = RefCell::new(CuckooStats::default());
    for_each_seed(
        "cuckoo_puts_wait_for_retired_entries_when_memory_runs_out_on_sim",
        4,
        |seed| {
            let (cfg, sim) = short_of_memory(seed);
            let keys = Arc::new((0..96u64).collect::<Vec<_>>());
            let (h, stats, w) = sim_history_in(sim, &cfg, 2, &BTreeMap::new(), |_| Workload {
                put: 6,
                get: 2,
                keys: keys.clone(),
                ops: 500,
                leave: false,
                verb_errors: None,
            });
            let v = h.check(&BTreeMap::new());
            assert!(v.is_ok(), "seed {seed}: {v:?}");
            audit_sim(&w, 8);
            eprintln!(
                "seed {seed}: waits {} reused {} allocated {}",
                stats.entry_waits, stats.entries_reused, stats.entries_allocated
            );
            *total.borrow_mut() += stats;
        },
    );
    let total = total.into_inner();
    assert!(total.entry_waits > 0, "memory never ran out: {total:?}");
}

/// Memory out, with the entries freed on other compute nodes than the one
/// that needs them: one memory node of 48 chunks of 4 KiB; the 4 clients
/// of compute node 0 only put, the 8 of compute nodes 1 and 2 only delete,
/// over 96 keys. Node 0's puts, mostly inserts, use the memory up, and
/// their own updates return too few entries to go on; the entries the
/// deletes unlink are retired on the other two compute nodes, which lend
/// them to the memory node's pool (`index::cuckoo::lend`), and node 0's
/// puts borrow them; node 2's clients leave the table while the puts run
/// (`lend_all`). Without lending, a put fails out of memory (which
/// fails the test). Every history is per-key linearizable, the
/// table's memory audits clean, and some lends and borrows lost their
/// head CAS to another and tried again.
#[test]
fn cuckoo_puts_borrow_entries_other_compute_nodes_freed_on_sim() {
    let total = RefCell::new(CuckooStats::default());
    for_each_seed(
        "cuckoo_puts_borrow_entries_other_compute_nodes_freed_on_sim",
        4,
        |seed| {
            let (cfg, sim) = short_of_memory(seed);
            let keys = Arc::new((0..96u64).collect::<Vec<_>>());
            // Clients 1..=4 are compute node 0's (2 threads × 2 tasks).
            // Compute node 1's deletes, most of them of absent keys and
            // quick, run on past the puts: a compute node lends what its
            // clients hold only while they run, unless it leaves the
            // table. Compute node 2's clients (9..=12) leave after 3000
            // deletes, while the puts run: each lends all it holds and
            // its handle's spares (`lend_all`).
            let (h, stats, w) = sim_history_in(sim, &cfg, 2, &BTreeMap::new(), |me| {
                lenders_and_borrowers(&keys, me)
            });
            let v = h.check(&BTreeMap::new());
            assert!(v.is_ok(), "seed {seed}: {v:?}");
            audit_sim(&w, 8);
            eprintln!(
                "seed {seed}: borrowed {} lent {} reused {} allocated {} waits {} \
                 CASes lost: lend {} borrow {}",
                stats.entries_borrowed,
                stats.entries_lent,
                stats.entries_reused,
                stats.entries_allocated,
                stats.entry_waits,
                stats.lend_cas_lost,
                stats.borrow_cas_lost
            );
            *total.borrow_mut() += stats;
        },
    );
    let total = total.into_inner();
    assert!(
        total.entries_borrowed > 0,
        "nothing was borrowed: {total:?}"
    );
    // The histories cover a head CAS that lost to another lend or borrow
    // and tried again from the head it found.
    assert!(
        total.lend_cas_lost > 0 && total.borrow_cas_lost > 0,
        "no pool CAS was lost: {total:?}"
    );
}

/// The workload of the lending tests on [`short_of_memory`]'s cluster:
/// compute node 0's clients (1..=4) put, the others delete, over `keys`.
fn lenders_and_borrowers(keys: &Arc<Vec<u64>>, me: u32) -> Workload {
    Workload {
        put: if me <= 4 { 10 } else { 0 },
        get: 0,
        keys: keys.clone(),
        ops: match me {
            1..=4 => 1500,
            5..=8 => 12000,
            _ => 3000,
        },
        leave: me > 8,
        verb_errors: None,
    }
}

/// The lending of the test above, with the lenders' links cut now and
/// then: each of compute nodes 1 and 2 loses its link to the memory node
/// ten times, at seed-drawn instants from 1 to 40 ms, for 50 to 500 µs
/// each. Their operations that fail with a verb error are recorded as
/// pending, and they go on once the link carries packets again (a
/// request lost in a cut fails after the 1 ms transport timeout, and
/// every one behind it on its queue pair with it). Node 0's puts, whose
/// link stays up, never fail; every history is per-key linearizable, the
/// table's memory audits clean, and some lends and borrows met a fault.
#[test]
fn cuckoo_puts_borrow_entries_through_cut_links_on_sim() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let total = RefCell::new(CuckooStats::default());
    let errors = Arc::new(AtomicU64::new(0));
    for_each_seed(
        "cuckoo_puts_borrow_entries_through_cut_links_on_sim",
        4,
        |seed| {
            let (cfg, mut sim) = short_of_memory(seed);
            sim.faults = cut_links(seed, &[1, 2], 1, 10, 1_000_000..40_000_000, 50_000..500_000);
            let keys = Arc::new((0..96u64).collect::<Vec<_>>());
            let (h, stats, w) = sim_history_in(sim, &cfg, 2, &BTreeMap::new(), |me| Workload {
                verb_errors: (me > 4).then(|| errors.clone()),
                ..lenders_and_borrowers(&keys, me)
            });
            let v = h.check(&BTreeMap::new());
            assert!(v.is_ok(), "seed {seed}: {v:?}");
            audit_sim(&w, 8);
            eprintln!(
                "seed {seed}: borrowed {} lent {} pool faults {} settled {} {} leaked {}",
                stats.entries_borrowed,
                stats.entries_lent,
                stats.pool_faults,
                stats.lends_settled_taken,
                stats.lends_settled_not_taken,
                stats.entries_leaked,
            );
            *total.borrow_mut() += stats;
        },
    );
    let total = total.into_inner();
    // Relaxed: read after every run, on the thread that ran them.
    assert!(
        errors.load(Ordering::Relaxed) > 0,
        "no cut hit an operation"
    );
    assert!(
        total.entries_borrowed > 0 && total.pool_faults > 0,
        "{total:?}"
    );
}

/// A table made for 64 keys that may grow to 4096, and 12 clients on 3
/// compute nodes putting, getting and deleting 700 keys: it doubles four
/// or five times while they run (each compute node with its own view of
/// the descriptor, confirmed every 20 µs), and every history is per-key
/// linearizable.
#[test]
fn cuckoo_histories_while_the_table_grows_on_sim() {
    let total = RefCell::new(CuckooStats::default());
    for_each_seed("cuckoo_histories_while_the_table_grows_on_sim", 4, |seed| {
        let mut cfg = fast_reuse(cfg(64, 8, 40));
        cfg.max_capacity = 4096;
        cfg.view_lease_ns = 20_000;
        let keys = Arc::new((0..700u64).collect::<Vec<_>>());
        let (h, stats, w) = sim_history(seed, &cfg, 3, 2, &BTreeMap::new(), vec![], |_| Workload {
            put: 7,
            get: 2,
            keys: keys.clone(),
            ops: 150,
            leave: false,
            verb_errors: None,
        });
        let v = h.check(&BTreeMap::new());
        assert!(v.is_ok(), "seed {seed}: {v:?}");
        let audit = audit_sim(&w, 8);
        assert!(
            audit.level >= 3,
            "seed {seed}: grew only to level {}",
            audit.level
        );
        *total.borrow_mut() += stats;
    });
    let total = total.into_inner();
    eprintln!("{total:?}");
    assert!(total.walked_buckets > 0 && total.moves > 0, "{total:?}");
}

/// The table grows while most clients update four hot keys: an update
/// that finds its key's word where the split walk has yet to move it
/// from moves it up first (`grow.rs`, `move_up_to_update`; without it a
/// hot enough key kept the walk from finishing, which `loch-bench
/// hash-grow --zipf 4` reproduces: bench/tests/cli.rs). Every history
/// is per-key linearizable, the table grows, and updates did move words
/// up.
#[test]
fn cuckoo_growth_finishes_under_hot_key_updates_on_sim() {
    let total = RefCell::new(CuckooStats::default());
    for_each_seed(
        "cuckoo_growth_finishes_under_hot_key_updates_on_sim",
        4,
        |seed| {
            let mut cfg = fast_reuse(cfg(64, 8, 40));
            cfg.max_capacity = 1024;
            cfg.view_lease_ns = 20_000;
            let fresh = Arc::new((100..400u64).collect::<Vec<_>>());
            let hot = Arc::new((0..4u64).collect::<Vec<_>>());
            let preload: BTreeMap<u64, u64> = (0..4u64).map(|k| (k, 1_000 + k)).collect();
            let (h, stats, w) = sim_history(seed, &cfg, 3, 2, &preload, vec![], |me| {
                // Clients 1 and 2 insert (and drive the growth); the other
                // ten update and read the hot keys.
                if me <= 2 {
                    Workload {
                        put: 10,
                        get: 0,
                        keys: fresh.clone(),
                        ops: 150,
                        leave: false,
                        verb_errors: None,
                    }
                } else {
                    Workload {
                        put: 8,
                        get: 2,
                        keys: hot.clone(),
                        ops: 1500,
                        leave: false,
                        verb_errors: None,
                    }
                }
            });
            let v = h.check(&preload);
            assert!(v.is_ok(), "seed {seed}: {v:?}");
            let audit = audit_sim(&w, 8);
            assert!(audit.level >= 1, "seed {seed}: never grew");
            *total.borrow_mut() += stats;
        },
    );
    let total = total.into_inner();
    eprintln!("{total:?}");
    assert!(
        total.update_moves > 0,
        "no update moved its word up: {total:?}"
    );
}

/// A table spread over three memory nodes (4 KiB chunks: 128 buckets in
/// two segments, so a key's buckets are often on two nodes and its
/// collect's two READs travel on two queue pairs, unordered): 900 keys
/// preloaded into 1024 slots, then random operations on 1000.
#[test]
fn cuckoo_histories_on_a_table_spread_over_nodes() {
    for_each_seed("cuckoo_histories_on_a_table_spread_over_nodes", 4, |seed| {
        let mut cfg = fast_reuse(cfg(1024, 8, 24));
        cfg.chunk.chunk_bytes = 4096;
        let preload: BTreeMap<u64, u64> = (0..900u64).map(|k| (k, k)).collect();
        let keys = Arc::new((0..1000u64).collect::<Vec<_>>());
        let (h, _, w) = sim_history(seed, &cfg, 3, 2, &preload, vec![], |_| Workload {
            put: 6,
            get: 3,
            keys: keys.clone(),
            ops: 150,
            leave: false,
            verb_errors: None,
        });
        let v = h.check(&preload);
        assert!(v.is_ok(), "seed {seed}: {v:?}");
        let a = audit_sim(&w, 8);
        let mut nodes = a.seg_nodes.clone();
        nodes.sort_unstable();
        nodes.dedup();
        assert!(nodes.len() >= 2, "segments on {nodes:?}");
    });
}

/// Displacement racing gets and puts on the keys it moves: 110 keys
/// preloaded into 128 slots; half the clients get and update them, the
/// other half insert and delete 40 other keys, which keeps both buckets of
/// most inserts full, so preloaded keys are moved under the readers'
/// and writers' feet.
#[test]
fn cuckoo_displacement_races_gets_and_puts_on_sim() {
    let total = RefCell::new(CuckooStats::default());
    for_each_seed(
        "cuckoo_displacement_races_gets_and_puts_on_sim",
        6,
        |seed| {
            let cfg = fast_reuse(cfg(128, 8, 64));
            let preload: BTreeMap<u64, u64> = (0..110u64).map(|k| (k, k * 7)).collect();
            let hot = Arc::new((0..110u64).collect::<Vec<_>>());
            let movers = Arc::new((1000..1040u64).collect::<Vec<_>>());
            let (h, stats, w) = sim_history(seed, &cfg, 2, 2, &preload, vec![], |me| {
                if me % 2 == 0 {
                    Workload {
                        put: 3,
                        get: 7,
                        keys: hot.clone(),
                        ops: 200,
                        leave: false,
                        verb_errors: None,
                    }
                } else {
                    Workload {
                        put: 6,
                        get: 0,
                        keys: movers.clone(),
                        ops: 200,
                        leave: false,
                        verb_errors: None,
                    }
                }
            });
            let v = h.check(&preload);
            assert!(v.is_ok(), "seed {seed}: {v:?}");
            let state = audit_sim(&w, 8).map;
            for k in 0..110u64 {
                assert!(state.contains_key(&k), "seed {seed}: key {k} lost");
            }
            *total.borrow_mut() += stats;
        },
    );
    let total = total.into_inner();
    eprintln!(
        "moves {} aborted {} helps {} displacements {} paths {:?} snapshot retries {} cas failures {}",
        total.moves,
        total.aborted_moves,
        total.helps,
        total.displacements,
        total.path_len_hist,
        total.snapshot_retries,
        total.cas_failures
    );
    assert!(total.moves >= 100, "only {} moves", total.moves);
}

/// Real threads on emu memory nodes: 2 threads × 4 tasks, 1500 operations
/// each on 150 keys in a 128-slot table, sharing one location cache.
#[test]
fn cuckoo_histories_are_linearizable_on_emu_threads() {
    let table = Cuckoo::new(cfg(128, 8, 100)).unwrap();
    let (rec, stats) = emu_history(&table, 150, (5, 3), 1500, 7);
    let v = rec.check(&BTreeMap::new());
    assert!(v.is_ok(), "{v:?}");
    assert!(rec.snapshot().events().len() >= 12_000);
    eprintln!("{stats:?}");
    assert!(stats.moves > 0, "no displacement happened");
    // Both threads share one table handle, so one location cache: gets
    // answered from it while the other thread's puts, deletes and moves
    // changed the same keys' slots.
    assert!(stats.cache_hits > 0, "{stats:?}");
}

/// Two emu cores × four clients on `table` (created here), each running
/// `ops` random operations on keys `0..keys` with put and get weights
/// `(put, get)` of 10; the recorded history and the summed statistics.
fn emu_history(
    table: &Arc<Cuckoo>,
    keys: u64,
    (put, get): (u64, u64),
    ops: u32,
    seed: u64,
) -> (Recorder, CuckooStats) {
    let keys = Arc::new((0..keys).collect::<Vec<_>>());
    emu_history_with(table, seed, |_| Workload {
        put,
        get,
        keys: keys.clone(),
        ops,
        leave: false,
        verb_errors: None,
    })
}

/// As [`emu_history`], client `me` (1 ..= 8) running `wl(me)`.
fn emu_history_with(
    table: &Arc<Cuckoo>,
    seed: u64,
    wl: impl Fn(u32) -> Workload + Sync,
) -> (Recorder, CuckooStats) {
    let emu = emu_cluster(2);
    emu_create_table(&emu, table);
    let rec = Recorder::new();
    let sink: StatsSink = Arc::new(Mutex::new(CuckooStats::default()));
    emu.run_cores(2, exec_cfg(4), false, |th, ex| {
        let th = th as u32;
        let (table, rec, sink) = (table.clone(), rec.clone(), sink.clone());
        for t in 0..4u32 {
            let me = 1 + th * 4 + t;
            let c = table.client().unwrap();
            let (r, sink, wl) = (Rec::Shared(rec.clone()), sink.clone(), wl(me));
            ex.spawn(move |ctx| random_client(ctx, c, r, me, seed, wl, wall_clock, sink))
                .unwrap();
        }
        ex.run();
    })
    .unwrap();
    let stats = *sink.lock().unwrap();
    (rec, stats)
}

/// `cuckoo_puts_borrow_entries_other_compute_nodes_freed_on_sim` on real
/// threads: two handles of one table, one per core, stand for two compute
/// nodes; core 0's four clients put 1600 times each, core 1's four delete
/// until those puts are done, over 96 keys, on 48 chunks of 4 KiB on each
/// of two memory nodes, with the default grace period (20 ms of wall
/// clock). A put starts only once as many deletes have as puts, and a
/// delete only while no more than 8 have run ahead of the puts, so that
/// about half the puts are inserts however the threads are scheduled:
/// their 3200 or so entries are more than the memory (about 1500) and
/// what core 0's own updates retire can give, so the puts go on with the
/// entries core 1's handle lends (an allocation error fails the test).
/// The history is per-key linearizable.
#[test]
fn cuckoo_puts_borrow_entries_another_handle_freed_on_emu_threads() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let (c, _) = on_chunks(cfg(128, 8, 200), 48);
    let tables = [Cuckoo::new(c.clone()).unwrap(), Cuckoo::new(c).unwrap()];
    let emu = emu_cluster(2);
    emu_create_table(&emu, &tables[0]);
    let rec = Recorder::new();
    let sink: StatsSink = Arc::new(Mutex::new(CuckooStats::default()));
    let keys = Arc::new((0..96u64).collect::<Vec<_>>());
    // Puts started, puts finished and deletes done, over all clients.
    // Relaxed: counts that pace the clients; the history is ordered by
    // its own lock and nothing else is published through them.
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    const PUTS: u64 = 1600;
    // How far the deletes may run ahead of the puts started.
    const AHEAD: u64 = 8;
    emu.run_cores(2, exec_cfg(4), false, |th, ex| {
        for t in 0..4u32 {
            let me = 1 + th as u32 * 4 + t;
            let mut c = tables[th].client().unwrap();
            let (r, sink, keys, n) = (
                Rec::Shared(rec.clone()),
                sink.clone(),
                keys.clone(),
                counts.clone(),
            );
            ex.spawn(move |ctx| async move {
                use history::map::{Op, Ret};
                let mut rng = nicdrv::rng::Rng::stream(23, nicdrv::rng::Domain::Client, me as u64);
                let (started, finished, deleted) = (&n[0], &n[1], &n[2]);
                let mut i = 0u64;
                loop {
                    let k = keys[rng.below(keys.len() as u64) as usize];
                    if th == 0 {
                        if i == PUTS {
                            break;
                        }
                        while deleted.load(Ordering::Relaxed) < started.load(Ordering::Relaxed) {
                            ctx.sleep(20_000).unwrap().await;
                        }
                        started.fetch_add(1, Ordering::Relaxed);
                        let v = ((me as u64) << 40) | i;
                        let id = r.invoke(me, Op::Put(k, v), wall_clock(&ctx));
                        put_u64(&mut c, &ctx, k, v).await.unwrap();
                        r.complete(id, Ret::Put, wall_clock(&ctx));
                        finished.fetch_add(1, Ordering::Relaxed);
                    } else {
                        // Nor do deletes run far ahead of the puts: a run
                        // of deletes alone empties the table, and the puts
                        // after it, alone in turn, find their keys present
                        // and live on the entries their updates retire,
                        // never short (seen once in CI, beside the other
                        // tests: 307 inserts of 3200 puts, none borrowed).
                        let mut waits = 0u32;
                        while deleted.load(Ordering::Relaxed)
                            > started.load(Ordering::Relaxed) + AHEAD
                            && finished.load(Ordering::Relaxed) < 4 * PUTS
                        {
                            // A put that failed never starts the rest.
                            waits += 1;
                            assert!(waits < 500_000, "client {me}: the puts stopped");
                            ctx.sleep(20_000).unwrap().await;
                        }
                        if finished.load(Ordering::Relaxed) == 4 * PUTS {
                            break;
                        }
                        assert!(i < 10_000_000, "client {me}: the puts never finished");
                        let id = r.invoke(me, Op::Delete(k), wall_clock(&ctx));
                        let found = delete_u64(&mut c, &ctx, k).await.unwrap();
                        r.complete(id, Ret::Delete(Some(found)), wall_clock(&ctx));
                        deleted.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                }
                *sink.lock().unwrap() += c.stats;
            })
            .unwrap();
        }
        ex.run();
    })
    .unwrap();
    let stats = *sink.lock().unwrap();
    let v = rec.check(&BTreeMap::new());
    assert!(v.is_ok(), "{v:?}");
    eprintln!("{stats:?}");
    assert!(
        stats.entries_borrowed > 0,
        "nothing was borrowed: {stats:?}"
    );
}

/// The memory of `cuckoo_puts_wait_for_retired_entries_when_memory_runs_out_on_sim`
/// on real threads: two cores × four clients put, get and delete 96 keys
/// in a table allowed 12 chunks of 4 KiB on each of the two memory nodes,
/// with the default grace period (20 ms of wall clock), so the entries
/// held back outgrow the memory within milliseconds and puts wait for
/// their own retired blocks; the history is per-key linearizable.
#[test]
fn cuckoo_puts_wait_for_retired_entries_on_emu_threads() {
    let (c, _) = on_chunks(cfg(128, 8, 200), 48);
    let table = Cuckoo::new(c).unwrap();
    let (rec, stats) = emu_history(&table, 96, (6, 2), 1500, 17);
    let v = rec.check(&BTreeMap::new());
    assert!(v.is_ok(), "{v:?}");
    eprintln!("{stats:?}");
    assert!(stats.entry_waits > 0, "memory never ran out: {stats:?}");
}

/// Two cores × four clients put, get and delete 1,000 keys in a table
/// made for 64 that may grow to 4096: it doubles online several times
/// under them, on real threads and wall-clock time bounds, and the history
/// is per-key linearizable.
#[test]
fn cuckoo_histories_while_the_table_grows_on_emu_threads() {
    let mut c = cfg(64, 8, 40);
    c.max_capacity = 4096;
    let table = Cuckoo::new(c).unwrap();
    let (rec, stats) = emu_history(&table, 1000, (7, 2), 800, 11);
    let v = rec.check(&BTreeMap::new());
    assert!(v.is_ok(), "{v:?}");
    eprintln!("{stats:?}");
    assert!(
        stats.growth_steps >= 9,
        "fewer than three doublings: {stats:?}"
    );
    assert!(stats.walked_buckets > 0 && stats.moves > 0, "{stats:?}");
}

/// The hot-key growth of `cuckoo_growth_finishes_under_hot_key_updates_on_sim`
/// on real threads: one client per core inserts 600 keys into a table
/// made for 64 (it doubles several times), the other six update and read
/// four hot keys; the history is per-key linearizable. (Whether an
/// update meets a word the walk has yet to move depends on the threads'
/// timing here; the sim test sees it happen.)
#[test]
fn cuckoo_growth_under_hot_key_updates_on_emu_threads() {
    let mut c = cfg(64, 8, 40);
    c.max_capacity = 4096;
    let table = Cuckoo::new(c).unwrap();
    let fresh = Arc::new((100..700u64).collect::<Vec<_>>());
    let hot = Arc::new((0..4u64).collect::<Vec<_>>());
    let (rec, stats) = emu_history_with(&table, 13, |me| {
        if me % 4 == 1 {
            Workload {
                put: 10,
                get: 0,
                keys: fresh.clone(),
                ops: 600,
                leave: false,
                verb_errors: None,
            }
        } else {
            Workload {
                put: 8,
                get: 2,
                keys: hot.clone(),
                ops: 6000,
                leave: false,
                verb_errors: None,
            }
        }
    });
    let v = rec.check(&BTreeMap::new());
    assert!(v.is_ok(), "{v:?}");
    eprintln!("{stats:?}");
    assert!(stats.growth_steps >= 3, "{stats:?}");
}

/// Concurrent inserts of the same key into different empty slots (the
/// classic lock-free cuckoo hazard): 16 clients put, delete and get 3
/// keys, so most puts are inserts racing inserts of the same key. The
/// history is linearizable and the memory never holds a key twice.
#[test]
fn cuckoo_concurrent_inserts_of_one_key_never_duplicate() {
    let total = RefCell::new(CuckooStats::default());
    for_each_seed(
        "cuckoo_concurrent_inserts_of_one_key_never_duplicate",
        8,
        |seed| {
            let cfg = fast_reuse(cfg(256, 8, 16));
            let keys = Arc::new(vec![5u64, 6, 7]);
            // Stalls (under W) make claimants see different empty slots.
            let mut rng = nicdrv::rng::Rng::new(seed);
            let stalls = (0..400)
                .map(|_| Fault {
                    at_ns: rng.below(2_000_000),
                    kind: FaultKind::StallThread {
                        thread: 2 + rng.below(8) as u32,
                        duration_ns: 1_000 + rng.below(20_000),
                    },
                })
                .collect();
            let (h, stats, w) =
                sim_history(seed, &cfg, 2, 4, &BTreeMap::new(), stalls, |_| Workload {
                    put: 5,
                    get: 2,
                    keys: keys.clone(),
                    ops: 120,
                    leave: false,
                    verb_errors: None,
                });
            let v = h.check(&BTreeMap::new());
            assert!(v.is_ok(), "seed {seed}: {v:?}");
            audit_sim(&w, 8);
            *total.borrow_mut() += stats;
        },
    );
    let total = total.into_inner();
    eprintln!(
        "inserts {} eliminated {} kills {} yields {} withdrawals {} cas failures {} retries {}",
        total.inserts,
        total.eliminated,
        total.kills,
        total.yields,
        total.withdrawals,
        total.cas_failures,
        total.retries
    );
    assert!(total.eliminated > 0, "no update was eliminated");
    assert!(
        total.kills + total.yields > 0 && total.withdrawals > 0,
        "inserts of one key never met in different slots: {total:?}"
    );
}

/// Entry reuse: one writer per key updates it back to back, so each entry
/// it unlinks comes back to it after the grace period and is rewritten
/// with a value of a put not yet committed; ten readers get the same keys
/// all the while, most of them through the location cache (a cached slot
/// and entry READ in one doorbell). A reader that followed a pointer into a reused entry
/// would return a value from the future and then, on a later read, an
/// older one: the checker refutes that. Entries must be reused many times.
#[test]
fn cuckoo_entry_reuse_never_feeds_readers() {
    let total = RefCell::new(CuckooStats::default());
    for_each_seed("cuckoo_entry_reuse_never_feeds_readers", 8, |seed| {
        let mut cfg = cfg(256, 8, 16);
        cfg.window_ns = 10_000;
        cfg.reuse_grace_ns = 40_000;
        cfg.stale_ns = 20_000;
        let keys = Arc::new(vec![1u64, 2]);
        // Threads 2..8 run the clients; stalls stretch the gap between a
        // get's bucket READ and its entry READ: short ones (under W) test
        // the grace period, long ones (over G) the window check.
        let mut rng = nicdrv::rng::Rng::new(seed);
        let stalls = (0..800)
            .map(|_| Fault {
                at_ns: rng.below(3_000_000),
                kind: FaultKind::StallThread {
                    thread: 2 + rng.below(6) as u32,
                    // Mostly under W; one in ten longer than G.
                    duration_ns: if rng.below(10) == 0 {
                        50_000 + rng.below(100_000)
                    } else {
                        1_000 + rng.below(8_000)
                    },
                },
            })
            .collect();
        let (h, stats, _) =
            sim_history(seed, &cfg, 2, 3, &BTreeMap::new(), stalls, |me| Workload {
                put: if me <= 2 { 10 } else { 0 },
                get: if me <= 2 { 0 } else { 10 },
                keys: Arc::new(vec![keys[(me as usize - 1) % 2]]),
                ops: 300,
                leave: false,
                verb_errors: None,
            });
        let v = h.check(&BTreeMap::new());
        assert!(v.is_ok(), "seed {seed}: {v:?}");
        *total.borrow_mut() += stats;
    });
    let total = total.into_inner();
    eprintln!(
        "entries reused {} allocated {} window restarts {} torn {}",
        total.entries_reused, total.entries_allocated, total.window_restarts, total.torn_entries
    );
    assert!(total.entries_reused >= 1000, "{total:?}");
    // Readers answered from the location cache between updates, and
    // turned cached places down once an update had moved on.
    assert!(total.cache_hits > 0, "{total:?}");
    assert!(total.cached_gets > total.cache_hits, "{total:?}");
}

/// Updates racing moves of the same key: 52 keys in 64 slots, updated
/// and read by half the clients while the other half insert and delete
/// 16 more keys, so the updated keys are moved all the time. An update
/// whose CAS loses to a move (same value, new word) must retry: only a
/// CAS lost to another put may be eliminated.
#[test]
fn cuckoo_updates_racing_moves_are_never_lost() {
    let total = RefCell::new(CuckooStats::default());
    for_each_seed("cuckoo_updates_racing_moves_are_never_lost", 8, |seed| {
        let cfg = fast_reuse(cfg(64, 8, 16));
        let preload: BTreeMap<u64, u64> = (0..52u64).map(|k| (k, k + 1)).collect();
        let hot = Arc::new((0..52u64).collect::<Vec<_>>());
        let movers = Arc::new((1000..1016u64).collect::<Vec<_>>());
        let mut rng = nicdrv::rng::Rng::new(seed);
        let stalls = (0..300)
            .map(|_| Fault {
                at_ns: rng.below(3_000_000),
                kind: FaultKind::StallThread {
                    thread: 2 + rng.below(8) as u32,
                    duration_ns: 1_000 + rng.below(20_000),
                },
            })
            .collect();
        let (h, stats, w) = sim_history(seed, &cfg, 2, 4, &preload, stalls, |me| {
            if me % 2 == 0 {
                Workload {
                    put: 7,
                    get: 3,
                    keys: hot.clone(),
                    ops: 150,
                    leave: false,
                    verb_errors: None,
                }
            } else {
                Workload {
                    put: 7,
                    get: 0,
                    keys: movers.clone(),
                    ops: 150,
                    leave: false,
                    verb_errors: None,
                }
            }
        });
        let v = h.check(&preload);
        assert!(v.is_ok(), "seed {seed}: {v:?}");
        let state = audit_sim(&w, 8).map;
        for k in 0..52u64 {
            assert!(state.contains_key(&k), "seed {seed}: key {k} lost");
        }
        *total.borrow_mut() += stats;
    });
    let total = total.into_inner();
    eprintln!(
        "moves {} eliminated {} cas failures {} helps {} updates {}",
        total.moves, total.eliminated, total.cas_failures, total.helps, total.updates
    );
    assert!(total.moves >= 500, "only {} moves", total.moves);
}
