-- The six lib-cluster substrate tables of the entity reference.
-- {{table:X}} and {{name:X}} are expanded by the migrator with the configured schema and prefix,
-- so this text never names a prefix. Common columns (createdby … deletedon) are timestamptz;
-- engine-written hot-path times are bigint epoch nanoseconds.

CREATE TABLE {{table:agent}} (
  id            text PRIMARY KEY,
  name          text NOT NULL,
  http_address  text,
  grpc_address  text,
  infra_address text,
  agentversion  text,
  binarypath    text,
  agenttype     text,
  status        text,
  metrics       jsonb,
  metadata      jsonb,
  createdby     text NOT NULL,
  createdon     timestamptz NOT NULL,
  updatedby     text,
  updatedon     timestamptz,
  deletedby     text,
  deletedon     timestamptz,
  CONSTRAINT {{name:agent_name_key}} UNIQUE (name)
);

CREATE TABLE {{table:work_item}} (
  id                  text PRIMARY KEY,
  tenant_key          text NOT NULL,
  engine_id           text NOT NULL,
  engine_kind         text NOT NULL,
  parent_work_item_id text,
  run_id              text,
  task_id             text,
  task_name           text,
  worker_params       jsonb,
  payload             jsonb,
  status              text NOT NULL,
  priority            integer,
  agent_id            text,
  dispatched_at       bigint,
  completed_at        bigint,
  lease_expires_at    bigint,
  leased_by           text,
  next_attempt_at     bigint,
  retry_count         integer,
  max_retries         integer,
  error               text,
  createdby           text NOT NULL,
  createdon           timestamptz NOT NULL,
  updatedby           text,
  updatedon           timestamptz,
  deletedby           text,
  deletedon           timestamptz
);
CREATE INDEX {{name:work_item_status_priority_idx}} ON {{table:work_item}} (status, priority, createdon, id);
CREATE INDEX {{name:work_item_lease_idx}} ON {{table:work_item}} (lease_expires_at) WHERE status = 'dispatched';
CREATE INDEX {{name:work_item_run_idx}} ON {{table:work_item}} (run_id);
CREATE INDEX {{name:work_item_parent_idx}} ON {{table:work_item}} (parent_work_item_id);

CREATE TABLE {{table:affinity_binding}} (
  id           text PRIMARY KEY,
  affinity_key text NOT NULL,
  agent_id     text NOT NULL,
  createdby    text NOT NULL,
  createdon    timestamptz NOT NULL,
  updatedby    text,
  updatedon    timestamptz,
  deletedby    text,
  deletedon    timestamptz,
  CONSTRAINT {{name:affinity_binding_key_uq}} UNIQUE (affinity_key)
);
CREATE INDEX {{name:affinity_binding_agent_idx}} ON {{table:affinity_binding}} (agent_id);

CREATE TABLE {{table:engine}} (
  id        text PRIMARY KEY,
  tenantkey text NOT NULL,
  engineid  text NOT NULL,
  status    text,
  createdby text NOT NULL,
  createdon timestamptz NOT NULL,
  updatedby text,
  updatedon timestamptz,
  deletedby text,
  deletedon timestamptz,
  CONSTRAINT {{name:engine_tenant_engine_uq}} UNIQUE (tenantkey, engineid)
);

CREATE TABLE {{table:engine_run}} (
  id                text PRIMARY KEY,
  run_id            text NOT NULL,
  engine_kind       text NOT NULL,
  tenant_key        text NOT NULL,
  definition_id     text,
  parent_run_id     text,
  triggered_by      text,
  trigger_firing_id text,
  ended_on          bigint,
  createdby         text NOT NULL,
  createdon         timestamptz NOT NULL,
  updatedby         text,
  updatedon         timestamptz,
  deletedby         text,
  deletedon         timestamptz,
  CONSTRAINT {{name:engine_run_tenant_run_uq}} UNIQUE (tenant_key, run_id)
);
CREATE INDEX {{name:engine_run_tenant_created}} ON {{table:engine_run}} (tenant_key, createdon DESC, id DESC);

CREATE TABLE {{table:trigger_firing}} (
  id            text PRIMARY KEY,
  tenant_key    text NOT NULL,
  trigger_name  text NOT NULL,
  trigger_type  text,
  payload       text,
  action        text,
  definition_id text,
  event         text,
  run_id        text,
  outcome       text,
  error         text,
  fired_on      bigint,
  createdby     text NOT NULL,
  createdon     timestamptz NOT NULL,
  updatedby     text,
  updatedon     timestamptz,
  deletedby     text,
  deletedon     timestamptz
);
CREATE INDEX {{name:trigger_firing_tenant_fired}} ON {{table:trigger_firing}} (tenant_key, fired_on DESC, id DESC);
CREATE INDEX {{name:trigger_firing_tenant_trigger}} ON {{table:trigger_firing}} (tenant_key, trigger_name, fired_on DESC);
CREATE INDEX {{name:trigger_firing_run}} ON {{table:trigger_firing}} (tenant_key, run_id);
