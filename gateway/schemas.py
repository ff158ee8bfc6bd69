"""Pydantic request schemas of the HTTP API. Responses are built as plain dicts in the API modules
(their shapes are documented in docs/api.md). Unknown fields are ignored on the OpenAI endpoints
(clients send fields such as ``user``) and rejected in native ``sampling_params``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

UINT64_MAX = 2**64 - 1
INT32_MAX = 2**31 - 1


class StreamOptions(BaseModel):
    """OpenAI ``stream_options``."""

    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Sampling fields shared by /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = Field(None, ge=0, le=UINT64_MAX)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
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
    max_tokens: int | None = Field(None, ge=0, le=INT32_MAX)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0)
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)

    def unsupported(self) -> tuple[str, str] | None:
        """See SamplingFields.unsupported; also ``suffix`` and ``best_of`` other than n."""
        if self.suffix is not None:
            return "suffix", ("suffix is not supported; put the fill-in-the-middle markers in the prompt "
                              "(<fim_prefix>...<fim_suffix>...<fim_middle>)")
        if self.best_of is not None and self.best_of != self.n:
            return "best_of", "best_of other than n is not supported"
        return super().unsupported()


class ContentPart(BaseModel):
    """One part of a chat message's content; only text parts are supported."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One chat message."""

    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[ContentPart] | None = None


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0, le=INT32_MAX)
    max_completion_tokens: int | None = Field(None, ge=0, le=INT32_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    add_generation_prompt: bool = True
    tools: list[Any] | None = None
    tool_choice: Any = None

    def unsupported(self) -> tuple[str, str] | None:
        """See SamplingFields.unsupported; also tools (no tool calling)."""
        if self.tools:
            return "tools", "tool calling is not supported"
        if self.tool_choice not in (None, "none"):
            return "tool_choice", "tool calling is not supported"
        return super().unsupported()


class NativeSamplingParams(BaseModel):
    """SGLang ``sampling_params``. Unknown keys are rejected (e.g. ``regex`` is not supported)."""

    model_config = ConfigDict(extra="forbid")
    max_new_tokens: int | None = Field(None, ge=0, le=INT32_MAX)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    sampling_seed: int | None = Field(None, ge=0, le=UINT64_MAX)
    n: int = Field(1, ge=1, le=1)


class NativeGenerateRequest(BaseModel):
    """POST /generate (SGLang's native shape). Exactly one of ``text`` and ``input_ids``; a list of
    texts or of id lists makes a batch, and ``sampling_params`` may then be one dict or one per input."""

    model_config = ConfigDict(extra="ignore")
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: NativeSamplingParams | list[NativeSamplingParams] | None = None
    stream: bool = False
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = Field(0, ge=0)
    return_text_in_logprobs: bool = False
    rid: str | list[str] | None = None


class TokenizeRequest(BaseModel):
    """POST /tokenize: ``prompt`` (a string) or ``messages`` (rendered with the chat template)."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True


class DetokenizeRequest(BaseModel):
    """POST /detokenize."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    tokens: list[int]
    skip_special_tokens: bool = False
