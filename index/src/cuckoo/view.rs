//! Reading a key's buckets: a *collect* (its buckets READ in one doorbell)
//! and a *snapshot* (collects repeated until two in a row agree). A key has
//! two buckets; while the table grows, the two at each level, up to four
//! ([`Reach`]).
//!
//! A collect is not atomic: it reads 16 to 32 words, each at its own instant.
//! A snapshot is. Every word ever stored in a slot is unique (`mod.rs`,
//! "Unique words"), so a slot that returned the same word to two READs
//! held it throughout between them. When two consecutive collects agree on
//! all 16 words, every slot held its word at every instant between the
//! last READ of the first collect and the first READ of the second — and
//! since the second collect is posted only after the first completed, such
//! an instant exists. The snapshot is the state of both buckets at that
//! instant (the double collect of Afek et al., JACM 1993, made sound by
//! unique words instead of sequence numbers).
//!
//! The snapshot also classifies every slot whose fingerprint matches the
//! key: the entries are READ in the same doorbell as the next collect, and
//! a verdict (this key, another key, unreadable) is kept for a short while
//! keyed by the entry reference.

use super::layout::{decode_entry, hash64, Desc, EntryRef, Phase, Slot, State, SLOTS};
use super::place::{locate_hash_at, Loc};
use super::{CuckooClient, CuckooError};
use nicdrv::exec::MAX_BATCH;
use nicdrv::{Batch, Ctx, Done, GlobalAddr, Nic, OpId};

/// Most buckets an operation reads: a key's two at each of two levels.
pub const MAX_READ_BUCKETS: usize = 4;
/// Most positions in a key's canonical slot order.
pub const POSITIONS: usize = MAX_READ_BUCKETS * SLOTS;

/// The buckets an operation on a key reads, in the key's canonical slot
/// order, and the two among them it places new words in.
///
/// Stable at level l: the key's first and other bucket at l. Growing from
/// l to l + 1 (`grow.rs`): its first bucket at l, its first at l + 1, its
/// other at l, its other at l + 1, each once (a bucket at l + 1 is the one
/// at l or its copy, so there are two to four). Every client of one phase
/// reads the same order, and it keeps each level's first bucket before
/// its other, so clients of neighbouring phases, one of which reads a
/// single level, agree on the order of every slot both read: the insert's
/// earliest-claim-wins rule (`mod.rs`) rests on that.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Reach {
    buckets: [u64; MAX_READ_BUCKETS],
    n: u8,
    /// Indices into `buckets` of the first and other bucket at the place
    /// level.
    place: [u8; 2],
    pub fp: u16,
}

impl Reach {
    /// The plain pair of `loc` (a stable table's reach).
    pub fn pair(loc: Loc) -> Reach {
        Reach {
            buckets: [loc.b1, loc.b2, 0, 0],
            n: 2,
            place: [0, 1],
            fp: loc.fp,
        }
    }

    /// Where `key` is read and placed under `desc`.
    pub fn of(desc: &Desc, key: &[u8]) -> Reach {
        let h = hash64(key, desc.seed);
        let at = |level| locate_hash_at(h, desc.base_buckets, level);
        let lo = at(desc.level);
        if !desc.growing() {
            return Reach::pair(lo);
        }
        let hi = at(desc.level + 1);
        let mut r = Reach {
            buckets: [0; MAX_READ_BUCKETS],
            n: 0,
            place: [0, 0],
            fp: lo.fp,
        };
        for b in [lo.b1, hi.b1, lo.b2, hi.b2] {
            if !r.buckets().contains(&b) {
                r.buckets[r.n as usize] = b;
                r.n += 1;
            }
        }
        let pl = if desc.phase == Phase::Placing { hi } else { lo };
        r.place = [r.index_of(pl.b1), r.index_of(pl.b2)].map(|i| i.expect("read") as u8);
        r
    }

    /// The buckets read, in order.
    pub fn buckets(&self) -> &[u64] {
        &self.buckets[..self.n as usize]
    }

    /// Positions: 8 per bucket read.
    pub fn positions(&self) -> usize {
        self.n as usize * SLOTS
    }

    /// The index of `bucket` among those read.
    pub fn index_of(&self, bucket: u64) -> Option<usize> {
        self.buckets().iter().position(|&b| b == bucket)
    }

    /// Indices of the first and other bucket new words go to.
    pub fn place(&self) -> [usize; 2] {
        self.place.map(|i| i as usize)
    }

    /// The first and other bucket new words go to.
    pub fn place_buckets(&self) -> [u64; 2] {
        self.place().map(|h| self.buckets()[h])
    }
}
/// Collects in one snapshot before giving up (contention bound).
const MAX_SNAPSHOT_ROUNDS: u32 = 100_000;
/// Most entry READs that ride along with one collect (the batch holds
/// 16, two to four of them the collect's).
const ENTRY_READS_PER_ROUND: usize = MAX_BATCH - 2;

/// The words of a key's buckets in canonical order (positions beyond
/// the reach's are zero).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Pair(pub [u64; POSITIONS]);

impl Pair {
    pub fn slot(&self, p: usize) -> Slot {
        Slot(self.0[p])
    }
}

/// The bucket of position `p`.
pub fn bucket_of(loc: &Reach, p: usize) -> u64 {
    loc.buckets()[p / SLOTS]
}

/// The address of position `p`'s word.
pub fn slot_addr(desc: &Desc, loc: &Reach, p: usize) -> GlobalAddr {
    desc.bucket_addr(bucket_of(loc, p))
        .add(8 * (p % SLOTS) as u64)
}

/// The READs of one collect, added to a batch.
#[derive(Copy, Clone)]
pub struct CollectOps([Option<OpId>; MAX_READ_BUCKETS]);

pub fn push_collect<N: Nic>(b: &mut Batch<'_, N>, desc: &Desc, loc: &Reach) -> CollectOps {
    let mut ops = [None; MAX_READ_BUCKETS];
    for (op, &bucket) in ops.iter_mut().zip(loc.buckets()) {
        *op = Some(b.read_new(desc.bucket_addr(bucket), SLOTS * 8));
    }
    CollectOps(ops)
}

pub fn take_collect(d: &mut Done<'_>, ops: CollectOps) -> Pair {
    let mut w = [0u64; POSITIONS];
    for (half, op) in ops.0.into_iter().enumerate() {
        let Some(op) = op else { break };
        let buf = d.take_buf(op);
        for i in 0..SLOTS {
            w[half * SLOTS + i] = buf.u64_at(i * 8);
        }
    }
    Pair(w)
}

/// What an entry READ said about a slot whose fingerprint matched.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The entry holds the key looked for.
    Key,
    /// Another key with the same fingerprint.
    Other,
    /// Torn, stale or not yet written: not an entry this READ could trust.
    Bad,
}

/// Verdicts by entry reference, each with the time its READ was posted,
/// the entry's checksum and, while the table grows, the buckets its key
/// goes to at the place level. Entries are immutable while named by the
/// table and not reused for G after, so a verdict stays true while it is
/// younger than the window W.
#[derive(Default)]
pub struct Known {
    items: Vec<Judged>,
}

/// One entry judged: its reference, the verdict, when its READ was
/// posted, its checksum, and its key's buckets at the place level (while
/// the table grows).
type Judged = (EntryRef, Verdict, u64, u64, Option<[u64; 2]>);

impl Known {
    pub fn get(&self, e: EntryRef) -> Option<Verdict> {
        self.items.iter().find(|k| k.0 == e).map(|k| k.1)
    }

    /// The checksum of an entry judged (it tells two values of a key
    /// apart).
    pub fn sum(&self, e: EntryRef) -> Option<u64> {
        self.items.iter().find(|k| k.0 == e).map(|k| k.3)
    }

    /// The buckets an entry's key goes to at the place level, when its
    /// READ was judged while the table grew.
    pub fn home(&self, e: EntryRef) -> Option<[u64; 2]> {
        self.items.iter().find(|k| k.0 == e).and_then(|k| k.4)
    }

    pub fn put(&mut self, e: EntryRef, v: Verdict, read_ns: u64, sum: u64) {
        self.put_home(e, v, read_ns, sum, None)
    }

    pub fn put_home(
        &mut self,
        e: EntryRef,
        v: Verdict,
        read_ns: u64,
        sum: u64,
        home: Option<[u64; 2]>,
    ) {
        match self.items.iter_mut().find(|k| k.0 == e) {
            Some(k) => *k = (e, v, read_ns, sum, home),
            None => self.items.push((e, v, read_ns, sum, home)),
        }
    }

    /// Forgets verdicts read before `oldest_ns`.
    pub fn expire(&mut self, oldest_ns: u64) {
        self.items.retain(|k| k.2 >= oldest_ns);
    }

    pub fn clear(&mut self) {
        self.items.clear();
    }
}

/// The verdict on entry bytes for `key`.
pub fn judge(bytes: &[u8], key: &[u8]) -> Verdict {
    match decode_entry(bytes, key.len()) {
        Some((k, _)) if k == key => Verdict::Key,
        Some(_) => Verdict::Other,
        None => Verdict::Bad,
    }
}

/// The checksum word of entry bytes.
pub fn entry_sum(bytes: &[u8]) -> u64 {
    bytes
        .get(..8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// Two consecutive collects that agreed: the buckets at one instant after
/// `t0`, the post time of the first of them.
#[derive(Copy, Clone, Debug)]
pub struct Snap {
    pub pair: Pair,
    pub t0: u64,
}

/// What a snapshot says a key's operation must do.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// A Forward word with the key's fingerprint: finish or undo that move
    /// first (whoever's key it is).
    Resolve(usize),
    /// The key's one committed copy, a Normal word at this position.
    Present(usize),
    /// No committed copy of the key.
    Absent,
    /// A committed word's entry was unreadable: start over.
    Torn,
}

impl CuckooClient {
    /// Whether position `p`'s word may be the key's: non-empty with the
    /// key's fingerprint.
    pub(super) fn matches(loc: &Reach, s: Slot) -> bool {
        !s.is_empty() && s.fp() == loc.fp
    }

    /// One collect of the key's buckets.
    pub(super) async fn collect<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        desc: &Desc,
        loc: &Reach,
    ) -> Result<Pair, CuckooError> {
        let mut b = ctx.batch();
        let c = push_collect(&mut b, desc, loc);
        let mut d = b.submit().await?;
        Ok(take_collect(&mut d, c))
    }

    /// Collects until two in a row agree and every matching word is
    /// judged; `first` is a collect already made and its post time.
    pub(super) async fn snapshot<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        desc: &Desc,
        loc: &Reach,
        key: &[u8],
        first: Option<(Pair, u64)>,
    ) -> Result<Snap, CuckooError> {
        let (mut prev, mut t_prev) = match first {
            Some(f) => f,
            None => {
                let t = ctx.now_ns();
                (self.collect(ctx, desc, loc).await?, t)
            }
        };
        for _ in 0..MAX_SNAPSHOT_ROUNDS {
            let t = ctx.now_ns();
            self.known
                .expire(t.saturating_sub(self.table.cfg.window_ns));
            let mut need = [None::<EntryRef>; ENTRY_READS_PER_ROUND];
            let mut n = 0;
            for p in 0..loc.positions() {
                let s = prev.slot(p);
                if Self::matches(loc, s)
                    && self.known.get(s.eref()).is_none()
                    && !need[..n].contains(&Some(s.eref()))
                    && n < MAX_BATCH - loc.buckets().len()
                {
                    need[n] = Some(s.eref());
                    n += 1;
                }
            }
            let mut b = ctx.batch();
            let mut ops = [None::<(EntryRef, OpId)>; ENTRY_READS_PER_ROUND];
            for (i, e) in need[..n].iter().enumerate() {
                let e = e.expect("filled");
                ops[i] = Some((e, b.read_new(e.addr(), e.bytes())));
            }
            let c = push_collect(&mut b, desc, loc);
            let mut d = b.submit().await?;
            for &(e, op) in ops[..n].iter().flatten() {
                let buf = d.take_buf(op);
                let v = judge(buf.as_slice(), key);
                if v == Verdict::Other {
                    self.stats.fp_false_matches += 1;
                }
                // While the table grows, where the entry's key now goes
                // (a move is finished only into those buckets: resolve).
                let home = desc
                    .growing()
                    .then(|| decode_entry(buf.as_slice(), key.len()))
                    .flatten()
                    .map(|(k, _)| Reach::of(desc, k).place_buckets());
                self.known
                    .put_home(e, v, t, entry_sum(buf.as_slice()), home);
            }
            let cur = take_collect(&mut d, c);
            let judged = (0..loc.positions()).all(|p| {
                let s = cur.slot(p);
                !Self::matches(loc, s) || self.known.get(s.eref()).is_some()
            });
            if cur == prev && judged {
                return Ok(Snap {
                    pair: cur,
                    t0: t_prev,
                });
            }
            if cur != prev {
                self.stats.snapshot_retries += 1;
            }
            prev = cur;
            t_prev = t;
        }
        Err(CuckooError::Contention)
    }

    /// For a reader: whether the snapshot holds the key (a committed
    /// word, Normal or Forward, naming an entry of the key), does not, or
    /// cannot tell (an entry unjudged or unreadable: `Torn`). Unlike
    /// [`Self::plan`], a Forward word of another key with the same
    /// fingerprint does not matter: a reader never resolves moves, and
    /// waiting for a writer to resolve one a stopped client left would
    /// wait forever (found by a compute node crashing mid-growth).
    pub(super) fn presence(&self, snap: &Snap, loc: &Reach) -> Plan {
        let mut torn = false;
        for p in 0..loc.positions() {
            let s = snap.pair.slot(p);
            if !s.is_committed() || s.fp() != loc.fp {
                continue;
            }
            match self.known.get(s.eref()) {
                Some(Verdict::Key) => return Plan::Present(p),
                Some(Verdict::Other) => {}
                Some(Verdict::Bad) | None => torn = true,
            }
        }
        if torn {
            Plan::Torn
        } else {
            Plan::Absent
        }
    }

    /// What the key's operation must do, given a snapshot of its buckets.
    pub(super) fn plan(&self, snap: &Snap, loc: &Reach) -> Result<Plan, CuckooError> {
        for p in 0..loc.positions() {
            let s = snap.pair.slot(p);
            if s.state() == State::Forward && s.fp() == loc.fp {
                return Ok(Plan::Resolve(p));
            }
        }
        let mut found = None;
        for p in 0..loc.positions() {
            let s = snap.pair.slot(p);
            if s.state() != State::Normal || s.fp() != loc.fp {
                continue;
            }
            match self.known.get(s.eref()) {
                Some(Verdict::Key) => {
                    if found.is_some() {
                        // Two committed copies without a move between them:
                        // the invariant the whole protocol keeps is broken.
                        return Err(CuckooError::Corrupt {
                            what: "a key committed in two slots",
                        });
                    }
                    found = Some(p);
                }
                Some(Verdict::Other) => {}
                Some(Verdict::Bad) | None => return Ok(Plan::Torn),
            }
        }
        Ok(found.map_or(Plan::Absent, Plan::Present))
    }
}
