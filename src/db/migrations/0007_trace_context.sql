-- The trace an item belongs to: the W3C traceparent of the span that enqueued it (the daemon's
-- Enqueue span, or the producer's own when the daemon does not trace), written once by the insert
-- and handed with every claim, so that each attempt's handler span joins the producer's trace.
-- Nullable and without a default: adding it rewrites no row, and an item enqueued untraced has none.
ALTER TABLE {{table:work_item}} ADD COLUMN trace_context text;
