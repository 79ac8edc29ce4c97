//! FaRM's regions as every machine caches them (FaRM §3): a region is a
//! span of memory replicated on one primary and `f` backups on distinct
//! machines, and an object is addressed by (region, offset). The map says
//! where each replica of a region lies, so an object's address becomes a
//! one-sided verb's [`GlobalAddr`] on its primary (for reads, LOCK's
//! target) or on each backup (COMMIT-BACKUP's). The map starts as a
//! [`crate::layout::Geometry`] places it; regions created at run time
//! (the configuration manager's two-phase exchange with their replicas,
//! [`crate::coord::Coordinator::create_region`]) join every machine's map
//! at the exchange's commit.

use crate::object::LINE;
use crate::records::ObjAddr;
use nicdrv::{GlobalAddr, NodeId};
use std::collections::BTreeMap;
use std::fmt;

/// Where one replica of a region lies: its machine (memory node) and the
/// region's first byte there.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    pub machine: NodeId,
    pub base: u64,
}

/// One region: its size and replicas, the primary first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    pub id: u32,
    pub bytes: u64,
    pub primary: Replica,
    pub backups: Vec<Replica>,
}

/// Why a region or an address was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegionError {
    /// No region of this id is in the map.
    NoSuchRegion(u32),
    /// The id is in the map already.
    Duplicate(u32),
    /// Fewer backups than the map's replication asks for, or more.
    Replication {
        id: u32,
        backups: usize,
        want: usize,
    },
    /// Two replicas of one region on one machine (one failure would take
    /// both).
    SameMachine { id: u32, machine: NodeId },
    /// An empty region, or one whose end overflows.
    Size { id: u32, bytes: u64 },
    /// An object beyond its region's end.
    OutOfRegion { at: ObjAddr, len: u64, bytes: u64 },
    /// An object that does not start on a line, as every object does (its
    /// header is a line's first word).
    Misaligned(ObjAddr),
}

impl fmt::Display for RegionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionError::NoSuchRegion(id) => write!(f, "region {id} does not exist"),
            RegionError::Duplicate(id) => write!(f, "region {id} exists already"),
            RegionError::Replication { id, backups, want } => write!(
                f,
                "region {id} has {backups} backups; this cluster replicates to {want}"
            ),
            RegionError::SameMachine { id, machine } => {
                write!(f, "region {id} has two replicas on machine {machine}")
            }
            RegionError::Size { id, bytes } => write!(f, "region {id} of {bytes} bytes"),
            RegionError::OutOfRegion { at, len, bytes } => write!(
                f,
                "{len} bytes at offset {} of region {} pass its end ({bytes} bytes)",
                at.offset, at.region
            ),
            RegionError::Misaligned(at) => write!(
                f,
                "offset {} of region {} is not on a {LINE}-byte line, where objects start",
                at.offset, at.region
            ),
        }
    }
}

impl std::error::Error for RegionError {}

/// A machine's cached region map, shared by its threads: read on every
/// operation, written when a region is created.
pub type SharedMap = std::sync::Arc<std::sync::RwLock<RegionMap>>;

/// The region map: every region's replicas, with `f` backups each (fewer
/// only after failures left no machine to take a lost one's place).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionMap {
    f: usize,
    regions: BTreeMap<u32, Region>,
    /// Regions this machine serves as a replica but coordinators may not
    /// use yet (a region being created: prepared, not yet committed).
    hidden: std::collections::BTreeSet<u32>,
}

impl RegionMap {
    /// An empty map for regions with `f` backups each (FaRM uses f ≥ 1:
    /// 3-way replication is f = 2).
    pub fn new(f: usize) -> RegionMap {
        RegionMap {
            f,
            regions: BTreeMap::new(),
            hidden: Default::default(),
        }
    }

    pub fn backups_per_region(&self) -> usize {
        self.f
    }

    /// Adds a region, checked: a new id, exactly `f` backups, every
    /// replica on its own machine, a size whose end fits every replica's
    /// addresses.
    pub fn add(&mut self, r: Region) -> Result<(), RegionError> {
        self.insert(r, self.f)
    }

    /// Adds a region of a later configuration's map, checked as [`add`]
    /// does except that it may have fewer backups than `f` (none at the
    /// least): a region whose lost replicas no surviving machine could
    /// take runs on with the ones left (FaRM §5.3: available while one
    /// replica of each region survives).
    ///
    /// [`add`]: RegionMap::add
    pub fn add_remapped(&mut self, r: Region) -> Result<(), RegionError> {
        self.insert(r, 0)
    }

    /// The regions with fewer than `f` backups.
    pub fn short_of_backups(&self) -> impl Iterator<Item = &Region> {
        self.regions.values().filter(|r| r.backups.len() < self.f)
    }

    /// [`add`](RegionMap::add), with `least` to `f` backups allowed.
    fn insert(&mut self, r: Region, least: usize) -> Result<(), RegionError> {
        if self.regions.contains_key(&r.id) {
            return Err(RegionError::Duplicate(r.id));
        }
        if r.backups.len() > self.f || r.backups.len() < least {
            return Err(RegionError::Replication {
                id: r.id,
                backups: r.backups.len(),
                want: self.f,
            });
        }
        let all: Vec<&Replica> = std::iter::once(&r.primary).chain(&r.backups).collect();
        for (i, a) in all.iter().enumerate() {
            if all[..i].iter().any(|b| b.machine == a.machine) {
                return Err(RegionError::SameMachine {
                    id: r.id,
                    machine: a.machine,
                });
            }
            // A global address holds 48 bits of offset.
            let end = a.base.checked_add(r.bytes);
            if r.bytes == 0 || end.is_none_or(|e| e > 1 << 48) {
                return Err(RegionError::Size {
                    id: r.id,
                    bytes: r.bytes,
                });
            }
        }
        self.regions.insert(r.id, r);
        Ok(())
    }

    /// Adds a region its replicas serve before coordinators may use it.
    pub fn add_hidden(&mut self, r: Region) -> Result<(), RegionError> {
        let id = r.id;
        self.add(r)?;
        self.hidden.insert(id);
        Ok(())
    }

    /// Lets coordinators use a hidden region; whether it was hidden.
    pub fn reveal(&mut self, id: u32) -> bool {
        self.hidden.remove(&id)
    }

    /// Whether coordinators may use region `id` (it exists, not hidden).
    pub fn visible(&self, id: u32) -> Result<(), RegionError> {
        if self.hidden.contains(&id) {
            return Err(RegionError::NoSuchRegion(id));
        }
        self.get(id).map(|_| ())
    }

    pub fn get(&self, id: u32) -> Result<&Region, RegionError> {
        self.regions.get(&id).ok_or(RegionError::NoSuchRegion(id))
    }

    pub fn len(&self) -> usize {
        self.regions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    /// Every region, by id.
    pub fn iter(&self) -> impl Iterator<Item = &Region> {
        self.regions.values()
    }

    /// The regions whose primary is `machine` (what its cores lock and
    /// install).
    pub fn primary_of(&self, machine: NodeId) -> impl Iterator<Item = &Region> {
        self.regions
            .values()
            .filter(move |r| r.primary.machine == machine)
    }

    fn check(&self, at: ObjAddr, len: u64) -> Result<&Region, RegionError> {
        let r = self.get(at.region)?;
        if at.offset.checked_add(len).is_none_or(|e| e > r.bytes) {
            return Err(RegionError::OutOfRegion {
                at,
                len,
                bytes: r.bytes,
            });
        }
        // A record naming an object off a line would make a local CAS or
        // load fault on the primary or backup (misaligned), and could
        // name a word inside another object.
        if !at.offset.is_multiple_of(LINE as u64) {
            return Err(RegionError::Misaligned(at));
        }
        Ok(r)
    }

    /// The object of `len` bytes at `at` on its primary.
    pub fn on_primary(&self, at: ObjAddr, len: u64) -> Result<GlobalAddr, RegionError> {
        let r = self.check(at, len)?;
        Ok(GlobalAddr::host(
            r.primary.machine,
            r.primary.base + at.offset,
        ))
    }

    /// The object of `len` bytes at `at` in the backup replica on
    /// `machine`, if that machine backs its region up.
    pub fn on_backup(
        &self,
        at: ObjAddr,
        len: u64,
        machine: NodeId,
    ) -> Result<Option<GlobalAddr>, RegionError> {
        let r = self.check(at, len)?;
        Ok(r.backups
            .iter()
            .find(|b| b.machine == machine)
            .map(|b| GlobalAddr::host(b.machine, b.base + at.offset)))
    }

    /// Whether `machine` backs up the region of the object of `len` bytes
    /// at `at` (and the object lies in it).
    pub fn backs_up(&self, at: ObjAddr, len: u64, machine: NodeId) -> bool {
        matches!(self.on_backup(at, len, machine), Ok(Some(_)))
    }

    /// The object of `len` bytes at `at` on each backup, in the map's
    /// order.
    pub fn on_backups(&self, at: ObjAddr, len: u64) -> Result<Vec<GlobalAddr>, RegionError> {
        let r = self.check(at, len)?;
        Ok(r.backups
            .iter()
            .map(|b| GlobalAddr::host(b.machine, b.base + at.offset))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rep(machine: NodeId, base: u64) -> Replica {
        Replica { machine, base }
    }

    fn region(id: u32, primary: NodeId, backups: &[NodeId]) -> Region {
        Region {
            id,
            bytes: 1 << 20,
            primary: rep(primary, 4 << 20),
            backups: backups.iter().map(|&m| rep(m, 8 << 20)).collect(),
        }
    }

    #[test]
    fn objects_map_to_their_primary_and_backups() {
        let mut m = RegionMap::new(2);
        m.add(region(7, 0, &[1, 2])).unwrap();
        m.add(region(8, 1, &[2, 0])).unwrap();
        let at = ObjAddr {
            region: 7,
            offset: 4096,
        };
        assert_eq!(
            m.on_primary(at, 64).unwrap(),
            GlobalAddr::host(0, (4 << 20) + 4096)
        );
        assert_eq!(
            m.on_backups(at, 64).unwrap(),
            [
                GlobalAddr::host(1, (8 << 20) + 4096),
                GlobalAddr::host(2, (8 << 20) + 4096)
            ]
        );
        assert_eq!(m.primary_of(1).map(|r| r.id).collect::<Vec<_>>(), [8]);
        assert_eq!(m.len(), 2);
    }

    /// A fresh region takes exactly f backups; a remapped one (after
    /// failures) fewer too, never more, and the map says which are short.
    #[test]
    fn only_remapped_regions_may_have_fewer_backups() {
        let mut m = RegionMap::new(2);
        let short = Err(RegionError::Replication {
            id: 1,
            backups: 1,
            want: 2,
        });
        assert_eq!(m.add(region(1, 0, &[1])), short);
        m.add_remapped(region(1, 0, &[1])).unwrap();
        m.add_remapped(region(2, 0, &[])).unwrap();
        m.add_remapped(region(3, 0, &[1, 2])).unwrap();
        assert!(matches!(
            m.add_remapped(region(4, 0, &[1, 2, 3])),
            Err(RegionError::Replication { backups: 3, .. })
        ));
        assert_eq!(
            m.add_remapped(region(5, 0, &[0])),
            Err(RegionError::SameMachine { id: 5, machine: 0 })
        );
        let ids: Vec<u32> = m.short_of_backups().map(|r| r.id).collect();
        assert_eq!(ids, [1, 2]);
        // A region with no backup left is served from its primary alone.
        let at = ObjAddr {
            region: 2,
            offset: 64,
        };
        assert_eq!(m.on_backups(at, 64), Ok(vec![]));
        assert!(m.on_primary(at, 64).is_ok());
    }

    #[test]
    fn bad_regions_and_addresses_are_errors() {
        let mut m = RegionMap::new(1);
        m.add(region(1, 0, &[1])).unwrap();
        assert_eq!(m.add(region(1, 2, &[3])), Err(RegionError::Duplicate(1)));
        assert_eq!(
            m.add(region(2, 0, &[1, 2])),
            Err(RegionError::Replication {
                id: 2,
                backups: 2,
                want: 1
            })
        );
        assert_eq!(
            m.add(region(3, 4, &[4])),
            Err(RegionError::SameMachine { id: 3, machine: 4 })
        );
        let mut empty = region(4, 0, &[1]);
        empty.bytes = 0;
        assert!(matches!(m.add(empty), Err(RegionError::Size { .. })));
        let mut huge = region(5, 0, &[1]);
        huge.bytes = u64::MAX;
        assert!(matches!(m.add(huge), Err(RegionError::Size { .. })));
        let nowhere = ObjAddr {
            region: 9,
            offset: 0,
        };
        assert_eq!(m.on_primary(nowhere, 8), Err(RegionError::NoSuchRegion(9)));
        let past = ObjAddr {
            region: 1,
            offset: (1 << 20) - 64,
        };
        assert!(m.on_primary(past, 64).is_ok());
        assert!(matches!(
            m.on_backups(past, 128),
            Err(RegionError::OutOfRegion { .. })
        ));
        // Objects start on lines: a record naming a word inside one is
        // refused, on the primary and the backups alike.
        for offset in [8, 4096 + 60, (1 << 20) - 8] {
            let off_line = ObjAddr { region: 1, offset };
            assert_eq!(
                m.on_primary(off_line, 8),
                Err(RegionError::Misaligned(off_line))
            );
            assert_eq!(
                m.on_backup(off_line, 8, 1),
                Err(RegionError::Misaligned(off_line))
            );
            assert!(!m.backs_up(off_line, 8, 1));
        }
        let wrap = ObjAddr {
            region: 1,
            offset: u64::MAX,
        };
        assert!(matches!(
            m.on_primary(wrap, 8),
            Err(RegionError::OutOfRegion { .. })
        ));
        assert_eq!(m.len(), 1, "refused regions left no trace");
    }

    #[test]
    fn hidden_regions_are_served_but_not_visible_until_revealed() {
        let mut m = RegionMap::new(1);
        m.add_hidden(region(3, 0, &[1])).unwrap();
        assert!(m.get(3).is_ok(), "replicas serve it");
        assert_eq!(m.visible(3), Err(RegionError::NoSuchRegion(3)));
        assert!(m.reveal(3));
        assert_eq!(m.visible(3), Ok(()));
        assert!(!m.reveal(3));
        assert_eq!(m.visible(4), Err(RegionError::NoSuchRegion(4)));
    }
}
