import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import meter from "../meter.js";

const JS_DIR = join(dirname(fileURLToPath(import.meta.url)), "..");

// ---- the meter against a minimal DOM ----

class FakeClassList {
  constructor(node) {
    this.node = node;
  }
  get set() {
    return new Set(this.node.className.split(/\s+/).filter(Boolean));
  }
  contains(c) {
    return this.set.has(c);
  }
  toggle(c, force) {
    const s = this.set;
    const on = force === undefined ? !s.has(c) : Boolean(force);
    if (on) s.add(c);
    else s.delete(c);
    this.node.className = [...s].join(" ");
    return on;
  }
}

class FakeNode {
  constructor(doc, tag) {
    this.ownerDocument = doc;
    this.tagName = tag.toUpperCase();
    this.nodeType = 1;
    this.children = [];
    this.parentNode = null;
    this.attributes = new Map();
    this.className = "";
    this.classList = new FakeClassList(this);
    this.style = {};
    this.hidden = false;
    this._text = "";
  }
  get id() {
    return this.getAttribute("id") ?? "";
  }
  set id(v) {
    this.setAttribute("id", v);
  }
  get textContent() {
    return this.children.length ? this.children.map((c) => c.textContent).join("") : this._text;
  }
  set textContent(v) {
    this.children = [];
    this._text = String(v);
  }
  setAttribute(k, v) {
    this.attributes.set(k, String(v));
  }
  getAttribute(k) {
    return this.attributes.has(k) ? this.attributes.get(k) : null;
  }
  appendChild(child) {
    child.parentNode = this;
    this.children.push(child);
    return child;
  }
  remove() {
    if (!this.parentNode) return;
    const siblings = this.parentNode.children;
    siblings.splice(siblings.indexOf(this), 1);
    this.parentNode = null;
  }
  getRootNode() {
    let n = this;
    while (n.parentNode) n = n.parentNode;
    return n;
  }
  *walk() {
    for (const c of this.children) {
      yield c;
      yield* c.walk();
    }
  }
  find(attr, value) {
    for (const n of this.walk()) if (n.getAttribute(attr) === value) return n;
    return null;
  }
  byClass(cls) {
    for (const n of this.walk()) if (n.classList.contains(cls)) return n;
    return null;
  }
}

class FakeDocument {
  constructor() {
    this.head = new FakeNode(this, "head");
    this.body = new FakeNode(this, "body");
  }
  createElement(tag) {
    return new FakeNode(this, tag);
  }
  getElementById(id) {
    for (const root of [this.head, this.body]) {
      const n = root.find("id", id);
      if (n) return n;
    }
    return null;
  }
}

class FakeModel {
  constructor(values) {
    this.values = { ...values };
    this.handlers = new Map();
  }
  get(k) {
    return this.values[k];
  }
  set(k, v) {
    if (this.values[k] === v) return;
    this.values[k] = v;
    for (const h of this.handlers.get(`change:${k}`) ?? []) h();
  }
  on(name, h) {
    if (!this.handlers.has(name)) this.handlers.set(name, []);
    this.handlers.get(name).push(h);
  }
  off(name, h) {
    const list = this.handlers.get(name) ?? [];
    const i = list.indexOf(h);
    if (i >= 0) list.splice(i, 1);
  }
  count() {
    let n = 0;
    for (const list of this.handlers.values()) n += list.length;
    return n;
  }
}

// The Meter's `fields` as Python sends them (tests/test_meter_widget.py checks
// that this file is nbmon.views.meter.FIELDS).
const FIELDS = JSON.parse(readFileSync(join(JS_DIR, "test", "meter_fields.json"), "utf8"));

const DEFAULTS = {
  label: "cell 3",
  status: "running",
  running: true,
  elapsed_s: 12.3,
  fields: FIELDS,
  proc_cpu_percent: 3.14159,
  proc_pss_mb: 1536,
  sys_mem_total_mb: 6144,
  gpu_util_percent: null,
  gpu_mem_used_mb: null,
  gpu_count: 0,
};

async function mount(values = {}) {
  const doc = new FakeDocument();
  const el = doc.createElement("div");
  doc.body.appendChild(el);
  const model = new FakeModel({ ...DEFAULTS, ...values });
  const timers = { live: new Set() };
  const realSet = globalThis.setInterval;
  const realClear = globalThis.clearInterval;
  globalThis.setInterval = (fn, ms) => {
    const id = realSet(fn, ms);
    timers.live.add(id);
    return id;
  };
  globalThis.clearInterval = (id) => {
    timers.live.delete(id);
    realClear(id);
  };
  let cleanup;
  try {
    cleanup = meter.render({ model, el });
  } catch (err) {
    globalThis.setInterval = realSet;
    globalThis.clearInterval = realClear;
    throw err;
  }
  const restore = () => {
    for (const id of timers.live) realClear(id);
    globalThis.setInterval = realSet;
    globalThis.clearInterval = realClear;
  };
  const q = (name) => el.find("data-nbmon", name);
  return { doc, el, model, timers, cleanup, restore, q, root: el.byClass("nbmon-meter") };
}

test("the meter renders values and the documented hooks", async () => {
  const m = await mount();
  try {
    assert.equal(typeof m.cleanup, "function");
    assert.equal(m.root.getAttribute("data-status"), "running");
    assert.equal(m.root.getAttribute("data-running"), "true");
    assert.ok(m.root.classList.contains("nbmon-meter--running"));
    assert.equal(m.q("label").textContent, "cell 3");
    assert.equal(m.q("elapsed").textContent, "12.3 s");
    assert.equal(m.q("cpu").textContent, "3.1 %");
    assert.equal(m.q("cpu").getAttribute("data-value"), "3.14159");
    assert.equal(m.q("cpu").getAttribute("data-name"), "proc_cpu_percent");
    assert.equal(m.q("cpu").getAttribute("title"), "CPU, process tree (100 = one core): 3.1 %");
    assert.equal(m.el.find("data-nbmon-bar", "cpu").getAttribute("data-fraction"), String(3.14159 / 100));
    assert.equal(m.q("ram").textContent, "1.5 GiB");
    assert.equal(m.q("ram").getAttribute("title"), "memory, process tree (PSS: shared pages counted once): 1.5 GiB of 6.0 GiB");
    assert.equal(m.el.find("data-nbmon-bar", "ram").getAttribute("data-fraction"), "0.25");
    assert.equal(m.el.find("data-nbmon-bar", "ram").style.width, "25%");
    assert.equal(m.q("status").textContent, "running");
    assert.equal(m.el.find("data-nbmon-metric", "gpu").hidden, true);
    assert.equal(m.q("gpu").textContent, "\u2013");
    assert.equal(m.q("gpu").getAttribute("data-value"), "");
    assert.equal(m.q("gpu-mem").getAttribute("data-name"), "gpu_mem_used_mb");
    assert.equal(m.root.getAttribute("title"), "cell 3 \u00b7 12.3 s \u00b7 CPU 3.1 % \u00b7 RAM 1.5 GiB of 6.0 GiB \u00b7 running");
    assert.ok(m.doc.getElementById("nbmon-meter-style"), "style injected into <head>");
  } finally {
    m.cleanup();
    m.restore();
  }
});

test("every field with a hook has a value element, in catalog order, grouped", async () => {
  const m = await mount();
  try {
    const hooks = [...m.el.walk()].map((n) => n.getAttribute("data-nbmon")).filter(Boolean);
    assert.deepEqual(hooks, ["label", "elapsed", "cpu", "ram", "gpu", "gpu-mem", "alert", "status"]);
    const groups = [...m.el.walk()].map((n) => n.getAttribute("data-nbmon-metric")).filter(Boolean);
    assert.deepEqual(groups, ["cpu", "ram", "gpu"]);
    const named = [...m.el.walk()].map((n) => n.getAttribute("data-name")).filter(Boolean);
    assert.deepEqual(named, FIELDS.filter((f) => f.hook).map((f) => f.name));
  } finally {
    m.cleanup();
    m.restore();
  }
});

test("a meter field with no slot gets a group of its own", async () => {
  const extra = { name: "gpu_power_w", unit: "W", label: "GPU power (all GPUs)", group: "gpu_power_w",
                  hook: "gpu_power_w", key: "GPU power (all GPUs)", bar: null, gpu: true };
  const m = await mount({ fields: [...FIELDS, extra], gpu_power_w: 250, gpu_count: 1 });
  try {
    const group = m.el.find("data-nbmon-metric", "gpu_power_w");
    assert.equal(group.hidden, false);
    assert.equal(m.q("gpu_power_w").textContent, "250 W");
    assert.equal(m.el.find("data-nbmon-bar", "gpu_power_w"), null);
    m.model.set("gpu_power_w", 72.45);
    assert.equal(m.q("gpu_power_w").textContent, "72.5 W");
  } finally {
    m.cleanup();
    m.restore();
  }
});

test("the meter follows model changes and status classes", async () => {
  const m = await mount();
  try {
    m.model.set("gpu_count", 2);
    m.model.set("gpu_util_percent", 87.25);
    m.model.set("gpu_mem_used_mb", 40960);
    assert.equal(m.el.find("data-nbmon-metric", "gpu").hidden, false);
    assert.equal(m.q("gpu").textContent, "87.3 %");
    assert.equal(m.q("gpu-mem").textContent, "40.0 GiB");
    assert.match(m.root.getAttribute("title"), / \u00b7 GPU\u00d72 87\.3 %, 40\.0 GiB \u00b7 /);

    m.model.set("proc_cpu_percent", 99.96);
    assert.equal(m.q("cpu").textContent, "100 %");
    m.model.set("proc_pss_mb", 1023.96);
    assert.equal(m.q("ram").textContent, "1.0 GiB");

    m.model.set("sys_mem_total_mb", 0);
    assert.equal(m.el.find("data-nbmon-bar", "ram").parentNode.hidden, true);
    assert.equal(m.q("ram").getAttribute("title"), "memory, process tree (PSS: shared pages counted once): 1.0 GiB");
    m.model.set("sys_mem_total_mb", null);
    assert.equal(m.el.find("data-nbmon-bar", "ram").parentNode.hidden, true);
    m.model.set("proc_pss_mb", null);
    assert.equal(m.q("ram").textContent, "\u2013");

    m.model.set("status", "interrupted");
    assert.equal(m.root.getAttribute("data-status"), "interrupted");
    assert.ok(m.root.classList.contains("nbmon-meter--failed"));
    assert.ok(m.root.classList.contains("nbmon-meter--interrupted"));
    assert.ok(!m.root.classList.contains("nbmon-meter--running"));

    m.model.set("status", "failed");
    assert.ok(m.root.classList.contains("nbmon-meter--failed"));
    assert.ok(!m.root.classList.contains("nbmon-meter--interrupted"));

    m.model.set("status", "done");
    m.model.set("running", false);
    m.model.set("elapsed_s", 75);
    assert.ok(m.root.classList.contains("nbmon-meter--done"));
    assert.ok(!m.root.classList.contains("nbmon-meter--failed"));
    assert.equal(m.q("elapsed").textContent, "1:15");
  } finally {
    m.cleanup();
    m.restore();
  }
});

test("the memory warning marks the meter while it lasts", async () => {
  const m = await mount();
  try {
    assert.equal(m.q("alert").hidden, true);
    assert.equal(m.root.getAttribute("data-alert"), "");
    m.model.set("memory_alert_percent", 92.04);
    m.model.set("memory_alert_limit_mb", 8192);
    m.model.set("memory_alert", "container");
    assert.equal(m.q("alert").hidden, false);
    assert.equal(m.q("alert").textContent, "\u26a0 92.0 % of limit");
    assert.equal(m.q("alert").getAttribute("data-value"), "92.04");
    assert.equal(m.q("alert").getAttribute("title"),
      "the container's memory is at 92.0 % of its 8.0 GiB limit: at the limit the kernel is killed");
    assert.equal(m.root.getAttribute("data-alert"), "container");
    assert.ok(m.root.classList.contains("nbmon-meter--alert"));
    assert.match(m.root.getAttribute("title"), / \u00b7 \u26a0 92\.0 % of limit \u00b7 running$/);
    m.model.set("memory_alert", "machine");
    assert.equal(m.q("alert").textContent, "\u26a0 memory 92.0 % used");
    m.model.set("memory_alert", "");
    assert.equal(m.q("alert").hidden, true);
    assert.ok(!m.root.classList.contains("nbmon-meter--alert"));
    assert.doesNotMatch(m.root.getAttribute("title"), /\u26a0/);
  } finally {
    m.cleanup();
    m.restore();
  }
});

test("the ticker runs only while running, and cleanup leaves nothing behind", async () => {
  const m = await mount({ running: false });
  try {
    assert.equal(m.timers.live.size, 0);
    m.model.set("running", true);
    assert.equal(m.timers.live.size, 1);
    m.model.set("proc_cpu_percent", 50);
    assert.equal(m.timers.live.size, 1, "one ticker, not one per update");
    m.model.set("running", false);
    assert.equal(m.timers.live.size, 0);
    m.model.set("running", true);
    assert.ok(m.model.count() > 0);

    m.cleanup();
    assert.equal(m.timers.live.size, 0, "cleanup clears the ticker");
    assert.equal(m.model.count(), 0, "cleanup removes every handler");
    assert.equal(m.el.children.length, 0, "cleanup removes the meter");
  } finally {
    m.restore();
  }
});

test("the ticker advances elapsed time locally while running", async () => {
  const m = await mount({ elapsed_s: 100, running: true });
  try {
    assert.equal(m.q("elapsed").textContent, "1:40");
    await new Promise((r) => setTimeout(r, 1100));
    // Timer-driven, so only bound it from below; a busy machine may tick late.
    assert.ok(Number(m.q("elapsed").getAttribute("data-value")) >= 100.9);
    assert.match(m.q("elapsed").textContent, /^1:4[1-9]$/);
  } finally {
    m.cleanup();
    m.restore();
  }
});
