"""Pydantic request schemas of the HTTP API. Responses are built as plain dicts in the API modules
(their shapes are documented in docs/api.md). Unknown fields are ignored on the OpenAI endpoints
(clients send fields such as ``user``) and rejected in native ``sampling_params``."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator, model_validator
from pydantic_core import PydanticCustomError

UINT64_MAX = 2**64 - 1
INT32_MAX = 2**31 - 1

_SURROGATE = re.compile("[\ud800-\udfff]")


def _find_surrogate(value: Any, path: str) -> tuple[str, str] | None:
    """(field path, the surrogate) of the first string inside ``value`` (a decoded JSON value, keys
    included) holding a lone UTF-16 surrogate, else None. JSON escapes such as "\\ud800" decode to
    such strings; they are not Unicode text and cannot be encoded as UTF-8."""
    if isinstance(value, str):
        if value.isascii():
            return None
        found = _SURROGATE.search(value)
        return (path or "body", found.group()) if found else None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            hit = _find_surrogate(key, where) or _find_surrogate(item, where)
            if hit:
                return hit
    elif isinstance(value, list):
        for i, item in enumerate(value):  # numbers (a prompt's 1,024 token ids) are skipped before any path is built
            if isinstance(item, (str, dict, list)) and (hit := _find_surrogate(item, f"{path}[{i}]")):
                return hit
    return None


class ApiRequest(BaseModel):
    """Base of every request body: rejects a lone UTF-16 surrogate in any string of the body (text
    fields, stop strings, chat contents, keys) with a ``lone_surrogate`` error whose ctx names the field
    (gateway.errors turns it into a 400 with ``param`` set)."""

    @model_validator(mode="before")
    @classmethod
    def _no_lone_surrogates(cls, data: Any) -> Any:
        hit = _find_surrogate(data, "")
        if hit is not None:
            param, char = hit
            raise PydanticCustomError(
                "lone_surrogate",
                "{param} contains a lone UTF-16 surrogate ({escaped}), which is not valid Unicode text",
                {"param": param, "escaped": f"\\u{ord(char):04x}"},
            )
        return data


def _finite(default: float, **constraints: float) -> Any:
    """A float Field that rejects NaN and infinities ("Input should be a finite number") and, as OpenAI does, a number
    sent as a string or a boolean ("Input should be a valid number"); a JSON integer is taken."""
    return Field(default, allow_inf_nan=False, strict=True, **constraints)


class StreamOptions(BaseModel):
    """OpenAI ``stream_options``."""

    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False


class SamplingFields(ApiRequest):
    """Sampling fields shared by /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    temperature: float = _finite(1.0, ge=0.0, le=2.0)
    top_p: float = _finite(1.0, gt=0.0, le=1.0)
    top_k: StrictInt = Field(-1, ge=-1, le=INT32_MAX)  # an int32 on the wire (common.proto)
    min_p: float = _finite(0.0, ge=0.0, le=1.0)
    n: StrictInt = Field(1, ge=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None
    seed: StrictInt | None = Field(None, ge=0, le=UINT64_MAX)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False
    presence_penalty: float = _finite(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = _finite(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = _finite(1.0, gt=0.0)
    skip_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None

    def unsupported(self) -> tuple[str, str] | None:
        """(field, reason) of the first field set to something this server does not do, else None.
        Asking for a feature we would silently ignore gets a 400 instead."""
        if self.logit_bias:
            return "logit_bias", "logit_bias is not supported"
        if self.response_format is not None and self.response_format.get("type", "text") != "text":
            return "response_format", "only response_format {\"type\": \"text\"} is supported"
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options is only allowed with stream: true"
        return None


class CompletionRequest(SamplingFields):
    """POST /v1/completions. ``prompt``: a string, a list of strings, a list of token ids, or a list
    of token-id lists (checked by gateway.prompts)."""

    prompt: Any
    max_tokens: StrictInt | None = Field(None, ge=0, le=INT32_MAX)
    echo: StrictBool = False
    logprobs: StrictInt | None = Field(None, ge=0)
    suffix: str | None = None  # fill-in-the-middle: prompt is the text before the cursor (gateway.fim)
    fim_mode: Literal["psm", "spm"] | None = None  # the FIM layout; None: psm
    best_of: StrictInt | None = Field(None, ge=1)

    def unsupported(self) -> tuple[str, str] | None:
        """See SamplingFields.unsupported; also ``fim_mode`` without ``suffix``, ``echo`` with ``logprobs``
        and ``suffix``, and ``best_of`` other than n."""
        if problem := fim_problem(self.suffix, self.fim_mode):
            return problem
        if self.suffix is not None and self.echo and self.logprobs is not None:
            return "echo", "echo with logprobs is not supported with suffix (echo alone returns the prefix)"
        if self.best_of is not None and self.best_of != self.n:
            return "best_of", "best_of other than n is not supported"
        return super().unsupported()


def fim_problem(suffix: str | None, fim_mode: str | None) -> tuple[str, str] | None:
    """("fim_mode", reason) when a FIM layout is asked without a suffix, else None."""
    if fim_mode is not None and suffix is None:
        return "fim_mode", "fim_mode is only allowed with suffix"
    return None


class ContentPart(BaseModel):
    """One part of a chat message's content; only text parts are supported."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One chat message. ``content`` is required and not null: OpenAI allows null content only for an
    assistant message with tool calls, which this server does not support (a ``content_required`` error
    at ``messages[i].content``). A list of parts needs at least one part, as OpenAI's API requires (a
    ``content_empty`` error); an empty string is accepted."""

    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[ContentPart] | None = Field(None, validate_default=True)

    @field_validator("content", mode="after")
    @classmethod
    def _content_given(cls, value: Any) -> Any:
        if value is None:
            raise PydanticCustomError(
                "content_required", "content is required: a string or a list of text parts (null content is only "
                "for assistant tool calls, which are not supported)")
        if isinstance(value, list) and not value:
            raise PydanticCustomError("content_empty", "content is an empty list: give at least one text part, "
                                      "or a string")
        return value


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(None, ge=0, le=INT32_MAX)
    max_completion_tokens: StrictInt | None = Field(None, ge=0, le=INT32_MAX)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(None, ge=0)
    add_generation_prompt: StrictBool = True
    tools: list[Any] | None = None
    tool_choice: Any = None
    suffix: Any = None  # declared to be refused: fill-in-the-middle is /v1/completions' (gateway.fim)
    fim_mode: Any = None

    def unsupported(self) -> tuple[str, str] | None:
        """See SamplingFields.unsupported; also tools (no tool calling) and suffix / fim_mode (FIM is a
        /v1/completions feature: silently ignoring it would answer a different question)."""
        for name in ("suffix", "fim_mode"):
            if getattr(self, name) is not None:
                return name, f"{name} is not supported on /v1/chat/completions; use /v1/completions with suffix"
        if self.tools:
            return "tools", "tool calling is not supported"
        if self.tool_choice not in (None, "none"):
            return "tool_choice", "tool calling is not supported"
        return super().unsupported()


class NativeSamplingParams(BaseModel):
    """SGLang ``sampling_params``. Unknown keys are rejected (e.g. ``regex`` is not supported)."""

    model_config = ConfigDict(extra="forbid")
    max_new_tokens: StrictInt | None = Field(None, ge=0, le=INT32_MAX)
    temperature: float = _finite(1.0, ge=0.0)
    top_p: float = _finite(1.0, gt=0.0, le=1.0)
    top_k: StrictInt = Field(-1, ge=-1, le=INT32_MAX)  # an int32 on the wire (common.proto)
    min_p: float = _finite(0.0, ge=0.0, le=1.0)
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    no_stop_trim: StrictBool = False
    presence_penalty: float = _finite(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = _finite(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = _finite(1.0, gt=0.0)
    sampling_seed: StrictInt | None = Field(None, ge=0, le=UINT64_MAX)
    n: StrictInt = Field(1, ge=1, le=1)


class NativeGenerateRequest(ApiRequest):
    """POST /generate (SGLang's native shape). Exactly one of ``text`` and ``input_ids``; a list of
    texts or of id lists makes a batch, and ``sampling_params`` may then be one dict or one per input."""

    model_config = ConfigDict(extra="ignore")
    text: str | list[str] | None = None
    input_ids: list[StrictInt] | list[list[StrictInt]] | None = None
    suffix: str | None = None  # fill-in-the-middle: text is the text before the cursor (gateway.fim)
    fim_mode: Literal["psm", "spm"] | None = None  # the FIM layout; None: psm
    sampling_params: NativeSamplingParams | list[NativeSamplingParams] | None = None
    stream: StrictBool = False
    return_logprob: StrictBool = False
    logprob_start_len: StrictInt = -1  # -1: none, else 0..prompt length - 1 (checked by native_api per prompt)
    top_logprobs_num: StrictInt = Field(0, ge=0)
    return_text_in_logprobs: StrictBool = False
    rid: str | list[str] | None = None

    @field_validator("rid")
    @classmethod
    def _rid_not_empty(cls, rid: str | list[str] | None) -> str | list[str] | None:
        """An empty request id is a 400 (was: taken as none, yet echoed back as ``meta_info.id`` "")."""
        if rid == "" or (isinstance(rid, list) and "" in rid):
            raise PydanticCustomError("empty_rid", "a request id must be a non-empty string")
        return rid

    @model_validator(mode="before")
    @classmethod
    def _sampling_keys_belong_in_sampling_params(cls, data: Any) -> Any:
        """A sampling parameter at the top level (``{"text": ..., "max_new_tokens": 3}``) would otherwise be
        ignored like any other unknown key (SGLang clients send fields we do not use): a 400 naming it."""
        if isinstance(data, dict):
            misplaced = sorted(k for k in data if k in NativeSamplingParams.model_fields)
            if misplaced:
                raise PydanticCustomError(
                    "misplaced_field", "{param} is a sampling parameter: put it inside sampling_params",
                    {"param": misplaced[0]})
        return data


class TokenizeRequest(ApiRequest):
    """POST /tokenize: ``prompt`` (a string) or ``messages`` (rendered with the chat template)."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: StrictBool = True


class DetokenizeRequest(ApiRequest):
    """POST /detokenize."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    tokens: list[StrictInt]
    skip_special_tokens: StrictBool = False
