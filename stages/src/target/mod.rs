//! Targets (stage 1): the one place for options.
//!
//! A target names a device kind and refines it with typed attributes, in the syntax of the seeds
//! (`cuda -arch=sm_90 -compiler=cublas`, `cpu -compiler=c -opt-level=3`) or as JSON
//! (`{"kind": "cpu", "compiler": "gemm"}`). A backend is a device kind plus its `-compiler`; every backend
//! option is an attribute with a default and a validator. The canonical form fills every default and sorts
//! attributes, so two spellings of one target have one digest; nothing outside the target (environment
//! variables, globals) changes what a backend emits. A target's attributes are its kind's ([`KINDS`]: what
//! every backend of the device shares) and the selected backend's own options ([`BackendSpec`]); the
//! `-compiler` values are the registered backends' ([`registry::backend_specs`]).

mod registry;

pub use registry::{backend_specs, builtin_specs, register_spec, AttrSpec, AttrType, BackendSpec, KindSpec, SpecEntry, KINDS, REGISTRY_VERSION};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use tessera_store::Digest;
use anyhow::Result;

/// A typed attribute value.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AttrValue {
    Bool(bool),
    Int(i64),
    Str(String),
}

impl fmt::Display for AttrValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttrValue::Bool(b) => write!(f, "{b}"),
            AttrValue::Int(i) => write!(f, "{i}"),
            AttrValue::Str(s) => f.write_str(s),
        }
    }
}

/// A validated target in canonical form: every attribute of its kind present, sorted by name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Target {
    pub kind: String,
    pub attrs: BTreeMap<String, AttrValue>,
}

/// A target string, JSON value or set that is not valid; the message names the target and lists what is valid.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct TargetError(pub String);

fn terr<T>(msg: impl Into<String>) -> Result<T, TargetError> {
    Err(TargetError(msg.into()))
}

impl Target {
    /// Parses one target: `kind -key=value -flag ...`, or a JSON object.
    pub fn parse(text: &str) -> Result<Target, TargetError> {
        let trimmed = text.trim();
        if trimmed.starts_with('{') {
            let v: serde_json::Value = serde_json::from_str(trimmed).map_err(|e| TargetError(format!("target {trimmed}: invalid JSON: {e}")))?;
            return Self::from_json(&v);
        }
        let mut words = trimmed.split_whitespace();
        let Some(kind) = words.next() else {
            return terr("empty target string; valid kinds: ".to_string() + &registry::kind_names());
        };
        let mut given: Vec<(String, Option<String>)> = Vec::new();
        for w in words {
            let Some(body) = w.strip_prefix('-') else {
                return terr(format!("target '{trimmed}': expected '-key=value' or '-flag', got '{w}'"));
            };
            let body = body.strip_prefix('-').unwrap_or(body);
            match body.split_once('=') {
                Some((k, v)) => given.push((k.to_string(), Some(v.to_string()))),
                None => given.push((body.to_string(), None)),
            }
        }
        Self::build(trimmed, kind, given)
    }

    /// A target from a JSON object `{"kind": "...", "<attr>": value, ...}`.
    pub fn from_json(v: &serde_json::Value) -> Result<Target, TargetError> {
        let shown = v.to_string();
        let Some(obj) = v.as_object() else {
            return terr(format!("target {shown}: a JSON target must be an object with a \"kind\""));
        };
        let Some(kind) = obj.get("kind").and_then(|k| k.as_str()) else {
            return terr(format!("target {shown}: missing \"kind\"; valid kinds: {}", registry::kind_names()));
        };
        let mut given = Vec::new();
        for (k, val) in obj {
            if k == "kind" {
                continue;
            }
            let text = match val {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Bool(b) => b.to_string(),
                serde_json::Value::Number(n) => n.to_string(),
                other => return terr(format!("target {shown}: attribute \"{k}\" has unsupported value {other}")),
            };
            given.push((k.clone(), Some(text)));
        }
        Self::build(&shown, kind, given)
    }

    fn build(shown: &str, kind: &str, given: Vec<(String, Option<String>)>) -> Result<Target, TargetError> {
        let Some(spec) = registry::kind(kind) else {
            return terr(format!("target '{shown}': unknown kind '{kind}'; valid kinds: {}", registry::kind_names()));
        };
        for (i, (name, _)) in given.iter().enumerate() {
            if given[..i].iter().any(|(n, _)| n == name) {
                return terr(format!("target '{shown}': attribute '-{name}' given twice"));
            }
        }
        // The backend first: its options are the rest of the target's attributes.
        let compiler = match given.iter().find(|(n, _)| n == "compiler") {
            None => spec.default_compiler.to_string(),
            Some((_, None)) => return terr(format!("target '{shown}': -compiler needs a value (one of {})", spec.compiler_names())),
            Some((_, Some(c))) => c.clone(),
        };
        let Some(backend) = registry::compiler_backend(spec, &compiler) else {
            return terr(format!("target '{shown}': -compiler: '{compiler}' is not one of: {}", spec.compiler_names()));
        };
        let mut attrs: BTreeMap<String, AttrValue> = BTreeMap::new();
        attrs.insert("compiler".into(), AttrValue::Str(compiler.clone()));
        for (name, value) in given {
            if name == "compiler" {
                continue;
            }
            let Some(a) = spec.attrs.iter().chain(backend.options).find(|a| a.name == name) else {
                return terr(format!(
                    "target '{shown}': unknown attribute '-{name}' for kind '{kind}' with -compiler={compiler} (backend {}); valid attributes: {}",
                    backend.name,
                    Self::attr_names(spec, backend)
                ));
            };
            let v = a.ty.parse(value.as_deref()).map_err(|why| TargetError(format!("target '{shown}': -{name}: {why}")))?;
            attrs.insert(name, v);
        }
        for a in spec.attrs.iter().chain(backend.options) {
            attrs.entry(a.name.to_string()).or_insert_with(|| a.default());
        }
        Ok(Target { kind: kind.to_string(), attrs })
    }

    fn attr_names(kind: &KindSpec, backend: &BackendSpec) -> String {
        let mut names = vec!["-compiler".to_string()];
        names.extend(kind.attrs.iter().chain(backend.options).map(|a| format!("-{}", a.name)));
        names.join(", ")
    }

    /// The same device and kind attributes, on the backend `-compiler=<compiler>` selects (its options at
    /// their defaults): how a set gains its device's fallback.
    pub fn on_compiler(&self, compiler: &str) -> Result<Target, TargetError> {
        let mut given: Vec<(String, Option<String>)> = vec![("compiler".into(), Some(compiler.to_string()))];
        for a in self.spec().attrs {
            given.push((a.name.to_string(), Some(self.attr(a.name).to_string())));
        }
        Self::build(&format!("{} -compiler={compiler}", self.kind), &self.kind, given)
    }

    /// The description of the backend this target selects.
    pub fn backend_spec(&self) -> &'static BackendSpec {
        registry::compiler_backend(self.spec(), self.compiler()).expect("validated compiler")
    }

    pub fn spec(&self) -> &'static KindSpec {
        registry::kind(&self.kind).expect("a constructed target has a registered kind")
    }

    pub fn attr(&self, name: &str) -> &AttrValue {
        self.attrs.get(name).unwrap_or_else(|| panic!("target kind '{}' has no attribute '{name}'", self.kind))
    }

    pub fn str_attr(&self, name: &str) -> &str {
        match self.attr(name) {
            AttrValue::Str(s) => s,
            other => panic!("attribute '{name}' is {other:?}, not a string"),
        }
    }

    pub fn int_attr(&self, name: &str) -> i64 {
        match self.attr(name) {
            AttrValue::Int(i) => *i,
            other => panic!("attribute '{name}' is {other:?}, not an integer"),
        }
    }

    /// The tuning budget: at most this many configurations of a kernel are measured (`-tune-configs`), or
    /// `None` where the target's kind has no budget (backends with one configuration).
    pub fn tune_budget(&self) -> Option<usize> {
        match self.attrs.get("tune-configs") {
            Some(AttrValue::Int(n)) => Some((*n).max(1) as usize),
            _ => None,
        }
    }

    pub fn bool_attr(&self, name: &str) -> bool {
        match self.attr(name) {
            AttrValue::Bool(b) => *b,
            other => panic!("attribute '{name}' is {other:?}, not a bool"),
        }
    }

    /// The compiler (backend) this target selects on its device.
    pub fn compiler(&self) -> &str {
        self.str_attr("compiler")
    }

    /// The backend's name, as reports and the artifact show it (`c`, `gemm`, `cuda`, `cublas`, ...).
    pub fn backend_name(&self) -> &'static str {
        self.backend_spec().name
    }

    /// The device this target runs on (targets of one device can exchange buffers without copies).
    pub fn device(&self) -> &str {
        &self.kind
    }

    /// True for the device's default compiler: the target that takes what no other backend claims.
    pub fn is_least_specialized(&self) -> bool {
        self.compiler() == self.spec().default_compiler()
    }

    /// The canonical text form, every attribute present and sorted: `cpu -compiler=c -fast-math=false ...`.
    pub fn canonical(&self) -> String {
        self.to_string()
    }

    /// Digest of the canonical form and the registry version.
    pub fn digest(&self) -> Digest {
        let mut h = blake3::Hasher::new();
        h.update(b"tessera.target");
        h.update(&REGISTRY_VERSION.to_le_bytes());
        h.update(&postcard::to_stdvec(self).expect("target encodes"));
        Digest::from(h.finalize())
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.kind)?;
        for (k, v) in &self.attrs {
            write!(f, " -{k}={v}")?;
        }
        Ok(())
    }
}

/// The storage precision of a compiled model (see `passes::precision`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Precision {
    Fp32,
    Fp16,
    /// bfloat16 storage: fp32's exponent range with 8 bits of mantissa, so nothing overflows that fits fp32.
    Bf16,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
        }
    }

    /// The value of the `precision` attribute, as the registry's enum spells it.
    pub fn parse(s: &str) -> Option<Precision> {
        [Precision::Fp32, Precision::Fp16, Precision::Bf16].into_iter().find(|p| p.name() == s)
    }

    /// The element type floats are stored in.
    pub fn dtype(self) -> crate::ir::DType {
        match self {
            Precision::Fp32 => crate::ir::DType::F32,
            Precision::Fp16 => crate::ir::DType::F16,
            Precision::Bf16 => crate::ir::DType::BF16,
        }
    }
}

/// bf16 arithmetic and tensor cores (cuda_bf16.h's conversions, mma.sync .bf16, cuBLASLt and cuDNN's
/// bfloat16 kernels) start at sm_80: a target for an older architecture is refused, naming it.
fn bf16_arch_check(t: &Target) -> Result<(), TargetError> {
    let Some(AttrValue::Str(arch)) = t.attrs.get("arch") else { return Ok(()) };
    match arch.strip_prefix("sm_").and_then(|n| n.parse::<u32>().ok()) {
        Some(n) if n >= 80 => Ok(()),
        _ => terr(format!("target '{t}': -precision=bf16 needs -arch=sm_80 or newer (bf16 tensor cores), got {arch}")),
    }
}

/// What a reduced-precision build does where values leave the narrow type's range (`-overflow`; see
/// `crate::stages::precision`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Overflow {
    /// Compute the nodes whose values leave the range in fp32, between casts.
    KeepFp32,
    /// Fail, naming the nodes and the values seen.
    Error,
    /// Compute those nodes in bf16 (fp32's range, half the bytes), between casts.
    Bf16,
}

impl Overflow {
    pub fn name(self) -> &'static str {
        match self {
            Overflow::KeepFp32 => "keep-fp32",
            Overflow::Error => "error",
            Overflow::Bf16 => "bf16",
        }
    }

    /// The value of the `overflow` attribute, as the registry's enum spells it.
    pub fn parse(s: &str) -> Option<Overflow> {
        [Overflow::KeepFp32, Overflow::Error, Overflow::Bf16].into_iter().find(|o| o.name() == s)
    }
}

/// The layout convolution chains compute in (`-layout`; see `crate::passes::layout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// As imported: channels first, `[N, C, H, W]`.
    Nchw,
    /// Channels last, `[N, H, W, C]`, between the graph's inputs and outputs.
    Nhwc,
    /// Both, the faster kept: measured end to end with measured costs, else by the plans' estimates.
    Auto,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::Nchw => "nchw",
            Layout::Nhwc => "nhwc",
            Layout::Auto => "auto",
        }
    }

    /// The value of the `layout` attribute, as the registry's enum spells it.
    pub fn parse(s: &str) -> Option<Layout> {
        [Layout::Nchw, Layout::Nhwc, Layout::Auto].into_iter().find(|l| l.name() == s)
    }
}

/// A canonical, validated, ordered set of targets: duplicates removed, at most one target per backend, and the
/// least-specialized target of every device present (added with the device's other attributes if not given),
/// so every node has somewhere to run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetSet {
    pub targets: Vec<Target>,
}

impl TargetSet {
    /// Parses and canonicalizes a list of target strings / JSON texts (a JSON array counts as several).
    pub fn parse(texts: &[String]) -> Result<TargetSet, TargetError> {
        let mut targets = Vec::new();
        for t in texts {
            let trimmed = t.trim();
            if trimmed.starts_with('[') {
                let v: serde_json::Value = serde_json::from_str(trimmed).map_err(|e| TargetError(format!("targets {trimmed}: invalid JSON: {e}")))?;
                for item in v.as_array().expect("starts with [") {
                    targets.push(Target::from_json(item)?);
                }
            } else {
                targets.push(Target::parse(trimmed)?);
            }
        }
        Self::from_targets(targets)
    }

    pub fn from_targets(mut targets: Vec<Target>) -> Result<TargetSet, TargetError> {
        if targets.is_empty() {
            return terr("no targets given");
        }
        targets.sort();
        targets.dedup();
        for w in targets.windows(2) {
            if w[0].kind == w[1].kind && w[0].compiler() == w[1].compiler() {
                return terr(format!("two targets select backend '{}': '{}' and '{}'; give one", w[0].backend_name(), w[0], w[1]));
            }
        }
        // Every device needs its least-specialized target as the fallback.
        let devices: Vec<String> = targets.iter().map(|t| t.kind.clone()).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
        for d in devices {
            if !targets.iter().any(|t| t.kind == d && t.is_least_specialized()) {
                let given = targets.iter().find(|t| t.kind == d).expect("device present");
                let fallback = given.on_compiler(given.spec().default_compiler())?;
                targets.push(fallback);
            }
        }
        targets.sort();
        let set = TargetSet { targets };
        set.precision()?;
        set.overflow()?;
        set.layout()?;
        Ok(set)
    }

    /// The precision the model computes in: that of the set's targets with a `precision` attribute (GPU
    /// targets), which must agree, since the graph is rewritten once for all of them; fp32 when none has one.
    pub fn precision(&self) -> Result<Precision, TargetError> {
        let mut found: Option<(&Target, Precision)> = None;
        for t in &self.targets {
            let Some(AttrValue::Str(p)) = t.attrs.get("precision") else { continue };
            let p = Precision::parse(p).ok_or_else(|| TargetError(format!("target '{t}': unknown precision '{p}'")))?;
            if p == Precision::Bf16 {
                bf16_arch_check(t)?;
            }
            match found {
                Some((other, q)) if q != p => {
                    return terr(format!("targets '{other}' and '{t}' ask for different precisions; give every GPU target the same -precision"));
                }
                _ => found = Some((t, p)),
            }
        }
        Ok(found.map(|(_, p)| p).unwrap_or(Precision::Fp32))
    }

    /// The overflow policy of the set's targets with an `overflow` attribute (GPU targets), which must agree as
    /// the precision must; keep-fp32 when none has one.
    pub fn overflow(&self) -> Result<Overflow, TargetError> {
        let mut found: Option<(&Target, Overflow)> = None;
        for t in &self.targets {
            let Some(AttrValue::Str(p)) = t.attrs.get("overflow") else { continue };
            let p = Overflow::parse(p).ok_or_else(|| TargetError(format!("target '{t}': unknown -overflow policy '{p}'")))?;
            match found {
                Some((other, q)) if q != p => {
                    return terr(format!("targets '{other}' and '{t}' ask for different -overflow policies; give every GPU target the same"));
                }
                _ => found = Some((t, p)),
            }
        }
        Ok(found.map(|(_, p)| p).unwrap_or(Overflow::KeepFp32))
    }

    /// The layout of the set's targets with a `layout` attribute (GPU targets), which must agree as the precision
    /// must (the graph is rewritten once for all of them); nchw when none has one (CPU targets).
    pub fn layout(&self) -> Result<Layout, TargetError> {
        let mut found: Option<(&Target, Layout)> = None;
        for t in &self.targets {
            let Some(AttrValue::Str(l)) = t.attrs.get("layout") else { continue };
            let l = Layout::parse(l).ok_or_else(|| TargetError(format!("target '{t}': unknown -layout '{l}'")))?;
            match found {
                Some((other, q)) if q != l => {
                    return terr(format!("targets '{other}' and '{t}' ask for different layouts; give every GPU target the same -layout"));
                }
                _ => found = Some((t, l)),
            }
        }
        Ok(found.map(|(_, l)| l).unwrap_or(Layout::Nchw))
    }

    /// The least-specialized target of a device.
    pub fn fallback(&self, device: &str) -> Option<&Target> {
        self.targets.iter().find(|t| t.device() == device && t.is_least_specialized())
    }

    pub fn digest(&self) -> Digest {
        let mut h = blake3::Hasher::new();
        h.update(b"tessera.targets");
        h.update(&REGISTRY_VERSION.to_le_bytes());
        h.update(&postcard::to_stdvec(self).expect("targets encode"));
        Digest::from(h.finalize())
    }
}

#[cfg(test)]
mod tests;
