use super::super::*;

#[test]
fn extracted_subgraph_is_canonical_and_lifts_weights() {
    let mk = |prefix: &str, swap: bool| {
        let mut g = Graph::new("m");
        let x = g.add_input(format!("{prefix}x"), TensorType::f32([2, 4]));
        let w = g.add_const(format!("{prefix}w"), Tensor::from_f32([4, 3], &[0.5; 12]));
        let b = g.add_const(format!("{prefix}b"), Tensor::from_f32([3], &[1.0, 2.0, 3.0]));
        let r = g.add(format!("{prefix}r"), Op::Unary(UnaryOp::Relu), &[x]).unwrap();
        let (m, e) = if swap {
            let e = g.add(format!("{prefix}e"), Op::Unary(UnaryOp::Exp), &[x]).unwrap();
            (g.add(format!("{prefix}m"), Op::MatMul, &[r, w]).unwrap(), e)
        } else {
            let m = g.add(format!("{prefix}m"), Op::MatMul, &[r, w]).unwrap();
            (m, g.add(format!("{prefix}e"), Op::Unary(UnaryOp::Exp), &[x]).unwrap())
        };
        let y = g.add(format!("{prefix}y"), Op::Binary(BinaryOp::Add), &[m, b]).unwrap();
        g.outputs.extend([y, e]);
        g
    };
    let (g1, g2) = (mk("a", false), mk("b", true));
    let all = |g: &Graph| (0..g.nodes.len() as u32).map(NodeId).collect::<Vec<_>>();
    let s1 = subgraph_signature(&g1, &all(&g1), ConstMode::LiftLarge(4));
    let s2 = subgraph_signature(&g2, &all(&g2), ConstMode::LiftLarge(4));
    assert_eq!(s1.digest, s2.digest);
    // x and the 12-element weight are inputs; the 3-element bias stays inside.
    assert_eq!(s1.inputs.len(), 2);
    let (e1, e2) = (extract_subgraph(&g1, &s1), extract_subgraph(&g2, &s2));
    verify(&e1).unwrap();
    assert_eq!(format!("{:?}", e1.nodes), format!("{:?}", e2.nodes));
    assert_eq!(graph_hash(&e1), graph_hash(&e2));
    assert_eq!(e1.values.iter().filter(|v| matches!(v.def, ValueDef::Const(_))).count(), 1);
}
