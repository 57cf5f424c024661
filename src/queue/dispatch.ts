/**
 * A dispatch: what a claim (or a waiting claim's direct hand-off) writes on every item it takes, made
 * once per claim so the claimed rows need not be read back to answer the agent.
 */
import { randomUUID } from "node:crypto";
import { msToNs } from "../clock.js";

/**
 * A Timestamp as an init shape. timestampFromMs() creates a message through protobuf-es's reflective
 * create(), and connect creates the whole reply from init shapes anyway, so that was a second
 * creation per timestamp.
 */
export type TimestampInit = { seconds: bigint; nanos: number };

export const timestampInit = (ms: number): TimestampInit => {
  const whole = Math.round(ms);
  return { seconds: BigInt(Math.floor(whole / 1000)), nanos: (((whole % 1000) + 1000) % 1000) * 1_000_000 };
};

/** What a claim set on every item it took, so the rows need not read it back. */
export interface Dispatch {
  agent: string;
  instance: string;
  leaseToken: string;
  dispatchedAtNs: bigint;
  leaseExpiresAtNs: bigint;
  /** The claim's time, as every claimed item's updated_on (made once per claim). */
  updatedOn: TimestampInit;
}

/** A new dispatch to `agent` at `nowMs`: a fresh lease token, and the lease running `leaseTtlMs` from now. */
export function newDispatch(agent: string, instance: string, nowMs: number, leaseTtlMs: number): Dispatch {
  return {
    agent,
    instance,
    leaseToken: randomUUID(),
    dispatchedAtNs: msToNs(nowMs),
    leaseExpiresAtNs: msToNs(nowMs + leaseTtlMs),
    updatedOn: timestampInit(nowMs),
  };
}
