//! The targets stage: the canonical target set ([`crate::target::TargetSet`]), recorded so a store says which
//! target sets were compiled for.

use crate::stage::{DevicePolicy, Stage};
use crate::target::TargetSet;
use anyhow::Result;
use tessera_store::Digest;

/// Stage: canonical targets.
pub struct Targets<'a> {
    pub targets: &'a TargetSet,
}

impl Stage for Targets<'_> {
    const NAME: &'static str = "targets";
    const DEVICE: DevicePolicy = DevicePolicy::Own;
    type Output = TargetSet;
    fn version(&self) -> crate::code::CodeVersion {
        crate::code::CodeVersion::new(crate::target::REGISTRY_VERSION, &[crate::code::digests::TARGETS])
    }
    fn key(&self) -> Result<Digest> {
        Ok(self.key_builder().input("targets", self.targets).finish()?)
    }
    fn compute(&self) -> Result<TargetSet> {
        Ok(self.targets.clone())
    }
}
