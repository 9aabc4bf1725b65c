"""Weights & Biases: the driver's rows in an offline W&B run, read back from wandb's own files (the run's
.wandb transaction log, its table files): the run's id, project, name and group from the job, its config,
every metric against the iteration, the eval table and the progress chart; a restarted trainer continues
the same run id; a W&B server that refuses connections neither blocks nor fails training (one warning)."""

from __future__ import annotations

import json
import logging
import socket
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from tandem.sidecars.trainer.observe.tracking import Tracker
from tandem.sidecars.trainer.observe.wandb_sink import run_id
from tandem.spec.tracking import Tracking, WandB

LOGGER = "tandem.sidecars.trainer.observe.wandb_sink"
UID = "7c9e6679-7425-40de-944b-e07fc1f90ae7"  # a metadata.uid
PARAMS = {"algorithm": {"name": "grpo", "lr": 1e-6}, "seed": 3}


def evaluation(after: int, pass_at_1: float) -> dict[str, Any]:
    return {"iteration": after, "version": after + 1, "prompts": 8, "samples": 4, "pass_at_1": pass_at_1,
            "pass_at_k": 0.9, "k": 4, "reward_mean": pass_at_1, "seconds": 0.5}


def drive(tracker: Tracker, first: int, last: int, evals: dict[int, float]) -> None:
    """What the loop hands the tracker (`evaluate`, `report.record`): an eval's own entry at iterations done,
    then the iteration's row, which carries the same eval again."""
    if first in evals:
        tracker.log(first, {"eval": evaluation(first, evals[first])})
    for it in range(first, last):
        row: dict[str, Any] = {"iteration": it, "reward_mean": 0.1 * it, "seconds": {"train": 1.0 + it},
                               "reward_components": {"answerMatch": 0.05 * it}, "message": "text"}
        if it + 1 in evals:
            tracker.log(it + 1, {"eval": evaluation(it + 1, evals[it + 1])})
            row["eval"] = evaluation(it + 1, evals[it + 1])
        tracker.log(it, row)


def records(path: Path) -> list[Any]:
    """The records of a .wandb file: wandb's LevelDB-style log (a 7-byte `:W&B` header, 32 KiB blocks, each
    record a 7-byte header: crc32, length, type full/first/middle/last), each a protobuf `Record`."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    if len(data) < 7:
        return []
    assert data[:4] == b":W&B", data[:7]
    pos, block, part, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (kind == 0 and length == 0):  # a block's padding
            pos += left
            continue
        part += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(part)
            out.append(record)
            part = b""
    return out


def finished(log_file: Path, within: float = 30.0) -> list[Any]:
    """The file's records once its last is the run's exit: wandb's service writes the file, and finish()
    may return before its writer has flushed it."""
    deadline = time.monotonic() + within
    while not (got := records(log_file)) or got[-1].WhichOneof("record_type") != "exit":
        assert time.monotonic() < deadline, f"{log_file}: no exit record after {within} s ({len(got)} records)"
        time.sleep(0.05)
    return got


def read_run(run_dir: Path) -> dict[str, Any]:
    """One offline run directory: its run record, config, history rows (decoded) and tables by key."""
    (log_file,) = run_dir.glob("run-*.wandb")
    got: dict[str, Any] = {"history": [], "tables": {}}
    for r in finished(log_file):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            got["run"] = r.run
            got["config"] = {i.key: json.loads(i.value_json) for i in r.run.config.update}
        elif kind == "history":
            got["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
    for row in got["history"]:
        for key, value in row.items():
            if key.endswith("/path") and str(value).endswith(".table.json"):
                got["tables"].setdefault(key[:-len("/path")], []).append(
                    json.loads((run_dir / "files" / value).read_text()))
    return got


def offline_runs(root: Path) -> list[Path]:
    return sorted((root / "wandb").glob("offline-run-*"))


def test_an_offline_run_holds_the_jobs_identity_config_metrics_eval_table_and_progress(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    spec = Tracking(tensorboard=False, wandb=WandB(mode="offline", tags=["smoke"]))
    tracker = Tracker.create(spec, tmp_path, "tiny-grpo", PARAMS, namespace="team-a", uid=UID)
    for it in range(3):  # log() only queues: W&B's start and writes happen on the sink's thread
        t0 = time.monotonic()
        drive(tracker, it, it + 1, {0: 0.1, 2: 0.5} if it == 0 else {2: 0.5})
        assert time.monotonic() - t0 < 0.5, "log() must not wait for W&B"
    tracker.close(close_timeout=60)
    assert tracker.wandb_run_id == run_id(UID) == UID
    (run_dir,) = offline_runs(tmp_path)  # under the trainer's run directory
    got = read_run(run_dir)
    run = got["run"]
    assert (run.run_id, run.project, run.display_name, run.run_group) == (UID, "team-a", "tiny-grpo", "tiny-grpo")
    assert list(run.tags) == ["tandem", "grpo", "smoke"]
    assert got["config"]["algorithm"] == {"name": "grpo", "lr": 1e-6} and got["config"]["seed"] == 3
    assert got["config"]["tandem"] == {"job": "tiny-grpo", "namespace": "team-a", "uid": UID}
    rows = got["history"]
    reward = {r["iteration"]: r["reward_mean"] for r in rows if "reward_mean" in r}
    assert reward == {0: 0.0, 1: pytest.approx(0.1), 2: pytest.approx(0.2)}
    assert {r["iteration"]: r["seconds/train"] for r in rows if "seconds/train" in r} == {0: 1.0, 1: 2.0, 2: 3.0}
    assert all("message" not in r for r in rows)  # numbers only
    # each evaluation once, at its own iteration (the row after it carries it again: not logged twice)
    assert [(r["iteration"], r["eval/pass_at_1"]) for r in rows if "eval/pass_at_1" in r] == [(0, 0.1), (2, 0.5)]
    table = got["tables"]["eval/table"][-1]
    assert table["columns"][:5] == ["iteration", "version", "prompts", "samples", "pass_at_1"]
    assert [(r[0], r[4]) for r in table["data"]] == [(0, 0.1), (2, 0.5)]
    progress = got["tables"]["progress_table"][-1]  # the line chart's data: reward and pass@1 per iteration
    lines = {(r[0], r[1]) for r in progress["data"]}  # (x, series) pairs
    assert {(0, "reward"), (2, "reward"), (0, "held-out pass@1"), (2, "held-out pass@1")} <= lines, progress


def test_a_restarted_trainer_continues_the_same_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")  # `tandem run`'s way: the shell's WANDB_MODE wins over the spec
    spec = Tracking(tensorboard=False, wandb=WandB(project="rl", group="sweep-1"))
    first = Tracker.create(spec, tmp_path, "j", PARAMS, namespace="default", uid=UID)
    drive(first, 0, 2, {})
    first.close(close_timeout=60)
    again = Tracker.create(spec, tmp_path, "j", PARAMS, namespace="default", uid=UID)  # the gang's restart
    drive(again, 2, 4, {})
    again.close(close_timeout=60)
    other = Tracker.create(spec, tmp_path, "j", PARAMS, namespace="default", uid="another-uid")  # a new job
    drive(other, 0, 1, {})
    other.close(close_timeout=60)
    runs = [read_run(d) for d in offline_runs(tmp_path)]
    by_id: dict[str, list[int]] = {}
    for got in runs:
        assert (got["run"].project, got["run"].run_group) == ("rl", "sweep-1")
        by_id.setdefault(got["run"].run_id, []).extend(r["iteration"] for r in got["history"]
                                                       if "reward_mean" in r)
    assert by_id == {UID: [0, 1, 2, 3], "another-uid": [0]}  # `wandb sync` joins the two parts: resume="allow"


def test_a_refused_server_warns_once_and_never_blocks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "3")  # wandb's own wait for its server (ours: 30 s)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    spec = Tracking(wandb=WandB(base_url=f"http://127.0.0.1:{port}"))
    tracker = Tracker.create(spec, tmp_path, "j", PARAMS, namespace="default", uid=UID)
    for it in range(4):
        t0 = time.monotonic()
        drive(tracker, it, it + 1, {})
        assert time.monotonic() - t0 < 0.5, "log() must not wait for W&B"
    t0 = time.monotonic()
    tracker.close(close_timeout=20)
    assert time.monotonic() - t0 < 20
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"127.0.0.1:{port}" in warnings[0] and "training goes on" in warnings[0], warnings
    assert "k" * 40 not in caplog.text
    assert tracker.wandb_run_id is None
    assert (tmp_path / "tensorboard").is_dir()  # the other sinks unaffected


def test_the_base_url_may_not_carry_credentials() -> None:
    from tandem.spec.load import SpecError, parse_job

    job = {"apiVersion": "tandem.dev/v1alpha1", "kind": "RLHFJob", "metadata": {"name": "j"},
           "spec": {"model": {"path": "/m"}, "rewards": [{"type": "answerMatch"}], "dataset": {"path": "/d"},
                    "tracking": {"wandb": {"baseUrl": "https://alice:pw-Kq7@wandb.example.com"}}}}
    with pytest.raises(SpecError) as err:
        parse_job(job, "job.yaml")
    assert err.value.fields == ["spec.tracking.wandb.baseUrl"] and "credentialsSecret" in str(err.value)
    assert "Kq7" not in str(err.value)
