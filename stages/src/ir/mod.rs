//! The graph IR: dtypes, tensors, ops, graphs, shape inference, verification and structural hashing.

pub mod extract;
pub mod graph;
pub mod hash;
pub mod infer;
pub mod op;
pub mod serial;
pub mod verify;
pub mod view;

#[cfg(test)]
mod hash_tests;

// Tensors and dtypes are the runtime's (tessera-kernels): an artifact holds them, so they live below the
// compiler; the IR uses them under these paths.
pub use tessera_kernels::{dtype, tensor};
pub use tessera_kernels::dtype::DType;
pub use extract::extract_subgraph;
pub use graph::{BuildError, Graph, Node, NodeId, Value, ValueDef, ValueId};
pub use hash::{graph_hash, graph_hash_with, subgraph_signature, ConstMode, SubgraphSignature};
pub use infer::{attention_dims, broadcast_shapes, infer_op, AttentionDims, InferError};
pub use op::*;
pub use tessera_kernels::tensor::{Tensor, TensorSizeError, TensorType};
pub use verify::{verify, VerifyError};
pub use view::{movement_view, StridedView};
