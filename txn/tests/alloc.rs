//! Allocation as part of transactions, on the simulator and on emu:
//! allocated objects read back, freed and never-allocated ones are
//! errors, aborts give slots back, a freed and reallocated object fails a
//! reader's validation, a full region says so, concurrent clients never
//! share a slot, and allocator recovery rebuilds the free lists from any
//! replica of a region.

mod common;

use common::run_emu as emu;
use nicdrv::rng::Rng;
use nicdrv::sim::{for_each_seed, SimModel};
use nicdrv::{Ctx, Nic};
use txn::harness::{run_sim, Client, Report};
use txn::object::{decode, object_bytes};
use txn::{Abort, Coordinator, Geometry, ObjAddr, Outcome, TxError};

/// Small blocks (63 slots of one line) so that blocks fill and regions
/// run out.
fn geo(threads: u16) -> Geometry {
    Geometry {
        machines: 3,
        threads,
        f: 1,
        regions_per_machine: 1,
        spare_regions_per_machine: 0,
        region_bytes: 4096 + 2 * 4096,
        static_bytes: 4096,
        block_bytes: 4096,
        log_bytes: 64 << 10,
        reply_bytes: 4 << 10,
    }
}

fn value(i: u64) -> Vec<u8> {
    let mut v = vec![0u8; 24];
    v[..8].copy_from_slice(&i.to_le_bytes());
    v[8..16].copy_from_slice(&(!i).to_le_bytes());
    v
}

/// One client walks through every case, one transaction at a time.
struct Cases {
    active: bool,
}

async fn commit<N: Nic>(ctx: &Ctx<N>, c: &mut Coordinator, tx: txn::Tx) -> Result<(), TxError> {
    match c.commit(ctx, tx).await? {
        Outcome::Committed => Ok(()),
        Outcome::Aborted(a) => panic!("aborted alone: {a}"),
    }
}

impl<N: Nic> Client<N> for Cases {
    type Out = ();
    async fn run(self, ctx: &Ctx<N>, c: &mut Coordinator) -> Result<(), TxError> {
        if !self.active {
            return Ok(());
        }
        // Three objects allocated, written, committed, read back.
        let mut tx = c.begin();
        let mut objs = Vec::new();
        for i in 0..3 {
            let at = c.alloc(ctx, &mut tx, 0, 24).await?;
            tx.write(at, &value(i))?;
            objs.push(at);
        }
        assert!(
            objs.iter().all(|a| a.offset >= 4096),
            "in the allocator's blocks"
        );
        commit(ctx, c, tx).await?;
        let mut tx = c.begin();
        for (i, &at) in objs.iter().enumerate() {
            assert_eq!(c.read(ctx, &mut tx, at, 24).await?, value(i as u64));
        }
        commit(ctx, c, tx).await?;
        // Bad input: a larger value, a wrong size, a region that does not
        // exist, a block never formatted, an address between slots.
        let mut tx = c.begin();
        c.read(ctx, &mut tx, objs[0], 24).await?;
        assert!(matches!(
            tx.write(objs[0], &[0; 25]),
            Err(TxError::Usage(_))
        ));
        let r = c.read(ctx, &mut tx, objs[1], 30).await;
        assert!(matches!(r, Err(TxError::NotAnObject(_))), "{r:?}");
        let r = c
            .read(
                ctx,
                &mut tx,
                ObjAddr {
                    region: 99,
                    offset: 0,
                },
                8,
            )
            .await;
        assert!(matches!(r, Err(TxError::Region(_))), "{r:?}");
        let unformatted = ObjAddr {
            region: 1,
            offset: 4096 + 64,
        };
        let r = c.read(ctx, &mut tx, unformatted, 24).await;
        assert!(matches!(r, Err(TxError::NotAnObject(_))), "{r:?}");
        let between = ObjAddr {
            region: 0,
            offset: objs[0].offset + 8,
        };
        let r = c.read(ctx, &mut tx, between, 24).await;
        assert!(matches!(r, Err(TxError::NotAnObject(_))), "{r:?}");
        let fixed = ObjAddr {
            region: 0,
            offset: 0,
        };
        c.read(ctx, &mut tx, fixed, 8).await?;
        assert!(
            matches!(tx.free(fixed), Err(TxError::Usage(_))),
            "fixed tables are not freed"
        );
        commit(ctx, c, tx).await?;
        // Free one: reading it is an error after.
        let mut tx = c.begin();
        c.read(ctx, &mut tx, objs[2], 24).await?;
        tx.free(objs[2])?;
        assert!(matches!(
            tx.write(objs[2], &value(9)),
            Err(TxError::Usage(_))
        ));
        commit(ctx, c, tx).await?;
        let mut tx = c.begin();
        let r = c.read(ctx, &mut tx, objs[2], 24).await;
        assert_eq!(r, Err(TxError::Freed(objs[2])));
        // An allocation given up returns its slot: the freed one (the
        // free list is last in, first out), then again after the abort.
        let at = c.alloc(ctx, &mut tx, 0, 24).await?;
        assert_eq!(at, objs[2], "the freed slot is reused");
        c.abort(ctx, tx).await?;
        let mut tx = c.begin();
        assert_eq!(
            c.alloc(ctx, &mut tx, 0, 24).await?,
            objs[2],
            "the abort gave it back"
        );
        tx.write(objs[2], &value(20))?;
        commit(ctx, c, tx).await?;
        // A reader of an object freed and reallocated meanwhile (same
        // slot, next incarnation) fails validation.
        let mut reader = c.begin();
        c.read(ctx, &mut reader, objs[1], 24).await?;
        c.read(ctx, &mut reader, objs[0], 24).await?;
        let mut tx = c.begin();
        c.read(ctx, &mut tx, objs[1], 24).await?;
        tx.free(objs[1])?;
        commit(ctx, c, tx).await?;
        let mut tx = c.begin();
        assert_eq!(c.alloc(ctx, &mut tx, 0, 24).await?, objs[1]);
        tx.write(objs[1], &value(1))?;
        commit(ctx, c, tx).await?;
        reader.write(objs[0], &value(5))?;
        assert_eq!(
            c.commit(ctx, reader).await?,
            Outcome::Aborted(Abort::Changed)
        );
        // A region fills: two blocks of 63 one-line slots.
        let mut n = 0;
        loop {
            let mut tx = c.begin();
            match c.alloc(ctx, &mut tx, 2, 8).await {
                Ok(_) => {
                    commit(ctx, c, tx).await?;
                    n += 1;
                }
                Err(TxError::NoSpace { region: 2, len: 8 }) => break,
                Err(e) => return Err(e),
            }
        }
        assert_eq!(n, 2 * 63);
        Ok(())
    }
}

#[test]
fn allocation_cases_on_sim_and_emu() {
    let g = geo(1);
    for_each_seed("allocation_cases_on_sim_and_emu", 5, |seed| {
        let (r, _) = run_sim(g, seed, SimModel::default(), |m, _| Cases {
            active: m == 0,
        })
        .unwrap();
        if let Some(e) = r.first_error() {
            panic!("seed {seed}: {e}");
        }
    });
    let r = emu(g, |m, _| Cases { active: m == 0 });
    if let Some(e) = r.first_error() {
        panic!("emu: {e}");
    }
}

/// Each client allocates objects with values of its own, and frees some
/// of its live ones, each in a transaction.
struct Churn {
    seed: u64,
    client: u64,
    steps: u32,
}

/// The client's live objects at the end, with their values.
type Live = Vec<(ObjAddr, Vec<u8>)>;

impl<N: Nic> Client<N> for Churn {
    type Out = Live;
    async fn run(self, ctx: &Ctx<N>, c: &mut Coordinator) -> Result<Live, TxError> {
        let mut rng = Rng::new(self.seed);
        let mut live: Live = Vec::new();
        for i in 0..self.steps as u64 {
            let mut tx = c.begin();
            if !live.is_empty() && rng.below(3) == 0 {
                let k = rng.below(live.len() as u64) as usize;
                let at = live[k].0;
                assert_eq!(
                    c.read(ctx, &mut tx, at, 24).await?,
                    live[k].1,
                    "an object of mine changed"
                );
                tx.free(at)?;
                if c.commit(ctx, tx).await? == Outcome::Committed {
                    live.swap_remove(k);
                }
            } else {
                let region = rng.below(3) as u32;
                let v = value(self.client << 32 | i);
                match c.alloc(ctx, &mut tx, region, 24).await {
                    Ok(at) => {
                        tx.write(at, &v)?;
                        if c.commit(ctx, tx).await? == Outcome::Committed {
                            live.push((at, v));
                        }
                    }
                    Err(TxError::NoSpace { .. }) => c.abort(ctx, tx).await?,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(live)
    }
}

fn no_shared_slots(g: Geometry, r: &Report<Live>) {
    if let Some(e) = r.first_error() {
        panic!("{e}");
    }
    let map = g.region_map().unwrap();
    let mut all: Vec<ObjAddr> = Vec::new();
    for c in &r.clients {
        for (at, v) in c.out.as_ref().unwrap() {
            all.push(*at);
            let n = object_bytes(24);
            let p = map.on_primary(*at, n as u64).unwrap();
            let mut out = vec![0u8; 24];
            let h = decode(
                &r.memory[p.node() as usize][p.offset() as usize..][..n],
                &mut out,
            )
            .unwrap()
            .expect("a consistent copy");
            assert!(!h.is_free(), "a live object's slot is free");
            assert_eq!(&out, v, "a live object lost its value");
        }
    }
    let n = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), n, "two live objects share a slot");
    assert!(n > 0);
}

/// Two churning clients a machine on the simulator, checked for shared
/// slots.
fn churn_on_sim(g: Geometry, seed: u64) -> Report<Live> {
    let (r, _) = run_sim(g, seed, SimModel::default(), |m, t| Churn {
        seed: seed * 100 + (m * 2 + t) as u64,
        client: (m * 2 + t) as u64,
        steps: 40,
    })
    .unwrap();
    no_shared_slots(g, &r);
    r
}

#[test]
fn concurrent_clients_never_share_a_slot() {
    let g = geo(2);
    for_each_seed("concurrent_clients_never_share_a_slot", 40, |seed| {
        churn_on_sim(g, seed);
    });
    let r = emu(geo(1), |m, t| Churn {
        seed: (m * 2 + t) as u64,
        client: (m * 2 + t) as u64,
        steps: 300,
    });
    no_shared_slots(geo(1), &r);
}

/// The configuration manager creates regions at run time; every machine
/// learns each one, and its objects are allocated, committed and
/// replicated like any other's.
struct Creator;

/// (region allocated in, its objects with their values)
type Made = Vec<(ObjAddr, Vec<u8>)>;

impl<N: Nic> Client<N> for Creator {
    type Out = Made;
    async fn run(self, ctx: &Ctx<N>, c: &mut Coordinator) -> Result<Made, TxError> {
        let g = geo(1);
        let mut made = Vec::new();
        let me = c.begin().id().machine as u64;
        let region = if me == 0 {
            let a = c.create_region(ctx).await?;
            let b = c.create_region(ctx).await?;
            assert_eq!((a, b), (g.regions(), g.regions() + 1));
            assert_ne!(
                c.map().get(a).unwrap().primary.machine,
                c.map().get(b).unwrap().primary.machine
            );
            // Three machines with one spare region each: a fourth is one
            // too many once the third is made.
            c.create_region(ctx).await?;
            assert!(matches!(c.create_region(ctx).await, Err(TxError::Usage(_))));
            b
        } else {
            // Another machine learns the region from its own map.
            assert!(matches!(c.create_region(ctx).await, Err(TxError::Usage(_))));
            let want = g.regions() + 1;
            while c.map().visible(want).is_err() {
                ctx.sleep(10_000).unwrap().await;
            }
            want
        };
        for i in 0..5 {
            let mut tx = c.begin();
            let at = c.alloc(ctx, &mut tx, region, 24).await?;
            let v = value(me << 32 | i);
            tx.write(at, &v)?;
            if c.commit(ctx, tx).await? == Outcome::Committed {
                made.push((at, v));
            }
        }
        Ok(made)
    }
}

fn created_regions_hold_objects(r: &Report<Made>) {
    if let Some(e) = r.first_error() {
        panic!("{e}");
    }
    let g = Geometry {
        spare_regions_per_machine: 1,
        ..geo(1)
    };
    let mut map = g.region_map().unwrap();
    // The map every machine ended with, rebuilt: the created regions'
    // replicas, read from where their objects lie.
    let ss = r.server_stats().unwrap();
    assert_eq!(
        ss.regions_added,
        3 * 3,
        "three regions, on every machine's map"
    );
    assert_eq!(
        ss.regions_prepared,
        3 * 2,
        "each prepared on its two replicas"
    );
    // Region 3 took the first spare slots of machines 0 and 1; region 4
    // (primary 1, backup 2) the second of machine 1 and the first of 2.
    let region = g.regions() + 1;
    let primary = (region % 3) as u16;
    map.add(txn::regions::Region {
        id: region,
        bytes: g.region_bytes,
        primary: txn::regions::Replica {
            machine: primary,
            base: g.spare_base(1),
        },
        backups: vec![txn::regions::Replica {
            machine: (primary + 1) % 3,
            base: g.spare_base(0),
        }],
    })
    .unwrap();
    let mut n = 0;
    for c in &r.clients {
        for (at, v) in c.out.as_ref().unwrap() {
            n += 1;
            assert_eq!(at.region, region);
            let len = object_bytes(24);
            let p = map.on_primary(*at, len as u64).unwrap();
            let mut out = vec![0u8; 24];
            decode(
                &r.memory[p.node() as usize][p.offset() as usize..][..len],
                &mut out,
            )
            .unwrap()
            .expect("consistent");
            assert_eq!(&out, v);
            for b in map.on_backups(*at, len as u64).unwrap() {
                let got = &r.memory[b.node() as usize][b.offset() as usize..][..len];
                assert_eq!(
                    got,
                    &r.memory[p.node() as usize][p.offset() as usize..][..len]
                );
            }
        }
    }
    assert_eq!(n, 15, "five objects from each machine");
}

#[test]
fn regions_are_created_in_two_phases_and_used_everywhere() {
    let g = Geometry {
        spare_regions_per_machine: 1,
        ..geo(1)
    };
    for_each_seed(
        "regions_are_created_in_two_phases_and_used_everywhere",
        5,
        |seed| {
            let (r, _) = run_sim(g, seed, SimModel::default(), |_, _| Creator).unwrap();
            created_regions_hold_objects(&r);
        },
    );
    created_regions_hold_objects(&emu(g, |_, _| Creator));
}

/// Allocator recovery (FaRM §5.5): after a churn of allocations and frees
/// by concurrent clients, the free lists rebuilt from each replica of each
/// region — a backup's copy, as a backup promoted to primary would scan
/// it — hold exactly the slots of formatted blocks that no live object
/// holds, the same on every replica; slots the backup never saw are
/// formatted free there; and the scan keeps its pace.
#[test]
fn allocator_recovery_rebuilds_the_free_lists_from_any_replica() {
    use nicdrv::sim::{RunEnd, SimConfig, World};
    use nicdrv::Space;
    use std::collections::BTreeSet;
    use std::sync::{Arc, Mutex};
    use txn::alloc::{recover_region, Pace, Recovered};
    let g = geo(2);
    let pace = Pace {
        objects: 10,
        pause_ns: 10_000,
    };
    for_each_seed("allocator_recovery_rebuilds_the_free_lists", 40, |seed| {
        let r = churn_on_sim(g, seed);
        let map = g.region_map().unwrap();
        let mut w = World::new(SimConfig {
            seed,
            memory_nodes: 3,
            compute_nodes: 3,
            machines: 3,
            host_bytes: g.host_bytes().unwrap(),
            ..Default::default()
        })
        .unwrap();
        for m in 0..3u16 {
            assert!(w.write_memory(m, Space::Host, 0, &r.memory[m as usize]));
        }
        type Out = Arc<Mutex<Vec<(u32, u16, bool, Recovered, u64)>>>;
        let out: Out = Arc::default();
        for region in map.iter() {
            let reps = std::iter::once((region.primary, true))
                .chain(region.backups.iter().map(|b| (*b, false)));
            for (rep, primary) in reps {
                let th = w
                    .add_thread(rep.machine, txn::harness::lease_core_config(1))
                    .unwrap();
                let (out, id) = (out.clone(), region.id);
                w.spawn(th, move |ctx| async move {
                    let t0 = ctx.now_ns();
                    let rec = recover_region(&ctx, &g, rep.base, pace).await.unwrap();
                    let took = ctx.now_ns() - t0;
                    out.lock()
                        .unwrap()
                        .push((id, rep.machine, primary, rec, took));
                })
                .unwrap();
            }
        }
        assert_eq!(w.run(), RunEnd::Done, "seed {seed}");
        let out = out.lock().unwrap();
        assert_eq!(out.len(), 3 * 2);
        for region in map.iter() {
            let live: BTreeSet<u64> = r
                .clients
                .iter()
                .flat_map(|c| c.out.as_ref().unwrap())
                .filter(|(at, _)| at.region == region.id)
                .map(|(at, _)| at.offset)
                .collect();
            let mine: Vec<_> = out.iter().filter(|o| o.0 == region.id).collect();
            let free_of = |rec: &Recovered| -> BTreeSet<u64> {
                rec.free.values().flatten().copied().collect()
            };
            let first = free_of(&mine[0].3);
            for (_, machine, primary, rec, took) in &mine {
                let free = free_of(rec);
                assert_eq!(rec.allocated, live.len() as u64, "seed {seed}: {rec:?}");
                assert!(
                    free.is_disjoint(&live),
                    "seed {seed}: a live slot listed free"
                );
                assert_eq!(free.len() as u64 + rec.allocated, rec.slots);
                assert_eq!(free, first, "seed {seed}: replicas disagree");
                assert_eq!(rec.blocks, mine[0].3.blocks);
                if *primary {
                    assert_eq!(rec.formatted_here, 0, "the primary formatted its blocks");
                }
                // Paced: a pause after every `objects` slots.
                assert!(
                    *took >= rec.slots / pace.objects * pace.pause_ns,
                    "seed {seed}: machine {machine} scanned {} slots in {took} ns",
                    rec.slots
                );
                // Every listed slot reads free on this replica now.
                for &off in &free {
                    let h = w
                        .read_u64(
                            *machine,
                            Space::Host,
                            region_base(&map, region.id, *machine) + off,
                        )
                        .unwrap();
                    assert!(txn::object::Header(h).is_free(), "seed {seed}: {off}");
                }
            }
        }
        // A backup never sees the formatting, only committed objects: some
        // slot no transaction ever committed to was formatted there.
        assert!(
            out.iter().any(|o| !o.2 && o.3.formatted_here > 0),
            "seed {seed}"
        );
    });
}

fn region_base(map: &txn::regions::RegionMap, id: u32, machine: u16) -> u64 {
    let r = map.get(id).unwrap();
    std::iter::once(&r.primary)
        .chain(&r.backups)
        .find(|x| x.machine == machine)
        .unwrap()
        .base
}
