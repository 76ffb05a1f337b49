use super::*;

fn trial(label: &str, median_us: Option<f64>) -> Trial {
    Trial { label: label.into(), partitions: 1, plan: Digest::of(b""), estimated_us: 1.0, artifact: None, median_us, pass_medians_us: None, runs: 9, skipped: None }
}

#[test]
fn an_alternative_is_left_out_for_its_own_failures_only() {
    use crate::stage::SharedFailure;
    use std::sync::Arc;
    // A backend's refusal or failure, as the lower and compile stages return it (context added, and
    // through the driver's shared failure for a caller that waited on another's execution).
    let refused = anyhow::Error::new(BackendError::unsupported("cublas", "kernel 'k' (g): node 'n' (Softmax): not a GEMM")).context("lower");
    assert!(is_plan_failure(&refused));
    let compile = anyhow::Error::new(BackendError::Compile { backend: "c".into(), tool: "C", kernels: vec!["k".into()], located: true, log: "x".into() });
    assert!(is_plan_failure(&anyhow::Error::new(SharedFailure(Arc::new(compile))).context("compile for cpu")));
    assert!(is_plan_failure(&anyhow::Error::new(LinkError { model: "m".into(), msg: "bad".into() }).context("link")));
    // The store or a decoding failure is not the plan's: an error, never a skipped trial.
    assert!(!is_plan_failure(&anyhow::anyhow!("object 1234 is missing").context("lower")));
}

#[test]
fn the_searched_plan_stays_only_when_clearly_faster() {
    // Clearly faster: kept.
    assert_eq!(choose(&[trial("searched", Some(90.0)), trial("gemm", Some(100.0)), trial("c alone", Some(300.0))]), 0);
    // Within the margin: the alternative, the simpler plan.
    assert_eq!(choose(&[trial("searched", Some(98.0)), trial("gemm", Some(100.0))]), 1);
    // Faster overall but not in one pass: drift helped it; the alternative.
    let mut s = trial("searched", Some(90.0));
    s.pass_medians_us = Some([80.0, 99.0]);
    let mut g = trial("gemm", Some(100.0));
    g.pass_medians_us = Some([100.0, 100.0]);
    assert_eq!(choose(&[s.clone(), g.clone()]), 1);
    s.pass_medians_us = Some([88.0, 92.0]);
    assert_eq!(choose(&[s, g]), 0);
    // Slower: the fastest alternative, the first of equals.
    assert_eq!(choose(&[trial("searched", Some(120.0)), trial("gemm", Some(100.0)), trial("x", Some(100.0))]), 1);
    assert_eq!(choose(&[trial("searched", Some(120.0)), trial("gemm", Some(110.0)), trial("x", Some(100.0))]), 2);
    // Nothing measured: the search decides.
    assert_eq!(choose(&[trial("searched", None), trial("gemm", None)]), 0);
    assert_eq!(choose(&[trial("searched", Some(120.0)), trial("gemm", None)]), 0);
}

proptest::proptest! {
    /// The rule's invariants: the plan used is the searched one only when it beats every measured
    /// alternative by the margin; otherwise an alternative no slower than any other measured one.
    #[test]
    fn choice_is_never_beaten_by_more_than_the_margin(
        medians in proptest::collection::vec(proptest::option::of(1.0f64..1e6), 1..6),
    ) {
        let trials: Vec<Trial> = medians.iter().enumerate().map(|(i, m)| trial(&format!("t{i}"), *m)).collect();
        let c = choose(&trials);
        let alts: Vec<f64> = medians[1..].iter().flatten().copied().collect();
        match (medians[0], c) {
            (Some(s), 0) => proptest::prop_assert!(alts.iter().all(|&a| s <= (1.0 - MARGIN) * a)),
            (None, c) => proptest::prop_assert_eq!(c, 0),
            (Some(s), c) => {
                let m = medians[c].expect("a measured alternative");
                proptest::prop_assert!(alts.iter().all(|&a| m <= a));
                proptest::prop_assert!(s > (1.0 - MARGIN) * m);
            }
        }
    }
}

#[test]
fn median_of_odd_and_even_counts() {
    assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
    assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
}

/// A one-plan artifact passing input `x` (f32 [b, 4]) through as `y`, with one weight of `n` elements, each
/// `value`.
fn artifact_with(b: usize, n: usize, value: f32, output: &str) -> Artifact {
    use tessera_kernels::artifact::{encode, slot_bytes, Body, Buf, ConstDesc, InputDesc, OutputDesc};
    use tessera_kernels::tensor::{Tensor, TensorType};
    let x = TensorType::f32([b, 4]);
    let w = Tensor::from_f32([n], &vec![value; n]);
    let body = Body {
        model: "m".into(),
        inputs: vec![InputDesc { name: "x".into(), ty: x.clone(), int_bound: 100, offset: 0 }],
        outputs: vec![OutputDesc { name: output.into(), ty: x.clone(), source: Buf::Input(0) }],
        values: vec![],
        arena_bytes: slot_bytes(&x),
        scratch_bytes: 0,
        steps: vec![],
        modules: vec![],
        constants: vec![ConstDesc { ty: w.ty.clone(), digest: w.digest(), offset: 0 }],
        transfers: vec![],
    };
    Artifact::read(&encode(&body, w.bytes()).unwrap()).unwrap()
}

#[test]
fn timing_identity_leaves_out_the_weights_values_only() {
    let base = artifact_with(2, 256, 0.5, "y");
    let reweighted = artifact_with(2, 256, 0.75, "y");
    assert_ne!(base.payload_digest(), reweighted.payload_digest(), "the weights are in the artifact");
    assert_eq!(timing_identity(&base).unwrap(), timing_identity(&reweighted).unwrap());
    // Anything else about the plan is in it: the batch (shapes), the weights' shapes, the interface.
    let id = timing_identity(&base).unwrap();
    for (what, other) in [("batch", artifact_with(4, 256, 0.5, "y")), ("weight shape", artifact_with(2, 128, 0.5, "y")), ("output", artifact_with(2, 256, 0.5, "z"))] {
        assert_ne!(timing_identity(&other).unwrap(), id, "{what}");
    }
}
