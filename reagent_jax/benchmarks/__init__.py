"""Every benchmark of the project, one module per `launch/bench.py --mode` (figures in
BENCHMARKS.md): forward.py (forward / fwd+bwd vs transformers), rollout.py (engine throughput,
roofline, sampler), train.py (the train step and the GRPO step), serve.py (the server under load,
evaluation wall time) with loadgen.py (its HTTP clients), data.py (ArrayRecord vs JSONL reads),
tools.py (retrieval, sandbox and tool-latency overlap) with sandbox.py (sandbox calls per second).
Library code never imports this package."""
