//! The index cache of a compute node (Sherman §4.4): internal nodes —
//! those one level above the leaves and the levels above — so that a lookup
//! whose route is cached reads only its leaf. Bounded in bytes; when full, an
//! entry is evicted by the power of two choices (the less used of two
//! random entries). A cached route can go stale when another compute node
//! splits; clients detect that from the fences of the node they reach and
//! invalidate the entry.
//!
//! Shared by the compute node's threads, and every lookup of every one of
//! them passes here, so a lookup writes no line that the other threads
//! write too (the paper's cache is a lock-free skiplist for the same
//! reason). Behind a sharded reader-writer lock (crossbeam's
//! `ShardedLock`): a reader takes only its own thread's shard, a writer
//! (a cache fill or invalidation, rare once the cache is warm) all of
//! them. Use counts are sharded the same way (`UseCounts`). Sharding
//! both raised two emu threads' lookup rate by about 15% (`loch-bench run
//! --backend emu --threads 2 --workload ycsb-c`), for 45 more
//! instructions a lookup on one thread.

use super::floor::{FloorMap, Sampled};
use super::key::TreeKey;
use super::layout::Node;
use crossbeam_utils::sync::ShardedLock as RwLock;
use nicdrv::GlobalAddr;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

struct Cached<K> {
    addr: GlobalAddr,
    level: u8,
    low: K,
    high: K,
    /// The children's low fences (the first is the node's) and addresses.
    keys: Sampled<K>,
    children: Vec<GlobalAddr>,
}

impl<K: TreeKey> Cached<K> {
    /// Bytes it counts: 48 plus its two fences, a key and an address per
    /// child, and a key per eight children, the search's samples (64, 16
    /// and 8 with 8-byte keys).
    fn bytes(&self) -> usize {
        let samples = self.keys.sample_count();
        48 + 2 * K::BYTES + self.children.len() * (K::BYTES + 8) + samples * K::BYTES
    }

    /// The index of the child whose range holds `key` (which the node
    /// covers).
    fn child_at(&self, key: K) -> usize {
        self.keys.count_le(key).saturating_sub(1)
    }
}

/// Shards of the use counts (a power of two).
const USE_SHARDS: usize = 8;

/// How often each slot's cached node was used, for eviction: one array
/// of counts per shard, each its own allocation, a thread counting in
/// shard `i % USE_SHARDS` for the `i`th thread to count. A count that
/// every thread bumped would be a line written by every lookup of the
/// compute node; eviction sums the shards. A single-threaded simulation
/// counts in one shard, so its choices are those of one count per node.
/// The counts (8 words a slot) sit outside the cache's byte bound.
struct UseCounts([Vec<AtomicU64>; USE_SHARDS]);

impl UseCounts {
    /// Counts a use of `slot`. A load and a store, not a
    /// read-modify-write: the threads sharing a shard race only with
    /// each other, and the count only has to tell busy entries from idle
    /// ones, so an increment lost to a race costs nothing that matters.
    /// Relaxed: nothing is published through it.
    fn note(&self, slot: usize) {
        // The mask: the compiler cannot see that the shard is in range.
        let u = &self.0[use_shard() & (USE_SHARDS - 1)][slot];
        u.store(u.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    }

    /// Uses of `slot`, all shards (under the write lock: no use is being
    /// counted).
    fn total(&self, slot: usize) -> u64 {
        self.0
            .iter()
            .fold(0u64, |t, s| t.wrapping_add(s[slot].load(Ordering::Relaxed)))
    }

    /// One use of `slot`, its new node's (under the write lock).
    fn reset(&mut self, slot: usize) {
        for (i, s) in self.0.iter_mut().enumerate() {
            *s[slot].get_mut() = u64::from(i == 0);
        }
    }

    /// A count for a new slot in every shard (under the write lock).
    fn push(&mut self) {
        for s in &mut self.0 {
            s.push(AtomicU64::new(0));
        }
    }
}

/// The calling thread's shard of the use counts.
fn use_shard() -> usize {
    thread_local! {
        static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    // Relaxed: a ticket; only its distinctness matters.
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    SHARD.with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT.fetch_add(1, Ordering::Relaxed) % USE_SHARDS);
        }
        s.get()
    })
}

struct Inner<K> {
    /// Per level (index 0 unused: leaves are never cached), cached nodes
    /// by low fence. A map per level rather than one keyed by (level,
    /// low): a lookup compares one word per step, not two (the cache's
    /// search was 350 instructions of a 4,400-instruction lookup on emu).
    by_level: Vec<FloorMap<K>>,
    slots: Vec<Option<Cached<K>>>,
    /// Each slot's uses (as many in each shard as there are slots).
    uses: UseCounts,
    free: Vec<usize>,
    bytes: usize,
}

impl<K: TreeKey> Inner<K> {
    /// The low fence and slot of the cached node at `level` with the
    /// greatest low fence at or below `key`.
    fn covering(&self, level: u8, key: K) -> Option<(K, usize)> {
        self.by_level.get(level as usize)?.floor(key)
    }

    fn insert(&mut self, level: u8, low: K, slot: usize) {
        let l = level as usize;
        if self.by_level.len() <= l {
            self.by_level.resize_with(l + 1, FloorMap::new);
        }
        self.by_level[l].insert(low, slot);
    }

    fn remove(&mut self, level: u8, low: K) -> Option<usize> {
        self.by_level.get_mut(level as usize)?.remove(low)
    }
}

/// A compute node's cache of internal nodes of a tree with keys of `K`.
pub struct IndexCache<K: TreeKey = u64> {
    inner: RwLock<Inner<K>>,
    max_bytes: usize,
    rng: AtomicU64,
}

/// What a cache lookup found: the cached node and its child for the key.
#[derive(Copy, Clone, Debug)]
pub struct Route {
    /// The cached node's address.
    pub node: GlobalAddr,
    /// The cached node's level (1: just above the leaves).
    pub level: u8,
    /// The child of the cached node whose range holds the key.
    pub child: GlobalAddr,
}

impl<K: TreeKey> IndexCache<K> {
    /// An empty cache of at most `max_bytes` bytes (0: caches nothing).
    pub fn new(max_bytes: usize) -> IndexCache<K> {
        IndexCache {
            inner: RwLock::new(Inner {
                by_level: Vec::new(),
                slots: Vec::new(),
                uses: UseCounts(Default::default()),
                free: Vec::new(),
                bytes: 0,
            }),
            max_bytes,
            rng: AtomicU64::new(0x2545_F491_4F6C_DD1D),
        }
    }

    /// The deepest cached node covering `key` with a level in
    /// `min_level..=max_level`, with its child for `key`.
    pub fn route(&self, key: K, min_level: u8, max_level: u8) -> Option<Route> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        for level in min_level..=max_level {
            let Some((_, slot)) = inner.covering(level, key) else {
                continue;
            };
            let Some(c) = inner.slots[slot].as_ref() else {
                continue;
            };
            if key < c.low || key >= c.high {
                continue;
            }
            inner.uses.note(slot);
            let child = c.children[c.child_at(key)];
            return Some(Route {
                node: c.addr,
                level,
                child,
            });
        }
        None
    }

    /// Caches an internal node just read (replacing what covered its low
    /// fence at its level).
    pub fn insert(&self, addr: GlobalAddr, node: &Node<'_, K>) {
        if node.is_leaf() || self.max_bytes == 0 {
            return;
        }
        let (keys, children) = node.children().into_iter().unzip();
        let c = Cached {
            addr,
            level: node.level(),
            low: node.low(),
            high: node.high(),
            keys: Sampled::new(keys),
            children,
        };
        let need = c.bytes();
        if need > self.max_bytes {
            return;
        }
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        let (level, low) = (c.level, c.low);
        if let Some(old) = inner.remove(level, low) {
            Self::drop_slot(&mut inner, old);
        }
        // Every cached node counts some bytes: none means nothing to evict.
        while inner.bytes + need > self.max_bytes && inner.bytes > 0 {
            self.evict_one(&mut inner);
        }
        let slot = match inner.free.pop() {
            Some(s) => s,
            None => {
                inner.slots.push(None);
                inner.uses.push();
                inner.slots.len() - 1
            }
        };
        inner.bytes += need;
        inner.slots[slot] = Some(c);
        inner.uses.reset(slot);
        inner.insert(level, low, slot);
    }

    /// Forgets the cached node at `level` whose range starts at `low`.
    pub fn invalidate(&self, level: u8, low: K) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = inner.remove(level, low) {
            Self::drop_slot(&mut inner, slot);
        }
    }

    /// The leaves a range scan from `key` would visit next, as the cached
    /// node just above the leaves names them: the child covering `key`
    /// and the ones after it, at most `out.len()`, written into `out`.
    /// Returns how many (0 when no cached node covers `key` at level 1).
    /// The caller checks each leaf's fences: a split since the node was
    /// cached leaves a gap, which it finds and walks around.
    pub fn leaves_from(&self, key: K, out: &mut [GlobalAddr]) -> usize {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        let Some((_, slot)) = inner.covering(1, key) else {
            return 0;
        };
        let Some(c) = inner.slots[slot].as_ref() else {
            return 0;
        };
        if key < c.low || key >= c.high || c.children.is_empty() {
            return 0;
        }
        inner.uses.note(slot);
        let first = c.child_at(key);
        let n = (c.children.len() - first).min(out.len());
        for (o, &child) in out.iter_mut().zip(&c.children[first..first + n]) {
            *o = child;
        }
        n
    }

    /// Forgets the cached node covering `key` at `level`, if any.
    pub fn invalidate_covering(&self, level: u8, key: K) {
        let low = {
            let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
            inner.covering(level, key).map(|(low, _)| low)
        };
        if let Some(low) = low {
            self.invalidate(level, low);
        }
    }

    fn drop_slot(inner: &mut Inner<K>, slot: usize) {
        if let Some(c) = inner.slots[slot].take() {
            inner.bytes -= c.bytes();
            inner.free.push(slot);
        }
    }

    fn next_rand(&self) -> u64 {
        // xorshift; Relaxed: any interleaving of updates is random enough.
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.store(x, Ordering::Relaxed);
        x
    }

    /// Power of two choices: of two random cached nodes, evict the one used
    /// less.
    fn evict_one(&self, inner: &mut Inner<K>) {
        let n = inner.slots.len();
        let pick = || {
            for _ in 0..8 {
                let s = (self.next_rand() % n as u64) as usize;
                if inner.slots[s].is_some() {
                    return Some(s);
                }
            }
            inner.slots.iter().position(|s| s.is_some())
        };
        let (Some(a), Some(b)) = (pick(), pick()) else {
            return;
        };
        let uses = |s: usize| inner.uses.total(s);
        let victim = if uses(a) <= uses(b) { a } else { b };
        if let Some((level, low)) = inner.slots[victim].as_ref().map(|c| (c.level, c.low)) {
            inner.remove(level, low);
        }
        Self::drop_slot(inner, victim);
    }

    /// Bytes cached now, counted as 64 per node, 16 per child and 8 per
    /// eight children (with 8-byte keys; wider keys count their bytes).
    pub fn bytes(&self) -> usize {
        self.inner.read().unwrap_or_else(|p| p.into_inner()).bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::layout::{Layout, NodeMut, NODE_BYTES};

    fn l() -> Layout {
        Layout::new(8, 8).unwrap()
    }

    /// An internal node at `level` over `[low, high)` whose children start
    /// at `low`, `low + step`, ..., named `base + i`.
    fn node(level: u8, low: u64, high: u64, step: u64, base: u64) -> Vec<u8> {
        let mut b = vec![0u8; NODE_BYTES];
        let mut n = NodeMut::new(l(), &mut b);
        n.init(level, low, high, GlobalAddr::NULL, 1);
        n.set_leftmost(GlobalAddr::from_raw(base << 10));
        let mut i = 1;
        while low + i * step < high && i < 20 {
            let child = GlobalAddr::from_raw((base + i) << 10);
            n.set_child(i as usize - 1, low + i * step, child);
            i += 1;
        }
        n.set_count(i as usize - 1);
        b
    }

    #[test]
    fn routes_find_the_deepest_covering_node_and_forget_on_invalidate() {
        let c = IndexCache::<u64>::new(1 << 20);
        let at = |x: u64| GlobalAddr::from_raw(x << 10);
        c.insert(at(1), &Node::new(l(), &node(2, 0, 1000, 100, 10)));
        c.insert(at(2), &Node::new(l(), &node(1, 100, 200, 10, 50)));
        // Level 1 covers 150: its child for 150 (children at 100, 110, ...).
        let r = c.route(150, 1, u8::MAX).unwrap();
        assert_eq!((r.level, r.node, r.child), (1, at(2), at(55)));
        // 250: only level 2 covers it.
        let r = c.route(250, 1, u8::MAX).unwrap();
        assert_eq!((r.level, r.node, r.child), (2, at(1), at(12)));
        let mut leaves = [GlobalAddr::NULL; 4];
        assert_eq!(c.leaves_from(185, &mut leaves), 2);
        assert_eq!(&leaves[..2], &[at(58), at(59)]);
        assert_eq!(
            c.leaves_from(250, &mut leaves),
            0,
            "no level-1 node covers it"
        );
        c.invalidate_covering(1, 199);
        assert_eq!(c.route(150, 1, u8::MAX).unwrap().level, 2);
        // A node replacing another at the same low fence.
        c.insert(at(3), &Node::new(l(), &node(2, 0, 1000, 100, 70)));
        assert_eq!(c.route(250, 1, u8::MAX).unwrap().child, at(72));
    }

    #[test]
    fn use_counts_add_up_across_threads_and_restart_with_a_new_node() {
        let mut u = UseCounts(Default::default());
        u.push();
        u.push();
        // Threads one after another (no lost increments), each counting in
        // the shard its ticket names: the total is every use, wherever
        // each was counted.
        for _ in 0..4 {
            std::thread::scope(|t| {
                t.spawn(|| (0..500).for_each(|_| u.note(1)));
            });
        }
        u.note(0);
        assert_eq!((u.total(0), u.total(1)), (1, 2000));
        let shards = u.0.iter().filter(|s| s[1].load(Ordering::Relaxed) > 0);
        assert!(shards.count() > 1, "four threads counted in one shard");
        u.reset(1);
        assert_eq!(u.total(1), 1, "a new node starts at one use");
    }

    #[test]
    fn eviction_keeps_the_cache_within_its_bytes() {
        let one = Cached {
            addr: GlobalAddr::NULL,
            level: 1,
            low: 0,
            high: 1,
            keys: Sampled::new(vec![0; 11]),
            children: vec![GlobalAddr::NULL; 11],
        }
        .bytes();
        let c = IndexCache::<u64>::new(5 * one);
        for i in 0..50u64 {
            c.insert(
                GlobalAddr::from_raw((i + 1) << 10),
                &Node::new(l(), &node(1, i * 1000, (i + 1) * 1000, 100, i * 100)),
            );
            assert!(c.bytes() <= 5 * one, "{} bytes after {i}", c.bytes());
        }
        let inner = c.inner.read().unwrap();
        let mapped: usize = inner.by_level.iter().map(FloorMap::len).sum();
        let live = inner.slots.iter().filter(|s| s.is_some()).count();
        assert_eq!(mapped, live, "maps and slots in step");
        assert_eq!(live, 5);
    }
}
