"""A team's module found and hashed without importing it: a change anywhere in its package is a new hash, and a
planted link (a loop, a device) is neither followed nor read."""

from __future__ import annotations

import os

from dinox.plan import user_entry


def _package(root):
    (root / "mypkg" / "sub").mkdir(parents=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "recipe.py").write_text("def build(ctx):\n    return None\n")
    (root / "mypkg" / "sub" / "helper.py").write_text("X = 1\n")


def test_a_change_anywhere_in_the_package_is_a_new_hash_and_nothing_is_imported(tmp_path):
    _package(tmp_path)
    (tmp_path / "mypkg" / "__init__.py").write_text("raise SystemExit('imported')\n")  # would end this test
    sha, file, root = user_entry.source_hash("mypkg.recipe:build", str(tmp_path))
    assert (file, root) == (tmp_path / "mypkg" / "recipe.py", tmp_path)
    (tmp_path / "mypkg" / "sub" / "helper.py").write_text("X = 2\n")
    assert user_entry.source_hash("mypkg.recipe:build", str(tmp_path))[0] != sha
    (tmp_path / "lone.py").write_text("def build(ctx): ...\n")
    lone = user_entry.source_hash("lone:build", str(tmp_path))
    (tmp_path / "mypkg" / "recipe.py").write_text("# another package's change\n")
    assert user_entry.source_hash("lone:build", str(tmp_path))[0] == lone[0]  # a lone module: its own file


def test_planted_links_are_neither_followed_nor_read(tmp_path):
    _package(tmp_path)
    sha = user_entry.source_hash("mypkg.recipe:build", str(tmp_path))[0]
    os.symlink("..", tmp_path / "mypkg" / "loop")  # a directory loop
    os.symlink("/dev/zero", tmp_path / "mypkg" / "zero.py")  # endless bytes
    os.mkfifo(tmp_path / "mypkg" / "fifo.py")  # a read that never returns
    assert user_entry.source_hash("mypkg.recipe:build", str(tmp_path))[0] == sha


def test_a_module_that_is_not_there_says_where_it_looked(tmp_path):
    try:
        user_entry.source_hash("nope.mod:build", str(tmp_path), "data")
    except user_entry.EntryNotFound as e:
        assert f"not in {tmp_path} (data.path)" in str(e) and "nope/mod.py" in str(e)
    else:
        raise AssertionError("found a module that is not there")


def test_a_namespace_package_and_a_nested_package_are_found_as_python_would_find_them(tmp_path):
    """Python's path finder, not a hand walk: a namespace package (no __init__.py) holds the entry's module,
    and a folder named like the module without an __init__ does not hide the module file beside it."""
    (tmp_path / "ns" / "team").mkdir(parents=True)  # ns: namespace; ns/team: namespace too
    (tmp_path / "ns" / "team" / "recipe.py").write_text("def build(ctx): ...\n")
    sha, file, root = user_entry.source_hash("ns.team.recipe:build", str(tmp_path))
    assert (file, root) == (tmp_path / "ns" / "team" / "recipe.py", tmp_path) and len(sha) == 64
    (tmp_path / "step").mkdir()  # a data folder called step/ beside step.py: the module is step.py
    (tmp_path / "step.py").write_text("def build(ctx): ...\n")
    assert user_entry.locate("step:build", str(tmp_path)) == (tmp_path / "step.py", tmp_path)
