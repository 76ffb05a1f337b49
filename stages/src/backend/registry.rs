//! Every backend compiled into this build. The pipeline asks each whether it can run here
//! ([`super::Backend::available`]); targets select them by name.

use super::{c::CBackend, cublas::CublasBackend, cuda::CudaBackend, cudnn::CudnnBackend, gemm::GemmBackend, Backend};

/// All backends of this build, in a fixed order.
pub fn all() -> Vec<Box<dyn Backend>> {
    vec![Box::new(CBackend), Box::new(GemmBackend), Box::new(CudaBackend), Box::new(CublasBackend), Box::new(CudnnBackend)]
}
