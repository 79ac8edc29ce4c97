//! Why a transaction did not commit, and what went wrong when something
//! other than a conflict stopped it.

use crate::layout::GeometryError;
use crate::object::ObjectError;
use crate::records::RecordError;
use crate::regions::RegionError;
use crate::ring::RingError;
use nicdrv::{LocalError, VerbError, WaitError};
use std::fmt;

/// Why a transaction aborted: a conflict or a full log, never a broken
/// cluster. Nothing it wrote is visible.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Abort {
    /// LOCK found an object written since it was read, or locked by
    /// another commit.
    Locked,
    /// VALIDATE found an object read (not written) changed or locked.
    Changed,
    /// A read kept finding the object locked or torn.
    Busy,
    /// No room in a log for the commit's records before the deadline.
    LogFull,
    /// A machine failed under the transaction: it could not go on, or its
    /// commit was cut off and recovery aborted it.
    Failure,
}

impl Abort {
    pub const ALL: [Abort; 5] = [
        Abort::Locked,
        Abort::Changed,
        Abort::Busy,
        Abort::LogFull,
        Abort::Failure,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Abort::Locked => "locked",
            Abort::Changed => "changed",
            Abort::Busy => "busy",
            Abort::LogFull => "log_full",
            Abort::Failure => "failure",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Abort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Abort::Locked => "an object written was changed or locked at LOCK",
            Abort::Changed => "an object read was changed or locked at VALIDATE",
            Abort::Busy => "an object stayed locked or torn while being read",
            Abort::LogFull => "no log space for the commit's records",
            Abort::Failure => "a machine failed under the transaction",
        })
    }
}

/// What stopped a transaction operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxError {
    /// The transaction aborted (use a new one).
    Aborted(Abort),
    /// A use the API does not allow (a write of an object not read, a
    /// value of the wrong size): the transaction can go on without it.
    Usage(String),
    Region(RegionError),
    Object(ObjectError),
    Ring(RingError),
    Record(RecordError),
    Verb(VerbError),
    Local(LocalError),
    Geometry(GeometryError),
    /// The object was freed (or its slot never held one).
    Freed(crate::records::ObjAddr),
    /// No object lies there: an allocator block never formatted, or an
    /// address that is not one of its slots.
    NotAnObject(String),
    /// The region has no room for another object of that size.
    NoSpace {
        region: u32,
        len: usize,
    },
    /// A peer broke the protocol (a reply that never came, a record that
    /// names what it may not).
    Protocol(String),
    /// The machine moved to a new configuration under the operation (a
    /// coordinator that follows one stops posting records of the old).
    Reconfigured,
}

impl fmt::Display for TxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TxError::Aborted(a) => write!(f, "transaction aborted: {a}"),
            TxError::Usage(s) => write!(f, "transaction misused: {s}"),
            TxError::Region(e) => write!(f, "{e}"),
            TxError::Object(e) => write!(f, "{e}"),
            TxError::Ring(e) => write!(f, "log ring: {e}"),
            TxError::Record(e) => write!(f, "commit record: {e}"),
            TxError::Verb(e) => write!(f, "{e}"),
            TxError::Local(e) => write!(f, "local memory: {e}"),
            TxError::Geometry(e) => write!(f, "{e}"),
            TxError::Freed(at) => write!(
                f,
                "object at offset {} of region {} is free (freed, or never allocated)",
                at.offset, at.region
            ),
            TxError::NotAnObject(s) => write!(f, "no object there: {s}"),
            TxError::NoSpace { region, len } => write!(
                f,
                "region {region} has no room for another object of {len} bytes"
            ),
            TxError::Protocol(s) => write!(f, "commit protocol: {s}"),
            TxError::Reconfigured => write!(f, "the configuration changed under the operation"),
        }
    }
}

impl std::error::Error for TxError {}

macro_rules! from {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for TxError {
            fn from(e: $t) -> Self {
                TxError::$v(e)
            }
        }
    )*};
}

from!(ObjectError => Object, RingError => Ring,
      RecordError => Record, VerbError => Verb, LocalError => Local,
      GeometryError => Geometry);

impl From<RegionError> for TxError {
    /// An address off a line names no object: the error a read of one
    /// between objects gives.
    fn from(e: RegionError) -> Self {
        match e {
            RegionError::Misaligned(_) => TxError::NotAnObject(e.to_string()),
            e => TxError::Region(e),
        }
    }
}

impl From<WaitError> for TxError {
    fn from(e: WaitError) -> Self {
        TxError::Ring(e.into())
    }
}

impl From<nicdrv::local::TimerError> for TxError {
    fn from(e: nicdrv::local::TimerError) -> Self {
        TxError::Ring(crate::ring::RingError::Timer(e))
    }
}
