//! Integration tests: serve.
