//! The verbs vocabulary shared by every backend: keys, scatter/gather
//! entries, work requests, completions and their statuses, post errors and
//! device capabilities. Names follow ibverbs (`ibv_send_wr`, `ibv_wc`,
//! `ibv_wc_status`) so that the mlx5 backend maps one to one.

use crate::addr::{GlobalAddr, NodeId};
use std::fmt;

bitflags::bitflags! {
    /// Access rights of a memory region (`IBV_ACCESS_*`).
    #[derive(Copy, Clone, Debug, PartialEq, Eq)]
    pub struct Access: u8 {
        const LOCAL_WRITE = 1;
        const REMOTE_READ = 2;
        const REMOTE_WRITE = 4;
        const REMOTE_ATOMIC = 8;
    }
}

impl Access {
    /// What a memory node grants compute nodes on its registered memory.
    pub const REMOTE_ALL: Access = Access::LOCAL_WRITE
        .union(Access::REMOTE_READ)
        .union(Access::REMOTE_WRITE)
        .union(Access::REMOTE_ATOMIC);
}

/// Local key of a memory region: names registered memory in a local SGE.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct LKey(pub u32);

/// Remote key of a memory region: what a peer must present to touch it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct RKey(pub u32);

/// A local scatter/gather entry (`ibv_sge`): registered local memory.
#[derive(Copy, Clone, Debug)]
pub struct Sge {
    pub addr: *mut u8,
    pub len: u32,
    pub lkey: LKey,
}

/// The operation a work request carries (`ibv_wr_opcode` plus its fields).
///
/// `repr(C, u8)`, with `remote`, `rkey` and `local` first in every variant,
/// puts those three at the same offsets whatever the operation, so
/// [`WrOp::remote`], [`WrOp::rkey`] and [`WrOp::local`] are single loads
/// rather than a `match` each. A post reaches them several times per
/// request (the caps check, the responder's checks, the counters).
#[derive(Copy, Clone, Debug)]
#[repr(C, u8)]
pub enum WrOp {
    /// RDMA READ of `local.len` bytes from `remote` into `local`.
    Read {
        remote: GlobalAddr,
        rkey: RKey,
        local: Sge,
    },
    /// RDMA WRITE of `local.len` bytes from `local` to `remote`. With
    /// `inline`, the payload is copied at post time (`IBV_SEND_INLINE`): the
    /// local memory may be reused at once and its lkey is not checked.
    Write {
        remote: GlobalAddr,
        rkey: RKey,
        local: Sge,
        inline: bool,
    },
    /// 8-byte compare-and-swap; the old value lands in `local` (8 bytes).
    Cas {
        remote: GlobalAddr,
        rkey: RKey,
        local: Sge,
        compare: u64,
        swap: u64,
    },
    /// 8-byte fetch-and-add; the old value lands in `local` (8 bytes).
    Faa {
        remote: GlobalAddr,
        rkey: RKey,
        local: Sge,
        add: u64,
    },
    /// Masked compare-and-swap (an optional capability): compares only the
    /// bits in `compare_mask`, and replaces only the bits in `swap_mask`.
    MaskedCas {
        remote: GlobalAddr,
        rkey: RKey,
        local: Sge,
        compare: u64,
        compare_mask: u64,
        swap: u64,
        swap_mask: u64,
    },
}

impl WrOp {
    pub fn opcode(&self) -> Opcode {
        match self {
            WrOp::Read { .. } => Opcode::Read,
            WrOp::Write { .. } => Opcode::Write,
            WrOp::Cas { .. } => Opcode::Cas,
            WrOp::Faa { .. } => Opcode::Faa,
            WrOp::MaskedCas { .. } => Opcode::MaskedCas,
        }
    }

    pub fn remote(&self) -> GlobalAddr {
        match *self {
            WrOp::Read { remote, .. }
            | WrOp::Write { remote, .. }
            | WrOp::Cas { remote, .. }
            | WrOp::Faa { remote, .. }
            | WrOp::MaskedCas { remote, .. } => remote,
        }
    }

    pub fn rkey(&self) -> RKey {
        match *self {
            WrOp::Read { rkey, .. }
            | WrOp::Write { rkey, .. }
            | WrOp::Cas { rkey, .. }
            | WrOp::Faa { rkey, .. }
            | WrOp::MaskedCas { rkey, .. } => rkey,
        }
    }

    pub fn local(&self) -> Sge {
        match *self {
            WrOp::Read { local, .. }
            | WrOp::Write { local, .. }
            | WrOp::Cas { local, .. }
            | WrOp::Faa { local, .. }
            | WrOp::MaskedCas { local, .. } => local,
        }
    }

    /// The right the local memory needs (`None`: an inline WRITE, whose
    /// payload was copied at post time and is not checked).
    pub fn local_access(&self) -> Option<Access> {
        match self {
            WrOp::Write { inline: true, .. } => None,
            WrOp::Write { .. } => Some(Access::empty()),
            _ => Some(Access::LOCAL_WRITE),
        }
    }

    /// Bytes moved over the wire by this operation.
    pub fn len(&self) -> u32 {
        match self {
            WrOp::Read { local, .. } | WrOp::Write { local, .. } => local.len,
            _ => 8,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One work request (`ibv_send_wr`). Only `signaled` requests produce a
/// completion on success; a failing or flushed request always produces one.
#[derive(Copy, Clone, Debug)]
pub struct WorkRequest {
    pub wr_id: u64,
    pub signaled: bool,
    pub op: WrOp,
}

/// A work request that is never posted; fills unused storage (the
/// executor's batch storage, the simulator's request slots).
pub(crate) const PLACEHOLDER_WR: WorkRequest = WorkRequest {
    wr_id: 0,
    signaled: false,
    op: WrOp::Read {
        remote: GlobalAddr::NULL,
        rkey: RKey(0),
        local: Sge {
            addr: std::ptr::null_mut(),
            len: 0,
            lkey: LKey(0),
        },
    },
};

/// Kinds of verbs, for counters and completions.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Opcode {
    Read,
    Write,
    Cas,
    Faa,
    MaskedCas,
}

impl Opcode {
    pub const ALL: [Opcode; 5] = [
        Opcode::Read,
        Opcode::Write,
        Opcode::Cas,
        Opcode::Faa,
        Opcode::MaskedCas,
    ];

    pub fn is_atomic(self) -> bool {
        !matches!(self, Opcode::Read | Opcode::Write)
    }

    pub fn name(self) -> &'static str {
        match self {
            Opcode::Read => "read",
            Opcode::Write => "write",
            Opcode::Cas => "cas",
            Opcode::Faa => "faa",
            Opcode::MaskedCas => "masked_cas",
        }
    }
}

/// Completion status (`ibv_wc_status`, the subset a one-sided client sees).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum WcStatus {
    Success,
    /// The local SGE is longer than its region or the message limit.
    LocalLength,
    /// The local SGE is not inside a region registered under its lkey.
    LocalProtection,
    /// Wrong rkey, or the remote range is outside the key's region, or the
    /// region lacks the needed access right (`IBV_WC_REM_ACCESS_ERR`).
    RemoteAccess,
    /// The responder rejected the request: a misaligned atomic, or an
    /// operation the remote memory cannot serve (`IBV_WC_REM_INV_REQ_ERR`).
    RemoteInvalidRequest,
    /// The peer did not answer: its node is dead or unreachable
    /// (`IBV_WC_RETRY_EXC_ERR`).
    RetryExceeded,
    /// Flushed because an earlier request on the queue pair failed.
    Flushed,
}

impl WcStatus {
    pub fn is_ok(self) -> bool {
        self == WcStatus::Success
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WcStatus::Success => "success",
            WcStatus::LocalLength => "local length error",
            WcStatus::LocalProtection => {
                "local protection error (buffer not in a registered region)"
            }
            WcStatus::RemoteAccess => {
                "remote access error (wrong rkey, outside the region, or access not granted)"
            }
            WcStatus::RemoteInvalidRequest => "remote invalid request (misaligned atomic)",
            WcStatus::RetryExceeded => {
                "transport retries exceeded: remote node dead or unreachable"
            }
            WcStatus::Flushed => "flushed: an earlier request on this queue pair failed",
        })
    }
}

/// A work completion (`ibv_wc`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: Opcode,
    /// Bytes transferred (READ/WRITE length, 8 for atomics); 0 on error.
    pub byte_len: u32,
    /// The queue pair (by its number) the request was posted on.
    pub qp_num: u32,
}

impl Completion {
    pub const EMPTY: Completion = Completion {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: Opcode::Read,
        byte_len: 0,
        qp_num: 0,
    };
}

/// Why `post_send` refused a batch. Nothing in a refused batch executes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum PostError {
    /// The queue pair is in the error state; recover it before posting.
    QpInError,
    /// The batch would exceed the send queue depth.
    SendQueueFull { depth: u32 },
    /// A READ or WRITE of zero bytes.
    ZeroLength,
    /// A message longer than the device's maximum message size.
    MessageTooLong { len: u64, max: u32 },
    /// An inline WRITE larger than the device's inline limit.
    InlineTooLong { len: u32, max: u32 },
    /// An atomic whose local buffer is not 8 bytes.
    AtomicLocalLength { len: u32 },
    /// The backend lacks this verb (masked CAS on some NICs).
    Unsupported(Opcode),
    /// The remote address names another node than this queue pair's peer.
    WrongNode { addr: GlobalAddr, peer: NodeId },
    /// An empty batch.
    EmptyBatch,
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PostError::QpInError => write!(f, "queue pair is in the error state"),
            PostError::SendQueueFull { depth } => {
                write!(f, "send queue full (depth {depth})")
            }
            PostError::ZeroLength => write!(f, "zero-length READ or WRITE"),
            PostError::MessageTooLong { len, max } => {
                write!(
                    f,
                    "message of {len} bytes exceeds the device maximum of {max}"
                )
            }
            PostError::InlineTooLong { len, max } => {
                write!(
                    f,
                    "inline payload of {len} bytes exceeds the limit of {max}"
                )
            }
            PostError::AtomicLocalLength { len } => {
                write!(f, "atomic verbs need an 8-byte local buffer, got {len}")
            }
            PostError::Unsupported(op) => {
                write!(f, "this backend does not support {}", op.name())
            }
            PostError::WrongNode { addr, peer } => {
                write!(
                    f,
                    "address {addr} is not on this queue pair's peer node {peer}"
                )
            }
            PostError::EmptyBatch => write!(f, "empty batch"),
        }
    }
}

impl std::error::Error for PostError {}

/// Limits and optional capabilities of a device (`ibv_device_attr` subset).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Caps {
    pub masked_cas: bool,
    pub max_inline_bytes: u32,
    pub max_msg_bytes: u32,
    pub max_send_wr: u32,
    pub max_cqe: u32,
}

impl Caps {
    /// Checks what can be checked before a request reaches the wire: the
    /// same refusals `ibv_post_send` makes (EINVAL) plus our own stricter
    /// ones (zero length). Remote-side checks happen at the responder.
    pub fn check(&self, op: &WrOp) -> Result<(), PostError> {
        match *op {
            WrOp::Read { local, .. } | WrOp::Write { local, .. } => {
                if local.len == 0 {
                    return Err(PostError::ZeroLength);
                }
                if local.len > self.max_msg_bytes {
                    return Err(PostError::MessageTooLong {
                        len: local.len as u64,
                        max: self.max_msg_bytes,
                    });
                }
                if let WrOp::Write { inline: true, .. } = op {
                    if local.len > self.max_inline_bytes {
                        return Err(PostError::InlineTooLong {
                            len: local.len,
                            max: self.max_inline_bytes,
                        });
                    }
                }
            }
            WrOp::MaskedCas { local, .. } => {
                if !self.masked_cas {
                    return Err(PostError::Unsupported(Opcode::MaskedCas));
                }
                if local.len != 8 {
                    return Err(PostError::AtomicLocalLength { len: local.len });
                }
            }
            WrOp::Cas { local, .. } | WrOp::Faa { local, .. } => {
                if local.len != 8 {
                    return Err(PostError::AtomicLocalLength { len: local.len });
                }
            }
        }
        Ok(())
    }
}
