//! Shared fixtures of the cuckoo tests: `u64` keys and values encoded as
//! the table's byte strings (values carry a pattern derived from them, so a
//! torn or mixed value is caught on decoding), tables created on sim and
//! emu.
#![allow(dead_code)]

use crate::common::{emu_executor, exec_cfg, HOST};
use cluster::EmuCluster;
use index::cuckoo::{Cuckoo, CuckooClient, CuckooConfig};
use nicdrv::sim::{RunEnd, World};
use nicdrv::{Ctx, Nic};
use std::sync::Arc;

/// A table for `capacity` keys of `key_bytes`, values up to `max_value`,
/// on the common fixtures' memory nodes.
pub fn cfg(capacity: u64, key_bytes: usize, max_value: usize) -> CuckooConfig {
    CuckooConfig::new(capacity, key_bytes, max_value, HOST)
}

/// `c` on memory nodes of `chunks` chunks of 4 KiB each (small, so that
/// tests run the memory out), and those nodes' bytes.
pub fn on_chunks(mut c: CuckooConfig, chunks: u64) -> (CuckooConfig, u64) {
    let node_bytes = mempool::layout::first_chunk_off() + chunks * 4096;
    c.chunk = mempool::ChunkConfig {
        chunk_bytes: 4096,
        ..mempool::ChunkConfig::new(node_bytes)
    };
    (c, node_bytes)
}

/// The bytes of key `k`: its little-endian bytes, then a pattern of it.
pub fn key(k: u64, key_bytes: usize) -> Vec<u8> {
    let kb = k.to_le_bytes();
    (0..key_bytes)
        .map(|i| match kb.get(i) {
            Some(&b) => b,
            None => (k.wrapping_mul(31).wrapping_add(i as u64) % 251) as u8,
        })
        .collect()
}

/// The value for `v`: `8 + (v % spread)` bytes (at most `max`), its
/// little-endian bytes and then a pattern derived from it.
pub fn value(v: u64, max: usize) -> Vec<u8> {
    let len = (8 + (v % 61) as usize * 7).min(max).max(8);
    let mut out = v.to_le_bytes().to_vec();
    for i in 8..len {
        out.push(pattern(v, i));
    }
    out
}

fn pattern(v: u64, i: usize) -> u8 {
    (v.rotate_left((i % 64) as u32) ^ (i as u64 * 0x9e37)) as u8
}

/// Decodes a value made by [`value`]; panics on anything else.
pub fn decode(bytes: &[u8], max: usize) -> u64 {
    assert!(bytes.len() >= 8, "value of {} bytes", bytes.len());
    let v = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    assert_eq!(bytes, &value(v, max)[..], "torn or foreign value for {v}");
    v
}

pub async fn get_u64<N: Nic>(
    c: &mut CuckooClient,
    ctx: &Ctx<N>,
    k: u64,
) -> Result<Option<u64>, index::cuckoo::CuckooError> {
    let cfg = c.table().config().clone();
    Ok(c.get(ctx, &key(k, cfg.key_bytes))
        .await?
        .map(|v| decode(&v, cfg.max_value_bytes)))
}

pub async fn put_u64<N: Nic>(
    c: &mut CuckooClient,
    ctx: &Ctx<N>,
    k: u64,
    v: u64,
) -> Result<(), index::cuckoo::CuckooError> {
    let cfg = c.table().config().clone();
    c.put(ctx, &key(k, cfg.key_bytes), &value(v, cfg.max_value_bytes))
        .await
}

pub async fn delete_u64<N: Nic>(
    c: &mut CuckooClient,
    ctx: &Ctx<N>,
    k: u64,
) -> Result<bool, index::cuckoo::CuckooError> {
    let kb = key(k, c.table().config().key_bytes);
    c.delete(ctx, &kb).await
}

/// Creates the table on `w` (one task on a thread of compute node 0).
pub fn sim_create_table(w: &mut World, t: &Arc<Cuckoo>) {
    let th = w.add_thread(0, exec_cfg(1)).unwrap();
    let t = t.clone();
    w.spawn(th, move |ctx| async move {
        t.client().unwrap().create(&ctx).await.unwrap();
    })
    .unwrap();
    assert_eq!(w.run(), RunEnd::Done);
}

/// Creates the table on an emu cluster.
pub fn emu_create_table(emu: &EmuCluster, t: &Arc<Cuckoo>) {
    let mut ex = emu_executor(emu, 1);
    let t = t.clone();
    ex.spawn(move |ctx| async move { t.client().unwrap().create(&ctx).await.unwrap() })
        .unwrap();
    ex.run();
}

/// Where a client records: a single-threaded history (sim) or a shared
/// recorder (emu threads).
#[derive(Clone)]
pub enum Rec {
    Local(std::rc::Rc<std::cell::RefCell<history::map::History>>),
    Shared(history::map::Recorder),
}

impl Rec {
    pub fn invoke(&self, client: u32, op: history::map::Op, now: u64) -> history::map::OpId {
        match self {
            Rec::Local(h) => h.borrow_mut().invoke(client, op, now),
            Rec::Shared(r) => r.invoke(client, op, now),
        }
    }
    pub fn complete(&self, id: history::map::OpId, ret: history::map::Ret, now: u64) {
        match self {
            Rec::Local(h) => h.borrow_mut().complete(id, ret, now),
            Rec::Shared(r) => r.complete(id, ret, now),
        }
    }
}

/// Client statistics summed over tasks (and threads).
pub type StatsSink = Arc<std::sync::Mutex<index::cuckoo::CuckooStats>>;

/// The turn clock: invocations stamped no later, completions no earlier,
/// than they happened.
pub fn turn_clock<N: Nic>(ctx: &Ctx<N>) -> u64 {
    ctx.now_ns()
}

pub fn wall_clock<N: Nic>(_: &Ctx<N>) -> u64 {
    nicdrv::clock::now_ns()
}

/// What a random client does: weights of put, get and delete (of 10), and
/// the keys it picks from (uniformly).
#[derive(Clone)]
pub struct Workload {
    pub put: u64,
    pub get: u64,
    pub keys: Arc<Vec<u64>>,
    pub ops: u32,
    /// Whether the client, its operations done, leaves the table
    /// (`CuckooClient::lend_all`; what it lent is in its stats).
    pub leave: bool,
    /// Where verb errors are counted when they are expected (a link cut
    /// while the client runs): an operation failing with one is recorded
    /// as unknown (pending) and the client goes on. `None`: any error
    /// but `TableFull` panics.
    pub verb_errors: Option<Arc<std::sync::atomic::AtomicU64>>,
}

/// Random recorded operations. Every value written is unique to its put.
/// A put refused with `TableFull` had no effect and is recorded as
/// unknown (the checker may take it or not), as is, when the workload
/// expects them, an operation that met a verb error (counted in the
/// workload's `verb_errors`); any other error panics.
#[allow(clippy::too_many_arguments)]
pub async fn random_client<N: Nic>(
    ctx: Ctx<N>,
    mut c: CuckooClient,
    rec: Rec,
    me: u32,
    seed: u64,
    wl: Workload,
    clock: fn(&Ctx<N>) -> u64,
    sink: StatsSink,
) {
    use history::map::{Op, Ret};
    let mut rng = nicdrv::rng::Rng::stream(seed, nicdrv::rng::Domain::Client, me as u64);
    for i in 0..wl.ops {
        let k = wl.keys[rng.below(wl.keys.len() as u64) as usize];
        let dice = rng.below(10);
        let (id, r) = if dice < wl.put {
            let v = ((me as u64) << 40) | i as u64;
            let id = rec.invoke(me, Op::Put(k, v), clock(&ctx));
            (
                id,
                match put_u64(&mut c, &ctx, k, v).await {
                    Err(index::cuckoo::CuckooError::TableFull) => Ok(Ret::Unknown),
                    r => r.map(|_| Ret::Put),
                },
            )
        } else if dice < wl.put + wl.get {
            let id = rec.invoke(me, Op::Get(k), clock(&ctx));
            (id, get_u64(&mut c, &ctx, k).await.map(Ret::Get))
        } else {
            let id = rec.invoke(me, Op::Delete(k), clock(&ctx));
            (
                id,
                delete_u64(&mut c, &ctx, k)
                    .await
                    .map(|b| Ret::Delete(Some(b))),
            )
        };
        match (r, &wl.verb_errors) {
            (Ok(ret), _) => rec.complete(id, ret, clock(&ctx)),
            (Err(index::cuckoo::CuckooError::Verb(_)), Some(n)) => {
                rec.complete(id, Ret::Unknown, clock(&ctx));
                // Relaxed: a count, read once every client is done (the
                // run's end, or the threads' joins, order it).
                n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            (Err(e), _) => {
                rec.complete(id, Ret::Unknown, clock(&ctx));
                panic!("client {me}: {e}");
            }
        }
    }
    if wl.leave {
        if let Err(e) = c.lend_all(&ctx).await {
            panic!("client {me}: lend_all: {e}");
        }
    }
    *sink.lock().unwrap() += c.stats;
}

/// Reads the whole table out of a simulated cluster's memory (the memory
/// nodes' own view, no verbs) and checks its shape: every committed word
/// names an entry that verifies, whose key hashes to the word's bucket
/// pair and fingerprint, and no key has committed words naming two
/// different entries (a Forward word and the Normal word it moved to name
/// the same one).
pub fn audit_sim(w: &World, key_bytes: usize) -> Audit {
    use index::cuckoo::layout::{decode_entry, Desc, Slot, State, SLOTS};
    use nicdrv::Space;
    let root = w
        .read_u64(0, Space::Host, mempool::layout::HASH_ROOT_OFF)
        .unwrap();
    assert_ne!(root, 0, "no table");
    let at = nicdrv::GlobalAddr::from_raw(root);
    let read = |a: nicdrv::GlobalAddr, len: usize| {
        let mut b = vec![0u8; len];
        assert!(w.read_memory(a.node(), a.space(), a.offset(), &mut b));
        b
    };
    let n = Desc::segments_in(&read(at, 64)).unwrap();
    let desc = Desc::decode(at, &read(at, Desc::bytes(n))).unwrap();
    let mut seen: std::collections::BTreeMap<u64, (u64, u64)> = Default::default();
    let mut tentative = 0;
    let mut forward = 0;
    let mut forward_keys = Vec::new();
    let mut fill = vec![0u8; desc.buckets as usize];
    for b in 0..desc.buckets {
        let bytes = read(desc.bucket_addr(b), 64);
        for i in 0..SLOTS {
            let s = Slot(u64::from_le_bytes(
                bytes[i * 8..i * 8 + 8].try_into().unwrap(),
            ));
            fill[b as usize] += !s.is_empty() as u8;
            match s.state() {
                State::Empty => continue,
                State::Tentative => {
                    tentative += 1;
                    continue;
                }
                State::Forward => forward += 1,
                State::Normal => {}
            }
            let e = s.eref();
            let eb = read(e.addr(), e.bytes());
            let (k, v) = decode_entry(&eb, key_bytes).unwrap_or_else(|| {
                panic!("bucket {b} slot {i}: committed word {s:?} names a bad entry")
            });
            // The key's buckets at the table's level, or at either level
            // while it grows.
            let reach = index::cuckoo::view::Reach::of(&desc, k);
            assert!(
                reach.fp == s.fp() && reach.index_of(b).is_some(),
                "bucket {b} slot {i}: key in a bucket it does not hash to ({:?} {:?})",
                desc.phase,
                reach.buckets()
            );
            assert!(key_bytes >= 8, "audit_sim reads u64 keys");
            let ku = u64::from_le_bytes(k[..8].try_into().unwrap());
            let vu = decode(v, desc.max_value_bytes);
            if s.state() == State::Forward {
                forward_keys.push(ku);
            }
            if let Some(&(eref, prev)) = seen.get(&ku) {
                assert_eq!(
                    eref,
                    e.raw(),
                    "key {ku} committed twice: values {prev} and {vu}"
                );
            }
            seen.insert(ku, (e.raw(), vu));
        }
    }
    Audit {
        map: seen.into_iter().map(|(k, (_, v))| (k, v)).collect(),
        tentative,
        forward,
        forward_keys,
        fill,
        seed: desc.seed,
        seg_nodes: desc.segs.iter().map(|s| s.node()).collect(),
        level: desc.level,
        growing: desc.growing(),
    }
}

/// What [`audit_sim`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Audit {
    /// Each key's committed value.
    pub map: std::collections::BTreeMap<u64, u64>,
    pub tentative: u64,
    pub forward: u64,
    /// Keys of the Forward words.
    pub forward_keys: Vec<u64>,
    /// Non-empty slots per bucket.
    pub fill: Vec<u8>,
    pub seed: u64,
    /// The memory node of each segment of the table.
    pub seg_nodes: Vec<u16>,
    /// Times the table has doubled, and whether it is doubling again.
    pub level: u32,
    pub growing: bool,
}

impl Audit {
    /// Whether both buckets of `k` (8-byte keys) are full.
    pub fn both_full(&self, k: u64) -> bool {
        let l = index::cuckoo::place::locate(&key(k, 8), self.seed, self.fill.len() as u64);
        self.fill[l.b1 as usize] == 8 && self.fill[l.b2 as usize] == 8
    }
}
