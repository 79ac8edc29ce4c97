//! Reconfiguration's first steps (FaRM §5.2: suspect, probe, update the
//! store by compare-and-swap) on the simulator over seeds, with leases on
//! their own cores: one new configuration without the failed machines,
//! led by the CM or by the first live backup CM; never one from the
//! minority side of a partition; and the region remap of step four.

use nicdrv::sim::{for_each_seed, Fault, FaultKind, SimModel};
use proptest::prelude::*;
use std::sync::Arc;
use txn::config::{ConfigStore, Configuration, EmbeddedStore};
use txn::harness::{run_leases_sim, LeaseRun, LeaseSim};
use txn::reconfig::{remap, Event};
use txn::Geometry;

const L: u64 = 10_000_000;

fn geo(machines: u16) -> Geometry {
    Geometry {
        machines,
        threads: 1,
        f: 2,
        regions_per_machine: 2,
        spare_regions_per_machine: 1,
        region_bytes: 64 << 10,
        static_bytes: 64 << 10,
        block_bytes: 1 << 20,
        log_bytes: 64 << 10,
        reply_bytes: 4 << 10,
    }
}

fn at(at_ns: u64, kind: FaultKind) -> Fault {
    Fault { at_ns, kind }
}

fn crash(at_ns: u64, machine: u16) -> Fault {
    at(at_ns, FaultKind::CrashMachine { machine })
}

/// The run, and the store's configuration at its end.
fn run(machines: u16, seed: u64, faults: Vec<Fault>) -> (LeaseRun, Configuration) {
    let store = Arc::new(EmbeddedStore::new());
    let r = run_leases_sim(
        geo(machines),
        seed,
        SimModel::default(),
        &LeaseSim {
            faults,
            store: Some(store.clone()),
            ..LeaseSim::of(L, 60_000_000)
        },
    )
    .unwrap();
    for (m, e) in &r.reconfig {
        assert!(e.is_ok(), "seed {seed}: machine {m}: {e:?}");
    }
    (r, store.read().unwrap().unwrap().config)
}

/// Every `Committed` event: (machine, configuration, when).
fn committed(r: &LeaseRun) -> Vec<(u16, Configuration, u64)> {
    r.reconfig
        .iter()
        .flat_map(|(m, e)| {
            e.as_ref().unwrap().iter().filter_map(move |ev| match ev {
                Event::Committed { at_ns, config, .. } => Some((*m, config.clone(), *at_ns)),
                _ => None,
            })
        })
        .collect()
}

fn without(n: u16, out: &[u16]) -> Vec<(u16, u32)> {
    (0..n)
        .filter(|m| !out.contains(m))
        .map(|m| (m, m as u32))
        .collect()
}

/// The bound on crash-to-configuration: a lease, a renewal, a probe's
/// transport timeout per failed machine, and backup CMs' turns.
fn bound(failed: u64, turns: u64) -> u64 {
    L + L / 5 + failed * 1_100_000 + turns * txn::reconfig::TAKEOVER_STEP_NS + 200_000
}

#[test]
fn the_cm_removes_a_crashed_machine() {
    for_each_seed("the_cm_removes_a_crashed_machine", 200, |seed| {
        let victim = 1 + (seed % 5) as u16;
        let t = 15_000_000 + seed * 7_919 % 3_000_000;
        let (r, c) = run(6, seed, vec![crash(t, victim)]);
        let want = Configuration {
            id: 2,
            machines: without(6, &[victim]),
            cm: 0,
        };
        assert_eq!(c, want, "seed {seed}");
        let done = committed(&r);
        assert_eq!(done.len(), 1, "seed {seed}: {done:?}");
        assert_eq!(done[0].0, 0);
        assert!(done[0].2 - t <= bound(1, 0), "seed {seed}: {done:?}");
    });
}

#[test]
fn the_first_backup_cm_takes_over_from_a_crashed_cm() {
    for_each_seed("the_first_backup_cm_takes_over", 200, |seed| {
        let t = 15_000_000 + seed * 7_919 % 3_000_000;
        let (r, c) = run(5, seed, vec![crash(t, 0)]);
        assert_eq!(
            c,
            Configuration {
                id: 2,
                machines: without(5, &[0]),
                cm: 1
            },
            "seed {seed}"
        );
        let done = committed(&r);
        assert_eq!(done.len(), 1, "seed {seed}: {done:?}");
        assert!(done[0].2 - t <= bound(0, 0), "seed {seed}: {done:?}");
        // The other backups learnt of it instead of making their own.
        for (m, e) in &r.reconfig {
            if *m > 1 {
                let e = e.as_ref().unwrap();
                assert!(
                    matches!(e.last(), Some(Event::Superseded { config, .. }) if *config == c),
                    "seed {seed}: machine {m}: {e:?}"
                );
            }
        }
    });
}

#[test]
fn two_machines_crashing_at_once_cm_included() {
    for_each_seed("two_machines_crashing_at_once", 200, |seed| {
        let t = 15_000_000 + seed * 7_919 % 3_000_000;
        // The CM and its first backup: the second backup takes over.
        let (r, c) = run(6, seed, vec![crash(t, 0), crash(t, 1)]);
        assert_eq!(
            c,
            Configuration {
                id: 2,
                machines: without(6, &[0, 1]),
                cm: 2
            },
            "seed {seed}"
        );
        let done = committed(&r);
        assert_eq!(done.len(), 1, "seed {seed}: {done:?}");
        assert!(done[0].2 - t <= bound(1, 1), "seed {seed}: {done:?}");
    });
}

#[test]
fn the_minority_side_of_a_partition_makes_no_configuration() {
    for_each_seed("the_minority_side_of_a_partition", 200, |seed| {
        let t = 15_000_000 + seed * 7_919 % 3_000_000;
        // The CM and machine 1 on one side, 2, 3, 4 on the other.
        let side = 0b11;
        let (r, c) = run(5, seed, vec![at(t, FaultKind::Partition { side })]);
        assert_eq!(
            c,
            Configuration {
                id: 2,
                machines: without(5, &[0, 1]),
                cm: 2
            },
            "seed {seed}"
        );
        let done = committed(&r);
        assert_eq!(done.len(), 1, "seed {seed}: {done:?}");
        let cm = r.reconfig.iter().find(|e| e.0 == 0).unwrap();
        assert!(
            cm.1.as_ref()
                .unwrap()
                .iter()
                .any(|e| matches!(e, Event::NoMajority { answered: 2, .. })),
            "seed {seed}: {cm:?}"
        );
    });
}

fn map_of(g: Geometry) -> txn::regions::RegionMap {
    g.region_map().unwrap()
}

proptest! {
    /// Remapping after any set of failures that leaves every region a
    /// replica: primaries are old replicas that survived, every region has
    /// f backups on live machines, all distinct, none on a failed one; a
    /// region that kept its primary keeps it.
    #[test]
    fn remap_keeps_every_region_on_live_machines(
        machines in 4u16..9, failed_bits in any::<u16>(),
    ) {
        let g = geo(machines);
        let map = map_of(g);
        let failed: Vec<u16> = (0..machines).filter(|m| failed_bits & (1 << m) != 0).collect();
        let next = Configuration { id: 2, machines: without(machines, &failed), cm: 0 };
        prop_assume!(next.machines.len() > g.f);
        let mut spare = std::collections::BTreeMap::<u16, u64>::new();
        let out = remap(&map, &next, |m, r| {
            let k = spare.entry(m).or_insert(0);
            *k += 1;
            Some(1 << 30 | (*k * r.bytes))
        });
        let lost = map.iter().any(|r| {
            std::iter::once(&r.primary).chain(&r.backups).all(|x| failed.contains(&x.machine))
        });
        match out {
            Err(_) => prop_assert!(lost),
            Ok(m2) => {
                prop_assert!(!lost);
                prop_assert_eq!(m2.len(), map.len());
                for r in map.iter() {
                    let n = m2.get(r.id).unwrap();
                    let old: Vec<u16> = std::iter::once(&r.primary).chain(&r.backups).map(|x| x.machine).collect();
                    prop_assert!(old.contains(&n.primary.machine));
                    if !failed.contains(&r.primary.machine) {
                        prop_assert_eq!(n.primary, r.primary);
                    }
                    prop_assert_eq!(n.backups.len(), g.f);
                    for x in std::iter::once(&n.primary).chain(&n.backups) {
                        prop_assert!(!failed.contains(&x.machine));
                    }
                }
            }
        }
    }
}
