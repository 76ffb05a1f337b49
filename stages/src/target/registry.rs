//! The target-kind registry: every kind, its attributes, their types and defaults. Its version is part of
//! every target digest, so changing a default invalidates what was compiled with the old one.

use super::AttrValue;

/// Bump whenever a kind, attribute, type or default changes.
pub const REGISTRY_VERSION: u32 = 3;

#[derive(Debug)]
pub enum AttrType {
    Bool,
    Int { min: i64, max: i64 },
    Enum(&'static [&'static str]),
}

#[derive(Debug)]
pub struct AttrSpec {
    pub name: &'static str,
    pub ty: AttrType,
    /// The default, as it would be written after `-name=`.
    pub default: &'static str,
    pub doc: &'static str,
}

#[derive(Debug)]
pub struct KindSpec {
    pub name: &'static str,
    pub doc: &'static str,
    pub attrs: &'static [AttrSpec],
    /// `-compiler` values and the backend each selects; the first is the device's default (least specialized).
    pub compilers: &'static [(&'static str, &'static str)],
}

impl AttrType {
    /// Parses a written value (`None` for a bare `-flag`).
    pub fn parse(&self, text: Option<&str>) -> Result<AttrValue, String> {
        match (self, text) {
            (AttrType::Bool, None) => Ok(AttrValue::Bool(true)),
            (AttrType::Bool, Some("true" | "1")) => Ok(AttrValue::Bool(true)),
            (AttrType::Bool, Some("false" | "0")) => Ok(AttrValue::Bool(false)),
            (AttrType::Bool, Some(v)) => Err(format!("'{v}' is not a bool (true or false)")),
            (_, None) => Err(format!("needs a value ({})", self.describe())),
            (AttrType::Int { min, max }, Some(v)) => match v.parse::<i64>() {
                Ok(i) if (*min..=*max).contains(&i) => Ok(AttrValue::Int(i)),
                Ok(i) => Err(format!("{i} is out of range {min}..={max}")),
                Err(_) => Err(format!("'{v}' is not an integer ({})", self.describe())),
            },
            (AttrType::Enum(options), Some(v)) => {
                if options.contains(&v) {
                    Ok(AttrValue::Str(v.to_string()))
                } else {
                    Err(format!("'{v}' is not one of: {}", options.join(", ")))
                }
            }
        }
    }

    pub fn describe(&self) -> String {
        match self {
            AttrType::Bool => "bool".into(),
            AttrType::Int { min, max } => format!("integer {min}..={max}"),
            AttrType::Enum(o) => format!("one of {}", o.join("|")),
        }
    }
}

impl AttrSpec {
    pub fn default(&self) -> AttrValue {
        self.ty.parse(Some(self.default)).expect("registry defaults are valid")
    }
}

impl KindSpec {
    pub fn attr_names(&self) -> String {
        self.attrs.iter().map(|a| format!("-{}", a.name)).collect::<Vec<_>>().join(", ")
    }

    pub fn default_compiler(&self) -> &'static str {
        self.compilers[0].0
    }
}

const CPU_COMPILERS: &[&str] = &["c", "gemm"];
const CUDA_COMPILERS: &[&str] = &["nvrtc", "cublas", "cudnn", "cutlass"];

/// Every target kind tessera knows.
pub static KINDS: &[KindSpec] = &[
    KindSpec {
        name: "cpu",
        doc: "the host CPU",
        compilers: &[("c", "c"), ("gemm", "gemm")],
        attrs: &[
            AttrSpec { name: "compiler", ty: AttrType::Enum(CPU_COMPILERS), default: "c", doc: "backend: c = generated C compiled to a shared object (runs everything); gemm = matmul and conv through the matrixmultiply crate" },
            AttrSpec { name: "opt-level", ty: AttrType::Int { min: 0, max: 3 }, default: "2", doc: "C compiler optimization level (-O)" },
            AttrSpec { name: "fast-math", ty: AttrType::Bool, default: "false", doc: "let the C compiler reassociate floating point (-ffast-math); results may differ in the last bits" },
            AttrSpec { name: "march", ty: AttrType::Enum(&["generic", "x86-64-v2", "x86-64-v3", "native"]), default: "generic", doc: "instruction set for generated code; native ties artifacts to the build machine" },
        ],
    },
    KindSpec {
        name: "cuda",
        doc: "an NVIDIA GPU",
        compilers: &[("nvrtc", "cuda"), ("cublas", "cublas"), ("cudnn", "cudnn"), ("cutlass", "cutlass")],
        attrs: &[
            AttrSpec { name: "compiler", ty: AttrType::Enum(CUDA_COMPILERS), default: "nvrtc", doc: "backend: nvrtc = tessera's CUDA codegen; cublas = cuBLASLt; cudnn = cuDNN; cutlass = CUTLASS templates" },
            AttrSpec { name: "arch", ty: AttrType::Enum(&["sm_80", "sm_86", "sm_89", "sm_90"]), default: "sm_90", doc: "GPU architecture to compile for" },
            AttrSpec { name: "fast-math", ty: AttrType::Bool, default: "false", doc: "fast math intrinsics in generated kernels" },
            AttrSpec { name: "precision", ty: AttrType::Enum(&["fp32", "fp16"]), default: "fp32", doc: "storage precision of activations and weights: fp16 converts weights once at compile time and keeps fp32 accumulation (inputs and outputs stay fp32)" },
            AttrSpec { name: "tune-configs", ty: AttrType::Int { min: 1, max: 64 }, default: "16", doc: "tuning budget: the tune stage measures at most this many configurations of each kernel (the backend's default first, then its others in order); 1 measures only the default, 16 every one offered today" },
        ],
    },
];

/// A `-compiler` value declared at run time by a backend built outside this crate
/// ([`register_compiler`]): (kind, compiler value, backend name).
type Registered = (&'static str, &'static str, &'static str);

static REGISTERED: std::sync::RwLock<Vec<Registered>> = std::sync::RwLock::new(Vec::new());

/// Declares that `-compiler=<compiler>` on targets of `kind` selects `backend`, for a backend built outside
/// this crate (the backends of this build are listed in [`KINDS`]). It lasts for the process. Registering
/// the same triple again is a no-op; a value the kind already has, or an unknown kind, is an error naming it.
/// Registered values never change the digest of a target that does not use them.
pub fn register_compiler(kind: &str, compiler: &'static str, backend: &'static str) -> Result<(), String> {
    let Some(spec) = self::kind(kind) else {
        return Err(format!("registering -compiler={compiler} (backend {backend}): unknown kind '{kind}'; valid kinds: {}", kind_names()));
    };
    if compiler.is_empty() || compiler.contains(char::is_whitespace) || compiler.contains('=') {
        return Err(format!("registering backend {backend}: '{compiler}' is not a valid -compiler value"));
    }
    if let Some((_, b)) = spec.compilers.iter().find(|(c, _)| *c == compiler) {
        return Err(format!("registering backend {backend}: kind '{kind}' already has -compiler={compiler} (backend {b})"));
    }
    let mut reg = REGISTERED.write().unwrap_or_else(|e| e.into_inner());
    match reg.iter().find(|(k, c, _)| *k == spec.name && *c == compiler) {
        Some((_, _, b)) if *b == backend => Ok(()),
        Some((_, _, b)) => Err(format!("registering backend {backend}: -compiler={compiler} of kind '{kind}' already selects backend {b}")),
        None => {
            reg.push((spec.name, compiler, backend));
            Ok(())
        }
    }
}

/// The backend that `-compiler=<compiler>` selects on `kind`: from [`KINDS`], else from [`register_compiler`].
pub(crate) fn compiler_backend(kind: &KindSpec, compiler: &str) -> Option<&'static str> {
    if let Some((_, b)) = kind.compilers.iter().find(|(c, _)| *c == compiler) {
        return Some(b);
    }
    let reg = REGISTERED.read().unwrap_or_else(|e| e.into_inner());
    reg.iter().find(|(k, c, _)| *k == kind.name && *c == compiler).map(|(_, _, b)| *b)
}

pub fn kind(name: &str) -> Option<&'static KindSpec> {
    KINDS.iter().find(|k| k.name == name)
}

pub fn kind_names() -> String {
    KINDS.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
}
