//! HugeMem and CorePool on this machine: allocation, zeroing, the huge-page
//! fallback and its single warning, the memlock check, and a CorePool
//! region driving a real executor.

use mempool::{check_memlock, memlock_limit, CorePool, HugeMem, MemError, HUGE_PAGE_BYTES};
use nicdrv::emu::{EmuConfig, EmuNic};
use nicdrv::{ExecutorConfig, RegisterableMemory};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts warnings from mempool (this test binary's only logger).
struct CountWarnings;

static WARNINGS: AtomicUsize = AtomicUsize::new(0);

impl log::Log for CountWarnings {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record) {
        if r.level() == log::Level::Warn && r.target() == "nicdrv::pages" {
            assert!(
                r.args().to_string().contains("/proc/sys/vm/nr_hugepages"),
                "warning does not say how to reserve huge pages: {}",
                r.args()
            );
            // Relaxed: a plain counter, read after the allocating threads
            // joined (join synchronizes).
            WARNINGS.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn flush(&self) {}
}

static LOGGER: CountWarnings = CountWarnings;

fn read_all(m: &HugeMem) -> Vec<u8> {
    let mut v = vec![0u8; m.len()];
    // SAFETY: the mapping is m.len() readable bytes, and no NIC or other
    // thread writes it (it is not registered anywhere).
    unsafe { std::ptr::copy_nonoverlapping(m.as_ptr(), v.as_mut_ptr(), m.len()) };
    v
}

/// One test, so the warning count covers every allocation in this process.
#[test]
fn alloc_zeroed_fallback_and_one_warning() {
    log::set_logger(&LOGGER).unwrap();
    log::set_max_level(log::LevelFilter::Warn);

    assert!(matches!(HugeMem::alloc(0), Err(MemError::ZeroBytes)));
    let sizes = [1usize, 4096, 5000, 3 << 20];
    let mut any_small = false;
    let threads: Vec<_> = sizes
        .iter()
        .map(|&bytes| {
            std::thread::spawn(move || {
                let m = HugeMem::alloc(bytes).unwrap();
                assert!(m.len() >= bytes);
                assert!(!m.is_empty());
                assert_eq!(m.as_ptr() as usize % 4096, 0);
                if m.is_huge() {
                    assert_eq!(m.len() % HUGE_PAGE_BYTES, 0);
                    assert_eq!(m.as_ptr() as usize % HUGE_PAGE_BYTES, 0);
                }
                assert!(read_all(&m).iter().all(|&b| b == 0), "not zeroed");
                // Dirty it; the next mapping must still come back zeroed.
                // SAFETY: in bounds of our own unregistered mapping.
                unsafe { std::ptr::write_bytes(m.as_ptr(), 0xAB, m.len()) };
                assert_eq!(read_all(&m)[m.len() - 1], 0xAB);
                let huge = m.is_huge();
                drop(m);
                let again = HugeMem::alloc(bytes).unwrap();
                assert!(read_all(&again).iter().all(|&b| b == 0));
                // Through the trait the NIC uses, too.
                assert_eq!(RegisterableMemory::len(&again), again.len());
                huge && again.is_huge()
            })
        })
        .collect();
    for t in threads {
        any_small |= !t.join().unwrap();
    }
    let nic = EmuNic::new(EmuConfig::default());
    let cfg = ExecutorConfig::default();
    let pool = CorePool::new(&nic, &cfg).unwrap();
    any_small |= !pool.is_huge();
    assert!(pool.len() >= cfg.scratch_bytes());
    let mr = pool.into_scratch();
    assert!(mr.len() >= cfg.scratch_bytes());

    let warned = WARNINGS.load(Ordering::Relaxed);
    if any_small {
        assert_eq!(warned, 1, "the fallback must warn exactly once per process");
    } else {
        assert_eq!(warned, 0, "huge pages were used: no warning expected");
    }
}

#[test]
fn core_pool_rejects_overflowing_config() {
    let nic = EmuNic::new(EmuConfig::default());
    let cfg = ExecutorConfig {
        slots: usize::MAX / 2,
        scratch_bytes_per_slot: 1 << 20,
        poll_batch: 32,
    };
    assert!(matches!(
        CorePool::new(&nic, &cfg),
        Err(MemError::BadConfig(_))
    ));
}

/// The soft limit as the kernel reports it in /proc/self/limits.
fn proc_memlock_soft() -> Option<Option<u64>> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))?;
    let soft = line["Max locked memory".len()..]
        .split_whitespace()
        .next()?;
    Some(if soft == "unlimited" {
        None
    } else {
        Some(soft.parse().ok()?)
    })
}

#[test]
fn memlock_check_matches_the_limit() {
    if let Some(want) = proc_memlock_soft() {
        assert_eq!(memlock_limit(), want);
    }
    assert!(check_memlock(0).is_ok());
    match memlock_limit() {
        None => assert!(check_memlock(u64::MAX).is_ok()),
        Some(limit) => {
            assert!(check_memlock(limit).is_ok());
            let e = check_memlock(limit + 1).unwrap_err();
            assert!(matches!(
                e,
                MemError::MemlockTooLow { need_bytes, limit_bytes }
                    if need_bytes == limit + 1 && limit_bytes == limit
            ));
            let s = e.to_string();
            assert!(
                s.contains("ulimit -l unlimited") && s.contains("limits.conf"),
                "{s}"
            );
        }
    }
}
