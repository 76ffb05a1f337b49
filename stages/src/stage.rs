//! The shape every stage has, and the one interface through which stages are run.
//!
//! A stage is a pure function of its key. A value of a type implementing [`Stage`] is one call of that
//! stage: its fields are the stage's parameters. [`Stage::key`] hashes the parameters that determine the
//! output (the key ingredients, each named, through [`KeyBuilder`]); [`Stage::compute`] produces the output
//! from the same value. Fields that are not in the key are *means*, not ingredients: a way to reach the
//! content a digest in the key names (the model graph behind a graph-document digest, the backend a target
//! selects). Every stage's key-ingredient test (beside the stage) changes each ingredient alone and checks
//! that the key changes.
//!
//! The [`Driver`] (the pipeline's memo table over the store) is the only code that looks a key up,
//! computes on a miss, records the output, counts hits and executions, makes concurrent callers of one
//! key wait for a single execution, and applies the stage's [`DevicePolicy`]. Stages call other stages
//! through [`run`] with the driver they were given, never by hand, so a key has exactly one compute body.

use crate::code::CodeVersion;
use crate::device;
use anyhow::{Context, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::Arc;
use tessera_store::{Digest, Store};

/// What a stage's computation does to the machine, and so what it must not run beside.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevicePolicy {
    /// CPU-heavy compile work (building graphs, lowering, C compiles, linking): runs under
    /// [`device::busy`], so no CPU measurement shares the cores with it.
    Busy,
    /// Does its own device management inside (the tune stage measures under [`device::exclusively`],
    /// and takes [`device::busy`] only around its compiles), or only calls other stages.
    Own,
}

/// One call of a stage.
pub trait Stage: Sync {
    /// The stage's name: in the memo table, the counters and every report.
    const NAME: &'static str;
    /// How the driver guards [`Stage::compute`].
    const DEVICE: DevicePolicy;
    /// The stage's output, stored as one object (see [`Stage::encode`]).
    type Output: Serialize + DeserializeOwned;

    /// The code version that enters the key: the declared number (bump it when the meaning of the output
    /// changes) combined with the digests of the source that computes it ([`crate::code`]).
    fn version(&self) -> CodeVersion;
    /// The key: [`Stage::key_builder`] with every ingredient of this call added.
    fn key(&self) -> Result<Digest>;
    /// Computes the output (on a miss; the driver records it).
    fn compute(&self) -> Result<Self::Output>;

    /// The key builder every key of this stage starts from: the stage's name and code version.
    fn key_builder(&self) -> tessera_store::KeyBuilder {
        self.version().key_builder(Self::NAME)
    }
    /// The output's stored bytes (postcard; a stage whose output is already bytes may store them raw).
    fn encode(out: &Self::Output) -> Result<Vec<u8>> {
        postcard::to_stdvec(out).with_context(|| format!("stage {}: encoding its output", Self::NAME))
    }
    /// The output from its stored bytes.
    fn decode(bytes: &[u8]) -> Result<Self::Output> {
        postcard::from_bytes(bytes).with_context(|| format!("stage {}: decoding its recorded output", Self::NAME))
    }
}

/// Runs stages: looks up, computes, records and counts (implemented by the pipeline's memo table).
pub trait Driver: Sync {
    /// The store outputs live in.
    fn store(&self) -> &Store;
    /// The output digest of stage `name` for `key`: recorded, or `compute`d (called at most once, under
    /// `policy`) and recorded. Concurrent calls of one key wait for one execution.
    fn call(&self, name: &'static str, key: Digest, policy: DevicePolicy, compute: &mut dyn FnMut() -> Result<Vec<u8>>) -> Result<Digest>;
}

/// Runs one stage call through the driver: its output digest and value (decoded from the store on a hit,
/// the fresh value on a miss).
pub fn run<S: Stage>(driver: &dyn Driver, stage: &S) -> Result<(Digest, S::Output)> {
    let key = stage.key().with_context(|| format!("stage {}: building its key", S::NAME))?;
    let mut fresh: Option<S::Output> = None;
    let digest = driver.call(S::NAME, key, S::DEVICE, &mut || {
        let out = stage.compute()?;
        let bytes = S::encode(&out)?;
        fresh = Some(out);
        Ok(bytes)
    })?;
    match fresh {
        Some(out) => Ok((digest, out)),
        None => Ok((digest, load::<S>(driver, &digest)?)),
    }
}

/// Runs one stage call and returns only its output digest (the value is not decoded on a hit).
pub fn run_digest<S: Stage>(driver: &dyn Driver, stage: &S) -> Result<Digest> {
    let key = stage.key().with_context(|| format!("stage {}: building its key", S::NAME))?;
    driver.call(S::NAME, key, S::DEVICE, &mut || S::encode(&stage.compute()?))
}

/// Loads a stage's recorded output by digest.
pub fn load<S: Stage>(driver: &dyn Driver, digest: &Digest) -> Result<S::Output> {
    let bytes = driver.store().get(digest).with_context(|| format!("stage {}: loading output {digest}", S::NAME))?;
    S::decode(&bytes)
}

/// Loads and decodes a postcard value stored as an object (a graph document, a lowered kernel).
pub fn load_value<T: DeserializeOwned>(driver: &dyn Driver, digest: &Digest) -> Result<T> {
    let bytes = driver.store().get(digest)?;
    postcard::from_bytes(&bytes).with_context(|| format!("decoding object {digest}"))
}

/// Runs `compute` under `policy` (the driver's half of the device policy).
pub fn guarded<R>(policy: DevicePolicy, compute: impl FnOnce() -> R) -> R {
    match policy {
        DevicePolicy::Busy => {
            let _busy = device::busy();
            compute()
        }
        DevicePolicy::Own => compute(),
    }
}

/// The error of a stage execution, as every caller of its key receives it (single flight: callers that
/// waited for another's execution get the same error). [`cause`] looks through it.
#[derive(Clone, Debug)]
pub struct SharedFailure(pub Arc<anyhow::Error>);

impl std::fmt::Display for SharedFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for SharedFailure {}

/// The first error of type `T` in `e`'s chain, looking through [`SharedFailure`]s: how a caller branches on
/// a typed error (a backend's refusal) that came back through the driver.
pub fn cause<T: std::error::Error + Send + Sync + 'static>(e: &anyhow::Error) -> Option<&T> {
    e.chain().find_map(|c| c.downcast_ref::<T>().or_else(|| c.downcast_ref::<SharedFailure>().and_then(|s| cause::<T>(&s.0))))
}
