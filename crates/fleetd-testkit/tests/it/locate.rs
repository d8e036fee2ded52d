//! Integration tests: locate.
