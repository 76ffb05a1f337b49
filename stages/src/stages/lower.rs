//! Stage 3a, lower: one kernel signature for one target, lowered by the target's backend.

use crate::backend::{Backend, LoweredKernel};
use crate::ir::{extract_subgraph, Graph, NodeId};
use crate::partition::plan::kernel_signature;
use crate::stage::{DevicePolicy, Stage};
use crate::target::Target;
use anyhow::{bail, Result};
use tessera_store::Digest;

/// The lower stage's declared version (the backend's code version is an ingredient of its own).
pub const LOWER_VERSION: u32 = 1;

/// Stage: lower one kernel signature for one target (memoized per distinct kernel: twelve identical layers
/// lower once). The tune stage lowers candidates through this same stage, so a kernel measured while
/// partitioning is never lowered again when the model compiles.
pub struct Lower<'a> {
    pub kernel: Digest,
    pub target: &'a Target,
    pub backend: &'a dyn Backend,
    /// The means: the kernel graph (extracted from the model graph; only called on a miss).
    pub graph: &'a (dyn Fn() -> Result<Graph> + Sync),
    pub symbol: &'a str,
    /// The backend configuration (its default, or what the tune stage found fastest).
    pub config: &'a str,
}

impl Stage for Lower<'_> {
    const NAME: &'static str = "lower";
    const DEVICE: DevicePolicy = DevicePolicy::Busy;
    type Output = LoweredKernel;
    fn version(&self) -> crate::code::CodeVersion {
        crate::code::CodeVersion::new(LOWER_VERSION, &[crate::code::digests::LOWER])
    }
    fn key(&self) -> Result<Digest> {
        Ok(self
            .key_builder()
            .input_digest("kernel", &self.kernel)
            .input_digest("target", &self.target.digest())
            .input("backend", &(self.backend.name(), self.backend.version()))
            .input("config", self.config)
            .finish()?)
    }
    fn compute(&self) -> Result<LoweredKernel> {
        let kg = (self.graph)()?;
        Ok(self.backend.lower_config(self.target, &kg, self.symbol, self.config)?)
    }
}

/// The kernel graph of partition `nodes` of `g` for a backend keeping constants of at most `inline_max`
/// elements inside, checked against the signature the plan recorded.
pub fn kernel_graph(g: &Graph, nodes: &[u32], kernel: &Digest, inline_max: usize) -> Result<Graph> {
    let nodes: Vec<NodeId> = nodes.iter().map(|&n| NodeId(n)).collect();
    let sig = kernel_signature(g, &nodes, inline_max);
    if sig.digest != *kernel {
        bail!("kernel signature changed between partition and lower ({} vs {})", sig.digest, kernel);
    }
    Ok(extract_subgraph(g, &sig))
}

