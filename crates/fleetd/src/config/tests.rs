//! Config tests: defaults, every documented key, refusals with positions, and the example file
//! kept in step with the raw structs.

use super::*;

fn env() -> Environment {
    Environment {
        home: Some(PathBuf::from("/home/u")),
        ..Environment::default()
    }
}

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, "test.yaml", &env())
}

/// Asserts `text` is refused and the message contains every fragment.
fn check_refused(text: &str, fragments: &[&str]) {
    let err = parse(text)
        .expect_err("config should be refused")
        .to_string();
    for fragment in fragments {
        assert!(err.contains(fragment), "error {err:?} lacks {fragment:?}");
    }
}

#[test]
fn empty_file_gives_every_default() {
    let config = parse("").expect("empty config is valid");
    assert_eq!(config.listen.to_string(), "127.0.0.1:7797");
    assert_eq!(config.multiplexer, MultiplexerChoice::Auto);
    assert_eq!(
        config.herdr_socket,
        PathBuf::from("/home/u/.config/herdr/herdr.sock")
    );
    assert_eq!(
        config.state_dir,
        PathBuf::from("/home/u/.local/state/fleetd")
    );
    assert_eq!(
        config.store,
        Store::Embedded {
            path: PathBuf::from("/home/u/.local/state/fleetd/inbox.db")
        }
    );
    assert_eq!(config.members_workspace, "fleet");
    assert_eq!(config.primary, None);
    assert_eq!(config.inbox.max_message_bytes, 1_048_576);
    assert_eq!(config.tickets.ttl_after_finish_secs, 600);
    assert_eq!(config.delivery.verify_grace_ms, 5_000);
    assert_eq!(config.delivery.max_inject_bytes, 4_096);
    assert_eq!(config.limits.max_queued_tasks, 64);
    assert_eq!(config.limits.max_open_questions, 16);
    assert_eq!(
        config.connections,
        Connections {
            max: 2048,
            per_uid: 64,
            owner_reserve: 512,
            per_member: 512,
            header_read_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
        }
    );
    assert!(!config.config_reload);
    assert_eq!(config.log.level, "info");
    assert_eq!(config.log.format, LogFormat::Human);
}

#[test]
fn xdg_and_herdr_discovery_follow_the_environment() {
    let e = Environment {
        home: Some(PathBuf::from("/home/u")),
        xdg_config_home: Some(PathBuf::from("/cfg")),
        xdg_state_home: Some(PathBuf::from("/state")),
        herdr_socket_path: None,
        herdr_session: Some("work".to_owned()),
        hostname: None,
        codex_home: None,
    };
    let config = Config::parse("", "x", &e).expect("valid");
    assert_eq!(config.state_dir, PathBuf::from("/state/fleetd"));
    assert_eq!(config.codex_home, PathBuf::from("/home/u/.codex"));
    assert_eq!(
        config.herdr_socket,
        PathBuf::from("/cfg/herdr/sessions/work/herdr.sock")
    );
    assert_eq!(
        e.default_config_path(),
        PathBuf::from("/cfg/fleetd/fleetd.yaml")
    );
    let e = Environment {
        herdr_socket_path: Some(PathBuf::from("/run/h.sock")),
        ..e
    };
    assert_eq!(e.default_herdr_socket(), PathBuf::from("/run/h.sock"));
    let e = Environment {
        codex_home: Some(PathBuf::from("/ch")),
        ..e
    };
    assert_eq!(e.codex_home(), PathBuf::from("/ch"));
}

#[test]
fn primary_block_defaults_its_push_budget() {
    let config = parse("primary:\n  tab: w1:t1\n").expect("valid");
    let primary = config.primary.expect("primary set");
    assert_eq!(primary.tab, "w1:t1");
    assert_eq!(primary.push_reminders, 5);
    assert_eq!(primary.push_backoff_ms, 30_000);
    assert_eq!(primary.push_backoff_max_ms, 600_000);
}

#[test]
fn unknown_key_is_refused_with_line_and_column() {
    check_refused(
        "listen: 127.0.0.1:1\nlisten_port: 3\n",
        &["listen_port", "line 2", "column 1"],
    );
    check_refused(
        "primary:\n  tab: w1:t1\n  colour: red\n",
        &["colour", "line 3", "column 3"],
    );
}

#[test]
fn retired_primary_terminal_is_refused_with_the_tab_hint() {
    check_refused(
        "primary:\n  terminal: term_1\n",
        &["primary.terminal", "retired", "tab: w1:t1", "test.yaml:2:3"],
    );
}

#[test]
fn primary_without_tab_is_refused() {
    check_refused(
        "primary:\n  pushReminders: 3\n",
        &["primary.tab", "needs `tab:`", "test.yaml:2:3"],
    );
}

#[test]
fn wrong_types_are_refused() {
    check_refused("configReload: maybe\n", &["configReload", "line 1"]);
    check_refused(
        "inbox:\n  maxMessageBytes: lots\n",
        &["maxMessageBytes", "line 2"],
    );
    check_refused("multiplexer: screen\n", &["screen", "line 1"]);
    check_refused("leads: w1:t1\n", &["leads", "line 1"]);
    check_refused(
        "primary:\n  tab: w1:t1\n  pushReminders: -1\n",
        &["pushReminders", "line 3"],
    );
}

#[test]
fn semantic_refusals_name_the_key_and_what_to_do() {
    check_refused(
        "listen: nowhere\n",
        &["`listen`", "test.yaml:1:9", "host:port"],
    );
    check_refused("listen: 0.0.0.0:7797\n", &["apiToken", "non-loopback"]);
    check_refused("apiToken: tok\n", &["apiToken", "not defined", "secrets:"]);
    check_refused("store:\n  kind: amqp\n", &["store.url", "amqp://"]);
    check_refused(
        "store:\n  kind: amqp\n  url: broker\n",
        &["store.url", "\"broker\"", "not defined"],
    );
    check_refused("store:\n  url: amqp://x\n", &["store.url", "kind: amqp"]);
    check_refused(
        "inbox:\n  maxMessageBytes: 0\n",
        &["inbox.maxMessageBytes", "out of range"],
    );
    check_refused(
        "limits:\n  maxQueuedTasks: 0\n",
        &[
            "limits.maxQueuedTasks",
            "out of range",
            "1 to 10000",
            "default 64",
        ],
    );
    check_refused(
        "limits:\n  maxOpenQuestions: 1001\n",
        &["limits.maxOpenQuestions", "1 to 1000", "default 16"],
    );
    check_refused(
        "connections:\n  max: 0\n",
        &["connections.max", "1 to 1000000", "default 2048"],
    );
    check_refused(
        "connections:\n  max: 100\n  perUid: 101\n",
        &["connections.perUid", "1 to 100"],
    );
    check_refused(
        "connections:\n  max: 100\n  ownerReserve: 101\n",
        &[
            "connections.ownerReserve",
            "more than connections.max (100)",
        ],
    );
    check_refused(
        "connections:\n  headerReadTimeoutMs: 0\n",
        &["connections.headerReadTimeoutMs", "out of range"],
    );
    check_refused("connections:\n  idleTimeout: 5\n", &["idleTimeout"]);
    check_refused("primary:\n  tab: main\n", &["primary.tab", "not a tab"]);
    check_refused(
        "secrets:\n  t: {env: A, file: /b}\n",
        &["secrets.t", "exactly one"],
    );
    check_refused(
        "profiles:\n  p: {agent: nope}\n",
        &["profiles.p.agent", "known agent"],
    );
    check_refused("profiles:\n  p: {agent: custom}\n", &["profiles.p.command"]);
    check_refused(
        "profiles:\n  p: {agent: pi, backend: gone}\n",
        &["profiles.p.backend", "\"gone\""],
    );
    check_refused(
        "backends:\n  b: {baseUrl: ftp://x}\n",
        &["backends.b.baseUrl", "http"],
    );
    // Review H1: the prober cannot fetch https; accepting it meant a false "backend down"
    // incident for every member on the backend, forever.
    check_refused(
        "backends:\n  b: {baseUrl: 'https://api.example.com', healthUrl: 'https://api.example.com/health'}\n",
        &["backends.b.healthUrl", "plain http://", "no TLS client"],
    );
    check_refused("log:\n  level: \"[\"\n", &["log.level"]);
    check_refused(
        "leads:\n  - {tab: w1:t2, name: a}\n  - {tab: w1:t2, name: b}\n",
        &["leads[1].tab", "twice"],
    );
    check_refused(
        "profiles:\n  p: {agent: pi, runAs: 'Bad User'}\n",
        &["profiles.p.runAs", "not a user name"],
    );
    check_refused(
        "profiles:\n  p: {agent: pi, runAs: agent, sandbox: {}}\n",
        &["profiles.p.runAs", "sandbox", "docs/SECURITY.md"],
    );
    check_refused(
        "profiles:\n  p: {agent: pi, runAs: agent, worktree: {}}\n",
        &["profiles.p.runAs", "worktree", "cwd"],
    );
}

#[test]
fn a_profile_may_run_its_members_as_a_second_user() {
    let config = parse("profiles:\n  p: {agent: pi, runAs: fleet-agent}\n").expect("valid");
    assert_eq!(config.profiles["p"].run_as.as_deref(), Some("fleet-agent"));
    assert_eq!(config.profiles["p"].sandbox, None);
}

#[test]
fn non_loopback_listen_with_a_token_is_accepted() {
    let config =
        parse("listen: 0.0.0.0:7797\napiToken: tok\nsecrets:\n  tok: {env: FLEETD_TOKEN}\n")
            .expect("valid");
    assert!(!config.listen_is_loopback());
    assert_eq!(config.api_token.as_deref(), Some("tok"));
}

#[test]
fn effective_config_redacts_broker_passwords() {
    let config = parse("store:\n  kind: amqp\n  url: amqp://fleet:hunter2@10.0.0.1:5672/%2f\n")
        .expect("valid");
    let yaml = config.to_yaml();
    assert!(!yaml.contains("hunter2"), "{yaml}");
    assert!(
        yaml.contains("amqp://fleet:***@10.0.0.1:5672/%2f"),
        "{yaml}"
    );
    assert_eq!(redact_url("amqp://host/vh"), "amqp://host/vh");
}

fn example_text() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fleetd.example.yaml");
    std::fs::read_to_string(&path).expect("fleetd.example.yaml exists at the repo root")
}

#[test]
fn example_file_is_valid() {
    let config = parse(&example_text()).expect("the example config validates");
    assert!(config.profiles.contains_key("coder"));
}

/// Every field of every raw struct must appear as a key in the example file, in its section.
#[test]
fn example_file_documents_every_raw_field() {
    let fields = field_paths::collect().expect("the collector walks every raw struct");
    assert!(
        fields.len() > 40,
        "collector found too few fields: {fields:?}"
    );
    let example: serde_json::Value =
        serde_saphyr::from_str(&example_text()).expect("example parses as YAML");
    let mut missing = Vec::new();
    for path in &fields {
        if path == "primary.terminal" {
            continue; // retired: accepted only to be refused with a hint, never documented.
        }
        if !has_path(&example, path) {
            missing.push(path.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "fleetd.example.yaml does not document: {missing:?}"
    );
}

/// Looks `a.b.*.c` / `a[].c` up in the example, where `*` is any map entry and `[]` any element.
fn has_path(value: &serde_json::Value, path: &str) -> bool {
    let mut parts = path.split('.');
    let Some(first) = parts.next() else {
        return true;
    };
    let rest: Vec<&str> = parts.collect();
    let rest = rest.join(".");
    let (key, list) = match first.strip_suffix("[]") {
        Some(k) => (k, true),
        None => (first, false),
    };
    let children: Vec<&serde_json::Value> = if key == "*" {
        value
            .as_object()
            .map(|m| m.values().collect())
            .unwrap_or_default()
    } else {
        value.get(key).into_iter().collect()
    };
    children.into_iter().any(|child| {
        let items: Vec<&serde_json::Value> = if list {
            child
                .as_array()
                .map(|a| a.iter().collect())
                .unwrap_or_default()
        } else {
            vec![child]
        };
        items
            .into_iter()
            .any(|item| rest.is_empty() || has_path(item, &rest))
    })
}

mod field_paths;

#[test]
fn a_small_connection_cap_scales_its_defaults_down() {
    let config = parse("connections:\n  max: 40\n").expect("valid");
    assert_eq!(config.connections.max, 40);
    assert_eq!(config.connections.per_uid, 40, "perUid never above max");
    assert_eq!(config.connections.owner_reserve, 10, "a quarter of max");
    let config =
        parse("connections:\n  max: 40\n  ownerReserve: 40\n  perUid: 3\n").expect("valid");
    assert_eq!(config.connections.owner_reserve, 40);
    assert_eq!(config.connections.per_uid, 3);
}

fn gateway_with(urls: &str, tls: &str) -> String {
    format!(
        "gateway:\n  name: a\n  broker:\n    urls: [{urls}]\n    passwordSecret: gw\n{tls}secrets:\n  gw:\n    file: /run/gw\n"
    )
}

#[test]
fn gateway_tls_trusts_its_ca_file_and_is_only_for_amqps() {
    let tls = "    tls:\n      caFile: /etc/fleetd/ca.pem\n";
    let config = parse(&gateway_with("amqps://rmq:5671/fleet", tls)).expect("valid");
    let broker = config.gateway.expect("gateway").broker;
    assert_eq!(
        broker.tls,
        Some(GatewayTls {
            ca_file: Some(PathBuf::from("/etc/fleetd/ca.pem"))
        })
    );
    // amqps:// without `tls:`: the system's CAs.
    let config = parse(&gateway_with("amqps://rmq:5671/fleet", "")).expect("valid");
    assert_eq!(config.gateway.expect("gateway").broker.tls, None);
    let config = parse(&gateway_with("amqps://rmq:5671/fleet", "    tls: {}\n")).expect("valid");
    assert_eq!(
        config.gateway.expect("gateway").broker.tls,
        Some(GatewayTls { ca_file: None })
    );
    check_refused(
        &gateway_with("amqp://rmq:5672/fleet", tls),
        &["gateway.broker.tls", "is plain AMQP", "write amqps://"],
    );
    check_refused(
        &gateway_with("amqps://rmq1:5671/fleet, amqp://rmq2:5672/fleet", ""),
        &["gateway.broker.urls", "amqp://rmq2", "in clear"],
    );
    check_refused(
        &gateway_with("amqps://rmq:5671/fleet", "    tls:\n      caFile: ca.pem\n"),
        &["gateway.broker.tls.caFile", "absolute path", "PEM"],
    );
    check_refused(
        &gateway_with(
            "amqps://rmq:5671/fleet",
            "    tls:\n      certFile: /c.pem\n",
        ),
        &["unknown field `certFile`"],
    );
}

#[test]
fn gateway_broker_user_must_be_the_gateway_name() {
    let with_user = |user: &str| {
        format!(
            "gateway:\n  name: a\n  broker:\n    urls: [amqp://rmq:5672/fleet]\n    user: {user}\n    passwordSecret: gw\nsecrets:\n  gw:\n    file: /run/gw\n"
        )
    };
    // The same name, said twice, or left out: the user is the gateway's name.
    let config = parse(&with_user("a")).expect("valid");
    assert_eq!(config.gateway.expect("gateway").broker.user, "a");
    let config = parse(&gateway_with("amqp://rmq:5672/fleet", "")).expect("valid");
    assert_eq!(config.gateway.expect("gateway").broker.user, "a");
    // Another user would be stamped as every message's user_id: refused, naming both keys.
    check_refused(
        &with_user("fleet-a"),
        &[
            "gateway.broker.user",
            "gateway.name",
            "\"fleet-a\"",
            "\"a\"",
            "impersonation",
            "remove `user:`",
        ],
    );
}

#[test]
fn gateway_outbox_max_defaults_above_the_alarm_and_may_not_be_below_it() {
    let base = gateway_with("amqp://rmq:5672/fleet", "");
    let config = parse(&base).expect("valid");
    let gw = config.gateway.expect("gateway");
    assert_eq!((gw.outbox_alarm, gw.outbox_max), (1000, 100_000));
    let high = base.replace("  name: a\n", "  name: a\n  outboxAlarm: 200000\n");
    let gw = parse(&high).expect("valid").gateway.expect("gateway");
    assert_eq!(gw.outbox_max, 200_000, "never below the alarm by default");
    let low = base.replace(
        "  name: a\n",
        "  name: a\n  outboxAlarm: 50\n  outboxMax: 10\n",
    );
    let err = parse(&low).expect_err("below the alarm").to_string();
    assert!(err.contains("gateway.outboxMax"), "{err}");
    assert!(err.contains("below gateway.outboxAlarm (50)"), "{err}");
}

#[test]
fn gateway_peer_backlog_max_defaults_to_2000_and_zero_is_refused_by_name() {
    let base = gateway_with("amqp://rmq:5672/fleet", "");
    let gw = parse(&base).expect("valid").gateway.expect("gateway");
    assert_eq!(gw.peer_backlog_max, 2000);
    let set = base.replace("  name: a\n", "  name: a\n  peerBacklogMax: 50\n");
    let gw = parse(&set).expect("valid").gateway.expect("gateway");
    assert_eq!(gw.peer_backlog_max, 50);
    let zero = base.replace("  name: a\n", "  name: a\n  peerBacklogMax: 0\n");
    let err = parse(&zero).expect_err("zero").to_string();
    assert!(err.contains("gateway.peerBacklogMax"), "{err}");
    assert!(err.contains("out of range"), "{err}");
}
