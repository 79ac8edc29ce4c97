//! Global addresses: one 64-bit word that names a memory node, an address
//! space on it (host memory or the NIC's device memory) and a byte offset.
//!
//! Layout, high bit first: `node:16 | space:1 | offset:47`. Sherman packs node
//! and offset into one word; we take one offset bit for the address space so
//! that a device-memory lock word and a host-memory tree node are both plain
//! `GlobalAddr`s. 47 offset bits address 128 TiB per memory node.

use std::fmt;

/// Identifies a memory node in the cluster.
pub type NodeId = u16;

/// The two address spaces a memory node exposes.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Space {
    /// Host DRAM registered with the NIC (reached over PCIe by the NIC).
    Host = 0,
    /// On-NIC device memory (`ibv_alloc_dm`): small, and its atomics skip PCIe.
    Device = 1,
}

impl Space {
    pub const ALL: [Space; 2] = [Space::Host, Space::Device];

    pub fn index(self) -> usize {
        self as usize
    }
}

/// A remote address in one word.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(transparent)]
pub struct GlobalAddr(u64);

impl GlobalAddr {
    pub const OFFSET_BITS: u32 = 47;
    /// Largest offset representable in an address.
    pub const MAX_OFFSET: u64 = (1 << Self::OFFSET_BITS) - 1;
    const SPACE_BIT: u64 = 1 << Self::OFFSET_BITS;
    /// The null address. Offset 0 of node 0's host memory is the superblock
    /// (mempool reserves it), so no allocation ever returns this word.
    pub const NULL: GlobalAddr = GlobalAddr(0);

    /// Builds an address; `None` if the offset does not fit in 47 bits.
    pub const fn try_new(node: NodeId, space: Space, offset: u64) -> Option<GlobalAddr> {
        if offset > Self::MAX_OFFSET {
            return None;
        }
        let space_bit = match space {
            Space::Host => 0,
            Space::Device => Self::SPACE_BIT,
        };
        Some(GlobalAddr(((node as u64) << 48) | space_bit | offset))
    }

    /// Builds an address. Panics if the offset exceeds 47 bits: callers derive
    /// offsets from node sizes that were validated when the node was created.
    pub const fn new(node: NodeId, space: Space, offset: u64) -> GlobalAddr {
        match Self::try_new(node, space, offset) {
            Some(a) => a,
            None => panic!("GlobalAddr offset exceeds 47 bits"),
        }
    }

    pub const fn host(node: NodeId, offset: u64) -> GlobalAddr {
        Self::new(node, Space::Host, offset)
    }

    pub const fn device(node: NodeId, offset: u64) -> GlobalAddr {
        Self::new(node, Space::Device, offset)
    }

    pub const fn from_raw(raw: u64) -> GlobalAddr {
        GlobalAddr(raw)
    }

    pub const fn raw(self) -> u64 {
        self.0
    }

    pub const fn node(self) -> NodeId {
        (self.0 >> 48) as NodeId
    }

    pub const fn space(self) -> Space {
        if self.0 & Self::SPACE_BIT != 0 {
            Space::Device
        } else {
            Space::Host
        }
    }

    pub const fn offset(self) -> u64 {
        self.0 & Self::MAX_OFFSET
    }

    pub const fn is_null(self) -> bool {
        self.0 == 0
    }

    /// The address `bytes` further on in the same node and space; `None` on
    /// overflow of the 47-bit offset.
    pub const fn checked_add(self, bytes: u64) -> Option<GlobalAddr> {
        match self.offset().checked_add(bytes) {
            Some(off) => Self::try_new(self.node(), self.space(), off),
            None => None,
        }
    }

    /// Like [`checked_add`](Self::checked_add) for offsets known to fit.
    pub const fn add(self, bytes: u64) -> GlobalAddr {
        match self.checked_add(bytes) {
            Some(a) => a,
            None => panic!("GlobalAddr offset overflow"),
        }
    }
}

impl fmt::Debug for GlobalAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for GlobalAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let space = match self.space() {
            Space::Host => "host",
            Space::Device => "dm",
        };
        write!(f, "{}:{}:{:#x}", self.node(), space, self.offset())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_fields() {
        for &(node, space, off) in &[
            (0u16, Space::Host, 0u64),
            (7, Space::Device, 0x1234),
            (u16::MAX, Space::Device, GlobalAddr::MAX_OFFSET),
            (513, Space::Host, 1 << 40),
        ] {
            let a = GlobalAddr::new(node, space, off);
            assert_eq!((a.node(), a.space(), a.offset()), (node, space, off));
            assert_eq!(GlobalAddr::from_raw(a.raw()), a);
        }
    }

    #[test]
    fn rejects_oversized_offsets() {
        assert!(GlobalAddr::try_new(1, Space::Host, GlobalAddr::MAX_OFFSET + 1).is_none());
        let top = GlobalAddr::host(3, GlobalAddr::MAX_OFFSET);
        assert!(top.checked_add(1).is_none());
        assert_eq!(
            GlobalAddr::host(3, 8).checked_add(8),
            Some(GlobalAddr::host(3, 16))
        );
    }

    #[test]
    fn null_is_zero() {
        assert!(GlobalAddr::NULL.is_null());
        assert!(!GlobalAddr::device(0, 0).is_null());
        assert_eq!(format!("{}", GlobalAddr::device(2, 0x40)), "2:dm:0x40");
    }
}
