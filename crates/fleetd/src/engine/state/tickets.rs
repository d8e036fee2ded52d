//! The one owner of every ticket and its side data: the record in `TicketBook`,
//! and beside it the task text, who sent it, the gateway that owns it when another gateway's
//! lead sent it, whether its task was typed, its reply and its waiters. A ticket is opened
//! here in one place and pruned here whole, so the maps cannot drift; the durable row is made
//! and restored here too. Knows nothing of the engine's other state: what a prune means for
//! handed replies and watched tasks is the caller's.

use std::collections::{HashMap, HashSet};

use fleetd_core::gateway::GatewayName;
use fleetd_core::{Message, Target, Ticket, TicketBook};
use jiff::Timestamp;
use tokio::sync::oneshot;

use super::super::Settled;
use super::durable::TicketRow;

/// A new ticket, with what goes beside its record.
pub(super) struct Opening {
    pub(super) ticket: Ticket,
    pub(super) target: Target,
    pub(super) task: String,
    /// A lead's id, a delegating member's name, or `operator` (none when nobody is recorded).
    pub(super) sender: Option<String>,
    /// The gateway whose lead sent it, for a task taken from another gateway.
    pub(super) owner: Option<GatewayName>,
}

/// Every ticket and its side data.
#[derive(Debug)]
pub(super) struct Tickets {
    /// The records and their lifecycle.
    pub(super) book: TicketBook,
    /// Each ticket's task text.
    pub(super) tasks: HashMap<Ticket, String>,
    /// Each ticket's reply, once stored.
    pub(super) replies: HashMap<Ticket, Message>,
    /// Who waits for each ticket to settle.
    pub(super) waiters: HashMap<Ticket, Vec<oneshot::Sender<Settled>>>,
    /// Who sent each ticket: a lead's id, or a delegating member's name.
    pub(super) sent_by: HashMap<Ticket, String>,
    /// Tickets whose task was handed to the multiplexer at least once.
    pub(super) typed: HashSet<Ticket>,
    /// Tickets of members here that another gateway owns (its lead sent the task).
    pub(super) remote_owner: HashMap<Ticket, GatewayName>,
}

impl Tickets {
    pub(super) fn new(ttl_after_finish: jiff::SignedDuration) -> Self {
        Self {
            book: TicketBook::new(ttl_after_finish),
            tasks: HashMap::new(),
            replies: HashMap::new(),
            waiters: HashMap::new(),
            sent_by: HashMap::new(),
            typed: HashSet::new(),
            remote_owner: HashMap::new(),
        }
    }

    /// The tickets of `target` that have not ended.
    pub(super) fn open_tickets<C: FromIterator<Ticket>>(&self, target: &Target) -> C {
        self.book
            .open_for(target)
            .iter()
            .map(|r| r.ticket)
            .collect()
    }

    /// Opens a ticket with its side data: the one place a ticket is made.
    pub(super) fn open(&mut self, opening: Opening, now: Timestamp) {
        let Opening {
            ticket,
            target,
            task,
            sender,
            owner,
        } = opening;
        self.book.open_at(ticket, target, now);
        self.tasks.insert(ticket, task);
        if let Some(sender) = sender {
            self.sent_by.insert(ticket, sender);
        }
        if let Some(owner) = owner {
            self.remote_owner.insert(ticket, owner);
        }
    }

    /// Prunes the tickets finished longer than their retention ago, each with all its side
    /// data; returns them.
    pub(super) fn prune_at(&mut self, now: Timestamp) -> Vec<Ticket> {
        let pruned = self.book.prune_at(now);
        for ticket in &pruned {
            self.tasks.remove(ticket);
            self.replies.remove(ticket);
            self.waiters.remove(ticket);
            self.sent_by.remove(ticket);
            self.typed.remove(ticket);
            self.remote_owner.remove(ticket);
        }
        pruned
    }

    /// Ticket `ticket` as kept on disk; `None` once it is pruned.
    pub(super) fn row(&self, ticket: Ticket) -> Option<TicketRow> {
        self.book.record(ticket).map(|record| TicketRow {
            record: record.clone(),
            task: self.tasks.get(&ticket).cloned(),
            by: self.sent_by.get(&ticket).cloned(),
            typed: self.typed.contains(&ticket),
            owner: self.remote_owner.get(&ticket).cloned(),
        })
    }

    /// A ticket kept before a restart, with its side data.
    pub(super) fn restore(&mut self, row: TicketRow) {
        let ticket = row.record.ticket;
        self.book.restore(row.record);
        if let Some(task) = row.task {
            self.tasks.insert(ticket, task);
        }
        if let Some(by) = row.by {
            self.sent_by.insert(ticket, by);
        }
        if row.typed {
            self.typed.insert(ticket);
        }
        if let Some(owner) = row.owner {
            self.remote_owner.insert(ticket, owner);
        }
    }
}

#[cfg(test)]
mod tests {
    use fleetd_core::TicketEvent;

    use super::*;

    #[test]
    fn a_ticket_is_opened_with_its_side_data_and_pruned_whole() {
        let ttl = jiff::SignedDuration::from_mins(1);
        let mut tickets = Tickets::new(ttl);
        let now = Timestamp::UNIX_EPOCH;
        let ticket = Ticket::from_uuid(uuid::Uuid::from_u128(
            0x01a2_3300_0000_7000_8000_0000_0000_0042,
        ));
        tickets.open(
            Opening {
                ticket,
                target: Target::new("ann").expect("target"),
                task: "ship it".to_owned(),
                sender: Some("%1".to_owned()),
                owner: Some(GatewayName::new("b".to_owned()).expect("name")),
            },
            now,
        );
        tickets.typed.insert(ticket);
        let (settled, _wait) = oneshot::channel();
        tickets.waiters.entry(ticket).or_default().push(settled);
        // The durable row carries every side datum, and restores them.
        let row = tickets.row(ticket).expect("a row");
        let mut restored = Tickets::new(ttl);
        restored.restore(row.clone());
        assert_eq!(
            restored.row(ticket).map(|r| serde_json::to_value(r).ok()),
            Some(serde_json::to_value(&row).ok())
        );
        assert_eq!(
            restored.remote_owner.get(&ticket).map(|g| g.as_str()),
            Some("b")
        );
        // Finished and past its retention: gone from every map at once, its owner
        // and its handed replies too.
        tickets
            .book
            .apply_at(ticket, TicketEvent::MemberGone("stopped".to_owned()), now)
            .expect("it ends");
        let later = now
            .checked_add(jiff::SignedDuration::from_mins(2))
            .expect("time");
        assert_eq!(tickets.prune_at(later), [ticket]);
        assert!(tickets.row(ticket).is_none());
        assert!(tickets.tasks.is_empty() && tickets.sent_by.is_empty());
        assert!(tickets.typed.is_empty() && tickets.remote_owner.is_empty());
        assert!(tickets.waiters.is_empty() && tickets.replies.is_empty());
    }
}
