//! Failure detection by leases (FaRM §5.1), on the simulator over seeds:
//! a crashed machine, a crashed CM and a partitioned machine are suspected
//! within a lease (plus a renewal and a message's way), nobody else is,
//! and stale or malformed lease words are refused; at full TATP load no
//! lease runs out; on emu threads the handshake runs and ends cleanly.

mod common;

use nicdrv::sim::{for_each_seed, Fault, FaultKind, SimModel};
use txn::harness::{run_leases_sim, run_sim_with, LeaseSim, RogueWrite, RunOptions};
use txn::lease::{Kind, LeaseConfig, Msg};
use txn::workload::{Mix, WorkClient};
use txn::Geometry;

fn geo(machines: u16, threads: u16) -> Geometry {
    Geometry {
        machines,
        threads,
        f: 2,
        regions_per_machine: 1,
        spare_regions_per_machine: 0,
        region_bytes: 1 << 20,
        static_bytes: 1 << 20,
        block_bytes: 1 << 20,
        log_bytes: 64 << 10,
        reply_bytes: 4 << 10,
    }
}

const L: u64 = 10_000_000;

fn work(g: Geometry, mix: Mix, seed: u64, txs: u64, m: u16, t: u16) -> WorkClient {
    WorkClient {
        geo: g,
        mix,
        seed: seed.wrapping_mul(1_000_003) ^ ((m as u64) << 16 | t as u64),
        txs,
        process: m as u64 * g.threads as u64 + t as u64,
        stop: None,
    }
}

fn at(at_ns: u64, kind: FaultKind) -> Fault {
    Fault { at_ns, kind }
}

/// Who suspected whom, and when relative to the crash, is within bounds:
/// no earlier than the lease allows (the last renewal before the crash
/// plus L) and no later than L + a renewal + slack after the crash.
fn suspected_within(run: &txn::harness::LeaseRun, crash_ns: u64, expect: &[(u16, u16)], seed: u64) {
    let timing = LeaseConfig::of(L);
    let mut got: Vec<(u16, u16)> = run.suspicions.iter().map(|s| (s.by, s.machine)).collect();
    got.sort_unstable();
    let mut want = expect.to_vec();
    want.sort_unstable();
    assert_eq!(got, want, "seed {seed}: suspicions {:?}", run.suspicions);
    for s in &run.suspicions {
        assert!(
            s.renewed_ns <= crash_ns + 100_000,
            "seed {seed}: {s:?} was renewed after the crash"
        );
        assert!(
            s.at_ns > s.renewed_ns + L,
            "seed {seed}: {s:?} before expiry"
        );
        assert!(
            s.at_ns <= crash_ns + L + timing.renew_ns + 100_000,
            "seed {seed}: {s:?} suspected late"
        );
    }
}

#[test]
fn a_crashed_machine_is_suspected_by_the_cm_within_a_lease() {
    let g = geo(6, 1);
    for_each_seed("a_crashed_machine_is_suspected", 200, |seed| {
        let crash = 20_000_000 + seed * 37_000 % 2_000_000;
        let victim = 1 + (seed % 5) as u16;
        let run = run_leases_sim(
            g,
            seed,
            SimModel::default(),
            &LeaseSim {
                faults: vec![at(crash, FaultKind::CrashMachine { machine: victim })],
                ..LeaseSim::of(L, 60_000_000)
            },
        )
        .unwrap();
        suspected_within(&run, crash, &[(0, victim)], seed);
        // Every live machine's lease task ended cleanly, and the CM's
        // grants kept the others' leases: about one a renewal period.
        assert_eq!(run.leases.len(), 5 * 5, "seed {seed}: {:?}", run.leases);
        for l in &run.leases {
            let st = l.stats.as_ref().unwrap();
            assert_eq!(st.refused, 0, "seed {seed}: {l:?}");
            if l.machine == 0 && l.peer != victim {
                assert!(st.grants >= 25, "seed {seed}: {l:?}");
                assert!(st.max_renew_gap_ns < L / 2, "seed {seed}: {l:?}");
            }
        }
    });
}

#[test]
fn a_crashed_cm_is_suspected_by_every_machine() {
    let g = geo(5, 1);
    for_each_seed("a_crashed_cm_is_suspected", 200, |seed| {
        let crash = 15_000_000 + seed * 53_000 % 2_000_000;
        let run = run_leases_sim(
            g,
            seed,
            SimModel::default(),
            &LeaseSim {
                faults: vec![at(crash, FaultKind::CrashMachine { machine: 0 })],
                ..LeaseSim::of(L, 50_000_000)
            },
        )
        .unwrap();
        let want: Vec<(u16, u16)> = (1..5).map(|m| (m, 0)).collect();
        suspected_within(&run, crash, &want, seed);
    });
}

#[test]
fn a_partition_is_suspected_on_both_sides() {
    let g = geo(4, 1);
    for_each_seed("a_partition_is_suspected", 200, |seed| {
        let cut = 12_000_000 + seed * 11_000 % 1_000_000;
        let side = 1u64 << 3;
        let run = run_leases_sim(
            g,
            seed,
            SimModel::default(),
            &LeaseSim {
                faults: vec![
                    at(cut, FaultKind::Partition { side }),
                    at(cut + 30_000_000, FaultKind::HealPartition { side }),
                ],
                ..LeaseSim::of(L, 60_000_000)
            },
        )
        .unwrap();
        // The CM suspects machine 3 and machine 3 the CM; after the heal
        // the CM grants a suspected machine nothing (it is out until
        // reconfiguration), so there is no second suspicion either way.
        suspected_within(&run, cut, &[(0, 3), (3, 0)], seed);
    });
}

/// Lease words of another configuration, or no lease word at all, written
/// into the CM's line for a machine, are refused; the machine's lease is
/// unhurt (its next renewal overwrites them).
#[test]
fn stale_and_malformed_lease_words_are_refused() {
    let g = geo(3, 1);
    let line = g.lease_word(2);
    let stale = Msg {
        kind: Kind::Request,
        config: 0,
        seq: 1 << 30,
    }
    .encode();
    let rogue = |at_ns, word| RogueWrite {
        at_ns,
        machine: 0,
        off: line,
        word,
    };
    for_each_seed("stale_and_malformed_lease_words", 20, |seed| {
        let r = run_leases_sim(
            g,
            seed,
            SimModel::default(),
            &LeaseSim {
                rogue: vec![rogue(5_000_000, stale), rogue(9_000_000, u64::MAX)],
                ..LeaseSim::of(L, 30_000_000)
            },
        )
        .unwrap();
        assert!(r.suspicions.is_empty(), "seed {seed}: {:?}", r.suspicions);
        let at_cm = r
            .leases
            .iter()
            .find(|l| l.machine == 0 && l.peer == 2)
            .unwrap();
        assert_eq!(at_cm.stats.as_ref().unwrap().refused, 2, "seed {seed}");
    });
}

/// TATP at full load on every core, with leases on their own cores: no
/// lease runs out, and the longest gap between two renewals the CM saw
/// stays far inside the lease.
#[test]
fn no_lease_runs_out_at_full_tatp_load() {
    let mix = Mix::Tatp { subscribers: 2_000 };
    let g0 = Geometry {
        regions_per_machine: 2,
        ..geo(4, 2)
    };
    let rb = mix.region_bytes(g0.regions());
    let g = Geometry {
        region_bytes: rb,
        static_bytes: rb,
        ..g0
    };
    for_each_seed("no_lease_runs_out_at_full_tatp_load", 2, |seed| {
        let opts = RunOptions {
            leases: Some(LeaseConfig::of(L)),
            ..Default::default()
        };
        let (r, w) = run_sim_with(g, seed, SimModel::default(), &opts, |m, t| {
            work(g, mix, seed, 12_000, m, t)
        })
        .unwrap();
        assert!(r.first_error().is_none(), "{:?}", r.first_error());
        assert!(
            w.now_ns() > 5 * L,
            "seed {seed}: a soak of {} ns is too short",
            w.now_ns()
        );
        assert!(r.suspicions.is_empty(), "seed {seed}: {:?}", r.suspicions);
        let st = r.lease_stats().unwrap();
        assert_eq!(r.leases.len(), 4 * 3);
        assert!(st.grants > 3 * (w.now_ns() / LeaseConfig::of(L).renew_ns) * 9 / 10);
        assert!(st.max_renew_gap_ns < L / 2, "seed {seed}: {st:?}");
        assert_eq!(st.refused, 0);
    });
}

/// On emu threads the same tasks hold their leases over real shared
/// memory and end with the run (a long lease: this is no soak on an
/// oversubscribed machine, which `loch-bench txn --lease-ms` measures).
#[test]
fn leases_hold_on_emu_threads() {
    let mix = Mix::Bank { accounts: 12 };
    let g = geo(3, 1);
    let opts = RunOptions {
        leases: Some(LeaseConfig::of(500_000_000)),
        ..Default::default()
    };
    let r = common::run_emu_with(g, &opts, |m, t| work(g, mix, 1, 300, m, t));
    assert!(r.first_error().is_none(), "{:?}", r.first_error());
    assert!(r.suspicions.is_empty(), "{:?}", r.suspicions);
    assert_eq!(r.leases.len(), 3 * 2);
    let st = r.lease_stats().unwrap();
    assert!(st.grants >= 2 && st.acks >= 2, "{st:?}");
}

/// A machine cut off as the run began: its first request got out, so the
/// CM suspects it a lease later; no grant ever reached it, so it suspects
/// the CM only once the join grace ran out — not a lease after the start.
#[test]
fn a_lease_never_granted_is_suspected_after_the_join_grace() {
    let g = geo(3, 1);
    let run = run_leases_sim(
        g,
        1,
        SimModel::default(),
        &LeaseSim {
            faults: vec![at(0, FaultKind::Partition { side: 1 << 2 })],
            ..LeaseSim::of(L, txn::lease::JOIN_NS + 20_000_000)
        },
    )
    .unwrap();
    let mut s: Vec<_> = run.suspicions.iter().map(|s| (s.by, s.machine)).collect();
    s.sort_unstable();
    assert_eq!(s, vec![(0, 2), (2, 0)], "{:?}", run.suspicions);
    for s in &run.suspicions {
        let bound = if s.by == 2 { txn::lease::JOIN_NS } else { L };
        assert!(
            s.at_ns > bound && s.at_ns <= bound + L / 5 + 100_000,
            "{:?}",
            run.suspicions
        );
    }
}

/// A WRITE to a dead machine takes the transport's retry timeout to fail
/// — on real RC NICs far longer than a lease. With that timeout at five
/// leases, a crashed CM is still suspected within a lease and a renewal:
/// renewals do not wait for their WRITEs.
#[test]
fn a_dead_cm_is_suspected_in_time_when_writes_to_it_hang() {
    let g = geo(4, 1);
    let model = SimModel {
        transport_timeout_ns: 5 * L,
        ..SimModel::default()
    };
    for_each_seed(
        "a_dead_cm_is_suspected_in_time_when_writes_hang",
        50,
        |seed| {
            let crash = 15_000_000 + seed * 53_000 % 2_000_000;
            let run = run_leases_sim(
                g,
                seed,
                model.clone(),
                &LeaseSim {
                    faults: vec![at(crash, FaultKind::CrashMachine { machine: 0 })],
                    ..LeaseSim::of(L, 50_000_000)
                },
            )
            .unwrap();
            let want: Vec<(u16, u16)> = (1..4).map(|m| (m, 0)).collect();
            suspected_within(&run, crash, &want, seed);
        },
    );
}
