"""The file tools read only where they are allowed: inside the configured roots (after `..` and
symlinks), never the kernel's pseudo-filesystems; the refusal is a readable tool error."""

from __future__ import annotations

import os
import wave

import pytest

from reagent_jax.agent import tools
from reagent_jax.agent.tools.base import ToolError
from reagent_jax.agent.tools.local_files import resolve_local_path


@pytest.fixture()
def tree(tmp_path):
    """root/ with a note, a sub-folder and a symlink pointing out of root; outside/ with a secret."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "note.txt").write_text("inside note")
    (root / "sub" / "deep.txt").write_text("deep note")
    (outside / "secret.txt").write_text("TOP SECRET")
    (root / "escape.txt").symlink_to(outside / "secret.txt")
    (root / "escape_dir").symlink_to(outside)
    (outside / "in_link.txt").symlink_to(root / "note.txt")
    with wave.open(str(outside / "talk.wav"), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(8000), w.writeframes(b"\0\0" * 800)
    return root, outside


@pytest.mark.parametrize("path,allowed", [
    ("note.txt", True),
    ("sub/deep.txt", True),
    ("sub/../note.txt", True),
    ("./sub/./deep.txt", True),
    ("{root}/note.txt", True),
    ("file://{root}/note.txt", True),
    ("  note.txt  ", True),
    ("{outside}/in_link.txt", True),          # a link from outside into root reads the file in root
    ("../outside/secret.txt", False),
    ("sub/../../outside/secret.txt", False),
    ("{outside}/secret.txt", False),
    ("file://{outside}/secret.txt", False),
    ("escape.txt", False),                    # symlink out of root
    ("escape_dir/secret.txt", False),
    ("/etc/passwd", False),
    ("/proc/self/environ", False),
    ("{root}_sibling/x.txt", False),          # a sibling whose name starts with the root's
])
def test_resolve_with_root(tree, path, allowed):
    root, outside = tree
    path = path.format(root=root, outside=outside)
    if allowed:
        real = resolve_local_path(path, str(root))
        assert real.startswith(os.path.realpath(root) + os.sep)
    else:
        with pytest.raises(ToolError) as err:
            resolve_local_path(path, str(root))
        assert err.value.kind == "permission_denied" and repr(path) in str(err.value)


def test_several_roots_and_relative_paths_use_the_first(tree, tmp_path):
    root, outside = tree
    roots = os.pathsep.join([str(root), str(outside)])
    assert resolve_local_path(f"{outside}/secret.txt", roots) == os.path.realpath(outside / "secret.txt")
    assert resolve_local_path("note.txt", roots) == os.path.realpath(root / "note.txt")
    assert resolve_local_path("escape.txt", roots) == os.path.realpath(outside / "secret.txt")
    assert resolve_local_path("note.txt", [str(root)]) == os.path.realpath(root / "note.txt")


@pytest.mark.parametrize("path", ["/proc/self/environ", "/proc/1/cmdline", "/sys/kernel", "/dev/zero",
                                  "file:///proc/self/environ", "/tmp/../proc/self/maps"])
def test_without_root_pseudo_filesystems_are_refused(path):
    with pytest.raises(ToolError) as err:
        resolve_local_path(path, None)
    assert err.value.kind == "permission_denied" and "pseudo-filesystem" in str(err.value)


def test_without_root_ordinary_files_are_allowed(tree):
    root, _ = tree
    assert resolve_local_path(str(root / "note.txt")) == os.path.realpath(root / "note.txt")
    with pytest.raises(ToolError) as err:
        resolve_local_path("a\x00b")
    assert err.value.kind == "bad_arguments"


def test_every_file_tool_applies_the_root(tree, monkeypatch):
    root, outside = tree
    monkeypatch.setenv("REAGENT_FILES_ROOT", str(root))
    monkeypatch.delenv("REAGENT_ASR_BASE_URL", raising=False)
    monkeypatch.delenv("REAGENT_VISION_BASE_URL", raising=False)
    reader = tools.get("file_reader")
    assert reader.call({"path": "note.txt"}).text == "inside note"
    for name, args in [("file_reader", {"path": str(outside / "secret.txt")}),
                       ("file_reader", {"path": "escape.txt"}),
                       ("image2text", {"path": str(outside / "secret.txt")}),
                       ("audio2text", {"path": str(outside / "talk.wav")}),
                       ("browse", {"url": f"file://{outside}/secret.txt"}),
                       ("browse", {"url": str(outside / "secret.txt")})]:
        out = tools.get(name).call(args)
        assert not out.ok and out.error_kind == "permission_denied", (name, out.text)
        assert "TOP SECRET" not in out.text
    page = tools.get("browse").call({"url": "note.txt"})
    assert page.ok and "inside note" in page.text, page.text


def test_without_root_the_model_cannot_read_the_process_environment(monkeypatch):
    monkeypatch.delenv("REAGENT_FILES_ROOT", raising=False)
    monkeypatch.setenv("REAGENT_TEST_API_KEY", "sk-should-never-leak")
    for name, args in [("file_reader", {"path": "/proc/self/environ"}),
                       ("browse", {"url": "file:///proc/self/environ"})]:
        out = tools.get(name).call(args)
        assert out.error_kind == "permission_denied" and "sk-should-never-leak" not in out.text
