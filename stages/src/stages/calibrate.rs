//! Stage: calibrate. The range of every value of a model in fp32 on calibration inputs
//! ([`crate::calibration`]), for reduced precision, once per loaded document.

use crate::calibration::{measure, CalibrationInputs, Ranges, CALIBRATION_RUNS};
use crate::context::LazyGraph;
use crate::stage::{DevicePolicy, Stage};
use anyhow::Result;
use tessera_store::Digest;

/// The stage's code version.
pub const CALIBRATE_VERSION: u32 = 2;

/// Stage: calibrate. Output: [`Ranges`] of the loaded document.
pub struct Calibrate<'a> {
    /// The loaded document.
    pub doc: Digest,
    pub graph: &'a LazyGraph<'a>,
    /// The user's calibration inputs; None: the random ones.
    pub given: Option<&'a CalibrationInputs>,
}

impl Stage for Calibrate<'_> {
    const NAME: &'static str = "calibrate";
    const DEVICE: DevicePolicy = DevicePolicy::Busy;
    type Output = Ranges;
    fn version(&self) -> crate::code::CodeVersion {
        crate::code::CodeVersion::new(CALIBRATE_VERSION, &[crate::code::digests::CALIBRATE])
    }
    fn key(&self) -> Result<Digest> {
        let k = self.key_builder().input_digest("graph", &self.doc);
        Ok(match self.given {
            None => k.input("runs", &CALIBRATION_RUNS),
            Some(c) => k.input_digest("calibration", &c.digest()),
        }
        .finish()?)
    }
    fn compute(&self) -> Result<Ranges> {
        measure(self.graph.get()?, self.given)
    }
}
