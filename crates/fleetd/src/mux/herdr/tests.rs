//! Tests of the herdr backend.

use std::path::PathBuf;

use super::*;

#[test]
fn socket_discovery_follows_herdr_order() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    };
    assert_eq!(
        HerdrConfig::discover_socket(env(&[("HERDR_SOCKET_PATH", "/x/h.sock"), ("HOME", "/h")])),
        Some(PathBuf::from("/x/h.sock"))
    );
    assert_eq!(
        HerdrConfig::discover_socket(env(&[("HERDR_SESSION", "work"), ("XDG_CONFIG_HOME", "/c")])),
        Some(PathBuf::from("/c/herdr/sessions/work/herdr.sock"))
    );
    assert_eq!(
        HerdrConfig::discover_socket(env(&[("HERDR_SESSION", "default"), ("HOME", "/h")])),
        Some(PathBuf::from("/h/.config/herdr/herdr.sock"))
    );
    assert_eq!(HerdrConfig::discover_socket(env(&[])), None);
}

#[test]
fn a_tail_is_the_last_lines_before_the_blank_rows() {
    assert_eq!(last_lines("a\nb\nc\n\n\n", 2), "b\nc");
    assert_eq!(last_lines("a\n", 5), "a");
    assert_eq!(last_lines("", 5), "");
}

#[test]
fn argv_quoting_survives_the_shell() {
    let argv = ["sim-agent", "it's", "a b", "", "--x=1"].map(str::to_owned);
    assert_eq!(
        crate::mux::shell_quote_argv(&argv),
        r"sim-agent 'it'\''s' 'a b' '' --x=1"
    );
}
