//! Lowering tests: the steps each pattern becomes, scratch reuse, errors naming the node, module determinism.

use super::plan::*;
use super::*;
use crate::ir::*;

fn target() -> Target {
    Target::parse("cpu -compiler=gemm").unwrap()
}

fn all_nodes(g: &Graph) -> Vec<NodeId> {
    (0..g.nodes.len() as u32).map(NodeId).collect()
}

/// The kernel graph of the whole model, as the pipeline would extract it.
fn kernel_of(g: &Graph) -> Graph {
    let sig = subgraph_signature(g, &all_nodes(g), ConstMode::LiftLarge(super::super::INLINE_CONST_MAX));
    extract_subgraph(g, &sig)
}

fn lower(g: &Graph) -> Result<(PlanFunction, FunctionInfo), BackendError> {
    let k = GemmBackend.lower(&target(), &kernel_of(g), "f")?;
    Ok((PlanFunction::decode(&k.code).unwrap(), k.info))
}

fn gemms(f: &PlanFunction) -> Vec<&Sgemm> {
    f.steps.iter().filter_map(|s| if let Step::Sgemm(s) = s { Some(s) } else { None }).collect()
}

fn w(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_f32(shape.to_vec(), &(0..n).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect::<Vec<_>>())
}

#[test]
fn matmul_bias_gelu_is_one_gemm_with_its_epilogue() {
    let mut g = Graph::new("m");
    let x = g.add_input("x", TensorType::f32([2, 3, 16]));
    let wt = g.add_const("w", w(&[16, 8]));
    let b = g.add_const("b", w(&[8]));
    let m = g.add("mm", Op::MatMul, &[x, wt]).unwrap();
    let a = g.add("add", Op::Binary(BinaryOp::Add), &[m, b]).unwrap();
    let y = g.add("gelu", Op::Gelu { approximate: GeluApprox::Erf }, &[a]).unwrap();
    g.outputs.push(y);
    let (f, info) = lower(&g).unwrap();
    // x and the 128-element weight are inputs; the 8-element bias is inlined.
    assert_eq!(info.inputs.len(), 2);
    assert_eq!((info.scratch_bytes, f.consts.len()), (0, 1));
    let s = gemms(&f);
    assert_eq!(s.len(), 1);
    // The two batches of x stack into one tall GEMM against the shared weight.
    assert_eq!((s[0].batch.clone(), s[0].m, s[0].n, s[0].k), (vec![], 6, 8, 16));
    assert_eq!(s[0].epilogue.ops, vec![EpOp::Add { src: View { buf: Buf::Const(0), offset: 0 }, inner: 1, count: 8 }, EpOp::Gelu(GeluKind::Erf)]);
    assert_eq!(s[0].c, View { buf: Buf::Arg(2), offset: 0 });
}

#[test]
fn broadcast_batches_keep_their_strides() {
    let mut g = Graph::new("m");
    let a = g.add_input("a", TensorType::f32([2, 1, 3, 4]));
    let b = g.add_input("b", TensorType::f32([5, 4, 6]));
    let m = g.add("mm", Op::MatMul, &[a, b]).unwrap();
    g.outputs.push(m);
    let (f, _) = lower(&g).unwrap();
    let s = gemms(&f)[0];
    assert_eq!(s.batch, vec![2, 5]);
    assert_eq!((s.a.batch_strides.clone(), s.b.batch_strides.clone()), (vec![12, 0], vec![0, 24]));
}

#[test]
fn conv_lowerings_im2col_pointwise_depthwise() {
    let attrs = |k: usize, group: usize, stride: usize| ConvAttrs {
        strides: vec![stride; 2],
        pads: vec![k / 2; 4],
        dilations: vec![1; 2],
        group,
    };
    let mut g = Graph::new("c");
    let x = g.add_input("x", TensorType::f32([2, 8, 10, 10]));
    let w3 = g.add_const("w3", w(&[16, 8, 3, 3]));
    let w1 = g.add_const("w1", w(&[16, 16, 1, 1]));
    let wd = g.add_const("wd", w(&[16, 1, 3, 3]));
    let c3 = g.add("c3", Op::Conv(attrs(3, 1, 1)), &[x, w3]).unwrap();
    let r = g.add("r", Op::Unary(UnaryOp::Relu), &[c3]).unwrap();
    let c1 = g.add("c1", Op::Conv(attrs(1, 1, 1)), &[r, w1]).unwrap();
    let cd = g.add("cd", Op::Conv(attrs(3, 16, 2)), &[c1, wd]).unwrap();
    g.outputs.push(cd);
    let (f, info) = lower(&g).unwrap();
    let kinds: Vec<&str> = f
        .steps
        .iter()
        .map(|s| match s {
            Step::Sgemm(_) => "gemm",
            Step::Im2col(_) => "im2col",
            Step::Depthwise2d(_) => "dw",
        })
        .collect();
    assert_eq!(kinds, ["im2col", "gemm", "im2col", "gemm", "gemm", "dw"]);
    let s = gemms(&f);
    assert_eq!(s[0].epilogue.ops, vec![EpOp::Relu]);
    assert_eq!((s[1].epilogue.base, s[1].c.offset - s[0].c.offset), (1600, 1600));
    // The pointwise conv: one GEMM over both samples, reading the relu output in place.
    assert_eq!((s[2].batch.clone(), s[2].m, s[2].n, s[2].k), (vec![2], 16, 100, 16));
    // Scratch: the im2col columns (8·9·100 = 7200 floats) are freed before the two 3200-float intermediates
    // are both live, so the peak is 7200 + 3200 (c3's output lives from the first step on).
    assert_eq!(info.scratch_bytes, 4 * (7200 + 3200));
}

#[test]
fn errors_name_the_node_and_op() {
    let mut g = Graph::new("e");
    let x = g.add_input("x", TensorType::f32([4, 4]));
    let s = g.add("soft", Op::Softmax { axis: 1 }, &[x]).unwrap();
    g.outputs.push(s);
    let e = lower(&g).unwrap_err();
    assert!(matches!(e, BackendError::Unsupported { .. }), "an op it cannot run is a refusal: {e:?}");
    let e = e.to_string();
    assert!(e.contains("backend gemm") && e.contains("(Softmax)") && e.contains("cannot run Softmax"), "{e}");

    // A Relu whose input comes from outside the partition has no chain to join.
    let mut g = Graph::new("e");
    let x = g.add_input("x", TensorType::f32([4, 4]));
    let r = g.add("relu", Op::Unary(UnaryOp::Relu), &[x]).unwrap();
    g.outputs.push(r);
    let e = lower(&g).unwrap_err().to_string();
    assert!(e.contains("(Relu)") && e.contains("only fused into a MatMul or Conv"), "{e}");

    let mut g = Graph::new("e");
    let a = g.add_input("a", TensorType::new(DType::F16, [4, 4]));
    let m = g.add("mm", Op::MatMul, &[a, a]).unwrap();
    g.outputs.push(m);
    let e = lower(&g).unwrap_err().to_string();
    assert!(e.contains("f32 only"), "{e}");

    let c = Target::parse("cpu").unwrap();
    let e = GemmBackend.lower(&c, &Graph::new("x"), "f").unwrap_err();
    assert!(matches!(e, BackendError::Invalid { .. }), "another backend's target is an invalid request: {e:?}");
    assert!(e.to_string().contains("not 'gemm'"), "{e}");
}

#[test]
fn modules_are_deterministic_and_refuse_duplicate_symbols() {
    let mut g = Graph::new("m");
    let x = g.add_input("x", TensorType::f32([3, 16]));
    let wt = g.add_const("w", w(&[16, 8]));
    let m = g.add("mm", Op::MatMul, &[x, wt]).unwrap();
    g.outputs.push(m);
    let k = kernel_of(&g);
    let be = GemmBackend;
    let l1 = be.lower(&target(), &k, "a").unwrap();
    let l2 = be.lower(&target(), &k, "b").unwrap();
    let m1 = be.compile_module(&target(), &[l1.clone(), l2.clone()]).unwrap();
    let m2 = be.compile_module(&target(), &[l1.clone(), l2]).unwrap();
    assert_eq!(m1, m2);
    assert_eq!(m1.format, tessera_kernels::runtime::gemm::FORMAT);
    assert_eq!(m1.functions.iter().map(|f| f.symbol.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(Plan::decode(&m1.bytes).unwrap().functions.len(), 2);
    let e = be.compile_module(&target(), &[l1.clone(), l1.clone()]).unwrap_err().to_string();
    assert!(e.contains("two kernels are named 'a'"), "{e}");
    let mut bad = l1;
    bad.code.truncate(3);
    assert!(be.compile_module(&target(), &[bad]).unwrap_err().to_string().contains("corrupt"));
}

#[test]
fn supports_follows_the_target() {
    let mut g2 = Graph::new("m");
    let a = g2.add_input("a", TensorType::f32([3, 16]));
    let b = g2.add_input("b", TensorType::f32([16, 2]));
    let mm = g2.add("mm", Op::MatMul, &[a, b]).unwrap();
    g2.outputs.push(mm);
    assert!(GemmBackend.supports(&g2, NodeId(0), &target()));
    assert!(!GemmBackend.supports(&g2, NodeId(0), &Target::parse("cpu").unwrap()));
    assert!(GemmBackend.available().is_ok());
}

/// Around a depthwise conv the intermediates are channels-last (backend/gemm/layout.rs): the first pointwise
/// GEMM reads the channels-first input and writes pixels x channels with its bias per column, the depthwise
/// step runs channels-last, and the last GEMM reads channels-last into the channels-first output.
#[test]
fn depthwise_blocks_are_channels_last_inside_the_kernel() {
    let attrs = |k: usize, group: usize| ConvAttrs { strides: vec![1; 2], pads: vec![k / 2; 4], dilations: vec![1; 2], group };
    let mut g = Graph::new("b");
    let x = g.add_input("x", TensorType::f32([2, 8, 10, 10]));
    let (we, be) = (g.add_const("we", w(&[16, 8, 1, 1])), g.add_const("be", w(&[16])));
    let wd = g.add_const("wd", w(&[16, 1, 3, 3]));
    let wp = g.add_const("wp", w(&[4, 16, 1, 1]));
    let e = g.add("e", Op::Conv(attrs(1, 1)), &[x, we, be]).unwrap();
    let d = g.add("d", Op::Conv(attrs(3, 16)), &[e, wd]).unwrap();
    let p = g.add("p", Op::Conv(attrs(1, 1)), &[d, wp]).unwrap();
    g.outputs.push(p);
    let (f, _) = lower(&g).unwrap();
    let s = gemms(&f);
    assert_eq!((s[0].batch.clone(), s[0].m, s[0].n, s[0].k), (vec![2], 100, 16, 8));
    assert_eq!((s[0].a.rs, s[0].a.cs, s[0].b.rs, s[0].b.cs), (1, 100, 1, 8), "X read channels-first, W transposed");
    assert!(matches!(s[0].epilogue.ops[..], [EpOp::Add { inner: 1, count: 16, .. }]), "{:?}", s[0].epilogue.ops);
    assert!(f.steps.iter().any(|st| matches!(st, Step::Depthwise2d(d) if d.channels_last)));
    assert_eq!((s[1].m, s[1].n, s[1].k), (4, 100, 16));
    assert_eq!((s[1].b.rs, s[1].b.cs), (1, 16), "the depthwise output read channels-last");
    // Without the depthwise conv nothing changes layout.
    let mut g = Graph::new("no_dw");
    let x = g.add_input("x", TensorType::f32([2, 8, 10, 10]));
    let (we, wp) = (g.add_const("we", w(&[16, 8, 1, 1])), g.add_const("wp", w(&[4, 16, 1, 1])));
    let e = g.add("e", Op::Conv(attrs(1, 1)), &[x, we]).unwrap();
    let p = g.add("p", Op::Conv(attrs(1, 1)), &[e, wp]).unwrap();
    g.outputs.push(p);
    let (f, _) = lower(&g).unwrap();
    assert!(gemms(&f).iter().all(|s| s.n == 100), "channels-first: pixels are the columns");
}
