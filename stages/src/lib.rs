//! tessera's compiler: the graph IR, ONNX import, the reference interpreter, graph passes, the hashed stages
//! (one [`stage::Stage`] each: targets and load in [`build`], partition in [`partition::stage`], tune in
//! [`tune`], lower/compile/link in [`build`]) and each backend's compile side ([`backend`]).

pub mod backend;
pub mod build;
pub mod device;
pub mod interp;
pub mod link;
pub mod ir;
pub mod npy;
pub mod onnx;
pub mod partition;
pub mod passes;
pub mod stage;
pub mod target;
pub mod tune;
