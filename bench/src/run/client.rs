//! The clients: loading the index, and the operations each client issues,
//! recorded into the history when there is one. Generic over the backend.

use super::*;

pub(crate) struct ClientTally {
    /// Per kind of operation; the latency of all of them together is
    /// their sum, made at the end rather than recorded a second time per
    /// operation.
    pub(crate) kinds: RefCell<Vec<KindStats>>,
    pub(crate) tree: RefCell<TreeStats>,
    /// What every client of the run shares, over every core on emu.
    pub(crate) across: Arc<Across>,
    pub(crate) failure: RefCell<Option<String>>,
    /// Inserts by this executor's clients. The n-th is record
    /// `records + n * insert_stride + insert_offset`: on sim one executor
    /// holds every client (stride 1), on emu each core numbers its own.
    pub(crate) inserted: Cell<u64>,
    pub(crate) insert_stride: u64,
    pub(crate) insert_offset: u64,
    pub(crate) history: Option<RefCell<HistLog>>,
    /// Events this executor's history may hold: what it has claimed of
    /// the run's room ([`Across::history_left`]) so far.
    pub(crate) history_room: Cell<u64>,
    /// How many events it claims at a time.
    pub(crate) history_chunk: u64,
    /// Clients that ran to their end (a run with faults may stop others).
    pub(crate) finished: Cell<u64>,
    /// When the last measured operation ended (completed or failed); kept
    /// only under faults, where the run's end is not the last event.
    pub(crate) last_done_ns: Cell<u64>,
}

/// What every client of a run shares: over every core on emu and mlx5 (on
/// sim, one executor holds every client). Relaxed throughout: counts, time
/// stamps and a stop flag, each read for itself; nothing is published
/// through them (a core's failure and history stay in its own tally).
pub(crate) struct Across {
    /// When the first measured operation began: the start of the measured
    /// interval (`u64::MAX` until then).
    pub(crate) from: AtomicU64,
    /// Clients past their warm-up: under `--seconds`, measuring starts
    /// once all are.
    pub(crate) warm: AtomicU64,
    /// Set by the first client whose failure fails the run: every client,
    /// on every core, stops before its next operation (without it, the
    /// other cores ran on to their end, a `--seconds` run's whole length,
    /// with nothing left to measure).
    pub(crate) halted: AtomicBool,
    /// History events no core has claimed yet, of what a timed run's
    /// history may hold ([`RunSpec::history_cap`]). Cores claim it in
    /// chunks, as they record: one shared bound rather than an equal share
    /// each, which the core of a quicker half-mix reached first, failing
    /// the run with the others' shares unused.
    pub(crate) history_left: AtomicU64,
}

impl Across {
    pub(crate) fn new(spec: &RunSpec) -> Across {
        Across {
            from: AtomicU64::new(u64::MAX),
            warm: AtomicU64::new(0),
            halted: AtomicBool::new(false),
            history_left: AtomicU64::new(spec.history_cap),
        }
    }

    /// Takes up to `want` events of the history's room; what it got (0
    /// once the room is spent).
    fn claim_history(&self, want: u64) -> u64 {
        // The update is one atomic read-modify-write, so claims never
        // total more than the room whatever the ordering.
        match self
            .history_left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                (left > 0).then(|| left - want.min(left))
            }) {
            Ok(left) => want.min(left),
            Err(_) => 0,
        }
    }

    /// Stops every client of the run at its next operation.
    pub(crate) fn halt(&self) {
        self.halted.store(true, Ordering::Relaxed);
    }
}

impl ClientTally {
    /// The history recorded so far, taken out (where one is recorded).
    pub(crate) fn take_history(&self) -> Option<HistLog> {
        self.history
            .as_ref()
            .map(|h| std::mem::take(&mut *h.borrow_mut()))
    }

    /// Whether this executor's history, holding `held` events, may take
    /// one more: within what it claimed, or once it claimed more.
    pub(crate) fn history_has_room(&self, held: u64) -> bool {
        if held < self.history_room.get() {
            return true;
        }
        // A chunk, or what brings the room past `held` if more (a test's
        // room of a few events, several clients recording into it).
        let want = self.history_chunk.max(held + 1 - self.history_room.get());
        let got = self.across.claim_history(want);
        self.history_room
            .set(self.history_room.get().saturating_add(got));
        held < self.history_room.get()
    }

    pub(crate) fn new(
        spec: &RunSpec,
        across: Arc<Across>,
        insert_stride: u64,
        insert_offset: u64,
    ) -> Rc<ClientTally> {
        Rc::new(ClientTally {
            kinds: RefCell::new(
                KINDS
                    .iter()
                    .map(|_| KindStats {
                        count: 0,
                        latency: latency_histogram(),
                        rtt: vec![0; 65],
                        bytes_written: 0,
                        bytes_read: 0,
                        nosplit: 0,
                        nosplit_bytes: 0,
                        failed: 0,
                    })
                    .collect(),
            ),
            tree: RefCell::new(TreeStats::default()),
            across,
            failure: RefCell::new(None),
            inserted: Cell::new(0),
            insert_stride,
            insert_offset,
            history: spec
                .record_history
                .then(|| RefCell::new(HistLog::default())),
            history_room: Cell::new(0),
            // A 16th of an equal share, so that what cores claimed and
            // did not fill is small beside the whole; at most 4096 events
            // a claim, so that claims stay rare.
            history_chunk: (spec.history_cap / insert_stride.max(1) / 16).clamp(1, 4096),
            finished: Cell::new(0),
            last_done_ns: Cell::new(0),
        })
    }
}

pub(crate) fn pick(mix: &Mix, rng: &mut Rng) -> Kind {
    let mut u = rng.unit();
    for k in KINDS {
        if u < mix.props[k.ix()] {
            return k;
        }
        u -= mix.props[k.ix()];
    }
    // Rounding left u just above the last proportion: the last kind in use.
    KINDS
        .into_iter()
        .rev()
        .find(|k| mix.props[k.ix()] > 0.0)
        .unwrap_or(Kind::Read)
}

/// Scans run from their start key to the end of the key space.
pub(crate) const SCAN_HIGH: u64 = u64::MAX - 1;

/// One index handle per compute node.
/// `dm_bytes`: the device memory each memory node has (the lock table's
/// room).
pub(crate) fn handles(spec: &RunSpec, dm_bytes: u64) -> Result<Vec<IndexHandle>, String> {
    // The hash table's location cache is allocated whole, on every
    // compute node: refused, not aborted on, where it cannot fit.
    let cache_all = (spec.cache_bytes as u64).saturating_mul(spec.compute_nodes as u64);
    if let (true, Some(avail)) = (spec.cuckoo && cache_all > 0, crate::args::available_bytes()) {
        if cache_all > avail {
            return Err(format!(
                "--cache-mb: the hash table's location cache, {} MiB on each of {} compute \
                 nodes, {} MiB in all, is more than this machine's {} MiB of available memory",
                spec.cache_bytes >> 20,
                spec.compute_nodes,
                cache_all >> 20,
                avail >> 20
            ));
        }
    }
    (0..spec.compute_nodes)
        .map(|_| {
            if spec.cuckoo {
                let expected = spec.records + spec.clients() * spec.ops_hint();
                let (kb, vb) = (spec.key_bytes, spec.tree.value_bytes);
                let mut cfg = CuckooConfig::new(expected + expected / 4, kb, vb, spec.host_bytes);
                cfg.chunk = spec.tree.chunk.clone();
                // The index cache (`--cache-mb`) holds the location cache:
                // 32-byte lines, a power of two of them.
                let lines = (spec.cache_bytes / 32).min(1 << 30);
                cfg.location_cache_lines = match lines {
                    0 => 0,
                    n => 1 << n.ilog2(),
                };
                if let Some(g) = spec.hash_grace_ns {
                    cfg.reuse_grace_ns = g;
                }
                Cuckoo::new(cfg)
                    .map(IndexHandle::Hash)
                    .map_err(|e| e.to_string())
            } else {
                let cfg = TreeConfig {
                    cache_bytes: spec.cache_bytes,
                    ..spec.tree.clone()
                };
                IndexHandle::tree(spec.key_bytes, cfg, dm_bytes).map_err(|e| e.to_string())
            }
        })
        .collect()
}

/// Loaders that fill the hash table in parallel (it has no bulk load).
pub(crate) const CUCKOO_LOADERS: usize = 32;

/// Creates the index and loads the records: the tree by one client's bulk
/// load (`part` 0 of 1), the hash table by `CUCKOO_LOADERS` clients each
/// putting its share of the records.
pub(crate) async fn load_part<N: Nic>(
    ctx: Ctx<N>,
    h: IndexHandle,
    records: u64,
    part: usize,
    parts: usize,
    err: Rc<RefCell<Option<String>>>,
    loaded: Arc<AtomicU64>,
) {
    let r = async {
        match &h {
            IndexHandle::Tree(_) | IndexHandle::Wide(_) => {
                let mut c = h.client(u64::MAX - 1).map_err(|e| e.to_string())?;
                c.create(&ctx).await.map_err(|e| e.to_string())?;
                c.bulk_load(&ctx, records_sorted(records), loaded)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            IndexHandle::Hash(_) => {
                let mut c = h
                    .client(u64::MAX - 1 - part as u64)
                    .map_err(|e| e.to_string())?;
                if parts == 1 {
                    c.create(&ctx).await.map_err(|e| e.to_string())?;
                } else {
                    for i in (part as u64..records).step_by(parts) {
                        c.put(&ctx, key_of(i), i).await.map_err(|e| e.to_string())?;
                        // Relaxed: a progress figure for the display only.
                        loaded.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        Ok::<(), String>(())
    };
    if let Err(e) = r.await {
        *err.borrow_mut() = Some(e);
    }
}

/// Records one operation into the executor's history, when there is one.
pub(crate) struct Log<'a, N: Nic> {
    pub(crate) log: Option<&'a RefCell<HistLog>>,
    pub(crate) ctx: &'a Ctx<N>,
    pub(crate) emu: bool,
    pub(crate) client: u32,
    pub(crate) measured: bool,
}

impl<N: Nic> Log<'_, N> {
    pub(crate) fn now(&self) -> u64 {
        if self.emu {
            nicdrv::clock::now_ns()
        } else {
            self.ctx.now_ns()
        }
    }

    pub(crate) fn invoke(&self, op: impl FnOnce() -> Op) -> Option<OpId> {
        let log = self.log?;
        let now = self.now();
        Some(
            log.borrow_mut()
                .invoke(self.client, op(), now, self.measured),
        )
    }

    /// `ret` is asked for only when recording. A failed operation is left
    /// pending (invoked, never completed): its effect is unknown, and it
    /// may take effect at any later time or never.
    pub(crate) fn complete<T, E>(
        &self,
        id: Option<OpId>,
        r: &Result<T, E>,
        ret: impl FnOnce(&T) -> Ret,
    ) {
        if let (Some(log), Some(id), Ok(v)) = (self.log, id, r) {
            let now = self.now();
            log.borrow_mut().history.complete(id, ret(v), now);
        }
    }
}

/// The values one client writes: `client << PUT_BITS | n` for its `n`-th
/// put, so every value written in a run is unique and differs from every
/// bulk-loaded value (a record's index, below 2³²): a stale read is always
/// told from a fresh one. Client ids run from 1 to at most 2²⁴ (the
/// clients `run` admits), so the ids fit above [`PUT_BITS`] bits of put
/// numbers; with 32 bits, as before, a client's 2³²nd put (an hour and a
/// half at 800 thousand puts a second) wrote the next client's first
/// value.
pub(crate) struct Values {
    pub(crate) client: u64,
    pub(crate) puts: u64,
}

/// Bits of a client's put number in its values: 2³⁹ puts, more than a
/// client makes in `--seconds`' longest run (a day) at 6 million puts a
/// second, or in the most `--ops` and `--warmup` allow (2 × 10¹¹).
pub(crate) const PUT_BITS: u32 = 39;

impl Values {
    pub(crate) fn new(client: u64) -> Values {
        assert!(
            client > 0 && client < 1 << (64 - PUT_BITS),
            "client id {client} outside 1..2^{}",
            64 - PUT_BITS
        );
        Values { client, puts: 0 }
    }

    pub(crate) fn next(&mut self) -> u64 {
        // An invariant of the bounds above, not of input: past it, values
        // would repeat and histories could not be checked.
        assert!(
            self.puts < 1 << PUT_BITS,
            "client {} made 2^{PUT_BITS} puts: its values would repeat",
            self.client
        );
        let v = self.client << PUT_BITS | self.puts;
        self.puts += 1;
        v
    }
}

/// One operation of `kind` on record `key`.
pub(crate) async fn one_op<N: Nic>(
    c: &mut Client,
    kind: Kind,
    key: u64,
    spec: &RunSpec,
    sh: &ClientTally,
    (rng, values): (&mut Rng, &mut Values),
    log: &Log<'_, N>,
) -> Result<(), index::any::AnyError> {
    let ctx = log.ctx;
    match kind {
        Kind::Read => {
            let id = log.invoke(|| Op::Get(key));
            let r = c.get(ctx, key).await;
            log.complete(id, &r, |v| Ret::Get(*v));
            r.map(drop)
        }
        Kind::Update | Kind::Insert => {
            let key = if kind == Kind::Insert {
                let n = sh.inserted.get();
                sh.inserted.set(n + 1);
                key_of(spec.records + n * sh.insert_stride + sh.insert_offset)
            } else {
                key
            };
            let v = values.next();
            let id = log.invoke(|| Op::Put(key, v));
            let r = c.put(ctx, key, v).await;
            log.complete(id, &r, |_| Ret::Put);
            r
        }
        Kind::Scan => {
            let len = spec.mix.scan_len(rng);
            let id = log.invoke(|| Op::Scan {
                low: key,
                high: SCAN_HIGH,
                limit: len,
            });
            let r = c.scan(ctx, key, SCAN_HIGH, len).await;
            log.complete(id, &r, |v| Ret::Scan(v.clone()));
            r.map(drop)
        }
        Kind::ReadModifyWrite => {
            // YCSB's read-modify-write: read the record, write a new value.
            // The history holds its two steps as a get and a put.
            let id = log.invoke(|| Op::Get(key));
            let r = c.get(ctx, key).await;
            log.complete(id, &r, |v| Ret::Get(*v));
            r?;
            let v = values.next();
            let id = log.invoke(|| Op::Put(key, v));
            let r = c.put(ctx, key, v).await;
            log.complete(id, &r, |_| Ret::Put);
            r
        }
    }
}

/// One client: warm-up, then measured operations. Generic over the backend.
pub(crate) async fn client_task<N: Nic>(
    ctx: Ctx<N>,
    mut c: Client,
    spec: Rc<RunSpec>,
    dist: Rc<KeyDist>,
    me: u64,
    sh: Rc<ClientTally>,
) {
    let mut rng = Rng::stream(spec.seed, Domain::Client, me);
    let mut values = Values::new(me);
    // emu and mlx5: the wall clock, read as the executor reads it.
    let emu = spec.backend != Backend::Sim;
    let faulty = !spec.faults.is_empty();
    // Under `--seconds` every client measures the same window: it starts
    // once every client is past its warm-up. Clients warm up at their own
    // pace (a client whose operations hit a cache runs ahead), and a
    // window opened by the first one ready would end before the slowest
    // measured anything. Not under faults: a stopped client never warms.
    let barrier = matches!(spec.length, Length::Nanos(_)) && !faulty;
    let mut measuring = false;
    // Relaxed throughout: counts and time stamps, read for the start and
    // end of the window and the report; nothing is published through them.
    let warmed = || {
        sh.across.warm.fetch_add(1, Ordering::Relaxed);
    };
    for i in 0.. {
        if cmdline::signals::stop_requested() {
            break; // SIGINT/SIGTERM: the run ends with what it measured
        }
        if sh.across.halted.load(Ordering::Relaxed) {
            return; // another client's failure failed the run
        }
        let t0 = ctx.now_ns();
        if i == spec.warmup {
            warmed();
        }
        if !measuring
            && i >= spec.warmup
            && (!barrier || sh.across.warm.load(Ordering::Relaxed) >= spec.clients())
        {
            sh.across.from.fetch_min(t0, Ordering::Relaxed);
            c.reset_stats();
            measuring = true;
        }
        let measured = measuring;
        match spec.length {
            Length::Ops(n) if i >= spec.warmup + n => break,
            Length::Nanos(d)
                if measured && t0 >= sh.across.from.load(Ordering::Relaxed).saturating_add(d) =>
            {
                break
            }
            _ => {}
        }
        if let Some(log) = &sh.history {
            let held = log.borrow().history.len() as u64;
            if !sh.history_has_room(held) {
                // The run fails, its history (this far) kept and written.
                let mut failure = sh.failure.borrow_mut();
                if failure.is_none() {
                    *failure = Some(format!(
                        "the history reached its bound of {} operations, what half of this \
                         machine's available memory holds; record a shorter --seconds, or count \
                         --ops (a counted run's history is checked before it starts)",
                        spec.history_cap
                    ));
                }
                sh.across.halt();
                return;
            }
        }
        let kind = pick(&spec.mix, &mut rng);
        let rec = if spec.mix.request == RequestDist::Latest {
            // YCSB's "latest": rank r counts back from the newest record.
            let top = spec.records + sh.inserted.get() * sh.insert_stride;
            top - 1 - dist.rank(&mut rng) % top
        } else {
            dist.next(&mut rng)
        };
        let key = key_of(rec);
        let before = ctx.counters();
        let splits0 = c.splits();
        let log = Log {
            log: sh.history.as_ref(),
            ctx: &ctx,
            emu,
            client: me as u32,
            measured,
        };
        let draws = (&mut rng, &mut values);
        let r = one_op(&mut c, kind, key, &spec, &sh, draws, &log).await;
        if measured && faulty {
            sh.last_done_ns.set(sh.last_done_ns.get().max(ctx.now_ns()));
        }
        if let Err(e) = r {
            if !faulty {
                // The core's first failure is the one reported.
                sh.failure
                    .borrow_mut()
                    .get_or_insert_with(|| format!("{} of key {key}: {e}", kind.name()));
                *sh.tree.borrow_mut() += c.tree_stats();
                sh.across.halt();
                return;
            }
            // Under faults the client goes on; the failure is counted and
            // its operation stays pending in the history.
            sh.kinds.borrow_mut()[kind.ix()].failed += 1;
            continue;
        }
        if !measured {
            continue;
        }
        // Only three counters are wanted: subtracting all ten cost 51
        // instructions an operation.
        let after = ctx.counters();
        let round_trips = after.round_trips - before.round_trips;
        let bytes_written = after.bytes_written - before.bytes_written;
        let lat = (ctx.now_ns() - t0).max(1);
        let mut ks = sh.kinds.borrow_mut();
        let s = &mut ks[kind.ix()];
        s.count += 1;
        let _ = s.latency.record(lat);
        s.rtt[(round_trips as usize).min(64)] += 1;
        s.bytes_written += bytes_written;
        s.bytes_read += after.bytes_read - before.bytes_read;
        if kind.is_write() && c.splits() == splits0 {
            s.nosplit += 1;
            s.nosplit_bytes += bytes_written;
        }
    }
    *sh.tree.borrow_mut() += c.tree_stats();
    sh.finished.set(sh.finished.get() + 1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_stay_unique_past_2_to_the_32_puts_and_above_every_record() {
        // With 32 bits of put number, client 1's put number 2^32 wrote
        // its own first value, and 2^33 client 3's first.
        let late = |puts| Values { client: 1, puts }.next();
        assert_ne!(late(1 << 32), Values::new(1).next());
        assert_ne!(late(1 << 33), Values::new(3).next());
        // The highest client id and put number fit in 64 bits, and the
        // lowest value is above every record number.
        let mut top = Values {
            client: (1 << (64 - PUT_BITS)) - 1,
            puts: (1 << PUT_BITS) - 1,
        };
        assert_eq!(top.next(), u64::MAX);
        assert!(Values::new(1).next() >= 1 << 32);
    }

    #[test]
    #[should_panic(expected = "values would repeat")]
    fn a_client_past_its_put_numbers_stops_rather_than_repeat_a_value() {
        let mut v = Values {
            client: 1,
            puts: 1 << PUT_BITS,
        };
        v.next();
    }
}
