//! FaRM's objects as they lie in memory (FaRM §3, "objects"): a header
//! word — lock bit, incarnation, version — and the version again at the
//! start of every further 64-byte line, so that a lock-free one-sided READ
//! can tell a consistent copy from one torn by a concurrent update (a READ
//! may return any mix of old and new lines) or taken while the object is
//! locked.
//!
//! ```text
//! line 0     header: lock (bit 63) | free (bit 62) | incarnation (bits 40..62)
//!            | version (bits 0..40)
//!            payload bytes 0..56
//! line k≥1   the header without its lock bit
//!            payload bytes 56k..56k+56
//! ```
//!
//! The free bit marks a slot of an allocator block that holds no object
//! (never allocated, or freed: freeing also bumps the incarnation, so a
//! transaction that read the object before it was freed and reallocated
//! fails validation). A copy is consistent when its header is unlocked and
//! every line's word equals it. An update that writes a new version into every line (the
//! primary at COMMIT-PRIMARY, or a whole-object WRITE) can therefore never
//! be read half-applied: a line of the old version beside a header of the
//! new one, or the reverse, fails the check.

use nicdrv::{Ctx, GlobalAddr, Nic, VerbError};
use std::fmt;

/// Bytes of a line, the unit a NIC's writes land in.
pub const LINE: usize = 64;
/// Payload bytes a line carries after its version word.
pub const LINE_PAYLOAD: usize = LINE - 8;
/// Largest payload of one object (FaRM's objects are small; one READ).
pub const MAX_PAYLOAD: usize = 64 * LINE_PAYLOAD;

const LOCK: u64 = 1 << 63;
const FREE: u64 = 1 << 62;
const INC_SHIFT: u32 = 40;
const INC_MASK: u64 = (1 << 22) - 1;
const VERSION_MASK: u64 = (1 << 40) - 1;

/// An object's header word.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Header(pub u64);

impl Header {
    /// An unlocked, allocated header; `version` keeps its low 40 bits,
    /// `incarnation` its low 22.
    pub fn new(version: u64, incarnation: u64) -> Header {
        Header(((incarnation & INC_MASK) << INC_SHIFT) | (version & VERSION_MASK))
    }
    pub fn locked(self) -> bool {
        self.0 & LOCK != 0
    }
    pub fn version(self) -> u64 {
        self.0 & VERSION_MASK
    }
    pub fn incarnation(self) -> u64 {
        (self.0 >> INC_SHIFT) & INC_MASK
    }
    pub fn with_lock(self) -> Header {
        Header(self.0 | LOCK)
    }
    pub fn unlocked(self) -> Header {
        Header(self.0 & !LOCK)
    }
    /// Whether the slot holds no object.
    pub fn is_free(self) -> bool {
        self.0 & FREE != 0
    }
    /// The header of a slot that holds no object.
    pub fn free(version: u64, incarnation: u64) -> Header {
        Header(Header::new(version, incarnation).0 | FREE)
    }
    /// The next version, same incarnation and free bit, unlocked (wraps
    /// after 2^40).
    pub fn next(self) -> Header {
        Header(Header::new(self.version().wrapping_add(1), self.incarnation()).0 | (self.0 & FREE))
    }
    /// The header a commit leaves: the next version, allocated (`Update`
    /// and `Alloc`), or free at the next incarnation (`Free`).
    pub fn after(self, op: WriteOp) -> Header {
        let v = self.version().wrapping_add(1);
        match op {
            WriteOp::Update | WriteOp::Alloc => Header::new(v, self.incarnation()),
            WriteOp::Free => Header::free(v, self.incarnation().wrapping_add(1)),
        }
    }
}

/// What a committed write does to its object.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum WriteOp {
    /// A new value of a live object.
    Update,
    /// The first value of an object allocated by the transaction.
    Alloc,
    /// The object is freed (its slot goes back to the allocator).
    Free,
}

/// Lines an object of `payload` bytes takes.
pub fn lines(payload: usize) -> usize {
    payload.div_ceil(LINE_PAYLOAD).max(1)
}

/// Bytes an object of `payload` bytes takes in memory.
pub fn object_bytes(payload: usize) -> usize {
    lines(payload) * LINE
}

/// Why a copy of an object is not a value.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Inconsistent {
    /// Its header is locked: a commit is installing it.
    Locked,
    /// Line `line` carries another version than the header.
    Torn { line: usize },
}

/// Why an object could not be read or encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjectError {
    /// A payload beyond [`MAX_PAYLOAD`], or a buffer of the wrong size.
    Size {
        payload: usize,
        bytes: usize,
    },
    /// Every try found the object locked or torn.
    Busy {
        tries: u32,
        last: Inconsistent,
    },
    Verb(VerbError),
}

impl fmt::Display for ObjectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ObjectError::Size { payload, bytes } => write!(
                f,
                "an object of {payload} payload bytes in {bytes} bytes (objects carry at most {MAX_PAYLOAD}, in {} per line)",
                LINE_PAYLOAD
            ),
            ObjectError::Busy { tries, last } => {
                write!(f, "object still {last:?} after {tries} reads")
            }
            ObjectError::Verb(e) => write!(f, "reading an object: {e}"),
        }
    }
}

impl std::error::Error for ObjectError {}

fn check_size(payload: usize, bytes: usize) -> Result<(), ObjectError> {
    if payload > MAX_PAYLOAD || bytes != object_bytes(payload) {
        return Err(ObjectError::Size { payload, bytes });
    }
    Ok(())
}

/// Lays out an object with header `h` and `payload` into `out`
/// ([`object_bytes`] long); the lock bit is never copied into the lines.
pub fn encode(h: Header, payload: &[u8], out: &mut [u8]) -> Result<(), ObjectError> {
    check_size(payload.len(), out.len())?;
    for (k, line) in out.chunks_exact_mut(LINE).enumerate() {
        let word = if k == 0 { h } else { h.unlocked() };
        line[..8].copy_from_slice(&word.0.to_le_bytes());
        let from = (k * LINE_PAYLOAD).min(payload.len());
        let to = ((k + 1) * LINE_PAYLOAD).min(payload.len());
        line[8..8 + (to - from)].copy_from_slice(&payload[from..to]);
        line[8 + (to - from)..].fill(0);
    }
    Ok(())
}

/// The header of a copy, or why it is no value; the payload goes to `out`
/// (`payload` bytes) only for a consistent copy.
pub fn decode(bytes: &[u8], out: &mut [u8]) -> Result<Result<Header, Inconsistent>, ObjectError> {
    check_size(out.len(), bytes.len())?;
    let word =
        |k: usize| u64::from_le_bytes(bytes[k * LINE..k * LINE + 8].try_into().expect("8 bytes"));
    let h = Header(word(0));
    if h.locked() {
        return Ok(Err(Inconsistent::Locked));
    }
    if let Some(line) = (1..bytes.len() / LINE).find(|&k| word(k) != h.0) {
        return Ok(Err(Inconsistent::Torn { line }));
    }
    let n = out.len();
    for (k, chunk) in out.chunks_mut(LINE_PAYLOAD).enumerate() {
        chunk.copy_from_slice(&bytes[k * LINE + 8..k * LINE + 8 + chunk.len()]);
    }
    debug_assert_eq!(n, out.len());
    Ok(Ok(h))
}

/// What a lock-free read saw: the value, and how many reads it took.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Read {
    pub header: Header,
    pub payload: Vec<u8>,
    /// READs issued (1 when the first copy was consistent).
    pub reads: u32,
}

/// FaRM's lock-free read of one object outside a transaction: one-sided
/// READs of the whole object until a copy is consistent, at most `tries`.
pub async fn read<N: Nic>(
    ctx: &Ctx<N>,
    at: GlobalAddr,
    payload: usize,
    tries: u32,
) -> Result<Read, ObjectError> {
    check_size(payload, object_bytes(payload))?;
    let mut out = vec![0u8; payload];
    let mut last = Inconsistent::Locked;
    for n in 1..=tries.max(1) {
        let copy = ctx
            .read(at, object_bytes(payload))
            .await
            .map_err(ObjectError::Verb)?;
        match decode(copy.as_slice(), &mut out)? {
            Ok(header) => {
                return Ok(Read {
                    header,
                    payload: out,
                    reads: n,
                })
            }
            Err(why) => last = why,
        }
    }
    Err(ObjectError::Busy {
        tries: tries.max(1),
        last,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn headers_keep_their_fields_apart() {
        let h = Header::new(VERSION_MASK, INC_MASK);
        assert_eq!(
            (h.version(), h.incarnation(), h.locked()),
            (VERSION_MASK, INC_MASK, false)
        );
        assert!(h.with_lock().locked());
        assert_eq!(h.with_lock().unlocked(), h);
        assert_eq!(h.next().version(), 0, "versions wrap");
        assert_eq!(h.next().incarnation(), INC_MASK);
        let f = Header::free(7, 2);
        assert!(f.is_free() && !f.locked());
        assert!(f.next().is_free(), "next keeps the free bit");
        assert_eq!(f.after(WriteOp::Alloc), Header::new(8, 2));
        assert_eq!(
            f.after(WriteOp::Alloc).after(WriteOp::Free),
            Header::free(9, 3)
        );
        assert_eq!(Header::new(1, 0).after(WriteOp::Update), Header::new(2, 0));
        assert_eq!(f.with_lock().unlocked(), f);
        assert_eq!(lines(0), 1);
        assert_eq!(lines(56), 1);
        assert_eq!(lines(57), 2);
        assert_eq!(object_bytes(200), 256);
    }

    proptest! {
        /// Whatever the payload, an encoded object decodes to itself, and
        /// any line taken from another version (a torn copy) or a locked
        /// header is refused.
        #[test]
        fn objects_round_trip_and_torn_copies_are_refused(
            payload in proptest::collection::vec(any::<u8>(), 0..600),
            v in 0u64..1 << 40, inc in 0u64..1 << 23, line in 0usize..16,
        ) {
            let h = Header::new(v, inc);
            let mut a = vec![0u8; object_bytes(payload.len())];
            encode(h, &payload, &mut a).unwrap();
            let mut out = vec![0u8; payload.len()];
            prop_assert_eq!(decode(&a, &mut out).unwrap(), Ok(h));
            prop_assert_eq!(&out, &payload);
            let mut b = vec![0u8; a.len()];
            encode(h.next(), &payload, &mut b).unwrap();
            let k = line % lines(payload.len());
            let mut torn = a.clone();
            torn[k * LINE..(k + 1) * LINE].copy_from_slice(&b[k * LINE..(k + 1) * LINE]);
            let got = decode(&torn, &mut out).unwrap();
            if lines(payload.len()) == 1 {
                prop_assert_eq!(got, Ok(h.next()), "one line is never torn");
            } else {
                prop_assert!(got.is_err(), "a torn copy was accepted");
            }
            let mut locked = vec![0u8; a.len()];
            encode(h.with_lock(), &payload, &mut locked).unwrap();
            prop_assert_eq!(decode(&locked, &mut out).unwrap(), Err(Inconsistent::Locked));
        }
    }

    #[test]
    fn bad_sizes_are_errors() {
        let mut out = vec![0u8; 10];
        assert!(matches!(
            encode(Header::new(1, 0), &[0; 10], &mut out),
            Err(ObjectError::Size { .. })
        ));
        assert!(matches!(
            decode(&[0; 64], &mut [0; 57]),
            Err(ObjectError::Size { .. })
        ));
        let big = vec![0u8; MAX_PAYLOAD + 1];
        let mut o = vec![0u8; object_bytes(big.len())];
        assert!(encode(Header::new(1, 0), &big, &mut o).is_err());
    }
}
