//! The index cache's map from a cached node's low fence to its slot, per
//! level: a sorted map answering "the greatest key at or below `key`" with
//! two binary searches over flat arrays. Keys live in blocks of at most
//! [`MAX_BLOCK`], each found by its first key; an insert or removal moves
//! at most a block's entries (and, when a block splits or empties, the
//! block list), where one sorted array would move half the map. A
//! `BTreeMap`'s `range(..=key).next_back()` was 133 of a 3,000-instruction
//! tree lookup on emu: it finds both ends of the range.

/// Entries a block holds before it splits in two.
const MAX_BLOCK: usize = 128;

struct Block<K> {
    keys: Vec<K>,
    vals: Vec<usize>,
}

pub(super) struct FloorMap<K> {
    /// The first key of each block, ascending; never an empty block.
    firsts: Vec<K>,
    blocks: Vec<Block<K>>,
    len: usize,
}

impl<K: Copy + Ord> FloorMap<K> {
    pub(super) fn new() -> FloorMap<K> {
        FloorMap {
            firsts: Vec::new(),
            blocks: Vec::new(),
            len: 0,
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.len
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
        let i = b.keys.partition_point(|&k| k <= key) - 1;
        Some((b.keys[i], b.vals[i]))
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
                keys: vec![key],
                vals: vec![val],
            });
            self.len = 1;
            return None;
        };
        let b = &mut self.blocks[bi];
        let i = match b.keys.binary_search(&key) {
            Ok(i) => return Some(std::mem::replace(&mut b.vals[i], val)),
            Err(i) => i,
        };
        b.keys.insert(i, key);
        b.vals.insert(i, val);
        self.len += 1;
        if i == 0 {
            self.firsts[bi] = key;
        }
        if b.keys.len() > MAX_BLOCK {
            let half = b.keys.len() / 2;
            let upper = Block {
                keys: b.keys.split_off(half),
                vals: b.vals.split_off(half),
            };
            self.firsts.insert(bi + 1, upper.keys[0]);
            self.blocks.insert(bi + 1, upper);
        }
        None
    }

    /// Removes `key`; its value.
    pub(super) fn remove(&mut self, key: K) -> Option<usize> {
        let bi = self.block_of(key)?;
        let b = &mut self.blocks[bi];
        let i = b.keys.binary_search(&key).ok()?;
        b.keys.remove(i);
        let val = b.vals.remove(i);
        self.len -= 1;
        if b.keys.is_empty() {
            self.firsts.remove(bi);
            self.blocks.remove(bi);
        } else if i == 0 {
            self.firsts[bi] = b.keys[0];
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
                prop_assert!(!b.keys.is_empty() && b.keys.len() <= MAX_BLOCK);
                prop_assert_eq!(*f, b.keys[0]);
                prop_assert_eq!(b.keys.len(), b.vals.len());
                all.extend(b.keys.iter().copied().zip(b.vals.iter().copied()));
            }
            prop_assert!(all.windows(2).all(|w| w[0].0 < w[1].0));
            prop_assert_eq!(all, r.into_iter().collect::<Vec<_>>());
        }
    }
}
