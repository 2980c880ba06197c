/**
 * The chat page at GET /: one static HTML file, its script inline. Served as HTML with what it
 * needs (the streaming fetch to /v1/chat/completions, tok/s, a Stop button on an AbortController).
 * In headless Chromium (driven over the DevTools protocol), where `chromium` is installed: a message
 * typed into the page streams in as the API's greedy reply, and a tok/s figure shows. Without
 * Chromium that part is skipped, saying why.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import type { Model } from "../src/engine/index.ts";
import { startServer, type RunningServer } from "../src/host/index.ts";
import { chromiumPath, openHeadlessPage } from "./support/chromium.ts";
import { loadHostModel, modelPath } from "./support/host.ts";

const browserSkip = chromiumPath ? undefined : "skipping the headless-Chromium check of the chat page: no `chromium` (or chromium-browser, google-chrome) on PATH (apt-get install chromium)";
if (browserSkip) console.warn(browserSkip);

let model: Model | undefined;
let server: RunningServer | undefined;
beforeAll(async () => {
  if (!modelPath) return;
  model = await loadHostModel();
  server = startServer(model, { port: 0, ctx: 128, modelName: "tiny" });
});
afterAll(async () => {
  await server?.close();
  model?.[Symbol.dispose]();
});

(modelPath ? test : test.skip)("GET / serves the chat page: HTML, streaming fetch, tok/s, a Stop button that aborts", async () => {
  const r = await fetch(`${server!.url}/`);
  expect(r.status).toBe(200);
  expect(r.headers.get("content-type")).toContain("text/html");
  const html = await r.text();
  expect(html).toContain('<button id="stop"');
  expect(html).toContain("new AbortController()");
  expect(html).toContain("controller?.abort()");
  expect(html).toContain('fetch("/v1/chat/completions"');
  expect(html).toContain("stream: true");
  expect(html).toContain("tok/s");
  expect(html).not.toMatch(/<script[^>]+src=/); // inline only, no build step
});

(modelPath && chromiumPath ? test : test.skip)("headless Chromium: a message typed into the page streams the API's greedy reply into it and shows tok/s", async () => {
  const maxTokens = 12;
  // what the API answers for the page's request (the page sends enable_thinking from its unchecked box)
  const api = await fetch(`${server!.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ messages: [{ role: "user", content: "Hello" }], max_tokens: maxTokens, temperature: 0, chat_template_kwargs: { enable_thinking: false } }),
  });
  const want = (await api.json()) as { choices: { message: { content: string; reasoning_content?: string } }[]; usage: { completion_tokens: number } };
  expect(want.choices[0]!.message.content.length).toBeGreaterThan(0);

  await using page = await openHeadlessPage(`${server!.url}/?max_tokens=${maxTokens}&temperature=0`);
  await page.waitFor(`document.getElementById("model").textContent.includes("tiny")`, 10_000); // the script ran: it asked /health
  // every text the reply shows on its way: a streamed reply grows, a buffered one appears at once
  await page.evaluate(`window.shown = []; new MutationObserver(() => {
    const answer = document.querySelector("#reply-1 > div:last-child");
    if (answer && answer.textContent !== window.shown.at(-1)) window.shown.push(answer.textContent);
  }).observe(document.getElementById("log"), { subtree: true, childList: true, characterData: true })`);
  await page.typeAndEnter("#prompt", "Hello");
  await page.waitFor(`["done", "error"].includes(document.body.dataset.state)`, 30_000);
  const seen = await page.evaluate<{ state: string; user: string; reasoning: string; answer: string; stats: string; shown: string[] }>(`({
    state: document.body.dataset.state,
    user: document.querySelector("#log > .user").textContent,
    reasoning: document.querySelector("#reply-1 > .reasoning").textContent,
    answer: document.querySelector("#reply-1 > div:last-child").textContent,
    stats: document.getElementById("stats").textContent,
    shown: window.shown,
  })`);
  expect(seen.state).toBe("done");
  expect(seen.user).toBe("Hello");
  expect(seen.answer).toBe(want.choices[0]!.message.content);
  expect(seen.reasoning).toBe(want.choices[0]!.message.reasoning_content ?? "");
  expect(seen.stats).toMatch(new RegExp(`^${want.usage.completion_tokens} tokens · \\d+\\.\\d tok/s$`));
  // each text shown on the way is a start of the final one, and there was more than the final one
  for (const partial of seen.shown) expect(seen.answer.startsWith(partial)).toBe(true);
  expect(seen.shown.filter((t) => t !== "").length).toBeGreaterThan(1);
}, 60_000);

/**
 * Without a browser the page's own script still runs: in Bun, over a minimal DOM stand-in (elements
 * by id, events, text), with its fetch sent to the server. What it shows must be what the API says.
 */
class FakeElement {
  value = "";
  checked = false;
  disabled = false;
  textContent = "";
  className = "";
  id = "";
  dataset: Record<string, string> = {};
  children: FakeElement[] = [];
  private handlers = new Map<string, ((e: unknown) => void)[]>();
  addEventListener(type: string, f: (e: unknown) => void) {
    this.handlers.set(type, [...(this.handlers.get(type) ?? []), f]);
  }
  dispatch(type: string, event: object = {}) {
    for (const f of this.handlers.get(type) ?? []) f({ preventDefault() {}, ...event });
  }
  requestSubmit() {
    this.dispatch("submit");
  }
  appendChild(child: FakeElement) {
    this.children.push(child);
    return child;
  }
  append(...children: FakeElement[]) {
    this.children.push(...children);
  }
  scrollIntoView() {}
}

function runPage(baseUrl: string, search: string) {
  const byId = new Map<string, FakeElement>();
  for (const id of ["model", "stats", "log", "form", "prompt", "send", "stop", "clear", "max", "temp", "think", "key"]) byId.set(id, new FakeElement());
  byId.get("max")!.value = "512";
  byId.get("temp")!.value = "0.7";
  const body = new FakeElement();
  const document = { getElementById: (id: string) => byId.get(id), createElement: () => new FakeElement(), body };
  const storage = new Map<string, string>();
  const sessionStorage = { getItem: (k: string) => storage.get(k) ?? null, setItem: (k: string, v: string) => storage.set(k, v) };
  const pageFetch = (url: string, init?: RequestInit) => fetch(`${baseUrl}${url}`, init);
  const html = require("node:fs").readFileSync(`${import.meta.dir}/../src/host/chat-page.html`, "utf8") as string;
  const script = /<script>([\s\S]*)<\/script>/.exec(html)![1]!;
  new Function("document", "location", "sessionStorage", "fetch", script)(document, { search }, sessionStorage, pageFetch);
  return { byId, body, state: () => body.dataset.state };
}

async function until(check: () => boolean, ms: number): Promise<boolean> {
  const end = performance.now() + ms;
  while (performance.now() < end && !check()) await new Promise((r) => setTimeout(r, 20));
  return check();
}

(modelPath ? test : test.skip)("the page's script (in a DOM stand-in): streams the API's reply, shows tok/s, and Stop aborts the request", async () => {
  const { engineReply, metricsOf } = await import("./support/host.ts");
  const page = runPage(server!.url, "?prompt=Hello&max_tokens=4&temperature=0");
  expect(await until(() => page.state() === "done" || page.state() === "error", 20_000)).toBe(true);
  expect(page.state()).toBe("done");
  const log = page.byId.get("log")!.children;
  expect(log[0]!.textContent).toBe("Hello");
  const [thinking, answer] = log[1]!.children;
  const want = engineReply(model!, "Hello", { maxTokens: 4, ctx: 128, enableThinking: false });
  expect(answer!.textContent).toBe(want.text);
  expect(thinking!.textContent).toBe("");
  expect(page.byId.get("stats")!.textContent).toMatch(/^4 tokens · [\d.]+ tok\/s$/);

  // a long reply, stopped
  const before = (await metricsOf(server!.url)).get("vkmoe_requests_cancelled_total")!;
  page.byId.get("max")!.value = "100"; // under the cap (ctx 128)
  page.byId.get("prompt")!.value = "Go on";
  page.byId.get("form")!.dispatch("submit");
  expect(await until(() => (page.byId.get("log")!.children[3]?.children[1]?.textContent ?? "") !== "", 10_000)).toBe(true);
  expect(page.byId.get("stop")!.disabled).toBe(false);
  page.byId.get("stop")!.dispatch("click");
  expect(await until(() => page.state() === "done", 5000)).toBe(true);
  expect(page.byId.get("log")!.children.at(-1)!.textContent).toBe("stopped");
  expect(await until(() => server!.host.scheduler.stats().active === 0, 3000)).toBe(true);
  expect((await metricsOf(server!.url)).get("vkmoe_requests_cancelled_total")).toBe(before + 1);
}, 40_000);
