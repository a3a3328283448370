"""Metrics edge cases: strict-JSON files whatever the values, NumPy resume steps, resumed runs that
neither lose nor duplicate steps, plots of sparse / NaN / single-key data, tables with missing
columns, progress logging with unknown totals and multi-step updates."""
import json
import logging
import os
import re

import numpy as np
import pytest
from PIL import Image

from reagent_jax.metrics import MetricsWriter, ProgressBar, markdown_table, plot_curves, read_metrics


def _strict_lines(path):
    """Every line parsed by a JSON parser that refuses NaN / Infinity (not valid JSON)."""
    def refuse(token):
        raise ValueError(f"non-standard JSON constant {token}")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line, parse_constant=refuse) for line in f if line.strip()]


@pytest.mark.parametrize("value, expected", [
    (float("nan"), None), (float("inf"), None), (-np.inf, None), (np.float32("nan"), None),
    (np.float16(0.5), 0.5), (np.int64(7), 7), (np.bool_(True), True), (2 ** 70, 2 ** 70), (-0.0, 0.0),
])
def test_values_are_strict_json_and_round_trip(tmp_path, value, expected):
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        w.write(1, {"m": value, "ok": 1.5})
    lines = _strict_lines(tmp_path / "metrics.jsonl")
    assert lines[-1]["m"] == expected and lines[-1]["ok"] == 1.5
    assert read_metrics(tmp_path) == [lines[-1]]


def test_none_and_non_numbers_are_skipped_not_written(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        w.write(1, {"none": None, "text": "x", "vec": np.zeros(2), "ok": 1})
    (row,) = read_metrics(tmp_path)
    assert set(row) == {"step", "time", "ok"}
    _strict_lines(tmp_path / "metrics.jsonl")


@pytest.mark.parametrize("resume", [np.int64(4), np.int32(4), 4])
def test_numpy_resume_step_is_accepted(tmp_path, resume):
    """A checkpoint step read back as a NumPy integer used to crash the writer (int64 is not JSON)."""
    with MetricsWriter(tmp_path / "run") as w:
        for step in range(1, 7):
            w.write(step, {"loss": float(step)})
    with MetricsWriter(tmp_path / "run", resume_step=resume) as w:
        w.write(4, {"loss": 40.0})
    lines = _strict_lines(tmp_path / "run" / "metrics.jsonl")
    assert lines[-2] == {**lines[-2], "event": "open", "resume_step": 4}
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path / "run")] == [(1, 1.0), (2, 2.0), (3, 3.0),
                                                                                (4, 40.0)]


def _logged_steps(sessions):
    """Plain-Python oracle of what a run logged: a resume at S forgets every earlier step >= S."""
    final = {}
    for resume, steps in sessions:
        if resume is not None:
            final = {s: v for s, v in final.items() if s < resume}
        for s in steps:
            final[s] = (resume, s)
    return sorted(final.items())


@pytest.mark.parametrize("sessions", [
    [(None, range(1, 11)), (6, range(6, 13))],             # killed after the checkpoint at 5
    [(None, range(1, 4)), (1, range(1, 6))],               # killed before the first checkpoint
    [(None, range(1, 8)), (4, range(4, 6)), (3, range(3, 10))],  # killed twice, second time earlier
    [(None, range(1, 5)), (5, range(5, 9))],               # clean resume: nothing dropped
])
def test_resumed_runs_lose_and_duplicate_no_step(tmp_path, sessions):
    for i, (resume, steps) in enumerate(sessions):
        w = MetricsWriter(tmp_path, tensorboard=False, resume_step=resume)
        for s in steps:
            w.write(s, {"session": float(i), "step_value": float(s)})
        w.close()
        if i < len(sessions) - 1:
            with open(tmp_path / "metrics.jsonl", "a") as f:
                f.write('{"step": 99, "session": ')  # killed mid-line
    rows = read_metrics(tmp_path)
    expected = _logged_steps(sessions)
    assert [r["step"] for r in rows] == [s for s, _ in expected]
    session_of = {}
    for i, (resume, steps) in enumerate(sessions):
        for s in steps:
            session_of[s] = i
    assert [r["session"] for r in rows] == [float(session_of[s]) for s, _ in expected]


def test_plot_curves_accepts_one_key_as_a_string(tmp_path):
    """keys="sft/nll" used to be read as the keys 's', 'f', 't', ... -> "nothing to plot"."""
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        for s in range(1, 4):
            w.write(s, {"sft/nll": 3.0 - s})
    path = plot_curves(tmp_path, keys="sft/nll")
    assert Image.open(path).size[0] > 100


@pytest.mark.parametrize("rows", [
    [{"val/accuracy": 0.5}],                                                      # a single point
    [{"sft/nll": float("nan")}, {"sft/nll": 2.0}, {"sft/nll": float("inf")}],     # NaN / inf among values
    [{"sft/nll": 1.0, "actor/pg_loss": float("nan")}, {"sft/nll": 0.5}],          # one key never finite
    [{"sft/nll": float(v)} for v in np.linspace(3, 1, 64)],                       # dense: smoothed curve
])
def test_plot_curves_sparse_nan_and_missing_keys(tmp_path, rows):
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        for s, row in enumerate(rows, start=1):
            w.write(s, row)
    path = plot_curves(tmp_path, out_png=tmp_path / "c.png")
    assert os.path.getsize(path) > 0 and Image.open(path).format == "PNG"
    path = plot_curves(tmp_path, keys=["sft/nll", "val/accuracy", "never/logged"], out_png=tmp_path / "d.png")
    assert Image.open(path).format == "PNG"


def test_plot_curves_with_nothing_finite_says_so(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        w.write(1, {"sft/nll": float("nan")})
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_curves(tmp_path)
    with pytest.raises(FileNotFoundError, match="no metrics file"):
        plot_curves(tmp_path / "empty")


def test_markdown_table_missing_columns_and_odd_values():
    rows = [{"policy": "a", "acc": 0.5}, {"policy": "b|c", "turns": np.int64(3)}, {"acc": float("nan")}]
    lines = markdown_table(rows).splitlines()
    cells = [[c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])] for line in lines]
    assert cells[0] == ["policy", "acc", "turns"]
    assert cells[2] == ["a", "0.5", ""] and cells[3] == ["b\\|c", "", "3"] and cells[4] == ["", "nan", ""]
    assert markdown_table([], columns={"acc": "accuracy"}).splitlines()[0].strip("| ") == "accuracy"
    with pytest.raises(ValueError, match="at least one column"):
        markdown_table([])


@pytest.mark.parametrize("total, log_every, steps, expected", [
    (None, 2, [3, 3], [3, 6]),        # unknown total; each update passes a multiple of 2
    (10, 4, [1] * 9, [4, 8]),
    (0, 5, [7, 1, 2], [7, 10]),
    (None, 3, [1, 1], []),
])
def test_progress_logs_every_multiple_reached(caplog, total, log_every, steps, expected):
    bar = ProgressBar(total, desc="run", keys=["loss"], disable=True, log_every=log_every)
    with caplog.at_level(logging.INFO):
        for n in steps:
            bar.update(n, {"loss": float("nan")})
    bar.close()
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("run step")]
    assert [int(m.split()[2].split("/")[0]) for m in logged] == expected
    suffix = f"/{total}" if total else ""
    assert all(m.split()[2].endswith(suffix) and "loss=nan" in m for m in logged)
