//! A batched artifact through the C ABI: the batch sizes it serves, a run of batch 3 (padded onto the plan for
//! 8) equal bit for bit to the Rust API's, and a batch beyond the largest plan refused with a message naming
//! the sizes.

#[path = "../../runtime/tests/common/mod.rs"]
mod common;

use std::ffi::{CStr, CString};
use tessera_runtime::{Model, TensorView};
use tessera_runtime_c::*;

#[test]
fn batch_sizes_and_a_padded_run() {
    let path = CString::new(common::artifact(common::BATCHED).to_str().unwrap()).unwrap();
    let mut m: *mut TesseraModel = std::ptr::null_mut();
    // SAFETY (every call below): a live model from tessera_model_load, tensors of live buffers of their sizes.
    unsafe {
        assert_eq!(tessera_model_load(path.as_ptr(), &mut m), TesseraStatus::Ok);
        assert_eq!(tessera_model_batch_count(m), 2);
        assert_eq!((tessera_model_batch_size(m, 0), tessera_model_batch_size(m, 1), tessera_model_batch_size(m, 2)), (1, 8, 0));
        assert_eq!(tessera_model_batch_count(std::ptr::null()), 0);
        let x: Vec<f32> = (0..9 * 784).map(|i| ((i % 97) as f32) / 97.0 - 0.5).collect();
        let (input, logits) = (CString::new("input").unwrap(), CString::new("logits").unwrap());
        let run = |rows: usize, out: &mut Vec<f32>| {
            let in_shape = [rows, 784];
            let out_shape = [rows, 10];
            let t = TesseraTensor {
                name: input.as_ptr(),
                dtype: TesseraDtype::F32 as i32,
                rank: 2,
                shape: in_shape.as_ptr(),
                data: x.as_ptr().cast(),
                size_bytes: rows * 784 * 4,
            };
            let mut o = TesseraTensorMut {
                name: logits.as_ptr(),
                dtype: TesseraDtype::F32 as i32,
                rank: 2,
                shape: out_shape.as_ptr(),
                data: out.as_mut_ptr().cast(),
                size_bytes: rows * 40,
            };
            tessera_model_run(m, &t, 1, &mut o, 1)
        };
        let mut out = vec![0f32; 30];
        assert_eq!(run(3, &mut out), TesseraStatus::Ok);
        let rust = Model::load(common::artifact(common::BATCHED)).unwrap();
        let want = rust.run(&[("input", TensorView::from_slice(&[3, 784], &x[..3 * 784]))]).unwrap();
        assert_eq!(out, want[0].to_f32_vec());
        let mut big = vec![0f32; 90];
        assert_ne!(run(9, &mut big), TesseraStatus::Ok);
        let msg = CStr::from_ptr(tessera_last_error()).to_string_lossy().into_owned();
        assert!(msg.contains("batch 9") && msg.contains("1, 8"), "{msg}");
        tessera_model_free(m);
    }
}
