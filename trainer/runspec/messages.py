"""The one rule for a conversation's messages, wherever a chat enters: `data regenerate`'s prompts, chat
training data (checked by the gate and again by the worker that renders it) and `eval`'s prompts. One rule,
so a file one command accepts is never refused by the next, or the other way round.

Text is text a tokenizer can read: JSON may spell a lone UTF-16 surrogate (`"\ud800"`), which Python reads
into a string no encoder takes (the tokenizers' TypeError was exit 3 after the target had loaded), so every
string a template renders is checked here, and `text_problem` gives the same rule to prompts and text."""

from __future__ import annotations

from typing import Any

ROLES = frozenset({"system", "user", "assistant", "tool"})


def lone_surrogate(value: Any, where: str) -> str | None:
    """Where in `value` (a string, or lists and objects of them) a lone surrogate sits, and which; None: none."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"{where} holds a lone surrogate ({value[exc.start]!a}) at character {exc.start}"
        return None
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = lone_surrogate(item, f"{where}.{key}" if isinstance(value, dict) else f"{where}[{key}]")
        if found is not None:
            return found
    return None


def text_problem(value: Any, where: str) -> str | None:
    """What is wrong with a piece of text a tokenizer will read (None: nothing)."""
    if not isinstance(value, str) or not value.strip():
        return f"{where} must be a non-empty string"
    found = lone_surrogate(value, where)
    return f"{found}: not text a tokenizer can read" if found else None


def fields_problem(record: dict[str, Any], fields: tuple[str, ...]) -> str | None:
    """A record that gives two of `fields` (each says what to answer: a whole chat, one user turn, token ids)
    is ambiguous: which one a command used was its own silent choice (`data regenerate` took "messages",
    `eval` "prompt"), so it is refused, naming both, instead of guessed."""
    given = [f for f in fields if f in record]
    if len(given) < 2:
        return None
    keep = "messages" if "messages" in given else given[0]
    drop = ", ".join(f".{f}" for f in given if f != keep)
    both = " and ".join(f'"{f}"' for f in given)
    return (
        f"gives both {both}, which ask for different things: keep one (jq -c 'del({drop})' keeps \"{keep}\")"
    )


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
        found = lone_surrogate(message, where)
        if found is not None:
            return f"{found}: not text a tokenizer can read"
        before = role
    if not any(m["role"] == "user" for m in value):
        return "messages holds no user turn"
    return None


def json_problem(exc: ValueError, text: str) -> str:
    """A JSON line's error with where it is: `not JSON (Invalid control character at column 14: a NUL byte)`
    (issue 58, N13: json's message alone ends in "at" and names no column)."""
    message, column = getattr(exc, "msg", str(exc)), getattr(exc, "colno", None)
    position = getattr(exc, "pos", None)
    found = text[position] if isinstance(position, int) and 0 <= position < len(text) else ""
    what = {"\x00": "a NUL byte"}.get(found, f"{found!a}" if found and not found.isprintable() else "")
    where = f" column {column}" if column is not None else ""
    return f"not JSON ({message.removesuffix(' at')} at{where}{': ' + what if what else ''})"
