//! Backends: one module per backend behind one trait, and everything about a backend's compile side comes
//! from it.
//!
//! A backend says which nodes it can run ([`Backend::supports`]) and which candidate partitions the Collage
//! partitioner proposes for it ([`Backend::rules`]), estimates what a partition costs, names the
//! configurations the tune stage measures ([`Backend::configs`]) and the colours `tessera explain` draws it in
//! ([`Backend::colors`]), lowers each partition (a standalone kernel graph, see [`crate::ir::extract_subgraph`])
//! to code or a plan fragment, and compiles all of one model's lowered partitions at once into one [`Module`]
//! (module-at-a-time: one source, one compile). Lowering is memoized per kernel signature by the pipeline;
//! module compiles per model. Nothing outside a backend's folder matches on its name.
//!
//! Calling convention shared by every module format: a function takes one array of pointers,
//! `[input_0, .., input_n, output_0, .., output_m, scratch?]`, each pointing at a dense row-major buffer of the
//! type listed in its [`FunctionInfo`]; inputs are boundary activations and lifted constants in the kernel's
//! canonical input order. Functions never allocate per call beyond their declared scratch.
//!
//! # Adding a backend
//!
//! A backend `foo` is one folder per side and one registration line in each:
//! - **compile side**: a folder `stages/src/backend/foo/` with its description (a [`BackendSpec`]: name,
//!   device kind, `-compiler` value, its own typed options with defaults and docs), a type implementing
//!   [`Backend`] (support and rules, estimate, configs, colours, lowering and module compile), and the line
//!   `crate::backend::registry::register_builtin!(SPEC, FooBackend);`, which adds the description to the
//!   targets' registry and the constructor to [`registry::all`]. Its source digest enters its keys once its
//!   folder is a unit in `stages/src/code/units.rs`, with the shared files it uses. A backend folder imports
//!   no other backend's folder and not the partitioner: it builds its rules from [`crate::rules`] and may use
//!   the shared lowering machinery of [`lowering`]. A backend built outside this crate calls
//!   [`registry::register`] at run time instead, and every build through the library's entry point offers it.
//! - **run side**: one module `kernels/src/runtime/foo.rs` (or folder) with its [`ModuleFormat`] constant
//!   (`FORMAT`, a name and where its functions run) beside its loader, and one line in
//!   `kernels/src/runtime/registry.rs`'s `BUILTIN` (explicit: C programs link the runtime statically, and
//!   drop registrations nothing refers to); the compile side writes that constant into its modules. A loader built outside the runtime crate uses a [`ModuleFormat::named`] format
//!   and is added to a `Registry` value with `Registry::with` (see `Executable::load_with`).
//!
//! `pipeline/tests/toy_backend.rs` is a complete backend written in one test file that way.

pub mod registry;
pub mod gemm;
pub mod library;
pub mod lowering;

#[cfg(test)]
pub(crate) mod attention_cases;
#[cfg(test)]
pub(crate) mod compare;
#[cfg(test)]
pub(crate) mod scan_nd_cases;
#[cfg(test)]
pub(crate) mod unary_cases;
pub mod c;
pub mod cublas;
pub mod cuda;
pub mod cudnn;
pub mod cutlass;

use crate::ir::{Graph, NodeId};
use crate::rules::{Kinds, Rule};
pub use tessera_kernels::module::{FunctionInfo, Module, ModuleFormat};
use crate::target::{BackendSpec, Target};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use tessera_store::Digest;

/// Constants with at most this many elements stay inside kernels (a backend may inline them into code);
/// larger ones are lifted to kernel inputs, so compiled code never depends on weight values.
pub const INLINE_CONST_MAX: usize = 64;

/// The tuning budget, an option of every backend with a tuning space: the tune stage measures at most this many
/// configurations of each kernel (`tune::configs_to_measure`: the default first, then the others in order).
pub const TUNE_CONFIGS: crate::target::AttrSpec = crate::target::AttrSpec {
    name: "tune-configs",
    ty: crate::target::AttrType::Int { min: 1, max: 64 },
    default: "16",
    doc: "tuning budget: the tune stage measures at most this many configurations of each kernel (the default first, then the others in order); 1 measures only the default, 16 every one offered today",
};

/// One partition lowered by a backend, before its module is compiled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoweredKernel {
    pub info: FunctionInfo,
    /// Backend-specific: C source of one function for `c`, a postcard-encoded plan for `gemm`.
    pub code: Vec<u8>,
}

/// A backend failed. Every message names the backend and the kernel, node, op or configuration at fault
/// (Display: `backend <name>: ...`). Callers branch on the variant: the tune stage costs an
/// [`Unsupported`](BackendError::Unsupported) lowering as unsupported (so the partitioner places those nodes
/// with another backend) and a module that does not [`Compile`](BackendError::Compile) as its kernels'
/// refusal, but reports a missing [`Toolchain`](BackendError::Toolchain) and an
/// [`Invalid`](BackendError::Invalid) request; validation leaves out an alternative plan that fails with any.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The backend cannot take this kernel: an op, type, shape, attribute or configuration it does not
    /// offer. `why` names the kernel and the node or configuration.
    #[error("backend {backend}: {why}")]
    Unsupported { backend: String, why: String },
    /// The compiler this backend needs is not usable on this machine (no C compiler, no NVRTC, no nvcc or
    /// CUTLASS headers): nothing was compiled, and no kernel is at fault.
    #[error("backend {backend}: {tool} is not available here: {why}")]
    Toolchain { backend: String, tool: &'static str, why: String },
    /// `tool` rejected the generated module. `kernels` are those its diagnostics point into (`located`), or
    /// every kernel of the module where they point nowhere; `log` is the first lines of its output.
    #[error("backend {backend}: {tool} compilation failed in {}:\n{log}", compile_site(kernels, *located))]
    Compile { backend: String, tool: &'static str, kernels: Vec<String>, located: bool, log: String },
    /// A request the backend should never have been given, or output failing its own checks: a target
    /// that selects another backend, lowered code that does not decode, two kernels of one name, a plan
    /// failing validation. `why` names the target or kernel.
    #[error("backend {backend}: {why}")]
    Invalid { backend: String, why: String },
}

/// Why a backend cannot lower a kernel, or a node or configuration of it: an op, type, shape, attribute or
/// layout it does not offer (Display: the reason alone). Lowering code returns it; the backend names the
/// kernel and turns it into [`BackendError::Unsupported`] (which tune takes as a refusal) with [`Refusal::of`].
/// A `String` reason converts into it, so `?` carries reasons from helpers that still return one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refusal(pub String);

impl Refusal {
    /// [`BackendError::Unsupported`] of backend `backend`, the reason after `context` (the kernel's name): `context: why`.
    pub fn of(self, backend: &str, context: impl std::fmt::Display) -> BackendError {
        BackendError::unsupported(backend, format!("{context}: {}", self.0))
    }
}

impl From<String> for Refusal {
    fn from(why: String) -> Refusal {
        Refusal(why)
    }
}

impl From<&str> for Refusal {
    fn from(why: &str) -> Refusal {
        Refusal(why.to_string())
    }
}

/// A [`Refusal`] with a `format!` reason.
macro_rules! refuse {
    ($($arg:tt)*) => {
        $crate::backend::Refusal(format!($($arg)*))
    };
}
pub(crate) use refuse;

/// A tool a backend runs (the C compiler, NVRTC, nvcc, a CUTLASS probe program) did not give its output
/// (Display: the message alone). The backend decides what it is to the tune stage: a missing tool a
/// [`BackendError::Toolchain`], a rejected module a [`BackendError::Compile`] carrying the message as its log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    /// The tool is not on this machine, or cannot start: nothing was compiled.
    #[error("{0}")]
    NotFound(String),
    /// The tool ran and failed: its diagnostics (the caller attributes them to kernels).
    #[error("{0}")]
    Failed(String),
    /// Around the tool: a temporary folder or file that cannot be made, written or read, a file the tool
    /// should have written.
    #[error("{0}")]
    Io(String),
    /// The tool's output does not read as expected (a probe's lines).
    #[error("{0}")]
    BadOutput(String),
}

/// Where a compile failed, as its message says it: `kernel a, b` (the diagnostics point there) or
/// `module of [a, b]`.
fn compile_site(kernels: &[String], located: bool) -> String {
    if located {
        format!("kernel {}", kernels.join(", "))
    } else {
        format!("module of [{}]", kernels.join(", "))
    }
}

impl BackendError {
    /// An [`Unsupported`](BackendError::Unsupported) error of backend `backend`.
    pub fn unsupported(backend: &str, why: impl Into<String>) -> BackendError {
        BackendError::Unsupported { backend: backend.into(), why: why.into() }
    }

    /// An [`Invalid`](BackendError::Invalid) error of backend `backend`.
    pub fn invalid(backend: &str, why: impl Into<String>) -> BackendError {
        BackendError::Invalid { backend: backend.into(), why: why.into() }
    }

    /// A [`Toolchain`](BackendError::Toolchain) error: `tool` of backend `backend` is missing, for `why`.
    pub fn toolchain(backend: &str, tool: &'static str, why: impl Into<String>) -> BackendError {
        BackendError::Toolchain { backend: backend.into(), tool, why: why.into() }
    }

    /// A [`Compile`](BackendError::Compile) error naming every kernel of the module (the log points at none).
    pub fn compile(backend: &str, tool: &'static str, kernels: &[LoweredKernel], log: impl Into<String>) -> BackendError {
        let kernels = kernels.iter().map(|k| k.info.symbol.clone()).collect();
        BackendError::Compile { backend: backend.into(), tool, kernels, located: false, log: log.into() }
    }

    /// The backend that failed.
    pub fn backend(&self) -> &str {
        match self {
            BackendError::Unsupported { backend, .. }
            | BackendError::Toolchain { backend, .. }
            | BackendError::Compile { backend, .. }
            | BackendError::Invalid { backend, .. } => backend,
        }
    }
}

/// That `target` selects the backend `spec` describes: a backend's lowering and module compile check it first.
pub fn check_target(spec: &BackendSpec, target: &Target) -> Result<(), BackendError> {
    if target.backend_name() != spec.name {
        return Err(BackendError::invalid(spec.name, format!("target '{target}' selects backend '{}', not '{}'", target.backend_name(), spec.name)));
    }
    Ok(())
}

/// The configurations the tune stage measures for one kernel, as a set of names (CubeCL's `TunableSet`). Its
/// [`checksum`](TunableSet::checksum) is part of every tune key, so a new configuration invalidates old winners;
/// it depends on the set only, not on the order configurations were added in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TunableSet {
    names: BTreeSet<String>,
}

impl TunableSet {
    /// The one configuration of a backend without a tuning space: `<name>/v<version>/default`, so a new
    /// backend version is a new set.
    pub fn single_default(backend: &str, version: u32) -> TunableSet {
        [format!("{backend}/v{version}/default")].into_iter().collect()
    }

    /// Adds a configuration (a name already present is kept once).
    pub fn with(mut self, name: impl Into<String>) -> TunableSet {
        self.names.insert(name.into());
        self
    }

    /// The configurations' names, sorted.
    pub fn names(&self) -> impl ExactSizeIterator<Item = &str> {
        self.names.iter().map(|n| n.as_str())
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The set's checksum: blake3 of the postcard encoding of the sorted names (order-independent).
    pub fn checksum(&self) -> Digest {
        let sorted: Vec<&String> = self.names.iter().collect();
        Digest::of(&postcard::to_stdvec(&sorted).expect("strings encode"))
    }
}

impl<S: Into<String>> FromIterator<S> for TunableSet {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> TunableSet {
        TunableSet { names: iter.into_iter().map(Into::into).collect() }
    }
}

pub trait Backend: Send + Sync {
    /// The backend's description: name, device, `-compiler` value and its own options (registered with it).
    fn spec(&self) -> &'static BackendSpec;
    /// The backend's name as targets select it (`Target::backend_name`).
    fn name(&self) -> &'static str {
        self.spec().name
    }
    /// Code version: part of every key of this backend's work. The declared number (bump it when the meaning
    /// of generated code changes; it names configurations) with the digests of the backend's source and of
    /// the runtime that runs its module format ([`crate::code`]), so any change to a generator, or to what
    /// its kernels are measured on, changes its keys.
    fn version(&self) -> crate::code::CodeVersion;
    /// Whether this machine can compile for the backend (e.g. a C compiler is present); the reason if not.
    fn available(&self) -> Result<(), String>;
    /// Why a build without `--target` leaves this backend out even where it is available (`None`: it takes
    /// part in every default build it can run in). A backend whose compile cost outweighs what it buys on
    /// the models measured says so here, and users name it with `--target` when they want it anyway.
    fn opt_in(&self) -> Option<&'static str> {
        None
    }
    /// The facts of this machine that the backend's compiled output depends on (compiler and its version,
    /// flags it picked up, toolkit and device versions), as sorted name/value pairs. They are part of the
    /// compile key, so a different toolchain never serves a stale module.
    fn environment(&self, _target: &Target) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Pattern rule: can this backend run node `n` of `g`?
    fn supports(&self, g: &Graph, n: NodeId, target: &Target) -> bool;
    /// The Collage partition rules that propose this backend's candidates among the nodes it supports
    /// (see [`crate::rules`]). Default: every supported node alone.
    fn rules(&self) -> Rule {
        Rule::OnlyValid(Box::new(Rule::Primitive { kinds: Kinds::ALL }))
    }
    /// Every configuration the tune stage may measure on `target` (its checksum is in every tune key).
    /// Default: the one configuration of a backend without a tuning space ([`TunableSet::single_default`]).
    fn configs(&self, target: &Target) -> TunableSet {
        [self.default_config(target)].into_iter().collect()
    }
    /// The configuration a kernel gets when nothing was measured (analytical costs, a merged partition): a
    /// member of [`Backend::configs`].
    fn default_config(&self, _target: &Target) -> String {
        format!("{}/v{}/default", self.name(), self.version().declared)
    }
    /// The configurations worth measuring for this kernel, the default first: a subset of
    /// [`Backend::configs`] (tile shapes mean nothing to an elementwise kernel). Default: the default alone.
    fn configs_for(&self, target: &Target, _kernel: &Graph) -> Vec<String> {
        vec![self.default_config(target)]
    }
    /// Fill and stroke (SVG colours) of this backend's partitions in `tessera explain --svg`.
    fn colors(&self) -> (&'static str, &'static str);
    /// Analytical cost estimate of running these nodes as one partition, in microseconds.
    fn estimate_us(&self, g: &Graph, nodes: &[NodeId], target: &Target) -> f64;
    /// Constants of at most this many elements stay inside this backend's kernel graphs (it may inline them
    /// into code); larger ones become kernel inputs. Code generators keep [`INLINE_CONST_MAX`]; library
    /// backends, whose calls read every operand from device memory, take 0 (every constant an argument, so a
    /// 64-channel convolution's bias reaches cuDNN like any other).
    fn inline_const_max(&self) -> usize {
        INLINE_CONST_MAX
    }
    /// Whether this backend runs 16-bit convolutions channels-last without transforming its operands, so that
    /// `-layout=auto` plans a model without depthwise convolutions channels-last alone where it is among the
    /// targets (measured, see `stages::layout`). Default: no.
    fn native_channels_last_half(&self) -> bool {
        false
    }
    /// Lowers one partition, given as a standalone kernel graph, to a function named `symbol`, in the
    /// default configuration.
    fn lower(&self, target: &Target, kernel: &Graph, symbol: &str) -> Result<LoweredKernel, BackendError>;
    /// Lowers in configuration `config` (one of [`Backend::configs_for`] the kernel). Default: the default
    /// configuration through [`Backend::lower`], any other refused; a backend with a tuning space overrides
    /// this (and has `lower` call it with its default).
    fn lower_config(&self, target: &Target, kernel: &Graph, symbol: &str, config: &str) -> Result<LoweredKernel, BackendError> {
        if config == self.default_config(target) {
            self.lower(target, kernel, symbol)
        } else {
            Err(BackendError::unsupported(self.name(), format!("no configuration '{config}' (it has only '{}')", self.default_config(target))))
        }
    }
    /// Compiles all of one model's lowered partitions into one module.
    fn compile_module(&self, target: &Target, kernels: &[LoweredKernel]) -> Result<Module, BackendError>;
}

#[cfg(test)]
#[path = "mod_tests.rs"]
mod tests;
