-- Affinity: a work item may name a key (in worker_params.affinity_key, copied here so the claim can
-- filter and join on it by index). aiflow_affinity_binding pins a key to an agent name; its unique
-- key settles racing first claims, and its updatedon moves on every dispatch of the key, which is
-- what a rebind compares against (see the claim in store/work-items.ts).
ALTER TABLE {{table:work_item}} ADD COLUMN affinity_key text;

CREATE INDEX {{name:work_item_affinity_idx}} ON {{table:work_item}} (affinity_key, status) WHERE affinity_key IS NOT NULL;
CREATE INDEX {{name:affinity_binding_created_idx}} ON {{table:affinity_binding}} (createdon, id);
