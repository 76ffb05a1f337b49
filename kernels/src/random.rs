//! Seeded random tensors: the values `tessera run` and `tessera bench` feed inputs the user did not give,
//! and what the compiler's measurements and tests feed kernels. The distribution and the integer bounds
//! are documented in the compiler's `interp::random` (which adds the per-graph bounds); the values are a
//! function of (seed, stream) only, so a run can be reproduced from its seed, and never all zeros, so a
//! benchmark never times a degenerate case.

use crate::dtype::DType;
use crate::tensor::{Tensor, TensorType};
use chacha20::ChaCha20Rng;
use half::{bf16, f16};
use rand_core::{Rng, SeedableRng};

/// Exclusive upper bound of random integer inputs when nothing in the graph asks for less.
pub const INT_INPUT_BOUND: i64 = 100;

fn float_draw(rng: &mut ChaCha20Rng) -> f32 {
    loop {
        let k = rng.next_u32() >> 8;
        if k != 1 << 23 {
            return k as f32 * 2f32.powi(-23) - 1.0;
        }
    }
}

/// One random tensor of type `ty` from stream `stream` of `seed`; integers in [0, int_bound).
pub fn random_tensor(ty: &TensorType, seed: u64, stream: u64, int_bound: i64) -> Tensor {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    let n = ty.numel();
    let bound = int_bound.clamp(1, u32::MAX as i64) as u64;
    let mut bytes: Vec<u8> = Vec::with_capacity(ty.size_bytes());
    for _ in 0..n {
        match ty.dtype {
            DType::F32 => bytes.extend(float_draw(&mut rng).to_le_bytes()),
            DType::F16 => bytes.extend(f16::from_f32(float_draw(&mut rng)).to_bits().to_le_bytes()),
            DType::BF16 => bytes.extend(bf16::from_f32(float_draw(&mut rng)).to_bits().to_le_bytes()),
            DType::I64 => bytes.extend((((rng.next_u32() as u64 * bound) >> 32) as i64).to_le_bytes()),
            DType::I32 => bytes.extend((((rng.next_u32() as u64 * bound) >> 32) as i32).to_le_bytes()),
            DType::Bool => bytes.push((rng.next_u32() & 1) as u8),
        }
    }
    // One element per draw of the type's size: the length always matches.
    Tensor::from_bytes(ty.clone(), bytes).unwrap_or_else(|e| unreachable!("random_tensor: {e}"))
}

/// A random padding mask of integer type `ty` from stream `stream` of `seed`: along the last axis, each row
/// is 1 for a run of random length (1 to the axis length, uniform) and 0 after it, as tokenizers pad a batch.
pub fn random_mask(ty: &TensorType, seed: u64, stream: u64) -> Tensor {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    let len = ty.shape.last().copied().unwrap_or(1).max(1);
    let rows = ty.numel() / len;
    let mut bytes: Vec<u8> = Vec::with_capacity(ty.size_bytes());
    for _ in 0..rows {
        let ones = 1 + ((rng.next_u32() as u64 * len as u64) >> 32) as usize;
        for j in 0..len {
            let v = (j < ones) as i64;
            match ty.dtype {
                DType::I64 => bytes.extend(v.to_le_bytes()),
                DType::I32 => bytes.extend((v as i32).to_le_bytes()),
                DType::Bool => bytes.push(v as u8),
                d => unreachable!("random_mask: {d} is not an integer or bool type"),
            }
        }
    }
    Tensor::from_bytes(ty.clone(), bytes).unwrap_or_else(|e| unreachable!("random_mask: {e}"))
}
