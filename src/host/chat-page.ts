/** The chat page (GET /): one static HTML file with its script inline, read once. */
import { readFileSync } from "node:fs";

let html: string | undefined;

export function chatPageHtml(): string {
  html ??= readFileSync(new URL("./chat-page.html", import.meta.url), "utf8");
  return html;
}
