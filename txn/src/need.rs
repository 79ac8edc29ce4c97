//! NEED-RECOVERY (FaRM §5.3 step 3): after a configuration change, each
//! backup of a region whose primary changed tells the new primary which
//! recovering transactions it holds COMMIT-BACKUP records of there, with
//! their writes, so the primary locks their objects before the region
//! becomes active (step 4) even where its own copy of the record never
//! arrived. Without it such a transaction could only abort: its new
//! primary held no lock for it and may have served the old values.
//!
//! A server thread writes its message with one WRITE into a slot of the
//! primary's memory that only it writes ([`crate::layout::Geometry::need_slot`]):
//!
//! ```text
//! config u64 | len u32, overflow u8, 0 u8 ×3 | crc u64 (CRC-32C of all
//! else) | body: count u32, then each record: len u32, a COMMIT-BACKUP
//! record ([`crate::records::Record`])
//! ```
//!
//! The crc tells a whole message from a torn or half-landed one. Records
//! that do not fit the slot are left out and the message says so: their
//! transactions abort as if it had not come (counted), which is safe
//! because a transaction is reported committed only once every backup
//! holds its record. For the same reason a primary that waits longer than
//! a lease for a message goes on without it.

use crate::layout::NEED_BYTES;
use crate::records::{Record, RecordError, TxId, Write};

/// Bytes before the body.
const HEADER: usize = 24;

/// A COMMIT-BACKUP record as a message carries it: the transaction,
/// every region it writes, its writes in the receiver's regions.
pub type NeedRecord = (TxId, Vec<u32>, Vec<Write>);

/// One thread's NEED-RECOVERY message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Need {
    /// The configuration it is for.
    pub config: u64,
    /// Whether records were left out for want of room.
    pub overflow: bool,
    /// (transaction, every region it writes, its writes there).
    pub records: Vec<NeedRecord>,
}

/// A slot that holds something other than a whole message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NeedError {
    /// Nothing written yet, or a message still landing (or corrupted):
    /// the checksum does not hold.
    NotWhole,
    /// A whole message that does not decode as ours.
    Bad(String),
}

impl From<RecordError> for NeedError {
    fn from(e: RecordError) -> Self {
        NeedError::Bad(e.to_string())
    }
}

fn crc(config: u64, word: u64, body: &[u8]) -> u64 {
    let c = crc32c::crc32c(&config.to_le_bytes());
    let c = crc32c::crc32c_append(c, &word.to_le_bytes());
    // Never 0, so a zeroed slot is never whole.
    (crc32c::crc32c_append(c, body) as u64) | 1 << 32
}

/// Encodes the message of configuration `config` into `out` (at most
/// [`NEED_BYTES`]); the records that fit, in order. Returns the bytes
/// used.
pub fn encode(config: u64, records: &[NeedRecord], out: &mut [u8]) -> Result<usize, RecordError> {
    let cap = out.len().min(NEED_BYTES as usize);
    let mut body = Vec::with_capacity(256);
    body.extend_from_slice(&0u32.to_le_bytes());
    let mut count = 0u32;
    let mut overflow = false;
    for (tx, regions, writes) in records {
        let r = Record::CommitBackup {
            tx: *tx,
            regions: regions.clone(),
            writes: writes.clone(),
        }
        .encode()?;
        if HEADER + body.len() + 4 + r.len() > cap {
            overflow = true;
            continue;
        }
        body.extend_from_slice(&(r.len() as u32).to_le_bytes());
        body.extend_from_slice(&r);
        count += 1;
    }
    body[..4].copy_from_slice(&count.to_le_bytes());
    let word = body.len() as u64 | (overflow as u64) << 32;
    out[..8].copy_from_slice(&config.to_le_bytes());
    out[8..16].copy_from_slice(&word.to_le_bytes());
    out[16..24].copy_from_slice(&crc(config, word, &body).to_le_bytes());
    out[HEADER..HEADER + body.len()].copy_from_slice(&body);
    Ok(HEADER + body.len())
}

/// Decodes the message in `slot` (a slot's bytes as read).
pub fn decode(slot: &[u8]) -> Result<Need, NeedError> {
    if slot.len() < HEADER {
        return Err(NeedError::NotWhole);
    }
    let word = |k: usize| u64::from_le_bytes(slot[k * 8..k * 8 + 8].try_into().expect("8 bytes"));
    let (config, w, sum) = (word(0), word(1), word(2));
    let len = (w & 0xffff_ffff) as usize;
    if len > slot.len() - HEADER {
        return Err(NeedError::NotWhole);
    }
    let body = &slot[HEADER..HEADER + len];
    if crc(config, w, body) != sum {
        return Err(NeedError::NotWhole);
    }
    if w >> 40 != 0 {
        return Err(NeedError::Bad(format!("flags {:#x}", w >> 32)));
    }
    let overflow = match (w >> 32) & 0xff {
        0 => false,
        1 => true,
        x => return Err(NeedError::Bad(format!("overflow flag {x}"))),
    };
    let take = |at: usize| -> Result<usize, NeedError> {
        let b = body.get(at..at + 4).ok_or(RecordError::Truncated {
            need: at + 4,
            have: body.len(),
        })?;
        Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
    };
    let count = take(0)?;
    let mut at = 4;
    let mut records = Vec::new();
    for _ in 0..count {
        let n = take(at)?;
        at += 4;
        let r = body.get(at..at + n).ok_or(RecordError::Truncated {
            need: at + n,
            have: body.len(),
        })?;
        at += n;
        match Record::decode(r)? {
            Record::CommitBackup {
                tx,
                regions,
                writes,
            } => records.push((tx, regions, writes)),
            r => return Err(NeedError::Bad(format!("not a COMMIT-BACKUP: {r:?}"))),
        }
    }
    if at != body.len() {
        return Err(NeedError::Bad(format!(
            "{} bytes after the last record",
            body.len() - at
        )));
    }
    Ok(Need {
        config,
        overflow,
        records,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::WriteOp;
    use crate::records::ObjAddr;

    fn rec(local: u64, bytes: usize) -> NeedRecord {
        let tx = TxId {
            config: 3,
            machine: 1,
            thread: 0,
            local,
        };
        let w = Write {
            at: ObjAddr {
                region: 2,
                offset: 64 * local,
            },
            version: 5,
            op: WriteOp::Update,
            value: vec![local as u8; bytes],
        };
        (tx, vec![2, 7], vec![w])
    }

    #[test]
    fn a_message_round_trips() {
        let recs = vec![rec(1, 8), rec(2, 100)];
        let mut slot = vec![0u8; NEED_BYTES as usize];
        let n = encode(9, &recs, &mut slot).unwrap();
        assert!(n < 400);
        let m = decode(&slot).unwrap();
        assert_eq!(m.config, 9);
        assert!(!m.overflow);
        assert_eq!(m.records, recs);
    }

    #[test]
    fn a_zeroed_or_torn_slot_is_not_whole() {
        let slot = vec![0u8; NEED_BYTES as usize];
        assert_eq!(decode(&slot), Err(NeedError::NotWhole));
        let mut slot = vec![0u8; NEED_BYTES as usize];
        let n = encode(4, &[rec(1, 8)], &mut slot).unwrap();
        for at in [0, 9, 20, n - 1] {
            let mut torn = slot.clone();
            torn[at] ^= 0x10;
            assert_eq!(decode(&torn), Err(NeedError::NotWhole), "byte {at}");
        }
        assert_eq!(decode(&slot[..10]), Err(NeedError::NotWhole));
    }

    #[test]
    fn records_that_do_not_fit_are_left_out_and_flagged() {
        let recs: Vec<_> = (0..40).map(|k| rec(k, 1000)).collect();
        let mut slot = vec![0u8; NEED_BYTES as usize];
        encode(2, &recs, &mut slot).unwrap();
        let m = decode(&slot).unwrap();
        assert!(m.overflow);
        assert!(!m.records.is_empty() && m.records.len() < recs.len());
        assert_eq!(m.records[..], recs[..m.records.len()]);
    }

    #[test]
    fn a_whole_message_of_other_records_is_refused() {
        let body = {
            let r = Record::Abort { tx: rec(1, 8).0 }.encode().unwrap();
            let mut b = 1u32.to_le_bytes().to_vec();
            b.extend_from_slice(&(r.len() as u32).to_le_bytes());
            b.extend_from_slice(&r);
            b
        };
        let word = body.len() as u64;
        let mut slot = vec![0u8; 1024];
        slot[..8].copy_from_slice(&5u64.to_le_bytes());
        slot[8..16].copy_from_slice(&word.to_le_bytes());
        slot[16..24].copy_from_slice(&crc(5, word, &body).to_le_bytes());
        slot[24..24 + body.len()].copy_from_slice(&body);
        assert!(matches!(decode(&slot), Err(NeedError::Bad(_))));
    }
}
