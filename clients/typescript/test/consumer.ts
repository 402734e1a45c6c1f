// Compiled, never run: the package's .d.ts as a TypeScript user sees them
// (`npm run typecheck`). Each @ts-expect-error must stay an error.
import {
  Waitd,
  WaitdError,
  verifyWebhook,
  type CallbackWait,
  type CreateWait,
  type Status,
  type Wait,
  type WaitEvent,
  type WebhookMessage,
} from "waitd";

export async function consumer(): Promise<void> {
  const waitd = new Waitd({ url: "http://127.0.0.1:8080", token: "t" });
  const spec: CreateWait = {
    target: { url: "https://api.example.com/servers/1" },
    state: "/data/attributes/status",
    want: ["on"],
    timeout: "10m",
  };
  const wait: Wait = await waitd.create(spec);
  const status: Status = (await waitd.wait(wait.id, { timeout: 60_000 })).status;
  if (status === "succeeded") return;

  // @ts-expect-error: a field the API does not have
  await waitd.create({ target: { url: "https://x" }, state: "/s", wnat: ["on"] });
  // @ts-expect-error: not a status
  await waitd.list({ status: "done" }).next();

  const cb: CallbackWait = await waitd.createCallback({ heartbeat: "5m" });
  const url: string = cb.callback_url;
  await waitd.completeCallback(url, { build: 42 });

  for await (const e of waitd.follow(wait.id)) {
    const event: WaitEvent = e;
    if (event.kind === "state") {
      const to: string | null | undefined = event.to;
      void to;
    }
  }
  for await (const w of waitd.list({ labels: { deploy: "1" } })) void w.id;
  await waitd.createGroup({ any: [spec, { id: wait.id }] });
  await waitd.createFromPreset("http.ok", { url: "https://x/healthz" });

  try {
    await waitd.get("id");
  } catch (e) {
    if (e instanceof WaitdError) {
      const n: number = e.status;
      const s: string = e.detail;
      void [n, s, e.problem?.errors];
    }
  }
  const msg: WebhookMessage = await verifyWebhook("whsec_x", new Headers(), "{}");
  const kind: `wait.${WaitEvent["kind"]}` = msg.type;
  void kind;
}
