/**
 * Input validation that needs the caller: the rest, which domain code uses too, is ../../domain/input.ts.
 */
import type { HandlerContext } from "@connectrpc/connect";
import { identifier } from "../../domain/input.js";
import { assertAgent, callerOf, type Identity } from "../caller.js";

/** An agent RPC's `name`: a valid identifier, and a name the caller's token may act as (PERMISSION_DENIED). */
export function agentName(raw: string, caller: HandlerContext | Identity): string {
  const name = identifier(raw, "name");
  assertAgent("roles" in caller ? caller : callerOf(caller), name);
  return name;
}
