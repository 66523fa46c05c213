//! Behaviour of the owner: who gets which identity, renewal under an injected clock, registration,
//! rejection. Each test drives [`Owner`] directly with events and times; nothing sleeps.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meshca_auth::Claims;
use meshca_config::Settings;
use meshca_keystore::MemoryKeystore;
use tokio::sync::watch;

use super::{NoTelemetry, Owner, OwnerConfig, Scope, Telemetry};
use crate::gate::{GateEvent, RolloutStep};
use crate::owner::status::{Detail, ServiceTls, Status};
use crate::world::World;
use crate::Wait;
use crate::{
    ProxyEntry, ProxyIdentity, ProxyKey, ResourceName, Snapshot, StreamEvent, StreamId, UpdateError,
};

const LEGACY: &str = r#"
type: Mesh
name: default
meshServices:
  mode: Exclusive
mtls:
  enabledBackend: ca-1
  backends:
    - name: ca-1
      type: builtin
      dpCert: {rotation: {expiration: 10h}}
    - name: ca-2
      type: builtin
"#;

fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

struct Harness {
    keystore: MemoryKeystore,
    settings: Settings,
    owner: Owner,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    next_stream: u64,
}

fn load(
    yaml: &str,
    keystore: &MemoryKeystore,
    settings: &Settings,
    previous: Option<&World>,
) -> Result<World, Vec<UpdateError>> {
    crate::test_certs::load_world(yaml, keystore, settings, previous, t0())
}

impl Harness {
    fn new(yaml: &str) -> Harness {
        Harness::with_telemetry(yaml, Arc::new(NoTelemetry))
    }

    /// A harness whose owner reports to `telemetry`.
    fn with_telemetry(yaml: &str, telemetry: Arc<dyn Telemetry>) -> Harness {
        let keystore = MemoryKeystore::new();
        let settings = Settings::default();
        let world = load(yaml, &keystore, &settings, None).expect("test resources are valid");
        let (snapshot_tx, snapshots) = watch::channel(Arc::new(Snapshot::empty()));
        let owner = Owner::new(
            OwnerConfig::from_settings(&settings),
            world,
            telemetry,
            snapshot_tx,
        );
        Harness {
            keystore,
            settings,
            owner,
            snapshots,
            next_stream: 0,
        }
    }

    /// Replaces the owner with a fresh one serving the same world, configured by `change`.
    fn reconfigure(&mut self, change: impl FnOnce(&mut OwnerConfig)) {
        let mut config = OwnerConfig::from_settings(&self.settings);
        change(&mut config);
        let (snapshot_tx, snapshots) = watch::channel(Arc::new(Snapshot::empty()));
        self.owner = Owner::new(
            config,
            (**self.owner.world()).clone(),
            Arc::new(NoTelemetry),
            snapshot_tx,
        );
        self.snapshots = snapshots;
    }

    /// Reconciles at `now`, as the owner's loop does: serves the proxies it deferred, then runs the
    /// certificates it started issuing, on two threads, and hands their results back in reverse order
    /// (as a pool may complete them), reconciling again when they ask for it, until nothing is being
    /// issued. Returns when something is next due.
    fn reconcile(&mut self, now: SystemTime) -> Option<SystemTime> {
        let mut next = self.owner.reconcile(now);
        loop {
            while self.owner.has_deferred() {
                self.owner.serve_deferred(now);
                next = self.owner.next_due();
            }
            let jobs = self.owner.take_jobs();
            if jobs.is_empty() {
                return next;
            }
            let mut done = crate::pool::run_all(&jobs, 2, crate::owner::run_job);
            done.reverse();
            if self.owner.on_issued(done, now) {
                next = self.owner.reconcile(now);
            } else {
                next = self.owner.next_due();
            }
        }
    }

    /// The owner's full status as of its last reconcile.
    fn status(&self) -> Status {
        self.owner.status(self.owner.reconciled_at(), Detail::Full)
    }

    fn update(&mut self, yaml: &str) -> Result<(), Vec<UpdateError>> {
        let world = load(
            yaml,
            &self.keystore,
            &self.settings,
            Some(self.owner.world()),
        )?;
        self.owner.accept(world);
        Ok(())
    }

    /// Connects a proxy with a token carrying `labels` and `tags`; returns its stream id.
    fn connect(&mut self, name: &str, labels: &[(&str, &str)], tags: &[(&str, &str)]) -> StreamId {
        let (stream, counted) = self.try_connect(name, labels, tags);
        assert!(counted, "connecting {name} changes nothing");
        stream
    }

    /// Connects a proxy; returns its stream id and whether the owner must reconcile.
    fn try_connect(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        tags: &[(&str, &str)],
    ) -> (StreamId, bool) {
        self.connect_in("default", name, labels, tags)
    }

    /// Connects a proxy of `mesh`; returns its stream id and whether the owner must reconcile.
    fn connect_in(
        &mut self,
        mesh: &str,
        name: &str,
        labels: &[(&str, &str)],
        tags: &[(&str, &str)],
    ) -> (StreamId, bool) {
        let map = |kv: &[(&str, &str)]| {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        let claims = Claims::new_dataplane(
            mesh,
            name,
            map(labels),
            map(tags),
            Duration::from_secs(3600),
            1_800_000_000,
        )
        .expect("valid claims");
        self.next_stream += 1;
        let stream = StreamId(self.next_stream);
        let counted = self.owner.on_event(StreamEvent::Connected {
            stream,
            claims: Arc::new(claims),
        });
        (stream, counted)
    }

    /// Stream `id` (of the proxy connected as that stream) subscribes to `resources` and has ACKed
    /// snapshot `acked`, as its SDS stream would report.
    fn stream(&mut self, id: u64, resources: &[&str], acked: Option<u64>) -> bool {
        let stream = StreamId(id);
        let resources = resources.iter().map(|r| ResourceName::parse(*r)).collect();
        let mut dirty = self
            .owner
            .on_event(StreamEvent::Subscribed { stream, resources });
        if let Some(generation) = acked {
            dirty |= self.owner.on_event(StreamEvent::Acked {
                stream,
                generation,
                version: format!("v{generation}"),
            });
        }
        dirty
    }

    /// Stream `id` subscribes to its identity and the mesh trust and has ACKed `acked`.
    fn ack(&mut self, id: u64, acked: Option<u64>) {
        self.stream(id, &["default", "system_trust_bundle"], acked);
    }

    /// Stream `id` ACKs snapshot `generation`, with no other event.
    fn ack_only(&mut self, id: u64, generation: u64) -> bool {
        self.owner.on_event(StreamEvent::Acked {
            stream: StreamId(id),
            generation,
            version: String::new(),
        })
    }

    fn disconnect(&mut self, id: u64) -> bool {
        self.owner.on_event(StreamEvent::Disconnected {
            stream: StreamId(id),
        })
    }

    fn entry(&self, name: &str) -> ProxyEntry {
        let snapshot = self.snapshots.borrow();
        match snapshot.proxies.get(&ProxyKey::new("default", name)) {
            Some(ProxyEntry::Ready(id)) => ProxyEntry::Ready(id.clone()),
            Some(ProxyEntry::NoIdentity { reason }) => ProxyEntry::NoIdentity {
                reason: reason.clone(),
            },
            Some(ProxyEntry::Refused { reason }) => ProxyEntry::Refused {
                reason: reason.clone(),
            },
            Some(ProxyEntry::Pending) => ProxyEntry::Pending,
            None => panic!("{name} is not in the snapshot"),
        }
    }

    fn ready(&self, name: &str) -> Arc<ProxyIdentity> {
        match self.entry(name) {
            ProxyEntry::Ready(id) => id,
            other => panic!("{name} is not ready: {other:?}"),
        }
    }

    fn reason(&self, name: &str) -> String {
        match self.entry(name) {
            ProxyEntry::NoIdentity { reason } | ProxyEntry::Refused { reason } => reason,
            other => panic!("{name} has an identity: {other:?}"),
        }
    }
}

/// The status of dataplane `name`, which the status must list.
fn dataplane<'a>(status: &'a Status, name: &str) -> &'a crate::owner::status::DataplaneStatus {
    status
        .dataplanes
        .iter()
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("{name} is not listed in the status"))
}

fn leaf_der(identity: &ProxyIdentity) -> Vec<u8> {
    let blocks = ::pem::parse_many(identity.chain_pem.as_bytes()).expect("chain is PEM");
    blocks[0].contents().to_vec()
}

fn not_after(identity: &ProxyIdentity) -> SystemTime {
    let info = meshca_ca::inspect_pem(identity.chain_pem.as_bytes()).expect("chain parses");
    let t = time::OffsetDateTime::parse(
        &info[0].not_after,
        &time::format_description::well_known::Rfc3339,
    )
    .expect("rfc3339");
    t.into()
}

#[test]
fn legacy_backend_issues_service_identity_that_verifies_against_the_mesh_bundle() {
    let mut h = Harness::new(LEGACY);
    h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    h.reconcile(t0());
    let id = h.ready("web-1");
    assert_eq!(id.spiffe_id, "spiffe://default/web");
    assert!(meshca_ca::check_svid_rules(&leaf_der(&id)).is_ok());
    let snapshot = h.snapshots.borrow().clone();
    let bundle = &snapshot.meshes["default"].trust.by_trust_domain()["default"];
    let anchors: Vec<Vec<u8>> = bundle
        .iter()
        .map(|p| ::pem::parse(p).expect("pem").contents().to_vec())
        .collect();
    let chain: Vec<Vec<u8>> = ::pem::parse_many(id.chain_pem.as_bytes())
        .expect("pem")
        .iter()
        .map(|b| b.contents().to_vec())
        .collect();
    let expected = "spiffe://default/web".parse().expect("valid id");
    meshca_ca::verify_svid(&chain, &anchors, &expected, t0())
        .expect("the served certificate verifies against the served bundle");
    // dpCert.rotation.expiration: 10h (plus the 10 s backdating).
    assert_eq!(not_after(&id), t0() + Duration::from_secs(10 * 3600));
}

#[test]
fn renewal_happens_at_renew_at_and_not_before() {
    let mut h = Harness::new(LEGACY);
    h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    let renew = h
        .reconcile(t0())
        .expect("a connected proxy has a renewal time");
    let first = h.ready("web-1");
    let lifetime = Duration::from_secs(10 * 3600);
    // renewAt 0.8 minus up to 5% jitter, measured from NotBefore (10 s before issuance).
    assert!(
        renew >= t0() - Duration::from_secs(10) + lifetime.mul_f64(0.75),
        "{renew:?}"
    );
    assert!(renew <= t0() + lifetime.mul_f64(0.8), "{renew:?}");

    h.reconcile(renew - Duration::from_secs(1));
    assert_eq!(
        h.ready("web-1").chain_pem,
        first.chain_pem,
        "renewed too early"
    );

    let next = h.reconcile(renew).expect("still connected");
    let second = h.ready("web-1");
    assert_ne!(
        second.chain_pem, first.chain_pem,
        "not renewed at its renewal time"
    );
    assert!(not_after(&second) > not_after(&first));
    assert!(next > renew);
    let status = h.status();
    let dp = dataplane(&status, "web-1");
    assert_eq!(dp.regenerations, 1);
}

#[test]
fn certificates_never_expire_on_a_connected_proxy_across_many_lifetimes() {
    let mut h = Harness::new(LEGACY);
    h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    let mut now = t0();
    for _ in 0..20 {
        let renew = h.reconcile(now).expect("connected");
        let id = h.ready("web-1");
        assert!(renew < not_after(&id), "renewal scheduled after expiry");
        now = renew;
    }
}

#[test]
fn most_specific_mesh_identity_wins_and_legacy_is_the_fallback() {
    let yaml = format!(
        "{LEGACY}---\n{}",
        r#"
type: MeshIdentity
name: web-only
mesh: default
spec:
  selector: {dataplane: {matchLabels: {app: web, tier: front}}}
  spiffeID: {trustDomain: "{{ .Mesh }}.{{ .Zone }}.mesh.local", path: '/app/{{ label "app" }}'}
  provider: {type: Bundled, bundled: {autogenerate: {enabled: true}}}
---
type: MeshIdentity
name: a-broad
mesh: default
spec:
  selector: {dataplane: {matchLabels: {app: web}}}
  provider: {type: Bundled, bundled: {autogenerate: {enabled: true}, certificateParameters: {expiry: 2h}}}
---
type: MeshIdentity
name: sans-only
mesh: default
spec:
  selector: {dataplane: {matchLabels: {}}}
"#
    );
    let mut h = Harness::new(&yaml);
    h.connect(
        "front-1",
        &[("app", "web"), ("tier", "front")],
        &[("kuma.io/service", "web")],
    );
    h.connect("back-1", &[("app", "web")], &[("kuma.io/service", "web")]);
    h.connect("db-1", &[("app", "db")], &[("kuma.io/service", "db")]);
    h.reconcile(t0());
    let front = h.ready("front-1");
    assert_eq!(
        front.spiffe_id,
        "spiffe://default.default.mesh.local/app/web"
    );
    assert_eq!(front.identity_name.as_deref(), Some("web-only"));
    let back = h.ready("back-1");
    assert_eq!(
        back.spiffe_id,
        "spiffe://default.default.mesh.local/workload/back-1"
    );
    assert_eq!(back.identity_name.as_deref(), Some("a-broad"));
    assert_eq!(not_after(&back), t0() + Duration::from_secs(2 * 3600));
    // The provider-less identity selects db-1 but issues nothing: the legacy backend does.
    assert_eq!(h.ready("db-1").spiffe_id, "spiffe://default/db");
    let status = h.status();
    let sans_only = status.meshes[0]
        .mesh_identities
        .iter()
        .find(|i| i.name == "sans-only")
        .expect("listed");
    assert!(sans_only
        .conditions
        .iter()
        .any(|c| c.kind == "Ready" && c.status == "False" && c.reason == "PartiallyReady"));
}

#[test]
fn dataplanes_without_an_identity_say_why() {
    let yaml = r#"
type: Mesh
name: default
meshServices:
  mode: Exclusive
---
type: MeshIdentity
name: spire
mesh: default
spec:
  selector: {dataplane: {matchLabels: {team: spire}}}
  provider: {type: Spire}
---
type: MeshIdentity
name: labelled
mesh: default
spec:
  selector: {dataplane: {matchLabels: {team: x}}}
  spiffeID: {path: '/sa/{{ .ServiceAccount }}'}
  provider: {type: Bundled, bundled: {autogenerate: {enabled: true}}}
"#;
    let mut h = Harness::new(yaml);
    h.connect("s-1", &[("team", "spire")], &[]);
    h.connect("x-1", &[("team", "x")], &[]);
    h.connect("plain-1", &[], &[("kuma.io/service", "plain")]);
    h.reconcile(t0());
    assert!(h.reason("s-1").contains("SPIRE"), "{}", h.reason("s-1"));
    assert!(
        h.reason("x-1").contains("k8s.kuma.io/service-account"),
        "{}",
        h.reason("x-1")
    );
    assert!(
        h.reason("plain-1").contains("no enabled mTLS backend"),
        "{}",
        h.reason("plain-1")
    );
    let status = h.status();
    let x = dataplane(&status, "x-1");
    assert!(x
        .reason
        .as_deref()
        .is_some_and(|r| r.contains("service-account")));
}

#[test]
fn a_token_contradicting_the_dataplane_file_is_refused() {
    let yaml = format!(
        "{LEGACY}---\n{}",
        r#"
type: Dataplane
mesh: default
name: web-1
labels: {app: web}
networking:
  inbound: [{port: 8080, tags: {kuma.io/service: web}}]
"#
    );
    let mut h = Harness::new(&yaml);
    h.try_connect("web-1", &[("app", "db")], &[]);
    h.reconcile(t0());
    assert!(!h
        .snapshots
        .borrow()
        .proxies
        .contains_key(&ProxyKey::new("default", "web-1")));
    let status = h.status();
    let dp = dataplane(&status, "web-1");
    assert!(
        dp.refused_token
            .as_deref()
            .is_some_and(|r| r.contains("app=db")),
        "{dp:?}"
    );

    // The real proxy is served, and the claim rule SDS checks every token against is the file's.
    h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    h.reconcile(t0());
    let first = h.ready("web-1");
    assert_eq!(first.spiffe_id, "spiffe://default/web");
    let rule = h.snapshots.borrow().claim_rules[&ProxyKey::new("default", "web-1")].clone();
    assert_eq!(rule.labels.get("app").map(String::as_str), Some("web"));

    // Another contradicting token while it is connected changes nothing for it.
    h.try_connect("web-1", &[("app", "db")], &[("kuma.io/service", "db")]);
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(h.ready("web-1").chain_pem, first.chain_pem);
}

#[test]
fn the_first_token_of_an_unfiled_proxy_defines_it_while_connected() {
    let mut h = Harness::new(LEGACY);
    h.connect("api-1", &[("app", "api")], &[("kuma.io/service", "api")]);
    h.try_connect(
        "api-1",
        &[("app", "other")],
        &[("kuma.io/service", "other")],
    );
    h.reconcile(t0());
    assert_eq!(h.ready("api-1").spiffe_id, "spiffe://default/api");
    let status = h.status();
    let dp = dataplane(&status, "api-1");
    assert!(
        dp.refused_token
            .as_deref()
            .is_some_and(|r| r.contains("app=other")),
        "{dp:?}"
    );
}

#[test]
fn reconnect_reuses_the_certificate_and_disconnect_stops_serving_it() {
    let mut h = Harness::new(LEGACY);
    let stream = h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    h.reconcile(t0());
    let first = h.ready("web-1");
    assert!(h.owner.on_event(StreamEvent::Disconnected { stream }));
    h.reconcile(t0() + Duration::from_secs(60));
    assert!(!h
        .snapshots
        .borrow()
        .proxies
        .contains_key(&ProxyKey::new("default", "web-1")));
    h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    h.reconcile(t0() + Duration::from_secs(120));
    assert_eq!(h.ready("web-1").chain_pem, first.chain_pem);
}

#[test]
fn switching_the_enabled_backend_reissues_from_the_new_ca() {
    let mut h = Harness::new(LEGACY);
    h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    h.reconcile(t0());
    let first = h.ready("web-1");
    h.update(&LEGACY.replace("enabledBackend: ca-1", "enabledBackend: ca-2"))
        .expect("valid update");
    h.reconcile(t0() + Duration::from_secs(1));
    let second = h.ready("web-1");
    assert_ne!(first.chain_pem, second.chain_pem);
    let issuer = |id: &ProxyIdentity| {
        meshca_ca::inspect_pem(id.chain_pem.as_bytes()).expect("parses")[0]
            .issuer
            .clone()
    };
    assert_ne!(issuer(&first), issuer(&second));
    let status = h.status();
    assert_eq!(
        status.meshes[0].proxies_by_issuer.get("backend ca-2"),
        Some(&1)
    );
}

#[test]
fn a_rejected_update_keeps_the_previous_configuration_serving() {
    let mut h = Harness::new(LEGACY);
    h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    h.reconcile(t0());
    let first = h.ready("web-1");
    let errors = h
        .update(&LEGACY.replace("enabledBackend: ca-1", "enabledBackend: ca-9"))
        .expect_err("unknown backend");
    assert!(
        errors
            .iter()
            .any(|e| e.field.contains("enabledBackend") && e.resource.contains("Mesh/default")),
        "{errors:?}"
    );
    h.owner.reject(errors, t0());
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(h.ready("web-1").chain_pem, first.chain_pem);
    let status = h.status();
    let rejected = status.last_rejected_update.as_ref().expect("shown");
    assert!(
        rejected.errors[0]
            .to_string()
            .starts_with("test.yaml: Mesh/default: mtls.enabledBackend"),
        "{}",
        rejected.errors[0]
    );
}

#[test]
fn a_restart_reuses_persisted_cas() {
    let keystore = MemoryKeystore::new();
    let settings = Settings::default();
    let a = load(LEGACY, &keystore, &settings, None).expect("valid");
    let b = load(LEGACY, &keystore, &settings, None).expect("valid");
    let id = |w: &World| {
        w.meshes["default"]
            .enabled_backend
            .as_ref()
            .expect("enabled")
            .ca
            .ca
            .id()
            .to_owned()
    };
    assert_eq!(id(&a), id(&b));
}

#[test]
fn mesh_service_contexts_carry_the_identities_of_their_dataplanes() {
    let yaml = format!(
        "{LEGACY}---\n{WEB_SERVICE}{}",
        r#"---
type: MeshService
name: remote
mesh: default
labels: {kuma.io/zone: zone-2}
spec:
  selector: {dataplaneTags: {kuma.io/service: web}}
  identities: [{type: SpiffeID, value: "spiffe://zone-2.mesh.local/workload/remote"}]
"#
    );
    let mut h = Harness::new(&yaml);
    h.reconcile(t0());
    let snapshot = h.snapshots.borrow().clone();
    let services = &snapshot.meshes["default"].mesh_services;
    let web: Vec<&String> = services["web"].spiffe_ids().iter().collect();
    assert_eq!(web, ["spiffe://default/web"]);
    // A service of another zone is taken as given, not computed from local dataplanes.
    let remote: Vec<&String> = services["remote"].spiffe_ids().iter().collect();
    assert_eq!(remote, ["spiffe://zone-2.mesh.local/workload/remote"]);
}

#[test]
fn a_local_meshservice_gets_computed_identities_whatever_its_file_lists() {
    let yaml = format!(
        "{LEGACY}---\n{}",
        r#"
type: Dataplane
mesh: default
name: web-1
labels: {app: web}
networking:
  inbound:
    - {port: 8080, tags: {kuma.io/service: web-main}}
    - {port: 9090, tags: {kuma.io/service: web-admin}}
---
type: MeshIdentity
name: staged
mesh: default
spec:
  selector: {dataplane: {matchLabels: {app: web}}}
  spiffeID: {trustDomain: next.example, path: '/app/{{ label "app" }}'}
---
type: MeshService
name: web-admin
mesh: default
spec:
  selector: {dataplaneTags: {kuma.io/service: web-admin}}
  ports: [{port: 90, targetPort: 9090}]
  identities: [{type: SpiffeID, value: "spiffe://stale.example/listed"}]
"#
    );
    let mut h = Harness::new(&yaml);
    h.reconcile(t0());
    assert_eq!(
        service_context(&h, "web-admin"),
        [
            // The ServiceTag of the inbound the service selects.
            "spiffe://default/web-admin",
            // The legacy ID the dataplane is issued: that of its first inbound.
            "spiffe://default/web-main",
            // The provider-less MeshIdentity that selects the dataplane.
            "spiffe://next.example/app/web",
        ],
        "sorted, and without the identity the file lists"
    );
}

const SWITCHED: &str = r#"
type: Mesh
name: default
meshServices:
  mode: Exclusive
mtls:
  enabledBackend: ca-2
  secondaryBackends: [ca-1]
  backends:
    - name: ca-1
      type: builtin
      dpCert: {rotation: {expiration: 10h}}
    - name: ca-2
      type: builtin
      dpCert: {rotation: {expiration: 10h}}
"#;

const ONLY_CA2: &str = r#"
type: Mesh
name: default
meshServices:
  mode: Exclusive
mtls:
  enabledBackend: ca-2
  backends:
    - name: ca-2
      type: builtin
      dpCert: {rotation: {expiration: 10h}}
"#;

/// A harness with the gate on or off, with web-1 (stream 1) and web-2 (stream 2) on ca-1, all ACKed.
fn gated(gate: bool) -> Harness {
    let mut h = Harness::new(LEGACY);
    h.owner = replace_owner(&mut h, gate);
    h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    h.connect("web-2", &[], &[("kuma.io/service", "web")]);
    h.reconcile(t0());
    let g = generation(&h);
    h.ack(1, Some(g));
    h.ack(2, Some(g));
    h
}

fn replace_owner(h: &mut Harness, gate: bool) -> Owner {
    replace_owner_with(h, gate, Arc::new(NoTelemetry))
}

fn replace_owner_with(h: &mut Harness, gate: bool, telemetry: Arc<dyn Telemetry>) -> Owner {
    let world = load(LEGACY, &h.keystore, &h.settings, None).expect("valid");
    let (snapshot_tx, snapshots) = watch::channel(Arc::new(Snapshot::empty()));
    h.snapshots = snapshots;
    Owner::new(
        OwnerConfig {
            gate,
            ..OwnerConfig::from_settings(&h.settings)
        },
        world,
        telemetry,
        snapshot_tx,
    )
}

fn generation(h: &Harness) -> u64 {
    h.snapshots.borrow().generation
}

/// Subjects of the CAs in the mesh's bundle.
fn bundle_subjects(h: &Harness) -> Vec<String> {
    let snapshot = h.snapshots.borrow().clone();
    let pems = snapshot.meshes["default"].trust.by_trust_domain()["default"].clone();
    let mut subjects: Vec<String> = pems
        .iter()
        .map(|p| {
            meshca_ca::inspect_pem(p.as_bytes()).expect("pem")[0]
                .subject
                .clone()
        })
        .collect();
    subjects.sort();
    subjects
}

fn issuer_of(id: &ProxyIdentity) -> String {
    meshca_ca::inspect_pem(id.chain_pem.as_bytes()).expect("parses")[0]
        .issuer
        .clone()
}

fn ca_subject(h: &Harness, backend: &str) -> String {
    let world = h.owner.world().clone();
    let mesh = &world.meshes["default"];
    mesh.enabled_backend
        .iter()
        .chain(&mesh.secondary_backends)
        .find(|b| b.name == backend)
        .map(|b| b.ca.ca.subject().to_owned())
        .expect("backend loaded")
}

/// A reconcile that changes the trust publishes it in a snapshot of its own before it decides the
/// proxies: a large fleet gets its new bundles while the pass over every proxy runs.
#[test]
fn new_trust_is_published_before_the_pass_over_the_proxies() {
    let mut h = gated(true);
    let before = generation(&h);
    h.connect("web-3", &[], &[("kuma.io/service", "web")]);
    h.update(SWITCHED).expect("valid");
    h.owner.reconcile(t0() + Duration::from_secs(1));
    let snapshot = h.snapshots.borrow().clone();
    assert_eq!(
        snapshot.generation,
        before + 2,
        "two snapshots: trust, then proxies"
    );
    assert_eq!(snapshot.changed.since, before + 1);
    assert_eq!(
        snapshot.changed.proxies.as_deref(),
        Some(&[ProxyKey::new("default", "web-3")][..]),
        "the second changed only the new proxy: the trust was the first's"
    );
    assert!(bundle_subjects(&h).contains(&ca_subject(&h, "ca-2")));
    assert!(matches!(h.entry("web-3"), ProxyEntry::Pending));

    // A reconcile whose trust is unchanged publishes one snapshot, or none.
    h.owner.reconcile(t0() + Duration::from_secs(2));
    assert_eq!(generation(&h), before + 2);
}

#[test]
fn trust_before_identity_waits_for_every_trust_subscriber_to_ack() {
    let mut h = gated(true);
    let ca1 = issuer_of(&h.ready("web-1"));
    h.update(SWITCHED).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    let ca2 = ca_subject(&h, "ca-2");
    let g_trust = generation(&h);
    // The new CA is trusted at once, but issues nothing until every trust subscriber ACKed it.
    assert_eq!(bundle_subjects(&h), {
        let mut v = vec![ca1.clone(), ca2.clone()];
        v.sort();
        v
    });
    assert_eq!(issuer_of(&h.ready("web-1")), ca1);
    let status = h.status();
    let waits = waits_on(&status, RolloutStep::TrustBeforeIdentity);
    assert_eq!(waits.len(), 1, "one entry per wait: {:?}", status.rollout);
    assert_eq!(waits[0].waiting_for, ["default.web-1", "default.web-2"]);

    h.ack(1, Some(g_trust));
    assert!(
        h.owner.on_event(StreamEvent::Acked {
            stream: StreamId(1),
            generation: g_trust,
            version: String::new(),
        }),
        "an ACK matters while a rollout waits"
    );
    h.reconcile(t0() + Duration::from_secs(2));
    assert_eq!(
        issuer_of(&h.ready("web-1")),
        ca1,
        "web-2 has not ACKed the new trust yet"
    );
    let status = h.status();
    let waits = waits_on(&status, RolloutStep::TrustBeforeIdentity);
    assert_eq!(
        waits.len(),
        1,
        "a later reconcile lists the wait once: {:?}",
        status.rollout
    );
    assert_eq!(waits[0].waiting_for, ["default.web-2"]);
    assert_eq!(issuer_of(&h.ready("web-2")), ca1);

    h.ack(2, Some(g_trust));
    h.reconcile(t0() + Duration::from_secs(3));
    assert_eq!(issuer_of(&h.ready("web-1")), ca2);
    assert_eq!(issuer_of(&h.ready("web-2")), ca2);
}

#[test]
fn a_ca_removed_right_after_the_switch_stays_until_replacements_are_acked() {
    let mut h = gated(true);
    let ca1 = issuer_of(&h.ready("web-1"));
    // One edit switches, the next removes ca-1 at once.
    h.update(SWITCHED).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    h.update(ONLY_CA2).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    let ca2 = ca_subject(&h, "ca-2");
    assert!(
        bundle_subjects(&h).contains(&ca1),
        "removed while proxies present its certificates"
    );
    let g = generation(&h);
    h.ack(1, Some(g));
    h.ack(2, Some(g));
    h.reconcile(t0() + Duration::from_secs(2));
    // Both now hold ca-2 certificates, but have not ACKed them: ca-1 must stay.
    assert_eq!(issuer_of(&h.ready("web-1")), ca2);
    assert!(bundle_subjects(&h).contains(&ca1));
    let status = h.status();
    let wait = status
        .rollout
        .iter()
        .find(|w| w.step == RolloutStep::BreakLast)
        .expect("says what it waits for");
    assert_eq!((wait.ca.as_str(), wait.waiting_count), (ca1.as_str(), 2));

    let g_identity = generation(&h);
    h.ack(1, Some(g_identity));
    h.reconcile(t0() + Duration::from_secs(3));
    assert!(
        bundle_subjects(&h).contains(&ca1),
        "web-2 still may present ca-1"
    );
    h.ack(2, Some(g_identity));
    h.reconcile(t0() + Duration::from_secs(4));
    assert_eq!(bundle_subjects(&h), [ca2]);
    assert!(h.status().rollout.is_empty());
}

#[test]
fn a_proxy_that_never_acks_holds_the_rollout_only_until_the_ack_timeout() {
    let mut h = gated(true);
    let ca1 = issuer_of(&h.ready("web-1"));
    h.update(SWITCHED).expect("valid");
    let start = t0() + Duration::from_secs(1);
    let deadline = h.reconcile(start).expect("something is due");
    assert_eq!(
        deadline,
        start + Duration::from_secs(30),
        "rollout.ackTimeout defaults to 30s"
    );
    h.ack(1, Some(generation(&h)));
    h.reconcile(start + Duration::from_secs(29));
    assert_eq!(issuer_of(&h.ready("web-1")), ca1);
    h.reconcile(deadline);
    assert_ne!(
        issuer_of(&h.ready("web-1")),
        ca1,
        "the timeout lets the rollout proceed"
    );
}

/// A proxy that never ACKs holds the new trust until the timeout; the CA removed in the same change
/// stays trusted for a whole `ackTimeout` after that, while the other proxies move to the new CA:
/// its clock does not run while nobody can be moved off it.
#[test]
fn a_removed_ca_is_kept_for_a_whole_ack_timeout_after_a_trust_wait_timed_out() {
    let mut h = gated(true);
    let ca1 = issuer_of(&h.ready("web-1"));
    h.update(SWITCHED).expect("valid");
    h.update(ONLY_CA2).expect("valid");
    let start = t0() + Duration::from_secs(1);
    let deadline = h.reconcile(start).expect("something is due");
    h.ack(1, Some(generation(&h)));
    h.reconcile(deadline);
    let ca2 = ca_subject(&h, "ca-2");
    assert_eq!(
        issuer_of(&h.ready("web-1")),
        ca2,
        "the trust wait timed out"
    );
    assert!(
        bundle_subjects(&h).contains(&ca1),
        "web-1 has not ACKed its ca-2 certificate yet: its peers must still trust ca-1"
    );
    h.ack(1, Some(generation(&h)));
    let timeout = h.owner.gate.ack_timeout();
    h.reconcile(deadline + timeout - Duration::from_secs(1));
    assert!(
        bundle_subjects(&h).contains(&ca1),
        "web-2 never ACKs: ca-1 is kept until a whole ackTimeout after the trust was confirmed"
    );
    h.reconcile(deadline + timeout);
    assert_eq!(bundle_subjects(&h), [ca2], "then it goes");
}

#[test]
fn a_disconnected_proxy_blocks_nothing() {
    let mut h = gated(true);
    let ca1 = issuer_of(&h.ready("web-1"));
    h.update(SWITCHED).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    h.ack(1, Some(generation(&h)));
    // web-2 goes away without ever ACKing the new trust.
    assert!(h.disconnect(2));
    h.reconcile(t0() + Duration::from_secs(2));
    assert_ne!(issuer_of(&h.ready("web-1")), ca1);
}

#[test]
fn without_the_gate_identity_and_removal_happen_at_once() {
    let mut h = gated(false);
    h.update(SWITCHED).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    let ca2 = ca_subject(&h, "ca-2");
    assert_eq!(
        issuer_of(&h.ready("web-1")),
        ca2,
        "issued before anyone ACKed the new trust"
    );
    h.update(ONLY_CA2).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(
        bundle_subjects(&h),
        [ca2],
        "removed while proxies may still present it"
    );
}

/// The served certificate of `name` in `snapshot`, as DER.
fn chain_of(snapshot: &Snapshot, name: &str) -> Vec<Vec<u8>> {
    match snapshot.proxies.get(&ProxyKey::new("default", name)) {
        Some(ProxyEntry::Ready(id)) => ::pem::parse_many(id.chain_pem.as_bytes())
            .expect("pem")
            .iter()
            .map(|b| b.contents().to_vec())
            .collect(),
        other => panic!("{name} has no identity: {other:?}"),
    }
}

/// The mesh's trust anchors in `snapshot`, as DER.
fn anchors_of(snapshot: &Snapshot) -> Vec<Vec<u8>> {
    snapshot.meshes["default"].trust.by_trust_domain()["default"]
        .iter()
        .map(|p| ::pem::parse(p).expect("pem").contents().to_vec())
        .collect()
}

#[test]
fn automatic_ca_rotation_across_full_lifetimes_never_breaks_a_handshake() {
    let yaml = r#"
type: Mesh
name: default
meshServices:
  mode: Exclusive
mtls:
  enabledBackend: ca-1
  backends:
    - name: ca-1
      type: builtin
      dpCert: {rotation: {expiration: 24h}}
      conf: {caCert: {expiration: 60d}}
"#;
    let keystore = MemoryKeystore::new();
    let settings = Settings::default();
    let world = load(yaml, &keystore, &settings, None).expect("valid");
    let (snapshot_tx, snapshots) = watch::channel(Arc::new(Snapshot::empty()));
    let owner = Owner::new(
        OwnerConfig::from_settings(&settings),
        world,
        Arc::new(NoTelemetry),
        snapshot_tx,
    );
    let mut h = Harness {
        keystore,
        settings,
        owner,
        snapshots,
        next_stream: 0,
    };
    for name in ["fast-1", "fast-2", "slow-1"] {
        h.connect(name, &[], &[("kuma.io/service", "web")]);
    }
    let expected = "spiffe://default/web".parse().expect("valid id");
    let mut now = t0();
    let mut previous: Option<Arc<Snapshot>> = None;
    let mut issuers = std::collections::BTreeSet::new();
    let mut handshakes = 0;
    while now < t0() + Duration::from_secs(150 * 86_400) {
        // Fast proxies have applied and ACKed the latest snapshot; the slow one is a step behind.
        let latest = generation(&h);
        h.ack(1, Some(latest));
        h.ack(2, Some(latest));
        h.ack(3, previous.as_ref().map(|p| p.generation));
        if h.owner
            .world()
            .next_rotation_event()
            .is_some_and(|t| t <= now)
        {
            crate::rotate_cas(&mut h.owner, &h.settings, &h.keystore, now);
        }
        let next = h.reconcile(now).expect("connected proxies have renewals");
        let current = h.snapshots.borrow().clone();
        let slow_view = previous.clone().unwrap_or_else(|| current.clone());
        // Every pair handshakes both ways: each side's certificate against the other side's bundle.
        let proxies = [
            ("fast-1", &current),
            ("fast-2", &current),
            ("slow-1", &slow_view),
        ];
        for (a, sa) in proxies {
            for (b, sb) in proxies {
                if a == b {
                    continue;
                }
                meshca_ca::verify_svid(&chain_of(sa, a), &anchors_of(sb), &expected, now)
                    .unwrap_or_else(|e| {
                        panic!(
                            "{a} (generation {}) rejected by {b} (generation {}) at {now:?}: {e}",
                            sa.generation, sb.generation
                        )
                    });
                handshakes += 1;
            }
        }
        issuers.insert(issuer_of(&h.ready("fast-1")));
        previous = Some(current);
        now = next.clamp(
            now + Duration::from_secs(1),
            now + Duration::from_secs(86_400),
        );
    }
    assert!(
        issuers.len() >= 3,
        "150 days of a 60-day CA rotate it at least twice: {issuers:?}"
    );
    assert!(handshakes > 1000, "{handshakes}");
}

#[test]
fn mesh_service_tls_is_ready_once_every_selected_dataplane_holds_a_trusted_cert_and_stays_ready() {
    let services = format!("\n---\n{WEB_SERVICE}");
    let tls = |h: &Harness| {
        let status = h.status();
        status.meshes[0]
            .mesh_services
            .iter()
            .find(|s| s.name == "web")
            .expect("listed")
            .tls
    };
    let mut h = Harness::new(&format!("{LEGACY}{services}"));
    h.reconcile(t0());
    assert_eq!(
        tls(&h),
        ServiceTls::NotReady,
        "web-1 holds no certificate yet"
    );
    let stream = h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    h.reconcile(t0());
    assert_eq!(tls(&h), ServiceTls::Ready);
    h.owner.on_event(StreamEvent::Disconnected { stream });
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(
        tls(&h),
        ServiceTls::Ready,
        "stays Ready until mTLS is switched off"
    );
    h.update(&format!(
        "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\n{services}"
    ))
    .expect("valid");
    h.reconcile(t0() + Duration::from_secs(2));
    assert_eq!(tls(&h), ServiceTls::NotReady, "mTLS off");
}

#[test]
fn a_reconcile_that_changes_nothing_publishes_nothing() {
    let mut h = gated(true);
    let before = generation(&h);
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(
        generation(&h),
        before,
        "an unchanged snapshot would wake every stream for nothing"
    );
    // While a rollout waits, ACKs of unchanged content must not cause publishes either.
    h.update(SWITCHED).expect("valid");
    h.reconcile(t0() + Duration::from_secs(2));
    let waiting = generation(&h);
    assert!(waiting > before);
    h.ack(1, Some(waiting));
    h.reconcile(t0() + Duration::from_secs(3));
    assert_eq!(
        generation(&h),
        waiting,
        "web-2 still holds the rollout; nothing new to serve"
    );
}

/// The issuer of the certificate `mesh.name` is served.
fn served_issuer(h: &Harness, mesh: &str, name: &str) -> String {
    match h.snapshots.borrow().proxies.get(&ProxyKey::new(mesh, name)) {
        Some(ProxyEntry::Ready(id)) => issuer_of(id),
        other => panic!("{mesh}.{name} has no identity: {other:?}"),
    }
}

#[test]
fn the_egress_bundle_is_not_the_trust_of_a_mesh_named_egress() {
    // A mesh named `egress` rotates its CA. A sidecar of another mesh that subscribes to
    // `system_trust_bundle_egress` (the zone egress's CAs) does not carry that mesh's trust, so the gate
    // must not wait for it.
    let meshes = r#"
type: Mesh
name: default
meshServices:
  mode: Exclusive
---
type: Mesh
name: egress
meshServices:
  mode: Exclusive
mtls:
  enabledBackend: ca-1
  backends:
    - name: ca-1
      type: builtin
    - name: ca-2
      type: builtin
"#;
    let mut h = Harness::new(meshes);
    h.connect_in("egress", "e-1", &[], &[("kuma.io/service", "e")]);
    h.connect_in("default", "d-1", &[], &[("kuma.io/service", "d")]);
    h.reconcile(t0());
    let g = generation(&h);
    h.stream(1, &["default", "system_trust_bundle"], Some(g));
    h.stream(2, &["system_trust_bundle_egress"], Some(g));
    let ca1 = served_issuer(&h, "egress", "e-1");

    h.update(&meshes.replace(
        "enabledBackend: ca-1",
        "enabledBackend: ca-2\n  secondaryBackends: [ca-1]",
    ))
    .expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    let g_trust = generation(&h);
    // Only e-1 carries mesh egress's trust; d-1 never ACKs anything new.
    h.stream(1, &["default", "system_trust_bundle"], Some(g_trust));
    h.reconcile(t0() + Duration::from_secs(2));
    assert_ne!(
        served_issuer(&h, "egress", "e-1"),
        ca1,
        "the new CA issues once every stream carrying its trust ACKed it"
    );
    let status = h.status();
    assert!(
        status
            .rollout
            .iter()
            .all(|w| w.step != RolloutStep::TrustBeforeIdentity),
        "nothing waits for d-1: {:?}",
        status.rollout
    );
}

/// Runs the certificates the owner holds for issuing and hands their results back at `at`; returns how
/// many there were.
fn issue_held(h: &mut Harness, at: SystemTime) -> usize {
    let jobs = h.owner.take_jobs();
    let done = crate::pool::run_all(&jobs, 2, crate::owner::run_job);
    h.owner.on_issued(done, at);
    jobs.len()
}

/// Connects web-3 with a stream that asks only for the trust bundle (so it is quiet once it holds its
/// certificate), reconciles at t0 and ACKs; returns its stream.
fn connect_quiet(h: &mut Harness) -> StreamId {
    let quiet = h.connect("web-3", &[], &[("kuma.io/service", "web")]);
    h.reconcile(t0());
    h.stream(quiet.0, &["system_trust_bundle"], Some(generation(h)));
    quiet
}

/// When a trust wait ends, the proxies whose streams ask for their certificate are decided, issued and
/// published first; a quiet one (it holds a certificate no stream asks for) keeps its certificate until
/// the loop's next turns serve it, and then rotates too.
#[test]
fn quiet_proxies_are_served_after_those_waiting_for_their_certificate() {
    let mut h = gated(true);
    let quiet = connect_quiet(&mut h);
    let ca1 = issuer_of(&h.ready("web-3"));
    h.update(SWITCHED).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    assert!(
        !h.owner.has_deferred(),
        "while ca-2 waits for ACKs, web-3 waits for the end of the wait, not for a turn"
    );
    let g_trust = generation(&h);
    h.ack(1, Some(g_trust));
    h.ack(2, Some(g_trust));
    h.stream(quiet.0, &["system_trust_bundle"], Some(g_trust));
    // The wait is over: the reconcile the loop runs for it.
    let at = t0() + Duration::from_secs(2);
    h.owner.reconcile(at);
    assert!(h.owner.has_deferred(), "web-3 is left for later");
    assert_eq!(
        issue_held(&mut h, at),
        2,
        "web-1 and web-2 are issued first"
    );
    let ca2 = ca_subject(&h, "ca-2");
    assert_eq!(issuer_of(&h.ready("web-1")), ca2);
    assert_eq!(issuer_of(&h.ready("web-2")), ca2);
    assert_eq!(
        issuer_of(&h.ready("web-3")),
        ca1,
        "web-3 keeps its certificate until its turn"
    );
    while h.owner.has_deferred() {
        h.owner.serve_deferred(at);
    }
    assert_eq!(
        issue_held(&mut h, at),
        1,
        "web-3's turn issues its certificate"
    );
    assert_eq!(issuer_of(&h.ready("web-3")), ca2);
}

/// While a wave of certificates for proxies that wait for them is being issued and delivered, the quiet
/// proxies keep theirs: their turn comes once the issuance threads run short of work and the wave's
/// proxies have ACKed their new certificates, so deciding them takes no CPU from the wave.
#[test]
fn quiet_proxies_wait_while_a_wave_is_being_issued() {
    let mut h = gated(true);
    // With web-1 and web-2, more proxies waiting for their certificate than the loop lets be in flight
    // before it serves deferred ones.
    let waiting = super::incremental::DEFERRED_WHILE_ISSUING;
    let streams: Vec<u64> = (0..waiting - 2)
        .map(|i| {
            h.connect(&format!("svc-{i}"), &[], &[("kuma.io/service", "svc")])
                .0
        })
        .collect();
    let quiet = h.connect("web-3", &[], &[("kuma.io/service", "web")]);
    h.reconcile(t0());
    let g = generation(&h);
    for &id in &streams {
        h.ack(id, Some(g));
    }
    h.stream(quiet.0, &["system_trust_bundle"], Some(g));
    let ca1 = issuer_of(&h.ready("web-3"));
    h.update(SWITCHED).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    let g_trust = generation(&h);
    for id in [1, 2].into_iter().chain(streams.iter().copied()) {
        h.ack(id, Some(g_trust));
    }
    h.stream(quiet.0, &["system_trust_bundle"], Some(g_trust));
    let at = t0() + Duration::from_secs(2);
    h.owner.reconcile(at);
    assert!(h.owner.has_deferred(), "web-3 is left for later");
    assert!(
        !h.owner.deferred_due(),
        "its turn waits while {waiting} certificates are being issued"
    );
    assert_eq!(issue_held(&mut h, at), waiting);
    assert!(
        !h.owner.deferred_due(),
        "the wave is issued, and on its way to {waiting} proxies"
    );
    let g_wave = generation(&h);
    let delivering = super::incremental::DEFERRED_WHILE_DELIVERING;
    let wave: Vec<u64> = [1, 2].into_iter().chain(streams.iter().copied()).collect();
    let (acked, last) = wave.split_at(waiting - delivering);
    // The loop reconciles after a batch of ACKs, which forgets the certificates they replaced.
    for &id in acked {
        h.ack(id, Some(g_wave));
    }
    h.owner.reconcile(at);
    assert!(
        !h.owner.deferred_due(),
        "{delivering} proxies have not ACKed theirs"
    );
    h.ack(last[0], Some(g_wave));
    h.owner.reconcile(at);
    assert!(
        h.owner.deferred_due(),
        "the wave is delivered: web-3's turn"
    );
    assert_eq!(issuer_of(&h.ready("web-3")), ca1);
    h.owner.serve_deferred(at);
    assert_eq!(
        issue_held(&mut h, at),
        1,
        "web-3's turn issues its certificate"
    );
    assert_eq!(issuer_of(&h.ready("web-3")), ca_subject(&h, "ca-2"));
}

/// A full reconcile after the dataplanes' files changed defers nobody: any proxy's description may have
/// changed, and with it what it may hold.
#[test]
fn no_proxy_is_deferred_when_the_dataplanes_may_have_changed() {
    let mut h = gated(true);
    connect_quiet(&mut h);
    let dataplane = r#"
type: Dataplane
mesh: default
name: web-9
networking:
  address: 10.0.0.9
  inbound:
    - port: 8080
      tags: {kuma.io/service: web}
"#;
    h.update(&format!("{LEGACY}---\n{dataplane}"))
        .expect("valid");
    h.owner.reconcile(t0() + Duration::from_secs(1));
    assert!(!h.owner.has_deferred());
}

/// Switches the mesh to ca-2 at t0 + 1 s; streams 1 and 2 ACK its trust and the owner reconciles at
/// t0 + 2 s, when the gate lets ca-2 issue.
fn switch_and_ack_trust(h: &mut Harness) {
    h.update(SWITCHED).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    let g_trust = generation(h);
    h.ack(1, Some(g_trust));
    h.ack(2, Some(g_trust));
    h.reconcile(t0() + Duration::from_secs(2));
}

#[test]
fn an_unknown_name_carries_no_trust_and_is_no_identity() {
    let mut h = gated(true);
    let ca1 = issuer_of(&h.ready("web-1"));
    // web-1 opens a third stream asking for a name meshca does not serve; nothing is ever sent on it, so
    // it never ACKs.
    let (odd, _) = h.try_connect("web-1", &[], &[("kuma.io/service", "web")]);
    h.stream(odd.0, &["no-such-secret"], None);
    switch_and_ack_trust(&mut h);
    let ca2 = ca_subject(&h, "ca-2");
    assert_eq!(
        issuer_of(&h.ready("web-1")),
        ca2,
        "trust before identity does not wait for the unknown name"
    );
    h.update(ONLY_CA2).expect("valid");
    h.reconcile(t0() + Duration::from_secs(3));
    assert!(
        bundle_subjects(&h).contains(&ca1),
        "replacements not ACKed yet"
    );
    let g_identity = generation(&h);
    h.ack(1, Some(g_identity));
    h.ack(2, Some(g_identity));
    h.reconcile(t0() + Duration::from_secs(4));
    assert_eq!(
        bundle_subjects(&h),
        [ca2],
        "break last does not count the unknown name as a stream that must ACK the new certificate"
    );
    assert!(h.status().rollout.is_empty());
}

/// Telemetry that keeps the gate's events, the scope of each reconcile, and the rollout steps that
/// began and ended.
#[derive(Debug, Default)]
struct Recorder(
    std::sync::Mutex<Vec<(String, GateEvent)>>,
    std::sync::Mutex<Vec<Scope>>,
    std::sync::Mutex<Vec<crate::StepChange>>,
);

impl Telemetry for Recorder {
    fn gate_event(&self, mesh: &str, event: GateEvent) {
        self.0
            .lock()
            .expect("not poisoned")
            .push((mesh.to_owned(), event));
    }

    fn reconciled(&self, scope: Scope, _proxies: usize, _took: Duration) {
        self.1.lock().expect("not poisoned").push(scope);
    }

    fn rollout_step(&self, change: &crate::StepChange) {
        self.2.lock().expect("not poisoned").push(change.clone());
    }
}

/// A gated owner whose telemetry is recorded, with web-1 and web-2 connected (streams 1 and 2) and not
/// reconciled yet.
fn recorded_web_pair() -> (Harness, Arc<Recorder>) {
    let recorder = Arc::new(Recorder::default());
    let mut h = Harness::new(LEGACY);
    h.owner = replace_owner_with(&mut h, true, recorder.clone());
    h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    h.connect("web-2", &[], &[("kuma.io/service", "web")]);
    (h, recorder)
}

#[test]
fn an_identity_ack_wait_names_who_has_not_acked_and_an_ack_settles_only_its_own_proxy() {
    let (mut h, recorder) = recorded_web_pair();
    h.reconcile(t0());
    let ca1 = issuer_of(&h.ready("web-1"));
    h.ack(1, Some(generation(&h)));
    h.ack(2, Some(generation(&h)));
    switch_and_ack_trust(&mut h);
    let ca2 = ca_subject(&h, "ca-2");
    assert_eq!(issuer_of(&h.ready("web-2")), ca2);
    let waiting = |h: &Harness| {
        let status = h.status();
        let waits = waits_on(&status, RolloutStep::IdentityAck);
        assert_eq!(waits.len(), 1, "{waits:?}");
        assert_eq!(waits[0].ca, ca1, "the wait is on the replaced CA");
        assert_eq!(waits[0].waiting_count, waits[0].waiting_for.len());
        waits[0].waiting_for.clone()
    };
    assert_eq!(waiting(&h), ["default.web-1", "default.web-2"]);

    assert!(h.ack_only(1, generation(&h)));
    h.reconcile(t0() + Duration::from_secs(3));
    assert_eq!(
        recorder.1.lock().expect("not poisoned").last(),
        Some(&Scope::Acks),
        "an ACK that settles a proxy whose old CA stays configured reconciles no proxy"
    );
    assert_eq!(waiting(&h), ["default.web-2"], "web-1 ACKed; web-2 has not");
    assert!(bundle_subjects(&h).contains(&ca1));

    h.update(ONLY_CA2).expect("valid");
    h.reconcile(t0() + Duration::from_secs(4));
    assert_eq!(waiting(&h), ["default.web-2"]);
    assert!(
        bundle_subjects(&h).contains(&ca1),
        "web-2 may still present its ca-1 certificate (break last)"
    );
    assert!(h.ack_only(2, generation(&h)));
    h.reconcile(t0() + Duration::from_secs(5));
    assert_eq!(bundle_subjects(&h), [ca2], "the last ACK lets ca-1 go");
    assert!(h.status().rollout.is_empty());
}

#[test]
fn the_status_of_one_dataplane_lists_its_streams_and_what_they_acked() {
    let (mut h, _) = recorded_web_pair();
    h.reconcile(t0());
    let g = generation(&h);
    h.ack(1, Some(g));
    h.stream(2, &["default"], None);
    let one = |name: &str| {
        let key = ProxyKey::new("default", name);
        h.owner.status(t0(), Detail::Dataplane(key)).dataplanes
    };
    let web1 = one("web-1");
    assert_eq!(web1.len(), 1, "{web1:?}");
    assert_eq!(web1[0].name, "web-1");
    assert_eq!(web1[0].services, ["web"]);
    let streams = &web1[0].stream_details;
    assert_eq!(streams.len(), 1, "{streams:?}");
    assert_eq!(streams[0].resources, ["default", "system_trust_bundle"]);
    assert_eq!(streams[0].acked_generation, Some(g));
    assert_eq!(
        streams[0].acked_version.as_deref(),
        Some(format!("v{g}").as_str())
    );
    let web2 = one("web-2");
    assert_eq!(web2[0].stream_details[0].acked_version, None, "{web2:?}");
    assert!(one("nobody").is_empty());
    assert!(
        h.status()
            .dataplanes
            .iter()
            .all(|d| d.stream_details.is_empty()),
        "the full status lists no streams"
    );
}

#[test]
fn every_rollout_step_that_waits_is_counted_once() {
    let (mut h, recorder) = recorded_web_pair();
    let mut at = t0();
    let mut reconcile = |h: &mut Harness| {
        at += Duration::from_secs(1);
        h.reconcile(at);
        generation(h)
    };
    let g = reconcile(&mut h);
    h.ack(1, Some(g));
    h.ack(2, Some(g));
    h.update(SWITCHED).expect("valid");
    reconcile(&mut h);
    let g_trust = reconcile(&mut h);
    h.ack(1, Some(g_trust));
    h.ack(2, Some(g_trust));
    reconcile(&mut h);
    h.update(ONLY_CA2).expect("valid");
    reconcile(&mut h);
    let g_identity = reconcile(&mut h);
    h.ack(1, Some(g_identity));
    h.ack(2, Some(g_identity));
    reconcile(&mut h);
    assert!(h.status().rollout.is_empty(), "the rollout finished");
    for step in [
        RolloutStep::TrustBeforeIdentity,
        RolloutStep::IdentityAck,
        RolloutStep::BreakLast,
    ] {
        assert_eq!(waits_started(&recorder, step), 1, "{step} waited once");
    }
    // The timeline's view of the same rollout: each step began once, waiting for both proxies, and
    // ended once, in the order of the rollout; break last began only after trust before identity ended.
    let changes = recorder.2.lock().expect("not poisoned").clone();
    let position = |step: RolloutStep, began: bool| {
        let found: Vec<usize> = (0..changes.len())
            .filter(|&i| {
                changes[i].step == step
                    && changes[i].mesh == "default"
                    && matches!(changes[i].phase, crate::StepPhase::Began { .. }) == began
            })
            .collect();
        assert_eq!(found.len(), 1, "{step} began={began} once: {changes:?}");
        found[0]
    };
    for step in [
        RolloutStep::TrustBeforeIdentity,
        RolloutStep::IdentityAck,
        RolloutStep::BreakLast,
    ] {
        assert!(position(step, true) < position(step, false), "{changes:?}");
    }
    assert!(
        position(RolloutStep::TrustBeforeIdentity, false) < position(RolloutStep::BreakLast, true),
        "{changes:?}"
    );
    let trust_began = &changes[position(RolloutStep::TrustBeforeIdentity, true)];
    assert_eq!(
        trust_began.phase,
        crate::StepPhase::Began { waiting: 2 },
        "{changes:?}"
    );
    assert_eq!(changes.len(), 6, "nothing else began or ended: {changes:?}");
}

/// The status's waits on `step`.
fn waits_on(status: &Status, step: RolloutStep) -> Vec<&Wait> {
    status.rollout.iter().filter(|w| w.step == step).collect()
}

/// How many times the gate started waiting on `step` in mesh `default`; fails if any wait timed out.
fn waits_started(recorder: &Recorder, step: RolloutStep) -> usize {
    let events = recorder.0.lock().expect("not poisoned").clone();
    assert!(
        !events
            .iter()
            .any(|(_, e)| matches!(e, GateEvent::TimedOut(_))),
        "{events:?}"
    );
    events
        .iter()
        .filter(|(mesh, e)| mesh == "default" && *e == GateEvent::WaitStarted(step))
        .count()
}

#[test]
fn a_sans_before_identity_wait_is_counted_once_and_names_the_proxy_it_waits_for() {
    let recorder = Arc::new(Recorder::default());
    let resources = |path: &str| {
        format!(
            "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\n---\n{}---\n{WEB_SERVICE}",
            workloads_identity(path, true)
        )
    };
    let subscriptions = ["default", "system_trust_bundle", "meshservice:web"];
    let mut h = Harness::with_telemetry(&resources("/a/{{ .Workload }}"), recorder.clone());
    h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    h.connect("client-1", &[], &[("kuma.io/service", "client")]);
    h.reconcile(t0());
    h.ack(1, Some(generation(&h)));
    h.stream(2, &subscriptions, Some(generation(&h)));
    h.reconcile(t0());

    // web-1's new ID waits for client-1, through reconciles and through an ACK that is not client-1's.
    h.update(&resources("/b/{{ .Workload }}")).expect("valid");
    let changed_at = t0() + Duration::from_secs(1);
    for second in 1..=3 {
        h.reconcile(t0() + Duration::from_secs(second));
    }
    h.ack(1, Some(generation(&h)));
    h.reconcile(t0() + Duration::from_secs(4));
    assert_eq!(h.ready("web-1").spiffe_id, "spiffe://default/a/web-1");
    let status = h.status();
    let waits = waits_on(&status, RolloutStep::SansBeforeIdentity);
    assert_eq!(waits.len(), 1, "one wait, shown once: {:?}", status.rollout);
    let wait = waits[0];
    assert_eq!(wait.mesh.to_string(), "default");
    assert_eq!(wait.ca, "spiffe://default/b/web-1 in meshservice:web");
    assert_eq!(wait.since, crate::timefmt::rfc3339(changed_at));
    assert_eq!(wait.waiting_for, ["default.client-1"]);
    assert_eq!(wait.waiting_count, 1);

    h.stream(2, &subscriptions, Some(generation(&h)));
    h.reconcile(t0() + Duration::from_secs(5));
    assert_eq!(h.ready("web-1").spiffe_id, "spiffe://default/b/web-1");
    assert!(h
        .status()
        .rollout
        .iter()
        .all(|w| w.step != RolloutStep::SansBeforeIdentity));
    assert_eq!(
        waits_started(&recorder, RolloutStep::SansBeforeIdentity),
        1,
        "sans-before-identity waited once"
    );
}

#[test]
fn a_changed_spiffe_id_leaves_its_service_context_only_once_the_proxy_acked_its_replacement() {
    // Neither path is the ServiceTag ID `spiffe://default/web`: once the template changes, an old ID is
    // in the context only because a replaced certificate may still be presented.
    let resources = |path: &str| {
        format!(
            "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\n---\n{}---\n{WEB_SERVICE}",
            workloads_identity(path, true)
        )
    };
    let context = |h: &Harness| service_context(h, "web");
    let (old_1, old_2) = ("spiffe://default/a/web-1", "spiffe://default/a/web-2");
    let (new_1, new_2) = ("spiffe://default/b/web-1", "spiffe://default/b/web-2");
    let service_tag = "spiffe://default/web";
    let mut h = Harness::new(&resources("/a/{{ .Workload }}"));
    h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    h.connect("web-2", &[], &[("kuma.io/service", "web")]);
    h.reconcile(t0());
    let g = generation(&h);
    h.ack(1, Some(g));
    h.ack(2, Some(g));
    h.reconcile(t0());
    assert_eq!(context(&h), [old_1, old_2, service_tag]);

    // Same CA, another path. No stream subscribes to `meshservice:web`, so nothing holds the new IDs
    // back: both proxies are reissued at once, and present the old IDs until they ACK.
    h.update(&resources("/b/{{ .Workload }}")).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(h.ready("web-1").spiffe_id, new_1);
    assert_eq!(h.ready("web-2").spiffe_id, new_2);
    let all = [old_1, old_2, new_1, new_2, service_tag];
    assert_eq!(context(&h), all, "the replaced IDs stay until the ACKs");
    // A proxy connecting while replacements are unACKed reconciles everyone: the contexts are
    // computed again, and still keep the replaced IDs.
    h.connect("client-1", &[], &[("kuma.io/service", "client")]);
    h.reconcile(t0() + Duration::from_secs(2));
    assert_eq!(context(&h), all, "a reconcile without the ACKs keeps them");

    h.ack(1, Some(generation(&h)));
    h.reconcile(t0() + Duration::from_secs(3));
    assert_eq!(
        context(&h),
        [old_2, new_1, new_2, service_tag],
        "web-1 ACKed its new certificate: its old ID leaves; web-2's stays"
    );

    let timeout = h.owner.gate.ack_timeout();
    h.reconcile(t0() + Duration::from_secs(1) + timeout);
    assert_eq!(
        context(&h),
        [new_1, new_2, service_tag],
        "rollout.ackTimeout bounds the wait for web-2's ACK"
    );
}

#[test]
fn a_new_spiffe_id_waits_for_the_meshservice_subscribers_before_it_is_presented() {
    let resources = |path: &str| {
        format!(
            "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\n---\n{}---\n{WEB_SERVICE}",
            workloads_identity(path, true)
        )
    };
    let subscriptions = ["default", "system_trust_bundle", "meshservice:web"];
    let mut h = Harness::new(&resources("/a/{{ .Workload }}"));
    h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    h.connect("client-1", &[], &[("kuma.io/service", "client")]);
    h.reconcile(t0());
    h.ack(1, Some(generation(&h)));
    h.stream(2, &subscriptions, Some(generation(&h)));
    h.reconcile(t0());
    let old_id = h.ready("web-1").spiffe_id.clone();
    assert_eq!(old_id, "spiffe://default/a/web-1");

    // Same CA, another path: only the SPIFFE ID changes.
    h.update(&resources("/b/{{ .Workload }}")).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    let new_id = "spiffe://default/b/web-1";
    let context = |h: &Harness| service_context(h, "web");
    let service_tag = "spiffe://default/web";
    assert_eq!(
        context(&h),
        [old_id.as_str(), new_id, service_tag],
        "the new ID is accepted first"
    );
    assert_eq!(h.ready("web-1").spiffe_id, old_id, "and not presented yet");
    let status = h.status();
    let wait = status
        .rollout
        .iter()
        .find(|w| w.step == RolloutStep::SansBeforeIdentity)
        .expect("the wait is shown");
    assert_eq!(wait.waiting_for, ["default.client-1"]);

    // web-1's own ACK is not what the step waits for; client-1's is.
    h.ack(1, Some(generation(&h)));
    h.reconcile(t0() + Duration::from_secs(2));
    assert_eq!(h.ready("web-1").spiffe_id, old_id);
    h.stream(2, &subscriptions, Some(generation(&h)));
    h.reconcile(t0() + Duration::from_secs(3));
    assert_eq!(h.ready("web-1").spiffe_id, new_id);
    assert!(h
        .status()
        .rollout
        .iter()
        .all(|w| w.step != RolloutStep::SansBeforeIdentity));
    // Break last: the old ID stays until web-1 has ACKed the certificate with the new one.
    assert_eq!(context(&h), [old_id.as_str(), new_id, service_tag]);
    h.ack(1, Some(generation(&h)));
    h.reconcile(t0() + Duration::from_secs(4));
    assert_eq!(context(&h), [new_id, service_tag]);
}

#[test]
fn a_subscriber_that_never_acks_holds_a_new_spiffe_id_back_only_until_the_ack_timeout() {
    let resources = |path: &str| {
        format!(
            "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\n---\n{}---\n{WEB_SERVICE}",
            workloads_identity(path, false)
        )
    };
    let mut h = Harness::new(&resources("/a/{{ .Workload }}"));
    h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    h.connect("client-1", &[], &[("kuma.io/service", "client")]);
    h.reconcile(t0());
    h.ack(1, Some(generation(&h)));
    h.stream(2, &["meshservice:web"], Some(generation(&h)));
    h.reconcile(t0());
    h.update(&resources("/b/{{ .Workload }}")).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(h.ready("web-1").spiffe_id, "spiffe://default/a/web-1");
    let timeout = h.owner.gate.ack_timeout();
    h.reconcile(t0() + Duration::from_secs(1) + timeout);
    assert_eq!(
        h.ready("web-1").spiffe_id,
        "spiffe://default/b/web-1",
        "rollout.ackTimeout bounds the wait"
    );
}

#[test]
fn a_provider_less_mesh_identity_publishes_its_spiffe_ids_in_service_contexts_and_issues_nothing() {
    let yaml = format!(
        "{LEGACY}---\n{WEB_SERVICE}{}",
        r#"---
type: MeshIdentity
name: staged
mesh: default
spec:
  selector: {dataplane: {matchLabels: {app: web}}}
  spiffeID: {trustDomain: default, path: "/staged/{{ .Workload }}"}
---
type: MeshIdentity
name: elsewhere
mesh: default
spec:
  selector: {dataplane: {matchLabels: {app: db}}}
  spiffeID: {trustDomain: default, path: "/db/{{ .Workload }}"}
"#
    );
    let mut h = Harness::new(&yaml);
    h.connect("web-1", &[("app", "web")], &[("kuma.io/service", "web")]);
    h.reconcile(t0());
    assert_eq!(
        h.ready("web-1").spiffe_id,
        "spiffe://default/web",
        "the legacy backend still issues"
    );
    assert_eq!(
        service_context(&h, "web"),
        ["spiffe://default/staged/web-1", "spiffe://default/web"],
        "the staged ID is accepted before anyone presents it; a MeshIdentity that does not select web-1 adds nothing"
    );
    assert_eq!(
        conditions(&h.status(), "staged"),
        SPIFFE_ID_ONLY_CONDITIONS,
        "Kuma's conditions for SPIFFE-ID-only mode"
    );
}

/// Kuma's conditions of a MeshIdentity without a provider, each as [type, status, reason, message].
const SPIFFE_ID_ONLY_CONDITIONS: [[&str; 4]; 2] = [
    [
        "SpiffeIDProvider",
        "True",
        "SpiffeIDProvided",
        "Providing only SpiffeIDs for services.",
    ],
    [
        "Ready",
        "False",
        "PartiallyReady",
        "Running in SpiffeID providing only mode.",
    ],
];

/// The conditions of MeshIdentity `name` of mesh `default`, each as [type, status, reason, message].
fn conditions(status: &Status, name: &str) -> Vec<[String; 4]> {
    let mesh = status
        .meshes
        .iter()
        .find(|m| m.name == "default")
        .expect("mesh default is listed");
    let identity = mesh
        .mesh_identities
        .iter()
        .find(|i| i.name == name)
        .unwrap_or_else(|| panic!("MeshIdentity {name} is listed"));
    identity
        .conditions
        .iter()
        .map(|c| {
            [
                c.kind.clone(),
                c.status.clone(),
                c.reason.clone(),
                c.message.clone(),
            ]
        })
        .collect()
}

#[test]
fn each_kind_of_mesh_identity_reports_its_conditions() {
    let yaml = format!(
        "{LEGACY}---\n{}---\n{}",
        workloads_identity("/workload/{{ .Workload }}", true),
        r#"type: MeshIdentity
name: staged
mesh: default
spec:
  selector: {dataplane: {matchLabels: {app: web}}}
---
type: MeshIdentity
name: spire
mesh: default
spec:
  selector: {dataplane: {matchLabels: {team: spire}}}
  provider: {type: Spire}
"#
    );
    let h = Harness::new(&yaml);
    let status = h.status();
    assert_eq!(
        conditions(&status, "workloads"),
        [
            [
                "Provider",
                "True",
                "ProviderInitialized",
                "Provider successfully initialized"
            ],
            [
                "MeshTrustCreated",
                "True",
                "MeshTrustCreated",
                "MeshTrust has been successfully created"
            ],
            ["Ready", "True", "Ready", "Successfully initialized"]
        ],
        "a Bundled identity issues, with Kuma's conditions"
    );
    assert_eq!(conditions(&status, "staged"), SPIFFE_ID_ONLY_CONDITIONS);
    assert_eq!(
        conditions(&status, "spire"),
        [
            [
                "Provider",
                "True",
                "ProviderInitialized",
                "Provider successfully initialized"
            ],
            [
                "Ready",
                "True",
                "ManagedExternally",
                "certificates are issued by SPIRE"
            ]
        ]
    );
}

/// Dataplane `web-1` (labelled `app: web`, serving `web`) and the MeshService `web` selecting it.
const WEB_SERVICE: &str = "type: Dataplane\nmesh: default\nname: web-1\nlabels: {app: web, kuma.io/workload: web-1}\nnetworking:\n  inbound: [{port: 8080, tags: {kuma.io/service: web}}]\n---\ntype: MeshService\nname: web\nmesh: default\nspec:\n  selector: {dataplaneTags: {kuma.io/service: web}}\n  ports: [{port: 80, targetPort: 8080}]\n";

/// MeshIdentity `workloads` selecting every dataplane of mesh `default`, with SPIFFE ID path `path` and
/// an autogenerated CA (whose trust the mesh bundles carry when `mesh_trust`).
fn workloads_identity(path: &str, mesh_trust: bool) -> String {
    let creation = if mesh_trust {
        "meshTrustCreation: Enabled, "
    } else {
        ""
    };
    format!(
        "type: MeshIdentity\nname: workloads\nmesh: default\nspec:\n  selector: {{dataplane: {{matchLabels: {{}}}}}}\n  spiffeID: {{trustDomain: default, path: \"{path}\"}}\n  provider: {{type: Bundled, bundled: {{{creation}autogenerate: {{enabled: true}}}}}}\n"
    )
}

/// The SPIFFE IDs the `meshservice:<service>` context of mesh `default` accepts now.
fn service_context(h: &Harness, service: &str) -> Vec<String> {
    let snapshot = h.snapshots.borrow().clone();
    snapshot.meshes["default"].mesh_services[service]
        .spiffe_ids()
        .iter()
        .cloned()
        .collect()
}

mod agents;
mod egress;
mod events;
mod kuma;
mod peers;
mod selection;
mod trust;

/// Mesh `default` on builtin backends: `enabled` issues, `secondary` stays trusted; ca-1 to ca-3 defined
/// unless `without` names one.
fn three_cas(enabled: &str, secondary: Option<&str>, without: Option<&str>) -> String {
    let backends: String = ["ca-1", "ca-2", "ca-3"]
        .iter()
        .filter(|b| Some(**b) != without)
        .map(|b| format!("    - {{name: {b}, type: builtin}}\n"))
        .collect();
    let secondary = secondary
        .map(|s| format!("  secondaryBackends: [{s}]\n"))
        .unwrap_or_default();
    format!("type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\nmtls:\n  enabledBackend: {enabled}\n{secondary}  backends:\n{backends}")
}

#[test]
fn a_proxy_reissued_twice_before_acking_keeps_the_ca_it_still_presents_trusted() {
    let mut h = Harness::new(&three_cas("ca-1", None, None));
    // web-1 takes its identity on one stream and the mesh trust on another; only the trust stream ACKs
    // from the steady state on, as a slow proxy whose certificate updates lag behind.
    h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    // A second stream of a connected proxy changes nothing by itself.
    h.try_connect("web-1", &[], &[("kuma.io/service", "web")]);
    h.reconcile(t0());
    let g = generation(&h);
    h.stream(1, &["default"], Some(g));
    h.stream(2, &["system_trust_bundle"], Some(g));
    h.reconcile(t0());
    let ca1 = ca_subject(&h, "ca-1");
    assert_eq!(issuer_of(&h.ready("web-1")), ca1);

    // ca-2 issues; web-1 is given a ca-2 certificate but does not ACK it.
    h.update(&three_cas("ca-2", Some("ca-1"), None))
        .expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    h.stream(2, &["system_trust_bundle"], Some(generation(&h)));
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(issuer_of(&h.ready("web-1")), ca_subject(&h, "ca-2"));

    // ca-3 issues and ca-1 is removed; web-1 is given a ca-3 certificate, still without ACKing.
    h.update(&three_cas("ca-3", Some("ca-2"), Some("ca-1")))
        .expect("valid");
    h.reconcile(t0() + Duration::from_secs(2));
    h.stream(2, &["system_trust_bundle"], Some(generation(&h)));
    h.reconcile(t0() + Duration::from_secs(2));
    assert_eq!(issuer_of(&h.ready("web-1")), ca_subject(&h, "ca-3"));
    // web-1 still presents its ca-1 certificate (it ACKed nothing since): ca-1 stays trusted, in this
    // snapshot and the next ones.
    h.stream(2, &["system_trust_bundle"], Some(generation(&h)));
    h.reconcile(t0() + Duration::from_secs(2));
    assert!(
        bundle_subjects(&h).contains(&ca1),
        "{:?}",
        bundle_subjects(&h)
    );

    h.stream(1, &["default"], Some(generation(&h)));
    h.reconcile(t0() + Duration::from_secs(3));
    assert!(
        !bundle_subjects(&h).contains(&ca1),
        "{:?}",
        bundle_subjects(&h)
    );
}

#[test]
fn a_wave_of_issuance_is_one_info_line_per_mesh_and_issuer() {
    let mut h = Harness::new(LEGACY);
    for name in ["web-1", "web-2", "web-3"] {
        h.connect(name, &[], &[("kuma.io/service", "web")]);
    }
    let ((), info) = crate::test_certs::logged(tracing::Level::INFO, || {
        h.reconcile(t0());
    });
    let lines: Vec<&str> = info.lines().filter(|l| l.contains("issued")).collect();
    assert_eq!(lines.len(), 1, "{info}");
    assert!(
        lines[0].contains("issued 3 certificates")
            && lines[0].contains("mesh=default")
            && lines[0].contains("backend ca-1"),
        "{info}"
    );
    // Nothing to issue: nothing logged.
    let ((), info) = crate::test_certs::logged(tracing::Level::INFO, || {
        h.reconcile(t0() + Duration::from_secs(1));
    });
    assert!(!info.contains("issued"), "{info}");
}

#[test]
fn a_reload_that_changes_nothing_issues_nothing_and_pushes_nothing() {
    let mut h = gated(true);
    h.reconcile(t0());
    let before = generation(&h);
    let served = h.ready("web-1");
    h.update(LEGACY).expect("the same resources again");
    let ((), info) = crate::test_certs::logged(tracing::Level::INFO, || {
        h.reconcile(t0() + Duration::from_secs(1));
    });
    assert_eq!(generation(&h), before, "nothing new to push");
    assert!(Arc::ptr_eq(&h.ready("web-1"), &served), "nothing reissued");
    assert!(!info.contains("issued"), "{info}");
}

#[test]
fn a_wave_issued_on_several_threads_gives_every_proxy_its_own_certificate() {
    let mut h = Harness::new(LEGACY);
    h.reconfigure(|config| config.workers = 4);
    let names: Vec<String> = (0..20).map(|i| format!("svc-{i}")).collect();
    for name in &names {
        h.connect(name, &[], &[("kuma.io/service", name)]);
    }
    h.reconcile(t0());
    let mut keys = std::collections::HashSet::new();
    for name in &names {
        let served = h.ready(name);
        assert_eq!(served.spiffe_id, format!("spiffe://default/{name}"));
        assert!(
            keys.insert(served.key.held().expect("held").expose().to_owned()),
            "a key served twice"
        );
    }
}

#[test]
fn proxies_timing_out_together_are_one_warning_per_mesh() {
    let mut h = gated(true);
    h.update(SWITCHED).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    let g = generation(&h);
    h.ack(1, Some(g));
    h.ack(2, Some(g));
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(issuer_of(&h.ready("web-1")), ca_subject(&h, "ca-2"));
    // Neither proxy ACKs its ca-2 certificate; rollout.ackTimeout (30 s) passes.
    let ((), logged) = crate::test_certs::warnings(|| {
        h.reconcile(t0() + Duration::from_secs(40));
    });
    let lines: Vec<&str> = logged
        .lines()
        .filter(|l| l.contains("have not ACKed their new certificates"))
        .collect();
    assert_eq!(lines.len(), 1, "{logged}");
    assert!(
        lines[0].contains("count=2") && lines[0].contains("default.web-1"),
        "{logged}"
    );
}

/// A wave started for a CA that the next edit removes again: its results, however late and in whatever
/// order they arrive, are never published, since the bundles no longer carry that CA.
#[test]
fn late_results_for_a_ca_removed_meanwhile_are_never_published() {
    let mut h = gated(true);
    let ca1 = issuer_of(&h.ready("web-1"));
    h.update(SWITCHED).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    let g = generation(&h);
    h.ack(1, Some(g));
    h.ack(2, Some(g));
    // The trust wait is over: the wave from ca-2 starts, and its results are held back.
    h.owner.reconcile(t0() + Duration::from_secs(2));
    let jobs = h.owner.take_jobs();
    assert_eq!(jobs.len(), 2, "one certificate per proxy");
    let mut done: Vec<_> = jobs.iter().map(crate::owner::run_job).collect();
    // Back to ca-1 alone before the results are in.
    h.update(LEGACY).expect("valid");
    h.reconcile(t0() + Duration::from_secs(3));
    assert_eq!(bundle_subjects(&h), std::slice::from_ref(&ca1));
    done.reverse();
    if h.owner.on_issued(done, t0() + Duration::from_secs(3)) {
        h.owner.reconcile(t0() + Duration::from_secs(3));
    }
    for name in ["web-1", "web-2"] {
        assert_eq!(
            issuer_of(&h.ready(name)),
            ca1,
            "{name} got a ca-2 certificate"
        );
    }
    assert_eq!(bundle_subjects(&h), [ca1]);
    assert!(
        h.owner.take_jobs().is_empty(),
        "the proxies hold what they should: nothing to issue"
    );
}

/// While a wave is being issued, a proxy keeps the certificate it has; one that has none waits, and
/// its status says why.
#[test]
fn a_proxy_keeps_its_certificate_while_its_next_one_is_being_issued() {
    let mut h = gated(false);
    let old = h.ready("web-1");
    h.update(SWITCHED).expect("valid");
    h.owner.reconcile(t0() + Duration::from_secs(1));
    assert!(Arc::ptr_eq(&h.ready("web-1"), &old));
    h.connect("web-3", &[], &[("kuma.io/service", "web")]);
    h.owner.reconcile(t0() + Duration::from_secs(1));
    assert!(matches!(h.entry("web-3"), ProxyEntry::Pending));
    let status = h.status();
    let web_3 = dataplane(&status, "web-3");
    assert_eq!(
        web_3.reason.as_deref(),
        Some("its certificate is being issued")
    );
    let jobs = h.owner.take_jobs();
    assert_eq!(jobs.len(), 3);
    let done = jobs.iter().map(crate::owner::run_job).collect();
    assert!(!h.owner.on_issued(done, t0() + Duration::from_secs(1)));
    let ca2 = ca_subject(&h, "ca-2");
    for name in ["web-1", "web-2", "web-3"] {
        assert_eq!(issuer_of(&h.ready(name)), ca2);
    }
}

/// With an RSA key algorithm, a job takes a key generated ahead when one is ready: the proxy's
/// certificate carries it, and it is gone from the set.
#[test]
fn an_rsa_job_takes_a_key_generated_ahead_once() {
    let mut h = Harness::new(LEGACY);
    h.reconfigure(|config| config.key_algorithm = meshca_identity::KeyAlgorithm::Rsa2048);
    h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    h.connect("web-2", &[], &[("kuma.io/service", "web")]);
    h.owner.reconcile(t0());
    let jobs = h.owner.take_jobs();
    assert_eq!(jobs.len(), 2);
    let keys = crate::keys_ahead::KeysAhead::new(meshca_identity::KeyAlgorithm::Rsa2048, 1)
        .expect("RSA keeps keys ahead");
    assert!(keys.fill_one());
    let ready = keys.publics();
    let done = jobs
        .iter()
        .map(|job| super::issue::run_job_with(job, Some(&keys)))
        .collect();
    assert_eq!(keys.len(), 0, "the key was taken");
    h.owner.on_issued(done, t0());
    let carrying: Vec<&str> = ["web-1", "web-2"]
        .into_iter()
        .filter(|name| {
            let key = meshca_ca::PrivateKey::from_pem(
                h.ready(name).key.held().expect("held").expose().as_bytes(),
            )
            .expect("a served key parses");
            assert_eq!(key.algorithm(), meshca_identity::KeyAlgorithm::Rsa2048);
            key.public_key().expect("parses") == ready[0]
        })
        .collect();
    assert_eq!(
        carrying.len(),
        1,
        "one certificate carries the key: {carrying:?}"
    );
}

/// A certificate counts as ACKed only once a snapshot that carries it is ACKed. Here its result comes
/// back while an edit that changes the trust waits to be reconciled: the reconcile publishes the new
/// trust first, in a snapshot without the certificate, and an ACK of that snapshot must not settle
/// what the certificate replaced (the proxy still presents its ca-1 certificate).
#[test]
fn a_certificate_kept_before_a_trust_first_snapshot_is_acked_only_once_served() {
    const WITH_CA3: &str = r#"
type: Mesh
name: default
meshServices:
  mode: Exclusive
mtls:
  enabledBackend: ca-2
  secondaryBackends: [ca-1, ca-3]
  backends:
    - name: ca-1
      type: builtin
      dpCert: {rotation: {expiration: 10h}}
    - name: ca-2
      type: builtin
      dpCert: {rotation: {expiration: 10h}}
    - name: ca-3
      type: builtin
"#;
    const WITHOUT_CA1: &str = r#"
type: Mesh
name: default
meshServices:
  mode: Exclusive
mtls:
  enabledBackend: ca-2
  secondaryBackends: [ca-3]
  backends:
    - name: ca-2
      type: builtin
      dpCert: {rotation: {expiration: 10h}}
    - name: ca-3
      type: builtin
"#;
    let mut h = gated(true);
    let ca1 = issuer_of(&h.ready("web-1"));
    h.update(SWITCHED).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    let g = generation(&h);
    h.ack(1, Some(g));
    h.ack(2, Some(g));
    // The wave from ca-2 starts; ca-3 is added before its results are in.
    h.owner.reconcile(t0() + Duration::from_secs(2));
    let jobs = h.owner.take_jobs();
    assert_eq!(jobs.len(), 2, "one certificate per proxy");
    let done = jobs.iter().map(crate::owner::run_job).collect();
    h.update(WITH_CA3).expect("valid");
    assert!(
        h.owner.on_issued(done, t0() + Duration::from_secs(2)),
        "an edit waits: the results go to its reconcile"
    );
    let before = generation(&h);
    h.reconcile(t0() + Duration::from_secs(3));
    let ca2 = ca_subject(&h, "ca-2");
    assert_eq!(issuer_of(&h.ready("web-1")), ca2);
    assert_eq!(generation(&h), before + 2, "trust first, then the proxies");
    // Both ACK the trust-first snapshot; only web-2 ACKs its certificate.
    h.ack(1, Some(before + 1));
    h.ack(2, Some(before + 2));
    h.update(WITHOUT_CA1).expect("valid");
    h.reconcile(t0() + Duration::from_secs(4));
    assert!(
        bundle_subjects(&h).contains(&ca1),
        "web-1 still presents its ca-1 certificate: ca-1 must stay trusted"
    );
    h.ack(1, Some(generation(&h)));
    h.reconcile(t0() + Duration::from_secs(5));
    assert!(
        !bundle_subjects(&h).contains(&ca1),
        "every proxy ACKed its ca-2 certificate: ca-1 goes"
    );
}
