"""What a new user hits at the entry points: documented commands parse and pass the config check,
bad overrides and paths stop the run at once with the key (or flag) and allowed values named,
and converting a checkpoint refuses dtypes that would silently destroy it."""
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", *sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(REPO, "docs"))
                             if f.endswith(".md"))]


def _module(path, name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


checks = _module("launch/config_checks.py", "reagent_launch_config_checks")


def test_config_checks_live_in_the_library():
    """Notebooks call the same checks as the launch scripts, without absl (see docs/configs.md)."""
    from reagent_jax.pipelines import config_checks as lib
    assert checks.check_train_config is lib.check_train_config
    assert checks.check_eval_config is lib.check_eval_config
    assert checks.ConfigError is lib.ConfigError


def _config(name, **overrides):
    c = _module(f"configs/{name}.py", f"reagent_config_{name}").get_config()
    for key, value in overrides.items():
        node = c
        *parents, leaf = key.split("__")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c


def _problems(check, config, **kw):
    try:
        check(config, **kw)
    except checks.ConfigError as e:
        return str(e).splitlines()[1:]
    return []


def _run(script, *args, timeout=240):
    return subprocess.run([sys.executable, os.path.join(REPO, "launch", script), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


PAPER_OK = dict(data__train_path="/data/rl.jsonl", rrm__base_urls="http://rrm:8000/v1")


@pytest.mark.parametrize("name, overrides, num_devices, expected", [
    ("quickstart", {}, 1, []),
    ("evalplanner_quickstart", {}, 1, []),
    ("qwen3_8b_reagent_u", PAPER_OK, 8, []),
    ("smollm2_gsm8k", {}, 1, []),
    ("smollm2_gsm8k", dict(data__sft_from="answers", tokenizer__kind="hf"), 1,
     ["config.data.sft_from='answers': use one of solutions",
      "config.tokenizer.kind='hf': use one of checkpoint, compact, qwen3"]),
    ("smollm2_gsm8k", dict(data__sft_from=""), 1, ["config.data.sft_path='': the sft stage needs"]),
    ("quickstart", dict(strategy="reagent_x"), 1, ["config.strategy='reagent_x': use one of grpo, reagent_c, "
                                                   "reagent_r, reagent_u"]),
    ("quickstart", dict(sft__micro_batches=3), 1, ["config.sft.micro_batches=3: batch_size=8 is not divisible"]),
    ("quickstart", dict(grpo__advantage="gae", grpo__loss_agg_mode="mean"), 1,
     ["config.grpo.advantage='gae': use one of dr_grpo, grpo, rloo",
      "config.grpo.loss_agg_mode='mean': use one of token-mean"]),
    ("quickstart", dict(mesh="gpu8"), 1, ["config.mesh='gpu8': needs 8 devices"]),
    ("quickstart", dict(mesh="gpu8"), 8, []),
    ("quickstart", dict(mesh="tpu_dp_fsdp"), 12, ["config.mesh='tpu_dp_fsdp': needs a multiple of 8 devices"]),
    ("quickstart", dict(mesh="tpu_dp_fsdp"), 16, []),
    ("quickstart", dict(mesh="gpu16"), 1, ["config.mesh='gpu16': use one of auto, cpu8"]),
    ("quickstart", dict(stages="sft,rrm"), 1, ["config.stages='sft,rrm': unknown rrm; use names from rrm_sft"]),
    ("quickstart", dict(agent__tools="search,pyhton", agent__top_p=0.0, agent__temperature=-1.0), 1,
     ["config.agent.tools='search,pyhton': unknown pyhton", "config.agent.temperature=-1.0: must be >= 0.0",
      "config.agent.top_p=0.0: must be in (0.0, 1.0]"]),
    ("quickstart", dict(strategy="reagent_u", rrm__judge="remote"), 1,
     ["config.rrm.base_urls='': strategy='reagent_u' in the grpo stage uses the remote Agent-RRM"]),
    ("quickstart", dict(strategy="reagent_r", rrm__judge="llm"), 1, ["config.rrm.judge='llm': use one of rule, "
                                                                    "local, remote"]),
    ("quickstart", dict(strategy="reagent_u", rrm__judge="local"), 1, ["config.rrm.judge='local': strategy="
                                                                      "'reagent_u' in the grpo stage with a local"]),
    ("quickstart", dict(strategy="reagent_u", rrm__judge="local", stages="rrm_sft,sft,grpo"), 1, []),
    ("quickstart", dict(stages="rrm_sft", eval__rrm_items=-1), 1, ["config.eval.rrm_items=-1: must be >= 0"]),
    ("quickstart", dict(model__num_kv_heads=3, model__remat_policy="all", model__param_dtype="fp8"), 1,
     ["config.model.param_dtype='fp8': use one of float32, bfloat16, float16",
      "config.model.remat_policy='all': use one of none, full",
      "config.model.num_kv_heads=3: model.num_heads=4 is not a multiple of it"]),
    ("quickstart", dict(checkpoint__every=0, grpo__n=0, grpo__mini_batches=0), 1,
     ["config.grpo.n=0: must be >= 1", "config.grpo.mini_batches=0: must be >= 1",
      "config.checkpoint.every=0: must be >= 1"]),
    ("quickstart", dict(rollout__length_buckets="512;1024"), 1, ["config.rollout.length_buckets='512;1024'"]),
    # the paper config's SFT run without a served judge: its final Reagent-C evaluation would fail
    ("qwen3_8b_reagent_u", dict(stages="sft", data__train_path="x", data__sft_path="y"), 8,
     ["config.rrm.base_urls='': eval.refinement=True uses the remote Agent-RRM"]),
    ("qwen3_8b_reagent_u", dict(stages="sft", data__train_path="x", data__sft_path="y", eval__refinement=False), 8,
     []),
    ("qwen3_8b_reagent_u", dict(stages="rrm_sft,grpo", model__preset="qwen3-9b", **PAPER_OK), 8,
     ["config.model.preset='qwen3-9b': use one of"]),
    ("qwen3_8b_reagent_u", {}, 8, ["config.data.train_path='': required without a synthetic world",
                                   "config.rrm.base_urls=''"]),
    ("evalplanner_quickstart", dict(judge__format="plan", chains__pairing="some", dpo__loss_type="kto"), 1,
     ["config.judge.format='plan': use one of plan_execute, single_pass, verdict_only",
      "config.chains.pairing='some': use one of one_to_one, all",
      "config.dpo.loss_type='kto': use one of sigmoid, robust, ipo, hinge"]),
    ("evalplanner_quickstart", dict(stages="judge_sft,judge_seed", dpo__micro_batches=3), 1,
     ["config.stages='judge_sft,judge_seed': out of order",
      "config.dpo.micro_batches=3: batch_size=4 is not divisible by 3"]),
    ("evalplanner_quickstart", dict(data__source="jsonl", stages="judge_data,judge_sft"), 1,
     ["config.data.eval_paths='': data.source='jsonl' needs", "config.data.train_paths='': data.source='jsonl'"]),
    ("evalplanner_quickstart", dict(data__flaws="no_boxed,typo", data__source="csv"), 1,
     ["config.data.source='csv': use one of synthetic, jsonl, math", "config.data.flaws='no_boxed,typo': unknown typo"]),
])
def test_train_config_check_names_key_and_allowed_values(name, overrides, num_devices, expected):
    found = _problems(checks.check_train_config, _config(name, **overrides), num_devices=num_devices,
                      check_paths=False)
    assert len(found) == len(expected), found
    for want in expected:
        assert any(line.strip().startswith(want) for line in found), (want, found)


def test_train_config_check_paths(tmp_path):
    c = _config("quickstart", model__init_from=str(tmp_path / "nope"), tokenizer__path=str(tmp_path / "tok"))
    found = _problems(checks.check_train_config, c, num_devices=1)
    assert [line.split(":")[0].strip() for line in found] == [
        f"config.model.init_from='{tmp_path / 'nope'}'", f"config.tokenizer.path='{tmp_path / 'tok'}'"]
    gguf = _config("smollm2_gsm8k", model__init_from=str(tmp_path / "model.gguf"))
    assert [line.split(":")[0].strip() for line in _problems(checks.check_train_config, gguf, num_devices=1)] == [
        f"config.model.init_from='{tmp_path / 'model.gguf'}'"]  # named, before any conversion
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    assert _problems(checks.check_train_config, gguf, num_devices=1) == []
    paper = _config("qwen3_8b_reagent_u", data__train_path=str(tmp_path / "rl.jsonl"), data__eval_path="bamboogle_x",
                    rrm__base_urls="http://h:1/v1")
    found = _problems(checks.check_train_config, paper, num_devices=8)
    assert any("config.data.train_path" in line and "data file not found" in line for line in found)
    assert any("config.data.eval_path='bamboogle_x'" in line and "not found" in line for line in found)
    (tmp_path / "rl.jsonl").write_text("{}\n")
    paper.data.eval_path = ""
    assert _problems(checks.check_train_config, paper, num_devices=8) == []
    # a local judge trained by an earlier run of the same workdir is fine
    local = _config("quickstart", strategy="reagent_u", rrm__judge="local")
    assert _problems(checks.check_train_config, local, workdir=str(tmp_path), num_devices=1)
    os.makedirs(tmp_path / "rrm_sft" / "final")
    (tmp_path / "rrm_sft" / "final" / "reagent_config.json").write_text("{}")
    assert _problems(checks.check_train_config, local, workdir=str(tmp_path), num_devices=1) == []


@pytest.mark.parametrize("overrides, expected", [
    (dict(policy__path="/ckpt/x"), []),
    ({}, ["config.policy.path='': required"]),
    (dict(policy__path="/ckpt/x", scoring__method="gpt", k=0, limit=-1), [
        "config.scoring.method='gpt': use one of rule, llm", "config.k=0: must be >= 1", "config.limit=-1"]),
    (dict(policy__path="/ckpt/x", scoring__method="llm"), [
        "config.scoring.judge.base_url='': scoring.judge.kind='endpoint' needs it", "config.scoring.judge.model=''"]),
    (dict(policy__path="/ckpt/x", reagent_c__enabled=True, reagent_c__judge__kind="policy"), []),
    (dict(policy__path="/ckpt/x", reagent_c__enabled=True, reagent_c__judge__kind="local"), [
        "config.reagent_c.judge.kind='local': use one of endpoint, policy, checkpoint"]),
    (dict(policy__path="/ckpt/x", tool_sets__math="python,calculator", policy__dtype="int8"), [
        "config.tool_sets.math='python,calculator': unknown calculator", "config.policy.dtype='int8'"]),
    (dict(policy__path="/ckpt/x", benchmarks=" , "), ["config.benchmarks=' , ': names no benchmark"]),
])
def test_eval_config_check(overrides, expected):
    found = _problems(checks.check_eval_config, _config("evaluate_example", **overrides), check_paths=False)
    assert len(found) == len(expected), found
    for want in expected:
        assert any(line.strip().startswith(want) for line in found), (want, found)


def test_eval_config_check_paths(tmp_path):
    c = _config("evaluate_example", policy__path=str(tmp_path), benchmarks=f"bamboogle,gaia={tmp_path}/gaia.jsonl,gsm9k")
    found = _problems(checks.check_eval_config, c)
    assert len(found) == 2 and all(line.strip().startswith("config.benchmarks=") for line in found)
    assert "gaia.jsonl" in found[0] and "'gsm9k' not found" in found[1]


def _documented_commands():
    """(file, script, flags) of every `python launch/<script>.py ...` in the README, docs, configs, launch."""
    files = DOCS + [os.path.join(d, f) for d in ("configs", "launch") for f in sorted(os.listdir(os.path.join(REPO, d)))
                    if f.endswith(".py")]
    out = []
    for path in files:
        text = open(os.path.join(REPO, path), encoding="utf-8").read().replace("\\\n", " ")
        for m in re.finditer(r"python (launch/\w+\.py)([^`\n\"]*)", text):
            args = [a for a in m.group(2).split(" #")[0].split() if a.startswith("--")]
            out.append((path, m.group(1), args))
    return out


_PARSE_ALL = r"""
import importlib.util, json, os, sys
from absl import flags
sys.path.insert(0, "launch")
import config_checks
FLAGS, failures = flags.FLAGS, []
commands = json.loads(sys.argv[1])
for script in sorted({c[1] for c in commands}):
    before = set(FLAGS)
    spec = importlib.util.spec_from_file_location("doc_" + os.path.basename(script)[:-3], script)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    for path, s, args in (c for c in commands if c[1] == script):
        FLAGS.unparse_flags()
        sys.argv = [script] + args  # ml_collections reads the overrides from sys.argv
        try:
            FLAGS(sys.argv)
            if script.endswith("train.py"):
                config_checks.check_train_config(FLAGS.config, check_paths=False)
            elif script.endswith("evaluate.py"):
                config_checks.check_eval_config(FLAGS.config, check_paths=False)
        except Exception as e:
            failures.append([path, " ".join(args), f"{type(e).__name__}: {e}"])
        for name in [n for n in FLAGS if n.startswith("config.")]:
            delattr(FLAGS, name)
    for name in set(FLAGS) - before:
        delattr(FLAGS, name)
print(json.dumps(failures))
"""


def test_documented_commands_parse_and_pass_the_config_check():
    """Flags exist, config keys exist and parse, and the values pass the config check (paths not
    required to exist: they are examples)."""
    commands = _documented_commands()
    assert len(commands) > 40 and {c[1] for c in commands} >= {"launch/train.py", "launch/evaluate.py",
                                                                "launch/serve.py", "launch/convert.py",
                                                                "launch/bench.py"}
    canary = ("<canary>", "launch/train.py", ["--config=configs/quickstart.py", "--workdir=x", "--config.grpo.stepz=1"])
    proc = subprocess.run([sys.executable, "-c", _PARSE_ALL, json.dumps(commands + [canary])], cwd=REPO,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    failures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [f[0] for f in failures] == ["<canary>"], failures  # the canary shows the harness catches typos


def test_documented_inline_overrides_name_real_fields():
    """`--config.a.b=v` mentioned in prose (not in a full command) names a field of some config."""
    configs = [_config(n) for n in ("quickstart", "qwen3_8b_reagent_u", "evalplanner_quickstart", "evaluate_example")]

    def exists(path):
        for c in configs:
            node, ok = c, True
            for part in path.split("."):
                if not hasattr(node, "keys") or part not in node:
                    ok = False
                    break
                node = node[part]
            if ok:
                return True
        return False
    mentioned = set()
    for path in DOCS + [os.path.join("configs", f) for f in os.listdir(os.path.join(REPO, "configs"))]:
        text = open(os.path.join(REPO, path), encoding="utf-8").read()
        mentioned |= {m.rstrip(".") for m in re.findall(r"--config\.([\w.]+)", text)}
    mentioned = {m[:-2] if m.endswith(".*") else m for m in mentioned} - {"key"}  # `--config.key=value`
    assert len(mentioned) > 40
    assert sorted(m for m in mentioned if not exists(m)) == []


def test_configs_md_lists_real_fields_with_their_defaults():
    """Each table row of docs/configs.md names fields of its config; single values match the defaults."""
    import ast
    sections = {"Agent pipeline": "quickstart", "Paper scale": "qwen3_8b_reagent_u", "EvalPlanner":
                "evalplanner_quickstart", "Evaluation": "evaluate_example", "Plain GRPO": "grpo_gsm8k"}
    text = open(os.path.join(REPO, "docs", "configs.md"), encoding="utf-8").read()
    wrong, checked = [], 0
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        name = next((v for k, v in sections.items() if section.startswith(k)), None)
        if name is None:
            continue
        c = _config(name)
        for line in section.splitlines():
            if not line.startswith("| `"):
                continue
            cols = line.split("|")
            raw = re.findall(r"`([^`]+)`", cols[1])
            names = [n[:-2] if n.endswith(".*") else n for n in raw]
            defaults = re.findall(r"`([^`]+)`", cols[2])
            parent = names[0].rsplit(".", 1)[0] + "." if "." in names[0] else ""
            for i, n in enumerate(names):
                fields = [n]
                brace = re.match(r"(.*)\.\{(.*)\}$", n)
                if brace:
                    fields = [f"{brace.group(1)}.{x}" for x in brace.group(2).split(",")]
                for field in fields:
                    full = field if i == 0 or "." in field else parent + field
                    node = c
                    for part in full.split("."):
                        node = node[part] if hasattr(node, "keys") and part in node else KeyError
                    if node is KeyError:
                        if cols[2].strip() != "removed":
                            wrong.append(f"{name}: {full} is not a field")
                        continue
                    if len(names) == len(defaults) == len(cols[2].split(" / ")) and not brace and raw[i] == n:
                        try:
                            doc = ast.literal_eval(defaults[i])
                        except (ValueError, SyntaxError):
                            continue
                        checked += 1
                        if doc != node:
                            wrong.append(f"{name}: {full} documented {doc!r}, config has {node!r}")
    assert checked > 40 and wrong == []


def test_cli_typo_in_config_key_is_one_clear_line(tmp_path):
    proc = _run("train.py", "--config=configs/quickstart.py", f"--workdir={tmp_path / 'w'}", "--config.grpo.stepz=3")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "--config.grpo.stepz: no such config field" in proc.stderr and '"steps"' in proc.stderr
    proc = _run("evaluate.py", f"--outdir={tmp_path / 'e'}", "--config.polcy.path=x")
    assert proc.returncode == 1 and "--config.polcy.path: no such config field" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_invalid_config_stops_before_any_work(tmp_path):
    """An unknown strategy used to surface only after the tokenizer, the random-init evaluation and
    the whole SFT stage; now the run stops before it creates anything in the workdir."""
    workdir = tmp_path / "w"
    proc = _run("train.py", "--config=configs/quickstart.py", f"--workdir={workdir}", "--config.strategy=reagent_x",
                "--config.sft.micro_batches=3")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "config.strategy='reagent_x': use one of grpo, reagent_c, reagent_r, reagent_u" in proc.stderr
    assert "config.sft.micro_batches=3: batch_size=8 is not divisible by 3 micro-batches" in proc.stderr
    assert not workdir.exists()
    proc = _run("evaluate.py", f"--outdir={tmp_path / 'e'}", f"--config.policy.path={tmp_path / 'missing'}",
                "--config.scoring.method=gpt4", "--config.benchmarks=bamboogle")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"config.policy.path='{tmp_path / 'missing'}': policy directory not found" in proc.stderr
    assert "config.scoring.method='gpt4': use one of rule, llm" in proc.stderr
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("args, message", [
    (["--direction=orbax_to_hf", "--dtype=int8"], "flag --dtype=int8: value should be one of "
                                                  "<float32|bfloat16|float16>"),
    (["--direction=orbax_to_hf", "--max_shard_mb=0"], "flag --max_shard_mb=0: 0 is not a positive integer"),
    (["--direction=hf_to_orbax", "--dtype=bfloat61"], "flag --dtype=bfloat61"),
])
def test_convert_rejects_bad_flags_and_writes_nothing(tmp_path, args, message):
    """--dtype=int8 used to write an HF checkpoint of all-zero int8 weights and report success; the
    flags are now checked before the source is read."""
    (tmp_path / "src").mkdir()
    proc = _run("convert.py", f"--src={tmp_path / 'src'}", f"--dst={tmp_path / 'out'}", *args)
    assert proc.returncode == 1 and message in proc.stderr
    assert not (tmp_path / "out").exists()


def test_convert_missing_src_names_the_flag(tmp_path):
    proc = _run("convert.py", "--direction=hf_to_orbax", f"--src={tmp_path / 'nope'}", f"--dst={tmp_path / 'o'}")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"--src={tmp_path / 'nope'}: no such directory" in proc.stderr


@pytest.mark.parametrize("script, args, message", [
    ("bench.py", ["--mode=forward", "--preset=tiny", "--batch=0"], "flag --batch=0: 0 is not a positive integer"),
    ("bench.py", ["--mode=rollout", "--iters=0"], "flag --iters=0: 0 is not a positive integer"),
    ("bench.py", ["--mode=tools", "--workdir=/nonexistent/run"], "--workdir=/nonexistent/run: not a finished "
                                                                  "quickstart workdir"),
    ("serve.py", ["--scripted_replies=/nonexistent/replies.jsonl"], "--scripted_replies=/nonexistent/replies.jsonl: "
                                                                     "no such file"),
    ("serve.py", ["--policy=/x", "--dtype=fp8"], "flag --dtype=fp8: value should be one of"),
    ("serve.py", ["--policy=/nonexistent/ckpt"], "--policy=/nonexistent/ckpt: no such checkpoint directory or .gguf file"),
    ("serve.py", [f"--scripted_replies={os.path.join(REPO, 'README.md')}", "--tokenizer=/nonexistent/tok"],
     "--tokenizer=/nonexistent/tok: no such directory"),
])
def test_bench_and_serve_flags_are_checked_first(script, args, message):
    """bench.py --batch=0 used to print a JSON of zero throughputs; --iters=0 a StatisticsError."""
    proc = _run(script, *args)
    assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr
