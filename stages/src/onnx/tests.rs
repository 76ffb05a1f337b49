//! Importer tests on small models built with the prost types: each kind of bad input gets an error naming
//! the file, node, op and attribute; shape subgraphs fold away; numerics match hand-computed values.

use super::proto::{
    attribute_proto::AttributeType, tensor_shape_proto, type_proto, AttributeProto, GraphProto, ModelProto, NodeProto,
    OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use super::*;
use crate::interp::run_graph;
use crate::ir::{Op, Tensor};
use prost::Message;

/// A dimension: a number, or a symbol.
enum D {
    N(i64),
    S(&'static str),
}

fn vi(name: &str, elem: i32, dims: &[D]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| tensor_shape_proto::Dimension {
            value: Some(match d {
                D::N(n) => tensor_shape_proto::dimension::Value::DimValue(*n),
                D::S(s) => tensor_shape_proto::dimension::Value::DimParam(s.to_string()),
            }),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem),
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn f32s(name: &str, dims: &[usize]) -> ValueInfoProto {
    vi(name, 1, &dims.iter().map(|&d| D::N(d as i64)).collect::<Vec<_>>())
}

fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: Some(name.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs,
        ..Default::default()
    }
}

fn a_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto { name: Some(name.into()), r#type: Some(AttributeType::Ints as i32), ints: v.to_vec(), ..Default::default() }
}
fn a_int(name: &str, v: i64) -> AttributeProto {
    AttributeProto { name: Some(name.into()), r#type: Some(AttributeType::Int as i32), i: Some(v), ..Default::default() }
}
fn a_float(name: &str, v: f32) -> AttributeProto {
    AttributeProto { name: Some(name.into()), r#type: Some(AttributeType::Float as i32), f: Some(v), ..Default::default() }
}
fn a_str(name: &str, v: &str) -> AttributeProto {
    AttributeProto { name: Some(name.into()), r#type: Some(AttributeType::String as i32), s: Some(v.as_bytes().to_vec()), ..Default::default() }
}

fn init(name: &str, t: &Tensor) -> TensorProto {
    tensor_to_proto(name, t)
}

fn model(opset: i64, nodes: Vec<NodeProto>, inputs: Vec<ValueInfoProto>, outputs: &[&str], inits: Vec<TensorProto>) -> Vec<u8> {
    let m = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(opset) }],
        graph: Some(GraphProto {
            name: Some("g".into()),
            node: nodes,
            input: inputs,
            output: outputs.iter().map(|o| ValueInfoProto { name: Some(o.to_string()), ..Default::default() }).collect(),
            initializer: inits,
            ..Default::default()
        }),
        ..Default::default()
    };
    m.encode_to_vec()
}

fn import(bytes: &[u8]) -> Result<crate::ir::Graph, ImportError> {
    import_bytes(bytes, None, "models/test_model.onnx", &ImportOptions::default())
}

fn err_of(bytes: &[u8]) -> (ImportError, String) {
    let e = import(bytes).expect_err("import should fail");
    let s = e.to_string();
    (e, s)
}

fn run1(g: &crate::ir::Graph, inputs: &[Tensor]) -> Vec<f32> {
    run_graph(g, inputs).unwrap()[0].to_f32_vec()
}

#[test]
fn relu_model_imports_named_after_the_file_stem() {
    let b = model(17, vec![node("Relu", "r", &["x"], &["y"], vec![])], vec![f32s("x", &[3])], &["y"], vec![]);
    let g = import(&b).unwrap();
    assert_eq!(g.name, "test_model");
    assert_eq!(g.value(g.outputs[0]).name, "y");
    assert_eq!(run1(&g, &[Tensor::from_f32([3], &[-1.0, 0.0, 2.0])]), vec![0.0, 0.0, 2.0]);
}

#[test]
fn unsupported_op_names_file_node_and_op() {
    let b = model(17, vec![node("Hardmax", "hm", &["x"], &["y"], vec![])], vec![f32s("x", &[3])], &["y"], vec![]);
    let (e, s) = err_of(&b);
    assert!(e.is_unsupported());
    assert_eq!(e.unsupported_key().as_deref(), Some("Hardmax"));
    assert!(s.contains("models/test_model.onnx") && s.contains("node 'hm'") && s.contains("Hardmax"), "{s}");
    // Other domains are named with their domain.
    let mut n = node("FusedGemm", "", &["x"], &["y"], vec![]);
    n.domain = Some("com.microsoft".into());
    let (_, s) = err_of(&model(17, vec![n], vec![f32s("x", &[3])], &["y"], vec![]));
    assert!(s.contains("node '#0'") && s.contains("com.microsoft:FusedGemm"), "{s}");
}

#[test]
fn missing_input_is_named() {
    let b = model(17, vec![node("Add", "add", &["x", "nope"], &["y"], vec![])], vec![f32s("x", &[3])], &["y"], vec![]);
    let (e, s) = err_of(&b);
    assert!(matches!(e.kind, ImportErrorKind::Missing(_)));
    assert!(s.contains("node 'add' (Add)") && s.contains("'nope'"), "{s}");
    let b = model(17, vec![node("Relu", "r", &["x"], &["y"], vec![])], vec![f32s("x", &[3])], &["z"], vec![]);
    assert!(err_of(&b).1.contains("graph output 'z'"));
}

#[test]
fn malformed_and_truncated_files_are_decode_errors() {
    let b = model(17, vec![node("Relu", "r", &["x"], &["y"], vec![])], vec![f32s("x", &[3])], &["y"], vec![]);
    for cut in [1, b.len() / 2, b.len() - 1] {
        match import(&b[..cut]) {
            Err(e) => assert!(e.to_string().contains("models/test_model.onnx"), "{e}"),
            Ok(_) => panic!("a model truncated to {cut} of {} bytes imported", b.len()),
        }
    }
    let (e, s) = err_of(&[0xff, 0xff, 0xff, 0xff]);
    assert!(matches!(e.kind, ImportErrorKind::Decode(_)), "{s}");
    assert!(s.contains("malformed or truncated"));
}

#[test]
fn bad_attributes_are_named() {
    let b = model(17, vec![node("Transpose", "t", &["x"], &["y"], vec![a_ints("perm", &[0, 5])])], vec![f32s("x", &[2, 3])], &["y"], vec![]);
    let s = err_of(&b).1;
    assert!(s.contains("node 't' (Transpose), attribute 'perm'"), "{s}");
    // Wrong attribute type.
    let b = model(17, vec![node("LeakyRelu", "l", &["x"], &["y"], vec![a_str("alpha", "big")])], vec![f32s("x", &[2])], &["y"], vec![]);
    let s = err_of(&b).1;
    assert!(s.contains("attribute 'alpha'") && s.contains("expected type FLOAT"), "{s}");
    let b = model(17, vec![node("Conv", "c", &["x", "w"], &["y"], vec![a_str("auto_pad", "SOMETIMES")])], vec![f32s("x", &[1, 1, 4, 4])], &["y"], vec![init("w", &Tensor::from_f32([1, 1, 1, 1], &[1.0]))]);
    assert!(err_of(&b).1.contains("attribute 'auto_pad'"));
}

#[test]
fn opsets_outside_the_range_are_rejected() {
    for v in [super::MIN_OPSET - 1, super::MAX_OPSET + 1] {
        let b = model(v, vec![node("Relu", "r", &["x"], &["y"], vec![])], vec![f32s("x", &[3])], &["y"], vec![]);
        let (e, s) = err_of(&b);
        assert!(matches!(e.kind, ImportErrorKind::UnsupportedOpset { version, .. } if version == v), "{s}");
        assert!(s.contains(&format!("version {v}")), "{s}");
    }
}

#[test]
fn symbolic_dims_need_shapes() {
    let b = model(17, vec![node("Relu", "r", &["ids"], &["y"], vec![])], vec![vi("ids", 1, &[D::S("batch"), D::N(4)])], &["y"], vec![]);
    let (e, s) = err_of(&b);
    assert!(matches!(e.kind, ImportErrorKind::NotStatic(_)) && s.contains("'batch'") && s.contains("--shape ids="), "{s}");
    let (name, dims) = parse_shape_arg("ids=2x4").unwrap();
    let opts = ImportOptions { shapes: [(name, dims)].into() };
    let g = import_bytes(&b, None, "m.onnx", &opts).unwrap();
    assert_eq!(g.ty(g.inputs[0]).shape, vec![2, 4]);
    // A shape that contradicts a fixed dimension, or names no input, is an error.
    let opts = ImportOptions { shapes: [("ids".to_string(), vec![2, 5])].into() };
    assert!(import_bytes(&b, None, "m.onnx", &opts).unwrap_err().to_string().contains("fixes it to 4"));
    let opts = ImportOptions { shapes: [("ids".to_string(), vec![2, 4]), ("other".to_string(), vec![1])].into() };
    assert!(import_bytes(&b, None, "m.onnx", &opts).unwrap_err().to_string().contains("other"));
}

#[test]
fn shape_args_parse() {
    assert_eq!(parse_shape_arg("input_ids=1x128").unwrap(), ("input_ids".to_string(), vec![1, 128]));
    assert_eq!(parse_shape_arg("a=b=3,4").unwrap(), ("a=b".to_string(), vec![3, 4]));
    assert_eq!(parse_shape_arg("s=").unwrap(), ("s".to_string(), vec![]));
    assert!(parse_shape_arg("noequals").is_err());
    assert!(parse_shape_arg("=1x2").is_err());
    assert!(parse_shape_arg("x=1xq").unwrap_err().contains("'q'"));
}

#[test]
fn runtime_shape_operand_is_not_static() {
    let b = model(
        17,
        vec![node("Reshape", "rs", &["x", "s"], &["y"], vec![])],
        vec![f32s("x", &[2, 3]), vi("s", 7, &[D::N(2)])],
        &["y"],
        vec![],
    );
    let (e, s) = err_of(&b);
    assert!(matches!(e.kind, ImportErrorKind::NotStatic(_)), "{s}");
    assert!(s.contains("node 'rs' (Reshape)") && s.contains("'s'"), "{s}");
}

#[test]
fn shape_subgraphs_fold_away() {
    // y = Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])): BERT-style dynamic reshape.
    let nodes = vec![
        node("Shape", "shape", &["x"], &["sh"], vec![]),
        node("Gather", "g", &["sh", "zero"], &["b"], vec![a_int("axis", 0)]),
        node("Unsqueeze", "u", &["b", "axes0"], &["b1"], vec![]),
        node("Concat", "cat", &["b1", "minus1"], &["spec"], vec![a_int("axis", 0)]),
        node("Reshape", "rs", &["x", "spec"], &["y"], vec![]),
    ];
    let inits = vec![
        init("zero", &Tensor::from_i64(Vec::<usize>::new(), &[0])),
        init("axes0", &Tensor::from_i64([1], &[0])),
        init("minus1", &Tensor::from_i64([1], &[-1])),
    ];
    let g = import(&model(17, nodes, vec![f32s("x", &[2, 3, 4])], &["y"], inits)).unwrap();
    assert_eq!(g.nodes.len(), 1, "{:?}", g.nodes);
    assert_eq!(g.nodes[0].op, Op::Reshape { shape: vec![2, 12] });
}

#[test]
fn external_data_is_read_relative_to_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let w: Vec<u8> = [1.0f32, 2.0, 3.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut blob = vec![0u8; 16];
    blob.extend(&w);
    std::fs::write(dir.path().join("weights.bin"), &blob).unwrap();
    let ext = |k: &str, v: &str| super::proto::StringStringEntryProto { key: Some(k.into()), value: Some(v.into()) };
    let t = TensorProto {
        name: Some("w".into()),
        dims: vec![3],
        data_type: Some(1),
        data_location: Some(1),
        external_data: vec![ext("location", "weights.bin"), ext("offset", "16"), ext("length", "12")],
        ..Default::default()
    };
    let b = model(17, vec![node("Mul", "m", &["x", "w"], &["y"], vec![])], vec![f32s("x", &[3])], &["y"], vec![t]);
    let path = dir.path().join("ext.onnx");
    std::fs::write(&path, &b).unwrap();
    let g = import_file(&path, &ImportOptions::default()).unwrap();
    assert_eq!(g.name, "ext");
    assert_eq!(run1(&g, &[Tensor::from_f32([3], &[1.0, 1.0, 2.0])]), vec![1.0, 2.0, 6.0]);
    // From bytes without a directory, the external file cannot be found.
    assert!(import(&b).unwrap_err().to_string().contains("external file 'weights.bin'"));
    // A length running past the end of the file.
    std::fs::write(dir.path().join("weights.bin"), &blob[..20]).unwrap();
    assert!(import_file(&path, &ImportOptions::default()).unwrap_err().to_string().contains("past the end"));
}

#[test]
fn unsupported_dtypes_are_named() {
    let b = model(17, vec![node("Relu", "r", &["x"], &["y"], vec![])], vec![vi("x", 11, &[D::N(2)])], &["y"], vec![]);
    let (e, s) = err_of(&b);
    assert!(e.is_unsupported() && s.contains("graph input 'x'") && s.contains("DOUBLE"), "{s}");
    let b = model(17, vec![node("Cast", "c", &["x"], &["y"], vec![a_int("to", 2)])], vec![f32s("x", &[2])], &["y"], vec![]);
    let s = err_of(&b).1;
    assert!(s.contains("node 'c' (Cast), attribute 'to'") && s.contains("UINT8"), "{s}");
}

#[test]
fn gemm_with_constant_b_becomes_one_matmul_with_a_transposed_weight() {
    let w = Tensor::from_f32([4, 3], &(0..12).map(|i| i as f32).collect::<Vec<_>>());
    let c = Tensor::from_f32([4], &[1.0, 2.0, 3.0, 4.0]);
    let nodes = vec![node("Gemm", "fc", &["x", "w", "c"], &["y"], vec![a_int("transB", 1), a_float("alpha", 2.0), a_float("beta", 0.5)])];
    let g = import(&model(13, nodes, vec![f32s("x", &[2, 3])], &["y"], vec![init("w", &w), init("c", &c)])).unwrap();
    let ops: Vec<&str> = g.nodes.iter().map(|n| n.op.name()).collect();
    assert_eq!(ops, ["MatMul", "Add"]);
    assert_eq!(g.ty(g.nodes[0].inputs[1]).shape, vec![3, 4]);
    let x = Tensor::from_f32([2, 3], &[1.0, 0.0, 0.0, 0.0, 1.0, 1.0]);
    // w[j] = [3j, 3j+1, 3j+2]. Row 0: 2 * 3j + 0.5 c_j; row 1: 2 * (6j + 3) + 0.5 c_j.
    assert_eq!(run1(&g, &[x]), vec![0.5, 7.0, 13.5, 20.0, 6.5, 19.0, 31.5, 44.0]);
}

#[test]
fn conv_auto_pad_becomes_explicit_and_batchnorm_folds() {
    let w = Tensor::from_f32([2, 1, 3, 3], &[1.0; 18]);
    let p = |v: [f32; 2]| Tensor::from_f32([2], &v);
    let nodes = vec![
        node("Conv", "conv", &["x", "w"], &["c"], vec![a_str("auto_pad", "SAME_UPPER"), a_ints("strides", &[2, 2])]),
        node("BatchNormalization", "bn", &["c", "g", "b", "m", "v"], &["y"], vec![a_float("epsilon", 0.0)]),
    ];
    let inits = vec![init("w", &w), init("g", &p([1.0, 2.0])), init("b", &p([0.0, 1.0])), init("m", &p([0.0, 1.0])), init("v", &p([1.0, 4.0]))];
    let g = import(&model(13, nodes, vec![f32s("x", &[1, 1, 4, 4])], &["y"], inits)).unwrap();
    assert_eq!(g.nodes.len(), 1);
    let Op::Conv(a) = &g.nodes[0].op else { panic!("expected Conv, got {:?}", g.nodes[0].op) };
    // in 4, stride 2 -> out 2; need (2-1)*2 + 3 = 5 -> total pad 1: SAME_UPPER puts it at the end.
    assert_eq!(a.pads, vec![0, 0, 1, 1]);
    let y = run1(&g, &[Tensor::from_f32([1, 1, 4, 4], &[1.0; 16])]);
    // Channel 0: windows at rows/cols 0 and 2 (the second one half in the end padding) sum 9, 6, 6, 4.
    // Channel 1: (s - 1) * 2/2 + 1 = s.
    assert_eq!(y, vec![9.0, 6.0, 6.0, 4.0, 9.0, 6.0, 6.0, 4.0]);
}

#[test]
fn slice_bounds_are_clamped_and_negative_steps_normalized() {
    let nodes = vec![node("Slice", "s", &["x", "st", "en", "ax", "sp"], &["y"], vec![])];
    let inits = vec![
        init("st", &Tensor::from_i64([1], &[-1])),
        init("en", &Tensor::from_i64([1], &[i64::MIN])),
        init("ax", &Tensor::from_i64([1], &[-1])),
        init("sp", &Tensor::from_i64([1], &[-2])),
    ];
    let g = import(&model(13, nodes, vec![f32s("x", &[2, 5])], &["y"], inits)).unwrap();
    assert_eq!(g.nodes[0].op, Op::Slice { axes: vec![1], starts: vec![4], ends: vec![-1], steps: vec![-2] });
    let x = Tensor::from_f32([2, 5], &(0..10).map(|i| i as f32).collect::<Vec<_>>());
    assert_eq!(run1(&g, &[x]), vec![4.0, 2.0, 0.0, 9.0, 7.0, 5.0]);
}

#[test]
fn old_softmax_coerces_to_two_dimensions() {
    let nodes = vec![node("Softmax", "sm", &["x"], &["y"], vec![a_int("axis", 1)])];
    let g = import(&model(11, nodes, vec![f32s("x", &[1, 2, 2])], &["y"], vec![])).unwrap();
    let y = run1(&g, &[Tensor::from_f32([1, 2, 2], &[0.0, 0.0, 0.0, 0.0])]);
    // Normalized over all 4 trailing elements, not per axis 1.
    assert!(y.iter().all(|&v| (v - 0.25).abs() < 1e-7), "{y:?}");
    let g = import(&model(13, vec![node("Softmax", "sm", &["x"], &["y"], vec![a_int("axis", 1)])], vec![f32s("x", &[1, 2, 2])], &["y"], vec![])).unwrap();
    let y = run1(&g, &[Tensor::from_f32([1, 2, 2], &[0.0; 4])]);
    assert!(y.iter().all(|&v| (v - 0.5).abs() < 1e-7), "{y:?}");
}

#[test]
fn dropout_mask_use_is_reported() {
    let nodes = vec![node("Dropout", "d", &["x"], &["y", "mask"], vec![]), node("Not", "n", &["mask"], &["z"], vec![])];
    let (e, s) = err_of(&model(13, nodes, vec![f32s("x", &[2])], &["y", "z"], vec![]));
    assert!(e.is_unsupported() && s.contains("node 'n' (Not)") && s.contains("dropout mask"), "{s}");
    let nodes = vec![node("Dropout", "d", &["x"], &["y", "mask"], vec![])];
    let g = import(&model(13, nodes, vec![f32s("x", &[2])], &["y"], vec![])).unwrap();
    assert_eq!(run1(&g, &[Tensor::from_f32([2], &[1.0, -1.0])]), vec![1.0, -1.0]);
}

#[test]
fn legacy_broadcast_with_axis() {
    let nodes = vec![node("Add", "a", &["x", "b"], &["y"], vec![a_int("broadcast", 1), a_int("axis", 1)])];
    let g = import(&model(6, nodes, vec![f32s("x", &[1, 2, 2])], &["y"], vec![init("b", &Tensor::from_f32([2], &[10.0, 20.0]))])).unwrap();
    assert_eq!(run1(&g, &[Tensor::from_f32([1, 2, 2], &[0.0; 4])]), vec![10.0, 10.0, 20.0, 20.0]);
}

#[test]
fn lrn_matches_its_definition() {
    let nodes = vec![node("LRN", "lrn", &["x"], &["y"], vec![a_int("size", 3), a_float("alpha", 0.3), a_float("beta", 0.75), a_float("bias", 2.0)])];
    let g = import(&model(13, nodes, vec![f32s("x", &[1, 4, 1, 1])], &["y"], vec![])).unwrap();
    let xs = [1.0f64, 2.0, 3.0, 4.0];
    let y = run1(&g, &[Tensor::from_f32([1, 4, 1, 1], &[1.0, 2.0, 3.0, 4.0])]);
    for c in 0usize..4 {
        let lo = c.saturating_sub(1);
        let hi = (c + 1).min(3);
        let sq: f64 = xs[lo..=hi].iter().map(|v| v * v).sum();
        let want = xs[c] / (2.0f64 + 0.3 / 3.0 * sq).powf(0.75);
        assert!((y[c] as f64 - want).abs() < 1e-6, "channel {c}: {} vs {want}", y[c]);
    }
}

mod never_panics {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Vec<u8> {
        let nodes = vec![
            node("Conv", "conv", &["x", "w"], &["c"], vec![a_ints("pads", &[1, 1, 1, 1])]),
            node("Relu", "r", &["c"], &["y"], vec![]),
        ];
        model(13, nodes, vec![f32s("x", &[1, 1, 3, 3])], &["y"], vec![init("w", &Tensor::from_f32([1, 1, 3, 3], &[0.5; 9]))])
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Truncated or corrupted models give an error or a graph, never a panic.
        #[test]
        fn corrupted_models(cut in 0usize..200, flips in proptest::collection::vec((0usize..200, any::<u8>()), 0..4)) {
            let mut b = sample();
            for (i, v) in flips {
                let n = b.len();
                b[i % n] ^= v;
            }
            let cut = cut.min(b.len());
            let _ = import(&b[..cut]);
            let _ = import(&b);
        }
    }
}

/// Models exported by PyTorch's exporter (`testdata/export_torch.py`: random weights, outputs from ONNX
/// Runtime): the importer's patterns must fire on what a real exporter writes, and the results must match.
mod torch_exports {
    use super::*;
    use std::path::PathBuf;

    fn dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/onnx/testdata")
    }

    /// Imports `<name>.onnx`, runs it on its stored inputs, compares with the stored outputs, and returns the
    /// imported graph's op names.
    fn check(name: &str) -> Vec<&'static str> {
        let d = dir();
        let numbered = |kind: &str| -> Vec<Tensor> {
            (0..).map(|i| d.join(format!("{name}.{kind}_{i}.pb"))).take_while(|p| p.exists()).map(|p| load_tensor_file(&p).unwrap()).collect()
        };
        let inputs = numbered("input");
        let expected = numbered("output");
        let g = import_file(&d.join(format!("{name}.onnx")), &ImportOptions::default()).unwrap();
        let got = run_graph(&g, &inputs).unwrap();
        assert_eq!(got.len(), expected.len());
        for (a, b) in got.iter().zip(&expected) {
            assert_eq!(a.ty, b.ty);
            for (x, y) in a.to_f64_vec().iter().zip(b.to_f64_vec()) {
                assert!((x - y).abs() <= 1e-5 + 1e-4 * y.abs(), "{name}: {x} vs ONNX Runtime's {y}");
            }
        }
        g.nodes.iter().map(|n| n.op.name()).collect()
    }

    fn count(ops: &[&str], op: &str) -> usize {
        ops.iter().filter(|&&o| o == op).count()
    }

    #[test]
    fn erf_gelu_and_layernorm_from_pytorch() {
        for opset in [13, 17] {
            let ops = check(&format!("mlp_erf_gelu_opset{opset}"));
            assert_eq!(count(&ops, "Gelu"), 1, "opset {opset}: {ops:?}");
            assert_eq!(count(&ops, "LayerNormalization"), 1, "opset {opset}: {ops:?}");
            assert_eq!(count(&ops, "Erf") + count(&ops, "ReduceMean") + count(&ops, "Transpose"), 0, "opset {opset}: {ops:?}");
        }
    }

    #[test]
    fn tanh_gelu_from_pytorch() {
        for opset in [13, 17] {
            let ops = check(&format!("mlp_tanh_gelu_opset{opset}"));
            assert_eq!(count(&ops, "Gelu"), 1, "opset {opset}: {ops:?}");
            assert_eq!(count(&ops, "Tanh") + count(&ops, "Pow"), 0, "opset {opset}: {ops:?}");
        }
    }

    #[test]
    fn conv_batchnorm_from_pytorch() {
        let ops = check("conv_bn_opset13");
        assert_eq!(count(&ops, "BatchNormalization"), 0, "{ops:?}");
    }

    #[test]
    fn tiny_bert_from_pytorch() {
        for opset in [13, 17] {
            let ops = check(&format!("bert_tiny_opset{opset}"));
            // Embeddings + 2 layers x 2 norms; 2 layers x 1 GELU.
            assert_eq!(count(&ops, "LayerNormalization"), 5, "opset {opset}: {ops:?}");
            assert_eq!(count(&ops, "Gelu"), 2, "opset {opset}: {ops:?}");
            for gone in ["Shape", "Erf", "ReduceMean", "Sqrt"] {
                assert_eq!(count(&ops, gone), 0, "opset {opset}: {gone} left in {ops:?}");
            }
        }
    }
}

/// Checks every `<name>.onnx` in `$TESSERA_ONNX_CHECK_DIR` (with `<name>.input_<i>.pb` / `.output_<i>.pb`)
/// against its stored outputs: import, reference interpreter, max error relative to the output's largest
/// magnitude at most 1e-4. Run by hand on full-size exports (`testdata/export_torch.py --full DIR`; the models
/// are too large to commit): `TESSERA_ONNX_CHECK_DIR=DIR cargo test -p tessera-stages --lib -- --ignored external`.
#[test]
#[ignore = "needs $TESSERA_ONNX_CHECK_DIR with exported models"]
fn external_models_match_stored_outputs() {
    let dir = std::path::PathBuf::from(std::env::var_os("TESSERA_ONNX_CHECK_DIR").expect("set TESSERA_ONNX_CHECK_DIR"));
    let mut models: Vec<_> = std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|e| e == "onnx")).collect();
    models.sort();
    assert!(!models.is_empty(), "no .onnx files in {}", dir.display());
    let mut worst = 0.0f64;
    for m in models {
        let stem = m.file_stem().unwrap().to_string_lossy().into_owned();
        let numbered = |kind: &str| -> Vec<Tensor> {
            (0..).map(|i| dir.join(format!("{stem}.{kind}_{i}.pb"))).take_while(|p| p.exists()).map(|p| load_tensor_file(&p).unwrap()).collect()
        };
        let (inputs, expected) = (numbered("input"), numbered("output"));
        let t0 = std::time::Instant::now();
        let g = import_file(&m, &ImportOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        let t_import = t0.elapsed().as_secs_f64();
        let t1 = std::time::Instant::now();
        let got = run_graph(&g, &inputs).unwrap_or_else(|e| panic!("{stem}: {e}"));
        let t_run = t1.elapsed().as_secs_f64();
        let mut hist: std::collections::BTreeMap<&str, usize> = Default::default();
        for n in &g.nodes {
            *hist.entry(n.op.name()).or_default() += 1;
        }
        for (i, (a, b)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(a.ty, b.ty, "{stem} output {i}");
            let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
            let scale = b.iter().fold(0.0f64, |s, v| s.max(v.abs())).max(1e-30);
            let err = a.iter().zip(&b).fold(0.0f64, |e, (x, y)| e.max((x - y).abs())) / scale;
            worst = worst.max(err);
            eprintln!("{stem}: output {i}: max error / max |ref| = {err:.2e}; import {t_import:.2}s, run {t_run:.2}s; {} nodes {hist:?}", g.nodes.len());
        }
    }
    assert!(worst <= 1e-4, "worst relative error {worst:.2e} exceeds 1e-4");
}

#[test]
fn a_value_written_by_two_nodes_is_rejected_naming_both() {
    let b = model(
        17,
        vec![node("Relu", "first", &["x"], &["y"], vec![]), node("Neg", "second", &["x"], &["y"], vec![])],
        vec![f32s("x", &[3])],
        &["y"],
        vec![],
    );
    let (e, s) = err_of(&b);
    let loc = e.location.as_ref().expect("the second writer is the node at fault");
    assert_eq!((loc.node.as_str(), loc.op.as_str()), ("second", "Neg"));
    assert!(s.contains("models/test_model.onnx") && s.contains("'y'") && s.contains("node 'first' (Relu)"), "{s}");
}

#[test]
fn a_node_writing_a_graph_input_or_initializer_or_one_name_twice_is_rejected() {
    // Overwrites the graph input.
    let b = model(17, vec![node("Relu", "r", &["x"], &["x"], vec![])], vec![f32s("x", &[3])], &["x"], vec![]);
    let (_, s) = err_of(&b);
    assert!(s.contains("node 'r' (Relu)") && s.contains("'x' is already written by graph input"), "{s}");
    // Overwrites an initializer.
    let w = Tensor::from_f32(vec![3], &[1.0, 2.0, 3.0]);
    let b = model(17, vec![node("Add", "a", &["x", "w"], &["w"], vec![])], vec![f32s("x", &[3])], &["w"], vec![init("w", &w)]);
    let (_, s) = err_of(&b);
    assert!(s.contains("node 'a' (Add)") && s.contains("'w' is already written by initializer"), "{s}");
    // One node, one name on two outputs (unnamed node: labelled by index).
    let b = model(17, vec![node("Split", "", &["x"], &["p", "p"], vec![a_int("axis", 0)])], vec![f32s("x", &[4])], &["p"], vec![]);
    let (e, s) = err_of(&b);
    assert_eq!(e.location.unwrap().node, "#0");
    assert!(s.contains("outputs 0 and 1 are both named 'p'"), "{s}");
    // Two initializers of one name.
    let b = model(17, vec![node("Add", "a", &["x", "w"], &["y"], vec![])], vec![f32s("x", &[3])], &["y"], vec![init("w", &w), init("w", &w)]);
    let (_, s) = err_of(&b);
    assert!(s.contains("test_model.onnx") && s.contains("'w' is written by two initializers"), "{s}");
}

#[test]
fn a_graph_output_listed_twice_is_rejected() {
    let b = model(17, vec![node("Relu", "r", &["x"], &["y"], vec![])], vec![f32s("x", &[3])], &["y", "y"], vec![]);
    let (_, s) = err_of(&b);
    assert!(
        s.contains("models/test_model.onnx") && s.contains("graph output 'y' (written by node 'r' (Relu)) is listed twice, as outputs 0 and 1"),
        "{s}"
    );
    // Two distinct names that alias one value are still fine.
    let b = model(
        17,
        vec![node("Relu", "r", &["x"], &["y"], vec![]), node("Identity", "i", &["y"], &["z"], vec![])],
        vec![f32s("x", &[3])],
        &["y", "z"],
        vec![],
    );
    assert_eq!(import(&b).unwrap().outputs.len(), 2);
}

/// Found by fuzzing (tessera-fuzz onnx-model): a ConstantOfShape fed a constant shape of [65536, 65536]
/// passed the 16 GiB tensor limit and was folded at import, allocating 16 GiB for a 100-byte model (the
/// process aborted); a 1 GiB one took seconds (the fuzzer's hang watchdog). Constants computed at import are
/// now bounded by what the model justifies (twice its own data, at least MIN_FOLD_LIMIT), checked before
/// allocating, and the error names the node and op.
#[test]
fn a_huge_folded_constant_is_refused_before_it_is_allocated() {
    let shape = Tensor::from_i64(vec![2], &[65536, 65536]);
    let b = model(17, vec![node("ConstantOfShape", "big", &["s"], &["y"], vec![])], vec![], &["y"], vec![init("s", &shape)]);
    let (e, s) = err_of(&b);
    assert_eq!(e.location.as_ref().map(|l| (l.node.as_str(), l.op.as_str())), Some(("big", "ConstantOfShape")));
    assert!(s.contains("constant of shape [65536, 65536] (17179869184 bytes) computed at import"), "{s}");
    // 256 MiB is under the 16 GiB tensor limit, but far more than a 100-byte model justifies.
    let shape = Tensor::from_i64(vec![2], &[8192, 8192]);
    let b = model(17, vec![node("ConstantOfShape", "big", &["s"], &["y"], vec![])], vec![], &["y"], vec![init("s", &shape)]);
    let (_, s) = err_of(&b);
    assert!(s.contains("(268435456 bytes) computed at import; this model's limit is 67108864 bytes"), "{s}");
    // A Range of 2^40 elements.
    let sc = |v: i64| Tensor::from_i64(Vec::<usize>::new(), &[v]);
    let b = model(17, vec![node("Range", "r", &["a", "b", "c"], &["y"], vec![])], vec![], &["y"], vec![init("a", &sc(0)), init("b", &sc(1 << 40)), init("c", &sc(1))]);
    let (e, s) = err_of(&b);
    assert_eq!(e.location.unwrap().op, "Range");
    assert!(s.contains("Range's output is a constant of shape [1099511627776]"), "{s}");
    // The same through a folded op (Expand of a constant).
    let one = Tensor::from_f32(vec![1], &[1.0]);
    let b = model(
        17,
        vec![node("Expand", "ex", &["c", "s"], &["y"], vec![])],
        vec![],
        &["y"],
        vec![init("c", &one), init("s", &shape)],
    );
    let (e, s) = err_of(&b);
    assert_eq!(e.location.unwrap().node, "ex");
    assert!(s.contains("computed at import; this model's limit is"), "{s}");
}

#[test]
fn cumsum_gather_nd_scatter_nd_import_and_their_errors_name_the_node() {
    // CumSum with a constant negative axis and both flags; the axis becomes the attribute.
    let axis = init("ax", &Tensor::from_i64(Vec::<usize>::new(), &[-1]));
    let b = model(17, vec![node("CumSum", "cs", &["x", "ax"], &["y"], vec![a_int("exclusive", 1), a_int("reverse", 1)])], vec![f32s("x", &[1, 3])], &["y"], vec![axis]);
    let g = import(&b).unwrap();
    assert_eq!(g.nodes[0].op, Op::CumSum { axis: 1, exclusive: true, reverse: true });
    assert_eq!(run1(&g, &[Tensor::from_f32([1, 3], &[1., 2., 4.])]), vec![6., 4., 0.]);
    // A run-time axis cannot be an attribute.
    let b = model(17, vec![node("CumSum", "cs", &["x", "ax"], &["y"], vec![])], vec![f32s("x", &[3]), vi("ax", 7, &[])], &["y"], vec![]);
    let (e, s) = err_of(&b);
    assert!(matches!(e.kind, ImportErrorKind::NotStatic(_)) && s.contains("node 'cs' (CumSum)"), "{s}");
    // GatherND: constant tuples are normalized (-1 -> 2) at import.
    let idx = init("i", &Tensor::from_i64([2, 1], &[-1, 0]));
    let b = model(17, vec![node("GatherND", "gn", &["x", "i"], &["y"], vec![])], vec![f32s("x", &[3, 2])], &["y"], vec![idx]);
    let g = import(&b).unwrap();
    assert_eq!(g.constant(g.nodes[0].inputs[1]).unwrap().to_i64_vec(), vec![2, 0]);
    assert_eq!(run1(&g, &[Tensor::from_f32([3, 2], &[1., 2., 3., 4., 5., 6.])]), vec![5., 6., 1., 2.]);
    // A constant tuple out of range is an importer error naming the node.
    let idx = init("i", &Tensor::from_i64([1, 1], &[3]));
    let b = model(17, vec![node("GatherND", "gn", &["x", "i"], &["y"], vec![])], vec![f32s("x", &[3, 2])], &["y"], vec![idx]);
    let s = err_of(&b).1;
    assert!(s.contains("node 'gn' (GatherND)") && s.contains("index 3 is out of range"), "{s}");
    // ScatterND: reductions are unsupported, by name.
    let idx = init("i", &Tensor::from_i64([1, 1], &[0]));
    let upd = init("u", &Tensor::from_f32([1, 2], &[7., 8.]));
    let nodes = |attrs| vec![node("ScatterND", "sn", &["x", "i", "u"], &["y"], attrs)];
    let g = import(&model(17, nodes(vec![]), vec![f32s("x", &[3, 2])], &["y"], vec![idx.clone(), upd.clone()])).unwrap();
    assert_eq!(run1(&g, &[Tensor::from_f32([3, 2], &[1., 2., 3., 4., 5., 6.])]), vec![7., 8., 3., 4., 5., 6.]);
    let (e, s) = err_of(&model(17, nodes(vec![a_str("reduction", "add")]), vec![f32s("x", &[3, 2])], &["y"], vec![idx, upd]));
    assert_eq!(e.unsupported_key().as_deref(), Some("ScatterND reduction add"));
    assert!(s.contains("node 'sn' (ScatterND), attribute 'reduction'"), "{s}");
}

#[test]
fn check_lists_every_unsupported_op_once_with_its_node() {
    let b = model(
        17,
        vec![
            node("Hardmax", "h1", &["x"], &["a"], vec![]),
            node("Relu", "r", &["a"], &["b"], vec![]),
            node("FrobnicateXYZ", "custom", &["b"], &["c"], vec![]),
            node("Relu", "fine", &["x"], &["d"], vec![]),
            node("Hardmax", "h2", &["d"], &["e"], vec![]),
        ],
        vec![f32s("x", &[3])],
        &["c", "e"],
        vec![],
    );
    let found = super::import::check(b.clone().into(), None, "models/m.onnx", &ImportOptions::default()).unwrap();
    let nodes: Vec<(String, String)> = found.iter().map(|e| {
        let l = e.location.as_ref().unwrap();
        (l.node.clone(), l.op.clone())
    }).collect();
    // The Relu downstream of h1 is not reported (it would import); the unknown op downstream is.
    assert_eq!(nodes, [("h1".to_string(), "Hardmax".to_string()), ("custom".into(), "FrobnicateXYZ".into()), ("h2".into(), "Hardmax".into())]);
    assert!(found.iter().all(|e| e.is_unsupported() && e.to_string().contains("models/m.onnx")));
    // Import stops at the first, as before.
    let (e, _) = err_of(&b);
    assert_eq!(e.location.unwrap().node, "h1");
    // A model that imports has nothing to report; an invalid one is an error.
    let ok = model(17, vec![node("Relu", "r", &["x"], &["y"], vec![])], vec![f32s("x", &[3])], &["y"], vec![]);
    assert!(super::import::check(ok.clone().into(), None, "ok.onnx", &ImportOptions::default()).unwrap().is_empty());
    assert!(super::import::check(prost::bytes::Bytes::from_static(b"not onnx"), None, "bad.onnx", &ImportOptions::default()).is_err());
}

// ---- math ops and Einsum ----------------------------------------------------------------------------------

/// One single-node model of `op` on an f32 input `x` of `shape`, imported.
fn unary_model(opset: i64, op: &str, attrs: Vec<AttributeProto>, shape: &[usize]) -> crate::ir::Graph {
    let b = model(opset, vec![node(op, "u", &["x"], &["y"], attrs)], vec![f32s("x", shape)], &["y"], vec![]);
    import(&b).unwrap_or_else(|e| panic!("{op}: {e}"))
}

#[test]
fn trigonometric_and_other_math_ops_import_as_one_node_and_compute_their_definition() {
    let x = [-0.75f32, -0.25, 0.0, 0.5, 0.9];
    let t = Tensor::from_f32([5], &x);
    type F = fn(f64) -> f64;
    let cases: [(&str, F); 13] = [
        ("Cos", f64::cos),
        ("Sin", f64::sin),
        ("Tan", f64::tan),
        ("Acos", f64::acos),
        ("Asin", f64::asin),
        ("Atan", f64::atan),
        ("Cosh", f64::cosh),
        ("Sinh", f64::sinh),
        ("Asinh", f64::asinh),
        ("Atanh", f64::atanh),
        ("Round", f64::round_ties_even),
        ("Softplus", |v| (1.0 + v.exp()).ln()),
        ("Mish", |v| v * (1.0 + v.exp()).ln().tanh()),
    ];
    // Opset 13 (the target range) and 22 (the backend suite's, which only added bfloat16 to these ops).
    for opset in [13, 22] {
        for (op, f) in cases {
            let g = unary_model(opset, op, vec![], &[5]);
            assert_eq!(g.nodes.len(), 1, "{op}");
            assert_eq!(g.nodes[0].op.name(), op);
            let got = run1(&g, std::slice::from_ref(&t));
            for (k, (&a, &v)) in got.iter().zip(&x).enumerate() {
                let want = f(v as f64) as f32;
                assert!((a - want).abs() <= 1e-6 * (1.0 + want.abs()), "{op} at {k}: got {a}, want {want}");
            }
        }
    }
    let g = unary_model(17, "Acosh", vec![], &[3]);
    assert_close_f(&run1(&g, &[Tensor::from_f32([3], &[1.0, 2.0, 10.0])]), &[0.0, 1.316958, 2.993223]);
    // Celu: max(0, x) + min(0, alpha (exp(x / alpha) - 1)); alpha 0 is refused by name.
    let g = unary_model(17, "Celu", vec![a_float("alpha", 2.0)], &[3]);
    assert_close_f(&run1(&g, &[Tensor::from_f32([3], &[-1.0, 0.0, 3.0])]), &[2.0 * ((-0.5f64).exp() - 1.0) as f32, 0.0, 3.0]);
    let b = model(17, vec![node("Celu", "c", &["x"], &["y"], vec![a_float("alpha", 0.0)])], vec![f32s("x", &[3])], &["y"], vec![]);
    let s = err_of(&b).1;
    assert!(s.contains("node 'c' (Celu)") && s.contains("attribute 'alpha'"), "{s}");
    // The ops need floats: an integer input is an error naming the node.
    let b = model(17, vec![node("Cos", "c", &["x"], &["y"], vec![])], vec![vi("x", 7, &[D::N(2)])], &["y"], vec![]);
    let s = err_of(&b).1;
    assert!(s.contains("node 'c' (Cos)"), "{s}");
}

fn assert_close_f(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (k, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "element {k}: got {a}, want {b} ({got:?})");
    }
}

/// NumPy's einsum, directly: every assignment of every label is visited and the product of the operands'
/// elements added to the output element it names. Broadcasting (a size-1 dimension) reads index 0.
fn einsum_reference(equation: &str, inputs: &[(Vec<usize>, Vec<f64>)]) -> (Vec<usize>, Vec<f64>) {
    let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    assert_eq!(terms.len(), inputs.len());
    // Ellipsis dimension k (from the left of the widest) is label char ('0' + k).
    let widths: Vec<usize> = terms.iter().zip(inputs).map(|(t, (s, _))| s.len() - t.replace("...", "").len()).collect();
    let width = widths.iter().copied().max().unwrap_or(0);
    let expand = |t: &str, w: usize| -> Vec<char> {
        let mut v = Vec::new();
        let (pre, post) = t.split_once("...").map_or((t, None), |(a, b)| (a, Some(b)));
        v.extend(pre.chars());
        if let Some(post) = post {
            v.extend((width - w..width).map(|k| (b'0' + k as u8) as char));
            v.extend(post.chars());
        }
        v
    };
    let labels: Vec<Vec<char>> = terms.iter().zip(&widths).map(|(t, &w)| expand(t, w)).collect();
    let out: Vec<char> = match rhs {
        Some(r) => expand(&r, width),
        None => {
            let mut letters: Vec<char> = labels.iter().flatten().copied().filter(|c| c.is_ascii_alphabetic()).collect();
            letters.sort();
            let once: Vec<char> = letters.iter().copied().filter(|c| letters.iter().filter(|x| *x == c).count() == 1).collect();
            (0..width).map(|k| (b'0' + k as u8) as char).chain(once).collect()
        }
    };
    let mut all: Vec<char> = labels.iter().flatten().copied().collect();
    all.sort();
    all.dedup();
    let size = |c: char| labels.iter().zip(inputs).flat_map(|(ls, (s, _))| ls.iter().zip(s).filter(move |(l, _)| **l == c).map(|(_, &d)| d)).max().unwrap();
    let sizes: Vec<usize> = all.iter().map(|&c| size(c)).collect();
    let out_shape: Vec<usize> = out.iter().map(|&c| size(c)).collect();
    let mut result = vec![0.0; out_shape.iter().product()];
    let total: usize = sizes.iter().product();
    let mut idx = vec![0usize; all.len()];
    let at = |c: char, idx: &[usize]| idx[all.iter().position(|&x| x == c).unwrap()];
    for _ in 0..total {
        let mut prod = 1.0;
        for (ls, (shape, data)) in labels.iter().zip(inputs) {
            let mut flat = 0;
            for (&l, &d) in ls.iter().zip(shape) {
                flat = flat * d + if d == 1 { 0 } else { at(l, &idx) };
            }
            prod *= data[flat];
        }
        let mut o = 0;
        for (&l, &d) in out.iter().zip(&out_shape) {
            o = o * d + at(l, &idx);
        }
        result[o] += prod;
        // Next assignment (the last label fastest).
        for k in (0..idx.len()).rev() {
            idx[k] += 1;
            if idx[k] < sizes[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    (out_shape, result)
}

/// Imports a one-Einsum model over f32 inputs of these shapes and runs it on `data`.
fn einsum_run(equation: &str, shapes: &[Vec<usize>], data: &[Vec<f32>]) -> Result<(crate::ir::Graph, Tensor), ImportError> {
    let names: Vec<String> = (0..shapes.len()).map(|i| format!("x{i}")).collect();
    let refs: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    let b = model(
        21,
        vec![node("Einsum", "es", &refs, &["y"], vec![a_str("equation", equation)])],
        names.iter().zip(shapes).map(|(n, s)| f32s(n, s)).collect(),
        &["y"],
        vec![],
    );
    let g = import(&b)?;
    let inputs: Vec<Tensor> = shapes.iter().zip(data).map(|(s, d)| Tensor::from_f32(s.clone(), d)).collect();
    let y = run_graph(&g, &inputs).unwrap_or_else(|e| panic!("{equation}: {e}")).remove(0);
    Ok((g, y))
}

fn check_einsum(equation: &str, shapes: &[Vec<usize>], seed: u64) -> Result<(), String> {
    let mut state = seed | 1;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let data: Vec<Vec<f32>> = shapes.iter().map(|s| (0..s.iter().product::<usize>()).map(|_| next()).collect()).collect();
    let (g, got) = einsum_run(equation, shapes, &data).map_err(|e| format!("{equation} {shapes:?}: {e}"))?;
    let ops: Vec<&str> = g.nodes.iter().map(|n| n.op.name()).collect();
    for op in &ops {
        if !["Transpose", "Reshape", "Slice", "MatMul", "ReduceSum", "Mul", "Identity"].contains(op) {
            return Err(format!("{equation}: lowered to {op} ({ops:?})"));
        }
    }
    let inputs: Vec<(Vec<usize>, Vec<f64>)> = shapes.iter().zip(&data).map(|(s, d)| (s.clone(), d.iter().map(|&v| v as f64).collect())).collect();
    let (shape, want) = einsum_reference(equation, &inputs);
    if got.shape() != shape.as_slice() {
        return Err(format!("{equation} {shapes:?}: shape {:?}, expected {shape:?}", got.shape()));
    }
    for (k, (a, b)) in got.to_f64_vec().iter().zip(&want).enumerate() {
        if (a - b).abs() > 1e-5 * (1.0 + b.abs()) {
            return Err(format!("{equation} {shapes:?}: element {k} is {a}, expected {b} (ops {ops:?})"));
        }
    }
    Ok(())
}

/// The equations of ONNX's backend node tests for Einsum (which ship float64 and bfloat16 data only) and
/// other common forms, in f32, against the direct reference.
#[test]
fn einsum_forms_match_the_reference() {
    let s = |v: &[usize]| v.to_vec();
    let cases: Vec<(&str, Vec<Vec<usize>>)> = vec![
        ("...ii ->...i", vec![s(&[3, 5, 5])]),
        ("bij, bjk -> bik", vec![s(&[5, 2, 3]), s(&[5, 3, 4])]),
        ("i,i", vec![s(&[5]), s(&[5])]),
        ("->", vec![s(&[])]),
        ("ij->i", vec![s(&[3, 4])]),
        ("ij->ji", vec![s(&[3, 4])]),
        ("ij->ij", vec![s(&[3, 4])]),
        ("ii", vec![s(&[4, 4])]),
        ("ii->i", vec![s(&[4, 4])]),
        ("iii->i", vec![s(&[3, 3, 3])]),
        ("ij,jk", vec![s(&[2, 3]), s(&[3, 4])]),
        ("ij,jk,kl->il", vec![s(&[2, 3]), s(&[3, 4]), s(&[4, 5])]),
        ("i,j->ij", vec![s(&[3]), s(&[4])]),
        ("bhqd,bhkd->bhqk", vec![s(&[2, 3, 4, 5]), s(&[2, 3, 6, 5])]),
        ("...ij,...jk->...ik", vec![s(&[2, 1, 3, 4]), s(&[5, 4, 2])]),
        ("ij,ij->ij", vec![s(&[1, 3]), s(&[2, 3])]),
        ("bA", vec![s(&[2, 3])]),
        ("ab,cd,bc->", vec![s(&[2, 3]), s(&[4, 5]), s(&[3, 4])]),
        ("i,->i", vec![s(&[3]), s(&[])]),
        ("ij,j->i", vec![s(&[3, 0]), s(&[0])]),
    ];
    for (i, (eq, shapes)) in cases.iter().enumerate() {
        check_einsum(eq, shapes, 7 + i as u64).unwrap_or_else(|e| panic!("{e}"));
    }
    // A transpose-only equation is one Transpose; a matrix product one MatMul.
    let (g, _) = einsum_run("ij->ji", &[vec![3, 4]], &[vec![0.0; 12]]).unwrap();
    assert_eq!(g.nodes.iter().map(|n| n.op.name()).collect::<Vec<_>>(), ["Transpose"]);
    let (g, _) = einsum_run("ij,jk->ik", &[vec![2, 3], vec![3, 4]], &[vec![0.0; 6], vec![0.0; 12]]).unwrap();
    assert_eq!(g.nodes.iter().map(|n| n.op.name()).collect::<Vec<_>>(), ["MatMul"]);
}

#[test]
fn einsum_errors_name_the_node_and_the_equation() {
    let err = |eq: &str, shapes: &[Vec<usize>]| {
        let data: Vec<Vec<f32>> = shapes.iter().map(|s| vec![0.0; s.iter().product()]).collect();
        let e = einsum_run(eq, shapes, &data).map(|_| ()).expect_err(eq);
        let s = e.to_string();
        assert!(s.contains("node 'es' (Einsum)") && s.contains(&format!("'{eq}'")), "{s}");
        s
    };
    assert!(err("ij,jk", &[vec![2, 3]]).contains("2 terms for 1 inputs"));
    assert!(err("ijk", &[vec![2, 3]]).contains("rank 2"));
    assert!(err("ij,jk->ik", &[vec![2, 3], vec![4, 5]]).contains("label 'j' has size 3 in input 0 and 4 in input 1"));
    assert!(err("ii->i", &[vec![2, 3]]).contains("label 'i' has size 2 in input 0 and 3 in input 0"));
    assert!(err("ii->i", &[vec![1, 3]]).contains("label 'i' repeats in input 0 over dimensions of sizes 1 and 3"));
    assert!(err("ij->iz", &[vec![2, 3]]).contains("'z' is in no input"));
    assert!(err("ij->ii", &[vec![2, 3]]).contains("repeats 'i'"));
    assert!(err("...i->i", &[vec![2, 3]]).contains("no '...'"));
    assert!(err("i$j", &[vec![2, 3]]).contains("'$' at position 1"));
    assert!(err("i.j", &[vec![2, 3]]).contains("'...'"));
    let b = model(21, vec![node("Einsum", "es", &["x"], &["y"], vec![])], vec![f32s("x", &[2])], &["y"], vec![]);
    let s = err_of(&b).1;
    assert!(s.contains("node 'es' (Einsum)") && s.contains("attribute 'equation'"), "{s}");
}

mod einsum_props {
    use super::check_einsum;
    use proptest::prelude::*;

    /// One operand: letter subscripts (indices into the pool), an optional ellipsis (position in the term,
    /// width), and per letter whether this operand broadcasts it (size 1).
    type OperandSpec = (Vec<usize>, Option<(usize, usize)>, Vec<bool>);

    const POOL: &[u8] = b"abCde";

    fn operand() -> impl Strategy<Value = OperandSpec> {
        (
            proptest::collection::vec(0usize..POOL.len(), 0..=3),
            proptest::option::weighted(0.3, (0usize..=3, 0usize..=2)),
            proptest::collection::vec(proptest::bool::weighted(0.15), POOL.len()),
        )
    }

    /// An equation and its operands' shapes from the drawn specs.
    fn build(ops: &[OperandSpec], sizes: &[usize], ell: &[usize], out: &Option<(Vec<usize>, bool, usize)>, spaces: bool) -> (String, Vec<Vec<usize>>) {
        let width = ops.iter().filter_map(|o| o.1.map(|e| e.1)).max().unwrap_or(0);
        let any_ell = ops.iter().any(|o| o.1.is_some());
        let sp = if spaces { " " } else { "" };
        let mut terms = Vec::new();
        let mut shapes = Vec::new();
        for (letters, e, bcast) in ops {
            let mut term = String::new();
            let mut shape = Vec::new();
            let at = e.map_or(usize::MAX, |(p, _)| p.min(letters.len()));
            for k in 0..=letters.len() {
                if k == at {
                    let w = e.unwrap().1;
                    term.push_str("...");
                    // Ellipsis dims align right; every other one of an operand broadcasts when its letter flag says.
                    shape.extend((width - w..width).enumerate().map(|(j, d)| if bcast[j % bcast.len()] { 1 } else { ell[d] }));
                }
                if let Some(&l) = letters.get(k) {
                    term.push(POOL[l] as char);
                    shape.push(if bcast[l] { 1 } else { sizes[l] });
                }
            }
            terms.push(term);
            shapes.push(shape);
        }
        let mut eq = terms.join(&format!("{sp},{sp}"));
        if let Some((letters, with_ell, pos)) = out {
            let used: Vec<usize> = ops.iter().flat_map(|o| o.0.iter().copied()).collect();
            let mut o: Vec<usize> = Vec::new();
            for &l in letters {
                if used.contains(&l) && !o.contains(&l) {
                    o.push(l);
                }
            }
            let mut rhs: String = o.iter().map(|&l| POOL[l] as char).collect();
            if width > 0 || (any_ell && *with_ell) {
                rhs.insert_str((*pos).min(rhs.len()), "...");
            }
            eq = format!("{eq}{sp}->{sp}{rhs}");
        }
        (eq, shapes)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        /// Random equations (1 to 3 operands, diagonals, sums, broadcasting, ellipses, explicit and implicit
        /// outputs) through the importer's lowering and the reference interpreter, against the direct reference.
        #[test]
        fn einsum_lowering_matches_a_direct_reference(
            ops in proptest::collection::vec(operand(), 1..=3),
            sizes in proptest::collection::vec(1usize..=3, POOL.len()),
            ell in proptest::collection::vec(1usize..=3, 2),
            out in proptest::option::of((proptest::collection::vec(0usize..POOL.len(), 0..=5), any::<bool>(), 0usize..=3)),
            spaces in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let (eq, shapes) = build(&ops, &sizes, &ell, &out, spaces);
            if let Err(e) = check_einsum(&eq, &shapes, seed) {
                return Err(TestCaseError::fail(e));
            }
        }
    }
}
