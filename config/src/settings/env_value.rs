//! How a setting's value is read from the text of its environment variable (or a command-line
//! override): each value type's reader and its errors. The settings table (`super::file`) names a reader
//! per row; `super::env` finds the row for a variable.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::limits::LimitError;
use super::{KeystoreType, ListenAddr, ServerAddr};
use crate::Duration;
use meshca_identity::KeyAlgorithm;

/// Why an environment variable's text is not a value of its field; the caller names the variable
/// and the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(super) enum EnvValueError {
    /// The variable is set to the empty string.
    #[error("must not be empty; unset the variable to use the default")]
    Empty,
    /// The field's own parser refused the text (a listen address, a duration, a key algorithm).
    #[error("{0}")]
    Parse(String),
    /// A switch that is not `true`, `false`, `1` or `0`.
    #[error("expected true or false, got {0:?}")]
    NotBool(String),
    /// A number was expected.
    #[error("expected a number, got {0:?}")]
    NotNumber(String),
    /// A whole number was expected.
    #[error("expected a whole number, got {0:?}")]
    NotWholeNumber(String),
    /// A limit's value.
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// The path is no setting's (never the case: variables and overrides are looked up among the
    /// settings' paths).
    #[error("not a settings field")]
    NotASetting,
}

/// How a setting of this type is read from its environment variable's (non-empty) text.
pub(super) trait FromEnv: Sized {
    /// The value `text` stands for, or what is wrong with it.
    fn from_env(text: &str) -> Result<Self, EnvValueError>;
}

/// Types read by their own parser, whose error is the message.
macro_rules! from_env_by_parsing {
    ($($ty:ty),* $(,)?) => {$(
        impl FromEnv for $ty {
            fn from_env(text: &str) -> Result<Self, EnvValueError> {
                text.parse::<$ty>().map_err(|e| EnvValueError::Parse(e.to_string()))
            }
        }
    )*};
}

from_env_by_parsing!(
    String,
    PathBuf,
    SocketAddr,
    ListenAddr,
    ServerAddr,
    Duration,
    KeyAlgorithm,
    KeystoreType
);

/// `true`, `false`, `1` or `0`, in any case.
impl FromEnv for bool {
    fn from_env(text: &str) -> Result<Self, EnvValueError> {
        match text.to_ascii_lowercase().as_str() {
            "true" | "1" => Ok(true),
            "false" | "0" => Ok(false),
            _ => Err(EnvValueError::NotBool(text.to_owned())),
        }
    }
}

impl FromEnv for f64 {
    fn from_env(text: &str) -> Result<Self, EnvValueError> {
        text.parse()
            .map_err(|_| EnvValueError::NotNumber(text.to_owned()))
    }
}

impl FromEnv for usize {
    fn from_env(text: &str) -> Result<Self, EnvValueError> {
        text.parse()
            .map_err(|_| EnvValueError::NotWholeNumber(text.to_owned()))
    }
}

/// A comma-separated list (see [`parse_list`]).
impl<T: FromEnv> FromEnv for Vec<T> {
    fn from_env(text: &str) -> Result<Self, EnvValueError> {
        parse_list(text)
    }
}

/// `text`, unless it is empty.
pub(super) fn non_empty(text: &str) -> Result<&str, EnvValueError> {
    if text.is_empty() {
        Err(EnvValueError::Empty)
    } else {
        Ok(text)
    }
}

/// How a setting is read unless its row names another reader: the text must not be empty.
pub(super) fn read<T: FromEnv>(text: &str) -> Result<T, EnvValueError> {
    T::from_env(non_empty(text)?)
}

/// A comma-separated list; blanks around items, and empty items, are dropped (so empty text is an
/// empty list).
pub(super) fn parse_list<T: FromEnv>(text: &str) -> Result<Vec<T>, EnvValueError> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(T::from_env)
        .collect()
}
