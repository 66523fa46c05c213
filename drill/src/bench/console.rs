//! Console clients for `meshca bench sds --console-clients N`: each follows the daemon's web console as
//! the page's script does, so that a run measures the rotation with browsers connected. A client opens
//! `GET /console/events` (Server-Sent Events) on the admin listener and, for every `update` event,
//! fetches `GET /console/overview` on a second connection and reads the whole fragment.
//!
//! A client whose event stream is refused (the console follows a bounded number of browsers) or ends
//! before the bench does is an error: the run would not have measured what it says.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

/// The console's event stream.
pub const EVENTS: &str = "/console/events";
/// The fragment the page fetches again on every update.
pub const OVERVIEW: &str = "/console/overview";

/// What a console client followed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Followed {
    /// `update` events received.
    pub updates: u64,
    /// Overview fragments fetched and read whole.
    pub fetches: u64,
    /// The snapshot generation of the last update whose fragment was fetched.
    pub generation: u64,
}

impl Followed {
    /// The updates and fetches of several clients, added up (with the highest generation).
    pub fn total(clients: &[Followed]) -> Followed {
        clients
            .iter()
            .fold(Followed::default(), |total, f| Followed {
                updates: total.updates + f.updates,
                fetches: total.fetches + f.fetches,
                generation: total.generation.max(f.generation),
            })
    }
}

/// Why a console client failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsoleError {
    /// No connection to the admin listener.
    #[error("console client {client}: cannot connect to the admin listener {addr}: {source}")]
    Connect {
        client: usize,
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// An HTTP exchange failed.
    #[error("console client {client}: GET {path} on {addr} failed: {source}")]
    Http {
        client: usize,
        addr: SocketAddr,
        path: &'static str,
        source: hyper::Error,
    },
    /// The console answered with an error status.
    #[error("console client {client}: GET {path} on {addr} was refused with {status}: {body}")]
    Refused {
        client: usize,
        addr: SocketAddr,
        path: &'static str,
        status: StatusCode,
        body: String,
    },
    /// An `update` event without a generation.
    #[error("console client {client}: an update event of {EVENTS} carries {data:?}, not a snapshot generation")]
    BadEvent { client: usize, data: String },
    /// The event stream ended while the bench ran.
    #[error("console client {client}: the event stream {EVENTS} ended before the bench did")]
    Ended { client: usize },
    /// The client's task failed.
    #[error("console client {client}: its task failed: {reason}")]
    Task { client: usize, reason: String },
    /// A client had not followed the daemon to its last snapshot in time.
    #[error("console client {client} saw generation {seen} within {timeout:?} after the bench, not {wanted} (the daemon's last)")]
    Behind {
        client: usize,
        seen: u64,
        wanted: u64,
        timeout: Duration,
    },
}

/// Console clients following one daemon; they stop when this is finished or dropped.
#[derive(Debug)]
pub struct ConsoleClients {
    clients: Vec<Client>,
    _stop: DropGuard,
}

#[derive(Debug)]
struct Client {
    progress: watch::Receiver<Followed>,
    task: JoinHandle<Result<(), ConsoleError>>,
}

impl ConsoleClients {
    /// Opens `count` event streams on the admin listener `addr`, each checked to be accepted before
    /// this returns, and follows them in tasks of their own.
    pub async fn start(addr: SocketAddr, count: usize) -> Result<ConsoleClients, ConsoleError> {
        let stop = CancellationToken::new();
        let mut clients = Vec::with_capacity(count);
        for client in 0..count {
            let events = get(
                client,
                addr,
                EVENTS,
                &mut connect(client, addr, EVENTS).await?,
            )
            .await?;
            let fetcher = connect(client, addr, OVERVIEW).await?;
            let (report, progress) = watch::channel(Followed::default());
            let follower = Follower {
                client,
                addr,
                fetcher,
                report,
            };
            let task = tokio::spawn(follower.follow(events, stop.clone()));
            clients.push(Client { progress, task });
        }
        Ok(ConsoleClients {
            clients,
            _stop: stop.drop_guard(),
        })
    }

    /// What client `index` has followed so far; it changes with every update and every fetch.
    pub fn progress(&self, index: usize) -> Option<watch::Receiver<Followed>> {
        self.clients.get(index).map(|c| c.progress.clone())
    }

    /// Waits (at most `timeout`) until every client has fetched the overview of snapshot `generation`
    /// or a later one, then stops them all: what each followed. An error when a client failed or ended
    /// before.
    pub async fn finish(
        mut self,
        generation: u64,
        timeout: Duration,
    ) -> Result<Vec<Followed>, ConsoleError> {
        let mut followed = Vec::with_capacity(self.clients.len());
        for (index, client) in self.clients.iter_mut().enumerate() {
            let caught_up = tokio::select! {
                reached = tokio::time::timeout(
                    timeout,
                    client.progress.wait_for(|f| f.generation >= generation),
                ) => reached.is_ok_and(|r| r.is_ok()),
                ended = &mut client.task => return Err(ended_early(index, ended)),
            };
            let seen = *client.progress.borrow();
            if !caught_up {
                return Err(ConsoleError::Behind {
                    client: index,
                    seen: seen.generation,
                    wanted: generation,
                    timeout,
                });
            }
            followed.push(seen);
        }
        drop(self._stop);
        for (index, client) in self.clients.into_iter().enumerate() {
            match client.task.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => return Err(error),
                Err(error) => {
                    return Err(ConsoleError::Task {
                        client: index,
                        reason: error.to_string(),
                    })
                }
            }
        }
        Ok(followed)
    }
}

/// The error of a client task that ended while it should still have been following.
fn ended_early(
    client: usize,
    ended: Result<Result<(), ConsoleError>, tokio::task::JoinError>,
) -> ConsoleError {
    match ended {
        Ok(Ok(())) => ConsoleError::Ended { client },
        Ok(Err(error)) => error,
        Err(error) => ConsoleError::Task {
            client,
            reason: error.to_string(),
        },
    }
}

/// An HTTP/1.1 connection to the admin listener for `path`, driven by a task that ends with it.
pub(super) async fn connect(
    client: usize,
    addr: SocketAddr,
    path: &'static str,
) -> Result<SendRequest<Empty<Bytes>>, ConsoleError> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|source| ConsoleError::Connect {
            client,
            addr,
            source,
        })?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|source| ConsoleError::Http {
            client,
            addr,
            path,
            source,
        })?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!("console client {client}: the connection ended: {error}");
        }
    });
    Ok(sender)
}

/// `GET path` on `sender`'s connection: the response when it is `200 OK`.
pub(super) async fn get(
    client: usize,
    addr: SocketAddr,
    path: &'static str,
    sender: &mut SendRequest<Empty<Bytes>>,
) -> Result<Response<Incoming>, ConsoleError> {
    let http = |source| ConsoleError::Http {
        client,
        addr,
        path,
        source,
    };
    sender.ready().await.map_err(http)?;
    let request = Request::get(path)
        .header(hyper::header::HOST, addr.to_string())
        .body(Empty::new())
        .expect("a GET of a fixed path with a socket address as host is a valid request");
    let response = sender.send_request(request).await.map_err(http)?;
    if response.status() == StatusCode::OK {
        return Ok(response);
    }
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).trim().to_owned())
        .unwrap_or_default();
    Err(ConsoleError::Refused {
        client,
        addr,
        path,
        status,
        body,
    })
}

/// One client after its event stream was accepted.
struct Follower {
    client: usize,
    addr: SocketAddr,
    fetcher: SendRequest<Empty<Bytes>>,
    report: watch::Sender<Followed>,
}

impl Follower {
    /// Reads events until `stop`; fetches the overview after each `update`.
    async fn follow(
        mut self,
        events: Response<Incoming>,
        stop: CancellationToken,
    ) -> Result<(), ConsoleError> {
        let (client, addr) = (self.client, self.addr);
        let mut body = events.into_body();
        let mut parser = EventParser::default();
        loop {
            let frame = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                frame = body.frame() => frame,
            };
            let frame = match frame {
                None => return Err(ConsoleError::Ended { client }),
                Some(frame) => frame.map_err(|source| ConsoleError::Http {
                    client,
                    addr,
                    path: EVENTS,
                    source,
                })?,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            for event in parser.push(&data) {
                if event.name != "update" {
                    continue;
                }
                let generation =
                    event
                        .data
                        .trim()
                        .parse::<u64>()
                        .map_err(|_| ConsoleError::BadEvent {
                            client,
                            data: event.data.clone(),
                        })?;
                self.report.send_modify(|f| f.updates += 1);
                let fetched = tokio::select! {
                    () = stop.cancelled() => return Ok(()),
                    fetched = self.fetch_overview() => fetched,
                };
                fetched?;
                self.report.send_modify(|f| {
                    f.fetches += 1;
                    f.generation = f.generation.max(generation);
                });
            }
        }
    }

    /// Fetches the overview fragment and reads it whole, on the kept-alive connection or, when the
    /// listener closed that one (it closes a connection idle for `limits.connectTimeout`, and updates
    /// can be further apart), on a new one, as a browser does.
    async fn fetch_overview(&mut self) -> Result<(), ConsoleError> {
        if !self.fetcher.is_closed() {
            match self.fetch_once().await {
                Err(ConsoleError::Http { .. }) => {
                    tracing::debug!(
                        "console client {}: the kept-alive connection failed; fetching on a new one",
                        self.client
                    );
                }
                done => return done,
            }
        }
        self.fetcher = connect(self.client, self.addr, OVERVIEW).await?;
        self.fetch_once().await
    }

    async fn fetch_once(&mut self) -> Result<(), ConsoleError> {
        let (client, addr) = (self.client, self.addr);
        let response = get(client, addr, OVERVIEW, &mut self.fetcher).await?;
        response
            .into_body()
            .collect()
            .await
            .map_err(|source| ConsoleError::Http {
                client,
                addr,
                path: OVERVIEW,
                source,
            })?;
        Ok(())
    }
}

/// One Server-Sent Event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Event {
    /// Its `event:` field (`message` when absent).
    name: String,
    /// Its `data:` lines, joined by newlines.
    data: String,
}

/// Splits a Server-Sent Events byte stream into events, whatever the chunks' boundaries: lines end with
/// LF, CRLF or CR; a blank line ends an event; comments (`:` first) are keep-alives.
#[derive(Debug, Default)]
struct EventParser {
    line: Vec<u8>,
    /// The last byte was a CR (a following LF belongs to it).
    after_cr: bool,
    name: Option<String>,
    data: Option<String>,
}

impl EventParser {
    /// Takes `bytes` in; returns the events they complete.
    fn push(&mut self, bytes: &[u8]) -> Vec<Event> {
        let mut events = Vec::new();
        for &byte in bytes {
            let after_cr = std::mem::replace(&mut self.after_cr, byte == b'\r');
            match byte {
                b'\n' if after_cr => {}
                b'\n' | b'\r' => {
                    let line = std::mem::take(&mut self.line);
                    if let Some(event) = self.line_done(&String::from_utf8_lossy(&line)) {
                        events.push(event);
                    }
                }
                _ => self.line.push(byte),
            }
        }
        events
    }

    fn line_done(&mut self, line: &str) -> Option<Event> {
        if line.is_empty() {
            let data = self.data.take();
            let name = self.name.take();
            // An event without data is not dispatched.
            return data.map(|data| Event {
                name: name.unwrap_or_else(|| "message".to_owned()),
                data,
            });
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => self.name = Some(value.to_owned()),
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::harness::{mesh_yaml, reload};
    use crate::sandbox::Sandbox;
    use meshca_daemon::{Daemon, DaemonOptions};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fetch_connection_closed_as_idle_is_opened_again() {
        let sandbox = Sandbox::new().expect("a sandbox");
        sandbox
            .write_resource("mesh.yaml", &mesh_yaml(false))
            .expect("writable");
        let mut settings = sandbox.settings();
        let idle = Duration::from_millis(300);
        settings.limits.connect_timeout = idle.into();
        let options = DaemonOptions {
            gate: true,
            watch_files: false,
        };
        let daemon = Daemon::start(settings, options)
            .await
            .expect("the daemon starts");
        let clients = ConsoleClients::start(daemon.admin_addr, 1)
            .await
            .expect("the console follows");
        let mut progress = clients.progress(0).expect("client 0");
        progress
            .wait_for(|f| f.fetches >= 1)
            .await
            .expect("the first update is fetched");
        // Not waiting for an event: letting the fetch connection sit idle past limits.connectTimeout,
        // after which the listener closes it.
        tokio::time::sleep(idle * 4).await;
        sandbox
            .write_resource("mesh.yaml", &mesh_yaml(true))
            .expect("writable");
        reload(&daemon, "the switch to ca-2")
            .await
            .expect("the switch applies");
        let followed = clients
            .finish(daemon.generation(), Duration::from_secs(10))
            .await
            .expect("the client fetched the new overview on a new connection");
        assert!(followed[0].fetches >= 2, "{followed:?}");
        daemon.stop().await;
    }

    fn update(generation: &str) -> Event {
        Event {
            name: "update".to_owned(),
            data: generation.to_owned(),
        }
    }

    #[test]
    fn events_are_found_whatever_the_chunks() {
        let stream =
            b"event: update\ndata: 7\n\n:\n\nevent: update\r\ndata:8\r\n\r\ndata: a\ndata: b\n\n";
        let expected = vec![
            update("7"),
            update("8"),
            Event {
                name: "message".to_owned(),
                data: "a\nb".to_owned(),
            },
        ];
        for size in 1..=stream.len() {
            let mut parser = EventParser::default();
            let events: Vec<Event> = stream.chunks(size).flat_map(|c| parser.push(c)).collect();
            assert_eq!(events, expected, "in chunks of {size} bytes");
        }
    }

    #[test]
    fn an_unfinished_event_waits_for_its_blank_line() {
        let mut parser = EventParser::default();
        assert!(parser.push(b"event: update\ndata: 3\n").is_empty());
        assert_eq!(parser.push(b"\n"), vec![update("3")]);
        // An event with no data (or only a comment) is not dispatched.
        assert!(parser.push(b"event: update\n\n: keep-alive\n\n").is_empty());
    }
}
