//! The Sherman B+tree on disaggregated memory (SIGMOD 2022), made correct.
//!
//! Nodes are 1 KiB in memory-node host memory ([`layout`]); internal nodes
//! are sorted, leaves unsorted with entries changed in place. Every node
//! has fences [low, high) and a right sibling (a B-link tree), so a client
//! that reaches a node after a concurrent split moves right. Writers lock a
//! node with HOCL ([`hocl`]), read it, change a local copy and write back
//! only the changed entry together with the unlock (command combination);
//! a split writes the new sibling, the rewritten node and the unlock in one
//! doorbell when both nodes are on one memory node, then inserts the
//! separator into the parent. Readers accept a node only when all its line
//! versions agree. Compute nodes cache internal nodes ([`cache`]).
//!
//! Promises: get, put and delete are linearizable; a scan returns keys in
//! order, every key present throughout the scan, and no key absent
//! throughout (not a snapshot, as in the paper §4.4). Keys are any `u64`
//! but `u64::MAX` ([`Tree`]), or, in a [`TreeOf`] made for them, any
//! fixed-width byte string of 8 to 1024 bytes but the all-ones one
//! ([`TreeKey`]). Nodes never merge: a delete frees its slot and leaves
//! the node in place (underfull nodes stay).
//!
//! Each Sherman technique can be switched off alone ([`TreeConfig`]), and
//! [`TreeConfig::fg_plus`] is the paper's FG+ baseline.

mod bulk;
pub mod cache;
pub mod config;
mod floor;
pub mod hocl;
pub mod key;
pub mod layout;
mod read;
use read::check_node_addr;
mod scan;
mod split;
mod write;

pub use config::{TreeConfig, VersionScheme};
pub use key::TreeKey;

use cache::IndexCache;
use hocl::{Local, LocalLocks, LockRef, Page, Turn};
use layout::{Layout, LeafItems, Node, NodeMut};
use mempool::{AllocError, RemoteAllocator, TREE_ROOT_OFF};
use nicdrv::{Buf, Ctx, GlobalAddr, Nic, VerbError};
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// The well-known word on memory node 0 holding the root's address and
/// level (nodes are 1 KiB aligned, so the level fits in the low bits).
pub const ROOT_WORD: GlobalAddr = GlobalAddr::host(0, TREE_ROOT_OFF);
const LEVEL_MASK: u64 = layout::NODE_ALIGN - 1;
/// The highest level a root may have (the root word's check).
const MAX_LEVEL: u8 = 63;
/// READ retries of one node before giving up on it as corrupt.
const MAX_READ_RETRIES: u32 = 100_000;
/// Restarts of one operation before reporting a livelock.
const MAX_RESTARTS: u32 = 1_000_000;

/// How long a split needing a level above the root waits for another
/// client's root split to be installed before installing it itself
/// (`split.rs`, `help_grow_root`). An install is three round trips and
/// roots split a handful of times in a tree's life, so 1 ms (hundreds of
/// round trips) is passed almost only by an installer whose link failed
/// or whose thread stalled; helping one that was only slow costs a node.
const ROOT_HELP_NS: u64 = 1_000_000;
/// Sibling pointers one descent or parent update follows, over all its
/// restarts, before calling the chain corrupt (a cycle of pointers, which
/// no tree makes: a chain is as long as the splits since its start was
/// read). Lookups and writes at the leaves count a hop as a restart.
const MAX_SIBLING_HOPS: u32 = 100_000;

/// Why a tree operation failed.
#[derive(Debug)]
pub enum TreeError {
    /// A verb failed (a memory node died, …).
    Verb(VerbError),
    /// No memory for a new node.
    Alloc(AllocError),
    /// The largest key (`u64::MAX`, or all ones) is reserved as +∞.
    ReservedKey,
    /// A value (or a buffer for one) that is not the tree's `value_bytes`
    /// long.
    ValueSize {
        /// The tree's `value_bytes`.
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// No tree at the root word: call `create` first.
    NotCreated,
    /// Bulk load needs an empty tree.
    NotEmpty,
    /// Bulk load input must be strictly increasing, and each part's keys
    /// must lie inside its range.
    Unsorted {
        /// The key before `key`, or the part's low fence when `key` lies
        /// outside the part's range (as `{:?}` shows it).
        prev: String,
        /// The key out of order or out of range (as `{:?}` shows it).
        key: String,
    },
    /// A node that never reads consistently, or whose header is impossible;
    /// also an operation that restarted without end.
    Corrupt {
        /// The node's address ([`ROOT_WORD`] for a descent that restarted
        /// without end).
        addr: GlobalAddr,
        /// What was wrong, in words.
        why: &'static str,
    },
    /// An invalid configuration, or a client id of 0; the reason in words.
    Config(String),
    /// A node's lock stayed taken for longer than the tree's
    /// `lock_wait_ns` while this client tried for it: a client that died
    /// holding it (Sherman's locks have no leases) or never released it.
    /// Nothing was written under that lock; the operation may still have
    /// taken effect before it (a put whose leaf split was written, failing
    /// on the parent's lock: its key is visible).
    LockWait {
        /// The lock word.
        word: GlobalAddr,
        /// What the word held at the last try: the holder's client id.
        holder: u64,
        /// How long this client tried, on its NIC's clock.
        waited_ns: u64,
    },
}

impl fmt::Display for TreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TreeError::Verb(e) => write!(f, "tree verb failed: {e}"),
            TreeError::Alloc(e) => write!(f, "tree node allocation failed: {e}"),
            TreeError::ReservedKey => {
                write!(f, "the largest key (u64::MAX, or all ones) is reserved")
            }
            TreeError::ValueSize { expected, got } => {
                write!(f, "values are {expected} bytes in this tree, not {got}")
            }
            TreeError::NotCreated => write!(f, "no tree exists yet (create it first)"),
            TreeError::NotEmpty => write!(f, "bulk load needs an empty tree"),
            TreeError::Unsorted { prev, key } => {
                write!(
                    f,
                    "bulk load keys must increase strictly: {key} after {prev}"
                )
            }
            TreeError::Corrupt { addr, why } => write!(f, "tree node at {addr} is corrupt: {why}"),
            TreeError::Config(s) => write!(f, "invalid tree configuration: {s}"),
            TreeError::LockWait {
                word,
                holder,
                waited_ns,
            } => write!(
                f,
                "the lock at {word} stayed held by client {holder} for {} ms: a client that \
                 died holding it, or one that never releases it; nothing was written under \
                 it",
                waited_ns / 1_000_000
            ),
        }
    }
}

impl std::error::Error for TreeError {}

impl From<VerbError> for TreeError {
    fn from(e: VerbError) -> Self {
        TreeError::Verb(e)
    }
}

impl From<AllocError> for TreeError {
    fn from(e: AllocError) -> Self {
        match e {
            AllocError::Verb(v) => TreeError::Verb(v),
            other => TreeError::Alloc(other),
        }
    }
}

/// What one client counted (exact; benchmarks report them per operation).
/// Every field is a count of events since the client was made or the
/// caller last reset [`TreeClient::stats`].
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TreeStats {
    /// Node READs that failed the version check and were read again.
    pub read_retries: u64,
    /// Remote lock CASes that found the lock taken.
    pub lock_retries: u64,
    /// Locks received from a local holder without a remote CAS.
    pub handovers: u64,
    /// Of those, locks that came with the holder's copy of the node (no
    /// READ).
    pub pages_handed_over: u64,
    /// Descents to a leaf (one per get, put, delete or scan, more after a
    /// stale route) whose leaf address came from the index cache.
    pub cache_hits: u64,
    /// Descents to a leaf whose leaf's parent was not cached: they read
    /// internal nodes, from the deepest cached one or from the root.
    pub cache_misses: u64,
    /// Right moves along sibling pointers.
    pub sibling_hops: u64,
    /// Nodes this client split, leaves and internal nodes.
    pub splits: u64,
    /// Gets that found their leaf at the first try (no hop, no stale route)
    /// with no READ retried.
    pub clean_lookups: u64,
    /// Gets of a valid key, whether they succeeded or not.
    pub lookups: u64,
    /// Lock words this client may have left taken after a verb failed
    /// (a release that did not land, or a CAS whose answer was lost), and
    /// those it released later (`write.rs`, "Stranded locks").
    pub locks_stranded: u64,
    pub stranded_released: u64,
    /// Root splits another client left uninstalled past `ROOT_HELP_NS`,
    /// that this one installed (`split.rs`, `help_grow_root`).
    pub root_helps: u64,
}

impl std::ops::AddAssign for TreeStats {
    fn add_assign(&mut self, o: Self) {
        self.read_retries += o.read_retries;
        self.lock_retries += o.lock_retries;
        self.handovers += o.handovers;
        self.pages_handed_over += o.pages_handed_over;
        self.cache_hits += o.cache_hits;
        self.cache_misses += o.cache_misses;
        self.sibling_hops += o.sibling_hops;
        self.splits += o.splits;
        self.clean_lookups += o.clean_lookups;
        self.lookups += o.lookups;
        self.locks_stranded += o.locks_stranded;
        self.stranded_released += o.stranded_released;
        self.root_helps += o.root_helps;
    }
}

/// A tree as one compute node sees it: configuration, the local lock
/// table and the index cache, shared by the node's threads. Keys are of
/// type `K` ([`TreeKey`]: `u64`, or `[u8; N]` for N of 8 to 1024), fixed
/// for the tree's life: every compute node must use the same.
///
/// # Example
///
/// Byte keys and whole values: 16-byte instrument symbols (ordered byte by
/// byte, zero-padded) mapped to 64-byte records, on an embedded emu
/// cluster:
///
/// ```rust
/// use cluster::{EmuCluster, EmuClusterConfig};
/// use index::tree::{TreeConfig, TreeOf};
/// use nicdrv::ExecutorConfig;
///
/// fn symbol(s: &str) -> [u8; 16] {
///     let mut k = [0u8; 16];
///     k[..s.len()].copy_from_slice(s.as_bytes());
///     k
/// }
///
/// let memory = EmuClusterConfig::default();
/// let cluster = EmuCluster::boot(&memory).unwrap();
/// let cfg = TreeConfig {
///     value_bytes: 64,
///     ..TreeConfig::sherman(memory.host_bytes)
/// };
/// let tree = TreeOf::<[u8; 16]>::new(cfg, memory.dm_bytes).unwrap();
/// let mut executor = cluster.executor(ExecutorConfig::default()).unwrap();
/// executor
///     .spawn(move |ctx| async move {
///         let mut t = tree.client(1).unwrap();
///         t.create(&ctx).await.unwrap();
///         let mut record = [0u8; 64];
///         record[..5].copy_from_slice(b"bid=7");
///         t.put_value(&ctx, symbol("ACME.N"), &record).await.unwrap();
///         t.put_value(&ctx, symbol("ACME.L"), &record).await.unwrap();
///         let mut got = [0u8; 64];
///         assert!(t.get_value(&ctx, symbol("ACME.N"), &mut got).await.unwrap());
///         assert_eq!(&got[..5], b"bid=7");
///         // Every ACME listing, in symbol order.
///         let (lo, hi) = (symbol("ACME."), symbol("ACME/"));
///         let listed: Vec<[u8; 16]> = t.scan(&ctx, lo, hi, 10).await.unwrap()
///             .into_iter().map(|(k, _)| k).collect();
///         assert_eq!(listed, [symbol("ACME.L"), symbol("ACME.N")]);
///     })
///     .unwrap();
/// executor.run();
/// ```
pub struct TreeOf<K: TreeKey> {
    cfg: TreeConfig,
    layout: Layout,
    locks: LocalLocks,
    cache: IndexCache<K>,
    table_words: u64,
    /// Lock words this compute node's clients may have left taken
    /// (`write.rs`, "Stranded locks"), with the id each holds.
    stranded: std::sync::Mutex<Vec<Stranded>>,
    /// How many `stranded` holds, for a cheap look at each operation.
    strand_count: AtomicUsize,
}

/// A lock word a failed verb may have left taken: `lock`, holding `taker`.
#[derive(Copy, Clone, Debug)]
struct Stranded {
    lock: LockRef,
    taker: u64,
}

impl Stranded {
    /// Whether this is the word `word` holding `taker`: what identifies a
    /// stranded word (one word may be stranded by several takers in turn).
    fn is(&self, word: GlobalAddr, taker: u64) -> bool {
        self.lock.word == word && self.taker == taker
    }
}

/// The tree of `u64` keys.
pub type Tree = TreeOf<u64>;

impl<K: TreeKey> TreeOf<K> {
    /// The compute node's handle. `dm_bytes` is the device memory each
    /// memory node offers, in bytes; the lock table is cut down to fit it.
    /// Reads and writes nothing. Fails with [`TreeError::Config`] when
    /// `cfg.check()` rejects `cfg`, or when `cfg.lock_in_dm` is set and
    /// `dm_bytes` holds no 8-byte lock word.
    pub fn new(cfg: TreeConfig, dm_bytes: u64) -> Result<Arc<TreeOf<K>>, TreeError> {
        cfg.check().map_err(TreeError::Config)?;
        let table_words = cfg.lock_table_words.min(dm_bytes / 8);
        if cfg.lock_in_dm && table_words == 0 {
            return Err(TreeError::Config(
                "locks in device memory, but the memory nodes have none".into(),
            ));
        }
        let layout = Layout::new(K::BYTES, cfg.value_bytes).map_err(TreeError::Config)?;
        if cfg.chunk.chunk_bytes < 4 * layout.node_bytes() as u64 {
            return Err(TreeError::Config(format!(
                "chunks must hold at least a few nodes ({} bytes)",
                4 * layout.node_bytes()
            )));
        }
        Ok(Arc::new(TreeOf {
            layout,
            locks: LocalLocks::new(table_words.max(64) as usize),
            cache: IndexCache::new(cfg.cache_bytes),
            table_words: table_words.max(1),
            cfg,
            stranded: std::sync::Mutex::new(Vec::new()),
            strand_count: AtomicUsize::new(0),
        }))
    }

    /// The configuration the tree was made with.
    pub fn config(&self) -> &TreeConfig {
        &self.cfg
    }

    /// The node layout the key type and the configuration's value size
    /// give.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// This compute node's index cache, shared by its clients.
    pub fn cache(&self) -> &IndexCache<K> {
        &self.cache
    }

    fn lock_of(&self, node: GlobalAddr) -> LockRef {
        hocl::lock_of(&self.cfg, self.table_words, self.locks.entries(), node)
    }

    /// Whether some lock word is stranded (`write.rs`, "Stranded locks"):
    /// one load.
    #[inline]
    fn has_stranded(&self) -> bool {
        // Acquire: pairs with change_stranded's Release; a count read
        // stale only defers a release to a later operation.
        self.strand_count.load(Ordering::Acquire) != 0
    }

    /// Takes the stranded word `word` holding `taker` off the list; whether
    /// it was on it.
    fn unstrand(&self, word: GlobalAddr, taker: u64) -> bool {
        if !self.has_stranded() {
            return false;
        }
        self.change_stranded(|s| {
            let at = s.iter().position(|x| x.is(word, taker));
            at.map(|i| s.swap_remove(i)).is_some()
        })
    }

    /// Records the stranded word `x`, once: while a link stays down, every
    /// failed operation could add the same word again, and every
    /// operation of the compute node walks the list.
    fn add_stranded(&self, x: Stranded) {
        self.change_stranded(|s| {
            if !s.iter().any(|y| y.is(x.lock.word, x.taker)) {
                s.push(x);
            }
        });
    }

    /// Changes the stranded locks, and their count under the same lock
    /// (Release: pairs with the Acquire look in `release_stranded`).
    fn change_stranded<R>(&self, f: impl FnOnce(&mut Vec<Stranded>) -> R) -> R {
        let mut s = self.stranded.lock().expect("no panics hold it");
        let r = f(&mut s);
        self.strand_count.store(s.len(), Ordering::Release);
        r
    }

    /// A client for one task. `id` must be non-zero and unique among live
    /// clients of the cluster (it marks the locks it holds), and not used
    /// on another compute node while this handle lives: a lock word a
    /// failed verb may have left holding it is released later by CAS from
    /// it (`write.rs`, "Stranded locks"). Reads and writes nothing. Fails
    /// with [`TreeError::Config`] for an `id` of 0.
    pub fn client(self: &Arc<TreeOf<K>>, id: u64) -> Result<TreeClientOf<K>, TreeError> {
        if id == 0 {
            return Err(TreeError::Config("client id must be non-zero".into()));
        }
        Ok(TreeClientOf {
            tree: self.clone(),
            alloc: RemoteAllocator::new(self.cfg.chunk.clone())?,
            id,
            stats: TreeStats::default(),
            root_hint: 0,
            leaf_fill_16: (self.layout.leaf_fanout() as u32 / 2) << 4,
            layout: self.layout,
            loaded: None,
        })
    }
}

/// A node's lock taken by [`TreeClient::lock_node`], to be given back
/// with [`TreeClient::unlock_node`].
#[must_use = "a held lock must be released with unlock_node"]
pub struct NodeLock(Held);

/// A held lock, to be released exactly once.
#[must_use = "a held lock must be released (write_and_release or abandon)"]
struct Held {
    lock: LockRef,
    /// What the lock word holds while held: the id of the client whose CAS
    /// took it (this one's, or a local holder's before a handover).
    taker: u64,
    /// How the local lock table entry is held (None: no local table).
    local: Option<Turn>,
    /// The tree node the lock was taken for.
    node: GlobalAddr,
}

/// One task's handle on a tree. Operations take `&mut self`: one at a
/// time per client.
///
/// # Example
///
/// One task on an embedded emu cluster (two memory nodes in this process)
/// creates a tree, puts two keys, gets one and scans them:
///
/// ```rust
/// use cluster::{EmuCluster, EmuClusterConfig};
/// use index::tree::{Tree, TreeConfig};
/// use nicdrv::ExecutorConfig;
///
/// let memory = EmuClusterConfig::default();
/// let cluster = EmuCluster::boot(&memory).unwrap();
/// let tree = Tree::new(TreeConfig::sherman(memory.host_bytes), memory.dm_bytes).unwrap();
/// let mut executor = cluster.executor(ExecutorConfig::default()).unwrap();
/// executor
///     .spawn(move |ctx| async move {
///         let mut t = tree.client(1).unwrap(); // ids: non-zero, unique
///         t.create(&ctx).await.unwrap();
///         t.put(&ctx, 10, 1_000).await.unwrap();
///         t.put(&ctx, 20, 2_000).await.unwrap();
///         assert_eq!(t.get(&ctx, 10).await.unwrap(), Some(1_000));
///         let all = t.scan(&ctx, 0, u64::MAX, 10).await.unwrap();
///         assert_eq!(all, [(10, 1_000), (20, 2_000)]);
///     })
///     .unwrap();
/// executor.run(); // until every task has finished
/// ```
pub struct TreeClientOf<K: TreeKey> {
    tree: Arc<TreeOf<K>>,
    alloc: RemoteAllocator,
    id: u64,
    /// What this client counted; callers read it and may reset it.
    pub stats: TreeStats,
    root_hint: u64,
    /// The tree's node layout (a copy of [`Tree::layout`]).
    layout: Layout,
    /// Entries per leaf this client's scans have seen, in 1/16ths (a
    /// moving mean): how many leaves a scan's first parallel read takes.
    leaf_fill_16: u32,
    /// Bulk-loaded records written so far, for a progress display.
    loaded: Option<Arc<AtomicU64>>,
}

fn decode_root(w: u64) -> (GlobalAddr, u8) {
    (
        GlobalAddr::from_raw(w & !LEVEL_MASK),
        (w & LEVEL_MASK) as u8,
    )
}

/// The client of a tree of `u64` keys.
pub type TreeClient = TreeClientOf<u64>;

fn check_key<K: TreeKey>(key: K) -> Result<(), TreeError> {
    if key == K::INFINITY {
        Err(TreeError::ReservedKey)
    } else {
        Ok(())
    }
}

impl<K: TreeKey> TreeClientOf<K> {
    /// The tree this client works on.
    pub fn tree(&self) -> &Arc<TreeOf<K>> {
        &self.tree
    }

    /// A view of a node's bytes in this tree's layout.
    fn node<'b>(&self, b: &'b [u8]) -> Node<'b, K> {
        Node::new(self.layout, b)
    }

    /// A mutable view of a node's bytes in this tree's layout.
    fn node_mut<'b>(&self, b: &'b mut [u8]) -> NodeMut<'b, K> {
        NodeMut::new(self.layout, b)
    }

    /// Allocates a node in memory-node memory.
    async fn alloc_raw<N: Nic>(&mut self, ctx: &Ctx<N>) -> Result<GlobalAddr, TreeError> {
        let nb = self.layout.node_bytes() as u64;
        Ok(self.alloc.alloc(ctx, nb, layout::NODE_ALIGN).await?)
    }

    /// Creates an empty tree (one leaf) unless one exists. Idempotent:
    /// racing creators agree on the first (the others' leaves are left
    /// unused). Fails with `Alloc` when no memory node has room for the
    /// leaf, `Verb` when a verb fails.
    pub async fn create<N: Nic>(&mut self, ctx: &Ctx<N>) -> Result<(), TreeError> {
        if ctx.read(ROOT_WORD, 8).await?.u64_at(0) != 0 {
            return Ok(());
        }
        let leaf = self.alloc_raw(ctx).await?;
        let mut buf = ctx.alloc(self.layout.node_bytes())?;
        self.node_mut(buf.as_mut_slice())
            .init(0, K::MIN, K::INFINITY, GlobalAddr::NULL, 1);
        let mut b = ctx.batch();
        b.write(leaf, buf);
        b.submit().await?;
        // Lost the race to another creator: theirs stands, our leaf is unused.
        let _ = ctx.cas(ROOT_WORD, 0, leaf.raw()).await?;
        Ok(())
    }

    async fn root<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        fresh: bool,
    ) -> Result<(GlobalAddr, u8), TreeError> {
        if fresh || self.root_hint == 0 {
            let w = ctx.read(ROOT_WORD, 8).await?.u64_at(0);
            if w == 0 {
                return Err(TreeError::NotCreated);
            }
            // The word's low bits hold the root's level: one past any
            // tree's (a tree of 64 levels would outnumber memory's bytes)
            // is a corrupt word, where a level cut to 8 bits had every
            // descent restart until its bound.
            if w & LEVEL_MASK > MAX_LEVEL as u64 {
                return Err(TreeError::Corrupt {
                    addr: ROOT_WORD,
                    why: "the root word names a level past any tree's",
                });
            }
            self.root_hint = w;
        }
        Ok(decode_root(self.root_hint))
    }
}

/// Writes internal node contents: `kids[0]` is the leftmost child (its key
/// is the node's low fence), the rest are (separator, child) in order.
fn fill_internal<K: TreeKey>(m: &mut NodeMut<'_, K>, kids: &[(K, GlobalAddr)]) {
    m.set_leftmost(kids[0].1);
    for i in 0..m.view().fanout() {
        match kids.get(i + 1) {
            Some(&(k, c)) => m.set_child(i, k, c),
            None => m.clear_entry(i),
        }
    }
    m.set_count(kids.len() - 1);
}
