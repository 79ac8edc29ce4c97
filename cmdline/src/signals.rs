//! SIGINT and SIGTERM as a flag: `loch` and `loch-bench` install the
//! handler once and their loops poll [`stop_requested`]. No async runtime, no self-pipe: every
//! loop that waits already wakes at least every 50 ms.

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::Relaxed);
}

/// Installs the handler for SIGINT and SIGTERM. Returns false if the kernel
/// refused (the process then dies on the signal, as by default).
pub fn install() -> bool {
    let mut ok = true;
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction with a valid handler and an empty mask
        // is a valid argument; the handler only stores to an atomic.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = libc::SA_RESTART;
            ok &= libc::sigaction(sig, &sa, std::ptr::null_mut()) == 0;
        }
    }
    ok
}

/// Whether SIGINT or SIGTERM arrived (or [`request_stop`] was called).
pub fn stop_requested() -> bool {
    // Relaxed: the flag carries no data; a stale read only delays the stop
    // by one loop iteration.
    STOP.load(Ordering::Relaxed)
}

/// Asks every loop to stop, as a signal would.
pub fn request_stop() {
    STOP.store(true, Ordering::Relaxed);
}
