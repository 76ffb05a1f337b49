//! The `cubins` module format: a model's `cuda` partitions as a few cubins (the module's kernels compiled as
//! several programs, in parallel: one program of a whole plan's kernels compiles on one core), and for each
//! function the launches that make it up, with their launch configurations fixed at compile time, and the
//! cubin holding each launch's kernel. The `cubin` format before it (one cubin) is still read.
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
    /// The architecture the cubins are for (`sm_90`).
    pub arch: String,
    /// One cubin per program the module was compiled as.
    pub cubins: Vec<Vec<u8>>,
    /// Per function of the module, in the module's function order.
    pub functions: Vec<FunctionLaunches>,
    /// Per function, per launch: the index in `cubins` of the cubin holding the launch's kernel.
    pub launch_cubins: Vec<Vec<u32>>,
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
        CubinModule { arch, cubins: vec![cubin], functions, launch_cubins }
    }

    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("a cubin module encodes")
    }

    /// Decodes and checks a module's bytes (of either format) against its function list: every cubin is
    /// an ELF file, every function names one, every launch's arguments exist, its configuration is
    /// launchable, a scratch offset stays inside the scratch buffer.
    pub fn decode(m: &Module) -> Result<CubinModule, String> {
        let undecodable = |e: postcard::Error| format!("cubin module of backend {}: undecodable ({e})", m.backend);
        let c: CubinModule = if m.format == super::LEGACY_FORMAT {
            let s: SingleCubin = postcard::from_bytes(&m.bytes).map_err(undecodable)?;
            CubinModule::single(s.arch, s.cubin, s.functions)
        } else {
            postcard::from_bytes(&m.bytes).map_err(undecodable)?
        };
        if c.functions.len() != m.functions.len() || c.launch_cubins.len() != m.functions.len() {
            return Err(format!("cubin module of backend {}: {} launch lists and {} cubin lists for {} functions", m.backend, c.functions.len(), c.launch_cubins.len(), m.functions.len()));
        }
        if let Some(i) = c.cubins.iter().position(|b| b.len() < 4 || &b[..4] != b"\x7fELF") {
            return Err(format!("cubin module of backend {}: its code {i} is not an ELF cubin", m.backend));
        }
        for ((f, cubins), info) in c.functions.iter().zip(&c.launch_cubins).zip(&m.functions) {
            if cubins.len() != f.launches.len() {
                return Err(format!("cubin module of backend {}: function '{}' has {} launches and {} cubin indices", m.backend, info.symbol, f.launches.len(), cubins.len()));
            }
            if let Some((l, i)) = f.launches.iter().zip(cubins).find(|(_, &i)| i as usize >= c.cubins.len()) {
                return Err(format!("cubin module of backend {}: function '{}': kernel '{}' is in cubin {i} of {}", m.backend, info.symbol, l.entry, c.cubins.len()));
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::TensorType;

    fn info(symbol: &str) -> FunctionInfo {
        FunctionInfo { symbol: symbol.into(), inputs: vec![TensorType::f32(vec![4])], outputs: vec![TensorType::f32(vec![4])], scratch_bytes: 0 }
    }

    fn launches(entry: &str) -> FunctionLaunches {
        let args = vec![LaunchArg { index: 0, offset: 0 }, LaunchArg { index: 1, offset: 0 }];
        FunctionLaunches { launches: vec![Launch { entry: entry.into(), grid: [1, 1, 1], block: [32, 1, 1], shared_bytes: 0, args }] }
    }

    fn module(format: crate::module::ModuleFormat, bytes: Vec<u8>) -> Module {
        Module { backend: "cuda".into(), target: "cuda".into(), format, functions: vec![info("f"), info("g")], bytes }
    }

    /// Two programs: each launch names its cubin; a module of the one-cubin format before still reads, as
    /// one cubin holding every launch.
    #[test]
    fn functions_name_their_cubin_and_the_one_cubin_format_still_reads() {
        let elf = |tag: u8| [b"\x7fELF".as_slice(), &[tag]].concat();
        let two = CubinModule { arch: "sm_90".into(), cubins: vec![elf(1), elf(2)], functions: vec![launches("f_k0"), launches("g_k0")], launch_cubins: vec![vec![0], vec![1]] };
        assert_eq!(CubinModule::decode(&module(super::super::FORMAT, two.encode())).unwrap(), two);
        #[derive(Serialize)]
        struct Old {
            arch: String,
            cubin: Vec<u8>,
            functions: Vec<FunctionLaunches>,
        }
        let old = postcard::to_stdvec(&Old { arch: "sm_90".into(), cubin: elf(7), functions: vec![launches("f_k0"), launches("g_k0")] }).unwrap();
        let read = CubinModule::decode(&module(super::super::LEGACY_FORMAT, old)).unwrap();
        assert_eq!((read.cubins, read.launch_cubins), (vec![elf(7)], vec![vec![0], vec![0]]));
        let bad = CubinModule { launch_cubins: vec![vec![0], vec![2]], ..two.clone() };
        let e = CubinModule::decode(&module(super::super::FORMAT, bad.encode())).unwrap_err();
        assert!(e.contains("function 'g': kernel 'g_k0' is in cubin 2 of 2"), "{e}");
        let short = CubinModule { launch_cubins: vec![vec![0], vec![]], ..two.clone() };
        assert!(CubinModule::decode(&module(super::super::FORMAT, short.encode())).unwrap_err().contains("function 'g' has 1 launches and 0 cubin indices"));
        let not_elf = CubinModule { cubins: vec![elf(1), b"text".to_vec()], ..two };
        assert!(CubinModule::decode(&module(super::super::FORMAT, not_elf.encode())).unwrap_err().contains("its code 1 is not an ELF cubin"));
    }
}
