//! Runs from device memory the caller owns (issue 14: "in Rust and C also from device pointers the caller
//! owns"): inputs copied device to device into the engine's arena, outputs copied device to device out of it,
//! all on the engine's stream, so a caller whose tensors already live on the GPU pays no trip through the
//! host. A child module of `engine` so that it reaches the engine's staging tables without widening them.

use super::super::device;
use super::{gpu, DeviceEngine};
use crate::runtime::RuntimeError;
use cudarc::driver::{result, sys};

/// Checks that `[ptr, ptr + bytes)` lies inside one allocation of the current context (the driver's own
/// record of it), so a wrong pointer or a buffer too small is an error naming `what`, not a copy into
/// someone else's memory.
fn check_range(what: &str, ptr: u64, bytes: usize) -> Result<(), RuntimeError> {
    let (mut base, mut size) = (0 as sys::CUdeviceptr, 0usize);
    // SAFETY: two out-parameters; the driver is loaded (the engine's context exists and is bound).
    unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) }
        .result()
        .map_err(|e| RuntimeError(format!("{what}: {ptr:#x} is not device memory of the model's GPU: {}", device::error(e))))?;
    let end = ptr.checked_add(bytes as u64);
    if end.is_none_or(|end| end > base + size as u64) {
        return Err(RuntimeError(format!("{what}: needs {bytes} bytes at {ptr:#x}, but its allocation ({base:#x}, {size} bytes) ends {} bytes after it", base + size as u64 - ptr)));
    }
    Ok(())
}

impl DeviceEngine {
    /// One run from caller-owned device memory: `inputs[i]` is `(name, CUdeviceptr)` of input `i` (model
    /// order, exactly its type's size), and each `outputs[o]` given receives output `o`. Every pointer is
    /// checked to lie inside one allocation of the model's GPU with room for its tensor. The copies and the
    /// graph replay run on the engine's stream.
    ///
    /// With `caller: None`, the engine's stream is synchronized before returning: the caller must have
    /// finished writing the inputs before the call (the engine's stream does not wait for the caller's), and
    /// may read the outputs as soon as it returns. With `caller: Some(stream)` (a `CUstream` of the model's GPU's
    /// context), the run is ordered on that stream and asynchronous: the engine's stream waits for what the
    /// caller enqueued on it before (an event), and the caller's stream waits for the outputs' copies (another
    /// event), so work the caller enqueues after the call sees the outputs; the call returns once the work is
    /// enqueued. The session's arena is reused safely by its next run, whose copies queue behind this run's on
    /// the engine's stream. A plan with host steps cannot be asynchronous: it synchronizes as without a stream.
    ///
    /// # Safety
    /// Every pointer is device memory the caller owns, holding (inputs) or receiving (outputs) the tensor, and
    /// no other work reads or writes it until the run is over (with a stream: until the caller's stream
    /// reaches the point of the call); outputs do not overlap each other or any input; `caller` is a live
    /// stream of the model's GPU's context.
    pub unsafe fn run_device(&mut self, inputs: &[(&str, u64)], outputs: &[Option<(&str, u64)>], caller: Option<sys::CUstream>) -> Result<(), RuntimeError> {
        self.ctx.bind_to_thread().map_err(gpu)?;
        for ((name, ptr), st) in inputs.iter().zip(&self.inputs) {
            if st.bytes > 0 {
                check_range(&format!("input '{name}'"), *ptr, st.bytes)?;
            }
        }
        for ((name, ptr), (st, _, _)) in outputs.iter().zip(&self.outputs).filter_map(|(o, s)| o.map(|o| (o, s))) {
            if st.bytes > 0 {
                check_range(&format!("output '{name}'"), ptr, st.bytes)?;
            }
        }
        let stream = self.stream.cu_stream();
        if self.host.is_some() {
            // The stream may still be copying the previous run's values out of the host arena: wait first.
            self.stream.synchronize().map_err(gpu)?;
        }
        if let Some(caller) = caller {
            // What the caller enqueued before the call (writing the inputs, say) comes first.
            // SAFETY: the caller's live stream (its promise) and ours, both of the bound context.
            unsafe { order_after(stream, caller) }?;
        }
        for ((_, ptr), st) in inputs.iter().zip(&self.inputs) {
            if st.bytes == 0 {
                continue;
            }
            // SAFETY: the source was checked to hold `bytes` (and is the caller's to read); the destination is
            // the input's slot of our arena.
            unsafe { result::memcpy_dtod_async(st.device, *ptr, st.bytes, stream) }.map_err(gpu)?;
            if let Some(h) = &mut self.host {
                // Host steps of a mixed plan may read the input too: the host arena gets it as well, before
                // any host segment runs (each synchronizes the stream first).
                let dst = h.arena.slice(st.arena, st.bytes);
                // SAFETY: the pinned slice stays alive and untouched until the stream is synchronized.
                unsafe { result::memcpy_dtoh_async(dst, *ptr, stream) }.map_err(gpu)?;
            }
        }
        self.replay()?;
        for (out, (st, _, on_host)) in outputs.iter().zip(&self.outputs) {
            let (Some((_, ptr)), true) = (out, st.bytes > 0) else { continue };
            match (&mut self.host, *on_host) {
                // A value a host step wrote lives in the host arena (the replay synchronized after it).
                (Some(h), true) => {
                    let src = h.arena.slice(st.arena, st.bytes);
                    // SAFETY: the destination was checked to have room; the pinned source stays untouched
                    // until the stream is synchronized below.
                    unsafe { result::memcpy_htod_async(*ptr, &*src, stream) }.map_err(gpu)?;
                }
                // SAFETY: the destination was checked to have room; the source is the output's buffer in our
                // arena, written by the replay enqueued before on this stream.
                _ => unsafe { result::memcpy_dtod_async(*ptr, st.device, st.bytes, stream) }.map_err(gpu)?,
            }
        }
        match caller {
            // SAFETY: as above; the caller's stream now waits for the outputs' copies.
            Some(caller) if self.host.is_none() => unsafe { order_after(caller, stream) },
            _ => self.stream.synchronize().map_err(|e| RuntimeError(format!("a kernel or a copy failed: {}", device::error(e)))),
        }
    }
}

/// Makes `waiter` wait for the work enqueued on `first` so far: an event recorded there, waited on here, and
/// destroyed (the driver frees it once it has completed).
///
/// # Safety
/// Both are live streams of the current context.
unsafe fn order_after(waiter: sys::CUstream, first: sys::CUstream) -> Result<(), RuntimeError> {
    let mut event: sys::CUevent = std::ptr::null_mut();
    // SAFETY: an out-parameter, then the event just made, on the caller's streams (the function's contract).
    unsafe {
        sys::cuEventCreate(&mut event, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32).result().map_err(gpu)?;
        let ordered = sys::cuEventRecord(event, first).result().and_then(|_| sys::cuStreamWaitEvent(waiter, event, 0).result());
        sys::cuEventDestroy_v2(event).result().map_err(gpu)?;
        ordered.map_err(|e| RuntimeError(format!("cannot order the run after the caller's stream: {}", device::error(e))))
    }
}
