//! Tests of the effects' helpers.

use super::shows;

#[test]
fn a_typed_text_is_found_by_its_start_whatever_the_spacing() {
    let screen = "some output\n> please  run the\n  tests\n$ ";
    assert!(shows(screen, "please run"));
    assert!(shows(screen, "please run the tests"), "across a wrap");
    assert!(!shows(screen, "something else"));
    assert!(!shows(screen, "   "), "an empty text is never found");
    let long = "x".repeat(300);
    assert!(
        shows(&format!("> {}", &long[..60]), &long),
        "its first 48 characters"
    );
}
