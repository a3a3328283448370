"""An OpenAI-compatible HTTP server over the rollout engine (continuous batching for all requests).

    from reagent_jax import serve
    policy = serve.load_policy("workdir/grpo/final")             # or an HF checkpoint dir
    engine = serve.build_engine(policy, num_slots=64, max_len=8192)
    svc = serve.ModelService(engine, policy.tokenizer, "reagent-agent")
    with serve.ServerThread(serve.make_app(svc)) as server:       # 127.0.0.1, a free port
        openai.OpenAI(base_url=server.base_url, api_key="none").chat.completions.create(...)

    client = serve.EngineChatClient(svc, temperature=0.0)          # the same, in process (judges)

Command line: `python launch/serve.py --policy=DIR [--port=8000 --api_key=...]`.
"""
from reagent_jax.serve.app import make_app
from reagent_jax.serve.errors import APIError
from reagent_jax.serve.inprocess import EngineChatClient
from reagent_jax.serve.policy import Policy, build_engine, default_model_name, find_tokenizer, load_policy
from reagent_jax.serve.protocol import ServerLimits
from reagent_jax.serve.scripted import ScriptedEngine
from reagent_jax.serve.server import DEFAULT_HOST, ServerThread, serve_forever
from reagent_jax.serve.service import ModelService

__all__ = ["APIError", "DEFAULT_HOST", "EngineChatClient", "ModelService", "Policy", "ScriptedEngine",
           "ServerLimits", "ServerThread", "build_engine", "default_model_name", "find_tokenizer", "load_policy", "make_app",
           "serve_forever"]
