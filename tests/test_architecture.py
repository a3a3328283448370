"""The package's import graph, read with `ast` (nothing imported): packages form the layered DAG
of docs/architecture.md, no function imports a project module, and the kernel-backend seam is
the only place that knows which backend runs."""
import ast
import collections
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.join(REPO, "reagent_jax")

# A package may import only packages of a lower layer (docs/architecture.md, "Layers").
LAYERS = (
    ("cache", "parallel", "registry", "typed_config"),
    ("kernels", "metrics", "data", "chat", "endpoints", "rewards"),
    ("models",),
    ("rollout", "rl", "checkpoint"),
    ("agent", "serve"),
    ("trainers",),
    ("rrm",),
    ("evalplanner",),
    ("worlds", "eval"),
    ("pipelines",),
    ("aot",),
    ("benchmarks",),  # reads compiled programs with aot's HLO statistics
)
LAYER = {pkg: i for i, names in enumerate(LAYERS) for pkg in names}
# Function-local imports of project modules allowed, with the reason (none today).
LOCAL_IMPORTS_ALLOWED: dict[tuple[str, str], str] = {}


def modules():
    for dirpath, _, files in os.walk(ROOT):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                yield os.path.relpath(path, REPO)[:-3].replace(os.sep, ".").removesuffix(".__init__"), path


def imports(path):
    """(imported project module, inside a function?) for every import statement of the file."""
    out = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((a.name, in_function) for a in child.names if a.name.split(".")[0] == "reagent_jax")
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                if child.module == "reagent_jax":
                    out.extend((f"reagent_jax.{a.name}", in_function) for a in child.names)
                elif child.module.startswith("reagent_jax."):
                    out.append((child.module, in_function))
            visit(child, inside)

    visit(ast.parse(open(path).read()), False)
    return out


def package(module: str) -> str:
    """reagent_jax.rollout.engine -> rollout; a top-level module (cache.py) is its own package."""
    return module.split(".")[1] if module.count(".") else ""


def graph():
    """(package -> imported packages with the module making each edge, function-local imports)."""
    edges, local = collections.defaultdict(dict), []
    for mod, path in modules():
        for target, in_function in imports(path):
            if in_function:
                local.append((mod, target))
            elif package(mod) and package(target) != package(mod):
                edges[package(mod)].setdefault(package(target), mod)
    return edges, local


def cycles(edges) -> list[list[str]]:
    """Strongly connected components of more than one package (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


def test_packages_form_a_dag_in_the_documented_layers():
    edges, _ = graph()
    assert cycles(edges) == []
    packages = {package(m) for m, _ in modules()} - {""}
    assert packages <= set(LAYER), f"packages missing from LAYERS: {sorted(packages - set(LAYER))}"
    upward = [f"{src} ({by}) imports {dst}" for src, targets in edges.items() for dst, by in targets.items()
              if LAYER[dst] >= LAYER[src]]
    assert upward == [], "imports that go up or sideways in the layers:\n" + "\n".join(upward)


def test_no_function_local_imports_of_project_modules():
    _, local = graph()
    bad = [f"{m} imports {t} inside a function" for m, t in local if (m, t) not in LOCAL_IMPORTS_ALLOWED]
    assert bad == [], "\n".join(bad)


def test_only_the_kernel_seam_chooses_backends():
    """kernels/ imports nothing above parallel/; the model and the engine never look at the
    backend themselves (no mesh_platform, no backend-specific kernel modules)."""
    edges, _ = graph()
    assert set(edges["kernels"]) <= {"parallel"}
    for rel in ("models/qwen3.py", "models/functional.py", "rollout/kernels.py", "rollout/engine.py"):
        text = open(os.path.join(ROOT, rel)).read()
        assert "mesh_platform" not in text and "default_backend" not in text, rel
        assert not any(t.startswith(("reagent_jax.kernels.cpu", "reagent_jax.kernels.gpu", "reagent_jax.kernels.tpu"))
                       for t, _ in imports(os.path.join(ROOT, rel))), rel


@pytest.mark.parametrize("case", ["cycle", "local", "upward"])
def test_the_checks_catch_what_they_are_for(case, tmp_path, monkeypatch):
    """The same checks on a small hand-made package fail as they should."""
    pkg = tmp_path / "reagent_jax"
    for sub in ("parallel", "models"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    lower = {"cycle": "from reagent_jax.models import x\n", "local": "def f():\n    from reagent_jax.models import x\n",
             "upward": "from reagent_jax.models import x\n"}[case]
    (pkg / "parallel" / "a.py").write_text(lower)
    (pkg / "models" / "b.py").write_text("from reagent_jax.parallel import a\n" if case == "cycle" else "")
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "ROOT", str(pkg))
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "REPO", str(tmp_path))
    edges, local = graph()
    if case == "cycle":
        assert cycles(edges) == [["models", "parallel"]]
    elif case == "local":
        assert local == [("reagent_jax.parallel.a", "reagent_jax.models")]
    else:
        assert LAYER[next(iter(edges["parallel"]))] >= LAYER["parallel"]
