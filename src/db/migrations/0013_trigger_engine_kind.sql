-- A start trigger runs a stored definition of one engine: dag (null, as every trigger before this),
-- graph or statemachine.
ALTER TABLE {{table:trigger}} ADD COLUMN engine_kind text;
