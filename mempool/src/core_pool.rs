//! A core's registered scratch region, sized from its executor config at
//! start.
//!
//! Owns one thing: making the [`HugeMem`] region, registered for local
//! writes, that a core's [`nicdrv::Executor`] carves into per-slot windows.
//! Promises: the region holds at least [`ExecutorConfig::scratch_bytes`],
//! is zeroed, is on huge pages when the kernel has them, and is made once,
//! before the core starts, so the data path never allocates or registers.
//!
//! The split with nicdrv: the per-slot arenas that hand out [`Buf`]s, and
//! the rules that stop the NIC from writing a buffer that was handed out
//! again, live in the executor (`nicdrv/src/exec/arena.rs`), because only it
//! knows which batches are in flight. This module only provides the memory.
//!
//! The mlx5 backend pins what it registers; whoever boots the node checks
//! the total against `RLIMIT_MEMLOCK` with [`crate::check_memlock`] first
//! (bootstrap's preflight checks the limit). The emu backend pins nothing.
//!
//! [`Buf`]: nicdrv::Buf

use crate::{HugeMem, MemError};
use nicdrv::exec::MAX_BATCH;
use nicdrv::{Access, ExecutorConfig, Mr, Nic};

/// The registered scratch region of one core.
pub struct CorePool<N: Nic> {
    mr: Mr<HugeMem, N::Reg>,
}

impl<N: Nic> CorePool<N> {
    /// Allocates `cfg.scratch_bytes()` of huge-page memory and registers it
    /// with [`Access::LOCAL_WRITE`] (the NIC writes READ results and atomic
    /// old values into it; peers never touch it).
    pub fn new(nic: &N, cfg: &ExecutorConfig) -> Result<CorePool<N>, MemError> {
        // ExecutorConfig::scratch_bytes multiplies without checking; check
        // first so an absurd config is an error here, not an overflow there.
        let fits = cfg
            .scratch_bytes_per_slot
            .checked_add(MAX_BATCH * 8)
            .and_then(|per_slot| per_slot.checked_mul(cfg.slots));
        if fits.is_none() {
            return Err(MemError::BadConfig(format!(
                "{} slots of {} scratch bytes each overflow the address space",
                cfg.slots, cfg.scratch_bytes_per_slot
            )));
        }
        let mem = HugeMem::alloc(cfg.scratch_bytes())?;
        let mr = nic
            .register(mem, Access::LOCAL_WRITE)
            .map_err(MemError::Register)?;
        Ok(CorePool { mr })
    }

    /// True when the region is on 2 MiB huge pages.
    pub fn is_huge(&self) -> bool {
        self.mr.memory().is_huge()
    }

    /// Registered bytes (at least `cfg.scratch_bytes()`).
    pub fn len(&self) -> usize {
        self.mr.len()
    }

    /// Always false: an empty region cannot be made.
    pub fn is_empty(&self) -> bool {
        self.mr.is_empty()
    }

    /// The registered region, to hand to [`nicdrv::Executor::new`] as its
    /// scratch.
    pub fn into_scratch(self) -> Mr<HugeMem, N::Reg> {
        self.mr
    }
}
