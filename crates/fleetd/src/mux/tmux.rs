//! The tmux backend (placeholder while it is written).
