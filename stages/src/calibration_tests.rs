use super::*;
use crate::ir::{BinaryOp, Op, Tensor, TensorType};

#[test]
fn ranges_cover_computed_values_and_skip_sentinels() {
    let mut g = Graph::new("m");
    let x = g.add_input("x", TensorType::f32([4]));
    let big = g.add_const("big", Tensor::from_f32([4], &[1e5, 2.0, -3.0, 4.0]));
    let low = g.add_const("low", Tensor::from_f32([1], &[f32::MIN]));
    let y = g.add("y", Op::Binary(BinaryOp::Mul), &[x, big]).unwrap();
    let m = g.add("m", Op::Binary(BinaryOp::Add), &[x, low]).unwrap();
    g.outputs = vec![y, m];
    let r = measure(&g, None).unwrap();
    assert_eq!(r.runs, CALIBRATION_RUNS as u32);
    assert!(r.max_abs_of(&g, y).unwrap() > 1e3, "{r:?}");
    assert!(r.max_abs_of(&g, m).unwrap() < 1e3, "the -3.4e38 mask is a sentinel, not a value: {r:?}");
    assert_eq!(r.max_abs_of(&g, big), Some(1e5));
    assert_eq!(r.max_abs_of(&g, x), None);
}

/// The parallel maximum is the serial one, specials included.
#[test]
fn max_abs_in_chunks_is_the_serial_maximum() {
    let mut xs: Vec<f32> = (0..300_000usize).map(|i| ((i * 7919) % 100_003) as f32 * if i % 3 == 0 { -1e-3 } else { 1e-3 }).collect();
    for (at, v) in [(5, f32::NAN), (70_000, f32::INFINITY), (150_000, f32::MIN), (200_000, -0.0), (299_999, -1e31)] {
        xs[at] = v;
    }
    let serial = |xs: &[f32]| xs.iter().filter(|x| x.is_finite() && x.abs() < SENTINEL).fold(0f32, |m, x| m.max(x.abs()));
    xs[123_456] = -250.0;
    assert_eq!(max_abs(&xs).to_bits(), serial(&xs).to_bits());
    assert_eq!(max_abs(&xs), 250.0);
}

/// The digest names the inputs' content and order, not where they lie: the same files elsewhere give the
/// same digest, a changed value another (the stage's key: `build_tests`).
#[test]
fn calibration_digest_follows_the_content() {
    let t = tempfile::tempdir().unwrap();
    let write = |dir: &str, v: f32| {
        let d = t.path().join(dir);
        std::fs::create_dir_all(&d).unwrap();
        crate::npy::write(&d.join("x.npy"), &Tensor::from_f32([4], &[v; 4])).unwrap();
        CalibrationInputs::read(&d).unwrap()
    };
    let (a, b, c) = (write("a", 0.5), write("b", 0.5), write("c", 0.25));
    assert_eq!(a.digest(), b.digest());
    assert_ne!(a.digest(), c.digest());
    let mut g = Graph::new("m");
    let x = g.add_input("x", TensorType::f32([4]));
    let y = g.add("y", Op::Binary(BinaryOp::Add), &[x, x]).unwrap();
    g.outputs = vec![y];
    assert_eq!(measure(&g, Some(&c)).unwrap().max_abs_of(&g, y), Some(0.5));
}
