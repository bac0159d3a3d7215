"""The widgets' front ends as anywidget loads them: one ES module text each.

The sources are plain ES modules under nbmon/views/js/ (node's tests
import them as they are). anywidget takes one module from a string, so
:func:`module` joins an entry module and the modules it imports into one
text with no imports, here at import time: pip installs ship the sources
and need no Node.js, and no built copy is kept beside them.

Only what the sources use is understood, and anything else is refused with a
ValueError: ``import { a, b } from "./x.js";`` (relative, named, not
renamed), and ``export`` in front of a function, class, const, let or var
declaration, or ``export default`` in the entry. Every module lands once,
after the modules it imports, with its exports made plain declarations; the
entry comes last, as it is but for its imports. All share one scope, so no
two may declare the same top-level name.
"""

from __future__ import annotations

import functools
import pathlib
import re

JS = pathlib.Path(__file__).parent / "js"

# Statements start at a line's first column; they are looked for in code only (_mask()).
_IMPORT = re.compile(r"^import\b(?!\s*[(.])[^;]*;?", re.M)
_NAMED_IMPORT = re.compile(r"import\s*\{([^}]*)\}\s*from\s*([\"'])(.*?)\2\s*;")
_EXPORT = re.compile(r"^export\b\s*(default\b|\*)?", re.M)
_DECLARATION = re.compile(
    r"^(export\s+)?(?:async\s+)?(?:function\b\s*\*?|class\b|const\b|let\b|var\b)\s*([A-Za-z_$][\w$]*)", re.M)
_NAME = re.compile(r"[A-Za-z_$][\w$]*")
_NUMBER = re.compile(r"[0-9.]+")
# After these a "/" starts a regex literal; after a name, a number or a closing bracket it divides.
_REGEX_AFTER = set("(,=:[!&|?{};+-*%<>~^") | {"", "return", "typeof", "case", "do", "else", "in", "of", "new",
                                                "delete", "void", "throw", "yield", "await", "instanceof"}


@functools.cache
def module(entry: str, root: pathlib.Path = JS) -> str:
    """The module ``entry`` (a path under ``root``) with what it imports,
    transitively, as one ES module text with no imports; made once a process."""
    root, top = root.resolve(), (root / entry).resolve()
    done: dict[pathlib.Path, tuple[str, str, set[str]]] = {}   # in order: each module after those it imports
    _visit(top, root, done, [])
    declared: dict[str, str] = {}
    parts = [f"// nbmon's {entry} and the modules it imports, joined by nbmon/views/frontend.py."]
    for path, (text, code, _) in done.items():
        name = _shown(path, root)
        for match in _DECLARATION.finditer(code):
            if match[2] in declared:
                raise ValueError(f"{name} and {declared[match[2]]} both declare {match[2]!r}, "
                                 "which one module holding them all cannot.")
            declared[match[2]] = name
        cuts = [(m.start(), m.end() + (text[m.end():m.end() + 1] == "\n")) for m in _IMPORT.finditer(code)]
        if path != top:
            cuts += [m.span(1) for m in _DECLARATION.finditer(code) if m[1]]
        for start, end in sorted(cuts, reverse=True):   # the last first: earlier places still hold
            text = text[:start] + text[end:]
        parts += [f"// ---- {name} ----", text.rstrip("\n"), ""]
    return "\n".join(parts)


def _visit(path: pathlib.Path, root: pathlib.Path, done: dict[pathlib.Path, tuple[str, str, set[str]]],
           stack: list[pathlib.Path]) -> set[str]:
    """Add ``path`` to ``done`` after the modules it imports, with its text,
    its code (_mask()) and the names it exports; those names."""
    if path in done:
        return done[path][2]
    name = _shown(path, root)
    if path in stack:
        raise ValueError(f"{name} imports itself through {' -> '.join(_shown(p, root) for p in stack)}, "
                         "a cycle that one module cannot keep in order.")
    text = path.read_text(encoding="utf-8")
    code = _mask(text)
    for match in _EXPORT.finditer(code):
        if match[1] == "*":
            raise ValueError(f"{name} has an `export *`: export each name where it is declared instead.")
        if match[1] == "default" and stack:
            raise ValueError(f"{name} has an `export default`, which only the entry module may have.")
        if not match[1] and not _DECLARATION.match(code, match.start()):
            raise ValueError(f"{name} exports other than a declaration (`export function f`, `export const c`), "
                             "which cannot be joined.")
    for match in _IMPORT.finditer(code):
        statement = _NAMED_IMPORT.fullmatch(text, match.start(), match.end())
        if not statement:
            shown = " ".join(text[match.start():match.end()].split())
            raise ValueError(f"{name} has `{shown}`, where only `import {{ a, b }} from \"./x.js\";` can be joined.")
        spec = statement[3]
        if not (spec.startswith(("./", "../")) and spec.endswith(".js")):
            raise ValueError(f"{name} imports {spec!r}, and only relative paths to .js modules can be joined.")
        provided = _visit((path.parent / spec).resolve(), root, done, [*stack, path])
        for item in filter(None, (s.strip() for s in statement[1].split(","))):
            if not _NAME.fullmatch(item):
                raise ValueError(f"{name} renames {item!r} from {spec}: import names as they are exported.")
            if item not in provided:
                raise ValueError(f"{name} imports {item!r} from {spec}, which does not export it.")
    done[path] = (text, code, {m[2] for m in _DECLARATION.finditer(code) if m[1]})
    return done[path][2]


def _shown(path: pathlib.Path, root: pathlib.Path) -> str:
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


def _mask(text: str) -> str:
    """``text`` with its comments and its string, template and regex literals
    blanked (newlines kept): what is left is the code, at the same places."""
    return _code(text, 0, nested=False)[0]


def _code(text: str, i: int, nested: bool) -> tuple[str, int]:
    """Code from ``i`` to the end, or (``nested``: in a template's ``${``) to its closing brace."""
    out: list[str] = []
    depth, last = 0, ""
    while i < len(text):
        c = text[i]
        if nested and c == "}" and depth == 0:
            return "".join(out), i
        comment = text.startswith(("//", "/*"), i)
        if comment or c in "'\"`" or (c == "/" and last in _REGEX_AFTER):
            j = _literal_end(text, i)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            last = last if comment else "a"   # after a value, a "/" divides
            i = j
            continue
        word = _NAME.match(text, i) or _NUMBER.match(text, i)
        j = word.end() if word else i + 1
        depth += (c == "{") - (c == "}")
        if not c.isspace():
            last = text[i:j]
        out.append(text[i:j])
        i = j
    return "".join(out), i


def _literal_end(text: str, i: int) -> int:
    """Where the comment or literal that starts at ``i`` ends."""
    if text.startswith("//", i):
        end = text.find("\n", i)
        return len(text) if end < 0 else end
    if text.startswith("/*", i):
        end = text.find("*/", i + 2)
        return len(text) if end < 0 else end + 2
    quote, j, in_class = text[i], i + 1, False
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if quote == "`" and text.startswith("${", j):
            j = _code(text, j + 2, nested=True)[1] + 1
            continue
        if quote == "/" and c in "[]":
            in_class = c == "["
        elif c == quote and not in_class:
            j += 1
            break
        j += 1
    if quote == "/":
        while j < len(text) and text[j].isalpha():   # its flags
            j += 1
    return j
