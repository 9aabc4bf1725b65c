"""The one etcd endpoint parser: every form a spec, the chart or the pod env may carry, and refusals."""

from __future__ import annotations

import pytest

from tandem.checkpoint_engine.etcd import security as etcd_security
from tandem.checkpoint_engine.etcd.endpoints import EndpointError, parse_endpoint, split_endpoints
from tandem.operator.cluster import etcd_store
from tandem.spec.podenv import PodEnv


@pytest.mark.parametrize(("endpoint", "expected"), [
    ("127.0.0.1:2379", ("127.0.0.1", 2379)),
    ("http://tandem-etcd:12379", ("tandem-etcd", 12379)),
    ("http://tandem-etcd", ("tandem-etcd", 2379)),  # the two old parsers disagreed on this one
    ("https://etcd.example.org/", ("etcd.example.org", 2379)),
    ("etcd-0.etcd.ns.svc", ("etcd-0.etcd.ns.svc", 2379)),
    ("[::1]:2380", ("::1", 2380)),
    (" http://10.0.0.5:2379 ", ("10.0.0.5", 2379)),
])
def test_accepted_forms(endpoint: str, expected: tuple[str, int]) -> None:
    assert parse_endpoint(endpoint) == expected


@pytest.mark.parametrize("endpoint", ["", "http://", "ftp://host:1", "host:port", "host:99999", "http://h:1/v3",
                                      "http://u:p@h:1", "http://h:1?x=1"])
def test_refused_forms_name_the_endpoint(endpoint: str) -> None:
    with pytest.raises(EndpointError, match="etcd endpoint"):
        parse_endpoint(endpoint)


def test_lists_and_every_component_use_the_same_parser() -> None:
    assert split_endpoints("http://a:1, b ,,http://c") == ["http://a:1", "b", "http://c"]
    with pytest.raises(EndpointError):
        split_endpoints("http://a:1,http://b:x")
    # every etcd client (sidecars' registries, the operator's store) dials through EtcdSecurity.client
    assert etcd_security.parse_endpoint is parse_endpoint
    assert etcd_store.EtcdSecurity is etcd_security.EtcdSecurity
    env = PodEnv.model_validate({"TANDEM_JOB": "j", "TANDEM_ROLE": "trainer", "TANDEM_POD": "p",
                                 "TANDEM_JOB_FILE": "/x", "TANDEM_ETCD_ENDPOINTS": "http://e1,e2:12379",
                                 "TANDEM_CE_PORT": "8700"})
    assert [parse_endpoint(e) for e in split_endpoints(env.etcd_endpoints)] == [("e1", 2379), ("e2", 12379)]
