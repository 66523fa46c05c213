//! The bearer token on a request's headers, as every protocol on the hub checks it.

use std::time::{SystemTime, UNIX_EPOCH};

use meshca_auth::{Claims, RevocationList, Verifier};
use tonic::Status;

/// Checks the `authorization: Bearer <token>` header: a token this server's key signed, not expired
/// (with the verifier's clock-skew leeway) and not revoked, of any type. Any failure is
/// `UNAUTHENTICATED`.
pub(crate) fn verify_bearer(
    headers: &http::HeaderMap,
    verifier: &Verifier,
    revoked: &RevocationList,
    now: SystemTime,
) -> Result<Claims, Status> {
    let header = headers.get("authorization").ok_or_else(|| {
        Status::unauthenticated(
            "missing `authorization: Bearer <token>` metadata: configure the proxy's SDS \
             initial_metadata with a token from `meshca token`",
        )
    })?;
    let value = header
        .to_str()
        .map_err(|_| Status::unauthenticated("the authorization metadata is not ASCII"))?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .map(str::trim)
        .filter(|token| !token.is_empty())
        .ok_or_else(|| {
            Status::unauthenticated("the authorization metadata must be `Bearer <token>`")
        })?;
    let now_unix = now
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs())
        .unwrap_or(0);
    verifier
        .verify_with(token, now_unix, revoked)
        .map_err(|error| Status::unauthenticated(format!("token refused: {error}")))
}
