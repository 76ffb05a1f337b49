//! The `cudnn` module format and its loader: each function is a list of cuDNN fused convolutions over the
//! function's device arguments (the `cudnn` backend's modules).
//!
//! A convolution is 2-D, NCHW or NHWC (channels-last: cuDNN's tensor-core kernels' own layout, which they
//! read without transforming the operands), and fused as cuDNN's `cudnnConvolutionBiasActivationForward` computes it:
//! `y = relu?(conv(x, w) + z + bias)`, a per-channel bias always present (the `cudnn` backend takes convolutions
//! with a bias: batch norm folded into a convolution gives one), the residual `z` optional. fp32 runs on FMA
//! kernels only (`CUDNN_FMA_MATH`: no TF32, so results stay within fp32's tolerance); fp16 stores f16, computes
//! in fp32 and may use tensor cores.
//!
//! The module holds no algorithm, only each convolution's `rank`: the loader asks cuDNN's heuristic
//! (`cudnnGetConvolutionForwardAlgorithm_v7`) once, at load, and takes the algorithm of that rank among those
//! whose workspace fits the convolution's declared workspace ([`workspace_bytes`]; 0: the first). Without ReLU, cuDNN allows only the implicit
//! precomputed GEMM, which then is the algorithm (rank 0 only). The tune stage measures several ranks and the
//! artifact records the fastest. The engine captures the calls into its CUDA graph like kernels.

use super::device;
use super::CudaError;
use super::library::{self, Args, CallDesc, LibraryModule, Operand};
use super::module::{GpuModule, LibraryCall, PreparedLaunch};
use crate::module::Module;
use crate::runtime::{LoadedModule, RuntimeError};
use crate::DType;
use cudarc::cudnn::sys as dnn;
use cudarc::driver::sys;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// The least workspace a convolution declares.
pub const MIN_WORKSPACE_BYTES: u64 = 16 << 20;

/// The most workspace a convolution may declare (a hostile module must not size an allocation freely; the
/// scratch holding it is bounded by the artifact's validator too).
pub const MAX_WORKSPACE_BYTES: u64 = 16 << 30;

/// The workspace a convolution of these shapes declares: its operands' bytes (x, w, y and the residual z)
/// with a quarter more, in whole MiB, at least [`MIN_WORKSPACE_BYTES`].
///
/// Why it grows with the tensors: cuDNN's fast fp16 algorithms for NCHW tensors transform the operands to
/// NHWC in the workspace. With a fixed 16 MiB, every convolution of ResNet-50 at batch 32 whose x + w + y
/// exceeded it fell back to a slow algorithm (H100, 2026-11-25: a 1x1 128->512 at 28x28 took 171 us where a
/// 1x1 256->1024 at 14x14, same FLOPs, 16.5 MB of operands, took 48 us; every 56x56 convolution stayed on our
/// own slower kernels), while all that fitted ran fast.
pub fn workspace_bytes(dtype: DType, input: [u32; 4], weight: [u32; 4], output: [u32; 4], residual: bool) -> u64 {
    let prod = |d: [u32; 4]| d.iter().map(|&x| x as u64).product::<u64>();
    let elems = prod(input) + prod(weight) + prod(output) * if residual { 2 } else { 1 };
    let bytes = elems.saturating_mul(dtype.size() as u64).saturating_mul(5) / 4;
    bytes.div_ceil(1 << 20).saturating_mul(1 << 20).clamp(MIN_WORKSPACE_BYTES, MAX_WORKSPACE_BYTES)
}

/// One fused convolution (shapes in cuDNN's logical order, `[n, c, h, w]` and `[k, c, r, s]`, whatever the
/// layout in memory).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conv {
    /// Element type of x, w, y, z and the bias (f32 or f16); arithmetic is f32.
    pub dtype: DType,
    /// Input `[n, c, h, w]`, weight `[k, c / groups, r, s]`, output `[n, k, p, q]`.
    pub input: [u32; 4],
    pub weight: [u32; 4],
    pub output: [u32; 4],
    pub pads: [u32; 2],
    pub strides: [u32; 2],
    pub dilations: [u32; 2],
    pub groups: u32,
    pub x: Operand,
    pub w: Operand,
    pub y: Operand,
    /// `k` elements, one per output channel.
    pub bias: Operand,
    /// Added before the activation, with y's shape.
    pub residual: Option<Operand>,
    pub relu: bool,
    /// The scratch argument and an offset; `workspace_bytes` long.
    pub workspace: Operand,
    /// The workspace's length ([`workspace_bytes`] of the shapes when lowered; between
    /// [`MIN_WORKSPACE_BYTES`] and [`MAX_WORKSPACE_BYTES`]). The loader takes only algorithms that fit it.
    pub workspace_bytes: u64,
    /// Which of the heuristic's fitting algorithms to run, in its order (0: its first choice; below
    /// [`MAX_RANK`]; 0 without ReLU).
    pub rank: u8,
    /// x, y and z are `[n, h, w, c]` in memory and w `[k, r, s, c]` (cuDNN's NHWC format); else NCHW and KCRS.
    pub channels_last: bool,
}

/// Ranks a convolution may ask for (the heuristic is asked for this many answers).
pub const MAX_RANK: u8 = 8;

/// The bytes of a module of format [`FORMAT`]: per function, its convolutions.
pub type DnnModule = LibraryModule<Conv>;

impl CallDesc for Conv {
    const WHAT: &'static str = "convolution";

    fn describe(&self) -> String {
        let [n, c, h, w] = self.input;
        let [k, _, r, s] = self.weight;
        let mut d = format!("cudnn conv {n}x{c}x{h}x{w} k{k} {r}x{s}/{}", self.strides[0]);
        if self.groups > 1 {
            d.push_str(&format!(" g{}", self.groups));
        }
        d.push_str(&format!(" {}{} +bias", self.dtype.name(), if self.channels_last { " nhwc" } else { "" }));
        if self.residual.is_some() {
            d.push_str(" +residual");
        }
        if self.relu {
            d.push_str(" relu");
        }
        d
    }

    fn check(&self, args: &Args) -> Result<(), CudaError> {
        let c = self;
        if c.rank >= MAX_RANK || (c.rank > 0 && !c.relu) {
            return Err(CudaError::InvalidModule(format!("algorithm rank {} (below {MAX_RANK}, and 0 without ReLU)", c.rank)));
        }
        if !matches!(c.dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(CudaError::InvalidModule(format!("element type {:?} (f32, f16 or bf16 only)", c.dtype)));
        }
        let ([n, ch, h, w], [k, cg, r, s], [on, ok_, p, q]) = (c.input, c.weight, c.output);
        let g = c.groups;
        if [n, ch, h, w, k, cg, r, s, p, q, g].contains(&0) || c.strides.contains(&0) || c.dilations.contains(&0) {
            return Err(CudaError::InvalidModule("a zero dimension, stride, dilation or group count".into()));
        }
        if on != n || ok_ != k || ch != cg * g || k % g != 0 {
            return Err(CudaError::InvalidModule(format!("inconsistent shapes: input {:?}, weight {:?}, output {:?}, groups {g}", c.input, c.weight, c.output)));
        }
        // The output size convolution arithmetic gives (floor), so no access leaves the padded input.
        let out = |size: u32, pad: u32, kernel: u32, stride: u32, dil: u32| -> Option<u32> {
            let span = (kernel as u64 - 1) * dil as u64 + 1;
            (size as u64 + 2 * pad as u64).checked_sub(span).map(|d| (d / stride as u64 + 1) as u32)
        };
        if out(h, c.pads[0], r, c.strides[0], c.dilations[0]) != Some(p) || out(w, c.pads[1], s, c.strides[1], c.dilations[1]) != Some(q) {
            return Err(CudaError::InvalidModule(format!("output {p}x{q} does not follow from input {h}x{w}, kernel {r}x{s}, pads {:?}, strides {:?}, dilations {:?}", c.pads, c.strides, c.dilations)));
        }
        let size = c.dtype.size() as u64;
        let prod = |d: [u32; 4]| d.iter().map(|&x| x as u64).product::<u64>();
        let mut operands = vec![("x", c.x, prod(c.input)), ("w", c.w, prod(c.weight)), ("y", c.y, prod(c.output)), ("bias", c.bias, k as u64)];
        if let Some(z) = c.residual {
            operands.push(("z", z, prod(c.output)));
        }
        for (name, o, elems) in operands {
            args.operand(name, &o, elems.checked_mul(size))?;
        }
        args.written("y", &c.y)?;
        if !(MIN_WORKSPACE_BYTES..=MAX_WORKSPACE_BYTES).contains(&c.workspace_bytes) {
            return Err(CudaError::InvalidModule(format!("a workspace of {} bytes (between {MIN_WORKSPACE_BYTES} and {MAX_WORKSPACE_BYTES})", c.workspace_bytes)));
        }
        args.workspace(&c.workspace, c.workspace_bytes)
    }
}

/// Whether cuDNN can be loaded here; why not, if not (cudarc panics on a missing library, so ask first).
pub fn available() -> Result<(), CudaError> {
    device::count()?;
    // SAFETY: only tries to open the library by its names.
    if unsafe { dnn::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError::Unavailable("cuDNN (libcudnn.so.9) not found on this machine".into()))
    }
}

/// The cuDNN version (`major * 10000 + minor * 100 + patch`, e.g. 91300), once loaded.
pub fn version() -> Result<usize, CudaError> {
    available()?;
    // SAFETY: the library is present (checked above); no arguments.
    Ok(unsafe { dnn::cudnnGetVersion() })
}

struct Handle(dnn::cudnnHandle_t);

// SAFETY: the handle is used under the module's mutex (cuDNN handles are not to be used from two threads at
// once) and outlives every prepared call.
unsafe impl Send for Handle {}
unsafe impl Sync for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by cudnnCreate, destroyed once.
        unsafe {
            let _ = dnn::cudnnDestroy(self.0);
        }
    }
}

/// A loaded cudnn module: its convolutions and the cuDNN handle they run through.
pub struct LoadedDnn {
    backend: String,
    handle: Arc<Mutex<Handle>>,
    functions: Vec<Vec<Conv>>,
    arg_counts: Vec<usize>,
    /// Each convolution's algorithm (by function and position) once the heuristic picked it and its
    /// workspace was checked: the same for any buffers, and asking again for every set of buffers (the tune
    /// stage prepares a function for dozens) cost more than running the convolutions.
    algos: Mutex<BTreeMap<(usize, usize), dnn::cudnnConvolutionFwdAlgo_t>>,
}

fn ok(s: dnn::cudnnStatus_t, what: &str) -> Result<(), CudaError> {
    if s == dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Library { call: what.to_string(), status: format!("{s:?}") })
    }
}

impl LoadedDnn {
    pub fn load(m: &Module) -> Result<LoadedDnn, RuntimeError> {
        let d = DnnModule::decode(m).map_err(RuntimeError::from)?;
        available().map_err(|e| RuntimeError(format!("module of backend {} needs a GPU with cuDNN: {e}", m.backend)))?;
        let ctx = device::context().map_err(RuntimeError::from)?;
        ctx.bind_to_thread().map_err(|e| RuntimeError(device::error(e)))?;
        let mut h = std::ptr::null_mut();
        // SAFETY: plain out-parameter; the library is present (checked above).
        ok(unsafe { dnn::cudnnCreate(&mut h) }, "cudnnCreate").map_err(|e| RuntimeError(format!("module of backend {}: {e}", m.backend)))?;
        Ok(LoadedDnn {
            backend: m.backend.clone(),
            handle: Arc::new(Mutex::new(Handle(h))),
            functions: d.functions,
            arg_counts: library::arg_counts(m),
            algos: Mutex::new(BTreeMap::new()),
        })
    }
}

impl LoadedModule for LoadedDnn {
    unsafe fn call(&self, _index: usize, _args: &[*mut u8]) -> Result<(), RuntimeError> {
        Err(RuntimeError(format!("module of backend {}: cuDNN convolutions run on the GPU only, inside a GPU executable", self.backend)))
    }

    fn gpu(&self) -> Option<&dyn GpuModule> {
        Some(self)
    }
}

impl GpuModule for LoadedDnn {
    fn launches(&self, index: usize, args: &[u64]) -> Result<Vec<PreparedLaunch>, RuntimeError> {
        library::prepare_function(&self.backend, &self.functions, &self.arg_counts, index, args, |i, c| {
            let algos = || self.algos.lock().map_err(|_| CudaError::Poisoned("the algorithm cache's lock is poisoned".to_string()));
            let known = algos()?.get(&(index, i)).copied();
            let p = PreparedConv::new(&self.handle, c, args, known)?;
            algos()?.insert((index, i), p.algo);
            Ok(Arc::new(p) as Arc<dyn LibraryCall>)
        })
    }
}

/// A convolution with its descriptors, pointers and algorithm fixed: one cuDNN call.
struct PreparedConv {
    handle: Arc<Mutex<Handle>>,
    x_desc: dnn::cudnnTensorDescriptor_t,
    y_desc: dnn::cudnnTensorDescriptor_t,
    bias_desc: dnn::cudnnTensorDescriptor_t,
    w_desc: dnn::cudnnFilterDescriptor_t,
    conv_desc: dnn::cudnnConvolutionDescriptor_t,
    act_desc: dnn::cudnnActivationDescriptor_t,
    algo: dnn::cudnnConvolutionFwdAlgo_t,
    /// x, w, z, bias, y, workspace.
    ptrs: [u64; 6],
    alpha2: f32,
    workspace_bytes: u64,
}

// SAFETY: the descriptors are plain host objects owned by this value, only read by the cuDNN call, which runs
// under the handle's mutex.
unsafe impl Send for PreparedConv {}
unsafe impl Sync for PreparedConv {}

impl PreparedConv {
    /// The convolution `c` on the buffers `args`, with algorithm `known` when an earlier preparation of it
    /// picked and checked one (else the heuristic's pick, its workspace checked).
    fn new(handle: &Arc<Mutex<Handle>>, c: &Conv, args: &[u64], known: Option<dnn::cudnnConvolutionFwdAlgo_t>) -> Result<PreparedConv, CudaError> {
        let at = |o: &Operand| args[o.arg as usize] + o.offset;
        // Storage type of x, w, z, y and the bias; the convolution computes in fp32 (its descriptor's type) for
        // each (cuDNN's PSEUDO_HALF and PSEUDO_BFLOAT16 configurations).
        let ty = match c.dtype {
            DType::F16 => dnn::cudnnDataType_t::CUDNN_DATA_HALF,
            DType::BF16 => dnn::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
            _ => dnn::cudnnDataType_t::CUDNN_DATA_FLOAT,
        };
        let nchw = dnn::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
        let format = if c.channels_last { dnn::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC } else { nchw };
        let i = |x: u32| x as i32;
        // SAFETY: descriptor calls on objects created here, with plain values and out-parameters.
        unsafe {
            let mut this = PreparedConv {
                handle: handle.clone(),
                x_desc: std::ptr::null_mut(),
                y_desc: std::ptr::null_mut(),
                bias_desc: std::ptr::null_mut(),
                w_desc: std::ptr::null_mut(),
                conv_desc: std::ptr::null_mut(),
                act_desc: std::ptr::null_mut(),
                algo: dnn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                ptrs: [at(&c.x), at(&c.w), 0, at(&c.bias), at(&c.y), at(&c.workspace)],
                alpha2: 0.0,
                workspace_bytes: c.workspace_bytes,
            };
            // The bias, `[1, k, 1, 1]`, is the same bytes in either layout.
            for (d, dims, f) in [(&mut this.x_desc, c.input, format), (&mut this.y_desc, c.output, format), (&mut this.bias_desc, [1, c.weight[0], 1, 1], nchw)] {
                ok(dnn::cudnnCreateTensorDescriptor(d), "cudnnCreateTensorDescriptor")?;
                ok(dnn::cudnnSetTensor4dDescriptor(*d, f, ty, i(dims[0]), i(dims[1]), i(dims[2]), i(dims[3])), "cudnnSetTensor4dDescriptor")?;
            }
            ok(dnn::cudnnCreateFilterDescriptor(&mut this.w_desc), "cudnnCreateFilterDescriptor")?;
            let [k, cg, r, s] = c.weight;
            ok(dnn::cudnnSetFilter4dDescriptor(this.w_desc, ty, format, i(k), i(cg), i(r), i(s)), "cudnnSetFilter4dDescriptor")?;
            ok(dnn::cudnnCreateConvolutionDescriptor(&mut this.conv_desc), "cudnnCreateConvolutionDescriptor")?;
            ok(
                dnn::cudnnSetConvolution2dDescriptor(
                    this.conv_desc,
                    i(c.pads[0]),
                    i(c.pads[1]),
                    i(c.strides[0]),
                    i(c.strides[1]),
                    i(c.dilations[0]),
                    i(c.dilations[1]),
                    dnn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                    dnn::cudnnDataType_t::CUDNN_DATA_FLOAT,
                ),
                "cudnnSetConvolution2dDescriptor",
            )?;
            ok(dnn::cudnnSetConvolutionGroupCount(this.conv_desc, i(c.groups)), "cudnnSetConvolutionGroupCount")?;
            let math = if c.dtype == DType::F32 { dnn::cudnnMathType_t::CUDNN_FMA_MATH } else { dnn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH };
            ok(dnn::cudnnSetConvolutionMathType(this.conv_desc, math), "cudnnSetConvolutionMathType")?;
            ok(dnn::cudnnCreateActivationDescriptor(&mut this.act_desc), "cudnnCreateActivationDescriptor")?;
            let mode = if c.relu { dnn::cudnnActivationMode_t::CUDNN_ACTIVATION_RELU } else { dnn::cudnnActivationMode_t::CUDNN_ACTIVATION_IDENTITY };
            ok(dnn::cudnnSetActivationDescriptor(this.act_desc, mode, dnn::cudnnNanPropagation_t::CUDNN_PROPAGATE_NAN, 0.0), "cudnnSetActivationDescriptor")?;
            match &c.residual {
                Some(z) => {
                    this.ptrs[2] = at(z);
                    this.alpha2 = 1.0;
                }
                // No residual: z aliases y with alpha2 = 0, as cuDNN allows.
                None => this.ptrs[2] = this.ptrs[4],
            }
            if let Some(algo) = known {
                this.algo = algo;
                return Ok(this);
            }
            if c.relu {
                let h = handle.lock().map_err(|_| CudaError::Poisoned("the cuDNN handle's lock is poisoned".to_string()))?;
                let mut perf: [dnn::cudnnConvolutionFwdAlgoPerf_t; 8] = std::mem::zeroed();
                let mut count = 0;
                ok(dnn::cudnnGetConvolutionForwardAlgorithm_v7(h.0, this.x_desc, this.w_desc, this.conv_desc, this.y_desc, perf.len() as i32, &mut count, perf.as_mut_ptr()), "cudnnGetConvolutionForwardAlgorithm_v7")?;
                let fitting: Vec<&dnn::cudnnConvolutionFwdAlgoPerf_t> = perf[..(count.max(0) as usize).min(perf.len())]
                    .iter()
                    .filter(|p| p.status == dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS && (p.memory as u64) <= c.workspace_bytes)
                    .collect();
                let pick = fitting.get(c.rank as usize).ok_or_else(|| {
                    CudaError::NoAlgorithm(format!("cuDNN's heuristic offers {} algorithm(s) within a {}-byte workspace; rank {} was asked for", fitting.len(), c.workspace_bytes, c.rank))
                })?;
                this.algo = pick.algo;
            }
            let h = handle.lock().map_err(|_| CudaError::Poisoned("the cuDNN handle's lock is poisoned".to_string()))?;
            let mut need = 0usize;
            ok(dnn::cudnnGetConvolutionForwardWorkspaceSize(h.0, this.x_desc, this.w_desc, this.conv_desc, this.y_desc, this.algo, &mut need), "cudnnGetConvolutionForwardWorkspaceSize")?;
            if need as u64 > c.workspace_bytes {
                return Err(CudaError::InvalidModule(format!("algorithm {:?} needs {need} bytes of workspace, more than the {} declared", this.algo, c.workspace_bytes)));
            }
            drop(h);
            Ok(this)
        }
    }
}

impl LibraryCall for PreparedConv {
    unsafe fn enqueue(&self, stream: sys::CUstream) -> Result<(), CudaError> {
        let h = self.handle.lock().map_err(|_| CudaError::Poisoned("the cuDNN handle's lock is poisoned".to_string()))?;
        ok(dnn::cudnnSetStream(h.0, stream as dnn::cudaStream_t), "cudnnSetStream")?;
        let alpha1 = 1.0f32;
        let p = |i: usize| self.ptrs[i] as *mut c_void;
        ok(
            dnn::cudnnConvolutionBiasActivationForward(
                h.0,
                &alpha1 as *const f32 as *const c_void,
                self.x_desc,
                p(0),
                self.w_desc,
                p(1),
                self.conv_desc,
                self.algo,
                p(5),
                self.workspace_bytes as usize,
                &self.alpha2 as *const f32 as *const c_void,
                self.y_desc,
                p(2),
                self.bias_desc,
                p(3),
                self.act_desc,
                self.y_desc,
                p(4),
            ),
            "cudnnConvolutionBiasActivationForward",
        )
    }
}

impl Drop for PreparedConv {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once; null descriptors (a failed `new`) are skipped.
        unsafe {
            for d in [self.x_desc, self.y_desc, self.bias_desc] {
                if !d.is_null() {
                    let _ = dnn::cudnnDestroyTensorDescriptor(d);
                }
            }
            if !self.w_desc.is_null() {
                let _ = dnn::cudnnDestroyFilterDescriptor(self.w_desc);
            }
            if !self.conv_desc.is_null() {
                let _ = dnn::cudnnDestroyConvolutionDescriptor(self.conv_desc);
            }
            if !self.act_desc.is_null() {
                let _ = dnn::cudnnDestroyActivationDescriptor(self.act_desc);
            }
        }
    }
}

/// The `cudnn` backend's module format: a [`DnnModule`], each function's fused convolutions.
pub const FORMAT: crate::module::ModuleFormat = crate::module::ModuleFormat::gpu("cudnn");


/// The loader of [`FORMAT`] modules.
pub fn loader(m: &Module) -> Result<Box<dyn LoadedModule>, RuntimeError> {
    Ok(Box::new(LoadedDnn::load(m)?))
}
