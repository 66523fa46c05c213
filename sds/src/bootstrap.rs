//! Envoy bootstraps for meshca proxies: the SDS cluster, admin on loopback, and mTLS listeners and
//! clusters whose certificate (`default`) and trust (`system_trust_bundle`) come from meshca over SDS
//! with the proxy's token. `meshca bootstrap` prints one; the Envoy drills start their sidecars from
//! the same function.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use meshca_auth::{Claims, ProxyType};
use meshca_identity::SpiffeId;
use serde_json::{json, Value};

/// The cluster that reaches meshca's SDS.
const SDS_CLUSTER: &str = "meshca_sds";
/// The tag whose value names a dataplane's service (Envoy's node cluster).
const SERVICE_TAG: &str = "kuma.io/service";

/// Where the sidecar reaches meshca's SDS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SdsTarget {
    /// A unix socket (an absolute path: Envoy resolves relative ones against its own directory).
    Unix(PathBuf),
    /// Several unix sockets, one per replica: Envoy opens its SDS stream to one of them and, when
    /// that stream fails, to another (the failover drill).
    UnixReplicas(Vec<PathBuf>),
    /// TCP with TLS, checking meshca's certificate against `ca_file`.
    Tls {
        /// Host name or IP address.
        host: String,
        /// Port.
        port: u16,
        /// PEM file of the CA that signs meshca's SDS certificate.
        ca_file: PathBuf,
    },
}

/// `--inbound PORT:APP_PORT`: a listener on PORT that requires a client certificate from the mesh and
/// forwards to the local app on APP_PORT, with the client's SPIFFE ID in `x-forwarded-client-cert`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inbound {
    /// The port Envoy listens on (all addresses).
    pub port: u16,
    /// The local application's port (127.0.0.1).
    pub app_port: u16,
}

/// `--outbound LOCAL_PORT=HOST:PORT[@SPIFFE_ID|@meshservice:NAME|@zone-egress]`: a loopback listener whose
/// cluster originates mTLS to HOST:PORT and checks the peer as [`Peer`] says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outbound {
    /// The port Envoy listens on (127.0.0.1).
    pub local_port: u16,
    /// The peer's host name or IP address.
    pub host: String,
    /// The peer's port.
    pub port: u16,
    /// What the peer must present.
    pub peer: Peer,
}

/// How an outbound cluster checks the server it connects to (and an inbound listener its clients).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peer {
    /// Any certificate the mesh trusts (`system_trust_bundle`).
    AnyInMesh,
    /// Any certificate of any mesh (`ALL`): how a zone egress checks the sidecars that call it.
    AnyMesh,
    /// The zone egress: its CAs and SPIFFE IDs (`system_trust_bundle_egress`).
    ZoneEgress,
    /// A certificate the mesh trusts carrying exactly this SPIFFE ID.
    SpiffeId(SpiffeId),
    /// A certificate carrying one of the SPIFFE IDs of this MeshService, validated with its
    /// `meshservice:<name>` context (trust and SAN matchers both come from meshca, so they follow a
    /// migration as the service's identities change).
    MeshService(String),
}

/// Everything a bootstrap is made of.
#[derive(Clone, Debug)]
pub struct Bootstrap {
    /// The proxy token, sent as `authorization: Bearer` on every SDS stream.
    pub token: String,
    /// What the token says (node id, service).
    pub claims: Claims,
    /// Where SDS is.
    pub sds: SdsTarget,
    /// Envoy's admin port (on 127.0.0.1).
    pub admin_port: u16,
    /// mTLS listeners for the local app.
    pub inbound: Vec<Inbound>,
    /// mTLS origination to peers.
    pub outbound: Vec<Outbound>,
    /// Use every upstream connection for one request only, so each request makes a new handshake (the
    /// drills count handshakes that way).
    pub one_request_per_connection: bool,
}

/// Two listeners of a bootstrap on one port, named by the flags that gave them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{first} and {second} both listen on port {port}: Envoy would refuse this bootstrap; give each \
     listener a port of its own"
)]
pub struct PortClash {
    /// The flag of the listener that took the port first.
    pub first: String,
    /// The flag of the one that asks for it again.
    pub second: String,
    /// The port.
    pub port: u16,
}

/// Refuses ports Envoy could not all bind: the admin port, every inbound port (on all addresses) and
/// every outbound port (on 127.0.0.1) must differ, or Envoy rejects the whole bootstrap at start.
/// Port 0 (any free port) never clashes. The error names the two flags.
pub fn check_ports(
    admin_port: u16,
    inbound: &[Inbound],
    outbound: &[Outbound],
) -> Result<(), PortClash> {
    let mut taken: Vec<(u16, String)> = vec![(admin_port, format!("--admin-port {admin_port}"))];
    let flags = inbound
        .iter()
        .map(|i| (i.port, format!("--inbound {}:{}", i.port, i.app_port)))
        .chain(outbound.iter().map(|o| {
            (
                o.local_port,
                format!("--outbound {}={}:{}", o.local_port, o.host, o.port),
            )
        }));
    for (port, flag) in flags {
        if let Some((_, first)) = taken.iter().find(|(p, _)| *p == port && port != 0) {
            return Err(PortClash {
                first: first.clone(),
                second: flag,
                port,
            });
        }
        taken.push((port, flag));
    }
    Ok(())
}

impl Bootstrap {
    /// The bootstrap as Envoy's v3 `Bootstrap` message, in JSON form.
    pub fn render(&self) -> Value {
        let service = self
            .claims
            .tags
            .get(SERVICE_TAG)
            .cloned()
            .unwrap_or_else(|| self.claims.name.clone());
        let mut clusters = vec![self.sds_cluster()];
        let mut listeners = Vec::new();
        for inbound in &self.inbound {
            let (listener, cluster) = self.inbound(inbound);
            listeners.push(listener);
            clusters.push(cluster);
        }
        for outbound in &self.outbound {
            let (listener, cluster) = self.outbound(outbound);
            listeners.push(listener);
            clusters.push(cluster);
        }
        json!({
            "node": {"id": self.claims.node_id(), "cluster": service},
            "admin": {"address": socket_address("127.0.0.1", self.admin_port)},
            "static_resources": {"clusters": clusters, "listeners": listeners},
        })
    }

    /// The bootstrap as YAML, with a header saying what it holds.
    pub fn to_yaml(&self) -> Result<String, yaml_serde::Error> {
        let body = yaml_serde::to_string(&self.render())?;
        Ok(format!(
            "# Envoy bootstrap for {node}, generated by `meshca bootstrap`.\n\
             # It holds the proxy's token: keep it readable only by the Envoy user (chmod 600).\n{body}",
            node = self.claims.node_id()
        ))
    }

    /// Where one secret comes from: meshca's SDS, with the token.
    fn sds_config(&self) -> Value {
        json!({
            "resource_api_version": "V3",
            "api_config_source": {
                "api_type": "GRPC",
                "transport_api_version": "V3",
                "grpc_services": [{
                    "envoy_grpc": {"cluster_name": SDS_CLUSTER},
                    "initial_metadata": [{"key": "authorization", "value": format!("Bearer {}", self.token)}],
                }],
            },
        })
    }

    /// The proxy's certificate and the peer's validation context over SDS.
    fn tls_context(&self, peer: &Peer) -> Value {
        let trust = json!({"name": "system_trust_bundle", "sds_config": self.sds_config()});
        let mut context = json!({
            "tls_certificate_sds_secret_configs": [{"name": "default", "sds_config": self.sds_config()}],
        });
        let named = |name: String| json!({"name": name, "sds_config": self.sds_config()});
        match peer {
            Peer::AnyInMesh => context["validation_context_sds_secret_config"] = trust,
            Peer::AnyMesh => context["validation_context_sds_secret_config"] = named("ALL".into()),
            Peer::ZoneEgress => {
                context["validation_context_sds_secret_config"] =
                    named("system_trust_bundle_egress".into());
            }
            Peer::MeshService(name) => {
                context["validation_context_sds_secret_config"] =
                    named(format!("meshservice:{name}"));
            }
            Peer::SpiffeId(id) => {
                context["combined_validation_context"] = json!({
                    "default_validation_context": {
                        "match_typed_subject_alt_names": [
                            {"san_type": "URI", "matcher": {"exact": id.as_str()}}
                        ],
                    },
                    "validation_context_sds_secret_config": trust,
                });
            }
        }
        context
    }

    fn sds_cluster(&self) -> Value {
        let http2 = json!({
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        });
        match &self.sds {
            SdsTarget::Unix(path) => json!({
                "name": SDS_CLUSTER,
                "type": "STATIC",
                "connect_timeout": "5s",
                "typed_extension_protocol_options": http2,
                "load_assignment": endpoint(SDS_CLUSTER, json!({"pipe": {"path": path}})),
            }),
            SdsTarget::UnixReplicas(paths) => json!({
                "name": SDS_CLUSTER,
                "type": "STATIC",
                "connect_timeout": "5s",
                "typed_extension_protocol_options": http2,
                "load_assignment": {
                    "cluster_name": SDS_CLUSTER,
                    "endpoints": [{"lb_endpoints": paths
                        .iter()
                        .map(|path| json!({"endpoint": {"address": {"pipe": {"path": path}}}}))
                        .collect::<Vec<_>>()}],
                },
            }),
            SdsTarget::Tls {
                host,
                port,
                ca_file,
            } => {
                let mut tls = json!({
                    "common_tls_context": {
                        "alpn_protocols": ["h2"],
                        "validation_context": {"trusted_ca": {"filename": ca_file}},
                    },
                });
                if host.parse::<std::net::IpAddr>().is_err() {
                    tls["sni"] = json!(host);
                }
                json!({
                    "name": SDS_CLUSTER,
                    "type": discovery_type(host),
                    "connect_timeout": "5s",
                    "typed_extension_protocol_options": http2,
                    "load_assignment": endpoint(SDS_CLUSTER, socket_address(host, *port)),
                    "transport_socket": transport_socket("UpstreamTlsContext", tls),
                })
            }
        }
    }

    fn inbound(&self, inbound: &Inbound) -> (Value, Value) {
        let cluster_name = format!("inbound_app_{}", inbound.app_port);
        let name = format!("inbound_{}", inbound.port);
        // A zone egress is called by the sidecars of every mesh.
        let clients = if self.claims.proxy_type == ProxyType::ZoneEgress {
            Peer::AnyMesh
        } else {
            Peer::AnyInMesh
        };
        let tls = json!({
            "require_client_certificate": true,
            "common_tls_context": self.tls_context(&clients),
        });
        let mut manager = http_connection_manager(&name, &cluster_name);
        // The app learns who called: the client certificate's URI SAN, set by Envoy, never forwarded.
        manager["forward_client_cert_details"] = json!("SANITIZE_SET");
        manager["set_current_client_cert_details"] = json!({"uri": true});
        let listener = json!({
            "name": name,
            "address": socket_address("0.0.0.0", inbound.port),
            "filter_chains": [{
                "transport_socket": transport_socket("DownstreamTlsContext", tls),
                "filters": [http_filter(manager)],
            }],
        });
        let cluster = json!({
            "name": cluster_name,
            "type": "STATIC",
            "connect_timeout": "5s",
            "load_assignment": endpoint(&cluster_name, socket_address("127.0.0.1", inbound.app_port)),
        });
        (listener, cluster)
    }

    fn outbound(&self, outbound: &Outbound) -> (Value, Value) {
        let name = format!("outbound_{}", outbound.local_port);
        let mut tls = json!({"common_tls_context": self.tls_context(&outbound.peer)});
        if outbound.host.parse::<std::net::IpAddr>().is_err() {
            tls["sni"] = json!(outbound.host);
        }
        let listener = json!({
            "name": name,
            "address": socket_address("127.0.0.1", outbound.local_port),
            "filter_chains": [{"filters": [http_filter(http_connection_manager(&name, &name))]}],
        });
        let mut cluster = json!({
            "name": name,
            "type": discovery_type(&outbound.host),
            "connect_timeout": "5s",
            "load_assignment": endpoint(&name, socket_address(&outbound.host, outbound.port)),
            "transport_socket": transport_socket("UpstreamTlsContext", tls),
        });
        if self.one_request_per_connection {
            cluster["typed_extension_protocol_options"] = json!({
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "common_http_protocol_options": {"max_requests_per_connection": 1},
                    "explicit_http_config": {"http_protocol_options": {}},
                }
            });
        }
        (listener, cluster)
    }
}

fn socket_address(host: &str, port: u16) -> Value {
    json!({"socket_address": {"address": host, "port_value": port}})
}

fn endpoint(cluster: &str, address: Value) -> Value {
    json!({
        "cluster_name": cluster,
        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}],
    })
}

/// Clusters to an IP address need no DNS.
fn discovery_type(host: &str) -> &'static str {
    if host.parse::<std::net::IpAddr>().is_ok() {
        "STATIC"
    } else {
        "STRICT_DNS"
    }
}

fn transport_socket(kind: &str, config: Value) -> Value {
    let mut config = config;
    config["@type"] = json!(format!(
        "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.{kind}"
    ));
    json!({"name": "envoy.transport_sockets.tls", "typed_config": config})
}

fn http_connection_manager(stat_prefix: &str, cluster: &str) -> Value {
    json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": stat_prefix,
        "route_config": {
            "name": stat_prefix,
            "virtual_hosts": [{
                "name": stat_prefix,
                "domains": ["*"],
                "routes": [{"match": {"prefix": "/"}, "route": {"cluster": cluster}}],
            }],
        },
        "http_filters": [{
            "name": "envoy.filters.http.router",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
        }],
    })
}

fn http_filter(manager: Value) -> Value {
    json!({"name": "envoy.filters.network.http_connection_manager", "typed_config": manager})
}

/// Why a `--inbound` or `--outbound` value was refused.
#[derive(Debug, PartialEq, Eq)]
pub struct PortSpecError(String);

impl fmt::Display for PortSpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PortSpecError {}

fn port(text: &str, what: &str) -> Result<u16, PortSpecError> {
    match text.parse::<u16>() {
        Ok(0) | Err(_) => Err(PortSpecError(format!(
            "{what} {text:?} is not a port (1-65535)"
        ))),
        Ok(port) => Ok(port),
    }
}

impl FromStr for Inbound {
    type Err = PortSpecError;

    /// `PORT:APP_PORT`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (listen, app) = s.split_once(':').ok_or_else(|| {
            PortSpecError(format!("{s:?}: expected PORT:APP_PORT, e.g. 15006:8080"))
        })?;
        Ok(Inbound {
            port: port(listen, "PORT")?,
            app_port: port(app, "APP_PORT")?,
        })
    }
}

impl FromStr for Outbound {
    type Err = PortSpecError;

    /// `LOCAL_PORT=HOST:PORT[@SPIFFE_ID|@meshservice:NAME|@zone-egress]`; HOST may be a name, an IPv4
    /// address or `[IPv6]`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let expected = || {
            PortSpecError(format!(
                "{s:?}: expected LOCAL_PORT=HOST:PORT[@SPIFFE_ID|@meshservice:NAME|@zone-egress], e.g. 15001=10.0.0.2:15006@spiffe://default/web or 15001=10.0.0.2:15006@meshservice:web"
            ))
        };
        let (local, peer_spec) = s.split_once('=').ok_or_else(expected)?;
        let (address, peer) = match peer_spec.split_once('@') {
            Some((address, ZONE_EGRESS)) => (address, Peer::ZoneEgress),
            Some((address, service)) if service.starts_with(MESHSERVICE_PREFIX) => {
                let name = &service[MESHSERVICE_PREFIX.len()..];
                if !is_resource_name(name) {
                    return Err(PortSpecError(format!(
                        "{s:?}: {service:?} does not name a MeshService (lowercase letters, digits, '-' and '.', at most 253)"
                    )));
                }
                (address, Peer::MeshService(name.to_owned()))
            }
            Some((address, id)) => {
                let id = SpiffeId::parse(id)
                    .map_err(|e| PortSpecError(format!("{s:?}: SPIFFE_ID {id:?}: {e}")))?;
                (address, Peer::SpiffeId(id))
            }
            None => (peer_spec, Peer::AnyInMesh),
        };
        let (host, peer_port) = address.rsplit_once(':').ok_or_else(expected)?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(expected());
        }
        Ok(Outbound {
            local_port: port(local, "LOCAL_PORT")?,
            host: host.to_owned(),
            port: port(peer_port, "PORT")?,
            peer,
        })
    }
}

/// How `--outbound` names a MeshService to validate the peer with.
const MESHSERVICE_PREFIX: &str = "meshservice:";
/// How `--outbound` names the zone egress as the peer.
const ZONE_EGRESS: &str = "zone-egress";

/// A Kuma resource name: lowercase letters, digits, `-` and `.`, starting and ending with a letter or
/// digit, at most 253 bytes.
fn is_resource_name(name: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 253
        && bytes.iter().all(|&b| alnum(b) || b == b'-' || b == b'.')
        && bytes.first().copied().is_some_and(alnum)
        && bytes.last().copied().is_some_and(alnum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_envoy_cannot_all_bind_are_refused_naming_both_flags() {
        let inbound = |port, app_port| Inbound { port, app_port };
        let outbound = |local_port| Outbound {
            local_port,
            host: "api".into(),
            port: 80,
            peer: Peer::AnyInMesh,
        };
        assert_eq!(
            check_ports(9901, &[inbound(8080, 80)], &[outbound(15001)]),
            Ok(())
        );
        assert_eq!(
            check_ports(0, &[inbound(0, 80), inbound(0, 81)], &[outbound(0)]),
            Ok(())
        );
        let clash = |error: Result<(), PortClash>, flags: [&str; 2]| {
            let error = error.expect_err("a clash").to_string();
            assert!(flags.iter().all(|f| error.contains(f)), "{error}");
        };
        clash(
            check_ports(9901, &[inbound(9901, 80)], &[]),
            ["--admin-port 9901", "--inbound 9901:80"],
        );
        clash(
            check_ports(9901, &[], &[outbound(15001), outbound(15001)]),
            ["--outbound 15001=api:80", "port 15001"],
        );
        clash(
            check_ports(9901, &[inbound(8080, 80)], &[outbound(8080)]),
            ["--inbound 8080:80", "--outbound 8080=api:80"],
        );
        clash(
            check_ports(9901, &[inbound(8080, 80), inbound(8080, 81)], &[]),
            ["--inbound 8080:80", "--inbound 8080:81"],
        );
    }
    use std::collections::BTreeMap;
    use std::time::Duration;

    fn claims() -> Claims {
        let tags = BTreeMap::from([(SERVICE_TAG.to_owned(), "web".to_owned())]);
        Claims::new_dataplane(
            "default",
            "web-1",
            BTreeMap::new(),
            tags,
            Duration::from_secs(3600),
            1_800_000_000,
        )
        .expect("valid claims")
    }

    fn bootstrap(sds: SdsTarget) -> Bootstrap {
        Bootstrap {
            token: "TOKEN".to_owned(),
            claims: claims(),
            sds,
            admin_port: 9901,
            inbound: vec!["15006:8080".parse().expect("valid")],
            outbound: vec!["15001=api.internal:15006@spiffe://default/api"
                .parse()
                .expect("valid")],
            one_request_per_connection: false,
        }
    }

    #[test]
    fn every_transport_socket_takes_its_secrets_from_meshca_with_the_token() {
        let value = bootstrap(SdsTarget::Unix("/run/meshca/sds.sock".into())).render();
        assert_eq!(value["node"]["id"], "default.web-1");
        assert_eq!(value["node"]["cluster"], "web");
        assert_eq!(
            value["admin"]["address"]["socket_address"]["address"],
            "127.0.0.1"
        );
        let text = value.to_string();
        assert_eq!(text.matches("\"name\":\"default\"").count(), 2, "{text}");
        assert_eq!(
            text.matches("\"name\":\"system_trust_bundle\"").count(),
            2,
            "{text}"
        );
        assert_eq!(
            text.matches("Bearer TOKEN").count(),
            4,
            "every secret, with the token"
        );
        let inbound = &value["static_resources"]["listeners"][0];
        let tls = &inbound["filter_chains"][0]["transport_socket"]["typed_config"];
        assert_eq!(tls["require_client_certificate"], true);
        let manager = &inbound["filter_chains"][0]["filters"][0]["typed_config"];
        assert_eq!(manager["forward_client_cert_details"], "SANITIZE_SET");
        let outbound = &value["static_resources"]["clusters"][2];
        assert_eq!(outbound["type"], "STRICT_DNS");
        let context = &outbound["transport_socket"]["typed_config"]["common_tls_context"];
        let pinned = &context["combined_validation_context"]["default_validation_context"];
        assert_eq!(
            pinned["match_typed_subject_alt_names"][0]["matcher"]["exact"],
            "spiffe://default/api"
        );
        let sds = &value["static_resources"]["clusters"][0];
        assert_eq!(
            sds["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
                ["pipe"]["path"],
            "/run/meshca/sds.sock"
        );
    }

    #[test]
    fn a_zone_egress_accepts_every_mesh_and_sidecars_validate_it_with_the_egress_bundle() {
        let mut egress = bootstrap(SdsTarget::Unix("/run/meshca/sds.sock".into()));
        egress.claims = Claims::new(
            ProxyType::ZoneEgress,
            "default",
            "egress-1",
            BTreeMap::new(),
            BTreeMap::new(),
            Duration::from_secs(3600),
            1_800_000_000,
        )
        .expect("valid claims");
        egress.outbound.clear();
        let value = egress.render();
        let inbound = &value["static_resources"]["listeners"][0]["filter_chains"][0];
        let context = &inbound["transport_socket"]["typed_config"]["common_tls_context"];
        assert_eq!(
            context["validation_context_sds_secret_config"]["name"],
            "ALL"
        );

        let mut sidecar = bootstrap(SdsTarget::Unix("/run/meshca/sds.sock".into()));
        sidecar.outbound = vec!["15001=10.0.0.9:10002@zone-egress".parse().expect("valid")];
        let value = sidecar.render();
        let inbound = &value["static_resources"]["listeners"][0]["filter_chains"][0];
        let context = &inbound["transport_socket"]["typed_config"]["common_tls_context"];
        assert_eq!(
            context["validation_context_sds_secret_config"]["name"], "system_trust_bundle",
            "a sidecar's inbound accepts its own mesh"
        );
        let outbound = &value["static_resources"]["clusters"][2];
        let context = &outbound["transport_socket"]["typed_config"]["common_tls_context"];
        assert_eq!(
            context["validation_context_sds_secret_config"]["name"],
            "system_trust_bundle_egress"
        );
    }

    #[test]
    fn a_meshservice_peer_is_validated_with_its_meshservice_context() {
        let mut b = bootstrap(SdsTarget::Unix("/run/meshca/sds.sock".into()));
        b.outbound = vec!["15001=127.0.0.1:15006@meshservice:api"
            .parse()
            .expect("valid")];
        let value = b.render();
        let outbound = &value["static_resources"]["clusters"][2];
        let context = &outbound["transport_socket"]["typed_config"]["common_tls_context"];
        assert_eq!(
            context["validation_context_sds_secret_config"]["name"],
            "meshservice:api"
        );
        assert!(
            context.get("combined_validation_context").is_none(),
            "the SAN matchers come from meshca with the context: {context}"
        );
        assert!(
            context["validation_context_sds_secret_config"]["sds_config"]
                .to_string()
                .contains("Bearer TOKEN")
        );
    }

    #[test]
    fn sds_over_tls_checks_meshcas_certificate() {
        let value = bootstrap(SdsTarget::Tls {
            host: "127.0.0.1".to_owned(),
            port: 5678,
            ca_file: "/var/lib/meshca/sds-ca.pem".into(),
        })
        .render();
        let sds = &value["static_resources"]["clusters"][0];
        assert_eq!(sds["type"], "STATIC");
        let tls = &sds["transport_socket"]["typed_config"];
        assert_eq!(tls["common_tls_context"]["alpn_protocols"][0], "h2");
        assert_eq!(
            tls["common_tls_context"]["validation_context"]["trusted_ca"]["filename"],
            "/var/lib/meshca/sds-ca.pem"
        );
        assert!(tls.get("sni").is_none(), "no SNI for an IP address");
    }

    #[test]
    fn port_specs_are_parsed_or_refused_with_the_form_expected() {
        assert_eq!(
            "15006:8080".parse::<Inbound>(),
            Ok(Inbound {
                port: 15006,
                app_port: 8080
            })
        );
        let outbound: Outbound = "1=[::1]:2".parse().expect("IPv6");
        assert_eq!((outbound.host.as_str(), outbound.port), ("::1", 2));
        assert_eq!(outbound.peer, Peer::AnyInMesh);
        let outbound: Outbound = "1=h:2@meshservice:web-api".parse().expect("a MeshService");
        assert_eq!(outbound.peer, Peer::MeshService("web-api".to_owned()));
        let outbound: Outbound = "1=h:2@zone-egress".parse().expect("the egress");
        assert_eq!(outbound.peer, Peer::ZoneEgress);
        for bad in ["8080", "0:1", "1:70000", "a:b"] {
            let error = bad.parse::<Inbound>().expect_err(bad).to_string();
            assert!(error.contains("PORT"), "{error}");
        }
        for bad in [
            "1",
            "1=host",
            "1=:2",
            "1=h:2@not-spiffe",
            "1=h:2@meshservice:",
            "1=h:2@meshservice:Web",
            "1=h:2@meshservice:-web",
        ] {
            assert!(bad.parse::<Outbound>().is_err(), "{bad}");
        }
    }
}
