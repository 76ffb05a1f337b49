//! What the GPU library module formats (`cublaslt`, `cudnn`) share: a module is, per function, a list of
//! library calls described by data ([`LibraryModule`]); a call's operands point into the function's
//! arguments ([`Operand`]), checked against their sizes when the module is decoded ([`Args`]); the loader
//! prepares each call once against the device arguments ([`prepare_function`]).

use super::module::{LaunchOp, LibraryCall, PreparedLaunch};
use crate::module::{FunctionInfo, Module};
use super::CudaError;
use crate::runtime::RuntimeError;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// An operand: argument `arg` of the function (plus `offset` bytes, for scratch), advancing `batch_stride`
/// elements per batch (0: the same matrix for every batch; unused by calls without batches).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operand {
    pub arg: u32,
    pub offset: u64,
    pub batch_stride: u64,
}

/// One library call's description.
pub trait CallDesc: Serialize + DeserializeOwned {
    /// What a call is, for messages ("matmul", "convolution").
    const WHAT: &'static str;
    /// Checks the call against its function's arguments.
    fn check(&self, args: &Args) -> Result<(), CudaError>;
    /// A one-line description (profiles, errors).
    fn describe(&self) -> String;
}

/// The bytes of a library module: per function, its calls in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LibraryModule<C> {
    pub functions: Vec<Vec<C>>,
}

impl<C: CallDesc> LibraryModule<C> {
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("a library module encodes")
    }

    /// Decodes and checks a module against its function list: every call's operands name existing arguments
    /// and stay inside them, its workspace inside the scratch.
    pub fn decode(m: &Module) -> Result<LibraryModule<C>, CudaError> {
        let what = format!("{} module of backend {}", m.format, m.backend);
        let d: LibraryModule<C> = postcard::from_bytes(&m.bytes).map_err(|e| CudaError::InvalidModule(format!("{what}: undecodable ({e})")))?;
        if d.functions.len() != m.functions.len() {
            return Err(CudaError::InvalidModule(format!("{what}: {} {} lists for {} functions", d.functions.len(), C::WHAT, m.functions.len())));
        }
        for (f, info) in d.functions.iter().zip(&m.functions) {
            for (i, c) in f.iter().enumerate() {
                c.check(&Args { info }).map_err(|e| CudaError::InvalidModule(format!("{what}: function '{}': {} {i}: {e}", info.symbol, C::WHAT)))?;
            }
        }
        Ok(d)
    }
}

/// A function's arguments `[inputs.., outputs.., scratch?]`, as calls are checked against them.
pub struct Args<'a> {
    pub info: &'a FunctionInfo,
}

impl Args<'_> {
    fn buffers(&self) -> usize {
        self.info.inputs.len() + self.info.outputs.len()
    }

    /// Bytes of argument `arg`.
    pub fn bytes(&self, arg: u32) -> Result<u64, CudaError> {
        let (i, info) = (arg as usize, self.info);
        if i < info.inputs.len() {
            Ok(info.inputs[i].size_bytes() as u64)
        } else if i < self.buffers() {
            Ok(info.outputs[i - info.inputs.len()].size_bytes() as u64)
        } else if i == self.buffers() && info.scratch_bytes > 0 {
            Ok(info.scratch_bytes)
        } else {
            Err(CudaError::InvalidModule(format!("argument {i} of a function with {} buffers", self.buffers())))
        }
    }

    /// Checks that operand `name` spans `bytes` (none: overflowed) inside its argument.
    pub fn operand(&self, name: &str, o: &Operand, bytes: Option<u64>) -> Result<(), CudaError> {
        let have = self.bytes(o.arg)?;
        if o.offset != 0 && (o.arg as usize) < self.buffers() {
            return Err(CudaError::InvalidModule(format!("{name}: only scratch takes offsets")));
        }
        match bytes.and_then(|b| b.checked_add(o.offset)) {
            Some(need) if need <= have => Ok(()),
            _ => Err(CudaError::InvalidModule(format!("{name} spans more than argument {}'s {have} bytes", o.arg))),
        }
    }

    /// Checks that a written operand is not an input.
    pub fn written(&self, name: &str, o: &Operand) -> Result<(), CudaError> {
        if (o.arg as usize) < self.info.inputs.len() {
            return Err(CudaError::InvalidModule(format!("{name} is an input")));
        }
        Ok(())
    }

    /// Checks that a workspace of `bytes` at `o` lies inside the scratch.
    pub fn workspace(&self, o: &Operand, bytes: u64) -> Result<(), CudaError> {
        match self.bytes(o.arg) {
            Ok(have) if o.arg as usize == self.buffers() && o.offset.checked_add(bytes).is_some_and(|e| e <= have) => Ok(()),
            _ => Err(CudaError::InvalidModule(format!("the workspace ({bytes} bytes at argument {} + {}) is not inside the scratch", o.arg, o.offset))),
        }
    }
}

/// Argument count of each function of `m` (`[inputs.., outputs.., scratch?]`).
pub fn arg_counts(m: &Module) -> Vec<usize> {
    m.functions.iter().map(|f| f.inputs.len() + f.outputs.len() + usize::from(f.scratch_bytes > 0)).collect()
}

/// The launches of function `index`: each of its calls prepared against the device addresses `args`.
pub fn prepare_function<C: CallDesc>(
    backend: &str,
    functions: &[Vec<C>],
    arg_counts: &[usize],
    index: usize,
    args: &[u64],
    prepare: impl Fn(usize, &C) -> Result<Arc<dyn LibraryCall>, CudaError>,
) -> Result<Vec<PreparedLaunch>, RuntimeError> {
    let calls = functions.get(index).ok_or_else(|| RuntimeError(format!("module of backend {backend}: no function {index}")))?;
    if args.len() != arg_counts[index] {
        return Err(RuntimeError(format!("module of backend {backend}: function {index} takes {} arguments, got {}", arg_counts[index], args.len())));
    }
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let call = prepare(i, c).map_err(|e| RuntimeError(format!("module of backend {backend}: function {index}: {} {i} ({}): {e}", C::WHAT, c.describe())))?;
            Ok(PreparedLaunch { entry: c.describe(), grid: [0; 3], block: [0; 3], shared_bytes: 0, op: LaunchOp::Library(call) })
        })
        .collect()
}
