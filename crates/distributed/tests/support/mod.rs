//! Helpers shared by test binaries and examples.
pub mod equivalence;
pub mod reference;
