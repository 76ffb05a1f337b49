use super::super::*;
use super::*;
use std::collections::BTreeMap;

#[test]
fn round_trip_keeps_structure_names_and_constants() {
    let mut g = Graph::new("m");
    let x = g.add_input("x", TensorType::f32([2, 3]));
    let w = g.add_const("w", Tensor::from_f32([3], &[1.0, 2.0, 3.0]));
    let y = g.add("y", Op::Binary(BinaryOp::Mul), &[x, w]).unwrap();
    g.outputs.push(y);
    let objects: std::sync::Mutex<BTreeMap<Digest, Vec<u8>>> = Default::default();
    let doc = GraphDoc::from_graph(&g, |t| -> Result<Digest, ()> {
        let d = Digest::of(t.bytes());
        objects.lock().unwrap().insert(d, t.bytes().to_vec());
        Ok(d)
    })
    .unwrap();
    let objects = objects.into_inner().unwrap();
    let bytes = postcard::to_stdvec(&doc).unwrap();
    let back: GraphDoc = postcard::from_bytes(&bytes).unwrap();
    let g2 = back.to_graph(|d| objects.get(d).cloned().ok_or_else(|| "missing".to_string())).unwrap();
    assert_eq!(graph_hash(&g), graph_hash(&g2));
    assert_eq!(g2.value(g2.outputs[0]).name, "y");
    let err = back.to_graph(|_| Err("gone".into())).unwrap_err();
    assert!(err.to_string().contains("constant 'w'"), "{err}");
}

/// A document of `x * w + b`: `w` of `n` elements filled with `fill`, `b` a 2-element constant `bias`.
fn weighted(name: &str, n: usize, fill: f32, bias: [f32; 2]) -> GraphDoc {
    let mut g = Graph::new(name);
    let x = g.add_input("x", TensorType::f32([2, n]));
    let w = g.add_const("w", Tensor::from_f32([n], &vec![fill; n]));
    let b = g.add_const("b", Tensor::from_f32([2, 1], &bias));
    let y = g.add("y", Op::Binary(BinaryOp::Mul), &[x, w]).unwrap();
    let z = g.add("z", Op::Binary(BinaryOp::Add), &[y, b]).unwrap();
    g.outputs.push(z);
    GraphDoc::from_graph(&g, |t| -> Result<Digest, ()> { Ok(Digest::of(t.bytes())) }).unwrap()
}

#[test]
fn structure_digest_leaves_out_large_weights_and_the_name_only() {
    let base = weighted("m", 100, 1.0, [0.0, 1.0]).structure_digest(64);
    // Other values of a constant larger than what kernels keep inside, another name: the same structure.
    assert_eq!(weighted("m", 100, 2.5, [0.0, 1.0]).structure_digest(64), base);
    assert_eq!(weighted("fine-tune", 100, 1.0, [0.0, 1.0]).structure_digest(64), base);
    // A small constant's values are part of it (kernels embed them), and so is every type.
    assert_ne!(weighted("m", 100, 1.0, [0.0, 2.0]).structure_digest(64), base);
    assert_ne!(weighted("m", 101, 1.0, [0.0, 1.0]).structure_digest(64), base);
    // Where a backend keeps constants of 100 elements inside its kernels, their values are structure too.
    assert_ne!(weighted("m", 100, 2.5, [0.0, 1.0]).structure_digest(100), weighted("m", 100, 1.0, [0.0, 1.0]).structure_digest(100));
}
