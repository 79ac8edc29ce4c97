//! Reconfiguration (FaRM §5.2): a machine's reconfiguration task, on a
//! core of its own, watches its [`Membership`]'s suspicions and the
//! configuration messages other machines write into its lease lines.
//!
//! 1. **Suspect.** At the CM a suspicion of a machine, elsewhere one of
//!    the CM, starts a reconfiguration. A machine other than the CM waits
//!    its turn first: the machines after the CM, in order, are its
//!    backups, and the k-th waits k − 1 renewal periods after its
//!    suspicion. Every machine's suspicion of a dead CM falls within one
//!    renewal period (a lease after its last grant), so the first live
//!    backup usually goes alone; a later one gives up if the store moved
//!    meanwhile.
//!    Leases cannot see a link that failed between two machines that
//!    both still reach the CM: a machine whose records to another could
//!    not land for two leases, however often they went again, or that
//!    another never answered, reports it (word 3 of its lease line at
//!    the CM, [`Kind::Unreachable`]), and the CM suspects one end of the
//!    link (`Reconfig::take_report`).
//! 2. **Probe.** One-sided READs of every other machine of the
//!    configuration; a machine whose READ fails, or that is suspected, is
//!    out. The candidate goes on only if a majority of the configuration
//!    (itself included) answered, so the minority side of a partition
//!    never makes a configuration (no split brain). A CM without a
//!    majority steps down (it grants no more leases, so its side learns
//!    within a lease); another machine tries again a lease later, and
//!    learns from the store if it was removed.
//! 3. **Update.** ⟨i + 1, S without the failed, their domains, CM = the
//!    candidate⟩ is compare-and-swapped against the revision of
//!    configuration i in the store. Of concurrent candidates exactly one
//!    wins; the others learn its configuration from the store and install
//!    it (it is the store's, so that is safe, and it does not wait on a
//!    NEW-CONFIG its CM may not live to send). A swap whose answer was
//!    lost is read back.
//! 4. **Remap.** [`remap`] computes the new region map from the old one
//!    and the new configuration alike on every machine (the map is not
//!    applied to servers yet: that is transaction-state recovery's).
//! 5. **NEW-CONFIG.** The new CM installs the configuration and writes
//!    NEW-CONFIG(i + 1) to every machine of it. A machine takes the
//!    configuration from the store, not from the message: it installs it
//!    only if the store holds exactly configuration i + 1 with the sender
//!    as its CM, so a forged, stale or replayed message changes nothing.
//! 6. **Apply.** Installing the configuration moves the machine's lease
//!    tasks to it: they take leases from the new CM only, and refuse
//!    every word from machines outside it (precise membership). A machine
//!    that finds itself outside the stored configuration is removed: it
//!    holds and grants no more leases. It answers NEW-CONFIG-ACK.
//! 7. **NEW-CONFIG-COMMIT.** Once every machine acknowledged (one that
//!    does not within a lease is suspected in the new configuration,
//!    which starts the next one), and once the leases granted in the old
//!    configuration to removed machines have run out (a lease after the
//!    new CM installed it: its own grant tasks stopped then, and an old
//!    CM elsewhere is dead or stepped down), the CM sends
//!    NEW-CONFIG-COMMIT.
//!
//! What a machine does with the configuration it applies — the remap
//! below, then transaction-state recovery (§5.3) between steps 6 and 7,
//! and the background work after — is [`crate::recovery`]'s.

use crate::config::{ConfigError, ConfigStore, Configuration, Stored, Swap};
use crate::error::TxError;
use crate::layout::Geometry;
use crate::lease::{config_tag, send_word, Kind, LeaseConfig, Membership, Msg, Suspicion};
use crate::regions::{Region, RegionMap, Replica};
use nicdrv::exec::MAX_BATCH;
use nicdrv::{Ctx, GlobalAddr, Nic, NodeId, Space};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// How often the task looks at the suspicions without being woken.
pub const WATCH_NS: u64 = 50_000;

/// A machine whose report the CM took reports another within this many
/// leases: the reporter is suspected, not the machine it names.
pub const REPORT_MEMORY_LEASES: u64 = 10;

/// What a reconfiguration task did, with the times (executor clock).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// It started on a suspicion of `machine` in configuration `config`.
    Suspected {
        at_ns: u64,
        machine: NodeId,
        config: u64,
    },
    /// Its probe found `failed` out of the configuration, `answered` of
    /// its machines (itself included) answering.
    Probed {
        at_ns: u64,
        answered: usize,
        failed: Vec<NodeId>,
    },
    /// Too few machines answered: it made no configuration.
    NoMajority { at_ns: u64, answered: usize },
    /// Its configuration is the store's, at this revision (step 3).
    Stored {
        at_ns: u64,
        config: Configuration,
        revision: u64,
    },
    /// Another configuration was stored first (or meanwhile): this one.
    Superseded { at_ns: u64, config: Configuration },
    /// As the new CM it sent NEW-CONFIG of configuration `id`.
    NewConfigSent { at_ns: u64, id: u64 },
    /// Every machine acknowledged configuration `id`.
    Acked { at_ns: u64, id: u64 },
    /// These machines did not acknowledge within a lease: suspected.
    AckMissing {
        at_ns: u64,
        id: u64,
        machines: Vec<NodeId>,
    },
    /// As the CM it sent NEW-CONFIG-COMMIT of configuration `id`.
    Committed { at_ns: u64, id: u64 },
    /// It installed configuration `id` on NEW-CONFIG from `from`.
    Applied { at_ns: u64, id: u64, from: NodeId },
    /// It saw NEW-CONFIG-COMMIT of its configuration.
    CommitSeen { at_ns: u64, id: u64 },
    /// It applied configuration `id` to its region map: the regions it
    /// became primary of, those it became a new backup of, and those
    /// left with fewer than f backups (no machine could take one).
    Remapped {
        at_ns: u64,
        id: u64,
        promoted: Vec<u32>,
        new_backups: Vec<u32>,
        short_of_backups: Vec<u32>,
    },
    /// Configuration `id` could not be applied to its region map (a
    /// region lost every replica, or would be led from a copy here that
    /// never ended): the machine stopped.
    RemapFailed { at_ns: u64, id: u64, error: String },
    /// A configuration message it refused (malformed, stale, replayed, or
    /// one the store does not back).
    Refused { at_ns: u64, from: NodeId, word: u64 },
    /// It is not in the stored configuration `config`: it stopped.
    Removed { at_ns: u64, config: u64 },
    /// As the CM of `config` it could not reach a majority: it stopped
    /// granting leases and stopped.
    SteppedDown { at_ns: u64, config: u64 },
    /// The store refused or could not be reached.
    StoreError { at_ns: u64, error: ConfigError },
    /// It told the CM that it cannot reach `machine`
    /// ([`Membership::report`]).
    ReportSent { at_ns: u64, machine: NodeId },
    /// As the CM, it took `by`'s report that `by` cannot reach `machine`:
    /// it suspects `suspected`, one end of the link (none when one end is
    /// suspected already).
    Reported {
        at_ns: u64,
        by: NodeId,
        machine: NodeId,
        suspected: Option<NodeId>,
    },
}

impl Event {
    /// When it happened (executor clock).
    pub fn at_ns(&self) -> u64 {
        match self {
            Event::Suspected { at_ns, .. }
            | Event::Probed { at_ns, .. }
            | Event::NoMajority { at_ns, .. }
            | Event::Stored { at_ns, .. }
            | Event::Superseded { at_ns, .. }
            | Event::NewConfigSent { at_ns, .. }
            | Event::Acked { at_ns, .. }
            | Event::AckMissing { at_ns, .. }
            | Event::Committed { at_ns, .. }
            | Event::Applied { at_ns, .. }
            | Event::CommitSeen { at_ns, .. }
            | Event::Remapped { at_ns, .. }
            | Event::RemapFailed { at_ns, .. }
            | Event::Refused { at_ns, .. }
            | Event::Removed { at_ns, .. }
            | Event::SteppedDown { at_ns, .. }
            | Event::StoreError { at_ns, .. }
            | Event::ReportSent { at_ns, .. }
            | Event::Reported { at_ns, .. } => *at_ns,
        }
    }

    /// Its name, as reports print it.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Suspected { .. } => "suspected",
            Event::Probed { .. } => "probed",
            Event::NoMajority { .. } => "no-majority",
            Event::Stored { .. } => "stored",
            Event::Superseded { .. } => "superseded",
            Event::NewConfigSent { .. } => "new-config-sent",
            Event::Acked { .. } => "acked",
            Event::AckMissing { .. } => "ack-missing",
            Event::Committed { .. } => "committed",
            Event::Applied { .. } => "applied",
            Event::CommitSeen { .. } => "commit-seen",
            Event::Remapped { .. } => "remapped",
            Event::RemapFailed { .. } => "remap-failed",
            Event::Refused { .. } => "refused",
            Event::Removed { .. } => "removed",
            Event::SteppedDown { .. } => "stepped-down",
            Event::StoreError { .. } => "store-error",
            Event::ReportSent { .. } => "report-sent",
            Event::Reported { .. } => "reported",
        }
    }
}

/// One machine's reconfiguration task.
pub struct Reconfig {
    pub geo: Geometry,
    pub timing: LeaseConfig,
    pub store: Arc<dyn ConfigStore>,
    pub membership: Arc<Membership>,
    /// The machine's servers and coordinators, when it runs them: each
    /// configuration installed is applied to them
    /// ([`crate::recovery::Machine::apply`]) before it is acknowledged.
    pub machine: Option<Arc<crate::recovery::Machine>>,
}

/// Where configuration messages from `from` land in a machine's memory.
fn config_word(geo: Geometry, from: NodeId) -> u64 {
    geo.lease_word(from) + 8
}

impl Reconfig {
    fn me(&self) -> NodeId {
        self.membership.me
    }

    /// Runs until `stop()` says so or the machine is removed.
    pub async fn run<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        stop: &dyn Fn() -> bool,
    ) -> Result<Vec<Event>, TxError> {
        self.membership.may_be_replaced(self.timing.lease_ns);
        let mut ev = Vec::new();
        let me = self.me();
        let mut last: Vec<u64> = Vec::with_capacity(self.geo.machines as usize);
        let mut last_report: Vec<u64> = Vec::with_capacity(self.geo.machines as usize);
        for k in 0..self.geo.machines {
            last.push(ctx.local().load(config_word(self.geo, k))?);
            last_report.push(ctx.local().load(self.geo.report_word(k))?);
        }
        // As the CM: when each reporter's last report was taken.
        let mut heard: BTreeMap<NodeId, u64> = BTreeMap::new();
        // No attempt in a configuration before this time: a backup CM's
        // turn, or a lease after a failed attempt. Messages are handled
        // meanwhile, so a NEW-CONFIG ends the wait.
        let mut not_before: Option<(u64, u64)> = None;
        let area = (self.geo.lease_word(0), self.geo.machines as u64 * 64);
        loop {
            if stop() || self.membership.is_removed() {
                return Ok(ev);
            }
            for k in (0..self.geo.machines).filter(|&k| k != me) {
                let w = ctx.local().load(config_word(self.geo, k))?;
                if w != last[k as usize] {
                    last[k as usize] = w;
                    self.on_message(ctx, k, w, &mut ev).await;
                }
                let w = ctx.local().load(self.geo.report_word(k))?;
                if w != last_report[k as usize] {
                    last_report[k as usize] = w;
                    self.on_report(ctx, k, w, &mut heard, &mut ev);
                }
            }
            self.tell_reports(ctx, &mut heard, &mut ev).await;
            let cur = self.membership.current();
            let waiting = not_before.filter(|&(epoch, _)| epoch == cur.config.id);
            if let Some(sus) = self.trigger(&cur) {
                let now = ctx.now_ns();
                match waiting {
                    None => {
                        ev.push(Event::Suspected {
                            at_ns: now,
                            machine: sus.machine,
                            config: cur.config.id,
                        });
                        // The CM goes at once; a backup CM after the
                        // backups before it.
                        let turn = if me == cur.config.cm {
                            0
                        } else {
                            (self.rank(&cur) - 1) * self.timing.renew_ns
                        };
                        not_before = Some((cur.config.id, now + turn));
                        continue;
                    }
                    Some((_, at)) if now >= at => {
                        not_before = Some((cur.config.id, now + self.timing.lease_ns));
                        self.reconfigure(ctx, &cur, &mut ev).await?;
                        continue;
                    }
                    Some(_) => {}
                }
            }
            ctx.wait_for_write(area.0, area.1, Some(ctx.now_ns() + WATCH_NS))?
                .await;
        }
    }

    /// The suspicion, raised in configuration `cur`, that asks this
    /// machine to reconfigure, if any.
    fn trigger(&self, cur: &Stored) -> Option<Suspicion> {
        let c = &cur.config;
        self.membership.suspicions().into_iter().find(|s| {
            s.config == c.id && c.contains(s.machine) && (self.me() == c.cm || s.machine == c.cm)
        })
    }

    /// A configuration message from `from`.
    async fn on_message<N: Nic>(&self, ctx: &Ctx<N>, from: NodeId, w: u64, ev: &mut Vec<Event>) {
        let cur = self.membership.current();
        let refuse = |ev: &mut Vec<Event>| {
            log::warn!(
                "machine {}: refused configuration word {w:#x} from machine {from}",
                self.me()
            );
            ev.push(Event::Refused {
                at_ns: ctx.now_ns(),
                from,
                word: w,
            })
        };
        let m = match Msg::decode(w) {
            Ok(Some(m)) if m.config == config_tag(m.seq) => m,
            _ => return refuse(ev),
        };
        match m.kind {
            Kind::NewConfig if m.seq > cur.config.id => match self.store.read() {
                Ok(Some(s))
                    if s.config.id == m.seq && s.config.cm == from && self.fits(&s.config) =>
                {
                    let id = s.config.id;
                    if !s.config.contains(self.me()) {
                        self.membership.remove();
                        ev.push(Event::Removed {
                            at_ns: ctx.now_ns(),
                            config: id,
                        });
                        return;
                    }
                    self.membership.install(s.clone());
                    if !self.apply(ctx, &s, ev) {
                        return;
                    }
                    self.quiesce(ctx).await;
                    ev.push(Event::Applied {
                        at_ns: ctx.now_ns(),
                        id,
                        from,
                    });
                    self.ack(ctx, from, id).await;
                }
                Ok(_) => refuse(ev),
                Err(error) => ev.push(Event::StoreError {
                    at_ns: ctx.now_ns(),
                    error,
                }),
            },
            // The CM may have missed the acknowledgement: say it again.
            Kind::NewConfig if m.seq == cur.config.id && cur.config.cm == from => {
                self.ack(ctx, from, m.seq).await;
            }
            Kind::NewConfigCommit if m.seq == cur.config.id && cur.config.cm == from => {
                self.membership.commit(m.seq);
                ev.push(Event::CommitSeen {
                    at_ns: ctx.now_ns(),
                    id: m.seq,
                });
            }
            // Acknowledgements are the leading CM's to read.
            Kind::NewConfigAck if m.seq <= cur.config.id => {}
            _ => refuse(ev),
        }
    }

    /// Reports of machines this one cannot reach, raised by its
    /// coordinators since the last look: to the CM, or, at the CM, taken.
    async fn tell_reports<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        heard: &mut BTreeMap<NodeId, u64>,
        ev: &mut Vec<Event>,
    ) {
        let cur = self.membership.current();
        let me = self.me();
        for (machine, config) in self.membership.take_reports() {
            if config != cur.config.id {
                continue;
            }
            if cur.config.cm == me {
                self.take_report(ctx, &cur, me, machine, heard, ev);
                continue;
            }
            // A CM this machine cannot reach either: its lease tells.
            let (off, cm) = (self.geo.report_word(me), cur.config.cm);
            let seq = machine as u64 + 1;
            if send_word(ctx, off, cm, config, Kind::Unreachable, seq).await {
                ev.push(Event::ReportSent {
                    at_ns: ctx.now_ns(),
                    machine,
                });
            }
        }
    }

    /// A report word from `from`: taken if it is a well-formed report of
    /// this configuration and this machine is its CM; refused otherwise.
    fn on_report<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        from: NodeId,
        w: u64,
        heard: &mut BTreeMap<NodeId, u64>,
        ev: &mut Vec<Event>,
    ) {
        let cur = self.membership.current();
        match Msg::decode(w) {
            Ok(Some(m))
                if m.kind == Kind::Unreachable
                    && m.config == config_tag(cur.config.id)
                    && cur.config.cm == self.me()
                    && m.seq <= self.geo.machines as u64 =>
            {
                let machine = (m.seq - 1) as NodeId;
                if self.take_report(ctx, &cur, from, machine, heard, ev) {
                    return;
                }
            }
            _ => {}
        }
        log::warn!(
            "machine {}: refused report word {w:#x} from machine {from}",
            self.me()
        );
        ev.push(Event::Refused {
            at_ns: ctx.now_ns(),
            from,
            word: w,
        });
    }

    /// As the CM of `cur`, `by` reports it cannot reach `machine`, both of
    /// the configuration and both holding their leases: one end of the
    /// link must go, or the commits the link cut off hold their locks for
    /// good. It is `machine` — unless that is this CM (which reconfigures,
    /// so it stays), or `by` had another report taken within
    /// [`REPORT_MEMORY_LEASES`] leases (a machine that cannot reach one
    /// peer after another is more likely the broken one). When both ends
    /// report each other, the first report taken stands: the second's
    /// reporter is suspected already. The suspicion starts the
    /// reconfiguration; its probe still removes whichever else fails.
    /// Whether the report was well-formed.
    fn take_report<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        cur: &Stored,
        by: NodeId,
        machine: NodeId,
        heard: &mut BTreeMap<NodeId, u64>,
        ev: &mut Vec<Event>,
    ) -> bool {
        let c = &cur.config;
        if by == machine || !c.contains(by) || !c.contains(machine) {
            return false;
        }
        let now = ctx.now_ns();
        let me = self.me();
        let suspected = self.suspected(c.id);
        let out = if suspected.contains(&by) || suspected.contains(&machine) {
            None
        } else {
            let memory = REPORT_MEMORY_LEASES * self.timing.lease_ns;
            let again = heard.get(&by).is_some_and(|&t| now < t + memory);
            let out = if machine == me || (again && by != me) {
                by
            } else {
                machine
            };
            heard.insert(by, now);
            self.membership.suspect(Suspicion {
                by,
                machine: out,
                config: c.id,
                at_ns: now,
                renewed_ns: now,
            });
            Some(out)
        };
        ev.push(Event::Reported {
            at_ns: now,
            by,
            machine,
            suspected: out,
        });
        true
    }

    /// The store holds `s`, newer than this machine's configuration:
    /// removed if it is not in it (its CM's NEW-CONFIG installs it
    /// otherwise).
    fn store_moved<N: Nic>(&self, ctx: &Ctx<N>, s: Stored, ev: &mut Vec<Event>) {
        let id = s.config.id;
        let out = !s.config.contains(self.me());
        ev.push(Event::Superseded {
            at_ns: ctx.now_ns(),
            config: s.config.clone(),
        });
        if !self.fits(&s.config) {
            ev.push(Event::StoreError {
                at_ns: ctx.now_ns(),
                error: ConfigError::Invalid(format!(
                    "configuration {id} names machines outside this cluster of {}",
                    self.geo.machines
                )),
            });
        } else if out {
            self.membership.remove();
            ev.push(Event::Removed {
                at_ns: ctx.now_ns(),
                config: id,
            });
        } else if id > self.membership.epoch() {
            // The store backs it: install it rather than wait for a
            // NEW-CONFIG that may never come (its CM may have died since).
            // Its CM's lease, or the lack of it, decides what follows.
            let from = s.config.cm;
            self.membership.install(s.clone());
            if !self.apply(ctx, &s, ev) {
                return;
            }
            ev.push(Event::Applied {
                at_ns: ctx.now_ns(),
                id,
                from,
            });
        }
    }

    /// Applies the configuration just installed to the machine's servers
    /// and coordinators, if it runs them. A machine that cannot apply it
    /// (a region lost every replica, or would be served from a copy here
    /// that never ended) cannot serve it either: it stops, as a removed
    /// machine does, and neither acknowledges nor (as the CM) sends the
    /// configuration, which so never commits; the others remove it in
    /// turn. Whether it applied.
    fn apply<N: Nic>(&self, ctx: &Ctx<N>, s: &Stored, ev: &mut Vec<Event>) -> bool {
        let Some(m) = &self.machine else { return true };
        match m.apply(ctx, s) {
            Ok(Some(c)) => ev.push(Event::Remapped {
                at_ns: ctx.now_ns(),
                id: c.config,
                promoted: c.promoted,
                new_backups: c.new_backups.iter().map(|b| b.region).collect(),
                short_of_backups: c.short_of_backups,
            }),
            Ok(None) => {}
            Err(e) => {
                log::error!(
                    "machine {}: configuration {} cannot be applied, so this machine stops: {e}",
                    self.me(),
                    s.config.id
                );
                self.membership.remove();
                ev.push(Event::RemapFailed {
                    at_ns: ctx.now_ns(),
                    id: s.config.id,
                    error: e.to_string(),
                });
                return false;
            }
        }
        true
    }

    /// Before acknowledging a configuration (or, as its CM, committing
    /// it): the machine's coordinators' batches of the old one have
    /// completed, so every record of it is in its ring before any
    /// machine drains (a batch still in flight after half a lease is let
    /// be: recovery decides its transaction from what the drain found).
    async fn quiesce<N: Nic>(&self, ctx: &Ctx<N>) {
        if let Some(m) = &self.machine {
            if !m.quiesce(ctx, self.timing.lease_ns / 2).await {
                log::warn!(
                    "machine {}: a coordinator's batch is still in flight after {} µs",
                    self.me(),
                    self.timing.lease_ns / 2000
                );
            }
        }
    }

    /// NEW-CONFIG-ACK of configuration `id` to its CM `to`.
    async fn ack<N: Nic>(&self, ctx: &Ctx<N>, to: NodeId, id: u64) {
        let off = self.geo.config_word(self.me());
        send_word(ctx, off, to, id, Kind::NewConfigAck, id).await;
    }

    /// Whether every machine of `c` is a machine of this cluster.
    fn fits(&self, c: &Configuration) -> bool {
        c.machines.iter().all(|m| m.0 < self.geo.machines)
    }

    /// Steps 2–3 once this machine's turn came, then, if its
    /// configuration won, 5–7.
    async fn reconfigure<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        cur: &Stored,
        ev: &mut Vec<Event>,
    ) -> Result<(), TxError> {
        let me = self.me();
        match self.store.read() {
            Ok(Some(s)) if s.revision != cur.revision => {
                self.store_moved(ctx, s, ev);
                return Ok(());
            }
            Ok(_) => {}
            Err(error) => {
                ev.push(Event::StoreError {
                    at_ns: ctx.now_ns(),
                    error,
                });
                return Ok(());
            }
        }
        let suspected = self.suspected(cur.config.id);
        let (answered, failed) = self.probe(ctx, cur, &suspected).await?;
        let n = cur.config.machines.len();
        ev.push(Event::Probed {
            at_ns: ctx.now_ns(),
            answered,
            failed: failed.iter().copied().collect(),
        });
        if answered * 2 <= n {
            ev.push(Event::NoMajority {
                at_ns: ctx.now_ns(),
                answered,
            });
            if me == cur.config.cm {
                // A CM cut off from the majority steps down: it grants no
                // more leases, so its side learns within a lease.
                self.membership.remove();
                ev.push(Event::SteppedDown {
                    at_ns: ctx.now_ns(),
                    config: cur.config.id,
                });
            }
            return Ok(());
        }
        let new = Configuration {
            id: cur.config.id + 1,
            machines: cur
                .config
                .machines
                .iter()
                .copied()
                .filter(|(m, _)| !failed.contains(m))
                .collect(),
            cm: me,
        };
        let at_ns = ctx.now_ns();
        let swapped = match self.store.cas(Some(cur.revision), &new) {
            // The store may have taken the swap and lost the answer: what
            // it holds now says.
            Err(error) => {
                ev.push(Event::StoreError { at_ns, error });
                match self.store.read() {
                    Ok(Some(s)) if s.config == new => Ok(Swap::Done(s.revision)),
                    Ok(Some(s)) if s.revision != cur.revision => Ok(Swap::Lost(Some(s))),
                    _ => return Ok(()),
                }
            }
            other => other,
        };
        match swapped {
            Ok(Swap::Done(revision)) => {
                ev.push(Event::Stored {
                    at_ns,
                    config: new.clone(),
                    revision,
                });
                self.lead(
                    ctx,
                    Stored {
                        revision,
                        config: new,
                    },
                    !failed.is_empty(),
                    ev,
                )
                .await?;
            }
            Ok(Swap::Lost(Some(s))) => self.store_moved(ctx, s, ev),
            Ok(Swap::Lost(None)) => ev.push(Event::StoreError {
                at_ns,
                error: ConfigError::Store("the store lost its configuration".into()),
            }),
            Err(error) => ev.push(Event::StoreError { at_ns, error }),
        }
        Ok(())
    }

    /// Steps 5–7 as the new CM of `new`; `removed`: machines of the old
    /// configuration are not in it.
    async fn lead<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        new: Stored,
        removed: bool,
        ev: &mut Vec<Event>,
    ) -> Result<(), TxError> {
        let me = self.me();
        let id = new.config.id;
        let others: Vec<NodeId> = new
            .config
            .machines
            .iter()
            .map(|m| m.0)
            .filter(|&m| m != me)
            .collect();
        self.membership.install(new.clone());
        if !self.apply(ctx, &new, ev) {
            return Ok(());
        }
        self.quiesce(ctx).await;
        // Leases granted in the old configuration to machines not in this
        // one: this machine granted its last at the latest now (its grant
        // tasks follow the configuration just installed), and an old CM
        // elsewhere is dead or stepped down; a lease from now, they ran
        // out.
        let leases_out_ns = if removed {
            ctx.now_ns() + self.timing.lease_ns
        } else {
            0
        };
        self.broadcast(ctx, &others, id, Kind::NewConfig).await;
        ev.push(Event::NewConfigSent {
            at_ns: ctx.now_ns(),
            id,
        });
        let ack = Msg {
            kind: Kind::NewConfigAck,
            config: config_tag(id),
            seq: id,
        }
        .encode();
        let deadline = ctx.now_ns() + self.timing.lease_ns;
        let mut pending: Vec<NodeId> = others.clone();
        loop {
            let mut still = Vec::new();
            for &k in &pending {
                if ctx.local().load(config_word(self.geo, k))? != ack {
                    still.push(k);
                }
            }
            pending = still;
            if pending.is_empty() || ctx.now_ns() >= deadline {
                break;
            }
            let area = (self.geo.lease_word(0), self.geo.machines as u64 * 64);
            ctx.wait_for_write(area.0, area.1, Some(deadline.min(ctx.now_ns() + WATCH_NS)))?
                .await;
        }
        if !pending.is_empty() {
            for &k in &pending {
                self.membership.suspect(Suspicion {
                    by: me,
                    machine: k,
                    config: id,
                    at_ns: ctx.now_ns(),
                    renewed_ns: deadline - self.timing.lease_ns,
                });
            }
            ev.push(Event::AckMissing {
                at_ns: ctx.now_ns(),
                id,
                machines: pending,
            });
            return Ok(());
        }
        ev.push(Event::Acked {
            at_ns: ctx.now_ns(),
            id,
        });
        if leases_out_ns > ctx.now_ns() {
            ctx.sleep_until(leases_out_ns)?.await;
        }
        self.broadcast(ctx, &others, id, Kind::NewConfigCommit)
            .await;
        self.membership.commit(id);
        ev.push(Event::Committed {
            at_ns: ctx.now_ns(),
            id,
        });
        Ok(())
    }

    /// `kind(id)` to every machine of `to`, in one batch (a machine that
    /// cannot be reached is found out by its missing acknowledgement).
    async fn broadcast<N: Nic>(&self, ctx: &Ctx<N>, to: &[NodeId], id: u64, kind: Kind) {
        let w = Msg {
            kind,
            config: config_tag(id),
            seq: id,
        }
        .encode();
        for chunk in to.chunks(MAX_BATCH) {
            let mut b = ctx.batch();
            for &k in chunk {
                b.write_u64(
                    GlobalAddr::new(k, Space::Host, config_word(self.geo, self.me())),
                    w,
                );
            }
            if let Err(e) = b.submit().await {
                log::warn!(
                    "machine {}: {kind:?}({id}) not delivered everywhere: {e}",
                    self.me()
                );
            }
        }
    }

    /// The machines suspected in configuration `config`.
    fn suspected(&self, config: u64) -> BTreeSet<NodeId> {
        let s = self.membership.suspicions();
        s.iter()
            .filter(|s| s.config == config)
            .map(|s| s.machine)
            .collect()
    }

    /// This machine's place among the CM's backups: 1 for the machine
    /// after the CM in the configuration (cyclically), and so on.
    fn rank(&self, cur: &Stored) -> u64 {
        let ms = &cur.config.machines;
        let at = |x: NodeId| ms.iter().position(|m| m.0 == x).unwrap_or(0);
        let (c, me) = (at(cur.config.cm), at(self.me()));
        ((me + ms.len() - c) % ms.len()) as u64
    }

    /// READs every other machine of the configuration (not those
    /// suspected): how many machines answered, itself included, and which
    /// are out.
    async fn probe<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        cur: &Stored,
        suspected: &BTreeSet<NodeId>,
    ) -> Result<(usize, BTreeSet<NodeId>), TxError> {
        let me = self.me();
        let mut failed: BTreeSet<NodeId> = suspected.clone();
        failed.remove(&me);
        loop {
            let targets: Vec<NodeId> = cur
                .config
                .machines
                .iter()
                .map(|m| m.0)
                .filter(|&m| m != me && !failed.contains(&m))
                .collect();
            if targets.is_empty() {
                break;
            }
            // A batch at a time; one round finds one failure per batch,
            // and a dead machine's queue pair fails at once the next round.
            let mut found = false;
            for chunk in targets.chunks(MAX_BATCH) {
                let mut b = ctx.batch();
                for &m in chunk {
                    b.read_new(GlobalAddr::new(m, Space::Host, self.geo.lease_word(me)), 8);
                }
                if let Err(e) = b.submit().await {
                    // An error that names no machine of the batch leaves
                    // them all out of this probe (the next one tries
                    // again): it must not end the task.
                    match node_of(&e).filter(|n| chunk.contains(n)) {
                        Some(node) => {
                            failed.insert(node);
                        }
                        None => {
                            log::warn!("machine {me}: probe failed: {e}");
                            failed.extend(chunk.iter().copied());
                        }
                    }
                    found = true;
                }
            }
            if !found {
                break;
            }
        }
        let n = cur.config.machines.len();
        let out = failed.iter().filter(|m| cur.config.contains(**m)).count();
        Ok((n - out, failed))
    }
}

fn node_of(e: &nicdrv::VerbError) -> Option<NodeId> {
    use nicdrv::VerbError as V;
    match *e {
        V::Failed { node, .. }
        | V::NodeDead { node }
        | V::Post { node, .. }
        | V::NoRoute { node } => Some(node),
        _ => None,
    }
}

/// Step 4's region map: every region that had a replica on a machine not
/// in `next` loses it. A region whose primary failed gets one of its
/// surviving backups as primary (the first); every region gets new
/// backups, up to f, on machines of `next` that hold none of its replicas
/// and lie, where possible, in failure domains its replicas do not; among
/// those, the machine with the fewest replicas so far (then the lowest
/// id), so load stays spread. `slot(machine, region)` gives a free
/// replica base on a machine for a new backup, or none (the machine is
/// skipped). A region with no surviving replica is lost: the error names
/// it. One that cannot get f backups (every machine of `next` holds a
/// replica of it, or has no free slot) keeps the replicas it has and
/// gets as many new ones as there is room for: FaRM stays available
/// while one replica of each region survives (§5.3). A later remap would
/// top it up where a machine had room, but configurations here only ever
/// lose machines (none joins a running cluster), so a region short of
/// backups stays so until the cluster is restarted.
pub fn remap(
    map: &RegionMap,
    next: &Configuration,
    mut slot: impl FnMut(NodeId, &Region) -> Option<u64>,
) -> Result<RegionMap, TxError> {
    let f = map.backups_per_region();
    let domain = |m: NodeId| next.machines.iter().find(|x| x.0 == m).map(|x| x.1);
    let mut load: std::collections::BTreeMap<NodeId, usize> =
        next.machines.iter().map(|m| (m.0, 0)).collect();
    for r in map.iter() {
        for rep in std::iter::once(&r.primary).chain(&r.backups) {
            if let Some(n) = load.get_mut(&rep.machine) {
                *n += 1;
            }
        }
    }
    let mut out = RegionMap::new(f);
    for r in map.iter() {
        let mut live: Vec<Replica> = std::iter::once(r.primary)
            .chain(r.backups.iter().copied())
            .filter(|rep| next.contains(rep.machine))
            .collect();
        if live.is_empty() {
            return Err(TxError::Protocol(format!(
                "region {}: every replica was on a failed machine",
                r.id
            )));
        }
        while live.len() < f + 1 {
            let held: BTreeSet<NodeId> = live.iter().map(|x| x.machine).collect();
            let domains: BTreeSet<Option<u32>> = live.iter().map(|x| domain(x.machine)).collect();
            let mut candidates: Vec<(bool, usize, NodeId)> = next
                .machines
                .iter()
                .filter(|m| !held.contains(&m.0))
                .map(|m| (domains.contains(&Some(m.1)), load[&m.0], m.0))
                .collect();
            candidates.sort_unstable();
            let Some(base) = candidates
                .iter()
                .find_map(|c| slot(c.2, r).map(|b| (c.2, b)))
            else {
                // Every machine left holds a replica of the region or has
                // no free slot: it runs on with the replicas it has.
                break;
            };
            *load.get_mut(&base.0).expect("a machine of next") += 1;
            live.push(Replica {
                machine: base.0,
                base: base.1,
            });
        }
        out.add_remapped(Region {
            id: r.id,
            bytes: r.bytes,
            primary: live[0],
            backups: live[1..].to_vec(),
        })
        .map_err(|e| TxError::Protocol(format!("remapping region {}: {e}", r.id)))?;
    }
    Ok(out)
}
