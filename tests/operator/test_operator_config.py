"""The operator's settings from its environment (`tandem.operator.runtime.env_settings`): its etcd credentials."""

from __future__ import annotations

import pytest

from tandem.operator.runtime.env_settings import ConfigError, OperatorConfig


def test_etcd_credentials_come_from_the_environment() -> None:
    cfg = OperatorConfig.from_env({
        "TANDEM_ETCD_ENDPOINTS": "https://etcd-0:2379,https://etcd-1:2379",
        "TANDEM_ETCD_CA_FILE": "/etc/tandem-etcd/ca.crt", "TANDEM_ETCD_CERT_FILE": "/etc/tandem-etcd/tls.crt",
        "TANDEM_ETCD_KEY_FILE": "/etc/tandem-etcd/tls.key", "TANDEM_ETCD_USERNAME": "tandem-operator",
        "TANDEM_ETCD_PASSWORD": "s3cret",
    })
    sec = cfg.etcd_security
    assert cfg.etcd_endpoints == ("https://etcd-0:2379", "https://etcd-1:2379")
    assert (sec.ca_file, sec.cert_file, sec.key_file) == ("/etc/tandem-etcd/ca.crt", "/etc/tandem-etcd/tls.crt",
                                                          "/etc/tandem-etcd/tls.key")
    assert (sec.username, sec.password) == ("tandem-operator", "s3cret")
    assert sec.tls_for("https://etcd-0:2379") and sec.tls_for("etcd-0:2379")
    plain = OperatorConfig.from_env({}).etcd_security
    assert not plain.has_tls and plain.username is None and not plain.tls_for("etcd:2379")
    assert plain.tls_for("https://etcd:2379")  # https:// alone dials TLS (the system's CAs)


@pytest.mark.parametrize(("env", "named"), [
    ({"TANDEM_ETCD_CERT_FILE": "/c.crt"}, "TANDEM_ETCD_KEY_FILE"),
    ({"TANDEM_ETCD_USERNAME": "op"}, "TANDEM_ETCD_PASSWORD"),
])
def test_half_a_credential_is_refused_naming_the_missing_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        OperatorConfig.from_env(env)
