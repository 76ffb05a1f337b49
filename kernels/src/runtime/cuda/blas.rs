//! The `cublaslt` module format and its loader: each function is a list of cuBLASLt matmuls over the
//! function's device arguments (the `cublas` backend's modules).
//!
//! A matmul is described row-major, as the IR thinks: `D[b] = act(A[b] (m x k) * B[b] (k x n) + C[b] + bias)`
//! with every operand dense, `b` over `batch` strided batches (a stride of 0 broadcasts an operand). cuBLASLt is
//! column-major, so the loader hands it the transposed problem `D^T = B^T A^T` (a row-major matrix is its own
//! transpose read column-major): no data moves and no transpose flag is set. cuBLASLt's epilogue computes
//! `epilogue(alpha*A*B + beta*C + bias)`, which is why a fused chain may hold one bias, one residual (C, beta = 1)
//! and one activation last ([`Activation`]: ReLU, or GELU in its tanh form), in any order of the two additions,
//! and nothing else.
//!
//! The module holds no code and no algorithm, only each matmul's `rank`: which of cuBLASLt's heuristic answers
//! to take (0: its first choice). The loader asks the heuristic once per matmul, at load, with the real
//! pointers' alignment and the declared workspace, and the engine captures the calls into its CUDA graph like
//! kernels. The tune stage measures several ranks and the artifact records the fastest, so loading does no
//! search, only the (deterministic, for one library version and device) heuristic query; the library version
//! is part of every tune key, so a new cuBLASLt re-tunes.

use super::device;
use super::CudaError;
pub use super::library::Operand;
use super::library::{self, Args, CallDesc, LibraryModule};
use super::module::{GpuModule, LibraryCall, PreparedLaunch};
use crate::module::Module;
use crate::runtime::{LoadedModule, RuntimeError};
use crate::DType;
use cudarc::cublaslt::sys as lt;
use cudarc::driver::sys;
use serde::{Deserialize, Serialize};
use std::ffi::c_void;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Workspace every matmul may use (inside the function's scratch): 4 MiB, what cuBLASLt's documentation
/// suggests for Hopper's split-K and stream-K algorithms without wasting memory.
pub const WORKSPACE_BYTES: u64 = 4 << 20;

/// One matmul (row-major description, see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Matmul {
    /// The element type of A, B, C, D and the bias (f32 or f16); accumulation and scaling are f32.
    pub dtype: DType,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub batch: u64,
    pub a: Operand,
    pub b: Operand,
    pub d: Operand,
    /// A residual added before the epilogue (C, with D's shape and strides).
    pub residual: Option<Operand>,
    /// A bias of `n` elements added to every row (the same for every batch).
    pub bias: Option<Operand>,
    /// The activation applied last.
    pub activation: Activation,
    /// Where the workspace starts: the scratch argument and an offset; `WORKSPACE_BYTES` long.
    pub workspace: Operand,
    /// Which of the heuristic's algorithms to run, in its order (0: its first choice; below [`MAX_RANK`]).
    pub rank: u8,
}

/// The activation a matmul's epilogue applies last.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Activation {
    #[default]
    None,
    Relu,
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, cuBLASLt's `GELU` epilogues (the tanh form: PyTorch fuses
    /// `gelu(approximate="tanh")` into the same epilogue, and only that form).
    GeluTanh,
}

/// Ranks a matmul may ask for: the heuristic's first few answers are the ones worth measuring.
pub const MAX_RANK: u8 = 8;

/// The bytes of a module of format [`FORMAT`]: per function, its matmuls.
pub type BlasModule = LibraryModule<Matmul>;

/// Bytes an operand spans: `(batch - 1) * stride + rows * cols` elements.
fn span(o: &Operand, batch: u64, elems: u64, size: u64) -> Option<u64> {
    (batch - 1).checked_mul(o.batch_stride)?.checked_add(elems)?.checked_mul(size)
}

impl CallDesc for Matmul {
    const WHAT: &'static str = "matmul";

    fn describe(&self) -> String {
        let mut s = format!("cublasLt matmul {}x{}x{}", self.m, self.n, self.k);
        if self.batch > 1 {
            s.push_str(&format!(" x{}", self.batch));
        }
        s.push(' ');
        s.push_str(self.dtype.name());
        if self.rank > 0 {
            s.push_str(&format!(" algo#{}", self.rank));
        }
        let (relu, gelu) = (self.activation == Activation::Relu, self.activation == Activation::GeluTanh);
        for (on, what) in [(self.bias.is_some(), " +bias"), (self.residual.is_some(), " +residual"), (relu, " relu"), (gelu, " gelu")] {
            if on {
                s.push_str(what);
            }
        }
        s
    }

    fn check(&self, args: &Args) -> Result<(), CudaError> {
        let mm = self;
        if !matches!(mm.dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(CudaError::InvalidModule(format!("element type {:?} (f32, f16 or bf16 only)", mm.dtype)));
        }
        if mm.rank >= MAX_RANK {
            return Err(CudaError::InvalidModule(format!("algorithm rank {} (below {MAX_RANK} only)", mm.rank)));
        }
        if mm.m == 0 || mm.n == 0 || mm.k == 0 || mm.batch == 0 || [mm.m, mm.n, mm.k].iter().any(|&d| d > i32::MAX as u64) {
            return Err(CudaError::InvalidModule(format!("shape {}x{}x{} batch {} out of range", mm.m, mm.n, mm.k, mm.batch)));
        }
        let size = mm.dtype.size() as u64;
        let mut operands = vec![("A", mm.a, mm.m * mm.k), ("B", mm.b, mm.k * mm.n), ("D", mm.d, mm.m * mm.n)];
        if let Some(c) = mm.residual {
            operands.push(("C", c, mm.m * mm.n));
        }
        if let Some(bias) = mm.bias {
            if bias.batch_stride != 0 {
                return Err(CudaError::InvalidModule("a bias is the same for every batch".into()));
            }
            operands.push(("bias", bias, mm.n));
        }
        for (name, o, elems) in operands {
            args.operand(name, &o, span(&o, mm.batch, elems, size))?;
        }
        args.written("D", &mm.d)?;
        args.workspace(&mm.workspace, WORKSPACE_BYTES)
    }
}

/// Whether cuBLASLt can be loaded here; why not, if not (cudarc panics on a missing library, so ask first).
pub fn available() -> Result<(), CudaError> {
    device::count()?;
    // SAFETY: only tries to open the library by its names.
    if unsafe { lt::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError::Unavailable("cuBLASLt (libcublasLt.so.13) not found on this machine".into()))
    }
}

/// The cuBLASLt version (`major.minor.patch` as one number, e.g. 130100), once loaded.
pub fn version() -> Result<usize, CudaError> {
    available()?;
    // SAFETY: the library is present (checked above); no arguments.
    Ok(unsafe { lt::cublasLtGetVersion() })
}

/// A loaded cublaslt module: its matmuls and the cuBLASLt handle they run through.
pub struct LoadedBlas {
    backend: String,
    handle: Arc<Handle>,
    functions: Vec<Vec<Matmul>>,
    arg_counts: Vec<usize>,
    /// Each matmul's algorithm (by function, position and its operands' alignments, all the heuristic is
    /// asked about) once the heuristic picked it: asking again for every set of buffers (the tune stage
    /// prepares a function for dozens) cost more than running the matmuls.
    algos: AlgoCache,
}

/// See [`LoadedBlas::algos`].
type AlgoCache = Mutex<BTreeMap<(usize, usize, [u32; 4]), lt::cublasLtMatmulAlgo_t>>;

struct Handle(lt::cublasLtHandle_t);

// SAFETY: a cuBLASLt handle may be used from any thread as long as calls on it are not concurrent with its
// destruction; the engine enqueues from one thread at a time and the handle outlives every prepared call.
unsafe impl Send for Handle {}
unsafe impl Sync for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtCreate, destroyed once.
        unsafe {
            let _ = lt::cublasLtDestroy(self.0);
        }
    }
}

impl LoadedBlas {
    pub fn load(m: &Module) -> Result<LoadedBlas, RuntimeError> {
        let b = BlasModule::decode(m).map_err(RuntimeError::from)?;
        available().map_err(|e| RuntimeError(format!("module of backend {} needs a GPU with cuBLASLt: {e}", m.backend)))?;
        let ctx = device::context().map_err(RuntimeError::from)?;
        ctx.bind_to_thread().map_err(|e| RuntimeError(device::error(e)))?;
        let handle = cudarc::cublaslt::result::create_handle().map_err(|e| RuntimeError(format!("module of backend {}: cublasLtCreate: {e:?}", m.backend)))?;
        Ok(LoadedBlas {
            backend: m.backend.clone(),
            handle: Arc::new(Handle(handle)),
            functions: b.functions,
            arg_counts: library::arg_counts(m),
            algos: Mutex::new(BTreeMap::new()),
        })
    }
}

impl LoadedModule for LoadedBlas {
    unsafe fn call(&self, _index: usize, _args: &[*mut u8]) -> Result<(), RuntimeError> {
        Err(RuntimeError(format!("module of backend {}: cuBLASLt matmuls run on the GPU only, inside a GPU executable", self.backend)))
    }

    fn gpu(&self) -> Option<&dyn GpuModule> {
        Some(self)
    }
}

impl GpuModule for LoadedBlas {
    fn launches(&self, index: usize, args: &[u64]) -> Result<Vec<PreparedLaunch>, RuntimeError> {
        library::prepare_function(&self.backend, &self.functions, &self.arg_counts, index, args, |i, mm| {
            PreparedMatmul::new(&self.handle, mm, args, &self.algos, (index, i)).map(|c| Arc::new(c) as Arc<dyn LibraryCall>)
        })
    }
}

/// A matmul with its descriptors, pointers and algorithm fixed: one `cublasLtMatmul` call.
struct PreparedMatmul {
    handle: Arc<Handle>,
    desc: lt::cublasLtMatmulDesc_t,
    layouts: [lt::cublasLtMatrixLayout_t; 3],
    algo: lt::cublasLtMatmulAlgo_t,
    /// Device addresses of A', B' (cuBLASLt's operands: our B and A), C and D.
    ptrs: [u64; 4],
    beta: f32,
    workspace: u64,
}

// SAFETY: the descriptors are plain host objects owned by this value and only read by cublasLtMatmul.
unsafe impl Send for PreparedMatmul {}
unsafe impl Sync for PreparedMatmul {}

fn ok(s: lt::cublasStatus_t, what: &str) -> Result<(), CudaError> {
    if s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Library { call: what.to_string(), status: format!("{s:?}") })
    }
}

/// The largest power of two (at most 256) dividing `addr`: the alignment the heuristic may assume.
fn alignment(addr: u64) -> u32 {
    if addr == 0 {
        return 256;
    }
    (1u64 << addr.trailing_zeros().min(8)) as u32
}

impl PreparedMatmul {
    /// The matmul `mm` on the buffers `args`, its algorithm from `algos` under `call` (function, position)
    /// when an earlier preparation for the same alignments asked the heuristic.
    fn new(handle: &Arc<Handle>, mm: &Matmul, args: &[u64], algos: &AlgoCache, call: (usize, usize)) -> Result<PreparedMatmul, CudaError> {
        let at = |o: &Operand| args[o.arg as usize] + o.offset;
        // Storage type of A, B, C and D (and the bias, which defaults to D's); compute is fp32 whatever it is.
        let ty = match mm.dtype {
            DType::F16 => lt::cudaDataType::CUDA_R_16F,
            DType::BF16 => lt::cudaDataType::CUDA_R_16BF,
            _ => lt::cudaDataType::CUDA_R_32F,
        };
        // SAFETY: descriptor calls on objects created here; attribute buffers are live locals of the right size.
        unsafe {
            let mut desc = std::ptr::null_mut();
            ok(lt::cublasLtMatmulDescCreate(&mut desc, lt::cublasComputeType_t::CUBLAS_COMPUTE_32F, lt::cudaDataType::CUDA_R_32F), "cublasLtMatmulDescCreate")?;
            let mut this = PreparedMatmul { handle: handle.clone(), desc, layouts: [std::ptr::null_mut(); 3], algo: std::mem::zeroed(), ptrs: [0; 4], beta: 0.0, workspace: at(&mm.workspace) };
            let epilogue = match (mm.bias.is_some(), mm.activation) {
                (false, Activation::None) => lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
                (false, Activation::Relu) => lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU,
                (false, Activation::GeluTanh) => lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU,
                (true, Activation::None) => lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
                (true, Activation::Relu) => lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU_BIAS,
                (true, Activation::GeluTanh) => lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS,
            };
            let set_desc = |attr: lt::cublasLtMatmulDescAttributes_t, buf: *const c_void, len: usize| ok(lt::cublasLtMatmulDescSetAttribute(desc, attr, buf, len), "cublasLtMatmulDescSetAttribute");
            set_desc(lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue as *const _ as *const c_void, std::mem::size_of_val(&epilogue))?;
            if let Some(b) = &mm.bias {
                let p: u64 = at(b);
                set_desc(lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p as *const u64 as *const c_void, 8)?;
            }
            // Column-major view: A' = our B (n x k, ld n), B' = our A (k x m, ld k), C' and D' (n x m, ld n).
            let shapes = [(mm.n, mm.k, mm.b.batch_stride), (mm.k, mm.m, mm.a.batch_stride), (mm.n, mm.m, mm.d.batch_stride)];
            for (slot, &(rows, cols, stride)) in shapes.iter().enumerate() {
                let mut l = std::ptr::null_mut();
                ok(lt::cublasLtMatrixLayoutCreate(&mut l, ty, rows, cols, rows as i64), "cublasLtMatrixLayoutCreate")?;
                this.layouts[slot] = l;
                if mm.batch > 1 {
                    let count = mm.batch as i32;
                    let offset = stride as i64;
                    ok(lt::cublasLtMatrixLayoutSetAttribute(l, lt::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count as *const i32 as *const c_void, 4), "batch count")?;
                    ok(lt::cublasLtMatrixLayoutSetAttribute(l, lt::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &offset as *const i64 as *const c_void, 8), "batch stride")?;
                }
            }
            if let Some(c) = &mm.residual {
                if c.batch_stride != mm.d.batch_stride {
                    return Err(CudaError::InvalidModule("the residual's batch stride differs from the output's".into()));
                }
            }
            let (c_ptr, beta) = match &mm.residual {
                Some(c) => (at(c), 1.0f32),
                None => (at(&mm.d), 0.0f32),
            };
            this.ptrs = [at(&mm.b), at(&mm.a), c_ptr, at(&mm.d)];
            this.beta = beta;
            // The heuristic's algorithm of rank `mm.rank` for these pointers' alignment and the workspace we have.
            let aligned = this.ptrs.map(alignment);
            let cache = || algos.lock().map_err(|_| CudaError::Poisoned("the algorithm cache's lock is poisoned".to_string()));
            if let Some(algo) = cache()?.get(&(call.0, call.1, aligned)) {
                this.algo = *algo;
                return Ok(this);
            }
            let mut pref = std::ptr::null_mut();
            ok(lt::cublasLtMatmulPreferenceCreate(&mut pref), "cublasLtMatmulPreferenceCreate")?;
            let found = (|| {
                let set = |attr: lt::cublasLtMatmulPreferenceAttributes_t, v: u64, len: usize| ok(lt::cublasLtMatmulPreferenceSetAttribute(pref, attr, &v as *const u64 as *const c_void, len), "cublasLtMatmulPreferenceSetAttribute");
                set(lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, WORKSPACE_BYTES, 8)?;
                use lt::cublasLtMatmulPreferenceAttributes_t as P;
                for (attr, a) in [P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES].into_iter().zip(aligned) {
                    ok(lt::cublasLtMatmulPreferenceSetAttribute(pref, attr, &a as *const u32 as *const c_void, 4), "alignment preference")?;
                }
                let wanted = mm.rank as usize + 1;
                let mut results: Vec<lt::cublasLtMatmulHeuristicResult_t> = vec![std::mem::zeroed(); wanted];
                let mut count = 0i32;
                let l = this.layouts;
                ok(lt::cublasLtMatmulAlgoGetHeuristic(handle.0, desc, l[0], l[1], l[2], l[2], pref, wanted as i32, results.as_mut_ptr(), &mut count), "cublasLtMatmulAlgoGetHeuristic")?;
                if count == 0 {
                    return Err(CudaError::NoAlgorithm("cuBLASLt has no algorithm for this matmul".to_string()));
                }
                if (count as usize) < wanted {
                    return Err(CudaError::NoAlgorithm(format!("cuBLASLt's heuristic offers {count} algorithm(s) for this matmul; rank {} was asked for", mm.rank)));
                }
                let result = &results[mm.rank as usize];
                ok(result.state, "heuristic result")?;
                Ok(result.algo)
            })();
            let _ = lt::cublasLtMatmulPreferenceDestroy(pref);
            this.algo = found?;
            cache()?.insert((call.0, call.1, aligned), this.algo);
            Ok(this)
        }
    }
}

impl LibraryCall for PreparedMatmul {
    unsafe fn enqueue(&self, stream: sys::CUstream) -> Result<(), CudaError> {
        let alpha = 1.0f32;
        let l = self.layouts;
        let p = |i: usize| self.ptrs[i] as *mut c_void;
        ok(
            lt::cublasLtMatmul(
                self.handle.0,
                self.desc,
                &alpha as *const f32 as *const c_void,
                p(0),
                l[0],
                p(1),
                l[1],
                &self.beta as *const f32 as *const c_void,
                p(2),
                l[2],
                p(3),
                l[2],
                &self.algo,
                self.workspace as *mut c_void,
                WORKSPACE_BYTES as usize,
                stream as lt::cudaStream_t,
            ),
            "cublasLtMatmul",
        )
    }
}

impl Drop for PreparedMatmul {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once; null layouts (a failed `new`) are skipped.
        unsafe {
            for l in self.layouts {
                if !l.is_null() {
                    let _ = lt::cublasLtMatrixLayoutDestroy(l);
                }
            }
            let _ = lt::cublasLtMatmulDescDestroy(self.desc);
        }
    }
}

/// The `cublas` backend's module format: a [`BlasModule`], each function's cuBLASLt matmuls.
pub const FORMAT: crate::module::ModuleFormat = crate::module::ModuleFormat::gpu("cublaslt");


/// The loader of [`FORMAT`] modules.
pub fn loader(m: &Module) -> Result<Box<dyn LoadedModule>, RuntimeError> {
    Ok(Box::new(LoadedBlas::load(m)?))
}
