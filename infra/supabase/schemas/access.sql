-- Who may read and write what, for every table and function of the schema in one place; last of
-- the definitions, so it covers them all (each table enables row-level security where it is
-- defined).
--
-- Row-level security on every table: `authenticated` (a web person's token, over PostgREST)
-- reads only its own rows, `anon` nothing; nobody but `service_role` writes, and it writes
-- through the functions, which only `service_role` may execute. Supabase grants every new
-- table, sequence and function in `public` to anon and authenticated by default privileges:
-- everything is therefore revoked explicitly first.

revoke all on all tables in schema public from anon, authenticated;
grant select, insert, update, delete on all tables in schema public to service_role;

-- What a person reads of their own. link_attempts (a wrong code belongs to nobody yet),
-- forget_requests and forgotten_deliveries (bookkeeping, not the person's words) have no
-- policy: `authenticated` reads none of them. merged_people: who was merged into the person.
grant select on table public.conversations, public.messages, public.identities, public.link_codes,
    public.merged_people, public.memory_notes, public.turn_usage, public.voice_usage, public.follow_ups,
    public.person_timezones, public.person_languages to authenticated;
create policy conversations_owner_reads on public.conversations for select to authenticated using (user_id = (select auth.uid()));
create policy messages_owner_reads on public.messages for select to authenticated using (user_id = (select auth.uid()));
create policy identities_owner_reads on public.identities for select to authenticated using (user_id = (select auth.uid()));
create policy link_codes_owner_reads on public.link_codes for select to authenticated using (user_id = (select auth.uid()));
create policy merged_people_owner_reads on public.merged_people for select to authenticated using (into_user_id = (select auth.uid()));
create policy memory_notes_owner_reads on public.memory_notes for select to authenticated using (user_id = (select auth.uid()));
create policy turn_usage_owner_reads on public.turn_usage for select to authenticated using (user_id = (select auth.uid()));
create policy voice_usage_owner_reads on public.voice_usage for select to authenticated using (user_id = (select auth.uid()));
create policy follow_ups_owner_reads on public.follow_ups for select to authenticated using (user_id = (select auth.uid()));
create policy person_timezones_owner_reads on public.person_timezones for select to authenticated using (user_id = (select auth.uid()));
create policy person_languages_owner_reads on public.person_languages for select to authenticated using (user_id = (select auth.uid()));

-- With them, `authenticated` could call setval() on messages' identity sequence and make every
-- later insert fail on the primary key. The functions draw messages' ids ahead of their insert
-- (turn.sql's nextval): service_role uses the sequences by this grant, not by Supabase's default
-- privileges, which a project made without "Default privileges for new entities" (the Data API's
-- setting, off for every project made since 30 May 2026) does not have.
revoke all on all sequences in schema public from public, anon, authenticated;
grant usage on all sequences in schema public to service_role;

revoke all on all functions in schema public from public, anon, authenticated;
grant execute on all functions in schema public to service_role;

-- begin_turn's parts (turn.sql): service_role's alone, and out of PostgREST's reach.
revoke all on schema crossmem_private from public, anon, authenticated;
grant usage on schema crossmem_private to service_role;
-- Its one table (links.sql's link_confirmation_key): read by the functions, as service_role.
revoke all on all tables in schema crossmem_private from public, anon, authenticated;
grant select on all tables in schema crossmem_private to service_role;
revoke all on all functions in schema crossmem_private from public, anon, authenticated;
grant execute on all functions in schema crossmem_private to service_role;

-- What a later migration makes (docs/deploy.md, Migrations) is born as the above leaves the rest:
-- service_role's alone, whatever the project's defaults. These are the default privileges of the
-- role that runs the migrations, for what it makes. Supabase's gave anon and authenticated every
-- privilege (a new view was every person's messages to the anon key over PostgREST) or, on a
-- project made since 30 May 2026, service_role none (a new table out of the functions' reach);
-- Postgres's let PUBLIC execute every new function, which only a default of no schema takes back
-- (the extensions' functions stay everyone's, as Supabase has them).
alter default privileges revoke execute on functions from public;
alter default privileges in schema extensions grant execute on functions to public;
alter default privileges in schema public revoke all on tables from anon, authenticated, service_role;
alter default privileges in schema public grant select, insert, update, delete on tables to service_role;
alter default privileges in schema public revoke all on sequences from anon, authenticated, service_role;
alter default privileges in schema public grant usage on sequences to service_role;
alter default privileges in schema public revoke all on functions from anon, authenticated, service_role;
alter default privileges in schema public grant execute on functions to service_role;
alter default privileges in schema crossmem_private grant select on tables to service_role;
alter default privileges in schema crossmem_private grant execute on functions to service_role;
