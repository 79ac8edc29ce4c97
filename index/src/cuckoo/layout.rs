//! The bytes of a Nessie table in memory-node memory: slot words, data
//! entries and the table descriptor.
//!
//! **Bucket**: 8 slots of 8 bytes, one 64-byte line, 64-byte aligned.
//!
//! **Slot word** (state in the top two bits):
//! ```text
//! 63..62  state   0 Empty  1 Tentative  2 Normal  3 Forward
//! Empty:      61..0  tag — unique per emptying (incarnation:20 | count:42);
//!                    0 only in a slot never used since creation
//! otherwise:  61..50 fingerprint (12 bits of the key's hash)
//!             49..43 entry length in 64-byte lines, minus 1 (1..=128 lines)
//!             42..35 memory node of the entry (0..=255)
//!             34..0  host offset of the entry / 64 (2 TiB per node)
//! ```
//! Bits 49..0 are the entry reference ([`EntryRef`]). Normal and Forward
//! words are *committed* (they hold the key's value); Tentative words are
//! invisible to readers (`mod.rs` gives the protocol).
//!
//! **Data entry**, immutable once published, written out of place:
//! ```text
//! 0..8    checksum: hash of bytes 8..end under CHECK_SEED
//! 8..12   value length (u32 LE)
//! 12..14  key length (u16 LE)
//! 14..16  format mark 0x4E45
//! 16..    key, then value, then zeros to a whole line
//! ```
//!
//! **Descriptor** (what the root word at `HASH_ROOT_OFF` of node 0 points
//! to; immutable once the root names it: a growing table publishes a new
//! one, `grow.rs`): line 0 holds the layout (magic, format, buckets listed,
//! buckets per segment, key bytes, max value bytes, seed, segment count);
//! line 1 the incarnation counter that clients take their id from with one
//! FAA (used in the first descriptor only), then the growth state (base
//! buckets, level, phase, where the incarnation counter is, generation,
//! doublings allowed, and while Placing the split walk's counters' line);
//! segment addresses follow from byte 128.

use nicdrv::{GlobalAddr, Space};

pub const SLOTS: usize = 8;
pub const BUCKET_BYTES: usize = 64;
pub const LINE_BYTES: usize = 64;
/// Longest entry: 128 lines (8 KiB).
pub const MAX_ENTRY_LINES: u32 = 128;
pub const ENTRY_HEADER_BYTES: usize = 16;
const ENTRY_MARK: u16 = 0x4E45;
const CHECK_SEED: u64 = 0xc0ff_ee00_d15e_a5e5;

/// Most segments a descriptor lists (it is read in one 16 KiB READ).
pub const MAX_SEGMENTS: usize = 2032;
pub const DESC_MAGIC: u64 = 0x4e45_5353_4945_4331; // "NESSIEC1"
pub const DESC_FORMAT: u64 = 2;
pub const DESC_HEADER_BYTES: usize = 128;
/// Offset of the incarnation counter in the descriptor.
pub const DESC_INCARNATION_OFF: u64 = 64;

/// The four states of a slot.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum State {
    Empty,
    /// Placed by an insert or a migration, not yet committed: readers skip it.
    Tentative,
    /// The key's committed value.
    Normal,
    /// Committed too, and moving: a copy of the entry is (or was) tentative
    /// in the key's other bucket.
    Forward,
}

/// Pointer and length of a data entry: 50 bits of a slot word.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntryRef(u64);

const REF_BITS: u32 = 50;
const REF_MASK: u64 = (1 << REF_BITS) - 1;
const OFF_BITS: u32 = 35;
const NODE_SHIFT: u32 = 35;
const LINES_SHIFT: u32 = 43;
const FP_SHIFT: u32 = 50;
pub const FP_BITS: u32 = 12;
const STATE_SHIFT: u32 = 62;
/// Largest tag of an empty word.
pub const TAG_MAX: u64 = (1 << 62) - 1;

impl EntryRef {
    /// The reference of an entry of `lines` lines at `addr`; `None` if the
    /// address cannot be encoded (device memory, node above 255, offset
    /// not 64-aligned or at or beyond 2 TiB) or `lines` is out of range.
    pub fn new(addr: GlobalAddr, lines: u32) -> Option<EntryRef> {
        let off = addr.offset();
        if addr.space() != Space::Host
            || addr.node() > 255
            || !off.is_multiple_of(LINE_BYTES as u64)
            || off / LINE_BYTES as u64 >= 1 << OFF_BITS
            || !(1..=MAX_ENTRY_LINES).contains(&lines)
        {
            return None;
        }
        Some(EntryRef(
            ((lines as u64 - 1) << LINES_SHIFT)
                | ((addr.node() as u64) << NODE_SHIFT)
                | (off / LINE_BYTES as u64),
        ))
    }

    pub fn addr(self) -> GlobalAddr {
        GlobalAddr::host(
            ((self.0 >> NODE_SHIFT) & 0xff) as u16,
            (self.0 & ((1 << OFF_BITS) - 1)) * LINE_BYTES as u64,
        )
    }

    pub fn lines(self) -> u32 {
        ((self.0 >> LINES_SHIFT) & 0x7f) as u32 + 1
    }

    pub fn bytes(self) -> usize {
        self.lines() as usize * LINE_BYTES
    }

    pub fn raw(self) -> u64 {
        self.0
    }
}

/// One slot word.
#[derive(Copy, Clone, PartialEq, Eq, Hash)]
pub struct Slot(pub u64);

impl Slot {
    pub fn empty(tag: u64) -> Slot {
        debug_assert!(tag <= TAG_MAX);
        Slot(tag & TAG_MAX)
    }

    pub fn entry(state: State, fp: u16, e: EntryRef) -> Slot {
        let st = match state {
            State::Empty => unreachable!("an empty word holds a tag, not an entry"),
            State::Tentative => 1u64,
            State::Normal => 2,
            State::Forward => 3,
        };
        Slot((st << STATE_SHIFT) | (((fp as u64) & ((1 << FP_BITS) - 1)) << FP_SHIFT) | e.0)
    }

    pub fn state(self) -> State {
        match self.0 >> STATE_SHIFT {
            0 => State::Empty,
            1 => State::Tentative,
            2 => State::Normal,
            _ => State::Forward,
        }
    }

    pub fn is_empty(self) -> bool {
        self.state() == State::Empty
    }

    /// Normal or Forward: holds the key's value.
    pub fn is_committed(self) -> bool {
        matches!(self.state(), State::Normal | State::Forward)
    }

    pub fn fp(self) -> u16 {
        ((self.0 >> FP_SHIFT) & ((1 << FP_BITS) - 1)) as u16
    }

    /// The entry of a non-empty word.
    pub fn eref(self) -> EntryRef {
        EntryRef(self.0 & REF_MASK)
    }

    /// The same entry and fingerprint in another state.
    pub fn with_state(self, state: State) -> Slot {
        Slot::entry(state, self.fp(), self.eref())
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.state() {
            State::Empty => write!(f, "E({:#x})", self.0),
            s => write!(
                f,
                "{}(fp {:#x}, {} × {} lines)",
                match s {
                    State::Tentative => "T",
                    State::Normal => "N",
                    _ => "F",
                },
                self.fp(),
                self.eref().addr(),
                self.eref().lines()
            ),
        }
    }
}

/// Lines an entry of this key and value occupies.
pub fn entry_lines(key_len: usize, value_len: usize) -> u32 {
    (ENTRY_HEADER_BYTES + key_len + value_len).div_ceil(LINE_BYTES) as u32
}

/// Writes the entry for `key` and `value` into `out` (cleared first), padded
/// to whole lines. The caller has checked the lengths.
pub fn encode_entry(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    let lines = entry_lines(key.len(), value.len()) as usize;
    out.clear();
    out.resize(lines * LINE_BYTES, 0);
    out[8..12].copy_from_slice(&(value.len() as u32).to_le_bytes());
    out[12..14].copy_from_slice(&(key.len() as u16).to_le_bytes());
    out[14..16].copy_from_slice(&ENTRY_MARK.to_le_bytes());
    let k_end = ENTRY_HEADER_BYTES + key.len();
    out[ENTRY_HEADER_BYTES..k_end].copy_from_slice(key);
    out[k_end..k_end + value.len()].copy_from_slice(value);
    let sum = hash64(&out[8..k_end + value.len()], CHECK_SEED);
    out[0..8].copy_from_slice(&sum.to_le_bytes());
}

/// The key and value of an entry read back, or `None` when it is torn,
/// stale or not an entry (bad mark, lengths or checksum). `bytes` are the
/// lines its slot word names, which the entry must fill exactly: a word
/// naming more lines than the entry takes is corrupt, and trusting it
/// would return a block of the wrong size class to the allocator when the
/// entry is replaced.
pub fn decode_entry(bytes: &[u8], key_len: usize) -> Option<(&[u8], &[u8])> {
    if bytes.len() < ENTRY_HEADER_BYTES {
        return None;
    }
    let word = |a: usize, b: usize| &bytes[a..b];
    let value_len = u32::from_le_bytes(word(8, 12).try_into().ok()?) as usize;
    let klen = u16::from_le_bytes(word(12, 14).try_into().ok()?) as usize;
    let mark = u16::from_le_bytes(word(14, 16).try_into().ok()?);
    if mark != ENTRY_MARK || klen != key_len {
        return None;
    }
    let end = ENTRY_HEADER_BYTES
        .checked_add(klen)?
        .checked_add(value_len)?;
    if end.div_ceil(LINE_BYTES) * LINE_BYTES != bytes.len() {
        return None;
    }
    let sum = u64::from_le_bytes(word(0, 8).try_into().ok()?);
    if hash64(&bytes[8..end], CHECK_SEED) != sum {
        return None;
    }
    let k_end = ENTRY_HEADER_BYTES + klen;
    Some((&bytes[ENTRY_HEADER_BYTES..k_end], &bytes[k_end..end]))
}

/// 64-bit hash of `data` (multiply-rotate over 8-byte words, murmur3's
/// finalizer): keys to buckets and fingerprints, and entry checksums.
pub fn hash64(data: &[u8], seed: u64) -> u64 {
    const P1: u64 = 0x9E37_79B9_7F4A_7C15;
    const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
    const P3: u64 = 0x1656_67B1_9E37_79F9;
    let mut h = seed ^ (data.len() as u64).wrapping_mul(P1);
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let k = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        h = (h ^ k.wrapping_mul(P2).rotate_left(31).wrapping_mul(P1))
            .rotate_left(27)
            .wrapping_mul(P1)
            .wrapping_add(P3);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        let k = u64::from_le_bytes(w);
        h = (h ^ k.wrapping_mul(P2).rotate_left(31).wrapping_mul(P1))
            .rotate_left(27)
            .wrapping_mul(P1)
            .wrapping_add(P3);
    }
    fmix64(h)
}

/// murmur3's 64-bit finalizer: every input bit affects every output bit.
pub fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Where a table stands in growing (`grow.rs`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// `base << level` buckets; keys are read and placed at `level`.
    Stable,
    /// Growing to `level + 1`: keys are read at both levels and placed at
    /// `level`.
    Reading,
    /// Growing to `level + 1`: keys are read at both levels and placed at
    /// `level + 1`; misplaced ones are moved up.
    Placing,
}

/// What a descriptor says (the table's layout, shared by all clients).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desc {
    /// Where the descriptor itself lives.
    pub at: GlobalAddr,
    /// Buckets the segments hold: `base << level`, twice that while
    /// growing.
    pub buckets: u64,
    pub seg_buckets: u64,
    pub key_bytes: usize,
    pub max_value_bytes: usize,
    pub seed: u64,
    pub segs: Vec<GlobalAddr>,
    /// Buckets at creation (level 0).
    pub base_buckets: u64,
    /// Times the table has doubled.
    pub level: u32,
    pub phase: Phase,
    /// The incarnation counter: the first descriptor's.
    pub incarnation_at: GlobalAddr,
    /// Descriptors published before this one.
    pub generation: u64,
    /// Times the table may double (`CuckooConfig::max_level`).
    pub max_level: u32,
    /// While new words go up (Placing): the line of the split walk's
    /// counters (`grow.rs`): groups claimed, groups done.
    pub walk_at: Option<GlobalAddr>,
}

impl Desc {
    pub fn bytes(segments: usize) -> usize {
        DESC_HEADER_BYTES + 8 * segments
    }

    /// Address of bucket `b` (< buckets).
    pub fn bucket_addr(&self, b: u64) -> GlobalAddr {
        debug_assert!(b < self.buckets);
        let seg = (b / self.seg_buckets) as usize;
        self.segs[seg].add((b % self.seg_buckets) * BUCKET_BYTES as u64)
    }

    pub fn incarnation_word(&self) -> GlobalAddr {
        self.incarnation_at
    }

    /// Whether the table is between levels.
    pub fn growing(&self) -> bool {
        self.phase != Phase::Stable
    }

    /// The level new words are placed at.
    pub fn place_level(&self) -> u32 {
        match self.phase {
            Phase::Stable | Phase::Reading => self.level,
            Phase::Placing => self.level + 1,
        }
    }

    /// Buckets at the place level.
    pub fn place_buckets(&self) -> u64 {
        self.base_buckets << self.place_level()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = vec![0u8; Desc::bytes(self.segs.len())];
        let fields = [
            DESC_MAGIC,
            DESC_FORMAT,
            self.buckets,
            self.seg_buckets,
            self.key_bytes as u64,
            self.max_value_bytes as u64,
            self.seed,
            self.segs.len() as u64,
            // Line 1: the incarnation counter (zero), then growth.
            0,
            self.base_buckets,
            self.level as u64,
            match self.phase {
                Phase::Stable => 0,
                Phase::Reading => 1,
                Phase::Placing => 2,
            },
            self.incarnation_at.raw(),
            self.generation,
            self.max_level as u64,
            self.walk_at.map_or(0, |a| a.raw()),
        ];
        for (i, f) in fields.iter().enumerate() {
            v[i * 8..i * 8 + 8].copy_from_slice(&f.to_le_bytes());
        }
        for (i, s) in self.segs.iter().enumerate() {
            let o = DESC_HEADER_BYTES + i * 8;
            v[o..o + 8].copy_from_slice(&s.raw().to_le_bytes());
        }
        v
    }

    /// The segment count a header announces, to size the second READ;
    /// `None` if the header is not a descriptor's.
    pub fn segments_in(header: &[u8]) -> Option<usize> {
        let w = |i: usize| u64::from_le_bytes(header[i * 8..i * 8 + 8].try_into().expect("8"));
        if header.len() < 64 || w(0) != DESC_MAGIC || w(1) != DESC_FORMAT {
            return None;
        }
        let n = w(7) as usize;
        (1..=MAX_SEGMENTS).contains(&n).then_some(n)
    }

    pub fn decode(at: GlobalAddr, bytes: &[u8]) -> Result<Desc, &'static str> {
        let n = Desc::segments_in(bytes).ok_or("not a cuckoo table descriptor")?;
        if bytes.len() < Desc::bytes(n) {
            return Err("descriptor shorter than its segment list");
        }
        let w = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8"));
        let d = Desc {
            at,
            buckets: w(16),
            seg_buckets: w(24),
            key_bytes: w(32) as usize,
            max_value_bytes: w(40) as usize,
            seed: w(48),
            segs: (0..n)
                .map(|i| GlobalAddr::from_raw(w(DESC_HEADER_BYTES + i * 8)))
                .collect(),
            base_buckets: w(72),
            level: w(80).min(64) as u32,
            phase: match w(88) {
                0 => Phase::Stable,
                1 => Phase::Reading,
                2 => Phase::Placing,
                _ => return Err("descriptor with an unknown growth phase"),
            },
            incarnation_at: GlobalAddr::from_raw(w(96)),
            generation: w(104),
            max_level: w(112).min(64) as u32,
            walk_at: Some(GlobalAddr::from_raw(w(120))).filter(|a| !a.is_null()),
        };
        let levels = d.level + d.growing() as u32;
        if d.buckets < 2
            || d.seg_buckets == 0
            || d.buckets.div_ceil(d.seg_buckets) != n as u64
            || d.segs.iter().any(|s| s.is_null())
            || d.base_buckets < 2
            || !d.base_buckets.is_multiple_of(2)
            || levels > d.max_level
            || d.max_level > 40
            || d.base_buckets.checked_shl(levels) != Some(d.buckets)
            || d.incarnation_at.is_null()
            || d.walk_at.is_some() != (d.phase == Phase::Placing)
        {
            return Err("descriptor with an impossible layout");
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_words_round_trip() {
        let a = GlobalAddr::host(200, 64 * 12345);
        let e = EntryRef::new(a, 66).unwrap();
        assert_eq!((e.addr(), e.lines(), e.bytes()), (a, 66, 66 * 64));
        for st in [State::Tentative, State::Normal, State::Forward] {
            let w = Slot::entry(st, 0xabc, e);
            assert_eq!((w.state(), w.fp(), w.eref()), (st, 0xabc, e));
            assert!(!w.is_empty());
            assert_eq!(w.with_state(State::Normal).eref(), e);
        }
        let z = Slot::empty(TAG_MAX);
        assert!(z.is_empty() && !z.is_committed());
        assert!(Slot(0).is_empty());
        // What cannot be encoded is refused, not truncated.
        assert!(EntryRef::new(GlobalAddr::host(256, 64), 1).is_none());
        assert!(EntryRef::new(GlobalAddr::host(1, 65), 1).is_none());
        assert!(EntryRef::new(GlobalAddr::host(1, 64 << 35), 1).is_none());
        assert!(EntryRef::new(GlobalAddr::device(1, 64), 1).is_none());
        assert!(EntryRef::new(GlobalAddr::host(1, 64), 0).is_none());
        assert!(EntryRef::new(GlobalAddr::host(1, 64), 129).is_none());
    }

    #[test]
    fn entries_round_trip_and_detect_damage() {
        let mut buf = Vec::new();
        encode_entry(&mut buf, b"key-0001", &[7u8; 100]);
        assert_eq!(buf.len(), 2 * 64);
        let (k, v) = decode_entry(&buf, 8).unwrap();
        assert_eq!((k, v), (&b"key-0001"[..], &[7u8; 100][..]));
        assert!(decode_entry(&buf, 9).is_none(), "wrong key length");
        for i in [0, 9, 13, 20, 100, 115] {
            let mut bad = buf.clone();
            bad[i] ^= 0x10;
            assert!(decode_entry(&bad, 8).is_none(), "flip at {i} accepted");
        }
        // A line of another entry (a torn read) is caught.
        let mut other = Vec::new();
        encode_entry(&mut other, b"key-0001", &[8u8; 100]);
        let mut torn = buf.clone();
        torn[64..].copy_from_slice(&other[64..]);
        assert!(decode_entry(&torn, 8).is_none());
        assert!(decode_entry(&[0u8; 64], 8).is_none());
        // Read as the lines of a slot word that names one line too many,
        // or too few: refused.
        let mut long = buf.clone();
        long.resize(3 * 64, 0);
        assert!(
            decode_entry(&long, 8).is_none(),
            "a word with a line too many"
        );
        assert!(decode_entry(&buf[..64], 8).is_none(), "a line too few");
        encode_entry(&mut buf, b"k", &[]);
        assert_eq!(decode_entry(&buf, 1).unwrap().1.len(), 0);
    }

    #[test]
    fn descriptor_round_trips() {
        let d = Desc {
            at: GlobalAddr::host(0, 8192),
            buckets: 10,
            seg_buckets: 4,
            key_bytes: 8,
            max_value_bytes: 4096,
            seed: 99,
            segs: vec![
                GlobalAddr::host(0, 1 << 20),
                GlobalAddr::host(1, 1 << 20),
                GlobalAddr::host(2, 1 << 20),
            ],
            base_buckets: 10,
            level: 0,
            phase: Phase::Stable,
            incarnation_at: GlobalAddr::host(0, 8192 + 64),
            generation: 0,
            max_level: 3,
            walk_at: None,
        };
        let bytes = d.encode();
        assert_eq!(Desc::segments_in(&bytes[..64]), Some(3));
        assert_eq!(Desc::decode(d.at, &bytes).unwrap(), d);
        assert_eq!(d.bucket_addr(5), GlobalAddr::host(1, (1 << 20) + 64));
        assert!(Desc::decode(d.at, &bytes[..130]).is_err());
        assert!(Desc::decode(d.at, &[0u8; 256]).is_err());
        // Growing: twice the buckets listed, placed one level up.
        let g = Desc {
            buckets: 20,
            phase: Phase::Placing,
            walk_at: Some(GlobalAddr::host(3, 4096)),
            segs: (0..5).map(|i| GlobalAddr::host(i, 1 << 20)).collect(),
            generation: 2,
            ..d.clone()
        };
        assert_eq!(Desc::decode(g.at, &g.encode()).unwrap(), g);
        assert_eq!((g.place_level(), g.place_buckets()), (1, 20));
        // A level that does not match the buckets listed is refused.
        let bad = Desc {
            level: 1,
            ..g.clone()
        };
        assert!(Desc::decode(bad.at, &bad.encode()).is_err());
        let mut bytes = g.encode();
        bytes[88] = 7;
        assert!(Desc::decode(g.at, &bytes).is_err(), "unknown phase");
    }
}
