/* memest run page: the what-if form. Posts only the fields that differ from the start's own grid
   to POST /api/v1/runs/{run_id}/estimate and shows the service's figures, formatted as
   memest/units.py formats them (GiB with three decimals, counts with separators). Every figure
   comes from the response; nothing is computed here. No dependencies, no inline script (CSP). */
(function () {
  "use strict";
  var GiB = 1073741824;

  function gib(bytes) { return bytes === null || bytes === undefined ? "MISSING" : (bytes / GiB).toFixed(3); }
  function sgib(bytes) { var s = gib(bytes); return bytes >= 0 ? "+" + s : s; }
  function count(n) { return n === null || n === undefined ? "MISSING" : Math.round(n).toLocaleString("en-US"); }
  function ratio(x) { return x === null || x === undefined ? "MISSING" : x.toFixed(2) + "\u00d7"; }

  function numberOrText(text) {
    var t = text.trim();
    return /^-?\d+(\.\d+)?$/.test(t) ? Number(t) : t;
  }

  function changed(input) {
    return input.value.trim() !== "" && input.value.trim() !== (input.getAttribute("data-current") || "");
  }

  function speculative(form) {
    var method = form.querySelector("#wi-spec-method");
    var k = form.querySelector("#wi-num-spec-tokens");
    if (form.querySelector("#wi-drafter-off").checked) return { set: true, value: null };
    if (!changed(method) && !changed(k)) {
      if (method.value.trim() === "" && (method.getAttribute("data-current") || "") !== "") {
        return { set: true, value: null };
      }
      return { set: false };
    }
    var spec = { method: method.value.trim() || method.getAttribute("data-current") };
    if (k.value.trim() !== "") spec.num_speculative_tokens = numberOrText(k.value);
    return { set: true, value: spec };
  }

  function captureSettings(form) {
    var out = {};
    var sizes = form.querySelector("#wi-capture-sizes").value.trim();
    if (sizes !== "") {
      out.cudagraph_capture_sizes = sizes.split(/[\s,]+/).filter(function (s) { return s !== ""; }).map(numberOrText);
    }
    var cap = form.querySelector("#wi-max-capture-size").value.trim();
    if (cap !== "") out.max_cudagraph_capture_size = numberOrText(cap);
    return out;
  }

  /* The request body: {"grid": {only what changed}}. */
  function body(form) {
    var grid = {};
    ["max_num_seqs", "max_num_batched_tokens", "max_model_len", "gpu_memory_utilization"].forEach(function (name) {
      var input = form.querySelector("input[name=" + name + "]");
      if (changed(input)) grid[name] = numberOrText(input.value);
    });
    var spec = speculative(form);
    if (spec.set) grid.speculative_config = spec.value;
    var capture = captureSettings(form);
    if (Object.keys(capture).length) grid.compilation_config = capture;
    return { grid: grid };
  }

  /* Empty every result cell and hide the result, so that an error shows no stale or empty tables. */
  function clearResult(result) {
    result.hidden = true;
    result.querySelectorAll("td.num, #whatif-grids, #wi-flag").forEach(function (el) {
      el.textContent = "";
      el.removeAttribute("data-value");
    });
    document.querySelector("#whatif-terms tbody").textContent = "";
    document.getElementById("whatif-notes").textContent = "";
  }

  /* One readable line from an error response: the service's detail, or FastAPI's first error. */
  function errorLine(status, payload) {
    var detail = payload && payload.detail;
    if (typeof detail === "string") return detail;
    if (Array.isArray(detail) && detail.length) {
      var e = detail[0];
      var loc = (e.loc || []).filter(function (p) { return p !== "body"; }).join(".");
      return (loc ? loc + ": " : "") + (e.msg || "invalid");
    }
    return "the service answered " + status;
  }

  function setText(id, text, bytes) {
    var el = document.getElementById(id);
    el.textContent = text;
    if (bytes !== undefined && bytes !== null) el.setAttribute("data-value", String(bytes));
  }

  function cell(tr, text, cls) {
    var td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }

  function show(result) {
    var w = result.what_if;
    setText("whatif-grids", "G: " + w.grid_from + " \u2192 G\u2032: " + w.grid_to);
    setText("wi-kv-gib-from", gib(w.kv_budget_bytes_from), w.kv_budget_bytes_from);
    setText("wi-kv-gib-to", gib(w.kv_budget_bytes_to), w.kv_budget_bytes_to);
    setText("wi-kv-tokens-from", count(w.kv_tokens_from), w.kv_tokens_from);
    setText("wi-kv-tokens-to", count(w.kv_tokens_to), w.kv_tokens_to);
    setText("wi-max-model-len-from", count(w.max_model_len_from), w.max_model_len_from);
    setText("wi-max-model-len-to", count(w.max_model_len_to), w.max_model_len_to);
    setText("wi-concurrency-from", ratio(result.concurrency_from), result.concurrency_from);
    setText("wi-concurrency-to", ratio(result.concurrency_to), result.concurrency_to);
    setText("wi-flag", result.kv_cache_flag_to === null ? "no KV budget" : result.kv_cache_flag_to);
    var tbody = document.querySelector("#whatif-terms tbody");
    tbody.textContent = "";
    result.terms.forEach(function (t) {
      // A zero MLA row says nothing on another model (memest.reporters.views.FAMILY_TERMS).
      if (t.term === "mla_context_bytes" && !t.bytes_from && !t.bytes_to) { return; }
      var tr = document.createElement("tr");
      tr.setAttribute("data-term", t.term);
      cell(tr, t.label).setAttribute("title", t.term);
      cell(tr, gib(t.bytes_from), "num term-from").setAttribute("data-bytes", String(t.bytes_from));
      cell(tr, gib(t.bytes_to), "num term-to").setAttribute("data-bytes", String(t.bytes_to));
      cell(tr, sgib(t.bytes_to - t.bytes_from), "num");
      cell(tr, t.law, "law");
      tbody.appendChild(tr);
    });
    var notes = document.getElementById("whatif-notes");
    notes.textContent = "";
    (w.notes || []).forEach(function (n) {
      var li = document.createElement("li");
      li.textContent = n;
      notes.appendChild(li);
    });
  }

  function submit(section, form, event) {
    event.preventDefault();
    var error = document.getElementById("whatif-error");
    var result = document.getElementById("whatif-result");
    var button = form.querySelector("#wi-submit");
    button.disabled = true;
    section.setAttribute("aria-busy", "true");
    clearResult(result);
    fetch(section.getAttribute("data-endpoint"), {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "Accept": "application/json" },
      body: JSON.stringify(body(form))
    }).then(function (r) {
      return r.json().catch(function () { return null; }).then(function (payload) {
        if (!r.ok) throw new Error(errorLine(r.status, payload));
        return payload;
      });
    }).then(function (payload) {
      show(payload);
      error.hidden = true;
      error.textContent = "";
      result.hidden = false;
    }).catch(function (e) {
      error.textContent = e.message;
      error.hidden = false;
      clearResult(result);
    }).then(function () {
      button.disabled = false;
      section.removeAttribute("aria-busy");
      section.setAttribute("data-done", String(Number(section.getAttribute("data-done") || "0") + 1));
    });
  }

  function start() {
    var section = document.getElementById("whatif");
    var form = document.getElementById("whatif-form");
    if (!section || !form) return;
    form.addEventListener("submit", function (event) { submit(section, form, event); });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
