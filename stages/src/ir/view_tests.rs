//! Tests of [`super::movement_view`] and [`super::StridedView`]: the views found for ViT's and GPT-2's head
//! chains, reshapes strides can and cannot say, and, on random chains of movement, every value read through its
//! view from its source equals what the reference interpreter computes.

use super::*;
use crate::interp::run_graph_observed;
use crate::ir::{Tensor, TensorType};
use proptest::prelude::*;

/// Every element of `v` as read through `view` from `source`.
fn read(source: &Tensor, view: &StridedView) -> Vec<f32> {
    let flat = source.to_f32_vec();
    let mut out = Vec::with_capacity(view.numel());
    let mut idx = vec![0usize; view.shape.len()];
    for _ in 0..view.numel() {
        out.push(flat[view.at(&idx) as usize]);
        for d in (0..idx.len()).rev() {
            idx[d] += 1;
            if idx[d] < view.shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

/// Runs `g` on an input counting 0, 1, 2.. and checks every value against its movement view.
fn check_views(g: &Graph) -> Result<(), String> {
    let x = g.inputs[0];
    let n = g.ty(x).numel();
    let input = Tensor::from_f32(g.ty(x).shape.clone(), &(0..n).map(|i| i as f32).collect::<Vec<_>>());
    let mut values: Vec<Option<Tensor>> = vec![None; g.values.len()];
    values[x.index()] = Some(input.clone());
    run_graph_observed(g, &[input], |v, t| values[v.index()] = Some(t.clone())).map_err(|e| e.to_string())?;
    for v in 0..g.values.len() {
        let v = ValueId(v as u32);
        if g.constant(v).is_some() {
            continue;
        }
        let (source, view) = movement_view(g, v);
        let want = values[v.index()].as_ref().ok_or("a value was not computed")?.to_f32_vec();
        let src = values[source.index()].as_ref().ok_or("the source was not computed")?;
        if view.shape != g.ty(v).shape {
            return Err(format!("{}: view shape {:?}, value {:?}", g.value(v).name, view.shape, g.ty(v).shape));
        }
        if read(src, &view) != want {
            return Err(format!("{}: {view:?} of {} reads other elements", g.value(v).name, g.value(source).name));
        }
    }
    Ok(())
}

#[test]
fn vit_heads_are_strided_views_of_the_projection() {
    // torchvision's ViT: K out of the QKV projection [S, B, 3E], then heads.
    let mut g = Graph::new("vit");
    let qkv = g.add_input("qkv", TensorType::f32([197, 1, 2304]));
    let r = g.add("view_1", Op::Reshape { shape: vec![197, 1, 3, 768] }, &[qkv]).unwrap();
    let u = g.add("unsqueeze", Op::Reshape { shape: vec![1, 197, 1, 3, 768] }, &[r]).unwrap();
    let t = g.add("transpose_1", Op::Transpose { perm: vec![3, 1, 2, 0, 4] }, &[u]).unwrap();
    let s = g.add("squeeze", Op::Reshape { shape: vec![3, 197, 1, 768] }, &[t]).unwrap();
    let one = g.add_const("one", Tensor::from_i64(Vec::<usize>::new(), &[1]));
    let k = g.add("select_1", Op::Gather { axis: 0 }, &[s, one]).unwrap();
    let k = g.add("view_3", Op::Reshape { shape: vec![197, 12, 64] }, &[k]).unwrap();
    let k = g.add("transpose_3", Op::Transpose { perm: vec![1, 0, 2] }, &[k]).unwrap();
    let kt = g.add("kt", Op::Transpose { perm: vec![0, 2, 1] }, &[k]).unwrap();
    let kt = g.add("kt4", Op::Reshape { shape: vec![1, 12, 64, 197] }, &[kt]).unwrap();
    g.outputs.push(kt);
    let (source, view) = movement_view(&g, kt);
    assert_eq!(source, qkv);
    assert_eq!(view.offset, 768);
    assert_eq!(view.shape, vec![1, 12, 64, 197]);
    // Heads 64 apart, head dims contiguous, keys a projection row apart.
    assert_eq!(view.strides[1..], [64, 1, 2304]);
    check_views(&g).unwrap();
}

#[test]
fn gpt2_split_heads_are_views_and_a_matmul_is_a_source() {
    let mut g = Graph::new("gpt2");
    let x = g.add_input("x", TensorType::f32([1, 8, 12]));
    let w = g.add_const("w", Tensor::from_f32([12, 12], &[0.5; 144]));
    let qkv = g.add("c_attn", Op::MatMul, &[x, w]).unwrap();
    let parts = g.add_node("split", Op::Split { axis: 2, sizes: vec![4, 4, 4] }, &[qkv]).unwrap();
    let v = g.add("heads", Op::Reshape { shape: vec![1, 8, 2, 2] }, &[parts[2]]).unwrap();
    let v = g.add("to_heads", Op::Transpose { perm: vec![0, 2, 1, 3] }, &[v]).unwrap();
    g.outputs.push(v);
    let (source, view) = movement_view(&g, v);
    assert_eq!(source, qkv, "the MatMul's output is where the movement starts");
    assert_eq!((view.offset, view.strides.clone()), (8, vec![96, 2, 12, 1]));
    assert_eq!(movement_view(&g, qkv), (qkv, StridedView::contiguous(&[1, 8, 12])));
}

#[test]
fn reshapes_strides_cannot_say_start_a_new_source() {
    let mut g = Graph::new("merge");
    let x = g.add_input("x", TensorType::f32([2, 3, 4]));
    let t = g.add("t", Op::Transpose { perm: vec![0, 2, 1] }, &[x]).unwrap();
    // Merging the transposed pair would need one stride for two: the transpose's output becomes the source.
    let m = g.add("merge", Op::Reshape { shape: vec![2, 12] }, &[t]).unwrap();
    let s = g.add("split", Op::Reshape { shape: vec![2, 2, 6] }, &[m]).unwrap();
    g.outputs.push(s);
    let (source, view) = movement_view(&g, s);
    assert_eq!(source, t);
    assert!(view.is_contiguous());
    // Splitting a transposed dim, or merging a pair that stays in order, is a view.
    let tv = StridedView::contiguous(&[2, 3, 4]).transpose(&[0, 2, 1]);
    assert_eq!(tv.reshape(&[2, 2, 2, 3]).unwrap().strides, vec![12, 2, 1, 4]);
    assert_eq!(tv.reshape(&[1, 2, 4, 3, 1]).unwrap().strides[1..4], [12, 1, 4]);
    assert!(StridedView::contiguous(&[2, 3, 4]).reshape(&[6, 4]).unwrap().is_contiguous());
    assert_eq!(tv.reshape(&[5]), None, "element counts differ");
    check_views(&g).unwrap();
}

/// One random movement step on a value of `shape`, chosen and parameterized by `r`.
fn random_step(g: &mut Graph, x: ValueId, r: u64, i: usize) -> ValueId {
    let shape = g.ty(x).shape.clone();
    let rank = shape.len();
    let pick = |k: u64, n: usize| ((r >> k) % n.max(1) as u64) as usize;
    let name = format!("s{i}");
    match r % 7 {
        0 if rank > 1 => {
            // A rotation or a swap of two dims.
            let mut perm: Vec<usize> = (0..rank).collect();
            if r & 8 == 0 {
                perm.rotate_left(1 + pick(4, rank - 1));
            } else {
                perm.swap(pick(4, rank), pick(12, rank));
            }
            g.add(name, Op::Transpose { perm }, &[x]).unwrap()
        }
        1 if rank > 1 => {
            // Merge two adjacent dims.
            let a = pick(4, rank - 1);
            let mut s = shape.clone();
            s[a] *= s.remove(a + 1);
            g.add(name, Op::Reshape { shape: s }, &[x]).unwrap()
        }
        2 if rank > 0 => {
            // Split a dim by its smallest factor, or add a unit dim.
            let a = pick(4, rank);
            let f = (2..=shape[a]).find(|f| shape[a] % f == 0 && *f < shape[a]);
            let mut s = shape.clone();
            match f {
                Some(f) => {
                    s[a] /= f;
                    s.insert(a, f);
                }
                None => s.insert(a, 1),
            }
            g.add(name, Op::Reshape { shape: s }, &[x]).unwrap()
        }
        3 if rank > 1 => {
            // Gather one index (negative from the end half the time).
            let a = pick(4, rank);
            let idx = pick(8, shape[a]) as i64;
            let idx = if r & (1 << 20) != 0 { idx - shape[a] as i64 } else { idx };
            let c = g.add_const(format!("{name}.i"), Tensor::from_i64(Vec::<usize>::new(), &[idx]));
            g.add(name, Op::Gather { axis: a }, &[x, c]).unwrap()
        }
        4 if rank > 0 => {
            // Gather evenly spaced indices.
            let a = pick(4, rank);
            let step = 1 + pick(8, 2) as i64;
            let len = (shape[a] as i64 + step - 1) / step;
            let idx: Vec<i64> = (0..len).map(|i| i * step).collect();
            let c = g.add_const(format!("{name}.i"), Tensor::from_i64([idx.len()], &idx));
            g.add(name, Op::Gather { axis: a }, &[x, c]).unwrap()
        }
        5 if rank > 0 => {
            // A slice, forwards or backwards.
            let a = pick(4, rank);
            let d = shape[a] as i64;
            let (start, end, step) = if r & (1 << 21) == 0 {
                let s = pick(8, shape[a]) as i64;
                (s, d, 1 + pick(16, 2) as i64)
            } else {
                (d - 1, -1, -1 - pick(16, 2) as i64)
            };
            g.add(name, Op::Slice { axes: vec![a], starts: vec![start], ends: vec![end], steps: vec![step] }, &[x]).unwrap()
        }
        6 if rank > 0 && shape[pick(4, rank)] > 1 => {
            let a = pick(4, rank);
            let first = 1 + pick(8, shape[a] - 1);
            let outs = g.add_node(name, Op::Split { axis: a, sizes: vec![first, shape[a] - first] }, &[x]).unwrap();
            outs[pick(12, 2)]
        }
        _ => g.add(name, Op::Identity, &[x]).unwrap(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any chain of movement read through the views equals the reference's values.
    #[test]
    fn every_value_reads_its_elements_through_its_view(
        shape in prop::collection::vec(1usize..5, 1..5),
        steps in prop::collection::vec(any::<u64>(), 1..8),
    ) {
        let mut g = Graph::new("chain");
        let mut x = g.add_input("x", TensorType::f32(shape));
        for (i, &r) in steps.iter().enumerate() {
            x = random_step(&mut g, x, r, i);
        }
        g.outputs.push(x);
        prop_assert_eq!(check_views(&g), Ok(()));
    }
}
