//! Lowering machinery that belongs to no backend: what the code generators share (the `c` backend's C and
//! the `cuda` backend's CUDA), and the partition cost formulas every backend's estimate builds on. No module
//! here names a backend; backends import it, never one another.
//!
//! - [`plan`]: fusion and buffer planning of one kernel graph (groups, anchors and their epilogues, aliases,
//!   and for a backend that addresses operands through strides, virtual values and stores into a view);
//! - [`nest`]: loop nests over a domain, broadcasting and flat strides, which the plan and both generators use;
//! - [`cexpr`]: C expressions of the IR's scalar ops, the same text in C and CUDA;
//! - [`scratch`]: liveness-planned offsets of a kernel's intermediates in one scratch buffer;
//! - [`text`]: source text both preludes share (the scalar math `scalar.h`) and the indentation of bodies;
//! - [`cost`]: flops and boundary bytes of a partition, which each backend turns into microseconds at its
//!   own rates.
//!
//! Every file here is in the code unit of each backend that uses it (`code/units.rs`), so a change to it
//! re-keys their kernels and measurements.

pub mod cexpr;
pub mod cost;
pub mod nest;
pub mod plan;
pub mod scratch;
pub mod text;
