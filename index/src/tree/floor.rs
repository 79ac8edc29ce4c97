//! The index cache's searches: sorted keys with samples ([`Sampled`]),
//! and the map from a cached node's low fence to its slot, per level
//! ([`FloorMap`]): a sorted map answering "the greatest key at or below
//! `key`" over flat arrays. Its keys live in blocks of at most
//! [`MAX_BLOCK`], each found by its first key; an insert or removal moves
//! at most a block's entries (and, when a block splits or empties, the
//! block list), where one sorted array would move half the map. A
//! `BTreeMap`'s `range(..=key).next_back()` was 133 of a 3,000-instruction
//! tree lookup on emu: it finds both ends of the range.

/// Entries a block holds before it splits in two.
const MAX_BLOCK: usize = 128;

/// Keys to a group of [`Sampled`].
const GROUP: usize = 8;

/// Keys in ascending order, with the last of every group of [`GROUP`]
/// copied into an array of their own. "How many keys are at or below
/// `key`" counts over the copies, then over one group: two steps, each of
/// comparisons that do not wait for one another. A binary search over 128
/// keys is seven steps, each load waiting for the comparison before it,
/// and on emu the index cache's lines are in L2 at best (each lookup's
/// 1 KiB leaf copy pushes them out of L1): its two binary searches were a
/// sixth of a Sherman lookup's time there.
#[derive(Clone, Debug, Default)]
pub(super) struct Sampled<K> {
    keys: Vec<K>,
    samples: Vec<K>,
}

impl<K: Copy + Ord> Sampled<K> {
    /// `keys` ascending. Keys out of order (a corrupt node's) give
    /// counts that are wrong but never out of `0..=len`.
    pub(super) fn new(keys: Vec<K>) -> Sampled<K> {
        let mut s = Sampled {
            keys,
            samples: Vec::new(),
        };
        s.resample();
        s
    }

    fn resample(&mut self) {
        self.samples.clear();
        let every = self.keys.iter().skip(GROUP - 1).step_by(GROUP);
        self.samples.extend(every.copied());
    }

    pub(super) fn keys(&self) -> &[K] {
        &self.keys
    }

    pub(super) fn len(&self) -> usize {
        self.keys.len()
    }

    /// Keys copied as samples (one per full group).
    pub(super) fn sample_count(&self) -> usize {
        self.samples.len()
    }

    /// How many keys are at or below `key`. The samples at or below it are
    /// a prefix (the keys ascend), `g` of them: every key of the first `g`
    /// groups is at or below it, and of group `g` some first part.
    #[inline]
    pub(super) fn count_le(&self, key: K) -> usize {
        let g: usize = self.samples.iter().map(|&s| (s <= key) as usize).sum();
        let start = g * GROUP;
        let group = &self.keys[start..(start + GROUP).min(self.keys.len())];
        start + group.iter().map(|&k| (k <= key) as usize).sum::<usize>()
    }

    fn search(&self, key: K) -> Result<usize, usize> {
        self.keys.binary_search(&key)
    }

    fn insert(&mut self, i: usize, key: K) {
        self.keys.insert(i, key);
        self.resample();
    }

    fn remove(&mut self, i: usize) -> K {
        let k = self.keys.remove(i);
        self.resample();
        k
    }

    fn split_off(&mut self, at: usize) -> Sampled<K> {
        let upper = Sampled::new(self.keys.split_off(at));
        self.resample();
        upper
    }
}

struct Block<K> {
    keys: Sampled<K>,
    vals: Vec<usize>,
}

pub(super) struct FloorMap<K> {
    /// The first key of each block, ascending; never an empty block.
    firsts: Vec<K>,
    blocks: Vec<Block<K>>,
}

impl<K: Copy + Ord> FloorMap<K> {
    pub(super) fn new() -> FloorMap<K> {
        FloorMap {
            firsts: Vec::new(),
            blocks: Vec::new(),
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.blocks.iter().map(|b| b.keys.len()).sum()
    }

    /// The block that holds `key` if anything does: the last whose first
    /// key is at or below it (none when `key` is below them all).
    fn block_of(&self, key: K) -> Option<usize> {
        self.firsts.partition_point(|&f| f <= key).checked_sub(1)
    }

    /// The entry with the greatest key at or below `key`.
    pub(super) fn floor(&self, key: K) -> Option<(K, usize)> {
        let b = &self.blocks[self.block_of(key)?];
        // At least 1: the block's first key is at or below `key`.
        let i = b.keys.count_le(key) - 1;
        Some((b.keys.keys()[i], b.vals[i]))
    }

    /// Maps `key` to `val`; the value it replaced.
    pub(super) fn insert(&mut self, key: K, val: usize) -> Option<usize> {
        // A key below every block's goes first in the first block.
        let Some(bi) = self
            .block_of(key)
            .or((!self.blocks.is_empty()).then_some(0))
        else {
            self.firsts.push(key);
            self.blocks.push(Block {
                keys: Sampled::new(vec![key]),
                vals: vec![val],
            });
            return None;
        };
        let b = &mut self.blocks[bi];
        let i = match b.keys.search(key) {
            Ok(i) => return Some(std::mem::replace(&mut b.vals[i], val)),
            Err(i) => i,
        };
        b.keys.insert(i, key);
        b.vals.insert(i, val);
        if i == 0 {
            self.firsts[bi] = key;
        }
        if b.keys.len() > MAX_BLOCK {
            let half = b.keys.len() / 2;
            let upper = Block {
                keys: b.keys.split_off(half),
                vals: b.vals.split_off(half),
            };
            self.firsts.insert(bi + 1, upper.keys.keys()[0]);
            self.blocks.insert(bi + 1, upper);
        }
        None
    }

    /// Removes `key`; its value.
    pub(super) fn remove(&mut self, key: K) -> Option<usize> {
        let bi = self.block_of(key)?;
        let b = &mut self.blocks[bi];
        let i = b.keys.search(key).ok()?;
        b.keys.remove(i);
        let val = b.vals.remove(i);
        if b.keys.len() == 0 {
            self.firsts.remove(bi);
            self.blocks.remove(bi);
        } else if i == 0 {
            self.firsts[bi] = b.keys.keys()[0];
        }
        Some(val)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16, usize),
        Remove(u16),
        Floor(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (any::<u16>(), any::<usize>()).prop_map(|(k, v)| Op::Insert(k % 2048, v)),
            2 => any::<u16>().prop_map(|k| Op::Remove(k % 2048)),
            3 => any::<u16>().prop_map(|k| Op::Floor(k % 2048)),
        ]
    }

    proptest! {
        /// Any sequence of inserts, removals and floors answers as a
        /// `BTreeMap` does, and the blocks stay sorted, non-empty, within
        /// their bound and headed by their first keys.
        #[test]
        fn answers_as_a_btreemap_does(ops in proptest::collection::vec(op(), 1..3000)) {
            let mut m = FloorMap::new();
            let mut r = BTreeMap::new();
            for o in ops {
                match o {
                    Op::Insert(k, v) => prop_assert_eq!(m.insert(k, v), r.insert(k, v)),
                    Op::Remove(k) => prop_assert_eq!(m.remove(k), r.remove(&k)),
                    Op::Floor(k) => prop_assert_eq!(
                        m.floor(k),
                        r.range(..=k).next_back().map(|(&k, &v)| (k, v))
                    ),
                }
                prop_assert_eq!(m.len(), r.len());
            }
            let mut all = Vec::new();
            for (f, b) in m.firsts.iter().zip(&m.blocks) {
                prop_assert!(b.keys.len() > 0 && b.keys.len() <= MAX_BLOCK);
                prop_assert_eq!(*f, b.keys.keys()[0]);
                prop_assert_eq!(b.keys.len(), b.vals.len());
                let fresh = Sampled::new(b.keys.keys().to_vec());
                prop_assert_eq!(&b.keys.samples, &fresh.samples, "samples kept up");
                all.extend(b.keys.keys().iter().copied().zip(b.vals.iter().copied()));
            }
            prop_assert!(all.windows(2).all(|w| w[0].0 < w[1].0));
            prop_assert_eq!(all, r.into_iter().collect::<Vec<_>>());
        }

        /// Counts keys at or below any probe as a scan does, for any
        /// length (groups full or not, no samples at all) and repeats.
        #[test]
        fn counts_as_a_scan_does(
            mut keys in proptest::collection::vec(0u16..600, 0..300),
            probes in proptest::collection::vec(any::<u16>(), 1..50),
        ) {
            keys.sort_unstable();
            let s = Sampled::new(keys.clone());
            for p in probes {
                let p = p % 700;
                prop_assert_eq!(s.count_le(p), keys.iter().filter(|&&k| k <= p).count());
            }
        }
    }
}
