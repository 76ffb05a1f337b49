//! tessera's compiler stages and the IR they share: the graph IR, ONNX import, the reference interpreter,
//! graph passes, and (later) the five hashed stages and one module per backend.

pub mod backend;
pub mod interp;
pub mod link;
pub mod ir;
pub mod npy;
pub mod onnx;
pub mod partition;
pub mod passes;
pub mod target;
