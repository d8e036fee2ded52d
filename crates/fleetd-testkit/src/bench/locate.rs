//! Caller-locator benchmark: locate one caller among many panes.
