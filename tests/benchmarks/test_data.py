"""The dataset read benchmark (launch/bench.py --mode=data) runs end to end on a small dataset."""
import pytest

pytest.importorskip("tensorflow_datasets")

from reagent_jax.benchmarks import data as bench  # noqa: E402


def test_data_benchmark_reports_every_source_and_loader_setting():
    out = bench.run(num_records=1000, reads=2000, workers=(0, 1))
    assert out["num_records"] == 1000 and out["build_s"] > 0
    for name in ("jsonl", "array_record"):
        row = out[name]
        assert row["records_per_s"] == pytest.approx(2000 / row["read_s"], rel=0.05)  # read_s is rounded
        assert row["open_plus_read_s"] == pytest.approx(row["open_s"] + row["read_s"], abs=2e-3)
        assert row["loader_records_per_s_0_workers"] > 0 and row["loader_records_per_s_1_workers"] > 0
        assert -1.0 <= row["rss_growth_mb"] < 100  # a fresh process: not the builder's freed memory (was -90)
