//! Graph passes: constant folding and the simplifications importers need.

pub mod fold;
// Simplifications run after ONNX import (owned with stages/src/onnx/).
mod fold_batchnorm;
mod gelu;
mod layernorm;
mod pattern;
pub mod simplify;
