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

/// A one-partition plan on `cpu` of input `x` (f32 [b, 4]) and one weight of `n` elements stored as `weight`,
/// giving output `output`.
fn plan_with(b: usize, n: usize, weight: &str, output: &str) -> ExecPlan {
    use crate::ir::TensorType;
    use crate::partition::plan::{PlanPartition, PlanRef};
    let x = TensorType::f32([b, 4]);
    ExecPlan {
        version: 1,
        model: "m".into(),
        cost_source: "measured".into(),
        inputs: vec![("x".into(), x.clone())],
        input_int_bounds: vec![100],
        outputs: vec![(output.into(), PlanRef::Value(0))],
        values: vec![x],
        constants: vec![(Digest::of(weight.as_bytes()), TensorType::f32([n]))],
        constant_values: vec![1],
        partitions: vec![PlanPartition {
            target: crate::target::Target::parse("cpu").unwrap(),
            nodes: vec![0],
            kernel: Digest::of(b"k"),
            symbol: "k_0".into(),
            config: None,
            args: vec![PlanRef::Input(0), PlanRef::Const(0), PlanRef::Value(0)],
            n_inputs: 2,
            cost_us: 1.0,
            cost_source: "measured".into(),
            alternative: None,
        }],
        validation: None,
    }
}

#[test]
fn timing_identity_leaves_out_the_weights_values_only() {
    let modules = [Digest::of(b"module")];
    let id = |p: &ExecPlan| timing_identity(p, &modules).unwrap();
    let base = plan_with(2, 256, "weights", "y");
    // Other weights of the same shapes, and what the link does not read (costs, reports): the same identity.
    assert_eq!(id(&base), id(&plan_with(2, 256, "fine-tuned weights", "y")));
    let mut costed = base.clone();
    costed.partitions[0].cost_us = 7.0;
    costed.cost_source = "recorded".into();
    assert_eq!(id(&base), id(&costed));
    // Anything the link reads is in it: the batch (shapes), the weights' shapes, the interface, the steps'
    // functions and arguments, the modules.
    let mut other_step = base.clone();
    other_step.partitions[0].symbol = "k_1".into();
    let mut other_args = base.clone();
    other_args.partitions[0].args.swap(0, 1);
    for (what, other, with) in [
        ("batch", plan_with(4, 256, "weights", "y"), modules[0]),
        ("weight shape", plan_with(2, 128, "weights", "y"), modules[0]),
        ("output", plan_with(2, 256, "weights", "z"), modules[0]),
        ("function", other_step, modules[0]),
        ("arguments", other_args, modules[0]),
        ("module", base.clone(), Digest::of(b"another module")),
    ] {
        assert_ne!(timing_identity(&other, &[with]).unwrap(), id(&base), "{what}");
    }
}
