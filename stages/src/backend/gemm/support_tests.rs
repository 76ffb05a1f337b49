use super::*;
use crate::ir::{BinaryOp, ConvAttrs, DType, Op, Tensor, TensorType, UnaryOp};

fn conv_attrs() -> ConvAttrs {
    ConvAttrs { strides: vec![1, 1], pads: vec![1, 1, 1, 1], dilations: vec![1, 1], group: 1 }
}

/// x -> Conv -> Add(bias) -> Relu -> MatMul(as a second anchor), with `extra` adding a second use of the conv output.
fn chain(extra_use: bool) -> (Graph, Vec<NodeId>) {
    let mut g = Graph::new("t");
    let x = g.add_input("x", TensorType::f32([1, 2, 4, 4]));
    let w = g.add_const("w", Tensor::from_f32([3, 2, 3, 3], &[0.1; 54]));
    let b = g.add_const("b", Tensor::from_f32([3, 1, 1], &[0.5; 3]));
    let c = g.add("conv", Op::Conv(conv_attrs()), &[x, w]).unwrap();
    let a = g.add("add", Op::Binary(BinaryOp::Add), &[b, c]).unwrap();
    let r = g.add("relu", Op::Unary(UnaryOp::Relu), &[a]).unwrap();
    let t = g.add("tanh", Op::Unary(UnaryOp::Tanh), &[r]).unwrap();
    g.outputs.push(t);
    if extra_use {
        g.outputs.push(c);
    }
    let ids = (0..g.nodes.len() as u32).map(NodeId).collect();
    (g, ids)
}

#[test]
fn epilogues_need_a_single_use_chain_to_an_anchor() {
    let (g, n) = chain(false);
    assert_eq!(n.iter().map(|&n| supports(&g, n)).collect::<Vec<_>>(), [true, true, true, false]);
    let f = fusion(&g, n[1], &|v| uses_in(&g, v)).unwrap();
    assert!(matches!(f, Fusion::Add { inner: 16, count: 3, .. }), "{f:?}");
    // A second use of the conv output (here: a graph output) stops the chain at the conv.
    let (g, n) = chain(true);
    assert_eq!(n.iter().map(|&n| supports(&g, n)).collect::<Vec<_>>(), [true, false, false, false]);
    let e = fusion(&g, n[1], &|v| uses_in(&g, v)).unwrap_err();
    assert!(e.contains("Add") && e.contains("no other use"), "{e}");
}

#[test]
fn unsupported_dtypes_and_broadcasts() {
    let mut g = Graph::new("t");
    let a = g.add_input("a", TensorType::f32([4, 3]));
    let b = g.add_input("b", TensorType::f32([3, 5]));
    let col = g.add_input("col", TensorType::f32([4, 1]));
    let m = g.add("mm", Op::MatMul, &[a, b]).unwrap();
    let add = g.add("add", Op::Binary(BinaryOp::Add), &[m, col]).unwrap();
    g.outputs.push(add);
    assert!(supports(&g, NodeId(0)));
    assert!(!supports(&g, NodeId(1)), "a per-row bias is not an epilogue this backend has");
    let mut h = Graph::new("h");
    let a = h.add_input("a", TensorType::new(DType::F16, [4, 3]));
    let b = h.add_input("b", TensorType::new(DType::F16, [3, 5]));
    let m = h.add("mm", Op::MatMul, &[a, b]).unwrap();
    h.outputs.push(m);
    assert!(!supports(&h, NodeId(0)), "gemm runs f32 only");
    assert!(anchor(&h, NodeId(0)).is_ok(), "the chain rule itself is shared by f16 chains (cublas)");
    let mut m = Graph::new("m");
    let a = m.add_input("a", TensorType::new(DType::F16, [4, 3]));
    let b = m.add_input("b", TensorType::f32([3, 5]));
    let mm = m.add("mm", Op::MatMul, &[a, b]);
    if let Ok(mm) = mm {
        m.outputs.push(mm);
        assert!(anchor(&m, NodeId(0)).unwrap_err().contains("f32, f16 or bf16 throughout"));
    }
}
