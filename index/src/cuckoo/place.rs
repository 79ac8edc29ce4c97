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

/// Seed of the bits that pick a bucket's copy in a grown table.
const GROW_SEED: u64 = 0x3c6e_f372_fe94_f82b;

/// The other bucket of an entry with fingerprint `fp` found in bucket `b`
/// of a table grown `level` times from `base` buckets (`base << level`
/// in all). Bucket `b` is copy `b / base` of base bucket `b % base`; the
/// other bucket is copy `(b / base) ^ mask(fp)` of the base bucket's other
/// bucket. An involution without fixed points, like [`alt`], and at level
/// 0 it is [`alt`]. Growing adds one bit to the copy numbers: a bucket's
/// other bucket at level `l + 1` is its other bucket at level `l`, or that
/// plus `base << l` (`grow.rs` rests on this).
pub fn alt_at(b: u64, fp: u16, base: u64, level: u32) -> u64 {
    debug_assert!(b < base << level);
    let mask = fmix64(fp as u64 ^ GROW_SEED) & ((1u64 << level) - 1);
    alt(b % base, fp, base) + base * ((b / base) ^ mask)
}

/// Where `key` may live in a table grown `level` times from `base`
/// buckets: [`locate`]'s first bucket, copied as the key's hash bits above
/// the fingerprint say, and its other bucket by [`alt_at`]. At level 0 it
/// is [`locate`]. A key's first bucket at level `l + 1` is its first at
/// level `l`, or that plus `base << l`.
pub fn locate_at(key: &[u8], seed: u64, base: u64, level: u32) -> Loc {
    locate_hash_at(hash64(key, seed), base, level)
}

/// [`locate_at`] of a key whose hash (`hash64` under the table's seed) is
/// `h`: a reader placing one key at two levels hashes it once.
pub fn locate_hash_at(h: u64, base: u64, level: u32) -> Loc {
    let l = locate_hash(h, base);
    let copy = (h >> FP_BITS) & ((1u64 << level) - 1);
    let b1 = l.b1 + base * copy;
    Loc {
        b1,
        b2: alt_at(b1, l.fp, base, level),
        fp: l.fp,
    }
}

/// Where `key` may live in a table of `buckets` buckets.
pub fn locate(key: &[u8], seed: u64, buckets: u64) -> Loc {
    locate_hash(hash64(key, seed), buckets)
}

/// [`locate`] of a key whose hash is `h`.
fn locate_hash(h: u64, buckets: u64) -> Loc {
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
    fn grown_pairs_split_their_parents() {
        for base in [2u64, 6, 10, 64] {
            for level in 0..5u32 {
                let n = base << level;
                for fp in (0..(1u16 << FP_BITS)).step_by(37) {
                    for b in (0..n).step_by(((n / 40) as usize).max(1)) {
                        let a = alt_at(b, fp, base, level);
                        assert!(a < n && a != b);
                        assert_eq!(alt_at(a, fp, base, level), b);
                        if level == 0 {
                            assert_eq!(a, alt(b, fp, base));
                        }
                        // One level up, the bucket and its copy pair with
                        // this pair's other bucket or its copy.
                        let up = alt_at(b, fp, base, level + 1);
                        assert!(up == a || up == a + n, "base {base} level {level}");
                        assert_eq!(alt_at(b + n, fp, base, level + 1) % n, a);
                    }
                }
            }
        }
        for k in 0..2000u64 {
            let key = k.to_le_bytes();
            assert_eq!(locate_at(&key, 9, 10, 0), locate(&key, 9, 10));
            for level in 0..6 {
                let (lo, hi) = (
                    locate_at(&key, 9, 10, level),
                    locate_at(&key, 9, 10, level + 1),
                );
                let n = 10u64 << level;
                assert!(hi.b1 == lo.b1 || hi.b1 == lo.b1 + n);
                assert!(hi.b2 == lo.b2 || hi.b2 == lo.b2 + n);
                assert_eq!(hi.fp, lo.fp);
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
