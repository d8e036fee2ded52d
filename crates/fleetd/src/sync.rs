//! Locking a std mutex whose holder panicked. fleetd's mutexes guard maps and counters whose
//! every critical section leaves them whole (no section is left half-updated by a panic), so a
//! poisoned lock's data is still good and the daemon carries on rather than panic in turn.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, taking its data even when a holder panicked.
pub(crate) fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
