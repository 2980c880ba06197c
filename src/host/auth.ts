/** The Bearer key check, in constant time: both sides are hashed first, so neither length nor content leaks through timing. */
import { createHash, timingSafeEqual } from "node:crypto";
import { ApiError } from "./errors.ts";

const digest = (text: string) => createHash("sha256").update(text, "utf8").digest();

export function bearerCheck(apiKey: string): (authorization: string | undefined) => void {
  const expected = digest(apiKey);
  return (authorization) => {
    const match = /^Bearer[ \t]+(.+)$/i.exec(authorization?.trim() ?? "");
    const given = digest(match?.[1]?.trim() ?? "");
    // compare even when no key was given, so a missing header costs the same as a wrong one
    const ok = timingSafeEqual(given, expected) && match !== null;
    if (!ok) {
      throw new ApiError(401, "authentication_error", match ? "Incorrect API key provided" : "Missing API key: send Authorization: Bearer KEY", null, "invalid_api_key");
    }
  };
}
