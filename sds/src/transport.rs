//! The hand-written transport under the SDS service, fenced off from the protocol logic above it.
//!
//! meshca serves SDS through tonic and h2, but five pieces between the socket and the service are its
//! own, each there because upstream lacks something; each module's documentation names the upstream
//! change that would let it go. Where a piece handles bytes, its logic is a sans-IO core (pure
//! functions and state machines over byte slices: no tokio, no `async`, no socket), kept in a file
//! apart from the shell that moves bytes between the core and tokio or http-body. Tests and the fuzz
//! targets (`sds/fuzz/`, through `sds/src/fuzzing.rs`) drive the cores directly.
//!
//! | piece | core | shell | would go with |
//! |---|---|---|---|
//! | [`h2_header_fixup`]: the unix socket's `:authority` rewriter | `h2_header_fixup/frames.rs`, `h2_header_fixup/hpack.rs` | `h2_header_fixup.rs` (`AsyncRead`) | hyperium/h2#487 |
//! | [`grpc`]: gRPC framing of requests and responses | `grpc/framing.rs` | `grpc.rs` (request body, response `Body`) | per-message buffers in tonic (no issue found) |
//! | [`wire`]: the request trimmer and the request types | all of `wire.rs` | none: `grpc.rs` feeds it | a decoder fed as frames arrive (no issue found) |
//! | [`outbox`]: a response stream written as one function | none: no bytes | all of `outbox.rs` | async generators |
//! | [`conn`]: one accepted connection and its deadlines | none: no bytes | all of `conn.rs` | hyperium/hyper#1628 |

pub(crate) mod conn;
pub(crate) mod grpc;
pub(crate) mod h2_header_fixup;
pub(crate) mod outbox;
pub(crate) mod wire;
