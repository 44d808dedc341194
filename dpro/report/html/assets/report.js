// dpro report: draws the Vega-Lite charts (inlined Vega bundle) and the canvas Gantt.
// Data: the JSON in #dpro-data (µs, bytes); converted to ms / MiB here, at display.
// Sets window.__dproReady = true once everything is drawn; window.__dpro holds what was drawn.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("dpro-data").textContent);
  const specs = JSON.parse(document.getElementById("dpro-specs").textContent);
  const CAT_COLORS = {FW: "#4e79a7", BW: "#f28e2b", UPDATE: "#59a14f", IO: "#b07aa1", COMM: "#e15759", OTHER: "#9c9c9c"};
  const ms = (us) => (us / 1000).toFixed(3) + " ms";
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));

  function gantt() {
    const G = data.gantt, ops = G.ops, n = ops.start.length, L = G.lanes.length;
    const laneH = L > 60 ? 8 : 18;
    const labels = document.getElementById("gantt-labels");
    labels.style.setProperty("--lane-h", laneH + "px");
    labels.innerHTML = G.lanes.map((l, i) => '<div class="lane-label" data-lane="' + i + '" title="' + esc(l) + '">' + esc(l) + "</div>").join("");
    if (laneH < 12) labels.style.fontSize = "7px";
    const canvas = document.getElementById("gantt-canvas"), box = document.getElementById("gantt-canvas-box");
    const W = Math.max(300, box.clientWidth), H = L * laneH;
    const dpr = n > 100000 ? 1 : (window.devicePixelRatio || 1);
    canvas.width = W * dpr; canvas.height = H * dpr; canvas.style.width = W + "px"; canvas.style.height = H + "px";
    const ctx = canvas.getContext("2d");
    ctx.scale(dpr, dpr);
    // per lane, the ops sorted by start (for the hover)
    const byLane = Array.from({length: L}, () => []);
    for (let i = 0; i < n; i++) byLane[ops.lane[i]].push(i);
    for (const a of byLane) a.sort((x, y) => ops.start[x] - ops.start[y]);
    const crit = [];
    for (let i = 0; i < n; i++) if (ops.crit[i]) crit.push(i);
    crit.sort((x, y) => ops.start[x] - ops.start[y] || x - y);
    let t0 = 0, t1 = Math.max(G.makespan_us, 1e-6);
    const fill = G.categories.map((c) => CAT_COLORS[c] || "#999");

    function draw() {
      const sx = W / (t1 - t0);
      ctx.clearRect(0, 0, W, H);
      for (let l = 0; l < L; l++) { if (l % 2) { ctx.fillStyle = "#f7f7f7"; ctx.fillRect(0, l * laneH, W, laneH); } }
      ctx.globalAlpha = 0.75;
      for (let c = 0; c < fill.length; c++) {   // one fillStyle per category: fast for big lanes
        ctx.fillStyle = fill[c];
        for (let i = 0; i < n; i++) {
          if (ops.cat[i] !== c || ops.crit[i]) continue;
          const x = (ops.start[i] - t0) * sx, w = Math.max(ops.dur[i] * sx, 0.6);
          if (x > W || x + w < 0) continue;
          ctx.fillRect(x, ops.lane[i] * laneH + 1, w, laneH - 2);
        }
      }
      ctx.globalAlpha = 1;
      ctx.strokeStyle = "#c00"; ctx.lineWidth = 1.2;   // the critical path: a line through its ops
      ctx.beginPath();
      crit.forEach((i, k) => {
        const x = (ops.start[i] - t0) * sx, y = ops.lane[i] * laneH + laneH / 2;
        if (k) ctx.lineTo(x, y); else ctx.moveTo(x, y);
        ctx.lineTo(x + ops.dur[i] * sx, y);
      });
      ctx.stroke();
      ctx.strokeStyle = "#000"; ctx.lineWidth = 1;
      for (const i of crit) {   // outlined where wide enough to see the category inside, else red
        const x = (ops.start[i] - t0) * sx, w = Math.max(ops.dur[i] * sx, 1.5), y = ops.lane[i] * laneH + 1;
        ctx.fillStyle = w >= 4 ? fill[ops.cat[i]] : "#c00";
        ctx.fillRect(x, y, w, laneH - 2);
        if (w >= 4) ctx.strokeRect(x, y, w, laneH - 2);
      }
      document.getElementById("gantt-range").textContent = ms(t0) + " – " + ms(t1);
    }

    const tip = document.getElementById("gantt-tip");
    function opAt(ev) {
      const r = canvas.getBoundingClientRect(), px = ev.clientX - r.left, l = Math.floor((ev.clientY - r.top) / laneH);
      if (l < 0 || l >= L) return -1;
      const sx = W / (t1 - t0), t = t0 + px / sx, tol = 3 / sx, a = byLane[l];
      let lo = 0, hi = a.length - 1, k = -1;
      while (lo <= hi) { const m = (lo + hi) >> 1; if (ops.start[a[m]] <= t + tol) { k = m; lo = m + 1; } else hi = m - 1; }
      let best = -1;
      for (let j = k; j >= 0 && j > k - 64; j--) {
        const i = a[j];
        if (ops.start[i] + ops.dur[i] + tol >= t && (best < 0 || ops.dur[i] < ops.dur[best])) best = i;
      }
      return best;
    }
    canvas.addEventListener("mousemove", (ev) => {
      const i = opAt(ev);
      if (i < 0) { tip.style.display = "none"; return; }
      const merged = ops.count[i] > 1;
      tip.innerHTML = "<b>" + esc(merged ? ops.count[i] + " ops merged" : G.names[ops.name[i]]) + "</b><br>" +
        "category " + G.categories[ops.cat[i]] + (merged ? " (most of the time)" : "") + "<br>" +
        "device " + esc(G.lanes[ops.lane[i]]) + "<br>start " + ms(ops.start[i]) + ", duration " + ms(ops.dur[i]) +
        "<br>layer " + (ops.layer[i] >= 0 ? esc(G.layers[ops.layer[i]]) : "<span class=muted>unknown</span>") +
        (ops.crit[i] ? "<br><b style='color:#c00'>on the critical path</b>" : "");
      tip.style.display = "block"; tip.style.left = ev.clientX + 14 + "px"; tip.style.top = ev.clientY + 10 + "px";
    });
    canvas.addEventListener("mouseleave", () => { tip.style.display = "none"; });
    canvas.addEventListener("wheel", (ev) => {   // zoom around the pointer
      ev.preventDefault();
      const r = canvas.getBoundingClientRect(), f = ev.deltaY > 0 ? 1.25 : 0.8;
      const t = t0 + (ev.clientX - r.left) / W * (t1 - t0);
      t0 = Math.max(0, t - (t - t0) * f); t1 = Math.min(G.makespan_us, t + (t1 - t) * f);
      if (t1 - t0 < 1e-3) t1 = t0 + 1e-3;
      draw();
    }, {passive: false});
    let drag = null;
    canvas.addEventListener("mousedown", (ev) => { drag = {x: ev.clientX, t0: t0, t1: t1}; });
    window.addEventListener("mouseup", () => { drag = null; });
    window.addEventListener("mousemove", (ev) => {
      if (!drag) return;
      const dt = (drag.x - ev.clientX) / W * (drag.t1 - drag.t0);
      t0 = drag.t0 + dt; t1 = drag.t1 + dt; draw();
    });
    canvas.addEventListener("dblclick", () => { t0 = 0; t1 = Math.max(G.makespan_us, 1e-6); draw(); });
    draw();
    return {lanes: L, laneHeight: laneH, width: W, drawnOps: n, criticalOps: crit.map((i) => G.names[ops.name[i]])};
  }

  async function main() {
    const views = {};
    for (const [id, spec] of Object.entries(specs)) {
      const el = document.getElementById("chart-" + id);
      if (!el) continue;
      const res = await vegaEmbed(el, spec, {mode: "vega-lite", renderer: "svg", actions: false});
      views[id] = res.view;
    }
    const g = gantt();
    window.__dpro = Object.assign({charts: Object.keys(views)}, g);
    window.__dproReady = true;
  }
  main().catch((e) => { console.error("dpro report: " + e); });
})();
