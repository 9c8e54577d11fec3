var IDX = window.REPLAY_INDEX.run, H = hashParams();
var cur = {step: +(H.step || IDX['default'].step), sample: H.sample !== undefined ? +H.sample :
           (H.step ? 0 : IDX['default'].sample)};
var NAMES = {rollout_log_prob: 'vLLM log-prob', old_log_prob: 'actor log-prob (old)',
  ref_log_prob: 'reference log-prob', kl: 'KL estimator', value: 'value', score: 'score',
  reward: 'reward', advantage: 'advantage', 'return': 'return', entropy: 'entropy'};
function fmt(v){ return v === null || v === undefined ? 'n/a' :
  (typeof v === 'number' ? (Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-3) ?
   v.toExponential(3) : (+v.toPrecision(4)).toString()) : esc(v)); }
function colour(a, scale){
  if (a === null || a === undefined || !scale) return '#fff';
  var t = Math.max(-1, Math.min(1, a / scale)), c = t < 0 ? [215,48,39] : [26,152,80];
  var w = Math.abs(t), mix = function(x){ return Math.round(255 + (x - 255) * w); };
  return 'rgb(' + mix(c[0]) + ',' + mix(c[1]) + ',' + mix(c[2]) + ')';
}
function answerSpan(tokens){
  var last = -1; tokens.forEach(function(t, i){ if (t.indexOf('####') >= 0) last = i; });
  if (last < 0) return [-1, -1];
  var end = last + 1;
  while (end < tokens.length && tokens[end].indexOf('\n') < 0 && tokens[end].indexOf('<|') < 0)
    end++;
  return [last, end];
}
function curve(title, series, n, tokens){
  var w = Math.max(640, 26 * n + 60), h = 130, pad = 34, vals = [];
  series.forEach(function(s){ (s.values || []).forEach(function(v){ if (v !== null) vals.push(v); }); });
  if (!vals.length) return '';
  var lo = Math.min.apply(null, vals.concat([0])), hi = Math.max.apply(null, vals.concat([0]));
  if (hi - lo < 1e-12) { hi += 1; lo -= 1; }
  var x = function(i){ return pad + (w - pad - 10) * (n > 1 ? i / (n - 1) : 0.5); };
  var y = function(v){ return 10 + (h - 40) * (hi - v) / (hi - lo); };
  var out = '<svg class=curve data-curve="' + esc(title) + '" data-x0=' + x(0) + ' data-dx=' +
    (n > 1 ? x(1) - x(0) : 0) + ' width=' + w + ' height=' + h + '>';
  out += '<line class=cursor x1=-10 x2=-10 y1=4 y2=' + (h - 18) + ' stroke=#111 stroke-dasharray="3,3" />';
  out += '<line x1=' + pad + ' x2=' + (w - 10) + ' y1=' + y(0) + ' y2=' + y(0) + ' stroke=#bbb />';
  out += '<text x=2 y=' + (y(hi) + 4) + ' font-size=10>' + fmt(hi) + '</text><text x=2 y=' +
         (y(lo) + 4) + ' font-size=10>' + fmt(lo) + '</text>';
  series.forEach(function(s){
    var pts = [];
    (s.values || []).forEach(function(v, i){ if (v !== null) pts.push(x(i).toFixed(1) + ',' + y(v).toFixed(1)); });
    out += '<polyline class=series data-series="' + esc(s.name) + '" fill=none stroke=' + s.colour +
           ' stroke-width=1.6 points="' + pts.join(' ') + '"/>';
  });
  tokens.forEach(function(t, i){
    out += '<text x=' + x(i) + ' y=' + (h - 6) + ' font-size=9 text-anchor=middle>' +
           esc(t.replace(/\n/g, '\u21b5').slice(0, 4)) + '</text>';
  });
  var legend = series.map(function(s){ return '<tspan fill=' + s.colour + '>\u25a0 ' + esc(s.name) + '</tspan>'; });
  return out + '<text x=' + (pad + 4) + ' y=10 font-size=10>' + legend.join(' ') + '</text></svg>';
}
function absentNote(s, name){
  return s.absent[name] ? '<div class=absent>absent in this run: ' + esc(s.absent[name]) + '</div>' : '';
}
function showToken(i){
  var D = window.REPLAY[cur.step], s = D.samples[cur.sample];
  document.querySelectorAll('.tok.on').forEach(function(e){ e.classList.remove('on'); });
  var el = document.querySelector('.tok[data-i="' + i + '"]'); if (el) el.classList.add('on');
  document.querySelectorAll('svg.curve').forEach(function(svg){  // the token's place on each curve
    var x = +svg.getAttribute('data-x0') + i * +svg.getAttribute('data-dx'), line = svg.querySelector('.cursor');
    line.setAttribute('x1', x); line.setAttribute('x2', x);
  });
  var parts = ['<b>token ' + i + '</b> <code>' + visible(s.tokens[i]) + '</code> id ' + esc(s.ids[i])];
  if (s.mask[i] === 0) parts.push('<b>no loss</b> (response mask 0: not the model\'s, e.g. a tool\'s reply)');
  Object.keys(NAMES).forEach(function(k){
    if (s.pt[k]) parts.push(NAMES[k] + ' <b data-num="' + k + '">' + fmt(s.pt[k][i]) + '</b>');
  });
  if (s.pt.old_log_prob && s.pt.rollout_log_prob)
    parts.push('p(vLLM) / p(actor) ' + fmt(Math.exp(s.pt.rollout_log_prob[i] - s.pt.old_log_prob[i])));
  document.getElementById('panel').innerHTML = parts.join(' &middot; ');
}
function render(){
  var D = window.REPLAY[cur.step]; if (!D) return;
  if (cur.sample >= D.samples.length) cur.sample = 0;
  var s = D.samples[cur.sample], run = D.run, n = s.tokens.length, pt = s.pt;
  document.getElementById('status').textContent = 'step ' + D.step + ': ' + D.traced +
    ' of ' + D.of + ' responses traced';
  var sel = document.getElementById('sample');
  sel.innerHTML = D.samples.map(function(x, k){
    return '<option value=' + k + (k === cur.sample ? ' selected' : '') + '>#' + k + ' score ' +
      fmt(x.score) + ' \u00b7 ' + esc(x.tokens.length) + ' tokens \u00b7 prompt ' + esc(String(x.uid || '').slice(0, 8)) + '</option>';
  }).join('');
  document.getElementById('prompt').textContent = s.prompt;
  var scale = 0; D.samples.forEach(function(x){ (x.pt.advantage || []).forEach(function(a){
    if (a !== null) scale = Math.max(scale, Math.abs(a)); }); });
  var ans = answerSpan(s.tokens);
  document.getElementById('tokens').innerHTML = s.tokens.map(function(t, i){
    var a = pt.advantage ? pt.advantage[i] : null, tip = Object.keys(NAMES).filter(function(k){
      return pt[k]; }).map(function(k){ return NAMES[k] + ' ' + fmt(pt[k][i]); }).join(' | ');
    return '<span class="tok' + (i >= ans[0] && i < ans[1] ? ' answer' : '') +
      (s.mask[i] === 0 ? ' noloss' : '') + '" tabindex=0 data-i=' +
      i + ' data-adv="' + fmt(a) + '" style="background:' + colour(a, scale) + '" title="' +
      esc(tip) + '">' + visible(t) + '</span>';
  }).join('');
  document.querySelectorAll('.tok').forEach(function(el){
    var i = +el.getAttribute('data-i');
    el.addEventListener('focus', function(){ showToken(i); });
    el.addEventListener('mouseenter', function(){ showToken(i); });
  });
  var ex = s.extra, flags = ['acc', 'format', 'pred_found', 'hedged', 'clipped'].filter(function(k){
    return k in ex; }).map(function(k){ return k + ' ' + fmt(ex[k]); });
  document.getElementById('reward-body').innerHTML = '<p>Ground truth <b>' + esc(s.gt) +
    '</b>; score <b id=score>' + fmt(s.score) + '</b>' + (flags.length ? ' (' + flags.join(', ') + ')' : '') +
    '. ' + (ans[0] >= 0 ? 'The answer was read from tokens ' + ans[0] + '\u2013' + (ans[1] - 1) +
    ' (outlined): <code>' + visible(s.tokens.slice(ans[0], ans[1]).join('')) + '</code>.' :
    '<span class=bad>No <code>####</code> line: the rule reward found no answer.</span>') +
    ' verl puts the whole score on the last token' + (pt.score ? ' (token ' + (n - 1) + ')' : '') + '.</p>';
  var kl = run.kl || {};
  document.getElementById('kl-body').innerHTML = kl['in'] ? '<p class=why>KL to the reference ' +
    (kl['in'] === 'reward' ? 'is charged in the reward' : 'is a loss term of the actor') +
    ': estimator <code>' + esc(kl.estimator) + '</code>, coefficient ' + fmt(D.kl_coef) +
    (kl.controller && kl.controller !== 'fixed' ? ' at this step (' + esc(kl.controller) + ' controller, initial ' +
     fmt(kl.coef) + ')' : '') + '.</p>' +
    curve('kl', [{name: 'KL estimator', values: pt.kl, colour: '#7a3fb0'}], n, s.tokens) :
    '<div class=absent>absent in this run: ' + esc(s.absent.kl || 'no KL term') + '</div>';
  document.getElementById('value-body').innerHTML = pt.value ?
    '<p class=why>The critic\'s estimate, before each token, of the reward still to come.</p>' +
    curve('value', [{name: 'value', values: pt.value, colour: '#1f5fa0'},
                    {name: 'return', values: pt['return'], colour: '#e08a00'}], n, s.tokens) :
    absentNote(s, 'value');
  // verl's estimators (verl/trainer/ppo/core_algos.py); the group's mean is GRPO's and Dr. GRPO's
  var w = D.batch.advantage_whitening, how = {
    gae: 'GAE (gamma ' + fmt(run.gamma) + ', lambda ' + fmt(run.lam) + ') of reward minus value, then ' +
      'whitened over the whole batch' + (w ? ' (mean ' + fmt(w.mean) + ', variance ' + fmt(w['var']) + ')' : ''),
    rloo: 'the response\'s score minus the mean score of the other responses to its prompt: the same ' +
      'advantage on every token',
    reinforce_plus_plus: 'the return from each token (the reward, KL penalty included, summed to the end with ' +
      'gamma ' + fmt(run.gamma) + '), whitened over the whole batch',
    reinforce_plus_plus_baseline: 'the response\'s score minus its group\'s mean, then whitened over the whole batch',
    remax: 'the return from each token (the reward, KL penalty included, summed to the end) minus the score ' +
      'of one greedy response to the same prompt (the baseline)'
  }[run.adv_estimator] ||
    'the response\'s score minus its group\'s mean' + (run.norm_adv_by_std_in_grpo ? ', divided by the group\'s standard deviation' : '') +
    ': the same advantage on every token';
  document.getElementById('adv-body').innerHTML = '<p class=why>Advantage: ' + how +
    '. Return: what the critic regresses to.</p>' + curve('advantage', [
      {name: 'advantage', values: pt.advantage, colour: '#1a9850'},
      {name: 'reward', values: pt.reward, colour: '#d73027'}], n, s.tokens);
  var group = D.samples.filter(function(x){ return x.uid === s.uid; }), sc = group.map(function(x){ return x.score || 0; });
  var mean = sc.reduce(function(a, b){ return a + b; }, 0) / sc.length;
  var sd = Math.sqrt(sc.reduce(function(a, b){ return a + (b - mean) * (b - mean); }, 0) / Math.max(1, sc.length - 1));
  document.getElementById('group-body').innerHTML = group.length < 2 ? '<p class=why>One response traced for this prompt.</p>' :
    '<p class=why>' + group.length + ' responses of this prompt (rollout.n = ' + fmt(run.rollout_n) + '): scores mean <b id=group-mean>' +
    fmt(mean) + '</b>, standard deviation <b id=group-std>' + fmt(sd) + '</b>' +
    (run.adv_estimator === 'grpo' ? '; GRPO\'s advantage is (score \u2212 mean) / (std + \u03b5), the same on every token' : '') +
    '.</p><table id=group-table><tr><th>#</th><th>response</th><th>score</th><th>advantage (first token)</th></tr>' +
    group.map(function(x){ var k = D.samples.indexOf(x); return '<tr' + (k === cur.sample ? ' style="background:#fffbe6"' : '') +
      '><td>' + k + '</td><td><code>' + visible(x.tokens.join('')) + '</code></td><td>' + fmt(x.score) +
      '</td><td>' + fmt(x.pt.advantage ? x.pt.advantage[0] : null) + '</td></tr>'; }).join('') + '</table>';
  var ex2 = window.REPLAY_INDEX.run.explain, rows = Object.keys(ex2).filter(function(k){ return k in D.metrics; });
  document.getElementById('update-body').innerHTML = '<table id=update-table><tr><th>metric</th><th>value</th><th>what it says</th></tr>' +
    rows.map(function(k){ return '<tr><td><code>' + esc(k) + '</code></td><td>' + fmt(D.metrics[k]) + '</td><td>' + esc(ex2[k]) + '</td></tr>'; }).join('') +
    '</table>';
  if (H.token !== undefined && +H.step === cur.step) showToken(+H.token);
}
function choose(step, sample){
  cur.step = step; cur.sample = sample;
  if (window.REPLAY && window.REPLAY[step]) render();
  else loadData('replay/step-' + step + '.js', render);
}
var stepSel = document.getElementById('step');
stepSel.innerHTML = IDX.steps.map(function(x){ return '<option value="' + esc(x.step) + '"' +
  (x.step === cur.step ? ' selected' : '') + '>' + esc(x.step) + ' (mean score ' + fmt(x.mean) + ')</option>'; }).join('');
stepSel.addEventListener('change', function(){ choose(+stepSel.value, 0); });
document.getElementById('sample').addEventListener('change', function(){
  cur.sample = +this.value; render(); });
loadData('replay/step-' + cur.step + '.js');
document.addEventListener('DOMContentLoaded', render);
