//! Errors of the SDS client.

/// An SDS client call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The channel to the server could not be opened.
    #[error(transparent)]
    Channel(#[from] meshca_serve::ConnectError),
    /// The token cannot be sent as a header.
    #[error("the token is not a valid header value (it must be printable ASCII)")]
    InvalidToken,
    /// The server answered with a gRPC error.
    #[error("SDS server refused the request ({code:?}): {message}")]
    Status {
        /// The gRPC status code.
        code: tonic::Code,
        /// The server's message.
        message: String,
    },
    /// The server sent something that is not a secret.
    #[error("SDS server sent an invalid response: {reason}")]
    InvalidResponse {
        /// What is wrong.
        reason: String,
    },
}

impl From<tonic::Status> for ClientError {
    fn from(status: tonic::Status) -> Self {
        ClientError::Status {
            code: status.code(),
            message: status.message().to_owned(),
        }
    }
}
