//! The byte layout of a tree node: 1 KiB, sixteen 64-byte lines.
//!
//! ```text
//! line 0 (header)  [0] line version  [1] level  [2] flags  [3] count
//!                  [8..16] low fence (inclusive)   [16..24] high fence (exclusive)
//!                  [24..32] sibling address        [32..40] leftmost child (internal)
//!                  [40..48] lock word (when locks live in host memory)
//!                  [48] front version (paper scheme)
//! lines 1..15      [0] line version, then three 18-byte entries at 1, 19, 37:
//!                  entry [0] flags (bit 0 occupied, high nibble front entry
//!                  version)  [1..9] key  [9..17] value or child  [17] rear entry
//!                  version (paper scheme)
//! line 15          [63] rear version (paper scheme)
//! ```
//!
//! Every line starts with the node's version byte. A whole-node write bumps
//! it in every line; a single-entry write (17 bytes: flags, key, value)
//! touches one line and leaves it. Since each 64-byte line lands atomically,
//! a reader that sees the same version byte in all sixteen lines has a node
//! whose lines all come from the same whole-node write, with entry writes
//! applied or not line by line — each a state the node really had for that
//! entry. Entries never straddle lines. 45 entries per node (Sherman packs
//! 54 leaf / 61 internal entries into 1 KiB with 4-bit entry versions; we
//! spend the difference on a version byte per line, which is what makes the
//! check sound under out-of-order line writes).
//!
//! The paper's scheme (an ablation) reads only the front/rear node versions
//! and each entry's front/rear nibbles; it is fooled when the first and
//! last lines of a whole-node write land before a middle one.

use nicdrv::GlobalAddr;

pub const NODE_BYTES: usize = 1024;
pub const LINE_BYTES: usize = 64;
pub const LINES: usize = NODE_BYTES / LINE_BYTES;
pub const ENTRY_BYTES: usize = 18;
/// Bytes of an entry written back by an in-place insert, update or delete
/// under line versions: flags, key, value.
pub const ENTRY_WRITE_BYTES: usize = 17;
pub const ENTRIES_PER_LINE: usize = 3;
/// Entries per node, leaf or internal.
pub const FANOUT: usize = (LINES - 1) * ENTRIES_PER_LINE;

pub const OFF_LEVEL: usize = 1;
pub const OFF_FLAGS: usize = 2;
pub const OFF_COUNT: usize = 3;
pub const OFF_LOW: usize = 8;
pub const OFF_HIGH: usize = 16;
pub const OFF_SIBLING: usize = 24;
pub const OFF_LEFTMOST: usize = 32;
/// The node's own lock word, used when locks live in host memory (FG+).
pub const OFF_LOCK: usize = 40;
pub const OFF_FRONT: usize = 48;
pub const OFF_REAR: usize = NODE_BYTES - 1;

pub const FLAG_NODE_VALID: u8 = 1;
pub const ENTRY_OCCUPIED: u8 = 1;

/// Keys are `u64` below this value, which stands for +∞ as a high fence.
pub const KEY_INFINITY: u64 = u64::MAX;

/// Byte offset of entry slot `i` in the node.
pub const fn entry_off(i: usize) -> usize {
    (1 + i / ENTRIES_PER_LINE) * LINE_BYTES + 1 + (i % ENTRIES_PER_LINE) * ENTRY_BYTES
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// A typed view of a node's bytes (a local copy).
pub struct Node<'a>(pub &'a [u8]);
/// A mutable typed view of a node's bytes (a local copy).
pub struct NodeMut<'a>(pub &'a mut [u8]);

impl Node<'_> {
    pub fn level(&self) -> u8 {
        self.0[OFF_LEVEL]
    }
    pub fn is_leaf(&self) -> bool {
        self.level() == 0
    }
    pub fn is_valid(&self) -> bool {
        self.0[OFF_FLAGS] & FLAG_NODE_VALID != 0
    }
    pub fn count(&self) -> usize {
        self.0[OFF_COUNT] as usize
    }
    pub fn low(&self) -> u64 {
        u64_at(self.0, OFF_LOW)
    }
    pub fn high(&self) -> u64 {
        u64_at(self.0, OFF_HIGH)
    }
    pub fn sibling(&self) -> GlobalAddr {
        GlobalAddr::from_raw(u64_at(self.0, OFF_SIBLING))
    }
    pub fn leftmost(&self) -> GlobalAddr {
        GlobalAddr::from_raw(u64_at(self.0, OFF_LEFTMOST))
    }
    pub fn covers(&self, key: u64) -> bool {
        key >= self.low() && key < self.high()
    }
    pub fn version(&self) -> u8 {
        self.0[0]
    }
    /// All sixteen line versions agree.
    pub fn lines_agree(&self) -> bool {
        let v = self.0[0];
        (1..LINES).all(|l| self.0[l * LINE_BYTES] == v)
    }
    /// The paper's check: front == rear node version and, for each entry,
    /// front nibble == rear nibble.
    pub fn front_rear_agree(&self) -> bool {
        self.0[OFF_FRONT] == self.0[OFF_REAR]
            && (0..FANOUT).all(|i| {
                let o = entry_off(i);
                self.0[o] >> 4 == self.0[o + ENTRY_BYTES - 1] & 0x0f
            })
    }
    pub fn occupied(&self, i: usize) -> bool {
        self.0[entry_off(i)] & ENTRY_OCCUPIED != 0
    }
    pub fn key(&self, i: usize) -> u64 {
        u64_at(self.0, entry_off(i) + 1)
    }
    pub fn value(&self, i: usize) -> u64 {
        u64_at(self.0, entry_off(i) + 9)
    }
    /// Leaf: the slot holding `key`.
    pub fn find(&self, key: u64) -> Option<usize> {
        // Line by line, the line's entries at fixed offsets: the same
        // order as `(0..FANOUT).find(..)` with `entry_off`, without its
        // division and bounds check per entry (a lookup's scan took
        // about 700 instructions that way).
        let lines = self.0[LINE_BYTES..NODE_BYTES].chunks_exact(LINE_BYTES);
        for (l, line) in lines.enumerate() {
            let line: &[u8; LINE_BYTES] = line.try_into().expect("a whole line");
            for j in 0..ENTRIES_PER_LINE {
                let o = 1 + j * ENTRY_BYTES;
                let k = u64::from_le_bytes(line[o + 1..o + 9].try_into().expect("8 bytes"));
                if line[o] & ENTRY_OCCUPIED != 0 && k == key {
                    return Some(l * ENTRIES_PER_LINE + j);
                }
            }
        }
        None
    }
    /// Leaf: a free slot.
    pub fn free_slot(&self) -> Option<usize> {
        (0..FANOUT).find(|&i| !self.occupied(i))
    }
    /// Leaf: occupied entries (unsorted).
    pub fn entries(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        (0..FANOUT)
            .filter(|&i| self.occupied(i))
            .map(|i| (self.key(i), self.value(i)))
    }
    /// Internal: the child covering `key` (entries sorted in slots
    /// 0..count; child i holds keys >= key i).
    pub fn child_for(&self, key: u64) -> GlobalAddr {
        let n = self.count().min(FANOUT);
        let mut child = self.leftmost();
        for i in 0..n {
            if self.key(i) <= key {
                child = GlobalAddr::from_raw(self.value(i));
            } else {
                break;
            }
        }
        child
    }
    /// Internal: (separator, child) pairs in order, leftmost first with
    /// the node's low fence as its separator.
    pub fn children(&self) -> Vec<(u64, GlobalAddr)> {
        let n = self.count().min(FANOUT);
        let mut v = Vec::with_capacity(n + 1);
        v.push((self.low(), self.leftmost()));
        for i in 0..n {
            v.push((self.key(i), GlobalAddr::from_raw(self.value(i))));
        }
        v
    }
}

impl NodeMut<'_> {
    pub fn view(&self) -> Node<'_> {
        Node(self.0)
    }
    /// Formats an empty node.
    pub fn init(&mut self, level: u8, low: u64, high: u64, sibling: GlobalAddr, version: u8) {
        self.0.fill(0);
        self.0[OFF_LEVEL] = level;
        self.0[OFF_FLAGS] = FLAG_NODE_VALID;
        put_u64(self.0, OFF_LOW, low);
        put_u64(self.0, OFF_HIGH, high);
        put_u64(self.0, OFF_SIBLING, sibling.raw());
        self.set_version(version);
    }
    /// Sets the version byte of every line, and the paper's front and rear
    /// versions.
    pub fn set_version(&mut self, v: u8) {
        for l in 0..LINES {
            self.0[l * LINE_BYTES] = v;
        }
        self.0[OFF_FRONT] = v;
        self.0[OFF_REAR] = v;
    }
    pub fn set_high(&mut self, high: u64) {
        put_u64(self.0, OFF_HIGH, high);
    }
    pub fn set_sibling(&mut self, s: GlobalAddr) {
        put_u64(self.0, OFF_SIBLING, s.raw());
    }
    pub fn set_leftmost(&mut self, c: GlobalAddr) {
        put_u64(self.0, OFF_LEFTMOST, c.raw());
    }
    pub fn set_count(&mut self, n: usize) {
        self.0[OFF_COUNT] = n as u8;
    }
    pub fn set_lock_word(&mut self, v: u64) {
        put_u64(self.0, OFF_LOCK, v);
    }
    /// Writes slot `i` and bumps its entry version nibbles.
    pub fn set_entry(&mut self, i: usize, key: u64, value: u64) {
        let o = entry_off(i);
        let ev = ((self.0[o] >> 4).wrapping_add(1)) & 0x0f;
        self.0[o] = (ev << 4) | ENTRY_OCCUPIED;
        put_u64(self.0, o + 1, key);
        put_u64(self.0, o + 9, value);
        self.0[o + ENTRY_BYTES - 1] = ev;
    }
    /// Frees slot `i` (bumping its entry version).
    pub fn clear_entry(&mut self, i: usize) {
        let o = entry_off(i);
        let ev = ((self.0[o] >> 4).wrapping_add(1)) & 0x0f;
        self.0[o] = ev << 4;
        self.0[o + ENTRY_BYTES - 1] = ev;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_never_straddle_lines_and_fit() {
        assert_eq!(FANOUT, 45);
        for i in 0..FANOUT {
            let o = entry_off(i);
            assert_eq!(
                o / LINE_BYTES,
                (o + ENTRY_BYTES - 1) / LINE_BYTES,
                "entry {i} straddles"
            );
            assert_ne!(o % LINE_BYTES, 0, "entry {i} overlaps a version byte");
        }
        assert_eq!(entry_off(FANOUT - 1) / LINE_BYTES, LINES - 1);
        assert!(
            entry_off(FANOUT - 1) + ENTRY_BYTES <= OFF_REAR,
            "rear version free"
        );
        const { assert!(OFF_FRONT < LINE_BYTES) };
    }

    #[test]
    fn versions_detect_a_torn_whole_node_write() {
        let mut a = vec![0u8; NODE_BYTES];
        NodeMut(&mut a).init(0, 0, KEY_INFINITY, GlobalAddr::NULL, 1);
        let mut b = a.clone();
        NodeMut(&mut b).set_version(2);
        let mut torn = b.clone();
        torn[5 * LINE_BYTES..6 * LINE_BYTES].copy_from_slice(&a[5 * LINE_BYTES..6 * LINE_BYTES]);
        assert!(Node(&a).lines_agree() && Node(&b).lines_agree());
        assert!(
            !Node(&torn).lines_agree(),
            "line versions catch a middle line"
        );
        assert!(
            Node(&torn).front_rear_agree(),
            "the paper's scheme does not"
        );
        // A single-entry write leaves the line versions alone.
        let mut c = b.clone();
        NodeMut(&mut c).set_entry(7, 42, 4242);
        assert!(Node(&c).lines_agree() && Node(&c).front_rear_agree());
        assert_eq!(Node(&c).find(42), Some(7));
        assert_eq!(Node(&c).value(7), 4242);
    }

    proptest::proptest! {
        /// `find` answers as the plain scan over `entry_off` does: the
        /// first occupied entry with the key, on leaves with free slots
        /// holding stale keys and keys present twice.
        #[test]
        fn find_is_the_first_occupied_match(
            slots in proptest::collection::vec((0u8..3, 0u64..6), FANOUT),
            probe in 0u64..7,
        ) {
            let mut b = vec![0u8; NODE_BYTES];
            NodeMut(&mut b).init(0, 0, KEY_INFINITY, GlobalAddr::NULL, 1);
            for (i, &(state, key)) in slots.iter().enumerate() {
                let o = entry_off(i);
                b[o] = if state == 0 { 0 } else { ENTRY_OCCUPIED };
                b[o + 1..o + 9].copy_from_slice(&key.to_le_bytes());
            }
            let n = Node(&b);
            let plain = (0..FANOUT).find(|&i| n.occupied(i) && n.key(i) == probe);
            proptest::prop_assert_eq!(n.find(probe), plain);
        }
    }
}
