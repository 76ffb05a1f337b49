//! The `cubin` module format: one cubin for all of a model's `cuda` partitions, and for each function the
//! kernel launches that make it up, with their launch configurations fixed at compile time.
//!
//! A function keeps the shared calling convention (`[inputs.., outputs.., scratch?]`, see
//! [`crate::module`]); here the pointers are device addresses. Each launch passes some of them, in order, as
//! its kernel's parameters, a scratch pointer plus an offset where a launch uses part of the scratch buffer.

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
    /// The architecture the cubin is for (`sm_90`).
    pub arch: String,
    pub cubin: Vec<u8>,
    /// Per function of the module, in the module's function order.
    pub functions: Vec<FunctionLaunches>,
}

impl CubinModule {
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("a cubin module encodes")
    }

    /// Decodes and checks a module's bytes against its function list: every launch's arguments exist, its
    /// configuration is launchable, a scratch offset stays inside the scratch buffer.
    pub fn decode(m: &Module) -> Result<CubinModule, String> {
        let c: CubinModule = postcard::from_bytes(&m.bytes).map_err(|e| format!("cubin module of backend {}: undecodable ({e})", m.backend))?;
        if c.functions.len() != m.functions.len() {
            return Err(format!("cubin module of backend {}: {} launch lists for {} functions", m.backend, c.functions.len(), m.functions.len()));
        }
        if c.cubin.len() < 4 || &c.cubin[..4] != b"\x7fELF" {
            return Err(format!("cubin module of backend {}: the code is not an ELF cubin", m.backend));
        }
        for (f, info) in c.functions.iter().zip(&m.functions) {
            check_function(f, info).map_err(|e| format!("cubin module of backend {}: function '{}': {e}", m.backend, info.symbol))?;
        }
        Ok(c)
    }
}

fn check_function(f: &FunctionLaunches, info: &FunctionInfo) -> Result<(), String> {
    let n_bufs = info.inputs.len() + info.outputs.len();
    let n_args = n_bufs + usize::from(info.scratch_bytes > 0);
    for (k, l) in f.launches.iter().enumerate() {
        let at = |e: String| format!("launch {k} ('{}'): {e}", l.entry);
        if l.grid.contains(&0) || l.block.contains(&0) {
            return Err(at(format!("empty launch configuration grid {:?} block {:?}", l.grid, l.block)));
        }
        if l.block.iter().map(|&b| b as u64).product::<u64>() > 1024 || l.grid[1] > 65535 || l.grid[2] > 65535 {
            return Err(at(format!("launch configuration out of range: grid {:?} block {:?}", l.grid, l.block)));
        }
        if l.shared_bytes > MAX_SHARED_BYTES {
            return Err(at(format!("{} bytes of shared memory (at most {MAX_SHARED_BYTES})", l.shared_bytes)));
        }
        for a in &l.args {
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
