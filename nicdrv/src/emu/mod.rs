//! The `emu` backend: real shared memory, across threads and processes, on
//! one host.
//!
//! Memory nodes are files mapped `MAP_SHARED` ([`EmuNode`]); compute cores
//! connect queue pairs to them ([`EmuEndpoint`]). A verb executes in the
//! posting thread, inside `post_send`, against the mapping, through atomic
//! operations only ([`shm`]), each 64-byte line of a READ or WRITE whole
//! under a seqlock ([`lines`]); its completion is queued on the completion
//! queue at once, or — with latency and bandwidth injection — becomes
//! visible to `poll` only after the modelled delay. Dead owners are noticed
//! by the `watchdog` module (a thread per attaching process, on a pidfd).

pub mod lines;
mod node;
mod qp;
pub mod shm;
mod watchdog;

pub use node::{Backing, EmuEndpoint, EmuError, EmuNode, EmuNodeConfig, MAX_REGIONS};
pub use qp::{EmuCq, EmuNic, EmuPreparedQp, EmuQp, EmuReg};

/// Options of the emu device.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct EmuConfig {
    /// Injected one-way latency; a verb completes after two of these plus
    /// its transfer time. 0 (the default) disables injection.
    pub latency_ns_one_way: u64,
    /// Injected per-queue-pair bandwidth; 0 means unlimited.
    pub bandwidth_bytes_per_sec: u64,
    /// Largest inline WRITE (ConnectX-5 reports a little over 200 bytes).
    pub max_inline_bytes: u32,
    /// Largest READ or WRITE.
    pub max_msg_bytes: u32,
    /// Largest send queue a queue pair may be created with.
    pub max_send_wr: u32,
    /// Largest completion queue.
    pub max_cqe: u32,
    /// Whether masked CAS is offered (real ConnectX NICs offer it through
    /// experimental verbs; switching it off tests the `Unsupported` path).
    pub masked_cas: bool,
}

impl Default for EmuConfig {
    fn default() -> Self {
        EmuConfig {
            latency_ns_one_way: 0,
            bandwidth_bytes_per_sec: 0,
            max_inline_bytes: 220,
            max_msg_bytes: 1 << 30,
            max_send_wr: 16 * 1024,
            max_cqe: 1 << 20,
            masked_cas: true,
        }
    }
}

/// The longest one-way latency a front end lets a user inject: a second,
/// far past any network's, and short enough that a run stopped by a
/// signal (which waits for its verbs in flight) still ends within
/// seconds. The emulated NIC itself saturates (a latency past u64's
/// nanoseconds never completes).
pub const MAX_LATENCY_NS: u64 = 1_000_000_000;

/// Checks a one-way latency a user asked to inject against
/// [`MAX_LATENCY_NS`]; the error reads after the flag's name.
pub fn check_latency(ns: u64) -> Result<(), String> {
    if ns > MAX_LATENCY_NS {
        return Err(format!(
            "must be at most {MAX_LATENCY_NS} (a second), got {ns}"
        ));
    }
    Ok(())
}

impl EmuConfig {
    pub fn injects_delay(&self) -> bool {
        self.latency_ns_one_way != 0 || self.bandwidth_bytes_per_sec != 0
    }
}

/// Free 2 MiB huge pages, from /proc/meminfo (0 if unknown).
pub fn hugepages_free() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("HugePages_Free:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}
