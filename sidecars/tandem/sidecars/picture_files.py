"""The pictures of a dataset row: found in its messages, read, checked against the job's limits, or refused.

Role: a vision-language job's rows carry pictures as OpenAI-style content parts of their messages:
`{"type": "image_url", "image_url": {"url": ...}}` with a `file://` URL, a `data:image/...;base64,` URL or a
path, or `{"type": "image", "path": ...}` (`image` or `url` keys are read the same); a relative path is
relative to the dataset file's folder. `pictures(messages, base, limits)` returns the row's pictures as RGB
images in order and the messages with each image part reduced to `{"type": "image"}` (what a chat template
renders as the model's image placeholder); a picture that is missing, unreadable, corrupt or truncated, of a
format outside FORMATS, over `limits.max_pixels` (unless `limits.resize` is downscale: then made to fit,
aspect kept), or one too many for `limits.max_per_prompt`, raises `Refused` with the reason; the caller
counts the row and goes on. Pillow decodes the whole picture here (a truncated file fails now, not in vLLM),
with its decompression-bomb guard at the job's own limit; `fit` checks a picture already in memory the same way
(one an environment made). `tokens_per_picture(path, config)`: the image tokens a
picture's placeholder becomes for the model at `path` (what a prompt's length counts). Callers: the trainer's dataset
(`trainer/loop/data/dataset.py`) and preflight, the multi-turn driver (`envs/env_pictures.py`: pictures an environment
answers with).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from PIL import Image, UnidentifiedImageError

GRID_FAMILIES = ("qwen2_5_vl",)  # pictures as grids of patches: each its own count of image tokens
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")  # decoded by Pillow and by vLLM's image loader alike


class Refused(ValueError):
    """A row's picture cannot be used; the message says which and why (the row is counted, the job goes on)."""


@dataclass(frozen=True)
class Limits:
    max_per_prompt: int = 4
    max_pixels: int = 4_194_304
    resize: str = "refuse"  # or "downscale"


def is_image_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in ("image", "image_url")


def pictures(messages: list[dict[str, Any]], base: Path,
             limits: Limits) -> tuple[list[Image.Image], list[dict[str, Any]]]:
    """(the row's pictures in order, its messages with each image part as `{"type": "image"}`)."""
    found: list[Image.Image] = []

    def read(part: dict[str, Any]) -> dict[str, Any]:
        if len(found) == limits.max_per_prompt:
            raise Refused(f"more than {limits.max_per_prompt} pictures (dataset.images.maxPerPrompt)")
        found.append(load(source_of(part), base, limits))
        return {"type": "image"}

    out = each_image_part(messages, read)
    return found, out


def each_image_part(messages: Sequence[dict[str, Any]],
                    replace: Callable[[dict[str, Any]], dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with every image part of their content lists replaced by `replace(part)`, called in order."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            message = {**message, "content": [replace(p) if is_image_part(p) else p for p in content]}
        out.append(message)
    return out


def with_column(messages: list[dict[str, Any]], value: Any, field: str) -> list[dict[str, Any]]:
    """The messages with the pictures of a row's images column (`dataset.images.field`: a path, a list of paths, or
    a `datasets` Image feature's {bytes, path}) put as image parts before the text of the last user message."""
    items = value if isinstance(value, list) else [value]
    parts: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, str) and item:
            parts.append({"type": "image", "path": item})
        elif isinstance(item, dict) and isinstance(item.get("bytes"), bytes | bytearray):
            encoded = base64.b64encode(bytes(item["bytes"])).decode()
            parts.append({"type": "image", "url": f"data:image/unknown;base64,{encoded}"})
        elif isinstance(item, dict) and isinstance(item.get("path"), str) and item["path"]:
            parts.append({"type": "image", "path": item["path"]})
        else:
            raise Refused(f"field {field!r} (dataset.images.field): not a picture path or image: {str(item)[:80]}")
    last = max(i for i, m in enumerate(messages) if m["role"] == "user")
    content = messages[last]["content"]
    text = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    return [*messages[:last], {**messages[last], "content": [*parts, *text]}, *messages[last + 1:]]


def text_of(content: Any) -> str:
    """A message's text: the string, or its text parts joined."""
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")


def source_of(part: dict[str, Any]) -> str:
    """The URL or path an image part names."""
    if part.get("type") == "image_url":
        ref = part.get("image_url")
        url = ref.get("url") if isinstance(ref, dict) else ref
    else:
        url = next((part[k] for k in ("path", "image", "url") if isinstance(part.get(k), str)), None)
    if not isinstance(url, str) or not url:
        raise Refused(f"an image part names no picture: {str(part)[:120]}")
    return url


def load(source: str, base: Path, limits: Limits) -> Image.Image:
    """The picture at `source` (file://, data: or a path), decoded, checked and in RGB."""
    data = _bytes(source, base)
    name = source if not source.startswith("data:") else "a data: URL"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image: Image.Image = Image.open(io.BytesIO(data))
            if image.format not in FORMATS:
                raise Refused(f"{name}: format {image.format} is not one of {', '.join(FORMATS)}")
            _check_size(image, limits, name)  # before decoding it all
            image.load()  # decodes all of it: a truncated or corrupt file fails here
    except Refused:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError,
            Image.DecompressionBombWarning) as e:
        raise Refused(f"{name}: not a readable picture ({type(e).__name__}: {e})") from None
    return _fitted(image, limits)


def fit(image: Image.Image, limits: Limits, name: str) -> Image.Image:
    """A picture already in memory (one an environment made) checked against `limits` as `load` checks a file's:
    Refused over max_pixels unless resize is downscale, which makes it fit; in RGB."""
    _check_size(image, limits, name)
    return _fitted(image, limits)


def _check_size(image: Image.Image, limits: Limits, name: str) -> None:
    if image.width * image.height > limits.max_pixels and limits.resize != "downscale":
        raise Refused(f"{name}: {image.width}x{image.height} is over {limits.max_pixels} pixels "
                      "(dataset.images.maxPixels; resize: downscale makes it fit)")


def _fitted(image: Image.Image, limits: Limits) -> Image.Image:
    """`image` downscaled (aspect kept) to at most max_pixels where it is larger, in RGB."""
    pixels = image.width * image.height
    if pixels > limits.max_pixels:
        scale = math.sqrt(limits.max_pixels / pixels)
        size = (max(1, int(image.width * scale)), max(1, int(image.height * scale)))
        image = image.resize(size, Image.Resampling.BICUBIC)
    return image.convert("RGB")


def _bytes(source: str, base: Path) -> bytes:
    if source.startswith("data:"):
        head, _, payload = source.partition(",")
        if not head.startswith("data:image/") or not head.endswith(";base64"):  # (the format: Pillow reads it)
            raise Refused(f"a data: URL must be data:image/<format>;base64,... (got {head[:40]!r})")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as e:
            raise Refused(f"a data: URL's base64 does not decode: {e}") from None
    parsed = urlparse(source)
    if parsed.scheme == "file":
        path = Path(unquote(parsed.path))
    elif parsed.scheme == "":
        path = Path(source)
    else:
        raise Refused(f"{source[:120]}: only file://, data: and paths are read (no network access)")
    path = path if path.is_absolute() else base / path
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise Refused(f"{path}: no such file") from None
    except OSError as e:
        raise Refused(f"{path}: cannot be read ({e.strerror})") from None


PerImage = int | Callable[[Any], int]  # the image tokens of a picture: the same for each, or by picture


def tokens_per_picture(path: str, config: dict[str, Any]) -> PerImage:
    """The image tokens a picture's placeholder becomes: config.json's `image_seq_length` (1 where it has none), or,
    for a family whose pictures are grids of patches (Qwen2.5-VL), a picture's own count, from its size as the
    model's image processor resizes it (patches / spatial merge size**2, as vLLM counts them). ValueError naming
    `path` when its image processor cannot be loaded."""
    if config.get("model_type") not in GRID_FAMILIES:
        return int(config.get("image_seq_length") or 1)
    from transformers import AutoImageProcessor

    try:
        processor = AutoImageProcessor.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - transformers raises OSError, ValueError, KeyError, ... here
        raise ValueError(f"cannot load the image processor of {path}: {e}") from None
    merge = int(processor.merge_size) ** 2
    return lambda picture: int(processor.get_number_of_image_patches(picture.height, picture.width, {})) // merge
