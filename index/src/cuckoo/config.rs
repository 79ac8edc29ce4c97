//! The table's configuration: sizes fixed at creation (capacity, key and
//! value sizes), and the time bounds the reclamation argument rests on
//! (`mod.rs`, "Reclamation").

use super::layout::{entry_lines, Desc, BUCKET_BYTES, MAX_ENTRY_LINES, MAX_SEGMENTS, SLOTS};
use super::reclaim::{block_bytes, class_of};
use mempool::ChunkConfig;

/// Most doublings a table may go through.
pub const MAX_LEVEL: u32 = 30;

/// Everything that shapes a table and how clients use it. Every compute
/// node of a cluster must use the same layout values (`capacity`,
/// `key_bytes`, `max_value_bytes`, `seed`); [`open`](super::CuckooClient)
/// checks them against the descriptor the creator wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CuckooConfig {
    /// Keys the table is sized for: `ceil(capacity / 8)` buckets of 8 slots,
    /// rounded up to an even count (the alternate-bucket map pairs buckets).
    pub capacity: u64,
    /// Keys the table may grow to. A put that finds no room doubles the
    /// table online (`grow.rs`) while the doubled table's slots stay
    /// within this, and only then answers `TableFull`. Equal to
    /// `capacity` (the default): the table never grows, and clients never
    /// read the descriptor again after their first operation.
    pub max_capacity: u64,
    /// Every key has exactly this many bytes.
    pub key_bytes: usize,
    /// Values have 0..=this many bytes.
    pub max_value_bytes: usize,
    /// Hash seed (part of the layout).
    pub seed: u64,
    /// Buckets a displacement search may read before it gives up with
    /// `TableFull` (breadth first, 16 per round trip).
    pub max_search_buckets: usize,
    /// W, in nanoseconds: the longest an operation may act on what it
    /// read. A get whose entry READ completes later than this after its
    /// bucket READ was posted, or a CAS that would be posted later than
    /// this after the snapshot it rests on, restarts instead.
    pub window_ns: u64,
    /// G, in nanoseconds: how long a freed data entry (and a freed table
    /// word's pointer) waits before reuse. Must exceed `window_ns` by the
    /// longest a verb can be in flight; the check asks for G >= 4 W.
    pub reuse_grace_ns: u64,
    /// R, in nanoseconds: how long a client acts on the descriptor after
    /// it last read the root word (tables that may grow only). A
    /// growing table publishes its phases at least R + G + W apart
    /// (`grow.rs`).
    pub view_lease_ns: u64,
    /// A tentative slot that stays unchanged this many nanoseconds is
    /// taken as left behind by a stopped client and may be cleared by
    /// anyone (only for progress: clearing any tentative slot is always
    /// safe).
    pub stale_ns: u64,
    /// How memory nodes are cut into chunks (the table's segments are one
    /// chunk at most; data entries are bump-allocated in chunks).
    pub chunk: ChunkConfig,
    /// Lines of the compute node's location cache (32 bytes each, a power
    /// of two; 0 turns it off): where a key was last found, so that a get
    /// reads that slot and the entry it named in one round trip
    /// (`mod.rs`, "Cached gets"). A line whose entry lies beside its slot
    /// serves until the slot changes; one whose entry lies apart (its
    /// node was out of memory, or `ordered_reads` is off) serves for
    /// `reuse_grace_ns - window_ns` after the key was last seen there.
    /// Two ways per set. Not part of the layout: compute nodes may
    /// differ.
    pub location_cache_lines: usize,
    /// Whether a queue pair's READs read memory in posting order, so that
    /// a cached get of an entry beside its slot needs no age bound
    /// (`mod.rs`, "Cached gets"). The simulator and emu guarantee it, and
    /// an RC responder executes a QP's requests in order; on hardware
    /// where the NIC's DMA reads of two READs may complete out of order
    /// (PCIe lets one read pass another), set it false: every cached line
    /// then serves for `reuse_grace_ns - window_ns` after its key was
    /// seen, and puts do not move entries beside their slots.
    pub ordered_reads: bool,
}

impl CuckooConfig {
    /// A table for `capacity` keys of `key_bytes` with values up to
    /// `max_value_bytes`, on memory nodes of `node_bytes` host memory (all
    /// sizes in bytes). The rest are defaults: W 2 ms, G 20 ms, `stale_ns`
    /// 5 ms, searches of up to 512 buckets, 1 MiB chunks, a location cache
    /// of 2^16 lines (2 MiB). Nothing is checked here
    /// ([`check`](Self::check) does that).
    pub fn new(
        capacity: u64,
        key_bytes: usize,
        max_value_bytes: usize,
        node_bytes: u64,
    ) -> CuckooConfig {
        CuckooConfig {
            capacity,
            max_capacity: capacity,
            key_bytes,
            max_value_bytes,
            seed: 0x6e65_7373_6965_0001,
            max_search_buckets: 512,
            window_ns: 2_000_000,
            reuse_grace_ns: 20_000_000,
            view_lease_ns: 1_000_000,
            stale_ns: 5_000_000,
            chunk: ChunkConfig {
                chunk_bytes: 1 << 20,
                ..ChunkConfig::new(node_bytes)
            },
            location_cache_lines: 1 << 16,
            ordered_reads: true,
        }
    }

    /// Buckets of the table (even, at least 2).
    pub fn buckets(&self) -> u64 {
        self.capacity
            .div_ceil(SLOTS as u64)
            .max(2)
            .next_multiple_of(2)
    }

    /// Buckets per segment: one chunk's worth at most.
    pub fn segment_buckets(&self) -> u64 {
        (self.chunk.chunk_bytes / BUCKET_BYTES as u64)
            .min(self.buckets())
            .max(1)
    }

    /// Slots of the table as created.
    pub fn slots(&self) -> u64 {
        self.buckets() * SLOTS as u64
    }

    /// Times the table may double: the most whose slots stay within
    /// `max_capacity` (0 when it is `capacity` or less).
    pub fn max_level(&self) -> u32 {
        let mut l = 0;
        while l < MAX_LEVEL
            && (self.buckets() << (l + 1)).saturating_mul(SLOTS as u64) <= self.max_capacity
        {
            l += 1;
        }
        l
    }

    /// How far apart a growing table's phases are published: R + G + W
    /// (`grow.rs`).
    pub fn phase_gap_ns(&self) -> u64 {
        self.view_lease_ns + self.reuse_grace_ns + self.window_ns
    }

    /// Rejects configurations a table cannot run with; each error is one
    /// sentence saying what to change.
    pub fn check(&self) -> Result<(), String> {
        if self.capacity == 0 {
            return Err("capacity must be positive".into());
        }
        if self.capacity > 1 << 40 {
            return Err(format!(
                "capacity {} is above the 2^40 keys a table addresses",
                self.capacity
            ));
        }
        if self.key_bytes == 0 || self.key_bytes > 1024 {
            return Err(format!(
                "key_bytes must be 1..=1024, got {}",
                self.key_bytes
            ));
        }
        if entry_lines(self.key_bytes, self.max_value_bytes) > MAX_ENTRY_LINES {
            return Err(format!(
                "an entry of a {}-byte key and a {}-byte value exceeds {} bytes; \
                 lower max_value_bytes",
                self.key_bytes,
                self.max_value_bytes,
                MAX_ENTRY_LINES * 64
            ));
        }
        if self.max_search_buckets < 2 {
            return Err("max_search_buckets must be at least 2".into());
        }
        if self.window_ns == 0 || self.reuse_grace_ns < 4 * self.window_ns {
            return Err(format!(
                "reuse_grace_ns ({}) must be at least 4 × window_ns ({}), and window_ns positive",
                self.reuse_grace_ns, self.window_ns
            ));
        }
        if self.max_capacity < self.capacity {
            return Err(format!(
                "max_capacity ({}) must be at least capacity ({})",
                self.max_capacity, self.capacity
            ));
        }
        if self.max_capacity > 1 << 40 {
            return Err(format!(
                "max_capacity {} is above the 2^40 keys a table addresses",
                self.max_capacity
            ));
        }
        if self.view_lease_ns == 0 {
            return Err("view_lease_ns must be positive".into());
        }
        if self.stale_ns < self.window_ns {
            return Err("stale_ns must be at least window_ns".into());
        }
        let lines = self.location_cache_lines;
        if lines != 0 && (!lines.is_power_of_two() || lines > 1 << 30) {
            return Err(format!(
                "location_cache_lines must be 0 or a power of two up to 2^30, got {lines}"
            ));
        }
        if self.chunk.chunk_bytes < 4096 {
            return Err("chunks must be at least 4 KiB".into());
        }
        self.chunk.validate().map_err(|e| e.to_string())?;
        // At the largest size it may grow to.
        let segs = (self.buckets() << self.max_level()).div_ceil(self.segment_buckets());
        if segs > MAX_SEGMENTS as u64 || Desc::bytes(segs as usize) as u64 > self.chunk.chunk_bytes
        {
            return Err(format!(
                "the table needs {segs} segments of one chunk each, and a descriptor listing \
                 them must fit one chunk (and at most {MAX_SEGMENTS}); raise chunk.chunk_bytes"
            ));
        }
        let block = block_bytes(class_of(entry_lines(self.key_bytes, self.max_value_bytes)));
        if block > self.chunk.chunk_bytes {
            return Err(format!(
                "the largest entry takes a {block}-byte block, more than a \
                 {}-byte chunk; raise chunk.chunk_bytes",
                self.chunk.chunk_bytes
            ));
        }
        Ok(())
    }
}
