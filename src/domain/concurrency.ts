/**
 * Concurrency keys: items of one tenant that share a key run at most N at a time, fleet-wide.
 *
 * The limit a dispatch of an item is held to is, first found:
 *   1. the operator's limit for the key (OpsService.SetConcurrencyLimit on the key);
 *   2. the operator's limit for the longest prefix of the key that has one;
 *   3. the item's own max_in_flight (1 when the item states none).
 * The claim counts the key's dispatched items and dispatches the item only while fewer than its
 * limit are in flight (../store/work-items/concurrency.ts says how that stays true across daemons).
 */
export const MAX_IN_FLIGHT = 100_000;
