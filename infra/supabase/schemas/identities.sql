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
