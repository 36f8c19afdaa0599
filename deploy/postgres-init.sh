#!/bin/sh
# Runs once, on the first start of the postgres container (/docker-entrypoint-initdb.d/): an owner role
# for migrations and an app role with data rights only (docs/deploy.md#postgresql-roles).
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -v owner_pw="$GRUE_OWNER_PASSWORD" -v app_pw="$GRUE_APP_PASSWORD" <<'SQL'
CREATE ROLE grue_owner LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'owner_pw';
CREATE ROLE grue_app LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'app_pw';
ALTER DATABASE grue OWNER TO grue_owner;
ALTER SCHEMA public OWNER TO grue_owner;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
REVOKE ALL ON DATABASE grue FROM PUBLIC;
GRANT CONNECT, TEMPORARY ON DATABASE grue TO grue_app;
GRANT USAGE ON SCHEMA public TO grue_app;
ALTER DEFAULT PRIVILEGES FOR ROLE grue_owner IN SCHEMA public
  GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO grue_app;
ALTER DEFAULT PRIVILEGES FOR ROLE grue_owner IN SCHEMA public
  GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO grue_app;
SQL
