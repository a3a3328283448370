"""One served model: OpenAI requests -> rollout-engine sessions -> OpenAI responses.

Every request of every client goes into the same `rollout.Engine`, whose background driver
batches all live sequences together (continuous batching); this class only renders prompts,
checks limits, starts sessions and turns results into response bodies. It knows nothing of HTTP,
so the same code answers the HTTP server (`serve.app`) and in-process callers
(`serve.inprocess.EngineChatClient`, e.g. the project's own model as an LLM judge).

Requests go through two steps, so a bad request is refused before a stream starts:
`prepare_*` (render, check lengths and limits; raises APIError) then `run` (blocking) or
`stream` (a generator of chunk bodies). Both are blocking: callers run them in worker threads.
Sessions of a request that fails, times out or whose client goes away are released.
"""
from __future__ import annotations

import dataclasses
import itertools
import time
import uuid
from typing import Any, Callable, Iterator, Optional, Sequence

from reagent_jax import chat
from reagent_jax.rollout import SamplingParams
from reagent_jax.serve import protocol, responses
from reagent_jax.serve.errors import APIError, bad_request
from reagent_jax.serve.protocol import ChatRequest, CompletionRequest, ServerLimits

EXTRA_EOS_TOKENS = ("<|endoftext|>",)  # base models end documents here
CHECK_S = 0.25  # how often a blocking request checks whether its client is still there


@dataclasses.dataclass
class Prepared:
    """A validated request: one (prompt ids, sampling) per choice, and how to build the reply."""
    kind: str  # "chat" | "completion"
    prompts: list[list[int]]  # per choice
    sampling: list[SamplingParams]  # per choice
    stops: tuple[str, ...]
    stream: bool
    include_usage: bool
    tools_enabled: bool = False
    logprobs: bool = False
    top_logprobs: int = 0  # alternatives per token, from `engine.top_logprobs` once a choice is done
    echo_texts: Optional[list[str]] = None  # completions with echo=True: prompt text per choice
    prompt_tokens: int = 0
    client_gone: Optional[Callable[[], bool]] = None  # set by the HTTP app: has the client disconnected?


class ModelService:
    """Serves one engine under `name` (and `aliases`). The engine's background driver is started
    here; `reasoning_parser` splits <think> blocks into `reasoning_content`."""

    def __init__(self, engine, tokenizer, name: str, *, aliases: Sequence[str] = (), limits: ServerLimits = ServerLimits(),
                 reasoning_parser: bool = True, stream_interval_s: float = 0.02):
        if not name:
            raise ValueError("ModelService: the served model needs a name")
        self.engine, self.tok, self.name = engine, tokenizer, name
        self.names = (name, *[a for a in aliases if a and a != name])
        self.limits, self.reasoning_parser, self.stream_interval_s = limits, reasoning_parser, stream_interval_s
        self.max_len = int(engine.max_len)
        self.max_prompt_tokens = min(limits.max_prompt_tokens or self.max_len - 1, self.max_len - 1)
        vocab = tokenizer.get_vocab()
        extra = [vocab[t] for t in EXTRA_EOS_TOKENS if t in vocab]
        self.eos_ids = tuple(dict.fromkeys([*chat.stop_token_ids(tokenizer), *extra]))
        self.created = int(time.time())
        self._counter = itertools.count()
        engine.start_background()

    # ---- model cards --------------------------------------------------------------------------
    def model_cards(self) -> list[dict[str, Any]]:
        return [{"id": n, "object": "model", "created": self.created, "owned_by": "reagent-jax",
                 "max_model_len": self.max_len} for n in self.names]

    # ---- preparing ----------------------------------------------------------------------------
    def prepare_chat(self, req: ChatRequest) -> Prepared:
        tools = req.tools if req.tool_choice != "none" else None
        try:
            ids = chat.render(self.tok, req.messages, tools=tools, add_generation_prompt=True,
                              enable_thinking=req.enable_thinking, mode="original").ids
        except (ValueError, TypeError) as e:
            raise bad_request(f"cannot render the messages with the chat template: {e}", "messages") from None
        s = req.sampling
        sp = self._sampling(s, len(ids), "messages")
        return Prepared("chat", [ids] * s.n, [self._seeded(sp, s.seed, i) for i in range(s.n)], s.stop, s.stream,
                        s.include_usage, tools_enabled=bool(tools), logprobs=req.logprobs, top_logprobs=req.top_logprobs,
                        prompt_tokens=len(ids))

    def prepare_completion(self, req: CompletionRequest) -> Prepared:
        s = req.sampling
        prompts, sps, echoes, total = [], [], [], 0
        for p in req.prompts:
            ids = list(p) if isinstance(p, list) else self.tok.encode(p, add_special_tokens=False)
            if not ids:
                raise bad_request("a prompt encodes to no tokens", "prompt")
            sp = self._sampling(s, len(ids), "prompt")
            total += len(ids)
            for i in range(s.n):
                prompts.append(ids)
                sps.append(self._seeded(sp, s.seed, len(sps)))
                if req.echo:
                    echoes.append(self.tok.decode(ids) if isinstance(p, list) else p)
        return Prepared("completion", prompts, sps, s.stop, s.stream, s.include_usage,
                        echo_texts=echoes if req.echo else None, prompt_tokens=total)

    def _sampling(self, s: protocol.Sampling, prompt_len: int, param: str) -> SamplingParams:
        if prompt_len > self.max_prompt_tokens:
            raise bad_request(f"the prompt has {prompt_len} tokens, more than this server allows "
                              f"({self.max_prompt_tokens}; the model's context is {self.max_len} tokens)",
                              param, code="context_length_exceeded")
        room = self.max_len - prompt_len
        if s.max_tokens is None:
            max_new = min(self.limits.max_tokens, room)
        elif s.max_tokens > room:
            raise bad_request(f"this model's context is {self.max_len} tokens, but {prompt_len + s.max_tokens} were "
                              f"requested ({prompt_len} in the prompt, {s.max_tokens} to generate); lower max_tokens",
                              "max_tokens", code="context_length_exceeded")
        else:
            max_new = s.max_tokens
        try:
            return SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_new_tokens=max_new,
                                  stop_token_ids=() if s.ignore_eos else self.eos_ids, stop_strings=s.stop)
        except ValueError as e:
            raise bad_request(str(e)) from None

    @staticmethod
    def _seeded(sp: SamplingParams, seed: Optional[int], i: int) -> SamplingParams:
        return sp if seed is None else sp.replace(seed=(seed + i) % protocol.SEED_MOD)

    # ---- running ------------------------------------------------------------------------------
    def run(self, prep: Prepared) -> dict[str, Any]:
        """Blocking: the whole response body. When `prep.client_gone` (checked every CHECK_S while
        waiting) says True, the sessions are released and APIError 499 raised (nobody reads it)."""
        sids = self._start(prep)
        results = self._wait_all(sids, prep.client_gone)
        completion_tokens = sum(len(r.tokens) for r in results)
        if prep.kind == "chat":
            choices = [self._chat_choice(i, r, prep) for i, r in enumerate(results)]
        else:
            choices = [self._completion_choice(i, r, prep) for i, r in enumerate(results)]
        return {**self._envelope(prep, False), "choices": choices,
                "usage": responses.usage(prep.prompt_tokens, completion_tokens)}

    def stream(self, prep: Prepared) -> Iterator[dict[str, Any]]:
        """Chunk bodies as tokens arrive; a choice's last chunk has its finish_reason (and, with
        logprobs=true, all its logprobs: the engine reports them per turn); then usage if asked."""
        env = self._envelope(prep, True)
        sids = self._start(prep)
        streams = [responses.ChoiceStream(stops=prep.stops, tools_enabled=prep.tools_enabled,
                                          reasoning_parser=self.reasoning_parser, raw=prep.kind == "completion")
                   for _ in sids]
        completion_tokens = 0
        if prep.kind == "chat":
            yield {**env, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                       "finish_reason": None} for i in range(len(sids))]}
        elif prep.echo_texts is not None:
            yield {**env, "choices": [self._chunk_choice(prep, i, {"content": t}, None)
                                      for i, t in enumerate(prep.echo_texts)]}
        for i, tokens, result in self._poll(sids, prep):
            if result is not None:
                self._check(result)
            delta = streams[i].update(self._decode(tokens), final=result is not None)
            if result is None:
                if delta:
                    yield {**env, "choices": [self._chunk_choice(prep, i, delta, None)]}
                continue
            completion_tokens += len(result.tokens)
            calls = streams[i].parsed.tool_calls if streams[i].parsed is not None else ()
            if calls:
                delta["tool_calls"] = responses.openai_tool_calls(calls, stream=True)
            reason = responses.finish_reason(result.finish_reason, bool(calls))
            choice = self._chunk_choice(prep, i, delta, reason)
            if prep.logprobs:  # the whole choice's, in its final chunk: the chunks' lists add up to the reply's
                choice["logprobs"] = self._logprobs(result, prep, i)
            yield {**env, "choices": [choice]}
        if prep.include_usage:
            yield {**env, "choices": [], "usage": responses.usage(prep.prompt_tokens, completion_tokens)}

    # ---- engine -------------------------------------------------------------------------------
    def _start(self, prep: Prepared) -> list[int]:
        sids: list[int] = []
        try:
            for ids, sp in zip(prep.prompts, prep.sampling):
                sids.append(self.engine.start(ids, sp, where="request"))
        except ValueError as e:  # the engine's own checks (should match ours; never a 500)
            for sid in sids:
                self._abandon(sid)
            raise bad_request(str(e)) from None
        return sids

    def _deadline(self) -> Optional[float]:
        t = self.limits.request_timeout_s
        return None if t is None else time.monotonic() + t

    def _timeout(self, sids: Sequence[int]) -> APIError:
        for sid in sids:
            self._abandon(sid)
        return APIError(504, f"the request did not finish within {self.limits.request_timeout_s:g} s", code="timeout")

    def _wait_all(self, sids: list[int], client_gone: Optional[Callable[[], bool]] = None) -> list:
        deadline, results = self._deadline(), []
        try:
            for sid in sids:
                results.append(self._wait(sid, deadline, client_gone))
        except TimeoutError:
            raise self._timeout(sids[len(results):]) from None
        except BaseException:
            for sid in sids[len(results):]:
                self._abandon(sid)
            raise
        return results

    def _wait(self, sid: int, deadline: Optional[float], client_gone: Optional[Callable[[], bool]]):
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if client_gone is None:
                return self.engine.wait(sid, timeout=left)
            try:
                return self.engine.wait(sid, timeout=CHECK_S if left is None else min(left, CHECK_S))
            except TimeoutError:
                if left is not None and left <= CHECK_S:
                    raise
                if client_gone():
                    raise APIError(499, "the client closed the connection before the reply was ready",
                                   code="client_closed_request") from None

    def _poll(self, sids: list[int], prep: Prepared) -> Iterator[tuple[int, list[int], Any]]:
        """(choice, tokens so far, Result or None) as tokens come; releases what is left on exit
        (finished, failed, or the consumer closed the generator because the client left)."""
        pending, deadline = dict(enumerate(sids)), self._deadline()
        sent = [0] * len(sids)
        try:
            while pending:
                for i, sid in list(pending.items()):
                    try:
                        result = self.engine.wait(sid, timeout=0)
                    except TimeoutError:
                        try:
                            tokens = self.engine.tokens(sid)[len(prep.prompts[i]):]
                        except ValueError:  # finished between the two calls: next round gets it
                            continue
                        if len(tokens) > sent[i]:
                            sent[i] = len(tokens)
                            yield i, tokens, None
                        continue
                    del pending[i]
                    yield i, result.tokens, result
                if pending:
                    if deadline is not None and time.monotonic() > deadline:
                        raise self._timeout(list(pending.values()))
                    time.sleep(self.stream_interval_s)
        finally:
            for sid in pending.values():
                self._abandon(sid)

    def _abandon(self, sid: int) -> None:
        """Frees a session nobody will read, and claims its result so the engine forgets it."""
        try:
            self.engine.release(sid)
        except ValueError:
            pass
        try:
            self.engine.wait(sid, timeout=30.0)
        except (ValueError, TimeoutError):
            pass

    # ---- building replies ---------------------------------------------------------------------
    def _decode(self, tokens: Sequence[int]) -> str:
        return self.tok.decode(list(tokens), skip_special_tokens=True)

    def _envelope(self, prep: Prepared, stream: bool) -> dict[str, Any]:
        n = next(self._counter)
        if prep.kind == "chat":
            return {"id": f"chatcmpl-{uuid.uuid4().hex[:20]}{n}", "object": "chat.completion.chunk" if stream
                    else "chat.completion", "created": int(time.time()), "model": self.name}
        return {"id": f"cmpl-{uuid.uuid4().hex[:20]}{n}", "object": "text_completion", "created": int(time.time()),
                "model": self.name}

    def _check(self, result) -> None:
        if result.finish_reason == "error":
            raise APIError(500, f"generation failed: {result.error}")

    def _chat_choice(self, i: int, result, prep: Prepared) -> dict[str, Any]:
        self._check(result)
        text = responses.cut_at_stop(self._decode(result.tokens), prep.stops)
        parsed = responses.parse_output(text, tools_enabled=prep.tools_enabled, reasoning_parser=self.reasoning_parser)
        choice = {"index": i, "message": responses.chat_message(parsed), "logprobs": None,
                  "finish_reason": responses.finish_reason(result.finish_reason, bool(parsed.tool_calls))}
        if prep.logprobs:
            choice["logprobs"] = self._logprobs(result, prep, i)
        return choice

    def _logprobs(self, result, prep: Prepared, i: int) -> dict[str, Any]:
        """The sampled tokens' logprobs as the engine reported them; with top_logprobs, the
        alternatives at each position from one scoring pass over prompt + reply (the engine's
        distribution; the sampled token's own value there agrees with its logprob to float
        rounding)."""
        keep = [j for j, t in enumerate(result.tokens) if t not in self.eos_ids]
        texts = [self.tok.decode([result.tokens[j]]) for j in keep]
        top = None
        if prep.top_logprobs and keep:
            prompt = prep.prompts[i]
            lp, ids = self.engine.top_logprobs(list(prompt) + list(result.tokens), len(prompt), prep.top_logprobs,
                                               prep.sampling[i].temperature)
            top = [[(self.tok.decode([int(t)]), float(v)) for t, v in zip(ids[j], lp[j])] for j in keep]
        return responses.chat_logprobs(texts, [result.logprobs[j] for j in keep], top)

    def _completion_choice(self, i: int, result, prep: Prepared) -> dict[str, Any]:
        self._check(result)
        text = responses.cut_at_stop(self._decode(result.tokens), prep.stops)
        if prep.echo_texts is not None:
            text = prep.echo_texts[i] + text
        return {"index": i, "text": text, "logprobs": None,
                "finish_reason": responses.finish_reason(result.finish_reason)}

    def _chunk_choice(self, prep: Prepared, i: int, delta: dict, reason: Optional[str]) -> dict[str, Any]:
        if prep.kind == "chat":
            return {"index": i, "delta": delta, "logprobs": None, "finish_reason": reason}
        return {"index": i, "text": delta.get("content", ""), "logprobs": None, "finish_reason": reason}

    # ---- one-call helpers (in-process use) ----------------------------------------------------
    def chat_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """A full /v1/chat/completions exchange without HTTP (streaming is refused)."""
        req = protocol.parse_chat(body, self.limits)
        if req.model is not None and req.model not in self.names:
            raise APIError(404, f"the model {req.model!r} does not exist; this service serves {list(self.names)}",
                           param="model", code="model_not_found")
        if req.sampling.stream:
            raise bad_request("stream=true needs the HTTP server", "stream")
        return self.run(self.prepare_chat(req))
