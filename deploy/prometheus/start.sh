#!/bin/sh
# Prometheus for the compose stack's observability profile, with a configuration made here from
# what the stack gives it: it scrapes aiflowd's /metrics (AIFLOW_HTTP_LISTEN, port 9464) over TLS,
# trusting the stack's CA; presents the ops client certificate when the certs service left one it
# may read (a daemon under mutual TLS asks for one); and sends AIFLOW_METRICS_TOKEN as a bearer
# token when it is set, as the daemon then requires. The configuration and the token live in a
# tmpfs (RUN), never in the data volume, and are made again at every start.
set -eu
RUN=${PROMETHEUS_RUN_DIR:-/run/prometheus}
CERTS=/certs/prometheus
TARGET=${AIFLOW_METRICS_TARGET:-aiflowd:9464}
umask 077
config="$RUN/prometheus.yml"
{
  cat <<YAML
global:
  scrape_interval: 15s
  scrape_timeout: 10s
scrape_configs:
  - job_name: aiflowd
    scheme: https
    tls_config:
      ca_file: $CERTS/ca.crt
YAML
  if [ -r "$CERTS/ops.key" ]; then
    printf '      cert_file: %s\n      key_file: %s\n' "$CERTS/ops.crt" "$CERTS/ops.key"
  fi
  if [ -n "${AIFLOW_METRICS_TOKEN:-}" ]; then
    printf '%s' "$AIFLOW_METRICS_TOKEN" > "$RUN/metrics-token"
    printf '    authorization:\n      type: Bearer\n      credentials_file: %s\n' "$RUN/metrics-token"
  else
    rm -f "$RUN/metrics-token"
  fi
  cat <<YAML
    static_configs:
      - targets: ["$TARGET"]
YAML
} > "$config"
exec /bin/prometheus --config.file="$config" --storage.tsdb.path=/prometheus "$@"
