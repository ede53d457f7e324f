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

/** Click the page's Refresh and wait until it is done (so no render of it comes later). */
export async function refresh(page) {
  await page.evaluate(() => (document.getElementById("notice").textContent = ""));
  await page.getByRole("button", { name: "Refresh", exact: true }).click();
  await waitFor("the refresh", async () => (await page.locator("#notice").innerText()) === "Refreshed.");
}

/**
 * Open the statistics of the endpoint `subId` (its row's Statistics button) and refresh until
 * they count `attempts` attempts: a process writes an endpoint's counts every few seconds, not
 * at each attempt. Resolves with the panel's locator.
 */
export async function openStats(page, subId, attempts, within = WAIT_MS) {
  const toggle = page.locator(`#subs tr[data-sub="${subId}"]`).getByRole("button", { name: /^Statistics of / });
  if ((await toggle.getAttribute("aria-expanded")) !== "true") await toggle.click();
  const panel = page.locator(`.stats[data-stats="${subId}"]`);
  await panel.waitFor();
  const shown = panel.locator('dd[data-stat="attempts"]');
  const seen = [];
  await waitFor(`the statistics to count ${attempts} attempts`, async () => {
    if ((await panel.getAttribute("aria-busy")) !== "true" && (await shown.count()) === 1) {
      const text = await shown.innerText();
      if (text === String(attempts)) return true;
      seen.push(text);
    }
    await refresh(page);
    return false;
  }, within).catch((e) => {
    throw new Error(`${e.message}; shown: ${[...new Set(seen)].join(", ") || "nothing"}`);
  });
  return panel;
}
