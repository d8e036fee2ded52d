//! Benchmarks that print tables (never assert timings). Each submodule measures one area and prints
//! its rows side by side with the baseline the issue that introduced it names.

pub mod bridge;
pub mod inbox;
pub mod locate;
