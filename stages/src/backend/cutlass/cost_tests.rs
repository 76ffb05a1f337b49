use super::*;
use crate::ir::{DType, TensorType};

fn matmul(dt: DType, m: usize, n: usize, k: usize) -> Graph {
    let mut g = Graph::new("g");
    let x = g.add_input("x", TensorType::new(dt, vec![m, k]));
    let w = g.add_input("w", TensorType::new(dt, vec![k, n]));
    let y = g.add("mm", Op::MatMul, &[x, w]).unwrap();
    g.outputs.push(y);
    g
}

#[test]
fn thin_and_small_gemms_pay_for_their_padding_and_idle_sms() {
    let big = matmul(DType::F16, 1024, 3072, 768);
    let thin = matmul(DType::F16, 1, 3072, 768);
    let (b, t) = (estimate_us(&big, &[NodeId(0)]), estimate_us(&thin, &[NodeId(0)]));
    // 4.8 GFLOP over 192 tiles: the full rate, about 24 us of math; the thin one pads 1 row to 128 on 24 SMs.
    assert!((20.0..40.0).contains(&b), "{b}");
    assert!(t > 10.0, "a batch-1 row is not 1/1024 of the work here: {t}");
    assert!(estimate_us(&matmul(DType::F32, 1024, 3072, 768), &[NodeId(0)]) > 5.0 * b, "SIMT fp32 is slower");
}
