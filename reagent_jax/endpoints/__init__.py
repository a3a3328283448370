"""Clients for remote OpenAI-compatible model servers (judges, annotators, tool backends).

    from reagent_jax.endpoints import ChatClient, EndpointConfig, EndpointError
    cfg = EndpointConfig(base_urls=("http://127.0.0.1:8000/v1",), model="Qwen/Qwen3-8B", max_concurrency=32)
    with ChatClient(cfg) as client:
        text = client.complete([{"role": "user", "content": "hi"}]).text
        results = client.complete_many(list_of_messages)      # [Completion | EndpointError], in order
"""

from reagent_jax.endpoints.client import (
    ChatClient,
    Completion,
    EndpointError,
    parse_chat_completion,
    validate_messages,
)
from reagent_jax.endpoints.config import BALANCE_STRATEGIES, EndpointConfig
from reagent_jax.endpoints.pool import EndpointPool

__all__ = [
    "BALANCE_STRATEGIES", "ChatClient", "Completion", "EndpointConfig", "EndpointError", "EndpointPool",
    "parse_chat_completion", "validate_messages",
]
