//! The message and log ring: one per sender–receiver pair, in the
//! receiver's memory, appended by the sender with one-sided RDMA WRITEs
//! and polled by the receiver's own cores through the local view. FaRM's
//! logs and message queues are such rings (§3, "Communication
//! primitives"; §4 for the logs).
//!
//! # Layout
//! The ring is `capacity` bytes (a multiple of 16) at `ring_off` of the
//! receiver's host memory. A record sits at a 16-byte aligned position and
//! never wraps:
//!
//! ```text
//! word 0     pos: the record's absolute byte position (its offset from the
//!            ring's first byte ever written, across laps)
//! word 1     len (bits 0..31) | PAD flag (bit 31) | crc32c (bits 32..63)
//! payload    len bytes, then zeros to a multiple of 16
//! ```
//!
//! The crc32c covers `pos`, the `len | PAD` word and the payload (a PAD
//! record's payload is not written and not covered). A record that does
//! not fit before the ring's end is preceded by a PAD record filling the
//! rest of the lap; both go in one batch, each its own WRITE. A PAD
//! shorter than the rest of the lap is a void: the receiver skips it as
//! it skips a PAD, and a sender writes voids over records that must never
//! be taken ([`Sender::stage_voids`]).
//!
//! # Why a torn or truncated record is never accepted
//! A WRITE lands in 64-byte lines in no guaranteed order, and a sender may
//! crash after some of them. The receiver accepts the record at its head
//! only when `pos` equals the head (a record left from an earlier lap has
//! a smaller position) and the crc32c of what it read matches: a header of
//! the new record over payload lines of an old one, or the reverse, or a
//! record cut short, fails the check and is read again once more lines
//! land. (A wrong record passes with probability 2^-32 per look.)
//!
//! # Flow control
//! The sender never overwrites unread records: it knows the receiver's
//! head from a word in its *own* memory (`sender_head_off`) that the
//! receiver writes lazily — when a quarter of the ring was consumed since
//! it last did, and, where it waits for records ([`Receiver::recv`]),
//! once it has waited [`IDLE_REPORT_NS`] with some consumed unreported.
//! A receiver that only polls (a server's log rings, whose senders may
//! get no reply to piggyback a head on) reports each quarter only; a
//! sender short of room that has waited [`FETCH_HEAD_NS`] for a report
//! READs the head the receiver persists ([`Sender::fetch_head`]), so a
//! sender blocked on a full ring is always released. The receiver persists its
//! head in its own memory (`receiver_head_off`) after every record; a
//! receiver restarted from it resumes at the first unconsumed record. The
//! sender persists its tail likewise (`sender_tail_off`).
//!
//! Delivery is at most once: the receiver persists its head as it takes a
//! record, so a receiver that crashes after taking one and before acting
//! on it has lost it (FaRM's log processing makes its effects idempotent
//! and truncates only after they are applied). A sender whose append
//! failed mid-way (some WRITEs may have landed) is poisoned and appends no
//! more: the ring needs recovery. A receiver that polls with `try_recv`
//! instead of `recv` returns its head itself (`report_head`), at the
//! latest before it stops polling, or its sender may wait for room for
//! good.
//!
//! Reservation: a sender can reserve space for records it will append
//! later (FaRM reserves log space for every record of a commit before the
//! commit starts); reserved space is not given to other appends, and what
//! a reservation did not use is released.

use nicdrv::local::TimerError;
use nicdrv::{Batch, Ctx, GlobalAddr, LocalError, Nic, NodeId, VerbError, WaitError, Woken};
use std::fmt;

/// How long a receiver with an empty ring waits before it reports a head
/// it has not reported: 20 µs, a few round trips, so a sender blocked on a
/// full ring waits at most that long after the receiver caught up.
pub const IDLE_REPORT_NS: u64 = 20_000;

/// How long a sender short of room waits for the receiver to report its
/// head before it READs the head the receiver persists
/// ([`Sender::fetch_head`]): a receiver that only polls reports each
/// quarter ring, and a record may need more than the bytes it consumed
/// since leave. Past a few round trips, so that a receiver that does
/// report is not raced; the READ is the only cost, and only while short.
pub const FETCH_HEAD_NS: u64 = 50_000;

/// Most records one doorbell carries ([`Sender::append_many`]): with the
/// one PAD they may need, a batch's worth of WRITEs.
pub const MAX_RECORDS_PER_DOORBELL: usize = nicdrv::exec::MAX_BATCH - 1;

/// Largest ring: 2 GiB, so that a record's length (at most half the ring)
/// fits the header's 31 bits.
pub const MAX_CAPACITY: u64 = 1 << 31;

/// Bytes of a record's header.
pub const HEADER_BYTES: u64 = 16;
/// Records start at multiples of this.
pub const ALIGN: u64 = 16;
const PAD_FLAG: u64 = 1 << 31;
const LEN_MASK: u64 = PAD_FLAG - 1;

/// Where one ring lives: the ring and the receiver's persisted head in the
/// receiver's memory, the head the receiver reports and the sender's
/// persisted tail in the sender's memory.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RingLayout {
    pub receiver: NodeId,
    pub ring_off: u64,
    pub capacity: u64,
    pub receiver_head_off: u64,
    pub sender: NodeId,
    pub sender_head_off: u64,
    pub sender_tail_off: u64,
}

impl RingLayout {
    /// Rejects layouts a ring cannot run on (alignment, a capacity of at
    /// least two headers).
    pub fn check(&self) -> Result<(), RingError> {
        let bad = |why: String| Err(RingError::Layout(why));
        if self.capacity < 2 * ALIGN
            || !self.capacity.is_multiple_of(ALIGN)
            || self.capacity > MAX_CAPACITY
        {
            return bad(format!(
                "capacity {} is not a multiple of {ALIGN} in {} ..= {MAX_CAPACITY}",
                self.capacity,
                2 * ALIGN
            ));
        }
        let ring_end = self.ring_off.checked_add(self.capacity);
        let Some(ring_end) = ring_end else {
            return bad(format!("ring_off {} + capacity overflows", self.ring_off));
        };
        if !self.ring_off.is_multiple_of(ALIGN) {
            return bad(format!("ring_off {} is not {ALIGN}-aligned", self.ring_off));
        }
        for (name, off) in [
            ("receiver_head_off", self.receiver_head_off),
            ("sender_head_off", self.sender_head_off),
            ("sender_tail_off", self.sender_tail_off),
        ] {
            if !off.is_multiple_of(8) {
                return bad(format!("{name} {off} is not 8-aligned"));
            }
        }
        if self.receiver_head_off.saturating_add(8) > self.ring_off
            && self.receiver_head_off < ring_end
        {
            return bad("receiver_head_off lies inside the ring".into());
        }
        if self.sender_head_off.abs_diff(self.sender_tail_off) < 8 {
            return bad("sender_head_off and sender_tail_off overlap".into());
        }
        Ok(())
    }

    /// The largest payload one record may carry: a record and the PAD
    /// before it always fit in an empty ring.
    pub fn max_payload(&self) -> u64 {
        self.capacity / 2 - HEADER_BYTES
    }

    /// Bytes that records of payload lengths `lens`, appended at ring
    /// position `tail`, take: the PAD before any that would cross the
    /// ring's end included. One doorbell's records must fit the ring
    /// whole ([`Sender::append_many`] refuses more, `Full`).
    pub fn bytes_at(
        &self,
        tail: u64,
        lens: impl IntoIterator<Item = u64>,
    ) -> Result<u64, RingError> {
        let (max, cap) = (self.max_payload(), self.capacity);
        let mut pos = tail;
        for len in lens {
            if len > max {
                return Err(RingError::TooLarge { len, max });
            }
            let size = record_bytes(len);
            let room = cap - pos % cap;
            pos += if size > room { room + size } else { size };
        }
        Ok(pos - tail)
    }
}

/// Bytes a record of `len` payload bytes takes in the ring.
pub fn record_bytes(len: u64) -> u64 {
    HEADER_BYTES + len.div_ceil(ALIGN) * ALIGN
}

/// Why a ring operation failed. Nothing already in the ring is lost by any
/// of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RingError {
    /// The layout cannot hold a ring (the text says why).
    Layout(String),
    /// A record larger than the ring can carry.
    TooLarge {
        len: u64,
        max: u64,
    },
    /// No room: `need` bytes, `free` free (after reservations).
    Full {
        need: u64,
        free: u64,
    },
    /// More records for one doorbell than it carries (or none).
    TooMany {
        records: usize,
        max: usize,
    },
    /// A reservation larger than the free space.
    ReservationTooLarge {
        want: u64,
        free: u64,
    },
    /// An append from a reservation that has not that much left.
    ReservationExhausted {
        need: u64,
        left: u64,
    },
    /// The wait for room or records ended at its deadline.
    Deadline,
    /// An earlier append failed or was abandoned mid-way: which of its
    /// WRITEs landed is unknown, so this sender appends no more (the ring
    /// needs recovery; FaRM reconfigures).
    Poisoned,
    /// A reservation of another sender.
    NotOurs,
    /// A wait could not start (the text says why).
    Wait(WaitError),
    /// The persisted head or tail is impossible (ahead of the other end,
    /// or more than a ring apart): the memory was not a ring's.
    Corrupt(String),
    Local(LocalError),
    Timer(TimerError),
    Verb(VerbError),
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::Layout(why) => write!(f, "ring layout: {why}"),
            RingError::TooLarge { len, max } => {
                write!(
                    f,
                    "a record of {len} bytes; this ring carries at most {max}"
                )
            }
            RingError::Full { need, free } => {
                write!(f, "ring full: {need} bytes needed, {free} free")
            }
            RingError::TooMany { records, max } => {
                write!(f, "{records} records for one doorbell; 1 ..= {max} go")
            }
            RingError::ReservationTooLarge { want, free } => {
                write!(f, "cannot reserve {want} bytes of ring: {free} free")
            }
            RingError::ReservationExhausted { need, left } => write!(
                f,
                "the reservation has {left} bytes left, the record needs {need}"
            ),
            RingError::Deadline => write!(f, "the ring wait reached its deadline"),
            RingError::Poisoned => write!(
                f,
                "an earlier append failed mid-way: this sender appends no more until the ring is recovered"
            ),
            RingError::NotOurs => write!(f, "the reservation belongs to another sender"),
            RingError::Wait(e) => write!(f, "ring: {e}"),
            RingError::Corrupt(why) => write!(f, "ring state is corrupt: {why}"),
            RingError::Local(e) => write!(f, "ring: {e}"),
            RingError::Timer(e) => write!(f, "ring: {e}"),
            RingError::Verb(e) => write!(f, "ring: {e}"),
        }
    }
}

impl std::error::Error for RingError {}

impl From<LocalError> for RingError {
    fn from(e: LocalError) -> Self {
        RingError::Local(e)
    }
}

impl From<VerbError> for RingError {
    fn from(e: VerbError) -> Self {
        RingError::Verb(e)
    }
}

impl From<WaitError> for RingError {
    fn from(e: WaitError) -> Self {
        match e {
            WaitError::Local(e) => RingError::Local(e),
            WaitError::Timer(e) => RingError::Timer(e),
            e => RingError::Wait(e),
        }
    }
}

/// The record's checksum: crc32c over its position, its `len | PAD` word
/// and its payload, in that order.
fn crc(pos: u64, lenword: u64, payload: &[u8]) -> u32 {
    let mut head = [0u8; 12];
    head[..8].copy_from_slice(&pos.to_le_bytes());
    head[8..].copy_from_slice(&(lenword as u32).to_le_bytes());
    crc32c::crc32c_append(crc32c::crc32c(&head), payload)
}

/// Encodes a record at absolute position `pos` into `out` (exactly
/// [`record_bytes`] long): a PAD of `len` unwritten bytes when `pad`.
pub fn encode(pos: u64, payload: &[u8], pad_len: Option<u64>, out: &mut [u8]) {
    let (lenword, body): (u64, &[u8]) = match pad_len {
        Some(len) => (len | PAD_FLAG, &[]),
        None => (payload.len() as u64, payload),
    };
    let c = crc(pos, lenword, body) as u64;
    out[..8].copy_from_slice(&pos.to_le_bytes());
    out[8..16].copy_from_slice(&(lenword | (c << 32)).to_le_bytes());
    if pad_len.is_none() {
        out[16..16 + body.len()].copy_from_slice(body);
        out[16 + body.len()..].fill(0);
    }
}

/// The receiving end, on the receiver's machine.
pub struct Receiver {
    layout: RingLayout,
    /// Absolute position of the next record to consume.
    head: u64,
    /// The head the sender was last told.
    reported: u64,
    /// Looks at the head that found a record's position but not yet a
    /// whole, valid record (torn by line order, or cut short).
    torn_looks: u64,
    /// The record at the head while it has been seen only in part.
    torn: Option<TornHead>,
}

/// The record at a receiver's head seen in part (forgotten when the head
/// moves): since when (the receiver's clock at the first such look), and
/// whether that it has stayed so past [`TORN_WARN_NS`] was said.
#[derive(Clone, Copy, Debug)]
struct TornHead {
    since_ns: u64,
    said: bool,
}

/// How long the record at a receiver's head may stay in part before the
/// receiver says so (once a record, in the log): a record's lines land
/// within microseconds of one another, so a second means its sender died
/// while writing it (recovery drains the ring past it) or wrote something
/// that is not a record; everything behind it waits meanwhile.
pub const TORN_WARN_NS: u64 = 1_000_000_000;

/// A record taken from the ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Its absolute position (unique per ring: a message id).
    pub pos: u64,
    pub payload: Vec<u8>,
}

/// The largest position a ring's end opens at. Positions count bytes
/// since the ring began: 2^62 of them take centuries at any NIC's rate,
/// so a persisted head or tail past it is corrupt, and every sum a ring
/// makes with one stays far from overflowing.
const POSITION_MAX: u64 = 1 << 62;

impl Receiver {
    /// Opens the receiving end from the head persisted in this machine's
    /// memory (0 for a fresh ring, whose memory is zero).
    pub fn open<N: Nic>(ctx: &Ctx<N>, layout: RingLayout) -> Result<Receiver, RingError> {
        layout.check()?;
        let head = ctx.local().load(layout.receiver_head_off)?;
        if !head.is_multiple_of(ALIGN) || head > POSITION_MAX {
            return Err(RingError::Corrupt(format!(
                "persisted head {head} is not a position: {ALIGN}-aligned, at most 2^62"
            )));
        }
        Ok(Receiver {
            layout,
            head,
            reported: head,
            torn_looks: 0,
            torn: None,
        })
    }

    pub fn head(&self) -> u64 {
        self.head
    }

    /// The head last counted as told to the sender ([`Receiver::told`],
    /// [`Receiver::report_head`]).
    pub fn reported(&self) -> u64 {
        self.reported
    }

    /// How often the record at the head was there in part: its position
    /// written, the rest not yet whole (each such look read it again).
    pub fn torn_looks(&self) -> u64 {
        self.torn_looks
    }

    /// How long (by `now_ns`, the clock the receiver's looks read) the
    /// record at the head has been seen only in part: `None` while no
    /// look found it so.
    pub fn torn_for(&self, now_ns: u64) -> Option<u64> {
        self.torn.map(|t| now_ns.saturating_sub(t.since_ns))
    }

    /// A look found the record at the head in part (`partial`: something
    /// was written there; a fresh ring's zeroes are not a record begun).
    fn look_torn<N: Nic>(&mut self, ctx: &Ctx<N>, partial: bool) {
        if !partial {
            return;
        }
        self.torn_looks += 1;
        let now = ctx.now_ns();
        let t = self.torn.get_or_insert(TornHead {
            since_ns: now,
            said: false,
        });
        let waited = now.saturating_sub(t.since_ns);
        if !t.said && waited >= TORN_WARN_NS {
            t.said = true;
            log::warn!(
                "log ring from machine {} to machine {}: the record at position {} has \
                 been there only in part for {} ms; its sender died while writing it \
                 (recovery drains the ring past it) or wrote something that is not a \
                 record, and every record behind it waits",
                self.layout.sender,
                self.layout.receiver,
                self.head,
                waited / 1_000_000
            );
        }
    }

    /// Takes the record at the head if a whole, valid one is there.
    pub fn try_recv<N: Nic>(&mut self, ctx: &Ctx<N>) -> Result<Option<Record>, RingError> {
        let mut payload = Vec::new();
        Ok(self
            .try_recv_into(ctx, &mut payload)?
            .map(|pos| Record { pos, payload }))
    }

    /// As [`Receiver::try_recv`], the payload into `out` (its buffer
    /// reused, no allocation once it is large enough); returns the
    /// record's position.
    pub fn try_recv_into<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        out: &mut Vec<u8>,
    ) -> Result<Option<u64>, RingError> {
        let l = ctx.local();
        let cap = self.layout.capacity;
        loop {
            let at = self.layout.ring_off + self.head % cap;
            // The position first: one word, and all an empty ring costs.
            let pos = l.load(at)?;
            if pos != self.head {
                return Ok(None);
            }
            let word = l.load(at + 8)?;
            // A torn look is one that found something written there (fresh
            // memory at position 0 reads as position 0 with a zero word).
            let partial = word != 0;
            let (lenword, want) = (word & 0xffff_ffff, (word >> 32) as u32);
            let len = lenword & LEN_MASK;
            let room = cap - self.head % cap;
            if lenword & PAD_FLAG != 0 {
                let fits = HEADER_BYTES + len <= room && len.is_multiple_of(ALIGN);
                if !fits || crc(pos, lenword, &[]) != want {
                    self.look_torn(ctx, partial);
                    return Ok(None); // not the PAD's whole header yet
                }
                // A PAD to the lap's end, or a void.
                self.advance(ctx, HEADER_BYTES + len)?;
                continue;
            }
            if record_bytes(len) > room || len > self.layout.max_payload() {
                self.look_torn(ctx, partial);
                return Ok(None); // a header torn or not ours: look again later
            }
            out.resize(len as usize, 0);
            l.read(at + HEADER_BYTES, out)?;
            if crc(pos, lenword, out) != want {
                self.look_torn(ctx, partial);
                return Ok(None);
            }
            self.advance(ctx, record_bytes(len))?;
            return Ok(Some(pos));
        }
    }

    fn advance<N: Nic>(&mut self, ctx: &Ctx<N>, by: u64) -> Result<(), RingError> {
        self.head += by;
        self.torn = None;
        ctx.local()
            .store(self.layout.receiver_head_off, self.head)?;
        Ok(())
    }

    /// Tells the sender the head when a quarter of the ring was consumed
    /// since the last time, or whenever anything was when `force`. Returns
    /// whether it wrote.
    pub async fn report_head<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        force: bool,
    ) -> Result<bool, RingError> {
        let due = self.head - self.reported;
        if due == 0 || (!force && due < self.layout.capacity / 4) {
            return Ok(false);
        }
        let at = GlobalAddr::host(self.layout.sender, self.layout.sender_head_off);
        let mut b = ctx.batch();
        b.write_u64(at, self.head);
        b.submit().await?;
        self.reported = self.head;
        Ok(true)
    }

    /// The sender was told `head`: a message carrying it ([`Receiver::head`],
    /// piggybacked as FaRM returns heads lazily) landed. Only then: a
    /// head marked told when its message was staged or appended, and the
    /// message then never went out (an append that timed out, a batch
    /// never posted, records made void), counted as heard one the sender
    /// never heard, and the quarter-ring report waited for consumption
    /// that could not come while the sender waited for room.
    pub fn told(&mut self, head: u64) {
        self.reported = self.reported.max(head);
    }

    /// Waits for the next record (until `deadline_ns`, if given). The head
    /// goes back to the sender lazily: after a quarter of the ring, or once
    /// the ring has been empty for [`IDLE_REPORT_NS`] with something
    /// consumed unreported — so a sender waiting for room always gets it,
    /// and a busy stream costs one head WRITE per quarter ring.
    pub async fn recv<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        deadline_ns: Option<u64>,
    ) -> Result<Record, RingError> {
        let mut payload = Vec::new();
        let pos = self.recv_into(ctx, &mut payload, deadline_ns).await?;
        Ok(Record { pos, payload })
    }

    /// As [`Receiver::recv`], the payload into `out`; returns the
    /// record's position.
    pub async fn recv_into<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        out: &mut Vec<u8>,
        deadline_ns: Option<u64>,
    ) -> Result<u64, RingError> {
        let idle_at = ctx.now_ns().saturating_add(IDLE_REPORT_NS);
        loop {
            if let Some(pos) = self.try_recv_into(ctx, out)? {
                self.report_head(ctx, false).await?;
                return Ok(pos);
            }
            if deadline_ns.is_some_and(|d| ctx.now_ns() >= d) {
                return Err(RingError::Deadline);
            }
            let unreported = self.head > self.reported;
            if unreported && ctx.now_ns() >= idle_at {
                self.report_head(ctx, true).await?;
                continue;
            }
            let until = match (deadline_ns, unreported) {
                (Some(d), true) => Some(d.min(idle_at)),
                (Some(d), false) => Some(d),
                (None, true) => Some(idle_at),
                (None, false) => None,
            };
            let w = ctx
                .wait_for_write(self.layout.ring_off, self.layout.capacity, until)?
                .await;
            if w == Woken::Deadline && deadline_ns.is_some_and(|d| ctx.now_ns() >= d) {
                return Err(RingError::Deadline);
            }
        }
    }
}

/// The sending end, on the sender's machine.
pub struct Sender {
    layout: RingLayout,
    /// Absolute position of the next record.
    tail: u64,
    /// Bytes promised to live reservations.
    reserved: u64,
    /// Names this sender's reservations.
    id: u64,
    /// The tail once the records staged in a batch have landed; while it
    /// is set nothing more is staged. An append that failed or was dropped
    /// mid-way leaves it set for good: some of its WRITEs may have landed
    /// and been taken, so the ring's state past `tail` is not known and
    /// this sender appends no more (poisoned) — until the same WRITEs,
    /// kept below, are posted again and land ([`Sender::restage`]).
    in_flight: Option<u64>,
    /// The WRITEs of the records in flight: position, the bytes of the
    /// ring the record takes (a PAD's whole rest of the lap) and the
    /// range of its bytes in `staged_bytes` (buffers reused, so the copy
    /// costs no allocation once warm).
    staged: Vec<Staged>,
    staged_bytes: Vec<u8>,
}

/// One record in flight ([`Sender::restage`], [`Sender::stage_voids`]).
#[derive(Clone, Debug)]
struct Staged {
    pos: u64,
    takes: u64,
    bytes: std::ops::Range<usize>,
}

/// Ring space set aside for later appends ([`Sender::reserve`]). Give what
/// it does not use back with [`Sender::release`]; a reservation dropped
/// instead keeps its room from other appends for the sender's life.
#[must_use = "release what a reservation does not use"]
#[derive(Debug, PartialEq, Eq)]
pub struct Reservation {
    left: u64,
    sender: u64,
}

impl Reservation {
    pub fn left(&self) -> u64 {
        self.left
    }
}

impl Sender {
    /// Opens the sending end from the tail persisted in this machine's
    /// memory and the head the receiver reported there.
    pub fn open<N: Nic>(ctx: &Ctx<N>, layout: RingLayout) -> Result<Sender, RingError> {
        layout.check()?;
        let l = ctx.local();
        let tail = l.load(layout.sender_tail_off)?;
        let head = l.load(layout.sender_head_off)?;
        if head > tail
            || tail - head > layout.capacity
            || !tail.is_multiple_of(ALIGN)
            || tail > POSITION_MAX
        {
            return Err(RingError::Corrupt(format!(
                "sender tail {tail} and reported head {head} are not a ring's"
            )));
        }
        static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Ok(Sender {
            layout,
            tail,
            reserved: 0,
            // Relaxed: a unique number, ordering nothing else.
            id: IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            in_flight: None,
            staged: Vec::new(),
            staged_bytes: Vec::new(),
        })
    }

    pub fn tail(&self) -> u64 {
        self.tail
    }

    /// Free bytes, after reservations, by the head the receiver reported.
    pub fn free<N: Nic>(&self, ctx: &Ctx<N>) -> Result<u64, RingError> {
        let head = ctx.local().load(self.layout.sender_head_off)?;
        let used = self
            .in_flight
            .unwrap_or(self.tail)
            .checked_sub(head)
            .filter(|&u| u <= self.layout.capacity);
        let used = used.ok_or_else(|| {
            RingError::Corrupt(format!("reported head {head} is beyond tail {}", self.tail))
        })?;
        Ok((self.layout.capacity - used).saturating_sub(self.reserved))
    }

    /// Bytes appending records of payload lengths `lens` at the tail
    /// takes, the PAD before any that would cross the ring's end included.
    fn need(&self, lens: impl IntoIterator<Item = u64>) -> Result<u64, RingError> {
        self.layout.bytes_at(self.tail, lens)
    }

    /// READs the head the receiver persists after every record and takes
    /// it as told ([`Sender::note_head`]): for a sender short of room that
    /// waited [`FETCH_HEAD_NS`] for a report. Whether the head it read was news.
    pub async fn fetch_head<N: Nic>(&self, ctx: &Ctx<N>) -> Result<bool, RingError> {
        let at = GlobalAddr::host(self.layout.receiver, self.layout.receiver_head_off);
        let head = ctx.read(at, 8).await?.u64_at(0);
        self.note_head(ctx, head)
    }

    /// Takes a head the receiver piggybacked on a message of its own (FaRM's
    /// lazy head return): stored in the word the receiver would otherwise
    /// WRITE, if it is news. A head beyond the tail, or misaligned, is a
    /// corrupt message, refused. Whether it was news.
    pub fn note_head<N: Nic>(&self, ctx: &Ctx<N>, head: u64) -> Result<bool, RingError> {
        let l = ctx.local();
        let mut known = l.load(self.layout.sender_head_off)?;
        if head <= known {
            return Ok(false);
        }
        if head > self.in_flight.unwrap_or(self.tail) || !head.is_multiple_of(ALIGN) {
            return Err(RingError::Corrupt(format!(
                "piggybacked head {head} is not a position up to tail {}",
                self.tail
            )));
        }
        // By CAS: the receiver's WRITE of a newer head may land between
        // the load and a plain store, which would take the word back to an
        // older head the receiver counts as told; the sender would then
        // wait for room the receiver never reports again.
        while head > known {
            let was = l.cas(self.layout.sender_head_off, known, head)?;
            if was == known {
                return Ok(true);
            }
            known = was;
        }
        // The receiver's own WRITE moved it as far or further meanwhile.
        Ok(false)
    }

    /// Appends `payload` if there is room now; [`RingError::Full`] if not.
    pub async fn try_append<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        payload: &[u8],
    ) -> Result<u64, RingError> {
        let need = self.need([payload.len() as u64])?;
        let free = self.free(ctx)?;
        if need > free {
            return Err(RingError::Full { need, free });
        }
        self.write(ctx, &[payload]).await
    }

    /// Appends `payload`, waiting for room (until `deadline_ns`, if given).
    /// Returns the record's position.
    pub async fn append<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        payload: &[u8],
        deadline_ns: Option<u64>,
    ) -> Result<u64, RingError> {
        self.append_many(ctx, &[payload], deadline_ns).await
    }

    /// Appends up to [`MAX_RECORDS_PER_DOORBELL`] records with one doorbell
    /// (each still its own WRITE), waiting for room for all of them (until
    /// `deadline_ns`, if given). Returns the first record's position.
    pub async fn append_many<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        payloads: &[&[u8]],
        deadline_ns: Option<u64>,
    ) -> Result<u64, RingError> {
        if payloads.is_empty() || payloads.len() > MAX_RECORDS_PER_DOORBELL {
            return Err(RingError::TooMany {
                records: payloads.len(),
                max: MAX_RECORDS_PER_DOORBELL,
            });
        }
        let need = self.need(payloads.iter().map(|p| p.len() as u64))?;
        let most = self.layout.capacity - self.reserved;
        if need > most {
            return Err(RingError::Full { need, free: most });
        }
        while self.free(ctx)? < need {
            if deadline_ns.is_some_and(|d| ctx.now_ns() >= d) {
                return Err(RingError::Deadline);
            }
            self.wait_for_head(ctx, deadline_ns).await?;
        }
        self.write(ctx, payloads).await
    }

    /// For a sender short of room: waits for the receiver to report its
    /// head (a WRITE of the sender's head word) up to [`FETCH_HEAD_NS`]
    /// or `deadline_ns`, whichever comes first; if no report came, READs
    /// the head the receiver persists ([`Sender::fetch_head`]; at the
    /// deadline too, a last try). A receiver reports only each quarter
    /// ring, and a backup's sends no reply to piggyback a head on, so a
    /// record that needs more than the receiver consumed since its last
    /// report would otherwise wait for good. A READ that failed (the
    /// receiver may be failing) leaves the wait to the deadline. Whether
    /// a READ moved the head.
    pub async fn wait_for_head<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        deadline_ns: Option<u64>,
    ) -> Result<bool, RingError> {
        let off = self.layout.sender_head_off;
        let before = ctx.local().load(off)?;
        let fetch_at = ctx.now_ns().saturating_add(FETCH_HEAD_NS);
        let until = deadline_ns.map_or(fetch_at, |d| d.min(fetch_at));
        loop {
            let w = ctx.wait_for_write(off, 8, Some(until))?.await;
            if ctx.local().load(off)? != before {
                return Ok(false); // reported
            }
            if w == Woken::Deadline {
                break;
            }
            // Woken with the word unchanged: a backend that cannot watch
            // writes (emu, mlx5) wakes the waiter every turn. Waiting on
            // keeps the READ at FETCH_HEAD_NS there too, where returning
            // had the caller start the wait afresh each turn and never
            // READ (without a deadline, never end).
        }
        match self.fetch_head(ctx).await {
            Err(RingError::Verb(_)) => Ok(false),
            r => r,
        }
    }

    /// Sets aside room for records of the given payload lengths, wherever
    /// the ring's end falls among them (one PAD's worth of slack).
    pub fn reserve<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        lens: &[u64],
    ) -> Result<Reservation, RingError> {
        let max = self.layout.max_payload();
        if let Some(&len) = lens.iter().find(|&&l| l > max) {
            return Err(RingError::TooLarge { len, max });
        }
        let sizes = lens.iter().map(|&l| record_bytes(l));
        let want = sizes.clone().sum::<u64>() + sizes.max().unwrap_or(0);
        let free = self.free(ctx)?;
        if want > free {
            return Err(RingError::ReservationTooLarge { want, free });
        }
        self.reserved += want;
        Ok(Reservation {
            left: want,
            sender: self.id,
        })
    }

    /// Appends `payload` in space `r` holds; never waits. A PAD the ring's
    /// end calls for comes from the reservation's slack, or else from free
    /// space.
    pub async fn append_reserved<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        r: &mut Reservation,
        payload: &[u8],
    ) -> Result<u64, RingError> {
        let mut b = ctx.batch();
        let pos = self.stage_reserved(ctx, &mut b, r, payload)?;
        b.submit().await?;
        self.landed(ctx)?;
        Ok(pos)
    }

    /// As [`Sender::append_reserved`], but the record's WRITEs go into the
    /// caller's batch `b`, beside other rings' records (one doorbell per
    /// destination for a whole commit phase). Call [`Sender::landed`] once
    /// `b` completed; until then this sender stages nothing more, and if
    /// the batch failed, never again (poisoned).
    pub fn stage_reserved<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        b: &mut Batch<'_, N>,
        r: &mut Reservation,
        payload: &[u8],
    ) -> Result<u64, RingError> {
        if r.sender != self.id {
            return Err(RingError::NotOurs);
        }
        if self.in_flight.is_some() {
            return Err(RingError::Poisoned);
        }
        let need = self.need([payload.len() as u64])?;
        let size = record_bytes(payload.len() as u64);
        if size > r.left {
            return Err(RingError::ReservationExhausted { need, left: r.left });
        }
        let pad = need - size;
        let (from_r, from_free) = if need <= r.left {
            (need, 0)
        } else {
            (size, pad)
        };
        if from_free > 0 && self.free(ctx)? < from_free {
            return Err(RingError::ReservationExhausted { need, left: r.left });
        }
        let pos = self.stage(ctx, b, &[payload])?;
        r.left -= from_r;
        self.reserved -= from_r;
        Ok(pos)
    }

    /// The staged records' batch completed: they are in the receiver's
    /// memory; the tail moves past them and is persisted.
    pub fn landed<N: Nic>(&mut self, ctx: &Ctx<N>) -> Result<(), RingError> {
        if let Some(t) = self.in_flight.take() {
            self.tail = t;
            ctx.local().store(self.layout.sender_tail_off, self.tail)?;
        }
        Ok(())
    }

    /// The records staged into a batch that was never posted (dropped
    /// before its submit): forgotten, the tail where it was.
    pub fn unstage(&mut self) {
        self.in_flight = None;
    }

    /// Posts the WRITEs of the records in flight again, into `b`, after a
    /// batch that failed (a link that failed for a while between live
    /// machines): the same bytes at the same positions. What had landed
    /// is written again unchanged; where the receiver had taken it
    /// already, it has passed that position and never reads there again
    /// in this lap, and in the next a record's checksum, which covers its
    /// position, tells it from the one it waits for. Call
    /// [`Sender::landed`] once `b` completed. Whether anything was in
    /// flight.
    pub fn restage<N: Nic>(&self, ctx: &Ctx<N>, b: &mut Batch<'_, N>) -> Result<bool, RingError> {
        if self.in_flight.is_none() {
            return Ok(false);
        }
        for st in &self.staged {
            let mut buf = ctx.alloc(st.bytes.len())?;
            buf.as_mut_slice()
                .copy_from_slice(&self.staged_bytes[st.bytes.clone()]);
            b.write(self.at(st.pos), buf);
        }
        Ok(true)
    }

    /// Where the receiver's head may stand while records are in flight:
    /// at one of them, or past them all. `None` when nothing is in flight.
    pub fn in_flight_positions(&self) -> Option<impl Iterator<Item = u64> + '_> {
        let end = self.in_flight?;
        Some(self.staged.iter().map(|st| st.pos).chain([end]))
    }

    /// Makes the records in flight void, for a receiver that will never
    /// take them and whose head stands at `head` for good (it took every
    /// record before and none from there: a configuration change ended
    /// the one they were of, and the receiver drained it). Stages into
    /// `b` a void header over each record in flight past `head` when
    /// `past`, or over the one at `head` otherwise (a PAD to the lap's end
    /// written again as it was). Post the first, and once it completed
    /// the second, then call [`Sender::landed`]: the receiver then skips
    /// from `head` over voids alone, never a record left there, and takes
    /// the sender's next record. Void headers go where the records' own
    /// headers went, so a receiver meets one wherever it stops. Returns
    /// how many WRITEs it staged; [`RingError::Corrupt`] when `head` is
    /// not where a record in flight starts or where they end.
    pub fn stage_voids<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        b: &mut Batch<'_, N>,
        head: u64,
        past: bool,
    ) -> Result<usize, RingError> {
        let ok = self
            .in_flight_positions()
            .is_some_and(|mut ps| ps.any(|p| p == head));
        if !ok {
            return Err(RingError::Corrupt(format!(
                "receiver head {head} is not where a record in flight starts, from tail {}",
                self.tail
            )));
        }
        let mut n = 0;
        for st in &self.staged {
            if (past && st.pos > head) || (!past && st.pos == head) {
                let mut buf = ctx.alloc(HEADER_BYTES as usize)?;
                encode(
                    st.pos,
                    &[],
                    Some(st.takes - HEADER_BYTES),
                    buf.as_mut_slice(),
                );
                b.write(self.at(st.pos), buf);
                n += 1;
            }
        }
        Ok(n)
    }

    /// The sender's ring, where it lies.
    pub fn layout(&self) -> &RingLayout {
        &self.layout
    }

    /// Where in the receiver's memory the record at position `pos` lies.
    fn at(&self, pos: u64) -> GlobalAddr {
        let l = &self.layout;
        GlobalAddr::host(l.receiver, l.ring_off + pos % l.capacity)
    }

    fn keep(&mut self, pos: u64, takes: u64, bytes: &[u8]) {
        let at = self.staged_bytes.len();
        self.staged_bytes.extend_from_slice(bytes);
        self.staged.push(Staged {
            pos,
            takes,
            bytes: at..at + bytes.len(),
        });
    }

    /// Whether an earlier append failed mid-way (this sender appends no
    /// more).
    pub fn is_poisoned(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Gives back what `r` did not use.
    pub fn release(&mut self, r: Reservation) -> Result<(), RingError> {
        if r.sender != self.id {
            return Err(RingError::NotOurs);
        }
        self.reserved -= r.left;
        Ok(())
    }

    /// Writes the records (each preceded by a PAD where it would not fit
    /// before the ring's end) with one doorbell, then persists the tail.
    /// Returns the first record's position.
    async fn write<N: Nic>(&mut self, ctx: &Ctx<N>, payloads: &[&[u8]]) -> Result<u64, RingError> {
        let mut b = ctx.batch();
        let first = self.stage(ctx, &mut b, payloads)?;
        b.submit().await?;
        self.landed(ctx)?;
        Ok(first)
    }

    /// Puts the records' WRITEs into `b` and marks them in flight: the
    /// sender is poisoned until [`Sender::landed`] (a failure, or the
    /// caller's future dropped at the await, leaves it so).
    fn stage<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        b: &mut Batch<'_, N>,
        payloads: &[&[u8]],
    ) -> Result<u64, RingError> {
        if self.in_flight.is_some() {
            return Err(RingError::Poisoned);
        }
        let cap = self.layout.capacity;
        let mut pos = self.tail;
        let mut first = None;
        self.staged.clear();
        self.staged_bytes.clear();
        for payload in payloads {
            let size = record_bytes(payload.len() as u64);
            let room = cap - pos % cap;
            if size > room {
                let mut pad = ctx.alloc(HEADER_BYTES as usize)?;
                encode(pos, &[], Some(room - HEADER_BYTES), pad.as_mut_slice());
                self.keep(pos, room, pad.as_slice());
                b.write(self.at(pos), pad);
                pos += room;
            }
            let mut rec = ctx.alloc(size as usize)?;
            encode(pos, payload, None, rec.as_mut_slice());
            self.keep(pos, size, rec.as_slice());
            b.write(self.at(pos), rec);
            first.get_or_insert(pos);
            pos += size;
        }
        self.in_flight = Some(pos);
        Ok(first.unwrap_or(pos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_encode_with_a_checksum_over_everything() {
        let mut out = vec![0u8; record_bytes(5) as usize];
        encode(32, b"hello", None, &mut out);
        assert_eq!(out.len(), 32);
        assert_eq!(u64::from_le_bytes(out[..8].try_into().unwrap()), 32);
        let word = u64::from_le_bytes(out[8..16].try_into().unwrap());
        assert_eq!(word & LEN_MASK, 5);
        assert_eq!((word >> 32) as u32, crc(32, 5, b"hello"));
        assert_ne!(
            crc(32, 5, b"hello"),
            crc(48, 5, b"hello"),
            "position is covered"
        );
        assert_ne!(
            crc(32, 5, b"hello"),
            crc(32, 5, b"hellp"),
            "payload is covered"
        );
        assert_eq!(&out[16..21], b"hello");
        assert!(out[21..].iter().all(|&b| b == 0));
        // Zeroed memory never reads as a record at position 0.
        assert_ne!(crc(0, 0, &[]), 0);
        assert_eq!(record_bytes(0), 16);
        assert_eq!(record_bytes(16), 32);
        assert_eq!(record_bytes(17), 48);
    }

    #[test]
    fn bad_layouts_are_refused() {
        let good = RingLayout {
            receiver: 0,
            ring_off: 4096,
            capacity: 1024,
            receiver_head_off: 0,
            sender: 1,
            sender_head_off: 0,
            sender_tail_off: 8,
        };
        good.check().unwrap();
        assert_eq!(good.max_payload(), 496);
        for bad in [
            RingLayout {
                capacity: 1000,
                ..good
            },
            RingLayout {
                capacity: 16,
                ..good
            },
            RingLayout {
                ring_off: 4100,
                ..good
            },
            RingLayout {
                receiver_head_off: 4096 + 64,
                ..good
            },
            RingLayout {
                sender_tail_off: 3,
                ..good
            },
        ] {
            assert!(matches!(bad.check(), Err(RingError::Layout(_))), "{bad:?}");
        }
    }
}
