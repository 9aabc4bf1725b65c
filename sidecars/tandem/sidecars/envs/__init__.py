"""Multi-turn environments: what a completion's turns are made of when the model may call tools.

`environments` (the `Environment` contract: reset to a prompt's first messages, step on each reply; `SingleTurn`,
today's one-reply task, and `ToolEnvironment`, which runs the tool calls of each reply and answers with their
results), `multi_turn` (`MultiTurnDriver`: trajectories of model and environment turns on the live vLLM), `factory`
and `loader` (the job's environment from its spec), `agent` and `recorder` (agent functions and what they
generate), `python_tool` (the `python` tool, in the code sandbox), `toolcalls` (tool calls parsed from a reply in
the chat-template family's format: Hermes / Qwen `<tool_call>` JSON, Llama 3 JSON) and `tools` (Python functions as
tools, their JSON schemas from signatures and docstrings, run in a bounded pool, or awaited on one event loop when
async, with a per-call timeout; the built-in calculator), `tool_types` (a call's arguments checked against the
function's types, its result written as JSON), `chat` (a conversation's token ids built turn by turn from the chat
template, never re-tokenizing what the model wrote) and `trajectory` (the model's and the environment's segments:
loss mask, log-probs, versions).
"""
