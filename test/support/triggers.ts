/**
 * Triggers in tests: a TriggerService client with a runs token, and webhook deliveries over real
 * HTTP, signed as GitHub signs them.
 */
import { createHmac } from "node:crypto";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { TriggerService, type TriggerSchema } from "@aiflow/wire/gen/aiflow/trigger/v1/trigger_pb.js";
import { Connection } from "./kit.js";
import { TOKENS } from "./daemon.js";

export class TriggerClient {
  readonly conn: Connection;
  readonly triggers;

  constructor(address: string, token: string = TOKENS.runs) {
    this.conn = new Connection(address, { token });
    this.triggers = this.conn.client(TriggerService);
  }

  async put(tenant: string, trigger: MessageInitShape<typeof TriggerSchema>) {
    return (await this.triggers.putTrigger({ tenantKey: tenant, trigger })).trigger!;
  }

  close(): void {
    this.conn.close();
  }
}

export const sign = (secret: string, body: string | Buffer) => `sha256=${createHmac("sha256", secret).update(body).digest("hex")}`;

export interface Delivery {
  status: number;
  body: { outcome?: string; firing_id?: string; run_id?: string; error?: string };
}

/** POSTs `body` to /hooks/<tenant>/<name>, signed with `secret` unless `signature` is given (null: unsigned). */
export async function deliver(
  httpUrl: string,
  tenant: string,
  name: string,
  body: string,
  opts: { secret?: string; signature?: string | null; delivery?: string; date?: string; method?: string } = {},
): Promise<Delivery> {
  const headers: Record<string, string> = { "content-type": "application/json" };
  const signature = opts.signature === undefined ? (opts.secret ? sign(opts.secret, body) : null) : opts.signature;
  if (signature !== null) headers["x-hub-signature-256"] = signature;
  if (opts.delivery) headers["x-github-delivery"] = opts.delivery;
  if (opts.date) headers.date = opts.date;
  const method = opts.method ?? "POST";
  const res = await fetch(`${httpUrl}/hooks/${encodeURIComponent(tenant)}/${encodeURIComponent(name)}`, {
    method,
    headers,
    body: method === "GET" ? undefined : body,
  });
  const text = await res.text();
  return { status: res.status, body: text ? (JSON.parse(text) as Delivery["body"]) : {} };
}
