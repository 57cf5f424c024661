-- Affinity bindings belong to a tenant (issue 52 item 3). A binding pinned a key fleet-wide, so one
-- tenant's item bound the key to an agent that serves only that tenant, and another tenant's item of
-- the same key was held for that agent and then made a dead letter. The entity reference's columns
-- (id, affinity_key, agent_id and the common six) stay as they are; tenant_key is added after them,
-- as aiflow_engine_run and aiflow_concurrency_key name theirs, and the unique constraint that settles
-- racing first claims becomes (tenant_key, affinity_key), under the name it had.
ALTER TABLE {{table:affinity_binding}} ADD COLUMN tenant_key text;
ALTER TABLE {{table:affinity_binding}} DROP CONSTRAINT {{name:affinity_binding_key_uq}};

-- Existing bindings split into one per tenant that has a claim to the key's agent: a tenant whose
-- items of the key the agent was given (in flight ones among them, which must stay with it: no two
-- agents hold items of one key at once), or whose pending items of the key the agent serves. Other
-- tenants' items of the key are left unbound, so their next claim binds the key for them; a binding
-- no tenant keeps is dropped (its next item binds it anew). The first tenant keeps the row and its
-- id; the others' ids are the row's with characters 11-13 replaced by their number, as stamp_turns
-- makes its ids (0009).
CREATE TEMPORARY TABLE affinity_split ON COMMIT DROP AS
  SELECT b.id, t.tenant_key, row_number() OVER (PARTITION BY b.id ORDER BY t.tenant_key COLLATE "C") AS n
    FROM {{table:affinity_binding}} b
    JOIN LATERAL (
      SELECT DISTINCT w.tenant_key FROM {{table:work_item}} w
        LEFT JOIN {{table:agent}} a ON a.name = b.agent_id
       WHERE w.affinity_key = b.affinity_key
         AND (w.agent_id = b.agent_id OR (w.status = 'pending' AND a.metadata -> 'tenants' ? w.tenant_key))
    ) t ON true;

UPDATE {{table:affinity_binding}} b SET tenant_key = s.tenant_key FROM affinity_split s WHERE s.id = b.id AND s.n = 1;
INSERT INTO {{table:affinity_binding}} (id, tenant_key, affinity_key, agent_id, createdby, createdon, updatedby, updatedon)
SELECT overlay(b.id placing upper(lpad(to_hex(s.n), 3, '0')) from 11 for 3), s.tenant_key, b.affinity_key, b.agent_id, b.createdby, b.createdon, b.updatedby, b.updatedon
  FROM affinity_split s JOIN {{table:affinity_binding}} b ON b.id = s.id
 WHERE s.n > 1;
DELETE FROM {{table:affinity_binding}} WHERE tenant_key IS NULL;

ALTER TABLE {{table:affinity_binding}} ALTER COLUMN tenant_key SET NOT NULL;
ALTER TABLE {{table:affinity_binding}} ADD CONSTRAINT {{name:affinity_binding_key_uq}} UNIQUE (tenant_key, affinity_key);
