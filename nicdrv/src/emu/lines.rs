//! Line-atomic READ and WRITE: a seqlock sequence word per aligned 64-byte
//! line of an emu memory node, and a writers' lock word per aligned 1 KiB
//! block, kept in the node file beside the memory they guard (layout in
//! node.rs), so threads and processes share them.
//!
//! Promise (the NIC contract: a transfer "lands in 64-byte cacheline units in no
//! guaranteed order"): for every line a READ covers it returns the line as
//! some order of the WRITEs to that line left it; the bytes one WRITE puts
//! in a line are never interleaved with another WRITE's bytes in that line.
//! Lines are independent: a transfer over several lines is not atomic as a
//! whole, so a READ racing a WRITE still sees any mix of old and new lines.
//! Sherman's per-line versions and FaRM's per-cacheline versions rely on
//! exactly this.
//!
//! Outside the seqlock, on purpose:
//! - NIC atomics (CAS, FAA, masked CAS) are single `AtomicU64` RMWs (shm.rs):
//!   atomic with respect to each other, as on a NIC. A READ of their line
//!   sees the word before or after the atomic; both are states the line
//!   passes through, so either is a valid line.
//! - An aligned 8-byte READ or WRITE is one atomic load or store, hence
//!   already a whole-line event for the line it sits in; it skips the words.
//! - The owner's CPU view (`EmuNode::host()`) is word-atomic only: a memory
//!   node's own CPU is not its NIC.
//!
//! What skipping the words gives up: real-time order against a line WRITE
//! in progress. A WRITE's stores into a line take time; an atomic or
//! 8-byte WRITE that lands between them, and one that lands on another
//! word of the line after it, can both be ordered around that WRITE so
//! that the first seems to follow it and the second to precede it, though
//! the first had completed before the second was posted. Each line still
//! ends as some order of its WRITEs left it (the promise above), and no
//! word is torn. A protocol that needs the real-time order must not mix
//! the two on one line while both are in flight (a NIC landing each line
//! as one event would keep it; this emulation does not promise it).
//!
//! Words. A line's sequence (`u32`) is even while the line is stable and odd
//! while a WRITE is storing into it. Only the holder of the line's block
//! lock changes it, so it needs no read-modify-write. A block's lock word
//! (`u64`): low 32 bits a generation, odd while held; high 32 bits the
//! holder's pid while held, 0 when free — so a waiter can tell a dead holder
//! from a slow one (below). Writers exclude each other per 1 KiB block, not
//! per line: a 1 KiB WRITE costs one lock CAS and one unlock CAS instead of
//! 32 (with a CAS pair per line, `loch-bench verbs --verb write --size 1k
//! --depth 16 --batch 8` fell from 2.9–4.6 to 1.3–1.8 Mops/s), and writers
//! of different lines of one block, rare and brief, take turns. The tables
//! take 4.5 bytes per 64 (7 %).
//!
//! Protocol (Boehm, "Can seqlocks get along with programming language memory
//! models?", MSPC 2012; crossbeam-utils' `AtomicCell` seqlock):
//!
//! ```text
//! writer: CAS block even→odd (Acquire)
//!         per line: seq = s|1 (Relaxed); fence(Release); stores; seq = (s|1)+1 (Release)
//!         CAS block odd→odd+1 (Release)
//! reader: s1 = seq (Acquire), wait while odd; loads; fence(Acquire);
//!         s2 = seq (Relaxed); accept iff s1 == s2
//! ```
//!
//! The data accesses are atomics (shm.rs; a READ's whole-line copy is an
//! asm block that does only what relaxed atomic loads may), so a reader
//! racing a writer is not undefined behaviour: it may copy an inconsistent
//! line, which the recheck rejects. Why an accepted copy is consistent: if
//! any load of the copy read a store of a writer W, W's release fence
//! (after its odd store) synchronizes with the reader's acquire fence
//! (before `s2`), so W's odd store happens-before `s2`, which then reads it
//! or later, never `s1` — unless W had finished the line before `s1`. And
//! `s1` (Acquire) reads the last even store, whose Release carries that
//! writer's stores and, through the block lock's Acquire/Release chain,
//! every earlier writer's: the copy is the latest whole line.
//!
//! Slow reads. A reader that sees a line odd for [`SPINS`] spins, or fails
//! its recheck [`OPTIMISTIC_TRIES`] times (a stream of writers), reads
//! under the block lock instead, so it neither spins forever nor starves.
//! Holding the lock it knows no one is storing into the line, so an odd
//! sequence there was left by a dead writer: it makes it even.
//!
//! Dead holders. A process killed while holding a block leaves its lock word
//! odd (and perhaps a line odd). Waiters spin, then yield, and once the same
//! odd lock word has stood for [`DEAD_HOLDER_NS`] with its holder's pid gone
//! (or for [`STUCK_HOLDER_NS`] whatever the pid says: it may have been
//! recycled) they release the block on the holder's behalf by CAS from
//! exactly that word to the next even generation. (Processes sharing a node
//! share a pid namespace, as the owner watchdog already assumes; a holder
//! in another one would look dead after 2 ms.) One CAS from a given value
//! can succeed, so one waiter takes over; the rest see the new word and,
//! with the taker, compete for the block through the ordinary lock, so
//! takeover never lets two waiters write at once. The next holder to touch
//! a line the dead writer left odd makes it even. The line keeps the bytes
//! the dead writer managed to store: a crash mid-line is the one way a line
//! can stay torn. A holder that was alive after all (stalled past the
//! bound) finds its unlock CAS failing, warns, and writes its part of the
//! block again under a fresh lock, so its WRITE still ends whole; readers
//! may have seen its lines torn meanwhile. Each case warns once per
//! process.
//!
//! Sequences and generations wrap after 2^31 writes; a reader is fooled only
//! if its copy of one line spans exactly a multiple of that.

use super::shm::SharedMem;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Once;

/// Bytes per line: the unit a NIC's PCIe writes land in.
pub const LINE_BYTES: u64 = 64;
/// Lines per writers' lock block (1 KiB: a Sherman node).
pub const BLOCK_LINES: u64 = 16;
/// Bytes per writers' lock block.
pub const BLOCK_BYTES: u64 = LINE_BYTES * BLOCK_LINES;
/// How long a waiter stands an unchanged held lock word whose holder's pid
/// no longer exists before taking the block over.
pub const DEAD_HOLDER_NS: u64 = 2_000_000;
/// How long a waiter stands an unchanged held lock word whatever its pid
/// says. Long, because a live holder descheduled on a loaded machine must
/// not be taken over (that costs transiently torn lines).
pub const STUCK_HOLDER_NS: u64 = 1_000_000_000;
/// Busy spins before a waiter yields the CPU, and before a reader facing
/// an odd line turns to the block lock.
pub const SPINS: u32 = 1 << 10;

/// Most lines a READ takes through the all-lines-at-once path
/// (`LineMem::read_lines_into`); longer ones go a line at a time.
pub const FAST_LINES: u64 = 32;
/// Failed optimistic copies of one line before a reader takes the block
/// lock, so a stream of writers cannot starve it.
pub const OPTIMISTIC_TRIES: u32 = 64;

static TOOK_OVER: Once = Once::new();
static WAS_TAKEN_OVER: Once = Once::new();

/// Bytes of (block lock words, line sequence words) that guard `bytes` of
/// memory; their sum is a multiple of 8.
pub fn table_bytes(bytes: u64) -> (u64, u64) {
    let blocks = bytes.div_ceil(BLOCK_BYTES) * 8;
    let lines = (bytes.div_ceil(LINE_BYTES) * 4).next_multiple_of(8);
    (blocks, lines)
}

fn is_held(word: u64) -> bool {
    word & 1 == 1
}

fn holder(word: u64) -> u32 {
    (word >> 32) as u32
}

/// The lock word that holds the free block `free` for `pid`.
fn held_by(free: u64, pid: u32) -> u64 {
    ((pid as u64) << 32) | (free as u32).wrapping_add(1) as u64
}

/// The free lock word that follows the held word `held`.
fn released(held: u64) -> u64 {
    (held as u32).wrapping_add(1) as u64
}

/// Whether `pid` names a live process (or one we may not signal, which is
/// alive too). Values that are no pid — 0 or beyond `i32::MAX`, which
/// `kill` would read as process groups — count as gone.
fn pid_alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists; no signal is sent.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// A waiter's patience with one held lock word.
struct Wait {
    seen: u64,
    tries: u32,
    since_ns: u64,
}

impl Wait {
    fn new() -> Wait {
        // 0 is even, so never equal to a held word: the first pause resets.
        Wait {
            seen: 0,
            tries: 0,
            since_ns: 0,
        }
    }

    /// Waits a little while `word` reads `held` (odd); takes the block over
    /// once its holder is judged gone. The caller reloads the word.
    #[cold]
    #[inline(never)]
    fn pause(&mut self, word: &AtomicU64, held: u64, at: u64) {
        if held != self.seen {
            // A different holder (or generation): the block makes progress.
            self.seen = held;
            self.tries = 0;
        }
        self.tries = self.tries.saturating_add(1);
        if self.tries < SPINS {
            std::hint::spin_loop();
            return;
        }
        // The holder may be descheduled on our core: give it the CPU.
        std::thread::yield_now();
        let now = crate::clock::now_ns();
        if self.tries == SPINS {
            self.since_ns = now;
            return;
        }
        let waited = now.saturating_sub(self.since_ns);
        let pid = holder(held);
        let gone = waited >= STUCK_HOLDER_NS || (waited >= DEAD_HOLDER_NS && !pid_alive(pid));
        if !gone {
            return;
        }
        // Relaxed: the takeover publishes nothing and learns nothing — the
        // dead holder never released its stores, and the bytes are whatever
        // they are (every access is atomic). As an RMW it extends the
        // release sequence of the last unlock, so the next locker's Acquire
        // CAS still synchronizes with that unlock.
        if word
            .compare_exchange(held, released(held), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            TOOK_OVER.call_once(|| {
                log::warn!(
                    "emu: took over the 1 KiB block at offset {:#x}, whose WRITE lock pid {pid} \
                     held for {} ms ({}); its lines keep whatever that holder had written \
                     (warned once per process)",
                    at / BLOCK_BYTES * BLOCK_BYTES,
                    waited / 1_000_000,
                    if pid_alive(pid) {
                        "still running, or a recycled pid"
                    } else {
                        "gone"
                    }
                )
            });
        }
        self.seen = 0;
    }
}

/// One memory window (host or device memory) with its lock and sequence
/// words. Not `Clone`, for the reason [`SharedMem`] is not.
#[derive(Debug)]
pub struct LineMem {
    data: SharedMem,
    blocks: SharedMem,
    lines: SharedMem,
    me: u32,
}

impl LineMem {
    /// `blocks` and `lines` hold the words [`table_bytes`] sizes for `data`;
    /// `me` is this process's pid, written into lock words it holds. The
    /// three windows must not overlap (the node layout keeps them apart):
    /// sequence words are 4-byte atomics, and atomics of different sizes on
    /// the same bytes are undefined behaviour. Hence crate-private.
    pub(crate) fn new(data: SharedMem, blocks: SharedMem, lines: SharedMem, me: u32) -> LineMem {
        let (b, l) = table_bytes(data.len() as u64);
        assert!(
            blocks.len() as u64 >= b && lines.len() as u64 >= l,
            "lock and sequence tables too small for their window"
        );
        LineMem {
            data,
            blocks,
            lines,
            me,
        }
    }

    /// A second handle onto the same window and words.
    ///
    /// # Safety
    /// As for [`SharedMem::alias`]: not used once the memory is unmapped.
    pub(crate) unsafe fn alias(&self) -> LineMem {
        // SAFETY: the caller's contract is the aliases' one.
        unsafe {
            LineMem {
                data: self.data.alias(),
                blocks: self.blocks.alias(),
                lines: self.lines.alias(),
                me: self.me,
            }
        }
    }

    /// The window the words guard (its atomics bypass them).
    pub fn data(&self) -> &SharedMem {
        &self.data
    }

    fn block_word(&self, block: u64) -> &AtomicU64 {
        self.blocks.word_at(block * 8)
    }

    fn seq(&self, line: u64) -> &AtomicU32 {
        self.lines.word32_at(line * 4)
    }

    /// Takes the block whose lock word is `word` for writing; returns the
    /// held word.
    fn lock(&self, word: &AtomicU64, at: u64) -> u64 {
        let mut wait = Wait::new();
        // Relaxed: a guess the CAS below checks.
        let mut cur = word.load(Ordering::Relaxed);
        loop {
            if !is_held(cur) {
                let held = held_by(cur, self.me);
                // Acquire on success: reads the previous holder's Release
                // unlock, so its stores (data and sequences) happen-before
                // ours: each byte's modification order follows lock order
                // (last holder wins) and our Relaxed sequence loads see the
                // latest sequence. Relaxed on failure: we only retry.
                match word.compare_exchange(cur, held, Ordering::Acquire, Ordering::Relaxed) {
                    Ok(_) => return held,
                    Err(now) => {
                        cur = now;
                        continue;
                    }
                }
            }
            wait.pause(word, cur, at);
            cur = word.load(Ordering::Relaxed);
        }
    }

    /// Frees a held block; false when a waiter took it over meanwhile (we
    /// were presumed dead), in which case the word is left alone.
    fn unlock(&self, word: &AtomicU64, held: u64) -> bool {
        // Release: our stores happen-before the next holder's Acquire lock.
        // A CAS rather than a store, so a holder taken over cannot free a
        // block someone else now holds.
        let ok = word
            .compare_exchange(held, released(held), Ordering::Release, Ordering::Relaxed)
            .is_ok();
        if !ok {
            WAS_TAKEN_OVER.call_once(|| {
                log::warn!(
                    "emu: this process held a 1 KiB block's WRITE lock past the takeover bound \
                     and lost it; the write is redone, but readers may have seen its lines torn \
                     (warned once per process)"
                )
            });
        }
        ok
    }

    /// Copies `n` bytes at `at`, inside one line, to `d`.
    ///
    /// # Safety
    /// As for `read_into`, for `d..d+n`.
    #[inline]
    unsafe fn copy_out(&self, at: u64, d: *mut u8, n: usize) {
        // SAFETY: the caller upholds this function's `# Safety` contract, which is
        // what every unsafe operation below relies on (each argued in place).
        unsafe {
            if n == LINE_BYTES as usize {
                self.data.read_line_into(at, d);
            } else {
                self.data.read_into(at, d, n);
            }
        }
    }

    /// Copies `len` bytes at `off` into `dst`, each line whole.
    ///
    /// # Safety
    /// `dst..dst+len` must be valid for writes and not aliased by any live
    /// reference. The source range must be in bounds (asserted).
    pub unsafe fn read_into(&self, off: u64, dst: *mut u8, len: usize) {
        // SAFETY: the caller upholds this function's `# Safety` contract, which is
        // what every unsafe operation below relies on (each argued in place).
        unsafe {
            assert!(self.data.in_bounds(off, len as u64));
            if len == 8 && off.is_multiple_of(8) {
                // One atomic load: a whole-line event already (module doc).
                (dst as *mut u64).write_unaligned(self.data.load_u64(off));
                return;
            }
            let end = off + len as u64;
            if len > LINE_BYTES as usize {
                if off.is_multiple_of(LINE_BYTES)
                    && (len as u64).is_multiple_of(LINE_BYTES)
                    && len as u64 <= FAST_LINES * LINE_BYTES
                {
                    self.prefetch(off, end);
                    self.read_lines_into(off / LINE_BYTES, dst, len / LINE_BYTES as usize);
                    return;
                }
                // Its first 2 KiB at most (`prefetch`): 32 lines, 33 when
                // `off` is not line-aligned.
                self.prefetch(off, end.min(off + FAST_LINES * LINE_BYTES));
            }
            let mut at = off;
            while at < end {
                let line = at / LINE_BYTES;
                let stop = ((line + 1) * LINE_BYTES).min(end);
                // SAFETY: at - off < len, so the line's bytes stay in dst..dst+len.
                let d = dst.add((at - off) as usize);
                self.read_line(line, at, d, (stop - at) as usize);
                at = stop;
            }
        }
    }

    /// READ of `n` whole lines from line `first` on (at most
    /// [`FAST_LINES`], in bounds: the caller checked): the seqlock of every
    /// line at once rather than one line after another. All the sequence
    /// words are loaded (Acquire), then all the lines copied, then one
    /// Acquire fence and every sequence word loaded again: each line's
    /// copy is still bracketed by its own first load before it and the
    /// fence and reload after it, which is all the seqlock argument (module
    /// doc) asks, whatever lies between. A line odd at first, or changed
    /// at the reload, is read again alone by the careful path. The loads
    /// of different lines no longer wait on each other's checks: a 1 KiB
    /// READ took about 1,500 instructions one line at a time.
    ///
    /// A READ of 16 lines (1 KiB: every Sherman node) has its own copy of
    /// the body, with its loops unrolled: their counting and bounds were
    /// a fifth of the READ's instructions (callgrind, Sherman lookups on
    /// emu: 2,166 → 2,142 M instructions over the same run, 81 a READ).
    ///
    /// # Safety
    /// As for `read_into`, with `dst..dst + n * 64`.
    unsafe fn read_lines_into(&self, first: u64, dst: *mut u8, n: usize) {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match n {
                16 => self.read_lines_body(first, dst, 16),
                n => self.read_lines_body(first, dst, n),
            }
        }
    }

    /// # Safety
    /// As for `read_lines_into`.
    #[inline(always)]
    unsafe fn read_lines_body(&self, first: u64, dst: *mut u8, n: usize) {
        debug_assert!(n as u64 <= FAST_LINES);
        let seq_end = (first + n as u64) * 4;
        assert!(
            seq_end <= self.lines.len() as u64,
            "sequence table too small for its window"
        );
        // SAFETY: lines first..first+n have their 4-byte words at
        // 4*line in `lines` (checked just above), 4-byte aligned (the
        // table's base is), valid for the mapping's lifetime and only
        // accessed atomically.
        let seqs = unsafe {
            std::slice::from_raw_parts(
                (self.lines.base() as *const AtomicU32).add(first as usize),
                n,
            )
        };
        let data_end = (first + n as u64) * LINE_BYTES;
        assert!(
            data_end <= self.data.len() as u64,
            "lines out of bounds of their window"
        );
        let mut s1 = [0u32; FAST_LINES as usize];
        for (s, q) in s1.iter_mut().zip(seqs) {
            // Acquire: as in `read_line`, the copy below sees at least the
            // stores of the writer that left this value.
            *s = q.load(Ordering::Acquire);
        }
        // Every line is copied, even one a writer was in (odd): its copy
        // is of atomic loads, so only possibly torn, and the check below
        // sends it to the careful path like a changed one. A test here
        // cost two instructions a line for a case that almost never comes.
        for k in 0..n {
            // SAFETY: line k of the READ lies in `data` (asserted above),
            // aligned; the destination holds n lines.
            unsafe {
                self.data.read_line_unchecked(
                    (first + k as u64) * LINE_BYTES,
                    dst.add(k * LINE_BYTES as usize),
                )
            };
        }
        // As in `read_line`: a writer whose store any copy above read has
        // its odd sequence store made visible to the reloads below.
        fence(Ordering::Acquire);
        // Relaxed: ordered after the copies by the fence above. One pass
        // without branches says whether any line needs the careful path;
        // almost always none does.
        let mut bad = 0u32;
        for (s, q) in s1[..n].iter().zip(seqs) {
            bad |= (s & 1) | (q.load(Ordering::Relaxed) ^ s);
        }
        if bad == 0 {
            return;
        }
        for k in 0..n {
            // Relaxed: as above; a line that passed stays accepted (its
            // reload here is later, and only a changed one is read again).
            if s1[k] & 1 == 1 || seqs[k].load(Ordering::Relaxed) != s1[k] {
                let line = first + k as u64;
                // SAFETY: line k of the READ, within dst's n lines.
                unsafe {
                    self.read_line(
                        line,
                        line * LINE_BYTES,
                        dst.add(k * LINE_BYTES as usize),
                        LINE_BYTES as usize,
                    )
                };
            }
        }
    }

    /// Asks the CPU for every line of `off..end` and their sequence words
    /// at once. The copy below walks the lines one by one, and each line's
    /// sequence check waits for its loads: without this, a 1 KiB READ of
    /// memory not in cache paid sixteen misses one after another (on a
    /// Sherman lookup, 85% of the READ's time was those two loads). A
    /// real NIC's DMA overlaps them too.
    ///
    /// Non-temporal (NTA): the lines come to L1 for the copy without
    /// displacing the reader's working set from L2, as a NIC's DMA leaves
    /// the client's caches alone. A READ's source is rarely read again by
    /// the same core soon (Sherman's leaves, 5.5 MiB at 200,000 records,
    /// pass through a 1 MiB L2), while the index cache's lines are hit by
    /// every lookup. Alternated 12 times against T0 on the issue's
    /// command: Sherman's median 3.02 → 3.29 Mops/s, the bare 1 KiB READ
    /// over 5.5 MiB 5.54 → 6.13.
    ///
    /// A READ asks for its first 2 KiB ([`FAST_LINES`] lines) at most (its
    /// caller bounds `end`; a `min` here cost the fast path, whose READs
    /// are never longer, 50 instructions a READ): a larger READ's later
    /// lines would arrive long before their copy, and as an NTA prefetch
    /// brings a line only to L1, they could be evicted unused and fetched
    /// twice. The copy walks the rest in order, which the CPU's stream
    /// prefetchers follow.
    #[inline]
    fn prefetch(&self, off: u64, end: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_NTA};
            let (first, last) = (off / LINE_BYTES, (end - 1) / LINE_BYTES);
            // An exclusive range: `..=` costs a second test per line.
            for line in first..last + 1 {
                // SAFETY: a prefetch is a hint: it never faults, whatever
                // the address, and changes no memory. The line lies in
                // `data` (the caller checked the range is in bounds).
                unsafe {
                    _mm_prefetch::<_MM_HINT_NTA>(
                        self.data.base().add((line * LINE_BYTES) as usize) as *const i8
                    )
                };
            }
            // The sequence words are 4 bytes a line: 16 to a cache line.
            let mut w = (first * 4) & !63;
            while w <= last * 4 {
                // SAFETY: as above; the words lie in `lines`.
                unsafe {
                    _mm_prefetch::<_MM_HINT_NTA>(self.lines.base().add(w as usize) as *const i8)
                };
                w += 64;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (off, end);
    }

    /// # Safety
    /// As for `read_into`, for `d..d+n`, which lies in one line.
    #[inline]
    unsafe fn read_line(&self, line: u64, at: u64, d: *mut u8, n: usize) {
        // SAFETY: the caller upholds this function's `# Safety` contract, which is
        // what every unsafe operation below relies on (each argued in place).
        unsafe {
            let seq = self.seq(line);
            let (mut spins, mut tries) = (0, 0);
            while spins < SPINS && tries < OPTIMISTIC_TRIES {
                // Acquire: synchronizes with the last writer's Release even
                // store, so the copy sees at least that writer's stores.
                let s1 = seq.load(Ordering::Acquire);
                if s1 & 1 == 1 {
                    spins += 1;
                    std::hint::spin_loop();
                    continue;
                }
                self.copy_out(at, d, n);
                // Acquire fence: if the copy read any store of a writer that
                // marked the line odd after s1, that writer's release fence
                // synchronizes with this one, so its odd store is visible to the
                // reload below.
                fence(Ordering::Acquire);
                // Relaxed: ordered after the copy by the fence above.
                if seq.load(Ordering::Relaxed) == s1 {
                    return;
                }
                tries += 1;
            }
            self.read_line_locked(line, at, d, n);
        }
    }

    /// The slow READ of one line: under its block's lock (module doc).
    ///
    /// # Safety
    /// As for `read_line`.
    #[cold]
    #[inline(never)]
    unsafe fn read_line_locked(&self, line: u64, at: u64, d: *mut u8, n: usize) {
        // SAFETY: the caller upholds this function's `# Safety` contract, which is
        // what every unsafe operation below relies on (each argued in place).
        unsafe {
            let word = self.block_word(line / BLOCK_LINES);
            let seq = self.seq(line);
            loop {
                let held = self.lock(word, at);
                // Relaxed: we hold the block, and its Acquire lock ordered us
                // after every earlier sequence store.
                let s = seq.load(Ordering::Relaxed);
                if s & 1 == 1 {
                    // Odd under the lock: a writer died inside this line. Even
                    // it (Release, like a writer's), so readers stop waiting.
                    seq.store(s.wrapping_add(1), Ordering::Release);
                }
                self.copy_out(at, d, n);
                // The copy's loads are relaxed (shm.rs): this fence gives
                // them Acquire, as the optimistic paths' fence does, for
                // what they read of stores that bypass the seqlock (NIC
                // atomics, aligned 8-byte WRITEs), which the lock's
                // Acquire does not order.
                fence(Ordering::Acquire);
                if self.unlock(word, held) {
                    return;
                }
            }
        }
    }

    /// Copies `len` bytes from `src` to `off`, each line whole.
    ///
    /// # Safety
    /// `src..src+len` must be valid for reads and not mutably aliased. The
    /// destination range must be in bounds (asserted).
    pub unsafe fn write_from(&self, off: u64, src: *const u8, len: usize) {
        // SAFETY: the caller upholds this function's `# Safety` contract, which is
        // what every unsafe operation below relies on (each argued in place).
        unsafe {
            assert!(self.data.in_bounds(off, len as u64));
            if len == 8 && off.is_multiple_of(8) {
                // One atomic store: a whole-line event already (module doc).
                self.data
                    .store_u64(off, (src as *const u64).read_unaligned());
                return;
            }
            let end = off + len as u64;
            let mut at = off;
            while at < end {
                let block = at / BLOCK_BYTES;
                let stop = ((block + 1) * BLOCK_BYTES).min(end);
                let word = self.block_word(block);
                // SAFETY: at - off < len, so the block's bytes stay in src..src+len.
                let s = src.add((at - off) as usize);
                loop {
                    let held = self.lock(word, at);
                    self.write_lines(at, stop, s);
                    if self.unlock(word, held) {
                        break;
                    }
                    // Taken over while we held the block: write it again.
                }
                at = stop;
            }
        }
    }

    /// Stores `src` into `from..to`, inside one block we hold, line by line.
    ///
    /// # Safety
    /// `src..src+(to-from)` must be valid for reads; the range in bounds.
    #[inline]
    unsafe fn write_lines(&self, from: u64, to: u64, src: *const u8) {
        // SAFETY: the caller upholds this function's `# Safety` contract, which is
        // what every unsafe operation below relies on (each argued in place).
        unsafe {
            let mut at = from;
            while at < to {
                let line = at / LINE_BYTES;
                let stop = ((line + 1) * LINE_BYTES).min(to);
                let n = (stop - at) as usize;
                let seq = self.seq(line);
                // Relaxed load and odd store: only the block's holder changes a
                // sequence, and our Acquire lock ordered us after the last one.
                // An odd value here was left by a writer that died in the line:
                // keep it odd and finish the line in its place.
                let odd = seq.load(Ordering::Relaxed) | 1;
                seq.store(odd, Ordering::Relaxed);
                // Release fence: orders the odd store before every data store
                // below, for a reader whose copy reads one of them (its acquire
                // fence then sees the odd sequence; module doc).
                fence(Ordering::Release);
                // SAFETY: at - from < to - from, so s..s+n lies in the source.
                let s = src.add((at - from) as usize);
                if n == LINE_BYTES as usize {
                    self.data.write_line_from(at, s);
                } else {
                    self.data.write_from(at, s, n);
                }
                // Release: a reader whose Acquire load sees the even sequence
                // sees the line's new bytes.
                seq.store(odd.wrapping_add(1), Ordering::Release);
                at = stop;
            }
        }
    }

    /// Safe read into a slice.
    pub fn read(&self, off: u64, dst: &mut [u8]) {
        // SAFETY: a `&mut [u8]` is valid for writes and unaliased.
        unsafe { self.read_into(off, dst.as_mut_ptr(), dst.len()) }
    }

    /// Safe write from a slice.
    pub fn write(&self, off: u64, src: &[u8]) {
        // SAFETY: a `&[u8]` is valid for reads and not mutably aliased.
        unsafe { self.write_from(off, src.as_ptr(), src.len()) }
    }

    /// The sequence word of the line holding byte `off` (tests and tools).
    pub fn line_seq(&self, off: u64) -> u32 {
        self.seq(off / LINE_BYTES).load(Ordering::Relaxed)
    }

    /// The lock word of the block holding byte `off` (tests and tools).
    pub fn block_lock(&self, off: u64) -> u64 {
        self.block_word(off / BLOCK_BYTES).load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::{Duration, Instant};

    /// Heap-backed lines for unit tests.
    struct Rig {
        _data: Vec<u64>,
        _blocks: Vec<u64>,
        _lines: Vec<u64>,
        mem: LineMem,
    }

    fn rig(bytes: usize) -> Rig {
        let (b, l) = table_bytes(bytes as u64);
        let mut data = vec![0u64; bytes / 8];
        let mut blocks = vec![0u64; b as usize / 8];
        let mut lines = vec![0u64; l as usize / 8];
        // SAFETY: the vectors live in the Rig beside `mem` and are only
        // touched through it.
        let mem = unsafe {
            LineMem::new(
                SharedMem::new(data.as_mut_ptr() as *mut u8, bytes),
                SharedMem::new(blocks.as_mut_ptr() as *mut u8, b as usize),
                SharedMem::new(lines.as_mut_ptr() as *mut u8, l as usize),
                std::process::id(),
            )
        };
        Rig {
            _data: data,
            _blocks: blocks,
            _lines: lines,
            mem,
        }
    }

    fn set_block_lock(r: &Rig, off: u64, v: u64) {
        r.mem
            .block_word(off / BLOCK_BYTES)
            .store(v, Ordering::Relaxed);
    }

    fn set_line_seq(r: &Rig, off: u64, v: u32) {
        r.mem.seq(off / LINE_BYTES).store(v, Ordering::Relaxed);
    }

    #[test]
    fn tables_cover_partial_lines_and_blocks() {
        assert_eq!(table_bytes(8), (8, 8));
        assert_eq!(table_bytes(1024), (8, 64));
        assert_eq!(table_bytes(1032), (16, 72));
        assert_eq!(table_bytes(4 << 20), (32 << 10, 256 << 10));
    }

    #[test]
    fn partial_and_unaligned_copies_round_trip_and_leave_words_free() {
        let r = rig(2048);
        let src: Vec<u8> = (0..1100).map(|i| (i % 251) as u8 + 1).collect();
        r.mem.write(5, &src);
        let mut dst = vec![0u8; 1100];
        r.mem.read(5, &mut dst);
        assert_eq!(src, dst);
        let mut head = [9u8; 5];
        r.mem.read(0, &mut head);
        assert_eq!(head, [0; 5], "bytes before the range untouched");
        // Bytes 5..1105 span lines 0..=17 and blocks 0 and 1: each line
        // written once (odd, then even), each block locked once.
        for line in 0..=17 {
            assert_eq!(r.mem.line_seq(line * 64), 2, "line {line}");
        }
        assert_eq!(r.mem.line_seq(18 * 64), 0);
        assert_eq!(r.mem.block_lock(0), 2);
        assert_eq!(r.mem.block_lock(1024), 2);
        // 8-byte aligned accesses leave the words alone.
        r.mem.write(1536, &7u64.to_le_bytes());
        assert_eq!(r.mem.line_seq(1536), 0);
        assert_eq!(r.mem.block_lock(1536), 2);
    }

    /// Two writers (whole lines, and the first 40 bytes of each line) and a
    /// reader on other threads: every line read is one a sequence of whole
    /// writes leaves — [a x64] or [b x40, a x24] — never a mix inside.
    #[test]
    fn racing_threads_never_see_a_torn_line() {
        let r = rig(2048);
        // Lines 14..18 straddle the two blocks.
        let at = 14 * 64;
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut v = 0u8;
                while !stop.load(Ordering::Relaxed) {
                    v = v % 127 + 1;
                    r.mem.write(at, &[v; 256]);
                }
            });
            s.spawn(|| {
                let mut v = 128u8;
                while !stop.load(Ordering::Relaxed) {
                    v = v.wrapping_add(1).max(128);
                    for line in 0..4 {
                        r.mem.write(at + line * 64, &[v; 40]);
                    }
                }
            });
            // Stops the writers however the reader ends, panics included.
            let _stop = crate::conformance::StopOnDrop(stop.clone());
            let mut buf = [0u8; 1024];
            let mut mixed = 0;
            // At least 200,000 READs, and on until B's head was seen over
            // A's line (for at most 20 s): on two loaded cores the writers
            // may not run at all during the first 200,000 (0.06 s). Every
            // other READ is 1 KiB from line 8 on, the racing lines in its
            // middle: 16 lines take their own unrolled path.
            let since = std::time::Instant::now();
            let mut reads = 0u64;
            while reads < 200_000 || (mixed == 0 && since.elapsed().as_secs() < 20) {
                reads += 1;
                let lines = if reads.is_multiple_of(2) {
                    r.mem.read(at, &mut buf[..256]);
                    &buf[..256]
                } else {
                    r.mem.read(8 * 64, &mut buf);
                    let mut untouched = buf[..6 * 64].iter().chain(&buf[10 * 64..]);
                    assert!(untouched.all(|&x| x == 0), "lines no one writes");
                    &buf[6 * 64..10 * 64]
                };
                for l in lines.chunks(64) {
                    let (h, t) = (l[0], l[40]);
                    assert!(l[..40].iter().all(|&x| x == h), "torn head {l:?}");
                    assert!(l[40..].iter().all(|&x| x == t), "torn tail {l:?}");
                    assert!(t < 128, "a tail only A writes");
                    assert!(h >= 128 || h == t, "two A writes mixed in a line: {l:?}");
                    mixed += (h != t && t != 0) as u32;
                }
            }
            assert!(mixed > 0, "never saw B's head over A's line");
        });
    }

    /// A block left locked, and a line left odd, by a process that is gone:
    /// a READ of the line and a WRITE of the block complete after about
    /// DEAD_HOLDER_NS, and the line ends whole and even.
    #[test]
    fn a_dead_holder_is_taken_over() {
        let r = rig(2048);
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        assert!(!pid_alive(dead), "pid {dead} still exists");
        set_block_lock(&r, 1024, ((dead as u64) << 32) | 7);
        set_line_seq(&r, 1088, 5);
        let t0 = Instant::now();
        let mut got = [9u8; 64];
        r.mem.read(1088, &mut got);
        let took = t0.elapsed();
        assert_eq!(got, [0u8; 64]);
        assert!(
            took >= Duration::from_nanos(DEAD_HOLDER_NS) && took < Duration::from_millis(500),
            "takeover after {took:?}"
        );
        // Taken over (8), locked and freed by the READ (10), which evened
        // the line the dead writer left odd.
        assert_eq!((r.mem.block_lock(1024), r.mem.line_seq(1088)), (10, 6));
        r.mem.write(1088, &[3u8; 64]);
        r.mem.read(1088, &mut got);
        assert_eq!(got, [3u8; 64]);
        assert_eq!((r.mem.block_lock(1024), r.mem.line_seq(1088)), (12, 8));
        // The other block was never involved.
        assert_eq!(r.mem.block_lock(0), 0);
    }

    /// A writer that died inside a line the next writer rewrites: the
    /// writer keeps the odd sequence and finishes the line in its place.
    #[test]
    fn a_line_left_odd_is_finished_by_the_next_writer() {
        let r = rig(1024);
        set_line_seq(&r, 64, 3);
        r.mem.write(64, &[4u8; 40]);
        assert_eq!(r.mem.line_seq(64), 4);
        let mut got = [0u8; 64];
        r.mem.read(64, &mut got);
        assert_eq!(&got[..40], &[4u8; 40]);
    }

    /// A holder whose pid is alive (ours) is waited for, then taken over
    /// after STUCK_HOLDER_NS; two readers waiting at once take over once.
    #[test]
    fn a_stuck_live_holder_is_taken_over_once_after_the_long_bound() {
        let r = rig(1024);
        set_block_lock(&r, 0, ((std::process::id() as u64) << 32) | 1);
        set_line_seq(&r, 0, 1);
        // The bound is kept on the executors' clock (crate::clock), so it is
        // measured on that clock: Instant and the calibrated TSC clock
        // disagree by a few µs a second.
        let t0 = crate::clock::now_ns();
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let mut b = [1u8; 64];
                    r.mem.read(0, &mut b);
                    assert_eq!(b, [0u8; 64]);
                });
            }
        });
        let took = crate::clock::now_ns() - t0;
        assert!(
            took >= STUCK_HOLDER_NS,
            "a live holder was taken over after {took} ns"
        );
        // One takeover (1 → 2), then one or two locked reads; the line was
        // evened once.
        let lock = r.mem.block_lock(0);
        assert!(lock == 4 || lock == 6, "lock word {lock}");
        assert_eq!(r.mem.line_seq(0), 2);
    }

    #[test]
    fn lock_words_encode_holder_and_generation() {
        let h = held_by(4, 1234);
        assert!(is_held(h));
        assert_eq!(holder(h), 1234);
        assert_eq!(released(h), 6);
        assert!(!is_held(released(h)));
        let wrap = held_by(u32::MAX as u64 - 1, 9);
        assert_eq!(released(wrap), 0, "the generation wraps to an even 0");
        assert!(!pid_alive(0) && !pid_alive(u32::MAX));
        assert!(pid_alive(std::process::id()));
    }
}
