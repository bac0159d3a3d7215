"""What the browser tests and benchmarks/bench_browser.py watch in a page:
every frame of the kernel websockets (time, direction, bytes, channel and
message type, parsed in the page from Jupyter's v1 binary protocol or JSON)
when the dashboard's record and its chart with data first appeared, and
every redraw (when, its script's milliseconds and those to the end of its
frame).
Installed with ``page.add_init_script`` before JupyterLab or Notebook 7
load, so it sees the page's own clock for every event."""

from __future__ import annotations

import re

INIT_SCRIPT = r"""(() => {
  const frames = (window.__nbmonFrames = []);
  const marks = (window.__nbmonMarks = {});
  // Every redraw of the page's dashboards: when, and how long it held the
  // main thread: their "nbmon-redraw" measures (User Timing), or where a
  // version has none, the synchronous part of every Plotly.react; and each
  // redraw to the end of the frame that rendered it ("nbmon-frame").
  const measured = [], reacts = [], rendered = (window.__nbmonRedrawFrames = []);
  Object.defineProperty(window, "__nbmonRedraws", { get: () => (measured.length ? measured : reacts) });
  window.__nbmonReacts = reacts;
  const relayouts = (window.__nbmonRelayouts = []);   // plotly's relayouts: a y axis's top moved
  const kept = { "nbmon-redraw": measured, "nbmon-frame": rendered };
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) kept[e.name]?.push({ t: e.startTime, ms: e.duration });
  }).observe({ entryTypes: ["measure"] });
  let plotly;
  Object.defineProperty(window, "Plotly", { configurable: true, get: () => plotly, set(value) {
    plotly = value;
    if (!value || !value.react || value.react.__nbmonTimed) return;
    for (const [name, kept] of [["react", reacts], ["relayout", relayouts]]) {
      const original = value[name];
      value[name] = function (...args) {
        const t = performance.now();
        const out = original.apply(this, args);
        kept.push({ t, ms: performance.now() - t });
        return out;
      };
    }
    value.react.__nbmonTimed = true;
  } });
  const decoder = new TextDecoder();
  const json = (bytes) => { try { return JSON.parse(decoder.decode(bytes)); } catch { return {}; } };
  function parse(data) {
    if (typeof data === "string") {
      const m = json(new TextEncoder().encode(data));
      return { bytes: data.length, channel: m.channel, header: m.header || {}, parent: m.parent_header || {},
               content: m.content || {} };
    }
    if (!(data instanceof ArrayBuffer)) return { bytes: data.size || 0, header: {}, parent: {}, content: {} };
    const view = new DataView(data);
    const n = Number(view.getBigUint64(0, true));
    const at = [];
    for (let i = 0; i < n; i++) at.push(Number(view.getBigUint64(8 * (i + 1), true)));
    at.push(data.byteLength);
    const part = (i) => new Uint8Array(data, at[i], at[i + 1] - at[i]);
    const contentPart = part(4);
    return { bytes: data.byteLength, channel: decoder.decode(part(0)), header: json(part(1)), parent: json(part(2)),
             content: contentPart.length < 200000 ? json(contentPart) : {} };
  }
  function note(dir, data) {
    const m = parse(data);
    const c = m.content || {};
    frames.push({ dir, t: performance.now(), date: m.header.date, bytes: m.bytes, channel: m.channel, type: m.header.msg_type,
                  id: m.header.msg_id, parent: m.parent.msg_id, parentType: m.parent.msg_type,
                  code: typeof c.code === "string" ? c.code.slice(0, 200) : undefined, comm: c.comm_id,
                  state: c.execution_state, method: c.data && c.data.method,
                  kind: c.data && c.data.content && c.data.content.type,
                  keys: c.data && c.data.state && Object.keys(c.data.state) });
  }
  const Native = window.WebSocket;
  window.WebSocket = class extends Native {
    constructor(url, protocols) {
      super(url, protocols);
      if (String(url).includes("/channels")) this.addEventListener("message", (e) => note("recv", e.data));
    }
    send(data) {
      if (String(this.url).includes("/channels")) note("send", data);
      return super.send(data);
    }
  };
  const seen = () => {
    const now = performance.now();
    if (marks.record === undefined && document.querySelector(".nbmon-live-record")) marks.record = now;
    if (marks.chart === undefined) {
      for (const plot of document.querySelectorAll(".js-plotly-plot")) {
        const traces = plot.__nbmonDrawn ? plot.__nbmonDrawn.traces : plot.data || [];
        if (traces.some((t) => t.y && t.y.length > 0)) marks.chart = now;
      }
    }
    if (marks.chart !== undefined) observer.disconnect();
  };
  const observer = new MutationObserver(seen);
  document.addEventListener("DOMContentLoaded", () => observer.observe(document.body, { childList: true, subtree: true }));
})();"""


# Colours read in the page: rgb(text) -> [r, g, b, a]; over(fg, bg) -> opaque;
# backdrop(el): the opaque colour behind el (its first ancestor with one);
# contrast(a, b): WCAG's ratio. Shared by the scripts below and the viewer tests.
COLORS = r"""
  const rgb = (c) => (c.match(/[\d.]+/g) || []).map(Number);
  const over = (fg, bg) => [0, 1, 2].map((i) => fg[i] * (fg[3] ?? 1) + bg[i] * (1 - (fg[3] ?? 1)));
  const backdrop = (el) => {
    for (let n = el; n; n = n.parentElement) {
      const c = rgb(getComputedStyle(n).backgroundColor);
      if (c.length && (c[3] ?? 1) > 0) return c.slice(0, 3);
    }
    return [255, 255, 255];
  };
  const lum = (c) => { const l = c.map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
                       return 0.2126 * l[0] + 0.7152 * l[1] + 0.0722 * l[2]; };
  const contrast = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
"""

# Contrast of the chart's texts against what is behind them: the hover box's
# text against its box, the cell bands' labels (painted on the canvas in the
# colour they report) against the band over the page.
CONTRASTS = "(plot) => {" + COLORS + r"""
  const page = backdrop(plot);
  const fill = (el) => { const s = getComputedStyle(el); return over([...rgb(s.fill).slice(0, 3), +s.fillOpacity], page); };
  const box = plot.querySelector(".nbmon-hover");
  const shown = box && getComputedStyle(box).display !== "none";
  const boxFill = shown && over(rgb(getComputedStyle(box).backgroundColor), page);
  const hover = shown ? [contrast(over(rgb(getComputedStyle(box).color), boxFill), boxFill)] : [];
  const band = over([128, 128, 128, 0.1], page);
  const labels = (plot.__nbmonDrawn?.labels || []).map((l) => contrast(over(rgb(l.color), page), band));
  return { hover, labels };
}"""


def execute_frame(frames, pattern: str, reply: str = "execute_input") -> dict:
    """The kernel's execute_input for the cell matching ``pattern`` ("Run
    All" sends every request at once), or that cell's first ``reply`` message."""
    sent = [f["id"] for f in frames if f["dir"] == "send" and f["type"] == "execute_request"
            and re.search(pattern, f.get("code") or "")]
    assert sent, f"no execute_request matching {pattern!r} was sent"
    got = [f for f in frames if f["type"] == reply and f["parent"] == sent[-1]]
    assert got, f"no {reply} for the cell matching {pattern!r}"
    return got[0]


def execute_time(frames, pattern: str, reply: str = "execute_input") -> float:
    """Page time at which the kernel began to run the cell matching
    ``pattern``, or at which the page received that cell's first ``reply``."""
    return execute_frame(frames, pattern, reply)["t"]


def kernel_seconds(frames, pattern: str) -> float:
    """How long the kernel ran the cell matching ``pattern``, by the kernel's
    own clock (its execute_input and execute_reply headers): what the next
    cell waited, whatever the page was busy with."""
    from datetime import datetime

    began, ended = (datetime.fromisoformat(execute_frame(frames, pattern, kind)["date"])
                    for kind in ("execute_input", "execute_reply"))
    return (ended - began).total_seconds()


def idle_figures(frames, t_from: float, t_to: float) -> dict:
    """What crossed the kernel websockets between two page times (ms)."""
    inside = [f for f in frames if t_from <= f["t"] < t_to]
    sent = [f for f in inside if f["dir"] == "send"]
    received = [f for f in inside if f["dir"] == "recv"]
    seconds = (t_to - t_from) / 1000.0
    return {
        "seconds": seconds,
        "browser_to_kernel": len(sent),
        "browser_to_kernel_types": sorted({f["type"] or "?" for f in sent}),
        "status": len([f for f in received if f["type"] == "status"]),
        "kernel_to_browser_bytes_per_s": sum(f["bytes"] for f in received) / seconds,
        "kernel_to_browser_messages": len(received),
    }


def redraw_figures(redraws, t_from: float, t_to: float) -> dict:
    """Redraws between two page times (ms): how many a second, and their
    synchronous milliseconds, median and 90th percentile (NaN: none)."""
    import statistics

    ms = sorted(r["ms"] for r in redraws if t_from <= r["t"] < t_to)
    p90 = ms[min(len(ms) - 1, int(0.9 * len(ms)))] if ms else float("nan")
    return {"redraws_per_s": len(ms) / ((t_to - t_from) / 1000.0),
            "redraw_ms_median": statistics.median(ms) if ms else float("nan"), "redraw_ms_p90": p90}


def kernel_pids(server_pid: int) -> list[int]:
    """The ipykernel processes a Jupyter server started."""
    import psutil

    return [p.pid for p in psutil.Process(server_pid).children(recursive=True)
            if "ipykernel" in " ".join(p.cmdline())]


def browser_pids(driver_pid: int) -> list[int]:
    """Chromium's processes under a Playwright driver."""
    import psutil

    return [p.pid for p in psutil.Process(driver_pid).children(recursive=True) if "chrom" in p.name().lower()]


def cpu_seconds(pids) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total
