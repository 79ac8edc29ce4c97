//! Online growth: the table doubles while clients keep reading and writing
//! it, with no pause, no memory-node CPU and no client that others must
//! wait for.
//!
//! # Splitting, not copying
//! A table grown `l` times from `B0` buckets has `B = B0 << l`. A key's
//! first bucket at level `l + 1` is its first at `l` or that plus `B`, and
//! so is its other bucket (`place::locate_at`, `place::alt_at`): doubling
//! splits every bucket in two. Buckets `0..B` keep their memory; the new
//! segments hold `B..2B`, zero (Empty) when allocated. Only the keys whose
//! bucket at `l + 1` is the upper copy move: about half.
//!
//! # Phases
//! The root word names an immutable descriptor; each phase is a new one,
//! published by one CAS on the root word:
//! 1. **Stable(l)**: keys are read and placed at level `l`.
//! 2. **Reading**: the new segments exist. Operations read the key's
//!    buckets at `l` and at `l + 1` (`view::Reach`, two to four buckets)
//!    and still place new words at `l`.
//! 3. **Placing**: operations read both levels and place new words at
//!    `l + 1` only. The split walk moves every committed word that lies
//!    outside its key's buckets at `l + 1` there, by the ordinary move
//!    (`migrate`: Tentative copy, Forward, Normal, Empty), so every step is
//!    one CAS anyone can finish or undo.
//! 4. **Stable(l + 1)**, once a walk has passed every bucket `0..B`.
//!
//! # Why clients of different phases agree
//! A client acts on the descriptor it read only while the root READ that
//! confirmed it was posted less than R + W ago (`CuckooClient::in_window`;
//! R is `view_lease_ns`), and a CAS lands within G − W of being posted
//! (the bounded delay the reclamation argument already assumes). A client
//! confirming descriptor `k` read the root before descriptor `k + 1` was
//! published at `T`, so nothing it does lands after `T + R + G`. Each phase
//! is published, and the walk started, at least R + G + W
//! (`CuckooConfig::phase_gap_ns`) after the publisher first knew the
//! previous one; so at any instant only clients of two neighbouring phases
//! act:
//! - Stable(l) and Reading place at `l`; Reading reads more buckets, which
//!   nobody places in yet.
//! - Reading and Placing read the same buckets in the same order; each
//!   level's first bucket comes before its other, so neighbouring phases
//!   agree on the order of every slot both read (the insert's tie-break).
//!   No Stable(l) client is left when words start going to the upper copies
//!   a Stable(l) client would not read.
//! - The walk starts when no Reading client is left, so nothing is placed at
//!   `l` after it; what it moved up stays up. While new words go up, a
//!   Forward word is finished only into a bucket where its key belongs at
//!   `l + 1`, and otherwise undone (`resolve`): a move begun in Reading
//!   cannot complete into a bucket the walk has passed. A word moved up by
//!   the walk is never undone back: its copy lies where its key belongs.
//! - Placing and Stable(l + 1) place at `l + 1`; when Stable(l + 1) is
//!   published every committed word lies at `l + 1`, so reading only there
//!   misses nothing.
//!
//! # Inserts wait
//! A put of a new key that meets the Placing phase drives the growth to
//! its end before it inserts. The walk must find room at `l + 1` for
//! every word still at `l`; inserts in Placing took that room (12 clients
//! filling a 256-slot level while its walk waited out the gap left it
//! full, with misplaced words no move could place). Without them, level
//! `l + 1` holds at most what level `l` could: half full, where moves
//! always find room. Reading-phase inserts go to level `l`, which the
//! same bound covers. Gets, updates and deletes never wait.
//!
//! # Updates move what the walk has yet to
//! An update in Placing, once the walk has begun, that finds its key's
//! word outside the key's upper buckets moves it up first, by the walk's
//! move (`move_up_to_update`), then updates it there. A key updated
//! faster than a move takes would otherwise change the word under every
//! commit CAS the walk tried, and the walk would never pass its bucket.
//! It costs that one update the move's round trips, once per word.
//!
//! # Who drives it
//! A put that finds no room (the displacement search failed) while the
//! table may still grow starts a growth (allocates the segments, publishes
//! Reading), and any put that finds no room while the table grows drives
//! it on: it waits out the gap since it first knew the current phase,
//! walks if it is Placing, and publishes the next phase. Racing drivers
//! agree through the root CAS. Walkers share the walk: they claim groups
//! of 8 buckets with an FAA on a line the Placing descriptor names and
//! count the groups done with another; a walker that finds the count
//! stuck walks every group itself, since walking a clean group again
//! changes nothing. A driver that stops blocks nobody: the next put that
//! needs room carries on. Gets, updates and deletes never wait on growth.

use super::layout::{decode_entry, Desc, Phase, Slot, State, BUCKET_BYTES, SLOTS};
use super::view::{bucket_of, Plan, Reach};
use super::{CuckooClient, CuckooError, ROOT_WORD};
use nicdrv::exec::MAX_BATCH;
use nicdrv::{Ctx, Nic, OpId};
use std::sync::Arc;

/// Buckets read by one READ of the walk.
const WALK_BUCKETS: u64 = 8;
/// Passes over one group of buckets before the walk gives up (contention).
const WALK_PASSES: u32 = 10_000;

impl CuckooClient {
    /// Grows the table for a put that found no room under `desc`: drives
    /// the doubling under way, or starts one, until the table is stable at
    /// a level above `desc`'s (other drivers may do steps meanwhile), and
    /// returns that descriptor, just confirmed. `TableFull` when the table
    /// is at its largest. Driving it to the end
    /// rather than leaving the walk to the next put that finds no room
    /// keeps the upper level from filling up while misplaced words still
    /// take room in it.
    pub(super) async fn grow<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        desc: &Arc<Desc>,
    ) -> Result<Arc<Desc>, CuckooError> {
        let target = desc.level + 1;
        let mut d = desc.clone();
        while d.growing() || d.level < target {
            self.grow_step(ctx, &d).await?;
            d = self.refresh(ctx).await?;
        }
        Ok(d)
    }

    /// One step of growth from `desc`: starts a growth, or waits out the
    /// current phase's gap (walking, while new words go up) and publishes
    /// the next phase. `TableFull` when the table is stable at its
    /// largest.
    async fn grow_step<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        desc: &Arc<Desc>,
    ) -> Result<(), CuckooError> {
        if desc.phase == Phase::Stable {
            if desc.level >= desc.max_level {
                return Err(CuckooError::TableFull);
            }
            return self.start_growth(ctx, desc).await;
        }
        let gap = self.cfg().phase_gap_ns();
        let since = match self.grow_seen {
            Some((g, t)) if g == desc.generation => t,
            _ => {
                let t = ctx.now_ns();
                self.grow_seen = Some((desc.generation, t));
                t
            }
        };
        // Wait out the gap, a lease at a time, watching for someone else
        // moving the table on.
        while ctx.now_ns() < since + gap {
            let step = (since + gap - ctx.now_ns()).min(self.cfg().view_lease_ns);
            if !self.nap(ctx, step, desc).await? {
                return Ok(());
            }
        }
        let next = match desc.phase {
            Phase::Reading => Desc {
                phase: Phase::Placing,
                // The walk's counters: a fresh (zero) line.
                walk_at: Some(self.alloc.alloc(ctx, 64, 64).await?),
                ..(**desc).clone()
            },
            _ => {
                if !self.walk(ctx, desc).await? {
                    return Ok(());
                }
                Desc {
                    phase: Phase::Stable,
                    level: desc.level + 1,
                    walk_at: None,
                    ..(**desc).clone()
                }
            }
        };
        self.publish(ctx, desc, next).await?;
        Ok(())
    }

    /// Allocates the segments of the upper half and publishes Reading.
    async fn start_growth<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        desc: &Arc<Desc>,
    ) -> Result<(), CuckooError> {
        // Someone may have started already (saves allocating for nothing).
        if ctx.read(ROOT_WORD, 8).await?.u64_at(0) != desc.at.raw() {
            return Ok(());
        }
        let buckets = desc.buckets * 2;
        let mut segs = desc.segs.clone();
        let need = buckets.div_ceil(desc.seg_buckets) as usize;
        while segs.len() < need {
            // Fresh chunks are zero: Empty slots with tag 0 (`create`).
            let bytes = desc.seg_buckets * BUCKET_BYTES as u64;
            segs.push(self.alloc.alloc(ctx, bytes, BUCKET_BYTES as u64).await?);
        }
        let next = Desc {
            buckets,
            segs,
            phase: Phase::Reading,
            ..(**desc).clone()
        };
        self.publish(ctx, desc, next).await?;
        Ok(())
    }

    /// Writes `next` (one generation on from `from`) to fresh memory and
    /// swings the root word to it from `from`; whether this client's CAS
    /// won. A loser's descriptor (and a lost start's segments) stay
    /// allocated and unused: a few KiB per race.
    async fn publish<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        from: &Desc,
        mut next: Desc,
    ) -> Result<bool, CuckooError> {
        next.generation = from.generation.checked_add(1).ok_or(CuckooError::Corrupt {
            what: "a descriptor of the last generation there is",
        })?;
        next.at = self
            .alloc
            .alloc(ctx, Desc::bytes(next.segs.len()) as u64, 64)
            .await?;
        let bytes = next.encode();
        for (i, part) in bytes.chunks(4096).enumerate() {
            ctx.write(next.at.add(i as u64 * 4096), part).await?;
        }
        // The descriptor is whole before the root names it (the WRITEs
        // completed above).
        let won = ctx.cas(ROOT_WORD, from.at.raw(), next.at.raw()).await? == from.at.raw();
        self.after_cas()?;
        if won {
            self.stats.growth_steps += 1;
            if next.growing() {
                self.grow_seen = Some((next.generation, ctx.now_ns()));
            }
        }
        self.refresh(ctx).await?;
        Ok(won)
    }

    /// The split walk: moves every committed word of buckets `0..B` that
    /// lies outside its key's buckets at the upper level there, and
    /// settles every Forward word it meets outside them. The buckets go in
    /// groups of 8 that walkers claim with an FAA on the descriptor's walk
    /// line and count done with another, so every put waiting for the
    /// growth shares the work. Once all are claimed, a walker waits for the
    /// count; if it stops moving for a phase gap and 4 × `stale_ns` (a
    /// walker stopped, or is slow), it walks every group itself (walking a
    /// clean group again changes nothing). True when every group was walked under `desc`;
    /// false when the table moved on meanwhile (someone else published the
    /// next phase).
    async fn walk<N: Nic>(&mut self, ctx: &Ctx<N>, desc: &Arc<Desc>) -> Result<bool, CuckooError> {
        let groups = walk_groups(desc);
        let total = groups.len() as u64;
        let line = desc.walk_at.ok_or(CuckooError::Corrupt {
            what: "a Placing descriptor without its walk counters",
        })?;
        let (claims, done) = (line, line.add(8));
        loop {
            if !self.still_current(ctx, desc).await? {
                return Ok(false);
            }
            let k = ctx.faa(claims, 1).await?;
            if k >= total {
                break;
            }
            let (b, n) = groups[k as usize];
            if !self.walk_until_clean(ctx, desc, b, n).await? {
                return Ok(false);
            }
            ctx.faa(done, 1).await?;
        }
        // Longer than a live walker takes over a group, as far as the
        // time bounds tell: a phase gap and four stale periods.
        let patience = self.cfg().phase_gap_ns() + 4 * self.cfg().stale_ns;
        let (mut seen, mut since) = (u64::MAX, ctx.now_ns());
        loop {
            let d = ctx.read(done, 8).await?.u64_at(0);
            if d >= total {
                return Ok(true);
            }
            if d != seen {
                (seen, since) = (d, ctx.now_ns());
            } else if ctx.now_ns().saturating_sub(since) > patience {
                self.stats.walk_takeovers += 1;
                for &(b, n) in &groups {
                    if !self.walk_until_clean(ctx, desc, b, n).await? {
                        return Ok(false);
                    }
                }
                return Ok(true);
            }
            if !self.nap(ctx, self.cfg().view_lease_ns, desc).await? {
                return Ok(false);
            }
        }
    }

    /// For an update under the Placing descriptor `desc` whose key's
    /// committed word, at position `p` of `loc`, lies outside the key's
    /// buckets at the upper level: once the split walk has begun, moves
    /// the word up itself, by the walk's own move, so that the update can
    /// then be made where the word belongs. Without this a key updated
    /// faster than a move takes (its READs, then its commit CAS) kept the
    /// walk from ever passing its bucket, since every update changed the
    /// word the commit expected; the walk, and the insert driving the
    /// growth, gave up (`loch-bench hash-grow --zipf 4`: nearly every
    /// operation on one key). Updaters that move the word do not change it
    /// meanwhile, so one of their moves commits. Before the walk begins
    /// a Reading client may still act, and the word is left where it is,
    /// as the walk leaves it until then. Whether it moved.
    pub(super) async fn move_up_to_update<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        desc: &Arc<Desc>,
        loc: &Reach,
        p: usize,
        w: Slot,
    ) -> Result<bool, CuckooError> {
        let line = desc.walk_at.ok_or(CuckooError::Corrupt {
            what: "a Placing descriptor without its walk counters",
        })?;
        // A walker claims its first group only after waiting out the
        // phase gap (`grow_step`): a claim means no Reading client is left.
        // Once seen, it stays so for the descriptor.
        if self.walk_begun != Some(desc.generation) {
            if ctx.read(line, 8).await?.u64_at(0) == 0 {
                return Ok(false);
            }
            self.walk_begun = Some(desc.generation);
        }
        // As the walk: each move rests on a confirmed view.
        if self.view_old(ctx) && self.refresh(ctx).await?.generation != desc.generation {
            return Ok(false);
        }
        self.known.clear();
        let moved = match self
            .migrate(ctx, desc, bucket_of(loc, p), p % SLOTS, w, 0)
            .await
        {
            // No memory for the copy (taken before any CAS: the table is
            // as it was): the update goes ahead in place, as it could
            // before, and the walk moves the word later.
            Err(CuckooError::Alloc(_)) => false,
            r => r?,
        };
        if moved {
            self.stats.update_moves += 1;
        }
        Ok(moved)
    }

    /// Sleeps `ns` (at most a lease), then reads the root word: whether
    /// `desc` is still the table's descriptor.
    async fn nap<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        ns: u64,
        desc: &Desc,
    ) -> Result<bool, CuckooError> {
        ctx.sleep(ns)
            .map_err(|e| CuckooError::Config(format!("growth wait: {e}")))?
            .await;
        Ok(self.refresh(ctx).await?.generation == desc.generation)
    }

    /// Whether `desc` is still the table's descriptor (the root word read
    /// again once the view is older than R).
    async fn still_current<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        desc: &Desc,
    ) -> Result<bool, CuckooError> {
        if self.view_old(ctx) {
            return Ok(self.refresh(ctx).await?.generation == desc.generation);
        }
        Ok(true)
    }

    /// Passes over buckets `first..first + n` until one finds nothing out
    /// of place. False when the table moved on meanwhile.
    async fn walk_until_clean<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        desc: &Arc<Desc>,
        first: u64,
        n: u64,
    ) -> Result<bool, CuckooError> {
        for _ in 0..WALK_PASSES {
            if !self.still_current(ctx, desc).await? {
                return Ok(false);
            }
            if self.walk_group(ctx, desc, first, n).await? {
                self.stats.walked_buckets += n;
                return Ok(true);
            }
        }
        Err(CuckooError::Contention)
    }

    /// One pass over buckets `first..first + n`: whether none of them
    /// held a committed word out of place (after this pass's moves, the
    /// caller passes again to be sure).
    async fn walk_group<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        desc: &Arc<Desc>,
        first: u64,
        n: u64,
    ) -> Result<bool, CuckooError> {
        let words = {
            let buf = ctx
                .read(desc.bucket_addr(first), n as usize * BUCKET_BYTES)
                .await?;
            (0..n as usize * SLOTS)
                .map(|i| Slot(buf.u64_at(i * 8)))
                .collect::<Vec<_>>()
        };
        // The committed words and their entries' keys.
        let committed: Vec<usize> = (0..words.len())
            .filter(|&i| words[i].is_committed())
            .collect();
        let mut keys: Vec<Option<Vec<u8>>> = Vec::with_capacity(committed.len());
        for group in committed.chunks(MAX_BATCH) {
            let mut bt = ctx.batch();
            let mut ops = [None::<OpId>; MAX_BATCH];
            for (k, &i) in group.iter().enumerate() {
                let e = words[i].eref();
                ops[k] = Some(bt.read_new(e.addr(), e.bytes()));
            }
            let mut d = bt.submit().await?;
            for op in ops[..group.len()].iter().flatten() {
                let buf = d.take_buf(*op);
                keys.push(decode_entry(buf.as_slice(), desc.key_bytes).map(|(k, _)| k.to_vec()));
            }
        }
        let mut clean = true;
        for (&i, key) in committed.iter().zip(keys) {
            let (bucket, slot, w) = (first + (i / SLOTS) as u64, i % SLOTS, words[i]);
            let Some(key) = key else {
                // The word changed since the bucket READ (its entry
                // reused) or is being written: look again.
                clean = false;
                continue;
            };
            let home = Reach::of(desc, &key);
            if home.fp != w.fp() || home.index_of(bucket).is_none() {
                // Read after the word changed: look again.
                clean = false;
                continue;
            }
            if home.place_buckets().contains(&bucket) {
                continue; // where it belongs
            }
            clean = false;
            if self.view_old(ctx) {
                // Each move must rest on a confirmed view; the caller
                // notices a new descriptor on its next pass.
                if self.refresh(ctx).await?.generation != desc.generation {
                    return Ok(false);
                }
            }
            self.known.clear();
            match w.state() {
                State::Normal => {
                    if !self.migrate(ctx, desc, bucket, slot, w, 0).await? {
                        // No room where it goes, or a race: make room
                        // there, then the next pass tries again.
                        let a = self.collect(ctx, desc, &home).await?;
                        let full = home
                            .place()
                            .iter()
                            .all(|&h| (0..SLOTS).all(|s| !a.slot(h * SLOTS + s).is_empty()));
                        if full {
                            self.make_room(ctx, desc, &home, a).await?;
                        }
                    }
                }
                _ => {
                    // A Forward word out of place: settle it (finish into
                    // the upper level or undo), then the next pass moves
                    // what is left.
                    let snap = self.snapshot(ctx, desc, &home, &key, None).await?;
                    if let Plan::Resolve(p) = self.plan(&snap, &home)? {
                        self.resolve(ctx, desc, &home, &snap, p).await?;
                    }
                }
            }
        }
        Ok(clean)
    }
}

/// The walk's groups of buckets `0..B` (start, count): 8 at a time, never
/// across a segment (one READ each).
fn walk_groups(desc: &Desc) -> Vec<(u64, u64)> {
    let lower = desc.base_buckets << desc.level;
    let mut groups = Vec::with_capacity(lower.div_ceil(WALK_BUCKETS) as usize);
    let mut b = 0;
    while b < lower {
        let n = WALK_BUCKETS
            .min(lower - b)
            .min(desc.seg_buckets - b % desc.seg_buckets);
        groups.push((b, n));
        b += n;
    }
    groups
}
