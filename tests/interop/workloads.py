"""A workload: a Workload API client that the interop tests run as another uid, so that meshca tells it apart
by its process alone.

    python -I workloads.py SITE_DIR SOCKET MODE [ARG...]

SITE_DIR holds the client's packages (a copy every uid may read). It writes one JSON object per line to
stdout, and the long-running modes end when stdin closes. Modes:

  context [TRUST_DOMAIN...]  one fetch_x509_context(): the context (and the bundles of the trust domains
                             named, looked up by get_bundle_for_trust_domain), or the error
  svids                      the SPIFFE IDs of fetch_x509_svids(), in order
  source TIMEOUT             "starting", then an X509Source's first context (it retries denials itself)
  watch                      every context stream_x509_contexts() delivers, and every error
  raw                        a raw FetchX509SVID stream with the security header: each message's SPIFFE
                             IDs, then the status that ended it (CANCELLED when
                             stdin closes)
  serve PEER_ID              spiffe-tls mTLS listener that lets only PEER_ID in: its port, then one exchange
  dial PORT PEER_ID          spiffe-tls mTLS client to 127.0.0.1:PORT that accepts only PEER_ID
  jwt AUDIENCE               a JWT-SVID (and its token), checked against the JWT bundles
  validate TOKEN AUDIENCE    what ValidateJWTSVID says of a token
"""

import base64
import json
import sys
import threading

sys.path.insert(0, sys.argv[1])

import grpc  # noqa: E402
from cryptography.hazmat.primitives import serialization  # noqa: E402
from spiffe import JwtSvid, SpiffeId, TrustDomain, WorkloadApiClient, X509Source  # noqa: E402
from spiffe._proto import workload_pb2, workload_pb2_grpc  # noqa: E402

SOCKET = sys.argv[2]
ENDPOINT = f"unix://{SOCKET}"
TIMEOUT = 30


def emit(**fields):
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def b64(data):
    return base64.b64encode(data).decode()


def der(cert):
    return b64(cert.public_bytes(serialization.Encoding.DER))


def error(e):
    return {"error": type(e).__name__, "message": str(e)}


def context_fields(ctx):
    """An X509Context as plain data: every SVID (chain and key) and every bundle, by trust domain."""
    svids = [
        {
            "spiffe_id": str(s.spiffe_id),
            "chain": [der(c) for c in s.cert_chain],
            "key": b64(
                s.private_key.private_bytes(
                    serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
                )
            ),
        }
        for s in ctx.x509_svids
    ]
    bundles = {
        b.trust_domain.name: [der(c) for c in b.x509_authorities] for b in ctx.x509_bundle_set.bundles
    }
    return {"svids": svids, "bundles": bundles}


def until_stdin_closes():
    sys.stdin.read()


def context(*trust_domains):
    try:
        with WorkloadApiClient(ENDPOINT, default_timeout=TIMEOUT) as client:
            ctx = client.fetch_x509_context()
            found = {td: ctx.x509_bundle_set.get_bundle_for_trust_domain(TrustDomain(td)) for td in trust_domains}
            lookup = {td: b and [der(c) for c in b.x509_authorities] for td, b in found.items()}
            emit(**context_fields(ctx), lookup=lookup)
    except Exception as e:
        emit(**error(e))


def svids():
    try:
        with WorkloadApiClient(ENDPOINT, default_timeout=TIMEOUT) as client:
            emit(spiffe_ids=[str(s.spiffe_id) for s in client.fetch_x509_svids()])
    except Exception as e:
        emit(**error(e))


def source(timeout):
    emit(event="starting")
    try:
        with X509Source(socket_path=ENDPOINT, timeout_in_seconds=float(timeout)) as src:
            emit(**context_fields(src.get_x509_context()))
    except Exception as e:
        emit(**error(e))


def watch():
    with WorkloadApiClient(ENDPOINT) as client:
        handle = client.stream_x509_contexts(
            on_success=lambda ctx: emit(**context_fields(ctx)), on_error=lambda e: emit(**error(e))
        )
        until_stdin_closes()
        handle.cancel()


def raw():
    with grpc.insecure_channel(ENDPOINT) as channel:
        stub = workload_pb2_grpc.SpiffeWorkloadAPIStub(channel)
        stream = stub.FetchX509SVID(
            workload_pb2.X509SVIDRequest(), metadata=(("workload.spiffe.io", "true"),), timeout=120
        )
        threading.Thread(target=lambda: (until_stdin_closes(), stream.cancel()), daemon=True).start()
        try:
            for message in stream:
                emit(svids=[s.spiffe_id for s in message.svids])
            emit(status="OK", details="")
        except grpc.RpcError as e:
            emit(status=e.code().name, details=e.details())


def authorizer(peer_id):
    from spiffetls.tlsconfig.authorize import authorize_id

    return authorize_id(SpiffeId(peer_id))


def serve(peer_id):
    from spiffetls import ListenOptions, ServerTlsMode, listen

    with X509Source(socket_path=ENDPOINT, timeout_in_seconds=TIMEOUT) as src:
        options = ListenOptions(tls_mode=ServerTlsMode.MTLS, authorize_fn=authorizer(peer_id))
        listener = listen("127.0.0.1:0", src, options)
        emit(port=listener.getsockname()[1])
        try:
            conn, _ = listener.accept()
            conn.do_handshake()
            got = conn.recv(1024).decode()
            conn.sendall(f"pong from {src.get_x509_context().default_svid.spiffe_id}".encode())
            emit(received=got)
            conn.shutdown()
            conn.close()
        except Exception as e:
            emit(**error(e))
        listener.close()


def dial(port, peer_id):
    from spiffetls import ClientTlsMode, dial as tls_dial

    with X509Source(socket_path=ENDPOINT, timeout_in_seconds=TIMEOUT) as src:
        try:
            # TLS mode: the client authenticates the server; it presents its own SVID whenever asked.
            conn = tls_dial(f"127.0.0.1:{port}", src, ClientTlsMode.TLS, authorizer(peer_id))
            conn.sendall(f"ping from {src.get_x509_context().default_svid.spiffe_id}".encode())
            emit(received=conn.recv(1024).decode())
            conn.close()
        except Exception as e:
            emit(**error(e))


def jwt(audience):
    try:
        with WorkloadApiClient(ENDPOINT, default_timeout=TIMEOUT) as client:
            svid = client.fetch_jwt_svid(audience={audience})
            bundle = client.fetch_jwt_bundles().get_bundle_for_trust_domain(svid.spiffe_id.trust_domain)
            parsed = JwtSvid.parse_and_validate(svid.token, bundle, {audience})
            emit(
                spiffe_id=str(svid.spiffe_id),
                parsed_id=str(parsed.spiffe_id),
                audience=sorted(parsed.audience),
                expiry=parsed.expiry,
                token=svid.token,
            )
    except Exception as e:
        emit(**error(e))


def validate(token, audience):
    try:
        with WorkloadApiClient(ENDPOINT, default_timeout=TIMEOUT) as client:
            emit(spiffe_id=str(client.validate_jwt_svid(token, audience).spiffe_id))
    except Exception as e:
        emit(**error(e))


def jwt_bundle(trust_domain):
    """The kids of `trust_domain`'s JWT bundle, as py-spiffe parses FetchJWTBundles."""
    try:
        with WorkloadApiClient(ENDPOINT, default_timeout=TIMEOUT) as client:
            bundle = client.fetch_jwt_bundles().get_bundle_for_trust_domain(TrustDomain(trust_domain))
            emit(kids=sorted(bundle.jwt_authorities.keys()) if bundle else None)
    except Exception as e:
        emit(**error(e))


MODES = {"jwt_bundle": jwt_bundle, "context": context, "svids": svids, "source": source, "watch": watch, "raw": raw, "serve": serve, "dial": dial, "jwt": jwt, "validate": validate}

if __name__ == "__main__":
    MODES[sys.argv[3]](*sys.argv[4:])
