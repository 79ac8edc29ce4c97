//! The index workload `loch demo`'s index phases and `loch node --workload
//! tree|hash` both run: the Sherman B+tree or the Nessie hash table, loaded
//! with `key_of(i)` → `i`, then a self-checking mix of operations
//! ([`mixed_op`]) by tasks that each own [`OWN_KEYS`] keys past the loaded
//! records.

use index::any::{AnyClient, AnyError, AnyIndex};
use index::cuckoo::{Cuckoo, CuckooConfig};
pub use index::keys::{key_of, records_sorted};
use index::tree::{Tree, TreeConfig};
use mempool::ChunkConfig;
use nicdrv::rng::Rng;
use nicdrv::{Ctx, Nic};
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

/// A compute node's handle on the index of a phase: `records` loaded keys
/// plus [`OWN_KEYS`] for each of `tasks` tasks; `dm_bytes` is the device
/// memory each memory node offers (the tree's lock table must fit it).
/// Every compute node of a cluster must pass the same values.
pub fn index_handle(
    kind: IndexKind,
    tree_cfg: &TreeConfig,
    records: u64,
    tasks: u64,
    dm_bytes: u64,
) -> Result<AnyIndex, String> {
    Ok(match kind {
        IndexKind::Tree => {
            AnyIndex::Tree(Tree::new(tree_cfg.clone(), dm_bytes).map_err(|e| e.to_string())?)
        }
        IndexKind::Hash => {
            let keys = records + tasks * OWN_KEYS;
            let mut cfg = CuckooConfig::new(keys + keys / 4, 8, 8, tree_cfg.chunk.node_bytes);
            cfg.chunk = tree_cfg.chunk.clone();
            AnyIndex::Hash(Cuckoo::new(cfg).map_err(|e| e.to_string())?)
        }
    })
}

/// The tree configuration of the index workload: Sherman, with the given chunks
/// (every user of a memory node must cut it into the same chunks).
pub fn tree_config(host_bytes: u64, chunk: &ChunkConfig) -> TreeConfig {
    TreeConfig {
        chunk: chunk.clone(),
        cache_bytes: 16 << 20,
        ..TreeConfig::sherman(host_bytes)
    }
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
