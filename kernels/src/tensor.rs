//! Tensor types (dtype + static shape) and constant tensor data.

use crate::dtype::DType;
use half::{bf16, f16};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::{Arc, OnceLock};

/// The static type of a value: element type and shape. Every shape in the IR is static; importers resolve
/// symbolic dimensions (from `--shape` or the model) before a graph is built.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl TensorType {
    pub fn new(dtype: DType, shape: impl Into<Vec<usize>>) -> Self {
        TensorType { dtype, shape: shape.into() }
    }

    pub fn f32(shape: impl Into<Vec<usize>>) -> Self {
        Self::new(DType::F32, shape)
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn size_bytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str("x")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// A constant tensor: its type and its little-endian bytes. The bytes are shared (`Arc`), so cloning a graph
/// or handing weights to a backend never copies them; the digest is computed once and shared by the clones
/// (hashing BERT-base's weights costs a fraction of a second, and every stage key needs them).
#[derive(Clone)]
pub struct Tensor {
    pub ty: TensorType,
    data: Arc<[u8]>,
    digest: Arc<OnceLock<[u8; 32]>>,
}

impl PartialEq for Tensor {
    fn eq(&self, other: &Self) -> bool {
        self.ty == other.ty && self.data == other.data
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({}, {} bytes)", self.ty, self.data.len())
    }
}

/// Error for a byte buffer whose length does not match its declared type.
#[derive(Debug, thiserror::Error)]
#[error("tensor of type {ty} needs {expected} bytes, got {got}")]
pub struct TensorSizeError {
    pub ty: TensorType,
    pub expected: usize,
    pub got: usize,
}

impl Tensor {
    /// Wraps raw little-endian bytes; the length must match the type exactly.
    pub fn from_bytes(ty: TensorType, data: impl Into<Arc<[u8]>>) -> Result<Self, TensorSizeError> {
        let data = data.into();
        let expected = ty.size_bytes();
        if data.len() != expected {
            return Err(TensorSizeError { ty, expected, got: data.len() });
        }
        Ok(Tensor { ty, data, digest: Arc::default() })
    }

    pub fn from_f32(shape: impl Into<Vec<usize>>, values: &[f32]) -> Self {
        let ty = TensorType::f32(shape);
        assert_eq!(ty.numel(), values.len(), "from_f32: shape and data length differ");
        Tensor { ty, data: values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>().into(), digest: Arc::default() }
    }

    pub fn from_i64(shape: impl Into<Vec<usize>>, values: &[i64]) -> Self {
        let ty = TensorType::new(DType::I64, shape);
        assert_eq!(ty.numel(), values.len(), "from_i64: shape and data length differ");
        Tensor { ty, data: values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>().into(), digest: Arc::default() }
    }

    pub fn from_i32(shape: impl Into<Vec<usize>>, values: &[i32]) -> Self {
        let ty = TensorType::new(DType::I32, shape);
        assert_eq!(ty.numel(), values.len(), "from_i32: shape and data length differ");
        Tensor { ty, data: values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>().into(), digest: Arc::default() }
    }

    pub fn from_bool(shape: impl Into<Vec<usize>>, values: &[bool]) -> Self {
        let ty = TensorType::new(DType::Bool, shape);
        assert_eq!(ty.numel(), values.len(), "from_bool: shape and data length differ");
        Tensor { ty, data: values.iter().map(|&b| b as u8).collect::<Vec<u8>>().into(), digest: Arc::default() }
    }

    /// Builds a tensor of `dtype` from f64 values, rounding to the element type (used by folding and tests).
    pub fn from_f64_as(dtype: DType, shape: impl Into<Vec<usize>>, values: &[f64]) -> Self {
        let ty = TensorType::new(dtype, shape);
        assert_eq!(ty.numel(), values.len(), "from_f64_as: shape and data length differ");
        let mut data = Vec::with_capacity(ty.size_bytes());
        for &v in values {
            match dtype {
                DType::F32 => data.extend_from_slice(&(v as f32).to_le_bytes()),
                DType::F16 => data.extend_from_slice(&f16::from_f64(v).to_le_bytes()),
                DType::BF16 => data.extend_from_slice(&bf16::from_f64(v).to_le_bytes()),
                DType::I64 => data.extend_from_slice(&(v as i64).to_le_bytes()),
                DType::I32 => data.extend_from_slice(&(v as i32).to_le_bytes()),
                DType::Bool => data.push((v != 0.0) as u8),
            }
        }
        Tensor { ty, data: data.into(), digest: Arc::default() }
    }

    pub fn scalar_f32(v: f32) -> Self {
        Self::from_f32(Vec::new(), &[v])
    }

    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    pub fn shape(&self) -> &[usize] {
        &self.ty.shape
    }

    pub fn numel(&self) -> usize {
        self.ty.numel()
    }

    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    pub fn shared_bytes(&self) -> Arc<[u8]> {
        self.data.clone()
    }

    /// Same bytes, new shape (the element count must match).
    pub fn reshaped(&self, shape: impl Into<Vec<usize>>) -> Self {
        let ty = TensorType::new(self.ty.dtype, shape);
        assert_eq!(ty.numel(), self.numel(), "reshaped: element count differs");
        Tensor { ty, data: self.data.clone(), digest: Arc::default() }
    }

    /// blake3 digest of the type and the bytes: how constants are named in hashes, the store and artifacts.
    pub fn digest(&self) -> [u8; 32] {
        *self.digest.get_or_init(|| {
            let mut h = blake3::Hasher::new();
            h.update(b"tessera.tensor.v1");
            h.update(&postcard::to_stdvec(&self.ty).expect("tensor type encodes"));
            h.update(&self.data);
            *h.finalize().as_bytes()
        })
    }

    /// Every element converted to f64 (exact for all supported types except i64 beyond 2^53).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        let b = &self.data;
        match self.ty.dtype {
            DType::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
            DType::F16 => b.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
            DType::BF16 => b.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
            DType::I64 => b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
            DType::I32 => b.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
            DType::Bool => b.iter().map(|&x| (x != 0) as u8 as f64).collect(),
        }
    }

    /// Every element as f32 (floats converted, integers and bools cast).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match self.ty.dtype {
            DType::F32 => self.data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
            _ => self.to_f64_vec().into_iter().map(|v| v as f32).collect(),
        }
    }

    /// Every element as i64 (floats truncated toward zero), exact for integer types.
    pub fn to_i64_vec(&self) -> Vec<i64> {
        let b = &self.data;
        match self.ty.dtype {
            DType::I64 => b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect(),
            DType::I32 => b.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64).collect(),
            DType::Bool => b.iter().map(|&x| (x != 0) as i64).collect(),
            _ => self.to_f64_vec().into_iter().map(|v| v as i64).collect(),
        }
    }
}
