//! The index workload `loch demo`'s index phases and `loch node --workload
//! tree|hash` both run: the Sherman B+tree or the Nessie hash table, loaded
//! with `key_of(i)` → `i`, then a self-checking mix of operations
//! ([`mixed_op`]) by tasks that each own [`OWN_KEYS`] keys past the loaded
//! records.

use index::any::{AnyClient, AnyError, AnyIndex};
use index::cuckoo::{Cuckoo, CuckooConfig};
pub use index::keys::{key_of, records_sorted};
use index::tree::layout::Layout;
use index::tree::TreeConfig;
use mempool::ChunkConfig;
use nicdrv::rng::Rng;
use nicdrv::{Ctx, GlobalAddr, Nic, NodeId};
use std::cell::RefCell;
use std::rc::Rc;

/// Keys each task owns beyond the loaded records.
pub const OWN_KEYS: u64 = 256;

/// Which index a phase runs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum IndexKind {
    Tree,
    Hash,
}

/// The size of a record's key and value (`--key-size`, `--value-size`):
/// record `i`'s key is [`key_of`]`(i)` widened to the key size
/// ([`index::tree::key::wide_key`]: its 8 bytes repeated, so the order
/// is kept), its value the `u64` repeated to fill the value. Held as the
/// tree's node layout for them, which knows both sizes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Sizes(Layout);

impl Default for Sizes {
    /// 8-byte keys and values, the papers' setting.
    fn default() -> Sizes {
        Sizes::new(8, 8).expect("8-byte keys and values are valid")
    }
}

impl Sizes {
    /// Keys of 8 bytes or one of [`index::any::WIDE_KEY_BYTES`], values of
    /// 8 to 1024 bytes; else the error, in the flags' words.
    pub fn new(key_bytes: usize, value_bytes: usize) -> Result<Sizes, String> {
        index::any::record_layout(key_bytes, value_bytes)
            .map(Sizes)
            .map_err(|e| e.for_flags("--key-size", "--value-size"))
    }
    pub fn key_bytes(&self) -> usize {
        self.0.key_bytes()
    }
    pub fn value_bytes(&self) -> usize {
        self.0.value_bytes()
    }
    /// The tree's node layout for these sizes (nodes grow past 1 KiB for
    /// wide records).
    pub fn layout(&self) -> Layout {
        self.0
    }
    /// Scratch an executor slot needs to run either index's operations:
    /// the tree's six nodes at once, and never less than the 64 KiB the
    /// hash table's operations and the loader's clearing take.
    pub fn scratch_bytes_per_slot(&self) -> usize {
        self.0.op_scratch_bytes().max(64 << 10)
    }
}

/// The flags `loch node` takes for index workload `kind` of records of
/// `sizes` on tree `tree`, defaults left out: the sizes for either index,
/// the tree for the tree. What compute nodes agree on, and what
/// `--processes` gives them.
pub fn index_args(kind: IndexKind, sizes: Sizes, tree: &str) -> Vec<String> {
    let mut args = Vec::new();
    if sizes != Sizes::default() {
        args.extend([
            "--key-size".to_string(),
            sizes.key_bytes().to_string(),
            "--value-size".to_string(),
            sizes.value_bytes().to_string(),
        ]);
    }
    if kind == IndexKind::Tree && tree != DEFAULT_TREE {
        args.extend(["--tree".to_string(), tree.to_string()]);
    }
    args
}

/// An index workload's records, as memory nodes must hold them:
/// `records` loaded records and [`OWN_KEYS`] for each of `tasks` tasks, of
/// `sizes`, over `memory_nodes` memory nodes, each task's client carving
/// chunks of `chunk_bytes` on every node (the hash table's do).
#[derive(Copy, Clone, Debug)]
pub struct IndexLoad {
    pub sizes: Sizes,
    pub records: u64,
    pub tasks: u64,
    pub memory_nodes: u64,
    pub chunk_bytes: u64,
}

impl IndexLoad {
    /// Host bytes of each memory node the workload takes: the records as
    /// the tree's nodes hold them once inserts split leaves
    /// ([`Layout::bytes_for_records`]) or as the hash table holds them
    /// ([`hash_bytes`]), whichever is more, a chunk a task, and 32 MiB for
    /// the rest (internal nodes, the superblock, a partly used chunk per
    /// allocator, entries a hash put holds back for its grace period).
    /// Each index starts on memory as booted ([`clear_index_memory`]), so
    /// this is what the larger of the two takes.
    pub fn needed(&self) -> u64 {
        let sizes = self.sizes;
        self.bytes(|keys| sizes.0.bytes_for_records(keys).max(hash_bytes(sizes, keys)))
            .saturating_add(32 << 20)
            .next_multiple_of(1 << 20)
    }

    /// The least host bytes of each memory node index `kind` can run in:
    /// the records as a bulk load lays them out (the tree's
    /// [`Layout::bytes_loaded`], the hash table's [`hash_bytes`]) and a
    /// chunk a task, no margin. Less than this cannot hold the load.
    pub fn least(&self, kind: IndexKind) -> u64 {
        let sizes = self.sizes;
        match kind {
            IndexKind::Tree => self.bytes(|keys| sizes.0.bytes_loaded(keys)),
            IndexKind::Hash => self.bytes(|keys| hash_bytes(sizes, keys)),
        }
    }

    /// `records(keys)` bytes for the records and the tasks' own keys,
    /// spread over the memory nodes, plus a chunk a task on each.
    fn bytes(&self, records: impl Fn(u64) -> u64) -> u64 {
        let keys = self.records.saturating_add(self.tasks * OWN_KEYS);
        (records(keys) / self.memory_nodes.max(1)).saturating_add(self.tasks * self.chunk_bytes)
    }
}

/// Bytes the hash table takes for `keys` keys of `sizes`, over all memory
/// nodes: each key's entry in a block of its class (a power of two of
/// lines, so a 1 KiB value's entry takes 2 KiB), and the table's slots, 8
/// bytes each, for a quarter more keys than it holds ([`index_handle`]).
pub fn hash_bytes(sizes: Sizes, keys: u64) -> u64 {
    use index::cuckoo::layout::{entry_lines, BUCKET_BYTES, SLOTS};
    use index::cuckoo::reclaim::{block_bytes, class_of};
    let entry = block_bytes(class_of(entry_lines(
        sizes.key_bytes(),
        sizes.value_bytes(),
    )));
    let slot = (BUCKET_BYTES / SLOTS) as u64;
    let capacity = keys.saturating_add(keys / 4);
    keys.saturating_mul(entry)
        .saturating_add(capacity.saturating_mul(slot))
}

/// A compute node's handle on the index of a phase: `records` loaded keys
/// plus [`OWN_KEYS`] for each of `tasks` tasks, of `sizes`; `dm_bytes` is
/// the device memory each memory node offers (the tree's lock table must
/// fit it). Every compute node of a cluster must pass the same values.
pub fn index_handle(
    kind: IndexKind,
    tree_cfg: &TreeConfig,
    sizes: Sizes,
    records: u64,
    tasks: u64,
    dm_bytes: u64,
) -> Result<AnyIndex, String> {
    Ok(match kind {
        IndexKind::Tree => {
            let cfg = TreeConfig {
                value_bytes: sizes.value_bytes(),
                ..tree_cfg.clone()
            };
            AnyIndex::tree(sizes.key_bytes(), cfg, dm_bytes).map_err(|e| e.to_string())?
        }
        IndexKind::Hash => {
            let keys = records + tasks * OWN_KEYS;
            let (kb, vb) = (sizes.key_bytes(), sizes.value_bytes());
            let mut cfg = CuckooConfig::new(keys + keys / 4, kb, vb, tree_cfg.chunk.node_bytes);
            cfg.chunk = tree_cfg.chunk.clone();
            AnyIndex::Hash(Cuckoo::new(cfg).map_err(|e| e.to_string())?)
        }
    })
}

/// The tree the index workloads run when not told (`--tree`): Sherman as
/// the paper builds it.
pub const DEFAULT_TREE: &str = "sherman";

/// Checks a `--tree` name: one of [`TreeConfig::NAMES`].
pub fn check_tree(name: &str) -> Result<(), String> {
    named_tree(name, 0).map(drop)
}

/// The tree named `name` ([`TreeConfig::named`]) for memory nodes of
/// `host_bytes`, or the error naming the trees there are.
fn named_tree(name: &str, host_bytes: u64) -> Result<TreeConfig, String> {
    TreeConfig::named(name, host_bytes).ok_or_else(|| {
        format!(
            "--tree: unknown tree `{name}` (known: {})",
            TreeConfig::NAMES
        )
    })
}

/// The tree configuration of the index workload: the tree named `name`
/// ([`TreeConfig::named`]: Sherman, Sherman writing in two round trips,
/// the FG+ baseline, ...), with the given chunks (every user of a memory
/// node must cut it into the same chunks).
pub fn tree_config(name: &str, host_bytes: u64, chunk: &ChunkConfig) -> Result<TreeConfig, String> {
    Ok(TreeConfig {
        chunk: chunk.clone(),
        cache_bytes: 16 << 20,
        ..named_tree(name, host_bytes)?
    })
}

/// The summary's name of the tree phase or workload.
pub fn tree_title(name: &str) -> String {
    if name == DEFAULT_TREE {
        "B+tree (Sherman, bulk load)".into()
    } else {
        format!("B+tree ({name}, bulk load)")
    }
}

/// Which of a memory node's chunks [`clear_index_memory`] zeroes.
pub enum Chunks {
    /// Every chunk below this many bytes of host memory: memory nodes
    /// that outlive compute runs, whose chunk size a later run may
    /// change.
    Below(u64),
    /// The chunks of this configuration that the node's chunk cursor
    /// counts (handed out since the node booted or was last cleared),
    /// none past the node's capacity: chunks past the cursor were never
    /// handed out since, so they are still as booted. For a cluster
    /// whose chunks keep one size while it lives (`loch demo`).
    Counted(ChunkConfig),
}

/// Zeroes what an index keeps on memory nodes `memory` (their `chunks`,
/// then each one's chunk cursor and the hash table's lending pool (whose
/// heads would otherwise name blocks of the cleared chunks, handed out
/// again by the cursor: `index::cuckoo::lend`) and, on node 0, the index
/// roots, then the
/// first `dm_bytes` of each one's device memory: the tree's lock table, all
/// device memory holds), so that the next index finds them as freshly
/// booted ones. A run that ended with a lock held, or the verb phase's
/// counters in device memory, would otherwise read as locks some client
/// holds (a writer waits on them until its lock wait runs out), and an
/// index loaded after another would find its chunks taken and its fresh
/// memory written. The chunks go before the cursor, so a clear that fails
/// part way leaves the cursor counting what is still to zero. Only a
/// loader calls it, while no other client uses the memory nodes.
pub async fn clear_index_memory<N: Nic>(
    ctx: &Ctx<N>,
    memory: &[NodeId],
    chunks: &Chunks,
    dm_bytes: u64,
) -> Result<(), String> {
    use mempool::layout::{first_chunk_off, CHUNK_CURSOR_OFF};
    for &m in memory {
        let at = |off| GlobalAddr::host(m, off);
        async {
            let bytes = match chunks {
                Chunks::Below(end) => end.saturating_sub(first_chunk_off()),
                Chunks::Counted(c) => {
                    let handed = ctx.read(at(CHUNK_CURSOR_OFF), 8).await?.u64_at(0);
                    handed.min(c.chunks_on(m)) * c.chunk_bytes
                }
            };
            // In pieces within a loader slot's scratch.
            crate::node_work::write_zeros(ctx, at(first_chunk_off()), bytes, 16 << 10).await?;
            for w in index_words(m) {
                ctx.write(at(w), &[0u8; 8]).await?;
            }
            crate::node_work::write_zeros(ctx, GlobalAddr::device(m, 0), dm_bytes, 16 << 10).await
        }
        .await
        .map_err(|e: nicdrv::VerbError| format!("clearing memory node {m}: {e}"))?;
    }
    Ok(())
}

/// The superblock words an index keeps on memory node `m` (offsets): its
/// chunk cursor, the hash table's lending pool heads and, on node 0, the
/// index roots and the hash table's want count.
fn index_words(m: NodeId) -> Vec<u64> {
    use mempool::layout::{
        CHUNK_CURSOR_OFF, HASH_LEND_OFF, HASH_LEND_WORDS, HASH_ROOT_OFF, HASH_WANT_OFF,
        TREE_ROOT_OFF,
    };
    let mut words = vec![CHUNK_CURSOR_OFF];
    words.extend((0..HASH_LEND_WORDS).map(|c| HASH_LEND_OFF + 64 * c));
    if m == 0 {
        words.extend([TREE_ROOT_OFF, HASH_ROOT_OFF, HASH_WANT_OFF]);
    }
    words
}

/// Creates the index and loads `records` records (`key_of(i)` → `i`): the
/// tree by bulk load, the hash table by puts. Sets `err` on failure.
pub async fn load<N: Nic>(
    ctx: Ctx<N>,
    index: AnyIndex,
    records: u64,
    err: Rc<RefCell<Option<String>>>,
) {
    let r = async {
        match &index {
            AnyIndex::Tree(_) | AnyIndex::Wide(_) => {
                let mut c = index.client(u64::MAX - 1).map_err(|e| e.to_string())?;
                c.create(&ctx).await.map_err(|e| e.to_string())?;
                let loaded = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
                c.bulk_load(&ctx, records_sorted(records), loaded)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            AnyIndex::Hash(_) => {
                // No bulk load for a hash table: one put per record.
                let mut c = index.client(u64::MAX - 1).map_err(|e| e.to_string())?;
                c.create(&ctx).await.map_err(|e| e.to_string())?;
                for i in 0..records {
                    c.put(&ctx, key_of(i), i).await.map_err(|e| e.to_string())?;
                }
            }
        }
        Ok::<(), String>(())
    };
    if let Err(e) = r.await {
        *err.borrow_mut() = Some(e);
    }
}

/// A task's own keys (`OWN_KEYS` of them past the loaded records, by task
/// id) and what it last wrote to each.
pub struct OwnKeys {
    base: u64,
    shadow: Vec<Option<u64>>,
}

impl OwnKeys {
    pub fn new(records: u64, me: u64) -> OwnKeys {
        OwnKeys {
            base: records + me * OWN_KEYS,
            shadow: vec![None; OWN_KEYS as usize],
        }
    }
}

/// One operation of the self-checking mix that `loch demo` and `loch node`
/// run: 40 % lookups of loaded records, 25 % puts, 10 % deletes and 15 %
/// lookups of the task's own keys, 10 % scans (skipped on the hash table).
/// Ok(true) when the answer contradicts the loaded data, the task's own
/// writes or a scan's order.
pub async fn mixed_op<N: Nic>(
    ctx: &Ctx<N>,
    c: &mut AnyClient,
    rng: &mut Rng,
    records: u64,
    own: &mut OwnKeys,
) -> Result<bool, AnyError> {
    let j = rng.below(OWN_KEYS);
    let key = key_of(own.base + j);
    let slot = &mut own.shadow[j as usize];
    match rng.below(100) {
        0..=39 => {
            let i = rng.below(records.max(1));
            let v = c.get(ctx, key_of(i)).await?;
            Ok(records > 0 && v != Some(i))
        }
        40..=64 => {
            let v = rng.next_u64() >> 1;
            c.put(ctx, key, v).await?;
            *slot = Some(v);
            Ok(false)
        }
        65..=74 => {
            let was = c.delete(ctx, key).await?;
            let bad = was != slot.is_some();
            *slot = None;
            Ok(bad)
        }
        75..=89 => Ok(c.get(ctx, key).await? != *slot),
        _ => {
            let low = key_of(rng.below(records.max(1)));
            match c.scan(ctx, low, u64::MAX - 1, 20).await {
                Ok(v) => {
                    Ok(!v.windows(2).all(|p| p[0].0 < p[1].0)
                        || v.first().is_some_and(|p| p.0 < low))
                }
                // The hash table keeps no order: its scans are skipped.
                Err(AnyError::NoScans) => Ok(false),
                Err(e) => Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::{host_bytes, DemoConfig};
    use crate::processes::{memory_bytes, ProcessesConfig};

    #[test]
    fn sizes_say_their_flags_and_their_scratch() {
        let d = Sizes::default();
        assert_eq!((d.key_bytes(), d.value_bytes()), (8, 8));
        assert!(index_args(IndexKind::Tree, d, DEFAULT_TREE).is_empty());
        assert_eq!(d.scratch_bytes_per_slot(), 64 << 10);
        let w = Sizes::new(64, 128).unwrap();
        assert_eq!(
            index_args(IndexKind::Hash, w, DEFAULT_TREE).join(" "),
            "--key-size 64 --value-size 128"
        );
        // The tree is the tree's only.
        assert_eq!(
            index_args(IndexKind::Tree, w, "fg").join(" "),
            "--key-size 64 --value-size 128 --tree fg"
        );
        assert!(index_args(IndexKind::Hash, d, "fg").is_empty());
        // 1 KiB records: 32 KiB nodes, six of them and the words beside
        // them for one tree operation.
        let big = Sizes::new(1024, 1024).unwrap();
        assert_eq!(big.layout().node_bytes(), 32 << 10);
        let words = index::tree::layout::SMALL_SCRATCH;
        assert_eq!(big.scratch_bytes_per_slot(), 6 * (32 << 10) + words);
        assert!(Sizes::new(12, 8)
            .unwrap_err()
            .starts_with("--key-size must be"));
        assert!(Sizes::new(8, 0).unwrap_err().starts_with("--value-size: "));
    }

    /// The demo's memory nodes keep their 64 MiB for the default records
    /// and grow for records that would not fit, by what the tree's nodes
    /// take; so do `--processes`' memory nodes.
    #[test]
    fn memory_nodes_grow_with_the_records_they_must_hold() {
        let cfg = DemoConfig::default();
        assert_eq!(host_bytes(&cfg), 64 << 20);
        let wide = DemoConfig {
            sizes: Sizes::new(1024, 1024).unwrap(),
            ..DemoConfig::default()
        };
        let tasks = (wide.cores * wide.tasks_per_core) as u64;
        let tree = wide
            .sizes
            .layout()
            .bytes_for_records(wide.tree_records + tasks * OWN_KEYS);
        let host = host_bytes(&wide);
        assert!(host >= tree / 2 && host.is_multiple_of(1 << 20), "{host}");
        assert!(host < tree / 2 + (64 << 20), "{host}");
        assert_eq!(memory_bytes(&ProcessesConfig::default()), 64 << 20);
        let p = ProcessesConfig {
            sizes: wide.sizes,
            ..ProcessesConfig::default()
        };
        assert!(memory_bytes(&p) >= tree / 2, "{}", memory_bytes(&p));
    }

    /// A clear leaves every word an index keeps as booted: each node's
    /// chunk cursor and lending pool heads (a head left over would hand a
    /// later run blocks its own allocator hands out too), node 0's roots,
    /// and the chunks; the word between them (the txn root) is not the
    /// index's and stays.
    #[test]
    fn a_clear_zeroes_every_word_an_index_keeps() {
        use mempool::layout::{first_chunk_off, HASH_LEND_OFF, TXN_ROOT_OFF};
        use nicdrv::sim::{RunEnd, SimConfig, World};
        use nicdrv::{GlobalAddr, Space};
        let host = first_chunk_off() + (64 << 10);
        let mut w = World::new(SimConfig {
            seed: 1,
            memory_nodes: 2,
            compute_nodes: 1,
            host_bytes: host,
            dm_bytes: 4096,
            ..Default::default()
        })
        .unwrap();
        let mut words: Vec<(NodeId, u64)> = (0..2)
            .flat_map(|m| index_words(m).into_iter().map(move |off| (m, off)))
            .collect();
        assert!(words.contains(&(1, HASH_LEND_OFF + 64 * 7)));
        assert!(words.contains(&(0, mempool::layout::HASH_WANT_OFF)));
        words.push((0, first_chunk_off() + 4096));
        let t = w.add_thread(0, Default::default()).unwrap();
        let set = words.clone();
        w.spawn(t, move |ctx| async move {
            for &(m, off) in set.iter().chain([&(0, TXN_ROOT_OFF)]) {
                let at = GlobalAddr::host(m, off);
                ctx.write(at, &7u64.to_le_bytes()).await.unwrap();
            }
            clear_index_memory(&ctx, &[0, 1], &Chunks::Below(host), 4096)
                .await
                .unwrap();
        })
        .unwrap();
        assert_eq!(w.run(), RunEnd::Done);
        for (m, off) in words {
            assert_eq!(
                w.read_u64(m, Space::Host, off),
                Some(0),
                "node {m} at {off}"
            );
        }
        assert_eq!(w.read_u64(0, Space::Host, TXN_ROOT_OFF), Some(7));
    }

    /// The least each index runs in: a hash entry of a 1 KiB value takes
    /// a 2 KiB block and an 8-byte record's a line, each more than a
    /// loaded leaf gives its record; what the demo gives holds either.
    #[test]
    fn the_least_memory_holds_either_index() {
        let load = |sizes: Sizes, records: u64| IndexLoad {
            sizes,
            records,
            tasks: 4,
            memory_nodes: 1,
            chunk_bytes: 256 << 10,
        };
        let keys = |records: u64| records + 4 * OWN_KEYS;
        let wide_values = Sizes::new(8, 1024).unwrap();
        assert_eq!(
            hash_bytes(wide_values, 1000),
            1000 * 2048 + 1250 * 8,
            "17 lines in a 32-line block, and 1.25 slots a key"
        );
        let l = load(wide_values, 8000);
        let hash = l.least(IndexKind::Hash);
        assert!(hash >= keys(8000) * 2048 + 4 * (256 << 10), "{hash}");
        let tree = l.least(IndexKind::Tree);
        assert!(tree < hash, "{tree} {hash}");
        assert_eq!(
            tree,
            wide_values.layout().bytes_loaded(keys(8000)) + 4 * (256 << 10)
        );
        // What the demo gives memory nodes holds either.
        assert!(l.needed() >= hash + (32 << 20), "{}", l.needed());
        let small = load(Sizes::default(), 100_000);
        assert_eq!(
            small.least(IndexKind::Hash),
            hash_bytes(Sizes::default(), keys(100_000)) + 4 * (256 << 10)
        );
        assert!(small.least(IndexKind::Tree) < small.least(IndexKind::Hash));
    }
}
