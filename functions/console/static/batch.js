// One batch's page: its summary and results, refreshed while it runs, and
// what can be done to it: cancel, retry its failed requests, delete, download its output file.
// Loaded after console.js, whose shared helpers and state it uses.
"use strict";

const BatchPage = (() => {
  const { ApiError, apiKey, call, storedBody, fileContent } = ConsoleApi;
  const {
    FINAL, $, state, failed, element, cell, utc, timestamp, batchLink, statusBadge, cost, metadataList,
    announce, loaded, refreshLater, confirmAction, showView,
  } = ConsoleApp;
  const RESULTS_PER_PAGE = 50;
  const DOWNLOAD_PAGE = 1000;
  const ANSWER_PREVIEW_CHARS = 140;
  // What the CLI writes for a line without a response or an error (openai_files._NO_ERROR).
  const NO_ERROR = {
    cancelled: ["batch_cancelled", "Not run: the batch was cancelled"],
    queued: ["not_finished", "Not finished yet: still queued when the results were read"],
    running: ["not_finished", "Not finished yet: still running when the results were read"],
    expired: ["batch_expired", "Not run: the completion window closed first"],
    failed: ["failed", "The request failed"],
  };

  function answerPreview(line) {
    const body = line.response && line.response.body;
    if (line.response && !body && line.response.body_url) return "(too large for a page: open the result)";
    const content = body && body.choices && body.choices[0] && body.choices[0].message
      ? body.choices[0].message.content : null;
    if (typeof content !== "string") return "";
    return content.length > ANSWER_PREVIEW_CHARS ? `${content.slice(0, ANSWER_PREVIEW_CHARS)}…` : content;
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
      if (generation === state.generation) failed(error, true);
      return;
    }
    if (generation !== state.generation) return;
    loaded();
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
    if (batch.input_file_id) {
      // A batch created from a file (issue 32): its input, and once it ends its output and error files.
      rows.push(["Finalizing", timestamp(batch.finalizing_at)], ["Input file", fileLink(batch.input_file_id, "input")],
        ["Output file", batch.output_file_id ? fileLink(batch.output_file_id, "output") : "—"],
        ["Error file", batch.error_file_id ? fileLink(batch.error_file_id, "error") : "—"]);
    }
    const children = [...state.retryOf].filter(([, parent]) => parent === batch.id).map(([child]) => child);
    if (children.length) {
      const list = element("ul", { className: "lineage" }, children.map((child) => element("li", {}, [batchLink(child)])));
      rows.push(["Retried by", list]);
    }
    $("batch-details").replaceChildren(...rows.flatMap(([name, value]) => [
      element("dt", { text: name }),
      value instanceof Node ? element("dd", {}, [value]) : element("dd", { text: value }),
    ]));
    $("cancel").disabled = FINAL.has(batch.status) || ["cancelling", "finalizing"].includes(batch.status);
    // `failed` counts the failed and the expired requests: the ones a retry takes by default.
    $("retry").hidden = !(FINAL.has(batch.status) && counts.failed > 0);
    $("retry").textContent = `Retry failed (${counts.failed})…`;
    $("download").disabled = false;
    $("delete").disabled = false;
    $("batch-view").setAttribute("aria-busy", "false");
  }

  // A file's id and a button that downloads its content (/v1/files/{id}/content).
  function fileLink(fileId, kind) {
    const button = element("button", { text: `Download ${kind} file`, attributes: { type: "button" } });
    button.addEventListener("click", () => downloadFile(fileId, button));
    return element("span", { className: "file" }, [element("code", { text: fileId }), " ", button]);
  }

  async function downloadFile(fileId, button) {
    button.disabled = true;
    announce(`Downloading ${fileId}…`);
    try {
      const file = await fileContent(fileId);
      const link = element("a", { attributes: { href: URL.createObjectURL(file), download: `${fileId}.jsonl` } });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(link.href), 60000);
      announce(`Downloaded ${fileId}.`);
    } catch (error) {
      failed(error);
    } finally {
      button.disabled = false;
    }
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
    if (result.status === "failed" && result.error && result.error.status != null) {
      // Answered with an HTTP error: OpenAI writes that as the answer, its body the error.
      const body = { error: { message, type: code, param: null, code } };
      const response = { status_code: result.error.status, request_id: null, body };
      return { id: result.id, custom_id: result.custom_id, response, error: null };
    }
    return { id: result.id, custom_id: result.custom_id, response: null, error: { code, message } };
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

  // The results pager goes through the shell's routing, as every navigation does.
  function wire(route) {
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
  }

  return { open: openBatch, wire };
})();
