use super::*;

#[test]
fn every_builtin_backend_is_registered_once_with_the_spec_it_reports() {
    let all = all();
    let names: Vec<&str> = all.iter().map(|b| b.name()).collect();
    assert_eq!(names, ["c", "gemm", "cuda", "cublas", "cudnn", "cutlass"]);
    for b in &all {
        let specs: Vec<&BackendSpec> = crate::target::builtin_specs().filter(|s| s.name == b.name()).collect();
        assert_eq!(specs.len(), 1, "backend {}", b.name());
        assert!(std::ptr::eq(specs[0], b.spec()), "backend {}", b.name());
    }
    // No -compiler value without a backend behind it.
    for s in crate::target::backend_specs() {
        assert!(all.iter().any(|b| b.name() == s.name), "-compiler={} has no backend", s.compiler);
    }
}
