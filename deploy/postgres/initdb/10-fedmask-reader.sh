#!/usr/bin/env bash
# Run once, on an empty database, by the PostgreSQL image's entrypoint (the
# official image and deploy/postgres/ both run /docker-entrypoint-initdb.d/*.sh
# with POSTGRES_USER, POSTGRES_DB and PGPASSWORD set): creates fedmask_reader,
# the admin service's role, which may read every table the coordinator
# (POSTGRES_USER, the schema's owner) creates but round_group_sums (the groups'
# unmasked sums while their round runs) and tier_secret (the replicas' shared
# secret), and write none. Its password
# comes from the file FEDMASK_READER_PASSWORD_FILE; without it, nothing is done.
# An external database (Kubernetes production overlay) runs the same SQL by
# hand: deploy/README.md, "Kubernetes".
set -euo pipefail
if [[ -z "${FEDMASK_READER_PASSWORD_FILE:-}" ]]; then
    echo "10-fedmask-reader: FEDMASK_READER_PASSWORD_FILE unset; no read-only role created" >&2
    return 0 2>/dev/null || exit 0
fi
reader_password="$(cat "$FEDMASK_READER_PASSWORD_FILE")"
owner="${POSTGRES_USER:-postgres}"
db="${POSTGRES_DB:-$owner}"
psql -v ON_ERROR_STOP=1 -q --no-psqlrc -U "$owner" -d "$db" \
    -v reader_password="$reader_password" -v owner="$owner" -v db="$db" <<'SQL'
CREATE ROLE fedmask_reader LOGIN PASSWORD :'reader_password';
ALTER ROLE fedmask_reader SET default_transaction_read_only = on;
GRANT CONNECT ON DATABASE :"db" TO fedmask_reader;
GRANT USAGE ON SCHEMA public TO fedmask_reader;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO fedmask_reader;
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA public GRANT SELECT ON TABLES TO fedmask_reader;
-- except the groups' unmasked sums of running rounds and the replicas' shared
-- secret (migrations 0008 and 0009 revoke them too when they create the
-- tables after this script)
DO $$
BEGIN
    IF to_regclass('public.round_group_sums') IS NOT NULL THEN
        REVOKE ALL ON TABLE public.round_group_sums FROM fedmask_reader;
    END IF;
    IF to_regclass('public.tier_secret') IS NOT NULL THEN
        REVOKE ALL ON TABLE public.tier_secret FROM fedmask_reader;
    END IF;
END
$$;
SQL
unset reader_password
echo "10-fedmask-reader: created the SELECT-only role fedmask_reader in $db" >&2
