//! Memory the runtime hands to kernels: every buffer (arena, constants, scratch) is allocated here, so the
//! one place to change for device memory is this file. A GPU runtime adds a device buffer type with the same
//! three operations (allocate zeroed, copy in, copy out) and hands kernels its device pointers.

use super::RuntimeError;
use crate::artifact::ALIGN;
use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// Zero-initialized host memory aligned to [`ALIGN`] (64) bytes, as the calling convention requires.
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: the buffer owns its allocation exclusively; moving it between threads moves that ownership, and
// shared references only allow reads.
unsafe impl Send for HostBuffer {}
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Allocates `len` zero bytes (at least one cache line is reserved, so even an empty buffer has a
    /// distinct, aligned address). `what` names the buffer in the error if memory runs out.
    pub fn zeroed(len: u64, what: &str) -> Result<HostBuffer, RuntimeError> {
        let too_big = || RuntimeError(format!("{what}: cannot allocate {len} bytes"));
        let size = usize::try_from(len).map_err(|_| too_big())?.max(ALIGN as usize);
        let layout = Layout::from_size_align(size, ALIGN as usize).map_err(|_| too_big())?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) }).ok_or_else(too_big)?;
        Ok(HostBuffer { ptr, len: len as usize, layout })
    }

    /// Allocates a buffer holding a copy of `bytes`.
    pub fn from_bytes(bytes: &[u8], what: &str) -> Result<HostBuffer, RuntimeError> {
        let mut b = Self::zeroed(bytes.len() as u64, what)?;
        b.as_mut_slice().copy_from_slice(bytes);
        Ok(b)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The base address. Pointers derived from it stay valid as long as the buffer lives, wherever the
    /// `HostBuffer` value itself moves.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` bytes from `ptr` are allocated and initialized (zeroed at allocation).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
#[path = "buffer_tests.rs"]
mod tests;
