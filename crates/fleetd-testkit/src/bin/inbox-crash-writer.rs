//! `inbox-crash-writer KIND PATH TASKS TARGETS [URL]`: the victim of the inbox kill -9 tests. It
//! publishes replies from many tasks and prints each msgId only after `publish` returned, then
//! acks some of them, printing its intent before and the result after. Test support only: it
//! must never print a line before the store operation it reports has completed.
//!
//! KIND is `embedded` or `amqp`; PATH is the database file (with `amqp` the local file the
//! broker's queues are ingested into), URL the broker (`amqp` only); TARGETS is a
//! comma-separated list of member names. Output lines: `ready`, `published <msgId>`,
//! `acking <msgId>`, `acked <msgId>`. It runs until killed; any store failure exits non-zero with
//! the error on stderr.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use fleetd::store::{self, InboxStore, PublishOutcome, StoreOptions, StoreSpec};
use fleetd_core::{Message, MessageKind, MsgId, Target};

/// Every this many publishes a task acks one of its own earlier messages.
const ACK_EVERY: u64 = 4;

fn say(line: &str) {
    // One write per line: a pipe write this small is atomic, so a kill never splits a line.
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        // The reader is gone; nobody can check us any more.
        std::process::exit(0);
    }
}

fn fail(what: &str, err: impl std::fmt::Display) -> ! {
    eprintln!("inbox-crash-writer: failed to {what}: {err}");
    std::process::exit(1);
}

#[expect(
    clippy::disallowed_methods,
    reason = "a separate crash-writer process has no daemon clock; wall time and fresh v7 ids are what it needs"
)]
async fn run_task(store: Arc<dyn InboxStore>, targets: Arc<Vec<Target>>, task: u64) {
    let mut mine: Vec<(Target, MsgId)> = Vec::new();
    for n in 0u64.. {
        let target = targets[usize::try_from(task + n).unwrap_or(0) % targets.len()].clone();
        let message = Message {
            msg_id: MsgId::from_uuid(uuid::Uuid::now_v7()),
            target: target.clone(),
            ticket: None,
            kind: MessageKind::Reply,
            text: format!("crash-writer task {task} message {n}: ünïcödé ✓ 🚀"),
            from: target.to_string(),
            created_at: jiff::Timestamp::now(),
        };
        let id = message.msg_id;
        match store.publish(message).await {
            Ok(PublishOutcome::Stored) => say(&format!("published {id}")),
            Ok(PublishOutcome::Duplicate) => {
                fail("publish", format!("fresh id {id} reported duplicate"))
            }
            Err(err) => fail("publish", err),
        }
        mine.push((target, id));
        if n % ACK_EVERY == ACK_EVERY - 1 {
            let (target, old) = mine.remove(0);
            say(&format!("acking {old}"));
            match store.ack(&target, old).await {
                Ok(true) => say(&format!("acked {old}")),
                Ok(false) => fail(
                    "ack",
                    format!("{old}, published and never acked, was not found"),
                ),
                Err(err) => fail("ack", err),
            }
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: inbox-crash-writer embedded|amqp PATH TASKS TARGET[,TARGET...] [URL]";
    let (kind, path, tasks, targets, url) = match args.as_slice() {
        [kind, path, tasks, targets] => (kind, path, tasks, targets, None),
        [kind, path, tasks, targets, url] => (kind, path, tasks, targets, Some(url)),
        _ => bail!("{usage}"),
    };
    let path = PathBuf::from(path);
    let spec = match (kind.as_str(), url) {
        ("embedded", None) => StoreSpec::Embedded { path },
        ("amqp", Some(url)) => StoreSpec::Amqp {
            url: url.clone(),
            path,
        },
        _ => bail!("{usage}"),
    };
    let tasks: u64 = tasks.parse().context("TASKS must be a number")?;
    let targets: Vec<Target> = targets
        .split(',')
        .map(Target::new)
        .collect::<Result<_, _>>()
        .context("TARGETS must be member names")?;
    if targets.is_empty() {
        bail!("at least one target is needed");
    }
    let store = store::open(&spec, &StoreOptions::default())
        .await
        .unwrap_or_else(|err| fail("open the store", err));
    say("ready");
    let targets = Arc::new(targets);
    let mut running = tokio::task::JoinSet::new();
    for task in 0..tasks {
        running.spawn(run_task(Arc::clone(&store), Arc::clone(&targets), task));
    }
    while running.join_next().await.is_some() {}
    Ok(())
}
