//! The two-daemon router (placeholder while it is written).
/// Placeholder.
#[derive(Debug)]
pub struct MuxRouter;
/// Placeholder.
#[derive(Debug)]
pub struct RoutedPane;
