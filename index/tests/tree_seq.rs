//! The tree against `BTreeMap`, one client at a time: random operations
//! (with splits at every level, deletes, scans and bulk load) on the sim
//! and emu backends, in every configuration.

mod common;

use common::*;
use index::tree::layout::widen;
use index::tree::{Tree, TreeClient, TreeConfig, TreeError, TreeOf, VersionScheme};
use nicdrv::{Ctx, Nic};
use proptest::prelude::*;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

#[derive(Clone, Debug)]
enum Op {
    Put(u64, u64),
    Get(u64),
    Delete(u64),
    Scan(u64, u64, usize),
}

fn op(keys: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..keys, any::<u64>()).prop_map(|(k, v)| Op::Put(k, v)),
        3 => (0..keys).prop_map(Op::Get),
        2 => (0..keys).prop_map(Op::Delete),
        1 => (0..keys, 0..keys, 0usize..80).prop_map(|(a, b, l)| Op::Scan(a.min(b), a.max(b) + 1, l)),
    ]
}

/// Applies `ops` through `c` and to a model; panics at the first mismatch.
async fn check_ops<N: Nic>(
    ctx: &Ctx<N>,
    c: &mut TreeClient,
    ops: &[Op],
    model: &mut BTreeMap<u64, u64>,
) {
    for (i, o) in ops.iter().enumerate() {
        match *o {
            Op::Put(k, v) => {
                c.put(ctx, k, v).await.unwrap();
                model.insert(k, v);
            }
            Op::Get(k) => {
                assert_eq!(
                    c.get(ctx, k).await.unwrap(),
                    model.get(&k).copied(),
                    "op {i}: get {k}"
                );
                let vb = c.tree().config().value_bytes;
                if vb > 8 {
                    // The whole value: the put's `u64`, widened.
                    let mut got = vec![0u8; vb];
                    let found = c.get_value(ctx, k, &mut got).await.unwrap();
                    assert_eq!(found, model.contains_key(&k), "op {i}: get_value {k}");
                    if let Some(&v) = model.get(&k) {
                        let mut want = vec![0u8; vb];
                        widen(v, &mut want);
                        assert_eq!(got, want, "op {i}: get_value {k}");
                    }
                }
            }
            Op::Delete(k) => assert_eq!(
                c.delete(ctx, k).await.unwrap(),
                model.remove(&k).is_some(),
                "op {i}: delete {k}"
            ),
            Op::Scan(lo, hi, limit) => {
                let want: Vec<(u64, u64)> = model
                    .range(lo..hi)
                    .take(limit)
                    .map(|(&k, &v)| (k, v))
                    .collect();
                assert_eq!(
                    c.scan(ctx, lo, hi, limit).await.unwrap(),
                    want,
                    "op {i}: scan [{lo},{hi}) limit {limit}"
                );
                let vb = c.tree().config().value_bytes;
                if vb > 8 {
                    // Whole values: each the put's `u64`, widened.
                    let wide: Vec<(u64, Vec<u8>)> = want
                        .iter()
                        .map(|&(k, v)| {
                            let mut w = vec![0u8; vb];
                            widen(v, &mut w);
                            (k, w)
                        })
                        .collect();
                    let got = c.scan_values(ctx, lo, hi, limit).await.unwrap();
                    assert_eq!(got, wide, "op {i}: scan_values [{lo},{hi}) limit {limit}");
                }
            }
        }
    }
    // Everything, at the end.
    let all = c.scan(ctx, 0, u64::MAX, usize::MAX).await.unwrap();
    let want: Vec<(u64, u64)> = model.iter().map(|(&k, &v)| (k, v)).collect();
    assert_eq!(all, want, "final full scan");
}

fn run_sim_ops(cfg: TreeConfig, ops: Vec<Op>, seed: u64) {
    let mut w = sim_world(seed, 2, 1);
    let tree = Tree::new(cfg, DM).unwrap();
    sim_create(&mut w, &tree);
    let tr = tree.clone();
    sim_task(&mut w, move |ctx| async move {
        let mut c = tr.client(1).unwrap();
        let mut model = BTreeMap::new();
        check_ops(&ctx, &mut c, &ops, &mut model).await;
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn sherman_matches_btreemap_on_sim(ops in prop::collection::vec(op(600), 1..2500), seed in 0u64..1000) {
        run_sim_ops(sherman(), ops, seed);
    }

    #[test]
    fn two_round_trip_sherman_matches_btreemap_on_sim(ops in prop::collection::vec(op(600), 1..2500), seed in 0u64..1000) {
        run_sim_ops(TreeConfig::named("sherman-2rt", HOST).unwrap(), ops, seed);
    }

    #[test]
    fn fg_plus_matches_btreemap_on_sim(ops in prop::collection::vec(op(400), 1..1500), seed in 0u64..1000) {
        run_sim_ops(TreeConfig::fg_plus(HOST), ops, seed);
    }
}

/// Every ablation switch on its own, with enough keys for three levels.
#[test]
fn every_configuration_matches_btreemap() {
    let base = sherman();
    let configs = [
        base.clone(),
        TreeConfig {
            combine: false,
            ..base.clone()
        },
        TreeConfig {
            lock_in_dm: false,
            ..base.clone()
        },
        TreeConfig {
            local_lock_table: false,
            local_wait_queue: false,
            handover: false,
            ..base.clone()
        },
        TreeConfig {
            local_wait_queue: false,
            handover: false,
            ..base.clone()
        },
        TreeConfig {
            handover: false,
            ..base.clone()
        },
        TreeConfig {
            versions: VersionScheme::FrontRear,
            ..base.clone()
        },
        TreeConfig {
            cache_bytes: 0,
            ..base.clone()
        },
        TreeConfig {
            cache_bytes: 4096,
            ..base.clone()
        },
        TreeConfig::fg_plus(HOST),
        TreeConfig {
            lock_with_read: true,
            ..base.clone()
        },
        TreeConfig::named("sherman-2rt", HOST).unwrap(),
        TreeConfig {
            lock_with_read: true,
            ..TreeConfig::fg_plus(HOST)
        },
    ];
    for (i, cfg) in configs.into_iter().enumerate() {
        let mut rng = nicdrv::rng::Rng::new(i as u64);
        let mut ops = Vec::new();
        for _ in 0..6000 {
            let k = rng.below(5000) * 7;
            ops.push(match rng.below(10) {
                0..=5 => Op::Put(k, rng.next_u64()),
                6..=7 => Op::Get(k),
                8 => Op::Delete(k),
                _ => Op::Scan(k, k + rng.below(3000), rng.below(100) as usize),
            });
        }
        run_sim_ops(cfg, ops, i as u64);
    }
}

/// Leaf values of 16 to 1024 bytes — within a line, a line each, and
/// spanning up to 17 lines of 16 KiB nodes — in Sherman, FG+, the paper's
/// versions and the two-round-trip paths: every get and scan as the
/// model says, whole values included, through splits.
#[test]
fn every_value_size_matches_btreemap() {
    let base = sherman();
    for (i, vb) in [16usize, 52, 53, 200, 1024].into_iter().enumerate() {
        for (j, cfg) in [
            base.clone(),
            TreeConfig::fg_plus(HOST),
            TreeConfig {
                versions: VersionScheme::FrontRear,
                ..base.clone()
            },
            TreeConfig::named("sherman-2rt", HOST).unwrap(),
        ]
        .into_iter()
        .enumerate()
        {
            let cfg = TreeConfig {
                value_bytes: vb,
                ..cfg
            };
            let seed = (i * 4 + j) as u64;
            let mut rng = nicdrv::rng::Rng::new(seed);
            let ops: Vec<Op> = (0..3000)
                .map(|_| {
                    let k = rng.below(2500) * 7;
                    match rng.below(10) {
                        0..=5 => Op::Put(k, rng.next_u64()),
                        6..=7 => Op::Get(k),
                        8 => Op::Delete(k),
                        _ => Op::Scan(k, k + rng.below(3000), rng.below(100) as usize),
                    }
                })
                .collect();
            run_sim_ops(cfg, ops, seed);
        }
    }
}

/// Byte keys of 16 to 1024 bytes that differ only in a few places
/// anywhere along them (most bytes shared), under puts, gets, deletes and
/// scans in Sherman, FG+ and the two-round-trip paths, after a bulk load:
/// every answer as a `BTreeMap` of the same keys gives, through splits.
/// The largest key is refused.
#[test]
fn byte_keys_match_btreemap() {
    fn run<const K: usize>(cfg: TreeConfig, seed: u64) {
        let mut w = sim_world(seed, 2, 1);
        let tree = TreeOf::<[u8; K]>::new(cfg, DM).unwrap();
        sim_create(&mut w, &tree);
        sim_task(&mut w, move |ctx| async move {
            let mut rng = nicdrv::rng::Rng::new(seed);
            let mut pool = std::collections::BTreeSet::new();
            while pool.len() < 600 {
                let mut k = [0x5Au8; K];
                for _ in 0..3 {
                    k[rng.below(K as u64) as usize] = rng.below(4) as u8;
                }
                pool.insert(k);
            }
            let pool: Vec<[u8; K]> = pool.into_iter().collect();
            let mut c = tree.client(1).unwrap();
            // Every third key, bulk-loaded.
            let loaded: Vec<([u8; K], u64)> = pool.iter().step_by(3).map(|&k| (k, 7)).collect();
            // Leaves one short of full: the puts split them.
            let fill = tree.layout().leaf_fanout() - 1;
            c.bulk_load(&ctx, loaded.clone(), fill).await.unwrap();
            let mut model: BTreeMap<[u8; K], u64> = loaded.into_iter().collect();
            let pick = |rng: &mut nicdrv::rng::Rng| pool[rng.below(pool.len() as u64) as usize];
            for i in 0..2500 {
                let k = pick(&mut rng);
                match rng.below(10) {
                    0..=4 => {
                        let v = rng.next_u64();
                        c.put(&ctx, k, v).await.unwrap();
                        model.insert(k, v);
                    }
                    5..=6 => {
                        let got = c.get(&ctx, k).await.unwrap();
                        assert_eq!(got, model.get(&k).copied(), "op {i}: get");
                    }
                    7 => {
                        let had = c.delete(&ctx, k).await.unwrap();
                        assert_eq!(had, model.remove(&k).is_some(), "op {i}: delete");
                    }
                    _ => {
                        let (a, b) = (k, pick(&mut rng));
                        let (lo, hi) = (a.min(b), a.max(b));
                        let limit = rng.below(60) as usize;
                        let got = c.scan(&ctx, lo, hi, limit).await.unwrap();
                        let want: Vec<([u8; K], u64)> = model
                            .range(lo..hi)
                            .take(limit)
                            .map(|(&k, &v)| (k, v))
                            .collect();
                        assert_eq!(got, want, "op {i}: scan");
                    }
                }
            }
            let all = c.scan(&ctx, [0; K], [0xFF; K], usize::MAX).await.unwrap();
            let want: Vec<([u8; K], u64)> = model.iter().map(|(&k, &v)| (k, v)).collect();
            assert_eq!(all, want, "final full scan");
            assert!(c.stats.splits > 0, "no split: the test would miss them");
            assert!(matches!(
                c.put(&ctx, [0xFF; K], 1).await,
                Err(TreeError::ReservedKey)
            ));
        });
    }
    let systems = ["sherman", "fg", "sherman-2rt", "sherman-paper-versions"];
    for (i, name) in systems.into_iter().enumerate() {
        let cfg = TreeConfig::named(name, HOST).unwrap();
        let seed = i as u64;
        run::<16>(cfg.clone(), seed);
        run::<61>(cfg.clone(), seed);
        run::<200>(
            TreeConfig {
                value_bytes: 100,
                ..cfg.clone()
            },
            seed,
        );
        run::<1024>(cfg, seed);
    }
}

/// A value of another length than the tree's, or a tree made with values
/// under 8 or over 1024 bytes: a clear error, nothing written.
#[test]
fn a_value_of_the_wrong_size_is_an_error() {
    for vb in [0, 7, 1025] {
        let cfg = TreeConfig {
            value_bytes: vb,
            ..sherman()
        };
        let e = Tree::new(cfg, DM).err().expect("refused");
        assert!(e.to_string().contains("values must be"), "{e}");
    }
    let mut w = sim_world(2, 1, 1);
    let cfg = TreeConfig {
        value_bytes: 100,
        ..sherman()
    };
    let tree = Tree::new(cfg, DM).unwrap();
    assert_eq!(tree.layout().value_bytes(), 100);
    sim_create(&mut w, &tree);
    let tr = tree.clone();
    sim_task(&mut w, move |ctx| async move {
        let mut c = tr.client(1).unwrap();
        let e = c.put_value(&ctx, 5, &[1u8; 99]).await.unwrap_err();
        assert!(
            matches!(
                e,
                TreeError::ValueSize {
                    expected: 100,
                    got: 99
                }
            ),
            "{e}"
        );
        let mut out = [0u8; 101];
        assert!(matches!(
            c.get_value(&ctx, 5, &mut out).await,
            Err(TreeError::ValueSize { .. })
        ));
        assert_eq!(c.get(&ctx, 5).await.unwrap(), None, "nothing was written");
        let v: Vec<u8> = (0..100).collect();
        c.put_value(&ctx, 5, &v).await.unwrap();
        let mut out = [0u8; 100];
        assert!(c.get_value(&ctx, 5, &mut out).await.unwrap());
        assert_eq!(&out[..], &v[..]);
        assert_eq!(
            c.get(&ctx, 5).await.unwrap(),
            Some(u64::from_le_bytes(v[..8].try_into().unwrap()))
        );
    });
}

#[test]
fn grows_to_several_levels_and_shrinks_by_deletes() {
    let mut w = sim_world(3, 3, 1);
    let tree = Tree::new(sherman(), DM).unwrap();
    sim_create(&mut w, &tree);
    let tr = tree.clone();
    let levels = Rc::new(RefCell::new(0u8));
    let lv = levels.clone();
    sim_task(&mut w, move |ctx| async move {
        let mut c = tr.client(1).unwrap();
        let mut model = BTreeMap::new();
        let mut rng = nicdrv::rng::Rng::new(9);
        for _ in 0..40_000 {
            let k = rng.below(1 << 40);
            let v = rng.next_u64();
            c.put(&ctx, k, v).await.unwrap();
            model.insert(k, v);
        }
        let peak = ctx.scratch_peak();
        let root = ctx.read(index::tree::ROOT_WORD, 8).await.unwrap().u64_at(0);
        *lv.borrow_mut() = (root & 1023) as u8;
        for (&k, &v) in model.iter().step_by(7) {
            assert_eq!(c.get(&ctx, k).await.unwrap(), Some(v));
        }
        let keys: Vec<u64> = model.keys().copied().step_by(2).collect();
        for k in keys {
            assert!(c.delete(&ctx, k).await.unwrap());
            model.remove(&k);
        }
        check_ops(&ctx, &mut c, &[], &mut model).await;
        assert!(c.stats.splits > 800, "{} splits", c.stats.splits);
        // The puts' splits that climbed to the root held two nodes of
        // scratch at their peak (the halves being written), as a leaf's
        // split does: each level's copy went back before the level above
        // (it held k + 3 nodes for k levels, four here; with 16 KiB nodes
        // the fourth level's ran a slot of `op_scratch_bytes` out).
        let nb = tr.layout().node_bytes();
        assert!(
            peak < 3 * nb,
            "{peak} bytes of scratch at the peak, {nb}-byte nodes"
        );
    });
    assert!(*levels.borrow() >= 2, "root level {}", levels.borrow());
}

#[test]
fn bulk_load_then_mixed_operations() {
    let wide = TreeConfig {
        value_bytes: 300,
        ..sherman()
    };
    for cfg in [sherman(), TreeConfig::fg_plus(HOST), wide] {
        let mut w = sim_world(5, 2, 1);
        let tree = Tree::new(cfg, DM).unwrap();
        sim_create(&mut w, &tree);
        let tr = tree.clone();
        sim_task(&mut w, move |ctx| async move {
            let mut c = tr.client(1).unwrap();
            let loaded = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
            c.report_loaded(loaded.clone());
            let items: Vec<(u64, u64)> = (0..20_000u64).map(|i| (i * 3, i)).collect();
            assert_eq!(c.bulk_load(&ctx, items.clone(), 36).await.unwrap(), 20_000);
            // The progress counter saw every record land.
            assert_eq!(loaded.load(std::sync::atomic::Ordering::Relaxed), 20_000);
            // Internal nodes are filled as the leaves are, in proportion
            // to what they hold (189 entries against 10 with 300-byte
            // values): two levels above the records, as with 8-byte ones.
            let root = ctx.read(index::tree::ROOT_WORD, 8).await.unwrap().u64_at(0);
            assert_eq!(root & 1023, 2, "root level");
            let mut model: BTreeMap<u64, u64> = items.into_iter().collect();
            // A second bulk load is refused: the tree is not empty.
            assert!(matches!(
                c.bulk_load(&ctx, vec![(1, 1)], 36).await,
                Err(TreeError::NotEmpty)
            ));
            let mut rng = nicdrv::rng::Rng::new(1);
            let mut ops = Vec::new();
            for _ in 0..3000 {
                let k = rng.below(70_000);
                ops.push(match rng.below(4) {
                    0 => Op::Put(k, rng.next_u64()),
                    1 => Op::Delete(k),
                    2 => Op::Get(k),
                    _ => Op::Scan(k, k + 500, 50),
                });
            }
            check_ops(&ctx, &mut c, &ops, &mut model).await;
        });
    }
}

/// A bulk load writes its top node (or its only leaf) over the old empty
/// root, where readers holding that address may be copying it: the node
/// written there carries a version the old root did not, so a copy that
/// mixes their lines reads as torn and is read again (with equal
/// versions it passed as a node: a leaf of the new node's children as
/// values, or a node of zeroed children). Loads of 3 records (one leaf)
/// and of 5000 (levels above the leaves), on every configuration.
#[test]
fn a_bulk_load_writes_over_the_old_root_with_a_new_version() {
    use index::tree::layout::Node;
    for name in ["sherman", "sherman-2rt", "fg", "sherman-paper-versions"] {
        for records in [3u64, 5000] {
            let cfg = TreeConfig::named(name, HOST).unwrap();
            let mut w = sim_world(5, 1, 1);
            let tree = Tree::new(cfg, DM).unwrap();
            sim_create(&mut w, &tree);
            let tr = tree.clone();
            sim_task(&mut w, move |ctx| async move {
                let l = tr.layout();
                let nb = l.node_bytes();
                let word = ctx.read(index::tree::ROOT_WORD, 8).await.unwrap().u64_at(0);
                let root = nicdrv::GlobalAddr::from_raw(word & !1023);
                let b = ctx.read(root, nb).await.unwrap();
                let before = Node::<u64>::new(l, b.as_slice()).version();
                drop(b);
                let mut c = tr.client(1).unwrap();
                let items: Vec<(u64, u64)> = (0..records).map(|i| (i * 3, i)).collect();
                c.bulk_load(&ctx, items, 36).await.unwrap();
                let now = ctx.read(index::tree::ROOT_WORD, 8).await.unwrap().u64_at(0);
                assert_eq!(now & !1023, word, "{name}: the root stays at its address");
                assert_eq!(now & 1023 > 0, records > 36, "{name}: root level");
                let b = ctx.read(root, nb).await.unwrap();
                let after = Node::<u64>::new(l, b.as_slice()).version();
                assert_ne!(
                    after, before,
                    "{name}, {records} records: the root's version"
                );
                assert_eq!(
                    c.get(&ctx, 3 * (records - 1)).await.unwrap(),
                    Some(records - 1)
                );
            });
        }
    }
}

#[test]
fn bad_input_is_an_error() {
    let mut w = sim_world(1, 1, 1);
    let tree = Tree::new(sherman(), DM).unwrap();
    assert!(tree.client(0).is_err(), "client id 0 is refused");
    let tr = tree.clone();
    sim_task(&mut w, move |ctx| async move {
        let mut c = tr.client(1).unwrap();
        assert!(matches!(c.get(&ctx, 5).await, Err(TreeError::NotCreated)));
        c.create(&ctx).await.unwrap();
        c.create(&ctx).await.unwrap();
        assert!(matches!(
            c.put(&ctx, u64::MAX, 1).await,
            Err(TreeError::ReservedKey)
        ));
        assert!(matches!(
            c.bulk_load(&ctx, vec![(5, 1), (5, 2)], 10).await,
            Err(TreeError::Unsorted { .. })
        ));
        assert_eq!(c.scan(&ctx, 10, 5, 10).await.unwrap(), vec![]);
        // A corrupted node: scribble over the root leaf.
        let root = ctx.read(index::tree::ROOT_WORD, 8).await.unwrap().u64_at(0);
        let leaf = nicdrv::GlobalAddr::from_raw(root & !1023);
        ctx.write(leaf, &[0xA5u8; 1024]).await.unwrap();
        let e = c.get(&ctx, 5).await.unwrap_err();
        assert!(matches!(e, TreeError::Corrupt { .. }), "{e}");
    });
    assert!(Tree::new(
        TreeConfig {
            lock_table_words: 0,
            ..sherman()
        },
        DM
    )
    .is_err());
    assert!(
        Tree::new(sherman(), 0).is_err(),
        "locks in device memory need device memory"
    );
}

#[test]
fn sequential_on_emu() {
    let emu = emu_cluster(2);
    let mut ex = emu_executor(&emu, 1);
    let tree = Tree::new(sherman(), DM).unwrap();
    let tr = tree.clone();
    ex.spawn(move |ctx| async move {
        let mut c = tr.client(1).unwrap();
        c.create(&ctx).await.unwrap();
        let mut rng = nicdrv::rng::Rng::new(77);
        let mut ops = Vec::new();
        for _ in 0..20_000 {
            let k = rng.below(8000);
            ops.push(match rng.below(10) {
                0..=5 => Op::Put(k, rng.next_u64()),
                6..=7 => Op::Get(k),
                8 => Op::Delete(k),
                _ => Op::Scan(k, k + 300, 40),
            });
        }
        let mut model = BTreeMap::new();
        check_ops(&ctx, &mut c, &ops, &mut model).await;
    })
    .unwrap();
    ex.run();
}

/// A bulk load split across four clients on two compute nodes, each writing
/// the leaves of one part of the key space in parallel; one client then
/// links the parts, builds the internal levels and swings the root.
#[test]
fn parallel_bulk_load_across_compute_threads() {
    let mut w = sim_world(8, 3, 2);
    let trees: Vec<_> = (0..2).map(|_| Tree::new(sherman(), DM).unwrap()).collect();
    sim_create(&mut w, &trees[0]);
    let records: Vec<(u64, u64)> = (0..40_000u64).map(|i| (i * 5 + 3, i)).collect();
    let bounds = [0u64, 50_000, 100_000, 150_000, u64::MAX];
    let parts = Rc::new(RefCell::new(vec![Vec::new(); 4]));
    for p in 0..4 {
        let t = w.add_thread((p % 2) as u16, exec_cfg(1)).unwrap();
        let mut c = trees[p % 2].client(10 + p as u64).unwrap();
        let items: Vec<(u64, u64)> = records
            .iter()
            .copied()
            .filter(|&(k, _)| k >= bounds[p] && k < bounds[p + 1])
            .collect();
        let (lo, hi, out) = (bounds[p], bounds[p + 1], parts.clone());
        w.spawn(t, move |ctx| async move {
            let leaves = c.bulk_load_part(&ctx, items, lo, hi, 40).await.unwrap();
            out.borrow_mut()[p] = leaves;
        })
        .unwrap();
    }
    assert_eq!(w.run(), nicdrv::sim::RunEnd::Done);
    let leaves = parts.borrow().clone();
    assert!(leaves.iter().all(|l| l.len() > 100));
    let tr = trees[1].clone();
    let model: BTreeMap<u64, u64> = records.into_iter().collect();
    sim_task(&mut w, move |ctx| async move {
        let mut c = tr.client(99).unwrap();
        c.bulk_load_finish(&ctx, leaves, 40).await.unwrap();
        let mut m = model;
        let ops: Vec<Op> = (0..2000u64)
            .map(|i| {
                if i % 3 == 0 {
                    Op::Put(i * 37, i)
                } else {
                    Op::Get(i * 97)
                }
            })
            .collect();
        check_ops(&ctx, &mut c, &ops, &mut m).await;
    });
}

/// A scan reads the leaves its cached node names in one round trip. Here
/// the cache of compute node 0 goes stale: compute node 1 splits the leaves
/// under it by inserting. Scans from node 0 must still return exactly the
/// model's keys, walking around every leaf split off since, and the run
/// must have met such leaves (or it tested nothing stale).
#[test]
fn scans_through_a_stale_cache_walk_around_new_leaves() {
    let mut w = sim_world(11, 3, 2);
    let trees: Vec<_> = (0..2).map(|_| Tree::new(sherman(), DM).unwrap()).collect();
    sim_create(&mut w, &trees[0]);
    let model: Rc<RefCell<BTreeMap<u64, u64>>> = Rc::default();
    let (tr, m) = (trees[0].clone(), model.clone());
    sim_task(&mut w, move |ctx| async move {
        let mut c = tr.client(1).unwrap();
        let items: Vec<(u64, u64)> = (0..20_000u64).map(|i| (i * 10, i)).collect();
        m.borrow_mut().extend(items.iter().copied());
        c.bulk_load(&ctx, items, 40).await.unwrap();
        // Warm node 0's cache over the whole range.
        let all = c.scan(&ctx, 0, u64::MAX, usize::MAX).await.unwrap();
        assert_eq!(all.len(), 20_000);
    });
    let (tr, m) = (trees[1].clone(), model.clone());
    let t = w.add_thread(1, exec_cfg(1)).unwrap();
    w.spawn(t, move |ctx| async move {
        let mut c = tr.client(2).unwrap();
        for i in 5_000..9_000u64 {
            c.put(&ctx, i * 10 + 5, i).await.unwrap();
            m.borrow_mut().insert(i * 10 + 5, i);
        }
        assert!(c.stats.splits > 50, "{} splits", c.stats.splits);
    })
    .unwrap();
    assert_eq!(w.run(), nicdrv::sim::RunEnd::Done);
    let (tr, m) = (trees[0].clone(), model.clone());
    sim_task(&mut w, move |ctx| async move {
        let mut c = tr.client(3).unwrap();
        let m = m.borrow().clone();
        let before = c.stats;
        let mut rng = nicdrv::rng::Rng::new(5);
        for _ in 0..300 {
            let low = 45_000 + rng.below(50_000);
            let high = low + 1 + rng.below(60_000);
            let limit = 1 + rng.below(1500) as usize;
            let got = c.scan(&ctx, low, high, limit).await.unwrap();
            let want: Vec<(u64, u64)> = m
                .range(low..high)
                .take(limit)
                .map(|(&k, &v)| (k, v))
                .collect();
            assert_eq!(got, want, "scan [{low}, {high}) limit {limit}");
        }
        assert!(
            c.stats.sibling_hops > before.sibling_hops,
            "no scan met a leaf split off since node 0 cached its parent"
        );
    });
    // A scratch window of 3 KiB: scans read fewer leaves at once, and
    // still all of them.
    let (tr, m) = (trees[0].clone(), model.clone());
    let small = nicdrv::exec::ExecutorConfig {
        scratch_bytes_per_slot: 3 << 10,
        ..exec_cfg(1)
    };
    let t = w.add_thread(0, small).unwrap();
    w.spawn(t, move |ctx| async move {
        let mut c = tr.client(4).unwrap();
        let m = m.borrow().clone();
        for low in (0..200_000u64).step_by(9_973) {
            let got = c.scan(&ctx, low, u64::MAX, 1000).await.unwrap();
            let want: Vec<(u64, u64)> = m.range(low..).take(1000).map(|(&k, &v)| (k, v)).collect();
            assert_eq!(got, want, "scan from {low} in a small window");
        }
    })
    .unwrap();
    assert_eq!(w.run(), nicdrv::sim::RunEnd::Done);
}

/// Corrupted sibling pointers end in an error, whatever the tree: a node
/// whose chain loops (a descent followed it forever), and a leaf whose
/// sibling is null below the key (a write locked what the null pointer
/// names: on FG+, a word of the superblock, which must stay as it was).
#[test]
fn corrupt_sibling_pointers_are_errors_not_endless_walks() {
    use index::tree::layout::{Layout, Node, NodeMut};
    use nicdrv::GlobalAddr;
    for name in ["sherman", "sherman-2rt", "fg"] {
        let cfg = TreeConfig::named(name, HOST).unwrap();
        // A second compute node's handle: its index cache is empty.
        let other = Tree::new(cfg.clone(), DM).unwrap();
        let third = Tree::new(cfg.clone(), DM).unwrap();
        on_loaded_tree(cfg, name, move |ctx, mut c| async move {
            let l = Layout::new(8, 8).unwrap();
            let nb = l.node_bytes();
            let word = ctx.read(index::tree::ROOT_WORD, 8).await.unwrap().u64_at(0);
            let root = GlobalAddr::from_raw(word & !1023);
            assert!(word & 1023 >= 1, "{name}: a tree of one leaf");
            let rb = ctx.read(root, nb).await.unwrap().as_slice().to_vec();
            let mut leaf = root;
            loop {
                let b = ctx.read(leaf, nb).await.unwrap();
                let n = Node::<u64>::new(l, b.as_slice());
                if n.is_leaf() {
                    break;
                }
                leaf = n.child_for(4001);
            }
            // The leaf of key 4001 ends just past its low fence, with no
            // sibling.
            let mut b = ctx.read(leaf, nb).await.unwrap().as_slice().to_vec();
            {
                let mut m = NodeMut::<u64>::new(l, &mut b);
                let low = m.view().low();
                assert!(low < 4001);
                m.set_high(low + 1);
                m.set_sibling(GlobalAddr::NULL);
            }
            ctx.write(leaf, &b).await.unwrap();
            let sb = ctx.read(GlobalAddr::host(0, 0), 1024).await.unwrap();
            let super_before = sb.as_slice().to_vec();
            let e = c.put(&ctx, 4001, 1).await.unwrap_err();
            assert_corrupt(&e, "pointer is null or not node-aligned", name);
            let sa = ctx.read(GlobalAddr::host(0, 0), 1024).await.unwrap();
            assert_eq!(sa.as_slice(), &super_before[..], "{name}: the superblock");
            // A scan across that leaf fails too, through the cache or not
            // (it returned the keys up to the leaf's end as all there was).
            for scanner in [&mut c, &mut third.client(3).unwrap()] {
                let scan = scanner.scan(&ctx, 0, u64::MAX, usize::MAX).await;
                let e = scan.map(|all| all.len()).unwrap_err();
                assert_corrupt(&e, "key beyond the last node", name);
            }
            // The root ends below 4001 and names itself as its sibling.
            let mut b = rb.clone();
            {
                let mut m = NodeMut::<u64>::new(l, &mut b);
                let low = m.view().low();
                m.set_high(low + 1);
                m.set_sibling(root);
            }
            ctx.write(root, &b).await.unwrap();
            let mut o = other.client(2).unwrap();
            let e = o.get(&ctx, 4001).await.unwrap_err();
            assert_corrupt(&e, "sibling chain without end", name);
        });
    }
}

/// Asserts that `e` is `TreeError::Corrupt` for `why` (`what` names the
/// case in the failure).
fn assert_corrupt(e: &TreeError, why: &str, what: &str) {
    assert!(
        matches!(e, TreeError::Corrupt { why: w, .. } if *w == why),
        "{what}: {e}"
    );
}

/// A root word whose level bits name a level past any tree's is corrupt,
/// at once (the level was cut to 8 bits, and every descent restarted
/// until its bound of a million).
#[test]
fn a_root_word_past_any_level_is_corrupt() {
    let cfg = TreeConfig::sherman(HOST);
    // A handle whose client has no root cached, nor its index cache a node.
    let other = Tree::new(cfg.clone(), DM).unwrap();
    on_loaded_tree(cfg, "sherman", move |ctx, _| async move {
        let word = ctx.read(index::tree::ROOT_WORD, 8).await.unwrap().u64_at(0);
        let bad = (word & !1023) | 300;
        ctx.write(index::tree::ROOT_WORD, &bad.to_le_bytes())
            .await
            .unwrap();
        let mut o = other.client(2).unwrap();
        let e = o.get(&ctx, 2).await.unwrap_err();
        assert_corrupt(&e, "the root word names a level past any tree's", "sherman");
    });
}

/// A scan with no index cache to name its leaves goes from each leaf to
/// its right sibling, one READ a leaf, rather than from the root again
/// (a descent a leaf): over the 3000 keys of `on_loaded_tree` in 188
/// leaves, at most the leaves and a descent in round trips.
#[test]
fn a_scan_without_a_cache_walks_the_sibling_links() {
    for name in ["sherman", "fg"] {
        let cfg = TreeConfig {
            cache_bytes: 0,
            ..TreeConfig::named(name, HOST).unwrap()
        };
        on_loaded_tree(cfg, name, move |ctx, mut c| async move {
            let before = ctx.counters().round_trips;
            let all = c.scan(&ctx, 0, u64::MAX, usize::MAX).await.unwrap();
            let rt = ctx.counters().round_trips - before;
            assert_eq!(all.len(), 3000, "{name}");
            assert!(all
                .iter()
                .enumerate()
                .all(|(i, &(k, v))| k == 2 * i as u64 && v == i as u64));
            assert!(rt <= 188 + 4, "{name}: {rt} round trips for 188 leaves");
        });
    }
}

/// Runs `body` with a client of a tree of `cfg` on a sim world of one
/// memory and one compute node, after loading keys 0, 2, .., 5998 (key
/// 2k → k), and asserts it ran to its end (`name` says which tree).
fn on_loaded_tree<F, Fut>(cfg: TreeConfig, name: &str, body: F)
where
    F: FnOnce(Ctx<nicdrv::sim::SimNic>, TreeClient) -> Fut + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let mut w = sim_world(1, 1, 1);
    let tree = Tree::new(cfg, DM).unwrap();
    let done = Rc::new(RefCell::new(false));
    let d = done.clone();
    sim_task(&mut w, move |ctx| async move {
        let mut c = tree.client(1).unwrap();
        c.create(&ctx).await.unwrap();
        c.bulk_load(&ctx, (0..3000u64).map(|k| (k * 2, k)), 16)
            .await
            .unwrap();
        body(ctx, c).await;
        *d.borrow_mut() = true;
    });
    assert!(*done.borrow(), "{name}: the task ran to its end");
}

#[test]
fn a_lock_left_held_by_a_dead_client_ends_its_writers_in_lock_wait() {
    use nicdrv::GlobalAddr;
    for name in ["sherman", "sherman-2rt"] {
        let cfg = TreeConfig {
            lock_wait_ns: 1_000_000,
            ..TreeConfig::named(name, HOST).unwrap()
        };
        on_loaded_tree(cfg, name, move |ctx, mut c| async move {
            // Every lock word of the table (device memory) held by client
            // 0xdead, which is gone.
            let held: Vec<u8> = (0..DM / 8).flat_map(|_| 0xdead_u64.to_le_bytes()).collect();
            ctx.write(GlobalAddr::device(0, 0), &held).await.unwrap();
            let t0 = ctx.now_ns();
            let e = c.put(&ctx, 4001, 1).await.unwrap_err();
            match e {
                TreeError::LockWait {
                    holder, waited_ns, ..
                } => {
                    assert_eq!(holder, 0xdead, "{name}");
                    assert!(waited_ns >= 1_000_000, "{name}: {waited_ns}");
                }
                e => panic!("{name}: expected LockWait, got {e}"),
            }
            assert!(
                ctx.now_ns() - t0 < 10_000_000,
                "{name}: gave up near its bound"
            );
            assert!(e.to_string().contains("client 57005"), "{name}: {e}");
            // Reads take no lock; the write was not made.
            assert_eq!(c.get(&ctx, 4000).await.unwrap(), Some(2000), "{name}");
            assert_eq!(c.get(&ctx, 4001).await.unwrap(), None, "{name}");
            // Once the locks are free again, writers go on.
            ctx.write(GlobalAddr::device(0, 0), &vec![0u8; DM as usize])
                .await
                .unwrap();
            c.put(&ctx, 4001, 1).await.unwrap();
            assert_eq!(c.get(&ctx, 4001).await.unwrap(), Some(1), "{name}");
        });
    }
}

/// Sherman's tree on one memory node, created by compute node 0's handle
/// (the first), its root leaf filled to its fanout by client 7 of compute
/// node 1's handle (the second), keys 0, 10, 20, ...: the world, both
/// handles, client 7, and the fanout.
fn full_root_leaf() -> (
    nicdrv::sim::World,
    std::sync::Arc<Tree>,
    std::sync::Arc<Tree>,
    TreeClient,
    u64,
) {
    let cfg = TreeConfig::sherman(HOST);
    let fanout = index::tree::layout::Layout::new(8, 8)
        .unwrap()
        .leaf_fanout() as u64;
    let mut w = sim_world(5, 1, 2);
    let (a, b) = (
        Tree::new(cfg.clone(), DM).unwrap(),
        Tree::new(cfg, DM).unwrap(),
    );
    sim_create(&mut w, &a);
    let slot = Rc::new(RefCell::new(Some(b.client(7).unwrap())));
    let s = slot.clone();
    let t = w.add_thread(1, exec_cfg(1)).unwrap();
    w.spawn(t, move |ctx| async move {
        let mut c = s.borrow_mut().take().unwrap();
        for k in 0..fanout {
            c.put(&ctx, k * 10, k).await.unwrap();
        }
        *s.borrow_mut() = Some(c);
    })
    .unwrap();
    assert_eq!(w.run(), nicdrv::sim::RunEnd::Done);
    let c = slot.borrow_mut().take().unwrap();
    (w, a, b, c, fanout)
}

/// A root split whose new root was never installed (its client's link cut
/// after the split was written) is installed by the next client that
/// needs the level above. On one memory node: compute node 1's client
/// fills the root leaf to its fanout, then puts one key more, which
/// splits the root, while its link is cut for 200 µs at an instant swept
/// over the first 20 µs of that put (every 250 ns), and after the cut
/// gets a key (which releases a lock the cut left taken). Compute node 0's
/// client then puts 400 keys above all of those, splitting the right
/// half again and again: every put succeeds,
/// every key reads back (the splitting put's own as before it, or not at
/// all), and across the sweep some cut left a root split uninstalled and
/// node 0's client installed it (before, its splits waited for the
/// install without end and failed `Corrupt`).
#[test]
fn a_root_split_left_uninstalled_is_installed_by_the_next_splitter() {
    use nicdrv::sim::RunEnd;
    let run = |cut: Option<u64>| {
        let (mut w, a, _, c, fanout) = full_root_leaf();
        let slot = Rc::new(RefCell::new(Some(c)));
        let heal = cut.map(|c| cut_for(&mut w, 1, 0, c, 200_000));
        let split_put = Rc::new(RefCell::new(None));
        let (s, sp) = (slot.clone(), split_put.clone());
        let t = w.add_thread(1, exec_cfg(1)).unwrap();
        w.spawn(t, move |ctx| async move {
            let mut c = s.borrow_mut().take().unwrap();
            *sp.borrow_mut() = Some(c.put(&ctx, fanout * 10, fanout).await.is_ok());
            // Its next operation, once the link is back, releases a lock
            // word the cut may have left taken (write.rs, "Stranded
            // locks").
            if let Some(heal) = heal {
                ctx.sleep_until(heal.max(ctx.now_ns())).unwrap().await;
            }
            c.get(&ctx, 0).await.unwrap();
        })
        .unwrap();
        assert_eq!(w.run(), RunEnd::Done);
        let helps = Rc::new(RefCell::new(0));
        let h = helps.clone();
        let ok = split_put.borrow().unwrap();
        sim_task(&mut w, move |ctx| async move {
            let mut c = a.client(1).unwrap();
            // Above every key of the first leaf: into the split's right
            // half, whose own splits need the level above the root.
            for k in 0..400u64 {
                c.put(&ctx, 100_000 + k, k).await.unwrap();
            }
            for k in 0..400u64 {
                assert_eq!(c.get(&ctx, 100_000 + k).await.unwrap(), Some(k));
            }
            for k in 0..fanout {
                assert_eq!(c.get(&ctx, k * 10).await.unwrap(), Some(k));
            }
            let last = c.get(&ctx, fanout * 10).await.unwrap();
            assert!(last == Some(fanout) || (!ok && last.is_none()), "{last:?}");
            *h.borrow_mut() = c.stats.root_helps;
        });
        let helps = *helps.borrow();
        helps
    };
    assert_eq!(run(None), 0, "no cut: nothing to help");
    let helped = (0..20_000)
        .step_by(250)
        .filter(|&at| run(Some(at)) > 0)
        .count();
    assert!(helped > 0, "no cut left a root split uninstalled");
}

/// The tree configured as `name`, with a 1 ms lock wait, on one memory
/// node: the world, compute node 0's handle (which created it), compute
/// node 1's, and a node-aligned address in host memory whose lock the
/// tests take (its word, in device memory or in the node's header, is
/// what matters).
fn lock_world(
    name: &str,
) -> (
    nicdrv::sim::World,
    std::sync::Arc<Tree>,
    std::sync::Arc<Tree>,
    nicdrv::GlobalAddr,
) {
    let cfg = TreeConfig {
        lock_wait_ns: 1_000_000,
        ..TreeConfig::named(name, HOST).unwrap()
    };
    let mut w = sim_world(5, 1, 2);
    let (a, b) = (
        Tree::new(cfg.clone(), DM).unwrap(),
        Tree::new(cfg, DM).unwrap(),
    );
    sim_create(&mut w, &a);
    (w, a, b, nicdrv::GlobalAddr::host(0, 16 << 20))
}

/// A lock word a cut stranded on a compute node whose clients then sit
/// idle: another compute node's writer of it fails `LockWait` until a
/// client of the stranding node calls `release_while_idle`. On one
/// memory node: compute node 1's client 7 takes a node's lock, its link
/// is cut for 200 µs, and its unlock fails (the word stays taken,
/// holding 7); once the link is back, `releaser` (if any, a client of
/// compute node 1) calls `release_while_idle`, and then compute node 0's
/// client takes the same lock within a 1 ms wait bound, or fails. The
/// holder it found (0: none), what it released, and whether a word
/// stays stranded on node 1.
fn idle_release(name: &str, releaser: Option<u64>) -> (u64, u64, bool) {
    use nicdrv::sim::RunEnd;
    let (mut w, a, b, node) = lock_world(name);
    let holder = Rc::new(RefCell::new(None));
    let (b2, h) = (b.clone(), holder.clone());
    let t = w.add_thread(1, exec_cfg(1)).unwrap();
    w.spawn(t, move |ctx| async move {
        let mut c = b2.client(7).unwrap();
        let lock = c.lock_node(&ctx, node).await.unwrap();
        *h.borrow_mut() = Some((c, lock));
    })
    .unwrap();
    assert_eq!(w.run(), RunEnd::Done, "{name}");
    let heal = cut_for(&mut w, 1, 0, 1_000, 200_000);
    let (h, b2) = (holder.clone(), b.clone());
    let released = Rc::new(RefCell::new((0, true)));
    let r = released.clone();
    let t = w.add_thread(1, exec_cfg(1)).unwrap();
    w.spawn(t, move |ctx| async move {
        let (mut c, lock) = h.borrow_mut().take().unwrap();
        ctx.sleep(2_000).unwrap().await;
        let e = c.unlock_node(&ctx, lock).await.unwrap_err();
        assert!(matches!(e, TreeError::Verb(_)), "{e}");
        // The failed unlock came back after the transport's timeout, the
        // link likely healed by then.
        ctx.sleep_until((heal + 1_000).max(ctx.now_ns()))
            .unwrap()
            .await;
        let mut other = b2.client(8).unwrap();
        let c = match releaser {
            Some(7) => &mut c,
            Some(8) => &mut other,
            None => return,
            Some(id) => panic!("no client {id}"),
        };
        let left = c.release_while_idle(&ctx).await;
        *r.borrow_mut() = (c.stats.stranded_released, left);
    })
    .unwrap();
    assert_eq!(w.run(), RunEnd::Done, "{name}");
    let found = Rc::new(RefCell::new(u64::MAX));
    let f = found.clone();
    sim_task(&mut w, move |ctx| async move {
        let mut c = a.client(1).unwrap();
        *f.borrow_mut() = match c.lock_node(&ctx, node).await {
            Ok(lock) => {
                c.unlock_node(&ctx, lock).await.unwrap();
                0
            }
            Err(TreeError::LockWait { holder, .. }) => holder,
            Err(e) => panic!("{e}"),
        };
    });
    let (n, left) = *released.borrow();
    let found = *found.borrow();
    (found, n, left)
}

/// `release_while_idle` releases what a cut stranded on a compute node
/// whose clients sit idle (`idle_release`): any of its clients with a
/// local lock table; without one (FG+), only the client that stranded
/// the word. Without the call, the other node's writer fails `LockWait`
/// on client 7.
#[test]
fn an_idle_compute_node_releases_a_stranded_lock_when_asked() {
    for name in ["sherman", "sherman-2rt"] {
        assert_eq!(idle_release(name, None), (7, 0, true), "{name}");
        assert_eq!(idle_release(name, Some(8)), (0, 1, false), "{name}");
    }
    assert_eq!(idle_release("fg", None), (7, 0, true));
    assert_eq!(idle_release("fg", Some(8)), (7, 0, true));
    assert_eq!(idle_release("fg", Some(7)), (0, 1, false));
}

/// A root splitter that only stalls between its split and the new root's
/// install, past `ROOT_HELP_NS`, races the client that helps it: both
/// try to install a root, one wins, and the other goes on from the
/// root the winner installed. On one memory node: compute node 1's
/// client fills the root leaf to its fanout, then puts one key more,
/// which splits the root, while its thread stalls for 3 ms at an instant
/// swept over the first 20 µs of that put (every 250 ns); compute node
/// 0's client meanwhile puts 400 keys above all of those (its splits
/// need the level above the root). Every put succeeds, every key reads
/// back, and across the sweep some stall left the install to node 0's
/// client, which helped.
#[test]
fn a_stalled_root_splitter_and_its_helper_install_one_root() {
    use nicdrv::sim::{Fault, FaultKind, RunEnd};
    let run = |stall: Option<u64>| {
        let (mut w, a, b, _, fanout) = full_root_leaf();
        let splitter = w.add_thread(1, exec_cfg(1)).unwrap();
        w.spawn(splitter, move |ctx| async move {
            let mut c = b.client(8).unwrap();
            c.put(&ctx, fanout * 10, fanout).await.unwrap();
        })
        .unwrap();
        let helps = Rc::new(RefCell::new(0));
        let h = helps.clone();
        let a2 = a.clone();
        let t = w.add_thread(0, exec_cfg(1)).unwrap();
        w.spawn(t, move |ctx| async move {
            let mut c = a2.client(1).unwrap();
            for k in 0..400u64 {
                c.put(&ctx, 100_000 + k, k).await.unwrap();
            }
            *h.borrow_mut() = c.stats.root_helps;
        })
        .unwrap();
        if let Some(at) = stall {
            let at_ns = w.now_ns() + at;
            let kind = FaultKind::StallThread {
                thread: splitter,
                duration_ns: 3_000_000,
            };
            w.add_faults(&[Fault { at_ns, kind }]).unwrap();
        }
        assert_eq!(w.run(), RunEnd::Done);
        sim_task(&mut w, move |ctx| async move {
            let mut c = a.client(2).unwrap();
            for k in 0..400u64 {
                assert_eq!(c.get(&ctx, 100_000 + k).await.unwrap(), Some(k));
            }
            for k in 0..=fanout {
                assert_eq!(c.get(&ctx, k * 10).await.unwrap(), Some(k));
            }
        });
        let helps = *helps.borrow();
        helps
    };
    assert_eq!(run(None), 0, "no stall: nothing to help");
    let helped = (0..20_000)
        .step_by(250)
        .filter(|&at| run(Some(at)) > 0)
        .count();
    assert!(helped > 0, "no stall left a root split to its helper");
    eprintln!("{helped} of 80 stalls left the root split to its helper");
}

/// Lookups wait for no lock, stranded words included: a word stranded
/// while a writer of the same compute node then holds its local entry is
/// left to a later operation by a lookup, not waited for. On one memory
/// node, compute node 1: client 7 takes a node's lock while the link is
/// cut (its CAS fails and strands the word), client 9, queued behind it,
/// then takes the lock and holds it for 5 ms; a lookup by client 10 in
/// that time completes within 100 µs (it waited for the writer's 5 ms
/// before), and client 10's put after that leaves nothing stranded; then
/// compute node 0 takes the lock within its 1 ms bound.
#[test]
fn a_lookup_does_not_wait_for_a_stranded_word_a_writer_holds() {
    use nicdrv::sim::RunEnd;
    for name in ["sherman", "sherman-2rt", "fg+comb+onchip+hier"] {
        let (mut w, a, b, node) = lock_world(name);
        let t = w.add_thread(1, exec_cfg(3)).unwrap();
        cut_for(&mut w, 1, 0, 1_000, 100_000);
        let b7 = b.clone();
        w.spawn(t, move |ctx| async move {
            let mut c = b7.client(7).unwrap();
            ctx.sleep(2_000).unwrap().await;
            let Err(e) = c.lock_node(&ctx, node).await else {
                panic!("took a lock through a cut link");
            };
            assert!(matches!(e, TreeError::Verb(_)), "{e}");
        })
        .unwrap();
        let b9 = b.clone();
        w.spawn(t, move |ctx| async move {
            let mut c = b9.client(9).unwrap();
            ctx.sleep(3_000).unwrap().await;
            let lock = c.lock_node(&ctx, node).await.unwrap();
            ctx.sleep(5_000_000).unwrap().await;
            c.unlock_node(&ctx, lock).await.unwrap();
        })
        .unwrap();
        let took = Rc::new(RefCell::new(u64::MAX));
        let tk = took.clone();
        w.spawn(t, move |ctx| async move {
            let mut c = b.client(10).unwrap();
            ctx.sleep(1_500_000).unwrap().await;
            let t0 = ctx.now_ns();
            assert_eq!(c.get(&ctx, 5).await.unwrap(), None);
            *tk.borrow_mut() = ctx.now_ns() - t0;
            ctx.sleep(6_000_000).unwrap().await;
            c.put(&ctx, 5, 1).await.unwrap();
            assert!(!c.release_while_idle(&ctx).await, "left stranded");
        })
        .unwrap();
        assert_eq!(w.run(), RunEnd::Done, "{name}");
        let took = *took.borrow();
        assert!(took < 100_000, "{name}: the lookup took {took} ns");
        sim_task(&mut w, move |ctx| async move {
            let mut c = a.client(1).unwrap();
            let lock = c.lock_node(&ctx, node).await.unwrap();
            c.unlock_node(&ctx, lock).await.unwrap();
        });
    }
}
