//! Completion queues (`ibv_create_cq`, `ibv_poll_cq`) and the per-QP record
//! of posted requests that turns a raw `ibv_wc` into the contract's
//! [`Completion`].
//!
//! Every request goes to the NIC with our own sequence number as its
//! `wr_id`; the QP's ring maps it back to the caller's `wr_id`, opcode and
//! length. A completion for sequence `s` retires every request of that QP up
//! to `s` (unsignaled ones complete silently before it), which is exact
//! because one QP's completions arrive in posting order (IBA 10.8.6). Error
//! completions carry an undefined opcode in verbs; the ring supplies it.

use super::device::Device;
use super::status::wc_status;
use super::Mlx5Error;
use crate::nic::{CompletionQueue, CqId, QpState};
use crate::verbs::{Completion, Opcode, WcStatus};
use rdma_sys::*;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

/// Most `ibv_wc` taken in one `ibv_poll_cq` call.
const POLL_BATCH: usize = 64;

#[derive(Copy, Clone, Debug)]
pub(crate) struct Posted {
    pub(crate) wr_id: u64,
    pub(crate) opcode: Opcode,
    pub(crate) len: u32,
}

/// What a QP and the CQ it completes on share.
pub(crate) struct QpShared {
    pub(crate) qp_num: u32,
    pub(crate) ring: RefCell<Box<[Posted]>>,
    /// Sequence number of the next request to post.
    pub(crate) head: Cell<u64>,
    /// Oldest sequence number not yet retired by a polled completion.
    pub(crate) tail: Cell<u64>,
    pub(crate) state: Cell<QpState>,
    /// The first error status since the QP was last ready.
    pub(crate) first_error: Cell<Option<WcStatus>>,
}

impl QpShared {
    pub(crate) fn new(qp_num: u32, depth: u32) -> QpShared {
        let empty = Posted {
            wr_id: 0,
            opcode: Opcode::Read,
            len: 0,
        };
        QpShared {
            qp_num,
            ring: RefCell::new(vec![empty; depth as usize].into_boxed_slice()),
            head: Cell::new(0),
            tail: Cell::new(0),
            state: Cell::new(QpState::Ready),
            first_error: Cell::new(None),
        }
    }

    pub(crate) fn outstanding(&self) -> u32 {
        (self.head.get() - self.tail.get()) as u32
    }

    /// Records the drain of a batch the driver took only in part: `taken`
    /// requests from `head` on are on the send queue, the rest refused.
    /// The drain goes in right behind them carrying `last` (the batch's
    /// last request), so its flush retires them all and completes the
    /// batch for the caller; the QP is in error from here on (no post
    /// until it recovered, once the drain's completion is polled).
    /// Returns the drain's sequence number.
    pub(crate) fn stage_drain(&self, head: u64, taken: u64, last: Posted) -> u64 {
        let seq = head + taken;
        let mut ring = self.ring.borrow_mut();
        let cap = ring.len() as u64;
        assert!(
            seq - self.tail.get() < cap,
            "the drain fits the batch's room"
        );
        ring[(seq % cap) as usize] = last;
        self.head.set(seq + 1);
        self.state.set(QpState::Error);
        seq
    }

    /// Retires requests up to sequence `seq` and builds the completion.
    /// Returns `None` for a sequence not in flight (a completion left over
    /// from before the QP was reset), which is dropped.
    pub(crate) fn complete(&self, seq: u64, status: WcStatus) -> Option<Completion> {
        if seq < self.tail.get() || seq >= self.head.get() {
            return None;
        }
        let ring = self.ring.borrow();
        let p = ring[(seq % ring.len() as u64) as usize];
        self.tail.set(seq + 1);
        if !status.is_ok() {
            self.state.set(QpState::Error);
            if self.first_error.get().is_none() {
                self.first_error.set(Some(status));
            }
        }
        Some(Completion {
            wr_id: p.wr_id,
            status,
            opcode: p.opcode,
            byte_len: if status.is_ok() { p.len } else { 0 },
            qp_num: self.qp_num,
        })
    }
}

/// The CQ itself; destroyed when the last holder (the `Mlx5Cq` or a QP
/// on it) drops, before the device it holds.
pub(crate) struct CqInner {
    pub(crate) cq: *mut ibv_cq,
    pub(crate) capacity: u32,
    /// Send-queue depth of the QPs on this CQ, so it can never overflow.
    pub(crate) reserved: Cell<u32>,
    pub(crate) qps: RefCell<Vec<Rc<QpShared>>>,
    pub(crate) dev: Arc<Device>,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: created in Mlx5Cq::create; every QP on it holds an Rc to
        // this, so all are destroyed already.
        if unsafe { ibv_destroy_cq(self.cq) } != 0 {
            log::error!("ibv_destroy_cq failed: {}", std::io::Error::last_os_error());
        }
    }
}

/// An mlx5 completion queue. Not `Send`: a core makes its own at start.
pub struct Mlx5Cq {
    pub(crate) inner: Rc<CqInner>,
    wcs: Box<[ibv_wc]>,
}

impl Mlx5Cq {
    pub(crate) fn create(dev: &Arc<Device>, capacity: u32) -> Result<Mlx5Cq, Mlx5Error> {
        if capacity == 0 || capacity > dev.attrs.max_cqe {
            return Err(Mlx5Error::BadSize {
                what: "completion queue entries",
                got: capacity as u64,
                max: dev.attrs.max_cqe as u64,
            });
        }
        // SAFETY: the context is live; no channel, no vector.
        let cq = unsafe {
            ibv_create_cq(
                dev.ctx,
                capacity as i32,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if cq.is_null() {
            return Err(Mlx5Error::last_os("ibv_create_cq"));
        }
        let wcs = (0..POLL_BATCH)
            // SAFETY: ibv_wc is plain C data; all-zero is a valid value.
            .map(|_| unsafe { std::mem::zeroed::<ibv_wc>() })
            .collect();
        Ok(Mlx5Cq {
            inner: Rc::new(CqInner {
                cq,
                capacity,
                reserved: Cell::new(0),
                qps: RefCell::new(Vec::new()),
                dev: dev.clone(),
            }),
            wcs,
        })
    }

    pub fn capacity(&self) -> u32 {
        self.inner.capacity
    }
}

impl CompletionQueue for Mlx5Cq {
    fn id(&self) -> CqId {
        CqId(Rc::as_ptr(&self.inner) as usize, 0)
    }

    fn poll(&mut self, out: &mut [Completion]) -> usize {
        let want = out.len().min(self.wcs.len());
        if want == 0 {
            return 0;
        }
        // SAFETY: the CQ is live; wcs has room for `want` entries.
        let n = unsafe { ibv_poll_cq(self.inner.cq, want as i32, self.wcs.as_mut_ptr()) };
        if n < 0 {
            log::error!("ibv_poll_cq failed ({n})");
            return 0;
        }
        let qps = self.inner.qps.borrow();
        let mut k = 0;
        for wc in &self.wcs[..n as usize] {
            // A handful of QPs per core: a linear scan beats a map.
            let Some(sh) = qps.iter().find(|s| s.qp_num == wc.qp_num) else {
                log::debug!("completion for QP {} no longer here", wc.qp_num);
                continue;
            };
            if let Some(c) = sh.complete(wc.wr_id, wc_status(wc.status)) {
                out[k] = c;
                k += 1;
            }
        }
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(sh: &QpShared, wr_ids: &[u64]) {
        let mut ring = sh.ring.borrow_mut();
        let cap = ring.len() as u64;
        for &id in wr_ids {
            let seq = sh.head.get();
            ring[(seq % cap) as usize] = Posted {
                wr_id: id,
                opcode: Opcode::Faa,
                len: 8,
            };
            sh.head.set(seq + 1);
        }
    }

    /// A completion retires every request up to its sequence number and
    /// carries the caller's wr_id, opcode and length.
    #[test]
    fn a_completion_retires_the_unsignaled_before_it() {
        let sh = QpShared::new(77, 4);
        post(&sh, &[10, 11, 12, 13]);
        assert_eq!(sh.outstanding(), 4);
        let c = sh.complete(3, WcStatus::Success).unwrap();
        assert_eq!(
            c,
            Completion {
                wr_id: 13,
                status: WcStatus::Success,
                opcode: Opcode::Faa,
                byte_len: 8,
                qp_num: 77
            }
        );
        assert_eq!(sh.outstanding(), 0);
        assert_eq!(sh.state.get(), QpState::Ready);
        // The ring wraps: sequence numbers keep growing.
        post(&sh, &[20, 21]);
        assert_eq!(sh.complete(4, WcStatus::Success).unwrap().wr_id, 20);
        assert_eq!(sh.outstanding(), 1);
    }

    /// An error puts the QP in error and remembers the first status; each
    /// flushed request retires itself; a stale sequence is dropped.
    #[test]
    fn errors_and_flushes() {
        let sh = QpShared::new(5, 8);
        post(&sh, &[1, 2, 3, 4]);
        let c = sh.complete(1, WcStatus::RetryExceeded).unwrap();
        assert_eq!((c.wr_id, c.byte_len), (2, 0));
        assert_eq!(sh.state.get(), QpState::Error);
        assert_eq!(sh.outstanding(), 2);
        assert_eq!(sh.complete(2, WcStatus::Flushed).unwrap().wr_id, 3);
        assert_eq!(sh.complete(3, WcStatus::Flushed).unwrap().wr_id, 4);
        assert_eq!(sh.first_error.get(), Some(WcStatus::RetryExceeded));
        assert_eq!(sh.outstanding(), 0);
        assert!(sh.complete(3, WcStatus::Flushed).is_none(), "stale");
        assert!(sh.complete(9, WcStatus::Success).is_none(), "never posted");
    }

    /// A batch of 4 the driver took 2 of: the drain behind the two carries
    /// the batch's last wr_id, and its flush retires both, whether they
    /// completed silently or were flushed one by one first; nothing is
    /// left outstanding, and the QP stays in error until recovered.
    #[test]
    fn a_drain_completes_a_partly_posted_batch() {
        let last = Posted {
            wr_id: 104,
            opcode: Opcode::Read,
            len: 64,
        };
        for flushed_first in [false, true] {
            let sh = QpShared::new(9, 8);
            post(&sh, &[1]);
            assert_eq!(sh.complete(0, WcStatus::Success).unwrap().wr_id, 1);
            // The batch from sequence 1: the driver took 101 and 102.
            let head = sh.head.get();
            post(&sh, &[101, 102]);
            let seq = sh.stage_drain(head, 2, last);
            assert_eq!(seq, 3);
            assert_eq!(sh.state.get(), QpState::Error, "no post behind the drain");
            assert_eq!(sh.outstanding(), 3);
            if flushed_first {
                let c = sh.complete(1, WcStatus::Flushed).unwrap();
                assert_eq!((c.wr_id, c.status), (101, WcStatus::Flushed));
            }
            let c = sh.complete(seq, WcStatus::Flushed).unwrap();
            assert_eq!(
                (c.wr_id, c.status, c.opcode, c.byte_len),
                (104, WcStatus::Flushed, Opcode::Read, 0)
            );
            assert_eq!(sh.outstanding(), 0, "every taken request retired");
            assert!(sh.complete(2, WcStatus::Flushed).is_none(), "retired");
        }
    }
}
