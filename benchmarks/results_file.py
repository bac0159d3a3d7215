"""benchmarks/RESULTS.md is written by more than one script (run.py the
kernel side, bench_browser.py the browser side): each replaces its own
``## `` sections and keeps the others'."""
from __future__ import annotations

import os
import re

_HEADING = re.compile(r"^## ", re.M)


def split(text: str) -> tuple[str, dict[str, str]]:
    """(what precedes the first section, {heading line: section text})."""
    starts = [m.start() for m in _HEADING.finditer(text)] + [len(text)]
    sections = {}
    for begin, end in zip(starts, starts[1:]):
        body = text[begin:end]
        sections[body.split("\n", 1)[0]] = body.rstrip("\n") + "\n\n"
    return text[:starts[0]], sections


def update(path: str, text: str, *, owns: str, header: bool) -> str:
    """Write the ``## `` sections of ``text`` into ``path``: the file's
    sections whose heading matches the regex ``owns`` (this script's, even
    renamed ones) are replaced, every other section is kept; with
    ``header``, ``text``'s preamble replaces the file's. Returns the file's text."""
    try:
        with open(path, encoding="utf-8") as f:
            old_head, old = split(f.read())
    except FileNotFoundError:
        old_head, old = "", {}
    new_head, sections = split(text)
    kept = {h: body for h, body in old.items() if not re.match(owns, h)}
    # This script's sections first when it writes the header, after the others otherwise.
    merged = {**sections, **kept} if header else {**kept, **sections}
    result = ((new_head if header else old_head) + "".join(merged.values())).rstrip("\n") + "\n"
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(result)
    os.replace(tmp, path)
    return result


def replace_section(path: str, text: str) -> str:
    """Put the one ``## `` section of ``text`` where the file's section of
    the same heading is (run.py --only N); returns the file's text."""
    with open(path, encoding="utf-8") as f:
        head, sections = split(f.read())
    ((heading, body),) = split(text)[1].items()
    if heading not in sections:
        raise KeyError(f"{path} has no section {heading!r}")
    sections[heading] = body
    result = (head + "".join(sections.values())).rstrip("\n") + "\n"
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(result)
    os.replace(tmp, path)
    return result
