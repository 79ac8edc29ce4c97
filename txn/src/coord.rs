//! The coordinator: FaRM's transaction API and the coordinator's side of
//! its commit (§4), for one core's task. Any core of any machine
//! coordinates: coordinator thread t of machine m owns the log rings
//! (t, m) into every machine and polls the reply rings back.
//!
//! A transaction reads objects with one-sided READs (lock-free: a copy is
//! taken only when consistent), buffers its writes, and commits in
//! phases, each one batch — one doorbell per machine it reaches:
//!
//! 1. reserve log space, on every ring the commit uses, for every record
//!    it may append there (truncations it carries included); no room
//!    before the deadline aborts (`LogFull`);
//! 2. LOCK to each written object's primary; wait for every answer; a
//!    refusal aborts (`Locked`), ABORT going to the primaries that locked;
//! 3. VALIDATE the objects read and not written: a READ of each header,
//!    or a VALIDATE message to a primary holding more than
//!    [`VALIDATE_READS_MAX`] of them; a changed or locked one aborts
//!    (`Changed`);
//! 4. COMMIT-BACKUP to every backup of a written region; the batch's
//!    completion is the NIC's acknowledgement of all of them;
//! 5. COMMIT-PRIMARY to every primary; committed at the first
//!    acknowledgement (the rest settle before the coordinator's next
//!    batch).
//!
//! The transaction's id then waits, per machine it touched, to ride on
//! the next record this coordinator sends there (truncation piggybacked;
//! [`Coordinator::flush`] sends what is left as TRUNCATE records). A
//! read-only transaction commits by validation alone, and one of a single
//! read without it (its one read was a consistent copy at one instant).
//!
//! So a committed read-write transaction costs Pw LOCK records, Pw
//! replies, one COMMIT-BACKUP per backup machine (f·Pw when the written
//! primaries' backups are distinct) and Pw COMMIT-PRIMARY records — each
//! one WRITE — and one READ per object validated by READ.

use crate::error::{Abort, TxError};
use crate::layout::Geometry;
use crate::object::{self, object_bytes, Header, ObjectError, WriteOp};
use crate::records::{Envelope, ObjAddr, Record, Round, TxId, Write};
use crate::recovery::{recovered_word, Machine};
use crate::regions::{RegionMap, SharedMap};
use crate::ring::{Receiver, Reservation, RingError, Sender};
use nicdrv::{Ctx, GlobalAddr, Nic, NodeId, OpId};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// Most objects read at one primary that are validated by a READ each;
/// more go in one VALIDATE message (FaRM §4: "more than four").
pub const VALIDATE_READS_MAX: usize = 4;

/// Most truncations one record carries.
pub const CARRY_MAX: usize = 64;

/// Truncations waiting for one machine beyond which they go at once in a
/// TRUNCATE record of their own.
pub const PENDING_MAX: usize = 4 * CARRY_MAX;

/// How long a commit waits for log space before it aborts.
pub const LOG_WAIT_NS: u64 = 1_000_000;

/// A step of the commit protocol (and of recovery) at which a fault test
/// may strike ([`Coordinator::set_trap`]): each is the moment just after
/// the step's records are acknowledged by the receivers' NICs, before the
/// coordinator goes on.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// LOCK records landed at the written objects' primaries; their
    /// answers are not yet read.
    Lock,
    /// Validation passed: locks held, nothing sent to backups yet.
    Validate,
    /// COMMIT-BACKUP records acknowledged by every backup's NIC.
    CommitBackup,
    /// The first COMMIT-PRIMARY acknowledged: the commit is reported next.
    CommitPrimary,
    /// A TRUNCATE record of its own landed (truncations not piggybacked).
    Truncate,
    /// Transaction-state recovery asked every machine (RECOVER-QUERY
    /// landed everywhere): a failure during recovery.
    Recover,
    /// Recovery's decisions landed everywhere to be kept, none yet to be
    /// acted on.
    Decide,
    /// Recovery's decisions landed everywhere to be acted on, none yet
    /// to be forgotten (TRUNCATE-RECOVERY).
    TruncateRecovery,
}

/// Where a trap strikes.
pub struct TrapPoint<'a> {
    pub step: Step,
    /// The transaction committing (for `Recover`, the query's id).
    pub tx: TxId,
    /// Machines holding a primary the commit locked (for `Truncate`, the
    /// machine truncated; for `Recover`, every member asked).
    pub primaries: &'a [NodeId],
    /// Machines holding a backup the commit writes.
    pub backups: &'a [NodeId],
    /// The coordinator's NIC, for a test to downcast to its backend (the
    /// simulator's injects faults).
    pub nic: &'a dyn std::any::Any,
}

/// A fault test's hook, called at every [`Step`] the coordinator reaches.
pub type Trap = Box<dyn FnMut(&TrapPoint<'_>) + Send>;

/// How long a coordinator waits for a primary's answer before it calls
/// the protocol broken (when it follows a configuration, a machine that
/// failed is told sooner by the next configuration, which the wait
/// watches for).
pub const REPLY_WAIT_NS: u64 = 1_000_000_000;

/// READs of a locked or torn object in a row, before the reader lets the
/// core's other tasks run.
pub const READ_TRIES: u32 = 8;

/// How long a read retries a locked or torn object before it aborts
/// (`Busy`): a commit holds its locks for a few round trips, but a machine
/// whose server thread is descheduled (emu on fewer cores than threads)
/// may take milliseconds to install.
pub const READ_WAIT_NS: u64 = 50_000_000;

/// Records per batch: with a PAD each, a batch's worth of WRITEs.
const RECORDS_PER_BATCH: usize = nicdrv::exec::MAX_BATCH / 2;

/// A transaction's outcome.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Committed,
    Aborted(Abort),
}

/// What a coordinator did, by record kind: the one-sided WRITEs and READs
/// of its commits, to check against the task counters.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CoordStats {
    pub committed: u64,
    pub committed_read_only: u64,
    pub aborted: [u64; 5],
    pub lock_records: u64,
    pub validate_records: u64,
    pub backup_records: u64,
    pub commit_records: u64,
    pub abort_records: u64,
    /// TRUNCATE records of their own (truncations not piggybacked).
    pub truncate_records: u64,
    /// Header READs of VALIDATE.
    pub validate_reads: u64,
    /// READs of objects by transactions (retries of torn copies included).
    pub object_reads: u64,
    /// Bytes of every record appended.
    pub log_bytes: u64,
    /// Records outside commits: ALLOC, ABORT of a transaction given up
    /// after allocating, NEW-REGION.
    pub alloc_records: u64,
    /// READs of allocator block headers (once a block).
    pub block_reads: u64,
    /// DONE records (one to every machine when the coordinator closes).
    pub done_records: u64,
    /// Transactions this coordinator recovered after a failure (its own
    /// and those of failed coordinators it took over), by decision, and
    /// the recovery records it sent (queries and decisions).
    pub recovered_commits: u64,
    pub recovered_aborts: u64,
    pub recovery_records: u64,
    /// Recovery rounds started over because a machine failed during one.
    pub recovery_restarts: u64,
    /// Recovering transactions FaRM's rule would commit, aborted because
    /// a region's primary (promoted without their record) held no lock
    /// for them; never reported committed, since no primary installed
    /// them.
    pub recovery_unheld: u64,
    /// Batches of records posted again after a link to a machine still in
    /// the configuration failed (`Coordinator::heal`).
    pub resends: u64,
    /// Machines of the configuration reported unreachable to the CM
    /// (`crate::lease::Membership::report`): records to them did not land
    /// for [`REPORT_LEASES`] leases of resends, or they never answered.
    pub reports: u64,
    /// Reported commits whose COMMIT-PRIMARY records had not all landed
    /// when they settled (`Coordinator::stuck`): truncated only once they
    /// did, or decided by the next recovery round.
    pub stuck_commits: u64,
    /// Rings whose records in flight a configuration change cut off,
    /// made void so that the ring serves again (`Coordinator::void`).
    pub rings_voided: u64,
    /// Log rings' heads READ from their receivers after waiting for a
    /// report short of room (`Sender::fetch_head`) that moved them.
    pub heads_fetched: u64,
}

impl CoordStats {
    /// One-sided WRITEs this coordinator's records took.
    pub fn record_writes(&self) -> u64 {
        self.lock_records
            + self.validate_records
            + self.backup_records
            + self.commit_records
            + self.abort_records
            + self.truncate_records
            + self.alloc_records
            + self.done_records
            + self.recovery_records
    }

    pub fn aborts(&self) -> u64 {
        self.aborted.iter().sum()
    }
}

impl std::ops::AddAssign for CoordStats {
    fn add_assign(&mut self, o: Self) {
        self.committed += o.committed;
        self.committed_read_only += o.committed_read_only;
        for (a, b) in self.aborted.iter_mut().zip(o.aborted) {
            *a += b;
        }
        self.lock_records += o.lock_records;
        self.validate_records += o.validate_records;
        self.backup_records += o.backup_records;
        self.commit_records += o.commit_records;
        self.abort_records += o.abort_records;
        self.truncate_records += o.truncate_records;
        self.validate_reads += o.validate_reads;
        self.object_reads += o.object_reads;
        self.log_bytes += o.log_bytes;
        self.alloc_records += o.alloc_records;
        self.block_reads += o.block_reads;
        self.done_records += o.done_records;
        self.recovered_commits += o.recovered_commits;
        self.recovered_aborts += o.recovered_aborts;
        self.recovery_records += o.recovery_records;
        self.recovery_restarts += o.recovery_restarts;
        self.recovery_unheld += o.recovery_unheld;
        self.resends += o.resends;
        self.reports += o.reports;
        self.rings_voided += o.rings_voided;
        self.heads_fetched += o.heads_fetched;
        self.stuck_commits += o.stuck_commits;
    }
}

/// An object as a transaction read it.
#[derive(Clone, Debug)]
struct Seen {
    header: Header,
    value: Vec<u8>,
}

/// A transaction: what it read, at which versions, and what it will
/// write. [`Coordinator::commit`] takes it, so a transaction cannot be
/// used after its commit.
#[derive(Debug)]
pub struct Tx {
    id: TxId,
    reads: BTreeMap<ObjAddr, Seen>,
    writes: BTreeMap<ObjAddr, Vec<u8>>,
    /// Writes that allocate or free their object (the rest update).
    ops: BTreeMap<ObjAddr, WriteOp>,
    /// Primaries holding slots this transaction reserved.
    allocs: BTreeSet<NodeId>,
    /// Objects read that lie in an allocator block (they may be freed).
    slab: BTreeSet<ObjAddr>,
}

impl Tx {
    pub fn id(&self) -> TxId {
        self.id
    }

    /// Buffers a new value for an object this transaction read (FaRM
    /// writes what it read: LOCK checks the version read). The value has
    /// the object's size.
    pub fn write(&mut self, at: ObjAddr, value: &[u8]) -> Result<(), TxError> {
        let Some(seen) = self.reads.get(&at) else {
            return Err(TxError::Usage(format!(
                "write of object {at:?}, which this transaction did not read"
            )));
        };
        if value.len() != seen.value.len() {
            return Err(TxError::Usage(format!(
                "a {}-byte value for object {at:?} of {} bytes",
                value.len(),
                seen.value.len()
            )));
        }
        if self.ops.get(&at) == Some(&WriteOp::Free) {
            return Err(TxError::Usage(format!(
                "write of object {at:?}, which this transaction freed"
            )));
        }
        self.writes.insert(at, value.to_vec());
        Ok(())
    }

    /// Frees an object this transaction read (or allocated): at commit its
    /// header turns free at the next incarnation and its slot goes back
    /// to the allocator. Objects of the fixed tables cannot be freed.
    pub fn free(&mut self, at: ObjAddr) -> Result<(), TxError> {
        let Some(seen) = self.reads.get(&at) else {
            return Err(TxError::Usage(format!(
                "free of object {at:?}, which this transaction did not read"
            )));
        };
        if !self.slab.contains(&at) {
            return Err(TxError::Usage(format!(
                "free of object {at:?} of a region's fixed tables (only allocated objects are freed)"
            )));
        }
        self.writes.insert(at, vec![0; seen.value.len()]);
        self.ops.insert(at, WriteOp::Free);
        Ok(())
    }

    pub fn is_read_only(&self) -> bool {
        self.writes.is_empty()
    }
}

/// What one commit sends to one machine, encoded (heads patched in at
/// send time).
#[derive(Default)]
struct Dest {
    lock: Option<Vec<u8>>,
    validate: Option<Vec<u8>>,
    /// Objects validated by READ: where, and the header read.
    validate_reads: Vec<(GlobalAddr, Header)>,
    backup: Option<Vec<u8>>,
    /// COMMIT-PRIMARY and ABORT (same size: one is sent).
    finish: Option<(Vec<u8>, Vec<u8>)>,
    /// Truncations the first record here carries.
    carried: usize,
    reservation: Option<Reservation>,
}

impl Dest {
    fn lens(&self) -> Vec<u64> {
        [&self.lock, &self.validate, &self.backup]
            .into_iter()
            .flatten()
            .chain(self.finish.as_ref().map(|f| &f.0))
            .map(|p| p.len() as u64)
            .collect()
    }
}

/// Coordinator thread `thread` of machine `machine`.
pub struct Coordinator {
    geo: Geometry,
    map: SharedMap,
    machine: NodeId,
    thread: u16,
    config: u32,
    next: u64,
    logs: Vec<Sender>,
    replies: Vec<Receiver>,
    /// Per machine: the head of its reply ring that the records last
    /// staged to it carry, told ([`Receiver::told`]) once they land.
    staged_head: Vec<u64>,
    /// Per machine: the configuration the records last staged to it are
    /// of, the configuration in which a heal of its ring gave up, when
    /// its ring may be tried again (`Coordinator::try_heal`), and whether
    /// the last try failed to reach it (rather than waited for it).
    staged_in: Vec<u32>,
    gave_up: Vec<u32>,
    heal_at: Vec<u64>,
    unreached: Vec<bool>,
    /// Per machine: committed transactions whose truncation is to go there.
    pending: Vec<Vec<TxId>>,
    /// Object sizes of the allocator blocks seen (a block's size never
    /// changes once formatted).
    blocks: HashMap<(u32, u64), usize>,
    /// As the configuration manager (machine 0, thread 0): regions
    /// created, and spare slots used on each machine.
    created: u32,
    spare_used: Vec<u64>,
    /// Machines whose COMMIT-PRIMARY record may still be in flight (the
    /// commit was reported at the first acknowledgement); their senders
    /// land once the batch settles.
    unsettled: Vec<NodeId>,
    stats: CoordStats,
    buf: Vec<u8>,
    /// The machine's configuration, when it follows one.
    follows: Option<Arc<Machine>>,
    /// Which machines are in the configuration this coordinator works in.
    members: Vec<bool>,
    /// The fence of the COMMIT-PRIMARY batch still in flight.
    unsettled_fence: Option<crate::recovery::Fence>,
    /// The transaction whose COMMIT-PRIMARY batch that is.
    unsettled_tx: Option<TxId>,
    /// Reported commits whose COMMIT-PRIMARY records did not land at some
    /// machines still in the configuration (their rings left poisoned):
    /// those machines (a mask), the machines its truncations are held
    /// back from, and whether one of the records was made void. Until
    /// every record landed, the commit is truncated nowhere, so the
    /// primaries that installed it still vote commit-primary; a record
    /// made void leaves the commit to the next recovery round, which
    /// takes every such commit as touched by the failure and installs it
    /// where the record never came.
    stuck: BTreeMap<TxId, (u64, Vec<NodeId>, bool)>,
    /// Recovery's decisions on this coordinator's own transactions cut
    /// off by a failure (commit or not), until their commit call asks.
    decided: HashMap<TxId, bool>,
    /// The transaction whose commit was cut off, until recovery decides
    /// it (whatever regions it wrote).
    cut_off: Option<TxId>,
    /// A fault test's hook ([`Coordinator::set_trap`]).
    trap: Option<Trap>,
    /// Regions whose primary the configuration taken changed, by that
    /// primary, until it is seen to have recovered its locks.
    recovering: BTreeMap<u32, NodeId>,
}

/// How long a coordinator waits for a configuration its machine applied
/// to be committed before it gives up (the CM failed meanwhile, and the
/// next one has not committed its own).
pub const GATE_WAIT_NS: u64 = 1_000_000_000;

/// How long a coordinator waits between posting again the records a
/// failed link left in flight to a machine still in its configuration.
pub const RESEND_PAUSE_NS: u64 = 500_000;

/// Leases of resends to a machine, both holding their leases and its
/// records still not landing, before it is reported to the CM as
/// unreachable (`Coordinator::heal_poisoned`): a machine that failed is
/// suspected by its lease within one.
pub const REPORT_LEASES: u64 = 2;

/// Whether a failed batch's error is a post refused because its node is
/// known dead (its queue pair in error and the peer's memory gone, so it
/// cannot be recovered): nothing posted there can land, so its records
/// are not tried again; the configuration change that the failure brings
/// decides the commit. Any other refusal (a full send queue) is passing:
/// the record goes again.
fn refused_dead(e: &nicdrv::VerbError) -> bool {
    matches!(e, nicdrv::VerbError::NodeDead { .. })
}

/// How often a waiting coordinator looks again.
const GATE_POLL_NS: u64 = 20_000;

/// The configuration a recovery round recovers from: its region map
/// (when the machine still has it).
struct Before {
    map: Option<Arc<RegionMap>>,
}

impl Coordinator {
    /// Opens the thread's rings on machine `machine` (the machine `ctx`'s
    /// core runs on); `config` is the configuration's number (part of
    /// every transaction id).
    pub fn open<N: Nic>(
        ctx: &Ctx<N>,
        geo: Geometry,
        map: SharedMap,
        machine: NodeId,
        thread: u16,
        config: u32,
    ) -> Result<Coordinator, TxError> {
        geo.check()?;
        if machine >= geo.machines || thread >= geo.threads {
            return Err(TxError::Usage(format!(
                "coordinator {thread} of machine {machine} in a cluster of {} × {}",
                geo.machines, geo.threads
            )));
        }
        let ms = 0..geo.machines;
        let logs = ms
            .clone()
            .map(|d| Sender::open(ctx, geo.log_ring(thread, machine, d)))
            .collect::<Result<_, _>>()?;
        let replies = ms
            .map(|d| Receiver::open(ctx, geo.reply_ring(thread, d, machine)))
            .collect::<Result<_, _>>()?;
        Ok(Coordinator {
            geo,
            map,
            machine,
            thread,
            config,
            next: 0,
            logs,
            replies,
            staged_head: vec![0; geo.machines as usize],
            staged_in: vec![u32::MAX; geo.machines as usize],
            gave_up: vec![u32::MAX; geo.machines as usize],
            heal_at: vec![0; geo.machines as usize],
            unreached: vec![false; geo.machines as usize],
            pending: vec![Vec::new(); geo.machines as usize],
            blocks: HashMap::new(),
            created: 0,
            spare_used: vec![0; geo.machines as usize],
            unsettled: Vec::new(),
            stats: CoordStats::default(),
            buf: Vec::new(),
            follows: None,
            members: vec![true; geo.machines as usize],
            unsettled_fence: None,
            unsettled_tx: None,
            stuck: BTreeMap::new(),
            decided: HashMap::new(),
            cut_off: None,
            trap: None,
            recovering: BTreeMap::new(),
        })
    }

    /// Follows `machine`'s configuration: between its install and its
    /// NEW-CONFIG-COMMIT the coordinator waits (FaRM blocks requests
    /// meanwhile); once committed, it works in it — the region map the
    /// machine applied, no record to machines outside it, its truncations
    /// for them dropped (they are gone), DONE to its machines only.
    pub fn follow(mut self, machine: Arc<Machine>) -> Coordinator {
        self.follows = Some(machine);
        self
    }

    /// Calls `trap` at every [`Step`] this coordinator reaches from now
    /// on (fault tests; `None` removes it).
    pub fn set_trap(&mut self, trap: Option<Trap>) {
        self.trap = trap;
    }

    fn spring<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        step: Step,
        tx: TxId,
        primaries: &[NodeId],
        backups: &[NodeId],
    ) {
        if let Some(t) = self.trap.as_mut() {
            t(&TrapPoint {
                step,
                tx,
                primaries,
                backups,
                nic: ctx.nic(),
            });
        }
    }

    /// The machine whose configuration this coordinator follows.
    pub fn machine(&self) -> Option<Arc<Machine>> {
        self.follows.clone()
    }

    /// Takes the machine's newest configuration once it is committed,
    /// running its recovery round (between transactions, or after the
    /// last, so that the transactions this coordinator is heir to are
    /// decided).
    pub async fn follow_changes<N: Nic>(&mut self, ctx: &Ctx<N>) -> Result<(), TxError> {
        self.gate(ctx).await
    }

    /// The configuration this coordinator works in, when it follows one.
    pub fn configuration(&self) -> Option<u64> {
        self.follows.as_ref().map(|_| self.config as u64)
    }

    /// Waits until the machine's newest configuration is committed, and
    /// takes it: recovery runs there. A machine failing during recovery
    /// makes the round start over in the configuration that follows, from
    /// the same configuration before.
    async fn gate<N: Nic>(&mut self, ctx: &Ctx<N>) -> Result<(), TxError> {
        let Some(m) = self.follows.clone() else {
            return Ok(());
        };
        let mut deadline = ctx.now_ns() + self.gate_wait_ns();
        let mut from: Option<Before> = None;
        loop {
            if m.membership.is_removed() {
                return Err(TxError::Protocol(format!(
                    "machine {} is not in the configuration",
                    self.machine
                )));
            }
            let e = m.membership.epoch();
            if e == self.config as u64 && from.is_none() {
                return Ok(());
            }
            if e != self.config as u64 && m.membership.committed() == e && m.applied() == e {
                let cur = m.membership.current();
                if cur.config.id == e {
                    let before = from.take().unwrap_or_else(|| Before {
                        map: m.previous_map(self.config as u64),
                    });
                    self.take(&cur.config);
                    match self.recover(ctx, &before).await {
                        Ok(()) => return Ok(()),
                        Err(err @ (TxError::Aborted(_) | TxError::Usage(_))) => return Err(err),
                        Err(err) => {
                            self.wait_past(ctx, e, err).await?;
                            self.stats.recovery_restarts += 1;
                            from = Some(before);
                            deadline = ctx.now_ns() + self.gate_wait_ns();
                            continue;
                        }
                    }
                }
            }
            if ctx.now_ns() >= deadline {
                return Err(TxError::Protocol(format!(
                    "machine {}: configuration {e} was not committed within {} ms",
                    self.machine,
                    self.gate_wait_ns() / 1_000_000
                )));
            }
            ctx.sleep(GATE_POLL_NS)?.await;
        }
    }

    /// Works in configuration `c` from now on.
    fn take(&mut self, c: &crate::config::Configuration) {
        for d in 0..self.geo.machines {
            let member = c.contains(d);
            self.members[d as usize] = member;
            if !member {
                self.pending[d as usize].clear();
            }
        }
        self.config = c.id as u32;
    }

    /// Transaction-state recovery (FaRM §5.3) as this coordinator sees
    /// it, on taking configuration `self.config` after the configuration
    /// `before` describes: it recovers its own transactions and those of
    /// each coordinator of its thread number on a machine outside the
    /// configuration whose heir it is (the next machine of the
    /// configuration after it). It asks every machine's server thread for
    /// what it holds of them (once that server drained and recovered its
    /// locks), decides each transaction that a failure touched — its
    /// coordinator failed, it wrote a region whose replicas changed, or an
    /// earlier round decided it — by the ballots of its regions (an
    /// earlier round's decision standing), and sends each decision with
    /// the values to every machine three times: to keep, to act on, and
    /// once every machine acted (TRUNCATE-RECOVERY) to forget. The
    /// regions whose primary moved are then recovering until that primary
    /// recovered its locks ([`Self::active`]). A machine
    /// failing meanwhile ends the round with an error; [`Self::gate`]
    /// starts it over in the next configuration.
    async fn recover<N: Nic>(&mut self, ctx: &Ctx<N>, before: &Before) -> Result<(), TxError> {
        use crate::records::Vote;
        use crate::recovery::{decide, Ballot};
        let machines = self.geo.machines;
        let members: Vec<NodeId> = (0..machines)
            .filter(|&d| self.members[d as usize])
            .collect();
        // Every machine outside the configuration, not only those the
        // last change removed: a failure during an earlier round may have
        // cut off its recovery of a machine that failed before.
        let failed: Vec<NodeId> = (0..machines)
            .filter(|&d| !self.members[d as usize])
            .collect();
        let heir = |x: NodeId| {
            (1..=machines)
                .map(|k| (x + k) % machines)
                .find(|&d| self.members[d as usize])
        };
        let mut of = vec![self.machine];
        of.extend(failed.iter().filter(|&&x| heir(x) == Some(self.machine)));
        // Regions whose replicas changed.
        let now = self.map().clone();
        let changed: BTreeSet<u32> = match &before.map {
            Some(old) => now
                .iter()
                .filter(|r| old.get(r.id).ok() != Some(*r))
                .map(|r| r.id)
                .collect(),
            None => now.iter().map(|r| r.id).collect(),
        };
        let q = self.begin().id;
        for &d in &members {
            let of = of.clone();
            self.send_one(ctx, d, Record::RecoverQuery { tx: q, of })
                .await?;
            self.stats.recovery_records += 1;
        }
        self.spring(ctx, Step::Recover, q, &members, &[]);
        type Acc = (
            BTreeSet<u32>,
            BTreeMap<u32, Vote>,
            BTreeMap<ObjAddr, Write>,
            Option<bool>,
        );
        let mut txs: BTreeMap<TxId, Acc> = BTreeMap::new();
        let mut upto: BTreeMap<(NodeId, NodeId), u64> = BTreeMap::new();
        // (transaction, region) where the region's primary holds a record
        // of the transaction (so it holds its locks there).
        let mut at_primary: BTreeSet<(TxId, u32)> = BTreeSet::new();
        let primary_of = |r: u32| now.get(r).ok().map(|x| x.primary.machine);
        for &d in &members {
            loop {
                match self.answer_heads(ctx, q, d, true).await? {
                    Record::RecoverState {
                        last,
                        upto: u,
                        states,
                        ..
                    } => {
                        for (c, local) in u {
                            upto.insert((d, c), local);
                        }
                        for st in states {
                            let here = st.votes.iter().map(|v| v.0);
                            let here = here.chain(st.writes.iter().map(|w| w.at.region));
                            for r in here.filter(|&r| primary_of(r) == Some(d)) {
                                at_primary.insert((st.id, r));
                            }
                            let a = txs.entry(st.id).or_default();
                            a.0.extend(st.regions);
                            // A region's strongest vote from any of its
                            // replicas: commit-primary, then commit-backup,
                            // then lock.
                            for (r, v) in st.votes {
                                let e = a.1.entry(r).or_insert(v);
                                *e = (*e).min(v);
                            }
                            for w in st.writes {
                                a.2.entry(w.at).or_insert(w);
                            }
                            a.3 = a.3.or(st.decided);
                        }
                        if last {
                            break;
                        }
                    }
                    r => {
                        return Err(TxError::Protocol(format!(
                            "machine {d} answered RECOVER-QUERY with {r:?}"
                        )))
                    }
                }
            }
        }
        let mut decisions: Vec<(TxId, bool, Vec<Write>)> = Vec::new();
        for (t, (regions, votes, writes, decided)) in txs {
            let touched = failed.contains(&t.machine)
                || self.cut_off == Some(t)
                || self.stuck.contains_key(&t)
                || decided.is_some()
                || regions.iter().any(|r| changed.contains(r))
                || writes.keys().any(|a| changed.contains(&a.region));
            if !touched {
                continue;
            }
            let truncated = |r: u32| {
                let u = primary_of(r).and_then(|p| upto.get(&(p, t.machine)));
                u.is_some_and(|&u| t.local <= u)
            };
            // An earlier round's decision, which some machine may have
            // acted on, stands.
            let commit = decided.unwrap_or_else(|| {
                let ballots: Vec<Ballot> = regions
                    .iter()
                    .map(|r| match votes.get(r) {
                        Some(v) => Ballot::Vote(*v),
                        None if truncated(*r) => Ballot::Truncated,
                        None => Ballot::Unknown,
                    })
                    .collect();
                if regions.is_empty() || !decide(&ballots) {
                    return false;
                }
                // Not installed anywhere, so never reported committed: it
                // commits only where every region's primary holds it
                // locked (or truncated it). A primary promoted without its
                // record locked nothing for it, and may have served the
                // old values since its region became active.
                let installed = votes.values().any(|v| *v == Vote::CommitPrimary);
                let held = regions
                    .iter()
                    .all(|&r| at_primary.contains(&(t, r)) || truncated(r));
                if !installed && !held {
                    self.stats.recovery_unheld += 1;
                }
                installed || held
            });
            if decided.is_none() {
                if commit {
                    self.stats.recovered_commits += 1;
                } else {
                    self.stats.recovered_aborts += 1;
                }
            }
            let writes: Vec<Write> = if commit {
                writes.into_values().collect()
            } else {
                Vec::new()
            };
            decisions.push((t, commit, writes));
        }
        // Every backup of a region a commit writes holds its writes before
        // any machine keeps a decision, every machine keeps each decision
        // before any acts on one, and every machine's APPLY is in its ring
        // before any forgets one (a later round is answered only once the
        // rings are drained, so it finds no record of the transaction).
        let q = self.begin().id;
        for round in [Round::Replicate, Round::Keep, Round::Apply, Round::Truncate] {
            match round {
                Round::Apply => self.spring(ctx, Step::Decide, q, &members, &[]),
                Round::Truncate => {
                    // Every machine acted, so the decision on the commit
                    // this coordinator was cut off in is final: it is
                    // learnt before the machines forget it (should one
                    // fail meanwhile, the next round may find none).
                    let mine = decisions.iter().find(|d| Some(d.0) == self.cut_off);
                    if let Some(&(t, commit, _)) = mine {
                        self.decided.insert(t, commit);
                    }
                    self.spring(ctx, Step::TruncateRecovery, q, &members, &[]);
                }
                _ => {}
            }
            for (t, commit, writes) in &decisions {
                let to: Vec<NodeId> = match round {
                    Round::Replicate if !*commit => continue,
                    Round::Replicate => members
                        .iter()
                        .copied()
                        .filter(|&d| {
                            // Where the server keeps them (`Server::backs_up`).
                            writes
                                .iter()
                                .any(|w| now.backs_up(w.at, object_bytes(w.value.len()) as u64, d))
                        })
                        .collect(),
                    Round::Keep | Round::Apply | Round::Truncate => members.clone(),
                };
                for d in to {
                    let rec = Record::Decide {
                        tx: *t,
                        config: self.config,
                        commit: *commit,
                        round,
                        writes: match round {
                            Round::Truncate => Vec::new(),
                            _ => writes.clone(),
                        },
                    };
                    self.send_one(ctx, d, rec).await?;
                    self.stats.recovery_records += 1;
                }
            }
        }
        // A region whose primary changed is usable once that primary
        // recovered its locks ([`Self::active`]); every other region at
        // once: transactions that touch no recovering region go on.
        let old = before.map.as_deref();
        self.recovering = now
            .iter()
            .filter(|r| old.is_none_or(|o| o.get(r.id).ok().map(|x| x.primary) != Some(r.primary)))
            .map(|r| (r.id, r.primary.machine))
            .collect();
        // Every stuck commit of an earlier configuration was decided, or
        // found nowhere to decide: its rings to the members were healed
        // or made void before the query went.
        let config = self.config;
        self.stuck.retain(|t, _| t.config >= config);
        Ok(())
    }

    /// Waits until region `region` is active in this coordinator's
    /// configuration: its primary, if the configuration changed it, has
    /// recovered its locks (FaRM §5.3 step 1: access to a recovering
    /// region is blocked until lock recovery), so that no read finds a
    /// copy recovery has not locked.
    async fn active<N: Nic>(&mut self, ctx: &Ctx<N>, region: u32) -> Result<(), TxError> {
        let Some(&p) = self.recovering.get(&region) else {
            return Ok(());
        };
        let e = self.config as u64;
        let deadline = ctx.now_ns() + self.gate_wait_ns();
        loop {
            let mut b = ctx.batch();
            let op = b.read_new(GlobalAddr::host(p, recovered_word(&self.geo, p)), 8);
            let done = b.submit().await;
            let recovered = match &done {
                Ok(d) => d.word(op) >= e,
                Err(_) => return Err(TxError::Aborted(Abort::Failure)),
            };
            drop(done);
            if recovered {
                self.recovering.retain(|_, m| *m != p);
                return Ok(());
            }
            if ctx.now_ns() >= deadline {
                return Err(TxError::Protocol(format!(
                    "machine {}: machine {p} did not recover its locks for configuration {e}",
                    self.machine
                )));
            }
            ctx.sleep(GATE_POLL_NS)?.await;
        }
    }

    /// After a failed batch of records to machines `ds` (its error `e`):
    /// the senders whose records landed move on
    /// ([`Self::land_what_landed`]), the rest go again or are given up
    /// ([`Self::heal`]). Whether every record landed.
    async fn land_and_heal<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        ds: &[NodeId],
        e: &nicdrv::VerbError,
    ) -> Result<bool, TxError> {
        let dead = refused_dead(e);
        self.land_what_landed(ctx, ds, dead)?;
        self.heal(ctx, ds, dead).await
    }

    /// After a failed batch to machines `ds`: while every machine whose
    /// ring it left poisoned is still in this coordinator's configuration
    /// (a link between live machines failed for a while, longer than the
    /// transport's retries), the rings' records in flight are posted again
    /// ([`crate::ring::Sender::restage`]) every [`RESEND_PAUSE_NS`], until
    /// they land; a change of configuration (one of them failed for good:
    /// recovery decides) or the gate's wait ends it. Whether they landed.
    /// Without a configuration to follow, nothing is tried.
    async fn heal<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        ds: &[NodeId],
        dead: bool,
    ) -> Result<bool, TxError> {
        // Where the batch's nodes are unknown (one numbered 64 or more),
        // or a post was refused to a node known dead, the caller's error
        // stands, and the rings it poisoned are given up for the
        // configuration (a later heal must not deliver a record of a
        // commit that returned an error); the configuration change that
        // follows decides the commit. A record the batch never posted for
        // another reason (a full send queue) stays in flight
        // (`land_what_landed`) and goes again like one whose WRITE failed.
        if dead || ctx.last_batch_nodes().is_none() || ds.iter().any(|&d| d >= 64) {
            self.give_up(ds);
            return Ok(false);
        }
        self.heal_poisoned(ctx, ds).await
    }

    /// [`Self::heal`] of the rings to `ds` left poisoned by any earlier
    /// batch: [`Self::try_heal`] every [`RESEND_PAUSE_NS`] until all land,
    /// the configuration changes or the gate's wait ends; then the rings
    /// that did not heal are given up for this configuration (their
    /// records never go, so no caller that saw the error meets them
    /// later). A machine whose ring has not healed after
    /// [`REPORT_LEASES`] leases is reported to the CM: both hold their
    /// leases, so only a report brings the configuration change that
    /// decides the commits the link cut off. An error (a verb refused
    /// locally, the executor's timer) gives the rings up too: the
    /// caller's error stands, and what did not land must not go later.
    async fn heal_poisoned<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        ds: &[NodeId],
    ) -> Result<bool, TxError> {
        let r = self.heal_until_given_up(ctx, ds).await;
        if r.is_err() {
            self.give_up(ds);
        }
        r
    }

    /// [`Self::heal_poisoned`]'s tries, errors aside.
    async fn heal_until_given_up<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        ds: &[NodeId],
    ) -> Result<bool, TxError> {
        let Some(m) = self.follows.clone() else {
            return Ok(false);
        };
        let now = ctx.now_ns();
        let deadline = now + self.gate_wait_ns();
        let report_at = now.saturating_add(REPORT_LEASES * m.membership.lease_ns());
        loop {
            let mut all = true;
            for &d in ds {
                let healed = self.try_heal(ctx, d).await?;
                // Reported when it cannot be reached, not while a void
                // waits for it to drain.
                if !healed && ctx.now_ns() >= report_at && self.unreached[d as usize] {
                    self.report(d);
                }
                all &= healed;
            }
            if all {
                return Ok(true);
            }
            let hopeless = ds.iter().any(|&d| !self.healable(d));
            if hopeless || ctx.now_ns() >= deadline {
                self.give_up(ds);
                return Ok(false);
            }
            ctx.sleep(RESEND_PAUSE_NS)?.await;
        }
    }

    /// Reports machine `d` of this coordinator's configuration to the CM
    /// as unreachable (once a configuration).
    fn report(&mut self, d: NodeId) {
        let Some(m) = &self.follows else { return };
        if m.membership.epoch() == self.config as u64 && m.membership.report(d) {
            log::warn!(
                "machine {} thread {}: machine {d} unreachable; reported to the CM",
                self.machine,
                self.thread
            );
            self.stats.reports += 1;
        }
    }

    /// The rings to `ds` still poisoned are given up for this
    /// configuration: their records never go.
    fn give_up(&mut self, ds: &[NodeId]) {
        for &d in ds.iter().filter(|&&d| d < 64) {
            if self.logs[d as usize].is_poisoned() {
                self.gave_up[d as usize] = self.config;
            }
        }
    }

    /// Whether the poisoned ring to `d` may serve again: this
    /// coordinator's configuration is still the machine's, `d` is in it,
    /// and no heal gave it up in it. Its records go again if they were
    /// staged in this configuration, or are made void if in an earlier
    /// one ([`Self::void`]).
    fn healable(&self, d: NodeId) -> bool {
        let Some(m) = &self.follows else {
            return false;
        };
        let cur = m.membership.current();
        d < 64
            && self.gave_up[d as usize] != self.config
            && cur.config.id == self.config as u64
            && !m.membership.is_removed()
            && cur.config.contains(d)
    }

    /// One try, at most every [`RESEND_PAUSE_NS`], to post the records a
    /// failed WRITE left in flight to `d` again (`Sender::restage`), under
    /// the configuration's fence, so that they land before the machine
    /// acknowledges a next one (or never). Whether the ring is healthy.
    async fn try_heal<N: Nic>(&mut self, ctx: &Ctx<N>, d: NodeId) -> Result<bool, TxError> {
        if d >= 64 || !self.logs[d as usize].is_poisoned() {
            return Ok(d < 64);
        }
        let now = ctx.now_ns();
        if !self.healable(d) || now < self.heal_at[d as usize] {
            return Ok(false);
        }
        self.heal_at[d as usize] = now + RESEND_PAUSE_NS;
        let Ok(_fence) = self.fence() else {
            return Ok(false);
        };
        if self.staged_in[d as usize] != self.config {
            return self.void(ctx, d).await;
        }
        let mut b = ctx.batch();
        self.logs[d as usize].restage(ctx, &mut b)?;
        self.stats.resends += 1;
        let failed = b.submit().await.is_err();
        self.unreached[d as usize] = failed;
        if failed {
            return Ok(false);
        }
        self.landed(ctx, d)?;
        self.unstick(d, false);
        Ok(true)
    }

    /// The ring to `d` was left poisoned by records of an earlier
    /// configuration, which must never land now: machine `d` drained its
    /// logs without them and recovery decided their commits. Once `d`
    /// says it recovered this configuration (so its servers drained), the
    /// head it persisted for this ring is where it stopped for good (no
    /// record of the old configuration lands after the change, and this
    /// coordinator sent nothing since). The records in flight from there
    /// are made void (`Sender::stage_voids`): first those past the head,
    /// then the one at it, so the receiver skips only voids and waits at
    /// the sender's next record. Without this the ring would be lost to
    /// this coordinator for good. Whether the ring serves again.
    async fn void<N: Nic>(&mut self, ctx: &Ctx<N>, d: NodeId) -> Result<bool, TxError> {
        let e = self.config as u64;
        let word = GlobalAddr::host(d, recovered_word(&self.geo, d));
        let Some(w) = self.read_word(ctx, d, word).await else {
            return Ok(false);
        };
        if w < e {
            return Ok(false); // not drained yet
        }
        // Read after the word: the head it gives is the drained one.
        let at = GlobalAddr::host(d, self.logs[d as usize].layout().receiver_head_off);
        let Some(head) = self.read_word(ctx, d, at).await else {
            return Ok(false);
        };
        for past in [true, false] {
            let mut b = ctx.batch();
            let n = match self.logs[d as usize].stage_voids(ctx, &mut b, head, past) {
                Ok(n) => n,
                Err(err) => {
                    log::warn!(
                        "machine {} thread {}: the ring to machine {d}: {err}",
                        self.machine,
                        self.thread
                    );
                    return Ok(false);
                }
            };
            if n == 0 {
                continue;
            }
            let failed = b.submit().await.is_err();
            self.unreached[d as usize] = failed;
            if failed {
                return Ok(false);
            }
        }
        // Voids carry no head: the one the voided records carried was
        // never told.
        self.logs[d as usize].landed(ctx)?;
        self.staged_in[d as usize] = self.config;
        self.stats.rings_voided += 1;
        self.unstick(d, true);
        Ok(true)
    }

    /// One word of machine `d`'s memory, or `None` (and `d` marked
    /// unreached) if the READ failed.
    async fn read_word<N: Nic>(&mut self, ctx: &Ctx<N>, d: NodeId, at: GlobalAddr) -> Option<u64> {
        let mut b = ctx.batch();
        let op = b.read_new(at, 8);
        let word = b.submit().await.ok().map(|done| done.word(op));
        self.unreached[d as usize] = word.is_none();
        word
    }

    /// The records staged for machine `d` landed: its sender moves past
    /// them, and the reply ring's head they carried is told.
    fn landed<N: Nic>(&mut self, ctx: &Ctx<N>, d: NodeId) -> Result<(), TxError> {
        self.logs[d as usize].landed(ctx)?;
        self.replies[d as usize].told(self.staged_head[d as usize]);
        Ok(())
    }

    /// After a failed batch that staged records for machines `ds`: the
    /// senders whose WRITEs were posted and all succeeded move on; the
    /// rest stay poisoned, their records in flight: where a WRITE failed
    /// (which landed is unknown), and where the post was refused (nothing
    /// went). Both go again by [`Self::heal`] or are given up; a refused
    /// record forgotten here instead left its commit's LOCKs held with
    /// nothing to ask for the configuration change that would release
    /// them (both machines hold their leases).
    fn land_what_landed<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        ds: &[NodeId],
        dead: bool,
    ) -> Result<(), TxError> {
        let Some((posted, failed)) = ctx.last_batch_nodes() else {
            return Ok(());
        };
        for &d in ds.iter().filter(|&&d| d < 64) {
            let bit = 1u64 << d;
            if posted & bit == 0 && (dead || self.follows.is_none()) {
                // Nothing heals the ring: a record that never went is
                // forgotten, so that only its commit fails, not every
                // later one to `d` (without a configuration to follow),
                // or the commit goes to the configuration change at once
                // (the refusal was of a node known dead: [`refused_dead`]).
                self.logs[d as usize].unstage();
            } else if posted & bit != 0 && failed & bit == 0 {
                self.landed(ctx, d)?;
            }
        }
        Ok(())
    }

    /// Posting a batch of records of this coordinator's configuration:
    /// counted by the machine until the fence drops; refused if the
    /// machine moved on.
    fn fence(&self) -> Result<Option<crate::recovery::Fence>, TxError> {
        match &self.follows {
            None => Ok(None),
            Some(m) => m
                .enter(self.config as u64)
                .map(Some)
                .ok_or(TxError::Reconfigured),
        }
    }

    /// A commit cut off by an error (a failed machine, or the machine
    /// moving on): once the configuration that follows the failure is
    /// taken, recovery has decided it.
    async fn resolve<N: Nic>(&mut self, ctx: &Ctx<N>, tx: &Tx, e: TxError) -> Result<(), TxError> {
        self.wait_past(ctx, tx.id.config as u64, e).await?;
        self.cut_off = Some(tx.id);
        let r = self.gate(ctx).await;
        self.cut_off = None;
        r?;
        match self.decided.remove(&tx.id) {
            Some(true) => Ok(()),
            _ => Err(TxError::Aborted(Abort::Failure)),
        }
    }

    /// How long a coordinator waits on a configuration change:
    /// [`GATE_WAIT_NS`], or four leases where that is longer (a change is
    /// committed a lease after its install, and a CM failing meanwhile
    /// costs a lease more to suspect and a turn to replace).
    fn gate_wait_ns(&self) -> u64 {
        let lease = self.follows.as_ref().map_or(0, |m| m.membership.lease_ns());
        GATE_WAIT_NS.max(lease.saturating_mul(4))
    }

    /// A transaction's reads are done (and validated), and its records,
    /// if it wrote, acknowledged: it is reported committed only while
    /// this machine's leases hold ([`crate::lease::Membership::serving`]).
    /// Until its leases ran out, no configuration without this machine
    /// can have been committed, so no transaction has written where it
    /// read since, and no machine has drained its logs without the
    /// records it wrote. It waits for a lease renewed; a configuration
    /// change meanwhile aborts a `read_only` one (nothing was written)
    /// and leaves a read-write one to recovery (`TxError::Reconfigured`:
    /// [`Self::resolve`]); a machine without a lease for
    /// [`Self::gate_wait_ns`] stops with an error.
    async fn serve<N: Nic>(&mut self, ctx: &Ctx<N>, read_only: bool) -> Result<(), TxError> {
        let Some(m) = self.follows.clone() else {
            return Ok(());
        };
        let deadline = ctx.now_ns() + self.gate_wait_ns();
        loop {
            let (epoch, until) = m.membership.serving();
            if epoch == self.config as u64 && ctx.now_ns() < until {
                return Ok(());
            }
            // No lease now: what may be a long wait, or a change of
            // configuration, holds no COMMIT-PRIMARY in flight.
            self.land_unsettled(ctx).await?;
            if m.membership.epoch() != self.config as u64 || m.membership.is_removed() {
                return Err(match read_only {
                    true => TxError::Aborted(Abort::Failure),
                    false => TxError::Reconfigured,
                });
            }
            if ctx.now_ns() >= deadline {
                return Err(TxError::Protocol(format!(
                    "machine {} has held no lease for {} ms",
                    self.machine,
                    self.gate_wait_ns() / 1_000_000
                )));
            }
            ctx.sleep(GATE_POLL_NS)?.await;
        }
    }

    /// After `e` cut this coordinator's work in configuration `config`
    /// off (a record to a machine that failed): waits for the machine to
    /// install a later configuration, the COMMIT-PRIMARY records in
    /// flight settled first ([`Self::land_unsettled`]). The error
    /// stands without a configuration to follow, when none comes within
    /// [`Self::gate_wait_ns`], or when this machine was removed.
    async fn wait_past<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        config: u64,
        e: TxError,
    ) -> Result<(), TxError> {
        let Some(m) = self.follows.clone() else {
            return Err(e);
        };
        self.land_unsettled(ctx).await?;
        let deadline = ctx.now_ns() + self.gate_wait_ns();
        while m.membership.epoch() <= config {
            if ctx.now_ns() >= deadline || m.membership.is_removed() {
                return Err(e);
            }
            ctx.sleep(GATE_POLL_NS)?.await;
        }
        Ok(())
    }

    /// The COMMIT-PRIMARY records still in flight, once their completions
    /// are in: those that landed move their senders on, so that no ring
    /// to a machine that stays is left poisoned by a record that landed;
    /// one that failed leaves its ring poisoned, to go again before the
    /// next record to it in this configuration (`try_commit` heals every
    /// ring it needs), or never (recovery decides its transaction). The
    /// fence they held drops.
    async fn land_unsettled<N: Nic>(&mut self, ctx: &Ctx<N>) -> Result<(), TxError> {
        if !self.unsettled.is_empty() {
            // An error is a failed record: land_what_landed tells which.
            let _ = ctx.settle().await;
            let ds = std::mem::take(&mut self.unsettled);
            self.land_what_landed(ctx, &ds, false)?;
            self.hold_stuck(&ds);
        }
        self.unsettled_fence = None;
        Ok(())
    }

    /// The COMMIT-PRIMARY batch of `self.unsettled_tx` to machines `ds`
    /// settled: where rings stay poisoned (records that did not land),
    /// the commit is stuck until they land or are made void
    /// ([`Self::stuck`]), and its truncations are held back.
    fn hold_stuck(&mut self, ds: &[NodeId]) {
        let Some(t) = self.unsettled_tx.take() else {
            return;
        };
        let mask = ds
            .iter()
            .filter(|&&d| d < 64 && self.logs[d as usize].is_poisoned())
            .fold(0u64, |m, &d| m | 1 << d);
        if mask == 0 {
            return;
        }
        let mut held = Vec::new();
        for (d, p) in self.pending.iter_mut().enumerate() {
            if let Some(i) = p.iter().position(|&x| x == t) {
                p.remove(i);
                held.push(d as NodeId);
            }
        }
        self.stuck.insert(t, (mask, held, false));
        self.stats.stuck_commits += 1;
    }

    /// The ring to `d` healed (`voided`: its records made void): stuck
    /// commits no longer wait on it; one whose records all landed has
    /// its truncations go.
    fn unstick(&mut self, d: NodeId, voided: bool) {
        let mut done = Vec::new();
        for (t, (mask, _, void)) in self.stuck.iter_mut() {
            if *mask & 1 << d != 0 {
                *mask &= !(1 << d);
                *void |= voided;
                if *mask == 0 && !*void {
                    done.push(*t);
                }
            }
        }
        for t in done {
            let (_, held, _) = self.stuck.remove(&t).expect("just seen");
            for d in held {
                self.pending[d as usize].push(t);
            }
        }
    }

    /// A record outside a commit (TRUNCATE, DONE) failed with `e`: once
    /// the configuration that follows the failure is taken (recovery run,
    /// the truncations meant for removed machines dropped), the work goes
    /// on; a usage error or an abort stands.
    async fn outlast<N: Nic>(&mut self, ctx: &Ctx<N>, e: TxError) -> Result<(), TxError> {
        if matches!(e, TxError::Aborted(_) | TxError::Usage(_)) {
            return Err(e);
        }
        self.wait_past(ctx, self.config as u64, e).await?;
        self.gate(ctx).await
    }

    pub fn stats(&self) -> CoordStats {
        self.stats
    }

    /// Machine `d`'s reply ring to this coordinator, for checks and
    /// diagnosis: the head it consumed to, and the head counted as told
    /// to `d`'s server (by a report, or on a record that landed). The
    /// second is never past what the server heard (the word at its ring's
    /// `sender_head_off`): counting one it never heard would keep the
    /// report back while the server waits for room.
    pub fn reply_heads(&self, d: NodeId) -> (u64, u64) {
        let r = &self.replies[d as usize];
        (r.head(), r.reported())
    }

    /// This machine's region map (a read lock: drop it before awaiting).
    pub fn map(&self) -> std::sync::RwLockReadGuard<'_, RegionMap> {
        self.map.read().expect("no panics hold the map")
    }

    /// A new transaction.
    pub fn begin(&mut self) -> Tx {
        self.next += 1;
        Tx {
            id: TxId {
                config: self.config,
                machine: self.machine,
                thread: self.thread,
                local: self.next,
            },
            reads: BTreeMap::new(),
            writes: BTreeMap::new(),
            ops: BTreeMap::new(),
            allocs: BTreeSet::new(),
            slab: BTreeSet::new(),
        }
    }

    /// Reads the object of `len` payload bytes at `at` in `tx`: its
    /// buffered write if `tx` wrote it, the copy `tx` read if it read it,
    /// else a consistent copy by one-sided READs.
    pub async fn read<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        tx: &mut Tx,
        at: ObjAddr,
        len: usize,
    ) -> Result<Vec<u8>, TxError> {
        if let Some(s) = tx.reads.get(&at) {
            if s.value.len() != len {
                return Err(TxError::Usage(format!(
                    "object {at:?} read as {len} bytes, before as {}",
                    s.value.len()
                )));
            }
            return Ok(tx.writes.get(&at).unwrap_or(&s.value).clone());
        }
        let r = self.read_object(ctx, at, len).await?;
        if at.offset >= self.geo.static_bytes {
            tx.slab.insert(at);
        }
        tx.reads.insert(
            at,
            Seen {
                header: r.header,
                value: r.payload.clone(),
            },
        );
        Ok(r.payload)
    }

    /// FaRM's lock-free read of one object outside a transaction.
    pub async fn read_object<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        at: ObjAddr,
        len: usize,
    ) -> Result<object::Read, TxError> {
        self.gate(ctx).await?;
        self.active(ctx, at.region).await?;
        if len > object::MAX_PAYLOAD {
            return Err(TxError::Usage(format!(
                "an object of {len} bytes (at most {})",
                object::MAX_PAYLOAD
            )));
        }
        self.map().visible(at.region)?;
        let addr = self.map().on_primary(at, object_bytes(len) as u64)?;
        // The next batch would forget a failure of the last commit's.
        self.settle(ctx).await?;
        if at.offset >= self.geo.static_bytes {
            self.check_slot(ctx, at, len).await?;
        }
        let deadline = ctx.now_ns() + READ_WAIT_NS;
        loop {
            match object::read(ctx, addr, len, READ_TRIES).await {
                Ok(r) if r.header.is_free() => {
                    self.stats.object_reads += r.reads as u64;
                    return Err(TxError::Freed(at));
                }
                Ok(r) => {
                    self.stats.object_reads += r.reads as u64;
                    return Ok(r);
                }
                Err(ObjectError::Busy { tries, .. }) => {
                    self.stats.object_reads += tries as u64;
                    if ctx.now_ns() >= deadline {
                        return Err(TxError::Aborted(Abort::Busy));
                    }
                    // A lock held across a configuration change may be a
                    // cut-off commit's, which only recovery releases, and
                    // recovery waits for this read's transaction to leave
                    // the old configuration: give up rather than spin out
                    // the deadline.
                    if let Some(m) = &self.follows {
                        if m.membership.epoch() != self.config as u64 {
                            return Err(TxError::Aborted(Abort::Changed));
                        }
                    }
                    ctx.yield_now().await;
                }
                Err(ObjectError::Verb(_)) if self.follows.is_some() => {
                    return Err(TxError::Aborted(Abort::Failure))
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Whether `at` is a slot of a formatted allocator block for objects
    /// of `len` bytes (the block's header READ once, then cached).
    async fn check_slot<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        at: ObjAddr,
        len: usize,
    ) -> Result<(), TxError> {
        let g = self.geo;
        let (block, _) =
            crate::alloc::slot_of(g.static_bytes, g.block_bytes, at.offset, len.max(1))
                .expect("offset past the fixed tables");
        let class = match self.blocks.get(&(at.region, block)) {
            Some(&c) => c,
            None => {
                let head = ObjAddr {
                    region: at.region,
                    offset: block,
                };
                let a = self.map().on_primary(head, 8)?;
                let w = ctx.read(a, 8).await?.u64_at(0);
                self.stats.block_reads += 1;
                let Some(c) = crate::alloc::block_class(w) else {
                    return Err(TxError::NotAnObject(format!(
                        "offset {} of region {} is in an allocator block never formatted",
                        at.offset, at.region
                    )));
                };
                self.blocks.insert((at.region, block), c);
                c
            }
        };
        let slot = crate::alloc::slot_of(g.static_bytes, g.block_bytes, at.offset, class);
        if class != len || !slot.is_some_and(|s| s.1) {
            return Err(TxError::NotAnObject(format!(
                "offset {} of region {} is not a slot of its block's {class}-byte objects (read as {len} bytes)",
                at.offset, at.region
            )));
        }
        Ok(())
    }

    /// Allocates an object of `len` payload bytes in region `region` for
    /// `tx`: a slot reserved at the region's primary (one message and its
    /// answer), written with `len` zero bytes at commit unless `tx` writes
    /// it. Aborting `tx` gives the slot back.
    pub async fn alloc<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        tx: &mut Tx,
        region: u32,
        len: usize,
    ) -> Result<ObjAddr, TxError> {
        self.gate(ctx).await?;
        if len == 0 || len > object::MAX_PAYLOAD {
            return Err(TxError::Usage(format!(
                "an object of {len} bytes (1 ..= {})",
                object::MAX_PAYLOAD
            )));
        }
        self.map().visible(region)?;
        let p = self.map().get(region)?.primary.machine;
        self.send_one(
            ctx,
            p,
            Record::Alloc {
                tx: tx.id,
                region,
                len: len as u32,
            },
        )
        .await?;
        self.stats.alloc_records += 1;
        tx.allocs.insert(p);
        let slot = match self.answer(ctx, tx.id, p).await? {
            Record::AllocReply { slot, .. } => slot,
            r => {
                return Err(TxError::Protocol(format!(
                    "machine {p} answered ALLOC with {r:?}"
                )))
            }
        };
        let Some((offset, header)) = slot else {
            return Err(TxError::NoSpace { region, len });
        };
        let at = ObjAddr { region, offset };
        let header = Header(header);
        if !header.is_free() || header.locked() {
            return Err(TxError::Protocol(format!(
                "machine {p} reserved a slot that is not free"
            )));
        }
        tx.reads.insert(
            at,
            Seen {
                header,
                value: vec![0; len],
            },
        );
        tx.slab.insert(at);
        tx.writes.insert(at, vec![0; len]);
        tx.ops.insert(at, WriteOp::Alloc);
        Ok(at)
    }

    /// Creates a region (as FaRM's configuration manager does; here the
    /// coordinator of machine 0, thread 0): its primary and f backups on
    /// consecutive machines, each in a spare slot of its memory. Two
    /// phases: PREPARE to the replicas (each checks the slot is free,
    /// zeroes it and serves the region, hidden from coordinators), then
    /// COMMIT to every machine (the region joins its map for
    /// coordinators); the region exists once every machine answered.
    /// Returns its id.
    pub async fn create_region<N: Nic>(&mut self, ctx: &Ctx<N>) -> Result<u32, TxError> {
        self.gate(ctx).await?;
        if (self.machine, self.thread) != (0, 0) {
            return Err(TxError::Usage(
                "regions are created by the configuration manager (machine 0, thread 0)".into(),
            ));
        }
        let g = self.geo;
        let id = g.regions() + self.created;
        let m = g.machines as u32;
        let machines: Vec<NodeId> = (0..=g.f as u32)
            .map(|j| ((id % m + j) % m) as NodeId)
            .collect();
        if machines
            .iter()
            .any(|&mc| self.spare_used[mc as usize] >= g.spare_slots())
        {
            return Err(TxError::Usage(format!(
                "no spare memory for region {id}: {} spare regions a machine are in use",
                g.spare_regions_per_machine
            )));
        }
        let replicas: Vec<(u16, u64)> = machines
            .iter()
            .map(|&mc| (mc, g.spare_base(self.spare_used[mc as usize])))
            .collect();
        let tx = self.begin().id;
        // Replicas serve the region from PREPARE on, but no coordinator
        // uses it before COMMIT, which goes out once every replica
        // prepared: a coordinator that finds it in its map finds it served.
        for commit in [false, true] {
            let to: Vec<NodeId> = if commit {
                (0..g.machines).collect()
            } else {
                machines.clone()
            };
            for &d in &to {
                self.send_one(
                    ctx,
                    d,
                    Record::NewRegion {
                        tx,
                        region: id,
                        bytes: g.region_bytes,
                        replicas: replicas.clone(),
                        commit,
                    },
                )
                .await?;
                self.stats.alloc_records += 1;
            }
            let answers = self.answers(ctx, tx, &to).await?;
            if let Some((d, _)) = answers.iter().find(|a| !a.1) {
                let phase = if commit { "commit" } else { "prepare" };
                return Err(TxError::Protocol(format!(
                    "machine {d} refused to {phase} region {id}"
                )));
            }
        }
        for &mc in &machines {
            self.spare_used[mc as usize] += 1;
        }
        self.created += 1;
        Ok(id)
    }

    /// Gives `tx` up without committing: nothing it wrote was ever
    /// visible; the slots it allocated go back (an ABORT to each primary
    /// holding one).
    pub async fn abort<N: Nic>(&mut self, ctx: &Ctx<N>, tx: Tx) -> Result<(), TxError> {
        for &p in &tx.allocs {
            self.send_one(ctx, p, Record::Abort { tx: tx.id }).await?;
            self.stats.alloc_records += 1;
        }
        Ok(())
    }

    /// Commits `tx`: committed, or aborted with the reason (nothing it
    /// wrote visible). An error is a broken cluster or protocol, not a
    /// conflict.
    pub async fn commit<N: Nic>(&mut self, ctx: &Ctx<N>, tx: Tx) -> Result<Outcome, TxError> {
        let r = match self.try_commit(ctx, &tx).await {
            Err(e) if !matches!(e, TxError::Aborted(_) | TxError::Usage(_)) => {
                self.resolve(ctx, &tx, e).await
            }
            r => r,
        };
        match r {
            Ok(()) => {
                self.stats.committed += 1;
                self.stats.committed_read_only += u64::from(tx.is_read_only());
                Ok(Outcome::Committed)
            }
            Err(TxError::Aborted(a)) => {
                self.stats.aborted[a.index()] += 1;
                Ok(Outcome::Aborted(a))
            }
            Err(e) => Err(e),
        }
    }

    async fn try_commit<N: Nic>(&mut self, ctx: &Ctx<N>, tx: &Tx) -> Result<(), TxError> {
        self.settle(ctx).await?;
        if tx.id.config != self.config {
            // Its reads were of another configuration's map.
            return Err(TxError::Aborted(Abort::Changed));
        }
        self.gate(ctx).await?;
        if tx.id.config != self.config {
            return Err(TxError::Aborted(Abort::Changed));
        }
        if tx.writes.is_empty() && tx.reads.len() <= 1 {
            return self.serve(ctx, true).await;
        }
        let mut plan = self.plan(tx)?;
        if self.follows.is_some() {
            // A ring it needs that a failed link left poisoned goes again
            // (a try at most every pause); if it does not heal, the
            // machine failed, or the link is down still: nothing is sent.
            let need: Vec<NodeId> = plan.keys().copied().collect();
            for d in need {
                if !self.try_heal(ctx, d).await? {
                    return Err(TxError::Aborted(Abort::Failure));
                }
            }
        }
        self.reserve(ctx, &mut plan).await?;
        let r = self.phases(ctx, tx, &mut plan).await;
        for (d, dest) in plan.iter_mut() {
            if let Some(res) = dest.reservation.take() {
                self.logs[*d as usize].release(res)?;
            }
        }
        r?;
        // Reported only under the machine's leases, read-write commits
        // too: a machine removed while it still reaches the others (a
        // partition from the CM alone, or a core that stalled through its
        // removal) could otherwise have a commit's records acknowledged
        // after the others drained their logs and decided the commit
        // without them.
        self.serve(ctx, tx.writes.is_empty()).await?;
        if let Some(m) = &self.follows {
            // Acknowledged in this configuration, before the machine moved
            // on: every record landed before any machine drains.
            if m.membership.epoch() != tx.id.config as u64 {
                return Err(TxError::Reconfigured);
            }
        }
        for (&d, dest) in &plan {
            if dest.lock.is_some() || dest.backup.is_some() {
                match self.stuck.get_mut(&tx.id) {
                    // Held back until its COMMIT-PRIMARYs land.
                    Some(s) => s.1.push(d),
                    None => self.pending[d as usize].push(tx.id),
                }
            }
        }
        for d in 0..self.geo.machines {
            if self.pending[d as usize].len() > PENDING_MAX {
                self.flush_one(ctx, d).await?;
            }
        }
        Ok(())
    }

    /// Every record the commit may send, by machine.
    fn plan(&self, tx: &Tx) -> Result<BTreeMap<NodeId, Dest>, TxError> {
        let map = self.map();
        let mut locks: BTreeMap<NodeId, (BTreeSet<u32>, Vec<Write>)> = BTreeMap::new();
        let mut backups: BTreeMap<NodeId, (BTreeSet<u32>, Vec<Write>)> = BTreeMap::new();
        for (at, value) in &tx.writes {
            let region = map.get(at.region)?;
            let w = Write {
                at: *at,
                version: tx.reads[at].header.0,
                op: tx.ops.get(at).copied().unwrap_or(WriteOp::Update),
                value: value.clone(),
            };
            let l = locks.entry(region.primary.machine).or_default();
            l.0.insert(at.region);
            l.1.push(w.clone());
            for b in &region.backups {
                let e = backups.entry(b.machine).or_default();
                e.0.insert(at.region);
                e.1.push(w.clone());
            }
        }
        let mut reads: BTreeMap<NodeId, Vec<(ObjAddr, Header)>> = BTreeMap::new();
        for (at, seen) in &tx.reads {
            if !tx.writes.contains_key(at) {
                let p = map.get(at.region)?.primary.machine;
                reads.entry(p).or_default().push((*at, seen.header));
            }
        }
        // Every record names every region written: recovery needs the
        // whole set from any one of them.
        let all: Vec<u32> = tx
            .writes
            .keys()
            .map(|a| a.region)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut plan: BTreeMap<NodeId, Dest> = BTreeMap::new();
        // The first record to a machine (records go in the order they are
        // made here) carries its pending truncations.
        let m = self.geo.machines as usize;
        let (mut first, mut carried) = (vec![true; m], vec![0usize; m]);
        let pending = &self.pending;
        let mut env = |d: NodeId, record: Record| -> Result<Vec<u8>, TxError> {
            let d = d as usize;
            let n = if std::mem::take(&mut first[d]) {
                carried[d] = pending[d].len().min(CARRY_MAX);
                carried[d]
            } else {
                0
            };
            Ok(Envelope {
                head: 0,
                truncate: pending[d][..n].to_vec(),
                record,
            }
            .encode()?)
        };
        for (d, (_, writes)) in locks {
            let dest = plan.entry(d).or_default();
            dest.lock = Some(env(
                d,
                Record::Lock {
                    tx: tx.id,
                    regions: all.clone(),
                    writes,
                },
            )?);
        }
        for (d, objs) in reads {
            let dest = plan.entry(d).or_default();
            if objs.len() > VALIDATE_READS_MAX {
                let objects = objs.iter().map(|(a, h)| (*a, h.0)).collect();
                dest.validate = Some(env(d, Record::Validate { tx: tx.id, objects })?);
            } else {
                for (at, h) in objs {
                    dest.validate_reads.push((map.on_primary(at, 8)?, h));
                }
            }
        }
        for (d, (_, writes)) in backups {
            let dest = plan.entry(d).or_default();
            dest.backup = Some(env(
                d,
                Record::CommitBackup {
                    tx: tx.id,
                    regions: all.clone(),
                    writes,
                },
            )?);
        }
        for (&d, dest) in plan.iter_mut() {
            if dest.lock.is_some() {
                let commit = env(d, Record::CommitPrimary { tx: tx.id })?;
                let abort = env(d, Record::Abort { tx: tx.id })?;
                dest.finish = Some((commit, abort));
            }
        }
        for (&d, dest) in plan.iter_mut() {
            dest.carried = carried[d as usize];
        }
        Ok(plan)
    }

    /// Reserves every ring's room for the commit, waiting for room until
    /// [`LOG_WAIT_NS`]; `LogFull` after that.
    async fn reserve<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        plan: &mut BTreeMap<NodeId, Dest>,
    ) -> Result<(), TxError> {
        let deadline = ctx.now_ns() + LOG_WAIT_NS;
        'again: loop {
            for (&d, dest) in plan.iter_mut() {
                let lens = dest.lens();
                if lens.is_empty() || dest.reservation.is_some() {
                    continue;
                }
                match self.logs[d as usize].reserve(ctx, &lens) {
                    Ok(r) => dest.reservation = Some(r),
                    Err(RingError::ReservationTooLarge { .. }) => {
                        for (&e, dest) in plan.iter_mut() {
                            if let Some(r) = dest.reservation.take() {
                                self.logs[e as usize].release(r)?;
                            }
                        }
                        if ctx.now_ns() >= deadline {
                            return Err(TxError::Aborted(Abort::LogFull));
                        }
                        if self.logs[d as usize]
                            .wait_for_head(ctx, Some(deadline))
                            .await?
                        {
                            self.stats.heads_fetched += 1;
                        }
                        continue 'again;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            return Ok(());
        }
    }

    async fn phases<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        tx: &Tx,
        plan: &mut BTreeMap<NodeId, Dest>,
    ) -> Result<(), TxError> {
        // LOCK.
        let locks: Vec<(NodeId, Vec<u8>)> = plan
            .iter()
            .filter_map(|(&d, p)| p.lock.clone().map(|l| (d, l)))
            .collect();
        let primaries: Vec<NodeId> = locks.iter().map(|l| l.0).collect();
        self.send(ctx, plan, locks).await?;
        self.stats.lock_records += primaries.len() as u64;
        let backup_machines: Vec<NodeId> = plan
            .iter()
            .filter(|(_, p)| p.backup.is_some())
            .map(|(&d, _)| d)
            .collect();
        self.spring(ctx, Step::Lock, tx.id, &primaries, &backup_machines);
        let answers = self.answers(ctx, tx.id, &primaries).await?;
        let ok = answers.iter().filter(|a| a.1).count();
        // ABORT goes where locks are held or slots reserved.
        let locked: Vec<NodeId> = answers
            .iter()
            .filter(|a| a.1 || tx.allocs.contains(&a.0))
            .map(|a| a.0)
            .collect();
        if ok < primaries.len() {
            self.abort_locked(ctx, plan, &locked).await?;
            return Err(TxError::Aborted(Abort::Locked));
        }
        // VALIDATE.
        if !self.validate(ctx, tx, plan).await? {
            self.abort_locked(ctx, plan, &locked).await?;
            return Err(TxError::Aborted(Abort::Changed));
        }
        self.spring(ctx, Step::Validate, tx.id, &primaries, &backup_machines);
        if tx.writes.is_empty() {
            return Ok(());
        }
        // COMMIT-BACKUP: its batch completes when the NIC acknowledged
        // every record.
        let backups: Vec<(NodeId, Vec<u8>)> = plan
            .iter()
            .filter_map(|(&d, p)| p.backup.clone().map(|b| (d, b)))
            .collect();
        let n = backups.len() as u64;
        self.send(ctx, plan, backups).await?;
        self.stats.backup_records += n;
        self.spring(ctx, Step::CommitBackup, tx.id, &primaries, &backup_machines);
        // COMMIT-PRIMARY.
        let commits: Vec<(NodeId, Vec<u8>)> = plan
            .iter()
            .filter_map(|(&d, p)| p.finish.as_ref().map(|f| (d, f.0.clone())))
            .collect();
        let n = commits.len() as u64;
        self.send_commits(ctx, plan, commits, tx.id).await?;
        self.stats.commit_records += n;
        self.spring(
            ctx,
            Step::CommitPrimary,
            tx.id,
            &primaries,
            &backup_machines,
        );
        Ok(())
    }

    /// COMMIT-PRIMARY: the records in one batch (a batch's worth at a time
    /// when there are more), the commit reported at the first
    /// acknowledgement of the last batch (FaRM §4); the rest of it settles
    /// before this coordinator's next batch.
    async fn send_commits<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        plan: &mut BTreeMap<NodeId, Dest>,
        mut msgs: Vec<(NodeId, Vec<u8>)>,
        tx: TxId,
    ) -> Result<(), TxError> {
        let last = msgs.split_off(msgs.len().saturating_sub(RECORDS_PER_BATCH));
        self.send(ctx, plan, msgs).await?;
        let fence = self.fence()?;
        let mut b = ctx.batch();
        for (i, (d, p)) in last.iter().enumerate() {
            debug_assert_eq!(
                plan[d].carried, 0,
                "a primary's LOCK carried its truncations"
            );
            if let Err(e) = self.stage(ctx, &mut b, plan, *d, p) {
                for (d, _) in &last[..i] {
                    self.logs[*d as usize].unstage();
                }
                return Err(e);
            }
        }
        if let Err(e) = b.submit_first().await {
            let ds: Vec<NodeId> = last.iter().map(|c| c.0).collect();
            // The other doorbells in, so that what landed is known.
            if self.follows.is_some() {
                let _ = ctx.settle().await;
            }
            if !self.land_and_heal(ctx, &ds, &e).await? {
                return Err(e.into());
            }
            return Ok(());
        }
        self.unsettled.extend(last.iter().map(|m| m.0));
        self.unsettled_fence = fence;
        self.unsettled_tx = Some(tx);
        Ok(())
    }

    /// Puts machine `d`'s planned record `p` into `b`, in its reservation,
    /// the reply ring's head patched in.
    fn stage<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        b: &mut nicdrv::Batch<'_, N>,
        plan: &mut BTreeMap<NodeId, Dest>,
        d: NodeId,
        p: &[u8],
    ) -> Result<(), TxError> {
        let mut p = p.to_vec();
        // Told once the record lands (`Coordinator::landed`): marked told
        // here, a record never posted or voided left the sender waiting
        // for a head it never heard.
        let head = self.replies[d as usize].head();
        Envelope::patch_head(&mut p, head);
        self.staged_head[d as usize] = head;
        let r = plan.get_mut(&d).and_then(|x| x.reservation.as_mut());
        let r = r.expect("every planned machine reserved");
        self.logs[d as usize].stage_reserved(ctx, b, r, &p)?;
        self.staged_in[d as usize] = self.config;
        self.stats.log_bytes += p.len() as u64;
        Ok(())
    }

    /// Waits for the COMMIT-PRIMARY records still in flight, then moves
    /// their senders' tails past them; a failure among them leaves those
    /// senders poisoned.
    async fn settle<N: Nic>(&mut self, ctx: &Ctx<N>) -> Result<(), TxError> {
        if self.unsettled.is_empty() {
            return Ok(());
        }
        let settled = ctx.settle().await;
        self.unsettled_fence = None;
        let ds = std::mem::take(&mut self.unsettled);
        match settled {
            Ok(()) => {
                self.unsettled_tx = None;
                for d in ds {
                    self.landed(ctx, d)?;
                }
                Ok(())
            }
            // A COMMIT-PRIMARY to a failed machine: the commit was
            // reported, recovery installs it there. To a machine still in
            // the configuration (a link that failed for a while), it goes
            // again.
            Err(e) => {
                let healed = self.land_and_heal(ctx, &ds, &e).await?;
                self.hold_stuck(&ds);
                if healed || self.follows.is_some() {
                    Ok(())
                } else {
                    Err(e.into())
                }
            }
        }
    }

    async fn abort_locked<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        plan: &mut BTreeMap<NodeId, Dest>,
        locked: &[NodeId],
    ) -> Result<(), TxError> {
        let aborts: Vec<(NodeId, Vec<u8>)> = locked
            .iter()
            .map(|&d| (d, plan[&d].finish.as_ref().expect("a primary").1.clone()))
            .collect();
        self.send(ctx, plan, aborts).await?;
        self.stats.abort_records += locked.len() as u64;
        Ok(())
    }

    /// VALIDATE: whether every object read and not written is as read.
    async fn validate<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        tx: &Tx,
        plan: &mut BTreeMap<NodeId, Dest>,
    ) -> Result<bool, TxError> {
        let msgs: Vec<(NodeId, Vec<u8>)> = plan
            .iter()
            .filter_map(|(&d, p)| p.validate.clone().map(|v| (d, v)))
            .collect();
        let asked: Vec<NodeId> = msgs.iter().map(|m| m.0).collect();
        self.send(ctx, plan, msgs).await?;
        self.stats.validate_records += asked.len() as u64;
        let reads: Vec<(GlobalAddr, Header)> = plan
            .values()
            .flat_map(|p| p.validate_reads.iter().copied())
            .collect();
        let mut ok = true;
        for chunk in reads.chunks(nicdrv::exec::MAX_BATCH) {
            let mut b = ctx.batch();
            let ops: Vec<(OpId, Header)> =
                chunk.iter().map(|&(a, h)| (b.read_new(a, 8), h)).collect();
            let done = match b.submit().await {
                Ok(done) => done,
                // A machine that failed, or a link that failed for a
                // while: the commit aborts (its LOCKs are released by
                // ABORT, posted again until they land, or by recovery).
                Err(_) if self.follows.is_some() => {
                    ok = false;
                    break;
                }
                Err(e) => return Err(e.into()),
            };
            self.stats.validate_reads += ops.len() as u64;
            ok &= ops.iter().all(|&(op, h)| done.word(op) == h.0);
        }
        let answers = self.answers(ctx, tx.id, &asked).await?;
        Ok(ok && answers.iter().all(|a| a.1))
    }

    /// Appends each machine's record in its reservation, in as few batches
    /// as a batch holds (one doorbell per machine each).
    async fn send<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        plan: &mut BTreeMap<NodeId, Dest>,
        msgs: Vec<(NodeId, Vec<u8>)>,
    ) -> Result<(), TxError> {
        self.settle(ctx).await?;
        for chunk in msgs.chunks(RECORDS_PER_BATCH) {
            let _fence = self.fence()?;
            let mut b = ctx.batch();
            for (i, (d, p)) in chunk.iter().enumerate() {
                if let Err(e) = self.stage(ctx, &mut b, plan, *d, p) {
                    // Nothing was posted: what was staged is forgotten.
                    for (d, _) in &chunk[..i] {
                        self.logs[*d as usize].unstage();
                    }
                    return Err(e);
                }
            }
            if let Err(e) = b.submit().await {
                let ds: Vec<NodeId> = chunk.iter().map(|c| c.0).collect();
                if !self.land_and_heal(ctx, &ds, &e).await? {
                    return Err(e.into());
                }
            }
            for (d, _) in chunk {
                self.landed(ctx, *d)?;
                // The truncations the first record carried are delivered.
                let dest = plan.get_mut(d).expect("planned");
                let n = std::mem::take(&mut dest.carried);
                self.pending[*d as usize].drain(..n);
            }
        }
        Ok(())
    }

    /// Waits for the answer of each machine in `from` to `tx`'s LOCK or
    /// VALIDATE; answers to earlier transactions are passed over.
    async fn answers<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        tx: TxId,
        from: &[NodeId],
    ) -> Result<Vec<(NodeId, bool)>, TxError> {
        let mut out = Vec::with_capacity(from.len());
        for &d in from {
            match self.answer(ctx, tx, d).await? {
                Record::LockReply { ok, .. } => out.push((d, ok)),
                r => {
                    return Err(TxError::Protocol(format!(
                        "machine {d} answered LOCK or VALIDATE with {r:?}"
                    )))
                }
            }
        }
        Ok(out)
    }

    /// Waits for machine `d`'s answer to `tx` (a LOCK-REPLY or an
    /// ALLOC-REPLY); answers to earlier transactions are passed over.
    async fn answer<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        tx: TxId,
        d: NodeId,
    ) -> Result<Record, TxError> {
        self.answer_heads(ctx, tx, d, false).await
    }

    /// [`Self::answer`]; with `report`, the reply ring's head goes back
    /// whenever the ring is empty with something consumed (an answer in
    /// many records, as RECOVER-STATE may be, fills the ring before any
    /// record of this coordinator's could carry the head back).
    async fn answer_heads<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        tx: TxId,
        d: NodeId,
        report: bool,
    ) -> Result<Record, TxError> {
        let deadline = ctx.now_ns() + REPLY_WAIT_NS;
        let ring = self.geo.reply_ring(self.thread, d, self.machine);
        loop {
            let got = self.replies[d as usize].try_recv_into(ctx, &mut self.buf)?;
            if got.is_none() {
                if report {
                    // A head that cannot be written (a link down for a
                    // while) stays due and goes with the next look.
                    let r = self.replies[d as usize].report_head(ctx, true).await;
                    if let Err(e) = r {
                        if self.follows.is_none() {
                            return Err(e.into());
                        }
                    }
                }
                if let Some(m) = &self.follows {
                    if m.membership.epoch() != self.config as u64 {
                        return Err(TxError::Reconfigured);
                    }
                }
                if ctx.now_ns() >= deadline {
                    // Up, as its lease says, but it never answered.
                    self.report(d);
                    return Err(TxError::Protocol(format!(
                        "machine {d} did not answer transaction {tx:?}"
                    )));
                }
                // Following a configuration, look at it now and then: a
                // machine that failed after the request landed never
                // answers, and the next configuration says so.
                let until = match self.follows {
                    Some(_) => deadline.min(ctx.now_ns() + GATE_POLL_NS),
                    None => deadline,
                };
                ctx.wait_for_write(ring.ring_off, ring.capacity, Some(until))?
                    .await;
                continue;
            }
            let env = Envelope::decode(&self.buf)?;
            self.logs[d as usize].note_head(ctx, env.head)?;
            match env.record {
                Record::LockReply { tx: t, .. }
                | Record::AllocReply { tx: t, .. }
                | Record::RecoverState { tx: t, .. }
                    if t != tx =>
                {
                    continue
                }
                r @ (Record::LockReply { .. }
                | Record::AllocReply { .. }
                | Record::RecoverState { .. }) => return Ok(r),
                r => {
                    return Err(TxError::Protocol(format!(
                        "machine {d} answered with {r:?}"
                    )))
                }
            }
        }
    }

    /// Ends this coordinator's work: every truncation still waiting goes
    /// out, then DONE to every machine, whose server thread stops once
    /// every coordinator said so.
    pub async fn close<N: Nic>(&mut self, ctx: &Ctx<N>) -> Result<(), TxError> {
        self.flush(ctx).await?;
        let mut tx = self.begin().id;
        let mut d = 0;
        while d < self.geo.machines {
            if self.members[d as usize] {
                if let Err(e) = self.send_one(ctx, d, Record::Done { tx }).await {
                    // A machine failed: DONE goes to the next
                    // configuration's machines, from the first again, in
                    // that configuration (a server that had it already
                    // takes it again as the same news).
                    self.outlast(ctx, e).await?;
                    tx = self.begin().id;
                    d = 0;
                    continue;
                }
                self.stats.done_records += 1;
            }
            d += 1;
        }
        Ok(())
    }

    /// Appends one record outside a commit to machine `d`'s log, with the
    /// reply ring's head piggybacked, waiting for room up to
    /// [`LOG_WAIT_NS`].
    async fn send_one<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        d: NodeId,
        record: Record,
    ) -> Result<(), TxError> {
        self.settle(ctx).await?;
        let _fence = self.fence()?;
        if self.logs[d as usize].is_poisoned() && !self.heal_poisoned(ctx, &[d]).await? {
            return Err(TxError::Ring(crate::ring::RingError::Poisoned));
        }
        self.staged_in[d as usize] = self.config;
        let (to, back) = (&mut self.logs[d as usize], &mut self.replies[d as usize]);
        match Envelope::send(ctx, to, back, record, LOG_WAIT_NS).await {
            Ok(n) => self.stats.log_bytes += n,
            // In flight in a ring the failure poisoned (posted or not): it
            // goes again while the machine stays in the configuration;
            // if it never does, the ring is given up for the configuration
            // and the error stands.
            Err(e) => {
                if !self.logs[d as usize].is_poisoned() || !self.heal_poisoned(ctx, &[d]).await? {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Sends every truncation still waiting, as TRUNCATE records: before a
    /// coordinator stops, so that backups apply every commit.
    pub async fn flush<N: Nic>(&mut self, ctx: &Ctx<N>) -> Result<(), TxError> {
        self.gate(ctx).await?;
        let mut d = 0;
        while d < self.geo.machines {
            match self.flush_one(ctx, d).await {
                Ok(()) => d += 1,
                // A machine failed: its truncations are dropped with it
                // once the next configuration is taken; the rest go on.
                Err(e) => self.outlast(ctx, e).await?,
            }
        }
        Ok(())
    }

    async fn flush_one<N: Nic>(&mut self, ctx: &Ctx<N>, d: NodeId) -> Result<(), TxError> {
        loop {
            // Settled before the list is read: settling a commit whose
            // COMMIT-PRIMARY did not land holds its truncations back
            // (`hold_stuck`), which a list read before would have sent,
            // and then drained entries it no longer had.
            self.settle(ctx).await?;
            let n = self.pending[d as usize].len().min(4 * CARRY_MAX);
            if n == 0 {
                return Ok(());
            }
            let txs = self.pending[d as usize][..n].to_vec();
            let last = txs[n - 1];
            self.send_one(ctx, d, Record::Truncate { txs: txs.clone() })
                .await?;
            self.stats.truncate_records += 1;
            // By identity: nothing since the settle above takes entries
            // out (a ring healed meanwhile only appends unstuck ones).
            let p = &mut self.pending[d as usize];
            if p.starts_with(&txs) {
                p.drain(..n);
            } else {
                debug_assert!(false, "pending truncations changed under a TRUNCATE");
                p.retain(|t| !txs.contains(t));
            }
            self.spring(ctx, Step::Truncate, last, &[d], &[]);
        }
    }
}
