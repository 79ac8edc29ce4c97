//! # mempool — memory for Loch's cores and memory nodes
//!
//! Owns the memory Loch allocates: huge-page mappings and
//! the locked-memory check ([`huge`]), a core's registered scratch region
//! sized from its executor config ([`core_pool`]), the map of well-known
//! words at the start of every memory node ([`layout`]), and the remote
//! chunk allocator that hands out memory-node memory with one-sided FAAs and
//! no memory-node CPU ([`chunk`]).
//!
//! Promises: everything here is sized at start; the data path allocates
//! nothing locally (a remote allocation is a bump, and one FAA round trip
//! per chunk); failures are values with sentences that say what to change.

pub mod chunk;
pub mod core_pool;
pub mod huge;
pub mod layout;

pub use chunk::{AllocError, ChunkConfig, RemoteAllocator, DEFAULT_CHUNK_BYTES, MIN_ALIGN};
pub use core_pool::CorePool;
pub use huge::{check_memlock, memlock_limit, HugeMem, HUGE_PAGE_BYTES};
pub use layout::{
    first_chunk_off, CHUNK_ALIGN, CHUNK_CURSOR_OFF, NULL_WORD_OFF, SUPERBLOCK_BYTES, TREE_ROOT_OFF,
    VERB_COUNTER_OFF,
};

use std::fmt;
use std::io;

/// Why local memory could not be made or registered.
#[derive(Debug)]
pub enum MemError {
    /// A request for zero bytes.
    ZeroBytes,
    /// A size so large that rounding it to whole pages overflows.
    TooLarge { bytes: usize },
    /// The kernel refused even an ordinary-page mapping.
    Mmap { bytes: usize, err: io::Error },
    /// `RLIMIT_MEMLOCK` is below what the NIC must pin.
    MemlockTooLow { need_bytes: u64, limit_bytes: u64 },
    /// The NIC refused to register the memory.
    Register(nicdrv::nic::RegError),
    /// Sizes from configuration that cannot be met.
    BadConfig(String),
}

impl fmt::Display for MemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemError::ZeroBytes => write!(f, "cannot allocate 0 bytes of memory"),
            MemError::TooLarge { bytes } => write!(
                f,
                "cannot allocate {bytes} bytes: rounding up to whole pages overflows"
            ),
            MemError::Mmap { bytes, err } => write!(
                f,
                "the kernel refused to map {bytes} bytes of memory ({err}); \
                 free memory or ask for less"
            ),
            MemError::MemlockTooLow {
                need_bytes,
                limit_bytes,
            } => write!(
                f,
                "the NIC must lock {need_bytes} bytes of memory but the locked-memory limit \
                 (RLIMIT_MEMLOCK) is {limit_bytes} bytes; raise it with `ulimit -l unlimited` \
                 before starting, or with a line such as `* - memlock unlimited` in \
                 /etc/security/limits.conf (LimitMEMLOCK=infinity for a systemd service)"
            ),
            MemError::Register(e) => write!(f, "cannot register memory with the NIC: {e}"),
            MemError::BadConfig(s) => write!(f, "invalid memory configuration: {s}"),
        }
    }
}

impl std::error::Error for MemError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            MemError::Mmap { err, .. } => Some(err),
            MemError::Register(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_sentences_with_the_fix() {
        let e = MemError::MemlockTooLow {
            need_bytes: 1 << 30,
            limit_bytes: 8 << 20,
        };
        let s = e.to_string();
        assert!(s.contains("ulimit -l unlimited"), "{s}");
        assert!(s.contains("limits.conf"), "{s}");
        assert!(s.contains(&(1u64 << 30).to_string()), "{s}");
        assert!(!MemError::ZeroBytes.to_string().is_empty());
    }
}
