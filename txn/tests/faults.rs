//! FaRM's failure handling under list-append load, fault by fault (§5):
//! a machine fails at each step of a commit — just after its LOCK,
//! VALIDATE, COMMIT-BACKUP, COMMIT-PRIMARY or TRUNCATE records were
//! acknowledged — in each role (the coordinator's machine, a primary the
//! commit locked, a backup it writes, the configuration manager); two
//! machines fail at once; a partition cuts a minority off; a second
//! machine fails while recovery of the first runs; clusters where no
//! machine is left to take a lost replica's place (three machines, or
//! four losing two) run on with fewer replicas; a region whose replicas
//! all fail before its new backups' copies end is not served from them.
//!
//! Every run records one history shared by every client as it happens
//! (the failed machines' clients' part too, in-doubt transactions as
//! info), ending with a read of every list by each surviving client, and
//! checks: the history is strict serializable (adya), so no acknowledged
//! append is lost; every survivor's client finished; every survivor ends
//! in the same configuration and map, with no replica on a failed
//! machine and f + 1 replicas of every region (as many as the machines
//! left can hold, where fewer), each backup equal to its primary; no
//! recovery lock is left and no record was refused as stale.

mod common;

use common::appender::{
    assert_no_commit_lost, assert_replicas_agree, assert_strict_serializable, Appender, Shared,
};
use nicdrv::sim::{for_each_seed, Fault, FaultKind, SimModel, SimNic};
use nicdrv::NodeId;
use std::sync::{Arc, Mutex};
use txn::config::{ConfigError, ConfigStore, Configuration, EmbeddedStore, Stored, Swap};
use txn::coord::{Step, Trap, TrapPoint};
use txn::harness::{run_sim_with, Report, RunOptions};
use txn::lease::LeaseConfig;
use txn::reconfig::Event;
use txn::recovery::Work;
use txn::Geometry;

const L: u64 = 10_000_000;
const TXS: u64 = 60;

fn geo() -> Geometry {
    common::appender::five_machines()
}

/// The machine a trap fails, by its part in the commit it strikes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Role {
    Coordinator,
    Primary,
    Backup,
    Cm,
}

/// The trapping coordinator's machine (not the CM's, so that each role
/// names a machine of its own where the commit allows).
const TRAPPER: NodeId = 1;

/// A trap that, at the `nth` time (from 1) its coordinator reaches
/// `step` with a machine in `role` to fail, crashes that machine and
/// says which in `fired`.
fn trap(step: Step, role: Role, nth: u32, fired: Arc<Mutex<Option<NodeId>>>) -> Trap {
    let mut seen = 0;
    Box::new(move |p: &TrapPoint<'_>| {
        if p.step != step || fired.lock().unwrap().is_some() {
            return;
        }
        let others = |d: &&NodeId| **d != TRAPPER && **d != 0;
        let victim = match role {
            Role::Coordinator => Some(TRAPPER),
            Role::Cm => Some(0),
            Role::Primary => p.primaries.iter().find(others).copied(),
            Role::Backup => p
                .backups
                .iter()
                .filter(others)
                .find(|d| !p.primaries.contains(d))
                .or_else(|| p.backups.iter().find(others))
                .copied(),
        };
        let Some(victim) = victim else { return };
        seen += 1;
        if seen < nth {
            return;
        }
        let nic = p.nic.downcast_ref::<SimNic>().expect("a simulated machine");
        nic.inject(FaultKind::CrashMachine { machine: victim })
            .expect("a machine of the cluster");
        *fired.lock().unwrap() = Some(victim);
    })
}

struct Run {
    r: Report<()>,
    history: Shared,
    store: Arc<dyn ConfigStore>,
}

/// List appends on 5 machines × 2 threads, 3-way, 10 ms leases, with
/// `faults` and the traps `traps(machine, thread)` gives; coordinators
/// flush their truncations every `flush_every` transactions (0: never).
fn run(
    seed: u64,
    faults: Vec<Fault>,
    mut traps: impl FnMut(u16, u16) -> Option<Trap>,
    flush_every: u64,
) -> Run {
    run_with(seed, faults, &mut traps, flush_every, &[])
}

/// [`run`], the machines `unreachable` unable to reach the store.
fn run_with(
    seed: u64,
    faults: Vec<Fault>,
    traps: &mut dyn FnMut(u16, u16) -> Option<Trap>,
    flush_every: u64,
    unreachable: &[NodeId],
) -> Run {
    let opts = RunOptions {
        faults,
        store_of: unreachable
            .iter()
            .map(|&m| (m, Arc::new(Unreachable) as Arc<dyn ConfigStore>))
            .collect(),
        ..Default::default()
    };
    run_on(geo(), TXS, seed, opts, traps, flush_every)
}

/// [`run`] on the cluster `g`, `txs` transactions a client, with `opts`
/// (its leases and store are the run's own).
fn run_on(
    g: Geometry,
    txs: u64,
    seed: u64,
    mut opts: RunOptions,
    traps: &mut dyn FnMut(u16, u16) -> Option<Trap>,
    flush_every: u64,
) -> Run {
    let store: Arc<dyn ConfigStore> = Arc::new(EmbeddedStore::default());
    opts.leases = Some(LeaseConfig::of(L));
    opts.recovery = Some(store.clone());
    let history: Shared = Arc::default();
    let (r, _w) = run_sim_with(g, seed, SimModel::default(), &opts, |m, t| Appender {
        g,
        seed: seed * 977 + (m * g.threads + t) as u64,
        process: (m * g.threads + t) as u64,
        txs,
        history: history.clone(),
        read_all: true,
        flush_every,
        trap: traps(m, t),
    })
    .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    Run { r, history, store }
}

/// The checks every fault run passes; `out` are the machines that failed
/// or were cut off (removed by the configuration the run ends in).
fn check(seed: u64, run: &Run, out: &[NodeId]) {
    check_on(geo(), seed, run, out)
}

/// [`check`] of a run on the cluster `g`: every region has f backups, or
/// as many as the machines left can hold (one replica a machine).
fn check_on(g: Geometry, seed: u64, run: &Run, out: &[NodeId]) {
    let r = &run.r;
    let stored = run.store.read().unwrap().expect("a configuration");
    let want: Vec<NodeId> = (0..g.machines).filter(|m| !out.contains(m)).collect();
    let members: Vec<NodeId> = stored.config.machines.iter().map(|m| m.0).collect();
    assert_eq!(members, want, "seed {seed}: {stored:?}");
    for c in &r.clients {
        if out.contains(&c.machine) {
            continue;
        }
        if let Err(e) = &c.out {
            panic!(
                "seed {seed}: machine {} client {}: {e}",
                c.machine, c.thread
            );
        }
    }
    let finished = r.clients.iter().filter(|c| !out.contains(&c.machine));
    assert_eq!(
        finished.count(),
        want.len() * g.threads as usize,
        "seed {seed}: every survivor's clients report"
    );
    let survivors: Vec<_> = r
        .machines
        .iter()
        .filter(|m| !out.contains(&m.machine))
        .collect();
    let map = survivors[0].map.clone();
    assert_no_commit_lost(seed, &g, r, &map, &run.history);
    assert_strict_serializable(seed, &run.history);
    for m in &survivors {
        assert_eq!(
            m.config, stored.config.id,
            "seed {seed}: machine {}",
            m.machine
        );
        assert!(!m.removed, "seed {seed}: machine {}", m.machine);
        assert_eq!(m.map, map, "seed {seed}: machine {}'s map", m.machine);
        assert_eq!(m.rlocked, 0, "seed {seed}: machine {}", m.machine);
        // Every region it was promoted to lead had its free lists
        // recovered, after its transactions settled.
        for c in &m.changes {
            for p in c
                .promoted
                .iter()
                .filter(|&&p| map.get(p).is_ok_and(|x| x.primary.machine == m.machine))
            {
                assert!(
                    m.work.iter().any(
                        |w| matches!(w, Work::AllocatorRecovered { region, .. } if region == p)
                    ),
                    "seed {seed}: machine {}: region {p}'s allocator: {:?}",
                    m.machine,
                    m.work
                );
            }
        }
    }
    for reg in map.iter() {
        assert!(
            std::iter::once(&reg.primary)
                .chain(&reg.backups)
                .all(|x| !out.contains(&x.machine)),
            "seed {seed}: {reg:?}"
        );
        assert_eq!(
            reg.backups.len(),
            g.f.min(want.len() - 1),
            "seed {seed}: {reg:?}"
        );
    }
    assert_replicas_agree(seed, &g, r, &map);
    for s in r.servers.iter().filter(|s| !out.contains(&s.machine)) {
        let st = s.stats.as_ref().unwrap();
        assert_eq!(st.stale_records, 0, "seed {seed}: {st:?}");
        assert_eq!(st.recovery_conflicts, 0, "seed {seed}: {st:?}");
        // Every recovery round ended, so each forgot what it decided.
        assert_eq!(st.decisions_held, 0, "seed {seed}: {st:?}");
        assert_eq!(st.bad_records, 0, "seed {seed}: {st:?}");
    }
}

/// Runs a trap at `step` in `role`, on the coordinator thread 0 of
/// machine [`TRAPPER`], at a seed-chosen occurrence.
fn at_step(step: Step, role: Role, seed: u64, flush_every: u64) {
    at_step_on(geo(), step, role, seed, flush_every, 1 + (seed % 8) as u32)
}

/// [`at_step`] on the cluster `g`, at the `nth` occurrence.
fn at_step_on(g: Geometry, step: Step, role: Role, seed: u64, flush_every: u64, nth: u32) {
    let fired = Arc::new(Mutex::new(None));
    let run = run_on(
        g,
        TXS,
        seed,
        RunOptions::default(),
        &mut |m, t| (m == TRAPPER && t == 0).then(|| trap(step, role, nth, fired.clone())),
        flush_every,
    );
    let victim = fired
        .lock()
        .unwrap()
        .unwrap_or_else(|| panic!("seed {seed}: {step:?} as {role:?} never struck"));
    check_on(g, seed, &run, &[victim]);
}

/// Three machines, 3-way replicated: every machine holds a replica of
/// every region, so when one fails no machine is left to take its
/// replicas' place. The two left run on with two replicas of each region
/// (FaRM stays available while a majority of the machines and a replica
/// of each region survive, §5.3): a machine fails just after each step
/// of a commit, in each role, and every check holds with one backup a
/// region, the history strict serializable.
#[test]
fn three_machines_run_on_with_two_replicas_after_a_failure() {
    let g = Geometry {
        machines: 3,
        ..geo()
    };
    for step in [
        Step::Lock,
        Step::Validate,
        Step::CommitBackup,
        Step::CommitPrimary,
    ] {
        for role in ROLES {
            // Early occurrences: with one machine in each role, a step
            // whose role is a primary of its own (a VALIDATE of machine
            // 2's object) may come only a few times in a run.
            for_each_seed(&format!("three_machines_{step:?}_{role:?}"), 2, |seed| {
                at_step_on(g, step, role, seed, 0, 1 + (seed % 3) as u32)
            });
        }
    }
}

/// Four machines, 3-way replicated, lose two in turn: the first failure
/// gives every region that lost a replica a new backup on the machine
/// that held none of it; the second, after the copies or while they
/// run, leaves two machines (a majority of three), and every region
/// runs on with the two replicas left, one of them perhaps a copy the
/// second failure cut short (its new primary finishes it).
#[test]
fn four_machines_lose_two_in_turn_and_run_on() {
    let g = Geometry {
        machines: 4,
        ..geo()
    };
    for_each_seed("four_machines_two_in_turn", 12, |seed| {
        let a = (seed % 4) as NodeId;
        let b = ((u64::from(a) + 1 + (seed / 4) % 3) % 4) as NodeId;
        let first = 4_000_000 + (seed * 137_000) % 3_000_000;
        // Past the first failure's configuration change (a lease to
        // suspect it, a few ms to change): two failures within it leave
        // two of four machines, no majority.
        let second = first + 2 * L + (seed * 1_731_000) % 15_000_000;
        let faults = [(a, first), (b, second)]
            .map(|(machine, at_ns)| Fault {
                at_ns,
                kind: FaultKind::CrashMachine { machine },
            })
            .to_vec();
        // Clients run on past the second failure.
        let opts = RunOptions {
            faults,
            ..Default::default()
        };
        let run = run_on(g, 3 * TXS, seed, opts, &mut |_, _| None, 0);
        let mut out = vec![a, b];
        out.sort();
        check_on(g, seed, &run, &out);
    });
}

/// Five machines, 3-way replicated, copies slowed down: the three
/// replicas of region 0 fail one after another (0, then 1, then 2), each
/// before the copies to its new backups ended. No replica known whole is
/// left, so the machine the remap makes the primary (3, whose copy is
/// unfinished) must not serve the region: it stops rather than apply the
/// configuration, which so never commits. Before, it was promoted and
/// served the part of the region copied so far.
#[test]
fn a_region_whose_whole_replicas_all_failed_is_never_served_from_an_unfinished_copy() {
    for_each_seed("unfinished_copy", 3, |seed| {
        let t0 = 4_000_000 + (seed * 137_000) % 3_000_000;
        let faults = (0..3)
            .map(|k| Fault {
                at_ns: t0 + k * 3 * L,
                kind: FaultKind::CrashMachine {
                    machine: k as NodeId,
                },
            })
            .collect();
        let opts = RunOptions {
            faults,
            // A 64 KiB region copied 8 KiB a second: no copy ends.
            copy_pace: txn::recovery::CopyPace {
                bytes: 8 << 10,
                pause_ns: 1_000_000_000,
            },
            serve_until_ns: Some(t0 + 200_000_000),
            ..Default::default()
        };
        let Run { r, history, .. } = run_on(geo(), 10 * TXS, seed, opts, &mut |_, _| None, 0);
        assert_strict_serializable(seed, &history);
        let events = |m: &txn::harness::MachineReport| match &m.events {
            Some(Ok(ev)) => ev.clone(),
            other => panic!("seed {seed}: machine {}: {other:?}", m.machine),
        };
        // Configuration 4 (without 0, 1 and 2) makes 3 region 0's
        // primary: 3 stops, and it never commits anywhere.
        let m3 = &r.machines[3];
        assert!(m3.removed, "seed {seed}");
        assert!(
            events(m3).iter().any(|e| matches!(e,
                Event::RemapFailed { id: 4, error, .. } if error.contains("unfinished"))),
            "seed {seed}: {:?}",
            events(m3)
        );
        for m in r.machines.iter().skip(3) {
            for e in events(m) {
                if let Event::Committed { id, .. } | Event::CommitSeen { id, .. } = e {
                    assert!(id < 4, "seed {seed}: machine {}: {e:?}", m.machine);
                }
            }
        }
    });
}

const ROLES: [Role; 4] = [Role::Coordinator, Role::Primary, Role::Backup, Role::Cm];

#[test]
fn a_machine_fails_just_after_lock() {
    for role in ROLES {
        for_each_seed(&format!("after_lock_{role:?}"), 6, |seed| {
            at_step(Step::Lock, role, seed, 0)
        });
    }
}

#[test]
fn a_machine_fails_just_after_validate() {
    for role in ROLES {
        for_each_seed(&format!("after_validate_{role:?}"), 6, |seed| {
            at_step(Step::Validate, role, seed, 0)
        });
    }
}

#[test]
fn a_machine_fails_just_after_commit_backup() {
    for role in ROLES {
        for_each_seed(&format!("after_commit_backup_{role:?}"), 6, |seed| {
            at_step(Step::CommitBackup, role, seed, 0)
        });
    }
}

#[test]
fn a_machine_fails_just_after_commit_primary() {
    for role in ROLES {
        for_each_seed(&format!("after_commit_primary_{role:?}"), 6, |seed| {
            at_step(Step::CommitPrimary, role, seed, 0)
        });
    }
}

/// Coordinators send TRUNCATE records of their own every few
/// transactions; the machine truncated fails (or the coordinator's).
#[test]
fn a_machine_fails_just_after_truncate() {
    for role in [Role::Coordinator, Role::Primary, Role::Cm] {
        for_each_seed(&format!("after_truncate_{role:?}"), 6, |seed| {
            at_step(Step::Truncate, role, seed, 5)
        });
    }
}

/// Two machines crash at the same instant under load, the CM among them
/// on some seeds: one region in five loses two of its three replicas.
#[test]
fn two_machines_fail_at_once_under_load() {
    for_each_seed("two_machines_at_once", 20, |seed| {
        let a = (seed % 5) as NodeId;
        let b = ((seed / 5 + 1 + seed) % 5) as NodeId;
        let b = if b == a { (a + 1) % 5 } else { b };
        let at = 4_000_000 + (seed * 137_000) % 4_000_000;
        let faults = [a, b]
            .map(|machine| Fault {
                at_ns: at,
                kind: FaultKind::CrashMachine { machine },
            })
            .to_vec();
        let run = run(seed, faults, |_, _| None, 0);
        let mut out = vec![a, b];
        out.sort();
        check(seed, &run, &out);
    });
}

/// A partition cuts one machine (the CM on some seeds) off from the
/// other four under load, for good: the majority removes it and goes
/// on; what the minority did meanwhile, its clients' reads included,
/// stays strict serializable with the majority's.
#[test]
fn a_partition_cuts_a_machine_off_under_load() {
    for_each_seed("partition_under_load", 15, |seed| {
        let cut = (seed % 5) as NodeId;
        let at = 4_000_000 + (seed * 137_000) % 4_000_000;
        let faults = vec![Fault {
            at_ns: at,
            kind: FaultKind::Partition { side: 1 << cut },
        }];
        let run = run(seed, faults, |_, _| None, 0);
        check(seed, &run, &[cut]);
        let m = run.r.machines.iter().find(|m| m.machine == cut).unwrap();
        assert!(
            m.removed || m.config < 2,
            "seed {seed}: the cut machine took a configuration without itself: {}",
            m.config
        );
    });
}

/// A store this machine cannot reach (the far side of a partition).
struct Unreachable;

impl ConfigStore for Unreachable {
    fn read(&self) -> Result<Option<Stored>, ConfigError> {
        Err(ConfigError::Store("unreachable".into()))
    }
    fn cas(&self, _: Option<u64>, _: &Configuration) -> Result<Swap, ConfigError> {
        Err(ConfigError::Store("unreachable".into()))
    }
}

/// A partition cuts a minority off from the others and from the
/// configuration store, for good: one machine (the CM on some seeds), or
/// the CM with a machine that holds its lease from it. The minority
/// never learns it was removed, and still holds copies of the regions it
/// was primary of, which the majority promotes elsewhere and goes on
/// writing. Its leases run out, and with them its right to serve: a read
/// there after the majority moved on would be stale. (The old CM, having
/// lost its leases at the majority, grants its companion no more.)
#[test]
fn a_minority_cut_off_from_the_cluster_and_the_store_serves_no_stale_read() {
    for_each_seed("partition_from_the_store", 15, |seed| {
        minority_cut_off(seed);
    });
}

/// One seed of the test above, checked.
fn minority_cut_off(seed: u64) -> Run {
    let cut: Vec<NodeId> = match seed % 3 {
        2 => vec![0, 1 + (seed / 3 % 4) as NodeId],
        _ => vec![(seed % 5) as NodeId],
    };
    let side = cut.iter().fold(0u64, |s, &m| s | 1 << m);
    let at = 4_000_000 + (seed * 137_000) % 4_000_000;
    let faults = vec![Fault {
        at_ns: at,
        kind: FaultKind::Partition { side },
    }];
    let run = run_with(seed, faults, &mut |_, _| None, 0, &cut);
    check(seed, &run, &cut);
    run
}

/// Seeds of the test above that strike this, in turn until one does
/// (a few in a thousand strike it; the timing moves with the protocol's
/// records, and `find_pinned_seeds` finds new ones when a change moves
/// them all): a backup's copy of a region, new after the partition, takes
/// an object's first line at the version its primary is installing and a
/// later line from before it. The install's COMMIT-BACKUP, applied at
/// truncation, finds the version current and must write the object whole
/// again (`ServerStats::mended`), or the backup keeps a torn list for
/// good. Every seed tried passes every check.
#[test]
fn a_torn_copy_is_mended_by_the_record_of_its_version() {
    let struck = [290, 521, 677, 724]
        .into_iter()
        .any(|seed| minority_cut_off(seed).r.live_server_stats().mended > 0);
    assert!(struck, "no torn copy was mended");
}

/// Machine `first` (seed-chosen among 2, 3, 4) crashes under load; the
/// trapping coordinator, recovering from it, crashes machine
/// `second(seed, first)` when it reaches `step`. Every seed's checks hold,
/// the trap struck on every seed, and some recovery round started over.
fn second_failure(name: &str, step: Step, second: impl Fn(u64, NodeId) -> NodeId) {
    let restarts = std::cell::Cell::new(0);
    for_each_seed(name, 20, |seed| {
        let run = second_failure_at(seed, step, |first| second(seed, first));
        restarts.set(restarts.get() + run.r.coord_stats().recovery_restarts);
    });
    // Some round met the second failure and started over.
    assert!(restarts.get() > 0, "no recovery round started over");
}

/// The first failing machine of seed `seed`.
fn first_of(seed: u64) -> NodeId {
    2 + (seed % 3) as NodeId
}

/// One seed of [`second_failure`], checked.
fn second_failure_at(seed: u64, step: Step, second: impl Fn(NodeId) -> NodeId) -> Run {
    let first = first_of(seed);
    let second = second(first);
    let fired = Arc::new(Mutex::new(None));
    let trap_fired = fired.clone();
    let faults = vec![Fault {
        at_ns: 5_000_000 + (seed * 137_000) % 3_000_000,
        kind: FaultKind::CrashMachine { machine: first },
    }];
    let run = run(
        seed,
        faults,
        |m, t| {
            (m == TRAPPER && t == 0).then(|| {
                let f = trap_fired.clone();
                Box::new(move |p: &TrapPoint<'_>| {
                    if p.step == step && f.lock().unwrap().is_none() {
                        let nic = p.nic.downcast_ref::<SimNic>().unwrap();
                        nic.inject(FaultKind::CrashMachine { machine: second })
                            .unwrap();
                        *f.lock().unwrap() = Some(second);
                    }
                }) as Trap
            })
        },
        0,
    );
    assert_eq!(*fired.lock().unwrap(), Some(second), "seed {seed}");
    let mut out = vec![first, second];
    out.sort();
    check(seed, &run, &out);
    run
}

/// The other of machines 3 and 4 than `first`.
fn other_than(first: NodeId) -> NodeId {
    if first == 4 {
        3
    } else {
        4
    }
}

/// Seeds of [`a_machine_fails_between_keeping_and_acting_on_decisions`]
/// (the second failure another machine than the recovering
/// coordinator's) that strike this, in turn until one does (most do;
/// `find_pinned_seeds` finds others): a machine acts on a recovery
/// decision for a commit without backing up the regions it writes, and a
/// second failure cuts the round short. The next configuration makes the
/// machine a backup, its copy taken from a primary that still held the
/// commit's lock. The next round's REPLICATE must apply the commit there
/// (the APPLY that follows finds the decision acted on), or the backup
/// keeps the older version: `replicated_late` counts such REPLICATEs that
/// wrote a copy. Every seed tried passes every check.
#[test]
fn a_new_backup_that_acted_on_a_decision_takes_its_writes() {
    let late = [0, 1, 3]
        .into_iter()
        .map(|seed| {
            second_failure_at(seed, Step::Decide, other_than)
                .r
                .live_server_stats()
                .replicated_late
        })
        .find(|&n| n > 0)
        .unwrap_or(0);
    assert!(
        late > 0,
        "no acted-on decision was replicated to a new backup"
    );
}

/// NEED-RECOVERY (FaRM §5.3 step 3): a commit's COMMIT-BACKUP reaches
/// one backup of its region and not the other (the coordinator's link to
/// it is cut), the region's primary fails, and so does the coordinator
/// just after. The backup promoted is the one without the record: the
/// other's NEED-RECOVERY message brings it, the new primary locks the
/// objects before the region is active, and recovery commits the
/// transaction (without the message it could only abort it, unheld).
/// Every check of the fault tests holds.
#[test]
fn a_promoted_primary_takes_the_records_its_backups_hold() {
    let name = "a_promoted_primary_takes_the_records_its_backups_hold";
    let (struck, seeds) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    let taken = std::cell::Cell::new(0);
    for_each_seed(name, 4, |seed| {
        seeds.set(seeds.get() + 1);
        let fired = Arc::new(Mutex::new(None));
        let nth = 1 + (seed % 2) as u32;
        let run = run(
            seed,
            Vec::new(),
            |m, t| (m == TRAPPER && t == 0).then(|| need_trap(nth, fired.clone())),
            0,
        );
        // A seed whose chosen commit did not validate may run out of
        // commits that qualify (the trap heals the link and waits).
        let Some(primary) = *fired.lock().unwrap() else {
            return;
        };
        struck.set(struck.get() + 1);
        let mut out = vec![TRAPPER, primary];
        out.sort();
        check(seed, &run, &out);
        // Where the cut came in time (the first backup's record was
        // lost), the promoted primary took it from the other backup.
        if run.r.live_server_stats().needs_taken > 0 {
            taken.set(taken.get() + 1);
        }
        let c = run.r.coord_stats();
        assert_eq!(c.recovery_unheld, 0, "seed {seed}: {c:?}");
        assert!(c.recovered_commits > 0, "seed {seed}: {c:?}");
    });
    println!(
        "the trap struck on {} of {} seeds; NEED-RECOVERY brought a record on {}",
        struck.get(),
        seeds.get(),
        taken.get()
    );
    assert!(
        2 * struck.get() >= seeds.get(),
        "the trap struck on {} of {} seeds",
        struck.get(),
        seeds.get()
    );
    assert!(
        2 * taken.get() >= struck.get() && taken.get() > 0,
        "NEED-RECOVERY brought a record on {} of {} seeds struck",
        taken.get(),
        struck.get()
    );
}

/// The trap of the test above, on the coordinator: at the `nth` commit
/// that writes one region led by machine 2 or 3 (its backups the next
/// two machines, the first of them, neither the coordinator nor the CM,
/// promoted when the primary fails), the link to the first backup is cut
/// once the LOCKs landed; once the commit validated, the primary fails,
/// and the coordinator 100 µs later (the other backup's COMMIT-BACKUP has
/// landed, the first's WRITE has not timed out). A commit that does not
/// validate heals the link and the trap waits for the next.
fn need_trap(nth: u32, fired: Arc<Mutex<Option<NodeId>>>) -> Trap {
    let mut seen = 0;
    let mut chosen: Option<(txn::records::TxId, NodeId, NodeId)> = None;
    Box::new(move |p: &TrapPoint<'_>| {
        if fired.lock().unwrap().is_some() {
            return;
        }
        let nic = p.nic.downcast_ref::<SimNic>().unwrap();
        if let Some((tx, primary, first)) = chosen {
            if p.step == Step::Validate && p.tx == tx {
                nic.inject(FaultKind::CrashMachine { machine: primary })
                    .unwrap();
                nic.inject_after(FaultKind::CrashMachine { machine: TRAPPER }, 100_000)
                    .unwrap();
                *fired.lock().unwrap() = Some(primary);
            } else if p.step == Step::Lock {
                let link = FaultKind::HealLink {
                    compute: TRAPPER,
                    memory: first,
                };
                nic.inject(link).unwrap();
                chosen = None;
            }
            return;
        }
        if p.step != Step::Lock {
            return;
        }
        let &[primary] = p.primaries else { return };
        let first = (primary + 1) % 5;
        if !(2..=3).contains(&primary) || !p.backups.contains(&first) {
            return;
        }
        seen += 1;
        if seen < nth {
            return;
        }
        let cut = FaultKind::CutLink {
            compute: TRAPPER,
            memory: first,
        };
        nic.inject(cut).unwrap();
        // Healed within a few leases' worth regardless: a link down longer
        // is reported, and one end of it removed (a third machine lost,
        // with the two this test crashes, leaves no majority).
        let heal = FaultKind::HealLink {
            compute: TRAPPER,
            memory: first,
        };
        nic.inject_after(heal, 5_000_000).unwrap();
        chosen = Some((p.tx, primary, first));
    })
}

/// A link between two live machines cut for longer than the transport
/// timeout (3 ms, from the coordinator to a backup of a commit's region
/// other than the CM, once the commit's LOCKs landed). A WRITE that
/// fails poisons its ring (which of its WRITEs landed is unknown); before
/// this was handled the commit was cut off and waited for a
/// configuration change that never came, as nobody failed, and gave up
/// with its locks held, so that every later commit of those objects
/// aborted and the run never ended. Now the records in flight go again,
/// the same bytes at the same positions, while the machine stays in the
/// configuration (coordinators' log rings: `Coordinator::heal`; servers'
/// reply rings: `Server::resend`, replies held meanwhile), and a
/// VALIDATE read that fails aborts the commit. Nobody is removed, every
/// check holds, and some records went again.
#[test]
fn a_link_cut_between_live_machines_heals() {
    for_each_seed("a_link_cut_between_live_machines_heals", 4, |seed| {
        let cut = Arc::new(Mutex::new(None));
        let c = cut.clone();
        let run = run(
            seed,
            Vec::new(),
            |m, t| {
                (m == TRAPPER && t == 0).then(|| {
                    let c = c.clone();
                    Box::new(move |p: &TrapPoint<'_>| {
                        if p.step != Step::Lock || c.lock().unwrap().is_some() {
                            return;
                        }
                        // Not the CM: a cut to it stops this machine's
                        // lease renewals, and the machine is rightly
                        // removed.
                        let Some(&to) = p.backups.iter().find(|&&b| b != TRAPPER && b != 0) else {
                            return;
                        };
                        let nic = p.nic.downcast_ref::<SimNic>().unwrap();
                        let (cut, heal) = (
                            FaultKind::CutLink {
                                compute: TRAPPER,
                                memory: to,
                            },
                            FaultKind::HealLink {
                                compute: TRAPPER,
                                memory: to,
                            },
                        );
                        nic.inject(cut).unwrap();
                        nic.inject_after(heal, 3_000_000).unwrap();
                        *c.lock().unwrap() = Some(to);
                    }) as Trap
                })
            },
            0,
        );
        assert!(cut.lock().unwrap().is_some(), "seed {seed}: never cut");
        check(seed, &run, &[]);
        let resends = run.r.coord_stats().resends + run.r.live_server_stats().resends;
        assert!(resends > 0, "seed {seed}: nothing went again");
    });
}

/// A run whose coordinator thread 0 of machine [`TRAPPER`] strikes once:
/// at the `nth` trap point for which `pick` names faults (each with its
/// delay), it injects them. Checked to have struck.
fn strike_once(
    seed: u64,
    nth: u32,
    mut pick: impl FnMut(&TrapPoint<'_>) -> Vec<(FaultKind, u64)> + Send + 'static,
) -> Run {
    let fired = Arc::new(Mutex::new(false));
    let f = fired.clone();
    let mut seen = 0;
    let mut trap = Some(Box::new(move |p: &TrapPoint<'_>| {
        if *f.lock().unwrap() {
            return;
        }
        let faults = pick(p);
        if faults.is_empty() {
            return;
        }
        seen += 1;
        if seen < nth {
            return;
        }
        let nic = p.nic.downcast_ref::<SimNic>().unwrap();
        for (kind, delay) in faults {
            nic.inject_after(kind, delay).unwrap();
        }
        *f.lock().unwrap() = true;
    }) as Trap);
    let run = run(
        seed,
        Vec::new(),
        |m, t| {
            if m == TRAPPER && t == 0 {
                trap.take()
            } else {
                None
            }
        },
        0,
    );
    assert!(*fired.lock().unwrap(), "seed {seed}: the trap never struck");
    run
}

/// A send queue refuses a commit's COMMIT-BACKUP post to one backup for
/// 200 µs (`FaultKind::QueueFull`: the post sends nothing), and on odd
/// seeds the link to a backup posted before it in the same batch is cut
/// for 5 ms as well (its WRITE fails). Before, a record refused at
/// posting was forgotten and the rings its batch left poisoned were given
/// up: the commit was cut off with its LOCKs held, and waited for a
/// configuration change that nobody asked for, as both machines hold
/// their leases. Now a refused record stays in flight like one whose
/// WRITE failed, and goes again while its machine stays in the
/// configuration. Nobody is removed, every check holds, and records went
/// again (on even seeds, the refused one alone).
#[test]
fn a_commit_record_refused_at_posting_goes_again() {
    for_each_seed("a_commit_record_refused_at_posting_goes_again", 6, |seed| {
        let cut = seed % 2 == 1;
        let run = strike_once(seed, 1 + (seed % 5) as u32, move |p| {
            // Neither the CM (a full queue to it holds up lease renewals
            // of the machine's other threads) nor the coordinator's own.
            let far: Vec<NodeId> = p
                .backups
                .iter()
                .copied()
                .filter(|&b| b != TRAPPER && b != 0)
                .collect();
            if p.step != Step::Validate || far.len() < 1 + usize::from(cut) {
                return Vec::new();
            }
            // Batches post in machine order: the cut one goes first.
            let full = FaultKind::QueueFull {
                compute: TRAPPER,
                memory: *far.last().unwrap(),
                duration_ns: 200_000,
            };
            let (compute, memory) = (TRAPPER, far[0]);
            let mut v = vec![(full, 0)];
            if cut {
                v.push((FaultKind::CutLink { compute, memory }, 0));
                v.push((FaultKind::HealLink { compute, memory }, 5_000_000));
            }
            v
        });
        check(seed, &run, &[]);
        assert!(
            run.r.coord_stats().resends > 0,
            "seed {seed}: nothing went again"
        );
    });
}

/// Replies of a primary's servers to the coordinator's machine are
/// refused at posting for 2 ms (`FaultKind::QueueFull` on the link from
/// the primary's machine to the coordinator's memory, where the reply
/// rings lie), from a commit's LOCK on: the replies are held and go
/// again (`Server::resend`), and the commits waiting for them end.
/// Nobody is removed and every check holds; replies went again on most
/// seeds (on some, none was due in the window: 1 seed in 1000 in a
/// sweep).
#[test]
fn a_reply_refused_at_posting_goes_again() {
    let (seeds, resent) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    for_each_seed("a_reply_refused_at_posting_goes_again", 6, |seed| {
        let run = strike_once(seed, 1 + (seed % 5) as u32, |p| {
            let primary = p.primaries.iter().find(|&&d| d != TRAPPER && d != 0);
            match primary {
                Some(&compute) if p.step == Step::Lock => {
                    let memory = TRAPPER;
                    let duration_ns = 2_000_000;
                    vec![(
                        FaultKind::QueueFull {
                            compute,
                            memory,
                            duration_ns,
                        },
                        0,
                    )]
                }
                _ => Vec::new(),
            }
        });
        check(seed, &run, &[]);
        seeds.set(seeds.get() + 1);
        resent.set(resent.get() + u32::from(run.r.live_server_stats().resends > 0));
    });
    assert!(
        4 * resent.get() >= 3 * seeds.get(),
        "replies went again on {} of {} seeds",
        resent.get(),
        seeds.get()
    );
}

/// A coordinator's core stalls for three leases (a preemption, a page
/// fault) just after its LOCK records went out, as its machine is cut
/// off from the CM and the store. Meanwhile its lease runs out, the CM
/// removes it, and the others drain their logs and decide its commit by
/// the records they hold: its locks, no COMMIT-BACKUP — abort. The
/// machine never learns it was removed. When its core runs again, its
/// COMMIT-BACKUP and COMMIT-PRIMARY records still land (its links to the
/// other machines are up) and their WRITEs are acknowledged, though no
/// server takes them. Before read-write commits were reported only under
/// the lease, it reported this one committed, and the append was lost
/// (no read saw it, so only `assert_no_commit_lost`, in `check`, told).
/// Now the commit stays in doubt.
#[test]
fn a_machine_removed_while_its_commit_stalled_reports_no_commit() {
    for_each_seed("removed_while_stalled", 6, |seed| {
        let x = 1 + (seed % 4) as NodeId;
        let nth = 1 + seed % 4;
        let threads = geo().threads as u32;
        let mut seen = 0;
        let fired = Arc::new(Mutex::new(false));
        let f = fired.clone();
        let mut trap = Some(Box::new(move |p: &TrapPoint<'_>| {
            // A commit that writes the CM's machine would meet the cut.
            let cm = p.primaries.contains(&0) || p.backups.contains(&0);
            if p.step != Step::Lock || p.backups.is_empty() || cm {
                return;
            }
            seen += 1;
            if seen != nth {
                return;
            }
            let nic = p.nic.downcast_ref::<SimNic>().unwrap();
            for (compute, memory) in [(x, 0), (0, x)] {
                nic.inject(FaultKind::CutLink { compute, memory }).unwrap();
            }
            let stall = FaultKind::StallThread {
                thread: x as u32 * threads,
                duration_ns: 3 * L,
            };
            nic.inject(stall).unwrap();
            *f.lock().unwrap() = true;
        }) as Trap);
        let run = run_with(
            seed,
            Vec::new(),
            &mut |m, t| if m == x && t == 0 { trap.take() } else { None },
            0,
            &[x],
        );
        assert!(*fired.lock().unwrap(), "seed {seed}: never stalled");
        check(seed, &run, &[x]);
    });
}

/// The machines the configuration the run ended in left out, checked to
/// be exactly one of `ends`.
fn one_end_removed(seed: u64, run: &Run, ends: &[NodeId]) -> Vec<NodeId> {
    let stored = run.store.read().unwrap().expect("a configuration");
    let out: Vec<NodeId> = (0..geo().machines)
        .filter(|&m| !stored.config.contains(m))
        .collect();
    assert!(
        out.len() == 1 && ends.contains(&out[0]),
        "seed {seed}: removed {out:?}, not one of {ends:?}"
    );
    out
}

/// A commit's records to one machine are cut off by a link down from its
/// coordinator's machine (just after VALIDATE), and before the link
/// comes back a crash of a third machine changes the configuration. The
/// records in flight, of the configuration before, must never land now:
/// the machine they were for drained its logs without them. Once it says
/// it recovered, the coordinator makes them void and the ring serves
/// again (`CoordStats::rings_voided`); before, the ring was lost to that
/// coordinator for good, and its recovery round with it. Every check
/// holds, and the ring was made void on most seeds.
#[test]
fn a_ring_cut_off_by_a_configuration_change_serves_again() {
    let name = "a_ring_cut_off_by_a_configuration_change_serves_again";
    let (seeds, voided) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    let stuck = std::cell::Cell::new(0);
    for_each_seed(name, 10, |seed| {
        seeds.set(seeds.get() + 1);
        let c = ring_cut_off(seed).r.coord_stats();
        if c.rings_voided > 0 {
            voided.set(voided.get() + 1);
        }
        stuck.set(stuck.get() + c.stuck_commits);
    });
    println!(
        "rings made void on {} of {} seeds; {} commits stuck",
        voided.get(),
        seeds.get(),
        stuck.get()
    );
    assert!(
        2 * voided.get() >= seeds.get(),
        "rings made void on {} of {} seeds",
        voided.get(),
        seeds.get()
    );
}

/// One seed of the test above, checked.
fn ring_cut_off(seed: u64) -> Run {
    let fired = Arc::new(Mutex::new(None));
    let nth = 1 + (seed % 4) as u32;
    let run = run(
        seed,
        Vec::new(),
        |m, t| (m == TRAPPER && t == 0).then(|| cut_then_crash(nth, fired.clone())),
        0,
    );
    let victim = fired
        .lock()
        .unwrap()
        .unwrap_or_else(|| panic!("seed {seed}: the trap never struck"));
    check(seed, &run, &[victim]);
    run
}

/// Seeds of the test above that strike this, in turn until one does
/// (about one in twenty; `find_pinned_seeds` finds others; seed 264 was
/// the first, found by a sweep): a commit reported at its first
/// COMMIT-PRIMARY's acknowledgement, another of which did not land at a
/// machine that stays (the cut link), so that machine's copy stays
/// locked and without the write. The commit is truncated nowhere until
/// that record lands, and once it is made void the next recovery round
/// takes the commit as touched and installs it there
/// (`CoordStats::stuck_commits`); before, the object stayed locked for
/// good. Every seed tried passes every check.
#[test]
fn a_commit_whose_commit_primary_was_made_void_is_installed_by_recovery() {
    let stuck = [264, 5, 7, 34]
        .into_iter()
        .any(|seed| ring_cut_off(seed).r.coord_stats().stuck_commits > 0);
    assert!(stuck, "no commit was stuck");
}

/// The trap of [`ring_cut_off`], on the coordinator: at the `nth` commit
/// that writes a backup on a machine `d` other than the CM's, once it
/// validated, the link from the coordinator's machine to `d` is cut and
/// a third machine crashes (one outside the commit where there is one);
/// the link comes back 15 ms later, after the configuration without the
/// crashed machine is taken and before the coordinator's tries to reach
/// `d` have failed for the two leases that would report it.
fn cut_then_crash(nth: u32, fired: Arc<Mutex<Option<NodeId>>>) -> Trap {
    let mut seen = 0;
    Box::new(move |p: &TrapPoint<'_>| {
        if p.step != Step::Validate || fired.lock().unwrap().is_some() {
            return;
        }
        let Some(&d) = p.backups.iter().find(|&&d| d >= 2) else {
            return;
        };
        seen += 1;
        if seen < nth {
            return;
        }
        let outside = |v: &NodeId| !p.primaries.contains(v) && !p.backups.contains(v);
        let victim = (2..5)
            .filter(|&v| v != d)
            .find(outside)
            .unwrap_or(if d == 2 { 3 } else { 2 });
        let nic = p.nic.downcast_ref::<SimNic>().unwrap();
        let (compute, memory) = (TRAPPER, d);
        nic.inject(FaultKind::CutLink { compute, memory }).unwrap();
        nic.inject(FaultKind::CrashMachine { machine: victim })
            .unwrap();
        nic.inject_after(FaultKind::HealLink { compute, memory }, 15_000_000)
            .unwrap();
        *fired.lock().unwrap() = Some(victim);
    })
}

/// A link between two live machines cut for good, under load (both ways
/// on even seeds; on odd ones only the first's verbs to the second). Both
/// still hold their leases, so no lease suspects either; a commit whose
/// records to the far end cannot land cannot end either (its locks
/// would be held for good). The coordinator reports the machine its
/// rings cannot reach to the CM, which removes it (one end of the link;
/// when both ends report, the first report stands): recovery decides the
/// cut-off commits, and the rest go on.
#[test]
fn a_link_cut_for_good_between_live_machines_removes_one_end() {
    for_each_seed("link_cut_for_good", 6, |seed| {
        let a = 1 + (seed % 4) as NodeId;
        let b = 1 + ((a as u64 + seed / 4 % 3) % 4) as NodeId;
        let at = 4_000_000 + (seed * 137_000) % 4_000_000;
        let cut = |compute, memory| Fault {
            at_ns: at,
            kind: FaultKind::CutLink { compute, memory },
        };
        let mut faults = vec![cut(a, b)];
        if seed.is_multiple_of(2) {
            faults.push(cut(b, a));
        }
        let run = run(seed, faults, |_, _| None, 0);
        let out = one_end_removed(seed, &run, &[a, b]);
        check(seed, &run, &out);
        let reports = run.r.coord_stats().reports + run.r.live_server_stats().reports;
        assert!(reports > 0, "seed {seed}: nobody reported the link");
    });
}

/// A machine cut off from the CM alone, both ways, under load: it still
/// reaches every other machine. Either the CM removes it when its lease
/// runs out, or it removes the CM, having lost the CM's lease; the
/// removed one may still write records into the others' rings after
/// they moved on, and a commit it reported then would be lost: it
/// reports a read-write commit only while it holds its lease, as a
/// read-only one.
#[test]
fn a_machine_cut_off_from_the_cm_alone_loses_no_commit() {
    for_each_seed("cut_off_from_the_cm", 6, |seed| {
        let x = 1 + (seed % 4) as NodeId;
        let at = 4_000_000 + (seed * 137_000) % 4_000_000;
        let cut = |compute, memory| Fault {
            at_ns: at,
            kind: FaultKind::CutLink { compute, memory },
        };
        let run = run(seed, vec![cut(x, 0), cut(0, x)], |_, _| None, 0);
        let out = one_end_removed(seed, &run, &[0, x]);
        check(seed, &run, &out);
    });
}

/// Not a check: finds the seeds the two pinned tests above need when a
/// change to the protocol's timing moves them. Run with
/// `LOCH_SIM_SEEDS=N cargo test --release -p txn --test faults
/// find_pinned_seeds -- --ignored --nocapture`; it prints every seed of
/// `0..N` that tears a copy, that leaves a reported commit's
/// COMMIT-PRIMARY stuck across a change, or that replicates an acted-on
/// decision late with the second failure at recovery's query, keeping or
/// acting round, and what NEED-RECOVERY brought over all of them.
#[test]
#[ignore]
fn find_pinned_seeds() {
    let (mut unheld, mut taken) = (0, 0);
    for seed in nicdrv::sim::seeds(2000) {
        let a = minority_cut_off(seed).r;
        let torn = a.live_server_stats().mended;
        if torn > 0 {
            println!("seed {seed}: mended {torn}");
        }
        let stuck = ring_cut_off(seed).r.coord_stats().stuck_commits;
        if stuck > 0 {
            println!("seed {seed}: stuck_commits {stuck}");
        }
        let mut runs = vec![a];
        for step in [Step::Recover, Step::Decide, Step::TruncateRecovery] {
            let b = second_failure_at(seed, step, other_than).r;
            let late = b.live_server_stats().replicated_late;
            if late > 0 {
                println!("seed {seed}: {step:?}: replicated_late {late}");
            }
            runs.push(b);
        }
        for r in &runs {
            unheld += r.coord_stats().recovery_unheld;
            taken += r.live_server_stats().needs_taken;
        }
    }
    // How often a promoted primary lacked a record a backup had.
    println!("NEED-RECOVERY: {taken} transactions taken from backups; {unheld} aborted unheld");
}

/// A machine fails while the survivors recover from another's failure
/// (just after a recovering coordinator's RECOVER-QUERY landed).
#[test]
fn a_second_machine_fails_during_recovery() {
    second_failure(
        "second_failure_during_recovery",
        Step::Recover,
        |_, first| other_than(first),
    );
}

/// On even seeds the recovering coordinator's own machine, on odd seeds
/// the other of machines 3 and 4 than `first`.
fn trapper_or_other(seed: u64, first: NodeId) -> NodeId {
    if seed.is_multiple_of(2) {
        TRAPPER
    } else {
        other_than(first)
    }
}

/// A machine fails between recovery's keeping and acting DECIDE rounds: every machine
/// holds the decisions, none acted on them. On even seeds the recovering
/// coordinator's own machine fails (its heirs act on what the machines
/// kept), on odd seeds another.
#[test]
fn a_machine_fails_between_keeping_and_acting_on_decisions() {
    second_failure(
        "failure_between_decide_rounds",
        Step::Decide,
        trapper_or_other,
    );
}

/// One seed of the test above, always: machine 2 fails; machine 0's
/// coordinator decides to commit a transaction of its own that wrote
/// region 1, whose primary (machine 1) alone held it locked, and its
/// keeping round reaches machine 0 only before machine 1 fails too. The
/// next round finds the decision standing; machine 3, promoted to
/// region 1's primary, must hold the transaction's object locked from
/// its lock recovery until the decision is installed (the replicate
/// round put its writes on region 1's backups), or a read there misses
/// the commit and a later one overwrites it.
#[test]
fn a_kept_commit_is_locked_where_its_region_is_promoted_next() {
    let run = second_failure_at(402, Step::Decide, |_| TRAPPER);
    let replicated = run.r.live_server_stats().replicated;
    assert!(replicated > 0, "no commit's writes were replicated");
}

/// A machine fails once recovery's decisions were acted on everywhere,
/// before they are forgotten (TRUNCATE-RECOVERY): some machines may hold
/// a decision whose records are gone everywhere. The next round finds it
/// by the decision, decides it the same way again, and forgets it.
#[test]
fn a_machine_fails_between_acting_on_and_forgetting_decisions() {
    second_failure(
        "failure_before_truncate_recovery",
        Step::TruncateRecovery,
        trapper_or_other,
    );
}

/// The promoted primary's lock recovery is slow on one of its cores (a
/// stall from just before it learns the change is committed): the
/// other coordinators' recovery rounds finish meanwhile, and a read of a
/// promoted region waits until its primary recovered every lock, or it
/// would miss a commit that only a COMMIT-BACKUP record there still
/// holds. The run is made twice: once to find when machine 0 sees the
/// change committed, once with machine 0's second core stalled from then.
#[test]
fn a_promoted_region_is_read_only_once_its_locks_are_recovered() {
    for_each_seed("slow_lock_recovery", 10, |seed| {
        let crashed = 4;
        let crash = vec![Fault {
            at_ns: 5_000_000 + (seed * 137_000) % 3_000_000,
            kind: FaultKind::CrashMachine { machine: crashed },
        }];
        let first = run(seed, crash.clone(), |_, _| None, 0);
        let seen = first
            .r
            .machines
            .iter()
            .find(|m| m.machine == 0)
            .and_then(|m| m.events.as_ref())
            .and_then(|e| e.as_ref().ok())
            .and_then(|e| {
                e.iter().find_map(|e| match e {
                    txn::reconfig::Event::CommitSeen { at_ns, id: 2 }
                    | txn::reconfig::Event::Committed { at_ns, id: 2 } => Some(*at_ns),
                    _ => None,
                })
            })
            .expect("machine 0 saw configuration 2 committed");
        let mut faults = crash;
        faults.push(Fault {
            at_ns: seen - 1_000,
            kind: FaultKind::StallThread {
                thread: 1,
                duration_ns: 3_000_000,
            },
        });
        let run = run(seed, faults, |_, _| None, 0);
        check(seed, &run, &[crashed]);
    });
}
