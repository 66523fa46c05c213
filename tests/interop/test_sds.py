"""meshca's SDS as Envoy sees it, through Envoy's own protos (xds-protos) and grpcio; certificates checked with
py-spiffe and cryptography, none of which meshca wrote."""

import queue
import threading
import time

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2, tls_spiffe_validator_config_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.secret.v3 import sds_pb2_grpc
from spiffe import X509Svid

SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
SPIFFE_VALIDATOR = "envoy.tls.cert_validator.spiffe"


def auth(token):
    return (("authorization", f"Bearer {token}"),)


def unpack(resource):
    assert resource.type_url == SECRET_TYPE
    s = secret_pb2.Secret()
    resource.Unpack(s)
    return s


class Stream:
    """A StreamSecrets call that is fed requests from a queue, like Envoy's gRPC mux."""

    def __init__(self, channel, token, node_id):
        self.node = base_pb2.Node(id=node_id, cluster="test")
        self.requests = queue.Queue()
        stub = sds_pb2_grpc.SecretDiscoveryServiceStub(channel)
        self.responses = stub.StreamSecrets(iter(self.requests.get, None), metadata=auth(token))
        self.first = True

    def send(self, names, version="", nonce="", error=None):
        req = discovery_pb2.DiscoveryRequest(resource_names=names, version_info=version, response_nonce=nonce)
        if self.first:
            req.node.CopyFrom(self.node)
            self.first = False
        if error:
            req.error_detail.message = error
        self.requests.put(req)

    def recv(self, timeout=10):
        box = queue.Queue()
        threading.Thread(target=lambda: box.put(next(self.responses)), daemon=True).start()
        return box.get(timeout=timeout)

    def close(self):
        self.requests.put(None)
        self.responses.cancel()


def check_identity(secret, expected_id, bundle_pems):
    chain = secret.tls_certificate.certificate_chain.inline_string.encode()
    key = secret.tls_certificate.private_key.inline_string.encode()
    certs = x509.load_pem_x509_certificates(chain)
    key_der = serialization.load_pem_private_key(key, None).private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    # py-spiffe enforces the X.509-SVID rules (one URI SAN, leaf not a CA, key usage) and the key match.
    svid = X509Svid.parse_raw(b"".join(c.public_bytes(serialization.Encoding.DER) for c in certs), key_der)
    assert str(svid.spiffe_id) == expected_id
    roots = [x509.load_pem_x509_certificate(p.encode()) for p in bundle_pems]
    issuer = certs[-1]
    assert any(issuer.issuer == r.subject for r in roots)
    root = next(r for r in roots if issuer.issuer == r.subject)
    issuer.verify_directly_issued_by(root)


def spiffe_bundles(secret):
    ctx = secret.validation_context
    assert ctx.custom_validator_config.name == SPIFFE_VALIDATOR
    cfg = tls_spiffe_validator_config_pb2.SPIFFECertValidatorConfig()
    ctx.custom_validator_config.typed_config.Unpack(cfg)
    return {td.name: td.trust_bundle.inline_string for td in cfg.trust_domains}


def split_pems(text):
    marker = "-----END CERTIFICATE-----"
    return [p.strip() + "\n" + marker + "\n" for p in text.split(marker) if p.strip()]


def test_stream_secrets_serves_own_identity_and_trust_over_unix_socket(daemon):
    token = daemon.token("web-1", "default", "--tag", "kuma.io/service=web")
    stream = Stream(daemon.unix_channel(), token, "default.web-1")
    stream.send(["default", "system_trust_bundle"])
    resp = stream.recv()
    secrets = {s.name: s for s in map(unpack, resp.resources)}
    assert sorted(secrets) == ["default", "system_trust_bundle"]
    assert resp.version_info and resp.nonce
    bundles = spiffe_bundles(secrets["system_trust_bundle"])
    assert list(bundles) == ["default"]
    check_identity(secrets["default"], "spiffe://default/web", split_pems(bundles["default"]))

    # ACK, then the admin API reports the ACKed version for this dataplane.
    stream.send(["default", "system_trust_bundle"], version=resp.version_info, nonce=resp.nonce)
    deadline = time.monotonic() + 10
    while True:
        dp = daemon.api("/api/dataplanes/default/web-1")
        if dp.get("last_acked_version") == resp.version_info:
            break
        assert time.monotonic() < deadline, dp
        time.sleep(0.05)
    assert dp["spiffe_id"] == "spiffe://default/web"
    stream.close()


def test_trust_change_is_pushed_to_an_open_stream(daemon):
    token = daemon.token("web-1", "default", "--tag", "kuma.io/service=web")
    stream = Stream(daemon.unix_channel(), token, "default.web-1")
    stream.send(["system_trust_bundle"])
    first = stream.recv()
    stream.send(["system_trust_bundle"], version=first.version_info, nonce=first.nonce)
    other = x509.load_pem_x509_certificates(daemon.data.joinpath("sds-ca.pem").read_bytes())[0]
    pem = other.public_bytes(serialization.Encoding.PEM).decode()
    indented = "".join("          " + line + "\n" for line in pem.splitlines())
    (daemon.resources / "trust.yaml").write_text(
        "type: MeshTrust\nname: other\nmesh: default\nspec:\n  trustDomain: other.mesh.local\n"
        "  caBundles:\n    - type: Pem\n      pem:\n        value: |\n" + indented
    )
    second = stream.recv(timeout=15)
    assert second.version_info != first.version_info
    bundles = spiffe_bundles(unpack(second.resources[0]))
    assert sorted(bundles) == ["default", "other.mesh.local"]
    stream.close()


def test_legacy_names_use_plain_trusted_ca_and_fetch_over_tls(daemon):
    token = daemon.token("web-1", "default", "--tag", "kuma.io/service=web")
    stub = sds_pb2_grpc.SecretDiscoveryServiceStub(daemon.tls_channel())
    req = discovery_pb2.DiscoveryRequest(
        node=base_pb2.Node(id="default.web-1"),
        resource_names=["identity_cert:secret:default", "mesh_ca:secret:default"],
    )
    resp = stub.FetchSecrets(req, metadata=auth(token), timeout=10)
    secrets = {s.name: s for s in map(unpack, resp.resources)}
    assert sorted(secrets) == ["identity_cert:secret:default", "mesh_ca:secret:default"]
    trusted = secrets["mesh_ca:secret:default"].validation_context.trusted_ca.inline_string
    check_identity(secrets["identity_cert:secret:default"], "spiffe://default/web", split_pems(trusted))

    with pytest.raises(grpc.RpcError) as e:
        stub.FetchSecrets(
            discovery_pb2.DiscoveryRequest(node=base_pb2.Node(id="default.web-1"), resource_names=["nope"]),
            metadata=auth(token),
            timeout=10,
        )
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_grpc_core_reaches_the_unix_socket_with_either_target_form(daemon):
    """grpc-core sends the socket path as the HTTP/2 :authority; the daemon must answer anyway, also when a
    repeated request refers to that header through the HPACK dynamic table."""
    token = daemon.token("web-1", "default", "--tag", "kuma.io/service=web")
    req = discovery_pb2.DiscoveryRequest(node=base_pb2.Node(id="default.web-1"), resource_names=["default", "ROOTCA"])
    for target in (f"unix://{daemon.socket}", f"unix:{daemon.socket}"):
        with grpc.insecure_channel(target) as channel:
            stub = sds_pb2_grpc.SecretDiscoveryServiceStub(channel)
            for _ in range(2):
                resp = stub.FetchSecrets(req, metadata=auth(token), timeout=10)
                assert sorted(unpack(r).name for r in resp.resources) == ["ROOTCA", "default"], target


def test_no_secret_without_the_right_token(daemon):
    token = daemon.token("web-1", "default", "--tag", "kuma.io/service=web")
    stub = sds_pb2_grpc.SecretDiscoveryServiceStub(daemon.unix_channel())
    req = discovery_pb2.DiscoveryRequest(node=base_pb2.Node(id="default.web-1"), resource_names=["default"])
    with pytest.raises(grpc.RpcError) as e:
        stub.FetchSecrets(req, timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as e:
        stub.FetchSecrets(req, metadata=auth(token[:-4] + "AAAA"), timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    other = discovery_pb2.DiscoveryRequest(node=base_pb2.Node(id="default.web-2"), resource_names=["default"])
    with pytest.raises(grpc.RpcError) as e:
        stub.FetchSecrets(other, metadata=auth(token), timeout=10)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_delta_secrets_subscribe(daemon):
    token = daemon.token("web-1", "default", "--tag", "kuma.io/service=web")
    stub = sds_pb2_grpc.SecretDiscoveryServiceStub(daemon.unix_channel())
    requests = queue.Queue()
    responses = stub.DeltaSecrets(iter(requests.get, None), metadata=auth(token))
    requests.put(
        discovery_pb2.DeltaDiscoveryRequest(
            node=base_pb2.Node(id="default.web-1"), resource_names_subscribe=["default", "ROOTCA"]
        )
    )
    resp = next(responses)
    names = sorted(r.name for r in resp.resources)
    assert names == ["ROOTCA", "default"]
    for r in resp.resources:
        assert r.version
        assert unpack(r.resource).name == r.name
    requests.put(None)
    responses.cancel()


def make_ca(name, issuer=None, issuer_key=None, path_length=None):
    """A CA certificate and key made with cryptography, independent of meshca."""
    import datetime

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    signer = issuer_key or key
    builder = builder.add_extension(
        x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False
    )
    return builder.sign(signer, hashes.SHA256()), key


def test_provided_intermediate_ca_chain_verifies_to_its_root(daemon):
    """A provided backend whose PEM holds an intermediate then its root: the SDS chain is leaf + intermediate,
    the trust bundle holds the root, and cryptography's own path builder validates leaf → intermediate → root."""
    import datetime

    from cryptography.x509.verification import PolicyBuilder, Store

    root, root_key = make_ca("interop root")
    inter, inter_key = make_ca("interop intermediate", root, root_key, path_length=0)
    pem = serialization.Encoding.PEM
    (daemon.root / "ca.pem").write_bytes(inter.public_bytes(pem) + root.public_bytes(pem))
    (daemon.root / "ca.key").write_bytes(
        inter_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    (daemon.resources / "mesh.yaml").write_text(
        "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\nmtls:\n  enabledBackend: provided-1\n  backends:\n"
        "    - name: provided-1\n      type: provided\n"
        f"      conf:\n        cert: {{file: {daemon.root / 'ca.pem'}}}\n        key: {{file: {daemon.root / 'ca.key'}}}\n"
    )
    token = daemon.token("web-1", "default", "--tag", "kuma.io/service=web")
    stub = sds_pb2_grpc.SecretDiscoveryServiceStub(daemon.unix_channel())
    req = discovery_pb2.DiscoveryRequest(
        node=base_pb2.Node(id="default.web-1"), resource_names=["default", "mesh_ca:secret:default"]
    )
    deadline = time.monotonic() + 15
    while True:
        # The file watcher applies the new mesh within a second; the builtin CA keeps issuing until then,
        # and stays trusted (break last) until no connected proxy may present its certificates.
        resp = stub.FetchSecrets(req, metadata=auth(token), timeout=10)
        secrets = {s.name: s for s in map(unpack, resp.resources)}
        chain = x509.load_pem_x509_certificates(
            secrets["default"].tls_certificate.certificate_chain.inline_string.encode()
        )
        bundle = x509.load_pem_x509_certificates(
            secrets["mesh_ca:secret:default"].validation_context.trusted_ca.inline_string.encode()
        )
        if len(chain) == 2 and bundle == [root]:
            break
        assert time.monotonic() < deadline, f"the provided CA never took over: {chain} {bundle}"
        time.sleep(0.05)
    leaf, served_inter = chain
    assert served_inter == inter, "the chain carries the intermediate after the leaf"
    verifier = (
        PolicyBuilder()
        .store(Store(bundle))
        .time(datetime.datetime.now(datetime.timezone.utc))
        .build_client_verifier()
    )
    verified = verifier.verify(leaf, [served_inter])
    assert [s.value for s in verified.subjects] == ["spiffe://default/web"]


MESH_SERVICES = """\
---
type: MeshService
name: web
mesh: default
spec:
  selector: {dataplaneTags: {kuma.io/service: web}}
  ports: [{port: 80, targetPort: 8080}]
---
type: MeshService
name: partner
mesh: default
labels: {kuma.io/zone: zone-2}
spec:
  selector: {dataplaneTags: {kuma.io/service: partner}}
  ports: [{port: 80, targetPort: 8080}]
  identities: [{type: SpiffeID, value: "spiffe://partner.example/web"}, {type: ServiceTag, value: partner}]
---
type: Dataplane
mesh: default
name: web-1
networking:
  address: 10.0.0.1
  inbound: [{port: 8080, tags: {kuma.io/service: web}}]
"""


def meshservice_context(daemon, token, name):
    """The `meshservice:<name>` secret, asked for on a stream until the daemon has applied the file."""
    # The daemon applies the file within a second; until then the name means nothing and nothing is sent.
    deadline = time.monotonic() + 30
    while True:
        stream = Stream(daemon.unix_channel(), token, "default.client-1")
        stream.send([name])
        try:
            resp = stream.recv(timeout=2)
            break
        except queue.Empty:
            stream.close()
            assert time.monotonic() < deadline, f"{name} was never served"
    stream.close()
    assert [unpack(r).name for r in resp.resources] == [name]
    return unpack(resp.resources[0])


def san_matchers(secret):
    uri = common_pb2.SubjectAltNameMatcher.URI
    ctx = secret.validation_context
    assert all(m.san_type == uri for m in ctx.match_typed_subject_alt_names)
    return sorted(m.matcher.exact for m in ctx.match_typed_subject_alt_names)


def test_a_meshservice_context_decodes_with_exactly_the_services_identities(daemon):
    daemon.write_resource("services.yaml", MESH_SERVICES)
    token = daemon.token("client-1", "default", "--tag", "kuma.io/service=client")
    # Envoy's own decoding: the mesh's SPIFFE trust, and exact URI SAN matchers for the service's identities.
    # A service of this zone: computed from its dataplane (its ServiceTag, the legacy ID it is issued).
    web = meshservice_context(daemon, token, "meshservice:web")
    assert web.validation_context.custom_validator_config.name == SPIFFE_VALIDATOR
    assert "default" in spiffe_bundles(web)
    assert san_matchers(web) == ["spiffe://default/web"]
    # A service of another zone: exactly the identities it arrived with.
    partner = meshservice_context(daemon, token, "meshservice:partner")
    assert san_matchers(partner) == ["spiffe://default/partner", "spiffe://partner.example/web"]
