// The admin API client: the token lives in sessionStorage (this tab only, never in a URL),
// every failure becomes an ApiError carrying the server's own message.

const TOKEN_KEY = "loraplex.adminToken";

export class ApiError extends Error {
  constructor(status, message, param) {
    super(message);
    this.status = status;
    this.param = param || null;
  }
}

export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY),
  set: (value) => sessionStorage.setItem(TOKEN_KEY, value),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

// Called when the server says the token is no longer good (401): the app signs out.
let onUnauthorized = () => {};
export function setUnauthorizedHandler(handler) {
  onUnauthorized = handler;
}

function errorFrom(status, text) {
  let message = text || `HTTP ${status}`;
  let param = null;
  try {
    const body = JSON.parse(text);
    if (body && body.error) {
      message = body.error.message || message;
      param = body.error.param;
    }
  } catch {
    // not JSON: keep the text
  }
  if (status === 401) onUnauthorized(message);
  return new ApiError(status, message, param);
}

export async function request(method, path, { body, query, text: wantText } = {}) {
  const url = new URL(path, window.location.origin);
  for (const [key, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(key, value);
  }
  const headers = { Authorization: `Bearer ${token.get() || ""}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(url, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (err) {
    throw new ApiError(0, `The server could not be reached (${err.message}).`);
  }
  const text = await response.text();
  if (!response.ok) throw errorFrom(response.status, text);
  if (wantText) return text;
  return text ? JSON.parse(text) : null;
}

export const api = {
  get: (path, query) => request("GET", path, { query }),
  post: (path, body) => request("POST", path, { body }),
  patch: (path, body) => request("PATCH", path, { body }),
  del: (path) => request("DELETE", path),
  text: (path) => request("GET", path, { text: true }),
};

// Multipart upload through XHR, for its upload progress events (fetch has none).
// onProgress(fraction) runs as the bytes leave; resolves with the created adapter version.
export function uploadAdapter(form, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", "/admin/v1/adapters");
    xhr.setRequestHeader("Authorization", `Bearer ${token.get() || ""}`);
    xhr.upload.addEventListener("progress", (event) => {
      if (event.lengthComputable) onProgress(event.loaded / event.total);
    });
    xhr.upload.addEventListener("load", () => onProgress(1));
    xhr.addEventListener("load", () => {
      if (xhr.status >= 200 && xhr.status < 300) resolve(JSON.parse(xhr.responseText));
      else reject(errorFrom(xhr.status, xhr.responseText));
    });
    xhr.addEventListener("error", () =>
      reject(new ApiError(0, "The upload failed: the connection was lost.")),
    );
    xhr.send(form);
  });
}
