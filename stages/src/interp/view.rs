//! Typed views of tensor bytes and the way back from typed vectors to tensors.
//!
//! Kernels compute in three domains, whatever the storage type: floats in `f32` (f16 and bf16 are widened
//! exactly and the result rounded once per op, to nearest even), integers in `i64` (i32 results are
//! narrowed with wrap-around, which is exact for +, -, *, / and % because two's-complement arithmetic
//! modulo 2^64 agrees with it modulo 2^32), and bools. Data movement ops (Transpose, Gather, Slice, ...)
//! never look at values: they move elements of 1, 2, 4 or 8 bytes bit for bit, so they are exact for
//! every dtype, NaN payloads included.
//!
//! Tensor bytes are little-endian; on a little-endian host a typed view of an aligned buffer is a
//! zero-copy cast (the weights of a large model are never copied to be read).

use super::{par, OpError};
use crate::ir::{DType, Tensor, TensorType};
use bytemuck::Pod;
use half::{bf16, f16};
use rayon::prelude::*;
use std::borrow::Cow;
use std::sync::Arc;

#[cfg(not(target_endian = "little"))]
compile_error!("the reference interpreter reads tensor bytes (little-endian) in place: it needs a little-endian host");

/// The bytes as a slice of `T`: borrowed when aligned, copied otherwise (a copy is always correct,
/// alignment only decides whether one is needed).
pub(crate) fn pod<T: Pod>(bytes: &[u8]) -> Cow<'_, [T]> {
    match bytemuck::try_cast_slice(bytes) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => {
            let mut v = vec![T::zeroed(); bytes.len() / std::mem::size_of::<T>()];
            bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(bytes);
            Cow::Owned(v)
        }
    }
}

/// Every element as f32: f32 borrowed, f16/bf16 widened exactly, integers and bools converted.
pub(crate) fn floats(t: &Tensor) -> Cow<'_, [f32]> {
    let b = t.bytes();
    match t.dtype() {
        DType::F32 => pod::<f32>(b),
        DType::F16 => Cow::Owned(par::map(&pod::<u16>(b), |&x| f16::from_bits(x).to_f32())),
        DType::BF16 => Cow::Owned(par::map(&pod::<u16>(b), |&x| bf16::from_bits(x).to_f32())),
        DType::I64 => Cow::Owned(pod::<i64>(b).iter().map(|&x| x as f32).collect()),
        DType::I32 => Cow::Owned(pod::<i32>(b).iter().map(|&x| x as f32).collect()),
        DType::Bool => Cow::Owned(b.iter().map(|&x| (x != 0) as u8 as f32).collect()),
    }
}

/// Every element as i64: i64 borrowed, i32 sign-extended, bools 0/1, floats through [`float_to_int`].
pub(crate) fn ints(t: &Tensor) -> Cow<'_, [i64]> {
    let b = t.bytes();
    match t.dtype() {
        DType::I64 => pod::<i64>(b),
        DType::I32 => Cow::Owned(pod::<i32>(b).iter().map(|&x| x as i64).collect()),
        DType::Bool => Cow::Owned(b.iter().map(|&x| (x != 0) as i64).collect()),
        DType::F32 | DType::F16 | DType::BF16 => {
            Cow::Owned(floats(t).iter().map(|&x| float_to_int(x as f64, DType::I64)).collect())
        }
    }
}

/// Every element as bool (any non-zero byte, or non-zero number, is true).
pub(crate) fn bools(t: &Tensor) -> Cow<'_, [bool]> {
    match t.dtype() {
        DType::Bool => Cow::Owned(t.bytes().iter().map(|&x| x != 0).collect()),
        d if d.is_float() => Cow::Owned(floats(t).iter().map(|&x| x != 0.0).collect()),
        _ => Cow::Owned(ints(t).iter().map(|&x| x != 0).collect()),
    }
}

/// Float to integer as ONNX Runtime does on x86-64: truncation toward zero; NaN and values out of the
/// target's range give the "integer indefinite" value (the target's minimum), which is what `cvttss2si`
/// returns and what ORT's `static_cast` yields there. Rust's `as` would saturate instead.
pub(crate) fn float_to_int(x: f64, to: DType) -> i64 {
    let t = x.trunc();
    match to {
        DType::I32 => {
            if t.is_nan() || t < i32::MIN as f64 || t > i32::MAX as f64 {
                i32::MIN as i64
            } else {
                t as i64
            }
        }
        _ => {
            // 2^63 is exactly representable; i64::MAX is not, so compare against 2^63.
            if t.is_nan() || !(-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&t) {
                i64::MIN
            } else {
                t as i64
            }
        }
    }
}

fn tensor_of(ty: TensorType, bytes: impl Into<Arc<[u8]>>) -> Result<Tensor, OpError> {
    Tensor::from_bytes(ty, bytes).map_err(|e| OpError::new(format!("internal error: {e}")))
}

/// `bytes` copied once into the shared buffer a tensor holds (in parallel where large).
fn shared_copy(bytes: &[u8]) -> Arc<[u8]> {
    const CHUNK: usize = 4 * par::GRAIN;
    if !par::worth(bytes.len() / 4) {
        return Arc::from(bytes);
    }
    let mut buf = Arc::<[u8]>::new_uninit_slice(bytes.len());
    let dst = Arc::get_mut(&mut buf).expect("a fresh buffer has one owner");
    let at = par::SharedMut(dst.as_mut_ptr().cast::<u8>());
    bytes.par_chunks(CHUNK).enumerate().for_each(|(i, src)| {
        // SAFETY: chunk i of `dst` is `src.len()` bytes at `i * CHUNK`, inside `dst` (same length as
        // `bytes`), written by this task alone; `src` and `dst` do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), at.get().add(i * CHUNK), src.len()) }
    });
    // SAFETY: the chunks cover every byte of `dst`.
    unsafe { buf.assume_init() }
}

/// A tensor of `dtype` holding `values` bit for bit (`T` must have the dtype's size).
pub(crate) fn from_pod<T: Pod>(dtype: DType, shape: &[usize], values: &[T]) -> Result<Tensor, OpError> {
    tensor_of(TensorType::new(dtype, shape), shared_copy(bytemuck::cast_slice(values)))
}

/// A float tensor from f32 results, rounded to `dtype` (nearest even for f16 and bf16).
pub(crate) fn from_floats(dtype: DType, shape: &[usize], values: &[f32]) -> Result<Tensor, OpError> {
    match dtype {
        DType::F32 => from_pod(dtype, shape, values),
        DType::F16 => from_pod(dtype, shape, &par::map(values, |&x| f16::from_f32(x).to_bits())),
        DType::BF16 => from_pod(dtype, shape, &par::map(values, |&x| bf16::from_f32(x).to_bits())),
        d => Err(OpError::new(format!("internal error: float result stored as {d}"))),
    }
}

/// An integer tensor from i64 results (i32 narrowed with wrap-around).
pub(crate) fn from_ints(dtype: DType, shape: &[usize], values: &[i64]) -> Result<Tensor, OpError> {
    match dtype {
        DType::I64 => from_pod(dtype, shape, values),
        DType::I32 => from_pod(dtype, shape, &values.iter().map(|&x| x as i32).collect::<Vec<i32>>()),
        d => Err(OpError::new(format!("internal error: integer result stored as {d}"))),
    }
}

pub(crate) fn from_bools(shape: &[usize], values: &[bool]) -> Result<Tensor, OpError> {
    tensor_of(TensorType::new(DType::Bool, shape), values.iter().map(|&b| b as u8).collect::<Vec<u8>>())
}

/// Runs `$body` with `$T` bound to the unsigned integer type of the dtype's element size, for ops that
/// move elements without looking at them.
macro_rules! with_elem {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype.size() {
            1 => {
                type $T = u8;
                $body
            }
            2 => {
                type $T = u16;
                $body
            }
            4 => {
                type $T = u32;
                $body
            }
            _ => {
                type $T = u64;
                $body
            }
        }
    };
}
pub(crate) use with_elem;

#[cfg(test)]
#[path = "view_tests.rs"]
mod tests;
