//! The cases from Sherman's issue tracker as tests, on sim (many seeds,
//! several compute nodes, each with its own lock table and cache) and on
//! emu (real threads):
//! - #26: many clients inserting into an empty tree;
//! - #27: a lookup racing an update of the same key never reports it missing;
//! - #18: scans under concurrent inserts miss no key present throughout;
//! - deletes under concurrency.

mod common;

use common::*;
use index::tree::{Tree, TreeConfig};
use nicdrv::sim::{for_each_seed, RunEnd, World};
use nicdrv::{Ctx, Nic};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

/// One tree handle per compute node of `w`, the tree created.
fn sim_trees(w: &mut World, cfg: &TreeConfig) -> Vec<Arc<Tree>> {
    let trees: Vec<_> = (0..w.compute_nodes())
        .map(|_| Tree::new(cfg.clone(), DM).unwrap())
        .collect();
    sim_create(w, &trees[0]);
    trees
}

/// Spawns `per_node × compute nodes` tasks (4 per thread), task `i` running
/// `f(ctx, client, i)`.
fn sim_spawn<F, Fut>(w: &mut World, trees: &[Arc<Tree>], per_node: usize, f: F)
where
    F: Fn(Ctx<nicdrv::sim::SimNic>, index::tree::TreeClient, usize) -> Fut + Clone + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let mut i = 0;
    for (cn, tree) in trees.iter().enumerate() {
        for _ in 0..per_node.div_ceil(4) {
            let t = w.add_thread(cn as u16, exec_cfg(4)).unwrap();
            for _ in 0..4 {
                if i >= per_node * (cn + 1) {
                    break;
                }
                let client = tree.client(1000 + i as u64).unwrap();
                let f = f.clone();
                let me = i;
                w.spawn(t, move |ctx| f(ctx, client, me)).unwrap();
                i += 1;
            }
        }
    }
}

async fn verify_exact<N: Nic>(
    ctx: &Ctx<N>,
    c: &mut index::tree::TreeClient,
    model: &BTreeMap<u64, u64>,
) {
    let all = c.scan(ctx, 0, u64::MAX, usize::MAX).await.unwrap();
    let want: Vec<_> = model.iter().map(|(&k, &v)| (k, v)).collect();
    assert_eq!(
        all.len(),
        want.len(),
        "full scan has the wrong number of keys"
    );
    assert_eq!(all, want);
    for (&k, &v) in model.iter().step_by(11) {
        assert_eq!(c.get(ctx, k).await.unwrap(), Some(v), "get {k}");
    }
}

fn final_check(w: &mut World, tree: &Arc<Tree>, model: BTreeMap<u64, u64>) {
    let tr = tree.clone();
    sim_task(w, move |ctx| async move {
        let mut c = tr.client(7).unwrap();
        verify_exact(&ctx, &mut c, &model).await;
    });
}

/// Sherman #26: many clients inserting into an empty tree (every split path
/// raced, the root growing under them).
#[test]
fn many_clients_insert_into_an_empty_tree() {
    for_each_seed("many_clients_insert_into_an_empty_tree", 6, |seed| {
        for cfg in [sherman(), TreeConfig::fg_plus(HOST)] {
            let mut w = sim_world(seed, 4, 4);
            let trees = sim_trees(&mut w, &cfg);
            let per = 8;
            sim_spawn(&mut w, &trees, per, move |ctx, mut c, i| async move {
                let mut rng = nicdrv::rng::Rng::stream(seed, nicdrv::rng::Domain::Client, i as u64);
                for j in 0..250u64 {
                    // Disjoint keys per client, interleaved across the space.
                    let k = (rng.below(1 << 30) << 6) | i as u64;
                    let _ = j;
                    c.put(&ctx, k, k ^ 0xabcd).await.unwrap();
                }
            });
            assert_eq!(w.run(), RunEnd::Done);
            let mut model = BTreeMap::new();
            for i in 0..(per * 4) as u64 {
                let mut rng = nicdrv::rng::Rng::stream(seed, nicdrv::rng::Domain::Client, i);
                for _ in 0..250 {
                    let k = (rng.below(1 << 30) << 6) | i;
                    model.insert(k, k ^ 0xabcd);
                }
            }
            final_check(&mut w, &trees[0], model);
        }
    });
}

/// Sherman #27: a lookup racing updates of the same key must never report
/// it missing, and must return a value that was written.
#[test]
fn lookup_racing_update_never_misses() {
    for_each_seed("lookup_racing_update_never_misses", 6, |seed| {
        let mut w = sim_world(seed, 2, 2);
        let trees = sim_trees(&mut w, &sherman());
        let keys: Vec<u64> = (0..200u64).map(|i| i * 13 + 1).collect();
        {
            let (tr, ks) = (trees[0].clone(), keys.clone());
            sim_task(&mut w, move |ctx| async move {
                let mut c = tr.client(9).unwrap();
                for &k in &ks {
                    c.put(&ctx, k, k << 16).await.unwrap();
                }
            });
        }
        let ks = keys.clone();
        sim_spawn(&mut w, &trees, 8, move |ctx, mut c, i| {
            let ks = ks.clone();
            async move {
                let mut rng = nicdrv::rng::Rng::stream(seed, nicdrv::rng::Domain::Client, i as u64);
                for round in 0..150u64 {
                    let k = ks[rng.below(ks.len() as u64) as usize];
                    if i % 2 == 0 {
                        // Writers: values keep the key in their high bits.
                        c.put(&ctx, k, (k << 16) | (round + 1)).await.unwrap();
                        // And sometimes a fresh key that forces splits.
                        c.put(&ctx, 1_000_000 + rng.below(1 << 20) * 2, 1)
                            .await
                            .unwrap();
                    } else {
                        let v = c.get(&ctx, k).await.unwrap();
                        let v =
                            v.unwrap_or_else(|| panic!("seed {seed}: key {k} reported missing"));
                        assert_eq!(
                            v >> 16,
                            k,
                            "seed {seed}: key {k} returned a value never written for it: {v:#x}"
                        );
                    }
                }
            }
        });
        assert_eq!(w.run(), RunEnd::Done);
    });
}

/// Sherman #18: scans under concurrent inserts return, in order, every
/// pre-loaded key of their range (present throughout) and nothing else
/// but freshly inserted keys.
#[test]
fn scans_under_concurrent_inserts_miss_nothing() {
    for_each_seed("scans_under_concurrent_inserts_miss_nothing", 6, |seed| {
        let mut w = sim_world(seed, 2, 2);
        let trees = sim_trees(&mut w, &sherman());
        {
            let tr = trees[0].clone();
            sim_task(&mut w, move |ctx| async move {
                let mut c = tr.client(9).unwrap();
                for k in 0..3000u64 {
                    c.put(&ctx, k * 10, k).await.unwrap();
                }
            });
        }
        sim_spawn(&mut w, &trees, 8, move |ctx, mut c, i| async move {
            let mut rng = nicdrv::rng::Rng::stream(seed, nicdrv::rng::Domain::Client, i as u64);
            for _ in 0..60 {
                if i % 2 == 0 {
                    for _ in 0..10 {
                        // New keys between the pre-loaded ones, never ≡ 0 mod 10.
                        let k = rng.below(30_000) * 10 + 1 + rng.below(9);
                        c.put(&ctx, k, 0).await.unwrap();
                    }
                } else {
                    let lo = rng.below(29_000);
                    let hi = lo + 1 + rng.below(1500);
                    let got = c.scan(&ctx, lo, hi, usize::MAX).await.unwrap();
                    assert!(
                        got.windows(2).all(|p| p[0].0 < p[1].0),
                        "seed {seed}: scan out of order"
                    );
                    assert!(
                        got.iter().all(|&(k, _)| k >= lo && k < hi),
                        "seed {seed}: key outside the range"
                    );
                    let pre: Vec<u64> = got
                        .iter()
                        .map(|&(k, _)| k)
                        .filter(|k| k % 10 == 0)
                        .collect();
                    let want: Vec<u64> = (lo.div_ceil(10)..hi.div_ceil(10).min(3000))
                        .map(|k| k * 10)
                        .collect();
                    assert_eq!(
                        pre, want,
                        "seed {seed}: scan [{lo},{hi}) missed a key present throughout"
                    );
                    for &(k, v) in &got {
                        if k % 10 == 0 {
                            assert_eq!(v, k / 10, "seed {seed}: wrong value for {k}");
                        }
                    }
                }
            }
        });
        assert_eq!(w.run(), RunEnd::Done);
    });
}

/// Deletes under concurrency: clients delete their own keys and insert new
/// ones while readers look up keys that are never deleted; the end state is
/// exact.
#[test]
fn deletes_under_concurrency() {
    for_each_seed("deletes_under_concurrency", 6, |seed| {
        let mut w = sim_world(seed, 3, 2);
        let trees = sim_trees(&mut w, &sherman());
        let model = Rc::new(RefCell::new(BTreeMap::new()));
        {
            let tr = trees[0].clone();
            let m = model.clone();
            sim_task(&mut w, move |ctx| async move {
                let mut c = tr.client(9).unwrap();
                for k in 0..4000u64 {
                    c.put(&ctx, k, k).await.unwrap();
                    m.borrow_mut().insert(k, k);
                }
            });
        }
        let m = model.clone();
        sim_spawn(&mut w, &trees, 8, move |ctx, mut c, i| {
            let m = m.clone();
            async move {
                // Client i owns keys ≡ i (mod 16) below 4000; keys ≡ 15 are
                // never deleted and are what readers look up.
                let mut rng = nicdrv::rng::Rng::stream(seed, nicdrv::rng::Domain::Client, i as u64);
                for r in 0..200u64 {
                    if i < 15 {
                        let k = (rng.below(250) * 16) + i as u64;
                        let was = c.delete(&ctx, k).await.unwrap();
                        assert_eq!(
                            was,
                            m.borrow_mut().remove(&k).is_some(),
                            "seed {seed}: delete {k}"
                        );
                        let nk = 10_000 + r * 16 + i as u64;
                        c.put(&ctx, nk, r).await.unwrap();
                        m.borrow_mut().insert(nk, r);
                    } else {
                        let k = rng.below(250) * 16 + 15;
                        assert_eq!(
                            c.get(&ctx, k).await.unwrap(),
                            Some(k),
                            "seed {seed}: key {k} lost"
                        );
                    }
                }
            }
        });
        assert_eq!(w.run(), RunEnd::Done);
        let fin = model.borrow().clone();
        final_check(&mut w, &trees[0], fin);
    });
}

/// The same insert storm on emu: real threads, one tree handle shared by
/// the process's cores (one compute node).
#[test]
fn concurrent_inserts_and_lookups_on_emu_threads() {
    let emu = emu_cluster(2);
    let tree = Tree::new(sherman(), DM).unwrap();
    {
        let mut ex = emu_executor(&emu, 1);
        let tr = tree.clone();
        ex.spawn(move |ctx| async move { tr.client(1).unwrap().create(&ctx).await.unwrap() })
            .unwrap();
        ex.run();
    }
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    emu.run_cores(2, exec_cfg(4), false, |th, ex| {
        let th = th as u64;
        let (tree, errors) = (tree.clone(), errors.clone());
        for t in 0..4u64 {
            let id = 10 + th * 4 + t;
            let mut c = tree.client(id).unwrap();
            let errors = errors.clone();
            ex.spawn(move |ctx| async move {
                for j in 0..1500u64 {
                    let k = (j << 8) | id;
                    c.put(&ctx, k, k + 1).await.unwrap();
                    if j % 3 == 0 {
                        let back = ((j / 2) << 8) | id;
                        let got = c.get(&ctx, back).await.unwrap();
                        if got != Some(back + 1) {
                            errors.lock().unwrap().push(format!("key {back}: {got:?}"));
                        }
                    }
                }
            })
            .unwrap();
        }
        ex.run();
    })
    .unwrap();
    assert!(
        errors.lock().unwrap().is_empty(),
        "{:?}",
        errors.lock().unwrap()
    );
    let mut ex = emu_executor(&emu, 1);
    let tr = tree.clone();
    ex.spawn(move |ctx| async move {
        let mut c = tr.client(99).unwrap();
        let mut model = BTreeMap::new();
        for id in 10..18u64 {
            for j in 0..1500u64 {
                model.insert((j << 8) | id, ((j << 8) | id) + 1);
            }
        }
        verify_exact(&ctx, &mut c, &model).await;
    })
    .unwrap();
    ex.run();
}

/// A memory node crash makes operations that need it fail with a clear
/// error instead of hanging.
#[test]
fn memory_node_crash_fails_operations_cleanly() {
    let mut w = sim_world(2, 2, 1);
    // Small chunks, so the leaves spread over both memory nodes.
    let mut cfg = sherman();
    cfg.chunk.chunk_bytes = 16 << 10;
    let trees = sim_trees(&mut w, &cfg);
    {
        let tr = trees[0].clone();
        sim_task(&mut w, move |ctx| async move {
            let mut c = tr.client(9).unwrap();
            for k in 0..3000u64 {
                c.put(&ctx, k, k).await.unwrap();
            }
        });
    }
    w.crash_memory_node(1).unwrap();
    let outcomes = Rc::new(RefCell::new((0u32, 0u32)));
    let o = outcomes.clone();
    let tr = trees[0].clone();
    sim_task(&mut w, move |ctx| async move {
        let mut c = tr.client(10).unwrap();
        for k in 0..3000u64 {
            match c.get(&ctx, k).await {
                Ok(v) => {
                    assert_eq!(v, Some(k));
                    o.borrow_mut().0 += 1;
                }
                Err(e) => {
                    assert!(
                        e.to_string().contains("dead") || e.to_string().contains("unreachable"),
                        "{e}"
                    );
                    o.borrow_mut().1 += 1;
                }
            }
        }
    });
    let (ok, failed) = *outcomes.borrow();
    assert!(failed > 0, "no operation needed the crashed node");
    assert!(ok > 0, "operations on the live node should still work");
}

/// HOCL with a tiny lock table, so tree nodes on different memory nodes
/// share local lock entries while their global words differ: handovers
/// between such waiters must not leave a global word locked forever. (A
/// version of the tree that handed over across words deadlocked here.)
#[test]
fn hocl_collisions_across_memory_nodes_do_not_deadlock() {
    for_each_seed(
        "hocl_collisions_across_memory_nodes_do_not_deadlock",
        4,
        |seed| {
            let mut w = sim_world(seed, 4, 2);
            let mut cfg = sherman();
            cfg.lock_table_words = 8;
            cfg.chunk.chunk_bytes = 16 << 10;
            let trees = sim_trees(&mut w, &cfg);
            sim_spawn(&mut w, &trees, 12, move |ctx, mut c, i| async move {
                let mut rng = nicdrv::rng::Rng::stream(seed, nicdrv::rng::Domain::Client, i as u64);
                for _ in 0..300 {
                    let k = rng.below(3000);
                    c.put(&ctx, k, k + 1).await.unwrap();
                    assert_eq!(c.get(&ctx, k).await.unwrap().map(|v| v > 0), Some(true));
                }
            });
            assert_eq!(
                w.run_until(w.now_ns() + 2_000_000_000),
                RunEnd::Done,
                "seed {seed}: clients stuck on a lock"
            );
        },
    );
}

/// Round trips of a write of a present key, from each task's counters,
/// with the internal nodes cached: the paper's path locks, reads, then
/// writes back with the unlock (3); with the lock and the read in one
/// doorbell, 2; a write whose lock came from a local holder with the
/// node's page, 1 (the write-back alone). Eight clients of one compute
/// node update two hot keys, so most locks are handed over.
#[test]
fn writes_take_the_round_trips_their_path_promises() {
    for (name, fresh) in [("sherman", 3u64), ("sherman-2rt", 2)] {
        let cfg = TreeConfig::named(name, HOST).unwrap();
        let handed = cfg.handover_page;
        let mut w = sim_world(3, 2, 1);
        let trees = sim_trees(&mut w, &cfg);
        let tr = trees[0].clone();
        sim_task(&mut w, move |ctx| async move {
            let mut c = tr.client(1).unwrap();
            for k in 0..2000u64 {
                c.put(&ctx, k * 7, k).await.unwrap();
            }
        });
        let seen = Rc::new(RefCell::new(Vec::new()));
        let s = seen.clone();
        sim_spawn(&mut w, &trees, 8, move |ctx, mut c, i| {
            let s = s.clone();
            async move {
                // Warm this client's cache.
                for k in [0u64, 7_000, 13_993] {
                    c.put(&ctx, k, 1).await.unwrap();
                }
                let base = c.stats;
                let mut rts = Vec::new();
                for j in 0..100u64 {
                    let k = if (i as u64 + j).is_multiple_of(2) {
                        7_000
                    } else {
                        13_993
                    };
                    let rt0 = ctx.counters().round_trips;
                    c.put(&ctx, k, (i as u64) << 32 | j).await.unwrap();
                    rts.push(ctx.counters().round_trips - rt0);
                }
                let pages = c.stats.pages_handed_over - base.pages_handed_over;
                let handovers = c.stats.handovers - base.handovers;
                s.borrow_mut().push((rts, pages, handovers));
            }
        });
        assert_eq!(w.run(), RunEnd::Done);
        let (mut pages_all, mut handovers_all) = (0, 0);
        for (rts, pages, handovers) in seen.borrow().iter() {
            let ones = rts.iter().filter(|&&r| r == 1).count() as u64;
            let full = rts.iter().filter(|&&r| r == fresh).count() as u64;
            if handed {
                // Every handover came with the page: one round trip.
                assert_eq!(pages, handovers, "{name}");
                assert_eq!(ones, *pages, "{name}: {rts:?}");
            } else {
                // A handed-over lock still reads the node: 2.
                assert_eq!(ones, 0, "{name}: {rts:?}");
            }
            let twos = rts.iter().filter(|&&r| r == 2).count() as u64;
            let expect = if handed { ones + full } else { full + twos };
            assert_eq!(expect, rts.len() as u64, "{name}: {rts:?}");
            pages_all += pages;
            handovers_all += handovers;
        }
        assert!(handovers_all > 100, "{name}: {handovers_all} handovers");
        if handed {
            assert_eq!(pages_all, handovers_all, "{name}");
        }
    }
}
