//! A batched artifact end to end: one plan per batch size linked from real shared objects (compiled from C
//! here), joined with the weights stored once, loaded with one host copy of them for both plans, read and run
//! at batch sizes the plans have and between them (padded), against results computed here.

mod common;

use common::*;
use tessera_kernels::artifact::batched::join;
use tessera_kernels::artifact::provenance::with_provenance;
use tessera_kernels::artifact::{Artifact, Blake3, Provenance, SourceModel, BATCHED_FORMAT_VERSION};
use tessera_kernels::batch::BatchedExecutable;
use tessera_kernels::runtime::{Program, Registry};
use tessera_stages::ir::{Tensor, TensorType};
use tessera_stages::stages::link::{link, LinkInput, LinkStep, ValueRef};

/// `y = x @ W` for `x` f32[b, 3] and the shared weight W f32[3, 2], row by row.
const MATMUL_C: &str = r#"
void mm(void* const* a) {
    const float* x = a[0]; const float* w = a[1]; float* o = a[2];
    for (int i = 0; i < ROWS; i++) for (int j = 0; j < 2; j++) {
        float s = 0.0f;
        for (int k = 0; k < 3; k++) s += x[i * 3 + k] * w[k * 2 + j];
        o[i * 2 + j] = s;
    }
}
"#;

/// The payload of the plan for batch `b`.
fn plan(b: usize) -> Vec<u8> {
    let so = compile_so(&format!("#define ROWS {b}\n{MATMUL_C}"));
    let (x, y) = (TensorType::f32([b, 3]), TensorType::f32([b, 2]));
    let module = tessera_stages::backend::Module {
        backend: "c".into(),
        target: "llvm".into(),
        format: tessera_kernels::runtime::c::FORMAT,
        functions: vec![f("mm", vec![x.clone(), TensorType::f32([3, 2])], vec![y.clone()], 0)],
        bytes: so,
    };
    let input = LinkInput {
        model: "mm".into(),
        inputs: vec![("x".into(), x)],
        outputs: vec![("y".into(), ValueRef::Value(0))],
        values: vec![y],
        constants: vec![Tensor::from_f32([3, 2], &W)],
        modules: vec![module],
        steps: vec![LinkStep { module: 0, function: 0, args: vec![ValueRef::Input(0), ValueRef::Const(0), ValueRef::Value(0)] }],
        ..Default::default()
    };
    link(&input).unwrap()
}

fn expected(x: &[f32]) -> Vec<f32> {
    x.chunks(3).flat_map(|r| (0..2).map(move |j| (0..3).map(|k| r[k] * W[k * 2 + j]).sum::<f32>())).collect()
}

#[test]
fn one_artifact_serves_every_batch_up_to_its_largest_plan() {
    let (p1, p8) = (plan(1), plan(8));
    let bytes = join(&[(1, &p1), (8, &p8)]).unwrap();
    // Stamped as the pipeline writes files: provenance does not change what runs.
    let p = Provenance {
        tessera_version: "t".into(),
        source_revision: "r".into(),
        source: SourceModel { kind: "fixture".into(), name: "fixture:mm:b1".into(), digest: Blake3([1; 32]) },
        targets: vec!["cpu".into()],
        precision: "fp32".into(),
        costs: "analytical".into(),
        options: [("batch".to_string(), "1,8".to_string())].into(),
    };
    let stamped = with_provenance(&bytes, &p).unwrap();
    let a = Artifact::read(&stamped).unwrap();
    assert_eq!(a.payload_digest(), Blake3::of(&bytes));
    assert_eq!(a.provenance.as_ref(), Some(&p));
    assert_eq!(u32::from_le_bytes(stamped[8..12].try_into().unwrap()), BATCHED_FORMAT_VERSION);
    assert_eq!(a.data().len(), 24, "W once");
    let mut exe = BatchedExecutable::load(&a).unwrap();
    assert_eq!(exe.batches(), [1, 8]);
    // One host copy of the constants for both plans: the same buffer, of the data section's size.
    let (p1, p8) = (exe.plan(0).shared_program(), exe.plan(1).shared_program());
    assert!(p1.shares_constants_with(p8) && p8.shares_constants_with(p1));
    assert_eq!((p1.constant_bytes(), p8.constant_bytes()), (24, 24));
    // Loaded alone, a plan has a copy of its own.
    let alone = Program::load(&a.plan_artifact(1)).unwrap();
    assert!(!alone.shares_constants_with(p8) && alone.shares_constants_with(&alone));
    let plans = Program::load_plans(&a, Registry::builtin()).unwrap();
    assert_eq!(plans.len(), 2);
    assert!(plans[0].shares_constants_with(&plans[1]) && !plans[0].shares_constants_with(p1));
    for b in [1usize, 3, 8, 5, 1] {
        let x: Vec<f32> = (0..b * 3).map(|i| i as f32 * 0.5 - 2.0).collect();
        let out = exe.run(&[Tensor::from_f32([b, 3], &x)]).unwrap();
        assert_eq!(out[0].ty, TensorType::f32([b, 2]), "batch {b}");
        assert_eq!(out[0].to_f32_vec(), expected(&x), "batch {b}");
    }
    let e = exe.run(&[Tensor::from_f32([9, 3], &[0.0; 27])]).unwrap_err().to_string();
    assert!(e.contains("model 'mm'") && e.contains("batch 9") && e.contains("1, 8"), "{e}");
    let e = exe.run(&[Tensor::from_f32([2, 4], &[0.0; 8])]).unwrap_err().to_string();
    assert!(e.contains("input 'x' must be f32[Nx3]"), "{e}");
}
