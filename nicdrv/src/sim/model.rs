//! The simulator's model of a ConnectX-5-class fabric: every parameter in
//! one struct, each with its unit in its name and where its default comes
//! from: perftest reports for ConnectX-5 100 Gb/s NICs, NIC atomic
//! measurements (Kalia et al., ATC'16, and later work) and the
//! RDMA_CAS / RDMA_WRITE figures of the Sherman paper (§3.2, Figures 2–3).
//! The resulting round trips (small READ ≈ 2.1 µs, 1 KiB ≈ 2.4 µs) are
//! checked by `defaults_match_the_published_figures`.

/// Timing and capacity of the simulated fabric.
#[derive(Clone, Debug, PartialEq)]
pub struct SimModel {
    /// One-way latency between a compute NIC and a memory NIC: NIC, wire
    /// and one switch, without the memory node's PCIe. 750 ns: perftest's
    /// 8 B WRITE at 0.93 µs half round trip on ConnectX-5 (perftest issue
    /// #131) less the ~0.2 µs of PCIe on the requester side, plus one switch
    /// hop of ~250 ns (IBM tulips notes).
    pub link_latency_ns_one_way: u64,
    /// Per-NIC bandwidth in each direction: 12.0 GB/s, the ~96.6 Gb/s
    /// ib_write_bw ceiling of EDR/100 GbE NICs.
    pub nic_bandwidth_bytes_per_sec: u64,
    /// Inbound small-message rate a memory NIC sustains: 55 Mops (SMART's
    /// CX-6 measurements at 32 outstanding per thread; Sherman Fig. 3 shows
    /// >50 Mops for small WRITEs on CX-5).
    pub nic_msg_rate_per_sec: u64,
    /// Wire bytes of a request or response header (BTH + RETH, ~28–40 B),
    /// charged against bandwidth on top of payloads.
    pub header_bytes: u64,
    /// PCIe DMA read at the memory node for 8–64 B: 550 ns (pcie-bench,
    /// SIGCOMM'18: 541–546 ns for 8–64 B).
    pub pcie_read_ns_small: u64,
    /// PCIe DMA read for 1 KiB: 850 ns (pcie-bench: 853 ns); sizes between
    /// interpolate linearly, larger ones extrapolate.
    pub pcie_read_ns_1k: u64,
    /// A NIC atomic on host memory, serialized per atomic slot: 500 ns,
    /// ≈2 Mops on one hot address (2.04 Mops same-address CAS measured on
    /// CX-6; Kalia ATC'16 reports the same order on CX-3).
    pub host_atomic_ns: u64,
    /// A NIC atomic on device memory, serialized per slot: 120 ns, ≈8 Mops
    /// on one hot address (8.65 Mops same-address CAS in device memory).
    /// This gap is what makes Sherman's on-chip locks pay (§3.2 Fig. 2:
    /// 2.89× with on-chip locks).
    pub dm_atomic_ns: u64,
    /// All atomics of one NIC, whatever the address: 35 Mops (42.3 Mops
    /// uncontended CAS on CX-6 per Fusa §III, less for CX-5; unverified).
    pub nic_atomic_rate_per_sec: u64,
    /// Atomic serialization slots per NIC: 512; addresses 4 KiB apart share
    /// one (Fusa §II-B; Ziegler et al. SIGMOD'23).
    pub atomic_slots: u32,
    /// Atomics one NIC holds at once, waiting for their slot or executing;
    /// 0 means unbounded. When all are taken, an arriving atomic stalls the
    /// NIC's in-order inbound pipeline, so a CAS storm on one hot host-memory
    /// word slows every request to that NIC, not only its own atomics. This
    /// is the interference that makes spinning CAS locks collapse on real
    /// NICs (ShiftLock FAST'25 §2: 94.4% of CASes are retries with 240
    /// clients on one lock; Sherman §3.1.1: FG falls from 18 to 0.34 Mops
    /// at zipf 0.99). No vendor document gives the number: 64 is
    /// calibrated so FG+ at Sherman's setup lands near that published
    /// collapse (bench/paper/README.md shows the sensitivity).
    pub atomic_window: u32,
    /// CPU cost of a doorbell on the posting thread: 300 ns (estimate; the
    /// perftest README's post_list note suggests 100–500 ns).
    pub cpu_post_ns: u64,
    /// CPU cost of each extra request chained on one doorbell: 50 ns
    /// (estimate).
    pub cpu_post_extra_wr_ns: u64,
    /// CPU cost of polling one completion: 70 ns (estimate, no source).
    pub cpu_poll_ns: u64,
    /// CPU cost of one step of a task (one poll of its future between two
    /// awaits): 100 ns (estimate; a coroutine switch and a little logic).
    pub cpu_step_ns: u64,
    /// CPU cost of the local view per 64-byte line it touches (a word
    /// load, store or CAS is one line): 20 ns (estimate: a last-level-cache
    /// hit, ~40–70 cycles at 2–3 GHz on recent Xeons, as DDIO places
    /// inbound NIC writes in the LLC where a polling core finds them).
    pub cpu_local_line_ns: u64,
    /// How long a requester waits for an answer before it completes the
    /// request with `RetryExceeded` (the RC transport's retry budget):
    /// 1 ms here, shorter than real NICs' defaults so fault tests are quick.
    pub transport_timeout_ns: u64,
    /// Lines of a multi-line READ are sampled in increasing address order
    /// (Sherman's NICs, per its `Common.h`) instead of random order (what the
    /// PCIe spec allows, per Ziegler et al.). Default: random.
    pub in_order_reads: bool,
}

impl Default for SimModel {
    fn default() -> Self {
        SimModel {
            link_latency_ns_one_way: 750,
            nic_bandwidth_bytes_per_sec: 12_000_000_000,
            nic_msg_rate_per_sec: 55_000_000,
            header_bytes: 32,
            pcie_read_ns_small: 550,
            pcie_read_ns_1k: 850,
            host_atomic_ns: 500,
            dm_atomic_ns: 120,
            nic_atomic_rate_per_sec: 35_000_000,
            atomic_slots: 512,
            atomic_window: 64,
            cpu_post_ns: 300,
            cpu_post_extra_wr_ns: 50,
            cpu_poll_ns: 70,
            cpu_step_ns: 100,
            cpu_local_line_ns: 20,
            transport_timeout_ns: 1_000_000,
            in_order_reads: false,
        }
    }
}

/// A numeric model parameter, by the width of its field.
enum Field<'a> {
    Wide(&'a mut u64),
    Narrow(&'a mut u32),
}

impl SimModel {
    /// Nanoseconds to move `bytes` at the NIC's bandwidth (at least 1 for
    /// a non-empty transfer).
    pub fn xfer_ns(&self, bytes: u64) -> u64 {
        if bytes == 0 {
            return 0;
        }
        ((bytes as u128 * 1_000_000_000).div_ceil(self.nic_bandwidth_bytes_per_sec as u128)) as u64
    }

    /// PCIe read latency for a READ of `len` bytes from host memory.
    pub fn pcie_read_ns(&self, len: u64) -> u64 {
        if len <= 64 {
            return self.pcie_read_ns_small;
        }
        let slope = self.pcie_read_ns_1k.saturating_sub(self.pcie_read_ns_small) as u128;
        self.pcie_read_ns_small + ((len - 64) as u128 * slope / (1024 - 64)) as u64
    }

    pub(crate) fn per_op_ns(rate_per_sec: u64) -> u64 {
        (1_000_000_000u64).div_ceil(rate_per_sec)
    }

    /// Every numeric parameter by field name: the one list `numeric`,
    /// `overrides` and `set` all read.
    fn fields(&mut self) -> [(&'static str, Field<'_>); 17] {
        use Field::{Narrow, Wide};
        [
            (
                "link_latency_ns_one_way",
                Wide(&mut self.link_latency_ns_one_way),
            ),
            (
                "nic_bandwidth_bytes_per_sec",
                Wide(&mut self.nic_bandwidth_bytes_per_sec),
            ),
            ("nic_msg_rate_per_sec", Wide(&mut self.nic_msg_rate_per_sec)),
            ("header_bytes", Wide(&mut self.header_bytes)),
            ("pcie_read_ns_small", Wide(&mut self.pcie_read_ns_small)),
            ("pcie_read_ns_1k", Wide(&mut self.pcie_read_ns_1k)),
            ("host_atomic_ns", Wide(&mut self.host_atomic_ns)),
            ("dm_atomic_ns", Wide(&mut self.dm_atomic_ns)),
            (
                "nic_atomic_rate_per_sec",
                Wide(&mut self.nic_atomic_rate_per_sec),
            ),
            ("atomic_slots", Narrow(&mut self.atomic_slots)),
            ("atomic_window", Narrow(&mut self.atomic_window)),
            ("cpu_post_ns", Wide(&mut self.cpu_post_ns)),
            ("cpu_post_extra_wr_ns", Wide(&mut self.cpu_post_extra_wr_ns)),
            ("cpu_poll_ns", Wide(&mut self.cpu_poll_ns)),
            ("cpu_step_ns", Wide(&mut self.cpu_step_ns)),
            ("cpu_local_line_ns", Wide(&mut self.cpu_local_line_ns)),
            ("transport_timeout_ns", Wide(&mut self.transport_timeout_ns)),
        ]
    }

    /// Every numeric parameter by field name, with its value.
    pub fn numeric(&self) -> Vec<(&'static str, u64)> {
        let mut copy = self.clone();
        copy.fields()
            .into_iter()
            .map(|(name, f)| {
                let v = match f {
                    Field::Wide(v) => *v,
                    Field::Narrow(v) => *v as u64,
                };
                (name, v)
            })
            .collect()
    }

    /// The numeric parameters that differ from the defaults.
    pub fn overrides(&self) -> std::collections::BTreeMap<&'static str, u64> {
        let d = SimModel::default().numeric();
        self.numeric()
            .into_iter()
            .zip(d)
            .filter(|(a, b)| a.1 != b.1)
            .map(|(a, _)| a)
            .collect()
    }

    /// Sets one numeric parameter by its field name (`--sim-model` of
    /// `loch-bench run`); `check` still has to pass afterwards.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        let v: u64 = value
            .parse()
            .map_err(|_| format!("model.{name}: `{value}` is not a non-negative integer"))?;
        let (_, field) = self
            .fields()
            .into_iter()
            .find(|(n, _)| *n == name)
            .ok_or_else(|| format!("model.{name}: no such numeric parameter"))?;
        match field {
            Field::Wide(f) => *f = v,
            Field::Narrow(f) => {
                *f = u32::try_from(v)
                    .map_err(|_| format!("model.{name}: {v} is above {}", u32::MAX))?
            }
        }
        Ok(())
    }

    /// Rejects models that cannot run.
    pub fn check(&self) -> Result<(), String> {
        let positive = [
            (
                "nic_bandwidth_bytes_per_sec",
                self.nic_bandwidth_bytes_per_sec,
            ),
            ("nic_msg_rate_per_sec", self.nic_msg_rate_per_sec),
            ("nic_atomic_rate_per_sec", self.nic_atomic_rate_per_sec),
            ("atomic_slots", self.atomic_slots as u64),
            ("transport_timeout_ns", self.transport_timeout_ns),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(format!("model.{name} must be positive"));
            }
        }
        let times = [
            self.link_latency_ns_one_way,
            self.pcie_read_ns_small,
            self.pcie_read_ns_1k,
            self.host_atomic_ns,
            self.dm_atomic_ns,
            self.cpu_post_ns,
            self.cpu_post_extra_wr_ns,
            self.cpu_poll_ns,
            self.cpu_step_ns,
            self.cpu_local_line_ns,
            self.transport_timeout_ns,
        ];
        if times.iter().any(|&t| t > 3_600_000_000_000) {
            return Err("model times must be below one hour".into());
        }
        // A wire takes time: a verb's effect lands strictly after its post
        // and strictly before its completion, which the history checker's
        // tie rule relies on (an operation completed at t precedes one
        // invoked at t).
        if self.link_latency_ns_one_way == 0 {
            return Err("model.link_latency_ns_one_way must be positive".into());
        }
        // A packet's header is tens of bytes; the bound keeps the sums of
        // lengths the simulator makes with it from wrapping.
        if self.header_bytes > 1 << 20 {
            return Err(format!(
                "model.header_bytes must be at most 1 MiB (got {})",
                self.header_bytes
            ));
        }
        Ok(())
    }

    /// A small READ's round trip as modelled (no queueing): two link
    /// latencies, the PCIe read and the transfer.
    pub fn read_rtt_ns(&self, len: u64) -> u64 {
        2 * self.link_latency_ns_one_way
            + self.pcie_read_ns(len)
            + self.xfer_ns(len + self.header_bytes)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn every_numeric_parameter_can_be_set_by_name() {
        let mut m = SimModel::default();
        for (name, v) in SimModel::default().numeric() {
            m.set(name, &(v + 1).to_string()).unwrap();
        }
        for ((name, v), (_, d)) in m.numeric().into_iter().zip(SimModel::default().numeric()) {
            assert_eq!(v, d + 1, "{name}");
        }
        assert_eq!(m.overrides().len(), m.numeric().len());
        assert!(SimModel::default().overrides().is_empty());
        assert!(m.set("no_such_thing", "1").is_err());
        assert!(m.set("atomic_window", "-1").is_err());
        assert!(m.set("atomic_slots", "99999999999").is_err());
    }

    use super::*;

    #[test]
    fn defaults_match_the_published_figures() {
        let m = SimModel::default();
        m.check().unwrap();
        // perftest on CX-5: small READ round trip ≈ 2.1 µs; 1 KiB ≈ 2.4 µs.
        let small = m.read_rtt_ns(8);
        let kib = m.read_rtt_ns(1024);
        assert!((2000..=2200).contains(&small), "{small}");
        assert!((2300..=2550).contains(&kib), "{kib}");
        // Hot-address atomics: ≈2 Mops host, ≈8 Mops device memory.
        assert_eq!(1_000_000_000 / m.host_atomic_ns, 2_000_000);
        assert!((8_000_000..=8_500_000).contains(&(1_000_000_000 / m.dm_atomic_ns)));
        assert_eq!(m.xfer_ns(12_000), 1000);
    }

    #[test]
    fn impossible_models_are_refused() {
        let m = SimModel {
            nic_bandwidth_bytes_per_sec: 0,
            ..Default::default()
        };
        assert!(m.check().unwrap_err().contains("bandwidth"));
        let m = SimModel {
            atomic_slots: 0,
            ..Default::default()
        };
        assert!(m.check().is_err());
    }
}
