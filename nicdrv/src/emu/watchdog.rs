//! Notices when the process that owns an attached memory node dies.
//!
//! The owner holds an exclusive `flock` on the node file for as long as it
//! lives, and the kernel drops that lock when the process dies, however it
//! dies. A watchdog thread per attached node waits on a pidfd of the owner
//! (or, where pidfds are unavailable, tries the lock every 2 ms) and then
//! flips the node's shared state word from ALIVE to DEAD. Every queue pair
//! checks that word before it touches the node, so verbs posted after the
//! death was noticed complete with `RetryExceeded` instead of reading stale
//! memory. The data path pays one atomic load; the watchdog sleeps in the
//! kernel and costs nothing until it fires.

use super::shm::SharedMem;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::thread::JoinHandle;

pub(crate) const STATE_ALIVE: u64 = 1;
pub(crate) const STATE_CLOSED: u64 = 2;
pub(crate) const STATE_DEAD: u64 = 3;

/// True if some process holds the node file's exclusive lock.
pub(crate) fn owner_holds_lock(fd: RawFd) -> bool {
    // SAFETY: flock on a valid descriptor; LOCK_NB never blocks.
    let r = unsafe { libc::flock(fd, libc::LOCK_SH | libc::LOCK_NB) };
    if r == 0 {
        // We got the lock, so nobody holds it exclusively: release ours.
        // SAFETY: as above.
        unsafe { libc::flock(fd, libc::LOCK_UN) };
        false
    } else {
        true
    }
}

/// Opens a pidfd for `pid`, or `None` where the kernel has no pidfd_open.
pub(crate) fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: a plain syscall with integer arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        None
    } else {
        // SAFETY: the kernel just returned this descriptor to us.
        Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
    }
}

pub(crate) struct Watchdog {
    cancel: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

struct SendPtr(SharedMem, RawFd);

impl Watchdog {
    /// Starts watching. `header` must stay mapped and `lock_fd` open until
    /// the watchdog is dropped (the node map drops it before unmapping).
    pub(crate) fn start(
        pidfd: Option<OwnedFd>,
        lock_fd: RawFd,
        header: SharedMem,
        state_off: u64,
    ) -> io::Result<Watchdog> {
        // SAFETY: eventfd with valid flags.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this descriptor to us.
        let cancel = unsafe { OwnedFd::from_raw_fd(efd) };
        let cancel_fd = cancel.as_raw_fd();
        let ctx = SendPtr(header, lock_fd);
        let thread = std::thread::Builder::new()
            .name("loch-node-watchdog".into())
            .spawn(move || {
                let SendPtr(header, lock_fd) = ctx;
                if wait_for_death(pidfd, lock_fd, cancel_fd) {
                    let prev = header.cas_u64(state_off, STATE_ALIVE, STATE_DEAD);
                    if prev == STATE_ALIVE {
                        log::warn!("memory node owner died; verbs to it now fail");
                    }
                }
            })?;
        Ok(Watchdog {
            cancel,
            thread: Some(thread),
        })
    }
}

/// Blocks until the owner dies (true) or we are cancelled (false).
fn wait_for_death(pidfd: Option<OwnedFd>, lock_fd: RawFd, cancel_fd: RawFd) -> bool {
    loop {
        let mut fds = [
            libc::pollfd {
                fd: cancel_fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: pidfd.as_ref().map_or(-1, |p| p.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // With a pidfd the lock is tried too, now and then: the pid came
        // from the node's header, which another process wrote, and a
        // wrong one (another live process) would never say the owner died.
        let timeout_ms = if pidfd.is_some() { 100 } else { 2 };
        // SAFETY: `fds` is a valid array of two pollfds; a negative fd is
        // ignored by poll.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        if r < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return false;
        }
        if fds[0].revents != 0 {
            return false;
        }
        if pidfd.is_some() && fds[1].revents != 0 {
            return true;
        }
        if (pidfd.is_none() || r == 0) && !owner_holds_lock(lock_fd) {
            return true;
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a valid u64 to our eventfd.
        unsafe {
            libc::write(
                self.cancel.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
