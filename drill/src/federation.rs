//! `meshca drill federation`: two daemons of two trust domains (legacy meshes `alpha` and `beta`, each
//! its own trust domain), each serving its SPIFFE bundle endpoint (`https_spiffe`) and following the
//! other's through a FederationRelationship. Simulated proxies of both call each other, across the
//! trust domains and within them, over mTLS, while each daemon rotates its CA in one edit (ca-2 issues,
//! ca-1 kept as secondary) and at once removes ca-1. With the gate, nothing is issued from a new CA
//! before the other daemon, polling as told, holds it: zero failed handshakes. Without it
//! (`--gate off`), each issues from its new CA at once, and the other side's proxies refuse those
//! certificates until their daemon's next fetch.
//! The other side keeps trusting a removed CA until the last certificate it signed expires (its
//! daemon's endpoint serves it until then): the drill checks that too.
//!
//! With `--envoy`, the proxies are real Envoy sidecars in a ring that alternates the two sides, so that
//! every call crosses the trust domains: each Envoy takes its certificate and `system_trust_bundle` from
//! its own daemon over SDS and pins the next one's SPIFFE ID, and every HTTP request is a new mTLS
//! handshake.
//!
//! The drill's daemons tell their peers to poll every 2 s ([`REFRESH_HINT`]) with a 2 s margin (5 s with
//! Envoy, whose laggards get their SDS up to 3 s late), so that a rotation takes seconds, not the
//! minutes of the defaults.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use meshca_config::{EndpointServing, FederationEndpoint};
use meshca_daemon::{Daemon, DaemonOptions};
use rustls_pki_types::CertificateDer;

use super::envoy::{EnvoyRing, RingMember, RingTraffic, Sidecar, Topology};
use super::fleet::{Fleet, Member, MemberSpec, Reach};
use super::play::{
    daemon_converged, every, is_converged, mint_for, phase_minimums, poll_until, progress,
    steady_ca, trusts, CONVERGE_TIMEOUT, WORKERS,
};
use super::report::{Header, Outcome, Report};
use super::sandbox::Sandbox;
use super::scenario::SERVICES;
use super::tls::PeerCheck;
use super::traffic::Traffic;

/// The refresh hint the drill's endpoints serve.
pub const REFRESH_HINT: Duration = Duration::from_secs(2);
/// What the drill's daemons wait beyond one refresh hint before issuing from a new CA: the time a peer
/// takes, once it fetched, to get the new CA to its proxies. Simulated proxies apply it at once; with
/// Envoy, a laggard gets its SDS up to [`super::envoy::LAG`] late, which the margin must cover (as a real
/// one must cover a real mesh's slowest proxies: no ACK crosses trust domains).
fn fetch_margin(envoy: bool) -> Duration {
    if envoy {
        super::envoy::LAG.1 + Duration::from_secs(2)
    } else {
        Duration::from_secs(2)
    }
}
/// The two sides: mesh name = trust domain.
const SIDES: [&str; 2] = ["alpha", "beta"];

/// What to drill.
#[derive(Clone, Debug)]
pub struct Options {
    /// How many proxies, half on each side (at least 2 on each).
    pub proxies: usize,
    /// The daemons' ordering gate.
    pub gate: bool,
    /// Seeds apply delays and handshake pairs.
    pub seed: u64,
    /// Minimum handshakes over the three phases.
    pub handshakes: u64,
    /// Real Envoy sidecars (this binary) instead of simulated proxies.
    pub envoy: Option<PathBuf>,
}

impl Options {
    fn header(&self) -> Header {
        Header {
            scenario: "federation",
            gate: self.gate,
            proxies: self.proxies,
            envoy: self.envoy.is_some(),
            agents: 0,
            seed: self.seed,
            stuck: 0,
        }
    }
}

/// What each side's mesh issues from once the drill has rotated.
const FINAL_ISSUER: &str = "backend ca-2";

/// A legacy mesh named `mesh` on builtin backend `enabled`, with `secondary` kept trusted.
fn mesh(mesh: &str, enabled: &str, secondary: Option<&str>) -> String {
    let backend = |b: &str| {
        format!("    - {{name: {b}, type: builtin, dpCert: {{rotation: {{expiration: 1h}}}}}}\n")
    };
    let backends: String = std::iter::once(enabled)
        .chain(secondary)
        .map(backend)
        .collect();
    let secondary = secondary
        .map(|s| format!("  secondaryBackends: [{s}]\n"))
        .unwrap_or_default();
    format!(
        "type: Mesh\nname: {mesh}\nmeshServices:\n  mode: Exclusive\nmtls:\n  enabledBackend: {enabled}\n{secondary}  backends:\n{backends}"
    )
}

/// One side: its sandbox, daemon and where its endpoint listens.
struct Side {
    name: &'static str,
    sandbox: Sandbox,
    daemon: Daemon,
    endpoint: SocketAddr,
}

async fn start_side(name: &'static str, gate: bool, margin: Duration) -> anyhow::Result<Side> {
    let sandbox = Sandbox::new()?;
    sandbox.write_resource("mesh.yaml", &mesh(name, "ca-1", None))?;
    let mut settings = sandbox.settings();
    settings.federation.endpoints = vec![FederationEndpoint {
        trust_domain: name.parse().context("a drill trust domain")?,
        listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        profile: EndpointServing::HttpsSpiffe,
    }];
    settings.federation.refresh_hint = meshca_config::Duration(REFRESH_HINT);
    settings.federation.fetch_margin = meshca_config::Duration(margin);
    tracing::info!(side = name, dir = %sandbox.root().display(), "drill: starting a daemon");
    let daemon = Daemon::start(
        settings,
        DaemonOptions {
            gate,
            watch_files: false,
        },
    )
    .await
    .with_context(|| format!("the {name} daemon did not start"))?;
    let endpoint = daemon
        .bundle_endpoints
        .first()
        .ok_or_else(|| anyhow!("the {name} daemon serves no bundle endpoint"))?;
    tokio::time::timeout(CONVERGE_TIMEOUT, endpoint.ready())
        .await
        .map_err(|_| anyhow!("the {name} bundle endpoint had nothing to serve in time"))?;
    let endpoint = endpoint.addr;
    Ok(Side {
        name,
        sandbox,
        daemon,
        endpoint,
    })
}

/// Makes `side` federate with `other`: its served bundle as the initial one.
async fn federate(side: &Side, other: &Side) -> anyhow::Result<()> {
    let served = other.daemon.bundle_endpoints[0]
        .served
        .borrow()
        .clone()
        .ok_or_else(|| anyhow!("the {} endpoint serves nothing", other.name))?;
    let initial = side.sandbox.root().join(format!("{}.json", other.name));
    std::fs::write(&initial, &served.json)
        .with_context(|| format!("cannot write {}", initial.display()))?;
    side.sandbox.write_resource(
        "federation.yaml",
        &format!(
            "type: FederationRelationship\nname: {peer}\nmesh: {mesh}\nspec:\n  trustDomain: {peer}\n  bundleEndpoint: {{url: \"https://{addr}/\", profile: https_spiffe, spiffeID: \"spiffe://{peer}/meshca/bundle-endpoint\"}}\n  initialBundle: {{file: {file}}}\n",
            peer = other.name,
            mesh = side.name,
            addr = other.endpoint,
            file = initial.display(),
        ),
    )?;
    side.daemon.reload_resources().await?.map_err(|errors| {
        anyhow!(
            "the {} daemon refused the relationship: {errors:?}",
            side.name
        )
    })
}

/// Applies `yaml` as `side`'s mesh and waits until its daemon serves it.
async fn edit(side: &Side, yaml: &str) -> anyhow::Result<()> {
    side.sandbox.write_resource("mesh.yaml", yaml)?;
    side.daemon
        .reload_resources()
        .await?
        .map_err(|errors| anyhow!("the {} daemon refused the edit: {errors:?}", side.name))
}

/// The members of `side`: `p-<i>` serving `svc-<i % SERVICES>`, legacy IDs `spiffe://<mesh>/<svc>`,
/// each checked as a server by that exact ID.
fn members(side: &str, count: usize) -> Vec<MemberSpec> {
    (0..count)
        .map(|i| {
            let service = format!("svc-{}", i % SERVICES);
            let id = format!("spiffe://{side}/{service}");
            MemberSpec {
                mesh: side.to_owned(),
                name: format!("p-{i}"),
                labels: BTreeMap::from([("kuma.io/workload".to_owned(), service.clone())]),
                service,
                initial_id: id.clone(),
                final_id: id.clone(),
                check: PeerCheck::Exact(id),
                egress: false,
                renews: true,
            }
        })
        .collect()
}

/// Plays the drill and reports. An error means it could not start or reach its steady state.
pub async fn run(options: Options) -> anyhow::Result<Report> {
    if options.proxies < 4 {
        return Err(anyhow!(
            "the federation drill needs at least 4 proxies, 2 on each side"
        ));
    }
    let margin = fetch_margin(options.envoy.is_some());
    let alpha = start_side(SIDES[0], options.gate, margin).await?;
    let beta = match start_side(SIDES[1], options.gate, margin).await {
        Ok(beta) => beta,
        Err(e) => {
            alpha.daemon.stop().await;
            return Err(e);
        }
    };
    let result = match &options.envoy {
        Some(envoy) => with_envoy(&options, &alpha, &beta, envoy).await,
        None => play(&options, &alpha, &beta).await,
    };
    alpha.daemon.stop().await;
    beta.daemon.stop().await;
    result
}

async fn play(options: &Options, alpha: &Side, beta: &Side) -> anyhow::Result<Report> {
    federate(alpha, beta).await?;
    federate(beta, alpha).await?;
    let per_side = options.proxies / 2;
    let mint_alpha = |claims: &meshca_auth::Claims| Ok(alpha.daemon.mint_token(claims)?);
    let mint_beta = |claims: &meshca_auth::Claims| Ok(beta.daemon.mint_token(claims)?);
    let alpha_reach = Reach {
        targets: vec![alpha
            .daemon
            .unix_target()
            .ok_or_else(|| anyhow!("the alpha daemon has no unix SDS socket"))?],
        mint: &mint_alpha,
        workload_sockets: Vec::new(),
        stuck: None,
    };
    let beta_reach = Reach {
        targets: vec![beta
            .daemon
            .unix_target()
            .ok_or_else(|| anyhow!("the beta daemon has no unix SDS socket"))?],
        mint: &mint_beta,
        workload_sockets: Vec::new(),
        stuck: None,
    };
    let mut fleet_a = Fleet::start(&alpha_reach, &members("alpha", per_side), &[], options.seed)?;
    let mut fleet_b = match Fleet::start(
        &beta_reach,
        &members("beta", per_side),
        &[],
        options.seed ^ 0xb,
    ) {
        Ok(fleet) => fleet,
        Err(e) => {
            fleet_a.stop().await;
            return Err(e);
        }
    };
    let result = play_fleets(options, alpha, beta, &mut fleet_a, &mut fleet_b).await;
    fleet_a.stop().await;
    fleet_b.stop().await;
    result
}

/// Waits until every member of `fleet` holds its identity and trusts `foreign`, the other side's CA.
async fn steady(
    fleet: &mut Fleet,
    foreign: Option<&CertificateDer<'static>>,
) -> anyhow::Result<bool> {
    let members = fleet.members.clone();
    fleet
        .wait_until(CONVERGE_TIMEOUT, |states| {
            every(&members, states, |m, s| {
                s.spiffe_id == m.initial_id && foreign.is_none_or(|ca| trusts(s, ca))
            })
        })
        .await
}

async fn play_fleets(
    options: &Options,
    alpha: &Side,
    beta: &Side,
    fleet_a: &mut Fleet,
    fleet_b: &mut Fleet,
) -> anyhow::Result<Report> {
    if !steady(fleet_a, None).await? || !steady(fleet_b, None).await? {
        return Err(anyhow!(
            "the steady state was not reached: within {CONVERGE_TIMEOUT:?} not every proxy applied its identity"
        ));
    }
    let old_a = steady_ca(&fleet_a.states())?;
    let old_b = steady_ca(&fleet_b.states())?;
    // Each side trusts the other's CA through the federation before any traffic.
    if !steady(fleet_a, Some(&old_b)).await? || !steady(fleet_b, Some(&old_a)).await? {
        return Err(anyhow!(
            "the steady state was not reached: within {CONVERGE_TIMEOUT:?} not every proxy trusted the other trust domain's CA"
        ));
    }
    tracing::info!(
        proxies = options.proxies,
        "drill: steady state, federated both ways"
    );
    let members: Vec<Member> = fleet_a
        .members
        .iter()
        .chain(&fleet_b.members)
        .cloned()
        .collect();
    let [edge, middle, last] = phase_minimums(options.handshakes);
    let mut traffic = Traffic::start(members, Vec::new(), options.seed, WORKERS, "steady");
    let mut outcome = Outcome::default();
    let change = async {
        traffic.wait_handshakes(edge).await?;
        traffic.begin_phase("rotation");
        let started = Instant::now();
        rotate_both(alpha, beta).await?;
        tracing::info!("drill: both sides rotated; waiting for the proxies");
        let (members_a, members_b) = (fleet_a.members.clone(), fleet_b.members.clone());
        let converged_a = fleet_a.wait_until(CONVERGE_TIMEOUT, |states| {
            is_converged(&members_a, &[], states, &old_a)
        });
        let converged_b = fleet_b.wait_until(CONVERGE_TIMEOUT, |states| {
            is_converged(&members_b, &[], states, &old_b)
        });
        let (a, b) = tokio::join!(converged_a, converged_b);
        if !a? || !b? {
            return Err(anyhow!(
                "no convergence within {CONVERGE_TIMEOUT:?}: alpha: {}; beta: {}",
                progress(&fleet_a.members, &fleet_a.states(), &old_a),
                progress(&fleet_b.members, &fleet_b.states(), &old_b)
            ));
        }
        // Each side trusts the other's new CA, and still its old one: the other side serves it until
        // the last certificate it signed expires (the drill's certificates live an hour).
        let (new_a, new_b) = (steady_ca(&fleet_a.states())?, steady_ca(&fleet_b.states())?);
        let crossed_a = fleet_a.wait_until(CONVERGE_TIMEOUT, |states| {
            every(&members_a, states, |_, s| {
                trusts(s, &new_b) && trusts(s, &old_b)
            })
        });
        let crossed_b = fleet_b.wait_until(CONVERGE_TIMEOUT, |states| {
            every(&members_b, states, |_, s| {
                trusts(s, &new_a) && trusts(s, &old_a)
            })
        });
        let (a, b) = tokio::join!(crossed_a, crossed_b);
        if !a? || !b? {
            return Err(anyhow!(
                "within {CONVERGE_TIMEOUT:?}, not every proxy trusted both the other side's new CA and its old one (served until its last certificate expires)"
            ));
        }
        outcome.converge_seconds = Some(started.elapsed().as_secs_f64());
        tracing::info!(seconds = ?started.elapsed(), "drill: converged");
        traffic.wait_handshakes(middle).await?;
        traffic.begin_phase("converged");
        traffic.wait_handshakes(last).await
    };
    if let Err(error) = change.await {
        outcome.error = Some(format!("{error:#}"));
    }
    let phases = traffic.stop().await;
    outcome.nacks = fleet_a.nacks() + fleet_b.nacks();
    Ok(Report::new(options.header(), phases, outcome))
}

/// Both sides rotate, in one edit each, and remove their old CA at once.
async fn rotate_both(alpha: &Side, beta: &Side) -> anyhow::Result<()> {
    for side in [alpha, beta] {
        edit(side, &mesh(side.name, "ca-2", Some("ca-1"))).await?;
    }
    for side in [alpha, beta] {
        edit(side, &mesh(side.name, "ca-2", None)).await?;
    }
    Ok(())
}

/// The Envoy ring: `p-<i>` alternating alpha and beta, each on its own daemon's SDS socket, so that
/// every call crosses the trust domains.
fn ring_members(alpha: &Side, beta: &Side, per_side: usize) -> Vec<RingMember> {
    (0..2 * per_side)
        .map(|i| {
            let side = if i % 2 == 0 { alpha } else { beta };
            let service = format!("svc-{}", (i / 2) % SERVICES);
            let id = format!("spiffe://{}/{service}", side.name);
            RingMember {
                name: format!("p-{i}"),
                mesh: side.name.to_owned(),
                egress: false,
                labels: BTreeMap::from([("kuma.io/workload".to_owned(), service.clone())]),
                renews: true,
                service,
                initial_id: id.clone(),
                final_id: id,
                sds: Some(side.sandbox.root().join("sds.sock")),
            }
        })
        .collect()
}

/// The trust bundle an Envoy applied for `domain` (the PEM of its entry in the SPIFFE validator of
/// `system_trust_bundle`), from its admin interface.
async fn applied_domain_bundle(sidecar: &Sidecar, domain: &str) -> Option<String> {
    let secret = sidecar.applied_secret("system_trust_bundle").await?;
    domain_bundle(&secret, domain).map(str::to_owned)
}

/// The `trust_bundle` of the SPIFFE validator entry named `domain`, anywhere in a secret's JSON.
fn domain_bundle<'a>(value: &'a serde_json::Value, domain: &str) -> Option<&'a str> {
    match value {
        serde_json::Value::Object(map) => {
            if map.get("name").is_some_and(|name| name == domain) {
                if let Some(pem) = map
                    .get("trust_bundle")
                    .and_then(|bundle| bundle.get("inline_string"))
                    .and_then(|pem| pem.as_str())
                {
                    return Some(pem);
                }
            }
            map.values().find_map(|v| domain_bundle(v, domain))
        }
        serde_json::Value::Array(items) => items.iter().find_map(|v| domain_bundle(v, domain)),
        _ => None,
    }
}

/// The PEM blocks of a bundle, each trimmed.
fn pem_blocks(bundle: &str) -> Vec<String> {
    bundle
        .split_inclusive("-----END CERTIFICATE-----")
        .map(str::trim)
        .filter(|block| block.starts_with("-----BEGIN CERTIFICATE-----"))
        .map(str::to_owned)
        .collect()
}

/// The same with real Envoy sidecars (see the module's comment).
async fn with_envoy(
    options: &Options,
    alpha: &Side,
    beta: &Side,
    envoy: &Path,
) -> anyhow::Result<Report> {
    federate(alpha, beta).await?;
    federate(beta, alpha).await?;
    let members = ring_members(alpha, beta, options.proxies / 2);
    let mint = |member: &RingMember| {
        let side = if member.mesh == alpha.name {
            alpha
        } else {
            beta
        };
        mint_for(&side.daemon, member)
    };
    let ring = EnvoyRing::start(
        envoy,
        alpha.sandbox.root(),
        &[],
        &members,
        Topology::Ring { by_service: false },
        &mint,
        options.seed,
    )
    .await?;
    for (name, delay) in &ring.laggards {
        tracing::info!(proxy = %name, ?delay, "drill: this Envoy's SDS is relayed late");
    }
    let result = play_ring(options, alpha, beta, &ring).await;
    ring.stop().await;
    result
}

/// The other side's trust domain, for a sidecar of the ring (even: alpha, odd: beta).
fn foreign(i: usize) -> &'static str {
    SIDES[(i + 1) % 2]
}

async fn play_ring(
    options: &Options,
    alpha: &Side,
    beta: &Side,
    ring: &EnvoyRing,
) -> anyhow::Result<Report> {
    // The steady state: every Envoy trusts the other trust domain's CA, as its daemon fetched it.
    poll_until("every Envoy to trust the other trust domain", || async {
        for (i, sidecar) in ring.sidecars.iter().enumerate() {
            if applied_domain_bundle(sidecar, foreign(i)).await.is_none() {
                return false;
            }
        }
        true
    })
    .await?;
    let mut old_foreign = Vec::with_capacity(ring.sidecars.len());
    for (i, sidecar) in ring.sidecars.iter().enumerate() {
        let bundle = applied_domain_bundle(sidecar, foreign(i))
            .await
            .ok_or_else(|| anyhow!("Envoy {} lost the other trust domain", sidecar.name))?;
        old_foreign.push(pem_blocks(&bundle));
    }
    tracing::info!(
        proxies = options.proxies,
        "drill: steady state, every Envoy federated with the other trust domain"
    );
    let before = ring.presented_serials().await;
    let per_side = ring.sidecars.len() / 2;
    let [steady_min, change_min, converged_min] = phase_minimums(options.handshakes);
    let mut traffic = RingTraffic::start(ring, options.seed, WORKERS, "steady");
    let mut outcome = Outcome::default();
    let change = async {
        traffic.wait_requests(steady_min).await?;
        traffic.begin_phase("rotation");
        let started = Instant::now();
        rotate_both(alpha, beta).await?;
        tracing::info!("drill: both sides rotated; waiting for the Envoys");
        poll_until(
            "every Envoy to present a new certificate and trust the other side's new CA",
            || async {
                let serials = ring.presented_serials().await;
                let renewed = serials
                    .iter()
                    .zip(&before)
                    .all(|(now, then)| now.is_some() && now != then);
                if !renewed {
                    return false;
                }
                // The other side's new CA is trusted, and still its old one: the other side serves
                // it until the last certificate it signed expires (an hour in the drill).
                for (i, sidecar) in ring.sidecars.iter().enumerate() {
                    let Some(bundle) = applied_domain_bundle(sidecar, foreign(i)).await else {
                        return false;
                    };
                    let now = pem_blocks(&bundle);
                    let keeps_old = old_foreign[i].iter().all(|old| now.contains(old));
                    let has_new = now.iter().any(|block| !old_foreign[i].contains(block));
                    if !keeps_old || !has_new {
                        return false;
                    }
                }
                daemon_converged(&alpha.daemon, alpha.name, Some(FINAL_ISSUER), per_side).await
                    && daemon_converged(&beta.daemon, beta.name, Some(FINAL_ISSUER), per_side).await
            },
        )
        .await?;
        outcome.converge_seconds = Some(started.elapsed().as_secs_f64());
        tracing::info!(seconds = ?started.elapsed(), "drill: every Envoy converged");
        traffic.wait_requests(change_min).await?;
        traffic.begin_phase("converged");
        traffic.wait_requests(converged_min).await
    };
    if let Err(error) = change.await {
        outcome.error = Some(format!("{error:#}"));
    }
    let phases = traffic.stop().await;
    Ok(Report::new(options.header(), phases, outcome))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_side_rotates_from_ca_1_to_ca_2_keeping_ca_1_then_drops_it() {
        let first = mesh("alpha", "ca-1", None);
        assert!(first.contains("enabledBackend: ca-1") && !first.contains("secondaryBackends"));
        let switched = mesh("alpha", "ca-2", Some("ca-1"));
        assert!(
            switched.contains("enabledBackend: ca-2")
                && switched.contains("secondaryBackends: [ca-1]")
        );
        assert!(switched.contains("name: ca-1,") && switched.contains("name: ca-2,"));
        let members = members("beta", 6);
        assert_eq!(members.len(), 6);
        assert_eq!(members[5].initial_id, "spiffe://beta/svc-0");
        assert!(members.iter().all(|m| m.mesh == "beta"));
    }

    #[test]
    fn the_bundle_of_one_trust_domain_is_found_in_an_applied_secret() {
        let a = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----";
        let b = "-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----";
        let secret = serde_json::json!({
            "name": "system_trust_bundle",
            "secret": {"validation_context": {"custom_validator_config": {"typed_config": {
                "trust_domains": [
                    {"name": "alpha", "trust_bundle": {"inline_string": format!("{a}\n")}},
                    {"name": "beta", "trust_bundle": {"inline_string": format!("{a}\n{b}\n")}},
                ]
            }}}}
        });
        assert_eq!(pem_blocks(domain_bundle(&secret, "alpha").unwrap()), [a]);
        assert_eq!(pem_blocks(domain_bundle(&secret, "beta").unwrap()), [a, b]);
        assert_eq!(domain_bundle(&secret, "gamma"), None);
        assert_eq!(foreign(0), "beta");
        assert_eq!(foreign(3), "alpha");
    }
}
