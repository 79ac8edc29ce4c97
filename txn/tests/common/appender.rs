//! List appends for fault tests: every client records its transactions
//! into one history shared by all, as they happen, so that a crashed
//! machine's clients' part is there too (the transaction in flight as an
//! invocation alone, closed as info at the end); the history is checked
//! for strict serializability by adya, and every list's replicas are
//! compared with its primary's copy.

use adya::{History as AdyaHistory, Opts, Valid, Workload};
use nicdrv::rng::Rng;
use nicdrv::{Ctx, Nic};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use txn::coord::Trap;
use txn::harness::{Client, Report};
use txn::history::{History, Kind, Mop};
use txn::object::object_bytes;
use txn::regions::RegionMap;
use txn::workload::{list_bytes, list_of, Mix, LIST_BYTES, LIST_CAP};
use txn::{Geometry, TxError};

/// Events of every client: (time, process, kind, micro-operations).
pub type Shared = Arc<Mutex<Vec<(u64, u64, Kind, Vec<Mop>)>>>;

pub const APPEND_KEYS: u64 = 30;

/// The failure tests' cluster: 5 machines × 2 threads, 3-way replicated
/// (a majority survives two failures), one region each and a spare slot
/// for a new backup, small enough that copies take a few ms.
pub fn five_machines() -> Geometry {
    Geometry {
        machines: 5,
        threads: 2,
        f: 2,
        regions_per_machine: 1,
        spare_regions_per_machine: 1,
        region_bytes: 64 << 10,
        static_bytes: 32 << 10,
        block_bytes: 16 << 10,
        log_bytes: 64 << 10,
        reply_bytes: 4 << 10,
    }
}
const THINK_NS: u64 = 150_000;

/// One client of list appends: `txs` transactions of one to three reads
/// or appends of random keys, then (with `read_all`) one transaction
/// reading every list, so that a lost append cannot hide.
pub struct Appender {
    pub g: Geometry,
    pub seed: u64,
    pub process: u64,
    pub txs: u64,
    pub history: Shared,
    pub read_all: bool,
    /// Truncations sent as TRUNCATE records of their own after every this
    /// many transactions (0: only piggybacked, and at the end).
    pub flush_every: u64,
    /// Set on the coordinator before the first transaction.
    pub trap: Option<Trap>,
}

impl Appender {
    fn record(&self, time: u64, kind: Kind, mops: Vec<Mop>) {
        self.history
            .lock()
            .unwrap()
            .push((time, self.process, kind, mops));
    }

    /// Runs `mops` as one transaction and records it.
    async fn one<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        c: &mut txn::Coordinator,
        mops: Vec<Mop>,
    ) -> Result<(), TxError> {
        let mix = Mix::Append { keys: APPEND_KEYS };
        self.record(ctx.nic().now_ns(), Kind::Invoke, mops.clone());
        let mut tx = c.begin();
        let mut done = Vec::new();
        let body: Result<bool, TxError> = async {
            for m in &mops {
                let (key, append) = match m {
                    Mop::Read { key, .. } => (*key, None),
                    Mop::Append { key, value } => (*key, Some(*value)),
                };
                let at = mix.at(&self.g, key, 0);
                let mut l = list_of(&c.read(ctx, &mut tx, at, LIST_BYTES).await?)?;
                match append {
                    None => done.push(Mop::Read { key, seen: Some(l) }),
                    Some(_) if l.len() == LIST_CAP => return Ok(false),
                    Some(v) => {
                        l.push(v);
                        tx.write(at, &list_bytes(&l))?;
                        done.push(m.clone());
                    }
                }
            }
            Ok(true)
        }
        .await;
        let outcome = match body {
            Ok(true) => c.commit(ctx, tx).await,
            Ok(false) => Ok(txn::Outcome::Aborted(txn::Abort::Busy)),
            Err(e) => Err(e),
        };
        let now = ctx.nic().now_ns();
        match outcome {
            Ok(txn::Outcome::Committed) => self.record(now, Kind::Ok, done),
            // Certainly not committed: an abort (recovery's among them),
            // or a read that could not go on.
            Ok(txn::Outcome::Aborted(_)) | Err(TxError::Aborted(_)) => {
                self.record(now, Kind::Fail, mops)
            }
            Err(e) => {
                self.record(now, Kind::Info, mops);
                return Err(e);
            }
        }
        Ok(())
    }
}

impl<N: Nic> Client<N> for Appender {
    type Out = ();
    async fn run(mut self, ctx: &Ctx<N>, c: &mut txn::Coordinator) -> Result<(), TxError> {
        c.set_trap(self.trap.take());
        let mut rng = Rng::new(self.seed);
        let mut next = 0u64;
        for i in 0..self.txs {
            let mops = random_mops(&mut rng, 3, APPEND_KEYS, self.process, &mut next);
            self.one(ctx, c, mops).await?;
            if self.flush_every > 0 && (i + 1) % self.flush_every == 0 {
                c.flush(ctx).await?;
            }
            ctx.sleep(THINK_NS)?.await;
        }
        if self.read_all {
            let all = (0..APPEND_KEYS)
                .map(|key| Mop::Read { key, seen: None })
                .collect();
            self.one(ctx, c, all).await?;
        }
        Ok(())
    }
}

/// One to `most` reads or appends of keys below `keys`, each append's
/// value unique: process `process`'s `next` counter, counted on.
pub fn random_mops(rng: &mut Rng, most: u64, keys: u64, process: u64, next: &mut u64) -> Vec<Mop> {
    (0..1 + rng.below(most))
        .map(|_| {
            let key = rng.below(keys);
            if rng.below(2) == 0 {
                Mop::Read { key, seen: None }
            } else {
                *next += 1;
                Mop::Append {
                    key,
                    value: process << 32 | *next,
                }
            }
        })
        .collect()
}

/// Every event in time order (a completion before an invocation of the
/// same instant), each process's unfinished transaction closed as info at
/// the end.
pub fn merged(events: Vec<(u64, u64, Kind, Vec<Mop>)>) -> History {
    let mut all: Vec<_> = events
        .into_iter()
        .map(|(t, p, k, m)| (t, u8::from(k == Kind::Invoke), p, k, m))
        .collect();
    all.sort_by_key(|e| (e.0, e.1, e.2));
    let end = all.last().map_or(0, |e| e.0) + 1;
    let mut open: BTreeMap<u64, Vec<Mop>> = BTreeMap::new();
    let mut h = History::default();
    for (t, _, p, k, mops) in all {
        if k == Kind::Invoke {
            open.insert(p, mops.clone());
        } else {
            open.remove(&p);
        }
        h.push(k, p, t, mops);
    }
    for (p, mops) in open {
        h.push(Kind::Info, p, end, mops);
    }
    h
}

/// The shared history, merged and checked by adya: strict serializable,
/// or the test fails with the anomalies and the history.
pub fn assert_strict_serializable(seed: u64, history: &Shared) -> History {
    let h = merged(std::mem::take(&mut *history.lock().unwrap()));
    let parsed = AdyaHistory::from_json(&h.to_json_lines()).expect("our lines parse");
    let v = adya::check(&parsed, Workload::ListAppend, &Opts::default());
    if v.valid != Valid::True {
        if let Ok(dir) = std::env::var("LOCH_HISTORY_DIR") {
            let _ = std::fs::write(format!("{dir}/history-{seed}.jsonl"), h.to_json_lines());
        }
    }
    assert_eq!(
        v.valid,
        Valid::True,
        "seed {seed}: not strict serializable: {:?}\n{:#?}",
        v.anomaly_types,
        v.anomalies
    );
    h
}

/// Every append reported committed is in its list as the run left it, on
/// the list's primary by `map` (lists only grow). A checker of the
/// history alone cannot tell this: an append that no read saw has no
/// place in any list's order, so its loss is no cycle.
pub fn assert_no_commit_lost<O>(
    seed: u64,
    g: &Geometry,
    r: &Report<O>,
    map: &RegionMap,
    history: &Shared,
) {
    let mix = Mix::Append { keys: APPEND_KEYS };
    let mut lists = BTreeMap::new();
    for key in 0..APPEND_KEYS {
        let at = mix.at(g, key, 0);
        let n = object_bytes(LIST_BYTES);
        let p = map.on_primary(at, n as u64).unwrap();
        let bytes = &r.memory[p.node() as usize][p.offset() as usize..][..n];
        let mut payload = vec![0; LIST_BYTES];
        let header = txn::object::decode(bytes, &mut payload).unwrap();
        assert!(
            header.is_ok(),
            "seed {seed}: list {key} is torn: {header:?} at {p:?}"
        );
        lists.insert(key, list_of(&payload).unwrap());
    }
    for (t, p, kind, mops) in history.lock().unwrap().iter() {
        if *kind != Kind::Ok {
            continue;
        }
        for m in mops {
            if let Mop::Append { key, value } = m {
                assert!(
                    lists[key].contains(value),
                    "seed {seed}: process {p}'s append of {value} to list {key}, \
                     committed at {t} ns, is lost: {:?}",
                    lists[key]
                );
            }
        }
    }
}

/// Every list's backups hold its primary's bytes, by `map`.
pub fn assert_replicas_agree<O>(seed: u64, g: &Geometry, r: &Report<O>, map: &RegionMap) {
    let mix = Mix::Append { keys: APPEND_KEYS };
    for (at, len) in mix.objects(g) {
        let n = object_bytes(len);
        let p = map.on_primary(at, n as u64).unwrap();
        let want = &r.memory[p.node() as usize][p.offset() as usize..][..n];
        for b in map.on_backups(at, n as u64).unwrap() {
            assert_eq!(
                &r.memory[b.node() as usize][b.offset() as usize..][..n],
                want,
                "seed {seed}: list {at:?} on backup {}",
                b.node()
            );
        }
    }
}
