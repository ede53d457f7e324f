// The dashboard in a real browser: headless Debian Chromium driven by playwright-core,
// against the real `hookwise dev` process and a receiving endpoint this test controls.
//
//   HOOKWISE_BIN   the hookwise binary (default: ../../target/debug/hookwise)
//   CHROMIUM       the browser (default: /usr/bin/chromium)
//   ARTIFACTS_DIR  where the screenshots go (default: ../artifacts)

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createServer } from "node:http";
import { mkdtempSync, mkdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";
import { CHROMIUM_ARGS, client, openStats, sleep, waitFor, WAIT_MS } from "./support.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const BIN = process.env.HOOKWISE_BIN || resolve(here, "../../target/debug/hookwise");
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const ARTIFACTS = process.env.ARTIFACTS_DIR || resolve(here, "../artifacts");


/**
 * An endpoint that answers 500 until `recover()`, then 200 (but 500 to a payload with
 * `"fail": true`, always); it records every request.
 */
async function startReceiver() {
  const r = { failing: true, requests: [] };
  r.server = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      const failing = r.failing || body.includes('"fail":true');
      r.requests.push({ headers: req.headers, body, answered: failing ? 500 : 200 });
      if (failing) {
        res.writeHead(500, { "content-type": "text/plain" }).end("endpoint down for maintenance");
      } else {
        res.writeHead(200, { "content-type": "text/plain" }).end("thanks");
      }
    });
  });
  await new Promise((ok) => r.server.listen(0, "127.0.0.1", ok));
  r.url = (path) => `http://127.0.0.1:${r.server.address().port}${path}`;
  r.recover = () => (r.failing = false);
  return r;
}

/** `hookwise dev` on a free port and a fresh data dir; resolves with its URL and key. */
async function startDev(dataDir) {
  const child = spawn(
    BIN,
    ["dev", "--listen", "127.0.0.1:0", "--data-dir", dataDir, "--scheduler-interval", "1", "--visibility-timeout", "3"],
    { env: { ...process.env, HOOKWISE_LOG: "warn" }, stdio: ["ignore", "pipe", "inherit"] },
  );
  const lines = createInterface({ input: child.stdout });
  const found = await new Promise((ok, fail) => {
    const got = {};
    const timer = setTimeout(() => fail(new Error("hookwise dev did not print its address and key within 30 s")), 30_000);
    child.on("exit", (code) => fail(new Error(`hookwise dev exited early (${code})`)));
    lines.on("line", (line) => {
      const url = line.split("listening on ")[1];
      if (url) got.base = url.trim();
      if (line.startsWith("API key:")) got.key = line.slice("API key:".length).trim();
      if (got.base && got.key) {
        clearTimeout(timer);
        ok(got);
      }
    });
  });
  lines.on("line", () => {}); // keep draining stdout
  return { child, ...found };
}


let receiver, reports, dev, api, browserContext, dataDir, profileDir;
const ctx = {};

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  dataDir = mkdtempSync(join(tmpdir(), "hookwise-browser-data-"));
  profileDir = mkdtempSync(join(tmpdir(), "hookwise-browser-profile-"));
  receiver = await startReceiver();
  reports = await startReceiver();
  reports.recover();
  dev = await startDev(dataDir);
  api = client(dev.base, dev.key);

  // Given a subscription to an endpoint that fails until told otherwise, with a short schedule...
  const sub = await api("POST", "/v1/subscriptions", {
    url: receiver.url("/hooks/billing"),
    event_types: ["invoice.*"],
    retry_policy: { schedule_seconds: [1, 1] },
    description: "Billing service",
  });
  assert.equal(sub.status, 201, JSON.stringify(sub.body));
  ctx.sub = sub.body;
  // ...and two events, both of which go dead after three failed attempts.
  const paid = await api("POST", "/v1/events", { type: "invoice.paid", payload: { invoice: "inv_1001", amount: 4200, currency: "EUR" } });
  const overdue = await api("POST", "/v1/events", { type: "invoice.overdue", payload: { invoice: "inv_1002", days: 3 } });
  assert.equal(paid.status, 202);
  assert.equal(overdue.status, 202);
  ctx.paid = paid.body.deliveries[0].id;
  ctx.overdue = overdue.body.deliveries[0].id;
  for (const id of [ctx.paid, ctx.overdue]) {
    await waitFor(`delivery ${id} to go dead`, async () => (await api("GET", `/v1/deliveries/${id}`)).body.status === "dead");
  }

  browserContext = await chromium.launchPersistentContext(profileDir, {
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_ARGS,
    viewport: { width: 1280, height: 900 },
    deviceScaleFactor: 1,
  });
});

after(async () => {
  await browserContext?.close();
  dev?.child.kill("SIGTERM");
  receiver?.server.close();
  reports?.server.close();
  for (const dir of [dataDir, profileDir]) if (dir) rmSync(dir, { recursive: true, force: true });
});

test("a dead delivery is found in the dashboard, its attempts shown, and Replay delivers it without a reload", async () => {
  const page = browserContext.pages()[0] || (await browserContext.newPage());
  const requested = [];
  page.on("request", (r) => requested.push(r.url()));
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(e.message));

  await page.goto(`${dev.base}/dashboard`);

  // A wrong key is refused in plain words; the form is used with the keyboard only.
  await page.locator("#api-key").waitFor();
  assert.equal(await page.evaluate(() => document.activeElement.id), "api-key", "the key field has focus");
  await page.keyboard.type("hwk_this-is-not-a-key");
  await page.keyboard.press("Enter");
  const alert = page.locator("#alert");
  await alert.waitFor({ state: "visible" });
  assert.match(await alert.innerText(), /The API key was not accepted/);
  assert.equal(await page.evaluate(() => sessionStorage.getItem("hookwise.apiKey")), null, "a refused key is not kept");

  await page.locator("#api-key").fill("");
  await page.locator("#api-key").focus();
  await page.keyboard.type(dev.key);
  await page.keyboard.press("Enter");
  await page.locator("#app").waitFor({ state: "visible" });
  assert.equal(await page.evaluate(() => sessionStorage.getItem("hookwise.apiKey")), dev.key, "the key is in sessionStorage");
  assert.equal(await page.evaluate(() => localStorage.length), 0, "and nowhere else");
  assert.ok(!page.url().includes(dev.key), "the key is never in the URL");

  // The subscription: URL, event types, policy, status, health, counts.
  const subRow = page.locator(`#subs tr[data-sub="${ctx.sub.id}"]`);
  await subRow.waitFor();
  const subText = await subRow.innerText();
  for (const want of [receiver.url("/hooks/billing"), "invoice.*", "custom: 1s, 1s", "active", "0 %"]) {
    assert.ok(subText.includes(want), `the subscription row shows ${want}: ${subText}`);
  }
  assert.equal(await subRow.locator('td[data-label="Dead"]').innerText(), "2");
  assert.equal(await subRow.locator('td[data-label="Delivered"]').innerText(), "0");

  // Every control has a label.
  const unlabelled = await page.evaluate(() =>
    [...document.querySelectorAll("input, select, button")]
      .filter((e) => e.offsetParent !== null)
      .filter((e) => !(e.labels && e.labels.length) && !e.getAttribute("aria-label") && !e.textContent.trim())
      .map((e) => e.outerHTML),
  );
  assert.deepEqual(unlabelled, []);

  // Find the dead delivery: filter by status, then open it.
  await page.selectOption("#filter-status", "dead");
  const deadRows = page.locator('#deliveries tbody tr[data-status="dead"]');
  await waitFor("two dead rows", async () => (await deadRows.count()) === 2);
  assert.equal(await page.locator("#deliveries tbody tr").count(), 2, "only dead deliveries are listed");
  const row = page.locator(`#deliveries tr[data-delivery="${ctx.paid}"]`);
  assert.match(await row.innerText(), /invoice\.paid/);
  assert.equal(await row.locator('td[data-label="Attempts"]').innerText(), "3");
  // Newest first: the overdue event was sent last.
  assert.equal(await deadRows.first().getAttribute("data-delivery"), ctx.overdue);
  await row.getByRole("button", { name: /View delivery of invoice\.paid/ }).click();

  // Its attempts: three, each HTTP 500 with the endpoint's response; and its payload.
  const detail = page.locator("#detail");
  await detail.waitFor({ state: "visible" });
  assert.equal(await page.evaluate(() => document.activeElement.id), "detail-title", "focus moves to the delivery");
  assert.equal(await page.locator("#detail-status").innerText(), "dead");
  const attempts = page.locator("#attempts tbody tr");
  assert.equal(await attempts.count(), 3);
  for (let i = 0; i < 3; i++) {
    const text = await attempts.nth(i).innerText();
    assert.match(text, /HTTP 500/);
    assert.match(text, /endpoint down for maintenance/);
  }
  await page.locator("#payload").filter({ hasText: "inv_1001" }).waitFor();
  assert.deepEqual(JSON.parse(await page.locator("#payload").innerText()), { invoice: "inv_1001", amount: 4200, currency: "EUR" });

  // The endpoint recovers; Replay; the page shows it delivered without a reload.
  receiver.recover();
  await page.evaluate(() => (window.__sameDocument = true));
  const replay = page.getByRole("button", { name: "Replay", exact: true });
  assert.ok(await replay.isVisible(), "a dead delivery has a Replay button");
  await replay.click();
  await page.locator("#detail-status", { hasText: "delivered" }).waitFor({ timeout: WAIT_MS });
  assert.equal(await page.evaluate(() => window.__sameDocument), true, "no reload happened");
  assert.equal(await attempts.count(), 4);
  assert.match(await attempts.nth(3).innerText(), /HTTP 200/);
  assert.ok(!(await replay.isVisible()), "no Replay button on a delivered delivery");
  const delivered = (await api("GET", `/v1/deliveries/${ctx.paid}`)).body;
  assert.equal(delivered.status, "delivered");
  assert.equal(receiver.requests.filter((r) => r.answered === 200).length, 1);
  await page.screenshot({ path: join(ARTIFACTS, "dashboard.png"), fullPage: true });

  // "Recover since..." replays the other dead delivery of the subscription.
  await page.selectOption("#filter-status", "");
  // A preview first: how many it will replay; then the replay.
  await subRow.getByRole("button", { name: /Recover dead deliveries/ }).click();
  await subRow.locator("[data-preview]", { hasText: "1 dead delivery since then" }).waitFor();
  await subRow.getByRole("button", { name: /Replay 1 dead delivery/ }).click();
  await page.locator("#notice", { hasText: "Replaying 1 dead delivery" }).waitFor();
  await waitFor("the recovered delivery to be delivered", async () => (await subRow.locator('td[data-label="Dead"]').innerText()) === "0", WAIT_MS);
  await waitFor("the subscription to count two delivered", async () => (await subRow.locator('td[data-label="Delivered"]').innerText()) === "2", WAIT_MS);
  assert.equal((await api("GET", `/v1/deliveries/${ctx.overdue}`)).body.status, "delivered");
  assert.equal(await page.evaluate(() => window.__sameDocument), true, "still no reload");

  // Nothing was fetched from anywhere but the server itself.
  const elsewhere = requested.filter((u) => !u.startsWith(dev.base));
  assert.deepEqual(elsewhere, [], "every request goes to the Hookwise server");
  assert.ok(requested.some((u) => u.endsWith("/dashboard/app.js")));
  assert.deepEqual(pageErrors, []);
});

test("at a phone's width the dashboard fits the screen and the key survives a reload in the same tab", async () => {
  const page = browserContext.pages()[0];
  await page.setViewportSize({ width: 390, height: 844 });
  await page.reload();
  await page.locator("#app").waitFor({ state: "visible" });
  await page.locator(`#deliveries tr[data-delivery="${ctx.paid}"]`).waitFor();
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the page is ${overflow}px wider than the screen`);
  // Rows become labelled cards: the column name shows beside each value.
  const label = await page.locator(`#deliveries tr[data-delivery="${ctx.paid}"] td[data-label="Status"]`).evaluate(
    (td) => getComputedStyle(td, "::before").content,
  );
  assert.equal(label, '"Status"');
  await page.screenshot({ path: join(ARTIFACTS, "dashboard-phone.png"), fullPage: true });

  // Forgetting the key clears it from the tab.
  await page.getByRole("button", { name: "Forget API key" }).click();
  await page.locator("#login").waitFor({ state: "visible" });
  assert.equal(await page.evaluate(() => sessionStorage.getItem("hookwise.apiKey")), null);
});

test("an endpoint's statistics: its attempts, success rate, latency and dead deliveries, and a bar per step of the window", async () => {
  const page = browserContext.pages()[0];
  await page.setViewportSize({ width: 1280, height: 900 });
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(e.message));
  const cspViolations = [];
  page.on("console", (m) => /Content Security Policy/i.test(m.text()) && cspViolations.push(m.text()));

  // An endpoint whose reports arrive, but for one that it refuses twice, and so goes dead.
  const created = await api("POST", "/v1/subscriptions", { url: reports.url("/hooks/reports"), event_types: ["report.*"], retry_policy: { schedule_seconds: [1] } });
  assert.equal(created.status, 201, JSON.stringify(created.body));
  const sub = created.body;
  const send = async (payload) => {
    const sent = await api("POST", "/v1/events", { type: "report.ready", payload });
    assert.equal(sent.status, 202, JSON.stringify(sent.body));
    return sent.body.deliveries[0].id;
  };
  const settled = async (id, want) =>
    waitFor(`delivery ${id} ${want}`, async () => (await api("GET", `/v1/deliveries/${id}`)).body.status === want);
  const ok = [await send({ report: 1 }), await send({ report: 2 }), await send({ report: 3 })];
  const refused = await send({ report: 4, fail: true });
  for (const id of ok) await settled(id, "delivered");
  await settled(refused, "dead");
  assert.equal(reports.requests.length, 5);

  // Signed in again (the previous test forgot the key).
  await page.goto(`${dev.base}/dashboard`);
  await page.locator("#api-key").fill(dev.key);
  await page.keyboard.press("Enter");
  await page.locator("#app").waitFor({ state: "visible" });
  const row = page.locator(`#subs tr[data-sub="${sub.id}"]`);
  await row.waitFor();
  const toggle = row.getByRole("button", { name: /^Statistics of / });
  assert.equal(await toggle.getAttribute("aria-expanded"), "false");
  assert.equal(await page.locator(".stats").count(), 0, "no statistics are read on page load");

  // Five attempts (three delivered, two refused: 60 %), one dead delivery, over 24 hours. A
  // process writes an endpoint's counts every few seconds: the panel is refreshed until then.
  const panel = await openStats(page, sub.id, 5);
  assert.equal(await toggle.getAttribute("aria-expanded"), "true");
  assert.equal(await toggle.getAttribute("aria-controls"), await panel.getAttribute("id"));
  const figure = (key) => panel.locator(`dd[data-stat="${key}"]`).innerText();
  assert.equal(await figure("success-rate"), "60 %");
  assert.equal(await figure("failed"), "2 (2 HTTP 5xx)");
  assert.equal(await figure("dead"), "1");
  for (const p of ["p50", "p95", "p99"]) assert.match(await figure(p), /^(\d+ ms|> 30000 ms)$/, p);
  assert.equal(await panel.locator('[data-window="24h"]').getAttribute("aria-pressed"), "true");

  // The chart: an SVG the page drew, one bar group per step, named for assistive technology.
  const chart = panel.locator("svg.stats-chart");
  const bars = chart.locator("g.bar");
  assert.equal(await bars.count(), 24);
  assert.equal(await chart.getAttribute("role"), "img");
  assert.match(await chart.getAttribute("aria-label"), /5 in all, 3 succeeded, 2 failed; 1 delivery went dead/);
  assert.match(await chart.locator(":scope > title").textContent(), /5 in all/);
  const drawn = await bars.evaluateAll((gs) =>
    gs.map((g) => ({ attempts: Number(g.dataset.attempts), dead: Number(g.dataset.dead), ok: g.querySelectorAll("rect.ok").length, failed: g.querySelectorAll("rect.failed").length, dots: g.querySelectorAll("circle.dead").length })),
  );
  assert.equal(drawn.reduce((n, b) => n + b.attempts, 0), 5);
  assert.equal(drawn.reduce((n, b) => n + b.dots, 0), 1, "the dead delivery is marked");
  assert.ok(drawn.some((b) => b.ok === 1 && b.failed === 1), "succeeded and failed attempts are stacked");
  // Drawn as SVG nodes with classes, under the page's CSP: no style attribute anywhere.
  assert.equal(await chart.evaluate((svg) => svg.namespaceURI), "http://www.w3.org/2000/svg");
  assert.equal(await panel.locator("[style]").count(), 0);
  const fill = await panel.locator("rect.ok").first().evaluate((r) => getComputedStyle(r).fill);
  assert.notEqual(fill, "rgb(0, 0, 0)", "the bars are coloured by the stylesheet");

  // Other windows: 12 steps of 5 minutes, 28 of 6 hours; the same attempts.
  for (const [w, steps] of [["1h", 12], ["7d", 28]]) {
    await panel.getByRole("button", { name: w, exact: true }).click();
    await waitFor(`${steps} bars for ${w}`, async () => (await bars.count()) === steps && (await panel.getAttribute("aria-busy")) !== "true");
    assert.equal(await panel.locator(`[data-window="${w}"]`).getAttribute("aria-pressed"), "true");
    assert.equal(await figure("attempts"), "5");
  }

  // The panel is a row of its own under the endpoint's, and nothing else is added to the table.
  assert.equal(await page.locator(`#subs tr[data-sub="${sub.id}"] + tr.stats-row .stats[data-stats="${sub.id}"]`).count(), 1);
  assert.deepEqual(await page.locator("#subs tbody").evaluate((b) => [...b.childNodes].map((n) => n.nodeName).filter((n) => n !== "TR")), []);

  // The panel stays open, shows the same and keeps the focus while the list is drawn again.
  await panel.locator('[data-window="7d"]').focus();
  await page.evaluate(() => {
    document.getElementById("notice").textContent = "";
    document.getElementById("refresh").click();
  });
  await page.locator("#notice", { hasText: "Refreshed." }).waitFor();
  assert.equal(await bars.count(), 28);
  assert.equal(await panel.locator('[data-window="7d"]').getAttribute("aria-pressed"), "true");
  assert.equal(await page.evaluate(() => document.activeElement.dataset.window), "7d", "the focus stays on the window chosen");

  await page.screenshot({ path: join(ARTIFACTS, "dashboard-stats.png"), fullPage: true });
  // At a phone's width the open panel fits the screen.
  await page.setViewportSize({ width: 390, height: 844 });
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the page is ${overflow}px wider than the screen`);
  await panel.screenshot({ path: join(ARTIFACTS, "dashboard-stats-phone.png") });
  await page.setViewportSize({ width: 1280, height: 900 });

  // An error answer is told in the panel, in the page's words.
  const statsRoute = (url) => url.pathname.endsWith("/stats");
  await page.route(statsRoute, (route) =>
    route.fulfill({ status: 422, contentType: "application/json", body: JSON.stringify({ error: { code: "invalid_window", message: "window `2d` is not one of 1h, 24h, 7d" } }) }),
  );
  await panel.getByRole("button", { name: "24h", exact: true }).click();
  await panel.locator("[data-stats-error]").waitFor();
  assert.equal(await panel.locator("[data-stats-error]").innerText(), "The request was not valid (window `2d` is not one of 1h, 24h, 7d).");
  await page.unroute(statsRoute);

  // Closed again: the row goes.
  await toggle.click();
  assert.equal(await page.locator(".stats").count(), 0);
  assert.equal(await toggle.getAttribute("aria-expanded"), "false");
  assert.deepEqual(pageErrors, []);
  assert.deepEqual(cspViolations, []);
});
