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

/// Every configuration stored by compare-and-swap: (machine,
/// configuration, when).
fn committed(r: &LeaseRun) -> Vec<(u16, Configuration, u64)> {
    r.reconfig
        .iter()
        .flat_map(|(m, e)| {
            e.as_ref().unwrap().iter().filter_map(move |ev| match ev {
                Event::Stored { at_ns, config, .. } => Some((*m, config.clone(), *at_ns)),
                _ => None,
            })
        })
        .collect()
}

fn events_of(r: &LeaseRun, m: u16) -> &[Event] {
    r.reconfig
        .iter()
        .find(|e| e.0 == m)
        .unwrap()
        .1
        .as_ref()
        .unwrap()
}

/// Steps 5–7 ran to the end: the new CM sent NEW-CONFIG, had every
/// machine's acknowledgement and sent NEW-CONFIG-COMMIT; every machine of
/// the configuration installed it and saw the commit; every machine
/// outside it that is alive learnt it was removed; and under the new
/// configuration no lease ran out.
fn installed_everywhere(r: &LeaseRun, c: &Configuration, dead: &[u16], seed: u64) {
    let lead = events_of(r, c.cm);
    let id = c.id;
    assert!(
        lead.iter()
            .any(|e| matches!(e, Event::Committed { id: i, .. } if *i == id)),
        "seed {seed}: the CM did not commit: {lead:?}"
    );
    for &(m, epoch, removed) in &r.configs {
        if dead.contains(&m) {
            continue;
        }
        if c.contains(m) {
            assert_eq!((epoch, removed), (id, false), "seed {seed}: machine {m}");
            if m != c.cm {
                let e = events_of(r, m);
                assert!(
                    e.iter().any(|e| matches!(e, Event::Applied { id: i, from, .. } if *i == id && *from == c.cm))
                        && e.iter().any(|e| matches!(e, Event::CommitSeen { id: i, .. } if *i == id)),
                    "seed {seed}: machine {m}: {e:?}"
                );
            }
        } else {
            assert!(
                removed,
                "seed {seed}: machine {m} outside {c:?} was not removed"
            );
        }
    }
    let late: Vec<_> = r.suspicions.iter().filter(|s| s.config == id).collect();
    assert!(
        late.is_empty(),
        "seed {seed}: suspicions under the new configuration: {late:?}"
    );
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
    L + L / 5 + failed * 1_100_000 + turns * L / 5 + 200_000
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
        installed_everywhere(&r, &c, &[victim], seed);
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
        installed_everywhere(&r, &c, &[0], seed);
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
        installed_everywhere(&r, &c, &[0, 1], seed);
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
        let cm = events_of(&r, 0);
        assert!(
            cm.iter()
                .any(|e| matches!(e, Event::NoMajority { answered: 2, .. })),
            "seed {seed}: {cm:?}"
        );
        // The minority side is still cut off: its machines keep the old
        // configuration (they cannot reach the new CM) but made none.
        for &(m, epoch, _) in &r.configs {
            let want = if m < 2 { 1 } else { 2 };
            assert_eq!(epoch, want, "seed {seed}: machine {m}");
        }
    });
}

fn map_of(g: Geometry) -> txn::regions::RegionMap {
    g.region_map().unwrap()
}

proptest! {
    /// Remapping after any set of failures: a region that lost every
    /// replica is an error; otherwise primaries are old replicas that
    /// survived, every region has f backups on live machines, all
    /// distinct, none on a failed one — or, where the machines left
    /// cannot hold f + 1 replicas (too few, or `full` of them have no free
    /// slot), as many as they can, the surviving replicas kept; a region
    /// that kept its primary keeps it.
    #[test]
    fn remap_keeps_every_region_on_live_machines(
        machines in 3u16..9, failed_bits in any::<u16>(), full_bits in any::<u16>(),
    ) {
        let g = geo(machines);
        let map = map_of(g);
        let failed: Vec<u16> = (0..machines).filter(|m| failed_bits & (1 << m) != 0).collect();
        let full = |m: u16| full_bits & (1 << m) != 0;
        let next = Configuration { id: 2, machines: without(machines, &failed), cm: 0 };
        prop_assume!(!next.machines.is_empty());
        let mut spare = std::collections::BTreeMap::<u16, u64>::new();
        let out = remap(&map, &next, |m, r| {
            if full(m) {
                return None;
            }
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
                    let kept: Vec<u16> = old.iter().copied().filter(|m| !failed.contains(m)).collect();
                    prop_assert!(old.contains(&n.primary.machine));
                    if !failed.contains(&r.primary.machine) {
                        prop_assert_eq!(n.primary, r.primary);
                    }
                    let now: Vec<u16> = std::iter::once(&n.primary).chain(&n.backups).map(|x| x.machine).collect();
                    for m in &kept {
                        prop_assert!(now.contains(m), "replica on {} dropped: {:?}", m, n);
                    }
                    // Every machine that could take a new backup (live,
                    // holding none of the region's, with room) took one,
                    // up to f.
                    let room = next.machines.iter().filter(|x| !kept.contains(&x.0) && !full(x.0)).count();
                    prop_assert_eq!(n.backups.len(), g.f.min(kept.len() - 1 + room));
                    for x in std::iter::once(&n.primary).chain(&n.backups) {
                        prop_assert!(!failed.contains(&x.machine));
                    }
                }
                prop_assert_eq!(
                    m2.short_of_backups().count(),
                    m2.iter().filter(|r| r.backups.len() < g.f).count()
                );
            }
        }
    }
}

/// A machine cut off, removed, and back when the partition heals: it
/// learnt from the store that it is out and holds no more leases, and a
/// lease word in its line — of the new configuration, in sequence —
/// is refused at the CM (precise membership: it is not in the
/// configuration).
#[test]
fn a_machine_that_returns_after_removal_is_refused_and_learns_it_is_out() {
    use txn::harness::RogueWrite;
    use txn::lease::{config_tag, Kind, Msg};
    let g = geo(5);
    let word = Msg {
        kind: Kind::Request,
        config: config_tag(2),
        seq: 1,
    }
    .encode();
    for_each_seed("a_machine_that_returns_after_removal", 200, |seed| {
        let t = 15_000_000 + seed * 7_919 % 3_000_000;
        let side = 1 << 3;
        let store = Arc::new(EmbeddedStore::new());
        let r = run_leases_sim(
            g,
            seed,
            SimModel::default(),
            &LeaseSim {
                faults: vec![
                    at(t, FaultKind::Partition { side }),
                    at(t + 20_000_000, FaultKind::HealPartition { side }),
                ],
                rogue: vec![RogueWrite {
                    at_ns: t + 30_000_000,
                    machine: 0,
                    off: g.lease_word(3),
                    word,
                }],
                store: Some(store.clone()),
                ..LeaseSim::of(L, 60_000_000)
            },
        )
        .unwrap();
        let c = store.read().unwrap().unwrap().config;
        let want = Configuration {
            id: 2,
            machines: without(5, &[3]),
            cm: 0,
        };
        assert_eq!(c, want, "seed {seed}");
        installed_everywhere(&r, &c, &[], seed);
        let back = events_of(&r, 3);
        assert!(
            back.iter()
                .any(|e| matches!(e, Event::Removed { config: 2, .. })),
            "seed {seed}: {back:?}"
        );
        assert!(
            !back.iter().any(|e| matches!(e, Event::Stored { .. })),
            "seed {seed}: {back:?}"
        );
        // Removed, it stopped renewing; the word in its line was refused.
        let held = r
            .leases
            .iter()
            .find(|l| (l.machine, l.peer) == (3, 0))
            .unwrap();
        let at_cm = r
            .leases
            .iter()
            .find(|l| (l.machine, l.peer) == (0, 3))
            .unwrap();
        assert_eq!(
            at_cm.stats.as_ref().unwrap().refused,
            1,
            "seed {seed}: {at_cm:?}"
        );
        assert!(
            held.stats.as_ref().unwrap().requests < 60_000_000 / (L / 5),
            "seed {seed}: {held:?}"
        );
    });
}

/// NEW-CONFIG words that the store does not back — a forged one for a
/// configuration never stored, a replay of the current one from a machine
/// that is not its CM, junk — change nothing and are refused.
#[test]
fn forged_and_replayed_configuration_messages_are_refused() {
    use txn::harness::RogueWrite;
    use txn::lease::{Kind, Msg};
    let g = geo(4);
    let word = |kind, id: u64| {
        Msg {
            kind,
            config: txn::lease::config_tag(id),
            seq: id,
        }
        .encode()
    };
    // Into machine 2's memory, in the lines of machines 1 and 3.
    let rogue = |at_ns, from: u16, w| RogueWrite {
        at_ns,
        machine: 2,
        off: g.lease_word(from) + 8,
        word: w,
    };
    for_each_seed("forged_and_replayed_configuration_messages", 50, |seed| {
        let store = Arc::new(EmbeddedStore::new());
        let r = run_leases_sim(
            g,
            seed,
            SimModel::default(),
            &LeaseSim {
                rogue: vec![
                    rogue(5_000_000, 1, word(Kind::NewConfig, 2)),
                    rogue(6_000_000, 3, word(Kind::NewConfig, 1)),
                    rogue(7_000_000, 3, word(Kind::NewConfigCommit, 1)),
                    rogue(8_000_000, 1, 0xdead_beef_dead_beef),
                ],
                store: Some(store.clone()),
                ..LeaseSim::of(L, 30_000_000)
            },
        )
        .unwrap();
        assert_eq!(store.read().unwrap().unwrap().config.id, 1);
        let refused = events_of(&r, 2)
            .iter()
            .filter(|e| matches!(e, Event::Refused { .. }))
            .count();
        assert_eq!(refused, 4, "seed {seed}: {:?}", events_of(&r, 2));
        for &(m, epoch, removed) in &r.configs {
            assert_eq!((epoch, removed), (1, false), "seed {seed}: machine {m}");
        }
        assert!(r.suspicions.is_empty(), "seed {seed}: {:?}", r.suspicions);
    });
}

/// Reports of an unreachable machine (`Kind::Unreachable`, word 3 of
/// the reporter's lease line at the CM): those that are not well-formed
/// reports of the configuration to its CM — another configuration, no
/// such machine, the reporter itself, another kind, sent to a machine
/// that is not the CM — are refused and change nothing. A well-formed one
/// removes the machine it names (one end of the link must go); the same
/// reporter's next report, within ten leases, removes the reporter
/// instead (a machine that cannot reach one peer after another is more
/// likely the broken one).
#[test]
fn reports_of_unreachable_machines_are_checked_and_remove_one_end() {
    use txn::harness::RogueWrite;
    use txn::lease::{config_tag, Kind, Msg};
    let g = geo(4);
    let word = |kind, config: u64, seq: u64| {
        Msg {
            kind,
            config: config_tag(config),
            seq,
        }
        .encode()
    };
    // From machine 1, into `machine`'s memory.
    let rogue = |at_ns, machine, w| RogueWrite {
        at_ns,
        machine,
        off: g.report_word(1),
        word: w,
    };
    let bad = || {
        vec![
            rogue(5_000_000, 0, word(Kind::Unreachable, 2, 4)),
            rogue(6_000_000, 0, word(Kind::Unreachable, 1, 99)),
            rogue(7_000_000, 0, word(Kind::Unreachable, 1, 2)),
            rogue(8_000_000, 0, word(Kind::Grant, 1, 4)),
            rogue(9_000_000, 2, word(Kind::Unreachable, 1, 4)),
        ]
    };
    for_each_seed("reports_of_unreachable_machines", 20, |seed| {
        let sim = |rogue: Vec<RogueWrite>, until| {
            let store = Arc::new(EmbeddedStore::new());
            let r = run_leases_sim(
                g,
                seed,
                SimModel::default(),
                &LeaseSim {
                    rogue,
                    store: Some(store.clone()),
                    ..LeaseSim::of(L, until)
                },
            )
            .unwrap();
            (r, store)
        };
        let (r, store) = sim(bad(), 30_000_000);
        assert_eq!(store.read().unwrap().unwrap().config.id, 1);
        let refused = |r: &LeaseRun, m| {
            events_of(r, m)
                .iter()
                .filter(|e| matches!(e, Event::Refused { from: 1, .. }))
                .count()
        };
        assert_eq!(refused(&r, 0), 4, "seed {seed}: {:?}", events_of(&r, 0));
        assert_eq!(refused(&r, 2), 1, "seed {seed}: {:?}", events_of(&r, 2));
        assert!(r.suspicions.is_empty(), "seed {seed}: {:?}", r.suspicions);

        // Machine 1 reports machine 2, then, in the next configuration,
        // machine 3 (whose thread writes these words).
        let good = vec![
            rogue(12_000_000, 0, word(Kind::Unreachable, 1, 3)),
            rogue(60_000_000, 0, word(Kind::Unreachable, 2, 4)),
        ];
        let (r, store) = sim(good, 120_000_000);
        let c = store.read().unwrap().unwrap().config;
        let members: Vec<u16> = c.machines.iter().map(|m| m.0).collect();
        assert_eq!((c.id, members), (3, vec![0, 3]), "seed {seed}");
        let taken: Vec<_> = events_of(&r, 0)
            .iter()
            .filter_map(|e| match e {
                Event::Reported {
                    by,
                    machine,
                    suspected,
                    ..
                } => Some((*by, *machine, *suspected)),
                _ => None,
            })
            .collect();
        assert_eq!(taken, vec![(1, 2, Some(2)), (1, 3, Some(1))], "seed {seed}");
    });
}

/// A store that cannot be reached, or that lost the configuration: the
/// reconfiguration says so (an event, not a panic), changes nothing, and
/// tries again a lease later.
#[test]
fn an_unreachable_or_empty_store_is_a_clear_error_and_changes_nothing() {
    use txn::config::{ConfigError, Stored, Swap};
    struct Down(Option<Stored>);
    impl ConfigStore for Down {
        fn read(&self) -> Result<Option<Stored>, ConfigError> {
            match &self.0 {
                // The empty store: it answers, with nothing.
                Some(_) => Ok(None),
                None => Err(ConfigError::Store("connection refused".into())),
            }
        }
        fn cas(&self, _: Option<u64>, _: &Configuration) -> Result<Swap, ConfigError> {
            match &self.0 {
                Some(_) => Ok(Swap::Lost(None)),
                None => Err(ConfigError::Store("connection refused".into())),
            }
        }
    }
    let g = geo(4);
    for empty in [false, true] {
        // The run starts from configuration 1 as if the store had held it.
        let first = txn::harness::first_stored(g);
        let store = Arc::new(Down(empty.then(|| first.clone())));
        let r = txn::harness::run_leases_sim_from(
            g,
            3,
            SimModel::default(),
            &LeaseSim {
                faults: vec![crash(15_000_000, 2)],
                store: Some(store),
                ..LeaseSim::of(L, 60_000_000)
            },
            first,
        )
        .unwrap();
        let cm = events_of(&r, 0);
        let errors = cm
            .iter()
            .filter(|e| matches!(e, Event::StoreError { .. }))
            .count();
        assert!(errors >= 2, "empty {empty}: tried again: {cm:?}");
        assert!(
            !cm.iter().any(|e| matches!(e, Event::Stored { .. })),
            "{cm:?}"
        );
        for &(m, epoch, removed) in &r.configs {
            if m != 2 {
                assert_eq!((epoch, removed), (1, false), "machine {m}");
            }
        }
    }
}

/// The store takes the new CM's swap but the answer is lost (an etcd
/// request that timed out after it committed): the candidate reads the
/// store back, finds its configuration there and leads it to the end.
#[test]
fn a_swap_whose_answer_was_lost_is_read_back_and_led() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use txn::config::{ConfigError, Stored, Swap};
    struct LosesAnswer {
        inner: EmbeddedStore,
        lost: AtomicBool,
    }
    impl ConfigStore for LosesAnswer {
        fn read(&self) -> Result<Option<Stored>, ConfigError> {
            self.inner.read()
        }
        fn cas(&self, e: Option<u64>, c: &Configuration) -> Result<Swap, ConfigError> {
            let r = self.inner.cas(e, c)?;
            // Relaxed: one test thread's flag, no data behind it.
            if matches!(r, Swap::Done(_)) && e.is_some() && !self.lost.swap(true, Ordering::Relaxed)
            {
                return Err(ConfigError::Store("timed out".into()));
            }
            Ok(r)
        }
    }
    for_each_seed("a_swap_whose_answer_was_lost", 50, |seed| {
        let store = Arc::new(LosesAnswer {
            inner: EmbeddedStore::new(),
            lost: AtomicBool::new(false),
        });
        let t = 15_000_000 + seed * 7_919 % 3_000_000;
        let r = run_leases_sim(
            geo(5),
            seed,
            SimModel::default(),
            &LeaseSim {
                faults: vec![crash(t, 0)],
                store: Some(store.clone()),
                ..LeaseSim::of(L, 60_000_000)
            },
        )
        .unwrap();
        let c = store.read().unwrap().unwrap().config;
        assert_eq!((c.id, c.cm), (2, 1), "seed {seed}");
        let lead = events_of(&r, 1);
        assert!(
            lead.iter().any(|e| matches!(e, Event::StoreError { .. })),
            "seed {seed}: {lead:?}"
        );
        installed_everywhere(&r, &c, &[0], seed);
    });
}

/// More machines than a batch holds (16): probes and NEW-CONFIG go a
/// batch at a time.
#[test]
fn clusters_larger_than_a_batch_reconfigure() {
    for_each_seed("clusters_larger_than_a_batch_reconfigure", 20, |seed| {
        let t = 15_000_000 + seed * 7_919 % 3_000_000;
        let (r, c) = run(20, seed, vec![crash(t, 0), crash(t, 7)]);
        assert_eq!(
            c,
            Configuration {
                id: 2,
                machines: without(20, &[0, 7]),
                cm: 1
            },
            "seed {seed}"
        );
        installed_everywhere(&r, &c, &[0, 7], seed);
    });
}
