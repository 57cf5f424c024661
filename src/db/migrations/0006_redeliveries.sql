-- A lost lease (the agent died, was cut off, or went inactive) is the fleet failing, not the work:
-- it is counted apart from retry_count, against a budget of its own, so that a crash redelivers the
-- work without spending the retries that max_retries gives its own failures, while an item that
-- kills every agent it reaches still ends as a dead letter once its redeliveries are spent.
ALTER TABLE {{table:work_item}}
  ADD COLUMN redelivery_count integer NOT NULL DEFAULT 0,
  ADD COLUMN max_redeliveries integer NOT NULL DEFAULT 3;
