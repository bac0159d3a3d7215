"""nbmon/views/frontend.py: the widgets' ES modules joined into the one
text anywidget loads, and what it refuses to join."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from nbmon.views import frontend, live


def write(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def refusal(root, files, entry="entry.js"):
    with pytest.raises(ValueError) as caught:
        frontend.module(entry, write(root, files))
    message = str(caught.value)
    # One sentence: a line that ends with its only full stop ("x.js" is no stop).
    assert "\n" not in message and message.endswith(".") and ". " not in message, message
    return message


def sections(text):
    """The modules in a joined text, in order."""
    return re.findall(r"^// ---- (\S+) ----$", text, re.M)


def test_modules_come_after_what_they_import_each_once_without_import_or_export(tmp_path):
    text = frontend.module("entry.js", write(tmp_path, {
        "util.js": "export const UNIT = \"s\";\nexport function show(v) {\n  return `${v} ${UNIT}`;\n}\n",
        "parts/a.js": "import { show } from \"../util.js\";\n\nexport class A {\n  text() { return show(1); }\n}\n",
        "parts/b.js": "import {\n  UNIT,\n  show,\n} from \"../util.js\";\n"
                      "export async function b() {\n  return show(UNIT);\n}\n",
        "entry.js": "import { A } from \"./parts/a.js\";\nimport { b } from \"./parts/b.js\";\n"
                    "export const kept = 1;\nexport default { a: new A(), b };\n",
    }))
    assert sections(text) == ["util.js", "parts/a.js", "parts/b.js", "entry.js"]
    assert not re.search(r"^\s*import\b", text, re.M)
    # The entry is kept as it is; the others' exports become plain declarations.
    assert re.findall(r"^export\b.*", text, re.M) == ["export const kept = 1;", "export default { a: new A(), b };"]
    assert "\nasync function b() {" in text and "\nfunction show(v) {" in text and "\nconst UNIT" in text


def test_statements_in_comments_and_literals_are_not_code(tmp_path):
    text = frontend.module("entry.js", write(tmp_path, {
        "entry.js": "// import { x } from \"lodash\";\n"
                    "const re = /[\"'`]/g, half = 1 / 2;\n"
                    "const worker = `let ctx;\nimport { y } from \"z\";\n${[\"}\"].join(`\n`)}`;\n"
                    "/*\nexport * from \"./w.js\";\n*/\n"
                    "export default { re, half, worker };\n",
    }))
    assert "let ctx;\nimport { y } from \"z\";" in text and "export * from" in text


@pytest.mark.parametrize("files, said", [
    ({"entry.js": "import { a as b } from \"./x.js\";\n", "x.js": "export const a = 1;\n"},
     "entry.js renames 'a as b' from ./x.js"),
    ({"entry.js": "import { a } from \"./x.js\";\n", "x.js": "export * from \"./y.js\";\n"},
     "x.js has an `export *`"),
    ({"entry.js": "import { a } from \"./x.js\";\n", "x.js": "const a = 1;\nexport { a };\n"},
     "x.js exports other than a declaration"),
    ({"entry.js": "import { a } from \"./x.js\";\n", "x.js": "export default 1;\n"},
     "x.js has an `export default`, which only the entry module may have"),
    ({"entry.js": "import { a } from \"x\";\n"}, "entry.js imports 'x', and only relative paths"),
    ({"entry.js": "import { a } from \"./x.mjs\";\n"}, "entry.js imports './x.mjs'"),
    ({"entry.js": "import x from \"./x.js\";\n"}, "entry.js has `import x from \"./x.js\";`, where only"),
    ({"entry.js": "import * as x from \"./x.js\";\n"}, "entry.js has `import * as x"),
    ({"entry.js": "import { b } from \"./x.js\";\n", "x.js": "export const a = 1;\nconst b = 2;\n"},
     "entry.js imports 'b' from ./x.js, which does not export it"),
    ({"entry.js": "import { a } from \"./x.js\";\nfunction b() {}\n", "x.js": "export const a = 1;\nlet b;\n"},
     "entry.js and x.js both declare 'b'"),
    ({"entry.js": "import { a } from \"./x.js\";\n",
      "x.js": "import { b } from \"./entry.js\";\nexport const a = 1;\n"},
     "entry.js imports itself through entry.js -> x.js"),
])
def test_what_cannot_be_joined_is_refused_in_one_sentence(tmp_path, files, said):
    assert said in refusal(tmp_path, files)


def test_a_module_is_joined_once_a_process(tmp_path):
    root = write(tmp_path, {"entry.js": "export default {};\n"})
    first = frontend.module("entry.js", root)
    (root / "entry.js").write_text("export default { changed: true };\n", encoding="utf-8")
    assert frontend.module("entry.js", root) is first


def test_every_module_is_under_800_lines_and_opens_saying_what_it_holds():
    modules = sorted(frontend.JS.rglob("*.js"))
    assert len(modules) >= 10
    for path in modules:
        text = path.read_text(encoding="utf-8")
        assert text.count("\n") < 800 and text.startswith("// "), path


# The widgets' entries, and what anywidget calls on each one's default export.
ENTRIES = {"dashboard/index.js": ["initialize", "render"], "meter.js": ["render"]}


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_widget_module_is_one_text_with_no_import_and_one_default_export(entry):
    text = frontend.module(entry)
    assert not re.search(r"^\s*import\b(?!\s*[(.])", text, re.M), "a static import left"
    exports = re.findall(r"^export\b.*", text, re.M)
    assert len(exports) == 1 and exports[0].startswith("export default "), exports
    assert sections(text)[-1] == entry and sections(text).count("format.js") == 1


@pytest.mark.parametrize("entry, calls", sorted(ENTRIES.items()))
def test_a_widget_module_runs(entry, calls, tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH; the front end's tests need Node.js >= 20")
    path = tmp_path / "widget.mjs"
    path.write_text(frontend.module(entry), encoding="utf-8")
    code = ("const widget = (await import(process.argv[1])).default;\n"
            "console.log(Object.keys(widget).filter((k) => typeof widget[k] === 'function').join(','));")
    done = subprocess.run([node, "--input-type=module", "-e", code, path.as_uri()],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [",".join(calls)]


def test_the_live_chart_loads_the_joined_dashboard():
    assert live.LOADER is frontend.module("dashboard/index.js")
