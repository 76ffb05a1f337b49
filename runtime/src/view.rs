//! Borrowed tensors: what a run reads its inputs from and writes caller-provided outputs into. A view is a
//! dtype, a shape and little-endian bytes; nothing is checked when it is made, everything when it is passed
//! to a run, where the error can name the input or output.

use tessera_kernels::{DType, Tensor};

// Typed views reinterpret element slices as their bytes, which are the artifact's little-endian layout only
// on a little-endian machine.
#[cfg(target_endian = "big")]
compile_error!("tessera-runtime supports little-endian machines only (artifacts are little-endian)");

mod sealed {
    pub trait Sealed {}
}

/// An element type a typed view can be made of: its [`DType`], and its in-memory bytes are exactly the
/// artifact's encoding (plain little-endian values; `bool` is one byte, 0 or 1).
pub trait Element: sealed::Sealed + Copy + 'static {
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}

element!(f32 => F32, i64 => I64, i32 => I32, bool => Bool);

/// A borrowed input: dtype, shape and bytes.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    pub(crate) dtype: DType,
    pub(crate) shape: &'a [usize],
    pub(crate) data: &'a [u8],
}

impl<'a> TensorView<'a> {
    /// A view of raw little-endian bytes of `dtype`.
    pub fn from_bytes(dtype: DType, shape: &'a [usize], data: &'a [u8]) -> TensorView<'a> {
        TensorView { dtype, shape, data }
    }

    /// A view of typed elements (`f32`, `i64`, `i32`, `bool`), in row-major order.
    pub fn from_slice<T: Element>(shape: &'a [usize], data: &'a [T]) -> TensorView<'a> {
        // SAFETY: `Element` types are plain values without padding; their bytes are readable as u8.
        let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) };
        TensorView { dtype: T::DTYPE, shape, data: bytes }
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn shape(&self) -> &[usize] {
        self.shape
    }

    pub fn bytes(&self) -> &[u8] {
        self.data
    }
}

impl<'a> From<&'a Tensor> for TensorView<'a> {
    /// A view of a tensor (an output of another run, say).
    fn from(t: &'a Tensor) -> TensorView<'a> {
        TensorView { dtype: t.ty.dtype, shape: &t.ty.shape, data: t.bytes() }
    }
}

/// A borrowed output buffer a run writes into: dtype, shape and bytes.
#[derive(Debug)]
pub struct TensorViewMut<'a> {
    pub(crate) dtype: DType,
    pub(crate) shape: &'a [usize],
    pub(crate) data: &'a mut [u8],
}

impl<'a> TensorViewMut<'a> {
    /// A buffer of raw little-endian bytes of `dtype`.
    pub fn from_bytes(dtype: DType, shape: &'a [usize], data: &'a mut [u8]) -> TensorViewMut<'a> {
        TensorViewMut { dtype, shape, data }
    }

    /// A buffer of typed elements (`f32`, `i64`, `i32`; not `bool`, whose bytes must stay 0 or 1).
    pub fn from_slice<T: Element + Writable>(shape: &'a [usize], data: &'a mut [T]) -> TensorViewMut<'a> {
        // SAFETY: `Writable` types are plain values for which every bit pattern is valid, so writing any
        // bytes into them leaves valid values.
        let bytes = unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(data)) };
        TensorViewMut { dtype: T::DTYPE, shape, data: bytes }
    }
}

/// Element types every byte pattern is a valid value of (so a run may write any bytes into them).
pub trait Writable: Element {}
impl Writable for f32 {}
impl Writable for i64 {}
impl Writable for i32 {}
