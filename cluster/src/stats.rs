//! Run statistics: a latency histogram per core (or per simulated world),
//! merged at the end, and the verb counters.

use hdrhistogram::Histogram;
use nicdrv::VerbCounters;

/// Latencies from 1 ns to 100 s at 3 significant digits.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("static bounds are valid")
}

/// What one core measured.
pub struct CoreStats {
    pub ops: u64,
    pub latency_ns: Histogram<u64>,
    pub counters: VerbCounters,
}

/// Totals over all cores.
pub struct RunStats {
    pub ops: u64,
    pub elapsed_ns: u64,
    pub threads: usize,
    pub latency_ns: Histogram<u64>,
    pub counters: VerbCounters,
}

impl RunStats {
    pub fn merge(cores: Vec<CoreStats>, elapsed_ns: u64) -> RunStats {
        let mut latency_ns = latency_histogram();
        let mut counters = VerbCounters::default();
        let mut ops = 0;
        let threads = cores.len();
        for c in cores {
            ops += c.ops;
            counters += c.counters;
            latency_ns.add(&c.latency_ns).expect("same bounds");
        }
        RunStats {
            ops,
            elapsed_ns,
            threads,
            latency_ns,
            counters,
        }
    }

    pub fn ops_per_sec(&self) -> f64 {
        if self.elapsed_ns == 0 {
            0.0
        } else {
            self.ops as f64 * 1e9 / self.elapsed_ns as f64
        }
    }

    /// CPU nanoseconds per operation: every core busy-polls for the whole
    /// run, so this is wall time × cores / operations.
    pub fn cpu_ns_per_op(&self) -> f64 {
        cpu_ns_per_op(self.elapsed_ns, self.threads, self.ops)
    }

    pub fn per_op(&self, v: u64) -> f64 {
        if self.ops == 0 {
            0.0
        } else {
            v as f64 / self.ops as f64
        }
    }
}

/// The CPU time a run used per operation (ns), from the wall time of
/// `threads` busy-polling cores: each pinned core spins for the whole run.
pub fn cpu_ns_per_op(elapsed_ns: u64, threads: usize, ops: u64) -> f64 {
    if ops == 0 {
        return 0.0;
    }
    elapsed_ns as f64 * threads as f64 / ops as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_stats_add_up_and_divide_by_time() {
        let core = |ops, lat| {
            let mut h = latency_histogram();
            h.record(lat).unwrap();
            CoreStats {
                ops,
                latency_ns: h,
                counters: VerbCounters::default(),
            }
        };
        let s = RunStats::merge(vec![core(300, 10), core(700, 1000)], 2_000_000_000);
        assert_eq!((s.ops, s.threads, s.latency_ns.len()), (1000, 2, 2));
        assert_eq!(s.ops_per_sec(), 500.0);
        assert_eq!(s.cpu_ns_per_op(), 4_000_000.0);
        assert_eq!(s.per_op(2000), 2.0);
        let empty = RunStats::merge(Vec::new(), 0);
        assert_eq!((empty.ops_per_sec(), empty.cpu_ns_per_op()), (0.0, 0.0));
    }
}
