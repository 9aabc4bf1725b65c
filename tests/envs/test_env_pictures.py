"""The pictures of a multi-turn conversation, without a model: what an environment may answer with, what is refused
and counted, a tool that returns a picture, a trajectory's ids with each picture's placeholder expanded
(env_pictures.py, trajectory.py), and where a completion's pictures sit in a packed row (algorithms/pictures.py).

Asserted: a picture the environment made (a PIL image) and a data: URL are taken in order, each part made bare for
the chat template and counted as its image tokens; a corrupt picture, one over the pixel limit, one beyond
rollout.environment.maxPictures, a bare part and any picture for a text model become a text part naming why and are
counted, the others still taken; downscale makes a large one fit; the row's pictures fill its bare parts, and one
left over is an error. A trajectory expands the prompt's and the environment's placeholders to their counts, masks
them out with log-prob 0, and refuses counts that do not match its placeholders. A packed row holds a sample's
prompt pictures, then its completion's, and a shared prompt's once. A tool's picture comes back as the tool
message's image part.
"""

from __future__ import annotations

import base64
import io

import pytest
import torch
from PIL import Image

from tandem.sidecars import picture_files
from tandem.sidecars.algorithms.algorithm_interface import Sample, pack_samples
from tandem.sidecars.envs.env_pictures import Conversation, PictureRules
from tandem.sidecars.envs.trajectory import Trajectory, expand

IMAGE = 9


def png(size: tuple[int, int], colour: str = "red") -> Image.Image:
    return Image.new("RGB", size, colour)


def data_url(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def answer(*parts: dict[str, object]) -> list[dict[str, object]]:
    return [{"role": "user", "content": [{"type": "text", "text": "look"}, *parts]}]


def test_an_environments_pictures_are_taken_in_order_and_bad_ones_refused_and_counted() -> None:
    rules = PictureRules(tokens=lambda p: p.width // 8, max_pictures=3,
                         limits=picture_files.Limits(max_pixels=64 * 64))
    talk = Conversation(rules)
    corrupt = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\nnot really").decode()
    messages, found, counts = talk.take(answer(
        {"type": "image", "image": png((32, 16))},
        {"type": "image_url", "image_url": {"url": corrupt}},
        {"type": "image_url", "image_url": {"url": data_url(png((16, 16), "blue"))}},
        {"type": "image", "image": png((65, 64))},  # over 64*64 pixels: refuse
        {"type": "image"}))  # bare: names no picture
    assert [f.size for f in found] == [(32, 16), (16, 16)] and counts == [4, 2]
    assert found[1].getpixel((0, 0)) == (0, 0, 255)
    assert talk.added == 2 and talk.refused == 3
    parts = messages[0]["content"]
    assert [p["type"] for p in parts] == ["text", "image", "text", "image", "text", "text"]
    assert "not a readable picture" in parts[2]["text"] and "over 4096 pixels" in parts[4]["text"]
    assert "holds no picture" in parts[5]["text"]
    # the trajectory's third is allowed, its fourth is one too many
    _, found, _ = talk.take(answer({"type": "image", "image": png((8, 8))}, {"type": "image", "image": png((8, 8))}))
    assert len(found) == 1 and talk.added == 3 and talk.refused == 4


def test_downscale_fits_a_large_picture_and_a_text_model_takes_none() -> None:
    fit = Conversation(PictureRules(tokens=5, limits=picture_files.Limits(max_pixels=64 * 64, resize="downscale")))
    _, [small], [n] = fit.take(answer({"type": "image", "image": png((256, 128))}))
    assert small.width * small.height <= 64 * 64 and small.width == 2 * small.height and n == 5
    text = Conversation(PictureRules(tokens=None))
    messages, found, _ = text.take(answer({"type": "image", "image": png((8, 8))}))
    assert found == [] and text.refused == 1  # its parts all text now: one string, as a text template renders
    assert messages[0]["content"].startswith("look(a picture was refused: the model takes no pictures")


def test_the_rows_pictures_fill_its_bare_parts() -> None:
    talk = Conversation(PictureRules(tokens=3))
    row = png((8, 8), "green")
    messages, found, counts = talk.take(answer({"type": "image"}), [row])
    assert found == [row] and counts == [3] and talk.added == 0 and messages[0]["content"][1] == {"type": "image"}
    with pytest.raises(ValueError, match="1 of the row's pictures have no image part"):
        talk.take([{"role": "user", "content": "no picture here"}], [row])


def test_a_trajectory_expands_each_placeholder_to_its_pictures_tokens() -> None:
    traj = Trajectory([1, IMAGE, 2], prompt_pictures=("p",), prompt_picture_tokens=(3,))
    traj.add_model([4, 5], [-0.5, -0.25], version=1)
    traj.add_env([6, IMAGE, 7, IMAGE], ["a", "b"], [2, 4])
    traj.add_model([8], [-1.0], version=1)
    assert traj.pictures == ("p", "a", "b") and traj.env_pictures == ("a", "b")
    assert traj.picture_tokens == 2 + 1 + 3 and traj.completion_length == 7 + 1 + 3
    held = traj.expanded(IMAGE)
    assert held.prompt_ids == [1, IMAGE, IMAGE, IMAGE, 2]
    assert held.completion_ids == [4, 5, 6, IMAGE, IMAGE, 7] + [IMAGE] * 4 + [8]
    assert held.mask == [1, 1] + [0] * 8 + [1]
    assert held.logprobs == [-0.5, -0.25] + [0.0] * 8 + [-1.0]
    with pytest.raises(ValueError, match="1 image placeholders for 2 pictures"):
        expand([IMAGE], [1, 2], IMAGE)
    with pytest.raises(ValueError, match="2 pictures with 1 token counts"):
        traj.add_env([IMAGE], ["a", "b"], [1])


def test_a_packed_row_holds_the_prompts_pictures_then_the_completions() -> None:
    p, a, b = (torch.full((3, 2, 2), float(v)) for v in (1, 2, 3))
    samples = [Sample(prompt_ids=[1, IMAGE, 2], completion_ids=[3, IMAGE, 4], group=0, images=(p,),
                      completion_images=(a,)),
               Sample(prompt_ids=[1, IMAGE, 2], completion_ids=[5, IMAGE, 6], group=0, images=(p,),
                      completion_images=(b,))]
    for share, want in ((False, [p, a, p, b]), (True, [p, a, b])):
        batch = pack_samples(samples, 64, share_prompts=share)
        assert batch.images is not None and batch.num_rows == 1
        assert [t[0, 0, 0].item() for t in batch.images[0]] == [t[0, 0, 0].item() for t in want], share


def test_a_tool_that_returns_a_picture_is_answered_with_it() -> None:
    from tandem.sidecars.envs.environments import ToolEnvironment
    from tandem.sidecars.envs.tools import ToolBox

    def zoom(size: int) -> Image.Image:
        """A square picture of the given size.

        Args:
            size: Its side in pixels.
        """
        return png((size, size), "blue")

    box = ToolBox([zoom])
    try:
        env = ToolEnvironment(box)
        step = env.step('<tool_call>{"name": "zoom", "arguments": {"size": 24}}</tool_call>')
    finally:
        box.close()
    [message] = step.messages
    assert message["role"] == "tool" and env.stats.tool_errors == 0
    [part] = message["content"]
    assert part["type"] == "image" and part["image"].size == (24, 24)
    messages, [found], [n] = Conversation(PictureRules(tokens=7)).take(step.messages)
    assert found.size == (24, 24) and n == 7 and messages[0]["content"] == [{"type": "image"}]
