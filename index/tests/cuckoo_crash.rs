//! Clients that stop dead half-way: lock-freedom means whatever they left
//! behind — a tentative claim, a committed move not yet finished — is
//! finished or undone by whoever comes next, with no key lost or
//! duplicated. Two ways to stop: a test hook that stops a client right
//! after its k-th CAS of a put that must displace (every step of the move
//! and of the insert, deterministically), and the simulator crashing a
//! whole compute node while its clients displace under others' histories.

mod common;
mod cuckoo_util;

use common::*;
use cuckoo_util::*;
use history::map::History;
use index::cuckoo::{Cuckoo, CuckooConfig, CuckooError, CuckooStats};
use nicdrv::sim::{for_each_seed, Fault, FaultKind, SimConfig, SimNic, World};
use nicdrv::Ctx;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

fn quick(mut c: CuckooConfig) -> CuckooConfig {
    c.window_ns = 50_000;
    c.reuse_grace_ns = 200_000;
    c.stale_ns = 100_000;
    c
}

/// Runs one task on a fresh thread of compute node `cn` until it is done
/// (other tasks, dead or alive, may remain).
fn run_on<F, Fut>(w: &mut World, cn: u16, f: F)
where
    F: FnOnce(Ctx<SimNic>) -> Fut,
    Fut: Future<Output = ()> + 'static,
{
    let done = Rc::new(Cell::new(false));
    let d = done.clone();
    let t = w.add_thread(cn, exec_cfg(1)).unwrap();
    w.spawn(t, move |ctx| {
        let fut = f(ctx);
        async move {
            fut.await;
            d.set(true);
        }
    })
    .unwrap();
    for _ in 0..10_000 {
        if done.get() {
            return;
        }
        w.run_until(w.now_ns() + 1_000_000);
    }
    panic!("task on compute node {cn} did not finish");
}

/// Puts `items` into `table` with one client on compute node 0.
fn preload_table(w: &mut World, table: &Arc<Cuckoo>, items: &BTreeMap<u64, u64>) {
    let (t, p) = (table.clone(), items.clone());
    run_on(w, 0, move |ctx| async move {
        let mut c = t.client().unwrap();
        for (k, v) in p {
            put_u64(&mut c, &ctx, k, v).await.unwrap();
        }
    });
}

/// After a stop: another client on another compute node reads every key
/// (the preloaded ones with their values; `x` absent or with its value,
/// the same twice), then updates, deletes and inserts, and the table's
/// memory ends up exactly the model.
fn others_carry_on(
    w: &mut World,
    table: &Arc<Cuckoo>,
    preload: &BTreeMap<u64, u64>,
    x: u64,
    vx: u64,
) {
    let model = Rc::new(RefCell::new(preload.clone()));
    let (t, m) = (table.clone(), model.clone());
    run_on(w, 1, move |ctx| async move {
        let mut c = t.client().unwrap();
        let out = m;
        let mut m = out.borrow().clone();
        for (&k, &v) in m.iter() {
            assert_eq!(
                get_u64(&mut c, &ctx, k).await.unwrap(),
                Some(v),
                "key {k} lost"
            );
        }
        let x1 = get_u64(&mut c, &ctx, x).await.unwrap();
        let x2 = get_u64(&mut c, &ctx, x).await.unwrap();
        assert_eq!(x1, x2, "the stopped put's key flips");
        assert!(x1.is_none() || x1 == Some(vx), "{x1:?}");
        if let Some(v) = x1 {
            m.insert(x, v);
        }
        let keys: Vec<u64> = m.keys().copied().collect();
        for &k in &keys {
            put_u64(&mut c, &ctx, k, k + 1_000).await.unwrap();
            m.insert(k, k + 1_000);
        }
        for &k in keys.iter().step_by(3) {
            assert!(delete_u64(&mut c, &ctx, k).await.unwrap(), "delete {k}");
            m.remove(&k);
        }
        for k in 20_000..20_030u64 {
            match put_u64(&mut c, &ctx, k, 5).await {
                Ok(()) => {
                    m.insert(k, 5);
                }
                Err(CuckooError::TableFull) => {}
                Err(e) => panic!("{e}"),
            }
        }
        for (&k, &v) in m.iter() {
            assert_eq!(get_u64(&mut c, &ctx, k).await.unwrap(), Some(v), "key {k}");
        }
        *out.borrow_mut() = m;
    });
    let a = audit_sim(w, 8);
    assert_eq!(
        a.map,
        *model.borrow(),
        "the table's memory differs from the model"
    );
}

/// A put that must displace, stopped after each of its CASes in turn:
/// claim of the move's destination, commit (Forward), promotion, clearing
/// the source, then the insert's claim and commit.
#[test]
fn a_client_stopped_dead_mid_displacement_leaves_the_table_usable() {
    let (mut forward_left, mut tentative_left, mut steps) = (0, 0, 0);
    for k in 1..=16u32 {
        let mut w = sim_world(5, 2, 2);
        let table = Cuckoo::new(quick(cfg(64, 8, 32))).unwrap();
        sim_create_table(&mut w, &table);
        let preload: BTreeMap<u64, u64> = (0..58u64).map(|k| (k, k * 3)).collect();
        preload_table(&mut w, &table, &preload);
        let before = audit_sim(&w, 8);
        assert_eq!(before.map, preload);
        let x = (10_000..).find(|&x| before.both_full(x)).unwrap();
        let result = Rc::new(RefCell::new(None));
        let (t, r) = (table.clone(), result.clone());
        run_on(&mut w, 0, move |ctx| async move {
            let mut c = t.client().unwrap();
            c.stop_after_cas(k);
            let out = put_u64(&mut c, &ctx, x, 777).await;
            *r.borrow_mut() = Some((out, c.stats));
        });
        let (out, stats) = result.borrow_mut().take().unwrap();
        let mid = audit_sim(&w, 8);
        for (&k, &v) in &preload {
            assert_eq!(mid.map.get(&k), Some(&v), "stop after CAS {k}: key lost");
        }
        forward_left += (mid.forward > 0) as u32;
        tentative_left += (mid.tentative > 0) as u32;
        match out {
            Err(CuckooError::Stopped) => steps += 1,
            Ok(()) => {
                assert!(stats.moves >= 1, "the put did not displace: {stats:?}");
                others_carry_on(&mut w, &table, &preload, x, 777);
                break;
            }
            Err(e) => panic!("{e}"),
        }
        others_carry_on(&mut w, &table, &preload, x, 777);
    }
    eprintln!("stopped at {steps} CASes; left a Forward word {forward_left} times, a Tentative one {tentative_left} times");
    assert!(steps >= 6, "a displacing put took only {steps} CASes");
    assert!(forward_left >= 2 && tentative_left >= 2);
}

/// A put that finds no room in a table that may grow (64 slots, up to
/// 256) drives a doubling, and is stopped after each of its CASes in turn:
/// the displacement attempts before it, the root swings (start, Placing,
/// Stable), and every step of the split walk's moves. Each time another
/// client on another compute node finds every key, finishes the growth
/// it left (a stopped driver blocks nobody), updates, deletes and
/// inserts, and the table's memory ends up exactly the model.
#[test]
fn a_client_stopped_dead_mid_growth_leaves_the_table_usable() {
    let growing_cfg = || {
        let mut c = quick(cfg(64, 8, 32));
        c.max_capacity = 256;
        c.view_lease_ns = 20_000;
        c
    };
    // Dry run (the simulator is deterministic): keys go in one by one
    // until a put has to grow the table; that key is the one stopped.
    let (preload, x) = {
        let mut w = sim_world(5, 2, 2);
        let table = Cuckoo::new(growing_cfg()).unwrap();
        sim_create_table(&mut w, &table);
        let found = Rc::new(RefCell::new(None));
        let (t, f) = (table.clone(), found.clone());
        run_on(&mut w, 0, move |ctx| async move {
            let mut c = t.client().unwrap();
            for k in 0..100u64 {
                put_u64(&mut c, &ctx, k, k * 3).await.unwrap();
                if c.stats.growth_steps > 0 {
                    *f.borrow_mut() = Some(k);
                    return;
                }
            }
        });
        let x = found.borrow().expect("the table never grew");
        let preload: BTreeMap<u64, u64> = (0..x).map(|k| (k, k * 3)).collect();
        (preload, x)
    };
    let (mut steps, mut growing_left, mut forward_left) = (0, 0, 0);
    for k in 1..=2000u32 {
        let mut w = sim_world(5, 2, 2);
        let table = Cuckoo::new(growing_cfg()).unwrap();
        sim_create_table(&mut w, &table);
        preload_table(&mut w, &table, &preload);
        let before = audit_sim(&w, 8);
        assert_eq!((before.map.clone(), before.level), (preload.clone(), 0));
        let result = Rc::new(RefCell::new(None));
        let (t, r) = (table.clone(), result.clone());
        run_on(&mut w, 0, move |ctx| async move {
            let mut c = t.client().unwrap();
            c.stop_after_cas(k);
            let out = put_u64(&mut c, &ctx, x, x * 3).await;
            *r.borrow_mut() = Some((out, c.stats));
        });
        let (out, stats) = result.borrow_mut().take().unwrap();
        let mid = audit_sim(&w, 8);
        for (&k, &v) in &preload {
            assert_eq!(mid.map.get(&k), Some(&v), "stop after CAS {k}: key lost");
        }
        growing_left += mid.growing as u32;
        forward_left += (mid.forward > 0 && mid.growing) as u32;
        match out {
            Err(CuckooError::Stopped) => steps += 1,
            Ok(()) => {
                assert!(stats.growth_steps >= 3, "{stats:?}");
                others_carry_on(&mut w, &table, &preload, x, x * 3);
                break;
            }
            Err(e) => panic!("{e}"),
        }
        others_carry_on(&mut w, &table, &preload, x, x * 3);
    }
    eprintln!(
        "stopped at {steps} CASes; left the table growing {growing_left} times, \
         with a Forward word {forward_left} times"
    );
    assert!(steps >= 20, "a growing put took only {steps} CASes");
    assert!(growing_left >= 10 && forward_left >= 2);
}

/// A world of two memory nodes and two compute nodes with `faults`, a
/// handle on a table of `cfg` for each compute node, and 100 keys (value
/// k + 7) preloaded from compute node 0.
fn two_compute_nodes(
    seed: u64,
    cfg: &CuckooConfig,
    faults: Vec<Fault>,
) -> (World, [Arc<Cuckoo>; 2], BTreeMap<u64, u64>) {
    let mut w = World::new(SimConfig {
        seed,
        memory_nodes: 2,
        compute_nodes: 2,
        host_bytes: HOST,
        dm_bytes: DM,
        faults,
        ..Default::default()
    })
    .unwrap();
    let tables = [
        Cuckoo::new(cfg.clone()).unwrap(),
        Cuckoo::new(cfg.clone()).unwrap(),
    ];
    sim_create_table(&mut w, &tables[0]);
    let preload: BTreeMap<u64, u64> = (0..100u64).map(|k| (k, k + 7)).collect();
    preload_table(&mut w, &tables[0], &preload);
    (w, tables, preload)
}

/// Two threads of two clients on each of two compute nodes, recorded
/// into one history: node 0's run `survivors`, node 1's run `doomed`
/// (the node a test crashes). Runs the world until node 0's four clients
/// are done and `until_ns` has passed, and returns the history.
fn survivors_and_doomed(
    w: &mut World,
    tables: &[Arc<Cuckoo>; 2],
    seed: u64,
    survivors: Workload,
    doomed: Workload,
    until_ns: u64,
) -> History {
    let h = Rc::new(RefCell::new(History::new()));
    let sink: StatsSink = Arc::new(Mutex::new(CuckooStats::default()));
    let done = Rc::new(Cell::new(0u32));
    let mut me = 1u32;
    for cn in 0..2u16 {
        for _ in 0..2 {
            let t = w.add_thread(cn, exec_cfg(2)).unwrap();
            for _ in 0..2 {
                let c = tables[cn as usize].client().unwrap();
                let wl = if cn == 0 {
                    survivors.clone()
                } else {
                    doomed.clone()
                };
                let (rec, sink, d, id) = (Rec::Local(h.clone()), sink.clone(), done.clone(), me);
                w.spawn(t, move |ctx| async move {
                    random_client(ctx, c, rec, id, seed, wl, turn_clock, sink).await;
                    if cn == 0 {
                        d.set(d.get() + 1);
                    }
                })
                .unwrap();
                me += 1;
            }
        }
    }
    for _ in 0..10_000 {
        if done.get() == 4 && w.now_ns() > until_ns {
            break;
        }
        w.run_until(w.now_ns() + 1_000_000);
    }
    assert_eq!(
        done.get(),
        4,
        "seed {seed}: the surviving clients did not finish"
    );
    let h = h.borrow().clone();
    h
}

/// Compute node 1 crashes at a seed-chosen moment while its four clients
/// insert and delete keys in a nearly full table (moving the others'
/// keys); compute node 0's four clients get and update 100 preloaded keys
/// throughout, recorded. Their history is linearizable (the crashed
/// clients' last operations pending), no preloaded key is lost, and a new
/// client afterwards reads, writes and fills the table.
#[test]
fn cuckoo_compute_node_crash_during_displacement_on_sim() {
    let leftovers = RefCell::new(0);
    for_each_seed(
        "cuckoo_compute_node_crash_during_displacement_on_sim",
        10,
        |seed| {
            let crash_ns = 1_600_000 + (seed * 37_777) % 600_000;
            let crash = Fault {
                at_ns: crash_ns,
                kind: FaultKind::CrashComputeNode { node: 1 },
            };
            let (mut w, tables, preload) =
                two_compute_nodes(seed, &quick(cfg(128, 8, 48)), vec![crash]);
            assert!(
                w.now_ns() < crash_ns,
                "preload ran past the crash: {} ns",
                w.now_ns()
            );
            let hot = Arc::new((0..100u64).collect::<Vec<_>>());
            let movers = Arc::new((1000..1040u64).collect::<Vec<_>>());
            let h = survivors_and_doomed(
                &mut w,
                &tables,
                seed,
                Workload {
                    put: 4,
                    get: 6,
                    keys: hot,
                    ops: 400,
                    leave: false,
                    verb_errors: None,
                },
                Workload {
                    put: 6,
                    get: 0,
                    keys: movers,
                    ops: 400,
                    leave: false,
                    verb_errors: None,
                },
                crash_ns,
            );
            let v = h.check(&preload);
            assert!(v.is_ok(), "seed {seed}: {v:?}");
            let a = audit_sim(&w, 8);
            for k in 0..100u64 {
                assert!(a.map.contains_key(&k), "seed {seed}: key {k} lost");
            }
            *leftovers.borrow_mut() += (a.forward + a.tentative > 0) as u32;
            // A newcomer reads what memory holds, clears the crashed clients'
            // keys, rewrites everything and fills the table up.
            let state = a.map.clone();
            let t = tables[0].clone();
            let model = Rc::new(RefCell::new(BTreeMap::new()));
            let m = model.clone();
            run_on(&mut w, 0, move |ctx| async move {
                let mut c = t.client().unwrap();
                let out = m;
                let mut m = BTreeMap::new();
                for k in (0..100u64).chain(1000..1040) {
                    assert_eq!(
                        get_u64(&mut c, &ctx, k).await.unwrap(),
                        state.get(&k).copied(),
                        "key {k}"
                    );
                }
                for k in 1000..1040u64 {
                    delete_u64(&mut c, &ctx, k).await.unwrap();
                }
                for k in 0..100u64 {
                    put_u64(&mut c, &ctx, k, k * 2).await.unwrap();
                    m.insert(k, k * 2);
                }
                for k in 5000..5100u64 {
                    match put_u64(&mut c, &ctx, k, 1).await {
                        Ok(()) => {
                            m.insert(k, 1);
                        }
                        Err(CuckooError::TableFull) => break,
                        Err(e) => panic!("{e}"),
                    }
                }
                *out.borrow_mut() = m;
            });
            let end = audit_sim(&w, 8);
            assert_eq!(end.map, *model.borrow(), "seed {seed}");
            assert!(
                end.map.len() >= 120,
                "seed {seed}: only {} keys fit",
                end.map.len()
            );
        },
    );
    let n = leftovers.into_inner();
    eprintln!("crashes that left a Forward or Tentative word behind: {n}");
    assert!(n > 0, "no crash hit a move or an insert in flight");
}

/// Compute node 1's four clients insert 300 new keys into a table made
/// for 128 that may grow to 1024, and the node crashes at a seed-chosen
/// moment while they grow it; compute node 0's four clients get and
/// update 100 preloaded keys throughout, recorded. Their history is
/// linearizable, no key is lost, and a newcomer afterwards reads every
/// key, finishes the growth the crashed node left, and fills the table.
#[test]
fn cuckoo_compute_node_crash_during_growth_on_sim() {
    let left_growing = RefCell::new(0);
    for_each_seed(
        "cuckoo_compute_node_crash_during_growth_on_sim",
        10,
        |seed| {
            let mut cfg = quick(cfg(128, 8, 48));
            cfg.max_capacity = 1024;
            cfg.view_lease_ns = 20_000;
            let (mut w, tables, preload) = two_compute_nodes(seed, &cfg, vec![]);
            let crash_ns = w.now_ns() + 300_000 + (seed * 137_777) % 2_500_000;
            w.add_faults(&[Fault {
                at_ns: crash_ns,
                kind: FaultKind::CrashComputeNode { node: 1 },
            }])
            .unwrap();
            let hot = Arc::new((0..100u64).collect::<Vec<_>>());
            let growers = Arc::new((1000..1300u64).collect::<Vec<_>>());
            let h = survivors_and_doomed(
                &mut w,
                &tables,
                seed,
                Workload {
                    put: 4,
                    get: 6,
                    keys: hot,
                    ops: 400,
                    leave: false,
                    verb_errors: None,
                },
                Workload {
                    put: 9,
                    get: 1,
                    keys: growers,
                    ops: 400,
                    leave: false,
                    verb_errors: None,
                },
                crash_ns,
            );
            let v = h.check(&preload);
            assert!(v.is_ok(), "seed {seed}: {v:?}");
            let a = audit_sim(&w, 8);
            for k in 0..100u64 {
                assert!(a.map.contains_key(&k), "seed {seed}: key {k} lost");
            }
            *left_growing.borrow_mut() += a.growing as u32;
            // A newcomer reads what memory holds, rewrites it and fills the
            // table up: its puts drive any growth left half done.
            let state = a.map.clone();
            let t = tables[0].clone();
            let model = Rc::new(RefCell::new(BTreeMap::new()));
            let m = model.clone();
            run_on(&mut w, 0, move |ctx| async move {
                let mut c = t.client().unwrap();
                let out = m;
                let mut m = state.clone();
                for k in (0..100u64).chain(1000..1300) {
                    assert_eq!(
                        get_u64(&mut c, &ctx, k).await.unwrap(),
                        state.get(&k).copied(),
                        "key {k}"
                    );
                }
                for k in 0..100u64 {
                    put_u64(&mut c, &ctx, k, k * 2).await.unwrap();
                    m.insert(k, k * 2);
                }
                for k in 5000..6000u64 {
                    match put_u64(&mut c, &ctx, k, 1).await {
                        Ok(()) => {
                            m.insert(k, 1);
                        }
                        Err(CuckooError::TableFull) => break,
                        Err(e) => panic!("{e}"),
                    }
                }
                *out.borrow_mut() = m;
            });
            let end = audit_sim(&w, 8);
            assert_eq!(end.map, *model.borrow(), "seed {seed}");
            assert!(!end.growing, "seed {seed}: the newcomer left it growing");
            assert!(
                end.map.len() >= 900,
                "seed {seed}: only {} keys fit",
                end.map.len()
            );
        },
    );
    let n = left_growing.into_inner();
    eprintln!("crashes that left the table growing: {n} of the seeds");
    assert!(n > 0, "no crash hit a growth in flight");
}

/// An update whose CAS loses to a move of its key must not count as
/// eliminated (the move changed the word, not the value): the update is
/// held between its snapshot and its CAS while another client's put
/// displaces that very key — stopped right after the move's commit (the
/// CAS finds a Forward word naming a copy of the same value) or finished
/// (the CAS finds the slot empty). Either way the update retries and its
/// value is what everyone reads next. A dry run (the simulator is
/// deterministic) tells which key the displacement moves.
#[test]
fn an_update_racing_a_move_of_its_key_retries() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let preload: BTreeMap<u64, u64> = (0..58u64).map(|k| (k, k * 3)).collect();
    let setup = |w: &mut World| {
        let table = Cuckoo::new(cfg(64, 8, 32)).unwrap();
        sim_create_table(w, &table);
        preload_table(w, &table, &preload);
        let x = (10_000..).find(|&x| audit_sim(w, 8).both_full(x)).unwrap();
        (table, x)
    };
    // Dry run: the key the displacement commits a move of first.
    let mut w = sim_world(9, 2, 1);
    let (table, x) = setup(&mut w);
    let t = table.clone();
    run_on(&mut w, 0, move |ctx| async move {
        let mut c = t.client().unwrap();
        c.stop_after_cas(2);
        assert!(matches!(
            put_u64(&mut c, &ctx, x, 1).await,
            Err(CuckooError::Stopped)
        ));
    });
    let moved = audit_sim(&w, 8).forward_keys;
    assert_eq!(moved.len(), 1, "{moved:?}");
    let k = moved[0];
    for stop_mover in [Some(2u32), None] {
        let mut w = sim_world(9, 2, 1);
        let (table, x2) = setup(&mut w);
        assert_eq!(x2, x);
        let gate = Arc::new(AtomicBool::new(false));
        let ready = Rc::new(Cell::new(false));
        let updated = Rc::new(Cell::new(false));
        // The updater: snapshot, then held before its CAS.
        let (t, g, u) = (table.clone(), gate.clone(), updated.clone());
        let th = w.add_thread(0, exec_cfg(1)).unwrap();
        w.spawn(th, move |ctx| async move {
            let mut c = t.client().unwrap();
            c.hold_before_cas(g);
            put_u64(&mut c, &ctx, k, 4242).await.unwrap();
            assert_eq!(c.stats.eliminated, 0, "eliminated by a move");
            assert!(c.stats.cas_failures >= 1, "the CAS did not race the move");
            u.set(true);
        })
        .unwrap();
        // The mover starts once the updater is parked (a few µs in).
        let (t, g, r) = (table.clone(), gate.clone(), ready.clone());
        let th = w.add_thread(0, exec_cfg(1)).unwrap();
        w.spawn(th, move |ctx| async move {
            let until = ctx.now_ns() + 30_000;
            while ctx.now_ns() < until {
                ctx.yield_now().await;
            }
            let mut c = t.client().unwrap();
            if let Some(n) = stop_mover {
                c.stop_after_cas(n);
            }
            let r2 = put_u64(&mut c, &ctx, x, 1).await;
            assert!(stop_mover.is_some() == r2.is_err(), "{r2:?}");
            g.store(true, Ordering::Release);
            r.set(true);
        })
        .unwrap();
        for _ in 0..1000 {
            if updated.get() && ready.get() {
                break;
            }
            w.run_until(w.now_ns() + 100_000);
        }
        assert!(updated.get() && ready.get(), "stuck ({stop_mover:?})");
        let t = table.clone();
        run_on(&mut w, 0, move |ctx| async move {
            let mut c = t.client().unwrap();
            assert_eq!(
                get_u64(&mut c, &ctx, k).await.unwrap(),
                Some(4242),
                "update lost"
            );
        });
        let a = audit_sim(&w, 8);
        assert_eq!(a.map.get(&k), Some(&4242));
    }
}
