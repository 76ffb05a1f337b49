//! The artifact end to end: link real shared objects (compiled from C here), read, load, run; determinism;
//! the memory plan; and corrupted files.

mod common;

use common::*;
use std::sync::OnceLock;
use tessera_kernels::artifact::provenance::with_provenance;
use tessera_kernels::artifact::{plan::Lifetime, slot_bytes, Artifact, ArtifactErrorKind, Blake3, Buf, Provenance, SourceModel};
use tessera_stages::stages::link::{link, LinkInput, LinkStep, ValueRef};
use tessera_kernels::runtime::Executable;
use tessera_stages::backend::{Module};
use tessera_stages::ir::{DType, Tensor, TensorType};

/// The kernels' shared object, compiled once per test binary.
fn so_bytes() -> Vec<u8> {
    static SO: OnceLock<Vec<u8>> = OnceLock::new();
    SO.get_or_init(|| compile_so(KERNELS_C)).clone()
}

fn mlp() -> LinkInput {
    mlp_input(kernels_module(so_bytes()))
}

#[test]
fn runs_and_matches_hand_computed_results() {
    let bytes = link(&mlp()).unwrap();
    let a = Artifact::read(&bytes).unwrap();
    let mut exe = Executable::load(&a).unwrap();
    let x = Tensor::from_f32([2, 3], &X);
    for _ in 0..3 {
        // Several runs: nothing left in the arena from one run changes the next.
        let out = exe.run(std::slice::from_ref(&x)).unwrap();
        let names: Vec<&str> = exe.outputs().map(|(n, _)| n).collect();
        assert_eq!(names, ["y", "h", "x_again", "bias", "aligned"]);
        assert_eq!(out[0].to_f32_vec(), Y);
        assert_eq!(out[1].to_f32_vec(), H);
        assert_eq!(out[2], x);
        assert_eq!(out[3].to_f32_vec(), B);
        assert_eq!(out[4].to_i64_vec(), [1, 1, 1], "input, constant and output pointers are 64-byte aligned");
    }
    let other = Tensor::from_f32([2, 3], &[0.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
    let out = exe.run(&[other]).unwrap();
    // [[0,0],[9,12]] + B = [[0.5,-20],[10,14]]; relu + B = [[1,-20],[11,16]].
    assert_eq!(out[0].to_f32_vec(), [1.0, -20.0, 11.0, 16.0]);
}

#[test]
fn constants_are_stored_once() {
    let a = Artifact::read(&link(&mlp()).unwrap()).unwrap();
    let c = &a.body.constants;
    assert_eq!(c.len(), 2, "W and B once each; the duplicate B and the unused constant are not stored");
    assert_eq!(c[0].digest, Tensor::from_f32([3, 2], &W).digest());
    assert_eq!(c[1].digest, Tensor::from_f32([2, 2], &B).digest());
    assert!(c.iter().all(|c| c.offset % 64 == 0));
    assert_eq!(a.constant_bytes(1), Tensor::from_f32([2, 2], &B).bytes());
    // Both uses of B point at the one copy.
    let uses: Vec<Buf> = a.body.steps.iter().flat_map(|s| s.args.iter().copied()).filter(|b| matches!(b, Buf::Const(_))).collect();
    assert_eq!(uses, [Buf::Const(0), Buf::Const(1), Buf::Const(0), Buf::Const(1)]);
    // The data section holds W (24 bytes) padded to 64, then B (16 bytes).
    assert_eq!(a.data().len(), 64 + 16);
}

#[test]
fn relink_is_byte_identical() {
    let input = mlp();
    let a = link(&input).unwrap();
    assert_eq!(a, link(&input.clone()).unwrap());
    // Through the link input's own serialization (how the pipeline hashes and stores it).
    let round: LinkInput = postcard::from_bytes(&postcard::to_stdvec(&input).unwrap()).unwrap();
    assert_eq!(round, input);
    assert_eq!(a, link(&round).unwrap());
}

#[test]
fn format_is_pinned() {
    // A change in the encoding of anything in the body (including the IR's TensorType and the backends'
    // Module) changes this digest: bump FORMAT_VERSION, then update the digest.
    let mut input = mlp_input(kernels_module(b"\x7fELF not really".to_vec()));
    input.input_int_bounds = vec![3];
    let bytes = link(&input).unwrap();
    assert_eq!(&bytes[..8], b"TESSERA\x1a");
    assert_eq!(blake3::hash(&bytes).to_hex().as_str(), "51ea31a6b578153a1125c473813fea681e8a247bdff5e7a23036df12d81bd76d");
}

#[test]
fn memory_plan_reuses_space() {
    let a = Artifact::read(&link(&mlp()).unwrap()).unwrap();
    assert!(a.body.arena_bytes < a.body.unplanned_bytes(), "{} vs {}", a.body.arena_bytes, a.body.unplanned_bytes());
    // Value 0 dies at step 1 and value 2 is born at step 2: they share a slot.
    assert_eq!(a.body.values[0].offset, a.body.values[2].offset);

    // A long chain needs two slots, not fifty.
    let n = 50;
    let ty = TensorType::f32([1024]);
    let module = fake_module(vec![common::f("k", vec![ty.clone()], vec![ty.clone()], 0)]);
    let input = LinkInput {
        model: "chain".into(),
        inputs: vec![("x".into(), ty.clone())],
        outputs: vec![("y".into(), ValueRef::Value(n - 1))],
        values: vec![ty.clone(); n as usize],
        modules: vec![module],
        steps: (0..n)
            .map(|i| LinkStep {
                module: 0,
                function: 0,
                args: vec![if i == 0 { ValueRef::Input(0) } else { ValueRef::Value(i - 1) }, ValueRef::Value(i)],
            })
            .collect(),
        ..Default::default()
    };
    let a = Artifact::read(&link(&input).unwrap()).unwrap();
    assert_eq!(a.body.arena_bytes, 3 * 4096, "the input's own slot and two alternating slots");
    assert_eq!(a.body.unplanned_bytes(), 51 * 4096);
}

#[test]
fn run_checks_inputs() {
    let a = Artifact::read(&link(&mlp()).unwrap()).unwrap();
    let mut exe = Executable::load(&a).unwrap();
    let e = exe.run(&[]).unwrap_err();
    assert!(e.0.contains("takes 1 inputs (x), got 0"), "{e}");
    let e = exe.run(&[Tensor::from_f32([3, 2], &X)]).unwrap_err();
    assert!(e.0.contains("input 0 ('x') must be f32[2x3], got f32[3x2]"), "{e}");
}

#[test]
fn random_inputs_follow_the_bounds() {
    let mut input = mlp();
    input.inputs.push(("ids".into(), TensorType::new(DType::I64, [64])));
    input.input_int_bounds = vec![100, 2];
    let a = Artifact::read(&link(&input).unwrap()).unwrap();
    let r = a.random_inputs(7);
    assert_eq!(r[0].ty, TensorType::f32([2, 3]));
    assert!(r[0].to_f32_vec().iter().all(|&v| v != 0.0 && (-1.0..1.0).contains(&v)));
    let ids = r[1].to_i64_vec();
    assert!(ids.iter().all(|&v| (0..2).contains(&v)) && ids.contains(&0) && ids.contains(&1));
    // The same seed gives the same values as the reference interpreter's generator, stream = input position.
    assert_eq!(r[1], tessera_stages::interp::random_tensor(&TensorType::new(DType::I64, [64]), 7, 1, 2));
    assert_eq!(a.random_inputs(7), r);
    assert_ne!(a.random_inputs(8), r);
}

#[test]
fn modules_load_independently_and_reload() {
    // Two executables of one artifact, dropped and loaded again: each load is its own library, and a reused
    // descriptor number never hands back a stale one.
    let a = Artifact::read(&link(&mlp()).unwrap()).unwrap();
    let x = Tensor::from_f32([2, 3], &X);
    for _ in 0..4 {
        let mut e1 = Executable::load(&a).unwrap();
        let mut e2 = Executable::load(&a).unwrap();
        assert_eq!(e1.run(std::slice::from_ref(&x)).unwrap()[0].to_f32_vec(), Y);
        assert_eq!(e2.run(std::slice::from_ref(&x)).unwrap()[0].to_f32_vec(), Y);
    }
    // A different library after the first was dropped: its own code runs.
    let other = compile_so(&KERNELS_C.replace("x[i] + y[i]", "x[i] - y[i]"));
    let a2 = Artifact::read(&link(&mlp_input(kernels_module(other))).unwrap()).unwrap();
    let out = Executable::load(&a2).unwrap().run(std::slice::from_ref(&x)).unwrap();
    // h = xW - B = [[9.5, 32], [-20, -26]]; relu - B = [[9, 52], [-1, -2]].
    assert_eq!(out[1].to_f32_vec(), [9.5, 32.0, -20.0, -26.0]);
    assert_eq!(out[0].to_f32_vec(), [9.0, 52.0, -1.0, -2.0]);
}

#[test]
fn missing_symbol_fails_at_load() {
    let mut m = kernels_module(so_bytes());
    m.functions[1].symbol = "t_gelu".into();
    let a = Artifact::read(&link(&mlp_input(m)).unwrap()).unwrap();
    let e = Executable::load(&a).err().unwrap();
    assert!(e.0.contains("module 0") && e.0.contains("backend c") && e.0.contains("'t_gelu'"), "{e}");
}

fn link_err(input: &LinkInput) -> String {
    link(input).unwrap_err().to_string()
}

#[test]
fn link_rejects_bad_plans() {
    use ValueRef::*;
    let base = mlp();
    let with = |f: &dyn Fn(&mut LinkInput)| {
        let mut i = base.clone();
        f(&mut i);
        link_err(&i)
    };
    let e = with(&|i| {
        i.steps[1].args.pop();
    });
    assert!(e.starts_with("link mlp: step 1 (backend c, function 't_add') has 2 arguments, the function takes 3"), "{e}");
    let e = with(&|i| i.steps[1].args[1] = Input(0));
    assert!(e.contains("step 1 (backend c, function 't_add') argument 1: input 0 is f32[2x3], the function expects f32[2x2]"), "{e}");
    let e = with(&|i| i.steps.swap(1, 2));
    assert!(e.contains("step 1 (backend c, function 't_relu') argument 0: reads value %1 before any step writes it"), "{e}");
    let e = with(&|i| i.steps[4].args[2] = Value(2));
    assert!(e.contains("step 4 (backend c, function 't_add') argument 2: value %2 is written a second time"), "{e}");
    let e = with(&|i| i.steps[4].args[2] = Const(1));
    assert!(e.contains("argument 2: an output must be a value, got constant"), "{e}");
    let e = with(&|i| i.steps[0].args[0] = Input(5));
    assert!(e.contains("step 0 argument 0: input 5 does not exist (1 declared)"), "{e}");
    let e = with(&|i| i.outputs[0].1 = Value(9));
    assert!(e.contains("output 'y': value 9 does not exist"), "{e}");
    let e = with(&|i| i.values.push(t22()));
    assert!(e.contains("value %5 is never written"), "{e}");
    let e = with(&|i| i.steps[0].module = 3);
    assert!(e.contains("step 0 calls module 3 of 1"), "{e}");
    let e = with(&|i| i.steps[0].function = 9);
    assert!(e.contains("step 0 calls function 9 of module 0 (backend c), which has 4"), "{e}");
    let e = with(&|i| i.outputs[1].0 = "y".into());
    assert!(e.contains("two outputs are named 'y'"), "{e}");
    let e = with(&|i| i.inputs[0].0 = String::new());
    assert!(e.contains("an input has an empty name"), "{e}");
    let e = with(&|i| i.input_int_bounds = vec![1, 2]);
    assert!(e.contains("2 random integer bounds for 1 inputs"), "{e}");
    let e = with(&|i| i.input_int_bounds = vec![0]);
    assert!(e.contains("input 'x' has random integer bound 0"), "{e}");
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = link(&mlp()).unwrap();
    for len in 0..bytes.len() {
        let e = Artifact::read(&bytes[..len]).err().unwrap_or_else(|| panic!("a {len}-byte prefix was accepted"));
        assert!(e.to_string().starts_with("artifact <memory>: "), "{e}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(matches!(Artifact::read(&longer).unwrap_err().kind, ArtifactErrorKind::Length { .. }));
}

#[test]
fn every_byte_flip_is_an_error() {
    let bytes = link(&mlp()).unwrap();
    let mut v = bytes.clone();
    for i in 0..bytes.len() {
        let bit = 1u8 << (i % 8);
        v[i] ^= bit;
        assert!(Artifact::read(&v).is_err(), "flipping bit {} of byte {i} was accepted", i % 8);
        v[i] ^= bit;
    }
    assert!(Artifact::read(&v).is_ok());
}

/// The same on an artifact with provenance stamped on (the payload's own bytes are covered above): every
/// truncation from the payload's end on, and every bit of the header and the section, is an error.
#[test]
fn every_damage_to_a_stamped_artifact_is_an_error() {
    let payload = link(&mlp()).unwrap();
    let p = Provenance {
        tessera_version: "0.1.0".into(),
        source_revision: "unknown".into(),
        source: SourceModel { kind: "fixture".into(), name: "fixture:mlp3:b2".into(), digest: Blake3([1; 32]) },
        targets: vec!["cpu -compiler=c".into()],
        precision: "fp32".into(),
        costs: "analytical".into(),
        options: Default::default(),
    };
    let bytes = with_provenance(&payload, &p).unwrap();
    let a = Artifact::read(&bytes).unwrap();
    assert_eq!((a.provenance.as_ref(), a.payload_digest(), a.data()), (Some(&p), Blake3::of(&payload), Artifact::read(&payload).unwrap().data()));
    for len in payload.len()..bytes.len() {
        let e = Artifact::read(&bytes[..len]).err().unwrap_or_else(|| panic!("a {len}-byte prefix was accepted"));
        assert!(e.to_string().starts_with("artifact <memory>: provenance section: "), "{e}");
    }
    let mut v = bytes.clone();
    for i in (0..64).chain(payload.len()..bytes.len()) {
        let bit = 1u8 << (i % 8);
        v[i] ^= bit;
        assert!(Artifact::read(&v).is_err(), "flipping bit {} of byte {i} was accepted", i % 8);
        v[i] ^= bit;
    }
    assert!(Artifact::read(&v).is_ok());
}

#[test]
fn errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mlp.tsr");
    let bytes = link(&mlp()).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    let e = Artifact::open(&path).unwrap_err().to_string();
    assert!(e.contains(&path.display().to_string()) && e.contains("truncated or padded"), "{e}");
    let e = Artifact::open(&dir.path().join("missing.tsr")).unwrap_err().to_string();
    assert!(e.contains("missing.tsr") && e.contains("cannot read"), "{e}");
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(Artifact::open(&path).unwrap().body.model, "mlp");
}

/// A module for link-only tests: its functions are real signatures, its bytes are never loaded.
fn fake_module(functions: Vec<tessera_stages::backend::FunctionInfo>) -> Module {
    Module { backend: "fake".into(), target: "none".into(), format: tessera_kernels::runtime::c::FORMAT, functions, bytes: vec![] }
}

/// Re-encodes a corrupted body with a correct digest, so the decoder and validator (not the digest) see it.
fn with_fixed_digest(mut bytes: Vec<u8>) -> Vec<u8> {
    let d = blake3::hash(&bytes[64..]);
    bytes[32..64].copy_from_slice(d.as_bytes());
    bytes
}

mod props {
    use super::*;
    use proptest::prelude::*;

    /// A random plan: `n_inputs` inputs, constants, and steps each reading 1..=3 existing buffers and writing
    /// 1..=2 new values of random sizes; some values become outputs.
    #[derive(Debug, Clone)]
    struct Dag {
        n_inputs: usize,
        n_consts: usize,
        /// (reads as raw choices, sizes of written values, scratch)
        steps: Vec<(Vec<usize>, Vec<usize>, u64)>,
        outputs: Vec<usize>,
    }

    fn dag() -> impl Strategy<Value = Dag> {
        let step = (prop::collection::vec(any::<usize>(), 1..=3), prop::collection::vec(1usize..300, 1..=2), prop::sample::select(vec![0u64, 0, 100, 5000]));
        (1usize..=3, 0usize..=3, prop::collection::vec(step, 1..40), prop::collection::vec(any::<usize>(), 1..4))
            .prop_map(|(n_inputs, n_consts, steps, outputs)| Dag { n_inputs, n_consts, steps, outputs })
    }

    fn build(d: &Dag) -> LinkInput {
        let ty = |n: usize| TensorType::f32([n]);
        let inputs: Vec<(String, TensorType)> = (0..d.n_inputs).map(|i| (format!("in{i}"), ty(10 + i))).collect();
        let constants: Vec<Tensor> = (0..d.n_consts).map(|i| Tensor::from_f32([3], &[i as f32 % 2.0, 1.0, 2.0])).collect();
        let mut values: Vec<TensorType> = Vec::new();
        let mut functions = Vec::new();
        let mut steps = Vec::new();
        for (s, (reads, sizes, scratch)) in d.steps.iter().enumerate() {
            let avail = inputs.len() + constants.len() + values.len();
            let args_in: Vec<ValueRef> = reads
                .iter()
                .map(|&r| {
                    let r = r % avail;
                    if r < inputs.len() {
                        ValueRef::Input(r as u32)
                    } else if r < inputs.len() + constants.len() {
                        ValueRef::Const((r - inputs.len()) as u32)
                    } else {
                        ValueRef::Value((r - inputs.len() - constants.len()) as u32)
                    }
                })
                .collect();
            let type_of = |r: &ValueRef| match *r {
                ValueRef::Input(i) => inputs[i as usize].1.clone(),
                ValueRef::Const(i) => constants[i as usize].ty.clone(),
                ValueRef::Value(i) => values[i as usize].clone(),
            };
            let in_types: Vec<TensorType> = args_in.iter().map(type_of).collect();
            let mut args = args_in;
            let mut out_types = Vec::new();
            for &n in sizes {
                args.push(ValueRef::Value(values.len() as u32));
                values.push(ty(n));
                out_types.push(ty(n));
            }
            functions.push(common::f(&format!("k{s}"), in_types, out_types, *scratch));
            steps.push(LinkStep { module: 0, function: s as u32, args });
        }
        let outputs = d.outputs.iter().enumerate().map(|(i, &o)| (format!("out{i}"), ValueRef::Value((o % values.len()) as u32))).collect();
        LinkInput { model: "dag".into(), inputs, outputs, values, constants, modules: vec![fake_module(functions)], steps, ..Default::default() }
    }

    /// Lifetimes recomputed here, independently of the library: inputs live throughout, a value from its
    /// writer to its last reader (to the end if it is an output).
    fn lives(input: &LinkInput) -> Vec<Lifetime> {
        let end = input.steps.len() as u32;
        let mut v: Vec<Lifetime> = vec![Lifetime { first: u32::MAX, last: 0 }; input.values.len()];
        for (s, st) in input.steps.iter().enumerate() {
            for a in &st.args {
                if let ValueRef::Value(i) = a {
                    let l = &mut v[*i as usize];
                    l.first = l.first.min(s as u32);
                    l.last = l.last.max(s as u32);
                }
            }
        }
        for (_, o) in &input.outputs {
            if let ValueRef::Value(i) = o {
                v[*i as usize].last = end;
            }
        }
        let mut all = vec![Lifetime { first: 0, last: end }; input.inputs.len()];
        all.extend(v);
        all
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

        #[test]
        fn plan_never_overlaps_live_buffers(d in dag()) {
            let input = build(&d);
            let bytes = link(&input).unwrap();
            prop_assert_eq!(&bytes, &link(&input).unwrap());
            let a = Artifact::read(&bytes).unwrap();
            let b = &a.body;
            let lives = lives(&input);
            let slots: Vec<(u64, u64)> = b.inputs.iter().map(|d| (d.offset, slot_bytes(&d.ty)))
                .chain(b.values.iter().map(|v| (v.offset, slot_bytes(&v.ty)))).collect();
            for (i, &(off, size)) in slots.iter().enumerate() {
                prop_assert!(off % 64 == 0 && off + size <= b.arena_bytes);
                for (j, &(off2, size2)) in slots.iter().enumerate().skip(i + 1) {
                    if lives[i].overlaps(&lives[j]) {
                        prop_assert!(off + size <= off2 || off2 + size2 <= off,
                            "buffers {} and {} are live together and overlap: {:?} {:?}", i, j, (off, size), (off2, size2));
                    }
                }
            }
            prop_assert!(b.arena_bytes <= b.unplanned_bytes());
            prop_assert_eq!(b.scratch_bytes, d.steps.iter().map(|s| s.2).max().unwrap());
        }

        #[test]
        fn corrupted_bodies_never_panic(flips in prop::collection::vec((any::<usize>(), 1u8..=255), 1..4)) {
            // Corruption that gets past the digest (re-computed here) must still be an error or a valid artifact.
            let bytes = link(&build(&Dag { n_inputs: 2, n_consts: 2, steps: vec![(vec![0, 2], vec![4], 100), (vec![4, 1, 3], vec![5, 6], 0)], outputs: vec![1, 2] })).unwrap();
            let body_len = u64::from_le_bytes(bytes[16..24].try_into().unwrap()) as usize;
            let mut v = bytes.clone();
            for (at, x) in flips {
                v[64 + at % body_len] ^= x;
            }
            let _ = Artifact::read(&with_fixed_digest(v));
        }
    }
}

/// Re-frames an artifact around a changed body (lengths, padding, digest all correct), so only the
/// validator can object to it.
fn reframe(bytes: &[u8], f: impl FnOnce(&mut tessera_kernels::artifact::Body)) -> Vec<u8> {
    let body_len = u64::from_le_bytes(bytes[16..24].try_into().unwrap()) as usize;
    let data = &bytes[(64 + body_len).div_ceil(64) * 64..];
    let mut body: tessera_kernels::artifact::Body = postcard::from_bytes(&bytes[64..64 + body_len]).unwrap();
    f(&mut body);
    let enc = postcard::to_stdvec(&body).unwrap();
    let mut out = bytes[..64].to_vec();
    out[16..24].copy_from_slice(&(enc.len() as u64).to_le_bytes());
    out.extend_from_slice(&enc);
    out.resize((64 + enc.len()).div_ceil(64) * 64, 0);
    out.extend_from_slice(data);
    with_fixed_digest(out)
}

/// Found by fuzzing (tessera-fuzz artifact): a shape whose size overflows made the validator's size
/// arithmetic panic (debug) or wrap to a small size that passed the bounds checks (release); an arena or
/// scratch size far beyond what the buffers need passed, and the runtime would allocate it. All are
/// errors naming the buffer now.
#[test]
fn hostile_sizes_are_rejected_before_any_arithmetic_on_them() {
    let bytes = link(&mlp()).unwrap();
    assert!(Artifact::read(&reframe(&bytes, |_| {})).is_ok());
    let err = |b: Vec<u8>| Artifact::read(&b).unwrap_err().to_string();
    let e = err(reframe(&bytes, |b| b.values[0].ty.shape = vec![1 << 40, 1 << 40]));
    assert!(e.contains("value %0 has type") && e.contains("whose size is beyond"), "{e}");
    let e = err(reframe(&bytes, |b| b.constants[0].ty.shape = vec![usize::MAX, 2]));
    assert!(e.contains("constant 0 has type"), "{e}");
    let e = err(reframe(&bytes, |b| b.modules[0].functions[0].outputs[0].shape = vec![1 << 62, 8]));
    assert!(e.contains("module 0") && e.contains("whose size is beyond"), "{e}");
    let e = err(reframe(&bytes, |b| b.arena_bytes = 1 << 40));
    assert!(e.contains("the arena is 1099511627776 bytes, more than all inputs and values together"), "{e}");
    let e = err(reframe(&bytes, |b| b.scratch_bytes = u64::MAX));
    assert!(e.contains("more than any function declares"), "{e}");
}

/// A plan mixing host and GPU modules: the linker lists every copy between the places explicitly, before
/// the first step at the other place that reads the value, once; validation refuses a body whose steps would
/// read a value where it is not.
#[test]
fn mixed_plans_get_explicit_transfers() {
    use tessera_kernels::artifact::{validate_body, Transfer};
    use tessera_kernels::Place;
    use ValueRef::*;
    let ty = t22();
    let unary = || vec![common::f("k", vec![t22()], vec![t22()], 0)];
    let host = kernels_module(so_bytes()); // function 1 is t_relu
    let h = 1;
    // A cubin module in its real encoding (the cubin itself is not one: nothing here launches it).
    let cubin_module_bytes = || {
        use tessera_kernels::runtime::cuda::format::{CubinModule, FunctionLaunches};
        CubinModule::single("sm_90".into(), b"\x7fELF, not really a cubin".to_vec(), vec![FunctionLaunches { launches: vec![] }]).encode()
    };
    let gpu = Module { backend: "cuda".into(), target: "cuda".into(), format: tessera_kernels::runtime::cuda::FORMAT, functions: unary(), bytes: cubin_module_bytes() };
    let step = |module: u32, args: Vec<ValueRef>| LinkStep { module, function: if module == 0 { h } else { 0 }, args };
    let input = LinkInput {
        model: "mixed".into(),
        inputs: vec![("x".into(), ty.clone())],
        input_int_bounds: vec![],
        outputs: vec![("host_out".into(), Value(3)), ("gpu_out".into(), Value(2))],
        values: vec![ty.clone(); 5],
        constants: vec![],
        modules: vec![host, gpu],
        steps: vec![
            step(0, vec![Input(0), Value(0)]), // host writes %0
            step(1, vec![Value(0), Value(1)]), // GPU reads %0: copied up
            step(1, vec![Value(0), Value(2)]), // GPU reads %0 again: already there
            step(0, vec![Value(1), Value(3)]), // host reads %1: copied down
            step(1, vec![Input(0), Value(4)]), // inputs are in both places
        ],
    };
    let a = Artifact::read(&link(&input).unwrap()).unwrap();
    assert_eq!(
        a.body.transfers,
        [Transfer { before: 1, value: 0, to: Place::Gpu }, Transfer { before: 3, value: 1, to: Place::Host }]
    );
    // One place, no transfers.
    assert!(Artifact::read(&link(&mlp()).unwrap()).unwrap().body.transfers.is_empty());

    let data = a.data().len() as u64;
    let mut missing = a.body.clone();
    missing.transfers.remove(1);
    let e = validate_body(&missing, data).unwrap_err();
    assert!(matches!(e, tessera_kernels::artifact::BodyError::Structure(_)), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("step 3") && e.contains("value %1") && e.contains("transfer is missing"), "{e}");
    let mut wrong_place = a.body.clone();
    wrong_place.transfers[0].to = Place::Host;
    let e = validate_body(&wrong_place, data).unwrap_err().to_string();
    assert!(e.contains("transfer 0") && e.contains("runs on the GPU"), "{e}");
    let mut too_early = a.body.clone();
    too_early.transfers[0].before = 0;
    too_early.transfers[0].to = Place::Host;
    let e = validate_body(&too_early, data).unwrap_err().to_string();
    assert!(e.contains("no step has written"), "{e}");
    let mut twice = a.body.clone();
    twice.transfers.insert(1, Transfer { before: 2, value: 0, to: Place::Gpu });
    let e = validate_body(&twice, data).unwrap_err().to_string();
    assert!(e.contains("there already"), "{e}");
    let mut unordered = a.body.clone();
    unordered.transfers.swap(0, 1);
    let e = validate_body(&unordered, data).unwrap_err().to_string();
    assert!(e.contains("step 1") && e.contains("transfer is missing"), "a transfer out of order applies nowhere: {e}");
    let mut past_the_end = a.body.clone();
    past_the_end.transfers.push(Transfer { before: 99, value: 4, to: Place::Host });
    let e = validate_body(&past_the_end, data).unwrap_err().to_string();
    assert!(e.contains("after the last step"), "{e}");

    // Without a GPU, loading says why; never a crash.
    if tessera_kernels::runtime::cuda::available().is_err() {
        let e = Executable::load(&a).err().expect("no GPU here").to_string();
        assert!(e.contains("GPU"), "{e}");
    }
}
