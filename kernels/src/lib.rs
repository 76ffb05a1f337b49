//! tessera's runtime: the tensor and module types a compiled model is made of, the artifact format, and the
//! runtime that loads an artifact and replays its plan: each backend's run side is one module of
//! [`runtime`], named after the module format it loads.
//!
//! It depends on no compiler code (no IR graph, ONNX importer, interpreter, partitioner or store), so an
//! application embeds it alone; the compiler (`tessera-stages`) depends on it, never the reverse.

pub mod artifact;
pub mod batch;
pub mod code;
pub mod dtype;
pub mod module;
pub mod random;
pub mod runtime;
pub mod tensor;

pub use dtype::DType;
pub use module::{FunctionInfo, Module, ModuleFormat, Place};
pub use tensor::{Tensor, TensorSizeError, TensorType};
