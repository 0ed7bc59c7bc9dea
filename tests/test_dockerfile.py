"""Dockerfile.l4t, parsed (no container engine runs here): its stages and build arguments, that it installs
what pyproject.toml packages with the extra README "On a Jetson" installs, and that the final stage adds only
the venv built in the build stage.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Dict, List

import pytest

dockerfile_parse = pytest.importorskip("dockerfile_parse", reason="dockerfile-parse is not installed (pip install -e '.[test]')")
try:
    import tomllib
except ImportError:  # Python < 3.11: pytest depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile.l4t"


def instructions() -> List[dict]:
    with DOCKERFILE.open("rb") as f:
        parser = dockerfile_parse.DockerfileParser(fileobj=f)
        return [i for i in parser.structure if i["instruction"] != "COMMENT"]


def global_args() -> Dict[str, str]:
    """ARGs before the first FROM (usable in FROM lines), name -> default."""
    args = {}
    for i in instructions():
        if i["instruction"] == "FROM":
            break
        if i["instruction"] == "ARG":
            name, _, default = i["value"].partition("=")
            args[name] = default
    return args


def stages() -> Dict[str, dict]:
    """stage name -> {"from": image, "body": [instructions]} in file order."""
    result: Dict[str, dict] = {}
    current = None
    for i in instructions():
        if i["instruction"] == "FROM":
            image, _, name = i["value"].partition(" AS ")
            current = result.setdefault(name.strip(), {"from": image.strip(), "body": []})
        elif current is not None:
            current["body"].append(i)
    return result


def readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def test_base_chosen_by_build_argument_jetpack6_by_default():
    args = global_args()
    assert args["JETPACK"] == "6"
    assert "r36" in args["BASE_JP6"] and "l4t-pytorch" in args["BASE_JP6"]
    assert "r35" in args["BASE_JP5"] and "l4t-pytorch" in args["BASE_JP5"]
    found = stages()
    for jetpack in ("6", "5", "custom"):
        assert f"base-jp{jetpack}" in found
    assert found["base-jp6"]["from"] == "${BASE_JP6}" and found["base-jp5"]["from"] == "${BASE_JP5}"
    # the build and the final stage both start from the base that JETPACK names
    assert found["build"]["from"] == found["runtime"]["from"] == "base-jp${JETPACK}"
    assert list(found)[-1] == "runtime"


def test_final_stage_adds_only_the_venv_and_runs_mtbench():
    runtime = stages()["runtime"]["body"]
    kinds = [i["instruction"] for i in runtime]
    assert "RUN" not in kinds  # nothing installed or compiled in the final image
    copies = [i["value"] for i in runtime if i["instruction"] == "COPY"]
    assert copies == ["--from=build /opt/mtbench /opt/mtbench"]
    entrypoint = [i["value"] for i in runtime if i["instruction"] == "ENTRYPOINT"]
    assert entrypoint == ['["mtbench"]']


def test_build_stage_installs_what_pyproject_packages_with_the_readmes_extra():
    build = stages()["build"]["body"]
    copied = set()
    for i in build:
        if i["instruction"] == "COPY":
            *sources, _dest = shlex.split(i["value"])
            copied.update(sources)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    data_dirs = {src.split("/")[0] for srcs in pyproject["tool"]["setuptools"]["data-files"].values() for src in srcs}
    needed = packages | data_dirs | {"pyproject.toml", pyproject["project"]["readme"]}
    assert needed <= copied, f"not copied into the build: {needed - copied}"

    installs = [i["value"] for i in build if i["instruction"] == "RUN" and '"/src[' in i["value"]]
    assert len(installs) == 1
    docker_extras = set(re.search(r'"/src\[([^\]]*)\]"', installs[0]).group(1).split(","))
    assert "--constraint /opt/pins.txt" in installs[0]  # the base's torch is never replaced
    readme_extras = set()
    for match in re.finditer(r"pip install -e '\.\[([^\]]*)\]'", readme_section("On a Jetson")):
        readme_extras.update(match.group(1).split(","))
    assert readme_extras and docker_extras == readme_extras == {"jetson"}
    assert set(docker_extras) <= set(pyproject["project"]["optional-dependencies"])


def test_readme_build_and_run_commands_match_the_file():
    section = readme_section("On a Jetson")
    declared = set(global_args())
    for stage in stages().values():
        declared.update(i["value"].partition("=")[0] for i in stage["body"] if i["instruction"] == "ARG")
    used = set(re.findall(r"--build-arg (\w+)=", section))
    assert used and used <= declared, used - declared
    assert "docker build -f Dockerfile.l4t" in section
    assert "not built in CI" in section
    runs = [line for line in section.splitlines() if line.startswith("docker run")]
    assert any("--runtime nvidia" in line and "sampler=jetson" in line for line in runs)
    assert "-v /run/jtop.sock:/run/jtop.sock" in section


def test_dockerignore_keeps_what_the_build_copies():
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    for name in ("pyproject.toml", "README.md", "mtbench", "models", "conf"):
        assert name not in ignored
    for heavy in (".git", "build", "outputs", "multirun"):
        assert heavy in ignored
