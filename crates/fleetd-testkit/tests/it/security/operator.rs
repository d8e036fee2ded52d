//! The operator's doors: owner-only state (a loose one tightened), the dashboard sign-in and
//! operator routes for the operator alone, and token guessing slowed down per address.

use super::*;

#[test]
fn e2e_security_state_is_owner_only_and_a_loose_one_is_tightened() {
    let home = tempfile::tempdir().expect("tempdir");
    let state = state_dir(home.path());
    // A state directory an older fleetd left readable by everyone.
    std::fs::create_dir_all(&state).expect("mkdir");
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    for (name, text) in [("inbox.db", ""), ("members.json", "[]")] {
        std::fs::write(state.join(name), text).expect("write");
        std::fs::set_permissions(state.join(name), std::fs::Permissions::from_mode(0o644))
            .expect("chmod");
    }
    let daemon = Daemon::start(home.path(), &[]);
    // Said at start, before the daemon listens.
    for name in ["inbox.db", "members.json", "\"was\":\"755\""] {
        assert!(
            daemon
                .seen_logs()
                .iter()
                .any(|l| l.contains("made it owner-only") && l.contains(name)),
            "a warning names {name}: {:#?}",
            daemon.seen_logs()
        );
    }
    // Something written: the inbox files exist with their journal.
    let answer = http::request(
        daemon.operator(),
        "POST",
        "/sessions/alice/replies/drain",
        None,
    )
    .expect("answers");
    assert_eq!(answer.status, 200, "{}", answer.body);
    let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode(&state), 0o700);
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&state).expect("list").flatten() {
        let path = entry.path();
        let expected = if path.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode(&path), expected, "{}", path.display());
        files.push(entry.file_name().to_string_lossy().into_owned());
    }
    files.sort();
    for name in ["api.sock", "fleetd.sock", "inbox.db", "inbox.db.lock"] {
        assert!(files.iter().any(|f| f == name), "{name} in {files:?}");
    }
    // An older fleetd's member registry is imported into the store, then removed.
    assert!(!files.iter().any(|f| f == "members.json"), "{files:?}");
    // The sandboxes' door: the shim's socket under a second name, and their HTTP door.
    let door = state.join("door");
    let mut sockets: Vec<String> = std::fs::read_dir(&door)
        .expect("the door's directory")
        .flatten()
        .map(|e| {
            assert_eq!(mode(&e.path()), 0o600, "{}", e.path().display());
            e.file_name().to_string_lossy().into_owned()
        })
        .collect();
    sockets.sort();
    assert_eq!(sockets, ["fleetd.sock", "http.sock"]);
    // Another user cannot even look inside, nor into the door.
    if rustix::process::geteuid().is_root() {
        for dir in [&state, &door] {
            let out = as_nobody("ls", &[&dir.display().to_string()], &[]).expect("root");
            assert!(!out.status.success(), "nobody listed {}", dir.display());
        }
    }
}

/// A one-time dashboard key, asked for on the operator's socket `operator`.
fn dashboard_key(operator: &http::Endpoint) -> String {
    http::request(operator, "POST", "/dashboard/keys", None)
        .expect("a key")
        .json()["key"]
        .as_str()
        .expect("key")
        .to_owned()
}

/// The dashboard's sign-in (`POST /dashboard/login`) with `body` (a key or the API token).
fn sign_in(addr: std::net::SocketAddr, body: &str) -> http::Response {
    http::request(addr, "POST", "/dashboard/login", Some(body)).expect("login answers")
}

/// The dashboard's doors and the operator routes it uses (`/dashboard/keys`, the sign-in, the
/// session cookie, `/questions`, an answer, a stop, `/tickets`), tried by an anonymous process,
/// a member's agent, another uid and a web page: each refused, nothing changed. The operator's
/// key works once; the cookie it buys is `HttpOnly` and `SameSite=Strict`, counts only from
/// fleetd's own page, and stops counting at sign-out; a forged one is nothing.
#[test]
fn e2e_security_guessing_the_dashboard_token_is_slowed_down_per_address() {
    let Some((rig, _)) = rig_with_mail("") else {
        return;
    };
    let addr = rig.daemon.addr;
    let login = |token: &str| sign_in(addr, &format!(r#"{{"token":"{token}"}}"#));
    // Review L5: five typos are free; the sixth wrong guess makes this address wait.
    for n in 1..=6 {
        let wrong = login(&format!("guess-{n}"));
        wrong.assert_refused(401, "bad_credential", &format!("guess {n}"));
    }
    // While it waits, even the right token is not heard, and no session is opened.
    let refused = login(TOKEN);
    refused.assert_refused(429, "too_many_sign_ins", "the right token while it waits");
    assert!(refused.headers("set-cookie").is_empty(), "{}", refused.head);
    let wait: u64 = refused
        .headers("retry-after")
        .first()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("a Retry-After header: {}", refused.head));
    assert!((1..=60).contains(&wait), "{wait}");
    // The operator's own socket is another address: it is not held up.
    let operator = rig.daemon.operator();
    let key = dashboard_key(&operator);
    assert!(!key.is_empty());
    // After the wait the right token signs in, and the count starts again.
    fleetd_testkit::agents::rig::pause(Duration::from_millis(wait * 1000 + 200));
    let signed = login(TOKEN);
    assert_eq!(signed.status, 200, "{}", signed.body);
    let typo = login("typo");
    assert_eq!(typo.error_code(), "bad_credential", "{}", typo.body);
}

#[test]
fn e2e_security_dashboard_sign_in_and_operator_routes_are_the_operators_alone() {
    attack_changes_nothing(|rig, id| {
        let addr = rig.daemon.addr;
        let operator = rig.daemon.operator();
        let ack = format!("/sessions/alice/replies/{id}/ack");
        let doors: [(&str, &str, Option<&str>); 6] = [
            ("POST", "/dashboard/keys", None),
            ("GET", "/questions", None),
            (
                "POST",
                "/questions/q-1/answer",
                Some(r#"{"answer":"forged"}"#),
            ),
            ("POST", "/sessions/alice/stop", None),
            ("GET", "/tickets", None),
            ("POST", ack.as_str(), None),
        ];

        // An anonymous process (this test, in no pane, no token).
        for (method, path, body) in doors {
            let answer = http::request(addr, method, path, body).expect("answers");
            let expected = if path == "/dashboard/keys" {
                "not_the_operator"
            } else {
                "anonymous_caller"
            };
            answer.assert_refused(403, expected, &format!("anonymous {method} {path}"));
        }
        // A web page: refused for its origin before anything else, even holding the token.
        let bearer = format!("Bearer {TOKEN}");
        for (method, path, body) in doors.iter().filter(|(m, ..)| *m == "POST") {
            let answer = http::request_with(
                addr,
                method,
                path,
                &[
                    ("Origin", "http://evil.example"),
                    ("Authorization", &bearer),
                ],
                *body,
            )
            .expect("answers");
            answer.assert_refused(
                403,
                "foreign_origin",
                &format!("cross-site {method} {path}"),
            );
        }
        // A member's agent, with its shell tool.
        let m = mcp_call();
        let line = doors
            .iter()
            .map(|(method, path, body)| {
                format!("{m} --http {method} {path} '{}'", body.unwrap_or(""))
            })
            .collect::<Vec<_>>()
            .join(" ; ");
        let answers = run_in(rig, "mallory", &line);
        let codes: Vec<String> = answers.iter().map(code).collect();
        assert_eq!(
            codes,
            [
                "not_the_operator",
                "not_a_lead",
                "not_a_lead",
                "not_a_lead",
                "not_a_lead",
                "not_a_lead"
            ],
            "{answers:#?}"
        );
        // Another uid.
        let reachable = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(reachable.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let copy = reachable.path().join("mcp-call");
        std::fs::copy(bin_path("mcp-call"), &copy).expect("copy");
        let url = format!("http://{addr}");
        for (method, path, body) in doors {
            let Some(out) = as_nobody(
                &copy.display().to_string(),
                &["--http", method, path, body.unwrap_or("")],
                &[("FLEETD_URL", &url)],
            ) else {
                return;
            };
            let answer: Value =
                serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
            let expected = if path == "/dashboard/keys" {
                "not_the_operator"
            } else {
                "anonymous_caller"
            };
            assert_eq!(
                code(&answer),
                expected,
                "another uid {method} {path}: {answer}"
            );
        }

        // The operator's key, traded once for a session.
        let key = dashboard_key(&operator);
        let login = format!(r#"{{"key":"{key}"}}"#);
        let signed = sign_in(addr, &login);
        assert_eq!(signed.status, 200, "{}", signed.body);
        let set = signed.headers("set-cookie").join("\n");
        for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
            assert!(set.contains(attribute), "{attribute} in {set}");
        }
        let session = set
            .split(';')
            .next()
            .and_then(|pair| pair.strip_prefix("fleetd_session="))
            .expect("the session cookie")
            .to_owned();
        let again = sign_in(addr, &login);
        again.assert_refused(401, "bad_credential", "a key works once");
        let wrong_token = sign_in(addr, r#"{"token":"guess"}"#);
        assert_eq!(wrong_token.error_code(), "bad_credential");
        // The API token itself signs a browser in (how one on another host does).
        let by_token = sign_in(addr, &format!(r#"{{"token":"{TOKEN}"}}"#));
        assert_eq!(by_token.status, 200, "{}", by_token.body);
        assert!(
            by_token
                .headers("set-cookie")
                .iter()
                .any(|c| c.starts_with("fleetd_session=") && c.contains("HttpOnly")),
            "{}",
            by_token.head
        );

        let cookie = format!("fleetd_session={session}");
        let with = |extra: &[(&str, &str)]| {
            let mut headers = vec![("Cookie", cookie.as_str())];
            headers.extend_from_slice(extra);
            http::get_with(addr, "/sessions/alice/replies", &headers).expect("answers")
        };
        assert_eq!(with(&[]).status, 200, "the session is the operator's");
        assert_eq!(
            with(&[("Sec-Fetch-Site", "same-origin")]).status,
            200,
            "from fleetd's own page"
        );
        for site in ["same-site", "cross-site"] {
            let answer = with(&[("Sec-Fetch-Site", site)]);
            answer.assert_refused(
                403,
                "anonymous_caller",
                &format!("a {site} request gets nothing from the cookie"),
            );
        }
        let forged = http::get_with(
            addr,
            "/sessions/alice/replies",
            &[("Cookie", "fleetd_session=00ff")],
        )
        .expect("answers");
        assert_eq!(forged.error_code(), "anonymous_caller", "a forged cookie");
        let cross = http::request_with(
            addr,
            "POST",
            &ack,
            &[("Cookie", &cookie), ("Origin", "http://127.0.0.1:1")],
            None,
        )
        .expect("answers");
        cross.assert_refused(403, "foreign_origin", "another port is another site");
        // A member holding a session is still the member.
        let answers = run_in(
            rig,
            "mallory",
            &format!("{m} --http --header 'Cookie:{cookie}' GET /sessions/alice/replies"),
        );
        assert_eq!(code(&answers[0]), "not_a_lead", "{answers:#?}");

        let out = http::request_with(
            addr,
            "POST",
            "/dashboard/logout",
            &[("Cookie", &cookie)],
            None,
        )
        .expect("logout");
        assert_eq!(out.status, 200);
        assert_eq!(
            with(&[]).error_code(),
            "anonymous_caller",
            "signed out, the cookie is nothing"
        );
    });
}
