//! The admin API's and console's `Host` check against DNS rebinding (see
//! [`meshca_serve::allowed_hosts`]), with `admin.allowedHosts`.

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
pub use meshca_serve::allowed_hosts::AllowedHosts;

/// Refuses a request naming a host the listener does not answer to, with 421.
pub async fn check(State(hosts): State<AllowedHosts>, request: Request, next: Next) -> Response {
    let refused = meshca_serve::allowed_hosts::refusal(
        &hosts,
        request.headers(),
        request.uri(),
        ", or add the name to admin.allowedHosts",
    );
    match refused {
        None => next.run(request).await,
        Some(body) => (StatusCode::MISDIRECTED_REQUEST, body).into_response(),
    }
}
