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
