"""etcd over TLS with client certificates and per-job users: a real etcd 3.4, real certificates.

The server runs `--client-cert-auth` with a CA generated here (`cryptography`, the helpers of
tests/operator/k8s_pki.py) and auth enabled: a root user, and per job a role granting read-write on
that job's prefix /tandem/jobs/<ns>/<job>/ only (etcdctl). What must hold: the registry publishes
and reads a version over TLS as the job's user; a client without a certificate is refused; plain
http:// to it is refused at construction when certificates are configured; a job's user cannot
write under another job's prefix (RegistryPermissionDenied, naming the user); a wrong password is
RegistryAuthFailed; the operator's store reads progress over the same TLS.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib.util
import ipaddress
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.etcd import keys
from tandem.checkpoint_engine.etcd.endpoints import EndpointError
from tandem.checkpoint_engine.etcd.local_etcd import EtcdNotFound, LocalEtcd
from tandem.checkpoint_engine.etcd.security import EtcdSecurity
from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.versions import version_writer
from tandem.operator.cluster.etcd_store import EtcdStore, EtcdUnavailable
from tandem.spec.progress import Progress

pytestmark = pytest.mark.etcd

NS = "secure"
ROOT_PW = "root-pw"
JOBS = {"job-a": "pw-a", "job-b": "pw-b"}  # job name = etcd user = role


def _k8s_pki() -> Any:
    path = Path(__file__).resolve().parents[1] / "operator" / "k8s_pki.py"
    spec = importlib.util.spec_from_file_location("k8s_pki_for_etcd", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_etcd_pki(d: Path) -> None:
    """ca.crt, server.crt/.key (127.0.0.1, localhost), client.crt/.key signed by the CA, and
    stranger.crt/.key signed by another CA (a certificate etcd must not trust)."""
    pki = _k8s_pki()
    d.mkdir(parents=True, exist_ok=True)
    ca_key, other_key = pki._key(), pki._key()
    ca_name, other_name = pki._name("tandem-etcd-ca"), pki._name("someone-else-ca")
    ca = pki._cert(ca_name, ca_key, ca_name, ca_key, ca=True)
    sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    srv_key, cli_key, str_key = pki._key(), pki._key(), pki._key()
    files = {
        "ca.crt": ca,
        "server.crt": pki._cert(pki._name("etcd"), srv_key, ca_name, ca_key, sans=sans, server=True),
        "client.crt": pki._cert(pki._name("tandem-client"), cli_key, ca_name, ca_key),
        "stranger.crt": pki._cert(pki._name("tandem-client"), str_key, other_name, other_key),
    }
    for name, cert in files.items():
        (d / name).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    for name, key in (("server.key", srv_key), ("client.key", cli_key), ("stranger.key", str_key)):
        (d / name).write_bytes(pki._pem_key(key))
    assert dt.datetime.now(dt.UTC) < ca.not_valid_after_utc


def etcdctl(server: LocalEtcd, *args: str, user: str | None = None) -> str:
    d = server.tls_dir
    assert d is not None
    cmd = ["etcdctl", f"--endpoints={server.endpoint}", f"--cacert={d / 'ca.crt'}", f"--cert={d / 'client.crt'}",
           f"--key={d / 'client.key'}", *([f"--user={user}"] if user else []), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, env={"ETCDCTL_API": "3"})
    assert done.returncode == 0, f"{' '.join(args)}: {done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def secure_etcd() -> Iterator[LocalEtcd]:
    if shutil.which("etcdctl") is None:
        pytest.skip("etcdctl not found: run scripts/setup.sh (installs Debian's etcd-client)")
    tmp = Path(tempfile.mkdtemp(prefix="tandem-etcd-tls-"))
    write_etcd_pki(tmp / "pki")
    try:
        server = LocalEtcd(tmp / "data", tls_dir=tmp / "pki")
    except EtcdNotFound as e:
        pytest.skip(str(e))
    server.start()
    try:
        etcdctl(server, "user", "add", f"root:{ROOT_PW}")
        etcdctl(server, "user", "grant-role", "root", "root")
        for job, pw in JOBS.items():
            etcdctl(server, "role", "add", job)
            etcdctl(server, "role", "grant-permission", job, "--prefix=true", "readwrite",
                    keys.job_prefix(NS, job))
            etcdctl(server, "user", "add", f"{job}:{pw}")
            etcdctl(server, "user", "grant-role", job, job)
        etcdctl(server, "auth", "enable")
        yield server
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def security(server: LocalEtcd, user: str | None, password: str | None = None, cert: str = "client") -> EtcdSecurity:
    d = server.tls_dir
    assert d is not None
    return EtcdSecurity(ca_file=str(d / "ca.crt"), cert_file=str(d / f"{cert}.crt"), key_file=str(d / f"{cert}.key"),
                        username=user, password=password if password is not None else JOBS.get(user or "", ""))


def registry(server: LocalEtcd, sec: EtcdSecurity, job: str = "job-a", pod: str = "pod0",
             role: str = "trainer") -> SyncRegistry:
    return SyncRegistry(server.endpoint, NS, job, pod, role, ttl=5, timeout=2.0, failover_s=2.0, uid="uid-1",
                        security=sec)


def test_a_version_is_published_and_read_over_tls_as_the_jobs_user(secure_etcd: LocalEtcd, tmp_path: Path) -> None:
    assert secure_etcd.endpoint.startswith("https://")
    writer = registry(secure_etcd, security(secure_etcd, "job-a")).connect(wait_s=10)
    reader = registry(secure_etcd, security(secure_etcd, "job-a"), pod="pod1", role="rollout").connect(wait_s=10)
    try:
        rep = version_writer.write_version(tmp_path, "job-a", 1, [("w", torch.ones(4, 4))], shard_bytes=64)
        writer.register(rep.index, str(rep.path))
        assert reader.latest() == 1
        assert reader.version_record(1)["shards"] == len(rep.index.shards)
        reader.pin(1)
        assert writer.readers(1) == ["pod1.rollout"]
        # what the registry wrote is where the root user (etcdctl) finds it: under the job's uid
        listed = etcdctl(secure_etcd, "get", "--prefix", "--keys-only", keys.job_prefix(NS, "job-a"),
                         user=f"root:{ROOT_PW}")
        assert keys.version(NS, keys.scope("job-a", "uid-1"), 1) in listed.split()
    finally:
        reader.close()
        writer.close()


def test_a_client_without_a_certificate_is_refused(secure_etcd: LocalEtcd) -> None:
    d = secure_etcd.tls_dir
    assert d is not None
    no_cert = EtcdSecurity(ca_file=str(d / "ca.crt"), username="job-a", password=JOBS["job-a"])
    reg = registry(secure_etcd, no_cert)
    try:
        with pytest.raises(errors.RegistryUnavailable, match="failed on every endpoint.*TLS handshake failed"):
            reg.connect(wait_s=2)
    finally:
        reg.close(revoke=False)
    stranger = registry(secure_etcd, security(secure_etcd, "job-a", cert="stranger"))
    try:
        with pytest.raises(errors.RegistryUnavailable):
            stranger.connect(wait_s=2)
    finally:
        stranger.close(revoke=False)
    with pytest.raises(EndpointError, match="https://"):  # certificates configured, plain text asked for
        SyncRegistry(secure_etcd.endpoint.replace("https://", "http://"), NS, "job-a", "pod0", "trainer",
                     security=security(secure_etcd, "job-a"))


def test_a_jobs_user_cannot_write_under_another_jobs_prefix(secure_etcd: LocalEtcd) -> None:
    a = registry(secure_etcd, security(secure_etcd, "job-a")).connect(wait_s=10)
    try:
        other = keys.progress(NS, keys.scope("job-b", "uid-1"))
        with pytest.raises(errors.RegistryPermissionDenied, match="job-a") as refused:
            a.put_json(other, {"phase": "Running"})
        assert refused.value.status_code == 403
        with pytest.raises(errors.RegistryPermissionDenied):
            a.get_json(other)
        a.put_json(keys.progress(NS, a.scope), {"phase": "Running"})  # its own prefix: allowed
        assert a.get_json(keys.progress(NS, a.scope)) == {"phase": "Running"}
    finally:
        a.close()
    # a registry that names job-b but holds job-a's credentials is refused at its first read
    posing = registry(secure_etcd, security(secure_etcd, "job-a"), job="job-b")
    try:
        with pytest.raises(errors.RegistryPermissionDenied):
            posing.connect(wait_s=5)
    finally:
        posing.close(revoke=False)


def test_a_wrong_password_is_an_auth_error(secure_etcd: LocalEtcd) -> None:
    reg = registry(secure_etcd, security(secure_etcd, "job-a", password="not-it"))
    try:
        with pytest.raises(errors.RegistryAuthFailed, match="job-a"):
            reg.connect(wait_s=5)
    finally:
        reg.close(revoke=False)


def test_the_operator_reads_progress_over_tls_as_root(secure_etcd: LocalEtcd) -> None:
    writer = registry(secure_etcd, security(secure_etcd, "job-b"), job="job-b").connect(wait_s=10)
    try:
        writer.put_json(keys.progress(NS, writer.scope), json.loads(Progress(phase="train", iteration=3).to_json()))
    finally:
        writer.close()

    async def read(store: EtcdStore, uid: str) -> Progress | None:
        try:
            return await store.read_progress([secure_etcd.endpoint], NS, "job-b", uid)
        finally:
            await store.close()

    root = EtcdStore(timeout=2.0, security=security(secure_etcd, "root", ROOT_PW))
    got = asyncio.run(read(root, "uid-1"))
    assert got is not None and got.iteration == 3
    assert asyncio.run(read(EtcdStore(2.0, security(secure_etcd, "root", ROOT_PW)), "uid-2")) is None  # a newer job
    with pytest.raises(EtcdUnavailable, match="RegistryPermissionDenied"):  # job-a's user on job-b's record
        asyncio.run(read(EtcdStore(2.0, security(secure_etcd, "job-a")), "uid-1"))


def test_an_invalidated_auth_token_is_fetched_again(secure_etcd: LocalEtcd) -> None:
    """etcd drops a user's tokens when its password is set (as when a token idles past
    --auth-token-ttl); the registry's next request dials again and authenticates afresh."""
    reg = registry(secure_etcd, security(secure_etcd, "job-a")).connect(wait_s=10)
    try:
        reg.put_json(keys.progress(NS, reg.scope), {"n": 1})
        d = secure_etcd.tls_dir
        assert d is not None
        done = subprocess.run(
            ["etcdctl", f"--endpoints={secure_etcd.endpoint}", f"--cacert={d / 'ca.crt'}",
             f"--cert={d / 'client.crt'}", f"--key={d / 'client.key'}", f"--user=root:{ROOT_PW}",
             "user", "passwd", "job-a", "--interactive=false"],
            input=JOBS["job-a"] + "\n", capture_output=True, text=True, timeout=30, env={"ETCDCTL_API": "3"})
        assert done.returncode == 0, done.stderr
        assert reg.get_json(keys.progress(NS, reg.scope)) == {"n": 1}
        reg.put_json(keys.progress(NS, reg.scope), {"n": 2})
        assert reg.get_json(keys.progress(NS, reg.scope)) == {"n": 2}
    finally:
        reg.close()
