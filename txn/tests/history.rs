//! The histories transactions will be checked with: written in Elle's
//! list-append format by `txn::history` and checked for strict
//! serializability by the `adya` crate. Hand-built histories with known
//! anomalies must be rejected, each for its anomaly, and a correct one
//! accepted — so the checker the transaction tests rely on can fail.

use adya::{check, History as AdyaHistory, Opts, Valid, Workload};
use txn::history::{History, Kind, Mop};

fn r(key: u64, seen: Option<&[u64]>) -> Mop {
    Mop::Read {
        key,
        seen: seen.map(<[u64]>::to_vec),
    }
}

fn a(key: u64, value: u64) -> Mop {
    Mop::Append { key, value }
}

/// A transaction of `process` run alone from `t` to `t + 1`: its invoke
/// (reads null) and its completion as given.
fn txn(h: &mut History, process: u64, t: u64, done: Kind, mops: Vec<Mop>) {
    let invoke = mops
        .iter()
        .map(|m| match m {
            Mop::Read { key, .. } => r(*key, None),
            m => m.clone(),
        })
        .collect();
    h.push(Kind::Invoke, process, t, invoke);
    h.push(done, process, t + 1, mops);
}

/// Asserts that `h` is not strict serializable, for an anomaly `is` names.
fn rejected_for(h: &History, is: impl Fn(&str) -> bool) {
    let (v, types) = strict(h);
    assert_eq!(v, Valid::False);
    assert!(types.iter().any(|t| is(t)), "{types:?}");
}

/// Checks `h` for strict serializability: (valid, anomaly types).
fn strict(h: &History) -> (Valid, Vec<String>) {
    let parsed = AdyaHistory::from_json(&h.to_json_lines()).expect("our lines parse");
    let r = check(&parsed, Workload::ListAppend, &Opts::default());
    (r.valid, r.anomaly_types)
}

#[test]
fn a_serial_history_is_strict_serializable() {
    let mut h = History::default();
    txn(&mut h, 0, 0, Kind::Ok, vec![a(1, 1), a(2, 1)]);
    txn(&mut h, 1, 10, Kind::Ok, vec![r(1, Some(&[1])), a(1, 2)]);
    txn(
        &mut h,
        0,
        20,
        Kind::Ok,
        vec![r(1, Some(&[1, 2])), r(2, Some(&[1]))],
    );
    // A transaction that may have committed: either way is fine.
    txn(&mut h, 2, 30, Kind::Info, vec![a(2, 2)]);
    txn(&mut h, 1, 40, Kind::Fail, vec![a(2, 3)]);
    assert_eq!(strict(&h), (Valid::True, vec![]));
}

#[test]
fn g0_write_cycle_is_rejected() {
    let mut h = History::default();
    txn(&mut h, 0, 0, Kind::Ok, vec![a(1, 1), a(2, 1)]);
    txn(&mut h, 1, 0, Kind::Ok, vec![a(1, 2), a(2, 2)]);
    // x saw T0 then T1; y saw T1 then T0.
    txn(
        &mut h,
        2,
        10,
        Kind::Ok,
        vec![r(1, Some(&[1, 2])), r(2, Some(&[2, 1]))],
    );
    rejected_for(&h, |t| t == "G0");
}

#[test]
fn g1a_aborted_read_is_rejected() {
    let mut h = History::default();
    txn(&mut h, 0, 0, Kind::Fail, vec![a(1, 1)]);
    txn(&mut h, 1, 10, Kind::Ok, vec![r(1, Some(&[1]))]);
    rejected_for(&h, |t| t == "G1a");
}

#[test]
fn g1c_circular_information_flow_is_rejected() {
    let mut h = History::default();
    // Each reads what the other appended: write-read both ways.
    txn(&mut h, 0, 0, Kind::Ok, vec![a(1, 1), r(2, Some(&[1]))]);
    txn(&mut h, 1, 0, Kind::Ok, vec![a(2, 1), r(1, Some(&[1]))]);
    rejected_for(&h, |t| t == "G1c");
}

#[test]
fn g2_item_write_skew_is_rejected() {
    let mut h = History::default();
    txn(
        &mut h,
        0,
        0,
        Kind::Ok,
        vec![r(1, Some(&[])), r(2, Some(&[])), a(1, 1)],
    );
    txn(
        &mut h,
        1,
        0,
        Kind::Ok,
        vec![r(1, Some(&[])), r(2, Some(&[])), a(2, 1)],
    );
    // A later reader pins both appends down.
    txn(
        &mut h,
        2,
        10,
        Kind::Ok,
        vec![r(1, Some(&[1])), r(2, Some(&[1]))],
    );
    rejected_for(&h, |t| t == "G2-item");
}

#[test]
fn a_stale_read_after_a_completed_commit_is_rejected() {
    let mut h = History::default();
    txn(&mut h, 0, 0, Kind::Ok, vec![a(1, 1)]);
    // Begins after the append completed, yet does not see it: serializable
    // (it could be ordered first), not strict serializable.
    txn(&mut h, 1, 10, Kind::Ok, vec![r(1, Some(&[]))]);
    rejected_for(&h, |t| t.ends_with("-realtime"));
    let parsed = AdyaHistory::from_json(&h.to_json_lines()).unwrap();
    let serializable = Opts {
        models: vec!["serializable".into()],
        ..Opts::default()
    };
    assert_eq!(
        check(&parsed, Workload::ListAppend, &serializable).valid,
        Valid::True,
        "only real time rules it out"
    );
}
