//! `fleetd status`: the members as a table, in delegation-tree order, with what each spent on
//! its model backend through fleetd's gateway (and, for a member at the top of a tree that
//! spent, the whole tree's total).

use std::io::Write;

use serde_json::Value;

use super::{table, text};

pub(super) fn render(body: &Value, out: &mut dyn Write) -> std::io::Result<()> {
    let members = body["members"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    if members.is_empty() {
        return writeln!(
            out,
            "no members (a lead starts them with fleet_spawn; profiles are in the config)"
        );
    }
    let header = [
        "TARGET", "PROFILE", "PANE", "STATUS", "INBOX", "OPEN", "LEAD", "MODEL",
    ];
    let rows: Vec<[String; 8]> = tree_order(members)
        .into_iter()
        .map(|m| {
            // A member a member delegated to sits under it, one step in per level.
            let depth = m["depth"].as_u64().unwrap_or(1).max(1);
            let indent = usize::try_from(depth - 1).unwrap_or(0);
            let name = if indent == 0 {
                text(m, "target").to_owned()
            } else {
                format!("{}└─{}", "  ".repeat(indent - 1), text(m, "target"))
            };
            let lead = m["delegator"]
                .as_str()
                .map_or_else(|| text(m, "lead").to_owned(), |d| format!("member {d}"));
            [
                name,
                // A member that runs as a second user says which (`runAs`).
                match m["runAs"].as_str() {
                    Some(user) => format!("{} (as {user})", text(m, "profile")),
                    None => text(m, "profile").to_owned(),
                },
                text(m, "paneId").to_owned(),
                text(m, "status").to_owned(),
                m["inboxDepth"]
                    .as_u64()
                    .map_or_else(|| "?".to_owned(), |d| d.to_string()),
                m["openTickets"].as_array().map_or(0, Vec::len).to_string(),
                lead,
                model(m),
            ]
        })
        .collect();
    table(&header, &rows, out)
}

/// Members in tree order: each one a lead delegated to, then the members under it, depth
/// first.
fn tree_order(members: &[Value]) -> Vec<&Value> {
    fn under<'a>(up: Option<&str>, members: &'a [Value], out: &mut Vec<&'a Value>, walked: usize) {
        for m in members.iter().filter(|m| m["delegator"].as_str() == up) {
            out.push(m);
            if walked < 16 {
                under(m["target"].as_str(), members, out, walked + 1);
            }
        }
    }
    let mut out = Vec::with_capacity(members.len());
    under(None, members, &mut out, 0);
    // One whose delegator is not listed (it was released a moment ago) still shows.
    for m in members {
        if !out.iter().any(|o| std::ptr::eq(*o, m)) {
            out.push(m);
        }
    }
    out
}

/// What a member spent on its model (`-` when its backend is not served through fleetd), and
/// its tree's total when it heads a tree that spent more than itself.
pub(super) fn model(m: &Value) -> String {
    let Some(own) = m.get("usage").filter(|u| u.is_object()) else {
        return "-".to_owned();
    };
    let mut shown = spent(own);
    if let Some(tree) = m.get("treeUsage").filter(|u| u.is_object())
        && tree["totalTokens"].as_u64() > own["totalTokens"].as_u64()
    {
        shown.push_str(&format!(" (tree {})", spent(tree)));
    }
    if let Some(budget) = own["budget"].as_str() {
        shown.push_str(&format!(" [{budget}]"));
    }
    shown
}

/// `12.3k tok $0.04`.
fn spent(usage: &Value) -> String {
    let tokens = usage["totalTokens"].as_u64().unwrap_or(0);
    let cost = usage["costUsd"].as_f64().unwrap_or(0.0);
    format!("{} tok ${cost:.2}", short(tokens))
}

/// A count in a few characters: `950`, `12.3k`, `4.5M`.
fn short(n: u64) -> String {
    // Display only: the precision lost by the float is below what is shown.
    let f = n as f64;
    if n < 1_000 {
        n.to_string()
    } else if n < 1_000_000 {
        format!("{:.1}k", f / 1e3)
    } else {
        format!("{:.1}M", f / 1e6)
    }
}
