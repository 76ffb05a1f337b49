//! `tessera_model_run_device` through the C ABI (called as C would, through the exported functions).
//! Everywhere: a host model, a size that disagrees with the shape, null pointers are statuses with messages.
//! On a GPU machine (`TESSERA_GPU=1`, `--include-ignored`): a zoo model compiled for `cuda` runs from device
//! buffers the caller allocated, with outputs equal, bit for bit, to `tessera_model_run`'s from host memory.

#[path = "../../runtime/tests/common/mod.rs"]
mod common;

use cudarc::driver::result;
use std::ffi::{CStr, CString};
use std::ptr::{null, null_mut};
use tessera_kernels::artifact::Artifact;
use tessera_runtime_c::*;

fn last() -> String {
    // SAFETY: the library's message of this thread, valid until its next failing call.
    unsafe { CStr::from_ptr(tessera_last_error()) }.to_string_lossy().into_owned()
}

fn load(path: &std::path::Path) -> *mut TesseraModel {
    let p = CString::new(path.to_str().unwrap()).unwrap();
    let mut m = null_mut();
    // SAFETY: a C string and a place for the pointer.
    assert_eq!(unsafe { tessera_model_load(p.as_ptr(), &mut m) }, TesseraStatus::Ok, "{}", last());
    m
}

/// Input or output `i`'s description.
fn info(m: *const TesseraModel, i: usize, input: bool) -> TesseraTensorInfo {
    let mut t = TesseraTensorInfo { name: null(), dtype: 0, rank: 0, shape: null(), size_bytes: 0 };
    // SAFETY: a live model and a writable description.
    let s = unsafe { if input { tessera_model_input(m, i, &mut t) } else { tessera_model_output(m, i, &mut t) } };
    assert_eq!(s, TesseraStatus::Ok, "{}", last());
    t
}

fn device(t: &TesseraTensorInfo, ptr: u64) -> TesseraDeviceTensor {
    TesseraDeviceTensor { name: t.name, dtype: t.dtype, rank: t.rank, shape: t.shape, data: ptr, size_bytes: t.size_bytes }
}

#[test]
fn bad_calls_are_statuses_with_messages() {
    let m = load(&common::c_zoo().join("mlp3-b8.tsr"));
    // SAFETY (this test): live model, descriptions from the library, pointers never dereferenced on the host.
    unsafe {
        assert_eq!(tessera_model_is_gpu(m), 0);
        assert_eq!(tessera_model_is_gpu(null()), 0);
        let input = info(m, 0, true);
        let ok = device(&input, 0x1000);
        assert_eq!(tessera_model_run_device(m, &ok, 1, null(), 0), TesseraStatus::ErrorInput);
        assert!(last().contains("model 'mlp3-b8' runs on the host"), "{}", last());
        let short = TesseraDeviceTensor { size_bytes: input.size_bytes - 4, ..device(&input, 0x1000) };
        assert_eq!(tessera_model_run_device(m, &short, 1, null(), 0), TesseraStatus::ErrorInvalidArgument);
        assert!(last().contains(&format!("input 'input': size_bytes is {}, but f32[8, 784] holds {}", input.size_bytes - 4, input.size_bytes)), "{}", last());
        let null_ptr = device(&input, 0);
        assert_eq!(tessera_model_run_device(m, &null_ptr, 1, null(), 0), TesseraStatus::ErrorInvalidArgument);
        assert!(last().contains("the data of input 'input' is a null device pointer"), "{}", last());
        assert_eq!(tessera_model_run_device(m, null(), 1, null(), 0), TesseraStatus::ErrorInvalidArgument);
        assert!(last().contains("inputs is null"), "{}", last());
        assert_eq!(tessera_model_run_device(null(), &ok, 1, null(), 0), TesseraStatus::ErrorInvalidArgument);
        assert_eq!(tessera_model_run_device_async(m, &ok, 1, null(), 0, null_mut()), TesseraStatus::ErrorInvalidArgument);
        assert!(last().contains("stream is null"), "{}", last());
        tessera_model_free(m);
    }
}

#[test]
#[ignore = "needs a GPU: run with TESSERA_GPU=1 and --include-ignored on the GPU machine"]
fn device_pointers_match_host_memory_runs_on_the_gpu() {
    if std::env::var_os("TESSERA_GPU").is_none() {
        eprintln!("skipping: set TESSERA_GPU=1 on a machine with an NVIDIA GPU (device pointers need one)");
        return;
    }
    let ctx = tessera_kernels::runtime::cuda::device::context().expect("TESSERA_GPU=1 but no usable GPU");
    ctx.bind_to_thread().unwrap();
    let zoo = common::compile("out-cuda", &["cuda -compiler=nvrtc"]);
    for name in ["mlp3-b8", "bert-tiny-b1-s128"] {
        let path = zoo.join(format!("{name}.tsr"));
        let inputs = Artifact::open(&path).unwrap().random_inputs(13);
        let m = load(&path);
        // SAFETY (this block): a live model; every host buffer and device allocation has its tensor's size
        // and is used by nothing else while a run is in flight.
        unsafe {
            assert_eq!(tessera_model_is_gpu(m), 1);
            let ins: Vec<TesseraTensorInfo> = (0..tessera_model_input_count(m)).map(|i| info(m, i, true)).collect();
            let outs: Vec<TesseraTensorInfo> = (0..tessera_model_output_count(m)).map(|o| info(m, o, false)).collect();
            // From host memory.
            let host_in: Vec<TesseraTensor> = ins
                .iter()
                .zip(&inputs)
                .map(|(t, x)| TesseraTensor { name: t.name, dtype: t.dtype, rank: t.rank, shape: t.shape, data: x.bytes().as_ptr().cast(), size_bytes: t.size_bytes })
                .collect();
            let mut want: Vec<Vec<u8>> = outs.iter().map(|t| vec![0u8; t.size_bytes]).collect();
            let mut host_out: Vec<TesseraTensorMut> = outs
                .iter()
                .zip(want.iter_mut())
                .map(|(t, b)| TesseraTensorMut { name: t.name, dtype: t.dtype, rank: t.rank, shape: t.shape, data: b.as_mut_ptr().cast(), size_bytes: t.size_bytes })
                .collect();
            assert_eq!(tessera_model_run(m, host_in.as_ptr(), host_in.len(), host_out.as_mut_ptr(), host_out.len()), TesseraStatus::Ok, "{}", last());
            // From device memory.
            let dev_in: Vec<u64> = inputs.iter().map(|x| {
                let p = result::malloc_sync(x.bytes().len().max(1)).unwrap();
                result::memcpy_htod_sync(p, x.bytes()).unwrap();
                p
            }).collect();
            let dev_out: Vec<u64> = outs.iter().map(|t| result::malloc_sync(t.size_bytes.max(1)).unwrap()).collect();
            let d_in: Vec<TesseraDeviceTensor> = ins.iter().zip(&dev_in).map(|(t, &p)| device(t, p)).collect();
            let d_out: Vec<TesseraDeviceTensor> = outs.iter().zip(&dev_out).map(|(t, &p)| device(t, p)).collect();
            assert_eq!(tessera_model_run_device(m, d_in.as_ptr(), d_in.len(), d_out.as_ptr(), d_out.len()), TesseraStatus::Ok, "{}", last());
            for ((t, &p), w) in outs.iter().zip(&dev_out).zip(&want) {
                let mut got = vec![0u8; t.size_bytes];
                result::memcpy_dtoh_sync(&mut got, p).unwrap();
                assert!(&got == w, "{name}: output {:?} from device pointers differs from the host-memory run", CStr::from_ptr(t.name));
            }
            // On the caller's stream, asynchronously: inputs written, the run and the outputs read back are all
            // enqueued on one stream with no synchronization between them; only the end waits. The outputs are
            // cleared first, so equal bytes are this run's.
            let stream = result::stream::create(result::stream::StreamKind::NonBlocking).unwrap();
            for (&p, t) in dev_out.iter().zip(&outs) {
                result::memset_d8_sync(p, 0, t.size_bytes).unwrap();
            }
            for (x, &p) in inputs.iter().zip(&dev_in) {
                result::memcpy_htod_async(p, x.bytes(), stream).unwrap();
            }
            assert_eq!(tessera_model_run_device_async(m, d_in.as_ptr(), d_in.len(), d_out.as_ptr(), d_out.len(), stream.cast()), TesseraStatus::Ok, "{}", last());
            let mut got: Vec<Vec<u8>> = outs.iter().map(|t| vec![0u8; t.size_bytes]).collect();
            for (g, &p) in got.iter_mut().zip(&dev_out) {
                result::memcpy_dtoh_async(g, p, stream).unwrap();
            }
            result::stream::synchronize(stream).unwrap();
            result::stream::destroy(stream).unwrap();
            assert!(got == want, "{name}: the asynchronous run on the caller's stream differs from the host-memory run");
            for p in dev_in.into_iter().chain(dev_out) {
                result::free_sync(p).unwrap();
            }
            tessera_model_free(m);
        }
        println!("{name}: C device-pointer runs (synchronous, and asynchronous on the caller's stream) match the host-memory run");
    }
}
