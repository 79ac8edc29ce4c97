//! The keys a tree can be made with: `u64` (8 bytes, the default) or
//! `[u8; N]` for N of 8 to 1024 (ordered byte by byte), each fixed for
//! the tree's life, as Sherman fixes its key size when it is built.

use std::fmt::Debug;

/// A fixed-width, totally ordered key. The largest value is reserved: it
/// stands for +∞ as the last node's high fence.
pub trait TreeKey: Copy + Ord + Debug + Send + Sync + 'static {
    /// Bytes of a key in a node (8 to 1024).
    const BYTES: usize;
    /// The smallest key: the first node's low fence.
    const MIN: Self;
    /// The reserved largest key, +∞.
    const INFINITY: Self;
    /// Writes the key's `BYTES` bytes to `out`.
    fn write_to(&self, out: &mut [u8]);
    /// The key whose bytes `b` (`BYTES` long) are.
    fn read_from(b: &[u8]) -> Self;
}

impl TreeKey for u64 {
    const BYTES: usize = 8;
    const MIN: u64 = 0;
    const INFINITY: u64 = u64::MAX;
    fn write_to(&self, out: &mut [u8]) {
        out[..8].copy_from_slice(&self.to_le_bytes());
    }
    #[inline]
    fn read_from(b: &[u8]) -> u64 {
        u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
    }
}

impl<const N: usize> TreeKey for [u8; N] {
    const BYTES: usize = {
        assert!(N >= 8 && N <= 1024, "keys are 8 to 1024 bytes");
        N
    };
    const MIN: [u8; N] = [0; N];
    const INFINITY: [u8; N] = [0xFF; N];
    fn write_to(&self, out: &mut [u8]) {
        out[..N].copy_from_slice(self);
    }
    #[inline]
    fn read_from(b: &[u8]) -> [u8; N] {
        b[..N].try_into().expect("a key's bytes")
    }
}

/// The `N`-byte key standing for `k`: its big-endian bytes, then those
/// bytes again until `N` are filled. Order-preserving (the first eight
/// bytes decide, the rest follow from them), so workloads drawn as `u64`
/// keep their order and spread at any key size; never +∞ for `k` below
/// `u64::MAX`.
pub fn wide_key<const N: usize>(k: u64) -> [u8; N] {
    let mut out = [0u8; N];
    wide_key_into(k, &mut out);
    out
}

/// [`wide_key`] into `out`, a key of any width (the hash table's keys are
/// sized at run time).
pub fn wide_key_into(k: u64, out: &mut [u8]) {
    let b = k.to_be_bytes();
    for (i, x) in out.iter_mut().enumerate() {
        *x = b[i % 8];
    }
}

/// The `u64` a [`wide_key`] stands for (its first eight bytes).
pub fn narrow_key(k: &[u8]) -> u64 {
    u64::from_be_bytes(k[..8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_keys_keep_the_order_of_their_u64() {
        let ks = [0u64, 1, 255, 256, 1 << 40, u64::MAX - 1];
        for w in ks.windows(2) {
            assert!(wide_key::<16>(w[0]) < wide_key::<16>(w[1]));
            assert!(wide_key::<1024>(w[0]) < wide_key::<1024>(w[1]));
        }
        for &k in &ks {
            assert_eq!(narrow_key(&wide_key::<24>(k)), k);
            assert_ne!(wide_key::<32>(k), <[u8; 32]>::INFINITY);
        }
        let mut b = [0u8; 16];
        wide_key::<16>(7).write_to(&mut b);
        assert_eq!(<[u8; 16]>::read_from(&b), wide_key::<16>(7));
    }
}
