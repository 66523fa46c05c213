//! The hand-written transport under the SDS service, fenced off from the protocol logic above it.
//!
//! meshca serves SDS through tonic and h2, but three pieces between the connection and the service are
//! its own (the connection itself, with its deadlines and the unix socket's `:authority` rewriter, is
//! `meshca-serve`'s), each there because upstream lacks something; each module's documentation names the upstream
//! change that would let it go. Where a piece handles bytes, its logic is a sans-IO core (pure
//! functions and state machines over byte slices: no tokio, no `async`, no socket), kept in a file
//! apart from the shell that moves bytes between the core and tokio or http-body. Tests and the fuzz
//! targets (`sds/fuzz/`, through `sds/src/fuzzing.rs`) drive the cores directly.
//!
//! | piece | core | shell | would go with |
//! |---|---|---|---|
//! | [`grpc`]: gRPC framing of requests and responses | `grpc/framing.rs` | `grpc.rs` (request body, response `Body`) | per-message buffers in tonic (no issue found) |
//! | [`wire`]: the request trimmer and the request types | all of `wire.rs` | none: `grpc.rs` feeds it | a decoder fed as frames arrive (no issue found) |
//! | [`outbox`]: a response stream written as one function | none: no bytes | all of `outbox.rs` | async generators |

pub(crate) mod grpc;
pub(crate) mod outbox;
pub(crate) mod wire;
