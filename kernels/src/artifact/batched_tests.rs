use super::*;
use crate::artifact::{encode, slot_bytes, Artifact, ArtifactErrorKind, Buf, InputDesc, OutputDesc, BATCHED_FORMAT_VERSION};
use crate::tensor::{Tensor, TensorType};

/// A plan for batch `b` with no steps: input `x` f32[b, 4] passed through as output `y`; its constants are a
/// weight shared by every batch size (`w`, 1 KiB) and one of its own (`[b]`, so unlike any other plan's).
fn payload(b: usize) -> Vec<u8> {
    let x = TensorType::f32([b, 4]);
    let w = Tensor::from_f32([256], &[0.5; 256]);
    let own = Tensor::from_f32([b], &vec![b as f32; b]);
    let mut data = w.bytes().to_vec();
    data.resize(align_up(data.len() as u64) as usize, 0);
    let own_at = data.len() as u64;
    data.extend_from_slice(own.bytes());
    let body = Body {
        model: "m".into(),
        inputs: vec![InputDesc { name: "x".into(), ty: x.clone(), int_bound: 100, offset: 0 }],
        outputs: vec![OutputDesc { name: "y".into(), ty: x.clone(), source: Buf::Input(0) }],
        values: vec![],
        arena_bytes: slot_bytes(&x),
        scratch_bytes: 0,
        steps: vec![],
        modules: vec![],
        constants: vec![ConstDesc { ty: w.ty.clone(), digest: w.digest(), offset: 0 }, ConstDesc { ty: own.ty.clone(), digest: own.digest(), offset: own_at }],
        transfers: vec![],
    };
    encode(&body, &data).unwrap()
}

fn joined(batches: &[u64]) -> Vec<u8> {
    let payloads: Vec<(u64, Vec<u8>)> = batches.iter().map(|&b| (b, payload(b as usize))).collect();
    let refs: Vec<(u64, &[u8])> = payloads.iter().map(|(b, p)| (*b, p.as_slice())).collect();
    join(&refs).unwrap()
}

#[test]
fn round_trip_with_the_weights_stored_once() {
    let bytes = joined(&[1, 8]);
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), BATCHED_FORMAT_VERSION);
    let a = Artifact::read(&bytes).unwrap();
    assert_eq!((a.batches(), a.plan_count()), (&[1u64, 8][..], 2));
    for (i, b) in [1usize, 8].into_iter().enumerate() {
        let plan = a.plan(i);
        assert_eq!(plan.inputs[0].ty, TensorType::f32([b, 4]));
        let own = plan.constants[1].clone();
        assert_eq!(a.data()[own.offset as usize..][..own.ty.size_bytes()], *Tensor::from_f32([b], &vec![b as f32; b]).bytes());
    }
    // The shared weight is one copy at one offset, named by both plans.
    assert_eq!(a.plan(0).constants[0], a.plan(1).constants[0]);
    assert_eq!(a.constant_bytes(0), Tensor::from_f32([256], &[0.5; 256]).bytes());
    let singles = payload(1).len() + payload(8).len();
    assert!(bytes.len() + 1024 <= singles, "joined {} bytes, the two single plans {singles}", bytes.len());
    // Each plan as an artifact of its own (what the runtime loads), over the same data section.
    let p8 = a.plan_artifact(1);
    assert_eq!((&p8.body, p8.batches(), p8.plan_count(), p8.data()), (a.plan(1), &[][..], 1, a.data()));
    assert!(p8.file.contains("plan for batch 8"), "{}", p8.file);
    // Pure: joining again gives the same bytes.
    assert_eq!(bytes, joined(&[1, 8]));
    // Random inputs at any batch up to the largest plan, from the plan serving it.
    assert_eq!(a.random_inputs_at(5, 3).unwrap()[0].ty, TensorType::f32([5, 4]));
    assert!(a.random_inputs_at(9, 3).unwrap_err().contains("larger than the largest plan (8)"));
}

#[test]
fn a_single_plan_reads_as_before() {
    let bytes = payload(4);
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), crate::artifact::FORMAT_VERSION);
    let a = Artifact::read(&bytes).unwrap();
    assert_eq!((a.batches(), a.plan_count()), (&[][..], 1));
    assert!(a.random_inputs_at(4, 0).unwrap_err().contains("one plan"));
}

#[test]
fn join_refuses_what_cannot_share_a_file() {
    let p1 = payload(1);
    let p8 = payload(8);
    let e = join(&[(8, &p8), (1, &p1)]).unwrap_err().to_string();
    assert!(e.contains("ascending"), "{e}");
    let e = join(&[(1, &p1)]).unwrap_err().to_string();
    assert!(e.contains("at least two plans"), "{e}");
    // A plan whose inputs do not lead with its batch size.
    let e = join(&[(1, &p1), (2, &p8)]).unwrap_err().to_string();
    assert!(e.contains("plan for batch 2") && e.contains("input 'x'") && e.contains("leading dimension"), "{e}");
    let e = join(&[(1, &p1), (8, &p8[..100])]).unwrap_err().to_string();
    assert!(e.contains("plan for batch 8"), "{e}");
    let both = joined(&[1, 8]);
    let e = join(&[(1, &p1), (8, &both)]).unwrap_err().to_string();
    assert!(e.contains("single-plan payload"), "{e}");
}

/// Re-encodes `bytes`' batched body after `change`, with a fresh digest, so only validation can refuse it.
fn tampered(bytes: &[u8], change: impl FnOnce(&mut BatchedBody)) -> Result<Artifact, String> {
    let d = header::decode(bytes).unwrap();
    let mut b = BatchedBody { plans: d.batches.iter().zip(d.plans).map(|(&batch, body)| BatchPlan { batch, body }).collect() };
    change(&mut b);
    let data = d.data.to_vec();
    let out = header::encode_batched(&b, &data).unwrap();
    Artifact::read(&out).map_err(|e| e.to_string())
}

#[test]
fn validation_refuses_corrupt_batched_files() {
    let bytes = joined(&[1, 8]);
    assert!(tampered(&bytes, |_| {}).is_ok());
    let e = tampered(&bytes, |b| b.plans[1].batch = 1).unwrap_err();
    assert!(e.contains("ascending"), "{e}");
    let e = tampered(&bytes, |b| b.plans[0].batch = 0).unwrap_err();
    assert!(e.contains("batch 0"), "{e}");
    let e = tampered(&bytes, |b| {
        b.plans.pop();
    })
    .unwrap_err();
    assert!(e.contains("at least two plans"), "{e}");
    let e = tampered(&bytes, |b| b.plans[1].body.model = "other".into()).unwrap_err();
    assert!(e.contains("model 'other'"), "{e}");
    let e = tampered(&bytes, |b| b.plans[1].body.outputs[0].name = "z".into()).unwrap_err();
    assert!(e.contains("outputs (z) differ"), "{e}");
    // The shared weight stored twice: the second plan pointing at its own copy.
    let e = tampered(&bytes, |b| b.plans[1].body.constants[0].offset += 64).unwrap_err();
    assert!(e.contains("stored twice") || e.contains("outside"), "{e}");
    // A trailing dimension that differs between plans.
    let e = tampered(&bytes, |b| {
        let p = &mut b.plans[1].body;
        p.inputs[0].ty = TensorType::f32([8, 2]);
        p.outputs[0].ty = TensorType::f32([8, 2]);
        p.arena_bytes = slot_bytes(&p.inputs[0].ty);
    })
    .unwrap_err();
    assert!(e.contains("only the leading (batch) dimension may differ"), "{e}");
    // A flipped byte anywhere in the payload fails the digest, as for any artifact.
    let mut v = bytes.clone();
    v[HEADER_LEN + 3] ^= 1;
    assert!(matches!(Artifact::read(&v).unwrap_err().kind, ArtifactErrorKind::Digest));
}

use super::super::HEADER_LEN;

#[test]
fn provenance_stamps_on_a_batched_payload() {
    let bytes = joined(&[1, 2, 8]);
    let p = crate::artifact::Provenance {
        tessera_version: "t".into(),
        source_revision: "r".into(),
        source: crate::artifact::SourceModel { kind: "onnx".into(), name: "m.onnx".into(), digest: crate::artifact::Blake3([2; 32]) },
        targets: vec!["cpu".into()],
        precision: "fp32".into(),
        costs: "analytical".into(),
        options: Default::default(),
    };
    let stamped = crate::artifact::provenance::with_provenance(&bytes, &p).unwrap();
    let a = Artifact::read(&stamped).unwrap();
    assert_eq!((a.batches(), a.provenance.as_ref()), (&[1u64, 2, 8][..], Some(&p)));
    assert_eq!(a.payload_digest(), crate::artifact::Blake3::of(&bytes));
}

#[test]
fn the_smallest_plan_that_fits() {
    let b = [1, 8, 32];
    assert_eq!(choose(&b, 1), Ok(0));
    assert_eq!(choose(&b, 2), Ok(1));
    assert_eq!(choose(&b, 8), Ok(1));
    assert_eq!(choose(&b, 9), Ok(2));
    let e = choose(&b, 33).unwrap_err();
    assert_eq!(e, ChooseError::TooLarge { batch: 33, largest: 32, sizes: b.to_vec() });
    let e = e.to_string();
    assert!(e.contains("batch 33") && e.contains("largest plan (32)") && e.contains("1, 8, 32"), "{e}");
    assert!(choose(&b, 0).unwrap_err().to_string().contains("0 rows"));
}
