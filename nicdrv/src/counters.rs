//! What every task counts: round trips, doorbells, verbs by kind and bytes.
//! Exact, and independent of how noisy the machine is, so benchmarks report
//! them per operation next to the timings.

use crate::verbs::Opcode;
use std::ops::{Add, AddAssign, Sub};

/// Counters of one task slot, or summed over a core or a run.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct VerbCounters {
    /// Batches waited on: each is one network round trip of latency, however
    /// many queue pairs (doorbells) it spanned.
    pub round_trips: u64,
    /// `post_send` calls (one doorbell each).
    pub doorbells: u64,
    pub reads: u64,
    pub writes: u64,
    pub cas: u64,
    pub faa: u64,
    pub masked_cas: u64,
    /// Payload bytes of READs.
    pub bytes_read: u64,
    /// Payload bytes of WRITEs (atomics are counted by kind, not here).
    pub bytes_written: u64,
    /// Requests that completed with an error status (flushes included).
    pub errors: u64,
}

impl VerbCounters {
    pub fn verbs(&self) -> u64 {
        self.reads + self.writes + self.cas + self.faa + self.masked_cas
    }

    pub(crate) fn count(&mut self, op: Opcode, bytes: u32) {
        match op {
            Opcode::Read => {
                self.reads += 1;
                self.bytes_read += bytes as u64;
            }
            Opcode::Write => {
                self.writes += 1;
                self.bytes_written += bytes as u64;
            }
            Opcode::Cas => self.cas += 1,
            Opcode::Faa => self.faa += 1,
            Opcode::MaskedCas => self.masked_cas += 1,
        }
    }

    fn zip(self, o: Self, f: impl Fn(u64, u64) -> u64) -> Self {
        VerbCounters {
            round_trips: f(self.round_trips, o.round_trips),
            doorbells: f(self.doorbells, o.doorbells),
            reads: f(self.reads, o.reads),
            writes: f(self.writes, o.writes),
            cas: f(self.cas, o.cas),
            faa: f(self.faa, o.faa),
            masked_cas: f(self.masked_cas, o.masked_cas),
            bytes_read: f(self.bytes_read, o.bytes_read),
            bytes_written: f(self.bytes_written, o.bytes_written),
            errors: f(self.errors, o.errors),
        }
    }
}

impl Add for VerbCounters {
    type Output = Self;
    fn add(self, o: Self) -> Self {
        self.zip(o, |a, b| a + b)
    }
}

impl AddAssign for VerbCounters {
    fn add_assign(&mut self, o: Self) {
        *self = *self + o;
    }
}

impl Sub for VerbCounters {
    type Output = Self;
    /// The change between two snapshots (saturating, so a reset reads as 0).
    fn sub(self, o: Self) -> Self {
        self.zip(o, u64::saturating_sub)
    }
}
