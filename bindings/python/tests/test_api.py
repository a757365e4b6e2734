"""The package's surface: the README's example runs as written, the type
stubs name what the module has, and every public name has a docstring."""

from __future__ import annotations

import ast
import pathlib
import re

import ringfence as rf
from ringfence import _ringfence

HERE = pathlib.Path(__file__).resolve().parent
README = HERE.parent / "README.md"
STUB = HERE.parent / "python" / "ringfence" / "_ringfence.pyi"


def test_the_readme_example_runs():
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README.md has no python example"
    exec(compile(blocks[0], str(README), "exec"), {"__name__": "readme"})


def stub_names():
    tree = ast.parse(STUB.read_text())
    top, members = set(), {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            top.add(node.name)
            members[node.name] = {n.name for n in node.body
                                  if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        elif isinstance(node, ast.FunctionDef):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            top.add(node.target.id)
    return top, members


def test_the_stubs_name_what_the_module_has():
    top, members = stub_names()
    runtime = {n for n in dir(_ringfence) if not n.startswith("__") or n == "__version__"}
    runtime -= {"_ringfence"}
    assert runtime == top, (runtime ^ top)
    for cls, names in members.items():
        have = {n for n in dir(getattr(_ringfence, cls))
                if not n.startswith("__") or n in names}
        public = {n for n in have if not n.startswith("__")}
        stubbed = {n for n in names if not n.startswith("__")}
        assert public == stubbed, (cls, public ^ stubbed)
        for n in names - {"__init__", "__buffer__"}:
            assert hasattr(getattr(_ringfence, cls), n), (cls, n)


def test_every_public_name_is_documented():
    for name in rf.__all__:
        obj = getattr(rf, name)
        if callable(obj):
            assert obj.__doc__ and obj.__doc__.strip(), name
        if isinstance(obj, type) and obj.__module__ == "ringfence":
            for attr, value in vars(obj).items():
                if not attr.startswith("_"):
                    assert getattr(value, "__doc__", None), f"{name}.{attr}"
