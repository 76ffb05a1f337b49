//! The runtime's thread pool: where every model run and every kernel measurement executes.
//!
//! A run's parallel loops (the gemm runtime's im2col, depthwise and epilogue tiles) go to this pool, and the
//! run itself executes on one of its threads, whoever calls it: `tessera run` from its main thread, the
//! compiler's validation and tune stages from a thread of their own while a zoo compiles. So a plan measured
//! during compilation ran in exactly the thread setting it runs in when deployed. (Measured before this pool
//! existed: the same MobileNetV2 plans compared 1.07x one way on a measurement pool and 0.87-0.97x the other
//! way from a main thread injecting into rayon's global pool, bench/collage.md.) The pool does nothing but
//! run kernels, so it never waits on the compiler's locks.

//!
//! Its size is the run's thread count, which every CPU kernel that threads honours (the gemm backend's GEMMs,
//! depthwise convolutions and epilogues; the `c` backend's parallel loops, through the parallel-for that
//! runtime/c.rs hands its modules): by default the cores
//! the process may run on (its CPU affinity, so `taskset` limits it), else `TESSERA_THREADS`, else what the
//! program set with [`set_threads`] before its first run.

use std::sync::{Mutex, OnceLock};

static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
/// The thread count asked for by [`set_threads`] before the pool was built.
static REQUESTED: Mutex<Option<usize>> = Mutex::new(None);

/// The thread count a new pool gets: [`set_threads`], else `TESSERA_THREADS`, else the usable cores.
fn thread_count() -> Result<usize, String> {
    if let Some(n) = *REQUESTED.lock().unwrap_or_else(|e| e.into_inner()) {
        return Ok(n);
    }
    match std::env::var("TESSERA_THREADS") {
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(format!("TESSERA_THREADS='{v}' is not a thread count (a whole number, at least 1)")),
        },
        Err(_) => Ok(std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)),
    }
}

/// Sets the runtime's thread count. It must be called before the first run or measurement of the process
/// (the pool is built once); afterwards it fails, naming the size already in use, unless that is `n`.
pub fn set_threads(n: usize) -> Result<(), String> {
    if n == 0 {
        return Err("the thread count must be at least 1".into());
    }
    *REQUESTED.lock().unwrap_or_else(|e| e.into_inner()) = Some(n);
    match POOL.get() {
        Some(Some(p)) if p.current_num_threads() != n => {
            Err(format!("the runtime already runs on {} threads; set the thread count before the first run", p.current_num_threads()))
        }
        _ => Ok(()),
    }
}

/// The runtime's thread count (building the pool if needed): what runs use.
pub fn threads() -> usize {
    pool().map(|p| p.current_num_threads()).unwrap_or(1)
}

/// The pool, built on first use. `None` if no thread could be started (or `TESSERA_THREADS` is not a
/// number, which is reported once), in which case runs execute on the caller's thread.
fn pool() -> Option<&'static rayon::ThreadPool> {
    POOL.get_or_init(|| {
        let n = thread_count().unwrap_or_else(|e| {
            eprintln!("warning: {e}; running on one thread");
            1
        });
        rayon::ThreadPoolBuilder::new().num_threads(n).thread_name(|i| format!("tessera-run-{i}")).build().ok()
    })
    .as_ref()
}

/// Runs `f` on the runtime pool (directly when already on it).
pub fn on_runtime_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    match pool() {
        Some(p) if p.current_thread_index().is_none() => p.install(f),
        _ => f(),
    }
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
