//! ONNX import: a `.onnx` file (protobuf, decoded by `prost` into the types of [`proto`]) becomes a static,
//! typed [`Graph`], simplified by [`crate::passes::simplify`].
//!
//! What the importer guarantees:
//! - **Static shapes.** Graph inputs with symbolic dimensions are fixed by [`ImportOptions::shapes`] (the CLI's
//!   `--shape input_ids=1x128`). Shape-like operands (Reshape's shape, Slice's starts, Clip's bounds...) must be
//!   constants once folded, and folding is eager: `Shape` of any value is a constant (every shape is static),
//!   and a node whose inputs are all constants is evaluated on the spot by the reference interpreter
//!   ([`crate::interp::eval_op`]), so shape subgraphs (Shape, Gather, Unsqueeze, Concat, ConstantOfShape,
//!   Range...) never reach the IR.
//! - **Normalized attributes.** Axes are non-negative, auto_pad is resolved to explicit pads, Slice bounds are
//!   clamped, ops the IR has no variant for are decomposed into ones it has (see [`ops`]).
//! - **Errors, never panics.** A malformed file, an unsupported op or data type, a missing input, a bad
//!   attribute: each is an [`ImportError`] naming the file, the node (its name, or `#index`), the op and the
//!   attribute.
//!
//! Opsets: the default domain at versions [`MIN_OPSET`]..=[`MAX_OPSET`]. The target range is 13 to 21 (what
//! current exporters write); versions 6 to 12 are accepted too because the ONNX backend test suite (our
//! external oracle) is written in them, and every op whose meaning changed across versions (Softmax's 2-D
//! coercion before 13, attributes that became inputs, legacy `broadcast`/`axis` on arithmetic before 7, ...)
//! is converted according to the model's version. Versions outside the range are rejected by name.

// An ImportError carries the file, node, op and attribute names by value: it is built at most once per
// import, so its size (clippy's result_large_err) costs nothing worth boxing for.
#![allow(clippy::result_large_err)]

pub mod attrs;
pub mod error;
mod import;
pub mod ops;
#[allow(clippy::all, missing_docs, rustdoc::all)]
pub mod proto;
pub mod tensor;
#[cfg(test)]
mod tests;

pub use error::{ImportError, ImportErrorKind, NodeLocation};
pub use tensor::{decode_tensor, dtype_from_onnx, tensor_from_proto, tensor_to_proto};

use crate::ir::{Graph, Tensor};
use std::collections::BTreeMap;
use std::path::Path;

/// Oldest default-domain opset accepted (see the module doc for why below 13).
pub const MIN_OPSET: i64 = 6;
/// Newest default-domain opset accepted.
pub const MAX_OPSET: i64 = 21;

/// Options of one import.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImportOptions {
    /// Static shapes for named graph inputs: each fixes the input's symbolic (or unknown) dimensions and must
    /// agree with the ones the model fixes.
    pub shapes: BTreeMap<String, Vec<usize>>,
}

/// Parses a `--shape` argument: `NAME=D0xD1x...` (`1x128`; commas also separate dimensions; `NAME=` is a
/// scalar). The name is everything before the last `=`, so names containing `=` still work.
pub fn parse_shape_arg(s: &str) -> Result<(String, Vec<usize>), String> {
    let Some((name, dims)) = s.rsplit_once('=') else {
        return Err(format!("--shape '{s}': expected NAME=DIMS, e.g. input_ids=1x128"));
    };
    if name.is_empty() {
        return Err(format!("--shape '{s}': the input name is empty"));
    }
    let dims = dims.trim();
    if dims.is_empty() {
        return Ok((name.to_string(), Vec::new()));
    }
    let shape = dims
        .split(['x', 'X', ','])
        .map(|d| d.trim().parse::<usize>().map_err(|_| format!("--shape '{s}': '{d}' is not a dimension (a non-negative integer)")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((name.to_string(), shape))
}

/// Imports a model file. External data files are resolved relative to the file's directory; the graph is
/// named after the file stem.
pub fn import_file(path: &Path, opts: &ImportOptions) -> Result<Graph, ImportError> {
    let file = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| ImportError::new(&file, ImportErrorKind::Io(e)))?;
    let base = path.parent().map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p });
    import::import(&bytes, base, &file, opts)
}

/// Imports a model from memory. `name` stands for the file in errors and names the graph (its file stem);
/// `base_dir` is where external data files are looked up (`None`: the model must have none).
pub fn import_bytes(bytes: &[u8], base_dir: Option<&Path>, name: &str, opts: &ImportOptions) -> Result<Graph, ImportError> {
    import::import(bytes, base_dir, name, opts)
}

/// Reads a serialized `TensorProto` file (such as the backend suite's `input_0.pb`).
pub fn load_tensor_file(path: &Path) -> Result<Tensor, ImportError> {
    let file = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| ImportError::new(&file, ImportErrorKind::Io(e)))?;
    decode_tensor(&bytes).map_err(|k| ImportError::new(&file, k))
}

/// The graph name for a file: its stem (`models/resnet50.onnx` -> `resnet50`).
fn model_name(file: &str) -> String {
    Path::new(file).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| file.to_string())
}
