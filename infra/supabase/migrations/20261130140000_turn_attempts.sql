-- Turn attempts: a begin_turn retried after its connection died recognises its own
-- earlier attempt, and finish_turn retried the same way returns the reply it stored.
--
-- PostgresStore retries a call once when its pooled connection turns out dead (a database
-- restart, a pooler's idle timeout). The first try may have committed before its answer
-- was lost, so the retry must not turn a first delivery into a "duplicate": each
-- begin_turn carries a random attempt token, stored on the user message, and a call that
-- finds its own token returns the normal start. The web's first message of a new
-- conversation is also serialised per (person, client message id), so a retry that
-- overlaps the first try lands in the same conversation.

alter table public.messages add column attempt uuid;
create unique index messages_once_per_attempt on public.messages (attempt) where attempt is not null;

drop function public.begin_turn(text, text, text, uuid, text, uuid, integer, integer, integer, integer);

-- As in 20261130135000 (identities read `for key share`, forgotten deliveries), with p_attempt: the same attempt
-- is not a redelivery. One turn's first round trip: resolve the person and the
-- conversation, store the user message once, and return the context window. A redelivery
-- (same external_id) stores nothing and returns the reply already stored for it, if any.
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
    p_web_prepend integer default 8,
    p_attempt uuid default null
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
    v_own_attempt boolean;
begin
    -- Forgetting (issue #13): a delivery whose message the person has forgotten is answered like a
    -- duplicate, storing nothing (no conversation, no message), not even an identity. Telegram's
    -- update ids and Twilio's SIDs name a delivery for the whole bot; the web's ids only per person.
    if p_external_id is not null and exists (
        select from public.forgotten_deliveries f
         where f.surface = p_surface and f.external_id = p_external_id
           and (p_surface <> 'web' or f.user_id = p_user_id)) then
        return jsonb_build_object('forgotten', true, 'duplicate', true, 'reply', null,
                                  'history', '[]'::jsonb, 'prepend', '[]'::jsonb);
    end if;

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

    if p_attempt is not null then
        -- This very call, tried again after its connection died: its first try may have
        -- committed before the answer was lost. The same start again, not a duplicate.
        select m.id, m.created_at, m.conversation_id, c.surface
          into v_message_id, v_message_at, v_conversation, v_conversation_surface
          from public.messages m
          join public.conversations c on c.id = m.conversation_id
         where m.attempt = p_attempt and m.user_id = v_user;
    end if;

    if v_message_id is null then
        if p_surface = 'web' then
            v_conversation := p_conversation_id;
            if v_conversation is null and p_external_id is not null then
                -- A retried first message of a new conversation lands in the one it created,
                -- also when the retry overlaps the first try: they take turns here.
                perform pg_advisory_xact_lock(hashtextextended('begin_turn/web/' || v_user || '/' || p_external_id, 0));
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

        -- No conflict target: a repeated delivery meets messages_once_per_delivery, an
        -- attempt still running on a connection we gave up on meets messages_once_per_attempt.
        insert into public.messages (conversation_id, user_id, surface, role, content, external_id, attempt)
             values (v_conversation, v_user, p_surface, 'user', p_content, p_external_id, p_attempt)
        on conflict do nothing
          returning id, created_at into v_message_id, v_message_at;

        if v_message_id is null then
            select m.id, m.created_at, m.conversation_id, coalesce(m.attempt = p_attempt, false)
              into v_message_id, v_message_at, v_conversation, v_own_attempt
              from public.messages m
             where m.user_id = v_user
               and ((m.conversation_id = v_conversation and m.surface = p_surface and m.external_id = p_external_id)
                    or (p_attempt is not null and m.attempt = p_attempt))
             order by m.attempt = p_attempt desc nulls last
             limit 1;
            if not v_own_attempt then
                select jsonb_build_object('id', r.id, 'content', r.content, 'delivered', r.delivered_at is not null)
                  into v_reply
                  from public.messages r
                 where r.in_reply_to = v_message_id and r.user_id = v_user;
                return jsonb_build_object(
                    'user_id', v_user, 'conversation_id', v_conversation,
                    'conversation_surface', v_conversation_surface, 'message_id', v_message_id,
                    'duplicate', true, 'reply', v_reply, 'history', '[]'::jsonb, 'prepend', '[]'::jsonb);
            end if;
            select c.surface into v_conversation_surface from public.conversations c where c.id = v_conversation;
        end if;
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



-- As in 20261130105000 (a reply to a message whose person has since been merged), and a
-- retried finish_turn whose first try committed gets the reply's id back, not null;
-- another reply to the same message is still refused (null).
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
    else
        select r.id into v_reply_id
          from public.messages r
         where r.in_reply_to = p_user_message_id and r.content = p_content
           and (r.user_id = p_user_id
                or exists (select from public.merged_people x
                            where x.from_user_id = p_user_id and x.into_user_id = r.user_id));
    end if;
    return jsonb_build_object('reply_id', v_reply_id);
end;
$$;

revoke all on function
    public.begin_turn(text, text, text, uuid, text, uuid, integer, integer, integer, integer, uuid)
from public, anon, authenticated;
grant execute on function
    public.begin_turn(text, text, text, uuid, text, uuid, integer, integer, integer, integer, uuid)
to service_role;
