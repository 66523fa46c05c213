//! The three JWT methods: `FetchJWTSVID` (unary), `FetchJWTBundles` (stream) and `ValidateJWTSVID`
//! (unary).
//!
//! A caller is attested and matched against the registrations as for the X.509 methods. Its
//! JWT-SVIDs name the SPIFFE IDs of the X.509-SVIDs its registrations are issued, and are signed by
//! their trust domains' keys ([`JwtKeys`], whose module docs say when a new key signs).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use futures::future::select_all;
use futures::stream::{self, BoxStream, StreamExt};
use meshca_control::{ProxyEntry, ProxyIdentity, Registration, Snapshot};
use meshca_federation::{EcCurve, JwkKey, SpiffeBundle};
use meshca_identity::SpiffeId;
use meshca_serve::{ConnInfo, HubStream, SnapshotWaiter};
use prost::Message;
use serde_json::{Map, Value as Json};
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::Status;

use crate::follow::{connect, sleep_until_some};
use crate::jwt::{
    self, check_audiences, mint, JwksDocument, JwtPublicKey, JwtSvidCache, TokenShape,
};
use crate::jwt_keys::{JwtKeys, JwtKeysError, KeySet};
use crate::jwt_source::JwtSource;
use crate::proto::{
    value::Kind, JwtBundlesRequest, JwtBundlesResponse, JwtSvid, JwtSvidRequest, JwtSvidResponse,
    ListValue, Struct, ValidateJwtSvidRequest, ValidateJwtSvidResponse, Value,
};
use crate::shared::{Admitted, Shared};
use crate::x509::MAX_RESPONSE_BYTES;

/// Unix seconds now.
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The registrations `admitted` matches in the current snapshot; `PERMISSION_DENIED` for none.
async fn matched(shared: &Shared, admitted: &Admitted) -> Result<Vec<Arc<Registration>>, Status> {
    let snapshot = shared.published().await?;
    let selectors = &admitted.selectors;
    let matched = snapshot
        .registrations
        .matching(shared.options.agent.as_deref(), |s| selectors.contains(s));
    if matched.is_empty() {
        return Err(shared.no_registration(admitted));
    }
    Ok(matched)
}

/// The identities of `registrations` once none is pending any more (waiting no later than
/// `deadline`): the ready ones, in order, and why the others have none. Makes sure every trust domain
/// of a ready identity has a JWT key.
async fn identities(
    shared: &Arc<Shared>,
    registrations: &[Arc<Registration>],
    deadline: Instant,
) -> Result<Identities, Status> {
    // The owner's view of the caller's registrations while it is being served: connected, so that
    // they are issued their identities; disconnected when dropped.
    let mut connected: Vec<HubStream> = Vec::with_capacity(registrations.len());
    let mut waiters: Vec<SnapshotWaiter> = Vec::with_capacity(registrations.len());
    for registration in registrations {
        let (stream, waiter) = connect(shared, registration).await?;
        connected.push(stream);
        waiters.push(waiter);
    }
    let (ready, skipped) = loop {
        let snapshot = shared.hub.snapshots().borrow().clone();
        if let Some(found) = settled(&snapshot, registrations) {
            break found;
        }
        let changed = select_all(waiters.iter_mut().map(|w| Box::pin(w.changed())));
        tokio::select! {
            (open, _, _) = changed => if !open {
                return Err(Status::unavailable("the server is shutting down"));
            },
            () = sleep_until_some(Some(deadline)) => {
                return Err(Status::unavailable(format!(
                    "the identity is not ready after {:?}: the daemon has not prepared it yet",
                    shared.options.identity_wait
                )));
            }
        }
    };
    drop(connected);
    if let Some(keys) = shared.jwt()?.local() {
        for (_, identity) in &ready {
            keys.ensure(identity.trust_domain())
                .await
                .map_err(|error| key_failure(&error))?;
        }
    }
    Ok((ready, skipped))
}

/// Makes sure the trust domains of the caller's ready identities in `snapshot` have JWT keys, in
/// the background (for the X.509 methods, which do not wait for them).
pub(crate) fn ensure_keys_of(
    shared: &Shared,
    snapshot: &Snapshot,
    registrations: &[Arc<Registration>],
) {
    let Some(jwt_keys) = shared.jwt.as_ref().and_then(JwtSource::local) else {
        return;
    };
    for registration in registrations {
        if let Some(ProxyEntry::Ready(identity)) = snapshot.proxies.get(&registration.proxy) {
            let td = identity.trust_domain().to_owned();
            if jwt_keys.current().by_trust_domain().contains_key(&td) {
                continue;
            }
            let keys = jwt_keys.clone();
            tokio::spawn(async move {
                if let Err(error) = keys.ensure(&td).await {
                    tracing::warn!(%error, "a JWT signing key is not available");
                }
            });
        }
    }
}

/// The caller's registrations that have an identity, with it, and why the others have none.
type Identities = (Vec<(Arc<Registration>, Arc<ProxyIdentity>)>, Vec<String>);

/// The ready identities and the reasons for the others, or `None` while one is pending.
fn settled(snapshot: &Snapshot, registrations: &[Arc<Registration>]) -> Option<Identities> {
    let mut ready = Vec::new();
    let mut skipped = Vec::new();
    for registration in registrations {
        match snapshot.proxies.get(&registration.proxy) {
            Some(ProxyEntry::Ready(identity)) => {
                ready.push((registration.clone(), identity.clone()))
            }
            None | Some(ProxyEntry::Pending) => return None,
            Some(ProxyEntry::NoIdentity { reason } | ProxyEntry::Refused { reason }) => {
                skipped.push(format!("registration {}: {reason}", registration.name));
            }
        }
    }
    Some((ready, skipped))
}

/// A key that could not be had: logged, and `UNAVAILABLE` for the caller (it may retry).
fn key_failure(error: &JwtKeysError) -> Status {
    if let JwtKeysError::NotYetUsable { .. } = error {
        return Status::unavailable(error.to_string());
    }
    tracing::warn!(%error, "a JWT signing key is not available");
    Status::unavailable(format!("JWT signing key not available: {error}"))
}

/// A registration's hint, unless an earlier registration of the response has it: the first one (in
/// order) keeps it.
fn unique_hint<'a>(registration: &'a Registration, hints: &mut Vec<&'a str>) -> String {
    match registration.hint.as_deref() {
        Some(hint) if !hints.contains(&hint) => {
            hints.push(hint);
            hint.to_owned()
        }
        _ => String::new(),
    }
}

/// `FetchJWTSVID`.
pub(crate) async fn fetch_jwt_svid(
    shared: Arc<Shared>,
    request: tonic::Request<JwtSvidRequest>,
) -> Result<tonic::Response<JwtSvidResponse>, Status> {
    let opened = Instant::now();
    let admitted = shared.admit(request.extensions().get::<ConnInfo>()).await?;
    let request = request.into_inner();
    let registrations = matched(&shared, &admitted).await?;
    let options = &shared.options;
    check_audiences(
        &request.audience,
        options.jwt_audiences_per_request,
        options.jwt_audience_bytes,
    )
    .map_err(|e| Status::invalid_argument(e.to_string()))?;
    let deadline = opened + options.identity_wait;
    let (mut ready, skipped) = identities(&shared, &registrations, deadline).await?;
    if !request.spiffe_id.is_empty() {
        ready.retain(|(_, identity)| identity.spiffe_id == request.spiffe_id);
        if ready.is_empty() {
            return Err(Status::permission_denied(format!(
                "no identity issued: the caller has no identity {}",
                meshca_auth::quote(&request.spiffe_id)
            )));
        }
    }
    if ready.is_empty() {
        return Err(Status::permission_denied(format!(
            "no identity issued: {}",
            skipped.join("; ")
        )));
    }
    let mut response = JwtSvidResponse::default();
    let mut hints: Vec<&str> = Vec::new();
    for (registration, identity) in &ready {
        let spiffe_id = SpiffeId::parse(&identity.spiffe_id).map_err(|error| {
            Status::internal(format!(
                "registration {}: its SPIFFE ID {:?} does not parse: {error}",
                registration.name, identity.spiffe_id
            ))
        })?;
        let keys = match shared.jwt()? {
            JwtSource::Local(keys) => keys,
            JwtSource::Remote(remote) => {
                let token = remote.minter.mint(registration, &request.audience).await?;
                response.svids.push(JwtSvid {
                    spiffe_id: identity.spiffe_id.clone(),
                    svid: token,
                    hint: unique_hint(registration, &mut hints),
                });
                continue;
            }
        };
        let token = mint_jwt_svid(
            keys,
            &shared.jwt_cache,
            &spiffe_id,
            &request.audience,
            registration.jwt_svid_expiry,
            deadline,
        )
        .await
        .map_err(|error| error.status())?;
        let hint = unique_hint(registration, &mut hints);
        response.svids.push(JwtSvid {
            spiffe_id: identity.spiffe_id.clone(),
            svid: token,
            hint,
        });
    }
    let size = response.encoded_len();
    if size >= MAX_RESPONSE_BYTES {
        let reason = format!(
            "the response would be {size} bytes, over the {MAX_RESPONSE_BYTES} bytes Workload API \
             clients accept"
        );
        tracing::warn!(caller = %admitted.caller, method = "FetchJWTSVID", "Workload API response refused: {reason}");
        return Err(Status::resource_exhausted(reason));
    }
    Ok(tonic::Response::new(response))
}

/// Why no JWT-SVID was minted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MintError {
    /// The trust domain's signing key could not be had (not yet usable, or the keystore failed).
    #[error(transparent)]
    Key(#[from] JwtKeysError),
    /// The token could not be made (the audiences make it too long, ...).
    #[error(transparent)]
    Token(#[from] jwt::JwtError),
}

impl MintError {
    /// What the caller is answered: `UNAVAILABLE` when a key could not be had or could not sign (a
    /// PKCS#11 token away: another try may work, logged), `INVALID_ARGUMENT` for a token that cannot be
    /// made from the request.
    pub fn status(&self) -> Status {
        match self {
            MintError::Key(error) => key_failure(error),
            MintError::Token(error @ jwt::JwtError::Key { .. }) => {
                tracing::warn!(%error, "a JWT signing key could not sign");
                Status::unavailable(error.to_string())
            }
            MintError::Token(error) => Status::invalid_argument(error.to_string()),
        }
    }
}

/// A JWT-SVID naming `spiffe_id` for `audience`, valid for `lifetime` (at least a second), signed by the
/// current key of its trust domain (created if needed, waited for no later than `deadline`); taken from
/// `cache` while a token it holds for the same identity, key and audiences is fresh enough, and put there
/// when signed. What `FetchJWTSVID` answers with, for the Workload API socket and for an agent's
/// workloads alike. The audiences must have been checked ([`jwt::check_audiences`]).
pub async fn mint_jwt_svid(
    keys: &JwtKeys,
    cache: &Mutex<JwtSvidCache>,
    spiffe_id: &SpiffeId,
    audience: &[String],
    lifetime: Duration,
    deadline: Instant,
) -> Result<String, MintError> {
    let key = keys
        .signer(spiffe_id.trust_domain().as_str(), deadline)
        .await?;
    let now = unix_now();
    let lifetime = lifetime.as_secs().max(1);
    let shape = TokenShape::new(spiffe_id, key.kid(), audience, lifetime);
    let cached = cache
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&shape, now);
    if let Some(token) = cached {
        return Ok(token);
    }
    let expires_at = now.saturating_add(lifetime);
    let token = mint(&key, spiffe_id.as_str(), audience, now, expires_at)?;
    cache.lock().unwrap_or_else(PoisonError::into_inner).insert(
        shape,
        token.clone(),
        now,
        expires_at,
    );
    Ok(token)
}

/// `ValidateJWTSVID`.
pub(crate) async fn validate_jwt_svid(
    shared: Arc<Shared>,
    request: tonic::Request<ValidateJwtSvidRequest>,
) -> Result<tonic::Response<ValidateJwtSvidResponse>, Status> {
    let admitted = shared.admit(request.extensions().get::<ConnInfo>()).await?;
    let request = request.into_inner();
    let registrations = matched(&shared, &admitted).await?;
    if request.audience.is_empty() {
        return Err(Status::invalid_argument("audience must be specified"));
    }
    if request.svid.is_empty() {
        return Err(Status::invalid_argument("svid must be specified"));
    }
    let max = shared.options.jwt_audience_bytes;
    if request.audience.len() > max {
        return Err(Status::invalid_argument(format!(
            "audience is {} bytes long; at most {max} are accepted (limits.jwtAudienceBytes)",
            request.audience.len()
        )));
    }
    let keys = shared.jwt()?.current();
    // A federated trust domain's keys, for the tokens of the peers the caller's meshes trust.
    let snapshot = shared.published().await?;
    let federated = federated_for(&snapshot, &registrations);
    let validated = jwt::validate(
        &request.svid,
        &request.audience,
        &|td: &str, kid: &str| {
            keys.get(td, kid)
                .or_else(|| federated_key(&federated, td, kid))
        },
        unix_now(),
    )
    .map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok(tonic::Response::new(ValidateJwtSvidResponse {
        spiffe_id: validated.spiffe_id.as_str().to_owned(),
        claims: Some(to_struct(validated.claims)),
    }))
}

/// JSON claims as a protobuf `Struct`.
fn to_struct(map: Map<String, Json>) -> Struct {
    Struct {
        fields: map.into_iter().map(|(k, v)| (k, to_value(v))).collect(),
    }
}

fn to_value(json: Json) -> Value {
    let kind = match json {
        Json::Null => Kind::NullValue(0),
        Json::Bool(b) => Kind::BoolValue(b),
        // Protobuf's numbers are doubles: integers above 2^53 lose precision, as in any JSON
        // mapping of `Struct`.
        Json::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
        Json::String(s) => Kind::StringValue(s),
        Json::Array(items) => Kind::ListValue(ListValue {
            values: items.into_iter().map(to_value).collect(),
        }),
        Json::Object(map) => Kind::StructValue(to_struct(map)),
    };
    Value { kind: Some(kind) }
}

/// The bundles of the federated trust domains the meshes of `registrations` trust, each trust domain
/// once.
fn federated_for(
    snapshot: &Snapshot,
    registrations: &[Arc<Registration>],
) -> Vec<Arc<SpiffeBundle>> {
    let mut out: Vec<Arc<SpiffeBundle>> = Vec::new();
    let meshes: BTreeSet<&str> = registrations.iter().map(|r| &*r.proxy.mesh).collect();
    for view in meshes.into_iter().filter_map(|m| snapshot.meshes.get(m)) {
        for bundle in view.federated.iter() {
            if !out
                .iter()
                .any(|b| b.trust_domain() == bundle.trust_domain())
            {
                out.push(bundle.clone());
            }
        }
    }
    out
}

/// Key `kid` of federated trust domain `td`, if it is one meshca can verify with (ES256 on P-256, the
/// JWT-SVID algorithm meshca validates); a peer's signature is accepted in either form of `s`.
fn federated_key(federated: &[Arc<SpiffeBundle>], td: &str, kid: &str) -> Option<JwtPublicKey> {
    let bundle = federated.iter().find(|b| b.trust_domain().as_str() == td)?;
    let authority = bundle.jwt_authorities().iter().find(|a| a.kid == kid)?;
    match &authority.key {
        JwkKey::Ec {
            curve: EcCurve::P256,
            x,
            y,
        } => Some(
            JwtPublicKey::new(
                kid.to_owned(),
                x.as_slice().try_into().ok()?,
                y.as_slice().try_into().ok()?,
            )
            .of_another_issuer(),
        ),
        _ => None,
    }
}

/// The `FetchJWTBundles` message for `keys` and the `federated` trust domains' JWT authorities: a JWK
/// Set per trust domain, keyed `spiffe://<td>`.
fn bundles_message(
    keys: &KeySet,
    federated: &[Arc<SpiffeBundle>],
) -> Result<JwtBundlesResponse, Status> {
    let mut bundles: HashMap<String, Vec<u8>> = keys
        .by_trust_domain()
        .iter()
        .map(|(td, jwks): (&String, &JwksDocument)| (format!("spiffe://{td}"), jwks.to_bytes()))
        .collect();
    for bundle in federated.iter().filter(|b| !b.jwt_authorities().is_empty()) {
        // The JWK Set of the trust domain's JWT authorities, each as the peer published it.
        let jwks = SpiffeBundle::new(
            bundle.trust_domain().clone(),
            Vec::new(),
            bundle.jwt_authorities().to_vec(),
        );
        bundles
            .entry(format!("spiffe://{}", bundle.trust_domain()))
            .or_insert_with(|| jwks.to_json());
    }
    let response = JwtBundlesResponse { bundles };
    let size = response.encoded_len();
    if size >= MAX_RESPONSE_BYTES {
        let reason = format!(
            "the response would be {size} bytes, over the {MAX_RESPONSE_BYTES} bytes Workload API \
             clients accept"
        );
        tracing::warn!(
            method = "FetchJWTBundles",
            "Workload API response refused: {reason}"
        );
        return Err(Status::resource_exhausted(reason));
    }
    Ok(response)
}

/// `FetchJWTBundles`: the stream of messages.
pub(crate) async fn fetch_jwt_bundles(
    shared: Arc<Shared>,
    request: tonic::Request<JwtBundlesRequest>,
) -> Result<tonic::Response<BoxStream<'static, Result<JwtBundlesResponse, Status>>>, Status> {
    let opened = Instant::now();
    let admitted = shared.admit(request.extensions().get::<ConnInfo>()).await?;
    let registrations = matched(&shared, &admitted).await?;
    // The caller's own trust domains have keys before the first message.
    identities(
        &shared,
        &registrations,
        opened + shared.options.identity_wait,
    )
    .await?;
    let shutdown = shared.hub.snapshot_waiter(&registrations[0].proxy);
    let snapshots = shared.hub.snapshots();
    let federated = federated_for(&snapshots.borrow(), &registrations);
    let follow = BundlesFollow {
        keys: shared.jwt()?.subscribe(),
        snapshots,
        federated,
        agent: shared.options.agent.clone(),
        admitted,
        shutdown,
        first: true,
        done: false,
    };
    let stream = stream::unfold(follow, |mut follow| async move {
        if follow.done {
            return None;
        }
        let item = follow.next().await;
        follow.done = item.is_err();
        Some((item, follow))
    })
    .boxed();
    Ok(tonic::Response::new(stream))
}

/// One `FetchJWTBundles` stream: the key set at once, then again whenever it changes.
struct BundlesFollow {
    admitted: Admitted,
    /// Which registrations the socket serves ([`crate::WorkloadOptions::agent`]).
    agent: Option<String>,
    keys: watch::Receiver<Arc<KeySet>>,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    /// The federated bundles of the caller's meshes, as last sent.
    federated: Vec<Arc<SpiffeBundle>>,
    /// Rung by the dispatcher that wakes the server's streams; `false` once the server shuts down.
    shutdown: SnapshotWaiter,
    first: bool,
    done: bool,
}

impl BundlesFollow {
    async fn next(&mut self) -> Result<JwtBundlesResponse, Status> {
        if std::mem::take(&mut self.first) {
            let keys = self.keys.borrow_and_update().clone();
            return bundles_message(&keys, &self.federated);
        }
        loop {
            tokio::select! {
                changed = self.keys.changed() => {
                    if changed.is_err() {
                        return Err(Status::unavailable("the server is shutting down"));
                    }
                    let keys = self.keys.borrow_and_update().clone();
                    return bundles_message(&keys, &self.federated);
                }
                changed = self.snapshots.changed() => {
                    if changed.is_err() {
                        return Err(Status::unavailable("the server is shutting down"));
                    }
                    let registrations = self.still_registered()?;
                    let federated = federated_for(&self.snapshots.borrow(), &registrations);
                    let same = federated.len() == self.federated.len()
                        && federated.iter().zip(&self.federated).all(|(a, b)| Arc::ptr_eq(a, b));
                    if !same {
                        self.federated = federated;
                        let keys = self.keys.borrow().clone();
                        return bundles_message(&keys, &self.federated);
                    }
                }
                open = self.shutdown.changed() => {
                    if !open {
                        return Err(Status::unavailable("the server is shutting down"));
                    }
                }
            }
        }
    }

    /// `PERMISSION_DENIED` once the caller matches no registration any more.
    fn still_registered(&mut self) -> Result<Vec<Arc<Registration>>, Status> {
        let snapshot = self.snapshots.borrow_and_update().clone();
        let selectors = &self.admitted.selectors;
        let matched = snapshot
            .registrations
            .matching(self.agent.as_deref(), |s| selectors.contains(s));
        if matched.is_empty() {
            tracing::info!(caller = %self.admitted.caller, method = "FetchJWTBundles", "Workload API stream ended: the caller matches no registration any more");
            return Err(Status::permission_denied(
                "no identity issued: the caller matches no WorkloadRegistration any more",
            ));
        }
        Ok(matched)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_convert_to_a_struct_value_for_value() {
        let claims = serde_json::json!({
            "sub": "spiffe://example.org/w",
            "aud": ["a"],
            "exp": 1700000000u64,
            "ratio": 0.5,
            "flag": true,
            "none": null,
            "nested": {"k": [1, "x"]},
        });
        let serde_json::Value::Object(map) = claims else {
            panic!("an object")
        };
        let converted = to_struct(map);
        let kind = |name: &str| converted.fields[name].kind.clone().expect("a kind");
        assert_eq!(
            kind("sub"),
            Kind::StringValue("spiffe://example.org/w".to_owned())
        );
        assert_eq!(
            kind("aud"),
            Kind::ListValue(ListValue {
                values: vec![Value {
                    kind: Some(Kind::StringValue("a".to_owned()))
                }]
            })
        );
        assert_eq!(kind("exp"), Kind::NumberValue(1_700_000_000.0));
        assert_eq!(kind("ratio"), Kind::NumberValue(0.5));
        assert_eq!(kind("flag"), Kind::BoolValue(true));
        assert_eq!(kind("none"), Kind::NullValue(0));
        let Kind::StructValue(nested) = kind("nested") else {
            panic!("a struct")
        };
        assert_eq!(
            nested.fields["k"].kind,
            Some(Kind::ListValue(ListValue {
                values: vec![
                    Value {
                        kind: Some(Kind::NumberValue(1.0))
                    },
                    Value {
                        kind: Some(Kind::StringValue("x".to_owned()))
                    },
                ]
            }))
        );
    }
}
