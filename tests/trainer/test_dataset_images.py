"""A row's pictures (data/images.py) against real files: every form an image part takes is read, and every
bad picture is refused with its reason, never raised as anything else.

Pictures are written by Pillow; the bad ones the way they arrive: a file cut short, bytes that are no
picture, a TIFF, a file that is not there, a picture over the pixel limit, one picture too many, a data: URL
that is not base64 or not an image, a URL on the network."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tandem.sidecars import picture_files as images
from tandem.sidecars.picture_files import Limits, Refused

LIMITS = Limits(max_per_prompt=2, max_pixels=64 * 64)


def write(path: Path, size: tuple[int, int] = (32, 24), fmt: str = "PNG", mode: str = "RGB") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, (10, 200, 30) if mode == "RGB" else 5).save(path, format=fmt)
    return path


def data_url(size: tuple[int, int] = (8, 8)) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, (1, 2, 3)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def row(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "be brief"},
            {"role": "user", "content": [*parts, {"type": "text", "text": "What colour?"}]}]


def test_every_form_of_image_part_is_read(tmp_path: Path) -> None:
    write(tmp_path / "pics" / "a.png")
    write(tmp_path / "b.jpg", fmt="JPEG")
    write(tmp_path / "c.png", mode="P")
    parts = [{"type": "image", "path": "pics/a.png"},
             {"type": "image_url", "image_url": {"url": f"file://{tmp_path / 'b.jpg'}"}}]
    found, messages = images.pictures(row(*parts), tmp_path, LIMITS)
    assert [p.size for p in found] == [(32, 24), (32, 24)] and {p.mode for p in found} == {"RGB"}
    assert found[0].getpixel((0, 0)) == (10, 200, 30)
    assert messages[0] == {"role": "system", "content": "be brief"}
    assert messages[1]["content"] == [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "What colour?"}]
    found, _ = images.pictures(row({"type": "image_url", "image_url": {"url": data_url()}},
                                   {"type": "image", "image": str(tmp_path / "c.png")}), tmp_path, LIMITS)
    assert [p.size for p in found] == [(8, 8), (32, 24)] and found[1].mode == "RGB"


def test_a_row_without_pictures_is_left_as_it_is(tmp_path: Path) -> None:
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    assert images.pictures(messages, tmp_path, LIMITS) == ([], messages)


@pytest.mark.parametrize("case", ["missing", "not-a-picture", "truncated", "tiff", "too-large", "too-many",
                                  "bad-base64", "not-an-image-url", "network", "no-source"])
def test_a_bad_picture_is_refused_with_its_reason(tmp_path: Path, case: str) -> None:
    good = {"type": "image", "path": str(write(tmp_path / "good.png"))}
    parts: list[dict[str, Any]]
    if case == "missing":
        parts, reason = [{"type": "image", "path": "nowhere.png"}], "nowhere.png: no such file"
    elif case == "not-a-picture":
        (tmp_path / "x.png").write_bytes(b"this is text, not a picture")
        parts, reason = [{"type": "image", "path": "x.png"}], "x.png: not a readable picture"
    elif case == "truncated":
        noisy = Image.effect_noise((60, 60), 80).convert("RGB")  # does not compress away
        noisy.save(tmp_path / "cut.png")
        data = (tmp_path / "cut.png").read_bytes()
        (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
        parts, reason = [{"type": "image", "path": "cut.png"}], "cut.png: not a readable picture"
    elif case == "tiff":
        parts, reason = [{"type": "image", "path": str(write(tmp_path / "t.tif", fmt="TIFF"))}], "format TIFF"
    elif case == "too-large":
        parts, reason = [{"type": "image", "path": str(write(tmp_path / "l.png", size=(65, 64)))}], \
            "65x64 is over 4096 pixels"
    elif case == "too-many":
        parts, reason = [good, good, good], "more than 2 pictures"
    elif case == "bad-base64":
        parts, reason = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}], "base64"
    elif case == "not-an-image-url":
        parts, reason = [{"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGk="}}], \
            "data:image/<format>;base64"
    elif case == "network":
        parts, reason = [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}], \
            "no network access"
    else:
        parts, reason = [{"type": "image_url", "image_url": {}}], "names no picture"
    with pytest.raises(Refused, match=reason.replace(".", r"\.").replace("(", r"\(")):
        images.pictures(row(*parts), tmp_path, LIMITS)


def test_downscale_fits_a_large_picture_keeping_its_aspect(tmp_path: Path) -> None:
    path = write(tmp_path / "wide.png", size=(200, 50))
    found, _ = images.pictures(row({"type": "image", "path": str(path)}), tmp_path,
                               Limits(max_pixels=64 * 64, resize="downscale"))
    (w, h), = [p.size for p in found]
    assert w * h <= 64 * 64 and abs(w / h - 4.0) < 0.2 and w >= 120
