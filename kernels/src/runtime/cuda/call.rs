//! Running one function of a loaded GPU module on host tensors, once: what tests need to check a single
//! generated kernel against the reference interpreter on the GPU without linking a whole artifact.
//!
//! The buffers (inputs, outputs, scratch, each 256-byte aligned as the linker lays them out) are one fresh
//! allocation; outputs and scratch are filled with 0xff bytes first (NaN in every float type), so an
//! element the function fails to write shows up in the comparison rather than passing as a stale zero.

use super::device::{self, align256, DeviceAlloc};
use crate::module::FunctionInfo;
use crate::runtime::{LoadedModule, RuntimeError};
use crate::tensor::Tensor;
use cudarc::driver::result;

/// Runs function `index` of the GPU module `module` (signature `info`) on `inputs` and returns its outputs.
pub fn call_gpu_function(module: &dyn LoadedModule, index: usize, info: &FunctionInfo, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
    let fail = |msg: String| RuntimeError(format!("running GPU function '{}': {msg}", info.symbol));
    let g = |e: cudarc::driver::DriverError| fail(device::error(e));
    if inputs.len() != info.inputs.len() {
        return Err(fail(format!("it takes {} inputs, got {}", info.inputs.len(), inputs.len())));
    }
    for (i, (t, want)) in inputs.iter().zip(&info.inputs).enumerate() {
        if &t.ty != want {
            return Err(fail(format!("input {i} is {}, the function takes {want}", t.ty)));
        }
    }
    let gpu = module.gpu().ok_or_else(|| fail("its module is not a GPU module".to_string()))?;
    let ctx = device::context().map_err(|e| fail(e.to_string()))?;
    ctx.bind_to_thread().map_err(g)?;
    let sizes: Vec<u64> = inputs
        .iter()
        .map(|t| t.bytes().len() as u64)
        .chain(info.outputs.iter().map(|t| t.size_bytes() as u64))
        .chain((info.scratch_bytes > 0).then_some(info.scratch_bytes))
        .collect();
    let offsets: Vec<u64> = sizes.iter().scan(0, |at, &s| { let o = *at; *at += align256(s.max(1)); Some(o) }).collect();
    let total = offsets.last().zip(sizes.last()).map_or(256, |(o, s)| o + align256((*s).max(1)));
    let memory = DeviceAlloc::new(&ctx, total as usize).map_err(|e| fail(e.to_string()))?;
    // SAFETY: every copy lies inside the allocation, laid out above; synchronous copies.
    unsafe {
        result::memset_d8_sync(memory.ptr, 0xff, total as usize).map_err(g)?;
        for (t, off) in inputs.iter().zip(&offsets) {
            if !t.bytes().is_empty() {
                result::memcpy_htod_sync(memory.ptr + off, t.bytes()).map_err(g)?;
            }
        }
    }
    let args: Vec<u64> = offsets.iter().map(|o| memory.ptr + o).collect();
    let launches = gpu.launches(index, &args)?;
    let stream = ctx.new_stream().map_err(g)?;
    for l in &launches {
        // SAFETY: the parameters point into `memory`, laid out from `info` as the module expects.
        unsafe { l.enqueue(stream.cu_stream()) }.map_err(|e| fail(format!("launching {}: {e}", l.entry)))?;
    }
    stream.synchronize().map_err(g)?;
    let n_in = inputs.len();
    info.outputs
        .iter()
        .enumerate()
        .map(|(j, ty)| {
            let mut bytes = vec![0u8; ty.size_bytes()];
            if !bytes.is_empty() {
                // SAFETY: output j's buffer holds `size_bytes` bytes at its offset; the stream is idle.
                unsafe { result::memcpy_dtoh_sync(&mut bytes, memory.ptr + offsets[n_in + j]) }.map_err(g)?;
            }
            Tensor::from_bytes(ty.clone(), bytes).map_err(|e| fail(format!("output {j}: {e}")))
        })
        .collect()
}
