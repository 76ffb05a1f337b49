//! NumPy `.npy` files in and out, for `tessera run` inputs and outputs (through the `npyz` crate).
//!
//! Reading accepts format versions 1, 2 and 3, either byte order, C or Fortran order (Fortran data is
//! transposed to the IR's row-major layout), and the dtypes f4, f2, i8, i4 and b1 (f32, f16, i64, i32,
//! bool). Two conversions, and only these, happen when a file is read for a given IR dtype:
//! - an f8 (f64) file read for an f32 value is rounded to f32 (NumPy's default float is f64, so
//!   `np.random.rand(...)` saved as is should just work for an f32 input); f64 is refused for every other
//!   dtype, since rounding it to f16 or to integers would silently change the data;
//! - an f4 or f8 file read for a bf16 value is rounded to bf16 (NumPy has no bfloat16 dtype).
//!
//! Writing produces version 1 files (2 when the header needs it) in little-endian C order. bf16 tensors
//! are written as f4 (widening is exact), since NumPy cannot read bfloat16.
//!
//! Every error names the file.

use crate::interp::eval_op;
use crate::ir::{DType, Op, Tensor, TensorType};
use half::f16;
use npyz::{Order, TypeChar, WriterBuilder};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Reading or writing a `.npy` file failed; `path` is the file.
#[derive(Debug, thiserror::Error)]
#[error("{}: {msg}", path.display())]
pub struct NpyError {
    pub path: PathBuf,
    pub msg: String,
}

fn err(path: &Path, msg: impl Into<String>) -> NpyError {
    NpyError { path: path.to_path_buf(), msg: msg.into() }
}

/// The element types a file can hold that we read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileType {
    F64,
    Ir(DType),
}

fn file_type(path: &Path, dtype: &npyz::DType) -> Result<FileType, NpyError> {
    let npyz::DType::Plain(ts) = dtype else {
        return Err(err(path, format!("structured or array dtype {} is not supported", dtype.descr())));
    };
    Ok(match (ts.type_char(), ts.size_field()) {
        (TypeChar::Float, 8) => FileType::F64,
        (TypeChar::Float, 4) => FileType::Ir(DType::F32),
        (TypeChar::Float, 2) => FileType::Ir(DType::F16),
        (TypeChar::Int, 8) => FileType::Ir(DType::I64),
        (TypeChar::Int, 4) => FileType::Ir(DType::I32),
        (TypeChar::Bool, 1) => FileType::Ir(DType::Bool),
        _ => {
            return Err(err(
                path,
                format!("dtype '{ts}' is not supported (supported: float32, float16, int64, int32, bool; float64 for f32 and bf16 values)"),
            ))
        }
    })
}

fn io_err(path: &Path, what: &str, e: impl std::fmt::Display) -> NpyError {
    err(path, format!("{what}: {e}"))
}

/// Decoded file contents: the element type, the shape as stored, and the elements as stored.
struct Raw {
    ty: FileType,
    shape: Vec<usize>,
    fortran: bool,
    data: RawData,
}

enum RawData {
    F64(Vec<f64>),
    T(Tensor),
}

fn read_raw(path: &Path) -> Result<Raw, NpyError> {
    let bytes = std::fs::read(path).map_err(|e| io_err(path, "cannot read", e))?;
    decode_raw(&bytes, path)
}

fn decode_raw(bytes: &[u8], path: &Path) -> Result<Raw, NpyError> {
    // npyz allocates the header by the length the file states: check that length against the file first.
    if bytes.len() >= 12 && bytes.starts_with(b"\x93NUMPY") {
        let (len_size, stated) = if bytes[6] == 1 {
            (2, u16::from_le_bytes([bytes[8], bytes[9]]) as usize)
        } else {
            (4, u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize)
        };
        let have = bytes.len() - 8 - len_size;
        if stated > have {
            return Err(err(path, format!("not a valid .npy file: the header says it is {stated} bytes long, the file has {have} after it")));
        }
        // npyz (and the Fortran-order transpose, in isize) multiply the shape's dimensions unchecked,
        // strides included: refuse a shape whose non-zero dimensions multiply past isize::MAX (a zero
        // dimension makes the element count 0, but not the strides).
        let header = String::from_utf8_lossy(&bytes[8 + len_size..8 + len_size + stated]);
        if let Some(dims) = header_shape(&header) {
            let fits = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d.max(1))).is_some_and(|p| p <= isize::MAX as u64);
            if !fits {
                return Err(err(path, format!("truncated or corrupt data: the header's shape {dims:?} has dimensions whose product overflows")));
            }
        }
    }
    let file = npyz::NpyFile::new(bytes).map_err(|e| io_err(path, "not a valid .npy file", e))?;
    let ty = file_type(path, &file.dtype())?;
    // The header's shape is untrusted: check it against the bytes present before anything is sized by it
    // (a 100-byte file claiming a billion elements must not allocate gigabytes).
    let item = match &file.dtype() {
        npyz::DType::Plain(ts) => ts.size_field() as u128,
        _ => 1,
    };
    let needed = file.shape().iter().try_fold(item, |acc, &d| acc.checked_mul(d as u128));
    let data_len = (bytes.len() - data_offset(bytes)) as u128;
    match needed {
        Some(n) if n <= data_len => {}
        _ => {
            return Err(err(
                path,
                format!(
                    "truncated or corrupt data: the header's shape {:?} needs {} bytes of data, the file has {data_len}",
                    file.shape(),
                    needed.map_or("more than 2^128".to_string(), |n| n.to_string())
                ),
            ))
        }
    }
    let shape: Vec<usize> = file.shape().iter().map(|&d| d as usize).collect();
    let fortran = file.order() == Order::Fortran;
    // Fortran data is the transpose's row-major data: read it with the reversed shape.
    let stored: Vec<usize> = if fortran { shape.iter().rev().copied().collect() } else { shape.clone() };
    let read = |e| io_err(path, "truncated or corrupt data", e);
    let data = match ty {
        FileType::F64 => RawData::F64(file.into_vec::<f64>().map_err(read)?),
        FileType::Ir(d) => RawData::T(match d {
            DType::F32 => Tensor::from_f32(stored, &file.into_vec::<f32>().map_err(read)?),
            DType::F16 => {
                let v: Vec<u8> = file.into_vec::<f16>().map_err(read)?.iter().flat_map(|x| x.to_le_bytes()).collect();
                Tensor::from_bytes(TensorType::new(DType::F16, stored), v).map_err(|e| err(path, e.to_string()))?
            }
            DType::I64 => Tensor::from_i64(stored, &file.into_vec::<i64>().map_err(read)?),
            DType::I32 => Tensor::from_i32(stored, &file.into_vec::<i32>().map_err(read)?),
            DType::Bool => Tensor::from_bool(stored, &file.into_vec::<bool>().map_err(read)?),
            DType::BF16 => unreachable!("file_type never yields bf16"),
        }),
    };
    Ok(Raw { ty, shape, fortran, data })
}

/// The dimensions of the header's `'shape': (d0, d1, ...)` entry when it is written that plainly (anything
/// else is left to npyz, which rejects it).
fn header_shape(header: &str) -> Option<Vec<u64>> {
    let at = header.find("'shape'").or_else(|| header.find("\"shape\""))?;
    let rest = &header[at..];
    let open = rest.find('(')?;
    let close = open + rest[open..].find(')')?;
    rest[open + 1..close].split(',').map(str::trim).filter(|d| !d.is_empty()).map(|d| d.parse::<u64>().ok()).collect()
}

/// Where the data of a file whose header `npyz` accepted starts: magic (6), version (2), the header length
/// (2 bytes in version 1, 4 after) and the header.
fn data_offset(bytes: &[u8]) -> usize {
    let (len_at, len_size) = (8, if bytes[6] == 1 { 2 } else { 4 });
    let mut hlen = [0u8; 4];
    hlen[..len_size].copy_from_slice(&bytes[len_at..len_at + len_size]);
    (len_at + len_size + u32::from_le_bytes(hlen) as usize).min(bytes.len())
}

/// Puts a tensor stored with the reversed shape (Fortran order) back into row-major order.
fn from_fortran(path: &Path, t: Tensor) -> Result<Tensor, NpyError> {
    let r = t.shape().len();
    if r < 2 {
        return Ok(t);
    }
    let perm: Vec<usize> = (0..r).rev().collect();
    let mut out = eval_op(&Op::Transpose { perm }, &[&t]).map_err(|e| err(path, e.to_string()))?;
    Ok(out.remove(0))
}

/// Reads a file holding one of the IR's dtypes (f32, f16, i64, i32, bool), as stored.
pub fn read(path: &Path) -> Result<Tensor, NpyError> {
    finish_read(read_raw(path)?, path)
}

/// [`read`] of a file's contents already in memory; `path` names it in errors.
pub fn read_bytes(bytes: &[u8], path: &Path) -> Result<Tensor, NpyError> {
    finish_read(decode_raw(bytes, path)?, path)
}

fn finish_read(raw: Raw, path: &Path) -> Result<Tensor, NpyError> {
    match raw.data {
        RawData::F64(_) => Err(err(path, "holds float64, which the IR has no dtype for (read it for an f32 value instead)")),
        RawData::T(t) if raw.fortran => from_fortran(path, t),
        RawData::T(t) => Ok(t),
    }
}

/// Reads a file for a value of dtype `want`, applying only the documented conversions (f64 to f32,
/// f64 or f32 to bf16); any other dtype mismatch is an error naming both dtypes.
pub fn read_as(path: &Path, want: DType) -> Result<Tensor, NpyError> {
    finish_read_as(read_raw(path)?, path, want)
}

/// [`read_as`] of a file's contents already in memory; `path` names it in errors.
pub fn read_bytes_as(bytes: &[u8], path: &Path, want: DType) -> Result<Tensor, NpyError> {
    finish_read_as(decode_raw(bytes, path)?, path, want)
}

fn finish_read_as(raw: Raw, path: &Path, want: DType) -> Result<Tensor, NpyError> {
    let stored: Vec<usize> = if raw.fortran { raw.shape.iter().rev().copied().collect() } else { raw.shape.clone() };
    let t = match (raw.data, want) {
        (RawData::F64(v), DType::F32 | DType::BF16) => Tensor::from_f64_as(want, stored, &v),
        (RawData::T(t), DType::BF16) if t.dtype() == DType::F32 => Tensor::from_f64_as(DType::BF16, stored, &t.to_f64_vec()),
        (RawData::T(t), w) if t.dtype() == w => t,
        (_, w) => {
            let has = match raw.ty {
                FileType::F64 => "float64".to_string(),
                FileType::Ir(d) => d.to_string(),
            };
            return Err(err(path, format!("holds {has} data, the value needs {w}")));
        }
    };
    if raw.fortran {
        from_fortran(path, t)
    } else {
        Ok(t)
    }
}

fn write_elems<T: npyz::AutoSerialize + Copy>(path: &Path, shape: &[usize], v: impl IntoIterator<Item = T>) -> Result<(), NpyError> {
    let file = std::fs::File::create(path).map_err(|e| io_err(path, "cannot create", e))?;
    let mut buf = std::io::BufWriter::new(file);
    let dims: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    let mut w = npyz::WriteOptions::new()
        .default_dtype()
        .shape(&dims)
        .writer(&mut buf)
        .begin_nd()
        .map_err(|e| io_err(path, "cannot write", e))?;
    w.extend(v).map_err(|e| io_err(path, "cannot write", e))?;
    w.finish().map_err(|e| io_err(path, "cannot write", e))?;
    buf.flush().map_err(|e| io_err(path, "cannot write", e))
}

/// Writes a tensor as a little-endian, C-order `.npy` file (bf16 as float32).
pub fn write(path: &Path, t: &Tensor) -> Result<(), NpyError> {
    let s = t.shape();
    let b = t.bytes();
    match t.dtype() {
        DType::F32 | DType::BF16 => write_elems(path, s, t.to_f32_vec()),
        DType::F16 => write_elems(path, s, b.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]))),
        DType::I64 => write_elems(path, s, t.to_i64_vec()),
        DType::I32 => write_elems(path, s, b.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        DType::Bool => write_elems(path, s, b.iter().map(|&x| x != 0)),
    }
}

/// The dtype a tensor of `dtype` has once written (bf16 becomes f32; everything else is kept).
pub fn written_dtype(dtype: DType) -> DType {
    if dtype == DType::BF16 {
        DType::F32
    } else {
        dtype
    }
}

/// The file stem a tensor named `name` is written under and read from (`tessera run --out`, calibration
/// inputs): ASCII letters, digits, `-`, `_` and `.` kept, anything else `_`, `_` prefixed to an empty name or
/// one starting with `.`, cut to 120 bytes.
pub fn file_stem(name: &str) -> String {
    let mut s: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' }).collect();
    if s.is_empty() || s.starts_with('.') {
        s.insert(0, '_');
    }
    s.truncate(120);
    s
}

#[cfg(test)]
#[path = "npy_tests.rs"]
mod tests;
