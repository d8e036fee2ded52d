//! Integration tests: the human CLI (`fleetd status`, `inbox`, `ack`, `send`) run as the built
//! binary against a running daemon, in human and `--json` form; how it finds the daemon (flag,
//! `FLEETD_URL`, else the operator's socket in the state directory) and what it says when none
//! answers; the API token over TCP; and end to end with sim-agent members in a private tmux,
//! including a member pane being refused.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use fleetd_testkit::daemon::{Daemon, command, isolated_config, write_config};
use fleetd_testkit::rig::{Rig, sim_profile, structured_ok};
use fleetd_testkit::{bin_path, wait_until};
use serde_json::Value;

/// Runs `fleetd args...` isolated in `home`.
fn fleetd(home: &Path, args: &[&str]) -> Output {
    command(home).args(args).output().expect("fleetd runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts a zero exit and returns stdout.
fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        stdout(out),
        stderr(out)
    );
    stdout(out)
}

fn json(out: &Output) -> Value {
    let text = ok(out);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// Asserts that fleetd refused: exit 1, its stderr saying each of `says`.
fn assert_refused(out: &Output, says: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for said in says {
        assert!(err.contains(said), "stderr lacks {said:?}: {err}");
    }
}

/// `target`'s inbox as the CLI in `home` shows it (`--json`), once a reply waits there.
fn inbox_with_a_reply(home: &Path, target: &str) -> Value {
    let mut inbox = Value::Null;
    wait_until(
        &format!("a reply in {target}'s inbox"),
        Duration::from_secs(90),
        || {
            inbox = json(&fleetd(home, &["inbox", target, "--json"]));
            inbox["replies"].as_array().is_some_and(|r| !r.is_empty())
        },
    );
    inbox
}

/// A port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

#[test]
fn client_without_a_daemon_exits_1_naming_the_url_it_tried() {
    let home = tempfile::tempdir().expect("tempdir");
    let port = closed_port();
    let url = format!("http://127.0.0.1:{port}");
    let check = |out: &Output, how: &str| {
        assert_eq!(out.status.code(), Some(1), "{how}: {}", stderr(out));
        let err = stderr(out);
        assert!(err.contains(&url), "{how}: names the URL: {err}");
        assert!(
            err.contains("fleetd serve"),
            "{how}: says how to start: {err}"
        );
        assert!(stdout(out).is_empty(), "{how}: {}", stdout(out));
    };
    check(
        &fleetd(home.path(), &["status", "--daemon", &url]),
        "--daemon",
    );
    let out = command(home.path())
        .env("FLEETD_URL", &url)
        .args(["inbox", "alice", "--json"])
        .output()
        .expect("fleetd runs");
    check(&out, "FLEETD_URL");
    // Neither: the operator's socket in the state directory.
    let out = fleetd(home.path(), &["send", "alice", "hello"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let socket = fleetd_testkit::daemon::state_dir(home.path()).join("api.sock");
    let err = stderr(&out);
    assert!(
        err.contains(&format!("unix:{}", socket.display())),
        "names the socket: {err}"
    );
    assert!(err.contains("fleetd serve"), "says how to start: {err}");
}

#[test]
fn client_status_of_a_daemon_without_members() {
    let home = tempfile::tempdir().expect("tempdir");
    let _daemon = Daemon::start(home.path(), &[]);
    // By default the CLI is the operator on the daemon's own socket.
    let text = ok(&fleetd(home.path(), &["status"]));
    assert!(text.starts_with("no members"), "{text}");
    let v = json(&fleetd(home.path(), &["status", "--json"]));
    assert_eq!(
        v,
        serde_json::json!({
            "members": [],
            "usage": { "leads": {}, "profiles": {}, "trees": {} },
        })
    );
    let text = ok(&fleetd(home.path(), &["inbox", "alice"]));
    assert_eq!(text, "alice: no replies waiting\n");
}

#[test]
fn client_over_tcp_without_the_token_is_anonymous() {
    let home = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start(home.path(), &[]);
    let url = format!("http://{}", daemon.addr);
    // This process is in no pane: over TCP it may list, never read a body or change anything.
    ok(&fleetd(home.path(), &["status", "--daemon", &url]));
    assert_refused(
        &fleetd(home.path(), &["inbox", "alice", "--daemon", &url]),
        &["anonymous_caller", "HTTP 403"],
    );
}

#[test]
fn client_refusals_exit_1_with_the_daemon_s_reason() {
    let home = tempfile::tempdir().expect("tempdir");
    let _daemon = Daemon::start(home.path(), &[]);
    assert_refused(
        &fleetd(home.path(), &["send", "nosuch", "do it"]),
        &["no member named nosuch", "unknown_target"],
    );
    // --json prints the daemon's error body as it came, and still fails.
    let out = fleetd(home.path(), &["send", "nosuch", "x", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let body: Value = serde_json::from_str(&stdout(&out)).expect("error body is JSON");
    assert_eq!(body["error"], "unknown_target");
    // Bad ids never reach the daemon.
    assert_refused(
        &fleetd(home.path(), &["ack", "alice", "not-a-uuid"]),
        &["not-a-uuid"],
    );
}

#[test]
fn client_presents_the_api_token_from_the_config() {
    let home = tempfile::tempdir().expect("tempdir");
    let token = home.path().join("token");
    std::fs::write(&token, "s3cret-token\n").expect("write token");
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    write_config(
        home.path(),
        &format!(
            "{}apiToken: api\nsecrets:\n  api:\n    file: {}\n",
            isolated_config(home.path()),
            token.display()
        ),
    );
    let daemon = Daemon::start(home.path(), &[]);
    let url = format!("http://{}", daemon.addr);
    // Over TCP the CLI resolves the config's token itself, and the daemon makes it the
    // operator: it may read an inbox, which an anonymous caller may not.
    ok(&fleetd(home.path(), &["status", "--daemon", &url]));
    ok(&fleetd(home.path(), &["inbox", "alice", "--daemon", &url]));
    // A wrong token is refused even from loopback, with what to do.
    let out = command(home.path())
        .env("FLEETD_TOKEN", "wrong")
        .args(["status", "--daemon", &url])
        .output()
        .expect("fleetd runs");
    assert_refused(&out, &["bad_token", "HTTP 401"]);
}

fn rig(profiles: &str) -> Option<Rig> {
    // No nudges: the lead pane is a shell (see bridge.rs).
    Rig::start_if_tmux(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\nprofiles:\n{profiles}"
    ))
}

#[test]
fn e2e_cli_sends_reads_and_acknowledges() {
    let Some(rig) = rig(&sim_profile("sim", &[("SIM_AGENT_WORK_MS", "300")])) else {
        return;
    };
    rig.spawn("sim", "alice");
    // The operator at a shell: the CLI on the daemon's own socket.
    let run = |args: &[&str]| fleetd(rig.dir(), args);

    // send --wait prints the reply itself.
    let text = ok(&run(&["send", "alice", "count", "the", "files", "--wait"]));
    assert_eq!(text, "sim-agent did: count the files\n");

    // Without --wait: the ticket, then the reply lands in the inbox.
    let sent = json(&run(&["send", "alice", "lint", "--json"]));
    assert_eq!(sent["status"], "queued", "{sent}");
    let ticket = sent["ticket"].as_str().expect("ticket").to_owned();
    let inbox = inbox_with_a_reply(rig.dir(), "alice");
    let reply = &inbox["replies"][0];
    assert_eq!(reply["text"], "sim-agent did: lint", "{inbox}");
    assert_eq!(reply["ticket"], ticket.as_str());
    let msg_id = reply["msgId"].as_str().expect("msgId").to_owned();
    let human = ok(&run(&["inbox", "alice"]));
    assert!(human.starts_with("alice: 1 reply waiting"), "{human}");
    assert!(
        human.contains(&msg_id) && human.contains("    sim-agent did: lint"),
        "{human}"
    );

    // status: the table and the JSON agree on the member and its inbox depth.
    let table = ok(&run(&["status"]));
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().expect("header").split_whitespace().collect();
    assert_eq!(
        header,
        [
            "TARGET", "PROFILE", "PANE", "STATUS", "INBOX", "OPEN", "LEAD", "MODEL"
        ]
    );
    let row: Vec<&str> = lines.next().expect("a row").split_whitespace().collect();
    let status = json(&run(&["status", "--json"]));
    let member = &status["members"][0];
    assert_eq!(row[0], "alice");
    assert_eq!(row[1], "sim");
    assert_eq!(row[2], member["paneId"].as_str().expect("paneId"));
    assert_eq!(row[4], "1", "{table}");
    assert_eq!(member["inboxDepth"], 1, "{status}");
    // The lead column is the lead that spawned it (a CLI send binds no lead of its own).
    assert_eq!(row[6], member["lead"].as_str().unwrap_or("-"), "{table}");
    // Its profile names no backend: nothing goes through the model gateway, nothing is spent.
    assert_eq!(row[7], "-", "{table}");

    // ack removes it; a second ack is not an error.
    let text = ok(&run(&["ack", "alice", &msg_id]));
    assert!(
        text.starts_with(&format!("acknowledged {msg_id}")),
        "{text}"
    );
    let again = json(&run(&["ack", "alice", &msg_id, "--json"]));
    assert_eq!(again["acked"], false, "{again}");
    assert_eq!(ok(&run(&["inbox", "alice"])), "alice: no replies waiting\n");
}

/// The operator's commands the dashboard also offers: `answer`, `tickets`, `stop`, and the
/// sign-in link of `dashboard`; each in human and `--json` form, with exit 1 and the daemon's
/// reason for a bad id.
#[test]
fn e2e_cli_answers_lists_tickets_stops_and_signs_in_a_browser() {
    let Some(rig) = rig(&sim_profile(
        "curious",
        &[("SIM_AGENT_SCRIPT", "ask"), ("SIM_AGENT_WORK_MS", "200")],
    )) else {
        return;
    };
    rig.spawn("curious", "eve");
    let run = |args: &[&str]| fleetd(rig.dir(), args);
    let sent = json(&run(&["send", "eve", "deploy", "--json"]));
    let ticket = sent["ticket"].as_str().expect("ticket").to_owned();

    // tickets: the one sent, in both forms.
    let listed = json(&run(&["tickets", "eve", "--json"]));
    assert_eq!(listed["tickets"][0]["ticket"], ticket.as_str(), "{listed}");
    let table = ok(&run(&["tickets"]));
    let header: Vec<&str> = table
        .lines()
        .next()
        .expect("header")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["TICKET", "TARGET", "STATE", "AGE", "FINISHED", "CAUSE"]
    );
    assert!(table.contains(&ticket), "{table}");
    assert_refused(&run(&["tickets", "nobody-here"]), &["unknown_target"]);

    // answer: the question eve asked, by its id; eve's reply carries the answer.
    let mut question = Value::Null;
    wait_until("eve's question", Duration::from_secs(90), || {
        let inbox = json(&run(&["inbox", "eve", "--json"]));
        question = inbox["questions"][0].clone();
        !question.is_null()
    });
    let id = question["questionId"].as_str().expect("id").to_owned();
    assert_refused(&run(&["answer", "not/an id", "x"]), &["not a question id"]);
    let text = ok(&run(&["answer", &id, "use", "staging"]));
    assert!(
        text.starts_with(&format!("answered question {id}")),
        "{text}"
    );
    // A question is answered once.
    assert_refused(&run(&["answer", &id, "again"]), &["unknown_question"]);
    wait_until(
        "eve's reply with the answer",
        Duration::from_secs(90),
        || {
            let inbox = json(&run(&["inbox", "eve", "--json"]));
            inbox["replies"].as_array().into_iter().flatten().any(|r| {
                r["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("use staging"))
            })
        },
    );
    let listed = json(&run(&["tickets", "--json"]));
    assert_eq!(listed["tickets"][0]["state"], "replied", "{listed}");

    // answer --json: eve's next question, answered in the JSON form (the daemon's answer as it
    // came: where the answer went).
    run(&["send", "eve", "deploy again", "--json"]);
    let mut next = String::new();
    wait_until("eve's second question", Duration::from_secs(90), || {
        let inbox = json(&run(&["inbox", "eve", "--json"]));
        next = inbox["questions"][0]["questionId"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        !next.is_empty() && next != id
    });
    let answered = json(&run(&["answer", &next, "use prod", "--json"]));
    assert_eq!(answered["deliveredTo"], "waiter", "{answered}");
    let out = run(&["answer", &next, "again", "--json"]);
    assert_eq!(out.status.code(), Some(1), "refused in the JSON form too");
    let refused: Value = serde_json::from_str(stdout(&out).trim()).expect("the error body");
    assert_eq!(refused["error"], "unknown_question", "{refused}");

    // dashboard: a one-time link to this daemon.
    let link = json(&run(&["dashboard", "--json"]));
    let url = link["url"].as_str().expect("url");
    assert!(
        url.starts_with(&format!("http://{}/#key=", rig.daemon.addr)),
        "{link}"
    );
    let human = ok(&run(&["dashboard"]));
    assert!(human.contains("/#key="), "{human}");

    // stop: fay in the JSON form, then eve in the human one; a second stop says there is no
    // such member.
    rig.spawn("curious", "fay");
    let stopped = json(&run(&["stop", "fay", "--cause", "not needed", "--json"]));
    assert_eq!(stopped["cause"], "not needed", "{stopped}");
    assert_eq!(stopped["paneClosed"], true, "{stopped}");
    let text = ok(&run(&["stop", "eve", "--cause", "done for today"]));
    assert!(text.starts_with("stopped eve (done for today)"), "{text}");
    let status = json(&run(&["status", "--json"]));
    assert_eq!(status["members"], serde_json::json!([]), "{status}");
    assert_refused(&run(&["stop", "eve"]), &["unknown_target"]);
}

#[test]
fn e2e_cli_send_from_a_member_pane_is_refused() {
    // The member runs the CLI the way an agent's shell tool would: a child in its pane's
    // session, finding the daemon through the FLEETD_URL fleetd gave it.
    let Some(rig) = rig(&sim_profile(
        "shell",
        &[("SIM_AGENT_SCRIPT", "shell"), ("SIM_AGENT_WORK_MS", "100")],
    )) else {
        return;
    };
    rig.spawn("shell", "mallory");
    let line = format!("{} send mallory do-my-work", bin_path("fleetd").display());
    let sent = structured_ok(&rig.lead(
        "fleet_send",
        &serde_json::json!({ "target": "mallory", "task": line }),
    ));
    let said = sent["reply"].as_str().unwrap_or_default();
    assert!(said.starts_with("exit 1\n"), "{sent}");
    assert!(said.contains("not_a_lead"), "{said}");
    assert!(said.contains("fleet_reply"), "{said}");
    // Nothing was queued by its own hand: the lead's ticket is its only one.
    let status =
        structured_ok(&rig.lead("fleet_status", &serde_json::json!({ "target": "mallory" })));
    assert_eq!(
        status["tickets"].as_array().map_or(0, Vec::len),
        1,
        "{status}"
    );
}

#[test]
fn e2e_cli_send_wait_that_runs_out_exits_1_and_the_reply_still_lands() {
    let Some(rig) = rig(&sim_profile("slow", &[("SIM_AGENT_WORK_MS", "3000")])) else {
        return;
    };
    rig.spawn("slow", "bob");
    let out = fleetd(
        rig.dir(),
        &[
            "send",
            "bob",
            "take",
            "your",
            "time",
            "--wait",
            "--timeout",
            "1",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stdout(&out);
    assert!(said.contains("the reply lands in its inbox"), "{said}");
    let inbox = inbox_with_a_reply(rig.dir(), "bob");
    assert_eq!(inbox["replies"][0]["text"], "sim-agent did: take your time");
}
