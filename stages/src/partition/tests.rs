use super::*;
use crate::ir::*;

fn diamond() -> Graph {
    // x -> a -> b -> c, and a -> c directly.
    let mut g = Graph::new("diamond");
    let x = g.add_input("x", TensorType::f32([4]));
    let a = g.add("a", Op::Unary(UnaryOp::Relu), &[x]).unwrap();
    let b = g.add("b", Op::Unary(UnaryOp::Exp), &[a]).unwrap();
    let c = g.add("c", Op::Binary(BinaryOp::Add), &[a, b]).unwrap();
    g.outputs.push(c);
    g
}

fn parts(groups: &[&[u32]]) -> Partitioning {
    let t = Target::parse("cpu").unwrap();
    Partitioning {
        partitions: groups
            .iter()
            .map(|ns| Partition { target: t.clone(), nodes: ns.iter().map(|&n| NodeId(n)).collect(), cost_us: 0.0 })
            .collect(),
        cost_source: CostSource::Analytical,
    }
}

#[test]
fn check_accepts_convex_ordered_covers() {
    let g = diamond();
    assert_eq!(check(&g, &parts(&[&[0, 1, 2]])), Ok(()));
    assert_eq!(check(&g, &parts(&[&[0], &[1], &[2]])), Ok(()));
    assert_eq!(check(&g, &parts(&[&[0, 1], &[2]])), Ok(()));
}

#[test]
fn check_rejects_what_is_not_a_valid_partitioning() {
    let g = diamond();
    // a and c together with b outside: the path a -> b -> c leaves and re-enters.
    assert!(check(&g, &parts(&[&[0, 2], &[1]])).unwrap_err().contains("not convex"));
    // Out of order.
    assert!(check(&g, &parts(&[&[1], &[0], &[2]])).unwrap_err().contains("not convex or not ordered"));
    // Missing and duplicated nodes, empty partitions, unknown nodes.
    assert!(check(&g, &parts(&[&[0, 1]])).unwrap_err().contains("in no partition"));
    assert!(check(&g, &parts(&[&[0, 1], &[1, 2]])).unwrap_err().contains("in partitions 0 and 1"));
    assert!(check(&g, &parts(&[&[0, 1, 2], &[]])).unwrap_err().contains("empty"));
    assert!(check(&g, &parts(&[&[0, 1, 2, 7]])).unwrap_err().contains("does not exist"));
}

/// `(x * w1) * w2`, both weights of 100 elements filled with `f1` and `f2`.
fn two_weights(name: &str, f1: f32, f2: f32) -> Graph {
    let mut g = Graph::new(name);
    let x = g.add_input("x", TensorType::f32([100]));
    let w1 = g.add_const("w1", Tensor::from_f32([100], &[f1; 100]));
    let w2 = g.add_const("w2", Tensor::from_f32([100], &[f2; 100]));
    let y = g.add("y", Op::Binary(BinaryOp::Mul), &[x, w1]).unwrap();
    let z = g.add("z", Op::Binary(BinaryOp::Mul), &[y, w2]).unwrap();
    g.outputs.push(z);
    g
}

fn doc(g: &Graph) -> crate::ir::serial::GraphDoc {
    crate::ir::serial::GraphDoc::from_graph(g, |t| -> Result<tessera_store::Digest, ()> { Ok(tessera_store::Digest::of(t.bytes())) }).unwrap()
}

fn plan_of(g: &Graph) -> plan::ExecPlan {
    plan::build_plan(g, &parts(&[&[0], &[1]]), &|t| tessera_store::Digest::of(t.bytes()), &|_| 64).unwrap()
}

#[test]
fn a_plan_binds_to_other_weights_of_the_same_structure() {
    // Equal weights keep a slot each: a fine-tune may make them differ.
    let base = two_weights("base", 1.0, 1.0);
    let planned = plan_of(&base);
    assert_eq!(planned.constants.len(), 2);
    assert_eq!(planned.constants[0], planned.constants[1]);
    let tuned = two_weights("tuned", 0.5, 3.0);
    let bound = planned.bind(&doc(&tuned)).unwrap();
    // The plan the fine-tune would have made itself.
    assert_eq!(bound, plan_of(&tuned));
    assert_eq!(bound.model, "tuned");
    // Another structure is refused, naming the model.
    let mut other = Graph::new("other");
    let x = other.add_input("x", TensorType::f32([100]));
    let y = other.add("y", Op::Unary(UnaryOp::Relu), &[x]).unwrap();
    other.outputs.push(y);
    let err = planned.bind(&doc(&other)).unwrap_err().to_string();
    assert!(err.contains("model 'other'") && err.contains("another graph"), "{err}");
}
