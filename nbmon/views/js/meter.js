// nbmon compact live meter: the anywidget front end for nbmon.views.meter.Meter.
//
// What it shows comes from Python: the `fields` trait lists the metric catalog's
// meter metrics ({name, unit, label, group, hook, key, bar, gpu}), each synced
// as a float trait under its catalog name (proc_cpu_percent, proc_pss_mb, ...).
// Every number is shown by fmt() in its metric's unit: the rules of
// nbmon/format.py, so the meter and the cell's static summary agree.
//
// Stable hooks for tests and user CSS:
//   .nbmon-meter                 root; data-status="running|done|failed|interrupted",
//                                data-running="true|false", classes
//                                nbmon-meter--{running,done,failed,interrupted}
//                                ("interrupted" carries nbmon-meter--failed too).
//   [data-nbmon="label|elapsed|status"] and one per field with a hook
//                                (cpu|ram|gpu|gpu-mem): value elements; the text
//                                is what the user sees, data-value the raw number
//                                ("" when unknown), data-name the catalog name.
//   [data-nbmon-metric="cpu|ram|gpu"]  one group of fields; a group of GPU
//                                metrics is [hidden] while gpu_count is 0.
//   [data-nbmon-bar="cpu|ram|gpu"]     bar fill; data-fraction in [0, 1]. A bar
//                                whose maximum is a metric (RAM: sys_mem_total_mb)
//                                is [hidden] unless that value is > 0.
//   [data-nbmon="alert"]         the memory warning, [hidden] unless memory_alert is
//                                "container" or "machine" (that memory is above the
//                                warning threshold: nbmon/postmortem/memwarn.py); data-value is
//                                its percentage. The root then has data-alert and the
//                                class nbmon-meter--alert (the RAM bar turns red).
//
// Python sends None for unknown readings; they arrive as null and show "–".
// nbmon/views/frontend.py joins it and format.js into the one module anywidget loads.

import { barFraction, fmt } from "./format.js";

const STYLE_ID = "nbmon-meter-style";

// JupyterLab theme variables with fallbacks, so it also looks right in
// classic Notebook, VS Code and static HTML exports.
const CSS = `
.nbmon-meter {
  --nbmon-fg: var(--jp-ui-font-color1, #333);
  --nbmon-muted: var(--jp-ui-font-color2, #777);
  --nbmon-track: var(--jp-layout-color3, #ddd);
  --nbmon-fill: var(--jp-brand-color1, #1976d2);
  --nbmon-accent: var(--jp-brand-color1, #1976d2);
  display: flex;
  align-items: center;
  gap: 0.9em;
  min-width: 0;
  overflow: hidden;
  white-space: nowrap;
  padding: 2px 6px;
  border-left: 3px solid var(--nbmon-accent);
  color: var(--nbmon-fg);
  font-family: var(--jp-ui-font-family, system-ui, sans-serif);
  font-size: var(--jp-ui-font-size1, 12px);
  line-height: 1.6;
  font-variant-numeric: tabular-nums;
}
.nbmon-meter [hidden] { display: none !important; }
.nbmon-meter__label {
  font-weight: 600;
  overflow: hidden;
  text-overflow: ellipsis;
  max-width: 24em;
}
.nbmon-meter__metric { display: inline-flex; align-items: center; gap: 0.35em; }
.nbmon-meter__key { color: var(--nbmon-muted); }
.nbmon-meter__bar {
  position: relative;
  display: inline-block;
  width: 48px;
  height: 6px;
  border-radius: 3px;
  overflow: hidden;
  background: var(--nbmon-track);
}
.nbmon-meter__fill {
  position: absolute;
  inset: 0 auto 0 0;
  width: 0;
  background: var(--nbmon-fill);
  transition: width 0.2s linear;
}
.nbmon-meter__elapsed,
.nbmon-meter__value { min-width: 4.5em; }
.nbmon-meter__status { color: var(--nbmon-muted); margin-left: auto; }
.nbmon-meter__alert {
  color: var(--jp-error-color1, #d32f2f);
  font-weight: 600;
}
.nbmon-meter--alert {
  --nbmon-accent: var(--jp-error-color1, #d32f2f);
}
.nbmon-meter--alert [data-nbmon-bar="ram"] { background: var(--jp-error-color1, #d32f2f); }
.nbmon-meter--done {
  --nbmon-fg: var(--jp-ui-font-color2, #777);
  --nbmon-fill: var(--jp-ui-font-color3, #aaa);
  --nbmon-accent: var(--jp-border-color1, #bbb);
}
.nbmon-meter--failed {
  --nbmon-fill: var(--jp-error-color1, #d32f2f);
  --nbmon-accent: var(--jp-error-color1, #d32f2f);
}
.nbmon-meter--failed .nbmon-meter__status {
  color: var(--jp-error-color1, #d32f2f);
  font-weight: 600;
}
`;

const STATUS_CLASSES = {
  running: ["nbmon-meter--running"],
  done: ["nbmon-meter--done"],
  failed: ["nbmon-meter--failed"],
  interrupted: ["nbmon-meter--interrupted", "nbmon-meter--failed"],
};
const ALL_STATUS_CLASSES = [...new Set(Object.values(STATUS_CLASSES).flat())];

const TICK_MS = 1000;

// One <style> per document or shadow root: meters in a shadow DOM (marimo, some
// dashboards) can't see document.head. Content is replaced when it differs so a
// reloaded widget module doesn't keep the old rules.
function injectStyle(el) {
  const doc = el.ownerDocument || globalThis.document;
  const root = typeof el.getRootNode === "function" ? el.getRootNode() : null;
  const isShadow = root && root.nodeType === 11; // DOCUMENT_FRAGMENT_NODE
  const parent = isShadow ? root : doc.head;
  let style = isShadow
    ? root.querySelector(`#${STYLE_ID}`)
    : doc.getElementById(STYLE_ID);
  if (!style) {
    style = doc.createElement("style");
    style.id = STYLE_ID;
    parent.appendChild(style);
  }
  if (style.textContent !== CSS) style.textContent = CSS;
}

function isNumber(x) {
  return typeof x === "number" && Number.isFinite(x);
}

function rawValue(x) {
  return isNumber(x) ? String(x) : "";
}

function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

function setAttr(node, name, value) {
  if (node.getAttribute(name) !== value) node.setAttribute(name, value);
}

function setHidden(node, hidden) {
  if (node.hidden !== hidden) node.hidden = hidden;
}

function make(doc, tag, className, attrs = {}, children = []) {
  const node = doc.createElement(tag);
  if (className) node.className = className;
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  for (const child of children) node.appendChild(child);
  return node;
}

function makeBar(doc, name) {
  const fill = make(doc, "span", "nbmon-meter__fill", {
    "data-nbmon-bar": name,
    "data-fraction": "0",
  });
  const track = make(doc, "span", "nbmon-meter__bar", { "aria-hidden": "true" }, [fill]);
  return { track, fill };
}

function setBar(bar, fraction) {
  const f = String(fraction);
  if (bar.fill.getAttribute("data-fraction") !== f) {
    bar.fill.setAttribute("data-fraction", f);
    bar.fill.style.width = `${fraction * 100}%`;
  }
}

function setValue(node, text, raw) {
  setText(node, text);
  setAttr(node, "data-value", rawValue(raw));
}

// Groups of fields in order of first appearance; a group's key and bar scale
// are those of its first field that has one (the bar shows that field).
function groupsOf(fields) {
  const groups = new Map();
  for (const field of fields) {
    if (!groups.has(field.group)) {
      groups.set(field.group, { name: field.group, key: "", scale: null, fields: [], gpu: true });
    }
    const g = groups.get(field.group);
    g.fields.push(field);
    g.gpu = g.gpu && Boolean(field.gpu);
    if (!g.key && field.key) g.key = field.key;
    if (g.scale === null && field.bar !== null && field.bar !== undefined) g.scale = { field, max: field.bar };
  }
  return [...groups.values()];
}

function render({ model, el }) {
  const doc = el.ownerDocument || globalThis.document;
  injectStyle(el);

  const fields = Array.isArray(model.get("fields")) ? model.get("fields") : [];
  const unitOf = new Map(fields.map((f) => [f.name, f.unit]));

  const labelEl = make(doc, "span", "nbmon-meter__label", { "data-nbmon": "label" });
  const elapsedEl = make(doc, "span", "nbmon-meter__elapsed", {
    "data-nbmon": "elapsed",
    "data-value": "",
  });
  const statusEl = make(doc, "span", "nbmon-meter__status", { "data-nbmon": "status" });
  const alertEl = make(doc, "span", "nbmon-meter__alert", { "data-nbmon": "alert", "data-value": "" });

  const groups = groupsOf(fields).map((g) => {
    const keyEl = make(doc, "span", "nbmon-meter__key");
    keyEl.textContent = g.key;
    const bar = g.scale ? makeBar(doc, g.name) : null;
    const values = g.fields
      .filter((f) => f.hook)
      .map((f) => ({
        field: f,
        el: make(doc, "span", "nbmon-meter__value", {
          "data-nbmon": f.hook,
          "data-name": f.name,
          "data-value": "",
        }),
      }));
    const children = [...(g.key ? [keyEl] : []), ...(bar ? [bar.track] : []), ...values.map((v) => v.el)];
    const groupEl = make(doc, "span", "nbmon-meter__metric", { "data-nbmon-metric": g.name }, children);
    return { ...g, keyEl, bar, values, el: groupEl };
  });

  const root = make(doc, "div", "nbmon-meter", {}, [
    labelEl,
    elapsedEl,
    ...groups.map((g) => g.el),
    alertEl,
    statusEl,
  ]);
  el.appendChild(root);

  // elapsed_s arrives a few times a second at most; while running, the display
  // advances on the local clock from the moment the last value arrived.
  const now = () => globalThis.performance.now();
  let receivedAt = now();
  let timer = null;

  function renderElapsed() {
    let elapsed = model.get("elapsed_s");
    if (model.get("running") && isNumber(elapsed)) {
      elapsed += Math.max(0, now() - receivedAt) / 1000;
    }
    setText(elapsedEl, fmt(elapsed, "s"));
    setAttr(elapsedEl, "data-value", rawValue(elapsed));
  }

  function syncTimer() {
    const running = Boolean(model.get("running"));
    if (running && timer === null) {
      timer = setInterval(renderElapsed, TICK_MS);
    } else if (!running && timer !== null) {
      clearInterval(timer);
      timer = null;
    }
  }

  // A group's bar: its full scale (a number, or the value of the metric named
  // by `bar`) and the text " of <max>" when the maximum is a reading.
  function scaleOf(g) {
    const spec = g.scale.max;
    if (typeof spec === "number") return { max: spec, of: "" };
    const max = model.get(spec);
    const known = isNumber(max) && max > 0;
    return { max: known ? max : null, of: known ? ` of ${fmt(max, unitOf.get(spec) ?? "")}` : "" };
  }

  // The memory warning: which memory is near its limit, how near; its text, or "".
  function renderAlert() {
    const kind = model.get("memory_alert") || "";
    const percent = model.get("memory_alert_percent");
    const limit = fmt(model.get("memory_alert_limit_mb"), "MiB");
    const shown = kind === "container" || kind === "machine";
    setHidden(alertEl, !shown);
    root.classList.toggle("nbmon-meter--alert", shown);
    setAttr(root, "data-alert", shown ? kind : "");
    setAttr(alertEl, "data-value", shown ? rawValue(percent) : "");
    if (!shown) return "";
    const text = kind === "container" ? `\u26a0 ${fmt(percent, "%")} of limit` : `\u26a0 memory ${fmt(percent, "%")} used`;
    setText(alertEl, text);
    setAttr(alertEl, "title", kind === "container"
      ? `the container's memory is at ${fmt(percent, "%")} of its ${limit} limit: at the limit the kernel is killed`
      : `the machine's memory is ${fmt(percent, "%")} used, of ${limit}: when it runs out, the kernel may be killed`);
    return text;
  }

  function renderAll() {
    const label = model.get("label") || "";
    setText(labelEl, label);
    setHidden(labelEl, label === "");

    const status = model.get("status") || "";
    const running = Boolean(model.get("running"));
    setAttr(root, "data-status", status);
    setAttr(root, "data-running", String(running));
    const wanted = STATUS_CLASSES[status] || [];
    for (const cls of ALL_STATUS_CLASSES) {
      root.classList.toggle(cls, wanted.includes(cls));
    }
    setText(statusEl, status);

    renderElapsed();

    const gpuCount = model.get("gpu_count");
    const hasGpu = isNumber(gpuCount) && gpuCount > 0;
    const parts = [label, fmt(model.get("elapsed_s"), "s")];
    for (const g of groups) {
      const shown = !g.gpu || hasGpu;
      setHidden(g.el, !shown);
      const key = g.gpu && hasGpu && gpuCount > 1 ? `${g.key}\u00d7${gpuCount}` : g.key;
      setText(g.keyEl, key);
      const scale = g.scale ? scaleOf(g) : null;
      if (g.bar) {
        setHidden(g.bar.track, scale.max === null);
        setBar(g.bar, scale.max === null ? 0 : barFraction(model.get(g.scale.field.name), scale.max));
      }
      const texts = [];
      for (const v of g.values) {
        const raw = model.get(v.field.name);
        const text = fmt(raw, v.field.unit);
        const of = scale && g.scale.field === v.field ? scale.of : "";
        setValue(v.el, text, raw);
        setAttr(v.el, "title", `${v.field.label}: ${text}${of}`);
        texts.push(text + of);
      }
      if (shown && texts.length) parts.push(`${key} ${texts.join(", ")}`.trim());
    }
    const alert = renderAlert();
    if (alert) parts.push(alert);
    parts.push(status);
    setAttr(root, "title", parts.filter(Boolean).join(" \u00b7 "));

    syncTimer();
  }

  // Registered per trait with a named function so cleanup can remove exactly
  // these handlers (a model outlives its views).
  const traits = ["label", "status", "running", "elapsed_s", "gpu_count", "memory_alert", "memory_alert_percent",
    "memory_alert_limit_mb", ...fields.map((f) => f.name)];
  const handlers = traits.map((name) => {
    const handler =
      name === "elapsed_s" || name === "running"
        ? () => {
            receivedAt = now();
            renderAll();
          }
        : renderAll;
    model.on(`change:${name}`, handler);
    return [name, handler];
  });

  renderAll();

  return () => {
    for (const [name, handler] of handlers) model.off(`change:${name}`, handler);
    if (timer !== null) clearInterval(timer);
    timer = null;
    root.remove();
  };
}

export default { render };
