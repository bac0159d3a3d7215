"""nbmon.format: the one set of rules for numbers shown to humans. The cases
are tests/format_cases.json, which nbmon/views/js/test/format.test.mjs
checks against nbmon/views/js/format.js too, so the live meter and the
static record agree."""
from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from nbmon import catalog
from nbmon.format import MISSING, UNITS, fmt, is_unknown

CASES_PATH = Path(__file__).with_name("format_cases.json")
CASES = json.loads(CASES_PATH.read_text(encoding="utf-8"))
SPECIAL = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def decode(value):
    """A case's value: "NaN"/"Infinity"/"-Infinity" are those floats, {"str": s}
    is the text s; anything else is itself."""
    if isinstance(value, str):
        return SPECIAL[value]
    if isinstance(value, dict):
        return value["str"]
    return value


def case_id(case) -> str:
    return f"{case['value']!r}-{case['unit'] or 'count'}{'-signed' if case['signed'] else ''}"


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_shared_case(case):
    assert fmt(decode(case["value"]), case["unit"], signed=case["signed"]) == case["text"]


def test_the_table_is_well_formed_and_covers_every_unit():
    for case in CASES:
        assert set(case) == {"value", "unit", "signed", "text"}, case
        assert isinstance(case["signed"], bool) and isinstance(case["text"], str), case
        if isinstance(case["value"], str):
            assert case["value"] in SPECIAL, case
    assert len({(json.dumps(c["value"]), c["unit"], c["signed"]) for c in CASES}) == len(CASES), "duplicate case"
    units = {c["unit"] for c in CASES}
    assert units == set(UNITS) == set(catalog.UNIT_SUFFIX)
    for unit in UNITS:
        known = [c for c in CASES if c["unit"] == unit and c["text"] != MISSING]
        assert any(c["signed"] for c in known), f"no signed case for {unit!r}"
        assert any(isinstance(c["value"], (int, float)) and c["value"] < 0 for c in known), f"no negative {unit!r}"
        assert any(c["value"] is None for c in CASES if c["unit"] == unit), f"no None for {unit!r}"


def test_every_catalog_metric_has_a_known_unit():
    for metric in catalog.METRICS:
        assert metric.unit in UNITS, metric
        assert fmt(1.0, metric.unit)


@pytest.mark.parametrize("unit", ["", "%", "MiB", "s"])
def test_numpy_scalars_are_numbers(unit):
    for value, plain in [(np.float64(1536.0), 1536.0), (np.float32(0.25), 0.25), (np.int64(12), 12),
                         (np.int32(-75), -75)]:
        assert fmt(value, unit) == fmt(plain, unit)
    assert fmt(np.float64("nan"), unit) == MISSING
    assert fmt(np.bool_(True), unit) == MISSING


def test_other_unknowns():
    for value in (b"12", object(), 1j, {"value": 1}, 10 ** 400, [1.0]):
        assert fmt(value, "MiB") == MISSING, repr(value)
    assert is_unknown(None) and is_unknown(math.nan) and is_unknown(math.inf) and is_unknown(True)
    assert is_unknown("1") and not is_unknown(0) and not is_unknown(-1.5)
    assert fmt(Fraction(3, 2), "") == "1.5"   # any numbers.Real


def test_an_unknown_unit_is_refused():
    for unit in (" %", " MiB", "GiB", "ms", "percent", None):
        with pytest.raises(ValueError, match="unknown unit"):
            fmt(1.0, unit)


def test_text_never_has_an_exponent_or_a_double_space():
    for unit in UNITS:
        for exp in range(-12, 40, 3):
            for x in (10.0 ** exp, -(10.0 ** exp), 1.5 * 10.0 ** exp):
                text = fmt(x, unit, signed=True)
                assert "e" not in text.replace("EiB", "").replace("PiB", ""), (x, unit, text)
                assert "  " not in text and text == text.strip(), (x, unit, text)


def test_magnitude_decided_after_rounding():
    # Walk across every boundary in small steps: never "100.0", never "1024 MiB".
    for i in range(-200, 200):
        x = 99.95 + i * 1e-4
        assert fmt(x, "%") in ("99.9 %", "100 %"), x
        y = 1023.5 + i * 1e-3
        assert fmt(y, "MiB") in ("1023 MiB", "1.0 GiB"), y
        s = 9.995 + i * 1e-5
        assert fmt(s, "s") in ("9.99 s", "10.0 s"), s
        m = 59.95 + i * 1e-4
        assert fmt(m, "s") in ("59.9 s", "1:00"), m


# -- the edges that use it -----------------------------------------------------------

def test_summary_rows_use_the_rules():
    from nbmon.report.summary import ResourceSummary

    s = ResourceSummary(peak_rss_mb=1536.0, mean_rss_mb=1023.96, peak_gpu_mem_mb=40960.0, mean_gpu_util=87.25,
                        memory_growth_mb=-12.0, num_samples=1000, duration_sec=75.0, mean_gpu_power_w=250.0,
                        mean_cpu_percent=99.96, peak_cpu_percent=250.0, peak_rss_exact=True,
                        peak_proc_gpu_mem_mb=None)
    assert dict(s.rows()) == {
        "Duration": "1:15",
        "Peak RSS (exact)": "1.5 GiB",
        "RSS growth": "-12.0 MiB",
        "Mean RSS": "1.0 GiB",
        "CPU mean / peak": "100 % / 250 %",
        "GPU util mean": "87.3 %",
        "GPU memory peak (all GPUs)": "40.0 GiB",
        "GPU power mean": "250 W",
        "Samples": "1000",
    }
    assert dict(ResourceSummary.zeroed().rows())["RSS growth"] == "+0.0 MiB"


def test_html_table_escapes():
    from nbmon.report.render import html_table

    out = html_table("a<b", [("Peak RSS", fmt(1536, "MiB")), ("x&y", MISSING)], status="failed")
    assert "a&lt;b" in out and "x&amp;y" in out and "<td" in out and "1.5 GiB" in out and 'data-status="failed"' in out


def test_one_line_shows_every_line_break_and_control_as_its_escape():
    from nbmon.format import one_line

    assert one_line("a.ipynb\n  Cause\u2028x\u2029\r\x1b[2J\x85\tend") == \
        "a.ipynb\\n  Cause\\u2028x\\u2029\\r\\x1b[2J\\x85\tend"
