#!/usr/bin/env bash
# First start with an empty $PGDATA: initdb with POSTGRES_USER and its
# password (scram-sha-256 for every network connection), create POSTGRES_DB,
# run /docker-entrypoint-initdb.d/*.sh and *.sql. Then exec the server. The same variables as the official postgres image.
set -euo pipefail
: "${PGDATA:=/var/lib/postgresql/data}"
user="${POSTGRES_USER:-postgres}"
db="${POSTGRES_DB:-$user}"
if [[ -n "${POSTGRES_PASSWORD_FILE:-}" ]]; then
    password="$(cat "$POSTGRES_PASSWORD_FILE")"
else
    password="${POSTGRES_PASSWORD:-}"
fi
if [[ "${1:-}" == postgres && ! -s "$PGDATA/PG_VERSION" ]]; then
    if [[ -z "$password" ]]; then
        echo "postgres-entrypoint: set POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE" >&2
        exit 1
    fi
    pwfile="$(mktemp)"
    trap 'rm -f "$pwfile"' EXIT
    printf '%s\n' "$password" > "$pwfile"
    initdb --username="$user" --pwfile="$pwfile" --auth-local=scram-sha-256 \
        --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 -D "$PGDATA" >/dev/null
    rm -f "$pwfile"
    {
        echo "listen_addresses = '*'"
        echo "unix_socket_directories = '/var/run/postgresql'"
    } >> "$PGDATA/postgresql.conf"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    if [[ "$db" != postgres ]]; then
        PGPASSWORD="$password" psql -v ON_ERROR_STOP=1 -q -U "$user" -d postgres \
            -c "CREATE DATABASE \"$db\"" >/dev/null
    fi
    # Like the official image: *.sh in /docker-entrypoint-initdb.d run once,
    # in name order, with POSTGRES_USER, POSTGRES_DB and PGPASSWORD set
    # (executable ones are run, others sourced); *.sql are fed to psql.
    export POSTGRES_USER="$user" POSTGRES_DB="$db"
    for f in /docker-entrypoint-initdb.d/*; do
        [[ -e "$f" ]] || continue
        case "$f" in
        *.sh)
            echo "postgres-entrypoint: running $f" >&2
            if [[ -x "$f" ]]; then PGPASSWORD="$password" "$f"; else PGPASSWORD="$password" . "$f"; fi ;;
        *.sql)
            echo "postgres-entrypoint: running $f" >&2
            PGPASSWORD="$password" psql -v ON_ERROR_STOP=1 -q -U "$user" -d "$db" -f "$f" ;;
        *)  echo "postgres-entrypoint: ignoring $f" >&2 ;;
        esac
    done
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    echo "postgres-entrypoint: initialised $PGDATA (user $user, database $db)" >&2
fi
exec "$@"
