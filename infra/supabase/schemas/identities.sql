-- Identities: a Telegram chat or a WhatsApp number -> the person it belongs to.
--
-- linked_at tells a linked identity (its person is a web account: links.sql) from one that
-- IDENTITY_POLICY=auto made for an unknown sender (its person exists only through it).

create table public.identities (
    surface public.chat_surface not null,
    external_id text not null,
    user_id uuid not null,
    created_at timestamptz not null default clock_timestamp(),
    linked_at timestamptz,
    primary key (surface, external_id)
);
alter table public.identities enable row level security;  -- who reads what: access.sql
create index identities_by_user on public.identities (user_id);


-- A person's Telegram chats and WhatsApp numbers, oldest link first.
create or replace function public.list_identities(p_user_id uuid)
    returns jsonb language sql stable set search_path = '' as $$
    select coalesce(jsonb_agg(jsonb_build_object('surface', i.surface, 'external_id', i.external_id,
                                                 'linked_at', coalesce(i.linked_at, i.created_at))
                              order by coalesce(i.linked_at, i.created_at), i.surface, i.external_id),
                    '[]'::jsonb)
      from public.identities i
     where i.user_id = p_user_id;
$$;

-- A person's language as remembered (person_languages, follow_ups.sql), for a fixed answer given
-- without a turn (a command's, a notice's: docs/decisions.md, "The person's language"): p_user_id's
-- (the owner policy's person), else the person of the identity (surface, external id); null for
-- a sender never seen. A merge moves the identity and the language together (links.sql).
create or replace function public.person_language(p_user_id uuid, p_surface text, p_external_id text)
    returns text language plpgsql stable set search_path = '' as $$
begin
    return (select l.language
              from public.person_languages l
             where l.user_id = coalesce(p_user_id, (select i.user_id from public.identities i
                                                     where i.surface = p_surface and i.external_id = p_external_id)));
end;
$$;
