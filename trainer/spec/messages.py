"""The one rule for a conversation's messages, wherever a chat enters: `data regenerate`'s prompts, chat
training data (checked by the gate and again by the worker that renders it) and `eval`'s prompts. One rule,
so a file one command accepts is never refused by the next, or the other way round."""

from __future__ import annotations

from typing import Any

ROLES = frozenset({"system", "user", "assistant", "tool"})


def messages_problem(value: Any) -> str | None:
    """What is wrong with a list of chat messages (None: nothing).

    Each message is an object with a role from ROLES and a string content (an assistant turn that carries
    `tool_calls` may have null content), in an order a chat template accepts: a system turn only first, a
    user turn before any answer, an assistant turn after a user or tool turn, a tool turn after an assistant
    or tool turn, never two user turns in a row."""
    if not isinstance(value, list) or not value:
        return 'messages must be a non-empty list of {"role", "content"} objects'
    before: str | None = None
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            return f"{where} must be an object with role and content"
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            return f"{where}.role must be one of {', '.join(sorted(ROLES))}, got {role!r}"
        tool_call = role == "assistant" and content is None and message.get("tool_calls")
        if not isinstance(content, str) and not tool_call:
            return f"{where}.content must be a string"
        if role == "system" and before is not None:
            return f"{where}: a system turn can only come first"
        if role == "assistant" and before not in ("user", "tool"):
            return f"{where}: an assistant turn must follow a user or tool turn"
        if role == "tool" and before not in ("assistant", "tool"):
            return f"{where}: a tool turn must follow an assistant turn"
        if role == "user" and before == "user":
            return f"{where}: two user turns in a row (roles out of order)"
        before = role
    if not any(m["role"] == "user" for m in value):
        return "messages holds no user turn"
    return None
