//! Graph passes: constant folding and the simplifications importers need.

pub mod fold;
