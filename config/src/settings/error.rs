use std::path::PathBuf;

/// Why the settings could not be loaded. Every message names where the bad value came from (the
/// settings file or an environment variable) and the field, e.g.
/// `settings.yaml: issuance.renewAt: must be between 0 and 1 (exclusive), got 1.5`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
    /// The settings file could not be read.
    #[error("{}: cannot read the settings file: {source}", path.display())]
    Read {
        /// The settings file.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// The settings file is not valid YAML.
    #[error("{}: YAML syntax error: {message}", path.display())]
    Syntax {
        /// The settings file.
        path: PathBuf,
        /// The parser's message, with the line and column.
        message: String,
    },
    /// A value is missing, malformed or out of range.
    #[error("{origin}: {}{message}", if field.is_empty() { String::new() } else { format!("{field}: ") })]
    Invalid {
        /// The settings file path, the environment variable, or `built-in defaults`.
        origin: String,
        /// The dotted camelCase path of the field, e.g. `issuance.renewAt`; empty for the whole file.
        field: String,
        /// What is wrong and what is expected.
        message: String,
    },
    /// Two environment variables set the same field (e.g. `MESHCA_DATADIR` and `MESHCA_DATA_DIR`).
    #[error("{first} and {second} both set {field}; set only one of them")]
    ConflictingEnv {
        /// The first variable, in name order.
        first: String,
        /// The second variable.
        second: String,
        /// The field both set.
        field: String,
    },
}

/// Something the settings' sources say that meshca ignores (an unknown `MESHCA_*` variable): the
/// daemon logs it, `meshca validate` lists it in its report. It never makes the settings invalid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsWarning {
    /// Where it was said: the variable's name, or the file.
    pub origin: String,
    /// What is ignored and why.
    pub message: String,
}

impl std::fmt::Display for SettingsWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.origin, self.message)
    }
}
