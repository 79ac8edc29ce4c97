//! Memory registration (`ibv_reg_mr`): the contract's access rights mapped
//! onto `IBV_ACCESS_*`, and a registration that keeps its protection domain
//! alive and deregisters on drop.

use super::device::Device;
use crate::nic::{RegError, Registration};
use crate::verbs::{Access, LKey, RKey};
use rdma_sys::*;
use std::sync::Arc;

/// The contract's [`Access`] as `IBV_ACCESS_*` bits. The two orders differ
/// (ours: READ = 2, WRITE = 4; verbs: WRITE = 2, READ = 4), so this maps
/// flag by flag. Verbs requires LOCAL_WRITE with REMOTE_WRITE or
/// REMOTE_ATOMIC, so those imply it.
pub fn access_to_ibv(a: Access) -> u32 {
    let mut f = 0;
    if a.contains(Access::LOCAL_WRITE) {
        f |= ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    }
    if a.contains(Access::REMOTE_READ) {
        f |= ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    if a.contains(Access::REMOTE_WRITE) {
        f |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
            | ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    }
    if a.contains(Access::REMOTE_ATOMIC) {
        f |= ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0
            | ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    }
    f
}

/// A memory registration; dropping it deregisters, then releases its hold
/// on the device.
pub struct Mlx5Reg {
    mr: *mut ibv_mr,
    // Drops after `mr` is deregistered (Drop runs before fields drop).
    _dev: Arc<Device>,
}

// SAFETY: an ibv_mr is a device handle usable from any thread; it is only
// deregistered in Drop, once.
unsafe impl Send for Mlx5Reg {}

impl Mlx5Reg {
    /// Registers `ptr..ptr+len` with `access`.
    ///
    /// # Safety
    /// The memory must stay valid until the returned registration drops.
    pub(crate) unsafe fn register_raw(
        dev: &Arc<Device>,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Mlx5Reg, RegError> {
        if ptr.is_null() || len == 0 {
            return Err(RegError::Empty);
        }
        if len as u64 > dev.attrs.max_mr_size && dev.attrs.max_mr_size != 0 {
            return Err(RegError::TooLarge { len: len as u64 });
        }
        // SAFETY: the PD is live (held by `dev`); the caller keeps the
        // memory valid for the registration's life.
        let mr = unsafe { ibv_reg_mr(dev.pd, ptr.cast(), len, access_to_ibv(access) as i32) };
        if mr.is_null() {
            let err = std::io::Error::last_os_error();
            let hint = if err.raw_os_error() == Some(libc::ENOMEM) {
                " (pinning needs RLIMIT_MEMLOCK above the region size: `ulimit -l`)"
            } else {
                ""
            };
            return Err(RegError::Device(format!(
                "ibv_reg_mr of {len} bytes: {err}{hint}"
            )));
        }
        Ok(Mlx5Reg {
            mr,
            _dev: dev.clone(),
        })
    }
}

impl Registration for Mlx5Reg {
    fn lkey(&self) -> LKey {
        // SAFETY: mr is live while self is.
        LKey(unsafe { (*self.mr).lkey })
    }
    fn rkey(&self) -> RKey {
        // SAFETY: as above.
        RKey(unsafe { (*self.mr).rkey })
    }
}

impl Drop for Mlx5Reg {
    fn drop(&mut self) {
        // SAFETY: registered in register_raw, deregistered once here.
        if unsafe { ibv_dereg_mr(self.mr) } != 0 {
            log::error!("ibv_dereg_mr failed: {}", std::io::Error::last_os_error());
        }
    }
}
