// The customer portal in a real browser: headless Debian Chromium driven by playwright-core,
// against the real `hookwise dev`, receiving endpoints this test controls, and two pages that
// embed the portal (one from an allowed origin, one from another).
//
// An operator creates two accounts and mints a portal link for each. The first customer adds
// an endpoint, reads its signing secret again (this deployment reveals secrets), sees a
// delivery fail and go dead, fixes the endpoint, replays and sees it delivered, signed with
// that secret; the second customer's link shows none of it. An expired link gets 401, a
// read-only one cannot replay, a portal token gets 403 on the operator routes and 404 on the
// other account's ids, and the portal loads in an iframe only from the allowed origin.
//
//   HOOKWISE_BIN   the hookwise binary (default: ../../target/debug/hookwise)
//   CHROMIUM       the browser (default: /usr/bin/chromium)
//   ARTIFACTS_DIR  where the screenshots go (default: ../artifacts)

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { createHmac } from "node:crypto";
import { createServer } from "node:http";
import { mkdtempSync, mkdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";
import { CHROMIUM_ARGS, client, openStats, refresh, sleep, waitFor, WAIT_MS } from "./support.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const BIN = process.env.HOOKWISE_BIN || resolve(here, "../../target/debug/hookwise");
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const ARTIFACTS = process.env.ARTIFACTS_DIR || resolve(here, "../artifacts");
const EXPIRING_TTL_S = 60;

/** Whether `secret` signed this webhook, as Standard Webhooks verifies it. */
function signedWith(secret, headers, body) {
  const key = Buffer.from(secret.replace(/^whsec_/, ""), "base64");
  const content = `${headers["webhook-id"]}.${headers["webhook-timestamp"]}.${body}`;
  const expected = createHmac("sha256", key).update(content).digest("base64");
  return headers["webhook-signature"].split(" ").includes(`v1,${expected}`);
}


async function listen(handler) {
  const server = createServer(handler);
  await new Promise((ok) => server.listen(0, "127.0.0.1", ok));
  return { server, origin: `http://127.0.0.1:${server.address().port}` };
}

/** An endpoint answering `status` to every POST; it records their bodies and headers. */
async function startEndpoint(status) {
  const bodies = [];
  const headers = [];
  const { server, origin } = await listen((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      bodies.push(body);
      headers.push(req.headers);
      res.writeHead(status, { "content-type": "text/plain" }).end(status < 300 ? "ok" : "down");
    });
  });
  return { server, url: `${origin}/hooks`, bodies, headers };
}

/** A page that embeds `link` in an iframe (set per test through `embed.link`). */
async function startEmbedder() {
  const embed = { link: "about:blank" };
  const { server, origin } = await listen((req, res) => {
    res.writeHead(200, { "content-type": "text/html" }).end(
      `<!doctype html><title>Customer app</title><h1>Our app</h1><iframe id="portal" src="${embed.link}" width="1000" height="700"></iframe>`,
    );
  });
  return Object.assign(embed, { server, origin });
}

async function startDev(dataDir, env) {
  const child = spawn(BIN, ["dev", "--listen", "127.0.0.1:0", "--data-dir", dataDir, "--scheduler-interval", "1"], {
    env: { ...process.env, HOOKWISE_LOG: "warn", ...env },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const lines = createInterface({ input: child.stdout });
  const base = await new Promise((ok, fail) => {
    const timer = setTimeout(() => fail(new Error("hookwise dev did not print its address within 30 s")), 30_000);
    child.on("exit", (code) => fail(new Error(`hookwise dev exited early (${code})`)));
    lines.on("line", (line) => {
      const url = line.split("listening on ")[1];
      if (url) {
        clearTimeout(timer);
        ok(url.trim());
      }
    });
  });
  lines.on("line", () => {});
  return { child, base };
}


let dev, op, down, up, allowed, other, browser, dataDir, profileDir;
const links = {};
const tokenOf = (link) => new URLSearchParams(new URL(link).hash.slice(1)).get("token");

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  dataDir = mkdtempSync(join(tmpdir(), "hookwise-portal-data-"));
  profileDir = mkdtempSync(join(tmpdir(), "hookwise-portal-profile-"));
  down = await startEndpoint(500);
  up = await startEndpoint(200);
  allowed = await startEmbedder();
  other = await startEmbedder();
  // The operator's key, made beside the data dir before the process starts.
  const made = JSON.parse(execFileSync(BIN, ["operator", "create-key", "--data-dir", dataDir], { env: { ...process.env, HOOKWISE_LOG: "warn" } }));
  dev = await startDev(dataDir, {
    HOOKWISE_PORTAL_FRAME_ANCESTORS: allowed.origin,
    HOOKWISE_PORTAL_NAME: "Northwind Webhooks",
    HOOKWISE_PORTAL_ACCENT: "#0b7285",
    HOOKWISE_REVEAL_SECRETS: "true",
  });
  op = client(dev.base, made.api_key);

  // The deployment's catalogue: one type, with its schema and example.
  const defined = await op("POST", "/v1/event-types", {
    name: "invoice.paid",
    description: "An invoice was paid in full.",
    schema: { type: "object", required: ["invoice"], properties: { invoice: { type: "string" } } },
    example: { invoice: "in_example" },
  });
  assert.equal(defined.status, 201, JSON.stringify(defined.body));
  for (const id of ["acct_first", "acct_second"]) {
    const created = await op("POST", "/v1/tenants", { id, name: id, owner_email: `${id}@example.com` });
    assert.equal(created.status, 201, JSON.stringify(created.body));
  }
  const mint = async (tenant, body) => {
    const r = await op("POST", "/v1/portal-sessions", body, tenant);
    assert.equal(r.status, 201, JSON.stringify(r.body));
    return r.body.url;
  };
  links.first = await mint("acct_first", {});
  links.second = await mint("acct_second", {});
  links.readOnly = await mint("acct_first", { read_only: true });
  links.expiring = await mint("acct_first", { ttl_seconds: EXPIRING_TTL_S });
  links.expiringSince = Date.now();

  browser = await chromium.launchPersistentContext(profileDir, {
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_ARGS,
    viewport: { width: 1280, height: 900 },
    deviceScaleFactor: 1,
  });
});

after(async () => {
  await browser?.close();
  dev?.child.kill("SIGTERM");
  for (const s of [down, up, allowed, other]) s?.server.close();
  for (const dir of [dataDir, profileDir]) if (dir) rmSync(dir, { recursive: true, force: true });
});

/** A fresh tab (its own sessionStorage) on `link`, signed in. */
async function openPortal(link) {
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  await page.goto(link);
  await page.locator("#app").waitFor({ state: "visible" });
  return { page, errors };
}

test("the first customer adds an endpoint, sees a delivery go dead, fixes the endpoint and replays it delivered", async () => {
  const { page, errors } = await openPortal(links.first);
  // The token left the address bar for this tab's sessionStorage; the branding is the deployment's.
  assert.ok(!page.url().includes("#"), `no token in the address bar: ${page.url()}`);
  assert.equal(await page.evaluate(() => sessionStorage.getItem("hookwise.portalToken")), tokenOf(links.first));
  assert.equal(await page.evaluate(() => localStorage.length), 0);
  await waitFor("the branding", async () => (await page.locator("#brand-name").innerText()) === "Northwind Webhooks");
  assert.equal(await page.evaluate(() => getComputedStyle(document.documentElement).getPropertyValue("--accent").trim()), "#0b7285");
  assert.equal(await page.locator("#login").isVisible(), false, "no key to type in a portal");
  // The catalogue, with its example.
  const typeRow = page.locator('#types tr[data-type="invoice.paid"]');
  await typeRow.locator("summary").click();
  assert.match(await typeRow.innerText(), /An invoice was paid in full\.[\s\S]*in_example/);

  // Adds an endpoint (failing for now) with a short schedule.
  await page.locator("#new-url").fill(down.url);
  await page.locator("#new-types").fill("invoice.*");
  await page.locator("#new-schedule").fill("1, 1");
  await page.locator("#new-rate").fill("50");
  await page.getByRole("button", { name: "Add endpoint" }).click();
  await page.locator("#secret-box").waitFor({ state: "visible" });
  const secret = await page.locator("#secret-value").innerText();
  assert.match(secret, /^whsec_/);
  const row = page.locator("#subs tbody tr").first();
  await waitFor("the endpoint listed", async () => (await row.innerText()).includes(down.url));
  // The deployment reveals secrets: the customer can read it again later.
  await page.evaluate(() => (document.getElementById("secret-value").textContent = ""));
  await row.getByRole("button", { name: /^Reveal secret/ }).click();
  await waitFor("the secret shown again", async () => (await page.locator("#secret-value").innerText()) === secret);
  assert.equal(await page.locator("#secret-made").isVisible(), false, "not \"shown this once\"");
  assert.equal(await row.locator('td[data-label="Rate limit"]').innerText(), "50/s");
  // Its schedule as a timeline, by the policy code; whose account this is, and its retries.
  assert.match(await row.locator('td[data-label="Policy"]').innerText(), /if your endpoint is down: retries at \+1 s, \+2 s; dead after 2 s/);
  assert.match(await page.locator("#account").innerText(), /\(acct_first\): retries on, in the rollout/);

  // The ledger service sends the account an event; it fails three times and goes dead.
  const sent = await op("POST", "/v1/events", { type: "invoice.paid", payload: { invoice: "in_42" } }, "acct_first");
  assert.equal(sent.status, 202, JSON.stringify(sent.body));
  const delivery = sent.body.deliveries[0].id;
  const deliveryRow = page.locator(`#deliveries tr[data-delivery="${delivery}"]`);
  await waitFor("the delivery dead on the page", async () => {
    await refresh(page);
    return (await deliveryRow.count()) === 1 && (await deliveryRow.getAttribute("data-status")) === "dead";
  });
  assert.equal(down.bodies.length, 3);

  // Fixes the endpoint (a new URL), then replays: delivered, without a reload.
  const urlInput = row.locator('input[type="url"]');
  await urlInput.fill(up.url);
  await row.getByRole("button", { name: "Save", exact: true }).click();
  await waitFor(
    "the new URL listed",
    async () => (await page.locator("#notice").innerText()) === "The endpoint is changed." && (await urlInput.inputValue()) === up.url,
  ).catch(async (e) => {
    throw new Error(`${e.message}; the page says: ${await page.locator("#notice").innerText()}; input ${await urlInput.inputValue()} want ${up.url}; row ${await row.innerText()}`);
  });
  await deliveryRow.getByRole("button", { name: /View delivery/ }).click();
  // Each attempt with the headers it sent (its signature's value left out).
  const firstAttempt = page.locator('#attempts tr[data-attempt="0.1"]');
  await firstAttempt.locator("summary").click();
  const sentHeaders = await firstAttempt.locator("pre").innerText();
  assert.match(sentHeaders, new RegExp(`webhook-id: ${sent.body.id}`));
  assert.match(sentHeaders, /webhook-timestamp: \d+/);
  assert.ok(!/whsec_/.test(sentHeaders), "no secret");
  await page.locator("#replay").click();
  await waitFor("the replay delivered", async () => (await page.locator("#detail-status").innerText()) === "delivered");
  assert.equal(up.bodies.length, 1, "the fixed endpoint got it once");
  assert.match(up.bodies[0], /in_42/);
  assert.ok(signedWith(secret, up.headers[0], up.bodies[0]), "signed with the secret the portal showed");
  // A test send: the endpoint gets a ping flagged as a test, and the listing says so.
  await page.locator("#close-detail").click();
  await row.getByRole("button", { name: /^Send test/ }).click();
  await waitFor("the test received", async () => up.bodies.length === 2);
  const ping = JSON.parse(up.bodies[1]);
  assert.deepEqual([ping.type, ping.test], ["hookwise.ping", true]);
  assert.ok(signedWith(secret, up.headers[1], up.bodies[1]));
  await waitFor("the test listed", async () => {
    await refresh(page);
    return (await page.locator(`#deliveries tr[data-delivery] .badge.test`).count()) === 1;
  });
  await page.screenshot({ path: join(ARTIFACTS, "portal.png"), fullPage: true });
  assert.deepEqual(errors, []);
  await page.close();
});

test("the second customer's link shows none of it, and a portal token reaches neither the operator routes nor the other account", async () => {
  const { page } = await openPortal(links.second);
  await refresh(page);
  assert.equal(await page.locator("#subs tbody tr").count(), 0);
  assert.equal(await page.locator("#deliveries tbody tr").count(), 0);
  await page.close();

  const portal = client(dev.base, tokenOf(links.second));
  assert.equal((await portal("GET", "/v1/tenants")).status, 403);
  assert.equal((await portal("GET", "/v1/rollout")).status, 403);
  const firsts = await op("GET", "/v1/deliveries", undefined, "acct_first");
  const theirs = firsts.body.data[0].id;
  assert.equal((await portal("GET", `/v1/deliveries/${theirs}`)).status, 404);
  assert.equal((await portal("POST", `/v1/deliveries/${theirs}/replay`)).status, 404);
  const theirSub = (await op("GET", "/v1/subscriptions", undefined, "acct_first")).body.data[0].id;
  assert.equal((await portal("POST", `/v1/subscriptions/${theirSub}/reveal-secret`, {})).status, 404);
  assert.equal((await portal("POST", "/v1/events", { type: "a.b", payload: {} })).status, 403, "a portal sends no events");
});

test("a read-only link shows the deliveries but cannot replay", async () => {
  const { page } = await openPortal(links.readOnly);
  const firsts = await op("GET", "/v1/deliveries", undefined, "acct_first");
  const id = firsts.body.data[0].id;
  const row = page.locator(`#deliveries tr[data-delivery="${id}"]`);
  await row.waitFor();
  assert.equal(await page.locator("#add-sub").isVisible(), false, "no endpoint form");
  assert.equal(await page.getByRole("button", { name: /^Reveal secret/ }).count(), 0, "no secret to reveal");
  await row.getByRole("button", { name: /View delivery/ }).click();
  await page.locator("#detail").waitFor({ state: "visible" });
  assert.equal(await page.locator("#replay").isVisible(), false, "no Replay button");
  await page.close();
  const portal = client(dev.base, tokenOf(links.readOnly));
  const replay = await portal("POST", `/v1/deliveries/${id}/replay`);
  assert.deepEqual([replay.status, replay.body.error.code], [403, "read_only"]);
  const sub = (await op("GET", "/v1/subscriptions", undefined, "acct_first")).body.data[0].id;
  const reveal = await portal("POST", `/v1/subscriptions/${sub}/reveal-secret`, {});
  assert.deepEqual([reveal.status, reveal.body.error.code], [403, "read_only"]);
});

test("the portal shows an endpoint's statistics, to a read-only link too", async () => {
  // The first customer's endpoint: three refused attempts (the delivery went dead), then the
  // replay and the test delivered (the panel is refreshed until a process has written them).
  const { page, errors } = await openPortal(links.readOnly);
  const sub = (await op("GET", "/v1/subscriptions", undefined, "acct_first")).body.data[0].id;
  const panel = await openStats(page, sub, 5);
  const figure = (key) => panel.locator(`dd[data-stat="${key}"]`).innerText();
  assert.equal(await figure("success-rate"), "40 %");
  assert.equal(await figure("failed"), "3 (3 HTTP 5xx)");
  assert.equal(await figure("dead"), "1");
  const bars = panel.locator("svg.stats-chart g.bar");
  assert.equal(await bars.count(), 24);
  assert.equal(await bars.evaluateAll((gs) => gs.reduce((n, g) => n + Number(g.dataset.attempts), 0)), 5);
  await panel.getByRole("button", { name: "1h", exact: true }).click();
  await waitFor("12 bars for 1h", async () => (await bars.count()) === 12);
  assert.equal(await panel.locator("[style]").count(), 0, "no style attribute (the portal's CSP)");
  await page.screenshot({ path: join(ARTIFACTS, "portal-stats.png"), fullPage: true });
  assert.deepEqual(errors, []);
  await page.close();

  // The other account's endpoint is not found through this link.
  const portal = client(dev.base, tokenOf(links.second));
  assert.equal((await portal("GET", `/v1/subscriptions/${sub}/stats`)).status, 404);
});

test("the portal loads in an iframe from the allowed origin only", async () => {
  allowed.link = links.first;
  other.link = links.first;
  const page = await browser.newPage();
  await page.goto(allowed.origin);
  const framed = page.frameLocator("#portal");
  await framed.locator("#app").waitFor({ state: "visible" });
  assert.equal(await framed.locator("#brand-name").innerText(), "Northwind Webhooks");
  await page.screenshot({ path: join(ARTIFACTS, "portal-embedded.png") });

  const refused = await browser.newPage();
  await refused.goto(other.origin);
  await sleep(2000);
  const frame = refused.frames().find((f) => f !== refused.mainFrame());
  const loaded = frame ? await frame.locator("#app").count() : 0;
  assert.equal(loaded, 0, `refused from ${other.origin}: ${frame && frame.url()}`);
  await page.close();
  await refused.close();
});

test("an expired link gets 401 and the page says to ask for a new one", async () => {
  const left = EXPIRING_TTL_S * 1000 - (Date.now() - links.expiringSince) + 1500;
  if (left > 0) await sleep(left);
  const portal = client(dev.base, tokenOf(links.expiring));
  assert.equal((await portal("GET", "/v1/subscriptions")).status, 401);
  const page = await browser.newPage();
  await page.goto(links.expiring);
  await page.locator("#portal-gone").waitFor({ state: "visible" });
  assert.match(await page.locator("#alert").innerText(), /expired or was revoked/);
  await page.close();
});
