//! tessera's content-addressed store: blake3-named objects, the memo table, roots and counters.

pub mod digest;

pub use digest::Digest;
