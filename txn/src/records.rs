//! What FaRM's commit puts in the rings (FaRM §4, Figure 4): transaction
//! ids, and the records of the commit phases as bytes — the payloads of
//! [`crate::ring`] records, whose crc already guards them whole; decoding
//! checks every length against the bytes there are, so a record that is
//! not one of ours is an error, never a panic or an allocation it names.
//!
//! ```text
//! record     kind u8 | txid (16 bytes, all but TRUNCATE) | body
//! LOCK, COMMIT-BACKUP
//!            regions u16, then each region u32;
//!            objects u16, then each: region u32, offset u64, version u64,
//!                                    op u8 (update, alloc, free),
//!                                    len u32, len bytes of new value
//! COMMIT-PRIMARY, ABORT
//!            (no body)
//! TRUNCATE   count u16, then each txid (16 bytes)
//! LOCK-REPLY ok u8
//! VALIDATE   objects u16, then each: region u32, offset u64, version u64
//! ALLOC      region u32, payload bytes u32
//! NEW-REGION region u32, bytes u64, commit u8, replicas u16, then each:
//!            machine u16, base u64
//! DONE       (no body)
//! ALLOC-REPLY found u8, then (if found) offset u64, header u64
//! ```
//!
//! A ring record's payload is an [`Envelope`]: the head of the ring the
//! other way (piggybacked flow control), the transactions whose records
//! may now be truncated (piggybacked truncation), then one record:
//!
//! ```text
//! envelope   head u64 | truncate count u16 | each txid | record
//! ```

use crate::object::{Header, WriteOp};
use std::fmt;

/// FaRM's transaction id: ⟨configuration, machine, thread, local⟩, unique
/// across the cluster's life as long as each thread numbers its own.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TxId {
    pub config: u32,
    pub machine: u16,
    pub thread: u16,
    pub local: u64,
}

impl TxId {
    pub const BYTES: usize = 16;

    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.config.to_le_bytes());
        out.extend_from_slice(&self.machine.to_le_bytes());
        out.extend_from_slice(&self.thread.to_le_bytes());
        out.extend_from_slice(&self.local.to_le_bytes());
    }

    fn get(r: &mut Reader<'_>) -> Result<TxId, RecordError> {
        Ok(TxId {
            config: r.u32()?,
            machine: r.u16()?,
            thread: r.u16()?,
            local: r.u64()?,
        })
    }
}

/// Where an object lies: a region and an offset in it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjAddr {
    pub region: u32,
    pub offset: u64,
}

/// One written object of a LOCK or COMMIT-BACKUP record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    pub at: ObjAddr,
    /// The header word the transaction read (LOCK locks at it).
    pub version: u64,
    /// What the commit does to the object.
    pub op: WriteOp,
    pub value: Vec<u8>,
}

impl Write {
    /// The header the commit leaves on the object.
    pub fn new_header(&self) -> Header {
        Header(self.version).after(self.op)
    }
}

/// A record of the commit protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// To each written object's primary: lock them at the versions read.
    Lock {
        tx: TxId,
        regions: Vec<u32>,
        writes: Vec<Write>,
    },
    /// To every backup of the written regions: the new values.
    CommitBackup {
        tx: TxId,
        regions: Vec<u32>,
        writes: Vec<Write>,
    },
    /// To each primary: install, bump versions, unlock.
    CommitPrimary { tx: TxId },
    /// To each primary that locked: unlock, nothing installed.
    Abort { tx: TxId },
    /// Transactions whose records may go (lazy, piggybacked).
    Truncate { txs: Vec<TxId> },
    /// The primary's answer to LOCK or VALIDATE, through the message ring.
    LockReply { tx: TxId, ok: bool },
    /// To a primary with more objects read (and not written) than are
    /// worth a READ each: check their versions (header words) there.
    Validate {
        tx: TxId,
        objects: Vec<(ObjAddr, u64)>,
    },
    /// To a region's primary: reserve a slot for an object of `len` bytes.
    Alloc { tx: TxId, region: u32, len: u32 },
    /// The primary's answer: the slot's offset and free header, or none
    /// (the region is full).
    AllocReply { tx: TxId, slot: Option<(u64, u64)> },
    /// From the configuration manager: prepare (to the replicas: check the
    /// memory is free and zero it) or commit (to every machine: add the
    /// region to the map) a new region; answered with a LOCK-REPLY.
    NewRegion {
        tx: TxId,
        region: u32,
        bytes: u64,
        /// The primary first, then the backups: (machine, base).
        replicas: Vec<(u16, u64)>,
        commit: bool,
    },
    /// The coordinator is done: nothing more comes on this ring (servers
    /// stop once every coordinator said so).
    Done { tx: TxId },
    /// Transaction-state recovery (FaRM §5.3), from a coordinator working
    /// in configuration `tx.config` to a server thread: once drained, say
    /// what you hold of the transactions of coordinators `of` (this
    /// thread's number on those machines).
    RecoverQuery { tx: TxId, of: Vec<u16> },
    /// The server's answer, in as many records as it takes (`last` on the
    /// final one): how far it truncated each of those coordinators, and
    /// each transaction it holds records of.
    RecoverState {
        tx: TxId,
        last: bool,
        upto: Vec<(u16, u64)>,
        states: Vec<TxState>,
    },
    /// The recovery coordinator's decision on `tx`, to the machines of
    /// configuration `config`, in up to four rounds ([`Round`]): a
    /// commit's writes to every backup of the regions they write, then
    /// the decision to every machine to keep, then to act on, then to
    /// forget. So from when any machine acts on a decision until every
    /// machine has, every machine of the configuration holds it, and a
    /// failure during recovery cannot make the next round decide
    /// otherwise; and once any machine holds a commit decision, every
    /// backup of its regions holds its writes, so that whichever is
    /// promoted next locks them in lock recovery.
    Decide {
        tx: TxId,
        config: u32,
        commit: bool,
        round: Round,
        writes: Vec<Write>,
    },
}

/// A region's vote on a recovering transaction (FaRM §5.3 step 6), from
/// the records any of its replicas holds (the strongest first in this
/// order); a region none of whose replicas holds a record votes truncated
/// or unknown, which the recovery coordinator tells from the primary's
/// truncation mark.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Vote {
    /// It installed the transaction's writes (COMMIT-PRIMARY processed).
    CommitPrimary,
    /// It holds the transaction's COMMIT-BACKUP (a promoted backup).
    CommitBackup,
    /// It holds the transaction's locks (LOCK processed, nothing after).
    Lock,
}

/// What one server thread holds of one transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxState {
    pub id: TxId,
    /// Every region the transaction wrote (as its records say).
    pub regions: Vec<u32>,
    /// Its votes, for the regions whose primary it is.
    pub votes: Vec<(u32, Vote)>,
    /// The writes (with values) its records hold.
    pub writes: Vec<Write>,
    /// An earlier recovery round's decision it holds (commit or not).
    pub decided: Option<bool>,
}

const LOCK: u8 = 1;
const COMMIT_BACKUP: u8 = 2;
const COMMIT_PRIMARY: u8 = 3;
const ABORT: u8 = 4;
const TRUNCATE: u8 = 5;
const LOCK_REPLY: u8 = 6;
const VALIDATE: u8 = 7;
const ALLOC: u8 = 8;
const ALLOC_REPLY: u8 = 9;
const NEW_REGION: u8 = 10;
const DONE: u8 = 11;
const RECOVER_QUERY: u8 = 12;
const RECOVER_STATE: u8 = 13;
const DECIDE: u8 = 14;

fn vote_code(v: Vote) -> u8 {
    match v {
        Vote::CommitPrimary => 1,
        Vote::CommitBackup => 2,
        Vote::Lock => 3,
    }
}

fn vote_of(k: u8) -> Result<Vote, RecordError> {
    Ok(match k {
        1 => Vote::CommitPrimary,
        2 => Vote::CommitBackup,
        3 => Vote::Lock,
        k => return Err(RecordError::UnknownKind(k)),
    })
}

/// A recovery round a DECIDE record belongs to, in the order they are
/// sent (the discriminants are the wire encoding).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Round {
    /// A commit's writes, to the backups of the regions they write: kept
    /// as a COMMIT-BACKUP record would be (so a backup promoted later
    /// locks them in lock recovery, and votes commit-backup).
    Replicate = 2,
    /// Every machine keeps the decision, to report to any later round.
    Keep = 0,
    /// Commit (each replica installs or applies the writes, by version)
    /// or abort (locks released); the transaction's records go either
    /// way (FaRM's COMMIT-RECOVERY or ABORT-RECOVERY).
    Apply = 1,
    /// The decision itself goes (FaRM's TRUNCATE-RECOVERY): sent once
    /// every machine's APPLY landed, ahead of this in its ring, so no
    /// machine holds a record of the transaction once it is served, and
    /// no later round can find the transaction to decide it again.
    Truncate = 3,
}

fn flag(r: &mut Reader<'_>) -> Result<bool, RecordError> {
    match r.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        k => Err(RecordError::UnknownKind(k)),
    }
}

/// Why bytes are not a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordError {
    /// The bytes end before the record does.
    Truncated { need: usize, have: usize },
    /// A kind byte no record has.
    UnknownKind(u8),
    /// Bytes left after the record.
    Trailing(usize),
    /// A count or length beyond what a record may hold.
    TooMany { what: &'static str, n: usize },
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordError::Truncated { need, have } => {
                write!(f, "record cut short: {need} bytes needed, {have} there")
            }
            RecordError::UnknownKind(k) => write!(f, "unknown record kind {k}"),
            RecordError::Trailing(n) => write!(f, "{n} bytes after the record"),
            RecordError::TooMany { what, n } => write!(f, "{n} {what} in one record"),
        }
    }
}

impl std::error::Error for RecordError {}

/// Most regions or objects one record names, and most bytes of a value.
pub const MAX_ITEMS: usize = u16::MAX as usize;
pub const MAX_VALUE: usize = crate::object::MAX_PAYLOAD;

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], RecordError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let end = end.ok_or(RecordError::Truncated {
            need: self.at.saturating_add(n),
            have: self.b.len(),
        })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, RecordError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, RecordError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self) -> Result<u32, RecordError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, RecordError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
}

fn count(what: &'static str, n: usize) -> Result<u16, RecordError> {
    u16::try_from(n).map_err(|_| RecordError::TooMany { what, n })
}

fn put_body(out: &mut Vec<u8>, regions: &[u32], writes: &[Write]) -> Result<(), RecordError> {
    out.extend_from_slice(&count("regions", regions.len())?.to_le_bytes());
    for r in regions {
        out.extend_from_slice(&r.to_le_bytes());
    }
    out.extend_from_slice(&count("objects", writes.len())?.to_le_bytes());
    for w in writes {
        if w.value.len() > MAX_VALUE {
            return Err(RecordError::TooMany {
                what: "value bytes",
                n: w.value.len(),
            });
        }
        out.extend_from_slice(&w.at.region.to_le_bytes());
        out.extend_from_slice(&w.at.offset.to_le_bytes());
        out.extend_from_slice(&w.version.to_le_bytes());
        out.push(match w.op {
            WriteOp::Update => 0,
            WriteOp::Alloc => 1,
            WriteOp::Free => 2,
        });
        out.extend_from_slice(&(w.value.len() as u32).to_le_bytes());
        out.extend_from_slice(&w.value);
    }
    Ok(())
}

fn get_body(r: &mut Reader<'_>) -> Result<(Vec<u32>, Vec<Write>), RecordError> {
    // Capacities are bounded by the bytes there are, not by the counts the
    // bytes claim.
    let n = r.u16()? as usize;
    let mut regions = Vec::with_capacity(n.min(r.b.len() / 4));
    for _ in 0..n {
        regions.push(r.u32()?);
    }
    let n = r.u16()? as usize;
    let mut writes = Vec::with_capacity(n.min(r.b.len() / 24));
    for _ in 0..n {
        let at = ObjAddr {
            region: r.u32()?,
            offset: r.u64()?,
        };
        let version = r.u64()?;
        let op = match r.u8()? {
            0 => WriteOp::Update,
            1 => WriteOp::Alloc,
            2 => WriteOp::Free,
            k => return Err(RecordError::UnknownKind(k)),
        };
        let len = r.u32()? as usize;
        if len > MAX_VALUE {
            return Err(RecordError::TooMany {
                what: "value bytes",
                n: len,
            });
        }
        let value = r.take(len)?.to_vec();
        writes.push(Write {
            at,
            version,
            op,
            value,
        });
    }
    Ok((regions, writes))
}

impl Record {
    /// The record as bytes.
    pub fn encode(&self) -> Result<Vec<u8>, RecordError> {
        let mut out = Vec::with_capacity(64);
        match self {
            Record::Lock {
                tx,
                regions,
                writes,
            }
            | Record::CommitBackup {
                tx,
                regions,
                writes,
            } => {
                out.push(if matches!(self, Record::Lock { .. }) {
                    LOCK
                } else {
                    COMMIT_BACKUP
                });
                tx.put(&mut out);
                put_body(&mut out, regions, writes)?;
            }
            Record::CommitPrimary { tx } | Record::Abort { tx } | Record::Done { tx } => {
                out.push(match self {
                    Record::Abort { .. } => ABORT,
                    Record::Done { .. } => DONE,
                    _ => COMMIT_PRIMARY,
                });
                tx.put(&mut out);
            }
            Record::Truncate { txs } => {
                out.push(TRUNCATE);
                out.extend_from_slice(&count("transactions", txs.len())?.to_le_bytes());
                for t in txs {
                    t.put(&mut out);
                }
            }
            Record::LockReply { tx, ok } => {
                out.push(LOCK_REPLY);
                tx.put(&mut out);
                out.push(u8::from(*ok));
            }
            Record::Validate { tx, objects } => {
                out.push(VALIDATE);
                tx.put(&mut out);
                out.extend_from_slice(&count("objects", objects.len())?.to_le_bytes());
                for (at, version) in objects {
                    out.extend_from_slice(&at.region.to_le_bytes());
                    out.extend_from_slice(&at.offset.to_le_bytes());
                    out.extend_from_slice(&version.to_le_bytes());
                }
            }
            Record::Alloc { tx, region, len } => {
                out.push(ALLOC);
                tx.put(&mut out);
                out.extend_from_slice(&region.to_le_bytes());
                out.extend_from_slice(&len.to_le_bytes());
            }
            Record::NewRegion {
                tx,
                region,
                bytes,
                replicas,
                commit,
            } => {
                out.push(NEW_REGION);
                tx.put(&mut out);
                out.extend_from_slice(&region.to_le_bytes());
                out.extend_from_slice(&bytes.to_le_bytes());
                out.push(u8::from(*commit));
                out.extend_from_slice(&count("replicas", replicas.len())?.to_le_bytes());
                for (m, base) in replicas {
                    out.extend_from_slice(&m.to_le_bytes());
                    out.extend_from_slice(&base.to_le_bytes());
                }
            }
            Record::RecoverQuery { tx, of } => {
                out.push(RECOVER_QUERY);
                tx.put(&mut out);
                out.extend_from_slice(&count("machines", of.len())?.to_le_bytes());
                for m in of {
                    out.extend_from_slice(&m.to_le_bytes());
                }
            }
            Record::RecoverState {
                tx,
                last,
                upto,
                states,
            } => {
                out.push(RECOVER_STATE);
                tx.put(&mut out);
                out.push(u8::from(*last));
                out.extend_from_slice(&count("machines", upto.len())?.to_le_bytes());
                for (m, local) in upto {
                    out.extend_from_slice(&m.to_le_bytes());
                    out.extend_from_slice(&local.to_le_bytes());
                }
                out.extend_from_slice(&count("transactions", states.len())?.to_le_bytes());
                for st in states {
                    st.id.put(&mut out);
                    put_body(&mut out, &st.regions, &st.writes)?;
                    out.extend_from_slice(&count("votes", st.votes.len())?.to_le_bytes());
                    for (region, v) in &st.votes {
                        out.extend_from_slice(&region.to_le_bytes());
                        out.push(vote_code(*v));
                    }
                    out.push(match st.decided {
                        None => 0,
                        Some(false) => 1,
                        Some(true) => 2,
                    });
                }
            }
            Record::Decide {
                tx,
                config,
                commit,
                round,
                writes,
            } => {
                out.push(DECIDE);
                tx.put(&mut out);
                out.extend_from_slice(&config.to_le_bytes());
                out.push(u8::from(*commit));
                out.push(*round as u8);
                put_body(&mut out, &[], writes)?;
            }
            Record::AllocReply { tx, slot } => {
                out.push(ALLOC_REPLY);
                tx.put(&mut out);
                out.push(u8::from(slot.is_some()));
                if let Some((offset, header)) = slot {
                    out.extend_from_slice(&offset.to_le_bytes());
                    out.extend_from_slice(&header.to_le_bytes());
                }
            }
        }
        Ok(out)
    }

    /// Bytes as a record: every length checked, nothing left over.
    pub fn decode(bytes: &[u8]) -> Result<Record, RecordError> {
        let mut r = Reader { b: bytes, at: 0 };
        let kind = r.u8()?;
        if kind == TRUNCATE {
            let n = r.u16()? as usize;
            let mut txs = Vec::with_capacity(n.min(bytes.len() / TxId::BYTES));
            for _ in 0..n {
                txs.push(TxId::get(&mut r)?);
            }
            return match bytes.len() - r.at {
                0 => Ok(Record::Truncate { txs }),
                n => Err(RecordError::Trailing(n)),
            };
        }
        if !(LOCK..=DECIDE).contains(&kind) {
            return Err(RecordError::UnknownKind(kind));
        }
        let tx = TxId::get(&mut r)?;
        let rec = match kind {
            LOCK | COMMIT_BACKUP => {
                let (regions, writes) = get_body(&mut r)?;
                if kind == LOCK {
                    Record::Lock {
                        tx,
                        regions,
                        writes,
                    }
                } else {
                    Record::CommitBackup {
                        tx,
                        regions,
                        writes,
                    }
                }
            }
            COMMIT_PRIMARY => Record::CommitPrimary { tx },
            ABORT => Record::Abort { tx },
            DONE => Record::Done { tx },
            LOCK_REPLY => Record::LockReply {
                tx,
                ok: match r.u8()? {
                    0 => false,
                    1 => true,
                    k => return Err(RecordError::UnknownKind(k)),
                },
            },
            VALIDATE => {
                let n = r.u16()? as usize;
                let mut objects = Vec::with_capacity(n.min(bytes.len() / 20));
                for _ in 0..n {
                    let at = ObjAddr {
                        region: r.u32()?,
                        offset: r.u64()?,
                    };
                    objects.push((at, r.u64()?));
                }
                Record::Validate { tx, objects }
            }
            ALLOC => Record::Alloc {
                tx,
                region: r.u32()?,
                len: r.u32()?,
            },
            NEW_REGION => {
                let region = r.u32()?;
                let bytes_ = r.u64()?;
                let commit = match r.u8()? {
                    0 => false,
                    1 => true,
                    k => return Err(RecordError::UnknownKind(k)),
                };
                let n = r.u16()? as usize;
                let mut replicas = Vec::with_capacity(n.min(bytes.len() / 10));
                for _ in 0..n {
                    replicas.push((r.u16()?, r.u64()?));
                }
                Record::NewRegion {
                    tx,
                    region,
                    bytes: bytes_,
                    replicas,
                    commit,
                }
            }
            RECOVER_QUERY => {
                let n = r.u16()? as usize;
                let mut of = Vec::with_capacity(n.min(bytes.len() / 2));
                for _ in 0..n {
                    of.push(r.u16()?);
                }
                Record::RecoverQuery { tx, of }
            }
            RECOVER_STATE => {
                let last = flag(&mut r)?;
                let n = r.u16()? as usize;
                let mut upto = Vec::with_capacity(n.min(bytes.len() / 10));
                for _ in 0..n {
                    upto.push((r.u16()?, r.u64()?));
                }
                let n = r.u16()? as usize;
                let mut states = Vec::with_capacity(n.min(bytes.len() / TxId::BYTES));
                for _ in 0..n {
                    let id = TxId::get(&mut r)?;
                    let (regions, writes) = get_body(&mut r)?;
                    let k = r.u16()? as usize;
                    let mut votes = Vec::with_capacity(k.min(bytes.len() / 5));
                    for _ in 0..k {
                        votes.push((r.u32()?, vote_of(r.u8()?)?));
                    }
                    let decided = match r.u8()? {
                        0 => None,
                        1 => Some(false),
                        2 => Some(true),
                        k => return Err(RecordError::UnknownKind(k)),
                    };
                    states.push(TxState {
                        id,
                        regions,
                        votes,
                        writes,
                        decided,
                    });
                }
                Record::RecoverState {
                    tx,
                    last,
                    upto,
                    states,
                }
            }
            DECIDE => {
                let config = r.u32()?;
                let commit = flag(&mut r)?;
                let round = match r.u8()? {
                    0 => Round::Keep,
                    1 => Round::Apply,
                    2 => Round::Replicate,
                    3 => Round::Truncate,
                    k => return Err(RecordError::UnknownKind(k)),
                };
                let (_, writes) = get_body(&mut r)?;
                Record::Decide {
                    tx,
                    config,
                    commit,
                    round,
                    writes,
                }
            }
            ALLOC_REPLY => Record::AllocReply {
                tx,
                slot: match r.u8()? {
                    0 => None,
                    1 => Some((r.u64()?, r.u64()?)),
                    k => return Err(RecordError::UnknownKind(k)),
                },
            },
            k => return Err(RecordError::UnknownKind(k)),
        };
        match bytes.len() - r.at {
            0 => Ok(rec),
            n => Err(RecordError::Trailing(n)),
        }
    }
}

/// What every ring record carries: the piggybacked head of the reverse
/// ring, the piggybacked truncations, and the record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// How far the sender has consumed the ring the other way (0: no news).
    pub head: u64,
    pub truncate: Vec<TxId>,
    pub record: Record,
}

/// Bytes of an envelope's head word (patched in at send time).
pub const HEAD_BYTES: usize = 8;

impl Envelope {
    pub fn encode(&self) -> Result<Vec<u8>, RecordError> {
        let rec = self.record.encode()?;
        let mut out = Vec::with_capacity(HEAD_BYTES + 2 + 16 * self.truncate.len() + rec.len());
        out.extend_from_slice(&self.head.to_le_bytes());
        out.extend_from_slice(&count("truncations", self.truncate.len())?.to_le_bytes());
        for t in &self.truncate {
            t.put(&mut out);
        }
        out.extend_from_slice(&rec);
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<Envelope, RecordError> {
        let mut r = Reader { b: bytes, at: 0 };
        let head = r.u64()?;
        let n = r.u16()? as usize;
        let mut truncate = Vec::with_capacity(n.min(bytes.len() / TxId::BYTES));
        for _ in 0..n {
            truncate.push(TxId::get(&mut r)?);
        }
        let record = Record::decode(&bytes[r.at..])?;
        Ok(Envelope {
            head,
            truncate,
            record,
        })
    }

    /// Appends `record` to `to`, with the head of `back` (the ring the
    /// other way) piggybacked and no truncations, waiting for room up to
    /// `wait_ns`; returns the bytes appended.
    pub async fn send<N: nicdrv::Nic>(
        ctx: &nicdrv::Ctx<N>,
        to: &mut crate::ring::Sender,
        back: &mut crate::ring::Receiver,
        record: Record,
        wait_ns: u64,
    ) -> Result<u64, crate::TxError> {
        let head = back.head();
        let env = Envelope {
            head,
            truncate: Vec::new(),
            record,
        };
        let bytes = env.encode()?;
        to.append(ctx, &bytes, Some(ctx.now_ns() + wait_ns)).await?;
        back.told(head);
        Ok(bytes.len() as u64)
    }

    /// Sets the head word of an encoded envelope.
    pub fn patch_head(bytes: &mut [u8], head: u64) {
        bytes[..HEAD_BYTES].copy_from_slice(&head.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tx() -> impl Strategy<Value = TxId> {
        (any::<u32>(), any::<u16>(), any::<u16>(), any::<u64>()).prop_map(
            |(config, machine, thread, local)| TxId {
                config,
                machine,
                thread,
                local,
            },
        )
    }

    fn writes() -> impl Strategy<Value = Vec<Write>> {
        proptest::collection::vec(
            (
                any::<u32>(),
                any::<u64>(),
                any::<u64>(),
                0u8..3,
                proptest::collection::vec(any::<u8>(), 0..100),
            )
                .prop_map(|(region, offset, version, op, value)| Write {
                    at: ObjAddr { region, offset },
                    version,
                    op: [WriteOp::Update, WriteOp::Alloc, WriteOp::Free][op as usize],
                    value,
                }),
            0..6,
        )
    }

    fn record() -> impl Strategy<Value = Record> {
        let regions = proptest::collection::vec(any::<u32>(), 0..5);
        prop_oneof![
            (tx(), regions.clone(), writes()).prop_map(|(tx, regions, writes)| Record::Lock {
                tx,
                regions,
                writes
            }),
            (tx(), regions, writes()).prop_map(|(tx, regions, writes)| Record::CommitBackup {
                tx,
                regions,
                writes
            }),
            tx().prop_map(|tx| Record::CommitPrimary { tx }),
            tx().prop_map(|tx| Record::Abort { tx }),
            tx().prop_map(|tx| Record::Done { tx }),
            proptest::collection::vec(tx(), 0..8).prop_map(|txs| Record::Truncate { txs }),
            (tx(), any::<bool>()).prop_map(|(tx, ok)| Record::LockReply { tx, ok }),
            (
                tx(),
                proptest::collection::vec((any::<u32>(), any::<u64>(), any::<u64>()), 0..6)
            )
                .prop_map(|(tx, o)| Record::Validate {
                    tx,
                    objects: o
                        .into_iter()
                        .map(|(region, offset, v)| (ObjAddr { region, offset }, v))
                        .collect()
                }),
            (tx(), any::<u32>(), any::<u32>()).prop_map(|(tx, region, len)| Record::Alloc {
                tx,
                region,
                len
            }),
            (tx(), proptest::option::of((any::<u64>(), any::<u64>())))
                .prop_map(|(tx, slot)| Record::AllocReply { tx, slot }),
            (
                tx(),
                any::<u32>(),
                any::<u64>(),
                proptest::collection::vec((any::<u16>(), any::<u64>()), 0..4),
                any::<bool>()
            )
                .prop_map(|(tx, region, bytes, replicas, commit)| Record::NewRegion {
                    tx,
                    region,
                    bytes,
                    replicas,
                    commit
                }),
            recovery(),
        ]
    }

    fn recovery() -> impl Strategy<Value = Record> {
        let vote = prop_oneof![
            Just(Vote::CommitPrimary),
            Just(Vote::CommitBackup),
            Just(Vote::Lock)
        ];
        let state = (
            tx(),
            proptest::collection::vec(any::<u32>(), 0..4),
            proptest::collection::vec((any::<u32>(), vote), 0..4),
            writes(),
            proptest::option::of(any::<bool>()),
        )
            .prop_map(|(id, regions, votes, writes, decided)| TxState {
                id,
                regions,
                votes,
                writes,
                decided,
            });
        prop_oneof![
            (tx(), proptest::collection::vec(any::<u16>(), 0..4))
                .prop_map(|(tx, of)| Record::RecoverQuery { tx, of }),
            (
                tx(),
                any::<bool>(),
                proptest::collection::vec((any::<u16>(), any::<u64>()), 0..4),
                proptest::collection::vec(state, 0..3)
            )
                .prop_map(|(tx, last, upto, states)| Record::RecoverState {
                    tx,
                    last,
                    upto,
                    states
                }),
            (
                tx(),
                any::<u32>(),
                any::<bool>(),
                prop_oneof![
                    Just(Round::Replicate),
                    Just(Round::Keep),
                    Just(Round::Apply),
                    Just(Round::Truncate)
                ],
                writes()
            )
                .prop_map(|(tx, config, commit, round, writes)| Record::Decide {
                    tx,
                    config,
                    commit,
                    round,
                    writes
                }),
        ]
    }

    proptest! {
        /// Every record decodes to itself; every shorter prefix, and any
        /// extra byte, is an error.
        #[test]
        fn records_round_trip_and_prefixes_are_errors(rec in record(), cut in any::<usize>()) {
            let b = rec.encode().unwrap();
            prop_assert_eq!(Record::decode(&b).unwrap(), rec);
            let cut = cut % b.len();
            prop_assert!(Record::decode(&b[..cut]).is_err());
            let mut longer = b.clone();
            longer.push(0);
            prop_assert_eq!(Record::decode(&longer), Err(RecordError::Trailing(1)));
        }

        /// Envelopes round-trip with their head and truncations, a patched
        /// head reads back, and every prefix is an error.
        #[test]
        fn envelopes_round_trip(
            rec in record(), head in any::<u64>(),
            truncate in proptest::collection::vec(tx(), 0..5), cut in any::<usize>(),
        ) {
            let e = Envelope { head: 0, truncate, record: rec };
            let mut b = e.encode().unwrap();
            Envelope::patch_head(&mut b, head);
            prop_assert_eq!(Envelope::decode(&b).unwrap(), Envelope { head, ..e });
            prop_assert!(Envelope::decode(&b[..cut % b.len()]).is_err());
        }

        /// Arbitrary bytes are a record or an error, never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = Record::decode(&b);
            let _ = Envelope::decode(&b);
        }
    }

    #[test]
    fn oversized_parts_are_errors() {
        let t = TxId {
            config: 1,
            machine: 2,
            thread: 3,
            local: 4,
        };
        let big = Record::Lock {
            tx: t,
            regions: vec![],
            writes: vec![Write {
                at: ObjAddr {
                    region: 0,
                    offset: 0,
                },
                version: 0,
                op: WriteOp::Update,
                value: vec![0; MAX_VALUE + 1],
            }],
        };
        assert!(matches!(big.encode(), Err(RecordError::TooMany { .. })));
        let many = Record::Truncate {
            txs: vec![t; MAX_ITEMS + 1],
        };
        assert!(matches!(many.encode(), Err(RecordError::TooMany { .. })));
        // A count that names more objects than the bytes hold.
        let mut b = Record::Lock {
            tx: t,
            regions: vec![],
            writes: vec![],
        }
        .encode()
        .unwrap();
        let n = b.len();
        b[n - 2..].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(matches!(
            Record::decode(&b),
            Err(RecordError::Truncated { .. })
        ));
        assert_eq!(Record::decode(&[42; 17]), Err(RecordError::UnknownKind(42)));
    }
}
