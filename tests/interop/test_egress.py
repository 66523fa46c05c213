"""The zone egress as Envoy sees it: one identity for sidecars of every mesh, decoded through Envoy's protos and
checked with cryptography, then a real Envoy egress carrying traffic from real Envoy sidecars of two meshes."""

import time

from sidecars import Backend, Envoy, free_port, http_get, validate, wait_until
from test_sds import Stream, check_identity, split_pems, spiffe_bundles, unpack

OTHER_MESH = """\
type: Mesh
name: other
meshServices:
  mode: Exclusive
mtls:
  enabledBackend: other-1
  backends:
    - name: other-1
      type: builtin
"""


def add_other_mesh(daemon):
    daemon.write_resource("other.yaml", OTHER_MESH)
    wait_until("mesh other to be loaded",
               lambda: "other" in {m["name"] for m in daemon.api("/api/meshes")})


def secrets(daemon, token, node_id, names):
    """The secrets `names` as one SotW stream first receives them all."""
    stream = Stream(daemon.unix_channel(), token, node_id)
    stream.send(names)
    got = {}
    deadline = time.monotonic() + 30
    try:
        while set(got) != set(names):
            assert time.monotonic() < deadline, f"{node_id} got only {sorted(got)} of {names}"
            resp = stream.recv(timeout=10)
            got.update({unpack(r).name: unpack(r) for r in resp.resources})
            stream.send(names, version=resp.version_info, nonce=resp.nonce)
    finally:
        stream.close()
    return got


def test_the_egress_bundle_validates_the_egress_and_all_validates_every_mesh(daemon):
    add_other_mesh(daemon)
    egress = secrets(daemon, daemon.token("egress-1", "default", "--type", "zone-egress"), "default.egress-1",
                     ["default", "ALL"])
    web = secrets(daemon, daemon.token("web-1", "default", "--tag", "kuma.io/service=web"), "default.web-1",
                  ["default", "system_trust_bundle_egress"])
    api = secrets(daemon, daemon.token("api-1", "other", "--tag", "kuma.io/service=api"), "other.api-1",
                  ["default", "system_trust_bundle_egress"])

    # Both sidecars, whatever their mesh, get the same egress bundle: the default mesh's CA, and the egress's
    # SPIFFE ID as the one SAN matcher.
    for sidecar in (web, api):
        bundle = sidecar["system_trust_bundle_egress"]
        assert list(spiffe_bundles(bundle)) == ["default"]
        sans = [m.matcher.exact for m in bundle.validation_context.match_typed_subject_alt_names]
        assert sans == ["spiffe://default/zone-egress"]
        # It validates the egress certificate (py-spiffe's SVID rules, then the chain).
        check_identity(egress["default"], "spiffe://default/zone-egress",
                       split_pems(spiffe_bundles(bundle)["default"]))

    # The egress's ALL validates the sidecars of both meshes, each under its trust domain.
    all_meshes = spiffe_bundles(egress["ALL"])
    assert set(all_meshes) == {"default", "other"}
    check_identity(web["default"], "spiffe://default/web", split_pems(all_meshes["default"]))
    check_identity(api["default"], "spiffe://other/api", split_pems(all_meshes["other"]))


def bootstrap(daemon, root, name, mesh, token_args, *flags):
    token = root / f"{name}.token"
    token.write_text(daemon.token(name, mesh, *token_args))
    out = daemon.cli("bootstrap", "--config", str(daemon.config), "--token-file", str(token),
                     "--admin-port", str(free_port()), *flags).stdout
    path = root / f"validate-{name}.yaml"
    path.write_text(out)
    validate(path)
    return out


def test_a_real_envoy_egress_carries_traffic_from_sidecars_of_two_meshes(daemon, tmp_path):
    add_other_mesh(daemon)
    backend = Backend()
    envoys = []
    try:
        egress_port = free_port()
        envoys.append(Envoy(tmp_path, "egress", bootstrap(
            daemon, tmp_path, "egress-1", "default", ("--type", "zone-egress"),
            "--inbound", f"{egress_port}:{backend.port}")))
        routes = {}
        for name, mesh, service in (("web-1", "default", "web"), ("api-1", "other", "api")):
            port = free_port()
            routes[f"spiffe://{mesh}/{service}"] = port
            envoys.append(Envoy(tmp_path, name, bootstrap(
                daemon, tmp_path, name, mesh, ("--tag", f"kuma.io/service={service}"),
                "--one-request-per-connection", "--outbound", f"{port}=127.0.0.1:{egress_port}@zone-egress")))
        for envoy in envoys:
            envoy.wait_live()
        wait_until("the egress to present its identity",
                   lambda: "spiffe://default/zone-egress" in envoys[0].cert_chain_sans())
        # Each sidecar reaches the backend through the egress; the egress saw who called.
        for caller, port in routes.items():
            for _ in range(5):
                status, body = http_get(f"http://127.0.0.1:{port}/")
                assert status == 200, body
                assert f"URI={caller}" in body, body
        for envoy in envoys:
            assert set(envoy.sds_update_rejections().values()) == {0}
        assert "ALL" in envoys[0].active_secret_names()
        assert "system_trust_bundle_egress" in envoys[1].active_secret_names()
    finally:
        for envoy in envoys:
            envoy.stop()
        backend.stop()
