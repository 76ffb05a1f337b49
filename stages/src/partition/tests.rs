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
