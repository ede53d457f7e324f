// What the browser tests share: an API client, waiting for a condition, and Chromium's flags.

export const WAIT_MS = 45_000;

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** `(method, path, body?, tenant?) => {status, body}` with `key`; `tenant` as `Hookwise-Tenant`. */
export function client(base, key) {
  return async (method, path, body, tenant) => {
    const headers = { Authorization: `Bearer ${key}`, "Content-Type": "application/json" };
    if (tenant) headers["Hookwise-Tenant"] = tenant;
    const resp = await fetch(`${base}${path}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await resp.text();
    return { status: resp.status, body: text ? JSON.parse(text) : null };
  };
}

/** Poll `check` until it gives something truthy; fail after `within` ms, naming `what`. */
export async function waitFor(what, check, within = WAIT_MS) {
  const start = Date.now();
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() - start > within) throw new Error(`timed out after ${within} ms waiting for ${what}`);
    await sleep(200);
  }
}

/** Headless Chromium's flags for a quiet, offline run. */
export const CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"];
