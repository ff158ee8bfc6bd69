"""The chat template for code models (StarCoder-family base checkpoints ship none).

Rendering, message by message:
- ``system`` / ``developer``: ``{content}\\n\\n``
- ``user``:                   ``### Instruction:\\n{content}\\n\\n``
- ``assistant``:              ``### Response:\\n{content}\\n\\n``
then, with ``add_generation_prompt`` (the default), ``### Response:\\n``.
Content given as a list of parts is the concatenation of its text parts.
Generation also stops at ``DEFAULT_STOPS`` (the start of a next turn), besides EOS and the request's own stops.
"""

from __future__ import annotations

from gateway.schemas import ChatMessage

DEFAULT_STOPS: tuple[str, ...] = ("\n### Instruction:", "\n### Response:")

_PREFIX = {
    "system": "",
    "developer": "",
    "user": "### Instruction:\n",
    "assistant": "### Response:\n",
}
GENERATION_PROMPT = "### Response:\n"


def message_text(message: ChatMessage) -> str:
    """The text of one message ("" for null content)."""
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    return "".join(part.text for part in message.content)


def render(messages: list[ChatMessage], add_generation_prompt: bool = True) -> str:
    """The prompt text for ``messages`` (see the module docstring)."""
    parts = [f"{_PREFIX[m.role]}{message_text(m)}\n\n" for m in messages]
    if add_generation_prompt:
        parts.append(GENERATION_PROMPT)
    return "".join(parts)
