-- begin_turn as in 20261130145000_turn_budget.sql, with one change (marked "memory notes"):
-- the returned object also carries the person's memory notes (20261130150000_memory_notes.sql),
-- so a turn still costs two round trips. Same signature: the grants to service_role stand.

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
    p_web_prepend integer default 8,
    p_attempt uuid default null,
    p_turns_per_minute integer default 0,
    p_turns_per_day integer default 0,
    p_tokens_per_day integer default 0
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
    v_limited_until timestamptz;
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

    if v_message_id is null and (p_turns_per_minute > 0 or p_turns_per_day > 0 or p_tokens_per_day > 0) then
        -- The person's budget (20261130145000): their instances count one at a time, so two
        -- racing for the last allowed turn cannot both pass. Over it, nothing is stored and no
        -- model is asked, unless this is a delivery already stored (a redelivery stays one).
        perform pg_advisory_xact_lock(hashtextextended('budget/' || v_user, 0));
        v_limited_until := public.turn_budget_until(v_user, p_turns_per_minute, p_turns_per_day, p_tokens_per_day);
        if v_limited_until is not null and not (p_external_id is not null and exists (
                select from public.messages m
                 where m.user_id = v_user and m.surface = p_surface and m.external_id = p_external_id)) then
            return jsonb_build_object('user_id', v_user, 'limited_until', v_limited_until);
        end if;
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

        if v_message_id is not null
           and (p_turns_per_minute > 0 or p_turns_per_day > 0 or p_tokens_per_day > 0) then
            insert into public.turn_usage (message_id, user_id, at) values (v_message_id, v_user, v_message_at);
        end if;

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
        'duplicate', false, 'reply', null, 'history', v_history, 'prepend', v_prepend,
        -- memory notes: the person's notes, in the same round trip (null: none written yet)
        'notes', (select n.content from public.memory_notes n where n.user_id = v_user and n.revision > 0));
end;
$$;
