"""How every etcd client of the project checks the server and proves itself: TLS and user/password.

Role: `EtcdSecurity` holds a CA bundle, a client certificate + key and an etcd user; `client()`
builds the aetcd client of one endpoint with them, `errors_of()` turns etcd's auth refusals into
typed errors. Callers: `failover.EtcdCluster` (the sidecars' registries, `tandem run`) and
`tandem.operator.cluster.etcd_store` (the operator). Writers of the settings: the sidecars from the pod env
contract (TANDEM_ETCD_CA_FILE, ..._CERT_FILE, ..._KEY_FILE, ..._USERNAME, ..._PASSWORD: the job's
`checkpointEngine.etcd.tlsSecret` mounted and `authSecret` referenced), the operator from its own
environment (`tandem.operator.runtime.env_settings`, the same variable names, set by the chart).

TLS per endpoint: `https://` dials TLS (the CA given, else the system's roots), `http://` dials
plain text (refused when certificates are configured: a typo must not send credentials in clear),
a bare `host:port` dials TLS exactly when a CA or client certificate is configured.

Why a subclass of aetcd's client: aetcd 1.0 opens `grpc.aio.insecure_channel` only (it takes a user
and password, but no TLS material); `SecureClient.connect` opens a secure channel instead and then
authenticates and builds its stubs as the library does. etcd's simple auth tokens expire when idle
(`--auth-token-ttl`, 300 s): `EtcdCluster` drops a client whose token etcd calls invalid and dials
again, which authenticates afresh.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aetcd
import aetcd.exceptions
import grpc
from aetcd import rpc, watcher

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.etcd.endpoints import EndpointError, endpoint_scheme, parse_endpoint

ENV_VARS = {
    "ca_file": "TANDEM_ETCD_CA_FILE",
    "cert_file": "TANDEM_ETCD_CERT_FILE",
    "key_file": "TANDEM_ETCD_KEY_FILE",
    "username": "TANDEM_ETCD_USERNAME",
    "password": "TANDEM_ETCD_PASSWORD",
}


class EtcdSecurityError(ValueError):
    """TLS files or credentials that cannot be used; the message names the file or setting."""


@dataclass(frozen=True)
class EtcdSecurity:
    """TLS material (file paths) and an etcd user; every field optional (all None: plain, no auth)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    username: str | None = None
    password: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise EtcdSecurityError("etcd client certificate and key go together: set both "
                                    f"{ENV_VARS['cert_file']} and {ENV_VARS['key_file']}, or neither")
        if (self.username is None) != (self.password is None):
            raise EtcdSecurityError("etcd username and password go together: set both "
                                    f"{ENV_VARS['username']} and {ENV_VARS['password']}, or neither")

    @classmethod
    def from_env(cls, env: Any) -> EtcdSecurity:
        """From a mapping of the TANDEM_ETCD_* variables above (empty values count as unset)."""
        return cls(**{f: (env.get(var) or None) for f, var in ENV_VARS.items()})

    @property
    def has_tls(self) -> bool:
        return self.ca_file is not None or self.cert_file is not None

    def tls_for(self, endpoint: str) -> bool:
        """Whether `endpoint` is dialled with TLS (module docstring); EndpointError on a contradiction."""
        scheme = endpoint_scheme(endpoint)
        if scheme == "http" and self.has_tls:
            raise EndpointError(f"etcd endpoint {endpoint!r} is plain http:// but etcd TLS certificates are "
                                "configured: write https://")
        return scheme == "https" or (scheme is None and self.has_tls)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        def read(path: str | None, what: str) -> bytes | None:
            if path is None:
                return None
            try:
                return Path(path).read_bytes()
            except OSError as e:
                raise EtcdSecurityError(f"etcd {what} {path!r} cannot be read: {e.strerror}") from None

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file, "CA bundle"),
            private_key=read(self.key_file, "client key"),
            certificate_chain=read(self.cert_file, "client certificate"),
        )

    def client(self, endpoint: str, *, timeout: float, options: dict[str, Any] | None = None) -> aetcd.Client:
        """The aetcd client of one endpoint: TLS or plain as `tls_for` says, authenticated when a
        user is set (the token is fetched on the first request)."""
        host, port = parse_endpoint(endpoint)
        creds = self.channel_credentials() if self.tls_for(endpoint) else None
        return SecureClient(host, port, credentials=creds, username=self.username, password=self.password,
                            timeout=max(1, round(timeout)), options=dict(options or {}))

    def refusal(self, what: str, e: aetcd.exceptions.ClientError) -> errors.CheckpointEngineError | None:
        """The typed error of an auth refusal by etcd (None: not one)."""
        code = e.__cause__.code() if isinstance(e.__cause__, grpc.aio.AioRpcError) else None
        user = f"etcd user {self.username!r}" if self.username else "a client without an etcd user"
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return errors.RegistryPermissionDenied(
                f"etcd {what}: permission denied for {user}: its roles do not grant read-write on this key "
                "(a job's credentials reach only its own prefix /tandem/jobs/<namespace>/<job>/)")
        text = str(e)
        if "authentication failed" in text or "user name is empty" in text or "user name not found" in text:
            return errors.RegistryAuthFailed(f"etcd {what}: {user} was refused: {text}")
        return None


def handshake_hint(failures: str) -> str:
    """A reader's hint when gRPC's failure text says the TLS handshake failed (its own words are
    terse: "Unwrap failed (TSI_DATA_CORRUPTED)", "Ssl handshake failed")."""
    if not any(w in failures for w in ("TSI_", "SSL", "Ssl", "handshake", "certificate")):
        return ""
    return (f"; the TLS handshake failed: etcd must trust the client certificate ({ENV_VARS['cert_file']}, "
            f"{ENV_VARS['key_file']}) and {ENV_VARS['ca_file']} must sign etcd's serving certificate")


def invalid_token(e: BaseException) -> bool:
    """etcd says the auth token expired (idle past --auth-token-ttl): dial again to get a new one."""
    return isinstance(e, aetcd.exceptions.UnauthenticatedError) and "invalid auth token" in str(e)


class SecureClient(aetcd.Client):  # type: ignore[misc]
    """aetcd's client over a TLS channel when `credentials` is given (else the library's own connect)."""

    def __init__(self, host: str, port: int, *, credentials: grpc.ChannelCredentials | None, **kw: Any) -> None:
        super().__init__(host=host, port=port, **kw)
        self._credentials = credentials
        self._dial_lock = asyncio.Lock()

    async def connect(self) -> None:
        if self._credentials is None:
            await super().connect()
            return
        async with self._dial_lock:
            if self._connected.is_set():
                return
            try:
                await self._open_tls()
            except rpc.AioRpcError as e:
                aetcd.exceptions._handle_exception(e)

    async def _open_tls(self) -> None:
        channel = rpc.secure_channel(f"{self._host}:{self._port}", self._credentials, options=self._options.items())
        metadata = None
        if self._username is not None:
            reply = await rpc.AuthStub(channel).Authenticate(
                rpc.AuthenticateRequest(name=self._username, password=self._password), timeout=self._timeout)
            metadata = (("token", reply.token),)
        self.channel, self.metadata = channel, metadata
        self.auth_stub = rpc.AuthStub(channel)
        self.kvstub = rpc.KVStub(channel)
        self.clusterstub = rpc.ClusterStub(channel)
        self.leasestub = rpc.LeaseStub(channel)
        self.maintenancestub = rpc.MaintenanceStub(channel)
        self._watcher = watcher.Watcher(rpc.WatchStub(channel), timeout=self._timeout, metadata=metadata)
        self._connected.set()
