//! The durable inbox (the `InboxStore` trait and its backends: memory, embedded SQLite, AMQP) and
//! the durable fleet state (the `StateStore` trait: the engine's tickets, task texts, questions,
//! leads and members as keyed records, in the embedded SQLite file — also when the inbox is on
//! AMQP — or in memory for tests). Only this module knows a storage engine.
//!
//! Architecture invariant: nothing outside `store::*` names rusqlite or lapin; callers hold an
//! `Arc<dyn InboxStore>` from [`open`] and see engine failures only as [`StoreError`].
//! Every backend refuses a message that breaks [`MessageLimits`] before it touches storage.

mod amqp;
mod lock;
mod memory;
mod metered;
mod sqlite;

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use fleetd_core::{Message, MessageError, MessageLimits, MsgId, Target};

pub use amqp::link as gateway_link;
pub use amqp::{AmqpStore, PROFILE as AMQP_PROFILE};
pub use memory::MemoryStore;
pub use sqlite::SqliteStore;

/// The future every [`InboxStore`] method returns. Boxed so the trait stays object safe: the daemon
/// holds one `Arc<dyn InboxStore>` whichever backend the config chose.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// How many acknowledged msgIds a backend remembers so that a late duplicate publish of an already
/// acknowledged message is still reported as `Duplicate` instead of reappearing. Large enough to
/// cover any realistic retry window of a member (minutes of replies), small enough to stay cheap.
pub const DEDUP_WINDOW: usize = 100_000;

/// A durable, per-target ordered inbox with at-least-once delivery and dedup by msgId (SPEC §4).
///
/// All methods may be called concurrently from many tasks.
pub trait InboxStore: Send + Sync + fmt::Debug {
    /// Stores `message` in its target's inbox. Resolves only once the message is durable (fsync or
    /// the broker's publisher confirm). Publishing a msgId the store already holds, or acknowledged
    /// recently (see [`DEDUP_WINDOW`]), is a no-op reported as [`PublishOutcome::Duplicate`].
    /// A message that breaks the limits is refused with [`StoreError::Refused`].
    fn publish(&self, message: Message) -> StoreFuture<'_, PublishOutcome>;

    /// One page of `target`'s pending messages, oldest first, as `request` describes (see
    /// [`PageRequest`] for the cursor and the byte budget). Non-destructive. A backend holds at
    /// most about one page of message bodies in memory to answer, however deep the inbox.
    fn page<'a>(&'a self, target: &'a Target, request: PageRequest) -> StoreFuture<'a, Page>;

    /// Up to `limit` pending messages of `target`, oldest first, with no byte budget: a page
    /// from the oldest. Non-destructive. For tests and small limits; the tools page.
    fn peek<'a>(&'a self, target: &'a Target, limit: usize) -> StoreFuture<'a, Vec<Message>> {
        Box::pin(async move {
            Ok(self
                .page(target, PageRequest::oldest(limit, usize::MAX))
                .await?
                .messages)
        })
    }

    /// Removes one message from `target`'s inbox. `Ok(false)` when `target` holds no pending
    /// message with that id (unknown, already acknowledged, or another target's) — not an error.
    fn ack<'a>(&'a self, target: &'a Target, msg_id: MsgId) -> StoreFuture<'a, bool>;

    /// Removes and returns every pending message of `target`, oldest first (peek + ack).
    fn drain<'a>(&'a self, target: &'a Target) -> StoreFuture<'a, Vec<Message>>;

    /// How many messages are pending for `target`.
    fn depth<'a>(&'a self, target: &'a Target) -> StoreFuture<'a, u64>;

    /// The targets with at least one pending message, sorted. The AMQP backend sees the queues
    /// this daemon has used (AMQP 0.9.1 cannot list queues), so callers combine this with their
    /// own member list and [`InboxStore::depth`].
    fn targets(&self) -> StoreFuture<'_, Vec<Target>>;

    /// A cheap probe for `/healthz`: `Ok` when the store can take writes right now.
    fn health(&self) -> StoreFuture<'_, ()>;

    /// Finishes in-flight operations, then releases the store (its files, lock or connection).
    /// Later calls fail with [`StoreError::Closed`]. Dropping the store without closing it releases
    /// it too; `close` only makes the release observable.
    fn close(&self) -> StoreFuture<'_, ()>;

    /// The backend's name for logs and `/healthz`: `memory`, `embedded` or `amqp`.
    fn kind(&self) -> &'static str;
}

/// Which page of a target's pending messages [`InboxStore::page`] returns.
///
/// The page starts just after the pending message `after` (the last one the reader saw) and
/// holds at most `limit` messages whose texts add up to at most `max_bytes` — except that the
/// first message of a page is always included, whatever its size, so a message larger than the
/// budget can still be read. An `after` that is not pending in this target's inbox (it was
/// acknowledged since, or never was there) starts the page from the oldest pending message and
/// says so in [`Page::after_not_pending`]: a reader may see a message again, never miss one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRequest {
    /// Start after this message; `None` starts from the oldest.
    pub after: Option<MsgId>,
    /// Most messages in the page. 0 returns none (and says whether any are pending).
    pub limit: usize,
    /// Most bytes of message text in the page (the first message is always included).
    pub max_bytes: usize,
}

impl PageRequest {
    /// The first page: from the oldest pending message.
    pub fn oldest(limit: usize, max_bytes: usize) -> Self {
        Self {
            after: None,
            limit,
            max_bytes,
        }
    }

    /// Cuts this page out of `pending`, a target's pending messages oldest first: the rule every
    /// backend follows, written once for those that hold the messages in memory.
    pub(crate) fn cut<'a, I>(&self, pending: I) -> Page
    where
        I: IntoIterator<Item = &'a Message>,
        I::IntoIter: Clone,
    {
        let pending = pending.into_iter();
        let start = match self.after {
            None => Some(0),
            Some(id) => pending
                .clone()
                .position(|m| m.msg_id == id)
                .map(|at| at + 1),
        };
        let mut rest = pending.skip(start.unwrap_or(0)).peekable();
        let mut page = Page {
            after_not_pending: start.is_none(),
            ..Page::default()
        };
        let mut bytes = 0usize;
        while let Some(next) = rest.peek() {
            if !self.fits(page.messages.len(), bytes, next.text.len()) {
                break;
            }
            bytes = bytes.saturating_add(next.text.len());
            page.messages.push((*next).clone());
            rest.next();
        }
        page.more = rest.peek().is_some();
        page
    }

    /// Whether a message of `len` bytes joins a page that holds `taken` messages of `bytes`.
    pub(crate) fn fits(&self, taken: usize, bytes: usize, len: usize) -> bool {
        taken < self.limit && (taken == 0 || bytes.saturating_add(len) <= self.max_bytes)
    }
}

/// What [`InboxStore::page`] returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    /// The messages, oldest first.
    pub messages: Vec<Message>,
    /// More pending messages follow the last one: ask again with `after` = its msgId.
    pub more: bool,
    /// The request's `after` is not pending in this inbox (acknowledged since, or unknown): the
    /// page starts from the oldest pending message instead.
    pub after_not_pending: bool,
}

/// One record of the engine's durable state: a `kind` (`member`, `ticket`, `question`, `lead`,
/// `meta`, ...), a key unique within the kind, and the value as JSON. The store keeps records
/// opaque: the engine owns their shapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRecord {
    /// What kind of record.
    pub kind: String,
    /// Its key within the kind.
    pub key: String,
    /// Its value (JSON).
    pub value: String,
}

/// A change to the durable state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateOp {
    /// Create or replace a record.
    Put(StateRecord),
    /// Remove a record (nothing happens when there is none).
    Delete {
        /// Its kind.
        kind: String,
        /// Its key.
        key: String,
    },
}

/// The engine's durable state (SPEC §15): what a restart must not forget besides replies.
pub trait StateStore: Send + Sync + fmt::Debug {
    /// Every record, in no particular order.
    fn load_state(&self) -> StoreFuture<'_, Vec<StateRecord>>;

    /// Applies `ops` in order, atomically, and resolves once they are durable (the same fsync
    /// discipline as a publish). An empty batch is a no-op.
    fn commit_state(&self, ops: Vec<StateOp>) -> StoreFuture<'_, ()>;

    /// [`StateStore::commit_state`] for changes that must outlive fleetd (a kill -9, a
    /// restart) but may wait for the disk: resolves once the operating system has them; the
    /// next synced commit or checkpoint puts them on the disk, so only a power loss in between
    /// can take them back. Model usage is kept this way: it is counted before each answer's
    /// last frame, and the disk's flush is not the member's to wait for. By default, synced.
    fn commit_state_unsynced(&self, ops: Vec<StateOp>) -> StoreFuture<'_, ()> {
        self.commit_state(ops)
    }
}

impl StateOp {
    /// The kind of record it changes.
    pub fn kind(&self) -> &str {
        match self {
            Self::Put(record) => &record.kind,
            Self::Delete { kind, .. } => kind,
        }
    }

    /// The key of the record it changes, within its kind.
    pub fn key(&self) -> &str {
        match self {
            Self::Put(record) => &record.key,
            Self::Delete { key, .. } => key,
        }
    }
}

/// The stores a daemon runs on: the inbox and the fleet state.
#[derive(Debug, Clone)]
pub struct Stores {
    /// The inbox.
    pub inbox: Arc<dyn InboxStore>,
    /// The fleet state.
    pub state: Arc<dyn StateStore>,
}

/// What [`InboxStore::publish`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishOutcome {
    /// The message is now durable in its target's inbox.
    Stored,
    /// A message with this msgId was already stored (or recently acknowledged); nothing changed.
    Duplicate,
}

/// Which backend to open and where (config `store:`).
#[derive(Clone, PartialEq, Eq)]
pub enum StoreSpec {
    /// The embedded SQLite file (default `$XDG_STATE_HOME/fleetd/inbox.db`). The lock file beside
    /// it (`<path>.lock`) makes the daemon its only owner.
    Embedded {
        /// The database file; its directory is created when missing.
        path: PathBuf,
    },
    /// An AMQP 0.9.1 broker (RabbitMQ, LavinMQ) as the transport: one durable quorum queue per
    /// target, ingested into the embedded file at `path`, where the inbox is read and
    /// acknowledged (see `store::amqp`).
    Amqp {
        /// `amqp://user:pass@host:5672/vhost`. Never logged or shown: it holds a password.
        url: String,
        /// The embedded file that holds the ingested inbox (and the fleet state); locked like
        /// the embedded store's.
        path: PathBuf,
    },
}

impl fmt::Debug for StoreSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Embedded { path } => f.debug_struct("Embedded").field("path", path).finish(),
            Self::Amqp { url, path } => f
                .debug_struct("Amqp")
                .field("url", &amqp::redact_url(url))
                .field("path", path)
                .finish(),
        }
    }
}

/// Settings every backend shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreOptions {
    /// The limits a message must meet to be published (`inbox.maxMessageBytes`).
    pub limits: MessageLimits,
}

/// Opens the backend `spec` names. For the embedded store (and the AMQP store's local file)
/// this takes the exclusive lock (failing with [`StoreError::Locked`] naming the other owner's
/// pid), checks the file and migrates its schema; a corrupt or newer file fails with a clear
/// error and is never recreated. For AMQP it also connects to the broker, so a wrong URL fails
/// at start-up rather than at the first reply.
pub async fn open(
    spec: &StoreSpec,
    options: &StoreOptions,
) -> Result<Arc<dyn InboxStore>, StoreError> {
    Ok(open_stores(spec, options).await?.inbox)
}

/// Opens the inbox `spec` names and the fleet state beside it: the same embedded SQLite file
/// (one writer, one lock), which with AMQP also holds the ingested inbox.
pub async fn open_stores(spec: &StoreSpec, options: &StoreOptions) -> Result<Stores, StoreError> {
    match spec {
        StoreSpec::Embedded { path } => {
            let store = Arc::new(SqliteStore::open(path.clone(), *options).await?);
            Ok(Stores {
                inbox: Arc::new(metered::Metered(Arc::clone(&store))),
                state: store,
            })
        }
        StoreSpec::Amqp { url, path } => {
            let local = Arc::new(SqliteStore::open(path.clone(), *options).await?);
            let inbox = AmqpStore::open(url, Arc::clone(&local), *options).await?;
            Ok(Stores {
                inbox: Arc::new(metered::Metered(Arc::new(inbox))),
                state: local,
            })
        }
    }
}

/// A store failure. Display reads after "failed to …".
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// Another process holds the embedded store's lock.
    #[error(
        "open the inbox at {}: it is in use by another fleetd ({holder}); stop that daemon or point store.path at another file",
        path.display()
    )]
    Locked {
        /// The database file.
        path: PathBuf,
        /// Who holds the lock, as far as the lock file says.
        holder: LockHolder,
    },
    /// The embedded file is damaged or is not a fleetd inbox. It was left untouched.
    #[error(
        "open the inbox at {}: the file is corrupt or not a fleetd inbox ({detail}); it was left untouched — move it aside to start with an empty inbox",
        path.display()
    )]
    Corrupt {
        /// The database file.
        path: PathBuf,
        /// What the check found.
        detail: String,
    },
    /// The embedded file was written by a newer fleetd.
    #[error(
        "open the inbox at {}: its schema version {found} is newer than this fleetd supports ({supported}); upgrade fleetd or point store.path at another file",
        path.display()
    )]
    NewerSchema {
        /// The database file.
        path: PathBuf,
        /// The version the file has.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// The message breaks a limit; nothing was stored.
    #[error("accept the message: {0}")]
    Refused(#[from] MessageError),
    /// A stored message could not be decoded (the store holds data fleetd did not write).
    #[error("read message {what} from the inbox: {detail}")]
    Decode {
        /// Which message or field.
        what: String,
        /// What was wrong.
        detail: String,
    },
    /// The storage engine or broker failed.
    #[error("{op}: {source}")]
    Backend {
        /// What the store was doing, e.g. "commit a batch of inbox writes".
        op: &'static str,
        /// The engine's error.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// The broker refused to take the message (a publisher-confirm nack).
    #[error("publish message {0} to the broker: it answered with a nack (not stored)")]
    Nacked(MsgId),
    /// The broker stayed unreachable for longer than the reconnect deadline.
    #[error("reach the AMQP broker: {0}")]
    Unavailable(String),
    /// The store was closed (or its writer stopped).
    #[error("use the inbox: it is closed")]
    Closed,
}

impl StoreError {
    pub(crate) fn backend(
        op: &'static str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Backend {
            op,
            source: Arc::new(source),
        }
    }
}

/// Who holds the embedded store's lock, read from the lock file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockHolder {
    /// The holder wrote its pid.
    Pid(u32),
    /// The lock is held but the file does not (yet) name a pid.
    Unknown,
}

impl fmt::Display for LockHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pid(pid) => write!(f, "pid {pid}"),
            Self::Unknown => f.write_str("pid unknown"),
        }
    }
}

/// A bounded set of msgIds that forgets the oldest first: the memory backend's dedup memory.
#[derive(Debug)]
pub(crate) struct RecentIds {
    set: HashSet<MsgId>,
    order: VecDeque<MsgId>,
    capacity: usize,
}

impl RecentIds {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            set: HashSet::new(),
            order: VecDeque::new(),
            capacity,
        }
    }

    /// Remembers `id`; false when it was already remembered.
    pub(crate) fn insert(&mut self, id: MsgId) -> bool {
        if !self.set.insert(id) {
            return false;
        }
        self.order.push_back(id);
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        true
    }

    pub(crate) fn contains(&self, id: &MsgId) -> bool {
        self.set.contains(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_ids_forget_the_oldest_beyond_capacity() {
        let ids: Vec<MsgId> = (0..4).map(|i| MsgId::from_parts(i, [0; 10])).collect();
        let mut recent = RecentIds::new(3);
        for id in &ids {
            assert!(recent.insert(*id));
        }
        assert!(!recent.contains(&ids[0]), "the oldest was forgotten");
        assert!(ids[1..].iter().all(|id| recent.contains(id)));
        assert!(
            !recent.insert(ids[3]),
            "a second insert reports a duplicate"
        );
    }

    #[test]
    fn errors_read_after_failed_to_and_name_the_pid() {
        let err = StoreError::Locked {
            path: PathBuf::from("/state/inbox.db"),
            holder: LockHolder::Pid(4242),
        };
        let text = format!("failed to {err}");
        assert!(
            text.starts_with("failed to open the inbox at /state/inbox.db"),
            "{text}"
        );
        assert!(text.contains("pid 4242"), "{text}");
    }

    #[test]
    fn spec_debug_hides_the_amqp_password() {
        let spec = StoreSpec::Amqp {
            url: "amqp://fleet:s3cret@broker:5672/prod".to_owned(),
            path: PathBuf::from("/state/inbox.db"),
        };
        let shown = format!("{spec:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("broker:5672"), "{shown}");
    }
}
