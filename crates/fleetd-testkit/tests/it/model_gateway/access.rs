//! A member's model key works from its own pane only, and only while it lives: from another
//! member's pane (with either key), the lead's pane, a process in no pane, another uid (outside
//! any pane, and inside the member's own), a web page's request, and after the member's release
//! (its name spawned again), fleetd refuses it — and each refusal changes nothing: the backend
//! gets no request and no usage is counted.

use std::os::unix::fs::PermissionsExt as _;

use fleetd_testkit::model_call::{self, Call, KeyHeader, Outcome};
use fleetd_testkit::rig::{LEAD, structured_ok};
use fleetd_testkit::{Service, bin_path, require_root};
use serde_json::json;

use fleetd_testkit::fake_model::served::Usage;

use super::{Gateway, assert_refused, assert_served, minus, start};

/// A copy of `model-call` another uid can run (the checkout may be in a home it cannot enter).
fn reachable_model_call(dir: &std::path::Path) -> String {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let to = dir.join("model-call");
    std::fs::copy(bin_path("model-call"), &to).expect("copy");
    to.display().to_string()
}

/// `model-call` as uid 65534 from this process (in no pane): `None` when this process may not
/// switch uids (then the test skips it, or fails under CI).
fn as_nobody_outside(gw: &Gateway, m: &str, key: &str) -> Option<Outcome> {
    let out = crate::security::as_nobody(m, &["--url", &gw.url(), "--key", key], &[])?;
    let text = String::from_utf8_lossy(&out.stdout);
    Some(
        serde_json::from_str(text.trim())
            .unwrap_or_else(|e| panic!("{e}: {text} {}", String::from_utf8_lossy(&out.stderr))),
    )
}

/// `model-call` as uid 65534 typed into tmux target `pane` (the pane's shell or agent starts it
/// and keeps its output, as the security suite does in the lead's pane).
fn as_nobody_in(gw: &Gateway, pane: &str, m: &str, key: &str) -> Outcome {
    let out = gw.next_out();
    let r = out.display();
    gw.rig.type_line(
        pane,
        &format!(
            "setpriv --reuid=65534 --regid=65534 --clear-groups {m} --url {} --key {key} > {r}.tmp; mv {r}.tmp {r}",
            gw.url()
        ),
    );
    let text = crate::security::read_when_there(&out, "another uid's model-call in a pane");
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn e2e_model_gateway_a_members_key_works_from_its_own_pane_only_and_only_while_it_lives() {
    let Some(gw) = start(&[], "") else {
        return;
    };
    let ann = gw.member("ann");
    let bob = gw.member("bob");
    assert_ne!(ann, bob);
    // The one request that goes through: ann's own, from her pane.
    assert_served(&gw.call_as("ann", ""), "ann's own request");
    let counted = gw.served();
    let url = gw.url();

    // Another member's pane: with ann's key (bob is not ann), and ann's pane with bob's key.
    let refused = gw.call_as("bob", &format!("--key {ann}"));
    assert_refused(
        &refused,
        401,
        "model_key_refused",
        "ann's key from bob's pane",
    );
    let refused = gw.call_as("ann", &format!("--key {bob}"));
    assert_refused(
        &refused,
        401,
        "model_key_refused",
        "bob's key from ann's pane",
    );
    // The lead's pane: not a member at all.
    let refused = gw.call_in(LEAD, &format!("--url {url} --key {ann}"));
    assert_refused(
        &refused,
        403,
        "not_a_member",
        "ann's key from the lead's pane",
    );
    // A process in no pane: this test.
    let refused = model_call::run_blocking(&Call::new(&url, &ann));
    assert_refused(&refused, 403, "not_a_member", "ann's key from no pane");
    let mut bearer = Call::new(&url, &ann);
    bearer.header = KeyHeader::Bearer;
    let refused = model_call::run_blocking(&bearer);
    assert_refused(
        &refused,
        403,
        "not_a_member",
        "ann's key as a bearer from no pane",
    );
    // A web page: the request guard refuses another site's POST before anything else is read,
    // even from ann's own pane with her key.
    let refused = gw.call_as("ann", "--extra-header 'Origin: http://evil.example'");
    assert_refused(&refused, 403, "foreign_origin", "a web page's request");
    // Another uid: in no pane, and inside ann's own pane.
    if require_root() == Service::Present {
        let reachable = tempfile::tempdir().expect("tempdir");
        let m = reachable_model_call(reachable.path());
        let refused = as_nobody_outside(&gw, &m, &ann).expect("root");
        assert_refused(&refused, 403, "not_a_member", "ann's key from another uid");
        let refused = as_nobody_in(&gw, "fleet:ann", &m, &ann);
        assert_refused(&refused, 403, "not_a_member", "another uid in ann's pane");
    }
    assert_eq!(gw.requests(), 1, "no refused request reached the backend");
    gw.assert_counted("ann", counted);

    // Released, ann's key dies with her: her name spawned again gets a new key, and the old
    // one is refused even from the new ann's pane.
    let stopped = gw.rig.lead("fleet_stop", &json!({ "target": "ann" }));
    structured_ok(&stopped);
    let again = gw.member("ann");
    assert_ne!(again, ann, "a new member gets a new key");
    let refused = gw.call_as("ann", &format!("--key {ann}"));
    assert_refused(
        &refused,
        401,
        "model_key_refused",
        "a released member's key",
    );
    assert_eq!(gw.requests(), 1, "the released key reached nothing");
    // The new ann has an account of her own; the first one's is kept, so her name's total in
    // /metrics is still what was served.
    gw.assert_listed("ann", Usage::default());
    gw.assert_metered("ann", counted);
    assert_served(&gw.call_as("ann", ""), "the new ann's own request");
    gw.assert_listed("ann", minus(gw.served(), counted));
    gw.assert_metered("ann", gw.served());
}
