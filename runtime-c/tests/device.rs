//! `tessera_model_run_device` and `tessera_model_load*_on_gpu` through the C ABI (called as C would, through
//! the exported functions). Everywhere: a host model, a size that disagrees with the shape, null pointers, a
//! negative GPU index, a host artifact given a GPU index are statuses with messages. On a GPU machine
//! (`TESSERA_GPU=1`, `--include-ignored`): a zoo model compiled for `cuda` runs from device buffers the caller
//! allocated, with outputs equal, bit for bit, to `tessera_model_run`'s from host memory; a GPU that does not
//! exist is an error naming it; and where there are two GPUs, the model loaded on GPU 1 gives GPU 0's outputs,
//! from device memory of GPU 1 too.

#[path = "../../runtime/tests/common/mod.rs"]
mod common;

use cudarc::driver::result;
use std::ffi::{c_char, CStr, CString};
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

/// `tessera_model_load_on_gpu(path, gpu)`: the status and the model (null on failure).
fn load_on_gpu(path: &std::path::Path, gpu: i32) -> (TesseraStatus, *mut TesseraModel) {
    let p = CString::new(path.to_str().unwrap()).unwrap();
    let mut m = null_mut();
    // SAFETY: a C string and a place for the pointer.
    let s = unsafe { tessera_model_load_on_gpu(p.as_ptr(), gpu, &mut m) };
    (s, m)
}

#[test]
fn gpu_indices_are_checked() {
    let path = common::c_zoo().join("mlp3-b8.tsr");
    let bytes = std::fs::read(&path).unwrap();
    // SAFETY (this test): C strings, byte buffers of their lengths, places for the model, live models.
    unsafe {
        let m = load(&path);
        assert_eq!(tessera_model_gpu(m), -1, "a host model is on no GPU");
        assert_eq!(tessera_model_gpu(null()), -1);
        tessera_model_free(m);
        // A negative index, whatever the artifact: an invalid argument naming it; nothing is stored.
        let (s, m) = load_on_gpu(&path, -1);
        assert_eq!((s, m), (TesseraStatus::ErrorInvalidArgument, null_mut()));
        assert!(last().contains("gpu is -1"), "{}", last());
        let mut m: *mut TesseraModel = null_mut();
        assert_eq!(tessera_model_load_bytes_on_gpu(bytes.as_ptr(), bytes.len(), -3, &mut m), TesseraStatus::ErrorInvalidArgument);
        assert!(last().contains("gpu is -3") && m.is_null(), "{}", last());
        // A host artifact given a GPU: a load error naming the model and the GPU (no GPU needed to tell).
        let (s, mut m) = load_on_gpu(&path, 1);
        assert_eq!((s, m), (TesseraStatus::ErrorLoad, null_mut()));
        assert!(last().contains("model 'mlp3-b8' runs on the host; it cannot be placed on GPU 1") && last().contains("mlp3-b8.tsr"), "{}", last());
        assert_eq!(tessera_model_load_bytes_on_gpu(bytes.as_ptr(), bytes.len(), 0, &mut m), TesseraStatus::ErrorLoad);
        assert!(last().contains("<memory>") && last().contains("cannot be placed on GPU 0"), "{}", last());
        // The other arguments are checked as tessera_model_load checks them.
        assert_eq!(tessera_model_load_on_gpu(null::<c_char>(), 0, &mut m), TesseraStatus::ErrorInvalidArgument);
        assert!(last().contains("path is null"), "{}", last());
        let p = CString::new(path.to_str().unwrap()).unwrap();
        assert_eq!(tessera_model_load_on_gpu(p.as_ptr(), 0, null_mut()), TesseraStatus::ErrorInvalidArgument);
        assert!(last().contains("out (where the model goes) is null"), "{}", last());
    }
}

#[test]
#[ignore = "needs a GPU: run with TESSERA_GPU=1 and --include-ignored on the GPU machine (two GPUs for all of it)"]
fn models_run_on_the_gpu_they_are_loaded_on() {
    if std::env::var_os("TESSERA_GPU").is_none() {
        eprintln!("skipping: set TESSERA_GPU=1 on a machine with an NVIDIA GPU");
        return;
    }
    let n = tessera_kernels::runtime::cuda::device::count().expect("TESSERA_GPU=1 but no usable GPU");
    let zoo = common::compile("out-cuda", &["cuda -compiler=nvrtc"]);
    let path = zoo.join("mlp3-b8.tsr");
    let (s, m) = load_on_gpu(&path, 99);
    assert_eq!((s, m), (TesseraStatus::ErrorLoad, null_mut()), "{}", last());
    assert!(last().contains("GPU 99") && last().contains(&format!("the CUDA driver sees {n}")), "{}", last());
    let m0 = load(&path);
    // SAFETY (this block): live models; every host buffer and device allocation has its tensor's size and is
    // used by nothing else while a run is in flight.
    unsafe {
        assert_eq!(tessera_model_gpu(m0), 0);
        if n < 2 {
            println!("skipping the second GPU: the CUDA driver sees {n} GPU");
            tessera_model_free(m0);
            return;
        }
        let (s, m1) = load_on_gpu(&path, 1);
        assert_eq!(s, TesseraStatus::Ok, "{}", last());
        assert_eq!((tessera_model_gpu(m1), tessera_model_is_gpu(m1)), (1, 1));
        let input = info(m1, 0, true);
        let output = info(m1, 0, false);
        let x: Vec<f32> = (0..input.size_bytes / 4).map(|i| ((i % 83) as f32) / 83.0 - 0.5).collect();
        let host_in = TesseraTensor { name: input.name, dtype: input.dtype, rank: input.rank, shape: input.shape, data: x.as_ptr().cast(), size_bytes: input.size_bytes };
        let run = |m: *const TesseraModel| {
            let mut y = vec![0u8; output.size_bytes];
            let mut host_out = TesseraTensorMut { name: output.name, dtype: output.dtype, rank: output.rank, shape: output.shape, data: y.as_mut_ptr().cast(), size_bytes: output.size_bytes };
            assert_eq!(tessera_model_run(m, &host_in, 1, &mut host_out, 1), TesseraStatus::Ok, "{}", last());
            y
        };
        let want = run(m0);
        assert!(run(m1) == want, "GPU 1's output differs from GPU 0's");
        // From device memory of GPU 1 (its primary context, as `cudaSetDevice(1)` then `cudaMalloc` gives).
        tessera_kernels::runtime::cuda::device::context_of(1).unwrap().bind_to_thread().unwrap();
        let d_x = result::malloc_sync(input.size_bytes).unwrap();
        let d_y = result::malloc_sync(output.size_bytes).unwrap();
        result::memcpy_htod_sync(d_x, std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), input.size_bytes)).unwrap();
        assert_eq!(tessera_model_run_device(m1, &device(&input, d_x), 1, &device(&output, d_y), 1), TesseraStatus::Ok, "{}", last());
        let mut got = vec![0u8; output.size_bytes];
        result::memcpy_dtoh_sync(&mut got, d_y).unwrap();
        assert!(got == want, "GPU 1's output from its device memory differs from GPU 0's");
        result::free_sync(d_x).unwrap();
        result::free_sync(d_y).unwrap();
        tessera_model_free(m0);
        tessera_model_free(m1);
    }
    println!("mlp3-b8: the C ABI runs the model on GPU 1 as on GPU 0, from GPU 1's device memory too");
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
