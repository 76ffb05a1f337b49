//! tessera's kernels crate: C code templates used by the `c` backend (kernels/c/), the artifact format and the
//! linker that writes it (stage 5), and the runtime that loads an artifact and replays its plan.
//!
//! It depends on tessera-stages for the IR and module types; the pipeline calls [`link::link`] as stage 5.

pub mod artifact;
pub mod link;
pub mod runtime;
