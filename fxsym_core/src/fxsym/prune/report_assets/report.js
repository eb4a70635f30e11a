// fxsym HTML report: renders the JSON in #data; no network, no libraries.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("data").textContent);
  const all = data.groups.concat(data.constant);
  const byId = new Map(all.map((g) => [g.id, g]));
  const nodeEl = [];
  const el = (tag, attrs, text) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };

  // -- graph: nested clusters by module path, one row per node ---------------------------
  function renderCluster(c, parent) {
    for (const child of c.children) {
      if (typeof child === "number") {
        const n = data.nodes[child];
        const row = el("div", { class: "node op-" + n.op, id: "n" + n.id,
          "data-name": n.name, "data-groups": " " + n.groups.join(" ") + " ",
          title: n.name + (n.target ? " = " + n.target : "") });
        const chips = el("span", { class: "chips" });
        for (const gid of n.groups) {
          const g = byId.get(gid);
          if (!g) continue;
          const chip = el("span", { class: "chip" + (g.constant ? " const" : ""),
            title: g.name });
          chip.style.background = g.color;
          chips.appendChild(chip);
        }
        if (n.groups.length && byId.get(n.groups[0])) {
          row.style.borderLeftColor = byId.get(n.groups[0]).color;
        }
        row.appendChild(chips);
        row.appendChild(el("span", { class: "lbl" }, n.label));
        if (n.shape) row.appendChild(el("span", { class: "shape" }, n.shape));
        parent.appendChild(row);
        nodeEl[n.id] = row;
      } else {
        const d = el("details", { class: "cluster" + (child.collapsed ? " repeat" : ""),
          "data-path": child.path });
        if (!child.collapsed) d.open = true;
        const name = child.path.split(".").pop();
        const summary = child.collapsed
          ? child.path + " \u2014 same as " + child.same_as + " (" + child.count + " nodes)"
          : name + "  \u00b7 " + child.path + " (" + child.count + " nodes)";
        d.appendChild(el("summary", {}, summary));
        d.addEventListener("toggle", scheduleEdges);
        renderCluster(child, d);
        parent.appendChild(d);
      }
    }
  }
  const tree = document.getElementById("tree");
  renderCluster(data.tree, tree);

  // -- edges: arcs on the right of the rows, to the nearest visible row -------------------
  const svg = document.getElementById("edges");
  const canvas = document.getElementById("canvas");
  function visibleAnchor(e) {
    let shown = e;
    for (let p = e.parentElement; p && p !== tree; p = p.parentElement) {
      if (p.tagName === "DETAILS" && !p.open) shown = p.querySelector(":scope > summary");
    }
    return shown;
  }
  let pending = false;
  function scheduleEdges() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; drawEdges(); });
  }
  function drawEdges() {
    const box = canvas.getBoundingClientRect();
    const x0 = tree.getBoundingClientRect().right - box.left;
    const pos = new Map();
    const y = (e) => {
      if (!pos.has(e)) {
        const r = e.getBoundingClientRect();
        pos.set(e, r.top - box.top + r.height / 2);
      }
      return pos.get(e);
    };
    const parts = [];
    const seen = new Set();
    for (const n of data.nodes) {
      const b = visibleAnchor(nodeEl[n.id]);
      for (const i of n.inputs) {
        const a = visibleAnchor(nodeEl[i]);
        if (a === b) continue;
        const ya = y(a), yb = y(b);
        const key = ya + ":" + yb;
        if (seen.has(key)) continue;
        seen.add(key);
        const w = Math.min(220, 8 + Math.abs(yb - ya) * 0.12);
        const hl = nodeEl[i].classList.contains("hl") && nodeEl[n.id].classList.contains("hl");
        parts.push('<path class="' + (hl ? "hl" : "") + '" d="M' + x0 + " " + ya + " C" +
          (x0 + w) + " " + ya + " " + (x0 + w) + " " + yb + " " + x0 + " " + yb + '"/>');
      }
    }
    svg.setAttribute("width", canvas.scrollWidth);
    svg.setAttribute("height", canvas.scrollHeight);
    svg.innerHTML = parts.join("");
  }
  window.addEventListener("resize", scheduleEdges);

  // -- tables -------------------------------------------------------------------------------
  const rows = new Map();
  function groupRow(g) {
    const tr = el("tr", { class: "group" + (g.constant ? " const" : ""),
      "data-gid": g.id, "data-name": g.name });
    const sw = el("span", { class: "swatch" });
    sw.style.background = g.color;
    const count = (n) => (n === null || n === undefined ? "?" : n.toLocaleString("en"));
    const td = el("td");
    td.appendChild(sw);
    tr.appendChild(td);
    tr.appendChild(el("td", { class: "name" }, g.name));
    tr.appendChild(el("td", { class: "num" }, String(g.size)));
    if (g.constant) {
      tr.appendChild(el("td", { class: "reason" }, g.reason));
    } else {
      tr.appendChild(el("td", { class: "num" }, String(g.unit)));
      tr.appendChild(el("td", {}, g.sortable ? "yes" : "no"));
      tr.appendChild(el("td", { class: "num", title: g.members.join("\n") },
        String(g.members.length)));
      tr.appendChild(el("td", { class: "num" }, count(g.params)));
      tr.appendChild(el("td", { class: "num" }, count(g.macs)));
    }
    tr.addEventListener("click", () => select(g));
    rows.set(g.id, tr);
    return tr;
  }
  const groupsBody = document.querySelector("#groups tbody");
  data.groups.forEach((g) => groupsBody.appendChild(groupRow(g)));
  const constBody = document.querySelector("#constant tbody");
  data.constant.forEach((g) => constBody.appendChild(groupRow(g)));
  const fixed = document.getElementById("fixed");
  data.fixed.forEach((f) => fixed.appendChild(el("li", {}, f)));
  document.getElementById("report").textContent =
    data.report.length ? data.report.join("\n") : "nothing to report";
  document.getElementById("summary").textContent = data.nodes.length + " nodes \u00b7 " +
    data.groups.length + " searchable groups \u00b7 " + data.constant.length +
    " constant groups";

  // -- highlighting, search, selection -----------------------------------------------------
  function highlight(ids, reveal) {
    for (const e of document.querySelectorAll(".node.hl")) e.classList.remove("hl");
    for (const e of document.querySelectorAll("summary.has-hl")) e.classList.remove("has-hl");
    const want = new Set(ids);
    let first = null;
    for (const n of data.nodes) {
      if (!n.groups.some((g) => want.has(g))) continue;
      const e = nodeEl[n.id];
      e.classList.add("hl");
      first = first || e;
      for (let p = e.parentElement; p && p !== tree; p = p.parentElement) {
        if (p.tagName !== "DETAILS") continue;
        if (reveal) p.open = true;
        else if (!p.open) p.querySelector(":scope > summary").classList.add("has-hl");
      }
    }
    if (reveal && first) first.scrollIntoView({ block: "center" });
    scheduleEdges();
  }
  const detail = document.getElementById("detail");
  function select(g) {
    for (const r of document.querySelectorAll("tr.selected")) r.classList.remove("selected");
    rows.get(g.id).classList.add("selected");
    detail.hidden = false;
    detail.innerHTML = "";
    detail.appendChild(el("h3", {}, g.name));
    detail.appendChild(el("div", {}, (g.constant ? "constant group" : "searchable group") +
      ": size " + g.size + (g.unit > 1 ? " units of " + g.unit : "") +
      (g.sortable ? ", sortable" : "") +
      (g.routed ? ", routed (a router picks its entries by value): keeps at least " +
        g.min_size : "")));
    if (g.constant) {
      detail.appendChild(el("div", { class: "reason" }, "why constant: " + g.reason));
      const lines = g.trace.length ? g.trace.join("\n")
        : "(no trace-report line: no boundary was recorded for this group)";
      detail.appendChild(el("pre", { class: "trace" }, lines));
    }
    const ul = el("ul");
    g.members.forEach((m) => ul.appendChild(el("li", {}, m)));
    detail.appendChild(el("div", {}, g.members.length + " members:"));
    detail.appendChild(ul);
    highlight([g.id], true);
  }
  const search = document.getElementById("search");
  search.addEventListener("input", () => {
    const q = search.value.trim().toLowerCase();
    const hits = [];
    for (const g of all) {
      const hit = !q || g.name.toLowerCase().includes(q) ||
        g.members.some((m) => m.toLowerCase().includes(q));
      rows.get(g.id).hidden = !hit;
      if (hit && q) hits.push(g);
    }
    const exact = hits.filter((g) => g.name.toLowerCase() === q);
    highlight((exact.length ? exact : hits).map((g) => g.id), exact.length > 0);
  });
  scheduleEdges();
})();
