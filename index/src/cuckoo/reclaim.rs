//! Reuse of data entries after a grace period, and the tags that make every
//! empty slot word unique.
//!
//! Owns a set of free lists: one client's, or a table handle's spares
//! (`mod.rs`, "Reclamation"). A data entry unlinked from the table (the
//! client's CAS removed the last slot word naming it) is *retired* with the
//! time its CAS completed; it is handed out again only once
//! [`CuckooConfig::reuse_grace_ns`](super::CuckooConfig) has passed on this
//! client's clock. `mod.rs` ("Reclamation") says why that is safe: no
//! client acts on a word it read longer ago than the window W < G, so no
//! one can still follow, compare or CAS a pointer to the old incarnation.
//! An entry that was never visible (its CAS failed, or the put gave up) is
//! reusable at once.
//!
//! Blocks come in classes of 2^c lines (c = 0..=7); an entry of `l` lines
//! takes a block of class `ceil(log2 l)`. A retired block goes back to the
//! class of the entry it held, which is never above its real class, so a
//! block is never handed out for more than it holds.
//!
//! A client dropped gives its lists to its handle's spares
//! ([`Reclaim::absorb`]); entries retired by a client whose compute node
//! crashes are lost with it (a leak, not a hazard), and so are tentative
//! entries it left in the table.

use nicdrv::{GlobalAddr, NodeId};
use std::collections::VecDeque;

/// Block classes: 1, 2, 4, …, 128 lines.
pub const CLASSES: usize = 8;

/// Ready blocks one list (a node's, a class's) keeps for its own puts
/// before it lends any to the memory node's pool (`lend.rs`).
pub const LEND_KEEP: usize = 16;

/// Blocks lent at once: one chain, linked in one doorbell (at most
/// `MAX_BATCH` WRITEs), published by one CAS.
pub const LEND_BATCH: usize = 16;

/// Bits of a tag's per-incarnation counter.
const COUNT_BITS: u32 = 42;
/// Largest incarnation a tag can carry (the other 20 bits of 62).
pub const MAX_INCARNATION: u64 = (1 << 20) - 1;

/// The class of an entry of `lines` lines (1..=128).
pub fn class_of(lines: u32) -> usize {
    lines.max(1).next_power_of_two().trailing_zeros() as usize
}

/// Bytes of a block of class `c`.
pub fn block_bytes(c: usize) -> u64 {
    64 << c
}

/// Free lists of one memory node: per class, in retirement order (so the
/// front is the first ready), (block, time it may be reused).
type NodeLists = [VecDeque<(GlobalAddr, u64)>; CLASSES];

/// One client's free lists and tag counter.
pub struct Reclaim {
    grace_ns: u64,
    /// By memory node: an entry is reused on the node it lies on, so a
    /// client that places entries beside their slots (`mod.rs`, "Cached
    /// gets") can ask for a block on a given node.
    lists: Vec<NodeLists>,
    /// Memory never handed out, (start, bytes), lines: the unused rest of
    /// dropped clients' chunks, in a handle's spares ([`Reclaim::carve`]).
    rests: Vec<(GlobalAddr, u64)>,
    /// Entry blocks allocated, by class (fresh or reused): what the rests
    /// are carved into when a compute node leaves (`lend.rs`, `lend_all`).
    taken: [u64; CLASSES],
    incarnation: u64,
    count: u64,
}

impl Reclaim {
    pub fn new(grace_ns: u64) -> Reclaim {
        Reclaim {
            grace_ns,
            lists: Vec::new(),
            rests: Vec::new(),
            taken: [0; CLASSES],
            incarnation: 0,
            count: 0,
        }
    }

    /// Sets the incarnation (from the descriptor's FAA, 1..=MAX) that the
    /// tags of this client carry; its count restarts.
    pub fn set_incarnation(&mut self, inc: u64) {
        debug_assert!((1..=MAX_INCARNATION).contains(&inc));
        self.incarnation = inc;
        self.count = 0;
    }

    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// A tag no other empty word has carried or will carry: this
    /// incarnation's next count. `None` when the count is used up (2^42
    /// emptyings; the client must take a new incarnation).
    pub fn next_tag(&mut self) -> Option<u64> {
        if self.incarnation == 0 || self.count >= (1 << COUNT_BITS) {
            return None;
        }
        let t = (self.incarnation << COUNT_BITS) | self.count;
        self.count += 1;
        Some(t)
    }

    /// A block of class `c` on memory node `node` whose grace period has
    /// passed by `now_ns`.
    pub fn take(&mut self, c: usize, node: NodeId, now_ns: u64) -> Option<GlobalAddr> {
        let l = &mut self.lists.get_mut(node as usize)?[c];
        match l.front() {
            Some(&(a, ready)) if ready <= now_ns => {
                l.pop_front();
                Some(a)
            }
            _ => None,
        }
    }

    /// A block of class `c` on any node whose grace period has passed by
    /// `now_ns` (for when fresh memory has run out).
    pub fn take_any(&mut self, c: usize, now_ns: u64) -> Option<GlobalAddr> {
        let n = self.lists.len() as NodeId;
        (0..n).find_map(|node| self.take(c, node, now_ns))
    }

    /// A ready block of class `c` or, failing that, of the smallest larger
    /// class that has one, on any node (for when fresh memory has run
    /// out). A larger block holds the entry; it is retired later under the
    /// entry's class, never above its own (the module doc).
    pub fn take_at_least(&mut self, c: usize, now_ns: u64) -> Option<GlobalAddr> {
        (c..CLASSES).find_map(|k| self.take_any(k, now_ns))
    }

    /// When the first block [`take_at_least`](Self::take_at_least) could
    /// hand out becomes ready: the earliest ready time over the fronts of
    /// classes `c` and above, on every node. `None` when these lists hold
    /// no such block at all.
    pub fn earliest_at_least(&self, c: usize) -> Option<u64> {
        self.lists
            .iter()
            .flat_map(|n| n[c.min(CLASSES)..].iter())
            .filter_map(|l| l.front().map(|&(_, ready)| ready))
            .min()
    }

    /// The lists of the node `block` lies on.
    fn lists_of(&mut self, block: GlobalAddr) -> &mut NodeLists {
        let n = block.node() as usize;
        if self.lists.len() <= n {
            self.lists.resize_with(n + 1, Default::default);
        }
        &mut self.lists[n]
    }

    /// Retires a block unlinked at `unlinked_ns` (read after the unlinking
    /// CAS completed): reusable from `unlinked_ns + G`.
    pub fn retire(&mut self, block: GlobalAddr, c: usize, unlinked_ns: u64) {
        let ready = unlinked_ns.saturating_add(self.grace_ns);
        self.lists_of(block)[c].push_back((block, ready));
    }

    /// Gives back a block no one ever saw: reusable at once.
    pub fn give_back(&mut self, block: GlobalAddr, c: usize) {
        self.lists_of(block)[c].push_front((block, 0));
    }

    /// Takes every block of `other`'s lists into these, each list kept in
    /// order of ready time, and its rests and counts of blocks taken (a
    /// client's lists given to the handle's spares when it is dropped).
    /// Tags are not moved: each client keeps its own.
    pub fn absorb(&mut self, other: &mut Reclaim) {
        self.rests.append(&mut other.rests);
        for (mine, theirs) in self.taken.iter_mut().zip(other.taken) {
            *mine += theirs;
        }
        other.taken = [0; CLASSES];
        for (node, theirs) in other.lists.iter_mut().enumerate() {
            if self.lists.len() <= node {
                self.lists.resize_with(node + 1, Default::default);
            }
            for (mine, theirs) in self.lists[node].iter_mut().zip(theirs.iter_mut()) {
                if theirs.is_empty() {
                    continue;
                }
                let mut all: Vec<_> = mine.drain(..).chain(theirs.drain(..)).collect();
                all.sort_by_key(|&(_, ready)| ready);
                mine.extend(all);
            }
        }
    }

    /// The oldest [`LEND_BATCH`] blocks of one node's list of one class,
    /// taken out, when that list holds at least `LEND_KEEP + LEND_BATCH`
    /// blocks ready by `now_ns`: blocks its owner does not need (a client
    /// that deletes more than it puts, or whose old entries lie on
    /// another node than the slots it writes), to lend (`lend.rs`). Each
    /// block taken is checked ready (a list's order is by retirement, and
    /// a handle's spares gather the retirements of several clients, whose
    /// clock readings may interleave). A client whose puts reuse what it
    /// retires never holds that many ready, so lends nothing.
    pub fn surplus(&mut self, now_ns: u64) -> Option<(NodeId, usize, Vec<GlobalAddr>)> {
        let (node, c) = self.surplus_at(now_ns)?;
        let batch = self.lists[node][c].drain(..LEND_BATCH).map(|(a, _)| a);
        Some((node as NodeId, c, batch.collect()))
    }

    /// Whether [`surplus`](Self::surplus) would give a batch.
    pub fn has_surplus(&self, now_ns: u64) -> bool {
        self.surplus_at(now_ns).is_some()
    }

    /// The first list (node, class) holding a surplus at `now_ns`.
    fn surplus_at(&self, now_ns: u64) -> Option<(usize, usize)> {
        let need = LEND_KEEP + LEND_BATCH;
        self.lists.iter().enumerate().find_map(|(node, lists)| {
            lists
                .iter()
                .position(|l| {
                    let ready = l.iter().take(need).take_while(|&&(_, r)| r <= now_ns);
                    ready.count() == need
                })
                .map(|c| (node, c))
        })
    }

    /// Up to [`LEND_BATCH`] blocks ready by `now_ns` from the front of
    /// the first list (node, class) whose front is, keeping none back:
    /// what a client leaving the table holds, to lend (`lend.rs`,
    /// `lend_all`). A batch ends at the first block not yet ready.
    pub fn ready_batch(&mut self, now_ns: u64) -> Option<(NodeId, usize, Vec<GlobalAddr>)> {
        self.lists.iter_mut().enumerate().find_map(|(node, lists)| {
            lists.iter_mut().enumerate().find_map(|(c, l)| {
                let n = l
                    .iter()
                    .take(LEND_BATCH)
                    .take_while(|&&(_, r)| r <= now_ns)
                    .count();
                (n > 0).then(|| (node as NodeId, c, l.drain(..n).map(|(a, _)| a).collect()))
            })
        })
    }

    /// Takes back, ready at once and first in line, blocks
    /// [`surplus`](Self::surplus) gave that were not lent after all.
    pub fn restore(&mut self, blocks: &[GlobalAddr], c: usize) {
        for &b in blocks.iter().rev() {
            self.give_back(b, c);
        }
    }

    /// Blocks waiting, over all classes.
    pub fn waiting(&self) -> usize {
        self.lists.iter().flatten().map(|l| l.len()).sum()
    }

    /// Keeps `rests`, memory never handed out ((start, bytes), the start
    /// line-aligned), to carve blocks from.
    pub fn add_rests(&mut self, rests: impl IntoIterator<Item = (GlobalAddr, u64)>) {
        for (start, n) in rests {
            debug_assert_eq!(start.offset() % 64, 0, "a rest at {start}");
            if n >= block_bytes(0) {
                self.rests.push((start, n));
            }
        }
    }

    /// Counts an entry block of class `c` allocated.
    pub fn note_taken(&mut self, c: usize) {
        self.taken[c] += 1;
    }

    /// Entry blocks allocated by class, as counted here (a handle's
    /// spares count those of its dropped clients).
    pub fn taken(&self) -> [u64; CLASSES] {
        self.taken
    }

    /// Whether any rest is kept.
    pub fn has_rests(&self) -> bool {
        !self.rests.is_empty()
    }

    /// A block of class `c` from the first rest with room for one (for
    /// when fresh memory has run out): never seen, so usable at once.
    pub fn carve(&mut self, c: usize) -> Option<GlobalAddr> {
        let len = block_bytes(c);
        let i = self.rests.iter().position(|&(_, n)| n >= len)?;
        let (start, n) = self.rests[i];
        if n - len < block_bytes(0) {
            self.rests.swap_remove(i);
        } else {
            self.rests[i] = (start.add(len), n - len);
        }
        Some(start)
    }

    /// Every rest kept, taken out.
    pub fn take_rests(&mut self) -> Vec<(GlobalAddr, u64)> {
        std::mem::take(&mut self.rests)
    }
}

/// The blocks memory never handed out, `bytes` from line-aligned
/// `start`, is carved into: of class `c` while they fit, then the tail
/// into ever smaller ones down to a line (what is left is under a line).
pub fn blocks_of(start: GlobalAddr, bytes: u64, c: usize) -> Vec<(GlobalAddr, usize)> {
    let mut out = Vec::new();
    let mut off = 0;
    for k in (0..=c.min(CLASSES - 1)).rev() {
        while bytes - off >= block_bytes(k) {
            out.push((start.add(off), k));
            off += block_bytes(k);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_their_entries() {
        assert_eq!(class_of(1), 0);
        assert_eq!(class_of(2), 1);
        assert_eq!(class_of(3), 2);
        assert_eq!(class_of(66), 7);
        assert_eq!(class_of(128), 7);
        for l in 1..=128u32 {
            assert!(block_bytes(class_of(l)) >= l as u64 * 64);
        }
    }

    #[test]
    fn blocks_wait_out_the_grace_period() {
        let mut r = Reclaim::new(1000);
        let a = GlobalAddr::host(1, 4096);
        let b = GlobalAddr::host(1, 8192);
        r.retire(a, 2, 50);
        r.retire(b, 2, 60);
        assert_eq!(r.take(2, 1, 1049), None);
        assert_eq!(r.take(1, 1, 5000), None, "other class");
        assert_eq!(r.take(2, 0, 5000), None, "other node");
        assert_eq!(r.take(2, 7, 5000), None, "a node never seen");
        assert_eq!(r.take(2, 1, 1050), Some(a));
        assert_eq!(r.take(2, 1, 1050), None);
        let c = GlobalAddr::host(0, 64);
        r.give_back(c, 2);
        assert_eq!(r.take(2, 1, 0), None, "on node 0");
        assert_eq!(r.take(2, 0, 0), Some(c), "never visible: at once");
        assert_eq!(r.take_any(2, 1059), None, "b is not ready");
        assert_eq!(r.take_any(2, 1060), Some(b), "any node");
        assert_eq!(r.waiting(), 0);
    }

    #[test]
    fn out_of_memory_takes_a_larger_block_and_knows_when_one_is_ready() {
        let mut r = Reclaim::new(1000);
        assert_eq!(r.earliest_at_least(0), None, "nothing retired");
        let small = GlobalAddr::host(0, 64);
        let big = GlobalAddr::host(1, 4096);
        let bigger = GlobalAddr::host(2, 8192);
        r.retire(bigger, 4, 10);
        r.retire(big, 3, 30);
        r.retire(small, 1, 20);
        assert_eq!(r.earliest_at_least(0), Some(1010), "any class above");
        assert_eq!(r.earliest_at_least(2), Some(1010));
        assert_eq!(r.earliest_at_least(3), Some(1010));
        assert_eq!(r.earliest_at_least(5), None, "none that large");
        assert_eq!(r.take_at_least(2, 1009), None, "not ready yet");
        // Both are ready by 1030; the smaller class, 3, comes first.
        assert_eq!(r.take_at_least(2, 1030), Some(big));
        assert_eq!(r.take_at_least(2, 1030), Some(bigger));
        assert_eq!(r.take_at_least(2, 5000), None, "class 1 is too small");
        assert_eq!(r.earliest_at_least(2), None);
        assert_eq!(r.earliest_at_least(1), Some(1020));
        assert_eq!(r.take_at_least(1, 1020), Some(small));
        assert_eq!(r.take_at_least(8, 5000), None, "no class 8");
    }

    #[test]
    fn absorbed_lists_keep_their_ready_order() {
        let mut spare = Reclaim::new(100);
        let mut gone = Reclaim::new(100);
        let (a, b, c, d) = (
            GlobalAddr::host(0, 64),
            GlobalAddr::host(0, 128),
            GlobalAddr::host(2, 64),
            GlobalAddr::host(0, 192),
        );
        spare.retire(a, 0, 10);
        gone.retire(b, 0, 5);
        gone.retire(d, 0, 20);
        gone.retire(c, 1, 7);
        spare.absorb(&mut gone);
        assert_eq!(gone.waiting(), 0);
        assert_eq!(spare.waiting(), 4);
        assert_eq!(spare.take(0, 0, 104), None);
        assert_eq!(spare.take(0, 0, 105), Some(b), "the earliest first");
        assert_eq!(spare.take(0, 0, 110), Some(a));
        assert_eq!(spare.take(0, 0, 119), None);
        assert_eq!(spare.take(0, 0, 120), Some(d));
        assert_eq!(
            spare.take(1, 2, 107),
            Some(c),
            "a node the spares had not seen"
        );
    }

    #[test]
    fn only_a_surplus_of_ready_blocks_is_lent_and_the_oldest_first() {
        let mut r = Reclaim::new(100);
        let block = |i: u64| GlobalAddr::host(1, 4096 + 64 * i);
        let n = (LEND_KEEP + LEND_BATCH) as u64;
        // One short of the surplus, every block ready: nothing to lend.
        for i in 0..n - 1 {
            r.retire(block(i), 2, i);
        }
        assert_eq!(r.surplus(u64::MAX), None);
        assert!(!r.has_surplus(u64::MAX));
        // The last one retired, but not yet ready at 100 + n - 2.
        r.retire(block(n - 1), 2, n - 1);
        assert_eq!(r.surplus(100 + n - 2), None, "one is not ready yet");
        assert!(r.has_surplus(100 + n - 1));
        let (node, c, lent) = r.surplus(100 + n - 1).expect("a surplus");
        assert_eq!((node, c), (1, 2));
        assert_eq!(lent, (0..LEND_BATCH as u64).map(block).collect::<Vec<_>>());
        assert_eq!(r.waiting(), LEND_KEEP, "the keep stays");
        assert_eq!(r.surplus(u64::MAX), None);
        // Not lent after all: back at the front, ready at once.
        r.restore(&lent, 2);
        assert_eq!(r.take(2, 1, 0), Some(block(0)));
        assert_eq!(r.take(2, 1, 0), Some(block(1)));
        // A block out of order (a spare retired later by a client whose
        // clock read earlier) is never lent before it is ready.
        let mut s = Reclaim::new(100);
        s.retire(block(0), 0, 1000);
        for i in 1..n {
            s.retire(block(i), 0, 0);
        }
        assert_eq!(s.surplus(100 + 999), None, "the front is not ready");
        assert!(s.surplus(1100).is_some());
    }

    #[test]
    fn a_leaving_client_lends_every_ready_block_in_batches() {
        let mut r = Reclaim::new(100);
        let block = |node: NodeId, i: u64| GlobalAddr::host(node, 4096 + 64 * i);
        assert_eq!(r.ready_batch(u64::MAX), None, "nothing held");
        // Node 1, class 3: a batch and 3 more, the last not ready before
        // 100 + 1000; node 0, class 0: one block, never seen (ready now).
        let n = LEND_BATCH as u64 + 3;
        for i in 0..n - 1 {
            r.retire(block(1, i), 3, i);
        }
        r.retire(block(1, n - 1), 3, 1000);
        r.give_back(block(0, 0), 0);
        assert_eq!(r.ready_batch(0), Some((0, 0, vec![block(0, 0)])));
        assert_eq!(r.ready_batch(50), None, "nothing else ready yet");
        let (node, c, first) = r.ready_batch(1099).unwrap();
        assert_eq!((node, c), (1, 3));
        assert_eq!(
            first,
            (0..LEND_BATCH as u64)
                .map(|i| block(1, i))
                .collect::<Vec<_>>()
        );
        assert_eq!(
            r.ready_batch(1099),
            Some((1, 3, vec![block(1, n - 3), block(1, n - 2)])),
            "the batch ends before the block not yet ready"
        );
        assert_eq!(r.ready_batch(1099), None);
        assert_eq!(r.earliest_at_least(0), Some(1100));
        assert_eq!(r.ready_batch(1100), Some((1, 3, vec![block(1, n - 1)])));
        assert_eq!(r.waiting(), 0);
    }

    #[test]
    fn rests_are_carved_once_and_whole() {
        let at = |off: u64| GlobalAddr::host(2, off);
        // 3 blocks of class 2 (256 B), then 128 + 64; 40 B are left over.
        let blocks = blocks_of(at(4096), 3 * 256 + 192 + 40, 2);
        let want = [(4096, 2), (4352, 2), (4608, 2), (4864, 1), (4992, 0)];
        let want: Vec<_> = want.iter().map(|&(o, c)| (at(o), c)).collect();
        assert_eq!(blocks, want);
        assert!(blocks_of(at(4096), 63, 0).is_empty());
        let mut r = Reclaim::new(100);
        r.add_rests([(at(8192), 40), (at(4096), 300), (at(16384), 128)]);
        assert!(r.has_rests(), "a rest under a line is not kept");
        assert_eq!(r.carve(2), Some(at(4096)));
        assert_eq!(r.carve(2), None, "44 bytes left there, 128 elsewhere");
        assert_eq!(r.carve(1), Some(at(16384)));
        assert!(!r.has_rests(), "the 44 bytes left are under a line");
        r.add_rests([(at(4096), 256)]);
        let mut other = Reclaim::new(100);
        other.absorb(&mut r);
        assert!(
            !r.has_rests() && other.has_rests(),
            "absorbed with the lists"
        );
        assert_eq!(other.take_rests(), vec![(at(4096), 256)]);
        assert_eq!(other.carve(0), None);
    }

    #[test]
    fn tags_are_unique_and_need_an_incarnation() {
        let mut r = Reclaim::new(1);
        assert_eq!(r.next_tag(), None);
        r.set_incarnation(3);
        let t1 = r.next_tag().unwrap();
        let t2 = r.next_tag().unwrap();
        assert_ne!(t1, t2);
        assert_ne!(t1, 0);
        assert!(t1 <= super::super::layout::TAG_MAX);
        r.set_incarnation(MAX_INCARNATION);
        assert!(r.next_tag().unwrap() <= super::super::layout::TAG_MAX);
    }
}
