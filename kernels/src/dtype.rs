//! Element types of tensors in the IR.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Element type of a tensor. The set is the one the compiler supports end to end; ONNX types outside it
/// are rejected at import with an error naming the tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum DType {
    F32,
    F16,
    BF16,
    I64,
    I32,
    Bool,
}

impl DType {
    /// Size of one element in bytes (bool is stored as one byte, 0 or 1).
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::Bool => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I64 | DType::I32)
    }

    /// The lower-case name used in manifests, CLI flags and reports.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::Bool => "bool",
        }
    }

    pub fn parse(s: &str) -> Option<DType> {
        Some(match s {
            "f32" | "float32" | "float" => DType::F32,
            "f16" | "float16" | "half" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "i64" | "int64" => DType::I64,
            "i32" | "int32" => DType::I32,
            "bool" => DType::Bool,
            _ => return None,
        })
    }

    pub const ALL: [DType; 6] = [DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::Bool];
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
