#!/usr/bin/env bash
# fedmask container entrypoint: `fedmask-entrypoint ROLE [ARGS...]`.
#
#   coordinator  exec `fedmask coordinator ARGS` (settings from FEDMASK_*;
#                waits for its certificate files first; the database
#                password is read from FEDMASK_DATABASE_PASSWORD_FILE into
#                PGPASSWORD when that is set)
#   client       fetch the dataset into the data volume if it is not there
#                (ml-100k: its licence forbids baking it into an image), wait
#                for the certificates, work out this client's user slice and
#                exec `fedmask client`
#   admin        exec `fedmask admin ARGS` (settings from FEDMASK_ADMIN_*;
#                waits for the files it names first: the coordinator's CA
#                FEDMASK_ADMIN_COORDINATOR__TLS_CA, the API token entries
#                FEDMASK_ADMIN_CONFIG, and the two secrets below)
#   certs        one-shot: `fedmask certs init` into the certificates volume
#   anything else: exec `fedmask ARGS` (e.g. `data fetch ml-100k`, `devices list`)
#
# Client settings (environment):
#   FEDMASK_COORDINATOR       coordinator HOST:PORT (required)
#   FEDMASK_USERS             explicit users (e.g. 1-100); else a slice:
#   FEDMASK_USERS_PER_CLIENT  users per client (default 10) and
#   FEDMASK_CLIENT_INDEX      0-based client number; when unset, the number
#                             after the last '-' of the host name (a
#                             Kubernetes StatefulSet's pod ordinal)
#                             client i hosts users i*K+1 .. (i+1)*K
#   FEDMASK_DATASET           dataset name (default ml-100k)
#   FEDMASK_CERTS_DIR         certificates folder (default /var/lib/fedmask/certs)
#   FEDMASK_TLS_CA / _CERT / _KEY  override the files; by default the CA is
#                             CERTS/ca.pem and the client certificate
#                             CERTS/devices/device-NNNN.pem with NNNN = index+1
#   FEDMASK_TLS_SERVER_NAME   expected name in the coordinator's certificate
#   FEDMASK_WAIT_S            how long to wait for certificates (default 600)
#   FEDMASK_CLIENT_ARGS       extra flags for `fedmask client` (word-split)
# Admin service secrets (files, so no secret is ever in an environment
# listing of the compose file or a manifest):
#   FEDMASK_DATABASE_PASSWORD_FILE     read into PGPASSWORD (as for the coordinator)
#   FEDMASK_COORDINATOR_TOKEN_FILE     the admin service's credential on the
#                                      coordinator's admin listener (its first
#                                      non-blank, non-# line), read into
#                                      FEDMASK_ADMIN_COORDINATOR__TOKEN
# Certificates step: FEDMASK_CERT_DEVICES (default 2), FEDMASK_COORDINATOR_HOST
# (default coordinator).
set -euo pipefail

CERTS="${FEDMASK_CERTS_DIR:-/var/lib/fedmask/certs}"
STATE="${FEDMASK_STATE_DIR:-/var/lib/fedmask/state}"
WAIT_S="${FEDMASK_WAIT_S:-600}"

log() { echo "fedmask-entrypoint: $*" >&2; }

# wait_for FILE...: until every file exists, with backoff (1 s doubling to 15 s).
wait_for() {
    local start=$SECONDS delay=1 f missing
    while :; do
        missing=""
        for f in "$@"; do [[ -e "$f" ]] || missing="$missing $f"; done
        [[ -z "$missing" ]] && return 0
        if (( SECONDS - start >= WAIT_S )); then
            log "gave up after ${WAIT_S}s waiting for:$missing"
            exit 1
        fi
        log "waiting ${delay}s for:$missing"
        sleep "$delay"
        delay=$(( delay * 2 > 15 ? 15 : delay * 2 ))
    done
}

role="${1:-}"
[[ $# -gt 0 ]] && shift
case "$role" in
coordinator)
    # Only the files the settings name are waited for (TLS may be off).
    files=()
    for var in FEDMASK_TLS__CERT FEDMASK_TLS__KEY FEDMASK_TLS__CLIENT_CA; do
        [[ -n "${!var:-}" ]] && files+=("${!var}")
    done
    [[ ${#files[@]} -gt 0 ]] && wait_for "${files[@]}"
    # The database password from a mounted secret: libpq reads PGPASSWORD
    # when FEDMASK_DATABASE_URL carries none, so it never shows in the URL.
    if [[ -n "${FEDMASK_DATABASE_PASSWORD_FILE:-}" ]]; then
        wait_for "$FEDMASK_DATABASE_PASSWORD_FILE"
        PGPASSWORD="$(cat "$FEDMASK_DATABASE_PASSWORD_FILE")"
        export PGPASSWORD
    fi
    [[ -n "${FEDMASK_ADMIN__TOKEN_FILE:-}" ]] && wait_for "$FEDMASK_ADMIN__TOKEN_FILE"
    exec fedmask coordinator "$@"
    ;;
admin)
    files=()
    for var in FEDMASK_ADMIN_COORDINATOR__TLS_CA FEDMASK_ADMIN_CONFIG FEDMASK_DATABASE_PASSWORD_FILE \
               FEDMASK_COORDINATOR_TOKEN_FILE; do
        [[ -n "${!var:-}" ]] && files+=("${!var}")
    done
    [[ ${#files[@]} -gt 0 ]] && wait_for "${files[@]}"
    if [[ -n "${FEDMASK_DATABASE_PASSWORD_FILE:-}" ]]; then
        PGPASSWORD="$(cat "$FEDMASK_DATABASE_PASSWORD_FILE")"
        export PGPASSWORD
    fi
    if [[ -n "${FEDMASK_COORDINATOR_TOKEN_FILE:-}" ]]; then
        token="$({ grep -v -e '^[[:space:]]*$' -e '^[[:space:]]*#' "$FEDMASK_COORDINATOR_TOKEN_FILE" || true; } | head -n 1 | tr -d '[:space:]')"
        if [[ -z "$token" ]]; then
            log "$FEDMASK_COORDINATOR_TOKEN_FILE holds no token"
            exit 2
        fi
        FEDMASK_ADMIN_COORDINATOR__TOKEN="$token"
        export FEDMASK_ADMIN_COORDINATOR__TOKEN
        unset token
    fi
    # Neither the dependencies' absence nor their later loss ends the process:
    # /readyz says which one is down and the routes answer 503 until it is back.
    exec fedmask admin "$@"
    ;;
client)
    : "${FEDMASK_COORDINATOR:?set FEDMASK_COORDINATOR to the coordinator HOST:PORT}"
    dataset="${FEDMASK_DATASET:-ml-100k}"
    if [[ -z "${FEDMASK_CLIENT_INDEX:-}" ]]; then
        host="$(hostname)"
        FEDMASK_CLIENT_INDEX="${host##*-}"
    fi
    if ! [[ "$FEDMASK_CLIENT_INDEX" =~ ^[0-9]+$ ]]; then
        log "cannot tell this client's index: set FEDMASK_CLIENT_INDEX (got '${FEDMASK_CLIENT_INDEX}')"
        exit 2
    fi
    index=$(( 10#$FEDMASK_CLIENT_INDEX ))
    if [[ -n "${FEDMASK_USERS:-}" ]]; then
        users="$FEDMASK_USERS"
    else
        per="${FEDMASK_USERS_PER_CLIENT:-10}"
        users="$(( index * per + 1 ))-$(( (index + 1) * per ))"
    fi
    device="$(printf 'device-%04d' $(( index + 1 )))"
    ca="${FEDMASK_TLS_CA:-$CERTS/ca.pem}"
    cert="${FEDMASK_TLS_CERT:-$CERTS/devices/$device.pem}"
    key="${FEDMASK_TLS_KEY:-$CERTS/devices/$device.key}"
    if [[ "$dataset" != synthetic && ! -e "$dataset" ]]; then
        # Idempotent: a present, hash-valid copy is kept. The lock keeps two
        # clients sharing the data volume from fetching at the same time.
        mkdir -p "$FEDMASK_DATA_DIR"
        delay=5
        until flock "$FEDMASK_DATA_DIR/.fetch.lock" fedmask data fetch "$dataset" --data-dir "$FEDMASK_DATA_DIR"; do
            log "fetching $dataset failed; retrying in ${delay}s"
            sleep "$delay"
            delay=$(( delay * 2 > 120 ? 120 : delay * 2 ))
        done
    fi
    wait_for "$ca" "$cert" "$key"
    extra=()
    [[ -n "${FEDMASK_TLS_SERVER_NAME:-}" ]] && extra+=(--tls-server-name "$FEDMASK_TLS_SERVER_NAME")
    log "client $index: users $users, certificate $cert"
    # shellcheck disable=SC2086  # FEDMASK_CLIENT_ARGS is word-split on purpose
    exec fedmask client --coordinator "$FEDMASK_COORDINATOR" --users "$users" --state-dir "$STATE" \
        --dataset "$dataset" --data-dir "$FEDMASK_DATA_DIR" --name "${FEDMASK_CLIENT_NAME:-client-$index}" \
        --tls-ca "$ca" --tls-cert "$cert" --tls-key "$key" "${extra[@]}" ${FEDMASK_CLIENT_ARGS:-} "$@"
    ;;
certs)
    exec fedmask certs init "$CERTS" --devices "${FEDMASK_CERT_DEVICES:-2}" \
        --coordinator-host "${FEDMASK_COORDINATOR_HOST:-coordinator}" "$@"
    ;;
"")
    exec fedmask --help
    ;;
*)
    exec fedmask "$role" "$@"
    ;;
esac
