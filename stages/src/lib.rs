//! tessera's compiler: the graph IR, ONNX import, the reference interpreter, graph passes, the hashed stages
//! (one [`stage::Stage`] each, one module each: targets in [`target`], [`load`], partition in
//! [`partition::stage`], [`tune`], [`lower`], [`compile`], [`link`]; [`build`] runs one model's DAG) and each backend's compile side ([`backend`]).

pub mod artifact;
pub mod backend;
pub mod build;
pub mod calibrate;
pub mod code;
pub mod compile;
pub mod context;
pub mod device;
pub mod gpu_facts;
pub mod interp;
pub mod link;
pub mod load;
pub mod lower;
pub mod ir;
pub mod npy;
pub mod onnx;
pub mod partition;
pub mod passes;
pub mod precision;
pub mod rules;
pub mod layout;
pub mod stage;
pub mod target;
pub mod tune;
