//! Huge pages, as every part of Loch that asks for them reports their
//! absence: the emu memory nodes (`emu`) and each core's registered
//! scratch (`mempool`) both fall back to ordinary pages, and the process
//! says so once, in one line, whichever asked first.

use std::sync::Once;

static WARN: Once = Once::new();

/// Warns, once per process, that huge pages were asked for and none could
/// be had (`why`).
pub fn warn_no_huge_pages(why: &std::io::Error) {
    WARN.call_once(|| {
        log::warn!(
            "2 MiB huge pages unavailable ({why}): memory and scratch use ordinary 4 KiB pages, so \
             address translation misses more often; reserve huge pages as root with \
             `echo N > /proc/sys/vm/nr_hugepages`, and where a cgroup limits them \
             (hugetlb.2MB.max) raise its limit (said once per process)"
        )
    });
}
