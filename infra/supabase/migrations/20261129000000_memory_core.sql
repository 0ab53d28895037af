-- Memory core: one thread per person across web, Telegram and WhatsApp.
--
-- Tables: conversations, messages, identities. Row-level security on all three:
-- `authenticated` reads only its own rows, `anon` nothing, writes only through the
-- turn functions below, which only `service_role` may execute.
--
-- Supabase grants every new table and function in `public` to anon and authenticated
-- by default privileges; everything below is therefore revoked explicitly first.

create table public.conversations (
    id uuid primary key default gen_random_uuid(),
    user_id uuid not null,
    surface text not null check (surface in ('web', 'telegram', 'whatsapp')),
    title text not null default '',
    created_at timestamptz not null default clock_timestamp(),
    updated_at timestamptz not null default clock_timestamp()
);

-- Every surface but the web has exactly one conversation per person; the index makes
-- the find-or-create in begin_turn race-free.
create unique index conversations_one_per_secondary_surface
    on public.conversations (user_id, surface) where surface <> 'web';
create index conversations_by_user_recent
    on public.conversations (user_id, updated_at desc);

create table public.messages (
    id bigint generated always as identity primary key,
    conversation_id uuid not null references public.conversations (id) on delete cascade,
    user_id uuid not null,
    surface text not null check (surface in ('web', 'telegram', 'whatsapp')),
    role text not null check (role in ('user', 'assistant')),
    content text not null check (char_length(content) between 1 and 200000),
    -- Telegram update_id, Twilio MessageSid, web client message id.
    external_id text,
    -- An assistant reply points at the user message it answers: one reply per message.
    in_reply_to bigint references public.messages (id) on delete cascade,
    -- When the reply reached the person; null while a surface still owes it.
    delivered_at timestamptz,
    created_at timestamptz not null default clock_timestamp(),
    -- A delivery is stored once. The surface is part of it: the web may write into the
    -- Telegram conversation, and its client ids must not collide with update ids.
    constraint messages_once_per_delivery unique (conversation_id, surface, external_id)
);

-- The hot query: a person's recent messages across all conversations.
create index messages_by_user_recent
    on public.messages (user_id, created_at desc, id desc);
create index messages_by_conversation_recent
    on public.messages (conversation_id, created_at desc, id desc);
create unique index messages_one_reply
    on public.messages (in_reply_to) where in_reply_to is not null;

create table public.identities (
    surface text not null check (surface in ('telegram', 'whatsapp')),
    external_id text not null,
    user_id uuid not null,
    created_at timestamptz not null default clock_timestamp(),
    primary key (surface, external_id)
);
create index identities_by_user on public.identities (user_id);

alter table public.conversations enable row level security;
alter table public.messages enable row level security;
alter table public.identities enable row level security;

revoke all on table public.conversations, public.messages, public.identities from anon, authenticated;
grant select on table public.conversations, public.messages, public.identities to authenticated;
grant select, insert, update, delete on table public.conversations, public.messages, public.identities
    to service_role;

create policy conversations_owner_reads on public.conversations
    for select to authenticated using (user_id = (select auth.uid()));
create policy messages_owner_reads on public.messages
    for select to authenticated using (user_id = (select auth.uid()));
create policy identities_owner_reads on public.identities
    for select to authenticated using (user_id = (select auth.uid()));


-- The last `p_limit` messages of a person (or of one conversation) up to and including
-- the message at (p_until_at, p_until_id), not older than p_since, oldest first. The
-- start moves in steps of p_step messages so that consecutive turns share a prefix.
create function public.context_window(
    p_user_id uuid,
    p_conversation_id uuid,
    p_since timestamptz,
    p_until_at timestamptz,
    p_until_id bigint,
    p_limit integer,
    p_step integer
) returns jsonb
language plpgsql stable
set search_path = ''
as $$
declare
    v_total integer;
    v_step integer;
    v_keep integer;
    v_window jsonb;
begin
    select count(*) into v_total
      from public.messages m
     where m.user_id = p_user_id
       and (p_conversation_id is null or m.conversation_id = p_conversation_id)
       and m.created_at >= p_since
       and (m.created_at, m.id) <= (p_until_at, p_until_id);

    -- A step longer than the window would empty it: the step is at most the window.
    v_step := greatest(least(p_step, p_limit), 1);
    v_keep := case
        when v_total <= p_limit then v_total
        else v_total - ceil((v_total - p_limit)::numeric / v_step)::integer * v_step
    end;
    v_keep := greatest(v_keep, 0);

    select coalesce(jsonb_agg(to_jsonb(w) order by w.created_at, w.id), '[]'::jsonb) into v_window
      from (select m.id, m.conversation_id, m.surface, m.role, m.content, m.created_at
              from public.messages m
             where m.user_id = p_user_id
               and (p_conversation_id is null or m.conversation_id = p_conversation_id)
               and m.created_at >= p_since
               and (m.created_at, m.id) <= (p_until_at, p_until_id)
             order by m.created_at desc, m.id desc
             limit v_keep) w;
    return v_window;
end;
$$;


-- One turn's first round trip: resolve the person and the conversation, store the user
-- message once, and return the context window. A redelivery (same external_id) stores
-- nothing and returns the reply already stored for it, if any.
create function public.begin_turn(
    p_surface text,
    p_content text,
    p_external_id text default null,
    p_user_id uuid default null,
    p_sender_id text default null,
    p_conversation_id uuid default null,
    p_window_hours integer default 24,
    p_max_messages integer default 16,
    p_window_step integer default 8,
    p_web_prepend integer default 8
) returns jsonb
language plpgsql
set search_path = ''
as $$
declare
    v_user uuid := p_user_id;
    v_conversation uuid;
    v_conversation_surface text;
    v_message_id bigint;
    v_message_at timestamptz;
    v_reply jsonb;
    v_since timestamptz := clock_timestamp() - make_interval(hours => p_window_hours);
    v_history jsonb;
    v_prepend jsonb := '[]'::jsonb;
begin
    if v_user is null then
        if p_sender_id is null or p_surface = 'web' then
            raise exception 'begin_turn needs p_user_id, or p_sender_id on a secondary surface'
                using errcode = '22023';
        end if;
        select i.user_id into v_user
          from public.identities i
         where i.surface = p_surface and i.external_id = p_sender_id;
        if v_user is null then
            insert into public.identities (surface, external_id, user_id)
                 values (p_surface, p_sender_id, gen_random_uuid())
            on conflict (surface, external_id) do nothing;
            select i.user_id into v_user
              from public.identities i
             where i.surface = p_surface and i.external_id = p_sender_id;
        end if;
    end if;

    if p_surface = 'web' then
        v_conversation := p_conversation_id;
        if v_conversation is null and p_external_id is not null then
            -- A retried first message of a new conversation lands in the one it created.
            select m.conversation_id into v_conversation
              from public.messages m
             where m.user_id = v_user and m.surface = 'web' and m.external_id = p_external_id
             limit 1;
        end if;
        if v_conversation is null then
            insert into public.conversations (user_id, surface, title)
                 values (v_user, 'web', left(regexp_replace(p_content, '\s+', ' ', 'g'), 60))
              returning id, surface into v_conversation, v_conversation_surface;
        else
            select c.id, c.surface into v_conversation, v_conversation_surface
              from public.conversations c
             where c.id = v_conversation and c.user_id = v_user;
            if v_conversation is null then
                return jsonb_build_object('error', 'conversation_not_found');
            end if;
            -- A conversation started empty takes its first message as its title.
            update public.conversations c
               set title = left(regexp_replace(p_content, '\s+', ' ', 'g'), 60)
             where c.id = v_conversation and c.user_id = v_user and c.surface = 'web' and c.title = '';
        end if;
    else
        select c.id, c.surface into v_conversation, v_conversation_surface
          from public.conversations c
         where c.user_id = v_user and c.surface = p_surface;
        if v_conversation is null then
            -- The unique partial index settles a race between two first messages.
            insert into public.conversations (user_id, surface, title)
                 values (v_user, p_surface, case p_surface when 'telegram' then '[Telegram]' else '[WhatsApp]' end)
            on conflict (user_id, surface) where surface <> 'web' do nothing;
            select c.id, c.surface into v_conversation, v_conversation_surface
              from public.conversations c
             where c.user_id = v_user and c.surface = p_surface;
        end if;
    end if;

    insert into public.messages (conversation_id, user_id, surface, role, content, external_id)
         values (v_conversation, v_user, p_surface, 'user', p_content, p_external_id)
    on conflict (conversation_id, surface, external_id) do nothing
      returning id, created_at into v_message_id, v_message_at;

    if v_message_id is null then
        select m.id into v_message_id
          from public.messages m
         where m.conversation_id = v_conversation and m.surface = p_surface and m.external_id = p_external_id;
        select jsonb_build_object('id', r.id, 'content', r.content, 'delivered', r.delivered_at is not null)
          into v_reply
          from public.messages r
         where r.in_reply_to = v_message_id and r.user_id = v_user;
        return jsonb_build_object(
            'user_id', v_user, 'conversation_id', v_conversation,
            'conversation_surface', v_conversation_surface, 'message_id', v_message_id,
            'duplicate', true, 'reply', v_reply, 'history', '[]'::jsonb, 'prepend', '[]'::jsonb);
    end if;

    if p_surface = 'web' then
        v_history := public.context_window(v_user, v_conversation, '-infinity', v_message_at, v_message_id,
                                           p_max_messages, p_window_step);
        if v_conversation_surface = 'web' and p_web_prepend > 0 then
            select coalesce(jsonb_agg(to_jsonb(s) order by s.created_at, s.id), '[]'::jsonb) into v_prepend
              from (select m.id, m.conversation_id, m.surface, m.role, m.content, m.created_at
                      from public.messages m
                      join public.conversations c on c.id = m.conversation_id
                     where m.user_id = v_user
                       and c.user_id = v_user
                       and c.surface <> 'web'
                       and m.created_at >= v_since
                     order by m.created_at desc, m.id desc
                     limit p_web_prepend) s;
        end if;
    else
        v_history := public.context_window(v_user, null, v_since, v_message_at, v_message_id,
                                           p_max_messages, p_window_step);
    end if;

    return jsonb_build_object(
        'user_id', v_user, 'conversation_id', v_conversation,
        'conversation_surface', v_conversation_surface, 'message_id', v_message_id,
        'duplicate', false, 'reply', null, 'history', v_history, 'prepend', v_prepend);
end;
$$;


-- One turn's second round trip: store the reply to a user message (once) and touch
-- the conversation. Returns the reply's id, or null when the message is unknown.
create function public.finish_turn(
    p_user_id uuid,
    p_user_message_id bigint,
    p_content text,
    p_delivered boolean default true
) returns jsonb
language plpgsql
set search_path = ''
as $$
declare
    v_reply_id bigint;
    v_conversation uuid;
begin
    with asked as (
        select m.id, m.conversation_id, m.user_id, m.surface
          from public.messages m
         where m.id = p_user_message_id and m.user_id = p_user_id and m.role = 'user'
    ), stored as (
        insert into public.messages (conversation_id, user_id, surface, role, content, in_reply_to, delivered_at)
        select a.conversation_id, a.user_id, a.surface, 'assistant', p_content, a.id,
               case when p_delivered then clock_timestamp() end
          from asked a
        on conflict (in_reply_to) where in_reply_to is not null do nothing
        returning id, conversation_id
    )
    select s.id, s.conversation_id into v_reply_id, v_conversation from stored s;

    if v_reply_id is not null then
        update public.conversations c
           set updated_at = clock_timestamp()
         where c.id = v_conversation and c.user_id = p_user_id;
    end if;
    return jsonb_build_object('reply_id', v_reply_id);
end;
$$;


-- A reply stored but not delivered (the surface was down) that a redelivery has now sent.
create function public.mark_delivered(p_user_id uuid, p_reply_id bigint) returns jsonb
language sql
set search_path = ''
as $$
    update public.messages m
       set delivered_at = clock_timestamp()
     where m.id = p_reply_id and m.user_id = p_user_id and m.delivered_at is null
    returning jsonb_build_object('reply_id', m.id);
$$;


create function public.create_conversation(p_user_id uuid, p_title text default '') returns jsonb
language sql
set search_path = ''
as $$
    insert into public.conversations (user_id, surface, title)
         values (p_user_id, 'web', coalesce(p_title, ''))
      returning jsonb_build_object('id', id, 'surface', surface, 'title', title,
                                   'created_at', created_at, 'updated_at', updated_at);
$$;


create function public.list_conversations(p_user_id uuid, p_limit integer default 50) returns jsonb
language sql stable
set search_path = ''
as $$
    select coalesce(jsonb_agg(to_jsonb(c) order by c.updated_at desc, c.id), '[]'::jsonb)
      from (select c.id, c.surface, c.title, c.created_at, c.updated_at
              from public.conversations c
             where c.user_id = p_user_id
             order by c.updated_at desc, c.id
             limit p_limit) c;
$$;


-- One conversation's messages, newest page first when paging back with p_before_id;
-- each page is returned oldest first.
create function public.conversation_messages(
    p_user_id uuid,
    p_conversation_id uuid,
    p_before_id bigint default null,
    p_limit integer default 50
) returns jsonb
language sql stable
set search_path = ''
as $$
    select case when c.id is null then jsonb_build_object('error', 'conversation_not_found')
           else jsonb_build_object(
               'conversation', jsonb_build_object('id', c.id, 'surface', c.surface, 'title', c.title,
                                                  'created_at', c.created_at, 'updated_at', c.updated_at),
               'messages', (
                   select coalesce(jsonb_agg(to_jsonb(p) order by p.created_at, p.id), '[]'::jsonb)
                     from (select m.id, m.conversation_id, m.surface, m.role, m.content, m.created_at
                             from public.messages m
                            where m.conversation_id = c.id and m.user_id = p_user_id
                              and (p_before_id is null or m.id < p_before_id)
                            order by m.created_at desc, m.id desc
                            limit p_limit) p))
           end
      from (select 1) one
      left join public.conversations c on c.id = p_conversation_id and c.user_id = p_user_id;
$$;


-- A person's latest messages over every conversation, oldest first (the CLI's history).
create function public.person_history(p_user_id uuid, p_limit integer default 100) returns jsonb
language sql stable
set search_path = ''
as $$
    select coalesce(jsonb_agg(to_jsonb(h) order by h.created_at, h.id), '[]'::jsonb)
      from (select m.id, m.conversation_id, m.surface, m.role, m.content, m.created_at
              from public.messages m
             where m.user_id = p_user_id
             order by m.created_at desc, m.id desc
             limit p_limit) h;
$$;


revoke all on function
    public.context_window(uuid, uuid, timestamptz, timestamptz, bigint, integer, integer),
    public.begin_turn(text, text, text, uuid, text, uuid, integer, integer, integer, integer),
    public.finish_turn(uuid, bigint, text, boolean),
    public.mark_delivered(uuid, bigint),
    public.create_conversation(uuid, text),
    public.list_conversations(uuid, integer),
    public.conversation_messages(uuid, uuid, bigint, integer),
    public.person_history(uuid, integer)
from public, anon, authenticated;

grant execute on function
    public.context_window(uuid, uuid, timestamptz, timestamptz, bigint, integer, integer),
    public.begin_turn(text, text, text, uuid, text, uuid, integer, integer, integer, integer),
    public.finish_turn(uuid, bigint, text, boolean),
    public.mark_delivered(uuid, bigint),
    public.create_conversation(uuid, text),
    public.list_conversations(uuid, integer),
    public.conversation_messages(uuid, uuid, bigint, integer),
    public.person_history(uuid, integer)
to service_role;
