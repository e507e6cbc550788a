// FreeInference Batch console: the /v1 API in a page, with the key the user typed.
//
// Everything a batch holds (custom_ids, metadata, answers, error messages) is untrusted: it is
// only ever put in the page as text (textContent, attribute values), never parsed as HTML.
//
// Plain scripts, no build step (index.html loads them in order, deferred): progress.js, api.js (the
// calls and the key), this file (sign-in, routing, the batch list and what the pages share), then
// batch.js (one batch's page and its actions). Classic scripts, as progress.js is: each shares what
// the later ones need through one global object.
"use strict";

const ConsoleApp = (() => {
  const { ApiError, apiKey, keepKey, forgetKey, call } = ConsoleApi;
  const REFRESH_MS = 3000;
  const BATCHES_PER_PAGE = 20;
  const FINAL = new Set(["completed", "failed", "expired", "cancelled"]);
  const BATCH_ID = /^batch_[A-Za-z0-9]+$/;

  const $ = (id) => document.getElementById(id);
  const state = {
    refreshTimer: null,
    batchesCursors: [null], // the `after` of each page seen; the last is the page shown
    batchesNext: null,
    batchId: null,
    batch: null,
    resultsCursors: [null],
    resultsNext: null,
    results: [],
    readings: [], // the open batch's counts at each refresh, for its recent rate (progress.js)
    // Each batch's `retry_of`, of every batch this tab has listed or shown: a batch's children are
    // the ones seen here, so finding them costs no call (a child never listed or opened is not linked).
    retryOf: new Map(),
    retryKey: null, // the Idempotency-Key of the open batch's retry until it is answered
    generation: 0, // bumped on every navigation: answers for an older view are dropped
    errorFromLoad: false, // whether the error shown is a page load's (the next load that succeeds clears it)
  };

  // ---- the key --------------------------------------------------------------------------

  function signOut(message) {
    forgetKey();
    stopRefresh();
    state.generation += 1;
    $("api-key").value = "";
    route();
    showError(message || "");
  }

  function failed(error, fromLoad = false) {
    if (error instanceof ApiError && error.status === 401) {
      signOut("The API key was refused (missing, revoked or expired): sign in again.");
      return;
    }
    showError(error.message || String(error), fromLoad);
  }

  // ---- small helpers --------------------------------------------------------------------

  function element(tag, { text, className, attributes } = {}, children = []) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (className) node.className = className;
    for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, String(value));
    for (const child of children) node.append(child);
    return node;
  }

  function cell(label, content, className) {
    const td = element("td", { className, attributes: { "data-label": label } });
    if (content instanceof Node) td.append(content);
    else td.textContent = content === null || content === undefined ? "" : String(content);
    return td;
  }

  const utc = (milliseconds) => `${new Date(milliseconds).toISOString().slice(0, 19).replace("T", " ")} UTC`;

  function timestamp(seconds) {
    if (!seconds) return element("span", { text: "—" });
    const date = new Date(seconds * 1000);
    return element("time", { text: utc(date.getTime()), attributes: { datetime: date.toISOString() } });
  }

  function batchLink(id) {
    return element("a", { text: id, attributes: { href: `#/batches/${encodeURIComponent(id)}` } });
  }

  function statusBadge(status) {
    return element("span", { text: status, className: `status status-${status}` });
  }

  function progress(counts, labelId) {
    const done = counts.completed + counts.failed;
    const bar = element("progress", { attributes: { max: Math.max(counts.total, 1), value: done } });
    if (labelId) bar.setAttribute("aria-labelledby", labelId);
    else bar.setAttribute("aria-label", `${done} of ${counts.total} requests finished`);
    return bar;
  }

  function countsText(counts) {
    return `${counts.completed} / ${counts.failed} / ${counts.total}`;
  }

  function cost(value) {
    return Number(value || 0).toFixed(6);
  }

  function metadataList(metadata) {
    const list = element("ul", { className: "metadata" });
    for (const [name, value] of Object.entries(metadata || {})) list.append(element("li", { text: `${name}: ${value}` }));
    return list;
  }

  // A page's refresh that succeeds clears only a failed load's error: an action's refusal (a
  // cancel answered 409) or a link that is not a batch id stays until the user moves on.
  function showError(message, fromLoad = false) {
    const box = $("error");
    box.textContent = message || "";
    box.hidden = !message;
    state.errorFromLoad = Boolean(message) && fromLoad;
  }

  function loaded() {
    if (state.errorFromLoad) showError("");
  }

  function announce(message) {
    $("announcer").textContent = message;
  }

  function stopRefresh() {
    if (state.refreshTimer !== null) clearTimeout(state.refreshTimer);
    state.refreshTimer = null;
  }

  function refreshLater(action) {
    stopRefresh();
    state.refreshTimer = setTimeout(action, REFRESH_MS);
  }

  function confirmAction(title, text, keepLabel, confirmLabel, danger = true) {
    const dialog = $("confirm-dialog");
    $("confirm-yes").classList.toggle("danger", danger);
    $("confirm-title").textContent = title;
    $("confirm-text").textContent = text;
    $("confirm-no").textContent = keepLabel;
    $("confirm-yes").textContent = confirmLabel;
    dialog.returnValue = "";
    return new Promise((resolve) => {
      dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
      dialog.showModal();
      $("confirm-no").focus();
    });
  }

  // ---- views ----------------------------------------------------------------------------

  function showView(id) {
    for (const view of ["sign-in-view", "batches-view", "batch-view"]) $(view).hidden = view !== id;
    $("sign-out").hidden = id === "sign-in-view";
  }

  function route() {
    stopRefresh();
    state.generation += 1;
    showError(""); // an error belongs to the view it was shown on
    if (!apiKey()) {
      showView("sign-in-view");
      document.title = "Sign in · FreeInference Batch";
      $("api-key").focus();
      return;
    }
    const match = location.hash.match(/^#\/batches\/([^/?#]+)$/);
    if (match) {
      let id = null;
      try {
        id = decodeURIComponent(match[1]);
      } catch (error) {
        // A malformed escape (`%E0%A4%A`, a lone `%`) throws URIError: not a batch id either.
      }
      if (id === null || !BATCH_ID.test(id)) {
        showView("batches-view");
        showError("That is not a batch id.");
        loadBatches();
        return;
      }
      BatchPage.open(id); // batch.js: run after every script, so it is defined by then
    } else {
      showView("batches-view");
      document.title = "Batches · FreeInference Batch";
      loadBatches();
    }
  }

  // ---- batches --------------------------------------------------------------------------

  async function loadBatches() {
    const generation = state.generation;
    const after = state.batchesCursors[state.batchesCursors.length - 1];
    const query = `?limit=${BATCHES_PER_PAGE}${after ? `&after=${encodeURIComponent(after)}` : ""}`;
    let page;
    try {
      page = await call("GET", `/batches${query}`);
    } catch (error) {
      if (generation === state.generation) failed(error, true);
      return;
    }
    if (generation !== state.generation) return;
    loaded();
    renderBatches(page);
    if (page.data.some((batch) => !FINAL.has(batch.status))) refreshLater(loadBatches);
  }

  function renderBatches(page) {
    const rows = page.data.map((batch) => {
      state.retryOf.set(batch.id, batch.retry_of || null);
      return element("tr", { attributes: { "data-batch-id": batch.id } }, [
        cell("Batch", batchLink(batch.id), "id"),
        cell("Status", statusBadge(batch.status)),
        cell("Progress", progress(batch.request_counts)),
        cell("Completed / failed / total", countsText(batch.request_counts), "number"),
        cell("Cost (USD)", cost(batch.cost_usd), "number"),
        cell("Created", timestamp(batch.created_at)),
        cell("Metadata", metadataList(batch.metadata)),
      ]);
    });
    $("batches-table").tBodies[0].replaceChildren(...rows);
    $("batches-empty").hidden = rows.length > 0;
    state.batchesNext = page.has_more ? page.last_id : null;
    $("batches-next").disabled = !state.batchesNext;
    $("batches-first").disabled = state.batchesCursors.length === 1;
  }

  // ---- wiring ---------------------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    $("sign-in-form").addEventListener("submit", async (event) => {
      event.preventDefault();
      const key = $("api-key").value.trim();
      if (!key) return;
      try {
        await call("GET", "/batches?limit=1", key); // refused keys are never stored
      } catch (error) {
        showError(error instanceof ApiError && error.status === 401
          ? "That API key was refused: check it and try again." : error.message);
        return;
      }
      keepKey(key);
      $("api-key").value = "";
      showError("");
      state.batchesCursors = [null];
      announce("Signed in.");
      route();
      $("main").focus();
    });
    $("sign-out").addEventListener("click", () => {
      signOut("");
      announce("Signed out.");
    });
    $("batches-next").addEventListener("click", () => {
      if (!state.batchesNext) return;
      state.batchesCursors.push(state.batchesNext);
      route();
    });
    $("batches-first").addEventListener("click", () => {
      state.batchesCursors = [null];
      route();
    });
    BatchPage.wire(route);
    window.addEventListener("hashchange", route);
    route();
  });

  return {
    FINAL, $, state, failed, element, cell, utc, timestamp, batchLink, statusBadge, cost, metadataList,
    showError, loaded, announce, refreshLater, confirmAction, showView,
  };
})();
