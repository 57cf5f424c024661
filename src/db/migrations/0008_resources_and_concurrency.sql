-- Dispatch that fits the work to the agent (see src/store/work-items/placement.ts and concurrency.ts).
--
-- What an item needs (worker_params.requirements) and the key it shares a limit with
-- (worker_params.concurrencyKey) live in worker_params, as its selector does. Two columns more:
--   gpu_indices      the GPUs (by the agent's index) the current or last dispatch placed the item on.
--                    While the item is dispatched, those GPUs' memory is reserved for it: a
--                    reservation is nothing but a dispatched row, so every path that ends a dispatch
--                    (complete, fail, release, expiry, an agent gone, a drain deadline, cancel)
--                    releases it by changing the status, with no bookkeeping to forget.
--   concurrency_key  worker_params.concurrencyKey, copied (as affinity_key is) so the claim counts a
--                    key's dispatched items by index.
ALTER TABLE {{table:work_item}}
  ADD COLUMN gpu_indices integer[],
  ADD COLUMN concurrency_key text;

-- A key's items by status (the claim's count of one key's in flight, the ops listing's pending), and
-- every key's items in flight at once (the claim's set of full keys), without reading finished ones.
CREATE INDEX {{name:work_item_concurrency_idx}} ON {{table:work_item}} (tenant_key, concurrency_key, status) WHERE concurrency_key IS NOT NULL;
CREATE INDEX {{name:work_item_concurrency_dispatched_idx}} ON {{table:work_item}} (tenant_key, concurrency_key) WHERE concurrency_key IS NOT NULL AND status = 'dispatched';

-- One row per concurrency key a claim has dispatched (prefix = false), and the limits operators set
-- per key or per key prefix (prefix = true: every key that starts with `key`).
--   max_in_flight  an operator's limit, over the items' own; NULL on a key row: the items' own.
-- A claim that dispatches a key's items writes the key's row (creating it on the key's first
-- dispatch) with a compare-and-set on its version, as a claim writes an affinity binding: two claims
-- that counted the key's in-flight items in the same state cannot both commit dispatches of it.
CREATE TABLE {{table:concurrency_key}} (
  id            text PRIMARY KEY,
  tenant_key    text NOT NULL,
  key           text NOT NULL,
  prefix        boolean NOT NULL DEFAULT false,
  max_in_flight integer,
  createdby     text NOT NULL,
  createdon     timestamptz NOT NULL,
  updatedby     text,
  updatedon     timestamptz,
  deletedby     text,
  deletedon     timestamptz,
  CONSTRAINT {{name:concurrency_key_uq}} UNIQUE (tenant_key, key, prefix)
);
