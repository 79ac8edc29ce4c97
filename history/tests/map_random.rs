//! Randomized tests of `history::map`: histories of a sequential map that
//! are allowed by construction must pass; mutations that are forbidden by
//! construction must be caught; on small histories the checker must agree
//! with a brute-force search; and a large, highly concurrent key is checked
//! quickly. Every failure names its seed; `LOCH_HISTORY_SEEDS=N` sweeps N
//! seeds per test.

use std::collections::BTreeMap;
use std::time::Instant;

use history::map::{check, check_with, CheckOptions, Event, Op, Ret, Verdict};
use nicdrv::rng::Domain;

/// The project's generator (`nicdrv::rng`), plus the draws these tests use.
struct Rng(nicdrv::rng::Rng);

impl Rng {
    /// The stream of `seed`; `which` tells a test's streams apart.
    fn of(seed: u64, which: u64) -> Rng {
        Rng(nicdrv::rng::Rng::stream(seed, Domain::Test, which))
    }
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n.max(1))) >> 64) as u64
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn seeds(default: u64) -> u64 {
    std::env::var("LOCH_HISTORY_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[derive(Clone, Copy)]
struct Shape {
    clients: u32,
    ops_per_client: u32,
    keys: u64,
    /// Values are drawn from `1..=values`; few values make ambiguous reads.
    values: u64,
    max_duration_ns: u64,
    max_gap_ns: u64,
    scans: bool,
    /// Percent of operations that crash their client (which then stops),
    /// and that fail with an unknown effect.
    crash_percent: u64,
    fail_percent: u64,
    preload: bool,
}

const NEVER_WRITTEN: u64 = 1 << 40;

/// A history of a sequential map whose operations each take effect at a
/// random moment inside their interval (pending ones: later, or never), so
/// it is linearizable by construction. Scans read each key at its own
/// moment, in key order, as Sherman's range query does.
fn generate(seed: u64, s: Shape) -> (Vec<Event>, BTreeMap<u64, u64>) {
    let mut rng = Rng::of(seed, 0);
    let mut initial = BTreeMap::new();
    if s.preload {
        for k in 0..s.keys {
            if rng.chance(50) {
                initial.insert(k, 1 + rng.below(s.values));
            }
        }
    }
    // (event, linearization time on the checker's tie-ordered scale or None
    // for "never", result unknown).
    let mut planned: Vec<(Event, Option<u64>, bool)> = Vec::new();
    for c in 0..s.clients {
        let mut t = rng.below(50);
        for _ in 0..s.ops_per_client {
            let key = rng.below(s.keys);
            let op = match rng.below(if s.scans { 100 } else { 85 }) {
                0..=34 => Op::Get(key),
                35..=69 => Op::Put(key, 1 + rng.below(s.values)),
                70..=84 => Op::Delete(key),
                _ => {
                    let low = rng.below(s.keys);
                    Op::Scan {
                        low,
                        high: low + rng.below(s.keys + 1),
                        limit: rng.below(s.keys / 2 + 2) as usize,
                    }
                }
            };
            let dur = 1 + rng.below(s.max_duration_ns);
            let (inv, cmp) = (t, t + dur);
            // Linearization times on the checker's tie-ordered scale: an
            // invocation at t is 3t + 2, a completion 3t, so the effect
            // lands after every completion at `inv` and before every
            // invocation at `cmp` (the next operation of this client may
            // be invoked at `cmp`, and must see it).
            let lin = 3 * inv + 2 + rng.below(3 * dur - 1);
            let event = Event::completed(c, op, Ret::Unknown, inv, cmp);
            if rng.chance(s.crash_percent) {
                // The client dies mid-operation; the effect may land late.
                let late = 3 * inv + 2 + rng.below(12 * dur);
                let at = rng.chance(50).then_some(late);
                planned.push((
                    Event {
                        complete_ns: None,
                        ..event
                    },
                    at,
                    true,
                ));
                break;
            }
            if rng.chance(s.fail_percent) {
                // An error with an unknown effect.
                planned.push((event, rng.chance(50).then_some(lin), true));
            } else {
                planned.push((event, Some(lin), false));
            }
            t = cmp + rng.below(s.max_gap_ns + 1);
        }
    }

    // The sequential map, in linearization order (ties broken at random:
    // operations at one instant may go in any order).
    let mut order: Vec<(u64, u64, usize)> = planned
        .iter()
        .enumerate()
        .filter_map(|(i, (_, at, _))| at.map(|t| (t, rng.next(), i)))
        .collect();
    order.sort();
    let mut map = initial.clone();
    // Per key, the values it took and from when: (time, tiebreak, value).
    let mut timeline: BTreeMap<u64, Vec<(u64, u64, Option<u64>)>> = BTreeMap::new();
    let mut results: Vec<Option<Ret>> = vec![None; planned.len()];
    for &(t, tie, i) in &order {
        let ret = match planned[i].0.op {
            Op::Get(k) => Ret::Get(map.get(&k).copied()),
            Op::Put(k, v) => {
                map.insert(k, v);
                timeline.entry(k).or_default().push((t, tie, Some(v)));
                Ret::Put
            }
            Op::Delete(k) => {
                let was = map.remove(&k).is_some();
                timeline.entry(k).or_default().push((t, tie, None));
                Ret::Delete(if rng.chance(20) { None } else { Some(was) })
            }
            Op::Scan { .. } => Ret::Unknown, // below, from the timelines
        };
        results[i] = Some(ret);
    }
    let value_at = |k: u64, t: u64, tie: u64| -> Option<u64> {
        let line = timeline.get(&k).map(Vec::as_slice).unwrap_or(&[]);
        let n = line.partition_point(|&(lt, ltie, _)| (lt, ltie) <= (t, tie));
        match n.checked_sub(1) {
            Some(j) => line[j].2,
            None => initial.get(&k).copied(),
        }
    };

    let mut events = Vec::with_capacity(planned.len());
    for (i, (mut e, _, unknown)) in planned.into_iter().enumerate() {
        if unknown {
            events.push(e); // `Ret::Unknown` already
            continue;
        }
        if let (Op::Scan { low, high, limit }, Some(cmp)) = (&e.op, e.complete_ns) {
            let mut got = Vec::new();
            let mut t = e.invoke_ns;
            for k in *low..(*high).min(s.keys) {
                if got.len() >= *limit {
                    break;
                }
                t += rng.below(cmp - t + 1);
                // At t, on the tie-ordered scale: inside the scan.
                let at = (3 * t).clamp(3 * e.invoke_ns + 2, 3 * cmp);
                if let Some(v) = value_at(k, at, rng.next()) {
                    got.push((k, v));
                }
            }
            e.ret = Ret::Scan(got);
        } else if let Some(r) = results[i].take() {
            e.ret = r;
        }
        events.push(e);
    }
    (events, initial)
}

fn shapes() -> Vec<(&'static str, Shape)> {
    let base = Shape {
        clients: 4,
        ops_per_client: 40,
        keys: 4,
        values: 3,
        max_duration_ns: 100,
        max_gap_ns: 30,
        scans: true,
        crash_percent: 1,
        fail_percent: 3,
        preload: false,
    };
    vec![
        ("small ambiguous", base),
        (
            "preloaded",
            Shape {
                preload: true,
                keys: 8,
                ..base
            },
        ),
        (
            "one hot key",
            Shape {
                clients: 8,
                ops_per_client: 60,
                keys: 1,
                values: 1000,
                scans: false,
                ..base
            },
        ),
        (
            "many keys, long ops",
            Shape {
                clients: 6,
                keys: 16,
                values: 5,
                max_duration_ns: 400,
                max_gap_ns: 5,
                ..base
            },
        ),
    ]
}

#[test]
fn linearizable_by_construction_passes() {
    for (name, shape) in shapes() {
        for seed in 0..seeds(150) {
            let (h, initial) = generate(seed, shape);
            let v = check(&h, &initial);
            assert_eq!(v, Verdict::Ok, "shape `{name}`, seed {seed}: {v}");
        }
    }
}

#[test]
fn invented_reads_are_caught() {
    let search_only = search_only(CheckOptions::default().node_budget_per_key);
    let mut mutated = 0;
    for (name, shape) in shapes() {
        for seed in 0..seeds(100) {
            let (mut h, initial) = generate(seed, shape);
            let gets: Vec<usize> = (0..h.len())
                .filter(|&i| matches!(h[i].ret, Ret::Get(_)))
                .collect();
            let Some(&i) = gets.get(seed as usize % gets.len().max(1)) else {
                continue;
            };
            // No put ever writes this value, so no linearization explains it.
            h[i].ret = Ret::Get(Some(NEVER_WRITTEN + seed));
            mutated += 1;
            let v = check(&h, &initial);
            assert!(v.is_violation(), "shape `{name}`, seed {seed}: {v}");
            let v = check_with(&h, &initial, &search_only);
            assert!(
                v.is_violation(),
                "search alone, shape `{name}`, seed {seed}: {v}"
            );
        }
    }
    assert!(
        mutated > 300,
        "only {mutated} histories had a get to mutate"
    );
}

#[test]
fn broken_scans_are_caught() {
    let shape = shapes()[1].1; // preloaded, with scans
    let (mut invented, mut swapped) = (0, 0);
    for seed in 0..seeds(200) {
        let (h, initial) = generate(seed, shape);
        for (i, e) in h.iter().enumerate() {
            let Ret::Scan(r) = &e.ret else { continue };
            if let Some(&(k, _)) = r.first() {
                let mut bad = h.clone();
                let mut r2 = r.clone();
                r2[0] = (k, NEVER_WRITTEN);
                bad[i].ret = Ret::Scan(r2);
                let v = check(&bad, &initial);
                assert!(
                    v.is_violation(),
                    "invented value, seed {seed}, event {i}: {v}"
                );
                invented += 1;
            }
            if r.len() >= 2 {
                let mut bad = h.clone();
                let mut r2 = r.clone();
                r2.swap(0, 1);
                bad[i].ret = Ret::Scan(r2);
                let v = check(&bad, &initial);
                assert!(
                    v.is_violation(),
                    "swapped entries, seed {seed}, event {i}: {v}"
                );
                swapped += 1;
            }
        }
    }
    assert!(invented > 100 && swapped > 50, "{invented} {swapped}");
}

/// Below `small` mostly, sometimes an edge value (0…3, near `u64::MAX`).
fn wild(rng: &mut Rng, small: u64) -> u64 {
    const EDGE: [u64; 6] = [0, 1, 2, 3, u64::MAX - 1, u64::MAX];
    match rng.below(4) {
        0 => EDGE[rng.below(EDGE.len() as u64) as usize],
        _ => rng.below(small),
    }
}

#[test]
fn arbitrary_events_never_panic() {
    // Garbage in — wrong result kinds, backwards times, huge numbers — must
    // come back as a verdict, not a panic. Mostly well formed, so that the
    // deeper paths run too.
    for seed in 0..seeds(2000) {
        let mut rng = Rng::of(seed, 0);
        let mut h = Vec::new();
        for _ in 0..1 + rng.below(12) {
            let (k, v) = (wild(&mut rng, 4), wild(&mut rng, 4));
            let op = match rng.below(4) {
                0 => Op::Get(k),
                1 => Op::Put(k, v),
                2 => Op::Delete(k),
                _ => Op::Scan {
                    low: wild(&mut rng, 4),
                    high: wild(&mut rng, 6),
                    limit: wild(&mut rng, 4) as usize,
                },
            };
            let kind = match (&op, rng.below(10)) {
                (_, 0) => rng.below(5),
                (_, 1) => 4,
                (Op::Get(_), _) => 0,
                (Op::Put(..), _) => 1,
                (Op::Delete(_), _) => 2,
                (Op::Scan { .. }, _) => 3,
            };
            let ret = match kind {
                0 => Ret::Get(rng.chance(70).then(|| wild(&mut rng, 4))),
                1 => Ret::Put,
                2 => Ret::Delete([None, Some(true), Some(false)][rng.below(3) as usize]),
                3 => Ret::Scan(
                    (0..rng.below(5))
                        .map(|_| (wild(&mut rng, 6), wild(&mut rng, 4)))
                        .collect(),
                ),
                _ => Ret::Unknown,
            };
            let invoke_ns = wild(&mut rng, 100);
            let complete_ns = match rng.below(10) {
                0 => None,
                1 => Some(wild(&mut rng, 100)),
                _ => Some(invoke_ns.saturating_add(wild(&mut rng, 50))),
            };
            h.push(Event {
                client: rng.below(3) as u32,
                op,
                ret,
                invoke_ns,
                complete_ns,
            });
        }
        let initial: BTreeMap<u64, u64> = (0..seed % 4).map(|k| (k, k)).collect();
        let _ = check(&h, &initial);
        let tiny = CheckOptions {
            node_budget_per_key: 1,
            read_source_test: false,
        };
        let _ = check_with(&h, &initial, &tiny);
    }
}

// ------------------------------------------------- brute-force differential

/// Plain Wing–Gong without memoization or forced moves: try every
/// operation that may go next, recursively.
fn brute_force(events: &[Event], initial: &BTreeMap<u64, u64>) -> bool {
    let mut keys: BTreeMap<u64, Vec<&Event>> = BTreeMap::new();
    for e in events {
        match e.op {
            Op::Get(k) | Op::Put(k, _) | Op::Delete(k) => keys.entry(k).or_default().push(e),
            Op::Scan { .. } => {}
        }
    }
    keys.iter().all(|(k, ops)| {
        let ops: Vec<&Event> = ops
            .iter()
            .copied()
            .filter(|e| !(matches!(e.op, Op::Get(_)) && is_pending(e)))
            .collect();
        let mut used = vec![false; ops.len()];
        explore(&ops, &mut used, initial.get(k).copied())
    })
}

fn is_pending(e: &Event) -> bool {
    e.complete_ns.is_none() || e.ret == Ret::Unknown
}

/// The checker's tie rule, as times: a completion at t before an
/// invocation at t, an operation invoked and completed at t between them.
fn invoked3(e: &Event) -> u128 {
    let instant = !is_pending(e) && e.complete_ns == Some(e.invoke_ns);
    3 * e.invoke_ns as u128 + if instant { 1 } else { 2 }
}

fn completed3(e: &Event) -> Option<u128> {
    let c = e.complete_ns.filter(|_| !is_pending(e))?;
    Some(3 * c as u128 + u128::from(c == e.invoke_ns))
}

fn explore(ops: &[&Event], used: &mut [bool], state: Option<u64>) -> bool {
    let open = |i: usize| !used[i] && !is_pending(ops[i]);
    let Some(horizon) = (0..ops.len())
        .filter(|&i| open(i))
        .filter_map(|i| completed3(ops[i]))
        .min()
    else {
        return true; // every completed operation is linearized
    };
    for i in 0..ops.len() {
        if used[i] || invoked3(ops[i]) > horizon {
            continue;
        }
        let pending = is_pending(ops[i]);
        let next = match (&ops[i].op, &ops[i].ret) {
            (Op::Get(_), Ret::Get(r)) if *r == state => Some(state),
            (Op::Put(_, v), _) => Some(Some(*v)),
            (Op::Delete(_), _) if pending => Some(None),
            (Op::Delete(_), Ret::Delete(None)) => Some(None),
            (Op::Delete(_), Ret::Delete(Some(b))) if *b == state.is_some() => Some(None),
            _ => None,
        };
        if let Some(s) = next {
            used[i] = true;
            if explore(ops, used, s) {
                return true;
            }
            used[i] = false;
        }
    }
    false
}

#[test]
fn agrees_with_brute_force_on_small_mutated_histories() {
    let base = Shape {
        clients: 3,
        ops_per_client: 4,
        keys: 2,
        values: 2,
        max_duration_ns: 60,
        max_gap_ns: 20,
        scans: false,
        crash_percent: 5,
        fail_percent: 5,
        preload: true,
    };
    // Many pending operations on one key: what the search prunes hardest.
    let pending = Shape {
        clients: 4,
        ops_per_client: 3,
        keys: 1,
        values: 3,
        crash_percent: 15,
        fail_percent: 25,
        ..base
    };
    let search_only = search_only(CheckOptions::default().node_budget_per_key);
    for (name, shape) in [("base", base), ("pending", pending)] {
        let (mut allowed, mut forbidden) = (0, 0);
        for seed in 0..seeds(3000) {
            let (mut h, initial) = generate(seed, shape);
            let mut rng = Rng::of(seed, 1);
            // Mutate one or two results to something plausible.
            for _ in 0..1 + rng.below(2) {
                let i = rng.below(h.len() as u64) as usize;
                h[i].ret = match h[i].ret {
                    Ret::Get(_) => Ret::Get(match rng.below(3) {
                        0 => None,
                        v => Some(v),
                    }),
                    Ret::Delete(_) => Ret::Delete(Some(rng.chance(50))),
                    ref r => r.clone(),
                };
            }
            let want = brute_force(&h, &initial);
            for (how, v) in [
                ("full", check(&h, &initial)),
                ("search alone", check_with(&h, &initial, &search_only)),
            ] {
                assert!(
                    matches!(v, Verdict::Ok | Verdict::Violation(_)),
                    "shape `{name}`, seed {seed}, {how}: {v}"
                );
                assert_eq!(
                    v.is_ok(),
                    want,
                    "shape `{name}`, seed {seed}, {how}: brute force says {want}, checker says {v}\n{h:#?}"
                );
            }
            if want {
                allowed += 1;
            } else {
                forbidden += 1;
            }
        }
        // Both outcomes must be well represented for agreement to mean much.
        let n = allowed + forbidden;
        assert!(
            allowed * 10 > n && forbidden * 10 > n,
            "shape `{name}`: {allowed} allowed, {forbidden} forbidden"
        );
    }
}

// ----------------------------------------------------------------- scale

/// A hot key: `clients` clients, 4096 operations in all, on one key with
/// unique values; operations last up to 1 µs with gaps up to 20 ns, so each
/// overlaps about `clients - 1` others. 1% fail with an unknown effect.
fn hot_key(seed: u64, clients: u32) -> (Vec<Event>, BTreeMap<u64, u64>) {
    let shape = Shape {
        clients,
        ops_per_client: 4096 / clients,
        keys: 1,
        values: 1 << 30,
        max_duration_ns: 1000,
        max_gap_ns: 20,
        scans: false,
        crash_percent: 0,
        fail_percent: 1,
        preload: false,
    };
    generate(seed, shape)
}

/// Makes a get in the second half of `h` return the value of a put that
/// completed at least 5 µs before the get began (and, values being unique,
/// was overwritten since). Each get alone still has a source, so the
/// search must clear the whole prefix to refute it.
fn stale_read(h: &mut [Event], seed: u64) {
    let half = h.iter().map(|e| e.invoke_ns).max().unwrap_or(0) / 2;
    let g = (0..h.len()).find(|&i| matches!(h[i].ret, Ret::Get(Some(_))) && h[i].invoke_ns > half);
    let put = g.and_then(|g| {
        (0..h.len()).rev().find_map(|i| match h[i].op {
            Op::Put(_, v)
                if h[i].ret == Ret::Put
                    && h[i].complete_ns.is_some_and(|c| c + 5_000 < h[g].invoke_ns) =>
            {
                Some(v)
            }
            _ => None,
        })
    });
    let (Some(g), Some(old)) = (g, put) else {
        panic!("seed {seed}: no late get or early put to mutate");
    };
    h[g].ret = Ret::Get(Some(old));
}

fn search_only(node_budget_per_key: u64) -> CheckOptions {
    CheckOptions {
        node_budget_per_key,
        read_source_test: false,
    }
}

#[test]
fn thousands_of_ops_on_one_hot_key_check_quickly() {
    for seed in 0..3 {
        let (h, initial) = hot_key(seed, 32);
        let t0 = Instant::now();
        let v = check(&h, &initial);
        let ok_ms = t0.elapsed().as_millis();
        assert_eq!(v, Verdict::Ok, "seed {seed}");

        let mut bad = h.clone();
        stale_read(&mut bad, seed);
        let t1 = Instant::now();
        let v = check(&bad, &initial);
        let bad_ms = t1.elapsed().as_millis();
        assert!(v.is_violation(), "seed {seed}: {v}");
        // The search alone may not decide at this concurrency, but it must
        // never call the history allowed.
        let alone = check_with(&bad, &initial, &search_only(100_000));
        assert!(
            !alone.is_ok(),
            "seed {seed}: the search alone passed a stale read"
        );
        eprintln!(
            "seed {seed}: {} ops, 32 clients: allowed in {ok_ms} ms, stale read caught in {bad_ms} ms",
            h.len()
        );
        assert!(
            ok_ms < 2_000 && bad_ms < 2_000,
            "seed {seed}: {ok_ms} ms, {bad_ms} ms"
        );
    }
}

#[test]
fn the_search_alone_refutes_a_stale_read_at_moderate_concurrency() {
    for seed in 0..3 {
        let (mut h, initial) = hot_key(seed, 8);
        stale_read(&mut h, seed);
        let t0 = Instant::now();
        let v = check_with(&h, &initial, &search_only(2_000_000));
        assert!(v.is_violation(), "seed {seed}: {v}");
        eprintln!(
            "seed {seed}: {} ops, 8 clients: refuted by the search alone in {} ms",
            h.len(),
            t0.elapsed().as_millis()
        );
    }
}
