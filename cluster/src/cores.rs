//! Compute cores as OS threads, on any NIC backend: one thread per core,
//! pinned as asked, each making its own executor on its own thread (a
//! core's queue pairs and scratch are its alone) and running what it is
//! given on it, while the calling thread does what the run needs meanwhile
//! (barriers, a progress line).

use std::sync::atomic::{AtomicUsize, Ordering};

/// Which CPU each core's thread is pinned to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pinning<'a> {
    /// Not pinned.
    None,
    /// Core `i` on the `i mod n`-th of the n CPUs this process may use
    /// (its affinity mask: under `taskset` or a cpuset not CPUs 0..n).
    RoundRobin,
    /// Core `i` on CPU `cpus[i]` (a node's configured cores).
    Cpus(&'a [usize]),
}

impl Pinning<'_> {
    /// Core `i`'s CPU number, given the CPUs this process may use.
    fn cpu_of(self, i: usize, allowed: &[usize]) -> Option<usize> {
        match self {
            Pinning::None => None,
            Pinning::RoundRobin => allowed.get(i % allowed.len().max(1)).copied(),
            Pinning::Cpus(list) => list.get(i).copied(),
        }
    }
}

/// How many of [`run_threads_with`]'s core threads have ended so far,
/// returned or panicked: what `meanwhile` waits on when it waits for the
/// cores, so that a core that died is not waited for without end.
#[derive(Debug, Default)]
pub struct Ended(AtomicUsize);

impl Ended {
    /// Threads ended so far. Everything an ended thread wrote before it
    /// ended is visible to the caller that saw it counted.
    pub fn count(&self) -> usize {
        // Acquire: pairs with the Release of `EndGuard::drop`.
        self.0.load(Ordering::Acquire)
    }
}

/// Counts its thread in [`Ended`] as it drops: when the thread's work
/// returns, and when it unwinds from a panic.
struct EndGuard<'a>(&'a Ended);

impl Drop for EndGuard<'_> {
    fn drop(&mut self) {
        // Release: what the thread published before it ended (counters,
        // results in shared state) is visible to whoever sees the count.
        self.0 .0.fetch_add(1, Ordering::Release);
    }
}

/// Runs `cores` threads, named `loch-core-{i}` (`-{cpu}` for
/// [`Pinning::Cpus`]);
/// thread `i` pins itself as `pin` says and returns `per_core(i)`.
/// Meanwhile the calling thread runs `meanwhile`, told whether every thread
/// started (when one did not, `meanwhile` must release the cores already
/// started from any wait it holds them in: they are joined after it) and
/// handed the count of threads that ended, panicked ones included (a wait
/// for the cores waits on it, not on something each core sets as it
/// finishes, which a panic would skip). What `meanwhile` returned and
/// what each core returned, in core order; an error for a core whose
/// thread panicked.
pub fn run_threads_with<R: Send, M>(
    cores: usize,
    pin: Pinning<'_>,
    per_core: impl Fn(usize) -> R + Sync,
    meanwhile: impl FnOnce(Result<(), String>, &Ended) -> M,
) -> (M, Vec<Result<R, String>>) {
    let allowed: Vec<usize> = core_affinity::get_core_ids()
        .map(|ids| ids.into_iter().map(|c| c.id).collect())
        .unwrap_or_default();
    let ended = Ended::default();
    std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(cores);
        let mut started = Ok(());
        for i in 0..cores {
            let per_core = &per_core;
            let ended = &ended;
            let cpu = pin.cpu_of(i, &allowed);
            // A node's cores are named by their configured CPU.
            let name = match pin {
                Pinning::Cpus(_) => cpu.unwrap_or(i),
                _ => i,
            };
            let spawned = std::thread::Builder::new()
                .name(format!("loch-core-{name}"))
                .spawn_scoped(s, move || {
                    let _ended = EndGuard(ended);
                    if let Some(cpu) = cpu {
                        if !nicdrv::exec::pin_current_thread(cpu) {
                            log::warn!("could not pin core thread {i} to CPU {cpu}");
                        }
                    }
                    per_core(i)
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    started = Err(format!("cannot start the thread of core {i}: {e}"));
                    break;
                }
            }
        }
        let m = meanwhile(started, &ended);
        let results = handles
            .into_iter()
            .enumerate()
            .map(|(i, h)| {
                h.join()
                    .map_err(|_| format!("core {i}: its thread panicked"))
            })
            .collect();
        (m, results)
    })
}

/// [`run_threads_with`] with nothing to do meanwhile, for cores that each
/// make an executor with `executor(i)` and run `per_core(i, &mut it)`:
/// what each returned, or the first error (a thread that could not start,
/// a core without an executor, a panic).
pub fn run_threads<N: nicdrv::Nic, R: Send>(
    cores: usize,
    pin: Pinning<'_>,
    executor: impl Fn(usize) -> Result<nicdrv::Executor<N>, String> + Sync,
    per_core: impl Fn(usize, &mut nicdrv::Executor<N>) -> R + Sync,
) -> Result<Vec<R>, String> {
    let (started, results) = run_threads_with(
        cores,
        pin,
        |i| {
            let mut ex = executor(i).map_err(|e| format!("core {i}: {e}"))?;
            Ok(per_core(i, &mut ex))
        },
        |started, _| started,
    );
    started?;
    results.into_iter().map(|r| r.and_then(|r| r)).collect()
}

/// The conformance suite's parallel cases on a real-memory backend
/// (`Harness::parallel`): `tasks` tasks from `f` on each of `threads`
/// unpinned threads, each thread's executor from `executor` with one slot
/// per task. Panics if a thread cannot start: the case cannot run.
pub fn run_task_factory<N: nicdrv::Nic>(
    threads: usize,
    tasks: usize,
    executor: impl Fn(usize, nicdrv::ExecutorConfig) -> nicdrv::Executor<N> + Sync,
    f: &nicdrv::conformance::TaskFactory<N>,
) {
    let cfg = nicdrv::ExecutorConfig {
        slots: tasks,
        ..Default::default()
    };
    run_threads(
        threads,
        Pinning::None,
        |th| Ok(executor(th, cfg)),
        |th, ex| nicdrv::conformance::run_factory(ex, th, tasks, f),
    )
    .expect("conformance threads");
}

/// Runs `work` on `cores` cores as threads (module docs of
/// [`crate::work`]), on any NIC backend: core `i` pinned to CPU `i mod
/// cpus` when `pin`, on machine `machine_of(i)` when there is one, with
/// the executor `executor(machine_of(i))` makes on its thread; one group
/// per core, its tasks spawned, run to the end and finished there. What
/// each core's group reported, in core order.
pub fn run_workload<N: nicdrv::Nic, W: crate::Workload>(
    work: &W,
    cores: usize,
    pin: bool,
    machine_of: impl Fn(usize) -> Option<usize> + Sync,
    executor: impl Fn(Option<usize>) -> Result<nicdrv::Executor<N>, String> + Sync,
) -> Result<Vec<W::Out>, String> {
    let pin = if pin {
        Pinning::RoundRobin
    } else {
        Pinning::None
    };
    let executor = |core| executor(machine_of(core));
    run_threads(cores, pin, executor, |core, ex| {
        let group = work.group(core, cores);
        let place = crate::Place {
            core,
            compute_node: machine_of(core).unwrap_or(0),
        };
        work.spawn(place, &group, ex)
            .map_err(|e| format!("core {core}: {e}"))?;
        ex.run();
        Ok(work.finish(group, ex.counters()))
    })?
    .into_iter()
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn meanwhile_runs_while_the_cores_wait_for_it() {
        let go = AtomicBool::new(false);
        let (m, results) = run_threads_with(
            3,
            Pinning::None,
            |i| {
                // Acquire/Release: the flag is the only thing handed over.
                while !go.load(Ordering::Acquire) {
                    std::thread::yield_now();
                }
                i * 10
            },
            |started, _| {
                go.store(true, Ordering::Release);
                started.is_ok()
            },
        );
        assert!(m, "every thread started");
        let got: Vec<usize> = results.into_iter().map(Result::unwrap).collect();
        assert_eq!(got, [0, 10, 20], "in core order");
    }

    #[test]
    fn a_core_that_panics_is_an_error_and_the_others_still_report() {
        let (_, results) = run_threads_with(
            2,
            Pinning::None,
            |i| {
                assert!(i != 1, "core 1 fails on purpose");
                i
            },
            |_, _| (),
        );
        assert_eq!(results[0], Ok(0));
        assert!(results[1].as_ref().unwrap_err().contains("core 1"));
    }

    #[test]
    fn meanwhile_sees_a_core_that_panicked_as_ended() {
        // Core 1 panics before publishing anything; a wait for every
        // core to end must still end (the cores are joined only after
        // `meanwhile` returns, so a count that skipped the panic would
        // hold this test forever).
        let published = AtomicUsize::new(0);
        let (waited, results) = run_threads_with(
            3,
            Pinning::None,
            |i| {
                assert!(i != 1, "core 1 fails on purpose");
                // Relaxed: ordered by the end count's Release/Acquire.
                published.fetch_add(1, Ordering::Relaxed);
            },
            |started, ended| {
                assert!(started.is_ok());
                while ended.count() < 3 {
                    std::thread::yield_now();
                }
                // Both surviving cores' writes are visible once counted.
                published.load(Ordering::Relaxed)
            },
        );
        assert_eq!(waited, 2);
        assert!(results[1].is_err());
    }

    #[test]
    fn pinnings_name_their_cpus() {
        assert_eq!(Pinning::None.cpu_of(3, &[0, 1]), None);
        assert_eq!(Pinning::RoundRobin.cpu_of(3, &[0, 1]), Some(1));
        // Under a cpuset of CPUs 0, 1 and 3 (`taskset -c 0,1,3`): the
        // third core on CPU 3 (it was given CPU 2, which the process may
        // not use, and ran unpinned), the fourth back on CPU 0 (it was
        // given CPU 3, beside the third).
        assert_eq!(Pinning::RoundRobin.cpu_of(2, &[0, 1, 3]), Some(3));
        assert_eq!(Pinning::RoundRobin.cpu_of(3, &[0, 1, 3]), Some(0));
        assert_eq!(Pinning::RoundRobin.cpu_of(0, &[]), None);
        assert_eq!(Pinning::Cpus(&[4, 6]).cpu_of(1, &[0, 1]), Some(6));
        assert_eq!(Pinning::Cpus(&[4, 6]).cpu_of(2, &[0, 1]), None);
    }
}
