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
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2, tls_spiffe_validator_config_pb2
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
