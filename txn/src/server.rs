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
use crate::layout::NEED_BYTES;
use crate::need;
use crate::object::{self, object_bytes, Header, WriteOp, LINE};
use crate::records::{Envelope, Record, Round, TxId, Write};
use crate::recovery::Machine;
use crate::regions::{RegionMap, SharedMap};
use crate::ring::{Receiver, Sender};
use nicdrv::{Ctx, GlobalAddr, Nic, NodeId};
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::sync::Arc;

/// How long an idle server waits for a record before it looks at its stop
/// condition again.
pub const IDLE_POLL_NS: u64 = 50_000;

/// How often a server thread that drained looks whether its machine's
/// other threads have too (a drain is short: every old record is in the
/// rings already).
pub const DRAIN_POLL_NS: u64 = 5_000;

/// How long a server thread waits between posting again the replies a
/// failed link left in flight to a machine still in the configuration.
pub const RESEND_PAUSE_NS: u64 = 500_000;

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
    /// Backup updates skipped: the copy already held their version whole,
    /// or a later one.
    pub stale: u64,
    /// Backup copies found torn at the update's version (a new backup's
    /// copy took their lines at different versions) and written whole.
    pub mended: u64,
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
    /// Records of a configuration this machine had not drained into yet,
    /// held back until it had; records of a configuration drained past
    /// (none arrive: coordinators quiesce before a change is
    /// acknowledged), refused.
    pub deferred: u64,
    pub stale_records: u64,
    /// Transaction-state recovery: queries answered, decisions applied
    /// (commits, aborts), objects locked by lock recovery, and installs
    /// skipped because another transaction held the object.
    pub recovery_queries: u64,
    pub recovered_commits: u64,
    pub recovered_aborts: u64,
    pub recovery_locks: u64,
    pub recovery_conflicts: u64,
    /// A recovery commit's writes kept as backup records (its replicate
    /// round).
    pub replicated: u64,
    /// A recovery commit's writes applied at once at a backup that had
    /// acted on the decision already (a second failure cut the earlier
    /// round short, and a later round replicates to a new backup): the
    /// REPLICATE records of which at least one write was not stale here.
    pub replicated_late: u64,
    /// Writes of commits decided and acted on in an earlier recovery
    /// round put in place at a newly promoted primary before its region
    /// became active (`Server::recover`), by version (stale ones count
    /// here too).
    pub decided_installs: u64,
    /// Batches of replies posted again after a link to a machine still in
    /// the configuration failed (`Server::resend`).
    pub resends: u64,
    /// Replies held while their ring was poisoned, sent once it healed.
    pub replies_held: u64,
    /// NEED-RECOVERY (FaRM §5.3 step 3): messages sent, and those whose
    /// machine could not be reached; at a promoted primary, transactions
    /// it held no record of that a backup's message brought, messages
    /// that left records out for want of room, and backups whose message
    /// did not come within a lease (their transactions abort).
    pub needs_sent: u64,
    pub needs_lost: u64,
    pub needs_taken: u64,
    pub needs_overflowed: u64,
    pub needs_missing: u64,
    /// Recovery decisions forgotten (TRUNCATE-RECOVERY), and those still
    /// held when the server ended: none once every recovery round that
    /// began also ended.
    pub decisions_truncated: u64,
    pub decisions_held: u64,
    /// Replies or head reports that could not be written (their machine
    /// failed).
    pub lost_replies: u64,
    /// Coordinator machines of the configuration reported to the CM as
    /// unreachable: their reply ring did not heal for
    /// [`crate::coord::REPORT_LEASES`] leases of resends.
    pub reports: u64,
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
        self.replicated += o.replicated;
        self.resends += o.resends;
        self.reports += o.reports;
        self.replies_held += o.replies_held;
        self.needs_sent += o.needs_sent;
        self.needs_lost += o.needs_lost;
        self.needs_taken += o.needs_taken;
        self.needs_overflowed += o.needs_overflowed;
        self.needs_missing += o.needs_missing;
        self.replicated_late += o.replicated_late;
        self.decided_installs += o.decided_installs;
        self.truncations += o.truncations;
        self.applied += o.applied;
        self.stale += o.stale;
        self.mended += o.mended;
        self.replies += o.replies;
        self.head_reports += o.head_reports;
        self.bad_records += o.bad_records;
        self.allocs += o.allocs;
        self.allocs_refused += o.allocs_refused;
        self.block_writes += o.block_writes;
        self.regions_prepared += o.regions_prepared;
        self.regions_added += o.regions_added;
        self.outside += o.outside;
        self.deferred += o.deferred;
        self.stale_records += o.stale_records;
        self.recovery_queries += o.recovery_queries;
        self.recovered_commits += o.recovered_commits;
        self.recovered_aborts += o.recovered_aborts;
        self.recovery_locks += o.recovery_locks;
        self.recovery_conflicts += o.recovery_conflicts;
        self.decisions_truncated += o.decisions_truncated;
        self.decisions_held += o.decisions_held;
        self.lost_replies += o.lost_replies;
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
    /// Objects this primary locked for a transaction (with every region
    /// it writes), until COMMIT-PRIMARY or ABORT.
    locked: HashMap<TxId, (Vec<u32>, Vec<Write>)>,
    /// Transactions installed here, until truncated: every region each
    /// writes, and those installed here.
    installed: HashMap<TxId, (Vec<u32>, Vec<u32>)>,
    /// COMMIT-BACKUP values (with every region written) held until
    /// truncation.
    backup: HashMap<TxId, (Vec<u32>, Vec<Write>)>,
    /// Recovery's decisions taken here (commit or not, the writes of a
    /// commit, whether acted on), kept for any later recovery round to
    /// learn until the round that sent them truncates them: one entry per
    /// transaction a failure cut off, held while its recovery runs.
    decisions: HashMap<TxId, (bool, Vec<Write>, bool)>,
    /// Per coordinator machine (of this thread's number): the highest
    /// transaction truncated here. A coordinator commits one transaction
    /// at a time and truncates in order, so every transaction of it up
    /// to this one is finished.
    upto: Vec<u64>,
    /// The machine's allocator, shared with its other server threads.
    alloc: SharedAllocator,
    /// Senders (machines) whose coordinator said DONE.
    done: Vec<bool>,
    stats: ServerStats,
    buf: Vec<u8>,
    /// The machine's configuration, when it follows one.
    follows: Option<Arc<Machine>>,
    /// The configuration this thread drained into (its records are
    /// served; later ones wait), and which machines are in it.
    drained: u64,
    members: Vec<bool>,
    /// Records of a later configuration than `drained`, in arrival order.
    deferred: std::collections::VecDeque<(NodeId, Vec<u8>)>,
    /// The machines of the newest configuration installed here, and its
    /// number (a failed machine is written to no more).
    installed_members: (u64, Vec<bool>),
    /// The map the record being handled is served with, when it is of
    /// the configuration before the current one.
    old: Option<Arc<RegionMap>>,
    /// Per coordinator machine, when a reply ring left poisoned by a
    /// failed link may be posted again (`Server::resend`).
    resend_at: Vec<u64>,
    /// Per coordinator machine, since when its reply ring has been
    /// poisoned (resends failing).
    poisoned_since: Vec<Option<u64>>,
    /// Per coordinator machine, replies not yet sent because its ring was
    /// poisoned, in order.
    held_replies: Vec<Vec<Record>>,
    /// Marks the thread ended at its machine when the server drops.
    ended: Option<Ended>,
}

/// The map a record is served with.
enum MapRef<'a> {
    Shared(std::sync::RwLockReadGuard<'a, RegionMap>),
    Old(&'a RegionMap),
}

impl std::ops::Deref for MapRef<'_> {
    type Target = RegionMap;
    fn deref(&self) -> &RegionMap {
        match self {
            MapRef::Shared(g) => g,
            MapRef::Old(m) => m,
        }
    }
}

/// The configuration a record belongs to (none: truncations, valid in
/// any).
fn record_config(r: &Record) -> Option<u64> {
    match r {
        Record::Truncate { .. } => None,
        Record::Decide { config, .. } => Some(*config as u64),
        Record::Lock { tx, .. }
        | Record::CommitBackup { tx, .. }
        | Record::CommitPrimary { tx }
        | Record::Abort { tx }
        | Record::LockReply { tx, .. }
        | Record::Validate { tx, .. }
        | Record::Alloc { tx, .. }
        | Record::AllocReply { tx, .. }
        | Record::NewRegion { tx, .. }
        | Record::Done { tx }
        | Record::RecoverQuery { tx, .. }
        | Record::RecoverState { tx, .. } => Some(tx.config as u64),
    }
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
            installed: HashMap::new(),
            backup: HashMap::new(),
            decisions: HashMap::new(),
            upto: vec![0; geo.machines as usize],
            alloc,
            done: vec![false; geo.machines as usize],
            stats: ServerStats::default(),
            buf: Vec::new(),
            follows: None,
            drained: 0,
            members: vec![true; geo.machines as usize],
            deferred: Default::default(),
            installed_members: (0, vec![true; geo.machines as usize]),
            old: None,
            resend_at: vec![0; geo.machines as usize],
            poisoned_since: vec![None; geo.machines as usize],
            held_replies: vec![Vec::new(); geo.machines as usize],
            ended: None,
        })
    }

    /// Follows `machine`'s configuration: records from machines outside
    /// it are refused (precise membership), DONE is awaited from its
    /// machines only, a removed machine stops serving, and truncations
    /// into a region being re-replicated here wait for the copy's writes.
    pub fn follow(mut self, machine: Arc<Machine>) -> Server {
        let cur = machine.membership.current();
        self.drained = cur.config.id;
        self.take_members(&cur.config);
        // However this thread ends (or if it is dropped unrun), its
        // machine's other threads stop waiting for its drain.
        self.ended = Some(Ended(machine.clone(), self.thread));
        self.follows = Some(machine);
        self
    }

    fn take_members(&mut self, c: &crate::config::Configuration) {
        self.members = (0..self.geo.machines).map(|k| c.contains(k)).collect();
    }

    /// Whether every machine that may still send here said DONE.
    fn all_done(&self) -> bool {
        self.done.iter().zip(&self.members).all(|(&d, &m)| d || !m)
    }

    /// What this thread did, as it ends.
    fn ended(&self) -> ServerStats {
        ServerStats {
            decisions_held: self.decisions.len() as u64,
            ..self.stats
        }
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
            if self.removed() {
                return Ok(self.ended());
            }
            self.refresh();
            if let Some(m) = self.follows.clone() {
                let e = m.membership.committed();
                if e > self.drained && m.applied() >= e {
                    self.recover(ctx, &m, e).await?;
                    continue;
                }
            }
            self.resend_all(ctx).await?;
            if self.sweep(ctx).await? {
                continue;
            }
            if self.all_done() || stop() {
                if self.sweep(ctx).await? {
                    continue;
                }
                return Ok(self.ended());
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
            // gets no replies from here (a backup's) hears every quarter,
            // and reads the head when short of room (`Sender::fetch_head`).
            // A failed machine's ring is read (its records drain) but not
            // reported to.
            if !self.reachable(m) {
                continue;
            }
            match self.logs[m as usize].report_head(ctx, false).await {
                Ok(true) => self.stats.head_reports += 1,
                Ok(false) => {}
                Err(_) if self.follows.is_some() => self.stats.lost_replies += 1,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(any)
    }

    /// Whether machine `m` is in the machine's newest configuration (a
    /// failed one is written to no more).
    fn reachable(&self, m: NodeId) -> bool {
        self.members[m as usize] && self.installed_members.1[m as usize]
    }

    /// Takes the newest installed configuration's machines if it changed.
    fn refresh(&mut self) {
        let Some(mach) = &self.follows else { return };
        let e = mach.membership.epoch();
        if e != self.installed_members.0 {
            let cur = mach.membership.current();
            let ms = (0..self.geo.machines)
                .map(|k| cur.config.contains(k))
                .collect();
            self.installed_members = (cur.config.id, ms);
        }
    }

    async fn handle<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        from: NodeId,
        b: &[u8],
    ) -> Result<(), TxError> {
        self.old = None;
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
        if let (Some(m), Some(c)) = (self.follows.clone(), record_config(&env.record)) {
            if c > self.drained {
                self.stats.deferred += 1;
                self.deferred.push_back((from, b.to_vec()));
                return Ok(());
            }
            if c < self.drained {
                log::warn!(
                    "machine {}: a record of configuration {c} from {from} after draining into {}",
                    self.machine,
                    self.drained
                );
                self.stats.stale_records += 1;
                return Ok(());
            }
            if c < m.applied() {
                match m.previous_map(c) {
                    Some(old) => self.old = Some(old),
                    None => {
                        self.stats.stale_records += 1;
                        return Ok(());
                    }
                }
            }
        }
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
            Record::Lock {
                tx,
                regions,
                writes,
            } => {
                let ok = self.lock(ctx, &writes)?;
                if ok {
                    self.stats.locks_granted += 1;
                    self.locked.insert(tx, (regions, writes));
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
            Record::CommitBackup {
                tx,
                regions,
                writes,
            } => {
                let ours = writes.iter().all(|w| self.backs_up(w));
                if ours {
                    self.stats.backups_kept += 1;
                    self.backup.insert(tx, (regions, writes));
                } else {
                    self.stats.bad_records += 1;
                }
            }
            Record::CommitPrimary { tx } => match self.locked.remove(&tx) {
                Some((regions, writes)) => {
                    self.install(ctx, &writes)?;
                    self.alloc
                        .lock()
                        .expect("no panics hold it")
                        .settle(tx, false);
                    self.stats.installs += 1;
                    let mut here: Vec<u32> = writes.iter().map(|w| w.at.region).collect();
                    here.sort_unstable();
                    here.dedup();
                    self.installed.insert(tx, (regions, here));
                }
                None => self.stats.bad_records += 1,
            },
            Record::Abort { tx } => {
                if let Some((_, writes)) = self.locked.remove(&tx) {
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
            Record::RecoverQuery { tx, of } => self.answer_recovery(ctx, from, tx, &of).await?,
            // A commit's writes for the regions backed up here, kept as
            // its COMMIT-BACKUP record would be (merged with one held).
            // Where the decision was acted on here already (in an earlier
            // recovery round cut short by a second failure), they are
            // applied at once, by version: this machine may back up a
            // region now that it did not back up when it acted, its copy
            // taken from a primary that held the commit's lock, and the
            // APPLY that follows finds the decision acted on.
            Record::Decide {
                tx,
                commit: true,
                round: Round::Replicate,
                writes,
                ..
            } => {
                let mine: Vec<Write> = writes.into_iter().filter(|w| self.backs_up(w)).collect();
                if mine.is_empty() {
                    return Ok(());
                }
                if let Some(commit) = self.decisions.get(&tx).filter(|d| d.2).map(|d| d.0) {
                    if !commit {
                        // Decided both ways; the first decision stands.
                        self.stats.recovery_conflicts += 1;
                        return Ok(());
                    }
                    let applied = self.stats.applied;
                    for w in &mine {
                        let len = object_bytes(w.value.len()) as u64;
                        let at = self.map().on_backup(w.at, len, self.machine);
                        if let Ok(Some(at)) = at {
                            self.apply_backup(ctx, at.offset(), w)?;
                        }
                    }
                    if self.stats.applied > applied {
                        self.stats.replicated_late += 1;
                    }
                    return Ok(());
                }
                let regions: Vec<u32> = mine.iter().map(|w| w.at.region).collect();
                self.keep_backup(tx, regions, mine);
                self.stats.replicated += 1;
            }
            Record::Decide {
                round: Round::Replicate,
                ..
            } => self.stats.bad_records += 1,
            // Every machine acted on the decision (its APPLY came ahead of
            // this in the ring, here and everywhere): no record of the
            // transaction is left for a later round to find, so the
            // decision goes. One not acted on here stays: its APPLY did
            // not come first, which the coordinator never sends.
            Record::Decide {
                tx,
                round: Round::Truncate,
                ..
            } => match self.decisions.get(&tx) {
                Some(d) if d.2 => {
                    self.decisions.remove(&tx);
                    self.stats.decisions_truncated += 1;
                }
                Some(_) => self.stats.bad_records += 1,
                None => {}
            },
            // Kept; and on the last round acted on (kept too, should the
            // keeping round have been lost with a failed coordinator's
            // ring).
            Record::Decide {
                tx,
                commit,
                round,
                writes,
                ..
            } => {
                let apply = round == Round::Apply;
                let d = self
                    .decisions
                    .entry(tx)
                    .or_insert_with(|| (commit, writes.clone(), false));
                if d.0 != commit {
                    // Two rounds decided one transaction both ways: the
                    // first round's decision stands, and says so.
                    self.stats.recovery_conflicts += 1;
                } else if apply && !std::mem::replace(&mut d.2, true) {
                    self.decide(ctx, tx, commit, &writes)?;
                }
            }
            Record::LockReply { .. } | Record::AllocReply { .. } | Record::RecoverState { .. } => {
                self.stats.bad_records += 1
            }
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

    fn map(&self) -> MapRef<'_> {
        match &self.old {
            Some(m) => MapRef::Old(m),
            None => MapRef::Shared(self.map.read().expect("no panics hold the map")),
        }
    }

    /// Whether this machine backs up the object `w` writes.
    fn backs_up(&self, w: &Write) -> bool {
        let len = object_bytes(w.value.len()) as u64;
        self.map().backs_up(w.at, len, self.machine)
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

    /// COMMIT-PRIMARY's install of the objects a LOCK locked here: each
    /// written, its header unlocking at the next version; freed slots go
    /// back to the allocator.
    fn install<N: Nic>(&mut self, ctx: &Ctx<N>, writes: &[Write]) -> Result<(), TxError> {
        let mut refused = 0;
        {
            let mut alloc = self.alloc.lock().expect("no panics hold it");
            for w in writes {
                let off = self.primary_off(w.at, object_bytes(w.value.len()));
                let off = off.expect("LOCK checked every object is ours");
                put_object(ctx, off, w.new_header(), &w.value)?;
                if w.op == WriteOp::Free {
                    if self.is_slot(ctx, w, off)? {
                        alloc.put_back(w.at, w.value.len());
                    } else {
                        refused += 1;
                    }
                }
            }
        }
        if refused > 0 {
            log::warn!(
                "machine {}: {refused} FREE of an object that is no allocator slot of its size: not put back on a free list",
                self.machine
            );
            self.stats.bad_records += refused;
        }
        Ok(())
    }

    /// Whether the object `w` frees, at local offset `off`, is a slot of a
    /// block of its size: only such a slot may go back on a free list (a
    /// fixed table's object, or one freed at another size, would be handed
    /// out again over live objects).
    fn is_slot<N: Nic>(&self, ctx: &Ctx<N>, w: &Write, off: u64) -> Result<bool, TxError> {
        let g = &self.geo;
        let at = w.at.offset;
        // The block lies below the object, in the same region: its
        // local offset is the object's less the distance between them.
        let head = |block: u64| ctx.local().load(off - (at - block));
        Ok(crate::alloc::is_slot_of_size(
            g.static_bytes,
            g.block_bytes,
            at,
            w.value.len(),
            head,
        )?)
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
        if !self.reachable(to) {
            self.stats.lost_replies += 1;
            return Ok(());
        }
        if self.replies[to as usize].is_poisoned() || !self.held_replies[to as usize].is_empty() {
            self.resend(ctx, to).await?;
            if self.replies[to as usize].is_poisoned() || !self.held_replies[to as usize].is_empty()
            {
                // In order, after those still held; dropped only when
                // the configuration drops the machine.
                self.stats.replies_held += 1;
                self.held_replies[to as usize].push(record);
                return Ok(());
            }
        }
        let (ring, back) = (&mut self.replies[to as usize], &mut self.logs[to as usize]);
        match Envelope::send(ctx, ring, back, record, REPLY_WAIT_NS).await {
            Ok(_) => self.stats.replies += 1,
            // In flight in a ring the failure poisoned: it goes again
            // while its machine stays in the configuration (`resend`).
            Err(_) if self.follows.is_some() && self.replies[to as usize].is_poisoned() => {
                self.stats.replies_held += 1
            }
            // Its machine failed: reconfiguration removes it.
            Err(_) if self.follows.is_some() => self.stats.lost_replies += 1,
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// Posts again the replies a failed WRITE left in flight to
    /// coordinator machine `to` (a link between live machines that failed
    /// for a while: `Sender::restage`); once landed, the ring serves
    /// again. At most once per [`RESEND_PAUSE_NS`] a machine: until the
    /// configuration drops a machine that failed for good, each try costs
    /// the transport's timeout.
    async fn resend<N: Nic>(&mut self, ctx: &Ctx<N>, to: NodeId) -> Result<(), TxError> {
        if !self.reachable(to) {
            let n = self.held_replies[to as usize].len() as u64;
            self.held_replies[to as usize].clear();
            self.stats.lost_replies += n;
            return Ok(());
        }
        let now = ctx.now_ns();
        let next = &mut self.resend_at[to as usize];
        if now < *next {
            return Ok(());
        }
        *next = now + RESEND_PAUSE_NS;
        let ring = &mut self.replies[to as usize];
        if ring.is_poisoned() {
            let mut b = ctx.batch();
            ring.restage(ctx, &mut b)?;
            self.stats.resends += 1;
            if b.submit().await.is_err() {
                self.still_poisoned(to, now);
                return Ok(());
            }
            self.replies[to as usize].landed(ctx)?;
        }
        self.poisoned_since[to as usize] = None;
        // The replies held meanwhile, in order.
        let held = std::mem::take(&mut self.held_replies[to as usize]);
        let mut rest = held.into_iter();
        for rec in rest.by_ref() {
            let (ring, back) = (&mut self.replies[to as usize], &mut self.logs[to as usize]);
            match Envelope::send(ctx, ring, back, rec.clone(), REPLY_WAIT_NS).await {
                Ok(_) => self.stats.replies += 1,
                Err(_) => {
                    // In flight in a poisoned ring (it goes again with the
                    // ring), or not sent: held again, first.
                    if !self.replies[to as usize].is_poisoned() {
                        self.held_replies[to as usize].push(rec);
                    }
                    break;
                }
            }
        }
        self.held_replies[to as usize].extend(rest);
        Ok(())
    }

    /// The reply ring to `to` did not heal at `now`: once that lasted
    /// [`crate::coord::REPORT_LEASES`] leases, `to` is reported to the CM
    /// (`crate::lease::Membership::report`): both machines hold their
    /// leases, so no lease would ever suspect either, and the
    /// coordinator's commits would wait for answers that never come.
    fn still_poisoned(&mut self, to: NodeId, now: u64) {
        let Some(m) = &self.follows else { return };
        let since = *self.poisoned_since[to as usize].get_or_insert(now);
        let lease = m.membership.lease_ns();
        if now >= since.saturating_add(crate::coord::REPORT_LEASES * lease)
            && m.membership.report(to)
        {
            log::warn!(
                "machine {} server {}: coordinator machine {to} unreachable; reported to the CM",
                m.membership.me,
                self.thread
            );
            self.stats.reports += 1;
        }
    }

    /// Every reply ring a failed link left poisoned or with replies held,
    /// whose pause is over: posted again (`resend`).
    async fn resend_all<N: Nic>(&mut self, ctx: &Ctx<N>) -> Result<(), TxError> {
        for d in 0..self.geo.machines {
            if self.replies[d as usize].is_poisoned() || !self.held_replies[d as usize].is_empty() {
                self.resend(ctx, d).await?;
            }
        }
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
        if let Some(u) = self.upto.get_mut(t.machine as usize) {
            *u = (*u).max(t.local);
        }
        self.installed.remove(&t);
        let Some((regions, writes)) = self.backup.remove(&t) else {
            return Ok(());
        };
        // A backup promoted meanwhile keeps the record: lock recovery took
        // it, and the recovery decision applies it.
        let here: Option<Vec<u64>> = writes
            .iter()
            .map(|w| {
                let bytes = object_bytes(w.value.len()) as u64;
                match self.map().on_backup(w.at, bytes, self.machine) {
                    Ok(Some(at)) => Some(at.offset()),
                    _ => None,
                }
            })
            .collect();
        let Some(offs) = here else {
            self.backup.insert(t, (regions, writes));
            return Ok(());
        };
        for (w, off) in writes.iter().zip(offs) {
            self.apply_backup(ctx, off, w)?;
        }
        Ok(())
    }

    /// A backup copy at local offset `off` takes `w`'s value unless it
    /// holds a later version already.
    fn apply_backup<N: Nic>(&mut self, ctx: &Ctx<N>, off: u64, w: &Write) -> Result<(), TxError> {
        let machine = self.follows.clone();
        // A copy of this region under way here writes under the guard.
        let _copy = machine.as_ref().and_then(|m| m.copy_guard(w.at.region));
        let new = w.new_header();
        // Other server threads of this machine apply to the same copy:
        // the header's lock bit keeps them apart (a local CAS, atomic
        // against theirs; nothing else touches a backup copy).
        let l = ctx.local();
        let mut wait = crate::recovery::LocalLockWait::new(crate::recovery::LOCAL_LOCK_WAIT);
        loop {
            let cur = Header(l.load(off)?);
            if cur.locked() {
                wait.again(off)?;
                continue;
            }
            if cur.version() > new.version() {
                self.stats.stale += 1;
                return Ok(());
            }
            // At the same version the copy is whole, or torn by a copy
            // under way that took its first line at this version and
            // another line from before it (a copy takes lines one by one):
            // then it is written again (one version has one value).
            let mut torn = false;
            if cur.version() == new.version() {
                for k in 1..object_bytes(w.value.len()) / LINE {
                    torn |= l.load(off + (k * LINE) as u64)? != cur.0;
                }
                if !torn {
                    self.stats.stale += 1;
                    return Ok(());
                }
            }
            if l.cas(off, cur.0, cur.with_lock().0)? == cur.0 {
                put_object(ctx, off, new, &w.value)?;
                self.stats.applied += 1;
                self.stats.mended += u64::from(torn);
                return Ok(());
            }
        }
    }

    /// Drain and lock recovery for configuration `e` (FaRM §5.3 steps
    /// 2–4), once it is committed here: every record in the log rings is
    /// taken (records of `e` wait), the objects of promoted regions that
    /// this thread's COMMIT-BACKUP records write are locked, and the
    /// thread serves `e` from then on, first the records held back.
    async fn recover<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        m: &Arc<Machine>,
        e: u64,
    ) -> Result<(), TxError> {
        while self.sweep(ctx).await? {}
        // Every thread of this machine drains before any locks: a thread
        // still draining applies old records into copies by the old map,
        // among them copies this machine now leads, and a recovery lock
        // or install there would race it (its apply would spin on the
        // lock, or the install skip the apply's brief lock). Old records
        // all landed before the configuration was acknowledged, so the
        // others' drains end; records of `e` keep waiting meanwhile.
        m.server_drained(self.thread, e);
        while !m.all_drained(e) {
            if self.moved_on(m, e) {
                return Ok(());
            }
            ctx.sleep(DRAIN_POLL_NS)?.await;
            while self.sweep(ctx).await? {}
        }
        let promoted: std::collections::BTreeSet<u32> = m
            .changes()
            .iter()
            .filter(|c| c.config > self.drained && c.config <= e)
            .flat_map(|c| c.promoted.iter().copied())
            .collect();
        self.old = None;
        // NEED-RECOVERY (FaRM §5.3 step 3): records this thread backs up
        // go to the regions' new primaries, and a promoted primary takes
        // those of its regions before it locks.
        self.send_needs(ctx, m, e).await;
        if !promoted.is_empty() && !self.take_needs(ctx, m, e, &promoted).await? {
            // Gone, or a newer configuration: `run` starts over.
            return Ok(());
        }
        let mut locks = Vec::new();
        for (tx, (_, writes)) in &self.backup {
            for w in writes.iter().filter(|w| promoted.contains(&w.at.region)) {
                let len = object_bytes(w.value.len());
                if let Some(off) = self.primary_off(w.at, len) {
                    locks.push((w.at, off, *tx));
                }
            }
        }
        for (at, off, tx) in locks {
            m.rlock(ctx, at, off, tx)?;
            self.stats.recovery_locks += 1;
        }
        // A commit decided in an earlier round and held here, where this
        // machine is now the primary of a region it writes. This machine
        // may have acted on the decision while it held no copy of the
        // region (its APPLY then finds it acted on), or hold it unacted
        // with a copy taken before the old primary installed; either way
        // no record here would lock or install the write before
        // transactions see the region. An acted-on decision is final
        // (every machine kept it before any acted): its writes go in now,
        // by version. One only kept is not yet (should every machine that
        // kept it fail, the next round may decide otherwise): its objects
        // are locked, and its APPLY installs them and unlocks.
        let held: Vec<(TxId, bool, Write)> = self
            .decisions
            .iter()
            .filter(|(_, d)| d.0)
            .flat_map(|(t, d)| {
                d.1.iter()
                    .filter(|w| promoted.contains(&w.at.region))
                    .map(|w| (*t, d.2, w.clone()))
            })
            .collect();
        for (tx, acted, w) in held {
            if let Some(off) = self.primary_off(w.at, object_bytes(w.value.len())) {
                if acted {
                    self.install_recovered(ctx, Some(m), off, &w, tx)?;
                    self.stats.decided_installs += 1;
                } else {
                    m.rlock(ctx, w.at, off, tx)?;
                    self.stats.recovery_locks += 1;
                }
            }
        }
        self.drained = e;
        let cur = m.membership.current();
        self.take_members(&cur.config);
        m.server_recovered(ctx, e)?;
        let held = std::mem::take(&mut self.deferred);
        for (from, b) in held {
            self.handle(ctx, from, &b).await?;
        }
        Ok(())
    }

    /// Merges writes of `tx` (and regions it writes) into the
    /// COMMIT-BACKUP record held here, a write per object; whether a
    /// write was new.
    fn keep_backup(&mut self, tx: TxId, regions: Vec<u32>, writes: Vec<Write>) -> bool {
        let e = self.backup.entry(tx).or_default();
        for r in regions {
            if !e.0.contains(&r) {
                e.0.push(r);
            }
        }
        let mut added = false;
        for w in writes {
            if !e.1.iter().any(|x| x.at == w.at) {
                e.1.push(w);
                added = true;
            }
        }
        added
    }

    /// Whether a wait of recovery for configuration `e` is over without
    /// it: the machine was removed, or a newer configuration committed
    /// (`run` starts over with it).
    fn moved_on(&self, m: &Machine, e: u64) -> bool {
        self.removed() || m.membership.committed() > e
    }

    /// Sends this thread's NEED-RECOVERY message of configuration `e` to
    /// every other machine holding a replica: the COMMIT-BACKUP records
    /// it holds of regions that machine leads now and did not lead before
    /// (all it leads, where the map before is gone). A machine that
    /// cannot be reached is left out: its failure is the next change.
    async fn send_needs<N: Nic>(&mut self, ctx: &Ctx<N>, m: &Machine, e: u64) {
        let old = m.previous_map(self.drained);
        let mut to: BTreeMap<NodeId, Vec<need::NeedRecord>> = BTreeMap::new();
        {
            let map = self.map();
            for r in map.iter() {
                for x in std::iter::once(&r.primary).chain(&r.backups) {
                    if x.machine != self.machine {
                        to.entry(x.machine).or_default();
                    }
                }
            }
            let led = |region: u32| map.get(region).ok().map(|r| r.primary.machine);
            let new_here = |region: u32, d: NodeId| {
                old.as_ref()
                    .is_none_or(|o| o.get(region).map_or(true, |r| r.primary.machine != d))
            };
            let mut txs: Vec<_> = self.backup.iter().collect();
            txs.sort_by_key(|x| *x.0);
            for (tx, (regions, writes)) in txs {
                let mut by: BTreeMap<NodeId, Vec<Write>> = BTreeMap::new();
                for w in writes {
                    if let Some(d) = led(w.at.region).filter(|&d| d != self.machine) {
                        if new_here(w.at.region, d) {
                            by.entry(d).or_default().push(w.clone());
                        }
                    }
                }
                for (d, ws) in by {
                    to.entry(d).or_default().push((*tx, regions.clone(), ws));
                }
            }
        }
        let slot = self.geo.need_slot(self.thread, self.machine);
        for (d, recs) in to {
            let sent = async {
                let mut buf = ctx.alloc(NEED_BYTES as usize)?;
                let n = need::encode(e, &recs, buf.as_mut_slice())?;
                let mut b = ctx.batch();
                buf.truncate(n);
                b.write(GlobalAddr::host(d, slot), buf);
                b.submit().await?;
                Ok::<_, TxError>(())
            };
            match sent.await {
                Ok(()) => self.stats.needs_sent += 1,
                Err(err) => {
                    log::debug!(
                        "machine {} thread {}: NEED-RECOVERY to {d}: {err}",
                        self.machine,
                        self.thread
                    );
                    self.stats.needs_lost += 1;
                }
            }
        }
    }

    /// A promoted primary's side of NEED-RECOVERY: waits (up to a lease)
    /// for the message of configuration `e` from every backup of the
    /// regions it was promoted for, and keeps their records of those
    /// regions as its own COMMIT-BACKUP records (lock recovery then locks
    /// them; the recovery round finds them here). A message that never
    /// comes whole costs only commits: their transactions abort. False if
    /// the machine moved on meanwhile.
    async fn take_needs<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        m: &Machine,
        e: u64,
        promoted: &std::collections::BTreeSet<u32>,
    ) -> Result<bool, TxError> {
        let mut from: BTreeMap<NodeId, bool> = BTreeMap::new();
        {
            let map = self.map();
            for &r in promoted {
                if let Ok(r) = map.get(r) {
                    for b in r.backups.iter().filter(|b| b.machine != self.machine) {
                        from.insert(b.machine, false);
                    }
                }
            }
        }
        let deadline = ctx.now_ns() + m.membership.lease_ns();
        let l = ctx.local();
        let mut slot = vec![0u8; NEED_BYTES as usize];
        loop {
            for (&d, got) in from.iter_mut().filter(|x| !*x.1) {
                l.read(self.geo.need_slot(self.thread, d), &mut slot)?;
                let msg = match need::decode(&slot) {
                    Ok(msg) if msg.config == e => msg,
                    Ok(_) | Err(need::NeedError::NotWhole) => continue,
                    Err(need::NeedError::Bad(why)) => {
                        log::warn!(
                            "machine {}: a NEED-RECOVERY from {d} is not ours: {why}",
                            self.machine
                        );
                        self.stats.bad_records += 1;
                        *got = true;
                        continue;
                    }
                };
                *got = true;
                self.stats.needs_overflowed += u64::from(msg.overflow);
                for (tx, regions, writes) in msg.records {
                    let truncated = self
                        .upto
                        .get(tx.machine as usize)
                        .is_some_and(|&u| tx.local <= u);
                    if truncated || self.decisions.contains_key(&tx) {
                        continue;
                    }
                    let ws: Vec<Write> = writes
                        .into_iter()
                        .filter(|w| promoted.contains(&w.at.region))
                        .filter(|w| {
                            self.primary_off(w.at, object_bytes(w.value.len()))
                                .is_some()
                        })
                        .collect();
                    if ws.is_empty() {
                        continue;
                    }
                    let had = self.backup.contains_key(&tx);
                    if self.keep_backup(tx, regions, ws) && !had {
                        self.stats.needs_taken += 1;
                    }
                }
            }
            if from.values().all(|&g| g) {
                return Ok(true);
            }
            if self.moved_on(m, e) {
                return Ok(false);
            }
            if ctx.now_ns() >= deadline {
                self.stats.needs_missing += from.values().filter(|&&g| !g).count() as u64;
                return Ok(true);
            }
            ctx.sleep(DRAIN_POLL_NS)?.await;
        }
    }

    /// RECOVER-QUERY from coordinator `from` (step 6, pulled): what this
    /// thread holds of the transactions of coordinators `of`, its votes
    /// for the regions it is primary of, and how far it truncated them.
    async fn answer_recovery<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        from: NodeId,
        q: TxId,
        of: &[NodeId],
    ) -> Result<(), TxError> {
        use crate::records::{TxState, Vote};
        self.stats.recovery_queries += 1;
        let mine = |t: &TxId| of.contains(&t.machine);
        let mut states: std::collections::BTreeMap<TxId, TxState> = Default::default();
        let entry = |states: &mut std::collections::BTreeMap<TxId, TxState>, t: TxId, r: &[u32]| {
            let st = states.entry(t).or_insert_with(|| TxState {
                id: t,
                regions: Vec::new(),
                votes: Vec::new(),
                writes: Vec::new(),
                decided: None,
            });
            for x in r {
                if !st.regions.contains(x) {
                    st.regions.push(*x);
                }
            }
        };
        {
            for (t, (regions, writes)) in self.locked.iter().filter(|x| mine(x.0)) {
                entry(&mut states, *t, regions);
                let st = states.get_mut(t).expect("just added");
                st.writes.extend(writes.iter().cloned());
                for w in writes {
                    st.votes.push((w.at.region, Vote::Lock));
                }
            }
            for (t, (regions, here)) in self.installed.iter().filter(|x| mine(x.0)) {
                entry(&mut states, *t, regions);
                let st = states.get_mut(t).expect("just added");
                for r in here {
                    st.votes.push((*r, Vote::CommitPrimary));
                }
            }
            for (t, (regions, writes)) in self.backup.iter().filter(|x| mine(x.0)) {
                entry(&mut states, *t, regions);
                let st = states.get_mut(t).expect("just added");
                st.writes.extend(writes.iter().cloned());
                // A COMMIT-BACKUP at any replica of a region speaks for
                // it (FaRM §5.3 step 6: a region votes commit-backup when
                // any of its replicas saw one): its primary may have
                // truncated the transaction already, its backups not.
                for w in writes {
                    st.votes.push((w.at.region, Vote::CommitBackup));
                }
            }
            for (t, (commit, writes, _)) in self.decisions.iter().filter(|x| mine(x.0)) {
                entry(&mut states, *t, &[]);
                let st = states.get_mut(t).expect("just added");
                st.decided = Some(*commit);
                for w in writes {
                    if !st.writes.iter().any(|x| x.at == w.at) {
                        st.writes.push(w.clone());
                    }
                }
            }
        }
        let upto: Vec<(u16, u64)> = of
            .iter()
            .filter(|&&m| m < self.geo.machines)
            .map(|&m| (m, self.upto[m as usize]))
            .collect();
        let mut states: Vec<TxState> = states
            .into_values()
            .map(|mut st| {
                st.votes.sort_unstable();
                st.votes.dedup();
                st
            })
            .collect();
        // As many records as it takes, each well within the reply ring.
        let budget = (self.geo.reply_bytes / 4) as usize;
        loop {
            let mut chunk = Vec::new();
            let mut bytes = 64 + upto.len() * 10;
            while let Some(st) = states.last() {
                let n = 64 + st.writes.iter().map(|w| 32 + w.value.len()).sum::<usize>();
                if !chunk.is_empty() && bytes + n > budget {
                    break;
                }
                bytes += n;
                chunk.push(states.pop().expect("looked at"));
            }
            let last = states.is_empty();
            let rec = Record::RecoverState {
                tx: q,
                last,
                upto: upto.clone(),
                states: chunk,
            };
            self.answer(ctx, from, rec).await?;
            if last {
                return Ok(());
            }
        }
    }

    /// A recovery decision on `tx` (COMMIT-RECOVERY or ABORT-RECOVERY,
    /// with TRUNCATE-RECOVERY): each write lands where this machine holds
    /// a replica of it, by version; locks go; the records go.
    fn decide<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        tx: TxId,
        commit: bool,
        writes: &[Write],
    ) -> Result<(), TxError> {
        let mut done: std::collections::BTreeSet<crate::records::ObjAddr> = Default::default();
        if let Some((_, locked)) = self.locked.remove(&tx) {
            if commit {
                self.install(ctx, &locked)?;
                done.extend(locked.iter().map(|w| w.at));
            } else {
                self.unlock(ctx, &locked)?;
            }
        }
        let kept = self.backup.remove(&tx);
        self.installed.remove(&tx);
        let m = self.follows.clone();
        if commit {
            for w in writes.iter().filter(|w| !done.contains(&w.at)) {
                let len = object_bytes(w.value.len()) as u64;
                if let Some(off) = self.primary_off(w.at, len as usize) {
                    self.install_recovered(ctx, m.as_deref(), off, w, tx)?;
                } else {
                    let at = self.map().on_backup(w.at, len, self.machine);
                    if let Ok(Some(at)) = at {
                        self.apply_backup(ctx, at.offset(), w)?;
                    }
                }
            }
            self.stats.recovered_commits += 1;
        } else {
            self.stats.recovered_aborts += 1;
        }
        // Recovery locks this thread took from its COMMIT-BACKUP record
        // and the commit did not release.
        if let (Some(m), Some((_, kept))) = (&m, kept) {
            for w in &kept {
                if let Some(off) = self.primary_off(w.at, 8) {
                    m.runlock_with(w.at, tx, |held, left| {
                        if held && left == 0 {
                            unlock_header(ctx, off)?;
                        }
                        Ok::<_, TxError>(())
                    })?;
                } else {
                    m.runlock_with(w.at, tx, |_, _| ());
                }
            }
        }
        self.alloc
            .lock()
            .expect("no panics hold it")
            .settle(tx, !commit);
        Ok(())
    }

    /// A recovered commit's write at this primary (not locked by its own
    /// LOCK here): installed unless a later version is there. Under lock
    /// recovery (the object recovery-locked, by this transaction or
    /// others) it is written with the header kept locked until the last
    /// holder lets go; this transaction's hold goes, and the last holder
    /// unlocks. Otherwise it goes in under the header's lock, unless
    /// something other than recovery holds that: a transaction that
    /// locked the object read a version this write should have been
    /// newer than, and is counted, not overwritten.
    fn install_recovered<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        m: Option<&Machine>,
        off: u64,
        w: &Write,
        tx: TxId,
    ) -> Result<(), TxError> {
        let l = ctx.local();
        let new = w.new_header();
        let install = |held: bool, left: usize| -> Result<bool, TxError> {
            let cur = Header(l.load(off)?);
            if held || left > 0 {
                if new.version() > cur.unlocked().version() {
                    let h = if left == 0 { new } else { new.with_lock() };
                    put_object(ctx, off, h, &w.value)?;
                } else if held && left == 0 {
                    unlock_header(ctx, off)?;
                }
                return Ok(true);
            }
            if new.version() <= cur.version() {
                return Ok(true);
            }
            if cur.locked() || l.cas(off, cur.0, cur.with_lock().0)? != cur.0 {
                return Ok(false);
            }
            put_object(ctx, off, new, &w.value)?;
            Ok(true)
        };
        let ok = match m {
            Some(m) => m.runlock_with(w.at, tx, install)?,
            None => install(false, 0)?,
        };
        if !ok {
            self.stats.recovery_conflicts += 1;
        }
        Ok(())
    }
}

/// A server thread of a machine, ended (dropped as `run` returns).
struct Ended(Arc<Machine>, u16);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.server_drained(self.1, u64::MAX);
    }
}

/// Unlocks a header this machine's lock recovery holds.
fn unlock_header<N: Nic>(ctx: &Ctx<N>, off: u64) -> Result<(), TxError> {
    let l = ctx.local();
    let cur = Header(l.load(off)?);
    debug_assert!(cur.locked(), "a recovery lock was not held");
    l.store(off, cur.unlocked().0)?;
    Ok(())
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
