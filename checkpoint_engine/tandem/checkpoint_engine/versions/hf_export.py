"""HuggingFace model directories from published weights, loadable as-is by `from_pretrained` and `vllm serve`.

Role: turn HF-named tensors (a published version in shared memory, a durable copy on a volume, or
any iterable of named tensors) into a self-contained model directory:

    <target>/model.safetensors                 (or model-0000i-of-0000n.safetensors + model.safetensors.index.json
                                               above `max_shard_size`; huggingface_hub splits, safetensors writes)
    <target>/config.json                       the source model's, with `dtype` (and `torch_dtype` when the
                                               source has that key) set to the dtype written
    <target>/tokenizer*, chat_template.jinja,  every other non-weight file of the source model directory,
    generation_config.json, ...                byte for byte (plus its additional_chat_templates/)

Tied embeddings (config `tie_word_embeddings`): no `lm_head.weight` is written (the HF convention;
one given must equal the embedding) and the config keeps the flag. Names and shapes are checked
against the architecture built on the meta device before anything is written, so a missing tensor
fails here instead of being silently re-initialised by `from_pretrained`.
Atomic: the directory is written and fsync'ed under `.<name>.tmp-<uuid>` beside `target`, then
renamed into place; an existing `target` (an earlier export of the same iteration) is renamed
aside first and removed after, so a reader sees the old directory or the new one (or, for the
instant between the two renames, none). Such directories left by a killed exporter are removed
by the next export of the same target once STALE_S old. A source `quantization_config` is dropped. A
vision-language model's tower is written in the layout vLLM loads, which transformers loads too (`tower_names`).
Callers: the trainer driver (spec.export, via the sidecar layer), `tandem export` (tandem.cli.main).
This module imports nothing from tandem.sidecars/operator/cli (import-linter's ce-independent).
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import re
import shutil
import time
import uuid
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.versions import adapters, hashing, layout
from tandem.checkpoint_engine.versions.durable import fsync_path
from tandem.checkpoint_engine.versions.tower_names import tower_of, vllm_name

log = logging.getLogger(__name__)

DEFAULT_MAX_SHARD_SIZE = "5GB"  # huggingface_hub's and transformers' default
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".npz", ".pkl")
COPIED_DIRS = ("additional_chat_templates",)
STALE_S = 6 * 3600  # temp/old directories of an earlier, interrupted export of the same target
TIED_HEAD = "lm_head.weight"
TIED_EMBEDDING = "model.embed_tokens.weight"
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_VERSION_DIR = re.compile(r"^v\d{12}$")


class ExportError(errors.CheckpointEngineError):
    """The tensors or the source model directory cannot make a loadable HF directory."""

    status_code = 422
    code = "export_failed"


def export_hf_dir(
    tensors: Iterable[tuple[str, torch.Tensor]],
    source_model_dir: Path,
    target: Path,
    dtype: torch.dtype | None = None,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Write `tensors` (HF names) with `source_model_dir`'s config and tokenizer to `target`; return it.

    `dtype` casts floating tensors (None keeps theirs). Replaces an existing `target` atomically.
    """
    from huggingface_hub import split_state_dict_into_shards_factory
    from safetensors.torch import save_file

    source, target = Path(source_model_dir), Path(target)
    config = _read_config(source)
    state: dict[str, torch.Tensor] = {}
    for name, tensor in tensors:
        if name in state:
            raise ExportError(f"tensor {name!r} given twice")
        state[name] = tensor
    hf_config = _hf_config(source)
    tied = _drop_tied_head(state, source, hf_config)
    _check_names(state, source, hf_config, tied)
    tower = tower_of(hf_config)  # a vision-language model's tower: in the layout vLLM loads (transformers too)
    if tower is not None:
        state = {vllm_name(name, tower): t for name, t in state.items()}
    nbytes = {id(t): t.numel() * (dtype if dtype is not None and t.is_floating_point() else t.dtype).itemsize
              for t in state.values()}  # bytes as written, after the cast
    split = split_state_dict_into_shards_factory(
        state, get_storage_size=lambda t: nbytes[id(t)], get_storage_id=lambda t: None,
        filename_pattern="model{suffix}.safetensors", max_shard_size=max_shard_size)

    target.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale(target)
    tmp = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        for filename, names in split.filename_to_tensors.items():
            shard = {n: _prepared(state[n], dtype) for n in names}
            save_file(shard, str(tmp / filename), metadata={"format": "pt"})
            del shard
        if split.is_sharded:
            index = {"metadata": dict(split.metadata), "weight_map": dict(split.tensor_to_filename)}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        written = dtype if dtype is not None else _dominant_dtype(state)
        config["dtype"] = layout.dtype_name(written)
        if "torch_dtype" in config:
            config["torch_dtype"] = layout.dtype_name(written)
        if config.pop("quantization_config", None) is not None:
            log.info("%s/config.json: quantization_config dropped (the weights are written unquantized)", source)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        _copy_model_files(source, tmp)
        for f in tmp.rglob("*"):
            if f.is_file():
                fsync_path(f)
        fsync_path(tmp)
        _swap_into_place(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("exported %d tensors (%s, %d file(s)%s) to %s", len(state), layout.dtype_name(written),
             len(split.filename_to_tensors), ", tied embeddings" if tied else "", target)
    return target


def export_version(
    version_dir: Path,
    source_model_dir: Path,
    target: Path,
    dtype: torch.dtype | None = None,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Export a published version directory (shared memory or a durable copy) after verifying every
    checksum; a damaged shard is refused naming its file. Maps the shards read-only (no copy). A version of
    LoRA adapters alone (adapters.py) becomes the merged model (the base's weights in `source_model_dir`
    with the adapters merged in) and, in its adapter/ subdirectory, the PEFT adapter directory."""
    path = Path(version_dir)
    index = layout.read_index(path)
    with _ReadOnlyVersion(path, index) as version:
        version.verify()
        if index.adapter is None:
            return export_hf_dir(version.tensors(), source_model_dir, target, dtype, max_shard_size)
        lora = dict(version.tensors())
        merged = adapters.merged(adapters.base_weights(Path(source_model_dir)), lora, index.adapter)
        out = export_hf_dir(merged, source_model_dir, target, dtype, max_shard_size)
        adapters.write_peft_dir(lora.items(), index.adapter, out / "adapter", base_dir=source_model_dir)
        return out


def resolve_source(source: Path, version: int | None = None) -> Path:
    """The version directory `tandem export SOURCE` means.

    SOURCE is a version directory (index.json inside), or a durable store: the directory holding
    `v<12 digits>` copies (`<persist.path>/<namespace>/<job>/<uid>`) or a parent of it up to
    `persist.path` itself. Picks `version`, else the newest complete one (its index written).
    """
    source = Path(source)
    if (source / layout.INDEX).is_file():
        found = layout.read_index(source).version
        if version is not None and found != version:
            raise ExportError(f"{source} holds version {found}, not {version}")
        return source
    if not source.is_dir():
        raise ExportError(f"{source}: no such directory")
    stores = [d for d in _walk(source, depth=3) if d.name != "train" and _versions(d)]
    if not stores:
        raise ExportError(f"{source}: neither a version directory ({layout.INDEX}) nor a durable store "
                          "(v<version> directories up to three levels below)")
    if len(stores) > 1:
        listed = ", ".join(str(s) for s in stores[:8])
        raise ExportError(f"{source} holds copies of {len(stores)} jobs ({listed}); pass one of them")
    store = stores[0]
    complete = [v for v in _versions(store) if (_version_path(store, v) / layout.INDEX).is_file()]
    if version is None:
        if not complete:
            raise ExportError(f"{store}: no complete version (every copy lacks its {layout.INDEX})")
        return _version_path(store, complete[-1])
    if version not in complete:
        raise ExportError(f"{store}: no complete version {version} (complete: {complete})")
    return _version_path(store, version)


class _ReadOnlyVersion:
    """A version's shard files mapped read-only (a durable copy may sit on a read-only volume)."""

    def __init__(self, path: Path, index: layout.VersionIndex) -> None:
        self.path, self.index = path, index
        self._maps: dict[int, mmap.mmap] = {}
        self._files = {s.index: path / s.file for s in index.shards}
        try:
            for s in index.shards:
                f = self._files[s.index]
                size = layout.checked_shard_size(f, s.nbytes)
                if size:
                    with open(f, "rb") as fh:
                        self._maps[s.index] = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> _ReadOnlyVersion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for mm in self._maps.values():
            try:
                mm.close()
            except BufferError:  # a tensor still views it; the mapping goes with the last view
                pass
        self._maps.clear()

    def _raw(self, rec: layout.TensorRecord) -> memoryview:
        mm = self._maps.get(rec.shard)
        if rec.nbytes == 0:
            return memoryview(b"")
        if mm is None or rec.offset + rec.nbytes > len(mm):
            raise errors.TornVersion(f"tensor {rec.name} lies outside its shard file {self._files.get(rec.shard)}")
        return memoryview(mm)[rec.offset : rec.offset + rec.nbytes]

    def verify(self) -> None:
        algorithm = self.index.algorithm
        if algorithm not in hashing.SUPPORTED:
            raise errors.InvalidVersion(f"{self.path / layout.INDEX}: unknown checksum algorithm {algorithm!r}")
        for rec in self.index.tensors:
            got = hashing.checksum(self._raw(rec), algorithm)
            if got != rec.checksum:
                raise errors.ChecksumMismatch(
                    f"{self._files[rec.shard]} is damaged: tensor {rec.name} (offset {rec.offset}) has checksum "
                    f"{got}, {layout.INDEX} says {rec.checksum}; refusing to export version {self.index.version}")

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for rec in self.index.tensors:
            raw = self._raw(rec)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # read-only buffer: nothing writes into it
                flat = torch.frombuffer(raw, dtype=torch.uint8) if rec.nbytes else torch.empty(0, dtype=torch.uint8)
            yield rec.name, flat.view(layout.torch_dtype(rec.dtype)).view(rec.shape)


def _read_config(source: Path) -> dict[str, Any]:
    file = source / "config.json"
    try:
        config = json.loads(file.read_text())
    except FileNotFoundError as e:
        raise ExportError(f"source model directory {source} has no config.json") from e
    except (OSError, ValueError) as e:
        raise ExportError(f"{file} is not readable JSON: {e}") from e
    if not isinstance(config, dict):
        raise ExportError(f"{file} is not a JSON object")
    return config


def _hf_config(source: Path) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source)
    except (OSError, ValueError, KeyError) as e:
        raise ExportError(f"transformers cannot read {source}/config.json: {e}") from e


def _drop_tied_head(state: dict[str, torch.Tensor], source: Path, hf_config: Any) -> bool:
    """Whether the model ties lm_head to the embedding; if so `lm_head.weight` leaves `state`."""
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    head = state.get(TIED_HEAD)
    if tied and head is not None:
        embedding = state.get(TIED_EMBEDDING)
        if embedding is not None and not torch.equal(head, embedding):
            raise ExportError(f"{source}/config.json ties word embeddings, but {TIED_HEAD} differs from "
                              f"{TIED_EMBEDDING}; refusing to drop it")
        del state[TIED_HEAD]
    return tied


def _check_names(state: dict[str, torch.Tensor], source: Path, hf_config: Any, tied: bool) -> None:
    """Names and shapes against the architecture of `source` built on the meta device."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if tower_of(hf_config) is not None else AutoModelForCausalLM
    try:
        with torch.device("meta"):
            model = auto.from_config(hf_config)
    except (ValueError, KeyError, ImportError) as e:
        log.warning("cannot build %s on the meta device (%s); tensor names are not checked", source, e)
        return
    expected = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    optional = {TIED_HEAD} if tied else set()
    missing = sorted(set(expected) - set(state) - optional)
    extra = sorted(set(state) - set(expected))
    wrong = [f"{n}: {tuple(t.shape)} != {expected[n]}" for n, t in state.items()
             if n in expected and tuple(t.shape) != expected[n]]
    problems = [f"{what} {items[:8]}{' …' if len(items) > 8 else ''}"
                for what, items in (("missing tensors", missing), ("unexpected tensors", extra),
                                    ("wrong shapes", wrong)) if items]
    if problems:
        raise ExportError(f"tensors do not fit {source}/config.json: " + "; ".join(problems))


def _prepared(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    t = t.detach().to("cpu")
    if dtype is not None and t.is_floating_point() and t.dtype != dtype:
        t = t.to(dtype)
    return t.contiguous()


def _dominant_dtype(state: dict[str, torch.Tensor]) -> torch.dtype:
    """The floating dtype holding most bytes (what config.json's dtype should say)."""
    totals: dict[torch.dtype, int] = {}
    for t in state.values():
        if t.is_floating_point():
            totals[t.dtype] = totals.get(t.dtype, 0) + t.numel() * t.element_size()
    return max(totals, key=lambda d: totals[d]) if totals else torch.float32


def _copy_model_files(source: Path, out: Path) -> None:
    """Every non-weight file of the source directory (tokenizer, chat template, generation config, code)."""
    copied = []
    for p in sorted(source.iterdir()):
        name = p.name
        if name.startswith(".") or name == "config.json":
            continue
        if p.is_file() and not name.endswith(WEIGHT_SUFFIXES) and not name.endswith((".bin.index.json",
                                                                                    ".safetensors.index.json")):
            shutil.copyfile(p, out / name)
            copied.append(name)
        elif p.is_dir() and name in COPIED_DIRS:
            shutil.copytree(p, out / name)
    if not any(n.startswith("tokenizer") for n in copied):
        log.warning("%s has no tokenizer files; the export will need a tokenizer from elsewhere", source)


def _swap_into_place(tmp: Path, target: Path) -> None:
    old = None
    if target.exists():
        old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:12]}"
        os.rename(target, old)
    try:
        os.rename(tmp, target)
    except BaseException:
        if old is not None:
            os.rename(old, target)  # put the earlier export back
        raise
    fsync_path(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _clean_stale(target: Path) -> None:
    """Remove what an exporter killed mid-way left beside `target` (one writer per target is assumed)."""
    now = time.time()
    for p in target.parent.glob(f".{target.name}.*-*"):
        if p.name.startswith((f".{target.name}.tmp-", f".{target.name}.old-")) and now - p.stat().st_mtime > STALE_S:
            shutil.rmtree(p, ignore_errors=True)
            log.info("removed %s, left by an interrupted export", p)


def _walk(root: Path, depth: int) -> Iterator[Path]:
    yield root
    if depth == 0:
        return
    for p in sorted(root.iterdir()):
        if p.is_dir() and not p.name.startswith(".") and not _VERSION_DIR.match(p.name):
            yield from _walk(p, depth - 1)


def _versions(store: Path) -> list[int]:
    return layout.list_versions(store.parent, store.name)


def _version_path(store: Path, version: int) -> Path:
    return layout.version_dir(store.parent, store.name, version)


