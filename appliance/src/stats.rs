//! Run statistics shared by the demo and the benchmarks: a latency
//! histogram per core, merged at the end, and the verb counters.

use hdrhistogram::Histogram;
use nicdrv::VerbCounters;
use std::cell::{Cell, RefCell};

/// Latencies from 1 ns to 100 s at 3 significant digits.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("static bounds are valid")
}

/// What the tasks of one `loch node` core count of their operations,
/// whatever the workload (one thread, so `Cell`s).
pub struct OpTally {
    pub hist: RefCell<Histogram<u64>>,
    /// Latencies since the last per-second report.
    pub interval: RefCell<Histogram<u64>>,
    pub ops: Cell<u64>,
    pub mismatches: Cell<u64>,
    /// Wall-clock (Unix) ns of the first operation, 0 before it.
    pub first_op_unix_ns: Cell<u64>,
}

impl Default for OpTally {
    fn default() -> Self {
        OpTally {
            hist: RefCell::new(latency_histogram()),
            interval: RefCell::new(latency_histogram()),
            ops: Cell::new(0),
            mismatches: Cell::new(0),
            first_op_unix_ns: Cell::new(0),
        }
    }
}

impl OpTally {
    /// An operation that succeeded after `latency_ns` (at least 1 counts).
    pub fn done(&self, latency_ns: u64) {
        let lat = latency_ns.max(1);
        let _ = self.hist.borrow_mut().record(lat);
        let _ = self.interval.borrow_mut().record(lat);
        if self.first_op_unix_ns.get() == 0 {
            self.first_op_unix_ns.set(nicdrv::clock::unix_ns());
        }
        self.ops.set(self.ops.get() + 1);
    }

    /// A read that did not return what it must have.
    pub fn mismatch(&self) {
        self.mismatches.set(self.mismatches.get() + 1);
    }
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
    fn a_tally_counts_operations_and_keeps_the_first_time() {
        let t = OpTally::default();
        t.done(0);
        let first = t.first_op_unix_ns.get();
        assert!(first > 0);
        std::thread::sleep(std::time::Duration::from_millis(2));
        t.done(500);
        t.mismatch();
        assert_eq!((t.ops.get(), t.mismatches.get()), (2, 1));
        assert_eq!(t.first_op_unix_ns.get(), first, "the first stays");
        let h = t.hist.borrow();
        assert_eq!((h.len(), h.min()), (2, 1), "a zero latency counts as 1 ns");
        assert_eq!(t.interval.borrow().len(), 2);
    }
}
