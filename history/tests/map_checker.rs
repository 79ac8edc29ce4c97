//! Hand-written histories with a known verdict, for `history::map`: each
//! allowed one must pass and each forbidden one must be caught — by the
//! whole checker and, for point operations, by the search alone.

use std::collections::BTreeMap;

use history::map::{check, check_with, CheckOptions, Event, History, Op, Recorder, Ret, Verdict};

fn get(c: u32, k: u64, r: Option<u64>, a: u64, b: u64) -> Event {
    Event::completed(c, Op::Get(k), Ret::Get(r), a, b)
}
fn put(c: u32, k: u64, v: u64, a: u64, b: u64) -> Event {
    Event::completed(c, Op::Put(k, v), Ret::Put, a, b)
}
fn del(c: u32, k: u64, r: Option<bool>, a: u64, b: u64) -> Event {
    Event::completed(c, Op::Delete(k), Ret::Delete(r), a, b)
}
#[allow(clippy::too_many_arguments)]
fn scan(c: u32, low: u64, high: u64, limit: usize, r: &[(u64, u64)], a: u64, b: u64) -> Event {
    Event::completed(
        c,
        Op::Scan { low, high, limit },
        Ret::Scan(r.to_vec()),
        a,
        b,
    )
}

fn empty() -> BTreeMap<u64, u64> {
    BTreeMap::new()
}

fn search_only() -> CheckOptions {
    CheckOptions {
        read_source_test: false,
        ..CheckOptions::default()
    }
}

/// Allowed: passes with and without the source test.
fn assert_ok(events: &[Event], initial: &BTreeMap<u64, u64>) {
    let v = check(events, initial);
    assert_eq!(v, Verdict::Ok, "{v}");
    let v = check_with(events, initial, &search_only());
    assert_eq!(v, Verdict::Ok, "search alone: {v}");
}

/// Forbidden: caught with and without the source test; returns the report.
fn assert_violation(events: &[Event], initial: &BTreeMap<u64, u64>) -> String {
    let v = check_with(events, initial, &search_only());
    assert!(v.is_violation(), "search alone missed it: {v}");
    match check(events, initial) {
        Verdict::Violation(s) => s,
        v => panic!("expected a violation, got {v}"),
    }
}

// ---------------------------------------------------------------- allowed

#[test]
fn overlapping_puts_linearize_in_either_order() {
    let first = vec![
        put(1, 7, 1, 0, 10),
        put(2, 7, 2, 5, 15),
        get(3, 7, Some(1), 20, 30),
    ];
    assert_ok(&first, &empty());
    let second = vec![
        put(1, 7, 1, 0, 10),
        put(2, 7, 2, 5, 15),
        get(3, 7, Some(2), 20, 30),
    ];
    assert_ok(&second, &empty());
}

#[test]
fn get_overlapping_a_put_sees_old_or_new() {
    for seen in [1, 2] {
        let h = vec![
            put(1, 7, 1, 0, 10),
            put(1, 7, 2, 20, 40),
            get(2, 7, Some(seen), 25, 30),
        ];
        assert_ok(&h, &empty());
    }
}

/// Ties: a completion at t comes before an invocation at t; an operation
/// invoked and completed at t sits between the two, concurrent with
/// others like it.
#[test]
fn a_completion_precedes_an_invocation_at_the_same_time() {
    // The simulator stamps a client's completion and its next invocation
    // alike: the get must see the client's own put.
    assert_violation(&[put(1, 7, 1, 0, 10), get(1, 7, None, 10, 20)], &empty());
    assert_violation(&[put(1, 7, 1, 0, 10), get(2, 7, None, 10, 20)], &empty());
    assert_ok(&[put(1, 7, 1, 0, 10), get(2, 7, Some(1), 10, 20)], &empty());
    // An instant get after a completion at its time, before an invocation.
    assert_violation(&[put(1, 7, 1, 0, 10), get(2, 7, None, 10, 10)], &empty());
    assert_violation(&[put(1, 7, 1, 10, 10), get(2, 7, None, 10, 20)], &empty());
    // Two instants at one time: either order.
    assert_ok(&[put(1, 7, 1, 10, 10), get(2, 7, None, 10, 10)], &empty());
    assert_ok(
        &[put(1, 7, 1, 10, 10), get(2, 7, Some(1), 10, 10)],
        &empty(),
    );
    // A scan sees what completed at its invocation's time.
    let h = [put(1, 7, 1, 0, 10), scan(2, 0, 10, 5, &[], 10, 20)];
    assert!(check(&h, &empty()).is_violation());
    assert_ok(
        &[put(1, 7, 1, 0, 10), scan(2, 0, 10, 5, &[(7, 1)], 10, 20)],
        &empty(),
    );
}

#[test]
fn pending_put_may_take_effect_later_or_never() {
    let later = vec![
        Event::pending(1, Op::Put(7, 5), 0),
        get(2, 7, None, 50, 60),
        get(2, 7, Some(5), 100, 110),
        get(3, 7, Some(5), 200, 210),
    ];
    assert_ok(&later, &empty());
    let never = vec![
        Event::completed(1, Op::Put(7, 5), Ret::Unknown, 0, 5),
        get(2, 7, None, 50, 60),
        get(2, 7, None, 100, 110),
    ];
    assert_ok(&never, &empty());
}

#[test]
fn deletes_report_presence() {
    let h = vec![
        del(1, 7, Some(false), 0, 5),
        put(1, 7, 1, 10, 20),
        del(2, 7, Some(true), 30, 40),
        get(1, 7, None, 50, 60),
        del(2, 7, Some(false), 70, 80),
        put(1, 7, 2, 90, 100),
        del(3, 7, None, 95, 120), // result not reported
        get(2, 7, Some(2), 96, 97),
        get(2, 7, None, 130, 140),
    ];
    assert_ok(&h, &empty());
}

#[test]
fn concurrent_delete_and_put_either_order() {
    for (del_ret, after) in [
        (Some(true), Some(2)),
        (Some(true), None),
        (Some(false), Some(2)),
    ] {
        let h = vec![
            put(1, 7, 1, 0, 10),
            Event::pending(9, Op::Delete(7), 1), // crashed client
            del(2, 7, del_ret, 20, 40),
            put(3, 7, 2, 20, 40),
            get(1, 7, after, 50, 60),
        ];
        assert_ok(&h, &empty());
    }
}

#[test]
fn bulk_loaded_initial_values() {
    let initial: BTreeMap<u64, u64> = (0..10).map(|k| (k, k * 10)).collect();
    let h = vec![
        get(1, 3, Some(30), 0, 10),
        put(2, 3, 31, 5, 15),
        get(1, 3, Some(31), 20, 30),
        del(1, 4, Some(true), 0, 10),
        scan(
            2,
            0,
            10,
            100,
            &[
                (0, 0),
                (1, 10),
                (2, 20),
                (3, 31),
                (5, 50),
                (6, 60),
                (7, 70),
                (8, 80),
                (9, 90),
            ],
            40,
            50,
        ),
    ];
    assert_ok(&h, &initial);
}

#[test]
fn scans_are_not_snapshots() {
    // During the scan, key 1 is inserted and key 5 deleted: any of the four
    // combinations is allowed, as is the new or old value of key 3.
    for r in [
        vec![(3, 30), (5, 50)],
        vec![(1, 10), (3, 30), (5, 50)],
        vec![(1, 10), (3, 31)],
        vec![(3, 31)],
    ] {
        let h = vec![
            put(1, 3, 30, 0, 5),
            put(1, 5, 50, 0, 5),
            scan(2, 0, 10, 10, &r, 10, 100),
            put(3, 1, 10, 20, 30),
            put(3, 3, 31, 20, 30),
            del(4, 5, Some(true), 40, 50),
        ];
        assert_ok(&h, &empty());
    }
}

#[test]
fn scan_limit_excuses_keys_after_the_last_returned() {
    let h = vec![
        put(1, 1, 1, 0, 5),
        put(1, 2, 2, 0, 5),
        put(1, 3, 3, 0, 5),
        scan(2, 0, 10, 2, &[(1, 1), (2, 2)], 10, 20),
        scan(2, 0, 10, 0, &[], 10, 20),
        scan(2, 5, 3, 4, &[], 10, 20),
    ];
    assert_ok(&h, &empty());
}

#[test]
fn recorder_across_threads_on_a_locked_map() {
    // Each operation runs under one lock between its two time stamps, so
    // the history is linearizable by construction.
    let rec = Recorder::new();
    let map = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::<u64, u64>::new()));
    let epoch = std::time::Instant::now();
    let now = move || epoch.elapsed().as_nanos() as u64;
    let threads: Vec<_> = (0..4u32)
        .map(|c| {
            let (rec, map) = (rec.clone(), map.clone());
            std::thread::spawn(move || {
                for i in 0..300u64 {
                    let key = i % 5;
                    let op = match (i + u64::from(c)) % 4 {
                        0 => Op::Put(key, u64::from(c) * 1000 + i),
                        1 => Op::Delete(key),
                        2 => Op::Scan {
                            low: 1,
                            high: 4,
                            limit: 2,
                        },
                        _ => Op::Get(key),
                    };
                    let id = rec.invoke(c, op.clone(), now());
                    let ret = {
                        let mut m = map.lock().unwrap();
                        match op {
                            Op::Put(k, v) => {
                                m.insert(k, v);
                                Ret::Put
                            }
                            Op::Delete(k) => Ret::Delete(Some(m.remove(&k).is_some())),
                            Op::Get(k) => Ret::Get(m.get(&k).copied()),
                            Op::Scan { low, high, limit } => Ret::Scan(
                                m.range(low..high)
                                    .take(limit)
                                    .map(|(&k, &v)| (k, v))
                                    .collect(),
                            ),
                        }
                    };
                    rec.complete(id, ret, now());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let h = rec.snapshot();
    assert_eq!(h.len(), 1200);
    assert_eq!(rec.check(&empty()), Verdict::Ok);
}

// ---------------------------------------------------------------- forbidden

#[test]
fn stale_read_after_completed_put() {
    let h = vec![
        put(1, 7, 1, 0, 10),
        put(1, 7, 2, 20, 30),
        get(2, 7, Some(1), 40, 50),
    ];
    let r = assert_violation(&h, &empty());
    assert!(
        r.contains("key 7") && r.contains("#2 c2 get(7) -> 1 [40, 50]"),
        "{r}"
    );
    assert!(
        r.contains("superseded") && r.contains("#1 c1 put(7, 2)"),
        "{r}"
    );
}

#[test]
fn read_of_a_value_never_written() {
    let h = vec![put(1, 7, 1, 0, 10), get(2, 7, Some(99), 5, 15)];
    let r = assert_violation(&h, &empty());
    assert!(r.contains("no put of 99 was invoked"), "{r}");
    // Nor may a get see a put invoked after it completed.
    let early = vec![get(2, 7, Some(1), 0, 10), put(1, 7, 1, 20, 30)];
    assert_violation(&early, &empty());
    // Nor absence after a completed put.
    assert_violation(&[put(1, 7, 1, 0, 10), get(2, 7, None, 20, 30)], &empty());
}

#[test]
fn lost_update_seen_as_newer_then_older() {
    // Both puts overlap, so either may be last, but once a reader saw 2 no
    // later reader may see 1.
    let h = vec![
        put(1, 7, 1, 0, 100),
        put(2, 7, 2, 0, 100),
        get(3, 7, Some(2), 110, 120),
        get(4, 7, Some(1), 130, 140),
    ];
    let r = assert_violation(&h, &empty());
    assert!(r.contains("#3 c4 get(7) -> 1 [130, 140]"), "{r}");
    assert!(
        r.contains("superseded") && r.contains("#2 c3 get(7) -> 2"),
        "{r}"
    );
    match check_with(&h, &empty(), &search_only()) {
        Verdict::Violation(r) => {
            assert!(r.contains("no linearization"), "{r}");
            assert!(r.contains("#3 c4 get(7) -> 1 [130, 140]"), "{r}");
        }
        v => panic!("{v}"),
    }
}

#[test]
fn concurrent_readers_disagree_after_the_writes() {
    // Once both puts are done the value is fixed, so two overlapping reads
    // cannot see different values. Each read alone has a live source; only
    // the search catches it.
    let h = vec![
        put(1, 7, 1, 0, 100),
        put(2, 7, 2, 0, 100),
        get(3, 7, Some(1), 110, 120),
        get(4, 7, Some(2), 110, 120),
    ];
    let r = assert_violation(&h, &empty());
    assert!(r.contains("no linearization"), "{r}");
}

#[test]
fn pending_put_seen_then_unseen() {
    let h = vec![
        Event::pending(1, Op::Put(7, 5), 0),
        get(2, 7, Some(5), 100, 110),
        get(3, 7, None, 200, 210),
    ];
    assert_violation(&h, &empty());
}

#[test]
fn delete_reports_wrong_presence() {
    assert_violation(&[del(1, 7, Some(true), 0, 10)], &empty());
    let twice = vec![
        put(1, 7, 1, 0, 10),
        del(2, 7, Some(true), 20, 30),
        del(3, 7, Some(true), 40, 50),
    ];
    assert_violation(&twice, &empty());
    let initial = BTreeMap::from([(7, 70)]);
    assert_violation(&[del(1, 7, Some(false), 0, 10)], &initial);
}

#[test]
fn violation_on_one_key_among_many_is_named() {
    let mut h: Vec<Event> = (0..50).map(|k| put(1, k, k, k * 10, k * 10 + 5)).collect();
    h.push(get(2, 17, Some(16), 1000, 1010));
    let r = assert_violation(&h, &empty());
    assert!(r.starts_with("key 17:"), "{r}");
}

#[test]
fn scan_missing_a_key_present_throughout() {
    let h = vec![
        put(1, 3, 30, 0, 5),
        put(1, 5, 50, 0, 5),
        scan(2, 0, 10, 10, &[(3, 30)], 10, 20),
    ];
    let r = assert_violation(&h, &empty());
    assert!(r.contains("missed key 5"), "{r}");
    // Untouched initial keys are present throughout.
    let initial = BTreeMap::from([(4, 40)]);
    let r = assert_violation(&[scan(2, 0, 10, 10, &[], 10, 20)], &initial);
    assert!(
        r.contains("missed key 4") && r.contains("initial load"),
        "{r}"
    );
    // With the limit reached, keys below the last returned one still count.
    let h = vec![
        put(1, 1, 1, 0, 5),
        put(1, 2, 2, 0, 5),
        put(1, 3, 3, 0, 5),
        scan(2, 0, 10, 2, &[(1, 1), (3, 3)], 10, 20),
    ];
    assert!(assert_violation(&h, &empty()).contains("missed key 2"));
}

#[test]
fn scan_returning_a_key_deleted_before_it_began() {
    let h = vec![
        put(1, 5, 50, 0, 5),
        del(1, 5, Some(true), 6, 8),
        scan(2, 0, 10, 10, &[(5, 50)], 10, 20),
    ];
    let r = assert_violation(&h, &empty());
    assert!(r.contains("certainly absent"), "{r}");
}

#[test]
fn scan_returning_an_overwritten_value() {
    let h = vec![
        put(1, 5, 50, 0, 5),
        put(1, 5, 51, 6, 8),
        scan(2, 0, 10, 10, &[(5, 50)], 10, 20),
    ];
    let r = assert_violation(&h, &empty());
    assert!(r.contains("could not hold 50"), "{r}");
}

#[test]
fn scan_shape_is_checked() {
    let base = vec![put(1, 3, 30, 0, 5), put(1, 5, 50, 0, 5)];
    let out_of_order = scan(2, 0, 10, 10, &[(5, 50), (3, 30)], 10, 20);
    let duplicate = scan(2, 0, 10, 10, &[(3, 30), (3, 30), (5, 50)], 10, 20);
    let outside = scan(2, 4, 10, 10, &[(3, 30), (5, 50)], 10, 20);
    let over_limit = scan(2, 0, 10, 1, &[(3, 30), (5, 50)], 10, 20);
    for (s, why) in [
        (out_of_order, "out of order"),
        (duplicate, "out of order"),
        (outside, "outside [4, 10)"),
        (over_limit, "over its limit"),
    ] {
        let mut h = base.clone();
        h.push(s);
        let r = assert_violation(&h, &empty());
        assert!(r.contains(why), "{why}: {r}");
    }
}

#[test]
fn more_pending_writes_than_the_memo_tracks() {
    // 100 crashed puts (the memo tracks 64 by bit, the rest exactly), then
    // reads that each need one of them.
    let mut h: Vec<Event> = (0..100)
        .map(|v| Event::pending(1, Op::Put(7, v), v))
        .collect();
    for (j, v) in [7, 3, 99, 64, 80].into_iter().enumerate() {
        let t = 1000 + 10 * j as u64;
        h.push(get(2, 7, Some(v), t, t + 5));
    }
    assert_ok(&h, &empty());
    // Each pending put takes effect at most once: 5, 3, 5 cannot be read.
    for (j, v) in [5, 3, 5].into_iter().enumerate() {
        let t = 2000 + 10 * j as u64;
        h.push(get(2, 7, Some(v), t, t + 5));
    }
    assert_violation(&h, &empty());
}

// ---------------------------------------------------------------- the rest

#[test]
fn malformed_histories_are_violations_not_panics() {
    let wrong_kind = Event::completed(1, Op::Get(1), Ret::Put, 0, 1);
    let backwards = put(1, 1, 1, 10, 5);
    let no_time = Event {
        complete_ns: None,
        ..get(1, 1, None, 0, 1)
    };
    for e in [wrong_kind, backwards, no_time] {
        match check(&[e], &empty()) {
            Verdict::Violation(s) => assert!(s.starts_with("malformed history"), "{s}"),
            v => panic!("{v}"),
        }
    }
    let mut h = History::new();
    let id = h.invoke(1, Op::Get(1), 0);
    h.complete(id, Ret::Get(None), 1);
    h.complete(id, Ret::Get(None), 2);
    assert!(matches!(h.check(&empty()), Verdict::Violation(s) if s.contains("completed twice")));
    // A history appended to another brings its mistakes along.
    let mut merged = History::new();
    let _ = merged.invoke(2, Op::Get(1), 0);
    merged.append(h);
    assert_eq!(merged.len(), 2);
    assert!(
        matches!(merged.check(&empty()), Verdict::Violation(s) if s.contains("completed twice"))
    );
    let mut other = History::new();
    let _ = other.invoke(1, Op::Get(1), 0);
    let far = other.invoke(1, Op::Get(1), 0);
    let mut short = History::new();
    short.complete(far, Ret::Get(None), 1);
    assert!(matches!(short.check(&empty()), Verdict::Violation(s) if s.contains("never invoked")));
}

#[test]
fn budget_exhaustion_is_undecided() {
    let h: Vec<Event> = (0..10).map(|i| put(1, 7, i, i * 10, i * 10 + 5)).collect();
    let options = CheckOptions {
        node_budget_per_key: 3,
        ..CheckOptions::default()
    };
    match check_with(&h, &empty(), &options) {
        Verdict::Undecided(s) => assert!(s.contains("key 7") && s.contains("budget of 3"), "{s}"),
        v => panic!("{v}"),
    }
    assert_eq!(check(&h, &empty()), Verdict::Ok);
}

#[test]
fn json_lines_format() {
    let mut h = History::new();
    let a = h.invoke(1, Op::Put(5, 9), 10);
    let b = h.invoke(2, Op::Get(5), 11);
    let c = h.invoke(
        3,
        Op::Scan {
            low: 0,
            high: 8,
            limit: 2,
        },
        12,
    );
    let d = h.invoke(4, Op::Delete(5), 13);
    let _crashed = h.invoke(5, Op::Delete(6), 14);
    h.complete(a, Ret::Put, 20);
    h.complete(b, Ret::Get(None), 21);
    h.complete(c, Ret::Scan(vec![(1, 2), (5, 9)]), 22);
    h.complete(d, Ret::Delete(Some(true)), 23);
    let want = "\
{\"client\":1,\"op\":\"put\",\"key\":5,\"value\":9,\"ret\":\"ok\",\"invoke_ns\":10,\"complete_ns\":20}
{\"client\":2,\"op\":\"get\",\"key\":5,\"ret\":null,\"invoke_ns\":11,\"complete_ns\":21}
{\"client\":3,\"op\":\"scan\",\"low\":0,\"high\":8,\"limit\":2,\"ret\":[[1,2],[5,9]],\"invoke_ns\":12,\"complete_ns\":22}
{\"client\":4,\"op\":\"delete\",\"key\":5,\"ret\":true,\"invoke_ns\":13,\"complete_ns\":23}
{\"client\":5,\"op\":\"delete\",\"key\":6,\"ret\":\"unknown\",\"invoke_ns\":14,\"complete_ns\":null}
";
    assert_eq!(h.to_json_lines(), want);
}
