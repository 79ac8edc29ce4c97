//! Operation histories of a `u64 → u64` map, and the checker that decides
//! whether an index produced an allowed one.
//!
//! Owns recording — [`History`] is plain data for one thread (the simulator
//! keeps it behind `Rc<RefCell<_>>`), [`Recorder`] shares one across threads
//! (emu tests) — and checking, [`check`]. Times are nanoseconds supplied by
//! the caller, so virtual time works; an invocation must be stamped before
//! the operation's first verb and its completion after its last.
//!
//! An operation that never completed (its client crashed) or completed with
//! [`Ret::Unknown`] (an error whose effect is unknown) is *pending*: it may
//! take effect at any moment after its invocation, or never, and its result
//! is not checked. Operation `a` *precedes* `b` when `a` completed before
//! `b` was invoked, or at the same time stamp: a completion at `t` comes
//! before an invocation at `t`. An operation invoked and completed at the
//! same `t` (no verb between) comes after the completions at `t` and
//! before the invocations at `t`, concurrent with others like it. Sound
//! where a verb's effect lands strictly after its post and strictly
//! before its completion is seen, as on the simulator (its link latency is
//! positive) and on a NIC; and needed there: the simulator stamps a
//! client's completion and its next invocation with the same virtual
//! time, and counting the two as concurrent let that next operation read
//! around the client's own write.
//!
//! What [`check`] promises:
//!
//! * **Point operations** (get, put, delete) are checked for
//!   linearizability against a map, key by key (operations on different keys
//!   of a map commute, so the map is linearizable iff each key's register
//!   is). [`Verdict::Ok`]: every key has a linearization.
//!   [`Verdict::Violation`]: some key has none — exact, but for the search
//!   remembering explored nodes by 128-bit hashes, whose collision (odds
//!   about nodes² / 2¹²⁹) could hide a path. [`Verdict::Undecided`]: the
//!   search spent its node budget on some key and found no violation
//!   elsewhere.
//! * **Scans** are held to what the Sherman B+tree's range query promises
//!   (Sherman §4.4): not a snapshot, but each entry as read at some moment of
//!   the scan. For a completed scan `s` over `[low, high)` with limit `L`,
//!   running over `[s.inv, s.cmp]` and returning `R`:
//!   - S1: `R`'s keys are strictly ascending and in `[low, high)`; `|R| ≤ L`.
//!   - S2: each key in `R` could be present during `s`: the initial map holds
//!     it or a put of it was invoked by `s.cmp`, and that entry was not
//!     *certainly gone* before `s.inv` — gone when a completed operation that
//!     deleted the key or saw it absent was invoked after the put completed
//!     and completed before `s.inv`.
//!   - S3: each `(k, v)` in `R` could be current during `s`: the same for an
//!     initial entry or put of exactly `v`, where it is gone when a completed
//!     operation that wrote or saw anything else (a delete, a put of another
//!     value, a get returning another value or nothing) ran in between.
//!   - S4: each key *certainly present throughout* `s` is in `R` — every such
//!     key in `[low, high)` when `|R| < L`, in `[low, last key of R]` when
//!     `|R| = L`. Certainly present throughout: the initial map holds it, or
//!     a completed put or get saw it present and completed before `s.inv`;
//!     and every delete of it (completed or pending) invoked by `s.cmp`
//!     completed before that put or get was invoked (no delete at all, for
//!     an initial entry).
//!
//!   Each rule follows from the promise under any linearization of the point
//!   operations, so a correct index never fails them; they do not catch
//!   every wrong scan.
//! * Before the search, each completed get passes the *source test*: the S3
//!   rule over the get's own interval, absence counting as a value written
//!   by deletes. It is implied by linearizability, catches stale and
//!   invented reads at once however long the history, and names the culprit.
//! * Malformed histories (a result of the wrong kind, a completion before its
//!   invocation, a result without a completion time, a completion recorded
//!   twice) give a [`Verdict::Violation`] starting "malformed history". No
//!   input makes the checker panic.
//!
//! The search is Wing & Gong's with Lowe's memoization (Lowe, "Testing for
//! linearizability", 2017; as in Porcupine): depth first over which
//! operation goes next, the candidates being those invoked no later than
//! the earliest completion among the operations not yet placed, with a memo
//! of explored (placed set, value) nodes — all failed, since success ends
//! the search. What keeps it small (each step argued where it is coded):
//! - a read that fits the current value is placed at once, without
//!   branching; pending gets are dropped;
//! - a node is dead once some value is *starved*: still to be read, but no
//!   unplaced write of it was invoked before that read completed;
//! - a pending write is branched on only where it could matter, one per
//!   value; and a node with more pending writes still available dominates
//!   the same node with fewer (up to 64 pending operations per key).
//!
//! Refuting a history costs every node reachable before the violation, so a
//! violation the source test misses, late in a key's history with many
//! overlapping operations, may come back undecided. From
//! `cargo test --release -p history --test map_random -- --nocapture`:
//! 4096 operations on one key from 32 clients check in 13–14 ms, and a stale
//! read among them is refuted by the search alone in 0.13–0.4 s with 8
//! clients but not within 100 000 nodes with 32. A node costs O(c log c)
//! for c candidates and at most one memo entry; their number is capped by
//! [`CheckOptions::node_budget_per_key`].

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::{self, Write as _};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

/// An operation on the map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Get(u64),
    /// Insert or update.
    Put(u64, u64),
    Delete(u64),
    /// Keys in `[low, high)`, ascending, at most `limit` of them.
    Scan {
        low: u64,
        high: u64,
        limit: usize,
    },
}

/// What an operation returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ret {
    Get(Option<u64>),
    Put,
    /// Whether the key was present; `None` when the index does not say.
    Delete(Option<bool>),
    Scan(Vec<(u64, u64)>),
    /// Failed with an unknown effect: treated as pending.
    Unknown,
}

/// One operation: what was asked, what came back, and when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub client: u32,
    pub op: Op,
    pub ret: Ret,
    pub invoke_ns: u64,
    /// `None` while (or because) the operation never completed.
    pub complete_ns: Option<u64>,
}

impl Event {
    pub fn completed(client: u32, op: Op, ret: Ret, invoke_ns: u64, complete_ns: u64) -> Event {
        Event {
            client,
            op,
            ret,
            invoke_ns,
            complete_ns: Some(complete_ns),
        }
    }

    /// An operation that never completed.
    pub fn pending(client: u32, op: Op, invoke_ns: u64) -> Event {
        Event {
            client,
            op,
            ret: Ret::Unknown,
            invoke_ns,
            complete_ns: None,
        }
    }

    /// Never completed, or completed with an unknown effect.
    pub fn is_pending(&self) -> bool {
        self.complete_ns.is_none() || self.ret == Ret::Unknown
    }
}

/// Names an invoked operation so that its completion can be recorded.
#[must_use = "an invoked operation is completed through its OpId"]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpId(usize);

/// A recorded history, for one thread.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    events: Vec<Event>,
    /// Recording mistakes (unknown or twice-completed ids); reported by
    /// [`History::check`] rather than panicking where they happen.
    misuse: Vec<String>,
}

impl History {
    pub fn new() -> History {
        History::default()
    }

    /// Records an invocation at `now_ns`; the operation is pending until
    /// [`History::complete`].
    pub fn invoke(&mut self, client: u32, op: Op, now_ns: u64) -> OpId {
        self.events.push(Event::pending(client, op, now_ns));
        OpId(self.events.len() - 1)
    }

    /// Records the result of `id` at `now_ns`. Use [`Ret::Unknown`] for an
    /// error whose effect is unknown.
    pub fn complete(&mut self, id: OpId, ret: Ret, now_ns: u64) {
        match self.events.get_mut(id.0) {
            None => self.misuse.push(format!(
                "complete() of operation {} that was never invoked",
                id.0
            )),
            Some(e) if e.complete_ns.is_some() => self
                .misuse
                .push(format!("operation #{} completed twice", id.0)),
            Some(e) => {
                e.ret = ret;
                e.complete_ns = Some(now_ns);
            }
        }
    }

    /// Appends a whole event (hand-written or imported histories).
    pub fn push(&mut self, event: Event) {
        self.events.push(event);
    }

    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// Moves `other`'s events (and any recording mistakes it noted) to
    /// the end of this one, without copying them: the histories of several
    /// executors made one. `other`'s operation ids do not name its events
    /// here.
    pub fn append(&mut self, other: History) {
        self.events.extend(other.events);
        self.misuse.extend(other.misuse);
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// [`check`] over this history, after any recording mistakes.
    pub fn check(&self, initial: &BTreeMap<u64, u64>) -> Verdict {
        if let Some(m) = self.misuse.first() {
            return Verdict::Violation(format!(
                "malformed history: {m} ({} recording mistakes in all)",
                self.misuse.len()
            ));
        }
        check(&self.events, initial)
    }

    /// One JSON object per event and line, in recording order:
    /// `{"client":1,"op":"put","key":5,"value":9,"ret":"ok","invoke_ns":10,"complete_ns":20}`.
    /// `op` is `get`, `put` (with `value`), `delete` or `scan` (with `low`,
    /// `high`, `limit` instead of `key`). `ret` is a number or `null`
    /// (absent) for a get, `"ok"` for a put, `true`/`false` or `"ok"` (not
    /// reported) for a delete, `[[key,value],…]` for a scan, and `"unknown"`
    /// for a pending operation; `complete_ns` is `null` if it never completed.
    pub fn to_json_lines(&self) -> String {
        let mut out = String::with_capacity(self.events.len() * 96);
        for e in &self.events {
            e.write_json(&mut out, "");
            out.push('\n');
        }
        out
    }
}

impl Event {
    /// Appends this event as one JSON object (no newline), in the form
    /// [`History::to_json_lines`] documents, with `prefix` (members such as
    /// `"type":"op",`, each followed by a comma) first.
    pub fn write_json(&self, out: &mut String, prefix: &str) {
        let e = self;
        // Writing into a String cannot fail.
        let _ = write!(out, "{{{prefix}\"client\":{},", e.client);
        let _ = match &e.op {
            Op::Get(k) => write!(out, "\"op\":\"get\",\"key\":{k},"),
            Op::Put(k, v) => write!(out, "\"op\":\"put\",\"key\":{k},\"value\":{v},"),
            Op::Delete(k) => write!(out, "\"op\":\"delete\",\"key\":{k},"),
            Op::Scan { low, high, limit } => write!(
                out,
                "\"op\":\"scan\",\"low\":{low},\"high\":{high},\"limit\":{limit},"
            ),
        };
        out.push_str("\"ret\":");
        let _ = match &e.ret {
            Ret::Get(Some(v)) => write!(out, "{v}"),
            Ret::Get(None) => write!(out, "null"),
            Ret::Put | Ret::Delete(None) => write!(out, "\"ok\""),
            Ret::Delete(Some(b)) => write!(out, "{b}"),
            Ret::Scan(r) => {
                out.push('[');
                for (i, (k, v)) in r.iter().enumerate() {
                    let _ = write!(out, "{}[{k},{v}]", if i == 0 { "" } else { "," });
                }
                write!(out, "]")
            }
            Ret::Unknown => write!(out, "\"unknown\""),
        };
        let _ = write!(out, ",\"invoke_ns\":{},\"complete_ns\":", e.invoke_ns);
        let _ = match e.complete_ns {
            Some(c) => write!(out, "{c}}}"),
            None => write!(out, "null}}"),
        };
    }
}

/// A [`History`] shared by threads; clones record into the same history.
#[derive(Clone, Debug, Default)]
pub struct Recorder {
    inner: Arc<Mutex<History>>,
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder::default()
    }

    pub fn invoke(&self, client: u32, op: Op, now_ns: u64) -> OpId {
        self.lock().invoke(client, op, now_ns)
    }

    pub fn complete(&self, id: OpId, ret: Ret, now_ns: u64) {
        self.lock().complete(id, ret, now_ns)
    }

    /// A copy of the history so far.
    pub fn snapshot(&self) -> History {
        self.lock().clone()
    }

    pub fn check(&self, initial: &BTreeMap<u64, u64>) -> Verdict {
        self.snapshot().check(initial)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, History> {
        // Recording cannot panic halfway through an update, so a poisoned
        // lock (another thread panicked elsewhere) still guards whole events.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The checker's answer.
#[must_use]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    /// No allowed explanation exists; the text says where.
    Violation(String),
    /// The search gave up (node budget); no violation was found.
    Undecided(String),
}

impl Verdict {
    pub fn is_ok(&self) -> bool {
        matches!(self, Verdict::Ok)
    }

    pub fn is_violation(&self) -> bool {
        matches!(self, Verdict::Violation(_))
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Ok => write!(f, "ok"),
            Verdict::Violation(s) => write!(f, "violation: {s}"),
            Verdict::Undecided(s) => write!(f, "undecided: {s}"),
        }
    }
}

/// Knobs of [`check_with`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckOptions {
    /// Search nodes one key may visit before its verdict is undecided. A
    /// node costs about 0.3 µs in a release build and at most one memo
    /// entry (16–80 bytes), so the default bounds a key to about 0.6 s.
    pub node_budget_per_key: u64,
    /// Run the source test on gets before the search. Off only to test the
    /// search alone.
    pub read_source_test: bool,
}

impl Default for CheckOptions {
    fn default() -> CheckOptions {
        CheckOptions {
            node_budget_per_key: 2_000_000,
            read_source_test: true,
        }
    }
}

/// Nodes the second, unpruned search may spend to explain a violation.
const REPORT_BUDGET: u64 = 50_000;

/// Checks `events` against a map that held `initial` before the first one.
pub fn check(events: &[Event], initial: &BTreeMap<u64, u64>) -> Verdict {
    check_with(events, initial, &CheckOptions::default())
}

/// [`check`] with explicit options.
pub fn check_with(
    events: &[Event],
    initial: &BTreeMap<u64, u64>,
    options: &CheckOptions,
) -> Verdict {
    if let Err(m) = validate(events) {
        return Verdict::Violation(format!("malformed history: {m}"));
    }

    let mut per_key: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    let mut scans = Vec::new();
    for (i, e) in events.iter().enumerate() {
        match e.op {
            Op::Get(k) | Op::Put(k, _) | Op::Delete(k) => per_key.entry(k).or_default().push(i),
            Op::Scan { .. } => scans.push(i),
        }
    }
    let indexes: BTreeMap<u64, WriteIndex> = per_key
        .iter()
        .map(|(&k, evs)| (k, WriteIndex::new(events, evs, initial.get(&k).copied())))
        .collect();

    let mut violations: Vec<String> = Vec::new();
    let mut undecided: Vec<String> = Vec::new();
    for (&key, evs) in &per_key {
        let index = &indexes[&key];
        if options.read_source_test {
            if let Some(v) = read_source_test(events, evs, index) {
                violations.push(v);
                continue;
            }
        }
        let ops = key_ops(events, evs);
        let init = initial.get(&key).copied();
        match Search::new(&ops, init, options.node_budget_per_key).run() {
            Outcome::Linearizable => {}
            Outcome::Stuck(pruned) => {
                // Pruning stops at the first sign of doom, which makes a
                // terse report; a search without it usually gets further
                // along the history before it is stuck.
                let mut plain =
                    Search::new(&ops, init, REPORT_BUDGET.min(options.node_budget_per_key));
                plain.prune_starved = false;
                let deepest = match plain.run() {
                    Outcome::Linearizable => continue, // an exact "yes" wins
                    Outcome::Stuck(d) | Outcome::OutOfBudget(d) if d.done > pruned.done => d,
                    _ => pruned,
                };
                violations.push(deepest.report(key, events, &ops, "they have no linearization"));
            }
            Outcome::OutOfBudget(deepest) => undecided.push(deepest.report(
                key,
                events,
                &ops,
                &format!(
                    "the search spent its budget of {} nodes without a verdict",
                    options.node_budget_per_key
                ),
            )),
        }
    }
    for &s in &scans {
        if let Some(v) = check_scan(events, s, initial, &indexes) {
            violations.push(v);
        }
    }

    const SHOWN: usize = 3;
    if !violations.is_empty() {
        let n = violations.len();
        let mut text = violations
            .into_iter()
            .take(SHOWN)
            .collect::<Vec<_>>()
            .join("\n");
        if n > SHOWN {
            let _ = write!(text, "\n({n} violations in all; first {SHOWN} shown)");
        }
        return Verdict::Violation(text);
    }
    if !undecided.is_empty() {
        let n = undecided.len();
        let mut text = undecided
            .into_iter()
            .take(SHOWN)
            .collect::<Vec<_>>()
            .join("\n");
        if n > SHOWN {
            let _ = write!(text, "\n({n} keys undecided; first {SHOWN} shown)");
        }
        return Verdict::Undecided(text);
    }
    Verdict::Ok
}

fn validate(events: &[Event]) -> Result<(), String> {
    for (i, e) in events.iter().enumerate() {
        let kinds_match = matches!(
            (&e.op, &e.ret),
            (_, Ret::Unknown)
                | (Op::Get(_), Ret::Get(_))
                | (Op::Put(..), Ret::Put)
                | (Op::Delete(_), Ret::Delete(_))
                | (Op::Scan { .. }, Ret::Scan(_))
        );
        if !kinds_match {
            return Err(format!(
                "event {} has a result of the wrong kind",
                show(i, e)
            ));
        }
        match e.complete_ns {
            Some(c) if c < e.invoke_ns => {
                return Err(format!(
                    "event {} completed before it was invoked",
                    show(i, e)
                ))
            }
            None if e.ret != Ret::Unknown => {
                return Err(format!(
                    "event {} has a result but no completion time",
                    show(i, e)
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Times and the write index: the "could be current" and "certainly present"
// questions the source test and the scan rules ask.

/// Times widened so that "before everything" (an initial entry) and "never
/// completes" (a pending operation) are ordinary values, and scaled so
/// that ties are ordered (the module's doc): a completion at `t` is `3t`,
/// an invocation at `t` is `3t + 2`, and an operation invoked and
/// completed at `t` is `3t + 1` at both ends. Strict comparisons of
/// stamps then order what the rule orders and nothing else.
type Stamp = i128;
const BEFORE_ALL: Stamp = -1;
const NEVER: Stamp = Stamp::MAX;

/// Whether `e` completed at the time it was invoked.
fn instant(e: &Event) -> bool {
    !e.is_pending() && e.complete_ns == Some(e.invoke_ns)
}

fn invoked_at(e: &Event) -> Stamp {
    3 * Stamp::from(e.invoke_ns) + if instant(e) { 1 } else { 2 }
}

/// Completion time for ordering purposes: pending operations never complete.
fn completed_at(e: &Event) -> Stamp {
    match (e.is_pending(), e.complete_ns) {
        (false, Some(c)) => 3 * Stamp::from(c) + Stamp::from(instant(e)),
        _ => NEVER,
    }
}

/// The nanoseconds of a stamp (for messages).
fn ns_of(s: Stamp) -> Stamp {
    s.div_euclid(3)
}

/// The value an operation left or saw: `None` for absence.
type Class = Option<u64>;

/// An operation's interval, and the value it left or saw.
#[derive(Clone, Copy, Debug)]
struct Span {
    invoked: Stamp,
    completed: Stamp,
    ev: usize,
    class: Class,
}

/// Writes sorted by invocation, with the running best (latest completion)
/// of each prefix: the best source of a value among those invoked by a time.
#[derive(Debug, Default)]
struct Sources {
    by_inv: Vec<Span>,
    best_prefix: Vec<usize>,
}

impl Sources {
    fn new(mut ws: Vec<Span>) -> Sources {
        ws.sort_by_key(|w| (w.invoked, w.completed));
        let mut best_prefix: Vec<usize> = Vec::with_capacity(ws.len());
        for (i, w) in ws.iter().enumerate() {
            let b = match best_prefix.last() {
                Some(&b) if ws[b].completed >= w.completed => b,
                _ => i,
            };
            best_prefix.push(b);
        }
        Sources {
            by_inv: ws,
            best_prefix,
        }
    }

    /// Among writes invoked at or before `until`, the one completing last;
    /// it is the hardest to have been overwritten.
    fn best(&self, until: Stamp) -> Option<Span> {
        let n = self.by_inv.partition_point(|w| w.invoked <= until);
        n.checked_sub(1).map(|i| self.by_inv[self.best_prefix[i]])
    }
}

/// Completed operations sorted by invocation, with, for each suffix, the
/// earliest-completing one and the earliest-completing one of another
/// class: enough to ask "did an operation not of class c both start after
/// t and finish before u?" in O(log n).
#[derive(Debug, Default)]
struct Between {
    by_inv: Vec<Span>,
    suffix: Vec<(Option<usize>, Option<usize>)>,
}

impl Between {
    fn new(mut ws: Vec<Span>) -> Between {
        ws.sort_by_key(|w| (w.invoked, w.completed));
        let mut suffix = vec![(None, None); ws.len() + 1];
        for i in (0..ws.len()).rev() {
            let (a, b) = suffix[i + 1];
            let earlier =
                |x: Option<usize>| x.is_none_or(|x: usize| ws[i].completed < ws[x].completed);
            suffix[i] = match a {
                // `i` is the new best; the runner-up of another class is the
                // old best if its class differs, else the old runner-up.
                Some(a) if earlier(Some(a)) && ws[a].class != ws[i].class => (Some(i), Some(a)),
                Some(_) if earlier(a) => (Some(i), b),
                None => (Some(i), None),
                Some(a) if ws[i].class != ws[a].class && earlier(b) => (Some(a), Some(i)),
                Some(a) => (Some(a), b),
            };
        }
        Between { by_inv: ws, suffix }
    }

    /// An operation whose class is not `keep`, invoked after `after` and
    /// completed before `before`, if any.
    fn find(&self, after: Stamp, keep: Class, before: Stamp) -> Option<Span> {
        let i = self.by_inv.partition_point(|w| w.invoked <= after);
        let (a, b) = self.suffix.get(i).copied().unwrap_or((None, None));
        let pick = match a {
            Some(a) if self.by_inv[a].class != keep => Some(a),
            _ => b,
        };
        pick.map(|p| self.by_inv[p])
            .filter(|w| w.completed < before)
    }
}

/// Everything the source test and the scan rules ask about one key.
#[derive(Debug, Default)]
struct WriteIndex {
    initial: Option<u64>,
    /// All writes (completed or pending) by class.
    sources: HashMap<Class, Sources>,
    /// All puts (completed or pending), any value.
    any_put: Sources,
    /// Completed operations with the value each wrote or read: one of
    /// another value between a source and a reader means the source's
    /// value was gone by then (and only a later source could bring it back).
    superseders: Between,
    /// The completed ones that wrote or saw absence.
    absences: Between,
    /// Completed operations that wrote or saw the key present, by
    /// completion, with the latest invocation per prefix.
    present_by_cmp: Vec<Span>,
    present_latest_inv_prefix: Vec<usize>,
    /// All deletes by invocation, with the latest completion per prefix.
    del_by_inv: Vec<Span>,
    del_latest_cmp_prefix: Vec<usize>,
}

/// Why a reader's value could not be current.
enum NoSource {
    NeverWritten,
    /// Event indices: the source (`None` for the initial map) and an
    /// operation that saw or wrote something else in between.
    Superseded {
        source: Option<usize>,
        by: usize,
    },
}

impl WriteIndex {
    fn new(events: &[Event], evs: &[usize], initial: Option<u64>) -> WriteIndex {
        let mut writes = Vec::new();
        for &i in evs {
            let e = &events[i];
            let class = match e.op {
                Op::Put(_, v) => Some(v),
                Op::Delete(_) => None,
                _ => continue,
            };
            writes.push(Span {
                invoked: invoked_at(e),
                completed: completed_at(e),
                ev: i,
                class,
            });
        }
        let mut by_class: HashMap<Class, Vec<Span>> = HashMap::new();
        for w in &writes {
            by_class.entry(w.class).or_default().push(*w);
        }
        // Completed operations, by what they left or saw: between their
        // invocation and completion the key held that value.
        let observed: Vec<Span> = evs
            .iter()
            .filter(|&&i| !events[i].is_pending())
            .filter_map(|&i| {
                let e = &events[i];
                let class = match (&e.op, &e.ret) {
                    (Op::Put(_, v), _) => Some(*v),
                    (Op::Delete(_), _) => None,
                    (Op::Get(_), Ret::Get(r)) => *r,
                    _ => return None,
                };
                Some(Span {
                    invoked: invoked_at(e),
                    completed: completed_at(e),
                    ev: i,
                    class,
                })
            })
            .collect();
        let mut present_by_cmp: Vec<Span> = observed
            .iter()
            .filter(|w| w.class.is_some())
            .copied()
            .collect();
        present_by_cmp.sort_by_key(|w| (w.completed, w.invoked));
        let present_latest_inv_prefix = running_best(&present_by_cmp, |w| w.invoked);
        let mut del_by_inv: Vec<Span> = writes
            .iter()
            .filter(|w| w.class.is_none())
            .copied()
            .collect();
        del_by_inv.sort_by_key(|w| (w.invoked, w.completed));
        let del_latest_cmp_prefix = running_best(&del_by_inv, |w| w.completed);
        WriteIndex {
            initial,
            any_put: Sources::new(
                writes
                    .iter()
                    .filter(|w| w.class.is_some())
                    .copied()
                    .collect(),
            ),
            absences: Between::new(
                observed
                    .iter()
                    .filter(|w| w.class.is_none())
                    .copied()
                    .collect(),
            ),
            superseders: Between::new(observed),
            sources: by_class
                .into_iter()
                .map(|(c, ws)| (c, Sources::new(ws)))
                .collect(),
            present_by_cmp,
            present_latest_inv_prefix,
            del_by_inv,
            del_latest_cmp_prefix,
        }
    }

    /// Could the key's value be `class` at some moment of `[from, until]`?
    fn could_be(&self, class: Class, from: Stamp, until: Stamp) -> Result<(), NoSource> {
        let mut killed = None;
        if self.initial == class {
            match self.superseders.find(BEFORE_ALL, class, from) {
                None => return Ok(()),
                Some(by) => {
                    killed = Some(NoSource::Superseded {
                        source: None,
                        by: by.ev,
                    })
                }
            }
        }
        match self.sources.get(&class).and_then(|s| s.best(until)) {
            None => Err(killed.unwrap_or(NoSource::NeverWritten)),
            Some(src) => match self.superseders.find(src.completed, class, from) {
                None => Ok(()),
                Some(by) => Err(NoSource::Superseded {
                    source: Some(src.ev),
                    by: by.ev,
                }),
            },
        }
    }

    /// Could the key be present at some moment of `[from, until]`? (`keep`
    /// is any present value: every absence counts.)
    fn could_be_present(&self, from: Stamp, until: Stamp) -> bool {
        (self.initial.is_some() && self.absences.find(BEFORE_ALL, Some(0), from).is_none())
            || self
                .any_put
                .best(until)
                .is_some_and(|p| self.absences.find(p.completed, Some(0), from).is_none())
    }

    /// If the key is certainly present throughout `[from, until]`, the
    /// operation that shows it (`None` inside for an initial entry): it
    /// wrote or saw the key present and completed before `from`, and every
    /// delete that might fall before `until` completed before it began. Of
    /// the candidates, the one invoked last is the strongest.
    fn certainly_present(&self, from: Stamp, until: Stamp) -> Option<Option<Span>> {
        let n = self.present_by_cmp.partition_point(|w| w.completed < from);
        let witness = match n.checked_sub(1) {
            Some(i) => Some(self.present_by_cmp[self.present_latest_inv_prefix[i]]),
            None if self.initial.is_some() => None,
            None => return None,
        };
        let witness_inv = witness.map_or(BEFORE_ALL, |w| w.invoked);
        let d = self.del_by_inv.partition_point(|w| w.invoked <= until);
        let last_del_cmp = d
            .checked_sub(1)
            .map(|i| self.del_by_inv[self.del_latest_cmp_prefix[i]].completed);
        match last_del_cmp {
            Some(c) if c >= witness_inv => None,
            _ => Some(witness),
        }
    }
}

/// For each prefix of `ws`, the index of the element with the largest `f`.
fn running_best(ws: &[Span], f: impl Fn(&Span) -> Stamp) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::with_capacity(ws.len());
    for (i, w) in ws.iter().enumerate() {
        let b = match out.last() {
            Some(&b) if f(&ws[b]) >= f(w) => b,
            _ => i,
        };
        out.push(b);
    }
    out
}

/// The source test: every completed get's value could have been current
/// during the get. Returns the first failure as a report.
fn read_source_test(events: &[Event], evs: &[usize], index: &WriteIndex) -> Option<String> {
    for &i in evs {
        let e = &events[i];
        let (Op::Get(key), Ret::Get(got), false) = (&e.op, &e.ret, e.is_pending()) else {
            continue;
        };
        if let Err(why) = index.could_be(*got, invoked_at(e), completed_at(e)) {
            let mut s = format!(
                "key {key}: {} returned {}, which it could not have read:\n",
                show(i, e),
                show_value(*got)
            );
            explain_no_source(&mut s, events, why, *got, index.initial);
            return Some(s);
        }
    }
    None
}

fn explain_no_source(
    s: &mut String,
    events: &[Event],
    why: NoSource,
    got: Class,
    initial: Option<u64>,
) {
    let what = match got {
        Some(v) => format!("value {v}"),
        None => "absence".to_string(),
    };
    let _ = match why {
        NoSource::NeverWritten => writeln!(
            s,
            "  no {} was invoked before it completed, and the initial map {}",
            match got {
                Some(v) => format!("put of {v}"),
                None => "delete".to_string(),
            },
            match initial {
                Some(v) => format!("held {v}"),
                None => "lacked the key".to_string(),
            }
        ),
        NoSource::Superseded { source, by } => writeln!(
            s,
            "  its latest-completing source of {what}, {}, was certainly superseded before it began: in between, this saw or wrote something else:\n  {}",
            match source {
                Some(i) => show(i, &events[i]),
                None => "the initial map".to_string(),
            },
            show(by, &events[by])
        ),
    };
}

// ---------------------------------------------------------------------------
// Scans.

fn check_scan(
    events: &[Event],
    i: usize,
    initial: &BTreeMap<u64, u64>,
    indexes: &BTreeMap<u64, WriteIndex>,
) -> Option<String> {
    let e = &events[i];
    let (&Op::Scan { low, high, limit }, Ret::Scan(got), false) = (&e.op, &e.ret, e.is_pending())
    else {
        return None;
    };
    let head = || {
        let mut r = format!("{}:\n", show(i, e));
        if got.len() > 12 {
            let _ = writeln!(r, "  ({} entries, first 12 shown above)", got.len());
        }
        r
    };
    let scan = ScanSeen {
        low,
        high,
        limit,
        got,
        from: invoked_at(e),
        until: completed_at(e),
        head: &head,
    };
    scan.shape()
        .or_else(|| scan.entries(events, initial, indexes))
        .or_else(|| scan.missing(events, initial, indexes))
}

/// A completed scan as the scan rules look at it: its range, limit and
/// answer, when it ran, and the first line of a violation's report.
struct ScanSeen<'a> {
    low: u64,
    high: u64,
    limit: usize,
    got: &'a [(u64, u64)],
    from: Stamp,
    until: Stamp,
    head: &'a dyn Fn() -> String,
}

impl ScanSeen<'_> {
    /// S1: within its limit and range, keys in order.
    fn shape(&self) -> Option<String> {
        let (low, high, limit, got, head) = (self.low, self.high, self.limit, self.got, self.head);
        if got.len() > limit {
            return Some(format!(
                "{}  returned {} entries, over its limit",
                head(),
                got.len()
            ));
        }
        for (j, &(k, _)) in got.iter().enumerate() {
            if k < low || k >= high {
                return Some(format!("{}  key {k} lies outside [{low}, {high})", head()));
            }
            if j > 0 && got[j - 1].0 >= k {
                return Some(format!(
                    "{}  keys out of order: {} then {k}",
                    head(),
                    got[j - 1].0
                ));
            }
        }

        None
    }

    /// S2, S3: every entry could be current during the scan.
    fn entries(
        &self,
        events: &[Event],
        initial: &BTreeMap<u64, u64>,
        indexes: &BTreeMap<u64, WriteIndex>,
    ) -> Option<String> {
        let (got, from, until, head) = (self.got, self.from, self.until, self.head);
        for &(k, v) in got {
            let untouched;
            let index = match indexes.get(&k) {
                Some(index) => index,
                None => {
                    // No point operation on k: only the initial map speaks for it.
                    untouched = WriteIndex {
                        initial: initial.get(&k).copied(),
                        ..WriteIndex::default()
                    };
                    &untouched
                }
            };
            if !index.could_be_present(from, until) {
                return Some(format!(
                    "{}  returned key {k}, which was certainly absent throughout the scan",
                    head()
                ));
            }
            if let Err(why) = index.could_be(Some(v), from, until) {
                let mut s = format!(
                    "{}  returned ({k}, {v}), but key {k} could not hold {v} during the scan:\n",
                    head()
                );
                explain_no_source(&mut s, events, why, Some(v), index.initial);
                return Some(s);
            }
        }

        None
    }

    /// S4: nothing certainly present throughout the scan is missing from
    /// the range it covered.
    fn missing(
        &self,
        events: &[Event],
        initial: &BTreeMap<u64, u64>,
        indexes: &BTreeMap<u64, WriteIndex>,
    ) -> Option<String> {
        let (low, high, limit, got) = (self.low, self.high, self.limit, self.got);
        let (from, until, head) = (self.from, self.until, self.head);
        if limit == 0 {
            return None;
        }
        let end = if got.len() < limit {
            high
        } else {
            match got.last() {
                Some(&(k, _)) => k.saturating_add(1).min(high),
                None => return None,
            }
        };
        if low >= end {
            return None;
        }
        let returned: BTreeSet<u64> = got.iter().map(|&(k, _)| k).collect();
        let touched = indexes.range(low..end).map(|(&k, _)| k);
        let untouched = initial
            .range(low..end)
            .map(|(&k, _)| k)
            .filter(|k| !indexes.contains_key(k));
        for k in touched.chain(untouched) {
            if returned.contains(&k) {
                continue;
            }
            let witness = match indexes.get(&k) {
                Some(index) => index.certainly_present(from, until),
                None => Some(None), // in the initial map and never touched
            };
            if let Some(w) = witness {
                let since = match w {
                    Some(w) => format!("since {}", show(w.ev, &events[w.ev])),
                    None => "since the initial load".to_string(),
                };
                return Some(format!(
                "{}  missed key {k}, which was present throughout the scan ({since}; no delete of it could fall inside the scan){}",
                head(),
                if got.len() == limit {
                    format!(" and is below its last key {}", got.last().map_or(0, |p| p.0))
                } else {
                    String::new()
                }
            ));
            }
        }
        None
    }
}

// ---------------------------------------------------------------------------
// The per-key linearizability search.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Completed gets only; pending ones constrain nothing.
    Get(Option<u64>),
    Put(u64),
    /// `Some(present)` when the delete reported it.
    Delete(Option<bool>),
}

#[derive(Clone, Copy, Debug)]
struct KeyOp {
    ev: usize,
    invoked: Stamp,
    /// `NEVER` for a pending operation (only its `done` flag tells).
    completed: Stamp,
    done: bool,
    kind: Kind,
}

/// One key's operations sorted by invocation, pending gets dropped.
fn key_ops(events: &[Event], evs: &[usize]) -> Vec<KeyOp> {
    let mut ops = Vec::with_capacity(evs.len());
    for &i in evs {
        let e = &events[i];
        let done = !e.is_pending();
        let kind = match (&e.op, &e.ret) {
            (Op::Get(_), Ret::Get(r)) if done => Kind::Get(*r),
            (Op::Get(_), _) => continue,
            (Op::Put(_, v), _) => Kind::Put(*v),
            (Op::Delete(_), Ret::Delete(r)) if done => Kind::Delete(*r),
            (Op::Delete(_), _) => Kind::Delete(None),
            (Op::Scan { .. }, _) => continue,
        };
        ops.push(KeyOp {
            ev: i,
            invoked: invoked_at(e),
            completed: completed_at(e),
            done,
            kind,
        });
    }
    ops.sort_by_key(|o| (o.invoked, o.completed, o.ev));
    ops
}

/// Register values numbered densely per key; absence is 0.
type Val = u32;
const ABSENT: Val = 0;
const NO_VAL: Val = Val::MAX;

/// How far the search got: reported with a violation or an exhausted budget.
#[derive(Clone, Debug, Default)]
struct Deepest {
    /// Completed operations linearized, and how many there are.
    done: usize,
    total: usize,
    /// The last operations of that prefix, with the value after each.
    tail: Vec<(usize, Option<u64>)>,
    state: Option<u64>,
    /// The earliest-completing operation left over.
    blocker: Option<usize>,
}

enum Outcome {
    Linearizable,
    Stuck(Deepest),
    OutOfBudget(Deepest),
}

enum Enter {
    Success,
    Dead,
    Pushed,
    OutOfBudget,
}

struct Frame {
    /// Path length before this node's forced operations.
    forced_from: usize,
    /// Register value at this node (forced operations keep it).
    state: Val,
    /// This node's candidates: `cands[next..hi]` are still to try.
    lo: usize,
    next: usize,
    hi: usize,
}

/// Explored nodes (all failed), by a 128-bit hash of (linearized set,
/// value); with tracked pending operations, also the set of them that was
/// available.
enum Memo {
    Exact(HashSet<u128, BuildHasherDefault<PassThrough>>),
    Dominance(HashMap<u128, Vec<u64>, BuildHasherDefault<PassThrough>>),
}

/// Hashes that are already random (Zobrist sums): use the low word as is.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u128(&mut self, x: u128) {
        self.0 = x as u64;
    }
}

const TAIL: usize = 6;

/// Dancing links (Knuth): doubly linked lists over the operations, with a
/// sentinel per list after them. A removed element keeps its own links, so
/// removals undone in reverse order restore the lists, each step in O(1).
struct Links {
    next: Vec<usize>,
    prev: Vec<usize>,
    n: usize,
}

impl Links {
    /// One list per entry of `lists`, holding those elements in that order;
    /// elements in none must never be removed.
    fn new(n: usize, lists: &[Vec<usize>]) -> Links {
        let mut next = vec![usize::MAX; n + lists.len()];
        let mut prev = next.clone();
        for (l, members) in lists.iter().enumerate() {
            let head = n + l;
            let mut p = head;
            for &i in members {
                next[p] = i;
                prev[i] = p;
                p = i;
            }
            next[p] = head;
            prev[head] = p;
        }
        Links { next, prev, n }
    }

    fn first(&self, list: usize) -> Option<usize> {
        self.after(self.n + list)
    }

    /// The element after `i` (still right for `i` itself removed).
    fn after(&self, i: usize) -> Option<usize> {
        self.next.get(i).copied().filter(|&j| j < self.n)
    }

    fn remove(&mut self, i: usize) {
        let (p, n) = (self.prev[i], self.next[i]);
        self.next[p] = n;
        self.prev[n] = p;
    }

    fn restore(&mut self, i: usize) {
        let (p, n) = (self.prev[i], self.next[i]);
        self.next[p] = i;
        self.prev[n] = i;
    }
}

struct Search<'a> {
    ops: &'a [KeyOp],
    /// Per operation, the value it reads — a get, or a delete that found
    /// the key absent — or `NO_VAL`.
    read: Vec<Val>,
    /// Per operation, the value it writes, or `NO_VAL`.
    write: Vec<Val>,
    /// Per operation, whether it may only go where the key is present (a
    /// delete that found it).
    needs_present: Vec<bool>,
    values: Vec<Option<u64>>,
    /// Unlinearized operations: all by invocation, completed ones by
    /// completion, and per value its writes by invocation and its reads by
    /// completion.
    by_inv: Links,
    by_cmp: Links,
    writers: Links,
    readers: Links,
    /// Values that are *starved*: a read of the value remains but no
    /// unplaced write of it was invoked before that read completed. Such a
    /// node is dead, because every remaining read needs a write of its
    /// value still to come. For a read of another value that is plain. A
    /// read of the current value is not a candidate (it would have been
    /// placed), so the earliest-completing unplaced operation must go
    /// before it; that one is a write, or a read of another value that
    /// needs a write, and unless that write is itself of this value, the
    /// value changes first.
    starved: u32,
    /// Off only to find a longer prefix for a violation's report.
    prune_starved: bool,
    /// Scratch: values of pending writes already among a node's candidates.
    pending_seen: Vec<Val>,
    budget: u64,
    nodes: u64,
    /// Zobrist keys: the linearized set's hash is the xor of its members'
    /// (pending operations tracked in `avail` excepted).
    zobrist: Vec<u128>,
    set_hash: u128,
    /// Up to 64 pending operations get a bit each; `avail` holds those
    /// not linearized. More of them available can only help (any may be
    /// left out), so a failed node also fails with fewer available.
    pending_bit: Vec<u64>,
    avail: u64,
    memo: Memo,
    /// Linearized operations in order, with the value after each (`lift`
    /// records the current value, so set it first).
    path: Vec<(usize, Val)>,
    state: Val,
    /// Completed operations not yet linearized.
    remaining: usize,
    total_done: usize,
    frames: Vec<Frame>,
    cands: Vec<usize>,
    wanted: Vec<Val>,
    deepest: Deepest,
}

/// SplitMix64's output function (Steele, Lea, Flood 2014).
fn splitmix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Murmur3's 64-bit finalizer: a second, unrelated mixer for values, so
/// that no value's hash is tied to an operation's Zobrist key.
fn fmix(mut z: u64) -> u64 {
    z = (z ^ (z >> 33)).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    z = (z ^ (z >> 33)).wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    z ^ (z >> 33)
}

/// Zobrist key of operation `i`: two words of a SplitMix64 stream.
fn zobrist(i: u64) -> u128 {
    const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
    let at = |j: u64| splitmix(j.wrapping_add(1).wrapping_mul(GAMMA));
    (u128::from(at(2 * i)) << 64) | u128::from(at(2 * i + 1))
}

/// The register value's share of a memo key.
fn state_hash(v: Val) -> u128 {
    let a = fmix(u64::from(v) ^ 0x6A09_E667_F3BC_C908);
    let b = fmix(a ^ 0x3C6E_F372_FE94_F82B);
    (u128::from(a) << 64) | u128::from(b)
}

impl<'a> Search<'a> {
    fn new(ops: &'a [KeyOp], initial: Option<u64>, budget: u64) -> Search<'a> {
        let n = ops.len();
        let mut values = vec![None];
        let mut ids: HashMap<Option<u64>, Val> = HashMap::from([(None, ABSENT)]);
        let mut id = |v: Option<u64>| {
            *ids.entry(v).or_insert_with(|| {
                values.push(v);
                (values.len() - 1) as Val
            })
        };
        let state = id(initial);
        let (mut read, mut write) = (vec![NO_VAL; n], vec![NO_VAL; n]);
        for (i, o) in ops.iter().enumerate() {
            match o.kind {
                Kind::Get(r) => read[i] = id(r),
                Kind::Delete(Some(false)) => read[i] = ABSENT,
                Kind::Delete(_) => write[i] = ABSENT,
                Kind::Put(v) => write[i] = id(Some(v)),
            }
        }
        let needs_present = ops
            .iter()
            .map(|o| o.kind == Kind::Delete(Some(true)))
            .collect();

        // `ops` is in invocation order already.
        let by_inv = Links::new(n, &[(0..n).collect()]);
        let mut done: Vec<usize> = (0..n).filter(|&i| ops[i].done).collect();
        done.sort_by_key(|&i| (ops[i].completed, i));
        let total_done = done.len();
        let by_cmp = Links::new(n, &[done]);
        let mut writes = vec![Vec::new(); values.len()];
        let mut reads = vec![Vec::new(); values.len()];
        for i in 0..n {
            if let Some(w) = writes.get_mut(write[i] as usize) {
                w.push(i);
            }
            if let Some(r) = reads.get_mut(read[i] as usize) {
                r.push(i);
            }
        }
        for r in &mut reads {
            r.sort_by_key(|&i| (ops[i].completed, i));
        }
        let mut pending_bit = vec![0u64; n];
        for (bit, i) in (0..n).filter(|&i| !ops[i].done).take(64).enumerate() {
            pending_bit[i] = 1 << bit;
        }
        let mut search = Search {
            ops,
            read,
            write,
            needs_present,
            by_inv,
            by_cmp,
            writers: Links::new(n, &writes),
            readers: Links::new(n, &reads),
            starved: 0,
            prune_starved: true,
            pending_seen: Vec::new(),
            budget,
            nodes: 0,
            zobrist: (0..n as u64).map(zobrist).collect(),
            set_hash: 0,
            avail: pending_bit.iter().fold(0, |a, b| a | b),
            memo: if pending_bit.iter().any(|&b| b != 0) {
                Memo::Dominance(HashMap::default())
            } else {
                Memo::Exact(HashSet::default())
            },
            pending_bit,
            path: Vec::with_capacity(n),
            state,
            remaining: total_done,
            total_done,
            frames: Vec::new(),
            cands: Vec::new(),
            wanted: Vec::new(),
            deepest: Deepest {
                total: total_done,
                state: initial,
                ..Deepest::default()
            },
            values,
        };
        search.starved = (0..search.values.len() as Val)
            .filter(|&v| search.starving(v))
            .count() as u32;
        search
    }

    /// The earliest completion among unlinearized completed operations:
    /// nothing invoked after it may linearize next.
    fn horizon(&self) -> Stamp {
        self.by_cmp
            .first(0)
            .map_or(NEVER, |i| self.ops[i].completed)
    }

    fn value(&self, v: Val) -> Option<u64> {
        self.values.get(v as usize).copied().flatten()
    }

    /// The value after write `i` in value `s`, if `i` is a write allowed
    /// there. A write may leave the value unchanged here (a put of the
    /// current value) and still change it elsewhere, so writes are always
    /// branched on, never forced.
    fn after_write(&self, i: usize, s: Val) -> Option<Val> {
        let w = self.write[i];
        (w != NO_VAL && !(self.needs_present[i] && s == ABSENT)).then_some(w)
    }

    fn starving(&self, v: Val) -> bool {
        let Some(r) = self.readers.first(v as usize) else {
            return false;
        };
        self.writers
            .first(v as usize)
            .is_none_or(|w| self.ops[w].invoked > self.ops[r].completed)
    }

    fn lift(&mut self, i: usize) {
        self.by_inv.remove(i);
        if self.ops[i].done {
            self.by_cmp.remove(i);
            self.remaining -= 1;
        }
        let (r, w) = (self.read[i], self.write[i]);
        if r != NO_VAL {
            let was = self.starving(r);
            self.readers.remove(i);
            self.starved = self.starved + u32::from(self.starving(r)) - u32::from(was);
        }
        if w != NO_VAL {
            let was = self.starving(w);
            self.writers.remove(i);
            self.starved = self.starved + u32::from(self.starving(w)) - u32::from(was);
        }
        if self.pending_bit[i] == 0 {
            self.set_hash ^= self.zobrist[i];
        }
        self.avail &= !self.pending_bit[i];
        self.path.push((i, self.state));
    }

    /// Undoes the last `lift` (they must be undone in reverse order).
    fn unlift(&mut self) {
        let Some((i, _)) = self.path.pop() else {
            return;
        };
        let (r, w) = (self.read[i], self.write[i]);
        if w != NO_VAL {
            let was = self.starving(w);
            self.writers.restore(i);
            self.starved = self.starved + u32::from(self.starving(w)) - u32::from(was);
        }
        if r != NO_VAL {
            let was = self.starving(r);
            self.readers.restore(i);
            self.starved = self.starved + u32::from(self.starving(r)) - u32::from(was);
        }
        if self.ops[i].done {
            self.by_cmp.restore(i);
            self.remaining += 1;
        }
        self.by_inv.restore(i);
        if self.pending_bit[i] == 0 {
            self.set_hash ^= self.zobrist[i];
        }
        self.avail |= self.pending_bit[i];
    }

    /// Linearizes every candidate read that fits the current value. In any
    /// linearization from here such a read can move up to now (it was a
    /// candidate, so nothing must precede it; it changes nothing, so what it
    /// jumps over is unaffected), so this loses nothing. Lifting one can
    /// only move the horizon later, so one pass sees every candidate.
    fn settle(&mut self) {
        let mut j = self.by_inv.first(0);
        while let Some(i) = j {
            if self.ops[i].invoked > self.horizon() {
                break;
            }
            j = self.by_inv.after(i);
            if self.read[i] == self.state {
                self.lift(i);
            }
        }
    }

    fn enter(&mut self) -> Enter {
        let forced_from = self.path.len();
        self.settle();
        if self.remaining == 0 {
            return Enter::Success;
        }
        let done = self.total_done - self.remaining;
        if done > self.deepest.done || self.deepest.blocker.is_none() {
            let from = self.path.len().saturating_sub(TAIL);
            self.deepest.done = done;
            self.deepest.tail = self.path[from..]
                .iter()
                .map(|&(i, v)| (i, self.value(v)))
                .collect();
            self.deepest.state = self.value(self.state);
            self.deepest.blocker = self.by_cmp.first(0);
        }
        self.nodes += 1;
        if self.nodes > self.budget {
            return Enter::OutOfBudget;
        }
        if (self.prune_starved && self.starved > 0) || !self.first_visit() {
            self.undo_to(forced_from);
            return Enter::Dead;
        }

        // Candidates are the writes allowed here; the reads that do not fit
        // say which values are wanted next, and writes of those go first.
        // A pending write need not happen at all, so it is branched on only
        // where some linearization could need it here:
        // - not if it writes the current value (dropping it changes nothing);
        // - one per value: pending candidates have no deadline and were all
        //   invoked before anything unplaced completed, so they can swap;
        // - one whose value nobody still reads is followed, wherever it
        //   goes, by a write (it has no horizon, so that write is a candidate
        //   here too) or by nothing. That write ignores the value unless it is
        //   a delete that must find the key: so such a pending delete never
        //   matters, and such a put (any one) only while the key is absent
        //   and that kind of delete is a candidate.
        let lo = self.cands.len();
        self.wanted.clear();
        self.pending_seen.clear();
        let (mut blind_put, mut must_find) = (None, false);
        let horizon = self.horizon();
        let mut j = self.by_inv.first(0);
        while let Some(i) = j.filter(|&i| self.ops[i].invoked <= horizon) {
            j = self.by_inv.after(i);
            if self.read[i] != NO_VAL {
                self.wanted.push(self.read[i]);
            }
            must_find |= self.needs_present[i];
            let w = self.write[i];
            if self.after_write(i, self.state).is_none() {
                continue;
            }
            if self.ops[i].done {
                self.cands.push(i);
            } else if w == self.state || self.pending_seen.contains(&w) {
                // A no-op here, or the same as a pending write already taken.
            } else if self.readers.first(w as usize).is_some() {
                self.pending_seen.push(w);
                self.cands.push(i);
            } else if w != ABSENT && blind_put.is_none() {
                blind_put = Some(i);
            }
        }
        if let (Some(i), true, true) = (blind_put, must_find, self.state == ABSENT) {
            self.cands.push(i);
        }
        if self.cands.len() == lo {
            self.undo_to(forced_from);
            return Enter::Dead;
        }
        let (ops, write, wanted) = (self.ops, &self.write, &self.wanted);
        self.cands[lo..].sort_by_key(|&c| {
            let o = &ops[c];
            (!o.done, !wanted.contains(&write[c]), o.completed, c)
        });
        let hi = self.cands.len();
        self.frames.push(Frame {
            forced_from,
            state: self.state,
            lo,
            next: lo,
            hi,
        });
        Enter::Pushed
    }

    /// Records this node in the memo; false if it (or one it is no better
    /// than) was explored already — and so failed, since success ends the
    /// search.
    fn first_visit(&mut self) -> bool {
        let key = self.set_hash ^ state_hash(self.state);
        let avail = self.avail;
        match &mut self.memo {
            Memo::Exact(set) => set.insert(key),
            Memo::Dominance(map) => match map.entry(key) {
                Entry::Vacant(e) => {
                    e.insert(vec![avail]);
                    true
                }
                Entry::Occupied(mut e) => {
                    let failed = e.get_mut();
                    if failed.iter().any(|&f| f & avail == avail) {
                        return false;
                    }
                    // Keep the failed sets an antichain.
                    failed.retain(|&f| f & avail != f);
                    failed.push(avail);
                    true
                }
            },
        }
    }

    fn undo_to(&mut self, len: usize) {
        while self.path.len() > len {
            self.unlift();
        }
    }

    fn run(mut self) -> Outcome {
        match self.enter() {
            Enter::Success => return Outcome::Linearizable,
            Enter::OutOfBudget => return Outcome::OutOfBudget(self.deepest),
            Enter::Dead | Enter::Pushed => {}
        }
        while let Some(top) = self.frames.last_mut() {
            if top.next < top.hi {
                let c = self.cands[top.next];
                top.next += 1;
                let before = top.state;
                let Some(after) = self.after_write(c, before) else {
                    continue; // unreachable: candidates are allowed writes
                };
                self.state = after;
                self.lift(c);
                match self.enter() {
                    Enter::Success => return Outcome::Linearizable,
                    Enter::OutOfBudget => return Outcome::OutOfBudget(self.deepest),
                    Enter::Pushed => {}
                    Enter::Dead => {
                        self.unlift();
                        self.state = before;
                    }
                }
            } else {
                let (forced_from, lo) = (top.forced_from, top.lo);
                self.frames.pop();
                self.cands.truncate(lo);
                self.undo_to(forced_from);
                if let Some(parent) = self.frames.last() {
                    // Undo the operation that led from the parent here.
                    let s = parent.state;
                    self.unlift();
                    self.state = s;
                }
            }
        }
        Outcome::Stuck(self.deepest)
    }
}

impl Deepest {
    /// The key, what happened to its `ops`, the longest linearizable
    /// prefix found, where it stuck, and the operations around that point.
    fn report(&self, key: u64, events: &[Event], ops: &[KeyOp], what: &str) -> String {
        let mut s = format!(
            "key {key}: {} point operations; {what}; the longest linearizable prefix found holds {} of the {} completed ones",
            ops.len(),
            self.done,
            self.total
        );
        if self.tail.is_empty() {
            s.push_str(" and starts from the initial value.\n");
        } else {
            s.push_str(" and ends:\n");
            for &(i, after) in &self.tail {
                let o = &ops[i];
                let _ = writeln!(
                    s,
                    "    {}   value then: {}",
                    show(o.ev, &events[o.ev]),
                    show_value(after)
                );
            }
        }
        let Some(b) = self.blocker.and_then(|b| ops.get(b)) else {
            return s;
        };
        let _ = writeln!(
            s,
            "  from value {}, no order found of the operations that may go next lets this one through:\n    {}",
            show_value(self.state),
            show(b.ev, &events[b.ev])
        );
        // The window: from the start of that prefix's tail to the blocker's completion.
        let t0 = self
            .tail
            .iter()
            .map(|&(i, _)| ops[i].invoked)
            .min()
            .unwrap_or(b.invoked)
            .min(b.invoked);
        let t1 = b.completed;
        let window: Vec<&KeyOp> = ops
            .iter()
            .filter(|o| o.invoked <= t1 && (o.completed >= t0 || !o.done))
            .collect();
        let _ = writeln!(
            s,
            "  operations on key {key} overlapping [{}, {}] ns, by invocation ({}):",
            ns_of(t0),
            ns_of(t1),
            window.len()
        );
        const SHOWN: usize = 40;
        for o in window.iter().take(SHOWN) {
            let _ = writeln!(s, "    {}", show(o.ev, &events[o.ev]));
        }
        if window.len() > SHOWN {
            let _ = writeln!(s, "    … {} more", window.len() - SHOWN);
        }
        s
    }
}

// ---------------------------------------------------------------------------
// Formatting for reports.

fn show_value(s: Option<u64>) -> String {
    match s {
        Some(v) => v.to_string(),
        None => "absent".to_string(),
    }
}

/// `#12 c3 put(5, 77) -> ok [1200, 1350]`.
fn show(i: usize, e: &Event) -> String {
    let op = match &e.op {
        Op::Get(k) => format!("get({k})"),
        Op::Put(k, v) => format!("put({k}, {v})"),
        Op::Delete(k) => format!("delete({k})"),
        Op::Scan { low, high, limit } => format!("scan([{low}, {high}), limit {limit})"),
    };
    let ret = match &e.ret {
        Ret::Get(v) => show_value(*v),
        Ret::Put | Ret::Delete(None) => "ok".to_string(),
        Ret::Delete(Some(b)) => b.to_string(),
        Ret::Scan(r) => {
            let shown: Vec<String> = r
                .iter()
                .take(12)
                .map(|(k, v)| format!("({k}, {v})"))
                .collect();
            format!(
                "[{}{}]",
                shown.join(", "),
                if r.len() > 12 { ", …" } else { "" }
            )
        }
        Ret::Unknown => "unknown".to_string(),
    };
    let when = match (e.is_pending(), e.complete_ns) {
        (false, Some(c)) => format!("[{}, {c}]", e.invoke_ns),
        (true, Some(c)) => format!("[{}, pending; failed at {c})", e.invoke_ns),
        (_, None) => format!("[{}, pending)", e.invoke_ns),
    };
    format!("#{i} c{} {op} -> {ret} {when}", e.client)
}
