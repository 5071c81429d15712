/* memest dashboard: click a header of a .sortable table to sort by that column. No dependencies. */
(function () {
  "use strict";
  function cellValue(row, index) {
    var cell = row.children[index];
    if (!cell) return "";
    var raw = cell.getAttribute("data-value") || cell.getAttribute("data-bytes");
    var text = raw !== null && raw !== "None" ? raw : cell.textContent.trim();
    var num = parseFloat(text.replace(/,/g, ""));
    return isNaN(num) ? text.toLowerCase() : num;
  }
  function sortBy(table, index, ascending) {
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = cellValue(a, index), y = cellValue(b, index);
      if (x < y) return ascending ? -1 : 1;
      if (x > y) return ascending ? 1 : -1;
      return 0;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("table.sortable").forEach(function (table) {
      table.querySelectorAll("thead th").forEach(function (th, index) {
        var ascending = true;
        th.addEventListener("click", function () { sortBy(table, index, ascending); ascending = !ascending; });
      });
    });
  });
})();
