//! ONNX `TensorProto` -> IR [`Tensor`]: element types, the typed and raw data fields, and external data files.
//!
//! Element types: FLOAT, FLOAT16, BFLOAT16, INT64, INT32 and BOOL map one to one onto the IR's dtypes. Every
//! other type (DOUBLE, UINT8, INT8, STRING, ...) is rejected with an error naming the tensor: the IR has no
//! such dtype, and a silent conversion (DOUBLE to FLOAT, UINT8 to INT32) would change the results of
//! arithmetic that wraps or rounds, so no such mapping is made.

use super::error::ImportErrorKind;
use super::proto::{tensor_proto, TensorProto};
use crate::ir::{DType, Tensor, TensorType};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path};

/// The ONNX name of a `TensorProto.DataType` code ("FLOAT", "DOUBLE", ... or "code N" when unknown).
pub fn onnx_type_name(code: i32) -> String {
    match tensor_proto::DataType::try_from(code) {
        Ok(d) => d.as_str_name().to_string(),
        Err(_) => format!("code {code}"),
    }
}

/// Maps an ONNX element type onto the IR's. `what` names the tensor in the error.
pub fn dtype_from_onnx(code: i32, what: &str) -> Result<DType, ImportErrorKind> {
    use tensor_proto::DataType as D;
    match D::try_from(code) {
        Ok(D::Float) => Ok(DType::F32),
        Ok(D::Float16) => Ok(DType::F16),
        Ok(D::Bfloat16) => Ok(DType::BF16),
        Ok(D::Int64) => Ok(DType::I64),
        Ok(D::Int32) => Ok(DType::I32),
        Ok(D::Bool) => Ok(DType::Bool),
        _ => {
            let name = onnx_type_name(code);
            Err(ImportErrorKind::Unsupported {
                what: format!("dtype {name}"),
                detail: format!("{what} has element type {name}; supported: FLOAT, FLOAT16, BFLOAT16, INT64, INT32, BOOL"),
            })
        }
    }
}

/// The ONNX code of an IR dtype (for writing tensors back, e.g. in tests).
pub fn dtype_to_onnx(d: DType) -> i32 {
    use tensor_proto::DataType as D;
    (match d {
        DType::F32 => D::Float,
        DType::F16 => D::Float16,
        DType::BF16 => D::Bfloat16,
        DType::I64 => D::Int64,
        DType::I32 => D::Int32,
        DType::Bool => D::Bool,
    }) as i32
}

fn invalid(msg: String) -> ImportErrorKind {
    ImportErrorKind::Invalid(msg)
}

/// Decodes a tensor. `base_dir` is the directory of the model file, against which external data locations
/// are resolved; `None` (a model given as bytes) makes external data an error.
pub fn tensor_from_proto(t: &TensorProto, base_dir: Option<&Path>) -> Result<Tensor, ImportErrorKind> {
    let name = t.name.clone().unwrap_or_default();
    let what = if name.is_empty() { "an unnamed tensor".to_string() } else { format!("tensor '{name}'") };
    let code = t.data_type.unwrap_or(0);
    let dtype = dtype_from_onnx(code, &what)?;
    let mut shape = Vec::with_capacity(t.dims.len());
    for &d in &t.dims {
        if d < 0 {
            return Err(invalid(format!("{what} has a negative dimension {d} in {:?}", t.dims)));
        }
        shape.push(d as usize);
    }
    let ty = TensorType::new(dtype, shape);
    let numel = t.dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d as usize));
    let Some(numel) = numel.filter(|n| n.checked_mul(dtype.size()).is_some()) else {
        return Err(invalid(format!("{what} of dims {:?} is too large", t.dims)));
    };
    if t.segment.is_some() {
        return Err(ImportErrorKind::Unsupported {
            what: "segmented tensor".into(),
            detail: format!("{what} is stored in segments"),
        });
    }
    let external = t.data_location == Some(tensor_proto::DataLocation::External as i32);
    // Raw data is copied once, from the file's bytes into the tensor's shared buffer (a `Vec` on the way
    // was a second copy: the peak of a 500 MB model's import).
    let bytes: std::sync::Arc<[u8]> = if external {
        read_external(t, &what, ty.size_bytes(), base_dir)?.into()
    } else if let Some(raw) = &t.raw_data {
        std::sync::Arc::from(&raw[..])
    } else {
        typed_data(t, dtype, numel, &what)?.into()
    };
    Tensor::from_bytes(ty, bytes).map_err(|e| invalid(format!("{what}: {e}")))
}

/// The data of a tensor stored in the type-specific repeated fields.
fn typed_data(t: &TensorProto, dtype: DType, numel: usize, what: &str) -> Result<Vec<u8>, ImportErrorKind> {
    let count = |n: usize, field: &str| {
        if n != numel {
            Err(invalid(format!("{what} has {n} values in {field}, its dims need {numel}")))
        } else {
            Ok(())
        }
    };
    Ok(match dtype {
        DType::F32 => {
            count(t.float_data.len(), "float_data")?;
            t.float_data.iter().flat_map(|v| v.to_le_bytes()).collect()
        }
        DType::I64 => {
            count(t.int64_data.len(), "int64_data")?;
            t.int64_data.iter().flat_map(|v| v.to_le_bytes()).collect()
        }
        DType::I32 => {
            count(t.int32_data.len(), "int32_data")?;
            t.int32_data.iter().flat_map(|v| v.to_le_bytes()).collect()
        }
        // FLOAT16 and BFLOAT16 travel as their 16-bit patterns in int32_data, BOOL as 0/1.
        DType::F16 | DType::BF16 => {
            count(t.int32_data.len(), "int32_data")?;
            t.int32_data.iter().flat_map(|&v| (v as u16).to_le_bytes()).collect()
        }
        DType::Bool => {
            count(t.int32_data.len(), "int32_data")?;
            t.int32_data.iter().map(|&v| (v != 0) as u8).collect()
        }
    })
}

/// Reads `data_location = EXTERNAL` data: `location` relative to the model's directory, optional `offset` and
/// `length`, all bounds-checked against the file.
fn read_external(t: &TensorProto, what: &str, expected: usize, base_dir: Option<&Path>) -> Result<Vec<u8>, ImportErrorKind> {
    let mut location = None;
    let mut offset = 0u64;
    let mut length = None;
    for kv in &t.external_data {
        let key = kv.key.as_deref().unwrap_or("");
        let value = kv.value.as_deref().unwrap_or("");
        let parse = |v: &str| v.trim().parse::<u64>().map_err(|_| invalid(format!("{what}: external data {key} '{v}' is not a non-negative integer")));
        match key {
            "location" => location = Some(value.to_string()),
            "offset" => offset = parse(value)?,
            "length" => length = Some(parse(value)?),
            _ => {} // "checksum" and unknown keys carry no data.
        }
    }
    let Some(location) = location else {
        return Err(invalid(format!("{what} has external data without a location")));
    };
    let rel = Path::new(&location);
    if rel.is_absolute() || rel.components().any(|c| !matches!(c, Component::Normal(_) | Component::CurDir)) {
        return Err(invalid(format!(
            "{what}: external data location '{location}' must be a relative path inside the model's directory"
        )));
    }
    let Some(base) = base_dir else {
        return Err(ImportErrorKind::Missing(format!(
            "{what} keeps its data in external file '{location}', but the model was given as bytes without a directory"
        )));
    };
    let path = base.join(rel);
    let mut f = std::fs::File::open(&path)
        .map_err(|e| ImportErrorKind::Missing(format!("{what}: external data file {}: {e}", path.display())))?;
    let file_len = f.metadata().map_err(ImportErrorKind::Io)?.len();
    let length = length.unwrap_or(file_len.saturating_sub(offset));
    if length != expected as u64 {
        return Err(invalid(format!("{what}: external data length {length} does not match its type, which needs {expected} bytes")));
    }
    match offset.checked_add(length) {
        Some(end) if end <= file_len => {}
        _ => {
            return Err(invalid(format!(
                "{what}: external data at offset {offset}, length {length} runs past the end of {} ({file_len} bytes)",
                path.display()
            )))
        }
    }
    f.seek(SeekFrom::Start(offset)).map_err(ImportErrorKind::Io)?;
    let mut buf = vec![0u8; expected];
    f.read_exact(&mut buf).map_err(ImportErrorKind::Io)?;
    Ok(buf)
}

/// Decodes a serialized `TensorProto` (the backend suite's `input_0.pb` / `output_0.pb` files).
pub fn decode_tensor(bytes: &[u8]) -> Result<Tensor, ImportErrorKind> {
    use prost::Message;
    let t = TensorProto::decode(bytes).map_err(ImportErrorKind::Decode)?;
    tensor_from_proto(&t, None)
}

/// Encodes an IR tensor as a `TensorProto` with raw data.
pub fn tensor_to_proto(name: &str, t: &Tensor) -> TensorProto {
    TensorProto {
        dims: t.shape().iter().map(|&d| d as i64).collect(),
        data_type: Some(dtype_to_onnx(t.dtype())),
        name: Some(name.to_string()),
        raw_data: Some(prost::bytes::Bytes::copy_from_slice(t.bytes())),
        ..Default::default()
    }
}

#[cfg(test)]
#[path = "tensor_tests.rs"]
mod tests;
