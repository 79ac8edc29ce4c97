//! Transaction workloads, as clients of [`crate::harness`]: TATP's seven
//! transactions in their standard mix, SmallBank's six, a YCSB-style
//! read-modify-write mix over N keys, list appends (whose histories an
//! outside checker can check) and a bank of transfers and audits (whose
//! total must never change).
//!
//! Objects start zeroed (version 0), so every table's initial state is
//! written in those terms: a balance is stored as its change from the
//! starting balance, a TATP row that always exists is its all-zero row,
//! and a call-forwarding row is present only when its flag is set (none
//! at the start; INSERT and DELETE-CALL-FORWARDING set and clear it).
//!
//! Placement: rows are spread over the regions by their key, and all the
//! rows of one TATP subscriber (or one SmallBank customer) lie together
//! in one region, so most transactions write at one primary (Pw = 1).

use crate::coord::{Coordinator, Outcome};
use crate::error::TxError;
use crate::harness::Client;
use crate::history::{Kind, Mop};
use crate::layout::Geometry;
use crate::object::{object_bytes, LINE_PAYLOAD};
use crate::records::ObjAddr;
use nicdrv::rng::Rng;
use nicdrv::{Ctx, Nic};
use std::collections::BTreeMap;

/// Which workload, with its size.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Mix {
    /// TATP over `subscribers` subscribers.
    Tatp { subscribers: u64 },
    /// SmallBank over `accounts` customers.
    SmallBank { accounts: u64 },
    /// `ops` keys a transaction, `writes` of them read-modify-written, the
    /// rest read, over `keys` keys.
    YcsbT { keys: u64, ops: u32, writes: u32 },
    /// 1–4 reads or appends a transaction over `keys` lists.
    Append { keys: u64 },
    /// Transfers among `accounts` accounts (each end one of a few hot
    /// ones half the time), a quarter of the transactions audits of all of them.
    Bank { accounts: u64 },
}

/// Values a list of [`Mix::Append`] holds.
pub const LIST_CAP: usize = 40;
/// Payload bytes of a list.
pub const LIST_BYTES: usize = 8 + 8 * LIST_CAP;
/// Every bank account's starting balance.
pub const BANK_START: i64 = 1000;
/// A bank's accounts as read back after a run ([`Mix::Bank`]): their
/// balances' sum, and how many were negative or unreadable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BankTally {
    pub sum: i64,
    pub negative: u64,
    pub unreadable: u64,
}

impl BankTally {
    /// Counts one account: its stored value (its balance less
    /// [`BANK_START`]), or `None` if it could not be read. A value no
    /// transfer could make (a balance out of i64's range) is corrupt:
    /// counted unreadable, not a panic; the sum wraps, so a wrong value
    /// still shows as a wrong sum.
    pub fn add(&mut self, stored: Option<i64>) {
        match stored.and_then(|v| BANK_START.checked_add(v)) {
            Some(b) => {
                self.negative += u64::from(b < 0);
                self.sum = self.sum.wrapping_add(b);
            }
            None => self.unreadable += 1,
        }
    }

    /// Whether the accounts hold `total` in all, none negative or
    /// unreadable.
    pub fn holds(&self, total: i64) -> bool {
        self.sum == total && self.negative == 0 && self.unreadable == 0
    }
}

/// Every SmallBank account's starting savings and checking balance.
pub const SMALLBANK_START: i64 = 10_000;

/// TATP rows per subscriber: the subscriber, 4 access-info rows, 4
/// special facilities, 4 × 3 call-forwarding rows.
const TATP_ROWS: u64 = 1 + 4 + 4 + 12;

impl Mix {
    pub fn name(&self) -> &'static str {
        match self {
            Mix::Tatp { .. } => "tatp",
            Mix::SmallBank { .. } => "smallbank",
            Mix::YcsbT { .. } => "ycsb-t",
            Mix::Append { .. } => "append",
            Mix::Bank { .. } => "bank",
        }
    }

    /// Objects (one line each, or a list's lines) the workload lays out
    /// per key, and the object size.
    fn rows(&self) -> (u64, u64, u64) {
        match *self {
            Mix::Tatp { subscribers } => (subscribers, TATP_ROWS, 64),
            Mix::SmallBank { accounts } => (accounts, 2, 64),
            Mix::YcsbT { keys, .. } => (keys, 1, 64),
            Mix::Append { keys } => (keys, 1, object_bytes(LIST_BYTES) as u64),
            Mix::Bank { accounts } => (accounts, 1, 64),
        }
    }

    /// Region bytes the workload needs in `g`'s regions (a multiple of
    /// 4 KiB).
    pub fn region_bytes(&self, regions: u32) -> u64 {
        let (keys, rows, size) = self.rows();
        (keys.div_ceil(regions as u64) * rows * size)
            .max(4096)
            .next_multiple_of(4096)
    }

    /// Where row `row` of key `key` lies.
    pub fn at(&self, g: &Geometry, key: u64, row: u64) -> ObjAddr {
        let (_, rows, size) = self.rows();
        let regions = g.regions() as u64;
        ObjAddr {
            region: (key % regions) as u32,
            offset: ((key / regions) * rows + row) * size,
        }
    }

    /// Every object of the workload with its payload size (for checks of
    /// the final memory).
    pub fn objects(&self, g: &Geometry) -> Vec<(ObjAddr, usize)> {
        let (keys, rows, _) = self.rows();
        let len = match self {
            Mix::Append { .. } => LIST_BYTES,
            _ => 8,
        };
        (0..keys)
            .flat_map(|k| (0..rows).map(move |r| (k, r)))
            .map(|(k, r)| (self.at(g, k, r), len))
            .collect()
    }
}

/// What one client did.
#[derive(Clone, Debug, Default)]
pub struct WorkOut {
    pub committed: u64,
    pub aborted: [u64; 5],
    /// Transactions the workload itself gave up (a full list, TATP's
    /// expected failures): neither committed nor counted as aborts.
    pub given_up: u64,
    /// Begin-to-commit time of every committed transaction.
    pub latencies_ns: Vec<u64>,
    /// When each committed (the executor clock: virtual on sim), in
    /// commit order.
    pub commits_ns: Vec<u64>,
    /// Committed and aborted, by transaction type.
    pub by_type: BTreeMap<&'static str, (u64, u64)>,
    /// The client's history (Append only): (kind, time, mops).
    pub history: Vec<(Kind, u64, Vec<Mop>)>,
    /// Totals every committed bank audit saw.
    pub audits: Vec<i64>,
}

/// The most transactions a coordinator of the list-append workload runs:
/// its appended values are numbered in 32 bits, at most four a
/// transaction.
pub const APPEND_TXS_MAX: u64 = (1 << 30) - 1;

/// One coordinator thread's workload: `txs` transactions of `mix`.
#[derive(Copy, Clone, Debug)]
pub struct WorkClient {
    pub geo: Geometry,
    pub mix: Mix,
    pub seed: u64,
    pub txs: u64,
    /// The history's process number (Append).
    pub process: u64,
    /// Asked before each transaction: once it answers true the client
    /// starts no more and returns what it did (a command line's SIGINT,
    /// say). A transaction begun always ends (commits or aborts) first.
    /// `None`: all `txs` run.
    pub stop: Option<fn() -> bool>,
}

fn word(b: &[u8]) -> i64 {
    i64::from_le_bytes(b[..8].try_into().expect("8-byte rows"))
}

fn row(v: i64) -> [u8; 8] {
    v.to_le_bytes()
}

/// A transaction body's result: how it ended, and its type's name.
type Body = (Result<Outcome, TxError>, &'static str);

impl<N: Nic> Client<N> for WorkClient {
    type Out = WorkOut;
    async fn run(self, ctx: &Ctx<N>, c: &mut Coordinator) -> Result<WorkOut, TxError> {
        let mut rng = Rng::new(self.seed);
        let mut out = WorkOut::default();
        let mut next_value = 0u64;
        for _ in 0..self.txs {
            if self.stopped() {
                break;
            }
            let start = ctx.now_ns();
            let (r, kind) = match self.mix {
                Mix::Tatp { subscribers } => self.tatp(ctx, c, &mut rng, subscribers).await,
                Mix::SmallBank { accounts } => self.smallbank(ctx, c, &mut rng, accounts).await,
                Mix::YcsbT { keys, ops, writes } => {
                    (self.ycsb(ctx, c, &mut rng, keys, ops, writes).await, "rmw")
                }
                Mix::Append { keys } => {
                    let r = self
                        .append(ctx, c, &mut rng, keys, &mut next_value, &mut out)
                        .await;
                    (r, "append")
                }
                Mix::Bank { accounts } => {
                    self.bank(ctx, c, &mut rng, accounts, &mut out.audits).await
                }
            };
            let e = out.by_type.entry(kind).or_default();
            match r {
                Ok(Outcome::Committed) => {
                    out.committed += 1;
                    e.0 += 1;
                    let now = ctx.now_ns();
                    out.latencies_ns.push(now - start);
                    out.commits_ns.push(now);
                }
                Ok(Outcome::Aborted(a)) | Err(TxError::Aborted(a)) => {
                    out.aborted[a.index()] += 1;
                    e.1 += 1;
                }
                Err(TxError::Usage(why)) if why == GIVE_UP => out.given_up += 1,
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}

/// A coordinator thread's workload until a time of its executor clock:
/// `work`'s transactions in batches of `batch`, each batch's seed drawn
/// from `work.seed`, until `until_ns` (a run through a failure, timed
/// rather than counted).
pub struct Timed {
    pub work: WorkClient,
    pub until_ns: u64,
    pub batch: u64,
}

impl<N: Nic> Client<N> for Timed {
    type Out = WorkOut;
    async fn run(self, ctx: &Ctx<N>, c: &mut Coordinator) -> Result<WorkOut, TxError> {
        let mut out = WorkOut::default();
        let mut k = 0u64;
        while ctx.now_ns() < self.until_ns && !self.work.stopped() {
            let w = WorkClient {
                seed: self.work.seed ^ k.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                txs: self.batch.max(1),
                ..self.work
            };
            out.merge(&Client::<N>::run(w, ctx, c).await?);
            k += 1;
        }
        Ok(out)
    }
}

/// A workload's own decision not to commit (TATP's expected failures, a
/// full list): no abort of the protocol's.
const GIVE_UP: &str = "the workload gave up the transaction";

fn give_up() -> TxError {
    TxError::Usage(GIVE_UP.into())
}

/// `a + b` for values read back from memory: a sum out of i64's range
/// (a corrupt row; no transaction could make one) gives the transaction
/// up rather than panicking or writing a wrapped value.
fn add(a: i64, b: i64) -> Result<i64, TxError> {
    a.checked_add(b).ok_or_else(give_up)
}

impl WorkClient {
    /// Whether [`WorkClient::stop`] says to start no more transactions.
    pub fn stopped(&self) -> bool {
        self.stop.is_some_and(|f| f())
    }

    async fn read8<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        c: &mut Coordinator,
        tx: &mut crate::Tx,
        at: ObjAddr,
    ) -> Result<i64, TxError> {
        Ok(word(&c.read(ctx, tx, at, 8).await?))
    }

    /// TATP's mix (Neuvonen et al., "Telecom Application Transaction
    /// Processing Benchmark", 2009): 35% GET_SUBSCRIBER_DATA, 10%
    /// GET_NEW_DESTINATION, 35% GET_ACCESS_DATA, 2% UPDATE_SUBSCRIBER_DATA,
    /// 14% UPDATE_LOCATION, 2% INSERT and 2% DELETE_CALL_FORWARDING;
    /// subscribers uniform.
    async fn tatp<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        c: &mut Coordinator,
        rng: &mut Rng,
        subscribers: u64,
    ) -> Body {
        let (g, m) = (&self.geo, &self.mix);
        let s = rng.below(subscribers);
        let sub = m.at(g, s, 0);
        let ai = |t: u64| m.at(g, s, 1 + t);
        let sf = |t: u64| m.at(g, s, 5 + t);
        let cf = |t: u64, start: u64| m.at(g, s, 9 + t * 3 + start);
        let p = rng.below(100);
        let kind = match p {
            0..35 => "get_subscriber_data",
            35..45 => "get_new_destination",
            45..80 => "get_access_data",
            80..82 => "update_subscriber_data",
            82..96 => "update_location",
            96..98 => "insert_call_forwarding",
            _ => "delete_call_forwarding",
        };
        let mut tx = c.begin();
        let r = async {
            if p < 35 {
                c.read(ctx, &mut tx, sub, 8).await?;
            } else if p < 45 {
                let t = rng.below(4);
                c.read(ctx, &mut tx, sf(t), 8).await?;
                let start = rng.below(3);
                for st in 0..=start {
                    c.read(ctx, &mut tx, cf(t, st), 8).await?;
                }
            } else if p < 80 {
                c.read(ctx, &mut tx, ai(rng.below(4)), 8).await?;
            } else if p < 82 {
                let t = rng.below(4);
                let bits = self.read8(ctx, c, &mut tx, sub).await?;
                tx.write(sub, &row(bits ^ 1))?;
                let data = self.read8(ctx, c, &mut tx, sf(t)).await?;
                tx.write(sf(t), &row(data.wrapping_add(rng.below(256) as i64)))?;
            } else if p < 96 {
                let _ = self.read8(ctx, c, &mut tx, sub).await?;
                tx.write(sub, &row(rng.below(1 << 32) as i64))?;
            } else {
                let insert = p < 98;
                let (t, st) = (rng.below(4), rng.below(3));
                if insert {
                    c.read(ctx, &mut tx, sf(t), 8).await?;
                }
                let present = self.read8(ctx, c, &mut tx, cf(t, st)).await? != 0;
                if present == insert {
                    // TATP's expected failure: the row is there already
                    // (insert) or is not (delete).
                    return Err(give_up());
                }
                tx.write(cf(t, st), &row(i64::from(insert)))?;
            }
            Ok(())
        }
        .await;
        (self.finish(ctx, c, tx, r).await, kind)
    }

    /// SmallBank (Cahill et al., SIGMOD 2008; the mix of H-Store's
    /// implementation): 15% Amalgamate, 15% Balance, 15% DepositChecking,
    /// 25% SendPayment, 15% TransactSavings, 15% WriteCheck; customers
    /// uniform.
    async fn smallbank<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        c: &mut Coordinator,
        rng: &mut Rng,
        accounts: u64,
    ) -> Body {
        let (g, m) = (&self.geo, &self.mix);
        let a = rng.below(accounts);
        let b = (a + 1 + rng.below(accounts - 1)) % accounts;
        let (sav, chk) = (|k: u64| m.at(g, k, 0), |k: u64| m.at(g, k, 1));
        // A row holds its balance less the start; sums of rows read back
        // are checked ([`add`]).
        let bal = |v: i64| add(SMALLBANK_START, v);
        let p = rng.below(100);
        let v = 1 + rng.below(100) as i64;
        let kind = match p {
            0..15 => "amalgamate",
            15..30 => "balance",
            30..45 => "deposit_checking",
            45..70 => "send_payment",
            70..85 => "transact_savings",
            _ => "write_check",
        };
        let mut tx = c.begin();
        let r = async {
            if p < 15 {
                let sa = bal(self.read8(ctx, c, &mut tx, sav(a)).await?)?;
                let ca = bal(self.read8(ctx, c, &mut tx, chk(a)).await?)?;
                let cb = self.read8(ctx, c, &mut tx, chk(b)).await?;
                tx.write(sav(a), &row(-SMALLBANK_START))?;
                tx.write(chk(a), &row(-SMALLBANK_START))?;
                tx.write(chk(b), &row(add(cb, add(sa, ca)?)?))?;
            } else if p < 30 {
                self.read8(ctx, c, &mut tx, sav(a)).await?;
                self.read8(ctx, c, &mut tx, chk(a)).await?;
            } else if p < 45 {
                let ca = self.read8(ctx, c, &mut tx, chk(a)).await?;
                tx.write(chk(a), &row(add(ca, v)?))?;
            } else if p < 70 {
                let ca = self.read8(ctx, c, &mut tx, chk(a)).await?;
                let cb = self.read8(ctx, c, &mut tx, chk(b)).await?;
                if bal(ca)? < v {
                    return Err(give_up());
                }
                tx.write(chk(a), &row(add(ca, -v)?))?;
                tx.write(chk(b), &row(add(cb, v)?))?;
            } else if p < 85 {
                let sa = self.read8(ctx, c, &mut tx, sav(a)).await?;
                tx.write(sav(a), &row(add(sa, v)?))?;
            } else {
                let sa = self.read8(ctx, c, &mut tx, sav(a)).await?;
                let ca = self.read8(ctx, c, &mut tx, chk(a)).await?;
                let fee = i64::from(add(bal(sa)?, bal(ca)?)? < v);
                tx.write(chk(a), &row(add(ca, -v - fee)?))?;
            }
            Ok(())
        }
        .await;
        (self.finish(ctx, c, tx, r).await, kind)
    }

    /// `ops` distinct uniform keys, the first `writes` incremented.
    async fn ycsb<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        c: &mut Coordinator,
        rng: &mut Rng,
        keys: u64,
        ops: u32,
        writes: u32,
    ) -> Result<Outcome, TxError> {
        let mut ks: Vec<u64> = Vec::with_capacity(ops as usize);
        while ks.len() < ops as usize {
            let k = rng.below(keys);
            if !ks.contains(&k) {
                ks.push(k);
            }
        }
        let mut tx = c.begin();
        let r = async {
            for (i, &k) in ks.iter().enumerate() {
                let at = self.mix.at(&self.geo, k, 0);
                let v = self.read8(ctx, c, &mut tx, at).await?;
                if (i as u32) < writes {
                    tx.write(at, &row(add(v, 1)?))?;
                }
            }
            Ok(())
        }
        .await;
        self.finish(ctx, c, tx, r).await
    }

    /// 1–4 reads or appends of unique values (`process << 32 | n`, n
    /// counting this coordinator's appends from 1); the history records
    /// each.
    async fn append<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        c: &mut Coordinator,
        rng: &mut Rng,
        keys: u64,
        next: &mut u64,
        out: &mut WorkOut,
    ) -> Result<Outcome, TxError> {
        let mops: Vec<Mop> = (0..1 + rng.below(4))
            .map(|_| {
                let key = rng.below(keys);
                if rng.below(2) == 0 {
                    Mop::Read { key, seen: None }
                } else {
                    *next += 1;
                    // Unique values: 32 bits of this process's count (at
                    // most four a transaction, APPEND_TXS_MAX of them).
                    assert!(*next < 1 << 32, "append values past 32 bits");
                    Mop::Append {
                        key,
                        value: self.process << 32 | *next,
                    }
                }
            })
            .collect();
        out.history
            .push((Kind::Invoke, ctx.nic().now_ns(), mops.clone()));
        let mut tx = c.begin();
        let mut done = Vec::with_capacity(mops.len());
        let r = async {
            for m in &mops {
                let (key, append) = match m {
                    Mop::Read { key, .. } => (*key, None),
                    Mop::Append { key, value } => (*key, Some(*value)),
                };
                let at = self.mix.at(&self.geo, key, 0);
                let mut l = list_of(&c.read(ctx, &mut tx, at, LIST_BYTES).await?)?;
                match append {
                    None => done.push(Mop::Read { key, seen: Some(l) }),
                    Some(_) if l.len() == LIST_CAP => return Err(give_up()),
                    Some(v) => {
                        l.push(v);
                        tx.write(at, &list_bytes(&l))?;
                        done.push(m.clone());
                    }
                }
            }
            Ok(())
        }
        .await;
        let r = self.finish(ctx, c, tx, r).await;
        let now = ctx.nic().now_ns();
        match &r {
            Ok(Outcome::Committed) => out.history.push((Kind::Ok, now, done)),
            // Certainly not committed: an abort, or given up before commit.
            Ok(Outcome::Aborted(_)) | Err(TxError::Aborted(_)) => {
                out.history.push((Kind::Fail, now, mops))
            }
            Err(TxError::Usage(w)) if w == GIVE_UP => out.history.push((Kind::Fail, now, mops)),
            // A broken run: the transaction may or may not have committed.
            Err(_) => out.history.push((Kind::Info, now, mops)),
        }
        r
    }

    /// A transfer between a few hot accounts and another, or (every
    /// fourth) an audit of every account.
    async fn bank<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        c: &mut Coordinator,
        rng: &mut Rng,
        accounts: u64,
        audits: &mut Vec<i64>,
    ) -> Body {
        let m = self.mix;
        // Wrapping: a balance read back corrupt shows in the audit's
        // total rather than panicking here.
        let bal = |v: i64| BANK_START.wrapping_add(v);
        let mut tx = c.begin();
        if rng.below(4) == 0 {
            let mut total = 0;
            let r = async {
                for a in 0..accounts {
                    let v = self.read8(ctx, c, &mut tx, m.at(&self.geo, a, 0)).await?;
                    total = i64::wrapping_add(total, bal(v));
                }
                Ok(())
            }
            .await;
            let r = self.finish(ctx, c, tx, r).await;
            if matches!(r, Ok(Outcome::Committed)) {
                audits.push(total);
            }
            return (r, "audit");
        }
        // Either end is one of a few hot accounts half the time
        // (contention); both ends alike, so balances wander rather than
        // drain.
        let mut pick = || {
            if rng.below(2) == 0 {
                rng.below(accounts.min(6))
            } else {
                rng.below(accounts)
            }
        };
        let from = pick();
        let mut to = pick();
        if to == from {
            to = (from + 1) % accounts;
        }
        let amount = 1 + rng.below(100) as i64;
        let r = async {
            let (fa, ta) = (m.at(&self.geo, from, 0), m.at(&self.geo, to, 0));
            let fb = self.read8(ctx, c, &mut tx, fa).await?;
            let tb = self.read8(ctx, c, &mut tx, ta).await?;
            if bal(fb) < amount {
                return Err(give_up());
            }
            // Balances no transfer could reach (corrupt) transfer nothing.
            let (Some(f), Some(t)) = (fb.checked_sub(amount), tb.checked_add(amount)) else {
                return Err(give_up());
            };
            tx.write(fa, &row(f))?;
            tx.write(ta, &row(t))?;
            Ok(())
        }
        .await;
        (self.finish(ctx, c, tx, r).await, "transfer")
    }

    /// Commits `tx` if its body went through.
    async fn finish<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        c: &mut Coordinator,
        tx: crate::Tx,
        body: Result<(), TxError>,
    ) -> Result<Outcome, TxError> {
        match body {
            Ok(()) => c.commit(ctx, tx).await,
            Err(TxError::Aborted(a)) => Ok(Outcome::Aborted(a)),
            Err(e) => Err(e),
        }
    }
}

/// A list's values (its length word first).
pub fn list_of(b: &[u8]) -> Result<Vec<u64>, TxError> {
    let n = u64::from_le_bytes(b[..8].try_into().expect("a list's length word")) as usize;
    if n > LIST_CAP || b.len() < 8 + 8 * n {
        return Err(TxError::Protocol(format!(
            "a list of {n} values in {} bytes",
            b.len()
        )));
    }
    Ok((0..n)
        .map(|i| u64::from_le_bytes(b[8 + 8 * i..16 + 8 * i].try_into().expect("8 bytes")))
        .collect())
}

/// A list's bytes.
pub fn list_bytes(l: &[u64]) -> Vec<u8> {
    let mut b = vec![0u8; LIST_BYTES];
    b[..8].copy_from_slice(&(l.len() as u64).to_le_bytes());
    for (i, v) in l.iter().enumerate() {
        b[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
    }
    b
}

const _: () = assert!(LINE_PAYLOAD >= 8, "a row fits a line");

impl WorkOut {
    pub fn merge(&mut self, o: &WorkOut) {
        self.committed += o.committed;
        for (a, b) in self.aborted.iter_mut().zip(o.aborted) {
            *a += b;
        }
        self.given_up += o.given_up;
        self.latencies_ns.extend_from_slice(&o.latencies_ns);
        self.commits_ns.extend_from_slice(&o.commits_ns);
        for (k, v) in &o.by_type {
            let e = self.by_type.entry(k).or_default();
            e.0 += v.0;
            e.1 += v.1;
        }
        self.audits.extend_from_slice(&o.audits);
    }
}

/// The clients' histories merged into one, in time order; of events at
/// one instant a completion comes before an invoke (it really was first:
/// the invoke's reads start after it). `outs` gives each client's process
/// number and output.
pub fn merged_history<'a>(
    outs: impl IntoIterator<Item = (u64, &'a WorkOut)>,
) -> crate::history::History {
    let mut all = Vec::new();
    for (p, o) in outs {
        for (k, t, mops) in &o.history {
            all.push((*t, u8::from(*k == Kind::Invoke), p, *k, mops));
        }
    }
    all.sort_by_key(|e| (e.0, e.1, e.2));
    let mut h = crate::history::History::default();
    for (t, _, p, k, mops) in all {
        h.push(k, p, t, mops.clone());
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bank_tally_counts_a_corrupt_balance_unreadable_and_never_overflows() {
        let mut t = BankTally::default();
        t.add(Some(5));
        t.add(Some(-5));
        assert!(t.holds(2 * BANK_START), "{t:?}");
        t.add(Some(-BANK_START - 1));
        assert_eq!(t.negative, 1, "{t:?}");
        t.add(Some(i64::MAX));
        t.add(None);
        assert_eq!(t.unreadable, 2, "{t:?}");
        // Balances near i64's limit wrap the sum rather than panic.
        t.add(Some(i64::MAX - BANK_START));
        t.add(Some(i64::MAX - BANK_START));
        assert!(!t.holds(2 * BANK_START), "{t:?}");
    }

    #[test]
    fn a_sum_past_i64s_range_gives_the_transaction_up() {
        assert_eq!(add(-SMALLBANK_START, 7).ok(), Some(7 - SMALLBANK_START));
        for (a, b) in [(i64::MAX, 1), (i64::MIN, -1), (i64::MAX - 3, 100)] {
            match add(a, b) {
                Err(TxError::Usage(m)) => assert_eq!(m, GIVE_UP, "{a} + {b}"),
                r => panic!("{a} + {b}: {r:?}"),
            }
        }
    }
}
