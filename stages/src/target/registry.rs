//! The target registry: every device kind with its own attributes, and every backend's description (its
//! `-compiler` value and its own typed options), each registered by the backend's folder. Its version is part
//! of every target digest, so changing a default invalidates what was compiled with the old one.
//!
//! A target is a device kind, the `-compiler` that selects a backend on it, the kind's attributes (`-arch`,
//! `-precision`: what every backend of the device shares, so every target of a set must agree on them) and the
//! selected backend's own options (`-opt-level` for `c`, `-tune-configs` for `cuda`...). Nothing here names a
//! backend: a backend of this crate submits its [`BackendSpec`] from its own folder (through
//! `crate::backend::registry::register_builtin!`), one built elsewhere calls `backend::registry::register` at run time.

use super::AttrValue;

/// Bump whenever a kind, attribute, type or default changes (4: backend options belong to their backend; 5: the
/// cuda kind's `-overflow`; 6: its `-layout`).
pub const REGISTRY_VERSION: u32 = 6;

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

/// A device kind: its name, its own attributes, and the `-compiler` value of its default backend (the least
/// specialized, which takes what no other backend claims).
#[derive(Debug)]
pub struct KindSpec {
    pub name: &'static str,
    pub doc: &'static str,
    /// The kind's attributes, shared by every backend of the device (`-compiler` is not among them: its values
    /// are the backends').
    pub attrs: &'static [AttrSpec],
    pub default_compiler: &'static str,
}

/// A backend's description, as targets see it: registered once by the backend's folder.
#[derive(Debug)]
pub struct BackendSpec {
    /// The backend's name (reports, artifacts, `Backend::name`).
    pub name: &'static str,
    /// The device kind it runs on.
    pub device: &'static str,
    /// The `-compiler` value that selects it.
    pub compiler: &'static str,
    pub doc: &'static str,
    /// Its own typed options, with defaults and docs: part of its targets' canonical form.
    pub options: &'static [AttrSpec],
    /// Where it comes among the backends of the build (`tessera targets`, the search's candidate order).
    pub order: u32,
}

/// A backend description of this build, as its folder submits it (`crate::backend::registry::register_builtin!`).
pub struct SpecEntry(pub &'static BackendSpec);

inventory::collect!(SpecEntry);

/// The backend descriptions of this build, in no particular order ([`backend_specs`] orders them).
pub fn builtin_specs() -> impl Iterator<Item = &'static BackendSpec> {
    inventory::iter::<SpecEntry>.into_iter().map(|e| e.0)
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
        self.default_compiler
    }

    /// The backends of this kind, in registry order: this build's, then those registered at run time.
    pub fn backends(&self) -> Vec<&'static BackendSpec> {
        backend_specs().into_iter().filter(|b| b.device == self.name).collect()
    }

    /// The `-compiler` values of this kind, the default first.
    pub fn compiler_names(&self) -> String {
        let mut names: Vec<&str> = vec![self.default_compiler];
        names.extend(self.backends().iter().map(|b| b.compiler).filter(|c| *c != self.default_compiler));
        names.join(", ")
    }
}

impl BackendSpec {
    pub fn option_names(&self) -> String {
        self.options.iter().map(|a| format!("-{}", a.name)).collect::<Vec<_>>().join(", ")
    }
}

/// Every target kind tessera knows, with the attributes all of its backends share.
pub static KINDS: &[KindSpec] = &[
    KindSpec { name: "cpu", doc: "the host CPU", attrs: &[], default_compiler: "c" },
    KindSpec {
        name: "cuda",
        doc: "an NVIDIA GPU",
        attrs: &[
            AttrSpec { name: "arch", ty: AttrType::Enum(&["sm_80", "sm_86", "sm_89", "sm_90"]), default: "sm_90", doc: "GPU architecture to compile for" },
            AttrSpec { name: "precision", ty: AttrType::Enum(&["fp32", "fp16", "bf16"]), default: "fp32", doc: "storage precision of activations and weights: fp16 and bf16 convert weights once at compile time and keep fp32 accumulation (inputs and outputs stay fp32); bf16 has fp32's range (sm_80 and newer)" },
            AttrSpec { name: "layout", ty: AttrType::Enum(&["auto", "nchw", "nhwc"]), default: "auto", doc: "activation layout of 2-D convolutions and max pools: nhwc runs them channels-last (NhwcConv, NhwcMaxPool; weights transposed once at compile time), with the elementwise ops between them, so cuDNN's tensor-core kernels read their operands without transforms; auto plans both and keeps the faster (measured end to end with measured costs, else by estimate), except in 16-bit builds with cudnn of a model without depthwise convolutions, which it plans channels-last alone (measured 1.6-2.4x faster); the model's inputs and outputs keep their layout either way" },
            AttrSpec { name: "overflow", ty: AttrType::Enum(&["keep-fp32", "error", "bf16"]), default: "keep-fp32", doc: "what -precision=fp16 does where the reference, run on calibration inputs, finds values beyond fp16's range: keep-fp32 computes those nodes in fp32 (between casts), bf16 in bf16 (between casts), error fails naming them (ignored for fp32 and bf16, which have fp32's range)" },
        ],
        default_compiler: "nvrtc",
    },
];

/// Backends registered at run time by code outside this crate ([`register_spec`]).
static REGISTERED: std::sync::RwLock<Vec<&'static BackendSpec>> = std::sync::RwLock::new(Vec::new());

/// Every backend description: this build's in order, then those registered at run time in registration order.
pub fn backend_specs() -> Vec<&'static BackendSpec> {
    let mut all: Vec<&'static BackendSpec> = builtin_specs().collect();
    all.sort_by_key(|b| (b.order, b.name));
    all.extend(REGISTERED.read().unwrap_or_else(|e| e.into_inner()).iter().copied());
    all
}

/// Adds a backend description at run time (`backend::registry::register` calls it): it lasts for the process.
/// Registering the same description again is a no-op; an unknown device kind, or a name or `-compiler` value
/// another backend has, is an error naming both.
pub fn register_spec(spec: &'static BackendSpec) -> Result<(), String> {
    let Some(kind) = self::kind(spec.device) else {
        return Err(format!("registering backend {}: unknown kind '{}'; valid kinds: {}", spec.name, spec.device, kind_names()));
    };
    if spec.compiler.is_empty() || spec.compiler.contains(char::is_whitespace) || spec.compiler.contains('=') {
        return Err(format!("registering backend {}: '{}' is not a valid -compiler value", spec.name, spec.compiler));
    }
    let mut reg = REGISTERED.write().unwrap_or_else(|e| e.into_inner());
    let mut existing: Vec<&'static BackendSpec> = builtin_specs().collect();
    existing.extend(reg.iter().copied());
    for b in existing {
        if std::ptr::eq(b, spec) {
            return Ok(());
        }
        if b.name == spec.name {
            return Err(format!("registering backend {}: a backend of that name is registered already (-compiler={} of kind '{}')", spec.name, b.compiler, b.device));
        }
        if b.device == spec.device && b.compiler == spec.compiler {
            return Err(format!("registering backend {}: kind '{}' already has -compiler={} (backend {})", spec.name, kind.name, spec.compiler, b.name));
        }
    }
    reg.push(spec);
    Ok(())
}

/// The backend that `-compiler=<compiler>` selects on `kind`.
pub fn compiler_backend(kind: &KindSpec, compiler: &str) -> Option<&'static BackendSpec> {
    backend_specs().into_iter().find(|b| b.device == kind.name && b.compiler == compiler)
}

pub fn kind(name: &str) -> Option<&'static KindSpec> {
    KINDS.iter().find(|k| k.name == name)
}

pub fn kind_names() -> String {
    KINDS.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
}
