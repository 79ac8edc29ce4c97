//! FaRM's commit, end to end, on the simulator (over seeds) and on emu
//! (threads over real shared memory): its exact cost in one-sided verbs,
//! a bank whose invariant must hold under contention, list-append
//! histories checked for strict serializability by `adya`, backup
//! copies equal to their primaries once truncated, and a reply ring's
//! head counted as told only once its server heard it.

mod common;

use adya::{check, History as AdyaHistory, Opts, Valid, Workload};
use nicdrv::rng::Rng;
use nicdrv::sim::{for_each_seed, FaultKind, SimModel, SimNic};
use nicdrv::{Ctx, GlobalAddr, Nic, NodeId};
use std::cell::Cell;
use std::collections::BTreeMap;
use txn::coord::{Step, TrapPoint};
use txn::harness::{run_sim, Client, Report};
use txn::history::{History, Kind, Mop};
use txn::object::{decode, object_bytes};
use txn::{Abort, Coordinator, Geometry, ObjAddr, Outcome, TxError};

fn geo(machines: u16, threads: u16, f: usize) -> Geometry {
    Geometry {
        machines,
        threads,
        f,
        regions_per_machine: 1,
        spare_regions_per_machine: 0,
        region_bytes: 64 << 10,
        static_bytes: 64 << 10,
        block_bytes: 1 << 20,
        log_bytes: 64 << 10,
        reply_bytes: 4 << 10,
    }
}

use common::run_emu;

fn sim<C: Client<nicdrv::sim::SimNic>>(
    g: Geometry,
    seed: u64,
    client: impl FnMut(u16, u16) -> C,
) -> Report<C::Out> {
    run_sim(g, seed, SimModel::default(), client).unwrap().0
}

/// The primary's copy of every object equals each backup's, byte for
/// byte, once every truncation is applied.
fn backups_equal_primaries<O>(g: Geometry, r: &Report<O>, objects: &[(ObjAddr, usize)]) {
    let map = g.region_map().unwrap();
    for &(at, len) in objects {
        let n = object_bytes(len);
        let p = map.on_primary(at, n as u64).unwrap();
        let want = &r.memory[p.node() as usize][p.offset() as usize..][..n];
        for b in map.on_backups(at, n as u64).unwrap() {
            let got = &r.memory[b.node() as usize][b.offset() as usize..][..n];
            assert_eq!(got, want, "object {at:?}: backup on {} differs", b.node());
        }
    }
}

/// An object's value in the run's final memory (its primary's copy).
fn final_value<O>(g: Geometry, r: &Report<O>, at: ObjAddr, len: usize) -> Vec<u8> {
    let map = g.region_map().unwrap();
    let n = object_bytes(len);
    let p = map.on_primary(at, n as u64).unwrap();
    let bytes = &r.memory[p.node() as usize][p.offset() as usize..][..n];
    let mut out = vec![0u8; len];
    decode(bytes, &mut out)
        .unwrap()
        .expect("a consistent, unlocked copy");
    out
}

fn no_errors<O>(r: &Report<O>) {
    if let Some(e) = r.first_error() {
        panic!("a task failed: {e}");
    }
}

// ---------------------------------------------------------------------
// The cost of a commit.

/// Commits that each read four objects on four primaries and write two of
/// them (Pw = 2 written primaries whose backups are distinct machines, Pr
/// = 2 primaries read only), one at a time.
struct Costs {
    n: u64,
    active: bool,
}

const X: ObjAddr = ObjAddr {
    region: 0,
    offset: 0,
};
const Y: ObjAddr = ObjAddr {
    region: 3,
    offset: 0,
};
const Z: ObjAddr = ObjAddr {
    region: 1,
    offset: 0,
};
const W: ObjAddr = ObjAddr {
    region: 4,
    offset: 64,
};

/// Per commit: (WRITEs, READs) the coordinator's task posted.
type Deltas = Vec<(u64, u64)>;

impl<N: Nic> Client<N> for Costs {
    type Out = Deltas;
    async fn run(self, ctx: &Ctx<N>, c: &mut Coordinator) -> Result<Deltas, TxError> {
        let mut out = Vec::new();
        if !self.active {
            return Ok(out);
        }
        for i in 1..=self.n {
            let mut tx = c.begin();
            for at in [X, Y, Z, W] {
                let v = u64::from_le_bytes(c.read(ctx, &mut tx, at, 8).await?.try_into().unwrap());
                if at == X || at == Y {
                    assert_eq!(v, i - 1, "the last commit's value");
                    tx.write(at, &i.to_le_bytes())?;
                }
            }
            let before = ctx.counters();
            assert_eq!(c.commit(ctx, tx).await?, Outcome::Committed);
            let d = ctx.counters() - before;
            out.push((d.writes, d.reads));
        }
        Ok(out)
    }
}

fn commit_costs(g: Geometry, r: &Report<Deltas>, n: u64, exact_reads: bool) {
    no_errors(r);
    let (pw, pr, f) = (2u64, 2u64, g.f as u64);
    let deltas = r.clients[0].out.as_ref().unwrap();
    assert_eq!(deltas.len() as u64, n);
    for d in deltas {
        // The coordinator's share: LOCK, COMMIT-BACKUP, COMMIT-PRIMARY.
        assert_eq!(*d, (pw * (f + 2), pr), "WRITEs and READs of one commit");
    }
    let s = r.server_stats().unwrap();
    let cs = r.coord_stats();
    assert_eq!(s.head_reports, 0, "heads all went back piggybacked");
    assert_eq!(s.replies, pw * n);
    assert_eq!(cs.committed, n);
    // Summed over every task of every machine: exactly Pw(f+3) WRITEs per
    // commit, plus the TRUNCATE records of the final flush and every
    // coordinator's DONE to every machine.
    let total = r.counters();
    let m = g.machines as u64;
    assert_eq!(cs.done_records, m * m);
    assert_eq!(
        total.writes,
        n * pw * (f + 3) + cs.truncate_records + cs.done_records
    );
    assert_eq!(cs.validate_reads, n * pr, "Pr header READs a commit");
    assert_eq!(total.reads, cs.object_reads + cs.validate_reads);
    if exact_reads {
        // Nothing else runs: no object is ever found locked.
        assert_eq!(cs.object_reads, 4 * n);
    }
    assert_eq!(cs.record_writes() + s.replies, total.writes);
    assert!(cs.truncate_records > 0 && cs.truncate_records <= g.machines as u64);
    let objects: Vec<(ObjAddr, usize)> = [X, Y, Z, W].iter().map(|&a| (a, 8)).collect();
    backups_equal_primaries(g, r, &objects);
    assert_eq!(final_value(g, r, X, 8), n.to_le_bytes());
    assert_eq!(final_value(g, r, Y, 8), n.to_le_bytes());
    assert_eq!(s.applied, 2 * f * n, "every backup applied every commit");
}

#[test]
fn a_commit_costs_pw_f_plus_3_writes_and_pr_reads() {
    let g = geo(6, 1, 2);
    let n = 40;
    for_each_seed(
        "a_commit_costs_pw_f_plus_3_writes_and_pr_reads",
        5,
        |seed| {
            let r = sim(g, seed, |m, _| Costs { n, active: m == 0 });
            commit_costs(g, &r, n, true);
        },
    );
    // On emu a primary's server thread may be descheduled past the next
    // read of what it is installing: that read is retried, and counted.
    let r = run_emu(g, |m, _| Costs { n, active: m == 0 });
    commit_costs(g, &r, n, false);
}

// ---------------------------------------------------------------------
// The reply ring's head told to a server.

/// Machine `a`'s coordinator commits `x` and `y` four times; at the
/// fourth commit's validation, `a`'s posts to `p` (the primary of `x`,
/// a backup of `y`) are refused for 100 µs, so the COMMIT-BACKUP record
/// to `p`, which carries the reply ring's head past `p`'s LOCK reply, is
/// never posted. Then: the reply ring's (consumed, counted as told)
/// heads, and the head `p`'s server heard.
struct ToldHeads {
    g: Geometry,
    a: NodeId,
    p: NodeId,
    x: ObjAddr,
    y: ObjAddr,
    active: bool,
}

/// What [`ToldHeads`] saw: the reply ring's heads as `reply_heads` gives
/// them, the head the server heard, and the fourth commit's result.
#[derive(Debug)]
struct Told {
    consumed: u64,
    reported: u64,
    heard: u64,
    fourth: Result<Outcome, TxError>,
}

impl<N: Nic> Client<N> for ToldHeads {
    type Out = Option<Told>;
    async fn run(self, ctx: &Ctx<N>, c: &mut Coordinator) -> Result<Option<Told>, TxError> {
        if !self.active {
            return Ok(None);
        }
        let (a, p) = (self.a, self.p);
        let mut validated = 0;
        c.set_trap(Some(Box::new(move |t: &TrapPoint<'_>| {
            if t.step != Step::Validate {
                return;
            }
            validated += 1;
            if validated == 4 {
                let nic = t.nic.downcast_ref::<SimNic>().expect("a simulated NIC");
                let full = FaultKind::QueueFull {
                    compute: a,
                    memory: p,
                    duration_ns: 100_000,
                };
                nic.inject_after(full, 0).expect("a fault the world takes");
            }
        })));
        let mut fourth = Ok(Outcome::Committed);
        for i in 1..=4u64 {
            let mut tx = c.begin();
            for at in [self.x, self.y] {
                c.read(ctx, &mut tx, at, 8).await?;
                tx.write(at, &i.to_le_bytes())?;
            }
            let r = c.commit(ctx, tx).await;
            if i < 4 {
                assert_eq!(r?, Outcome::Committed);
            } else {
                fourth = r;
            }
        }
        ctx.sleep(200_000)?.await;
        let word = self.g.reply_ring(0, p, a).sender_head_off;
        let heard = ctx.read(GlobalAddr::host(p, word), 8).await?.u64_at(0);
        let (consumed, reported) = c.reply_heads(p);
        Ok(Some(Told {
            consumed,
            reported,
            heard,
            fourth,
        }))
    }
}

/// A reply ring's head is counted as told to its server only once the
/// server heard it: a record carrying a head that was never posted (its
/// batch refused before posting, as here) told nothing. Counted at
/// staging, the told head ran past the one the server heard, and the
/// receiver held back the report a server short of room waited for
/// (a79bf0a). This checks the count itself, since the reports a
/// coordinator makes on its reply rings no longer hinge on it: its
/// recovery query lands a newer head first, and a server short of room
/// reads the head after 50 µs.
#[test]
fn a_reply_head_counts_as_told_only_once_heard() {
    let g = geo(3, 1, 1);
    let map = g.region_map().unwrap();
    let n = object_bytes(8) as u64;
    let objects: Vec<ObjAddr> = (0..g.regions())
        .map(|region| ObjAddr { region, offset: 0 })
        .collect();
    let p = 1;
    let primary = |at: ObjAddr| map.on_primary(at, n).unwrap().node();
    let backs = |at: ObjAddr| map.backs_up(at, n, p);
    let x = *objects.iter().find(|&&at| primary(at) == p).unwrap();
    let y = *objects.iter().find(|&&at| backs(at)).unwrap();
    let a = (0..g.machines).find(|&m| m != p).unwrap();
    for_each_seed("a_reply_head_counts_as_told_only_once_heard", 4, |seed| {
        let r = sim(g, seed, |m, _| ToldHeads {
            g,
            a,
            p,
            x,
            y,
            active: m == a,
        });
        no_errors(&r);
        let t = r.clients[a as usize]
            .out
            .as_ref()
            .unwrap()
            .as_ref()
            .unwrap();
        assert!(
            t.fourth.is_err(),
            "seed {seed}: the fourth commit went: {t:?}"
        );
        assert!(
            t.consumed > t.reported,
            "seed {seed}: nothing consumed past the head told: {t:?}"
        );
        assert!(
            t.reported <= t.heard,
            "seed {seed}: a head counted as told that the server never heard: {t:?}"
        );
    });
}

// ---------------------------------------------------------------------
// A bank.

const ACCOUNTS: u64 = 18;
const START: i64 = 1000;

fn account(g: Geometry, i: u64) -> ObjAddr {
    let regions = g.regions() as u64;
    ObjAddr {
        region: (i % regions) as u32,
        offset: (i / regions) * 64,
    }
}

/// A balance as stored: the change from [`START`] (memory starts zeroed).
fn balance(b: &[u8]) -> i64 {
    START + i64::from_le_bytes(b.try_into().unwrap())
}

fn stored(balance: i64) -> [u8; 8] {
    (balance - START).to_le_bytes()
}

struct Bank {
    g: Geometry,
    seed: u64,
    transfers: u32,
}

#[derive(Debug, Default)]
struct BankOut {
    committed: u64,
    aborted: BTreeMap<Abort, u64>,
    /// The total every committed audit saw.
    audits: Vec<i64>,
}

impl<N: Nic> Client<N> for Bank {
    type Out = BankOut;
    async fn run(self, ctx: &Ctx<N>, c: &mut Coordinator) -> Result<BankOut, TxError> {
        let mut rng = Rng::new(self.seed);
        let mut out = BankOut::default();
        for i in 0..self.transfers {
            let mut tx = c.begin();
            let r = if i % 4 == 3 {
                // An audit: every account, read only.
                let mut total = 0;
                let mut res = Ok(());
                for a in 0..ACCOUNTS {
                    match c.read(ctx, &mut tx, account(self.g, a), 8).await {
                        Ok(b) => total += balance(&b),
                        Err(e) => {
                            res = Err(e);
                            break;
                        }
                    }
                }
                match res {
                    Ok(()) => {
                        let o = c.commit(ctx, tx).await?;
                        if o == Outcome::Committed {
                            out.audits.push(total);
                        }
                        Ok(o)
                    }
                    Err(e) => Err(e),
                }
            } else {
                // A transfer between two of a few hot accounts.
                let from = rng.below(6);
                let to = (from + 1 + rng.below(ACCOUNTS - 1)) % ACCOUNTS;
                let amount = 1 + rng.below(300) as i64;
                async {
                    let (fa, ta) = (account(self.g, from), account(self.g, to));
                    let fb = balance(&c.read(ctx, &mut tx, fa, 8).await?);
                    let tb = balance(&c.read(ctx, &mut tx, ta, 8).await?);
                    if fb >= amount {
                        tx.write(fa, &stored(fb - amount))?;
                        tx.write(ta, &stored(tb + amount))?;
                    }
                    c.commit(ctx, tx).await
                }
                .await
            };
            match r {
                Ok(Outcome::Committed) => out.committed += 1,
                Ok(Outcome::Aborted(a)) | Err(TxError::Aborted(a)) => {
                    *out.aborted.entry(a).or_default() += 1
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}

fn bank_holds(g: Geometry, r: &Report<BankOut>) -> (u64, u64) {
    no_errors(r);
    let total = ACCOUNTS as i64 * START;
    let (mut committed, mut aborted) = (0, 0);
    for c in &r.clients {
        let o = c.out.as_ref().unwrap();
        for &a in &o.audits {
            assert_eq!(a, total, "an audit saw money made or lost");
        }
        committed += o.committed;
        aborted += o.aborted.values().sum::<u64>();
    }
    let mut sum = 0;
    for a in 0..ACCOUNTS {
        let b = balance(&final_value(g, r, account(g, a), 8));
        assert!(b >= 0, "account {a} went negative: {b}");
        sum += b;
    }
    assert_eq!(sum, total, "the bank's total changed");
    let objects: Vec<(ObjAddr, usize)> = (0..ACCOUNTS).map(|a| (account(g, a), 8)).collect();
    backups_equal_primaries(g, r, &objects);
    (committed, aborted)
}

#[test]
fn the_bank_keeps_its_total_under_contention() {
    let g = geo(3, 2, 2);
    let (committed, aborted) = (Cell::new(0), Cell::new(0));
    for_each_seed("the_bank_keeps_its_total_under_contention", 200, |seed| {
        let r = sim(g, seed, |m, t| Bank {
            g,
            seed: seed * 100 + (m * 10 + t) as u64,
            transfers: 24,
        });
        let (c, a) = bank_holds(g, &r);
        committed.set(committed.get() + c);
        aborted.set(aborted.get() + a);
        let s = r.server_stats().unwrap();
        assert!(
            s.validations > 0,
            "audits validated by message (6 accounts a primary)"
        );
    });
    let (committed, aborted) = (committed.get(), aborted.get());
    assert!(aborted > 0, "contention never aborted a transfer");
    assert!(
        committed > aborted,
        "{committed} committed, {aborted} aborted"
    );
    let r = run_emu(g, |m, t| Bank {
        g,
        seed: (m * 10 + t) as u64,
        transfers: 400,
    });
    bank_holds(g, &r);
}

// ---------------------------------------------------------------------
// List-append histories.

const KEYS: u64 = 6;
/// Values a key's list holds; a full list ends the transaction (fail).
const CAP: usize = 40;
const LIST_BYTES: usize = 8 + 8 * CAP;

fn key_at(g: Geometry, k: u64) -> ObjAddr {
    let regions = g.regions() as u64;
    ObjAddr {
        region: (k % regions) as u32,
        offset: (k / regions) * object_bytes(LIST_BYTES) as u64,
    }
}

fn list_of(b: &[u8]) -> Vec<u64> {
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    assert!(n <= CAP, "a list longer than it can be");
    (0..n)
        .map(|i| u64::from_le_bytes(b[8 + 8 * i..16 + 8 * i].try_into().unwrap()))
        .collect()
}

fn list_bytes(l: &[u64]) -> Vec<u8> {
    let mut b = vec![0u8; LIST_BYTES];
    b[..8].copy_from_slice(&(l.len() as u64).to_le_bytes());
    for (i, v) in l.iter().enumerate() {
        b[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
    }
    b
}

struct Appender {
    g: Geometry,
    seed: u64,
    process: u64,
    txs: u32,
}

/// The time of an event: the backend's clock read now (the executor's
/// turn time could be earlier than a completion just seen).
fn now<N: Nic>(ctx: &Ctx<N>) -> u64 {
    ctx.nic().now_ns()
}

impl<N: Nic> Client<N> for Appender {
    type Out = Vec<(Kind, u64, Vec<Mop>)>;
    async fn run(self, ctx: &Ctx<N>, c: &mut Coordinator) -> Result<Self::Out, TxError> {
        let mut rng = Rng::new(self.seed);
        let mut events = Vec::new();
        let mut next = 0u64;
        for _ in 0..self.txs {
            let mops = common::appender::random_mops(&mut rng, 4, KEYS, self.process, &mut next);
            events.push((Kind::Invoke, now(ctx), mops.clone()));
            let mut tx = c.begin();
            let mut done = Vec::new();
            let mut full = false;
            let mut r = Ok(());
            for m in &mops {
                let (key, append) = match m {
                    Mop::Read { key, .. } => (*key, None),
                    Mop::Append { key, value } => (*key, Some(*value)),
                };
                let at = key_at(self.g, key);
                let mut l = match c.read(ctx, &mut tx, at, LIST_BYTES).await {
                    Ok(b) => list_of(&b),
                    Err(e) => {
                        r = Err(e);
                        break;
                    }
                };
                match append {
                    None => done.push(Mop::Read { key, seen: Some(l) }),
                    Some(_) if l.len() == CAP => {
                        full = true;
                        break;
                    }
                    Some(v) => {
                        l.push(v);
                        tx.write(at, &list_bytes(&l))?;
                        done.push(m.clone());
                    }
                }
            }
            let outcome = match r {
                Ok(()) if !full => c.commit(ctx, tx).await?,
                Ok(()) => Outcome::Aborted(Abort::Busy),
                Err(TxError::Aborted(a)) => Outcome::Aborted(a),
                Err(e) => return Err(e),
            };
            match outcome {
                Outcome::Committed => events.push((Kind::Ok, now(ctx), done)),
                Outcome::Aborted(_) => events.push((Kind::Fail, now(ctx), mops)),
            }
        }
        Ok(events)
    }
}

/// The run's history, all processes merged in time order (a completion
/// before an invoke of the same instant: it really was first).
fn history(r: &Report<Vec<(Kind, u64, Vec<Mop>)>>) -> History {
    no_errors(r);
    let mut all = Vec::new();
    for (p, c) in r.clients.iter().enumerate() {
        for (k, t, mops) in c.out.as_ref().unwrap() {
            all.push((*t, u8::from(*k == Kind::Invoke), p as u64, *k, mops.clone()));
        }
    }
    all.sort_by_key(|e| (e.0, e.1));
    let mut h = History::default();
    for (t, _, p, k, mops) in all {
        h.push(k, p, t, mops);
    }
    h
}

fn strict_serializable(h: &History, what: &str) {
    let parsed = AdyaHistory::from_json(&h.to_json_lines()).expect("our lines parse");
    let r = check(&parsed, Workload::ListAppend, &Opts::default());
    assert_eq!(
        r.valid,
        Valid::True,
        "{what}: not strict serializable: {:?}\n{}",
        r.anomaly_types,
        h.to_json_lines()
    );
}

fn appenders(g: Geometry, seed: u64, txs: u32) -> impl FnMut(u16, u16) -> Appender {
    move |m, t| Appender {
        g,
        seed: seed * 1000 + (m as u64) * 10 + t as u64,
        process: (m * g.threads + t) as u64,
        txs,
    }
}

#[test]
fn list_append_histories_are_strict_serializable_on_sim() {
    let g = geo(3, 2, 1);
    let (ok, failed) = (Cell::new(0), Cell::new(0));
    for_each_seed(
        "list_append_histories_are_strict_serializable_on_sim",
        200,
        |seed| {
            let r = sim(g, seed, appenders(g, seed, 12));
            let h = history(&r);
            ok.set(ok.get() + h.events.iter().filter(|e| e.kind == Kind::Ok).count());
            failed.set(failed.get() + h.events.iter().filter(|e| e.kind == Kind::Fail).count());
            strict_serializable(&h, &format!("seed {seed}"));
            let objects: Vec<(ObjAddr, usize)> =
                (0..KEYS).map(|k| (key_at(g, k), LIST_BYTES)).collect();
            backups_equal_primaries(g, &r, &objects);
        },
    );
    let (ok, failed) = (ok.get(), failed.get());
    assert!(
        ok > 0 && failed > 0,
        "{ok} committed, {failed} aborted: no contention"
    );
}

#[test]
fn list_append_histories_are_strict_serializable_on_emu() {
    let g = geo(3, 1, 2);
    let r = run_emu(g, appenders(g, 7, 60));
    let h = history(&r);
    strict_serializable(&h, "emu");
    let objects: Vec<(ObjAddr, usize)> = (0..KEYS).map(|k| (key_at(g, k), LIST_BYTES)).collect();
    backups_equal_primaries(g, &r, &objects);
}

/// Each machine run on its own, as a process of its own would
/// (`run_machine`): the servers stop on the coordinators' DONE alone, and
/// the bank holds.
#[test]
fn machines_run_apart_stop_on_every_coordinators_done() {
    let g = geo(3, 1, 1);
    let cluster = cluster::EmuCluster::machines(3, g.host_bytes().unwrap()).unwrap();
    let reports: Vec<Report<BankOut>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3u16)
            .map(|m| {
                let cluster = &cluster;
                s.spawn(move || {
                    txn::harness::run_machine(
                        g,
                        m,
                        &Default::default(),
                        cluster.machine_executors(),
                        |m, t| Bank {
                            g,
                            seed: (m * 10 + t) as u64,
                            transfers: 200,
                        },
                    )
                    .unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let memory: Vec<Vec<u8>> = (0..3).map(|m| cluster.host_copy(m)).collect();
    let mut all = Report {
        clients: Vec::new(),
        servers: Vec::new(),
        leases: Vec::new(),
        suspicions: Vec::new(),
        machines: Vec::new(),
        memory,
    };
    for r in reports {
        assert_eq!(r.clients.len(), 1, "a machine's own clients only");
        all.clients.extend(r.clients);
        all.servers.extend(r.servers);
    }
    bank_holds(g, &all);
}

/// The bank on a real RDMA NIC: three machines on one device in loopback
/// (skipped, saying so, where this host has none). Its audits must see the
/// bank's total.
#[cfg(feature = "mlx5")]
#[test]
fn mlx5_the_bank_keeps_its_total() {
    let g = geo(3, 1, 2);
    let Some(fix) = common::Mlx5::with(3, g.host_bytes().unwrap() as usize) else {
        return;
    };
    let r = txn::harness::run_threads(
        g,
        &Default::default(),
        |m, cfg| Ok(fix.executor_with(m, cfg)),
        |_| Vec::new(),
        |m, t| Bank {
            g,
            seed: (m * 10 + t) as u64,
            transfers: 400,
        },
    )
    .unwrap();
    no_errors(&r);
    let total = ACCOUNTS as i64 * START;
    let mut committed = 0;
    for c in &r.clients {
        let o = c.out.as_ref().unwrap();
        assert!(
            o.audits.iter().all(|&a| a == total),
            "an audit saw money made or lost"
        );
        committed += o.committed;
    }
    assert!(committed > 0);
}

/// Increments of one object, one at a time: how many committed, and how
/// many aborted for want of log space.
struct Incrementer {
    active: bool,
    n: u32,
}

impl<N: Nic> Client<N> for Incrementer {
    type Out = (u64, u64);
    async fn run(self, ctx: &Ctx<N>, c: &mut Coordinator) -> Result<(u64, u64), TxError> {
        let (mut committed, mut log_full) = (0, 0);
        if !self.active {
            return Ok((0, 0));
        }
        for _ in 0..self.n {
            let mut tx = c.begin();
            let v = u64::from_le_bytes(c.read(ctx, &mut tx, X, 8).await?.try_into().unwrap());
            assert_eq!(v, committed, "every committed increment, no other");
            tx.write(X, &(v + 1).to_le_bytes())?;
            match c.commit(ctx, tx).await? {
                Outcome::Committed => committed += 1,
                Outcome::Aborted(Abort::LogFull) => log_full += 1,
                Outcome::Aborted(a) => panic!("aborted alone: {a}"),
            }
        }
        Ok((committed, log_full))
    }
}

/// A backup that stops taking its log (its core stalled) fills the ring
/// from the coordinator: commits find no log space at reservation and
/// abort cleanly (nothing of theirs applied), then go on once the backup
/// catches up, and nothing committed is lost.
#[test]
fn a_full_log_at_reservation_aborts_cleanly() {
    let g = Geometry {
        log_bytes: 4096,
        ..geo(3, 1, 2)
    };
    let stall = nicdrv::sim::parse_fault("thread-stall@100us:1/6ms").unwrap();
    for_each_seed("a_full_log_at_reservation_aborts_cleanly", 5, |seed| {
        let (r, _) =
            txn::harness::run_sim_with_faults(g, seed, SimModel::default(), &stall, |m, _| {
                Incrementer {
                    active: m == 0,
                    n: 400,
                }
            })
            .unwrap();
        no_errors(&r);
        let (committed, log_full) = *r.clients[0].out.as_ref().unwrap();
        assert!(
            log_full > 0,
            "seed {seed}: the stalled backup's log never filled"
        );
        assert!(
            committed > 300,
            "seed {seed}: commits did not go on ({committed})"
        );
        assert_eq!(final_value(g, &r, X, 8), committed.to_le_bytes());
        backups_equal_primaries(g, &r, &[(X, 8)]);
        assert!(
            r.server_stats().unwrap().head_reports > 0,
            "the backup returned its head by WRITE"
        );
    });
}

/// Writes a value near i64's limit into every row of a workload, then
/// runs the workload's own transactions over them.
struct Corrupted {
    g: Geometry,
    mix: txn::workload::Mix,
    active: bool,
    seed: u64,
}

impl<N: Nic> Client<N> for Corrupted {
    type Out = txn::workload::WorkOut;
    async fn run(self, ctx: &Ctx<N>, c: &mut Coordinator) -> Result<Self::Out, TxError> {
        if !self.active {
            return Ok(Default::default());
        }
        let mut tx = c.begin();
        for (at, _) in self.mix.objects(&self.g) {
            c.read(ctx, &mut tx, at, 8).await?;
            tx.write(at, &(i64::MAX - 50).to_le_bytes())?;
        }
        assert_eq!(c.commit(ctx, tx).await?, Outcome::Committed);
        txn::workload::WorkClient {
            geo: self.g,
            mix: self.mix,
            seed: self.seed,
            txs: 300,
            process: 0,
            stop: None,
        }
        .run(ctx, c)
        .await
    }
}

/// Rows read back corrupt (values near i64's limit, which no transaction
/// of the workload could make) give the workload's transactions up; they
/// neither panic on overflow nor write a wrapped value.
#[test]
fn workloads_give_up_on_rows_past_i64s_range() {
    use txn::workload::Mix;
    let g = geo(2, 1, 1);
    for mix in [
        Mix::SmallBank { accounts: 4 },
        Mix::YcsbT {
            keys: 4,
            ops: 2,
            writes: 2,
        },
    ] {
        for_each_seed("workloads_give_up_on_rows_past_i64s_range", 3, |seed| {
            let r = sim(g, seed, |m, _| Corrupted {
                g,
                mix,
                active: m == 0,
                seed,
            });
            no_errors(&r);
            let out = r.clients[0].out.as_ref().unwrap();
            assert!(out.given_up > 0, "seed {seed} {}: {out:?}", mix.name());
            for (at, _) in mix.objects(&g) {
                let v = i64::from_le_bytes(final_value(g, &r, at, 8).try_into().unwrap());
                assert!(
                    v >= i64::MAX - 50 - 200 * 300,
                    "seed {seed} {}: a wrapped row {v}",
                    mix.name()
                );
            }
        });
    }
}
