//! The data directory against mistakes and hostile neighbours: token validity is capped, the directory is
//! private and locked by one daemon, concurrent creators agree on one key, and the revocation list fails
//! closed.

mod common;

use common::Env;

#[test]
fn valid_for_above_the_configured_maximum_is_refused() {
    let env = Env::new();
    let run = env.cli(&[
        "token",
        "--config",
        env.cfg(),
        "--mesh",
        "default",
        "--name",
        "web-1",
        "--valid-for",
        "400d",
    ]);
    assert_eq!(run.code(), Some(2), "{run}");
    assert!(
        run.stderr.contains("--valid-for 400d") && run.stderr.contains("tokens.maxValidFor (365d)"),
        "names the asked validity and the maximum: {run}"
    );
    assert!(run.stdout.is_empty(), "no token was printed: {run}");
    env.token("default", "web-1", &["--valid-for", "365d"]);

    let env = Env::with_settings("tokens: {maxValidFor: 1h}\n");
    let run = env.cli(&[
        "token",
        "--config",
        env.cfg(),
        "--mesh",
        "default",
        "--name",
        "web-1",
        "--valid-for",
        "61m",
    ]);
    assert_eq!(run.code(), Some(2), "{run}");
    assert!(
        run.stderr.contains("--valid-for 1h1m") && run.stderr.contains("tokens.maxValidFor (1h)"),
        "{run}"
    );
    env.token("default", "web-1", &["--valid-for", "1h"]);
}
