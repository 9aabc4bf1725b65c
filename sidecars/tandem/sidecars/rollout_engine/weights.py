"""The rollout engine's weights: resolve a version, verify it, load it into vLLM in place, serve adapters.

Role: `EngineWeights` is the part of `engine.RolloutEngine` that changes what vLLM serves; the engine holds one
and calls it under its lock (`update`, `update_from_path`). `update(v)` resolves v in etcd (default: the latest
registered), pins it, validates the shared-memory version (index, names, shapes, dtypes against the model's HF
parameters, every checksum) BEFORE touching vLLM — a reload that fails half-way leaves vLLM half-loaded — and
only then has every worker reload in place (`collective_rpc` into the worker side,
`worker.shm_loader.ShmWeightLoader`), then drops vLLM's prefix cache (KV of the old weights: if vLLM keeps it,
the update fails rather than serve a mix). A bad or torn version raises a typed error and the engine keeps
serving the previous weights.
Adapter versions (checkpoint_engine adapters.py; `EngineConfig.lora_rank`): vLLM starts with LoRA enabled and
the base model's own weights; a version of adapters is checked the same way (names and shapes against the
base's linear layers, rank, checksums), written as a PEFT directory beside the versions and added to vLLM as
the LoRA adapter every later generate uses (id = version); the previous adapter is then removed. A full
version on such an engine reloads the base in place and serves it without adapter.
What it needs of the engine that holds it is `Host` (the live `LLM`, its processes and watch, its phase).
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any, Protocol

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.service.engine_status import Phase, UpdateReport
from tandem.checkpoint_engine.versions import adapters, layout
from tandem.sidecars.rollout_engine.config import EngineConfig, expected_parameters
from tandem.sidecars.rollout_engine.procs import EngineProcesses
from tandem.sidecars.rollout_engine.step_watch import StepWatch

log = logging.getLogger(__name__)


class Host(Protocol):
    """The engine the weights belong to (`engine.RolloutEngine`)."""

    cfg: EngineConfig
    llm: Any
    model_dir: str | None
    version: int | None
    dummy: bool
    timings: dict[str, float]
    watch: StepWatch
    procs: EngineProcesses

    def ensure_alive(self) -> None: ...  # EngineNotRunning (the engine FAILED) when a process of it died

    def fail(self, error: str, free: bool = True) -> None: ...  # FAILED naming error; free what dead processes left

    def set_phase(self, phase: Phase) -> None: ...

    def cause(self, e: BaseException) -> str: ...  # e, with why the engine's processes were killed if they were


class EngineWeights:
    def __init__(self, host: Host, registry: SyncRegistry | None) -> None:
        self.host, self.registry = host, registry
        self.lora: Any = None  # the LoRARequest of the adapter version served (adapter versions only)
        self._expected: dict[str, layout.Expected] = {}
        self._optional: set[str] = set()
        self._stale_pins: set[int] = set()

    def expect(self, model_dir: str, dtype: str) -> None:
        """What a version must hold: the parameters of `model_dir` in `dtype` (the started vLLM's)."""
        self._expected, self._optional = expected_parameters(model_dir, dtype)

    # ---- resolve ---------------------------------------------------------------------------------
    def update(self, version: int | None) -> UpdateReport:
        """Load version `version` (default: the latest registered) from shared memory."""
        assert self.registry is not None
        t0 = time.perf_counter()
        reg = self.registry
        self._release_stale_pins()
        v = reg.latest() if version is None else version
        if v is None:
            raise errors.VersionNotFound("no version is registered yet")
        record = reg.version_record(v)
        reg.pin(v)
        try:
            cfg = self.host.cfg
            local = layout.version_dir(cfg.shm_root, cfg.job, v)
            path = local if local.exists() else Path(record["dir"])
            shard_digests = [s["digest"] for s in reg.shard_records(v)]
            t1 = time.perf_counter()
            return self._load(path, v, t0, t1, shard_digests)
        finally:
            try:
                reg.unpin(v)
            except errors.RegistryUnavailable:
                self._stale_pins.add(v)

    def update_from_path(self, path: str | Path) -> UpdateReport:
        """Load a version directory directly (no etcd): same validation, same load."""
        t0 = time.perf_counter()
        return self._load(Path(path), None, t0, t0, None)

    def _release_stale_pins(self) -> None:
        for v in list(self._stale_pins):
            try:
                self.registry.unpin(v)  # type: ignore[union-attr]
                self._stale_pins.discard(v)
            except errors.RegistryUnavailable:
                return

    # ---- verify, then load -----------------------------------------------------------------------
    def _verify(self, path: Path, v: int | None, digests: list[str] | None) -> layout.VersionIndex:
        index = layout.read_index(path)
        if v is not None and index.version != v:
            raise errors.TornVersion(f"{path} holds version {index.version}, not {v}")
        if digests is not None and digests != [s.digest for s in index.shards]:
            raise errors.TornVersion(f"shards of {path} differ from those registered for version {v}")
        if index.adapter is not None:
            if self.host.cfg.lora_rank is None:
                raise errors.InvalidVersion(f"version {index.version} holds LoRA adapters only, and this engine "
                                            "serves whole versions (started without trainer.lora.sync: adapter)")
            dtype = next(iter(self._expected.values())).dtype
            layout.validate(index, adapters.expected(index, self._expected, dtype))
        else:
            layout.validate(index, self._expected, self._optional)
        return index

    def _load(self, path: Path, v: int | None, t0: float, t1: float, digests: list[str] | None) -> UpdateReport:
        host = self.host
        index = self._verify(path, v, digests)
        mapped = layout.MappedVersion(path, index)
        mapped.verify_checksums()
        t2 = time.perf_counter()
        host.ensure_alive()
        if index.adapter is not None:
            workers = [self._serve_adapter(mapped, index)]
        else:
            host.set_phase(Phase.UPDATING)
            try:
                with host.watch.busy("reload"):
                    workers = host.llm.collective_rpc("tandem_load_shm", args=(str(path), index.model_dump_json()))
                    self._forget_prefixes()
            except Exception as e:
                # killed (a hang) or crashed mid-reload: what it left is freed
                host.fail(f"reload of version {index.version} failed: {host.cause(e)}")
                raise errors.CheckpointEngineError(f"reload failed; engine must be restarted: {e}") from e
            self._drop_adapter()  # the whole version is served as it is
        del mapped
        t3 = time.perf_counter()
        previous, host.version, host.dummy = host.version, index.version, False
        report = UpdateReport(version=index.version, previous=previous, bytes=index.total_bytes,
                              tensors=len(index.tensors), resolve_s=t1 - t0, validate_s=t2 - t1, load_s=t3 - t2,
                              total_s=t3 - t0, workers=list(workers))
        host.timings.update({"update_resolve_s": report.resolve_s, "update_validate_s": report.validate_s,
                             "update_load_s": report.load_s, "update_total_s": report.total_s})
        host.set_phase(Phase.READY)
        return report

    def _forget_prefixes(self) -> None:
        """Drop vLLM's cached prompt prefixes: their KV was computed with the previous weights, and a prompt
        that hit them would be served partly by the old version (on GPUs, blocks of 16 tokens: every chat
        template's system prompt). vLLM refuses while requests hold blocks, and returns False rather than
        raising; none runs under the engine's lock, and `reset_running_requests` preempts any that did.
        A vision-language model's cached picture features go too: the previous tower computed them (and a
        prefix reset alone leaves vLLM's scheduler counting features its worker no longer holds: the next
        prompt with a picture seen before fails with "Encoder cache miss")."""
        llm = self.host.llm
        if not llm.reset_prefix_cache(reset_running_requests=True):
            why = "vLLM kept its prefix cache (blocks still held): prompts would reuse the previous weights' KV"
            self.host.fail(why, free=False)
            raise errors.CheckpointEngineError(f"{why}; engine must be restarted")
        if llm.llm_engine.model_config.is_multimodal_model:
            llm.llm_engine.reset_encoder_cache()

    # ---- adapters --------------------------------------------------------------------------------
    def _adapter_dir(self, version: int) -> Path:
        return layout.job_dir(self.host.cfg.shm_root, self.host.cfg.job) / ".lora" / f"v{version:012d}"

    def _serve_adapter(self, mapped: layout.MappedVersion, index: layout.VersionIndex) -> dict[str, Any]:
        """Add a checked adapter version to vLLM as the LoRA adapter of every later generate. A failure
        before vLLM took it leaves the previous adapter served (the engine stays READY)."""
        from vllm.lora.request import LoRARequest

        host = self.host
        t0 = time.perf_counter()
        assert index.adapter is not None
        out = adapters.write_peft_dir(mapped.tensors(), index.adapter, self._adapter_dir(index.version),
                                      base_dir=host.model_dir)
        request = LoRARequest(f"v{index.version}", index.version, str(out), load_inplace=True)
        try:
            with host.watch.busy("add adapter"):
                host.llm.llm_engine.add_lora(request)
        except Exception as e:
            shutil.rmtree(out, ignore_errors=True)
            if host.procs.any_dead():
                host.fail(f"adding the adapters of version {index.version} failed: {e}")
            raise errors.InvalidVersion(f"vLLM refused the adapters of version {index.version}: {e}") from e
        old, self.lora = self.lora, request
        if old is not None and old.lora_int_id != request.lora_int_id:
            self._remove_adapter(old)
        self._forget_prefixes()
        return {"rank": 0, "load_s": time.perf_counter() - t0, "bytes": index.total_bytes, "adapter": str(out)}

    def _drop_adapter(self) -> None:
        old, self.lora = self.lora, None
        if old is not None:
            self._remove_adapter(old)

    def _remove_adapter(self, request: Any) -> None:
        try:
            self.host.llm.llm_engine.remove_lora(request.lora_int_id)
        except Exception as e:  # noqa: BLE001 - vLLM evicts it anyway (max_loras 1); the files go regardless
            log.warning("removing LoRA adapter %s: %s", request.lora_name, e)
        shutil.rmtree(request.lora_path, ignore_errors=True)

    def discard_adapter(self) -> None:
        """vLLM is gone: the served adapter's PEFT directory in shm goes with it."""
        if self.lora is not None:
            shutil.rmtree(self.lora.lora_path, ignore_errors=True)
            self.lora = None
