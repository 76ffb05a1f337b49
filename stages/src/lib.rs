//! tessera's compiler: the hashed stages, one module each in [`stages`], whose DAG is declared once there
//! ([`stages::DAG`]); [`build`] runs one model's DAG. Everything else is library code the stages call: the
//! graph IR ([`ir`]), ONNX import ([`onnx`]), the reference interpreter ([`interp`]), graph passes
//! ([`passes`]), partitioning's search ([`partition`]), the rule vocabulary it and the backends share ([`rules`]) and each
//! backend's compile side ([`backend`]).

pub mod backend;
pub mod build;
pub mod calibration;
pub mod code;
pub mod context;
pub mod device;
pub mod fingerprint;
pub mod gpu_facts;
pub mod interp;
pub mod ir;
pub mod npy;
pub mod onnx;
pub mod partition;
pub mod passes;
pub mod rules;
pub mod stage;
pub mod stages;
pub mod target;
