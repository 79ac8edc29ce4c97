//! A machine's server threads: the receiving side of FaRM's commit (§4).
//! Server thread t polls the log rings of coordinator thread t of every
//! machine through its machine's local view and acts on each record:
//!
//! - LOCK (as the written objects' primary): lock each object by a local
//!   CAS of its header from the version the coordinator read to the same
//!   word locked; any failure unlocks what this record locked and refuses.
//!   The answer goes back through the reply ring, with this log ring's
//!   head piggybacked.
//! - VALIDATE: compare the headers of objects read with the versions read.
//! - COMMIT-BACKUP (as a backup): keep the new values until truncation.
//! - COMMIT-PRIMARY: install the new values under the lock — every line
//!   but the first, then the first, whose header word unlocks at the next
//!   version (each line lands whole, so a lock-free READ sees the object
//!   locked, old, torn or new, never a mix it could accept).
//! - ABORT: unlock, nothing installed.
//! - Truncations (piggybacked on any record, or a TRUNCATE record): the
//!   primary forgets the transaction; a backup applies its values to its
//!   copy, by version, so a later version applied first is never
//!   overwritten by an older one.
//!
//! A record that is not one of ours, or names an object this machine does
//! not hold, is counted and refused (a LOCK so named is answered no),
//! never a panic.

use crate::alloc::{Reserved, SharedAllocator};
use crate::error::TxError;
use crate::layout::Geometry;
use crate::object::{self, object_bytes, Header, WriteOp, LINE};
use crate::records::{Envelope, Record, TxId, Write};
use crate::recovery::Machine;
use crate::regions::{RegionMap, SharedMap};
use crate::ring::{Receiver, Sender};
use nicdrv::{Ctx, Nic, NodeId};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// How long an idle server waits for a record before it looks at its stop
/// condition again.
pub const IDLE_POLL_NS: u64 = 50_000;

/// How long a server waits for room in a reply ring before it gives up
/// (a coordinator that stopped reading its replies).
pub const REPLY_WAIT_NS: u64 = 1_000_000_000;

/// What a server thread did.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    pub records: u64,
    pub locks_granted: u64,
    pub locks_refused: u64,
    pub validations: u64,
    pub installs: u64,
    pub aborts: u64,
    pub backups_kept: u64,
    pub truncations: u64,
    /// Backup copies updated at truncation.
    pub applied: u64,
    /// Backup updates skipped: the copy already held a later version.
    pub stale: u64,
    /// Replies sent (one-sided WRITEs).
    pub replies: u64,
    /// Log heads returned by a WRITE of their own (flow control not
    /// piggybacked).
    pub head_reports: u64,
    /// Records refused as not ours or naming what they may not.
    pub bad_records: u64,
    /// Slots reserved by ALLOC, and ALLOCs refused (region full).
    pub allocs: u64,
    pub allocs_refused: u64,
    /// Block header WRITEs to backups (one per backup a formatted block).
    pub block_writes: u64,
    /// NEW-REGION prepares granted (as a replica) and regions added to
    /// this machine's map.
    pub regions_prepared: u64,
    pub regions_added: u64,
    /// Records refused because their sender is not in the configuration
    /// (precise membership).
    pub outside: u64,
}

impl std::ops::AddAssign for ServerStats {
    fn add_assign(&mut self, o: Self) {
        self.records += o.records;
        self.locks_granted += o.locks_granted;
        self.locks_refused += o.locks_refused;
        self.validations += o.validations;
        self.installs += o.installs;
        self.aborts += o.aborts;
        self.backups_kept += o.backups_kept;
        self.truncations += o.truncations;
        self.applied += o.applied;
        self.stale += o.stale;
        self.replies += o.replies;
        self.head_reports += o.head_reports;
        self.bad_records += o.bad_records;
        self.allocs += o.allocs;
        self.allocs_refused += o.allocs_refused;
        self.block_writes += o.block_writes;
        self.regions_prepared += o.regions_prepared;
        self.regions_added += o.regions_added;
        self.outside += o.outside;
    }
}

/// Server thread `thread` of machine `machine`.
pub struct Server {
    geo: Geometry,
    map: SharedMap,
    machine: NodeId,
    thread: u16,
    logs: Vec<Receiver>,
    replies: Vec<Sender>,
    /// Objects this primary locked for a transaction, until COMMIT-PRIMARY
    /// or ABORT.
    locked: HashMap<TxId, Vec<Write>>,
    /// Transactions installed here, until truncated.
    installed: HashSet<TxId>,
    /// COMMIT-BACKUP values held until truncation.
    backup: HashMap<TxId, Vec<Write>>,
    /// The machine's allocator, shared with its other server threads.
    alloc: SharedAllocator,
    /// Senders (machines) whose coordinator said DONE.
    done: Vec<bool>,
    stats: ServerStats,
    buf: Vec<u8>,
    /// The machine's configuration, when it follows one.
    follows: Option<Arc<Machine>>,
    /// The configuration `members` is of, and which machines are in it.
    epoch: u64,
    members: Vec<bool>,
}

impl Server {
    /// Opens the thread's rings on machine `machine` (the machine `ctx`'s
    /// core runs on).
    pub fn open<N: Nic>(
        ctx: &Ctx<N>,
        geo: Geometry,
        map: SharedMap,
        machine: NodeId,
        thread: u16,
        alloc: SharedAllocator,
    ) -> Result<Server, TxError> {
        geo.check()?;
        let ms = 0..geo.machines;
        let logs = ms
            .clone()
            .map(|m| Receiver::open(ctx, geo.log_ring(thread, m, machine)))
            .collect::<Result<_, _>>()?;
        let replies = ms
            .map(|m| Sender::open(ctx, geo.reply_ring(thread, machine, m)))
            .collect::<Result<_, _>>()?;
        Ok(Server {
            geo,
            map,
            machine,
            thread,
            logs,
            replies,
            locked: HashMap::new(),
            installed: HashSet::new(),
            backup: HashMap::new(),
            alloc,
            done: vec![false; geo.machines as usize],
            stats: ServerStats::default(),
            buf: Vec::new(),
            follows: None,
            epoch: 0,
            members: vec![true; geo.machines as usize],
        })
    }

    /// Follows `machine`'s configuration: records from machines outside
    /// it are refused (precise membership), DONE is awaited from its
    /// machines only, a removed machine stops serving, and truncations
    /// into a region being re-replicated here wait for the copy's writes.
    pub fn follow(mut self, machine: Arc<Machine>) -> Server {
        self.follows = Some(machine);
        self.refresh();
        self
    }

    /// Takes the configuration's membership if it changed.
    fn refresh(&mut self) {
        let Some(m) = &self.follows else { return };
        let e = m.membership.epoch();
        if e != self.epoch {
            let cur = m.membership.current();
            self.members = (0..self.geo.machines)
                .map(|k| cur.config.contains(k))
                .collect();
            self.epoch = cur.config.id;
        }
    }

    /// Whether every machine that may still send here said DONE.
    fn all_done(&self) -> bool {
        self.done.iter().zip(&self.members).all(|(&d, &m)| d || !m)
    }

    fn removed(&self) -> bool {
        self.follows
            .as_ref()
            .is_some_and(|m| m.membership.is_removed())
    }

    /// Serves until every coordinator sending here said DONE (nothing
    /// more comes), or `stop()` says every coordinator has ended (in one
    /// process: a client that failed sends no DONE), and a last sweep
    /// found nothing more.
    pub async fn run<N: Nic>(
        mut self,
        ctx: &Ctx<N>,
        stop: &dyn Fn() -> bool,
    ) -> Result<ServerStats, TxError> {
        let (area, len) = self.geo.log_area(self.thread);
        loop {
            self.refresh();
            if self.removed() {
                return Ok(self.stats);
            }
            if self.sweep(ctx).await? {
                continue;
            }
            if self.all_done() || stop() {
                if self.sweep(ctx).await? {
                    continue;
                }
                return Ok(self.stats);
            }
            let until = ctx.now_ns() + IDLE_POLL_NS;
            ctx.wait_for_write(area, len, Some(until))?.await;
        }
    }

    /// One look at every log ring, taking what is there; whether anything
    /// was.
    async fn sweep<N: Nic>(&mut self, ctx: &Ctx<N>) -> Result<bool, TxError> {
        let mut any = false;
        for m in 0..self.geo.machines {
            let mut buf = std::mem::take(&mut self.buf);
            while self.logs[m as usize]
                .try_recv_into(ctx, &mut buf)?
                .is_some()
            {
                any = true;
                self.stats.records += 1;
                let r = self.handle(ctx, m, &buf).await;
                if let Err(e) = r {
                    self.buf = buf;
                    return Err(e);
                }
            }
            self.buf = buf;
            // Heads go back piggybacked on replies; a ring whose sender
            // gets no replies from here (a backup's) hears every quarter.
            if self.logs[m as usize].report_head(ctx, false).await? {
                self.stats.head_reports += 1;
            }
        }
        Ok(any)
    }

    async fn handle<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        from: NodeId,
        b: &[u8],
    ) -> Result<(), TxError> {
        if !self.members[from as usize] {
            self.stats.outside += 1;
            return Ok(());
        }
        let env = match Envelope::decode(b) {
            Ok(e) => e,
            Err(e) => {
                log::warn!(
                    "machine {}: a log record from {from} is not ours: {e}",
                    self.machine
                );
                self.stats.bad_records += 1;
                return Ok(());
            }
        };
        if env.head > 0
            && self.replies[from as usize]
                .note_head(ctx, env.head)
                .is_err()
        {
            self.stats.bad_records += 1;
        }
        for t in &env.truncate {
            self.truncate(ctx, *t)?;
        }
        match env.record {
            Record::Lock { tx, writes, .. } => {
                let ok = self.lock(ctx, &writes)?;
                if ok {
                    self.stats.locks_granted += 1;
                    self.locked.insert(tx, writes);
                } else {
                    self.stats.locks_refused += 1;
                }
                self.answer(ctx, from, Record::LockReply { tx, ok }).await?;
            }
            Record::Validate { tx, objects } => {
                self.stats.validations += 1;
                let mut ok = true;
                for (at, version) in objects {
                    match self.primary_off(at, 8) {
                        Some(off) => ok &= ctx.local().load(off)? == version,
                        None => {
                            self.stats.bad_records += 1;
                            ok = false;
                        }
                    }
                }
                self.answer(ctx, from, Record::LockReply { tx, ok }).await?;
            }
            Record::Alloc { tx, region, len } => {
                let slot = self.reserve(ctx, tx, region, len as usize).await?;
                self.answer(ctx, from, Record::AllocReply { tx, slot })
                    .await?;
            }
            Record::CommitBackup { tx, writes, .. } => {
                let ours = writes.iter().all(|w| {
                    let len = object_bytes(w.value.len()) as u64;
                    matches!(self.map().on_backup(w.at, len, self.machine), Ok(Some(_)))
                });
                if ours {
                    self.stats.backups_kept += 1;
                    self.backup.insert(tx, writes);
                } else {
                    self.stats.bad_records += 1;
                }
            }
            Record::CommitPrimary { tx } => match self.locked.remove(&tx) {
                Some(writes) => {
                    let mut alloc = self.alloc.lock().expect("no panics hold it");
                    for w in &writes {
                        let off = self.primary_off(w.at, object_bytes(w.value.len()));
                        let off = off.expect("LOCK checked every object is ours");
                        put_object(ctx, off, w.new_header(), &w.value)?;
                        if w.op == WriteOp::Free {
                            alloc.put_back(w.at, w.value.len());
                        }
                    }
                    alloc.settle(tx, false);
                    self.stats.installs += 1;
                    self.installed.insert(tx);
                }
                None => self.stats.bad_records += 1,
            },
            Record::Abort { tx } => {
                if let Some(writes) = self.locked.remove(&tx) {
                    self.unlock(ctx, &writes)?;
                    self.stats.aborts += 1;
                }
                // What it allocated here goes back to the free lists.
                self.alloc
                    .lock()
                    .expect("no panics hold it")
                    .settle(tx, true);
            }
            Record::Truncate { txs } => {
                for t in txs {
                    self.truncate(ctx, t)?;
                }
            }
            Record::NewRegion {
                tx,
                region,
                bytes,
                replicas,
                commit,
            } => {
                let ok = if commit {
                    self.add_region(region, bytes, &replicas)
                } else {
                    self.prepare_region(ctx, region, bytes, &replicas)?
                };
                self.answer(ctx, from, Record::LockReply { tx, ok }).await?;
            }
            Record::Done { .. } => self.done[from as usize] = true,
            Record::LockReply { .. } | Record::AllocReply { .. } => self.stats.bad_records += 1,
        }
        Ok(())
    }

    /// NEW-REGION's first phase at a replica: the region is new, its
    /// replicas are on distinct machines, this machine's copy would sit in
    /// a spare slot no region uses; the slot is zeroed. Whether all held.
    fn prepare_region<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        region: u32,
        bytes: u64,
        replicas: &[(u16, u64)],
    ) -> Result<bool, TxError> {
        let g = self.geo;
        let mine: Vec<u64> = replicas
            .iter()
            .filter(|r| r.0 == self.machine)
            .map(|r| r.1)
            .collect();
        let mut machines: Vec<u16> = replicas.iter().map(|r| r.0).collect();
        machines.sort_unstable();
        machines.dedup();
        let spare = |b: u64| (0..g.spare_slots()).any(|k| g.spare_base(k) == b);
        let ok = {
            let map = self.map();
            bytes == g.region_bytes
                && replicas.len() == g.f + 1
                && machines.len() == replicas.len()
                && machines.iter().all(|&m| m < g.machines)
                && map.get(region).is_err()
                && mine.len() == 1
                && spare(mine[0])
                && !map.iter().any(|r| {
                    std::iter::once(&r.primary)
                        .chain(&r.backups)
                        .any(|p| p.machine == self.machine && p.base == mine[0])
                })
        };
        if !ok {
            self.stats.bad_records += 1;
            return Ok(false);
        }
        let zeros = vec![0u8; 64 << 10];
        let l = ctx.local();
        let mut off = 0;
        while off < bytes {
            let n = (bytes - off).min(zeros.len() as u64);
            l.write(mine[0] + off, &zeros[..n as usize])?;
            off += n;
        }
        // Served from now on, used by coordinators only once committed.
        let r = region_of(region, bytes, replicas).expect("checked: replicas");
        let added = self
            .map
            .write()
            .expect("no panics hold the map")
            .add_hidden(r);
        if let Err(e) = added {
            log::warn!("machine {}: NEW-REGION {region} refused: {e}", self.machine);
            self.stats.bad_records += 1;
            return Ok(false);
        }
        self.stats.regions_prepared += 1;
        Ok(true)
    }

    /// NEW-REGION's commit at every machine: the region joins the map
    /// (a replica's hidden copy is revealed).
    fn add_region(&mut self, region: u32, bytes: u64, replicas: &[(u16, u64)]) -> bool {
        let Some(r) = region_of(region, bytes, replicas) else {
            self.stats.bad_records += 1;
            return false;
        };
        let mut map = self.map.write().expect("no panics hold the map");
        let added = match map.get(region) {
            Ok(known) if *known == r => {
                map.reveal(region);
                Ok(())
            }
            _ => map.add(r),
        };
        drop(map);
        match added {
            Ok(()) => {
                self.stats.regions_added += 1;
                true
            }
            Err(e) => {
                log::warn!("machine {}: NEW-REGION {region} refused: {e}", self.machine);
                self.stats.bad_records += 1;
                false
            }
        }
    }

    fn map(&self) -> std::sync::RwLockReadGuard<'_, RegionMap> {
        self.map.read().expect("no panics hold the map")
    }

    /// The object's offset in this machine's memory if it is a primary
    /// copy here.
    fn primary_off(&self, at: crate::records::ObjAddr, len: usize) -> Option<u64> {
        let g = self.map().on_primary(at, len as u64).ok()?;
        (g.node() == self.machine).then(|| g.offset())
    }

    /// Locks every object at the version read, or none.
    fn lock<N: Nic>(&self, ctx: &Ctx<N>, writes: &[Write]) -> Result<bool, TxError> {
        for (i, w) in writes.iter().enumerate() {
            let h = Header(w.version);
            let off = self.primary_off(w.at, object_bytes(w.value.len()));
            let won = match off {
                Some(off) if !h.locked() => ctx.local().cas(off, h.0, h.with_lock().0)? == h.0,
                _ => false,
            };
            if !won {
                self.unlock(ctx, &writes[..i])?;
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn unlock<N: Nic>(&self, ctx: &Ctx<N>, writes: &[Write]) -> Result<(), TxError> {
        for w in writes {
            let h = Header(w.version);
            let off = self.primary_off(w.at, 8).expect("locked objects are ours");
            let old = ctx.local().cas(off, h.with_lock().0, h.0)?;
            assert_eq!(
                old,
                h.with_lock().0,
                "an object this record locked was unlocked by another"
            );
        }
        Ok(())
    }

    async fn answer<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        to: NodeId,
        record: Record,
    ) -> Result<(), TxError> {
        let (ring, back) = (&mut self.replies[to as usize], &mut self.logs[to as usize]);
        Envelope::send(ctx, ring, back, record, REPLY_WAIT_NS).await?;
        self.stats.replies += 1;
        Ok(())
    }

    /// ALLOC: a slot of `region` reserved for `tx`, or none; a block
    /// formatted for it has its header line replicated to the backups.
    async fn reserve<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        tx: TxId,
        region: u32,
        len: usize,
    ) -> Result<Option<(u64, u64)>, TxError> {
        let r = self.map().get(region).ok().cloned();
        let Some(r) = r.filter(|r| r.primary.machine == self.machine) else {
            self.stats.bad_records += 1;
            return Ok(None);
        };
        if len == 0 || len > object::MAX_PAYLOAD || self.geo.blocks() == 0 {
            self.stats.allocs_refused += 1;
            return Ok(None);
        }
        let (got, formatted) = self.alloc.lock().expect("no panics hold it").reserve(
            ctx,
            tx,
            &self.geo,
            (region, r.primary.base),
            len,
        )?;
        if let Some(block) = formatted {
            let mut head = [0u8; LINE];
            ctx.local().read(r.primary.base + block, &mut head)?;
            let mut b = ctx.batch();
            let backups = crate::alloc::backup_block_headers(&self.map(), region, block)?;
            for at in &backups {
                b.write_bytes(*at, &head);
            }
            b.submit().await?;
            self.stats.block_writes += backups.len() as u64;
            self.alloc
                .lock()
                .expect("no panics hold it")
                .publish(region, block);
        }
        Ok(match got {
            Reserved::Slot(at, h) => {
                self.stats.allocs += 1;
                Some((at.offset, h.0))
            }
            Reserved::Full => {
                self.stats.allocs_refused += 1;
                None
            }
        })
    }

    fn truncate<N: Nic>(&mut self, ctx: &Ctx<N>, t: TxId) -> Result<(), TxError> {
        self.stats.truncations += 1;
        self.installed.remove(&t);
        let Some(writes) = self.backup.remove(&t) else {
            return Ok(());
        };
        let machine = self.follows.clone();
        for w in writes {
            // A copy of this region under way here writes under the guard.
            let _copy = machine.as_ref().and_then(|m| m.copy_guard(w.at.region));
            let bytes = object_bytes(w.value.len()) as u64;
            let at = self.map().on_backup(w.at, bytes, self.machine)?;
            let off = at
                .expect("COMMIT-BACKUP checked the replica is here")
                .offset();
            let new = w.new_header();
            // Other server threads of this machine apply to the same copy:
            // the header's lock bit keeps them apart (a local CAS, atomic
            // against theirs; nothing else touches a backup copy).
            let l = ctx.local();
            loop {
                let cur = Header(l.load(off)?);
                if cur.locked() {
                    std::hint::spin_loop();
                    continue;
                }
                if cur.version() >= new.version() {
                    self.stats.stale += 1;
                    break;
                }
                if l.cas(off, cur.0, cur.with_lock().0)? == cur.0 {
                    put_object(ctx, off, new, &w.value)?;
                    self.stats.applied += 1;
                    break;
                }
            }
        }
        Ok(())
    }
}

/// The region a NEW-REGION record describes (the primary first).
fn region_of(id: u32, bytes: u64, replicas: &[(u16, u64)]) -> Option<crate::regions::Region> {
    let rep = |r: &(u16, u64)| crate::regions::Replica {
        machine: r.0,
        base: r.1,
    };
    let (first, rest) = replicas.split_first()?;
    Some(crate::regions::Region {
        id,
        bytes,
        primary: rep(first),
        backups: rest.iter().map(rep).collect(),
    })
}

/// Writes an object whose header word is locked by the caller: every line
/// but the first, then the first with header `h` (unlocked), so the
/// header unlocks only once the rest is in place.
fn put_object<N: Nic>(ctx: &Ctx<N>, off: u64, h: Header, value: &[u8]) -> Result<(), TxError> {
    let mut obj = vec![0u8; object_bytes(value.len())];
    object::encode(h, value, &mut obj)?;
    let l = ctx.local();
    if obj.len() > LINE {
        l.write(off + LINE as u64, &obj[LINE..])?;
    }
    l.write(off, &obj[..LINE])?;
    Ok(())
}
