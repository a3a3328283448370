"""`pip install -e .` alone installs what `import reagent_jax` needs: pyproject.toml declares the
same pins as requirements.txt (and its `test` extra those of requirements-test.txt)."""
import os
import tomllib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pins(name):
    lines = (line.split("#")[0].strip() for line in open(os.path.join(REPO, name)))
    return [line for line in lines if line and not line.startswith("-r")]


def test_pyproject_declares_the_requirements_pins():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["dependencies"] == _pins("requirements.txt")
    assert project["optional-dependencies"]["test"] == _pins("requirements-test.txt")
    assert all("==" in pin for pin in project["dependencies"])
