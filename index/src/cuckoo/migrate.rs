//! Moving entries to their other bucket (Nessie's migration), finishing or
//! undoing moves others left behind, and the displacement search that
//! frees a slot when both of a key's buckets are full.
//!
//! A move of Normal(w) from slot S to an empty slot D of the entry's other
//! bucket is four CASes, each changing one slot (mod.rs, "move"):
//! 1. write a copy x of the entry; D: Empty → Tentative(x) (with the WRITE);
//! 2. S: Normal(w) → Forward(x) — the commit; on failure D is cleared;
//! 3. D: Tentative(x) → Normal(x);
//! 4. S: Forward(x) → Empty.
//!
//! A client that stops after step 1 leaves a Tentative word that no reader
//! sees and anyone may clear; after 2 or 3, a Forward word that anyone
//! acting on a key of its fingerprint resolves (`CuckooClient::resolve`). The copy
//! makes every word of the move new to its slot, which the snapshots rest
//! on; it costs one WRITE per hop, on a path taken only when buckets fill.
//!
//! Displacement is a breadth-first search over the cuckoo graph: from the
//! key's two buckets, each Normal word's other bucket (computed from its
//! bucket and fingerprint, no entry READ), up to 16 bucket READs per
//! doorbell, until a bucket with an empty slot turns up or
//! `max_search_buckets` were read (then `TableFull`). The path is carried
//! out from its far end, so each move's destination is the slot the
//! previous move emptied; any move that fails aborts the path and the
//! insert starts over on fresh reads.

use super::layout::{decode_entry, Desc, Phase, Slot, State, SLOTS};
use super::place::{alt_at, Loc};
use super::view::{push_collect, slot_addr, take_collect, Pair, Plan, Reach};
use super::{CuckooClient, CuckooError, PATH_HIST};
use nicdrv::exec::MAX_BATCH;
use nicdrv::{Ctx, GlobalAddr, Nic, OpId};

/// One bucket reached by the search.
struct Reached {
    bucket: u64,
    words: [u64; SLOTS],
    /// Index of the bucket whose entry moves here, and that entry's slot.
    parent: Option<(usize, usize)>,
}

impl CuckooClient {
    /// Finishes or undoes the move whose Forward word the snapshot shows
    /// at position `p` of `loc`'s buckets (the copy it names lies in the
    /// other bucket of the pair, or while the table grows in a bucket of
    /// the key at the other level: same fingerprint, so among those read).
    ///
    /// While new words go to the upper level (`Phase::Placing`), a copy is
    /// turned Normal only where it belongs: in a bucket of the key at
    /// that level. Otherwise it is cleared and the move undone (always
    /// safe, `mod.rs`): a move begun in the `Reading` phase must not commit
    /// into a bucket the split walk (`grow.rs`) has already passed.
    pub(super) async fn resolve<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        desc: &Desc,
        loc: &Reach,
        snap: &super::view::Snap,
        p: usize,
    ) -> Result<(), CuckooError> {
        let f = snap.pair.slot(p);
        debug_assert_eq!(f.state(), State::Forward);
        if !self.in_window(ctx, snap.t0) {
            return Ok(());
        }
        self.stats.helps += 1;
        let x = f.eref();
        let copy = (0..loc.positions())
            .find(|&q| q != p && !snap.pair.slot(q).is_empty() && snap.pair.slot(q).eref() == x);
        let at = slot_addr(desc, loc, p);
        match copy.map(|q| (q, snap.pair.slot(q).state())) {
            Some((q, State::Tentative))
                if desc.phase == Phase::Placing
                    && !self
                        .known
                        .home(x)
                        .is_some_and(|h| h.contains(&super::view::bucket_of(loc, q))) =>
            {
                // Not where the entry's key now belongs (or not known):
                // undo. The next snapshot finds no copy and puts the
                // Forward word back to Normal.
                let t = snap.pair.slot(q);
                let e = self.empty_word()?;
                if self.cas(ctx, slot_addr(desc, loc, q), t, e).await? {
                    self.stats.kills += 1;
                }
            }
            Some((q, State::Tentative)) => {
                // Step 3 then 4 on the mover's behalf.
                let t = snap.pair.slot(q);
                if self
                    .cas(ctx, slot_addr(desc, loc, q), t, t.with_state(State::Normal))
                    .await?
                {
                    let e = self.empty_word()?;
                    self.cas(ctx, at, f, e).await?;
                }
            }
            Some((_, State::Normal)) => {
                let e = self.empty_word()?;
                self.cas(ctx, at, f, e).await?;
            }
            Some(_) => {
                return Err(CuckooError::Corrupt {
                    what: "an entry named by two Forward words",
                })
            }
            None => {
                // The tentative copy was cleared before it turned Normal:
                // the value stays where it is.
                self.cas(ctx, at, f, f.with_state(State::Normal)).await?;
            }
        }
        Ok(())
    }

    /// Moves the Normal word `w` at slot `from_slot` of `from_bucket` to
    /// its other bucket, into `to_slot` if that is empty, else any empty
    /// slot there. While the table grows, a word whose key does not
    /// belong in `from_bucket` at the level new words go to is moved into
    /// either bucket of the key at that level instead (the split walk's
    /// move, `grow.rs`), and `to_slot` is only a preference. Whether it
    /// moved; a failure leaves the table as it was (or with a concurrent
    /// change finished).
    pub(super) async fn migrate<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        desc: &Desc,
        from_bucket: u64,
        from_slot: usize,
        w: Slot,
        to_slot: usize,
    ) -> Result<bool, CuckooError> {
        let fp = w.fp();
        // The pair seen from the moving entry: its bucket first.
        let pair = Reach::pair(Loc {
            b1: from_bucket,
            b2: alt_at(from_bucket, fp, desc.base_buckets, desc.place_level()),
            fp,
        });
        let s_pos = from_slot;
        let e = w.eref();
        self.known.clear();
        let t = ctx.now_ns();
        let (entry, a) = {
            let mut b = ctx.batch();
            let op = b.read_new(e.addr(), e.bytes());
            let c = push_collect(&mut b, desc, &pair);
            let mut d = b.submit().await?;
            (d.take_buf(op), take_collect(&mut d, c))
        };
        if a.slot(s_pos) != w {
            return Ok(false);
        }
        let Some((key, _)) = decode_entry(entry.as_slice(), desc.key_bytes) else {
            // The search read an old word; the slot changed since.
            return Ok(false);
        };
        let key = key.to_vec();
        let copy = entry.as_slice().to_vec();
        drop(entry);
        let home = Reach::of(desc, &key);
        let Some(s_bucket) = home.index_of(from_bucket).filter(|_| home.fp == fp) else {
            return Err(CuckooError::Corrupt {
                what: "an entry in a bucket its key does not hash to",
            });
        };
        // A stable table's key has the two buckets just read (in another
        // order: the moving entry's first). A growing one's may have more,
        // and every one of them is snapshot in the key's own order.
        let same =
            home.buckets().len() == 2 && pair.buckets().iter().all(|b| home.index_of(*b).is_some());
        let (loc, s_pos, first) = if same {
            (pair, s_pos, Some((a, t)))
        } else {
            (home, s_bucket * SLOTS + from_slot, None)
        };
        let snap = self.snapshot(ctx, desc, &loc, &key, first).await?;
        if snap.pair.slot(s_pos) != w {
            return Ok(false);
        }
        match self.plan(&snap, &loc)? {
            Plan::Present(p) if p == s_pos => {}
            Plan::Resolve(p) => {
                self.resolve(ctx, desc, &loc, &snap, p).await?;
                return Ok(false);
            }
            _ => return Ok(false),
        }
        // Where it may go: the other bucket new words go to, or (a word
        // outside them: moving up in the split walk) either of them; the
        // preferred slot first.
        let to_bucket = pair.buckets()[1];
        let dests = loc.place_buckets();
        let allowed = |p: usize| {
            let b = loc.buckets()[p / SLOTS];
            b != from_bucket && dests.contains(&b) && snap.pair.slot(p).is_empty()
        };
        let preferred = loc.index_of(to_bucket).map(|h| h * SLOTS + to_slot);
        let d_pos = match preferred.filter(|&p| allowed(p)) {
            Some(p) => p,
            None => match (0..loc.positions()).find(|&p| allowed(p)) {
                Some(p) => p,
                None => return Ok(false),
            },
        };
        let d_old = snap.pair.slot(d_pos);
        if !self.in_window(ctx, snap.t0) {
            return Ok(false);
        }
        let (s_at, d_at) = (slot_addr(desc, &loc, s_pos), slot_addr(desc, &loc, d_pos));
        // The copy lies beside its new slot (mod.rs, "Cached gets").
        let x = self.alloc_entry(ctx, e.lines(), d_at.node(), false).await?;
        let tent = Slot::entry(State::Tentative, fp, x);
        // Step 1: the copy and the claim in one doorbell, on D's queue pair
        // (the copy lies beside D), so the copy lands before the claim.
        // Where D's node had no memory the copy lies elsewhere and the
        // claim may be seen first; it is Tentative, so no reader follows
        // it, and the commit below comes after both completed.
        let claimed = {
            let mut b = ctx.batch();
            b.write_bytes(x.addr(), &copy);
            let cas = b.cas(d_at, d_old.0, tent.0);
            let d = b.submit().await?;
            d.old(cas) == d_old.0
        };
        self.after_cas()?;
        if !claimed {
            self.stats.cas_failures += 1;
            self.give_back(x);
            return Ok(false);
        }
        // Step 2, the commit, only while the snapshot still holds.
        let committed = self.in_window(ctx, snap.t0)
            && self
                .cas(ctx, s_at, w, Slot::entry(State::Forward, fp, x))
                .await?;
        if !committed {
            let e2 = self.empty_word()?;
            self.cas(ctx, d_at, tent, e2).await?;
            // Seen as Tentative: it waits out the grace period.
            self.retire(ctx, x);
            return Ok(false);
        }
        // w is named by no slot now (the snapshot showed no Forward word
        // of this fingerprint, so none names w).
        self.retire(ctx, e);
        self.finish_move(ctx, desc, &loc, &key, (s_at, d_at), tent)
            .await
    }

    /// Steps 3 and 4 of a move whose commit succeeded: the copy at `d_at`
    /// turns Normal, then the Forward word at `s_at` is cleared. If 3
    /// fails, someone finished it for us or cleared the copy; a fresh
    /// snapshot tells which, and resolving the Forward word (if still
    /// there) settles it. Whether this client completed the move.
    async fn finish_move<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        desc: &Desc,
        loc: &Reach,
        key: &[u8],
        (s_at, d_at): (GlobalAddr, GlobalAddr),
        tent: Slot,
    ) -> Result<bool, CuckooError> {
        let fwd = tent.with_state(State::Forward);
        if self
            .cas(ctx, d_at, tent, tent.with_state(State::Normal))
            .await?
        {
            let e3 = self.empty_word()?;
            self.cas(ctx, s_at, fwd, e3).await?;
            self.stats.moves += 1;
            return Ok(true);
        }
        self.known.clear();
        let snap = self.snapshot(ctx, desc, loc, key, None).await?;
        if let Plan::Resolve(p) = self.plan(&snap, loc)? {
            self.resolve(ctx, desc, loc, &snap, p).await?;
        }
        Ok(false)
    }

    /// Frees a slot in one of `loc`'s buckets by a chain of moves found
    /// breadth first from `view` (the buckets as last read). `Ok` when the
    /// insert should try again (a path was carried out or a move lost a
    /// race), `TableFull` when no path exists within the bound.
    pub(super) async fn make_room<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        desc: &Desc,
        loc: &Reach,
        view: Pair,
    ) -> Result<(), CuckooError> {
        let max = self.cfg().max_search_buckets;
        let mut seen: Vec<Reached> = Vec::with_capacity(64);
        let (base, place_level) = (desc.base_buckets, desc.place_level());
        for (h, bucket) in loc.place().into_iter().zip(loc.place_buckets()) {
            let mut words = [0u64; SLOTS];
            words.copy_from_slice(&view.0[h * SLOTS..(h + 1) * SLOTS]);
            seen.push(Reached {
                bucket,
                words,
                parent: None,
            });
        }
        let mut level = 0..seen.len();
        while seen.len() < max {
            // The next level: each Normal word's other bucket, once.
            let mut next: Vec<(u64, usize, usize)> = Vec::new();
            for i in level.clone() {
                for (j, &w) in seen[i].words.iter().enumerate() {
                    let s = Slot(w);
                    if s.state() != State::Normal {
                        continue;
                    }
                    let c = alt_at(seen[i].bucket, s.fp(), base, place_level);
                    if !seen.iter().any(|r| r.bucket == c) && !next.iter().any(|n| n.0 == c) {
                        next.push((c, i, j));
                    }
                }
            }
            next.truncate(max - seen.len());
            if next.is_empty() {
                break;
            }
            let start = seen.len();
            for group in next.chunks(MAX_BATCH) {
                let mut b = ctx.batch();
                let mut ops = [None::<OpId>; MAX_BATCH];
                for (k, &(c, _, _)) in group.iter().enumerate() {
                    ops[k] = Some(b.read_new(desc.bucket_addr(c), SLOTS * 8));
                }
                let mut d = b.submit().await?;
                self.stats.search_buckets += group.len() as u64;
                for (k, &(c, i, j)) in group.iter().enumerate() {
                    let buf = d.take_buf(ops[k].expect("filled"));
                    let mut words = [0u64; SLOTS];
                    for (s, w) in words.iter_mut().enumerate() {
                        *w = buf.u64_at(s * 8);
                    }
                    seen.push(Reached {
                        bucket: c,
                        words,
                        parent: Some((i, j)),
                    });
                }
                let found = (start..seen.len()).find_map(|r| {
                    seen[r]
                        .words
                        .iter()
                        .position(|&w| Slot(w).is_empty())
                        .map(|e| (r, e))
                });
                if let Some((r, e)) = found {
                    return self.carry_out(ctx, desc, &seen, r, e).await;
                }
            }
            level = start..seen.len();
        }
        Err(CuckooError::TableFull)
    }

    /// Carries out the path ending at bucket `seen[r]`'s empty slot `e`,
    /// far end first.
    async fn carry_out<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        desc: &Desc,
        seen: &[Reached],
        r: usize,
        e: usize,
    ) -> Result<(), CuckooError> {
        let mut hops = 0u64;
        let (mut at, mut to) = (r, e);
        while let Some((p, j)) = seen[at].parent {
            let w = Slot(seen[p].words[j]);
            if !self.migrate(ctx, desc, seen[p].bucket, j, w, to).await? {
                self.stats.aborted_moves += 1;
                return Ok(());
            }
            hops += 1;
            at = p;
            to = j;
        }
        self.stats.displacements += 1;
        self.stats.path_len_hist[(hops as usize).min(PATH_HIST - 1)] += 1;
        self.stats.max_path_len = self.stats.max_path_len.max(hops);
        Ok(())
    }
}
