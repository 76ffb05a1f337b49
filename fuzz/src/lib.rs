//! Fuzzing of every parser of untrusted input, on stable Rust: seeded and reproducible (each execution's
//! input is generated from the run seed and its index), structure-aware (ONNX models and artifact bodies
//! are decoded, mutated as structures and re-encoded; targets, manifests and `.npy` headers are generated
//! from their grammars) and mutation-based (real seeds from the repository, damaged byte by byte).
//!
//! Each execution runs under `catch_unwind` (a panic is a finding), with a hang watchdog, and with the
//! counting allocator of [`alloc`] armed (one allocation far larger than the input justifies is a finding).
//! `tessera-fuzz` (src/main.rs) is the driver; tests/short.rs runs a short budget of each target in CI.

pub mod alloc;
pub mod harness;
pub mod mutate;
pub mod rng;
pub mod targets;

pub use harness::{run, Finding, FindingKind, Report, RunOptions};
pub use targets::{target, Corpus, FuzzTarget, TARGETS};
