-- A database made from the old twelve migrations (docs/deploy.md, "A database made from the old
-- twelve migrations"), after surfaces.sql was run whole: its surface columns take the domains of
-- surfaces.sql, and their old checks go. The tables are checked, not rewritten. Run once:
--     psql "$DB_URL" -f infra/supabase/upgrades/surface_domains.sql
-- Not a migration: a new database's baseline already has the domains.
alter table public.conversations drop constraint conversations_surface_check, alter column surface type public.surface;
alter table public.messages drop constraint messages_surface_check, alter column surface type public.surface;
alter table public.follow_ups drop constraint follow_ups_surface_check, alter column surface type public.surface;
alter table public.forgotten_deliveries drop constraint forgotten_deliveries_surface_check,
    alter column surface type public.surface;
alter table public.identities drop constraint identities_surface_check, alter column surface type public.chat_surface;
alter table public.link_codes drop constraint link_codes_used_by_surface_check,
    alter column used_by_surface type public.chat_surface;
alter table public.link_attempts drop constraint link_attempts_surface_check, alter column surface type public.chat_surface;
alter table public.forget_requests drop constraint forget_requests_surface_check,
    alter column surface type public.chat_surface;
