//! Import errors. Every error names the file, and where a node is at fault, the node (its name, or its index
//! when unnamed), its op and the attribute involved, so a user of a zoo of hundreds of models can find the
//! cause without a debugger.

use std::fmt;

/// Where in the model an error arose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLocation {
    /// The node's name, or `#<index>` when the model left it unnamed.
    pub node: String,
    /// The ONNX op type (with its domain when not the default one).
    pub op: String,
    /// The attribute at fault, when one is.
    pub attribute: Option<String>,
}

/// What went wrong.
#[derive(Debug)]
pub enum ImportErrorKind {
    /// The file could not be read.
    Io(std::io::Error),
    /// The bytes are not a valid ONNX protobuf (malformed or truncated).
    Decode(prost::DecodeError),
    /// The model uses an opset version outside the supported range.
    UnsupportedOpset { domain: String, version: i64 },
    /// The op (in its domain) has no converter.
    UnsupportedOp { op: String },
    /// A supported op used in a way the IR cannot express (an attribute value, a data type, a training mode...).
    /// `what` is a short tally key ("dtype DOUBLE", "Pad mode wrap") used by coverage reports.
    Unsupported { what: String, detail: String },
    /// A shape, or a shape-like operand, that cannot be made static.
    NotStatic(String),
    /// A node input, graph output or external-data file that does not exist.
    Missing(String),
    /// An attribute that is absent where required, of the wrong type, or out of range.
    BadAttribute(String),
    /// Anything else that makes the model invalid (inconsistent shapes, bad tensor data...).
    Invalid(String),
}

/// An error importing one ONNX file.
#[derive(Debug)]
pub struct ImportError {
    /// The model file (or the name given to [`super::import_bytes`]).
    pub file: String,
    pub location: Option<NodeLocation>,
    pub kind: ImportErrorKind,
}

impl ImportError {
    pub fn new(file: impl Into<String>, kind: ImportErrorKind) -> Self {
        ImportError { file: file.into(), location: None, kind }
    }

    /// True when the model is valid ONNX that this importer does not support (an op, a data type, an attribute
    /// value, an opset, or a shape-like operand computed at run time, which the static-shape IR cannot
    /// express): what coverage reports count as "unsupported" rather than as a failure.
    pub fn is_unsupported(&self) -> bool {
        self.unsupported_key().is_some()
    }

    /// A short key for tallying unsupported features: the op name, `dtype X`, `opset N`, `<op> with a
    /// run-time shape operand`...
    pub fn unsupported_key(&self) -> Option<String> {
        match &self.kind {
            ImportErrorKind::UnsupportedOp { op } => Some(op.clone()),
            ImportErrorKind::NotStatic(_) => {
                Some(self.location.as_ref().map_or("symbolic input dimension".into(), |l| format!("{} with a run-time shape operand", l.op)))
            }
            ImportErrorKind::Unsupported { what, .. } => Some(what.clone()),
            ImportErrorKind::UnsupportedOpset { domain, version } => {
                Some(format!("opset {}{version}", if domain.is_empty() { String::new() } else { format!("{domain} ") }))
            }
            _ => None,
        }
    }
}

impl fmt::Display for ImportErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImportErrorKind::Io(e) => write!(f, "cannot read: {e}"),
            ImportErrorKind::Decode(e) => write!(f, "not a valid ONNX protobuf (malformed or truncated): {e}"),
            ImportErrorKind::UnsupportedOpset { domain, version } => {
                let d = if domain.is_empty() { "ai.onnx" } else { domain };
                write!(f, "opset {d} version {version} is not supported (supported: ai.onnx {}..={})", super::MIN_OPSET, super::MAX_OPSET)
            }
            ImportErrorKind::UnsupportedOp { op } => write!(f, "unsupported op {op}"),
            ImportErrorKind::Unsupported { detail, .. } => write!(f, "unsupported: {detail}"),
            ImportErrorKind::NotStatic(m) => write!(f, "cannot be made static: {m}"),
            ImportErrorKind::Missing(m) => write!(f, "missing: {m}"),
            ImportErrorKind::BadAttribute(m) => write!(f, "{m}"),
            ImportErrorKind::Invalid(m) => write!(f, "invalid model: {m}"),
        }
    }
}

impl fmt::Display for ImportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(loc) = &self.location {
            write!(f, ": node '{}' ({})", loc.node, loc.op)?;
            if let Some(a) = &loc.attribute {
                write!(f, ", attribute '{a}'")?;
            }
        }
        write!(f, ": {}", self.kind)
    }
}

/// No `source()`: the cause (the OS error, prost's decode error) is already in the message, and anyhow's
/// `{:#}`, which prints every error of the chain, would print it twice ("cannot read: No such file or
/// directory (os error 2): No such file or directory (os error 2)").
impl std::error::Error for ImportError {}

/// An error raised inside a converter, before the importer attaches the file and node to it.
#[derive(Debug)]
pub struct NodeError {
    pub attribute: Option<String>,
    pub kind: ImportErrorKind,
}

pub type NResult<T> = Result<T, NodeError>;

impl NodeError {
    pub fn attr(name: &str, msg: impl Into<String>) -> Self {
        NodeError { attribute: Some(name.to_string()), kind: ImportErrorKind::BadAttribute(msg.into()) }
    }
    pub fn unsupported(what: impl Into<String>, detail: impl Into<String>) -> Self {
        NodeError { attribute: None, kind: ImportErrorKind::Unsupported { what: what.into(), detail: detail.into() } }
    }
    pub fn unsupported_attr(name: &str, what: impl Into<String>, detail: impl Into<String>) -> Self {
        NodeError {
            attribute: Some(name.to_string()),
            kind: ImportErrorKind::Unsupported { what: what.into(), detail: detail.into() },
        }
    }
    pub fn not_static(msg: impl Into<String>) -> Self {
        NodeError { attribute: None, kind: ImportErrorKind::NotStatic(msg.into()) }
    }
    pub fn missing(msg: impl Into<String>) -> Self {
        NodeError { attribute: None, kind: ImportErrorKind::Missing(msg.into()) }
    }
    pub fn invalid(msg: impl Into<String>) -> Self {
        NodeError { attribute: None, kind: ImportErrorKind::Invalid(msg.into()) }
    }
}

/// Shorthand for an invalid-node error.
pub fn invalid<T>(msg: impl Into<String>) -> NResult<T> {
    Err(NodeError::invalid(msg))
}

#[cfg(test)]
#[path = "error_tests.rs"]
mod tests;
