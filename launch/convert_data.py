r"""Converts downloaded datasets to the local schemas of `reagent_jax/data/schemas.py` (one JSONL file).

  python launch/convert_data.py --kind=agent_rl  --input=Reagent-RL-709K --output=data/reagent_rl.jsonl
  python launch/convert_data.py --kind=agent_sft --input=Reagent-SFT-55.6K --output=data/reagent_sft.jsonl
  python launch/convert_data.py --kind=rrm_sft   --input=Reagent-RRM-SFT-28K --output=data/rrm_sft.jsonl
  python launch/convert_data.py --kind=rrm_rl    --input=Reagent-RRM-RL-90K --output=data/rrm_rl.jsonl
  python launch/convert_data.py --kind=pairwise  --input=reward-bench/filtered.parquet --output=data/rewardbench.jsonl
  python launch/convert_data.py --kind=benchmark --input=gaia/validation.jsonl --output=data/gaia.jsonl \
      --data_source=gaia

--input: files, directories (every .jsonl / .json / .parquet below them) or globs, comma-separated.
A .json file may hold a list of rows, {"data": [...]}, one row, or JSON Lines; a UTF-8 BOM is fine.
Fields are found under the names below (the first present wins; `a.b` is a nested field);
`--field_map=answer=ground_truth.target,question=prompt` names them explicitly instead.

  agent_rl   question <- question, problem, prompt, query, input (a chat list: its last user turn)
             answer <- answer, answers, ground_truth, golden_answers, target, reward_model.ground_truth
                       (a dict with "target" is unwrapped); data_source <- data_source, source,
                       meta_info.source, ability, category, else --data_source
  agent_sft  messages <- messages, conversations, conversation, dialog (ShareGPT from/value rows are
             mapped to roles; Hermes <tool_call> text in assistant turns becomes tool_calls); tools
  rrm_sft    question; trajectory <- trajectory, messages, conversations, history; think, critique,
             score, or one judgement text (judgement, output, response, completion) that is parsed
  rrm_sft_messages  the rrm_sft rows as chat conversations (agent_sft schema): the Agent-RRM
             prompt (`rrm.build_rrm_messages`) + the judgement as the assistant turn, so the `sft`
             stage of launch/train.py trains an Agent-RRM on them
  rrm_rl     question; trajectory; target <- target, label, score, outcome, reward, correct
  pairwise   instruction <- instruction, prompt, question, input; chosen / rejected (texts or chat
             lists); JudgeBench rows (response_A, response_B, label "A>B" / "B>A"); RM-Bench rows
             (lists of chosen and rejected responses: every chosen x rejected pair); category <-
             category, subset, domain, source; id <- id, pair_id
  benchmark  id <- id, task_id, qid (else the row number); question <- question, Question, problem;
             answer <- answer, answers, Final answer, ground_truth; source <- --data_source; the
             other fields go to meta

Rows that do not fit are skipped and counted (the first reasons are printed, with file and row);
`--on_error=raise` stops at the first one. The output is written atomically. To see which fields a
download has before converting it: `python launch/convert_data.py --inspect --input=DIR`.
"""
from __future__ import annotations

import sys

from absl import app, flags

from reagent_jax.pipelines.convert_data import KINDS, ConvertError, convert, inspect, parse_field_map

FLAGS = flags.FLAGS
flags.DEFINE_enum("kind", None, list(KINDS), "Target schema: " + ", ".join(KINDS) + ".")
flags.DEFINE_string("input", None, "Comma-separated files, directories or globs (.jsonl, .json, .parquet).")
flags.DEFINE_string("output", None, "Output JSONL path.")
flags.DEFINE_string("field_map", "", "Explicit field names: TARGET=SOURCE,... (SOURCE may be nested: a.b).")
flags.DEFINE_string("data_source", "", "agent_rl: data_source for rows without one; benchmark: the source name.")
flags.DEFINE_integer("limit", 0, "Stop after this many output rows (0 = all).")
flags.DEFINE_enum("on_error", "skip", ["skip", "raise"], "Rows that do not convert: skip and count, or stop.")
flags.DEFINE_bool("inspect", False, "Print each input file's field names and first row; convert nothing.")
flags.mark_flags_as_required(["input"])


def main(argv):
    del argv
    try:
        if FLAGS.inspect:
            print(inspect(FLAGS.input))
            return 0
        if not FLAGS.kind or not FLAGS.output:
            raise ValueError("--kind and --output are required (or --inspect to look at the input)")
        stats = convert(FLAGS.kind, FLAGS.input, FLAGS.output, field_map=parse_field_map(FLAGS.field_map),
                        data_source=FLAGS.data_source, limit=FLAGS.limit, on_error=FLAGS.on_error)
    except (ConvertError, FileNotFoundError, ValueError) as e:
        print(f"convert_data: {e}", file=sys.stderr)
        return 1
    print(f"wrote {stats['written']} {FLAGS.kind} rows to {FLAGS.output}; skipped {stats['skipped']}")
    for reason in stats["reasons"]:
        print("  skipped", reason)
    return 0


if __name__ == "__main__":
    app.run(main)
