//! Integration tests: crash.
