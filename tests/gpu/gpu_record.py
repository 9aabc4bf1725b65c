"""Rows of scripts/gpu-check.sh's table: each GPU check appends its measurements as a JSON line to
$TANDEM_GPU_CHECK_OUT when it is set. Caller: test_gpu_path.py."""

from __future__ import annotations

import json
import os
from typing import Any


def record(check: str, **values: Any) -> None:
    """One row of the gpu-check table."""
    out = os.environ.get("TANDEM_GPU_CHECK_OUT")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps({"check": check, **values}) + "\n")
