"""Multi-turn pictures on a real vLLM: an environment answers with a picture, it reaches the next turn, and the
trainer scores the whole trajectory as vLLM sampled it. Both families: LLaVA (tiny_model.py's `save_vlm`, a fixed
count of image tokens per picture) and Qwen2.5-VL (`save_qwen_vl`: a grid of tokens per picture, 3-D positions).

A row whose prompt holds a picture; a scripted environment answers the first reply with a user message holding a
picture it drew (a PIL image) and a corrupt one, then ends the trajectory. Asserted: the trajectory holds both
pictures and its second model turn was sampled from them (the driver checks each turn's prompt as vLLM expanded it
against the trajectory's own expansion; a wrong count per picture fails that check); the corrupt picture is refused,
counted and named to the model; the rollout's log-probs of every model token equal transformers' in one forward
over the whole trajectory with its two pictures, and so do the hf engine's (Tandem's trainer), packed with the
prompt shared and not, the environment's picture placed from `Sample.completion_images`.
"""

from __future__ import annotations

import base64
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image, ImageDraw

from tandem.sidecars.envs.env_pictures import PictureRules
from tandem.sidecars.envs.environments import SingleTurn, Step
from tandem.sidecars.envs.multi_turn import Limits, MultiTurnDriver
from tandem.sidecars.picture_files import tokens_per_picture
from tandem.sidecars.rollout_engine.sampling import SamplingOptions
from tandem.spec.trainer import IMAGE_TOKEN_BIAS

sys.path.insert(0, str(Path(__file__).parents[1] / "rollout_engine"))
import tiny_model  # noqa: E402

pytestmark = [pytest.mark.vllm]
SAMPLED = SamplingOptions(temperature=1.0, max_tokens=8)
TRAJECTORIES = 8  # of one row, each ending its turns at random (tiny_model.end_turns)
LOGPROB_TOL = 1e-3  # vLLM's kernels vs transformers, float32 on CPU (test_trainer_to_vllm.py's)
CORRUPT = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 40).decode()


def drawing(seed: int, size: tuple[int, int]) -> Image.Image:
    rng = random.Random(seed)
    image = Image.new("RGB", size, tuple(rng.randrange(256) for _ in range(3)))  # type: ignore[arg-type]
    ImageDraw.Draw(image).rectangle([4, 4, size[0] // 2, size[1] // 2],
                                    fill=tuple(rng.randrange(256) for _ in range(3)))
    return image


class ShowsAPicture(SingleTurn):
    """Answers the first reply with a picture (and a corrupt one), then ends the trajectory."""

    def __init__(self, picture: Image.Image) -> None:
        super().__init__()
        self.picture = picture

    def step(self, reply: str) -> Step:
        self.stats.turns += 1
        if self.stats.turns > 1:
            return Step([], done=True)
        return Step([{"role": "user", "content": [{"type": "text", "text": "And this one?"},
                                                  {"type": "image", "image": self.picture},
                                                  {"type": "image_url", "image_url": {"url": CORRUPT}}]}], done=False)


ROW = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in it?"}]}]


@pytest.fixture(scope="module", params=["llava", "qwen2_5_vl"])
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine

    root = tmp_path_factory.mktemp(request.param)
    built = tiny_model.save_vlm(root) if request.param == "llava" else tiny_model.save_qwen_vl(root / "qwen")
    model = tiny_model.end_turns(built, ROW, [drawing(10 + i, (64, 48)) for i in range(6)])
    engine = RolloutEngine(EngineConfig(shm_root=root / "shm", job="pictures", max_model_len=512))
    engine.start(str(model), dummy=False)
    yield model, engine
    engine.terminate()


def driver_of(model: Path, engine: Any, picture: Image.Image, tokens: Any = None) -> MultiTurnDriver:
    from transformers import AutoConfig, AutoTokenizer

    from tandem.spec.trainer import image_token

    config = json.loads((model / "config.json").read_text())
    rules = PictureRules(tokens if tokens is not None else tokens_per_picture(str(model), config), max_pictures=2)
    return MultiTurnDriver(engine, AutoTokenizer.from_pretrained(model), lambda: ShowsAPicture(picture),
                           Limits(max_turns=3, max_turn_tokens=8, max_total_tokens=400), pictures=rules,
                           image_token=image_token(AutoConfig.from_pretrained(model)))


def test_an_environments_picture_reaches_the_next_turn_and_the_trainer_scores_it(family: tuple[Path, Any]) -> None:
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    from tandem.sidecars.algorithms.algorithm_interface import Sample, pack_samples, row_budget
    from tandem.sidecars.trainer.engines.heads import shift_to_labels
    from tandem.sidecars.trainer.engines.hf_engine import HFEngine
    from tandem.sidecars.trainer.engines.vision_inputs import as_pictures

    model_dir, engine = family
    first, shown = drawing(1, (64, 48)), drawing(2, (48, 64))
    driver = driver_of(model_dir, engine, shown)
    try:
        results = driver.run([{}], [ROW], TRAJECTORIES, SAMPLED, version=1, images=[[first]])[0]
    finally:
        driver.close()
    image_id = int(driver.image_token or -1)
    shown_to = [r for r in results if len(r.trajectory.segments) > 1]
    assert shown_to, [r.finish for r in results]  # some first turn ended: the environment answered it
    for r in results:
        traj = r.trajectory
        assert traj.pictures[0] is first
        if len(traj.segments) == 1:  # its first turn cut at max_tokens: nothing followed
            assert r.finish == "length" and not traj.env_pictures
            continue
        assert r.finish in ("answer", "length") and traj.model_turns == 2 and r.pictures_refused == 1
        assert traj.env_pictures[0].size == shown.size
        assert traj.segments[1].ids.count(image_id) == 1  # one placeholder: vLLM expanded it
        assert "a picture was refused" in json.dumps(r.messages[2]["content"])

    processor = AutoProcessor.from_pretrained(model_dir)
    grid = AutoConfig.from_pretrained(model_dir).model_type == "qwen2_5_vl"
    pixels = [as_pictures(processor.image_processor(images=[p], return_tensors="pt")) for p in (first, shown)]
    held = [r.trajectory.expanded(image_id) for r in results]
    samples = [Sample(prompt_ids=h.prompt_ids, completion_ids=h.completion_ids, group=0, images=pixels[0],
                      completion_images=pixels[1] if r.trajectory.env_pictures else (), completion_mask=h.mask)
               for r, h in zip(results, held, strict=True)]
    assert all(s.prompt_ids == samples[0].prompt_ids for s in samples)  # one row's trajectories: its prompt shared

    reference = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    trainer = HFEngine.from_hf(model_dir, trainable=False)
    gaps = {"transformers": 0.0, "hf engine": 0.0}
    scored = {}
    for share in (False, True):
        batch = pack_samples(samples, 3 * row_budget(samples, share_prompts=share), share_prompts=share)
        scored[share] = batch.unpack(shift_to_labels(trainer.token_logprobs(batch, micro_batch_size=1)))
    for i, (s, h) in enumerate(zip(samples, held, strict=True)):
        seq = torch.tensor([s.prompt_ids + s.completion_ids])
        pics = (*s.images, *s.completion_images)
        if grid:
            inputs = {"pixel_values": torch.cat([t.reshape(-1, t.shape[-1]) for t in pics]),
                      "image_grid_thw": torch.tensor([list(t.shape[:3]) for t in pics]),
                      "mm_token_type_ids": (seq == image_id).int()}
        else:
            inputs = {"pixel_values": torch.stack(pics)}
        with torch.no_grad():
            logits = reference(input_ids=seq, **inputs).logits[0].float()
        logits[:, image_id] += IMAGE_TOKEN_BIAS
        n = len(s.prompt_ids)
        want = torch.log_softmax(logits, -1)[torch.arange(n - 1, seq.shape[1] - 1), torch.tensor(s.completion_ids)]
        model_tokens = torch.tensor(h.mask, dtype=torch.bool)
        vllm = torch.tensor(h.logprobs)[model_tokens]
        gaps["transformers"] = max(gaps["transformers"], float((want[model_tokens] - vllm).abs().max()))
        for share in (False, True):
            gaps["hf engine"] = max(gaps["hf engine"], float((scored[share][i][model_tokens] - vllm).abs().max()))
    print(f"\nmulti-turn pictures ({'qwen2_5_vl' if grid else 'llava'}), largest gap to vLLM's log-probs: "
          + ", ".join(f"{k} {v:.2e}" for k, v in gaps.items()))
    assert max(gaps.values()) < LOGPROB_TOL, gaps


def test_a_wrong_count_of_image_tokens_is_caught_when_vllm_answers(family: tuple[Path, Any]) -> None:
    model_dir, engine = family
    driver = driver_of(model_dir, engine, drawing(3, (64, 64)), tokens=lambda picture: 2)
    try:
        with pytest.raises(RuntimeError, match="vLLM expanded 1 pictures to .* prompt tokens other than"):
            driver.run([{}], [ROW], 1, SAMPLED, version=1, images=[[drawing(4, (64, 64))]])
    finally:
        driver.close()
