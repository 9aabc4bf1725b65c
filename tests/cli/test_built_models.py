"""`tandem models fetch` of a model built here (pretrained.BUILT): the base fetched first, the builder run once
into a temporary directory that appears by one rename, the result cached; a failed build leaves nothing.

The builder here is a small function of this module (the VLM demo's real one trains for minutes:
tests/vlm_demo covers it); the base is a directory already fetched (its marker written), so nothing is
downloaded."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tandem.cli import pretrained

CALLS: list[tuple[Path, Path]] = []


def builder(base: Path, out: Path, progress: Callable[[str], None]) -> None:
    CALLS.append((base, out))
    progress("building")
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps({"base": str(base), "n": len(CALLS)}))


def failing_builder(base: Path, out: Path, progress: Callable[[str], None]) -> None:
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")
    raise RuntimeError("the warm-up diverged")


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    base = pretrained.model_dir("smollm2-135m", tmp_path)
    base.mkdir(parents=True)
    (base / "config.json").write_text("{}")
    (base / pretrained.DONE).write_text("fetched\n")
    monkeypatch.setitem(pretrained.BUILT, "demo-built", pretrained.Built(
        name="demo-built", base="smollm2-135m", builder=f"{__name__}:builder", description="test"))
    monkeypatch.setitem(pretrained.BUILT, "demo-broken", pretrained.Built(
        name="demo-broken", base="smollm2-135m", builder=f"{__name__}:failing_builder", description="test"))
    CALLS.clear()
    return tmp_path


def test_a_built_model_is_built_once_from_its_base_and_cached(root: Path) -> None:
    said: list[str] = []
    path = pretrained.fetch("demo-built", root, progress=said.append)
    assert path == pretrained.model_dir("demo-built", root) and pretrained.is_fetched(path)
    assert json.loads((path / "config.json").read_text()) == {"base": str(pretrained.model_dir("smollm2-135m", root)),
                                                               "n": 1}
    assert "building" in said and said[-1] == f"ready: {path}"
    assert pretrained.fetch("demo-built", root) == path and len(CALLS) == 1  # cached
    pretrained.fetch("demo-built", root, force=True)
    assert len(CALLS) == 2 and json.loads((path / "config.json").read_text())["n"] == 2
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_a_failed_build_leaves_nothing(root: Path) -> None:
    with pytest.raises(RuntimeError, match="diverged"):
        pretrained.fetch("demo-broken", root)
    assert not pretrained.model_dir("demo-broken", root).exists()
    assert [p.name for p in root.iterdir()] == ["smollm2-135m"]


def test_an_unknown_name_lists_fetched_and_built_models() -> None:
    with pytest.raises(pretrained.ModelFetchError, match="llava-smollm2.*smollm2-135m"):
        pretrained.lookup("gpt-9")
