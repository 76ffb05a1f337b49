use super::*;
use rayon::prelude::*;

#[test]
fn the_thread_count_is_fixed_once_runs_start() {
    let n = threads();
    assert!(n >= 1);
    on_runtime_pool(|| assert_eq!(rayon::current_num_threads(), n));
    assert!(set_threads(n).is_ok());
    let e = set_threads(n + 1).unwrap_err();
    assert!(e.contains(&format!("already runs on {n} threads")), "{e}");
    assert!(set_threads(0).is_err());
}

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
