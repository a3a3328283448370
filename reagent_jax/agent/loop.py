"""The host-side agent loop: drives rollout-engine sessions through multi-turn tool use.

Each episode runs in its own host thread: render the prompt -> engine session -> wait for a
turn (it ends on `<|im_end|>`) -> parse tool calls -> run them (several calls of a turn in
parallel) -> append the tool responses as tokens -> resume. While one episode waits on a tool,
the engine keeps decoding the others (it runs in its background thread), so tool latency
overlaps with decoding. History is never re-rendered or re-prefilled: token-in, token-out.

Turn budget: after `max_turns - 1` tool turns, a final-step user message forbids tools and asks
for the answer (`final_step_message`); the last turn is then the answer turn.

Failures stay inside their episode: a bad record, an unparseable or unknown tool call, a tool or
registry that raises, or a context that fills up gives that trajectory an "Error: ..." tool
response or a finish_reason ("error" with `error` saying why, "length") and the others go on.
A turn with a malformed call keeps its text verbatim in `messages` (no structured `tool_calls`),
so the judge sees what the model wrote and `chat.render(messages, mode="train")` gives `tokens`.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import time
from typing import Callable, Optional, Sequence

import jax

from reagent_jax import chat
from reagent_jax.agent import tools
from reagent_jax.agent.trajectory import ToolStats, Trajectory
from reagent_jax.parallel import hosts
from reagent_jax.rollout import SamplingParams

DEFAULT_SYSTEM_PROMPT = ("You are a careful research assistant. Use the tools to look facts up and to "
                         "compute; never guess a value you have not seen. Give the final answer as \\boxed{...}.")
FINAL_STEP_MESSAGE = ("You have reached the limit of tool calls. Do not call any more tools. Based on what "
                      "you have found so far, give your final answer now as \\boxed{...}.")


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    max_turns: int = 13                # assistant turns per episode (paper: 13 train, 30 eval)
    max_tokens_per_turn: int = 512
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 0
    system_prompt: Optional[str] = DEFAULT_SYSTEM_PROMPT
    final_step_message: str = FINAL_STEP_MESSAGE
    include_tool_schemas: bool = True  # render the tools' JSON schemas in the system turn
    max_tool_calls_per_turn: int = 4
    max_parallel_episodes: int = 256   # host threads driving episodes
    seed: int = 0

    def __post_init__(self):
        for name in ("max_turns", "max_tokens_per_turn", "max_tool_calls_per_turn", "max_parallel_episodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"AgentConfig.{name} must be an int >= 1, got {value!r}")


def episode_seed(base: int, record_index: int, sample_index: int) -> int:
    """Sampling seed of sample i of record j in a run seeded `base`: fixed, distinct for nearby
    (j, i), and inside the engine's seed range whatever the base (callers pass step-derived bases
    such as seed * 100_003 + step)."""
    return (base * 1_000_003 + record_index * 1009 + sample_index) % (2 ** 31)


class AgentLoop:
    """Runs episodes for question records ({"question", "answer", "data_source", "id"}).

    engine: a started `rollout.Engine` (background driver on); tokenizer: the chat tokenizer;
    registry: tool registry with `call_many([(name, args)]) -> [ToolOutput]` and `schemas()`
    (None: no tools). `tool_names` restricts which tools the agent may call.
    """

    def __init__(self, engine, tokenizer, registry, config: AgentConfig = AgentConfig(),
                 tool_names: Optional[Sequence[str]] = None):
        self.engine, self.tok, self.registry, self.config = engine, tokenizer, registry, config
        schemas = registry.schemas() if registry is not None else []
        if tool_names is not None:
            schemas = [s for s in schemas if s["function"]["name"] in set(tool_names)]
        self.tool_schemas = schemas
        self.tool_names = [s["function"]["name"] for s in schemas]
        self.stop_ids = chat.stop_token_ids(tokenizer)
        self.end_of_turn = chat.end_of_turn_token(tokenizer)

    # ---- prompts ------------------------------------------------------------------------------
    def prompt_messages(self, record: dict) -> list[dict]:
        question = record.get("question") if isinstance(record, dict) else None
        if not isinstance(question, str) or not question.strip():
            where = f"record {record['id']!r}" if isinstance(record, dict) and "id" in record else "record"
            raise ValueError(f"{where}: 'question' must be a non-empty string, got {question!r:.100} "
                             f"(a record is a dict with 'question', 'answer', 'data_source', 'id')")
        msgs = []
        if self.config.system_prompt:
            msgs.append({"role": "system", "content": self.config.system_prompt})
        msgs.append({"role": "user", "content": question})
        return msgs

    def sampling(self, seed: int, greedy: bool = False) -> SamplingParams:
        c = self.config
        if greedy:
            return SamplingParams(temperature=0.0, max_new_tokens=c.max_tokens_per_turn,
                                  stop_token_ids=self.stop_ids, seed=seed)
        return SamplingParams(temperature=c.temperature, top_p=c.top_p, top_k=c.top_k, seed=seed,
                              max_new_tokens=c.max_tokens_per_turn, stop_token_ids=self.stop_ids)

    # ---- running ------------------------------------------------------------------------------
    def run(self, records: Sequence[dict], n: int = 1, greedy: bool = False, seed: Optional[int] = None,
            progress: Optional[Callable[[Trajectory], None]] = None, keep_sessions: bool = False) -> list[Trajectory]:
        """n episodes per record (ordered record-major); sample i of record j gets a fixed seed.

        A record is read (`records[j]`) in its episode's thread, only by the process that runs it:
        given a lazy sequence (`data.RowsAt`), each host reads just its own questions.
        keep_sessions: leave each finished episode's engine session (and KV cache) alive so that
        `continue_many` can append to it without re-prefilling; call `release` afterwards.
        """
        base = self.config.seed if seed is None else seed
        jobs = [(j, i, episode_seed(base, j, i)) for j in range(len(records)) for i in range(n)]
        return self._map(lambda job: self.run_episode(records[job[0]], sample_index=job[1], seed=job[2], greedy=greedy,
                                                      keep_session=keep_sessions), jobs, progress)

    def keeps_sessions(self, episodes: int) -> bool:
        """Whether this process's share of `episodes` fits in its engine's slots at once, so
        their sessions (and KV caches) can stay alive for `continue_many`."""
        return len(hosts.share(episodes)) <= getattr(self.engine, "num_slots", 0)

    def continue_many(self, items: Sequence[tuple[Trajectory, list[dict]]], greedy: bool = False,
                      progress=None) -> list[Trajectory]:
        """Continues finished episodes with extra messages (e.g. a critique turn) as second attempts."""
        items = list(items)
        mine = hosts.share(len(items))
        for i, (prev, _) in enumerate(items):  # several processes: a kept session lives on one engine
            if i not in mine and prev.extras.get("session_id") is not None and self._owns(prev):
                self.release([prev])  # another process continues it (by prefilling the prefix)
        return self._map(lambda it: self.continue_episode(it[0], it[1], greedy=greedy), items, progress)

    def release(self, trajs: Sequence[Trajectory]) -> None:
        """Frees sessions kept by `run(..., keep_sessions=True)`."""
        for t in trajs:
            sid = t.extras.pop("session_id", None)
            if sid is not None:
                self.engine.release(sid)

    def _map(self, fn, jobs, progress):
        """fn over jobs in host threads; the result list is in job order. On several processes
        each runs its `hosts.share` of the jobs on its own engine and all end with every result."""
        mine = hosts.share(len(jobs))
        workers = max(1, min(self.config.max_parallel_episodes, len(mine)))
        out = [None] * len(mine)
        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="episode") as pool:
            futs = {pool.submit(fn, jobs[j]): i for i, j in enumerate(mine)}
            for f in concurrent.futures.as_completed(futs):
                out[futs[f]] = f.result()
                if progress is not None:
                    progress(out[futs[f]])
        if jax.process_count() == 1:
            return out
        for t in out:
            t.extras["process"] = jax.process_index()
        shares = hosts.allgather_objects(out)
        shares[jax.process_index()] = out  # this process's own objects (they hold its sessions)
        merged = [t for share in shares for t in share]
        for t in merged:
            if not self._owns(t):
                t.extras.pop("session_id", None)  # another engine's session
        return merged

    @staticmethod
    def _owns(traj: Trajectory) -> bool:
        return traj.extras.get("process", jax.process_index()) == jax.process_index()

    def run_episode(self, record: dict, sample_index: int = 0, seed: int = 0, greedy: bool = False,
                    keep_session: bool = False) -> Trajectory:
        try:
            messages = self.prompt_messages(record)
            schemas = self.tool_schemas if (self.config.include_tool_schemas and self.tool_schemas) else None
            prompt = chat.render(self.tok, messages, tools=schemas, add_generation_prompt=True, mode="train")
        except Exception as e:  # a broken record fails alone, not the whole batch
            return Trajectory.failed(record if isinstance(record, dict) else {"question": record},
                                     f"cannot build the prompt: {type(e).__name__}: {e}", sample_index=sample_index)
        traj = Trajectory(question=record, messages=list(messages), tokens=list(prompt.ids),
                          loss_mask=[0] * len(prompt.ids), logprobs=[0.0] * len(prompt.ids),
                          prompt_len=len(prompt.ids), turn_spans=[], sample_index=sample_index)
        traj.extras["seed"] = seed
        return self._drive(traj, self.sampling(seed, greedy), start_ids=prompt.ids, keep_session=keep_session)

    def continue_episode(self, prev: Trajectory, new_messages: list[dict], greedy: bool = False) -> Trajectory:
        """A second attempt: prev's tokens (all context now, loss mask 0) + new messages, then the
        agent continues with a fresh turn budget. If prev kept its engine session, the new tokens
        are appended to its KV cache (no history recomputed); otherwise the prefix is prefilled."""
        try:
            if not prev.turn_spans:
                raise ValueError(f"the previous attempt has no sampled turn to continue (finish_reason="
                                 f"{prev.finish_reason!r}, error={prev.error!r})")
            suffix = chat.close_assistant_turn(self.tok, prev.tokens) + list(
                chat.render_suffix(self.tok, new_messages, add_generation_prompt=True).ids)
        except Exception as e:  # this attempt fails alone
            with contextlib.suppress(Exception):
                self.release([prev])
            return Trajectory.failed(prev.question, f"cannot continue: {type(e).__name__}: {e}",
                                     messages=prev.messages, sample_index=prev.sample_index, attempt=prev.attempt + 1)
        tokens = list(prev.tokens) + suffix
        traj = Trajectory(question=prev.question, messages=list(prev.messages) + list(new_messages), tokens=tokens,
                          loss_mask=[0] * len(tokens), logprobs=[0.0] * len(tokens), prompt_len=len(tokens),
                          turn_spans=[], sample_index=prev.sample_index, attempt=prev.attempt + 1)
        seed = (prev.extras.get("seed", prev.sample_index) * 7919 + prev.attempt) % (2 ** 31)
        sampling = self.sampling(seed, greedy)
        sid = prev.extras.pop("session_id", None)
        if sid is not None and prev.finish_reason != "error" and len(tokens) + 1 < self.engine.max_len:
            try:
                self.engine.append(sid, suffix, then_resume=sampling)
            except Exception:  # noqa: BLE001 - e.g. the session is gone: prefill the prefix instead
                pass
            else:
                return self._drive(traj, sampling, sid=sid)
        if sid is not None:
            with contextlib.suppress(Exception):
                self.engine.release(sid)
        return self._drive(traj, sampling, start_ids=tokens)  # "length" when there is no room left

    def _drive(self, traj: Trajectory, sampling: SamplingParams, start_ids=None, sid=None,
               keep_session: bool = False) -> Trajectory:
        c, eng = self.config, self.engine
        if sid is None:
            if len(start_ids) > eng.max_len - 1:
                traj.finish_reason = "length"
                traj.error = (f"the prompt has {len(start_ids)} tokens but the engine's max_len={eng.max_len} "
                              "leaves no room to generate")
                return traj
            try:
                sid = eng.start(start_ids, sampling, multi_turn=True)
            except Exception as e:  # e.g. a token id outside the model's vocabulary
                traj.finish_reason, traj.error = "error", f"{type(e).__name__}: {e}"
                return traj
        try:
            turn = 0
            while True:
                res = eng.wait(sid)
                start = len(traj.tokens)
                traj.tokens.extend(res.tokens)
                traj.loss_mask.extend([1] * len(res.tokens))
                traj.logprobs.extend(float(x) for x in res.logprobs)
                traj.turn_spans.append((start, len(traj.tokens)))
                text = self.tok.decode(res.tokens, skip_special_tokens=False)
                text = text.removesuffix(self.end_of_turn)
                message, items = self._turn_message(text)
                traj.messages.append(message)
                traj.final_text = text
                turn += 1
                if res.finish_reason not in ("stop", "stop_string", "length"):
                    traj.finish_reason = "error"
                    traj.error = f"engine finish_reason={res.finish_reason}" + (f": {res.error}" if res.error else "")
                    return traj
                if res.finish_reason == "length" and len(traj.tokens) >= eng.max_len - 1:
                    traj.finish_reason = "length"  # cut by the context, whatever the cut text holds
                    return traj
                if not items:
                    traj.finish_reason = "answer" if "\\boxed" in message["content"] else "no_answer"
                    return traj
                if turn >= c.max_turns:
                    traj.finish_reason = "max_turns"
                    return traj
                new_msgs = self._run_tools(items, traj.tool_stats)
                if turn == c.max_turns - 1:
                    new_msgs.append({"role": "user", "content": c.final_step_message})
                suffix = chat.close_assistant_turn(self.tok, res.tokens) + list(
                    chat.render_suffix(self.tok, new_msgs, add_generation_prompt=True).ids)
                if len(traj.tokens) + len(suffix) + 1 >= eng.max_len:
                    traj.finish_reason = "length"
                    traj.error = (f"no room for the next turn: {len(traj.tokens)} tokens + {len(suffix)} of tool "
                                  f"responses leave no position to generate in max_len={eng.max_len}")
                    return traj
                traj.messages.extend(new_msgs)
                traj.tokens.extend(suffix)
                traj.loss_mask.extend([0] * len(suffix))
                traj.logprobs.extend([0.0] * len(suffix))
                eng.append(sid, suffix, then_resume=sampling)
        except Exception as e:  # the episode fails alone; the engine and other episodes go on
            traj.finish_reason, traj.error = "error", f"{type(e).__name__}: {e}"
            return traj
        finally:
            if keep_session and traj.finish_reason != "error":
                traj.extras["session_id"] = sid
            else:
                with contextlib.suppress(Exception):
                    eng.release(sid)

    def _turn_message(self, text: str) -> tuple[dict, list]:
        """The assistant message of a sampled turn and its tool-call items (ToolCall or ToolCallError,
        in order). Calls to tools this loop does not offer are errors. A turn with any malformed call
        keeps its answer text verbatim (no `tool_calls`), so nothing the model wrote is dropped."""
        items = chat.parse_tool_calls(text, self.tool_names)
        if all(isinstance(it, chat.ToolCall) for it in items):
            return chat.assistant_message_from_text(text, self.tool_names)[0], items
        reasoning, answer = chat.split_reasoning(text)
        message = {"role": "assistant", "content": answer}
        if "</think>" in text:
            message["reasoning_content"] = reasoning
        return message, items

    def _call_tools(self, calls: list) -> list:
        """ToolOutputs of the parsed calls, in order; a registry that fails or answers short gives
        error outputs instead of ending the episode."""
        if not calls:
            return []
        if self.registry is None:
            return [tools.unknown_tool_output(call.name, []) for call in calls]
        try:
            outputs = list(self.registry.call_many([(call.name, call.arguments) for call in calls]))
        except Exception as e:  # noqa: BLE001 - a tool bug must not end the episode
            failed = tools.ToolOutput.error(tools.RUNTIME_ERROR, f"the tool failed: {type(e).__name__}: {e}")
            outputs = [failed] * len(calls)
        missing = tools.ToolOutput.error(tools.RUNTIME_ERROR, "the tool registry returned no output for this call")
        outputs = [o if isinstance(o, tools.ToolOutput) else missing for o in outputs[:len(calls)]]
        return outputs + [missing] * (len(calls) - len(outputs))

    def _run_tools(self, items: list, stats: ToolStats) -> list[dict]:
        """One tool message per call item, in the order the model wrote them: the output of each
        well-formed call (run in parallel), or a readable "Error: ..." for a call that could not be
        parsed, failed, or exceeds `max_tool_calls_per_turn`."""
        limit = self.config.max_tool_calls_per_turn
        calls = [it for it in items if isinstance(it, chat.ToolCall)]
        run = calls[:limit]
        t0 = time.perf_counter()
        outputs = dict(zip((id(call) for call in run), self._call_tools(run)))
        stats.seconds += time.perf_counter() - t0
        msgs = []
        for it in items:
            if not isinstance(it, chat.ToolCall):
                stats.parse_errors += 1
                msgs.append({"role": "tool", "name": "error", "content": f"Error: {it.message}"})
                continue
            out = outputs.get(id(it))
            if out is None:
                msgs.append({"role": "tool", "name": it.name,
                             "content": f"Error: at most {limit} tool calls per turn; this call was not run."})
                continue
            stats.calls += 1
            stats.by_tool[it.name] = stats.by_tool.get(it.name, 0) + 1
            text = out.text
            if not out.ok:
                stats.failures += 1
                if not text.lower().startswith("error"):
                    text = f"Error ({out.error_kind}): {text}"
            msgs.append({"role": "tool", "name": it.name, "content": text})
        return msgs
