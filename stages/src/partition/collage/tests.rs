//! Tests: see below.
