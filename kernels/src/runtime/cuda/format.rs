//! The `cubins` module format: a model's `cuda` partitions as a few cubins (the module's kernels compiled as
//! several programs, in parallel: one program of a whole plan's kernels compiles on one core), and for each
//! function the launches that make it up, with their launch configurations fixed at compile time, and the
//! cubin holding each launch's kernel. The `cubin` format before it (one cubin) is still read.
//!
//! A launch passes its kernel's parameters in one of two ways. Most kernels take device pointers: the
//! launch's `args`. A kernel whose parameters are one structure built by host code (CUTLASS's Hopper GEMMs,
//! whose `Params` hold TMA tensor maps that only the driver can encode) carries a [`ParamBlock`]: the
//! structure's bytes made at compile time with placeholder addresses, and the places the loader fills with
//! the launch's device addresses and with tensor maps it has the driver encode. A module with any such
//! launch is of the `cubins-params` format ([`super::PARAMS_FORMAT`]): the same bytes as `cubins`, then each
//! launch's block.
//!
//! A function keeps the shared calling convention (`[inputs.., outputs.., scratch?]`, see
//! [`crate::module`]); here the pointers are device addresses. Each launch passes some of them, in order, as
//! its kernel's parameters, a scratch pointer plus an offset where a launch uses part of the scratch buffer.

use super::CudaError;
use crate::module::{FunctionInfo, Module};
use serde::{Deserialize, Serialize};

/// Largest dynamic shared memory a launch may ask for (sm_90's 227 KiB per block).
pub const MAX_SHARED_BYTES: u32 = 227 * 1024;

/// A kernel parameter: argument `index` of the function's pointer array, plus `offset` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchArg {
    pub index: u32,
    pub offset: u64,
}

/// Where a [`ParamBlock`] takes a device address: the 8 bytes at `at` become the address of `arg`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PointerPatch {
    pub at: u32,
    pub arg: LaunchArg,
}

/// Where a [`ParamBlock`] takes a TMA tensor map (`CUtensorMap`, 128 bytes at `at`): the arguments of the
/// driver's `cuTensorMapEncodeTiled` as the host code that built the block passed them, the global address
/// being `arg`'s device address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorMapPatch {
    pub at: u32,
    pub arg: LaunchArg,
    /// `CUtensorMapDataType`.
    pub data_type: u32,
    /// Extent of each dimension, innermost first (1 to 5 of them).
    pub dims: Vec<u64>,
    /// Byte stride of each dimension but the innermost.
    pub strides: Vec<u64>,
    pub box_dims: Vec<u32>,
    pub element_strides: Vec<u32>,
    /// `CUtensorMapInterleave`, `CUtensorMapSwizzle`, `CUtensorMapL2promotion`, `CUtensorMapFloatOOBfill`.
    pub interleave: u32,
    pub swizzle: u32,
    pub l2_promotion: u32,
    pub oob_fill: u32,
}

/// Bytes of an encoded tensor map.
pub const TENSOR_MAP_BYTES: usize = 128;

/// Largest parameter block a launch passes (the kernel parameter space every driver takes).
pub const MAX_PARAM_BYTES: usize = 4096;

/// A kernel's parameter structure, passed by value: its bytes, and what the loader fills in.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamBlock {
    pub bytes: Vec<u8>,
    pub pointers: Vec<PointerPatch>,
    pub tensor_maps: Vec<TensorMapPatch>,
}

impl ParamBlock {
    /// Every patch inside the block, tensor maps 64-byte aligned, without overlaps.
    fn check(&self) -> Result<(), CudaError> {
        if self.bytes.len() > MAX_PARAM_BYTES {
            return Err(CudaError::InvalidModule(format!("a parameter block of {} bytes (at most {MAX_PARAM_BYTES})", self.bytes.len())));
        }
        let mut spans: Vec<(usize, usize)> = self.pointers.iter().map(|p| (p.at as usize, 8)).collect();
        for t in &self.tensor_maps {
            let rank = t.dims.len();
            if !(1..=5).contains(&rank) || t.strides.len() + 1 != rank || t.box_dims.len() != rank || t.element_strides.len() != rank {
                return Err(CudaError::InvalidModule(format!("tensor map at {}: rank {rank} with {} strides, {} box extents, {} element strides", t.at, t.strides.len(), t.box_dims.len(), t.element_strides.len())));
            }
            if t.at % 64 != 0 {
                return Err(CudaError::InvalidModule(format!("tensor map at {}: not 64-byte aligned", t.at)));
            }
            spans.push((t.at as usize, TENSOR_MAP_BYTES));
        }
        spans.sort_unstable();
        for (i, &(at, len)) in spans.iter().enumerate() {
            if at + len > self.bytes.len() || spans.get(i + 1).is_some_and(|&(next, _)| next < at + len) {
                return Err(CudaError::InvalidModule(format!("a patch of {len} bytes at {at} outside the {}-byte block or overlapping the next", self.bytes.len())));
            }
        }
        Ok(())
    }

    /// The arguments the block's patches read.
    pub fn args(&self) -> impl Iterator<Item = &LaunchArg> {
        self.pointers.iter().map(|p| &p.arg).chain(self.tensor_maps.iter().map(|t| &t.arg))
    }
}

/// One kernel launch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    /// The `extern "C" __global__` function's name in the cubin.
    pub entry: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Dynamic shared memory, bytes.
    pub shared_bytes: u32,
    pub args: Vec<LaunchArg>,
}

/// A function: its launches, in order, on one stream.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionLaunches {
    pub launches: Vec<Launch>,
}

/// The bytes of a module of format [`super::FORMAT`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CubinModule {
    /// The architecture the cubins are for (`sm_90`).
    pub arch: String,
    /// One cubin per program the module was compiled as.
    pub cubins: Vec<Vec<u8>>,
    /// Per function of the module, in the module's function order.
    pub functions: Vec<FunctionLaunches>,
    /// Per function, per launch: the index in `cubins` of the cubin holding the launch's kernel.
    pub launch_cubins: Vec<Vec<u32>>,
    /// Per function, per launch: the parameter block a launch passes instead of `args`. Empty, or all
    /// `None`, in a `cubins` module; encoded after the rest in a `cubins-params` one.
    #[serde(skip)]
    pub launch_params: Vec<Vec<Option<ParamBlock>>>,
}

/// A module of the `cubin` format ([`super::LEGACY_FORMAT`]): one cubin for every function.
#[derive(Deserialize)]
struct SingleCubin {
    arch: String,
    cubin: Vec<u8>,
    functions: Vec<FunctionLaunches>,
}

impl CubinModule {
    /// A module compiled as one program.
    pub fn single(arch: String, cubin: Vec<u8>, functions: Vec<FunctionLaunches>) -> CubinModule {
        let launch_cubins = functions.iter().map(|f| vec![0; f.launches.len()]).collect();
        CubinModule { arch, cubins: vec![cubin], functions, launch_cubins, launch_params: Vec::new() }
    }

    /// Whether any launch passes a parameter block.
    pub fn has_param_blocks(&self) -> bool {
        self.launch_params.iter().flatten().any(Option::is_some)
    }

    /// The format of the module's bytes: `cubins-params` where a launch passes a parameter block, else
    /// `cubins` (so modules without one keep the bytes they had).
    pub fn format(&self) -> crate::module::ModuleFormat {
        if self.has_param_blocks() {
            super::PARAMS_FORMAT
        } else {
            super::FORMAT
        }
    }

    /// The bytes of [`Self::format`].
    pub fn encode(&self) -> Vec<u8> {
        if self.has_param_blocks() {
            postcard::to_stdvec(&(self, &self.launch_params)).expect("a cubin module encodes")
        } else {
            postcard::to_stdvec(self).expect("a cubin module encodes")
        }
    }

    /// Decodes and checks a module's bytes (of either format) against its function list: every cubin is
    /// an ELF file, every function names one, every launch's arguments exist, its configuration is
    /// launchable, a scratch offset stays inside the scratch buffer.
    pub fn decode(m: &Module) -> Result<CubinModule, CudaError> {
        let undecodable = |e: postcard::Error| CudaError::InvalidModule(format!("cubin module of backend {}: undecodable ({e})", m.backend));
        let mut c: CubinModule = if m.format == super::LEGACY_FORMAT {
            let s: SingleCubin = postcard::from_bytes(&m.bytes).map_err(undecodable)?;
            CubinModule::single(s.arch, s.cubin, s.functions)
        } else if m.format == super::PARAMS_FORMAT {
            let (mut c, params): (CubinModule, Vec<Vec<Option<ParamBlock>>>) = postcard::from_bytes(&m.bytes).map_err(undecodable)?;
            c.launch_params = params;
            c
        } else {
            postcard::from_bytes(&m.bytes).map_err(undecodable)?
        };
        if c.launch_params.is_empty() {
            c.launch_params = c.functions.iter().map(|f| vec![None; f.launches.len()]).collect();
        }
        if c.launch_params.len() != c.functions.len() || c.functions.iter().zip(&c.launch_params).any(|(f, p)| p.len() != f.launches.len()) {
            return Err(CudaError::InvalidModule(format!("cubin module of backend {}: parameter blocks do not match its launches", m.backend)));
        }
        if c.functions.len() != m.functions.len() || c.launch_cubins.len() != m.functions.len() {
            return Err(CudaError::InvalidModule(format!("cubin module of backend {}: {} launch lists and {} cubin lists for {} functions", m.backend, c.functions.len(), c.launch_cubins.len(), m.functions.len())));
        }
        if let Some(i) = c.cubins.iter().position(|b| b.len() < 4 || &b[..4] != b"\x7fELF") {
            return Err(CudaError::InvalidModule(format!("cubin module of backend {}: its code {i} is not an ELF cubin", m.backend)));
        }
        for ((f, cubins), info) in c.functions.iter().zip(&c.launch_cubins).zip(&m.functions) {
            if cubins.len() != f.launches.len() {
                return Err(CudaError::InvalidModule(format!("cubin module of backend {}: function '{}' has {} launches and {} cubin indices", m.backend, info.symbol, f.launches.len(), cubins.len())));
            }
            if let Some((l, i)) = f.launches.iter().zip(cubins).find(|(_, &i)| i as usize >= c.cubins.len()) {
                return Err(CudaError::InvalidModule(format!("cubin module of backend {}: function '{}': kernel '{}' is in cubin {i} of {}", m.backend, info.symbol, l.entry, c.cubins.len())));
            }
        }
        for ((f, params), info) in c.functions.iter().zip(&c.launch_params).zip(&m.functions) {
            check_function(f, params, info).map_err(|e| CudaError::InvalidModule(format!("cubin module of backend {}: function '{}': {e}", m.backend, info.symbol)))?;
        }
        Ok(c)
    }
}

fn check_function(f: &FunctionLaunches, params: &[Option<ParamBlock>], info: &FunctionInfo) -> Result<(), CudaError> {
    let n_bufs = info.inputs.len() + info.outputs.len();
    let n_args = n_bufs + usize::from(info.scratch_bytes > 0);
    for (k, (l, block)) in f.launches.iter().zip(params).enumerate() {
        let at = |e: String| CudaError::InvalidModule(format!("launch {k} ('{}'): {e}", l.entry));
        if l.grid.contains(&0) || l.block.contains(&0) {
            return Err(at(format!("empty launch configuration grid {:?} block {:?}", l.grid, l.block)));
        }
        if l.block.iter().map(|&b| b as u64).product::<u64>() > 1024 || l.grid[1] > 65535 || l.grid[2] > 65535 {
            return Err(at(format!("launch configuration out of range: grid {:?} block {:?}", l.grid, l.block)));
        }
        if l.shared_bytes > MAX_SHARED_BYTES {
            return Err(at(format!("{} bytes of shared memory (at most {MAX_SHARED_BYTES})", l.shared_bytes)));
        }
        if let Some(b) = block {
            if !l.args.is_empty() {
                return Err(at("a launch passes both pointers and a parameter block".into()));
            }
            b.check().map_err(|e| at(e.to_string()))?;
        }
        for a in l.args.iter().chain(block.iter().flat_map(|b| b.args())) {
            let i = a.index as usize;
            if i >= n_args {
                return Err(at(format!("argument {i} of a function with {n_args} arguments")));
            }
            let limit = if i < n_bufs { 0 } else { info.scratch_bytes };
            if a.offset > limit || (i < n_bufs && a.offset != 0) {
                return Err(at(format!("argument {i} at offset {} (only scratch takes offsets, below {})", a.offset, info.scratch_bytes)));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "format_tests.rs"]
mod tests;
