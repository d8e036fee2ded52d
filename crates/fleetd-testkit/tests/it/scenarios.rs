//! The scenario suite (issue 9): every feature row of SPEC mapped to the end-to-end test that
//! shows it working on the built binary (the table below; a test checks each named test exists,
//! so the map cannot rot), plus the cross-cutting scenarios no single feature test covers: kill -9
//! of the daemon between a reply and its nudge, an inbox on RabbitMQ across a kill -9, and two
//! herdr daemons whose pane ids collide.
//!
//! | SPEC row | scenario (module::test) |
//! | --- | --- |
//! | §2 identity from the connection, never from arguments | bridge::e2e_identity_is_decided_by_the_connection |
//! | §2 a member cannot act as lead or as another member | bridge::e2e_a_member_can_act_neither_as_lead_nor_as_another_member |
//! | §2 stdio shim, identity via SO_PEERCRED | bridge::e2e_stdio_shim_relays_to_the_daemon_with_connection_identity |
//! | §2 roles by ancestry: a member's split pane / new window is nobody | security::members::e2e_security_panes_a_member_opens_are_nobody |
//! | §2 roles by ancestry: setsid child, orphan after stop | security::members::e2e_security_member_children_outside_its_pane_are_anonymous |
//! | §2 roles by ancestry on herdr | security_herdr::e2e_herdr_security_a_pane_a_member_opens_is_nobody_and_its_escaped_child_anonymous |
//! | §2 another uid is anonymous unless it has the token | security::e2e_security_another_uid_is_anonymous_unless_it_has_the_token |
//! | §2 operator: the CLI on the daemon's socket | client::e2e_cli_sends_reads_and_acknowledges |
//! | §3 fleet_profiles (ready, secret names) | members::e2e_backend_credentials_reach_the_member_only_and_are_never_shown |
//! | §3 fleet_spawn (tmux) | bridge::e2e_send_waits_for_the_reply |
//! | §3 fleet_spawn (herdr, agent.start) | spawn_herdr::e2e_herdr_spawn_starts_a_known_agent_kind_with_agent_start |
//! | §3 fleet_list / fleet_status | members::e2e_backend_credentials_reach_the_member_only_and_are_never_shown |
//! | §3 fleet_send with wait | bridge::e2e_send_waits_for_the_reply |
//! | §3 fleet_send without wait, fleet_poll(ticket) | bridge::e2e_send_without_wait_then_poll_the_ticket |
//! | §3 fleet_poll(target) + fleet_ack | push::e2e_late_reply_nudges_the_idle_lead_until_read |
//! | §3 fleet_ask / fleet_answer | bridge::e2e_question_is_answered_by_the_lead |
//! | §3 fleet_stop | members::e2e_fleet_stop_closes_the_pane_and_fails_the_open_ticket_as_stopped |
//! | §3 fleet_reply after the waiter left | bridge::e2e_reply_outlives_its_waiter_until_acked |
//! | §3 hostile input, clear errors | bridge::e2e_hostile_input_gets_clear_errors_and_nothing_raw_reaches_a_pane |
//! | §4 durable inbox, kill -9 (embedded) | crash::embedded_store_survives_kill_9_without_loss_or_duplicates |
//! | §4 durable inbox, kill -9 (AMQP) | crash::amqp_store_survives_kill_9_without_loss_or_duplicates |
//! | §4 AMQP inbox end to end | scenarios::e2e_scenario_amqp_inbox_survives_a_daemon_kill_9 |
//! | §4 busy member: tasks queued in order | bridge::e2e_busy_member_gets_queued_tasks_in_order |
//! | §4 silent turn: ended_without_reply + pane tail | bridge::e2e_silent_turn_ends_without_reply_with_the_pane_tail |
//! | §4 swallowed submit: one Enter retry | bridge::e2e_a_swallowed_submit_is_retried_once_with_enter |
//! | §3 a stalled herdr prompt: one Enter retry in all (review M6) | delivery_herdr::e2e_herdr_a_stalled_prompt_gets_exactly_one_enter_retry |
//! | §13.7 a task herdr typed then answered `timeout`: typed once | delivery_herdr::e2e_herdr_a_task_herdr_typed_but_answered_timeout_is_typed_once_and_completes |
//! | §13.7 a nudge herdr typed then answered `timeout`: typed once | push_herdr::e2e_herdr_a_nudge_herdr_typed_but_answered_timeout_is_typed_once |
//! | §5 nudge an idle lead, no payload | push::e2e_late_reply_nudges_the_idle_lead_until_read |
//! | §5 never while working | push::e2e_a_working_lead_is_nudged_only_after_it_goes_idle |
//! | §5 delegating lead gone → primary | push::e2e_closing_the_delegating_lead_sends_the_next_nudge_to_the_primary |
//! | §5 no lead → pull only | push::e2e_with_no_lead_at_all_the_reply_waits_for_a_poll |
//! | §5 the same on herdr | push_herdr::e2e_herdr_late_reply_nudges_the_idle_lead |
//! | §4 a member mid-turn across a daemon kill -9 | scenarios::e2e_scenario_a_member_mid_turn_across_kill_9_still_delivers_its_reply |
//! | §5 kill -9 between reply and nudge | scenarios::e2e_scenario_kill_9_between_reply_and_nudge_loses_nothing |
//! | §6 herdr restart: bindings re-resolved | push_herdr::e2e_herdr_restart_between_reply_and_nudge_loses_nothing |
//! | §6 primary.tab pinning and the lead-tab scanner | push::e2e_closing_the_delegating_lead_sends_the_next_nudge_to_the_primary |
//! | §7 backend env on members only | members::e2e_backend_credentials_reach_the_member_only_and_are_never_shown |
//! | §13.5 secrets: no argv, no tmux session env, redacted texts | security::members::e2e_security_backend_secrets_reach_only_their_members |
//! | §13.5 secrets on herdr: per-pane env only | security_herdr::e2e_herdr_security_backend_secrets_reach_only_their_member |
//! | §7 release on process exit | members::e2e_a_member_whose_process_dies_is_released_as_exited |
//! | §7 names: free and taken | members::e2e_spawn_picks_a_free_name_and_refuses_a_taken_one |
//! | §7 backend health incidents | members::e2e_a_backend_going_down_and_up_is_exactly_one_nudge_each |
//! | §8 two daemons, colliding pane ids | scenarios::e2e_scenario_two_herdr_daemons_with_colliding_pane_ids |
//! | §9 /healthz, both daemons, protocolMismatch | serve::healthz_covers_both_herdr_daemons |
//! | §9 /metrics | metrics::e2e_metrics_parse_and_move_when_tools_are_called |
//! | §9 /sessions REST | bridge::e2e_rest_sessions_and_replies |
//! | §9 one policy on every door; Host and Origin | security::e2e_security_rest_and_mcp_follow_one_policy_for_anonymous_callers_and_web_pages |
//! | §13.4 a member uses no lead door (MCP, REST, CLI) | security::members::e2e_security_a_member_can_use_no_lead_door |
//! | §13.9 owner-only state | security::operator::e2e_security_state_is_owner_only_and_a_loose_one_is_tightened |
//! | §15 durable fleet state: kill -9 at random points, restart, nothing lost or repeated | recovery::e2e_recovery_kill_9_at_random_points_loses_and_repeats_nothing |
//! | §15 an engine panic ends the daemon non-zero | serve::an_engine_panic_makes_the_daemon_exit_non_zero |
//! | §3 a spawn whose caller is killed midway still finishes | members::e2e_a_spawn_whose_caller_is_killed_midway_still_finishes |
//! | §10 config errors name key, line, column | config::bad_files_exit_1_with_the_reason |
//! | §10 hot reload + SIGHUP | reload::reload_on_sighup_even_with_config_reload_false |
//! | §11 human CLI | client::e2e_cli_sends_reads_and_acknowledges |
//! | §11 sd_notify readiness | service::serve_notifies_ready_on_a_path_socket_once_it_answers |
//! | §11 install claude | install::install_claude_writes_the_charter_byte_identical_to_the_doc |
//! | §11 graceful SIGTERM | serve::sigterm_stops_the_daemon_with_exit_0 |

use std::time::Duration;

use fleetd_testkit::rig::{Rig, sim_profile};
use fleetd_testkit::rig_herdr::HerdrRig;
use fleetd_testkit::{Service, http, require_rabbitmq, require_tmux, wait_until};
use serde_json::json;

fn reply_waiting(operator: &http::Endpoint, target: &str) -> bool {
    http::get(operator, &format!("/sessions/{target}/replies"))
        .is_ok_and(|r| r.json()["replies"][0]["msgId"].is_string())
}

/// Kills the rig's daemon with SIGKILL and starts it again on the same HOME (same config, same
/// state directory) and address; the agents in their panes keep running.
fn kill_9_and_restart(rig: &mut Rig) {
    rig.kill_daemon();
    rig.restart_daemon();
}

#[test]
fn e2e_scenario_kill_9_between_reply_and_nudge_loses_nothing() {
    let Some(mut rig) = Rig::start_if_tmux(&format!(
        "primary:\n  tab: base:boss\n  pushReminders: 3\n  pushBackoffMs: 1000\nprofiles:\n{}{}",
        sim_profile("slow", &[("SIM_AGENT_WORK_MS", "2500")]),
        sim_profile("slower", &[("SIM_AGENT_WORK_MS", "30000")]),
    )) else {
        return;
    };
    let lead = rig.agent_lead("boss");
    rig.spawn("slow", "nia");
    rig.spawn("slower", "zed");
    let done = rig.history(&lead).matches("turn done").count();
    rig.type_line(
        &lead,
        r#"fleet_send {"target":"nia","task":"the job","timeoutSecs":1}"#,
    );
    wait_until("the first send to return", Duration::from_secs(60), || {
        rig.history(&lead).matches("turn done").count() > done
    });
    // The lead is busy (waiting on zed) when nia's reply lands: the nudge is deferred.
    rig.type_line(
        &lead,
        r#"fleet_send {"target":"zed","task":"long job","timeoutSecs":60}"#,
    );
    wait_until("nia's reply in the inbox", Duration::from_secs(60), || {
        reply_waiting(&rig.daemon.operator(), "nia")
    });
    assert!(!rig.history(&lead).contains("[fleet] 1 message from nia"));
    kill_9_and_restart(&mut rig);
    // The restarted daemon finds the mail, resolves the pinned primary tab to the lead agent
    // (its own call failed with the old daemon, so it is idle) and nudges it.
    wait_until(
        "the nudge after the restart",
        Duration::from_secs(60),
        || rig.history(&lead).contains("[fleet] 1 message from nia"),
    );
    let replies = http::reply_texts(rig.daemon.operator(), "nia");
    assert!(
        replies
            .first()
            .is_some_and(|t| t.contains("sim-agent did: the job")),
        "the reply survived the kill: {replies:?}"
    );
}

#[test]
fn e2e_scenario_amqp_inbox_survives_a_daemon_kill_9() {
    if require_tmux() == Service::Skip || require_rabbitmq() == Service::Skip {
        return;
    }
    // Queue names are per target: a name unique to this run keeps runs apart on a shared broker.
    let name = format!("amqp{}", std::process::id());
    let _cleanup =
        crate::store::QueueCleanup(vec![fleetd_core::Target::new(&name).expect("valid")]);
    let mut rig = Rig::start(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\nstore:\n  kind: amqp\n  url: amqp://guest:guest@127.0.0.1:5672/%2f\nprofiles:\n{}",
        sim_profile("sim", &[("SIM_AGENT_WORK_MS", "200")])
    ));
    rig.spawn("sim", &name);
    let sent = rig.lead(
        "fleet_send",
        &json!({ "target": name, "task": "over the broker", "wait": false }),
    );
    assert_eq!(sent["isError"], false, "{sent}");
    wait_until("the reply on the broker", Duration::from_secs(60), || {
        reply_waiting(&rig.daemon.operator(), &name)
    });
    kill_9_and_restart(&mut rig);
    // Read and acknowledge through the REST API, on the same broker queue.
    let operator = rig.daemon.operator();
    let inbox = http::get(&operator, &format!("/sessions/{name}/replies"))
        .expect("peek")
        .json();
    let replies = inbox["replies"].as_array().cloned().unwrap_or_default();
    assert_eq!(replies.len(), 1, "{inbox}");
    assert!(
        replies[0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("over the broker")),
        "{inbox}"
    );
    let id = replies[0]["msgId"].as_str().expect("msgId");
    let acked = http::request(
        &operator,
        "POST",
        &format!("/sessions/{name}/replies/{id}/ack"),
        None,
    )
    .expect("ack");
    assert_eq!(acked.status, 200, "{}", acked.body);
    assert!(
        !reply_waiting(&operator, &name),
        "acknowledged on the broker"
    );
}

#[test]
fn e2e_scenario_two_herdr_daemons_with_colliding_pane_ids() {
    let rig = HerdrRig::start_two(&format!(
        "primary:\n  tab: w1:t1\n  pushReminders: 3\n  pushBackoffMs: 1000\nprofiles:\n{}",
        fleetd_testkit::rig_herdr::sim_profile("slow", 1500)
    ));
    let (_, lead) = rig.agent_lead("boss");
    assert_eq!(lead, "w1:p1");
    rig.call_from(&lead, r#"fleet_spawn {"profile":"slow","name":"nia"}"#);
    let member = http::get(rig.daemon.operator(), "/sessions/nia")
        .expect("session")
        .json();
    let pane = member["paneId"].as_str().expect("pane id").to_owned();
    assert!(
        pane.starts_with("member:"),
        "qualified by its daemon: {pane}"
    );
    let bare = pane.trim_start_matches("member:");
    // Open panes on the lead daemon until the member's bare id exists there too.
    let on_lead = |rig: &HerdrRig| {
        rig.herdr
            .call("pane.get", &json!({ "pane_id": bare }))
            .is_ok_and(|r| r.get("result").is_some())
    };
    for _ in 0..5 {
        if on_lead(&rig) {
            break;
        }
        rig.call(
            "tab.create",
            &json!({ "workspace_id": "w1", "label": "spare" }),
        );
    }
    assert!(on_lead(&rig), "{bare} exists on both daemons");
    // Work flows to the member daemon's pane and the nudge to the lead daemon's.
    rig.call_from(
        &lead,
        r#"fleet_send {"target":"nia","task":"cross daemons","timeoutSecs":1}"#,
    );
    wait_until("the nudge in the lead", Duration::from_secs(60), || {
        rig.history(&lead).contains("[fleet] 1 message from nia")
    });
    // A bare id that exists on both daemons is refused; the qualified one works.
    rig.call_from(&lead, &format!(r#"fleet_stop {{"paneId":"{bare}"}}"#));
    assert_eq!(
        http::get(rig.daemon.operator(), "/sessions/nia")
            .expect("session")
            .status,
        200,
        "an ambiguous pane id stopped nothing"
    );
    rig.call_from(&lead, &format!(r#"fleet_stop {{"paneId":"{pane}"}}"#));
    wait_until("nia to be released", Duration::from_secs(30), || {
        http::get(rig.daemon.operator(), "/sessions/nia").is_ok_and(|r| r.status == 404)
    });
}

#[test]
fn every_scenario_in_the_table_exists() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it");
    let table = include_str!("scenarios.rs");
    let mut missing = Vec::new();
    for line in table.lines().filter(|l| l.starts_with("//! | §")) {
        let cell = line.rsplit('|').nth(1).unwrap_or_default().trim();
        let Some((module, test)) = cell.rsplit_once("::") else {
            missing.push(format!("unparsable row: {line}"));
            continue;
        };
        // `a::b` is `a/b.rs`, or `a/b/mod.rs` once it became a directory.
        let module = dir.join(module.replace("::", "/"));
        let source = std::fs::read_to_string(module.with_extension("rs"))
            .or_else(|_| std::fs::read_to_string(module.join("mod.rs")))
            .unwrap_or_default();
        if !source.contains(&format!("fn {test}(")) {
            missing.push(cell.to_owned());
        }
    }
    assert!(
        missing.is_empty(),
        "scenarios named in the table but not found: {missing:#?}"
    );
}

#[test]
fn e2e_scenario_a_member_mid_turn_across_kill_9_still_delivers_its_reply() {
    let Some(mut rig) = Rig::start_if_tmux(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\nprofiles:\n{}",
        sim_profile("slow", &[("SIM_AGENT_WORK_MS", "4000")])
    )) else {
        return;
    };
    rig.spawn("slow", "nia");
    let sent = rig.lead(
        "fleet_send",
        &json!({ "target": "nia", "task": "across the restart", "wait": false }),
    );
    assert_eq!(sent["isError"], false, "{sent}");
    wait_until("nia to be working", Duration::from_secs(30), || {
        http::get(rig.daemon.operator(), "/sessions/nia")
            .is_ok_and(|r| r.json()["status"] == "working")
    });
    // fleetd dies mid-turn and comes back: it re-adopts nia from its registry, so her reply,
    // sent to the restarted daemon, is hers and lands in her inbox.
    kill_9_and_restart(&mut rig);
    wait_until(
        "nia's reply after the restart",
        Duration::from_secs(60),
        || {
            http::reply_texts(rig.daemon.operator(), "nia")
                .first()
                .is_some_and(|t| t.contains("sim-agent did: across the restart"))
        },
    );
    let member = http::get(rig.daemon.operator(), "/sessions/nia").expect("session");
    assert_eq!(member.status, 200, "nia is a member again: {}", member.body);
}
