# aiflowd image: the compiled daemon (dist/, with the wire package bundled in) on plain node, its
# production dependencies, nothing of TypeScript. The build stage compiles; the final stage copies
# dist/ beside the production node_modules and runs as the unprivileged `node` user.
#
#   docker build -t aiflowd .
#   docker run --rm -p 7400:7400 -v "$PWD/certs:/certs:ro" -e DATABASE_URL=postgres://... -e 'AIFLOW_TOKENS=ops:...' \
#     -e AIFLOW_TLS_CERT=/certs/server.crt -e AIFLOW_TLS_KEY=/certs/server.key aiflowd
#
# It listens on 0.0.0.0:7400, so it refuses to start without tokens (AIFLOW_TOKENS, --token or
# AIFLOW_TOKENS_FILE) and without TLS (AIFLOW_TLS_CERT and AIFLOW_TLS_KEY, or
# AIFLOW_INSECURE_PLAINTEXT=true behind a TLS-terminating proxy). Without DATABASE_URL it starts an
# embedded Postgres under AIFLOW_DATA_DIR (mount a volume there to keep it). Other commands:
# `docker run aiflowd migrate`, `... --help`.
FROM node:20-bookworm-slim AS build
WORKDIR /app
# The workspace manifests first, so the install layer is rebuilt only when dependencies change.
COPY package.json package-lock.json tsconfig.json tsconfig.build.json ./
COPY wire/package.json wire/tsconfig.build.json wire/
COPY agent-sdk/package.json agent-sdk/
RUN npm ci --no-audit --no-fund
COPY scripts/build.mjs scripts/
COPY wire/src/ wire/src/
COPY src/ src/
COPY console/ console/
RUN node scripts/build.mjs daemon

FROM node:20-bookworm-slim AS deps
WORKDIR /app
ENV NODE_ENV=production
COPY package.json package-lock.json ./
COPY wire/package.json wire/
COPY agent-sdk/package.json agent-sdk/
RUN npm ci --omit=dev --no-audit --no-fund \
 && npm cache clean --force \
 && test ! -e node_modules/tsx \
 && test ! -e node_modules/typescript

FROM node:20-bookworm-slim
# A 32 MB young generation: with many small objects per call alive across an await, the default
# one is scavenged often enough to promote live objects to the old generation.
ENV NODE_ENV=production \
    NODE_OPTIONS=--max-semi-space-size=32 \
    AIFLOW_LISTEN=0.0.0.0:7400 \
    AIFLOW_DATA_DIR=/var/lib/aiflowd/pg
WORKDIR /app
# Code and dependencies stay root-owned (read-only to the daemon); only the data directory of the
# embedded Postgres is the node user's.
RUN mkdir -p /var/lib/aiflowd && chown node:node /var/lib/aiflowd
COPY --from=deps /app/node_modules ./node_modules
COPY package.json ./
COPY --from=build /app/dist/ dist/
COPY bin/ bin/
COPY scripts/healthcheck.mjs scripts/
USER node
EXPOSE 7400
# grpc.health.v1.Health/Check over node:http2 (no token needed); follows AIFLOW_LISTEN.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["node", "/app/scripts/healthcheck.mjs"]
# SIGTERM drains gracefully within AIFLOW_SHUTDOWN_GRACE (10s by default): give `docker stop` more (-t 30).
STOPSIGNAL SIGTERM
# A 256 MB old generation before V8's first full collection (not allowed in NODE_OPTIONS), so that
# full collections, whose pauses set the dispatch tail, are rare at a steady load.
ENTRYPOINT ["node", "--initial-old-space-size=256", "/app/bin/aiflowd.js"]
CMD ["serve"]
