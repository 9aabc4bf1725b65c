"""`tandem` CLI (typer): thin commands over the spec, the CRD generator and the local runner.

Caller: the `tandem` console script. `validate` applies the API server's rules offline (the same
pydantic models the CRD is generated from); `crd` prints or writes the CRD; `run` runs a job on one
machine through `tandem.cli.local`; `export` writes a published or durable version as a HuggingFace
directory (`tandem.checkpoint_engine.versions.hf_export`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from tandem.cli import say
from tandem.spec import crd as crd_gen
from tandem.spec import load, model_dir
from tandem.spec.models import RLHFJob

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Tandem: hybrid-deployment RLHF on Kubernetes.")
err = say.console(stderr=True)  # text, never markup; never wrapped (a pipe, a file, a test's capture)
out = say.console()

CRD_TARGETS = (Path("manifests/crd/rlhfjobs.tandem.dev.yaml"), Path("helm/tandem/crds/rlhfjobs.tandem.dev.yaml"))


def _model_dirs(job: RLHFJob, source: str, *, missing_ok: bool) -> RLHFJob:
    """`job`, or SpecError naming each unusable model directory (`tandem.spec.model_dir`) and each user tool
    the rollout could not load (`tandem.sidecars.envs.loader`: its module imported here)."""
    from tandem.sidecars.envs.loader import tool_problems

    problems = model_dir.job_problems(job.spec, missing_ok=missing_ok)
    problems += tool_problems(job.spec.rollout.environment, missing_ok=missing_ok)
    if problems:
        raise load.SpecError(source, problems)
    return job


@app.command()
def validate(files: list[Path] = typer.Argument(..., help="RLHFJob YAML files.")) -> None:
    """Check RLHFJob files against the schema, defaults and cross-field rules, the model directories
    that exist on this machine (config.json, tokenizer files) and the user's tool modules found here
    (imported); exit 1 on any error."""
    bad = 0
    for f in files:
        try:
            job = _model_dirs(load.load_job(f), str(f), missing_ok=True)  # a cluster's exist only in its pods
        except load.SpecError as e:
            bad += 1
            err.print(say.failed(str(e)))
            continue
        out.print(say.passed(f"{f}: RLHFJob {job.metadata.name} is valid"))
        out.print(f"  algorithm: {job.spec.algorithm.summary(job.spec.rollout.max_tokens)}", markup=False)
    raise typer.Exit(1 if bad else 0)


@app.command()
def crd(write: bool = typer.Option(False, "--write", help="Write manifests/crd and the chart's copy."),
        root: Path = typer.Option(Path("."), help="Repository root for --write.")) -> None:
    """Print the RLHFJob CRD generated from the spec models (or write both committed copies)."""
    text = crd_gen.render()
    if not write:
        sys.stdout.write(text)  # plain: rich would wrap long lines
        return
    for target in CRD_TARGETS:
        path = root / target
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        err.print(f"wrote {path}", markup=False)


@app.command()
def run(
    job_file: Path = typer.Argument(..., help="RLHFJob YAML file."),
    workdir: Path = typer.Option(Path("runs"), help="Where metrics, plots, logs and etcd data go."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint: the shared memory "
                                "of an earlier --keep-etcd run, or checkpointEngine.persist's durable copies."),
    iterations: int | None = typer.Option(None, help="Override spec.algorithm.iterations."),
    keep_etcd: bool = typer.Option(False, "--keep-etcd", help="Keep etcd data after the run (needed for --resume)."),
    pin_pods: bool = typer.Option(False, "--pin-pods", help="Give each pod its own share of this machine's cores, "
                                  "as pods on separate nodes have (default: every process may use every core)."),
) -> None:
    """Run the job on this machine: etcd, trainer and rollout sidecars as local processes."""
    from tandem.cli import local, volumes

    try:
        job = _model_dirs(volumes.localize(load.load_job(job_file), str(job_file)), str(job_file), missing_ok=False)
    except load.SpecError as e:
        err.print(say.failed(str(e)))
        raise typer.Exit(2) from None
    if iterations is not None:
        job.spec.algorithm.iterations = iterations
    code = local.run_job(job, workdir=workdir, resume=resume, keep_etcd=keep_etcd or resume, pin_pods=pin_pods)
    raise typer.Exit(code)


models_app = typer.Typer(no_args_is_help=True, help="Pretrained models obtainable here, as HF directories.")
app.add_typer(models_app, name="models")


@models_app.command("list")
def models_list() -> None:
    """Models `tandem models fetch` knows, and whether each is cached."""
    from tandem.cli import pretrained

    listed: list[pretrained.Known | pretrained.Built] = [*pretrained.KNOWN.values(), *pretrained.BUILT.values()]
    for known in listed:
        path = pretrained.model_dir(known.name)
        state = f"cached at {path}" if pretrained.is_fetched(path) else "not fetched"
        out.print(f"{known.name}: {known.description} — {state}", markup=False)


@models_app.command("fetch")
def models_fetch(name: str = typer.Argument(..., help="A name from `tandem models list`."),
                 force: bool = typer.Option(False, "--force", help="Fetch again even if cached.")) -> None:
    """Download and convert a model into ~/.cache/tandem/models/NAME; prints its path last."""
    from tandem.cli import pretrained

    try:
        path = pretrained.fetch(name, force=force, progress=lambda m: err.print(say.styled(m, "dim")))
    except pretrained.ModelFetchError as e:
        err.print(say.failed(str(e)))
        raise typer.Exit(1) from None
    print(path)


@app.command()
def export(
    source: Path = typer.Argument(..., help="A version directory (index.json inside) or a durable store: "
                                  "checkpointEngine.persist's path, or its <namespace>/<job>/<uid> directory."),
    target: Path = typer.Argument(..., help="HuggingFace model directory to write (replaced if it exists)."),
    model: Path = typer.Option(..., "--model", help="The job's model directory: config.json, tokenizer, "
                               "chat template and generation config are taken from it."),
    version: int | None = typer.Option(None, "--version", help="Weight version to export; default: the newest "
                                       "complete one in the store."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (as published), float32, bfloat16 or float16."),
    max_shard_size: str = typer.Option("5GB", "--max-shard-size", help="Safetensors files above this are split "
                                       "(with model.safetensors.index.json)."),
) -> None:
    """Write a published or durably copied version as a HuggingFace directory (from_pretrained, vllm serve)."""
    from tandem.checkpoint_engine import errors
    from tandem.checkpoint_engine.versions import hf_export

    if dtype != "auto" and dtype not in hf_export.DTYPES:
        err.print(say.failed(f"--dtype: {dtype!r} is not one of auto, {', '.join(hf_export.DTYPES)}"))
        raise typer.Exit(2)
    try:
        path = hf_export.resolve_source(source, version)
        err.print(f"exporting {path} ...", markup=False)
        done = hf_export.export_version(path, model, target, hf_export.DTYPES.get(dtype), max_shard_size)
    except (errors.CheckpointEngineError, OSError, ValueError) as e:
        err.print(say.failed(str(e)))
        raise typer.Exit(1) from None
    out.print(say.passed(str(done)))


if __name__ == "__main__":
    app()
