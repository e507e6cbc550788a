// Progress people can plan by (issue 33): a running batch's rate and estimated finish, and its
// `waiting` message. Pure functions of a batch object, the readings the page keeps and the time:
// batch.js shows what they answer, and the browser tests call them directly.
//
// A rate is the recent one when the page has watched the batch long enough: the readings it took
// on its refreshes (one every few seconds, kept in memory for RECENT_MS) span at least
// MIN_RECENT_MS. A batch's counts move in steps (a chain of requests counts what it settled now and
// then, up to two minutes apart), so a shorter span would read a step as a burst or a stall. Until
// then the rate is the batch's over its whole running time (since `in_progress_at`), as
// `freeinference-batch status` gives it from one read. The times are this machine's clock against
// the server's `in_progress_at`.
"use strict";

const BatchProgress = (() => {
  const RECENT_MS = 5 * 60 * 1000;
  const MIN_RECENT_MS = 60 * 1000;
  // Neither runs its requests any further: a cancelling batch's unstarted requests never start.
  const NOT_RUNNING = new Set(["completed", "failed", "expired", "cancelled", "cancelling", "finalizing"]);

  const finished = (batch) => batch.request_counts.completed + batch.request_counts.failed;

  // The readings with this one added ({at: milliseconds, done}), oldest first, none older than
  // RECENT_MS before it.
  function remember(readings, batch, nowMs) {
    const kept = readings.filter((reading) => nowMs - reading.at <= RECENT_MS && reading.at < nowMs);
    kept.push({ at: nowMs, done: finished(batch) });
    return kept;
  }

  // null when nothing more runs (final or cancelling). Otherwise {perMinute, overMs, recent,
  // remaining, finishAtMs}: perMinute null when no request has finished (over the running time)
  // or none in the recent span; finishAtMs null without a rate above zero.
  function estimate(batch, readings, nowMs) {
    if (NOT_RUNNING.has(batch.status)) return null;
    const done = finished(batch);
    const remaining = Math.max(batch.request_counts.total - done, 0);
    const oldest = readings.length ? readings[0] : null;
    let perMinute = null;
    let overMs = 0;
    let recent = false;
    if (oldest && nowMs - oldest.at >= MIN_RECENT_MS) {
      recent = true;
      overMs = nowMs - oldest.at;
      perMinute = (Math.max(done - oldest.done, 0) * 60000) / overMs;
    } else if (batch.in_progress_at && done > 0 && nowMs > batch.in_progress_at * 1000) {
      overMs = nowMs - batch.in_progress_at * 1000;
      perMinute = (done * 60000) / overMs;
    }
    const finishAtMs = perMinute ? nowMs + (remaining / perMinute) * 60000 : null;
    return { perMinute, overMs, recent, remaining, finishAtMs };
  }

  // The message of the batch's `waiting` field, when the server sends one (one without the field
  // sends none; a batch that is not waiting has null).
  function waitingMessage(batch) {
    const message = batch.waiting && batch.waiting.message;
    return typeof message === "string" && message ? message : null;
  }

  // As a person reads it: `45 s`, `12 min`, `3 h 05 min`, `2 d 4 h` (progress.py's duration).
  function duration(seconds) {
    const whole = Math.max(Math.round(seconds), 0);
    if (whole < 90) return `${whole} s`;
    const minutes = Math.round(whole / 60);
    if (minutes < 90) return `${minutes} min`;
    const hours = Math.floor(minutes / 60);
    if (hours < 48) return `${hours} h ${String(minutes % 60).padStart(2, "0")} min`;
    return `${Math.floor(hours / 24)} d ${hours % 24} h`;
  }

  // Requests a minute: a decimal below 10, where it matters, whole numbers above.
  const rateText = (perMinute) => (perMinute < 10 ? perMinute.toFixed(1) : perMinute.toFixed(0));

  // The sentence under the batch's progress bar; `when` formats a time in milliseconds. null when
  // nothing more runs.
  function describe(batch, readings, nowMs, when) {
    const found = estimate(batch, readings, nowMs);
    if (!found) return null;
    if (found.perMinute === null) return "Not enough progress yet to estimate a finish: no request has finished.";
    const span = duration(found.overMs / 1000);
    if (!found.finishAtMs) return `No request has finished in the last ${span}: no finish to estimate.`;
    const over = found.recent ? `over the last ${span}` : `over ${span} running`;
    let text = `${rateText(found.perMinute)} requests a minute ${over}; ${found.remaining} to go, done about ` +
      `${when(found.finishAtMs)} (in ${duration((found.finishAtMs - nowMs) / 1000)}).`;
    if (batch.expires_at && found.finishAtMs > batch.expires_at * 1000) {
      text += ` But its completion window closes first, at ${when(batch.expires_at * 1000)}: what has not ` +
        "started by then expires.";
    }
    return text;
  }

  return Object.freeze({ RECENT_MS, MIN_RECENT_MS, remember, estimate, waitingMessage, duration, rateText, describe });
})();
