//! Tests of sim-agent's line cleaning and scripts.

use super::*;

#[test]
fn lines_lose_paste_markers_and_controls() {
    assert_eq!(
        strip_controls("\x1b[200~hello \"w\" ✓\x1b[201~\r"),
        "hello \"w\" ✓"
    );
}

#[test]
fn scripts_parse_and_the_last_action_repeats() {
    let args: Vec<String> = ["--script", "silent,reply", "--work-ms", "10"]
        .map(str::to_owned)
        .to_vec();
    let config = Config::from_args_and_env(&args).expect("config");
    let mut agent = Agent::new(config);
    assert_eq!(agent.next_action(), Action::Silent);
    assert_eq!(agent.next_action(), Action::Reply);
    assert_eq!(agent.next_action(), Action::Reply);
    assert!(Config::from_args_and_env(&["--script".to_owned(), "dance".to_owned()]).is_err());
}
