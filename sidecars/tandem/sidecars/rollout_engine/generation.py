"""What the rollout engine hands vLLM to generate, and what it makes of vLLM's answers.

Role: the pure part of generation, apart from the engine's lifecycle: vLLM's SamplingParams of a
`SamplingOptions` (the sampled token's log-prob returned), one request per prompt where prompts differ in budget
or seed (`requests`: each prompt its own seed, `sampling.prompt_seeds`), the prompt-length check before vLLM
sees a prompt (`check_lengths`: `PromptTooLong`, HTTP 400 naming the limit), a prompt's pictures (vision-language
models: vLLM's `multi_modal_data`; on the wire base64 PNG: contract.py), and a vLLM output as a
`Completion` (its prompt ids as vLLM expanded them: a picture's placeholder becomes its image tokens).
Callers: `engine.RolloutEngine.generate` and the multi-turn loop (turns.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tandem.checkpoint_engine import errors
from tandem.sidecars.rollout_engine.sampling import Completion, SamplingOptions, prompt_seeds
from tandem.spec.trainer import IMAGE_TOKEN_BIAS

Prompt = str | Sequence[int]


def sampling_params(opts: SamplingOptions, n: int, seed: int | None) -> Any:
    """vLLM's SamplingParams for `opts`, with the sampled token's log-prob returned (generate, turns.py)."""
    from vllm import SamplingParams

    return SamplingParams(n=n, logprobs=0, temperature=opts.temperature, top_p=opts.top_p, top_k=opts.top_k,
                          max_tokens=opts.max_tokens, min_tokens=opts.min_tokens, seed=seed,
                          stop=opts.stop or None, stop_token_ids=opts.stop_token_ids, ignore_eos=opts.ignore_eos)


def completion(out: Any, c: Any, prompt_index: int = 0, sample_index: int = 0) -> Completion:
    """One of vLLM's outputs `c` of request output `out` with the log-prob of every sampled token."""
    ids = list(c.token_ids)
    logprobs = [float(step[t].logprob) for step, t in zip(c.logprobs or [], ids, strict=False)]
    return Completion(prompt_index=prompt_index, sample_index=sample_index,
                      prompt_token_ids=list(out.prompt_token_ids or []), token_ids=ids, logprobs=logprobs,
                      text=c.text, finish_reason=c.finish_reason)


def check_max_tokens(prompts: Sequence[Prompt], max_tokens: Sequence[int] | None) -> None:
    """BadRequest when a per-prompt budget list does not match the prompts."""
    if max_tokens is not None and len(max_tokens) != len(prompts):
        raise errors.BadRequest(f"max_tokens has {len(max_tokens)} entries for {len(prompts)} prompts")


def requests(prompts: Sequence[Prompt], opts: SamplingOptions, n: int, max_tokens: Sequence[int] | None,
             on_gpu: bool, images: Sequence[Sequence[Any]] | None = None,
             image_token: int | None = None) -> tuple[list[Any], Any]:
    """(vLLM's inputs, the SamplingParams: one for all, or one per prompt when budgets or seeds differ). `images`:
    each prompt's pictures (PIL images, in the order of its image placeholders), which vLLM's processor for the
    model turns into its image tokens. A vision-language model's `image_token` is never sampled (`never_sample`)."""
    from vllm.inputs import TextPrompt, TokensPrompt

    if opts.seed is not None and not on_gpu:
        # vLLM 0.32 on CPU: a seeded request whose prefill gets chunked (a batch of prompts over
        # the step's token budget) rewinds its generator's offset, which CPU generators refuse,
        # and the engine dies ("CPU Generator does not use offset"). The engine's seed still holds.
        opts = opts.model_copy(update={"seed": None})
    params = never_sample(sampling_params(opts, n, opts.seed), image_token)
    per_request: Any = params
    if max_tokens is not None or opts.seed is not None:
        per_request = [params.clone() for _ in prompts]
    if max_tokens is not None:
        for sp, m in zip(per_request, max_tokens, strict=True):
            sp.max_tokens = int(m)
    if opts.seed is not None:
        for sp, s in zip(per_request, prompt_seeds(opts.seed, len(prompts)), strict=True):
            sp.seed = s
    if images is not None and len(images) != len(prompts):
        raise errors.BadRequest(f"images has {len(images)} entries for {len(prompts)} prompts")
    inputs: list[Any] = []
    for i, p in enumerate(prompts):
        media = pictures_of(images[i] if images is not None else ())
        inputs.append(TextPrompt(prompt=p, **media) if isinstance(p, str)
                      else TokensPrompt(prompt_token_ids=list(p), **media))
    return inputs, per_request


def never_sample(params: Any, image_token: int | None) -> Any:
    """`params` with a vision-language model's `image_token` never sampled (a completion holding one would ask the
    model for a picture that is not there): its logit gets IMAGE_TOKEN_BIAS, which the trainer's log-probs add too
    (hf_engine). A text model's (`image_token` None) are returned as they are."""
    if image_token is not None:
        params.logit_bias = {image_token: IMAGE_TOKEN_BIAS}
    return params


def pictures_of(pictures: Sequence[Any]) -> dict[str, Any]:
    """The `multi_modal_data` keyword of vLLM's prompt for `pictures` (PIL images in the order of its image
    placeholders), or nothing when there are none."""
    pics = list(pictures)
    return {"multi_modal_data": {"image": pics[0] if len(pics) == 1 else pics}} if pics else {}


def check_lengths(llm: Any, prompts: Sequence[Prompt]) -> None:
    """PromptTooLong, naming the prompt and the limit, for a prompt with no room for a generated token."""
    limit = int(llm.llm_engine.model_config.max_model_len)
    tokenizer: Any = llm.get_tokenizer() if any(isinstance(p, str) for p in prompts) else None
    for i, p in enumerate(prompts):
        n = len(tokenizer.encode(p)) if isinstance(p, str) else len(p)  # as vLLM tokenizes a text prompt
        if n >= limit:
            raise errors.PromptTooLong(f"prompt {i} has {n} tokens: the engine's context length (max_model_len) "
                                       f"is {limit} tokens, so a prompt may have at most {limit - 1}")


def completions(outs: Sequence[Any]) -> list[list[Completion]]:
    """Every request output's completions, indexed by prompt and sample."""
    return [[completion(out, c, i, j) for j, c in enumerate(out.outputs)] for i, out in enumerate(outs)]
