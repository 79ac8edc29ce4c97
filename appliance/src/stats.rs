//! What the tasks of one `loch node` core count of their operations.

use cluster::stats::latency_histogram;
use hdrhistogram::Histogram;
use std::cell::{Cell, RefCell};

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
