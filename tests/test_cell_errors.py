"""A failing ``%%resmon`` cell fails as the same cell fails without it, in a
real kernel: the same error message, traceback and reply, from the user's
code only (issue 41), and its record says it failed."""
from __future__ import annotations

import re

import pytest

from corpus_notebooks import traceback_text
from kernels import KernelError, RealKernel

CELLS = {
    "a SyntaxError in the cell": "x = (1,",
    "an IndentationError in the cell": "if True:\nx = 1",
    "a runtime error": "def f():\n    return 1 / 0\nf()",
}


def failure(kernel: RealKernel, code: str) -> tuple[str, str, str]:
    """(reply status, error name, traceback as text: :func:`traceback_text`)."""
    with pytest.raises(KernelError):
        kernel.run(code)
    return kernel.reply["status"], kernel.error["ename"], traceback_text(kernel.error["traceback"])


@pytest.fixture(scope="module")
def kernel():
    with RealKernel() as kernel:
        kernel.run("%load_ext nbmon")
        yield kernel


@pytest.mark.parametrize("code", CELLS.values(), ids=CELLS.keys())
def test_a_failing_cell_fails_the_same_with_and_without_resmon(kernel, code):
    plain = failure(kernel, code)
    monitored = failure(kernel, "%%resmon\n" + code)
    assert monitored == plain
    assert any('data-status="failed"' in out["data"].get("text/html", "") for out in kernel.outputs)


def test_a_syntax_error_raised_by_the_cells_code_lists_the_cells_frames_only(kernel):
    status, name, text = failure(kernel, "%%resmon\ncompile('x x', '<s>', 'exec')")
    assert (status, name) == ("error", "SyntaxError")
    files = re.findall(r"^  (?:File (\S+)|(Cell) In)", text, re.M)
    assert [f or cell for f, cell in files] == ["Cell", "<s>:N"], text
