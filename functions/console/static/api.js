// The console's calls: the /v1 API with the key the user typed, and the payload bucket's presigned
// URLs. The key lives in sessionStorage only (this tab, until sign-out or the tab closes): never in
// a URL, a cookie or localStorage. The console has no power of its own: every call is a /v1 call.
"use strict";

const ConsoleApi = (() => {
  const KEY_STORAGE = "freeinference-batch.api-key";
  const API = "/v1";

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  const apiKey = () => sessionStorage.getItem(KEY_STORAGE);
  const keepKey = (key) => sessionStorage.setItem(KEY_STORAGE, key);
  const forgetKey = () => sessionStorage.removeItem(KEY_STORAGE);

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

  async function storedBody(url) {
    // A presigned S3 URL: it carries its own signature, so no key goes with it.
    const answer = await fetch(url, { credentials: "omit", cache: "no-store" });
    if (!answer.ok) throw new Error(`${answer.status}: could not read a stored answer`);
    return answer.json();
  }

  async function fileContent(fileId) {
    // GET /v1/files/{id}/content answers a redirect to a presigned S3 URL, which fetch follows;
    // across origins it drops the Authorization header, as the URL carries its own signature.
    const response = await fetch(`${API}/files/${encodeURIComponent(fileId)}/content`, {
      headers: { Authorization: `Bearer ${apiKey()}` },
      credentials: "omit",
      cache: "no-store",
    });
    if (!response.ok) throw new ApiError(response.status, `${response.status}: could not read file ${fileId}`);
    return response.blob();
  }

  return { ApiError, apiKey, keepKey, forgetKey, call, storedBody, fileContent };
})();
