//! The byte layout of a tree node: 64-byte lines, 1 KiB by default.
//!
//! ```text
//! line 0 (header)  [0] line version  [1] level  [2] flags  [3..5] count
//!                  [8..16] low fence (inclusive)   [16..24] high fence (exclusive)
//!                  [24..32] sibling address        [32..40] leftmost child (internal)
//!                  [40..48] lock word (when locks live in host memory)
//!                  [48] front version (paper scheme)
//! other lines      [0] line version, then the entries (below)
//! last line        [63] rear version (paper scheme)
//! ```
//!
//! That is the layout of 8-byte keys. Wider keys ([`TreeKey`], chosen per
//! tree) keep their fences in fence lines after line 0, 63 bytes to a line
//! from byte 1 (low, then high), and line 0's bytes 8..24 stay zero.
//!
//! An entry is flags (bit 0 occupied, high nibble front entry version),
//! the key, the value (a leaf's: `value_bytes`, chosen per tree; an
//! internal node's: the child's address) and the rear entry version (paper
//! scheme): key + value + 2 bytes. With 8-byte keys and values (the
//! default) an entry is 18 bytes, three to a line at 1, 19 and 37: 45 to a
//! 1 KiB node.
//!
//! Every line starts with the node's version byte. A whole-node write bumps
//! it in every line; a single-entry write leaves it. Since each 64-byte
//! line lands atomically, a reader that sees the same version byte in all
//! lines has a node whose lines all come from the same whole-node write,
//! with entry writes applied or not — each a state the node really had for
//! that entry — provided an entry write is seen whole or not at all:
//! - An entry of up to 62 bytes never straddles a line (`62 / bytes` to a
//!   line, from byte 1; byte 63 stays free for the rear version).
//! - A larger entry spans whole lines of its own, and each of them carries,
//!   after the line version, the entry's version byte: bytes 2..63 hold the
//!   entry, 61 to a line. An entry write bumps that byte in every line it
//!   writes, so a reader that sees it agree in all the entry's lines has
//!   the entry from one write (the line version byte's argument, entry by
//!   entry).
//!
//! Fences change only in whole-node writes, so the line versions cover the
//! fence lines.
//!
//! Sherman packs 54 leaf / 61 internal entries into 1 KiB with 4-bit entry
//! versions; we spend the difference on a version byte per line, which is
//! what makes the check sound under out-of-order line writes. Nodes grow
//! (doubling from 1 KiB) until leaves and internal nodes each hold
//! [`MIN_FANOUT`] entries: 16 KiB for 1 KiB values or keys. Internal nodes
//! are as large as leaves (a READ of a node whose level is not known yet
//! needs one size).
//!
//! The paper's scheme (an ablation) reads only the front/rear node versions
//! and each entry's front/rear nibbles; it is fooled when the first and
//! last lines of a whole-node write land before a middle one.

pub use super::key::TreeKey;
use nicdrv::GlobalAddr;
use std::marker::PhantomData;

/// Scratch a tree operation keeps beside its nodes for word-sized verbs
/// (CAS, FAA, 8-byte READs; 8 bytes of a slot's scratch each): room for
/// 512.
pub const SMALL_SCRATCH: usize = 4 << 10;

/// A node's size with the default 8-byte keys and values.
pub const NODE_BYTES: usize = 1024;
/// Every node's alignment in memory-node memory, whatever its size: lines
/// are whole, and the root word keeps the root's level in the low bits.
pub const NODE_ALIGN: u64 = 1024;
pub const LINE_BYTES: usize = 64;
/// Largest entry that stays within one line (byte 0 is the line version,
/// byte 63 the rear version's place).
const LINE_ENTRY_BYTES: usize = 62;
/// Entry bytes per line of an entry that spans lines (bytes 2..63).
const SPAN_PAYLOAD: usize = 61;
/// Fence bytes per fence line (bytes 1..64).
const FENCE_PAYLOAD: usize = 63;
/// Smallest and largest key or leaf value a tree can be made with.
pub const MIN_VALUE_BYTES: usize = 8;
pub const MAX_VALUE_BYTES: usize = 1024;
pub const MIN_KEY_BYTES: usize = 8;
pub const MAX_KEY_BYTES: usize = 1024;
/// Nodes double from 1 KiB until a leaf and an internal node hold this
/// many entries.
pub const MIN_FANOUT: usize = 8;

pub const OFF_LEVEL: usize = 1;
pub const OFF_FLAGS: usize = 2;
pub const OFF_COUNT: usize = 3;
/// The fences of 8-byte keys: low at 8, high at 16.
const OFF_LOW: usize = 8;
pub const OFF_SIBLING: usize = 24;
pub const OFF_LEFTMOST: usize = 32;
/// The node's own lock word, used when locks live in host memory (FG+).
pub const OFF_LOCK: usize = 40;
pub const OFF_FRONT: usize = 48;

pub const FLAG_NODE_VALID: u8 = 1;
pub const ENTRY_OCCUPIED: u8 = 1;

/// Keys are `u64` below this value, which stands for +∞ as a high fence
/// (8-byte keys; [`TreeKey::INFINITY`] in general).
pub const KEY_INFINITY: u64 = u64::MAX;

/// Where the entries of one kind of node (leaf or internal) lie.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Entries {
    /// Bytes of an entry: flags, key, value, rear version.
    bytes: u16,
    /// Entries to a line (entries within a line), or 0.
    per_line: u8,
    /// Lines to an entry (entries that span lines), or 0.
    span: u8,
    /// Entries to a node.
    fanout: u16,
    /// The first entry line (after the header and fence lines).
    first: u8,
}

impl Entries {
    /// Entries of `bytes` bytes in `lines` lines from line `first`.
    fn new(bytes: usize, first: usize, lines: usize) -> Entries {
        let avail = lines.saturating_sub(first);
        if bytes <= LINE_ENTRY_BYTES {
            let per_line = LINE_ENTRY_BYTES / bytes;
            Entries {
                bytes: bytes as u16,
                per_line: per_line as u8,
                span: 0,
                fanout: (avail * per_line) as u16,
                first: first as u8,
            }
        } else {
            let span = bytes.div_ceil(SPAN_PAYLOAD);
            Entries {
                bytes: bytes as u16,
                per_line: 0,
                span: span as u8,
                fanout: (avail / span) as u16,
                first: first as u8,
            }
        }
    }
}

/// A tree's node layout, fixed at creation by its key and value sizes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    node_bytes: u32,
    key_bytes: u16,
    value_bytes: u16,
    leaf: Entries,
    internal: Entries,
}

impl Layout {
    /// The layout of nodes with `key_bytes`-byte keys
    /// ([`MIN_KEY_BYTES`]`..=`[`MAX_KEY_BYTES`]) and leaves holding
    /// `value_bytes`-byte values ([`MIN_VALUE_BYTES`]`..=`[`MAX_VALUE_BYTES`]);
    /// an error in words otherwise.
    pub fn new(key_bytes: usize, value_bytes: usize) -> Result<Layout, String> {
        if !(MIN_VALUE_BYTES..=MAX_VALUE_BYTES).contains(&value_bytes) {
            return Err(format!(
                "values must be {MIN_VALUE_BYTES} to {MAX_VALUE_BYTES} bytes, not {value_bytes}"
            ));
        }
        if !(MIN_KEY_BYTES..=MAX_KEY_BYTES).contains(&key_bytes) {
            return Err(format!(
                "keys must be {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes, not {key_bytes}"
            ));
        }
        let first = 1 + Self::fence_lines(key_bytes);
        let kinds = |lines| {
            (
                Entries::new(key_bytes + value_bytes + 2, first, lines),
                Entries::new(key_bytes + 10, first, lines),
            )
        };
        let mut node_bytes = NODE_BYTES;
        loop {
            let (leaf, internal) = kinds(node_bytes / LINE_BYTES);
            if leaf.fanout as usize >= MIN_FANOUT && internal.fanout as usize >= MIN_FANOUT {
                return Ok(Layout {
                    node_bytes: node_bytes as u32,
                    key_bytes: key_bytes as u16,
                    value_bytes: value_bytes as u16,
                    leaf,
                    internal,
                });
            }
            node_bytes *= 2;
        }
    }
    /// Lines after line 0 that hold the fences (none for 8-byte keys).
    fn fence_lines(key_bytes: usize) -> usize {
        if key_bytes == 8 {
            0
        } else {
            (2 * key_bytes).div_ceil(FENCE_PAYLOAD)
        }
    }
    /// Bytes of a node (a power of two, at least 1 KiB).
    pub fn node_bytes(&self) -> usize {
        self.node_bytes as usize
    }
    /// Task scratch to give a slot running tree operations: six nodes
    /// and [`SMALL_SCRATCH`] for the word-sized verbs posted beside them
    /// (a lock's CAS, a chunk's FAA, the root word). A put holds two
    /// nodes at most, however many levels its split climbs (a node read
    /// and locked, or a split's two halves being written: each level's
    /// copy goes back before the level above, `split_leaf`); a scan reads
    /// up to eight leaves at once in what there is, fewer when short.
    /// 10 KiB for 1 KiB nodes, 100 KiB for 16 KiB nodes.
    pub fn op_scratch_bytes(&self) -> usize {
        6 * self.node_bytes() + SMALL_SCRATCH
    }
    /// Bytes of a key.
    pub fn key_bytes(&self) -> usize {
        self.key_bytes as usize
    }
    /// Bytes of a leaf's value.
    pub fn value_bytes(&self) -> usize {
        self.value_bytes as usize
    }
    /// Bytes of tree nodes that `records` records take, to size memory
    /// nodes by: bulk-loaded leaves are 4/5 full and a split leaves two
    /// halves, so a leaf holds about 4/9 of its entries on average
    /// (internal nodes, a fanout's fraction of the leaves, are in the
    /// margin that rounding down the entries a leaf leaves).
    pub fn bytes_for_records(&self, records: u64) -> u64 {
        let per_node = (self.leaf_fanout() as u64 * 4 / 9).max(1);
        records * self.node_bytes() as u64 / per_node
    }
    /// Bytes of the leaves a bulk load of `records` records writes (4/5
    /// full), the least the records take; [`Self::bytes_for_records`] is
    /// what they take once inserts have split leaves in halves.
    pub fn bytes_loaded(&self, records: u64) -> u64 {
        let per_leaf = (self.leaf_fanout() as u64 * 4 / 5).max(1);
        records.div_ceil(per_leaf) * self.node_bytes() as u64
    }
    /// Entries to a leaf.
    pub fn leaf_fanout(&self) -> usize {
        self.leaf.fanout as usize
    }
    /// Entries (separators) to an internal node.
    pub fn internal_fanout(&self) -> usize {
        self.internal.fanout as usize
    }
    fn lines(&self) -> usize {
        self.node_bytes as usize / LINE_BYTES
    }
    fn rear(&self) -> usize {
        self.node_bytes as usize - 1
    }
    /// Byte offset of entry `i`'s first byte (its flags) in a node of
    /// kind `e`.
    fn entry_off(e: &Entries, i: usize) -> usize {
        let first = e.first as usize;
        if e.per_line > 0 {
            let n = e.per_line as usize;
            (first + i / n) * LINE_BYTES + 1 + (i % n) * e.bytes as usize
        } else {
            (first + i * e.span as usize) * LINE_BYTES + 2
        }
    }
    /// The bytes a leaf's entry write covers: (offset, length). An entry
    /// within a line: its flags, key and value, plus the rear version
    /// under the paper's scheme (`rear`); an entry spanning lines: all
    /// of its lines but the first's line version byte.
    pub fn leaf_entry_write(&self, i: usize, rear: bool) -> (usize, usize) {
        let e = &self.leaf;
        if e.per_line > 0 {
            let len = e.bytes as usize - usize::from(!rear);
            (Self::entry_off(e, i), len)
        } else {
            let off = Self::entry_off(e, i) - 1;
            (off, e.span as usize * LINE_BYTES - 1)
        }
    }
}

/// The offset of entry byte `p` of an entry at `off` (the offset of its
/// flags): within its line, or across the lines of an entry that spans.
#[inline]
fn at(e: &Entries, off: usize, p: usize) -> usize {
    Runs::entry(e, off).at(p)
}

/// A field laid in runs of `per` bytes, one run to a line, from byte
/// `base` of the node: an entry that spans lines (61 to a line, from byte
/// 2 of its first line), the fences (63 to a line, from byte 1 of line 1).
/// A field within one line is one run (`per` = `usize::MAX`).
#[derive(Copy, Clone)]
struct Runs {
    base: usize,
    per: usize,
}

impl Runs {
    /// Entry `e`'s bytes, the entry's flags at `off`.
    fn entry(e: &Entries, off: usize) -> Runs {
        let per = if e.per_line > 0 {
            usize::MAX
        } else {
            SPAN_PAYLOAD
        };
        Runs { base: off, per }
    }
    /// The fences of keys wider than 8 bytes.
    const FENCES: Runs = Runs {
        base: LINE_BYTES + 1,
        per: FENCE_PAYLOAD,
    };
    /// The node offset of field byte `p`.
    #[inline]
    fn at(self, p: usize) -> usize {
        if self.per == usize::MAX {
            return self.base + p;
        }
        self.base + (p / self.per) * LINE_BYTES + p % self.per
    }
    /// Field bytes `p..p + len` as (node offset, offset from `p`, length)
    /// pieces, each within a run.
    fn pieces(self, p: usize, len: usize) -> impl Iterator<Item = (usize, usize, usize)> {
        let mut done = 0;
        std::iter::from_fn(move || {
            if done == len {
                return None;
            }
            let q = p + done;
            let n = if self.per == usize::MAX {
                len - done
            } else {
                (self.per - q % self.per).min(len - done)
            };
            let piece = (self.at(q), done, n);
            done += n;
            Some(piece)
        })
    }
    /// Copies field bytes `p..p + out.len()` into `out`.
    fn gather(self, b: &[u8], p: usize, out: &mut [u8]) {
        for (at, i, n) in self.pieces(p, out.len()) {
            out[i..i + n].copy_from_slice(&b[at..at + n]);
        }
    }
    /// Copies `data` to field bytes `p..`.
    fn scatter(self, b: &mut [u8], p: usize, data: &[u8]) {
        for (at, i, n) in self.pieces(p, data.len()) {
            b[at..at + n].copy_from_slice(&data[i..i + n]);
        }
    }
}

#[inline]
fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// `v`'s eight little-endian bytes, repeated to fill `out` (the value
/// [`TreeClient::put`](super::TreeClient::put) stores for a `u64` when
/// values are wider than 8 bytes).
pub fn widen(v: u64, out: &mut [u8]) {
    let b = v.to_le_bytes();
    for (i, x) in out.iter_mut().enumerate() {
        *x = b[i % 8];
    }
}

/// Whether `value` is [`widen`] of its first eight bytes.
pub fn is_widened(value: &[u8]) -> bool {
    value.len() >= 8 && value.iter().enumerate().all(|(i, &x)| x == value[i % 8])
}

/// Reads a key of `K` from a node's bytes with `read(out)` filling a
/// buffer of `K::BYTES`: in place for keys that lie whole, else gathered.
#[inline]
fn key_from<K: TreeKey>(read: impl FnOnce(&mut [u8])) -> K {
    let mut buf = [0u8; MAX_KEY_BYTES];
    let b = &mut buf[..K::BYTES];
    read(b);
    K::read_from(b)
}

/// A typed view of a node's bytes (a local copy), with keys of `K`.
#[derive(Copy, Clone)]
pub struct Node<'a, K: TreeKey = u64> {
    b: &'a [u8],
    l: Layout,
    k: PhantomData<K>,
}
/// A mutable typed view of a node's bytes (a local copy).
pub struct NodeMut<'a, K: TreeKey = u64> {
    b: &'a mut [u8],
    l: Layout,
    k: PhantomData<K>,
}

/// Key `K` from entry bytes 1.. of the entry at `o` in `b`.
#[inline]
fn entry_key<K: TreeKey>(b: &[u8], e: &Entries, o: usize) -> K {
    // Entry bytes 1..1 + K lie whole in the entry's first line.
    if e.per_line > 0 || K::BYTES < SPAN_PAYLOAD {
        K::read_from(&b[o + 1..o + 1 + K::BYTES])
    } else {
        key_from::<K>(|out| Runs::entry(e, o).gather(b, 1, out))
    }
}

/// Fence `which` (0 low, 1 high) of a node with keys of `K`.
#[inline]
fn fence<K: TreeKey>(b: &[u8], which: usize) -> K {
    if K::BYTES == 8 {
        return K::read_from(&b[OFF_LOW + 8 * which..OFF_LOW + 8 * which + 8]);
    }
    key_from::<K>(|out| Runs::FENCES.gather(b, which * K::BYTES, out))
}

impl<'a, K: TreeKey> Node<'a, K> {
    /// A view of `b`, a node's worth of bytes in layout `l` (made for
    /// keys of `K`).
    pub fn new(l: Layout, b: &'a [u8]) -> Node<'a, K> {
        debug_assert!(b.len() >= l.node_bytes());
        debug_assert_eq!(l.key_bytes(), K::BYTES);
        Node {
            b,
            l,
            k: PhantomData,
        }
    }
    /// The node's bytes.
    pub fn bytes(&self) -> &'a [u8] {
        &self.b[..self.l.node_bytes()]
    }
    #[inline]
    fn ents(&self) -> &Entries {
        if self.is_leaf() {
            &self.l.leaf
        } else {
            &self.l.internal
        }
    }
    #[inline]
    fn off(&self, i: usize) -> usize {
        Layout::entry_off(self.ents(), i)
    }
    #[inline]
    pub fn level(&self) -> u8 {
        self.b[OFF_LEVEL]
    }
    #[inline]
    pub fn is_leaf(&self) -> bool {
        self.level() == 0
    }
    pub fn is_valid(&self) -> bool {
        self.b[OFF_FLAGS] & FLAG_NODE_VALID != 0
    }
    pub fn count(&self) -> usize {
        u16::from_le_bytes([self.b[OFF_COUNT], self.b[OFF_COUNT + 1]]) as usize
    }
    /// Entries this node can hold.
    pub fn fanout(&self) -> usize {
        self.ents().fanout as usize
    }
    #[inline]
    pub fn low(&self) -> K {
        fence(self.b, 0)
    }
    #[inline]
    pub fn high(&self) -> K {
        fence(self.b, 1)
    }
    pub fn sibling(&self) -> GlobalAddr {
        GlobalAddr::from_raw(u64_at(self.b, OFF_SIBLING))
    }
    pub fn leftmost(&self) -> GlobalAddr {
        GlobalAddr::from_raw(u64_at(self.b, OFF_LEFTMOST))
    }
    pub fn lock_word(&self) -> u64 {
        u64_at(self.b, OFF_LOCK)
    }
    pub fn covers(&self, key: K) -> bool {
        key >= self.low() && key < self.high()
    }
    pub fn version(&self) -> u8 {
        self.b[0]
    }
    /// All line versions agree, and so do the entry versions of every
    /// entry that spans lines.
    pub fn lines_agree(&self) -> bool {
        let v = self.b[0];
        let same = if self.l.node_bytes() == NODE_BYTES {
            // The default size, known to the compiler: sixteen loads.
            let node: &[u8; NODE_BYTES] = self.b[..NODE_BYTES].try_into().expect("a node");
            (1..NODE_BYTES / LINE_BYTES).all(|l| node[l * LINE_BYTES] == v)
        } else {
            let node = &self.b[..self.l.node_bytes()];
            node.chunks_exact(LINE_BYTES).all(|line| line[0] == v)
        };
        if !same {
            return false;
        }
        let e = *self.ents();
        if e.span == 0 {
            return true;
        }
        let span = e.span as usize;
        (0..e.fanout as usize).all(|i| {
            let first = Layout::entry_off(&e, i) - 2;
            let ev = self.b[first + 1];
            (1..span).all(|s| self.b[first + s * LINE_BYTES + 1] == ev)
        })
    }
    /// The paper's check: front == rear node version and, for each entry,
    /// front nibble == rear nibble.
    pub fn front_rear_agree(&self) -> bool {
        let e = *self.ents();
        self.b[OFF_FRONT] == self.b[self.l.rear()]
            && (0..e.fanout as usize).all(|i| {
                let o = Layout::entry_off(&e, i);
                self.b[o] >> 4 == self.b[at(&e, o, e.bytes as usize - 1)] & 0x0f
            })
    }
    pub fn occupied(&self, i: usize) -> bool {
        self.b[self.off(i)] & ENTRY_OCCUPIED != 0
    }
    #[inline]
    pub fn key(&self, i: usize) -> K {
        entry_key(self.b, self.ents(), self.off(i))
    }
    /// A leaf value's first eight bytes (as a little-endian `u64`), or an
    /// internal entry's child address.
    #[inline]
    pub fn value(&self, i: usize) -> u64 {
        let (e, o) = (self.ents(), self.off(i));
        let p = 1 + K::BYTES;
        if e.per_line > 0 {
            return u64_at(self.b, o + p);
        }
        let mut b = [0u8; 8];
        Runs::entry(e, o).gather(self.b, p, &mut b);
        u64::from_le_bytes(b)
    }
    /// Copies entry `i`'s value (all of a leaf's `value_bytes`) into `out`.
    pub fn value_into(&self, i: usize, out: &mut [u8]) {
        Runs::entry(self.ents(), self.off(i)).gather(self.b, 1 + K::BYTES, out);
    }
    /// Leaf: the slot holding `key`.
    pub fn find(&self, key: K) -> Option<usize> {
        let e = self.ents();
        match (e.per_line, e.bytes) {
            (0, _) => (0..e.fanout as usize).find(|&i| self.occupied(i) && self.key(i) == key),
            // The default layout (1 KiB, 8-byte keys and values), with its
            // shape known to the compiler, which unrolls it (with the shape
            // read from the layout a lookup spent 70 instructions more).
            (3, 18) if e.first == 1 && self.l.node_bytes() == NODE_BYTES => {
                let node: &[u8; NODE_BYTES] = self.b[..NODE_BYTES].try_into().expect("a node");
                Self::find_in_lines_of(node, 1, 3, 18, key)
            }
            (per, eb) => {
                let node = &self.b[..self.l.node_bytes()];
                Self::find_in_lines_of(node, e.first as usize, per as usize, eb as usize, key)
            }
        }
    }
    /// Line by line, the line's entries at fixed offsets: the same order
    /// as the plain scan over entry offsets, without its division per
    /// entry (a lookup's scan took about 700 instructions that way).
    #[inline(always)]
    fn find_in_lines_of(node: &[u8], first: usize, per: usize, eb: usize, key: K) -> Option<usize> {
        let lines = node[first * LINE_BYTES..].chunks_exact(LINE_BYTES);
        for (l, line) in lines.enumerate() {
            let line: &[u8; LINE_BYTES] = line.try_into().expect("a whole line");
            for j in 0..per {
                let o = 1 + j * eb;
                let k = K::read_from(&line[o + 1..o + 1 + K::BYTES]);
                if line[o] & ENTRY_OCCUPIED != 0 && k == key {
                    return Some(l * per + j);
                }
            }
        }
        None
    }
    /// Leaf: a free slot.
    pub fn free_slot(&self) -> Option<usize> {
        (0..self.fanout()).find(|&i| !self.occupied(i))
    }
    /// Leaf: the slots of occupied entries (in slot order, keys unsorted).
    pub fn slots(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.fanout()).filter(|&i| self.occupied(i))
    }
    /// Leaf: occupied entries (unsorted), with their values' first eight
    /// bytes.
    pub fn entries(&self) -> impl Iterator<Item = (K, u64)> + '_ {
        self.slots().map(|i| (self.key(i), self.value(i)))
    }
    /// Internal: the child covering `key` (entries sorted in slots
    /// 0..count; child i holds keys >= key i).
    pub fn child_for(&self, key: K) -> GlobalAddr {
        let n = self.count().min(self.fanout());
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
    pub fn children(&self) -> Vec<(K, GlobalAddr)> {
        let n = self.count().min(self.fanout());
        let mut v = Vec::with_capacity(n + 1);
        v.push((self.low(), self.leftmost()));
        for i in 0..n {
            v.push((self.key(i), GlobalAddr::from_raw(self.value(i))));
        }
        v
    }
}

impl<'a, K: TreeKey> NodeMut<'a, K> {
    /// A mutable view of `b`, a node's worth of bytes in layout `l` (made
    /// for keys of `K`).
    pub fn new(l: Layout, b: &'a mut [u8]) -> NodeMut<'a, K> {
        debug_assert!(b.len() >= l.node_bytes());
        debug_assert_eq!(l.key_bytes(), K::BYTES);
        NodeMut {
            b,
            l,
            k: PhantomData,
        }
    }
    pub fn view(&self) -> Node<'_, K> {
        Node {
            b: self.b,
            l: self.l,
            k: PhantomData,
        }
    }
    /// Formats an empty node.
    pub fn init(&mut self, level: u8, low: K, high: K, sibling: GlobalAddr, version: u8) {
        let nb = self.l.node_bytes();
        self.b[..nb].fill(0);
        self.b[OFF_LEVEL] = level;
        self.b[OFF_FLAGS] = FLAG_NODE_VALID;
        self.set_fence(0, low);
        self.set_fence(1, high);
        put_u64(self.b, OFF_SIBLING, sibling.raw());
        self.set_version(version);
    }
    fn set_fence(&mut self, which: usize, k: K) {
        if K::BYTES == 8 {
            k.write_to(&mut self.b[OFF_LOW + 8 * which..OFF_LOW + 8 * which + 8]);
            return;
        }
        let mut buf = [0u8; MAX_KEY_BYTES];
        k.write_to(&mut buf[..K::BYTES]);
        Runs::FENCES.scatter(self.b, which * K::BYTES, &buf[..K::BYTES]);
    }
    /// Sets the version byte of every line, and the paper's front and rear
    /// versions.
    pub fn set_version(&mut self, v: u8) {
        for l in 0..self.l.lines() {
            self.b[l * LINE_BYTES] = v;
        }
        self.b[OFF_FRONT] = v;
        self.b[self.l.rear()] = v;
    }
    pub fn set_high(&mut self, high: K) {
        self.set_fence(1, high);
    }
    pub fn set_sibling(&mut self, s: GlobalAddr) {
        put_u64(self.b, OFF_SIBLING, s.raw());
    }
    pub fn set_leftmost(&mut self, c: GlobalAddr) {
        put_u64(self.b, OFF_LEFTMOST, c.raw());
    }
    pub fn set_count(&mut self, n: usize) {
        let c = u16::try_from(n).expect("a node's count fits 16 bits");
        self.b[OFF_COUNT..OFF_COUNT + 2].copy_from_slice(&c.to_le_bytes());
    }
    pub fn set_lock_word(&mut self, v: u64) {
        put_u64(self.b, OFF_LOCK, v);
    }
    fn ents(&self) -> Entries {
        if self.b[OFF_LEVEL] == 0 {
            self.l.leaf
        } else {
            self.l.internal
        }
    }
    /// Bumps entry `i`'s versions (front and rear nibbles; the version
    /// byte of each of its lines when it spans lines); its flags become
    /// the new front nibble and `occupied`.
    fn bump(&mut self, e: &Entries, o: usize, occupied: bool) {
        let ev = ((self.b[o] >> 4).wrapping_add(1)) & 0x0f;
        self.b[o] = (ev << 4) | (u8::from(occupied) * ENTRY_OCCUPIED);
        self.b[at(e, o, e.bytes as usize - 1)] = ev;
        if e.span > 0 {
            // `o` is byte 2 of the entry's first line; byte 1 its version.
            let v = self.b[o - 1].wrapping_add(1);
            for s in 0..e.span as usize {
                self.b[o - 1 + s * LINE_BYTES] = v;
            }
        }
    }
    /// Writes slot `i` (`value`: a leaf's `value_bytes`, or an internal
    /// entry's 8-byte child) and bumps its entry versions.
    pub fn set_entry(&mut self, i: usize, key: K, value: &[u8]) {
        let e = self.ents();
        debug_assert_eq!(K::BYTES + value.len() + 2, e.bytes as usize);
        let o = Layout::entry_off(&e, i);
        self.bump(&e, o, true);
        if K::BYTES == 8 || e.per_line > 0 {
            key.write_to(&mut self.b[o + 1..o + 1 + K::BYTES]);
        } else {
            let mut buf = [0u8; MAX_KEY_BYTES];
            key.write_to(&mut buf[..K::BYTES]);
            Runs::entry(&e, o).scatter(self.b, 1, &buf[..K::BYTES]);
        }
        Runs::entry(&e, o).scatter(self.b, 1 + K::BYTES, value);
    }
    /// Internal: writes slot `i` as separator `key` → `child`.
    pub fn set_child(&mut self, i: usize, key: K, child: GlobalAddr) {
        self.set_entry(i, key, &child.raw().to_le_bytes());
    }
    /// Frees slot `i` (bumping its entry versions).
    pub fn clear_entry(&mut self, i: usize) {
        let e = self.ents();
        let o = Layout::entry_off(&e, i);
        self.bump(&e, o, false);
    }
}

/// A leaf's entries as owned bytes, to rebuild leaves from (a split, or a
/// whole-node write): keys with their values, in any order until sorted.
pub struct LeafItems<K: TreeKey = u64> {
    value_bytes: usize,
    keys: Vec<(K, u32)>,
    values: Vec<u8>,
}

impl<K: TreeKey> LeafItems<K> {
    /// The occupied entries of leaf `n`.
    pub fn of(n: &Node<'_, K>) -> LeafItems<K> {
        let vb = n.l.value_bytes();
        let mut it = LeafItems {
            value_bytes: vb,
            keys: Vec::with_capacity(n.fanout() + 1),
            values: Vec::with_capacity((n.fanout() + 1) * vb),
        };
        for i in n.slots() {
            let at = it.values.len();
            it.values.resize(at + vb, 0);
            n.value_into(i, &mut it.values[at..]);
            it.keys.push((n.key(i), (at / vb) as u32));
        }
        it
    }
    /// Adds `key` → `value` (`value_bytes` long).
    pub fn push(&mut self, key: K, value: &[u8]) {
        debug_assert_eq!(value.len(), self.value_bytes);
        let idx = (self.values.len() / self.value_bytes) as u32;
        self.values.extend_from_slice(value);
        self.keys.push((key, idx));
    }
    /// Drops `key`'s entries (their bytes stay, unnamed).
    pub fn remove(&mut self, key: K) {
        self.keys.retain(|&(k, _)| k != key);
    }
    /// Orders the entries by key.
    pub fn sort(&mut self) {
        self.keys.sort_unstable_by_key(|&(k, _)| k);
    }
    pub fn len(&self) -> usize {
        self.keys.len()
    }
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
    pub fn key(&self, i: usize) -> K {
        self.keys[i].0
    }
    pub fn value(&self, i: usize) -> &[u8] {
        let at = self.keys[i].1 as usize * self.value_bytes;
        &self.values[at..at + self.value_bytes]
    }
    /// Writes entries `range` into slots 0.. of leaf `m` and frees the
    /// slots after them.
    pub fn fill(&self, m: &mut NodeMut<'_, K>, range: std::ops::Range<usize>) {
        let n = range.len();
        for (slot, i) in range.enumerate() {
            m.set_entry(slot, self.key(i), self.value(i));
        }
        for slot in n..m.view().fanout() {
            m.clear_entry(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type N<'a> = Node<'a, u64>;
    type M<'a> = NodeMut<'a, u64>;

    fn leaf(l: Layout) -> Vec<u8> {
        let mut b = vec![0u8; l.node_bytes()];
        M::new(l, &mut b).init(0, 0, KEY_INFINITY, GlobalAddr::NULL, 1);
        b
    }

    #[test]
    fn the_default_layout_is_the_1_kib_node_of_45_entries() {
        let l = Layout::new(8, 8).unwrap();
        assert_eq!(
            (l.node_bytes(), l.leaf_fanout(), l.internal_fanout()),
            (1024, 45, 45)
        );
        assert_eq!(Layout::entry_off(&l.leaf, 0), 65);
        assert_eq!(Layout::entry_off(&l.leaf, 2), 64 + 37);
        assert_eq!(Layout::entry_off(&l.leaf, 44), 15 * 64 + 37);
        assert_eq!(l.leaf_entry_write(4, false), (2 * 64 + 19, 17));
        assert_eq!(l.leaf_entry_write(4, true), (2 * 64 + 19, 18));
        let b = leaf(l);
        assert_eq!(
            &b[8..24],
            &[0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 255, 255, 255, 255, 255, 255]
        );
        let big = Layout::new(8, 1024).unwrap();
        assert_eq!((big.node_bytes(), big.leaf_fanout()), (16384, 15));
        let wide = Layout::new(1024, 8).unwrap();
        assert_eq!((wide.node_bytes(), wide.internal_fanout()), (16384, 13));
        assert!(Layout::new(8, 7).is_err() && Layout::new(8, 1025).is_err());
        assert!(Layout::new(7, 8).is_err() && Layout::new(1025, 8).is_err());
    }

    /// Memory for records: 45-entry leaves hold 20 records on average (4/9
    /// of them), so a million take 50,000 nodes of 1 KiB; 1 KiB values
    /// take 15-entry leaves of 16 KiB, 6 records each.
    #[test]
    fn records_take_four_ninths_of_a_leaf_each_on_average() {
        let l = Layout::new(8, 8).unwrap();
        assert_eq!(l.bytes_for_records(1_000_000), 50_000 * 1024);
        assert_eq!(l.bytes_for_records(0), 0);
        let big = Layout::new(8, 1024).unwrap();
        assert_eq!(big.bytes_for_records(60), 10 * 16384);
        // Loaded 4/5 full: 36 records a 1 KiB leaf, 12 a 16 KiB one.
        assert_eq!(l.bytes_loaded(36_000), 1000 * 1024);
        assert_eq!(l.bytes_loaded(36_001), 1001 * 1024);
        assert_eq!(big.bytes_loaded(60), 5 * 16384);
    }

    /// Every key and value size: entries and fences lie inside the node,
    /// clear of every line version byte (and of the entry version byte of
    /// lines they span), never overlapping each other, the header or the
    /// rear version; leaves and internal nodes hold at least `MIN_FANOUT`.
    #[test]
    fn entries_fit_and_never_cover_a_version_byte() {
        let sizes = (8..=80).chain((81..=1024).step_by(7)).chain([1024]);
        let pairs: Vec<(usize, usize)> = sizes
            .clone()
            .map(|v| (8, v))
            .chain(sizes.map(|k| (k, 8)))
            .chain([(16, 1024), (1024, 1024), (100, 100)])
            .collect();
        for (kb, vb) in pairs {
            let l = Layout::new(kb, vb).unwrap();
            let what = format!("key {kb}, value {vb}");
            assert!(l.node_bytes().is_power_of_two(), "{what}");
            assert!(
                l.leaf_fanout() >= MIN_FANOUT && l.internal_fanout() >= MIN_FANOUT,
                "{what}"
            );
            let mut owner = vec![usize::MAX; l.node_bytes()];
            owner[..49].fill(100_000);
            if kb != 8 {
                for p in 0..2 * kb {
                    let b = Runs::FENCES.at(p);
                    assert_ne!(b % LINE_BYTES, 0, "{what}: fence on a line version");
                    assert_eq!(owner[b], usize::MAX, "{what}: fences overlap");
                    owner[b] = 100_001;
                }
            }
            for e in [l.leaf, l.internal] {
                let mut mine = owner.clone();
                for i in 0..e.fanout as usize {
                    let o = Layout::entry_off(&e, i);
                    for p in 0..e.bytes as usize {
                        let b = at(&e, o, p);
                        assert!(b < l.rear(), "{what}: entry {i} byte {p} past the node");
                        assert_ne!(b % LINE_BYTES, 0, "{what}: entry {i} on a line version");
                        if e.span > 0 {
                            assert_ne!(b % LINE_BYTES, 1, "{what}: on an entry version");
                        } else {
                            assert_eq!(b / LINE_BYTES, o / LINE_BYTES, "{what}: straddles");
                        }
                        assert_eq!(mine[b], usize::MAX, "{what}: entry {i} overlaps");
                        mine[b] = i;
                    }
                }
            }
        }
    }

    #[test]
    fn versions_detect_a_torn_whole_node_write() {
        let l = Layout::new(8, 8).unwrap();
        let a = leaf(l);
        let mut b = a.clone();
        M::new(l, &mut b).set_version(2);
        let mut torn = b.clone();
        torn[5 * LINE_BYTES..6 * LINE_BYTES].copy_from_slice(&a[5 * LINE_BYTES..6 * LINE_BYTES]);
        assert!(N::new(l, &a).lines_agree() && N::new(l, &b).lines_agree());
        assert!(
            !N::new(l, &torn).lines_agree(),
            "line versions catch a middle line"
        );
        assert!(
            N::new(l, &torn).front_rear_agree(),
            "the paper's scheme does not"
        );
        // A single-entry write leaves the line versions alone.
        let mut c = b.clone();
        M::new(l, &mut c).set_entry(7, 42, &4242u64.to_le_bytes());
        let n = N::new(l, &c);
        assert!(n.lines_agree() && n.front_rear_agree());
        assert_eq!(n.find(42), Some(7));
        assert_eq!(n.value(7), 4242);
    }

    /// An entry that spans lines: its value comes back whole, its write
    /// covers exactly its lines, and a copy with one of its lines from
    /// before the write (the lines of one WRITE may land in any order) is
    /// caught by the entry versions though every line version agrees.
    #[test]
    fn an_entry_spanning_lines_is_seen_whole_or_torn() {
        for vb in [53, 100, 200, 1024] {
            let l = Layout::new(8, vb).unwrap();
            let a = leaf(l);
            let mut b = a.clone();
            let mut v = vec![0u8; vb];
            widen(0x0102_0304_0506_0708, &mut v);
            M::new(l, &mut b).set_entry(3, 99, &v);
            let n = N::new(l, &b);
            assert!(n.lines_agree() && n.front_rear_agree(), "value {vb}");
            assert_eq!(n.find(99), Some(3));
            let mut out = vec![0u8; vb];
            n.value_into(3, &mut out);
            assert_eq!(out, v, "value {vb}");
            assert_eq!(n.value(3), 0x0102_0304_0506_0708);
            let (off, len) = l.leaf_entry_write(3, false);
            let changed: Vec<usize> = (0..b.len()).filter(|&i| a[i] != b[i]).collect();
            assert!(
                changed.iter().all(|&i| i >= off && i < off + len),
                "value {vb}"
            );
            assert_eq!(off % LINE_BYTES, 1);
            assert_eq!((off + len) % LINE_BYTES, 0);
            let last = (off + len) / LINE_BYTES - 1;
            let mut torn = b.clone();
            torn[last * LINE_BYTES..(last + 1) * LINE_BYTES]
                .copy_from_slice(&a[last * LINE_BYTES..(last + 1) * LINE_BYTES]);
            assert!(!N::new(l, &torn).lines_agree(), "value {vb}: torn entry");
            // Freed, it reads as free and consistent.
            M::new(l, &mut b).clear_entry(3);
            let n = N::new(l, &b);
            assert!(n.lines_agree() && n.find(99).is_none());
        }
    }

    /// Wide keys: fences and keys (spanning lines for 1 KiB keys) read
    /// back as written, in leaves and internal nodes.
    #[test]
    fn wide_keys_round_trip_in_fences_and_entries() {
        use crate::tree::key::wide_key;
        fn check<const K: usize>(vb: usize) {
            let l = Layout::new(K, vb).unwrap();
            let mut b = vec![0u8; l.node_bytes()];
            let (lo, hi) = (wide_key::<K>(100), wide_key::<K>(900));
            let mut m = NodeMut::<[u8; K]>::new(l, &mut b);
            m.init(0, lo, hi, GlobalAddr::NULL, 3);
            let v = vec![7u8; vb];
            for i in 0..l.leaf_fanout() {
                m.set_entry(i, wide_key::<K>(200 + i as u64), &v);
            }
            let n = Node::<[u8; K]>::new(l, &b);
            assert!(n.lines_agree() && n.front_rear_agree(), "key {K}");
            assert_eq!((n.low(), n.high()), (lo, hi), "key {K}");
            for i in 0..l.leaf_fanout() {
                assert_eq!(n.find(wide_key::<K>(200 + i as u64)), Some(i), "key {K}");
            }
            let mut c = vec![0u8; l.node_bytes()];
            let mut m = NodeMut::<[u8; K]>::new(l, &mut c);
            m.init(1, lo, <[u8; K]>::INFINITY, GlobalAddr::NULL, 1);
            m.set_child(0, wide_key::<K>(500), GlobalAddr::from_raw(5 << 10));
            m.set_count(1);
            let n = Node::<[u8; K]>::new(l, &c);
            assert_eq!(n.high(), <[u8; K]>::INFINITY);
            assert_eq!(
                n.child_for(wide_key::<K>(600)),
                GlobalAddr::from_raw(5 << 10)
            );
            assert_eq!(n.child_for(wide_key::<K>(400)), GlobalAddr::NULL);
        }
        check::<16>(8);
        check::<60>(8);
        check::<61>(8);
        check::<200>(100);
        check::<1024>(8);
        check::<1024>(1024);
    }

    #[test]
    fn leaf_items_rebuild_a_leaf_in_key_order() {
        let l = Layout::new(8, 100).unwrap();
        let mut b = leaf(l);
        let mut v = vec![0u8; 100];
        for (slot, k) in [(0, 30u64), (2, 10), (5, 20)] {
            widen(k * 7, &mut v);
            M::new(l, &mut b).set_entry(slot, k, &v);
        }
        let mut it = LeafItems::of(&N::new(l, &b));
        it.remove(20);
        widen(5, &mut v);
        it.push(5, &v);
        it.sort();
        let keys: Vec<u64> = (0..it.len()).map(|i| it.key(i)).collect();
        assert_eq!(keys, [5, 10, 30]);
        let mut c = leaf(l);
        it.fill(&mut M::new(l, &mut c), 0..it.len());
        let n = N::new(l, &c);
        let got: Vec<(u64, u64)> = n.entries().collect();
        assert_eq!(got, [(5, 5), (10, 70), (30, 210)]);
        let mut out = vec![0u8; 100];
        n.value_into(2, &mut out);
        assert!(is_widened(&out));
    }

    /// Reads every field of `b` as a node of `l` with keys of `K`, as a
    /// reader of a torn or corrupted copy may before checking it.
    fn read_everything<K: TreeKey>(l: Layout, b: &[u8], probe: K) {
        let n = Node::<K>::new(l, b);
        let _ = (n.lines_agree(), n.front_rear_agree(), n.low(), n.high());
        let _ = (
            n.find(probe),
            n.free_slot(),
            n.child_for(probe),
            n.children(),
        );
        let _ = n.entries().count();
        let mut v = vec![0u8; if n.is_leaf() { l.value_bytes() } else { 8 }];
        for i in 0..n.fanout() {
            n.value_into(i, &mut v);
        }
    }

    proptest::proptest! {
        /// Any bytes at all, read as a node of any layout (a corrupted
        /// node, a torn copy), are read without a panic: every offset a
        /// node's fields give lies inside the node, whatever its level,
        /// count or flags say.
        #[test]
        fn any_bytes_read_as_a_node_never_panic(
            seed in proptest::collection::vec(proptest::num::u8::ANY, 64),
            leaf in proptest::bool::ANY,
            vb in proptest::sample::select(vec![8usize, 53, 200, 1024]),
        ) {
            let mut rng = nicdrv::rng::Rng::new(seed.iter().map(|&x| x as u64).sum());
            let mut fill = |l: Layout| {
                let mut b: Vec<u8> = (0..l.node_bytes()).map(|_| rng.below(256) as u8).collect();
                b[OFF_LEVEL] = if leaf { 0 } else { b[OFF_LEVEL] | 1 };
                b
            };
            let l = Layout::new(8, vb).unwrap();
            read_everything::<u64>(l, &fill(l), 77);
            let l = Layout::new(61, vb).unwrap();
            read_everything::<[u8; 61]>(l, &fill(l), [3; 61]);
            let l = Layout::new(1024, vb).unwrap();
            read_everything::<[u8; 1024]>(l, &fill(l), [9; 1024]);
        }

        /// `find` answers as the plain scan over the entries does: the
        /// first occupied entry with the key, on leaves with free slots
        /// holding stale keys and keys present twice.
        #[test]
        fn find_is_the_first_occupied_match(
            vb in proptest::sample::select(vec![8usize, 20, 52, 53, 300]),
            slots in proptest::collection::vec((0u8..3, 0u64..6), 45),
            probe in 0u64..7,
        ) {
            let l = Layout::new(8, vb).unwrap();
            let mut b = leaf(l);
            let value = vec![0u8; vb];
            for (i, &(state, key)) in slots.iter().enumerate().take(l.leaf_fanout()) {
                let mut m = M::new(l, &mut b);
                m.set_entry(i, key, &value);
                if state == 0 {
                    m.clear_entry(i);
                }
            }
            let n = N::new(l, &b);
            let plain = (0..l.leaf_fanout()).find(|&i| n.occupied(i) && n.key(i) == probe);
            proptest::prop_assert_eq!(n.find(probe), plain);
        }
    }
}
