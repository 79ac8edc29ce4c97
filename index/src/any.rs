//! One client interface over both indexes, for code that runs the same
//! workload on either: the benchmark (`--systems sherman,cuckoo`) and the
//! demo. Keys and values are `u64`; the hash table stores them as 8-byte
//! little-endian keys and values.

use crate::cuckoo::{Cuckoo, CuckooClient, CuckooError};
use crate::tree::{Tree, TreeClient, TreeError, TreeStats};
use nicdrv::{Ctx, Nic};
use std::fmt;
use std::sync::Arc;

/// A compute node's handle on either index.
#[derive(Clone)]
pub enum AnyIndex {
    /// The Sherman B+tree (or its FG+ baseline).
    Tree(Arc<Tree>),
    /// The Nessie cuckoo hash table.
    Hash(Arc<Cuckoo>),
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
}

impl fmt::Display for AnyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnyError::Tree(e) => e.fmt(f),
            AnyError::Hash(e) => e.fmt(f),
            AnyError::NoScans => write!(f, "the hash table has no scans"),
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
    /// A client of the hash table (boxed).
    Hash(Box<CuckooClient>),
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
            AnyClient::Hash(c) => Ok(c.create(ctx).await?),
        }
    }

    /// The value of `key`, if present. From the hash table: the stored
    /// value's first 8 bytes as a little-endian `u64` (a shorter value is
    /// padded with zeros).
    pub async fn get<N: Nic>(&mut self, ctx: &Ctx<N>, key: u64) -> Result<Option<u64>, AnyError> {
        match self {
            AnyClient::Tree(c) => Ok(c.get(ctx, key).await?),
            AnyClient::Hash(c) => Ok(c.get(ctx, &key.to_le_bytes()).await?.map(|v| word(&v))),
        }
    }

    /// Inserts `key` or replaces its value. The hash table stores both as
    /// 8-byte little-endian words: its keys must have 8 bytes and its values
    /// be allowed 8 (else `KeySize` or `ValueTooLarge`).
    pub async fn put<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        key: u64,
        value: u64,
    ) -> Result<(), AnyError> {
        match self {
            AnyClient::Tree(c) => Ok(c.put(ctx, key, value).await?),
            AnyClient::Hash(c) => Ok(c.put(ctx, &key.to_le_bytes(), &value.to_le_bytes()).await?),
        }
    }

    /// Removes `key`; returns whether it was present.
    pub async fn delete<N: Nic>(&mut self, ctx: &Ctx<N>, key: u64) -> Result<bool, AnyError> {
        match self {
            AnyClient::Tree(c) => Ok(c.delete(ctx, key).await?),
            AnyClient::Hash(c) => Ok(c.delete(ctx, &key.to_le_bytes()).await?),
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
            AnyClient::Hash(_) => Err(AnyError::NoScans),
        }
    }

    /// Node splits this client made so far (the hash table never splits).
    pub fn splits(&self) -> u64 {
        match self {
            AnyClient::Tree(c) => c.stats.splits,
            AnyClient::Hash(_) => 0,
        }
    }

    /// Sets this client's counters back to zero.
    pub fn reset_stats(&mut self) {
        match self {
            AnyClient::Tree(c) => c.stats = TreeStats::default(),
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
            AnyClient::Hash(c) => TreeStats {
                read_retries: c.stats.retries,
                lookups: c.stats.gets,
                cache_hits: c.stats.cache_hits,
                cache_misses: c.stats.gets.saturating_sub(c.stats.cache_hits),
                ..TreeStats::default()
            },
        }
    }
}
