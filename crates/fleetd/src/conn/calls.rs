//! Each member's share of the calls under way (SPEC §9; attack C2). A call in flight holds its
//! connection, and a connection with a call in flight is never closed to make room, so a member
//! that keeps many waiting calls open (`fleet_ask`, `fleet_send` with `wait`, over HTTP, the
//! stdio shim or REST) could hold every slot. Each member may have `connections.perMember` calls
//! under way; past that a call is refused at once (its request ends, its connection falls idle
//! and can be closed to make room). Leads, the operator and callers in no member's pane are not
//! counted here: the gate's reserve and caps govern them. Knows no protocol; words no refusal.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use fleetd_core::Target;

/// The calls under way per member. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct MemberCalls {
    held: Arc<Mutex<HashMap<Target, usize>>>,
}

/// One call under way for a member; dropping it ends the call.
#[derive(Debug)]
pub struct CallSlot {
    calls: MemberCalls,
    member: Target,
}

impl MemberCalls {
    /// A slot for one more call of `member`, unless it has `cap` under way already.
    pub fn take(&self, member: &Target, cap: usize) -> Option<CallSlot> {
        let mut held = crate::sync::lock(&self.held);
        let count = held.entry(member.clone()).or_insert(0);
        if *count >= cap {
            return None;
        }
        *count += 1;
        Some(CallSlot {
            calls: self.clone(),
            member: member.clone(),
        })
    }

    /// How many calls `member` has under way.
    pub fn under_way(&self, member: &Target) -> usize {
        let held = crate::sync::lock(&self.held);
        held.get(member).copied().unwrap_or(0)
    }
}

impl Drop for CallSlot {
    fn drop(&mut self) {
        let mut held = crate::sync::lock(&self.calls.held);
        if let Some(count) = held.get_mut(&self.member) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&self.member);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_gets_its_share_and_a_finished_call_gives_its_place_back() {
        let calls = MemberCalls::default();
        let ann = Target::new("ann").expect("target");
        let bob = Target::new("bob").expect("target");
        let first = calls.take(&ann, 2).expect("one");
        let _second = calls.take(&ann, 2).expect("two");
        assert!(calls.take(&ann, 2).is_none(), "over its share");
        assert!(
            calls.take(&bob, 2).is_some(),
            "another member is not held up"
        );
        drop(first);
        assert_eq!(calls.under_way(&ann), 1);
        assert!(calls.take(&ann, 2).is_some());
    }
}
