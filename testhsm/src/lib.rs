//! Test support: a real, throwaway SoftHSM2 token.
//!
//! [`TestToken::new`] makes a temporary directory holding a SoftHSM2 configuration file and its own
//! token directory, and initialises a token labelled `meshca` there with `softhsm2-util` (user PIN
//! `1234`, security officer PIN `5678`). SoftHSM2 reads its configuration file from `SOFTHSM2_CONF`
//! when a process initialises the module: [`TestToken::env`] is that variable for a child process, and
//! this crate never sets it in the test's own environment (tests of one binary run in parallel, each
//! with its own token). Nothing here loads the module in process. Dropping the value deletes
//! everything.
//!
//! SoftHSM2 must be installed (Debian's `softhsm2` package, which `.ci/run` installs); without it
//! [`TestToken::new`] panics, so token tests fail rather than silently skip.

mod install;

use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

use crate::install::SoftHsm;

/// The label of the token [`TestToken::new`] makes.
pub const LABEL: &str = "meshca";
/// The user PIN of every test token.
pub const PIN: &str = "1234";
/// The security officer's PIN of every test token.
pub const SO_PIN: &str = "5678";
/// The variable SoftHSM2 reads its configuration file's path from.
pub const CONF_ENV: &str = "SOFTHSM2_CONF";

/// The longest token label: PKCS#11's label field holds 32 bytes.
const MAX_LABEL: usize = 32;

/// A SoftHSM2 token in a temporary directory, for the duration of a test.
///
/// A process that loads [`module`](Self::module) with [`env`](Self::env) set finds one initialised
/// token, labelled [`label`](Self::label), whose user PIN is [`pin`](Self::pin) (also in
/// [`pin_file`](Self::pin_file)).
#[derive(Debug)]
pub struct TestToken {
    /// Holds the configuration, the token directory, the PIN file; deleted on drop.
    dir: TempDir,
    /// SoftHSM2's module and tool.
    softhsm: SoftHsm,
    /// The token's label.
    label: String,
}

impl TestToken {
    /// A fresh token labelled `meshca`.
    ///
    /// Panics when SoftHSM2 is not installed or the token cannot be initialised; the message says
    /// why and quotes `softhsm2-util`.
    pub fn new() -> TestToken {
        TestToken::with_label(LABEL)
    }

    /// A fresh token labelled `label` (1 to 32 bytes), e.g. to give two tokens of one test
    /// different labels.
    pub fn with_label(label: &str) -> TestToken {
        assert!(
            !label.is_empty() && label.len() <= MAX_LABEL,
            "a token label is 1 to {MAX_LABEL} bytes, got {label:?}"
        );
        let softhsm = SoftHsm::find();
        let dir = tempfile::Builder::new()
            .prefix("meshca-testhsm-")
            .tempdir()
            .expect("creating the test token's temporary directory");
        let token = TestToken {
            dir,
            softhsm,
            label: label.to_owned(),
        };
        fs::create_dir(token.tokens_dir()).expect("creating the test token's token directory");
        let conf = format!(
            "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n",
            token.tokens_dir().display()
        );
        fs::write(token.conf(), conf).expect("writing the test token's softhsm2.conf");
        write_private(&token.pin_file(), PIN);
        token.init_token();
        token
    }

    /// SoftHSM2's PKCS#11 module, e.g. `/usr/lib/softhsm/libsofthsm2.so`.
    pub fn module(&self) -> PathBuf {
        self.softhsm.module.clone()
    }

    /// The SoftHSM2 configuration file that names this token's directory.
    pub fn conf(&self) -> PathBuf {
        self.dir.path().join("softhsm2.conf")
    }

    /// The token's label (`keystore.pkcs11.token`).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The token's user PIN.
    pub fn pin(&self) -> &str {
        PIN
    }

    /// The token's security officer PIN.
    pub fn so_pin(&self) -> &str {
        SO_PIN
    }

    /// A file holding the user PIN (no newline), mode 0600 (`keystore.pkcs11.pinFile`).
    pub fn pin_file(&self) -> PathBuf {
        self.dir.path().join("pin")
    }

    /// The directory SoftHSM2 keeps the token in; every object of the token is a file under it.
    pub fn tokens_dir(&self) -> PathBuf {
        self.dir.path().join("tokens")
    }

    /// How many objects (keys, each half of a pair counted) the token holds: SoftHSM2 keeps each in a
    /// `<uuid>.object` file beside the token's own `token.object`.
    pub fn object_count(&self) -> usize {
        let mut count = 0;
        for token in fs::read_dir(self.tokens_dir()).expect("the token directory") {
            let token = token.expect("an entry").path();
            if !token.is_dir() {
                continue;
            }
            for object in fs::read_dir(&token).expect("a token's directory") {
                let name = object.expect("an entry").file_name();
                let name = name.to_string_lossy();
                if name.ends_with(".object") && name != "token.object" {
                    count += 1;
                }
            }
        }
        count
    }

    /// The environment a child process needs to find this token: `SOFTHSM2_CONF`.
    pub fn env(&self) -> [(&'static str, OsString); 1] {
        [(CONF_ENV, self.conf().into_os_string())]
    }

    /// Moves the token directory away, as if the HSM were unplugged or unreachable: a process that
    /// already uses the token loses it, one that starts finds no token. Panics if it is already
    /// removed.
    pub fn remove(&self) {
        assert!(
            self.tokens_dir().is_dir(),
            "remove: the token is already removed"
        );
        fs::rename(self.tokens_dir(), self.removed_dir())
            .expect("moving the test token's directory away");
    }

    /// Moves the token directory back after [`remove`](Self::remove). Panics if it is not removed.
    pub fn restore(&self) {
        assert!(
            self.removed_dir().is_dir(),
            "restore: the token is not removed"
        );
        fs::rename(self.removed_dir(), self.tokens_dir())
            .expect("moving the test token's directory back");
    }

    /// A `keystore:` block for a settings file: `type: <kind>` and `pkcs11:` naming this token, its
    /// module and its PIN file. With `postgres`, append the `postgres:` section's lines, indented by
    /// two spaces, so that they land in the same block.
    pub fn settings_yaml(&self, kind: &str) -> String {
        format!(
            "keystore:\n  type: {kind}\n  pkcs11:\n    module: {}\n    token: {}\n    pinFile: {}\n",
            yaml_string(&self.module().display().to_string()),
            yaml_string(&self.label),
            yaml_string(&self.pin_file().display().to_string()),
        )
    }

    /// Where [`remove`](Self::remove) puts the token directory: inside the temporary directory, so
    /// that dropping the value deletes it either way.
    fn removed_dir(&self) -> PathBuf {
        self.dir.path().join("tokens.removed")
    }

    /// `softhsm2-util --init-token --free`, with this token's configuration for that process only.
    fn init_token(&self) {
        let mut command = Command::new(&self.softhsm.util);
        command
            .env(CONF_ENV, self.conf())
            .args(["--init-token", "--free", "--label", &self.label])
            .args(["--pin", PIN, "--so-pin", SO_PIN]);
        let output = command
            .output()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.softhsm.util.display()));
        assert!(
            output.status.success(),
            "`{} --init-token --free --label {}` failed ({}): {}{}",
            self.softhsm.util.display(),
            self.label,
            output.status,
            String::from_utf8_lossy(&output.stdout).trim_end(),
            String::from_utf8_lossy(&output.stderr).trim_end(),
        );
    }
}

impl Default for TestToken {
    fn default() -> TestToken {
        TestToken::new()
    }
}

/// Writes a file only its owner can read or write.
fn write_private(path: &Path, contents: &str) {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
    file.write_all(contents.as_bytes())
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    // The process's umask cannot widen 0600, but make the mode explicit all the same.
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))
        .unwrap_or_else(|e| panic!("chmod 600 {}: {e}", path.display()));
}

/// `text` as a double-quoted YAML scalar.
fn yaml_string(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

#[cfg(test)]
mod tests;
