//! A loaded cubin module: the cubin in the process's context and, per function, its launches resolved to
//! kernel handles.

use super::device;
use super::CudaError;
use super::format::{CubinModule, Launch, ParamBlock, TensorMapPatch, TENSOR_MAP_BYTES};
use crate::module::Module;
use crate::runtime::{LoadedModule, RuntimeError};
use cudarc::driver::{sys, CudaFunction, CudaModule};
use std::sync::Arc;

/// A cubin module loaded on one GPU (the current one when it was loaded).
pub struct LoadedCubin {
    backend: String,
    _modules: Vec<Arc<CudaModule>>,
    /// Per function, per launch: the kernel, its configuration and the parameter block it passes, if any.
    functions: Vec<Vec<(CudaFunction, Launch, Option<ParamBlock>)>>,
    /// Argument count per function (`[inputs.., outputs.., scratch?]`).
    arg_counts: Vec<usize>,
}

impl LoadedCubin {
    pub fn load(m: &Module) -> Result<LoadedCubin, RuntimeError> {
        let c = CubinModule::decode(m).map_err(RuntimeError::from)?;
        let ctx = device::context().map_err(|e| RuntimeError(format!("module of backend {} needs a GPU: {e}", m.backend)))?;
        let arch = c.arch;
        let modules = c
            .cubins
            .into_iter()
            .enumerate()
            .map(|(i, cubin)| ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin)).map_err(|e| RuntimeError(format!("module of backend {} (compiled for {arch}): the GPU refuses its cubin {i}: {e}", m.backend))))
            .collect::<Result<Vec<_>, _>>()?;
        let mut functions = Vec::with_capacity(c.functions.len());
        for (((f, info), cubins), params) in c.functions.into_iter().zip(&m.functions).zip(&c.launch_cubins).zip(c.launch_params) {
            let mut launches = Vec::with_capacity(f.launches.len());
            for ((l, &cubin), block) in f.launches.into_iter().zip(cubins).zip(params) {
                let module = &modules[cubin as usize];
                let k = module.load_function(&l.entry).map_err(|e| RuntimeError(format!("module of backend {}: function '{}': kernel '{}' not in the cubin: {e}", m.backend, info.symbol, l.entry)))?;
                if l.shared_bytes > 48 * 1024 {
                    k.set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, l.shared_bytes as i32)
                        .map_err(|e| RuntimeError(format!("kernel '{}': {} bytes of shared memory refused: {e}", l.entry, l.shared_bytes)))?;
                }
                launches.push((k, l, block));
            }
            functions.push(launches);
        }
        Ok(LoadedCubin {
            backend: m.backend.clone(),
            _modules: modules,
            functions,
            arg_counts: m.functions.iter().map(|f| f.inputs.len() + f.outputs.len() + usize::from(f.scratch_bytes > 0)).collect(),
        })
    }

    /// The launches of function `index` with their parameters resolved against the function's device
    /// argument addresses `args`.
    pub fn launches(&self, index: usize, args: &[u64]) -> Result<Vec<PreparedLaunch>, RuntimeError> {
        let launches = self.functions.get(index).ok_or_else(|| RuntimeError(format!("module of backend {}: no function {index}", self.backend)))?;
        if args.len() != self.arg_counts[index] {
            return Err(RuntimeError(format!("module of backend {}: function {index} takes {} arguments, got {}", self.backend, self.arg_counts[index], args.len())));
        }
        launches
            .iter()
            .map(|(k, l, block)| {
                let op = match block {
                    None => LaunchOp::Kernel { function: k.clone(), params: l.args.iter().map(|a| args[a.index as usize] + a.offset).collect() },
                    Some(b) => LaunchOp::KernelBlock { function: k.clone(), block: fill_block(b, args).map_err(|e| RuntimeError(format!("module of backend {}: kernel '{}': {e}", self.backend, l.entry)))? },
                };
                Ok(PreparedLaunch { entry: l.entry.clone(), grid: l.grid, block: l.block, shared_bytes: l.shared_bytes, op })
            })
            .collect()
    }
}

/// A parameter block with the function's device addresses in place and its tensor maps encoded by the
/// driver, as 8-byte words (the block's bytes, zero-padded).
fn fill_block(b: &ParamBlock, args: &[u64]) -> Result<Vec<u64>, CudaError> {
    let mut bytes = b.bytes.clone();
    for p in &b.pointers {
        let at = p.at as usize;
        bytes[at..at + 8].copy_from_slice(&(args[p.arg.index as usize] + p.arg.offset).to_le_bytes());
    }
    for t in &b.tensor_maps {
        let map = encode_tensor_map(t, args[t.arg.index as usize] + t.arg.offset)?;
        let at = t.at as usize;
        bytes[at..at + TENSOR_MAP_BYTES].copy_from_slice(&map);
    }
    let mut words = vec![0u64; bytes.len().div_ceil(8)];
    for (w, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
        let mut le = [0u8; 8];
        le[..chunk.len()].copy_from_slice(chunk);
        *w = u64::from_le_bytes(le);
    }
    Ok(words)
}

/// The driver's encoding of tensor map `t` over the global memory at `address`.
fn encode_tensor_map(t: &TensorMapPatch, address: u64) -> Result<[u8; TENSOR_MAP_BYTES], CudaError> {
    use sys::{CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave, CUtensorMapL2promotion, CUtensorMapSwizzle};
    // The enums' values are the driver ABI's; the block recorded them from the same headers.
    fn value<T>(v: u32, what: &str, max: u32) -> Result<T, CudaError> {
        if v > max {
            return Err(CudaError::InvalidModule(format!("tensor map {what} {v} is not one this driver API knows")));
        }
        // SAFETY: `T` is a fieldless `repr(u32)` driver enum and `v` one of its values (checked above).
        Ok(unsafe { std::mem::transmute_copy::<u32, T>(&v) })
    }
    let data_type: CUtensorMapDataType = value(t.data_type, "data type", 15)?;
    let interleave: CUtensorMapInterleave = value(t.interleave, "interleave", 2)?;
    let swizzle: CUtensorMapSwizzle = value(t.swizzle, "swizzle", 6)?;
    let l2: CUtensorMapL2promotion = value(t.l2_promotion, "L2 promotion", 3)?;
    let oob: CUtensorMapFloatOOBfill = value(t.oob_fill, "out-of-bounds fill", 1)?;
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    super::device::context().map_err(|e| CudaError::Driver(format!("no GPU to encode a tensor map: {e}")))?;
    // SAFETY: the pointers are to live arrays of the lengths the rank names (checked when the module was
    // decoded); the driver writes the 128-byte map.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            data_type,
            t.dims.len() as u32,
            address as *mut std::ffi::c_void,
            t.dims.as_ptr(),
            t.strides.as_ptr(),
            t.box_dims.as_ptr(),
            t.element_strides.as_ptr(),
            interleave,
            swizzle,
            l2,
            oob,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(CudaError::Driver(format!("the driver refuses tensor map {t:?} at address {address:#x}: {r:?}")));
    }
    // SAFETY: the driver wrote the whole map.
    let map = unsafe { map.assume_init() };
    let mut out = [0u8; TENSOR_MAP_BYTES];
    // SAFETY: CUtensorMap is 128 plain bytes.
    out.copy_from_slice(unsafe { std::slice::from_raw_parts(&map as *const sys::CUtensorMap as *const u8, TENSOR_MAP_BYTES) });
    Ok(out)
}

impl GpuModule for LoadedCubin {
    fn launches(&self, index: usize, args: &[u64]) -> Result<Vec<PreparedLaunch>, RuntimeError> {
        LoadedCubin::launches(self, index, args)
    }
}

impl LoadedModule for LoadedCubin {
    unsafe fn call(&self, _index: usize, _args: &[*mut u8]) -> Result<(), RuntimeError> {
        Err(RuntimeError(format!("module of backend {}: a cubin runs on the GPU only, inside a GPU executable", self.backend)))
    }

    fn gpu(&self) -> Option<&dyn GpuModule> {
        Some(self)
    }
}

/// A module whose functions run on the GPU: each function becomes a list of launches on the engine's stream
/// (kernels of a cubin, calls into a GPU library), resolved once against the function's device arguments.
pub trait GpuModule {
    /// The launches of function `index` with `args`, the device addresses of its `[inputs.., outputs..,
    /// scratch?]`.
    fn launches(&self, index: usize, args: &[u64]) -> Result<Vec<PreparedLaunch>, RuntimeError>;
}

/// One GPU library call enqueued like a kernel (cuBLASLt's matmul): capturable into a CUDA graph.
pub trait LibraryCall: Send + Sync {
    /// Enqueues the call on `stream`.
    ///
    /// # Safety
    /// The call's pointers must be live device buffers of the types it was prepared for.
    unsafe fn enqueue(&self, stream: sys::CUstream) -> Result<(), CudaError>;
}

/// What a launch runs.
#[derive(Clone)]
pub enum LaunchOp {
    /// A kernel of a cubin and its parameters (device addresses).
    Kernel { function: CudaFunction, params: Vec<u64> },
    /// A kernel of a cubin taking one structure by value: its bytes, as 8-byte words.
    KernelBlock { function: CudaFunction, block: Vec<u64> },
    /// A library call with everything it needs prepared.
    Library(Arc<dyn LibraryCall>),
}

/// One launch on the engine's stream: a kernel with its parameters, or a prepared library call.
#[derive(Clone)]
pub struct PreparedLaunch {
    /// The kernel's entry name, or the library call's description (for profiles).
    pub entry: String,
    /// Launch configuration of a kernel; zeros for a library call (the library picks its own).
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
    pub op: LaunchOp,
}

impl PreparedLaunch {
    /// Enqueues the launch on `stream`.
    ///
    /// # Safety
    /// The parameters must be live device buffers of the types the kernel or call expects.
    pub unsafe fn enqueue(&self, stream: sys::CUstream) -> Result<(), CudaError> {
        match &self.op {
            LaunchOp::Kernel { function, params } => {
                let mut params = params.clone();
                let mut ptrs: Vec<*mut std::ffi::c_void> = params.iter_mut().map(|p| p as *mut u64 as *mut std::ffi::c_void).collect();
                cudarc::driver::result::launch_kernel(
                    function.cu_function(),
                    (self.grid[0], self.grid[1], self.grid[2]),
                    (self.block[0], self.block[1], self.block[2]),
                    self.shared_bytes,
                    stream,
                    &mut ptrs,
                )
                .map_err(|e| CudaError::Driver(e.to_string()))
            }
            LaunchOp::KernelBlock { function, block } => {
                let mut block = block.clone();
                let mut ptrs: Vec<*mut std::ffi::c_void> = vec![block.as_mut_ptr() as *mut std::ffi::c_void];
                cudarc::driver::result::launch_kernel(
                    function.cu_function(),
                    (self.grid[0], self.grid[1], self.grid[2]),
                    (self.block[0], self.block[1], self.block[2]),
                    self.shared_bytes,
                    stream,
                    &mut ptrs,
                )
                .map_err(|e| CudaError::Driver(e.to_string()))
            }
            LaunchOp::Library(call) => call.enqueue(stream),
        }
    }
}
