//! The tree's configuration: Sherman's techniques, each switchable on its
//! own, and the FG+ baseline (Sherman §5.1) as a preset.

use mempool::ChunkConfig;

/// How a reader decides a node it read is consistent.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum VersionScheme {
    /// A version byte in every 64-byte line; all must agree (ours).
    Lines,
    /// Sherman's two-level scheme: front/rear node versions plus front/rear
    /// 4-bit entry versions. Fooled by out-of-order line writes; kept so
    /// the simulator can show the anomaly.
    FrontRear,
}

/// Everything that shapes a tree and how clients change it. Every compute
/// node of a cluster must use the same layout-relevant values
/// (`lock_table_words`, `lock_in_dm`, `chunk`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeConfig {
    /// Write back only the changed entry and release the lock in the same
    /// doorbell (command combination, Sherman §4.3).
    pub combine: bool,
    /// The global lock table lives in the NIC's device memory (on-chip
    /// locks); otherwise each node's own lock word in host memory is used.
    pub lock_in_dm: bool,
    /// A local lock table per compute node: its threads take a lock there
    /// before any of them tries the global word (HOCL).
    pub local_lock_table: bool,
    /// The local lock table serves a lock's waiters in FIFO order (a
    /// ticket queue per entry, Sherman's wait queues); otherwise an entry
    /// is a test-and-set word that whichever local thread tries first
    /// after a release takes (Sherman §5.7's step before wait queues).
    /// Needs `local_lock_table`.
    pub local_wait_queue: bool,
    /// A releasing holder hands the lock to the next local waiter without a
    /// remote release. Needs `local_wait_queue` (a next waiter).
    pub handover: bool,
    /// Handovers in a row before a remote release: 8, as Sherman's code
    /// (`define::kMaxHandOverTime`; the paper's text says 4). With 4, the
    /// queue heads of other compute nodes wait for more bursts on a hot
    /// lock: at the paper's setup the write p99 is 15 round trips instead
    /// of 8 (bench/paper/README.md).
    pub max_handover: u32,
    /// A write posts the lock CAS and the node READ in one doorbell on the
    /// node's queue pair (executed in order: the READ sees the node as of
    /// after the CAS; a failed CAS's READ is dropped): locking and reading
    /// take one round trip instead of two. Beyond the paper.
    pub lock_with_read: bool,
    /// A handed-over lock comes with the holder's up-to-date copy of the
    /// node, so the new holder reads nothing: a handed-over write is one
    /// round trip. Needs `handover`. Beyond the paper.
    pub handover_page: bool,
    /// How readers check that a node they read is consistent.
    pub versions: VersionScheme,
    /// Leaves keep entries sorted and every change writes the whole node
    /// back (FG+); otherwise leaves are unsorted and entries change in place.
    pub whole_node_writes: bool,
    /// Lock words per memory node in device memory (32 Ki in 256 KiB by
    /// default; cut down to the device memory a node has).
    pub lock_table_words: u64,
    /// Bytes of internal nodes a compute node caches.
    pub cache_bytes: usize,
    /// How memory nodes are cut into chunks for node allocation.
    pub chunk: ChunkConfig,
    /// Bytes of a leaf's value, 8 to 1024: fixed for the tree's life (it
    /// shapes the nodes, [`super::layout`]); every compute node must use
    /// the same.
    pub value_bytes: usize,
    /// How long a client tries for a node's lock that stays taken before
    /// it gives the operation up ([`super::TreeError::LockWait`]): 10 s.
    /// Sherman's locks have no leases, so a client that died holding one
    /// would otherwise leave every writer of that node waiting for good.
    /// Far beyond any wait a live holder causes (write p99s are
    /// milliseconds at the paper's contention), so it ends only hangs.
    pub lock_wait_ns: u64,
}

impl TreeConfig {
    /// Sherman with every technique on, for memory nodes of `node_bytes`
    /// bytes of host memory: 32 Ki lock words, a 64 MiB index cache, 1 MiB
    /// chunks.
    pub fn sherman(node_bytes: u64) -> TreeConfig {
        TreeConfig {
            combine: true,
            lock_in_dm: true,
            local_lock_table: true,
            local_wait_queue: true,
            handover: true,
            max_handover: 8,
            lock_with_read: false,
            handover_page: false,
            versions: VersionScheme::Lines,
            whole_node_writes: false,
            lock_table_words: 32 * 1024,
            cache_bytes: 64 << 20,
            chunk: ChunkConfig {
                chunk_bytes: 1 << 20,
                ..ChunkConfig::new(node_bytes)
            },
            value_bytes: 8,
            lock_wait_ns: 10_000_000_000,
        }
    }

    /// The FG+ baseline: sorted leaves written back whole, a node-level
    /// check, locks by CAS on the node's word in host memory, no
    /// combination, no local lock table; the same cache.
    pub fn fg_plus(node_bytes: u64) -> TreeConfig {
        TreeConfig {
            combine: false,
            lock_in_dm: false,
            local_lock_table: false,
            local_wait_queue: false,
            handover: false,
            whole_node_writes: true,
            ..TreeConfig::sherman(node_bytes)
        }
    }

    /// The configurations the benchmarks compare, by name: `sherman`,
    /// `sherman-2rt` (Sherman with the lock and the read in one doorbell
    /// and the page handed over with the lock: writes in two round trips,
    /// handed-over ones in one), `sherman-paper-versions` (Sherman with
    /// its own front/rear versions), `fg` (or `fg+`), and Sherman §5.2.1's breakdown adding one technique
    /// at a time to FG+: `fg+comb`, `fg+comb+onchip`, `fg+comb+onchip+hier`.
    /// `None` for any other name.
    pub fn named(name: &str, node_bytes: u64) -> Option<TreeConfig> {
        let fg = TreeConfig::fg_plus(node_bytes);
        Some(match name {
            "sherman" => TreeConfig::sherman(node_bytes),
            "sherman-2rt" => TreeConfig {
                lock_with_read: true,
                handover_page: true,
                ..TreeConfig::sherman(node_bytes)
            },
            "sherman-paper-versions" => TreeConfig {
                versions: VersionScheme::FrontRear,
                ..TreeConfig::sherman(node_bytes)
            },
            "fg" | "fg+" => fg,
            "fg+comb" => TreeConfig {
                combine: true,
                ..fg
            },
            "fg+comb+onchip" => TreeConfig {
                combine: true,
                lock_in_dm: true,
                ..fg
            },
            "fg+comb+onchip+hier" => TreeConfig {
                combine: true,
                lock_in_dm: true,
                local_lock_table: true,
                local_wait_queue: true,
                handover: true,
                ..fg
            },
            _ => return None,
        })
    }

    /// The names [`TreeConfig::named`] knows, in its order.
    pub const NAMES: &'static str =
        "sherman, sherman-2rt, sherman-paper-versions, fg, fg+comb, fg+comb+onchip, fg+comb+onchip+hier";

    /// Rejects configurations a tree cannot run with; the error says why
    /// in words.
    pub fn check(&self) -> Result<(), String> {
        if self.lock_table_words == 0 {
            return Err("lock_table_words must be positive".into());
        }
        if self.lock_wait_ns == 0 {
            return Err("lock_wait_ns must be positive".into());
        }
        if self.local_wait_queue && !self.local_lock_table {
            return Err("wait queues need the local lock table".into());
        }
        if self.handover && !self.local_wait_queue {
            return Err("handover needs the local lock table's wait queues".into());
        }
        if self.handover_page && !self.handover {
            return Err("handing the page over needs handover".into());
        }
        // The value's size; the key's comes with the tree's key type
        // (`TreeOf::new` checks the two together).
        super::layout::Layout::new(8, self.value_bytes)?;
        if self.chunk.chunk_bytes < 4096 {
            return Err("chunks must hold at least a few nodes (4 KiB)".into());
        }
        self.chunk.validate().map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_names_a_valid_configuration_and_the_breakdown_adds_one_technique_at_a_time() {
        for name in TreeConfig::NAMES.split(", ") {
            let cfg = TreeConfig::named(name, 64 << 20).unwrap_or_else(|| panic!("{name}"));
            cfg.check().unwrap();
        }
        assert_eq!(
            TreeConfig::named("fg+", 1 << 20),
            TreeConfig::named("fg", 1 << 20)
        );
        assert_eq!(TreeConfig::named("nope", 1 << 20), None);
        let techniques = |c: TreeConfig| {
            [c.combine, c.lock_in_dm, c.local_lock_table && c.handover]
                .iter()
                .filter(|&&t| t)
                .count()
        };
        let steps: Vec<usize> = ["fg", "fg+comb", "fg+comb+onchip", "fg+comb+onchip+hier"]
            .iter()
            .map(|n| techniques(TreeConfig::named(n, 1 << 20).unwrap()))
            .collect();
        assert_eq!(steps, [0, 1, 2, 3]);
    }

    #[test]
    fn wait_queues_need_the_local_table_and_handover_needs_them() {
        let sherman = TreeConfig::sherman(1 << 20);
        let no_table = TreeConfig {
            local_lock_table: false,
            handover: false,
            ..sherman.clone()
        };
        assert!(no_table.check().unwrap_err().contains("wait queues"));
        let no_queue = TreeConfig {
            local_wait_queue: false,
            ..sherman.clone()
        };
        assert!(no_queue.check().unwrap_err().contains("handover"));
        TreeConfig {
            handover: false,
            ..no_queue
        }
        .check()
        .unwrap();
    }
}
