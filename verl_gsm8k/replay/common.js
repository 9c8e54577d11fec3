function loadData(src, ready){
  if (document.readyState === 'loading') {
    document.write('<script src="' + src + '"><\/script>');  // before the page's load event
    return;
  }
  var tag = document.createElement('script');
  tag.src = src; tag.onload = ready;
  tag.onerror = function(){ document.getElementById('status').textContent = 'cannot load ' + src; };
  document.head.appendChild(tag);
}
function hashParams(){
  var out = {};
  location.hash.replace(/^#/, '').split('&').forEach(function(kv){
    var p = kv.split('='); if (p[0]) out[p[0]] = decodeURIComponent(p[1] || '');
  });
  return out;
}
function esc(s){ return String(s).replace(/[&<>"]/g, function(c){
  return {'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]; }); }
function visible(t){ return esc(t).replace(/ /g,'<span class="ws">\u2423</span>')
  .replace(/\n/g,'<span class="ws">\u21b5</span>\n'); }
