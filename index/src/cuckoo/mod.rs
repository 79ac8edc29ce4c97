//! Nessie: a lock-free cuckoo hash table on disaggregated memory, driven
//! only by one-sided READ, WRITE, CAS and FAA (Szepesi et al., "Designing a
//! low-latency cuckoo hash table for write-intensive workloads using RDMA",
//! 2014). Memory nodes run nothing; a client that stalls or
//! dies at any point blocks no one.
//!
//! Owns the table ([`layout`]: buckets of eight 8-byte slots, out-of-place
//! data entries, the descriptor), where keys go ([`place`]), reading
//! buckets consistently ([`view`]), the operations ([`ops`]), moves and
//! displacement ([`migrate`]), entry reuse ([`reclaim`]) and online
//! growth ([`grow`]).
//!
//! # Promises
//! - `get`, `put` (insert or update) and `delete` are linearizable, per key,
//!   from an empty table on, with any number of clients on any compute
//!   nodes; a value never comes back torn, stale or invented.
//! - A key is never committed in two slots with different values, and an
//!   operation never blocks on another client: everything another client
//!   left half done can be finished or undone by anyone.
//! - A table made with `max_capacity` above `capacity` grows online: a
//!   put that finds no room doubles it while every other client keeps
//!   reading and writing ([`grow`]); gets, updates and deletes never wait
//!   for it, new keys wait while the split walk runs. Otherwise, or at
//!   `max_capacity`, an insert that finds no displacement path within
//!   [`CuckooConfig::max_search_buckets`] fails with
//!   [`CuckooError::TableFull`]; nothing is dropped silently.
//! - Uncontended round trips (asserted by `tests/cuckoo_seq.rs`): get 1
//!   when the compute node's location cache knows where the key was (the
//!   slot and the entry its word named, READ in one doorbell and accepted
//!   only if the slot still holds that word: "Cached gets" below), else
//!   2 (both buckets in one doorbell, then the entry), a miss 2, update 3,
//!   insert 4, delete 3, deleting an absent key 2; one more where a
//!   fingerprint collides. The first operation of a client adds the
//!   descriptor READs (once per compute node) and one FAA.
//! - Bad input (a key of the wrong size, a value over the maximum, a zero
//!   capacity) is an error and writes nothing.
//!
//! # Slots and their states
//! A slot word is Empty (with a tag), Tentative, Normal or Forward, and
//! names a data entry (key, value, checksum) by node, offset and length,
//! with 12 fingerprint bits of the key ([`layout`]). Normal and Forward
//! words are *committed*: they hold the key's value. Tentative words are
//! invisible to readers: a slot claimed but not yet agreed on.
//!
//! # Unique words
//! A word stored in a slot does not come back to it within the grace
//! period G: an entry is written out of place for each put and each move,
//! so every non-empty word names an entry incarnation that was fresh when
//! it was stored (an entry block is reused only G after the CAS that
//! unlinked it, below — after that the same key may bring the same word
//! back to the same slot), and every empty word carries a tag no other
//! emptying ever used (the client's incarnation, taken with one FAA on the
//! descriptor, and a counter). Every use below spans less than G (the
//! window W, G ≥ 4 W). Two consequences carry the protocol: a CAS cannot succeed on a word that
//! changed and changed back (no ABA), and two READs of a slot that return
//! the same word prove the slot held it in between — which turns a double
//! collect of a key's two buckets into an atomic snapshot ([`view`]).
//!
//! # The invariant
//! At every instant, all committed words of a key name entries with the
//! same key and value, and there are at most two of them, only while a move
//! is in flight (a Forward word and the Normal word it moved to). Every
//! change is one CAS, made on what a snapshot showed:
//! - **get**: READ both buckets (one doorbell), READ the entries of the
//!   committed words whose fingerprint matches (one doorbell), return the
//!   first that holds the key: that slot held the key's value when it was
//!   read. If none does, a second collect identical to the first proves the
//!   key absent at one instant in between (a single collect could miss a
//!   key that moved between the two buckets while they were read).
//! - **update / delete**: on a snapshot with exactly one committed copy,
//!   Normal at X, and no Forward word with the key's fingerprint, CAS X
//!   from that word to the new entry's Normal word (or to Empty). Between
//!   the snapshot and the CAS no second copy can appear: an insert needs a
//!   snapshot without a committed copy, and a move starts with a CAS on X.
//!   An update whose CAS fails because another put of the key committed a
//!   different value in between (the word the CAS returns names an entry
//!   of the key with another checksum) is *eliminated*: linearized just
//!   before that put, its value overwritten before anyone could read it,
//!   it returns without retrying. A CAS lost to a move (same value, new
//!   word) or to a delete retries. Without this, a hot key's updaters
//!   starve each other (YCSB-A at zipf 0.99 on sim: 2.4 Mops with a p99 of
//!   550 µs, 9.4 Mops and 13 µs with it; `tests/cuckoo_throughput.rs`).
//! - **insert**: CAS an Empty slot X to Tentative(new), then take a
//!   snapshot. If it shows a committed copy, undo X and update that copy
//!   instead. If it shows other Tentative copies of the key, the one
//!   earliest in the key's canonical slot order (b1's slots, then b2's)
//!   wins: we clear later ones and withdraw before earlier ones (an earlier
//!   one left unchanged for `stale_ns` is taken as abandoned and cleared).
//!   With the snapshot clean, CAS X from Tentative to Normal. **No
//!   duplicates**: if two inserts of a key both committed, each one's last
//!   snapshot was taken after its own Tentative word was stored and before
//!   it committed, and showed no other; the later snapshot would have seen
//!   the earlier insert's word, Tentative or committed (words never
//!   recur, so it cannot have left and come back) — a contradiction.
//! - **move** (Nessie's migration, [`migrate`]): to move Normal(w) from S
//!   to an Empty slot D in the key's other bucket, on a snapshot with no
//!   Forward word of its fingerprint: write a copy x of the entry and CAS D
//!   to Tentative(x); CAS S from Normal(w) to Forward(x) — the commit; CAS
//!   D to Normal(x); CAS S to Empty. A failed CAS before the commit aborts
//!   (clearing D); the Forward word holds the same value as w, so readers
//!   never see a gap, and until D turns Normal there is one committed copy.
//! - **resolving a Forward word** F(x) at S (anyone, before acting on a
//!   key whose fingerprint it carries; the copy lies in the other bucket of
//!   the same pair): if the snapshot shows Tentative(x), CAS it to Normal
//!   and then clear S; if Normal(x), clear S; if no word names x (someone
//!   cleared the tentative copy), CAS S back to Normal(x). Clearing any
//!   Tentative word is therefore always safe — at worst a move is undone in
//!   place — which is what lets a stopped client's leftovers be cleaned.
//!
//! # Reclamation
//! Data entries are reused after a **grace period** (with a version check
//! on every READ as a second line). A client acts only on words read
//! within the **window** W: a get whose entry READ completes more than W
//! after its bucket READ was posted, or a CAS about to be posted more than
//! W after the snapshot it rests on, restarts instead. Times come from the
//! executor's turn clock, read at the start of each turn just before it
//! polls completions: a start time is read before the READ is posted, a
//! completion polled in a turn arrived before that turn's reading, and a
//! CAS posted in a turn leaves within one (bounded) turn of it. An entry is
//! unlinked by the CAS that removed the last word naming it (an update or
//! delete of a clean snapshot, a move's commit); that client retires it
//! and reuses it no sooner than G ≥ 4 W after the CAS completed ([`reclaim`]).
//! Anyone who read a word naming the entry read it before the unlink, and
//! its last use (an entry READ, a comparison, a CAS) comes within W plus
//! the verb's flight time after — before G has run out, as long as no verb
//! stays in flight longer than G − W (the RC transport's retry timeout
//! bounds it; FaRM's leases rest on the same bounded-delay assumption),
//! no core is held off its turn for that long between reading the clock
//! and posting (run-to-completion cores, pinned), and clocks
//! run at the same rate (no synchronisation is needed). So no client
//! ever follows a pointer into a reused entry, and slot words stay unique.
//! The checksum and key check on every entry READ back this up: an entry
//! that does not verify is never returned, the operation retries. Entries
//! of a crashed client's free lists leak; nothing unsafe follows.
//!
//! When fresh memory runs out, what is left is what clients hold back:
//! a client putting faster than G returns its entries keeps up to G's
//! worth retired, and on a node filled to its last chunk that churn, not
//! the records, is what runs out. So from the first time a client of a
//! table handle finds fresh memory out, the handle's clients retire into
//! one shared pool (the handle's *spares*; a dropped client's lists go
//! there too, and the unused rest of its chunks), any of them reuses a
//! ready spare of the entry's class or a larger one, or carves a block
//! from such a rest, and a put with none ready waits for the first to become
//! ready (at most G; it fails only after four G without one). It waits
//! before its snapshot, so the window is untouched; a move, which
//! allocates after its snapshot, does not wait. The same time rule holds
//! for a spare: its ready time was taken on the retiring client's clock,
//! which on one compute node is the same clock as every other client's.
//!
//! Entries unlinked on one compute node may be needed on another (one
//! node's clients delete what another's put): a put that finds fresh
//! memory out and nothing of its own borrows from a pool on each memory
//! node before it waits (and looks at them again every G / 4 while it
//! waits), telling lenders it wants blocks when it finds none; while
//! some put wants them, a client's lists, or its handle's spares,
//! holding more ready blocks than they keep lend the surplus to the pool
//! of the blocks' memory node. A lent block is past its grace period, so
//! it is reusable at once on any compute node ([`lend`]). A compute node
//! leaving the table lends all its handle holds, wanted or not
//! ([`CuckooClient::lend_all`]); a handle dropped without it takes its
//! blocks with it.
//!
//! # Cached gets
//! Each compute node remembers where it last found a key: the slot and
//! the word it held ([`CuckooClient`]'s location cache). A cached get
//! READs that slot and the entry the word names in one doorbell and
//! returns the entry's value if the slot still holds the word, the entry
//! holds the key (checksum and key check) and the doorbell completed
//! within W of being posted (start t0, end t1). Why that value is the
//! key's at the instant ts at which the slot was read:
//! - At ts the slot held the committed word w, so by the invariant the
//!   key's value then is the value of the entry incarnation I that w
//!   names at ts — whichever incarnation that is (w may have left and
//!   come back since it was cached, naming a reused block: it does not
//!   matter). I was whole before w was stored (an entry is written a
//!   round trip before the CAS that commits a word naming it, or just
//!   before that CAS on the same queue pair).
//! - I is unlinked at some tu ≥ ts, so its block is reused no sooner than
//!   tu + G ≥ ts + G. The entry READ executes at te ≤ t1 ≤ t0 + W <
//!   ts + G. If also te ≥ ts, the READ returns I.
//! - te ≥ ts holds when the entry lies on the slot's memory node: the
//!   two READs then go on one queue pair, which executes them in order
//!   (the verbs contract, which the simulator and emu keep; an RC
//!   responder executes a QP's requests in order, but whether a NIC's DMA
//!   reads for two READs of host memory can complete out of order — PCIe
//!   lets one read pass another — is not settled here: on such hardware,
//!   set `CuckooConfig::ordered_reads` false). So puts place entries
//!   beside the slots that name them: a put allocates its entry where the
//!   key was last seen, else beside its first bucket, and an insert or
//!   update whose slot turns out to lie elsewhere copies the entry to the
//!   slot's node, written just before its CAS on the slot's queue pair (so
//!   it has landed when the CAS makes it visible); a move writes its copy
//!   beside the destination; free lists and the allocator are per node
//!   (`reclaim`, `RemoteAllocator::alloc_on`).
//! - An entry apart from its slot (its node had no memory left, or a
//!   Forward word names the copy beside the other slot, or a resolve
//!   moved a copy back) has no such order: the two READs may execute the
//!   other way round, and the entry READ could meet a block reused after
//!   an unlink before ts. For those, the cache line serves only while the
//!   key was seen at the slot less than G − W before: then I was linked at
//!   that sighting ts0, its block is not reused before ts0 + G > t1, and
//!   the slot holding w at ts names that same incarnation.

pub mod config;
pub mod grow;
pub mod layout;
pub mod lend;
pub mod migrate;
pub mod ops;
pub mod place;
pub mod reclaim;
pub mod view;

pub use config::CuckooConfig;

use layout::{Desc, EntryRef, Slot, State, BUCKET_BYTES, SLOTS};
use mempool::layout::HASH_ROOT_OFF;
use mempool::{AllocError, RemoteAllocator};
use nicdrv::{Ctx, GlobalAddr, Nic, NodeId, VerbError};
use reclaim::{block_bytes, class_of, Reclaim, MAX_INCARNATION};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use view::Known;

/// The well-known word on memory node 0 that points to the descriptor.
pub const ROOT_WORD: GlobalAddr = GlobalAddr::host(0, HASH_ROOT_OFF);

/// Attempts of one operation before reporting a livelock.
const MAX_ATTEMPTS: u32 = 1_000_000;

/// How long, in grace periods G, one allocation waits for retired entries
/// to come out of theirs once fresh memory is out, before the put fails.
/// Every entry retired when the wait began is ready within one G; a
/// client that keeps losing the ready ones to other clients for four is
/// out of memory in all but name.
const OUT_OF_MEMORY_GRACES: u64 = 4;

/// Why a table operation failed. Expected failures are values.
#[derive(Debug)]
pub enum CuckooError {
    /// A verb failed (a memory node died, …); the operation's effect is
    /// unknown.
    Verb(VerbError),
    /// No memory for an entry or the table.
    Alloc(AllocError),
    /// The key does not have the table's key size.
    KeySize {
        /// The table's key size, in bytes.
        expected: usize,
        /// The key's size, in bytes.
        got: usize,
    },
    /// The value is longer than the table's maximum.
    ValueTooLarge {
        /// The table's largest value, in bytes.
        max: usize,
        /// The value's size, in bytes.
        got: usize,
    },
    /// No slot for a new key within the displacement search bound.
    TableFull,
    /// No table at the root word: call `create` first.
    NotCreated,
    /// Bad configuration, or one that disagrees with the table's; the
    /// reason in words.
    Config(String),
    /// Something the protocol never writes was read.
    Corrupt {
        /// What was read, in words.
        what: &'static str,
    },
    /// An operation retried `MAX_ATTEMPTS` times without finishing.
    Contention,
    /// The test hook stopped this client (see `stop_after_cas`).
    Stopped,
}

impl fmt::Display for CuckooError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CuckooError::Verb(e) => write!(f, "cuckoo verb failed: {e}"),
            CuckooError::Alloc(e) => write!(f, "cuckoo allocation failed: {e}"),
            CuckooError::KeySize { expected, got } => {
                write!(f, "key of {got} bytes; this table's keys have {expected}")
            }
            CuckooError::ValueTooLarge { max, got } => {
                write!(
                    f,
                    "value of {got} bytes; this table's values have at most {max}"
                )
            }
            CuckooError::TableFull => write!(
                f,
                "the table is full: no displacement path within the search bound"
            ),
            CuckooError::NotCreated => write!(f, "no cuckoo table exists yet (create it first)"),
            CuckooError::Config(s) => write!(f, "invalid cuckoo configuration: {s}"),
            CuckooError::Corrupt { what } => write!(f, "cuckoo table corrupt: {what}"),
            CuckooError::Contention => {
                write!(f, "operation gave up after {MAX_ATTEMPTS} attempts")
            }
            CuckooError::Stopped => write!(f, "client stopped by its test hook"),
        }
    }
}

impl std::error::Error for CuckooError {}

impl From<VerbError> for CuckooError {
    fn from(e: VerbError) -> Self {
        CuckooError::Verb(e)
    }
}

impl From<AllocError> for CuckooError {
    fn from(e: AllocError) -> Self {
        match e {
            AllocError::Verb(v) => CuckooError::Verb(v),
            other => CuckooError::Alloc(other),
        }
    }
}

/// Longest displacement path the histogram tells apart (longer ones count
/// in the last bucket).
pub const PATH_HIST: usize = 8;

/// What one client counted (exact; benchmarks report them per operation).
/// Every field but `max_path_len` is a count of events since the client was
/// made or the caller last reset [`CuckooClient::stats`]. A get, put or
/// delete counts once, whether it succeeded or not, when its key and value
/// sizes were valid and the client could open the table; its round trips
/// leave out the first operation's descriptor READs and FAA.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CuckooStats {
    /// Gets run.
    pub gets: u64,
    /// Puts run.
    pub puts: u64,
    /// Deletes run.
    pub deletes: u64,
    /// Round trips (batches waited on) spent in gets, summed.
    pub get_round_trips: u64,
    /// Round trips (batches waited on) spent in puts, summed.
    pub put_round_trips: u64,
    /// Round trips (batches waited on) spent in deletes, summed.
    pub delete_round_trips: u64,
    /// Puts that inserted a new key.
    pub inserts: u64,
    /// Puts that replaced the value of a present key with their own CAS
    /// (eliminated updates count in `eliminated`).
    pub updates: u64,
    /// Operation attempts started over (any cause below).
    pub retries: u64,
    /// Collects that differed from the one before (snapshot not yet taken).
    pub snapshot_retries: u64,
    /// CASes that found another word than expected.
    pub cas_failures: u64,
    /// Attempts restarted because the window W ran out.
    pub window_restarts: u64,
    /// Entry READs of committed words that did not verify.
    pub torn_entries: u64,
    /// Entry READs of a fingerprint match holding another key.
    pub fp_false_matches: u64,
    /// Forward words resolved (someone's move finished or undone).
    pub helps: u64,
    /// Tentative words of others cleared.
    pub kills: u64,
    /// Updates that lost their CAS to another put of the key, linearized
    /// just before it instead of retrying (`ops.rs`, `eliminated`).
    pub eliminated: u64,
    /// Inserts that withdrew before an earlier tentative copy.
    pub yields: u64,
    /// Inserts that found the key committed after claiming a slot (an
    /// insert or a move of it raced theirs) and withdrew to update it.
    pub withdrawals: u64,
    /// Displacement paths carried out to the end.
    pub displacements: u64,
    /// Entries moved to their other bucket.
    pub moves: u64,
    /// Moves abandoned because the table changed under them.
    pub aborted_moves: u64,
    /// Completed displacement paths by length: element `i` counts paths of
    /// `i` moves, the last element paths of `PATH_HIST - 1` moves or more.
    pub path_len_hist: [u64; PATH_HIST],
    /// Moves in the longest completed displacement path (adding two stats
    /// keeps the larger).
    pub max_path_len: u64,
    /// Buckets read by displacement searches.
    pub search_buckets: u64,
    /// Puts that failed with [`CuckooError::TableFull`].
    pub table_full: u64,
    /// Growth phases this client published (`grow.rs`: a start, Placing,
    /// or the end of a doubling).
    pub growth_steps: u64,
    /// Buckets this client's split walks passed.
    pub walked_buckets: u64,
    /// Inserts that waited for a growth to end (`grow.rs`).
    pub insert_waits: u64,
    /// Split walks this client did whole because claimed groups stayed
    /// undone (their walker stopped, or was slow).
    pub walk_takeovers: u64,
    /// Updates that found their key's word where the split walk had yet
    /// to move it from, and moved it up themselves first (`grow.rs`).
    pub update_moves: u64,
    /// Entry blocks taken from the remote allocator.
    pub entries_allocated: u64,
    /// Entry blocks reused: retired ones after the grace period G, or ones
    /// no slot ever named.
    pub entries_reused: u64,
    /// Entries a put wrote apart from the slot it came to name and copied
    /// beside it in the CAS's doorbell ("Cached gets").
    pub entries_moved: u64,
    /// Times a put found fresh memory out and no retired block ready, and
    /// waited for the next one, its own or a spare, or for one lent
    /// (`alloc_entry`).
    pub entry_waits: u64,
    /// Ready blocks this client lent to a memory node's pool, beyond what
    /// it keeps (`lend.rs`).
    pub entries_lent: u64,
    /// Blocks a put took from a memory node's pool, fresh memory being out
    /// (`lend.rs`).
    pub entries_borrowed: u64,
    /// Lends and borrows cut short by a verb that failed or a pool word
    /// that named no block (`lend.rs`, "Faults").
    pub pool_faults: u64,
    /// Lends whose head CAS found another head (another lend or a borrow
    /// took the pool meanwhile) and tried again (`lend.rs`, `push_chain`).
    pub lend_cas_lost: u64,
    /// Borrows whose head CAS found another head and tried again from it
    /// (`lend.rs`, `pop`).
    pub borrow_cas_lost: u64,
    /// Lends whose head CAS failed with a verb error (its answer lost)
    /// and whose next READ of the head showed it had taken (the chain
    /// lent), and those it showed had not (the lend went on) (`lend.rs`,
    /// "Faults").
    pub lends_settled_taken: u64,
    pub lends_settled_not_taken: u64,
    /// Blocks lost to a lend or borrow whose CAS's outcome stayed unknown
    /// (in a pool, maybe, or taken by nobody; `lend.rs`, "Faults").
    pub entries_leaked: u64,
    /// Gets that tried the location cache (one round trip: the cached
    /// slot and the entry its word named), and those it answered; the
    /// rest went on the two-round-trip way.
    pub cached_gets: u64,
    pub cache_hits: u64,
}

impl std::ops::AddAssign for CuckooStats {
    fn add_assign(&mut self, o: Self) {
        self.gets += o.gets;
        self.puts += o.puts;
        self.deletes += o.deletes;
        self.get_round_trips += o.get_round_trips;
        self.put_round_trips += o.put_round_trips;
        self.delete_round_trips += o.delete_round_trips;
        self.inserts += o.inserts;
        self.updates += o.updates;
        self.retries += o.retries;
        self.snapshot_retries += o.snapshot_retries;
        self.cas_failures += o.cas_failures;
        self.window_restarts += o.window_restarts;
        self.torn_entries += o.torn_entries;
        self.fp_false_matches += o.fp_false_matches;
        self.helps += o.helps;
        self.kills += o.kills;
        self.eliminated += o.eliminated;
        self.yields += o.yields;
        self.withdrawals += o.withdrawals;
        self.displacements += o.displacements;
        self.moves += o.moves;
        self.aborted_moves += o.aborted_moves;
        for (a, b) in self.path_len_hist.iter_mut().zip(o.path_len_hist) {
            *a += b;
        }
        self.max_path_len = self.max_path_len.max(o.max_path_len);
        self.search_buckets += o.search_buckets;
        self.table_full += o.table_full;
        self.growth_steps += o.growth_steps;
        self.walked_buckets += o.walked_buckets;
        self.insert_waits += o.insert_waits;
        self.walk_takeovers += o.walk_takeovers;
        self.update_moves += o.update_moves;
        self.entries_allocated += o.entries_allocated;
        self.entries_reused += o.entries_reused;
        self.entries_moved += o.entries_moved;
        self.entry_waits += o.entry_waits;
        self.entries_lent += o.entries_lent;
        self.entries_borrowed += o.entries_borrowed;
        self.pool_faults += o.pool_faults;
        self.lend_cas_lost += o.lend_cas_lost;
        self.borrow_cas_lost += o.borrow_cas_lost;
        self.lends_settled_taken += o.lends_settled_taken;
        self.lends_settled_not_taken += o.lends_settled_not_taken;
        self.entries_leaked += o.entries_leaked;
        self.cached_gets += o.cached_gets;
        self.cache_hits += o.cache_hits;
    }
}

/// A table's size and growth as one client last confirmed them
/// ([`CuckooClient::shape`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct TableShape {
    /// Times the table has doubled.
    pub level: u32,
    pub phase: layout::Phase,
    /// Slots of the level new keys go to.
    pub slots: u64,
}

/// How full the table is, counted by reading every bucket.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Occupancy {
    /// Slots holding a committed word (a key in mid-move counts twice).
    pub committed: u64,
    /// Slots holding a Tentative word: an insert or a move in progress, or
    /// one left by a stopped client.
    pub tentative: u64,
    /// Slots in the table (8 per bucket).
    pub slots: u64,
}

impl Occupancy {
    /// Committed slots over all slots.
    pub fn load_factor(&self) -> f64 {
        self.committed as f64 / self.slots.max(1) as f64
    }
}

/// A table as one compute node sees it: the configuration and, once read,
/// the descriptor; shared by the node's threads.
pub struct Cuckoo {
    cfg: CuckooConfig,
    /// The newest descriptor a client of this node has read (replaced
    /// only as the table grows).
    desc: Mutex<Option<Arc<Desc>>>,
    /// The location cache: per line, the slot word a key was last found
    /// committed in, its position among the key's 16 slots with a tag of
    /// the key's hash, and when ([`Cuckoo::place_of`]).
    places: Box<[AtomicU64]>,
    /// Retired entries any client of this handle may reuse: those retired
    /// once memory is tight, and the lists of clients dropped, with the
    /// unused rest of their chunks ([`CuckooClient::retire`],
    /// `alloc_entry`).
    spare: Mutex<Reclaim>,
    /// Set, never cleared, once a client of this handle found fresh memory
    /// out: from then on its clients retire into `spare`, so an entry one
    /// client unlinks can serve another's put instead of waiting in the
    /// first one's lists.
    tight: AtomicBool,
}

/// Seed of the location cache's hash of a key (apart from the table's).
const PLACE_SEED: u64 = 0x706c_6163_6573_0001;
/// Words of a location cache line: a version (odd while written), the
/// tag and position, the slot word, and when it was seen.
const PLACE_WORDS: usize = 4;
/// Lines a key may occupy (the cache's associativity).
const PLACE_WAYS: usize = 2;

/// What the location cache says of a key ([`Cuckoo::place_of`]).
#[derive(Copy, Clone, Debug)]
struct Place {
    /// Position among the key's 16 slots.
    pos: usize,
    /// The committed word the slot held.
    word: u64,
    /// This node's clock at or before the instant the slot held it.
    seen_ns: u64,
}
/// A location cache line's second word: valid, position in its low bits,
/// the key hash's high half above them.
const PLACE_VALID: u64 = 1 << 5;
const PLACE_POS: u64 = PLACE_VALID - 1;

impl Cuckoo {
    /// The compute node's handle on the table `cfg` describes. Reads and
    /// writes nothing; a client reads the descriptor on its first
    /// operation. Fails with [`CuckooError::Config`] when `cfg.check()`
    /// rejects `cfg`.
    pub fn new(cfg: CuckooConfig) -> Result<Arc<Cuckoo>, CuckooError> {
        cfg.check().map_err(CuckooError::Config)?;
        let places = (0..PLACE_WORDS * cfg.location_cache_lines)
            .map(|_| AtomicU64::new(0))
            .collect();
        Ok(Arc::new(Cuckoo {
            spare: Mutex::new(Reclaim::new(cfg.reuse_grace_ns)),
            tight: AtomicBool::new(false),
            cfg,
            desc: Mutex::new(None),
            places,
        }))
    }

    /// The handle's spare entries. A poisoned lock means another client
    /// panicked mid-push; the lists are whole either way (each push is one
    /// `VecDeque` call).
    fn spares(&self) -> std::sync::MutexGuard<'_, Reclaim> {
        self.spare.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lines `key` may occupy in the location cache (the first word
    /// of each) and its tag, if there is a cache. Two ways per set, so a
    /// hot key is not pushed out by a cold one that hashes alike: with
    /// one line per key, YCSB-C at zipf 0.99 over a million keys answered
    /// 85.7% of gets in one round trip with 2 Mi lines, 95.0% with 32 Mi.
    fn place_lines(&self, key: &[u8]) -> Option<([usize; PLACE_WAYS], usize, u64)> {
        let lines = self.places.len() / PLACE_WORDS;
        if lines == 0 {
            return None;
        }
        let ways = lines.min(PLACE_WAYS);
        let h = layout::hash64(key, PLACE_SEED);
        // lines is a power of two, so sets are too.
        let set = (h as usize) & (lines / ways - 1);
        let mut at = [0; PLACE_WAYS];
        for (w, a) in at.iter_mut().enumerate().take(ways) {
            *a = PLACE_WORDS * (set * ways + w);
        }
        Some((at, ways, (h >> 32) << 6))
    }

    /// One line's fields (meta, word, seen) read whole, or `None` while a
    /// writer is in it.
    fn read_place(&self, i: usize) -> Option<(u64, u64, u64)> {
        let l = &self.places[i..i + PLACE_WORDS];
        // A seqlock: the line's fields are read between two equal, even
        // loads of its version. Acquire on the first load orders the
        // field loads after it; the fence orders them before the second
        // load, so equal versions mean no store to the line came between
        // (a writer makes the version odd first, with a Release store
        // after its fields).
        let v = l[0].load(Ordering::Acquire);
        if v & 1 == 1 {
            return None;
        }
        let fields = (
            l[1].load(Ordering::Relaxed),
            l[2].load(Ordering::Relaxed),
            l[3].load(Ordering::Relaxed),
        );
        std::sync::atomic::fence(Ordering::Acquire);
        (l[0].load(Ordering::Relaxed) == v).then_some(fields)
    }

    /// Where `key` was found: its position among its 16 slots, the
    /// committed word that slot held, and a time (this node's clock) no
    /// later than when it held it. A hint only: a cached get accepts it
    /// only once the slot is read holding that very word ("Cached gets"
    /// above).
    fn place_of(&self, key: &[u8]) -> Option<Place> {
        let (at, ways, tag) = self.place_lines(key)?;
        at[..ways].iter().find_map(|&i| {
            let (meta, word, t0) = self.read_place(i)?;
            (meta & !PLACE_POS == tag | PLACE_VALID).then_some(Place {
                pos: (meta & PLACE_POS) as usize,
                word,
                seen_ns: t0,
            })
        })
    }

    /// Notes that `key` was found committed as `word` at position `pos`,
    /// by a verb posted at `seen_ns` (or later): in the way that holds the
    /// key, else an empty one, else the one seen longest ago. Skipped
    /// while another client writes the line.
    fn put_place(&self, key: &[u8], pos: usize, word: u64, seen_ns: u64) {
        let Some((at, ways, tag)) = self.place_lines(key) else {
            return;
        };
        // Relaxed: choosing the line is a guess; the seqlock below makes
        // the write itself whole.
        let meta = |i: usize| self.places[i + 1].load(Ordering::Relaxed);
        let seen = |i: usize| self.places[i + 3].load(Ordering::Relaxed);
        let at = &at[..ways];
        let i = at
            .iter()
            .copied()
            .find(|&i| meta(i) & !PLACE_POS == tag | PLACE_VALID)
            .or_else(|| at.iter().copied().find(|&i| meta(i) & PLACE_VALID == 0))
            .unwrap_or_else(|| at.iter().copied().min_by_key(|&i| seen(i)).expect("a way"));
        self.write_place(
            i,
            |_| true,
            |l| {
                l[1].store(tag | PLACE_VALID | pos as u64, Ordering::Relaxed);
                l[2].store(word, Ordering::Relaxed);
                l[3].store(seen_ns, Ordering::Relaxed);
            },
        );
    }

    /// Forgets where `key` was (the lines that hold it).
    fn forget_place(&self, key: &[u8]) {
        let Some((at, ways, tag)) = self.place_lines(key) else {
            return;
        };
        for &i in &at[..ways] {
            self.write_place(
                i,
                |meta| meta & !PLACE_POS == tag | PLACE_VALID,
                |l| l[1].store(0, Ordering::Relaxed),
            );
        }
    }

    /// Stores into line `i` with `write`, under the line's seqlock; skipped
    /// while another client writes the line, or when `holds` turns the
    /// line's meta word down.
    fn write_place(&self, i: usize, holds: impl Fn(u64) -> bool, write: impl FnOnce(&[AtomicU64])) {
        let l = &self.places[i..i + PLACE_WORDS];
        let v = l[0].load(Ordering::Relaxed);
        // The writer's half of the seqlock (Boehm, "Can seqlocks get along
        // with programming language memory models?", 2012): the version
        // turns odd, then a Release fence, then the fields. A reader that
        // loads any field stored here synchronizes, through its Acquire
        // fence, with this fence, so its second version load sees the odd
        // version or a later one. Relaxed on the meta load: a guess the
        // CAS on the version then settles.
        if v & 1 == 1
            || !holds(l[1].load(Ordering::Relaxed))
            || l[0]
                .compare_exchange(v, v + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        std::sync::atomic::fence(Ordering::Release);
        write(l);
        // Release: the fields are visible before the even version is.
        l[0].store(v + 2, Ordering::Release);
    }

    /// The configuration this handle was made with.
    pub fn config(&self) -> &CuckooConfig {
        &self.cfg
    }

    /// A client for one task (clients take their identity from the table
    /// on first use, so none is asked for here). Reads and writes nothing.
    /// Fails with `Alloc` only for an invalid chunk configuration, which
    /// [`Cuckoo::new`] already rejects.
    pub fn client(self: &Arc<Cuckoo>) -> Result<CuckooClient, CuckooError> {
        Ok(CuckooClient {
            table: self.clone(),
            alloc: RemoteAllocator::new(self.cfg.chunk.clone())?,
            reclaim: Reclaim::new(self.cfg.reuse_grace_ns),
            desc: None,
            view_ns: 0,
            grow_seen: None,
            walk_begun: None,
            known: Known::default(),
            ebuf: Vec::new(),
            stale: Vec::new(),
            lend_check_ns: 0,
            wanted: Default::default(),
            stop_after_cas: None,
            stopped: false,
            hold: None,
            stats: CuckooStats::default(),
        })
    }
}

/// One task's handle on a table. Operations take `&mut self`: one at a
/// time per client.
///
/// # Example
///
/// One task on an embedded emu cluster (two memory nodes in this process)
/// creates a table, puts a key and gets it back:
///
/// ```rust
/// use cluster::{EmuCluster, EmuClusterConfig};
/// use index::cuckoo::{Cuckoo, CuckooConfig};
/// use nicdrv::ExecutorConfig;
///
/// let memory = EmuClusterConfig::default();
/// let cluster = EmuCluster::boot(&memory).unwrap();
/// // Room for 1 000 keys of 8 bytes, values up to 16 bytes.
/// let table = Cuckoo::new(CuckooConfig::new(1_000, 8, 16, memory.host_bytes)).unwrap();
/// let mut executor = cluster.executor(ExecutorConfig::default()).unwrap();
/// executor
///     .spawn(move |ctx| async move {
///         let mut h = table.client().unwrap();
///         h.create(&ctx).await.unwrap();
///         h.put(&ctx, b"AAPL.bid", b"189.25").await.unwrap();
///         let bid = h.get(&ctx, b"AAPL.bid").await.unwrap();
///         assert_eq!(bid.as_deref(), Some(&b"189.25"[..]));
///         assert_eq!(h.get(&ctx, b"MSFT.bid").await.unwrap(), None);
///     })
///     .unwrap();
/// executor.run(); // until every task has finished
/// ```
pub struct CuckooClient {
    table: Arc<Cuckoo>,
    alloc: RemoteAllocator,
    reclaim: Reclaim,
    desc: Option<Arc<Desc>>,
    /// When the root word was last read naming `desc`: the turn clock at
    /// its posting (a table that may grow acts on `desc` for at most R +
    /// W after it, `grow.rs`).
    view_ns: u64,
    /// The growing descriptor's generation and when this client first
    /// knew it (after the READ that showed it completed).
    grow_seen: Option<(u64, u64)>,
    /// The generation of the Placing descriptor whose split walk this
    /// client has seen begun (`grow.rs`, `move_up_to_update`).
    walk_begun: Option<u64>,
    /// Entry verdicts of the current operation ([`view::Known`]).
    known: Known,
    /// The entry being written, encoded.
    ebuf: Vec<u8>,
    /// Tentative words of others and when this client first saw each.
    stale: Vec<(u64, u64)>,
    /// When this client next looks for a surplus to lend (`lend.rs`).
    lend_check_ns: u64,
    /// Whether puts elsewhere want blocks lent (`lend.rs`).
    wanted: lend::Wanted,
    stop_after_cas: Option<u32>,
    stopped: bool,
    hold: Option<Arc<AtomicBool>>,
    /// What this client counted; callers read it and may reset it.
    pub stats: CuckooStats,
}

/// A client's retired entries outlive it: the handle's other clients may
/// reuse them (they were unlinked, and each keeps its own time), and so
/// may they the unused rest of its chunks, as blocks no one ever saw.
impl Drop for CuckooClient {
    fn drop(&mut self) {
        // One stopped by its test hook stands for one that crashed: its
        // chunks' rest is lost with it.
        if !self.stopped {
            let rests = self.take_chunk_rests();
            self.reclaim.add_rests(rests);
        }
        self.table.spares().absorb(&mut self.reclaim);
    }
}

impl CuckooClient {
    /// The table this client works on.
    pub fn table(&self) -> &Arc<Cuckoo> {
        &self.table
    }

    fn cfg(&self) -> &CuckooConfig {
        &self.table.cfg
    }

    /// Test hook: the client stops dead right after its `n`-th CAS from
    /// now on completes (as if its compute node had crashed there): that
    /// operation and every later one return [`CuckooError::Stopped`], and
    /// nothing is cleaned up.
    #[doc(hidden)]
    pub fn stop_after_cas(&mut self, n: u32) {
        self.stop_after_cas = Some(n.max(1));
    }

    /// Test hook: before posting each CAS the client yields until `gate`
    /// is true, so a test can hold an operation between its snapshot and
    /// its CAS while others run. Keep holds short of the window W (the CAS
    /// is then still posted within it).
    #[doc(hidden)]
    pub fn hold_before_cas(&mut self, gate: Arc<AtomicBool>) {
        self.hold = Some(gate);
    }

    /// The table as this client last confirmed it (`None` before its first
    /// operation): how often it has doubled, where it stands in growing,
    /// and the slots new keys go to.
    pub fn shape(&self) -> Option<TableShape> {
        self.desc.as_ref().map(|d| TableShape {
            level: d.level,
            phase: d.phase,
            slots: d.place_buckets() * SLOTS as u64,
        })
    }

    /// Entry blocks this client holds for reuse: retired ones, waiting out
    /// the grace period G or past it, and ones given back unused.
    pub fn entries_waiting(&self) -> usize {
        self.reclaim.waiting()
    }

    /// Creates the table — every segment, the descriptor, then the root
    /// word by CAS — unless one exists. Idempotent; racing creators agree
    /// on the first (the others' memory is left unused). An existing table
    /// is not checked against this client's configuration here; the first
    /// operation does that. Fails with `Alloc` when the memory nodes lack
    /// room for the table, `Verb` when a verb fails.
    pub async fn create<N: Nic>(&mut self, ctx: &Ctx<N>) -> Result<(), CuckooError> {
        if ctx.read(ROOT_WORD, 8).await?.u64_at(0) != 0 {
            return Ok(());
        }
        let cfg = self.table.cfg.clone();
        let (buckets, per) = (cfg.buckets(), cfg.segment_buckets());
        let mut segs = Vec::new();
        let mut b = 0;
        while b < buckets {
            // A table that may grow gets whole segments: the buckets it
            // grows into continue the last one (`Desc::bucket_addr`).
            let n = if cfg.max_level() > 0 {
                per
            } else {
                per.min(buckets - b)
            };
            // Fresh chunks are zero (memory nodes zero their memory at boot
            // and the allocator never hands memory out twice), and a zero
            // word is an Empty slot with tag 0: the table starts empty
            // without a byte written.
            segs.push(
                self.alloc
                    .alloc(ctx, n * BUCKET_BYTES as u64, BUCKET_BYTES as u64)
                    .await?,
            );
            b += n;
        }
        let at = self
            .alloc
            .alloc(ctx, Desc::bytes(segs.len()) as u64, 64)
            .await?;
        let desc = Desc {
            at,
            buckets,
            seg_buckets: per,
            key_bytes: cfg.key_bytes,
            max_value_bytes: cfg.max_value_bytes,
            seed: cfg.seed,
            segs,
            base_buckets: buckets,
            level: 0,
            phase: layout::Phase::Stable,
            incarnation_at: at.add(layout::DESC_INCARNATION_OFF),
            generation: 0,
            max_level: cfg.max_level(),
            walk_at: None,
        };
        let bytes = desc.encode();
        for (i, part) in bytes.chunks(4096).enumerate() {
            ctx.write(at.add(i as u64 * 4096), part).await?;
        }
        // The descriptor is complete before the root names it (the WRITEs
        // completed above). Lost the race: the other creator's table
        // stands.
        let _ = ctx.cas(ROOT_WORD, 0, at.raw()).await?;
        Ok(())
    }

    /// Reads the descriptor (once per compute node) and takes this
    /// client's incarnation (once per client). Two round trips plus one
    /// FAA on the first operation; none after, except that a table that
    /// may grow has its root word read again once the view is older than
    /// R (`CuckooConfig::view_lease_ns`), and a new descriptor read when
    /// the root names one.
    async fn open<N: Nic>(&mut self, ctx: &Ctx<N>) -> Result<Arc<Desc>, CuckooError> {
        if self.stopped {
            return Err(CuckooError::Stopped);
        }
        if let Some(d) = &self.desc {
            if !self.view_old(ctx) {
                return Ok(d.clone());
            }
            return self.refresh(ctx).await;
        }
        let t = ctx.now_ns();
        let shared = self.table.desc.lock().expect("descriptor lock").clone();
        let desc = match shared {
            Some(d) if d.max_level == 0 => d,
            _ => {
                let root = ctx.read(ROOT_WORD, 8).await?.u64_at(0);
                if root == 0 {
                    return Err(CuckooError::NotCreated);
                }
                self.adopt(ctx, root, false).await?
            }
        };
        // Saturating: a word past the bound (corrupt, or worn out) is
        // refused below, not wrapped to a small incarnation.
        let inc = ctx.faa(desc.incarnation_word(), 1).await?.saturating_add(1);
        if inc > MAX_INCARNATION {
            return Err(CuckooError::Config(format!(
                "more than {MAX_INCARNATION} clients have used this table; recreate it"
            )));
        }
        self.reclaim.set_incarnation(inc);
        self.desc = Some(desc.clone());
        self.view_ns = t;
        Ok(desc)
    }

    /// Whether the view is past R + W: nothing may be done on it
    /// (`in_window` refuses it) until it is confirmed.
    pub(super) fn view_lapsed<N: Nic>(&self, ctx: &Ctx<N>) -> bool {
        self.view_older_than(ctx, self.cfg().view_lease_ns + self.cfg().window_ns)
    }

    /// Whether the view is past R and must be confirmed before acting.
    pub(super) fn view_old<N: Nic>(&self, ctx: &Ctx<N>) -> bool {
        self.view_older_than(ctx, self.cfg().view_lease_ns)
    }

    /// Whether the table may grow and the root READ that confirmed the
    /// view was posted more than `ns` ago.
    fn view_older_than<N: Nic>(&self, ctx: &Ctx<N>, ns: u64) -> bool {
        self.desc.as_ref().is_some_and(|d| d.max_level > 0)
            && ctx.now_ns().saturating_sub(self.view_ns) > ns
    }

    /// Reads the root word; adopts the descriptor it names if it is new.
    pub(super) async fn refresh<N: Nic>(&mut self, ctx: &Ctx<N>) -> Result<Arc<Desc>, CuckooError> {
        let t = ctx.now_ns();
        let root = ctx.read(ROOT_WORD, 8).await?.u64_at(0);
        let cur = self.desc.clone().ok_or(CuckooError::NotCreated)?;
        let desc = if root == cur.at.raw() {
            cur
        } else {
            let d = self.adopt(ctx, root, true).await?;
            if d.generation <= cur.generation {
                return Err(CuckooError::Corrupt {
                    what: "the root word went back to an older descriptor",
                });
            }
            d
        };
        self.desc = Some(desc.clone());
        self.view_ns = t;
        Ok(desc)
    }

    /// The descriptor at `root`: the compute node's copy when it is that
    /// one (and `shared` allows it), else read (two READs), checked
    /// against this client's configuration, and kept for the node if it
    /// is newer. A first open does not look again after its root READ,
    /// as before tables could grow: its verbs, and so the simulator's
    /// traces of tables that do not grow, stay as they were.
    async fn adopt<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        root: u64,
        shared: bool,
    ) -> Result<Arc<Desc>, CuckooError> {
        if shared {
            if let Some(d) = self.table.desc.lock().expect("descriptor lock").as_ref() {
                if d.at.raw() == root {
                    return Ok(d.clone());
                }
            }
        }
        let at = GlobalAddr::from_raw(root);
        let head = ctx.read(at, 64).await?;
        let n = Desc::segments_in(head.as_slice()).ok_or(CuckooError::Corrupt {
            what: "the root word names no descriptor",
        })?;
        drop(head);
        let all = ctx.read(at, Desc::bytes(n)).await?;
        let d = Desc::decode(at, all.as_slice()).map_err(|what| CuckooError::Corrupt { what })?;
        let cfg = &self.table.cfg;
        if d.base_buckets != cfg.buckets()
            || d.key_bytes != cfg.key_bytes
            || d.max_value_bytes != cfg.max_value_bytes
            || d.seed != cfg.seed
            || d.max_level != cfg.max_level()
        {
            return Err(CuckooError::Config(format!(
                "the table was created with {} buckets, {}-byte keys, values up to {} \
                 bytes, seed {:#x} and up to {} doublings; this client is configured for \
                 {}, {}, {}, {:#x} and {}",
                d.base_buckets,
                d.key_bytes,
                d.max_value_bytes,
                d.seed,
                d.max_level,
                cfg.buckets(),
                cfg.key_bytes,
                cfg.max_value_bytes,
                cfg.seed,
                cfg.max_level()
            )));
        }
        if d.growing() {
            // Known from now on (the READ showing it has completed).
            self.grow_seen = Some((d.generation, ctx.now_ns()));
        }
        let d = Arc::new(d);
        let mut node = self.table.desc.lock().expect("descriptor lock");
        match node.as_ref() {
            // Another client of the node got there first: share its copy.
            Some(n) if n.generation == d.generation => return Ok(n.clone()),
            Some(n) if n.generation > d.generation => {}
            _ => *node = Some(d.clone()),
        }
        Ok(d)
    }

    /// Checks a key's size.
    fn check_key(&self, key: &[u8]) -> Result<(), CuckooError> {
        let expected = self.cfg().key_bytes;
        if key.len() != expected {
            return Err(CuckooError::KeySize {
                expected,
                got: key.len(),
            });
        }
        Ok(())
    }

    /// An empty word with a fresh tag.
    fn empty_word(&mut self) -> Result<Slot, CuckooError> {
        self.reclaim
            .next_tag()
            .map(Slot::empty)
            .ok_or(CuckooError::Config(
                "this client emptied 2^42 slots; make a new client".into(),
            ))
    }

    /// One CAS; whether it succeeded. Counts toward the test hook.
    async fn cas<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        at: GlobalAddr,
        old: Slot,
        new: Slot,
    ) -> Result<bool, CuckooError> {
        Ok(self.cas_word(ctx, at, old, new).await? == old)
    }

    /// One CAS; the word the slot held (equal to `old` on success).
    async fn cas_word<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        at: GlobalAddr,
        old: Slot,
        new: Slot,
    ) -> Result<Slot, CuckooError> {
        self.cas_word_after(ctx, None, at, old, new).await
    }

    /// [`Self::cas_word`], with a WRITE of `pre` (address, bytes) posted
    /// just before the CAS in its doorbell: on the slot's node, so on its
    /// queue pair, where the WRITE lands before the CAS executes.
    async fn cas_word_after<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        pre: Option<(GlobalAddr, &[u8])>,
        at: GlobalAddr,
        old: Slot,
        new: Slot,
    ) -> Result<Slot, CuckooError> {
        if let Some(gate) = &self.hold {
            // Acquire pairs with the test's Release store; nothing but the
            // test's own sequencing rides on it.
            while !gate.load(Ordering::Acquire) {
                ctx.yield_now().await;
            }
        }
        debug_assert!(pre.is_none_or(|(a, _)| a.node() == at.node()));
        let got = {
            let mut b = ctx.batch();
            if let Some((a, bytes)) = pre {
                b.write_bytes(a, bytes);
            }
            let op = b.cas(at, old.0, new.0);
            Slot(b.submit().await?.old(op))
        };
        self.after_cas()?;
        if got != old {
            self.stats.cas_failures += 1;
        }
        Ok(got)
    }

    /// Called after every batch holding a CAS completes: the test hook's
    /// countdown.
    pub(super) fn after_cas(&mut self) -> Result<(), CuckooError> {
        if let Some(n) = self.stop_after_cas.as_mut() {
            *n -= 1;
            if *n == 0 {
                self.stopped = true;
                return Err(CuckooError::Stopped);
            }
        }
        Ok(())
    }

    /// Whether an action resting on a read posted at `t0` is still inside
    /// the window W; counts a restart if not.
    fn in_window<N: Nic>(&mut self, ctx: &Ctx<N>, t0: u64) -> bool {
        // On a table that may grow, also within R + W of the root READ
        // that confirmed the descriptor (`grow.rs`).
        let ok = ctx.now_ns().saturating_sub(t0) <= self.cfg().window_ns && !self.view_lapsed(ctx);
        if !ok {
            self.stats.window_restarts += 1;
        }
        ok
    }

    /// A block for an entry of `lines` lines on memory node `node` (the
    /// node of the slot that is to name it: "Cached gets" above): a
    /// retired one of that node past its grace period, else fresh memory,
    /// of that node while it has any, else a ready block of any node and
    /// of the entry's class or a larger one, its own, a spare or one
    /// another compute node lent (`lend.rs`).
    ///
    /// Out of all of those, a put (`wait`) waits for the first retired
    /// block that fits, its own, one of the handle's spares or one lent,
    /// to turn up (its own within G) rather than failing: a client
    /// updating faster than G returns its entries holds up to G's worth of
    /// them, and on a node filled to its last chunk that churn, not the
    /// records, is what runs out. Only when four G pass without a block
    /// that fits is the put out of memory. A put waits before
    /// its first snapshot (or between attempts), so no snapshot ages while
    /// it waits; moves, which allocate after theirs, do not wait.
    async fn alloc_entry<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        lines: u32,
        node: NodeId,
        wait: bool,
    ) -> Result<EntryRef, CuckooError> {
        let c = class_of(lines);
        self.reclaim.note_taken(c);
        let addr = match self.reclaim.take(c, node, ctx.now_ns()) {
            Some(a) => {
                self.stats.entries_reused += 1;
                a
            }
            None => match self.alloc.alloc_on(ctx, node, block_bytes(c), 64).await {
                Ok(a) => {
                    self.stats.entries_allocated += 1;
                    a
                }
                Err(e) => self.reuse_when_out(ctx, c, wait, e).await?,
            },
        };
        EntryRef::new(addr, lines).ok_or_else(|| {
            CuckooError::Config(format!(
                "entry memory at {addr} cannot be named by a slot word \
                 (memory nodes 0..=255, 2 TiB each)"
            ))
        })
    }

    /// When the first block of class `c` or larger that this client or
    /// its handle's spares hold becomes ready; `None` when they hold none.
    fn earliest_ready(&self, c: usize) -> Option<u64> {
        let mine = self.reclaim.earliest_at_least(c);
        mine.into_iter()
            .chain(self.table.spares().earliest_at_least(c))
            .min()
    }

    /// The unused rest of every chunk this client's allocator carved, in
    /// whole lines (the smallest block), handed over once.
    fn take_chunk_rests(&mut self) -> Vec<(GlobalAddr, u64)> {
        self.alloc.take_rests(block_bytes(0))
    }

    /// A retired block of class `c` or larger, on any node, once fresh
    /// memory is out (`e` says how): a ready one of this client's or of
    /// the handle's spares, or one carved from the unused rest of a
    /// dropped client's chunk, else, when `wait` (a put before its snapshot,
    /// not a move), one lent by another compute node (`lend.rs`), else the
    /// first of these to turn up: it
    /// sleeps until the first of its own or the spares becomes ready, or
    /// for G / 4 to look at the pools again, whichever is sooner
    /// (`alloc_entry`). Other clients may take a block first; after
    /// [`OUT_OF_MEMORY_GRACES`] grace periods of waiting the put fails
    /// with `e`.
    async fn reuse_when_out<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        c: usize,
        wait: bool,
        e: AllocError,
    ) -> Result<GlobalAddr, CuckooError> {
        // Relaxed: a hint to retire into `spare`; the pool itself is
        // ordered by its lock, and a client that misses the hint for a
        // while only keeps its entries a little longer.
        self.table.tight.store(true, Ordering::Relaxed);
        let grace = self.cfg().reuse_grace_ns;
        let give_up = ctx
            .now_ns()
            .saturating_add(OUT_OF_MEMORY_GRACES.saturating_mul(grace));
        loop {
            let now = ctx.now_ns();
            let got = self.reclaim.take_at_least(c, now);
            if let Some(a) = got.or_else(|| self.table.spares().take_at_least(c, now)) {
                self.stats.entries_reused += 1;
                return Ok(a);
            }
            // The unused rest of a dropped client's chunk: fresh memory.
            if let Some(a) = self.table.spares().carve(c) {
                self.stats.entries_allocated += 1;
                return Ok(a);
            }
            // A move (not `wait`) allocates after its snapshot: it neither
            // spends round trips on the pools nor tells lenders it wants
            // (a put that moves its entry beside its slot already has one).
            if !wait {
                return Err(e.into());
            }
            if let Some(a) = self.borrow(ctx, c).await {
                return Ok(a);
            }
            self.want(ctx).await;
            let now = ctx.now_ns();
            let look_again = now.saturating_add(grace / 4);
            let next = self
                .earliest_ready(c)
                .map_or(look_again, |t| t.min(look_again));
            if next > give_up {
                return Err(e.into());
            }
            self.stats.entry_waits += 1;
            ctx.sleep_until(next.max(now))
                .map_err(|t| CuckooError::Config(format!("waiting for a retired entry: {t}")))?
                .await;
        }
    }

    /// Retires an entry this client just unlinked: into its own lists, or,
    /// once memory is tight, into the handle's spares.
    fn retire<N: Nic>(&mut self, ctx: &Ctx<N>, e: EntryRef) {
        let (a, c, now) = (e.addr(), class_of(e.lines()), ctx.now_ns());
        // Relaxed: see `reuse_when_out`.
        if self.table.tight.load(Ordering::Relaxed) {
            self.table.spares().retire(a, c, now);
        } else {
            self.reclaim.retire(a, c, now);
        }
    }

    /// Gives back an entry no slot ever named.
    fn give_back(&mut self, e: EntryRef) {
        self.reclaim.give_back(e.addr(), class_of(e.lines()));
    }

    /// Whether the Tentative word `w` has been seen unchanged for
    /// `stale_ns` (first sightings are remembered, a bounded few).
    fn is_stale(&mut self, w: Slot, now_ns: u64) -> bool {
        if let Some(&(_, first)) = self.stale.iter().find(|s| s.0 == w.0) {
            return now_ns.saturating_sub(first) >= self.cfg().stale_ns;
        }
        if self.stale.len() >= 64 {
            self.stale.remove(0);
        }
        self.stale.push((w.0, now_ns));
        false
    }

    /// Counts committed and tentative slots by reading the whole table
    /// (for reports and tests, not the data path); not a snapshot while
    /// others write. Fails with [`CuckooError::NotCreated`] before the
    /// table exists, `Config` when it disagrees with this client's
    /// configuration, `Corrupt` for an unreadable descriptor, `Verb` when
    /// a verb fails.
    pub async fn occupancy<N: Nic>(&mut self, ctx: &Ctx<N>) -> Result<Occupancy, CuckooError> {
        let desc = self.open(ctx).await?;
        let mut occ = Occupancy {
            slots: desc.buckets * SLOTS as u64,
            ..Occupancy::default()
        };
        const PER_READ: u64 = 64;
        let mut b = 0;
        while b < desc.buckets {
            // A READ never crosses a segment.
            let n = PER_READ
                .min(desc.buckets - b)
                .min(desc.seg_buckets - b % desc.seg_buckets);
            let buf = ctx
                .read(desc.bucket_addr(b), (n as usize) * BUCKET_BYTES)
                .await?;
            for i in 0..(n as usize * SLOTS) {
                match Slot(buf.u64_at(i * 8)).state() {
                    State::Normal | State::Forward => occ.committed += 1,
                    State::Tentative => occ.tentative += 1,
                    State::Empty => {}
                }
            }
            b += n;
        }
        Ok(occ)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(lines: usize) -> Arc<Cuckoo> {
        let mut cfg = CuckooConfig::new(64, 8, 8, 1 << 20);
        cfg.location_cache_lines = lines;
        Cuckoo::new(cfg).unwrap()
    }

    /// Keys whose lines fall in the same set of a cache of `lines`.
    fn same_set(t: &Cuckoo, n: usize) -> Vec<[u8; 8]> {
        let first = t.place_lines(&0u64.to_le_bytes()).unwrap().0;
        (0u64..)
            .map(|k| k.to_le_bytes())
            .filter(|k| t.place_lines(k).unwrap().0 == first)
            .take(n)
            .collect()
    }

    #[test]
    fn a_set_keeps_two_keys_and_evicts_the_one_seen_longest_ago() {
        let t = table(8);
        let k = same_set(&t, 3);
        t.put_place(&k[0], 1, 100, 10);
        t.put_place(&k[1], 2, 200, 20);
        assert_eq!(t.place_of(&k[0]).map(|p| p.word), Some(100));
        assert_eq!(t.place_of(&k[1]).map(|p| (p.pos, p.word)), Some((2, 200)));
        // k0 seen again (a hit renews its time): k1 is now the older.
        t.put_place(&k[0], 1, 100, 30);
        t.put_place(&k[2], 3, 300, 40);
        assert_eq!(t.place_of(&k[0]).map(|p| p.seen_ns), Some(30));
        assert!(t.place_of(&k[1]).is_none(), "the older way was kept");
        assert_eq!(t.place_of(&k[2]).map(|p| p.word), Some(300));
        // A key's line is rewritten in place, never doubled.
        t.put_place(&k[2], 4, 400, 50);
        assert_eq!(t.place_of(&k[0]).map(|p| p.word), Some(100));
        assert_eq!(t.place_of(&k[2]).map(|p| (p.pos, p.word)), Some((4, 400)));
        t.forget_place(&k[2]);
        assert!(t.place_of(&k[2]).is_none());
        assert_eq!(t.place_of(&k[0]).map(|p| p.word), Some(100));
    }

    #[test]
    fn one_line_and_no_lines_work() {
        let t = table(1);
        let (a, b) = (1u64.to_le_bytes(), 2u64.to_le_bytes());
        t.put_place(&a, 0, 7, 1);
        assert_eq!(t.place_of(&a).map(|p| p.word), Some(7));
        t.put_place(&b, 0, 8, 2);
        assert!(t.place_of(&a).is_none());
        assert_eq!(t.place_of(&b).map(|p| p.word), Some(8));
        let t = table(0);
        t.put_place(&a, 0, 7, 1);
        assert!(t.place_of(&a).is_none());
    }
}
