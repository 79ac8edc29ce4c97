//! Atomic access to memory shared with other threads and processes.
//!
//! An emu memory node is a `MAP_SHARED` mapping that any number of threads
//! and processes read and write at once, exactly as NICs and CPUs touch a
//! real memory node. Rust makes a plain load racing a store undefined
//! behaviour, so every access here is atomic; and it makes racing atomic
//! accesses of different sizes undefined too unless all of them are reads,
//! so every access is of a whole aligned 8-byte word, through `AtomicU64`
//! (the NIC atomics are words already). The unaligned head and tail of a
//! range are a load of their word, or for a WRITE a compare-and-swap that
//! replaces only their bytes. (Only the last bytes of a window whose length
//! is not a multiple of 8, which no word covers, are bytes, `AtomicU8`:
//! nothing wider ever touches them.) A multi-word copy here is a sequence
//! of independent word accesses, so a copy racing a store can return a mix
//! of old and new words, never a word half written.
//! Verbs do not stop at that: READ and WRITE go through [`super::lines`],
//! which makes each 64-byte line whole, as a NIC does; the owner's CPU view
//! (`EmuNode::host()`) uses these word-atomic copies directly. One copy
//! is not made of Rust atomics: on Intel and AMD CPUs with AVX, whose
//! manuals make an aligned 16-byte load atomic, a READ's whole aligned line
//! (`SharedMem::read_line_unchecked`) is four such loads in an asm block,
//! which does nothing that relaxed word loads could not (argued there).
//!
//! Orderings: word loads are `Acquire` and word stores `Release`, but for
//! that whole-line copy, relaxed (asm or word loop): its callers in
//! [`super::lines`] follow every copy with an Acquire fence. On x86-64
//! both compile to plain moves, so they cost nothing there, and they give a
//! WRITE that releases a lock (Sherman writes 0 to its lock word) the
//! publish semantics its protocol needs against a later acquiring CAS.
//! Atomic verbs use `AcqRel` read-modify-writes.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

/// Whether an aligned 16-byte SSE load (`movdqa`) is one atomic access
/// here. Each vendor's manual promises it for its own processors that
/// report AVX (CPUID.01H:ECX bit 28): Intel's SDM vol. 3A, "Guaranteed
/// Atomic Operations", names `movdqa` among the 16-byte operations always
/// carried out atomically there, and AMD's APM vol. 2, "Access Atomicity",
/// extends single aligned cacheable loads from a quadword to a double
/// quadword. Neither speaks for other vendors' CPUs, so those (and CPUs
/// without AVX, whose SSE accesses wider than a quadword may be split into
/// accesses of unspecified width) take the word loop.
#[cfg(all(target_arch = "x86_64", not(miri)))]
fn wide_loads_are_atomic() -> bool {
    // CPUID leaf 0 names the vendor in EBX, EDX, ECX, four ASCII bytes
    // each, little-endian.
    #[allow(unused_unsafe)]
    // SAFETY: CPUID exists on every x86-64 CPU and only reads
    // identification registers; leaf 0 is always valid.
    let id = unsafe { std::arch::x86_64::__cpuid(0) };
    let vendor = [id.ebx, id.edx, id.ecx].map(u32::to_le_bytes);
    let named = |s: &[u8; 12]| vendor.concat() == s;
    (named(b"GenuineIntel") || named(b"AuthenticAMD")) && std::arch::is_x86_feature_detected!("avx")
}

/// Elsewhere no 16-byte load is used (`read_line_unchecked`).
#[cfg(not(all(target_arch = "x86_64", not(miri))))]
fn wide_loads_are_atomic() -> bool {
    false
}

/// A window of shared memory accessed only through atomics.
///
/// Not `Clone`: a window must not outlive its mapping, and a copy handed
/// out by value would (an `EmuNode`'s views are borrowed from it). Code in
/// this crate that keeps a second window onto memory it keeps mapped says
/// so with `SharedMem::alias`.
#[derive(Debug)]
pub struct SharedMem {
    base: *mut u8,
    len: usize,
    /// An aligned 16-byte load is one atomic access on this CPU, so a
    /// line may be copied with them (`read_line_unchecked`).
    wide: bool,
}

// SAFETY: SharedMem is a pointer to memory that is only ever accessed through
// atomic operations, which are sound from any thread.
unsafe impl Send for SharedMem {}
// SAFETY: as above: `&SharedMem` only permits atomic accesses.
unsafe impl Sync for SharedMem {}

impl SharedMem {
    /// # Safety
    /// `base..base+len` must be valid for atomic reads and writes for the
    /// lifetime of every copy of this value, and `base` must be 8-byte
    /// aligned (page-aligned mappings are).
    pub unsafe fn new(base: *mut u8, len: usize) -> SharedMem {
        debug_assert_eq!(base as usize % 8, 0);
        SharedMem {
            base,
            len,
            wide: wide_loads_are_atomic(),
        }
    }

    /// A second window onto the same memory.
    ///
    /// # Safety
    /// The alias must not be used once the memory is unmapped: its holder
    /// keeps the mapping alive, or is dropped before it goes.
    pub(crate) unsafe fn alias(&self) -> SharedMem {
        SharedMem {
            base: self.base,
            len: self.len,
            wide: self.wide,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn base(&self) -> *mut u8 {
        self.base
    }

    /// True when `off..off+len` lies inside the window.
    pub fn in_bounds(&self, off: u64, len: u64) -> bool {
        off.checked_add(len)
            .is_some_and(|end| end <= self.len as u64)
    }

    /// Whether the window holds the aligned `n`-byte unit at `off`
    /// (`in_bounds`' checked sum: `off + n` wrapping past zero, an offset
    /// near `u64::MAX` from a caller, would pass a plain comparison and
    /// point before the window).
    #[inline]
    fn holds(&self, off: usize, n: usize) -> bool {
        off.is_multiple_of(n) && self.in_bounds(off as u64, n as u64)
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        assert!(self.holds(off, 8), "word access out of bounds");
        // SAFETY: in bounds and 8-byte aligned (checked above; base is
        // aligned); the memory is valid for the window's lifetime and only
        // accessed atomically.
        unsafe { AtomicU64::from_ptr(self.base.add(off) as *mut u64) }
    }

    fn byte(&self, off: usize) -> &AtomicU8 {
        assert!(off < self.len, "byte access out of bounds");
        // SAFETY: in bounds; AtomicU8 has no alignment requirement.
        unsafe { AtomicU8::from_ptr(self.base.add(off)) }
    }

    /// The aligned 8-byte word at `off`, for callers that choose their own
    /// orderings (the block lock words of [`super::lines`]).
    pub(crate) fn word_at(&self, off: u64) -> &AtomicU64 {
        self.word(off as usize)
    }

    /// The aligned 4-byte word at `off` (the line sequences of
    /// [`super::lines`]).
    pub(crate) fn word32_at(&self, off: u64) -> &AtomicU32 {
        let off = off as usize;
        assert!(self.holds(off, 4), "word access out of bounds");
        // SAFETY: in bounds and 4-byte aligned (checked above; base is
        // aligned); the memory is valid for the window's lifetime and only
        // accessed atomically.
        unsafe { AtomicU32::from_ptr(self.base.add(off) as *mut u32) }
    }

    pub fn load_u64(&self, off: u64) -> u64 {
        self.word(off as usize).load(Ordering::Acquire)
    }

    pub fn store_u64(&self, off: u64, v: u64) {
        self.word(off as usize).store(v, Ordering::Release)
    }

    pub fn cas_u64(&self, off: u64, compare: u64, swap: u64) -> u64 {
        match self.word(off as usize).compare_exchange(
            compare,
            swap,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(old) | Err(old) => old,
        }
    }

    pub fn faa_u64(&self, off: u64, add: u64) -> u64 {
        self.word(off as usize).fetch_add(add, Ordering::AcqRel)
    }

    /// Masked compare-and-swap: succeeds when the bits under `compare_mask`
    /// equal those of `compare`, then replaces the bits under `swap_mask`.
    /// Returns the old word either way.
    pub fn masked_cas_u64(
        &self,
        off: u64,
        compare: u64,
        compare_mask: u64,
        swap: u64,
        swap_mask: u64,
    ) -> u64 {
        let w = self.word(off as usize);
        let mut cur = w.load(Ordering::Acquire);
        loop {
            if (cur ^ compare) & compare_mask != 0 {
                return cur;
            }
            let new = (cur & !swap_mask) | (swap & swap_mask);
            match w.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(old) => return old,
                Err(seen) => cur = seen,
            }
        }
    }

    /// Copies `len` bytes at `off` into `dst`.
    ///
    /// # Safety
    /// `dst..dst+len` must be valid for writes and not aliased by any live
    /// reference. The source range must be in bounds (asserted).
    pub unsafe fn read_into(&self, off: u64, dst: *mut u8, len: usize) {
        // SAFETY: the caller upholds this function's `# Safety` contract, which is
        // what every unsafe operation below relies on (each argued in place).
        unsafe {
            assert!(self.in_bounds(off, len as u64));
            let mut off = off as usize;
            let end = off + len;
            let mut d = dst;
            if off < end && !off.is_multiple_of(8) {
                let stop = ((off | 7) + 1).min(end);
                // SAFETY: d..d+(stop-off) lies in dst..dst+len.
                self.read_edge(off, d, stop - off);
                d = d.add(stop - off);
                off = stop;
            }
            while off + 8 <= end {
                let v = self.word(off).load(Ordering::Acquire);
                // SAFETY: d..d+8 lies in dst..dst+len; it may be unaligned.
                (d as *mut u64).write_unaligned(v);
                d = d.add(8);
                off += 8;
            }
            if off < end {
                // SAFETY: as for the head.
                self.read_edge(off, d, end - off);
            }
        }
    }

    /// Copies the `n` bytes at `off..off+n`, within one aligned word, to
    /// `d`: from one load of the whole word (module doc: no access to node
    /// memory narrower than a word), or byte by byte in the last bytes of
    /// a window whose length is not a multiple of 8, which no word covers.
    ///
    /// # Safety
    /// `d..d+n` must be valid for writes and not aliased by any live
    /// reference.
    unsafe fn read_edge(&self, off: usize, d: *mut u8, n: usize) {
        debug_assert!(n > 0 && off % 8 + n <= 8);
        match self.edge_word(off) {
            Some(w) => {
                let b = w.load(Ordering::Acquire).to_ne_bytes();
                let at = off % 8;
                // SAFETY: the caller's contract; b[at..at+n] is in the word.
                unsafe { std::ptr::copy_nonoverlapping(b.as_ptr().add(at), d, n) };
            }
            None => {
                for i in 0..n {
                    // SAFETY: the caller's contract, i < n.
                    unsafe { d.add(i).write(self.byte(off + i).load(Ordering::Acquire)) };
                }
            }
        }
    }

    /// Stores `n` bytes from `s` at `off..off+n`, within one aligned word:
    /// one compare-and-swap of the whole word, so that the other bytes of
    /// the word stay as they are (another writer's, or a NIC atomic's) and
    /// a reader of the word sees it before or after, never half of it. In
    /// the last bytes of a window whose length is not a multiple of 8,
    /// which no word covers, byte by byte.
    ///
    /// # Safety
    /// `s..s+n` must be valid for reads and not mutably aliased.
    unsafe fn write_edge(&self, off: usize, s: *const u8, n: usize) {
        debug_assert!(n > 0 && off % 8 + n <= 8);
        let at = off % 8;
        match self.edge_word(off) {
            Some(w) => {
                // Relaxed: only the value is needed; the CAS below orders.
                let mut cur = w.load(Ordering::Relaxed);
                loop {
                    let mut b = cur.to_ne_bytes();
                    // SAFETY: the caller's contract; b[at..at+n] is in the word.
                    unsafe { std::ptr::copy_nonoverlapping(s, b.as_mut_ptr().add(at), n) };
                    // Release, as every store here (module doc); Relaxed on
                    // failure: the word seen is only the next try's base.
                    match w.compare_exchange_weak(
                        cur,
                        u64::from_ne_bytes(b),
                        Ordering::Release,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => return,
                        Err(seen) => cur = seen,
                    }
                }
            }
            None => {
                for i in 0..n {
                    // SAFETY: the caller's contract, i < n.
                    self.byte(off + i)
                        .store(unsafe { s.add(i).read() }, Ordering::Release);
                }
            }
        }
    }

    /// The aligned word holding byte `off`, if the window holds all of it.
    fn edge_word(&self, off: usize) -> Option<&AtomicU64> {
        let w = off & !7;
        (w + 8 <= self.len).then(|| self.word(w))
    }

    /// Copies `len` bytes from `src` to `off`.
    ///
    /// # Safety
    /// `src..src+len` must be valid for reads and not mutably aliased. The
    /// destination range must be in bounds (asserted).
    pub unsafe fn write_from(&self, off: u64, src: *const u8, len: usize) {
        // SAFETY: the caller upholds this function's `# Safety` contract, which is
        // what every unsafe operation below relies on (each argued in place).
        unsafe {
            assert!(self.in_bounds(off, len as u64));
            let mut off = off as usize;
            let end = off + len;
            let mut s = src;
            if off < end && !off.is_multiple_of(8) {
                let stop = ((off | 7) + 1).min(end);
                // SAFETY: s..s+(stop-off) lies in src..src+len.
                self.write_edge(off, s, stop - off);
                s = s.add(stop - off);
                off = stop;
            }
            while off + 8 <= end {
                // SAFETY: s..s+8 lies in src..src+len; it may be unaligned.
                let v = (s as *const u64).read_unaligned();
                self.word(off).store(v, Ordering::Release);
                s = s.add(8);
                off += 8;
            }
            if off < end {
                // SAFETY: as for the head.
                self.write_edge(off, s, end - off);
            }
        }
    }

    /// Copies the aligned 64-byte line at `off` into `dst`: relaxed loads
    /// (the caller fences), no edges (the common case of line-atomic
    /// READs).
    ///
    /// # Safety
    /// `dst..dst+64` must be valid for writes and not aliased by any live
    /// reference. The line must be in bounds (asserted).
    #[inline]
    pub(crate) unsafe fn read_line_into(&self, off: u64, dst: *mut u8) {
        assert!(self.holds(off as usize, 64), "line out of bounds");
        // SAFETY: the line is in bounds and aligned (asserted); the rest
        // is the caller's contract.
        unsafe { self.read_line_unchecked(off, dst) }
    }

    /// [`Self::read_line_into`] without its bounds check, for callers that
    /// checked a whole run of lines at once.
    ///
    /// # Safety
    /// As for `read_line_into`, and the line at `off` must be aligned and
    /// in bounds.
    #[inline]
    pub(crate) unsafe fn read_line_unchecked(&self, off: u64, dst: *mut u8) {
        // SAFETY: the caller upholds this function's `# Safety` contract, which is
        // what every unsafe operation below relies on (each argued in place).
        unsafe {
            let off = off as usize;
            debug_assert!(off.is_multiple_of(64) && off + 64 <= self.len);
            let src = self.base.add(off);
            // `movdqa` needs 16-byte alignment: node windows are page
            // aligned, but a window is only promised 8 (`new`), so one that
            // is not takes the word loop (a test the compiler hoists out of
            // a READ's loop over its lines). `wide`: the CPU makes each
            // such load atomic (`wide_loads_are_atomic`).
            #[cfg(all(target_arch = "x86_64", not(miri)))]
            if self.wide && src.addr().is_multiple_of(16) {
                // Four 16-byte loads and four stores. The loads race
                // writers' atomic stores, which is sound only because it
                // is not Rust code: an asm block must behave as some Rust
                // code could, and each aligned 16-byte load here, atomic
                // on this CPU (`wide`), returns what two relaxed
                // `AtomicU64` loads of its halves may return: both halves
                // whole, and as of one moment, which two loads allow too
                // (nothing orders them apart). Every store to node memory
                // is a whole `AtomicU64` (module doc), so no sizes are
                // mixed either. That is what the word loop below does:
                // relaxed loads suffice to the seqlock, whose acquire
                // fence follows every copy (module doc of lines.rs). Half
                // the instructions of the word loop: a Sherman lookup on
                // emu went from 2,621 to 2,511 instructions, its 1 KiB
                // leaf READ 7-9% faster. No `nomem`: the block reads
                // shared memory and writes `dst`, so the compiler keeps it
                // between the sequence loads and the fence.
                std::arch::asm!(
                    "movdqa {a}, xmmword ptr [{src}]",
                    "movdqa {b}, xmmword ptr [{src} + 16]",
                    "movdqa {c}, xmmword ptr [{src} + 32]",
                    "movdqa {d}, xmmword ptr [{src} + 48]",
                    "movdqu xmmword ptr [{dst}], {a}",
                    "movdqu xmmword ptr [{dst} + 16], {b}",
                    "movdqu xmmword ptr [{dst} + 32], {c}",
                    "movdqu xmmword ptr [{dst} + 48], {d}",
                    src = in(reg) src,
                    dst = in(reg) dst,
                    a = out(xmm_reg) _,
                    b = out(xmm_reg) _,
                    c = out(xmm_reg) _,
                    d = out(xmm_reg) _,
                    options(nostack, preserves_flags),
                );
                return;
            }
            for i in 0..8 {
                // SAFETY: in bounds and aligned (checked above); atomic access
                // only. The destination may be unaligned. Relaxed: the
                // seqlock's acquire fence follows (lines.rs).
                let w = AtomicU64::from_ptr(src.add(8 * i) as *mut u64);
                (dst.add(8 * i) as *mut u64).write_unaligned(w.load(Ordering::Relaxed));
            }
        }
    }

    /// Copies 64 bytes from `src` to the aligned line at `off`: eight word
    /// stores, no edges.
    ///
    /// # Safety
    /// `src..src+64` must be valid for reads and not mutably aliased. The
    /// line must be in bounds (asserted).
    #[inline]
    pub(crate) unsafe fn write_line_from(&self, off: u64, src: *const u8) {
        // SAFETY: the caller upholds this function's `# Safety` contract, which is
        // what every unsafe operation below relies on (each argued in place).
        unsafe {
            let off = off as usize;
            assert!(self.holds(off, 64), "line out of bounds");
            for i in 0..8 {
                let v = (src.add(8 * i) as *const u64).read_unaligned();
                // SAFETY: as in `read_line_into`.
                AtomicU64::from_ptr(self.base.add(off + 8 * i) as *mut u64)
                    .store(v, Ordering::Release);
            }
        }
    }

    /// Safe read into a slice (for the owner's CPU and for tests).
    pub fn read(&self, off: u64, dst: &mut [u8]) {
        // SAFETY: a `&mut [u8]` is valid for writes and unaliased.
        unsafe { self.read_into(off, dst.as_mut_ptr(), dst.len()) }
    }

    /// Safe write from a slice (for the owner's CPU and for tests).
    pub fn write(&self, off: u64, src: &[u8]) {
        // SAFETY: a `&[u8]` is valid for reads and not mutably aliased.
        unsafe { self.write_from(off, src.as_ptr(), src.len()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{atomic::AtomicBool, Arc};

    /// Offsets near `u64::MAX` are out of bounds, not wrapped: a check of
    /// `off + 8 <= len` passes when the sum wraps, and the access lands
    /// before the window (in a node file, on the window below it).
    #[test]
    fn offsets_near_the_top_are_refused_not_wrapped() {
        let mut backing = vec![0u64; 16];
        // SAFETY: the vector outlives `m` and is only touched through `m`.
        let m = unsafe { SharedMem::new(backing.as_mut_ptr() as *mut u8, 128) };
        let refused = |what: &str, f: &dyn Fn()| {
            let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
                .expect_err(&format!("{what}: accepted an offset past the window"));
            let msg = e
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| e.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            assert!(msg.contains("out of bounds"), "{what}: {msg}");
        };
        let top = u64::MAX - 7;
        refused("load", &|| {
            let _ = m.load_u64(top);
        });
        refused("store", &|| m.store_u64(top, 1));
        refused("cas", &|| {
            let _ = m.cas_u64(top, 0, 1);
        });
        refused("faa", &|| {
            let _ = m.faa_u64(top, 1);
        });
        refused("masked cas", &|| {
            let _ = m.masked_cas_u64(top, 0, !0, 1, !0);
        });
        refused("word32", &|| {
            let _ = m.word32_at(u64::MAX - 3);
        });
        let mut line = [0u8; 64];
        let dst = line.as_mut_ptr();
        // SAFETY: `dst` is 64 writable bytes; the call must refuse first.
        refused("line", &|| unsafe { m.read_line_into(u64::MAX - 63, dst) });
        assert!(backing.iter().all(|&w| w == 0), "nothing was written");
    }

    #[test]
    fn unaligned_copies_round_trip() {
        let mut backing = vec![0u64; 16];
        // SAFETY: the vector outlives `m` and is only touched through `m`.
        let m = unsafe { SharedMem::new(backing.as_mut_ptr() as *mut u8, 128) };
        let src: Vec<u8> = (0..77u8).collect();
        m.write(3, &src);
        let mut dst = vec![0u8; 77];
        m.read(3, &mut dst);
        assert_eq!(src, dst);
        assert_eq!(
            m.load_u64(0) & 0xff_ffff,
            0,
            "bytes before the range untouched"
        );
        assert_eq!(m.faa_u64(96, 5), 0);
        assert_eq!(m.cas_u64(96, 5, 9), 5);
        assert_eq!(m.cas_u64(96, 5, 1), 9);
        assert_eq!(m.masked_cas_u64(104, 0, 0xff, 0xabcd, 0xff00), 0);
        assert_eq!(m.load_u64(104), 0xab00);
        assert_eq!(
            m.masked_cas_u64(104, 1, 0xff, 0xff, 0xff),
            0xab00,
            "compare fails"
        );
        assert_eq!(m.load_u64(104), 0xab00);
        drop(backing);
    }

    /// Every piece of a word, at every offset, round-trips and leaves the
    /// word's other bytes alone; so do the last bytes of a window whose
    /// length is not a multiple of 8 (no word covers them).
    #[test]
    fn word_edges_round_trip_and_keep_their_neighbours() {
        let mut backing = vec![0u64; 4];
        // SAFETY: the vector outlives `m` and is only touched through `m`;
        // 29 bytes: three words, then five bytes no word covers.
        let m = unsafe { SharedMem::new(backing.as_mut_ptr() as *mut u8, 29) };
        let mut want = [0u8; 29];
        let mut next = 1u8;
        for off in 0..29 {
            for n in 1..=(29 - off).min(9) {
                let src: Vec<u8> = (0..n).map(|i| next.wrapping_add(i as u8)).collect();
                next = next.wrapping_add(37);
                m.write(off as u64, &src);
                want[off..off + n].copy_from_slice(&src);
                let mut all = [0u8; 29];
                m.read(0, &mut all);
                assert_eq!(all, want, "after writing {n} bytes at {off}");
                let mut part = vec![0u8; n];
                m.read(off as u64, &mut part);
                assert_eq!(part, src);
            }
        }
        drop(backing);
    }

    /// A window only 8-byte aligned copies its lines whole too: the
    /// 16-byte loads need 16, and a window that lacks it takes the word
    /// loop (`movdqa` there would fault).
    #[test]
    fn lines_of_a_window_aligned_only_to_8_copy_whole() {
        let mut backing = vec![0u64; 32];
        let skip = if backing.as_ptr().addr().is_multiple_of(16) {
            1
        } else {
            0
        };
        // SAFETY: the vector outlives `m` and is only touched through `m`;
        // the window (two lines) starts `skip` words in, 8 mod 16.
        let m = unsafe { SharedMem::new(backing.as_mut_ptr().add(skip) as *mut u8, 128) };
        assert_eq!(m.base().addr() % 16, 8);
        let src: Vec<u8> = (0..128u8).map(|i| i.wrapping_mul(7)).collect();
        m.write(0, &src);
        let mut dst = [0u8; 128];
        // SAFETY: dst holds 128 bytes: the first line's 64, then the
        // second's from 64 on.
        unsafe {
            m.read_line_into(0, dst.as_mut_ptr());
            m.read_line_into(64, dst.as_mut_ptr().add(64));
        }
        assert_eq!(&dst[..], &src[..]);
        drop(backing);
    }

    /// A line copied with the 16-byte loads (a source 16-byte aligned, on
    /// an Intel or AMD CPU with AVX), to destinations at every alignment, while another
    /// thread rewrites its words: each word arrives whole, never two
    /// writes' halves, and the last copy is exact.
    #[test]
    fn wide_line_copies_are_whole_to_any_destination() {
        #[repr(C, align(64))]
        struct Lines([u64; 16]);
        let mut backing = Lines([0; 16]);
        // SAFETY: `backing` outlives `m` (both live to the end of the test)
        // and is only touched through `m`.
        let m = unsafe { SharedMem::new(backing.0.as_mut_ptr() as *mut u8, 128) };
        assert_eq!(m.base().addr() % 64, 0);
        // The wide path is taken exactly where the manuals promise it, as
        // the kernel reports the CPU (an oracle apart from CPUID).
        #[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
        {
            let info = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo");
            let field = |name: &str| {
                let line = info.lines().find(|l| l.starts_with(name));
                line.and_then(|l| l.split(':').nth(1)).unwrap_or("").trim()
            };
            let vendor = field("vendor_id");
            let avx = field("flags").split(' ').any(|f| f == "avx");
            let promised = avx && (vendor == "GenuineIntel" || vendor == "AuthenticAMD");
            assert_eq!(m.wide, promised, "vendor {vendor}, avx {avx}");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut dst = [0u8; 64 + 16];
        std::thread::scope(|s| {
            s.spawn(|| {
                // Every word of a write holds its number in both halves.
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i = (i + 1) & 0xffff_ffff;
                    for w in 0..8 {
                        m.word(64 + 8 * w).store(i << 32 | i, Ordering::Relaxed);
                    }
                }
            });
            let _stop = crate::conformance::StopOnDrop(stop.clone());
            for k in 0..100_000usize {
                let at = k % 16;
                // SAFETY: dst[at..at + 64] lies in dst; the line is in
                // bounds and aligned.
                unsafe { m.read_line_into(64, dst.as_mut_ptr().add(at)) };
                for w in dst[at..at + 64].chunks_exact(8) {
                    let v = u64::from_ne_bytes(w.try_into().unwrap());
                    assert_eq!(v >> 32, v & 0xffff_ffff, "a torn word {v:#x}");
                }
            }
        });
        let src: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(11) ^ 0x5a).collect();
        m.write(64, &src);
        for at in 0..16 {
            // SAFETY: as above.
            unsafe { m.read_line_into(64, dst.as_mut_ptr().add(at)) };
            assert_eq!(
                &dst[at..at + 64],
                &src[..],
                "to a destination at {at} mod 16"
            );
        }
    }

    /// Two threads write different bytes of one word, each checking,
    /// before every write, that the word still holds its own last write
    /// whole: the first thread a 4-byte count, the second 4 equal bytes.
    /// A write that put back an older copy of its neighbour's bytes (a
    /// load-modify-store of the word) is found by that neighbour at its
    /// next write, every time it happens; a word seen half written (byte
    /// stores) by a check of the other's bytes. At the end the word holds
    /// both threads' last writes.
    #[test]
    fn edge_writes_are_whole_and_lose_no_neighbour() {
        let mut backing = vec![0u64; 2];
        // SAFETY: the vector outlives `m` (the scope below ends first) and
        // is only touched through `m`.
        let m = unsafe { SharedMem::new(backing.as_mut_ptr() as *mut u8, 16) };
        let stop = Arc::new(AtomicBool::new(false));
        let count = |w: [u8; 8]| u32::from_ne_bytes(w[..4].try_into().unwrap());
        let mut n = 0u32;
        let mut changes = 0u64;
        std::thread::scope(|s| {
            s.spawn(|| {
                let _stop = crate::conformance::StopOnDrop(stop.clone());
                let (mut mine, mut most) = (0u8, 0u32);
                while !stop.load(Ordering::Relaxed) {
                    let w = m.load_u64(8).to_ne_bytes();
                    assert_eq!(&w[4..], &[mine; 4], "my last write was lost or torn");
                    assert!(count(w) >= most, "the count went back: {w:?}");
                    most = count(w);
                    mine = mine % 251 + 1;
                    m.write(12, &[mine; 4]);
                }
                m.write(12, &[0xAA; 4]);
            });
            // Stops the writer however this thread ends, panics included.
            let _stop = crate::conformance::StopOnDrop(stop.clone());
            // Until the other writer was seen at work for a while (on two
            // loaded cores it may not run at first), for at most 20 s.
            let since = std::time::Instant::now();
            let mut seen = [0u8; 4];
            while changes < 100_000 && since.elapsed().as_secs() < 20 {
                let w = m.load_u64(8).to_ne_bytes();
                assert_eq!(count(w), n, "my last count was lost or torn: {w:?}");
                assert!(w[5..].iter().all(|&b| b == w[4]), "a torn word: {w:?}");
                changes += (w[4..] != seen) as u64;
                seen.copy_from_slice(&w[4..]);
                n += 1;
                m.write(8, &n.to_ne_bytes());
            }
        });
        let w = m.load_u64(8).to_ne_bytes();
        assert_eq!(count(w), n, "the counter's last write");
        assert_eq!(&w[4..], &[0xAA; 4], "the other writer's last bytes");
        assert_eq!(m.load_u64(0), 0, "the word before untouched");
        assert!(changes > 0, "never saw the other writer write");
        drop(backing);
    }
}
