//! The cuckoo table against `HashMap`, one client at a time: random
//! operations on small tables (so displacement chains and `TableFull`
//! happen) on sim and emu; the highest load factor before `TableFull`;
//! round trips per operation; values up to 4 KiB; bad input.

mod common;
mod cuckoo_util;

use common::*;
use cuckoo_util::*;
use index::cuckoo::{Cuckoo, CuckooClient, CuckooConfig, CuckooError, CuckooStats};
use nicdrv::{Ctx, Nic};
use proptest::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

#[derive(Clone, Debug)]
enum Op {
    Put(u64, u64),
    Get(u64),
    Delete(u64),
}

fn op(keys: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..keys, any::<u64>()).prop_map(|(k, v)| Op::Put(k, v)),
        3 => (0..keys).prop_map(Op::Get),
        1 => (0..keys).prop_map(Op::Delete),
    ]
}

/// Applies `ops` through `c` and to a model; panics at the first mismatch.
/// A put may fail with `TableFull` only for a new key, which then stays
/// absent. Ends by reading every key and counting the table's slots.
async fn check_ops<N: Nic>(
    ctx: &Ctx<N>,
    c: &mut CuckooClient,
    ops: &[Op],
    keys: u64,
    model: &mut HashMap<u64, u64>,
) -> u32 {
    let mut full = 0;
    for (i, o) in ops.iter().enumerate() {
        match *o {
            Op::Put(k, v) => match put_u64(c, ctx, k, v).await {
                Ok(()) => {
                    model.insert(k, v);
                }
                Err(CuckooError::TableFull) => {
                    assert!(
                        !model.contains_key(&k),
                        "op {i}: TableFull on an update of {k}"
                    );
                    full += 1;
                }
                Err(e) => panic!("op {i}: put {k}: {e}"),
            },
            Op::Get(k) => assert_eq!(
                get_u64(c, ctx, k).await.unwrap(),
                model.get(&k).copied(),
                "op {i}: get {k}"
            ),
            Op::Delete(k) => assert_eq!(
                delete_u64(c, ctx, k).await.unwrap(),
                model.remove(&k).is_some(),
                "op {i}: delete {k}"
            ),
        }
    }
    for k in 0..keys {
        assert_eq!(
            get_u64(c, ctx, k).await.unwrap(),
            model.get(&k).copied(),
            "final get {k}"
        );
    }
    let occ = c.occupancy(ctx).await.unwrap();
    assert_eq!(occ.committed, model.len() as u64, "committed slots");
    assert_eq!(occ.tentative, 0, "tentative slots left behind");
    full
}

fn run_sim_ops(cfg: CuckooConfig, ops: Vec<Op>, keys: u64, seed: u64) -> CuckooStats {
    let mut w = sim_world(seed, 2, 1);
    let table = Cuckoo::new(cfg).unwrap();
    sim_create_table(&mut w, &table);
    let stats = Rc::new(RefCell::new(CuckooStats::default()));
    let (t, st) = (table.clone(), stats.clone());
    sim_task(&mut w, move |ctx| async move {
        let mut c = t.client().unwrap();
        let mut model = HashMap::new();
        check_ops(&ctx, &mut c, &ops, keys, &mut model).await;
        *st.borrow_mut() = c.stats;
    });
    let s = *stats.borrow();
    s
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, .. ProptestConfig::default() })]

    /// 128 slots and up to 160 keys: the table fills, displaces and
    /// refuses; 8-byte keys, values up to 200 bytes.
    #[test]
    fn small_table_matches_a_hashmap_on_sim(
        ops in prop::collection::vec(op(160), 1..400),
        seed in 0u64..1000,
    ) {
        run_sim_ops(cfg(128, 8, 200), ops, 160, seed);
    }

    /// Odd key sizes and larger values (several lines per entry).
    #[test]
    fn long_keys_and_values_match_a_hashmap_on_sim(
        ops in prop::collection::vec(op(120), 1..200),
        key_bytes in prop::sample::select(vec![1usize, 13, 24, 100]),
    ) {
        run_sim_ops(cfg(96, key_bytes, 1000), ops, 120, 3);
    }
}

/// A table made for 64 keys that may grow to 2048: random operations on
/// 1,500 keys double it online five times, match a `HashMap` throughout,
/// and meet `TableFull` only once it is at its largest.
#[test]
fn a_table_grows_instead_of_filling_up_on_sim() {
    for seed in 0..3u64 {
        let mut c = cfg(64, 8, 40);
        c.max_capacity = 2048;
        c.view_lease_ns = 50_000;
        c.window_ns = 50_000;
        c.reuse_grace_ns = 200_000;
        c.stale_ns = 100_000;
        let mut rng = nicdrv::rng::Rng::new(seed);
        let ops: Vec<Op> = (0..4000)
            .map(|_| {
                let k = rng.below(1500);
                match rng.below(10) {
                    0..=6 => Op::Put(k, rng.below(1 << 40)),
                    7 | 8 => Op::Get(k),
                    _ => Op::Delete(k),
                }
            })
            .collect();
        let mut w = sim_world(seed, 3, 1);
        let table = Cuckoo::new(c).unwrap();
        sim_create_table(&mut w, &table);
        let out = Rc::new(RefCell::new((CuckooStats::default(), 0u64)));
        let (t, o) = (table.clone(), out.clone());
        sim_task(&mut w, move |ctx| async move {
            let mut c = t.client().unwrap();
            let mut model = HashMap::new();
            let full = check_ops(&ctx, &mut c, &ops, 1500, &mut model).await;
            assert_eq!(full, 0, "TableFull before the largest size");
            let occ = c.occupancy(&ctx).await.unwrap();
            *o.borrow_mut() = (c.stats, occ.slots);
        });
        let (stats, slots) = *out.borrow();
        let audit = audit_sim(&w, 8);
        assert!(audit.level >= 4, "seed {seed}: level {}", audit.level);
        assert!(slots >= 64 << 4, "seed {seed}: {slots} slots");
        assert!(stats.growth_steps >= 12, "seed {seed}: {stats:?}");
        assert!(stats.walked_buckets > 0, "{stats:?}");
        assert_eq!(audit.tentative, 0);
    }
}

/// Fills tables with fresh random keys until the first `TableFull` and
/// reports the load factor it stopped at; every key stays readable, the
/// refused key stays absent, and deleting makes room again.
fn fill_until_full(capacity: u64, seed: u64) -> (f64, CuckooStats) {
    let mut w = sim_world(seed, 3, 1);
    let mut c = cfg(capacity, 8, 16);
    // Small chunks: tables above 512 slots span several segments on
    // several memory nodes, so a key's two buckets are often on two.
    c.chunk.chunk_bytes = 4096;
    let table = Cuckoo::new(c).unwrap();
    sim_create_table(&mut w, &table);
    let out = Rc::new(RefCell::new((0.0, CuckooStats::default())));
    let (t, o) = (table.clone(), out.clone());
    sim_task(&mut w, move |ctx| async move {
        let mut c = t.client().unwrap();
        let mut rng = nicdrv::rng::Rng::new(seed);
        let mut model = HashMap::new();
        let refused = loop {
            let k = rng.next_u64() >> 1;
            match put_u64(&mut c, &ctx, k, k ^ 5).await {
                Ok(()) => {
                    model.insert(k, k ^ 5);
                }
                Err(CuckooError::TableFull) => break k,
                Err(e) => panic!("{e}"),
            }
        };
        let occ = c.occupancy(&ctx).await.unwrap();
        assert_eq!(occ.committed, model.len() as u64);
        let load = occ.load_factor();
        assert_eq!(get_u64(&mut c, &ctx, refused).await.unwrap(), None);
        for (&k, &v) in &model {
            assert_eq!(get_u64(&mut c, &ctx, k).await.unwrap(), Some(v), "key {k}");
        }
        // A second refusal writes nothing either.
        assert!(matches!(
            put_u64(&mut c, &ctx, refused, 1).await,
            Err(CuckooError::TableFull)
        ));
        assert_eq!(
            c.occupancy(&ctx).await.unwrap().committed,
            model.len() as u64
        );
        // Room again after deletes.
        let gone: Vec<u64> = model.keys().copied().take(model.len() / 10).collect();
        for k in &gone {
            assert!(delete_u64(&mut c, &ctx, *k).await.unwrap());
            model.remove(k);
        }
        put_u64(&mut c, &ctx, refused, 7).await.unwrap();
        assert_eq!(get_u64(&mut c, &ctx, refused).await.unwrap(), Some(7));
        for k in &gone {
            assert_eq!(get_u64(&mut c, &ctx, *k).await.unwrap(), None);
        }
        *o.borrow_mut() = (load, c.stats);
    });
    let a = audit_sim(&w, 8);
    if capacity > 512 {
        let mut nodes = a.seg_nodes.clone();
        nodes.sort_unstable();
        nodes.dedup();
        assert!(nodes.len() >= 2, "segments on {nodes:?}");
    }
    let r = *out.borrow();
    r
}

/// The highest load factor reached before `TableFull` with 8-slot buckets
/// and a 512-bucket search: at least 90% (design target) on every seed;
/// displacement chains of two hops or more happened on the way.
#[test]
fn load_factor_before_table_full_is_at_least_90_percent() {
    let mut loads = Vec::new();
    let mut total = CuckooStats::default();
    for seed in 0..3 {
        for capacity in [1024u64, 8192] {
            let (load, s) = fill_until_full(capacity, seed);
            loads.push((capacity, seed, load));
            total += s;
            assert!(
                load >= 0.90,
                "capacity {capacity} seed {seed}: TableFull at load {load:.3}"
            );
        }
    }
    eprintln!("load factor at the first TableFull (capacity, seed, load): {loads:?}");
    eprintln!(
        "displacements {} moves {} path lengths {:?} max {} search buckets {}",
        total.displacements,
        total.moves,
        total.path_len_hist,
        total.max_path_len,
        total.search_buckets
    );
    assert!(total.displacements > 0);
    assert!(
        total.path_len_hist[2..].iter().sum::<u64>() > 0,
        "no displacement chain of two or more hops: {:?}",
        total.path_len_hist
    );
}

/// Round trips per operation in an uncontended run, from the task's
/// counters: get 2 (buckets, then the entry) without the location cache
/// and 1 with it (the slot the put left the key in and its entry), a miss
/// 2 (two collects), insert 4, update 3, delete 3, deleting an absent
/// key 2.
#[test]
fn round_trips_per_operation_uncontended() {
    round_trips(0, 2);
    round_trips(1 << 10, 1);
}

fn round_trips(cache_lines: usize, get: u64) {
    let mut w = sim_world(1, 2, 1);
    let mut c = cfg(4096, 8, 64);
    c.location_cache_lines = cache_lines;
    let table = Cuckoo::new(c).unwrap();
    sim_create_table(&mut w, &table);
    let t = table.clone();
    sim_task(&mut w, move |ctx| async move {
        let mut c = t.client().unwrap();
        // Warm up: open the table and take a chunk for entries.
        put_u64(&mut c, &ctx, 1_000_000, 1).await.unwrap();
        let rt = |ctx: &Ctx<_>| ctx.counters().round_trips;
        let mut per = Vec::new();
        for k in 0..200u64 {
            let r0 = rt(&ctx);
            put_u64(&mut c, &ctx, k, k).await.unwrap();
            let r1 = rt(&ctx);
            assert_eq!(get_u64(&mut c, &ctx, k).await.unwrap(), Some(k));
            let r2 = rt(&ctx);
            assert_eq!(get_u64(&mut c, &ctx, k + 500_000).await.unwrap(), None);
            let r3 = rt(&ctx);
            put_u64(&mut c, &ctx, k, k + 1).await.unwrap();
            let r4 = rt(&ctx);
            assert!(delete_u64(&mut c, &ctx, k).await.unwrap());
            let r5 = rt(&ctx);
            assert!(!delete_u64(&mut c, &ctx, k).await.unwrap());
            let r6 = rt(&ctx);
            per.push([r1 - r0, r2 - r1, r3 - r2, r4 - r3, r5 - r4, r6 - r5]);
        }
        // Fingerprint collisions (12 bits, 16 slots) may add a READ to a
        // few operations; the common case is exact.
        let names = [
            "insert",
            "get",
            "get miss",
            "update",
            "delete",
            "delete miss",
        ];
        let want = [4, get, 2, 3, 3, 2];
        for i in 0..6 {
            let exact = per.iter().filter(|p| p[i] == want[i]).count();
            let mean = per.iter().map(|p| p[i]).sum::<u64>() as f64 / per.len() as f64;
            eprintln!("{}: {mean:.3} round trips on average", names[i]);
            assert!(
                exact >= per.len() * 95 / 100,
                "{}: {exact}/{} took {} round trips",
                names[i],
                per.len(),
                want[i]
            );
            assert!(per.iter().all(|p| p[i] <= want[i] + 1), "{}", names[i]);
        }
        let s = c.stats;
        assert_eq!(s.retries, 0);
        assert_eq!(s.snapshot_retries, 0);
        assert_eq!(s.cas_failures, 0);
        if cache_lines > 0 {
            // Every get of a present key hit; a miss finds no line (the
            // delete dropped it) and costs nothing extra.
            assert!(s.cache_hits >= 200 * 95 / 100, "{s:?}");
        } else {
            assert_eq!(s.cached_gets, 0);
        }
    });
}

/// Values of 4 KiB (65 lines with the header and key) round trip; a value
/// over the maximum, a key of the wrong size and a zero capacity are
/// errors, and the refused operations post no verb at all.
#[test]
fn large_values_and_bad_input() {
    assert!(matches!(
        Cuckoo::new(cfg(0, 8, 16)),
        Err(CuckooError::Config(_))
    ));
    assert!(matches!(
        Cuckoo::new(cfg(16, 0, 16)),
        Err(CuckooError::Config(_))
    ));
    assert!(matches!(
        Cuckoo::new(cfg(16, 8, 9000)),
        Err(CuckooError::Config(_))
    ));
    // Blocks and descriptors must fit a chunk.
    let mut small = cfg(16, 8, 4096);
    small.chunk.chunk_bytes = 4096;
    assert!(matches!(Cuckoo::new(small), Err(CuckooError::Config(_))));
    let mut many = cfg(1 << 20, 8, 8);
    many.chunk.chunk_bytes = 4096;
    assert!(matches!(Cuckoo::new(many), Err(CuckooError::Config(_))));
    let mut w = sim_world(2, 2, 1);
    let table = Cuckoo::new(cfg(256, 16, 4096)).unwrap();
    sim_create_table(&mut w, &table);
    let t = table.clone();
    sim_task(&mut w, move |ctx| async move {
        let mut c = t.client().unwrap();
        let k = |i: u64| key(i, 16);
        for i in 0..40u64 {
            let v: Vec<u8> = (0..4096).map(|j| (i as usize * 7 + j) as u8).collect();
            c.put(&ctx, &k(i), &v).await.unwrap();
        }
        for i in 0..40u64 {
            let v: Vec<u8> = (0..4096).map(|j| (i as usize * 7 + j) as u8).collect();
            assert_eq!(c.get(&ctx, &k(i)).await.unwrap(), Some(v));
        }
        c.put(&ctx, &k(100), &[]).await.unwrap();
        assert_eq!(c.get(&ctx, &k(100)).await.unwrap(), Some(vec![]));
        let before = ctx.counters();
        let occ0 = c.occupancy(&ctx).await.unwrap();
        let verbs0 = ctx.counters();
        assert!(matches!(
            c.put(&ctx, &k(7), &vec![1u8; 4097]).await,
            Err(CuckooError::ValueTooLarge {
                max: 4096,
                got: 4097
            })
        ));
        assert!(matches!(
            c.put(&ctx, &[1u8; 15], b"x").await,
            Err(CuckooError::KeySize {
                expected: 16,
                got: 15
            })
        ));
        assert!(matches!(
            c.get(&ctx, &[1u8; 17]).await,
            Err(CuckooError::KeySize { .. })
        ));
        assert!(matches!(
            c.delete(&ctx, &[]).await,
            Err(CuckooError::KeySize { .. })
        ));
        assert_eq!(ctx.counters(), verbs0, "a refused operation posted verbs");
        assert_eq!(c.occupancy(&ctx).await.unwrap(), occ0);
        let v7: Vec<u8> = (0..4096).map(|j| (7 * 7 + j) as u8).collect();
        assert_eq!(c.get(&ctx, &k(7)).await.unwrap(), Some(v7));
        let _ = before;
    });
}

/// A table must exist before use; a client configured differently from
/// the table's creator is refused.
#[test]
fn use_before_create_and_mismatched_config() {
    let mut w = sim_world(3, 1, 1);
    let table = Cuckoo::new(cfg(64, 8, 16)).unwrap();
    let other = Cuckoo::new(cfg(64, 9, 16)).unwrap();
    // A client that would let the table grow, of a table made not to.
    let mut g = cfg(64, 8, 16);
    g.max_capacity = 1024;
    let growing = Cuckoo::new(g).unwrap();
    let (t, o) = (table.clone(), other.clone());
    sim_task(&mut w, move |ctx| async move {
        let mut c = t.client().unwrap();
        assert!(matches!(
            c.get(&ctx, &key(1, 8)).await,
            Err(CuckooError::NotCreated)
        ));
        c.create(&ctx).await.unwrap();
        c.create(&ctx).await.unwrap();
        put_u64(&mut c, &ctx, 1, 2).await.unwrap();
        let mut c2 = t.client().unwrap();
        assert_eq!(get_u64(&mut c2, &ctx, 1).await.unwrap(), Some(2));
        let mut bad = o.client().unwrap();
        assert!(matches!(
            bad.get(&ctx, &key(1, 9)).await,
            Err(CuckooError::Config(_))
        ));
        let mut bad = growing.client().unwrap();
        match bad.put(&ctx, &key(3, 8), b"v").await {
            Err(CuckooError::Config(why)) => assert!(why.contains("doublings"), "{why}"),
            other => panic!("{other:?}"),
        }
        // A configuration that cannot grow within its limits is refused.
        let mut c = cfg(64, 8, 16);
        c.max_capacity = 32;
        assert!(Cuckoo::new(c).is_err());
    });
    assert_eq!(get_after(&mut w, &table, 3), None, "the refused put wrote");
}

/// The value of key `k` read by a fresh client of `table`.
fn get_after(w: &mut nicdrv::sim::World, table: &Arc<Cuckoo>, k: u64) -> Option<u64> {
    let out = Rc::new(RefCell::new(None));
    let (t, o) = (table.clone(), out.clone());
    sim_task(w, move |ctx| async move {
        let mut c = t.client().unwrap();
        *o.borrow_mut() = get_u64(&mut c, &ctx, k).await.unwrap();
    });
    let v = *out.borrow();
    v
}

/// The same random operations on emu memory nodes (real shared memory).
#[test]
fn small_table_matches_a_hashmap_on_emu() {
    let emu = emu_cluster(2);
    let table = Cuckoo::new(cfg(128, 8, 200)).unwrap();
    emu_create_table(&emu, &table);
    let mut rng = nicdrv::rng::Rng::new(11);
    let ops: Vec<Op> = (0..1500)
        .map(|_| match rng.below(10) {
            0..=5 => Op::Put(rng.below(160), rng.next_u64()),
            6..=8 => Op::Get(rng.below(160)),
            _ => Op::Delete(rng.below(160)),
        })
        .collect();
    let mut ex = emu_executor(&emu, 1);
    let t = table.clone();
    let full = Rc::new(RefCell::new(0));
    let f = full.clone();
    ex.spawn(move |ctx| async move {
        let mut c = t.client().unwrap();
        let mut model = HashMap::new();
        *f.borrow_mut() = check_ops(&ctx, &mut c, &ops, 160, &mut model).await;
    })
    .unwrap();
    ex.run();
    assert!(*full.borrow() > 0, "the table never filled");
}

/// Keys that share their first bucket and fingerprint: every operation
/// must READ the other key's entry to tell them apart (the same doorbell
/// as the first, so a get still takes 2 round trips without the location
/// cache, an update 3), and never confuses them.
#[test]
fn fingerprint_collisions_are_told_apart() {
    let mut c = cfg(64, 8, 16);
    c.location_cache_lines = 0;
    let buckets = c.buckets();
    let seed = c.seed;
    let l0 = index::cuckoo::place::locate(&key(0, 8), seed, buckets);
    let twin = (1u64..)
        .find(|&k| index::cuckoo::place::locate(&key(k, 8), seed, buckets) == l0)
        .unwrap();
    let mut w = sim_world(4, 2, 1);
    let table = Cuckoo::new(c).unwrap();
    sim_create_table(&mut w, &table);
    let t = table.clone();
    sim_task(&mut w, move |ctx| async move {
        let mut c = t.client().unwrap();
        put_u64(&mut c, &ctx, 99, 1).await.unwrap();
        put_u64(&mut c, &ctx, 0, 10).await.unwrap();
        let rt = |ctx: &Ctx<_>| ctx.counters().round_trips;
        let r0 = rt(&ctx);
        put_u64(&mut c, &ctx, twin, 20).await.unwrap();
        let r1 = rt(&ctx);
        assert_eq!(get_u64(&mut c, &ctx, twin).await.unwrap(), Some(20));
        let r2 = rt(&ctx);
        assert_eq!(get_u64(&mut c, &ctx, 0).await.unwrap(), Some(10));
        put_u64(&mut c, &ctx, twin, 21).await.unwrap();
        let r3 = rt(&ctx);
        assert!(delete_u64(&mut c, &ctx, 0).await.unwrap());
        let r4 = rt(&ctx);
        assert_eq!(get_u64(&mut c, &ctx, 0).await.unwrap(), None);
        let r5 = rt(&ctx);
        assert_eq!(get_u64(&mut c, &ctx, twin).await.unwrap(), Some(21));
        // Insert: collect, snapshot with the twin's entry, claim, settle,
        // commit.
        assert_eq!(r1 - r0, 5, "insert next to a twin");
        assert_eq!(r2 - r1, 2, "get of a twin");
        assert_eq!(r4 - r3, 3, "delete next to a twin");
        // A miss must read the twin's entry, then confirm by a snapshot.
        assert_eq!(r5 - r4, 3, "miss next to a twin");
        assert!(r3 - r2 >= 5, "get + update");
        assert!(c.stats.fp_false_matches >= 4, "{:?}", c.stats);
    });
}

/// A table with short windows, in two segments of 64 buckets, one per
/// node (allocation starts at node 0 and goes round robin).
fn two_segments() -> CuckooConfig {
    let mut c = cfg(1024, 8, 16);
    c.window_ns = 100_000;
    c.reuse_grace_ns = 400_000;
    c.stale_ns = 100_000;
    c.chunk.chunk_bytes = 4096;
    c
}

/// Gets of keys seen before, a long sleep after: round trips of each.
/// `tune` adjusts the table's configuration.
fn cached_gets_after(tune: impl FnOnce(&mut CuckooConfig), keys: u64) -> Vec<u64> {
    let mut w = sim_world(2, 2, 1);
    let mut c = two_segments();
    tune(&mut c);
    let life = c.reuse_grace_ns - c.window_ns;
    let table = Cuckoo::new(c).unwrap();
    sim_create_table(&mut w, &table);
    let t = table.clone();
    let out = Rc::new(RefCell::new(Vec::new()));
    let o = out.clone();
    sim_task(&mut w, move |ctx| async move {
        let mut c = t.client().unwrap();
        for k in 0..keys {
            put_u64(&mut c, &ctx, k, 70 + k).await.unwrap();
        }
        let rt = |ctx: &Ctx<_>| ctx.counters().round_trips;
        // Renewed by each hit, or never expiring: lines serve while the
        // key is read.
        assert_eq!(get_u64(&mut c, &ctx, 0).await.unwrap(), Some(70));
        for _ in 0..3 {
            ctx.sleep(life / 2).unwrap().await;
            let r0 = rt(&ctx);
            assert_eq!(get_u64(&mut c, &ctx, 0).await.unwrap(), Some(70));
            assert_eq!(rt(&ctx) - r0, 1, "a hit within the bound");
        }
        // Left alone past the bound.
        ctx.sleep(2 * life).unwrap().await;
        for k in 0..keys {
            let r0 = rt(&ctx);
            assert_eq!(get_u64(&mut c, &ctx, k).await.unwrap(), Some(70 + k));
            o.borrow_mut().push(rt(&ctx) - r0);
        }
        // A two-round-trip get fills the line again.
        for k in 0..keys {
            let r0 = rt(&ctx);
            assert_eq!(get_u64(&mut c, &ctx, k).await.unwrap(), Some(70 + k));
            assert_eq!(rt(&ctx) - r0, 1, "key {k} read twice in a row");
        }
    });
    let v = out.borrow().clone();
    v
}

/// Entries lie on their slot's memory node, so a cached get's two READs
/// run in order on one queue pair and its line serves however long ago
/// the key was seen (mod.rs, "Cached gets").
#[test]
fn location_cache_lines_beside_their_slot_do_not_expire() {
    let rts = cached_gets_after(|_| {}, 40);
    assert!(rts.iter().all(|&r| r == 1), "round trips {rts:?}");
}

/// An entry whose slot's node had no memory left lies apart from its
/// slot; its line serves for G − W after the key was last seen there,
/// and no longer: an entry block can be reused G after it was unlinked,
/// and the same key can then bring the same slot word back with another
/// value, which the two READs (then unordered) could mix with the
/// block's older contents. A get past the bound takes the two-round-trip
/// way.
#[test]
fn location_cache_lines_apart_from_their_slot_expire() {
    // Node 1 holds exactly its segment's chunk: entries of its slots go
    // to node 0.
    let rts = cached_gets_after(
        |c| c.chunk.per_node = vec![(1, mempool::first_chunk_off() + 4096)],
        40,
    );
    let apart = rts.iter().filter(|&&r| r == 2).count();
    let beside = rts.iter().filter(|&&r| r == 1).count();
    assert_eq!(apart + beside, rts.len(), "round trips {rts:?}");
    assert!(apart >= 5 && beside >= 5, "round trips {rts:?}");
}

/// Where the NIC may not read a queue pair's READs in order
/// (`ordered_reads` off), every line keeps the age bound.
#[test]
fn location_cache_lines_expire_without_ordered_reads() {
    let rts = cached_gets_after(|c| c.ordered_reads = false, 40);
    assert!(rts.iter().all(|&r| r == 2), "round trips {rts:?}");
}

/// A compute node without a location cache guesses where a put's entry
/// goes (beside the key's first bucket); inserts and updates whose slot
/// lies on the other node copy the entry there in the CAS's doorbell, so
/// another node's cached gets of those keys need no age bound.
#[test]
fn puts_without_a_hint_move_their_entry_beside_the_slot() {
    let mut w = sim_world(3, 2, 1);
    let mut c = two_segments();
    let life = c.reuse_grace_ns - c.window_ns;
    let reader = Cuckoo::new(c.clone()).unwrap();
    c.location_cache_lines = 0;
    let writer = Cuckoo::new(c).unwrap();
    sim_create_table(&mut w, &writer);
    sim_task(&mut w, move |ctx| async move {
        let (mut wc, mut rc) = (writer.client().unwrap(), reader.client().unwrap());
        for round in 0..2 {
            for k in 0..40 {
                put_u64(&mut wc, &ctx, k, 100 * round + k).await.unwrap();
            }
        }
        assert!(wc.stats.entries_moved >= 10, "{:?}", wc.stats);
        for k in 0..40 {
            assert_eq!(get_u64(&mut rc, &ctx, k).await.unwrap(), Some(100 + k));
        }
        ctx.sleep(2 * life).unwrap().await;
        for k in 0..40 {
            let r0 = ctx.counters().round_trips;
            assert_eq!(get_u64(&mut rc, &ctx, k).await.unwrap(), Some(100 + k));
            assert_eq!(ctx.counters().round_trips - r0, 1, "key {k}");
        }
    });
}

/// A 2048-slot table of 8-byte keys and values on one memory node of 24
/// chunks of 4 KiB (so memory runs out before the table fills), W =
/// 200 µs and G = 1 ms, in a world of `compute_nodes`; and the node's
/// bytes.
fn short_of_memory(seed: u64, compute_nodes: usize) -> (CuckooConfig, nicdrv::sim::World, u64) {
    let (mut cfg, node_bytes) = on_chunks(cfg(2048, 8, 8), 24);
    cfg.window_ns = 200_000;
    cfg.reuse_grace_ns = 1_000_000;
    cfg.stale_ns = 400_000;
    let w = nicdrv::sim::World::new(nicdrv::sim::SimConfig {
        seed,
        memory_nodes: 1,
        compute_nodes,
        host_bytes: node_bytes,
        dm_bytes: DM,
        ..Default::default()
    })
    .unwrap();
    (cfg, w, node_bytes)
}

/// [`short_of_memory`]'s table as two compute nodes see it (two
/// handles), created through the first.
fn two_handles(seed: u64, compute_nodes: usize) -> (nicdrv::sim::World, Arc<Cuckoo>, Arc<Cuckoo>) {
    let (cfg, mut w, _) = short_of_memory(seed, compute_nodes);
    let (a, b) = (Cuckoo::new(cfg.clone()).unwrap(), Cuckoo::new(cfg).unwrap());
    sim_create_table(&mut w, &a);
    (w, a, b)
}

/// Puts keys 0, 1, … (each its own value) until memory runs out, which
/// must not come before 200 of them; how many were put.
async fn puts_until_memory_is_out<N: Nic>(c: &mut CuckooClient, ctx: &Ctx<N>) -> u64 {
    let n = puts_from_until_alloc(c, ctx, 0, u64::MAX).await;
    assert!(n > 200, "memory ran out after {n} puts");
    n
}

/// Puts keys `first`, `first + 1`, … (the i-th with value i) until one
/// fails, which must be with `Alloc` and after at most `max` puts; how
/// many were put.
async fn puts_from_until_alloc<N: Nic>(
    c: &mut CuckooClient,
    ctx: &Ctx<N>,
    first: u64,
    max: u64,
) -> u64 {
    let mut n = 0u64;
    loop {
        match put_u64(c, ctx, first + n, n).await {
            Ok(()) => n += 1,
            Err(CuckooError::Alloc(_)) => return n,
            Err(e) => panic!("put {n}: {e}"),
        }
        assert!(n <= max, "{n} puts and memory not yet out");
    }
}

/// Deletes keys `keys`, each of which must be present.
async fn delete_present<N: Nic>(c: &mut CuckooClient, ctx: &Ctx<N>, keys: std::ops::Range<u64>) {
    for k in keys {
        assert!(delete_u64(c, ctx, k).await.unwrap(), "key {k}");
    }
}

/// A lending pool whose words name no block of the node's chunks (a
/// corrupt superblock: one class's head names a superblock line, the
/// others lines past the node's end) is never followed. Puts out of
/// memory fail with `Alloc` after their wait, writing nothing there; a
/// surplus is not offered while no put wants one, and when one does, the
/// pool refuses it and it stays the client's, whose next puts reuse it;
/// the superblock's words are unchanged, and every key reads back as
/// last put or deleted.
#[test]
fn a_corrupt_lending_pool_is_never_followed() {
    use index::cuckoo::lend::{head_addr, Head};
    use mempool::layout::TXN_ROOT_OFF;
    use nicdrv::GlobalAddr;
    let (cfg, mut w, node_bytes) = short_of_memory(5, 1);
    let table = Cuckoo::new(cfg).unwrap();
    sim_create_table(&mut w, &table);
    let bad: Vec<u64> = (0..8u64)
        .map(|c| match c {
            0 => Head::new(TXN_ROOT_OFF / 64, 7).0,
            _ => Head::new(node_bytes / 64 + c, 7).0,
        })
        .collect();
    let t = table.clone();
    let heads = bad.clone();
    sim_task(&mut w, move |ctx| async move {
        for (c, &h) in heads.iter().enumerate() {
            ctx.write(head_addr(0, c), &h.to_le_bytes()).await.unwrap();
        }
        let word = |off: u64| {
            let ctx = &ctx;
            async move {
                ctx.read(GlobalAddr::host(0, off), 8)
                    .await
                    .unwrap()
                    .u64_at(0)
            }
        };
        let mut c = t.client().unwrap();
        // An entry written where the class-0 head points would land on
        // the (unused, zero) TXN root line.
        let untouched = || async {
            let line = ctx
                .read(GlobalAddr::host(0, TXN_ROOT_OFF), 64)
                .await
                .unwrap();
            line.as_slice().iter().all(|&b| b == 0)
        };
        let n = puts_until_memory_is_out(&mut c, &ctx).await;
        assert!(c.stats.pool_faults > 0, "{:?}", c.stats);
        assert_eq!(c.stats.entries_borrowed, 0);
        assert!(untouched().await, "an entry written into the superblock");
        for (k, &h) in heads.iter().enumerate() {
            assert_eq!(
                word(head_addr(0, k).offset()).await,
                h,
                "class {k}'s head changed"
            );
        }
        for k in 0..n {
            assert_eq!(get_u64(&mut c, &ctx, k).await.unwrap(), Some(k), "key {k}");
        }
        // 80 deletes free a surplus of one class once G has passed. The
        // next 16 retirements look at it; the first READ of the want count
        // only learns it. Another put wanting blocks (the test's FAA)
        // changes the count; G / 2 on, the next 16 retirements offer the
        // surplus, and the corrupt pool refuses it.
        delete_present(&mut c, &ctx, 0..80).await;
        ctx.sleep(2_000_000).unwrap().await;
        let faults = c.stats.pool_faults;
        delete_present(&mut c, &ctx, 80..96).await;
        assert_eq!(c.stats.pool_faults, faults, "lent unwanted: {:?}", c.stats);
        ctx.faa(index::cuckoo::lend::WANT_WORD, 1).await.unwrap();
        ctx.sleep(1_000_000).unwrap().await;
        let reused = c.stats.entries_reused;
        delete_present(&mut c, &ctx, 96..112).await;
        assert_eq!(c.stats.pool_faults, faults + 1, "{:?}", c.stats);
        assert_eq!(c.stats.entries_lent, 0);
        for k in 0..40 {
            put_u64(&mut c, &ctx, k, k + 1000).await.unwrap();
        }
        assert_eq!(c.stats.entries_reused, reused + 40, "{:?}", c.stats);
        // Leaving, the client offers all it holds; the pool refuses it.
        let all = c.lend_all(&ctx).await.unwrap();
        assert!(all.lent == 0 && all.kept > 0, "{all:?}");
        assert!(untouched().await, "an entry written into the superblock");
        for (k, &h) in heads.iter().enumerate() {
            assert_eq!(
                word(head_addr(0, k).offset()).await,
                h,
                "class {k}'s head changed"
            );
        }
        for k in 0..n {
            let want = match k {
                0..40 => Some(k + 1000),
                40..112 => None,
                _ => Some(k),
            };
            assert_eq!(get_u64(&mut c, &ctx, k).await.unwrap(), want, "key {k}");
        }
    });
}

/// A pool whose top block's link was corrupted after it was lent (it
/// names a superblock line) is not followed past that block: one client
/// runs memory out, frees entries and lends a batch once a put wants
/// them; its top's link is then overwritten. A client of another handle,
/// out of memory with nothing of its own, never borrows (its puts fail
/// with `Alloc` after their wait), the head is left as it was, nothing
/// is written into the superblock, and every key reads back.
#[test]
fn a_corrupt_link_in_a_lending_pool_is_never_followed() {
    use index::cuckoo::lend::{head_addr, Head, WANT_WORD};
    use mempool::layout::TXN_ROOT_OFF;
    use nicdrv::GlobalAddr;
    let (mut w, a, b) = two_handles(7, 1);
    sim_task(&mut w, move |ctx| async move {
        let mut lender = a.client().unwrap();
        let n = puts_until_memory_is_out(&mut lender, &ctx).await;
        // As in the corrupt-pool test above: 80 deletes make a surplus
        // once G has passed; the next retirements first learn the want
        // count, then see a put elsewhere want blocks, and lend a batch.
        delete_present(&mut lender, &ctx, 0..80).await;
        ctx.sleep(2_000_000).unwrap().await;
        delete_present(&mut lender, &ctx, 80..96).await;
        ctx.faa(WANT_WORD, 1).await.unwrap();
        ctx.sleep(1_000_000).unwrap().await;
        delete_present(&mut lender, &ctx, 96..112).await;
        assert!(lender.stats.entries_lent > 0, "{:?}", lender.stats);
        let mut heads = Vec::new();
        for c in 0..8 {
            let h = ctx.read(head_addr(0, c), 8).await.unwrap().u64_at(0);
            heads.push(h);
        }
        let c = heads
            .iter()
            .position(|&h| Head(h).line() != 0)
            .expect("a class's pool holds the lent blocks");
        let top = GlobalAddr::host(0, Head(heads[c]).line() * 64);
        ctx.write(top, &(TXN_ROOT_OFF / 64).to_le_bytes())
            .await
            .unwrap();
        let mut borrower = b.client().unwrap();
        let m = puts_from_until_alloc(&mut borrower, &ctx, 50_000, 999).await;
        assert_eq!(borrower.stats.entries_borrowed, 0, "{:?}", borrower.stats);
        for (k, &h) in heads.iter().enumerate() {
            let now = ctx.read(head_addr(0, k), 8).await.unwrap().u64_at(0);
            assert_eq!(now, h, "class {k}'s head changed");
        }
        let root = ctx
            .read(GlobalAddr::host(0, TXN_ROOT_OFF), 64)
            .await
            .unwrap();
        assert!(
            root.as_slice().iter().all(|&b| b == 0),
            "an entry written into the superblock"
        );
        for k in 0..n {
            let want = (k >= 112).then_some(k);
            assert_eq!(
                get_u64(&mut lender, &ctx, k).await.unwrap(),
                want,
                "key {k}"
            );
        }
        for k in 0..m {
            assert_eq!(
                get_u64(&mut borrower, &ctx, 50_000 + k).await.unwrap(),
                Some(k)
            );
        }
    });
}

/// A compute node leaving the table lends every entry block it holds,
/// its clients' own and its handle's spares, and the unused rest of their
/// chunks, whether or not a put wants them yet. On one memory node of 24
/// chunks of 4 KiB: compute node 1's first client puts 10 keys (one
/// chunk, 10 of its 64 blocks) and is dropped; compute node 0's client
/// puts keys until memory is out; node 1's second client deletes them
/// all and calls `lend_all`, then the handle is dropped. Node 0's client
/// then puts new keys, each borrowing a lent block, until they are out
/// and its next put fails `Alloc`: the deleted entries and the 54 blocks
/// left in the first client's chunk. Every key reads back. Without
/// `lend_all` nothing is borrowed (the blocks are lost with the handle).
#[test]
fn a_leaving_compute_node_lends_every_entry_it_holds() {
    use index::cuckoo::lend::LentAll;
    let (mut w, a, b) = two_handles(13, 1);
    sim_task(&mut w, move |ctx| async move {
        {
            let mut first = b.client().unwrap();
            for k in 10_000..10_010 {
                put_u64(&mut first, &ctx, k, k).await.unwrap();
            }
        }
        let mut borrower = a.client().unwrap();
        let n = puts_until_memory_is_out(&mut borrower, &ctx).await;
        let mut leaving = b.client().unwrap();
        delete_present(&mut leaving, &ctx, 0..n).await;
        let t0 = ctx.now_ns();
        let all = leaving.lend_all(&ctx).await.unwrap();
        // Each delete retired its entry's block (the last ones waited out
        // their grace period); the first client's chunk had 54 left.
        assert_eq!(
            all,
            LentAll {
                lent: n + 54,
                kept: 0
            },
            "{:?}",
            leaving.stats
        );
        assert!(ctx.now_ns() - t0 < 2 * 1_000_000, "waited past G");
        assert_eq!(leaving.lend_all(&ctx).await.unwrap(), LentAll::default());
        drop((leaving, b));
        // No more puts than entries lent.
        let m = puts_from_until_alloc(&mut borrower, &ctx, 50_000, all.lent).await;
        assert_eq!(m, all.lent, "{:?}", borrower.stats);
        assert_eq!(borrower.stats.entries_borrowed, m);
        for k in 0..n {
            assert_eq!(get_u64(&mut borrower, &ctx, k).await.unwrap(), None);
        }
        for k in 0..m {
            assert_eq!(
                get_u64(&mut borrower, &ctx, 50_000 + k).await.unwrap(),
                Some(k)
            );
        }
        for k in 10_000..10_010 {
            assert_eq!(get_u64(&mut borrower, &ctx, k).await.unwrap(), Some(k));
        }
    });
}

/// The unused rest of a dropped client's chunk serves its handle's other
/// clients once fresh memory is out: a client that put 10 keys (10 blocks
/// of its chunk's 64) is dropped, and another then puts until memory is
/// out; together they put as many keys as one client alone on the same
/// memory (before, the 54 blocks left were lost with the first client).
#[test]
fn a_dropped_clients_chunk_rest_serves_its_handles_other_clients() {
    let fits = |first: u64| {
        let (cfg, mut w, _) = short_of_memory(17, 1);
        let t = Cuckoo::new(cfg).unwrap();
        sim_create_table(&mut w, &t);
        let out = Rc::new(std::cell::Cell::new(0));
        let o = out.clone();
        sim_task(&mut w, move |ctx| async move {
            {
                let mut c = t.client().unwrap();
                for k in 0..first {
                    put_u64(&mut c, &ctx, 100_000 + k, k).await.unwrap();
                }
            }
            let mut c = t.client().unwrap();
            let n = puts_until_memory_is_out(&mut c, &ctx).await;
            for k in 0..first {
                assert_eq!(get_u64(&mut c, &ctx, 100_000 + k).await.unwrap(), Some(k));
            }
            o.set(first + n);
        });
        out.get()
    };
    let alone = fits(0);
    assert_eq!(fits(10), alone);
}

/// A client with nothing to do lends what it holds when it calls
/// `lend_while_idle` now and then: on one memory node of 24 chunks of
/// 4 KiB, compute node 1's client puts until memory is out, deletes 80
/// keys and then only calls `lend_while_idle` every G / 8; compute node
/// 0's client then puts new keys until 40 of its puts have borrowed an
/// entry (of the 64 lendable: 80 less the 16 kept). Every put succeeds
/// (without the idle calls none borrows, and the first fails `Alloc`),
/// and every key reads back.
#[test]
fn an_idle_client_lends_when_it_is_told_to() {
    use std::sync::atomic::{AtomicU8, Ordering};
    let (mut w, a, b) = two_handles(19, 2);
    // 0: filling, 1: filled, 2: done. Relaxed: a flag between two tasks
    // of one simulated world (one OS thread); nothing rides on it.
    let phase = Arc::new(AtomicU8::new(0));
    let n = Rc::new(std::cell::Cell::new(0u64));
    let (t, p, nn) = (b.clone(), phase.clone(), n.clone());
    let idle = w.add_thread(1, exec_cfg(1)).unwrap();
    w.spawn(idle, move |ctx| async move {
        let mut c = t.client().unwrap();
        let n = puts_until_memory_is_out(&mut c, &ctx).await;
        nn.set(n);
        delete_present(&mut c, &ctx, 0..80).await;
        p.store(1, Ordering::Relaxed);
        while p.load(Ordering::Relaxed) != 2 {
            c.lend_while_idle(&ctx).await;
            ctx.sleep(1_000_000 / 8).unwrap().await;
        }
        assert!(c.stats.entries_lent >= 40, "{:?}", c.stats);
    })
    .unwrap();
    let (t, p, nn) = (a.clone(), phase, n);
    let putter = w.add_thread(0, exec_cfg(1)).unwrap();
    w.spawn(putter, move |ctx| async move {
        while p.load(Ordering::Relaxed) == 0 {
            ctx.sleep(100_000).unwrap().await;
        }
        let mut c = t.client().unwrap();
        let mut m = 0;
        while c.stats.entries_borrowed < 40 {
            put_u64(&mut c, &ctx, 50_000 + m, m).await.unwrap();
            m += 1;
            assert!(
                m < 200,
                "{m} puts and still too little borrowed: {:?}",
                c.stats
            );
        }
        for k in 0..nn.get() {
            let want = (k >= 80).then_some(k);
            assert_eq!(get_u64(&mut c, &ctx, k).await.unwrap(), want, "key {k}");
        }
        for k in 0..m {
            assert_eq!(get_u64(&mut c, &ctx, 50_000 + k).await.unwrap(), Some(k));
        }
        p.store(2, Ordering::Relaxed);
    })
    .unwrap();
    assert_eq!(w.run(), nicdrv::sim::RunEnd::Done);
}

/// A dropped client's retired entries go to its handle's spares; the
/// handle's other clients lend them when a put elsewhere wants blocks.
/// On one memory node of 24 chunks of 4 KiB: compute node 1's first
/// client puts 300 keys, deletes them and is dropped; its second client
/// then deletes absent keys (retiring nothing) while compute node 0's
/// client puts new keys, past what the memory holds, until 100 of its
/// puts have borrowed an entry. Every put succeeds (an allocation error
/// fails the test), and every key reads back.
#[test]
fn a_dropped_clients_entries_are_lent_by_its_handles_other_clients() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (mut w, a, b) = two_handles(11, 2);
    let t = b.clone();
    let freed = w.add_thread(1, exec_cfg(1)).unwrap();
    w.spawn(freed, move |ctx| async move {
        let mut c = t.client().unwrap();
        for k in 10_000..10_300 {
            put_u64(&mut c, &ctx, k, k).await.unwrap();
        }
        delete_present(&mut c, &ctx, 10_000..10_300).await;
    })
    .unwrap();
    assert_eq!(w.run(), nicdrv::sim::RunEnd::Done);
    let done = Arc::new(AtomicBool::new(false));
    let stats = Rc::new(RefCell::new(CuckooStats::default()));
    let (t, d, st) = (b.clone(), done.clone(), stats.clone());
    let lender = w.add_thread(1, exec_cfg(1)).unwrap();
    w.spawn(lender, move |ctx| async move {
        let mut c = t.client().unwrap();
        // Relaxed: a flag the putting task sets last; nothing rides on it.
        while !d.load(Ordering::Relaxed) {
            assert!(!delete_u64(&mut c, &ctx, 20_000).await.unwrap());
            ctx.sleep(10_000).unwrap().await;
        }
        *st.borrow_mut() += c.stats;
    })
    .unwrap();
    let (t, d, st) = (a.clone(), done, stats.clone());
    let putter = w.add_thread(0, exec_cfg(1)).unwrap();
    w.spawn(putter, move |ctx| async move {
        let mut c = t.client().unwrap();
        let mut n = 0;
        while c.stats.entries_borrowed < 100 {
            assert!(n < 1200, "{n} puts and still no borrowing: {:?}", c.stats);
            put_u64(&mut c, &ctx, n, n + 7).await.unwrap();
            n += 1;
        }
        for k in 0..n {
            assert_eq!(
                get_u64(&mut c, &ctx, k).await.unwrap(),
                Some(k + 7),
                "key {k}"
            );
        }
        d.store(true, Ordering::Relaxed);
        *st.borrow_mut() += c.stats;
    })
    .unwrap();
    assert_eq!(w.run(), nicdrv::sim::RunEnd::Done);
    let s = *stats.borrow();
    assert!(s.entries_lent >= s.entries_borrowed, "{s:?}");
}

/// A lend whose head CAS loses its answer to a cut link learns from the
/// head whether it took, and no block is lost or lent twice. On one memory
/// node of 24 chunks of 4 KiB, compute node 0's client puts until memory
/// is out; compute node 2 deletes 16 keys (one batch) and node 1 the
/// rest; both then lend everything (`lend_all`), node 1 starting 2 µs
/// after node 2, so that node 2's batch takes the pool's head between
/// node 1's READ of it and node 1's CAS. Node 1's link to the memory node
/// is cut for 100 µs at an instant swept over the first 24 µs of the
/// lending (every 200 ns; the transport reports a lost answer after 1 ms,
/// by when the link carries packets again). Each run: each lender's
/// blocks lent, kept and leaked add up to its deletes; node 0's client
/// then borrows, each for one new key and never following a link that
/// names no free block, at least the blocks lent and at most those and
/// the leaked ones, before a put fails `Alloc`; the pools are left empty
/// and every key reads back. Some cuts lose the answer of a CAS that
/// lost to node 2's, some that of one that took (without reading the
/// head again, each such run leaks a batch); the others fail a verb
/// before the CAS (the batch kept). On the simulator a cut drops a
/// request only when it is posted, and a lend posts its CAS as the WRITE
/// before it completes, so a cut never drops the CAS itself.
#[test]
fn a_lend_whose_cas_answer_is_lost_reads_the_head_to_settle_it() {
    use index::cuckoo::lend::{head_addr, Head, LentAll};
    use nicdrv::sim::{RunEnd, World};
    use std::cell::Cell;
    type Slot = Rc<RefCell<Option<CuckooClient>>>;
    // Spawns `f` with the client in `slot` on a new thread of compute node
    // `cn`; the client goes back once `f` is done.
    fn spawn_with<F, Fut>(w: &mut World, cn: u16, slot: &Slot, f: F)
    where
        F: FnOnce(Ctx<nicdrv::sim::SimNic>, CuckooClient) -> Fut + 'static,
        Fut: std::future::Future<Output = CuckooClient> + 'static,
    {
        let s = slot.clone();
        let t = w.add_thread(cn, exec_cfg(1)).unwrap();
        w.spawn(t, move |ctx| async move {
            let c = s.borrow_mut().take().unwrap();
            let c = f(ctx, c).await;
            *s.borrow_mut() = Some(c);
        })
        .unwrap();
    }
    // One run, node 1's link cut `cut` ns into the lending (none: no
    // cut): per lender, its deletes, what `lend_all` did and its stats;
    // and the keys borrowed.
    let run = |cut: Option<u64>| {
        let (cfg, mut w, _) = short_of_memory(23, 3);
        let handles: Vec<Arc<Cuckoo>> = (0..3).map(|_| Cuckoo::new(cfg.clone()).unwrap()).collect();
        sim_create_table(&mut w, &handles[0]);
        let slots: Vec<Slot> = handles
            .iter()
            .map(|h| Rc::new(RefCell::new(Some(h.client().unwrap()))))
            .collect();
        let n = Rc::new(Cell::new(0));
        let nn = n.clone();
        spawn_with(&mut w, 0, &slots[0], move |ctx, mut c| async move {
            nn.set(puts_until_memory_is_out(&mut c, &ctx).await);
            c
        });
        assert_eq!(w.run(), RunEnd::Done);
        let n = n.get();
        let halves = [0..n - 16, n - 16..n];
        for (cn, keys) in [1, 2].into_iter().zip(halves.clone()) {
            spawn_with(
                &mut w,
                cn,
                &slots[cn as usize],
                move |ctx, mut c| async move {
                    delete_present(&mut c, &ctx, keys).await;
                    c
                },
            );
        }
        assert_eq!(w.run(), RunEnd::Done);
        if let Some(at) = cut {
            cut_for(&mut w, 1, 0, at, 100_000);
        }
        let all: Vec<Rc<Cell<LentAll>>> = (0..2).map(|_| Rc::default()).collect();
        for (cn, out) in [1u16, 2].into_iter().zip(all.clone()) {
            spawn_with(
                &mut w,
                cn,
                &slots[cn as usize],
                move |ctx, mut c| async move {
                    if cn == 1 {
                        ctx.sleep(2_000).unwrap().await;
                    }
                    out.set(c.lend_all(&ctx).await.unwrap());
                    c
                },
            );
        }
        assert_eq!(w.run(), RunEnd::Done);
        let lenders: Vec<(u64, LentAll, CuckooStats)> = halves
            .into_iter()
            .zip(&all)
            .zip(&slots[1..])
            .map(|((keys, all), slot)| {
                let stats = slot.borrow().as_ref().unwrap().stats;
                (keys.end - keys.start, all.get(), stats)
            })
            .collect();
        let lent: u64 = lenders.iter().map(|l| l.1.lent).sum();
        let leaked: u64 = lenders.iter().map(|l| l.2.entries_leaked).sum();
        let m = Rc::new(Cell::new(0));
        let mm = m.clone();
        spawn_with(&mut w, 0, &slots[0], move |ctx, mut c| async move {
            let m = puts_from_until_alloc(&mut c, &ctx, 50_000, lent + leaked).await;
            // Every link it followed named a free block.
            assert_eq!(c.stats.pool_faults, 0, "{:?}", c.stats);
            assert_eq!(c.stats.entries_borrowed, m, "{:?}", c.stats);
            for k in 0..n {
                assert_eq!(get_u64(&mut c, &ctx, k).await.unwrap(), None, "key {k}");
            }
            for k in 0..m {
                assert_eq!(get_u64(&mut c, &ctx, 50_000 + k).await.unwrap(), Some(k));
            }
            mm.set(m);
            c
        });
        assert_eq!(w.run(), RunEnd::Done);
        // Every block in a pool was borrowed: the pools are empty.
        for c in 0..index::cuckoo::reclaim::CLASSES {
            let word = w
                .read_u64(0, nicdrv::Space::Host, head_addr(0, c).offset())
                .unwrap();
            assert_eq!(Head(word).line(), 0, "class {c}");
        }
        (lenders, m.get())
    };
    let (lenders, m) = run(None);
    for (n, all, stats) in &lenders {
        assert_eq!(*all, LentAll { lent: *n, kept: 0 }, "{stats:?}");
    }
    assert_eq!(m, lenders.iter().map(|l| l.0).sum::<u64>());
    let mut total = CuckooStats::default();
    for at in (0..24_000).step_by(200) {
        let (lenders, m) = run(Some(at));
        let why = format!("cut at {at} ns: {lenders:?}");
        for (n, all, stats) in &lenders {
            assert_eq!(all.lent + all.kept + stats.entries_leaked, *n, "{why}");
        }
        let lent: u64 = lenders.iter().map(|l| l.1.lent).sum();
        let leaked: u64 = lenders.iter().map(|l| l.2.entries_leaked).sum();
        assert!(m >= lent && m <= lent + leaked, "{m} borrowed; {why}");
        total += lenders[0].2;
    }
    assert!(
        total.lends_settled_taken > 0 && total.lends_settled_not_taken > 0,
        "{total:?}"
    );
}
