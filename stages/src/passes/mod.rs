//! Graph passes: constant folding and the simplifications importers need.

mod attention;
pub mod fold;
pub mod layout;
// Simplifications run after ONNX import (owned with stages/src/onnx/).
mod fold_batchnorm;
mod gelu;
mod gqa;
mod layernorm;
mod movement;
mod pattern;
mod siblings;
mod window_mask;
pub mod precision;
pub mod simplify;

/// Version of everything the passes do to a graph: part of every key of a graph they produced. Bump it
/// whenever folding or a simplification changes its output.
pub const PASSES_VERSION: u32 = 5;

/// The passes' code version: [`PASSES_VERSION`] with the digest of their source, part of every key of a graph
/// they produced.
pub fn code_version() -> crate::code::CodeVersion {
    crate::code::CodeVersion::new(PASSES_VERSION, &[crate::code::digests::PASSES])
}
