//! Processes meshca starts (`meshca issue --exec`, a drill's Envoys, the bench's client) get the
//! environment meshca was given, less its secrets: a database password or a token's PIN meant for
//! meshca is not the business of a reload hook or a proxy.

use std::process::Command;

/// `command` with every variable of [`meshca_config::SECRET_ENV_VARS`] removed from what it inherits.
pub fn without_secrets(mut command: Command) -> Command {
    for name in meshca_config::SECRET_ENV_VARS {
        command.env_remove(name);
    }
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_inherits_the_environment_but_no_secret() {
        let mut command = Command::new("env");
        command
            .env(meshca_config::POSTGRES_PASSWORD_ENV, "s3cret")
            .env(meshca_config::PKCS11_PIN_ENV, "pin-9876")
            .env("MESHCA_CHILD_TEST_KEPT", "kept");
        let out = without_secrets(command).output().expect("env runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("MESHCA_CHILD_TEST_KEPT=kept"), "{text}");
        assert!(text.contains("PATH="), "the rest is inherited: {text}");
        assert!(!text.contains("s3cret"), "{text}");
        assert!(!text.contains("pin-9876"), "{text}");
        assert!(
            !text.contains(meshca_config::PKCS11_PIN_ENV),
            "the token's PIN variable is not inherited: {text}"
        );
    }
}
