//! The remote chunk allocator: memory on memory nodes, allocated without
//! their CPUs (Sherman §4.1).
//!
//! Owns the chunk cursor protocol and the bump allocation inside chunks.
//! Each memory node's host memory past the superblock is cut into chunks of
//! [`ChunkConfig::chunk_bytes`]; chunk `i` covers host offsets
//! `[first_chunk_off() + i * chunk_bytes, + chunk_bytes)`. The node's chunk
//! cursor word ([`CHUNK_CURSOR_OFF`]) counts the chunks handed out. A
//! compute task takes a chunk with ONE one-sided FAA of 1 on that word: the
//! old value is its chunk index, and an index at or past the node's
//! capacity means the node is full. Nothing on the memory node runs.
//!
//! Promises:
//! - no two allocations overlap, across tasks, cores and processes: a chunk
//!   index is returned by exactly one FAA (NIC atomics are atomic with
//!   respect to each other: the NIC contract), and inside a chunk one
//!   [`RemoteAllocator`] bumps a private cursor;
//! - an allocation is aligned to `max(align, 8)`, has a length rounded up to
//!   8 bytes, lies inside one chunk, and never touches the superblock, so
//!   [`GlobalAddr::NULL`] is never returned;
//! - chunks are taken round-robin over the nodes the core is connected to,
//!   skipping nodes that are full or dead; [`AllocError::OutOfMemory`] only
//!   when every node is full;
//! - exactly one FAA per chunk taken, plus at most one FAA per node that
//!   reveals it is full (the allocator remembers full nodes).
//!
//! Costs the caller accepts: memory is never freed back to a node (upper
//! layers recycle their own objects); when an allocation does not fit the
//! rest of the current chunk it goes to a fresh chunk, and of the two the
//! one with less room left is abandoned (so a chunk-sized request does not
//! throw away a nearly empty chunk); and a FAA past a full
//! node's capacity wastes no memory but still advances the cursor, so a full
//! node's cursor ends above its capacity by at most the number of
//! allocators that noticed it was full (a 64-bit word does not wrap).

use crate::layout::{first_chunk_off, CHUNK_ALIGN, CHUNK_CURSOR_OFF, SUPERBLOCK_BYTES};
use nicdrv::{Ctx, GlobalAddr, Nic, NodeId, Space, VerbError};
use std::cell::{Cell, OnceCell};
use std::fmt;

/// Sherman's chunk size.
pub const DEFAULT_CHUNK_BYTES: u64 = 32 << 20;

/// Every allocation is aligned to at least this, and its length rounded up
/// to a multiple of it, so 8-byte words in allocations are never torn and
/// two allocations never share a word.
pub const MIN_ALIGN: u64 = 8;

/// How memory nodes are cut into chunks. Every compute thread must use the
/// same values for a node (they are cluster configuration).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkConfig {
    /// Bytes per chunk: a power of two, at least 4 KiB.
    pub chunk_bytes: u64,
    /// Host memory of each memory node, unless `per_node` says otherwise.
    pub node_bytes: u64,
    /// Nodes whose host memory differs from `node_bytes`: (node, bytes).
    pub per_node: Vec<(NodeId, u64)>,
}

impl ChunkConfig {
    /// Sherman's 32 MiB chunks on nodes of `node_bytes` host memory each.
    pub fn new(node_bytes: u64) -> ChunkConfig {
        ChunkConfig {
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            node_bytes,
            per_node: Vec::new(),
        }
    }

    /// Checks the sizes; every error is one sentence saying what to change.
    pub fn validate(&self) -> Result<(), AllocError> {
        let c = self.chunk_bytes;
        if !c.is_power_of_two() || !(CHUNK_ALIGN..=GlobalAddr::MAX_OFFSET).contains(&c) {
            return Err(AllocError::BadConfig(format!(
                "chunk_bytes must be a power of two between {CHUNK_ALIGN} and 2^46, got {c}"
            )));
        }
        let sizes = std::iter::once((None, self.node_bytes))
            .chain(self.per_node.iter().map(|&(n, b)| (Some(n), b)));
        for (node, bytes) in sizes {
            if !(SUPERBLOCK_BYTES..=GlobalAddr::MAX_OFFSET + 1).contains(&bytes) {
                let who = node.map_or("node_bytes".to_string(), |n| format!("node {n}"));
                return Err(AllocError::BadConfig(format!(
                    "{who}: host memory must be between the {SUPERBLOCK_BYTES}-byte superblock \
                     and 2^47 bytes, got {bytes}"
                )));
            }
        }
        for (i, &(n, _)) in self.per_node.iter().enumerate() {
            if self.per_node[..i].iter().any(|&(m, _)| m == n) {
                return Err(AllocError::BadConfig(format!(
                    "node {n} is listed twice in per_node"
                )));
            }
        }
        Ok(())
    }

    /// Host memory of `node`.
    pub fn node_bytes_of(&self, node: NodeId) -> u64 {
        self.per_node
            .iter()
            .find(|&&(n, _)| n == node)
            .map_or(self.node_bytes, |&(_, b)| b)
    }

    /// Chunks `node` holds: whole chunks between the superblock and the end
    /// of its host memory.
    pub fn chunks_on(&self, node: NodeId) -> u64 {
        self.node_bytes_of(node).saturating_sub(first_chunk_off()) / self.chunk_bytes.max(1)
    }

    /// Host offset where chunk `index` starts; `None` past the node's
    /// capacity.
    pub fn chunk_off(&self, node: NodeId, index: u64) -> Option<u64> {
        if index >= self.chunks_on(node) {
            return None;
        }
        // No overflow: index < chunks_on, so the product is below node_bytes.
        Some(first_chunk_off() + index * self.chunk_bytes)
    }
}

/// Why an allocation failed. Expected outcomes, never panics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllocError {
    /// Every memory node this core reaches is full.
    OutOfMemory { requested: u64 },
    /// The request is larger than a chunk, so it can never fit.
    TooLarge { requested: u64, chunk_bytes: u64 },
    /// The alignment is zero, not a power of two, or above 4 KiB.
    BadAlign { align: u64 },
    /// A request for zero bytes.
    ZeroBytes,
    /// The core has no queue pair to any memory node.
    NoNodes,
    /// No node gave a chunk, and at least one failed with this verb error
    /// (the first one seen) rather than being full.
    Verb(VerbError),
    /// The chunk configuration is invalid, or disagrees with the memory a
    /// node registered.
    BadConfig(String),
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::OutOfMemory { requested } => write!(
                f,
                "cannot allocate {requested} bytes: every memory node is out of chunks"
            ),
            AllocError::TooLarge {
                requested,
                chunk_bytes,
            } => write!(
                f,
                "cannot allocate {requested} bytes: an allocation must fit in one \
                 {chunk_bytes}-byte chunk"
            ),
            AllocError::BadAlign { align } => write!(
                f,
                "alignment {align} is invalid: it must be a power of two no larger than \
                 {CHUNK_ALIGN}"
            ),
            AllocError::ZeroBytes => write!(f, "cannot allocate 0 bytes"),
            AllocError::NoNodes => write!(f, "this core is connected to no memory node"),
            AllocError::Verb(e) => write!(f, "no memory node could give a chunk: {e}"),
            AllocError::BadConfig(s) => write!(f, "invalid chunk configuration: {s}"),
        }
    }
}

impl std::error::Error for AllocError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AllocError::Verb(e) => Some(e),
            _ => None,
        }
    }
}

/// What this allocator knows about one memory node.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum NodeState {
    /// May still have chunks.
    Open,
    /// A FAA returned an index past capacity: never asked again.
    Full,
    /// A verb to it failed because the node is dead (`NodeDead`): never
    /// asked again (a reconfiguration builds new allocators). A verb that
    /// failed otherwise, `RetryExceeded` on a cut link among them (a link
    /// heals, and the executor repairs its queue pair), fails only that
    /// refill's try of the node: the next refill asks it again.
    Dead(VerbError),
}

struct NodeSlot {
    node: NodeId,
    chunks: u64,
    state: Cell<NodeState>,
    /// The chunk of this node being carved for requests that name it
    /// ([`RemoteAllocator::alloc_on`]).
    near: Cell<Option<Cursor>>,
}

/// The unused part of the chunk being bump-allocated.
#[derive(Copy, Clone, Debug)]
struct Cursor {
    node: NodeId,
    next: u64,
    end: u64,
}

impl Cursor {
    fn room(&self) -> u64 {
        self.end - self.next
    }

    /// Takes `len` bytes aligned to `align` (a power of two), or `None` if
    /// they do not fit the rest of the chunk.
    fn carve(&mut self, len: u64, align: u64) -> Option<u64> {
        let start = self.next.checked_next_multiple_of(align)?;
        let end = start.checked_add(len)?;
        if end > self.end {
            return None;
        }
        self.next = end;
        Some(start)
    }
}

/// Allocates memory-node memory for the tasks of one core.
///
/// Plain single-thread state (`Cell`s, not `Sync`): make one per task, or
/// share one between the tasks of one executor through an `Rc` — `alloc`
/// takes `&self` and holds no borrow across its await, so tasks that
/// refill at the same time each get a chunk, and the one with less room
/// left is dropped. Not for sharing across threads.
///
/// An `alloc` future dropped while its FAA is in flight loses that chunk:
/// wasted, never handed out twice.
pub struct RemoteAllocator {
    cfg: ChunkConfig,
    /// The nodes of the core, learnt from the first `alloc`'s context (the
    /// allocator's only local allocation, made once).
    nodes: OnceCell<Box<[NodeSlot]>>,
    /// Where the next refill starts looking (round-robin).
    next_node: Cell<usize>,
    cur: Cell<Option<Cursor>>,
    chunks_taken: Cell<u64>,
}

impl RemoteAllocator {
    /// An allocator over `cfg`, which is validated here. Holds no chunk
    /// until the first `alloc`.
    pub fn new(cfg: ChunkConfig) -> Result<RemoteAllocator, AllocError> {
        cfg.validate()?;
        Ok(RemoteAllocator {
            cfg,
            nodes: OnceCell::new(),
            next_node: Cell::new(0),
            cur: Cell::new(None),
            chunks_taken: Cell::new(0),
        })
    }

    pub fn config(&self) -> &ChunkConfig {
        &self.cfg
    }

    /// Chunks this allocator has taken (each cost one FAA).
    pub fn chunks_taken(&self) -> u64 {
        self.chunks_taken.get()
    }

    /// Allocates `bytes` of host memory on some memory node, aligned to
    /// `max(align, 8)`. Usually no verb at all; one FAA round trip when the
    /// current chunk is used up (more only when nodes turn out full or
    /// dead).
    ///
    /// The memory's initial contents are whatever the node holds (zero on a
    /// fresh node); memory is never handed out twice.
    pub async fn alloc<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        bytes: u64,
        align: u64,
    ) -> Result<GlobalAddr, AllocError> {
        let (len, align) = self.check_request(bytes, align)?;
        if let Some(mut c) = self.cur.get() {
            if let Some(off) = c.carve(len, align) {
                self.cur.set(Some(c));
                return host_addr(c.node, off);
            }
        }
        let mut fresh = self.take_chunk(ctx, bytes).await?;
        // A fresh chunk starts CHUNK_ALIGN-aligned and len <= chunk_bytes
        // (check_request), so the request fits at its very start.
        debug_assert_eq!(fresh.next % align, 0);
        debug_assert!(len <= fresh.room());
        let off = fresh.next;
        fresh.next += len;
        // Another task sharing this allocator may have refilled while we
        // waited: keep whichever chunk has more room left.
        match self.cur.get() {
            Some(c) if c.room() >= fresh.room() => {}
            _ => self.cur.set(Some(fresh)),
        }
        host_addr(fresh.node, off)
    }

    /// [`alloc`](Self::alloc) on memory node `node` when it can: from a
    /// chunk of that node (taken with one FAA on its cursor when the last
    /// one is used up). When the node has no chunk left, is not one of
    /// the core's, or a verb to it fails, the memory comes from any node,
    /// as `alloc` gives it: callers that want locality check the address.
    pub async fn alloc_on<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        node: NodeId,
        bytes: u64,
        align: u64,
    ) -> Result<GlobalAddr, AllocError> {
        let (len, align) = self.check_request(bytes, align)?;
        if let Some(s) = self.slots(ctx)?.iter().find(|s| s.node == node) {
            if let Some(mut c) = s.near.get() {
                if let Some(off) = c.carve(len, align) {
                    s.near.set(Some(c));
                    return host_addr(node, off);
                }
            }
            if let Ok(Some(mut fresh)) = self.take_from(ctx, s).await {
                // A fresh chunk is CHUNK_ALIGN-aligned and len <=
                // chunk_bytes (check_request): the request fits at its start.
                let off = fresh
                    .carve(len, align)
                    .expect("a fresh chunk holds any request");
                // Another task sharing this allocator may have refilled
                // while we waited: keep whichever chunk has more room left.
                if s.near.get().is_none_or(|c| c.room() < fresh.room()) {
                    s.near.set(Some(fresh));
                }
                return host_addr(node, off);
            }
        }
        self.alloc(ctx, bytes, align).await
    }

    /// Takes the unused rest of every chunk this allocator is carving (the
    /// one `alloc` carves and each node's `alloc_on` one), as (start,
    /// bytes) with each start rounded up to `align` (a power of two, at
    /// most `CHUNK_ALIGN`): memory never handed out, for an owner leaving
    /// to pass on (a hash table's entry blocks: `index::cuckoo::lend`).
    /// They are carved no more: the next allocation takes a fresh chunk.
    /// No verb. Not while an `alloc` of the same allocator is in flight
    /// (a task sharing it through an `Rc`): that refill would keep its
    /// chunk's rest beside the one handed over.
    pub fn take_rests(&self, align: u64) -> Vec<(GlobalAddr, u64)> {
        debug_assert!(align.is_power_of_two() && align <= CHUNK_ALIGN);
        let slots = self.nodes.get().map(|n| n.iter()).into_iter().flatten();
        let near = slots.map(|s| s.near.take());
        std::iter::once(self.cur.take())
            .chain(near)
            .flatten()
            .filter_map(|c| {
                let start = c.next.checked_next_multiple_of(align)?;
                let addr = host_addr(c.node, start).ok()?;
                (start < c.end).then_some((addr, c.end - start))
            })
            .collect()
    }

    /// Validates a request; returns (length rounded to 8, effective align).
    fn check_request(&self, bytes: u64, align: u64) -> Result<(u64, u64), AllocError> {
        if bytes == 0 {
            return Err(AllocError::ZeroBytes);
        }
        if !align.is_power_of_two() || align > CHUNK_ALIGN {
            return Err(AllocError::BadAlign { align });
        }
        if bytes > self.cfg.chunk_bytes {
            return Err(AllocError::TooLarge {
                requested: bytes,
                chunk_bytes: self.cfg.chunk_bytes,
            });
        }
        // chunk_bytes is a power of two >= 4 KiB, so rounding to 8 keeps
        // the length <= chunk_bytes (no overflow either).
        Ok((bytes.next_multiple_of(MIN_ALIGN), align.max(MIN_ALIGN)))
    }

    /// The per-node table, built on first use from the context's nodes.
    fn slots<N: Nic>(&self, ctx: &Ctx<N>) -> Result<&[NodeSlot], AllocError> {
        if let Some(s) = self.nodes.get() {
            return Ok(s);
        }
        let mut built = Vec::new();
        for node in ctx.nodes() {
            let chunks = self.cfg.chunks_on(node);
            // The cursor word and every chunk must lie in memory the node
            // registered; otherwise the config is wrong, and every verb to
            // the missing part would fail with a remote access error.
            let need = first_chunk_off() + chunks * self.cfg.chunk_bytes;
            let regions = ctx.remote_regions(node);
            let host_regions = || regions.iter().filter(|r| r.space == Space::Host);
            if host_regions().next().is_some()
                && !host_regions().any(|r| r.contains(Space::Host, 0, need))
            {
                let have = host_regions()
                    .filter(|r| r.offset == 0)
                    .map(|r| r.len)
                    .max()
                    .unwrap_or(0);
                return Err(AllocError::BadConfig(format!(
                    "memory node {node} registered {have} bytes of host memory from offset 0, \
                     but its {} chunks need {need}; set node_bytes to the node's real size",
                    chunks
                )));
            }
            built.push(NodeSlot {
                node,
                chunks,
                state: Cell::new(if chunks == 0 {
                    NodeState::Full
                } else {
                    NodeState::Open
                }),
                near: Cell::new(None),
            });
        }
        Ok(self.nodes.get_or_init(|| built.into_boxed_slice()))
    }

    /// Takes a fresh chunk with one FAA on a node's cursor, trying the nodes
    /// round-robin from where the last refill left off.
    async fn take_chunk<N: Nic>(&self, ctx: &Ctx<N>, requested: u64) -> Result<Cursor, AllocError> {
        let slots = self.slots(ctx)?;
        let n = slots.len();
        if n == 0 {
            return Err(AllocError::NoNodes);
        }
        // Advance before awaiting, so tasks sharing this allocator that
        // refill at the same time start at different nodes.
        let start = self.next_node.get() % n;
        self.next_node.set((start + 1) % n);
        let mut first_err = None;
        for k in 0..n {
            let i = (start + k) % n;
            match self.take_from(ctx, &slots[i]).await {
                Ok(Some(c)) => {
                    self.next_node.set((i + 1) % n);
                    return Ok(c);
                }
                Ok(None) => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            None => Err(AllocError::OutOfMemory { requested }),
            Some(e) => Err(AllocError::Verb(e)),
        }
    }

    /// A fresh chunk of node `s`, with one FAA on its cursor; `None` when
    /// the node is full (now or known before), the error when it is dead
    /// (now or known before) or the FAA failed.
    async fn take_from<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        s: &NodeSlot,
    ) -> Result<Option<Cursor>, VerbError> {
        match s.state.get() {
            NodeState::Open => {}
            NodeState::Full => return Ok(None),
            NodeState::Dead(e) => return Err(e),
        }
        let cursor = GlobalAddr::host(s.node, CHUNK_CURSOR_OFF);
        match ctx.faa(cursor, 1).await {
            Ok(index) if index < s.chunks => {
                // No overflow: index < chunks, so the chunk ends inside
                // the node (validated below 2^47 bytes).
                let off = first_chunk_off() + index * self.cfg.chunk_bytes;
                self.chunks_taken.set(self.chunks_taken.get() + 1);
                Ok(Some(Cursor {
                    node: s.node,
                    next: off,
                    end: off + self.cfg.chunk_bytes,
                }))
            }
            // Past capacity: the node is full. This FAA wasted no memory;
            // remembering it keeps us from wasting more.
            Ok(_) => {
                s.state.set(NodeState::Full);
                Ok(None)
            }
            Err(e) => {
                if matches!(e, VerbError::NodeDead { .. }) {
                    s.state.set(NodeState::Dead(e));
                }
                Err(e)
            }
        }
    }
}

fn host_addr(node: NodeId, off: u64) -> Result<GlobalAddr, AllocError> {
    // Validated configs keep offsets below 2^47; this cannot fail.
    GlobalAddr::try_new(node, Space::Host, off).ok_or_else(|| {
        AllocError::BadConfig(format!("offset {off:#x} does not fit a global address"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(chunk_bytes: u64, node_bytes: u64) -> ChunkConfig {
        ChunkConfig {
            chunk_bytes,
            node_bytes,
            per_node: vec![],
        }
    }

    #[test]
    fn config_validation() {
        assert!(cfg(4096, 1 << 20).validate().is_ok());
        for bad in [0, 2048, 4097, 3 << 20, 1 << 47] {
            assert!(
                matches!(cfg(bad, 1 << 30).validate(), Err(AllocError::BadConfig(_))),
                "chunk_bytes {bad} accepted"
            );
        }
        assert!(cfg(4096, 100).validate().is_err());
        assert!(cfg(4096, (1 << 47) + 8).validate().is_err());
        let mut c = cfg(4096, 1 << 20);
        c.per_node = vec![(1, 1 << 20), (1, 2 << 20)];
        assert!(c.validate().is_err());
        c.per_node = vec![(1, 16)];
        assert!(c.validate().is_err());
        assert!(RemoteAllocator::new(cfg(1000, 1 << 20)).is_err());
    }

    #[test]
    fn capacity_and_chunk_offsets() {
        let mut c = cfg(64 << 10, first_chunk_off() + 3 * (64 << 10) + 4088);
        c.per_node = vec![(2, first_chunk_off() + (64 << 10) - 8)];
        assert_eq!(c.chunks_on(0), 3);
        assert_eq!(c.chunks_on(2), 0);
        assert_eq!(c.chunk_off(0, 0), Some(first_chunk_off()));
        assert_eq!(c.chunk_off(0, 2), Some(first_chunk_off() + 2 * (64 << 10)));
        assert_eq!(c.chunk_off(0, 3), None);
        assert_eq!(c.chunk_off(0, u64::MAX), None);
        assert_eq!(c.chunk_off(2, 0), None);
        // The largest legal node still yields addressable offsets.
        let big = cfg(1 << 30, 1 << 47);
        let last = big.chunk_off(0, big.chunks_on(0) - 1).unwrap();
        assert!(host_addr(5, last + (1 << 30) - 8).is_ok());
    }

    #[test]
    fn request_checks() {
        let a = RemoteAllocator::new(cfg(4096, 1 << 20)).unwrap();
        assert_eq!(a.check_request(0, 8), Err(AllocError::ZeroBytes));
        for bad in [0, 3, 12, 8192] {
            assert_eq!(
                a.check_request(8, bad),
                Err(AllocError::BadAlign { align: bad })
            );
        }
        assert_eq!(
            a.check_request(4097, 8),
            Err(AllocError::TooLarge {
                requested: 4097,
                chunk_bytes: 4096
            })
        );
        assert_eq!(a.check_request(4096, 4096), Ok((4096, 4096)));
        assert_eq!(a.check_request(4093, 1), Ok((4096, 8)));
        assert_eq!(a.check_request(1, 64), Ok((8, 64)));
    }

    #[test]
    fn carve_aligns_and_refuses_overflow() {
        let mut c = Cursor {
            node: 0,
            next: 4096 + 8,
            end: 8192,
        };
        assert_eq!(c.carve(8, 64), Some(4096 + 64));
        assert_eq!(c.next, 4096 + 72);
        assert_eq!(c.carve(4096, 8), None);
        assert_eq!(c.next, 4096 + 72, "a failed carve must not move the cursor");
        assert_eq!(c.carve(8192 - 4096 - 72, 8), Some(4096 + 72));
        assert_eq!(c.room(), 0);
        let mut top = Cursor {
            node: 0,
            next: u64::MAX - 3,
            end: u64::MAX,
        };
        assert_eq!(top.carve(8, 8), None);
    }
}
