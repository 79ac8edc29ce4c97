//! Where everything of a transaction cluster lies in each machine's host
//! memory, computed alike by every machine from one [`Geometry`]: the
//! rings between every coordinator thread and every machine, and the
//! replicas of the regions.
//!
//! ```text
//! words      ring heads and tails (6 words per thread per machine)
//! logs       thread t's log rings, one from each machine m: index t·M + m
//! replies    thread t's reply rings, one from each machine d: index t·M + d
//! replicas   this machine's region replicas, region_bytes each
//! leases     one 64-byte line per machine, written by it alone: word 0 its
//!            lease messages, word 1 its configuration messages
//! needs      thread t's NEED-RECOVERY slots, one from each machine m:
//!            index t·M + m, NEED_BYTES each (recovery, `crate::need`)
//! ```
//!
//! Coordinator thread t of machine m appends to the log ring (t, m) of
//! every machine d, where server thread t of d polls it; d's server thread
//! t answers through the reply ring (t, d) in m's memory. So every ring
//! has one sender and one receiver, and a server thread's log rings lie
//! side by side (one range to wait on).
//!
//! Regions: `regions_per_machine` primaries on every machine; region i
//! has its primary on machine i mod M and its f backups on the next f
//! machines (so replicas of a region are on distinct machines, and the
//! backups of consecutive primaries overlap only as f requires). Objects
//! start zeroed: header version 0, unlocked, an all-zero payload — every
//! workload's initial state is written in those terms.

use crate::regions::{Region, RegionError, RegionMap, Replica};
use crate::ring::{RingLayout, ALIGN};
use nicdrv::NodeId;
use std::fmt;

/// The shape of a transaction cluster.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Machines (each a memory node with cores), ids 0..machines.
    pub machines: u16,
    /// Coordinator threads per machine; each machine runs as many server
    /// threads.
    pub threads: u16,
    /// Backups per region (f ≥ 1; f + 1 replicas).
    pub f: usize,
    pub regions_per_machine: u32,
    /// Regions each machine can be the primary of beyond those placed at
    /// the start: memory set aside on every machine for regions created
    /// at run time.
    pub spare_regions_per_machine: u32,
    pub region_bytes: u64,
    /// Bytes at the start of every region that hold the workload's fixed
    /// tables (objects there are live from the start); the rest of the
    /// region is the allocator's, in blocks of `block_bytes`.
    pub static_bytes: u64,
    /// The allocator's block (slab) size (FaRM's is 1 MiB).
    pub block_bytes: u64,
    /// Capacity of each log ring (coordinator to machine).
    pub log_bytes: u64,
    /// Capacity of each reply ring (machine to coordinator).
    pub reply_bytes: u64,
}

/// Why a geometry was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeometryError(pub String);

impl fmt::Display for GeometryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "transaction cluster: {}", self.0)
    }
}

impl std::error::Error for GeometryError {}

impl From<RegionError> for GeometryError {
    fn from(e: RegionError) -> Self {
        GeometryError(e.to_string())
    }
}

const WORDS_PER_PAIR: u64 = 6;
const LEASE_LINE: u64 = 64;

/// Bytes of one NEED-RECOVERY slot: what a server thread tells a promoted
/// primary of the recovering transactions it backs up there. Records
/// that do not fit are left out and flagged; their transactions then
/// abort as before the message existed (see `crate::need`).
pub const NEED_BYTES: u64 = 16 << 10;

impl Geometry {
    /// Rejects shapes the layout cannot hold.
    pub fn check(&self) -> Result<(), GeometryError> {
        let bad = |s: String| Err(GeometryError(s));
        if self.machines == 0 || self.threads == 0 {
            return bad("machines and threads must be at least 1".into());
        }
        if self.f == 0 || self.f >= self.machines as usize {
            return bad(format!(
                "f = {} backups needs 1 ≤ f < machines ({})",
                self.f, self.machines
            ));
        }
        if self.regions_per_machine == 0 || self.region_bytes == 0 {
            return bad("regions_per_machine and region_bytes must be at least 1".into());
        }
        if !self.region_bytes.is_multiple_of(64) {
            return bad(format!(
                "region_bytes {} is not a multiple of 64",
                self.region_bytes
            ));
        }
        if self.static_bytes > self.region_bytes
            || !self.static_bytes.is_multiple_of(64)
            || self.block_bytes < 4096
            || !self.block_bytes.is_multiple_of(64)
            || !(self.region_bytes - self.static_bytes).is_multiple_of(self.block_bytes)
        {
            return bad(format!(
                "static_bytes {} and block_bytes {} must split region_bytes {} into 64-byte aligned tables and whole blocks of at least 4 KiB",
                self.static_bytes, self.block_bytes, self.region_bytes
            ));
        }
        for (name, cap) in [
            ("log_bytes", self.log_bytes),
            ("reply_bytes", self.reply_bytes),
        ] {
            if cap < 1024 || !cap.is_multiple_of(ALIGN) || cap > crate::ring::MAX_CAPACITY {
                return bad(format!(
                    "{name} {cap} must be a multiple of {ALIGN} in 1024 ..= {}",
                    crate::ring::MAX_CAPACITY
                ));
            }
        }
        if self.host_bytes().is_none() {
            return bad("the layout overflows".into());
        }
        Ok(())
    }

    fn pairs(&self) -> u64 {
        self.threads as u64 * self.machines as u64
    }

    fn pair(&self, thread: u16, machine: NodeId) -> u64 {
        thread as u64 * self.machines as u64 + machine as u64
    }

    fn logs_off(&self) -> u64 {
        (self.pairs() * WORDS_PER_PAIR * 8).next_multiple_of(4096)
    }

    fn replies_off(&self) -> u64 {
        self.logs_off() + self.pairs() * self.log_bytes
    }

    fn replicas_off(&self) -> u64 {
        (self.replies_off() + self.pairs() * self.reply_bytes).next_multiple_of(4096)
    }

    fn replicas_end(&self) -> Option<u64> {
        let slots = self.regions_per_machine as u64 + self.spare_regions_per_machine as u64;
        let replicas = (self.f as u64 + 1)
            .checked_mul(slots)?
            .checked_mul(self.region_bytes)?;
        self.replicas_off().checked_add(replicas)
    }

    /// Host bytes every machine needs.
    pub fn host_bytes(&self) -> Option<u64> {
        self.needs_off()?
            .checked_add(self.pairs().checked_mul(NEED_BYTES)?)
    }

    fn needs_off(&self) -> Option<u64> {
        Some(
            self.replicas_end()?
                .checked_add(self.machines as u64 * LEASE_LINE)?
                .next_multiple_of(4096),
        )
    }

    /// Where server `thread` of machine `from` writes its NEED-RECOVERY
    /// message in another machine's memory (read there by its server
    /// `thread`): one slot of [`NEED_BYTES`], one writer a slot.
    pub fn need_slot(&self, thread: u16, from: NodeId) -> u64 {
        self.needs_off().expect("checked geometry") + self.pair(thread, from) * NEED_BYTES
    }

    /// Where machine `from` writes its lease messages in every other
    /// machine's memory: word 0 of its line (one writer a line).
    pub fn lease_word(&self, from: NodeId) -> u64 {
        self.replicas_end().expect("checked geometry") + from as u64 * LEASE_LINE
    }

    /// Where machine `from` writes its configuration messages: word 1 of
    /// its lease line.
    pub fn config_word(&self, from: NodeId) -> u64 {
        self.lease_word(from) + 8
    }

    /// Where machine `from` reports a machine it cannot reach to the CM
    /// (`lease::Kind::Unreachable`): word 3 of its lease line.
    pub fn report_word(&self, from: NodeId) -> u64 {
        self.lease_word(from) + 24
    }

    /// Every machine's lease line as one range of a machine's memory (one
    /// range to wait on).
    pub fn lease_area(&self) -> (u64, u64) {
        (self.lease_word(0), self.machines as u64 * LEASE_LINE)
    }

    /// Replica slots on every machine for regions created at run time.
    pub fn spare_slots(&self) -> u64 {
        (self.f as u64 + 1) * self.spare_regions_per_machine as u64
    }

    /// The base of spare slot `k` (0..spare_slots) in a machine's memory.
    pub fn spare_base(&self, k: u64) -> u64 {
        self.replicas_off()
            + ((self.f as u64 + 1) * self.regions_per_machine as u64 + k) * self.region_bytes
    }

    /// Regions that can be created at run time (ids from [`Geometry::regions`] on).
    pub fn creatable(&self) -> u32 {
        self.spare_regions_per_machine * self.machines as u32
    }

    /// Word `k` (0..6) of the pair (thread, machine) in a machine's words.
    fn word(&self, thread: u16, machine: NodeId, k: u64) -> u64 {
        (self.pair(thread, machine) * WORDS_PER_PAIR + k) * 8
    }

    /// The log ring from coordinator `thread` of machine `from` to machine
    /// `to` (polled there by server `thread`).
    pub fn log_ring(&self, thread: u16, from: NodeId, to: NodeId) -> RingLayout {
        RingLayout {
            receiver: to,
            ring_off: self.logs_off() + self.pair(thread, from) * self.log_bytes,
            capacity: self.log_bytes,
            receiver_head_off: self.word(thread, from, 0),
            sender: from,
            sender_head_off: self.word(thread, to, 1),
            sender_tail_off: self.word(thread, to, 2),
        }
    }

    /// The reply ring from server `thread` of machine `from` to coordinator
    /// `thread` of machine `to`.
    pub fn reply_ring(&self, thread: u16, from: NodeId, to: NodeId) -> RingLayout {
        RingLayout {
            receiver: to,
            ring_off: self.replies_off() + self.pair(thread, from) * self.reply_bytes,
            capacity: self.reply_bytes,
            receiver_head_off: self.word(thread, from, 3),
            sender: from,
            sender_head_off: self.word(thread, to, 4),
            sender_tail_off: self.word(thread, to, 5),
        }
    }

    /// Server `thread`'s log rings as one range of its machine's memory.
    pub fn log_area(&self, thread: u16) -> (u64, u64) {
        (
            self.logs_off() + self.pair(thread, 0) * self.log_bytes,
            self.machines as u64 * self.log_bytes,
        )
    }

    pub fn regions(&self) -> u32 {
        self.regions_per_machine * self.machines as u32
    }

    /// Allocator blocks per region.
    pub fn blocks(&self) -> u64 {
        (self.region_bytes - self.static_bytes) / self.block_bytes
    }

    /// The region map this geometry places.
    pub fn region_map(&self) -> Result<RegionMap, GeometryError> {
        self.check()?;
        let m = self.machines as u32;
        let mut map = RegionMap::new(self.f);
        for id in 0..self.regions() {
            let rep = |j: u32| Replica {
                machine: ((id % m + j) % m) as NodeId,
                base: self.replicas_off()
                    + ((id / m) as u64 * (self.f as u64 + 1) + j as u64) * self.region_bytes,
            };
            map.add(Region {
                id,
                bytes: self.region_bytes,
                primary: rep(0),
                backups: (1..=self.f as u32).map(rep).collect(),
            })?;
        }
        Ok(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g() -> Geometry {
        Geometry {
            machines: 4,
            threads: 2,
            f: 2,
            regions_per_machine: 3,
            spare_regions_per_machine: 1,
            region_bytes: 1 << 16,
            static_bytes: 1 << 15,
            block_bytes: 1 << 12,
            log_bytes: 1 << 12,
            reply_bytes: 1 << 10,
        }
    }

    #[test]
    fn rings_and_replicas_never_overlap() {
        let g = g();
        g.check().unwrap();
        let total = g.host_bytes().unwrap();
        // Every machine's spans: (start, len).
        let mut spans: Vec<Vec<(u64, u64)>> = vec![Vec::new(); 4];
        for t in 0..2 {
            for a in 0..4 {
                for b in 0..4 {
                    for l in [g.log_ring(t, a, b), g.reply_ring(t, a, b)] {
                        l.check().unwrap();
                        spans[l.receiver as usize].push((l.ring_off, l.capacity));
                        spans[l.receiver as usize].push((l.receiver_head_off, 8));
                        spans[l.sender as usize].push((l.sender_head_off, 8));
                        spans[l.sender as usize].push((l.sender_tail_off, 8));
                    }
                }
            }
        }
        for m in 0..4 {
            spans.iter_mut().for_each(|s| s.push((g.lease_word(m), 64)));
        }
        for k in 0..g.spare_slots() {
            spans
                .iter_mut()
                .for_each(|s| s.push((g.spare_base(k), g.region_bytes)));
        }
        let map = g.region_map().unwrap();
        assert_eq!(map.len(), 12);
        for id in 0..12 {
            let r = map.get(id).unwrap();
            assert_eq!(r.primary.machine as u32, id % 4);
            for rep in std::iter::once(&r.primary).chain(&r.backups) {
                spans[rep.machine as usize].push((rep.base, r.bytes));
            }
        }
        for (m, s) in spans.iter_mut().enumerate() {
            s.sort();
            for w in s.windows(2) {
                assert!(w[0].0 + w[0].1 <= w[1].0, "machine {m}: {w:?} overlap");
            }
            let last = s.last().unwrap();
            assert!(last.0 + last.1 <= total);
        }
        // A server thread's log rings lie in its one area.
        let (off, len) = g.log_area(1);
        for from in 0..4 {
            let l = g.log_ring(1, from, 2);
            assert!(l.ring_off >= off && l.ring_off + l.capacity <= off + len);
        }
    }

    #[test]
    fn bad_geometries_are_refused() {
        for bad in [
            Geometry { f: 0, ..g() },
            Geometry { f: 4, ..g() },
            Geometry { machines: 0, ..g() },
            Geometry {
                log_bytes: 1000,
                ..g()
            },
            Geometry {
                region_bytes: 100,
                ..g()
            },
            Geometry {
                region_bytes: u64::MAX / 2,
                ..g()
            },
            Geometry {
                static_bytes: 1 << 17,
                ..g()
            },
            Geometry {
                block_bytes: 3000,
                ..g()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }
}
