//! The Rust API on real zoo artifacts: metadata, runs matching the executor `tessera run` uses bit for bit,
//! concurrent runs of one loaded model matching serial ones bit for bit, and every kind of bad input giving
//! an error that names what is at fault.

mod common;

use common::{artifact, MODELS};
use tessera_kernels::artifact::Artifact;
use tessera_kernels::runtime::Executable;
use tessera_runtime::{DType, ErrorKind, Model, Tensor, TensorView, TensorViewMut};

/// Named views of `tensors`, in the model's input order.
fn named<'a>(m: &'a Model, tensors: &'a [Tensor]) -> Vec<(&'a str, TensorView<'a>)> {
    m.inputs().iter().zip(tensors).map(|(d, t)| (d.name.as_str(), TensorView::from(t))).collect()
}

fn same_bits(what: &str, got: &[Tensor], want: &[Tensor]) {
    assert_eq!(got.len(), want.len(), "{what}: output count");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert_eq!(a.ty, b.ty, "{what}: output {i} type");
        assert!(a.bytes() == b.bytes(), "{what}: output {i} differs");
    }
}

/// What the build recorded, through the Rust API: the compiling tessera, the fixture's spec and recipe digest,
/// the canonical targets, fp32, analytical costs (tests/common compiles so); the JSON form says the same.
#[test]
fn provenance_is_what_the_build_recorded() {
    let m = Model::load(artifact("mlp3-b8")).unwrap();
    let p = m.provenance().expect("the pipeline records provenance");
    assert_eq!((p.tessera_version.as_str(), p.source_revision.as_str()), (tessera::provenance::VERSION, tessera::provenance::SOURCE_REVISION));
    let job = tessera::explain::parse_fixture_spec("fixture:mlp3:b8").unwrap();
    assert_eq!(p.source, tessera::provenance::ModelOrigin::of(&job, None).unwrap().source);
    assert_eq!((p.source.kind.as_str(), p.source.name.as_str()), ("fixture", "fixture:mlp3:b8"));
    let targets = tessera::zoo::resolve_targets(&["cpu".into(), "cpu -compiler=gemm".into()], &tessera::zoo::all_backends()).unwrap();
    assert_eq!(p.targets, targets.targets.iter().map(|t| t.canonical()).collect::<Vec<_>>());
    assert_eq!((p.precision.as_str(), p.costs.as_str()), ("fp32", "analytical"));
    assert!(p.options.is_empty(), "{:?}", p.options);

    let json: serde_json::Value = serde_json::from_str(&m.provenance_json().unwrap()).unwrap();
    assert_eq!(json["source"]["digest"], p.source.digest.to_hex());
    assert_eq!(json["targets"].as_array().unwrap().len(), p.targets.len());
    assert_eq!(json["costs"], "analytical");

    // The same artifact as the linker wrote it (no provenance section, flags 0): it loads and runs, with none.
    let bytes = std::fs::read(artifact("mlp3-b8")).unwrap();
    let payload_len = Artifact::read(&bytes).unwrap().payload_len();
    let mut payload = bytes[..payload_len].to_vec();
    payload[12] = 0;
    let plain = Model::from_bytes(&payload).unwrap();
    assert_eq!((plain.provenance(), plain.provenance_json()), (None, None));
    assert_eq!(plain.inputs(), m.inputs());
}

#[test]
fn model_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Model>();
}

#[test]
fn metadata_and_runs_match_the_executor_bit_for_bit() {
    for name in MODELS {
        let path = artifact(name);
        let a = Artifact::open(&path).unwrap();
        let m = Model::load(&path).unwrap();
        assert_eq!(m.name(), a.body.model);
        let ins: Vec<(String, DType, Vec<usize>)> = m.inputs().iter().map(|d| (d.name.clone(), d.dtype, d.shape.clone())).collect();
        let want: Vec<(String, DType, Vec<usize>)> = a.body.inputs.iter().map(|d| (d.name.clone(), d.ty.dtype, d.ty.shape.clone())).collect();
        assert_eq!(ins, want, "{name}: inputs");
        let outs: Vec<(String, DType, Vec<usize>)> = m.outputs().iter().map(|d| (d.name.clone(), d.dtype, d.shape.clone())).collect();
        let want: Vec<(String, DType, Vec<usize>)> = a.body.outputs.iter().map(|d| (d.name.clone(), d.ty.dtype, d.ty.shape.clone())).collect();
        assert_eq!(outs, want, "{name}: outputs");
        assert!(!m.is_gpu());

        let inputs = a.random_inputs(7);
        let want = Executable::load(&a).unwrap().run(&inputs).unwrap();
        same_bits(name, &m.run(&named(&m, &inputs)).unwrap(), &want);

        // From bytes, inputs given in reverse order, outputs into the caller's buffers.
        let m = Model::from_bytes(&std::fs::read(&path).unwrap()).unwrap();
        let mut given = named(&m, &inputs);
        given.reverse();
        let mut bufs: Vec<Vec<u8>> = m.outputs().iter().map(|d| vec![0xAB; d.size_bytes()]).collect();
        let outs_meta = m.outputs().to_vec();
        let mut outs: Vec<(&str, TensorViewMut)> =
            outs_meta.iter().zip(bufs.iter_mut()).map(|(d, b)| (d.name.as_str(), TensorViewMut::from_bytes(d.dtype, &d.shape, b))).collect();
        m.run_into(&given, &mut outs).unwrap();
        for (i, (b, w)) in bufs.iter().zip(&want).enumerate() {
            assert!(b.as_slice() == w.bytes(), "{name}: output {i} via run_into differs");
        }
    }
}

#[test]
fn concurrent_runs_match_serial_runs_bit_for_bit() {
    const THREADS: usize = 4;
    const RUNS: usize = 3;
    for name in MODELS {
        let path = artifact(name);
        let a = Artifact::open(&path).unwrap();
        let m = Model::load(&path).unwrap();
        // Every thread runs its own inputs, so a run reading another's activations would show.
        let inputs: Vec<Vec<Tensor>> = (0..THREADS * RUNS).map(|k| a.random_inputs(100 + k as u64)).collect();
        let serial: Vec<Vec<Tensor>> = inputs.iter().map(|x| m.run(&named(&m, x)).unwrap()).collect();
        assert_eq!(m.session_count(), 1, "{name}: serial runs reuse one session");
        let concurrent: Vec<Vec<Vec<Tensor>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (m, inputs) = (&m, &inputs);
                    s.spawn(move || (0..RUNS).map(|r| m.run(&named(m, &inputs[t * RUNS + r])).unwrap()).collect::<Vec<_>>())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for t in 0..THREADS {
            for r in 0..RUNS {
                same_bits(&format!("{name} thread {t} run {r}"), &concurrent[t][r], &serial[t * RUNS + r]);
            }
        }
        let n = m.session_count();
        assert!((1..=THREADS).contains(&n), "{name}: {n} sessions for {THREADS} threads");
    }
}

#[test]
fn bad_inputs_and_outputs_are_errors_naming_them() {
    let m = Model::load(artifact("bert-tiny-b1-s128")).unwrap();
    let a = Artifact::open(&artifact("bert-tiny-b1-s128")).unwrap();
    let inputs = a.random_inputs(1);
    let good = named(&m, &inputs);
    assert!(good.len() >= 2, "bert-tiny takes ids and a mask");
    let (first, second) = (good[0].0, good[1].0);
    let err = |given: &[(&str, TensorView)]| m.run(given).unwrap_err();
    let e = err(&[good[0], good[1], ("nope", good[0].1)]);
    assert_eq!(e.kind(), ErrorKind::Input);
    assert!(e.message().contains("no input 'nope'") && e.message().contains(first), "{e}");
    let e = err(&good[..1]);
    assert!(e.message().contains("missing input") && e.message().contains(second), "{e}");
    let e = err(&[good[0], good[0], good[1]]);
    assert!(e.message().contains(&format!("input '{first}' is given twice")), "{e}");
    // Wrong dtype: the same bytes read as f32.
    let v = good[0].1;
    let e = err(&[(first, TensorView::from_bytes(DType::F32, v.shape(), &v.bytes()[..v.bytes().len() / 2])), good[1]]);
    assert!(e.message().contains(&format!("input '{first}' must be")) && e.message().contains("got f32["), "{e}");
    // Wrong shape, right byte count.
    let flat = [v.shape().iter().product::<usize>()];
    let e = err(&[(first, TensorView::from_bytes(v.dtype(), &flat, v.bytes())), good[1]]);
    assert!(e.message().contains(&format!("input '{first}' must be")), "{e}");
    // Right type, too few bytes.
    let e = err(&[(first, TensorView::from_bytes(v.dtype(), v.shape(), &v.bytes()[1..])), good[1]]);
    assert!(e.message().contains(&format!("input '{first}'")) && e.message().contains("bytes"), "{e}");
    assert!(e.message().contains(m.name()), "errors name the model: {e}");

    // Outputs.
    let o = &m.outputs()[0];
    let mut buf = vec![0u8; o.size_bytes()];
    let e = m.run_into(&good, &mut [("nope", TensorViewMut::from_bytes(o.dtype, &o.shape, &mut buf))]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Output);
    assert!(e.message().contains("no output 'nope'") && e.message().contains(&o.name), "{e}");
    let short = [1usize];
    let e = m.run_into(&good, &mut [(o.name.as_str(), TensorViewMut::from_bytes(o.dtype, &short, &mut buf))]).unwrap_err();
    assert!(e.message().contains(&format!("output '{}' must be", o.name)), "{e}");
    // The model still runs after all that.
    assert!(m.run(&good).is_ok());
}

#[test]
fn bad_artifacts_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(artifact("mlp3-b8")).unwrap();
    let missing = dir.path().join("missing.tsr");
    let e = Model::load(&missing).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Artifact);
    assert!(e.message().contains("missing.tsr") && e.message().contains("cannot read"), "{e}");

    let truncated = dir.path().join("truncated.tsr");
    std::fs::write(&truncated, &bytes[..bytes.len() - 100]).unwrap();
    let e = Model::load(&truncated).err().unwrap();
    assert!(e.message().contains("truncated.tsr") && e.message().contains("truncated or padded"), "{e}");

    // One flipped byte in the module bytes: the digest catches it before anything is loaded.
    let mut tampered = bytes.clone();
    let at = bytes.len() / 3;
    tampered[at] ^= 0x40;
    let path = dir.path().join("tampered.tsr");
    std::fs::write(&path, &tampered).unwrap();
    let e = Model::load(&path).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Artifact);
    assert!(e.message().contains("tampered.tsr") && e.message().contains("digest mismatch"), "{e}");
    let e = Model::from_bytes(&tampered).err().unwrap();
    assert!(e.message().contains("<memory>") && e.message().contains("digest mismatch"), "{e}");
    let e = Model::from_bytes(b"not an artifact at all, but long enough to hold a header of sixty-four bytes....").err().unwrap();
    assert!(e.message().contains("bad magic"), "{e}");
}
