-- A state machine's history and a graph run's path keep their latest --run-history-max entries
-- (src/engines/run-history.ts): a save rewrites the whole row, so a list that grew with every step
-- made every step dearer. These count the entries dropped from the front, so a run still says how
-- far it went and where its kept entries begin. Additive: the engine's own columns, after the
-- entity reference's.
ALTER TABLE {{table:graph_run}} ADD COLUMN path_dropped bigint NOT NULL DEFAULT 0;
ALTER TABLE {{table:machine_run}} ADD COLUMN history_dropped bigint NOT NULL DEFAULT 0;
