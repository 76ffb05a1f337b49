//! What a backend's compile side hands the runtime: compiled modules and the signatures of their functions.
//!
//! Calling convention shared by every module format: a function takes one array of pointers,
//! `[input_0, .., input_n, output_0, .., output_m, scratch?]`, each pointing at a dense row-major buffer of the
//! type listed in its [`FunctionInfo`]; inputs are boundary activations and lifted constants in the kernel's
//! canonical input order. Functions never allocate per call beyond their declared scratch.

use crate::tensor::TensorType;
use serde::{Deserialize, Serialize};

/// The signature of one compiled function.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionInfo {
    pub symbol: String,
    pub inputs: Vec<TensorType>,
    pub outputs: Vec<TensorType>,
    /// Bytes of scratch memory passed as the last argument (absent when 0).
    pub scratch_bytes: u64,
}

impl FunctionInfo {
    /// The arguments a function of this signature takes: inputs, outputs, and scratch when it declares some.
    pub fn arity(&self) -> usize {
        self.inputs.len() + self.outputs.len() + usize::from(self.scratch_bytes > 0)
    }
}

/// How a module's bytes are to be loaded, and where its functions run: the name of a format a runtime loader
/// is registered for ([`Registry`](crate::runtime::registry::Registry)) and its [`Place`]. Each backend's run
/// side defines its format as a constant beside its loader (`runtime::c::FORMAT`, `runtime::cuda::FORMAT`...)
/// and registers the loader with one line there; the compile side writes the same constant into its modules.
/// A format from outside this crate is a [`ModuleFormat::host`] (or `gpu`) of its own name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ModuleFormat {
    pub name: std::borrow::Cow<'static, str>,
    pub place: Place,
}

impl ModuleFormat {
    /// A format of host code named `name`.
    pub const fn host(name: &'static str) -> ModuleFormat {
        ModuleFormat { name: std::borrow::Cow::Borrowed(name), place: Place::Host }
    }

    /// A format of GPU code named `name`.
    pub const fn gpu(name: &'static str) -> ModuleFormat {
        ModuleFormat { name: std::borrow::Cow::Borrowed(name), place: Place::Gpu }
    }

    /// A format of host code named at run time (a loader added from outside this crate).
    pub fn named(name: impl Into<String>) -> ModuleFormat {
        ModuleFormat { name: std::borrow::Cow::Owned(name.into()), place: Place::Host }
    }

    /// Where functions of this format run.
    pub fn place(&self) -> Place {
        self.place
    }
}

/// Where a module's functions run, and so where the buffers they read and write must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Place {
    /// Host memory, called through [`LoadedModule::call`](crate::runtime::LoadedModule::call).
    Host,
    /// The GPU's memory, launched by the GPU engine on its stream.
    Gpu,
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Place::Host => "host",
            Place::Gpu => "GPU",
        })
    }
}

impl std::fmt::Display for ModuleFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name, self.place)
    }
}

/// A compiled module: what one backend made of all of one model's partitions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Module {
    pub backend: String,
    /// Canonical target string it was compiled for.
    pub target: String,
    pub format: ModuleFormat,
    pub functions: Vec<FunctionInfo>,
    pub bytes: Vec<u8>,
}

