//! What goes wrong on the CUDA side, by kind, for callers that branch on it (skip when the GPU stack is not
//! here, tell a missing GPU from a failing one); each variant's text is the message it always was.

/// An error of the CUDA runtime: the driver, its GPUs, the libraries (NVRTC, cuBLASLt, cuDNN) and the GPU
/// module formats. Its `Display` is the whole message (what failed, and the driver's or library's word).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// Something this machine lacks: no driver, no GPU the driver sees, a library (NVRTC, cuBLASLt, cuDNN)
    /// not installed or not loadable.
    #[error("{0}")]
    Unavailable(String),
    /// A GPU ordinal beyond what the driver sees (`count` of them).
    #[error("there is no GPU {ordinal}: the CUDA driver sees {count}{}", gpu_range(*count))]
    NoSuchGpu { ordinal: usize, count: usize },
    /// A driver call failed (opening a context, allocating, querying, launching): what was done and the
    /// driver's error.
    #[error("{0}")]
    Driver(String),
    /// A library call (cuBLASLt, cuDNN) returned a status other than success: the call and the status.
    #[error("{call}: {status}")]
    Library { call: String, status: String },
    /// A GPU module's description does not hold together (undecodable, an operand outside its argument, a
    /// launch out of range...): the message names the module, function and call at fault.
    #[error("{0}")]
    InvalidModule(String),
    /// The library offers no algorithm for a call as described (or not the one the module asks for).
    #[error("{0}")]
    NoAlgorithm(String),
    /// A lock a thread panicked while holding (a library handle's, an algorithm cache's).
    #[error("{0}")]
    Poisoned(String),
}

/// ` (GPU 0 to GPU 3)`: the GPUs there are, for [`CudaError::NoSuchGpu`].
fn gpu_range(count: usize) -> String {
    match count {
        0 => String::new(),
        1 => " (GPU 0)".to_string(),
        n => format!(" (GPU 0 to GPU {})", n - 1),
    }
}

impl CudaError {
    /// Whether the error says this machine cannot do CUDA work at all (no driver, GPU or library), rather
    /// than that some work on it failed.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, CudaError::Unavailable(_))
    }
}

impl From<CudaError> for crate::runtime::RuntimeError {
    fn from(e: CudaError) -> Self {
        crate::runtime::RuntimeError(e.to_string())
    }
}

/// For callers whose own errors are messages (`?` in a function whose error type is `String`).
impl From<CudaError> for String {
    fn from(e: CudaError) -> Self {
        e.to_string()
    }
}
