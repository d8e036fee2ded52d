//! Replies handed to a waiting `fleet_send`. Such a reply stays in the inbox until
//! it is known to have reached the caller: the caller's next call (or its `fleet_ack`)
//! acknowledges it; a waiter that failed or was dropped gives it back, and it is nudged about
//! like any other mail. While it is handed, the push loop does not count it (the caller is
//! receiving it; a nudge about it would be noise) — but never for good: a holder
//! that is gone (its lead pane closed), a ticket pruned, or [`HANDED_TTL`] without the holder's
//! next call gives the reply back to the nudge.

use fleetd_core::push::PushInput;
use fleetd_core::{MsgId, Target, Ticket};
use jiff::Timestamp;

use super::{Io, State};

/// How long a reply stays handed without its holder calling again: then it is mail to nudge
/// about (the agent may have read it and gone on without another fleet call; a reminder then
/// is noise, a reply never counted again would be lost).
pub(in crate::engine) const HANDED_TTL: jiff::SignedDuration = jiff::SignedDuration::from_mins(10);

/// A reply given to a waiter.
#[derive(Debug, Clone)]
pub(super) struct Handed {
    target: Target,
    msg_id: MsgId,
    /// Who received it, once the waiter said so: a lead's pane id, `operator`, or a member.
    holder: Option<String>,
    /// When it was handed.
    since: Timestamp,
}

impl Handed {
    /// Who received it, once known.
    pub(super) fn holder(&self) -> Option<&str> {
        self.holder.as_deref()
    }
}

impl State {
    /// `ticket`'s reply `msg_id` was given to a waiting `fleet_send`.
    pub(super) fn hand(&mut self, ticket: Ticket, target: Target, msg_id: MsgId, now: Timestamp) {
        self.handed.insert(
            ticket,
            Handed {
                target,
                msg_id,
                holder: None,
                since: now,
            },
        );
    }

    /// Gives back every reply handed to `holder` (it is gone) or handed longer than
    /// [`HANDED_TTL`] ago (`holder` `None`): mail to nudge about again.
    pub(super) fn unhand_stale(&mut self, holder: Option<&str>, now: Timestamp, io: &mut Vec<Io>) {
        let stale: Vec<Ticket> = self
            .handed
            .iter()
            .filter(|(_, h)| match holder {
                Some(gone) => h.holder.as_deref() == Some(gone),
                None => h.since.checked_add(HANDED_TTL).is_ok_and(|due| now >= due),
            })
            .map(|(t, _)| *t)
            .collect();
        for ticket in stale {
            self.unhand(ticket, now, io);
        }
    }

    /// The waiter returned `ticket`'s reply to `holder`: its next call acknowledges it.
    pub(in crate::engine) fn handed_to(&mut self, ticket: Ticket, holder: String) {
        if let Some(handed) = self.handed.get_mut(&ticket) {
            handed.holder = Some(holder);
        }
    }

    /// The waiter for `ticket` failed or was dropped before returning the reply: it is mail like
    /// any other again.
    pub(in crate::engine) fn unhand(&mut self, ticket: Ticket, now: Timestamp, io: &mut Vec<Io>) {
        if let Some(handed) = self.handed.remove(&ticket) {
            tracing::debug!(%ticket, "a waiter did not return its reply; it is nudged about");
            self.push_depth(handed.target, now, io);
        }
    }

    /// The replies handed to `holder`, taken out (the caller acknowledges them).
    pub(in crate::engine) fn take_handed(&mut self, holder: &str) -> Vec<(Target, MsgId)> {
        let taken: Vec<Ticket> = self
            .handed
            .iter()
            .filter(|(_, h)| h.holder.as_deref() == Some(holder))
            .map(|(t, _)| *t)
            .collect();
        taken
            .into_iter()
            .filter_map(|t| self.handed.remove(&t))
            .map(|h| (h.target, h.msg_id))
            .collect()
    }

    /// Messages of `target` were acknowledged: none of them is handed any more.
    pub(in crate::engine) fn acked(&mut self, target: &Target, ids: &[MsgId]) {
        self.handed
            .retain(|_, h| !(h.target == *target && ids.contains(&h.msg_id)));
    }

    /// Tells the push loop how much of `target`'s inbox is mail to nudge about: the last depth
    /// read, less what is handed to a waiter.
    pub(super) fn push_depth(&mut self, target: Target, now: Timestamp, io: &mut Vec<Io>) {
        let Some(depth) = self.raw_depth.get(&target).copied() else {
            io.push(Io::Depth { target });
            return;
        };
        let handed = self.handed.values().filter(|h| h.target == target).count() as u64;
        let pending = depth.saturating_sub(handed);
        self.feed_push(PushInput::Inbox { target, pending }, now, io);
    }
}
