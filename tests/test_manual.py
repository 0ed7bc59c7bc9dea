"""The manual is reachable: the README and docs/index.md link every page of docs/ (a page no one links is a page
no newcomer finds), and mkdocs.yml's navigation lists each page once."""
from __future__ import annotations

import re

from tests.conftest import REPO

PAGES = sorted(p.name for p in (REPO / "docs").glob("*.md") if p.name != "index.md")


def test_the_readme_and_the_index_link_every_page():
    readme = (REPO / "README.md").read_text()
    index = (REPO / "docs" / "index.md").read_text()
    assert [p for p in PAGES if f"(docs/{p}" not in readme] == []
    assert [p for p in PAGES if f"({p}" not in index] == []


def test_the_navigation_lists_every_page_once():
    nav = re.findall(r":\s*([\w-]+\.md)\s*$", (REPO / "mkdocs.yml").read_text(), flags=re.M)
    assert sorted(nav) == sorted(PAGES + ["index.md"])
