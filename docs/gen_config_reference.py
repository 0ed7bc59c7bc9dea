"""Writes docs/configuration-reference.md from conf/: every key with its default and its comment.

The comments in conf/*.yaml are the one description of each key; this page is made from them, so it cannot
drift from the defaults. A key's description is its trailing comment (and the comment lines aligned under it),
else the comment block right above it. Each group (conf/<group>/) is listed with its options and the first
line of each option file's opening comment, then every option's keys.

Run by mkdocs before each build (mkdocs.yml `hooks:`): the page is rewritten when conf/ changed, and a
warning then fails `mkdocs build --strict`, so a stale committed page is caught in CI. By hand:
`python docs/gen_config_reference.py` (writes the page) or `... --check` (exit 1 when it is stale).
The key scanner is checked against PyYAML: a key PyYAML loads that the scanner missed stops the build.
"""
from __future__ import annotations

import logging
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
PAGE = ROOT / "docs" / "configuration-reference.md"
GENERATOR = "docs/gen_config_reference.py"

log = logging.getLogger("mkdocs.hooks.gen_config_reference")

SKIP = ("hydra.help",)   # Hydra's help template (the text `mtbench --help` prints), not a setting

KEY_LINE = re.compile(r"^(?P<indent> *)(?P<dash>- +)?(?P<key>[A-Za-z_@/][\w@/.-]*) *:(?:\s+(?P<rest>.*))?$")


@dataclass
class Key:
    path: str           # dotted, as typed on the command line
    value: str          # the default as written in the file ("" for a mapping)
    comment: str = ""   # trailing comment, continued by aligned comment lines
    above: str = ""     # the comment block right above the key
    is_mapping: bool = False

    @property
    def description(self) -> str:
        return self.comment or self.above


@dataclass
class ConfFile:
    path: Path
    header: List[str] = field(default_factory=list)   # the opening comment block, directives left out
    package_global: bool = False
    defaults: List[Key] = field(default_factory=list)  # entries of a defaults list (group: option  # comment)
    keys: List[Key] = field(default_factory=list)


def split_comment(text: str) -> Tuple[str, str, int]:
    """(value, comment, column of '#' or -1) for the text after a key's colon; quotes may hold a '#'."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1] in " \t"):
            return text[:i].rstrip(), text[i + 1:].strip(), i
    return text.rstrip(), "", -1


def scan(path: Path) -> ConfFile:
    """The keys of one YAML file, with their comments, by reading its lines (PyYAML drops comments)."""
    conf = ConfFile(path)
    lines = path.read_text().splitlines()
    stack: List[Tuple[int, str]] = []   # (indent, key) of the mappings that enclose the current line
    above: List[str] = []
    last: Optional[Key] = None
    last_comment_col = -1
    block_indent: Optional[int] = None  # inside a block scalar (| or >): lines indented deeper belong to it
    in_header = True
    in_defaults: Optional[int] = None   # indent of the `defaults:` key while reading its list

    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip(" "))
        if block_indent is not None:
            if not stripped or indent > block_indent:
                continue
            block_indent = None
        if not stripped:
            in_header = False
            above = []
            continue
        if stripped.startswith("#"):
            text = stripped[1:].strip()
            if in_header and not conf.keys and not conf.defaults:
                if text.startswith("@package"):
                    conf.package_global = "_global_" in text
                else:
                    raw = stripped[1:]
                    conf.header.append(raw[1:] if raw.startswith(" ") else raw)  # keeps an example's indent
                continue
            if last is not None and last.comment and line.index("#") == last_comment_col:
                last.comment += " " + text   # a trailing comment continued on the next line, aligned
                continue
            above.append(text)
            continue
        in_header = False
        match = KEY_LINE.match(line)
        if match is None:
            above = []
            continue
        key_indent = indent + len(match.group("dash") or "")
        name = match.group("key")
        value, comment, col = split_comment(match.group("rest") or "")
        if col >= 0:
            col += len(line) - len(match.group("rest"))
        if in_defaults is not None and match.group("dash") and indent >= in_defaults:
            entry = Key(name, value, comment, " ".join(above))
            conf.defaults.append(entry)
            last, last_comment_col, above = entry, col, []
            continue
        in_defaults = None
        while stack and stack[-1][0] >= key_indent:
            stack.pop()
        dotted = ".".join([k for _, k in stack] + [name])
        if name == "defaults" and not stack:
            above = []
            if value.startswith("["):
                conf.defaults = [Key(v.strip(), "") for v in value.strip("[]").split(",") if v.strip()]
            else:
                in_defaults = indent
            last = None
            continue
        key = Key(dotted, value, comment, " ".join(above), is_mapping=value == "")
        if value in ("|", ">", "|-", ">-"):
            block_indent = indent
            key.value = "(text)"
        conf.keys.append(key)
        if key.is_mapping:
            stack.append((key_indent, name))
        last, last_comment_col, above = key, col, []
    check_against_yaml(conf)
    return conf


def leaf_paths(node, prefix: str = "") -> List[str]:
    if isinstance(node, dict):
        paths = []
        for k, v in node.items():
            if not prefix and k == "defaults":
                continue
            paths.extend(leaf_paths(v, f"{prefix}{k}."))
        return paths or [prefix.rstrip(".")]
    return [prefix.rstrip(".")]


def check_against_yaml(conf: ConfFile) -> None:
    loaded = yaml.safe_load(conf.path.read_text()) or {}
    scanned = {k.path for k in conf.keys}
    missed = [p for p in leaf_paths(loaded) if p and p not in scanned]
    if missed:
        raise SystemExit(f"{GENERATOR}: the scanner missed keys of {conf.path.relative_to(ROOT)}: {missed}")


def cell(text: str) -> str:
    """Comment text as a table cell: pipes escaped, and outside `code` spans a '<' that Markdown would take for
    HTML ("squad:<path>")."""
    parts = text.replace("\n", " ").split("`")
    parts[::2] = [p.replace("<", "&lt;") for p in parts[::2]]
    return "`".join(parts).replace("|", "\\|")


def first_sentence(lines: List[str]) -> str:
    """The header's first line, with the lines that continue its sentence, up to the sentence's end."""
    if not lines:
        return ""
    text = lines[0].strip()
    for line in lines[1:]:
        line = line.strip()
        if not line or not (line[0].islower() or text.endswith((",", ";", ":", "("))):
            break
        text += " " + line
    return re.split(r"(?<=[.)])\s+(?=[A-Z])", text, maxsplit=1)[0]


def prose(lines: List[str]) -> List[str]:
    """A header as Markdown: its lines joined into paragraphs, indented lines (example commands) as code."""
    out: List[str] = []
    para: List[str] = []
    codes: List[str] = []
    for line in lines + [""]:
        if line.startswith("  ") and line.strip():
            if para:
                out += [cell(" ".join(para)), ""]
                para = []
            codes.append(line.strip())
            continue
        if codes:
            out += ["```bash"] + codes + ["```", ""]
            codes = []
        if line.strip():
            para.append(line.strip())
    if para:
        out += [cell(" ".join(para)), ""]
    return out[:-1] if out and out[-1] == "" else out


def code(text: str) -> str:
    if not text:
        return ""
    # a backtick inside a value would end the code span: use a double-backtick span then
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def key_table(keys: List[Key], prefix: str = "") -> List[str]:
    rows = ["| key | default | description |", "| --- | --- | --- |"]
    for key in keys:
        if key.path.startswith(SKIP):
            continue
        if key.is_mapping and not key.description:
            continue
        default = "" if key.is_mapping else code(key.value)
        rows.append(f"| {code(prefix + key.path)} | {default} | {cell(key.description)} |")
    return rows


def group_section(group: Path, in_defaults: bool) -> List[str]:
    files = sorted(group.glob("*.yaml"))
    options = [f for f in files if not f.name.startswith("_")]
    bases = [f for f in files if f.name.startswith("_")]
    scanned: Dict[Path, ConfFile] = {f: scan(f) for f in files}
    out = [f"## {group.name}", ""]
    if in_defaults:
        out += [f"`{group.name}=<option>` picks one file of `conf/{group.name}/`.", ""]
    else:
        out += [f"Not in the defaults: `+{group.name}=<option>` adds one file of `conf/{group.name}/`.", ""]
    out += ["| option | what it is |", "| --- | --- |"]
    for f in options:
        out.append(f"| `{f.stem}` | {cell(first_sentence(scanned[f].header))} |")
    if bases:
        names = ", ".join(f"`{f.name}`" for f in bases)
        out += ["", f"Shared bases (not options; an option names them in its `defaults`): {names}."]
    for f in bases + options:
        conf = scanned[f]
        out += ["", f"### {f.stem}", "", f"`conf/{group.name}/{f.name}`"]
        if conf.header:
            out += [""] + prose(conf.header)
        if conf.defaults:
            out += ["", "Defaults: " + ", ".join(code(d.path + (f": {d.value}" if d.value else "")) for d in conf.defaults)]
        prefix = "" if conf.package_global else f"{group.name}."
        if conf.package_global:
            out += ["", "Global package: the keys below are written from the top of the config."]
        if conf.keys:
            out += [""] + key_table(conf.keys, prefix)
    out.append("")
    return out


def render() -> str:
    top = scan(CONF / "config.yaml")
    out = [
        "# Configuration reference",
        "",
        f"<!-- Generated by {GENERATOR} from conf/ on every `mkdocs build`; edit the comments in conf/, "
        "not this page. -->",
        "",
        "Every key below can be set on the command line (`key=value`); a group is chosen with `group=option`. "
        "Defaults and descriptions are read from the files in `conf/` and their comments. "
        "What the comments leave out is in [Configuration](configuration.md).",
        "",
        "## conf/config.yaml",
        "",
    ]
    if top.header:
        out += prose(top.header) + [""]
    out += ["### Groups and their defaults", "", "| group | default | description |", "| --- | --- | --- |"]
    for d in top.defaults:
        if d.path == "_self_":
            continue
        link = f"[`{d.path}`](#{d.path})" if (CONF / d.path).is_dir() else f"`{d.path}`"
        out.append(f"| {link} | {code(d.value)} | {cell(d.description)} |")
    out += ["", "### Keys", ""] + key_table(top.keys) + [""]
    for group in sorted(p for p in CONF.iterdir() if p.is_dir()):
        out += group_section(group, group.name in {d.path for d in top.defaults})
    return "\n".join(out).rstrip() + "\n"


def write() -> bool:
    """Writes the page when it changed; True when it did."""
    text = render()
    if PAGE.exists() and PAGE.read_text() == text:
        return False
    PAGE.write_text(text)
    return True


def on_pre_build(config) -> None:  # mkdocs hook
    if write():
        log.warning("%s was stale and has been rewritten from conf/: commit it", PAGE.relative_to(ROOT))


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        stale = not PAGE.exists() or PAGE.read_text() != render()
        print(f"{PAGE.relative_to(ROOT)}: {'stale' if stale else 'up to date'}")
        sys.exit(1 if stale else 0)
    print(f"{PAGE.relative_to(ROOT)}: {'written' if write() else 'unchanged'}")
