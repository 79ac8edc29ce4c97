//! The `mlx5` backend: real RDMA NICs (ConnectX; soft-RoCE too) through
//! libibverbs, via `rdma-sys`.
//!
//! Owns: device discovery and the device context with its protection domain
//! (`device.rs`: [`Mlx5Nic`], [`DeviceMemory`]), memory registration
//! (`mr.rs`), completion queues (`cq.rs`), reliable-connected queue pairs
//! moved RESET→INIT→RTR→RTS from an exchanged [`Endpoint`] (`qp.rs`,
//! `endpoint.rs`), the memory-node side that exposes regions and answers
//! connections (`node.rs`: [`Mlx5MemoryNode`]), a compute core's CQ and
//! QPs made and connected as one value that moves to the core's thread
//! (`links.rs`: [`Mlx5CoreQps`]), and the mapping of verbs
//! statuses and errnos onto the contract's (`status.rs`).
//!
//! Promises: every handle owns its parents (a queue pair keeps its completion
//! queue, protection domain and context alive) and teardown runs in
//! dependency order; a device that is absent is one error,
//! [`Mlx5Error::NoDevice`]; requests the NIC would refuse are refused by
//! `post_send` before the doorbell, so a refused batch executes nothing.

mod cq;
mod device;
mod endpoint;
mod links;
mod mr;
mod node;
mod qp;
mod status;

pub use cq::Mlx5Cq;
pub use device::{
    check_roce_gid, device_list_outcome, device_names, DeviceAttrs, DeviceConfig, DeviceMemory,
    Mlx5Nic, PortInfo, LINK_LAYER_ETHERNET,
};
pub use endpoint::{Endpoint, EndpointError, QpEndpoint, RegionInfo, MAX_ENDPOINT_REGIONS};
pub use links::Mlx5CoreQps;
pub use mr::{access_to_ibv, Mlx5Reg};
pub use node::{LoopbackRearm, Mlx5MemoryNode};
pub use qp::{
    init_attr, needs_fence, remote_va, reset_attr, rtr_attr, rts_attr, wr_opcode, Mlx5PreparedQp,
    Mlx5Qp, PathConfig, QpAttr, Rearm, RTS_RETRY_CNT, RTS_TIMEOUT,
};
pub use status::{post_errno_to_error, wc_status};

use std::fmt;

/// Why the mlx5 backend could not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mlx5Error {
    /// No RDMA device on this machine: `ibv_get_device_list` returned NULL
    /// with ENOSYS (no kernel support) or an empty list.
    NoDevice,
    /// The named device is not among those present.
    DeviceNotFound { name: String, present: Vec<String> },
    /// The port is not active (cable, subnet manager, or RoCE link down).
    PortNotActive {
        device: String,
        port: u8,
        state: u32,
    },
    /// A verbs call failed with `errno`.
    Verbs { call: &'static str, errno: i32 },
    /// Registering memory failed.
    Register(crate::nic::RegError),
    /// A size outside what the device allows.
    BadSize {
        what: &'static str,
        got: u64,
        max: u64,
    },
    /// The RoCE port's GID table has no entry at the chosen index.
    EmptyGid {
        device: String,
        port: u8,
        index: u8,
        /// The port's populated RoCE v2 entries (from sysfs).
        roce_v2: Vec<u8>,
    },
    /// An object of another device context than the one it is used with.
    OtherContext { what: &'static str },
    /// The driver refused a send queue this deep with entries this large.
    QueueTooLarge { depth: u32, inline: u32, errno: i32 },
    /// Memory at an address the device's users cannot align to.
    Misaligned {
        what: &'static str,
        addr: u64,
        align: u64,
    },
}

impl Mlx5Error {
    pub(crate) fn last_os(call: &'static str) -> Mlx5Error {
        Mlx5Error::Verbs {
            call,
            errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        }
    }

    pub(crate) fn errno(call: &'static str, rc: i32) -> Mlx5Error {
        // Verbs calls return either -1 with errno set, or the errno itself.
        let errno = if rc == -1 {
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
        } else {
            rc.abs()
        };
        Mlx5Error::Verbs { call, errno }
    }
}

impl fmt::Display for Mlx5Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mlx5Error::NoDevice => write!(
                f,
                "no RDMA device: this machine has no RDMA NIC (or the kernel lacks RDMA \
                 support); use the emu backend, or add a soft-RoCE device with \
                 `rdma link add rxe0 type rxe netdev IFACE`"
            ),
            Mlx5Error::DeviceNotFound { name, present } => {
                write!(f, "RDMA device {name} not found; present: {present:?}")
            }
            Mlx5Error::PortNotActive {
                device,
                port,
                state,
            } => write!(
                f,
                "port {port} of {device} is not active (state {state}); check the link"
            ),
            Mlx5Error::Verbs { call, errno } => write!(
                f,
                "{call} failed: {}",
                std::io::Error::from_raw_os_error(*errno)
            ),
            Mlx5Error::Register(e) => write!(f, "{e}"),
            Mlx5Error::BadSize { what, got, max } => {
                write!(f, "{what} of {got} is outside the device's limit of {max}")
            }
            Mlx5Error::EmptyGid {
                device,
                port,
                index,
                roce_v2,
            } => write!(
                f,
                "{device} port {port} has no GID at index {index} (an empty entry: no IP \
                 address behind it); its RoCE v2 entries are {roce_v2:?}: choose one as the \
                 GID index (the cluster file's backend.gid_index, loch-bench --gid-index, or \
                 LOCH_MLX5_GID_INDEX for the device tests; `show_gids` lists the table)"
            ),
            Mlx5Error::OtherContext { what } => {
                write!(f, "{what} belongs to another device context")
            }
            Mlx5Error::QueueTooLarge {
                depth,
                inline,
                errno,
            } => write!(
                f,
                "ibv_create_qp refused a send queue of {depth} entries with {inline} inline \
                 bytes each ({}): most likely too large, as the driver sizes the queue from \
                 both; a shallower queue (fewer executor slots, a smaller --depth) fits",
                std::io::Error::from_raw_os_error(*errno)
            ),
            Mlx5Error::Misaligned { what, addr, align } => {
                write!(f, "{what} at {addr:#x} is not {align}-byte aligned")
            }
        }
    }
}

impl std::error::Error for Mlx5Error {}
