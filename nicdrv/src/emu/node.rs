//! An emulated memory node: a file mapped `MAP_SHARED` by its owner and by
//! every compute thread or process that attaches to it by path.
//!
//! File layout, version 2 (all header fields are 8-byte words accessed
//! atomically):
//!
//! ```text
//! [0, page)                 header: magic, layout version, node id, sizes,
//!                           owner pid, state (alive/closed/dead), region
//!                           table generation, seqlock table bytes, and 32
//!                           region entries
//! [page, page+host)         host memory (what the NIC reaches over PCIe)
//! [page+host', ...+dm)      device memory, a second small mapping
//! [page+host'+dm', ...+t)   seqlock tables (see [`super::lines`]), for host
//!                           memory then device memory, each: an 8-byte
//!                           lock word per 1 KiB block, then a 4-byte
//!                           sequence per 64-byte line, padded to 8 bytes
//! ```
//!
//! `page` is 4 KiB on ordinary files and 2 MiB on hugetlbfs; `host'` is the
//! host size rounded up to `page`, `dm'` the device memory size (at least 1)
//! rounded up to `page`. `t`, recorded in the header, is
//! `8⌈host/1024⌉ + 4⌈host/64⌉` (padded) plus the same for device memory; the
//! file is sized to `t` rounded up to `page` past the tables' start.
//! Version 2 added the tables (READ and WRITE became line-atomic); attach
//! refuses other versions, a table size that does not match the memory
//! sizes, and files too short for their sizes. The owner creates the file
//! with mode 0600 and holds an exclusive `flock` on it while alive; see
//! [`super::watchdog`].

use super::lines::{table_bytes, LineMem};
use super::shm::SharedMem;
use super::watchdog::{
    owner_holds_lock, pidfd_open, Watchdog, STATE_ALIVE, STATE_CLOSED, STATE_DEAD,
};
use crate::addr::{NodeId, Space};
use crate::nic::{RegError, RemoteRegion};
use crate::verbs::{Access, RKey};
use std::ffi::CString;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const MAGIC: u64 = u64::from_le_bytes(*b"LOCHNODE");
const LAYOUT_VERSION: u64 = 2;
const HDR_MAGIC: u64 = 0;
const HDR_VERSION: u64 = 8;
const HDR_NODE_ID: u64 = 16;
const HDR_HOST_BYTES: u64 = 24;
const HDR_DM_BYTES: u64 = 32;
const HDR_PAGE_BYTES: u64 = 40;
const HDR_OWNER_PID: u64 = 48;
const HDR_STATE: u64 = 56;
const HDR_REGION_GEN: u64 = 64;
const HDR_TABLE_BYTES: u64 = 72;
const HDR_REGIONS: u64 = 256;
const REGION_ENTRY_BYTES: u64 = 32;
/// Regions a node can register at once.
pub const MAX_REGIONS: usize = 32;
const SMALL_PAGE: u64 = 4096;
const HUGE_PAGE: u64 = 2 << 20;
const HUGETLBFS_MAGIC: i64 = 0x958458f6;
/// How long [`NodeMap::read_regions`] waits for an odd region generation
/// to move while the owner reads alive: an edit is a few stores, so this
/// is an owner stopped mid-edit or a corrupt word.
const ODD_GEN_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// Largest host memory an emu node accepts (the 47-bit offset limit).
pub const MAX_NODE_BYTES: u64 = crate::addr::GlobalAddr::MAX_OFFSET;

/// Where an emulated node's memory lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backing {
    /// An anonymous memfd (`MFD_HUGETLB` when huge pages are reserved);
    /// other processes attach through `/proc/<pid>/fd/<n>`.
    Memfd,
    /// A file at this path, created with mode 0600 (in /dev/shm, or on a
    /// hugetlbfs mount for huge pages). Removed when the owner closes it.
    File(PathBuf),
}

/// What a memory node is made with.
#[derive(Clone, Debug)]
pub struct EmuNodeConfig {
    pub id: NodeId,
    pub host_bytes: u64,
    pub dm_bytes: u64,
    pub backing: Backing,
}

/// Errors creating or attaching to an emulated node.
#[derive(Debug)]
pub enum EmuError {
    Io {
        path: PathBuf,
        what: &'static str,
        err: io::Error,
    },
    /// The file exists but is not a Loch node (bad magic, version or size).
    NotALochNode { path: PathBuf, why: String },
    /// The node's owner is gone (its lock is free, or it closed the node).
    NodeDead { path: PathBuf },
    /// Another live process owns a node at this path.
    InUse { path: PathBuf, pid: u64 },
    /// Sizes that cannot make a node.
    BadConfig(String),
}

impl fmt::Display for EmuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EmuError::Io { path, what, err } => {
                write!(f, "{what} {}: {err}", path.display())?;
                if err.raw_os_error() == Some(libc::EMFILE) {
                    // Each memory node holds a descriptor: the fix is
                    // the limit, not the node.
                    write!(
                        f,
                        " (each emu memory node holds an open file: raise the limit, `ulimit -n`)"
                    )?;
                }
                Ok(())
            }
            EmuError::NotALochNode { path, why } => {
                write!(f, "{} is not a Loch memory node: {why}", path.display())
            }
            EmuError::NodeDead { path } => write!(
                f,
                "memory node {} has no live owner (its process exited or closed it)",
                path.display()
            ),
            EmuError::InUse { path, pid } => {
                write!(
                    f,
                    "memory node {} is owned by live process {pid}",
                    path.display()
                )
            }
            EmuError::BadConfig(s) => write!(f, "invalid memory node configuration: {s}"),
        }
    }
}

impl std::error::Error for EmuError {}

/// The shared mapping of one node, owned or attached.
pub(crate) struct NodeMap {
    // Dropped first (explicitly, in Drop) so its thread stops before unmap.
    watchdog: Mutex<Option<Watchdog>>,
    pub(crate) id: NodeId,
    path: PathBuf,
    file: File,
    map_base: *mut u8,
    map_len: usize,
    pub(crate) header: SharedMem,
    pub(crate) host: SharedMem,
    pub(crate) dm: SharedMem,
    /// Host and device memory with their seqlock tables: what READ and
    /// WRITE use.
    host_lines: LineMem,
    dm_lines: LineMem,
    owner: bool,
    /// Serializes the owner's region-table updates.
    reg_lock: Mutex<u64>,
}

// SAFETY: all access to the mapping goes through SharedMem atomics; the raw
// base pointer is only used to unmap in Drop.
unsafe impl Send for NodeMap {}
// SAFETY: as above; the mutable parts are behind Mutexes.
unsafe impl Sync for NodeMap {}

fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

/// Where each part of a node file lies (module doc).
struct Layout {
    host_off: u64,
    dm_off: u64,
    tables_off: u64,
    /// (block lock words, line sequences) bytes for host and device memory.
    host_tables: (u64, u64),
    dm_tables: (u64, u64),
    table_bytes: u64,
    total: u64,
}

impl Layout {
    fn new(page: u64, host_bytes: u64, dm_bytes: u64) -> Layout {
        let host_off = page;
        let dm_off = host_off + round_up(host_bytes, page);
        let tables_off = dm_off + round_up(dm_bytes.max(1), page);
        let host_tables = table_bytes(host_bytes);
        let dm_tables = table_bytes(dm_bytes);
        let table_bytes = host_tables.0 + host_tables.1 + dm_tables.0 + dm_tables.1;
        Layout {
            host_off,
            dm_off,
            tables_off,
            host_tables,
            dm_tables,
            table_bytes,
            total: tables_off + round_up(table_bytes, page),
        }
    }

    /// Offsets of host blocks, host lines, device blocks, device lines.
    fn table_offs(&self) -> [u64; 4] {
        let hb = self.tables_off;
        let hl = hb + self.host_tables.0;
        let db = hl + self.host_tables.1;
        let dl = db + self.dm_tables.0;
        [hb, hl, db, dl]
    }
}

fn io_err<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(io::Error) -> EmuError + 'a {
    move |err| EmuError::Io {
        path: path.to_path_buf(),
        what,
        err,
    }
}

fn is_hugetlbfs(file: &File) -> bool {
    // SAFETY: fstatfs fills a zeroed statfs struct for a valid descriptor.
    unsafe {
        let mut s: libc::statfs = std::mem::zeroed();
        libc::fstatfs(file.as_raw_fd(), &mut s) == 0 && s.f_type as i64 == HUGETLBFS_MAGIC
    }
}

fn map_shared(file: &File, len: usize, path: &Path) -> Result<*mut u8, EmuError> {
    // SAFETY: mapping a file we opened read-write; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(EmuError::Io {
            path: path.to_path_buf(),
            what: "cannot map",
            err: io::Error::last_os_error(),
        });
    }
    Ok(p as *mut u8)
}

fn memfd(huge: bool) -> io::Result<File> {
    let name = CString::new("loch-node").expect("static name");
    let flags = libc::MFD_CLOEXEC | if huge { libc::MFD_HUGETLB } else { 0 };
    // SAFETY: a valid C string and flags; the result is checked.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us.
    Ok(unsafe { File::from_raw_fd(fd) })
}

impl NodeMap {
    fn from_file(
        file: File,
        path: PathBuf,
        id: NodeId,
        page: u64,
        host_bytes: u64,
        dm_bytes: u64,
        owner: bool,
    ) -> Result<NodeMap, EmuError> {
        let l = Layout::new(page, host_bytes, dm_bytes);
        let total = l.total;
        let base = map_shared(&file, total as usize, &path)?;
        // SAFETY: getpid has no preconditions. Nodes are not mapped across a
        // fork without exec, so the pid stays ours.
        let me = unsafe { libc::getpid() } as u32;
        let [hb, hl, db, dl] = l.table_offs();
        let window = |off: u64, len: u64| {
            assert!(
                off.is_multiple_of(8) && off + len <= total,
                "window outside the mapping"
            );
            // SAFETY: inside the mapping of `total` bytes (asserted), which
            // lives until this NodeMap is dropped; 8-byte aligned (asserted;
            // the mapping is page-aligned).
            unsafe { SharedMem::new(base.add(off as usize), len as usize) }
        };
        let (header, host, dm) = (
            window(0, page),
            window(l.host_off, host_bytes),
            window(l.dm_off, dm_bytes),
        );
        let host_lines = LineMem::new(
            window(l.host_off, host_bytes),
            window(hb, l.host_tables.0),
            window(hl, l.host_tables.1),
            me,
        );
        let dm_lines = LineMem::new(
            window(l.dm_off, dm_bytes),
            window(db, l.dm_tables.0),
            window(dl, l.dm_tables.1),
            me,
        );
        Ok(NodeMap {
            host_lines,
            dm_lines,
            watchdog: Mutex::new(None),
            id,
            path,
            file,
            map_base: base,
            map_len: total as usize,
            header,
            host,
            dm,
            owner,
            reg_lock: Mutex::new(0),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn state(&self) -> u64 {
        self.header.load_u64(HDR_STATE)
    }

    pub(crate) fn is_alive(&self) -> bool {
        self.state() == STATE_ALIVE
    }

    pub(crate) fn window(&self, space: Space) -> &SharedMem {
        match space {
            Space::Host => &self.host,
            Space::Device => &self.dm,
        }
    }

    /// The window with its line words, for READ and WRITE.
    pub(crate) fn lines(&self, space: Space) -> &LineMem {
        match space {
            Space::Host => &self.host_lines,
            Space::Device => &self.dm_lines,
        }
    }

    pub(crate) fn region_gen(&self) -> u64 {
        self.header.load_u64(HDR_REGION_GEN)
    }

    /// Reads the region table consistently (a seqlock over the generation
    /// word: even while stable, odd while the owner edits). Returns the
    /// generation the copy belongs to. The table is another process's
    /// memory: an entry that does not lie inside its window is left out
    /// (a verb to it fails as one outside every region does), and an owner
    /// that died mid-edit (odd for good) leaves `out` as it was and the
    /// odd generation returned: its verbs fail as a dead node's do. So
    /// does a generation that stays odd for [`ODD_GEN_WAIT`] while the
    /// owner reads alive (a corrupt word, or an owner stopped mid-edit):
    /// `out` stays as it was, and a later call, once the word moves,
    /// reads the table again.
    pub(crate) fn read_regions(&self, out: &mut Vec<RemoteRegion>) -> u64 {
        let mut odd_since: Option<(u64, std::time::Instant)> = None;
        loop {
            let g1 = self.region_gen();
            if g1 % 2 == 1 {
                if !self.is_alive() {
                    return g1;
                }
                match odd_since {
                    Some((g, t)) if g == g1 && t.elapsed() >= ODD_GEN_WAIT => return g1,
                    Some((g, _)) if g == g1 => {}
                    _ => odd_since = Some((g1, std::time::Instant::now())),
                }
                // An edit is a few stores; an owner descheduled mid-edit
                // gets the CPU back sooner if this thread gives it up.
                std::thread::yield_now();
                continue;
            }
            out.clear();
            for i in 0..MAX_REGIONS as u64 {
                let e = HDR_REGIONS + i * REGION_ENTRY_BYTES;
                let rkey = self.header.load_u64(e);
                if rkey == 0 {
                    continue;
                }
                let space = if self.header.load_u64(e + 8) == 1 {
                    Space::Device
                } else {
                    Space::Host
                };
                let offset = self.header.load_u64(e + 16);
                let len_acc = self.header.load_u64(e + 24);
                let window = self.window(space).len() as u64;
                if offset
                    .checked_add(len_acc >> 8)
                    .is_none_or(|end| end > window)
                {
                    continue;
                }
                out.push(RemoteRegion {
                    space,
                    offset,
                    len: len_acc >> 8,
                    rkey: RKey(rkey as u32),
                    access: Access::from_bits_truncate(len_acc as u8),
                });
            }
            if self.region_gen() == g1 {
                return g1;
            }
        }
    }
}

impl Drop for NodeMap {
    fn drop(&mut self) {
        // Stop the watchdog before the header it writes is unmapped.
        // `get_mut`, not `lock`: a poisoned lock must not leave the
        // watchdog running past the unmap below.
        drop(
            self.watchdog
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        if self.owner {
            self.header.store_u64(HDR_STATE, STATE_CLOSED);
            // Only its own file: a later owner of the same node may have
            // replaced the path with a file of its own since (`file_backing`).
            if let Backing::File(_) = self.backing() {
                if names(&self.path, &self.file) {
                    let _ = std::fs::remove_file(&self.path);
                }
            }
        }
        // SAFETY: unmapping exactly the mapping made in `from_file`; every
        // SharedMem into it belongs to this NodeMap or to holders of the Arc
        // that owns it, so none outlive this point.
        unsafe { libc::munmap(self.map_base as *mut libc::c_void, self.map_len) };
    }
}

impl NodeMap {
    fn backing(&self) -> Backing {
        if self.path.starts_with("/proc/") {
            Backing::Memfd
        } else {
            Backing::File(self.path.clone())
        }
    }
}

/// An anonymous memfd for a node of `cfg`'s size: of huge pages when
/// enough are free, else of ordinary pages (with a warning); the file,
/// its `/proc` path and its page size.
fn memfd_backing(cfg: &EmuNodeConfig) -> Result<(File, PathBuf, u64), EmuError> {
    let need = Layout::new(HUGE_PAGE, cfg.host_bytes, cfg.dm_bytes).total;
    // A hugetlb memfd only fails at fault time without reserved
    // pages, so ask the kernel whether enough are free first, then take
    // them all now: a hugetlb cgroup limit, which the free count does not
    // see, fails the allocation here rather than SIGBUS a first write.
    let huge = if crate::emu::hugepages_free() * HUGE_PAGE >= need {
        memfd(true).and_then(|f| {
            f.set_len(need)?;
            allocate(&f, need)?;
            Ok(f)
        })
    } else {
        Err(io::Error::new(
            io::ErrorKind::OutOfMemory,
            "too few free 2 MiB huge pages",
        ))
    };
    let (f, page) = match huge {
        Ok(f) => (f, HUGE_PAGE),
        // Out of descriptors, an ordinary memfd fails too: said as that,
        // not as huge pages missing.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
            return Err(io_err(Path::new("memfd"), "cannot create")(e));
        }
        Err(e) => {
            crate::pages::warn_no_huge_pages(&e);
            (
                memfd(false).map_err(io_err(Path::new("memfd"), "cannot create"))?,
                SMALL_PAGE,
            )
        }
    };
    let path = PathBuf::from(format!(
        "/proc/{}/fd/{}",
        // SAFETY: getpid has no preconditions.
        unsafe { libc::getpid() },
        f.as_raw_fd()
    ));
    Ok((f, path, page))
}

/// The node file at `path`, made anew (a file an owner that is gone left
/// there is removed first; an owner that holds its lock makes it
/// `InUse`); the file, locked, its path and its page size.
///
/// A stale file is never reused in place: processes that attached to the
/// old owner still map it, and truncating or resizing it under them would
/// kill them with SIGBUS or show them the new node's memory as the old
/// one's. Removed instead, its inode lives on for them (dead or closed),
/// and the new node is a file of its own. Each file is locked before
/// anything is decided about it, so of two processes making the same node
/// one wins and the other is told `InUse`.
fn file_backing(path: &PathBuf) -> Result<(File, PathBuf, u64), EmuError> {
    let in_use = |f: Option<&File>| EmuError::InUse {
        path: path.clone(),
        pid: f.and_then(read_owner_pid).unwrap_or(0),
    };
    // Each round creates the file, or finds it held, or removes a stale
    // one; a round can only be lost to another creator's removal, so a
    // few are plenty.
    for _ in 0..4 {
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
        {
            Ok(f) => {
                // Locked at once: another creator that found the file
                // now finds it held. If one locked it first (taking it
                // for stale), it is that creator's.
                if !lock_exclusive(&f) {
                    return Err(in_use(None));
                }
                let page = if is_hugetlbfs(&f) {
                    HUGE_PAGE
                } else {
                    SMALL_PAGE
                };
                return Ok((f, path.clone(), page));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let f = match OpenOptions::new().read(true).write(true).open(path) {
                    Ok(f) => f,
                    // Removed since: try to create it again.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(io_err(path, "cannot open")(e)),
                };
                // Refused while an owner holds it (lock_exclusive asks).
                if !lock_exclusive(&f) {
                    return Err(in_use(Some(&f)));
                }
                // Held by this process now; removed only if the path
                // still names it (another creator may have replaced it).
                if names(path, &f) {
                    log::info!("replacing stale memory node file {}", path.display());
                    match std::fs::remove_file(path) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => return Err(io_err(path, "cannot remove stale")(e)),
                    }
                }
            }
            Err(e) => return Err(io_err(path, "cannot create")(e)),
        }
    }
    Err(in_use(None))
}

/// Takes `f`'s exclusive lock without waiting on an owner; whether it did.
/// Attachers' watchdogs try the lock shared for a moment now and then
/// (`owner_holds_lock`): a refusal while nobody holds it exclusively is
/// tried again, a few times over a few milliseconds.
fn lock_exclusive(f: &File) -> bool {
    for _ in 0..50 {
        // SAFETY: flock on a descriptor `f` owns; LOCK_NB never blocks.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return true;
        }
        if owner_holds_lock(f.as_raw_fd()) {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
    false
}

/// Whether `path` names the file `f` is open on (same device and inode).
fn names(path: &Path, f: &File) -> bool {
    match (std::fs::metadata(path), f.metadata()) {
        (Ok(a), Ok(b)) => file_key(&a) == file_key(&b),
        _ => false,
    }
}

/// A memory node owned by this process.
pub struct EmuNode {
    map: Arc<NodeMap>,
    key_seed: u32,
    /// Dropped after `Drop for EmuNode` released the owner's lock.
    _owned: OwnedHere,
}

impl EmuNode {
    /// Creates the node's file, maps it and takes the owner's lock. A stale
    /// file left by a dead owner at the same path is reused.
    pub fn create(cfg: &EmuNodeConfig) -> Result<EmuNode, EmuError> {
        if cfg.host_bytes == 0 || !cfg.host_bytes.is_multiple_of(8) {
            return Err(EmuError::BadConfig(format!(
                "host memory must be a positive multiple of 8 bytes, got {}",
                cfg.host_bytes
            )));
        }
        if cfg.host_bytes > MAX_NODE_BYTES || cfg.dm_bytes > MAX_NODE_BYTES {
            return Err(EmuError::BadConfig(
                "memory larger than a 47-bit offset can address".into(),
            ));
        }
        if !cfg.dm_bytes.is_multiple_of(8) {
            return Err(EmuError::BadConfig(format!(
                "device memory must be a multiple of 8 bytes, got {}",
                cfg.dm_bytes
            )));
        }
        let (file, path, page) = match &cfg.backing {
            Backing::Memfd => memfd_backing(cfg)?,
            Backing::File(path) => file_backing(path)?,
        };
        // SAFETY: flock on our own descriptor.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(EmuError::InUse { path, pid: 0 });
        }
        let owned = OwnedHere::take(&file).map_err(io_err(&path, "cannot stat"))?;
        let layout = Layout::new(page, cfg.host_bytes, cfg.dm_bytes);
        let total = layout.total;
        file.set_len(total).map_err(io_err(&path, "cannot size"))?;
        let map = NodeMap::from_file(file, path, cfg.id, page, cfg.host_bytes, cfg.dm_bytes, true)?;
        let h = &map.header;
        h.store_u64(HDR_VERSION, LAYOUT_VERSION);
        h.store_u64(HDR_NODE_ID, cfg.id as u64);
        h.store_u64(HDR_HOST_BYTES, cfg.host_bytes);
        h.store_u64(HDR_DM_BYTES, cfg.dm_bytes);
        h.store_u64(HDR_PAGE_BYTES, page);
        h.store_u64(HDR_TABLE_BYTES, layout.table_bytes);
        // SAFETY: getpid has no preconditions.
        h.store_u64(HDR_OWNER_PID, unsafe { libc::getpid() } as u64);
        h.store_u64(HDR_REGION_GEN, 0);
        for i in 0..MAX_REGIONS as u64 {
            h.store_u64(HDR_REGIONS + i * REGION_ENTRY_BYTES, 0);
        }
        h.store_u64(HDR_STATE, STATE_ALIVE);
        // The magic goes last (Release): an attacher that sees it sees the rest.
        h.store_u64(HDR_MAGIC, MAGIC);
        Ok(EmuNode {
            map: Arc::new(map),
            key_seed: random_u32() | 1,
            _owned: owned,
        })
    }

    pub fn id(&self) -> NodeId {
        self.map.id
    }

    /// Reserves the whole backing file (`posix_fallocate`), so that memory
    /// its file system cannot hold (a `/dev/shm` smaller than the node)
    /// is an error here rather than a SIGBUS at the first write past what
    /// it held. For a node that must hold all it exports; without it the
    /// memory is taken as it is first touched.
    pub fn reserve(&self) -> Result<(), EmuError> {
        let path = self.map.path();
        let len = self
            .map
            .file
            .metadata()
            .map_err(io_err(path, "cannot size"))?
            .len();
        allocate(&self.map.file, len).map_err(io_err(path, "cannot reserve"))
    }

    /// The path other processes attach with.
    pub fn path(&self) -> &Path {
        self.map.path()
    }

    /// The owner's own CPU view of its host memory (FaRM's receivers poll
    /// their rings through it).
    ///
    /// Borrowed: the view cannot outlive the node, whose drop unmaps the
    /// memory, nor be copied out of it.
    ///
    /// ```compile_fail,E0505
    /// use nicdrv::emu::{Backing, EmuNode, EmuNodeConfig};
    /// let cfg = EmuNodeConfig { id: 0, host_bytes: 4096, dm_bytes: 4096, backing: Backing::Memfd };
    /// let node = EmuNode::create(&cfg).unwrap();
    /// let host = node.host();
    /// drop(node);
    /// host.load_u64(0); // a read of unmapped memory, were it allowed
    /// ```
    ///
    /// ```compile_fail,E0507
    /// use nicdrv::emu::{Backing, EmuNode, EmuNodeConfig};
    /// let cfg = EmuNodeConfig { id: 0, host_bytes: 4096, dm_bytes: 4096, backing: Backing::Memfd };
    /// let node = EmuNode::create(&cfg).unwrap();
    /// let host = *node.host(); // a copy would outlive the node
    /// ```
    pub fn host(&self) -> &SharedMem {
        &self.map.host
    }

    /// The owner's own CPU view of its device memory.
    pub fn device(&self) -> &SharedMem {
        &self.map.dm
    }

    /// The endpoint in-process queue pairs connect to.
    pub fn endpoint(&self) -> EmuEndpoint {
        EmuEndpoint {
            map: self.map.clone(),
        }
    }

    /// Registers `[offset, offset+len)` of `space` for remote access
    /// (`ibv_reg_mr`, or `ibv_reg_dm_mr` for device memory).
    pub fn register(
        &self,
        space: Space,
        offset: u64,
        len: u64,
        access: Access,
    ) -> Result<RKey, RegError> {
        if len == 0 {
            return Err(RegError::Empty);
        }
        if !self.map.window(space).in_bounds(offset, len) {
            return Err(RegError::TooLarge { len });
        }
        let mut counter = self.map.reg_lock.lock().unwrap_or_else(|p| p.into_inner());
        let h = &self.map.header;
        let slot = (0..MAX_REGIONS as u64)
            .map(|i| HDR_REGIONS + i * REGION_ENTRY_BYTES)
            .find(|&e| h.load_u64(e) == 0)
            .ok_or(RegError::TooManyRegions)?;
        *counter += 1;
        // Keys are unguessable-ish and never 0 (0 marks a free entry).
        let rkey = (self.key_seed ^ (*counter as u32).wrapping_mul(0x9E37_79B9)) | 1;
        let gen = h.load_u64(HDR_REGION_GEN);
        h.store_u64(HDR_REGION_GEN, gen + 1); // odd: editing
        h.store_u64(slot + 8, space as u64);
        h.store_u64(slot + 16, offset);
        h.store_u64(slot + 24, (len << 8) | access.bits() as u64);
        h.store_u64(slot, rkey as u64);
        h.store_u64(HDR_REGION_GEN, gen + 2);
        Ok(RKey(rkey))
    }

    /// Registers the whole host memory and the whole device memory with every
    /// remote right, as a memory node does at boot. Returns (host, dm) keys;
    /// the dm key is `None` when the node has no device memory.
    pub fn register_all(&self) -> Result<(RKey, Option<RKey>), RegError> {
        let host = self.register(
            Space::Host,
            0,
            self.map.host.len() as u64,
            Access::REMOTE_ALL,
        )?;
        let dm = if self.map.dm.is_empty() {
            None
        } else {
            Some(self.register(
                Space::Device,
                0,
                self.map.dm.len() as u64,
                Access::REMOTE_ALL,
            )?)
        };
        Ok((host, dm))
    }

    /// Removes a registration; later verbs with this key fail.
    pub fn deregister(&self, rkey: RKey) -> bool {
        let _g = self.map.reg_lock.lock().unwrap_or_else(|p| p.into_inner());
        let h = &self.map.header;
        for i in 0..MAX_REGIONS as u64 {
            let e = HDR_REGIONS + i * REGION_ENTRY_BYTES;
            if h.load_u64(e) == rkey.0 as u64 {
                let gen = h.load_u64(HDR_REGION_GEN);
                h.store_u64(HDR_REGION_GEN, gen + 1);
                h.store_u64(e, 0);
                h.store_u64(HDR_REGION_GEN, gen + 2);
                return true;
            }
        }
        false
    }
}

impl Drop for EmuNode {
    fn drop(&mut self) {
        // Closing is visible to attachers at once, even if in-process
        // endpoints keep the mapping alive; release the owner's lock too.
        self.map.header.store_u64(HDR_STATE, STATE_CLOSED);
        // SAFETY: flock on our own descriptor.
        unsafe { libc::flock(self.map.file.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// The files (device and inode) the nodes of this process own: how an
/// attacher tells a node of its own process from a header that only names
/// its pid.
static OWNED_HERE: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

/// A node file counted in [`OWNED_HERE`] while this lives (the node's
/// lifetime: dropped with it, after its lock is released).
struct OwnedHere((u64, u64));

impl OwnedHere {
    fn take(file: &File) -> io::Result<OwnedHere> {
        let key = file_key(&file.metadata()?);
        OWNED_HERE
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(key);
        Ok(OwnedHere(key))
    }
}

impl Drop for OwnedHere {
    fn drop(&mut self) {
        let mut owned = OWNED_HERE.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = owned.iter().position(|&k| k == self.0) {
            owned.swap_remove(i);
        }
    }
}

/// Allocates the first `len` bytes of `f` (`posix_fallocate`): memory its
/// file system cannot hold is an error now, not a SIGBUS at first touch.
fn allocate(f: &File, len: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "past a file offset"))?;
    // SAFETY: posix_fallocate on a descriptor the caller holds open, with
    // integer arguments: it touches no memory of ours.
    match unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, len) } {
        0 => Ok(()),
        rc => Err(io::Error::from_raw_os_error(rc)),
    }
}

fn file_key(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

/// True when a node of this process owns the file `meta` describes.
fn owned_here(meta: &std::fs::Metadata) -> bool {
    let key = file_key(meta);
    OWNED_HERE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&key)
}

fn read_owner_pid(f: &File) -> Option<u64> {
    let mut buf = [0u8; 8];
    std::os::unix::fs::FileExt::read_exact_at(f, &mut buf, HDR_OWNER_PID).ok()?;
    Some(u64::from_le_bytes(buf))
}

fn random_u32() -> u32 {
    let mut v = 0u32;
    // SAFETY: getrandom writes at most 4 bytes into `v`.
    let n = unsafe { libc::getrandom(&mut v as *mut u32 as *mut libc::c_void, 4, 0) };
    if n != 4 {
        // Not a security boundary in emu (files are 0600): time will do.
        v = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0x5a5a_5a5a);
    }
    v
}

/// A memory node a queue pair can connect to: owned by this process, or
/// attached by path from another.
#[derive(Clone)]
pub struct EmuEndpoint {
    pub(crate) map: Arc<NodeMap>,
}

impl fmt::Debug for EmuEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "EmuEndpoint(node {} at {})",
            self.map.id,
            self.map.path().display()
        )
    }
}

impl EmuEndpoint {
    /// Attaches to a node created by any process of this user.
    pub fn attach(path: impl AsRef<Path>) -> Result<EmuEndpoint, EmuError> {
        let path = path.as_ref();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io_err(path, "cannot open memory node"))?;
        let not_node = |why: String| EmuError::NotALochNode {
            path: path.to_path_buf(),
            why,
        };
        let meta = file.metadata().map_err(io_err(path, "cannot stat"))?;
        let file_len = meta.len();
        let page = if is_hugetlbfs(&file) {
            HUGE_PAGE
        } else {
            SMALL_PAGE
        };
        if file_len < page {
            return Err(not_node(format!(
                "file is {file_len} bytes, smaller than a header"
            )));
        }
        // Map the header alone first to learn the sizes.
        let hdr_base = map_shared(&file, page as usize, path)?;
        // SAFETY: the header mapping is `page` bytes, page-aligned; unmapped
        // below before anything else can use it.
        let hdr = unsafe { SharedMem::new(hdr_base, page as usize) };
        let fields = (
            hdr.load_u64(HDR_MAGIC),
            hdr.load_u64(HDR_VERSION),
            hdr.load_u64(HDR_NODE_ID),
            hdr.load_u64(HDR_HOST_BYTES),
            hdr.load_u64(HDR_DM_BYTES),
            hdr.load_u64(HDR_PAGE_BYTES),
            hdr.load_u64(HDR_OWNER_PID),
            hdr.load_u64(HDR_STATE),
            hdr.load_u64(HDR_TABLE_BYTES),
        );
        // SAFETY: unmapping the header mapping made just above.
        unsafe { libc::munmap(hdr_base as *mut libc::c_void, page as usize) };
        let (magic, version, id, host, dm, hdr_page, pid, state, tables) = fields;
        if magic != MAGIC {
            return Err(not_node("bad magic".into()));
        }
        if version != LAYOUT_VERSION {
            return Err(not_node(format!(
                "layout version {version}, expected {LAYOUT_VERSION}"
            )));
        }
        if hdr_page != page
            || id > NodeId::MAX as u64
            || host == 0
            || host > MAX_NODE_BYTES
            || dm > MAX_NODE_BYTES
        {
            return Err(not_node("corrupt header fields".into()));
        }
        let layout = Layout::new(page, host, dm);
        if tables != layout.table_bytes {
            return Err(not_node(format!(
                "{tables} bytes of seqlock tables, its memory sizes need {}",
                layout.table_bytes
            )));
        }
        let need = layout.total;
        if file_len < need {
            return Err(not_node(format!(
                "file is {file_len} bytes, header says {need}"
            )));
        }
        // Open a pidfd before checking the lock, so a recycled pid cannot
        // fool the watchdog: if the owner died before this point the lock
        // check below catches it.
        // SAFETY: getpid has no preconditions.
        let our_pid = pid == unsafe { libc::getpid() } as u64;
        // A node of this process needs no watchdog (its owner dies with
        // us). A header that names our pid for a file no node here owns
        // (an owner in another pid namespace, a header written wrong) is
        // watched by its lock alone: a pidfd of our own pid never fires.
        let same_process = our_pid && owned_here(&meta);
        let pidfd = if our_pid {
            None
        } else {
            pidfd_open(pid as i32)
        };
        if state != STATE_ALIVE || !owner_holds_lock(file.as_raw_fd()) {
            return Err(EmuError::NodeDead {
                path: path.to_path_buf(),
            });
        }
        let lock_fd = file.as_raw_fd();
        let map = NodeMap::from_file(
            file,
            path.to_path_buf(),
            id as NodeId,
            page,
            host,
            dm,
            false,
        )?;
        if !same_process {
            // SAFETY: the map drops its watchdog before it unmaps (Drop).
            let header = unsafe { map.header.alias() };
            let wd = Watchdog::start(pidfd, lock_fd, header, HDR_STATE)
                .map_err(io_err(path, "cannot start watchdog for"))?;
            *map.watchdog.lock().unwrap_or_else(|p| p.into_inner()) = Some(wd);
        }
        Ok(EmuEndpoint { map: Arc::new(map) })
    }

    pub fn node(&self) -> NodeId {
        self.map.id
    }

    /// False once the owner closed the node or its death was noticed.
    pub fn is_alive(&self) -> bool {
        self.map.is_alive()
    }

    /// True once the owner's death was noticed (as opposed to a clean close).
    pub fn owner_died(&self) -> bool {
        self.map.state() == STATE_DEAD
    }

    /// The node's regions as registered now.
    pub fn regions(&self) -> Vec<RemoteRegion> {
        let mut v = Vec::with_capacity(MAX_REGIONS);
        self.map.read_regions(&mut v);
        v
    }

    pub fn host_bytes(&self) -> u64 {
        self.map.host.len() as u64
    }

    pub fn dm_bytes(&self) -> u64 {
        self.map.dm.len() as u64
    }
}
