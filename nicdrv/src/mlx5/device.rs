//! Device discovery, the device context and its protection domain, the
//! device's limits, and on-NIC device memory (`ibv_alloc_dm`).
//!
//! One [`Mlx5Nic`] per process and device; clones share one context and one
//! protection domain, which are released (PD first, then the context) when
//! the last clone and the last handle made from it are dropped.

use super::mr::{access_to_ibv, Mlx5Reg};
use super::Mlx5Error;
use crate::gids;
use crate::nic::{HeapMem, Mr, Nic, RegError, RegisterableMemory};

use crate::verbs::{Access, Caps, RKey};
use rdma_sys::*;
use std::ffi::CStr;
use std::sync::Arc;

/// Which device and port to open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Device name (`mlx5_0`, `rxe0`); `None` takes the first one.
    pub name: Option<String>,
    /// Port number, from 1.
    pub port: u8,
    /// GID table index used for routing (RoCE needs one; on InfiniBand the
    /// LID routes and the GID is carried for global routing only).
    pub gid_index: u8,
    /// Traffic class of every packet's global route header (RoCE v2: the
    /// IP header's DSCP << 2), to reach a fabric's lossless class.
    pub traffic_class: u8,
}

impl DeviceConfig {
    /// The first device and the defaults, or what `LOCH_MLX5_DEVICE`,
    /// `LOCH_MLX5_PORT`, `LOCH_MLX5_GID_INDEX` (RoCE v2 usually wants GID
    /// index 1 or 3: see `show_gids`) and `LOCH_MLX5_TRAFFIC_CLASS` name:
    /// the loopback fixtures of
    /// the tests that run on a device. A value that is not a number is an
    /// error naming the variable.
    pub fn from_env() -> Result<DeviceConfig, String> {
        let env = |k: &str| std::env::var(k).ok();
        let mut cfg = DeviceConfig {
            name: env("LOCH_MLX5_DEVICE"),
            ..DeviceConfig::default()
        };
        if let Some(p) = env("LOCH_MLX5_PORT") {
            cfg.port = p
                .parse()
                .map_err(|_| format!("LOCH_MLX5_PORT=`{p}` is not a port number"))?;
        }
        if let Some(g) = env("LOCH_MLX5_GID_INDEX") {
            cfg.gid_index = g
                .parse()
                .map_err(|_| format!("LOCH_MLX5_GID_INDEX=`{g}` is not a GID index"))?;
        }
        if let Some(t) = env("LOCH_MLX5_TRAFFIC_CLASS") {
            cfg.traffic_class = t.parse().map_err(|_| {
                format!("LOCH_MLX5_TRAFFIC_CLASS=`{t}` is not a traffic class (0..=255)")
            })?;
        }
        Ok(cfg)
    }
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            name: None,
            port: 1,
            gid_index: 0,
            traffic_class: 0,
        }
    }
}

/// The device's limits that Loch uses (`ibv_device_attr_ex` subset).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct DeviceAttrs {
    pub max_qp_wr: u32,
    pub max_cqe: u32,
    pub max_mr_size: u64,
    /// Outstanding READs/atomics a QP may issue (`max_qp_init_rd_atom`).
    pub max_qp_init_rd_atom: u8,
    /// Outstanding READs/atomics a QP may serve (`max_qp_rd_atom`).
    pub max_qp_rd_atom: u8,
    /// Bytes of device memory (`max_dm_size`); 0 where the NIC has none.
    pub max_dm_size: u64,
    /// Whether 8-byte atomics are offered at all (`atomic_cap` ≠ NONE).
    pub atomics: bool,
}

/// The port a QP routes through.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PortInfo {
    pub port: u8,
    pub lid: u16,
    pub gid: [u8; 16],
    pub gid_index: u8,
    /// Active MTU as `ibv_mtu` (1 = 256 B … 5 = 4096 B).
    pub mtu: u8,
    /// RoCE (Ethernet link layer): routing needs the GRH.
    pub roce: bool,
    pub max_msg_sz: u32,
}

/// `IBV_LINK_LAYER_ETHERNET` (a `#define` in verbs.h, absent from rdma-sys).
pub const LINK_LAYER_ETHERNET: u8 = 2;

/// Inline payload sizes asked of a QP, largest first: ConnectX-5 grants a
/// little over 200 bytes; a driver refuses a QP asking more than it has, so
/// the probe steps down until one is granted.
const INLINE_TRIES: [u32; 4] = [220, 128, 64, 0];

/// The context and protection domain. Dropped last, after every MR, CQ and
/// QP, because each of those holds an `Arc<Device>`.
pub(crate) struct Device {
    pub(crate) ctx: *mut ibv_context,
    pub(crate) pd: *mut ibv_pd,
    pub(crate) name: String,
    pub(crate) attrs: DeviceAttrs,
    pub(crate) port: PortInfo,
    /// Inline bytes every QP of this device is created with.
    pub(crate) inline_bytes: u32,
    /// Traffic class of every QP's global route header.
    pub(crate) traffic_class: u8,
}

// SAFETY: libibverbs contexts and PDs are thread-safe (the library locks
// internally); the pointers are only freed in Drop, once.
unsafe impl Send for Device {}
// SAFETY: as above; `&Device` only reads immutable fields or calls
// thread-safe verbs.
unsafe impl Sync for Device {}

impl Drop for Device {
    fn drop(&mut self) {
        // Dependency order: the PD before the context that made it.
        // SAFETY: both were created in `open` and nothing else frees them;
        // every child (MR, QP, CQ, DM) holds an Arc and is gone by now.
        unsafe {
            if ibv_dealloc_pd(self.pd) != 0 {
                log::error!("ibv_dealloc_pd on {} failed", self.name);
            }
            if ibv_close_device(self.ctx) != 0 {
                log::error!("ibv_close_device on {} failed", self.name);
            }
        }
    }
}

/// What `ibv_get_device_list` said, as a decision: NULL with ENOSYS (no
/// kernel support) and an empty list both mean [`Mlx5Error::NoDevice`];
/// NULL with another errno is that error. Pure, so the no-device rule is
/// tested without a device.
pub fn device_list_outcome(list_is_null: bool, errno: i32, count: i32) -> Result<(), Mlx5Error> {
    if list_is_null {
        if errno == libc::ENOSYS || errno == 0 {
            return Err(Mlx5Error::NoDevice);
        }
        return Err(Mlx5Error::Verbs {
            call: "ibv_get_device_list",
            errno,
        });
    }
    if count <= 0 {
        return Err(Mlx5Error::NoDevice);
    }
    Ok(())
}

/// Names of the RDMA devices present.
pub fn device_names() -> Result<Vec<String>, Mlx5Error> {
    with_device_list(|devs| Ok(devs.iter().map(|&d| dev_name(d)).collect()))
}

fn dev_name(d: *mut ibv_device) -> String {
    // SAFETY: `d` comes from a live device list; the name is a NUL-terminated
    // string owned by the device, copied out here.
    unsafe {
        let p = ibv_get_device_name(d);
        if p.is_null() {
            return String::from("?");
        }
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// Makes this process's registrations fork-safe, once, before its first
/// other verbs call (as `ibv_fork_init` must come): where the kernel does
/// not copy pinned pages at fork, libibverbs then keeps every registered
/// range out of forked children, so a parent's write after a fork cannot
/// move a page the NIC still reads and writes. Kernels that do copy them
/// need nothing (`IBV_FORK_UNNEEDED`). A failure is said, not fatal:
/// registrations still work, and only a fork would then be unsafe.
fn fork_safe() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: takes no arguments; libibverbs may be called from any
        // thread, and the Once runs it before this process's first other
        // verbs call (every one goes through `with_device_list` first).
        let rc = unsafe { ibv_fork_init() };
        if rc != 0 {
            log::warn!(
                "ibv_fork_init failed ({}): registered memory is not fork-safe in this process",
                std::io::Error::from_raw_os_error(rc)
            );
        }
    });
}

/// Runs `f` over the device list and frees the list afterwards.
fn with_device_list<T>(
    f: impl FnOnce(&[*mut ibv_device]) -> Result<T, Mlx5Error>,
) -> Result<T, Mlx5Error> {
    fork_safe();
    let mut n: i32 = 0;
    // SAFETY: `n` is a valid out-pointer; the list is freed below.
    let list = unsafe { ibv_get_device_list(&mut n) };
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    if let Err(e) = device_list_outcome(list.is_null(), errno, n) {
        if !list.is_null() {
            // SAFETY: a non-null list from ibv_get_device_list, freed once.
            unsafe { ibv_free_device_list(list) };
        }
        return Err(e);
    }
    // SAFETY: the list holds `n` device pointers (verbs.h).
    let devs = unsafe { std::slice::from_raw_parts(list, n as usize) };
    let r = f(devs);
    // SAFETY: freed once; contexts opened from it stay valid (verbs.h:
    // "ibv_free_device_list ... once contexts are opened").
    unsafe { ibv_free_device_list(list) };
    r
}

fn zeroed<T>() -> T {
    // SAFETY: only used for C structs of integers, pointers and unions of
    // them, for which all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// The mlx5 device context. Cloning is cheap and shares the device. A
/// clone made by [`Mlx5Nic::on_machine`] also sees a memory node's
/// registered host memory as its machine's own (the local view).
#[derive(Clone)]
pub struct Mlx5Nic {
    pub(crate) dev: Arc<Device>,
    caps: Caps,
    local: Option<crate::local::MachineMemory>,
}

impl Mlx5Nic {
    /// Opens a device, allocates its protection domain and reads its
    /// limits and port.
    pub fn open(cfg: &DeviceConfig) -> Result<Mlx5Nic, Mlx5Error> {
        let (ctx, name) = with_device_list(|devs| {
            let dev = match &cfg.name {
                None => devs[0],
                Some(want) => *devs
                    .iter()
                    .find(|&&d| dev_name(d) == *want)
                    .ok_or_else(|| Mlx5Error::DeviceNotFound {
                        name: want.clone(),
                        present: devs.iter().map(|&d| dev_name(d)).collect(),
                    })?,
            };
            // SAFETY: `dev` is in the live list; the context outlives it.
            let ctx = unsafe { ibv_open_device(dev) };
            if ctx.is_null() {
                return Err(Mlx5Error::last_os("ibv_open_device"));
            }
            Ok((ctx, dev_name(dev)))
        })?;
        // SAFETY: ctx is a live context; on failure it is closed here.
        let pd = unsafe { ibv_alloc_pd(ctx) };
        if pd.is_null() {
            let e = Mlx5Error::last_os("ibv_alloc_pd");
            // SAFETY: closing the context we just opened, once.
            unsafe { ibv_close_device(ctx) };
            return Err(e);
        }
        // From here Drop of `Device` releases both, in order.
        let mut dev = Device {
            ctx,
            pd,
            name,
            attrs: DeviceAttrs::default(),
            port: PortInfo {
                port: cfg.port,
                lid: 0,
                gid: [0; 16],
                gid_index: cfg.gid_index,
                mtu: 0,
                roce: false,
                max_msg_sz: 0,
            },
            inline_bytes: 0,
            traffic_class: cfg.traffic_class,
        };
        dev.attrs = query_attrs(ctx)?;
        if !dev.attrs.atomics {
            log::warn!(
                "{} reports no RDMA atomics (atomic_cap IBV_ATOMIC_NONE): every CAS and FAA \
                 is refused as unsupported, and the tree's locks, the hash table and \
                 transactions cannot run on it",
                dev.name
            );
        }
        dev.port = query_port(ctx, &dev.name, cfg.port, cfg.gid_index)?;
        let max_inline_bytes = probe_inline(&dev)?;
        dev.inline_bytes = max_inline_bytes;
        let a = dev.attrs;
        let caps = Caps {
            // Masked CAS needs mlx5dv experimental verbs; not offered.
            masked_cas: false,
            max_inline_bytes,
            max_msg_bytes: dev.port.max_msg_sz,
            max_send_wr: a.max_qp_wr,
            max_cqe: a.max_cqe,
        };
        Ok(Mlx5Nic {
            dev: Arc::new(dev),
            caps,
            local: None,
        })
    }

    /// This device as the cores of a machine that owns `node` see it: the
    /// node's registered host memory is the local view, word atomics on the
    /// region the NIC writes into (a CPU's atomics are not atomic with the
    /// NIC's: the contract). The region stays registered while the returned
    /// value lives.
    pub fn on_machine(&self, node: &Arc<super::Mlx5MemoryNode>) -> Mlx5Nic {
        // SAFETY: the region is `host_bytes` long at `host_ptr`, 8-byte
        // aligned (`Mlx5MemoryNode::with_memory` refuses memory that is
        // not), and stays allocated while the node lives, which the node's
        // Arc beside the view ensures for every copy of it; it is only
        // accessed atomically through SharedMem.
        let local = unsafe {
            let mem = crate::emu::shm::SharedMem::new(node.host_ptr(), node.host_bytes() as usize);
            crate::local::MachineMemory::new(crate::local::SharedLocal::new(mem), node.clone())
        };
        Mlx5Nic {
            dev: self.dev.clone(),
            caps: self.caps,
            local: Some(local),
        }
    }

    /// The device's name (`mlx5_0`).
    pub fn name(&self) -> &str {
        &self.dev.name
    }

    pub fn attrs(&self) -> DeviceAttrs {
        self.dev.attrs
    }

    pub fn port(&self) -> PortInfo {
        self.dev.port
    }

    /// Allocates `want_bytes` of device memory (sized down to the device's
    /// `max_dm_size`) and registers it zero-based with `access`. Where the
    /// device has none (soft-RoCE, older NICs) it logs a warning and falls
    /// back to registered host memory, so callers keep one code path.
    pub fn alloc_device_memory(
        &self,
        want_bytes: u64,
        access: Access,
    ) -> Result<DeviceMemory, Mlx5Error> {
        let max = self.dev.attrs.max_dm_size;
        if want_bytes == 0 || !want_bytes.is_multiple_of(8) {
            return Err(Mlx5Error::BadSize {
                what: "device memory bytes (non-zero multiple of 8)",
                got: want_bytes,
                max,
            });
        }
        if max == 0 {
            log::warn!(
                "{} has no device memory (max_dm_size = 0): the lock table lives in \
                 host memory, and its atomics cross PCIe",
                self.dev.name
            );
            return self.host_fallback(want_bytes, access);
        }
        let len = want_bytes.min(max) & !7;
        let mut attr = ibv_alloc_dm_attr {
            length: len as usize,
            log_align_req: 3,
            comp_mask: 0,
        };
        // SAFETY: ctx is live; attr is a valid in-pointer.
        let dm = match unsafe { ibv_alloc_dm(self.dev.ctx, &mut attr) } {
            Some(p) if !p.is_null() => p,
            _ => {
                let e = Mlx5Error::last_os("ibv_alloc_dm");
                log::warn!("{e}: falling back to host memory for the lock table");
                return self.host_fallback(want_bytes, access);
            }
        };
        // Zero-based: remote addresses are offsets into the DM.
        let flags = access_to_ibv(access) | ibv_access_flags::IBV_ACCESS_ZERO_BASED.0;
        // SAFETY: pd and dm belong to this context; the MR is deregistered
        // before the DM is freed (DeviceMemory's Drop).
        let mr = match unsafe { ibv_reg_dm_mr(self.dev.pd, dm, 0, len as usize, flags) } {
            Some(p) if !p.is_null() => p,
            _ => {
                let e = Mlx5Error::last_os("ibv_reg_dm_mr");
                // SAFETY: freeing the DM allocated above, once.
                unsafe { ibv_free_dm(dm) };
                return Err(e);
            }
        };
        // Device memory is not zeroed on allocation; lock words must start 0.
        let zeros = vec![0u8; len as usize];
        // SAFETY: dm is live and `len` bytes long; zeros is `len` bytes.
        let rc = unsafe { ibv_memcpy_to_dm(dm, 0, zeros.as_ptr().cast(), len as usize) };
        let out = DeviceMemory {
            backing: DmBacking::Device {
                dm,
                mr,
                len,
                _dev: self.dev.clone(),
            },
        };
        if rc != 0 {
            return Err(Mlx5Error::errno("ibv_memcpy_to_dm", rc));
        }
        Ok(out)
    }

    fn host_fallback(&self, len: u64, access: Access) -> Result<DeviceMemory, Mlx5Error> {
        let mem = HeapMem::zeroed(len as usize).ok_or(Mlx5Error::BadSize {
            what: "host fallback for device memory",
            got: len,
            max: isize::MAX as u64,
        })?;
        let mr = self.register(mem, access).map_err(Mlx5Error::Register)?;
        Ok(DeviceMemory {
            backing: DmBacking::Host(mr),
        })
    }
}

/// The largest inline size of [`INLINE_TRIES`] the driver grants, learnt
/// from throwaway QPs, so that `caps()` tells the executor what every QP
/// will accept.
fn probe_inline(dev: &Device) -> Result<u32, Mlx5Error> {
    // SAFETY: the context is live; the CQ is destroyed below.
    let cq = unsafe { ibv_create_cq(dev.ctx, 1, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
    if cq.is_null() {
        return Err(Mlx5Error::last_os("ibv_create_cq (inline probe)"));
    }
    let mut r = Err(Mlx5Error::NoDevice);
    for want in INLINE_TRIES {
        // SAFETY: PD and CQ are live and of one context.
        r = unsafe { super::qp::create_rc_qp(dev.pd, cq, 1, want) }.map(|(qp, granted)| {
            // SAFETY: the probe QP was just created; destroyed once.
            unsafe { ibv_destroy_qp(qp) };
            granted.min(want)
        });
        if r.is_ok() {
            break;
        }
    }
    // SAFETY: its QPs are destroyed; destroyed once.
    unsafe { ibv_destroy_cq(cq) };
    r
}

fn query_attrs(ctx: *mut ibv_context) -> Result<DeviceAttrs, Mlx5Error> {
    let mut ex: ibv_device_attr_ex = zeroed();
    // SAFETY: ctx is live; a null input is allowed (verbs.h); ex is a valid
    // out-pointer of the size the call is told.
    let rc = unsafe { ibv_query_device_ex(ctx, std::ptr::null(), &mut ex) };
    if rc != 0 {
        return Err(Mlx5Error::errno("ibv_query_device_ex", rc));
    }
    let o = &ex.orig_attr;
    Ok(DeviceAttrs {
        max_qp_wr: o.max_qp_wr.max(0) as u32,
        max_cqe: o.max_cqe.max(0) as u32,
        max_mr_size: o.max_mr_size,
        max_qp_init_rd_atom: o.max_qp_init_rd_atom.clamp(0, 255) as u8,
        max_qp_rd_atom: o.max_qp_rd_atom.clamp(0, 255) as u8,
        max_dm_size: ex.max_dm_size,
        atomics: o.atomic_cap != ibv_atomic_cap::IBV_ATOMIC_NONE,
    })
}

fn query_port(
    ctx: *mut ibv_context,
    name: &str,
    port: u8,
    gid_index: u8,
) -> Result<PortInfo, Mlx5Error> {
    let mut pa: ibv_port_attr = zeroed();
    // SAFETY: ctx is live; pa is a valid out-pointer.
    let rc = unsafe { ___ibv_query_port(ctx, port, &mut pa) };
    if rc != 0 {
        return Err(Mlx5Error::errno("ibv_query_port", rc));
    }
    if pa.state != ibv_port_state::IBV_PORT_ACTIVE {
        return Err(Mlx5Error::PortNotActive {
            device: name.to_string(),
            port,
            state: pa.state,
        });
    }
    let mut gid: ibv_gid = zeroed();
    // SAFETY: ctx is live; gid is a valid out-pointer.
    let rc = unsafe { ibv_query_gid(ctx, port, gid_index as i32, &mut gid) };
    if rc != 0 {
        return Err(Mlx5Error::errno("ibv_query_gid", rc));
    }
    // SAFETY: every bit pattern of the union is a valid byte array.
    let gid = unsafe { gid.raw };
    let roce = pa.link_layer == LINK_LAYER_ETHERNET;
    if roce {
        check_roce_gid(
            &gid,
            name,
            port,
            gid_index,
            &gids::gid_types(std::path::Path::new(gids::SYSFS_INFINIBAND), name, port),
        )?;
    }
    Ok(PortInfo {
        port,
        lid: pa.lid,
        gid,
        gid_index,
        mtu: pa.active_mtu as u8,
        roce,
        max_msg_sz: pa.max_msg_sz,
    })
}

/// A RoCE port's GID at `index` must be populated: libibverbs returns an
/// all-zero GID for an empty entry, which a peer cannot route to (its
/// RTR fails, or every request retries out). A RoCE v1 entry is taken,
/// with a warning: RoCE v2 is what routed fabrics carry. `types` is the
/// port's table as [`gids::gid_types`] reads it.
pub fn check_roce_gid(
    gid: &[u8; 16],
    device: &str,
    port: u8,
    index: u8,
    types: &[(u8, String)],
) -> Result<(), Mlx5Error> {
    let v2 = gids::roce_v2(types);
    if gid.iter().all(|&b| b == 0) {
        return Err(Mlx5Error::EmptyGid {
            device: device.to_string(),
            port,
            index,
            roce_v2: v2,
        });
    }
    if gids::is_roce_v1(types, index) {
        log::warn!(
            "{device} port {port}: GID index {index} is RoCE v1, which routed fabrics do not \
             carry; RoCE v2 entries: {v2:?} (backend.gid_index, --gid-index or \
             LOCH_MLX5_GID_INDEX; every node must use the same RoCE version)"
        );
    }
    Ok(())
}

impl Nic for Mlx5Nic {
    type Qp = super::Mlx5Qp;
    type Cq = super::Mlx5Cq;
    type Reg = Mlx5Reg;

    fn caps(&self) -> Caps {
        self.caps
    }

    fn now_ns(&self) -> u64 {
        crate::clock::now_ns()
    }

    fn register<M: RegisterableMemory>(
        &self,
        mem: M,
        access: Access,
    ) -> Result<Mr<M, Mlx5Reg>, RegError> {
        // SAFETY: the Mr owns `mem` and drops the registration first.
        let reg = unsafe { Mlx5Reg::register_raw(&self.dev, mem.as_ptr(), mem.len(), access)? };
        Ok(Mr::new(reg, mem))
    }

    crate::local::shared_local_view!();
}

enum DmBacking {
    Device {
        dm: *mut ibv_dm,
        mr: *mut ibv_mr,
        len: u64,
        _dev: Arc<Device>,
    },
    Host(Mr<HeapMem, Mlx5Reg>),
}

/// Registered device memory (or its host-memory stand-in): what a memory
/// node exposes as [`Space::Device`](crate::Space::Device).
pub struct DeviceMemory {
    backing: DmBacking,
}

impl DeviceMemory {
    /// True when this is real on-NIC memory, false for the host fallback.
    pub fn on_device(&self) -> bool {
        matches!(self.backing, DmBacking::Device { .. })
    }

    pub fn len(&self) -> u64 {
        match &self.backing {
            DmBacking::Device { len, .. } => *len,
            DmBacking::Host(mr) => mr.len() as u64,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn rkey(&self) -> RKey {
        match &self.backing {
            // SAFETY: mr is live while self is.
            DmBacking::Device { mr, .. } => RKey(unsafe { (**mr).rkey }),
            DmBacking::Host(mr) => mr.rkey(),
        }
    }

    /// The address a peer names offset 0 with: 0 for zero-based device
    /// memory, the buffer's virtual address for the host fallback.
    pub fn remote_base(&self) -> u64 {
        match &self.backing {
            DmBacking::Device { .. } => 0,
            DmBacking::Host(mr) => mr.as_ptr() as u64,
        }
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        if let DmBacking::Device { dm, mr, .. } = self.backing {
            // Dependency order: the MR over the DM first, then the DM; the
            // Arc<Device> field drops after, keeping the PD alive until then.
            // SAFETY: both were made in alloc_device_memory and freed once.
            unsafe {
                if ibv_dereg_mr(mr) != 0 {
                    log::error!("ibv_dereg_mr on device memory failed");
                }
                if ibv_free_dm(dm) != 0 {
                    log::error!("ibv_free_dm failed");
                }
            }
        }
    }
}

// SAFETY: the DM and its MR are plain device handles usable from any
// thread; they are freed only in Drop.
unsafe impl Send for DeviceMemory {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Opening the device list turns fork protection on first (or finds
    /// the kernel needs none): it was never asked for before.
    #[test]
    fn the_device_list_makes_registrations_fork_safe() {
        let _ = with_device_list(|devs| Ok(devs.len()));
        // SAFETY: takes no arguments, reads libibverbs' own state.
        let status = unsafe { ibv_is_fork_initialized() };
        assert_ne!(status, IBV_FORK_DISABLED);
    }
}
