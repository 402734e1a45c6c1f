// Names for the API's types. The shapes themselves are generated from
// openapi/openapi.json into ./generated/openapi.ts; these are only aliases, plus
// the few things the OpenAPI document does not describe.
import type { components } from "./generated/openapi.js";

type Schemas = components["schemas"];

/** A wait as `GET /waits/{id}` shows it. */
export type Wait = Schemas["Wait"];
/** A request to create a wait (a spec, a preset with params, or a callback wait). */
export type CreateWait = Schemas["CreateWait"];
/** A request to create a group: `all` or `any` of its members. */
export type CreateGroup = Schemas["CreateGroup"];
/** A member of a group to create: a whole wait request, or `{ id }` of an existing wait. */
export type CreateGroupMember = Schemas["CreateGroupMember"];
/** How a wait stands: `running`, or one of the five ends. */
export type Status = Schemas["Status"];
/** One entry of a wait's history (`kind` tells which). */
export type WaitEvent = Schemas["Event"];
/** The kind of an event: `created`, `state`, `retry` or one of the five ends. */
export type EventKind = WaitEvent["kind"];
/** A page of waits, newest first. */
export type WaitPage = Schemas["WaitPage"];
/** A page of a wait's events, oldest first. */
export type EventPage = Schemas["EventPage"];
/** An error answer (RFC 9457 problem+json); `detail` is the sentence. */
export type Problem = Schemas["Problem"];
/** A webhook to announce a wait's events. */
export type Notify = Schemas["Notify"];
/** A duration such as `30s`, `10m` or `1h30m`. */
export type Duration = Schemas["Duration"];
/** A preset's summary, as `GET /presets` lists it. */
export type PresetSummary = Schemas["PresetSummary"];

/** The create answer of a callback wait: the wait and, shown once, its callback URL. */
export type CallbackWait = Wait & { callback_url: string };

/**
 * The body of a webhook waitd sends: `type` is `wait.` and the event's kind, `data`
 * the wait as it stood when sent, `event` the event it announces (without its
 * global `id`).
 */
export interface WebhookMessage {
  type: `wait.${EventKind}`;
  timestamp: string;
  data: Wait;
  event: Omit<WaitEvent, "id">;
}

/** The statuses that end a wait. */
export const TERMINAL_STATUSES: readonly Status[] = [
  "succeeded",
  "failed",
  "timed_out",
  "canceled",
  "error",
];

/** True when `status` is an end (every status but `running`). */
export function isTerminal(status: Status | EventKind): boolean {
  return (TERMINAL_STATUSES as readonly string[]).includes(status);
}
