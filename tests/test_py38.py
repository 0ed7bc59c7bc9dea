"""Package code runs on Python 3.8 (JetPack 5): vermin finds no newer syntax or library use in mtbench/ and models/.

vermin does not see two runtime uses that fail on 3.8 only when the line runs: a builtin generic subscripted
outside an annotation (`list[int]` as a value, 3.9+) and a `X | Y` union of types outside one (3.10+); an
AST walk below covers those. Annotations themselves are strings under `from __future__ import annotations`,
which every module with code must have. benchmarks/compat.sh runs the whole suite on a real Python 3.8.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("mtbench", "models")
BUILTIN_GENERICS = {"list", "dict", "tuple", "set", "frozenset", "type"}
TYPE_NAMES = BUILTIN_GENERICS | {"int", "float", "str", "bytes", "bool", "object"}

vermin = pytest.importorskip("vermin", reason="vermin is not installed (pip install -e '.[test]')")


def package_files() -> List[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def run_vermin(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        # vermin has no __main__ module: call its console entry point
        [sys.executable, "-c", "import sys, vermin; sys.exit(vermin.main())", "--target=3.8-", "--no-tips", "--violations", "--eval-annotations",
         "--no-parse-comments", *map(str, paths)],
        capture_output=True, text=True, timeout=120,
    )


def test_vermin_finds_nothing_newer_than_python_38():
    result = run_vermin(*(ROOT / pkg for pkg in PACKAGES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_vermin_check_fails_on_newer_code(tmp_path):
    # the check above can fail: the same command rejects what 3.8 cannot run
    bad = tmp_path / "bad.py"
    bad.write_text('name = "mtbench-x".removeprefix("mtbench-")\n'
                   'd = {"a": 1} | {"b": 2}\n')
    result = run_vermin(bad)
    assert result.returncode != 0
    assert "str.removeprefix" in result.stdout and "dict union" in result.stdout


def _annotation_ids(tree: ast.AST) -> set:
    """ids of every node inside an annotation (these are strings under the __future__ import)."""
    ids = set()
    for node in ast.walk(tree):
        annotations = []
        if isinstance(node, ast.arg) and node.annotation is not None:
            annotations.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            annotations.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        for annotation in annotations:
            ids.update(id(n) for n in ast.walk(annotation))
    return ids


def _is_type_operand(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in TYPE_NAMES
    if isinstance(node, ast.Constant):
        return node.value is None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _is_type_operand(node.left) and _is_type_operand(node.right)
    return False


def runtime_typing_problems(source: str, name: str) -> Iterator[str]:
    tree = ast.parse(source, name)
    in_annotation = _annotation_ids(tree)
    for node in ast.walk(tree):
        if id(node) in in_annotation:
            continue
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in BUILTIN_GENERICS:
            yield f"{name}:{node.lineno}: {node.value.id}[...] outside an annotation needs Python 3.9 (use typing.{node.value.id.capitalize()})"
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr)
                and _is_type_operand(node.left) and _is_type_operand(node.right)):
            yield f"{name}:{node.lineno}: a `X | Y` type union outside an annotation needs Python 3.10 (use a tuple or typing.Union)"


def test_no_runtime_generics_or_type_unions():
    problems = [p for path in package_files()
                for p in runtime_typing_problems(path.read_text(), str(path.relative_to(ROOT)))]
    assert problems == []


def test_runtime_typing_check_catches_both_kinds():
    source = "from __future__ import annotations\nx: list[int] = []\ny = list[int]\nisinstance(1, int | None)\n"
    problems = list(runtime_typing_problems(source, "bad.py"))
    assert len(problems) == 2 and "bad.py:3" in problems[0] and "bad.py:4" in problems[1]


def test_every_module_with_code_has_future_annotations():
    missing = []
    for path in package_files():
        body = ast.parse(path.read_text()).body
        code = [n for n in body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        if code and not any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
                            and any(a.name == "annotations" for a in n.names) for n in code):
            missing.append(str(path.relative_to(ROOT)))
    assert missing == [], "these modules lack `from __future__ import annotations`"
