// FreeInference Batch console: the /v1 API in a page, with the key the user typed.
//
// Everything a batch holds (custom_ids, metadata, answers, error messages) is untrusted: it is
// only ever put in the page as text (textContent, attribute values), never parsed as HTML. The
// key lives in sessionStorage only (this tab, until sign-out or the tab closes): never in a URL,
// a cookie or localStorage. The console has no power of its own: every call is a /v1 call.
"use strict";

(() => {
  const KEY_STORAGE = "freeinference-batch.api-key";
  const API = "/v1";
  const REFRESH_MS = 3000;
  const BATCHES_PER_PAGE = 20;
  const RESULTS_PER_PAGE = 50;
  const DOWNLOAD_PAGE = 1000;
  const ANSWER_PREVIEW_CHARS = 140;
  const FINAL = new Set(["completed", "failed", "expired", "cancelled"]);
  const BATCH_ID = /^batch_[A-Za-z0-9]+$/;
  // What the CLI writes for a line without a response or an error (openai_files._NO_ERROR).
  const NO_ERROR = {
    cancelled: ["batch_cancelled", "Not run: the batch was cancelled"],
    queued: ["not_finished", "Not finished yet: still queued when the results were read"],
    running: ["not_finished", "Not finished yet: still running when the results were read"],
    expired: ["batch_expired", "Not run: the completion window closed first"],
    failed: ["failed", "The request failed"],
  };

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
  };

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  // ---- the key --------------------------------------------------------------------------

  const apiKey = () => sessionStorage.getItem(KEY_STORAGE);

  function signOut(message) {
    sessionStorage.removeItem(KEY_STORAGE);
    stopRefresh();
    state.generation += 1;
    $("api-key").value = "";
    showError(message || "");
    route();
  }

  // ---- calls ----------------------------------------------------------------------------

  async function call(method, path, key = apiKey(), headers = {}) {
    const response = await fetch(API + path, {
      method,
      headers: { Authorization: `Bearer ${key}`, Accept: "application/json", ...headers },
      credentials: "omit",
      cache: "no-store",
    });
    let body = null;
    try {
      body = await response.json();
    } catch {
      body = null;
    }
    if (!response.ok) {
      const message = (body && body.error && body.error.message) || (body && body.message) || response.statusText;
      throw new ApiError(response.status, `${response.status}: ${message}`);
    }
    return body;
  }

  function failed(error) {
    if (error instanceof ApiError && error.status === 401) {
      signOut("The API key was refused (missing, revoked or expired): sign in again.");
      return;
    }
    showError(error.message || String(error));
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

  function answerPreview(line) {
    const body = line.response && line.response.body;
    if (line.response && !body && line.response.body_url) return "(too large for a page: open the result)";
    const content = body && body.choices && body.choices[0] && body.choices[0].message
      ? body.choices[0].message.content : null;
    if (typeof content !== "string") return "";
    return content.length > ANSWER_PREVIEW_CHARS ? `${content.slice(0, ANSWER_PREVIEW_CHARS)}…` : content;
  }

  function showError(message) {
    const box = $("error");
    box.textContent = message || "";
    box.hidden = !message;
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
      openBatch(id);
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
      if (generation === state.generation) failed(error);
      return;
    }
    if (generation !== state.generation) return;
    showError("");
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

  // ---- one batch ------------------------------------------------------------------------

  function openBatch(id) {
    if (state.batchId !== id) {
      state.batchId = id;
      state.batch = null;
      state.resultsCursors = [null];
      state.readings = [];
      state.retryKey = null;
      $("status-filter").value = "";
      $("batch-details").replaceChildren();
      $("results-table").tBodies[0].replaceChildren();
      // Until its first answer, nothing on the page is about this batch: no action applies yet.
      $("batch-view").setAttribute("aria-busy", "true");
      for (const action of ["download", "cancel", "delete"]) $(action).disabled = true;
      for (const line of ["retry", "batch-estimate", "batch-waiting"]) $(line).hidden = true;
    }
    showView("batch-view");
    $("batch-title").textContent = id;
    document.title = `${id} · FreeInference Batch`;
    refreshBatch();
  }

  async function refreshBatch() {
    const generation = state.generation;
    const id = state.batchId;
    const after = state.resultsCursors[state.resultsCursors.length - 1];
    const query = `?limit=${RESULTS_PER_PAGE}${after ? `&after=${encodeURIComponent(after)}` : ""}`;
    let batch;
    let page;
    try {
      // One after the other, not at once: a refresh every few seconds needs no parallelism, and
      // each call then costs the API one invocation at a time per open page.
      batch = await call("GET", `/batches/${encodeURIComponent(id)}`);
      page = await call("GET", `/batches/${encodeURIComponent(id)}/results${query}`);
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) state.retryOf.delete(id); // no longer a child to link
      if (generation === state.generation) failed(error);
      return;
    }
    if (generation !== state.generation) return;
    showError("");
    renderBatch(batch);
    renderResults(page);
    if (!FINAL.has(batch.status)) refreshLater(refreshBatch);
  }

  function renderBatch(batch) {
    state.batch = batch;
    const counts = batch.request_counts;
    const bar = $("batch-progress");
    bar.max = Math.max(counts.total, 1);
    bar.value = counts.completed + counts.failed;
    $("batch-progress-label").textContent =
      `${counts.completed + counts.failed} of ${counts.total} requests finished (${counts.completed} completed, ` +
      `${counts.failed} failed)`;
    state.retryOf.set(batch.id, batch.retry_of || null);
    const now = Date.now();
    state.readings = BatchProgress.remember(state.readings, batch, now);
    showLine("batch-estimate", BatchProgress.describe(batch, state.readings, now, utc));
    const waiting = BatchProgress.waitingMessage(batch);
    showLine("batch-waiting", waiting && `Waiting: ${waiting}`);
    const rows = [
      ["Status", statusBadge(batch.status)],
      ["Completed", counts.completed],
      ["Failed", counts.failed],
      ["Total", counts.total],
      ["Cost (USD)", cost(batch.cost_usd)],
      ["Created", timestamp(batch.created_at)],
      ["In progress", timestamp(batch.in_progress_at)],
      ["Expires", timestamp(batch.expires_at)],
      ["Cancelling", timestamp(batch.cancelling_at)],
      ["Cancelled", timestamp(batch.cancelled_at)],
      ["Completed at", timestamp(batch.completed_at)],
      ["Failed at", timestamp(batch.failed_at)],
      ["Expired at", timestamp(batch.expired_at)],
      ["Error", batch.error ? `${batch.error.code || ""}: ${batch.error.message || ""}` : "—"],
      ["Metadata", metadataList(batch.metadata)],
      ["Retry of", batch.retry_of ? batchLink(batch.retry_of) : "—"],
    ];
    const children = [...state.retryOf].filter(([, parent]) => parent === batch.id).map(([child]) => child);
    if (children.length) {
      const list = element("ul", { className: "lineage" }, children.map((child) => element("li", {}, [batchLink(child)])));
      rows.push(["Retried by", list]);
    }
    $("batch-details").replaceChildren(...rows.flatMap(([name, value]) => [
      element("dt", { text: name }),
      value instanceof Node ? element("dd", {}, [value]) : element("dd", { text: value }),
    ]));
    $("cancel").disabled = FINAL.has(batch.status) || batch.status === "cancelling";
    // `failed` counts the failed and the expired requests: the ones a retry takes by default.
    $("retry").hidden = !(FINAL.has(batch.status) && counts.failed > 0);
    $("retry").textContent = `Retry failed (${counts.failed})…`;
    $("download").disabled = false;
    $("delete").disabled = false;
    $("batch-view").setAttribute("aria-busy", "false");
  }

  function showLine(id, text) {
    $(id).textContent = text || "";
    $(id).hidden = !text;
  }

  function renderResults(page) {
    state.results = page.data;
    state.resultsNext = page.has_more ? page.last_id : null;
    $("results-next").disabled = !state.resultsNext;
    $("results-previous").disabled = state.resultsCursors.length === 1;
    $("results-page").textContent = `Page ${state.resultsCursors.length}`;
    drawResults();
  }

  function drawResults() {
    const wanted = $("status-filter").value;
    const rows = state.results
      .filter((line) => !wanted || line.status === wanted)
      .map((line) => {
        const open = element("button", {
          text: line.custom_id,
          className: "link-button",
          attributes: { type: "button", "aria-haspopup": "dialog" },
        });
        open.addEventListener("click", (event) => {
          event.stopPropagation();
          showResult(line);
        });
        const row = element("tr", { className: "clickable", attributes: { "data-result-id": line.id } }, [
          cell("custom_id", open, "id"),
          cell("Status", statusBadge(line.status)),
          cell("Error code", line.error ? line.error.code : ""),
          cell("Error message", line.error ? line.error.message : ""),
          cell("Answer", answerPreview(line), "answer"),
        ]);
        row.addEventListener("click", () => showResult(line));
        return row;
      });
    $("results-table").tBodies[0].replaceChildren(...rows);
  }

  function showResult(line) {
    $("result-dialog-title").textContent = line.custom_id;
    $("result-json").textContent = JSON.stringify(line, null, 2);
    $("result-dialog").showModal();
  }

  async function cancelBatch() {
    const id = state.batchId;
    const yes = await confirmAction(
      "Cancel this batch?",
      `Requests of ${id} that have not started will not run; running ones finish and keep their results.`,
      "Keep it running",
      "Cancel batch",
    );
    if (!yes) return;
    try {
      const batch = await call("POST", `/batches/${encodeURIComponent(id)}/cancel`);
      announce(`Batch ${batch.status}.`);
    } catch (error) {
      failed(error);
    }
    refreshBatch();
  }

  async function retryBatch() {
    const id = state.batchId;
    const count = state.batch.request_counts.failed;
    const yes = await confirmAction(
      "Retry the failed requests?",
      `A new batch runs the ${count} failed and expired requests of ${id} again, with the same custom_ids and ` +
        `bodies; they count against your daily quota as any request does. ${id} itself is not changed.`,
      "Not now",
      `Retry ${count}`,
      false,
    );
    if (!yes) return;
    // One key until the retry is answered: asked again after an answer that was lost, the API
    // answers the child it made then instead of making another.
    // (getRandomValues, not randomUUID: the latter exists only on https or localhost pages)
    state.retryKey = state.retryKey ||
      `console-${Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("")}`;
    $("retry").disabled = true;
    let child;
    try {
      child = await call("POST", `/batches/${encodeURIComponent(id)}/retry`, apiKey(),
        { "Idempotency-Key": state.retryKey });
    } catch (error) {
      failed(error);
      return;
    } finally {
      $("retry").disabled = false;
    }
    state.retryKey = null;
    state.retryOf.set(child.id, id);
    announce(`Batch ${child.id} created: it retries ${child.request_counts.total} requests of ${id}.`);
    if (state.batchId !== id) return; // the user went elsewhere meanwhile: stay there
    location.hash = `#/batches/${encodeURIComponent(child.id)}`;
  }

  async function deleteBatch() {
    const id = state.batchId;
    const yes = await confirmAction(
      "Delete this batch?",
      `${id} and all its results will be deleted. This cannot be undone.`,
      "Keep it",
      "Delete batch",
    );
    if (!yes) return;
    try {
      await call("DELETE", `/batches/${encodeURIComponent(id)}`);
    } catch (error) {
      failed(error);
      return;
    }
    announce(`Batch ${id} deleted.`);
    state.retryOf.delete(id);
    state.batchId = null;
    state.batchesCursors = [null];
    location.hash = "#/";
  }

  // ---- download: the OpenAI batch output file, as `freeinference-batch results -o` writes ----

  function outputLine(result) {
    const response = result.response;
    if (result.status === "completed" && response) {
      return {
        id: result.id,
        custom_id: result.custom_id,
        response: { status_code: response.status_code, request_id: response.request_id, body: response.body },
        error: null,
      };
    }
    const [code, message] = result.error
      ? [result.error.code, result.error.message]
      : NO_ERROR[result.status] || ["unknown", `No response (status '${result.status}')`];
    return { id: result.id, custom_id: result.custom_id, response: null, error: { code, message } };
  }

  async function storedBody(url) {
    // A presigned S3 URL: it carries its own signature, so no key goes with it.
    const answer = await fetch(url, { credentials: "omit", cache: "no-store" });
    if (!answer.ok) throw new Error(`${answer.status}: could not read a stored answer`);
    return answer.json();
  }

  async function download() {
    const id = state.batchId;
    const button = $("download");
    button.disabled = true;
    announce("Downloading results…");
    try {
      const lines = [];
      let after = null;
      for (;;) {
        const query = `?limit=${DOWNLOAD_PAGE}${after ? `&after=${encodeURIComponent(after)}` : ""}`;
        const page = await call("GET", `/batches/${encodeURIComponent(id)}/results${query}`);
        for (const result of page.data) {
          if (result.response && !result.response.body && result.response.body_url) {
            const { body_url: url, ...rest } = result.response;
            result.response = { ...rest, body: await storedBody(url) };
          }
          lines.push(`${JSON.stringify(outputLine(result))}\n`);
        }
        if (!page.has_more) break;
        after = page.last_id;
      }
      const file = new Blob(lines, { type: "application/jsonl" });
      const link = element("a", { attributes: { href: URL.createObjectURL(file), download: `${id}_output.jsonl` } });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(link.href), 60000);
      announce(`Downloaded ${lines.length} results.`);
    } catch (error) {
      failed(error);
    } finally {
      button.disabled = false;
    }
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
      sessionStorage.setItem(KEY_STORAGE, key);
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
    $("results-next").addEventListener("click", () => {
      if (!state.resultsNext) return;
      state.resultsCursors.push(state.resultsNext);
      route();
    });
    $("results-previous").addEventListener("click", () => {
      if (state.resultsCursors.length > 1) state.resultsCursors.pop();
      route();
    });
    $("status-filter").addEventListener("change", drawResults);
    $("cancel").addEventListener("click", cancelBatch);
    $("retry").addEventListener("click", retryBatch);
    $("delete").addEventListener("click", deleteBatch);
    $("download").addEventListener("click", download);
    window.addEventListener("hashchange", route);
    route();
  });
})();
