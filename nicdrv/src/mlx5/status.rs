//! Verbs outcomes as the contract's: `ibv_wc_status` → [`WcStatus`], and
//! an errno from `ibv_post_send` → [`PostError`].

use crate::verbs::{PostError, WcStatus, WrOp};
use rdma_sys::ibv_wc_status::*;

/// Maps a completion status. Statuses a one-sided client cannot otherwise
/// tell apart fold into the nearest contract status: the responder refused
/// (`REM_OP_ERR`, `REM_INV_RD_REQ_ERR`, `BAD_RESP_ERR`) → RemoteInvalidRequest;
/// the peer never answered (`RNR_RETRY_EXC_ERR`, `RESP_TIMEOUT_ERR`) →
/// RetryExceeded; local faults other than length → LocalProtection.
pub fn wc_status(s: rdma_sys::ibv_wc_status::Type) -> WcStatus {
    match s {
        IBV_WC_SUCCESS => WcStatus::Success,
        IBV_WC_LOC_LEN_ERR => WcStatus::LocalLength,
        IBV_WC_LOC_PROT_ERR | IBV_WC_LOC_ACCESS_ERR | IBV_WC_LOC_QP_OP_ERR => {
            WcStatus::LocalProtection
        }
        IBV_WC_WR_FLUSH_ERR => WcStatus::Flushed,
        IBV_WC_REM_ACCESS_ERR => WcStatus::RemoteAccess,
        IBV_WC_REM_INV_REQ_ERR
        | IBV_WC_REM_OP_ERR
        | IBV_WC_REM_INV_RD_REQ_ERR
        | IBV_WC_BAD_RESP_ERR
        | IBV_WC_REM_ABORT_ERR => WcStatus::RemoteInvalidRequest,
        IBV_WC_RETRY_EXC_ERR | IBV_WC_RNR_RETRY_EXC_ERR | IBV_WC_RESP_TIMEOUT_ERR => {
            WcStatus::RetryExceeded
        }
        // Fatal and vendor-specific: the QP is unusable; report it as a local
        // fault so the executor recovers (or gives up on) the QP.
        _ => WcStatus::LocalProtection,
    }
}

/// Maps an errno from `ibv_post_send` for the request it refused. `post_send`
/// checks everything the driver checks first, so these are a backstop: an
/// inline WRITE longer than the QP granted (libmlx5 says ENOMEM for it,
/// other providers EINVAL); otherwise ENOMEM means the send queue is
/// full; EOPNOTSUPP means the device does not do that operation (libmlx5
/// for atomics on a device without them); anything else means the QP
/// cannot post (a QP the driver holds in a wrong state).
pub fn post_errno_to_error(errno: i32, op: &WrOp, depth: u32, max_inline: u32) -> PostError {
    match (errno, op) {
        (
            libc::ENOMEM | libc::EINVAL,
            WrOp::Write {
                inline: true,
                local,
                ..
            },
        ) if local.len > max_inline => PostError::InlineTooLong {
            len: local.len,
            max: max_inline,
        },
        (libc::ENOMEM, _) => PostError::SendQueueFull { depth },
        (libc::EOPNOTSUPP, op) => PostError::Unsupported(op.opcode()),
        _ => PostError::QpInError,
    }
}
