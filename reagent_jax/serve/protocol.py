"""Parsing and validation of OpenAI request bodies into plain dataclasses.

Why by hand rather than pydantic models: every bad field must give a 400 whose message names the
field and says what is allowed (pydantic would answer 422 in its own format), and fields a client
may send but we cannot honour (penalties, logit_bias, JSON mode, image parts) must be refused
loudly instead of silently ignored. Unknown fields are ignored, as OpenAI-compatible servers do.

Extensions (vLLM's names): `top_k`, `ignore_eos` (draw exactly max_tokens), and
`chat_template_kwargs: {"enable_thinking": false}` (Qwen3's non-thinking mode).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional, Sequence

from reagent_jax.chat.render import check_unicode
from reagent_jax.serve.errors import bad_request

SEED_MOD = 2 ** 32
MAX_TOP_LOGPROBS = 20  # OpenAI's limit
_ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """Per-request limits. max_prompt_tokens None: the engine's max_len - 1. max_tokens: most
    tokens one choice may draw; a request without max_tokens gets min(max_tokens, room left)."""
    max_prompt_tokens: Optional[int] = None
    max_tokens: int = 4096
    max_n: int = 16
    max_concurrent: int = 256        # requests in flight; more are answered 429
    max_body_bytes: int = 16 * 2 ** 20
    max_stop: int = 4
    request_timeout_s: Optional[float] = None  # None: no limit; else 504 after this long

    def __post_init__(self):
        for name in ("max_tokens", "max_n", "max_concurrent", "max_body_bytes", "max_stop"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"ServerLimits.{name}={getattr(self, name)!r} must be an int >= 1")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(f"ServerLimits.max_prompt_tokens={self.max_prompt_tokens!r} must be >= 1 or None")


@dataclasses.dataclass(frozen=True)
class Sampling:
    """What both endpoints share."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: Optional[int] = None
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: Optional[int] = None
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    model: Optional[str]
    messages: list[dict[str, Any]]
    tools: Optional[list[dict[str, Any]]]
    tool_choice: str  # "auto" | "none"
    sampling: Sampling
    logprobs: bool = False
    top_logprobs: int = 0  # alternatives per token (needs logprobs); from a scoring pass after generation
    enable_thinking: bool = True


@dataclasses.dataclass(frozen=True)
class CompletionRequest:
    model: Optional[str]
    prompts: list[Any]  # each a str or a list of token ids
    sampling: Sampling
    echo: bool = False


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _number(body: dict, name: str, default, lo: float, hi: float, lo_open: bool = False):
    v = body.get(name)
    if v is None:
        return default
    if not _is_num(v) or not (lo < v if lo_open else lo <= v) or v > hi:
        rng = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise bad_request(f"'{name}' must be a number in {rng}, got {v!r}", name)
    return float(v)


def _int(body: dict, name: str, default, lo: int, hi: Optional[int] = None, *, why: str = ""):
    v = body.get(name)
    if v is None:
        return default
    if not _is_int(v) or v < lo or (hi is not None and v > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise bad_request(f"'{name}' must be an integer {bound}{why}, got {v!r}", name)
    return v


def _bool(body: dict, name: str, default: bool = False) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad_request(f"'{name}' must be true or false, got {v!r}", name)
    return v


def _refuse(body: dict, name: str, neutral: Sequence[Any], what: str) -> None:
    """400 for a field set to something this server does not implement."""
    v = body.get(name)
    if v is not None and v not in neutral:
        raise bad_request(f"'{name}' is not supported by this server ({what}); remove it", name)


def _sampling(body: dict, limits: ServerLimits, default_max_tokens: Optional[int] = None) -> Sampling:
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        raise bad_request(f"'{name}' must be an integer >= 1, got {max_tokens!r}", name)
    if max_tokens is not None and max_tokens > limits.max_tokens:
        raise bad_request(f"'{name}'={max_tokens} exceeds this server's limit of {limits.max_tokens} tokens", name)
    stop = body.get("stop")
    if stop is None:
        stop = ()
    elif isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stop = tuple(stop)
    else:
        raise bad_request(f"'stop' must be a string or a list of strings, got {stop!r:.100}", "stop")
    if len(stop) > limits.max_stop or any(not s for s in stop):
        raise bad_request(f"'stop' takes at most {limits.max_stop} non-empty strings, got {list(stop)!r:.200}", "stop")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise bad_request(f"'seed' must be an integer, got {seed!r}", "seed")
    opts = body.get("stream_options")
    if opts is not None and (not isinstance(opts, dict) or not isinstance(opts.get("include_usage", False), bool)):
        raise bad_request("'stream_options' must be an object like {\"include_usage\": true}", "stream_options")
    for name in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
        _refuse(body, name, (0, 0.0, 1.0) if name == "repetition_penalty" else (0, 0.0), "no penalties")
    _refuse(body, "logit_bias", ({},), "no logit bias")
    _refuse(body, "best_of", (1,), "best_of is 1")
    return Sampling(
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        top_k=max(0, _int(body, "top_k", 0, -1)),  # -1 (vLLM) and 0 both mean no top-k
        max_tokens=max_tokens if max_tokens is not None else default_max_tokens,
        n=_int(body, "n", 1, 1, limits.max_n),
        stop=stop, seed=None if seed is None else seed % SEED_MOD,
        stream=_bool(body, "stream"),
        include_usage=bool((opts or {}).get("include_usage", False)),
        ignore_eos=_bool(body, "ignore_eos"))


def _model(body: dict) -> Optional[str]:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request(f"'model' must be a string, got {model!r:.100}", "model")
    return model


def _text_content(content: Any, where: str) -> Optional[str]:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad_request(f"{where}.content[{j}]: only text parts are supported, got {kind!r}", "messages")
            parts.append(part["text"])
        return "".join(parts)
    raise bad_request(f"{where}.content must be a string, a list of text parts or null, "
                      f"got {type(content).__name__}", "messages")


def _tool_calls(calls: Any, where: str) -> list[dict]:
    if not isinstance(calls, list):
        raise bad_request(f"{where}.tool_calls must be a list", "messages")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(f"{where}.tool_calls[{j}] must be {{\"type\": \"function\", \"function\": "
                              "{\"name\": str, \"arguments\": str}}", "messages")
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as e:
                raise bad_request(f"{where}.tool_calls[{j}].function.arguments is not valid JSON: {e}",
                                  "messages") from None
        if not isinstance(args, dict):
            raise bad_request(f"{where}.tool_calls[{j}].function.arguments must be a JSON object", "messages")
        out.append({"type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def parse_messages(messages: Any) -> list[dict[str, Any]]:
    """OpenAI messages -> the dicts `chat.render` takes (developer -> system, text parts joined,
    tool-call arguments decoded)."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of message objects", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{where} must be an object, got {type(m).__name__}", "messages")
        role = m.get("role")
        if role not in _ROLES:
            raise bad_request(f"{where}.role must be one of {', '.join(_ROLES)}, got {role!r:.50}", "messages")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role,
                               "content": _text_content(m.get("content"), where)}
        if role != "assistant" and msg["content"] is None:
            raise bad_request(f"{where} ({role}) needs a content string", "messages")
        if role == "assistant":
            if m.get("tool_calls"):
                msg["tool_calls"] = _tool_calls(m["tool_calls"], where)
            rc = m.get("reasoning_content")
            if rc is not None:
                if not isinstance(rc, str):
                    raise bad_request(f"{where}.reasoning_content must be a string", "messages")
                msg["reasoning_content"] = rc
        out.append(msg)
    return out


def parse_tools(tools: Any) -> Optional[list[dict[str, Any]]]:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad_request("'tools' must be a list of {\"type\": \"function\", \"function\": {...}}", "tools")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": str, ...}}}}",
                              "tools")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise bad_request(f"tools[{i}].function.parameters must be a JSON-schema object", "tools")
    return tools or None


def parse_chat(body: Any, limits: ServerLimits) -> ChatRequest:
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    tools = parse_tools(body.get("tools"))
    choice = body.get("tool_choice")
    if choice is None:
        choice = "auto"
    if choice not in ("auto", "none"):
        raise bad_request("'tool_choice' must be \"auto\" or \"none\" (forcing a tool is not supported)",
                          "tool_choice")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise bad_request("'response_format' other than {\"type\": \"text\"} is not supported", "response_format")
    top = body.get("top_logprobs")
    top = 0 if top is None else top
    if not _is_int(top) or not 0 <= top <= MAX_TOP_LOGPROBS:
        raise bad_request(f"'top_logprobs' must be an integer in [0, {MAX_TOP_LOGPROBS}]", "top_logprobs")
    logprobs = _bool(body, "logprobs")
    if top and not logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict) or not isinstance(kwargs.get("enable_thinking", True), bool):
        raise bad_request("'chat_template_kwargs' must be an object like {\"enable_thinking\": false}",
                          "chat_template_kwargs")
    return ChatRequest(model=_model(body), messages=parse_messages(body.get("messages")), tools=tools,
                       tool_choice=choice, sampling=_sampling(body, limits), logprobs=logprobs, top_logprobs=top,
                       enable_thinking=kwargs.get("enable_thinking", True))


def parse_completion(body: Any, limits: ServerLimits, vocab_size: int) -> CompletionRequest:
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt)):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(
            isinstance(p, str) or (isinstance(p, list) and p and all(_is_int(t) for t in p)) for p in prompt):
        prompts = list(prompt)
    else:
        raise bad_request("'prompt' must be a string, a list of strings, a list of token ids or a list of "
                          "token-id lists (non-empty)", "prompt")
    for i, p in enumerate(prompts):
        if isinstance(p, list) and any(t < 0 or t >= vocab_size for t in p):
            raise bad_request(f"prompt {i} has token ids outside the vocabulary [0, {vocab_size})", "prompt")
        if isinstance(p, str):  # "\ud800" is valid JSON but no tokenizer takes it (it would be a 500)
            try:
                check_unicode(p, f"prompt {i}")
            except ValueError as e:
                raise bad_request(str(e), "prompt") from None
    _refuse(body, "suffix", ("",), "no insertion")
    _refuse(body, "logprobs", (), "use /v1/chat/completions with logprobs=true")
    sampling = _sampling(body, limits, default_max_tokens=16)  # OpenAI's default for completions
    if len(prompts) * sampling.n > limits.max_n:
        raise bad_request(f"{len(prompts)} prompts x n={sampling.n} exceeds this server's limit of "
                          f"{limits.max_n} choices per request", "n")
    return CompletionRequest(model=_model(body), prompts=prompts, sampling=sampling, echo=_bool(body, "echo"))
