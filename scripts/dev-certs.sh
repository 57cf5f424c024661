#!/bin/sh
# Makes a small PKI for aiflowd with openssl: a CA, the daemon's certificate, and client
# certificates for mutual TLS. For development, the demo and the compose stack; in production use
# your own CA (or SPIRE), with the same SAN conventions (docs/security.md: "Certificates that name the caller").
#
#   scripts/dev-certs.sh DIR [HOST ...]
#
# DIR gets ca.crt/ca.key, server.crt/server.key (SANs: localhost, 127.0.0.1, ::1, aiflowd, and each
# HOST given), and client certificates whose URI SAN names the caller (spiffe://aiflow/ROLE/NAME):
#   agent.crt/.key   spiffe://aiflow/agent/*      (may act as any agent name)
#   engine.crt/.key  spiffe://aiflow/engine/producer
#   ops.crt/.key     spiffe://aiflow/ops/operator
#   runs.crt/.key    spiffe://aiflow/runs/orchestrator   (DagService: starts and resumes DAG runs)
# Existing files are left alone (run it again after deleting DIR to start over). Keys are P-256,
# readable by their owner only. Certificates are valid for $AIFLOW_CERT_DAYS days (default 365).
set -eu
dir=${1:?usage: scripts/dev-certs.sh DIR [HOST ...]}
shift
days=${AIFLOW_CERT_DAYS:-365}
domain=${AIFLOW_TLS_TRUST_DOMAIN:-aiflow}
mkdir -p "$dir"
umask 077
cd "$dir"

if [ -e ca.crt ]; then
  echo "dev-certs: $dir already holds a CA; leaving it" >&2
  exit 0
fi

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

key ca.key
openssl req -x509 -new -key ca.key -out ca.crt -days "$days" -subj "/CN=aiflowd development CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"

# leaf NAME USAGE SAN
leaf() {
  key "$1.key"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$1"
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=%s\nsubjectAltName=%s\n' "$2" "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days "$days" -extfile "$1.ext" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

sans="DNS:localhost,IP:127.0.0.1,IP:::1,DNS:aiflowd"
for h in "$@"; do
  case $h in
    *[!0-9.]*) case $h in *:*) sans="$sans,IP:$h" ;; *) sans="$sans,DNS:$h" ;; esac ;;
    *) sans="$sans,IP:$h" ;;
  esac
done
leaf server serverAuth "$sans"
leaf agent clientAuth "URI:spiffe://$domain/agent/*"
leaf engine clientAuth "URI:spiffe://$domain/engine/producer"
leaf ops clientAuth "URI:spiffe://$domain/ops/operator"
leaf runs clientAuth "URI:spiffe://$domain/runs/orchestrator"
rm -f ca.srl
# Certificates are public; the keys stay owner-only. The daemon in a container reads them as
# another user, so the compose stack hands them over with its own ownership (docker-compose.yml).
chmod 644 ./*.crt
echo "dev-certs: made a CA, server.crt and client certificates in $dir" >&2
