//! The multiplexer seam: the `Multiplexer` trait and its herdr and tmux backends. Only `mux::herdr` knows herdr's wire format and only `mux::tmux` runs `tmux`.
