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
//! but `u64::MAX`. Nodes never merge: a delete frees its slot and leaves
//! the node in place (underfull nodes stay).
//!
//! Each Sherman technique can be switched off alone ([`TreeConfig`]), and
//! [`TreeConfig::fg_plus`] is the paper's FG+ baseline.

pub mod cache;
pub mod config;
pub mod hocl;
pub mod layout;

pub use config::{TreeConfig, VersionScheme};

use cache::IndexCache;
use hocl::{Local, LocalLocks, LockRef};
use layout::{Node, NodeMut, ENTRY_BYTES, ENTRY_WRITE_BYTES, FANOUT, KEY_INFINITY, NODE_BYTES};
use mempool::{AllocError, RemoteAllocator, TREE_ROOT_OFF};
use nicdrv::{Buf, Ctx, GlobalAddr, Nic, VerbError};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The well-known word on memory node 0 holding the root's address and
/// level (nodes are 1 KiB aligned, so the level fits in the low bits).
pub const ROOT_WORD: GlobalAddr = GlobalAddr::host(0, TREE_ROOT_OFF);
const LEVEL_MASK: u64 = (NODE_BYTES as u64) - 1;
/// READ retries of one node before giving up on it as corrupt.
const MAX_READ_RETRIES: u32 = 100_000;
/// Restarts of one operation before reporting a livelock.
const MAX_RESTARTS: u32 = 1_000_000;

/// Why a tree operation failed.
#[derive(Debug)]
pub enum TreeError {
    /// A verb failed (a memory node died, …).
    Verb(VerbError),
    /// No memory for a new node.
    Alloc(AllocError),
    /// `u64::MAX` is reserved as +∞.
    ReservedKey,
    /// No tree at the root word: call `create` first.
    NotCreated,
    /// Bulk load needs an empty tree.
    NotEmpty,
    /// Bulk load input must be strictly increasing.
    Unsorted {
        prev: u64,
        key: u64,
    },
    /// A node that never reads consistently, or whose header is impossible.
    Corrupt {
        addr: GlobalAddr,
        why: &'static str,
    },
    Config(String),
}

impl fmt::Display for TreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TreeError::Verb(e) => write!(f, "tree verb failed: {e}"),
            TreeError::Alloc(e) => write!(f, "tree node allocation failed: {e}"),
            TreeError::ReservedKey => write!(f, "key u64::MAX is reserved"),
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
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TreeStats {
    /// Node READs that were inconsistent and retried.
    pub read_retries: u64,
    /// Remote lock CASes that found the lock taken.
    pub lock_retries: u64,
    /// Locks received from a local holder without a remote CAS.
    pub handovers: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Right moves along sibling pointers.
    pub sibling_hops: u64,
    pub splits: u64,
    /// Lookups that read their leaf exactly once (no retry, no hop).
    pub clean_lookups: u64,
    pub lookups: u64,
}

impl std::ops::AddAssign for TreeStats {
    fn add_assign(&mut self, o: Self) {
        self.read_retries += o.read_retries;
        self.lock_retries += o.lock_retries;
        self.handovers += o.handovers;
        self.cache_hits += o.cache_hits;
        self.cache_misses += o.cache_misses;
        self.sibling_hops += o.sibling_hops;
        self.splits += o.splits;
        self.clean_lookups += o.clean_lookups;
        self.lookups += o.lookups;
    }
}

/// A tree as one compute node sees it: configuration, the local lock
/// table and the index cache, shared by the node's threads.
pub struct Tree {
    cfg: TreeConfig,
    locks: LocalLocks,
    cache: IndexCache,
    table_words: u64,
}

impl Tree {
    /// The compute node's handle. `dm_bytes` is the device memory each
    /// memory node offers; the lock table is cut down to fit it.
    pub fn new(cfg: TreeConfig, dm_bytes: u64) -> Result<Arc<Tree>, TreeError> {
        cfg.check().map_err(TreeError::Config)?;
        let table_words = cfg.lock_table_words.min(dm_bytes / 8);
        if cfg.lock_in_dm && table_words == 0 {
            return Err(TreeError::Config(
                "locks in device memory, but the memory nodes have none".into(),
            ));
        }
        Ok(Arc::new(Tree {
            locks: LocalLocks::new(table_words.max(64) as usize),
            cache: IndexCache::new(cfg.cache_bytes),
            table_words: table_words.max(1),
            cfg,
        }))
    }

    pub fn config(&self) -> &TreeConfig {
        &self.cfg
    }

    pub fn cache(&self) -> &IndexCache {
        &self.cache
    }

    fn lock_of(&self, node: GlobalAddr) -> LockRef {
        hocl::lock_of(&self.cfg, self.table_words, self.locks.entries(), node)
    }

    /// A client for one task. `id` must be non-zero and unique among live
    /// clients of the cluster (it marks the locks it holds).
    pub fn client(self: &Arc<Tree>, id: u64) -> Result<TreeClient, TreeError> {
        if id == 0 {
            return Err(TreeError::Config("client id must be non-zero".into()));
        }
        Ok(TreeClient {
            tree: self.clone(),
            alloc: RemoteAllocator::new(self.cfg.chunk.clone())?,
            id,
            stats: TreeStats::default(),
            root_hint: 0,
            loaded: None,
        })
    }
}

/// A held lock, to be released exactly once.
#[must_use = "a held lock must be released (write_and_release or abandon)"]
struct Held {
    lock: LockRef,
    ticket: Option<u32>,
}

/// One task's handle on a tree.
pub struct TreeClient {
    tree: Arc<Tree>,
    alloc: RemoteAllocator,
    id: u64,
    pub stats: TreeStats,
    root_hint: u64,
    /// Bulk-loaded records written so far, for a progress display.
    loaded: Option<Arc<AtomicU64>>,
}

fn decode_root(w: u64) -> (GlobalAddr, u8) {
    (
        GlobalAddr::from_raw(w & !LEVEL_MASK),
        (w & LEVEL_MASK) as u8,
    )
}

fn check_key(key: u64) -> Result<(), TreeError> {
    if key == KEY_INFINITY {
        Err(TreeError::ReservedKey)
    } else {
        Ok(())
    }
}

impl TreeClient {
    pub fn tree(&self) -> &Arc<Tree> {
        &self.tree
    }

    /// Creates an empty tree (one leaf) unless one exists. Idempotent.
    pub async fn create<N: Nic>(&mut self, ctx: &Ctx<N>) -> Result<(), TreeError> {
        if ctx.read(ROOT_WORD, 8).await?.u64_at(0) != 0 {
            return Ok(());
        }
        let leaf = self
            .alloc
            .alloc(ctx, NODE_BYTES as u64, NODE_BYTES as u64)
            .await?;
        let mut buf = ctx.alloc(NODE_BYTES)?;
        NodeMut(buf.as_mut_slice()).init(0, 0, KEY_INFINITY, GlobalAddr::NULL, 1);
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
            self.root_hint = w;
        }
        Ok(decode_root(self.root_hint))
    }

    /// Reads a node until it is consistent under the configured scheme.
    async fn read_node<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        addr: GlobalAddr,
    ) -> Result<Buf, TreeError> {
        if addr.is_null() || !addr.offset().is_multiple_of(NODE_BYTES as u64) {
            return Err(TreeError::Corrupt {
                addr,
                why: "pointer is null or not node-aligned",
            });
        }
        let mut buf = ctx.alloc(NODE_BYTES)?;
        for _ in 0..MAX_READ_RETRIES {
            let mut b = ctx.batch();
            let op = b.read(addr, buf);
            buf = b.submit().await?.take_buf(op);
            let n = Node(buf.as_slice());
            let consistent = match self.tree.cfg.versions {
                VersionScheme::Lines => n.lines_agree(),
                VersionScheme::FrontRear => n.front_rear_agree(),
            };
            if consistent {
                if !n.is_valid() {
                    return Err(TreeError::Corrupt {
                        addr,
                        why: "not a tree node",
                    });
                }
                if n.low() >= n.high() || n.count() > FANOUT {
                    return Err(TreeError::Corrupt {
                        addr,
                        why: "impossible fences or count",
                    });
                }
                return Ok(buf);
            }
            self.stats.read_retries += 1;
        }
        Err(TreeError::Corrupt {
            addr,
            why: "never reads consistently",
        })
    }

    /// The node at `level` covering `key`, from the cache or by descending
    /// from the root (caching internal nodes on the way).
    async fn find_level<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        key: u64,
        level: u8,
    ) -> Result<GlobalAddr, TreeError> {
        if let Some(r) = self.tree.cache.route(key, level + 1, u8::MAX) {
            if r.level == level + 1 {
                if level == 0 {
                    self.stats.cache_hits += 1;
                    self.tree.cache.count_hit(true);
                }
                return Ok(r.child);
            }
        }
        if level == 0 {
            self.stats.cache_misses += 1;
            self.tree.cache.count_hit(false);
        }
        let mut fresh = false;
        'restart: for _ in 0..MAX_RESTARTS {
            let (mut addr, mut at) = self.root(ctx, fresh).await?;
            fresh = true;
            if let Some(r) = self.tree.cache.route(key, level + 1, at) {
                addr = r.child;
                at = r.level - 1;
            }
            if at < level {
                // The tree is shorter than asked (a root split in progress).
                ctx.yield_now().await;
                continue 'restart;
            }
            loop {
                if at == level {
                    return Ok(addr);
                }
                let buf = self.read_node(ctx, addr).await?;
                let n = Node(buf.as_slice());
                if n.level() != at || key < n.low() {
                    self.tree.cache.invalidate_covering(at, key);
                    continue 'restart;
                }
                if key >= n.high() {
                    if n.sibling().is_null() {
                        return Err(TreeError::Corrupt {
                            addr,
                            why: "key beyond the last node",
                        });
                    }
                    self.stats.sibling_hops += 1;
                    addr = n.sibling();
                    continue;
                }
                self.tree.cache.insert(addr, &n);
                addr = n.child_for(key);
                at -= 1;
            }
        }
        Err(TreeError::Corrupt {
            addr: ROOT_WORD,
            why: "descent restarted without end",
        })
    }

    /// The value of `key`, if present.
    pub async fn get<N: Nic>(&mut self, ctx: &Ctx<N>, key: u64) -> Result<Option<u64>, TreeError> {
        crate::scratch_scoped(ctx, self.get_unscoped(ctx, key)).await
    }

    async fn get_unscoped<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        key: u64,
    ) -> Result<Option<u64>, TreeError> {
        check_key(key)?;
        self.stats.lookups += 1;
        let retries0 = self.stats.read_retries;
        let mut addr = self.find_level(ctx, key, 0).await?;
        let mut clean = true;
        for _ in 0..MAX_RESTARTS {
            let buf = self.read_node(ctx, addr).await?;
            let n = Node(buf.as_slice());
            if !n.is_leaf() || key < n.low() {
                self.tree.cache.invalidate_covering(1, key);
                self.root_hint = 0;
                clean = false;
                addr = self.find_level(ctx, key, 0).await?;
                continue;
            }
            if key >= n.high() {
                self.stats.sibling_hops += 1;
                self.tree.cache.invalidate_covering(1, key);
                clean = false;
                addr = n.sibling();
                continue;
            }
            if clean && self.stats.read_retries == retries0 {
                self.stats.clean_lookups += 1;
            }
            return Ok(n.find(key).map(|i| n.value(i)));
        }
        Err(TreeError::Corrupt {
            addr,
            why: "lookup restarted without end",
        })
    }

    async fn lock<N: Nic>(&mut self, ctx: &Ctx<N>, node: GlobalAddr) -> Result<Held, TreeError> {
        let lock = self.tree.lock_of(node);
        let cfg = &self.tree.cfg;
        let ticket = if cfg.local_lock_table {
            let locks = &self.tree.locks;
            let t = locks.ticket(lock.local);
            while !locks.is_turn(lock.local, t) {
                ctx.yield_now().await;
            }
            match locks.on_turn(lock.local, lock.word) {
                Local::HandedOver => {
                    self.stats.handovers += 1;
                    return Ok(Held {
                        lock,
                        ticket: Some(t),
                    });
                }
                Local::MustAcquire => {}
                Local::ReleaseFirst(other) => {
                    // The previous holder finished its writes before passing
                    // the entry on, so releasing its word now is safe.
                    if let Err(e) = ctx.write(other, &0u64.to_le_bytes()).await {
                        let held = Held {
                            lock,
                            ticket: Some(t),
                        };
                        self.abandon(ctx, held, false).await;
                        return Err(e.into());
                    }
                }
            }
            Some(t)
        } else {
            None
        };
        let held = Held { lock, ticket };
        loop {
            match ctx.cas(lock.word, 0, self.id).await {
                Ok(0) => break,
                Ok(_) => {
                    self.stats.lock_retries += 1;
                    ctx.yield_now().await;
                }
                Err(e) => {
                    self.abandon(ctx, held, false).await;
                    return Err(e.into());
                }
            }
        }
        if held.ticket.is_some() {
            self.tree.locks.set_remote_held(lock.local, lock.word);
        }
        Ok(held)
    }

    /// Gives a lock up after a failure: lets the local queue go on and, if
    /// we took the global lock, tries to release it (best effort: the node
    /// may be dead).
    async fn abandon<N: Nic>(&mut self, ctx: &Ctx<N>, held: Held, remote: bool) {
        if remote {
            let _ = ctx.write(held.lock.word, &0u64.to_le_bytes()).await;
        }
        if let Some(t) = held.ticket {
            let locks = &self.tree.locks;
            let _ = locks.plan_release(held.lock.local, t, 0, false);
            locks.pass(held.lock.local, t);
        }
    }

    /// Writes `writes` (in order, on their nodes' queue pairs) and releases
    /// the lock: in the same doorbell when combining, else in a second
    /// round trip; or hands it to a local waiter.
    async fn write_and_release<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        held: Held,
        writes: &[(GlobalAddr, &[u8])],
    ) -> Result<(), TreeError> {
        let cfg = self.tree.cfg.clone();
        let hand_over = match held.ticket {
            Some(t) => {
                self.tree
                    .locks
                    .plan_release(held.lock.local, t, cfg.max_handover, cfg.handover)
            }
            None => false,
        };
        let mut b = ctx.batch();
        for (addr, data) in writes {
            b.write_bytes(*addr, data);
        }
        let unlock_now = !hand_over && cfg.combine;
        if unlock_now {
            b.write_u64(held.lock.word, 0);
        }
        let r = if b.is_empty() {
            Ok(())
        } else {
            b.submit().await.map(drop)
        };
        let r = match r {
            Ok(()) if !hand_over && !unlock_now => {
                ctx.write(held.lock.word, &0u64.to_le_bytes()).await
            }
            other => other,
        };
        if let Some(t) = held.ticket {
            self.tree.locks.pass(held.lock.local, t);
        }
        r.map_err(Into::into)
    }

    /// Inserts or updates `key`.
    pub async fn put<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        key: u64,
        value: u64,
    ) -> Result<(), TreeError> {
        crate::scratch_scoped(ctx, self.put_unscoped(ctx, key, value)).await
    }

    async fn put_unscoped<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        key: u64,
        value: u64,
    ) -> Result<(), TreeError> {
        check_key(key)?;
        self.modify(ctx, key, Some(value)).await.map(drop)
    }

    /// Removes `key`; returns whether it was present.
    pub async fn delete<N: Nic>(&mut self, ctx: &Ctx<N>, key: u64) -> Result<bool, TreeError> {
        crate::scratch_scoped(ctx, self.delete_unscoped(ctx, key)).await
    }

    async fn delete_unscoped<N: Nic>(&mut self, ctx: &Ctx<N>, key: u64) -> Result<bool, TreeError> {
        check_key(key)?;
        self.modify(ctx, key, None).await
    }

    /// Put (`Some`) or delete (`None`) under the leaf's lock. Returns
    /// whether the key was present before.
    async fn modify<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        key: u64,
        value: Option<u64>,
    ) -> Result<bool, TreeError> {
        let mut addr = self.find_level(ctx, key, 0).await?;
        for _ in 0..MAX_RESTARTS {
            let held = self.lock(ctx, addr).await?;
            let mut buf = match self.read_node(ctx, addr).await {
                Ok(b) => b,
                Err(e) => {
                    self.abandon(ctx, held, true).await;
                    return Err(e);
                }
            };
            let (leaf, low, high, sibling) = {
                let n = Node(buf.as_slice());
                (n.is_leaf(), n.low(), n.high(), n.sibling())
            };
            if !leaf || key < low || key >= high {
                self.write_and_release(ctx, held, &[]).await?;
                if leaf && key >= high {
                    self.stats.sibling_hops += 1;
                    self.tree.cache.invalidate_covering(1, key);
                    addr = sibling;
                } else {
                    self.tree.cache.invalidate_covering(1, key);
                    self.root_hint = 0;
                    addr = self.find_level(ctx, key, 0).await?;
                }
                continue;
            }
            return self
                .change_leaf(ctx, held, addr, &mut buf, key, value)
                .await;
        }
        Err(TreeError::Corrupt {
            addr,
            why: "write restarted without end",
        })
    }

    /// Applies a put or delete to a locked leaf we just read, then writes
    /// back and unlocks (splitting if full).
    async fn change_leaf<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        held: Held,
        addr: GlobalAddr,
        buf: &mut Buf,
        key: u64,
        value: Option<u64>,
    ) -> Result<bool, TreeError> {
        let whole = self.tree.cfg.whole_node_writes;
        let entry_len = match self.tree.cfg.versions {
            VersionScheme::Lines => ENTRY_WRITE_BYTES,
            VersionScheme::FrontRear => ENTRY_BYTES,
        };
        let slot = Node(buf.as_slice()).find(key);
        let present = slot.is_some();
        if whole {
            // FG+: keep the leaf sorted and write it back whole.
            let mut entries: Vec<(u64, u64)> = Node(buf.as_slice()).entries().collect();
            entries.retain(|&(k, _)| k != key);
            if let Some(v) = value {
                entries.push((key, v));
            }
            entries.sort_unstable();
            if entries.len() > FANOUT {
                return self
                    .split_leaf(ctx, held, addr, buf, entries)
                    .await
                    .map(|_| present);
            }
            let mut m = NodeMut(buf.as_mut_slice());
            let v = m.view().version().wrapping_add(1);
            for i in 0..FANOUT {
                match entries.get(i) {
                    Some(&(k, val)) => m.set_entry(i, k, val),
                    None => m.clear_entry(i),
                }
            }
            m.set_version(v);
            self.write_and_release(ctx, held, &[(addr, buf.as_slice())])
                .await?;
            return Ok(present);
        }
        let target = match (slot, value) {
            (Some(i), Some(v)) => {
                NodeMut(buf.as_mut_slice()).set_entry(i, key, v);
                i
            }
            (Some(i), None) => {
                NodeMut(buf.as_mut_slice()).clear_entry(i);
                i
            }
            (None, None) => {
                self.write_and_release(ctx, held, &[]).await?;
                return Ok(false);
            }
            (None, Some(v)) => match Node(buf.as_slice()).free_slot() {
                Some(i) => {
                    NodeMut(buf.as_mut_slice()).set_entry(i, key, v);
                    i
                }
                None => {
                    let mut entries: Vec<(u64, u64)> = Node(buf.as_slice()).entries().collect();
                    entries.push((key, v));
                    entries.sort_unstable();
                    return self
                        .split_leaf(ctx, held, addr, buf, entries)
                        .await
                        .map(|_| false);
                }
            },
        };
        let off = layout::entry_off(target);
        let entry = &buf.as_slice()[off..off + entry_len];
        self.write_and_release(ctx, held, &[(addr.add(off as u64), entry)])
            .await?;
        Ok(present)
    }

    /// Splits a full leaf whose new sorted contents are `entries`.
    async fn split_leaf<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        held: Held,
        addr: GlobalAddr,
        buf: &mut Buf,
        entries: Vec<(u64, u64)>,
    ) -> Result<(), TreeError> {
        let mid = entries.len() / 2;
        let sep = entries[mid].0;
        let (low, high, sibling, version, lock_word) = {
            let n = Node(buf.as_slice());
            (
                n.low(),
                n.high(),
                n.sibling(),
                n.version(),
                u64::from_le_bytes(
                    buf.as_slice()[layout::OFF_LOCK..layout::OFF_LOCK + 8]
                        .try_into()
                        .expect("8"),
                ),
            )
        };
        let right_addr = match self
            .alloc
            .alloc(ctx, NODE_BYTES as u64, NODE_BYTES as u64)
            .await
        {
            Ok(a) => a,
            Err(e) => {
                self.abandon(ctx, held, true).await;
                return Err(e.into());
            }
        };
        let mut right = vec![0u8; NODE_BYTES];
        let mut r = NodeMut(&mut right);
        r.init(0, sep, high, sibling, version.wrapping_add(1));
        for (i, &(k, v)) in entries[mid..].iter().enumerate() {
            r.set_entry(i, k, v);
        }
        let mut left = vec![0u8; NODE_BYTES];
        let mut l = NodeMut(&mut left);
        l.init(0, low, sep, right_addr, version.wrapping_add(1));
        l.set_lock_word(lock_word);
        for (i, &(k, v)) in entries[..mid].iter().enumerate() {
            l.set_entry(i, k, v);
        }
        self.stats.splits += 1;
        self.write_split(ctx, held, addr, &left, right_addr, &right)
            .await?;
        self.insert_parent(ctx, 1, sep, right_addr, addr).await
    }

    /// Writes a split's two halves and unlocks: one doorbell when both are
    /// on one memory node (the sibling lands first: same queue pair), else
    /// the sibling first, then the rewritten node with the unlock.
    async fn write_split<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        held: Held,
        addr: GlobalAddr,
        left: &[u8],
        right_addr: GlobalAddr,
        right: &[u8],
    ) -> Result<(), TreeError> {
        if right_addr.node() == addr.node() {
            return self
                .write_and_release(ctx, held, &[(right_addr, right), (addr, left)])
                .await;
        }
        if let Err(e) = ctx.write(right_addr, right).await {
            self.abandon(ctx, held, true).await;
            return Err(e.into());
        }
        self.write_and_release(ctx, held, &[(addr, left)]).await
    }

    /// Inserts separator `sep` → `child` into the node at `level` covering
    /// `sep`, splitting upward as needed; `left` is the node that split.
    async fn insert_parent<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        level: u8,
        sep: u64,
        child: GlobalAddr,
        left: GlobalAddr,
    ) -> Result<(), TreeError> {
        for _ in 0..MAX_RESTARTS {
            let (root, root_level) = self.root(ctx, true).await?;
            if root_level < level {
                if root == left {
                    // We split the root: grow the tree.
                    let new_root = self
                        .alloc
                        .alloc(ctx, NODE_BYTES as u64, NODE_BYTES as u64)
                        .await?;
                    let mut buf = vec![0u8; NODE_BYTES];
                    let mut n = NodeMut(&mut buf);
                    n.init(level, 0, KEY_INFINITY, GlobalAddr::NULL, 1);
                    n.set_leftmost(left);
                    n.set_entry(0, sep, child.raw());
                    n.set_count(1);
                    ctx.write(new_root, &buf).await?;
                    let old = root.raw() | (root_level as u64);
                    if ctx
                        .cas(ROOT_WORD, old, new_root.raw() | level as u64)
                        .await?
                        == old
                    {
                        self.root_hint = new_root.raw() | level as u64;
                        return Ok(());
                    }
                    continue;
                }
                // Someone else's root split is still being installed.
                ctx.yield_now().await;
                continue;
            }
            let mut addr = self.find_level(ctx, sep, level).await?;
            loop {
                let held = self.lock(ctx, addr).await?;
                let mut buf = match self.read_node(ctx, addr).await {
                    Ok(b) => b,
                    Err(e) => {
                        self.abandon(ctx, held, true).await;
                        return Err(e);
                    }
                };
                let n = Node(buf.as_slice());
                if n.level() != level || sep < n.low() {
                    self.write_and_release(ctx, held, &[]).await?;
                    self.tree.cache.invalidate_covering(level, sep);
                    break;
                }
                if sep >= n.high() {
                    let s = n.sibling();
                    self.write_and_release(ctx, held, &[]).await?;
                    self.stats.sibling_hops += 1;
                    addr = s;
                    continue;
                }
                let mut kids = n.children();
                if kids.iter().any(|&(k, c)| k == sep && c == child) {
                    self.write_and_release(ctx, held, &[]).await?;
                    return Ok(());
                }
                let pos = kids.partition_point(|&(k, _)| k <= sep);
                kids.insert(pos, (sep, child));
                let (low, high, sibling, version) = (n.low(), n.high(), n.sibling(), n.version());
                self.tree.cache.invalidate(level, low);
                if kids.len() - 1 <= FANOUT {
                    let mut m = NodeMut(buf.as_mut_slice());
                    fill_internal(&mut m, &kids);
                    m.set_version(version.wrapping_add(1));
                    let data = buf.as_slice().to_vec();
                    self.write_and_release(ctx, held, &[(addr, &data)]).await?;
                    return Ok(());
                }
                // Split the internal node: the middle separator moves up.
                let mid = kids.len() / 2;
                let up = kids[mid].0;
                let right_addr = match self
                    .alloc
                    .alloc(ctx, NODE_BYTES as u64, NODE_BYTES as u64)
                    .await
                {
                    Ok(a) => a,
                    Err(e) => {
                        self.abandon(ctx, held, true).await;
                        return Err(e.into());
                    }
                };
                let lock_word = u64::from_le_bytes(
                    buf.as_slice()[layout::OFF_LOCK..layout::OFF_LOCK + 8]
                        .try_into()
                        .expect("8"),
                );
                let mut right = vec![0u8; NODE_BYTES];
                let mut r = NodeMut(&mut right);
                r.init(level, up, high, sibling, version.wrapping_add(1));
                fill_internal(&mut r, &kids[mid..]);
                let mut lbuf = vec![0u8; NODE_BYTES];
                let mut l = NodeMut(&mut lbuf);
                l.init(level, low, up, right_addr, version.wrapping_add(1));
                l.set_lock_word(lock_word);
                fill_internal(&mut l, &kids[..mid]);
                self.stats.splits += 1;
                self.write_split(ctx, held, addr, &lbuf, right_addr, &right)
                    .await?;
                return Box::pin(self.insert_parent(ctx, level + 1, up, right_addr, addr)).await;
            }
        }
        Err(TreeError::Corrupt {
            addr: left,
            why: "parent insert restarted without end",
        })
    }

    /// Up to `limit` entries with keys in `[low, high)`, in key order.
    pub async fn scan<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        low: u64,
        high: u64,
        limit: usize,
    ) -> Result<Vec<(u64, u64)>, TreeError> {
        crate::scratch_scoped(ctx, self.scan_unscoped(ctx, low, high, limit)).await
    }

    async fn scan_unscoped<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        low: u64,
        high: u64,
        limit: usize,
    ) -> Result<Vec<(u64, u64)>, TreeError> {
        let mut out = Vec::new();
        if low >= high || limit == 0 {
            return Ok(out);
        }
        let mut addr = self.find_level(ctx, low, 0).await?;
        let mut from = low;
        for _ in 0..MAX_RESTARTS {
            let buf = self.read_node(ctx, addr).await?;
            let n = Node(buf.as_slice());
            if !n.is_leaf() || from < n.low() {
                self.tree.cache.invalidate_covering(1, from);
                self.root_hint = 0;
                addr = self.find_level(ctx, from, 0).await?;
                continue;
            }
            if from >= n.high() {
                self.stats.sibling_hops += 1;
                addr = n.sibling();
                continue;
            }
            let mut part: Vec<(u64, u64)> = n
                .entries()
                .filter(|&(k, _)| k >= from && k < high)
                .collect();
            part.sort_unstable();
            out.extend(part);
            if out.len() >= limit {
                out.truncate(limit);
                return Ok(out);
            }
            if n.high() >= high || n.sibling().is_null() {
                return Ok(out);
            }
            from = n.high();
            addr = n.sibling();
        }
        Err(TreeError::Corrupt {
            addr,
            why: "scan restarted without end",
        })
    }

    /// Loads an empty tree from strictly increasing `(key, value)` pairs
    /// with one client: [`bulk_load_part`](Self::bulk_load_part) over
    /// everything, then [`bulk_load_finish`](Self::bulk_load_finish).
    /// Returns the number of records loaded.
    pub async fn bulk_load<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        items: impl IntoIterator<Item = (u64, u64)>,
        fill: usize,
    ) -> Result<u64, TreeError> {
        self.check_empty(ctx).await?;
        let items: Vec<(u64, u64)> = items.into_iter().collect();
        let n = items.len() as u64;
        let leaves = self
            .bulk_load_part(ctx, items, 0, KEY_INFINITY, fill)
            .await?;
        self.bulk_load_finish(ctx, vec![leaves], fill).await?;
        Ok(n)
    }

    /// Counts the records this client's bulk loads write into `counter`
    /// as their leaves land, for a progress display.
    pub fn report_loaded(&mut self, counter: Arc<AtomicU64>) {
        self.loaded = Some(counter);
    }

    fn count_loaded(&self, n: u64) {
        if let Some(c) = &self.loaded {
            // Relaxed: a progress figure, read by a display only.
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    async fn check_empty<N: Nic>(&mut self, ctx: &Ctx<N>) -> Result<GlobalAddr, TreeError> {
        let (root, level) = self.root(ctx, true).await?;
        if level != 0 {
            return Err(TreeError::NotEmpty);
        }
        let rbuf = self.read_node(ctx, root).await?;
        if Node(rbuf.as_slice()).entries().next().is_some() {
            return Err(TreeError::NotEmpty);
        }
        Ok(root)
    }

    /// One part of a bulk load, run by any client in parallel with others:
    /// writes leaves (filled to `fill` ≤ 45 entries, up to 8 per doorbell)
    /// for the strictly increasing `items`, all inside `[low, high)`; the
    /// parts of one load must tile the key space in order (the first from
    /// 0, the last to `u64::MAX`). Returns the part's leaves as (low fence,
    /// address) for [`bulk_load_finish`](Self::bulk_load_finish). Nothing
    /// is visible until the finish swings the root.
    pub async fn bulk_load_part<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        items: Vec<(u64, u64)>,
        low: u64,
        high: u64,
        fill: usize,
    ) -> Result<Vec<(u64, GlobalAddr)>, TreeError> {
        let fill = fill.clamp(1, FANOUT);
        let mut prev: Option<u64> = None;
        for &(k, _) in &items {
            check_key(k)?;
            if prev.is_some_and(|p| k <= p) {
                return Err(TreeError::Unsorted {
                    prev: prev.unwrap_or(0),
                    key: k,
                });
            }
            if k < low || k >= high {
                return Err(TreeError::Unsorted { prev: low, key: k });
            }
            prev = Some(k);
        }
        let groups: Vec<&[(u64, u64)]> = if items.is_empty() {
            vec![&items[..]]
        } else {
            items.chunks(fill).collect()
        };
        let mut addrs = Vec::with_capacity(groups.len());
        for _ in 0..groups.len() {
            addrs.push(
                self.alloc
                    .alloc(ctx, NODE_BYTES as u64, NODE_BYTES as u64)
                    .await?,
            );
        }
        let mut out = Vec::with_capacity(groups.len());
        let mut pending: Vec<(GlobalAddr, Vec<u8>)> = Vec::new();
        let mut pending_items = 0u64;
        for (i, g) in groups.iter().enumerate() {
            let lo = if i == 0 { low } else { g[0].0 };
            let hi = groups.get(i + 1).map_or(high, |nx| nx[0].0);
            let sib = addrs.get(i + 1).copied().unwrap_or(GlobalAddr::NULL);
            let mut buf = vec![0u8; NODE_BYTES];
            let mut m = NodeMut(&mut buf);
            m.init(0, lo, hi, sib, 1);
            for (j, &(k, v)) in g.iter().enumerate() {
                m.set_entry(j, k, v);
            }
            out.push((lo, addrs[i]));
            pending.push((addrs[i], buf));
            pending_items += g.len() as u64;
            if pending.len() == 8 {
                write_nodes(ctx, &mut pending).await?;
                self.count_loaded(std::mem::take(&mut pending_items));
            }
        }
        write_nodes(ctx, &mut pending).await?;
        self.count_loaded(pending_items);
        Ok(out)
    }

    /// Finishes a bulk load: links each part's last leaf to the next part's
    /// first, builds the internal levels, writes the top node at the old
    /// (empty) root's address — so a client still holding that address
    /// finds a node of another level there and rereads the root word — and
    /// swings the root word. Fails with `NotEmpty` if the tree has data.
    pub async fn bulk_load_finish<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        parts: Vec<Vec<(u64, GlobalAddr)>>,
        fill: usize,
    ) -> Result<(), TreeError> {
        let fill = fill.clamp(1, FANOUT);
        let root = self.check_empty(ctx).await?;
        let parts: Vec<Vec<(u64, GlobalAddr)>> =
            parts.into_iter().filter(|p| !p.is_empty()).collect();
        if parts.is_empty() {
            return Ok(());
        }
        let mut b = ctx.batch();
        for w in parts.windows(2) {
            let last = w[0].last().expect("non-empty").1;
            b.write_u64(last.add(layout::OFF_SIBLING as u64), w[1][0].1.raw());
        }
        b.submit().await?;
        let mut level_nodes: Vec<(u64, GlobalAddr)> = parts.into_iter().flatten().collect();
        if level_nodes.len() == 1 {
            // A single leaf: copy it to the root's address.
            let buf = self.read_node(ctx, level_nodes[0].1).await?;
            ctx.write(root, buf.as_slice()).await?;
            return Ok(());
        }
        let mut level = 0u8;
        let mut pending: Vec<(GlobalAddr, Vec<u8>)> = Vec::new();
        while level_nodes.len() > 1 {
            level += 1;
            let per = FANOUT.min(fill + 1).max(2);
            let chunks: Vec<Vec<(u64, GlobalAddr)>> =
                level_nodes.chunks(per).map(|c| c.to_vec()).collect();
            let addrs = self.node_addrs(ctx, chunks.len(), root).await?;
            let mut next = Vec::with_capacity(chunks.len());
            for (i, c) in chunks.iter().enumerate() {
                let low = if i == 0 { 0 } else { c[0].0 };
                let high = chunks.get(i + 1).map_or(KEY_INFINITY, |nx| nx[0].0);
                let sib = addrs.get(i + 1).copied().unwrap_or(GlobalAddr::NULL);
                let mut buf = vec![0u8; NODE_BYTES];
                let mut m = NodeMut(&mut buf);
                m.init(level, low, high, sib, 1);
                let mut kids = c.clone();
                kids[0].0 = low;
                fill_internal(&mut m, &kids);
                next.push((low, addrs[i]));
                pending.push((addrs[i], buf));
                if pending.len() == 8 {
                    write_nodes(ctx, &mut pending).await?;
                }
            }
            write_nodes(ctx, &mut pending).await?;
            level_nodes = next;
        }
        debug_assert_eq!(level_nodes[0].1, root);
        let new_root = root.raw() | level as u64;
        let old = root.raw();
        if ctx.cas(ROOT_WORD, old, new_root).await? != old {
            return Err(TreeError::NotEmpty);
        }
        self.root_hint = new_root;
        Ok(())
    }
}

impl TreeClient {
    /// Addresses for `n` new nodes of one bulk-load level: the old root's
    /// when the level has a single node (the new top), fresh ones otherwise.
    async fn node_addrs<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        n: usize,
        root: GlobalAddr,
    ) -> Result<Vec<GlobalAddr>, TreeError> {
        if n == 1 {
            return Ok(vec![root]);
        }
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(
                self.alloc
                    .alloc(ctx, NODE_BYTES as u64, NODE_BYTES as u64)
                    .await?,
            );
        }
        Ok(v)
    }
}

/// Writes internal node contents: `kids[0]` is the leftmost child (its key
/// is the node's low fence), the rest are (separator, child) in order.
fn fill_internal(m: &mut NodeMut<'_>, kids: &[(u64, GlobalAddr)]) {
    m.set_leftmost(kids[0].1);
    for i in 0..FANOUT {
        match kids.get(i + 1) {
            Some(&(k, c)) => m.set_entry(i, k, c.raw()),
            None => m.clear_entry(i),
        }
    }
    m.set_count(kids.len() - 1);
}

async fn write_nodes<N: Nic>(
    ctx: &Ctx<N>,
    pending: &mut Vec<(GlobalAddr, Vec<u8>)>,
) -> Result<(), TreeError> {
    if pending.is_empty() {
        return Ok(());
    }
    let mut b = ctx.batch();
    for (a, buf) in pending.iter() {
        b.write_bytes(*a, buf);
    }
    b.submit().await?;
    pending.clear();
    Ok(())
}
