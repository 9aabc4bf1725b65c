"""`tandem` CLI (typer): thin commands over the spec, the CRD generator and the local runner.

Caller: the `tandem` console script. `validate` applies the API server's rules offline (the same
pydantic models the CRD is generated from); `crd` prints or writes the CRD; `run` runs a job on one
machine through `tandem.cli.local`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

from tandem.spec import crd as crd_gen
from tandem.spec import load

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Tandem: hybrid-deployment RLHF on Kubernetes.")
err = Console(stderr=True)
out = Console()

CRD_TARGETS = (Path("manifests/crd/rlhfjobs.tandem.dev.yaml"), Path("helm/tandem/crds/rlhfjobs.tandem.dev.yaml"))


@app.command()
def validate(files: list[Path] = typer.Argument(..., help="RLHFJob YAML files.")) -> None:
    """Check RLHFJob files against the schema, defaults and cross-field rules; exit 1 on any error."""
    bad = 0
    for f in files:
        try:
            job = load.load_job(f)
        except load.SpecError as e:
            bad += 1
            err.print(f"[red]✗[/red] {e}", highlight=False)
            continue
        out.print(f"[green]✓[/green] {f}: RLHFJob {job.metadata.name} is valid", highlight=False)
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
        err.print(f"wrote {path}")


@app.command()
def run(
    job_file: Path = typer.Argument(..., help="RLHFJob YAML file."),
    workdir: Path = typer.Option(Path("runs"), help="Where metrics, plots, logs and etcd data go."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint: the shared memory "
                                "of an earlier --keep-etcd run, or checkpointEngine.persist's durable copies."),
    iterations: int | None = typer.Option(None, help="Override spec.algorithm.iterations."),
    keep_etcd: bool = typer.Option(False, "--keep-etcd", help="Keep etcd data after the run (needed for --resume)."),
) -> None:
    """Run the job on this machine: etcd, trainer and rollout sidecars as local processes."""
    from tandem.cli import local, volumes

    try:
        job = volumes.localize(load.load_job(job_file), str(job_file))
    except load.SpecError as e:
        err.print(f"[red]✗[/red] {e}", highlight=False)
        raise typer.Exit(2) from None
    if iterations is not None:
        job.spec.algorithm.iterations = iterations
    code = local.run_job(job, workdir=workdir, resume=resume, keep_etcd=keep_etcd or resume)
    raise typer.Exit(code)


if __name__ == "__main__":
    app()
