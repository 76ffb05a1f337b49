//! The runtime's thread pool: where every model run and every kernel measurement executes.
//!
//! A run's parallel loops (the gemm runtime's im2col, depthwise and epilogue tiles) go to this pool, and the
//! run itself executes on one of its threads, whoever calls it: `tessera run` from its main thread, the
//! compiler's validation and tune stages from a thread of their own while a zoo compiles. So a plan measured
//! during compilation ran in exactly the thread setting it runs in when deployed. (Measured before this pool
//! existed: the same MobileNetV2 plans compared 1.07x one way on a measurement pool and 0.87-0.97x the other
//! way from a main thread injecting into rayon's global pool, bench/collage.md.) The pool does nothing but
//! run kernels, so it never waits on the compiler's locks.

use std::sync::OnceLock;

/// The pool (as many threads as the machine has cores), built on first use. `None` if no thread could be
/// started, in which case runs execute on the caller's thread.
fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let n = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
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
mod tests {
    use super::*;
    use rayon::prelude::*;

    #[test]
    fn work_and_its_parallel_loops_run_on_the_pool() {
        let (outer, inner) = on_runtime_pool(|| {
            let outer = std::thread::current().name().map(str::to_string);
            let inner: Vec<Option<String>> = (0..64).into_par_iter().map(|_| std::thread::current().name().map(str::to_string)).collect();
            (outer, inner)
        });
        assert!(outer.as_deref().unwrap_or("").starts_with("tessera-run-"), "{outer:?}");
        assert!(inner.iter().all(|n| n.as_deref().unwrap_or("").starts_with("tessera-run-")), "{inner:?}");
        // Nested calls run in place.
        assert_eq!(on_runtime_pool(|| on_runtime_pool(|| 7)), 7);
    }
}
