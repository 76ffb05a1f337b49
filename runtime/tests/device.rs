//! Runs from device memory the caller owns (`Model::run_device`), and GPU placement (`Model::load_on_gpu`).
//! Everywhere: a host model refuses device pointers with an error naming the model, is on no GPU, and refuses
//! a GPU index. On a GPU machine (`TESSERA_GPU=1`, `--include-ignored`): zoo models compiled for `cuda` run
//! from the caller's device buffers with outputs equal, bit for bit, to host runs of the same loaded model,
//! outputs not asked for are left alone, and wrong pointers, buffers too small and wrong shapes are errors
//! naming the tensor; a GPU that does not exist is an error naming it; and where there are two GPUs, one
//! artifact loaded on each gives the same outputs, from device memory of GPU 1 too.

mod common;

use cudarc::driver::{result, sys};
use std::sync::Arc;
use tessera_kernels::artifact::Artifact;
use tessera_kernels::runtime::cuda::device;
use tessera_runtime::{DeviceTensor, ErrorKind, Model, Tensor, TensorView};

#[test]
fn host_models_refuse_device_pointers() {
    let m = Model::load(common::c_zoo().join("mlp3-b8.tsr")).unwrap();
    assert!(!m.is_gpu());
    let shape = [8usize, 784];
    // SAFETY: a host model never touches the pointer (the call fails before any copy).
    let e = unsafe { m.run_device(&[("input", DeviceTensor::new(tessera_runtime::DType::F32, &shape, 0x1000))], &[]) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Input);
    assert!(e.message().contains("model 'mlp3-b8' runs on the host"), "{e}");
}

#[test]
fn host_models_are_on_no_gpu_and_refuse_a_gpu_index() {
    let path = common::c_zoo().join("mlp3-b8.tsr");
    let m = Model::load(&path).unwrap();
    assert_eq!((m.is_gpu(), m.gpu()), (false, None));
    assert_eq!(Model::from_bytes(&std::fs::read(&path).unwrap()).unwrap().gpu(), None);
    // A GPU index asks for a GPU artifact: a host one is refused, naming the file, the model and the GPU (no GPU
    // is needed to tell: where modules run is recorded in the artifact).
    for gpu in [0, 1] {
        let e = Model::load_on_gpu(&path, gpu).err().expect("a host artifact on a GPU");
        assert_eq!(e.kind(), ErrorKind::Load, "{e}");
        assert!(e.message().contains(&path.display().to_string()), "{e}");
        assert!(e.message().contains(&format!("model 'mlp3-b8' runs on the host; it cannot be placed on GPU {gpu}")), "{e}");
    }
    let e = Model::from_bytes_on_gpu(&std::fs::read(&path).unwrap(), 1).err().expect("a host artifact on a GPU");
    assert_eq!(e.kind(), ErrorKind::Load, "{e}");
    assert!(e.message().contains("<memory>") && e.message().contains("runs on the host; it cannot be placed on GPU 1"), "{e}");
}

/// Device memory of `bytes` bytes (at least one, so every tensor has a real address), freed on drop.
struct Buffer {
    ptr: u64,
    bytes: usize,
}

impl Buffer {
    fn new(bytes: usize) -> Buffer {
        // SAFETY: a plain allocation in the bound context, freed once by drop.
        Buffer { ptr: unsafe { result::malloc_sync(bytes.max(1)) }.unwrap(), bytes }
    }

    fn with(data: &[u8]) -> Buffer {
        let b = Buffer::new(data.len());
        // SAFETY: the allocation holds `data.len()` bytes.
        unsafe { result::memcpy_htod_sync(b.ptr, data) }.unwrap();
        b
    }

    fn read(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.bytes];
        // SAFETY: the allocation holds `bytes` bytes.
        unsafe { result::memcpy_dtoh_sync(&mut v, self.ptr) }.unwrap();
        v
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: allocated by `malloc_sync`, freed once; no work on it is in flight (runs synchronize).
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

#[test]
#[ignore = "needs a GPU: run with TESSERA_GPU=1 and --include-ignored on the GPU machine"]
fn device_pointers_match_host_runs_on_the_gpu() {
    if std::env::var_os("TESSERA_GPU").is_none() {
        eprintln!("skipping: set TESSERA_GPU=1 on a machine with an NVIDIA GPU (device pointers need one)");
        return;
    }
    let ctx: Arc<cudarc::driver::CudaContext> = tessera_kernels::runtime::cuda::device::context().expect("TESSERA_GPU=1 but no usable GPU");
    ctx.bind_to_thread().unwrap();
    let zoo = common::compile("out-cuda", &["cuda -compiler=nvrtc"]);
    for name in ["mlp3-b8", "bert-tiny-b1-s128"] {
        let path = zoo.join(format!("{name}.tsr"));
        let m = Model::load(&path).unwrap();
        assert!(m.is_gpu(), "{name} is compiled for cuda");
        let inputs: Vec<Tensor> = Artifact::open(&path).unwrap().random_inputs(11);
        let views: Vec<(&str, TensorView)> = m.inputs().iter().zip(&inputs).map(|(d, t)| (d.name.as_str(), TensorView::from(t))).collect();
        let want = m.run(&views).unwrap();

        let dev_in: Vec<Buffer> = inputs.iter().map(|t| Buffer::with(t.bytes())).collect();
        let dev_out: Vec<Buffer> = m.outputs().iter().map(|d| Buffer::with(&vec![0xAB; d.size_bytes()])).collect();
        let ins: Vec<(&str, DeviceTensor)> = m.inputs().iter().zip(&dev_in).map(|(d, b)| (d.name.as_str(), DeviceTensor::new(d.dtype, &d.shape, b.ptr))).collect();
        let outs: Vec<(&str, DeviceTensor)> = m.outputs().iter().zip(&dev_out).map(|(d, b)| (d.name.as_str(), DeviceTensor::new(d.dtype, &d.shape, b.ptr))).collect();
        // SAFETY: every buffer is ours, of its tensor's size, and used by nothing else during the call.
        unsafe { m.run_device(&ins, &outs) }.unwrap();
        // The same graph on the same inputs as the host run: the same bits.
        for ((d, b), w) in m.outputs().iter().zip(&dev_out).zip(&want) {
            assert!(b.read() == w.bytes(), "{name}: output '{}' from device pointers differs from the host run", d.name);
        }

        // Only the last output asked for: the others' buffers keep what they held.
        let fresh: Vec<Buffer> = m.outputs().iter().map(|d| Buffer::with(&vec![0xCD; d.size_bytes()])).collect();
        let last = m.outputs().len() - 1;
        let d = &m.outputs()[last];
        // SAFETY: as above.
        unsafe { m.run_device(&ins, &[(d.name.as_str(), DeviceTensor::new(d.dtype, &d.shape, fresh[last].ptr))]) }.unwrap();
        assert!(fresh[last].read() == want[last].bytes(), "{name}: output '{}' alone differs", d.name);
        for (o, b) in fresh.iter().enumerate().take(last) {
            assert!(b.read().iter().all(|&x| x == 0xCD), "{name}: output {o} was written though not asked for");
        }

        // Errors name the tensor at fault, and the model still runs afterwards.
        let first = &m.inputs()[0];
        let mut bad = ins.clone();
        // A host address is not device memory of the context.
        let host_bytes = vec![0u8; first.size_bytes()];
        bad[0].1 = DeviceTensor::new(first.dtype, &first.shape, host_bytes.as_ptr() as u64);
        // SAFETY: the engine checks the pointer with the driver before any copy, and refuses it.
        let e = unsafe { m.run_device(&bad, &outs) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Run, "{e}");
        assert!(e.message().contains(&format!("input '{}'", first.name)) && e.message().contains("is not device memory"), "{e}");
        // An allocation one byte short.
        let short = Buffer::new(first.size_bytes() - 1);
        bad[0].1 = DeviceTensor::new(first.dtype, &first.shape, short.ptr);
        // SAFETY: as above: refused before any copy.
        let e = unsafe { m.run_device(&bad, &outs) }.unwrap_err();
        assert!(e.message().contains(&format!("input '{}': needs {} bytes", first.name, first.size_bytes())), "{e}");
        // A wrong shape.
        let wrong = [1usize];
        bad[0].1 = DeviceTensor::new(first.dtype, &wrong, dev_in[0].ptr);
        // SAFETY: as above: refused before any copy.
        let e = unsafe { m.run_device(&bad, &outs) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Input, "{e}");
        assert!(e.message().contains(&format!("input '{}' must be", first.name)), "{e}");
        // SAFETY: as the first run.
        unsafe { m.run_device(&ins, &outs) }.unwrap();
        for ((d, b), w) in m.outputs().iter().zip(&dev_out).zip(&want) {
            assert!(b.read() == w.bytes(), "{name}: output '{}' after the errors differs", d.name);
        }
        println!("{name}: device-pointer runs match host runs");
    }
}

#[test]
#[ignore = "needs a GPU: run with TESSERA_GPU=1 and --include-ignored on the GPU machine"]
fn batched_gpu_plans_share_one_upload_of_the_weights() {
    if std::env::var_os("TESSERA_GPU").is_none() {
        eprintln!("skipping: set TESSERA_GPU=1 on a machine with an NVIDIA GPU");
        return;
    }
    let zoo = common::compile("out-cuda", &["cuda -compiler=nvrtc"]);
    let m = Model::load(zoo.join(format!("{}.tsr", common::BATCHED))).unwrap();
    assert!(m.is_gpu() && m.batch_sizes() == [1, 8]);
    // Both plans' engines read the weights from one device allocation.
    assert!(m.plans_share_weights(), "the plans of a batched GPU model upload the weights once");
    // Every plan still computes what the model of one plan does, at its size and padded onto it.
    for (batch, single) in [(1usize, "mlp3-b1"), (8, "mlp3-b8"), (3, "mlp3-b8")] {
        let one = Model::load(zoo.join(format!("{single}.tsr"))).unwrap();
        let x: Vec<f32> = (0..batch * 784).map(|i| ((i % 89) as f32) / 89.0 - 0.5).collect();
        let got = m.run(&[("input", TensorView::from_slice(&[batch, 784], &x))]).unwrap();
        let rows = one.inputs()[0].shape[0];
        let mut padded = x.clone();
        padded.resize(rows * 784, 0.0);
        let want = one.run(&[("input", TensorView::from_slice(&[rows, 784], &padded))]).unwrap();
        let want = Tensor::from_f32([batch, 10], &want[0].to_f32_vec()[..batch * 10]);
        common::close(&format!("batch {batch}"), &got[0], &want);
    }
}

/// The GPU whose memory `ptr` is, as the driver records it.
fn ordinal_of(ptr: u64) -> i32 {
    let mut ordinal = -1i32;
    // SAFETY: an out-parameter of the attribute's type (int); the driver is loaded (the pointer is its).
    unsafe { sys::cuPointerGetAttribute((&mut ordinal as *mut i32).cast(), sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) }.result().unwrap();
    ordinal
}

#[test]
#[ignore = "needs a GPU: run with TESSERA_GPU=1 and --include-ignored on the GPU machine (two GPUs for all of it)"]
fn models_run_on_the_gpu_they_are_loaded_on() {
    if std::env::var_os("TESSERA_GPU").is_none() {
        eprintln!("skipping: set TESSERA_GPU=1 on a machine with an NVIDIA GPU");
        return;
    }
    let n = device::count().expect("TESSERA_GPU=1 but no usable GPU");
    let zoo = common::compile("out-cuda", &["cuda -compiler=nvrtc"]);
    let path = zoo.join("bert-tiny-b1-s128.tsr");
    // A GPU the driver does not see: an error naming it and how many there are, before anything loads.
    let e = Model::load_on_gpu(&path, 99).err().expect("there is no GPU 99");
    assert_eq!(e.kind(), ErrorKind::Load, "{e}");
    assert!(e.message().contains("GPU 99") && e.message().contains(&format!("the CUDA driver sees {n}")), "{e}");
    let e = tessera_runtime::synchronize_gpu_of(99).unwrap_err();
    assert!(e.message().contains("no GPU 99"), "{e}");
    // The caller's current CUDA context is its own again after a load and a run: none here.
    let bound_gpu = || {
        let mut d: cudarc::driver::sys::CUdevice = -1;
        // SAFETY: an out-parameter; the driver is loaded. With no context current, the call fails and `d` stays -1.
        let _ = unsafe { cudarc::driver::sys::cuCtxGetDevice(&mut d) };
        d
    };
    // SAFETY: unbinds whatever this thread had current (nothing of ours is in flight).
    unsafe { cudarc::driver::sys::cuCtxSetCurrent(std::ptr::null_mut()) };
    // `load` is GPU 0, and so is `load_on_gpu(.., 0)`.
    let m0 = Model::load(&path).unwrap();
    assert_eq!(bound_gpu(), -1, "loading left a context current on a thread that had none");
    assert_eq!((m0.is_gpu(), m0.gpu()), (true, Some(0)));
    assert_eq!(Model::load_on_gpu(&path, 0).unwrap().gpu(), Some(0));
    let inputs: Vec<Tensor> = Artifact::open(&path).unwrap().random_inputs(17);
    let views: Vec<(&str, TensorView)> = m0.inputs().iter().zip(&inputs).map(|(d, t)| (d.name.as_str(), TensorView::from(t))).collect();
    let want = m0.run(&views).unwrap();
    assert_eq!(bound_gpu(), -1, "a run, or freeing a model, left a context current on a thread that had none");
    if n < 2 {
        println!("skipping the second GPU: the CUDA driver sees {n} GPU");
        return;
    }
    // The caller's current CUDA context (GPU 0's here) is its own again after a load and a run on GPU 1.
    device::context_of(0).unwrap().bind_to_thread().unwrap();
    let m1 = Model::load_on_gpu(&path, 1).unwrap();
    assert_eq!((m1.is_gpu(), m1.gpu()), (true, Some(1)));
    assert_eq!(bound_gpu(), 0, "loading on GPU 1 left GPU 1's context current");
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(Model::from_bytes_on_gpu(&bytes, 1).unwrap().gpu(), Some(1));
    m1.run(&views).unwrap();
    assert_eq!(bound_gpu(), 0, "running on GPU 1 left GPU 1's context current");
    // The same code on the same inputs on two GPUs of one host: the same bits, from this thread and another
    // (the model keeps its GPU whichever thread runs it).
    for (what, got) in [("GPU 1", m1.run(&views).unwrap()), ("GPU 1 from another thread", std::thread::scope(|s| s.spawn(|| m1.run(&views).unwrap()).join().unwrap()))] {
        for ((d, g), w) in m1.outputs().iter().zip(&got).zip(&want) {
            assert!(g.bytes() == w.bytes(), "output '{}' on {what} differs from GPU 0's", d.name);
        }
    }
    // From device memory of GPU 1 (the caller's, allocated in GPU 1's primary context), outputs into it.
    let ctx1 = device::context_of(1).unwrap();
    ctx1.bind_to_thread().unwrap();
    let dev_in: Vec<Buffer> = inputs.iter().map(|t| Buffer::with(t.bytes())).collect();
    let dev_out: Vec<Buffer> = m1.outputs().iter().map(|d| Buffer::with(&vec![0xAB; d.size_bytes()])).collect();
    assert!(dev_in.iter().chain(&dev_out).all(|b| ordinal_of(b.ptr) == 1), "the buffers are GPU 1's");
    let ins: Vec<(&str, DeviceTensor)> = m1.inputs().iter().zip(&dev_in).map(|(d, b)| (d.name.as_str(), DeviceTensor::new(d.dtype, &d.shape, b.ptr))).collect();
    let outs: Vec<(&str, DeviceTensor)> = m1.outputs().iter().zip(&dev_out).map(|(d, b)| (d.name.as_str(), DeviceTensor::new(d.dtype, &d.shape, b.ptr))).collect();
    tessera_runtime::synchronize_gpu_of(1).unwrap();
    // SAFETY: every buffer is ours, on the model's GPU, of its tensor's size, and used by nothing else during the call.
    unsafe { m1.run_device(&ins, &outs) }.unwrap();
    ctx1.bind_to_thread().unwrap();
    for ((d, b), w) in m1.outputs().iter().zip(&dev_out).zip(&want) {
        assert!(b.read() == w.bytes(), "output '{}' from GPU 1's device memory differs from GPU 0's host-memory run", d.name);
    }
    println!("bert-tiny-b1-s128: GPU 0 and GPU 1 give the same outputs, from host memory and from GPU 1's device memory");
}
