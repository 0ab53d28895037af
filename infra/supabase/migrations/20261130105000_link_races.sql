-- Linking, made safe against what happens at the same time (a review of 20261130100000):
--
-- 1. A turn that reads an identity while it is being linked: begin_turn now takes the
--    identity `for key share`, so the link (which holds it `for update`) finishes first and
--    the turn belongs to the person it was linked to, or the link waits for the turn and
--    moves its message too. Before, the message could land under the old person inside
--    the new person's conversation, or fail its foreign key.
-- 2. A reply written after its question was merged into another person (the model was
--    thinking while the person sent /start CODE): finish_turn and mark_delivered accept a
--    message that now belongs to the person its sender was merged into (merged_people).
-- 3. A chat linked to one web account is never moved to another by a code: it must be
--    unlinked first (a deep link someone else made cannot take a chat away).
-- 4. A code redeemed again by the identity that used it is "already linked" only while
--    that identity is still linked to the code's person.
-- 5. A first message and a /start CODE of a new chat arriving together no longer collide
--    on the identity's primary key.

create table public.merged_people (
    from_user_id uuid primary key,
    into_user_id uuid not null,
    merged_at timestamptz not null default clock_timestamp()
);
create index merged_people_into on public.merged_people (into_user_id);
alter table public.merged_people enable row level security;
revoke all on table public.merged_people from anon, authenticated;
grant select on table public.merged_people to authenticated;
grant select, insert, update, delete on table public.merged_people to service_role;
create policy merged_people_owner_reads on public.merged_people
    for select to authenticated using (into_user_id = (select auth.uid()));


-- As in 20261130100000, with 3 (linked_elsewhere), 5 (insert on conflict) and the merge
-- recorded in merged_people.
create or replace function public.link_identity(p_user_id uuid, p_surface text, p_external_id text)
returns jsonb
language plpgsql
set search_path = ''
as $$
declare
    v_previous uuid;
    v_linked_at timestamptz;
    v_from record;
    v_into uuid;
    v_moved integer := 0;
    v_count integer;
begin
    if p_surface not in ('telegram', 'whatsapp') or coalesce(p_external_id, '') = '' then
        raise exception 'only a telegram or whatsapp identity with an id is linked' using errcode = '22023';
    end if;
    insert into public.identities (surface, external_id, user_id, linked_at)
         values (p_surface, p_external_id, p_user_id, clock_timestamp())
    on conflict (surface, external_id) do nothing;
    if found then
        return jsonb_build_object('status', 'linked', 'user_id', p_user_id, 'moved_messages', 0);
    end if;
    select i.user_id, i.linked_at into v_previous, v_linked_at
      from public.identities i
     where i.surface = p_surface and i.external_id = p_external_id
       for update;

    if v_previous = p_user_id then
        update public.identities i set linked_at = coalesce(i.linked_at, clock_timestamp())
         where i.surface = p_surface and i.external_id = p_external_id;
        return jsonb_build_object('status', 'already_linked', 'user_id', p_user_id, 'moved_messages', 0);
    end if;
    if v_linked_at is not null then
        return jsonb_build_object('status', 'linked_elsewhere');
    end if;

    -- The previous person was this identity alone: their whole history is the person's now.
    for v_from in
        select c.id, c.surface from public.conversations c where c.user_id = v_previous for update
    loop
        v_into := null;
        if v_from.surface <> 'web' then
            select c.id into v_into
              from public.conversations c
             where c.user_id = p_user_id and c.surface = v_from.surface
               for update;
        end if;
        if v_into is null then
            update public.conversations c set user_id = p_user_id where c.id = v_from.id;
            update public.messages m set user_id = p_user_id where m.conversation_id = v_from.id;
            get diagnostics v_count = row_count;
        else
            -- A delivery both conversations hold (it cannot happen with Telegram's and
            -- Twilio's ids, but a constraint is a constraint) is kept once: the person's.
            delete from public.messages m
             where m.conversation_id = v_from.id
               and m.external_id is not null
               and exists (select from public.messages x
                            where x.conversation_id = v_into
                              and x.surface = m.surface and x.external_id = m.external_id);
            update public.messages m set conversation_id = v_into, user_id = p_user_id
             where m.conversation_id = v_from.id;
            get diagnostics v_count = row_count;
            update public.conversations c
               set updated_at = greatest(c.updated_at, (select f.updated_at from public.conversations f
                                                         where f.id = v_from.id))
             where c.id = v_into;
            delete from public.conversations c where c.id = v_from.id;
        end if;
        v_moved := v_moved + v_count;
    end loop;
    update public.identities i set user_id = p_user_id, linked_at = clock_timestamp()
     where i.user_id = v_previous;
    insert into public.merged_people (from_user_id, into_user_id) values (v_previous, p_user_id)
    on conflict (from_user_id) do update set into_user_id = excluded.into_user_id, merged_at = clock_timestamp();
    -- Whoever had been merged into the previous person now lives on in this one.
    update public.merged_people x set into_user_id = p_user_id where x.into_user_id = v_previous;
    return jsonb_build_object('status', 'linked', 'user_id', p_user_id, 'moved_messages', v_moved);
end;
$$;


-- As in 20261130100000, with 3 (a code is not spent on a chat linked elsewhere) and 4.
create or replace function public.redeem_link_code(
    p_surface text,
    p_external_id text,
    p_code_hash text,
    p_max_attempts integer default 5
) returns jsonb
language plpgsql
set search_path = ''
as $$
declare
    v_since timestamptz := clock_timestamp() - interval '1 hour';
    v_failures integer;
    v_first_failure timestamptz;
    v_code record;
    v_status text;
begin
    -- One identity's attempts are counted one at a time, so two at once cannot both pass.
    perform pg_advisory_xact_lock(hashtextextended('link:' || p_surface || ':' || p_external_id, 0));
    select count(*), min(a.attempted_at) into v_failures, v_first_failure
      from public.link_attempts a
     where a.surface = p_surface and a.external_id = p_external_id and a.attempted_at > v_since;
    if p_max_attempts > 0 and v_failures >= p_max_attempts then
        return jsonb_build_object('status', 'too_many_attempts',
                                  'retry_at', v_first_failure + interval '1 hour');
    end if;

    -- The row lock makes the code single-use: of two identities racing, the second waits,
    -- then finds it used.
    select c.user_id, c.used_at, c.used_by_surface, c.used_by_external_id, c.expires_at into v_code
      from public.link_codes c where c.code_hash = p_code_hash
       for update;
    v_status := case when v_code.user_id is null then 'invalid'
                     when v_code.used_at is null and v_code.expires_at > clock_timestamp() then 'valid'
                     when v_code.used_at is null then 'expired'
                     when v_code.used_by_surface = p_surface and v_code.used_by_external_id = p_external_id
                          and exists (select from public.identities i
                                       where i.surface = p_surface and i.external_id = p_external_id
                                         and i.user_id = v_code.user_id) then 'already_linked'
                     else 'used' end;
    if v_status = 'already_linked' then
        -- The same identity again (a redelivered /start): it is linked, say so again.
        return jsonb_build_object('status', 'already_linked', 'user_id', v_code.user_id, 'moved_messages', 0);
    end if;
    if v_status <> 'valid' then
        insert into public.link_attempts (surface, external_id) values (p_surface, p_external_id);
        delete from public.link_attempts a where a.attempted_at < clock_timestamp() - interval '1 day';
        return jsonb_build_object('status', v_status);
    end if;
    if exists (select from public.identities i
                where i.surface = p_surface and i.external_id = p_external_id
                  and i.linked_at is not null and i.user_id <> v_code.user_id) then
        return jsonb_build_object('status', 'linked_elsewhere');
    end if;
    update public.link_codes c
       set used_at = clock_timestamp(), used_by_surface = p_surface, used_by_external_id = p_external_id
     where c.code_hash = p_code_hash;
    return public.link_identity(v_code.user_id, p_surface, p_external_id);
end;
$$;


-- As in 20261129000000, storing the reply of a message whose person has since been merged.
create or replace function public.finish_turn(
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
    v_owner uuid;
begin
    with asked as (
        select m.id, m.conversation_id, m.user_id, m.surface
          from public.messages m
         where m.id = p_user_message_id and m.role = 'user'
           and (m.user_id = p_user_id
                or exists (select from public.merged_people x
                            where x.from_user_id = p_user_id and x.into_user_id = m.user_id))
    ), stored as (
        insert into public.messages (conversation_id, user_id, surface, role, content, in_reply_to, delivered_at)
        select a.conversation_id, a.user_id, a.surface, 'assistant', p_content, a.id,
               case when p_delivered then clock_timestamp() end
          from asked a
        on conflict (in_reply_to) where in_reply_to is not null do nothing
        returning id, conversation_id, user_id
    )
    select s.id, s.conversation_id, s.user_id into v_reply_id, v_conversation, v_owner from stored s;

    if v_reply_id is not null then
        update public.conversations c
           set updated_at = clock_timestamp()
         where c.id = v_conversation and c.user_id = v_owner;
    end if;
    return jsonb_build_object('reply_id', v_reply_id);
end;
$$;


create or replace function public.mark_delivered(p_user_id uuid, p_reply_id bigint) returns jsonb
language sql
set search_path = ''
as $$
    update public.messages m
       set delivered_at = clock_timestamp()
     where m.id = p_reply_id and m.delivered_at is null
       and (m.user_id = p_user_id
            or exists (select from public.merged_people x
                        where x.from_user_id = p_user_id and x.into_user_id = m.user_id))
    returning jsonb_build_object('reply_id', m.id);
$$;


create or replace function public.begin_turn(
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
        -- `for key share`: a link of this identity (link_identity holds it `for update`)
        -- finishes first, and this turn then belongs to the person it was linked to; a
        -- link that starts after this waits for the turn, and moves its message too.
        select i.user_id into v_user
          from public.identities i
         where i.surface = p_surface and i.external_id = p_sender_id
           for key share;
        if v_user is null then
            insert into public.identities (surface, external_id, user_id)
                 values (p_surface, p_sender_id, gen_random_uuid())
            on conflict (surface, external_id) do nothing;
            select i.user_id into v_user
              from public.identities i
             where i.surface = p_surface and i.external_id = p_sender_id
               for key share;
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

-- `create or replace` keeps each function's grants: service_role only, as before.
