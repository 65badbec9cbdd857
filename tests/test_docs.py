"""Every Python code block of the README and docs/ runs on the CPU, as written."""

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                              if f.endswith(".md"))
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks():
    for doc in DOCS:
        with open(os.path.join(ROOT, doc)) as f:
            for i, code in enumerate(BLOCK.findall(f.read())):
                yield pytest.param(doc, code, id=f"{doc}:{i}")


def test_docs_have_code_blocks():
    assert len(list(blocks())) >= 5


@pytest.mark.parametrize("doc,code", list(blocks()))
def test_code_block_runs(doc, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # blocks may write files (checkpoints)
    exec(compile(code, f"{doc} (code block)", "exec"), {"__name__": "__doc_block__"})


def test_readme_is_a_landing_page():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    assert len(text.splitlines()) <= 200
    for doc in DOCS[1:]:  # every docs page is linked from the README
        assert doc in text, doc


def test_results_and_comments_are_current_not_a_log():
    with open(os.path.join(ROOT, "benchmarks", "RESULTS.md")) as f:
        assert len(f.read().splitlines()) <= 500
    ordinal_session = re.compile(r"\b\w+(st|nd|rd|th) session\b", re.I)
    for folder in ("python", "benchmarks", "docs", "csrc", "tests", "examples"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                if name.endswith((".py", ".md", ".cpp", ".h")):
                    with open(os.path.join(dirpath, name)) as f:
                        assert not ordinal_session.search(f.read()), os.path.join(dirpath, name)
