//! A batched artifact (the MLP with plans for batch 1 and 8) through the Rust API: the batch sizes it serves,
//! one copy of the weights for both plans (as many bytes as the artifact of batch 1 alone holds),
//! runs of batch 1, 3, 5 and 8 (3 and 5 padded onto the 8-plan) matching the reference interpreter on the
//! model built at that batch, `run_into` the same, and a batch beyond the largest plan
//! refused with an error naming the sizes.

mod common;

use common::{artifact, close, BATCHED};
use tessera::job::load_graph;
use tessera::explain::parse_fixture_spec;
use tessera_kernels::artifact::Artifact;
use tessera_kernels::runtime::Program;
use tessera_runtime::{ErrorKind, Model, Tensor, TensorView, TensorViewMut};
use tessera_stages::interp::{random_inputs, run_graph};

fn reference(batch: usize, seed: u64) -> (Vec<Tensor>, Vec<Tensor>) {
    let g = load_graph(&parse_fixture_spec(&format!("fixture:mlp3:b{batch}")).unwrap()).unwrap();
    let inputs = random_inputs(&g, seed);
    let want = run_graph(&g, &inputs).unwrap();
    (inputs, want)
}

#[test]
fn one_artifact_serves_batch_1_to_8_matching_the_reference() {
    let m = Model::load(artifact(BATCHED)).unwrap();
    assert_eq!(m.batch_sizes(), [1, 8]);
    assert_eq!(m.inputs()[0].shape, [8, 784], "a batched model's inputs are its largest plan's");
    let p = m.provenance().unwrap();
    assert_eq!((p.source.name.as_str(), p.options.get("batch").map(String::as_str)), ("fixture:mlp3:b1", Some("1,8")));
    // The file holds the weights once, and so does the loaded model: its plans share one host copy, counted
    // once, as large as the artifact of one plan's.
    assert!(m.plans_share_weights());
    let single = Model::load(artifact("mlp3-b1")).unwrap();
    assert!(single.plans_share_weights());
    println!("weight_bytes: mlp3 b1 {}, b1,8 {}", single.weight_bytes(), m.weight_bytes());
    assert_eq!(m.weight_bytes(), single.weight_bytes());
    assert_eq!(m.weight_bytes(), Model::load(artifact("mlp3-b8")).unwrap().weight_bytes());
    // Each plan loaded alone (as the runtime did before the plans shared their weights) holds the whole data
    // section: twice as much.
    let a = Artifact::open(&artifact(BATCHED)).unwrap();
    let apart: usize = (0..a.plan_count()).map(|i| Program::load(&a.plan_artifact(i)).unwrap().constant_bytes()).sum();
    println!("weight_bytes: mlp3 b1,8 with a copy per plan {apart}");
    assert_eq!(apart, 2 * m.weight_bytes());
    for batch in [1usize, 3, 8, 5] {
        let (inputs, want) = reference(batch, 0xba7c + batch as u64);
        let got = m.run(&[("input", TensorView::from(&inputs[0]))]).unwrap();
        close(&format!("batch {batch}"), &got[0], &want[0]);
        let mut logits = vec![0f32; batch * 10];
        m.run_into(&[("input", TensorView::from(&inputs[0]))], &mut [("logits", TensorViewMut::from_slice(&[batch, 10], &mut logits))]).unwrap();
        assert_eq!(Tensor::from_f32([batch, 10], &logits), got[0], "run_into, batch {batch}");
    }
    let e = m.run(&[("input", TensorView::from_slice(&[9, 784], &vec![0f32; 9 * 784]))]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Input);
    assert!(e.to_string().contains("batch 9") && e.to_string().contains("1, 8"), "{e}");
    let e = m.run(&[("input", TensorView::from_slice(&[2, 783], &vec![0f32; 2 * 783]))]).unwrap_err();
    assert!(e.to_string().contains("input 'input' must be f32[Nx784] with N up to 8"), "{e}");
    let mut wrong = vec![0f32; 4 * 10];
    let e = m
        .run_into(&[("input", TensorView::from_slice(&[3, 784], &vec![0f32; 3 * 784]))], &mut [("logits", TensorViewMut::from_slice(&[4, 10], &mut wrong))])
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Output);
    assert!(e.to_string().contains("must be f32[3x10]"), "{e}");
}
