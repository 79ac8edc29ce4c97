//! FaRM's slab allocator (§3, §5.5): the part of every region past its
//! fixed tables is cut into blocks (1 MiB), each serving objects of one
//! size; a block's first line is its header (the object size), written at
//! the primary and replicated to the backups when the block is formatted;
//! the free lists live at the primary only, with its server threads.
//!
//! Allocation is part of a transaction: ALLOC reserves a free slot for the
//! transaction at the region's primary; its commit writes the object (a
//! write whose LOCK takes the slot's free header), and ABORT gives the
//! slot back. Freeing is a write too: the committed header is free at the
//! next incarnation, and the slot goes back to its free list once
//! installed. A slot's header carries the free bit from the block's
//! formatting on, so a read of a freed or never-allocated object is an
//! error, never a value.
//!
//! Allocator recovery (§5.5, [`recover_region`]): a backup promoted to
//! primary has no free lists, so it rebuilds them by scanning the region,
//! paced.
//!
//! ```text
//! block      line 0: BLOCK_MAGIC << 32 | object payload bytes
//!            then slots of object_bytes(payload) each
//! ```

use crate::object::{self, object_bytes, Header, LINE};
use crate::records::{ObjAddr, TxId};
use crate::regions::RegionMap;
use nicdrv::{Ctx, GlobalAddr, Nic};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// FaRM's block size.
pub const BLOCK_BYTES: u64 = 1 << 20;

/// Marks a formatted block header (the high word).
pub const BLOCK_MAGIC: u64 = 0x5a1b;

/// The block header word for objects of `payload` bytes.
pub fn block_word(payload: usize) -> u64 {
    (BLOCK_MAGIC << 32) | payload as u64
}

/// The object size a block header word names, if it is one.
pub fn block_class(word: u64) -> Option<usize> {
    (word >> 32 == BLOCK_MAGIC && (1..=object::MAX_PAYLOAD as u64).contains(&(word & 0xffff_ffff)))
        .then_some((word & 0xffff_ffff) as usize)
}

/// Where an allocator's address lies: its block's offset in the region,
/// and whether the address is a slot of that block (given the block's
/// object size).
pub fn slot_of(
    static_bytes: u64,
    block_bytes: u64,
    offset: u64,
    payload: usize,
) -> Option<(u64, bool)> {
    let rel = offset.checked_sub(static_bytes)?;
    let block = static_bytes + rel / block_bytes * block_bytes;
    let within = offset - block;
    let size = object_bytes(payload) as u64;
    let slots = (block_bytes - LINE as u64) / size;
    let ok = within >= LINE as u64
        && (within - LINE as u64).is_multiple_of(size)
        && (within - LINE as u64) / size < slots;
    Some((block, ok))
}

/// Whether `offset` is a slot of a block formatted for objects of
/// `payload` bytes, `head` reading the header word of the block at a
/// region offset: what a FREE may put back on a free list (an object of a
/// fixed table, one between slots, or one of a block of another size
/// would be handed out again over live objects).
pub fn is_slot_of_size<E>(
    static_bytes: u64,
    block_bytes: u64,
    offset: u64,
    payload: usize,
    head: impl FnOnce(u64) -> Result<u64, E>,
) -> Result<bool, E> {
    if payload == 0 {
        return Ok(false);
    }
    match slot_of(static_bytes, block_bytes, offset, payload) {
        Some((block, true)) => Ok(block_class(head(block)?) == Some(payload)),
        _ => Ok(false),
    }
}

/// One region's slabs at its primary.
#[derive(Default)]
struct Slabs {
    /// Blocks formatted so far, by index (the lowest unformatted one is
    /// formatted next).
    formatted: std::collections::BTreeSet<u64>,
    /// Free slots (region offsets) by object payload size.
    free: BTreeMap<usize, Vec<u64>>,
    /// Slots of blocks whose header line is not yet on every backup: they
    /// are handed out only once it is, so a backup that becomes primary
    /// finds the header of every block that holds an object.
    pending: BTreeMap<u64, (usize, Vec<u64>)>,
}

/// A machine's allocator state, shared by its server threads.
#[derive(Default)]
pub struct Allocator {
    regions: BTreeMap<u32, Slabs>,
    /// Slots reserved for transactions not yet committed or aborted.
    reserved: HashMap<TxId, Vec<(ObjAddr, usize)>>,
    /// Regions this machine became primary of whose free lists are not
    /// yet recovered: no ALLOC is served in them (a fresh block would be
    /// formatted over live objects).
    recovering: std::collections::BTreeSet<u32>,
}

/// The allocator of one machine, for its server threads.
pub type SharedAllocator = Arc<Mutex<Allocator>>;

/// What ALLOC found.
pub enum Reserved {
    /// A slot: its address and its (free) header.
    Slot(ObjAddr, Header),
    /// The region has no room for another object of that size.
    Full,
}

impl Allocator {
    /// Region `region` became this machine's: ALLOC is refused in it (as
    /// full) until its recovered free lists are installed.
    pub fn recovering(&mut self, region: u32) {
        self.recovering.insert(region);
    }

    /// Whether region `region`'s free lists are being recovered here.
    pub fn is_recovering(&self, region: u32) -> bool {
        self.recovering.contains(&region)
    }

    /// Reserves a slot of region `region` (whose primary is this machine,
    /// at local offset `base`; blocks as `geo` lays them out) for an
    /// object of `payload` bytes, formatting a new block if none has one
    /// free. Returns the block formatted, if one was, whose header line
    /// the caller replicates.
    pub fn reserve<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        tx: TxId,
        geo: &crate::layout::Geometry,
        (region, base): (u32, u64),
        payload: usize,
    ) -> Result<(Reserved, Option<u64>), crate::TxError> {
        let (static_bytes, block_bytes, blocks) = (geo.static_bytes, geo.block_bytes, geo.blocks());
        if self.recovering.contains(&region) {
            return Ok((Reserved::Full, None));
        }
        let slabs = self.regions.entry(region).or_default();
        let mut formatted = None;
        if slabs.free.get(&payload).is_none_or(|f| f.is_empty()) {
            let Some(index) = (0..blocks).find(|b| !slabs.formatted.contains(b)) else {
                return Ok((Reserved::Full, None));
            };
            let block = static_bytes + index * block_bytes;
            slabs.formatted.insert(index);
            let size = object_bytes(payload) as u64;
            let slots = (block_bytes - LINE as u64) / size;
            let l = ctx.local();
            let mut obj = vec![0u8; size as usize];
            object::encode(Header::free(0, 0), &vec![0u8; payload], &mut obj)?;
            for k in 0..slots {
                l.write(base + block + LINE as u64 + k * size, &obj)?;
            }
            let mut head = [0u8; LINE];
            head[..8].copy_from_slice(&block_word(payload).to_le_bytes());
            l.write(base + block, &head)?;
            // This transaction takes the block's first slot; the rest wait
            // for the header's replication ([`Allocator::publish`]),
            // popped from the end: in address order.
            let rest = (1..slots).rev().map(|k| block + LINE as u64 + k * size);
            slabs.pending.insert(block, (payload, rest.collect()));
            formatted = Some(block);
        }
        let offset = match formatted {
            Some(block) => block + LINE as u64,
            None => slabs
                .free
                .get_mut(&payload)
                .and_then(Vec::pop)
                .expect("a free slot"),
        };
        let at = ObjAddr { region, offset };
        let h = Header(ctx.local().load(base + offset)?);
        debug_assert!(h.is_free() && !h.locked(), "a free-listed slot is free");
        self.reserved.entry(tx).or_default().push((at, payload));
        Ok((Reserved::Slot(at, h), formatted))
    }

    /// The transaction committed (its slots hold objects now) or aborted
    /// (`release`: its slots go back to their free lists).
    pub fn settle(&mut self, tx: TxId, release: bool) {
        for (at, payload) in self.reserved.remove(&tx).unwrap_or_default() {
            if release {
                self.put_back(at, payload);
            }
        }
    }

    /// Block `block` of `region` has its header line on every backup: its
    /// other slots may be handed out.
    pub fn publish(&mut self, region: u32, block: u64) {
        let slabs = self.regions.entry(region).or_default();
        if let Some((payload, slots)) = slabs.pending.remove(&block) {
            slabs.free.entry(payload).or_default().extend(slots);
        }
    }

    /// A freed object's slot is free again.
    pub fn put_back(&mut self, at: ObjAddr, payload: usize) {
        let slabs = self.regions.entry(at.region).or_default();
        slabs.free.entry(payload).or_default().push(at.offset);
    }
}

/// How fast allocator recovery scans (FaRM §5.5: 100 objects every
/// 100 µs), so that it takes little from the foreground.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Pace {
    pub objects: u64,
    pub pause_ns: u64,
}

impl Default for Pace {
    fn default() -> Self {
        Pace {
            objects: 100,
            pause_ns: 100_000,
        }
    }
}

/// What allocator recovery found in a region.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Blocks formatted (their header lines are replicated), by index.
    pub blocks: Vec<u64>,
    /// Slots scanned.
    pub slots: u64,
    /// Slots holding an object.
    pub allocated: u64,
    /// Free slots by object payload size (region offsets).
    pub free: BTreeMap<usize, Vec<u64>>,
    /// Slots that had never held an object on this replica (an all-zero
    /// header: a backup copies only committed objects, never the
    /// formatting) and were formatted free here.
    pub formatted_here: u64,
}

/// Allocator recovery (FaRM §5.5) of region `region` at this machine,
/// its new primary, whose replica starts at local offset `base`: the free
/// lists lived at the old primary only, so they are rebuilt from the
/// region itself — the replicated block headers say which blocks are
/// formatted and for which size, and each slot's header says whether it
/// holds an object. A slot whose header is all zero never held a
/// committed object (a committed one has a version of at least 1); it is
/// formatted free here, as the old primary had formatted it. The scan
/// pauses `pace.pause_ns` after every `pace.objects` slots. Run it once
/// transactions on the region are settled (recovered ones included): a
/// slot reserved by a transaction still in flight would look free.
pub async fn recover_region<N: Nic>(
    ctx: &Ctx<N>,
    geo: &crate::layout::Geometry,
    base: u64,
    pace: Pace,
) -> Result<Recovered, crate::TxError> {
    let l = ctx.local();
    let mut out = Recovered::default();
    let mut since_pause = 0u64;
    for b in 0..geo.blocks() {
        let block = geo.static_bytes + b * geo.block_bytes;
        // A block without its header here never had a slot handed out
        // (slots wait for the header's replication): it is unformatted.
        let Some(payload) = block_class(l.load(base + block)?) else {
            continue;
        };
        out.blocks.push(b);
        let size = object_bytes(payload) as u64;
        let slots = (geo.block_bytes - LINE as u64) / size;
        let mut obj = vec![0u8; size as usize];
        object::encode(Header::free(0, 0), &vec![0u8; payload], &mut obj)?;
        let mut free = Vec::new();
        for k in 0..slots {
            let off = block + LINE as u64 + k * size;
            let h = l.load(base + off)?;
            out.slots += 1;
            if h == 0 {
                l.write(base + off, &obj)?;
                out.formatted_here += 1;
                free.push(off);
            } else if Header(h).is_free() {
                free.push(off);
            } else {
                out.allocated += 1;
            }
            since_pause += 1;
            if since_pause == pace.objects {
                since_pause = 0;
                ctx.sleep(pace.pause_ns)?.await;
            }
        }
        // Popped from the end: each block's lowest addresses first, as
        // formatting leaves them.
        out.free
            .entry(payload)
            .or_default()
            .extend(free.into_iter().rev());
    }
    Ok(out)
}

impl Allocator {
    /// Installs a region's recovered free lists (it is this machine's now).
    pub fn install(&mut self, region: u32, r: &Recovered) {
        self.recovering.remove(&region);
        self.regions.insert(
            region,
            Slabs {
                formatted: r.blocks.iter().copied().collect(),
                free: r.free.clone(),
                pending: BTreeMap::new(),
            },
        );
    }
}

/// The block header line's copy on every backup of `region`.
pub fn backup_block_headers(
    map: &RegionMap,
    region: u32,
    block: u64,
) -> Result<Vec<GlobalAddr>, crate::TxError> {
    Ok(map.on_backups(
        ObjAddr {
            region,
            offset: block,
        },
        LINE as u64,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fixed tables of 4 KiB, blocks of 4 KiB; the block at 4096 formatted
    /// for 24-byte payloads (one line a slot), the one at 8192 for 100.
    fn head(block: u64) -> Result<u64, ()> {
        Ok(match block {
            4096 => block_word(24),
            8192 => block_word(100),
            _ => 0,
        })
    }

    #[test]
    fn only_a_slot_of_its_size_is_put_back() {
        let ok = |offset, payload| is_slot_of_size(4096, 4096, offset, payload, head).unwrap();
        // Slots of the first block: after its header line, a line each.
        assert!(ok(4096 + 64, 24));
        assert!(ok(4096 + 64 * 63, 24));
        // A fixed table's object, the header line, between slots, past the
        // last slot.
        assert!(!ok(0, 24));
        assert!(!ok(4032, 24));
        assert!(!ok(4096, 24));
        assert!(!ok(4096 + 64 + 8, 24));
        // The block holds 24-byte objects, not 8 (the same slot size) nor
        // 100; the second block holds 100 (two lines a slot, 31 of them).
        assert!(!ok(4096 + 64, 8));
        assert!(!ok(4096 + 64, 100));
        assert!(ok(8192 + 64, 100));
        assert!(ok(8192 + 64 + 128 * 30, 100));
        assert!(!ok(8192 + 64 + 64, 100), "inside a slot");
        assert!(!ok(8192 + 64 + 128 * 31, 100), "past the last slot");
        // An unformatted block, and no payload.
        assert!(!ok(12288 + 64, 24));
        assert!(!ok(4096 + 64, 0));
    }
}
