//! One client interface over both indexes, for code that runs the same
//! workload on either: the benchmark (`--systems sherman,cuckoo`) and the
//! demo. Keys and values are `u64`; the hash table stores them as 8-byte
//! little-endian keys and values; a tree of wider keys ([`WideTree`])
//! stores key `k` as [`wide_key`]`(k)`.

use crate::cuckoo::{Cuckoo, CuckooClient, CuckooError};
use crate::tree::key::{narrow_key, wide_key, wide_key_into};
use crate::tree::layout::{widen, Layout};
use crate::tree::{
    Tree, TreeClient, TreeClientOf, TreeConfig, TreeError, TreeKey, TreeOf, TreeStats,
};
use nicdrv::{Ctx, Nic};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// A compute node's handle on either index.
#[derive(Clone)]
pub enum AnyIndex {
    /// The Sherman B+tree (or its FG+ baseline).
    Tree(Arc<Tree>),
    /// The tree with keys wider than 8 bytes.
    Wide(WideTree),
    /// The Nessie cuckoo hash table.
    Hash(Arc<Cuckoo>),
}

/// Generates [`WideTree`] and [`WideClient`], one variant per key width,
/// and `wide!`, which runs an expression on whichever variant a value is.
macro_rules! wide_trees {
    ($($v:ident = $n:literal),*) => {
        /// Key widths besides 8 that [`AnyIndex::tree`] makes trees for.
        pub const WIDE_KEY_BYTES: &[usize] = &[$($n),*];

        /// A tree of `[u8; N]` keys, for each width of [`WIDE_KEY_BYTES`].
        #[derive(Clone)]
        pub enum WideTree {
            $(#[doc = concat!("Keys of ", $n, " bytes.")] $v(Arc<TreeOf<[u8; $n]>>),)*
        }

        /// A client of a [`WideTree`] (boxed).
        pub enum WideClient {
            $(#[doc = concat!("Keys of ", $n, " bytes.")] $v(Box<TreeClientOf<[u8; $n]>>),)*
        }

        impl WideTree {
            fn new(key_bytes: usize, cfg: TreeConfig, dm_bytes: u64) -> Option<Result<WideTree, TreeError>> {
                match key_bytes {
                    $($n => Some(TreeOf::new(cfg, dm_bytes).map(WideTree::$v)),)*
                    _ => None,
                }
            }
            fn client(&self, id: u64) -> Result<WideClient, TreeError> {
                Ok(match self {
                    $(WideTree::$v(t) => WideClient::$v(Box::new(t.client(id)?)),)*
                })
            }
        }

        macro_rules! wide {
            ($e:expr, $c:ident => $body:expr) => {
                match $e {
                    $(WideClient::$v($c) => $body,)*
                }
            };
        }
    };
}

wide_trees!(
    K16 = 16,
    K32 = 32,
    K64 = 64,
    K128 = 128,
    K256 = 256,
    K512 = 512,
    K1024 = 1024
);

/// A wide-key operation's future, boxed: one holding a wide key is as
/// large as the key, and a plain `async` dispatch would grow every
/// [`AnyClient`] future (the `u64` tree's too) to the largest of them.
type Boxed<'a, T> = Pin<Box<dyn Future<Output = Result<T, TreeError>> + 'a>>;

impl WideClient {
    fn create<'a, N: Nic>(&'a mut self, ctx: &'a Ctx<N>) -> Boxed<'a, ()> {
        wide!(self, c => Box::pin(c.create(ctx)))
    }
    fn get<'a, N: Nic>(&'a mut self, ctx: &'a Ctx<N>, key: u64) -> Boxed<'a, Option<u64>> {
        wide!(self, c => Box::pin(c.get(ctx, wide_key(key))))
    }
    fn put<'a, N: Nic>(&'a mut self, ctx: &'a Ctx<N>, key: u64, value: u64) -> Boxed<'a, ()> {
        wide!(self, c => Box::pin(c.put(ctx, wide_key(key), value)))
    }
    fn delete<'a, N: Nic>(&'a mut self, ctx: &'a Ctx<N>, key: u64) -> Boxed<'a, bool> {
        wide!(self, c => Box::pin(c.delete(ctx, wide_key(key))))
    }
    fn scan<'a, N: Nic>(
        &'a mut self,
        ctx: &'a Ctx<N>,
        low: u64,
        high: u64,
        limit: usize,
    ) -> Boxed<'a, Vec<(u64, u64)>> {
        wide!(self, c => Box::pin(async move {
            let got = c.scan(ctx, wide_key(low), wide_key(high), limit).await?;
            Ok(got.into_iter().map(|(k, v)| (narrow_key(&k), v)).collect())
        }))
    }
    fn bulk_load<'a, N: Nic>(
        &'a mut self,
        ctx: &'a Ctx<N>,
        records: Vec<(u64, u64)>,
        loaded: Arc<AtomicU64>,
    ) -> Boxed<'a, u64> {
        wide!(self, c => {
            let items = records.into_iter().map(|(k, v)| (wide_key(k), v));
            Box::pin(load_tree(c, ctx, items, loaded))
        })
    }
    fn stats(&self) -> TreeStats {
        wide!(self, c => c.stats)
    }
    fn reset_stats(&mut self) {
        wide!(self, c => c.stats = TreeStats::default())
    }
}

/// A bulk load of `items` by `c`, leaves 4/5 full (36 of 45 entries in
/// 1 KiB leaves), counting the records landed into `loaded`.
async fn load_tree<N: Nic, K: TreeKey>(
    c: &mut TreeClientOf<K>,
    ctx: &Ctx<N>,
    items: impl IntoIterator<Item = (K, u64)>,
    loaded: Arc<AtomicU64>,
) -> Result<u64, TreeError> {
    c.report_loaded(loaded);
    let fill = c.tree().layout().leaf_fanout() * 4 / 5;
    c.bulk_load(ctx, items, fill).await
}

/// Why a workload's record sizes are refused ([`record_layout`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SizeError {
    /// Keys of this many bytes: neither 8 nor one of [`WIDE_KEY_BYTES`].
    Key(usize),
    /// The values' size, in words ([`Layout::new`]'s).
    Value(String),
}

impl SizeError {
    /// The error as a command line says it, naming its own flags.
    pub fn for_flags(&self, key_flag: &str, value_flag: &str) -> String {
        match self {
            SizeError::Key(n) => {
                format!("{key_flag} must be 8 or one of {WIDE_KEY_BYTES:?}, got {n}")
            }
            SizeError::Value(m) => format!("{value_flag}: {m}"),
        }
    }
}

/// The node layout of the tree that records of `key_bytes`-byte keys and
/// `value_bytes`-byte values take through this interface (the hash table
/// takes the same sizes): keys of 8 bytes or one of [`WIDE_KEY_BYTES`],
/// values of 8 to 1024 bytes.
pub fn record_layout(key_bytes: usize, value_bytes: usize) -> Result<Layout, SizeError> {
    Layout::new(8, value_bytes).map_err(SizeError::Value)?;
    if key_bytes != 8 && !WIDE_KEY_BYTES.contains(&key_bytes) {
        return Err(SizeError::Key(key_bytes));
    }
    // Both sizes are in range now, so this cannot fail; its message
    // would be the key's.
    Layout::new(key_bytes, value_bytes).map_err(|_| SizeError::Key(key_bytes))
}

impl AnyIndex {
    /// A tree for `key_bytes`-byte keys (8, or one of [`WIDE_KEY_BYTES`]);
    /// [`TreeOf::new`]'s errors, and `Config` for another width.
    pub fn tree(key_bytes: usize, cfg: TreeConfig, dm_bytes: u64) -> Result<AnyIndex, TreeError> {
        if key_bytes == 8 {
            return Ok(AnyIndex::Tree(Tree::new(cfg, dm_bytes)?));
        }
        match WideTree::new(key_bytes, cfg, dm_bytes) {
            Some(t) => Ok(AnyIndex::Wide(t?)),
            None => Err(TreeError::Config(format!(
                "keys of {key_bytes} bytes: this interface runs 8 or one of {WIDE_KEY_BYTES:?}"
            ))),
        }
    }
}

/// Why an operation through [`AnyClient`] failed.
#[derive(Debug)]
pub enum AnyError {
    /// A tree operation failed.
    Tree(TreeError),
    /// A hash table operation failed.
    Hash(CuckooError),
    /// A scan of the hash table, which keeps no order.
    NoScans,
    /// A bulk load of the hash table, which has none (put the records).
    NoBulkLoad,
}

impl fmt::Display for AnyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnyError::Tree(e) => e.fmt(f),
            AnyError::Hash(e) => e.fmt(f),
            AnyError::NoScans => write!(f, "the hash table has no scans"),
            AnyError::NoBulkLoad => write!(f, "the hash table has no bulk load"),
        }
    }
}

impl std::error::Error for AnyError {}

impl From<TreeError> for AnyError {
    fn from(e: TreeError) -> Self {
        AnyError::Tree(e)
    }
}

impl From<CuckooError> for AnyError {
    fn from(e: CuckooError) -> Self {
        AnyError::Hash(e)
    }
}

impl AnyIndex {
    /// A client for one task. `id` marks tree locks: non-zero and unique
    /// among live clients; the hash table ignores it. Fails with
    /// `Tree(Config)` for an `id` of 0 on the tree.
    pub fn client(&self, id: u64) -> Result<AnyClient, AnyError> {
        Ok(match self {
            AnyIndex::Tree(t) => AnyClient::Tree(Box::new(t.client(id)?)),
            AnyIndex::Wide(t) => AnyClient::Wide(t.client(id)?),
            AnyIndex::Hash(h) => AnyClient::Hash(Box::new(h.client()?)),
        })
    }

    /// Whether this is the hash table (which has no scans).
    pub fn is_hash(&self) -> bool {
        matches!(self, AnyIndex::Hash(_))
    }
}

/// One task's client of either index. Every operation fails with the
/// index's own error, wrapped in [`AnyError::Tree`] or [`AnyError::Hash`].
/// Both are boxed: the enum stays a pointer wide whichever grows.
pub enum AnyClient {
    /// A client of the tree (boxed).
    Tree(Box<TreeClient>),
    /// A client of a tree of wider keys.
    Wide(WideClient),
    /// A client of the hash table (boxed).
    Hash(Box<CuckooClient>),
}

/// A key or value as the hash table takes it: 8 bytes on the stack, or
/// more on the heap.
enum Bytes {
    Word([u8; 8]),
    Wide(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Word(w) => w,
            Bytes::Wide(v) => v,
        }
    }
}

/// Key `k` in a table of `key_bytes`-byte keys: its 8 little-endian bytes
/// (as ever), or for wider keys [`wide_key`]'s bytes: big-endian, repeated.
fn hash_key(key_bytes: usize, k: u64) -> Bytes {
    if key_bytes == 8 {
        return Bytes::Word(k.to_le_bytes());
    }
    let mut w = vec![0u8; key_bytes];
    wide_key_into(k, &mut w);
    Bytes::Wide(w)
}

/// Value `v` in a table whose values are up to `max_bytes`: its 8
/// little-endian bytes, or repeated to fill them ([`widen`]) when more.
fn hash_value(max_bytes: usize, v: u64) -> Bytes {
    if max_bytes <= 8 {
        return Bytes::Word(v.to_le_bytes());
    }
    let mut w = vec![0u8; max_bytes];
    widen(v, &mut w);
    Bytes::Wide(w)
}

fn word(v: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = v.len().min(8);
    b[..n].copy_from_slice(&v[..n]);
    u64::from_le_bytes(b)
}

impl AnyClient {
    /// Creates the index unless it exists; idempotent
    /// ([`TreeClient::create`], [`CuckooClient::create`]).
    pub async fn create<N: Nic>(&mut self, ctx: &Ctx<N>) -> Result<(), AnyError> {
        match self {
            AnyClient::Tree(c) => Ok(c.create(ctx).await?),
            AnyClient::Wide(w) => Ok(w.create(ctx).await?),
            AnyClient::Hash(c) => Ok(c.create(ctx).await?),
        }
    }

    /// The value of `key`, if present (with values wider than 8 bytes,
    /// their first 8). From the hash table: the stored value's first 8
    /// bytes as a little-endian `u64` (a shorter value is padded with
    /// zeros).
    pub async fn get<N: Nic>(&mut self, ctx: &Ctx<N>, key: u64) -> Result<Option<u64>, AnyError> {
        match self {
            AnyClient::Tree(c) => Ok(c.get(ctx, key).await?),
            AnyClient::Wide(w) => Ok(w.get(ctx, key).await?),
            AnyClient::Hash(c) => {
                let k = hash_key(c.table().config().key_bytes, key);
                Ok(c.get(ctx, &k).await?.map(|v| word(&v)))
            }
        }
    }

    /// Inserts `key` or replaces its value. Wider values store `value`
    /// repeated to fill them ([`widen`]). The hash table stores 8-byte keys
    /// and values as little-endian words, wider keys as [`wide_key`]'s
    /// bytes and values as wide as its largest (its keys must have 8 bytes
    /// or more and its values be allowed 8: else `KeySize` or
    /// `ValueTooLarge`).
    pub async fn put<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        key: u64,
        value: u64,
    ) -> Result<(), AnyError> {
        match self {
            AnyClient::Tree(c) => Ok(c.put(ctx, key, value).await?),
            AnyClient::Wide(w) => Ok(w.put(ctx, key, value).await?),
            AnyClient::Hash(c) => {
                let cfg = c.table().config();
                let k = hash_key(cfg.key_bytes, key);
                let v = hash_value(cfg.max_value_bytes, value);
                Ok(c.put(ctx, &k, &v).await?)
            }
        }
    }

    /// Removes `key`; returns whether it was present.
    pub async fn delete<N: Nic>(&mut self, ctx: &Ctx<N>, key: u64) -> Result<bool, AnyError> {
        match self {
            AnyClient::Tree(c) => Ok(c.delete(ctx, key).await?),
            AnyClient::Wide(w) => Ok(w.delete(ctx, key).await?),
            AnyClient::Hash(c) => {
                let k = hash_key(c.table().config().key_bytes, key);
                Ok(c.delete(ctx, &k).await?)
            }
        }
    }

    /// Up to `limit` entries with keys in `[low, high)`, in key order
    /// ([`TreeClient::scan`]). Fails with `NoScans` on the hash table,
    /// which reads nothing.
    pub async fn scan<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        low: u64,
        high: u64,
        limit: usize,
    ) -> Result<Vec<(u64, u64)>, AnyError> {
        match self {
            AnyClient::Tree(c) => Ok(c.scan(ctx, low, high, limit).await?),
            AnyClient::Wide(w) => Ok(w.scan(ctx, low, high, limit).await?),
            AnyClient::Hash(_) => Err(AnyError::NoScans),
        }
    }

    /// Node splits this client made so far (the hash table never splits).
    pub fn splits(&self) -> u64 {
        match self {
            AnyClient::Tree(c) => c.stats.splits,
            AnyClient::Wide(w) => w.stats().splits,
            AnyClient::Hash(_) => 0,
        }
    }

    /// Sets this client's counters back to zero.
    pub fn reset_stats(&mut self) {
        match self {
            AnyClient::Tree(c) => c.stats = TreeStats::default(),
            AnyClient::Wide(w) => w.reset_stats(),
            AnyClient::Hash(c) => c.stats = Default::default(),
        }
    }

    /// The client's counters in the tree's terms: the hash table reports
    /// its restarted attempts as read retries, its gets as lookups, and
    /// gets answered from its location cache as cache hits (the others as
    /// misses); it has no locks.
    pub fn tree_stats(&self) -> TreeStats {
        match self {
            AnyClient::Tree(c) => c.stats,
            AnyClient::Wide(w) => w.stats(),
            AnyClient::Hash(c) => TreeStats {
                read_retries: c.stats.retries,
                lookups: c.stats.gets,
                cache_hits: c.stats.cache_hits,
                cache_misses: c.stats.gets.saturating_sub(c.stats.cache_hits),
                ..TreeStats::default()
            },
        }
    }

    /// Loads an empty tree from `records` (`(key, value)`, keys strictly
    /// increasing) by one client's bulk load, leaves 4/5 full (36 of 45
    /// entries in 1 KiB leaves), counting the records landed into
    /// `loaded`; the number loaded ([`TreeClientOf::bulk_load`]). The hash
    /// table has no bulk load: `NoBulkLoad`, nothing loaded.
    pub async fn bulk_load<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        records: Vec<(u64, u64)>,
        loaded: Arc<AtomicU64>,
    ) -> Result<u64, AnyError> {
        match self {
            AnyClient::Tree(c) => Ok(load_tree(c, ctx, records, loaded).await?),
            AnyClient::Wide(w) => Ok(w.bulk_load(ctx, records, loaded).await?),
            AnyClient::Hash(_) => Err(AnyError::NoBulkLoad),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_layouts_take_the_sizes_the_interface_runs() {
        assert_eq!(record_layout(8, 8).unwrap().node_bytes(), 1024);
        for &k in WIDE_KEY_BYTES {
            let l = record_layout(k, 1024).unwrap();
            assert_eq!((l.key_bytes(), l.value_bytes()), (k, 1024));
        }
        // A size between the widths, or past them, is the key's error; a
        // value out of range is the value's, whatever the key.
        for k in [0, 7, 12, 24, 2048] {
            assert_eq!(record_layout(k, 8), Err(SizeError::Key(k)));
        }
        for v in [0, 7, 1025] {
            assert!(matches!(record_layout(12, v), Err(SizeError::Value(_))));
        }
        assert_eq!(
            SizeError::Key(12).for_flags("--key-size", "--value-size"),
            "--key-size must be 8 or one of [16, 32, 64, 128, 256, 512, 1024], got 12"
        );
        assert_eq!(
            record_layout(8, 7).unwrap_err().for_flags("-k", "-v"),
            "-v: values must be 8 to 1024 bytes, not 7"
        );
    }
}
