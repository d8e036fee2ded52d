//! Integration tests: mux_tmux.
