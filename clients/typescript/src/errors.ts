import type { Problem, Wait } from "./types.js";

/**
 * What went wrong talking to waitd. `detail` is waitd's own sentence (a
 * problem's `detail`) when waitd answered, or one of this client's when it did
 * not; `message` is the same, followed by the fields of a validation problem.
 * Neither holds the API token, a webhook secret or a callback URL.
 */
export class WaitdError extends Error {
  override name = "WaitdError";
  /** The HTTP status of waitd's answer; 0 when there was none (unreachable, timed out). */
  readonly status: number;
  /** The sentence: the problem's `detail`, or why there was no answer. */
  readonly detail: string;
  /** The problem waitd answered with, when it did (`type`, `title`, `errors`…). */
  readonly problem: Problem | undefined;
  /** The wait, when the answer carried one (a callback to a wait that had already ended). */
  readonly wait: Wait | undefined;
  /** Seconds waitd asked the client to wait before repeating (`Retry-After`). */
  readonly retryAfter: number | undefined;

  constructor(
    status: number,
    detail: string,
    init: { problem?: Problem; wait?: Wait; retryAfter?: number } = {},
    fields?: string,
  ) {
    super(fields ? `${detail} (${fields})` : detail);
    this.status = status;
    this.detail = detail;
    this.problem = init.problem;
    this.wait = init.wait;
    this.retryAfter = init.retryAfter;
  }
}

/** A webhook whose signature or timestamp does not verify. */
export class WebhookVerificationError extends Error {
  override name = "WebhookVerificationError";
}
