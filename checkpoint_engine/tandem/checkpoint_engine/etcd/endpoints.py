"""The one parser of etcd endpoints, for every component (lowest layer: everyone may import it).

Role: turn what a job spec (`checkpointEngine.etcd.endpoints`), the chart or `TANDEM_ETCD_ENDPOINTS`
says into (host, port) pairs for the etcd clients. Accepted: `host`, `host:port`,
`http://host[:port]`, `https://host[:port]`, IPv6 as `[::1]:2379`; no port means etcd's client
port 2379; a path, query or user part is refused. Callers: `version_registry.Registry` (sidecars; it
uses every endpoint, failing over among them in `failover`),
`transport.rdma` (Mooncake's metadata server), `tandem.operator.cluster.etcd_store`, the sidecars (trainer
context, rollout entry). `endpoint_scheme` tells `security` whether an endpoint asked for TLS
(`https://`), for plain text (`http://`) or left it to the configured certificates (no scheme).
"""

from __future__ import annotations

from urllib.parse import urlsplit

DEFAULT_PORT = 2379


class EndpointError(ValueError):
    """An etcd endpoint that cannot be used; the message quotes it."""


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """(host, port) of one endpoint; raises EndpointError naming it when it is not one."""
    _, host, port = _parse(endpoint)
    return host, port


def endpoint_scheme(endpoint: str) -> str | None:
    """The scheme asked for: "https", "http", or None when the endpoint names none (host[:port])."""
    scheme, _, _ = _parse(endpoint)
    return scheme


def _parse(endpoint: str) -> tuple[str | None, str, int]:
    text = endpoint.strip()
    url = urlsplit(text if "://" in text else f"http://{text}")
    try:
        port = url.port
    except ValueError:
        raise EndpointError(f"etcd endpoint {endpoint!r}: the port is not a number in 1-65535") from None
    if url.scheme not in ("http", "https") or not url.hostname:
        raise EndpointError(f"etcd endpoint {endpoint!r} is not host[:port] or http(s)://host[:port]")
    if url.path.strip("/") or url.query or url.fragment or url.username or url.password:
        raise EndpointError(f"etcd endpoint {endpoint!r} has parts an etcd endpoint does not take")
    return (url.scheme if "://" in text else None), url.hostname, port or DEFAULT_PORT


def split_endpoints(text: str) -> list[str]:
    """The endpoints of a comma-separated list (as TANDEM_ETCD_ENDPOINTS carries them), each checked."""
    out = [e.strip() for e in text.split(",") if e.strip()]
    for e in out:
        parse_endpoint(e)
    return out
