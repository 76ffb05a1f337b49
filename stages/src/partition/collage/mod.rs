//! Collage-style partitioning: per-backend partition rules propose candidate subgraphs, and a shortest-path
//! search over covered-prefix states picks the cheapest cover (Collage, Jeon et al. 2022; see DESIGN.md,
//! "Partitioning (Collage)").
//!
//! This module is pure algorithm: it takes candidate costs as data (measured by the tune stage, or an
//! analytical estimate standing in) and never measures anything itself.
//!
//! - [`eval`]: evaluates the composable partition rules of [`crate::rules`] (`primitive`, `union`, `combine`,
//!   `only_valid`; each backend gives its own set, `Backend::rules`) over a graph.
//! - [`candidates`]: runs every target's rule set over a graph: deduplicated, deterministic, bounded by [`Limits`].
//! - [`search`]: A* (Dijkstra with an admissible bound) over downward-closed covered sets, with a cost for values
//!   crossing between partitions and devices ([`CrossingModel`]); adjacent winners on one target merged after.

pub mod candidates;
mod dag;
pub mod merge;
pub mod eval;
pub mod search;

pub use candidates::{candidates, Candidate};
pub use eval::Limits;
pub use merge::{to_partitioning, Chosen};
pub use search::{search, search_bounded, search_detailed, CrossingModel, SearchBudget, SearchOutcome};

#[cfg(test)]
mod tests;
