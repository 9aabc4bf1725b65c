"""A dataset's file or directory read into rows by the `datasets` library, and the one error of a bad dataset.

Files (`dataset.format`, or `auto`: `.jsonl`/`.ndjson`, `.json`, `.parquet`/`.pq` by extension, a
directory is `datasets`) are read by the `datasets` library, never by a parser of ours: the json and
parquet builders (a JSON file holds one object per line or a list of objects) with a private
temporary cache and `keep_in_memory`, so nothing is written to the HF cache and no network is used
(a JSON file the library rejects is re-read with `json` only to name the broken line; date-like
strings that Arrow's JSON reader would make timestamps are kept as written, see `read`);
a directory is read with `load_from_disk` (a DatasetDict directory gives `dataset.split`, default
train; the split of a single file must stay `train`).
Errors name the file (and, for broken JSON, the line) as `DatasetError`, which the rows' checks raise too.
Caller: `dataset.PromptDataset.load` (`detect_format`, `read`); `DatasetError` is every dataset check's error
(`dataset`, `..preflight`, the rollout sources).
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".pq": "parquet"}
_BUILDERS = {"jsonl": "json", "json": "json", "parquet": "parquet"}


class DatasetError(ValueError):
    pass


def detect_format(path: Path, format: str = "auto") -> str:
    """`format` checked against what `path` is, or (auto) told from its extension / being a directory."""
    if not path.exists():
        raise DatasetError(f"dataset.path: {path} does not exist")
    if path.is_dir():
        if format not in ("auto", "datasets"):
            raise DatasetError(f"dataset.format: {format} needs a file; {path} is a directory")
        return "datasets"
    if format == "datasets":
        raise DatasetError(f"dataset.format: datasets needs a directory written by save_to_disk; {path} is a file")
    if format != "auto":
        return format
    found = EXTENSIONS.get(path.suffix.lower())
    if found is None:
        raise DatasetError(f"dataset.format: cannot tell the format of {path} from its extension (known: "
                           f"{', '.join(EXTENSIONS)}); set dataset.format")
    return found


def read(path: Path, format: str, split: str, fields: tuple[str, ...]) -> Any:
    """The rows as a `datasets.Dataset` held in memory.

    Arrow's JSON reader turns ISO-8601 strings into timestamps; when it did so anywhere in `fields`,
    the file is read again with those columns as `datasets.Json`, which keeps every value as written.
    """
    import datasets

    with _quiet(datasets):
        if format == "datasets":
            return _read_saved(datasets, path, split)
        if split != "train":
            raise DatasetError(f"dataset.split: {split!r} applies to a DatasetDict directory; {path} is one "
                               f"{format} file (split train)")
        options: dict[str, Any] = {"parse_agent_traces": False} if _BUILDERS[format] == "json" else {}
        table = _load_file(datasets, path, format, options)
        dated = [f for f in fields if f in table.column_names and _has_temporal(table.data.schema.field(f).type)]
        if dated and _BUILDERS[format] == "json":
            features = table.features.copy()
            features.update({f: datasets.Json() for f in dated})
            table = _load_file(datasets, path, format, {**options, "features": features})
        return table


def _load_file(datasets: Any, path: Path, format: str, options: dict[str, Any]) -> Any:
    with tempfile.TemporaryDirectory(prefix="tandem-dataset-") as cache:
        try:
            return datasets.load_dataset(_BUILDERS[format], data_files=str(path), split="train", cache_dir=cache,
                                         keep_in_memory=True, **options)
        except Exception as e:  # the builders raise many types (Arrow, JSON, DatasetGenerationError)
            where = _json_error(path, format) if _BUILDERS[format] == "json" else None
            raise DatasetError(where or f"{path}: cannot read as {format}: {_reason(e)}") from None


def _has_temporal(arrow_type: Any) -> bool:
    """A date/time type anywhere in an Arrow type (list items, struct fields, map keys/values)."""
    import pyarrow as pa

    return bool(pa.types.is_temporal(arrow_type)) or any(
        _has_temporal(arrow_type.field(i).type) for i in range(arrow_type.num_fields))


def _read_saved(datasets: Any, path: Path, split: str) -> Any:
    if not (path / "dataset_dict.json").is_file() and not (path / "state.json").is_file():
        raise DatasetError(f"{path}: a directory must be written by datasets' save_to_disk "
                           "(it has no dataset_dict.json or state.json)")
    try:
        loaded = datasets.load_from_disk(str(path), keep_in_memory=True)
    except Exception as e:
        raise DatasetError(f"{path}: cannot load the saved dataset: {_reason(e)}") from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DatasetError(f"dataset.split: {path} has no split {split!r} (it has {', '.join(loaded)})")
        return loaded[split]
    if split not in ("train", str(loaded.split)):
        raise DatasetError(f"dataset.split: {path} is a single dataset of split {loaded.split}, not {split!r}")
    return loaded


def _reason(e: BaseException) -> str:
    """The error and, when the library wrapped it, its innermost cause."""
    inner: BaseException = e
    for _ in range(32):  # a chain may, rarely, loop
        nxt = inner.__cause__ or inner.__context__
        if nxt is None:
            break
        inner = nxt
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text if inner is e else f"{text} ({type(inner).__name__}: {str(inner).strip()[:300]})"


def _json_error(path: Path, format: str) -> str | None:
    """Where a JSON file that the library rejected is broken (for the message only; None if unsure)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        return f"{path}: cannot read as {format}: {e}"
    try:
        json.loads(text)
        return None  # one JSON document: the library's own reason applies (e.g. an object, not a list)
    except json.JSONDecodeError as whole:
        if format == "json" and not text.lstrip().startswith("{"):
            return f"{path}: line {whole.lineno}: not valid JSON ({whole.msg})"
    for n, line in enumerate(text.splitlines(), 1):
        try:
            if line.strip():
                json.loads(line)
        except json.JSONDecodeError as e:
            return f"{path}: line {n}: not valid JSON ({e.msg})"
    return None


@contextmanager
def _quiet(datasets: Any) -> Iterator[None]:
    """No progress bars, and no error logs for what becomes our DatasetError."""
    bars, verbosity = datasets.is_progress_bar_enabled(), datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(logging.CRITICAL)
    try:
        yield
    finally:
        datasets.logging.set_verbosity(verbosity)
        if bars:
            datasets.enable_progress_bars()
