//! Code versions: what names, in every key, the code that computes the key's value.
//!
//! A [`CodeVersion`] is a declared number (bumped by hand when an output's *meaning* changes, and shown in
//! reports) combined with the digests of the source units that produce the output (`units.rs`, embedded at
//! build time by `build.rs` through `tessera-source-digest`). Every stage's key and every backend's
//! ingredient carries one, so a change to a generator, a prelude or a template changes the keys of what it
//! produces even when nobody bumps a number: after an upgrade a user's store rebuilds what changed, cold,
//! and serves everything else from cache.

use serde::Serialize;
use tessera_store::{Digest, KeyBuilder};

mod units;
pub use units::UNITS;

/// The embedded digests of this crate's source units, one constant per unit of [`UNITS`].
pub mod digests {
    include!(concat!(env!("OUT_DIR"), "/source_digests.rs"));
}

/// The runtime's source units (linking and measuring depend on them).
pub use tessera_kernels::code as runtime_digests;

/// A code version: the declared number and the digest of it combined with the source units' digests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct CodeVersion {
    /// The hand-bumped number (`v{declared}` in reports and configuration names).
    pub declared: u32,
    /// blake3 over the declared number and every unit's source digest.
    pub source: Digest,
}

impl CodeVersion {
    /// The version made of `declared` and the digests of `units`, in that order.
    pub fn new(declared: u32, units: &[[u8; 32]]) -> CodeVersion {
        CodeVersion { declared, source: Digest(tessera_source_digest::combine(declared, units)) }
    }

    /// A key builder for stage `name` at this version: the declared number in the key's header, the source
    /// digest as its `code` ingredient.
    pub fn key_builder(&self, name: &str) -> KeyBuilder {
        KeyBuilder::new(name, self.declared).env("code", &self.source)
    }
}

impl std::fmt::Display for CodeVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "v{}+{}", self.declared, &self.source.to_hex()[..12])
    }
}

#[cfg(test)]
#[path = "mod_tests.rs"]
mod tests;
