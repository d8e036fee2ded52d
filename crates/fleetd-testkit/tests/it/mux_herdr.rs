//! Integration tests: mux_herdr.
