//! Where a key may live: its two candidate buckets and its fingerprint.
//!
//! The second bucket is computed from the first and the fingerprint alone
//! (partial-key cuckoo hashing, as in cuckoo filters), so a displacement
//! finds where an entry can move from its slot word, without reading the
//! entry. The map `alt(b, fp) = (c(fp) − b) mod B` is an involution:
//! `alt(alt(b)) = b`, so an entry found in either bucket names the other.
//! Its fixed points (`2b ≡ c`, at most two when `B` is even: `b0` and
//! `b0 + B/2`) are paired with each other, so every key has two distinct
//! buckets. `B` is even by construction (`CuckooConfig::buckets`).

use super::layout::{fmix64, hash64, FP_BITS};

/// A key's two buckets (`b1` is its first choice, and the canonical order
/// of its 16 slots starts there) and fingerprint.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Loc {
    pub b1: u64,
    pub b2: u64,
    pub fp: u16,
}

const ALT_SEED: u64 = 0x5bd1_e995_7a3c_91f1;

/// The other bucket of an entry with fingerprint `fp` found in bucket `b`.
pub fn alt(b: u64, fp: u16, buckets: u64) -> u64 {
    debug_assert!(buckets >= 2 && buckets.is_multiple_of(2) && b < buckets);
    let c = fmix64(fp as u64 ^ ALT_SEED) % buckets;
    let a = (c + buckets - b) % buckets;
    if a == b {
        (b + buckets / 2) % buckets
    } else {
        a
    }
}

/// Where `key` may live in a table of `buckets` buckets.
pub fn locate(key: &[u8], seed: u64, buckets: u64) -> Loc {
    let h = hash64(key, seed);
    // The bucket from the high bits (multiply-shift), the fingerprint from
    // the low bits: independent enough, one hash per key.
    let b1 = ((h as u128 * buckets as u128) >> 64) as u64;
    let fp = (h & ((1 << FP_BITS) - 1)) as u16;
    Loc {
        b1,
        b2: alt(b1, fp, buckets),
        fp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alt_is_an_involution_without_fixed_points() {
        for buckets in [2u64, 4, 6, 10, 64, 1000, 4096] {
            for fp in 0..(1u16 << FP_BITS) {
                for b in (0..buckets).step_by(((buckets / 50) as usize).max(1)) {
                    let a = alt(b, fp, buckets);
                    assert!(a < buckets);
                    assert_ne!(a, b, "B={buckets} fp={fp} b={b}");
                    assert_eq!(alt(a, fp, buckets), b, "B={buckets} fp={fp} b={b}");
                }
            }
        }
    }

    #[test]
    fn keys_spread_over_buckets() {
        let buckets = 64u64;
        let mut hits = vec![0u32; buckets as usize];
        for k in 0..64_000u64 {
            let l = locate(&k.to_le_bytes(), 1, buckets);
            assert_eq!(alt(l.b1, l.fp, buckets), l.b2);
            hits[l.b1 as usize] += 1;
        }
        assert!(hits.iter().all(|&h| (800..1200).contains(&h)), "{hits:?}");
    }
}
