//! The keys workloads give their records: record `i` (a dense index,
//! `0..n` loaded, later ones inserted) has key [`key_of`]`(i)`, spread over
//! the key space so that neighbouring records land on different leaves and
//! buckets. Every driver that loads an index — `loch demo`, `loch node`,
//! `loch-bench` — uses these, so their figures describe the same data.

/// The key of record `i`: `i` times an odd constant (2^64 / φ, so
/// consecutive records are far apart), a bijection on u64, with the top
/// bit cleared — distinct records below 2^63 get distinct keys, and
/// `u64::MAX`, which the tree reserves, is never a key.
pub fn key_of(i: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 1
}

/// Records `key_of(i)` → `i` for `i` in `0..n`, in key order (a bulk
/// load's input).
pub fn records_sorted(n: u64) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = (0..n).map(|i| (key_of(i), i)).collect();
    v.sort_unstable();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_distinct_and_never_the_reserved_one() {
        let n = 1 << 16;
        let sorted = records_sorted(n);
        assert_eq!(sorted.len() as u64, n);
        assert!(sorted.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(sorted.iter().all(|&(k, i)| k == key_of(i)));
        assert!(key_of(u64::MAX) < u64::MAX);
        // Records past the loaded ones (inserts) never collide with them.
        let loaded: std::collections::HashSet<u64> = sorted.iter().map(|p| p.0).collect();
        assert!((n..2 * n).all(|i| !loaded.contains(&key_of(i))));
    }
}
