//! Lending free entry blocks between compute nodes, through a pool on each
//! memory node.
//!
//! Owns the pools: on every memory node, one stack of free blocks of that
//! node per block class, whose head words sit in the node's superblock
//! ([`mempool::layout::HASH_LEND_OFF`], one line each). A block is retired
//! to the client that unlinked it (`reclaim.rs`), so without lending a
//! compute node whose clients delete more than they put keeps the entries
//! it frees, while another, whose puts use the memory up, fails out of
//! memory beside them. A put that finds fresh memory out and nothing
//! ready of its own borrows from any node's pool before it waits, and
//! looks again while it waits; finding none, it adds one to a *want
//! count* on node 0 (moves, which allocate after their snapshot, do
//! neither). After a put or delete, a client holding
//! [`LEND_KEEP`](super::reclaim::LEND_KEEP) ready blocks of one node and
//! class beyond a batch of [`LEND_BATCH`](super::reclaim::LEND_BATCH)
//! lends its oldest batch to that node's pool within 2 G of one of its
//! READs of the want count (at most every G / 2) finding it changed
//! since its READ before: nobody pays for lending while no one is short.
//! A compute node leaving the table lends everything its handle holds,
//! wanted or not ([`CuckooClient::lend_all`]); one whose clients sit idle
//! lends when they call [`CuckooClient::lend_while_idle`].
//!
//! # A pool
//! A Treiber stack in remote memory. The head word holds the line index
//! (offset / 64) of the top block in its low [`LINE_BITS`] bits, 0 when
//! the pool is empty (offset 0 is the superblock's null word, never a
//! block), and a count of the CASes that replaced it in the rest. A free
//! block's first word holds the line index of the block below it.
//! - **Lend** a chain b₁…bₙ: WRITE each bᵢ's link to bᵢ₊₁ (one doorbell),
//!   READ the head h, WRITE bₙ's link to h's top, CAS the head from h to
//!   (b₁, count + 1); on a lost CAS, link bₙ to the new top and CAS again.
//!   Every WRITE has completed before the CAS that publishes the chain, so
//!   whoever finds a block through the head finds its link.
//! - **Borrow**: READ the head h (every class's in one READ), READ the top
//!   block's link l, CAS the head from h to (l, count + 1); the block is
//!   the borrower's when the CAS takes.
//!
//! A borrow's CAS takes only if no CAS took on the head since the head was
//! read (each one changes the count), unless the count came round: 2^29
//! CASes on one word, which no NIC executes within the window W (2 ms by
//! default; at 10^8 atomics a second, about 5 s), and a borrower, as a
//! lender, posts its CAS within W of the READ it rests on or reads again.
//! So while its CAS is in flight the top it read was never taken: its
//! link, written before it was published and untouched while it lies in
//! the pool, is the link READ returned. A block taken meanwhile and reused may hold anything where
//! its link was; the CAS then fails and the borrower starts over.
//!
//! # Why a lent block is safe to reuse at once
//! Only blocks past their grace period are lent (G has passed on the
//! lender's clock since the CAS that unlinked them), and clocks run at
//! the same rate (`mod.rs`, "Reclamation"): whoever read a word naming
//! the entry is done with it, whichever compute node it runs on. A pool's
//! link words are written only into blocks nobody else can name: the
//! lender's before their CAS, nobody's after.
//!
//! # Faults
//! A verb that fails before the publishing CAS leaves the chain the
//! lender's (taken back, ready at once). When the CAS itself fails (its
//! answer lost: it may have taken), the lender reads the head again. Its
//! CAS from h would have made the head (b₁, count + 1), a word no other
//! CAS makes (b₁ was nobody else's to push, nor in the pool to pop
//! towards); so a head equal to that says it took, a head still h or at
//! count + 1 with another top says it did not (no CAS took, or another
//! one from h did), and the lend goes on from there. A head further on,
//! or one not read within [`SETTLE_NS`], leaves the outcome unknown and
//! the chain leaks (it may be in the pool, so it is not reused here), as
//! a borrow's failed CAS leaks its block: another borrow's CAS from the
//! same head makes the same word, so the borrower cannot tell. Memory
//! lost, never a block handed out twice. This rests on a request the
//! transport has given up on (its error completion seen) reaching no
//! memory afterwards: the transport retries for far longer than a packet
//! lives in the fabric (the simulator drops such a request). A head or
//! link naming a line outside the
//! node's whole chunks (a corrupt pool) is never followed: the pool reads
//! as empty (a range check only: a corrupt word naming a line within the
//! chunks is not told from a free block's).

use super::reclaim::{block_bytes, blocks_of, CLASSES};
use super::{CuckooClient, CuckooError};
use mempool::layout::{first_chunk_off, HASH_LEND_OFF, HASH_LEND_WORDS, HASH_WANT_OFF};
use nicdrv::{Ctx, GlobalAddr, Nic, NodeId};

/// Bits of a head word that hold the top block's line index: 2^35 lines
/// of 64 bytes cover the 2 TiB a slot word can name on a node.
pub const LINE_BITS: u32 = 35;

/// How long after the READ its CAS rested on a lender may still read the
/// head to settle a CAS whose answer was lost ("Faults" above): well
/// inside the time the head's count takes to come round (2^29 CASes, about
/// 5 s at 10^8 atomics a second), so an unchanged count means no CAS took.
pub const SETTLE_NS: u64 = 1_000_000_000;

/// Attempts of one lend or borrow on one head before it gives up (a head
/// this busy is a lending storm; the blocks stay where they are).
const TRIES: usize = 8;

/// A pool's head word: the top block's line index and the count of CASes
/// that replaced the head.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Head(pub u64);

impl Head {
    /// The head naming `line` (below 2^[`LINE_BITS`]) with count `count`
    /// (kept modulo 2^(64 − LINE_BITS)).
    pub fn new(line: u64, count: u64) -> Head {
        debug_assert!(line < 1 << LINE_BITS, "line {line} past {LINE_BITS} bits");
        Head((count << LINE_BITS) | line)
    }

    /// The top block's line index; 0 when the pool is empty.
    pub fn line(self) -> u64 {
        self.0 & ((1 << LINE_BITS) - 1)
    }

    pub fn count(self) -> u64 {
        self.0 >> LINE_BITS
    }

    /// The head that replaces this one with `line` on top.
    pub fn then(self, line: u64) -> Head {
        Head::new(line, self.count().wrapping_add(1))
    }
}

/// The head word of memory node `node`'s pool of class `c`.
pub fn head_addr(node: NodeId, c: usize) -> GlobalAddr {
    debug_assert!(c < CLASSES && CLASSES as u64 <= HASH_LEND_WORDS);
    GlobalAddr::host(node, HASH_LEND_OFF + 64 * c as u64)
}

/// The line index a head or link names `block` by.
fn line_of(block: GlobalAddr) -> u64 {
    block.offset() / 64
}

/// The want count (`lending`), on node 0 beside the table's root.
pub const WANT_WORD: GlobalAddr = GlobalAddr::host(0, HASH_WANT_OFF);

/// What a client last learnt of the want count (`lending`).
#[derive(Default)]
pub(super) struct Wanted {
    /// The count at the last READ; `None` before the first.
    seen: Option<u64>,
    /// When the last READ was posted (this client's clock).
    read_ns: Option<u64>,
    /// Until when this client lends without reading the count again.
    until_ns: u64,
}

/// What [`CuckooClient::lend_all`] did.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct LentAll {
    /// Blocks now in a pool.
    pub lent: u64,
    /// Blocks a pool refused (a fault, or a head too busy), still this
    /// client's.
    pub kept: u64,
}

/// What became of a chain offered to a pool.
enum Lent {
    /// In the pool.
    Yes,
    /// Still the lender's: no CAS took (a fault, counted where met, or a
    /// head too busy).
    No,
    /// A CAS's outcome is unknown: the chain may be in the pool.
    Unknown,
}

impl CuckooClient {
    /// The block of class `c` that line index `line` names on `node`, if
    /// it lies wholly within the node's whole chunks; `None` for anything
    /// else (a corrupt head or link). A range check: a corrupt word naming
    /// a line within the chunks (a bucket, a live entry) is not caught.
    fn pool_block(&self, node: NodeId, c: usize, line: u64) -> Option<GlobalAddr> {
        let chunk = &self.cfg().chunk;
        let off = line.checked_mul(64)?;
        let end = off.checked_add(block_bytes(c))?;
        let chunks_end = chunk
            .chunks_on(node)
            .checked_mul(chunk.chunk_bytes)?
            .checked_add(first_chunk_off())?;
        (line < 1 << LINE_BITS && off >= first_chunk_off() && end <= chunks_end)
            .then(|| GlobalAddr::host(node, off))
    }

    /// Whether a put or delete ending at `now` looks for a surplus to
    /// lend: at most every G / 8, or after every one while this client's
    /// lends are taken. Looking costs a scan of the lists' ready fronts,
    /// and blocks become ready with time alone, so the look is timed
    /// rather than tied to retirements.
    pub(super) fn lend_due(&self, now: u64) -> bool {
        now >= self.lend_check_ns
    }

    /// Lends one batch of what this client's lists hold beyond their keep,
    /// else of what the handle's spares do (`surplus` in `reclaim.rs`),
    /// when some put wants blocks ([`lending`]). Called
    /// after a put or delete when [`lend_due`](Self::lend_due): a client
    /// whose puts reuse what it retires finds nothing to lend, and one
    /// with a surplus nobody wants posts one READ each G / 2 at most.
    ///
    /// [`lending`]: Self::lending
    pub(super) async fn lend_surplus<N: Nic>(&mut self, ctx: &Ctx<N>) {
        // A client its test hook stopped stands for one that crashed: it
        // posts nothing more (its blocks leak, as a crashed client's do).
        if self.stopped {
            return;
        }
        let now = ctx.now_ns();
        self.lend_check_ns = now.saturating_add(self.cfg().reuse_grace_ns / 8);
        // The spares too: what clients retired once memory was tight, and
        // the lists of clients dropped (their handle's other clients are
        // the only ones left to lend them). Their lock is taken at most
        // every G / 8 here.
        let mine = self.reclaim.has_surplus(now);
        if !(mine || self.table.spares().has_surplus(now)) {
            return;
        }
        if !self.lending(ctx, now).await {
            return;
        }
        let taken = if mine {
            self.reclaim.surplus(now)
        } else {
            self.table.spares().surplus(now)
        };
        let Some((node, c, blocks)) = taken else {
            return;
        };
        let lent = self.lend(ctx, node, c, &blocks).await;
        match (lent, mine) {
            (true, _) => {}
            (false, true) => self.reclaim.restore(&blocks, c),
            (false, false) => self.table.spares().restore(&blocks, c),
        }
        // Lent, and wanted: look again after the next operation.
        if lent {
            self.lend_check_ns = now;
        }
    }

    /// For a client with no operation to run: lends a batch of what it
    /// holds beyond its keep, or of its handle's spares, if a put
    /// elsewhere wants blocks, as it would after a put or delete
    /// (`lend_surplus`). A compute node whose clients all sit idle
    /// otherwise keeps what they hold while others run out; call it now
    /// and then (every G / 8 is the pace puts and deletes keep). Nothing
    /// is posted more often than that, and while nobody wants blocks,
    /// one READ of the want count each G / 2 at most.
    pub async fn lend_while_idle<N: Nic>(&mut self, ctx: &Ctx<N>) {
        if self.lend_due(ctx.now_ns()) {
            self.lend_surplus(ctx).await;
        }
    }

    /// Lends every entry block this client holds, and every spare of its
    /// handle (the lists of its clients dropped, and the unused rest of
    /// their chunks), to the memory nodes' pools, each block once its
    /// grace period has passed (it waits for the last), whether or not a
    /// put wants them now: for a compute node leaving the table. The
    /// rests of chunks (this client's and those of its handle's dropped
    /// clients) go carved into blocks of the class their allocations
    /// took most, the tail into smaller ones. Blocks retired on a compute
    /// node are otherwise reused only there, or lent while its clients
    /// run, so what its handle holds when dropped would be lost to every
    /// other compute node. Call it from the handle's last client, once
    /// the others are done (dropped). A batch a pool refuses (a fault, or
    /// a head too busy) stays this client's, as a chain whose CAS's
    /// outcome is unknown is lost ("Faults" above): the blocks handed to
    /// the pools are counted in `stats.entries_lent`, the refused ones in
    /// the result.
    pub async fn lend_all<N: Nic>(&mut self, ctx: &Ctx<N>) -> Result<LentAll, CuckooError> {
        if self.stopped {
            return Err(CuckooError::Stopped);
        }
        let c = self.class_taken_most();
        let mut rests = self.take_chunk_rests();
        rests.append(&mut self.table.spares().take_rests());
        for (start, bytes) in rests {
            for (b, k) in blocks_of(start, bytes, c) {
                self.reclaim.give_back(b, k);
            }
        }
        let lent_before = self.stats.entries_lent;
        let mut refused: Vec<(usize, Vec<GlobalAddr>)> = Vec::new();
        loop {
            let now = ctx.now_ns();
            let taken = match self.reclaim.ready_batch(now) {
                Some(t) => Some(t),
                None => self.table.spares().ready_batch(now),
            };
            if let Some((node, c, blocks)) = taken {
                // Not kept: in the pool, or maybe (an unknown CAS).
                if !self.lend(ctx, node, c, &blocks).await {
                    refused.push((c, blocks));
                }
                continue;
            }
            let Some(at) = self.earliest_ready(0) else {
                break;
            };
            ctx.sleep_until(at.max(now))
                .map_err(|t| CuckooError::Config(format!("waiting to lend a retired entry: {t}")))?
                .await;
        }
        let kept = refused.iter().map(|(_, b)| b.len() as u64).sum();
        for (c, blocks) in &refused {
            self.reclaim.restore(blocks, *c);
        }
        Ok(LentAll {
            lent: self.stats.entries_lent - lent_before,
            kept,
        })
    }

    /// The class the allocations of this client and of its handle's
    /// dropped clients took most (the smallest of equals; 0 before any).
    fn class_taken_most(&self) -> usize {
        let (mine, spares) = (self.reclaim.taken(), self.table.spares().taken());
        (0..CLASSES)
            .max_by_key(|&c| (mine[c] + spares[c], std::cmp::Reverse(c)))
            .unwrap_or(0)
    }

    /// Whether some put wants blocks lent: within 2 G of this client
    /// seeing the want count change, yes; else it READs the count, at
    /// most every G / 2, and a change since its last READ opens those 2 G.
    /// A surplus no one wants stays where it is (lending it would cost
    /// its holder four round trips a batch for nothing: with entries
    /// retired on another node than the slots a client writes, YCSB-A on
    /// emu, one thread, lent a batch about every 16 operations and ran
    /// about 6% slower, medians of six runs, when every surplus was lent).
    async fn lending<N: Nic>(&mut self, ctx: &Ctx<N>, now: u64) -> bool {
        let g = self.cfg().reuse_grace_ns;
        let w = &mut self.wanted;
        if now < w.until_ns {
            return true;
        }
        if w.read_ns.is_some_and(|t| now < t.saturating_add(g / 2)) {
            return false;
        }
        w.read_ns = Some(now);
        let count = match ctx.read(WANT_WORD, 8).await {
            Ok(b) => b.u64_at(0),
            Err(_) => {
                self.stats.pool_faults += 1;
                return false;
            }
        };
        let w = &mut self.wanted;
        let changed = w.seen.is_some_and(|s| s != count);
        w.seen = Some(count);
        if changed {
            w.until_ns = now.saturating_add(g.saturating_mul(2));
        }
        changed
    }

    /// Tells lenders a put wants blocks: adds one to the want count.
    pub(super) async fn want<N: Nic>(&mut self, ctx: &Ctx<N>) {
        if ctx.faa(WANT_WORD, 1).await.is_err() {
            self.stats.pool_faults += 1;
        }
    }

    /// Offers `blocks`, ready blocks of class `c` on `node`, to the node's
    /// pool. `false` when they are still this client's to keep; `true`
    /// when they are in the pool or may be (then they are not kept).
    async fn lend<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        node: NodeId,
        c: usize,
        blocks: &[GlobalAddr],
    ) -> bool {
        match self.push_chain(ctx, node, c, blocks).await {
            Lent::Yes => {
                self.stats.entries_lent += blocks.len() as u64;
                true
            }
            Lent::No => false,
            // Counted as a pool fault where its CAS failed.
            Lent::Unknown => {
                self.stats.entries_leaked += blocks.len() as u64;
                true
            }
        }
    }

    /// [`push_chain`](Self::push_chain)'s way out on a fault: counted, and
    /// the chain still the lender's.
    fn refused(&mut self) -> Lent {
        self.stats.pool_faults += 1;
        Lent::No
    }

    /// The pool head at `at`; a failed READ counts as a pool fault.
    async fn read_head<N: Nic>(&mut self, ctx: &Ctx<N>, at: GlobalAddr) -> Option<Head> {
        match ctx.read(at, 8).await {
            Ok(b) => Some(Head(b.u64_at(0))),
            Err(_) => {
                self.stats.pool_faults += 1;
                None
            }
        }
    }

    async fn push_chain<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        node: NodeId,
        c: usize,
        blocks: &[GlobalAddr],
    ) -> Lent {
        let (Some(&first), Some(&last)) = (blocks.first(), blocks.last()) else {
            return Lent::No;
        };
        debug_assert!(blocks.iter().all(|b| b.node() == node));
        if blocks.len() > 1 {
            let mut b = ctx.batch();
            for w in blocks.windows(2) {
                b.write_u64(w[0], line_of(w[1]));
            }
            if b.submit().await.is_err() {
                return self.refused();
            }
        }
        let at = head_addr(node, c);
        let window = self.cfg().window_ns;
        let mut t0 = ctx.now_ns();
        let Some(mut seen) = self.read_head(ctx, at).await else {
            return Lent::No;
        };
        for _ in 0..TRIES {
            // A head naming no block is not linked to: a borrower would
            // follow the chain into it.
            if seen.line() != 0 && self.pool_block(node, c, seen.line()).is_none() {
                return self.refused();
            }
            // A head at one of the chain's own blocks: a CAS of this lend
            // that was told not to have taken did take (a transport that
            // landed a request it reported failed). Linking the chain to
            // it would close a cycle that borrowers follow for good; its
            // blocks are in the pool already, so leave them there.
            if blocks.iter().any(|&b| line_of(b) == seen.line()) {
                return Lent::Unknown;
            }
            if ctx.write(last, &seen.line().to_le_bytes()).await.is_err() {
                return self.refused();
            }
            // As a borrower does (module doc, "A pool"): a CAS against a
            // head read more than W ago could meet a count come round, and
            // link the chain to a top taken since. Read it again.
            if ctx.now_ns().saturating_sub(t0) > window {
                t0 = ctx.now_ns();
                let Some(h) = self.read_head(ctx, at).await else {
                    return Lent::No;
                };
                seen = h;
                continue;
            }
            let new = seen.then(line_of(first));
            t0 = ctx.now_ns();
            let found = match ctx.cas(at, seen.0, new.0).await {
                Ok(old) if old == seen.0 => return Lent::Yes,
                Ok(old) => Head(old),
                // Its answer lost: the head may tell whether it took.
                Err(_) => match self.settle_lend(ctx, at, seen, new, t0).await {
                    Some((h, _)) if h == new => return Lent::Yes,
                    Some((h, read_at)) => {
                        t0 = read_at;
                        h
                    }
                    None => return Lent::Unknown,
                },
            };
            if found != seen {
                self.stats.lend_cas_lost += 1;
            }
            seen = found;
        }
        // Contended past TRIES: not a fault; the lender keeps the chain.
        Lent::No
    }

    /// After a lend's CAS from `seen` to `new`, posted at `t0`, failed
    /// with a verb error: READs the head again and returns it, with when
    /// that READ was posted, if it tells whether the CAS took ("Faults"
    /// above): `new` itself if it did; `seen`, or another head at `new`'s
    /// count, if not. `None` when the head cannot tell (it moved further,
    /// or its READ came back past [`SETTLE_NS`] after the CAS: the count
    /// could have come round since) or cannot be read. The failed CAS
    /// counts as a pool fault.
    async fn settle_lend<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        at: GlobalAddr,
        seen: Head,
        new: Head,
        t0: u64,
    ) -> Option<(Head, u64)> {
        self.stats.pool_faults += 1;
        let read_at = ctx.now_ns();
        if read_at.saturating_sub(t0) > SETTLE_NS {
            return None;
        }
        let h = self.read_head(ctx, at).await?;
        // Checked again once the READ is back: a READ the link retried
        // may have executed long after it was posted.
        if ctx.now_ns().saturating_sub(t0) > SETTLE_NS {
            return None;
        }
        if h == new {
            self.stats.lends_settled_taken += 1;
        } else if h == seen || h.count() == new.count() {
            self.stats.lends_settled_not_taken += 1;
        } else {
            return None;
        }
        Some((h, read_at))
    }

    /// A lent block of class `c` or larger from any memory node's pool,
    /// the smallest class first on each node; `None` when no pool has one
    /// this client could take (empty, contended past [`TRIES`], corrupt,
    /// or its node unreachable).
    pub(super) async fn borrow<N: Nic>(&mut self, ctx: &Ctx<N>, c: usize) -> Option<GlobalAddr> {
        for node in ctx.nodes() {
            let t0 = ctx.now_ns();
            let heads = match ctx.read(head_addr(node, 0), 64 * CLASSES).await {
                Ok(b) => b,
                Err(_) => {
                    self.stats.pool_faults += 1;
                    continue;
                }
            };
            for k in c..CLASSES {
                let seen = Head(heads.u64_at(64 * k));
                if seen.line() == 0 {
                    continue;
                }
                if let Some(b) = self.pop(ctx, node, k, seen, t0).await {
                    self.stats.entries_borrowed += 1;
                    return Some(b);
                }
            }
        }
        None
    }

    /// Takes the top block of `node`'s pool of class `c`, whose head read
    /// `seen` in a READ posted at `t0` (module doc, "A pool").
    async fn pop<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        node: NodeId,
        c: usize,
        mut seen: Head,
        mut t0: u64,
    ) -> Option<GlobalAddr> {
        let at = head_addr(node, c);
        for _ in 0..TRIES {
            if seen.line() == 0 {
                return None;
            }
            let Some(top) = self.pool_block(node, c, seen.line()) else {
                self.stats.pool_faults += 1;
                return None;
            };
            let Ok(link) = ctx.read(top, 8).await.map(|b| b.u64_at(0)) else {
                self.stats.pool_faults += 1;
                return None;
            };
            let window = self.cfg().window_ns;
            // A link naming no block, read from a top someone took and
            // reused meanwhile (or a corrupt one), or a head read longer
            // than W ago: read the head again.
            if ctx.now_ns().saturating_sub(t0) > window
                || (link != 0 && self.pool_block(node, c, link).is_none())
            {
                t0 = ctx.now_ns();
                seen = self.read_head(ctx, at).await?;
                continue;
            }
            t0 = ctx.now_ns();
            match ctx.cas(at, seen.0, seen.then(link).0).await {
                Ok(old) if old == seen.0 => return Some(top),
                Ok(old) => {
                    self.stats.borrow_cas_lost += 1;
                    seen = Head(old);
                }
                // The CAS may have taken: the block is lost, not shared.
                Err(_) => {
                    self.stats.pool_faults += 1;
                    self.stats.entries_leaked += 1;
                    return None;
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_keeps_its_line_and_counts_every_replacement() {
        let h = Head::new(0x7_ffff_ffff, 5);
        assert_eq!(h.line(), (1 << LINE_BITS) - 1);
        assert_eq!(h.count(), 5);
        let n = h.then(64);
        assert_eq!((n.line(), n.count()), (64, 6));
        assert_eq!(Head(0).line(), 0, "a zero word is an empty pool");
        // The count comes round after 2^29 replacements, the line intact.
        let top = Head::new(9, (1 << (64 - LINE_BITS)) - 1);
        assert_eq!((top.then(10).line(), top.then(10).count()), (10, 0));
    }

    #[test]
    fn every_class_head_has_its_own_line_in_the_superblock() {
        for c in 0..CLASSES {
            let a = head_addr(3, c);
            assert_eq!(a.node(), 3);
            assert_eq!(a.offset() % 64, 0);
            assert!(a.offset() + 8 <= mempool::layout::SUPERBLOCK_BYTES);
        }
        assert_eq!(head_addr(0, 1).offset() - head_addr(0, 0).offset(), 64);
    }
}
