//! Helpers shared by the end-to-end tests in this folder.

use tessera_stages::ir::Tensor;

/// Asserts `got` matches `want`: same type, and for floats a relative error `max|got - want| / max|want|`
/// below `tol` (relative to the output's scale, so elements near zero do not turn rounding noise into a
/// failure); integer and bool outputs must match exactly; NaN never passes.
pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f64) {
    assert_eq!(got.ty, want.ty, "{what}: type differs");
    let (a, b) = (got.to_f64_vec(), want.to_f64_vec());
    if !want.dtype().is_float() {
        assert_eq!(a, b, "{what}: values differ");
        return;
    }
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(f64::MIN_POSITIVE);
    let mut worst = (0f64, 0usize);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(!x.is_nan() && !y.is_nan(), "{what}: NaN at element {i} (got {x}, want {y})");
        let err = (x - y).abs() / scale;
        if err > worst.0 {
            worst = (err, i);
        }
    }
    assert!(
        worst.0 < tol,
        "{what}: relative error {:.3e} at element {} (got {}, want {}) is not below {tol:e}",
        worst.0,
        worst.1,
        a[worst.1],
        b[worst.1]
    );
}

/// The ONNX export of a tiny BERT (`stages/src/onnx/testdata`, static shapes `[1, 8]`): a held-out model for the
/// incremental-rebuild tests.
pub fn bert_tiny_onnx() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../stages/src/onnx/testdata/bert_tiny_opset17.onnx")
}

/// Writes to `to` the ONNX model at `from` with every large initializer changed (more than
/// `tessera_stages::backend::INLINE_CONST_MAX` elements: those no kernel embeds), each f32 value scaled by 1.25
/// and shifted; the graph, the shapes and the small initializers stay as they are. Returns how many initializers
/// changed.
pub fn change_large_initializers(from: &std::path::Path, to: &std::path::Path) -> usize {
    use prost::Message;
    use tessera_stages::onnx::proto::ModelProto;
    let mut model = ModelProto::decode(std::fs::read(from).unwrap().as_slice()).unwrap();
    let graph = model.graph.as_mut().expect("a graph");
    let mut changed = 0;
    for t in &mut graph.initializer {
        let elements: i64 = t.dims.iter().product();
        // f32 only (data type 1), stored as raw bytes or as float_data.
        if t.data_type != Some(1) || elements as usize <= tessera_stages::backend::INLINE_CONST_MAX {
            continue;
        }
        let change = |v: f32| v * 1.25 + 0.01;
        if let Some(raw) = t.raw_data.as_mut().filter(|r| !r.is_empty()) {
            // Raw data is a `Bytes` (shared with the file it was decoded from): changed in a copy.
            let mut bytes = raw.to_vec();
            for c in bytes.chunks_exact_mut(4) {
                let v = change(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                c.copy_from_slice(&v.to_le_bytes());
            }
            *raw = bytes.into();
        } else {
            t.float_data.iter_mut().for_each(|v| *v = change(*v));
        }
        changed += 1;
    }
    std::fs::write(to, model.encode_to_vec()).unwrap();
    changed
}
