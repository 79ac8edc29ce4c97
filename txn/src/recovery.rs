//! A machine's side of a configuration change (FaRM §5.2 step 4 applied,
//! §5.3–§5.5): the region map it moves to, the fence of its coordinators'
//! batches, lock recovery's locks, the allocator recovery of the regions
//! it became primary of, and the re-replication of the regions it became
//! a new backup of.
//!
//! The reconfiguration task calls [`Machine::apply`] as it installs a
//! configuration, before its NEW-CONFIG-ACK (or, as the CM, before its
//! NEW-CONFIG-COMMIT): the machine computes the next region map with
//! [`crate::reconfig::remap`] — every machine computes the same one from
//! the same map and configuration — zeroes the spare slots it will hold
//! new backups in, marks the regions it became primary of as recovering
//! in its allocator (no ALLOC there until their free lists are back) and
//! swaps the map in. Its servers serve the new map from then on, and its
//! coordinators once the configuration is committed
//! ([`crate::lease::Membership::committed`]), so by the time any
//! coordinator sends a COMMIT-BACKUP to a new backup, that backup already
//! serves the region.
//!
//! [`Machine::maintain`] is the background work, paced, on a core of its
//! own: allocator recovery ([`crate::alloc::recover_region`]) of each
//! promoted region, then re-replication of each new backup by one-sided
//! READs of the primary's copy, a chunk at a time. A line is copied only
//! when the primary's is of a later version than the local one (or of
//! the same version with other bytes: the local copy is fresh), so data a
//! truncation applied here meanwhile is never overwritten by older data;
//! truncations of the region being copied and the copy's writes exclude
//! each other ([`Machine::copy_guard`]).
//!
//! Transaction-state recovery (§5.3) spans this module (the fence, the
//! lock-recovery locks and words, FaRM's decision rule [`decide`]), the
//! servers (drain, lock recovery, votes, decisions applied) and the
//! coordinators (the recovery round); `docs/architecture.md` walks
//! through it.

use crate::alloc::{recover_region, Pace, SharedAllocator};
use crate::config::Stored;
use crate::error::TxError;
use crate::layout::Geometry;
use crate::lease::Membership;
use crate::object::{Header, LINE};
use crate::records::{ObjAddr, TxId, Vote};
use crate::regions::{RegionMap, Replica, SharedMap};
use nicdrv::{Ctx, GlobalAddr, Nic, NodeId};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// How fast a new backup copies its region: `bytes` per READ, then a
/// pause of `pause_ns` (FaRM interleaves its re-replication reads with
/// pauses so foreground work suffers little).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CopyPace {
    pub bytes: u64,
    pub pause_ns: u64,
}

impl Default for CopyPace {
    /// 8 KiB a READ (FaRM's re-replication read size), one every 20 µs:
    /// 400 MB/s a machine.
    fn default() -> Self {
        CopyPace {
            bytes: 8 << 10,
            pause_ns: 20_000,
        }
    }
}

/// A region this machine became a new backup of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewBackup {
    pub region: u32,
    pub bytes: u64,
    /// Its primary in the new configuration (where the copy comes from).
    pub primary: Replica,
    /// Where this machine's copy lies.
    pub base: u64,
}

/// What one configuration change meant to this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub config: u64,
    pub at_ns: u64,
    /// Machines of the previous configuration not in this one.
    pub removed: Vec<NodeId>,
    /// Regions this machine became primary of.
    pub promoted: Vec<u32>,
    /// Regions this machine became a backup of.
    pub new_backups: Vec<NewBackup>,
    /// Regions of the new map with fewer than f backups: no machine left
    /// could take a lost replica's place, so they run on with fewer.
    pub short_of_backups: Vec<u32>,
}

/// Background work done for a change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Work {
    /// A promoted region's free lists are rebuilt and installed.
    AllocatorRecovered {
        region: u32,
        started_ns: u64,
        at_ns: u64,
        slots: u64,
        allocated: u64,
    },
    /// A new backup's copy is complete: the region has f + 1 replicas
    /// again (as far as this backup goes).
    Copied {
        region: u32,
        started_ns: u64,
        at_ns: u64,
        bytes: u64,
        /// Lines written (the rest were as new here already).
        lines: u64,
    },
    /// Work that could not be done (its primary failed meanwhile, say).
    Failed {
        region: u32,
        at_ns: u64,
        error: String,
    },
}

impl Work {
    pub fn at_ns(&self) -> u64 {
        match self {
            Work::AllocatorRecovered { at_ns, .. }
            | Work::Copied { at_ns, .. }
            | Work::Failed { at_ns, .. } => *at_ns,
        }
    }
}

/// One machine's state across configuration changes, shared by its
/// reconfiguration task, its background task, its servers and its
/// coordinators.
pub struct Machine {
    pub geo: Geometry,
    pub membership: Arc<Membership>,
    pub map: SharedMap,
    pub alloc: SharedAllocator,
    alloc_pace: Pace,
    copy_pace: CopyPace,
    changes: Mutex<Vec<Change>>,
    /// The configuration the map is of.
    applied: AtomicU64,
    /// Regions being copied here; truncations applying to them hold it.
    copying: Mutex<BTreeSet<u32>>,
    /// How many regions `copying` holds, for a cheap look.
    copies: AtomicUsize,
    /// Regions this machine became a new backup of whose copy has not
    /// ended whole (being copied, or cut off and waiting to start over).
    unfinished: Mutex<BTreeSet<u32>>,
    /// The map before the last change, and the configuration it was of:
    /// records of that configuration still drain against it.
    previous: Mutex<Option<(u64, Arc<RegionMap>)>>,
    /// Batches of records this machine's coordinators have posted and
    /// not seen complete (the fence before NEW-CONFIG-ACK).
    inflight: AtomicUsize,
    /// Objects of promoted regions locked by lock recovery, with the
    /// recovering transactions that hold them.
    rlocks: Mutex<HashMap<ObjAddr, Vec<TxId>>>,
    /// Per configuration, server threads done with drain and lock
    /// recovery, and when the last was (executor time).
    recovered: Mutex<BTreeMap<u64, (u16, Option<u64>)>>,
    /// Server threads that never served (their `Server::open` failed):
    /// counted as drained and recovered for every configuration.
    gone: std::sync::atomic::AtomicU16,
    /// Per server thread, the configuration it drained into (`u64::MAX`
    /// once it ended): lock recovery waits until every thread drained,
    /// so no thread still applies an old record into a promoted copy.
    drained: Mutex<Vec<u64>>,
}

/// A batch of records posted in configuration `config` (see
/// [`Machine::enter`]); dropped once it completed.
pub struct Fence {
    machine: Arc<Machine>,
}

impl Drop for Fence {
    fn drop(&mut self) {
        // Release: the batch's completion is before a quiesce that sees
        // the count drop.
        self.machine.inflight.fetch_sub(1, Ordering::Release);
    }
}

/// A region primary's ballot on a recovering transaction: its vote, or
/// (no record there) truncated or unknown.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Ballot {
    Vote(Vote),
    Truncated,
    Unknown,
}

/// FaRM's decision (§5.3 step 7), over one ballot per region the
/// transaction wrote: commit if any region's primary installed it, or if
/// some holds its COMMIT-BACKUP and every other holds it locked, holds
/// its COMMIT-BACKUP, or truncated it; abort otherwise. A COMMIT-BACKUP
/// is sent only after every lock is held and every read validated, so a
/// commit-backup ballot means the commit point could have been reached.
pub fn decide(ballots: &[Ballot]) -> bool {
    let has = |v: Vote| ballots.contains(&Ballot::Vote(v));
    if has(Vote::CommitPrimary) {
        return true;
    }
    has(Vote::CommitBackup)
        && ballots.iter().all(|b| {
            matches!(
                b,
                Ballot::Vote(Vote::CommitBackup | Vote::Lock) | Ballot::Truncated
            )
        })
}

/// Where machine `m` says, in its own memory, through which
/// configuration its servers drained and recovered locks: word 2 of its
/// own lease line (which no other machine writes).
pub fn recovered_word(geo: &Geometry, m: NodeId) -> u64 {
    geo.lease_word(m) + 16
}

impl Machine {
    /// Machine `membership.me` with its map and allocator, in the
    /// configuration `membership` holds, its background work paced by
    /// default.
    pub fn new(
        geo: Geometry,
        membership: Arc<Membership>,
        map: SharedMap,
        alloc: SharedAllocator,
    ) -> Arc<Machine> {
        Machine::paced(
            geo,
            membership,
            map,
            alloc,
            Pace::default(),
            CopyPace::default(),
        )
    }

    /// As [`Machine::new`], its allocator recovery and copies paced so.
    pub fn paced(
        geo: Geometry,
        membership: Arc<Membership>,
        map: SharedMap,
        alloc: SharedAllocator,
        alloc_pace: Pace,
        copy_pace: CopyPace,
    ) -> Arc<Machine> {
        let applied = AtomicU64::new(membership.epoch());
        Arc::new(Machine {
            geo,
            membership,
            map,
            alloc,
            alloc_pace,
            copy_pace,
            changes: Mutex::new(Vec::new()),
            applied,
            copies: AtomicUsize::new(0),
            copying: Mutex::new(BTreeSet::new()),
            unfinished: Mutex::new(BTreeSet::new()),
            previous: Mutex::new(None),
            inflight: AtomicUsize::new(0),
            rlocks: Mutex::new(HashMap::new()),
            recovered: Mutex::new(BTreeMap::new()),
            gone: std::sync::atomic::AtomicU16::new(0),
            drained: Mutex::new(vec![0; geo.threads as usize]),
        })
    }

    /// A coordinator about to post a batch of records of configuration
    /// `config`: counted until the returned fence drops, or none if the
    /// machine moved on (the batch must not go). With the count, the
    /// reconfiguration task's [`Machine::quiesce`] knows every record of
    /// the old configuration landed before it acknowledges the new one,
    /// so every such record is in its ring before any machine drains.
    pub fn enter(self: &Arc<Machine>, config: u64) -> Option<Fence> {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        // SeqCst fence: with quiesce's, either this load sees the new
        // configuration or quiesce's load sees this count (the
        // store-buffering pattern; both sides fence).
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.membership.epoch() != config {
            self.inflight.fetch_sub(1, Ordering::Release);
            return None;
        }
        Some(Fence {
            machine: self.clone(),
        })
    }

    /// After installing a configuration: waits (up to `wait_ns`) until no
    /// batch of the old one is in flight here; whether none is.
    pub async fn quiesce<N: Nic>(&self, ctx: &Ctx<N>, wait_ns: u64) -> bool {
        std::sync::atomic::fence(Ordering::SeqCst);
        let deadline = ctx.now_ns() + wait_ns;
        loop {
            // Acquire: pairs with the fences' Release decrements.
            if self.inflight.load(Ordering::Acquire) == 0 {
                return true;
            }
            if ctx.now_ns() >= deadline {
                return false;
            }
            match ctx.sleep(QUIESCE_POLL_NS) {
                Ok(s) => s.await,
                Err(_) => return false,
            }
        }
    }

    /// The map of configuration `config` if it is the one before the
    /// current (records of it may still drain).
    pub fn previous_map(&self, config: u64) -> Option<Arc<RegionMap>> {
        let p = self.previous.lock().expect("no panics hold it");
        p.as_ref().filter(|p| p.0 == config).map(|p| p.1.clone())
    }

    /// Lock recovery of `at` (a promoted region's object, at local offset
    /// `off`) for recovering transaction `tx`: the first holder locks the
    /// header.
    pub fn rlock<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        at: ObjAddr,
        off: u64,
        tx: TxId,
    ) -> Result<(), TxError> {
        let mut r = self.rlocks.lock().expect("no panics hold it");
        let holders = r.entry(at).or_default();
        if holders.contains(&tx) {
            return Ok(());
        }
        holders.push(tx);
        if holders.len() == 1 {
            lock_header(ctx, off)?;
        }
        Ok(())
    }

    /// Releases `tx`'s recovery lock of `at`, if it held one, and runs
    /// `f(held, left)` (whether it held one; how many holders are left)
    /// under the lock table's mutex: every change to a recovery-locked
    /// header happens under it, so a header locked while `left == 0` and
    /// `!held` is locked by something other than lock recovery, and one
    /// with holders left stays locked until the last of them unlocks it.
    pub fn runlock_with<R>(&self, at: ObjAddr, tx: TxId, f: impl FnOnce(bool, usize) -> R) -> R {
        let mut r = self.rlocks.lock().expect("no panics hold it");
        let Some(holders) = r.get_mut(&at) else {
            return f(false, 0);
        };
        let Some(i) = holders.iter().position(|t| *t == tx) else {
            return f(false, holders.len());
        };
        holders.swap_remove(i);
        let left = holders.len();
        if left == 0 {
            r.remove(&at);
        }
        f(true, left)
    }

    /// Server thread `thread` drained every record of configurations
    /// before `config` (or ended: `u64::MAX`).
    pub fn server_drained(&self, thread: u16, config: u64) {
        let mut d = self.drained.lock().expect("no panics hold it");
        if let Some(x) = d.get_mut(thread as usize) {
            *x = (*x).max(config);
        }
    }

    /// Whether every server thread drained into `config` or later.
    pub fn all_drained(&self, config: u64) -> bool {
        let d = self.drained.lock().expect("no panics hold it");
        d.iter().all(|&x| x >= config)
    }

    /// When every server thread had drained and recovered its locks, per
    /// configuration (its regions were active from then on).
    pub fn recovered_at(&self) -> Vec<(u64, u64)> {
        let r = self.recovered.lock().expect("no panics hold it");
        r.iter().filter_map(|(c, n)| Some((*c, n.1?))).collect()
    }

    /// Whether region `region`'s transactions are settled for allocator
    /// recovery after configuration `config` (see `recover_allocator`).
    fn settled(&self, region: u32, config: u64) -> bool {
        let recovered = {
            let r = self.recovered.lock().expect("no panics hold it");
            r.range(config..).any(|(_, n)| n.1.is_some())
        };
        recovered
            && !self
                .rlocks
                .lock()
                .expect("no panics hold it")
                .keys()
                .any(|a| a.region == region)
    }

    /// Objects still held by lock recovery.
    pub fn rlocked(&self) -> usize {
        self.rlocks.lock().expect("no panics hold it").len()
    }

    /// Server thread done with configuration `config`'s drain and lock
    /// recovery; the last of the machine's threads says so in its memory
    /// ([`recovered_word`]), where coordinators look before they use the
    /// configuration.
    pub fn server_recovered<N: Nic>(&self, ctx: &Ctx<N>, config: u64) -> Result<(), TxError> {
        let mut r = self.recovered.lock().expect("no panics hold it");
        // Relaxed: written only under the `recovered` mutex, held here. A
        // thread is counted gone when it fails to open, before the
        // configuration changes it would have recovered.
        let gone = self.gone.load(Ordering::Relaxed);
        let n = r.entry(config).or_default();
        n.0 += 1;
        if n.0 + gone == self.geo.threads {
            n.1 = Some(ctx.now_ns());
            let off = recovered_word(&self.geo, self.me());
            let l = ctx.local();
            if l.load(off)? < config {
                l.store(off, config)?;
            }
        }
        Ok(())
    }

    /// Server thread `thread` will never serve (its `Server::open`
    /// failed): the machine's other threads wait for neither its drain nor
    /// its lock recovery at a configuration change.
    pub fn server_gone(&self, thread: u16) {
        self.server_drained(thread, u64::MAX);
        let _r = self.recovered.lock().expect("no panics hold it");
        // Relaxed: read and written under the `recovered` mutex held here.
        self.gone.fetch_add(1, Ordering::Relaxed);
    }

    pub fn me(&self) -> NodeId {
        self.membership.me
    }

    /// The configuration the region map is of.
    pub fn applied(&self) -> u64 {
        // Acquire: pairs with apply's Release, so the map read after it
        // is at least that configuration's.
        self.applied.load(Ordering::Acquire)
    }

    /// Every change applied, oldest first.
    pub fn changes(&self) -> Vec<Change> {
        self.changes.lock().expect("no panics hold it").clone()
    }

    /// Moves the machine to configuration `s` (installed in its
    /// membership): the next region map, the new backups' slots zeroed,
    /// promoted regions' allocators held, the map swapped in. A
    /// configuration not newer than the map's changes nothing (`None`).
    pub fn apply<N: Nic>(&self, ctx: &Ctx<N>, s: &Stored) -> Result<Option<Change>, TxError> {
        let me = self.me();
        let mut map = self.map.write().expect("no panics hold the map");
        if s.config.id <= self.applied.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let next = next_map(&self.geo, &map, s)?;
        let had = |r: u32, m: NodeId| {
            map.get(r).is_ok_and(|r| {
                std::iter::once(&r.primary)
                    .chain(&r.backups)
                    .any(|x| x.machine == m)
            })
        };
        let mut change = Change {
            config: s.config.id,
            at_ns: ctx.now_ns(),
            removed: map
                .iter()
                .flat_map(|r| std::iter::once(&r.primary).chain(&r.backups))
                .map(|x| x.machine)
                .filter(|&m| !s.config.contains(m))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
            promoted: Vec::new(),
            new_backups: Vec::new(),
            short_of_backups: next.short_of_backups().map(|r| r.id).collect(),
        };
        let unfinished = self.unfinished.lock().expect("no panics hold it");
        for r in next.iter() {
            let old = map.get(r.id)?;
            if r.primary.machine == me && old.primary.machine != me {
                if unfinished.contains(&r.id) {
                    // Every replica before this one in the region's order
                    // failed, and those are the only ones known whole (new
                    // backups come last): served from here, the region
                    // would read as the part copied so far.
                    return Err(TxError::Protocol(format!(
                        "region {}: configuration {} makes machine {me} its primary, but its \
                         copy here is unfinished (every replica known whole failed before the \
                         copy ended); this machine cannot serve the configuration",
                        r.id, s.config.id
                    )));
                }
                change.promoted.push(r.id);
            }
            if let Some(b) = r.backups.iter().find(|b| b.machine == me) {
                if !had(r.id, me) {
                    change.new_backups.push(NewBackup {
                        region: r.id,
                        bytes: r.bytes,
                        primary: r.primary,
                        base: b.base,
                    });
                }
            }
        }
        drop(unfinished);
        if !change.short_of_backups.is_empty() {
            log::warn!(
                "machine {me}: configuration {}: regions {:?} run on with fewer than {} \
                 backups; no machine left can take their lost replicas' place",
                s.config.id,
                change.short_of_backups,
                next.backups_per_region()
            );
        }
        let zeros = vec![0u8; 64 << 10];
        let l = ctx.local();
        for b in &change.new_backups {
            let mut off = 0;
            while off < b.bytes {
                let n = (b.bytes - off).min(zeros.len() as u64);
                l.write(b.base + off, &zeros[..n as usize])?;
                off += n;
            }
        }
        {
            let mut alloc = self.alloc.lock().expect("no panics hold it");
            for &r in &change.promoted {
                alloc.recovering(r);
            }
        }
        if !change.new_backups.is_empty() {
            self.unfinished
                .lock()
                .expect("no panics hold it")
                .extend(change.new_backups.iter().map(|b| b.region));
            self.change_copying(|c| c.extend(change.new_backups.iter().map(|b| b.region)));
        }
        let old = std::mem::replace(&mut *map, next);
        *self.previous.lock().expect("no panics hold it") =
            Some((self.applied.load(Ordering::Relaxed), Arc::new(old)));
        // Release: see applied().
        self.applied.store(s.config.id, Ordering::Release);
        drop(map);
        self.changes
            .lock()
            .expect("no panics hold it")
            .push(change.clone());
        Ok(Some(change))
    }

    /// Held while a truncation applies values to a copy of `region`
    /// being re-replicated here (the copy writes under it too); none when
    /// no copy of it is under way.
    pub fn copy_guard(&self, region: u32) -> Option<MutexGuard<'_, BTreeSet<u32>>> {
        // Acquire: pairs with the Release stores of the count; a copy
        // starting later zeroed its slot before the map named it, so a
        // truncation that saw no copy applied to a copy not yet written.
        if self.copies.load(Ordering::Acquire) == 0 {
            return None;
        }
        let g = self.copying.lock().expect("no panics hold it");
        g.contains(&region).then_some(g)
    }

    /// The background work of every change, in order, until `stop()`:
    /// allocator recovery of promoted regions, then copies to new
    /// backups, each paced. What was done, in order.
    pub async fn maintain<N: Nic>(&self, ctx: &Ctx<N>, stop: &dyn Fn() -> bool) -> Vec<Work> {
        let mut out = Vec::new();
        let mut next = 0;
        loop {
            // A change's work starts once it is committed (FaRM starts
            // re-replication once every region is active): every machine
            // serves the new map by then.
            let committed = self.membership.committed();
            let todo: Vec<Change> = self.changes.lock().expect("no panics hold it")[next..]
                .iter()
                .take_while(|c| c.config <= committed)
                .cloned()
                .collect();
            next += todo.len();
            for c in todo {
                for r in c.promoted {
                    out.push(self.recover_allocator(ctx, r, c.config, stop).await);
                }
                let mut copies = c.new_backups;
                for r in self.cut_off_copies() {
                    if copies.iter().all(|b| b.region != r) {
                        copies.extend(self.backup_here(r));
                    }
                }
                for b in copies {
                    let w = self.copy(ctx, &b, c.config, stop).await;
                    self.change_copying(|c| {
                        c.remove(&b.region);
                    });
                    // A failed copy stays unfinished and not copying: the
                    // next change takes it up again (cut_off_copies).
                    if matches!(w, Work::Copied { .. }) {
                        self.unfinished
                            .lock()
                            .expect("no panics hold it")
                            .remove(&b.region);
                    }
                    out.push(w);
                }
            }
            if stop() || self.membership.is_removed() {
                return out;
            }
            match ctx.sleep(MAINTAIN_POLL_NS) {
                Ok(s) => s.await,
                Err(_) => return out,
            }
        }
    }

    /// Copies cut off by their primary's failure, to take up again from
    /// the next configuration's primary: regions whose copy here has not
    /// ended and is not under way (a change applied but not yet worked
    /// on marks its new backups copying). Ascending.
    fn cut_off_copies(&self) -> Vec<u32> {
        let unfinished = self.unfinished.lock().expect("no panics hold it");
        let copying = self.copying.lock().expect("no panics hold it");
        unfinished.difference(&copying).copied().collect()
    }

    /// Region `region` as this machine backs it up in its map now (from
    /// the primary of now), marked as being copied; `None` if this
    /// machine holds no backup of it any more (nor will again: machines
    /// only leave), and then no longer unfinished here.
    fn backup_here(&self, region: u32) -> Option<NewBackup> {
        let found = {
            let map = self.map.read().expect("no panics hold the map");
            map.get(region).ok().and_then(|r| {
                let mine = r.backups.iter().find(|x| x.machine == self.me())?;
                Some(NewBackup {
                    region,
                    bytes: r.bytes,
                    primary: r.primary,
                    base: mine.base,
                })
            })
        };
        let Some(b) = found else {
            self.unfinished
                .lock()
                .expect("no panics hold it")
                .remove(&region);
            return None;
        };
        self.change_copying(|c| {
            c.insert(region);
        });
        Some(b)
    }

    /// Changes the set of regions being copied here, and its count under
    /// the same lock (Release: pairs with `copy_guard`'s Acquire load).
    fn change_copying(&self, f: impl FnOnce(&mut BTreeSet<u32>)) {
        let mut copying = self.copying.lock().expect("no panics hold it");
        f(&mut copying);
        self.copies.store(copying.len(), Ordering::Release);
    }

    /// Allocator recovery of `region`, promoted in configuration
    /// `config`, once the transactions on it are settled: every server
    /// thread here recovered its locks for `config` (or later), and no
    /// recovery lock on the region is left, so every recovered commit
    /// that allocates in it is installed (a commit is decided only where
    /// its primaries hold it locked or truncated it). Scanned earlier, a
    /// slot a recovered commit fills afterwards would stay on the free
    /// list.
    async fn recover_allocator<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        region: u32,
        config: u64,
        stop: &dyn Fn() -> bool,
    ) -> Work {
        let started_ns = ctx.now_ns();
        while !self.settled(region, config) {
            if stop() || self.membership.is_removed() {
                return Work::Failed {
                    region,
                    at_ns: ctx.now_ns(),
                    error: "stopped before the region's transactions settled".into(),
                };
            }
            match ctx.sleep(SETTLE_POLL_NS) {
                Ok(s) => s.await,
                Err(e) => {
                    return Work::Failed {
                        region,
                        at_ns: ctx.now_ns(),
                        error: e.to_string(),
                    }
                }
            }
        }
        let base = {
            let map = self.map.read().expect("no panics hold the map");
            map.get(region)
                .ok()
                .filter(|r| r.primary.machine == self.me())
                .map(|r| r.primary.base)
        };
        let Some(base) = base else {
            return Work::Failed {
                region,
                at_ns: ctx.now_ns(),
                error: "no longer this machine's region".into(),
            };
        };
        match recover_region(ctx, &self.geo, base, self.alloc_pace).await {
            Ok(r) => {
                self.alloc
                    .lock()
                    .expect("no panics hold it")
                    .install(region, &r);
                Work::AllocatorRecovered {
                    region,
                    started_ns,
                    at_ns: ctx.now_ns(),
                    slots: r.slots,
                    allocated: r.allocated,
                }
            }
            Err(e) => Work::Failed {
                region,
                at_ns: ctx.now_ns(),
                error: e.to_string(),
            },
        }
    }

    /// Copies region `b` from its primary, a chunk at a time.
    async fn copy<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        b: &NewBackup,
        config: u64,
        stop: &dyn Fn() -> bool,
    ) -> Work {
        let started_ns = ctx.now_ns();
        let chunk = self.copy_pace.bytes.clamp(LINE as u64, 1 << 20) / LINE as u64 * LINE as u64;
        let mut mine = vec![0u8; chunk as usize];
        let mut lines = 0;
        let mut off = 0;
        let failed = |e: String| Work::Failed {
            region: b.region,
            at_ns: ctx.now_ns(),
            error: e,
        };
        // The primary's copy is read only once it drained its log rings
        // into `config` (its recovered word): until then a commit's
        // COMMIT-PRIMARY or recovery APPLY may still wait in its rings,
        // and no later record would bring that commit here (this machine
        // was no backup when it was sent, and the decision may be
        // forgotten by then).
        let p = b.primary.machine;
        let word_at = GlobalAddr::host(p, recovered_word(&self.geo, p));
        loop {
            let mut batch = ctx.batch();
            let op = batch.read_new(word_at, 8);
            let got = match batch.submit().await {
                Ok(d) => d.word(op),
                Err(e) => return failed(format!("reading the primary's recovered word: {e}")),
            };
            if got >= config {
                break;
            }
            if self.membership.epoch() > config {
                return failed(format!(
                    "configuration {config} was replaced before machine {p} recovered into it"
                ));
            }
            // The run ends, or this machine was removed (a machine cut off
            // may never see the next configuration): no copy to wait for.
            if stop() || self.membership.is_removed() {
                return failed(format!(
                    "stopped before machine {p} recovered into configuration {config}"
                ));
            }
            match ctx.sleep(MAINTAIN_POLL_NS) {
                Ok(s) => s.await,
                Err(e) => return failed(e.to_string()),
            }
        }
        while off < b.bytes {
            let n = (b.bytes - off).min(chunk) as usize;
            let at = GlobalAddr::host(b.primary.machine, b.primary.base + off);
            let mut batch = ctx.batch();
            let op = batch.read_new(at, n);
            let mut done = match batch.submit().await {
                Ok(d) => d,
                Err(e) => return failed(format!("reading the primary's copy: {e}")),
            };
            let mut buf = done.take_buf(op).as_slice().to_vec();
            drop(done);
            {
                let _g = self.copying.lock().expect("no panics hold it");
                let l = ctx.local();
                if let Err(e) = l.read(b.base + off, &mut mine[..n]) {
                    return failed(e.to_string());
                }
                for k in (0..n).step_by(LINE) {
                    let theirs = &mut buf[k..k + LINE];
                    // A primary's line 0 of an object being installed is
                    // locked; the copy never is.
                    let h = Header(word(theirs)).unlocked();
                    theirs[..8].copy_from_slice(&h.0.to_le_bytes());
                    let ours = &mine[k..k + LINE];
                    let v = Header(word(ours)).version();
                    if h.version() > v || (h.version() == v && theirs != ours) {
                        if let Err(e) = l.write(b.base + off + k as u64, theirs) {
                            return failed(e.to_string());
                        }
                        lines += 1;
                    }
                }
            }
            off += n as u64;
            if self.copy_pace.pause_ns > 0 {
                match ctx.sleep(self.copy_pace.pause_ns) {
                    Ok(s) => s.await,
                    Err(e) => return failed(e.to_string()),
                }
            }
        }
        Work::Copied {
            region: b.region,
            started_ns,
            at_ns: ctx.now_ns(),
            bytes: b.bytes,
            lines,
        }
    }
}

/// How often a quiesce looks again.
const QUIESCE_POLL_NS: u64 = 5_000;

/// Locks an object header at local offset `off` by CAS from unlocked
/// (another server thread may hold it a moment, applying a truncation).
pub fn lock_header<N: Nic>(ctx: &Ctx<N>, off: u64) -> Result<(), TxError> {
    let l = ctx.local();
    let mut wait = LocalLockWait::new(LOCAL_LOCK_WAIT);
    loop {
        let cur = Header(l.load(off)?);
        if !cur.locked() && l.cas(off, cur.0, cur.with_lock().0)? == cur.0 {
            return Ok(());
        }
        wait.again(off)?;
    }
}

/// How long a server thread waits for a header lock bit that another
/// server thread of its machine holds, before it calls the machine
/// broken. Such a bit (a backup copy's, or a promoted region's during
/// lock recovery) is held only within one synchronous step of the
/// holder, microseconds, or as long as its OS thread is descheduled:
/// seconds of it mean the holder stopped inside the step.
pub const LOCAL_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A wait for a local header lock bit: spins a while, then yields the
/// CPU (the holder may share this thread's core: emu on fewer cores than
/// threads), and past `limit` of wall time fails rather than spin for
/// good. (On sim every step runs to its end before another task does,
/// so a bit is never found held there.)
pub(crate) struct LocalLockWait {
    spins: u32,
    since: Option<std::time::Instant>,
    limit: std::time::Duration,
}

impl LocalLockWait {
    /// Spins before the wait yields and starts its clock.
    const SPINS: u32 = 1 << 10;

    pub(crate) fn new(limit: std::time::Duration) -> LocalLockWait {
        LocalLockWait {
            spins: 0,
            since: None,
            limit,
        }
    }

    /// Waits a little more for the bit of the header at local offset
    /// `off`; an error once the wait has lasted `limit`.
    pub(crate) fn again(&mut self, off: u64) -> Result<(), TxError> {
        if self.spins < Self::SPINS {
            self.spins += 1;
            std::hint::spin_loop();
            return Ok(());
        }
        let since = *self.since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() >= self.limit {
            return Err(TxError::Protocol(format!(
                "the object header at local offset {off} stayed locked for {:?}: the server \
                 thread holding it stopped inside a step",
                self.limit
            )));
        }
        std::thread::yield_now();
        Ok(())
    }
}

/// How often allocator recovery looks whether its region settled.
pub const SETTLE_POLL_NS: u64 = 50_000;

/// How often the background task looks for a new change.
pub const MAINTAIN_POLL_NS: u64 = 200_000;

fn word(line: &[u8]) -> u64 {
    u64::from_le_bytes(line[..8].try_into().expect("a line"))
}

/// The region map of configuration `s` after `map`: [`crate::reconfig::remap`]
/// with new backups in each machine's lowest spare slot no replica uses.
pub fn next_map(geo: &Geometry, map: &RegionMap, s: &Stored) -> Result<RegionMap, TxError> {
    let mut used: BTreeSet<(NodeId, u64)> = map
        .iter()
        .flat_map(|r| std::iter::once(&r.primary).chain(&r.backups))
        .map(|x| (x.machine, x.base))
        .collect();
    crate::reconfig::remap(map, &s.config, |m, _| {
        let base = (0..geo.spare_slots())
            .map(|k| geo.spare_base(k))
            .find(|b| !used.contains(&(m, *b)))?;
        used.insert((m, base));
        Some(base)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A bit never released: the wait yields past its spins and fails
    /// once its limit has passed (not before), naming the header.
    #[test]
    fn a_local_lock_held_for_good_fails_the_wait_after_its_limit() {
        let limit = Duration::from_millis(30);
        let start = Instant::now();
        let mut w = LocalLockWait::new(limit);
        let mut tries = 0u64;
        let e = loop {
            tries += 1;
            if let Err(e) = w.again(4096) {
                break e;
            }
        };
        assert!(start.elapsed() >= limit);
        assert!(tries > u64::from(LocalLockWait::SPINS), "{tries}");
        assert!(e.to_string().contains("local offset 4096"), "{e}");
    }
}
