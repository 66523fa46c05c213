//! One Workload API stream (`FetchX509SVID` or `FetchX509Bundles`): the whole current state at once,
//! then again on every change, for as long as the caller keeps the stream.
//!
//! A stream speaks to the owner for every registration its caller matches, as an SDS stream of that
//! registration's Dataplane would: it reports itself connected and subscribed, and each message it
//! hands to the transport counts as ACKed once the workload has had the time to put it in use
//! ([`WorkloadOptions::ack_after`]): a Workload API client sends nothing back, neither an ACK nor a
//! refusal. So the rollout gate waits for Workload API streams as for Envoy's: a workload holds a new
//! CA in its bundle before any peer presents a certificate from it, and an old CA leaves its bundle
//! only once its peers present their replacements.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::SystemTime;

use futures::future::select_all;
use futures::stream::{self, BoxStream, StreamExt};
use meshca_auth::Claims;
use meshca_control::{parse_names, Registration, Snapshot};
use meshca_serve::frames::Encoded;
use meshca_serve::ledger::{Acked, Ledger};
use meshca_serve::{HubStream, OpenStream, SnapshotWaiter};
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::Status;

use crate::callers::Listed;
use crate::messages::MessageCache;
#[cfg(doc)]
use crate::options::WorkloadOptions;
use crate::shared::{Admitted, CallerSlot, Shared};
use crate::x509::{self, Built, Fingerprint};

/// What a stream sends: its message type, how to build it, and what it subscribes to.
pub(crate) trait View: Send + 'static {
    type Message: prost::Message + Send + 'static;
    /// The method, for logs.
    const METHOD: &'static str;
    /// The resources its content carries, as SDS names them.
    const RESOURCES: &'static [&'static str];
    fn build(
        snapshot: &Snapshot,
        registrations: &[Arc<Registration>],
    ) -> (Built<Self::Message>, Fingerprint);
    /// The fingerprint [`View::build`] would return with a message, without building one; `None`
    /// when it would return none.
    fn fingerprint(snapshot: &Snapshot, registrations: &[Arc<Registration>])
        -> Option<Fingerprint>;
    /// Where the server keeps the messages it encoded.
    fn messages(shared: &Shared) -> &MessageCache<Self::Message>;
    /// Zeroizes what in `message` must not outlive it (its encoding is what is sent).
    fn forget(message: &mut Self::Message);
}

/// `FetchX509SVID`: SVIDs, their trust domains' bundles and the federated ones.
pub(crate) struct Svids;

impl View for Svids {
    type Message = crate::proto::X509SvidResponse;
    const METHOD: &'static str = "FetchX509SVID";
    const RESOURCES: &'static [&'static str] = &["default", "system_trust_bundle", "ALL"];
    fn build(
        snapshot: &Snapshot,
        registrations: &[Arc<Registration>],
    ) -> (Built<Self::Message>, Fingerprint) {
        x509::svids(snapshot, registrations)
    }
    fn fingerprint(
        snapshot: &Snapshot,
        registrations: &[Arc<Registration>],
    ) -> Option<Fingerprint> {
        x509::svids_fingerprint(snapshot, registrations)
    }
    fn messages(shared: &Shared) -> &MessageCache<Self::Message> {
        &shared.svid_messages
    }
    fn forget(message: &mut Self::Message) {
        x509::forget_keys(message);
    }
}

/// `FetchX509Bundles`: every trust domain's bundle.
pub(crate) struct Bundles;

impl View for Bundles {
    type Message = crate::proto::X509BundlesResponse;
    const METHOD: &'static str = "FetchX509Bundles";
    const RESOURCES: &'static [&'static str] = &["system_trust_bundle", "ALL"];
    fn build(
        snapshot: &Snapshot,
        registrations: &[Arc<Registration>],
    ) -> (Built<Self::Message>, Fingerprint) {
        x509::bundles(snapshot, registrations)
    }
    fn fingerprint(
        snapshot: &Snapshot,
        registrations: &[Arc<Registration>],
    ) -> Option<Fingerprint> {
        Some(x509::bundles_fingerprint(snapshot, registrations))
    }
    fn messages(shared: &Shared) -> &MessageCache<Self::Message> {
        &shared.bundle_messages
    }
    /// Bundles are public.
    fn forget(_: &mut Self::Message) {}
}

/// A message the caller was sent (its version in the ledger), counted as ACKed once `due`.
#[derive(Debug, Clone, Copy)]
struct PendingAck {
    version: u64,
    due: Instant,
}

/// What ended a wait.
enum Woken {
    /// A snapshot may concern the stream.
    Snapshot,
    /// The oldest pending ACK is due.
    AckDue,
}

/// A registration this stream speaks for, as the owner knows the stream.
struct Link {
    registration: Arc<Registration>,
    /// The stream of the registration's Dataplane, as the owner knows it.
    stream: HubStream,
    waiter: SnapshotWaiter,
}

/// An attested caller's stream.
pub(crate) struct Follow<V: View> {
    shared: Arc<Shared>,
    /// The caller's selectors, which registrations are matched against whenever they change.
    selectors: Arc<crate::attest::Selectors>,
    /// Who the caller is, for logs.
    caller: String,
    /// Whether the binary's digest was left out when the caller was admitted (no registration could
    /// use it then).
    digest_skipped: bool,
    links: Vec<Link>,
    /// The registrations `links` were matched from: matched again only when they change, since a
    /// caller's selectors never do (with 1,000 registrations, 10,000 streams matching each snapshot
    /// anew took most of an agent's setup).
    matched_from: Option<Arc<meshca_control::Registrations>>,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    /// What the last message was built from.
    sent: Option<Fingerprint>,
    /// The messages sent and what they stand for, for the owner.
    ledger: Ledger,
    /// Messages sent whose ACK is not due yet, oldest first (see [`WorkloadOptions::ack_after`]).
    acks: VecDeque<PendingAck>,
    done: bool,
    opened_at: Instant,
    /// Its line in the list of open streams.
    listed: Listed,
    _slot: CallerSlot,
    _open: Option<OpenStream>,
    _view: std::marker::PhantomData<fn() -> V>,
}

impl<V: View> Follow<V> {
    pub(crate) fn new(shared: Arc<Shared>, admitted: Admitted) -> Self {
        Follow {
            snapshots: shared.hub.snapshots(),
            listed: shared.callers.open(admitted.ids, V::METHOD),
            shared,
            selectors: admitted.selectors,
            caller: admitted.caller,
            digest_skipped: admitted.digest_skipped,
            links: Vec::new(),
            matched_from: None,
            sent: None,
            ledger: Ledger::default(),
            acks: VecDeque::new(),
            done: false,
            opened_at: Instant::now(),
            _slot: admitted.slot,
            _open: admitted.open,
            _view: std::marker::PhantomData,
        }
    }

    /// The stream of messages, ending with the status that ended it (if not the caller).
    pub(crate) fn into_stream(self) -> BoxStream<'static, Result<Encoded<V::Message>, Status>> {
        stream::unfold(self, |mut follow| async move {
            let item = follow.next().await?;
            Some((item, follow))
        })
        .boxed()
    }

    async fn next(&mut self) -> Option<Result<Encoded<V::Message>, Status>> {
        if self.done {
            return None;
        }
        let item = self.serve().await;
        if item.is_err() {
            self.done = true;
        }
        Some(item)
    }

    /// Waits until there is something new to send, or a reason to end the stream.
    async fn serve(&mut self) -> Result<Encoded<V::Message>, Status> {
        loop {
            let snapshot = self.snapshots.borrow_and_update().clone();
            if self.relink(&snapshot).await? {
                // New waiters: a publish before they existed would go unheard, so look again.
                continue;
            }
            let registrations: Vec<Arc<Registration>> =
                self.links.iter().map(|l| l.registration.clone()).collect();
            // A wake for a change that leaves this stream's content as it was sent (a registration
            // added elsewhere, a new revocation list) is told from the fingerprint alone: building the
            // message (its key decoded, its bundles copied) only to find it unchanged cost every
            // stream of the fleet a build per such change.
            let fingerprint = V::fingerprint(&snapshot, &registrations);
            let unchanged = self.sent.is_some() && fingerprint.as_ref() == self.sent.as_ref();
            if unchanged {
                self.unchanged(snapshot.generation).await;
            } else {
                let messages = V::messages(&self.shared);
                let (built, fingerprint) =
                    message::<V>(messages, &snapshot, &registrations, fingerprint);
                match built {
                    Built::Ready(message) => {
                        if self.sent.as_ref() != Some(&fingerprint) {
                            self.sent = Some(fingerprint);
                            let streams = self.links.iter().map(|l| l.stream.id()).collect();
                            let version = self.ledger.send(snapshot.generation, streams);
                            tracing::debug!(caller = %self.caller, stream = ?self.links.first().map(|l| l.stream.id()), generation = snapshot.generation, "Workload API message sent");
                            self.acks.push_back(PendingAck {
                                version,
                                due: Instant::now() + self.shared.options.ack_after,
                            });
                            return Ok(message);
                        }
                        self.unchanged(snapshot.generation).await;
                    }
                    Built::Waiting => {}
                    Built::Nothing(reason) => {
                        tracing::info!(caller = %self.caller, method = V::METHOD, "Workload API stream ended: no identity to serve: {reason}");
                        return Err(Status::permission_denied(format!(
                            "no identity issued: {reason}"
                        )));
                    }
                    Built::TooLarge(reason) => {
                        tracing::warn!(caller = %self.caller, method = V::METHOD, "Workload API response refused: {reason}");
                        return Err(Status::resource_exhausted(reason));
                    }
                }
            }
            while let Woken::AckDue = self.wait().await? {
                if let Some(ack) = self.acks.pop_front() {
                    // Superseded (`None`) when a newer message's ACK came first; never unknown.
                    if let Ok(Some(acked)) = self.ledger.ack(ack.version) {
                        self.report(acked).await;
                    }
                }
            }
        }
    }

    /// The caller holds the content of `generation` already: that content now stands for this
    /// generation too, as soon as it has had the time to apply it (at once if it had).
    async fn unchanged(&mut self, generation: u64) {
        if let Some(acked) = self.ledger.unchanged(generation) {
            self.report(acked).await;
        }
    }

    /// Waits for a snapshot that may concern one of the stream's registrations, or for the oldest
    /// pending ACK to fall due; before the first message, no longer than the identity wait.
    async fn wait(&mut self) -> Result<Woken, Status> {
        let waits = self.links.iter_mut().map(|l| Box::pin(l.waiter.changed()));
        let changed = select_all(waits);
        let identity_deadline =
            (self.sent.is_none()).then(|| self.opened_at + self.shared.options.identity_wait);
        let ack_due = self.acks.front().map(|a| a.due);
        let open = tokio::select! {
            (open, _, _) = changed => open,
            () = sleep_until_some(ack_due) => return Ok(Woken::AckDue),
            () = sleep_until_some(identity_deadline) => {
                return Err(Status::unavailable(format!(
                    "the identity is not ready after {:?}: the daemon has not prepared it yet",
                    self.shared.options.identity_wait
                )))
            }
        };
        if open {
            Ok(Woken::Snapshot)
        } else {
            Err(Status::unavailable("the server is shutting down"))
        }
    }

    /// Matches the caller against `snapshot`'s registrations, and tells the owner which it now speaks
    /// for. Whether it added any; `PERMISSION_DENIED` when none is left.
    async fn relink(&mut self, snapshot: &Snapshot) -> Result<bool, Status> {
        let matched_from = &snapshot.registrations;
        if self
            .matched_from
            .as_ref()
            .is_some_and(|r| Arc::ptr_eq(r, matched_from))
        {
            return Ok(false);
        }
        let selectors = &self.selectors;
        let agent = self.shared.options.agent.as_deref();
        if self.digest_skipped
            && snapshot.registrations.could_be_decided_by(
                agent,
                meshca_config::SelectorKind::Sha256,
                |s| selectors.contains(s),
            )
        {
            // Its digest was not computed, no registration wanting it when it was admitted: a
            // registration that names one now is matched on a new stream.
            return Err(Status::unavailable(
                "a registration now names the caller's binary digest: open the stream again to be \
                 attested for it",
            ));
        }
        let matched = snapshot
            .registrations
            .matching(agent, |s| selectors.contains(s));
        if matched.is_empty() {
            tracing::info!(caller = %self.caller, method = V::METHOD, "Workload API stream ended: the caller matches no registration any more");
            return Err(Status::permission_denied(
                "no identity issued: the caller matches no WorkloadRegistration any more",
            ));
        }
        self.matched_from = Some(matched_from.clone());
        let same = matched.len() == self.links.len()
            && matched
                .iter()
                .zip(&self.links)
                .all(|(m, l)| Arc::ptr_eq(m, &l.registration) || **m == *l.registration);
        if same {
            return Ok(false);
        }
        let mut kept = Vec::with_capacity(matched.len());
        let mut added = false;
        for link in std::mem::take(&mut self.links) {
            if matched.iter().any(|m| **m == *link.registration) {
                kept.push(link);
            } else {
                link.stream.close().await;
            }
        }
        for registration in matched {
            if let Some(link) = kept.iter().position(|l| *l.registration == *registration) {
                let link = kept.swap_remove(link);
                self.links.push(link);
                continue;
            }
            let link = self.connect(registration).await?;
            self.links.push(link);
            added = true;
        }
        // Content follows the registrations' order: the first is the default identity.
        self.links.sort_by(|a, b| {
            (&a.registration.name, &a.registration.proxy.mesh)
                .cmp(&(&b.registration.name, &b.registration.proxy.mesh))
        });
        let registrations: Vec<Arc<Registration>> =
            self.links.iter().map(|l| l.registration.clone()).collect();
        self.listed.serves(&registrations);
        // The caller has not seen content for the new set: send it even if it looks the same. What was
        // sent before did not carry the new registrations' trust, so its pending ACKs cannot speak for
        // them: they are dropped, and the next message's ACK speaks for every registration.
        self.acks.clear();
        self.ledger = Ledger::default();
        self.sent = self.sent.take().map(|_| Fingerprint::default());
        Ok(added)
    }

    /// Tells the owner a stream of `registration`'s Dataplane is open and what it subscribes to.
    async fn connect(&self, registration: Arc<Registration>) -> Result<Link, Status> {
        let (stream, waiter) = connect(&self.shared, &registration).await?;
        stream
            .subscribe(parse_names(
                V::RESOURCES.iter().map(|s| (*s).to_owned()).collect(),
            ))
            .await;
        Ok(Link {
            registration,
            stream,
            waiter,
        })
    }

    /// Reports `acked` for those of its registrations' streams the message spoke for and the stream
    /// still does.
    async fn report(&self, acked: Acked) {
        tracing::debug!(caller = %self.caller, stream = ?self.links.first().map(|l| l.stream.id()), generation = acked.generation, "Workload API message counts as applied");
        let open: Vec<&HubStream> = self.links.iter().map(|l| &l.stream).collect();
        acked.report(&open).await;
    }
}

/// The message for `registrations` in `snapshot`, whose content is `fingerprint` (`None`: none to
/// send): the one encoded for a stream of the same registrations, or built and encoded now and kept in
/// `messages` for the next.
fn message<V: View>(
    messages: &MessageCache<V::Message>,
    snapshot: &Snapshot,
    registrations: &[Arc<Registration>],
    fingerprint: Option<Fingerprint>,
) -> (Built<Encoded<V::Message>>, Fingerprint) {
    if let Some(fingerprint) = fingerprint {
        if let Some(message) = messages.get(&snapshot.registrations, registrations, &fingerprint) {
            return (Built::Ready(message), fingerprint);
        }
    }
    let (built, fingerprint) = V::build(snapshot, registrations);
    let mut message = match built {
        Built::Ready(message) => message,
        Built::Waiting => return (Built::Waiting, fingerprint),
        Built::Nothing(reason) => return (Built::Nothing(reason), fingerprint),
        Built::TooLarge(reason) => return (Built::TooLarge(reason), fingerprint),
    };
    let encoded = Encoded::new(&message);
    V::forget(&mut message);
    match encoded {
        Ok(encoded) => {
            let table = &snapshot.registrations;
            messages.insert(table, registrations, fingerprint.clone(), encoded.clone());
            (Built::Ready(encoded), fingerprint)
        }
        Err(status) => (Built::TooLarge(status.message().to_owned()), fingerprint),
    }
}

/// Tells the owner a stream of `registration`'s Dataplane is open (the owner issues identities to
/// connected proxies only): its handle, and a wait for the snapshots that concern it (subscribed first,
/// so that none published after this returns goes unheard). Dropping the handle reports its end.
pub(crate) async fn connect(
    shared: &Shared,
    registration: &Registration,
) -> Result<(HubStream, SnapshotWaiter), Status> {
    let claims = claims_for(registration)?;
    // A changed registration table may give the caller other identities: its streams look at it.
    let waiter = shared.hub.registrations_waiter(&registration.proxy);
    let stream = shared.hub.connect(Arc::new(claims)).await;
    Ok((stream, waiter))
}

/// What a caller is served as for `registration`: its Dataplane, with the Dataplane's labels. The claims
/// are no token anyone holds; only the life of the stream that presents them bounds them.
pub(crate) fn claims_for(registration: &Registration) -> Result<Claims, Status> {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    registration.dataplane_claims(now).map_err(|error| {
        tracing::warn!(registration = %registration.name, %error, "a WorkloadRegistration's Dataplane cannot be served");
        Status::internal(format!(
            "registration {} cannot be served: {error}",
            registration.name
        ))
    })
}

/// Sleeps until `deadline`, or forever without one.
pub(crate) async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use meshca_serve::frames::FRAME_HEADER;
    use prost::Message;

    use super::*;
    use crate::proto::X509SvidResponse;
    use crate::x509::tests::{ready, registration, snapshot_with};

    fn ready_message(built: Built<Encoded<X509SvidResponse>>) -> Encoded<X509SvidResponse> {
        match built {
            Built::Ready(message) => message,
            other => panic!("not ready: {other:?}"),
        }
    }

    #[test]
    fn streams_of_the_same_registrations_send_one_frame_until_the_content_changes() {
        let cache = MessageCache::default();
        let snapshot = snapshot_with(vec![("web", ready("web"))]);
        let registrations = [registration("web")];
        let send = |snapshot: &Snapshot| {
            let fingerprint = Svids::fingerprint(snapshot, &registrations);
            ready_message(message::<Svids>(&cache, snapshot, &registrations, fingerprint).0)
        };
        let first = send(&snapshot);
        let second = send(&snapshot);
        assert_eq!(
            first.frame().as_ptr(),
            second.frame().as_ptr(),
            "one frame for both"
        );
        // The frame is the message the snapshot builds, framed.
        let Built::Ready(built) = x509::svids(&snapshot, &registrations).0 else {
            panic!("ready");
        };
        let frame = first.frame();
        assert_eq!(frame.len(), FRAME_HEADER + built.encoded_len());
        let length = u32::try_from(built.encoded_len()).expect("small");
        assert_eq!(frame[0], 0, "not compressed");
        assert_eq!(frame[1..FRAME_HEADER], length.to_be_bytes());
        let sent = X509SvidResponse::decode(&frame[FRAME_HEADER..]).expect("decodes");
        assert_eq!(sent, built);

        // A renewal (another identity, here with the same text) under the same registration table:
        // a new frame, of the new identity.
        let mut renewed = snapshot_with(vec![("web", ready("web"))]);
        renewed.registrations = snapshot.registrations.clone();
        let third = send(&renewed);
        assert_ne!(third.frame().as_ptr(), first.frame().as_ptr());
        let Built::Ready(rebuilt) = x509::svids(&renewed, &registrations).0 else {
            panic!("ready");
        };
        let sent = X509SvidResponse::decode(&third.frame()[FRAME_HEADER..]).expect("decodes");
        assert_eq!(sent, rebuilt);
        assert_eq!(send(&renewed).frame().as_ptr(), third.frame().as_ptr());
    }
}
