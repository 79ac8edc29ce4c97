//! Compute cores as OS threads, on any NIC backend: one thread per core,
//! pinned when asked, each making its own executor on its own thread (a
//! core's queue pairs and scratch are its alone) and running what it is
//! given on it.

use nicdrv::{Executor, Nic};

/// Runs `cores` threads named `loch-core-{i}`; thread `i` pins itself to
/// CPU `i mod cpus` when `pin`, makes its executor with `executor(i)`, and
/// returns `per_core(i, &mut executor)`. What each core returned, in core
/// order; an error when a thread could not start, had no executor, or
/// panicked (the cores already started still run to their end).
pub fn run_threads<N: Nic, R: Send>(
    cores: usize,
    pin: bool,
    executor: impl Fn(usize) -> Result<Executor<N>, String> + Sync,
    per_core: impl Fn(usize, &mut Executor<N>) -> R + Sync,
) -> Result<Vec<R>, String> {
    let cpus = core_affinity::get_core_ids().map_or(1, |c| c.len().max(1));
    std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(cores);
        for i in 0..cores {
            let (executor, per_core) = (&executor, &per_core);
            let spawned = std::thread::Builder::new()
                .name(format!("loch-core-{i}"))
                .spawn_scoped(s, move || {
                    if pin && !nicdrv::exec::pin_current_thread(i % cpus) {
                        log::warn!("could not pin core thread {i} to CPU {}", i % cpus);
                    }
                    let mut ex = executor(i).map_err(|e| format!("core {i}: {e}"))?;
                    Ok(per_core(i, &mut ex))
                });
            match spawned {
                Ok(h) => handles.push(h),
                // The scope joins the cores already started.
                Err(e) => return Err(format!("cannot start core {i}: {e}")),
            }
        }
        handles
            .into_iter()
            .enumerate()
            .map(|(i, h)| {
                h.join()
                    .unwrap_or_else(|_| Err(format!("core {i}: its thread panicked")))
            })
            .collect()
    })
}
