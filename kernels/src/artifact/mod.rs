//! The artifact file: one deployable file per model, written by the linker (`tessera_stages::stages::link`, stage 5) and executed by
//! the runtime ([`crate::runtime::Executable`]).
//!
//! # Format, version 3
//!
//! All integers are little-endian. The file is the *payload* (header, body, data section), then, when the
//! header's flag says so, a provenance section:
//!
//! ```text
//! offset  size  field
//! 0       8     magic                 b"TESSERA\x1a"
//! 8       4     format version (u32)  FORMAT_VERSION
//! 12      4     flags (u32)           0, or FLAG_PROVENANCE (bit 0): a provenance section follows; other bits
//!                                     are refused (reserved for later versions)
//! 16      8     body length (u64)     B
//! 24      8     data length (u64)     D
//! 32      32    blake3 digest of the payload after the header (bytes 64..P)
//! 64      B     body: postcard encoding of `Body`
//! 64+B    pad   zeros up to the next multiple of 64
//! S       D     constant data section, S = align64(64 + B); the payload ends at P = S + D
//! P       ...   with FLAG_PROVENANCE only: the provenance section (`provenance`); the file ends with it.
//!               Without the flag the file ends exactly at P.
//! ```
//!
//! The body ([`Body`]) holds the model name, its inputs and outputs (names, types), the static memory plan
//! (one arena; every input and intermediate value has a 64-byte-aligned offset in it, see [`plan`]), the
//! steps in execution order (module, function, argument buffers), the modules (shared objects, GEMM plans:
//! the backends' [`Module`]s, bytes included) and the constants table: one entry per *unique* constant
//! (deduplicated by [`Tensor::digest`](crate::tensor::Tensor::digest)), with its type, digest and the
//! 64-byte-aligned offset of its bytes in the data section.
//!
//! A plan may mix host and GPU modules (a module's [`Place`] follows from its format). Then each place has its
//! own copy of the arena, laid out by the same plan: a buffer lives at the same offset in both. Inputs and
//! constants are present in both from the start; a value is written where its step runs, and the body's
//! [`Transfer`]s say, explicitly, which values are copied to the other place before which step. Validation
//! checks that every step reads only buffers present at its own place. Version 2 added the transfers; version
//! 3 writes a module's format as its name and place.
//!
//! Why this shape: the header alone tells a reader whether it can read the rest (magic, version) and whether
//! the rest is intact (lengths, digest), before anything is decoded. The body is small and decoded whole;
//! the data section is raw little-endian tensor bytes at aligned offsets, so a loader can copy (or, on a GPU,
//! upload) it in one transfer and hand out aligned pointers without touching each constant.
//!
//! Nothing in the file depends on when, where or by whom it was written: no timestamps, no paths, no hash-map
//! order. The same `LinkInput` gives the same payload; the same build (the same tessera, model, targets and
//! options) gives the same provenance. The linker writes payloads only, and the store keeps those: provenance
//! is stamped on when the pipeline writes the file, so no key has to hold the source revision (see
//! [`provenance`] for why). The *payload digest* ([`Artifact::payload_digest`]), the blake3 of the file with
//! the flag cleared and the section dropped, is the linker's output's digest, whether or not provenance was
//! stamped on: the artifact's identity in the store, in `tessera compile --json` and in `fixtures/frozen`. The body encoding is pinned by a test
//! (`format_is_pinned` in kernels/tests/artifact.rs); a change in any encoded type (including the IR's
//! `TensorType` and the backends' `Module`) must bump [`FORMAT_VERSION`].
//!
//! Reading ([`Artifact::read`], [`Artifact::open`]) checks the magic, the version, the flags, the lengths, the
//! digest, then every index, type and bound of the body ([`validate`]), and the provenance section's version,
//! length and digest: a truncated or corrupted file is an [`ArtifactError`] naming the file, never a panic.
//! Artifacts written before provenance was recorded (flags 0) read as before, with no provenance.
//!
//! # Several batch sizes in one file (version 4)
//!
//! A payload of [`BATCHED_FORMAT_VERSION`] has the same header, padding and data section; its body is a
//! [`BatchedBody`]: one plan ([`Body`]) per batch size, ascending, whose constants all index the one shared
//! data section, where each constant is stored once ([`batched`] has the rules and [`batched::join`] the
//! writer). Single-plan files stay version 3, byte for byte. [`Artifact::body`] is the first plan (the
//! smallest batch); [`Artifact::batches`] and [`Artifact::plan`] give every plan.

pub mod batched;
mod header;
pub mod plan;
pub mod provenance;
mod validate;

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::Path;
use crate::module::{Module, Place};
use crate::tensor::{Tensor, TensorType};

pub use header::{BATCHED_FORMAT_VERSION, FORMAT_VERSION, HEADER_LEN, MAGIC};
pub use provenance::{Blake3, Provenance, SourceModel};

/// Alignment of every buffer offset, in the arena and in the data section, and of the memory the runtime
/// allocates: what the calling convention promises to kernels (vector loads, cache lines).
pub const ALIGN: u64 = 64;

/// Rounds `n` up to a multiple of [`ALIGN`].
pub fn align_up(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

/// Bytes a buffer of type `ty` occupies in the arena: its size rounded up to [`ALIGN`], and at least
/// [`ALIGN`], so every buffer (even an empty tensor) has its own address.
pub fn slot_bytes(ty: &TensorType) -> u64 {
    align_up(ty.size_bytes() as u64).max(ALIGN)
}

/// A buffer a step reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Buf {
    /// Model input `i` (its slot in the arena).
    Input(u32),
    /// Intermediate or output value `i` (its slot in the arena).
    Value(u32),
    /// Unique constant `i` of [`Body::constants`] (in the constant data).
    Const(u32),
    /// The scratch buffer, as the last argument of functions that declare scratch.
    Scratch,
}

impl fmt::Display for Buf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Buf::Input(i) => write!(f, "input {i}"),
            Buf::Value(i) => write!(f, "value %{i}"),
            Buf::Const(i) => write!(f, "constant {i}"),
            Buf::Scratch => f.write_str("scratch"),
        }
    }
}

/// A model input.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputDesc {
    pub name: String,
    pub ty: TensorType,
    /// Exclusive upper bound of random integer values for this input (what `tessera run` and `tessera bench`
    /// feed when no value is given): the reference interpreter's bound, lowered where the input indexes a
    /// gather, so random inputs stay valid.
    pub int_bound: i64,
    /// Offset of its slot in the arena.
    pub offset: u64,
}

/// A model output: where its bytes are when the last step has run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputDesc {
    pub name: String,
    pub ty: TensorType,
    pub source: Buf,
}

/// An intermediate (or output) value's slot in the arena.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValueSlot {
    pub ty: TensorType,
    pub offset: u64,
}

/// One call: function `function` of module `module` with the argument pointers of `args`
/// (inputs, outputs, then [`Buf::Scratch`] when the function declares scratch).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub module: u32,
    pub function: u32,
    pub args: Vec<Buf>,
}

/// A unique constant: its bytes are `ty.size_bytes()` bytes at `offset` of the data section.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConstDesc {
    pub ty: TensorType,
    pub digest: [u8; 32],
    pub offset: u64,
}

/// The decoded body of an artifact (see the module documentation for the file layout).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Body {
    pub model: String,
    pub inputs: Vec<InputDesc>,
    pub outputs: Vec<OutputDesc>,
    pub values: Vec<ValueSlot>,
    /// Size of the arena holding every input and value slot.
    pub arena_bytes: u64,
    /// Size of the one scratch buffer: the largest any step's function declares.
    pub scratch_bytes: u64,
    pub steps: Vec<Step>,
    pub modules: Vec<Module>,
    pub constants: Vec<ConstDesc>,
    /// Copies between host and GPU memory, ordered by the step they precede (empty when every module runs
    /// in one place).
    pub transfers: Vec<Transfer>,
}

/// One plan of a batched artifact: the batch size it was compiled for and its body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchPlan {
    pub batch: u64,
    pub body: Body,
}

/// The body of a batched artifact (version [`BATCHED_FORMAT_VERSION`]; the rules in [`batched`]): its plans,
/// batch sizes ascending.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchedBody {
    pub plans: Vec<BatchPlan>,
}

/// An explicit copy: just before step `before` runs, value `value` (written by an earlier step at the other
/// place) is copied to `to`, the place of step `before`, at the same arena offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    pub before: u32,
    pub value: u32,
    pub to: Place,
}

impl Body {
    /// The type of a buffer a step or output names (`None` for scratch or an index out of range).
    pub fn buf_type(&self, b: Buf) -> Option<&TensorType> {
        match b {
            Buf::Input(i) => self.inputs.get(i as usize).map(|d| &d.ty),
            Buf::Value(i) => self.values.get(i as usize).map(|d| &d.ty),
            Buf::Const(i) => self.constants.get(i as usize).map(|d| &d.ty),
            Buf::Scratch => None,
        }
    }

    /// Where step `s` runs (the place of its module's format). The step must exist.
    pub fn step_place(&self, s: usize) -> Place {
        self.modules[self.steps[s].module as usize].format.place()
    }

    /// The total size of every input and value, as if each had its own memory: what the memory plan saves on.
    pub fn unplanned_bytes(&self) -> u64 {
        let inputs = self.inputs.iter().map(|d| slot_bytes(&d.ty));
        inputs.chain(self.values.iter().map(|d| slot_bytes(&d.ty))).sum()
    }
}

/// What is wrong with a decoded body ([`validate_body`]), or with the set of plans of a batched artifact
/// ([`batched::validate`], [`batched::join`]): the kind of rule it breaks, and a message naming what and
/// where (the `Display`, as the file's [`ArtifactErrorKind::Invalid`] shows it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// A size, offset or bound out of range: a type too large to size, a buffer misaligned or outside its
    /// region, an arena or scratch larger than what it holds needs.
    #[error("{0}")]
    Bounds(String),
    /// A name, index or reference that repeats or does not resolve, a step's arguments against its
    /// function's signature, the order of writes, reads and transfers.
    #[error("{0}")]
    Structure(String),
    /// Two buffers live at the same time overlap in the memory plan.
    #[error("{0}")]
    MemoryPlan(String),
    /// The plans of a batched artifact break its rules (see [`batched`]), or cannot be joined.
    #[error("{0}")]
    Batched(String),
}

impl BodyError {
    /// The same error, its message led by `context` (`plan for batch 8: ...`).
    pub fn context(self, context: impl fmt::Display) -> BodyError {
        let led = |m: String| format!("{context}: {m}");
        match self {
            BodyError::Bounds(m) => BodyError::Bounds(led(m)),
            BodyError::Structure(m) => BodyError::Structure(led(m)),
            BodyError::MemoryPlan(m) => BodyError::MemoryPlan(led(m)),
            BodyError::Batched(m) => BodyError::Batched(led(m)),
        }
    }
}

/// What is wrong with an artifact file. A cause (the OS error, postcard's) is in the message and not in
/// `source()`: anyhow's `{:#}` prints every error of the chain, so a cause in both would be printed twice.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactErrorKind {
    #[error("cannot read: {0}")]
    Io(std::io::Error),
    #[error("truncated: {len} bytes, shorter than the {HEADER_LEN}-byte header")]
    TooShort { len: usize },
    #[error("not a tessera artifact (bad magic)")]
    BadMagic,
    #[error("format version {found} is not supported (this runtime reads versions {FORMAT_VERSION} and {BATCHED_FORMAT_VERSION})")]
    Version { found: u32 },
    #[error("unknown flags {0:#x} in the header (written by a newer tessera?)")]
    Flags(u32),
    #[error("file is {actual} bytes, the header promises {expected} (truncated or padded)")]
    Length { expected: u64, actual: u64 },
    #[error("digest mismatch: the file is corrupted")]
    Digest,
    #[error("cannot decode the body: {0}")]
    Decode(postcard::Error),
    #[error("invalid: {0}")]
    Invalid(String),
    #[error("provenance section: {0}")]
    Provenance(String),
}

impl From<std::io::Error> for ArtifactErrorKind {
    fn from(e: std::io::Error) -> Self {
        ArtifactErrorKind::Io(e)
    }
}

/// An artifact could not be read; names the file (or `<memory>`).
#[derive(Debug, thiserror::Error)]
#[error("artifact {file}: {kind}")]
pub struct ArtifactError {
    pub file: String,
    pub kind: ArtifactErrorKind,
}

/// A read, checked artifact: its plan (or plans, one per batch size), its constant data section and its
/// provenance.
#[derive(Clone, Debug)]
pub struct Artifact {
    /// Where it was read from (a path or `<memory>`), for errors.
    pub file: String,
    /// The plan; in a batched artifact, the plan of the smallest batch size (see [`plan`](Self::plan)).
    pub body: Body,
    /// A batched artifact's batch sizes, ascending, one per plan; empty for a single plan.
    batches: Vec<u64>,
    /// A batched artifact's plans after the first.
    more: Vec<Body>,
    /// How it was built; `None` for an artifact written without (before tessera recorded provenance, or a
    /// payload straight from the linker or the store).
    pub provenance: Option<Provenance>,
    /// The whole file; the data section is `bytes[data_start..payload_len]`. Kept whole so that opening a
    /// file with hundreds of megabytes of weights does not copy them before the runtime uploads them, and
    /// shared, so that a batched artifact's [`plan_artifact`](Self::plan_artifact)s do not copy them either.
    bytes: std::sync::Arc<Vec<u8>>,
    data_start: usize,
    payload_len: usize,
}

impl Artifact {
    /// Reads an artifact from memory; errors name it `<memory>`.
    pub fn read(bytes: &[u8]) -> Result<Artifact, ArtifactError> {
        Self::read_named(bytes, "<memory>")
    }

    /// Reads an artifact from memory; errors name it `file`.
    pub fn read_named(bytes: &[u8], file: &str) -> Result<Artifact, ArtifactError> {
        Self::read_owned(bytes.to_vec(), file)
    }

    /// Reads an artifact from memory it takes over; errors name it `file`.
    pub fn read_owned(bytes: Vec<u8>, file: &str) -> Result<Artifact, ArtifactError> {
        let fail = |kind| ArtifactError { file: file.to_string(), kind };
        let header::Decoded { plans, batches, data, payload_len, provenance } = header::decode(&bytes).map_err(fail)?;
        let invalid = |msg| fail(ArtifactErrorKind::Invalid(msg));
        let data_len = data.len() as u64;
        let data_start = payload_len - data.len();
        let mut plans = if batches.is_empty() {
            validate::body(&plans[0], data_len).map_err(|e| invalid(e.to_string()))?;
            plans
        } else {
            let b = BatchedBody { plans: batches.iter().zip(plans).map(|(&batch, body)| BatchPlan { batch, body }).collect() };
            batched::validate(&b, data_len).map_err(|e| invalid(e.to_string()))?;
            b.plans.into_iter().map(|p| p.body).collect()
        };
        let body = plans.remove(0);
        Ok(Artifact { file: file.to_string(), body, batches, more: plans, provenance, bytes: std::sync::Arc::new(bytes), data_start, payload_len })
    }

    /// Plan `i` of a batched artifact as an artifact of that one plan (sharing this one's bytes, not copying
    /// them), for the runtime to load as it loads any artifact; its data section, provenance and payload digest
    /// are the whole file's. Plan 0 of an artifact of one plan is the artifact itself. Panics on an index out
    /// of range.
    pub fn plan_artifact(&self, i: usize) -> Artifact {
        Artifact {
            file: match self.batches.get(i) {
                Some(b) => format!("{} (plan for batch {b})", self.file),
                None => self.file.clone(),
            },
            body: self.plan(i).clone(),
            batches: Vec::new(),
            more: Vec::new(),
            provenance: self.provenance.clone(),
            bytes: self.bytes.clone(),
            data_start: self.data_start,
            payload_len: self.payload_len,
        }
    }

    /// The batch sizes of a batched artifact's plans, ascending; empty for an artifact of one plan (whatever
    /// batch it was compiled for).
    pub fn batches(&self) -> &[u64] {
        &self.batches
    }

    /// How many plans the artifact holds (1 unless it is batched).
    pub fn plan_count(&self) -> usize {
        1 + self.more.len()
    }

    /// Plan `i` (`0..plan_count()`; plan 0 is [`body`](Self::body)). Panics on an index out of range.
    pub fn plan(&self, i: usize) -> &Body {
        if i == 0 {
            &self.body
        } else {
            &self.more[i - 1]
        }
    }

    /// Whether any plan's modules run on the GPU (recorded per module: known before any of them loads).
    pub fn runs_on_gpu(&self) -> bool {
        (0..self.plan_count()).any(|i| self.plan(i).modules.iter().any(|m| m.format.place() == crate::module::Place::Gpu))
    }

    /// Reads and checks the artifact file at `path`.
    pub fn open(path: &Path) -> Result<Artifact, ArtifactError> {
        let file = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| ArtifactError { file: file.clone(), kind: e.into() })?;
        Self::read_owned(bytes, &file)
    }

    /// The constant data section (every unique constant at its [`ConstDesc::offset`]).
    pub fn data(&self) -> &[u8] {
        &self.bytes[self.data_start..self.payload_len]
    }

    /// The payload digest: the blake3 of the file as the linker wrote it, before provenance was stamped on
    /// (the flag cleared, the section dropped); for a file without provenance, its own blake3. Equal for every
    /// build of the same payload, whatever tessera revision stamped it: what the store, `tessera compile
    /// --json` and `fixtures/frozen` name an artifact by. Hashes the whole payload on each call.
    pub fn payload_digest(&self) -> Blake3 {
        provenance::payload_digest(&self.bytes, self.payload_len)
    }

    /// The size of the payload (header, body, data section) in bytes; the file's size less the provenance
    /// section's.
    pub fn payload_len(&self) -> usize {
        self.payload_len
    }

    /// The bytes of unique constant `i`.
    pub fn constant_bytes(&self, i: usize) -> &[u8] {
        let c = &self.body.constants[i];
        &self.data()[c.offset as usize..c.offset as usize + c.ty.size_bytes()]
    }

    /// Random inputs for every model input, in order: the same values the reference interpreter's
    /// `random_inputs(graph, seed)` gives the model's graph (same streams, same integer bounds), so a run on
    /// random inputs compares with a reference run of the same seed. Never all zeros.
    pub fn random_inputs(&self, seed: u64) -> Vec<Tensor> {
        self.body
            .inputs
            .iter()
            .enumerate()
            .map(|(i, d)| crate::random::random_tensor(&d.ty, seed, i as u64, d.int_bound))
            .collect()
    }

    /// A batched artifact's [`random_inputs`](Self::random_inputs) at batch size `batch` (any size up to its
    /// largest plan's): what the reference interpreter draws for the model compiled at that batch size, with
    /// the integer bounds of the plan that serves it. An error names the sizes the artifact serves.
    pub fn random_inputs_at(&self, batch: usize, seed: u64) -> Result<Vec<Tensor>, String> {
        let batches: Vec<usize> = self.batches.iter().map(|&b| b as usize).collect();
        if batches.is_empty() {
            return Err(format!("model '{}' holds one plan: its inputs have fixed shapes (no batch size to choose)", self.body.model));
        }
        let plan = self.plan(batched::choose(&batches, batch).map_err(|e| format!("model '{}': {e}", self.body.model))?);
        Ok(plan
            .inputs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let mut ty = d.ty.clone();
                ty.shape[0] = batch;
                crate::random::random_tensor(&ty, seed, i as u64, d.int_bound)
            })
            .collect())
    }
}

/// Encoding and body validation are the linker's (stage 5, in the compiler), which writes artifacts.
pub use header::encode;
pub use validate::body as validate_body;

#[cfg(test)]
mod error_tests;
