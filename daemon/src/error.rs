//! The errors of the daemon library: whether the operator must fix their input, or something else
//! failed, each with the chain of what was being done.

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
pub struct Cause(Box<dyn std::error::Error + Send + Sync + 'static>);

impl Error {
    /// Input the operator must fix, described by `message`.
    pub fn invalid_input(message: impl Into<String>) -> Error {
        Error::InvalidInput(Cause(Box::new(InvalidInput(message.into()))))
    }

    /// Whether the operator must fix their input (settings, resources, arguments).
    pub fn is_invalid_input(&self) -> bool {
        matches!(self, Error::InvalidInput(_))
    }

    /// The library's error for an error of its internals: [`Error::InvalidInput`] when an
    /// [`InvalidInput`] is at its root or among its contexts.
    pub(crate) fn from_internal(error: anyhow::Error) -> Error {
        let invalid = error.downcast_ref::<InvalidInput>().is_some();
        let cause = Cause(error.into());
        if invalid {
            Error::InvalidInput(cause)
        } else {
            Error::Failed(cause)
        }
    }
}

/// Inside the library: input the operator must fix, carried through `anyhow` chains until
/// [`Error::from_internal`] sorts it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct InvalidInput(pub String);

/// The result of the library's fallible functions.
pub type Result<T, E = Error> = std::result::Result<T, E>;
