//! Run tessera artifacts (`.tsr`) from an application: no compiler, no store, only the runtime
//! (`tessera-kernels`).
//!
//! ```no_run
//! use tessera_runtime::{Model, TensorView};
//!
//! let model = Model::load("out/mlp3-b1.tsr")?;            // digest checked before any code loads
//! for i in model.inputs() {
//!     println!("{} {:?} {:?}", i.name, i.dtype, i.shape);
//! }
//! let x = vec![0.5f32; model.inputs()[0].numel()];
//! let outputs = model.run(&[(model.inputs()[0].name.as_str(), TensorView::from_slice(&model.inputs()[0].shape, &x))])?;
//! println!("{:?}", &outputs[0].to_f32_vec()[..4]);
//! # Ok::<(), tessera_runtime::Error>(())
//! ```
//!
//! - [`Model::load`] / [`Model::from_bytes`]: read and check an artifact (magic, version, lengths, blake3
//!   digest, every index and bound) before any of its modules is loaded, refuse modules compiled for an
//!   instruction set this CPU lacks, then load its modules and constants once (a GPU artifact's on GPU 0).
//! - [`Model::load_on_gpu`] / [`Model::from_bytes_on_gpu`]: the same for a GPU artifact, on the GPU of that
//!   CUDA device ordinal ([`Model::gpu`] says which; a host artifact there is an error).
//! - [`Model::inputs`] / [`Model::outputs`]: names, dtypes and shapes ([`TensorInfo`]), in model order.
//! - [`Model::provenance`] / [`Model::provenance_json`]: how the artifact was built ([`Provenance`]: tessera
//!   version and source revision, source model and digest, targets, precision, costs, build options).
//! - [`Model::run`] (outputs returned, one allocation each) and [`Model::run_into`] (outputs written into
//!   the caller's buffers): inputs are borrowed and given by name ([`TensorView`]); every input must be
//!   given once, with its exact dtype and shape.
//!
//! **Threads.** A `Model` is `Send + Sync`: run it from as many threads as you like. Weights and loaded code
//! are shared; each concurrent run takes a session (its own arena of activations and scratch) from the
//! model's pool, allocating one only when every existing session is busy, so the pool grows to the largest
//! number of simultaneous runs and a run copies nothing but its inputs in and its outputs out. Host runs
//! execute on the runtime's thread pool (one thread per core), so more callers than cores queue there.
//!
//! **GPU artifacts** load and run through the same API, inputs and outputs in host memory, or in device
//! memory the caller owns ([`Model::run_device`] with [`DeviceTensor`]s: copied device to device, never
//! through the host). Their engine has one device arena and one set of captured CUDA graphs, so runs of one
//! GPU model take turns (a mutex): many threads may call, one run executes at a time. A GPU model lives on
//! one GPU, the one it was loaded on (GPU 0 unless [`Model::load_on_gpu`] names another): its runs execute
//! there from any thread, and device memory and streams handed to it are that GPU's. Models on different
//! GPUs run at the same time; to use every GPU of a host, load one model per GPU.

mod device;
mod error;
mod model;
mod view;

pub use device::{keeping_callers_gpu, make_gpu_current, synchronize_gpu, synchronize_gpu_of, DeviceTensor};
pub use error::{Error, ErrorKind};
pub use model::{Model, TensorInfo};
pub use view::{Element, TensorView, TensorViewMut, Writable};

/// Element types and returned tensors are the runtime's own: re-exported so applications need no other crate.
pub use tessera_kernels::{DType, Tensor, TensorType};
/// What an artifact records about how it was built.
pub use tessera_kernels::artifact::{Blake3, Provenance, SourceModel};
