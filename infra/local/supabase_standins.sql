-- Plain-Postgres stand-ins for what a Supabase project provides before any migration:
-- the API roles, the `auth` schema with auth.uid(), and Supabase's default privileges
-- (every new table and function in `public` granted to anon and authenticated), so the
-- migrations are tested against the same defaults they must revoke.
--
-- Never part of infra/supabase/migrations: on Supabase all of this already exists.
-- Applied by the embedded database of `make dev` and by the tests. Idempotent.

do $$
begin
    if not exists (select from pg_roles where rolname = 'anon') then
        create role anon nologin noinherit;
    end if;
    if not exists (select from pg_roles where rolname = 'authenticated') then
        create role authenticated nologin noinherit;
    end if;
    if not exists (select from pg_roles where rolname = 'service_role') then
        create role service_role nologin noinherit bypassrls;
    end if;
end
$$;

-- Supabase's defaults are a new project's, set once, before the `auth` schema exists: set again
-- over a migrated database (each `make dev` applies these first), they would undo access.sql's.
do $$
begin
    if not exists (select from pg_namespace where nspname = 'auth') then
        alter default privileges in schema public grant all on tables to anon, authenticated, service_role;
        alter default privileges in schema public grant all on functions to anon, authenticated, service_role;
        alter default privileges in schema public grant all on sequences to anon, authenticated, service_role;
    end if;
end
$$;

create schema if not exists auth;
-- Where a Supabase project keeps its extensions (unaccent, btree_gin: messages.sql).
create schema if not exists extensions;
grant usage on schema extensions to anon, authenticated, service_role;
grant usage on schema auth to anon, authenticated, service_role;
grant usage on schema public to anon, authenticated, service_role;

create or replace function auth.uid() returns uuid
language sql stable
as $$
    select nullif(
        coalesce(
            current_setting('request.jwt.claim.sub', true),
            (nullif(current_setting('request.jwt.claims', true), '')::jsonb ->> 'sub')
        ),
        ''
    )::uuid
$$;
