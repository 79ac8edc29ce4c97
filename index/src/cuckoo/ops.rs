//! get, put and delete: each an attempt loop over collects and snapshots of
//! the key's two buckets ending in at most one CAS that decides it (an
//! insert: two, claim then commit). `mod.rs` states the protocol and why it
//! is linearizable; the comments here point at its steps.

use super::layout::{encode_entry, entry_lines, EntryRef, Phase, Slot, State, SLOTS};
use super::view::{
    bucket_of, entry_sum, judge, push_collect, slot_addr, take_collect, Pair, Plan, Reach, Verdict,
    POSITIONS,
};
use super::{CuckooClient, CuckooError, MAX_ATTEMPTS};
use crate::cuckoo::layout::Desc;
use nicdrv::exec::MAX_BATCH;
use nicdrv::{Ctx, GlobalAddr, Nic, OpId};
use std::sync::Arc;

/// Rounds of displacement one put tries before answering `TableFull`
/// (others may take each slot a displacement frees).
const MAX_ROOM_ROUNDS: u32 = 32;

/// How an insert attempt ended.
enum Ins {
    /// Committed.
    Done,
    /// Nothing was stored: the entry may be used again as it is.
    Retry,
    /// The entry was seen in the table (Tentative) and withdrawn: it must
    /// be retired and a fresh one written.
    Burnt,
    /// No empty slot in either bucket (boxed: the words of up to four).
    NoRoom(Box<Pair>),
    /// The table is placing words at its new level while the split walk
    /// may still need that room: new keys wait for the growth to end
    /// (`grow.rs`, "Inserts wait").
    Wait,
}

impl CuckooClient {
    fn locate(&self, desc: &Desc, key: &[u8]) -> Reach {
        Reach::of(desc, key)
    }

    /// The value of `key`, appended to `out` (cleared first); whether it
    /// was present. One round trip when the compute node's location cache
    /// knew where the key was and it is still there, else two when the
    /// key is present and its buckets are quiet; two when it is absent. Fails with
    /// [`CuckooError::KeySize`] for a key of the wrong size, `NotCreated`
    /// before the table exists, `Config` when the table disagrees with this
    /// client's configuration or has had too many clients, `Verb` when a
    /// verb fails, `Corrupt` when the table holds what the protocol never
    /// writes, `Contention` when its attempts never finish.
    pub async fn get_into<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        key: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<bool, CuckooError> {
        crate::scratch_scoped!(ctx, self.get_into_unscoped(ctx, key, out))
    }

    async fn get_into_unscoped<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        key: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<bool, CuckooError> {
        self.check_key(key)?;
        let desc = self.open(ctx).await?;
        let rt0 = ctx.counters().round_trips;
        let r = self.get_inner(ctx, desc, key, out).await;
        self.stats.gets += 1;
        self.stats.get_round_trips += ctx.counters().round_trips - rt0;
        r
    }

    /// A get in one round trip from the compute node's location cache:
    /// the slot `key` was last found in and the entry its word named, READ
    /// in one doorbell. Whether it answered (into `out`); when it did not,
    /// the line is dropped and the caller gets the two-round-trip way.
    ///
    /// Why an answer is right: `mod.rs`, "Cached gets". In short, a READ
    /// of the slot returning the cached committed word `w` at `t_s` is the
    /// get's linearization point, and the entry READ returns the
    /// incarnation `w` named then if it lands after `t_s` and within W of
    /// the doorbell's start (entry beside the slot: one queue pair, in
    /// order), or if the key was seen at the slot less than G − W before
    /// (entry apart: the two READs are unordered, but no block named then
    /// can have been reused). The line's time moves to the doorbell's
    /// start on a hit. The key and checksum check rejects anything else; a
    /// stale, torn or foreign line costs the round trip and nothing more.
    async fn cached_get<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        desc: &Desc,
        loc: &Reach,
        key: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<bool, CuckooError> {
        let Some(place) = self.table.place_of(key) else {
            return Ok(false);
        };
        let (p, w) = (place.pos, place.word);
        let s = Slot(w);
        let cfg = self.cfg();
        let life = cfg.reuse_grace_ns - cfg.window_ns;
        let t = ctx.now_ns();
        if p >= loc.positions() || !s.is_committed() || s.fp() != loc.fp {
            self.table.forget_place(key);
            return Ok(false);
        }
        let e = s.eref();
        let slot_at = slot_addr(desc, loc, p);
        // Beside its slot, the entry is READ after the slot on one queue
        // pair, and no age bound applies (mod.rs, "Cached gets").
        let beside = cfg.ordered_reads && e.addr().node() == slot_at.node();
        let young = |now: u64| beside || now.saturating_sub(place.seen_ns) < life;
        if !young(t) {
            self.table.forget_place(key);
            return Ok(false);
        }
        self.stats.cached_gets += 1;
        let mut b = ctx.batch();
        let so = b.read_new(slot_at, 8);
        let eo = b.read_new(e.addr(), e.bytes());
        let mut d = b.submit().await?;
        let now = d.word(so);
        let buf = d.take_buf(eo);
        if now == w
            && matches!(judge(buf.as_slice(), key), Verdict::Key)
            && self.in_window(ctx, t)
            && young(ctx.now_ns())
        {
            let (_, v) = super::layout::decode_entry(buf.as_slice(), key.len()).expect("judged");
            out.clear();
            out.extend_from_slice(v);
            self.stats.cache_hits += 1;
            self.table.put_place(key, p, w, t);
            return Ok(true);
        }
        self.table.forget_place(key);
        Ok(false)
    }

    /// [`get_into`](Self::get_into) into a new vector: the value of `key`,
    /// if present. Fails as `get_into` does.
    pub async fn get<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, CuckooError> {
        let mut v = Vec::new();
        Ok(self.get_into(ctx, key, &mut v).await?.then_some(v))
    }

    async fn get_inner<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        mut desc: Arc<Desc>,
        key: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<bool, CuckooError> {
        let mut loc = self.locate(&desc, key);
        if self.cached_get(ctx, &desc, &loc, key, out).await? {
            return Ok(true);
        }
        'attempt: for attempt in 0..MAX_ATTEMPTS {
            if attempt > 0 {
                self.stats.retries += 1;
            }
            if self.view_old(ctx) {
                // A table that may grow: confirm the descriptor (grow.rs).
                desc = self.refresh(ctx).await?;
                loc = self.locate(&desc, key);
            }
            self.known.clear();
            let t = ctx.now_ns();
            let a = self.collect(ctx, &desc, &loc).await?;
            // Committed words that may be the key's, in canonical order;
            // a Forward word and the Normal word it moved to name one
            // entry, READ once. Each with the first position naming it.
            let mut cands = [None::<EntryRef>; POSITIONS];
            let mut at = [0usize; POSITIONS];
            let mut n = 0;
            for p in 0..loc.positions() {
                let s = a.slot(p);
                // (At most a batch of them: more than 16 entries of one
                // fingerprint in a key's buckets would be a 2^-100 event.)
                if s.is_committed()
                    && s.fp() == loc.fp
                    && !cands[..n].contains(&Some(s.eref()))
                    && n < MAX_BATCH
                {
                    cands[n] = Some(s.eref());
                    at[n] = p;
                    n += 1;
                }
            }
            if n > 0 {
                let mut b = ctx.batch();
                let mut ops = [None::<OpId>; POSITIONS];
                for (i, e) in cands[..n].iter().flatten().enumerate() {
                    ops[i] = Some(b.read_new(e.addr(), e.bytes()));
                }
                let mut d = b.submit().await?;
                let mut torn = false;
                for (i, e) in cands[..n].iter().flatten().enumerate() {
                    let buf = d.take_buf(ops[i].expect("filled"));
                    match judge(buf.as_slice(), key) {
                        Verdict::Key => {
                            // The slot held the key's value when it was read
                            // (after t); the entry is that value if it was
                            // read within W (mod.rs, Reclamation).
                            if !self.in_window(ctx, t) {
                                continue 'attempt;
                            }
                            let (_, v) = super::layout::decode_entry(buf.as_slice(), key.len())
                                .expect("judged");
                            out.clear();
                            out.extend_from_slice(v);
                            let p = at[i];
                            self.table.put_place(key, p, a.slot(p).0, t);
                            return Ok(true);
                        }
                        Verdict::Other => {
                            self.stats.fp_false_matches += 1;
                            self.known.put(*e, Verdict::Other, t, 0);
                        }
                        Verdict::Bad => torn = true,
                    }
                }
                if torn {
                    self.stats.torn_entries += 1;
                    continue 'attempt;
                }
            }
            // Not seen: only a snapshot can say absent (the key may have
            // been moving between the buckets while they were read).
            let snap = self.snapshot(ctx, &desc, &loc, key, Some((a, t))).await?;
            match self.presence(&snap, &loc) {
                Plan::Absent if self.in_window(ctx, snap.t0) => return Ok(false),
                Plan::Torn => self.stats.torn_entries += 1,
                // Present now, or the window ran out: read again.
                _ => {}
            }
        }
        Err(CuckooError::Contention)
    }

    /// Inserts `key` or replaces its value. An update takes three round
    /// trips, an insert four, when the buckets are quiet. Fails with
    /// [`CuckooError::TableFull`] when no slot can be made within the
    /// displacement bound, `KeySize` or `ValueTooLarge` for bad input
    /// (nothing written), `Alloc` when no memory is left for the entry,
    /// and as [`get_into`](Self::get_into) does otherwise; after a `Verb`
    /// error the put's effect is unknown.
    pub async fn put<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), CuckooError> {
        crate::scratch_scoped!(ctx, self.put_unscoped(ctx, key, value))
    }

    async fn put_unscoped<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), CuckooError> {
        self.check_key(key)?;
        let max = self.cfg().max_value_bytes;
        if value.len() > max {
            return Err(CuckooError::ValueTooLarge {
                max,
                got: value.len(),
            });
        }
        let desc = self.open(ctx).await?;
        let rt0 = ctx.counters().round_trips;
        let r = self.put_inner(ctx, desc, key, value).await;
        self.stats.puts += 1;
        self.stats.put_round_trips += ctx.counters().round_trips - rt0;
        // After the put's own round trips are counted: lending is not the
        // put's work, and the put's outcome stands whatever it meets.
        if self.lend_due(ctx.now_ns()) {
            self.lend_surplus(ctx).await;
        }
        r
    }

    async fn put_inner<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        mut desc: Arc<Desc>,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), CuckooError> {
        let mut loc = self.locate(&desc, key);
        let lines = entry_lines(key.len(), value.len());
        encode_entry(&mut self.ebuf, key, value);
        // The entry goes beside the slot that will name it (mod.rs,
        // "Cached gets"): where the key was last seen, else beside its
        // first bucket; an insert that claims a slot elsewhere moves it.
        let near = match self.table.place_of(key) {
            Some(place) if place.pos < loc.positions() => slot_addr(&desc, &loc, place.pos).node(),
            _ => desc.bucket_addr(loc.place_buckets()[0]).node(),
        };
        let mut v = self.alloc_entry(ctx, lines, near, true).await?;
        let mut written = false;
        let mut room_rounds = 0;
        for attempt in 0..MAX_ATTEMPTS {
            if attempt > 0 {
                self.stats.retries += 1;
            }
            if self.view_old(ctx) {
                // A table that may grow: confirm the descriptor (grow.rs).
                desc = self.refresh(ctx).await?;
                loc = self.locate(&desc, key);
            }
            self.known.clear();
            // The new entry is written out of place first, in the doorbell
            // of the first collect; it is immutable from here on.
            let t = ctx.now_ns();
            let a = {
                let mut b = ctx.batch();
                if !written {
                    b.write_bytes(v.addr(), &self.ebuf);
                }
                let c = push_collect(&mut b, &desc, &loc);
                let mut d = b.submit().await?;
                take_collect(&mut d, c)
            };
            written = true;
            let relevant = (0..loc.positions()).any(|p| Self::matches(&loc, a.slot(p)));
            let outcome = if !relevant {
                // Nothing with the key's fingerprint: claim a slot at once;
                // the insert's own snapshot will catch a key that was
                // moving past this collect.
                self.insert(ctx, &desc, &loc, key, a, &mut v).await?
            } else {
                let snap = self.snapshot(ctx, &desc, &loc, key, Some((a, t))).await?;
                match self.plan(&snap, &loc)? {
                    Plan::Torn => {
                        self.stats.torn_entries += 1;
                        continue;
                    }
                    Plan::Resolve(p) => {
                        self.resolve(ctx, &desc, &loc, &snap, p).await?;
                        continue;
                    }
                    Plan::Present(p)
                        if desc.phase == Phase::Placing
                            && !loc.place_buckets().contains(&bucket_of(&loc, p))
                            && self
                                .move_up_to_update(ctx, &desc, &loc, p, snap.pair.slot(p))
                                .await? =>
                    {
                        // Moved up where the split walk would have put it
                        // (grow.rs): the next attempt updates it there.
                        continue;
                    }
                    Plan::Present(p) => {
                        // Update: the one committed copy, swung by one CAS.
                        // An entry apart from the slot is copied beside
                        // it, written just before the CAS on the slot's
                        // queue pair: it has landed when the CAS makes it
                        // visible.
                        let at = slot_addr(&desc, &loc, p);
                        let moved = self.move_beside(ctx, &mut v, at).await;
                        if !self.in_window(ctx, snap.t0) {
                            // The moved entry is not written yet: the next
                            // attempt writes it.
                            written &= !moved;
                            continue;
                        }
                        let old = snap.pair.slot(p);
                        let new = Slot::entry(State::Normal, loc.fp, v);
                        let t_cas = ctx.now_ns();
                        let bytes = moved.then(|| self.ebuf.clone());
                        let pre = bytes.as_deref().map(|b| (v.addr(), b));
                        let got = self.cas_word_after(ctx, pre, at, old, new).await?;
                        if got == old {
                            self.retire(ctx, old.eref());
                            self.stats.updates += 1;
                            self.table.put_place(key, p, new.0, t_cas);
                            return Ok(());
                        }
                        let old_sum = self.known.sum(old.eref());
                        if self.eliminated(ctx, key, &loc, got, old_sum, t_cas).await? {
                            // Never seen by anyone: reusable at once.
                            self.give_back(v);
                            return Ok(());
                        }
                        continue;
                    }
                    Plan::Absent => {
                        self.insert(ctx, &desc, &loc, key, snap.pair, &mut v)
                            .await?
                    }
                }
            };
            match outcome {
                Ins::Done => return Ok(()),
                Ins::Retry => {}
                Ins::Burnt => {
                    self.retire(ctx, v);
                    v = self.alloc_entry(ctx, lines, near, true).await?;
                    written = false;
                    ctx.yield_now().await;
                }
                Ins::Wait => {
                    // Drive the growth to its end (or wait for whoever
                    // does), then insert on the new view.
                    match self.grow(ctx, &desc).await {
                        Ok(d) => desc = d,
                        Err(e) => {
                            self.give_back(v);
                            return Err(e);
                        }
                    }
                    self.stats.insert_waits += 1;
                    loc = self.locate(&desc, key);
                }
                Ins::NoRoom(view) => {
                    room_rounds += 1;
                    let r = if room_rounds > MAX_ROOM_ROUNDS {
                        Err(CuckooError::TableFull)
                    } else {
                        self.make_room(ctx, &desc, &loc, *view).await
                    };
                    let r = match r {
                        // Grow instead, while the table may (grow.rs),
                        // and try again on the descriptor it leads to.
                        Err(CuckooError::TableFull)
                            if desc.growing() || desc.level < desc.max_level =>
                        {
                            room_rounds = 0;
                            self.grow(ctx, &desc).await.map(|d| {
                                desc = d;
                                loc = self.locate(&desc, key);
                            })
                        }
                        r => r,
                    };
                    if let Err(e) = r {
                        if matches!(e, CuckooError::TableFull) {
                            self.stats.table_full += 1;
                        }
                        // Never seen by anyone: reusable at once.
                        self.give_back(v);
                        return Err(e);
                    }
                }
            }
        }
        Err(CuckooError::Contention)
    }

    /// The insert protocol (mod.rs, "insert") from a collect or snapshot
    /// `view` without a committed copy: claim an empty slot Tentative,
    /// snapshot, settle with other claimants, commit. An entry `v` on
    /// another node than the slot claimed is replaced by a copy beside
    /// the slot (and `v` given back: no slot ever named it).
    async fn insert<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        desc: &Desc,
        loc: &Reach,
        key: &[u8],
        view: Pair,
        v: &mut EntryRef,
    ) -> Result<Ins, CuckooError> {
        if desc.phase == Phase::Placing {
            return Ok(Ins::Wait);
        }
        // Of the two buckets new words go to, the one with more empty
        // slots (load balance), its first one.
        let empties = |h: usize| {
            (0..SLOTS)
                .filter(|&i| view.slot(h * SLOTS + i).is_empty())
                .count()
        };
        let [h0, h1] = loc.place();
        let half = if empties(h1) > empties(h0) { h1 } else { h0 };
        let Some(x) = (half * SLOTS..(half + 1) * SLOTS).find(|&p| view.slot(p).is_empty()) else {
            return self.clear_stale(ctx, desc, loc, view).await;
        };
        let x_at = slot_addr(desc, loc, x);
        let moved = self.move_beside(ctx, v, x_at).await;
        let mine = Slot::entry(State::Tentative, loc.fp, *v);
        let t = ctx.now_ns();
        let (ok, c) = {
            // The CAS goes first: on X's queue pair the READ of X's bucket
            // runs after it, so the collect sees the claim if it succeeded.
            // A moved entry is written just before it, on the same queue
            // pair, so it has landed when the claim takes effect: anyone
            // who sees the claim (another insert of the key judges it by
            // its entry) reads the entry whole.
            let mut b = ctx.batch();
            if moved {
                b.write_bytes(v.addr(), &self.ebuf);
            }
            let cas = b.cas(x_at, view.0[x], mine.0);
            let c = push_collect(&mut b, desc, loc);
            let mut d = b.submit().await?;
            (d.old(cas) == view.0[x], take_collect(&mut d, c))
        };
        self.after_cas()?;
        if !ok {
            self.stats.cas_failures += 1;
            return Ok(Ins::Retry);
        }
        let mut first = Some((c, t));
        for _ in 0..MAX_ATTEMPTS {
            if self.view_lapsed(ctx) {
                // A table that may grow, and this view is too old to act
                // on (grow.rs): give the claim up; the put starts over on
                // a confirmed one.
                self.withdraw(ctx, desc, loc, x, mine).await?;
                return Ok(Ins::Burnt);
            }
            let snap = self.snapshot(ctx, desc, loc, key, first.take()).await?;
            if snap.pair.slot(x) != mine {
                // Cleared by a competing insert or a cleaner.
                return Ok(Ins::Burnt);
            }
            match self.plan(&snap, loc)? {
                Plan::Torn => {
                    self.stats.torn_entries += 1;
                    continue;
                }
                Plan::Resolve(p) => {
                    self.resolve(ctx, desc, loc, &snap, p).await?;
                    continue;
                }
                Plan::Present(_) => {
                    // Inserted meanwhile by someone else (or found moving):
                    // withdraw, and update that copy on the next attempt.
                    self.stats.withdrawals += 1;
                    self.withdraw(ctx, desc, loc, x, mine).await?;
                    return Ok(Ins::Burnt);
                }
                Plan::Absent => {}
            }
            // Other claims on the key: the earliest position wins.
            let mut changed = false;
            for q in 0..loc.positions() {
                let s = snap.pair.slot(q);
                if q == x
                    || s.state() != State::Tentative
                    || s.fp() != loc.fp
                    || self.known.get(s.eref()) != Some(Verdict::Key)
                {
                    continue;
                }
                if q < x && !self.is_stale(s, ctx.now_ns()) {
                    self.stats.yields += 1;
                    self.withdraw(ctx, desc, loc, x, mine).await?;
                    return Ok(Ins::Burnt);
                }
                let e = self.empty_word()?;
                if self.cas(ctx, slot_addr(desc, loc, q), s, e).await? {
                    self.stats.kills += 1;
                }
                changed = true;
            }
            if changed || !self.in_window(ctx, snap.t0) {
                continue;
            }
            let done = mine.with_state(State::Normal);
            let t_cas = ctx.now_ns();
            if self.cas(ctx, slot_addr(desc, loc, x), mine, done).await? {
                self.stats.inserts += 1;
                self.table.put_place(key, x, done.0, t_cas);
                return Ok(Ins::Done);
            }
            return Ok(Ins::Burnt);
        }
        Err(CuckooError::Contention)
    }

    /// Puts the entry `v` (never named by a slot yet) beside the slot at
    /// `at` (mod.rs, "Cached gets"): when it lies on another node, a block
    /// on the slot's node takes its place and `v` is given back. Whether
    /// it moved; the caller then writes the entry to the new block just
    /// before its CAS on the slot, on the same queue pair. When the
    /// slot's node has no memory (or no block can be had at all), the
    /// entry stays apart and its cached gets keep the age bound.
    async fn move_beside<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        v: &mut EntryRef,
        at: GlobalAddr,
    ) -> bool {
        if v.addr().node() == at.node() || !self.cfg().ordered_reads {
            return false;
        }
        match self.alloc_entry(ctx, v.lines(), at.node(), false).await {
            Ok(near) if near.addr().node() == at.node() => {
                self.give_back(*v);
                *v = near;
                self.stats.entries_moved += 1;
                true
            }
            Ok(elsewhere) => {
                self.give_back(elsewhere);
                false
            }
            Err(_) => false,
        }
    }

    /// Elimination of an update that lost its CAS (`got` is what the slot
    /// held instead). If that word is committed and names an entry of the
    /// same key whose checksum differs from the value the snapshot showed
    /// (`old_sum`), then a put of the key took effect after our snapshot and
    /// before our CAS, both inside our put's interval: our put is
    /// linearized just before it, its value overwritten before anyone
    /// could read it, and it is done without retrying (one entry READ
    /// instead of a retry's three or more round trips; what keeps a hot
    /// key's updates from starving). The entry is read within W of the
    /// CAS, so it is the one the word named.
    async fn eliminated<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        key: &[u8],
        loc: &Reach,
        got: Slot,
        old_sum: Option<u64>,
        t_cas: u64,
    ) -> Result<bool, CuckooError> {
        let Some(old_sum) = old_sum else {
            return Ok(false);
        };
        if !got.is_committed() || got.fp() != loc.fp {
            return Ok(false);
        }
        let e = got.eref();
        let buf = ctx.read(e.addr(), e.bytes()).await?;
        if !self.in_window(ctx, t_cas) || judge(buf.as_slice(), key) != Verdict::Key {
            return Ok(false);
        }
        let changed = entry_sum(buf.as_slice()) != old_sum;
        if changed {
            self.stats.eliminated += 1;
        }
        Ok(changed)
    }

    /// Clears our own claim at `x` (it may already be gone).
    async fn withdraw<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        desc: &Desc,
        loc: &Reach,
        x: usize,
        mine: Slot,
    ) -> Result<(), CuckooError> {
        let e = self.empty_word()?;
        self.cas(ctx, slot_addr(desc, loc, x), mine, e).await?;
        Ok(())
    }

    /// Both buckets full: clear Tentative words left unchanged for
    /// `stale_ns` (by clients that stopped), else ask for displacement.
    async fn clear_stale<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        desc: &Desc,
        loc: &Reach,
        view: Pair,
    ) -> Result<Ins, CuckooError> {
        let mut cleared = false;
        for p in 0..loc.positions() {
            let s = view.slot(p);
            if s.state() == State::Tentative && self.is_stale(s, ctx.now_ns()) {
                let e = self.empty_word()?;
                if self.cas(ctx, slot_addr(desc, loc, p), s, e).await? {
                    self.stats.kills += 1;
                    cleared = true;
                }
            }
        }
        Ok(if cleared {
            Ins::Retry
        } else {
            Ins::NoRoom(Box::new(view))
        })
    }

    /// Removes `key`; whether it was present. Three round trips when
    /// present and quiet, two when absent. Fails with
    /// [`CuckooError::KeySize`] for a key of the wrong size, and as
    /// [`get_into`](Self::get_into) does otherwise; after a `Verb` error
    /// the delete's effect is unknown.
    pub async fn delete<N: Nic>(&mut self, ctx: &Ctx<N>, key: &[u8]) -> Result<bool, CuckooError> {
        crate::scratch_scoped!(ctx, self.delete_unscoped(ctx, key))
    }

    async fn delete_unscoped<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        key: &[u8],
    ) -> Result<bool, CuckooError> {
        self.check_key(key)?;
        let desc = self.open(ctx).await?;
        let rt0 = ctx.counters().round_trips;
        let r = self.delete_inner(ctx, desc, key).await;
        self.stats.deletes += 1;
        self.stats.delete_round_trips += ctx.counters().round_trips - rt0;
        if self.lend_due(ctx.now_ns()) {
            self.lend_surplus(ctx).await;
        }
        r
    }

    async fn delete_inner<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        mut desc: Arc<Desc>,
        key: &[u8],
    ) -> Result<bool, CuckooError> {
        let mut loc = self.locate(&desc, key);
        for attempt in 0..MAX_ATTEMPTS {
            if attempt > 0 {
                self.stats.retries += 1;
            }
            if self.view_old(ctx) {
                // A table that may grow: confirm the descriptor (grow.rs).
                desc = self.refresh(ctx).await?;
                loc = self.locate(&desc, key);
            }
            self.known.clear();
            let snap = self.snapshot(ctx, &desc, &loc, key, None).await?;
            match self.plan(&snap, &loc)? {
                Plan::Torn => self.stats.torn_entries += 1,
                Plan::Resolve(p) => self.resolve(ctx, &desc, &loc, &snap, p).await?,
                Plan::Absent => {
                    if self.in_window(ctx, snap.t0) {
                        return Ok(false);
                    }
                }
                Plan::Present(p) => {
                    if !self.in_window(ctx, snap.t0) {
                        continue;
                    }
                    let old = snap.pair.slot(p);
                    let e = self.empty_word()?;
                    if self.cas(ctx, slot_addr(&desc, &loc, p), old, e).await? {
                        self.retire(ctx, old.eref());
                        self.table.forget_place(key);
                        return Ok(true);
                    }
                }
            }
        }
        Err(CuckooError::Contention)
    }
}
