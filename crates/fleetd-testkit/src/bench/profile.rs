//! Step timings fleetd reports as `trace` events under [`AMQP_PROFILE`] (a publish's broker
//! confirm and its wait for the local commit after it; each consumer step's commit), collected
//! in this process by a tracing layer of the bench's own so a row can say where its time went.
//! Nothing is collected until [`install`] runs, and only that target at that level.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use fleetd::store::AMQP_PROFILE;
use tracing::field::{Field, Visit};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// Every numeric field seen so far, by name (`confirm_us`, `landed_us`, `commit_us`, `batch`).
static SEEN: OnceLock<Mutex<BTreeMap<&'static str, Vec<u64>>>> = OnceLock::new();

fn seen() -> &'static Mutex<BTreeMap<&'static str, Vec<u64>>> {
    SEEN.get_or_init(Mutex::default)
}

struct Collect;

impl<S: tracing::Subscriber> Layer<S> for Collect {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields(Vec::new());
        event.record(&mut fields);
        let mut seen = seen()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (name, value) in fields.0 {
            seen.entry(name).or_default().push(value);
        }
    }
}

struct Fields(Vec<(&'static str, u64)>);

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.push((field.name(), value));
    }
    fn record_u128(&mut self, field: &Field, value: u128) {
        self.0
            .push((field.name(), u64::try_from(value).unwrap_or(u64::MAX)));
    }
    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

/// Installs the collecting layer as this process's subscriber (once; a second call does
/// nothing).
pub(super) fn install() {
    let only = Targets::new().with_target(AMQP_PROFILE, tracing::Level::TRACE);
    let _ = tracing_subscriber::registry()
        .with(Collect.with_filter(only))
        .try_init();
}

/// Takes what was collected since the last take: each field's samples.
pub(super) fn take() -> BTreeMap<&'static str, Vec<u64>> {
    std::mem::take(
        &mut *seen()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
}

/// The median of `samples`, if any.
pub(super) fn median(samples: Option<&Vec<u64>>) -> Option<u64> {
    let mut sorted = samples?.clone();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).copied()
}
