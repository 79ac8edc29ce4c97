//! A cheap monotonic nanosecond clock for executors, which read the time
//! once per turn.
//!
//! On x86-64 machines whose time-stamp counter is invariant (`constant_tsc`
//! and `nonstop_tsc` in /proc/cpuinfo), it reads the TSC (`rdtsc`, a few ns)
//! and scales it by a rate calibrated against `Instant` at first use.
//! Elsewhere it falls back to `Instant` (a vDSO call, ~20–30 ns).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

struct Calib {
    epoch: Instant,
    /// TSC at `epoch` and nanoseconds per tick as a 32.32 fixed-point
    /// number; `None` when the TSC is not usable.
    tsc: Option<(u64, u64)>,
}

static CALIB: OnceLock<Calib> = OnceLock::new();

#[cfg(target_arch = "x86_64")]
fn rdtsc() -> u64 {
    // SAFETY: rdtsc has no preconditions; it reads a counter register.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(target_arch = "x86_64")]
fn tsc_invariant() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("flags"))
            .is_some_and(|l| l.contains(" constant_tsc") && l.contains(" nonstop_tsc"))
    })
}

fn calibrate() -> Calib {
    let epoch = Instant::now();
    #[cfg(target_arch = "x86_64")]
    if tsc_invariant() {
        let (t0, i0) = paired();
        std::thread::sleep(Duration::from_millis(10));
        let (t1, i1) = paired();
        let ns = (i1 - i0).as_nanos() as u64;
        let ticks = t1.wrapping_sub(t0);
        if ticks > 0 && ns > 0 {
            let ns_per_tick_fp = ((ns as u128) << 32) / ticks as u128;
            // Re-anchor: TSC value at `epoch`, extrapolated back.
            let tsc_at_epoch =
                t0.wrapping_sub((((i0 - epoch).as_nanos() << 32) / ns_per_tick_fp.max(1)) as u64);
            return Calib {
                epoch,
                tsc: Some((tsc_at_epoch, ns_per_tick_fp as u64)),
            };
        }
    }
    let _ = Duration::ZERO;
    Calib { epoch, tsc: None }
}

/// A TSC reading and the `Instant` it was taken at, read between two
/// `Instant`s close together: a thread preempted between the two clocks'
/// reads (a loaded machine) would skew the calibrated rate, and with it
/// every emulated delay, by as long as it was away.
#[cfg(target_arch = "x86_64")]
fn paired() -> (u64, Instant) {
    let mut best: Option<(Duration, u64, Instant)> = None;
    for _ in 0..16 {
        let a = Instant::now();
        let t = rdtsc();
        let b = Instant::now();
        let gap = b - a;
        if best.is_none_or(|(g, ..)| gap < g) {
            best = Some((gap, t, a + gap / 2));
        }
        if gap < Duration::from_micros(1) {
            break;
        }
    }
    let (_, t, at) = best.expect("sixteen tries");
    (t, at)
}

/// Nanoseconds since the first call in this process.
pub fn now_ns() -> u64 {
    let c = CALIB.get_or_init(calibrate);
    #[cfg(target_arch = "x86_64")]
    if let Some((base, ns_per_tick_fp)) = c.tsc {
        let ticks = rdtsc().wrapping_sub(base);
        return ((ticks as u128 * ns_per_tick_fp as u128) >> 32) as u64;
    }
    c.epoch.elapsed().as_nanos() as u64
}

/// Unix time in ns (comparable across processes on this host; 0 if the
/// clock is before 1970).
pub fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn tracks_the_wall_clock() {
        let a = super::now_ns();
        let i = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let b = super::now_ns();
        let wall = i.elapsed().as_nanos() as i64;
        let ours = (b - a) as i64;
        assert!(ours > 0, "clock went backwards");
        // Within 2 % of Instant over 50 ms.
        assert!(
            (ours - wall).abs() < wall / 50 + 200_000,
            "ours {ours} ns vs wall {wall} ns"
        );
    }
}
