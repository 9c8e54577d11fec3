var IDX = window.ROLLOUTS_INDEX.run, H = hashParams();
var state = {kind: H.kind || (IDX.train.length ? 'train' : 'val'), step: null,
             filter: H.filter || 'all', sort: H.sort || 'none', search: H.search || ''};
function fmt(v){ return v === null || v === undefined ? 'n/a' : (+(+v).toPrecision(4)).toString(); }
function stepsOf(kind){ return kind === 'train' ? IDX.train : IDX.val; }
function keyOf(){ return (state.kind === 'train' ? 'train' : 'val') + '-' + state.step; }
function keep(r){
  var f = state.filter;
  if (f === 'right' && !(r.s > 0)) return false;
  if (f === 'wrong' && r.s > 0) return false;
  if (f === 'nomarker' && r.marker) return false;
  if (f === 'hedged' && !r.hedged) return false;
  if (f === 'clipped' && r.clip !== 1) return false;
  return true;
}
function pills(r){
  return '<span class="pill ' + (r.s > 0 ? 'right' : 'wrong') + '">score ' + (r.nan ? 'NaN' : fmt(r.s)) + '</span>' +
    (r.marker ? '' : '<span class=pill>no ####</span>') + (r.hedged ? '<span class=pill>hedged</span>' : '') +
    (r.clip === 1 ? '<span class=pill>cut at ' + esc(IDX.limit) + ' tokens</span>' : '') +
    (r.n !== null && r.n !== undefined ? '<span class=pill>' + esc(r.n) + ' tokens</span>' : '');
}
function renderList(){
  var D = window.ROLLOUTS[keyOf()]; if (!D) return;
  var q = state.search.toLowerCase(), rows = D.rows.map(function(r, i){ r.i = i; return r; })
    .filter(keep).filter(function(r){ return !q || (r.o + ' ' + D.prompts[r.p]).toLowerCase().indexOf(q) >= 0; });
  if (state.sort === 'score') rows.sort(function(a, b){ return (b.s || 0) - (a.s || 0); });
  if (state.sort === 'length') rows.sort(function(a, b){ return (b.n || b.o.length) - (a.n || a.o.length); });
  document.getElementById('status').textContent = rows.length + ' of ' + D.rows.length + ' responses' +
    (state.filter === 'clipped' && !IDX.lengths ? ' (no trace: lengths unknown)' : '');
  document.getElementById('list').innerHTML = '<table id=rows><tr><th>#</th><th>question</th><th>response</th>' +
    '<th>answer</th><th></th></tr>' + rows.map(function(r){
      return '<tr class=row><td>' + esc(r.i) + '</td><td>' + esc(D.prompts[r.p]) + '</td><td><pre>' + esc(r.o) +
        '</pre></td><td>' + esc(r.gt) + '</td><td>' + pills(r) + '</td></tr>'; }).join('') + '</table>';
}
function renderCompare(){
  var a = IDX.val[0], b = IDX.val[IDX.val.length - 1], A = window.ROLLOUTS['val-' + a], B = window.ROLLOUTS['val-' + b];
  if (!A || !B) return;
  var later = {}; B.rows.forEach(function(r){ later[B.prompts[r.p]] = r; });
  var q = state.search.toLowerCase(), rows = A.rows.filter(function(r){
    return !q || A.prompts[r.p].toLowerCase().indexOf(q) >= 0; });
  var changed = rows.filter(function(r){ var o = later[A.prompts[r.p]]; return o && (o.s > 0) !== (r.s > 0); }).length;
  document.getElementById('status').textContent = rows.length + ' questions; ' + changed + ' changed between step ' + a + ' and step ' + b;
  document.getElementById('list').innerHTML = '<table id=compare><tr><th>question</th><th>answer</th><th>step ' + esc(a) +
    '</th><th>step ' + esc(b) + '</th></tr>' + rows.map(function(r){ var o = later[A.prompts[r.p]] || {o: '(not asked)', s: null};
      return '<tr class=row><td>' + esc(A.prompts[r.p]) + '</td><td>' + esc(r.gt) + '</td><td><pre>' + esc(r.o) + '</pre>' +
        pills(r) + '</td><td><pre>' + esc(o.o) + '</pre>' + (o.s !== null ? pills(o) : '') + '</td></tr>'; }).join('') + '</table>';
}
function render(){ if (state.kind === 'compare') renderCompare(); else renderList(); }
function ensure(){
  var steps = state.kind === 'compare' ? IDX.val : stepsOf(state.kind);
  var sel = document.getElementById('step');
  if (state.kind === 'compare') { sel.innerHTML = ''; sel.disabled = true; }
  else {
    sel.disabled = false;
    if (steps.indexOf(state.step) < 0) state.step = H.step !== undefined && steps.indexOf(+H.step) >= 0 ? +H.step : steps[steps.length - 1];
    sel.innerHTML = steps.map(function(s){ return '<option' + (s === state.step ? ' selected' : '') + '>' + esc(s) + '</option>'; }).join('');
  }
  var need = state.kind === 'compare' ? (steps.length ? ['val-' + steps[0], 'val-' + steps[steps.length - 1]] : []) : [keyOf()];
  var missing = need.filter(function(k){ return !(window.ROLLOUTS && window.ROLLOUTS[k]); });
  if (!missing.length) { render(); return; }
  var left = missing.length;
  missing.forEach(function(k){ loadData('rollouts/' + k + '.js', function(){ if (--left === 0) render(); }); });
}
['kind', 'filter', 'sort'].forEach(function(id){
  var el = document.getElementById(id); el.value = state[id];
  el.addEventListener('change', function(){ state[id] = el.value; ensure(); });
});
document.getElementById('step').addEventListener('change', function(){ state.step = +this.value; ensure(); });
var box = document.getElementById('search'); box.value = state.search;
box.addEventListener('input', function(){ state.search = box.value; render(); });
ensure();
document.addEventListener('DOMContentLoaded', render);
