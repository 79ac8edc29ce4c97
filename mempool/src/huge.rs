//! Huge-page memory ([`HugeMem`]) and the locked-memory limit check.
//!
//! Owns anonymous, private, zeroed mappings meant to be registered with a
//! NIC. Promises: a [`HugeMem`] is backed by 2 MiB huge pages
//! (`MAP_HUGETLB`) when the kernel has them reserved, and otherwise by
//! ordinary pages (with a transparent-huge-page hint) after exactly one
//! warning per process that says how to reserve huge pages; it is zeroed,
//! faulted in at allocation (so the data path takes no page faults), never
//! moves, and is unmapped when dropped. Huge pages matter because a NIC
//! translates addresses through its own small cache (MTT); 4 KiB pages make
//! it miss far more often than 2 MiB ones.
//!
//! Registering memory with a real NIC pins it, which counts against
//! `RLIMIT_MEMLOCK`: [`check_memlock`] turns a too-low limit into one clear
//! sentence with the fix, before `ibv_reg_mr` fails with a bare `ENOMEM`.
//! The emu backend pins nothing and does not call it.

use crate::MemError;
use std::io;
use std::ptr::NonNull;

/// Size of a huge page on x86-64 and the size huge mappings are rounded to.
pub const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Anonymous memory from `mmap`, on 2 MiB huge pages when the kernel has
/// them, zeroed, unmapped on drop.
///
/// No Rust reference into it is ever handed out (only [`as_ptr`]), so a NIC
/// may write it while Rust code holds the `HugeMem`.
///
/// [`as_ptr`]: HugeMem::as_ptr
#[derive(Debug)]
pub struct HugeMem {
    ptr: NonNull<u8>,
    len: usize,
    huge: bool,
}

impl HugeMem {
    /// Maps at least `bytes` zeroed bytes. The length is rounded up to
    /// 2 MiB when huge pages are used and to the ordinary page size
    /// otherwise; [`len`](HugeMem::len) reports the rounded length, and all
    /// of it is usable.
    ///
    /// Tries `MAP_HUGETLB` first. Without reserved huge pages that `mmap`
    /// fails at once (the kernel reserves hugetlb pages at `mmap` time, and
    /// we do not pass `MAP_NORESERVE`), and where they cannot be faulted in
    /// (a hugetlb cgroup limit, charged at first touch) the prefault fails
    /// rather than raise SIGBUS; either way we fall back to ordinary pages
    /// with `madvise(MADV_HUGEPAGE)`, warning once per process. The mapping
    /// is not inherited by children (`MADV_DONTFORK`).
    pub fn alloc(bytes: usize) -> Result<HugeMem, MemError> {
        if bytes == 0 {
            return Err(MemError::ZeroBytes);
        }
        let huge_len = round_up(bytes, HUGE_PAGE_BYTES).ok_or(MemError::TooLarge { bytes })?;
        let huge =
            map_huge(huge_len).and_then(|ptr| match prefault(ptr, huge_len, HUGE_PAGE_BYTES) {
                Ok(()) => Ok(ptr),
                Err(e) => {
                    unmap(ptr, huge_len);
                    Err(e)
                }
            });
        match huge {
            Ok(ptr) => {
                return Ok(HugeMem {
                    ptr,
                    len: huge_len,
                    huge: true,
                });
            }
            Err(why) => nicdrv::pages::warn_no_huge_pages(&why),
        }
        let page = page_bytes();
        let len = round_up(bytes, page).ok_or(MemError::TooLarge { bytes })?;
        let ptr = map_small(len).map_err(|err| MemError::Mmap { bytes: len, err })?;
        if let Err(err) = prefault(ptr, len, page) {
            unmap(ptr, len);
            return Err(MemError::Mmap { bytes: len, err });
        }
        Ok(HugeMem {
            ptr,
            len,
            huge: false,
        })
    }

    /// True when the mapping is backed by 2 MiB `MAP_HUGETLB` pages.
    pub fn is_huge(&self) -> bool {
        self.huge
    }

    /// Mapped bytes (at least what was asked for).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: an empty `HugeMem` cannot be made.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start of the mapping (page-aligned; 2 MiB-aligned when huge).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for HugeMem {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr+len` is exactly the mapping made in `alloc`; it
        // is unmapped once, here, and no reference into it can outlive
        // `self` because none is ever handed out (registrations that hold
        // the pointer own the HugeMem and deregister first: nicdrv's `Mr`).
        let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        debug_assert_eq!(rc, 0, "munmap of our own mapping failed");
    }
}

// SAFETY: HugeMem owns its mapping outright and holds no thread-bound state;
// moving it to another thread moves that ownership.
unsafe impl Send for HugeMem {}

// SAFETY: the pointer and length name a live private mapping that only this
// value unmaps (in Drop), valid for reads and writes, which never moves, and
// no Rust reference into it is ever created by this type.
unsafe impl nicdrv::RegisterableMemory for HugeMem {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

fn round_up(v: usize, to: usize) -> Option<usize> {
    debug_assert!(to.is_power_of_two());
    v.checked_add(to - 1).map(|x| x & !(to - 1))
}

/// The ordinary page size (4 KiB on x86-64).
fn page_bytes() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 && (p as usize).is_power_of_two() {
        p as usize
    } else {
        4096
    }
}

fn mmap_anon(len: usize, extra_flags: libc::c_int) -> io::Result<NonNull<u8>> {
    // SAFETY: an anonymous private mapping at an address of the kernel's
    // choosing touches no existing memory; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: advising on the mapping just made. MADV_DONTFORK keeps it
    // out of any child this process forks: a registered page left shared
    // copy-on-write with a child would be copied at the parent's next
    // write, and the NIC would go on reading and writing the old copy
    // (rdma-core's fork caveat, on kernels that do not copy pinned pages
    // at fork). The children this process starts exec at once and need
    // none of it. It fails only for ranges that are not a mapping.
    let _ = unsafe { libc::madvise(p, len, libc::MADV_DONTFORK) };
    NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned a null mapping"))
}

/// A `MAP_HUGETLB` mapping of `len` bytes (a multiple of 2 MiB). Fails with
/// `ENOMEM` when fewer than `len / 2 MiB` huge pages are free, and with
/// `EINVAL` on kernels without hugetlb support.
pub(crate) fn map_huge(len: usize) -> io::Result<NonNull<u8>> {
    debug_assert_eq!(len % HUGE_PAGE_BYTES, 0);
    // MAP_HUGETLB alone selects the default huge page size, 2 MiB on x86-64
    // (MAP_HUGE_2MB would pin it, but libc does not export it everywhere).
    mmap_anon(len, libc::MAP_HUGETLB)
}

/// An ordinary-page mapping with a transparent-huge-page hint.
fn map_small(len: usize) -> io::Result<NonNull<u8>> {
    let ptr = mmap_anon(len, 0)?;
    // SAFETY: advising on the mapping we just made; MADV_HUGEPAGE changes
    // only how the kernel backs it, never its contents. Failure (kernels
    // without THP) is harmless, so the result is ignored.
    let _ = unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_HUGEPAGE) };
    Ok(ptr)
}

/// Faults every page in now, at start-up, so the data path never waits on
/// a page fault (nothing allocates on the data path).
///
/// `MADV_POPULATE_WRITE` first: where the pages cannot be had (a hugetlb
/// cgroup limit, which is charged at first touch, not at `mmap`; memory
/// exhausted) it fails with an error where a write would raise SIGBUS or
/// wake the OOM killer. Kernels before 5.14 do not know it (EINVAL): there
/// each page is written once.
fn prefault(ptr: NonNull<u8>, len: usize, page: usize) -> io::Result<()> {
    // SAFETY: advising on our fresh private mapping of `len` bytes;
    // populating faults its pages in writable and keeps their zeroes.
    let rc = unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_POPULATE_WRITE) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EINVAL) {
        return Err(err);
    }
    for off in (0..len).step_by(page) {
        // SAFETY: `off < len`, inside our fresh private mapping, which no one
        // else can see yet; writing the zero it already holds keeps it zeroed.
        unsafe { ptr.as_ptr().add(off).write_volatile(0) };
    }
    Ok(())
}

/// Unmaps a mapping `alloc` made and gives up on.
fn unmap(ptr: NonNull<u8>, len: usize) {
    // SAFETY: `ptr..ptr+len` is a mapping made by `alloc` and not yet
    // handed to any `HugeMem`; nothing else refers to it.
    let rc = unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
    debug_assert_eq!(rc, 0, "munmap of our own mapping failed");
}

/// The locked-memory limit (`RLIMIT_MEMLOCK`, soft) in bytes; `None` when
/// unlimited.
pub fn memlock_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct through a valid pointer.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    if rc != 0 {
        // Cannot happen for a valid resource and pointer. Report a zero
        // limit so a caller fails loudly rather than registering blind.
        return Some(0);
    }
    if lim.rlim_cur == libc::RLIM_INFINITY {
        None
    } else {
        // rlim_t is u64 here but narrower on some targets.
        #[allow(clippy::unnecessary_cast)]
        Some(lim.rlim_cur as u64)
    }
}

/// Checks that `bytes` of memory may be locked, which registering them with
/// a real NIC (mlx5) does. Pass the total the process will register, not
/// one region: the limit counts everything the process has pinned.
pub fn check_memlock(bytes: u64) -> Result<(), MemError> {
    match memlock_limit() {
        Some(limit_bytes) if bytes > limit_bytes => Err(MemError::MemlockTooLow {
            need_bytes: bytes,
            limit_bytes,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Huge pages the kernel could hand out now: free reserved ones plus
    /// surplus ones it may allocate on demand.
    fn huge_pages_available() -> u64 {
        let free = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("HugePages_Free:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse::<u64>().ok())
            })
            .unwrap_or(0);
        let surplus = std::fs::read_to_string("/proc/sys/vm/nr_overcommit_hugepages")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0);
        free + surplus
    }

    #[test]
    fn huge_path_is_attempted_and_matches_the_kernel() {
        let r = map_huge(HUGE_PAGE_BYTES);
        if huge_pages_available() == 0 {
            let e = r.expect_err("MAP_HUGETLB succeeded with no huge pages reserved");
            assert!(
                matches!(e.raw_os_error(), Some(libc::ENOMEM) | Some(libc::EINVAL)),
                "unexpected error {e}"
            );
            assert!(!HugeMem::alloc(1).unwrap().is_huge());
        } else if let Ok(p) = r {
            // SAFETY: unmapping the mapping made just above, used by no one.
            unsafe { libc::munmap(p.as_ptr().cast(), HUGE_PAGE_BYTES) };
        }
    }

    /// The VmFlags of the mapping that holds `addr`, from smaps (the
    /// kernel may have merged ours with a neighbour of the same flags).
    fn vm_flags(addr: usize) -> Vec<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut lines = smaps.lines();
        while let Some(l) = lines.next() {
            let range = l.split_whitespace().next().and_then(|r| {
                let (a, b) = r.split_once('-')?;
                Some((
                    usize::from_str_radix(a, 16).ok()?,
                    usize::from_str_radix(b, 16).ok()?,
                ))
            });
            if !range.is_some_and(|(start, end)| start <= addr && addr < end) {
                continue;
            }
            for l in lines.by_ref() {
                if let Some(flags) = l.strip_prefix("VmFlags:") {
                    return flags.split_whitespace().map(String::from).collect();
                }
            }
        }
        panic!("no mapping at {addr:#x} in /proc/self/smaps")
    }

    /// Registered memory is kept out of forked children (`dc`: "do not
    /// copy area on fork"), and is resident once allocated.
    #[test]
    fn memory_is_not_inherited_by_children_and_is_resident() {
        let m = HugeMem::alloc(3 << 20).unwrap();
        let flags = vm_flags(m.as_ptr() as usize);
        assert!(flags.iter().any(|f| f == "dc"), "{flags:?}");
        // Every page is in: mincore reports each resident.
        let page = page_bytes();
        let mut vec = vec![0u8; m.len().div_ceil(page)];
        // SAFETY: mincore reads the page tables of our own mapping and
        // writes one byte per page into `vec`, which has that many.
        let rc = unsafe { libc::mincore(m.as_ptr().cast(), m.len(), vec.as_mut_ptr()) };
        assert_eq!(rc, 0);
        assert!(vec.iter().all(|b| b & 1 == 1), "a page not resident");
    }

    #[test]
    fn rounding_and_alignment() {
        let m = HugeMem::alloc(5000).unwrap();
        let unit = if m.is_huge() {
            HUGE_PAGE_BYTES
        } else {
            page_bytes()
        };
        assert_eq!(m.len(), round_up(5000, unit).unwrap());
        assert_eq!(m.as_ptr() as usize % unit, 0);
        assert!(!m.is_empty());
        assert_eq!(round_up(usize::MAX - 3, 4096), None);
    }

    #[test]
    fn overflowing_size_is_an_error() {
        assert!(matches!(
            HugeMem::alloc(usize::MAX - 10),
            Err(MemError::TooLarge { .. })
        ));
    }
}
