//! The error a task sees when a verb or batch fails.

use crate::addr::NodeId;
use crate::verbs::{Opcode, PostError, WcStatus};
use std::fmt;

/// Why a batch failed. Expected failures are values; nothing here panics.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum VerbError {
    /// The queue pair to `node` refused the post; nothing of that group ran.
    Post { node: NodeId, error: PostError },
    /// Request `op` (its index in the batch) completed with `status`.
    Failed {
        node: NodeId,
        op: u8,
        opcode: Opcode,
        status: WcStatus,
    },
    /// The memory node is dead: its queue pair cannot be recovered.
    NodeDead { node: NodeId },
    /// This core has no queue pair to the node an address names.
    NoRoute { node: NodeId },
    /// More requests than a batch holds.
    BatchFull { max: usize },
    /// Another batch of this task is in flight (a task posts one batch at a
    /// time: put parallel requests in one batch).
    BatchInProgress,
    /// This batch was replaced by a newer batch of the same task before it
    /// was submitted.
    BatchSuperseded,
    /// The task's scratch memory cannot hold another buffer.
    Scratch { requested: usize, free: usize },
    /// A buffer of another task's scratch was given to a verb: a task's
    /// verbs use the buffers it allocated, whose bytes its own slot keeps
    /// from reuse while the NIC may still write them.
    ForeignBuffer,
}

impl VerbError {
    /// True for the errors that mean "the node is gone".
    pub fn is_node_dead(&self) -> bool {
        matches!(
            self,
            VerbError::NodeDead { .. }
                | VerbError::Failed {
                    status: WcStatus::RetryExceeded,
                    ..
                }
        )
    }

    /// The completion status, when the failure came from the NIC.
    pub fn status(&self) -> Option<WcStatus> {
        match self {
            VerbError::Failed { status, .. } => Some(*status),
            _ => None,
        }
    }
}

impl fmt::Display for VerbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerbError::Post { node, error } => {
                write!(f, "post to memory node {node} refused: {error}")
            }
            VerbError::Failed {
                node,
                op,
                opcode,
                status,
            } => write!(
                f,
                "{} (request {op} of the batch) to memory node {node} failed: {status}",
                opcode.name()
            ),
            VerbError::NodeDead { node } => write!(f, "memory node {node} is dead"),
            VerbError::NoRoute { node } => {
                write!(f, "this core has no queue pair to memory node {node}")
            }
            VerbError::BatchFull { max } => write!(f, "a batch holds at most {max} requests"),
            VerbError::BatchInProgress => write!(
                f,
                "this task already has a batch in flight (a task posts one batch at a time)"
            ),
            VerbError::BatchSuperseded => {
                write!(
                    f,
                    "this batch was replaced by a newer batch of the same task"
                )
            }
            VerbError::Scratch { requested, free } => write!(
                f,
                "task scratch exhausted: {requested} bytes requested, {free} free \
                 (raise scratch_bytes_per_slot)"
            ),
            VerbError::ForeignBuffer => write!(
                f,
                "a buffer allocated by another task was given to this task's verb \
                 (a task posts only buffers it allocated)"
            ),
        }
    }
}

impl std::error::Error for VerbError {}
