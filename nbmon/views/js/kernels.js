// nbmon kernels: the front end of nbmon.views.kernels' widget, every Jupyter
// kernel of this user on this host as a live table.
//
// The kernel displays a static record (a text/html table in
// .nbmon-kernels-record[data-nbmon-kernels="<id>"]) and no widget view. This
// model, as it is made in the page (anywidget's initialize), mounts a live
// table into every copy of that record (one now, one the kernel re-sends
// later, one in another view of the notebook) and hides the static one;
// where the model is not in the page (kernel gone, nbconvert, a saved
// notebook reopened) the record is all there is. Its rows come as the
// model's state, their text made by the kernel's side; nothing is formatted
// here. While a record shows in a visible page, the model says so every
// SEEN_EVERY_MS ("nbmon:seen"): the table is read only while some page does.
//
// Each row has Interrupt and, but on this notebook's own kernel, Shut down,
// which asks for a second click within CONFIRM_MS. A button sends the row's
// pid and start time ("nbmon:act"); what was done comes back as a line
// ("nbmon:said"). Displaying the widget itself works too: render() below.

const STYLE_ID = "nbmon-kernels-style-1";
const SEEN_EVERY_MS = 5000;
const CONFIRM_MS = 4000;
const CSS = `
.nbmon-kernels-record.nbmon-kernels-mounted > .nbmon-kernels-static { display: none; }
.nbmon-kernels {
  font: 12px var(--jp-ui-font-family, system-ui, sans-serif); color: var(--jp-ui-font-color1, #222); overflow-x: auto;
}
.nbmon-kernels table { border-collapse: collapse; margin: 4px 0; }
.nbmon-kernels-record .nbmon-kernels th, .nbmon-kernels-record .nbmon-kernels td, .nbmon-kernels th, .nbmon-kernels td {
  padding: 2px 8px; text-align: left; white-space: nowrap;
  border-bottom: 1px solid var(--jp-border-color2, rgba(128,128,128,0.3));
}
.nbmon-kernels th { font-weight: 600; color: var(--jp-ui-font-color2, #555); }
.nbmon-kernels-record .nbmon-kernels .nbmon-number, .nbmon-kernels .nbmon-number { text-align: right; font-variant-numeric: tabular-nums; }
.nbmon-kernels tr.nbmon-this td { background: var(--jp-layout-color2, rgba(128,128,128,0.12)); }
.nbmon-kernels .nbmon-this-mark {
  margin-left: 6px; padding: 0 4px; border-radius: 3px; font-size: 10px;
  border: 1px solid var(--jp-brand-color1, #1976d2); color: var(--jp-brand-color1, #1976d2);
}
.nbmon-kernels .nbmon-share {
  display: inline-block; width: 40px; height: 6px; margin-left: 6px; vertical-align: middle;
  background: var(--jp-layout-color3, rgba(128,128,128,0.25));
}
.nbmon-kernels .nbmon-share > span { display: block; height: 100%; background: var(--jp-brand-color1, #1976d2); }
.nbmon-kernels button {
  font: inherit; font-size: 11px; margin-right: 4px; padding: 1px 6px; cursor: pointer;
  color: var(--jp-ui-font-color1, #222); background: var(--jp-layout-color1, #fff);
  border: 1px solid var(--jp-border-color1, #999); border-radius: 3px;
}
.nbmon-kernels button.nbmon-confirm {
  color: var(--jp-ui-inverse-font-color1, #fff); background: var(--jp-error-color1, #d32f2f);
  border-color: var(--jp-error-color1, #d32f2f);
}
.nbmon-kernels .nbmon-said { color: var(--jp-ui-font-color2, #555); min-height: 1em; }
`;

function installStyle(doc) {
  if (doc.getElementById(STYLE_ID)) return;
  const style = doc.createElement("style");
  style.id = STYLE_ID;
  style.textContent = CSS;
  doc.head.appendChild(style);
}

function make(doc, tag, className, text) {
  const el = doc.createElement(tag);
  if (className) el.className = className;
  if (text !== undefined) el.textContent = text;
  return el;
}

// One live table in ``host``: drawn from the model's state at every change.
class Table {
  constructor(live, host) {
    this.live = live;
    this.model = live.model;
    this.host = host;
    this.confirming = live.confirming;   // "pid:started" -> when its confirmation lapses, shared by the model's tables
    this.root = make(host.ownerDocument, "div", "nbmon-kernels");
    this.said = make(host.ownerDocument, "div", "nbmon-said");
    host.appendChild(this.root);
    this.draw();
  }

  draw() {
    const doc = this.root.ownerDocument;
    const state = this.model.get("table") || {};
    const columns = state.columns || [];
    const numbers = state.numbers || [];
    const head = make(doc, "div", "", `nbmon · your Jupyter kernels on this host, as of ${state.as_of || "?"}`);
    head.style.fontWeight = "600";
    const table = make(doc, "table");
    const header = make(doc, "tr");
    columns.forEach((name, k) => header.appendChild(make(doc, "th", numbers[k] ? "nbmon-number" : "", name)));
    header.appendChild(make(doc, "th"));
    table.appendChild(make(doc, "thead")).appendChild(header);
    const body = table.appendChild(make(doc, "tbody"));
    for (const row of state.rows || []) body.appendChild(this.row(row, numbers, state.bar));
    this.root.replaceChildren(head, table, make(doc, "div", "nbmon-total", state.total || ""), this.said);
  }

  row(row, numbers, barColumn) {
    const doc = this.root.ownerDocument;
    const tr = make(doc, "tr", row.this ? "nbmon-this" : "");
    tr.dataset.pid = String(row.pid);
    const name = tr.appendChild(make(doc, "td", "nbmon-name", row.name));
    name.title = row.path;
    if (row.this) name.appendChild(make(doc, "span", "nbmon-this-mark", "this notebook"));
    row.cells.forEach((text, k) => {
      const td = tr.appendChild(make(doc, "td", numbers[k + 1] ? "nbmon-number" : "", text));
      if (k + 1 === barColumn && typeof row.share === "number") {
        const bar = td.appendChild(make(doc, "span", "nbmon-share"));
        bar.title = "share of the memory limit";
        bar.appendChild(make(doc, "span")).style.width = `${Math.min(100, Math.max(0, row.share * 100)).toFixed(1)}%`;
      }
    });
    const actions = tr.appendChild(make(doc, "td"));
    actions.appendChild(this.button("Interrupt", () => this.act(row, "interrupt")));
    if (!row.this) {
      const key = `${row.pid}:${row.started}`;
      const confirming = (this.confirming.get(key) || 0) > Date.now();
      const shut = actions.appendChild(this.button(confirming ? "Confirm shut down" : "Shut down", () => {
        if ((this.confirming.get(key) || 0) > Date.now()) {
          this.confirming.delete(key);
          this.act(row, "shutdown");
        } else {
          this.confirming.set(key, Date.now() + CONFIRM_MS);
          setTimeout(this.live.redraw, CONFIRM_MS + 50);
        }
        this.live.redraw();
      }));
      if (confirming) shut.classList.add("nbmon-confirm");
    }
    return tr;
  }

  button(text, onClick) {
    const button = make(this.root.ownerDocument, "button", "", text);
    button.addEventListener("click", onClick);
    return button;
  }

  act(row, action) {
    this.model.send({ type: "nbmon:act", pid: row.pid, started: row.started, action });
  }

  dispose() {
    this.root.remove();
  }
}

// The model's tables: one per copy of its record in the page, and one per widget view.
class Live {
  constructor(model) {
    this.model = model;
    this.id = model.get("_nbmon").id;
    this.tables = new Map();   // host element -> Table
    this.confirming = new Map();
    this.lastSaid = "";
    this.shown = new Set();   // hosts in the viewport
    this.redraw = () => this.tables.forEach((table) => table.draw());
    this.onMessage = (msg) => {
      if (msg?.type !== "nbmon:said") return;
      this.lastSaid = String(msg.text);
      this.tables.forEach((table) => (table.said.textContent = this.lastSaid));
    };
    model.on("change:table", this.redraw);
    model.on("msg:custom", this.onMessage);
    this.visibility = new IntersectionObserver((entries) => {
      for (const entry of entries) entry.isIntersecting ? this.shown.add(entry.target) : this.shown.delete(entry.target);
      this.seen();
    });
    this.mountAll();
    this.mutations = new MutationObserver(() => this.mountAll());
    this.mutations.observe(document.body, { childList: true, subtree: true });
    this.timer = setInterval(() => this.seen(), SEEN_EVERY_MS);
  }

  mountAll() {
    for (const [host, table] of this.tables) {
      if (!host.isConnected) this.unmount(host, table);
    }
    for (const record of document.querySelectorAll(`.nbmon-kernels-record[data-nbmon-kernels="${this.id}"]`)) {
      if (!this.tables.has(record)) this.mount(record);
    }
  }

  mount(host) {
    const table = new Table(this, host);
    table.said.textContent = this.lastSaid;
    this.tables.set(host, table);
    host.classList.add("nbmon-kernels-mounted");
    this.visibility.observe(host);
    return table;
  }

  unmount(host, table) {
    this.visibility.unobserve(host);
    this.shown.delete(host);
    table.dispose();
    host.classList.remove("nbmon-kernels-mounted");
    this.tables.delete(host);
  }

  seen() {
    if (this.shown.size && document.visibilityState === "visible") this.model.send({ type: "nbmon:seen" });
  }

  dispose() {
    clearInterval(this.timer);
    this.mutations.disconnect();
    this.visibility.disconnect();
    this.model.off("change:table", this.redraw);
    this.model.off("msg:custom", this.onMessage);
    for (const [host, table] of [...this.tables]) this.unmount(host, table);
  }
}

const LIVES = (globalThis.__nbmonKernels ??= new Map());   // model id -> Live

export default {
  initialize({ model }) {
    installStyle(document);
    const live = new Live(model);
    LIVES.set(live.id, live);
    return () => {
      LIVES.delete(live.id);
      live.dispose();
    };
  },
  render({ model, el }) {
    const live = LIVES.get(model.get("_nbmon").id);
    if (!live) return undefined;
    const table = live.mount(el);
    return () => live.unmount(el, table);
  },
};
