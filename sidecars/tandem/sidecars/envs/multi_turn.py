"""The multi-turn driver: trajectories of model turns and environment turns on the live vLLM, token in, token out.

Role: for each (row, sample) an environment (`environments.Environment`) gives the first messages, the chat template
renders them with the environment's tools (`chat.ChatRenderer`), and the trajectory alternates: a model turn
sampled by vLLM (its ids and log-probs kept as sampled, `trajectory.Trajectory.add_model`), then, unless the
environment says the trajectory is done, its messages (tool results, observations) as tokens
(`ChatRenderer.continuation_ids`: never re-tokenizing the model's text) and the next model turn. Every turn is a
request in vLLM's running batch (`rollout_engine.turns.run_turns`); the environments step on a bounded
worker pool, so a trajectory waiting on its tools never holds back the others (no lock-step turns).
Limits (`Limits`): model turns, tokens per model turn, completion tokens of a whole trajectory (model and
environment tokens together, within vLLM's context), and tokens of each tool message (a longer one is cut and
says so). A trajectory ends with a final answer (the environment's done), at max turns, when a model turn is
cut at its token limit (the template's end of turn is missing, so nothing can follow it), or when the next
turn would not fit the budget. The tool answers that reached the model (appended before its next turn, not
errors) are counted in the trajectory's stats (`tool_results`). Pictures (vision-language models): the row's and
those its environment answers with (`env_pictures`) ride with every later turn; a trajectory's token limits count
each as its image tokens, and every turn checks that vLLM expanded them so. Caller: the rollout sidecar
(rollout/http_app.py), tests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tandem.sidecars.envs.chat import ChatRenderer, Renderers
from tandem.sidecars.envs.env_pictures import Conversation, PictureRules
from tandem.sidecars.envs.environments import Environment, Message, TurnStats
from tandem.sidecars.envs.trajectory import Trajectory
from tandem.sidecars.rollout_engine.sampling import Completion, SamplingOptions
from tandem.sidecars.rollout_engine.turns import Turn, run_turns

TRUNCATED = " ...(cut: the tool's output was longer than the job allows)"


@dataclass(frozen=True)
class Limits:
    max_turns: int = 4  # model turns per trajectory
    max_turn_tokens: int = 256  # tokens of one model turn (rollout.maxTokens)
    max_total_tokens: int = 1024  # completion tokens of a trajectory: model and environment turns together
    max_tool_output_tokens: int = 256  # tokens of one tool message; a longer one is cut

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_turn_tokens", "max_total_tokens", "max_tool_output_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class Result:
    """One finished trajectory and what the trainer needs of it."""

    trajectory: Trajectory
    stats: TurnStats
    final_text: str = ""  # the last model turn's text: what the job's rewards judge
    reward: float | None = None  # the environment's own: the sum of the rewards its steps gave (None: none did)
    turn_rewards: list[float | None] = field(default_factory=list)  # what each model turn's step gave
    finish: str = ""  # answer | max_turns | length | budget
    messages: list[Message] = field(default_factory=list)  # the conversation, for logs and the live table
    pictures_refused: int = 0  # pictures the environment sent that could not be used (env_pictures)


@dataclass
class _State:
    env: Environment
    renderer: ChatRenderer
    result: Result
    pictures: Conversation = field(default_factory=lambda: Conversation(PictureRules()))  # (a text model's: none)


class MultiTurnDriver:
    def __init__(self, engine: Any, tokenizer: Any, make_env: Callable[[], Environment], limits: Limits,
                 workers: int = 8, pictures: PictureRules | None = None, image_token: int | None = None) -> None:
        """`engine`: a RolloutEngine; `make_env`: a fresh environment per trajectory; `workers`: environment
        steps (and the tool calls inside them) run at once; `pictures` and `image_token`: a vision-language
        model's (None: a text model, whose environments' pictures are refused)."""
        self.engine, self.tok, self.make_env, self.limits = engine, tokenizer, make_env, limits
        self.picture_rules, self.image_token = pictures or PictureRules(), image_token
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="env-step")
        self._renderers = Renderers(tokenizer)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def renderer(self, tools: list[dict[str, Any]]) -> ChatRenderer:
        return self._renderers.get(tools)

    def run(self, rows: Sequence[Mapping[str, Any]], messages: Sequence[list[Message]], n: int,
            options: SamplingOptions, version: int, images: Sequence[Sequence[Any]] | None = None
            ) -> list[list[Result]]:
        """`n` trajectories per row (its rendered first messages in `messages`, its pictures in `images`: one per
        bare image part, in order), sampled with `options` by the engine's current weights (`version`, recorded
        on every model turn)."""
        states: dict[tuple[int, int], _State] = {}
        first: list[Turn] = []
        budget = min(self.limits.max_turn_tokens, self.limits.max_total_tokens)
        given = list(images) if images is not None else [[] for _ in rows]
        for i, (row, start, pics) in enumerate(zip(rows, messages, given, strict=True)):
            for j in range(n):
                env = self.make_env()
                pictures = Conversation(self.picture_rules)
                seen = {**row, "pictures": list(pics)} if pics else row  # an environment may look at them
                opening, found, counts = pictures.take(env.reset(seen, list(start)), pics)
                renderer = self.renderer(env.tools())
                prompt = renderer.prompt_ids(opening)
                traj = Trajectory(prompt, prompt_pictures=tuple(found), prompt_picture_tokens=tuple(counts))
                states[(i, j)] = _State(env, renderer, Result(traj, env.stats, messages=opening), pictures)
                first.append(Turn((i, j), prompt, budget, traj.pictures, traj.picture_tokens))

        def react(turn: Turn, completion: Completion) -> Future[list[Turn]]:
            return self.pool.submit(self._advance, states[turn.key], turn, completion, version)  # type: ignore[index]

        run_turns(self.engine, first, options, react)
        return [[states[(i, j)].result for j in range(n)] for i in range(len(rows))]

    def _advance(self, state: _State, turn: Turn, completion: Completion, version: int) -> list[Turn]:
        """After a model turn: the environment's step, and the next model turn if there is one."""
        result, renderer = state.result, state.renderer
        traj = result.trajectory
        self._check_expansion(traj, turn, completion)
        traj.add_model(completion.token_ids, completion.logprobs, version)
        result.final_text = completion.text
        result.messages.append({"role": "assistant", "content": completion.text})
        ended = bool(completion.token_ids) and completion.token_ids[-1] == renderer.end_of_turn
        if completion.finish_reason != "stop" or not ended:
            result.finish = "length"  # cut mid-turn: the template's end of turn is missing
            return []
        errors = state.env.stats.tool_errors
        step = state.env.step(completion.text)
        result.stats = state.env.stats
        errors = result.stats.tool_errors - errors  # this step's: each one answered by one tool message
        result.turn_rewards.append(step.reward)
        if step.reward is not None:  # per-turn rewards add up to the trajectory's (its undiscounted return)
            result.reward = (result.reward or 0.0) + step.reward
        if step.done:
            result.finish = "answer"
            return []
        if traj.model_turns >= self.limits.max_turns:
            result.finish = "max_turns"
            return []
        new, found, counts = state.pictures.take([self.capped(m) for m in step.messages])
        result.pictures_refused = state.pictures.refused
        ids = renderer.continuation_ids(new)
        held = traj.completion_length + len(ids) + sum(n - 1 for n in counts)  # pictures as their image tokens
        left = self.limits.max_total_tokens - held
        if left < 1:
            result.finish = "budget"
            return []
        traj.add_env(ids, found, counts)
        result.messages.extend(new)
        result.stats.tool_results += max(sum(m.get("role") == "tool" for m in new) - errors, 0)
        return [Turn(turn.key, traj.prompt_ids + traj.completion_ids, min(self.limits.max_turn_tokens, left),
                     traj.pictures, traj.picture_tokens)]

    def _check_expansion(self, traj: Trajectory, turn: Turn, completion: Completion) -> None:
        """RuntimeError unless vLLM held the turn's prompt exactly as the trajectory expands it (each picture's
        placeholder as its image tokens): what the trainer will score is what vLLM sampled from."""
        if not turn.pictures or not completion.prompt_token_ids:
            return
        mine = traj.expanded(self.image_token)
        if completion.prompt_token_ids != mine.prompt_ids + mine.completion_ids:
            raise RuntimeError(f"turn {turn.key!r}: vLLM expanded {len(turn.pictures)} pictures to "
                               f"{len(completion.prompt_token_ids)} prompt tokens other than the trajectory's "
                               f"{len(mine.prompt_ids) + len(mine.completion_ids)}")

    def capped(self, message: Message) -> Message:
        """A tool message of at most max_tool_output_tokens tokens (a longer one is cut and says so)."""
        if message.get("role") != "tool" or not isinstance(message.get("content", ""), str):
            return message  # (a tool's content parts, pictures among them, are left whole)
        ids = self.tok(str(message.get("content", "")), add_special_tokens=False)["input_ids"]
        if len(ids) <= self.limits.max_tool_output_tokens:
            return message
        cut = self.tok.decode(ids[: self.limits.max_tool_output_tokens])
        return {**message, "content": cut + TRUNCATED}
