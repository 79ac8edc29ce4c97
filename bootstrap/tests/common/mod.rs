//! Helpers shared by the bootstrap tests: scratch directories and secrets.
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use bootstrap::wire::{Endpoint, Message, QpInfo, Region, Space};
use bootstrap::ClusterSecret;

/// A scratch directory, removed (with everything in it) when dropped, so
/// test runs leave nothing behind in the temporary directory.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh, empty directory unique to this process and call; removed when
/// the guard drops.
pub fn scratch(name: &str) -> Scratch {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir =
        std::env::temp_dir().join(format!("loch-bootstrap-{}-{name}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

pub fn write_mode(path: &Path, bytes: &[u8], mode: u32) {
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

pub fn secret(byte: u8) -> ClusterSecret {
    ClusterSecret::new(vec![byte; 32])
}

/// One of every control message, with edge-case fields (an empty and a
/// non-ASCII barrier name, the largest epoch).
pub fn sample_messages() -> Vec<Message> {
    let qp = QpInfo {
        qpn: 0x00ab_cdef,
        lid: 0x1234,
        gid: [9u8; 16],
        psn: 0x0012_3456,
        mtu: 5,
        rd_atom: 16,
    };
    vec![
        Message::Hello {
            node_id: 7,
            nonce: [3u8; 32],
            protocol: bootstrap::wire::PROTOCOL,
        },
        Message::Auth { mac: [0xa5; 32] },
        Message::Endpoint(Endpoint {
            node_id: 1,
            peer_id: 2,
            qp,
        }),
        Message::Region(Region {
            node_id: 1,
            space: Space::Host,
            base: 0x7f00_0000_0000,
            len: 256 << 20,
            rkey: 0xdead_beef,
        }),
        Message::Region(Region {
            node_id: 3,
            space: Space::Device,
            base: 0,
            len: 1 << 17,
            rkey: 1,
        }),
        Message::Barrier {
            name: "loaded".into(),
            epoch: 3,
        },
        Message::BarrierRelease {
            name: "ünïcode".into(),
            epoch: u64::MAX,
        },
        Message::Barrier {
            name: String::new(),
            epoch: 0,
        },
        Message::Bye,
        Message::Withdraw {
            node_id: 3,
            why: "--records must be 1..=100000000 (ünïcode)".into(),
        },
        Message::Withdraw {
            node_id: u32::MAX,
            why: String::new(),
        },
    ]
}
