//! Reuse of data entries after a grace period, and the tags that make every
//! empty slot word unique.
//!
//! Owns one client's free lists. A data entry unlinked from the table (the
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
//! Entries retired by a client that crashes are lost with it (a leak, not a
//! hazard), and so are tentative entries it left in the table.

use nicdrv::{GlobalAddr, NodeId};
use std::collections::VecDeque;

/// Block classes: 1, 2, 4, …, 128 lines.
pub const CLASSES: usize = 8;

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
    incarnation: u64,
    count: u64,
}

impl Reclaim {
    pub fn new(grace_ns: u64) -> Reclaim {
        Reclaim {
            grace_ns,
            lists: Vec::new(),
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

    /// Blocks waiting, over all classes.
    pub fn waiting(&self) -> usize {
        self.lists.iter().flatten().map(|l| l.len()).sum()
    }
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
