//! Reading a key's two buckets: a *collect* (both buckets READ in one
//! doorbell) and a *snapshot* (collects repeated until two in a row agree).
//!
//! A collect is not atomic: it reads 16 words, each at its own instant.
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

use super::layout::{decode_entry, Desc, EntryRef, Slot, State, SLOTS};
use super::place::Loc;
use super::{CuckooClient, CuckooError};
use nicdrv::{Batch, Ctx, Done, GlobalAddr, Nic, OpId};

/// Positions in a key's canonical slot order: b1's 8 slots, then b2's.
pub const POSITIONS: usize = 2 * SLOTS;
/// Collects in one snapshot before giving up (contention bound).
const MAX_SNAPSHOT_ROUNDS: u32 = 100_000;
/// Entry READs that ride along with one collect (the batch holds 16).
const ENTRY_READS_PER_ROUND: usize = 14;

/// The 16 words of a key's two buckets, b1's then b2's.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Pair(pub [u64; POSITIONS]);

impl Pair {
    pub fn slot(&self, p: usize) -> Slot {
        Slot(self.0[p])
    }
}

/// The bucket of position `p`.
pub fn bucket_of(loc: &Loc, p: usize) -> u64 {
    if p < SLOTS {
        loc.b1
    } else {
        loc.b2
    }
}

/// The address of position `p`'s word.
pub fn slot_addr(desc: &Desc, loc: &Loc, p: usize) -> GlobalAddr {
    desc.bucket_addr(bucket_of(loc, p))
        .add(8 * (p % SLOTS) as u64)
}

/// The READs of one collect, added to a batch.
#[derive(Copy, Clone)]
pub struct CollectOps(OpId, OpId);

pub fn push_collect<N: Nic>(b: &mut Batch<'_, N>, desc: &Desc, loc: &Loc) -> CollectOps {
    let a = b.read_new(desc.bucket_addr(loc.b1), SLOTS * 8);
    let c = b.read_new(desc.bucket_addr(loc.b2), SLOTS * 8);
    CollectOps(a, c)
}

pub fn take_collect(d: &mut Done<'_>, ops: CollectOps) -> Pair {
    let mut w = [0u64; POSITIONS];
    for (half, op) in [ops.0, ops.1].into_iter().enumerate() {
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

/// Verdicts by entry reference, each with the time its READ was posted
/// and the entry's checksum. Entries are immutable while named by the
/// table and not reused for G after, so a verdict stays true while it is
/// younger than the window W.
#[derive(Default)]
pub struct Known {
    items: Vec<(EntryRef, Verdict, u64, u64)>,
}

impl Known {
    pub fn get(&self, e: EntryRef) -> Option<Verdict> {
        self.items.iter().find(|k| k.0 == e).map(|k| k.1)
    }

    /// The checksum of an entry judged (it tells two values of a key
    /// apart).
    pub fn sum(&self, e: EntryRef) -> Option<u64> {
        self.items.iter().find(|k| k.0 == e).map(|k| k.3)
    }

    pub fn put(&mut self, e: EntryRef, v: Verdict, read_ns: u64, sum: u64) {
        match self.items.iter_mut().find(|k| k.0 == e) {
            Some(k) => *k = (e, v, read_ns, sum),
            None => self.items.push((e, v, read_ns, sum)),
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
    pub(super) fn matches(loc: &Loc, s: Slot) -> bool {
        !s.is_empty() && s.fp() == loc.fp
    }

    /// One collect of the key's buckets.
    pub(super) async fn collect<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        desc: &Desc,
        loc: &Loc,
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
        loc: &Loc,
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
            for p in 0..POSITIONS {
                let s = prev.slot(p);
                if Self::matches(loc, s)
                    && self.known.get(s.eref()).is_none()
                    && !need[..n].contains(&Some(s.eref()))
                    && n < ENTRY_READS_PER_ROUND
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
                self.known.put(e, v, t, entry_sum(buf.as_slice()));
            }
            let cur = take_collect(&mut d, c);
            let judged = (0..POSITIONS).all(|p| {
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

    /// What the key's operation must do, given a snapshot of its buckets.
    pub(super) fn plan(&self, snap: &Snap, loc: &Loc) -> Result<Plan, CuckooError> {
        for p in 0..POSITIONS {
            let s = snap.pair.slot(p);
            if s.state() == State::Forward && s.fp() == loc.fp {
                return Ok(Plan::Resolve(p));
            }
        }
        let mut found = None;
        for p in 0..POSITIONS {
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
