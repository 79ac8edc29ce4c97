//! The memory-node superblock: well-known words at fixed host offsets.
//!
//! Owns the map of the first [`SUPERBLOCK_BYTES`] of every memory node's
//! host memory. Promises: nothing is ever allocated there, so offset 0 of
//! node 0 — [`GlobalAddr::NULL`](nicdrv::GlobalAddr::NULL) — never names an
//! allocation; each well-known word is 8-byte aligned and sits alone in its
//! 64-byte line (NIC atomics on one word do not contend with reads of a
//! neighbour); chunks begin at [`first_chunk_off`].
//!
//! The memory node zeroes its host memory at boot (emu nodes are fresh
//! memfds or files, `HugeMem` is zeroed), so every word starts at 0.
//!
//! ```text
//! offset  word
//! 0       NULL_WORD_OFF     never written (`loch demo --processes` reads
//!                           it to check that): a verb through a null
//!                           address touches nothing anyone uses
//! 64      CHUNK_CURSOR_OFF  chunk cursor (FAA by compute threads, chunk.rs)
//! 128     TREE_ROOT_OFF     reserved: B+tree root word, node 0 only (index::tree)
//! 192     HASH_ROOT_OFF     reserved: cuckoo table descriptor word (index::cuckoo)
//! 256     TXN_ROOT_OFF      reserved: FaRM allocator/region word (txn)
//! 320     HASH_LEND_OFF     reserved: the cuckoo table's lending pool, one
//!                           word a line for each of HASH_LEND_WORDS block
//!                           classes (index::cuckoo::lend), on every node
//! 832     HASH_WANT_OFF     reserved: the cuckoo table's want count, node 0
//!                           only (index::cuckoo::lend)
//! 896     VERB_COUNTER_OFF  reserved: the shared FAA counter of the
//!                           appliance's verb workloads, on every node
//! 960..   unassigned        add new words here, one 64-byte line each
//! 4096    first chunk
//! ```

/// Bytes reserved at the start of each memory node's host memory.
pub const SUPERBLOCK_BYTES: u64 = 4096;

/// Offset 0: deliberately unused (never written), so that the null
/// address is never a live word.
pub const NULL_WORD_OFF: u64 = 0;

/// The chunk cursor: the index of the next chunk the node will hand out,
/// advanced by one one-sided FAA per chunk ([`crate::chunk`]).
pub const CHUNK_CURSOR_OFF: u64 = 64;

/// Reserved for `index::tree`: on node 0, the word that holds the B+tree's
/// root address and level, replaced by CAS. Unused here.
pub const TREE_ROOT_OFF: u64 = 128;

/// Reserved for `index::cuckoo`: a descriptor word for the Nessie table.
/// Unused here.
pub const HASH_ROOT_OFF: u64 = 192;

/// Reserved for `txn`: a root word for FaRM's regions and allocator. Unused
/// here.
pub const TXN_ROOT_OFF: u64 = 256;

/// Reserved for `index::cuckoo`: on every memory node, the heads of the
/// cuckoo table's pool of free entry blocks of that node, one word per
/// block class, [`HASH_LEND_WORDS`] lines from here. Unused here.
pub const HASH_LEND_OFF: u64 = 320;

/// Words (one a line) from [`HASH_LEND_OFF`].
pub const HASH_LEND_WORDS: u64 = 8;

/// Reserved for `index::cuckoo`: on node 0, a count that puts out of
/// memory add to, telling clients with blocks to spare to lend them.
/// Unused here.
pub const HASH_WANT_OFF: u64 = HASH_LEND_OFF + 64 * HASH_LEND_WORDS;

/// Reserved for the appliance's verb workloads (`loch demo`, `loch node`):
/// on every memory node, the counter every compute task FAAs and the
/// launcher checks against the FAAs issued. Unused here.
pub const VERB_COUNTER_OFF: u64 = HASH_WANT_OFF + 64;

/// Chunks start on this boundary, and allocations may ask for at most this
/// alignment.
///
/// Chunks are deliberately not aligned to their own size: with Sherman's
/// 32 MiB chunks that would leave 32 MiB minus the superblock unused on
/// every node (and most of a small test node). Page alignment gives
/// allocations any alignment up to 4 KiB, which covers B+tree nodes (64 B),
/// cachelines and pages.
pub const CHUNK_ALIGN: u64 = 4096;

/// Host offset of chunk 0 on every node: the superblock rounded up to
/// [`CHUNK_ALIGN`].
pub const fn first_chunk_off() -> u64 {
    SUPERBLOCK_BYTES.next_multiple_of(CHUNK_ALIGN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_aligned_alone_and_inside_the_superblock() {
        let mut words = vec![
            NULL_WORD_OFF,
            CHUNK_CURSOR_OFF,
            TREE_ROOT_OFF,
            HASH_ROOT_OFF,
            TXN_ROOT_OFF,
        ];
        words.extend((0..HASH_LEND_WORDS).map(|c| HASH_LEND_OFF + 64 * c));
        words.push(HASH_WANT_OFF);
        words.push(VERB_COUNTER_OFF);
        for (i, &w) in words.iter().enumerate() {
            assert_eq!(w % 64, 0, "word {w} not on its own line");
            assert!(w + 8 <= SUPERBLOCK_BYTES);
            for &v in &words[i + 1..] {
                assert_ne!(w / 64, v / 64, "words {w} and {v} share a line");
            }
        }
        assert!(first_chunk_off() >= SUPERBLOCK_BYTES);
        assert_eq!(first_chunk_off() % CHUNK_ALIGN, 0);
    }
}
