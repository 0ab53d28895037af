-- A turn: two round trips. begin_turn (before the model call) resolves the person and the
-- conversation, stores the user message once and returns the context window; finish_turn
-- (after it) stores the reply. end_attempt closes an attempt that stored no reply.

-- One turn's first round trip: resolve the person and the conversation, store the user
-- message once (the delivery's key, looked up once, first), take over an owed message, count
-- the budget, and return the context window and the memory notes. A redelivery (same
-- external_id) stores nothing and returns the reply already stored for it, if any.
create or replace function public.begin_turn(
    p_surface text,
    p_content text,
    p_external_id text,
    p_user_id uuid,
    p_sender_id text,
    p_conversation_id uuid,
    p_window_hours integer,
    p_max_messages integer,
    p_window_step integer,
    p_web_prepend integer,
    p_attempt uuid,
    p_turns_per_minute integer,
    p_turns_per_day integer,
    p_tokens_per_day integer,
    p_answer_within_seconds integer,
    p_sender text
) returns jsonb language plpgsql set search_path = '' as $$
declare
    v_user uuid := p_user_id;
    v_conversation uuid;
    v_conversation_surface text;
    v_message_id bigint;
    v_message_at timestamptz;
    v_answer_by timestamptz;
    v_reply jsonb;
    v_now timestamptz := clock_timestamp();
    v_since timestamptz := clock_timestamp() - make_interval(hours => p_window_hours);
    v_history jsonb;
    v_prepend jsonb := '[]'::jsonb;
    v_own_attempt boolean := false;
    v_owed boolean := false;
    v_limited_until timestamptz;
begin
    -- Forgetting (issue #13): a delivery whose message the person has forgotten is answered like a
    -- duplicate, storing nothing (no conversation, no message), not even an identity.
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
        -- finishes first, and this turn then belongs to the person it was linked to.
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

    -- The delivery's key, looked up once: this very call tried again after its connection
    -- died (its attempt), or a delivery already stored. Deliveries of one key take turns here.
    if p_external_id is not null then
        perform pg_advisory_xact_lock(hashtextextended('delivery/' || v_user || '/' || p_surface || '/' || p_external_id, 0));
    end if;
    select m.id, m.created_at, m.conversation_id, m.answer_by, coalesce(m.attempt = p_attempt, false)
      into v_message_id, v_message_at, v_conversation, v_answer_by, v_own_attempt
      from public.messages m
     where m.user_id = v_user
       and ((p_attempt is not null and m.attempt = p_attempt)
            or (p_external_id is not null and m.surface = p_surface and m.external_id = p_external_id))
     order by m.attempt = p_attempt desc nulls last
     limit 1;

    if v_message_id is not null and not v_own_attempt then
        select jsonb_build_object('id', r.id, 'content', r.content, 'delivered', r.delivered_at is not null)
          into v_reply
          from public.messages r
         where r.in_reply_to = v_message_id and r.user_id = v_user;
        -- Owed: no reply, and its attempt can no longer answer. This delivery answers it (below,
        -- within the budget: each attempt's tokens count, so retrying an abandoned stream for
        -- ever runs into TOKENS_PER_DAY).
        v_owed := v_reply is null and (v_answer_by is null or v_answer_by <= v_now);
        if not v_owed then
            return jsonb_build_object(
                'user_id', v_user, 'conversation_id', v_conversation,
                'conversation_surface', (select c.surface from public.conversations c where c.id = v_conversation),
                'message_id', v_message_id, 'duplicate', true, 'reply', v_reply,
                -- Not answered yet, and its attempt may still answer: ask again after this.
                'answer_by', case when v_reply is null then v_answer_by end,
                'history', '[]'::jsonb, 'prepend', '[]'::jsonb);
        end if;
    end if;

    if (v_message_id is null or v_owed) and (p_turns_per_minute > 0 or p_turns_per_day > 0 or p_tokens_per_day > 0) then
        -- The person's budget (budget.sql): their instances count one at a time, so two
        -- racing for the last allowed turn cannot both pass. Over it, nothing is stored and no
        -- model is asked. An answered delivery never gets here.
        perform pg_advisory_xact_lock(hashtextextended('budget/' || v_user, 0));
        v_limited_until := public.turn_budget_until(v_user, p_turns_per_minute, p_turns_per_day, p_tokens_per_day);
        if v_limited_until is not null then
            return jsonb_build_object('user_id', v_user, 'limited_until', v_limited_until);
        end if;
    end if;

    if v_owed then
        update public.messages m
           set answer_by = v_now + make_interval(secs => p_answer_within_seconds), attempt = p_attempt
         where m.id = v_message_id;
    end if;

    if v_message_id is null then
        if p_surface = 'web' then
            v_conversation := p_conversation_id;
            if v_conversation is null then
                insert into public.conversations (user_id, surface, title)
                     values (v_user, 'web', left(regexp_replace(p_content, '\s+', ' ', 'g'), 60))
                  returning id into v_conversation;
            else
                select c.id into v_conversation
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
            select c.id into v_conversation
              from public.conversations c
             where c.user_id = v_user and c.surface = p_surface;
            if v_conversation is null then
                -- The unique partial index settles a race between two first messages.
                insert into public.conversations (user_id, surface, title)
                     values (v_user, p_surface, case p_surface when 'telegram' then '[Telegram]' else '[WhatsApp]' end)
                on conflict (user_id, surface) where surface <> 'web' do nothing;
                select c.id into v_conversation
                  from public.conversations c
                 where c.user_id = v_user and c.surface = p_surface;
            end if;
        end if;

        -- The key was looked up under its lock: this insert meets no other delivery of it.
        insert into public.messages (conversation_id, user_id, surface, role, content, external_id, attempt,
                                     answer_by, sender)
             values (v_conversation, v_user, p_surface, 'user', p_content, p_external_id, p_attempt,
                     v_now + make_interval(secs => p_answer_within_seconds), p_sender)
          returning id, created_at into v_message_id, v_message_at;

        if p_turns_per_minute > 0 or p_turns_per_day > 0 or p_tokens_per_day > 0 then
            insert into public.turn_usage (message_id, user_id, at) values (v_message_id, v_user, v_message_at);
        end if;
    end if;

    select c.surface into v_conversation_surface from public.conversations c where c.id = v_conversation;
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
                       and (m.created_at, m.id) <= (v_message_at, v_message_id)
                     order by m.created_at desc, m.id desc
                     limit p_web_prepend) s;
        end if;
    else
        v_history := public.context_window(v_user, null, v_message_at - make_interval(hours => p_window_hours),
                                           v_message_at, v_message_id, p_max_messages, p_window_step);
    end if;

    return jsonb_build_object(
        'user_id', v_user, 'conversation_id', v_conversation,
        'conversation_surface', v_conversation_surface, 'message_id', v_message_id,
        'duplicate', false, 'owed', v_owed, 'attempt', p_attempt, 'reply', null, 'history', v_history, 'prepend', v_prepend,
        'notes', (select n.content from public.memory_notes n where n.user_id = v_user and n.revision > 0));
end;
$$;

-- One turn's second round trip: store the reply to a user message (once), touch the
-- conversation and add the turn's model tokens to what its earlier attempts spent. A message
-- whose person has since been merged into another takes the reply; a retried finish_turn whose
-- first try committed gets the reply's id back; another reply to the same message is refused
-- (null).
create or replace function public.finish_turn(
    p_user_id uuid,
    p_user_message_id bigint,
    p_content text,
    p_delivered boolean default true,
    p_tokens integer default 0
) returns jsonb language plpgsql set search_path = '' as $$
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
        update public.turn_usage u set tokens = u.tokens + greatest(p_tokens, 0)
         where u.message_id = p_user_message_id;
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

-- A turn that ended without a stored reply (a fallback, an abandoned stream, an error after part
-- of an answer): what the model spent counts, and the message is owed from now on (unless a reply
-- was stored meanwhile, or another attempt took it over). Returns {"owed": boolean}.
create or replace function public.end_attempt(p_user_id uuid, p_user_message_id bigint, p_attempt uuid, p_tokens integer)
    returns jsonb language plpgsql set search_path = '' as $$
declare
    v_owed boolean;
begin
    update public.turn_usage u set tokens = u.tokens + greatest(p_tokens, 0)
     where u.message_id = p_user_message_id and u.user_id = p_user_id;
    update public.messages m set answer_by = clock_timestamp()
     where m.id = p_user_message_id and m.user_id = p_user_id and m.role = 'user'
       -- only while no later attempt has taken the message over: never two attempts at once
       and m.attempt is not distinct from p_attempt
       and not exists (select from public.messages r where r.in_reply_to = m.id);
    v_owed := found;
    return jsonb_build_object('owed', v_owed);
end;
$$;

-- A reply stored but not delivered (the surface was down) that a redelivery has now sent; the
-- message may since belong to the person its sender was merged into.
create or replace function public.mark_delivered(p_user_id uuid, p_reply_id bigint)
    returns jsonb language sql set search_path = '' as $$
    update public.messages m
       set delivered_at = clock_timestamp()
     where m.id = p_reply_id and m.delivered_at is null
       and (m.user_id = p_user_id
            or exists (select from public.merged_people x
                        where x.from_user_id = p_user_id and x.into_user_id = m.user_id))
    returning jsonb_build_object('reply_id', m.id);
$$;
