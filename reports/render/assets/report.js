(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("allocscope-data").textContent);
  const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  function hb(n) {            // human bytes, as reports.render.human_bytes
    if (n == null) return "-";
    let s = n < 0 ? "-" : "", v = Math.abs(n), i = 0;
    while (v >= 1024 && i < UNITS.length - 1) { v /= 1024; i++; }
    return s + (i === 0 ? v.toFixed(0) : v.toFixed(1)) + " " + UNITS[i];
  }
  const COLORS = ["#2b6cb0", "#dd6b20", "#38a169", "#d53f8c", "#805ad5", "#d69e2e", "#319795", "#e53e3e",
                  "#718096", "#975a16"];
  const BYTE_INCRS = [];     // y ticks at 1, 2, 4... 512 of B, KiB, MiB...
  for (let k = 0; k < 6; k++) for (let m = 1; m < 1024; m *= 2) BYTE_INCRS.push(m * Math.pow(1024, k));
  function alpha(hex, a) {
    const n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + a + ")";
  }
  function markInk(u) {       // painted pixels of the plot canvas: data-ink on the chart element
    const c = u.ctx.canvas, px = u.ctx.getImageData(0, 0, c.width, c.height).data;
    let n = 0;
    for (let i = 3; i < px.length; i += 4) if (px[i] !== 0) n++;
    u.root.parentNode.dataset.ink = String(n);
  }
  function empty(el, msg) { el.innerHTML = '<p class="empty">' + msg + "</p>"; el.dataset.ink = "0"; }

  function chart(el, spec, stacked) {
    if (!spec.t.length || !spec.series.length) return empty(el, "no data");
    const raw = [spec.t].concat(spec.series.map(s => s.values));
    let data = raw, bands = [];
    if (stacked) {            // cumulative sums, rank 1 at the bottom; bands fill between neighbours
      const acc = spec.t.map(() => 0);
      data = [spec.t].concat(spec.series.map(s => s.values.map((v, i) => (acc[i] += v || 0))));
      for (let i = 2; i < data.length; i++) bands.push({series: [i, i - 1]});
    }
    const series = [{label: "elapsed", value: (u, v) => v == null ? "-" : v.toFixed(2) + " s"}].concat(
      spec.series.map((s, k) => ({
        label: s.label, stroke: COLORS[k % COLORS.length], width: stacked ? 1 : 2,
        fill: stacked ? alpha(COLORS[k % COLORS.length], 0.55) : undefined,
        value: (u, v, si, i) => i == null ? "-" : hb(raw[si][i]),
        dash: s.dash ? [7, 4] : undefined, points: {show: false}, spanGaps: !!s.span,
      })));
    const opts = {
      width: Math.max(320, el.clientWidth), height: 320, series: series, bands: bands,
      scales: {x: {time: false}, y: {range: (u, lo, hi) => [0, hi > 0 ? hi * 1.05 : 1]}},
      axes: [{label: "elapsed (s)"}, {size: 80, incrs: BYTE_INCRS, values: (u, ticks) => ticks.map(v => hb(v).replace(".0 ", " "))}],
      legend: {live: true}, cursor: {drag: {x: true, y: false}},
      hooks: {draw: [markInk], ready: [u => u.setLegend({idx: spec.t.length - 1})]},
    };
    const u = new uPlot(opts, data, el);
    window.addEventListener("resize", () => u.setSize({width: Math.max(320, el.clientWidth), height: 320}));
  }

  // Differential colouring (a diff's flame graph: width by B, each node's `a` is A's bytes):
  // red grew, blue shrank, the deeper the more; near-white about the same.
  function diffColor(n) {
    const a = n.a || 0, g = (n.v - a) / Math.max(n.v, a, 1);
    if (Math.abs(g) < 0.02) return "hsl(0,0%,90%)";
    return "hsl(" + (g > 0 ? 0 : 220) + ",80%," + (88 - 40 * Math.abs(g)).toFixed(0) + "%)";
  }

  function flame(el, root, what, diff) {
    if (!root || !root.v) { empty(el, "no live bytes " + what); el.dataset.nodes = "0"; return; }
    (function link(n, p) { n.p = p; (n.c || []).forEach(c => link(c, n)); })(root, null);
    const NS = "http://www.w3.org/2000/svg", H = 18, total = root.v;
    function depth(n) { return 1 + Math.max(0, ...(n.c || []).map(depth)); }
    function color(name) {
      let h = 0;
      for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
      return "hsl(" + (10 + h % 45) + "," + (65 + h % 20) + "%," + (58 + (h >> 8) % 14) + "%)";
    }
    function draw(focus) {
      const W = Math.max(320, el.clientWidth), svg = document.createElementNS(NS, "svg");
      const rows = depth(focus);
      svg.setAttribute("viewBox", "0 0 " + W + " " + rows * H);
      svg.setAttribute("height", String(rows * H));
      let nodes = 0;
      function add(n, x, w, d) {
        if (w < 0.5) return;
        const g = document.createElementNS(NS, "g"), r = document.createElementNS(NS, "rect");
        r.setAttribute("x", x); r.setAttribute("y", d * H); r.setAttribute("width", w); r.setAttribute("height", H - 1);
        r.setAttribute("fill", diff ? diffColor(n) : n === root ? "#c9d3e3" : color(n.n));
        const t = document.createElementNS(NS, "title");
        t.textContent = n.n + " — " + (diff ? "B " + hb(n.v) + ", A " + hb(n.a || 0) + " (" +
          (n.v >= (n.a || 0) ? "+" : "") + hb(n.v - (n.a || 0)) + ")" :
          hb(n.v) + " (" + (100 * n.v / total).toFixed(2) + "%)");
        g.appendChild(t); g.appendChild(r);
        const chars = Math.floor((w - 6) / 7);
        if (chars >= 3) {
          const tx = document.createElementNS(NS, "text");
          tx.setAttribute("x", x + 3); tx.setAttribute("y", d * H + 13);
          const label = n.n + " " + hb(n.v);
          tx.textContent = label.length > chars ? label.slice(0, chars - 1) + "…" : label;
          g.appendChild(tx);
        }
        g.addEventListener("click", () => draw(n === focus && n.p ? n.p : n));
        svg.appendChild(g); nodes++;
        let cx = x;
        (n.c || []).forEach(c => { const cw = w * c.v / n.v; add(c, cx, cw, d + 1); cx += cw; });
      }
      add(focus, 0, W, 0);
      el.replaceChildren(svg);
      el.dataset.nodes = String(nodes);
    }
    draw(root);
  }

  // The flame graph's views ("peak": stacks live at the moment of the highest live total;
  // "end": live at the end), one button each; data-view on the graph says which is drawn.
  function flameViews(el, bar, F) {
    const buttons = Array.from(bar.querySelectorAll("button[data-view]"));
    function show(view) {
      el.dataset.view = view;
      buttons.forEach(b => b.setAttribute("aria-pressed", String(b.dataset.view === view)));
      flame(el, F.views[view], view === "end" ? "at the end of the recording" : "at the peak", !!F.diff);
    }
    buttons.forEach(b => b.addEventListener("click", () => show(b.dataset.view)));
    show(F.default);
  }

  // The report page has all three; the diff page (reports.html.to_diff_html) a timeline of both
  // runs and the differential flame graph.
  const el = id => document.getElementById(id);
  if (el("chart-timeline") && D.timeline) chart(el("chart-timeline"), D.timeline, false);
  if (el("chart-sites") && D.sites) chart(el("chart-sites"), D.sites, true);
  if (el("flame-graph") && D.flame) flameViews(el("flame-graph"), el("flame-views"), D.flame);
  document.body.dataset.rendered = "1";
})();
