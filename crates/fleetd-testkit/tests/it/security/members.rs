//! What a member and what it starts can be: no lead door for a member, panes it opens are
//! nobody, its children outside its pane are anonymous, and backend secrets reach only their own
//! members.

use super::*;

#[test]
fn e2e_security_a_member_can_use_no_lead_door() {
    attack_changes_nothing(|rig, id| {
        // mallory's agent runs these with its shell tool: its FLEETD_URL, its own process.
        let m = mcp_call();
        let line = [
            format!("{m} --print fleet_poll '{{\"target\":\"alice\"}}'"),
            format!("{m} --print fleet_ack '{{\"target\":\"alice\",\"msgId\":\"{id}\"}}'"),
            format!("{m} --print fleet_send '{{\"target\":\"alice\",\"task\":\"forged\"}}'"),
            format!("{m} --print fleet_stop '{{\"target\":\"alice\"}}'"),
            format!("{m} --http GET /sessions/alice/replies"),
            format!("{m} --http POST /sessions/alice/replies/drain"),
            format!("{m} --http POST /sessions/alice/replies/{id}/ack"),
            format!("{m} --http POST /sessions/alice/tasks '{{\"task\":\"forged\"}}'"),
            format!("{m} --http GET /events"),
            format!("{m} --http GET /events/latency"),
            format!("{} inbox alice", bin_path("fleetd").display()),
        ]
        .join(" ; ");
        let answers = run_in(rig, "mallory", &line);
        let codes: Vec<String> = answers.iter().take(10).map(code).collect();
        assert_eq!(codes, vec!["not_a_lead"; 10], "{answers:#?}");
        let cli = answers
            .iter()
            .skip(10)
            .map(|v| v.as_str().unwrap_or_default().to_owned())
            .collect::<Vec<_>>()
            .join("\n");
        assert!(cli.contains("not_a_lead"), "the CLI from a member: {cli}");
    });
}

#[test]
fn e2e_security_panes_a_member_opens_are_nobody() {
    attack_changes_nothing(|rig, id| {
        // The attack a pane opened by the member runs: everything a lead may do.
        let attack = |name: &str| {
            let out = rig.dir().join(format!("{name}.out"));
            let script = rig.dir().join(format!("{name}.sh"));
            let m = mcp_call();
            std::fs::write(
                &script,
                format!(
                    "export FLEETD_URL=http://{addr}\n\
                     {{ {m} --print fleet_list '{{}}'\n\
                     {m} --print fleet_poll '{{\"target\":\"alice\"}}'\n\
                     {m} --print fleet_ack '{{\"target\":\"alice\",\"msgId\":\"{id}\"}}'\n\
                     {m} --print fleet_send '{{\"target\":\"alice\",\"task\":\"forged\"}}'\n\
                     {m} --print fleet_reply '{{\"text\":\"forged\"}}'\n\
                     {m} --http GET /sessions/alice/replies\n\
                     {m} --http POST /sessions/alice/replies/{id}/ack\n\
                     }} > {out}.tmp; mv {out}.tmp {out}\n",
                    addr = rig.daemon.addr,
                    out = out.display(),
                ),
            )
            .expect("write script");
            (script, out)
        };
        // A split of the member's own window (its environment has TMUX), and a new window in its
        // session: both in the members' workspace, both no member.
        let (split, split_out) = attack("split");
        let (window, window_out) = attack("window");
        run_in(
            rig,
            "mallory",
            &format!(
                "tmux split-window -d 'sh {}' ; tmux new-window -d 'sh {}'",
                split.display(),
                window.display()
            ),
        );
        for (out, how) in [(split_out, "split-window"), (window_out, "new-window")] {
            let text = read_when_there(&out, how);
            let codes: Vec<String> = text
                .lines()
                .map(|l| code(&serde_json::from_str(l).expect("JSON line")))
                .collect();
            assert_eq!(codes, vec!["unregistered_pane"; 7], "{how}: {text}");
        }
    });
}

#[test]
fn e2e_security_member_children_outside_its_pane_are_anonymous() {
    attack_changes_nothing(|rig, id| {
        let m = mcp_call();
        let operator = state_dir(rig.dir()).join("api.sock");
        // A child that stays in the member's process tree is the member, even in its own session.
        let kept = rig.dir().join("kept.out");
        run_in(
            rig,
            "mallory",
            &format!(
                "setsid sh -c \"{m} --print fleet_poll '{{\\\"target\\\":\\\"alice\\\"}}' > {k}.tmp; mv {k}.tmp {k}\"",
                k = kept.display()
            ),
        );
        let kept = read_when_there(&kept, "the setsid child in the tree");
        assert_eq!(
            code(&serde_json::from_str(&kept).expect("JSON")),
            "not_a_lead",
            "still the member: {kept}"
        );
        // `setsid -f`: re-parented out of the pane's tree. Over TCP, and on the operator's socket
        // (it is the daemon's own user), it is anonymous: never more than the member it came from.
        let out = rig.dir().join("escaped.out");
        let script = rig.dir().join("escaped.sh");
        // It waits a moment first, so `setsid -f`'s own process (its parent for an instant) is
        // surely gone.
        std::fs::write(
            &script,
            format!(
                "sleep 0.3\n{{ {m} --print fleet_poll '{{\"target\":\"alice\"}}'\n\
                 {m} --print fleet_reply '{{\"text\":\"forged\"}}'\n\
                 {m} --http POST /sessions/alice/replies/{id}/ack\n\
                 {fleetd} ack alice {id} --daemon unix:{sock} 2>&1\n\
                 }} > {out}.tmp; mv {out}.tmp {out}\n",
                fleetd = bin_path("fleetd").display(),
                sock = operator.display(),
                out = out.display(),
            ),
        )
        .expect("script");
        run_in(
            rig,
            "mallory",
            &format!("setsid -f sh {}", script.display()),
        );
        let text = read_when_there(&out, "the escaped child's calls");
        let lines: Vec<&str> = text.lines().collect();
        let codes: Vec<String> = lines
            .iter()
            .take(3)
            .map(|l| code(&serde_json::from_str(l).expect("JSON line")))
            .collect();
        assert_eq!(codes, vec!["anonymous_caller"; 3], "{text}");
        assert!(
            lines[3..].join("\n").contains("anonymous_caller"),
            "the operator's socket: {text}"
        );

        // A child that survives `fleet_stop` (it ignores the hangup), holding the keep-alive
        // connection it opened as the member: once the pane is gone, the same connection is no
        // longer the member's. It runs in the foreground of mallory's shell tool, so it is in the
        // pane's process tree for its first call.
        let gate = rig.dir().join("gate");
        let out = rig.dir().join("orphan.out");
        structured_ok(&rig.lead(
            "fleet_send",
            &json!({
                "target": "mallory",
                "wait": false,
                "task": format!(
                    "nohup {m} --keepalive {gate} {out} fleet_poll '{{\"target\":\"alice\"}}' fleet_reply '{{\"text\":\"forged after stop\"}}' >/dev/null 2>&1",
                    gate = gate.display(),
                    out = out.display()
                ),
            }),
        ));
        let first = read_when_there(&out.with_extension("out.first"), "the orphan's first call");
        let first: Value = serde_json::from_str(&first).expect("JSON");
        assert_eq!(
            code(&first["first"]),
            "not_a_lead",
            "a member then: {first}"
        );
        structured_ok(&rig.lead(
            "fleet_stop",
            &json!({ "target": "mallory", "cause": "test" }),
        ));
        wait_until("mallory released", PATIENCE, || {
            http::get(rig.daemon.operator(), "/sessions/mallory").is_ok_and(|r| r.status == 404)
        });
        std::fs::write(&gate, "").expect("gate");
        let done: Value =
            serde_json::from_str(&read_when_there(&out, "the orphan's second call")).expect("JSON");
        assert_eq!(done["ports"][0], done["ports"][1], "one connection: {done}");
        // Anonymous (it left the pane's tree) or nobody (its cached pane is no member's any more):
        // either way refused.
        let second = code(&done["second"]);
        assert!(
            ["anonymous_caller", "unregistered_pane"].contains(&second.as_str()),
            "{done}"
        );
        let leftover = http::reply_texts(rig.daemon.operator(), "mallory");
        assert!(
            !leftover.iter().any(|t| t.contains("forged")),
            "nothing stored in mallory's name: {leftover:?}"
        );
    });
}

#[test]
fn e2e_security_backend_secrets_reach_only_their_members() {
    if require_tmux() == Service::Skip {
        return;
    }
    let secret = "sk-lab-5e3f9a1c2b7d4e60";
    // The backend hands its token to its members themselves (`throughFleetd: false`): the
    // path whose leaks this test looks for. Through fleetd a member holds a key of its own
    // (`model_gateway`).
    let home = tempfile::tempdir().expect("tempdir");
    let secret_file = fleetd_testkit::secret_file(home.path(), "lab-token", secret);
    let with_backend = |name: &str, script: &str, work_ms: &str| {
        format!(
            "{}    backend: lab\n",
            sim_profile(
                name,
                &[("SIM_AGENT_SCRIPT", script), ("SIM_AGENT_WORK_MS", work_ms)]
            )
        )
    };
    let rig = Rig::start(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\nbackends:\n  lab:\n    baseUrl: http://127.0.0.1:9/v1\n    authTokenSecret: labtoken\n    throughFleetd: false\nsecrets:\n  labtoken:\n    file: {}\nprofiles:\n{}{}{}",
        secret_file.display(),
        with_backend("shell", "shell", "100"),
        // Turns long enough for tmux's status poll to see the member working, then idle.
        with_backend("leaky", "print", "1500"),
        sim_profile("plain", &[("SIM_AGENT_WORK_MS", "100")]),
    ));
    // Every process's argv is watched from before the first spawn (the one that creates the
    // members' tmux session) to after the last.
    let (stop, watcher) = cmdline_watch(secret);
    // The watcher's own check: a process that does carry the secret on its argv is seen.
    let control = std::process::Command::new("sh")
        .args(["-c", "sleep 0.5", "control", secret])
        .status()
        .expect("sh runs");
    assert!(control.success());
    let mallory = rig.spawn("shell", "mallory");
    rig.spawn("leaky", "lee");
    let pat = rig.spawn("plain", "pat");
    stop.store(true, Ordering::Relaxed);
    let (rounds, seen) = watcher.join().expect("watcher");
    assert!(rounds > 5, "the watcher looked {rounds} times");
    let (control, leaks): (Vec<_>, Vec<_>) = seen
        .into_iter()
        .partition(|s| s.contains("sleep 0.5 control"));
    assert!(!control.is_empty(), "the watcher sees argv at all");
    assert!(leaks.is_empty(), "the secret was on an argv: {leaks:#?}");

    // The member has it; the member without a backend and the lead do not.
    let pid_of = |spawned: &Value| {
        let pane = spawned["paneId"]
            .as_str()
            .and_then(|p| p.strip_prefix("lead:"))
            .expect("pane id")
            .to_owned();
        pane_pid(&rig, &pane)
    };
    assert_eq!(
        environ(pid_of(&mallory))
            .get("FLEETD_BACKEND_TOKEN")
            .map(String::as_str),
        Some(secret)
    );
    let pat_env = environ(pid_of(&pat));
    assert!(
        !pat_env.values().any(|v| v.contains(secret)),
        "a member without a backend inherits nothing: {:?}",
        pat_env.keys().collect::<BTreeSet<_>>()
    );
    let lead_env = environ(pane_pid(&rig, LEAD));
    assert!(!lead_env.values().any(|v| v.contains(secret)));
    // What the lead can ask tmux: the members' session environment and the global one.
    let text = in_lead_shell(
        &rig,
        "shown-env",
        "{ tmux show-environment -t fleet; tmux show-environment -g; } 2>&1",
        "tmux show-environment from the lead",
    );
    assert!(text.contains("PATH="), "it read something: {text}");
    assert!(!text.contains(secret), "{text}");
    // The launch file that carried the values is gone.
    let launch = state_dir(rig.dir()).join("launch");
    let left: Vec<_> = std::fs::read_dir(&launch)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "launch files left: {left:?}");

    // Texts that reach the lead: a reply that quotes the token, and the turn-done fallback's
    // raw pane text after a member printed it.
    let sent = structured_ok(&rig.lead(
        "fleet_send",
        &json!({ "target": "mallory", "task": "echo \"$FLEETD_BACKEND_TOKEN\"" }),
    ));
    let reply = sent["reply"].as_str().unwrap_or_default();
    assert!(reply.contains("[redacted: labtoken]"), "{sent}");
    assert!(!sent.to_string().contains(secret), "{sent}");
    let sent = structured_ok(&rig.lead(
        "fleet_send",
        &json!({ "target": "lee", "task": "echo \"token is $FLEETD_BACKEND_TOKEN\"" }),
    ));
    assert_eq!(sent["status"], "ended_without_reply", "{sent}");
    let fallback = sent["reply"].as_str().unwrap_or_default();
    assert!(fallback.contains("token is [redacted: labtoken]"), "{sent}");
    assert!(!sent.to_string().contains(secret), "{sent}");
    // And the member printed the real thing in its own pane: it does have it.
    let lee = structured_ok(&rig.lead("fleet_status", &json!({ "target": "lee" })));
    let lee_pane = lee["paneId"]
        .as_str()
        .and_then(|p| p.strip_prefix("lead:"))
        .expect("pane");
    assert!(rig.history(lee_pane).contains(secret));
}
