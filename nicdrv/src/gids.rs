//! A RoCE port's GID table as the kernel lists it in sysfs: which entries
//! are populated and which RoCE version each carries. Read both by the
//! mlx5 backend when it opens a device and by `loch check` (bootstrap's
//! preflight, under a root it is given), so the two judge an entry alike.
//! Plain files: no verbs, no `mlx5` feature needed.

use std::path::Path;

/// Where the kernel lists RDMA devices, their ports and GID tables.
pub const SYSFS_INFINIBAND: &str = "/sys/class/infiniband";

/// The type of each populated GID table entry of a port, by index, as
/// the kernel names it (`RoCE v2`, `IB/RoCE v1`), sorted:
/// `<root>/<device>/ports/<port>/gid_attrs/types/<index>`, `root` being
/// [`SYSFS_INFINIBAND`] on a live host. Empty when the table cannot be
/// read (no sysfs, an older kernel).
pub fn gid_types(root: &Path, device: &str, port: u8) -> Vec<(u8, String)> {
    let dir = root
        .join(device)
        .join("ports")
        .join(port.to_string())
        .join("gid_attrs")
        .join("types");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(u8, String)> = entries
        .flatten()
        .filter_map(|e| {
            let index = e.file_name().to_str()?.parse::<u8>().ok()?;
            // An unpopulated entry reads as an error (EINVAL) or empty.
            let ty = std::fs::read_to_string(e.path()).ok()?.trim().to_string();
            (!ty.is_empty()).then_some((index, ty))
        })
        .collect();
    out.sort();
    out
}

/// The RoCE v2 entries of a table [`gid_types`] read: the ones to offer
/// when the chosen entry will not do.
pub fn roce_v2(types: &[(u8, String)]) -> Vec<u8> {
    types
        .iter()
        .filter(|(_, t)| t == "RoCE v2")
        .map(|&(i, _)| i)
        .collect()
}

/// Whether entry `index` is RoCE v1, which routed fabrics do not carry.
pub fn is_roce_v1(types: &[(u8, String)], index: u8) -> bool {
    types.iter().any(|(i, t)| *i == index && t == "IB/RoCE v1")
}
