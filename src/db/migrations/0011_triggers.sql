-- Triggers: what binds an inbound source (a webhook, a cron schedule) to an action on the DAG
-- engine, and the webhook deliveries already acted on. What each firing did is aiflow_trigger_firing
-- (0001), written in the transaction that started or moved its run.

CREATE TABLE {{table:trigger}} (
  id            text PRIMARY KEY,
  tenant_key    text NOT NULL,
  name          text NOT NULL,
  -- webhook or cron.
  trigger_type  text NOT NULL,
  -- start or signal.
  action        text NOT NULL,
  definition_id text,
  event         text,
  -- A signal's run: fixed, or a dotted path into the webhook's JSON body.
  run_id        text,
  run_id_path   text,
  schedule      text,
  time_zone     text,
  -- A webhook's HMAC key. Never read back through the API.
  secret        text,
  -- rpc or file: a file's triggers are replaced from the file at each start.
  source        text NOT NULL,
  -- Who put it last: the runs it starts are theirs, and a signal reaches only their runs.
  owner         text NOT NULL,
  -- Cron: the next tick not yet fired (epoch ns). The daemon that fires a tick moves it on in the
  -- transaction that records the firing, under the row's lock: one firing per tick.
  next_fire_ns  bigint,
  createdby     text NOT NULL,
  createdon     timestamptz NOT NULL,
  updatedby     text,
  updatedon     timestamptz,
  deletedby     text,
  deletedon     timestamptz,
  CONSTRAINT {{name:trigger_tenant_name_uq}} UNIQUE (tenant_key, name)
);
CREATE INDEX {{name:trigger_cron_due}} ON {{table:trigger}} (next_fire_ns) WHERE next_fire_ns IS NOT NULL;

-- A webhook delivery id (X-GitHub-Delivery, X-Delivery-Id) that started or moved a run: inserted in
-- that run's transaction, so a replay of the same id acts at most once. Refused deliveries leave no
-- row here, so a sender may redeliver one after fixing what was wrong.
CREATE TABLE {{table:trigger_delivery}} (
  tenant_key   text NOT NULL,
  trigger_name text NOT NULL,
  delivery_id  text NOT NULL,
  firing_id    text NOT NULL,
  createdon    timestamptz NOT NULL,
  PRIMARY KEY (tenant_key, trigger_name, delivery_id)
);
CREATE INDEX {{name:trigger_delivery_created}} ON {{table:trigger_delivery}} (createdon);
