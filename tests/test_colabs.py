"""The Colab notebooks run top to bottom (nbclient, a real IPython kernel) with their small settings.

Each notebook reads REAGENT_COLAB_SMALL=1 (tiny world, model and schedules) and
REAGENT_COLAB_WORKDIR (where it writes); any cell error fails the test. The static checks keep the
notebooks shippable: clean (no stored outputs), with a setup cell, a parameters cell and a
clearly marked GPU/TPU cell that is skipped on CPU.
"""
import os

import nbformat
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLABS = os.path.join(ROOT, "colabs")
NOTEBOOKS = ["01_quickstart_agent.ipynb", "02_agent_rrm.ipynb", "03_evalplanner_judge.ipynb"]
SKIP_LINE = "skipped: set RUN_ON_ACCELERATOR = True"


def read(name):
    return nbformat.read(os.path.join(COLABS, name), as_version=4)


def code_sources(nb):
    return [c.source for c in nb.cells if c.cell_type == "code"]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_clean_and_has_setup_and_accelerator_cells(name):
    nb = read(name)
    nbformat.validate(nb)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{name}: stored outputs; clear them"
    codes = code_sources(nb)
    assert "git clone" in codes[0] and "pip install -q -e" in codes[0]  # Colab install lines
    assert any("REAGENT_COLAB_SMALL" in c for c in codes)
    accel = [c for c in codes if "RUN_ON_ACCELERATOR = False" in c]
    assert len(accel) == 1, f"{name}: expected one accelerator cell guarded by RUN_ON_ACCELERATOR = False"
    assert "load_hf_checkpoint(CHECKPOINT" in accel[0] and "mesh_from_preset" in accel[0]
    assert "chat.load_tokenizer(CHECKPOINT)" in accel[0] and SKIP_LINE in accel[0]
    text = "\n".join(c.source for c in nb.cells)
    assert 'jax[cuda12]==0.10.2' in text and 'jax[tpu]==0.10.2' in text


def outputs_text(nb):
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                out.append(o.get("text", ""))
            elif "data" in o and "text/plain" in o["data"]:
                out.append(o["data"]["text/plain"])
    return "\n".join(out)


def has_image(nb):
    return any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


# name -> strings the executed notebook must print (each shows a step actually ran)
EXPECT = {
    "01_quickstart_agent.ipynb": ["| random_init", "| grpo", "sampled by the policy (loss mask)",
                                  "SmolLM2 on a GSM8K question: score"],
    "02_agent_rrm.ipynb": ["misread_value", "attempt 1 accuracy", "local Agent-RRM"],
    "03_evalplanner_judge.ipynb": ["DPO pairs", "| dpo_r2", "plans for"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes_with_small_settings(name, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("REAGENT_COLAB_SMALL", "1")
    monkeypatch.setenv("REAGENT_COLAB_WORKDIR", str(tmp_path / "work"))
    monkeypatch.setenv("REAGENT_NO_PROGRESS", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = read(name)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": COLABS}})
    client.execute()  # raises CellExecutionError (with the cell and traceback) on any cell error
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    text = outputs_text(nb)
    for want in EXPECT[name] + [SKIP_LINE]:
        assert want in text, f"{name}: expected {want!r} in the outputs"
    assert has_image(nb), f"{name}: no plot was drawn"
    assert os.listdir(tmp_path / "work"), "the notebook wrote nothing to REAGENT_COLAB_WORKDIR"
