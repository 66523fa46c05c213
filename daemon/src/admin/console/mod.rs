//! The read-only web console on the admin listener: server-rendered pages of what `/api/status` says
//! (meshes, their CAs, the rollout now in progress, who it waits for), a small script that keeps the
//! page current through Server-Sent Events, and a stylesheet, all embedded in the binary.
//!
//! Every value from a resource or a proxy goes through maud's escaping; the pages carry a
//! Content-Security-Policy that allows scripts and styles from this listener only (no inline script
//! runs, whatever a value holds). Nothing here runs while no browser is connected: each event stream is
//! a task of its own, bounded in number.

mod overview;
mod proxies;
mod proxy;
mod rollouts;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures::Stream;
use maud::{html, Markup, DOCTYPE};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::AdminState;

/// What the console's pages may load: this listener's script and stylesheet, nothing inline, nothing
/// from elsewhere, and no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The most browsers following the console at once; one more gets 503.
pub(crate) const MAX_EVENT_STREAMS: usize = 16;

/// The least time between two updates sent to a browser: a burst of snapshots is one update.
const COALESCE: Duration = Duration::from_millis(250);

const SCRIPT: &str = include_str!("app.js");
const STYLE: &str = include_str!("app.css");

/// How long a rendered overview is served again to browsers asking for the same status: each update
/// makes every open page ask at once, and one rendering serves them all.
const OVERVIEW_REUSE: Duration = Duration::from_secs(1);

/// The console's shared state (one per admin listener): how many event streams are open, and the
/// last overview rendered.
#[derive(Clone, Debug)]
pub struct Console {
    streams: Arc<Semaphore>,
    overview: Arc<tokio::sync::Mutex<Option<Rendered>>>,
}

/// An overview rendered for a snapshot generation, status version and database view (its address:
/// each heartbeat that changes it publishes a new one).
#[derive(Debug)]
struct Rendered {
    of: (u64, u64, usize),
    at: Instant,
    html: Arc<str>,
}

impl Default for Console {
    fn default() -> Console {
        Console {
            streams: Arc::new(Semaphore::new(MAX_EVENT_STREAMS)),
            overview: Arc::default(),
        }
    }
}

impl Console {
    /// The overview of the status now: rendered once for every browser asking within
    /// [`OVERVIEW_REUSE`] while neither the snapshot, the status nor the database's view changed.
    async fn overview(&self, s: &AdminState) -> Arc<str> {
        let mut last = self.overview.lock().await;
        let database = s
            .database
            .as_ref()
            .map_or(0, |view| Arc::as_ptr(&view.borrow()) as usize);
        let of = (
            s.snapshots.borrow().generation,
            s.metrics.status_version(),
            database,
        );
        if let Some(rendered) = last.as_ref() {
            if rendered.of == of && rendered.at.elapsed() < OVERVIEW_REUSE {
                return rendered.html.clone();
            }
        }
        let html: Arc<str> = Arc::from(overview::build(s).await);
        *last = Some(Rendered {
            of,
            at: Instant::now(),
            html: html.clone(),
        });
        html
    }
}

/// The console's routes, merged into the admin router.
pub(crate) fn routes() -> Router<AdminState> {
    Router::new()
        .route("/", get(overview::page))
        .route("/console/overview", get(overview::fragment))
        .route("/proxies", get(proxies::page))
        .route("/proxies/{mesh}/{name}", get(proxy::page))
        .route("/rollouts", get(rollouts::page))
        .route("/favicon.ico", get(|| async { StatusCode::NO_CONTENT }))
        .route(
            "/console/app.js",
            get(|| async { asset(SCRIPT, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/console/app.css",
            get(|| async { asset(STYLE, "text/css; charset=utf-8") }),
        )
        .route("/console/events", get(events))
}

/// The address of a proxy's page, its name and mesh percent-encoded (a name is a path segment).
pub(crate) fn proxy_href(mesh: &str, name: &str) -> String {
    format!("/proxies/{}/{}", path_segment(mesh), path_segment(name))
}

/// `value` with every byte but unreserved ones (RFC 3986) percent-encoded.
fn path_segment(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A whole page: the layout around `body`, with the console's headers.
pub(crate) fn page(title: &str, body: Markup) -> Response {
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "meshca · " (title) }
                link rel="stylesheet" href="/console/app.css";
                script src="/console/app.js" defer {}
            }
            body {
                header {
                    a href="/" { "meshca" } " console"
                    nav {
                        a href="/" { "overview" } " "
                        a href="/proxies" { "proxies" } " "
                        a href="/rollouts" { "rollouts" }
                    }
                    span #live { "connecting…" }
                }
                main { (body) }
            }
        }
    };
    secured(markup.into_string(), "text/html; charset=utf-8")
}

/// A fragment the script swaps in place.
pub(crate) fn fragment(markup: Markup) -> Response {
    secured(markup.into_string(), "text/html; charset=utf-8")
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    secured(body.to_owned(), content_type)
}

/// `body` with the console's security headers.
fn secured(body: String, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// Server-Sent Events: `update` with the snapshot generation whenever the owner publishes a new
/// snapshot or the status changes without one (a rejected update, a rollout step), at most one per
/// [`COALESCE`]; the page then fetches what it shows again. While a rollout is in progress, also once
/// per [`ROLLOUT_TICK`]: ACKs move it on (fewer proxies waited for) without changing either.
async fn events(State(s): State<AdminState>) -> Response {
    let Ok(permit) = s.console.streams.clone().try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the console follows at most {MAX_EVENT_STREAMS} browsers at once\n"),
        )
            .into_response();
    };
    let followed = Followed {
        snapshots: s.snapshots.clone(),
        status: s.metrics.status_changes(),
        database: s.database.clone(),
        metrics: s.metrics.clone(),
        _permit: permit,
    };
    let mut response = Sse::new(updates(followed))
        .keep_alive(KeepAlive::default())
        .into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// How often a browser is sent an update while a rollout is in progress and nothing else changes.
const ROLLOUT_TICK: Duration = Duration::from_secs(1);

/// What one event stream follows. The permit lives as long as the stream: a browser that goes away
/// frees its place.
struct Followed {
    snapshots: tokio::sync::watch::Receiver<Arc<meshca_control::Snapshot>>,
    status: tokio::sync::watch::Receiver<u64>,
    /// The replicas' database, as the heartbeat hears it (`keystore.type: postgres` only).
    database: Option<tokio::sync::watch::Receiver<Arc<crate::replica::DatabaseView>>>,
    metrics: Arc<crate::metrics::Metrics>,
    _permit: OwnedSemaphorePermit,
}

fn updates(followed: Followed) -> impl Stream<Item = Result<Event, Infallible>> {
    futures::stream::unfold((followed, true), |(mut f, first)| async move {
        if !first {
            tokio::time::sleep(COALESCE).await;
            let in_progress = f.metrics.timeline().in_progress();
            let tick = async {
                match in_progress {
                    true => tokio::time::sleep(ROLLOUT_TICK).await,
                    false => std::future::pending().await,
                }
            };
            let database = async {
                match f.database.as_mut() {
                    Some(database) => database.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = f.snapshots.changed() => changed.ok()?,
                changed = f.status.changed() => changed.ok()?,
                // A heartbeat that stopped leaves the last view: followed no longer.
                alive = database => if !alive { f.database = None },
                () = tick => {}
            }
        }
        f.status.borrow_and_update();
        if let Some(database) = f.database.as_mut() {
            database.borrow_and_update();
        }
        let generation = f.snapshots.borrow_and_update().generation;
        let event = Event::default()
            .event("update")
            .data(generation.to_string());
        Some((Ok(event), (f, false)))
    })
}
