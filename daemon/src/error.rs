//! The errors of the daemon library: whether the operator must fix their input, or something else
//! failed, each with the chain of what was being done.
//!
//! Inside the library each part has an error type of its own (a `StoreError`, a `StartError`, ...),
//! whose message says what failed and whose `source()` says why. At the library's surface each
//! becomes an [`Error`], of the kind its type says: the `From` impls below are the one place that
//! decides which errors are input the operator must fix.

use std::error::Error as StdError;

use meshca_serve::ServeError;

/// Why the daemon, or a command run beside it, could not do what was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Settings, resources or arguments the operator must fix; nothing was started. `meshca` exits
    /// with code 2 on it.
    #[error(transparent)]
    InvalidInput(Cause),
    /// Anything else: the system, the store, a listener, a task of the daemon.
    #[error(transparent)]
    Failed(Cause),
}

/// What went wrong; its sources say what was being done, outermost first.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct Cause(Box<dyn StdError + Send + Sync + 'static>);

impl Error {
    /// Input the operator must fix, described by `message`.
    pub fn invalid_input(message: impl Into<String>) -> Error {
        Error::input(InvalidInput(message.into()))
    }

    /// Whether the operator must fix their input (settings, resources, arguments).
    pub fn is_invalid_input(&self) -> bool {
        matches!(self, Error::InvalidInput(_))
    }

    /// `error`, which the operator must fix.
    pub(crate) fn input(error: impl StdError + Send + Sync + 'static) -> Error {
        Error::InvalidInput(Cause(Box::new(error)))
    }

    /// `error`, which is not the operator's input.
    pub(crate) fn failed(error: impl StdError + Send + Sync + 'static) -> Error {
        Error::Failed(Cause(Box::new(error)))
    }
}

/// Input the operator must fix, said in a message of the caller's ([`Error::invalid_input`]).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct InvalidInput(String);

impl From<TaskError> for Error {
    fn from(error: TaskError) -> Error {
        Error::failed(error)
    }
}

/// Why a task of the running daemon ended; the daemon cannot go on without it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TaskError {
    /// A task returned, which none does before shutdown.
    #[error("a daemon task ended unexpectedly")]
    Ended,
    /// A task panicked.
    #[error("a daemon task panicked: {0}")]
    Panicked(tokio::task::JoinError),
    /// The SDS server (and the agent protocol beside it) failed.
    #[error("SDS server failed: {0}")]
    Sds(ServeError),
    /// The Workload API server failed.
    #[error("Workload API server failed: {0}")]
    WorkloadApi(ServeError),
    /// The admin API server failed.
    #[error("admin API failed: {0}")]
    Admin(std::io::Error),
}

/// The result of the library's fallible functions.
pub type Result<T, E = Error> = std::result::Result<T, E>;
