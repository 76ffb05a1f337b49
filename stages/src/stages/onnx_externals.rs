//! The onnx-externals stage: the external data locations an ONNX model file names, memoized by the file's
//! digest so a rebuild of an unchanged model reads no protobuf ([`crate::onnx::source`] scans them).

use crate::code::CodeVersion;
use crate::onnx::source::{import_version, scan_external_locations};
use crate::stage::{DevicePolicy, Stage};
use anyhow::{bail, Context, Result};
use tessera_store::Digest;

/// Stage: the external data locations an ONNX model file names. Output: the sorted locations.
pub struct ExternalFiles<'a> {
    /// Key ingredient: the model file's blake3.
    pub file: Digest,
    /// The means: the file's bytes (read only on a miss; checked against `file`).
    pub read: &'a (dyn Fn() -> Result<Vec<u8>> + Sync),
}

impl Stage for ExternalFiles<'_> {
    const NAME: &'static str = "onnx-externals";
    const DEVICE: DevicePolicy = DevicePolicy::Busy;
    type Output = Vec<String>;
    fn version(&self) -> CodeVersion {
        import_version()
    }
    fn key(&self) -> Result<Digest> {
        Ok(self.key_builder().input_digest("file", &self.file).finish()?)
    }
    fn compute(&self) -> Result<Vec<String>> {
        let bytes = (self.read)()?;
        // On every core: a model file is hundreds of megabytes (one thread took 0.2 s of a BERT-base rebuild).
        if Digest(*blake3::Hasher::new().update_rayon(&bytes).finalize().as_bytes()) != self.file {
            bail!("the model file changed while it was being compiled");
        }
        Ok(scan_external_locations(&bytes).context("not a valid ONNX model")?.into_iter().collect())
    }
}

#[cfg(test)]
#[path = "onnx_externals_tests.rs"]
mod tests;
