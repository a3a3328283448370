"""A stand-in for the rollout engine whose "model" replays scripted assistant turns.

Only the policy is scripted: rendering, tool-call parsing, the real tools, token appending and
scoring all run exactly as with the JAX engine. Used to test the agent loop's plumbing.
"""
import threading

from reagent_jax import chat
from reagent_jax.rollout import Result


def assistant_turn_ids(tok, message):
    """The ids a model emits for this assistant message (train-mode rendering, incl. <|im_end|>)."""
    prev = [{"role": "user", "content": "x"}]
    head = chat.render(tok, prev, add_generation_prompt=True, mode="train").ids
    full = chat.render(tok, prev + [message], mode="train")
    ids = full.ids[len(head):]
    return ids[:sum(full.loss_mask)]


class ScriptedEngine:
    """policy(prompt_ids) -> list of assistant messages (the whole episode's turns)."""

    def __init__(self, tok, policy, max_len=10 ** 8):
        self.tok, self.policy, self.max_len = tok, policy, max_len
        self._lock = threading.Lock()
        self._sessions = {}
        self._next = 0
        self.appended = []

    def start(self, prompt_ids, sampling=None, multi_turn=False):
        with self._lock:
            sid = self._next
            self._next += 1
            self._sessions[sid] = {"turns": list(self.policy(list(prompt_ids))), "i": 0}
        return sid

    def wait(self, sid, timeout=None):
        s = self._sessions[sid]
        msg = s["turns"][min(s["i"], len(s["turns"]) - 1)]
        s["i"] += 1
        ids = assistant_turn_ids(self.tok, msg)
        return Result(session_id=sid, tokens=ids, logprobs=[0.0] * len(ids), finish_reason="stop", turn=s["i"],
                      prompt_len=0, seed=0, stop=None, error=None)

    def append(self, sid, ids, then_resume=None):
        self.appended.append(list(ids))

    def release(self, sid):
        self._sessions.pop(sid, None)
