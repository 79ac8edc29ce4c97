//! A machine fails and the cluster goes on without it (FaRM §5.2 step 4
//! applied, §5.3–§5.5): the survivors reconfigure, move to the same
//! remapped regions (a backup promoted where the primary was lost, new
//! backups on the survivors' spare slots), recover the transactions the
//! failure cut off, recover the promoted regions' allocators, and copy
//! every region to its new backups while transactions go on.
//!
//! - Between two rounds of bank transfers and audits (no commit spans the
//!   failure): the remap, allocator recovery and re-replication alone.
//! - Under load: commits cut off, and the failed machine's, are decided
//!   by recovery; the bank holds in every audit and at the end, every
//!   region is back to f + 1 replicas equal to their primary, no lock is
//!   left.
//! - List appends across a failure: the history, recorded as it happens
//!   (the failed machine's clients' part too), is strict serializable.

mod common;

use common::appender::{assert_replicas_agree, assert_strict_serializable, Appender, Shared};
use nicdrv::sim::{for_each_seed, Fault, FaultKind, SimModel};
use nicdrv::{Ctx, Nic};
use std::collections::BTreeSet;
use std::sync::Arc;
use txn::config::{ConfigStore, EmbeddedStore};
use txn::harness::{run_sim_with, Client, Report, RunOptions};
use txn::lease::LeaseConfig;
use txn::object::{decode, object_bytes};
use txn::recovery::{CopyPace, Work};
use txn::regions::RegionMap;
use txn::workload::{Mix, WorkClient, WorkOut, BANK_START};
use txn::{Geometry, TxError};

const L: u64 = 10_000_000;
/// When the machine fails: between the rounds, or under load.
const CRASH_NS: u64 = 30_000_000;
const CRASH_UNDER_LOAD_NS: u64 = 8_000_000;
/// Enough accounts that the second round leaves many untouched: their
/// new backups hold them only by the copy.
const ACCOUNTS: u64 = 120;

fn geo() -> Geometry {
    common::appender::five_machines()
}

/// Bank transfers and audits in two rounds: the first ends before the
/// crash, the second runs once this coordinator works in configuration 2.
struct Rounds {
    g: Geometry,
    seed: u64,
    txs: [u64; 2],
}

struct RoundsOut {
    first: WorkOut,
    first_ended_ns: u64,
    second: WorkOut,
    second_began_ns: u64,
}

impl<N: Nic> Client<N> for Rounds {
    type Out = RoundsOut;
    async fn run(self, ctx: &Ctx<N>, c: &mut txn::Coordinator) -> Result<RoundsOut, TxError> {
        let round = |seed, txs| WorkClient {
            geo: self.g,
            mix: Mix::Bank { accounts: ACCOUNTS },
            seed,
            txs,
            process: 0,
            stop: None,
        };
        let first = round(self.seed, self.txs[0]).run(ctx, c).await?;
        // Every truncation out: backups hold every commit of the round.
        c.flush(ctx).await?;
        let first_ended_ns = ctx.now_ns();
        loop {
            // The flush waits, between the new configuration's install
            // and its commit, and then works in it.
            c.flush(ctx).await?;
            if c.configuration() >= Some(2) {
                break;
            }
            if ctx.now_ns() > 1_000_000_000 {
                return Err(TxError::Protocol("no new configuration".into()));
            }
            ctx.sleep(200_000)?.await;
        }
        let second_began_ns = ctx.now_ns();
        let second = round(self.seed ^ 0x5eed, self.txs[1]).run(ctx, c).await?;
        Ok(RoundsOut {
            first,
            first_ended_ns,
            second,
            second_began_ns,
        })
    }
}

/// An object's bytes on machine `m` at the end.
fn bytes_on<O>(r: &Report<O>, m: u16, off: u64, n: usize) -> &[u8] {
    &r.memory[m as usize][off as usize..][..n]
}

fn run(seed: u64, crashed: u16) -> (Report<RoundsOut>, RegionMap) {
    run_rounds(seed, crashed, [40, 10], CRASH_NS)
}

fn run_rounds(
    seed: u64,
    crashed: u16,
    txs: [u64; 2],
    crash_ns: u64,
) -> (Report<RoundsOut>, RegionMap) {
    let g = geo();
    let store: Arc<dyn ConfigStore> = Arc::new(EmbeddedStore::default());
    let opts = RunOptions {
        faults: vec![Fault {
            at_ns: crash_ns,
            kind: FaultKind::CrashMachine { machine: crashed },
        }],
        leases: Some(LeaseConfig::of(L)),
        recovery: Some(store.clone()),
        // Slow enough that the copies overlap the second round's
        // truncations (64 KiB in about 10 ms).
        copy_pace: CopyPace {
            bytes: 256,
            pause_ns: 40_000,
        },
        ..Default::default()
    };
    let (r, _w) = run_sim_with(g, seed, SimModel::default(), &opts, |m, t| Rounds {
        g,
        seed: seed * 131 + (m * g.threads + t) as u64,
        txs,
    })
    .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    let stored = store.read().unwrap().unwrap();
    assert_eq!(stored.config.id, 2, "seed {seed}: {stored:?}");
    assert!(!stored.config.contains(crashed));
    // Every survivor ends in configuration 2 with one and the same map.
    let survivors: Vec<_> = r.machines.iter().filter(|m| m.machine != crashed).collect();
    assert_eq!(survivors.len(), 4);
    let map = survivors[0].map.clone();
    for m in &survivors {
        assert_eq!(m.config, 2, "seed {seed}: machine {}", m.machine);
        assert!(!m.removed);
        let ev = m.events.as_ref().expect("its task ended");
        let ev = ev.as_ref().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert!(
            !ev.iter().any(|e| e.name() == "remap-failed"),
            "seed {seed}: {ev:?}"
        );
        assert_eq!(m.map, map, "seed {seed}: machine {}'s map", m.machine);
        assert_eq!(m.changes.len(), 1, "seed {seed}");
    }
    (r, map)
}

fn check(seed: u64, crashed: u16, r: &Report<RoundsOut>, map: &RegionMap, under_load: bool) {
    let crash_ns = if under_load {
        CRASH_UNDER_LOAD_NS
    } else {
        CRASH_NS
    };
    let g = geo();
    // No replica on the failed machine; f + 1 on distinct machines (the
    // map checks that as regions are added).
    for reg in map.iter() {
        assert!(
            std::iter::once(&reg.primary)
                .chain(&reg.backups)
                .all(|x| x.machine != crashed),
            "seed {seed}: {reg:?}"
        );
        assert_eq!(reg.backups.len(), g.f);
    }
    // Every survivor's clients finished both rounds, the first before the
    // crash and the second in configuration 2.
    let clients: Vec<_> = r.clients.iter().collect();
    assert_eq!(clients.len(), 4 * g.threads as usize, "seed {seed}");
    let mut second = 0;
    for c in &clients {
        assert_ne!(c.machine, crashed);
        let out = c
            .out
            .as_ref()
            .unwrap_or_else(|e| panic!("seed {seed}: machine {} client: {e}", c.machine));
        if under_load {
            assert!(
                out.first_ended_ns > crash_ns,
                "seed {seed}: the first round ended at {} ns, before the crash",
                out.first_ended_ns
            );
        } else {
            assert!(
                out.first_ended_ns + 2_000_000 < crash_ns,
                "seed {seed}: the first round ran until {} ns",
                out.first_ended_ns
            );
        }
        assert!(out.second_began_ns > crash_ns);
        second += out.second.committed;
        for a in out.first.audits.iter().chain(&out.second.audits) {
            assert_eq!(*a, ACCOUNTS as i64 * BANK_START, "seed {seed}: an audit");
        }
    }
    assert!(second > 0, "seed {seed}: nothing committed after the crash");
    // Promoted regions' allocators were recovered; every new backup's copy
    // completed.
    let mut promoted = BTreeSet::new();
    let mut copied = BTreeSet::new();
    for m in r.machines.iter().filter(|m| m.machine != crashed) {
        for c in &m.changes {
            assert_eq!(c.removed, vec![crashed]);
            for &p in &c.promoted {
                promoted.insert(p);
                assert!(
                    m.work.iter().any(
                        |w| matches!(w, Work::AllocatorRecovered { region, .. } if *region == p)
                    ),
                    "seed {seed}: region {p}: {:?}",
                    m.work
                );
            }
            for b in &c.new_backups {
                copied.insert((b.region, m.machine));
                assert!(
                    m.work
                        .iter()
                        .any(|w| matches!(w, Work::Copied { region, .. } if *region == b.region)),
                    "seed {seed}: region {}: {:?}",
                    b.region,
                    m.work
                );
            }
        }
    }
    // The crashed machine was the primary of region `crashed` and a backup
    // of two more: one promotion, and a new backup for each of the three.
    assert_eq!(promoted, BTreeSet::from([crashed as u32]), "seed {seed}");
    assert_eq!(copied.len(), 1 + g.f, "seed {seed}: {copied:?}");
    // The bank holds at the end, on every replica.
    let mix = Mix::Bank { accounts: ACCOUNTS };
    let mut total = 0;
    for (at, len) in mix.objects(&g) {
        let n = object_bytes(len);
        let p = map.on_primary(at, n as u64).unwrap();
        let want = bytes_on(r, p.node(), p.offset(), n);
        let mut v = vec![0u8; len];
        decode(want, &mut v)
            .unwrap()
            .expect("a consistent, unlocked copy");
        total += BANK_START + i64::from_le_bytes(v[..8].try_into().unwrap());
        for b in map.on_backups(at, n as u64).unwrap() {
            assert_eq!(
                bytes_on(r, b.node(), b.offset(), n),
                want,
                "seed {seed}: account {at:?} on backup {}",
                b.node()
            );
        }
    }
    assert_eq!(total, ACCOUNTS as i64 * BANK_START, "seed {seed}");
}

/// Any machine fails (the CM too, when the seed picks machine 0).
#[test]
fn a_machine_fails_between_transactions_and_the_cluster_goes_on() {
    for_each_seed("a_machine_fails_between_transactions", 20, |seed| {
        let crashed = (seed % 5) as u16;
        let (r, map) = run(seed, crashed);
        check(seed, crashed, &r, &map, false);
    });
}

/// Any machine fails while every coordinator commits: the commits it
/// cut off are recovered (decided by their primaries' votes, their locks
/// recovered at promoted primaries), the failed coordinators' too, and
/// the cluster goes on with the bank intact.
#[test]
fn a_machine_fails_under_load_and_its_transactions_are_recovered() {
    let recovered = std::cell::Cell::new(0u64);
    for_each_seed("a_machine_fails_under_load", 20, |seed| {
        let crashed = (seed % 5) as u16;
        let (r, map) = run_rounds(seed, crashed, [300, 10], CRASH_UNDER_LOAD_NS);
        check(seed, crashed, &r, &map, true);
        for s in &r.servers {
            let st = s.stats.as_ref().unwrap();
            assert_eq!(st.stale_records, 0, "seed {seed}: {st:?}");
            assert_eq!(st.recovery_conflicts, 0, "seed {seed}: {st:?}");
            if s.machine != crashed {
                assert_eq!(st.decisions_held, 0, "seed {seed}: {st:?}");
            }
        }
        for m in r.machines.iter().filter(|m| m.machine != crashed) {
            assert_eq!(m.rlocked, 0, "seed {seed}: machine {}", m.machine);
        }
        recovered.set(recovered.get() + r.coord_stats().recovered_commits);
    });
    // Not every failure cuts a commit off, but some do.
    assert!(recovered.get() > 0, "no seed recovered a commit");
}

// ---------------------------------------------------------------------
// Strict serializability across a failure.

/// Any machine fails under list appends: the history, the failed
/// machine's clients' part and the transactions recovery decided
/// included, is strict serializable (adya), and every list's replicas
/// equal its primary's copy at the end.
#[test]
fn list_append_histories_stay_strict_serializable_across_a_failure() {
    let g = geo();
    let recovered = std::cell::Cell::new(0u64);
    for_each_seed("list_appends_across_a_failure", 20, |seed| {
        let crashed = (seed % 5) as u16;
        let store: Arc<dyn ConfigStore> = Arc::new(EmbeddedStore::default());
        let opts = RunOptions {
            faults: vec![Fault {
                at_ns: 6_000_000,
                kind: FaultKind::CrashMachine { machine: crashed },
            }],
            leases: Some(LeaseConfig::of(L)),
            recovery: Some(store),
            ..Default::default()
        };
        let history: Shared = Arc::default();
        let (r, _w) = run_sim_with(g, seed, SimModel::default(), &opts, |m, t| Appender {
            g,
            seed: seed * 977 + (m * g.threads + t) as u64,
            process: (m * g.threads + t) as u64,
            txs: 80,
            history: history.clone(),
            read_all: false,
            flush_every: 0,
            trap: None,
        })
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        for c in &r.clients {
            if let Err(e) = &c.out {
                panic!("seed {seed}: machine {} client: {e}", c.machine);
            }
        }
        assert_eq!(r.clients.len(), 4 * g.threads as usize, "seed {seed}");
        assert_strict_serializable(seed, &history);
        let map = &r
            .machines
            .iter()
            .find(|m| m.machine != crashed)
            .expect("a survivor")
            .map;
        assert_replicas_agree(seed, &g, &r, map);
        recovered.set(recovered.get() + r.coord_stats().recovered_commits);
    });
    assert!(recovered.get() > 0, "no seed recovered a commit");
}
