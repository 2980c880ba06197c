/**
 * Headless Chromium for page tests (Bun only): one browser process with a fresh profile, one page
 * driven over the DevTools protocol (a WebSocket), every wait bounded. Disposing the page kills
 * the browser and removes its profile, whatever state the test left it in.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** The browser's executable, or undefined where none is installed. */
export const chromiumPath: string | undefined = Bun.which("chromium") ?? Bun.which("chromium-browser") ?? Bun.which("google-chrome") ?? undefined;

export class HeadlessBrowserError extends Error {
  override readonly name = "HeadlessBrowserError";
}

export interface HeadlessPage extends AsyncDisposable {
  /** Runs `expression` in the page; its value (JSON-serializable) or a HeadlessBrowserError for an exception. */
  evaluate<T = unknown>(expression: string): Promise<T>;
  /** Polls `expression` until it is truthy; a HeadlessBrowserError after `ms`. */
  waitFor(expression: string, ms: number): Promise<void>;
  /** Focuses the element, types `text` as keyboard input, then presses Enter. */
  typeAndEnter(selector: string, text: string): Promise<void>;
  /** The browser's stderr so far (for failure messages). */
  readonly log: () => string;
}

interface Pending {
  resolve(result: any): void;
  reject(error: Error): void;
}

/** Starts the browser on `url`; rejects (and cleans up) when it is not reachable within `ms`. */
export async function openHeadlessPage(url: string, ms = 20_000): Promise<HeadlessPage> {
  if (!chromiumPath) throw new HeadlessBrowserError("no chromium on PATH");
  const profile = mkdtempSync(join(tmpdir(), "vkmoe-chromium-"));
  const child = Bun.spawn({
    cmd: [chromiumPath, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--remote-debugging-port=0", `--user-data-dir=${profile}`, "about:blank"],
    stdout: "ignore",
    stderr: "pipe",
  });
  let stderr = "";
  let socket: WebSocket | undefined;
  const close = async () => {
    socket?.close();
    // SIGTERM lets Chromium end its own renderer and zygote processes; SIGKILL if it does not within 3 s
    child.kill("SIGTERM");
    if ((await Promise.race([child.exited, Bun.sleep(3000).then(() => "late" as const)])) === "late") child.kill("SIGKILL");
    await child.exited;
    rmSync(profile, { recursive: true, force: true });
  };
  try {
    const browserUrl = await devToolsUrl(child.stderr, ms, (s) => (stderr = s));
    const target = await pageTarget(browserUrl, ms);
    socket = await connect(target, ms);
    const page = cdpPage(socket, () => stderr);
    await page.send("Page.enable");
    await page.send("Runtime.enable");
    await page.send("Page.navigate", { url });
    await page.waitFor(`document.readyState === "complete" && location.href === ${JSON.stringify(url)}`, ms);
    return { ...page.api, [Symbol.asyncDispose]: close };
  } catch (e) {
    await close();
    throw e instanceof HeadlessBrowserError ? new HeadlessBrowserError(`${e.message}; chromium's stderr:\n${stderr.slice(-2000)}`) : e;
  }
}

/** Reads stderr until Chromium prints its DevTools address; keeps draining it after (a full pipe would stall the browser). */
async function devToolsUrl(stream: ReadableStream<Uint8Array>, ms: number, onText: (all: string) => void): Promise<string> {
  const reader = stream.getReader();
  const decoder = new TextDecoder();
  let text = "";
  let found: ((url: string) => void) | undefined;
  const url = new Promise<string>((resolve) => (found = resolve));
  void (async () => {
    for (;;) {
      const { done, value } = await reader.read().catch(() => ({ done: true, value: undefined }));
      if (done) return;
      text = (text + decoder.decode(value, { stream: true })).slice(-64 * 1024);
      onText(text);
      const m = /DevTools listening on (ws:\/\/\S+)/.exec(text);
      if (m) found?.(m[1]!);
    }
  })();
  return withTimeout(url, ms, "chromium did not print its DevTools address");
}

/** The WebSocket of the browser's first page (about:blank), from the DevTools HTTP endpoint. */
async function pageTarget(browserUrl: string, ms: number): Promise<string> {
  const http = browserUrl.replace(/^ws:\/\/([^/]+)\/.*$/, "http://$1");
  const end = performance.now() + ms;
  while (performance.now() < end) {
    const list = (await (await fetch(`${http}/json/list`)).json()) as { type: string; webSocketDebuggerUrl: string }[];
    const page = list.find((t) => t.type === "page");
    if (page) return page.webSocketDebuggerUrl;
    await Bun.sleep(50);
  }
  throw new HeadlessBrowserError("chromium opened no page");
}

function connect(url: string, ms: number): Promise<WebSocket> {
  const socket = new WebSocket(url);
  const open = new Promise<WebSocket>((resolve, reject) => {
    socket.addEventListener("open", () => resolve(socket), { once: true });
    socket.addEventListener("error", () => reject(new HeadlessBrowserError(`cannot connect to ${url}`)), { once: true });
  });
  return withTimeout(open, ms, "the DevTools WebSocket did not open");
}

/** Commands over the page's DevTools socket: each answered by its id, or failed when the socket closes. */
function cdpPage(socket: WebSocket, log: () => string) {
  let nextId = 1;
  const pending = new Map<number, Pending>();
  socket.addEventListener("message", (event) => {
    const message = JSON.parse(String(event.data)) as { id?: number; result?: unknown; error?: { message: string } };
    const p = message.id === undefined ? undefined : pending.get(message.id);
    if (!p) return; // an event: nothing here listens to them
    pending.delete(message.id!);
    if (message.error) p.reject(new HeadlessBrowserError(message.error.message));
    else p.resolve(message.result);
  });
  socket.addEventListener("close", () => {
    for (const p of pending.values()) p.reject(new HeadlessBrowserError("the DevTools socket closed"));
    pending.clear();
  });
  const send = (method: string, params: object = {}, ms = 10_000): Promise<any> => {
    const id = nextId++;
    const answer = new Promise((resolve, reject) => pending.set(id, { resolve, reject }));
    socket.send(JSON.stringify({ id, method, params }));
    return withTimeout(answer, ms, `${method} got no answer`).finally(() => pending.delete(id));
  };
  const evaluate = async <T>(expression: string): Promise<T> => {
    const r = await send("Runtime.evaluate", { expression, returnByValue: true, awaitPromise: true });
    if (r.exceptionDetails) throw new HeadlessBrowserError(`in the page: ${r.exceptionDetails.exception?.description ?? r.exceptionDetails.text}`);
    return r.result.value as T;
  };
  const waitFor = async (expression: string, ms: number): Promise<void> => {
    const end = performance.now() + ms;
    for (;;) {
      if (await evaluate<boolean>(`Boolean(${expression})`).catch(() => false)) return;
      if (performance.now() > end) throw new HeadlessBrowserError(`waited ${ms} ms for ${expression}`);
      await Bun.sleep(25);
    }
  };
  const typeAndEnter = async (selector: string, text: string): Promise<void> => {
    await evaluate(`document.querySelector(${JSON.stringify(selector)}).focus()`);
    await send("Input.insertText", { text });
    const enter = { key: "Enter", code: "Enter", windowsVirtualKeyCode: 13, nativeVirtualKeyCode: 13 };
    await send("Input.dispatchKeyEvent", { type: "keyDown", ...enter });
    await send("Input.dispatchKeyEvent", { type: "keyUp", ...enter });
  };
  return { send, waitFor, api: { evaluate, waitFor, typeAndEnter, log } satisfies Omit<HeadlessPage, typeof Symbol.asyncDispose> };
}

function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new HeadlessBrowserError(`${what} within ${ms} ms`)), ms)));
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}
