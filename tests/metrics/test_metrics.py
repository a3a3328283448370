"""Metrics: JSONL round trip and resume semantics, TensorBoard events, progress bar, plots, tables."""
import glob
import io
import json
import logging
import math
import os
import struct

import numpy as np
import pytest
from PIL import Image

from reagent_jax.metrics import (
    MetricsWriter,
    ProgressBar,
    markdown_table,
    plot_curves,
    progress_enabled,
    read_metrics,
    short_name,
)


def read_tb_events(workdir):
    """Parses TFRecord-framed `Event` protos from the event files (no tensorboard package needed)."""
    from tensorboardX.proto import event_pb2
    events = []
    for path in sorted(glob.glob(os.path.join(workdir, "tb", "events.out.tfevents.*"))):
        data = open(path, "rb").read()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[pos + 12:pos + 12 + length])  # skip length + its crc
            events.append(event)
            pos += 12 + length + 4  # payload + its crc
    return events


def scalars_by_tag(events):
    out = {}
    for e in events:
        for v in e.summary.value:
            out.setdefault(v.tag, []).append((e.step, v.simple_value))
    return out


def test_jsonl_round_trip_types_and_nonfinite(tmp_path, caplog):
    import jax.numpy as jnp
    w = MetricsWriter(tmp_path, tensorboard=False)
    with caplog.at_level(logging.WARNING):
        w.write(0, {"actor/pg_loss": 0.5, "actor/entropy": np.float32(1.25),
                    "critic/score/mean": jnp.asarray(0.75), "num_turns/mean": np.int64(3),
                    "response_length/mean": jnp.asarray([42.0]), "flag": True})
        w.write(1, {"actor/pg_loss": float("nan"), "actor/kl_loss": np.inf,
                    "bad/vector": np.ones(3), "bad/text": "hello"})
        w.write(2, {"actor/pg_loss": jnp.asarray(float("nan"))})
        assert w.nonfinite_counts == {"actor/pg_loss": 2, "actor/kl_loss": 1}
        assert w.rejected_counts == {"bad/vector": 1, "bad/text": 1}
        w.close()
    lines = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
    assert lines[0]["event"] == "open" and lines[0]["resume_step"] is None
    assert all("step" in l and isinstance(l["time"], float) for l in lines[1:])
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2]
    r0 = rows[0]
    assert r0["actor/pg_loss"] == 0.5 and r0["actor/entropy"] == 1.25 and r0["critic/score/mean"] == 0.75
    assert r0["num_turns/mean"] == 3 and isinstance(r0["num_turns/mean"], int)
    assert r0["response_length/mean"] == 42.0 and r0["flag"] is True
    assert rows[1]["actor/pg_loss"] is None and rows[1]["actor/kl_loss"] is None
    assert "bad/vector" not in rows[1] and "bad/text" not in rows[1]
    text = caplog.text
    assert text.count("'actor/pg_loss' is nan") == 1  # counted, not repeated every step
    assert "'actor/pg_loss' is nan at step 1; written as null (1 time so far" in text
    assert "shape (3,)" in text
    assert "non-finite values written as null: {'actor/pg_loss': 2, 'actor/kl_loss': 1}" in text


def test_resume_drops_steps_of_killed_run(tmp_path):
    w = MetricsWriter(tmp_path, tensorboard=False)
    for step in range(10):
        w.write(step, {"critic/score/mean": step / 10})
    w.write(3, {"val/accuracy": 0.4})  # second write to a step in one session merges
    w.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 10, "critic/sc')  # killed mid-write
    w = MetricsWriter(tmp_path, tensorboard=False, resume_step=6)
    w.write(6, {"critic/score/mean": 0.66})
    w.write(7, {"critic/score/mean": 0.77})
    w.close()
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(8))  # 8, 9 (and broken 10) from the killed run gone
    assert rows[3] == {**rows[3], "critic/score/mean": 0.3, "val/accuracy": 0.4}
    assert rows[6]["critic/score/mean"] == 0.66 and rows[7]["critic/score/mean"] == 0.77
    # Re-opened without a resume step: a re-logged step replaces the old one wholesale.
    w = MetricsWriter(tmp_path, tensorboard=False)
    w.write(3, {"critic/score/mean": 0.33})
    w.close()
    rows = read_metrics(tmp_path)
    assert rows[3]["critic/score/mean"] == 0.33 and "val/accuracy" not in rows[3]
    assert len(rows) == 8


def test_tensorboard_events_hold_tags_and_values(tmp_path):
    with MetricsWriter(tmp_path, jsonl=False) as w:
        w.write(1, {"actor/pg_loss": 0.25, "timing_s/gen": np.float64(1.5)})
        w.write(2, {"actor/pg_loss": float("nan"), "val/accuracy": 0.5})
    assert not os.path.exists(tmp_path / "metrics.jsonl")
    events = read_tb_events(tmp_path)
    assert events and events[0].file_version.startswith("brain.Event")
    tags = scalars_by_tag(events)
    assert tags["actor/pg_loss"] == [(1, 0.25)]  # the NaN was not written
    assert tags["timing_s/gen"] == [(1, 1.5)] and tags["val/accuracy"] == [(2, 0.5)]
    with MetricsWriter(tmp_path, jsonl=False, resume_step=2) as w:  # TensorBoard purges >= 2
        w.write(2, {"actor/pg_loss": 0.125})
    events = read_tb_events(tmp_path)
    starts = [e.step for e in events if e.session_log.status == e.session_log.START]
    assert starts == [2]
    assert scalars_by_tag(events)["actor/pg_loss"][-1] == (2, 0.125)


def test_disabled_writer_writes_nothing(tmp_path):
    with MetricsWriter(tmp_path / "run", enabled=False) as w:
        w.write(0, {"a": 1.0})
    assert not os.path.exists(tmp_path / "run")


def test_plot_curves_png(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        for step in range(60):
            w.write(step, {"critic/score/mean": 0.2 + 0.01 * step, "actor/pg_loss": math.sin(step),
                           "response_length/mean": 100 + step})
            if step % 20 == 0:
                w.write(step, {"val/accuracy": 0.1 * step / 20})
    path = plot_curves(tmp_path)
    assert path == os.path.join(tmp_path, "curves.png")
    with Image.open(path) as img:
        assert img.format == "PNG"
        w_px, h_px = img.size
        assert 1000 <= w_px <= 1400 and 600 <= h_px <= 800  # 2x2 grid of 6x3.6 in at 100 dpi
        pixels = np.asarray(img.convert("L"))
    assert pixels.std() > 5  # something was drawn
    single = plot_curves(tmp_path, keys=["val/accuracy", "not/logged"], out_png=tmp_path / "sub" / "v.png")
    with Image.open(single) as img:
        assert img.size[0] < 700  # one column
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_curves(tmp_path, keys=["not/logged"])


def test_markdown_table():
    rows = [{"benchmark": "gsm8k", "acc": 0.91234, "n": 1319},
            {"benchmark": "hle|sub", "acc": None, "n": np.int64(500)}]
    assert markdown_table(rows) == (
        "| benchmark |    acc |    n |\n"
        "| --------- | -----: | ---: |\n"
        "| gsm8k     | 0.9123 | 1319 |\n"
        "| hle\\|sub  |        |  500 |")
    lines = markdown_table(rows, {"benchmark": "Benchmark", "acc": "Accuracy"}, floatfmt=".1%").split("\n")
    assert lines == ["| Benchmark | Accuracy |",
                     "| --------- | -------: |",
                     "| gsm8k     |    91.2% |",
                     "| hle\\|sub  |          |"]
    with pytest.raises(ValueError):
        markdown_table([], [])


def test_progress_bar_postfix_and_fallback_logging(monkeypatch, caplog):
    assert short_name("actor/pg_loss") == "pg_loss" and short_name("critic/score/mean") == "score"
    assert short_name("foo/bar/mean") == "bar"
    out = io.StringIO()
    with ProgressBar(10, "grpo", keys=["critic/score/mean", "actor/pg_loss"], disable=False, file=out) as bar:
        bar.update(1, {"critic/score/mean": np.float32(0.5), "actor/pg_loss": 0.123456, "other": 3})
        bar.update(1, {"actor/pg_loss": float("nan")})
    text = out.getvalue()
    assert "grpo" in text and "2/10" in text and "score=0.5" in text and "pg_loss=nan" in text
    assert "other" not in text
    monkeypatch.setenv("REAGENT_NO_PROGRESS", "1")
    assert progress_enabled() is False
    out = io.StringIO()
    with caplog.at_level(logging.INFO), ProgressBar(4, "eval", keys={"val/accuracy": "acc"},
                                                    log_every=2, file=out) as bar:
        for step in range(4):
            bar.update(1, {"val/accuracy": step / 4})
    assert out.getvalue() == ""  # the bar itself is off
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("eval step")]
    assert logged == ["eval step 2/4 acc=0.25", "eval step 4/4 acc=0.75"]
