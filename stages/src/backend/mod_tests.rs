use super::*;

#[test]
fn tunable_set_checksum_is_order_independent_and_keeps_the_old_bytes() {
    let a: TunableSet = ["c/v3/unrolled", "c/v3/default"].into_iter().collect();
    let b = TunableSet::single_default("c", 3).with("c/v3/unrolled");
    assert_eq!(a, b);
    assert_eq!(a.checksum(), b.checksum());
    assert_eq!(a.names().collect::<Vec<_>>(), ["c/v3/default", "c/v3/unrolled"]);
    // The checksum tune keys used before the set was a type: postcard of the sorted names.
    let sorted = ["c/v3/default".to_string(), "c/v3/unrolled".to_string()];
    assert_eq!(a.checksum(), Digest::of(&postcard::to_stdvec(&sorted.iter().collect::<Vec<_>>()).unwrap()));
    assert_ne!(a.checksum(), TunableSet::single_default("c", 3).checksum());
}

#[test]
fn each_backend_of_the_build_gives_its_own_rules_and_colours() {
    let all = registry::all();
    let rules: Vec<Rule> = all.iter().map(|b| b.rules()).collect();
    // Two families of rules: the fallbacks (`c` on the CPU, `cuda` on the GPU) fuse
    // elementwise chains; the libraries (`gemm`, `cublas`, `cudnn`) take an anchor and its
    // epilogue, each deciding in `supports` which anchors it accepts.
    assert_ne!(rules[0], rules[1], "{rules:?}");
    assert_eq!(rules[0], rules[2]);
    assert!(rules[3..].iter().all(|r| *r == rules[1]), "{rules:?}");
    let uses: Vec<(&str, bool)> = all.iter().map(|b| (b.name(), b.rules().uses_gemm_epilogue())).collect();
    assert_eq!(uses, [("c", false), ("gemm", true), ("cuda", false), ("cublas", true), ("cudnn", true), ("cutlass", true)]);
    let colors: std::collections::BTreeSet<_> = all.iter().map(|b| b.colors()).collect();
    assert_eq!(colors.len(), all.len());
}
