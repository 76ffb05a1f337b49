//! Stage 3b, compile: all of one model's lowered kernels for one target into one module
//! (module-at-a-time: one source, one compile).

use crate::backend::{Backend, LoweredKernel, Module};
use crate::stage::{load_value, DevicePolicy, Driver, Stage};
use crate::target::Target;
use anyhow::Result;
use tessera_store::Digest;

/// The compile stage's code version (the backend's version is an ingredient of its own).
pub const COMPILE_VERSION: u32 = 1;

/// Stage: compile all of one model's lowered kernels for one target into one module (module-at-a-time).
pub struct Compile<'a> {
    pub target: &'a Target,
    pub backend: &'a dyn Backend,
    /// Digests of the lowered kernels, in (target, kernel) order.
    pub lowered: &'a [Digest],
    /// The backend's toolchain facts ([`Backend::environment`]).
    pub toolchain: Vec<(String, String)>,
    pub driver: &'a dyn Driver,
}

impl Stage for Compile<'_> {
    const NAME: &'static str = "compile";
    const DEVICE: DevicePolicy = DevicePolicy::Busy;
    type Output = Module;
    fn version(&self) -> crate::code::CodeVersion {
        crate::code::CodeVersion::new(COMPILE_VERSION, &[crate::code::digests::COMPILE])
    }
    fn key(&self) -> Result<Digest> {
        Ok(self
            .key_builder()
            .input_digest("target", &self.target.digest())
            .input("backend", &(self.backend.name(), self.backend.version()))
            .input("lowered_kernels", self.lowered)
            .env("toolchain", &self.toolchain)
            .finish()?)
    }
    fn compute(&self) -> Result<Module> {
        let lks: Vec<LoweredKernel> = self.lowered.iter().map(|d| load_value(self.driver, d)).collect::<Result<_>>()?;
        Ok(self.backend.compile_module(self.target, &lks)?)
    }
}

