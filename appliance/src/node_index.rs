//! The index workloads `loch node` runs on its compute cores (`--workload
//! tree|hash`): the Sherman B+tree or the Nessie hash table over every
//! memory node of the cluster, with the same self-checking mix as the
//! index workload of `loch demo`'s index phases ([`crate::index_work`]).
//!
//! Across processes: the lowest-id compute node creates the index and
//! loads `records` records ([`crate::index_work::load`]) after the
//! "memory-ready" barrier; every node then meets at "index-ready", and
//! each compute node opens its own handle — the tree's root word and the
//! table's descriptor word sit in memory node 0's superblock, so opening
//! is building a handle with the same configuration ([`handle`]).
//!
//! Checks: loaded records are never written (every task reads them, the
//! shared hot keys), so a lookup of one must return its value; each task
//! owns [`crate::index_work::OWN_KEYS`] further keys (task ids are unique over the cluster),
//! writes only those and keeps a shadow, so its lookups and deletes of them
//! must agree with the shadow; every tree scan must be in order.
//!
//! Memory: the index allocators use the chunks below
//! [`Layout::index_bytes`](crate::node_work::Layout), so they never touch
//! the verb workload's areas.

use crate::index_work::{index_handle, mixed_op, tree_config, IndexKind, OwnKeys, Sizes};
use crate::stats::OpTally;
use index::any::AnyClient;
use index::tree::TreeStats;
use mempool::ChunkConfig;
use nicdrv::rng::Rng;
use nicdrv::{Ctx, Nic};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

pub use index::any::AnyIndex;

/// Chunk size of the index allocators (every compute node must agree).
pub const CHUNK_BYTES: u64 = 256 << 10;
/// The loader's client id: above every task id.
pub const LOADER_ID: u64 = u64::MAX - 1;

/// How memory nodes are cut into chunks for the index: `index_bytes` of
/// each node, the verb areas above left alone.
pub fn chunk_config(index_bytes: u64) -> ChunkConfig {
    ChunkConfig {
        chunk_bytes: CHUNK_BYTES,
        ..ChunkConfig::new(index_bytes)
    }
}

/// This compute node's handle on the cluster's index. `tasks` is the
/// number of task slots of the whole cluster and `dm_bytes` the device
/// memory of each memory node; with the other arguments they come from the
/// cluster file and the flags, so every compute node builds the same.
#[allow(clippy::too_many_arguments)]
pub fn handle(
    kind: IndexKind,
    tree: &str,
    index_bytes: u64,
    sizes: Sizes,
    records: u64,
    tasks: u64,
    dm_bytes: u64,
) -> Result<AnyIndex, String> {
    let tcfg = tree_config(tree, index_bytes, &chunk_config(index_bytes))?;
    index_handle(kind, &tcfg, sizes, records, tasks, dm_bytes)
}

/// What the tasks of one core share (one thread, so `Cell`s).
pub struct IndexCoreState {
    pub tally: OpTally,
    pub failures: Cell<u64>,
    /// The tasks' index counters, summed, kept current after every
    /// operation (the per-second line shows the cache hit ratio).
    pub tree: Cell<TreeStats>,
    pub first_error: RefCell<Option<String>>,
}

impl IndexCoreState {
    pub fn new() -> Rc<IndexCoreState> {
        Rc::new(IndexCoreState {
            tally: OpTally::default(),
            failures: Cell::new(0),
            tree: Cell::new(TreeStats::default()),
            first_error: RefCell::new(None),
        })
    }
}

/// The difference of two snapshots of one client's counters.
fn delta(now: TreeStats, before: TreeStats) -> TreeStats {
    TreeStats {
        read_retries: now.read_retries - before.read_retries,
        lock_retries: now.lock_retries - before.lock_retries,
        handovers: now.handovers - before.handovers,
        pages_handed_over: now.pages_handed_over - before.pages_handed_over,
        cache_hits: now.cache_hits - before.cache_hits,
        cache_misses: now.cache_misses - before.cache_misses,
        sibling_hops: now.sibling_hops - before.sibling_hops,
        splits: now.splits - before.splits,
        clean_lookups: now.clean_lookups - before.clean_lookups,
        lookups: now.lookups - before.lookups,
        locks_stranded: now.locks_stranded - before.locks_stranded,
        stranded_released: now.stranded_released - before.stranded_released,
        root_helps: now.root_helps - before.root_helps,
    }
}

/// One task (`me`: its cluster-wide id, from 1): the self-checking mix of
/// [`mixed_op`], as `loch demo` runs it, until `stop()` or `deadline_ns`
/// (the NIC clock). The first failed operation ends the task.
#[allow(clippy::too_many_arguments)]
pub async fn task<N: Nic>(
    ctx: Ctx<N>,
    mut c: AnyClient,
    me: u64,
    mut rng: Rng,
    records: u64,
    deadline_ns: u64,
    stop: fn() -> bool,
    st: Rc<IndexCoreState>,
) {
    let mut own = OwnKeys::new(records, me);
    let mut seen = c.tree_stats();
    while ctx.now_ns() < deadline_ns && !stop() {
        let t0 = ctx.now_ns();
        let r = mixed_op(&ctx, &mut c, &mut rng, records, &mut own).await;
        if let Ok(true) = r {
            st.tally.mismatch()
        }
        let now = c.tree_stats();
        let mut sum = st.tree.get();
        sum += delta(now, seen);
        st.tree.set(sum);
        seen = now;
        if let Err(e) = r {
            st.failures.set(st.failures.get() + 1);
            let mut first = st.first_error.borrow_mut();
            if first.is_none() {
                *first = Some(format!("task {me}: {e}"));
            }
            return;
        }
        st.tally.done(ctx.now_ns() - t0);
    }
}
