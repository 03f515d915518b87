document.querySelectorAll('table.sortable').forEach(function (table) {
  var heads = table.querySelectorAll('th[data-col]');
  heads.forEach(function (th) {
    th.addEventListener('click', function () {
      var col = +th.dataset.col, asc = th.dataset.dir !== 'asc', body = table.tBodies[0];
      heads.forEach(function (h) { delete h.dataset.dir; });
      th.dataset.dir = asc ? 'asc' : 'desc';
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[col].dataset.v, y = b.cells[col].dataset.v;
        if (x === '' || y === '') return (x === '') - (y === '');  /* no value: last either way */
        var nx = Number(x), ny = Number(y);
        var c = isNaN(nx) || isNaN(ny) ? x.localeCompare(y) : nx - ny;
        return asc ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
function openFromHash() {
  var d = location.hash && document.getElementById(decodeURIComponent(location.hash.slice(1)));
  if (d && d.tagName === 'DETAILS') { d.open = true; d.scrollIntoView(); }
}
window.addEventListener('hashchange', openFromHash); openFromHash();
function setAll(open) { document.querySelectorAll('details').forEach(function (d) { d.open = open; }); }
document.getElementById('open-all') && document.getElementById('open-all').addEventListener('click',
  function () { setAll(true); });
document.getElementById('close-all') && document.getElementById('close-all').addEventListener('click',
  function () { setAll(false); });
