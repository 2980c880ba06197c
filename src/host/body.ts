/** A request body read as JSON under a byte cap: a 413 past the cap (Content-Length or counted), a 400 for what does not parse. */
import { ApiError, invalidRequest } from "./errors.ts";

export async function readJsonBody(request: Request, maxBytes: number): Promise<unknown> {
  const tooLarge = () => new ApiError(413, "invalid_request_error", `the request body is over this server's limit of ${maxBytes} bytes (--max-body-bytes)`, null, "request_too_large");
  const declared = Number(request.headers.get("content-length") ?? NaN);
  if (Number.isFinite(declared) && declared > maxBytes) throw tooLarge();
  if (!request.body) throw invalidRequest("the request has no body; send a JSON object");
  const reader = request.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > maxBytes) {
      await reader.cancel().catch(() => {});
      throw tooLarge();
    }
    chunks.push(value);
  }
  const bytes = new Uint8Array(size);
  let at = 0;
  for (const c of chunks) {
    bytes.set(c, at);
    at += c.byteLength;
  }
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    throw invalidRequest("the request body is not valid UTF-8", null, "invalid_json");
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw invalidRequest(`We could not parse the JSON body of your request: ${(e as Error).message}`, null, "invalid_json");
  }
}
