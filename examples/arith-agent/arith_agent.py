"""An agent for `rollout.environment: {type: agent}`: ordinary code that speaks the OpenAI chat API.

Tandem calls `run(base_url=..., api_key=..., row=..., **kwargs)` once per trajectory, on a worker thread of
the rollout sidecar. The agent knows nothing of Tandem: it talks to `base_url` with the `openai` client, runs
its own calculator when the model asks for it, and when the model answers without a call it returns its
reward, 1.0 when the answer's last number is the row's answer. Every call it makes is served by the live
vLLM and recorded, token for token, for training (see examples/smollm2-agent.yaml).
"""

from __future__ import annotations

import ast
import json
import operator
import re
from typing import Any

from openai import OpenAI

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluates an arithmetic expression exactly.",
    "parameters": {"type": "object", "required": ["expression"], "properties": {
        "expression": {"type": "string", "description": "The expression, e.g. 218 * 47"}}}}}
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
       ast.Div: operator.truediv, ast.Mod: operator.mod, ast.USub: operator.neg}


def calculate(arguments: str) -> str:
    """The calculator's answer to a call's JSON arguments, or what was wrong with them."""
    try:
        tree = ast.parse(str(json.loads(arguments)["expression"]), mode="eval")
        return str(_value(tree.body))
    except Exception as e:  # noqa: BLE001 - the model's call may be anything: tell it
        return f"error: {type(e).__name__}: {e}"


def _value(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](_value(node.left), _value(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
        return OPS[type(node.op)](_value(node.operand))
    raise ValueError("only numbers and + - * / // % are allowed")


def correct(text: str | None, answer: Any) -> float:
    numbers = re.findall(r"-?\d[\d,]*(?:\.\d+)?", text or "")
    return float(bool(numbers) and numbers[-1].replace(",", "") == str(answer))


def run(base_url: str, api_key: str, row: dict[str, Any], max_calls: int = 3) -> float:
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages: list[Any] = list(row["messages"])
    for _ in range(max_calls):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR]).choices[0]
        messages.append(reply.message.model_dump(exclude_none=True))
        if not reply.message.tool_calls:
            return correct(reply.message.content, row["answer"])
        for call in reply.message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(call.function.arguments)})
    return 0.0  # no answer within max_calls
