// Calls to this server's API, as any client makes them: the key (kept in the page's session
// storage) on every call, and a refusal turned into an ApiError carrying the API's own message.

const KEY_STORAGE = "omni.apiKey";

export const apiKey = {
  get: () => sessionStorage.getItem(KEY_STORAGE) || "",
  set(key) {
    if (key) sessionStorage.setItem(KEY_STORAGE, key);
    else sessionStorage.removeItem(KEY_STORAGE);
  },
};

export class ApiError extends Error {
  constructor(message, status = 0, code = null) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// `path` is relative to the page ("v1/models"), so the page works behind a path prefix too.
export async function request(path, { method = "GET", json, form, signal } = {}) {
  const headers = {};
  const key = apiKey.get();
  if (key) headers.Authorization = `Bearer ${key}`;
  let body = form;
  if (json !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(json);
  }
  let response;
  try {
    response = await fetch(path, { method, headers, body, signal });
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(`cannot reach the server: ${error.message}`);
  }
  if (!response.ok) throw await errorOf(response);
  return response;
}

export async function getJson(path, options) {
  return (await request(path, options)).json();
}

async function errorOf(response) {
  let error = null;
  try {
    error = (await response.json()).error;
  } catch {
    // not the API's JSON (a proxy's page): the status says what there is to say
  }
  const message = error?.message || `${response.status} ${response.statusText}`;
  return new ApiError(message, response.status, error?.code ?? null);
}

// The JSON events of a server-sent-events body, up to "[DONE]"; an error event throws its message.
export async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const data = buffer
        .slice(0, end)
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      buffer = buffer.slice(end + 2);
      if (!data) continue;
      if (data === "[DONE]") return;
      const event = JSON.parse(data);
      if (event.error) throw new ApiError(event.error.message, 0, event.error.code);
      yield event;
    }
  }
}
