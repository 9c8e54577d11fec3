const D = window.QDATA || {}, T = D.table, COLS = (i) => D[i] || {};
const $ = (id) => document.getElementById(id);
function el(tag, text, cls) { const e = document.createElement(tag);
  if (text !== undefined) e.textContent = String(text); if (cls) e.className = cls; return e; }
function firstDiff(a, b) { let i = 0; while (i < a.length && i < b.length && a[i] === b[i]) i++; return i; }
function responseBox(text, other) {
  const pre = el("pre"); const i = other === null ? text.length : firstDiff(text, other);
  pre.appendChild(document.createTextNode(text.slice(0, i)));
  if (i < text.length) pre.appendChild(el("mark", text.slice(i)));
  return pre; }
function counts() {
  const box = $("counts"); box.textContent = "";
  box.appendChild(el("span", T.questions + " questions"));
  for (const [k, v] of Object.entries(T.counts)) box.appendChild(el("span", k.replace(/_/g, " ") + ": " + v, "count"));
  const m = T.mcnemar; box.appendChild(el("span", "McNemar (first vs last): " + m.wrong_then_right +
    " learned, " + m.right_then_wrong + " forgotten, exact p = " + m.p_value.toPrecision(3), "mcnemar"));
  for (const [label, u] of Object.entries(T.unmatched)) box.appendChild(el("span", label + ": " + u.count + " unmatched", "unmatched")); }
function detail(row) {
  const td = el("td"); td.colSpan = T.columns.length + 2;
  td.appendChild(el("p", "Question: " + row.question)); td.appendChild(el("p", "Ground truth: " + row.ground_truth));
  const grid = el("div", undefined, "cols");
  T.columns.forEach((label, i) => { const box = el("div"); box.appendChild(el("h4", label));
    const mine = COLS(i)[row.id] || [], ref = COLS(0)[row.id] || [];
    mine.forEach((r, k) => box.appendChild(responseBox(r, i === 0 ? null : (ref[k] ?? "")))); grid.appendChild(box); });
  td.appendChild(grid); const tr = el("tr", undefined, "detail"); tr.appendChild(td); return tr; }
function render() {
  const filter = $("filter").value, q = $("search").value.toLowerCase(), sort = $("sort").value;
  let rows = T.rows.filter((r) => (filter === "all" || r.tags.includes(filter)) &&
    (!q || r.question.toLowerCase().includes(q)));
  if (sort === "change") rows = rows.slice().sort((a, b) => b.change - a.change);
  if (sort === "length") rows = rows.slice().sort((a, b) => Math.max(...b.length) - Math.max(...a.length));
  const body = $("rows"); body.textContent = "";
  for (const r of rows) { const tr = el("tr", undefined, "row"); tr.dataset.id = r.id;
    tr.appendChild(el("td", r.question.slice(0, 120), "q")); tr.appendChild(el("td", r.ground_truth));
    r.shares.forEach((s, i) => { const read = r.read[i];
      const cls = s >= 1 ? "right" : s > 0 ? "part" : read ? "wrong" : "none";
      const text = (T.sampled ? Math.round(s * 100) + "% " : s >= 0.5 ? "\u2713 " : read ? "\u2717 " : "\u2205 ") + read;
      tr.appendChild(el("td", text, "cell " + cls)); });
    tr.addEventListener("click", () => { const next = tr.nextSibling;
      if (next && next.className === "detail") next.remove(); else tr.after(detail(r)); });
    body.appendChild(tr); }
  $("shown").textContent = rows.length + " shown"; }
function main() { const t0 = performance.now(); counts(); const head = $("head");
  for (const label of ["question", "truth", ...T.columns]) head.appendChild(el("th", label));
  for (const id of ["filter", "sort"]) $(id).addEventListener("change", render);
  $("search").addEventListener("input", render);
  // a link may choose the view: questions.html#filter=learned&sort=change&q=apples
  const want = new URLSearchParams(location.hash.slice(1));
  if (want.get("filter")) $("filter").value = want.get("filter");
  if (want.get("sort")) $("sort").value = want.get("sort");
  if (want.get("q")) $("search").value = want.get("q");
  render(); document.body.dataset.renderMs = (performance.now() - t0).toFixed(1); }
main();
