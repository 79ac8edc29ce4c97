//! Failure detection by leases (FaRM §5.1).
//!
//! Every machine holds a lease at the configuration manager (CM), and the
//! CM holds one at every machine, set up by a three-way handshake that is
//! also how a lease is renewed: the machine sends REQUEST(s); the CM, on
//! reading it, extends the machine's lease to now + L and answers
//! GRANT(s), which also asks for its own lease at the machine; the
//! machine, on reading the grant, grants the CM's lease until now + L and
//! answers ACK(s). A machine renews every `renew_ns` (FaRM: a fifth of
//! the lease).
//!
//! The CM suspects a machine whose lease expired: no REQUEST in L. A
//! machine suspects the CM when the CM's lease at it expired: no GRANT in
//! L. Suspicions go to the machine's [`Membership`], for reconfiguration
//! (`reconfig`), which also moves the membership to new configurations.
//!
//! Messages are one word, written by one RDMA WRITE into the receiver's
//! lease line for the sender ([`Geometry::lease_word`]: word 0 lease
//! messages, word 1 configuration messages), so a receiver polls its own
//! memory and a sender owns its line: `kind:4 | config:20 | seq:40`. An
//! aligned word never tears. A word whose kind is unknown is malformed;
//! one of another configuration is stale (a machine of an old
//! configuration, or a replay); one out of sequence (a request that is
//! not the next one) is not the sender's; one from a machine outside the
//! configuration is precise membership's to refuse: all are refused and
//! counted, never acted on. A one-sided WRITE carries no sender identity,
//! so a well-formed word of the configuration, in sequence, is taken as
//! its line's owner's: the lease lines are as safe as the region key that
//! reaches them, like every ring.
//!
//! Load cannot starve these tasks: they run on a core of their own on
//! every machine (FaRM used a dedicated high-priority thread), one task
//! for every other machine, whose role the configuration decides (grant
//! at the CM, hold at a machine whose CM is that peer, else nothing), so
//! a peer that stops answering (its WRITEs wait out the transport
//! timeout) delays no other peer's grants.

use crate::config::Stored;
use crate::error::TxError;
use crate::layout::Geometry;
use nicdrv::{Ctx, GlobalAddr, Nic, NodeId, Space};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Lease timing.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The lease (FaRM: 10 ms).
    pub lease_ns: u64,
    /// How often a machine renews (FaRM: a fifth of the lease).
    pub renew_ns: u64,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig::of(10_000_000)
    }
}

impl LeaseConfig {
    /// A lease of `lease_ns`, renewed every fifth of it.
    pub fn of(lease_ns: u64) -> LeaseConfig {
        LeaseConfig {
            lease_ns,
            renew_ns: lease_ns / 5,
        }
    }

    /// A lease of `ms` milliseconds (what command lines take), renewed
    /// every fifth of it, checked: in (0, 10 000] ms.
    pub fn from_ms(ms: f64) -> Result<LeaseConfig, String> {
        let l = LeaseConfig::of((ms * 1e6) as u64);
        if !(ms.is_finite() && ms > 0.0 && ms <= 10_000.0) || l.check().is_err() {
            return Err("a lease in (0, 10000] ms, at least 5 ns".into());
        }
        Ok(l)
    }

    pub fn check(&self) -> Result<(), TxError> {
        if self.renew_ns == 0 || self.renew_ns >= self.lease_ns || self.lease_ns > 10_000_000_000 {
            return Err(TxError::Usage(format!(
                "a lease of {} ns renewed every {} ns: renewals must come within the lease (and a lease of at most 10 s)",
                self.lease_ns, self.renew_ns
            )));
        }
        Ok(())
    }
}

/// What a lease message says.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A machine asks for (or renews) its lease at the CM.
    Request = 1,
    /// The CM grants it, and asks for its own lease at the machine.
    Grant = 2,
    /// The machine grants the CM's lease.
    Ack = 3,
    /// The sender stops (the run is over): no suspicion when it goes
    /// silent.
    Leave = 4,
    /// Configuration messages (word 1 of the line; `seq` is the new
    /// configuration's number): the CM's NEW-CONFIG, a machine's
    /// NEW-CONFIG-ACK, the CM's NEW-CONFIG-COMMIT.
    NewConfig = 5,
    NewConfigAck = 6,
    NewConfigCommit = 7,
    /// A machine tells the CM that it cannot reach machine `seq − 1`
    /// though both hold their leases (word 3 of its line; `config` is the
    /// configuration it was raised in): a link between them failed for
    /// longer than resends could bridge ([`Membership::report`]).
    Unreachable = 8,
}

/// How long the first lease of a run may take to be set up (requested
/// and granted): the machines start their lease cores once the
/// bootstrap's barrier saw all of them, but not at one instant.
pub const JOIN_NS: u64 = 1_000_000_000;

/// One lease message.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Msg {
    pub kind: Kind,
    /// The low 20 bits of the sender's configuration number.
    pub config: u32,
    /// The handshake's number (40 bits; 0 is never sent).
    pub seq: u64,
}

const CONFIG_BITS: u32 = 20;
const SEQ_BITS: u32 = 40;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
const CONFIG_MASK: u64 = (1 << CONFIG_BITS) - 1;

/// The low bits of configuration `id` that lease messages carry.
pub fn config_tag(id: u64) -> u32 {
    (id & CONFIG_MASK) as u32
}

impl Msg {
    pub fn encode(&self) -> u64 {
        ((self.kind as u64) << (CONFIG_BITS + SEQ_BITS))
            | ((self.config as u64 & CONFIG_MASK) << SEQ_BITS)
            | (self.seq & SEQ_MASK)
    }

    /// A word as a message: `Ok(None)` for the zero word (nothing sent
    /// yet), an error for a word that is no message.
    pub fn decode(w: u64) -> Result<Option<Msg>, TxError> {
        if w == 0 {
            return Ok(None);
        }
        let kind = match w >> (CONFIG_BITS + SEQ_BITS) {
            1 => Kind::Request,
            2 => Kind::Grant,
            3 => Kind::Ack,
            4 => Kind::Leave,
            5 => Kind::NewConfig,
            6 => Kind::NewConfigAck,
            7 => Kind::NewConfigCommit,
            8 => Kind::Unreachable,
            k => return Err(TxError::Protocol(format!("lease word {w:#x}: kind {k}"))),
        };
        let seq = w & SEQ_MASK;
        if seq == 0 {
            return Err(TxError::Protocol(format!("lease word {w:#x}: seq 0")));
        }
        Ok(Some(Msg {
            kind,
            config: ((w >> SEQ_BITS) & CONFIG_MASK) as u32,
            seq,
        }))
    }
}

/// One machine's suspicion of another.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Suspicion {
    /// The suspecting machine.
    pub by: NodeId,
    pub machine: NodeId,
    /// The configuration it was raised in.
    pub config: u64,
    /// When it suspected (executor time).
    pub at_ns: u64,
    /// When its lease was last renewed (or the watch began).
    pub renewed_ns: u64,
}

/// What one machine knows of the configuration it is in, shared by its
/// lease tasks, its reconfiguration task and (later) its servers and
/// coordinators: the configuration with its store revision, the
/// suspicions raised, and whether it learnt it was removed.
pub struct Membership {
    pub me: NodeId,
    current: Mutex<Stored>,
    /// The leases that give this machine the right to serve, in the
    /// current configuration ([`Membership::serving`]).
    serving: Mutex<Serving>,
    /// A reconfiguration task runs here, so another machine may take
    /// over as CM ([`Membership::lost_lease`]); its lease, in ns (0
    /// before).
    replaceable: AtomicU64,
    /// The current configuration's number, for a cheap look.
    epoch: AtomicU64,
    /// The newest configuration whose NEW-CONFIG-COMMIT this machine saw
    /// (or sent, as its CM): every machine of it has applied it.
    committed: AtomicU64,
    removed: AtomicBool,
    suspicions: Mutex<Vec<Suspicion>>,
    /// Machines this one's coordinators could not reach, with the
    /// configuration they were raised in, for the reconfiguration task to
    /// tell the CM ([`Membership::report`]).
    reports: Mutex<Reports>,
}

/// [`Membership::report`]s: every one raised in the current
/// configuration (so none is raised twice), the first `taken` of them
/// told.
#[derive(Debug, Default)]
struct Reports {
    raised: Vec<(NodeId, u64)>,
    taken: usize,
}

/// A machine reads its own memory without asking anyone, so a machine
/// cut off from the others could go on answering read-only transactions
/// from a copy the others no longer use. Leases bound that (FaRM §5.1,
/// §5.2 step 7): a new configuration is committed only once every lease
/// granted in the previous one to a machine outside it ran out, and a
/// machine serves only while its leases hold.
#[derive(Debug, Default)]
struct Serving {
    epoch: u64,
    /// A machine's lease at its CM: until when the CM cannot have
    /// suspected it (the last REQUEST it granted was sent then, plus L).
    held_until: u64,
    /// At the CM, its lease at each machine: until when that machine
    /// cannot suspect it (the last GRANT it acknowledged was sent then,
    /// plus L).
    at: std::collections::BTreeMap<NodeId, u64>,
}

impl Membership {
    pub fn new(me: NodeId, current: Stored) -> Arc<Membership> {
        Arc::new(Membership {
            me,
            serving: Mutex::new(Serving {
                epoch: current.config.id,
                ..Default::default()
            }),
            replaceable: AtomicU64::new(0),
            epoch: AtomicU64::new(current.config.id),
            committed: AtomicU64::new(current.config.id),
            current: Mutex::new(current),
            removed: AtomicBool::new(false),
            suspicions: Mutex::new(Vec::new()),
            reports: Mutex::new(Reports::default()),
        })
    }

    pub fn current(&self) -> Stored {
        self.current.lock().expect("no panics hold it").clone()
    }

    /// The current configuration's number.
    pub fn epoch(&self) -> u64 {
        // Acquire: pairs with install's Release, so a task that sees the
        // new number and then reads `current` gets that configuration.
        self.epoch.load(Ordering::Acquire)
    }

    /// Moves to a newer configuration; false (nothing changes) for one
    /// that is not newer.
    pub fn install(&self, s: Stored) -> bool {
        let mut cur = self.current.lock().expect("no panics hold it");
        if s.config.id <= cur.config.id {
            return false;
        }
        let id = s.config.id;
        *cur = s;
        // Leases of the configuration before give no right in this one.
        *self.serving.lock().expect("no panics hold it") = Serving {
            epoch: id,
            ..Default::default()
        };
        // Release: see epoch().
        self.epoch.store(id, Ordering::Release);
        true
    }

    /// NEW-CONFIG-COMMIT of configuration `id` (installed here): every
    /// machine of it applied it, so coordinators may use it.
    pub fn commit(&self, id: u64) {
        // Release: pairs with committed()'s Acquire, so a coordinator that
        // sees the number also sees what came before it on this task: the
        // install and the machine's apply, which swapped the region map in
        // (reconfig.rs installs, applies to the machine, then commits).
        self.committed
            .fetch_max(id.min(self.epoch()), Ordering::Release);
    }

    /// The newest configuration committed (see [`Membership::commit`]).
    pub fn committed(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }

    /// This machine learnt it is not in the stored configuration: it
    /// holds and grants no more leases.
    pub fn remove(&self) {
        // Release/Acquire: a plain flag; what it guards is re-read under
        // the lock.
        self.removed.store(true, Ordering::Release);
    }

    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }

    /// A GRANT of this machine's lease in configuration `epoch`: it holds
    /// until `until` (its REQUEST's sending time plus L).
    pub fn held(&self, epoch: u64, until: u64) {
        let mut s = self.serving.lock().expect("no panics hold it");
        if s.epoch == epoch {
            s.held_until = s.held_until.max(until);
        }
    }

    /// At the CM, machine `peer` acknowledged a GRANT in `epoch`: the
    /// CM's lease there holds until `until` (the GRANT's sending time
    /// plus L).
    pub fn lease_at(&self, epoch: u64, peer: NodeId, until: u64) {
        let mut s = self.serving.lock().expect("no panics hold it");
        if s.epoch == epoch {
            let e = s.at.entry(peer).or_insert(0);
            *e = (*e).max(until);
        }
    }

    /// The configuration this machine may serve in, and until when: a
    /// machine while it holds its lease at the CM; the CM while it holds
    /// its lease at every machine of the configuration (any of them may
    /// become the next CM once it suspects this one). Nothing once
    /// removed.
    pub fn serving(&self) -> (u64, u64) {
        // Read in place, not cloned: every read-only commit asks. Locked
        // in install's order (the configuration, then the leases).
        let cur = self.current.lock().expect("no panics hold it");
        let s = self.serving.lock().expect("no panics hold it");
        if self.is_removed() || s.epoch != cur.config.id {
            return (s.epoch, 0);
        }
        let until = if cur.config.cm == self.me {
            cur.config
                .machines
                .iter()
                .filter(|m| m.0 != self.me)
                .map(|m| s.at.get(&m.0).copied().unwrap_or(0))
                .min()
                .unwrap_or(u64::MAX)
        } else {
            s.held_until
        };
        (s.epoch, until)
    }

    /// Whether this machine, as CM in `epoch`, lost a lease it held at a
    /// machine (held one, and it ran out by `now_ns`): then it grants no
    /// more in `epoch`, so that no lease it grants outlasts its own right
    /// to be CM — a machine that took over once this one's lease ran out
    /// there waits out only the leases granted until then.
    /// Without reconfiguration no machine takes over, and a CM that lost
    /// a lease grants on.
    pub fn lost_lease(&self, epoch: u64, now_ns: u64) -> bool {
        if self.lease_ns() == 0 {
            return false;
        }
        let s = self.serving.lock().expect("no panics hold it");
        s.epoch == epoch && s.at.values().any(|&u| u < now_ns)
    }

    /// This machine runs a reconfiguration task, with leases of
    /// `lease_ns`: a CM that loses a lease may be replaced
    /// ([`Membership::lost_lease`]).
    pub fn may_be_replaced(&self, lease_ns: u64) {
        // Relaxed: set once, before any lease could run out.
        self.replaceable.store(lease_ns.max(1), Ordering::Relaxed);
    }

    /// The lease of the reconfiguration that runs here (0 without one):
    /// what a configuration change takes is counted in leases.
    pub fn lease_ns(&self) -> u64 {
        self.replaceable.load(Ordering::Relaxed)
    }

    pub fn suspect(&self, s: Suspicion) {
        self.suspicions.lock().expect("no panics hold it").push(s);
    }

    /// Every suspicion raised, oldest first.
    pub fn suspicions(&self) -> Vec<Suspicion> {
        self.suspicions.lock().expect("no panics hold it").clone()
    }

    /// This machine cannot reach `machine` of its configuration though
    /// both hold their leases (records to it could not land however often
    /// they went again, or it never answered): nothing else would ever
    /// suspect it, and the commits cut off by the link would hold their
    /// locks for good. The reconfiguration task tells the CM, which
    /// removes one end of the link ([`crate::reconfig`]). Whether the
    /// report is new (one per machine and configuration); never for a
    /// machine outside the configuration, for this machine, once it was
    /// removed, or without a reconfiguration task to tell the CM.
    pub fn report(&self, machine: NodeId) -> bool {
        let cur = self.current();
        let config = cur.config.id;
        let outside = machine == self.me || !cur.config.contains(machine);
        if outside || self.is_removed() || self.lease_ns() == 0 {
            return false;
        }
        let mut r = self.reports.lock().expect("no panics hold it");
        if r.raised.contains(&(machine, config)) {
            return false;
        }
        r.raised.push((machine, config));
        true
    }

    /// The reports not yet taken, oldest first ([`Membership::report`]).
    pub fn take_reports(&self) -> Vec<(NodeId, u64)> {
        let mut r = self.reports.lock().expect("no panics hold it");
        let new = r.raised[r.taken..].to_vec();
        // Those of configurations before the current one are moot.
        let config = self.epoch();
        r.raised.retain(|&(_, c)| c >= config);
        r.taken = r.raised.len();
        new
    }
}

/// What a lease task did.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseStats {
    pub requests: u64,
    pub grants: u64,
    pub acks: u64,
    /// Messages refused: malformed, of another configuration, from a
    /// machine outside the configuration, or out of turn.
    pub refused: u64,
    /// At the CM: the longest time between two renewals of one machine's
    /// lease (the margin a lease of L leaves is L minus this).
    pub max_renew_gap_ns: u64,
    /// Suspicions this task raised.
    pub suspicions: u64,
    /// WRITEs that failed (the peer unreachable).
    pub failed_writes: u64,
    /// At the CM: requests heard but not granted, once it lost a lease of
    /// its own ([`Membership::lost_lease`]).
    pub withheld: u64,
    /// Configurations it moved through after the first.
    pub switches: u64,
}

impl std::ops::AddAssign for LeaseStats {
    fn add_assign(&mut self, o: Self) {
        self.requests += o.requests;
        self.grants += o.grants;
        self.acks += o.acks;
        self.refused += o.refused;
        self.max_renew_gap_ns = self.max_renew_gap_ns.max(o.max_renew_gap_ns);
        self.suspicions += o.suspicions;
        self.failed_writes += o.failed_writes;
        self.withheld += o.withheld;
        self.switches += o.switches;
    }
}

/// How one role of a lease task ended.
enum End {
    Stopped,
    /// The configuration changed: take the new one's role.
    NewConfig,
    /// The peer left (its run is over).
    Left,
}

/// The lease between machine `me` and `peer`, whatever the configuration
/// makes of it: at the CM the grant of the peer's lease, at a machine
/// whose CM is the peer the hold of its own, otherwise nothing (and any
/// word from the peer refused: precise membership).
pub struct Lease {
    pub geo: Geometry,
    pub me: NodeId,
    pub peer: NodeId,
    pub timing: LeaseConfig,
    pub membership: Arc<Membership>,
}

impl Lease {
    /// Sends `kind(seq)` of configuration `epoch` to the peer; false if
    /// the WRITE failed (the peer is unreachable; its lease will expire)
    /// or is not done within a renewal period. A WRITE to a dead peer
    /// takes the transport's retry timeout to fail — on an RC NIC far
    /// longer than a lease — so the task does not wait for it: the WRITE
    /// goes on in the background (the task's next one waits behind it,
    /// bounded the same way) while the task keeps its leases' time.
    async fn send<N: Nic>(&self, ctx: &Ctx<N>, epoch: u64, kind: Kind, seq: u64) -> bool {
        let off = self.geo.lease_word(self.me);
        let write = std::pin::pin!(send_word(ctx, off, self.peer, epoch, kind, seq));
        let Ok(timer) = ctx.sleep(self.timing.renew_ns) else {
            return write.await;
        };
        let mut write = write;
        let mut timer = std::pin::pin!(timer);
        std::future::poll_fn(|cx| {
            if let std::task::Poll::Ready(ok) = write.as_mut().poll(cx) {
                return std::task::Poll::Ready(ok);
            }
            timer.as_mut().poll(cx).map(|()| false)
        })
        .await
    }

    /// The peer's newest lease word here, if it changed since `last` and
    /// is a message of configuration `epoch`; anything else changed is
    /// refused and counted.
    fn incoming<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        epoch: u64,
        last: &mut u64,
        st: &mut LeaseStats,
    ) -> Result<Option<Msg>, TxError> {
        let w = ctx.local().load(self.geo.lease_word(self.peer))?;
        if w == *last {
            return Ok(None);
        }
        *last = w;
        match Msg::decode(w) {
            Ok(Some(m)) if m.config == config_tag(epoch) => Ok(Some(m)),
            Ok(_) | Err(_) => {
                st.refused += 1;
                log::warn!(
                    "machine {}: refused lease word {w:#x} from machine {} (configuration {epoch})",
                    self.me,
                    self.peer,
                );
                Ok(None)
            }
        }
    }

    fn suspect(&self, epoch: u64, at_ns: u64, renewed_ns: u64, st: &mut LeaseStats) {
        st.suspicions += 1;
        log::warn!(
            "machine {} suspects machine {} in configuration {epoch}: its lease ran out at {} ns (renewed at {renewed_ns} ns)",
            self.me,
            self.peer,
            renewed_ns + self.timing.lease_ns
        );
        self.membership.suspect(Suspicion {
            by: self.me,
            machine: self.peer,
            config: epoch,
            at_ns,
            renewed_ns,
        });
    }

    /// Waits for the peer's next word or `until`, whichever is first.
    /// A word that landed since `last` was read (while the task was busy
    /// sending, say) ends the wait at once: a watch set after a write
    /// does not see it, and the peer's next word would overwrite it.
    async fn wait<N: Nic>(&self, ctx: &Ctx<N>, until: u64, last: u64) -> Result<(), TxError> {
        if ctx.local().load(self.geo.lease_word(self.peer))? != last {
            return Ok(());
        }
        let until = until.max(ctx.now_ns() + 1);
        ctx.wait_for_write(self.geo.lease_word(self.peer), 8, Some(until))?
            .await;
        Ok(())
    }

    /// Runs the lease through every configuration until `stop()` says so.
    pub async fn run<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        stop: &dyn Fn() -> bool,
    ) -> Result<LeaseStats, TxError> {
        let mut st = LeaseStats::default();
        let mut seq = 0u64;
        let mut first = true;
        loop {
            let cur = self.membership.current();
            let c = &cur.config;
            // The first lease of a run is set up at the start, when the
            // machines' processes start their lease cores at slightly
            // different times: it may take JOIN_NS to be granted. Later
            // ones follow an installed configuration, every machine
            // already running.
            let grace = if std::mem::take(&mut first) {
                self.timing.lease_ns.max(JOIN_NS)
            } else {
                // The new CM's grants start when it installs, before its
                // NEW-CONFIG reaches the machines and they read the store:
                // a lease more for that.
                st.switches += 1;
                2 * self.timing.lease_ns
            };
            let removed = self.membership.is_removed();
            let both = c.contains(self.me) && c.contains(self.peer) && !removed;
            let end = if both && c.cm == self.me {
                self.grant(ctx, stop, c.id, grace, &mut st).await?
            } else if both && c.cm == self.peer {
                self.hold(ctx, stop, c.id, grace, &mut seq, &mut st).await?
            } else {
                self.idle(ctx, stop, c.id, &mut st).await?
            };
            match end {
                End::Stopped => return Ok(st),
                End::NewConfig => {}
                // Nothing more to do with this peer until the
                // configuration changes.
                End::Left => {
                    if let End::Stopped = self.idle(ctx, stop, c.id, &mut st).await? {
                        return Ok(st);
                    }
                }
            }
        }
    }

    /// The role of a lease held or granted in `epoch` is over: a new
    /// configuration, or this machine was removed (it holds and grants no
    /// more leases).
    fn over(&self, epoch: u64) -> bool {
        self.membership.epoch() != epoch || self.membership.is_removed()
    }

    /// Neither side is the other's CM (or one is outside the
    /// configuration): words from the peer are refused.
    async fn idle<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        stop: &dyn Fn() -> bool,
        epoch: u64,
        st: &mut LeaseStats,
    ) -> Result<End, TxError> {
        let mut last = ctx.local().load(self.geo.lease_word(self.peer))?;
        loop {
            if stop() {
                return Ok(End::Stopped);
            }
            if self.membership.epoch() != epoch {
                return Ok(End::NewConfig);
            }
            let w = ctx.local().load(self.geo.lease_word(self.peer))?;
            if w != last {
                last = w;
                // A machine outside the configuration, or one that is
                // nobody's CM here, has nothing to say to this machine.
                if !matches!(
                    Msg::decode(w),
                    Ok(Some(Msg {
                        kind: Kind::Leave,
                        ..
                    }))
                ) {
                    st.refused += 1;
                }
            }
            self.wait(ctx, ctx.now_ns() + self.timing.renew_ns, last)
                .await?;
        }
    }

    /// A machine's side of its lease at the CM (`peer` is the CM): renews
    /// every `renew_ns`, answers grants, suspects the CM when it stops
    /// granting.
    async fn hold<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        stop: &dyn Fn() -> bool,
        epoch: u64,
        grace: u64,
        seq: &mut u64,
        st: &mut LeaseStats,
    ) -> Result<End, TxError> {
        let l = self.timing.lease_ns;
        let mut next_renew = ctx.now_ns();
        // Until the first grant, the CM has `grace` to answer.
        let mut cm_until = ctx.now_ns() + grace;
        let mut granted_at = ctx.now_ns();
        let mut suspected = false;
        // The last request granted (grants of older ones are late).
        let mut acked = *seq;
        // When the latest requests were sent, by sequence number: a grant
        // makes this machine's lease hold L from its request's sending.
        let mut sent = [(0u64, 0u64); 8];
        let mut last = ctx.local().load(self.geo.lease_word(self.peer))?;
        loop {
            if stop() {
                self.send(ctx, epoch, Kind::Leave, *seq + 1).await;
                return Ok(End::Stopped);
            }
            if self.over(epoch) {
                return Ok(End::NewConfig);
            }
            // Renewals go on after a suspicion: reconfiguration decides
            // what becomes of this machine, and a CM that suspected it
            // refuses them.
            if ctx.now_ns() >= next_renew {
                *seq += 1;
                next_renew = ctx.now_ns() + self.timing.renew_ns;
                sent[(*seq % 8) as usize] = (*seq, ctx.now_ns());
                st.requests += 1;
                if !self.send(ctx, epoch, Kind::Request, *seq).await {
                    st.failed_writes += 1;
                }
            }
            if let Some(m) = self.incoming(ctx, epoch, &mut last, st)? {
                match m.kind {
                    // A grant of a request sent since the last one granted
                    // (it may land after the next renewal went out): the
                    // CM's lease here runs from now.
                    Kind::Grant if acked < m.seq && m.seq <= *seq => {
                        acked = m.seq;
                        granted_at = ctx.now_ns();
                        let (s, at) = sent[(m.seq % 8) as usize];
                        if s == m.seq {
                            self.membership.held(epoch, at + l);
                        }
                        cm_until = granted_at + l;
                        st.acks += 1;
                        if !self.send(ctx, epoch, Kind::Ack, m.seq).await {
                            st.failed_writes += 1;
                        }
                    }
                    // The CM's LEAVE follows the last request it granted.
                    Kind::Leave if acked < m.seq && m.seq <= *seq + 1 => return Ok(End::Left),
                    _ => st.refused += 1,
                }
            }
            let now = ctx.now_ns();
            if !suspected && now > cm_until {
                suspected = true;
                self.suspect(epoch, now, granted_at, st);
            }
            let until = if suspected {
                next_renew
            } else {
                next_renew.min(cm_until + 1)
            };
            self.wait(ctx, until, last).await?;
        }
    }

    /// The CM's side of one machine's lease (`peer` is the machine):
    /// grants each request, suspects the machine when its lease runs out.
    async fn grant<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        stop: &dyn Fn() -> bool,
        epoch: u64,
        grace: u64,
        st: &mut LeaseStats,
    ) -> Result<End, TxError> {
        let l = self.timing.lease_ns;
        let mut renewed = ctx.now_ns();
        let mut first = true;
        // Until the first request, the machine has `grace` to send it.
        let start_grace = grace.saturating_sub(l);
        let mut suspected = false;
        let mut granted = 0u64;
        // When the last grant was sent: once acknowledged, the CM's lease
        // at the machine holds L from then.
        let mut granted_ns = 0u64;
        // A request of this configuration already here (the machine
        // installed it first) is the first one to grant.
        let w0 = ctx.local().load(self.geo.lease_word(self.peer))?;
        let mut last = match Msg::decode(w0) {
            Ok(Some(m)) if m.kind == Kind::Request && m.config == config_tag(epoch) => 0,
            _ => w0,
        };
        loop {
            if stop() {
                self.send(ctx, epoch, Kind::Leave, granted + 1).await;
                return Ok(End::Stopped);
            }
            if self.over(epoch) {
                return Ok(End::NewConfig);
            }
            if let Some(m) = self.incoming(ctx, epoch, &mut last, st)? {
                match m.kind {
                    // A machine suspected is out until reconfiguration says
                    // otherwise: its requests are not granted; nor is any,
                    // once this CM lost a lease of its own (it may have
                    // been replaced). After the first, requests come in
                    // sequence (the machine sends the next only once this
                    // one is granted), so a word out of sequence is not
                    // the machine's.
                    Kind::Request
                        if !suspected
                            && (if first {
                                m.seq > granted
                            } else {
                                m.seq == granted + 1
                            }) =>
                    {
                        let now = ctx.now_ns();
                        if !first {
                            st.max_renew_gap_ns = st.max_renew_gap_ns.max(now - renewed);
                        }
                        first = false;
                        renewed = now;
                        granted = m.seq;
                        // Heard, but not granted once this CM lost a
                        // lease of its own (the machine does not lose its
                        // place in the sequence).
                        if self.membership.lost_lease(epoch, now) {
                            st.withheld += 1;
                        } else {
                            granted_ns = now;
                            st.grants += 1;
                            if !self.send(ctx, epoch, Kind::Grant, m.seq).await {
                                st.failed_writes += 1;
                            }
                        }
                    }
                    Kind::Ack if m.seq == granted => {
                        self.membership.lease_at(epoch, self.peer, granted_ns + l)
                    }
                    // The machine's LEAVE follows its last request, granted
                    // or not yet.
                    Kind::Leave if first || (granted + 1..=granted + 2).contains(&m.seq) => {
                        return Ok(End::Left)
                    }
                    _ => st.refused += 1,
                }
            }
            let now = ctx.now_ns();
            let expiry = renewed + l + if first { start_grace } else { 0 };
            if !suspected && now > expiry {
                suspected = true;
                self.suspect(epoch, now, renewed, st);
            }
            let until = if suspected {
                now + self.timing.renew_ns
            } else {
                (expiry + 1).min(now + self.timing.renew_ns)
            };
            self.wait(ctx, until, last).await?;
        }
    }
}

/// Writes `kind(seq)` of configuration `epoch` at offset `off` of machine
/// `to` (a sender's [`Geometry::lease_word`] or
/// [`Geometry::config_word`]); false if the WRITE failed.
pub(crate) async fn send_word<N: Nic>(
    ctx: &Ctx<N>,
    off: u64,
    to: NodeId,
    epoch: u64,
    kind: Kind,
    seq: u64,
) -> bool {
    let w = Msg {
        kind,
        config: config_tag(epoch),
        seq,
    }
    .encode();
    let at = GlobalAddr::new(to, Space::Host, off);
    let mut b = ctx.batch();
    b.write_u64(at, w);
    b.submit().await.is_ok()
}

/// Machine `me`'s lease tasks: one for every other machine.
pub fn leases_of(
    geo: Geometry,
    me: NodeId,
    timing: LeaseConfig,
    membership: &Arc<Membership>,
) -> Vec<Lease> {
    (0..geo.machines)
        .filter(|&p| p != me)
        .map(|peer| Lease {
            geo,
            me,
            peer,
            timing,
            membership: membership.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_junk_is_refused() {
        for kind in [
            Kind::Request,
            Kind::Grant,
            Kind::Ack,
            Kind::Leave,
            Kind::NewConfig,
            Kind::NewConfigAck,
            Kind::NewConfigCommit,
            Kind::Unreachable,
        ] {
            for (config, seq) in [(0, 1), (CONFIG_MASK as u32, SEQ_MASK), (7, 12345)] {
                let m = Msg { kind, config, seq };
                assert_eq!(Msg::decode(m.encode()).unwrap(), Some(m));
            }
        }
        assert_eq!(Msg::decode(0).unwrap(), None);
        assert!(Msg::decode(9 << 60 | 1).is_err(), "unknown kind");
        assert!(Msg::decode(1 << 60).is_err(), "seq 0");
        assert!(Msg::decode(u64::MAX).is_err());
        assert_eq!(config_tag(1 << 20 | 3), 3);
    }

    #[test]
    fn timings_are_checked() {
        LeaseConfig::default().check().unwrap();
        assert_eq!(LeaseConfig::default().renew_ns, 2_000_000);
        for bad in [
            LeaseConfig {
                lease_ns: 10,
                renew_ns: 10,
            },
            LeaseConfig {
                lease_ns: 10,
                renew_ns: 0,
            },
            LeaseConfig::of(u64::MAX),
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }
}
