//! tessera's content-addressed store: blake3-named objects, the memo table, roots and counters.
//!
//! See `store/README.md` for the format on disk, the durability and repair story, and what the worst
//! case loses. Module map, one job each:
//! - [`digest`], [`key`]: how things are named; the one key builder every stage uses.
//! - [`objects`]: verified, atomically written blobs (the local object tier).
//! - `index` (SQLite, private), `journal` (private): the memo table, roots and counters, and the log
//!   that lets the index be rebuilt.
//! - `lock` (private): many processes share a store; what deletes holds it alone. [`local_lease`]: one
//!   process computes each output, the others sharing the store wait for its entry.
//! - [`store`]: the `Store` handle the pipeline uses; `maintenance` (verify, gc), [`evict`] (the size cap:
//!   least-recently-used eviction) and [`archive`] (export, import) add methods to it.
//! - [`tier`]: the narrow interfaces a tier implements; [`remote`]: the remote tier (Redis, WebDAV, S3; TLS
//!   and credentials) behind them, which `Store::with_remote` composes with the local one.
//! - [`facts`]: facts about this machine cached across processes (the GPU's fingerprint), named by what
//!   proves them current; not content, never in the memo table or the remote.

pub mod archive;
pub mod digest;
pub mod error;
pub mod evict;
mod evict_intent;
pub mod facts;
mod index;
mod journal;
pub mod key;
pub mod lease;
pub mod local_lease;
mod layout;
mod lock;
pub mod maintenance;
pub mod memo;
pub mod objects;
pub mod remote;
pub mod stats;
pub mod store;
pub mod tier;

pub use archive::{ExportReport, ImportReport, Manifest};
pub use digest::Digest;
pub use error::{Result, StoreError};
pub use evict::{parse_size, EvictReport};
pub use facts::MachineFacts;
pub use key::{
    canonical_bytes, canonical_digest, Ingredient, IngredientKind, KeyBuilder, KeyExplained, KEY_FORMAT_VERSION,
};
pub use layout::{default_dir, resolve_dir, DEFAULT_DIR, STORE_ENV};
pub use maintenance::{BadObject, GcReport, VerifyReport};
pub use memo::{MemoEntry, MemoRecord};
pub use objects::{LocalObjects, PutOutcome, VerifiedReader};
pub use stats::{StageStats, Stats};
pub use store::{OpenOptions, OpenReport, Store};
pub use lease::{LeaseGuard, Leases};
pub use local_lease::{LocalClaim, LocalLease};
pub use remote::{
    Credentials, CredentialsError, Remote, RemoteOptions, RemoteStats, RemoteUrl, S3Settings, CA_ENV, CREDENTIALS_ENV, DEFAULT_REMOTE_TIMEOUT, REMOTE_ENV,
};
pub use remote::keyfile::{KeyFileError, SIGNING_KEY_ENV, TRUST_ENV};
pub use remote::sign::{MemoSigner, PublicKey, Signing, Trust};
pub use tier::{MemoTier, ObjectTier};
